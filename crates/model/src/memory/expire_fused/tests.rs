use super::*;
use crate::attention;
use crate::memory::expire::{on_ramp, ramp_loss_of_counts, remaining, soft_mask, visible_pairs};
use lethe_core::rng::Rng;

/// One block's inputs: content scores `(b, h, m, n)`, positions `(b, h, m, P)`,
/// spans, counters `(b, n)` (compacted: cached memories at gaps of 1-3, then the
/// block at 0, -1, ..), and the usable keys, `(b, m, n)` with episode boundaries when
/// `episodes`, else `(b, 1, n)` with some padding.
struct Block {
    content: Tensor,
    positions: Tensor,
    spans: Tensor,
    counter: Tensor,
    usable: Tensor,
    v: Tensor,
}

const RAMP: f64 = 4.0;

fn block(rng: &mut Rng, cached: i64, rows: i64, episodes: bool) -> Block {
    block_with_gaps(rng, cached, rows, episodes, 3)
}

/// [`block`] with gaps of 1 to `widest` steps between the cached memories: with 1,
/// every distance is held, as in a cache that nothing was deleted from (the near
/// keys' slots then run one by one, which the kernel reads without a gather).
fn block_with_gaps(rng: &mut Rng, cached: i64, rows: i64, episodes: bool, widest: i64) -> Block {
    let (b, h, m, dh) = (2, 3, 5, 4);
    let n = cached + m;
    let gaps = (rng.uniform_tensor(&[b, cached], Kind::Double) * widest as f64).floor() + 1.0;
    let cached_counter = gaps.flip([1]).cumsum(1, Kind::Double).flip([1]);
    let block_counter = -Tensor::arange(m, (Kind::Double, tch::Device::Cpu)).unsqueeze(0).expand([b, m], false);
    let counter = Tensor::cat(&[cached_counter, block_counter], 1);
    let usable = if episodes {
        // Each key's episode, and each query's: a boundary somewhere in the stream.
        let key_episode = (rng.uniform_tensor(&[b, n], Kind::Double) * 2.0).floor().cumsum(1, Kind::Int64);
        key_episode.narrow(1, n - m, m).unsqueeze(2).eq_tensor(&key_episode.unsqueeze(1))
    // (b, m, n)
    } else {
        // Some padding in the cache; a block's own keys are always usable, as in the
        // model (a query with no key at all would have no attention).
        let usable = rng.uniform_tensor(&[b, 1, n], Kind::Double).gt(0.1);
        let _ = usable.narrow(2, cached, m).fill_(1);
        usable
    };
    Block {
        content: rng.normal_tensor(&[b, h, m, n], Kind::Double).set_requires_grad(true),
        positions: rng.normal_tensor(&[b, h, m, rows], Kind::Double).set_requires_grad(true),
        // Spans near each memory's distance, so that many pairs fall on the ramp; with
        // every distance held, up to 56 steps longer, so that runs of near keys are seen.
        spans: (&counter + rng.uniform_tensor(&[b, n], Kind::Double) * if widest == 1 { 60.0 } else { 8.0 } - 3.5)
            .clamp_min(0.1)
            .set_requires_grad(true),
        counter,
        usable,
        v: rng.normal_tensor(&[b, h, n, dh], Kind::Double),
    }
}

/// The written-out scores, as `expire.rs` builds them: the soft mask, its log as a
/// bias, the positions gathered by distance (zero from `P` on), `-inf` where a key is
/// not seen. Also the ramp counts and distance sums.
fn written_out(x: &Block) -> (Tensor, Tensor, Tensor) {
    let (b, h, m, n) = x.content.size4().unwrap();
    let rows = x.positions.size()[3];
    let (r, dist) = remaining(&x.spans, &x.counter, m);
    let mask = soft_mask(&r, RAMP);
    let visible = visible_pairs(&x.usable, &dist, &mask);
    let log_mask = attention::log_mask_of_visible(&mask, &visible).unsqueeze(1); // (b, 1, m, n)
    let index = dist.clamp(0.0, (rows - 1) as f64).to_kind(Kind::Int64).unsqueeze(1).expand([b, h, m, n], false);
    let near = dist.ge(0.0).logical_and(&dist.lt(rows as f64)).unsqueeze(1);
    let by_distance = x.positions.gather(-1, &index, false).where_scalarother(&near, 0.0);
    let scores = &x.content + (by_distance + log_mask);
    let ramp = on_ramp(&mask, &visible);
    let counts = ramp.sum_dim_intlist([1i64].as_slice(), false, Kind::Double);
    let by_dist = dist.where_scalarother(&ramp, 0.0).sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Double);
    (scores, counts, by_dist)
}

