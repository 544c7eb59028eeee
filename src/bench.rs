//! `lethe bench`: the efficiency report of the Expire-Span paper (its Table 4) for any
//! config and memory mechanism: time per training step (forward, backward, clip, Adam)
//! after a warm-up, with its median and spread, tokens per second, the peak resident
//! memory, the memory size per layer, the FLOPs of a step and the model FLOPs
//! utilisation (MFU) against the matrix-multiply rate this machine reaches through the
//! same engine.
//!
//! The tokens are uniform random bytes of the configured shape: step time does not
//! depend on their content, and the bench needs no corpus. Before timing, forward-only
//! blocks fill the memory to its steady size, so a long span is timed full, not empty.
//! With a given context ([`BenchOptions::context`]), that many tokens per stream are
//! streamed through first instead: the time per block at 8k, 64k or 1M tokens of
//! context shows whether a mechanism's cost grows with what it has seen (the
//! ∞-former's must not).
//!
//! Several configs can be benched in one call ([`plan`]: one per mechanism, and per
//! value of a [`Scale`] knob), and the results are written as a table, JSON and CSV
//! ([`table`], [`write_report`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::checkpoint::write_atomic;
use crate::config::{Config, Mechanism};
use crate::data::Batch;
use crate::dist::ProcessGroup;
use crate::error::{LetheError, Result};
use crate::metrics::{mean, peak_rss_bytes, reset_peak_rss};
use crate::model::memory::describe;
use crate::model::memory::window::Chunk;
use crate::model::Lm;
use crate::optim::Optimiser;
use crate::rng::Rng;
use crate::run::{begin_step, Scales, Signals};
use crate::train::optimisation_step;

/// How long to bench each config.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Timed steps (per round). Default 20.
    pub steps: usize,
    /// Rounds: with more than one, every config is built and warmed up first, then the
    /// configs take turns, `steps` timed steps each, `rounds` times, so that a machine
    /// whose speed drifts from minute to minute slows them alike. The figures are over
    /// every round's steps; the peak resident memory is not reported (the configs share
    /// the process). Default 1.
    pub rounds: usize,
    /// Untimed warm-up steps. Default 3.
    pub warmup: usize,
    /// Tokens per stream streamed through the model (forward only) before timing.
    /// Default: enough to fill the memory.
    pub context: Option<usize>,
    /// After the timed steps, run as many again with every phase timed
    /// ([`crate::profile`]), and report the time per phase. With `rounds`, every round
    /// does so after its timed steps, so that the profiles too are taken in turns.
    /// Default false.
    pub profile: bool,
    /// With `profile`: a folder where libtorch's profiler records the profiled steps,
    /// every operation of the forward and backward passes, as the Chrome trace (JSON)
    /// `trace-<config name>.json`. Its overhead is in that run's phase times. At most
    /// [`MAX_TRACE_STEPS`] steps. Default none.
    pub trace: Option<PathBuf>,
    /// Time the steps on the config's training data, read as `lethe train` reads it
    /// (its streams from their start), instead of random tokens. What a learned memory
    /// keeps (Expire-Span's spans, Adaptive-Span's) depends on what it reads: on random
    /// tokens there is nothing to remember, and training on them shrinks the spans
    /// while they are timed. Default false.
    pub train_data: bool,
    /// Leave the parameters as they are: every timed step computes what a training step
    /// computes, the optimiser's update included, at a learning rate of 0, so that a
    /// learned memory keeps its size while the configs are timed (with `--init-from` a
    /// trained run, the size it learned). Default false.
    pub frozen: bool,
}

/// Most steps `--trace` records: libtorch's profiler keeps every event in memory until it
/// writes the file, about 30 MB a step at `enwik8-tiny` (1.4 GB of peak RSS for 40
/// steps against 250 MB untraced), more with more layers.
pub const MAX_TRACE_STEPS: usize = 50;

/// The most timed steps a config takes (`--bench-steps`): figures from more steps are
/// no steadier, and a count near 2^64 is a typing error.
pub const MAX_BENCH_STEPS: usize = 100_000;
/// The most warm-up steps (`--warmup`).
pub const MAX_WARMUP_STEPS: usize = 10_000;
/// The most rounds (`--rounds`).
pub const MAX_ROUNDS: usize = 10_000;
/// The longest context streamed before the timed steps (`--context`, `--scale
/// context=`), in tokens: 2^32 takes days at any size.
pub const MAX_CONTEXT_TOKENS: usize = 1 << 32;

impl BenchOptions {
    /// Refuses options that would time nothing, and traces too long to hold in memory.
    pub fn validate(&self) -> Result<()> {
        if self.steps == 0 {
            return Err(LetheError::Invalid("--bench-steps must be at least 1".into()));
        }
        if self.rounds == 0 {
            return Err(LetheError::Invalid("--rounds must be at least 1".into()));
        }
        let bounded = [
            ("--bench-steps", self.steps, MAX_BENCH_STEPS),
            ("--warmup", self.warmup, MAX_WARMUP_STEPS),
            ("--rounds", self.rounds, MAX_ROUNDS),
        ];
        if let Some((flag, value, most)) = bounded.into_iter().find(|(_, value, most)| value > most) {
            return Err(LetheError::Invalid(format!("{flag} {value}: at most {most}")));
        }
        if let Some(tokens) = self.context.filter(|&t| t > MAX_CONTEXT_TOKENS) {
            return Err(LetheError::Invalid(format!("--context {tokens}: at most {MAX_CONTEXT_TOKENS} tokens (2^32)")));
        }
        if self.trace.is_some() && !self.profile {
            return Err(LetheError::Invalid("a trace records the profiled steps: --trace needs --profile".into()));
        }
        if self.trace.is_some() && self.rounds > 1 {
            return Err(LetheError::Invalid(
                "--trace records one run of profiled steps per config: not with --rounds".into(),
            ));
        }
        if self.trace.is_some() && self.steps > MAX_TRACE_STEPS {
            return Err(LetheError::Invalid(format!(
                "--trace records every operation of the {} profiled steps in memory (about 30 MB a step at enwik8-tiny): at most {MAX_TRACE_STEPS} (--bench-steps)",
                self.steps
            )));
        }
        Ok(())
    }
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            steps: 20,
            rounds: 1,
            warmup: 3,
            context: None,
            profile: false,
            trace: None,
            train_data: false,
            frozen: false,
        }
    }
}

