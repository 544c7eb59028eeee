//! Expire-Span (Sukhbaatar et al., 2021) fitted onto a pretrained decoder by `lethe
//! train` (`memory.mechanism = "expire"`, `model.arch = "llama"`), read through the
//! decoding path: the run's span predictors act on the key-value cache.
//!
//! - Each entry gets its span when it is written, `e = L sigmoid((w·x + b) / pre_div)`
//!   (Eq. 3; `x` the layer's normed input, `L = memory.span`), capped at
//!   `memory.expire.inference_cap` when one is set; one span a layer, or one per
//!   key-value head (`memory.expire.per_head`).
//! - A query at `t` weighs the entry written at `i` by the soft mask
//!   `m = clamp(1 + (e - (t - i)) / R, 0, 1)` (Eq. 5), as `ln m` on its score (Eq. 4, one
//!   softmax with the renormalisation folded in, as the training model computes it).
//! - After each chunk an entry is deleted once the next query would mask it fully,
//!   `e + R - (t_next - i) <= 0` (its largest span, per key-value head), and under
//!   `memory.expire.budget = B` at most `B` are kept, those with the least remaining span
//!   deleted first.
//!
//! Without a budget this is the function the training model computes in blocks of any
//! length (a masked entry and a deleted one weigh nothing); with one, the function of
//! blocks of the chunks read here (the cap applies after each). Every key-value head
//! keeps the same entries. Where the streams of a batch keep different numbers, the
//! shorter ones keep entries already expired, masked for good, so that the cache stays
//! one tensor.

use std::collections::HashMap;

use tch::{Kind, Tensor};

use super::{forked, saved, sized, top, Chunk, Held, LayerPolicy};
use crate::memory::expire::{soft_mask, spans_of_scores, within_budget};
use lethe_core::config::{Arch, Config, ExpireConfig, Mechanism};
use lethe_core::error::{LetheError, Result};

/// One layer's Expire-Span over a key-value cache: its predictor and the spans of the
/// entries held.
pub struct ExpireLayer {
    /// `(d)`, or `(d, g)` per key-value head.
    w: Tensor,
    /// `(1)`, or `(g)`.
    b: Tensor,
    max_span: f64,
    cfg: ExpireConfig,
    /// The spans of the entries held, `(b, 1 or g, n)`, in the order of [`Held`].
    spans: Option<Tensor>,
    /// Where each entry held stops being seen, `(b, n)`, float64: its largest span plus
    /// the ramp, `e + R` in float32 as the training model rounds it, plus the position it
    /// was written at (exact in float64). The next query deletes it when it is past.
    expiry: Option<Tensor>,
}

/// A span no query reaches: an entry kept only to keep the streams' caches one length.
const EXPIRED: f64 = -1e9;

impl ExpireLayer {
    /// A layer's policy from its predictor `w` `(d)` or `(d, g)` and `b`, at the largest
    /// span `max_span`, with the run's Expire-Span settings; on the predictor's device.
    pub fn new(w: Tensor, b: Tensor, max_span: f64, cfg: &ExpireConfig) -> ExpireLayer {
        let float = |t: Tensor| t.detach().to_kind(Kind::Float);
        ExpireLayer { w: float(w), b: float(b), max_span, cfg: cfg.clone(), spans: None, expiry: None }
    }

    /// The spans `(b, 1 or g, t)` of entries written from `x` `(b, t, d)`.
    fn spans_of(&self, x: &Tensor) -> Tensor {
        let scores = x.to_kind(Kind::Float).matmul(&self.w); // in float32 whatever the model's precision
        let spans = spans_of_scores(&scores, &self.b, self.max_span, &self.cfg); // (b, t) or (b, g, t)
        let spans = match spans.dim() {
            3 => spans,
            _ => spans.unsqueeze(1),
        };
        match self.cfg.inference_cap {
            0 => spans,
            cap => spans.clamp_max(cap as f64),
        }
    }

