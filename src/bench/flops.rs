//! What a step computes and what the machine can: the FLOPs of a training step counted
//! from the shapes ([`step_flops`]), and the measured matrix-multiply rate that MFU is
//! measured against ([`gemm_rate`]).

use super::*;
use crate::model::memory::descriptor::whole_block;

/// The chunks in which a block's queries score their keys when `held` states are held
/// on `device` (see [`step_flops`]): one chunk of every key on a GPU; on the CPU the
/// window mechanisms' chunks and Expire-Span's causal ones.
pub(crate) fn scored_chunks(cfg: &Config, held: i64, device: Device) -> Vec<Chunk> {
    if device.is_cuda() {
        return whole_block(cfg, held);
    }
    describe(cfg.memory.mechanism).scored_chunks(cfg, held)
}

/// Floating-point operations of one training step of `cfg` when layer `i` holds
/// `held[i]` states per stream on `device`: the matrix products of the forward pass, times 3 for
/// forward and backward (the usual count: the backward pass costs two forward passes).
///
/// Per stream and block of `m` tokens, a layer with width `d`, feed-forward width `f`
/// and `n = held + m` keys computes (a multiply-add is 2 FLOPs):
/// - the query and output projections, `2 * 2 m d²`, and the feed-forward, `2 * 2 m d f`;
/// - keys and values of every state held and of the block, `2 * 2 n d²` (Transformer-XL
///   recomputes them from the cached states every block);
/// - scores and the weighted sum, `2 * 2 m n d`, and the relative-position scores over
///   the `min(P, n)` position rows a block can reach, `2 m P d`; where the queries attend
///   in chunks (the window mechanisms on the CPU, `model::memory::window`), each chunk
///   of `c` queries over its `k` keys instead: `2 * 2 c k d` and `2 c min(P, k) d`
///   (Adaptive-Span's reach counted as its whole cache, an upper bound; Expire-Span's
///   fused path in causal chunks, each over the keys up to its last query, with all
///   `P` position rows);
/// - for the ∞-former, its long-term memory's keys, values and output projection,
///   `3 * 2 N d²`, and scores and context over the `N` basis functions, `2 * 2 m N d`.
///
/// Plus the output head, `2 m d V`. Elementwise work (softmax, masks, norms, the
/// optimiser) and the mechanisms' small extras (span predictors, the compression
/// network, the LTM's refit) are not counted.
pub fn step_flops(cfg: &Config, held: &[usize], device: Device) -> f64 {
    let (d, f, v) = (cfg.model.d_model as f64, cfg.model.d_ffn as f64, cfg.model.vocab as f64);
    let m = cfg.train.block as f64;
    let p = crate::model::memory::position_rows(&cfg.memory, cfg.train.block) as f64;
    let mechanism = describe(cfg.memory.mechanism);
    let per_layer = |held: usize| {
        let n = held as f64 + m;
        let mut flops = 4.0 * m * d * d + 4.0 * m * d * f + 4.0 * n * d * d;
        for c in scored_chunks(cfg, held as i64, device) {
            let (queries, keys) = (c.queries as f64, c.keys as f64);
            // No pair is further apart than keys - 1, and only those rows are used (but
            // Expire-Span scores every row, at most a block's, and gathers from them).
            let rows = if mechanism.scores_every_position_row() { p } else { p.min(keys) };
            flops += 4.0 * queries * keys * d + 2.0 * queries * rows * d;
        }
        flops + mechanism.memory_flops(cfg, m, d)
    };
    let layers: f64 = (0..cfg.model.layers).map(|i| per_layer(held.get(i).copied().unwrap_or(0))).sum();
    let forward = cfg.train.batch as f64 * (layers + 2.0 * m * d * v);
    3.0 * forward
}

/// The matrix-multiply rate of `device` through libtorch, GFLOP/s: the best of a few
/// products of two `n x n` float32 matrices (`n` = 2048 on CPU, 8192 on a GPU), with
/// the current thread count. This is the peak that [`BenchResult::mfu`] is measured
/// against.
pub fn gemm_rate(device: Device) -> f64 {
    let _guard = tch::no_grad_guard();
    let n: i64 = if device.is_cuda() { 8192 } else { 2048 };
    let a = Tensor::randn([n, n], (Kind::Float, device));
    let b = Tensor::randn([n, n], (Kind::Float, device));
    let mut best = f64::INFINITY;
    for i in 0..6 {
        let start = Instant::now();
        let c = a.matmul(&b);
        synchronize(device);
        let t = start.elapsed().as_secs_f64();
        drop(c);
        if i > 0 {
            best = best.min(t);
        }
    }
    2.0 * (n as f64).powi(3) / best / 1e9
}

/// The GEMM rate ([`gemm_rate`]) on `cfg`'s device with its thread count; returns the
/// rate and the number of threads.
pub fn machine_rate(cfg: &Config) -> Result<(f64, i32)> {
    let device = crate::device::for_training(&cfg.train.device, cfg.train.threads, cfg.train.tf32)?;
    Ok((gemm_rate(device), tch::get_num_threads()))
}
