//! Expire-Span (Sukhbaatar et al., 2021, "Not All Memories are Created Equal"):
//! every memory predicts how long it should be kept, and memories past their span are
//! deleted from the cache.
//!
//! - Span predictor per layer, shared by the heads (Eq. 3, Eq. 8):
//!   `e_i = L sigmoid((w·h_i + b) / pre_div)`, `w = 0` and `b = -pre_div ln(1/p - 1)` at
//!   start, so every memory starts at span `p L` whatever the divisor (the bias is
//!   divided too, so it is scaled up by it; see docs/design/algorithms.md, Expire-Span).
//! - Remaining span of memory `i` for query `t`: `r_ti = e_i - (t - i)`. Each memory
//!   carries a counter, its distance to the first query of the block, so for query `q`
//!   of the block `t - i = counter_i + q` (block-parallel, section 4.2).
//! - Soft mask (Eq. 5) `m = clamp(1 + r/R, 0, 1)`, applied after the softmax with
//!   renormalisation (Eq. 4): scores where `m = 0` are `-inf`, then
//!   `a = a m / (sum(a m) + 1e-8)`. Computed as one softmax with the additive bias
//!   `ln m` (`attention::attend`), equal up to the 1e-8, the positions' bias beside it.
//! - Span loss only where the memory is on the ramp, `0 < m < 1` ("Loss Computation",
//!   4.2): `alpha * sum(r) / R / M` per stream, averaged over the batch. Its gradient
//!   is `alpha / (R M)` per ramp position, so it shrinks spans.
//! - Random span shortening in training (4.2): once per block, spans are clamped to
//!   `u L`, `u ~ U(0, 1)`, for the mask and the loss, not for deletion.
//! - Relative positions (A.1): `key_pe` only for distances up to `min(L, M)`; older
//!   memories are matched on content alone, so the position cost is `O(M)`, not `O(L)`.
//! - On the CPU (the fused kernel) the block's queries go in causal chunks of 64, each
//!   over the keys up to its last query: a query sees no later key.
//! - Physical deletion: after a block, a memory is dropped when every query of the next
//!   block would mask it fully, `e + R - counter_next <= 0`, the block just processed
//!   included under `stream` (the official code keeps that block for its skew). The
//!   cache is a padded tensor `(b, C, d)`, right-aligned, with a per-slot counter and a
//!   validity flag. Policy `stream` compacts every stream to its own live memories
//!   (padding only up to the longest stream); `batch` reproduces the
//!   official code (drop the batch minimum of leading dead memories, rounded down to a
//!   multiple of the block); `off` keeps the last `L + R` positions, beyond which no
//!   memory can be seen, so it is the exact reference the other two must match.
//! - A budget (`memory.expire.budget`, beyond the paper): at most `B` memories a stream
//!   after a block, those with the least remaining span `e + R - t` deleted first, so
//!   that the learned spans can be compared with the key-value cache policies at the
//!   same memory.
//! - Per key-value head (`memory.expire.per_head`, beyond the paper): `g` predictors,
//!   spans `(b, g, n)`, each head's mask from its own span (the query heads of a group
//!   share theirs), the span loss the heads' mean; a memory is deleted once its largest
//!   span has expired, so that the cache keeps one state a memory for all heads.
//! - On a Llama-family layer (no learned positions), each key is rotated at the place
//!   it was written, `-counter` from the block's first query, so that compaction moves
//!   no distance (RoFormer Eq. 34 depends on the distance alone).
//! - Episodes ([`AttendInput::episodes`]): a query sees only memories of its own
//!   episode, and (under `stream` and `batch`) memories of an episode that has ended in
//!   a row are deleted at the block's end, as a reset of that row would.

use tch::{nn, Kind, Tensor};

use super::descriptor::{whole_block, Descriptor, LayerShape};
use super::layer::{same_episode, with_cached_episodes, AttendInput, AttendOutput, Carry, MemoryLayer, MemoryReport};
use crate::attention::{self, Window};
use crate::memory::compact;
use crate::memory::expire_bias;
use crate::memory::expire_fused;
use crate::memory::window::{cat_chunks, chunk_keys, chunk_queries, Chunk, QUERY_CHUNK};
use lethe_core::config::{Arch, Config, Deletion, ExpireConfig, MemoryConfig};
use lethe_core::error::{LetheError, Result};
use lethe_core::profile;

