//! The matrix-vector products of decoding one token at a time (`csrc/decode.cpp`): a
//! pretrained decoder reads every weight once per token and does two FLOPs per value,
//! so memory bandwidth bounds it, and libtorch's product of one row by a large matrix
//! reached about a third of this machine's read rate. [`linear`] streams each row of the
//! weights once for the few rows of input; it equals libtorch's `linear` to float32
//! rounding (sums in another order). [`read_sum`] is the read-rate probe of `lethe
//! bench`: the same streaming read, summed.

use std::ffi::c_void;

use tch::{Device, Kind, Tensor};

use lethe_core::error::Result;
use lethe_kernels::{lethe_decode_attention, lethe_decode_linear, lethe_read_sum, raw, raw_or_null};

/// Rows of input up to which [`linear`] streams the weights; more take libtorch's
/// matrix product, which reuses each weight across rows from cache.
pub const MAX_ROWS: i64 = 4;

/// `x w^T + bias` for `x` `(.., k)` of at most [`MAX_ROWS`] rows on the CPU in float32
/// or in bfloat16 (the weights streamed as they are, the sums in float32, each output
/// rounded to bfloat16); for more rows in half precision on a CPU without instructions
/// for it ([`half_products_native`]), the product of the values widened to float32,
/// rounded once; libtorch's `linear` otherwise.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let rows = x.numel() as i64 / x.size().last().copied().unwrap_or(1).max(1);
    let kinds = matches!((x.kind(), w.kind()), (Kind::Float, Kind::Float) | (Kind::BFloat16, Kind::BFloat16));
    let half = matches!(x.kind(), Kind::BFloat16 | Kind::Half) && w.kind() == x.kind();
    if x.device() == Device::Cpu && half && rows > MAX_ROWS && !half_products_native(x.kind()) {
        return Ok(widened_linear(x, w, bias));
    }
    if x.device() != Device::Cpu || !kinds || rows > MAX_ROWS {
        return Ok(x.linear(w, bias));
    }
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the tensors are live `at::Tensor*` for the call, read only; on success the
    // function writes one new `at::Tensor*` to `out`.
    lethe_kernels::call("the decode product", |error| unsafe {
        lethe_decode_linear(raw(x), raw(w), raw_or_null(bias), &mut out, error)
    })?;
    // SAFETY: see above; the pointer is taken over once.
    Ok(unsafe { lethe_kernels::tensor(out) })
}

pub use lethe_core::device::half_products_native;

/// `x w^T + bias` of half-precision values, computed in float32 (the widening is exact,
/// the sums in float32 as libtorch's half-precision products sum) and rounded once.
fn widened_linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
    let float = |t: &Tensor| t.to_kind(Kind::Float);
    float(x).linear(&float(w), bias.map(float).as_ref()).to_kind(x.kind())
}

