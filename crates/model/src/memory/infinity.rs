//! ∞-former (Martins et al., 2022, "∞-former: Infinite Memory Transformer", section 3;
//! docs/design/algorithms.md, ∞-former): a short-term memory (STM) as in Transformer-XL, plus a
//! continuous long-term memory (LTM) of fixed size that absorbs, without bound, the
//! states that leave the STM. The signal mathematics is in [`signal`].
//!
//! Per layer and block of `m` queries:
//!
//! 1. **Absorb** the states that left the STM after the previous block: gate them,
//!    `x̃ = x ⊙ sigmoid(conv1d_k3(x))` (Eq. 18); sample the old signal at `M` points
//!    (evenly, or where the previous block attended, with sticky memories; Eq. 14-17),
//!    place the samples evenly in `(0, τ]` and the new states in `(τ, 1]`, and refit
//!    the coefficients `B` `(N, d)` by ridge regression, `Bᵀ = Xᵀ G` (Eq. 5, 13, 15).
//!    `G` depends only on the shapes and is cached. Sampled evenly, the old signal's
//!    share is linear in the old coefficients, `G_oldᵀ Ψ B_old`, so the cached
//!    `(N, N)` matrix `G_oldᵀ Ψ` carries them in one product. The gradient reaches
//!    the gate through this block's `B`; the stored `B` is detached.
//! 2. **Attend**: keys and values `K = B W_K`, `V = B W_V` per head (Eq. 8); with the
//!    backbone's own queries, the scores `s = K q / √dh` give a Gaussian density
//!    `N(t; μ, σ²)` per head and query, `μ = sigmoid(w_μ · s)`, `σ² = softplus(w_σ · s + b_σ)`
//!    clamped below (Eq. 9-10), and the context is `z = Vᵀ E[ψ(t)]` in closed form
//!    (Eq. 11). Heads are merged and projected, `Z_LTM = [z_1 .. z_H] W_O`, and added to
//!    the projected STM attention (Eq. 12).
//! 3. **Regularise** the variance towards `σ0²` with the KL term
//!    `½ (σ²/σ0² − ln(σ²/σ0²) − 1)`, averaged over heads and queries and weighted
//!    (Eq. 20-22; the paper prints `log(σ/σ0)`, the KL has `ln(σ²/σ0²)`).
//! 4. **Remember where attention went**: the mass of every density in each of `D` bins
//!    of `[0, 1]`, summed over heads and queries (Eq. 16), for the next update's sticky
//!    sampling and for `lethe inspect ltm`.
//!
//! The STM uses the shared relative positions `key_pe`; the LTM needs none (its
//! coefficients live on a fixed axis). Choices the paper leaves open: the gate acts on
//! the new states only (the samples of the old signal are already smooth); sticky
//! positions are the histogram's quantiles rather than random draws
//! ([`signal::quantile_positions`]); the LTM projections have no biases, like the
//! backbone's attention.

pub mod signal;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tch::{nn, Kind, Tensor};

use self::signal::{bin_mass, evaluate, positions, quantile_positions, ridge_matrix, update_positions, Basis};
use super::descriptor::{split, Descriptor, LayerShape};
use super::layer::{AttendInput, AttendOutput, Carry, LtmTrace, MemoryLayer, MemoryReport};
use super::window::{concat_time, Joined, WindowCache};
use crate::attention::merge_heads;
use lethe_core::config::{Config, InfinityConfig, MemoryConfig};
use lethe_core::device::Autocast;
use lethe_core::error::{LetheError, Result};

/// The ∞-former's [`Descriptor`]: a short-term window and `N` basis functions, half
/// the size each in a sweep (the basis in whole sets of widths); its long-term memory's
/// keys, values and output, `3 x 2 N d²`, and scores and context, `2 x 2 m N d`, are
/// counted beside the window's attention.
pub struct Infinity;

impl Descriptor for Infinity {
    fn build(&self, cfg: &MemoryConfig, p: nn::Path, shape: LayerShape) -> Result<Box<dyn MemoryLayer>> {
        Ok(Box::new(InfinityMemory::new(p, shape.d_model, cfg.span, &cfg.infinity)?))
    }

    fn colour(&self) -> (u8, u8, u8) {
        (255, 127, 14)
    }

