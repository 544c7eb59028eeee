//! Compressive Transformer (Rae et al., 2020, "Compressive Transformers for Long-Range
//! Sequence Modelling"; Expire-Span paper, section 5 baselines; ∞-former paper, 4.1;
//! docs/design/algorithms.md, Baselines).
//!
//! Each layer keeps two memories: the last `L` states uncompressed (as Transformer-XL),
//! and a compressed memory of at most `C` slots. States that leave the uncompressed
//! memory are compressed `c` to one, `f_c: R^{c x d} -> R^d`, and appended to the
//! compressed memory, which keeps its newest `C` slots. A query attends to
//! `[compressed, memory, block]`, so it reaches `L + c C` tokens back with `L + C` slots.
//!
//! - `pool` (the Expire-Span paper's baseline, "the mean-pooling version"): `f_c` is the
//!   mean of `c` consecutive states.
//! - `conv` (the ∞-former paper's baseline): `f_c` is a 1-D convolution of kernel and
//!   stride `c`, trained only by the attention-reconstruction loss
//!   `|| attn(h, old) - attn(h, f_c(old)) ||^2` (Rae et al., Algorithm 2), where `h` is
//!   the block's layer input, `old` the states compressed after this block, and `attn`
//!   content attention with the layer's projections detached. The compressed memory is
//!   detached like every memory, so the task loss never reaches `f_c`.
//!
//! States leave the memory a block at a time; when their number is not a multiple of
//! `c`, the remainder waits (uncompressed, not attended to) for the next block's states,
//! so every slot pools exactly `c` consecutive states.
//!
//! Positions: the uncompressed part uses the shared `key_pe` by distance, as
//! Transformer-XL. A compressed slot gets a learned key embedding by its age rank
//! (0 = the newest slot), `q · pe_c[rank]`, a positional bias as the ∞-former paper used
//! for its compressive baseline (its footnote 8).

use tch::{nn, Tensor};

use super::descriptor::{split, whole_block, Descriptor, LayerShape};
use super::layer::{AttendInput, AttendOutput, Carry, MemoryLayer, MemoryReport};
use super::window::{concat_time, keep_last, reach, window_mem_size, Chunk, Joined, WindowCache};
use crate::attention::{mix, scores_over_window};
use crate::undrawn::var;
use lethe_core::config::{CompressiveConfig, Compressor, Config, MemoryConfig};
use lethe_core::error::{LetheError, Result};

/// The Compressive Transformer's [`Descriptor`]: a window and compressed slots, half
/// the size each in a sweep; full once the slots have covered `rate x slots` tokens.
pub struct Compressive;

impl Descriptor for Compressive {
    fn build(&self, cfg: &MemoryConfig, p: nn::Path, shape: LayerShape) -> Result<Box<dyn MemoryLayer>> {
        Ok(Box::new(CompressiveMemory::new(p, shape.d_model, shape.heads, cfg.span, &cfg.compressive)))
    }

    fn colour(&self) -> (u8, u8, u8) {
        (148, 103, 189)
    }

    fn set_size(&self, cfg: &mut Config, size: usize) {
        (cfg.memory.span, cfg.memory.compressive.slots) = split(cfg, size);
    }

    fn size(&self, cfg: &Config) -> usize {
        cfg.memory.span + cfg.memory.compressive.slots
    }

    fn reach(&self, cfg: &Config) -> usize {
        cfg.memory.span + cfg.memory.compressive.rate * cfg.memory.compressive.slots
    }

    fn scored_chunks(&self, cfg: &Config, held: i64) -> Vec<Chunk> {
        whole_block(cfg, held)
    }

    fn reads_whole_blocks(&self) -> bool {
        true
    }
}

/// Mean of every `rate` consecutive states: `(b, g·rate, d)` -> `(b, g, d)`.
pub fn mean_pool(states: &Tensor, rate: i64) -> Tensor {
    let (b, n, d) = states.size3().expect("states must be (b, n, d)");
    states.view([b, n / rate, rate, d]).mean_dim([2i64].as_slice(), false, states.kind())
    // (b, g, d)
}

