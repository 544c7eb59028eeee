//! The actor-critic loop for the gridworlds, and evaluation by playing episodes.
//!
//! One optimiser step is one truncation window of `train.block` steps (the paper's BPTT
//! length, 100) of `train.batch` episodes:
//!
//! 1. **Act.** Step by step, without gradient, the agent sees each observation, the
//!    memory absorbs it, and an action is sampled from the policy. The memory is carried
//!    from window to window.
//! 2. **Learn.** The window's observations (and the one after it, for the bootstrap
//!    value) are run again as blocks, from the memory as it was at the window's start,
//!    this time with gradient: the gradient flows through the whole window, as in
//!    truncated back-propagation through time; earlier windows reach it only through
//!    the (detached) memory. Blocks are at most `memory.span` long (the backbone's
//!    rule), so a memory shorter than the window also cuts the gradient.
//! 3. Discounted returns bootstrapped from the critic, the actor-critic loss ([`a2c`])
//!    plus the memories' auxiliary losses, clipping and one optimiser step.
//!
//! **Episodes and memory resets** (`rl.reset`). Every episode starts with an empty
//! memory, in one of two ways:
//!
//! - `episode` (default, the paper's rule): each row of the batch plays episodes back
//!   to back, a new one starting at the step after one ends. Every step carries its
//!   episode's number, and the memory lets a step see only states of its own episode
//!   (`AttendInput::episodes`), in acting and in learning alike, so each row's memory
//!   is in effect reset where its episode ends, even in the middle of a window. No
//!   step is idle. Needs a mechanism that keeps episodes apart (fixed, adaptive,
//!   expire).
//! - `batch`: the episodes of a batch start together; one that ends waits, its steps
//!   masked out of the loss, until the batch's last episode has ended (or hit
//!   `max_steps`); then a new batch starts and the whole memory is reset. Works with
//!   every mechanism; the price is the idle time of episodes that end early.
//!
//! Evaluation ([`play`]) resets the memory the same way: in episode mode the rows play
//! episodes back to back, in batch mode whole batches start from an empty memory.
//!
//! Actions are sampled with lethe's own generator, which is saved in checkpoints with
//! the episodes in progress and the memory, so a resumed run repeats a straight one.
//!
//! **Data-parallel** (under torchrun, [`lethe_core::dist`]): every rank steps the whole
//! batch of episodes, but runs the agent on its own rows (rank `r` of `n`: rows
//! `r * B / n ..`), each with its own memory. The policy's probabilities and the
//! critic's bootstrap values of all rows are summed into every rank (a rank contributes
//! its rows, zeros elsewhere), so every rank samples the same actions from the same
//! generator and the episodes stay identical. Each rank's loss takes its means over the
//! whole batch's running steps, so the gradients, summed over the ranks, are the whole
//! batch's. Rank 0 alone prints, logs and writes; a checkpoint holds every rank's memory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tch::{Kind, Tensor};

use super::a2c::{self, Rollout};
use super::agent::Agent;
use super::env::{observation_size, vocabulary, Action, EpisodeStats, Episodes, Outcome};
use super::Reset;
use crate::run::{
    begin_step, broadcast_parameters, check_finite, drive, opening_line, Looped, RunFolder, Scales, TrainOptions,
};
use lethe_core::checkpoint::{self, Checkpoint, TrainState};
use lethe_core::config::{Config, Source};
use lethe_core::dist::ProcessGroup;
use lethe_core::error::{LetheError, Result, TorchContext};
use lethe_core::metrics::{format_count, format_duration, MetricsLog};
use lethe_core::optim::{learning_rate, Optimiser};
use lethe_core::rng::Rng;
use lethe_model::Memory;

/// Stream number (of the data seed) of the evaluation episodes, apart from training's.
const EVAL_STREAM: u64 = 0xE7A1;
/// Stream number (of a seed) of the action sampler.
const SAMPLER_STREAM: u64 = 0x5A3B;

/// Where an RL run stands besides its tensors: the episodes in progress and the sampler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RlState {
    /// The batch of episodes.
    pub episodes: Episodes,
    /// The action sampler.
    pub rng: Rng,
}

