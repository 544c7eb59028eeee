//! The relative positions' skew (Dai et al., 2019, appendix B; the adaptive-span code's
//! `_skew`) as one autograd node on the CPU.
//!
//! [`super::attention::window_positions`] lays out the scores `q·key_pe` of `p`
//! distances, flipped, `(b, h, m, p)`, by key: row `i` shifted right by `i`, padded with
//! `-inf`, narrowed to the `n = cached + m` keys. Written as pad, view, narrow, view,
//! narrow ([`skew_views`]) the forward pass is views, but the backward pass fills a zero
//! tensor of the whole padded size for each narrow and copies the gradient in and out
//! (`SliceBackward0`, `ConstantPadNdBackward0`: 2.6 ms of a 28 ms Transformer-XL step at
//! `enwik8-tiny` in a trace). [`skew`] gives the same tensor from `csrc/skew.cpp`, whose
//! passes write each row once; every value is copied, never summed, so the outputs and
//! gradients are the views' to the bit (`tests::it_gives_what_the_views_give`).

use std::ffi::c_void;

use tch::{Device, Tensor};

use lethe_core::error::Result;
use lethe_kernels::{lethe_skew, raw};

/// The scores `flipped` `(b, h, m, p)` of distances `p - 1` down to 0 laid out by key:
/// `(b, h, m, n)` with `n = cached + m`, key `j` of query `i` at distance
/// `cached + i - j`, `-inf` where that is below 0 or above `p - 1`. Needs `cached < p`.
/// On the CPU one node of `csrc/skew.cpp`; elsewhere [`skew_views`].
pub fn skew(flipped: &Tensor, cached: i64, n: i64) -> Result<Tensor> {
    if flipped.device() != Device::Cpu {
        return Ok(skew_views(flipped, cached, n));
    }
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `flipped` is a live `at::Tensor*` for the call, read only; on success the
    // function writes one new `at::Tensor*` to `out`.
    lethe_kernels::call("the relative positions' skew", |error| unsafe {
        lethe_skew(raw(flipped), cached, n, &mut out, error)
    })?;
    // SAFETY: see above; the pointer is taken over once.
    Ok(unsafe { lethe_kernels::tensor(out) })
}

/// [`skew`] as libtorch views: pad with `m + 1` columns of `-inf`, view flat, cut, view
/// `(b, h, m, p + m)` (row `i` is `flipped[i]` from column `i`), narrow to the keys.
pub fn skew_views(flipped: &Tensor, cached: i64, n: i64) -> Tensor {
    let (b, h, m, p) = flipped.size4().expect("scores must be (b, h, m, p)");
    flipped
        .pad([0, m + 1], "constant", f64::NEG_INFINITY) // (b, h, m, p+m+1)
        .view([b, h, m * (p + m + 1)])
        .narrow(2, 0, m * (p + m))
        .view([b, h, m, p + m]) // row i: flipped[i] starting at column i
        .narrow(3, p - 1 - cached, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::rng::Rng;
    use tch::Kind;

    /// `(b, h, m, p, cached)`: a full window (p = cached + 1), distances beyond the keys
    /// (p > n), a cache trimmed short of the span, and no cache.
    const CASES: [(i64, i64, i64, i64, i64); 4] = [(2, 3, 5, 8, 7), (1, 2, 4, 20, 3), (2, 1, 6, 9, 2), (1, 2, 5, 5, 0)];

    /// The skew of seeded scores through a seeded function; the output, the loss and the
    /// scores' gradient.
    fn run(kind: Kind, (b, h, m, p, cached): (i64, i64, i64, i64, i64), ours: bool) -> (Tensor, Tensor) {
        let mut rng = Rng::new(5);
        let flipped = rng.normal_tensor(&[b, h, m, p], kind).set_requires_grad(true);
        let n = cached + m;
        let out = if ours { skew(&flipped, cached, n).unwrap() } else { skew_views(&flipped, cached, n) };
        let w = rng.normal_tensor(&[b, h, m, n], kind);
        // exp(-inf) = 0: the hidden keys add nothing, and their gradient is zero.
        ((&out + &w).exp() * &w).sum(kind).backward();
        (out.detach(), flipped.grad())
    }

    /// In every floating-point precision (bfloat16 and half under autocast): the skew
    /// copies, so the copies are the views' to the bit.
    #[test]
    fn it_gives_what_the_views_give() {
        for kind in [Kind::Float, Kind::Double, Kind::BFloat16, Kind::Half] {
            for case in CASES {
                let ((want, want_grad), (got, got_grad)) = (run(kind, case, false), run(kind, case, true));
                assert!(got.is_contiguous());
                assert!(want.equal(&got), "{kind:?} {case:?}: outputs differ");
                assert!(want_grad.equal(&got_grad), "{kind:?} {case:?}: gradients differ");
            }
        }
    }

    /// By hand: one row of 3 distances `[d2, d1, d0]` (flipped) over a cache of 1 and a
    /// block of 2: query 0 sees key 0 at distance 1, key 1 at 0, not key 2; query 1 sees
    /// keys 0-2 at distances 2, 1, 0.
    #[test]
    fn keys_get_the_score_of_their_distance() {
        let flipped = Tensor::from_slice(&[12.0f64, 11.0, 10.0, 22.0, 21.0, 20.0]).view([1, 1, 2, 3]);
        let got: Vec<f64> = skew(&flipped, 1, 3).unwrap().flatten(0, -1).try_into().unwrap();
        assert_eq!(got, [11.0, 10.0, f64::NEG_INFINITY, 22.0, 21.0, 20.0]);
    }

    #[test]
    fn finite_differences_agree() {
        let mut rng = Rng::new(8);
        let flipped = rng.normal_tensor(&[1, 2, 4, 6], Kind::Double).set_requires_grad(true);
        let w = rng.normal_tensor(&[1, 2, 4, 7], Kind::Double);
        let loss = |x: &Tensor| (skew(x, 3, 7).unwrap().exp() * &w).sum(Kind::Double);
        loss(&flipped).backward();
        let grad = flipped.grad();
        for at in [[0, 0, 0, 5], [0, 1, 3, 0], [0, 0, 2, 2], [0, 1, 1, 4], [0, 0, 0, 0]] {
            let numeric = crate::central_difference(&flipped, &at, loss);
            let analytic = grad.double_value(&at);
            assert!((numeric - analytic).abs() < 1e-7, "{at:?}: {numeric} against {analytic}");
        }
    }

    #[test]
    fn a_cache_longer_than_the_distances_is_refused() {
        let flipped = Tensor::zeros([1, 1, 2, 3], (Kind::Float, Device::Cpu));
        let err = skew(&flipped, 3, 5).expect_err("cache of 3 over 3 distances").to_string();
        assert!(err.contains("3 cached keys"), "{err}");
        // The kernels' message comes back naming the piece, with its first line only.
        assert!(err.starts_with("the relative positions' skew: "), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
