//! The mathematics of ∞-former's continuous long-term memory (Martins et al., 2022,
//! "∞-former: Infinite Memory Transformer", section 3; docs/design/algorithms.md, ∞-former).
//!
//! A sequence of `L` vectors `x_1..x_L` is stored as a continuous signal
//! `x̄(t) = Bᵀ ψ(t)`, `t ∈ [0, 1]`, over a basis of `N` Gaussian radial basis functions
//! `ψ_j(t) = N(t; μ_j, σ_j²)` (Eq. 4-5), whatever `L` is: memory costs `O(N)`.
//!
//! - **Basis**: centres `linspace(0, 1, N / w)` crossed with `w` widths (paper C.1:
//!   σ ∈ {0.01, 0.05}); centre-major order.
//! - **Ridge regression** (Eq. 6-7): `B = argmin ||F_ᵀ B - X||² + λ ||B||²` with
//!   `F = [ψ(t_1) .. ψ(t_L)]` `(N, L)` at `t_i = (i + 0.5) / L`, so `Bᵀ = Xᵀ G` with
//!   `G = Fᵀ (F Fᵀ + λ I)⁻¹` `(L, N)`. `G` depends only on the positions: it is computed
//!   once per shape, in float64 (`F Fᵀ + λI` is badly conditioned; docs/design/algorithms.md, ∞-former, gives the measured
//!   2.4% error in float32 at N = 512), then cast. The official code fits on a grid
//!   padded to [-0.5, 1.5] with zeros outside [0, 1]; that is an option here
//!   ([`ridge_matrix`] with `pad`), because it pulls the signal towards zero at the edges.
//! - **Attention as an expectation** (Eq. 9-10): a query gives a Gaussian density
//!   `N(t; μ, σ²)` over `[0, 1]`, and the context is `E[v̄(t)] = Vᵀ r` with
//!   `r_j = ∫ N(t; μ, σ²) ψ_j(t) dt = N(μ; μ_j, σ² + σ_j²)`, in closed form
//!   ([`Basis::expectation`]).
//! - **Unbounded memory** (section 3.2, Eq. 13): to absorb new vectors, the old signal
//!   is evaluated at `M_s` points, which are placed evenly in `(0, τ]` (the old signal
//!   contracts by `τ`), the new vectors evenly in `(τ, 1]`, and all are refitted
//!   ([`absorb`]).
//! - **Sticky memories** (section 3.3, Eq. 16-17): the attention densities of a block
//!   give a histogram over `D` bins of `[0, 1]` ([`bin_mass`]); the next update samples
//!   the old signal where that histogram has its mass ([`quantile_positions`]).

use std::ffi::c_void;

use tch::{Device, Kind, Tensor};

use lethe_kernels::{lethe_expectation, raw};

use lethe_core::error::{LetheError, Result, TorchContext};

/// `1 / sqrt(2 π)`.
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// A basis of Gaussian radial basis functions on `[0, 1]`.
#[derive(Debug)]
pub struct Basis {
    /// Centres `(N)`, float64.
    pub centres: Tensor,
    /// Widths (standard deviations) `(N)`, float64.
    pub widths: Tensor,
}

impl Basis {
    /// `n` functions: `n / widths.len()` centres evenly in `[0, 1]`, each with every width.
    pub fn new(n: usize, widths: &[f64]) -> Result<Basis> {
        let w = widths.len();
        if w == 0 || n == 0 || !n.is_multiple_of(w) || n / w < 2 {
            return Err(LetheError::Invalid(format!(
                "∞-former basis: {n} functions cannot be split evenly over {w} widths with at least 2 centres each"
            )));
        }
        if widths.iter().any(|&s| !(s > 0.0 && s.is_finite())) {
            return Err(LetheError::Invalid(format!("∞-former basis: widths {widths:?} must be positive")));
        }
        let opts = (Kind::Double, tch::Device::Cpu);
        let per = (n / w) as i64;
        let centres = Tensor::linspace(0.0, 1.0, per, opts).repeat_interleave_self_int(w as i64, 0, None);
        let widths = Tensor::from_slice(widths).repeat([per]);
        Ok(Basis { centres, widths })
    }

    /// The same basis, sharing the tensors.
    pub fn share(&self) -> Basis {
        Basis { centres: self.centres.shallow_clone(), widths: self.widths.shallow_clone() }
    }

