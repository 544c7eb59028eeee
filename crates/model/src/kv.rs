//! Key-value cache policies for the pretrained decoders ([`crate::llama`]): which entries
//! each layer's cache keeps once it holds more than its budget. The training-free
//! policies the literature compares learned forgetting with:
//! - [`full`]: every entry (no budget);
//! - [`window`]: the most recent entries;
//! - [`streaming`]: StreamingLLM (Xiao et al., 2023): a few first entries, the attention
//!   sinks, and a window, the positions re-assigned inside the cache;
//! - [`h2o`]: H2O (Zhang et al., 2023): the heavy hitters by accumulated attention and a
//!   recent window;
//! - [`tova`]: TOVA (Oren et al., 2024): the entries the newest query attends to most,
//!   averaged over the heads;
//! - [`snapkv`]: SnapKV (Li et al., 2024): the entries an observation window of recent
//!   queries attends to, its scores pooled along the cache.
//!
//! A budget is a number of entries per layer and key-value head ([`Budget`]); every head
//! of a layer keeps the same number, so the cache stays one tensor per layer. Evicted
//! entries are freed, not masked: after a chunk of `t` new tokens (a block of the prompt
//! or one generated token) the layer holds at most `budget` entries again (SnapKV up to
//! `budget + window` between its presses), so memory follows the budget whatever the
//! length of the stream. Every policy keeps its entries in the order they were written.
//!
//! Adding a policy: a unit with its [`Entry`] and its [`LayerPolicy`] (which forks, and
//! gives, takes back and checks against the entries held what it keeps about them, for
//! a cache copied or saved), and one line in [`POLICIES`]. A learned
//! memory fitted by `lethe train` reads through the same path with its run's weights
//! ([`expire`]: Expire-Span), its layers given to [`crate::llama::KvCache::with_layers`].

pub mod expire;
pub mod full;
pub mod h2o;
pub mod snapkv;
pub mod streaming;
pub mod tova;
pub mod window;

#[cfg(test)]
mod tests;

use tch::{Kind, Tensor};

use lethe_core::error::{LetheError, Result};

/// What a layer holds: keys, values and the absolute position of each entry, per
/// key-value head. Keys are rotated at their positions, unless the policy places them
/// in the cache ([`Positions::InCache`]), then they are held unrotated.
pub struct Held {
    /// `(b, kv_heads, n, head_dim)`.
    pub keys: Tensor,
    /// `(b, kv_heads, n, head_dim)`.
    pub values: Tensor,
    /// `(b, kv_heads, n)`, int64: the position each entry was written at.
    pub positions: Tensor,
    /// Buffers whose first `n` rows the three are, with room for more, so that a
    /// growing cache takes a new token without copying what it holds.
    room: Option<(Tensor, Tensor, Tensor)>,
}

impl Held {
    /// Holds `keys`, `values` and `positions` as they are.
    pub fn new(keys: Tensor, values: Tensor, positions: Tensor) -> Held {
        Held { keys, values, positions, room: None }
    }

    /// Nothing held yet.
    pub fn empty() -> Held {
        let none = || Tensor::zeros([0], (Kind::Float, tch::Device::Cpu));
        Held { keys: none(), values: none(), positions: none(), room: None }
    }

    /// Appends `t` entries, `keys` and `values` `(b, kv_heads, t, head_dim)` written at
    /// `positions` `(b, kv_heads, t)`: in place where the buffers have room, else into
    /// new buffers with a quarter more room (at least 256 entries), so that a cache
    /// that grows token by token copies what it holds only now and then.
    pub fn append(&mut self, keys: &Tensor, values: &Tensor, positions: &Tensor) {
        let (n, t) = (if self.keys.dim() == 4 { self.len() } else { 0 }, keys.size()[2]);
        let fits = self.room.as_ref().is_some_and(|(k, _, _)| k.size()[2] >= n + t);
        if !fits {
            let capacity = n + t + ((n + t) / 4).max(256);
            let grow = |held: &Tensor, new: &Tensor| {
                let mut shape = new.size();
                shape[2] = capacity;
                let buffer = Tensor::empty(shape.as_slice(), (new.kind(), new.device()));
                if n > 0 {
                    buffer.narrow(2, 0, n).copy_(held);
                }
                buffer
            };
            self.room = Some((grow(&self.keys, keys), grow(&self.values, values), grow(&self.positions, positions)));
        }
        if let Some((k, v, p)) = &self.room {
            k.narrow(2, n, t).copy_(keys);
            v.narrow(2, n, t).copy_(values);
            p.narrow(2, n, t).copy_(positions);
            (self.keys, self.values, self.positions) =
                (k.narrow(2, 0, n + t), v.narrow(2, 0, n + t), p.narrow(2, 0, n + t));
        }
    }

