//! The memory interface: how one layer remembers the past (docs/design/architecture.md, "The memory
//! interface"). Every mechanism plugs into the shared backbone through [`MemoryLayer`]:
//!
//! 1. **State**: whatever the layer keeps between blocks (cached hidden states, counters,
//!    spans, compressed slots, basis coefficients), detached from the graph of earlier
//!    blocks, saved and restored through [`MemoryLayer::state`] / [`MemoryLayer::load_state`].
//! 2. **Attend**: [`MemoryLayer::attend`] gets the block's (normalised) hidden states and
//!    queries, and returns the attention context plus an optional auxiliary loss.
//! 3. **Update**: [`MemoryLayer::update`] absorbs the block after attention and forgets
//!    what the mechanism says to forget (physically, for Expire-Span).
//! 4. **Report**: [`MemoryLayer::report`] returns the figures to log.
//!
//! A mechanism's parameters live in the layer's `VarStore` path; its state lives in the
//! [`MemoryLayer`] object. [`MemoryLayer::fresh`] gives a second object that shares the
//! parameters with empty state, so gradient-accumulation micro-batches (and evaluation)
//! each carry their own memory.

use tch::Tensor;

use crate::attention::Attention;
use lethe_core::error::Result;

/// What a layer's memory gets for one block.
pub struct AttendInput<'a> {
    /// The layer's input for the block (after the pre-norm when pre-norm is on): `(b, m, d)`.
    pub x: &'a Tensor,
    /// The block's queries: `(b, h, m, dh)`.
    pub q: &'a Tensor,
    /// The layer's projections, to compute keys and values of remembered states.
    pub attn: &'a Attention,
    /// Learned relative-position key embeddings, shared by all layers: `(P, dh)`; none
    /// on GPT-2, whose positions are absolute and in its inputs.
    pub key_pe: Option<&'a Tensor>,
    /// Training mode: dropout and training-only regularisers are on.
    pub train: bool,
    /// The episode of each position `(b, m)` (int64), when the streams are episodes that
    /// follow each other in a row (reinforcement learning, `rl.reset = "episode"`): a
    /// query then sees only states of its own episode, as if the memory had been reset
    /// where its episode began. None: one unbroken stream per row.
    pub episodes: Option<&'a Tensor>,
    /// The layer's pre-norm, given to a memory that caches raw states
    /// ([`MemoryLayer::caches_raw_states`]) under pre-norm: it normalises the cached
    /// states with it every block, as `x` was. None otherwise.
    pub norm: Option<&'a tch::nn::LayerNorm>,
}

/// What a layer's memory returns for one block.
pub struct AttendOutput {
    /// Attention context per head, before the output projection: `(b, h, m, dh)`.
    pub context: Tensor,
    /// An auxiliary loss to add to the task loss (e.g. Expire-Span's span penalty), as a
    /// scalar already weighted by its coefficient.
    pub aux_loss: Option<Tensor>,
    /// A term `(b, m, d)` added to the projected attention output: the ∞-former's
    /// long-term context `Z_LTM` (its Eq. 12). None for the other mechanisms.
    pub added: Option<Tensor>,
    /// What [`MemoryLayer::update`] of this block may reuse; the caller passes it back.
    pub carry: Carry,
}

/// Work that a mechanism's [`MemoryLayer::attend`] hands to its [`MemoryLayer::update`]
/// of the same block (such as `[cache, block]`, built once for the keys), as an explicit
/// value that the caller passes from one to the other, not a field kept between the two
/// calls. Each mechanism puts in and takes out its own type; an empty carry (an update
/// without an attend, or one the mechanism cannot use) makes `update` build what it needs.
#[derive(Default)]
pub struct Carry(Option<Box<dyn std::any::Any + Send>>);

impl Carry {
    /// Nothing handed on: `update` builds what it needs.
    pub fn none() -> Carry {
        Carry(None)
    }

    /// Hands `value` on to the same block's update.
    pub fn new<T: std::any::Any + Send>(value: T) -> Carry {
        Carry(Some(Box::new(value)))
    }

    /// The value handed on, if it is a `T`.
    pub fn take<T: std::any::Any>(self) -> Option<T> {
        self.0.and_then(|b| b.downcast::<T>().ok()).map(|b| *b)
    }
}

/// Figures a memory reports for logging.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryReport {
    /// Mean number of memories a query of the last block could attend to, `|C_t|`
    /// (paper section 3), excluding the block itself.
    pub mem_size: f64,
    /// `mem_size` per stream of the batch, where the mechanism counts streams apart
    /// (fixed, adaptive and expire); one value or none where every stream has the
    /// same, `mem_size`. See [`MemoryReport::mem_size_of`].
    pub mem_rows: Vec<f64>,
    /// States physically held in the cache now, per stream.
    pub held: usize,
    /// Mechanism-specific figures (spans, compression, ...), by name.
    pub extra: Vec<(String, f64)>,
    /// Mechanism-specific series (the ∞-former's attention histogram), by name.
    pub series: Vec<(String, Vec<f64>)>,
}

impl MemoryReport {
    /// The memory size of stream `row` of the batch.
    pub fn mem_size_of(&self, row: usize) -> f64 {
        match self.mem_rows.len() {
            0 | 1 => self.mem_size,
            _ => self.mem_rows[row],
        }
    }

