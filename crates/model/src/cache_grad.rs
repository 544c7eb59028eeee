//! The gradient of a window's keys and values for the block's rows only.
//!
//! A memory layer projects `[cache, block]` `(b, n, d)` into keys and values (paper
//! Eq. 1 of each method: Transformer-XL recomputes the cached states' keys with the
//! current weights every block, and so does every mechanism here). The cache carries no
//! gradient, yet libtorch's backward pass of `states W^T` multiplies the gradient of
//! all `n` rows by `W` and the concatenation's backward pass then throws the cache's
//! rows away: at `enwik8-tiny` (a cache of 128 before a block of 64) two thirds of the
//! two products are wasted, at a span of 16k nearly all of them.
//!
//! [`keys_values_after_cache`] projects the states, joined from the detached cache and a
//! detached copy of the block (libtorch's backward pass then computes the weights' and
//! biases' gradients only, as before), and passes the keys and values through an
//! identity function of `csrc/cache_grad.cpp` whose backward pass gives the block
//! `gk[block] W_k + gv[block] W_v`: the numbers the plain projection gives its rows, so
//! training gives the same bits (`tests::it_computes_what_the_plain_projection_does`).
//! (Before, the gradient went to the joined states, zero in the cache's rows, and the
//! concatenation's backward pass cut the block's rows out of it.)
//!
//! [`project_ragged`] goes one step further for Expire-Span's per-stream cache, whose
//! streams are padded on the left to the longest one's: each stream's rows from its first
//! valid one are projected by their own products, and the weights' gradients are summed
//! over those rows only, so the padding costs nothing (a fifth of the rows of a trained
//! model at `enwik8-tiny`).

use std::ffi::{c_int, c_void};

use tch::{nn, Tensor};

use lethe_core::error::{LetheError, Result};
use lethe_kernels::{lethe_cache_tail_grad, lethe_ragged_project, raw_or_null, CacheTailArgs, RaggedProjectArgs};

/// Keys, values and (for Expire-Span) the span predictor's scores of a window, heads
/// not yet split ([`crate::attention::Projected`] has them split).
pub struct Projections {
    /// `states W_k^T + b_k` `(b, n, e)`.
    pub k: Tensor,
    /// `states W_v^T + b_v` `(b, n, e)`.
    pub v: Tensor,
    /// `states w` `(b, n)`, when a vector `w` was given.
    pub scores: Option<Tensor>,
}

/// The projections `k(states)` and `v(states)`, each `(b, n, e)`, of `states` `(b, n, d)`
/// whose last rows are the block `block` `(b, m, d)`. When `states` carries no gradient of
/// its own (the detached cache joined with `block.detach()`), the gradient goes to
/// `block`, computed for its rows only; the weights and biases get theirs as
/// `k.forward(states)` gives them.
///
/// Plain projections of `states` where there is nothing to save: `states` with a gradient
/// of its own (a cache normalised in this step), no cache, or no gradient.
pub fn keys_values_after_cache(
    states: &Tensor,
    block: &Tensor,
    k: &nn::Linear,
    v: &nn::Linear,
) -> Result<(Tensor, Tensor)> {
    let p = project_after_cache(states, block, k, v, None)?;
    Ok((p.k, p.v))
}

