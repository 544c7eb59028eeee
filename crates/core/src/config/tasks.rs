//! The settings of the generated tasks and the gridworlds, one section each under
//! `[data.<task>]`. The tasks themselves live in `data/tasks/` and `rl/`; their settings
//! live here, at the bottom of the crate, so that the config knows nothing above it.

use serde::{Deserialize, Serialize};

use super::check::{not_below, positive, positive_number, probability};
use crate::error::{LetheError, Result};

/// The characters the instruction task knows (`data.instruction.characters` takes the first n).
pub const INSTRUCTION_CHARACTERS: usize = 40;

/// The copy task of the Expire-Span paper (Table 1): a run of `A`s, a long stretch of
/// `B`s, then `=` and the model must write as many `a`s as it saw `A`s, then `.`.
/// Only the answer (the `a`s and the `.` after `=`) is scored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyConfig {
    /// Smallest number of `A`s in a run. Default 1.
    pub count_min: usize,
    /// Largest number of `A`s in a run. Default 8.
    pub count_max: usize,
    /// Smallest number of filler `B`s between the run and the question. Default 40.
    pub distance_min: usize,
    /// Largest number of filler `B`s (up to 131072 = 128k). Default 100.
    pub distance_max: usize,
    /// Tokens in each of the generated validation and test streams. Default 16384.
    pub eval_tokens: usize,
}

impl Default for CopyConfig {
    fn default() -> Self {
        CopyConfig { count_min: 1, count_max: 8, distance_min: 40, distance_max: 100, eval_tokens: 16384 }
    }
}

impl CopyConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        positive("data.copy.count_min", self.count_min)?;
        not_below("data.copy.count_max", self.count_max, "data.copy.count_min", self.count_min)?;
        not_below("data.copy.distance_max", self.distance_max, "data.copy.distance_min", self.distance_min)?;
        if self.distance_max > 1 << 17 {
            return Err(LetheError::config(
                "data.copy.distance_max",
                self.distance_max,
                "must be at most 131072 (128k)",
            ));
        }
        positive("data.copy.eval_tokens", self.eval_tokens)
    }
}

/// The collision task's parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CollisionConfig {
    /// The easy version: no colours, ask for the last collision. Default false.
    pub easy: bool,
    /// Simulation steps per episode (8 tokens each). Default 2000.
    pub steps: usize,
    /// Standard deviation of each velocity component, in cells per step. Default 0.5.
    pub speed: f64,
    /// Probability that a particle re-draws its colour at a step. Default 0.05.
    pub recolour: f64,
    /// Share of queries about the pair of the most recent collision. Default 0.4.
    pub match_share: f64,
    /// Tokens in each of the generated validation and test streams. Default 65536.
    pub eval_tokens: usize,
}

impl Default for CollisionConfig {
    fn default() -> Self {
        CollisionConfig { easy: false, steps: 2000, speed: 0.5, recolour: 0.05, match_share: 0.4, eval_tokens: 65536 }
    }
}

impl CollisionConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        positive("data.collision.steps", self.steps)?;
        positive("data.collision.eval_tokens", self.eval_tokens)?;
        probability("data.collision.recolour", self.recolour)?;
        probability("data.collision.match_share", self.match_share)?;
        positive_number("data.collision.speed", self.speed)
    }
}

/// The dialogue source's settings (CMU-DoG, ∞-former paper §4.3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DialogueConfig {
    /// Whether each conversation is preceded by its document. False gives the paper's
    /// "GPT-2 w/o doc" row of Table 2. Default true.
    pub document: bool,
    /// Whether the memory is emptied before every conversation, as the official code
    /// reads each conversation on its own: the streams then read one conversation each
    /// at a time, starting together, a shorter one padded (unscored) to the longest of
    /// its round. False reads the conversations one after another with the memory
    /// carried from one into the next. Default true.
    pub reset: bool,
}

impl Default for DialogueConfig {
    fn default() -> Self {
        DialogueConfig { document: true, reset: true }
    }
}

/// The instruction task's parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstructionConfig {
    /// Characters in play, the first n of lethe's 40 (at least 4). Default 40.
    pub characters: usize,
    /// Most instructions per episode (uniform from 1); several are pending at once. Default 3.
    pub queue_max: usize,
    /// Fewest distractor words between an instruction and its execution. Default 700.
    pub distance_min: usize,
    /// Most distractor words between an instruction and its execution. Default 1200
    /// (mean 950, as in the paper's LIGHT setting).
    pub distance_max: usize,
    /// Probability that a distractor sentence is followed by the arrival of a character
    /// with nothing pending, who is greeted (not scored). Default 0.05.
    pub greet_rate: f64,
    /// Tokens in each of the generated validation and test streams. Default 262144.
    pub eval_tokens: usize,
}

impl Default for InstructionConfig {
    fn default() -> Self {
        InstructionConfig {
            characters: 40,
            queue_max: 3,
            distance_min: 700,
            distance_max: 1200,
            greet_rate: 0.05,
            eval_tokens: 1 << 18,
        }
    }
}

impl InstructionConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let most = INSTRUCTION_CHARACTERS;
        if !(4..=most).contains(&self.characters) {
            return Err(LetheError::config(
                "data.instruction.characters",
                self.characters,
                format!("must be in 4..={most}"),
            ));
        }
        positive("data.instruction.queue_max", self.queue_max)?;
        if self.queue_max + 2 > self.characters {
            return Err(LetheError::config(
                "data.instruction.queue_max",
                self.queue_max,
                format!(
                    "must leave two characters free: at most data.instruction.characters - 2 = {}",
                    self.characters - 2
                ),
            ));
        }
        positive("data.instruction.distance_min", self.distance_min)?;
        not_below(
            "data.instruction.distance_max",
            self.distance_max,
            "data.instruction.distance_min",
            self.distance_min,
        )?;
        probability("data.instruction.greet_rate", self.greet_rate)?;
        positive("data.instruction.eval_tokens", self.eval_tokens)
    }
}