/// Expire-Span's [`Descriptor`]: position embeddings for a block's distances only (paper
/// A.1), scored whole by every chunk; causal chunks on the fused path; on the CPU's
/// ragged path (no attention dropout) a step runs over each stream's kept memories.
pub struct Expire;

impl Descriptor for Expire {
    fn build(&self, cfg: &MemoryConfig, p: nn::Path, shape: LayerShape) -> Result<Box<dyn MemoryLayer>> {
        let rows = self.position_rows(cfg, shape.block);
        let heads = if cfg.expire.per_head { shape.kv_heads } else { 1 };
        Ok(Box::new(ExpireSpan::new(p, shape.d_model, heads, cfg.span, rows, &cfg.expire)))
    }

    fn colour(&self) -> (u8, u8, u8) {
        (214, 39, 40)
    }

    fn position_rows(&self, cfg: &MemoryConfig, block: usize) -> i64 {
        cfg.span.min(block) as i64 + 1
    }

    fn scored_chunks(&self, cfg: &Config, held: i64) -> Vec<Chunk> {
        if fused_on(cfg) {
            causal_chunks(held, cfg.train.block as i64, QUERY_CHUNK)
        } else {
            whole_block(cfg, held)
        }
    }

    fn scores_every_position_row(&self) -> bool {
        true
    }

    fn ragged_keys(&self, cfg: &Config, device: tch::Device) -> bool {
        fused_on(cfg) && !device.is_cuda() && cfg.model.dropout == 0.0
    }
}

/// Whether `cfg`'s Expire-Span layers run the fused CPU kernel: asked for, and on the
/// papers' backbone, whose relative positions it lays out.
fn fused_on(cfg: &Config) -> bool {
    cfg.memory.expire.fused && cfg.model.arch == Arch::Lethe
}

/// How long each memory is kept: its spans `(b, n)`, or per key-value head `(b, g, n)`
/// the largest of its heads' `(b, n)` (a memory is deleted once no head sees it).
fn memory_spans(spans: &Tensor) -> Tensor {
    match spans.dim() {
        3 => spans.amax([1i64].as_slice(), false),
        _ => spans.shallow_clone(),
    }
}

/// Spans of a predictor's scores `x w` (Eq. 3): `L sigmoid((x w + b) / pre_div)`, or as
/// the official code, `L sigmoid(x w / pre_div + b)`, at the largest span `L =
/// max_span`. Scores `(b, n)` give spans `(b, n)`; per key-value head, scores
/// `(b, n, g)` give `(b, g, n)`.
pub(crate) fn spans_of_scores(scores: &Tensor, b: &Tensor, max_span: f64, cfg: &ExpireConfig) -> Tensor {
    let b = b.to_kind(scores.kind());
    let logit = if cfg.as_official { scores / cfg.pre_div + b } else { (scores + b) / cfg.pre_div };
    let spans = logit.sigmoid() * max_span;
    match scores.dim() {
        3 => spans.permute([0, 2, 1]), // (b, g, n)
        _ => spans,                    // (b, n)
    }
}

/// Of the memories `kept` `(b, n)`, at most `budget` a stream: those with the most
/// `remaining` span `(b, n)`, the soonest to expire deleted first (`memory.expire.budget`).
pub(crate) fn within_budget(kept: &Tensor, remaining: &Tensor, budget: i64) -> Tensor {
    let n = kept.size()[1];
    if n <= budget {
        return kept.shallow_clone();
    }
    let score = remaining.to_kind(Kind::Float).masked_fill(&kept.logical_not(), f64::NEG_INFINITY);
    let (_, top) = score.topk(budget, 1, true, false); // (b, budget)
    let chosen = kept.zeros_like().scatter_value(1, &top, 1); // (b, n)
    kept.logical_and(&chosen)
}

/// Which keys each query of the last block saw: the pairs themselves, or (the fused
/// kernel does not write them out) what they are computed from.
enum Seen {
    /// `(b, m, n)`.
    Pairs(Tensor),
    /// The spans the mask used `(b, n)` and the keys each query could use, `(b, 1, n)`
    /// or `(b, m, n)`.
    Spans { spans: Tensor, usable: Tensor, ramp: f64 },
}

