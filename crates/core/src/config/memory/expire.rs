//! `[memory.expire]`: Expire-Span's settings (Sukhbaatar et al., 2021), with their
//! validation.

use serde::{Deserialize, Serialize};

use crate::config::check::{non_negative, positive, positive_number};
use crate::error::{LetheError, Result};

/// Expire-Span (paper section 4; docs/design/algorithms.md, Expire-Span).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExpireConfig {
    /// Ramp length `R` of the soft mask, in tokens (Eq. 5). Default 16.
    pub ramp: usize,
    /// Coefficient `alpha` of the span loss (Eq. 7). Default 1e-6.
    pub alpha: f64,
    /// Span-loss warm-up, in optimiser steps: `alpha` rises linearly from `alpha / n` at
    /// the first step to `alpha` at step `n`. With a normalising optimiser (Adam,
    /// RMSProp) the span loss alone sets the predictor's step size until the task's
    /// gradient reaches it, and shrinks every span before the model has learnt what to
    /// keep (measured on the corridor, README). Default 0: no warm-up (the paper).
    pub alpha_warmup: usize,
    /// Initial span as a fraction `p` of `L`: the bias starts at `-ln(1/p - 1)`. Default 0.1.
    pub init_fraction: f64,
    /// Divisor of the predictor's logit, `e = L sigmoid((w.h + b) / pre_div)`; the paper's
    /// Eq. 8 uses `R` for very large `L`. Default 1 (Eq. 3).
    pub pre_div: f64,
    /// Random span shortening in training: once per block, spans are clamped to `u L`,
    /// `u ~ U(0, 1)`, for the mask and the loss (paper 4.2). Default false.
    pub noisy: bool,
    /// How expired memories are deleted: `stream` (each stream keeps only its live
    /// memories, padded to the longest stream), `batch` (the official code: the batch
    /// minimum, rounded down to a multiple of the block) or `off` (keep the last `L + R`,
    /// beyond which nothing can be seen; for checking). Default `stream`.
    pub deletion: Deletion,
    /// At evaluation and generation, clamp spans to this many tokens (0: no cap; paper
    /// Fig. 9). Default 0.
    pub inference_cap: usize,
    /// The most memories a layer keeps per stream between blocks (0: as many as the
    /// spans keep). Where the spans would keep more, those with the least remaining span
    /// `e + R - t` (the soonest to expire) are deleted first: a hard cap, so that
    /// Expire-Span can be compared with the key-value cache policies at the same memory.
    /// The kept count is reported beside it (`kept`). Needs `deletion = "stream"`.
    /// Default 0.
    pub budget: usize,
    /// The memories a layer the span loss steers toward in training (0: none). After
    /// every optimiser step the span loss's weight becomes `alpha f (m / target)`, `m`
    /// the memories a query saw (the training log's `mem`) averaged over the layers,
    /// micro-batches and ranks, and `f` (starting at 1) is multiplied by `(m /
    /// target)^target_rate`: a proportional-integral controller, each factor within 1e-3
    /// and 1e3. The memory then settles about the target, so that a fit can be set to the
    /// memory to compare at without a search over `alpha`. Spans shrink under the loss
    /// faster than the task grows them back, so start from an `alpha` below the one the
    /// target needs (where the task wants less memory than the target, the spans end
    /// below it). The weight reached is logged (`alpha`) and kept in checkpoints. Needs
    /// `alpha` above 0. Default 0.
    pub target: f64,
    /// How fast `target`'s integral factor moves: the power of `m / target` it is
    /// multiplied by each step. Default 0.05.
    pub target_rate: f64,
    /// One span predictor per key-value head (beyond the paper, which shares one per
    /// layer across its heads): each head masks a memory by its own span, the span loss
    /// is the heads' mean, and a memory is deleted once no head can see it (its largest
    /// span has expired), so the cache still holds a memory's state once. On a
    /// Llama-family layer with grouped queries, the query heads of a group share their
    /// key-value head's span. The attention then runs the written-out operations (the
    /// fused paths below take one span a memory). Default false.
    pub per_head: bool,
    /// On the CPU, build the attention scores (mask, relative positions, the span loss's
    /// ramp counts) with lethe's fused kernel (`csrc/expire_scores.cpp`) instead of a dozen
    /// tensor operations: the same function to float rounding, fewer passes over memory.
    /// Without attention dropout the kernel runs the whole attention stream by stream,
    /// over each stream's own keys (the padding of the compacted cache left out), with
    /// the span loss, and the keys, values and span scores are projected from each
    /// stream's kept rows only (`csrc/cache_grad.cpp`).
    /// On a GPU, the mask, positions and ramp counts come from lethe's CUDA kernels
    /// (`liblethe_cuda.so`, `scripts/build-cuda.sh`) as one bias for libtorch's fused
    /// attention, when the library is found. `false` runs the written-out operations
    /// (the reference) on either device; a Llama-family layer, whose keys are rotated
    /// rather than given learned positions, always does.
    /// Default true.
    pub fused: bool,
    /// Compute what the official code (facebookresearch/transformer-sequential) computes,
    /// where it differs from lethe's reading of the paper: a token does not attend to
    /// itself, each stream's cache starts as `M` zero states at distances `M..1`, the
    /// cache holds each layer's raw input and the current pre-norm is applied to all of
    /// it every block (so the norm gets gradient through the cache), and `pre_div`
    /// divides `w.h` but not the bias. With it, lethe's losses and gradient norms equal
    /// the official code's to float rounding from the same weights
    /// (`scripts/vs-official-steps.sh`); over a training pass the two readings learn
    /// alike (README). Not with episodes. Default false.
    pub as_official: bool,
}

/// Expire-Span's deletion policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Deletion {
    /// Per-stream compaction: every stream keeps exactly the memories the next block's
    /// first query still sees, the block just read included (paper 4.1).
    Stream,
    /// The official batch-minimum policy: the dead prefix common to every stream, in
    /// whole blocks, never the block just read.
    Batch,
    /// No deletion beyond the `L + R` window.
    Off,
}

impl Default for ExpireConfig {
    fn default() -> Self {
        ExpireConfig {
            ramp: 16,
            alpha: 1e-6,
            alpha_warmup: 0,
            init_fraction: 0.1,
            pre_div: 1.0,
            noisy: false,
            deletion: Deletion::Stream,
            inference_cap: 0,
            budget: 0,
            target: 0.0,
            target_rate: 0.05,
            per_head: false,
            fused: true,
            as_official: false,
        }
    }
}

impl ExpireConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        positive("memory.expire.ramp", self.ramp)?;
        non_negative("memory.expire.alpha", self.alpha)?;
        if !(self.init_fraction > 0.0 && self.init_fraction < 1.0) {
            return Err(LetheError::config("memory.expire.init_fraction", self.init_fraction, "must be in (0, 1)"));
        }
        positive_number("memory.expire.pre_div", self.pre_div)?;
        non_negative("memory.expire.target", self.target)?;
        positive_number("memory.expire.target_rate", self.target_rate)?;
        if self.target > 0.0 && self.alpha == 0.0 {
            return Err(LetheError::config(
                "memory.expire.target",
                self.target,
                "steers the span loss's weight from memory.expire.alpha, which is 0: give alpha a starting value",
            ));
        }
        if self.budget > 0 && self.deletion != Deletion::Stream {
            return Err(LetheError::config(
                "memory.expire.budget",
                self.budget,
                "a cap on the memories kept needs deletion = \"stream\" (each stream keeps its own)",
            ));
        }
        Ok(())
    }
}