/// Timings of one config.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    /// Config name.
    pub name: String,
    /// Memory mechanism.
    pub mechanism: String,
    /// The scaled knob (`span`, `context`, `block`, `batch`), when the bench sweeps one.
    pub knob: Option<String>,
    /// The knob's value for this config.
    pub value: Option<usize>,
    /// Maximum span `L` (the window of the two-memory mechanisms), tokens.
    pub span: usize,
    /// Scalar parameters.
    pub parameters: usize,
    /// Tokens per step (`batch * block`).
    pub tokens_per_step: usize,
    /// Timed steps, over every round.
    pub steps: usize,
    /// Median seconds per step.
    pub median_s: f64,
    /// 10th percentile seconds per step.
    pub p10_s: f64,
    /// 90th percentile seconds per step.
    pub p90_s: f64,
    /// The median step of each round ([`BenchOptions::rounds`]), seconds.
    pub round_medians_s: Vec<f64>,
    /// With several rounds: the median over the rounds of this config's median step
    /// over the first config's in the same round (so the machine's slower and faster
    /// spells, which the configs share round by round, cancel).
    pub relative: Option<f64>,
    /// Training loss (nats per token) of the last timed step. The steps are real
    /// training steps (on random tokens unless `batches` says otherwise), seeded as
    /// training is, so the same config, seed and thread count give the same figure,
    /// whatever else the process benched.
    pub last_loss: f64,
    /// What the steps read: `random tokens` or `training data` ([`BenchOptions::train_data`]).
    pub batches: String,
    /// Whether the steps left the parameters as they were ([`BenchOptions::frozen`]).
    pub frozen: bool,
    /// The trained parameters timed (`--init-from`), when not fresh ones.
    pub init: Option<Init>,
    /// Tokens per second at the median.
    pub tokens_per_s: f64,
    /// Peak resident memory of the process while this config ran, MiB.
    pub peak_rss_mib: Option<f64>,
    /// On a GPU: the most GPU memory libtorch's caching allocator handed out while this
    /// config ran, MiB (PyTorch's `max_memory_allocated`, reset per config; the GPU's
    /// own figure, as `nvidia-smi` shows it, adds the allocator's cache and the CUDA
    /// context).
    pub peak_gpu_mib: Option<f64>,
    /// Mean memory size `|C_t|` per layer (the earlier positions a query sees), averaged
    /// over the timed steps: a learned span (Expire-Span, Adaptive-Span) goes on training
    /// while it is benched, so its memory moves from step to step.
    pub mem_size: Vec<f64>,
    /// The memory size `|C_t|` of each timed step, averaged over the layers, in the
    /// order the steps ran (over every round).
    pub mem_by_step: Vec<f64>,
    /// States held per stream and layer at the last step.
    pub held: Vec<usize>,
    /// Floating-point operations of one training step (see [`step_flops`]), averaged
    /// over the timed steps (each counted from the states it held).
    pub flops_per_step: f64,
    /// Achieved rate at the median, GFLOP/s.
    pub gflops: f64,
    /// Model FLOPs utilisation: the achieved rate over the measured GEMM rate.
    pub mfu: Option<f64>,
    /// libtorch CPU threads (per rank).
    pub threads: i32,
    /// Data-parallel ranks (torchrun), 1 for a single process.
    pub ranks: usize,
    /// Median seconds per step in the ranks' collectives (the gradient all-reduce).
    pub comm_s: f64,
    /// Forward-only blocks run first so that the memory is at its steady size.
    pub fill_blocks: usize,
    /// Tokens per stream seen before the timed steps (`fill_blocks * block`).
    pub context_tokens: usize,
    /// Time per phase over `profile_steps` more steps, with `--profile`.
    pub profile: Option<Vec<crate::profile::PhaseTime>>,
    /// How many steps `profile` is over (0 without it).
    pub profile_steps: usize,
}

impl BenchResult {
    /// What the steps read and started from, when not the defaults (random tokens, fresh
    /// parameters, training on): ` | training data, parameters frozen | from RUN`.
    pub fn reads(&self) -> String {
        let mut said = match (self.batches.as_str(), self.frozen) {
            (RANDOM_TOKENS, false) => String::new(),
            (batches, false) => format!(" | {batches}"),
            (batches, true) => format!(" | {batches}, parameters frozen"),
        };
        if let Some(init) = &self.init {
            said += &format!(" | {}", init.describe());
        }
        said
    }

    /// The step-time percentiles.
    pub fn timing(&self) -> Timing {
        Timing { median_s: self.median_s, p10_s: self.p10_s, p90_s: self.p90_s }
    }

    /// The memory size `|C_t|` averaged over the layers.
    pub fn mean_mem_size(&self) -> f64 {
        mean(&self.mem_size)
    }
}

/// Most forward-only blocks run to fill the memory before timing.
const MAX_FILL_BLOCKS: usize = 4096;

/// Runs `opts.warmup` untimed then `opts.steps` timed training steps of `cfg`, after
/// streaming `opts.context` tokens per stream (default: enough to fill the memory).
/// `mfu` is left empty: [`with_mfu`] fills it from a measured GEMM rate. Under torchrun
/// (`group`) every rank runs its share of the micro-batches and the figures are the
/// whole group's, with the time spent in the gradient all-reduce.
///
/// On a single process a signal ([`crate::run::stop_requested`]) stops it at the next
/// step with [`LetheError::Stopped`], whatever the counts of steps asked.
pub fn bench(cfg: &Config, opts: &BenchOptions, group: Option<&ProcessGroup>) -> Result<BenchResult> {
    let mut timed = Timed::prepare(cfg, opts, group)?;
    timed.round(opts.steps, group.is_none())?;
    timed.finish(opts)
}

/// [`LetheError::Stopped`] when a signal came and the loop may stop alone (a single
/// process: the ranks of a launch stop together, between configs).
fn stop_check(group: Option<&ProcessGroup>) -> Result<()> {
    match crate::run::stop_requested().filter(|_| group.is_none()) {
        Some(signal) => Err(LetheError::Stopped { signal }),
        None => Ok(()),
    }
}

/// A config being timed: its model, optimiser and memories (the memory filled and the
/// warm-up done by [`Timed::prepare`]), and the step times so far, round by round.
struct Timed<'a> {
    run: Stepper<'a>,
    batches: Batches,
    /// Where the parameters came from (`--init-from`).
    init: Option<Init>,
    fill_blocks: usize,
    /// Seconds of each timed step, and in the all-reduce, over every round.
    times: Vec<f64>,
    comm: Vec<f64>,
    /// The median step of each round.
    round_medians: Vec<f64>,
    /// The loss of the last step timed.
    last_loss: f64,
    /// After each timed step: the memory size per layer, and the step's FLOPs.
    memory: Vec<Vec<f64>>,
    flops: Vec<f64>,
    /// States held per stream and layer now, before the next step: what it attends over.
    held: Vec<usize>,
    /// The states per stream and layer the next step's products run over ([`counted`]).
    counted: Vec<usize>,
    /// The phase times of the profiled steps so far, and how many steps they are over.
    profiled: Vec<crate::profile::PhaseTime>,
    profiled_steps: usize,
}

impl<'a> Timed<'a> {
    /// Builds `cfg`'s model, fills its memory and runs the untimed warm-up steps. Starts
    /// a new peak of the resident memory first.
    fn prepare(cfg: &'a Config, opts: &BenchOptions, group: Option<&'a ProcessGroup>) -> Result<Self> {
        cfg.validate()?;
        opts.validate()?;
        let device = crate::device::for_training(&cfg.train.device, cfg.train.threads, cfg.train.tf32)?;
        // The data first: a corpus that cannot be read is refused before a model is built.
        let mut batches = Batches::new(cfg, opts.train_data)?;
        reset_peak_rss();
        crate::device::reset_gpu_peak(device);
        let lm = Lm::new(cfg, device)?;
        // `--init-from`: the trained parameters; those the source lacks (another
        // mechanism's), or has in another shape (a position table over another span),
        // start fresh and are reported.
        let init = match &cfg.train.init_from {
            Some(from) => Some(Init {
                from: from.display().to_string(),
                fresh: crate::model::init::load_fitting(&lm, from)?.fresh,
            }),
            None => None,
        };
        let opt = Optimiser::new(lm.named_parameters(), &cfg.train);
        let mems = (0..cfg.train.accum).map(|_| lm.model.new_memory()).collect();
        let mut run = Stepper { lm, opt, mems, cfg, group, steps: 0, frozen: opts.frozen };
        let fill_blocks = fill_memory(&mut run, &mut batches, opts.context)?;
        for _ in 0..opts.warmup {
            stop_check(group)?;
            let batch = batches.next(cfg);
            run.step(&batch)?;
        }
        synchronize(device);
        let (held, counted) = held_by(&run);
        Ok(Timed {
            run,
            batches,
            init,
            fill_blocks,
            times: vec![],
            comm: vec![],
            round_medians: vec![],
            last_loss: f64::NAN,
            memory: vec![],
            flops: vec![],
            held,
            counted,
            profiled: vec![],
            profiled_steps: 0,
        })
    }

