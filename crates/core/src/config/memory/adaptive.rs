//! `[memory.adaptive]`: Adaptive-Span's settings (Sukhbaatar et al., 2019), with their
//! validation.

use serde::{Deserialize, Serialize};

use crate::config::check::{non_negative, positive};
use crate::error::{LetheError, Result};

/// Adaptive-Span (Sukhbaatar et al., 2019; docs/design/algorithms.md, Baselines).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptiveConfig {
    /// Ramp length `R` of the soft mask over distance, in tokens. Default 32.
    pub ramp: usize,
    /// Coefficient of the span loss `coef * L * mean(z)`. Default 2e-6.
    pub loss_coef: f64,
    /// Initial span ratio `z` of every head, in [0, 1]. Default 0.
    pub init_ratio: f64,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig { ramp: 32, loss_coef: 2e-6, init_ratio: 0.0 }
    }
}

impl AdaptiveConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        positive("memory.adaptive.ramp", self.ramp)?;
        non_negative("memory.adaptive.loss_coef", self.loss_coef)?;
        if !(0.0..=1.0).contains(&self.init_ratio) {
            return Err(LetheError::config("memory.adaptive.init_ratio", self.init_ratio, "must be in [0, 1]"));
        }
        Ok(())
    }
}
