//! What lethe knows about a task, as one trait: where its tokens (or episodes) come from,
//! how it is described, which figure says how well it is solved, and which of the
//! options every task takes (`--length`, `--distance`) it accepts, in its own unit.
//!
//! Each task implements [`Task`] in its own file (`data/tasks/*.rs`, `data/bytes.rs`,
//! `rl/corridor.rs`, `rl/portal.rs`); [`crate::task::of`] is the registry.

use crate::seq::{Split, SplitData};
use crate::stream::{GeneratedStreams, TrainStreams};
use crate::tasks::{check_sizes, eval_split, Generator};
use lethe_core::config::{Config, DataConfig};
use lethe_core::error::{LetheError, Result};

/// The figure that says how well a task is solved (the quality axis of `lethe sweep`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Share of answers entirely right, in percent (copy, instruction).
    Answers,
    /// Share of scored tokens wrong, in percent (collision: chance is 75%).
    Error,
    /// Token accuracy on the scored tokens, in percent (sorting).
    Accuracy,
    /// Bits per byte (byte corpora).
    Bpb,
    /// Perplexity per word of the raw text (Wikitext).
    WordPerplexity,
    /// Share of episodes that reach the goal, in percent (corridor).
    Success,
    /// Rooms reached per episode (portal).
    Rooms,
}

impl Metric {
    /// The column name (`answers %`, `bpb`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Metric::Answers => "answers %",
            Metric::Error => "error %",
            Metric::Accuracy => "accuracy %",
            Metric::Bpb => "bpb",
            Metric::WordPerplexity => "word ppl",
            Metric::Success => "success %",
            Metric::Rooms => "rooms",
        }
    }

    /// Whether a larger figure is better.
    pub fn higher_is_better(self) -> bool {
        !matches!(self, Metric::Error | Metric::Bpb | Metric::WordPerplexity)
    }
}

/// A task lethe can train on. The defaults fit a generated task: give
/// [`Task::generator`] and the streams and splits follow.
pub trait Task: Sync {
    /// The name in messages (`copy`, `corridor`, ...).
    fn name(&self) -> &'static str;

    /// One line on the data the config describes, for the training header.
    fn describe(&self, d: &DataConfig) -> String;

    /// The figure that says how well the task is solved.
    fn metric(&self) -> Metric;

    /// Sets `--length N` in the task's unit; false when the task takes no length.
    fn set_length(&self, _d: &mut DataConfig, _n: usize) -> bool {
        false
    }

    /// Sets `--distance MIN-MAX` in the task's unit; false when the task takes none.
    fn set_distance(&self, _d: &mut DataConfig, _min: usize, _max: usize) -> bool {
        false
    }

    /// The episode generator of a generated task, with the tokens of each of its
    /// fixed validation and test streams; `None` for corpora and gridworlds.
    fn generator(&self, _d: &DataConfig) -> Option<(Box<dyn Generator>, usize)> {
        None
    }

    /// [`Task::generator`], or why there is none: a task whose settings can be wrong in
    /// ways only the generator sees says so here; by default, not a token stream.
    fn checked_generator(&self, d: &DataConfig) -> Result<(Box<dyn Generator>, usize)> {
        self.generator(d).ok_or_else(|| self.not_a_stream())
    }

    /// Whether the task is played as episodes by an agent (actor-critic), not read as tokens.
    fn is_episodic(&self) -> bool {
        false
    }

    /// One split as `batch` documents. A generated task draws valid and test from seeds of
    /// their own (fixed streams) and train from a third, used only by `eval --split train`.
    fn load_split(&self, cfg: &Config, split: Split, batch: usize) -> Result<SplitData> {
        let (generator, tokens) = self.checked_generator(&cfg.data)?;
        check_sizes(generator.as_ref(), batch, tokens, &format!("data.{}.eval_tokens", self.name()))?;
        Ok(eval_split(generator.as_ref(), self.name(), cfg.data_seed(), split, batch, tokens))
    }

    /// The `batch` training streams, positioned at the start.
    fn train_streams(&self, cfg: &Config, batch: usize) -> Result<TrainStreams> {
        let (generator, tokens) = self.checked_generator(&cfg.data)?;
        check_sizes(generator.as_ref(), batch, tokens, &format!("data.{}.eval_tokens", self.name()))?;
        Ok(TrainStreams::Generated(GeneratedStreams::new(generator, cfg.data_seed(), batch, cfg.train.block)))
    }

    /// The error for asking a task without a token stream for tokens.
    fn not_a_stream(&self) -> LetheError {
        LetheError::Invalid(format!(
            "`{}` is a reinforcement-learning task: it has episodes, not a token stream (train it with `lethe train`, evaluate it with `lethe eval`)",
            self.name()
        ))
    }
}