    /// Times `steps` more training steps, one round; with `stoppable`, a signal stops it
    /// at the next step ([`stop_check`]).
    fn round(&mut self, steps: usize, stoppable: bool) -> Result<()> {
        let device = self.run.lm.device();
        let mut times = Vec::with_capacity(steps.min(MAX_BENCH_STEPS));
        for _ in 0..steps {
            if stoppable {
                stop_check(self.run.group)?;
            }
            let batch = self.batches.next(self.run.cfg);
            let start = Instant::now();
            let s = self.run.step(&batch)?;
            synchronize(device);
            times.push(start.elapsed().as_secs_f64());
            self.comm.push(s.comm_s);
            self.last_loss = s.nll_sum / s.weight;
            self.record_memory();
        }
        self.round_medians.push(Timing::of(times.clone()).median_s);
        self.times.extend(times);
        Ok(())
    }

    /// After a timed step (its time taken already), which attended over the states held
    /// before it: the memory it saw per layer, and its FLOPs; then the states held now.
    fn record_memory(&mut self) {
        self.flops.push(step_flops(self.run.cfg, &self.counted, self.run.lm.device()));
        let reports = self.run.mems[0].reports();
        self.memory.push(reports.iter().map(|r| r.mem_size).collect());
        (self.held, self.counted) = held_by(&self.run);
    }

    /// Runs `steps` more steps with every phase timed, recorded by libtorch's profiler
    /// into the Chrome trace `trace` when given, and adds them to the profile so far.
    fn profile(&mut self, steps: usize, trace: Option<&Path>) -> Result<()> {
        let phases = profile_steps(&mut self.run, steps, &mut self.batches, trace)?;
        crate::profile::merge(&mut self.profiled, phases);
        self.profiled_steps += steps;
        // The profiled steps trained too: the next round starts from what they left.
        (self.held, self.counted) = held_by(&self.run);
        Ok(())
    }

    /// The figures over every round timed, after the profiled steps of `opts.profile`.
    fn finish(mut self, opts: &BenchOptions) -> Result<BenchResult> {
        let (cfg, group) = (self.run.cfg, self.run.group);
        // Under torchrun rank 0 traces for the group (the ranks run the same operations).
        let trace = opts
            .trace
            .as_ref()
            .filter(|_| group.is_none_or(|g| g.rank() == 0))
            .map(|dir| dir.join(format!("trace-{}.json", cfg.name)));
        // In rounds, every round has profiled its steps already.
        if opts.profile && self.profiled_steps == 0 {
            self.profile(opts.steps, trace.as_deref())?;
        }
        let profile = opts.profile.then_some(self.profiled);
        let steps = self.times.len();
        let t = Timing::of(self.times);
        let comm_s = Timing::of(self.comm).median_s;
        let tokens = cfg.train.batch * cfg.train.block;
        let flops = mean(&self.flops);
        let mem_size = column_means(&self.memory);
        let mem_by_step = self.memory.iter().map(|m| mean(m)).collect();
        Ok(BenchResult {
            name: cfg.name.clone(),
            mechanism: cfg.memory.mechanism.name().to_string(),
            knob: None,
            value: None,
            span: cfg.memory.span,
            parameters: self.run.lm.parameter_count(),
            tokens_per_step: tokens,
            steps,
            median_s: t.median_s,
            p10_s: t.p10_s,
            p90_s: t.p90_s,
            round_medians_s: self.round_medians,
            relative: None,
            last_loss: self.last_loss,
            batches: self.batches.describe().to_string(),
            frozen: self.run.frozen,
            init: self.init,
            tokens_per_s: tokens as f64 / t.median_s,
            peak_rss_mib: peak_rss_bytes().map(|b| b as f64 / (1024.0 * 1024.0)),
            peak_gpu_mib: crate::device::gpu_memory(self.run.lm.device()).map(|m| m.peak as f64 / (1024.0 * 1024.0)),
            mem_size,
            mem_by_step,
            held: self.held,
            flops_per_step: flops,
            gflops: flops / t.median_s / 1e9,
            mfu: None,
            threads: tch::get_num_threads(),
            ranks: group.map_or(1, ProcessGroup::world_size),
            comm_s,
            fill_blocks: self.fill_blocks,
            context_tokens: self.fill_blocks * cfg.train.block,
            profile,
            profile_steps: self.profiled_steps,
        })
    }
}

/// What the bench's training steps run on: the model, its optimiser, the memories of
/// its micro-batches, the config, and the process group under torchrun.
struct Stepper<'a> {
    lm: Lm,
    opt: Optimiser,
    mems: Vec<crate::model::Memory>,
    cfg: &'a Config,
    group: Option<&'a ProcessGroup>,
    /// Optimisation steps taken.
    steps: usize,
    /// Steps at a learning rate of 0 ([`BenchOptions::frozen`]).
    frozen: bool,
}

impl Stepper<'_> {
    /// One optimisation step on `batch` at the config's learning rate (0 when frozen),
    /// its draws from libtorch's generator (dropout, span noise) seeded as training
    /// seeds them, so that the step does not depend on what ran before it in the process.
    fn step(&mut self, batch: &Batch) -> Result<crate::train::StepStats> {
        let (_, _seed) = begin_step(self.cfg, self.steps);
        self.steps += 1;
        let lr = if self.frozen { 0.0 } else { self.cfg.train.lr };
        optimisation_step(
            &self.lm,
            &mut self.opt,
            &mut self.mems,
            batch,
            &self.cfg.train,
            Scales { lr, aux: 1.0 },
            self.group,
        )
    }
}

/// Where a config's parameters came from (`--init-from`).
#[derive(Clone, Debug, Serialize)]
pub struct Init {
    /// The run folder, checkpoint or Hugging Face folder.
    pub from: String,
    /// The config's parameters that it did not give: absent there (another
    /// mechanism's) or there in another shape (a position table over another span).
    pub fresh: Vec<String>,
}

impl Init {
    /// `from PATH`, and what starts fresh.
    pub fn describe(&self) -> String {
        match self.fresh.len() {
            0 => format!("from {}", self.from),
            n => format!("from {} ({n} fresh: {})", self.from, crate::train::abbreviate(&self.fresh)),
        }
    }
}

/// [`BenchResult::batches`] of steps on random tokens.
const RANDOM_TOKENS: &str = "random tokens";

/// Where the bench's batches come from ([`BenchOptions::train_data`]).
enum Batches {
    /// Random tokens, drawn from the config's seed.
    Random(Rng),
    /// The config's training streams, from their start.
    Data(crate::data::TrainStreams),
}

impl Batches {
    /// Random tokens, or with `train_data` the config's training streams (an error
    /// naming the data when they cannot be read).
    fn new(cfg: &Config, train_data: bool) -> Result<Self> {
        Ok(match train_data {
            true => Batches::Data(crate::task::train_streams(cfg, cfg.train.batch)?),
            false => Batches::Random(Rng::new(cfg.seed)),
        })
    }

    /// The next block of every stream of the config's batch.
    fn next(&mut self, cfg: &Config) -> Batch {
        match self {
            Batches::Random(rng) => random_batch(rng, cfg.train.batch, cfg.train.block, cfg.model.vocab, false),
            Batches::Data(streams) => streams.next_batch(),
        }
    }

