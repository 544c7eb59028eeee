//! The training loop: learning rate, micro-steps, clip, step, log, evaluate, checkpoint.
//!
//! Each step takes the next block of every stream. The batch is processed in `accum`
//! micro-batches of streams, each with its own memory; the task loss is the mean
//! negative log-likelihood over the scored tokens of the whole batch, plus the layers'
//! auxiliary losses. Dropout is re-seeded from `(seed, step)` at every step and the data
//! position is saved in checkpoints, so a resumed run repeats the same numbers on CPU.
//!
//! Under `torchrun` ([`lethe_core::dist`]) the run is data-parallel: every rank reads the
//! whole batch (the data position is the same everywhere) but runs only its share of
//! the micro-batches, rank `r` the `accum` micro-batches from `r * accum`, each with its
//! own memory. The gradients are summed over the ranks in flat buckets, so that every
//! rank clips and steps on the gradient a single process with `accum * world`
//! micro-batches would have; the parameters stay identical. Rank 0 alone prints, logs
//! and writes the run folder; a checkpoint holds every rank's memory.

use std::path::{Path, PathBuf};

use serde_json::json;
use tch::Kind;

use crate::eval::{evaluate_sharded, EvalResult};
use crate::run::span_target::SpanTarget;
pub use crate::run::TrainOptions;
use crate::run::{begin_step, broadcast_parameters, check_finite, drive, opening_line, Looped, RunFolder, Scales};
use lethe_core::checkpoint::{self, Checkpoint, TrainState};
use lethe_core::config::{Config, Precision, TrainConfig};
use lethe_core::device::Autocast;
use lethe_core::dist::ProcessGroup;
use lethe_core::error::{LetheError, Result};
use lethe_core::metrics::{format_count, format_duration, MetricsLog};
use lethe_core::optim::{learning_rate, Optimiser};
use lethe_core::profile;
use lethe_core::tensorboard::Histogram;
use lethe_data::{Batch, Split, SplitData, TrainStreams};
use lethe_model::{host_values, Lm, Memory};

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct TrainSummary {
    /// The run folder.
    pub run_dir: PathBuf,
    /// Task loss (nats per scored token) of each step run in this invocation.
    pub losses: Vec<f64>,
    /// The last validation result.
    pub last_eval: Option<EvalResult>,
    /// Unigram entropy (nats) of the scored validation tokens: the loss to beat.
    pub unigram_baseline: f64,
}

/// Everything the loop carries.
struct Run<'a> {
    cfg: &'a Config,
    opts: &'a TrainOptions,
    /// The run folder: locked and written by rank 0 alone (`None` on the other ranks).
    folder: Option<RunFolder>,
    dir: PathBuf,
    /// The data-parallel group, under torchrun with more than one rank.
    group: Option<ProcessGroup>,
    lm: Lm,
    opt: Optimiser,
    mems: Vec<Memory>,
    data: TrainStreams,
    valid: SplitData,
    metrics: Option<MetricsLog>,
    step: usize,
    tokens_seen: u64,
    last_checkpoint: Option<usize>,
    /// `memory.expire.target`'s controller of the span loss's weight.
    span_target: Option<SpanTarget>,
}

/// Sums over the steps since the last progress line.
#[derive(Default)]
struct Window {
    nll: f64,
    weight: f64,
    aux: f64,
    steps: usize,
    tokens: usize,
    grad_norm: f64,
}