    fn set_size(&self, cfg: &mut Config, size: usize) {
        let (window, rest) = split(cfg, size);
        let widths = cfg.memory.infinity.widths.len().max(1);
        cfg.memory.span = window;
        cfg.memory.infinity.basis = rest / widths * widths;
    }

    fn size(&self, cfg: &Config) -> usize {
        cfg.memory.span + cfg.memory.infinity.basis
    }

    /// The long-term memory is unbounded; two blocks past the short-term memory have
    /// been absorbed into it.
    fn reach(&self, cfg: &Config) -> usize {
        cfg.memory.span + 2 * cfg.train.block
    }

    fn memory_flops(&self, cfg: &Config, m: f64, d: f64) -> f64 {
        let basis = cfg.memory.infinity.basis as f64;
        6.0 * basis * d * d + 4.0 * m * basis * d
    }

    fn reads_whole_blocks(&self) -> bool {
        true
    }
}

/// The learned parts of one layer's LTM.
struct Params {
    /// Key, value and output projections `(d, d)`.
    k: Tensor,
    v: Tensor,
    o: Tensor,
    /// `w_μ` `(1, N)`: the mean from the scores.
    mu: Tensor,
    /// `w_σ` `(1, N)` and `b_σ` `(1)`: the variance from the scores.
    sigma_w: Tensor,
    sigma_b: Tensor,
    /// The gate's convolution: weight `(d, d, 3)` and bias `(d)`.
    gate: Option<(Tensor, Tensor)>,
}

impl Params {
    fn new(p: &nn::Path, d: i64, n: i64, gate: bool, zero_output: bool) -> Params {
        let uniform = |fan_in: i64| {
            let bound = 1.0 / (fan_in as f64).sqrt();
            nn::Init::Uniform { lo: -bound, up: bound }
        };
        let var = |name: &str, dims: &[i64], init| crate::undrawn::var(p, name, dims, init);
        Params {
            k: var("k", &[d, d], uniform(d)),
            v: var("v", &[d, d], uniform(d)),
            o: var("o", &[d, d], if zero_output { nn::Init::Const(0.0) } else { uniform(d) }),
            mu: var("mu", &[1, n], uniform(n)),
            sigma_w: var("sigma_w", &[1, n], uniform(n)),
            sigma_b: var("sigma_b", &[1], nn::Init::Const(0.0)),
            gate: gate.then(|| (var("gate_w", &[d, d, 3], uniform(3 * d)), var("gate_b", &[d], uniform(3 * d)))),
        }
    }

    fn share(&self) -> Params {
        Params {
            k: self.k.shallow_clone(),
            v: self.v.shallow_clone(),
            o: self.o.shallow_clone(),
            mu: self.mu.shallow_clone(),
            sigma_w: self.sigma_w.shallow_clone(),
            sigma_b: self.sigma_b.shallow_clone(),
            gate: self.gate.as_ref().map(|(w, b)| (w.shallow_clone(), b.shallow_clone())),
        }
    }

    /// `[w_μ; w_σ]` `(2, N)` and `[0, b_σ]` `(2)`: the mean's and the variance's
    /// pre-activations from the scores in one product.
    fn density_heads(&self) -> (Tensor, Tensor) {
        let w = Tensor::cat(&[&self.mu, &self.sigma_w], 0);
        let b = Tensor::cat(&[self.sigma_b.zeros_like(), self.sigma_b.shallow_clone()], 0);
        (w, b)
    }

    /// `x ⊙ sigmoid(conv1d_k3(x))` over time, for `x` `(b, n, d)`; `x` itself without a gate.
    fn gate(&self, x: &Tensor) -> Tensor {
        match &self.gate {
            None => x.shallow_clone(),
            Some((w, b)) => x * conv_k3(x, w, b).sigmoid(),
        }
    }
}

