//! The run loop both trainers share: the language-model trainer ([`crate::train`]) and
//! the gridworld trainer ([`crate::rl::train`]) each describe one run as a `Looped`, and
//! `drive` steps it, logging, evaluating, checkpointing and stopping when `Due` says,
//! and writing a checkpoint before it stops on a signal.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::folder::Intent;
use super::signals::Signals;
use lethe_core::config::{Config, TrainConfig};
use lethe_core::dist::ProcessGroup;
use lethe_core::error::{LetheError, Result};
use lethe_core::optim::learning_rate;
use lethe_core::rng::{seed_torch, Rng, TorchSeed};

/// How to run `train`, beyond the config.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// Parent of the run folder (`<out>/<name>`). Default `runs`.
    pub out_dir: PathBuf,
    /// Continue from the run folder's checkpoint.
    pub resume: bool,
    /// Start over even if the run folder holds a checkpoint.
    pub overwrite: bool,
    /// Print nothing on the terminal.
    pub quiet: bool,
    /// Stop (with a checkpoint) after this step, as if interrupted; `--resume` goes on.
    pub stop_after: Option<usize>,
    /// Evaluate never, not even at the end (`--no-eval`: a smoke run of a large preset).
    pub no_eval: bool,
    /// Resume under changed optimisation settings (`--accept-changes`).
    pub accept_changes: bool,
}

impl TrainOptions {
    /// What these options ask of the run folder.
    pub fn intent(&self) -> Intent {
        Intent {
            resume: self.resume,
            overwrite: self.overwrite,
            stop_after: self.stop_after,
            accept_changes: self.accept_changes,
        }
    }
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            out_dir: PathBuf::from("runs"),
            resume: false,
            overwrite: false,
            quiet: false,
            stop_after: None,
            no_eval: false,
            accept_changes: false,
        }
    }
}

/// A training run as the loop sees it: the language-model run and the gridworld run.
pub trait Looped {
    /// What the steps since the last progress line sum up.
    type Window: Default;
    /// What an evaluation returns.
    type Eval;

    /// Optimiser steps taken.
    fn step(&self) -> usize;
    /// Whether progress output is off.
    fn quiet(&self) -> bool;
    /// One optimiser step, summed into `window`; returns its loss.
    fn train_step(&mut self, window: &mut Self::Window) -> Result<f64>;
    /// Prints and logs the progress over `window`, which took `seconds`.
    fn log_progress(&mut self, window: &Self::Window, seconds: f64) -> Result<()>;
    /// Evaluates, prints and logs.
    fn evaluate(&mut self) -> Result<Self::Eval>;
    /// Writes the checkpoint.
    fn save_checkpoint(&mut self) -> Result<()>;
    /// The step of the last checkpoint written (or resumed from), if any.
    fn last_checkpoint(&self) -> Option<usize>;
    /// The run folder.
    fn dir(&self) -> &Path;

    /// The data-parallel group, under torchrun with more than one rank.
    fn group(&self) -> Option<&ProcessGroup> {
        None
    }

    /// Whether `flag` holds on any rank of a data-parallel run (on every rank the same
    /// answer, so that all take the same branch); `flag` itself on a single process.
    fn agree(&self, flag: bool) -> Result<bool> {
        self.group().map_or(Ok(flag), |g| g.any(flag))
    }

