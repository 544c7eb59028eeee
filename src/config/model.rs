//! `[model]`: the decoder-only, block-recurrent transformer every mechanism shares.

use serde::{Deserialize, Serialize};

use super::check::positive;
use crate::error::{LetheError, Result};

/// The decoder-only, block-recurrent transformer (shared by every memory mechanism).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Vocabulary size in tokens. Byte streams use 256. Default 256.
    pub vocab: usize,
    /// Number of transformer layers. Default 2.
    pub layers: usize,
    /// Hidden size (model width). Must be divisible by `heads`. Default 64.
    pub d_model: usize,
    /// Attention heads per layer. Default 4.
    pub heads: usize,
    /// Inner size of the feed-forward sublayer. Default 256.
    pub d_ffn: usize,
    /// Dropout probability on attention weights and sublayer outputs, in [0, 1). Default 0.
    pub dropout: f64,
    /// Pre-norm (LayerNorm before each sublayer, plus a final one) when true; post-norm
    /// (LayerNorm after each residual, as in the adaptive-span code) when false. Default true.
    pub pre_norm: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig { vocab: 256, layers: 2, d_model: 64, heads: 4, d_ffn: 256, dropout: 0.0, pre_norm: true }
    }
}

impl ModelConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if self.vocab < 256 {
            return Err(LetheError::config("model.vocab", self.vocab, "must be at least 256: every data source yields bytes"));
        }
        self.validate_layers()
    }

    /// Everything but the vocabulary.
    pub fn validate_layers(&self) -> Result<()> {
        positive("model.layers", self.layers)?;
        positive("model.heads", self.heads)?;
        positive("model.d_model", self.d_model)?;
        positive("model.d_ffn", self.d_ffn)?;
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(LetheError::config(
                "model.d_model",
                self.d_model,
                format!("must be divisible by model.heads = {}", self.heads),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(LetheError::config("model.dropout", self.dropout, "must be in [0, 1)"));
        }
        Ok(())
    }
}
