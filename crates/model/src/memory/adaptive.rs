//! Adaptive-Span (Sukhbaatar et al., 2019, "Adaptive Attention Span in Transformers";
//! Expire-Span paper, section 3; docs/design/algorithms.md, Baselines): each head learns a span
//! ratio `z` in [0, 1] and attends only to the last `z L` positions, through a soft
//! mask over distance.
//!
//! - Mask for a key at distance `d` (0 = the query itself):
//!   `m = clamp((z L - d) / R + 1, 0, 1)`, the adaptive-span code's
//!   `clamp((template + z L) / R + 1, 0, 1)` with `template = -d`. It is applied after
//!   the softmax with renormalisation, `a = a m / (sum(a m) + 1e-8)`, computed as one
//!   softmax with the bias `ln m` (`attention::attend`; equal up to the 1e-8).
//! - Span loss `coef * L * mean(z)` over the heads of the layer.
//! - `z` is clamped to [0, 1] after each optimiser step ([`MemoryLayer::after_step`]).
//! - The cache keeps only what the widest head can see: `min(L, max(z) L + R)` states,
//!   rounded up to a multiple of 64 (as the official code trims it).

use tch::{nn, Kind, Tensor};

use super::descriptor::{Descriptor, LayerShape};
use super::layer::{AttendInput, AttendOutput, Carry, MemoryLayer, MemoryReport};
use super::window::{cat_chunks, chunk_keys, chunk_queries, query_chunks, Chunk, Joined, WindowCache, QUERY_CHUNK};
use crate::attention::{attend, log_mask, part, window_bias};
use crate::chunks::narrows;
use lethe_core::config::{AdaptiveConfig, Config, MemoryConfig};
use lethe_core::error::{LetheError, Result};

/// Adaptive-Span's [`Descriptor`]: a window of `L`, whose chunks are counted over the
/// whole cache (the heads' spans are not known in advance; an upper bound).
pub struct Adaptive;

impl Descriptor for Adaptive {
    fn build(&self, cfg: &MemoryConfig, p: nn::Path, shape: LayerShape) -> Result<Box<dyn MemoryLayer>> {
        Ok(Box::new(AdaptiveSpan::new(p, shape.heads, cfg.span, &cfg.adaptive)))
    }

    fn colour(&self) -> (u8, u8, u8) {
        (44, 160, 44)
    }