/// The first few of `names`, and how many more.
pub fn abbreviate(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
    match names.len() {
        n if n > 3 => format!("{}, and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}

/// Trains the model `cfg` describes. See the module documentation.
pub fn train(cfg: &Config, opts: &TrainOptions) -> Result<TrainSummary> {
    cfg.validate()?;
    let mut run = Run::start(cfg, opts)?;
    let unigram_baseline = lethe_data::unigram_entropy(&run.valid.docs);
    run.say(&format!(
        "valid unigram baseline: {unigram_baseline:.4} nats ({:.4} bits) per scored token",
        unigram_baseline / std::f64::consts::LN_2
    ));
    let mut summary = TrainSummary { run_dir: run.dir.clone(), losses: vec![], last_eval: None, unigram_baseline };
    (summary.losses, summary.last_eval) = drive(&mut run, &cfg.train, opts)?;
    Ok(summary)
}

impl<'a> Run<'a> {
    /// Checks the run folder and the checkpoint to resume, builds the data and the
    /// model, and only then writes to the folder (see [`crate::run`]).
    fn start(cfg: &'a Config, opts: &'a TrainOptions) -> Result<Self> {
        let device = lethe_core::device::for_training(&cfg.train.device, cfg.train.threads, cfg.train.tf32)?;
        let (device, group) = lethe_core::dist::join_for_training(cfg, device)?;
        lethe_model::check_fits(cfg, device)?; // before the streams, which grow with the batch
        let dir = opts.out_dir.join(&cfg.name);
        let (folder, resumed) = crate::run::folder::open_for_ranks(cfg, opts.intent(), &dir, group.as_ref())?;
        let data = lethe_data::task::train_streams(cfg, cfg.train.batch)?;
        let valid = lethe_data::task::load_split(cfg, Split::Valid, cfg.train.batch)?;
        let (lm, init) = match (&cfg.train.init_from, &resumed) {
            (Some(from), None) => lethe_model::init::build(cfg, device, from).map(|(lm, init)| (lm, Some(init)))?,
            (_, Some(_)) => (Lm::undrawn(cfg, device)?, None), // every parameter is the checkpoint's
            (None, None) => (Lm::new(cfg, device)?, None),
        };
        let mut opt = Optimiser::new(lethe_model::trainable(lm.named_parameters(), cfg.train.freeze_base), &cfg.train);
        let in_memory_group = opt.group(lethe_model::memory::is_mechanism_parameter, cfg.train.memory_lr_scale());
        let mems = (0..cfg.train.accum).map(|_| lm.model.new_memory()).collect();
        let from = resumed.as_ref().and_then(|ck| ck.state.as_ref()).map_or(0, |s| s.step);
        let mut run = Run {
            cfg,
            opts,
            folder,
            dir,
            group,
            lm,
            opt,
            mems,
            data,
            valid,
            metrics: None,
            step: 0,
            tokens_seen: 0,
            last_checkpoint: None,
            span_target: SpanTarget::of(cfg, None),
        };
        // Every check of the checkpoint (its tensors, its stream position) before the
        // folder changes: a refused resume leaves config.toml and metrics.jsonl as they were.
        if let Some(ck) = resumed {
            run.resume(&ck)?;
        }
        run.metrics = run.folder.as_mut().map(|f| f.commit(cfg, from)).transpose()?;
        broadcast_parameters(run.group.as_ref(), run.lm.named_parameters())?;
        run.say(&opening_line(cfg, "", run.lm.parameter_count(), device, &run.dir));
        if let Some(g) = run.group.as_mut() {
            let trainable = lethe_model::trainable(run.lm.named_parameters(), cfg.train.freeze_base);
            let trainable: Vec<tch::Tensor> = trainable.into_iter().map(|(_, t)| t).collect();
            let overlapped = cfg.train.dist_overlap && g.overlap_gradients(&trainable)?;
            let per = cfg.train.batch / g.world_size();
            let when = if overlapped { "during the backward pass" } else { "after the backward pass" };
            let line = format!(
                "data-parallel: {} ranks x {per} streams ({} micro-batches each), gradients summed over {} {when}",
                g.world_size(),
                cfg.train.accum,
                g.backend().name()
            );
            run.say(&line);
        }
        if let (Some(loaded), Some(from)) = (&init, &cfg.train.init_from) {
            let fresh = if loaded.fresh.is_empty() {
                String::new()
            } else {
                format!("; {} new ones start fresh ({})", loaded.fresh.len(), abbreviate(&loaded.fresh))
            };
            run.say(&format!("initialised from {}: {} parameters{fresh}", from.display(), loaded.copied));
            let pretrained = from.join("config.json").is_file();
            if pretrained && cfg.data.tokenizer.is_none() && cfg.data.source.reads_text() {
                run.say(&format!(
                    "note: {} holds no tokenizer, so the text is read as bytes (ids 0-255); give --set data.tokenizer=FOLDER if its model was trained on one",
                    from.display()
                ));
            }
        }
        if cfg.train.freeze_base {
            run.say(&format!(
                "frozen base: training the memory's {in_memory_group} parameters only ({} of {} weights)",
                run.opt.parameter_count(),
                run.lm.parameter_count()
            ));
        }
        if cfg.train.memory_lr > 0.0 {
            run.say(&format!(
                "learning rates: {:.2e} for the memory's {in_memory_group} parameters, {:.2e} for the others",
                cfg.train.memory_lr, cfg.train.lr
            ));
        }
        run.say(&format!("data: {}", lethe_data::task::describe(cfg)));
        if let Some(layout) = run.data.describe() {
            run.say(&format!("data: {layout}"));
        }
        Ok(run)
    }

    fn resume(&mut self, ck: &Checkpoint) -> Result<()> {
        let path = &ck.path;
        let state = ck.state.clone().ok_or_else(|| LetheError::checkpoint(path, "holds no training state"))?;
        ck.load_parameters(&self.lm.vs.variables())?;
        self.opt.load_state(state.step, |n| ck.tensor(n)).map_err(|e| LetheError::checkpoint(path, e.to_string()))?;
        let first = self.first_micro_batch();
        for (i, mem) in self.mems.iter_mut().enumerate() {
            let saved: Vec<_> = ck
                .with_prefix(&format!("memory.{}.", first + i))
                .into_iter()
                .map(|(n, t)| (n, t.to_device(self.lm.device())))
                .collect();
            mem.load_state(&saved).map_err(|e| LetheError::checkpoint(path, e.to_string()))?;
        }
        let data = state.data().ok_or_else(|| {
            LetheError::checkpoint(path, "holds no stream position: it is not from a language-model run")
        })?;
        self.data.restore(data).map_err(|e| LetheError::checkpoint(path, e.to_string()))?;
        self.step = state.step;
        self.tokens_seen = state.tokens_seen;
        self.last_checkpoint = Some(state.step);
        self.span_target = SpanTarget::of(self.cfg, state.span_target);
        self.say(&crate::run::folder::resumed_line(ck, self.cfg, state.step)?);
        Ok(())
    }
}

impl Looped for Run<'_> {
    type Window = Window;
    type Eval = EvalResult;

    fn step(&self) -> usize {
        self.step
    }

    fn quiet(&self) -> bool {
        self.opts.quiet || self.folder.is_none()
    }

    fn group(&self) -> Option<&ProcessGroup> {
        self.group.as_ref()
    }

    /// One optimiser step; returns the task loss (nats per scored token).
    fn train_step(&mut self, window: &mut Window) -> Result<f64> {
        let (mut scales, _seed) = begin_step(self.cfg, self.step);
        scales.aux *= self.span_target.as_ref().map_or(1.0, SpanTarget::factor);
        let batch = self.data.next_batch();
        let s = optimisation_step(
            &self.lm,
            &mut self.opt,
            &mut self.mems,
            &batch,
            &self.cfg.train,
            scales,
            self.group.as_ref(),
        )?;
        let loss = s.nll_sum / s.weight.max(1.0);
        let norm = if s.overflowed { 0.0 } else { s.grad_norm }; // float16's skipped step
        check_finite(&[loss, s.aux, norm], self.step + 1, self.last_checkpoint, &self.dir)?;
        if self.span_target.is_some() {
            let memory = self.memory_seen()?;
            if let Some(target) = &mut self.span_target {
                target.observe(memory);
            }
        }
        self.step += 1;
        self.tokens_seen += (batch.batch * batch.len) as u64;
        window.nll += s.nll_sum;
        window.weight += s.weight;
        window.aux += s.aux;
        window.steps += 1;
        window.tokens += batch.batch * batch.len;
        window.grad_norm += s.grad_norm;
        Ok(loss)
    }

    fn log_progress(&mut self, w: &Window, seconds: f64) -> Result<()> {
        // No scored token in the window (a copy task's filler): no loss, not a loss of 0.
        let loss = (w.weight > 0.0).then(|| w.nll / w.weight);
        let bpb = loss.map(|l| l / std::f64::consts::LN_2);
        let lr = learning_rate(&self.cfg.train, self.step.saturating_sub(1));
        let tokens_per_s = w.tokens as f64 / seconds.max(1e-9);
        let eta = std::time::Duration::from_secs_f64(
            seconds / w.steps.max(1) as f64 * (self.cfg.train.steps - self.step) as f64,
        );
        let reports = self.mems[0].reports();
        let mem_size: Vec<f64> = reports.iter().map(|r| r.mem_size).collect();
        let per_layer = |f: &dyn Fn(&lethe_model::memory::MemoryReport) -> Option<f64>| {
            reports.iter().filter_map(f).map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(",")
        };
        let spans = per_layer(&|r| r.extra("mean_span"));
        let spans = if spans.is_empty() { String::new() } else { format!(" | span {spans}") };
        // The span loss's weight `memory.expire.target` has reached.
        let alpha = self.span_target.as_ref().map(|t| self.cfg.memory.expire.alpha * t.factor());
        let spans = match alpha {
            Some(alpha) => format!("{spans} | alpha {alpha:.2e}"),
            None => spans,
        };
        let (rate, rate_value) = match self.cfg.data.tokenizer {
            Some(_) => ("ppl", loss.map(f64::exp)),
            None => ("bpb", bpb),
        };
        self.say(&format!(
            "step {:>6}/{} | loss {} | {rate} {} | lr {lr:.2e} | {} tok/s | mem {}{spans} | ETA {}",
            self.step,
            self.cfg.train.steps,
            or_dash(loss),
            or_dash(rate_value),
            format_count(tokens_per_s),
            per_layer(&|r| Some(r.mem_size)),
            format_duration(eta)
        ));
        self.log_histograms()?;
        self.log(&json!({
            "step": self.step,
            "split": "train",
            "loss": loss,
            "bpb": bpb,
            "aux_loss": w.aux / w.steps.max(1) as f64,
            "grad_norm": w.grad_norm / w.steps.max(1) as f64,
            "lr": lr,
            "tokens_per_s": tokens_per_s,
            "tokens_seen": self.tokens_seen,
            "mem_size": mem_size,
            "alpha": alpha,
            "memory": reports.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
        }))
    }

    fn evaluate(&mut self) -> Result<EvalResult> {
        let cap = (self.cfg.train.eval_tokens > 0).then_some(self.cfg.train.eval_tokens);
        let r = evaluate_sharded(
            &self.lm,
            &self.valid,
            self.cfg.train.batch,
            self.cfg.train.block,
            cap,
            self.group.as_ref(),
            |_, _| {},
        )?;
        let scored = r.tokens > 0; // none: the figures are not 0, they do not exist
        let answers =
            r.answer_accuracy.filter(|_| scored).map(|a| format!(" | answers {:.1}%", 100.0 * a)).unwrap_or_default();
        let accuracy = if scored { format!("{:.1}%", 100.0 * r.accuracy) } else { "-".into() };
        let word_ppl = |p: f64| format!(" | word ppl {}", lethe_core::metrics::format_perplexity(p, 2));
        let words = r.word_ppl.filter(|_| scored).map(word_ppl).unwrap_or_default();
        // Bits per byte for byte models; a tokenised corpus reads in perplexity.
        let (rate, rate_value) = if self.cfg.data.tokenizer.is_some() { ("ppl", r.ppl) } else { ("bpb", r.bpb) };
        let hint =
            if scored { String::new() } else { format!(" (no scored token: {})", crate::eval::NOTHING_SCORED_ADVICE) };
        self.say(&format!(
            "eval step {} | valid loss {} | {rate} {}{words} | accuracy {accuracy}{answers} | {} tokens{hint}",
            self.step,
            or_dash(scored.then_some(r.loss)),
            or_dash(scored.then_some(rate_value)),
            r.tokens
        ));
        let mut record = serde_json::to_value(&r)?;
        if !scored {
            for field in ["loss", "bpb", "ppl", "word_ppl", "accuracy", "answer_accuracy"] {
                record[field] = serde_json::Value::Null;
            }
        }
        record["step"] = json!(self.step);
        record["split"] = json!("valid");
        self.log(&record)?;
        Ok(r)
    }

    fn save_checkpoint(&mut self) -> Result<()> {
        let first = self.first_micro_batch();
        let mut memories = vec![];
        for (i, mem) in self.mems.iter().enumerate() {
            memories.extend(
                mem.state()
                    .into_iter()
                    .map(|(n, t)| (format!("memory.{}.{n}", first + i), t.to_device(tch::Device::Cpu))),
            );
        }
        if let Some(g) = &self.group {
            memories = g.all_gather_named(&memories)?; // every rank's, for rank 0 to write
        }
        let Some(folder) = &self.folder else {
            self.last_checkpoint = Some(self.step);
            return Ok(());
        };
        let mut tensors = self.lm.named_parameters();
        tensors.extend(self.opt.state());
        tensors.extend(memories);
        let mut state = TrainState::new(self.step, &self.data.state(), self.tokens_seen)?;
        state.world_size = self.group.as_ref().map_or(1, ProcessGroup::world_size);
        state.span_target = self.span_target.as_ref().map(SpanTarget::state);
        checkpoint::save(&folder.checkpoint_path(), self.cfg, &state, &tensors)?;
        self.last_checkpoint = Some(self.step);
        Ok(())
    }

    fn last_checkpoint(&self) -> Option<usize> {
        self.last_checkpoint
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Run<'_> {
    /// The memories a query saw in the last step, a layer's mean over the layers, the
    /// micro-batches and the ranks.
    fn memory_seen(&self) -> Result<f64> {
        let sizes: Vec<f64> = self.mems.iter().flat_map(|m| m.reports()).map(|r| r.mem_size).collect();
        let mean = lethe_core::metrics::mean(&sizes);
        match &self.group {
            Some(g) => Ok(g.sum_f64(&[mean])?[0] / g.world_size() as f64),
            None => Ok(mean),
        }
    }

    /// The global index of this rank's first micro-batch (0 on a single process).
    fn first_micro_batch(&self) -> usize {
        self.group.as_ref().map_or(0, |g| g.rank() * self.cfg.train.accum)
    }

    /// TensorBoard histograms of the last block: per layer, the spans Expire-Span gave
    /// the tokens, and the ∞-former's attention over its memory's axis.
    fn log_histograms(&mut self) -> Result<()> {
        let Some(metrics) = self.metrics.as_mut() else { return Ok(()) };
        let mut out = vec![];
        for (layer, spans) in self.mems[0].token_spans().iter().enumerate() {
            if let Some(s) = spans {
                out.push((format!("train/spans/{layer}"), Histogram::of(&host_values(s)?, 30)));
            }
        }
        for (layer, trace) in self.mems[0].ltm_traces().iter().enumerate() {
            if let Some(t) = trace {
                out.push((
                    format!("train/ltm_attention/{layer}"),
                    Histogram::over_unit_interval(&host_values(&t.attention.mean_dim(0, false, Kind::Double))?),
                ));
            }
        }
        metrics.histograms(self.step, out)
    }

    /// Appends a record to `metrics.jsonl` (rank 0 only).
    fn log(&mut self, record: &serde_json::Value) -> Result<()> {
        self.metrics.as_mut().map_or(Ok(()), |m| m.write(record))
    }
}

/// `value` to 4 decimals, or `-` when there is none.
fn or_dash(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| lethe_core::metrics::format_perplexity(v, 4))
}

/// The sums of one optimiser step.
#[derive(Clone, Copy, Debug)]
pub struct StepStats {
    /// Summed negative log-likelihood of the scored tokens (nats).
    pub nll_sum: f64,
    /// Number of scored tokens.
    pub weight: f64,
    /// Auxiliary loss, averaged over micro-batches.
    pub aux: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Seconds spent in the data-parallel collectives (0 on a single process).
    pub comm_s: f64,
    /// Float16 training: the scaled gradients overflowed, so the step was skipped and the
    /// loss scale halved (not a divergence while the scale can still shrink).
    pub overflowed: bool,
}

/// Forward and backward over `batch` in `mems.len()` micro-batches, clipping, and one
/// Adam update at `scales.lr` (skipped when the loss or the gradient is not finite, so
/// that a NaN never reaches the parameters), with the memories' auxiliary loss weighted
/// by `scales.aux`. The memories are reset first when the batch says so.
///
/// With a data-parallel `group`, this rank runs micro-batches `rank * accum ..` of the
/// `accum * world` the batch is cut into, and the gradients and the sums are summed
/// over the ranks before the clip: every rank then steps as a single process with
/// `accum * world` micro-batches would.
/// The streams of micro-batch `i` of this rank, of `accum` per rank, in a batch of
/// `batch` streams: its first stream and how many it has (every rank reads the whole
/// batch and takes its share).
pub fn micro_batch(batch: usize, accum: usize, group: Option<&ProcessGroup>, i: usize) -> (usize, usize) {
    let (rank, world) = group.map_or((0, 1), |g| (g.rank(), g.world_size()));
    let per = batch / (accum * world);
    ((rank * accum + i) * per, per)
}

pub fn optimisation_step(
    lm: &Lm,
    opt: &mut Optimiser,
    mems: &mut [Memory],
    batch: &Batch,
    cfg: &TrainConfig,
    scales: Scales,
    group: Option<&ProcessGroup>,
) -> Result<StepStats> {
    if batch.reset {
        mems.iter_mut().for_each(Memory::reset);
    }
    let weight = batch.scored(); // the whole batch's: every rank reads all of it
    let total_weight = weight.max(1.0);
    let micro_batches = mems.len() * group.map_or(1, ProcessGroup::world_size);
    opt.zero_grad();
    let (mut nll_sum, mut aux) = (0.0, 0.0);
    let accum = mems.len();
    let loss_scale = opt.loss_scale.map_or(1.0, |s| s.scale);
    for (i, mem) in mems.iter_mut().enumerate() {
        let (first, per) = micro_batch(batch.batch, accum, group, i);
        let (x, y, w) = batch.tensors(first, first + per, lm.device());
        let forward = profile::phase("forward");
        let autocast = match cfg.precision {
            Precision::Bf16 => Some(Autocast::bf16(lm.device())?),
            Precision::F16 => Some(Autocast::f16(lm.device())?),
            Precision::F32 => None,
        };
        let (nll, aux_loss) = lm.model.forward_nll(&x, &y, mem, true)?;
        drop(autocast);
        let nll = (nll * w).sum(Kind::Float);
        let out_aux = aux_loss * scales.aux;
        let loss = &nll / total_weight + &out_aux / micro_batches as f64;
        drop(forward);
        let backward = profile::phase("backward");
        // With the base frozen, a memory that holds nothing yet (the ∞-former's long-term
        // memory before its first absorption) leaves the loss without a trainable input:
        // this micro-batch adds no gradient.
        if loss.requires_grad() {
            let scaled = loss * loss_scale;
            if i + 1 == accum {
                // The last micro-batch's backward pass sums the gradients over the ranks
                // as it goes, when the group overlaps them.
                group.map(|g| g.prepare_for_backward(&scaled)).transpose()?;
            }
            scaled.f_backward().map_err(|e| match group {
                Some(g) => LetheError::Distributed {
                    rank: g.rank(),
                    reason: format!("the backward pass and its all-reduce failed (is a peer gone?): {e}"),
                },
                None => LetheError::Invalid(format!("the backward pass failed: {e}")),
            })?;
        }
        drop(backward);
        let _read = profile::phase("read the loss");
        nll_sum += nll.double_value(&[]);
        aux += out_aux.double_value(&[]) / micro_batches as f64;
    }
    let mut comm_s = 0.0;
    if let Some(g) = group {
        let start = std::time::Instant::now();
        let _reduce = profile::phase("all-reduce");
        let sums = g.sum_gradients(&lm.named_parameters(), &[nll_sum, aux])?;
        (nll_sum, aux) = (sums[0], sums[1]);
        comm_s = start.elapsed().as_secs_f64();
    }
    let clip = profile::phase("clip");
    if loss_scale != 1.0 {
        opt.scale_grads(1.0 / loss_scale);
    }
    let grad_norm = opt.clip_grad_norm(cfg.grad_clip)?;
    drop(clip);
    let _step = profile::phase("optimiser");
    // Float16's scaled gradients overflowed: the step is skipped and the scale halved.
    let overflowed = opt.loss_scale.as_mut().is_some_and(|s| s.overflowed(grad_norm.is_finite()));
    if !overflowed && nll_sum.is_finite() && aux.is_finite() && grad_norm.is_finite() {
        opt.step(scales.lr)?;
        lm.model.after_step();
    }
    Ok(StepStats { nll_sum, weight, aux, grad_norm, comm_s, overflowed })
}