/// The convolution of width 3 and padding 1 over time of `x` `(b, n, d)` with weight `w`
/// `(d, d, 3)` and bias `b` `(d)`, as one matrix product: each step's window
/// `[x_{t-1}, x_t, x_{t+1}]` `(3d)` times the weight unfolded to `(d, 3d)`. Returns
/// `(b, n, d)`. (Measured slightly faster than libtorch's CPU `conv1d`: 18.4 against
/// 19.0-22.4 ms per `sorting-infinity-tiny` training step.)
fn conv_k3(x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
    let (_, n, d) = x.size3().expect("gate input must be (b, n, d)");
    let padded = x.constant_pad_nd([0, 0, 1, 1]); // (b, n + 2, d)
    let windows = Tensor::cat(&[padded.narrow(1, 0, n), padded.narrow(1, 1, n), padded.narrow(1, 2, n)], 2); // (b, n, 3d)
    let unfolded = w.permute([0, 2, 1]).reshape([d, 3 * d]); // (d, 3d), tap-major
    windows.linear(&unfolded, Some(b))
}

/// The regression matrices of one shape: `M` old samples then `n` new states.
struct Fit {
    /// Rows of `G` for the old samples `(M, N)`, absent for the first fit.
    g_old: Option<Tensor>,
    /// `G_oldᵀ Ψ(t)` at `M` evenly spaced points `(N, N)`: the map from the old
    /// coefficients to their share of the new ones when the old signal is sampled
    /// evenly. One `(N, N)` product per update instead of sampling `M` points and
    /// refitting them (two products over `M`); computed in float64. Absent for the
    /// first fit.
    carry: Option<Tensor>,
    /// Rows of `G` for the new states `(n, N)`.
    g_new: Tensor,
    /// `ψ` at the new states' positions `(n, N)`, to measure the regression error.
    psi_new: Tensor,
}

impl Fit {
    fn share(&self) -> Fit {
        Fit {
            g_old: self.g_old.as_ref().map(|g| g.shallow_clone()),
            carry: self.carry.as_ref().map(|c| c.shallow_clone()),
            g_new: self.g_new.shallow_clone(),
            psi_new: self.psi_new.shallow_clone(),
        }
    }
}

/// `G` per `(M, n, kind, device)`, shared by every copy of a layer's memory.
type FitCache = Arc<Mutex<HashMap<(i64, i64, String), Fit>>>;

/// What the last block leaves for the report, detached: the figures are computed only
/// when reported (so that a block neither waits for the device nor pays for them).
#[derive(Default)]
struct Stats {
    mem_size: f64,
    /// `ψ` at the new states' positions, the coefficients fitted and the gated states,
    /// for the regression error.
    fitted: Option<(Tensor, Tensor, Tensor)>,
    kl: Option<Tensor>,
}

/// Where the last block's queries attended over `[0, 1]`.
enum Attended {
    /// Their densities' means and variances `(b, h, m)`, binned when the histogram is
    /// asked for (sticky sampling, the report, a saved state).
    Densities { mu: Tensor, var: Tensor },
    /// The attention mass per bin `(b, D)`, as loaded from a saved state.
    Histogram(Tensor),
}

impl Attended {
    /// The attention mass per bin of `[0, 1]`, summed over heads and queries `(b, D)`.
    fn mass(&self, bins: i64) -> Tensor {
        match self {
            Attended::Histogram(h) => h.shallow_clone(),
            Attended::Densities { mu, var } => tch::no_grad(|| {
                bin_mass(mu, var, bins).sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Float)
                // (b, D)
            }),
        }
    }
}

/// One layer's ∞-former memory.
pub struct InfinityMemory {
    cfg: InfinityConfig,
    span: i64,
    basis: Basis,
    params: Params,
    fits: FitCache,
    /// The STM: the last `span` states.
    window: WindowCache,
    /// LTM coefficients `B` `(b, N, d)`, detached; none before the first absorption.
    coeffs: Option<Tensor>,
    /// States that left the STM, to be absorbed at the next block: `(b, n, d)`.
    incoming: Option<Tensor>,
    /// Where the last block attended: the attention mass per bin of `[0, 1]`.
    attended: Option<Attended>,
    /// Tokens absorbed into the LTM since the last reset.
    absorbed: i64,
    /// What the last block absorbed, for [`MemoryLayer::ltm_trace`].
    last: Absorption,
    stats: Stats,
}

/// What one block's absorption did.
#[derive(Default)]
struct Absorption {
    /// States absorbed.
    count: i64,
    /// The memory was empty before.
    first: bool,
    /// The normalised histogram the old signal was sampled by (sticky memories).
    sampled_by: Option<Tensor>,
}

