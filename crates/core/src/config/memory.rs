//! `[memory]`: how each layer remembers the past, the mechanism and the settings of each
//! (Transformer-XL, Expire-Span, Adaptive-Span, the Compressive Transformer, the
//! ∞-former), with their validation.

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::check::{non_negative, positive, positive_number};
use super::model::Arch;
use crate::error::{LetheError, Result};

/// Which memory mechanism each layer uses, and its size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// The mechanism: `fixed` (Transformer-XL), `expire` (Expire-Span), `adaptive`
    /// (Adaptive-Span), `compressive` (Compressive Transformer) or `infinity`
    /// (∞-former). Default `fixed`.
    pub mechanism: Mechanism,
    /// Maximum span `L` in tokens: a query sees itself and at most `L` earlier positions.
    /// For `fixed` this is also the number of cached states per layer; for `compressive`
    /// it is the uncompressed memory, before the compressed slots; for `infinity` it is
    /// the short-term memory, before the continuous long-term memory. Default 128.
    pub span: usize,
    /// Expire-Span's settings (used when `mechanism = "expire"`).
    #[serde(default)]
    pub expire: ExpireConfig,
    /// Adaptive-Span's settings (used when `mechanism = "adaptive"`).
    #[serde(default)]
    pub adaptive: AdaptiveConfig,
    /// The Compressive Transformer's settings (used when `mechanism = "compressive"`).
    #[serde(default)]
    pub compressive: CompressiveConfig,
    /// The ∞-former's settings (used when `mechanism = "infinity"`).
    #[serde(default)]
    pub infinity: InfinityConfig,
}

/// ∞-former (Martins et al., 2022; docs/design/algorithms.md, ∞-former). The short-term memory is
/// the last `memory.span` states; the states that leave it are absorbed into a
/// continuous long-term memory of `basis` coefficient vectors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InfinityConfig {
    /// Number of Gaussian basis functions `N` (must be a multiple of the number of
    /// widths). The paper's sorting runs use 1024. Default 128.
    pub basis: usize,
    /// Widths (standard deviations, on the `[0, 1]` axis) of the basis functions; each
    /// centre gets every width. Default `[0.01, 0.05]` (paper C.1).
    pub widths: Vec<f64>,
    /// Ridge penalty `λ` of the regression (Eq. 5). Default 1.
    pub ridge: f64,
    /// Fit on a grid padded with zeros to about `[-0.5, 1.5]`, as the official code does
    /// (it pulls the signal towards zero at the edges). Default false.
    pub pad: bool,
    /// Contraction `τ` in (0, 1): the old signal is squeezed into `(0, τ]`, the new
    /// states into `(τ, 1]` (Eq. 13). Default 0.75 (paper C.1).
    pub tau: f64,
    /// Number of points `M` at which the old signal is sampled at each update (Eq. 14).
    /// Default 512.
    pub samples: usize,
    /// Sticky memories (section 3.3): sample the old signal where the previous block's
    /// attention went, rather than evenly. Default false.
    pub sticky: bool,
    /// Number of histogram bins `D` over `[0, 1]` for sticky memories (Eq. 16). Default 128.
    pub bins: usize,
    /// Smooth the new states with the gate `x * sigmoid(conv1d_k3(x))` before the
    /// regression (Eq. 18). Default true.
    pub gate: bool,
    /// Lower bound of the attention variance `σ²`. Default 1e-4.
    pub min_var: f64,
    /// Weight of the KL regulariser on the attention variance (Eq. 20-22). Default 1e-5
    /// (paper C.1).
    pub kl_coef: f64,
    /// Standard deviation `σ0` of the KL regulariser's reference Gaussian. Default 0.05.
    pub sigma0: f64,
    /// Memory threshold: once the long-term memory has absorbed this many tokens it is
    /// emptied before the next absorption, so that it spans at most this many (the
    /// paper's GPT-2 runs: 2048, "the same computational budget" as a compressed memory
    /// of 512 slots at rate 4; the official code's `mem_threshold`). 0: never. Default 0.
    #[serde(default)]
    pub threshold: usize,
}

impl Default for InfinityConfig {
    fn default() -> Self {
        InfinityConfig {
            basis: 128,
            widths: vec![0.01, 0.05],
            ridge: 1.0,
            pad: false,
            tau: 0.75,
            samples: 512,
            sticky: false,
            bins: 128,
            gate: true,
            min_var: 1e-4,
            kl_coef: 1e-5,
            sigma0: 0.05,
            threshold: 0,
        }
    }
}

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
    /// (the reference) on either device. Default true.
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
            fused: true,
            as_official: false,
        }
    }
}

/// The memory mechanisms lethe knows: the one list the config, the command line
/// (`--mechanism`, through clap's [`ValueEnum`]), sweeps, benches and plots share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum Mechanism {
    /// Transformer-XL: keep the last `span` states.
    Fixed,
    /// Expire-Span: a learned span per memory; expired memories are deleted.
    Expire,
    /// Adaptive-Span: a learned span per head; the cache is trimmed to the largest.
    Adaptive,
    /// Compressive Transformer: old states are compressed `c` to one into a second memory.
    Compressive,
    /// ∞-former: old states are absorbed into a continuous, unbounded long-term memory.
    Infinity,
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Mechanism {
    /// Every mechanism, in the order messages and plots list them.
    pub fn all() -> &'static [Mechanism] {
        Mechanism::value_variants()
    }

    /// The mechanism called `name` (its config name); the error lists the known ones.
    pub fn parse(name: &str) -> Result<Mechanism> {
        Mechanism::from_str(name, false).map_err(|_| {
            let known: Vec<&str> = Mechanism::all().iter().map(|m| m.name()).collect();
            LetheError::Invalid(format!("unknown mechanism `{name}` (known: {})", known.join(", ")))
        })
    }

    /// The name used in configs, run names and messages (`fixed`, `expire`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fixed => "fixed",
            Mechanism::Expire => "expire",
            Mechanism::Adaptive => "adaptive",
            Mechanism::Compressive => "compressive",
            Mechanism::Infinity => "infinity",
        }
    }

    /// Whether the mechanism can keep the episodes of a row apart
    /// (`AttendInput::episodes`, `rl.reset = "episode"`): its memory holds one state
    /// per position. The Compressive Transformer and the ∞-former mix states into
    /// shared slots, so they cannot.
    pub fn separates_episodes(self) -> bool {
        matches!(self, Mechanism::Fixed | Mechanism::Adaptive | Mechanism::Expire)
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            mechanism: Mechanism::Fixed,
            span: 128,
            expire: ExpireConfig::default(),
            adaptive: AdaptiveConfig::default(),
            compressive: CompressiveConfig::default(),
            infinity: InfinityConfig::default(),
        }
    }
}