/// The sorting task's parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SortingConfig {
    /// Number of distinct symbols, 2 to 26 (the paper: 20). Default 20.
    pub symbols: usize,
    /// Length `T` of the sequence to sort, in symbols (the paper: 4000, 8000, 16000). Default 4000.
    pub length: usize,
    /// Tokens in each of the generated validation and test streams. Default 262144.
    pub eval_tokens: usize,
}

impl Default for SortingConfig {
    fn default() -> Self {
        SortingConfig { symbols: 20, length: 4000, eval_tokens: 1 << 18 }
    }
}

impl SortingConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(2..=26).contains(&self.symbols) {
            return Err(LetheError::config("data.sorting.symbols", self.symbols, "must be in 2..=26"));
        }
        positive("data.sorting.length", self.length)?;
        positive("data.sorting.eval_tokens", self.eval_tokens)
    }
}

/// The long-context suite as a training source (`data.source = "longctx"`): samples of
/// `lethe longeval`'s tasks, each followed by its answer, only the answer scored; the
/// asked needles at depths drawn uniformly. In bytes, or in the tokens of
/// `data.tokenizer`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LongctxConfig {
    /// The tasks drawn from, by name (as `lethe longeval --suite` names them). Default
    /// `["passkey", "niah_single_1"]`.
    pub tasks: Vec<String>,
    /// The samples' lengths in bytes (in tokens with `data.tokenizer`), one drawn per
    /// sample: train at short lengths and evaluate far beyond them with `lethe
    /// longeval`. Default `[512, 768, 1024]`.
    pub lengths: Vec<usize>,
    /// Training steps per stage of a curriculum over `lengths` (BABILong's advice): the
    /// shortest length alone for this many steps, then the two shortest, and so on, one
    /// length more per stage, each sample's length drawn among those reached; 0 draws
    /// from every length from the start. Validation always covers every length.
    /// Default 0.
    pub curriculum_steps: usize,
    /// Whether training scores every byte of a sample (language modelling of the
    /// haystack, the needles and the answer: a dense signal that small models trained
    /// from scratch learn retrieval from) rather than the answer alone; validation
    /// always scores the answers. Default false.
    pub train_on_context: bool,
    /// Tokens in each of the generated validation and test streams. Default 16384.
    pub eval_tokens: usize,
}

impl Default for LongctxConfig {
    fn default() -> Self {
        LongctxConfig {
            tasks: vec!["passkey".into(), "niah_single_1".into()],
            lengths: vec![512, 768, 1024],
            curriculum_steps: 0,
            train_on_context: false,
            eval_tokens: 1 << 14,
        }
    }
}

impl LongctxConfig {
    /// Checks every field for impossible values; the error names the field (the task
    /// names are checked by the generator, which knows them).
    pub fn validate(&self) -> Result<()> {
        if self.tasks.is_empty() {
            return Err(LetheError::config("data.longctx.tasks", "[]", "must name at least one task"));
        }
        if self.lengths.is_empty() || self.lengths.contains(&0) {
            return Err(LetheError::config(
                "data.longctx.lengths",
                format!("{:?}", self.lengths),
                "must be one or more positive lengths",
            ));
        }
        positive("data.longctx.eval_tokens", self.eval_tokens)
    }
}

/// The corridor task's parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorridorConfig {
    /// Shortest corridor, in cells (at least 2). Default 3 (paper).
    pub length_min: usize,
    /// Longest corridor, in cells. Default 200 (paper).
    pub length_max: usize,
    /// Steps after which an episode ends with no reward. Default 1000.
    pub max_steps: usize,
}

impl Default for CorridorConfig {
    fn default() -> Self {
        CorridorConfig { length_min: 3, length_max: 200, max_steps: 1000 }
    }
}

impl CorridorConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if self.length_min < 2 {
            return Err(LetheError::config(
                "data.corridor.length_min",
                self.length_min,
                "must be at least 2 (the object and the doors need their own cells)",
            ));
        }
        not_below("data.corridor.length_max", self.length_max, "data.corridor.length_min", self.length_min)?;
        positive("data.corridor.max_steps", self.max_steps)
    }
}

/// The portal task's parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PortalConfig {
    /// Rooms in the sequence (at least 2). Default 50 (paper).
    pub rooms: usize,
    /// Side of a room's floor, in cells (at least 2). Default 5 (paper).
    pub size: usize,
    /// Wrong doors in one room that end the episode. Default 2 (paper).
    pub mistakes: usize,
    /// Steps after which an episode ends. Default 1000 (paper).
    pub max_steps: usize,
}

impl Default for PortalConfig {
    fn default() -> Self {
        PortalConfig { rooms: 50, size: 5, mistakes: 2, max_steps: 1000 }
    }
}

impl PortalConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if self.rooms < 2 {
            return Err(LetheError::config("data.portal.rooms", self.rooms, "must be at least 2"));
        }
        if self.size < 2 {
            return Err(LetheError::config(
                "data.portal.size",
                self.size,
                "must be at least 2 (two doors in the top wall)",
            ));
        }
        positive("data.portal.mistakes", self.mistakes)?;
        positive("data.portal.max_steps", self.max_steps)
    }
}