    fn scored_chunks(&self, cfg: &Config, held: i64) -> Vec<Chunk> {
        let m = cfg.train.block as i64;
        query_chunks(held, m, held.min(cfg.memory.span as i64), QUERY_CHUNK)
    }
}

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
        AdaptiveSpan {
            cfg: cfg.clone(),
            max_span: max_span as i64,
            z,
            window: WindowCache::default(),
            last_mem_rows: vec![],
        }
    }

    /// How far back the widest head sees: the mask is 0 from `z L + R` on.
    fn reach(&self) -> i64 {
        let widest = self.ratios().into_iter().fold(0.0, f64::max).clamp(0.0, 1.0);
        (widest * self.max_span as f64).ceil() as i64 + self.cfg.ramp as i64
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
        let w = self.window.keys(input, self.max_span)?;
        let key_pe = input.key_pe.ok_or_else(|| {
            LetheError::Invalid("Adaptive-Span needs relative positions (model.arch = \"lethe\")".into())
        })?;
        let z = self.z.to_kind(input.q.kind());
        let mask = span_mask(&z, &w.dist, self.max_span as f64, self.cfg.ramp as f64).unsqueeze(0); // (1, h, m, n)

        // Keys of other episodes are not visible, so that the softmax's normalisation is a fresh memory's.
        let visible = match &w.same {
            Some(same) => w.visible.logical_and(same).unsqueeze(1), // (b, 1, m, n)
            None => w.visible.view([1, 1, w.visible.size()[0], w.visible.size()[1]]),
        };
        // The spans are read from the device only where the block goes in chunks.
        let reach = if input.q.device().is_cuda() { self.max_span } else { self.reach().min(self.max_span) };
        let chunks = w.chunks(input.q, reach);
        let (qs, ks, vs) = (chunk_queries(input.q, &chunks)?, chunk_keys(&w.k, &chunks)?, chunk_keys(&w.v, &chunks)?);
        // The mask's rows of each chunk `(1, h, queries, n)` in one node, then its keys.
        let mask_rows = narrows(&mask, 2, &chunks.iter().map(|c| (c.q0, c.queries)).collect::<Vec<_>>())?;
        let contexts: Vec<Tensor> = chunks
            .iter()
            .zip(qs.iter().zip(ks.iter().zip(&vs)))
            .zip(&mask_rows)
            .map(|((c, (q, (k, v))), rows)| {
                // q (b, h, queries, dh); k, v (b, h, keys, dh)
                let positions = window_bias(q, Some(key_pe), c.cached(), &c.of(&w.visible))?; // (b, h, queries, keys)

                // The mask after the softmax with renormalisation is the bias ln m before it.
                let bias = positions + log_mask(&part(rows, -1, c.k0, c.keys), &c.of(&visible)); // (b, h, queries, keys)
                Ok(attend(q, k, v, &bias, input.attn.dropout, input.train))
            })
            .collect::<Result<_>>()?;
        let context = cat_chunks(contexts); // (b, h, m, dh)
        let earlier = mask.gt(0.0).logical_and(&visible).logical_and(&w.dist.ge(1));
        self.last_mem_rows = super::layer::mem_rows(&earlier); // from (b or 1, h, m, n)
        let aux = (input.train && self.cfg.loss_coef > 0.0)
            .then(|| z.mean(z.kind()) * (self.cfg.loss_coef * self.max_span as f64));
        Ok(AttendOutput { context, aux_loss: aux, added: None, carry: Carry::new(w.joined) })
    }

    fn update(&mut self, x: &Tensor, episodes: Option<&Tensor>, carry: Carry) -> Result<()> {
        let max_ratio = self.ratios().into_iter().fold(0.0, f64::max);
        let keep = cache_size(max_ratio, self.max_span, self.cfg.ramp as i64);
        self.window.append(x, episodes, keep, carry.take::<Joined>());
        Ok(())
    }

    fn reset(&mut self) {
        self.window.reset();
    }

    fn report(&self) -> MemoryReport {
        let spans: Vec<f64> = self.ratios().iter().map(|z| z * self.max_span as f64).collect();
        let mean = lethe_core::metrics::mean(&spans);
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
    use crate::attention::window;

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

    /// The one-softmax attention with the bias `ln m` equals the mask applied after the
    /// softmax with renormalisation (the adaptive-span code's, less its 1e-8, which
    /// moves the output by up to 1e-8 over the masked weights' sum: 2e-7 here), in value
    /// and in the gradients to the inputs, positions and span ratios.
    #[test]
    fn the_biased_softmax_equals_the_renormalised_mask() {
        // Spans of 1.3 and 2.7 of L = 10 over blocks of 4: one chunk a block.
        biased_softmax_equals_renormalised_mask(10, 4, [0.13, 0.27]);
    }

    /// The same, over blocks of 150 that attend in chunks (spans 7.8 and 16.2 of 60, so
    /// each chunk of 64 queries sees 64 + 20 keys of up to 210).
    #[test]
    fn chunked_attention_equals_the_renormalised_mask() {
        biased_softmax_equals_renormalised_mask(60, 150, [0.13, 0.27]);
    }

    fn biased_softmax_equals_renormalised_mask(max_span: i64, m: i64, ratios: [f64; 2]) {
        use crate::attention::{window_scores, Attention};
        use crate::memory::window::WindowKeys;
        let mut rng = lethe_core::rng::Rng::new(7);
        let mut vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let attn = Attention::new(vs.root() / "attn", 8, 2, 0.0, false);
        let cfg = AdaptiveConfig { ramp: 3, ..AdaptiveConfig::default() };
        let mut layer = AdaptiveSpan::new(vs.root() / "attn", 2, max_span as usize, &cfg);
        vs.double();
        // Spans with a fraction: no key sits exactly where the mask reaches 0, the kink
        // where the two choose different one-sided derivatives (the clamp passes a
        // gradient at its bound; a key at -inf passes none).
        tch::no_grad(|| layer.z.copy_(&Tensor::from_slice(&ratios)));
        let key_pe = rng.normal_tensor(&[max_span + 1, 4], Kind::Double).set_requires_grad(true);
        for block in 0..3 {
            let x = rng.normal_tensor(&[2, m, 8], Kind::Double).set_requires_grad(true);
            let q = attn.queries(&x);
            let input = AttendInput {
                x: &x,
                q: &q,
                attn: &attn,
                key_pe: Some(&key_pe),
                train: true,
                episodes: None,
                norm: None,
            };
            // The reference, from the same cache, before `attend` adds to it.
            let keys = layer.window.keys(&input, max_span).unwrap();
            let chunks = keys.chunks(&q, layer.reach()).len();
            assert!(if m > 64 { chunks > 1 } else { chunks == 1 }, "block {block}: {chunks} chunks");
            let WindowKeys { k, v, dist, visible, cached, .. } = keys;
            let scores = window_scores(&q, &k, &key_pe, cached).unwrap();
            let mask = (span_mask(&layer.z, &dist, max_span as f64, 3.0) * visible.to_kind(Kind::Double)).unsqueeze(0);
            let probs = scores.softmax(-1, Kind::Double) * &mask;
            let reference = (&probs / probs.sum_dim_intlist([-1i64].as_slice(), true, Kind::Double)).matmul(&v);
            let out = layer.attend(&input).unwrap().context;
            let gap = (&out - &reference).abs().max().double_value(&[]);
            assert!(gap < 1e-12, "block {block}: outputs differ by {gap}");
            let w = rng.normal_tensor(&out.size(), Kind::Double);
            let inputs = [&x, &key_pe, &layer.z];
            // The queries' graph is shared by both: keep it for the second pass.
            let g1 = Tensor::run_backward(&[(&out * &w).sum(Kind::Double)], &inputs, true, false);
            let g2 = Tensor::run_backward(&[(&reference * &w).sum(Kind::Double)], &inputs, false, false);
            for (i, (a, b)) in g1.iter().zip(&g2).enumerate() {
                let gap = (a - b).abs().max().double_value(&[]);
                assert!(
                    gap < 1e-10 && a.abs().sum(Kind::Double).double_value(&[]) > 0.0,
                    "block {block}, input {i}: gradients differ by {gap}"
                );
            }
            layer.update(&x.detach(), None, Carry::none()).unwrap();
        }
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
