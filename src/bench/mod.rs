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
use crate::config::train::Precision;
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
    /// The training arithmetic (`train.precision`): `f32` or `bf16`.
    pub precision: String,
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
    let shape = crate::model::memory::LayerShape::new(d, heads, cfg.train.block);
    let mut memory = crate::model::memory::build(&cfg.memory, &root / "attn", shape)?;
    let rows = crate::model::memory::position_rows(&cfg.memory, cfg.train.block);
    let key_pe = root.randn("key_pe", &[rows, d / heads], 0.0, 1.0);
    let block = [cfg.train.batch as i64, cfg.train.block as i64, d];
    let fill = memory_reach(cfg).div_ceil(cfg.train.block).min(MAX_FILL_BLOCKS);
    let mut times = vec![];
    for i in 0..fill + warmup + steps {
        let x = Tensor::randn(block, (Kind::Float, device)).set_requires_grad(i >= fill);
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
            crate::say!("streamed {} of {} context tokens", (i + 1) * cfg.train.block, blocks * cfg.train.block);
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

pub mod decode;
mod flops;
mod plan;
mod report;
#[cfg(test)]
mod tests;
mod timing;

pub use flops::*;
pub use plan::*;
pub use report::*;
use timing::{Stepper, Timed};