    /// An independent copy: the same entries, in memory of its own.
    pub fn fork(&self) -> Held {
        Held { keys: self.keys.copy(), values: self.values.copy(), positions: self.positions.copy(), room: None }
    }

    /// Entries per key-value head.
    pub fn len(&self) -> i64 {
        self.keys.size()[2]
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the entries at `indices` `(b, kv_heads, m)`, each row ascending; the rest
    /// is freed.
    pub fn keep(&mut self, indices: &Tensor) {
        let hd = self.keys.size()[3];
        let rows = indices.unsqueeze(-1).expand([-1, -1, -1, hd], false);
        self.keys = self.keys.gather(2, &rows, false);
        self.values = self.values.gather(2, &rows, false);
        self.positions = self.positions.gather(2, indices, false);
        self.room = None;
    }

    /// Keeps the entries in the ranges `(start, length)` of every row, in that order.
    pub fn keep_ranges(&mut self, ranges: &[(i64, i64)]) {
        let cut = |t: &Tensor| Tensor::cat(&ranges.iter().map(|&(s, l)| t.narrow(2, s, l)).collect::<Vec<_>>(), 2);
        self.keys = cut(&self.keys);
        self.values = cut(&self.values);
        self.positions = cut(&self.positions);
        self.room = None;
    }
}

/// What one layer's attention computed for a chunk of `t` new tokens, once their
/// entries joined [`Held`]: what the policies score the entries with.
pub struct Chunk<'a> {
    /// `(b, heads, t, head_dim)`: the queries as they met the keys (rotated alike).
    pub queries: &'a Tensor,
    /// `(t)`, int64: the queries' absolute positions.
    pub query_positions: &'a Tensor,
    /// `(b, heads, t, n)`: the attention weights over the `n` entries held, for the
    /// policies that ask for them ([`LayerPolicy::needs_weights`]).
    pub weights: Option<&'a Tensor>,
    /// The score scale, `1 / sqrt(head_dim)`.
    pub scale: f64,
}

/// Where a layer's keys get their rotary positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Positions {
    /// Rotated once, at the absolute position they were written at.
    Absolute,
    /// Held unrotated and rotated at their place in the cache at every step (queries at
    /// the places after it): StreamingLLM's re-assigned positions.
    InCache,
}

/// One layer's policy, with whatever it keeps about the entries (H2O's accumulated
/// scores, SnapKV's observation window).
pub trait LayerPolicy: Send {
    /// Where the keys get their positions.
    fn positions(&self) -> Positions {
        Positions::Absolute
    }

    /// Whether the policy scores entries by the chunk's attention weights (else they
    /// need not be written out, and a chunk of several tokens takes the fused kernel).
    fn needs_weights(&self) -> bool {
        false
    }

    /// Whether every key-value head of a layer keeps the same entries (else each head
    /// evicts its own, and a mask that depends on how far back an entry is, Mistral's
    /// sliding window, differs from head to head).
    fn same_entries_in_every_head(&self) -> bool {
        true
    }

    /// Before a chunk's attention, its entries appended to `held`: an additive bias on
    /// the scores `(b, 1 or kv_heads, t, n)` of the chunk's queries at `query_positions`
    /// `(t)`, for a policy that weighs entries softly (Expire-Span's `ln m`), from the
    /// layer's normed input `x` `(b, t, d)`. None (the default): the scores as they are.
    fn bias(&mut self, _x: &Tensor, _held: &Held, _query_positions: &Tensor) -> Option<Tensor> {
        None
    }

    /// After a chunk's attention: evicts from `held` as the policy says.
    fn update(&mut self, held: &mut Held, chunk: &Chunk);

    /// An independent copy, with its own copy of whatever the policy keeps about the
    /// entries: the two read on apart ([`crate::llama::KvCache::fork`]).
    fn fork(&self) -> Box<dyn LayerPolicy>;

    /// What the policy keeps about the entries, as named tensors (nothing by default):
    /// with the entries, all a saved cache needs ([`crate::llama::KvCache::state`]).
    fn state(&self) -> Vec<(&'static str, Tensor)> {
        Vec::new()
    }

    /// Takes back what [`LayerPolicy::state`] gave; one line naming a tensor it does not
    /// keep, or one it cannot take.
    fn restore(&mut self, state: Vec<(String, Tensor)>) -> std::result::Result<(), String> {
        match state.first() {
            Some((name, _)) => Err(format!("`{name}`: the policy keeps nothing of that name")),
            None => Ok(()),
        }
    }