    /// Each entry's distance to the queries at `positions` `(t)`: `(b, 1, t, n)`.
    fn distances(held: &Held, positions: &Tensor) -> Tensor {
        let written = held.positions.narrow(1, 0, 1).unsqueeze(2).to_kind(Kind::Float); // (b, 1, 1, n)
        positions.to_kind(Kind::Float).view([1, 1, -1, 1]) - written
    }

    /// The expiry `(b, t)` of entries with spans `spans` `(b, 1 or g, t)` written at
    /// `positions` `(t)`.
    fn expiry_of(&self, spans: &Tensor, positions: &Tensor) -> Tensor {
        let reach = spans.amax([1i64].as_slice(), false) + self.cfg.ramp as f64; // (b, t), float32
        reach.to_kind(Kind::Double) + positions.to_kind(Kind::Double).unsqueeze(0)
    }
}

/// `(old, fresh)` joined along `dim`, or `fresh` alone.
fn joined(old: Option<Tensor>, fresh: Tensor, dim: i64) -> Tensor {
    match old {
        Some(old) => Tensor::cat(&[&old, &fresh], dim),
        None => fresh,
    }
}

impl LayerPolicy for ExpireLayer {
    fn fork(&self) -> Box<dyn LayerPolicy> {
        Box::new(ExpireLayer {
            w: self.w.shallow_clone(), // the run's weights, never written to
            b: self.b.shallow_clone(),
            max_span: self.max_span,
            cfg: self.cfg.clone(),
            spans: forked(&self.spans),
            expiry: forked(&self.expiry),
        })
    }

    fn state(&self) -> Vec<(&'static str, Tensor)> {
        let spans = self.spans.iter().map(|t| ("spans", t.shallow_clone()));
        spans.chain(self.expiry.iter().map(|t| ("expiry", t.shallow_clone()))).collect()
    }

    fn restore(&mut self, state: Vec<(String, Tensor)>) -> std::result::Result<(), String> {
        for (name, t) in state {
            match name.as_str() {
                "spans" => self.spans = Some(saved(&name, t, 3, Kind::Float)?),
                "expiry" => self.expiry = Some(saved(&name, t, 2, Kind::Double)?),
                _ => return Err(format!("`{name}`: Expire-Span keeps spans and expiry")),
            }
        }
        match (&self.spans, &self.expiry) {
            (Some(_), None) | (None, Some(_)) => Err("`spans` and `expiry` go together".into()),
            _ => Ok(()),
        }
    }

    fn fits(&self, held: Option<&Held>) -> std::result::Result<(), String> {
        let Some(held) = held else { return sized("spans", self.spans.as_ref(), None) };
        let (b, n) = (held.keys.size()[0], held.len());
        let g = if self.w.dim() == 2 { self.w.size()[1] } else { 1 };
        match self.spans.as_ref() {
            None => Err("`spans`: missing, where the layer holds entries".into()),
            Some(spans) => sized("spans", Some(spans), Some(&[b, g, n])),
        }?;
        sized("expiry", self.expiry.as_ref(), Some(&[b, n]))
    }

    fn bias(&mut self, x: &Tensor, held: &Held, query_positions: &Tensor) -> Option<Tensor> {
        let fresh = self.spans_of(x);
        let expiry = joined(self.expiry.take(), self.expiry_of(&fresh, query_positions), 1);
        let spans = joined(self.spans.take(), fresh, 2); // (b, 1 or g, n)
        let dist = Self::distances(held, query_positions); // (b, 1, t, n)
        let mask = soft_mask(&(spans.unsqueeze(2) - &dist), self.cfg.ramp as f64); // (b, 1 or g, t, n)

        // One query sees every entry held up to its own: `ln m`, minus infinity where the
        // mask is 0. A chunk's queries do not see the entries written after them.
        let bias = match query_positions.size()[0] {
            1 => mask.log(),
            _ => crate::attention::log_mask_of_visible(&mask, &dist.ge(0.0).logical_and(&mask.gt(0.0))),
        };
        (self.spans, self.expiry) = (Some(spans), Some(expiry));
        Some(bias)
    }