/// The attention of both, weighted: what the gradients are taken of.
fn objective(scores: &Tensor, v: &Tensor, w: &Tensor) -> Tensor {
    (attention::mix(scores, v, 0.0, false) * w).sum(Kind::Double)
}

/// [`objective`] of the kernel's output: its scores, or (`softmax`) its weights.
fn fused_objective(fused: &FusedScores, softmax: bool, v: &Tensor, w: &Tensor) -> Tensor {
    match softmax {
        true => (attention::weigh(&fused.out, v, 0.0, false) * w).sum(Kind::Double),
        false => objective(&fused.out, v, w),
    }
}

/// The kernel's scores, or (`softmax`) its weights, with every loop it has.
fn fused(x: &Block, softmax: bool) -> FusedScores {
    scores_with(&x.content, &x.positions, &x.spans, &x.counter, &x.usable, RAMP, Loops { width: WIDEST, softmax })
        .unwrap()
}

const CASES: [(i64, i64, bool); 5] = [(6, 8, false), (20, 8, false), (20, 4, true), (0, 8, false), (12, 30, true)];

/// The kernel computes the written-out scores (the same `-inf`s, the rest to double
/// rounding), ramp counts and distance sums: with every cached memory near enough
/// for a position, with far ones, with episodes, with an empty cache.
#[test]
fn the_fused_scores_equal_the_written_out_ones() {
    let mut rng = Rng::new(31);
    for (cached, rows, episodes) in CASES {
        let x = block(&mut rng, cached, rows, episodes);
        let fused = expire_scores(&x.content, &x.positions, &x.spans, &x.counter, &x.usable, RAMP).unwrap();
        let (scores, counts, by_dist) = written_out(&x);
        let case = format!("cached {cached}, rows {rows}, episodes {episodes}");
        assert!(fused.out.isinf().equal(&scores.isinf()), "{case}: the hidden pairs differ");
        assert!(scores.isinf().any().int64_value(&[]) == 1 && scores.isfinite().any().int64_value(&[]) == 1, "{case}");
        let finite = scores.isfinite();
        let gap = (fused.out.masked_select(&finite) - scores.masked_select(&finite)).abs().max().double_value(&[]);
        assert!(gap < 1e-12, "{case}: scores differ by {gap}");
        assert!(counts.sum(Kind::Double).double_value(&[]) > 0.0, "{case}: some pairs are on the ramp");
        assert!(fused.ramp_counts.equal(&counts), "{case}: ramp counts");
        assert!(fused.ramp_distance.allclose(&by_dist, 1e-12, 1e-12, false), "{case}: ramp distances");
        // With the softmax: libtorch's softmax of the same scores, 0 where hidden.
        let weights = expire_weights(&x.content, &x.positions, &x.spans, &x.counter, &x.usable, RAMP).unwrap();
        let gap = (&weights.out - scores.softmax(-1, Kind::Double)).abs().max().double_value(&[]);
        assert!(gap < 1e-15, "{case}: weights differ by {gap}");
        assert!(
            weights.out.masked_select(&scores.isinf()).eq(0.0).all().int64_value(&[]) == 1,
            "{case}: a hidden key has weight"
        );
        assert!(
            weights.ramp_counts.equal(&counts) && weights.ramp_distance.equal(&fused.ramp_distance),
            "{case}: ramp figures"
        );
    }
}

/// Each gradient of `got` equals the one of `want` to double rounding (1e-12), and
/// each of `want` is non-zero somewhere.
fn assert_gradients_agree(got: &[Tensor], want: &[Tensor], case: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(b.abs().sum(Kind::Double).double_value(&[]) > 0.0, "{case}: input {i} has a gradient");
        let gap = (a - b).abs().max().double_value(&[]);
        assert!(gap < 1e-12, "{case}, input {i}: gradients differ by {gap}");
    }
}

