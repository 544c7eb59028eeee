//! The actor-critic settings of the reinforcement-learning runs (`[rl]`).

use serde::{Deserialize, Serialize};

use crate::error::{LetheError, Result};

/// The most episodes one evaluation or `lethe play` plays (`rl.eval_episodes`,
/// `--episodes`): a million takes hours at the smallest size.
pub const MAX_EPISODES: usize = 1_000_000;

/// Actor-critic settings (paper A.3.1: truncation window `train.block` = 100, entropy
/// cost 0.0005).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlConfig {
    /// Discount `γ` per step, in [0, 1]. Default 0.99 (the portal presets use the paper's 0.98).
    pub gamma: f64,
    /// Weight of the entropy bonus. Default 0.0005 (paper).
    pub entropy_coef: f64,
    /// Weight of the value (critic) loss `½ (R - V)²`. Default 0.5.
    pub value_coef: f64,
    /// Episodes played at each evaluation (rounded up to whole batches). Default 256.
    pub eval_episodes: usize,
    /// When the memory is reset, in training and evaluation. Default `episode`.
    pub reset: Reset,
}

/// When an actor-critic run resets the memory of a row of its batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reset {
    /// At every episode's end (the paper's rule): each row of the batch plays episodes
    /// back to back, a new one starting at the step after the last one ended, and a
    /// position sees only memories of its own episode. Needs a mechanism that keeps
    /// episodes apart: fixed, adaptive or expire.
    Episode,
    /// When the batch's last episode ends: the batch's episodes start together with an
    /// empty memory, and those that end early wait, idle, for the others. Works with
    /// every mechanism, at the price of the idle steps.
    Batch,
}

impl Default for RlConfig {
    fn default() -> Self {
        RlConfig { gamma: 0.99, entropy_coef: 5e-4, value_coef: 0.5, eval_episodes: 256, reset: Reset::Episode }
    }
}

impl RlConfig {
    /// Checks every field; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.gamma) {
            return Err(LetheError::config("rl.gamma", self.gamma, "must be in [0, 1]"));
        }
        for (field, v) in [("rl.entropy_coef", self.entropy_coef), ("rl.value_coef", self.value_coef)] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(LetheError::config(field, v, "must be a non-negative number"));
            }
        }
        if self.eval_episodes == 0 {
            return Err(LetheError::config("rl.eval_episodes", 0, "must be positive"));
        }
        if self.eval_episodes > MAX_EPISODES {
            return Err(LetheError::config(
                "rl.eval_episodes",
                self.eval_episodes,
                format!("must be at most {MAX_EPISODES}"),
            ));
        }
        Ok(())
    }
}
