//! The settings of the generated tasks and the gridworlds, one section each under
//! `[data.<task>]`. The tasks themselves live in `data/tasks/` and `rl/`; their settings
//! live here, at the bottom of the crate, so that the config knows nothing above it.

use serde::{Deserialize, Serialize};

/// The characters the instruction task knows (`data.instruction.characters` takes the first n).
pub const INSTRUCTION_CHARACTERS: usize = 40;

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
        InstructionConfig { characters: 40, queue_max: 3, distance_min: 700, distance_max: 1200, greet_rate: 0.05, eval_tokens: 1 << 18 }
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
