//! Which configs a bench runs ([`plan`]: one per mechanism and per value of a [`Scale`]
//! knob) and running them, one after another or in turns ([`run`]).

use super::*;

/// A knob that `lethe bench --scale` sweeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    /// The maximum span `L` (`memory.span`; the recent window of the Compressive
    /// Transformer and the ∞-former's short-term memory).
    Span,
    /// Tokens per stream seen before the timed steps.
    Context,
    /// Block length (`train.block`).
    Block,
    /// Streams per step (`train.batch`).
    Batch,
}

impl Knob {
    /// The knob's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Knob::Span => "span",
            Knob::Context => "context",
            Knob::Block => "block",
            Knob::Batch => "batch",
        }
    }
}

/// A knob and the values to bench it at.
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    /// The knob.
    pub knob: Knob,
    /// Its values, in order.
    pub values: Vec<usize>,
}

/// Parses `span=256,512,1024` (knobs: span, context, block, batch).
pub fn parse_scale(text: &str) -> Result<Scale> {
    let bad = |why: &str| {
        LetheError::Invalid(format!(
            "--scale `{text}`: {why} (e.g. --scale span=256,512,1024; knobs: span, context, block, batch)"
        ))
    };
    let (name, values) = text.split_once('=').ok_or_else(|| bad("expected KNOB=V1,V2,..."))?;
    let knob = match name.trim() {
        "span" => Knob::Span,
        "context" => Knob::Context,
        "block" => Knob::Block,
        "batch" => Knob::Batch,
        other => return Err(bad(&format!("unknown knob `{other}`"))),
    };
    let values = values
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad(&format!("`{v}` is not a positive whole number")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Scale { knob, values })
}

/// One config to bench, with the context to stream first and the knob value it stands for.
#[derive(Clone, Debug)]
pub struct Case {
    /// The config.
    pub cfg: Config,
    /// Tokens per stream streamed before timing (None: enough to fill the memory).
    pub context: Option<usize>,
    /// The scaled knob and its value.
    pub scaled: Option<(Knob, usize)>,
}

/// The configs to bench: `base` for each of `mechanisms` (`name` or `name:size`, as in
/// `lethe sweep`: a size sets the mechanism's memory size; none keeps the config's),
/// or `base` alone when none are given; each in every one of `precisions` (none: the
/// config's own); each at every value of `scale`.
pub fn plan(
    base: &Config,
    mechanisms: &[String],
    precisions: &[Precision],
    scale: Option<&Scale>,
    context: Option<usize>,
) -> Result<Vec<Case>> {
    if base.data.source.is_rl() {
        return Err(LetheError::Invalid(format!(
            "`{}` is a reinforcement-learning task: `lethe bench` times language-model steps; a gridworld run reports its environment steps per second as it trains",
            base.name
        )));
    }
    if let (Some(s), Some(tokens)) = (scale, context) {
        if s.knob == Knob::Context {
            return Err(LetheError::Invalid(format!(
                "--context {tokens} and --scale context=...: the scale gives each config its context; give one of them"
            )));
        }
    }
    if let Some(tokens) = scale
        .filter(|s| s.knob == Knob::Context)
        .and_then(|s| s.values.iter().copied().find(|&t| t > MAX_CONTEXT_TOKENS))
    {
        return Err(LetheError::Invalid(format!(
            "--scale context={tokens}: at most {MAX_CONTEXT_TOKENS} tokens (2^32)"
        )));
    }
    let mut configs = vec![];
    for item in mechanisms {
        let (name, size) = item.split_once(':').unwrap_or((item, ""));
        let mechanism = Mechanism::parse(name.trim())?;
        let cfg = if size.trim().is_empty() {
            let mut c = base.clone();
            c.memory.mechanism = mechanism;
            c
        } else {
            let size = crate::sweep::parse_sizes(size, &format!("--mechanism {item}"))?;
            if size.len() != 1 {
                return Err(LetheError::Invalid(format!(
                    "--mechanism `{item}`: give one size (sweep sizes with --scale span=...)"
                )));
            }
            crate::sweep::configure(base, mechanism, size[0], base.seed)?
        };
        configs.push(cfg);
    }
    if configs.is_empty() {
        configs.push(base.clone());
    }
    if !precisions.is_empty() {
        configs = configs
            .iter()
            .flat_map(|c| {
                precisions.iter().map(|&p| {
                    let mut c = c.clone();
                    c.train.precision = p;
                    c
                })
            })
            .collect();
    }
    let mut cases = vec![];
    for cfg in configs {
        let Some(scale) = scale else {
            cases.push(Case { cfg, context, scaled: None });
            continue;
        };
        for &value in &scale.values {
            let mut c = cfg.clone();
            let mut ctx = context;
            match scale.knob {
                Knob::Span => c.memory.span = value,
                Knob::Context => ctx = Some(value),
                Knob::Block => c.train.block = value,
                Knob::Batch => c.train.batch = value,
            }
            c.validate().map_err(|e| LetheError::Invalid(format!("--scale {}={value}: {e}", scale.knob.name())))?;
            cases.push(Case { cfg: c, context: ctx, scaled: Some((scale.knob, value)) });
        }
    }
    Ok(cases)
}

/// What [`run`] benched: the results of the cases in order, and the signal that
/// skipped the rest, if one did.
pub struct Benched {
    pub results: Vec<BenchResult>,
    /// SIGINT, SIGTERM or SIGHUP, when one arrived while cases remained: on a single
    /// process the case under way stopped at its next step and was dropped, under
    /// torchrun it was finished; the ones after it were skipped. With several rounds, a
    /// signal while the cases were prepared stopped before any was timed, and one in a
    /// round let that round finish and skipped the rest.
    pub stopped_by: Option<String>,
    /// Rounds timed ([`BenchOptions::rounds`], fewer after a signal).
    pub rounds_done: usize,
}