/// [`keys_values_after_cache`], and with `w` `(d)` the scores `states w` `(b, n)` too
/// (Expire-Span's span predictor), their gradient to the block summed with the keys'
/// and values' in one.
pub fn project_after_cache(
    states: &Tensor,
    block: &Tensor,
    k: &nn::Linear,
    v: &nn::Linear,
    w: Option<&Tensor>,
) -> Result<Projections> {
    let n = states.size().get(1).copied().unwrap_or(0);
    let fresh = block.size().get(1).copied().unwrap_or(0);
    // The scores first: the order of the projections is the order in which libtorch's
    // backward pass sums the states' gradients where this function is not used.
    let project = |s: &Tensor| {
        let scores = w.map(|w| s.matmul(w));
        Projections { k: s.linear(&k.ws, k.bs.as_ref()), v: s.linear(&v.ws, v.bs.as_ref()), scores }
    };
    if states.requires_grad() || !block.requires_grad() {
        return Ok(project(states));
    }
    if fresh <= 0 || fresh >= n {
        return Ok(project(block));
    }
    let plain = project(states);
    let mut out: [*mut c_void; 3] = [std::ptr::null_mut(); 3];
    let ptr = raw_or_null;
    let (wk, wv, ws) = (k.ws.detach(), v.ws.detach(), w.map(Tensor::detach));
    // SAFETY: every pointer is null or a live `at::Tensor*` owned by its `Tensor` for the
    // call (the function reads them only); on success it writes two new `at::Tensor*`, or
    // three with `w`.
    lethe_kernels::call("keys and values of the window", |error| unsafe {
        let args = CacheTailArgs {
            k: ptr(Some(&plain.k)),
            v: ptr(Some(&plain.v)),
            s: ptr(plain.scores.as_ref()),
            block: ptr(Some(block)),
            wk: ptr(Some(&wk)),
            wv: ptr(Some(&wv)),
            ws: ptr(ws.as_ref()),
        };
        lethe_cache_tail_grad(&args, out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each non-null pointer is taken over once.
    let mut taken = out.into_iter().filter(|p| !p.is_null()).map(|p| unsafe { lethe_kernels::tensor(p) });
    let (Some(k), Some(v)) = (taken.next(), taken.next()) else {
        return Err(LetheError::Invalid("keys and values of the window: too few tensors returned".into()));
    };
    Ok(Projections { k, v, scores: taken.next() })
}

/// [`project_after_cache`] of a ragged window (CPU only): each stream's rows from its
/// first `valid` one on, the left padding of Expire-Span's per-stream cache left out of
/// the products, forward and in the weights' gradients (`csrc/cache_grad.cpp`,
/// `RaggedProjection`). The padding's keys, values and scores are zero: only a reader that
/// skips them (the ragged attention) may use the result. `states` `(b, n, d)` carries no
/// gradient and ends with a copy of `block` `(b, m, d)`, which gets the gradient of its
/// rows; `valid` `(b, n)`. `blas` false takes libtorch's matrix products instead of the
/// BLAS library's (the tests' way to run that path).
pub fn project_ragged(
    states: &Tensor,
    block: &Tensor,
    valid: &Tensor,
    k: &nn::Linear,
    v: &nn::Linear,
    w: &Tensor,
    blas: bool,
) -> Result<Projections> {
    let mut out: [*mut c_void; 3] = [std::ptr::null_mut(); 3];
    let ptr = raw_or_null;
    // SAFETY: every pointer is null or a live `at::Tensor*` owned by its `Tensor` for the
    // call (the function reads them only); on success it writes three new `at::Tensor*`.
    lethe_kernels::call("keys and values of the ragged window", |error| unsafe {
        let args = RaggedProjectArgs {
            states: ptr(Some(states)),
            block: ptr(Some(block)),
            valid: ptr(Some(valid)),
            wk: ptr(Some(&k.ws)),
            bk: ptr(k.bs.as_ref()),
            wv: ptr(Some(&v.ws)),
            bv: ptr(v.bs.as_ref()),
            ws: ptr(Some(w)),
            blas: c_int::from(blas),
        };
        lethe_ragged_project(&args, out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each non-null pointer is taken over once.
    let mut taken = out.into_iter().filter(|p| !p.is_null()).map(|p| unsafe { lethe_kernels::tensor(p) });
    let (Some(k), Some(v), Some(scores)) = (taken.next(), taken.next(), taken.next()) else {
        return Err(LetheError::Invalid("keys and values of the ragged window: too few tensors returned".into()));
    };
    Ok(Projections { k, v, scores: Some(scores) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::rng::Rng;
    use tch::Kind;

    /// How a test projects the window of a cache and a block: keys, values and the
    /// scores `states w`.
    type Project = dyn Fn(&Tensor, &Tensor, &nn::Linear, &nn::Linear, &Tensor) -> (Tensor, Tensor, Tensor);

    /// Keys, values and scores of `[cache, x]` through `project`, the loss `sum(k * rk) +
    /// sum(v * rv)` (plus `sum(sigmoid(scores))` with `scores`, as Expire-Span's span
    /// predictor), and the gradients of `x` and of the weights and biases.
    fn run(project: &Project, kind: Kind, cached: i64, bias: bool, scores: bool) -> Vec<Tensor> {
        let mut rng = Rng::new(31);
        let mut vs = nn::VarStore::new(tch::Device::Cpu);
        let cfg = nn::LinearConfig { bias, ..Default::default() };
        let (k, v) = (nn::linear(vs.root() / "k", 16, 12, cfg), nn::linear(vs.root() / "v", 16, 12, cfg));
        let w = vs.root().var("w", &[16], nn::Init::Const(0.0));
        tch::no_grad(|| {
            for mut t in vs.trainable_variables() {
                let values = rng.normal_tensor(&t.size(), Kind::Float);
                t.copy_(&values);
            }
        });
        if kind == Kind::Double {
            vs.double();
        }
        let cache = rng.normal_tensor(&[3, cached, 16], kind);
        let x = rng.normal_tensor(&[3, 5, 16], kind).set_requires_grad(true);
        let (rk, rv) = (rng.normal_tensor(&[3, cached + 5, 12], kind), rng.normal_tensor(&[3, cached + 5, 12], kind));
        let block = &x * 1.0;
        let (keys, values, s) = project(&cache, &block, &k, &v, &w);
        let mut loss = (&keys * &rk).sum(kind) + (&values * &rv).sum(kind);
        if scores {
            loss += s.sigmoid().sum(kind);
        }
        loss.backward();
        let mut out = vec![keys.detach(), values.detach(), x.grad()];
        let mut named: Vec<_> = vs.variables().into_iter().filter(|(name, _)| scores || name != "w").collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        out.extend(named.iter().map(|(_, t)| t.grad()));
        out
    }

    /// The projections as Expire-Span computed them before: of the joined states with the
    /// block's gradient, the spans' scores first.
    fn plain(cache: &Tensor, block: &Tensor, k: &nn::Linear, v: &nn::Linear, w: &Tensor) -> (Tensor, Tensor, Tensor) {
        let states = Tensor::cat(&[cache, block], 1);
        let scores = states.matmul(w);
        (states.linear(&k.ws, k.bs.as_ref()), states.linear(&v.ws, v.bs.as_ref()), scores)
    }

    /// The states as the memories join them for this module: the block detached.
    fn joined(cache: &Tensor, block: &Tensor) -> Tensor {
        Tensor::cat(&[cache, &block.detach()], 1)
    }

    fn keys_values(
        cache: &Tensor,
        block: &Tensor,
        k: &nn::Linear,
        v: &nn::Linear,
        w: &Tensor,
    ) -> (Tensor, Tensor, Tensor) {
        let states = joined(cache, block);
        let (keys, values) = keys_values_after_cache(&states, block, k, v).unwrap();
        (keys, values, Tensor::cat(&[cache, block], 1).matmul(w))
    }

    fn with_scores(
        cache: &Tensor,
        block: &Tensor,
        k: &nn::Linear,
        v: &nn::Linear,
        w: &Tensor,
    ) -> (Tensor, Tensor, Tensor) {
        let p = project_after_cache(&joined(cache, block), block, k, v, Some(w)).unwrap();
        (p.k, p.v, p.scores.unwrap())
    }

    #[test]
    fn it_computes_what_the_plain_projection_does() {
        let cases = [
            (Kind::Float, 7, false),
            (Kind::Float, 7, true),
            (Kind::Float, 40, false),
            (Kind::Double, 2, true),
            (Kind::Float, 0, true),
        ];
        for ((kind, cached, bias), scores) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
            let ours: &Project = if scores { &with_scores } else { &keys_values };
            let (want, got) = (run(&plain, kind, cached, bias, scores), run(ours, kind, cached, bias, scores));
            assert_eq!(want.len(), got.len());
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                // Bit for bit in float32, what training runs. The block rows' gradient is a
                // product of fewer rows than the plain one's, and in float64 MKL on an AMD
                // EPYC (Zen 4) sums it in another order for some row counts (1.8e-15 off in
                // the states' gradient of the case with 2 cached rows): double rounding there.
                let same = match kind {
                    Kind::Double => a.allclose(b, 1e-13, 1e-13, false),
                    _ => a.equal(b),
                };
                assert!(
                    same,
                    "{kind:?}, cache {cached}, bias {bias}, scores {scores}: output {i} differs by {}",
                    (a - b).abs().max().double_value(&[])
                );
            }
        }
    }

    #[test]
    fn the_block_gets_the_gradient_of_its_rows() {
        let mut rng = Rng::new(5);
        let mut vs = nn::VarStore::new(tch::Device::Cpu);
        let cfg = nn::LinearConfig { bias: false, ..Default::default() };
        let (k, v) = (nn::linear(vs.root() / "k", 4, 3, cfg), nn::linear(vs.root() / "v", 4, 3, cfg));
        vs.double();
        let cache = rng.normal_tensor(&[2, 4, 4], Kind::Double);
        let block = rng.normal_tensor(&[2, 2, 4], Kind::Double).set_requires_grad(true);
        let (keys, values) = keys_values_after_cache(&joined(&cache, &block), &block, &k, &v).unwrap();
        // Only the keys used: the values' gradient is undefined in the backward pass.
        keys.sum(Kind::Double).backward();
        let grad = block.grad();
        assert_eq!(grad.size(), [2, 2, 4], "the block's own shape: no cache rows");
        // d sum(k) / d states = the column sums of W_k, in every block row.
        let want = k.ws.to_kind(Kind::Double).sum_dim_intlist([0i64].as_slice(), false, Kind::Double);
        for (s, j) in [(0, 0), (1, 1)] {
            assert!(grad.get(s).get(j).allclose(&want, 1e-12, 1e-12, false));
        }
        assert!(values.requires_grad());
    }

    #[test]
    fn finite_differences_agree_with_the_block_rows_gradient() {
        let mut rng = Rng::new(8);
        let mut vs = nn::VarStore::new(tch::Device::Cpu);
        let cfg = nn::LinearConfig { bias: true, ..Default::default() };
        let (k, v) = (nn::linear(vs.root() / "k", 4, 3, cfg), nn::linear(vs.root() / "v", 4, 3, cfg));
        vs.double();
        let (rk, rv) = (rng.normal_tensor(&[2, 5, 3], Kind::Double), rng.normal_tensor(&[2, 5, 3], Kind::Double));
        let cache = rng.normal_tensor(&[2, 2, 4], Kind::Double);
        let loss = |block: &Tensor| {
            let (a, b) = keys_values_after_cache(&joined(&cache, block), block, &k, &v).unwrap();
            (a.tanh() * &rk).sum(Kind::Double) + (b.square() * &rv).sum(Kind::Double)
        };
        let block = rng.normal_tensor(&[2, 3, 4], Kind::Double).set_requires_grad(true);
        loss(&block).backward();
        let grad = block.grad();
        for (s, j, c) in [(0, 0, 0), (1, 1, 2), (1, 2, 3), (0, 2, 1)] {
            let numeric = crate::central_difference(&block, &[s, j, c], loss);
            let analytic = grad.double_value(&[s, j, c]);
            assert!((numeric - analytic).abs() < 1e-6, "({s}, {j}, {c}): {numeric} against {analytic}");
        }
    }

    /// A ragged window: 3 streams of `n` states whose first `starts[s]` are padding
    /// (`valid` false; the last one has none valid), the last 3 a copy of the block.
    struct RaggedCase {
        states: Tensor,
        block: Tensor,
        valid: Tensor,
        k: nn::Linear,
        v: nn::Linear,
        w: Tensor,
        /// The loss's weights on the keys, values and scores: zero in the padding.
        rk: Tensor,
        rv: Tensor,
        rs: Tensor,
    }

    fn ragged_case(kind: Kind, bias: bool, starts: [i64; 3]) -> RaggedCase {
        let mut rng = Rng::new(17);
        let (n, m, d, e) = (9, 3, 6, 4);
        let weight = |rng: &mut Rng, shape: &[i64]| rng.normal_tensor(shape, kind).set_requires_grad(true);
        let linear = |rng: &mut Rng| nn::Linear { ws: weight(rng, &[e, d]), bs: bias.then(|| weight(rng, &[e])) };
        let (k, v, w) = (linear(&mut rng), linear(&mut rng), weight(&mut rng, &[d]));
        let block = rng.normal_tensor(&[3, m, d], kind).set_requires_grad(true);
        let cache = rng.normal_tensor(&[3, n - m, d], kind);
        let states = Tensor::cat(&[&cache, &block.detach()], 1);
        let columns = Tensor::arange(n, (Kind::Int64, tch::Device::Cpu)).unsqueeze(0); // (1, n)
        let valid = columns.ge_tensor(&Tensor::from_slice(&starts).unsqueeze(1)); // (3, n)
        let on_valid = |t: Tensor| t * valid.unsqueeze(-1).to_kind(kind);
        let (rk, rv) = (on_valid(rng.normal_tensor(&[3, n, e], kind)), on_valid(rng.normal_tensor(&[3, n, e], kind)));
        let rs = rng.normal_tensor(&[3, n], kind) * valid.to_kind(kind);
        RaggedCase { states, block, valid, k, v, w, rk, rv, rs }
    }

    impl RaggedCase {
        /// The loss `sum(k rk) + sum(v rv) + sum(tanh(s) rs)` of projections of the block.
        fn loss(&self, p: &Projections) -> Tensor {
            let kind = self.states.kind();
            let s = p.scores.as_ref().expect("scores");
            (&p.k * &self.rk).sum(kind) + (&p.v * &self.rv).sum(kind) + (s.tanh() * &self.rs).sum(kind)
        }

        /// The projections and, after the loss's backward pass, the gradients of the
        /// block, both weights and biases and `w`.
        fn outputs(&self, project: impl Fn(&Self) -> Projections) -> Vec<Tensor> {
            let params = [
                Some(&self.k.ws),
                self.k.bs.as_ref(),
                Some(&self.v.ws),
                self.v.bs.as_ref(),
                Some(&self.w),
                Some(&self.block),
            ];
            for t in params.iter().flatten() {
                let mut g = t.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let p = project(self);
            self.loss(&p).backward();
            let mut out = vec![p.k.detach(), p.v.detach(), p.scores.as_ref().expect("scores").detach()];
            out.extend(params.iter().flatten().map(|t| t.grad()));
            out
        }

        fn ragged(&self, blas: bool) -> Projections {
            project_ragged(&self.states, &self.block, &self.valid, &self.k, &self.v, &self.w, blas).unwrap()
        }

        /// The padded projection with the padding's rows set to zero.
        fn padded(&self) -> Projections {
            let p = project_after_cache(&self.states, &self.block, &self.k, &self.v, Some(&self.w)).unwrap();
            let kind = self.states.kind();
            let mask = self.valid.to_kind(kind);
            let rows = mask.unsqueeze(-1);
            Projections { k: p.k * &rows, v: p.v * &rows, scores: p.scores.map(|s| s * &mask) }
        }
    }

    #[test]
    fn the_ragged_projection_equals_the_padded_one_on_the_valid_rows() {
        for (kind, bias, blas) in [
            (Kind::Double, true, true),
            (Kind::Double, false, true),
            (Kind::Double, true, false),
            (Kind::Float, true, true),
        ] {
            let case = ragged_case(kind, bias, [2, 0, 9]);
            let (want, got) = (case.outputs(RaggedCase::padded), case.outputs(|c| c.ragged(blas)));
            assert_eq!(want.len(), got.len());
            let tol = if kind == Kind::Double { 1e-12 } else { 1e-5 };
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!(
                    a.allclose(b, tol, tol, false),
                    "{kind:?}, bias {bias}, blas {blas}: output {i} differs by {}",
                    (a - b).abs().max().double_value(&[])
                );
            }
        }
    }

    #[test]
    fn the_ragged_projection_leaves_the_padding_zero() {
        let case = ragged_case(Kind::Double, true, [2, 0, 9]);
        let p = case.ragged(true);
        // Stream 0's first two rows and all of stream 2's (none valid) are padding.
        let padding = [p.k.get(0).narrow(0, 0, 2), p.v.get(0).narrow(0, 0, 2), p.k.get(2), p.scores.unwrap().get(2)];
        assert!(padding.iter().all(|t| t.abs().max().double_value(&[]) == 0.0));
        assert!(p.k.get(0).get(2).abs().max().double_value(&[]) > 0.0, "the first valid row is projected");
    }

    #[test]
    fn finite_differences_agree_with_the_ragged_projections_gradients() {
        let case = ragged_case(Kind::Double, true, [2, 0, 4]);
        let grads = case.outputs(|c| c.ragged(true));
        let (gwk, gbk, gwv, gbv, gw, gblock) = (&grads[3], &grads[4], &grads[5], &grads[6], &grads[7], &grads[8]);
        // Each input perturbed in a copy of the case, the loss recomputed.
        let loss_with = |edit: &dyn Fn(&mut RaggedCase, &Tensor), t: &Tensor| {
            let mut c = ragged_case(Kind::Double, true, [2, 0, 4]);
            edit(&mut c, t);
            c.states = Tensor::cat(&[&c.states.narrow(1, 0, 6), &c.block.detach()], 1);
            c.loss(&c.ragged(true))
        };
        // (input, its gradient, the entry checked, how to put a perturbed copy in a case)
        type Check<'a> = (&'a Tensor, &'a Tensor, &'a [i64], &'a dyn Fn(&mut RaggedCase, &Tensor));
        let checks: [Check; 6] = [
            (&case.k.ws, gwk, &[1, 3], &|c, t| c.k.ws = t.shallow_clone()),
            (case.k.bs.as_ref().unwrap(), gbk, &[2], &|c, t| c.k.bs = Some(t.shallow_clone())),
            (&case.v.ws, gwv, &[3, 0], &|c, t| c.v.ws = t.shallow_clone()),
            (case.v.bs.as_ref().unwrap(), gbv, &[0], &|c, t| c.v.bs = Some(t.shallow_clone())),
            (&case.w, gw, &[5], &|c, t| c.w = t.shallow_clone()),
            (&case.block, gblock, &[2, 1, 4], &|c, t| c.block = t.shallow_clone()),
        ];
        for (i, (t, grad, at, edit)) in checks.into_iter().enumerate() {
            let numeric = crate::central_difference(t, at, |x| loss_with(edit, x));
            let analytic = grad.double_value(at);
            assert!(
                (numeric - analytic).abs() < 1e-6 * (1.0 + analytic.abs()),
                "input {i} at {at:?}: {numeric} against {analytic}"
            );
        }
    }

    #[test]
    fn a_bad_ragged_window_is_an_error() {
        let case = ragged_case(Kind::Double, true, [2, 0, 9]);
        let wrong_valid = case.valid.narrow(1, 0, 5);
        let err = project_ragged(&case.states, &case.block, &wrong_valid, &case.k, &case.v, &case.w, true)
            .err()
            .expect("an error");
        assert!(err.to_string().contains("validity"), "{err}");
        let with_grad = case.states.copy().set_requires_grad(true);
        let err = project_ragged(&with_grad, &case.block, &case.valid, &case.k, &case.v, &case.w, true)
            .err()
            .expect("an error");
        assert!(err.to_string().contains("detach"), "{err}");
        let float_w = case.w.to_kind(Kind::Float);
        let err = project_ragged(&case.states, &case.block, &case.valid, &case.k, &case.v, &float_w, true)
            .err()
            .expect("an error");
        assert!(err.to_string().contains("kind"), "{err}");
    }
}