    /// Number of basis functions `N`.
    pub fn len(&self) -> i64 {
        self.centres.size()[0]
    }

    /// Always false: a basis has at least two functions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `ψ(t)` for positions `t` of any shape `(...)`: `(..., N)`, float64, on the
    /// device of `t`.
    pub fn eval(&self, t: &Tensor) -> Tensor {
        let t = t.to_kind(Kind::Double).unsqueeze(-1); // (..., 1)
        let device = t.device();
        gaussian(&t, &self.centres.to_device(device), &self.widths.square().to_device(device))
    }

    /// `r_j = ∫ N(t; μ, σ²) ψ_j(t) dt = N(μ; μ_j, σ² + σ_j²)` for densities with means
    /// `mu` and variances `var` of the same shape `(...)`: `(..., N)` in the kind of `mu`.
    /// On the CPU, in float32 or float64, one node of `csrc/expectation.cpp` (each pass
    /// writes each row once); elsewhere [`Basis::expectation_formula`].
    pub fn expectation(&self, mu: &Tensor, var: &Tensor) -> Result<Tensor> {
        let fused = mu.device() == Device::Cpu && matches!(mu.kind(), Kind::Float | Kind::Double);
        if !fused || var.size() != mu.size() || var.kind() != mu.kind() {
            return Ok(self.expectation_formula(mu, var));
        }
        let centres = self.centres.to_kind(mu.kind());
        let widths2 = self.widths.square().to_kind(mu.kind());
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: the four tensors are live `at::Tensor*` for the call, read only; on
        // success the function writes one new `at::Tensor*` to `out`.
        lethe_kernels::call("the ∞-former's densities against its basis", |error| unsafe {
            lethe_expectation(raw(mu), raw(var), raw(&centres), raw(&widths2), &mut out, error)
        })?;
        // SAFETY: see above; the pointer is taken over once.
        Ok(unsafe { lethe_kernels::tensor(out) })
    }

    /// [`Basis::expectation`] written with tensors, broadcast: any device and kind.
    pub fn expectation_formula(&self, mu: &Tensor, var: &Tensor) -> Tensor {
        let kind = mu.kind();
        let centres = self.centres.to_kind(kind).to_device(mu.device());
        let widths2 = self.widths.square().to_kind(kind).to_device(mu.device());
        gaussian(&mu.unsqueeze(-1), &centres, &(var.unsqueeze(-1) + widths2))
    }
}

/// The density `N(x; mean, var)`, broadcast.
fn gaussian(x: &Tensor, mean: &Tensor, var: &Tensor) -> Tensor {
    (-(x - mean).square() / (var * 2.0)).exp() * INV_SQRT_2PI / var.sqrt()
}

/// Positions `(i + 0.5) / len` of `len` vectors spread over `[0, 1]`: `(len)`, float64.
pub fn positions(len: i64) -> Tensor {
    (Tensor::arange(len, (Kind::Double, tch::Device::Cpu)) + 0.5) / len as f64
}

/// Where an update places its vectors: `old` samples of the old signal evenly in
/// `(0, τ)` and `new` vectors evenly in `(τ, 1)`; with nothing old, the new vectors
/// evenly in `(0, 1)`. Returns the `old + new` positions, old first, float64.
pub fn update_positions(old: i64, new: i64, tau: f64) -> Tensor {
    if old == 0 {
        positions(new)
    } else {
        Tensor::cat(&[positions(old) * tau, positions(new) * (1.0 - tau) + tau], 0)
    }
}