/// The RL trainer's data position in a checkpoint, tagged `Episodes` as the language-model
/// trainer's are tagged `Fixed` and `Generated`.
#[derive(Serialize, Deserialize)]
enum RlData {
    Episodes(RlState),
}

/// The figures of a set of finished episodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RlEval {
    /// Episodes played.
    pub episodes: usize,
    /// Mean undiscounted return.
    pub mean_return: f64,
    /// Share of successful episodes (corridor: the right door; portal: the last room).
    pub success_rate: f64,
    /// Mean episode length, steps.
    pub mean_length: f64,
    /// Portal: mean of the furthest room reached (1-based).
    pub mean_rooms: Option<f64>,
    /// Portal: share of informed door choices that were correct (50% without memory,
    /// 100% with a perfect one; see [`lethe_data::gridworld::portal`]). None when no choice was
    /// informed.
    #[serde(default)]
    pub recall: Option<f64>,
    /// Average number of memories a step attended to, per layer.
    pub mem_size: Vec<f64>,
}

impl RlEval {
    /// The figures of `episodes`, with the memory sizes `mem_size`.
    pub fn of(episodes: &[EpisodeStats], mem_size: Vec<f64>, portal: bool) -> RlEval {
        let n = episodes.len().max(1) as f64;
        let mean = |f: &dyn Fn(&EpisodeStats) -> f64| episodes.iter().map(f).sum::<f64>() / n;
        RlEval {
            episodes: episodes.len(),
            mean_return: mean(&|e| e.ret),
            success_rate: mean(&|e| f64::from(u8::from(e.success))),
            mean_length: mean(&|e| e.length as f64),
            mean_rooms: portal.then(|| mean(&|e| e.rooms as f64)),
            recall: recall(episodes).filter(|_| portal),
            mem_size,
        }
    }

    /// One line for the terminal.
    pub fn line(&self) -> String {
        let mut rooms = self.mean_rooms.map(|r| format!(" | rooms {r:.2}")).unwrap_or_default();
        if let Some(r) = self.recall {
            rooms += &format!(" | recall {:.1}%", 100.0 * r);
        }
        let mem: Vec<String> = self.mem_size.iter().map(|m| format!("{m:.1}")).collect();
        format!(
            "{} episodes | return {:.3} | success {:.1}%{rooms} | length {:.1} | mem {}",
            self.episodes,
            self.mean_return,
            100.0 * self.success_rate,
            self.mean_length,
            mem.join(",")
        )
    }
}

/// The share of informed door choices that were correct over `episodes`, if any was made.
fn recall(episodes: &[EpisodeStats]) -> Option<f64> {
    let informed: usize = episodes.iter().map(|e| e.informed).sum();
    let recalled: usize = episodes.iter().map(|e| e.recalled).sum();
    (informed > 0).then(|| recalled as f64 / informed as f64)
}

/// What a finished RL run reports.
#[derive(Clone, Debug)]
pub struct RlSummary {
    /// The run folder.
    pub run_dir: PathBuf,
    /// The loss of each step run in this invocation.
    pub losses: Vec<f64>,
    /// The last evaluation.
    pub last_eval: Option<RlEval>,
}

/// Sums over the steps since the last progress line.
#[derive(Default)]
struct Window {
    episodes: Vec<EpisodeStats>,
    steps: usize,
    env_steps: u64,
    sums: Learned,
    mem: MemSum,
}

/// Running sum of per-layer memory sizes over the steps of running episodes.
#[derive(Default)]
struct MemSum {
    sum: Vec<f64>,
    count: usize,
}

impl MemSum {
    /// Adds the memory sizes of the last step of the rows that were `active` (for
    /// mechanisms that do not count streams apart, the batch's mean for each).
    fn add(&mut self, mem: &Memory, active: &[bool]) {
        let reports = mem.reports();
        self.sum.resize(reports.len(), 0.0);
        let rows: Vec<usize> = (0..active.len()).filter(|&i| active[i]).collect();
        for (sum, report) in self.sum.iter_mut().zip(&reports) {
            *sum += rows.iter().map(|&i| report.mem_size_of(i)).sum::<f64>();
        }
        self.count += rows.len();
    }

