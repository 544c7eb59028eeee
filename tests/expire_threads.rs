//! Expire-Span's fused kernel gives bitwise the same scores (or weights), ramp figures
//! and gradients whatever libtorch's thread count: its rows are independent, its ramp counts integer
//! sums, and its spans' gradient is summed over queries in query order.
//!
//! A file of its own: `tch::set_num_threads` is process-wide, and would change the thread
//! count of any test running beside it.

use lethe::model::memory::expire_fused::{expire_scores, expire_weights};
use lethe::rng::Rng;
use tch::{Device, Kind, Tensor};

#[test]
fn the_fused_kernel_gives_the_same_bits_with_any_thread_count() {
    let mut rng = Rng::new(41);
    // Fewer streams than threads' worth of rows, a cache longer than the near keys.
    let (b, h, m, n, p) = (3, 4, 64, 600, 65);
    let cached = n - m;
    // Cached keys 1..=cached back, then the block's own keys at 0, -1, ...
    let cached_counter =
        Tensor::arange(cached, (Kind::Float, Device::Cpu)).flip([0]).unsqueeze(0).expand([b, cached], false) + 1.0;
    let block_counter = -Tensor::arange(m, (Kind::Float, Device::Cpu)).unsqueeze(0).expand([b, m], false);
    let counter = Tensor::cat(&[cached_counter, block_counter], 1).contiguous();
    // Spans spread over the cache's distances, so that many pairs fall on the ramp.
    let spans = (rng.uniform_tensor(&[b, n], Kind::Float) * 700.0).set_requires_grad(true);
    let usable = rng.uniform_tensor(&[b, 1, n], Kind::Float).gt(0.02);
    let content = rng.normal_tensor(&[b, h, m, n], Kind::Float).set_requires_grad(true);
    let positions = rng.normal_tensor(&[b, h, m, p], Kind::Float).set_requires_grad(true);
    let weights = rng.normal_tensor(&[b, h, m, n], Kind::Float);
    // The scores (softmax false) or the weights (true).
    let run = |threads: i32, softmax: bool| {
        tch::set_num_threads(threads);
        let kernel = if softmax { expire_weights } else { expire_scores };
        let fused = kernel(&content, &positions, &spans, &counter, &usable, 32.0).unwrap();
        let objective = (fused.out.clamp_min(-1e30) * &weights).sum(Kind::Double);
        let grads = Tensor::run_backward(&[objective], &[&content, &positions, &spans], false, false);
        let mut outputs = vec![fused.out, fused.ramp_counts, fused.ramp_distance];
        outputs.extend(grads);
        outputs
    };
    for softmax in [false, true] {
        let one = run(1, softmax);
        assert!(one[1].sum(Kind::Double).double_value(&[]) > 1000.0, "too few pairs on the ramp to test their sums");
        assert!(one[5].abs().sum(Kind::Double).double_value(&[]) > 0.0, "the spans have a gradient");
        for threads in [2, 3] {
            let other = run(threads, softmax);
            for (i, (a, b)) in one.iter().zip(&other).enumerate() {
                assert!(a.equal(b), "softmax {softmax}: output {i} differs between 1 and {threads} threads");
            }
        }
    }
}