/// One layer's Compressive Transformer memory.
pub struct CompressiveMemory {
    cfg: CompressiveConfig,
    span: i64,
    /// Key embeddings of the compressed slots by age rank: `(C, dh)`.
    slot_pe: Tensor,
    /// The convolution's weight `(d, d, c)` and bias `(d)`, for `conv`.
    conv: Option<(Tensor, Tensor)>,
    window: WindowCache,
    /// States that left the window but do not yet fill a group of `c`: `(b, p, d)`, `p < c`.
    pending: Option<Tensor>,
    /// Compressed slots, oldest first: `(b, n, d)`, `n <= C`.
    compressed: Option<Tensor>,
    last_mem_size: f64,
    last_recon: Option<Tensor>,
}

impl CompressiveMemory {
    /// Creates the slot position embeddings (and the convolution, for `conv`) under
    /// `p / "compressive"`.
    pub fn new(p: nn::Path, d_model: i64, heads: i64, span: usize, cfg: &CompressiveConfig) -> Self {
        let p = p / "compressive";
        let d_head = d_model / heads;
        let std = 1.0 / (d_head as f64).sqrt();
        let slot_pe = var(&p, "slot_pe", &[cfg.slots as i64, d_head], nn::Init::Randn { mean: 0.0, stdev: std });
        let conv = (cfg.compressor == Compressor::Conv).then(|| {
            let c = cfg.rate as i64;
            let bound = 1.0 / ((d_model * c) as f64).sqrt();
            let uniform = nn::Init::Uniform { lo: -bound, up: bound };
            (var(&p, "conv_w", &[d_model, d_model, c], uniform), var(&p, "conv_b", &[d_model], uniform))
        });
        CompressiveMemory {
            cfg: cfg.clone(),
            span: span as i64,
            slot_pe,
            conv,
            window: WindowCache::default(),
            pending: None,
            compressed: None,
            last_mem_size: 0.0,
            last_recon: None,
        }
    }

    fn rate(&self) -> i64 {
        self.cfg.rate as i64
    }

    /// `f_c`: `(b, g·c, d)` -> `(b, g, d)`.
    pub fn compress(&self, states: &Tensor) -> Tensor {
        match &self.conv {
            None => mean_pool(states, self.rate()),
            Some((w, b)) => {
                let x = states.transpose(1, 2); // (b, d, g·c)
                x.conv1d(w, Some(b), [self.rate()], [0], [1], 1).transpose(1, 2)
                // (b, g, d)
            }
        }
    }

    /// Splits `pending ++ leaving` into whole groups of `c` (to compress) and the rest.
    fn groups(&self, leaving: Option<Tensor>) -> (Option<Tensor>, Option<Tensor>) {
        let all = match (&self.pending, leaving) {
            (_, Some(l)) => concat_time(self.pending.as_ref(), &l),
            (Some(p), None) => p.shallow_clone(),
            (None, None) => return (None, None),
        };
        let n = all.size()[1];
        let whole = n / self.rate() * self.rate();
        let groups = (whole > 0).then(|| all.narrow(1, 0, whole));
        let rest = (whole < n).then(|| all.narrow(1, whole, n - whole));
        (groups, rest)
    }

    /// Scores, values and visibility of the compressed slots for queries `q`, prepended
    /// to those of the window.
    fn with_slots(&self, input: &AttendInput, v: Tensor, scores: Tensor) -> (Tensor, Tensor) {
        let Some(c) = &self.compressed else { return (scores, v) };
        let n = c.size()[1];
        let (kc, vc) = input.attn.keys_values(c); // (b, h, n, dh)
        let pe = self.slot_pe.narrow(0, 0, n).flip([0]).to_kind(kc.kind()); // (n, dh), oldest slot first
        let dh = input.q.size()[3] as f64;
        // q·k + q·pe as one product, (q / sqrt(dh))·(k + pe): the sums and the scale on the
        // small operands rather than on the scores.
        let slot_scores = (input.q / dh.sqrt()).matmul(&(kc + pe).transpose(-2, -1)); // (b, h, m, n)

        // Every slot is visible; the window's scores come masked.
        (Tensor::cat(&[slot_scores, scores], -1), Tensor::cat(&[vc, v], 2))
    }