impl InfinityMemory {
    /// Creates the LTM's parameters under `p / "ltm"`. Fails when the basis is invalid.
    pub fn new(p: nn::Path, d_model: i64, span: usize, cfg: &InfinityConfig) -> Result<Self> {
        let basis = Basis::new(cfg.basis, &cfg.widths)?;
        let params = Params::new(&(p / "ltm"), d_model, basis.len(), cfg.gate, cfg.zero_output);
        Ok(InfinityMemory::empty(cfg.clone(), span as i64, basis, params, FitCache::default()))
    }

    /// A memory with nothing remembered yet.
    fn empty(cfg: InfinityConfig, span: i64, basis: Basis, params: Params, fits: FitCache) -> Self {
        InfinityMemory {
            cfg,
            span,
            basis,
            params,
            fits,
            window: WindowCache::default(),
            coeffs: None,
            incoming: None,
            attended: None,
            absorbed: 0,
            last: Absorption::default(),
            stats: Stats::default(),
        }
    }

    /// The regression matrices for `old` samples and `new` states, computed once per shape.
    fn fit(&self, old: i64, new: i64, like: &Tensor) -> Result<Fit> {
        let key = (old, new, format!("{:?}/{:?}", like.kind(), like.device()));
        let mut fits =
            self.fits.lock().map_err(|_| LetheError::Invalid("∞-former: the regression cache was poisoned".into()))?;
        if let Some(f) = fits.get(&key) {
            return Ok(f.share());
        }
        let all = update_positions(old, new, self.cfg.tau); // (M + n)
        let g = ridge_matrix(&self.basis, &all, self.cfg.ridge, self.cfg.pad)?; // (M + n, N), f64
        let cast = |t: Tensor| t.to_kind(like.kind()).to_device(like.device());
        let g_old = (old > 0).then(|| g.narrow(0, 0, old));
        let carry = g_old.as_ref().map(|g| cast(g.tr().matmul(&self.basis.eval(&positions(old)))));
        let fit = Fit {
            g_old: g_old.map(cast),
            carry,
            g_new: cast(g.narrow(0, old, new)),
            psi_new: cast(self.basis.eval(&all.narrow(0, old, new))),
        };
        fits.insert(key, fit.share());
        Ok(fit)
    }

    /// The old coefficients' share of the new ones `(b, N, d)`: the old signal sampled at
    /// `M` points, evenly (through [`Fit::carry`]) or where the last block attended
    /// (sticky memories, Eq. 16-17), and refitted at `(0, τ]`.
    fn carried(&self, coeffs: &Tensor, fit: &Fit) -> Option<Tensor> {
        let sticky = self.cfg.sticky.then(|| self.histogram()).flatten();
        match sticky {
            None => fit.carry.as_ref().map(|carry| carry.matmul(coeffs)),
            Some(h) => {
                let at = quantile_positions(&h.to_kind(Kind::Double), self.cfg.samples as i64); // (b, M)
                let samples = evaluate(&self.basis, coeffs, &at); // (b, M, d)
                fit.g_old.as_ref().map(|g| g.tr().matmul(&samples))
            }
        }
    }

    /// Absorbs the waiting states into the LTM and returns this block's coefficients
    /// `(b, N, d)` (with the gradient through the gate), if the LTM holds anything.
    fn absorb_incoming(&mut self) -> Result<Option<Tensor>> {
        self.last = Absorption::default();
        let Some(x) = self.incoming.take() else { return Ok(self.coeffs.as_ref().map(|c| c.shallow_clone())) };
        if self.cfg.threshold > 0 && self.absorbed >= self.cfg.threshold as i64 {
            // The memory threshold: start a new memory (the official `mem_threshold`).
            (self.coeffs, self.attended, self.absorbed) = (None, None, 0);
        }
        let n = x.size()[1];
        let sticky = self.cfg.sticky && self.coeffs.is_some();
        self.last = Absorption {
            count: n,
            first: self.coeffs.is_none(),
            sampled_by: if sticky { self.histogram() } else { None },
        };
        // The regression in float32 even under bfloat16 autocast: the coefficients are the
        // memory itself, carried from block to block.
        let _precise = Autocast::off(x.device())?;
        let x = if matches!(x.kind(), Kind::BFloat16 | Kind::Half) { x.to_kind(Kind::Float) } else { x };
        let gated = self.params.gate(&x); // (b, n, d)
        let old = if self.coeffs.is_some() { self.cfg.samples as i64 } else { 0 };
        let fit = self.fit(old, n, &x)?;
        let mut coeffs = fit.g_new.tr().matmul(&gated); // (b, N, d)
        if let Some(carried) = self.coeffs.as_ref().and_then(|c| self.carried(c, &fit)) {
            coeffs += carried;
        }
        self.stats.fitted = Some((fit.psi_new.shallow_clone(), coeffs.detach(), gated.detach()));
        self.coeffs = Some(coeffs.detach());
        self.absorbed += n;
        Ok(Some(coeffs))
    }