impl Seen {
    /// The visible pairs `(b, m, n)` of `m` queries over keys at `counter` `(b, n)`.
    fn pairs(&self, counter: &Tensor, m: i64) -> Tensor {
        match self {
            Seen::Pairs(v) => v.shallow_clone(),
            Seen::Spans { spans, usable, ramp } => {
                let (remaining, dist) = remaining(spans, counter, m);
                visible_pairs(usable, &dist, &soft_mask(&remaining, *ramp))
            }
        }
    }
}

/// One layer's Expire-Span memory: the span predictor's parameters and the cache.
pub struct ExpireSpan {
    cfg: ExpireConfig,
    max_span: f64,
    pos_rows: i64,
    /// Span predictors: one shared by the layer's heads, or one per key-value head.
    span_heads: i64,
    w: Tensor,
    b: Tensor,
    state: Option<Cache>,
    /// The counters `-j` and validity of a block's own memories `(b, m)`, the same for
    /// every block of a shape: built once for the last shape seen.
    block_meta: Option<(Tensor, Tensor)>,
    /// Spans of the last block's own tokens, `(b, m)`.
    block_spans: Option<Tensor>,
    stats: Option<Stats>,
    /// The bias path ([`Path::Biased`]) on the CPU too, where the fused kernel would
    /// otherwise run: the tests check the GPU kernels' arithmetic so.
    bias_on_cpu: bool,
}

/// How a block's attention is computed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// The CPU's fused kernel ([`ExpireSpan::attend_fused`]).
    Fused,
    /// One bias node, the GPU's kernels, and libtorch's fused attention
    /// ([`ExpireSpan::attend_biased`]).
    Biased,
    /// The written-out tensor operations ([`ExpireSpan::attend_written_out`]).
    WrittenOut,
}

/// What a block's `attend` hands to its `update` (as a [`Carry`]): the spans it gave
/// `[cache, block]`, un-noised, and, unless the cache holds raw states (then `update` gets
/// the raw block and builds its own), `[cache, block]` as built, so that `update` does
/// not build the concatenations again.
struct Handed {
    spans: Tensor,
    built: Option<Built>,
}

/// `[cache, block]` as a block's `attend` built it: the states (detached), counters and
/// validity, each `(b, n, ..)`.
struct Built {
    states: Tensor,
    counter: Tensor,
    valid: Tensor,
}

/// The cache: states, each memory's distance to the next block's first query, and which
/// slots hold a memory (the rest is padding, on the left).
struct Cache {
    states: Tensor,  // (b, c, d)
    counter: Tensor, // (b, c) float
    valid: Tensor,   // (b, c) bool
    /// The episode of each memory `(b, c)` (int64), when the stream has episodes.
    episode: Option<Tensor>,
    /// `(b, c + m, d)`: `states` (its first `c` slots) with room for the next block of
    /// `m`, written there instead of joining the two in a copy; taken by the first block
    /// that uses it (the compaction on the CPU leaves the room).
    room: Option<Tensor>,
    /// `(b, c + m)` each: `counter` and `valid` followed by the next block's own, so
    /// that the block takes them without a concatenation (the GPU's deletion writes them).
    meta_room: Option<(Tensor, Tensor)>,
}

/// What a block's attention is computed from: queries `(b, h, m, dh)`, keys and values
/// `(b, h, n, dh)`, the position embeddings `(P, dh)` (none on a Llama-family layer, whose
/// queries and keys are rotated), the spans the mask uses `(b, n)`,
/// each key's distance to the first query `(b, n)`, and the keys each query may use
/// `(b, 1, n)` or `(b, m, n)`.
struct Operands<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    key_pe: Option<&'a Tensor>,
    spans: &'a Tensor,
    counter: &'a Tensor,
    usable: &'a Tensor,
}

/// One query chunk's views of the block's [`Operands`]: the queries divided by
/// `sqrt(dh)` `(b, h, queries, dh)`, the keys and values up to its last query
/// `(b, h, keys, dh)`, and their spans `(b, keys)`.
struct ChunkViews {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spans: Tensor,
}

