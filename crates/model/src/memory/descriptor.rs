//! One descriptor per mechanism: everything the rest of lethe asks of a mechanism
//! beyond its [`MemoryLayer`](super::MemoryLayer) (how to build it, how a sweep sizes
//! it, what a bench step of it computes, how a plot draws it), answered by the
//! mechanism's own unit. The applications (bench, sweep, plot, generate) query
//! [`describe`] and never match on the mechanism; adding a mechanism is its unit, which
//! implements [`Descriptor`], and one line in [`describe`].

use tch::{nn, Device};

use super::window::{query_chunks, reach, Chunk, QUERY_CHUNK};
use super::MemoryLayer;
use lethe_core::config::{Arch, Config, Mechanism, MemoryConfig};
use lethe_core::error::Result;

/// The shape of the layer a memory serves, as its mechanism is built for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerShape {
    /// The hidden size.
    pub d_model: i64,
    /// Query heads.
    pub heads: i64,
    /// Key-value heads: `heads`, or fewer under grouped queries (a Llama-family layer).
    pub kv_heads: i64,
    /// The training block length.
    pub block: usize,
}

impl LayerShape {
    /// A layer of `heads` heads, each with its own keys and values.
    pub fn new(d_model: i64, heads: i64, block: usize) -> LayerShape {
        LayerShape { d_model, heads, kv_heads: heads, block }
    }
}

/// What a mechanism says about itself. The defaults are a single window of `L =
/// memory.span` states (Transformer-XL's answers); a mechanism overrides what differs.
pub trait Descriptor: Sync {
    /// Builds one layer's memory, its parameters (if any) under `p`, the layer's
    /// attention path (`layers.3.attn`), for a layer of `shape`.
    fn build(&self, cfg: &MemoryConfig, p: nn::Path, shape: LayerShape) -> Result<Box<dyn MemoryLayer>>;

    /// The colour of the mechanism's points and line in plots.
    fn colour(&self) -> (u8, u8, u8);

    /// Sets `cfg` to hold `size` memory slots in all: the size axis of a sweep.
    fn set_size(&self, cfg: &mut Config, size: usize) {
        cfg.memory.span = size;
    }

    /// The size [`Self::set_size`] set, read back from a config.
    fn size(&self, cfg: &Config) -> usize {
        cfg.memory.span
    }

    /// Tokens the memory must have seen to be full (a bench fills it first).
    fn reach(&self, cfg: &Config) -> usize {
        cfg.memory.span
    }

    /// Rows of `key_pe`: distances `0..rows` covered by learned position embeddings.
    fn position_rows(&self, cfg: &MemoryConfig, _block: usize) -> i64 {
        cfg.span as i64 + 1
    }

    /// The chunks in which a block's queries score their keys on the CPU when `held`
    /// states are held (for a step's FLOP count); a GPU scores every key in one chunk.
    /// A window of `L` states by default; without learned relative positions (GPT-2, Llama) a query
    /// sees its whole block whatever the span.
    fn scored_chunks(&self, cfg: &Config, held: i64) -> Vec<Chunk> {
        let (m, span) = (cfg.train.block as i64, cfg.memory.span as i64);
        let reach = if cfg.model.arch == Arch::Lethe { span } else { reach(span, m) };
        query_chunks(held, m, reach, QUERY_CHUNK)
    }

    /// Whether every chunk scores all the position rows (rather than those its keys
    /// reach) before gathering from them.
    fn scores_every_position_row(&self) -> bool {
        false
    }

    /// Whether a step's products run over each stream's own kept memories (the
    /// report's `kept`) rather than the padded cache, on `device` under `cfg`.
    fn ragged_keys(&self, _cfg: &Config, _device: Device) -> bool {
        false
    }

    /// Matrix-product FLOPs of one forward pass of a layer's memory beyond its attention
    /// over the held states, per stream and block of `m` queries of width `d`.
    fn memory_flops(&self, _cfg: &Config, _m: f64, _d: f64) -> f64 {
        0.0
    }

    /// Whether the memory was trained to read a block whole before it takes it in, so
    /// that generation re-reads the current block with each new token.
    fn reads_whole_blocks(&self) -> bool {
        false
    }
}

/// The registry: the descriptor of each mechanism.
pub fn describe(mechanism: Mechanism) -> &'static dyn Descriptor {
    match mechanism {
        Mechanism::Fixed => &super::fixed::Fixed,
        Mechanism::Expire => &super::expire::Expire,
        Mechanism::Adaptive => &super::adaptive::Adaptive,
        Mechanism::Compressive => &super::compressive::Compressive,
        Mechanism::Infinity => &super::infinity::Infinity,
    }
}

/// A block's chunks when one chunk of `m` queries sees every held key (and a GPU's).
pub fn whole_block(cfg: &Config, held: i64) -> Vec<Chunk> {
    let m = cfg.train.block as i64;
    vec![Chunk { q0: 0, queries: m, k0: 0, keys: held + m }]
}

/// A two-memory mechanism's split of `size` slots: half (at least a block) the recent
/// window, the rest its second memory.
pub fn split(cfg: &Config, size: usize) -> (usize, usize) {
    let window = (size / 2).max(cfg.train.block);
    (window, size.saturating_sub(window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mechanism_has_a_descriptor_of_its_own_colour() {
        let colours: Vec<_> = Mechanism::all().iter().map(|&m| describe(m).colour()).collect();
        for (i, c) in colours.iter().enumerate() {
            assert!(!colours[..i].contains(c), "two mechanisms drawn in {c:?}");
        }
    }

    #[test]
    fn a_sweep_size_reads_back_as_it_was_set() {
        for &m in Mechanism::all() {
            let mut cfg = Config::default();
            cfg.memory.mechanism = m;
            let d = describe(m);
            d.set_size(&mut cfg, 128);
            let expected = if m == Mechanism::Infinity {
                // Basis functions come in whole sets of widths.
                let widths = cfg.memory.infinity.widths.len();
                cfg.memory.span + (128 - cfg.memory.span) / widths * widths
            } else {
                128
            };
            assert_eq!(d.size(&cfg), expected, "{m}");
        }
    }
}
