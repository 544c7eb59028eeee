//! Expire-Span's attention scores from one fused CPU kernel (`csrc/expire_scores.cpp`,
//! `csrc/expire_attend.cpp`, their rows in `csrc/expire_rows.h`): the
//! soft mask of Eq. 5 applied after the softmax with renormalisation (Eq. 4) as the
//! additive bias `ln m`, the relative positions (A.1) and the ramp counts of the span
//! loss (4.2), computed in one pass over the `(b, h, m, n)` scores instead of a dozen
//! `(b, m, n)` tensors and a gather, with a backward pass of its own; optionally with
//! the softmax over the keys in the same pass ([`expire_weights`]); or the whole
//! attention, stream by stream over each stream's own keys, the content products and
//! the weighted sum included ([`expire_attend`]).
//!
//! The written-out path ([`super::expire`]) stays the reference and the GPU's path;
//! the tests check that the two agree in value and gradient, and the gradient against
//! finite differences.

use std::ffi::{c_int, c_void};

use tch::{Kind, Tensor};

use lethe_core::error::Result;
use lethe_kernels::{lethe_expire_attend, lethe_expire_scores, raw, ExpireAttendArgs, ExpireOperands};

/// What the kernel returns.
pub struct FusedScores {
    /// The attention scores `(b, h, m, n)`: `scores + positions + ln m` where a query
    /// sees a key, `-inf` elsewhere; from [`expire_weights`], their softmax over the keys
    /// (the attention weights, 0 where a key is not seen). With gradient to the scores,
    /// positions and spans.
    pub out: Tensor,
    /// Per key, how many queries see it on the ramp, `0 < m < 1` `(b, n)`; no gradient.
    pub ramp_counts: Tensor,
    /// Per stream, the sum of the distances `t - i` of the pairs on the ramp `(b)`,
    /// double; no gradient.
    pub ramp_distance: Tensor,
}

/// The fused scores of `m` queries over `n` keys.
///
/// - `scores` `(b, h, m, n)`: the content scores `q·k / sqrt(dh)`;
/// - `positions` `(b, h, m, P)`: `q·key_pe[d] / sqrt(dh)` for distances `d < P` (beyond,
///   the position term is zero);
/// - `spans` `(b, n)`: the spans `e` the mask uses (with gradient);
/// - `counter` `(b, n)`: each key's distance to the first query (whole numbers);
/// - `usable` `(b, 1, n)` or `(b, m, n)` bool: the keys a query may use at all.
///
/// CPU only; float or double, one kind for all. Float runs the widest vector loops the
/// CPU has (AVX-512 or AVX2).
pub fn expire_scores(
    scores: &Tensor,
    positions: &Tensor,
    spans: &Tensor,
    counter: &Tensor,
    usable: &Tensor,
    ramp: f64,
) -> Result<FusedScores> {
    scores_with(scores, positions, spans, counter, usable, ramp, Loops { width: WIDEST, softmax: false })
}

/// [`expire_scores`] followed by the softmax over the keys, in the same pass: the
/// attention weights `softmax(scores + positions + ln m)`, as the model uses them.
pub fn expire_weights(
    scores: &Tensor,
    positions: &Tensor,
    spans: &Tensor,
    counter: &Tensor,
    usable: &Tensor,
    ramp: f64,
) -> Result<FusedScores> {
    scores_with(scores, positions, spans, counter, usable, ramp, Loops { width: WIDEST, softmax: true })
}

/// What the kernel runs: `width` the widest vector loops, in floats: 0 the plain loops
/// on any CPU, 8 AVX2, 16 AVX-512 (each only where the CPU has it, narrower ones
/// otherwise); `softmax` takes the softmax too.
#[derive(Clone, Copy)]
struct Loops {
    width: c_int,
    softmax: bool,
}

/// The widest loops of the kernel: AVX-512's 16 floats.
const WIDEST: c_int = 16;