    /// The weighted attention-reconstruction loss for the states this block will
    /// compress, when training a `conv` compressor.
    fn reconstruction_loss(&self, input: &AttendInput) -> Option<Tensor> {
        if self.conv.is_none() || !input.train || self.cfg.recon_coef == 0.0 {
            return None;
        }
        let (old, _) = self.groups(self.window.leaving(input.x, self.span));
        let old = old?.detach();
        let h = input.x.detach();
        let target = input.attn.detached_content_attention(&h, &old);
        let approx = input.attn.detached_content_attention(&h, &self.compress(&old));
        let kind = target.kind();
        Some((target - approx).square().mean(kind) * self.cfg.recon_coef)
    }

    fn slots_held(&self) -> i64 {
        self.compressed.as_ref().map_or(0, |c| c.size()[1])
    }
}

impl MemoryLayer for CompressiveMemory {
    fn name(&self) -> &'static str {
        "compressive"
    }

    fn attend(&mut self, input: &AttendInput) -> Result<AttendOutput> {
        let m = input.x.size()[1];
        let keys = lethe_core::profile::phase("keys, values");
        let w = self.window.keys(input, self.span)?;
        drop(keys);
        let cached = w.cached;
        let window = lethe_core::profile::phase("window scores");
        let scores = scores_over_window(input.q, &w.k, input.key_pe, w.cached, &w.visible)?; // (b, h, m, n)
        drop(window);
        let slots = lethe_core::profile::phase("slots");
        let (scores, v) = self.with_slots(input, w.v, scores);
        drop(slots);
        let attention = lethe_core::profile::phase("attention");
        let context = mix(&scores, &v, input.attn.dropout, input.train);
        drop(attention);
        self.last_mem_size = self.slots_held() as f64 + window_mem_size(cached, m, reach(self.span, m));
        let _reconstruction = lethe_core::profile::phase("reconstruction loss");
        let aux_loss = self.reconstruction_loss(input);
        self.last_recon = aux_loss.as_ref().map(|l| l.detach());
        Ok(AttendOutput { context, aux_loss, added: None, carry: Carry::new(w.joined) })
    }

    fn update(&mut self, x: &Tensor, _episodes: Option<&Tensor>, carry: Carry) -> Result<()> {
        let leaving = self.window.append(x, None, self.span, carry.take::<Joined>());
        let (groups, rest) = self.groups(leaving);
        self.pending = rest;
        let Some(groups) = groups else { return Ok(()) };
        let new = tch::no_grad(|| self.compress(&groups)).detach();
        self.compressed = Some(keep_last(concat_time(self.compressed.as_ref(), &new), self.cfg.slots as i64));
        Ok(())
    }

    fn reset(&mut self) {
        self.window.reset();
        self.pending = None;
        self.compressed = None;
    }

    fn report(&self) -> MemoryReport {
        let pending = self.pending.as_ref().map_or(0, |p| p.size()[1]);
        let mut extra = vec![("compressed".to_string(), self.slots_held() as f64)];
        if let Some(r) = &self.last_recon {
            extra.push(("recon_loss".to_string(), r.double_value(&[])));
        }
        MemoryReport {
            mem_size: self.last_mem_size,
            mem_rows: vec![],
            held: (self.window.len() + pending + self.slots_held()) as usize,
            extra,
            series: vec![],
        }
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = self.window.state();
        out.extend(self.pending.iter().map(|p| ("pending".to_string(), p.shallow_clone())));
        out.extend(self.compressed.iter().map(|c| ("compressed".to_string(), c.shallow_clone())));
        out
    }

    fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.reset();
        let bad = |name: &str, t: &Tensor| {
            LetheError::Invalid(format!("compressive memory: unexpected state `{name}` of shape {:?}", t.size()))
        };
        let mut window = vec![];
        for (name, t) in state {
            match name.as_str() {
                "pending" if t.dim() == 3 && t.size()[1] < self.rate() => self.pending = Some(t.shallow_clone()),
                "compressed" if t.dim() == 3 && t.size()[1] <= self.cfg.slots as i64 => {
                    self.compressed = Some(t.shallow_clone())
                }
                "pending" | "compressed" => return Err(bad(name, t)),
                _ => window.push((name.clone(), t.shallow_clone())),
            }
        }
        self.window.load_state(&window, self.span, "compressive")
    }

    fn fresh(&self) -> Box<dyn MemoryLayer> {
        Box::new(CompressiveMemory {
            cfg: self.cfg.clone(),
            span: self.span,
            slot_pe: self.slot_pe.shallow_clone(),
            conv: self.conv.as_ref().map(|(w, b)| (w.shallow_clone(), b.shallow_clone())),
            window: WindowCache::default(),
            pending: None,
            compressed: None,
            last_mem_size: 0.0,
            last_recon: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    fn memory(span: usize, rate: usize, slots: usize) -> CompressiveMemory {
        let _seed = lethe_core::rng::seed_torch(1);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let cfg = CompressiveConfig { rate, slots, ..CompressiveConfig::default() };
        CompressiveMemory::new(vs.root(), 2, 1, span, &cfg)
    }

    /// A block of `m` states whose features are their positions: `(1, m, 2)`.
    fn block(start: i64, m: i64) -> Tensor {
        Tensor::arange_start(start, start + m, (Kind::Float, tch::Device::Cpu)).view([1, m, 1]).repeat([1, 1, 2])
    }

    fn first_feature(t: &Tensor) -> Vec<f32> {
        t.select(2, 0).flatten(0, -1).try_into().unwrap()
    }

    #[test]
    fn mean_pool_averages_consecutive_groups() {
        let x = Tensor::from_slice(&[1.0f32, 10.0, 3.0, 20.0, 5.0, 0.0, 7.0, 2.0]).view([1, 4, 2]);
        let pooled: Vec<f32> = mean_pool(&x, 2).flatten(0, -1).try_into().unwrap();
        assert_eq!(pooled, vec![2.0, 15.0, 6.0, 1.0]);
    }

    #[test]
    fn the_compressed_memory_keeps_the_last_slots_in_order() {
        // span 6, blocks of 3, rate 2: three states leave per block, so one waits.
        let mut mem = memory(6, 2, 4);
        for t in 0..5 {
            mem.update(&block(3 * t, 3), None, Carry::none()).unwrap();
        }
        // Positions 0..8 left the window: pairs (0,1) (2,3) (4,5) (6,7) pooled, 8 waits.
        assert_eq!(first_feature(mem.compressed.as_ref().unwrap()), vec![0.5, 2.5, 4.5, 6.5]);
        assert_eq!(first_feature(mem.pending.as_ref().unwrap()), vec![8.0]);
        mem.update(&block(15, 3), None, Carry::none()).unwrap();
        // 9..11 left: (8,9) and (10,11) pooled; only the newest 4 slots are kept.
        assert_eq!(first_feature(mem.compressed.as_ref().unwrap()), vec![4.5, 6.5, 8.5, 10.5]);
        assert!(mem.pending.is_none());
        assert_eq!(mem.report().held, 6 + 4);
        mem.reset();
        assert_eq!(mem.report().held, 0);
    }

    #[test]
    fn leaving_predicts_what_append_evicts() {
        let mut mem = memory(5, 2, 4);
        for t in 0..4 {
            let x = block(3 * t, 3);
            let predicted = mem.window.leaving(&x, 5).map(|t| first_feature(&t));
            let evicted = mem.window.append(&x, None, 5, None).map(|t| first_feature(&t));
            assert_eq!(predicted, evicted, "block {t}");
        }
    }
}