    /// After [`LayerPolicy::restore`]: refuses what it took back where it does not
    /// describe the entries the layer holds, `held` (none: the layer holds none), in one
    /// line naming the tensor. Nothing to refuse by default.
    fn fits(&self, _held: Option<&Held>) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Refuses a policy's tensor `name` (if kept) unless its shape is `want`, the one the
/// entries held make (none: the layer holds no entry, and the policy keeps nothing).
pub fn sized(name: &str, t: Option<&Tensor>, want: Option<&[i64]>) -> std::result::Result<(), String> {
    match (t, want) {
        (Some(t), Some(want)) if t.size() != want => {
            Err(format!("`{name}`: of shape {:?}, where the entries held make {want:?}", t.size()))
        }
        (Some(_), None) => Err(format!("`{name}`: kept for a layer that holds no entry")),
        _ => Ok(()),
    }
}

/// A policy's saved tensor `name`, refused unless it has `dims` dimensions and the
/// dtype `kind` (on any device: a decoder refuses a cache held on another device than
/// its own, [`crate::llama::KvCache::check_fits`]).
pub fn saved(name: &str, t: Tensor, dims: usize, kind: Kind) -> std::result::Result<Tensor, String> {
    if t.dim() != dims || t.kind() != kind {
        return Err(format!(
            "`{name}`: a {dims}-dimensional {kind:?} tensor is wanted, not {:?} {:?}",
            t.size(),
            t.kind()
        ));
    }
    Ok(t)
}

/// A saved tensor of the model's precision (keys, values, SnapKV's queries): as
/// [`saved`], in float32, bfloat16 or float16 (a decoder refuses a cache of another
/// precision than its own, [`crate::llama::KvCache::check_fits`]).
pub fn saved_float(name: &str, t: Tensor, dims: usize) -> std::result::Result<Tensor, String> {
    let kind = match t.kind() {
        kind @ (Kind::BFloat16 | Kind::Half) => kind,
        _ => Kind::Float,
    };
    saved(name, t, dims, kind)
}

/// A copy of `t` in memory of its own, if any: what a policy keeps, forked.
pub fn forked(t: &Option<Tensor>) -> Option<Tensor> {
    t.as_ref().map(Tensor::copy)
}

/// A policy's settings, `name:key=value,...` on the command line.
#[derive(Clone, Debug, Default)]
pub struct Options(Vec<(String, f64)>);

impl Options {
    /// The value of `key`, or `default`.
    pub fn get(&self, key: &str, default: f64) -> f64 {
        self.0.iter().find(|(k, _)| k == key).map_or(default, |&(_, v)| v)
    }
}

/// A registered policy: its name, what it keeps, its settings with their defaults, and
/// how a layer's policy is made from a budget.
pub struct Entry {
    pub name: &'static str,
    pub about: &'static str,
    /// `(key, default, meaning)`.
    pub options: &'static [(&'static str, f64, &'static str)],
    /// Whether the policy takes a budget (all but `full`).
    pub budgeted: bool,
    /// Checks the settings against the budget (entries), one line naming what is wrong.
    pub check: fn(budget: i64, &Options) -> std::result::Result<(), String>,
    pub build: fn(budget: i64, &Options) -> Box<dyn LayerPolicy>,
}

/// Every policy, by name.
pub const POLICIES: &[Entry] = &[full::ENTRY, window::ENTRY, streaming::ENTRY, h2o::ENTRY, tova::ENTRY, snapkv::ENTRY];

/// A budget as given: entries per layer and key-value head, or a fraction of the
/// context (`0.25` or `1/4`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    Entries(i64),
    Fraction(f64),
}

impl std::fmt::Display for Budget {
    /// `64 entries`, or `1/8` as `0.125 of each sample`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Budget::Entries(n) => write!(f, "{n} entries"),
            Budget::Fraction(x) => write!(f, "{x} of each sample"),
        }
    }
}

impl Budget {
    /// Reads `--budget`: a whole number of entries, a decimal fraction or `a/b`.
    pub fn parse(text: &str) -> Result<Budget> {
        let bad = |why: &str| LetheError::Invalid(format!("--budget {text}: {why}"));
        let budget = if let Ok(n) = text.parse::<i64>() {
            Budget::Entries(n)
        } else if let Some((a, b)) = text.split_once('/') {
            let (a, b) = (a.trim().parse::<f64>(), b.trim().parse::<f64>());
            match (a, b) {
                (Ok(a), Ok(b)) if b != 0.0 => Budget::Fraction(a / b),
                _ => return Err(bad("not a fraction a/b")),
            }
        } else {
            Budget::Fraction(
                text.parse::<f64>().map_err(|_| bad("give a number of entries (1024) or a fraction (0.25, 1/4)"))?,
            )
        };
        match budget {
            Budget::Entries(n) if n <= 0 => Err(bad("a budget must keep at least one entry")),
            Budget::Fraction(f) if !(f > 0.0 && f <= 1.0) => Err(bad("a fraction must be in (0, 1]")),
            b => Ok(b),
        }
    }