    fn mean(&self) -> Vec<f64> {
        self.sum.iter().map(|s| s / self.count.max(1) as f64).collect()
    }
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
    /// This rank's rows of the batch, `lo..hi` (all of them on a single process).
    rows: (usize, usize),
    agent: Agent,
    opt: Optimiser,
    mem: Memory,
    state: RlState,
    metrics: Option<MetricsLog>,
    step: usize,
    env_steps: u64,
    last_checkpoint: Option<usize>,
}

/// Trains an agent on the gridworld `cfg` describes. See the module documentation.
pub fn train(cfg: &Config, opts: &TrainOptions) -> Result<RlSummary> {
    cfg.validate()?;
    if crate::run::span_target::SpanTarget::of(cfg, None).is_some() {
        return Err(LetheError::config(
            "memory.expire.target",
            cfg.memory.expire.target,
            "steers the span loss in language-model training; an agent's runs set alpha",
        ));
    }
    let mut run = Run::start(cfg, opts)?;
    let mut summary = RlSummary { run_dir: run.dir.clone(), losses: vec![], last_eval: None };
    (summary.losses, summary.last_eval) = drive(&mut run, &cfg.train, opts)?;
    Ok(summary)
}

impl<'a> Run<'a> {
    /// Checks the run folder and the checkpoint to resume, builds the agent, and only
    /// then writes to the folder (see [`crate::run`]).
    fn start(cfg: &'a Config, opts: &'a TrainOptions) -> Result<Self> {
        let device = lethe_core::device::for_training(&cfg.train.device, cfg.train.threads, cfg.train.tf32)?;
        let (device, group) = lethe_core::dist::join_for_training(cfg, device)?;
        let dir = opts.out_dir.join(&cfg.name);
        let (folder, resumed) = crate::run::folder::open_for_ranks(cfg, opts.intent(), &dir, group.as_ref())?;
        let (rank, world) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.world_size()));
        let b = cfg.train.batch;
        let rows = (rank * b / world, (rank + 1) * b / world);
        let agent = Agent::new(cfg, device)?;
        let mut opt =
            Optimiser::new(lethe_model::trainable(agent.named_parameters(), cfg.train.freeze_base), &cfg.train);
        opt.group(lethe_model::memory::is_mechanism_parameter, cfg.train.memory_lr_scale());
        let mem = agent.new_memory();
        let state = RlState {
            episodes: Episodes::new(cfg, cfg.train.batch, cfg.data_seed())?,
            rng: Rng::derive(cfg.seed, SAMPLER_STREAM),
        };
        let from = resumed.as_ref().and_then(|ck| ck.state.as_ref()).map_or(0, |s| s.step);
        let mut run = Run {
            cfg,
            opts,
            folder,
            dir,
            group,
            rows,
            agent,
            opt,
            mem,
            state,
            metrics: None,
            step: 0,
            env_steps: 0,
            last_checkpoint: None,
        };
        // Every check of the checkpoint before the folder changes (see `train::Run::start`).
        if let Some(ck) = resumed {
            run.resume(&ck)?;
        }
        run.metrics = run.folder.as_mut().map(|f| f.commit(cfg, from)).transpose()?;
        broadcast_parameters(run.group.as_ref(), run.agent.named_parameters())?;
        run.say(&opening_line(cfg, " by actor-critic", run.agent.parameter_count(), device, &run.dir));
        if let Some(g) = &run.group {
            run.say(&format!(
                "data-parallel: {} ranks x {} episodes, gradients summed over Gloo",
                g.world_size(),
                cfg.train.batch / g.world_size()
            ));
        }
        run.say(&format!("task: {}", lethe_data::task::describe(cfg)));
        Ok(run)
    }

    fn resume(&mut self, ck: &Checkpoint) -> Result<()> {
        let path = &ck.path;
        let state = ck.state.clone().ok_or_else(|| LetheError::checkpoint(path, "holds no training state"))?;
        let Some(RlData::Episodes(rl)) = state.data() else {
            return Err(LetheError::checkpoint(path, "holds no episodes: it is not from a reinforcement-learning run"));
        };
        if rl.episodes.slots.len() != self.cfg.train.batch {
            return Err(LetheError::checkpoint(path, "its batch of episodes does not match train.batch"));
        }
        ck.load_parameters(&self.agent.vs.variables())?;
        self.opt.load_state(state.step, |n| ck.tensor(n)).map_err(|e| LetheError::checkpoint(path, e.to_string()))?;
        let rank = self.group.as_ref().map_or(0, ProcessGroup::rank);
        let saved: Vec<_> = ck
            .with_prefix(&format!("memory.{rank}."))
            .into_iter()
            .map(|(n, t)| (n, t.to_device(self.agent.device())))
            .collect();
        self.mem.load_state(&saved).map_err(|e| LetheError::checkpoint(path, e.to_string()))?;
        self.state = rl;
        self.step = state.step;
        self.env_steps = state.tokens_seen;
        self.last_checkpoint = Some(state.step);
        self.say(&crate::run::folder::resumed_line(ck, self.cfg, state.step)?);
        Ok(())
    }

    /// Plays up to `train.block` steps of the batch, carrying the memory. Returns the
    /// rollout and the steps' observations (before each step and after the last).
    fn act(&mut self, w: &mut Window) -> Result<(Rollout, Seen)> {
        let _guard = tch::no_grad_guard();
        let vocab = vocabulary(self.cfg);
        let per_episode = self.cfg.rl.reset == Reset::Episode;
        if per_episode {
            self.state.episodes.refill(self.cfg)?;
        }
        let mut seen = Seen::default();
        seen.push(&self.state.episodes, vocab, per_episode);
        let mut rollout = Rollout::default();
        for _ in 0..self.cfg.train.block {
            let probs = policy(&self.agent, &seen, &mut self.mem, self.rows)?;
            let probs = all_rows(self.group.as_ref(), probs, self.rows, self.cfg.train.batch, Action::COUNT)?;
            let active: Vec<bool> = self.state.episodes.slots.iter().map(|s| !s.done).collect();
            let actions = sample(&probs, &active, &mut self.state.rng);
            let (outcomes, ended) =
                self.state.episodes.step(&actions.iter().map(|&a| Action::from_index(a as usize)).collect::<Vec<_>>());
            if per_episode {
                self.state.episodes.refill(self.cfg)?;
            }
            w.mem.add(&self.mem, &active[self.rows.0..self.rows.1]);
            let running = active.iter().filter(|&&a| a).count() as u64;
            w.env_steps += running;
            self.env_steps += running;
            w.episodes.extend(ended);
            record(&mut rollout, actions, &outcomes, active);
            seen.push(&self.state.episodes, vocab, per_episode);
            if self.state.episodes.all_done() {
                break;
            }
        }
        Ok((rollout, seen))
    }
}

