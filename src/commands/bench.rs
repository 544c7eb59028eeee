//! `lethe bench`, `sweep` and `dist-check`: time steps, sweep memory sizes, check a
//! distributed launch.

use anyhow::{Context, Result};

use crate::cli::{BenchArgs, CheckBackend, DistCheckArgs, SweepArgs};
use lethe::config::Mechanism;

use super::train::informational;

pub(crate) fn bench(a: BenchArgs) -> Result<()> {
    if informational(&a.config)? {
        return Ok(());
    }
    if a.out.exists() && !a.out.is_dir() {
        anyhow::bail!("--out `{}`: is a file, not a folder", a.out.display());
    }
    if let Some(folder) = a.config.init_from.as_deref().filter(|f| lethe::model::llama::is_llama_folder(f)) {
        return super::decoder::bench(&a, folder);
    }
    if !a.kv.is_empty() || a.contexts.is_some() {
        anyhow::bail!("--kv and --contexts time a pretrained decoder: give --init-from with a Llama-family folder");
    }
    refuse_data_flags_without_data(&a)?;
    let cfg = a.config.resolve()?;
    let scale = a.scale.as_deref().map(lethe::bench::parse_scale).transpose()?;
    let mut cases = lethe::bench::plan(&cfg, &a.mechanisms, &a.precisions, scale.as_ref(), a.context)?;
    let trace = a.trace.then(|| a.out.join(&cfg.name));
    let opts = lethe::bench::BenchOptions {
        steps: a.bench_steps,
        rounds: a.rounds,
        warmup: a.warmup,
        context: a.context,
        profile: a.profile || a.trace,
        trace: trace.clone(),
        train_data: a.train_data,
        frozen: a.frozen,
    };
    opts.validate()?;
    let (device, group) = lethe::dist::join_for_training(&cfg, lethe::device::parse(&cfg.train.device)?)?;
    if group.is_some() {
        // Each rank benches on its own device (a GPU rank's is `cuda:LOCAL_RANK`).
        cases.iter_mut().for_each(|case| case.cfg.train.device = lethe::device::name(device));
    }
    let leader = group.as_ref().is_none_or(|g| g.rank() == 0); // rank 0 speaks for a torchrun launch
    let (gemm, threads) = lethe::bench::machine_rate(&cfg)?;
    if leader {
        let tf32 = if cfg.train.device != "cpu" && lethe::device::tf32() { " in TF32" } else { "" };
        println!(
            "matrix multiply on {}: {gemm:.1} GFLOP/s with {threads} threads{tf32} (the peak for MFU)",
            cfg.train.device
        );
        let expire = cases.iter().find(|c| c.cfg.memory.mechanism == Mechanism::Expire);
        if let (Some(case), false) = (expire, cfg.train.device == "cpu") {
            println!("{}", lethe::model::memory::expire_bias::gpu_path(case.cfg.memory.expire.fused)?);
        }
    }
    let benched = lethe::bench::run(&cases, &opts, gemm, group.as_ref(), &mut |r| {
        if !leader {
            return;
        }
        let comm = if r.ranks > 1 {
            format!(" | {} ranks, {:.0}% of the step in all-reduce", r.ranks, 100.0 * r.comm_s / r.median_s)
        } else {
            String::new()
        };
        let relative = r
            .relative
            .map(|x| format!(" | {x:.3}x the first config over {} rounds", r.round_medians_s.len()))
            .unwrap_or_default();
        let reads = r.reads();
        println!(
            "{:<14} {:<11} {:<4} {:>9} params | {} tok/step | step median {:.1} ms (p10 {:.1}, p90 {:.1}) | {:.0} tok/s | peak RSS {}{} | mem {:?} | {:.2} GFLOP/step, MFU {} | context {} tokens{reads}{comm}{relative}",
            r.name,
            r.mechanism,
            r.precision,
            r.parameters,
            r.tokens_per_step,
            1e3 * r.median_s,
            1e3 * r.p10_s,
            1e3 * r.p90_s,
            r.tokens_per_s,
            r.peak_rss_mib.map(|m| format!("{m:.0} MiB")).unwrap_or_else(|| "n/a".into()),
            r.peak_gpu_mib.map(|m| format!(", GPU {m:.0} MiB")).unwrap_or_default(),
            r.mem_size.iter().map(|m| m.round()).collect::<Vec<_>>(),
            r.flops_per_step / 1e9,
            r.mfu.map(|m| format!("{:.1}%", 100.0 * m)).unwrap_or_else(|| "n/a".into()),
            r.context_tokens
        );
        if let Some(phases) = &r.profile {
            print!("{}", lethe::profile::table(phases, r.profile_steps));
        }
    })?;
    let kept = if benched.results.is_empty() {
        "Nothing was timed, and nothing written.".into()
    } else if leader {
        bench_report(&a.out.join(&cfg.name), &benched.results, gemm, trace.as_deref())?
    } else {
        "Rank 0 writes the results.".into()
    };
    match benched.stopped_by {
        Some(signal) if opts.rounds > 1 => Err(lethe::LetheError::BenchRoundsInterrupted {
            signal,
            done: benched.rounds_done,
            total: opts.rounds,
            kept,
        }
        .into()),
        Some(signal) => {
            Err(lethe::LetheError::BenchInterrupted { signal, done: benched.results.len(), total: cases.len(), kept }
                .into())
        }
        None => Ok(()),
    }
}

