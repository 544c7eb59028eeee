//! `[memory.compressive]`: the Compressive Transformer's settings (Rae et al., 2020),
//! with their validation.

use serde::{Deserialize, Serialize};

use crate::config::check::{non_negative, positive};
use crate::error::Result;

/// Compressive Transformer (Rae et al., 2020; docs/design/algorithms.md, Baselines).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompressiveConfig {
    /// Compression rate `c`: states leaving the uncompressed memory are compressed `c`
    /// to one. Default 4.
    pub rate: usize,
    /// Compressed-memory size `C`: the newest `C` compressed slots are kept. Default 64.
    pub slots: usize,
    /// The compression function: `pool` (mean-pooling, the Expire-Span paper's baseline)
    /// or `conv` (a 1-D convolution of kernel and stride `c`, trained by the
    /// attention-reconstruction loss; the ∞-former paper's baseline). Default `pool`.
    pub compressor: Compressor,
    /// Weight of the attention-reconstruction loss (only with `conv`). Default 1.
    pub recon_coef: f64,
}

/// Compression functions of the Compressive Transformer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compressor {
    /// Mean of every `c` consecutive states.
    Pool,
    /// Learned 1-D convolution, kernel and stride `c`.
    Conv,
}

impl Default for CompressiveConfig {
    fn default() -> Self {
        CompressiveConfig { rate: 4, slots: 64, compressor: Compressor::Pool, recon_coef: 1.0 }
    }
}

impl CompressiveConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        positive("memory.compressive.rate", self.rate)?;
        positive("memory.compressive.slots", self.slots)?;
        non_negative("memory.compressive.recon_coef", self.recon_coef)
    }
}