/// What the last block's figures are computed from, when they are asked for
/// ([`MemoryLayer::report`]): reading them back every block would wait for the device.
struct Stats {
    /// Un-noised spans of `[cache, block]` `(b, n)`.
    spans: Tensor,
    /// Which slots of `[cache, block]` hold a memory `(b, n)`.
    valid: Tensor,
    /// Which keys each query saw.
    seen: Seen,
    /// Each key's distance to the block's first query `(b, n)`.
    counter: Tensor,
}

impl ExpireSpan {
    /// Creates the predictor `w` (zeros) and `b` under `p / "expire"`: `(d)` and `(1)`
    /// shared by the heads when `span_heads` is 1, else `(d, span_heads)` and
    /// `(span_heads)`, one column per key-value head. `pos_rows` is the number of `key_pe`
    /// rows (distances `0..pos_rows`).
    pub fn new(p: nn::Path, d_model: i64, span_heads: i64, max_span: usize, pos_rows: i64, cfg: &ExpireConfig) -> Self {
        let p = p / "expire";
        // `b / pre_div = logit(p)` (official: `b = logit(p)`), so that spans start at `p L`.
        let logit = -(1.0 / cfg.init_fraction - 1.0).ln();
        let init_bias = if cfg.as_official { logit } else { cfg.pre_div * logit };
        let span_heads = span_heads.max(1);
        let (w, b) = match span_heads {
            1 => (p.var("w", &[d_model], nn::Init::Const(0.0)), p.var("b", &[1], nn::Init::Const(init_bias))),
            g => (p.var("w", &[d_model, g], nn::Init::Const(0.0)), p.var("b", &[g], nn::Init::Const(init_bias))),
        };
        ExpireSpan {
            cfg: cfg.clone(),
            max_span: max_span as f64,
            pos_rows,
            span_heads,
            w,
            b,
            state: None,
            block_meta: None,
            block_spans: None,
            stats: None,
            bias_on_cpu: false,
        }
    }

    /// Predicted spans `(b, n)` of `states` `(b, n, d)`: per key-value head, the largest
    /// of the heads' (how long the memory is kept).
    pub fn spans(&self, states: &Tensor) -> Tensor {
        memory_spans(&self.spans_of_scores(&states.matmul(&self.predictor(states.kind()))))
    }

    /// The predictor `w` in `kind`: `(d)`, or `(d, g)` per key-value head.
    fn predictor(&self, kind: Kind) -> Tensor {
        self.w.to_kind(kind)
    }

    /// Spans of the scores `states w` ([`spans_of_scores`]).
    fn spans_of_scores(&self, scores: &Tensor) -> Tensor {
        spans_of_scores(scores, &self.b, self.max_span, &self.cfg)
    }

    /// Keys and values `(b, h, n, dh)` of `[cache, block]` and the predictor's scores,
    /// `(b, n)` or per key-value head `(b, n, g)`: in one projection when shared (its
    /// gradient to the block summed with the keys' and values', `model::cache_grad`),
    /// otherwise the keys and values so and the scores of the cached rows and of the
    /// block `x` apart (the cached rows carry no gradient unless `states` do).
    fn project(&self, input: &AttendInput, states: &Tensor, window: Window) -> Result<attention::Projected> {
        let w = self.predictor(states.kind());
        if self.span_heads == 1 {
            return input.attn.project_after_cache(states, input.x, &w, window);
        }
        let (k, v) = input.attn.keys_values_after_cache(states, input.x)?;
        let (n, m) = (states.size()[1], input.x.size()[1]);
        let scores = if states.requires_grad() {
            states.matmul(&w)
        } else if n == m {
            input.x.matmul(&w)
        } else {
            Tensor::cat(&[states.narrow(1, 0, n - m).matmul(&w), input.x.matmul(&w)], 1)
        }; // (b, n, g)
        Ok(attention::Projected { k, v, scores })
    }

    /// The official code's first cache (`as_official`): `m` zero states at distances
    /// `m..1` to the first query of a block `x` `(b, m, d)`.
    fn zero_cache(x: &Tensor) -> Cache {
        let (b, m, d) = x.size3().expect("block must be (b, m, d)");
        let counter = Tensor::arange_start_step(m, 0, -1, (Kind::Float, x.device())); // m, m-1, .., 1
        Cache {
            states: Tensor::zeros([b, m, d], (x.kind(), x.device())),
            counter: counter.unsqueeze(0).expand([b, m], false).contiguous(),
            valid: Tensor::ones([b, m], (Kind::Bool, x.device())),
            episode: None,
            room: None,
            meta_room: None,
        }
    }