/// Benches every case in turn, telling `say` about each result as it comes. A first
/// SIGINT, SIGTERM or SIGHUP stops the case under way at its next step, drops it and
/// skips the rest (the ranks of a launch finish the case under way, so that all stop at
/// the same one); a second one ends the process at once.
/// With [`BenchOptions::rounds`] above one, [`run_in_rounds`].
pub fn run(
    cases: &[Case],
    opts: &BenchOptions,
    gemm_gflops: f64,
    group: Option<&ProcessGroup>,
    say: &mut dyn FnMut(&BenchResult),
) -> Result<Benched> {
    for case in cases {
        crate::model::check_fits(&case.cfg, crate::device::parse(&case.cfg.train.device)?)?;
    }
    let signals = Signals::watch()?;
    if opts.rounds > 1 {
        return run_in_rounds(cases, opts, gemm_gflops, group, &signals, say);
    }
    let mut results = vec![];
    for case in cases {
        let o = BenchOptions { context: case.context, ..opts.clone() };
        let r = match bench(&case.cfg, &o, group) {
            // A signal during this config: it is dropped, the configs before it kept.
            Err(LetheError::Stopped { signal }) => {
                return Ok(Benched { results, stopped_by: Some(signal), rounds_done: 1 })
            }
            r => r?,
        };
        let r = labelled(with_mfu(r, gemm_gflops), case);
        say(&r);
        results.push(r);
        if let Some(signal) = stop_signal(&signals, group)?.filter(|_| results.len() < cases.len()) {
            return Ok(Benched { results, stopped_by: Some(signal), rounds_done: 1 });
        }
    }
    Ok(Benched { results, stopped_by: None, rounds_done: 1 })
}

/// Every case built, filled and warmed up first, then their timed steps in
/// `opts.rounds` rounds, the cases taking turns, so that the machine's slow and fast
/// spells fall on all of them alike. A signal stops the bench after the round under
/// way; the figures are then over the rounds done.
pub(crate) fn run_in_rounds(
    cases: &[Case],
    opts: &BenchOptions,
    gemm_gflops: f64,
    group: Option<&ProcessGroup>,
    signals: &Signals,
    say: &mut dyn FnMut(&BenchResult),
) -> Result<Benched> {
    let configs: Vec<&Config> = cases.iter().map(|c| &c.cfg).collect();
    if let Some(first) = configs.first() {
        crate::model::check_fit_together(&configs, crate::device::parse(&first.train.device)?)?;
    }
    let leader = group.is_none_or(|g| g.rank() == 0);
    let mut timed = vec![];
    for case in cases {
        match Timed::prepare(&case.cfg, &BenchOptions { context: case.context, ..opts.clone() }, group) {
            // A signal while the configs are prepared: nothing was timed yet.
            Err(LetheError::Stopped { signal }) => {
                return Ok(Benched { results: vec![], stopped_by: Some(signal), rounds_done: 0 })
            }
            t => timed.push(t?),
        }
    }
    let (mut rounds_done, mut stopped_by) = (0, None);
    while rounds_done < opts.rounds && stopped_by.is_none() {
        for t in timed.iter_mut() {
            t.round(opts.steps, false)?;
            if opts.profile {
                t.profile(opts.steps, None)?;
            }
        }
        rounds_done += 1;
        // Every round up to 20; past that, every tenth of the rounds and the last.
        let every = (opts.rounds / 10).max(1);
        if leader && (opts.rounds <= 20 || rounds_done % every == 0 || rounds_done == opts.rounds) {
            let medians: Vec<String> =
                timed.iter().map(|t| format!("{:.1}", 1e3 * t.round_medians[rounds_done - 1])).collect();
            crate::say!("round {rounds_done} of {}: median ms per step {}", opts.rounds, medians.join(", "));
        }
        stopped_by = stop_signal(signals, group)?.filter(|_| rounds_done < opts.rounds);
    }
    let mut results = vec![];
    for (t, case) in timed.into_iter().zip(cases) {
        let mut r =
            labelled(with_mfu(t.finish(&BenchOptions { context: case.context, ..opts.clone() })?, gemm_gflops), case);
        r.peak_rss_mib = None;
        r.peak_gpu_mib = None;
        results.push(r);
    }
    let first = results.first().map(|r| r.round_medians_s.clone()).unwrap_or_default();
    for r in results.iter_mut() {
        let ratios: Vec<f64> = r.round_medians_s.iter().zip(&first).map(|(a, b)| a / b).collect();
        r.relative = Some(Timing::of(ratios).median_s);
        say(r);
    }
    Ok(Benched { results, stopped_by, rounds_done })
}

/// `r` with the knob and value its case stands for.
pub(crate) fn labelled(mut r: BenchResult, case: &Case) -> BenchResult {
    if let Some((knob, value)) = case.scaled {
        r.knob = Some(knob.name().to_string());
        r.value = Some(value);
    }
    r
}

/// The signal that asks the bench to stop, if one came (to any rank of a launch).
pub(crate) fn stop_signal(signals: &Signals, group: Option<&ProcessGroup>) -> Result<Option<String>> {
    let received = signals.received();
    let stop = match group {
        Some(g) => g.any(received.is_some())?,
        None => received.is_some(),
    };
    Ok(stop.then(|| received.unwrap_or_else(|| "a signal to another rank".to_string())))
}
