//! Adaptive-Span (Sukhbaatar et al., 2019, "Adaptive Attention Span in Transformers";
//! Expire-Span paper, section 3; ALGORITHMS.md, baselines): each head learns a span
//! ratio `z` in [0, 1] and attends only to the last `z L` positions, through a soft
//! mask over distance.
//!
//! - Mask for a key at distance `d` (0 = the query itself):
//!   `m = clamp((z L - d) / R + 1, 0, 1)`, the adaptive-span code's
//!   `clamp((template + z L) / R + 1, 0, 1)` with `template = -d`. It is applied after
//!   the softmax with renormalisation, `a = a m / (sum(a m) + 1e-8)`.
//! - Span loss `coef * L * mean(z)` over the heads of the layer.
//! - `z` is clamped to [0, 1] after each optimiser step ([`MemoryLayer::after_step`]).
//! - The cache keeps only what the widest head can see: `min(L, max(z) L + R)` states,
//!   rounded up to a multiple of 64 (as the official code trims it).

use tch::{nn, Kind, Tensor};

use super::window::{WindowCache, WindowKeys};
use super::layer::{AttendInput, AttendOutput, MemoryLayer, MemoryReport};
use crate::config::AdaptiveConfig;
use crate::error::{LetheError, Result};
use crate::model::attention::window_scores;

/// Granularity of the cache trim, as in the official code.
const TRIM_MULTIPLE: i64 = 64;

/// The soft mask per head: `z` `(h)`, `dist` `(m, n)`; returns `(h, m, n)`.
pub fn span_mask(z: &Tensor, dist: &Tensor, max_span: f64, ramp: f64) -> Tensor {
    let reach = z.view([-1, 1, 1]) * max_span; // (h, 1, 1)
    ((reach - dist.to_kind(z.kind()).unsqueeze(0)) / ramp + 1.0).clamp(0.0, 1.0)
}

/// States the cache must keep for span ratios `z`: `min(L, max(z) L + R)`, rounded up
/// to a multiple of 64 (but never above `L`).
pub fn cache_size(max_ratio: f64, max_span: i64, ramp: i64) -> i64 {
    let needed = ((max_ratio.clamp(0.0, 1.0) * max_span as f64).ceil() as i64 + ramp).min(max_span);
    let rounded = (needed + TRIM_MULTIPLE - 1) / TRIM_MULTIPLE * TRIM_MULTIPLE;
    rounded.min(max_span)
}

/// One layer's Adaptive-Span memory.
pub struct AdaptiveSpan {
    cfg: AdaptiveConfig,
    max_span: i64,
    z: Tensor,
    window: WindowCache,
    /// Memory size per stream at the last block.
    last_mem_rows: Vec<f64>,
}

impl AdaptiveSpan {
    /// Creates the span ratios `z` (one per head) under `p / "adaptive"`.
    pub fn new(p: nn::Path, heads: i64, max_span: usize, cfg: &AdaptiveConfig) -> Self {
        let z = (p / "adaptive").var("z", &[heads], nn::Init::Const(cfg.init_ratio));
        AdaptiveSpan { cfg: cfg.clone(), max_span: max_span as i64, z, window: WindowCache::default(), last_mem_rows: vec![] }
    }

    fn ratios(&self) -> Vec<f64> {
        Vec::<f64>::try_from(self.z.detach().to_kind(Kind::Double).to_device(tch::Device::Cpu)).unwrap_or_default()
    }
}