/// Refuses the flags that choose training data when the steps read random tokens (no
/// `--train-data`): they would be read by nothing.
fn refuse_data_flags_without_data(a: &BenchArgs) -> Result<()> {
    let c = &a.config;
    let given = [
        ("--data", c.data.is_some()),
        ("--data-seed", c.data_seed.is_some()),
        ("--length", c.length.is_some()),
        ("--distance", c.distance.is_some()),
    ];
    match given.iter().find(|(_, set)| *set) {
        Some((flag, _)) if !a.train_data => anyhow::bail!(
            "{flag} chooses training data, which bench reads only with --train-data (it times random tokens otherwise): add --train-data, or leave {flag} out"
        ),
        _ => Ok(()),
    }
}

/// Prints the table of `results` (when there are several) and writes `bench.json` and
/// `bench.csv` into `dir`; returns a sentence naming them.
pub(crate) fn bench_report(
    dir: &std::path::Path,
    results: &[lethe::bench::BenchResult],
    gemm: f64,
    trace: Option<&std::path::Path>,
) -> Result<String> {
    if results.len() > 1 {
        print!("{}", lethe::bench::table(results));
    }
    let paths = lethe::bench::write_report(dir, results, gemm)?;
    let names = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" and ");
    println!("wrote {names}");
    if let Some(dir) = trace {
        println!("libtorch's traces of the profiled steps: {}", dir.join("trace-<config>.json").display());
    }
    Ok(format!("Their results are in {names}."))
}

pub(crate) fn sweep(a: SweepArgs) -> Result<()> {
    if informational(&a.config)? {
        return Ok(());
    }
    let base = a.config.resolve()?;
    let given = a.sizes.as_deref().map(|text| lethe::sweep::parse_sizes(text, "--sizes")).transpose()?;
    let items: Vec<String> = if a.mechanisms.is_empty() {
        Mechanism::all().iter().map(|m| m.name().to_string()).collect()
    } else {
        a.mechanisms.clone()
    };
    // Given sizes are tried as given (one a mechanism cannot take is an error naming
    // it); of the default ones, each mechanism takes those it can be built with.
    let sizes_of = |mechanism: Mechanism| match &given {
        Some(sizes) => sizes.clone(),
        None => {
            let (kept, skipped) = lethe::sweep::default_sizes_of(&base, mechanism);
            for why in skipped {
                lethe::say!("note: a default size is left out: {why}");
            }
            kept
        }
    };
    let arms = lethe::sweep::parse_arms(&items, &sizes_of)?;
    let seeds = match &a.seeds {
        Some(text) => lethe::sweep::parse_seeds(text)?,
        None => vec![base.seed],
    };
    let dir = a.out.join(format!("{}-sweep", base.name));
    let runs: usize = arms.iter().map(|arm| arm.sizes.len()).sum::<usize>() * seeds.len();
    println!(
        "sweep `{}`: {runs} runs of {} steps on {}; folder {}",
        base.name,
        base.train.steps,
        lethe::task::describe(&base),
        dir.display()
    );
    let points = lethe::sweep::run(&base, &arms, &seeds, &dir, a.overwrite, &mut |line| println!("{line}"))?;
    print!("{}", lethe::sweep::table(&points));
    if seeds.len() > 1 {
        let metric = lethe::task::metric(&base).name();
        print!(
            "over {} seeds:\n{}",
            seeds.len(),
            lethe::sweep::summary_table(&lethe::sweep::summarise(&points), metric)
        );
    }
    println!("wrote sweep.json, sweep.csv, summary.csv, sweep.svg, sweep.png and sweep.html in {}", dir.display());
    Ok(())
}

pub(crate) fn dist_check(a: DistCheckArgs) -> Result<()> {
    const MOST_ELEMENTS: usize = 1 << 28; // 1 GiB of floats
    if a.elements == 0 || a.elements > MOST_ELEMENTS {
        anyhow::bail!("--elements must be in 1..={MOST_ELEMENTS} (1 GiB of floats), not {}", a.elements);
    }
    if a.rounds == 0 {
        anyhow::bail!("--rounds must be at least 1");
    }
    if a.timeout == 0 || a.timeout > lethe::config::train::MAX_DIST_TIMEOUT_S {
        anyhow::bail!(
            "--timeout must be in 1..={} seconds, not {}",
            lethe::config::train::MAX_DIST_TIMEOUT_S,
            a.timeout
        );
    }
    let launch = lethe::dist::Launch::from_env()?.context("no distributed launch: WORLD_SIZE is not set (start it with torchrun --nproc-per-node N --no-python lethe dist-check)")?;
    let who = format!("rank {}/{}", launch.rank, launch.world_size);
    let start = std::time::Instant::now();
    let backend = match a.backend {
        CheckBackend::Gloo => lethe::dist::Backend::Gloo,
        CheckBackend::Nccl => lethe::dist::Backend::Nccl { device: launch.local_rank },
    };
    let group = lethe::dist::ProcessGroup::join(&launch, std::time::Duration::from_secs(a.timeout), backend)?;
    let store = if launch.agent_store { "torchrun's store" } else { "rank 0's store" };
    println!(
        "{who}: joined in {:.2} s through {store} at {}:{} ({} on {})",
        start.elapsed().as_secs_f64(),
        launch.master_addr,
        launch.master_port,
        backend.name(),
        lethe::device::name(group.device())
    );
    let r = lethe::dist::self_check(&group, a.elements, a.rounds)?;
    let gb_per_s = (r.elements * 4) as f64 / r.all_reduce_s.max(1e-9) / 1e9;
    println!(
        "{who}: all-reduce of {} floats right, median {:.2} ms ({gb_per_s:.2} GB/s); broadcast right; barrier {:.2} ms",
        r.elements,
        1e3 * r.all_reduce_s,
        1e3 * r.barrier_s
    );
    Ok(())
}