/// Its backward pass gives the content scores, the positions and the spans the
/// gradient the written-out operations give, with the softmax in the kernel or not.
#[test]
fn the_fused_gradient_equals_the_written_out_one() {
    let mut rng = Rng::new(32);
    for (cached, rows, episodes) in CASES {
        let x = block(&mut rng, cached, rows, episodes);
        let (scores, _, _) = written_out(&x);
        let w = rng.normal_tensor(&[2, 3, 5, 4], Kind::Double); // (b, h, m, dh)
        let inputs = [&x.content, &x.positions, &x.spans];
        let g2 = Tensor::run_backward(&[objective(&scores, &x.v, &w)], &inputs, false, false);
        for softmax in [false, true] {
            let g1 =
                Tensor::run_backward(&[fused_objective(&fused(&x, softmax), softmax, &x.v, &w)], &inputs, false, false);
            assert_gradients_agree(&g1, &g2, &format!("cached {cached}, rows {rows}, softmax {softmax}"));
        }
    }
}

/// The kernel's gradient against central differences of the objective, for every
/// content score, position entry and span of a block (double precision), with the
/// softmax in the kernel or not.
#[test]
fn the_fused_gradient_matches_finite_differences() {
    let mut rng = Rng::new(33);
    let x = block(&mut rng, 12, 6, false);
    let w = rng.normal_tensor(&[2, 3, 5, 4], Kind::Double);
    for softmax in [false, true] {
        // The objective with input `which` (content, positions, spans) replaced.
        let f = |which: usize, input: &Tensor| {
            let mut y = Block {
                content: x.content.detach(),
                positions: x.positions.detach(),
                spans: x.spans.detach(),
                ..block(&mut Rng::new(1), 12, 6, false)
            };
            (y.counter, y.usable, y.v) = (x.counter.shallow_clone(), x.usable.shallow_clone(), x.v.shallow_clone());
            *[&mut y.content, &mut y.positions, &mut y.spans][which] = input.shallow_clone();
            fused_objective(&fused(&y, softmax), softmax, &x.v, &w).double_value(&[])
        };
        let inputs = [&x.content, &x.positions, &x.spans];
        let grads =
            Tensor::run_backward(&[fused_objective(&fused(&x, softmax), softmax, &x.v, &w)], &inputs, false, false);
        let eps = 1e-6;
        for (which, (input, grad)) in inputs.into_iter().zip(&grads).enumerate() {
            let flat = input.detach().flatten(0, -1);
            let analytic: Vec<f64> = grad.flatten(0, -1).try_into().unwrap();
            let mut checked = 0;
            for i in 0..flat.size()[0] {
                let nudged = |d: f64| {
                    let t = flat.copy();
                    let _ = t.get(i).f_add_scalar_(d).unwrap();
                    t.view(input.size().as_slice())
                };
                let numeric = (f(which, &nudged(eps)) - f(which, &nudged(-eps))) / (2.0 * eps);
                let case = format!("softmax {softmax}, input {which}, entry {i}");
                assert!((numeric - analytic[i as usize]).abs() < 1e-6, "{case}: {numeric} vs {}", analytic[i as usize]);
                checked += usize::from(analytic[i as usize] != 0.0);
            }
            assert!(checked > 5, "softmax {softmax}, input {which}: only {checked} non-zero gradients were checked");
        }
    }
}

/// A block in float, its scores, positions and spans leaves with gradient.
fn in_float(x: &Block) -> Block {
    let leaf = |t: &Tensor| t.detach().to_kind(Kind::Float).set_requires_grad(true);
    Block {
        content: leaf(&x.content),
        positions: leaf(&x.positions),
        spans: leaf(&x.spans),
        counter: x.counter.to_kind(Kind::Float),
        usable: x.usable.shallow_clone(),
        v: x.v.to_kind(Kind::Float),
    }
}