    /// Prints a progress line on stderr unless quiet. A closed stderr (`2>&1 | head`)
    /// drops the line: the metrics file has it, and training goes on.
    fn say(&self, line: &str) {
        if !self.quiet() {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    }
}

/// The training loop: step; then log, evaluate, checkpoint and stop when [`Due`] says;
/// until `cfg.steps`. Returns the losses of the steps run and the last evaluation.
///
/// A first SIGINT, SIGTERM or SIGHUP lets the step finish, writes a checkpoint and
/// returns [`LetheError::Interrupted`]; a second one exits at once.
pub fn drive<R: Looped>(run: &mut R, cfg: &TrainConfig, opts: &TrainOptions) -> Result<(Vec<f64>, Option<R::Eval>)> {
    let signals = Signals::watch()?;
    let (mut losses, mut last_eval) = (vec![], None);
    let mut window = R::Window::default();
    let mut clock = Instant::now();
    while run.step() < cfg.steps {
        losses.push(run.train_step(&mut window)?);
        let received = signals.received();
        if run.agree(received.is_some())? {
            let signal = received.unwrap_or_else(|| "a signal to another rank".to_string());
            run.say(&format!(
                "{signal}: writing a checkpoint after step {} (another signal stops at once)",
                run.step()
            ));
            save(run)?;
            return Err(LetheError::Interrupted { signal, step: run.step(), dir: run.dir().to_path_buf() });
        }
        let due = Due::after(run.step(), cfg, opts);
        if due.log {
            let seconds = clock.elapsed().as_secs_f64();
            or_save(run, |run| run.log_progress(&window, seconds))?;
            window = R::Window::default();
            clock = Instant::now();
        }
        // The checkpoint first: an evaluation that fails (a GPU out of memory, a bad
        // validation file) must not lose the steps since the last one.
        if due.checkpoint {
            save(run)?;
        }
        if due.eval {
            last_eval = Some(or_save(run, R::evaluate)?);
        }
        if due.stop {
            run.say(&format!("stopped after step {} as asked; continue with --resume", run.step()));
            break;
        }
    }
    Ok((losses, last_eval))
}

/// Writes `run`'s checkpoint; a failure (a full disk) says which step was not written
/// and what the folder still holds to resume from.
fn save<R: Looped>(run: &mut R) -> Result<()> {
    run.save_checkpoint().map_err(|e| {
        let file = run.dir().join(lethe_core::checkpoint::FILE_NAME);
        let kept = match run.last_checkpoint() {
            Some(at) => {
                format!("`{}` still holds step {at}'s: --resume continues from it once there is room", file.display())
            }
            None => format!("No checkpoint had been written before it in `{}`", run.dir().display()),
        };
        LetheError::CheckpointNotWritten { step: run.step(), error: e.to_string(), kept }
    })
}

/// Runs `part` of the loop (logging, evaluating). When it fails (a full disk under the
/// metrics, a validation file gone), the steps since the last checkpoint are saved
/// first where that can be done alone (one process: in a data-parallel run the other
/// ranks would wait for this one's collectives), and the error says what the run
/// folder holds.
fn or_save<R: Looped, T>(run: &mut R, part: impl FnOnce(&mut R) -> Result<T>) -> Result<T> {
    let error = match part(run) {
        Ok(done) => return Ok(done),
        Err(e) => e.to_string(),
    };
    let file = run.dir().join(lethe_core::checkpoint::FILE_NAME);
    let kept = match run.last_checkpoint() {
        Some(at) if at == run.step() => format!("`{}` holds this step: continue with --resume", file.display()),
        _ if run.group().is_none() => match save(run) {
            Ok(()) => format!("its checkpoint is written in `{}`: continue with --resume", file.display()),
            Err(not) => not.to_string(),
        },
        Some(at) => format!("`{}` holds step {at}'s: --resume continues from it", file.display()),
        None => format!("no checkpoint had been written in `{}`", run.dir().display()),
    };
    Err(LetheError::StepFailed { step: run.step(), error, kept })
}

/// What the loop does after an optimiser step (shared by the language-model and the
/// gridworld loops).
struct Due {
    /// Print and log progress.
    pub log: bool,
    /// Evaluate.
    pub eval: bool,
    /// Write a checkpoint.
    pub checkpoint: bool,
    /// Stop here (`--stop-after`).
    pub stop: bool,
}

impl Due {
    /// After optimiser step `step` (counted from 1): every `log_every`, `eval_every` and
    /// `checkpoint_every` steps (0: never), and all three at the last step or a stop;
    /// no evaluation at all with `--no-eval`.
    fn after(step: usize, cfg: &TrainConfig, opts: &TrainOptions) -> Due {
        let stop = opts.stop_after == Some(step);
        let last = step == cfg.steps || stop;
        let every = |n: usize| n > 0 && step.is_multiple_of(n);
        let eval = !opts.no_eval && (every(cfg.eval_every) || last);
        Due { log: every(cfg.log_every) || last, eval, checkpoint: every(cfg.checkpoint_every) || last, stop }
    }
}

/// The learning rate and the weight of the memories' auxiliary loss at one optimiser step.
#[derive(Clone, Copy, Debug)]
pub struct Scales {
    /// Learning rate ([`learning_rate`]).
    pub lr: f64,
    /// Weight of the memories' auxiliary loss ([`lethe_core::config::MemoryConfig::aux_scale`]).
    pub aux: f64,
}

/// The line a training run opens with: what trains (and `how`, as " by actor-critic",
/// or nothing), its memory, size, device and folder.
pub fn opening_line(cfg: &Config, how: &str, parameters: usize, device: tch::Device, dir: &Path) -> String {
    format!(
        "lethe: training `{}`{how}: {} memory, span {} | {} layers x {} | {} parameters | {} | run folder {}",
        cfg.name,
        cfg.memory.mechanism.name(),
        cfg.memory.span,
        cfg.model.layers,
        cfg.model.d_model,
        lethe_core::metrics::format_count(parameters as f64),
        lethe_core::device::name(device),
        dir.display()
    )
}

/// Makes every rank's parameters the root's: identical already (the same seed or
/// checkpoint), made certain, as DDP does. Nothing without a process group.
pub fn broadcast_parameters(group: Option<&ProcessGroup>, named: Vec<(String, tch::Tensor)>) -> Result<()> {
    let Some(g) = group else { return Ok(()) };
    let params: Vec<_> = named.into_iter().map(|(_, t)| t).collect();
    g.broadcast_from_root(&params)
}

/// Starts optimiser step `step` (0-based) of the run `cfg`: seeds libtorch's generator
/// (dropout, Expire-Span's span noise) for it, so that a resumed run draws what a
/// straight run does, and returns the step's scales with the seeded section, to be
/// held until the step's last draw (see [`lethe_core::rng::seed_torch`]).
pub fn begin_step(cfg: &Config, step: usize) -> (Scales, TorchSeed) {
    let seed = seed_torch((Rng::derive(cfg.seed, step as u64).next_u64() >> 1) as i64);
    (Scales { lr: learning_rate(&cfg.train, step), aux: cfg.memory.aux_scale(step) }, seed)
}

/// Fails with [`LetheError::NonFiniteLoss`] for the first of `values` (step `step`'s
/// loss and gradient figures) that is not finite, saying what `folder` keeps: the
/// checkpoint of step `last_checkpoint`, or none yet.
pub fn check_finite(values: &[f64], step: usize, last_checkpoint: Option<usize>, dir: &Path) -> Result<()> {
    let Some(&value) = values.iter().find(|v| !v.is_finite()) else { return Ok(()) };
    let advice = "Lower the learning rate or raise the warm-up";
    let kept = match last_checkpoint {
        Some(at) => format!(
            "The last good checkpoint (step {at}) is kept in `{}`. {advice}, then resume.",
            dir.join(lethe_core::checkpoint::FILE_NAME).display()
        ),
        None => format!(
            "No checkpoint had been written yet, so there is nothing to resume in `{}`. {advice}, then start again.",
            dir.display()
        ),
    };
    Err(LetheError::NonFiniteLoss { step, value, kept })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that records what the loop asks of it, and whose evaluation fails.
    struct Recorder {
        step: usize,
        calls: Vec<String>,
        dir: PathBuf,
        /// The step whose checkpoint fails to be written, if any.
        full_at: Option<usize>,
        saved: Option<usize>,
    }

    impl Recorder {
        fn new() -> Recorder {
            Recorder { step: 0, calls: vec![], dir: PathBuf::from("runs/x"), full_at: None, saved: None }
        }
    }

    impl Looped for Recorder {
        type Window = ();
        type Eval = ();

        fn step(&self) -> usize {
            self.step
        }
        fn quiet(&self) -> bool {
            true
        }
        fn train_step(&mut self, _: &mut ()) -> Result<f64> {
            self.step += 1;
            self.calls.push(format!("step {}", self.step));
            Ok(1.0)
        }
        fn log_progress(&mut self, _: &(), _: f64) -> Result<()> {
            Ok(())
        }
        fn evaluate(&mut self) -> Result<()> {
            self.calls.push("evaluate".into());
            Err(LetheError::Invalid("the validation data went away".into()))
        }
        fn save_checkpoint(&mut self) -> Result<()> {
            self.calls.push(format!("checkpoint {}", self.step));
            if self.full_at == Some(self.step) {
                return Err(LetheError::Invalid("No space left on device".into()));
            }
            self.saved = Some(self.step);
            Ok(())
        }
        fn last_checkpoint(&self) -> Option<usize> {
            self.saved
        }
        fn dir(&self) -> &Path {
            &self.dir
        }
    }

    /// A checkpoint that cannot be written stops the run, naming the step it lost and
    /// the step the folder still holds.
    #[test]
    fn a_checkpoint_not_written_names_the_one_kept() {
        let mut run = Recorder { full_at: Some(4), ..Recorder::new() };
        let cfg = TrainConfig { steps: 6, eval_every: 0, checkpoint_every: 2, ..TrainConfig::default() };
        let e = drive(&mut run, &cfg, &TrainOptions::default()).unwrap_err().to_string();
        assert!(e.contains("the checkpoint of step 4 was not written: No space left"), "{e}");
        assert!(e.contains("still holds step 2's") && e.contains("runs/x/checkpoint.safetensors"), "{e}");
        let mut first = Recorder { full_at: Some(2), ..Recorder::new() };
        let e = drive(&mut first, &cfg, &TrainOptions::default()).unwrap_err().to_string();
        assert!(e.contains("No checkpoint had been written before it"), "{e}");
    }

    /// An evaluation that fails between checkpoints must not cost the steps since the
    /// last one: they are saved, and the error says so; where the disk is full for the
    /// checkpoint too, the error says which step the folder still holds.
    #[test]
    fn a_failed_evaluation_saves_the_steps_since_the_last_checkpoint() {
        let cfg = TrainConfig { steps: 9, eval_every: 3, checkpoint_every: 2, ..TrainConfig::default() };
        let mut run = Recorder::new();
        let e = drive(&mut run, &cfg, &TrainOptions::default()).unwrap_err().to_string();
        assert_eq!(run.calls, ["step 1", "step 2", "checkpoint 2", "step 3", "evaluate", "checkpoint 3"]);
        assert!(e.starts_with("training stopped after step 3: the validation data went away;"), "{e}");
        assert!(e.contains("its checkpoint is written in `runs/x/checkpoint.safetensors`"), "{e}");
        let mut full = Recorder { full_at: Some(3), ..Recorder::new() };
        let e = drive(&mut full, &cfg, &TrainOptions::default()).unwrap_err().to_string();
        assert!(e.contains("went away; the checkpoint of step 3 was not written"), "{e}");
        assert!(e.contains("still holds step 2's"), "{e}");
    }

    /// An evaluation that fails at the end must not cost the steps since the last
    /// checkpoint: the last step's checkpoint is written before it.
    #[test]
    fn the_last_checkpoint_is_written_before_the_final_evaluation() {
        let mut run = Recorder::new();
        let cfg = TrainConfig { steps: 3, eval_every: 0, checkpoint_every: 0, ..TrainConfig::default() };
        let e = drive(&mut run, &cfg, &TrainOptions::default()).unwrap_err();
        assert!(e.to_string().contains("went away") && e.to_string().contains("holds this step"), "{e}");
        assert_eq!(run.calls, ["step 1", "step 2", "step 3", "checkpoint 3", "evaluate"]);
    }
}
