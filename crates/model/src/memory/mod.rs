//! How a layer remembers: the interface every mechanism implements ([`layer`]), the
//! mechanisms, one file each with its [`Descriptor`], and [`describe`], the one place
//! that maps a config's `memory.mechanism` to its unit.
//!
//! - [`fixed`]: Transformer-XL, the last `L` states;
//! - [`adaptive`]: Adaptive-Span, a learned span per head;
//! - [`expire`]: Expire-Span, a learned span per memory, expired memories deleted;
//!   [`expire_fused`] its attention scores from one CPU kernel, [`expire_bias`] its
//!   attention bias from the GPU's kernels, [`compact`] the compaction of its cache;
//! - [`compressive`]: the Compressive Transformer, old states compressed into slots;
//! - [`infinity`]: the ∞-former, an unbounded continuous long-term memory;
//! - [`window`]: the sliding-window cache the window-based ones share.

pub mod adaptive;
pub mod compact;
pub mod compressive;
pub mod descriptor;
pub mod expire;
pub mod expire_bias;
pub mod expire_fused;
pub mod fixed;
pub mod infinity;
pub mod layer;
pub mod window;

pub use descriptor::{describe, Descriptor, LayerShape};
pub use layer::{same_episode, AttendInput, AttendOutput, Carry, LtmTrace, MemoryLayer, MemoryReport};

use tch::nn;

use lethe_core::config::MemoryConfig;
use lethe_core::error::Result;

/// Builds layer memory for `cfg`, creating its parameters (if any) under `p` (the
/// layer's attention path, e.g. `layers.3.attn`), for a layer of `shape`. Fails only for
/// a config that does not validate.
pub fn build(cfg: &MemoryConfig, p: nn::Path, shape: LayerShape) -> Result<Box<dyn MemoryLayer>> {
    describe(cfg.mechanism).build(cfg, p, shape)
}

/// The names of the sub-paths under a layer's attention where the mechanisms keep their
/// parameters (`layers.<i>.attn.<path>.*`).
pub const PARAMETER_PATHS: [&str; 4] = ["ltm", "compressive", "expire", "adaptive"];

/// Whether the parameter `name` belongs to a memory mechanism (its own learning rate,
/// `train.memory_lr`), rather than to the transformer.
pub fn is_mechanism_parameter(name: &str) -> bool {
    PARAMETER_PATHS.iter().any(|p| name.contains(&format!(".attn.{p}.")))
}

/// Rows of `key_pe` (distances `0..rows` covered by learned position embeddings):
/// the whole span for Transformer-XL, Adaptive-Span and the Compressive Transformer's
/// uncompressed memory and the ∞-former's short-term memory, `min(L, M) + 1` for
/// Expire-Span (paper A.1).
pub fn position_rows(cfg: &MemoryConfig, block: usize) -> i64 {
    describe(cfg.mechanism).position_rows(cfg, block)
}