fn scores_with(
    scores: &Tensor,
    positions: &Tensor,
    spans: &Tensor,
    counter: &Tensor,
    usable: &Tensor,
    ramp: f64,
    loops: Loops,
) -> Result<FusedScores> {
    let mut out: [*mut c_void; 3] = [std::ptr::null_mut(); 3];
    let ptr = raw;
    // SAFETY: each pointer is a live `at::Tensor*` owned by its `Tensor` for the call (the
    // kernel reads them only);
    // on success the kernel writes three new `at::Tensor*`, which `ffi::tensor` takes over.
    lethe_kernels::call("expire-span fused scores", |error| unsafe {
        let ops = ExpireOperands {
            pq: ptr(positions),
            spans: ptr(spans),
            counter: ptr(counter),
            usable: ptr(usable),
            ramp,
            width: loops.width,
        };
        lethe_expire_scores(ptr(scores), &ops, c_int::from(loops.softmax), out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each pointer is taken over once.
    let [s, c, d] = out.map(|p| unsafe { lethe_kernels::tensor(p) });
    Ok(FusedScores { out: s, ramp_counts: c, ramp_distance: d })
}

/// What [`expire_attend`] returns.
pub struct FusedAttention {
    /// The context `(b, h, m, dh)`: the attention weights of [`expire_weights`] times the
    /// values, with gradient to the queries, keys, values, positions and spans.
    pub context: Tensor,
    /// As [`FusedScores::ramp_counts`].
    pub ramp_counts: Tensor,
    /// As [`FusedScores::ramp_distance`].
    pub ramp_distance: Tensor,
    /// The span loss over the ramp, `loss_scale * mean_b(sum_k e_bk c_bk - D_b)`: what
    /// [`super::expire::ramp_loss_of_counts`] computes from the ramp figures, with
    /// gradient to the spans (zero without a `loss_scale`).
    pub span_loss: Tensor,
}

/// The whole attention of a block, stream by stream over each stream's own keys: the
/// weights of [`expire_weights`] from the scores `q k^T` and `positions`, times `v`,
/// with the keys before a stream's first usable one left out of its products (the
/// left padding of a compacted cache, `csrc/expire_attend.cpp`'s `ExpireAttend`).
///
/// `q` `(b, h, m, dh)` divided by `sqrt(dh)` already, `k` and `v` `(b, h, n, dh)`; the
/// rest as [`expire_scores`] takes them, and the span loss's `loss_scale`, `alpha / (R M)`
/// (0: none). CPU only; float or double.
#[allow(clippy::too_many_arguments)]
pub fn expire_attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    positions: &Tensor,
    spans: &Tensor,
    counter: &Tensor,
    usable: &Tensor,
    ramp: f64,
    loss_scale: f64,
) -> Result<FusedAttention> {
    attend_with(q, k, v, positions, spans, counter, usable, ramp, loss_scale, WIDEST, true)
}

#[allow(clippy::too_many_arguments)]
fn attend_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    positions: &Tensor,
    spans: &Tensor,
    counter: &Tensor,
    usable: &Tensor,
    ramp: f64,
    loss_scale: f64,
    width: c_int,
    blas: bool,
) -> Result<FusedAttention> {
    let mut out: [*mut c_void; 4] = [std::ptr::null_mut(); 4];
    let ptr = raw;
    // SAFETY: as in `scores_with`; on success the kernel writes four new `at::Tensor*`.
    lethe_kernels::call("expire-span fused attention", |error| unsafe {
        let args = ExpireAttendArgs {
            q: ptr(q),
            k: ptr(k),
            v: ptr(v),
            ops: ExpireOperands {
                pq: ptr(positions),
                spans: ptr(spans),
                counter: ptr(counter),
                usable: ptr(usable),
                ramp,
                width,
            },
            loss_scale,
            blas: c_int::from(blas),
        };
        lethe_expire_attend(&args, out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each pointer is taken over once.
    let [context, c, d, span_loss] = out.map(|p| unsafe { lethe_kernels::tensor(p) });
    Ok(FusedAttention { context, ramp_counts: c, ramp_distance: d, span_loss })
}

/// Whether [`expire_scores`] can compute scores of this kind on this device.
pub fn supports(scores: &Tensor) -> bool {
    scores.device() == tch::Device::Cpu && matches!(scores.kind(), Kind::Float | Kind::Double)
}

#[cfg(test)]
mod tests;
