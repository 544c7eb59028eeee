//! Transformer-XL memory with a fixed span (Dai et al., 2019; Expire-Span paper,
//! section 3): `C_t = {t-L, ..., t-1}`. Each layer caches its last `L` input states
//! (detached); keys and values are recomputed from them every block, and a query sees
//! itself and the `L` positions before it, with learned relative positions `key_pe`.
//!
//! lethe lets a query attend to itself (the official adaptive/expire-span code excludes
//! it); with that choice the first block of a stream needs no placeholder memories, so
//! the cache starts empty rather than with `M` zero vectors.

use std::collections::HashMap;

use tch::Tensor;

use super::{AttendInput, AttendOutput, MemoryLayer, MemoryReport};
use crate::error::{LetheError, Result};
use crate::model::attention::{masked_mix, relative_scores, window};

/// A fixed-span cache of the last `span` states.
pub struct FixedSpan {
    span: i64,
    cache: Option<Tensor>,
    /// `(dist, visible)` per `(cached, m)`, built once and reused.
    windows: HashMap<(i64, i64), (Tensor, Tensor)>,
    last_mem_size: f64,
}

impl FixedSpan {
    /// An empty memory of `span` states.
    pub fn new(span: usize) -> Self {
        FixedSpan { span: span as i64, cache: None, windows: HashMap::new(), last_mem_size: 0.0 }
    }

    fn cached_len(&self) -> i64 {
        self.cache.as_ref().map_or(0, |c| c.size()[1])
    }

    fn window(&mut self, cached: i64, m: i64, device: tch::Device) -> &(Tensor, Tensor) {
        let span = self.span;
        self.windows.entry((cached, m)).or_insert_with(|| window(cached, m, span, device))
    }
}

impl MemoryLayer for FixedSpan {
    fn name(&self) -> &'static str {
        "fixed"
    }

    fn attend(&mut self, input: &AttendInput) -> Result<AttendOutput> {
        let m = input.x.size()[1];
        let cached = self.cached_len();
        let states = match &self.cache {
            Some(c) => Tensor::cat(&[c, input.x], 1), // (b, cached + m, d)
            None => input.x.shallow_clone(),
        };
        let (k, v) = input.attn.keys_values(&states); // (b, h, n, dh)
        let (dist, visible) = self.window(cached, m, input.x.device());
        let scores = relative_scores(input.q, &k, input.key_pe, dist); // (b, h, m, n)
        let context = masked_mix(&scores, visible, &v, input.attn.dropout, input.train);
        // Mean over the block's queries of the earlier positions each one sees.
        self.last_mem_size = (0..m).map(|q| (cached + q).min(self.span) as f64).sum::<f64>() / m as f64;
        Ok(AttendOutput { context, aux_loss: None })
    }

    fn update(&mut self, x: &Tensor) {
        self.cache = Some(append_window(self.cache.as_ref(), x, self.span));
    }

    fn reset(&mut self) {
        self.cache = None;
    }

    fn report(&self) -> MemoryReport {
        MemoryReport { mem_size: self.last_mem_size, held: self.cached_len() as usize, extra: vec![] }
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        window_state(self.cache.as_ref())
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.cache = load_window_state(state, self.span, "fixed-span")?;
        Ok(())
    }

    fn fresh(&self) -> Box<dyn MemoryLayer> {
        Box::new(FixedSpan::new(self.span as usize))
    }
}

/// `cache` `(b, c, d)` followed by the block `x` `(b, m, d)`, keeping the last `keep`
/// states: the sliding window shared by the window-based memories.
pub(super) fn append_window(cache: Option<&Tensor>, x: &Tensor, keep: i64) -> Tensor {
    let all = match cache {
        Some(c) => Tensor::cat(&[c, x], 1),
        None => x.shallow_clone(),
    };
    let n = all.size()[1];
    if n > keep {
        all.narrow(1, n - keep, keep).contiguous()
    } else {
        all
    }
}

/// The saved state of a sliding window: its cache, if any.
pub(super) fn window_state(cache: Option<&Tensor>) -> Vec<(String, Tensor)> {
    cache.iter().map(|c| ("cache".to_string(), c.shallow_clone())).collect()
}

/// Restores a sliding window saved by [`window_state`]; at most `max` states.
pub(super) fn load_window_state(state: &[(String, Tensor)], max: i64, what: &str) -> Result<Option<Tensor>> {
    let mut cache = None;
    for (name, t) in state {
        match name.as_str() {
            "cache" if t.dim() == 3 && t.size()[1] <= max => cache = Some(t.shallow_clone()),
            _ => {
                return Err(LetheError::Invalid(format!(
                    "{what} memory: unexpected state `{name}` of shape {:?}",
                    t.size()
                )))
            }
        }
    }
    Ok(cache)
}