    /// The LTM's contribution `Z_LTM` `(b, m, d)` for the block's queries, and the
    /// weighted KL regulariser in training.
    fn attend_ltm(&mut self, input: &AttendInput, coeffs: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let dh = input.attn.d_head();
        let k = input.attn.split_heads(&coeffs.linear(&self.params.k, None::<Tensor>)); // (b, h, N, dh)
        let v = input.attn.split_heads(&coeffs.linear(&self.params.v, None::<Tensor>));
        let scores = input.q.matmul(&k.transpose(-2, -1)) / (dh as f64).sqrt(); // (b, h, m, N)

        // `w_μ · s` and `w_σ · s + b_σ` as one product: one pass over the scores, and one
        // gradient of them in the backward pass rather than two added.
        let (w, b) = self.params.density_heads();
        let heads = {
            // The densities in the parameters' precision even under bfloat16 autocast.
            let _precise = Autocast::off(scores.device())?;
            scores.to_kind(w.kind()).linear(&w, Some(&b)) // (b, h, m, 2)
        };
        let mu = heads.select(-1, 0).sigmoid(); // (b, h, m)
        let var = heads.select(-1, 1).softplus().clamp_min(self.cfg.min_var); // (b, h, m)
        let r = self.basis.expectation(&mu, &var)?; // (b, h, m, N)
        let z = merge_heads(&r.matmul(&v)); // (b, m, d)
        let added = z.linear(&self.params.o, None::<Tensor>);
        let ratio = &var / (self.cfg.sigma0 * self.cfg.sigma0);
        let kl = ((&ratio - ratio.log() - 1.0) * 0.5).mean(ratio.kind());
        self.remember_attention(&mu, &var, &kl);
        let aux = (input.train && self.cfg.kl_coef > 0.0).then(|| kl * self.cfg.kl_coef);
        Ok((added, aux))
    }

    /// Keeps the densities (binned into the histogram when it is asked for) and the KL.
    fn remember_attention(&mut self, mu: &Tensor, var: &Tensor, kl: &Tensor) {
        self.attended = Some(Attended::Densities { mu: mu.detach(), var: var.detach() });
        self.stats.kl = Some(kl.detach());
    }

    /// The attention mass per bin of `[0, 1]` at the last block, summed over heads and
    /// queries, per stream `(b, D)`.
    fn attention_mass(&self) -> Option<Tensor> {
        self.attended.as_ref().map(|a| a.mass(self.cfg.bins as i64))
    }

    /// The attention histogram over the LTM at the last block, per stream `(b, D)`,
    /// normalised to sum to 1.
    pub fn histogram(&self) -> Option<Tensor> {
        let h = self.attention_mass()?;
        Some(&h / h.sum_dim_intlist([-1i64].as_slice(), true, h.kind()).clamp_min(1e-30))
    }

    /// The last block's figures: the regression error, the densities' mean `μ` and
    /// width `σ`, and the KL term.
    fn figures(&self) -> Vec<(&'static str, f64)> {
        tch::no_grad(|| {
            let mut out = vec![];
            if let Some((psi, coeffs, gated)) = &self.stats.fitted {
                out.push(("ltm_fit_error", relative_error(&psi.matmul(coeffs), gated).double_value(&[])));
            }
            if let Some(Attended::Densities { mu, var }) = &self.attended {
                out.push(("ltm_mu", mu.mean(Kind::Double).double_value(&[])));
                out.push(("ltm_sigma", var.sqrt().mean(Kind::Double).double_value(&[])));
            }
            if let Some(kl) = &self.stats.kl {
                out.push(("ltm_kl", kl.double_value(&[])));
            }
            out
        })
    }