/// In float, every width of the loops (AVX-512 and AVX2 where the CPU has them, and
/// the plain ones) gives the written-out scores to float rounding: the same hidden
/// pairs and ramp figures, the scores and the gradients within a few ulps (the log
/// differs in its last bit). The last case's rows are 50 keys: whole groups of 8 and
/// 16, far keys and a group straddling the near ones, and a partial group at the end.
#[test]
fn in_float_every_width_equals_the_written_out_scores() {
    let mut rng = Rng::new(35);
    let cases = CASES.into_iter().map(|(c, r, e)| (c, r, e, 3)).chain([
        (45, 8, false, 3),
        (43, 20, true, 3),
        (45, 40, false, 1),
        (60, 33, true, 1),
    ]);
    for (cached, rows, episodes, widest) in cases {
        let x = in_float(&block_with_gaps(&mut rng, cached, rows, episodes, widest));
        let (scores, counts, by_dist) = written_out(&x);
        let w = rng.normal_tensor(&[2, 3, 5, 4], Kind::Float); // (b, h, m, dh)
        let inputs = [&x.content, &x.positions, &x.spans];
        let reference = Tensor::run_backward(&[objective(&scores, &x.v, &w)], &inputs, false, false);
        let finite = scores.isfinite();
        let weights = scores.softmax(-1, Kind::Float);
        for (width, softmax) in [0, 8, 16].into_iter().flat_map(|w| [(w, false), (w, true)]) {
            let case = format!("cached {cached}, rows {rows}, episodes {episodes}, gaps up to {widest}, width {width}, softmax {softmax}");
            let fused =
                scores_with(&x.content, &x.positions, &x.spans, &x.counter, &x.usable, RAMP, Loops { width, softmax })
                    .unwrap();
            if softmax {
                let gap = (&fused.out - &weights).abs().max().double_value(&[]);
                assert!(gap < 1e-6, "{case}: weights differ by {gap}");
                assert!(
                    fused.out.masked_select(&scores.isinf()).eq(0.0).all().int64_value(&[]) == 1,
                    "{case}: a hidden key has weight"
                );
            } else {
                assert!(fused.out.isinf().equal(&scores.isinf()), "{case}: the hidden pairs differ");
                let gap =
                    (fused.out.masked_select(&finite) - scores.masked_select(&finite)).abs().max().double_value(&[]);
                assert!(gap < 1e-5, "{case}: scores differ by {gap}");
            }
            assert!(fused.ramp_counts.equal(&counts.to_kind(Kind::Float)), "{case}: ramp counts");
            assert!(fused.ramp_distance.allclose(&by_dist, 1e-12, 1e-12, false), "{case}: ramp distances");
            let grads = Tensor::run_backward(&[fused_objective(&fused, softmax, &x.v, &w)], &inputs, false, false);
            for (i, (a, b)) in grads.iter().zip(&reference).enumerate() {
                // (Without a cache a query may see one key alone: no content gradient.)
                let scale = b.abs().max().double_value(&[]);
                let gap = (a - b).abs().max().double_value(&[]);
                assert!(gap <= 1e-5 * scale + 1e-7, "{case}, input {i}: gradients differ by {gap} (largest {scale})");
            }
        }
    }
}

/// The AVX-512 loops give the AVX2 ones' bits (where the CPU has both; elsewhere the
/// two run the same loops): scores, weights, ramp figures and every gradient, on rows
/// of 50 and 48 keys (whole groups of 16, a group of 8, single keys).
#[test]
fn avx512_gives_the_bits_of_avx2() {
    let mut rng = Rng::new(36);
    for (cached, rows, episodes, widest) in [
        (45, 8, false, 3),
        (43, 20, true, 3),
        (20, 4, true, 3),
        (6, 8, false, 3),
        (45, 40, false, 1),
        (60, 33, true, 1),
    ] {
        let x = in_float(&block_with_gaps(&mut rng, cached, rows, episodes, widest));
        let w = rng.normal_tensor(&[2, 3, 5, 4], Kind::Float); // (b, h, m, dh)
        let inputs = [&x.content, &x.positions, &x.spans];
        for softmax in [false, true] {
            let case =
                format!("cached {cached}, rows {rows}, episodes {episodes}, gaps up to {widest}, softmax {softmax}");
            let run = |width| {
                let fused = scores_with(
                    &x.content,
                    &x.positions,
                    &x.spans,
                    &x.counter,
                    &x.usable,
                    RAMP,
                    Loops { width, softmax },
                )
                .unwrap();
                let grads = Tensor::run_backward(&[fused_objective(&fused, softmax, &x.v, &w)], &inputs, false, false);
                (fused, grads)
            };
            let ((wide, wide_grads), (narrow, narrow_grads)) = (run(16), run(8));
            // Bit for bit: `equal` alone would let a -0 stand for a +0.
            let same_bits = |a: &Tensor, b: &Tensor| a.view_dtype(Kind::Int).equal(&b.view_dtype(Kind::Int));
            assert!(same_bits(&wide.out, &narrow.out), "{case}: outputs");
            assert!(
                same_bits(&wide.ramp_counts, &narrow.ramp_counts) && wide.ramp_distance.equal(&narrow.ramp_distance),
                "{case}: ramp figures"
            );
            for (i, (a, b)) in wide_grads.iter().zip(&narrow_grads).enumerate() {
                assert!(same_bits(a, b), "{case}: gradient of input {i}");
            }
        }
    }
}