impl MemoryLayer for AdaptiveSpan {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn attend(&mut self, input: &AttendInput) -> Result<AttendOutput> {
        let WindowKeys { k, v, dist, visible, cached, same } = self.window.keys(input, self.max_span);
        let key_pe = input.key_pe.ok_or_else(|| LetheError::Invalid("Adaptive-Span needs relative positions (model.arch = \"lethe\")".into()))?;
        let mut scores = window_scores(input.q, &k, key_pe, cached); // (b, h, m, n)
        let z = self.z.to_kind(scores.kind());
        let mask = span_mask(&z, &dist, self.max_span as f64, self.cfg.ramp as f64) * visible.to_kind(scores.kind()); // (h, m, n)
        let mask = match &same {
            Some(same) => {
                // Other episodes out of the softmax too, so that its normalisation is a fresh memory's.
                let _ = scores.masked_fill_(&same.logical_not().unsqueeze(1), f64::NEG_INFINITY);
                mask.unsqueeze(0) * same.unsqueeze(1).to_kind(scores.kind()) // (b, h, m, n)
            }
            None => mask.unsqueeze(0), // (1, h, m, n)
        };
        let probs = scores.softmax(-1, scores.kind()); // masked: -inf where not visible
        let probs = &probs * &mask; // (b, h, m, n)
        let probs = &probs / (probs.sum_dim_intlist([-1i64].as_slice(), true, probs.kind()) + 1e-8);
        let context = probs.dropout(input.attn.dropout, input.train).matmul(&v); // (b, h, m, dh)
        let earlier = mask.gt(0.0).logical_and(&dist.ge(1));
        self.last_mem_rows = super::layer::mem_rows(&earlier); // from (b or 1, h, m, n)
        let aux = (input.train && self.cfg.loss_coef > 0.0).then(|| z.mean(z.kind()) * (self.cfg.loss_coef * self.max_span as f64));
        Ok(AttendOutput { context, aux_loss: aux, added: None })
    }

    fn update(&mut self, x: &Tensor, episodes: Option<&Tensor>) {
        let max_ratio = self.ratios().into_iter().fold(0.0, f64::max);
        let keep = cache_size(max_ratio, self.max_span, self.cfg.ramp as i64);
        self.window.append(x, episodes, keep);
    }

    fn reset(&mut self) {
        self.window.reset();
    }

    fn report(&self) -> MemoryReport {
        let spans: Vec<f64> = self.ratios().iter().map(|z| z * self.max_span as f64).collect();
        let mean = crate::metrics::mean(&spans);
        let max = spans.iter().copied().fold(0.0, f64::max);
        MemoryReport {
            extra: vec![("mean_span".into(), mean), ("max_span".into(), max)],
            ..MemoryReport::with_rows(self.last_mem_rows.clone(), self.window.len() as usize)
        }
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.window.state()
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.window.load_state(state, self.max_span, "adaptive-span")
    }

    fn fresh(&self) -> Box<dyn MemoryLayer> {
        Box::new(AdaptiveSpan {
            cfg: self.cfg.clone(),
            max_span: self.max_span,
            z: self.z.shallow_clone(),
            window: WindowCache::default(),
            last_mem_rows: vec![],
        })
    }

    fn after_step(&self) {
        let _guard = tch::no_grad_guard();
        let mut z = self.z.shallow_clone();
        let _ = z.clamp_(0.0, 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::window;

    #[test]
    fn the_mask_is_one_within_the_span_and_ramps_to_zero_over_r() {
        // z = 0.5 of L = 8: full up to distance 4, then down over R = 2.
        let (dist, _) = window(8, 1, 8, tch::Device::Cpu); // one query, distances 8..0
        let z = Tensor::from_slice(&[0.5f64, 0.0]);
        let m: Vec<f64> = span_mask(&z, &dist, 8.0, 2.0).flatten(0, -1).try_into().unwrap();
        let head0 = &m[..9]; // keys from distance 8 down to 0
        assert_eq!(head0, &[0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]);
        let head1 = &m[9..]; // z = 0: only the query itself and a ramp of R
        assert_eq!(head1, &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0]);
    }

    #[test]
    fn the_cache_is_trimmed_to_the_widest_head_in_steps_of_64() {
        assert_eq!(cache_size(0.1, 1024, 32), 192); // 103 + 32 = 135 -> 192
        assert_eq!(cache_size(0.0, 1024, 32), 64);
        assert_eq!(cache_size(1.0, 1024, 32), 1024);
        assert_eq!(cache_size(0.5, 100, 8), 64); // 58 -> 64, under L = 100
        assert_eq!(cache_size(0.9, 100, 8), 100); // capped at L
    }
}