impl Looped for Run<'_> {
    type Window = Window;
    type Eval = RlEval;

    fn step(&self) -> usize {
        self.step
    }

    fn quiet(&self) -> bool {
        self.opts.quiet || self.folder.is_none()
    }

    fn group(&self) -> Option<&ProcessGroup> {
        self.group.as_ref()
    }

    /// One truncation window: act, learn, one optimiser step. Returns the loss.
    fn train_step(&mut self, w: &mut Window) -> Result<f64> {
        let (scales, _seed) = begin_step(self.cfg, self.step);
        if self.state.episodes.all_done() {
            self.state.episodes.restart(self.cfg, self.cfg.train.batch)?;
            self.mem.reset();
        }
        let start = snapshot(&self.mem);
        let (rollout, seen) = self.act(w)?;
        let ranks = Ranks { group: self.group.as_ref(), rows: self.rows };
        let figures = learn(&self.agent, &mut self.opt, &start, &rollout, &seen, self.cfg, scales, ranks)?;
        check_finite(&[figures.loss, figures.grad_norm], self.step + 1, self.last_checkpoint, &self.dir)?;
        self.step += 1;
        w.steps += 1;
        w.sums.add(&figures);
        Ok(figures.loss)
    }

    fn log_progress(&mut self, w: &Window, seconds: f64) -> Result<()> {
        let steps = w.steps.max(1) as f64;
        let lr = learning_rate(&self.cfg.train, self.step.saturating_sub(1));
        let rate = w.env_steps as f64 / seconds.max(1e-9);
        let eta = std::time::Duration::from_secs_f64(seconds / steps * (self.cfg.train.steps - self.step) as f64);
        let portal = self.cfg.data.source == Source::Portal;
        let ep = RlEval::of(&w.episodes, w.mem.mean(), portal);
        let episodes = if w.episodes.is_empty() { "no episode ended".to_string() } else { ep.line() };
        self.say(&format!(
            "step {:>6}/{} | {episodes} | entropy {:.3} | value loss {:.4} | {} steps/s | ETA {}",
            self.step,
            self.cfg.train.steps,
            w.sums.entropy / steps,
            w.sums.value / steps,
            format_count(rate),
            format_duration(eta)
        ));
        let reports = self.mem.reports();
        self.log(&json!({
            "step": self.step,
            "split": "train",
            "episodes": ep.episodes,
            "return": (!w.episodes.is_empty()).then_some(ep.mean_return),
            "success": (!w.episodes.is_empty()).then_some(ep.success_rate),
            "length": (!w.episodes.is_empty()).then_some(ep.mean_length),
            "rooms": ep.mean_rooms.filter(|_| !w.episodes.is_empty()),
            "recall": ep.recall,
            "loss": w.sums.loss / steps,
            "policy_loss": w.sums.policy / steps,
            "value_loss": w.sums.value / steps,
            "entropy": w.sums.entropy / steps,
            "aux_loss": w.sums.aux / steps,
            "grad_norm": w.sums.grad_norm / steps,
            "lr": lr,
            "env_steps": self.env_steps,
            "env_steps_per_s": rate,
            "mem_size": ep.mem_size,
            "memory": reports.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
        }))
    }

    fn evaluate(&mut self) -> Result<RlEval> {
        let r = evaluate(&self.agent, self.cfg.rl.eval_episodes)?;
        self.say(&format!("eval step {} | {}", self.step, r.line()));
        let mut record = serde_json::to_value(&r)?;
        record["step"] = json!(self.step);
        record["split"] = json!("eval");
        self.log(&record)?;
        Ok(r)
    }

    fn save_checkpoint(&mut self) -> Result<()> {
        let rank = self.group.as_ref().map_or(0, ProcessGroup::rank);
        let mut memory: Vec<_> = self
            .mem
            .state()
            .into_iter()
            .map(|(n, t)| (format!("memory.{rank}.{n}"), t.to_device(tch::Device::Cpu)))
            .collect();
        if let Some(g) = &self.group {
            memory = g.all_gather_named(&memory)?; // every rank's, for rank 0 to write
        }
        let Some(folder) = &self.folder else {
            self.last_checkpoint = Some(self.step);
            return Ok(());
        };
        let mut tensors = self.agent.named_parameters();
        tensors.extend(self.opt.state());
        tensors.extend(memory);
        let mut state = TrainState::new(self.step, &RlData::Episodes(self.state.clone()), self.env_steps)?;
        state.world_size = self.group.as_ref().map_or(1, ProcessGroup::world_size);
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
    /// Appends a record to `metrics.jsonl` (rank 0 only).
    fn log(&mut self, record: &serde_json::Value) -> Result<()> {
        self.metrics.as_mut().map_or(Ok(()), |m| m.write(record))
    }
}