/// Regression: the kernel was compiled without OpenMP, so libtorch's `parallel_for`
/// ran its rows on one thread (the fused kernel took 2.5 ms of an `enwik8-tiny` step
/// instead of 1.4). It spreads over every thread libtorch has.
#[test]
fn the_kernel_uses_every_thread() {
    let (mut seen, mut threads) = (0, 0);
    // SAFETY: the function writes two integers through valid pointers.
    unsafe { lethe_kernels::lethe_parallel_threads(&mut seen, &mut threads) };
    assert!(threads >= 1);
    assert_eq!(seen, threads.min(64), "parallel_for used {seen} of {threads} threads");
}

/// Inputs the kernel cannot take are an error with a message, not a crash.
#[test]
fn bad_inputs_are_an_error() {
    let mut rng = Rng::new(34);
    let x = block(&mut rng, 6, 8, false);
    let not_bool = x.usable.to_kind(Kind::Int64);
    let err = expire_scores(&x.content, &x.positions, &x.spans, &x.counter, &not_bool, RAMP).err().unwrap().to_string();
    assert!(err.contains("usable must be bool"), "{err}");
    let short = x.spans.narrow(1, 0, 3);
    let err = expire_scores(&x.content, &x.positions, &short, &x.counter, &x.usable, RAMP).err().unwrap().to_string();
    assert!(err.contains("spans and counter must be (b, n)"), "{err}");
    // The whole attention: values for fewer keys than the keys, spans for fewer keys.
    let a = attend_block(&mut rng, 6, 8, false, true);
    let few = a.x.v.narrow(2, 0, 4);
    let err = expire_attend(&a.q, &a.k, &few, &a.x.positions, &a.x.spans, &a.x.counter, &a.x.usable, RAMP, 0.0)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("expire-span fused attention") && err.contains("keys and values (b, h, n, dh)"), "{err}");
    let err = expire_attend(&a.q, &a.k, &a.x.v, &a.x.positions, &short, &a.x.counter, &a.x.usable, RAMP, 0.0)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("spans and counter must be (b, n)"), "{err}");
}

/// A block for the whole attention: queries `(b, h, m, dh)` and keys `(b, h, n, dh)`
/// whose products are the content scores, values, and (`pad`) the first keys of
/// each stream unusable in every row, a different number per stream (the left
/// padding of a compacted cache, which the ragged attention leaves out).
struct AttendBlock {
    x: Block,
    q: Tensor,
    k: Tensor,
}

fn attend_block(rng: &mut Rng, cached: i64, rows: i64, episodes: bool, pad: bool) -> AttendBlock {
    let mut x = block(rng, cached, rows, episodes);
    let (b, h, m, dh) = (2, 3, 5, 4);
    let n = cached + m;
    if pad {
        for (s, first) in [cached / 2, cached / 3].into_iter().enumerate() {
            let _ = x.usable.get(s as i64).narrow(1, 0, first).fill_(0);
        }
    }
    let q = rng.normal_tensor(&[b, h, m, dh], Kind::Double).set_requires_grad(true);
    let k = rng.normal_tensor(&[b, h, n, dh], Kind::Double).set_requires_grad(true);
    x.v = x.v.set_requires_grad(true);
    x.content = q.matmul(&k.transpose(-2, -1)); // (b, h, m, n)
    AttendBlock { x, q, k }
}

/// The padded path: the kernel's weights, then the values.
fn padded_attention(a: &AttendBlock) -> (Tensor, FusedScores) {
    let fused = fused(&a.x, true);
    (attention::weigh(&fused.out, &a.x.v, 0.0, false), fused)
}

/// The span loss's scale in the ragged attention's tests: large enough that its
/// gradient weighs as much as the attention's.
const LOSS_SCALE: f64 = 0.3;

fn ragged_attention(a: &AttendBlock, width: c_int) -> FusedAttention {
    ragged_attention_by(a, width, true)
}

/// [`ragged_attention`], its matrix products through the BLAS library or not.
fn ragged_attention_by(a: &AttendBlock, width: c_int, blas: bool) -> FusedAttention {
    let x = &a.x;
    attend_with(&a.q, &a.k, &x.v, &x.positions, &x.spans, &x.counter, &x.usable, RAMP, LOSS_SCALE, width, blas).unwrap()
}