/// One token's attention: queries `q` `(b, kv_heads, group, hd)` over `keys` and
/// `values` `(b, kv_heads, n, hd)` read where the cache holds them (each head's rows
/// contiguous), a policy's `bias` `(b, 1 or kv_heads, 1, n)` added to the scores when
/// given. Returns the context `(b, kv_heads, group, hd)` and the weights
/// `softmax(q k^T scale + bias)` `(b, kv_heads, group, n)`, in float32; over bfloat16
/// or float16 queries, keys and values, rounded as eager attention rounds (scores,
/// weights and context in that precision, the softmax in float32), the weights given in
/// float32.
pub fn attention(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    bias: Option<&Tensor>,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let mut out: [*mut c_void; 2] = [std::ptr::null_mut(); 2];
    // SAFETY: the tensors are live `at::Tensor*` for the call, read only; on success the
    // function writes two new `at::Tensor*` to `out`.
    lethe_kernels::call("the decode attention", |error| unsafe {
        lethe_decode_attention(raw(q), raw(keys), raw(values), raw_or_null(bias), scale, out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each pointer is taken over once.
    Ok(unsafe { (lethe_kernels::tensor(out[0]), lethe_kernels::tensor(out[1])) })
}

/// The sum of a float32 tensor's values, read once as a stream per thread.
pub fn read_sum(x: &Tensor) -> Result<f64> {
    let mut sum = 0.0;
    // SAFETY: `x` is a live `at::Tensor*` for the call, read only.
    lethe_kernels::call("the read probe", |error| unsafe { lethe_read_sum(raw(x), &mut sum, error) })?;
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against libtorch's `linear`, with and without a bias, for 1 to 4 rows and sizes
    /// that are not multiples of the kernel's sixteen lanes.
    #[test]
    fn it_equals_libtorchs_linear() {
        let _seed = lethe_core::rng::seed_torch(0);
        for (rows, n, k) in [(1, 700, 576), (3, 33, 17), (4, 5, 1536), (1, 1, 3)] {
            let (x, w, b) = (
                Tensor::randn([1, rows, k], (Kind::Float, Device::Cpu)),
                Tensor::randn([n, k], (Kind::Float, Device::Cpu)),
                Tensor::randn([n], (Kind::Float, Device::Cpu)),
            );
            for bias in [None, Some(&b)] {
                let (got, want) = (linear(&x, &w, bias).unwrap(), x.linear(&w, bias));
                assert_eq!(got.size(), want.size());
                let gap = (&got - &want).abs().max().double_value(&[]);
                let scale = want.abs().max().double_value(&[]).max(1.0);
                assert!(gap < 2e-6 * scale * (k as f64).sqrt(), "({rows}, {n}, {k}): differs by {gap:.2e}");
            }
        }
    }

    /// In bfloat16: each output the float32 product of the same bfloat16 values rounded
    /// to bfloat16, or its neighbour where the two sums, added in another order, fall on
    /// either side of a rounding boundary; the output is bfloat16.
    #[test]
    fn in_bfloat16_it_rounds_the_float32_product() {
        let _seed = lethe_core::rng::seed_torch(1);
        for (rows, n, k) in [(1, 700, 576), (3, 33, 17), (4, 5, 1536)] {
            let half = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
            let (x, w, b) = (half(&[1, rows, k]), half(&[n, k]), half(&[n]));
            for bias in [None, Some(&b)] {
                let got = linear(&x, &w, bias).unwrap();
                assert_eq!(got.kind(), Kind::BFloat16);
                let float = |t: &Tensor| t.to_kind(Kind::Float);
                let exact = float(&x).linear(&float(&w), bias.map(float).as_ref());
                let want = exact.to_kind(Kind::BFloat16);
                let off = (float(&got) - float(&want)).abs();
                // One unit in the last place: 2^-7 of the value's binade.
                let ulp = float(&want).abs().clamp_min(1e-30).log2().floor().exp2() * 2f64.powi(-7);
                let beyond = off.gt_tensor(&(ulp + 1e-6)).sum(Kind::Int64).int64_value(&[]);
                let equal = off.eq(0.0).to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
                assert_eq!(beyond, 0, "({rows}, {n}, {k}): outputs off by more than a unit in the last place");
                assert!(equal > 0.9, "({rows}, {n}, {k}): {:.0}% of the outputs equal", 100.0 * equal);
            }
        }
    }

    /// A prompt's rows in half precision: the product of the values widened, rounded
    /// once, whichever path this CPU takes; each output equal to libtorch's own
    /// half-precision product or one unit in the last place from it (sums in another
    /// order).
    #[test]
    fn a_prompt_in_half_precision_is_the_rounded_float32_product() {
        let _seed = lethe_core::rng::seed_torch(2);
        for (kind, mantissa) in [(Kind::BFloat16, 7), (Kind::Half, 10)] {
            let (rows, n, k) = (MAX_ROWS + 12, 40, 96);
            let half = |shape: &[i64]| (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * 0.5).to_kind(kind);
            let (x, w, b) = (half(&[2, rows / 2, k]), half(&[n, k]), half(&[n]));
            for bias in [None, Some(&b)] {
                let got = linear(&x, &w, bias).unwrap();
                assert_eq!((got.kind(), got.size()), (kind, vec![2, rows / 2, n]));
                let float = |t: &Tensor| t.to_kind(Kind::Float);
                let want = float(&x).linear(&float(&w), bias.map(float).as_ref()).to_kind(kind);
                for (what, other) in [("the rounded float32 product", want), ("libtorch's", x.linear(&w, bias))] {
                    let off = (float(&got) - float(&other)).abs();
                    let ulp = float(&other).abs().clamp_min(1e-30).log2().floor().exp2() * 2f64.powi(-mantissa);
                    let beyond = off.gt_tensor(&(ulp + 1e-6)).sum(Kind::Int64).int64_value(&[]);
                    assert_eq!(beyond, 0, "{kind:?}: outputs off {what} by more than a unit in the last place");
                }
            }
        }
    }

    #[test]
    fn it_refuses_mismatched_shapes_in_one_line() {
        let (x, w) =
            (Tensor::ones([1, 5], (Kind::Float, Device::Cpu)), Tensor::ones([3, 4], (Kind::Float, Device::Cpu)));
        let e = linear(&x, &w, None).unwrap_err().to_string();
        assert!(e.contains("decode product") && e.contains("(.., 4)"), "{e}");
    }

    /// Against the attention written out in libtorch, over keys and values that are the
    /// first rows of larger buffers (as the cache holds them), for lengths around the
    /// kernel's chunks of 256 rows; without a bias, and with one for every key-value head
    /// or one a head, a share of its entries at minus infinity (a policy's `ln m`).
    #[test]
    fn its_attention_equals_the_written_out_one() {
        let _seed = lethe_core::rng::seed_torch(1);
        let opts = (Kind::Float, Device::Cpu);
        for n in [1, 255, 257, 700] {
            let q = Tensor::randn([2, 3, 3, 64], opts);
            let (kb, vb) = (Tensor::randn([2, 3, n + 40, 64], opts), Tensor::randn([2, 3, n + 40, 64], opts));
            let (k, v) = (kb.narrow(2, 0, n), vb.narrow(2, 0, n));
            let biased = |heads: i64| {
                let bias = Tensor::rand([2, heads, 1, n], opts).log();
                // The last entry always seen, as a token's own is.
                bias.masked_fill(&Tensor::rand([2, heads, 1, n], opts).lt(0.3), f64::NEG_INFINITY).index_fill(
                    3,
                    &Tensor::from_slice(&[n - 1]),
                    0.0,
                )
            };
            for bias in [None, Some(biased(1)), Some(biased(3))] {
                let (context, weights) = attention(&q, &k, &v, bias.as_ref(), 0.125).unwrap();
                let scores = q.matmul(&k.transpose(-2, -1)) * 0.125;
                let want_w = bias.as_ref().map_or(scores.shallow_clone(), |b| &scores + b).softmax(-1, Kind::Float);
                let want_c = want_w.matmul(&v);
                let gap = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
                let case = format!("n = {n}, bias {:?}", bias.as_ref().map(Tensor::size));
                assert!(gap(&weights, &want_w) < 1e-6, "{case}: weights differ by {:.2e}", gap(&weights, &want_w));
                assert!(gap(&context, &want_c) < 1e-5, "{case}: context differs by {:.2e}", gap(&context, &want_c));
            }
        }
        let q = Tensor::randn([1, 2, 2, 8], opts);
        let k = Tensor::randn([1, 2, 5, 8], opts);
        let e = attention(&q, &k, &k, Some(&Tensor::zeros([1, 2, 1, 4], opts)), 1.0).unwrap_err().to_string();
        assert!(e.contains("a bias (b, 1 or kv, 1, n)"), "{e}");
    }

    /// Over bfloat16 queries, keys and values: the written-out attention in bfloat16
    /// (scores `q k^T * scale` rounded, the softmax in float32, its weights rounded before
    /// they meet the values), with and without a bias; sums taken in another order round
    /// a few scores the other way.
    #[test]
    fn in_bfloat16_its_attention_equals_the_written_out_one() {
        in_half_precision_its_attention_equals_the_written_out_one(Kind::BFloat16, (1e-5, 1e-2), (1e-3, 2e-2));
    }

    /// [`in_bfloat16_its_attention_equals_the_written_out_one`] in float16, whose three
    /// more bits of mantissa bound the gaps eight times tighter.
    #[test]
    fn in_float16_its_attention_equals_the_written_out_one() {
        in_half_precision_its_attention_equals_the_written_out_one(Kind::Half, (1.25e-6, 1.25e-3), (1.25e-4, 2.5e-3));
    }

    /// The attention in `kind` against the written-out one; `weights` and `context`: the
    /// bounds on the mean and the largest gap of each.
    fn in_half_precision_its_attention_equals_the_written_out_one(
        kind: Kind,
        weights_within: (f64, f64),
        context_within: (f64, f64),
    ) {
        let _seed = lethe_core::rng::seed_torch(2);
        let half = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)).to_kind(kind);
        for n in [1, 300, 700] {
            let (q, k, v) = (half(&[2, 3, 3, 64]), half(&[2, 3, n, 64]), half(&[2, 3, n, 64]));
            let bias = Tensor::rand([2, 1, 1, n], (Kind::Float, Device::Cpu)).log();
            for bias in [None, Some(&bias)] {
                let (context, weights) = attention(&q, &k, &v, bias, 0.125).unwrap();
                assert_eq!((context.kind(), weights.kind()), (kind, Kind::Float));
                let scores = (q.matmul(&k.transpose(-2, -1)) * 0.125).to_kind(Kind::Float);
                let want_w = bias.map_or(scores.shallow_clone(), |b| &scores + b).softmax(-1, Kind::Float);
                let want_c = want_w.to_kind(kind).matmul(&v);
                let float = |t: &Tensor| t.to_kind(Kind::Float);
                let mean = |a: &Tensor, b: &Tensor| (float(a) - float(b)).abs().mean(Kind::Double).double_value(&[]);
                let most = |a: &Tensor, b: &Tensor| (float(a) - float(b)).abs().max().double_value(&[]);
                let case = format!("{kind:?}, n = {n}, bias {}", bias.is_some());
                let (w_mean, w_most) = (mean(&weights, &want_w), most(&weights, &want_w));
                let (c_mean, c_most) = (mean(&context, &want_c), most(&context, &want_c));
                println!("{case}: weights {w_mean:.1e} on average (at most {w_most:.1e}), context {c_mean:.1e} ({c_most:.1e})");
                assert!(
                    w_mean < weights_within.0 && w_most < weights_within.1,
                    "{case}: weights differ by {w_mean:.2e}, at most {w_most:.2e}"
                );
                assert!(
                    c_mean < context_within.0 && c_most < context_within.1,
                    "{case}: context differs by {c_mean:.2e}, at most {c_most:.2e}"
                );
            }
        }
    }

    /// Scores whose sums are exact in float32 (multiples of 1/64 under 2^17) but not in
    /// half precision, scaled by 0.1: every rounding of the scores is then the only
    /// difference from the written-out attention, so the weights must equal its weights
    /// to the bit, in both precisions and at lengths that leave a tail of fewer than eight.
    #[test]
    fn in_half_precision_its_scores_round_as_eager_attention_does() {
        let _seed = lethe_core::rng::seed_torch(3);
        for kind in [Kind::Half, Kind::BFloat16] {
            let eighths =
                |shape: &[i64]| (Tensor::randint_low(-32, 33, shape, (Kind::Float, Device::Cpu)) / 8.0).to_kind(kind);
            for n in [1, 13, 300, 701] {
                let (q, k, v) = (eighths(&[2, 3, 3, 64]), eighths(&[2, 3, n, 64]), eighths(&[2, 3, n, 64]));
                let (_, weights) = attention(&q, &k, &v, None, 0.1).unwrap();
                let scores = (q.matmul(&k.transpose(-2, -1)) * 0.1).to_kind(Kind::Float);
                let want = scores.softmax(-1, Kind::Float);
                let gap = (&weights - &want).abs().max().double_value(&[]);
                assert_eq!(gap, 0.0, "{kind:?}, n = {n}: the weights differ by up to {gap:.2e}");
            }
        }
    }

    #[test]
    fn the_read_probe_sums_every_value() {
        // Small whole numbers: every partial sum is exact in float32.
        let x = Tensor::arange(200_001, (Kind::Float, Device::Cpu)).remainder(7);
        assert_eq!(read_sum(&x).unwrap(), x.sum(Kind::Double).double_value(&[]));
    }
}