/// Where a data-parallel rank stands: its group and its rows of the batch.
#[derive(Clone, Copy)]
struct Ranks<'a> {
    group: Option<&'a ProcessGroup>,
    rows: (usize, usize),
}

/// `values` (`per_row` for each of this rank's `rows`) as the values of all `batch`
/// rows, summed from every rank (each gives its rows and zeros elsewhere); `values`
/// itself on a single process.
fn all_rows(
    group: Option<&ProcessGroup>,
    values: Vec<f32>,
    rows: (usize, usize),
    batch: usize,
    per_row: usize,
) -> Result<Vec<f32>> {
    let Some(g) = group else { return Ok(values) };
    let mut all = vec![0f32; batch * per_row];
    all[rows.0 * per_row..rows.1 * per_row].copy_from_slice(&values);
    let mut t = Tensor::from_slice(&all);
    g.all_reduce_sum(&mut t)?;
    Vec::<f32>::try_from(&t).torch("reading the gathered rows")
}

/// A deep copy of a memory's state (the mechanisms replace their tensors, but a copy
/// makes the window's starting point safe from any in-place update).
fn snapshot(mem: &Memory) -> Vec<(String, Tensor)> {
    mem.state().into_iter().map(|(n, t)| (n, t.copy())).collect()
}

/// The observations of a window, step by step: before each step and after the last.
#[derive(Default)]
struct Seen {
    /// `B x F` each, flattened.
    obs: Vec<Vec<f32>>,
    /// The episode number of each row, `B` each; empty when the memory is reset by
    /// batch (`rl.reset = "batch"`).
    episodes: Vec<Vec<i64>>,
}

