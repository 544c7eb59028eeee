//! Expire-Span's mask, span loss and deletion rule as tensor functions: the remaining
//! span `r = e - counter - q` (paper 4.1), the soft mask `m = clamp(1 + r / R, 0, 1)`
//! (Eq. 5), the pairs on the ramp and the span loss over them (Eq. 6, 7), the causal
//! chunks of the fused path, and the official code's batch-wide deletion.

use tch::{Kind, Tensor};

use crate::memory::window::Chunk;

/// Soft mask of Eq. 5: `clamp(1 + r / R, 0, 1)`.
pub fn soft_mask(remaining: &Tensor, ramp: f64) -> Tensor {
    (remaining / ramp + 1.0).clamp(0.0, 1.0)
}

/// Remaining spans `r[b, q, k] = e[b, k] - (counter[b, k] + q)` of `m` queries: `spans` and
/// `counter` are `(b, n)`; returns `(r, dist)`, both `(b, m, n)`, where `dist = t - i`.
/// Spans per key-value head `(b, g, n)` give `r` `(b, g, m, n)`, `dist` still `(b, m, n)`.
pub fn remaining(spans: &Tensor, counter: &Tensor, m: i64) -> (Tensor, Tensor) {
    let dist = distances(counter, m);
    let r = match spans.dim() {
        3 => spans.unsqueeze(2) - dist.unsqueeze(1),
        _ => spans.unsqueeze(1) - &dist,
    };
    (r, dist)
}

/// Distances `t - i = counter[b, k] + q` `(b, m, n)` of `m` queries to memories whose
/// distance to the first query is `counter` `(b, n)`.
pub fn distances(counter: &Tensor, m: i64) -> Tensor {
    let query = Tensor::arange(m, (Kind::Float, counter.device())).view([1, m, 1]);
    counter.unsqueeze(1) + query // (b, m, n)
}

/// Which memories each query sees `(b, m, n)`: those it may use (`usable`, `(b, 1, n)` or
/// `(b, m, n)`), not later than the query (`dist >= 0`) and not fully masked (`m > 0`).
/// With a mask per key-value head `(b, g, m, n)`, what each head sees, `(b, g, m, n)`.
pub fn visible_pairs(usable: &Tensor, dist: &Tensor, mask: &Tensor) -> Tensor {
    let allowed = usable.logical_and(&dist.ge(0.0)); // (b, m, n)
    let allowed = if mask.dim() == 4 { allowed.unsqueeze(1) } else { allowed };
    allowed.logical_and(&mask.gt(0.0))
}

/// Which query-memory pairs are on the ramp, `0 < m < 1`, among those a query may see:
/// `mask` `(b, m, n)`, `visible` `(b, m, n)` (false wherever `m = 0`).
pub fn on_ramp(mask: &Tensor, visible: &Tensor) -> Tensor {
    visible.logical_and(&mask.lt(1.0))
}

/// The span loss over the ramp: `alpha * sum(r where 0 < m < 1) / R / M` per stream,
/// averaged over streams, for spans `e` `(b, n)`, distances `dist` `(b, m, n)` and the
/// pairs [`on_ramp`] `(b, m, n)`. Since `r = e - dist`, the sum is computed as
/// `sum_k e_k c_k - sum(dist on the ramp)`, where `c_k` counts the queries that see
/// memory `k` on the ramp: the gradient, `alpha / (R M)` per ramp pair, reaches the
/// spans through a `(b, n)` product instead of a `(b, m, n)` one. The sums are taken in
/// double precision, so that the difference loses nothing to cancellation. Per key-value
/// head, spans `(b, g, n)` and pairs `(b, g, m, n)`, the loss is the heads' mean: each
/// head counted as a stream of its own.
pub fn ramp_loss(spans: &Tensor, dist: &Tensor, on_ramp: &Tensor, ramp: f64, block: i64, alpha: f64) -> Tensor {
    if let [b, g, n] = spans.size()[..] {
        let m = dist.size()[1];
        let dist = dist.unsqueeze(1).expand([b, g, m, n], false).reshape([b * g, m, n]);
        let pairs = on_ramp.reshape([b * g, m, n]);
        return ramp_loss(&spans.reshape([b * g, n]), &dist, &pairs, ramp, block, alpha);
    }
    let counts = on_ramp.sum_dim_intlist([1i64].as_slice(), false, spans.kind()); // (b, n)
    let by_distance = dist.where_scalarother(on_ramp, 0.0).sum_dim_intlist([1i64, 2].as_slice(), false, Kind::Double); // (b)
    ramp_loss_of_counts(spans, &counts, &by_distance, ramp, block, alpha)
}

/// [`ramp_loss`] from its parts: `counts` `(b, n)`, how many queries see each memory on
/// the ramp, and `by_distance` `(b)` (double), the sum of the distances on the ramp.
pub fn ramp_loss_of_counts(
    spans: &Tensor,
    counts: &Tensor,
    by_distance: &Tensor,
    ramp: f64,
    block: i64,
    alpha: f64,
) -> Tensor {
    let by_span = (spans * counts).sum_dim_intlist([1i64].as_slice(), false, Kind::Double); // (b)
    ((by_span - by_distance).mean(Kind::Double) * (alpha / ramp / block as f64)).to_kind(spans.kind())
}

/// The chunks of `chunk` queries of a block of `m` after `cached` keys, each over the keys
/// from the first to its last query (`k0 = 0`: a memory's span, not its age, decides
/// whether a query sees it).
pub fn causal_chunks(cached: i64, m: i64, chunk: i64) -> Vec<Chunk> {
    (0..m)
        .step_by(chunk.max(1) as usize)
        .map(|q0| {
            let queries = chunk.min(m - q0);
            Chunk { q0, queries, k0: 0, keys: cached + q0 + queries }
        })
        .collect()
}

/// The official policy: drop the leading slots that are dead in every stream, rounded
/// down to a multiple of `block`. Returns how many to drop from the front.
pub fn batch_min_drop(keep: &Tensor, block: i64) -> i64 {
    let dead = keep.logical_not().to_kind(Kind::Int64);
    let leading = dead.cumprod(1, Kind::Int64).sum_dim_intlist([1i64].as_slice(), false, Kind::Int64); // (b)
    let common = leading.min().int64_value(&[]);
    common / block * block
}