    fn ltm_slots(&self) -> i64 {
        if self.coeffs.is_some() {
            self.basis.len()
        } else {
            0
        }
    }
}

/// `sqrt(mean (a - b)²) / sqrt(mean b²)`: the regression error relative to the signal,
/// as a scalar tensor.
fn relative_error(a: &Tensor, b: &Tensor) -> Tensor {
    let err = (a - b).square().mean(Kind::Float);
    let scale = b.square().mean(Kind::Float).clamp_min(1e-30);
    (err / scale).sqrt().detach()
}

impl MemoryLayer for InfinityMemory {
    fn name(&self) -> &'static str {
        "infinity"
    }

    fn attend(&mut self, input: &AttendInput) -> Result<AttendOutput> {
        let (context, stm_rows, joined) = self.window.attend(input, self.span)?;
        let stm_size = lethe_core::metrics::mean(&stm_rows);
        let absorb = lethe_core::profile::phase("long-term memory: absorb");
        let coeffs = self.absorb_incoming()?;
        drop(absorb);
        let (added, aux_loss) = match coeffs {
            Some(coeffs) => {
                let _read = lethe_core::profile::phase("long-term memory: read");
                let (added, aux) = self.attend_ltm(input, &coeffs)?;
                (Some(added), aux)
            }
            None => (None, None),
        };
        self.stats.mem_size = stm_size + self.ltm_slots() as f64;
        Ok(AttendOutput { context, aux_loss, added, carry: Carry::new(joined) })
    }

    fn update(&mut self, x: &Tensor, _episodes: Option<&Tensor>, carry: Carry) -> Result<()> {
        if let Some(left) = self.window.append(x, None, self.span, carry.take::<Joined>()) {
            self.incoming = Some(concat_time(self.incoming.as_ref(), &left));
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.window.reset();
        self.coeffs = None;
        self.incoming = None;
        self.attended = None;
        self.absorbed = 0;
        self.last = Absorption::default();
    }

    fn report(&self) -> MemoryReport {
        let waiting = self.incoming.as_ref().map_or(0, |x| x.size()[1]);
        let mut extra = vec![("ltm_tokens".to_string(), self.absorbed as f64)];
        extra.extend(self.figures().into_iter().map(|(n, v)| (n.to_string(), v)));
        let mut series = vec![];
        if let Some(h) = self.histogram() {
            extra.push(("ltm_recent_mass".to_string(), recent_mass(&h, self.cfg.tau)));
            series.push(("ltm_attention".to_string(), coarse_histogram(&h, LOGGED_BINS)));
        }
        MemoryReport {
            mem_size: self.stats.mem_size,
            mem_rows: vec![],
            held: (self.window.len() + waiting + self.ltm_slots()) as usize,
            extra,
            series,
        }
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = self.window.state();
        let histogram = self.attention_mass();
        let named = [("ltm", &self.coeffs), ("incoming", &self.incoming), ("histogram", &histogram)];
        out.extend(named.iter().filter_map(|(n, t)| t.as_ref().map(|t| (n.to_string(), t.shallow_clone()))));
        out.push(("absorbed".to_string(), Tensor::from(self.absorbed)));
        out
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.reset();
        let bad = |name: &str, t: &Tensor| {
            LetheError::Invalid(format!("∞-former memory: unexpected state `{name}` of shape {:?}", t.size()))
        };
        let n = self.basis.len();
        let mut window = vec![];
        for (name, t) in state {
            let shape = t.size();
            match name.as_str() {
                "ltm" if t.dim() == 3 && shape[1] == n => self.coeffs = Some(t.shallow_clone()),
                "incoming" if t.dim() == 3 => self.incoming = Some(t.shallow_clone()),
                "histogram" if shape.len() == 2 && shape[1] == self.cfg.bins as i64 => {
                    self.attended = Some(Attended::Histogram(t.shallow_clone()))
                }
                "absorbed" if t.dim() == 0 => self.absorbed = t.int64_value(&[]),
                "ltm" | "incoming" | "histogram" | "absorbed" => return Err(bad(name, t)),
                _ => window.push((name.clone(), t.shallow_clone())),
            }
        }
        self.window.load_state(&window, self.span, "∞-former")
    }

    fn fresh(&self) -> Box<dyn MemoryLayer> {
        Box::new(InfinityMemory::empty(
            self.cfg.clone(),
            self.span,
            self.basis.share(),
            self.params.share(),
            self.fits.clone(),
        ))
    }

    fn ltm_trace(&self) -> Option<LtmTrace> {
        Some(LtmTrace {
            attention: self.histogram()?,
            absorbed: self.last.count,
            sampled_by: self.last.sampled_by.as_ref().map(|h| h.shallow_clone()),
            first: self.last.first,
            tau: self.cfg.tau,
        })
    }
}

