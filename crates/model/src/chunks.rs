//! The narrows of a block's attention chunks as one autograd node.
//!
//! On the CPU the window mechanisms and Expire-Span take a block's queries in chunks
//! ([`super::memory::window::query_chunks`]), each over its own range of the keys: every
//! chunk narrows the queries, the keys and the values. libtorch's backward pass of a
//! `narrow` fills a zero tensor of the whole input's size and copies the chunk's
//! gradient into it, and the engine then adds the whole-size tensors up: for `c` chunks,
//! `c` fills and `c - 1` additions of the whole tensor (on the comparison model of `scripts/vs-official.sh`, 4 chunks
//! over keys of `(8, 4, 768, 64)`, a quarter of the backward pass in a trace).
//!
//! [`narrows`] gives the same views through one node of `csrc/chunks.cpp`, whose
//! backward pass fills one zero tensor and adds each chunk's gradient into its own range,
//! last chunk first, the order in which the engine ran the narrows' backward passes, so
//! the sums round as before (`tests::it_gives_what_the_narrows_give`).

use std::ffi::c_void;

use tch::Tensor;

use super::attention::part;
use lethe_core::error::Result;
use lethe_kernels::{lethe_chunks, raw};

/// The narrows `t.narrow(dim, start, len)` of `t` for each `(start, len)` of `ranges`,
/// in order: views, as `narrow` gives. With gradient, they are the outputs of one
/// autograd node (see the module doc); a single range, or a tensor without gradient,
/// gives plain [`part`]s.
pub fn narrows(t: &Tensor, dim: i64, ranges: &[(i64, i64)]) -> Result<Vec<Tensor>> {
    if ranges.len() < 2 || !t.requires_grad() {
        return Ok(ranges.iter().map(|&(start, len)| part(t, dim, start, len)).collect());
    }
    let dims = t.dim() as i64;
    let dim = if dim < 0 { dim + dims } else { dim };
    let (starts, lens): (Vec<i64>, Vec<i64>) = ranges.iter().copied().unzip();
    let mut out: Vec<*mut c_void> = vec![std::ptr::null_mut(); ranges.len()];
    // SAFETY: `t` is a live `at::Tensor*` for the call, read only; `starts` and `lens`
    // hold `count` values each; on success the function writes `count` new
    // `at::Tensor*` to `out`, which is that long.
    lethe_kernels::call("the attention chunks", |error| unsafe {
        lethe_chunks(raw(t), dim, starts.as_ptr(), lens.as_ptr(), ranges.len() as i64, out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each pointer is taken over once.
    Ok(out.into_iter().map(|p| unsafe { lethe_kernels::tensor(p) }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::rng::Rng;
    use tch::Kind;

    /// Chunks over keys `(b, h, n, dh)` as the attention takes them: overlapping, then
    /// disjoint, one range that covers everything twice, and two short ones that leave
    /// rows of the tensor out.
    const CASES: [&[(i64, i64)]; 4] =
        [&[(0, 9), (3, 10), (7, 8), (10, 5)], &[(0, 4), (4, 4), (8, 7)], &[(0, 15), (0, 15)], &[(2, 3), (5, 1)]];

    /// The chunks of `t` through `narrow`, each through its own function (as the
    /// chunks' products differ), concatenated; the loss, and the gradient of `t`.
    fn run(kind: Kind, dim: i64, ranges: &[(i64, i64)], ours: bool) -> (Tensor, Tensor) {
        let mut rng = Rng::new(11);
        let t = rng.normal_tensor(&[2, 3, 15, 4], kind);
        let t = if dim == 2 { t } else { t.transpose(2, 3).contiguous() }.set_requires_grad(true);
        let parts = if ours {
            narrows(&t, dim, ranges).unwrap()
        } else {
            ranges.iter().map(|&(s, l)| t.narrow(dim, s, l)).collect()
        };
        let outs: Vec<Tensor> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let w = rng.normal_tensor(&p.size(), kind);
                (p * &w).tanh().sum_dim_intlist(dim, false, kind) * (i as f64 + 1.0)
                // (2, 3, 4)
            })
            .collect();
        let loss = Tensor::cat(&outs, -1).square().sum(kind);
        loss.backward();
        (loss.detach(), t.grad())
    }

    #[test]
    fn it_gives_what_the_narrows_give() {
        for kind in [Kind::Float, Kind::Double] {
            for dim in [2, -1] {
                for ranges in CASES {
                    let ((want_loss, want), (got_loss, got)) =
                        (run(kind, dim, ranges, false), run(kind, dim, ranges, true));
                    assert!(want_loss.equal(&got_loss), "{kind:?}, dim {dim}, {ranges:?}: losses differ");
                    assert!(
                        want.equal(&got),
                        "{kind:?}, dim {dim}, {ranges:?}: gradients differ by {}",
                        (&want - &got).abs().max().double_value(&[])
                    );
                }
            }
        }
    }

    #[test]
    fn the_chunks_are_views_and_a_chunk_left_unused_passes_no_gradient() {
        let t = Tensor::arange(24, (Kind::Double, tch::Device::Cpu)).view([2, 12]).set_requires_grad(true);
        let parts = narrows(&t, 1, &[(0, 5), (4, 8), (10, 2)]).unwrap();
        assert!(parts[1].equal(&t.narrow(1, 4, 8)));
        assert_eq!(parts[1].data_ptr(), t.narrow(1, 4, 8).data_ptr());
        // d/dt of 3 * sum(chunk 0) + sum(chunk 2): 3 in 0..5, 1 in 10..12, 0 elsewhere.
        (parts[0].sum(Kind::Double) * 3.0 + parts[2].sum(Kind::Double)).backward();
        let want: Vec<f64> = (0..12)
            .map(|j| {
                if j < 5 {
                    3.0
                } else if j >= 10 {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        let want = Tensor::from_slice(&want).view([1, 12]).expand([2, 12], false);
        assert!(t.grad().equal(&want), "{}", t.grad());
    }

    #[test]
    fn finite_differences_agree() {
        let mut rng = Rng::new(3);
        let t = rng.normal_tensor(&[2, 10, 3], Kind::Double).set_requires_grad(true);
        let ranges = [(0, 6), (2, 6), (5, 5)];
        let weights: Vec<Tensor> = ranges.iter().map(|&(_, l)| rng.normal_tensor(&[2, l, 3], Kind::Double)).collect();
        let loss = |x: &Tensor| -> Tensor {
            let parts = narrows(x, 1, &ranges).unwrap();
            parts
                .iter()
                .zip(&weights)
                .map(|(p, w)| (p * w).sin().sum(Kind::Double))
                .fold(Tensor::zeros([], (Kind::Double, tch::Device::Cpu)), |a, b| a + b)
        };
        loss(&t).backward();
        let grad = t.grad();
        for (s, j, c) in [(0, 0, 0), (1, 3, 2), (0, 5, 1), (1, 9, 0), (0, 7, 2)] {
            let numeric = crate::central_difference(&t, &[s, j, c], loss);
            let analytic = grad.double_value(&[s, j, c]);
            assert!((numeric - analytic).abs() < 1e-7, "({s}, {j}, {c}): {numeric} against {analytic}");
        }
    }

    #[test]
    fn a_range_out_of_the_tensor_is_refused_with_its_numbers() {
        let t = Tensor::zeros([2, 6], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let err = narrows(&t, 1, &[(0, 3), (4, 3)]).expect_err("out of range").to_string();
        assert!(err.contains("chunk 1 (4 + 3)") && err.contains("6 rows"), "{err}");
    }
}
