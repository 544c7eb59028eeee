//! `[memory.infinity]`: the ∞-former's settings (Martins et al., 2022), with their
//! validation.

use serde::{Deserialize, Serialize};

use crate::config::check::{non_negative, positive, positive_number};
use crate::error::{LetheError, Result};

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
    /// Start the long-term memory's output map `W_O` at zero, so that a pretrained model
    /// fitted with it (`--init-from`) starts out computing what it computed, as low-rank
    /// adapters start. Default false (uniform in `±1 / sqrt(d)`, as the paper's code).
    pub zero_output: bool,
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
            zero_output: false,
        }
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