    /// `[cache, block]` states for the attention of a block `x` `(b, m, d)`, with counters
    /// and validity: the cached states normalised by `norm` first when the cache holds raw
    /// states (`as_official` under pre-norm).
    fn states_for_attention(&mut self, x: &Tensor, norm: Option<&nn::LayerNorm>) -> (Tensor, Tensor, Tensor) {
        let (states, counter, valid) = self.keys_with_meta(x);
        let Some(norm) = norm.filter(|_| self.state.is_some()) else {
            return (states, counter, valid);
        };
        let (n, m) = (states.size()[1], x.size()[1]);
        let cached = nn::Module::forward(norm, &states.narrow(1, 0, n - m)); // (b, n - m, d)
        (Tensor::cat(&[&cached, x], 1), counter, valid)
    }

    fn cached_len(&self) -> i64 {
        self.state.as_ref().map_or(0, |c| c.states.size()[1])
    }

    /// `[cache, block]` states (without gradient: the projection gives the block its
    /// own, `model::cache_grad`), counters (distance to the block's first query) and
    /// validity, for a block `x` `(b, m, d)`.
    fn keys_with_meta(&mut self, x: &Tensor) -> (Tensor, Tensor, Tensor) {
        let (block_counter, block_valid) = self.block_meta(x);
        let x = x.detach();
        let Some(c) = self.state.as_mut() else {
            return (x, block_counter, block_valid);
        };
        let (cached, m) = (c.states.size()[1], x.size()[1]);
        let states = match c.room.take().filter(|r| r.size()[1] == cached + m) {
            Some(room) => {
                room.narrow(1, cached, m).copy_(&x);
                room
            }
            None => Tensor::cat(&[&c.states, &x], 1),
        };
        match c.meta_room.take().filter(|(counter, _)| counter.size() == [x.size()[0], cached + m]) {
            Some((counter, valid)) => (states, counter, valid),
            None => (states, Tensor::cat(&[&c.counter, &block_counter], 1), Tensor::cat(&[&c.valid, &block_valid], 1)),
        }
    }

    /// The counters `-j` (float) and validity (true) of the memories of a block `x`
    /// `(b, m, d)`, both `(b, m)`; built again only when the shape changes.
    fn block_meta(&mut self, x: &Tensor) -> (Tensor, Tensor) {
        let (b, m, _) = x.size3().expect("block must be (b, m, d)");
        let fits = |(counter, _): &(Tensor, Tensor)| counter.size() == [b, m] && counter.device() == x.device();
        let (counter, valid) = match self.block_meta.take().filter(fits) {
            Some(meta) => meta,
            None => (
                -Tensor::arange(m, (Kind::Float, x.device())).unsqueeze(0).expand([b, m], false),
                Tensor::ones([b, m], (Kind::Bool, x.device())),
            ),
        };
        self.block_meta = Some((counter.shallow_clone(), valid.shallow_clone()));
        (counter, valid)
    }

    /// Episodes `(b, n)` of `[cache, block]`, given the block's `(b, m)`, if any.
    fn episodes_of(&self, block: Option<&Tensor>) -> Option<Tensor> {
        let cached = self.state.as_ref().and_then(|c| c.episode.as_ref());
        block.map(|e| with_cached_episodes(cached, self.cached_len(), e))
    }

    /// Spans as used by the mask: noisy shortening in training, the cap at inference.
    fn effective_spans(&self, spans: &Tensor, train: bool) -> Tensor {
        if train && self.cfg.noisy {
            let u = Tensor::rand([1], (Kind::Double, tch::Device::Cpu)).double_value(&[0]);
            return spans.clamp_max(u * self.max_span);
        }
        self.capped(spans, train)
    }

    fn capped(&self, spans: &Tensor, train: bool) -> Tensor {
        if !train && self.cfg.inference_cap > 0 {
            spans.clamp_max(self.cfg.inference_cap as f64)
        } else {
            spans.shallow_clone()
        }
    }