/// Where the CPU library exports no BLAS, the ragged attention takes libtorch's
/// matrix products over the same memory: the same context and gradients (double,
/// left padding, episodes).
#[test]
fn the_ragged_attention_without_blas_equals_it_with() {
    let mut rng = Rng::new(39);
    for (cached, rows, episodes) in [(20, 8, false), (12, 30, true)] {
        let a = attend_block(&mut rng, cached, rows, episodes, true);
        let case = format!("cached {cached}, rows {rows}, episodes {episodes}");
        let (by_blas, by_mm) = (ragged_attention_by(&a, WIDEST, true), ragged_attention_by(&a, WIDEST, false));
        let gap = (&by_mm.context - &by_blas.context).abs().max().double_value(&[]);
        assert!(gap < 1e-12, "{case}: contexts differ by {gap}");
        let w = rng.normal_tensor(&by_blas.context.size(), Kind::Double);
        let inputs = [&a.q, &a.k, &a.x.v, &a.x.positions, &a.x.spans];
        let g1 = Tensor::run_backward(&[(&by_mm.context * &w).sum(Kind::Double)], &inputs, false, false);
        let g2 = Tensor::run_backward(&[(&by_blas.context * &w).sum(Kind::Double)], &inputs, false, false);
        assert_gradients_agree(&g1, &g2, &case);
    }
}

/// The ragged attention computes what the padded one computes, to double rounding:
/// the context, the ramp figures, the span loss (as `ramp_loss_of_counts` gives it
/// from the padded kernel's ramp figures), and the gradients of the queries, keys, values,
/// positions and spans; with and without left padding, with episodes, an empty cache.
#[test]
fn the_ragged_attention_equals_the_padded_one() {
    let mut rng = Rng::new(36);
    for (cached, rows, episodes) in CASES {
        for pad in [false, true] {
            let a = attend_block(&mut rng, cached, rows, episodes, pad);
            let case = format!("cached {cached}, rows {rows}, episodes {episodes}, pad {pad}");
            let (context, padded) = padded_attention(&a);
            let ragged = ragged_attention(&a, WIDEST);
            let gap = (&ragged.context - &context).abs().max().double_value(&[]);
            assert!(gap < 1e-12, "{case}: contexts differ by {gap}");
            assert!(ragged.ramp_counts.equal(&padded.ramp_counts), "{case}: ramp counts");
            assert!(
                ragged.ramp_distance.allclose(&padded.ramp_distance, 1e-12, 1e-12, false),
                "{case}: ramp distances"
            );
            // The span loss as expire.rs computes it from the padded kernel's figures.
            let loss =
                ramp_loss_of_counts(&a.x.spans, &padded.ramp_counts, &padded.ramp_distance, RAMP, 1, LOSS_SCALE * RAMP);
            assert!(
                ragged.span_loss.allclose(&loss, 1e-12, 1e-12, false),
                "{case}: span losses {ragged:?} and {loss:?}",
                ragged = ragged.span_loss
            );
            let w = rng.normal_tensor(&context.size(), Kind::Double);
            let inputs = [&a.q, &a.k, &a.x.v, &a.x.positions, &a.x.spans];
            let g1 = Tensor::run_backward(
                &[(&ragged.context * &w).sum(Kind::Double) + &ragged.span_loss],
                &inputs,
                false,
                false,
            );
            let g2 = Tensor::run_backward(&[(&context * &w).sum(Kind::Double) + loss], &inputs, false, false);
            assert_gradients_agree(&g1, &g2, &case);
        }
    }
}

/// A span loss beyond float's range comes out infinite, forward and backward (for the
/// trainer's check of the loss to name), not as an error of the kernel.
#[test]
fn a_span_loss_beyond_float_is_infinite_not_an_error() {
    let mut rng = Rng::new(40);
    let a = attend_block(&mut rng, 12, 6, false, false);
    let leaf = |t: &Tensor| t.detach().to_kind(Kind::Float);
    let x = &a.x;
    let spans = leaf(&x.spans).set_requires_grad(true);
    let r = expire_attend(
        &leaf(&a.q),
        &leaf(&a.k),
        &leaf(&x.v),
        &leaf(&x.positions),
        &spans,
        &x.counter.to_kind(Kind::Float),
        &x.usable,
        RAMP,
        1e300,
    )
    .unwrap();
    assert!(r.ramp_counts.sum(Kind::Double).double_value(&[]) > 0.0, "some pairs on the ramp");
    let loss = r.span_loss.double_value(&[]);
    assert!(loss.is_infinite(), "{loss}");
    // Its backward pass too: the spans' gradient is infinite where a pair is on the ramp.
    r.span_loss.backward();
    assert!(spans.grad().isinf().any().int64_value(&[]) == 1);
}