impl Seen {
    /// Adds what the batch `episodes` shows now, with their numbers if `numbered`.
    fn push(&mut self, episodes: &Episodes, vocab: usize, numbered: bool) {
        self.obs.push(episodes.observe(vocab));
        if numbered {
            self.episodes.push(episodes.numbers());
        }
    }

    /// Observations `(b, t, F)` and, if numbered, episodes `(b, t)` of steps `from..from + t`.
    fn tensors(&self, from: usize, t: usize, f: i64, device: tch::Device) -> (Tensor, Option<Tensor>) {
        let obs = Tensor::from_slice(&self.obs[from..from + t].concat()).view([t as i64, -1, f]).transpose(0, 1); // (b, t, F)
        let episodes = (!self.episodes.is_empty())
            .then(|| Tensor::from_slice(&self.episodes[from..from + t].concat()).view([t as i64, -1]).transpose(0, 1)); // (b, t)
        (obs.to_device(device), episodes.map(|e| e.to_device(device)))
    }
}

/// The policy's action probabilities `B x 4` for the last observation of `seen`, as the
/// memory absorbs it.
fn policy(agent: &Agent, seen: &Seen, mem: &mut Memory, rows: (usize, usize)) -> Result<Vec<f32>> {
    let f = observation_size(&agent.config) as i64;
    let (x, episodes) = seen.tensors(seen.obs.len() - 1, 1, f, agent.device()); // (b, 1, F), (b, 1)
    let (x, episodes) = own_rows(x, episodes, rows);
    let out = agent.forward(&x, mem, false, episodes.as_ref())?;
    let probs = out.logits.softmax(-1, Kind::Float).view([-1]).to_device(tch::Device::Cpu);
    Vec::<f32>::try_from(&probs).torch("reading the policy")
}

/// One action per episode drawn from `probs` (`B x 4`); 0 for episodes not running.
fn sample(probs: &[f32], active: &[bool], rng: &mut Rng) -> Vec<i64> {
    probs
        .chunks(Action::COUNT)
        .zip(active)
        .map(|(p, &running)| if running { rng.categorical(p) as i64 } else { 0 })
        .collect()
}

fn record(rollout: &mut Rollout, actions: Vec<i64>, outcomes: &[Outcome], active: Vec<bool>) {
    rollout.actions.push(actions);
    rollout.rewards.push(outcomes.iter().map(|o| o.reward).collect());
    rollout.ends.push(outcomes.iter().map(|o| o.done).collect());
    rollout.active.push(active);
}

/// The figures of one learning step (or their sums over several).
#[derive(Default)]
struct Learned {
    loss: f64,
    policy: f64,
    value: f64,
    entropy: f64,
    aux: f64,
    grad_norm: f64,
}

impl Learned {
    fn add(&mut self, other: &Learned) {
        self.loss += other.loss;
        self.policy += other.policy;
        self.value += other.value;
        self.entropy += other.entropy;
        self.aux += other.aux;
        self.grad_norm += other.grad_norm;
    }
}

