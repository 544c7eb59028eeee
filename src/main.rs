//! The `lethe` binary: parse the command line, run, turn errors into one line and a
//! non-zero exit code. All logic lives in the library.

mod cli;

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use cli::{
    BenchArgs, ChatArgs, Cli, Command, DialogueDataArgs, DialogueEvalArgs, DistCheckArgs, EvalArgs, GenerateArgs,
    InspectCommand, InspectSpansArgs, PlayArgs, PlotArgs, ReplyArgs, ScoreArgs, SweepArgs, TokenizerCommand, TrainArgs,
};
use lethe::checkpoint::Checkpoint;
use lethe::config::{Mechanism, Source, PRESETS};
use lethe::data::Split;
use lethe::generate::Sampling;
use lethe::model::Lm;

fn main() -> ExitCode {
    let cli = Cli::parse();
    quiet_libtorch_panics();
    lethe::device::quiet_libtorch_log();
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli))) {
        Ok(outcome) => outcome,
        Err(payload) => match lethe::error::libtorch_failure(&panic_text(payload.as_ref())) {
            Some(said) => {
                eprintln!("error: {said}");
                return ExitCode::FAILURE;
            }
            None => std::panic::resume_unwind(payload),
        },
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            match e.downcast_ref::<lethe::LetheError>() {
                // 128 + SIGINT, as a shell reports a command stopped by Ctrl-C.
                Some(
                    lethe::LetheError::Interrupted { .. }
                    | lethe::LetheError::BenchInterrupted { .. }
                    | lethe::LetheError::BenchRoundsInterrupted { .. },
                ) => ExitCode::from(130),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// A libtorch error that a tensor operation on the main thread panicked with is said in
/// one line by `main` ([`lethe::error::libtorch_failure`]), not with the panic's message
/// and libtorch's C++ stack; every other panic keeps the default report.
fn quiet_libtorch_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let main_thread = std::thread::current().name() == Some("main");
        if !(main_thread && lethe::error::libtorch_failure(&panic_text(info.payload())).is_some()) {
            default(info);
        }
    }));
}

/// A panic's message, where it is text.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn run(cli: Cli) -> Result<()> {
    // The launch this process is a rank of, when there are several ranks.
    let launch = lethe::dist::Launch::from_env()?.filter(|l| l.world_size > 1);
    if !matches!(cli.command, Command::Train(_) | Command::Bench(_) | Command::DistCheck(_)) {
        one_process(launch.as_ref())?;
    }
    let trains = matches!(&cli.command, Command::Train(a) if !a.config.list_presets && !a.config.print_config);
    // A rank of a launch keeps ignoring SIGPIPE too: Gloo writes to its peers' sockets,
    // and a write to a dead peer must come back as an error naming the rank, not kill
    // this process without a word.
    if !trains && launch.is_none() {
        quiet_on_closed_pipe();
    }
    match cli.command {
        Command::Train(a) => train(a),
        Command::Eval(a) => eval(a),
        Command::Generate(a) => generate(a),
        Command::Tokenizer(c) => tokenizer(c),
        Command::Plot(a) => plot(a),
        Command::Score(a) => score(a),
        Command::DialogueData(a) => dialogue_data(a),
        Command::DialogueEval(a) => dialogue_eval(a),
        Command::Chat(a) => chat(a),
        Command::Bench(a) => bench(a),
        Command::Sweep(a) => sweep(a),
        Command::Inspect(InspectCommand::Spans(a)) => inspect_spans(a),
        Command::Inspect(InspectCommand::Ltm(a)) => inspect_ltm(a),
        Command::Play(a) => play(a),
        Command::DistCheck(a) => dist_check(a),
    }
}