/// Its gradient against central differences of the weighted context plus the span
/// loss, for every entry of the queries, keys, values, positions and spans (double,
/// left padding).
#[test]
fn the_ragged_gradient_matches_finite_differences() {
    let mut rng = Rng::new(37);
    let a = attend_block(&mut rng, 12, 6, false, true);
    let w = rng.normal_tensor(&[2, 3, 5, 4], Kind::Double);
    let inputs = [&a.q, &a.k, &a.x.v, &a.x.positions, &a.x.spans];
    let objective = |inputs: &[Tensor]| {
        let x = &a.x;
        let r = expire_attend(
            &inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4], &x.counter, &x.usable, RAMP, LOSS_SCALE,
        )
        .unwrap();
        (r.context * &w).sum(Kind::Double) + r.span_loss
    };
    let leaves: Vec<Tensor> = inputs.iter().map(|t| t.shallow_clone()).collect();
    let grads = Tensor::run_backward(&[objective(&leaves)], &inputs, false, false);
    let eps = 1e-6;
    for (which, grad) in grads.iter().enumerate() {
        let flat = inputs[which].detach().flatten(0, -1);
        let analytic: Vec<f64> = grad.flatten(0, -1).try_into().unwrap();
        let mut checked = 0;
        for i in 0..flat.size()[0] {
            let at = |d: f64| {
                let t = flat.copy();
                let _ = t.get(i).f_add_scalar_(d).unwrap();
                let mut nudged: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
                nudged[which] = t.view(inputs[which].size().as_slice());
                objective(&nudged).double_value(&[])
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (numeric - analytic[i as usize]).abs() < 1e-6,
                "input {which}, entry {i}: {numeric} vs {}",
                analytic[i as usize]
            );
            checked += usize::from(analytic[i as usize] != 0.0);
        }
        assert!(checked > 5, "input {which}: only {checked} non-zero gradients were checked");
    }
}

/// In float, every width of the loops gives the padded attention's context and
/// gradients to float rounding, over rows long enough for whole vector groups.
#[test]
fn in_float_the_ragged_attention_equals_the_padded_one() {
    let mut rng = Rng::new(38);
    for (cached, rows, episodes) in [(45, 8, false), (43, 20, true), (60, 33, false)] {
        let a = attend_block(&mut rng, cached, rows, episodes, true);
        let leaf = |t: &Tensor| t.detach().to_kind(Kind::Float).set_requires_grad(true);
        let (q, k) = (leaf(&a.q), leaf(&a.k));
        let x = Block {
            content: q.matmul(&k.transpose(-2, -1)),
            positions: leaf(&a.x.positions),
            spans: leaf(&a.x.spans),
            counter: a.x.counter.to_kind(Kind::Float),
            usable: a.x.usable.shallow_clone(),
            v: leaf(&a.x.v),
        };
        let f = AttendBlock { x, q, k };
        let (context, _) = padded_attention(&f);
        let w = rng.normal_tensor(&context.size(), Kind::Float);
        let inputs = [&f.q, &f.k, &f.x.v, &f.x.positions, &f.x.spans];
        let want = Tensor::run_backward(&[(&context * &w).sum(Kind::Float)], &inputs, false, false);
        for width in [0, 8, 16] {
            let case = format!("cached {cached}, rows {rows}, width {width}");
            let ragged = ragged_attention(&f, width);
            let gap = (&ragged.context - &context).abs().max().double_value(&[]);
            assert!(gap < 1e-5, "{case}: contexts differ by {gap}");
            let got = Tensor::run_backward(&[(&ragged.context * &w).sum(Kind::Float)], &inputs, false, false);
            for (i, (r, p)) in got.iter().zip(&want).enumerate() {
                let scale = p.abs().max().double_value(&[]);
                let gap = (r - p).abs().max().double_value(&[]);
                assert!(gap < 1e-5 * scale.max(1.0), "{case}, input {i}: gradients differ by {gap} (largest {scale})");
            }
        }
    }
}