    /// The inputs of one block for each of `run`'s micro-batches, and whether the
    /// memories start afresh before it: the training data's block of every stream cut
    /// as a step cuts it, or random tokens drawn micro-batch by micro-batch.
    fn fill_block(&mut self, run: &Stepper) -> (Vec<Tensor>, bool) {
        let (cfg, device) = (run.cfg, run.lm.device());
        let parts =
            (0..run.mems.len()).map(|m| crate::train::micro_batch(cfg.train.batch, run.mems.len(), run.group, m));
        match self {
            Batches::Data(streams) => {
                let batch = streams.next_batch();
                (parts.map(|(first, per)| batch.tensors(first, first + per, device).0).collect(), batch.reset)
            }
            Batches::Random(rng) => (
                parts
                    .map(|(_, per)| {
                        random_batch(rng, per, cfg.train.block, cfg.model.vocab, false).tensors(0, per, device).0
                    })
                    .collect(),
                false,
            ),
        }
    }

    /// What the batches are, for the report.
    fn describe(&self) -> &'static str {
        match self {
            Batches::Random(_) => RANDOM_TOKENS,
            Batches::Data(_) => "training data",
        }
    }
}

/// Runs `steps` more training steps with every phase timed ([`crate::profile`]), and
/// recorded by libtorch's profiler into the Chrome trace `trace` when given.
fn profile_steps(
    run: &mut Stepper,
    steps: usize,
    batches: &mut Batches,
    trace: Option<&Path>,
) -> Result<Vec<crate::profile::PhaseTime>> {
    let trace = match trace {
        Some(path) => {
            let dir = path.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir).map_err(|e| LetheError::io(dir, e))?;
            Some(crate::profile::Trace::start(path)?)
        }
        None => None,
    };
    crate::profile::start(run.lm.device());
    let ran = (0..steps).try_for_each(|_| {
        let batch = batches.next(run.cfg);
        let _step = crate::profile::phase("step");
        run.step(&batch).map(|_| ())
    });
    let phases = crate::profile::finish();
    ran?;
    trace.map(crate::profile::Trace::finish).transpose()?;
    Ok(phases)
}

/// The median and spread of some timings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Timing {
    /// Median seconds.
    pub median_s: f64,
    /// 10th percentile seconds.
    pub p10_s: f64,
    /// 90th percentile seconds.
    pub p90_s: f64,
}

impl Timing {
    /// The percentiles of `times` (seconds, at least one).
    pub fn of(mut times: Vec<f64>) -> Timing {
        times.sort_by(f64::total_cmp);
        let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        Timing { median_s: pick(0.5), p10_s: pick(0.1), p90_s: pick(0.9) }
    }
}