impl MemoryConfig {
    /// `block` is the block length the memory will be used with, `arch` the layers'
    /// architecture. On the papers' backbone a query sees itself and `memory.span`
    /// earlier positions, so the span must cover the block. On GPT-2 a query always sees
    /// its block up to itself, and `memory.span` counts the earlier blocks' states kept
    /// besides (0: none, as GPT-2); its absolute positions leave no relative distance for
    /// Expire-Span and Adaptive-Span to act on.
    pub fn validate(&self, block: usize, arch: Arch) -> Result<()> {
        match arch {
            Arch::Lethe => self.validate_window(block)?,
            Arch::Gpt2 if matches!(self.mechanism, Mechanism::Expire | Mechanism::Adaptive) => {
                return Err(LetheError::config(
                    "memory.mechanism",
                    self.mechanism.name(),
                    "needs the relative positions of model.arch = \"lethe\"; on GPT-2 use fixed, compressive or infinity",
                ));
            }
            Arch::Gpt2 => {}
        }
        match self.mechanism {
            Mechanism::Expire => self.expire.validate()?,
            Mechanism::Adaptive => self.adaptive.validate()?,
            Mechanism::Compressive => self.compressive.validate()?,
            Mechanism::Infinity => self.infinity.validate()?,
            Mechanism::Fixed => {}
        }
        Ok(())
    }

    /// The span covers the block, on the papers' backbone.
    fn validate_window(&self, block: usize) -> Result<()> {
        positive("memory.span", self.span)?;
        if block > self.span {
            return Err(LetheError::config(
                "train.block",
                block,
                format!("a block may not be longer than the span memory.span = {}", self.span),
            ));
        }
        Ok(())
    }

    /// The factor on the memory's auxiliary loss at optimiser step `step` (0-based):
    /// Expire-Span's `alpha` warm-up, 1 otherwise.
    pub fn aux_scale(&self, step: usize) -> f64 {
        match (self.mechanism, self.expire.alpha_warmup) {
            (Mechanism::Expire, n) if n > 0 => ((step + 1) as f64 / n as f64).min(1.0),
            _ => 1.0,
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
        Ok(())
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

impl CompressiveConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        positive("memory.compressive.rate", self.rate)?;
        positive("memory.compressive.slots", self.slots)?;
        non_negative("memory.compressive.recon_coef", self.recon_coef)
    }
}

impl InfinityConfig {
    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        positive("memory.infinity.basis", self.basis)?;
        let w = self.widths.len();
        if w == 0 || self.widths.iter().any(|&s| !(s > 0.0 && s.is_finite())) {
            return Err(LetheError::config(
                "memory.infinity.widths",
                format!("{:?}", self.widths),
                "must be one or more positive numbers",
            ));
        }
        if !self.basis.is_multiple_of(w) || self.basis / w < 2 {
            return Err(LetheError::config(
                "memory.infinity.basis",
                self.basis,
                format!("must be a multiple of the {w} widths with at least 2 centres each"),
            ));
        }
        positive_number("memory.infinity.ridge", self.ridge)?;
        if !(self.tau > 0.0 && self.tau < 1.0) {
            return Err(LetheError::config("memory.infinity.tau", self.tau, "must be in (0, 1)"));
        }
        positive("memory.infinity.samples", self.samples)?;
        positive("memory.infinity.bins", self.bins)?;
        positive_number("memory.infinity.min_var", self.min_var)?;
        non_negative("memory.infinity.kl_coef", self.kl_coef)?;
        positive_number("memory.infinity.sigma0", self.sigma0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alpha_warm_up_rises_linearly_and_only_for_expire_span() {
        let mut m = MemoryConfig { mechanism: Mechanism::Expire, ..MemoryConfig::default() };
        assert_eq!(m.aux_scale(0), 1.0);
        m.expire.alpha_warmup = 4;
        let scales: Vec<f64> = (0..6).map(|s| m.aux_scale(s)).collect();
        assert_eq!(scales, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
        m.mechanism = Mechanism::Adaptive;
        assert_eq!(m.aux_scale(0), 1.0);
    }

    #[test]
    fn every_mechanism_has_one_name_in_configs_messages_and_the_command_line() {
        for &m in Mechanism::all() {
            let serde_name = toml::Value::try_from(m).unwrap();
            assert_eq!(serde_name.as_str(), Some(m.name()));
            assert_eq!(m.to_possible_value().unwrap().get_name(), m.name());
            assert_eq!(Mechanism::parse(m.name()).unwrap(), m);
        }
        assert_eq!(Mechanism::all().len(), 5);
        let msg = Mechanism::parse("lstm").unwrap_err().to_string();
        assert!(msg.contains("lstm") && msg.contains("fixed, expire, adaptive, compressive, infinity"), "{msg}");
    }
}