    /// Whether a block's deletion runs as one call of [`compact::forget`]: on a GPU with
    /// lethe's kernels (or their loops on the CPU, [`Self::bias_on_cpu`]), under the
    /// `stream` policy, spans and counters of one kind. Episodes take the libtorch path.
    fn forgets_by_kernel(&self, spans: &Tensor, counter: &Tensor) -> Result<bool> {
        let device = spans.device();
        let on = self.cfg.fused && (device.is_cuda() || self.bias_on_cpu) && expire_bias::runs_on(device)?;
        let plain = self.cfg.deletion == Deletion::Stream && self.cfg.budget == 0;
        Ok(on && plain && spans.kind() == counter.kind())
    }

    fn span_loss_applies(&self, train: bool) -> bool {
        self.cfg.alpha > 0.0 && train
    }

    /// After a block: which memories of `[cache, block]` to keep under the policy.
    ///
    /// Per stream, a memory goes as soon as the next block's first query no longer sees
    /// it, `e + R - counter_next <= 0` (paper 4.1, "Block Parallel"), the block just read
    /// included. The official code never drops the block just read, so that its skew can
    /// lay out the positions of the last `2M` keys; lethe gathers positions by distance and
    /// does not need that, so only the `batch` policy (the official one) and `off` keep it.
    /// At L = 512 with learned spans near 60 that is about 120 memories a stream instead
    /// of 256.
    fn keep(&self, spans: &Tensor, counter_next: &Tensor, valid: &Tensor, m: i64) -> Tensor {
        let ramp = self.cfg.ramp as f64;
        let n = spans.size()[1];
        let in_block = || Tensor::arange(n, (Kind::Int64, spans.device())).ge(n - m).unsqueeze(0); // (1, n)
        let kept = match self.cfg.deletion {
            Deletion::Stream => (spans + ramp - counter_next).gt(0.0),
            Deletion::Batch => (spans + ramp - counter_next).gt(0.0).logical_or(&in_block()),
            Deletion::Off => counter_next.lt(self.max_span + ramp).logical_or(&in_block()),
        };
        let kept = valid.logical_and(&kept);
        match self.cfg.budget as i64 {
            0 => kept,
            budget => within_budget(&kept, &(spans + ramp - counter_next), budget),
        }
    }
}