/// Lets a reader that stops early (`lethe eval … | head`) end the process quietly, as it
/// ends any Unix filter, instead of a panic on the next print. Rust ignores SIGPIPE;
/// this restores the default. Training keeps ignoring it: its progress lines go to
/// stderr and are dropped when nobody reads them, so the run and its checkpoints go on.
/// So does every rank of a distributed launch (`bench`, `dist-check`), whose sockets
/// to the other ranks would otherwise kill it silently when a peer dies.
fn quiet_on_closed_pipe() {
    // SAFETY: called once, before any thread is started; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Refuses a multi-rank launch for the commands that run on one process (each rank
/// would repeat the work and write the same files).
fn one_process(launch: Option<&lethe::dist::Launch>) -> Result<()> {
    if let Some(l) = launch {
        anyhow::bail!("this command runs on one process (rank {} of {} here): start it without torchrun; `train` and `bench` run data-parallel", l.rank, l.world_size);
    }
    Ok(())
}

fn play(a: PlayArgs) -> Result<()> {
    if a.episodes == 0 {
        anyhow::bail!("--episodes must be at least 1");
    }
    let mut cfg = match &a.checkpoint {
        Some(path) => a.config.resolve_over_checkpoint(Checkpoint::load(path)?.config)?,
        None => a.config.resolve()?,
    };
    if !cfg.data.source.is_rl() {
        anyhow::bail!(
            "`lethe play` plays gridworlds (corridor, portal); this config's data.source is `{}`",
            cfg.data.source
        );
    }
    let device = lethe::device::parse(&cfg.train.device)?;
    let seed = a.config.seed.unwrap_or(cfg.seed);
    cfg.train.batch = 1;
    let agent = match &a.checkpoint {
        Some(path) => {
            let mut ckpt = Checkpoint::load(path)?;
            ckpt.config = cfg;
            lethe::rl::agent::Agent::from_checkpoint(&ckpt, device)?
        }
        None => lethe::rl::agent::Agent::new(&cfg, device)?,
    };
    let who = if a.checkpoint.is_some() { "a trained" } else { "an untrained" };
    let mut out = std::io::stdout().lock();
    let mechanism = agent.config.memory.mechanism.name();
    // A closed pipe (`| head`) is not an error worth a panic: printing just stops.
    let _ = writeln!(
        out,
        "{} episode(s) of {} with {who} agent ({mechanism} memory)",
        a.episodes,
        lethe::task::describe(&agent.config)
    );
    if let Some(dir) = &a.spans {
        let (trace, r) = lethe::inspect::agent::trace_agent(&agent, a.episodes, seed)?;
        lethe::inspect::agent::write(&trace, agent.config.data.source, dir)?;
        let _ = writeln!(out, "{}", r.line());
        for line in lethe::inspect::agent::summary_lines(&trace) {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "wrote agent-spans.svg, .png, .html and .csv in {}", dir.display());
        return Ok(());
    }
    let mut t = 0;
    let r = lethe::rl::train::play(&agent, a.episodes, seed, &mut |episodes, actions, outcomes, _| {
        let slot = &episodes.slots[0];
        t += 1;
        if !a.summary || slot.done && outcomes[0].done {
            let over = if outcomes[0].done { " (episode over)" } else { "" };
            let _ = write!(
                out,
                "step {t}: {}, reward {}{over}\n{}",
                actions[0].name(),
                outcomes[0].reward,
                slot.world.render()
            );
        }
        if outcomes[0].done {
            t = 0;
        }
    })?;
    let _ = writeln!(out, "{}", r.line());
    Ok(())
}

/// The model and the text of an `inspect` command.
/// The model and the text, read as the model reads: bytes, or through its tokenizer.
fn inspect_inputs(a: &InspectSpansArgs, checkpoint: &std::path::Path) -> Result<(Lm, lethe::inspect::Text)> {
    let device = lethe::device::parse(&a.device)?;
    let ckpt = Checkpoint::load(checkpoint)?;
    let bytes = match (&a.text, a.conversation) {
        (Some(path), _) => lethe::input::read(path).map_err(|e| anyhow::anyhow!("--text `{}`: {e}", path.display()))?,
        (None, Some(n)) => conversation_text(&ckpt, &a.split, n)?.into_bytes(),
        (None, None) => anyhow::bail!("give --text FILE or --conversation N"),
    };
    let origin = a.text.clone().unwrap_or_else(|| std::path::PathBuf::from("--conversation"));
    let text = match lethe::data::text::tokenizer_of_checkpoint(&ckpt)? {
        None => lethe::inspect::Text::bytes(&bytes),
        Some(tokenizer) => lethe::inspect::Text::tokens(&tokenizer, &lethe::data::text::utf8(bytes, &origin)?)?,
    };
    Ok((Lm::from_checkpoint(&ckpt, device)?, text))
}

/// Conversation `n` of a dialogue run's `split`, as the model reads it.
fn conversation_text(ckpt: &Checkpoint, split: &str, n: usize) -> Result<String> {
    let data = &ckpt.config.data;
    if data.source != Source::Dialogue {
        anyhow::bail!(
            "--conversation: this model was trained on `{}`, not on dialogues; give --text FILE",
            data.source
        );
    }
    let dir = data.path.as_deref().context("data.path: the run names no CMU-DoG folder")?;
    let conversations = lethe::data::dialogue::read_split(dir, split.parse()?)?;
    let c = conversations.get(n).with_context(|| {
        format!(
            "--conversation {n}: the {split} split has {} conversations (0 to {})",
            conversations.len(),
            conversations.len().saturating_sub(1)
        )
    })?;
    Ok(c.segments(data.dialogue.document).into_iter().map(|(s, _)| s).collect())
}

fn inspect_ltm(a: InspectSpansArgs) -> Result<()> {
    let mut runs = vec![a.checkpoint.clone()];
    runs.extend(a.compare.clone());
    let mut pictures = vec![];
    for run in &runs {
        let (lm, text) = inspect_inputs(&a, run)?;
        let picture = lethe::inspect::ltm::trace_ltm(&lm, &text).with_context(|| format!("`{}`", run.display()))?;
        pictures.push((run.display().to_string(), picture));
    }
    let named: Vec<(&str, &lethe::inspect::ltm::LtmPicture)> =
        pictures.iter().map(|(n, p)| (if runs.len() > 1 { n.as_str() } else { "" }, p)).collect();
    lethe::inspect::ltm::write_compared(&named, &a.out)?;
    for (name, picture) in &pictures {
        if runs.len() > 1 {
            println!("{name}:");
        }
        print_ltm_summary(picture);
    }
    println!("wrote {}, ltm.png and ltm.html", a.out.join("ltm.svg").display());
    Ok(())
}

/// Per layer: where the attention went on average and the tokens with the most space.
fn print_ltm_summary(picture: &lethe::inspect::ltm::LtmPicture) {
    let text = &picture.text;
    for (layer, (hist, spaces)) in picture.attention.iter().zip(&picture.spaces).enumerate() {
        let d = hist.len().max(1) as f64;
        let mean: f64 = hist.iter().enumerate().map(|(i, h)| h * (i as f64 + 0.5) / d).sum();
        let largest: Vec<String> = lethe::inspect::ltm::largest(spaces, 5)
            .into_iter()
            .map(|(i, space)| {
                let context = text.join(i.saturating_sub(6), i + 1).replace('\n', "\\n");
                format!("{context:?} ({:.1}x)", space * spaces.len() as f64)
            })
            .collect();
        println!(
            "layer {layer}: mean attended position {mean:.2} of [0, 1]; {} tokens absorbed; most space: {}",
            spaces.len(),
            largest.join(", ")
        );
    }
}

fn inspect_spans(a: InspectSpansArgs) -> Result<()> {
    if a.compare.is_some() {
        anyhow::bail!("--compare applies to `inspect ltm`, not to `inspect spans`");
    }
    let (lm, text) = inspect_inputs(&a, &a.checkpoint)?;
    let trace = lethe::inspect::trace_spans(&lm, &text)?;
    lethe::inspect::write(&trace, &a.out)?;
    for (layer, spans) in trace.spans.iter().enumerate() {
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_by(|&x, &y| spans[y].total_cmp(&spans[x]));
        let longest: Vec<String> = order
            .iter()
            .take(5)
            .map(|&i| {
                let context = text.join(i.saturating_sub(6), i + 1).replace('\n', "\\n");
                format!("{:?} ({:.0})", context, spans[i])
            })
            .collect();
        let mean = spans.iter().map(|&v| v as f64).sum::<f64>() / spans.len().max(1) as f64;
        println!("layer {layer}: mean span {mean:.1}; longest at {}", longest.join(", "));
    }
    println!("wrote {}, spans.png and spans.html", a.out.join("spans.svg").display());
    Ok(())
}

/// Handles --list-presets and --print-config; returns true when the command is done.
fn informational(args: &cli::ConfigArgs) -> Result<bool> {
    if args.list_presets {
        let width = PRESETS.iter().map(|p| p.name.len()).max().unwrap_or(0);
        for p in PRESETS {
            println!("{:<width$}  {}", p.name, p.about);
        }
        return Ok(true);
    }
    if args.print_config {
        print!("{}", args.resolve()?.to_toml()?);
        return Ok(true);
    }
    Ok(false)
}

fn train(a: TrainArgs) -> Result<()> {
    if informational(&a.config)? {
        return Ok(());
    }
    if a.resume
        && (a.config.init_from.is_some()
            || a.config.overrides.iter().any(|o| o.trim_start().starts_with("train.init_from")))
    {
        anyhow::bail!("--init-from starts a run from another run's parameters, and --resume continues this run from its own checkpoint: give one of them");
    }
    let cfg = if a.resume { a.config.resolve_for_resume(&a.out)? } else { a.config.resolve()? };
    let opts = lethe::train::TrainOptions {
        out_dir: a.out,
        resume: a.resume,
        overwrite: a.overwrite,
        quiet: a.quiet,
        stop_after: a.stop_after,
        no_eval: a.no_eval,
        accept_changes: a.accept_changes,
    };
    let leader = lethe::dist::Launch::from_env()?.is_none_or(|l| l.rank == 0); // rank 0 speaks for a torchrun launch
    if cfg.data.source.is_rl() {
        let summary = lethe::rl::train::train(&cfg, &opts)?;
        quiet_on_closed_pipe(); // all is saved; the summary line may meet a closed pipe
        match summary.last_eval.filter(|_| leader) {
            Some(r) => println!("done: {}; run folder {}", r.line(), summary.run_dir.display()),
            None if leader => println!("done: not evaluated (--no-eval); run folder {}", summary.run_dir.display()),
            None => {}
        }
        return Ok(());
    }
    let summary = lethe::train::train(&cfg, &opts)?;
    quiet_on_closed_pipe();
    if summary.last_eval.is_none() && leader {
        println!("done: not evaluated (--no-eval); run folder {}", summary.run_dir.display());
    } else if summary.last_eval.as_ref().is_some_and(|r| leader && r.tokens == 0) {
        println!(
            "done: the last evaluation scored no token ({}); run folder {}",
            lethe::eval::NOTHING_SCORED_ADVICE,
            summary.run_dir.display()
        );
    } else if let Some(r) = summary.last_eval.filter(|_| leader) {
        let rate =
            if cfg.data.tokenizer.is_some() { format!("perplexity {:.2}", r.ppl) } else { format!("{:.4} bpb", r.bpb) };
        println!(
            "done: valid loss {:.4} nats ({rate}), accuracy {:.1}% (unigram baseline {:.4} nats); run folder {}",
            r.loss,
            100.0 * r.accuracy,
            summary.unigram_baseline,
            summary.run_dir.display()
        );
    }
    Ok(())
}

/// Loads a checkpoint, applying an inference-time span cap when one is asked for.
fn load_checkpoint(path: &std::path::Path, max_span: Option<usize>) -> Result<Checkpoint> {
    let mut ckpt = Checkpoint::load(path)?;
    if let Some(cap) = max_span {
        if ckpt.config.memory.mechanism != Mechanism::Expire {
            anyhow::bail!(
                "--max-span {cap}: only Expire-Span models predict spans; this checkpoint's memory is `{}`",
                ckpt.config.memory.mechanism
            );
        }
        if cap == 0 {
            anyhow::bail!("--max-span must be at least 1");
        }
        ckpt.config.memory.expire.inference_cap = cap;
    }
    Ok(ckpt)
}

fn eval(a: EvalArgs) -> Result<()> {
    let device = lethe::device::parse(&a.device)?;
    let mut ckpt = load_checkpoint(&a.checkpoint, a.max_span)?;
    ckpt.config = same_tokenizer(&ckpt.config, ckpt.config.clone().apply_overrides(&a.overrides)?)?;
    ckpt.config.validate()?;
    if ckpt.config.data.source.is_rl() {
        refuse_stream_flags(&a)?;
        return eval_agent(&ckpt, device, &a);
    }
    if a.episodes.is_some() {
        anyhow::bail!("--episodes applies to gridworld checkpoints (corridor, portal); this one is a language model");
    }
    if a.max_tokens == Some(0) {
        anyhow::bail!("--max-tokens must be at least 1");
    }
    let split: Split = a.split.as_deref().unwrap_or("valid").parse()?;
    let mut cfg = ckpt.config.clone();
    if let Some(path) = a.data {
        cfg.data.source = Source::for_path(&path);
        cfg.data.path = Some(path);
    }
    let block = a.block.unwrap_or(cfg.train.block);
    if block == 0 {
        anyhow::bail!("--block must be at least 1");
    }
    cfg.memory.validate(block, cfg.model.arch)?;
    let batch = a.batch.unwrap_or(cfg.train.batch);
    if batch == 0 {
        anyhow::bail!("--batch must be at least 1");
    }
    if let Some(path) = &a.per_token {
        let checkpoint = lethe::checkpoint::resolve(&a.checkpoint);
        lethe::output::check("--per-token", path, &[&checkpoint, cfg.data.path.as_deref().unwrap_or(&checkpoint)])?;
    }
    let mut sized = cfg.clone();
    (sized.train.batch, sized.train.block) = (batch, block);
    lethe::model::check_fits(&sized, device).context("--batch and --block")?;
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let data = lethe::task::load_split(&cfg, split, batch)?;
    let started = std::time::Instant::now();
    let mut last_report = started;
    let progress = |done: usize, total: usize| {
        if last_report.elapsed().as_secs_f64() >= 5.0 && done < total {
            last_report = std::time::Instant::now();
            let elapsed = started.elapsed().as_secs_f64();
            let eta = elapsed / done as f64 * (total - done) as f64;
            eprintln!(
                "eval {split}: {done}/{total} tokens ({:.0}%), ETA {}",
                100.0 * done as f64 / total as f64,
                lethe::metrics::format_duration(std::time::Duration::from_secs_f64(eta))
            );
        }
    };
    let r = match &a.per_token {
        None => lethe::eval::evaluate_with_progress(&lm, &data, batch, block, a.max_tokens, progress)?,
        Some(path) => {
            let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
            let text = |id: lethe::data::Token| match &tokenizer {
                Some(t) => t.decode(&[id]),
                None => Ok(String::from_utf8_lossy(&[id as u8]).into_owned()),
            };
            let mut csv = lethe::eval::PerTokenCsv::create(path)?;
            let r = lethe::eval::evaluate_per_token(&lm, &data, (batch, block, a.max_tokens), progress, |s| {
                csv.write(s, &text(s.target)?)
            })?;
            csv.finish()?;
            eprintln!("wrote {}", path.display());
            r
        }
    };
    if r.tokens == 0 {
        anyhow::bail!(
            "no scored token in the {split} tokens evaluated ({} streams x blocks of {block}{}): this task scores only its answers; raise --max-tokens or lower --batch",
            batch,
            a.max_tokens.map(|m| format!(", --max-tokens {m}")).unwrap_or_default()
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let answers = r.answer_accuracy.map(|x| format!(", answers {:.2}%", 100.0 * x)).unwrap_or_default();
        let unit = if cfg.data.tokenizer.is_some() { "token" } else { "byte" };
        let words = r.word_ppl.map(|p| format!(", per word {p:.2}")).unwrap_or_default();
        println!(
            "{split}: loss {:.4} nats, {:.4} bits per {unit}, perplexity {:.2}{words}, accuracy {:.2}%{answers} over {} scored tokens (block {block}, {batch} streams)",
            r.loss,
            r.bpb,
            r.ppl,
            100.0 * r.accuracy,
            r.tokens
        );
        let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
        let spans = r.mean_span.as_ref().map(|s| format!(" | mean span per layer [{}]", fmt(s))).unwrap_or_default();
        println!("memory size per layer [{}] | cache held per layer [{}]{spans}", fmt(&r.mem_size), fmt(&r.held));
        println!("evaluated in {:.1} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// `cfg` (a checkpoint's config with a command's `--set`s) when it reads text through
/// the tokenizer the model was `trained` with: other ids would be scored against the
/// model's own without a word.
fn same_tokenizer(trained: &lethe::config::Config, cfg: lethe::config::Config) -> Result<lethe::config::Config> {
    if cfg.data.tokenizer != trained.data.tokenizer {
        let name = |t: &Option<std::path::PathBuf>| {
            t.as_ref().map_or("none (bytes)".to_string(), |p| format!("`{}`", p.display()))
        };
        anyhow::bail!("--set data.tokenizer: the model reads the ids of the tokenizer it was trained with ({}); it cannot read another's", name(&trained.data.tokenizer));
    }
    Ok(cfg)
}

/// Refuses the flags of `lethe eval` that apply to token streams only, for an agent.
fn refuse_stream_flags(a: &EvalArgs) -> Result<()> {
    let given = [
        ("--split", a.split.is_some()),
        ("--block", a.block.is_some()),
        ("--max-tokens", a.max_tokens.is_some()),
        ("--data", a.data.is_some()),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
        anyhow::bail!("{flag} applies to language-model checkpoints; a gridworld agent is scored on fresh episodes (see --episodes)");
    }
    Ok(())
}

/// `lethe eval` of a gridworld agent: play episodes apart from training's.
fn eval_agent(ckpt: &Checkpoint, device: tch::Device, a: &EvalArgs) -> Result<()> {
    let mut ckpt_cfg = ckpt.config.clone();
    if let Some(batch) = a.batch {
        if batch == 0 {
            anyhow::bail!("--batch must be at least 1");
        }
        ckpt_cfg.train.batch = batch;
    }
    let agent = lethe::rl::agent::Agent::new(&ckpt_cfg, device)?;
    ckpt.load_parameters(&agent.vs.variables())?;
    let episodes = a.episodes.unwrap_or(ckpt_cfg.rl.eval_episodes);
    if episodes == 0 {
        anyhow::bail!("--episodes must be at least 1");
    }
    let started = std::time::Instant::now();
    let r = lethe::rl::train::evaluate(&agent, episodes)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("{}", r.line());
        println!("evaluated in {:.1} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

fn generate(a: GenerateArgs) -> Result<()> {
    let device = lethe::device::parse(&a.device)?;
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone().into_bytes(),
        (None, Some(f)) => {
            lethe::input::read(f).map_err(|e| anyhow::anyhow!("--prompt-file `{}`: {e}", f.display()))?
        }
        (None, None) => anyhow::bail!("give a prompt with --prompt TEXT or --prompt-file FILE"),
    };
    let sampling = Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    sampling.validate()?;
    let ckpt = load_checkpoint(&a.checkpoint, a.max_span)?;
    // The checkpoint's thread count, at most this machine's cores (it may come from a larger one).
    lethe::device::apply_threads(ckpt.config.train.threads.min(lethe::device::cores()))?;
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
    let (ids, unit) = match &tokenizer {
        None => (prompt.iter().map(|&b| b as lethe::data::Token).collect(), "bytes"),
        Some(t) => {
            let origin = a.prompt_file.clone().unwrap_or_else(|| "--prompt".into());
            (t.encode(&lethe::data::text::utf8(prompt.clone(), &origin)?)?, "tokens")
        }
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&prompt)?;
    out.flush()?;
    let started = std::time::Instant::now();
    let mut last_report = started;
    let progress = |done: usize, total: usize| {
        if last_report.elapsed().as_secs_f64() >= 2.0 && done < total {
            last_report = std::time::Instant::now();
            eprintln!("reading the prompt: {done}/{total} {unit} ({:.0}%)", 100.0 * done as f64 / total as f64);
        }
    };
    let mut text = tokenizer.as_ref().map(lethe::data::tokenizer::TextStream::new);
    lethe::generate::stream(&lm, &ids, a.bytes, &sampling, progress, |t| {
        let piece = match text.as_mut() {
            None => vec![t as u8],
            Some(s) => s.push(t)?.into_bytes(),
        };
        out.write_all(&piece).and_then(|()| out.flush()).map_err(|e| lethe::LetheError::io("stdout", e))
    })?;
    if let Some(s) = text.as_mut() {
        out.write_all(s.finish()?.as_bytes())?;
    }
    writeln!(out)?;
    Ok(())
}

/// Draws the curves of the runs into `<out>.png` and `<out>.svg`.
fn plot(a: PlotArgs) -> Result<()> {
    let metrics: Vec<std::path::PathBuf> = a.runs.iter().map(|r| r.join("metrics.jsonl")).collect();
    let inputs: Vec<&std::path::Path> = metrics.iter().map(|m| m.as_path()).collect();
    for extension in ["png", "svg"] {
        lethe::output::check("--out", &a.out.with_extension(extension), &inputs)?;
    }
    let runs =
        a.runs.iter().map(|r| lethe::plot::read_curves(r, &a.metric)).collect::<lethe::error::Result<Vec<_>>>()?;
    if let Some(parent) = a.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating `{}`", parent.display()))?;
    }
    let [png, svg] = lethe::plot::plot(&runs, &a.metric, &a.out)?;
    println!("wrote {} and {}", png.display(), svg.display());
    Ok(())
}

/// The widest beam `--beam` takes.
const MAX_BEAM: usize = 256;

/// The decoding that --decode and its options describe.
fn decoding(a: &ReplyArgs) -> Result<lethe::dialogue::Decoding> {
    use lethe::dialogue::Decoding;
    if a.max_length == 0 {
        anyhow::bail!("--max-length 0: a reply needs room for at least one token");
    }
    let (beam, sampling) =
        (a.beam, Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed });
    let d = match a.decode.as_str() {
        "greedy" => Decoding::Sample(Sampling { temperature: 0.0, top_p: 1.0, ..sampling }),
        "sample" => Decoding::Sample(sampling),
        "beam" if beam == 0 => anyhow::bail!("--beam 0: a beam needs at least one hypothesis"),
        // Each hypothesis carries a copy of the model's memory.
        "beam" if beam > MAX_BEAM => {
            anyhow::bail!("--beam {beam}: at most {MAX_BEAM} hypotheses (each carries a copy of the model's memory)")
        }
        "beam" => Decoding::Beam { width: beam },
        other => anyhow::bail!("--decode {other}: must be greedy, sample or beam"),
    };
    if let Decoding::Sample(s) = &d {
        s.validate()?;
    }
    Ok(d)
}

/// Talks about a document: one reply on stdout per line on stdin.
fn chat(a: ChatArgs) -> Result<()> {
    use lethe::dialogue::{Chat, Codec};
    let device = lethe::device::parse(&a.device)?;
    let decoding = decoding(&a.reply)?;
    let bytes =
        lethe::input::read(&a.document).map_err(|e| anyhow::anyhow!("--document `{}`: {e}", a.document.display()))?;
    let document = lethe::data::text::utf8(bytes, &a.document)?;
    if document.trim().is_empty() {
        anyhow::bail!("`{}` holds no text to talk about", a.document.display());
    }
    let ckpt = load_checkpoint(&a.checkpoint, None)?;
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
    let mut chat = Chat::new(&lm, Codec::new(tokenizer.as_ref())?, &document, decoding, a.reply.max_length)?;
    eprintln!(
        "read `{}` (memory held per layer: {:?}); type a line, end with Ctrl-D",
        a.document.display(),
        chat.memory_held()
    );
    let stdout = std::io::stdout();
    let mut stdin = std::io::stdin().lock();
    while let Some(line) = bounded_line(&mut stdin)? {
        if line.trim().is_empty() {
            continue;
        }
        let answer = chat.turn(&line)?;
        writeln!(stdout.lock(), "{answer}")?;
    }
    Ok(())
}

/// The longest line `lethe chat` reads from standard input.
const MAX_LINE_BYTES: u64 = 1 << 20;

/// The next line of `input` without its newline, `None` at the end; a line longer than
/// [`MAX_LINE_BYTES`] (an endless input without newlines, as `/dev/zero`) is refused
/// when its limit is reached, not read into memory whole.
fn bounded_line(input: &mut impl std::io::BufRead) -> Result<Option<String>> {
    use std::io::{BufRead, Read};
    let mut bytes = vec![];
    let read = input.take(MAX_LINE_BYTES + 1).read_until(b'\n', &mut bytes).context("reading standard input")?;
    if read == 0 {
        return Ok(None);
    }
    if bytes.len() as u64 > MAX_LINE_BYTES {
        anyhow::bail!("standard input: a line longer than {} MiB; a turn is one line of text", MAX_LINE_BYTES >> 20);
    }
    let text =
        String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("standard input: a line that is not UTF-8 text"))?;
    Ok(Some(text.trim_end_matches(['\n', '\r']).to_string()))
}

/// Replies to a dialogue split and scores them, with the true responses' perplexity.
fn dialogue_eval(a: DialogueEvalArgs) -> Result<()> {
    use lethe::dialogue::{respond_to_split, Codec, Options};
    let device = lethe::device::parse(&a.device)?;
    let decoding = decoding(&a.reply)?;
    let split: Split = a.split.parse()?;
    let ckpt = load_checkpoint(&a.checkpoint, None)?;
    let mut cfg = same_tokenizer(&ckpt.config, ckpt.config.clone().apply_overrides(&a.overrides)?)?;
    if let Some(path) = &a.data {
        cfg.data.path = Some(path.clone());
    }
    cfg.validate()?;
    if cfg.data.source != Source::Dialogue {
        anyhow::bail!(
            "--checkpoint: this model was trained on `{}`, not on dialogues (data.source = \"dialogue\")",
            cfg.data.source
        );
    }
    let dir = cfg.data.path.clone().context("data.path: the CMU-DoG folder is needed (--data DIR)")?;
    if let Some(path) = &a.csv {
        let checkpoint = lethe::checkpoint::resolve(&a.checkpoint);
        lethe::output::check("--csv", path, &[&checkpoint, &dir, a.wordnet.as_deref().unwrap_or(&dir)])?;
    }
    let mut conversations = lethe::data::dialogue::read_split(&dir, split)?;
    if a.conversations > 0 {
        conversations.truncate(a.conversations);
    }
    let scorer = scorer(a.wordnet.as_deref())?;
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
    let codec = Codec::new(tokenizer.as_ref())?;
    let opts = Options {
        decoding,
        max_length: a.reply.max_length,
        min_history: a.min_history,
        with_document: cfg.data.dialogue.document,
    };
    let started = std::time::Instant::now();
    let mut said = started;
    let replies = respond_to_split(&lm, &codec, &conversations, &opts, &scorer, |done, total| {
        if said.elapsed().as_secs() >= 10 && done < total {
            said = std::time::Instant::now();
            eprintln!("replying: {done}/{total} conversations ({:.0} s)", started.elapsed().as_secs_f64());
        }
    })?;
    let scores: Vec<_> = replies.iter().map(|r| r.scores).collect();
    let mean = lethe::textmetrics::mean(&scores)
        .context("no turn to reply to: every conversation has at most --min-history turns")?;
    // Perplexity of the true responses, over the same conversations, read through the
    // replies' tokenizer (the run's own copy).
    let data = lethe::data::dialogue::split_data(tokenizer.as_ref(), &cfg.data.dialogue, &conversations, &dir, split)?;
    let ppl = lethe::eval::evaluate(&lm, &data, 1, cfg.train.block, None)?;
    if let Some(path) = &a.csv {
        lethe::output::write("--csv", path, &lethe::dialogue::replies_csv(&replies)?, &[])?;
        eprintln!("wrote {}", path.display());
    }
    if a.json {
        let out = serde_json::json!({"split": split.to_string(), "conversations": conversations.len(), "replies": replies.len(), "ppl": ppl.ppl, "word_ppl": ppl.word_ppl, "scores": mean, "meteor_synonyms": scorer.wordnet().is_some()});
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{split}: {} replies in {} conversations ({} decoding), perplexity of the true responses {:.2}",
            replies.len(),
            conversations.len(),
            a.reply.decode,
            ppl.ppl
        );
        println!("{}", lethe::textmetrics::summary(&mean, replies.len(), scorer.wordnet().is_some()));
    }
    Ok(())
}

/// Writes the generated dialogue data set.
fn dialogue_data(a: DialogueDataArgs) -> Result<()> {
    let w = lethe::data::dialogue::synthetic::write(&a.out, a.conversations, a.seed)?;
    let [train, valid, test] = w.counts;
    println!("wrote {train} / {valid} / {test} conversations (train / valid / test) to {}", a.out.display());
    println!("word vocabulary of {} words: {}", w.words, w.tokenizer.display());
    Ok(())
}

/// Scores predictions against references, line by line, and prints the means.
fn score(a: ScoreArgs) -> Result<()> {
    use lethe::textmetrics;
    if let Some(path) = &a.csv {
        lethe::output::check(
            "--csv",
            path,
            &[&a.predictions, &a.references, a.wordnet.as_deref().unwrap_or(&a.predictions)],
        )?;
    }
    let scorer = scorer(a.wordnet.as_deref())?;
    let scores = textmetrics::score_files(&a.predictions, &a.references, &scorer)?;
    if let Some(path) = &a.csv {
        lethe::output::write("--csv", path, &textmetrics::csv(&scores)?, &[])?;
    }
    let mean = textmetrics::mean(&scores).context("no pairs to score")?;
    println!("{}", textmetrics::summary(&mean, scores.len(), scorer.wordnet().is_some()));
    Ok(())
}

/// The text scorer: METEOR with WordNet's synonyms when given its folder.
fn scorer(wordnet: Option<&std::path::Path>) -> Result<lethe::textmetrics::Scorer> {
    use lethe::textmetrics::Scorer;
    Ok(match wordnet {
        Some(dir) => Scorer::with_wordnet(lethe::wordnet::WordNet::open(dir).context("--wordnet")?),
        None => Scorer::default(),
    })
}

/// Learns a tokenizer from text files and writes it as `<out>/tokenizer.json`.
fn tokenizer(c: TokenizerCommand) -> Result<()> {
    use lethe::data::tokenizer::{Tokenizer, UNK};
    let io = match &c {
        TokenizerCommand::Words(a) => &a.io,
        TokenizerCommand::Bpe(a) => &a.io,
    };
    let target = io.out.join("tokenizer.json");
    let inputs: Vec<&std::path::Path> = io.files.iter().map(|f| f.as_path()).collect();
    lethe::output::check("--out", &target, &inputs)?;
    if target.exists() && !io.overwrite {
        anyhow::bail!("`{}` already holds a tokenizer; pass --overwrite to replace it", target.display());
    }
    let mut texts = vec![];
    for file in &io.files {
        let bytes = lethe::input::read(file).map_err(|e| anyhow::anyhow!("`{}`: {e}", file.display()))?;
        eprintln!("read `{}`: {:.1} MB", file.display(), bytes.len() as f64 / 1e6);
        texts.push(lethe::data::text::utf8(bytes, file)?);
    }
    if texts.iter().all(|t| t.trim().is_empty()) {
        anyhow::bail!("the text files hold no text to learn a tokenizer from");
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let tokenizer = match &c {
        TokenizerCommand::Words(a) => Tokenizer::train_words(&refs, a.min_count, a.max_size)?,
        TokenizerCommand::Bpe(a) => Tokenizer::train_bpe(&refs, a.vocab)?,
    };
    // How the text reads through it.
    let (mut tokens, mut unknown) = (0usize, 0usize);
    let unk = tokenizer.encode(UNK)?.first().copied().filter(|_| tokenizer.spaced());
    for text in &refs {
        let ids = lethe::data::text::encode_long(&tokenizer, text)?;
        tokens += ids.len();
        unknown += unk.map_or(0, |u| ids.iter().filter(|&&i| i == u).count());
    }
    std::fs::create_dir_all(&io.out).with_context(|| format!("creating `{}`", io.out.display()))?;
    lethe::checkpoint::write_atomic(&target, tokenizer.to_json()?.as_bytes())?;
    let bytes: usize = refs.iter().map(|t| t.len()).sum();
    let unknown = unk
        .map(|_| format!(", {:.2}% of them {UNK}", 100.0 * unknown as f64 / tokens.max(1) as f64))
        .unwrap_or_default();
    println!(
        "vocabulary of {} ids; the text reads as {tokens} tokens ({:.2} bytes each){unknown}; wrote {} (use it with --set data.tokenizer={} and model.vocab >= {})",
        tokenizer.vocab_size(),
        bytes as f64 / tokens.max(1) as f64,
        target.display(),
        io.out.display(),
        tokenizer.vocab_size()
    );
    Ok(())
}

fn bench(a: BenchArgs) -> Result<()> {
    if informational(&a.config)? {
        return Ok(());
    }
    let cfg = a.config.resolve()?;
    let scale = a.scale.as_deref().map(lethe::bench::parse_scale).transpose()?;
    let cases = lethe::bench::plan(&cfg, &a.mechanisms, scale.as_ref(), a.context)?;
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
    let group = lethe::dist::join_for_training(&cfg)?;
    let leader = group.as_ref().is_none_or(|g| g.rank() == 0); // rank 0 speaks for a torchrun launch
    let (gemm, threads) = lethe::bench::machine_rate(&cfg)?;
    if leader {
        let tf32 = if cfg.train.device != "cpu" && lethe::device::tf32() { " in TF32" } else { "" };
        println!(
            "matrix multiply on {}: {gemm:.1} GFLOP/s with {threads} threads{tf32} (the peak for MFU)",
            cfg.train.device
        );
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
            "{:<14} {:<11} {:>9} params | {} tok/step | step median {:.1} ms (p10 {:.1}, p90 {:.1}) | {:.0} tok/s | peak RSS {}{} | mem {:?} | {:.2} GFLOP/step, MFU {} | context {} tokens{reads}{comm}{relative}",
            r.name,
            r.mechanism,
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

/// Prints the table of `results` (when there are several) and writes `bench.json` and
/// `bench.csv` into `dir`; returns a sentence naming them.
fn bench_report(
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

fn sweep(a: SweepArgs) -> Result<()> {
    if informational(&a.config)? {
        return Ok(());
    }
    let base = a.config.resolve()?;
    let sizes = match &a.sizes {
        Some(text) => lethe::sweep::parse_sizes(text, "--sizes")?,
        None => lethe::sweep::default_sizes(&base),
    };
    let items = if a.mechanisms.is_empty() {
        Mechanism::all().iter().map(|m| m.name().to_string()).collect()
    } else {
        a.mechanisms.clone()
    };
    let arms = lethe::sweep::parse_arms(&items, &sizes)?;
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

fn dist_check(a: DistCheckArgs) -> Result<()> {
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
    let group = lethe::dist::ProcessGroup::join(&launch, std::time::Duration::from_secs(a.timeout))?;
    let store = if launch.agent_store { "torchrun's store" } else { "rank 0's store" };
    println!(
        "{who}: joined in {:.2} s through {store} at {}:{} (Gloo)",
        start.elapsed().as_secs_f64(),
        launch.master_addr,
        launch.master_port
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