/// `G = Fᵀ (F Fᵀ + λ I)⁻¹` `(L, N)` for vectors at `positions` `(L)`, float64.
///
/// With `pad`, the fit runs on the grid extended by half its length on each side with
/// the same spacing (positions in about [-0.5, 1.5], the padded vectors zero), as the
/// official code does, and the rows of the real positions are kept.
pub fn ridge_matrix(basis: &Basis, positions: &Tensor, lambda: f64, pad: bool) -> Result<Tensor> {
    let t = positions.to_kind(Kind::Double);
    let len = t.size()[0];
    let (grid, keep) = if pad && len > 1 {
        let half = len / 2;
        let step = 1.0 / len as f64;
        let before = Tensor::arange(half, (Kind::Double, tch::Device::Cpu)).flip([0]) * -step - step + t.get(0);
        let after = Tensor::arange(half, (Kind::Double, tch::Device::Cpu)) * step + step + t.get(len - 1);
        (Tensor::cat(&[before, t.shallow_clone(), after], 0), Some(half))
    } else {
        (t, None)
    };
    let f = basis.eval(&grid).tr(); // (N, L')
    let n = basis.len();
    let gram = f.matmul(&f.tr()) + Tensor::eye(n, (Kind::Double, tch::Device::Cpu)) * lambda; // (N, N)

    // G = Fᵀ gram⁻¹, i.e. the solution of gram Gᵀ = F (gram is symmetric).
    let g = Tensor::f_linalg_solve(&gram, &f, true).torch("∞-former ridge regression")?.tr(); // (L', N)
    Ok(match keep {
        Some(half) => g.narrow(0, half, len),
        None => g,
    })
}

/// Coefficients `B = Gᵀ X` `(N, e)` of vectors `x` `(L, e)` for `G` `(L, N)`.
pub fn fit(g: &Tensor, x: &Tensor) -> Tensor {
    g.to_kind(x.kind()).tr().matmul(x)
}

/// The signal `x̄(t) = Bᵀ ψ(t)` of coefficients `b` `(N, e)` at positions `t` `(T)`: `(T, e)`.
pub fn evaluate(basis: &Basis, b: &Tensor, t: &Tensor) -> Tensor {
    basis.eval(t).to_kind(b.kind()).matmul(b)
}

/// The unbounded-memory update: the old signal `old` `(N, e)` (if any) is evaluated at
/// `at` `(M_s)` (evenly spaced points, or the sticky positions), those samples are
/// placed evenly in `(0, τ]`, the `new` vectors `(L, e)` evenly in `(τ, 1]`, and the
/// whole is refitted. Returns the new coefficients `(N, e)`.
pub fn absorb(
    basis: &Basis,
    old: Option<&Tensor>,
    new: &Tensor,
    at: &Tensor,
    tau: f64,
    lambda: f64,
    pad: bool,
) -> Result<Tensor> {
    let len = new.size()[0];
    let Some(old) = old else {
        let g = ridge_matrix(basis, &update_positions(0, len, tau), lambda, pad)?;
        return Ok(fit(&g, new));
    };
    let samples = evaluate(basis, old, at); // (M_s, e)
    let g = ridge_matrix(basis, &update_positions(samples.size()[0], len, tau), lambda, pad)?;
    Ok(fit(&g, &Tensor::cat(&[samples, new.shallow_clone()], 0)))
}

/// The probability mass that Gaussian densities with means `mu` and variances `var`
/// `(...)` give each of `bins` equal bins of `[0, 1]` (Eq. 17):
/// `½ (erf((b - μ) / (σ√2)) - erf((a - μ) / (σ√2)))`. Returns `(..., bins)`.
pub fn bin_mass(mu: &Tensor, var: &Tensor, bins: i64) -> Tensor {
    let edges = Tensor::linspace(0.0, 1.0, bins + 1, (mu.kind(), mu.device())); // (D + 1)
    let scale = (var * 2.0).sqrt().unsqueeze(-1); // (..., 1)
    let cdf = ((edges - mu.unsqueeze(-1)) / scale).erf() * 0.5; // (..., D + 1)
    cdf.narrow(-1, 1, bins) - cdf.narrow(-1, 0, bins)
}