impl MemoryLayer for ExpireSpan {
    fn name(&self) -> &'static str {
        "expire"
    }

    fn attend(&mut self, input: &AttendInput) -> Result<AttendOutput> {
        let m = input.x.size()[1];
        let keys = profile::phase("keys, values");
        if self.cfg.as_official && self.state.is_none() {
            if input.episodes.is_some() {
                return Err(LetheError::Invalid(
                    "memory.expire.as_official cannot keep episodes apart (its first cache belongs to no episode)"
                        .into(),
                ));
            }
            self.state = Some(Self::zero_cache(input.x));
        }
        let (states, counter, valid) = self.states_for_attention(input.x, input.norm); // (b, n, d), (b, n), (b, n)

        // Handed to `update` of the same block, unless the cache holds raw states: `update`
        // then gets the raw block and builds its own concatenation.
        let built = input.norm.is_none().then(|| Built {
            states: states.detach(),
            counter: counter.shallow_clone(),
            valid: valid.shallow_clone(),
        });
        // Keys, values and the span predictor's scores in one, so that the block's gradient
        // is computed for its rows only (`model::cache_grad`); for every row when the
        // cached rows were normalised here (the states then carry the norm's gradient).
        // The ragged attention reads each stream's rows from its first valid one, as views:
        // the padding is not projected. libtorch's products read head-major copies of all.
        let window = match self.ragged(input) && !states.requires_grad() {
            true => Window::Ragged { valid: &valid },
            false => Window::Padded,
        };
        let projected = self.project(input, &states, window)?;
        drop(keys);
        let predicting = profile::phase("spans");
        let spans = self.spans_of_scores(&projected.scores); // (b, n) or (b, g, n), with gradient to w and b
        let detached = memory_spans(&spans.detach()); // (b, n)

        // The spans the memories were given: at inference, under the cap.
        let given = self.capped(&detached, input.train);
        let n = detached.size()[1];
        self.block_spans = Some(given.narrow(1, n - m, m));
        let e = self.effective_spans(&spans, input.train);
        // Memories of the query's episode that hold a state: (b, 1, n), or (b, m, n) with episodes.
        let usable = match (input.episodes, self.episodes_of(input.episodes)) {
            (Some(block), Some(all)) => valid.unsqueeze(1).logical_and(&same_episode(block, &all)),
            // As the official code, a token does not see itself: (b, m, n).
            _ if self.cfg.as_official => valid.unsqueeze(1).logical_and(&distances(&counter, m).ge(1.0)),
            _ => valid.unsqueeze(1),
        };
        drop(predicting);

        // A Llama-family layer's rotary positions: each key at the place it was written.
        let (q, k) = input.attn.rotate_by_counter(input.q, &projected.k, &counter); // (b, h, m or n, dh)
        let v = &projected.v; // (b, h, n, dh)
        let operands =
            Operands { q: &q, k: &k, v, key_pe: input.key_pe, spans: &e, counter: &counter, usable: &usable };
        let (context, aux, seen) = match self.path(input)? {
            Path::Fused => self.attend_fused(&operands, input)?,
            Path::Biased => self.attend_biased(&operands, input)?,
            Path::WrittenOut => self.attend_written_out(&operands, input),
        };
        self.stats = Some(Stats { spans: detached, valid, seen, counter });
        Ok(AttendOutput { context, aux_loss: aux, added: None, carry: Carry::new(Handed { spans: given, built }) })
    }

    fn update(&mut self, x: &Tensor, episodes: Option<&Tensor>, carry: Carry) -> Result<()> {
        let m = x.size()[1];
        let (built, given) = carry.take::<Handed>().map_or((None, None), |h| (h.built, Some(h.spans)));
        let (states, counter, valid) = match built {
            Some(b) => (b.states, b.counter, b.valid),
            None => self.keys_with_meta(x),
        };
        let spans = match given {
            Some(s) if s.size() == counter.size() => s,
            _ => self.spans(&states).detach(),
        };
        let _compaction = profile::phase("deletion");
        if episodes.is_none() && self.forgets_by_kernel(&spans, &counter)? {
            let _kernels = profile::phase("kernels");
            let f = compact::forget(&states, &spans, &counter, &valid, self.cfg.ramp as f64, m)?;
            let c = f.counter.size()[1] - m;
            let kept = |t: &Tensor| t.narrow(1, 0, c);
            self.state = Some(Cache {
                states: f.states,
                counter: kept(&f.counter),
                valid: kept(&f.valid),
                episode: None,
                room: None,
                meta_room: Some((f.counter, f.valid)),
            });
            return Ok(());
        }
        let counter_next = counter + m as f64;
        let choosing = profile::phase("which to keep");
        let mut keep = self.keep(&spans, &counter_next, &valid, m);
        drop(choosing);
        let _copying = profile::phase("copy the kept");
        let ids = self.episodes_of(episodes); // (b, n)
        if let (Some(ids), Some(block), false) = (&ids, episodes, self.cfg.deletion == Deletion::Off) {
            // Only the row's current episode can be seen again: the others are deleted.
            keep = keep.logical_and(&ids.eq_tensor(&block.narrow(1, m - 1, 1)));
        }
        self.state = Some(match self.cfg.deletion {
            Deletion::Stream => {
                let mut tensors = vec![&states, &counter_next];
                tensors.extend(ids.as_ref());
                // Room for a next block as long as this one.
                let compacted = compact::compact(&keep, &tensors, m)?;
                let room = compacted.with_room.first().map(Tensor::shallow_clone);
                let mut slots = compacted.tensors.into_iter();
                let (Some(states), Some(counter)) = (slots.next(), slots.next()) else {
                    return Err(LetheError::Invalid("expire-span cache compaction returned too few tensors".into()));
                };
                Cache { states, counter, valid: compacted.valid, episode: slots.next(), room, meta_room: None }
            }
            Deletion::Batch | Deletion::Off => {
                let drop = batch_min_drop(&keep, m);
                let n = states.size()[1];
                let narrow = |t: &Tensor| t.narrow(1, drop, n - drop);
                Cache {
                    states: narrow(&states).contiguous(),
                    counter: narrow(&counter_next),
                    // As in the official code, memories that are not dropped stay usable.
                    valid: narrow(&valid),
                    episode: ids.as_ref().map(narrow),
                    room: None,
                    meta_room: None,
                }
            }
        });
        Ok(())
    }

    fn caches_raw_states(&self) -> bool {
        self.cfg.as_official
    }

    fn reset(&mut self) {
        self.state = None;
    }

    fn report(&self) -> MemoryReport {
        let held = self.cached_len() as usize;
        // The memories a stream keeps now, its padding left out: the mean over streams.
        let kept = self
            .state
            .as_ref()
            .map_or(0.0, |c| c.valid.sum(Kind::Double).double_value(&[]) / c.valid.size()[0].max(1) as f64);
        let Some(s) = &self.stats else {
            let zero =
                vec![("mean_span".into(), 0.0), ("max_span".into(), 0.0), ("live".into(), 0.0), ("kept".into(), kept)];
            return MemoryReport { extra: zero, ..MemoryReport::with_rows(vec![], held) };
        };
        let _guard = tch::no_grad_guard();
        let validf = s.valid.to_kind(Kind::Float);
        let live = validf.sum(Kind::Double).double_value(&[]);
        let (b, m) = (s.counter.size()[0], self.block_spans.as_ref().map_or(0, |t| t.size()[1]));
        let visible = s.seen.pairs(&s.counter, m); // (b, m, n)
        let spans = s.spans.to_kind(Kind::Float);
        // Memories seen: keys at distance 1 or more, `counter + q >= 1`.
        let dist = distances(&s.counter, m); // (b, m, n)
        MemoryReport {
            extra: vec![
                ("mean_span".into(), (&spans * &validf).sum(Kind::Double).double_value(&[]) / live.max(1.0)),
                ("max_span".into(), spans.masked_fill(&s.valid.logical_not(), 0.0).max().double_value(&[])),
                ("live".into(), (live / b as f64 - m as f64).max(0.0)),
                ("kept".into(), kept),
            ],
            ..MemoryReport::with_rows(super::layer::mem_rows(&visible.logical_and(&dist.ge(1.0))), held)
        }
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        match &self.state {
            None => vec![],
            Some(c) => {
                let mut out = vec![
                    ("cache".into(), c.states.contiguous()),
                    ("counter".into(), c.counter.shallow_clone()),
                    ("valid".into(), c.valid.to_kind(Kind::Int64)),
                ];
                out.extend(c.episode.iter().map(|e| ("episode".to_string(), e.shallow_clone())));
                out
            }
        }
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.reset();
        if state.is_empty() {
            return Ok(());
        }
        let find = |name: &str| {
            state
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.shallow_clone())
                .ok_or_else(|| LetheError::Invalid(format!("expire-span memory: missing state `{name}`")))
        };
        let (states, counter, valid) = (find("cache")?, find("counter")?, find("valid")?);
        let episode = find("episode").ok().map(|e| e.to_kind(Kind::Int64));
        let bad_episode = episode.as_ref().is_some_and(|e| e.size() != counter.size());
        if states.dim() != 3 || counter.size() != states.size()[..2] || valid.size() != counter.size() || bad_episode {
            return Err(LetheError::Invalid(format!(
                "expire-span memory: inconsistent state shapes {:?}, {:?}, {:?}",
                states.size(),
                counter.size(),
                valid.size()
            )));
        }
        self.state = Some(Cache {
            states,
            counter: counter.to_kind(Kind::Float),
            valid: valid.ne(0),
            episode,
            room: None,
            meta_room: None,
        });
        Ok(())
    }

    fn fresh(&self) -> Box<dyn MemoryLayer> {
        Box::new(ExpireSpan {
            cfg: self.cfg.clone(),
            max_span: self.max_span,
            pos_rows: self.pos_rows,
            span_heads: self.span_heads,
            w: self.w.shallow_clone(),
            b: self.b.shallow_clone(),
            state: None,
            block_meta: None,
            block_spans: None,
            stats: None,
            bias_on_cpu: self.bias_on_cpu,
        })
    }

    fn token_spans(&self) -> Option<Tensor> {
        self.block_spans.as_ref().map(Tensor::shallow_clone)
    }
}

mod mask;
mod paths;
#[cfg(test)]
mod tests;

pub use mask::*;