/// Runs the window's observations `seen` (`T + 1` steps) again with gradient, from
/// the memory state `start`, and takes one optimiser step on the actor-critic loss
/// (skipped when the loss or the gradient is not finite).
#[allow(clippy::too_many_arguments)]
fn learn(
    agent: &Agent,
    opt: &mut Optimiser,
    start: &[(String, Tensor)],
    rollout: &Rollout,
    seen: &Seen,
    cfg: &Config,
    scales: Scales,
    ranks: Ranks,
) -> Result<Learned> {
    let mut mem = agent.new_memory();
    mem.load_state(start)?;
    let (steps, f) = (seen.obs.len() as i64, observation_size(cfg) as i64);
    let (x, episodes) = seen.tensors(0, steps as usize, f, agent.device()); // (b, T+1, F), (b, T+1)
    let (x, episodes) = own_rows(x, episodes, ranks.rows);
    let chunk = cfg.train.block.min(cfg.memory.span).max(1) as i64;
    let (mut logits, mut values) = (vec![], vec![]);
    let mut aux = Tensor::zeros([], (Kind::Float, agent.device()));
    let mut at = 0;
    while at < steps {
        let len = chunk.min(steps - at);
        let block_episodes = episodes.as_ref().map(|e| e.narrow(1, at, len));
        let out = agent.forward(&x.narrow(1, at, len), &mut mem, true, block_episodes.as_ref())?;
        logits.push(out.logits);
        values.push(out.value);
        aux += out.aux_loss;
        at += len;
    }
    let t = rollout.len() as i64;
    let (logits, values) = (Tensor::cat(&logits, 1), Tensor::cat(&values, 1)); // (b, T+1, 4), (b, T+1)
    let bootstrap: Vec<f32> = Vec::try_from(&values.narrow(1, t, 1).detach().view([-1]).to_device(tch::Device::Cpu))
        .torch("reading the values")?;
    let bootstrap = all_rows(ranks.group, bootstrap, ranks.rows, cfg.train.batch, 1)?;
    let bootstrap: Vec<f64> = bootstrap.into_iter().map(f64::from).collect();
    let returns = a2c::returns(rollout, &bootstrap, cfg.rl.gamma);
    let (lo, hi) = ranks.rows;
    let mine: Vec<Vec<f64>> = returns.iter().map(|r| r[lo..hi].to_vec()).collect();
    let count = rollout.active_steps().max(1) as f64; // the whole batch's
    let l =
        a2c::loss_over(&logits.narrow(1, 0, t), &values.narrow(1, 0, t), &rollout.rows(lo, hi), &mine, &cfg.rl, count);
    // The memories' losses are means over the rows: each rank's counts for its share.
    let world = ranks.group.map_or(1, ProcessGroup::world_size) as f64;
    let aux = aux * (scales.aux / world);
    let total = &l.total + &aux;
    opt.zero_grad();
    total.backward();
    let mut sums = [total.double_value(&[]), l.policy, l.value, l.entropy, aux.double_value(&[])];
    if let Some(g) = ranks.group {
        let reduced = g.sum_gradients(&agent.named_parameters(), &sums)?;
        sums.copy_from_slice(&reduced);
    }
    let [loss, policy, value, entropy, aux] = sums;
    let grad_norm = opt.clip_grad_norm(cfg.train.grad_clip)?;
    if loss.is_finite() && grad_norm.is_finite() {
        opt.step(scales.lr)?;
        agent.after_step();
    }
    Ok(Learned { loss, policy, value, entropy, aux, grad_norm })
}

/// Rows `lo..hi` of a window's observations `(b, t, F)` and episode numbers `(b, t)`.
fn own_rows(x: Tensor, episodes: Option<Tensor>, (lo, hi): (usize, usize)) -> (Tensor, Option<Tensor>) {
    let (lo, n) = (lo as i64, (hi - lo) as i64);
    if lo == 0 && n == x.size()[0] {
        return (x, episodes);
    }
    (x.narrow(0, lo, n), episodes.map(|e| e.narrow(0, lo, n)))
}

/// Sees a batch of episodes after every step, with the actions taken, their outcomes
/// and the memory that absorbed the step's observations; an error it returns (the
/// episodes could not be shown) stops the play.
pub type Watch<'a> = dyn FnMut(&Episodes, &[Action], &[Outcome], &Memory) -> Result<()> + 'a;