/// `count` positions in `[0, 1]` spread by the histogram `hist` `(b, D)` (each row a
/// distribution over the bins, uniform within a bin): the quantiles `(i + 0.5) / count`
/// of its distribution function, sorted. Returns `(b, count)`.
///
/// The paper samples the positions at random from the histogram (section 3.3); the
/// quantiles put the same density of points where the mass is, without sampling noise.
pub fn quantile_positions(hist: &Tensor, count: i64) -> Tensor {
    let (b, d) = hist.size2().expect("histogram must be (b, D)");
    let total = hist.sum_dim_intlist([-1i64].as_slice(), true, hist.kind()); // (b, 1)
    let p = hist / total;
    let cdf = p.cumsum(-1, p.kind()); // (b, D)
    let u =
        ((Tensor::arange(count, (p.kind(), p.device())) + 0.5) / count as f64).expand([b, count], false).contiguous();
    let bin = u.searchsorted(&cdf.contiguous(), false, false, "left", None::<Tensor>).clamp_max(d - 1); // (b, count)
    let upper = cdf.gather(1, &bin, false);
    let width = p.gather(1, &bin, false);
    let within = ((&u - &upper + &width) / width.clamp_min(1e-12)).clamp(0.0, 1.0);
    (bin.to_kind(p.kind()) + within) / d as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smooth(t: &Tensor) -> Tensor {
        // Two channels: sin(2πt) and 0.5 cos(5t) + t.
        let a = (t * (2.0 * std::f64::consts::PI)).sin();
        let b = (t * 5.0).cos() * 0.5 + t;
        Tensor::stack(&[a, b], 1)
    }

    fn max_abs(t: &Tensor) -> f64 {
        t.abs().max().double_value(&[])
    }

    #[test]
    fn the_basis_crosses_centres_with_widths() {
        let b = Basis::new(6, &[0.01, 0.05]).unwrap();
        let c: Vec<f64> = b.centres.shallow_clone().try_into().unwrap();
        let w: Vec<f64> = b.widths.shallow_clone().try_into().unwrap();
        assert_eq!(c, vec![0.0, 0.0, 0.5, 0.5, 1.0, 1.0]);
        assert_eq!(w, vec![0.01, 0.05, 0.01, 0.05, 0.01, 0.05]);
        assert!(Basis::new(5, &[0.01, 0.05]).is_err());
        assert!(Basis::new(4, &[0.0, 0.05]).is_err());
    }

    #[test]
    fn g_matches_a_direct_ridge_least_squares_solve() {
        let basis = Basis::new(16, &[0.05, 0.1]).unwrap();
        let (len, lambda) = (40, 0.5);
        let t = positions(len);
        let x = smooth(&t); // (L, 2)
        let b = fit(&ridge_matrix(&basis, &t, lambda, false).unwrap(), &x);
        // min ||Fᵀ B - X||² + λ||B||² as an ordinary least-squares problem:
        // [Fᵀ; sqrt(λ) I] B = [X; 0].
        let ft = basis.eval(&t); // (L, N)
        let a = Tensor::cat(&[ft, Tensor::eye(16, (Kind::Double, tch::Device::Cpu)) * lambda.sqrt()], 0);
        let rhs = Tensor::cat(&[x, Tensor::zeros([16, 2], (Kind::Double, tch::Device::Cpu))], 0);
        let direct = a.pinverse(1e-12).matmul(&rhs);
        assert!(max_abs(&(&b - &direct)) < 1e-8 * (1.0 + max_abs(&direct)), "{}", max_abs(&(&b - &direct)));
    }

    #[test]
    fn the_reconstruction_error_falls_as_the_basis_grows() {
        let len = 200;
        let t = positions(len);
        let x = smooth(&t);
        let errors: Vec<f64> = [8usize, 32, 128]
            .iter()
            .map(|&n| {
                let basis = Basis::new(n, &[0.01, 0.05]).unwrap();
                let b = fit(&ridge_matrix(&basis, &t, 0.5, false).unwrap(), &x);
                (evaluate(&basis, &b, &t) - &x).square().mean(Kind::Double).sqrt().double_value(&[])
            })
            .collect();
        assert!(errors[0] > errors[1] && errors[1] > errors[2], "{errors:?}");
        assert!(errors[2] < 0.02, "{errors:?}");
    }

    #[test]
    fn padding_pulls_the_signal_towards_zero_at_the_edges() {
        let (len, n) = (200, 128);
        let basis = Basis::new(n, &[0.01, 0.05]).unwrap();
        let t = positions(len);
        let x = smooth(&t);
        let edge_error = |pad| {
            let b = fit(&ridge_matrix(&basis, &t, 0.5, pad).unwrap(), &x);
            let err = evaluate(&basis, &b, &t) - &x;
            err.get(len - 1).abs().max().double_value(&[])
        };
        let (plain, padded) = (edge_error(false), edge_error(true));
        assert!(padded > 5.0 * plain, "padded {padded} vs plain {plain}");
    }

    #[test]
    fn the_closed_form_expectation_matches_numerical_integration() {
        let basis = Basis::new(8, &[0.02, 0.1]).unwrap();
        // Midpoint rule on [-3, 4], wide enough for every density here.
        let steps = 200_000;
        let dt = 7.0 / steps as f64;
        let t = Tensor::arange(steps, (Kind::Double, tch::Device::Cpu)) * dt + (dt / 2.0 - 3.0);
        let psi = basis.eval(&t); // (T, N)
        for (mu, sigma) in [(0.5, 0.05), (0.1, 0.01), (0.9, 0.3), (0.0, 0.2), (0.73, 0.002)] {
            let density = gaussian(&t, &Tensor::from(mu), &Tensor::from(sigma * sigma)); // (T)
            let numeric = (density.unsqueeze(1) * &psi).sum_dim_intlist([0i64].as_slice(), false, Kind::Double) * dt;
            let (mu, var) = (Tensor::from(mu), Tensor::from(sigma * sigma));
            for closed in [basis.expectation(&mu, &var).unwrap(), basis.expectation_formula(&mu, &var)] {
                let err = max_abs(&(&closed - &numeric)) / max_abs(&numeric);
                assert!(err < 1e-6, "mu {mu} sigma {sigma}: relative error {err}");
            }
        }
    }

    /// Seeded densities `(2, 3, 5)` over a basis of 12, the expectation through a seeded
    /// weighting, its gradients; by the fused node or the formula.
    fn expectation_and_grads(kind: Kind, fused: bool) -> (Tensor, Tensor, Tensor) {
        let basis = Basis::new(12, &[0.01, 0.05]).unwrap();
        let mut rng = lethe_core::rng::Rng::new(3);
        let mu = rng.normal_tensor(&[2, 3, 5], kind).sigmoid().set_requires_grad(true);
        let var = (rng.normal_tensor(&[2, 3, 5], kind).exp() * 0.01).set_requires_grad(true);
        let w = rng.normal_tensor(&[2, 3, 5, 12], kind);
        let r = if fused { basis.expectation(&mu, &var).unwrap() } else { basis.expectation_formula(&mu, &var) };
        (&r * &w).sum(kind).backward();
        (r.detach(), mu.grad(), var.grad())
    }

    #[test]
    fn the_fused_expectation_gives_what_the_formula_gives() {
        for (kind, tol) in [(Kind::Float, 1e-5), (Kind::Double, 1e-12)] {
            let (want, want_mu, want_var) = expectation_and_grads(kind, false);
            let (got, got_mu, got_var) = expectation_and_grads(kind, true);
            for (name, w, g) in [("r", want, got), ("dμ", want_mu, got_mu), ("dσ²", want_var, got_var)] {
                let err = max_abs(&(&g - &w)) / max_abs(&w);
                assert!(err < tol, "{kind:?} {name}: relative error {err}");
            }
        }
    }

    #[test]
    fn the_fused_expectations_gradients_match_finite_differences() {
        let basis = Basis::new(8, &[0.02, 0.1]).unwrap();
        let mut rng = lethe_core::rng::Rng::new(9);
        let mu = rng.normal_tensor(&[4], Kind::Double).sigmoid();
        let var = rng.normal_tensor(&[4], Kind::Double).exp() * 0.01;
        let w = rng.normal_tensor(&[4, 8], Kind::Double);
        let loss = |mu: &Tensor, var: &Tensor| (basis.expectation(mu, var).unwrap() * &w).sum(Kind::Double);
        let (m, v) = (mu.set_requires_grad(true), var.set_requires_grad(true));
        loss(&m, &v).backward();
        let h = 1e-6;
        for i in 0..4 {
            for (which, grad) in [(0, m.grad()), (1, v.grad())] {
                let bumped = |delta: f64| {
                    let (mu, var) = (mu.detach().copy(), var.detach().copy());
                    let t = if which == 0 { &mu } else { &var };
                    let _ = t.get(i).g_add_scalar_(delta);
                    loss(&mu, &var).double_value(&[])
                };
                let numeric = (bumped(h) - bumped(-h)) / (2.0 * h);
                let analytic = grad.double_value(&[i]);
                assert!(
                    (numeric - analytic).abs() < 1e-6 * (1.0 + numeric.abs()),
                    "{which} {i}: {numeric} vs {analytic}"
                );
            }
        }
    }

    #[test]
    fn after_an_update_the_old_signal_is_contracted_by_tau() {
        let basis = Basis::new(64, &[0.01, 0.05]).unwrap();
        let tau = 0.75;
        let old_x = smooth(&positions(100));
        let old = absorb(&basis, None, &old_x, &positions(1), tau, 0.5, false).unwrap();
        let new_x = Tensor::ones([30, 2], (Kind::Double, tch::Device::Cpu));
        let updated = absorb(&basis, Some(&old), &new_x, &positions(256), tau, 0.5, false).unwrap();
        // The updated signal at t·τ matches the old signal at t, within the regression error.
        let t = positions(50) * 0.9 + 0.05; // away from the joint at τ
        let before = evaluate(&basis, &old, &t);
        let after = evaluate(&basis, &updated, &(&t * tau));
        let fit_error = max_abs(&(evaluate(&basis, &old, &positions(100)) - &old_x));
        let moved = max_abs(&(&after - &before));
        assert!(moved < 0.02 + 4.0 * fit_error, "moved {moved}, fit error {fit_error}");
        // And the new vectors sit in (τ, 1]: away from the joint, the signal is close to them.
        let tail = evaluate(&basis, &updated, &(positions(20) * 0.15 + 0.8));
        let tail_error = (tail - 1.0).abs().mean(Kind::Double).double_value(&[]);
        assert!(tail_error < 0.1, "new part off by {tail_error} on average");
    }

    #[test]
    fn bin_masses_match_the_normal_distribution_function() {
        // N(0.5, 0.1²) over 4 bins of [0, 1]: Φ at ±2.5σ and 0 gives the masses.
        let mass: Vec<f64> = bin_mass(&Tensor::from(0.5), &Tensor::from(0.01), 4).try_into().unwrap();
        let phi = |z: f64| 0.5 * (1.0 + erf(z / 2f64.sqrt()));
        let expect = [phi(-2.5) - phi(-5.0), phi(0.0) - phi(-2.5), phi(2.5) - phi(0.0), phi(5.0) - phi(2.5)];
        for (a, b) in mass.iter().zip(expect) {
            assert!((a - b).abs() < 1e-9, "{mass:?} vs {expect:?}");
        }
    }

    #[test]
    fn the_histogram_of_two_densities_has_its_mass_at_their_means() {
        // Two narrow densities at 0.25 and 0.75 over 10 bins: summed and normalised, the
        // histogram sums to 1 and nearly all its mass is in bins 2 and 7, equally.
        let mass = bin_mass(&Tensor::from_slice(&[0.25, 0.75]), &Tensor::from_slice(&[1e-4, 1e-4]), 10)
            .sum_dim_intlist([0i64].as_slice(), false, Kind::Double);
        let hist: Vec<f64> = (&mass / mass.sum(Kind::Double)).try_into().unwrap();
        assert!((hist.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(hist[2] > 0.49 && hist[7] > 0.49, "{hist:?}");
        assert!((hist[2] - hist[7]).abs() < 1e-9);
    }

    /// erf by its Taylor series (enough terms for |x| <= 4).
    fn erf(x: f64) -> f64 {
        let (mut term, mut sum) = (x, x);
        for n in 1..200 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn quantile_positions_follow_the_histogram() {
        // All the mass in bin 2 of 4: every position lies in [0.5, 0.75), evenly.
        let hist = Tensor::from_slice(&[0.0, 0.0, 3.0, 0.0, 1.0, 1.0, 1.0, 1.0]).view([2, 4]);
        let t = quantile_positions(&hist, 4);
        let first: Vec<f64> = t.get(0).try_into().unwrap();
        assert_eq!(first, vec![0.53125, 0.59375, 0.65625, 0.71875]);
        // A flat histogram gives evenly spaced positions.
        let flat: Vec<f64> = t.get(1).try_into().unwrap();
        for (a, b) in flat.iter().zip([0.125, 0.375, 0.625, 0.875]) {
            assert!((a - b).abs() < 1e-12, "{flat:?}");
        }
        // Mass 3:1 over bins 0 and 3: three quarters of the points in bin 0.
        let skew = quantile_positions(&Tensor::from_slice(&[3.0, 0.0, 0.0, 1.0]).view([1, 4]), 8);
        let in_first = skew.lt(0.25).sum(Kind::Int64).int64_value(&[]);
        assert_eq!(in_first, 6);
    }
}