    fn update(&mut self, held: &mut Held, chunk: &Chunk) {
        let (Some(spans), Some(expiry)) = (self.spans.take(), self.expiry.take()) else { return };
        let t = chunk.query_positions.size()[0];
        let next = chunk.query_positions.int64_value(&[t - 1]) + 1;
        let remaining = &expiry - next as f64; // (b, n), the span left at the next query
        let alive = remaining.gt(0.0);
        let kept = match self.cfg.budget as i64 {
            0 => alive,
            budget => within_budget(&alive, &remaining.to_kind(Kind::Float), budget),
        };
        if kept.all().int64_value(&[]) == 1 {
            (self.spans, self.expiry) = (Some(spans), Some(expiry));
            return;
        }
        let indices = kept_in_order(&kept); // (b, m)
        let (g, kv_heads) = (spans.size()[1], held.positions.size()[1]);
        let kept_spans = spans.gather(2, &indices.unsqueeze(1).expand([-1, g, -1], false), false);
        let alive = kept.gather(1, &indices, false); // (b, m)
        self.spans = Some(kept_spans.where_scalarother(&alive.unsqueeze(1), EXPIRED));
        self.expiry = Some(expiry.gather(1, &indices, false).where_scalarother(&alive, EXPIRED));
        held.keep(&indices.unsqueeze(1).expand([-1, kv_heads, -1], false).contiguous());
    }
}

/// The entries `(b, m)` each stream keeps of those `kept` `(b, n)`, in the order written:
/// its kept ones, and where it keeps fewer than the stream that keeps most (`m`), the
/// latest of the rest, expired for good, so that the streams' caches stay one length.
fn kept_in_order(kept: &Tensor) -> Tensor {
    let (b, n) = kept.size2().expect("(b, n)");
    if b == 1 {
        return kept.view([-1]).nonzero().view([1, -1]);
    }
    let m = kept.sum_dim_intlist([1i64].as_slice(), false, Kind::Int64).max().int64_value(&[]);
    let order = Tensor::arange(n, (Kind::Float, kept.device())) / n as f64;
    let rank = kept.to_kind(Kind::Float) * 2.0 + order; // (b, n)
    top(&rank.unsqueeze(1), m).squeeze_dim(1)
}

/// The layers' policies of a run with Expire-Span on a Llama-family decoder, from its
/// config and parameters (`layers.<i>.attn.expire.w` and `.b`): one a layer, for
/// [`crate::llama::KvCache::with_layers`].
pub fn layers(cfg: &Config, params: &HashMap<String, Tensor>) -> Result<Vec<Box<dyn LayerPolicy>>> {
    if cfg.memory.mechanism != Mechanism::Expire || cfg.model.arch != Arch::Llama {
        return Err(LetheError::Invalid(format!(
            "the decoding path reads Expire-Span on a Llama-family model; the run has memory.mechanism = \"{}\" on model.arch = \"{}\"",
            cfg.memory.mechanism.name(),
            cfg.model.arch.name()
        )));
    }
    (0..cfg.model.layers)
        .map(|i| {
            let get = |name: &str| {
                let key = format!("layers.{i}.attn.expire.{name}");
                params.get(&key).map(Tensor::shallow_clone).ok_or_else(|| {
                    LetheError::Invalid(format!("the run has no parameter `{key}`: not an Expire-Span run"))
                })
            };
            let layer = ExpireLayer::new(get("w")?, get("b")?, cfg.memory.span as f64, &cfg.memory.expire);
            Ok(Box::new(layer) as Box<dyn LayerPolicy>)
        })
        .collect()
}