    /// The entries per layer and key-value head for a stream of `context` tokens.
    pub fn entries(self, context: i64) -> Result<i64> {
        match self {
            Budget::Entries(n) if n > context => Err(LetheError::Invalid(format!(
                "--budget {n} is more than the {context} tokens of context: every entry would be kept (--policy full)"
            ))),
            Budget::Entries(n) => Ok(n),
            Budget::Fraction(f) => Ok(((f * context as f64).floor() as i64).max(1)),
        }
    }
}

/// A policy chosen by name, its settings and its budget in entries.
#[derive(Clone, Debug)]
pub struct Policy {
    pub name: &'static str,
    pub options: Options,
    /// Entries per layer and key-value head; `None` for `full`.
    pub budget: Option<i64>,
}

impl Default for Policy {
    /// The full cache.
    fn default() -> Policy {
        Policy { name: full::ENTRY.name, options: Options::default(), budget: None }
    }
}

impl Policy {
    /// Reads `--policy NAME[:key=value,...]` with `--budget`, resolved against a stream
    /// of `context` tokens.
    pub fn parse(spec: &str, budget: Option<Budget>, context: i64) -> Result<Policy> {
        let (name, settings) = spec.split_once(':').unwrap_or((spec, ""));
        let entry = POLICIES.iter().find(|e| e.name == name).ok_or_else(|| {
            let known: Vec<&str> = POLICIES.iter().map(|e| e.name).collect();
            LetheError::Invalid(format!("--policy {name}: unknown; known policies: {}", known.join(", ")))
        })?;
        let options = parse_options(entry, settings)?;
        let budget = match (entry.budgeted, budget) {
            (false, None) => None,
            (false, Some(_)) => {
                return Err(LetheError::Invalid(format!(
                    "--budget: --policy {name} keeps every entry; a budget needs another policy"
                )))
            }
            (true, None) => {
                return Err(LetheError::Invalid(format!("--policy {name} needs --budget (entries or a fraction)")))
            }
            (true, Some(b)) => Some(b.entries(context)?),
        };
        if let Some(b) = budget {
            (entry.check)(b, &options).map_err(|why| LetheError::Invalid(format!("--policy {spec}: {why}")))?;
        }
        Ok(Policy { name: entry.name, options, budget })
    }

    /// A fresh policy for one layer.
    pub fn layer(&self) -> Box<dyn LayerPolicy> {
        let entry = POLICIES.iter().find(|e| e.name == self.name).unwrap_or(&full::ENTRY);
        (entry.build)(self.budget.unwrap_or(i64::MAX), &self.options)
    }
}

/// `key=value,...` checked against the policy's settings.
fn parse_options(entry: &Entry, settings: &str) -> Result<Options> {
    let mut out = Vec::new();
    for pair in settings.split(',').filter(|p| !p.is_empty()) {
        let bad = |why: String| LetheError::Invalid(format!("--policy {}:{settings}: {why}", entry.name));
        let (key, value) = pair.split_once('=').ok_or_else(|| bad(format!("`{pair}` is not key=value")))?;
        if !entry.options.iter().any(|(k, _, _)| *k == key) {
            let known: Vec<&str> = entry.options.iter().map(|o| o.0).collect();
            let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            return Err(bad(format!("`{key}` is not a setting of {}; its settings: {known}", entry.name)));
        }
        let value: f64 = value.parse().map_err(|_| bad(format!("{key} = `{value}` is not a number")))?;
        out.push((key.to_string(), value));
    }
    Ok(Options(out))
}

/// The `m` entries of highest `scores` `(b, kv_heads, n)` in each row, ascending.
pub fn top(scores: &Tensor, m: i64) -> Tensor {
    let (_, indices) = scores.topk(m, -1, true, true);
    indices.sort(-1, false).0
}

/// `weights` `(b, heads, t, n)` summed over the queries and over the heads that share a
/// key-value head: `(b, kv_heads, n)`.
pub fn per_kv_head(weights: &Tensor, kv_heads: i64) -> Tensor {
    weights.unflatten(1, [kv_heads, -1]).sum_dim_intlist([2i64, 3].as_slice(), false, Kind::Float)
}