/// Times one layer's attention through `cfg`'s memory mechanism alone, forward and
/// backward, with the memory full (as after [`bench()`]'s fill): the block's input
/// `(batch, block, d)` is random, the queries come from the layer's projections, and
/// the loss is the sum of the context (plus the ∞-former's added term). Each timed
/// iteration also lets the memory absorb the block, as in training.
pub fn time_attention(cfg: &Config, steps: usize, warmup: usize) -> Result<Timing> {
    cfg.validate()?;
    let device = crate::device::for_training(&cfg.train.device, cfg.train.threads, cfg.train.tf32)?;
    let _seed = crate::rng::seed_torch(cfg.seed as i64);
    let vs = tch::nn::VarStore::new(device);
    let root = vs.root();
    let (d, heads) = (cfg.model.d_model as i64, cfg.model.heads as i64);
    let attn = crate::model::attention::Attention::new(&root / "attn", d, heads, 0.0, false);
    let mut memory = crate::model::memory::build(&cfg.memory, &root / "attn", d, heads, cfg.train.block)?;
    let rows = crate::model::memory::position_rows(&cfg.memory, cfg.train.block);
    let key_pe = root.randn("key_pe", &[rows, d / heads], 0.0, 1.0);
    let shape = [cfg.train.batch as i64, cfg.train.block as i64, d];
    let fill = memory_reach(cfg).div_ceil(cfg.train.block).min(MAX_FILL_BLOCKS);
    let mut times = vec![];
    for i in 0..fill + warmup + steps {
        let x = Tensor::randn(shape, (Kind::Float, device)).set_requires_grad(i >= fill);
        let start = Instant::now();
        let q = attn.queries(&x);
        let input = crate::model::memory::AttendInput {
            x: &x,
            q: &q,
            attn: &attn,
            key_pe: Some(&key_pe),
            train: i >= fill,
            episodes: None,
            norm: None,
        };
        let mut out = memory.attend(&input)?;
        memory.update(&x.detach(), None, std::mem::take(&mut out.carry))?;
        if i >= fill {
            let mut loss = out.context.sum(Kind::Float);
            if let Some(added) = &out.added {
                loss += added.sum(Kind::Float);
            }
            if let Some(aux) = &out.aux_loss {
                loss += aux;
            }
            loss.backward();
        }
        synchronize(device);
        if i >= fill + warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    if times.is_empty() {
        return Err(LetheError::Invalid("time_attention: at least one timed step is needed".into()));
    }
    Ok(Timing::of(times))
}

/// `r` with its MFU against a measured GEMM rate of `gemm_gflops`.
pub fn with_mfu(mut r: BenchResult, gemm_gflops: f64) -> BenchResult {
    // Each rank has its own cores (and GEMM rate): the group's peak is their sum.
    r.mfu = (gemm_gflops > 0.0).then(|| r.gflops / (gemm_gflops * r.ranks as f64));
    r
}

fn synchronize(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Runs forward-only blocks over `context` tokens per stream, or by default until the
/// memory can hold a full span (`L / M` blocks, at most [`MAX_FILL_BLOCKS`]), so that the
/// timed steps see the steady-state memory and not an empty cache. Returns the number
/// of blocks run.
fn fill_memory(run: &mut Stepper, batches: &mut Batches, context: Option<usize>) -> Result<usize> {
    let _guard = tch::no_grad_guard();
    let cfg = run.cfg;
    let blocks = match context {
        Some(tokens) => tokens.div_ceil(cfg.train.block),
        None => memory_reach(cfg).div_ceil(cfg.train.block).min(MAX_FILL_BLOCKS),
    };
    for i in 0..blocks {
        stop_check(run.group)?;
        if context.is_some() && blocks >= 1000 && (i + 1) % (blocks / 10) == 0 {
            eprintln!("streamed {} of {} context tokens", (i + 1) * cfg.train.block, blocks * cfg.train.block);
        }
        let (inputs, reset) = batches.fill_block(run);
        if reset {
            run.mems.iter_mut().for_each(crate::model::Memory::reset);
        }
        for (x, mem) in inputs.iter().zip(run.mems.iter_mut()) {
            run.lm.model.forward(x, mem, false)?;
        }
    }
    Ok(blocks)
}

/// States held per stream and layer by `run`'s memory now, and those its next step's
/// products run over ([`counted`]).
fn held_by(run: &Stepper) -> (Vec<usize>, Vec<usize>) {
    let reports = run.mems[0].reports();
    (reports.iter().map(|r| r.held).collect(), counted(run.cfg, &reports, run.lm.device()))
}

/// The states per stream and layer whose keys a step's products compute, for
/// [`step_flops`]: those held, but Expire-Span's ragged path (the CPU's fused kernel
/// without attention dropout) projects and scores each stream's own kept memories
/// only, skipping the padding up to the longest stream: their mean per stream.
fn counted(cfg: &Config, reports: &[crate::model::memory::MemoryReport], device: Device) -> Vec<usize> {
    let ragged = describe(cfg.memory.mechanism).ragged_keys(cfg, device);
    reports
        .iter()
        .map(|r| match r.extra("kept").filter(|_| ragged) {
            Some(kept) => kept.round() as usize,
            None => r.held,
        })
        .collect()
}

/// The mean of each column of `rows` (rows of equal length), over the rows.
fn column_means(rows: &[Vec<f64>]) -> Vec<f64> {
    let columns = rows.first().map_or(0, Vec::len);
    (0..columns).map(|c| mean(&rows.iter().filter_map(|r| r.get(c).copied()).collect::<Vec<_>>())).collect()
}

/// Tokens the memory must have seen to be full: the span, plus what the compressed
/// slots cover for the Compressive Transformer, and a little past the short-term memory
/// for the ∞-former.
fn memory_reach(cfg: &Config) -> usize {
    describe(cfg.memory.mechanism).reach(cfg)
}

fn random_batch(rng: &mut Rng, batch: usize, block: usize, vocab: usize, reset: bool) -> Batch {
    let n = batch * block;
    let tokens: Vec<i64> = (0..n + batch).map(|_| rng.range(0, vocab - 1) as i64).collect();
    Batch {
        batch,
        len: block,
        inputs: tokens[..n].to_vec(),
        targets: tokens[batch..].to_vec(),
        weights: vec![1.0; n],
        reset,
    }
}

/// The chunks in which a block's queries score their keys when `held` states are held
/// on `device` (see [`step_flops`]): one chunk of every key on a GPU; on the CPU the
/// window mechanisms' chunks and Expire-Span's causal ones.
fn scored_chunks(cfg: &Config, held: i64, device: Device) -> Vec<Chunk> {
    if device.is_cuda() {
        let m = cfg.train.block as i64;
        return vec![Chunk { q0: 0, queries: m, k0: 0, keys: held + m }];
    }
    describe(cfg.memory.mechanism).scored_chunks(cfg, held)
}

/// Floating-point operations of one training step of `cfg` when layer `i` holds
/// `held[i]` states per stream on `device`: the matrix products of the forward pass, times 3 for
/// forward and backward (the usual count: the backward pass costs two forward passes).
///
/// Per stream and block of `m` tokens, a layer with width `d`, feed-forward width `f`
/// and `n = held + m` keys computes (a multiply-add is 2 FLOPs):
/// - the query and output projections, `2 * 2 m d²`, and the feed-forward, `2 * 2 m d f`;
/// - keys and values of every state held and of the block, `2 * 2 n d²` (Transformer-XL
///   recomputes them from the cached states every block);
/// - scores and the weighted sum, `2 * 2 m n d`, and the relative-position scores over
///   the `min(P, n)` position rows a block can reach, `2 m P d`; where the queries attend
///   in chunks (the window mechanisms on the CPU, `model::memory::window`), each chunk
///   of `c` queries over its `k` keys instead: `2 * 2 c k d` and `2 c min(P, k) d`
///   (Adaptive-Span's reach counted as its whole cache, an upper bound; Expire-Span's
///   fused path in causal chunks, each over the keys up to its last query, with all
///   `P` position rows);
/// - for the ∞-former, its long-term memory's keys, values and output projection,
///   `3 * 2 N d²`, and scores and context over the `N` basis functions, `2 * 2 m N d`.
///
/// Plus the output head, `2 m d V`. Elementwise work (softmax, masks, norms, the
/// optimiser) and the mechanisms' small extras (span predictors, the compression
/// network, the LTM's refit) are not counted.
pub fn step_flops(cfg: &Config, held: &[usize], device: Device) -> f64 {
    let (d, f, v) = (cfg.model.d_model as f64, cfg.model.d_ffn as f64, cfg.model.vocab as f64);
    let m = cfg.train.block as f64;
    let p = crate::model::memory::position_rows(&cfg.memory, cfg.train.block) as f64;
    let mechanism = describe(cfg.memory.mechanism);
    let per_layer = |held: usize| {
        let n = held as f64 + m;
        let mut flops = 4.0 * m * d * d + 4.0 * m * d * f + 4.0 * n * d * d;
        for c in scored_chunks(cfg, held as i64, device) {
            let (queries, keys) = (c.queries as f64, c.keys as f64);
            // No pair is further apart than keys - 1, and only those rows are used (but
            // Expire-Span scores every row, at most a block's, and gathers from them).
            let rows = if mechanism.scores_every_position_row() { p } else { p.min(keys) };
            flops += 4.0 * queries * keys * d + 2.0 * queries * rows * d;
        }
        flops + mechanism.memory_flops(cfg, m, d)
    };
    let layers: f64 = (0..cfg.model.layers).map(|i| per_layer(held.get(i).copied().unwrap_or(0))).sum();
    let forward = cfg.train.batch as f64 * (layers + 2.0 * m * d * v);
    3.0 * forward
}

/// The matrix-multiply rate of `device` through libtorch, GFLOP/s: the best of a few
/// products of two `n x n` float32 matrices (`n` = 2048 on CPU, 8192 on a GPU), with
/// the current thread count. This is the peak that [`BenchResult::mfu`] is measured
/// against.
pub fn gemm_rate(device: Device) -> f64 {
    let _guard = tch::no_grad_guard();
    let n: i64 = if device.is_cuda() { 8192 } else { 2048 };
    let a = Tensor::randn([n, n], (Kind::Float, device));
    let b = Tensor::randn([n, n], (Kind::Float, device));
    let mut best = f64::INFINITY;
    for i in 0..6 {
        let start = Instant::now();
        let c = a.matmul(&b);
        synchronize(device);
        let t = start.elapsed().as_secs_f64();
        drop(c);
        if i > 0 {
            best = best.min(t);
        }
    }
    2.0 * (n as f64).powi(3) / best / 1e9
}

/// The GEMM rate ([`gemm_rate`]) on `cfg`'s device with its thread count; returns the
/// rate and the number of threads.
pub fn machine_rate(cfg: &Config) -> Result<(f64, i32)> {
    let device = crate::device::for_training(&cfg.train.device, cfg.train.threads, cfg.train.tf32)?;
    Ok((gemm_rate(device), tch::get_num_threads()))
}

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
/// or `base` alone when none are given; each at every value of `scale`.
pub fn plan(base: &Config, mechanisms: &[String], scale: Option<&Scale>, context: Option<usize>) -> Result<Vec<Case>> {
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
fn run_in_rounds(
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
            eprintln!("round {rounds_done} of {}: median ms per step {}", opts.rounds, medians.join(", "));
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
fn labelled(mut r: BenchResult, case: &Case) -> BenchResult {
    if let Some((knob, value)) = case.scaled {
        r.knob = Some(knob.name().to_string());
        r.value = Some(value);
    }
    r
}

/// The signal that asks the bench to stop, if one came (to any rank of a launch).
fn stop_signal(signals: &Signals, group: Option<&ProcessGroup>) -> Result<Option<String>> {
    let received = signals.received();
    let stop = match group {
        Some(g) => g.any(received.is_some())?,
        None => received.is_some(),
    };
    Ok(stop.then(|| received.unwrap_or_else(|| "a signal to another rank".to_string())))
}

/// The results as a terminal table, one row per config.
/// On a GPU the memory column is the allocator's peak ([`BenchResult::peak_gpu_mib`]).
pub fn table(results: &[BenchResult]) -> String {
    let mut s = String::new();
    let gpu = results.iter().any(|r| r.peak_gpu_mib.is_some());
    let peak = |r: &BenchResult| if gpu { r.peak_gpu_mib } else { r.peak_rss_mib };
    let _ = writeln!(
        s,
        "{:<12} {:>10} {:>9} {:>10} {:>16} {:>9} {:>9} {:>8} {:>6} {:>12} {:>9}",
        "mechanism",
        "knob",
        "span",
        "context",
        "ms/step (p10-90)",
        "tok/s",
        if gpu { "GPU MiB" } else { "peak MiB" },
        "GFLOP/s",
        "MFU",
        "mem/layer",
        "vs first"
    );
    for r in results {
        let knob = match (&r.knob, r.value) {
            (Some(k), Some(v)) => format!("{k}={v}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:<12} {:>10} {:>9} {:>10} {:>16} {:>9.0} {:>9} {:>8.1} {:>6} {:>12.1} {:>9}",
            r.mechanism,
            knob,
            r.span,
            r.context_tokens,
            format!("{:.1} ({:.1}-{:.1})", 1e3 * r.median_s, 1e3 * r.p10_s, 1e3 * r.p90_s),
            r.tokens_per_s,
            peak(r).map(|m| format!("{m:.0}")).unwrap_or_else(|| "n/a".into()),
            r.gflops,
            r.mfu.map(|m| format!("{:.1}%", 100.0 * m)).unwrap_or_else(|| "n/a".into()),
            r.mean_mem_size(),
            r.relative.map(|x| format!("{x:.3}x")).unwrap_or_else(|| "-".into())
        );
    }
    s
}

/// One row of `bench.csv`: a result with its per-layer figures averaged.
#[derive(Serialize)]
struct CsvRow<'a> {
    name: &'a str,
    mechanism: &'a str,
    knob: Option<&'a str>,
    value: Option<usize>,
    span: usize,
    parameters: usize,
    tokens_per_step: usize,
    steps: usize,
    median_s: f64,
    p10_s: f64,
    p90_s: f64,
    rounds: usize,
    relative: Option<f64>,
    last_loss: f64,
    tokens_per_s: f64,
    peak_rss_mib: Option<f64>,
    peak_gpu_mib: Option<f64>,
    mean_mem_size: f64,
    flops_per_step: f64,
    gflops: f64,
    mfu: Option<f64>,
    threads: i32,
    ranks: usize,
    comm_s: f64,
    context_tokens: usize,
}

/// The results as CSV, one row per config (an empty cell where a figure is unknown).
pub fn csv(results: &[BenchResult]) -> Result<String> {
    crate::metrics::csv_text(results.iter().map(|r| CsvRow {
        name: &r.name,
        mechanism: &r.mechanism,
        knob: r.knob.as_deref(),
        value: r.value,
        span: r.span,
        parameters: r.parameters,
        tokens_per_step: r.tokens_per_step,
        steps: r.steps,
        median_s: r.median_s,
        p10_s: r.p10_s,
        p90_s: r.p90_s,
        rounds: r.round_medians_s.len(),
        relative: r.relative,
        last_loss: r.last_loss,
        tokens_per_s: r.tokens_per_s,
        peak_rss_mib: r.peak_rss_mib,
        peak_gpu_mib: r.peak_gpu_mib,
        mean_mem_size: r.mean_mem_size(),
        flops_per_step: r.flops_per_step,
        gflops: r.gflops,
        mfu: r.mfu,
        threads: r.threads,
        ranks: r.ranks,
        comm_s: r.comm_s,
        context_tokens: r.context_tokens,
    }))
}

/// What `bench.json` holds: the machine's GEMM rate and every result.
#[derive(Serialize)]
struct Report<'a> {
    lethe: &'static str,
    /// Seconds since the Unix epoch when the report was written.
    written_at: u64,
    gemm_gflops: f64,
    threads: i32,
    results: &'a [BenchResult],
}

/// Writes `bench.json` and `bench.csv` into `dir` (atomically). Returns their paths.
pub fn write_report(dir: &Path, results: &[BenchResult], gemm_gflops: f64) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| LetheError::io(dir, e))?;
    let written_at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let report =
        Report { lethe: env!("CARGO_PKG_VERSION"), written_at, gemm_gflops, threads: tch::get_num_threads(), results };
    let json = serde_json::to_string_pretty(&report)?;
    let (j, c) = (dir.join("bench.json"), dir.join("bench.csv"));
    write_atomic(&j, json.as_bytes())?;
    write_atomic(&c, csv(results)?.as_bytes())?;
    Ok(vec![j, c])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_parses_knobs_and_rejects_nonsense() {
        assert_eq!(parse_scale("span=64,128").unwrap(), Scale { knob: Knob::Span, values: vec![64, 128] });
        assert_eq!(parse_scale("context = 8192").unwrap().knob, Knob::Context);
        assert!(parse_scale("width=3").unwrap_err().to_string().contains("unknown knob `width`"));
        assert!(parse_scale("span=0").unwrap_err().to_string().contains("`0`"));
        assert!(parse_scale("span").unwrap_err().to_string().contains("KNOB=V1"));
    }

    /// A 1-layer model by hand: d = 4, f = 8, V = 10, blocks of m = 2, batch 3, span 5
    /// (P = 6 position rows), 5 states held, so n = 7 keys.
    #[test]
    fn step_flops_match_a_hand_count() {
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.model.layers = 1;
        cfg.model.d_model = 4;
        cfg.model.heads = 1;
        cfg.model.d_ffn = 8;
        cfg.model.vocab = 10;
        cfg.train.block = 2;
        cfg.train.batch = 3;
        cfg.memory.span = 5;
        cfg.memory.mechanism = Mechanism::Fixed;
        // q, o: 2 * 2*2*16 = 128; ffn: 2 * 2*2*4*8 = 256; k, v: 2 * 2*7*16 = 448;
        // scores and mix: 2 * 2*2*7*4 = 224; positions: 2*2*6*4 = 96; head: 2*2*4*10 = 160
        let forward = 3.0 * (128.0 + 256.0 + 448.0 + 224.0 + 96.0 + 160.0);
        assert_eq!(step_flops(&cfg, &[5], Device::Cpu), 3.0 * forward);
        // More memory held costs more.
        assert!(step_flops(&cfg, &[50], Device::Cpu) > step_flops(&cfg, &[5], Device::Cpu));
        // An empty memory: n = 2 keys, so only 2 of the 6 position rows are used.
        let forward = 3.0 * (128.0 + 256.0 + 4.0 * 2.0 * 16.0 + 4.0 * 2.0 * 2.0 * 4.0 + 2.0 * 2.0 * 2.0 * 4.0 + 160.0);
        assert_eq!(step_flops(&cfg, &[0], Device::Cpu), 3.0 * forward);
        // Blocks of 128 over 64 states held, span 64: on the CPU the queries attend in two
        // chunks of 64, each over 128 keys (not 192), with 65 of the position rows.
        cfg.train.block = 128;
        cfg.memory.span = 64;
        let (q_o, ffn, k_v, head) =
            (4.0 * 128.0 * 16.0, 4.0 * 128.0 * 4.0 * 8.0, 4.0 * 192.0 * 16.0, 2.0 * 128.0 * 4.0 * 10.0);
        let chunks = 2.0 * (4.0 * 64.0 * 128.0 * 4.0 + 2.0 * 64.0 * 65.0 * 4.0);
        assert_eq!(step_flops(&cfg, &[64], Device::Cpu), 3.0 * 3.0 * (q_o + ffn + k_v + chunks + head));
        // On a GPU the whole block is one fused call: 128 queries over 192 keys, with 65
        // position rows (counted, not run: no GPU is needed).
        let whole = 4.0 * 128.0 * 192.0 * 4.0 + 2.0 * 128.0 * 65.0 * 4.0;
        assert_eq!(step_flops(&cfg, &[64], Device::Cuda(0)), 3.0 * 3.0 * (q_o + ffn + k_v + whole + head));
        // Expire-Span holding 20: causal chunks over 84 and 148 keys, each query scoring
        // all P = 65 position rows.
        cfg.memory.mechanism = Mechanism::Expire;
        let k_v = 4.0 * 148.0 * 16.0;
        let chunks = 4.0 * 64.0 * (84.0 + 148.0) * 4.0 + 2.0 * 2.0 * 64.0 * 65.0 * 4.0;
        assert_eq!(step_flops(&cfg, &[20], Device::Cpu), 3.0 * 3.0 * (q_o + ffn + k_v + chunks + head));
    }

    #[test]
    fn plan_crosses_mechanisms_with_the_scaled_knob() {
        let base = Config::preset("copy-tiny").unwrap();
        let scale = parse_scale("span=32,64").unwrap();
        let cases = plan(&base, &["fixed".into(), "expire:128".into()], Some(&scale), None).unwrap();
        assert_eq!(cases.len(), 4);
        assert_eq!(cases[0].cfg.memory.mechanism, Mechanism::Fixed);
        assert_eq!((cases[1].cfg.memory.span, cases[1].scaled), (64, Some((Knob::Span, 64))));
        assert_eq!(cases[2].cfg.memory.mechanism, Mechanism::Expire);
        let ctx = plan(&base, &[], Some(&parse_scale("context=100").unwrap()), None).unwrap();
        assert_eq!((ctx.len(), ctx[0].context), (1, Some(100)));
        let err = plan(&base, &["fixed:16,32".into()], None, None).unwrap_err().to_string();
        assert!(err.contains("one size"), "{err}");
        let err = plan(&base, &["lstm".into()], None, None).unwrap_err().to_string();
        assert!(err.contains("unknown mechanism `lstm`"), "{err}");
    }

    #[test]
    fn percentiles_pick_the_nearest_rank_of_the_sorted_times() {
        // Sorted: 1..=10; ranks round(9 q): q 0.1 -> 1, 0.5 -> 4.5 -> 5, 0.9 -> 8.1 -> 8.
        let t = Timing::of(vec![5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 9.0, 8.0, 7.0, 6.0]);
        assert_eq!((t.p10_s, t.median_s, t.p90_s), (2.0, 6.0, 9.0));
        let one = Timing::of(vec![3.0]);
        assert_eq!((one.p10_s, one.median_s, one.p90_s), (3.0, 3.0, 3.0));
    }

    #[test]
    fn attention_of_every_mechanism_can_be_timed() {
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.train.batch = 2;
        for m in ["fixed", "adaptive", "expire", "compressive", "infinity"] {
            cfg.memory.mechanism = Mechanism::parse(m).unwrap();
            let t = time_attention(&cfg, 2, 1).unwrap();
            assert!(t.median_s.is_finite() && t.median_s > 0.0, "{m}: {t:?}");
        }
        assert!(time_attention(&cfg, 0, 0).is_err());
    }

    #[test]
    fn the_gemm_rate_is_positive_and_mfu_is_its_share() {
        let rate = gemm_rate(Device::Cpu);
        assert!(rate.is_finite() && rate > 0.0);
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.model.layers = 1;
        cfg.train.batch = 2;
        let r = bench(
            &cfg,
            &BenchOptions {
                steps: 2,
                rounds: 1,
                warmup: 0,
                context: None,
                profile: false,
                trace: None,
                ..Default::default()
            },
            None,
        )
        .unwrap();
        let r = with_mfu(r, rate);
        let mfu = r.mfu.unwrap();
        assert!((mfu - r.gflops / rate).abs() < 1e-12 && mfu > 0.0);
        assert_eq!(r.flops_per_step, step_flops(&cfg, &r.held, Device::Cpu));
        assert!(r.profile.is_none(), "no profile unless asked");
    }

    /// The FLOPs of Expire-Span's ragged path count each stream's kept memories (the
    /// report's "kept", rounded), not the padded width held; every other path, and
    /// Expire-Span with attention dropout or on a GPU, the states held.
    #[test]
    fn flops_count_the_kept_memories_of_the_ragged_path_only() {
        let report = crate::model::memory::MemoryReport {
            extra: vec![("kept".into(), 6.4)],
            ..crate::model::memory::MemoryReport::with_rows(vec![], 10)
        };
        let reports = [report.clone(), crate::model::memory::MemoryReport::with_rows(vec![], 7)];
        let mut cfg = Config::preset("enwik8-expire-tiny").unwrap();
        cfg.model.dropout = 0.0;
        assert_eq!(counted(&cfg, &reports, Device::Cpu), vec![6, 7]);
        assert_eq!(counted(&cfg, &reports, Device::Cuda(0)), vec![10, 7]);
        cfg.model.dropout = 0.1;
        assert_eq!(counted(&cfg, &reports, Device::Cpu), vec![10, 7]);
        cfg.model.dropout = 0.0;
        cfg.memory.mechanism = Mechanism::Fixed;
        assert_eq!(counted(&cfg, &reports, Device::Cpu), vec![10, 7]);
    }

    /// The memory figure is the mean over the timed steps, not the last step's: a
    /// Transformer-XL window of 8 over blocks of 4, timed from an empty memory, sees
    /// 0..3, then 4..7, then 8 earlier positions a query (1.5, 5.5, 8 and 8 on average).
    #[test]
    fn the_memory_figure_is_the_mean_over_the_timed_steps() {
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.memory.mechanism = Mechanism::Fixed;
        cfg.memory.span = 8;
        cfg.model.layers = 2;
        cfg.train.batch = 2;
        cfg.train.block = 4;
        let opts = BenchOptions {
            steps: 4,
            rounds: 1,
            warmup: 0,
            context: Some(0),
            profile: false,
            trace: None,
            ..Default::default()
        };
        let r = bench(&cfg, &opts, None).unwrap();
        assert_eq!(r.mem_by_step, vec![1.5, 5.5, 8.0, 8.0]);
        assert_eq!(r.mem_size, vec![5.75, 5.75]);
        assert_eq!(r.held, vec![8, 8], "the states held at the last step");
        // The FLOPs follow the states held step by step: 0, 4, 8 and 8 before each block.
        let by_held = [0, 4, 8, 8].map(|h| step_flops(&cfg, &[h, h], Device::Cpu));
        assert_eq!(r.flops_per_step, by_held.iter().sum::<f64>() / 4.0);
        assert!(by_held[0] < by_held[3]);
    }

    /// The parameters of a timed config before and after `steps` timed steps of `opts`.
    fn parameters_around_steps(cfg: &Config, opts: &BenchOptions) -> (Vec<Tensor>, Vec<Tensor>, BenchResult) {
        let mut timed = Timed::prepare(cfg, opts, None).unwrap();
        let params = |t: &Timed| t.run.lm.named_parameters().into_iter().map(|(_, p)| p.copy()).collect::<Vec<_>>();
        let before = params(&timed);
        timed.round(opts.steps, false).unwrap();
        let after = params(&timed);
        (before, after, timed.finish(opts).unwrap())
    }

    /// Frozen steps compute a whole training step, the optimiser's included, and leave
    /// every parameter as it was, so a learned span keeps its size; the same steps
    /// unfrozen move the parameters.
    #[test]
    fn frozen_steps_leave_the_parameters_as_they_are() {
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.memory.mechanism = Mechanism::Expire;
        cfg.model.layers = 1;
        cfg.train.batch = 2;
        let opts = BenchOptions { steps: 3, warmup: 1, frozen: true, ..Default::default() };
        let (before, after, r) = parameters_around_steps(&cfg, &opts);
        assert!(before.iter().zip(&after).all(|(a, b)| a.equal(b)), "a frozen step moved a parameter");
        assert!(r.frozen && r.last_loss.is_finite() && r.steps == 3);
        let (before, after, r) = parameters_around_steps(&cfg, &BenchOptions { frozen: false, ..opts });
        assert!(before.iter().zip(&after).all(|(a, b)| !a.equal(b)), "an unfrozen step left a parameter where it was");
        assert!(!r.frozen);
    }

    /// `--init-from` benches the trained parameters, not fresh ones: a checkpoint's
    /// parameters, each changed from its initialisation, are the model's when timing
    /// starts (frozen, so they are still there after the steps).
    #[test]
    fn init_from_benches_the_trained_parameters() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.model.layers = 1;
        cfg.train.batch = 2;
        let lm = Lm::new(&cfg, Device::Cpu).unwrap();
        tch::no_grad(|| {
            lm.named_parameters().into_iter().for_each(|(_, mut p)| {
                let _ = p.g_add_scalar_(0.5);
            })
        });
        let path = dir.path().join("checkpoint.safetensors");
        let state = crate::checkpoint::TrainState::new(10, &(), 0).unwrap();
        crate::checkpoint::save(&path, &cfg, &state, &lm.named_parameters()).unwrap();
        let trained: Vec<Tensor> = lm.named_parameters().into_iter().map(|(_, p)| p.copy()).collect();
        cfg.train.init_from = Some(path);
        let opts = BenchOptions { steps: 1, warmup: 0, frozen: true, ..Default::default() };
        let (before, after, r) = parameters_around_steps(&cfg, &opts);
        assert!(
            trained.iter().zip(&before).all(|(a, b)| a.equal(b)),
            "the bench did not start from the checkpoint's parameters"
        );
        assert!(before.iter().zip(&after).all(|(a, b)| a.equal(b)));
        assert!(r.init.as_ref().is_some_and(|i| i.fresh.is_empty()), "{:?}", r.init);
        // Another mechanism beside it: Expire-Span's position table covers one block (33
        // rows against the window's 129) and its span predictor is its own; those start
        // fresh, said by name, and the rest is the checkpoint's.
        cfg.memory.mechanism = Mechanism::Expire;
        let mut timed = Timed::prepare(&cfg, &opts, None).unwrap();
        let by_name: std::collections::HashMap<String, Tensor> = lm.named_parameters().into_iter().collect();
        let fresh = timed.init.clone().unwrap().fresh;
        assert_eq!(fresh, ["key_pe", "layers.0.attn.expire.b", "layers.0.attn.expire.w"]);
        for (name, p) in timed.run.lm.named_parameters() {
            assert_eq!(by_name.get(&name).is_some_and(|t| t.equal(&p)), !fresh.contains(&name), "{name}");
        }
        timed.round(1, false).unwrap();
    }

    /// With the training data, each micro-batch's memory is filled with its own streams
    /// of each block, cut as a training step cuts the batch: the same states as running
    /// the model over those slices by hand.
    #[test]
    fn the_data_fills_each_micro_batch_s_memory_with_its_own_streams() {
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.model.layers = 1;
        cfg.train.batch = 4;
        cfg.train.accum = 2;
        cfg.memory.span = 64; // two blocks of 32 fill it
        let opts = BenchOptions { steps: 1, warmup: 0, train_data: true, ..Default::default() };
        let timed = Timed::prepare(&cfg, &opts, None).unwrap();
        assert_eq!(timed.fill_blocks, 2);
        let lm = &timed.run.lm;
        let mut streams = crate::task::train_streams(&cfg, cfg.train.batch).unwrap();
        let mut by_hand: Vec<_> = (0..2).map(|_| lm.model.new_memory()).collect();
        let _guard = tch::no_grad_guard();
        for _ in 0..2 {
            let batch = streams.next_batch();
            for (i, mem) in by_hand.iter_mut().enumerate() {
                let (x, _, _) = batch.tensors(2 * i, 2 * i + 2, Device::Cpu);
                lm.model.forward(&x, mem, false).unwrap();
            }
        }
        for (filled, hand) in timed.run.mems.iter().zip(&by_hand) {
            let (a, b) = (filled.state(), hand.state());
            assert!(!a.is_empty() && a.len() == b.len());
            for ((name, x), (_, y)) in a.iter().zip(&b) {
                assert!(x.equal(y), "{name}");
            }
        }
        // The two micro-batches read different streams.
        assert!(!timed.run.mems[0].state()[0].1.equal(&timed.run.mems[1].state()[0].1));
    }

    /// `--profile` times the phases of the step, down to the memory's own, and each
    /// phase's children take no longer than it does.
    #[test]
    fn a_profile_has_every_phase_of_the_step_nested_in_it() {
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.memory.mechanism = Mechanism::Expire;
        cfg.model.layers = 2;
        cfg.train.batch = 2;
        let r = bench(
            &cfg,
            &BenchOptions {
                steps: 2,
                rounds: 1,
                warmup: 0,
                context: None,
                profile: true,
                trace: None,
                ..Default::default()
            },
            None,
        )
        .unwrap();
        let phases = r.profile.unwrap();
        let find = |name: &str| phases.iter().find(|p| p.name() == name).unwrap_or_else(|| panic!("no phase {name}"));
        assert_eq!(find("step").calls, 2);
        assert_eq!(find("step > backward").calls, 2);
        assert_eq!(find("step > forward > layer").calls, 4, "two layers, two steps");
        let attend = find("step > forward > layer > memory attend");
        assert_eq!(find("step > forward > layer > memory attend > attention").calls, 4);
        assert_eq!(find("step > forward > layer > memory update > deletion").calls, 4);
        for p in &phases {
            let children: f64 = phases
                .iter()
                .filter(|c| c.path.len() == p.path.len() + 1 && c.path.starts_with(&p.path))
                .map(|c| c.seconds)
                .sum();
            assert!(children <= p.seconds, "{} takes {} s, its phases {children} s", p.name(), p.seconds);
        }
        assert!(attend.seconds > 0.0);
    }

    /// `--trace` writes libtorch's profile of the profiled steps: a Chrome trace that
    /// holds the forward operations, the autograd nodes of the backward pass, and
    /// Expire-Span's fused attention among them.
    #[test]
    fn a_trace_records_every_operation_of_the_profiled_steps() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::preset("copy-tiny").unwrap();
        cfg.memory.mechanism = Mechanism::Expire;
        cfg.train.batch = 2;
        let opts = BenchOptions {
            steps: 2,
            rounds: 1,
            warmup: 0,
            context: None,
            profile: true,
            trace: Some(dir.path().join("traces")),
            ..Default::default()
        };
        bench(&cfg, &opts, None).unwrap();
        let path = dir.path().join("traces").join(format!("trace-{}.json", cfg.name));
        let events: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
        let count = |part: &str| names.iter().filter(|n| n.contains(part)).count();
        assert!(count("aten::") > 100, "{} libtorch operations", count("aten::"));
        assert!(count("autograd::engine::evaluate_function") > 10, "the backward pass's nodes");
        assert_eq!(
            count("evaluate_function: torch::autograd::CppNode<(anonymous namespace)::ExpireAttend>"),
            2 * cfg.model.layers,
            "the fused attention's backward, once a layer and step"
        );
        assert!(events.iter().all(|e| e["dur"].as_f64().is_some_and(|d| d >= 0.0)));
        let left: Vec<_> =
            std::fs::read_dir(dir.path().join("traces")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from(format!("trace-{}.json", cfg.name))],
            "the finished trace alone, no .partial file"
        );
        // A trace without the profile is refused before anything runs.
        let refused = BenchOptions { profile: false, ..opts.clone() };
        assert!(refused.validate().unwrap_err().to_string().contains("--trace needs --profile"));
        // A trace longer than the profiler can hold in memory is refused too.
        let long = BenchOptions { steps: MAX_TRACE_STEPS + 1, ..opts.clone() };
        assert!(long
            .validate()
            .unwrap_err()
            .to_string()
            .contains(&format!("at most {MAX_TRACE_STEPS} (--bench-steps)")));
        assert!(BenchOptions { steps: MAX_TRACE_STEPS, ..opts }.validate().is_ok());
    }
}