    /// A report whose memory size is `rows` per stream (their mean overall).
    pub fn with_rows(rows: Vec<f64>, held: usize) -> MemoryReport {
        MemoryReport { mem_size: lethe_core::metrics::mean(&rows), mem_rows: rows, held, extra: vec![], series: vec![] }
    }

    /// A mechanism-specific figure by name.
    pub fn extra(&self, name: &str) -> Option<f64> {
        self.extra.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    /// All figures as a JSON object, for `metrics.jsonl`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        map.insert("mem_size".into(), self.mem_size.into());
        map.insert("held".into(), self.held.into());
        for (name, value) in &self.extra {
            map.insert(name.clone(), (*value).into());
        }
        for (name, values) in &self.series {
            map.insert(name.clone(), values.clone().into());
        }
        serde_json::Value::Object(map)
    }
}

/// The mean number of earlier positions each query of a stream saw: `earlier` is
/// `(b, ..., m, n)` (heads or none between), true where a query saw a position; `b`
/// may be 1 for a mask shared by every stream.
pub(super) fn mem_rows(earlier: &Tensor) -> Vec<f64> {
    let _guard = tch::no_grad_guard();
    let size = earlier.size();
    let queries: i64 = size[1..size.len() - 1].iter().product();
    let rows =
        earlier.to_kind(tch::Kind::Double).flatten(1, -1).sum_dim_intlist([1i64].as_slice(), false, tch::Kind::Double)
            / queries as f64;
    Vec::<f64>::try_from(&rows.to_device(tch::Device::Cpu)).unwrap_or_default()
}

/// One layer's memory. See the module documentation.
pub trait MemoryLayer: Send {
    /// The mechanism's name, for logs and messages.
    fn name(&self) -> &'static str;

    /// Attention of the block over the memory and the block itself.
    fn attend(&mut self, input: &AttendInput) -> Result<AttendOutput>;

    /// Absorbs the block `x` `(b, m, d)` (already detached; the layer's raw input when
    /// [`MemoryLayer::caches_raw_states`], else its normalised input), with the episode of each
    /// position when there are episodes (as in [`AttendInput::episodes`]), and forgets
    /// what expires. `carry` is what this block's [`MemoryLayer::attend`] returned in
    /// [`AttendOutput::carry`] (or [`Carry::none`] when the block was not attended).
    fn update(&mut self, x: &Tensor, episodes: Option<&Tensor>, carry: Carry) -> Result<()>;

    /// Empties the memory (start of a stream).
    fn reset(&mut self);

    /// Figures to log.
    fn report(&self) -> MemoryReport;

    /// The state to save for exact resume, as named tensors (names relative to the layer).
    fn state(&self) -> Vec<(String, Tensor)>;

    /// Restores a state saved by [`MemoryLayer::state`].
    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()>;

    /// A memory with the same parameters and an empty state.
    fn fresh(&self) -> Box<dyn MemoryLayer>;

    /// Called once after every optimiser step on the memory that owns the parameters
    /// (for constraints such as Adaptive-Span's `0 <= z <= 1`). Default: nothing.
    fn after_step(&self) {}

    /// Whether the memory caches the layer's raw input (before the pre-norm) and
    /// normalises it with [`AttendInput::norm`] every block, as the official Expire-Span
    /// code does, instead of the normalised input. Default: false.
    fn caches_raw_states(&self) -> bool {
        false
    }

    /// The spans predicted for the last block's tokens, `(b, m)`, for mechanisms that
    /// predict them (for `lethe inspect spans`). Default: none.
    fn token_spans(&self) -> Option<Tensor> {
        None
    }

    /// What the last block did to a continuous long-term memory, for mechanisms that
    /// have one (for `lethe inspect ltm`). Default: none.
    fn ltm_trace(&self) -> Option<LtmTrace> {
        None
    }
}

/// The last block's view of a continuous long-term memory (the ∞-former's).
pub struct LtmTrace {
    /// The block's attention over `[0, 1]`, as a histogram per stream `(b, D)` that sums to 1.
    pub attention: Tensor,
    /// States absorbed into the memory at this block (0: none).
    pub absorbed: i64,
    /// When states were absorbed into a memory that held some already: the histogram
    /// `(b, D)` by which the old signal was sampled (sticky memories), or none when it was
    /// sampled evenly. The old signal's point `t` moved to `τ · CDF(t)`.
    pub sampled_by: Option<Tensor>,
    /// Whether the memory was empty before this block's absorption.
    pub first: bool,
    /// The contraction `τ`.
    pub tau: f64,
}

/// Episode numbers `(b, cached + m)` of `[cache, block]`: those of the cache when it has
/// them, or else (a cache filled before its stream was numbered) the block's first
/// episode for every cached state. `block` is `(b, m)`.
pub fn with_cached_episodes(cached_ids: Option<&Tensor>, cached: i64, block: &Tensor) -> Tensor {
    match cached_ids {
        _ if cached == 0 => block.shallow_clone(),
        Some(ids) => Tensor::cat(&[ids, block], 1),
        None => {
            let b = block.size()[0];
            Tensor::cat(&[&block.narrow(1, 0, 1).expand([b, cached], false), block], 1)
        }
    }
}

/// Which keys belong to the query's episode: query episodes `(b, m)`, key episodes
/// `(b, n)`; returns `(b, m, n)` (bool).
pub fn same_episode(queries: &Tensor, keys: &Tensor) -> Tensor {
    queries.unsqueeze(2).eq_tensor(&keys.unsqueeze(1))
}