/// Bins of the attention histogram written to the metrics (`ltm_attention`).
const LOGGED_BINS: i64 = 16;

/// A normalised histogram `(b, D)` averaged over streams and summed into at most `bins`
/// equal groups of neighbouring bins (all `D` when `D` is not a multiple of `bins`).
fn coarse_histogram(hist: &Tensor, bins: i64) -> Vec<f64> {
    let (b, d) = hist.size2().expect("histogram must be (b, D)");
    let mean = hist.to_kind(Kind::Double).sum_dim_intlist([0i64].as_slice(), false, Kind::Double) / b as f64; // (D)
    let groups = if d % bins == 0 { bins } else { d };
    let coarse = mean.view([groups, d / groups]).sum_dim_intlist([1i64].as_slice(), false, Kind::Double);
    Vec::<f64>::try_from(coarse.to_device(tch::Device::Cpu)).unwrap_or_default()
}

/// The share of a normalised histogram `(b, D)` in `(τ, 1]`, where the newest states
/// were placed, averaged over streams.
fn recent_mass(hist: &Tensor, tau: f64) -> f64 {
    let d = hist.size()[1];
    let first = ((tau * d as f64).ceil() as i64).min(d);
    hist.narrow(1, first, d - first).sum(Kind::Double).double_value(&[]) / hist.size()[0] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unfolded_gate_convolution_equals_conv1d() {
        let opts = (Kind::Double, tch::Device::Cpu);
        let mut rng = lethe_core::rng::Rng::new(5);
        let x = rng.normal_tensor(&[2, 5, 3], opts.0);
        let w = rng.normal_tensor(&[3, 3, 3], opts.0);
        let b = rng.normal_tensor(&[3], opts.0);
        let reference = x.transpose(1, 2).conv1d(&w, Some(&b), [1], [1], [1], 1).transpose(1, 2);
        let diff = (conv_k3(&x, &w, &b) - reference).abs().max().double_value(&[]);
        assert!(diff < 1e-12, "{diff}");
    }

    /// The carry matrix is a reassociation: `(G_oldᵀ Ψ) B` must equal sampling the old
    /// signal `Ψ B` evenly at `M` points and refitting the samples, `G_oldᵀ (Ψ B)`.
    #[test]
    fn carrying_the_coefficients_equals_sampling_and_refitting() {
        let cfg = InfinityConfig { basis: 16, samples: 24, gate: false, ..InfinityConfig::default() };
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let mut memory = InfinityMemory::new(vs.root(), 8, 4, &cfg).unwrap();
        let mut rng = lethe_core::rng::Rng::new(11);
        memory.incoming = Some(rng.normal_tensor(&[2, 6, 8], Kind::Float));
        let first = memory.absorb_incoming().unwrap().unwrap();
        let x = rng.normal_tensor(&[2, 6, 8], Kind::Float);
        memory.incoming = Some(x.shallow_clone());
        let carried = memory.absorb_incoming().unwrap().unwrap();

        let fit = memory.fit(24, 6, &x).unwrap();
        let samples = evaluate(&memory.basis, &first, &positions(24)); // (b, M, d)
        let refitted = fit.g_old.unwrap().tr().matmul(&samples) + fit.g_new.tr().matmul(&x);
        let diff = (carried - &refitted).abs().max().double_value(&[]);
        let scale = refitted.abs().max().double_value(&[]);
        assert!(scale > 0.1 && diff < 1e-5 * scale, "diff {diff}, scale {scale}");
    }
}