/// Plays `episodes` episodes (rounded up to whole batches of `train.batch`) of the
/// agent's task, sampling from the policy, on episodes apart from training's. `watch`
/// sees the batch after every step, with the actions taken.
///
/// The memory is reset as in training (`rl.reset`): in episode mode each row plays
/// episodes back to back, in batch mode whole batches start from an empty memory. The
/// memory size is averaged over every step of every episode played (for the
/// compressive memory and the ∞-former, which do not count streams apart, a step
/// counts the batch's mean).
pub fn play(agent: &Agent, episodes: usize, seed: u64, watch: &mut Watch) -> Result<RlEval> {
    if episodes > lethe_core::config::MAX_EPISODES {
        return Err(LetheError::Invalid(format!(
            "{episodes} episodes to play: at most {} (--episodes, rl.eval_episodes)",
            lethe_core::config::MAX_EPISODES
        )));
    }
    let _guard = tch::no_grad_guard();
    let cfg = &agent.config;
    let batch = cfg.train.batch.min(episodes.max(1));
    let total = episodes.div_ceil(batch) * batch;
    let mut player = Player {
        agent,
        rng: Rng::derive(seed, SAMPLER_STREAM),
        vocab: vocabulary(cfg),
        finished: vec![],
        mem_sum: MemSum::default(),
    };
    let mut eps = Episodes::new(cfg, batch, seed)?;
    let mut mem = agent.new_memory();
    match cfg.rl.reset {
        Reset::Episode => {
            while player.finished.len() < total {
                player.step(&mut eps, &mut mem, true, watch)?;
                eps.refill_up_to(cfg, total as u64)?;
            }
        }
        Reset::Batch => loop {
            while !eps.all_done() {
                player.step(&mut eps, &mut mem, false, watch)?;
            }
            if player.finished.len() >= total {
                break;
            }
            eps.restart(cfg, batch)?;
            mem = agent.new_memory();
        },
    }
    Ok(RlEval::of(&player.finished, player.mem_sum.mean(), cfg.data.source == Source::Portal))
}

/// What [`play`] carries from step to step.
struct Player<'a> {
    agent: &'a Agent,
    rng: Rng,
    vocab: usize,
    finished: Vec<EpisodeStats>,
    mem_sum: MemSum,
}

impl Player<'_> {
    /// One step of every running episode of `eps`, the memory seeing the observations
    /// with their episode numbers if `numbered`.
    fn step(&mut self, eps: &mut Episodes, mem: &mut Memory, numbered: bool, watch: &mut Watch) -> Result<()> {
        let mut now = Seen::default();
        now.push(eps, self.vocab, numbered);
        let probs = policy(self.agent, &now, mem, (0, eps.slots.len()))?;
        let active: Vec<bool> = eps.slots.iter().map(|s| !s.done).collect();
        let actions: Vec<Action> =
            sample(&probs, &active, &mut self.rng).into_iter().map(|a| Action::from_index(a as usize)).collect();
        let (outcomes, ended) = eps.step(&actions);
        self.mem_sum.add(mem, &active);
        self.finished.extend(ended);
        watch(eps, &actions, &outcomes, mem)
    }
}

/// Evaluates the agent on `episodes` episodes drawn apart from training's (see [`play`]).
pub fn evaluate(agent: &Agent, episodes: usize) -> Result<RlEval> {
    let seed = Rng::derive(agent.config.data_seed(), EVAL_STREAM).next_u64();
    play(agent, episodes, seed, &mut |_, _, _, _| Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn episode(rooms: usize, informed: usize, recalled: usize) -> EpisodeStats {
        EpisodeStats { ret: 0.0, length: 10, success: false, rooms, informed, recalled }
    }

    #[test]
    fn recall_pools_the_informed_choices_of_all_episodes() {
        let r = RlEval::of(&[episode(2, 3, 3), episode(3, 1, 0), episode(1, 0, 0)], vec![], true);
        assert_eq!(r.recall, Some(0.75), "3 of 4 informed choices, not the mean of 100% and 0%");
        assert_eq!(r.mean_rooms, Some(2.0));
        assert!(r.line().contains("recall 75.0%"));
        assert_eq!(RlEval::of(&[episode(1, 0, 0)], vec![], true).recall, None, "no informed choice");
        assert_eq!(RlEval::of(&[episode(0, 2, 1)], vec![], false).recall, None, "not a portal");
    }
}
