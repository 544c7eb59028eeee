//! `[memory]`: how each layer remembers the past: the mechanism, the span, and one
//! section per mechanism's own settings, each in its own file ([`expire`], [`adaptive`],
//! [`compressive`], [`infinity`]; Transformer-XL has none of its own). [`Mechanism`] is
//! the one list of mechanisms, and [`MemoryConfig::validate`] checks the chosen one's
//! section.

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

mod adaptive;
mod compressive;
mod expire;
mod infinity;

pub use adaptive::AdaptiveConfig;
pub use compressive::{CompressiveConfig, Compressor};
pub use expire::{Deletion, ExpireConfig};
pub use infinity::InfinityConfig;

use super::check::positive;
use super::model::Arch;
use crate::error::{LetheError, Result};

/// Which memory mechanism each layer uses, and its size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// The mechanism: `fixed` (Transformer-XL), `expire` (Expire-Span), `adaptive`
    /// (Adaptive-Span), `compressive` (Compressive Transformer) or `infinity`
    /// (∞-former). Default `fixed`.
    pub mechanism: Mechanism,
    /// Maximum span `L` in tokens: a query sees itself and at most `L` earlier positions.
    /// For `fixed` this is also the number of cached states per layer; for `compressive`
    /// it is the uncompressed memory, before the compressed slots; for `infinity` it is
    /// the short-term memory, before the continuous long-term memory. Default 128.
    pub span: usize,
    /// Expire-Span's settings (used when `mechanism = "expire"`).
    #[serde(default)]
    pub expire: ExpireConfig,
    /// Adaptive-Span's settings (used when `mechanism = "adaptive"`).
    #[serde(default)]
    pub adaptive: AdaptiveConfig,
    /// The Compressive Transformer's settings (used when `mechanism = "compressive"`).
    #[serde(default)]
    pub compressive: CompressiveConfig,
    /// The ∞-former's settings (used when `mechanism = "infinity"`).
    #[serde(default)]
    pub infinity: InfinityConfig,
}

/// The memory mechanisms lethe knows: the one list the config, the command line
/// (`--mechanism`, through clap's [`ValueEnum`]), sweeps, benches and plots share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum Mechanism {
    /// Transformer-XL: keep the last `span` states.
    Fixed,
    /// Expire-Span: a learned span per memory; expired memories are deleted.
    Expire,
    /// Adaptive-Span: a learned span per head; the cache is trimmed to the largest.
    Adaptive,
    /// Compressive Transformer: old states are compressed `c` to one into a second memory.
    Compressive,
    /// ∞-former: old states are absorbed into a continuous, unbounded long-term memory.
    Infinity,
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Mechanism {
    /// Every mechanism, in the order messages and plots list them.
    pub fn all() -> &'static [Mechanism] {
        Mechanism::value_variants()
    }

    /// The mechanism called `name` (its config name); the error lists the known ones.
    pub fn parse(name: &str) -> Result<Mechanism> {
        Mechanism::from_str(name, false).map_err(|_| {
            let known: Vec<&str> = Mechanism::all().iter().map(|m| m.name()).collect();
            LetheError::Invalid(format!("unknown mechanism `{name}` (known: {})", known.join(", ")))
        })
    }

    /// The name used in configs, run names and messages (`fixed`, `expire`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fixed => "fixed",
            Mechanism::Expire => "expire",
            Mechanism::Adaptive => "adaptive",
            Mechanism::Compressive => "compressive",
            Mechanism::Infinity => "infinity",
        }
    }

    /// Whether the mechanism can keep the episodes of a row apart
    /// (`AttendInput::episodes`, `rl.reset = "episode"`): its memory holds one state
    /// per position. The Compressive Transformer and the ∞-former mix states into
    /// shared slots, so they cannot.
    pub fn separates_episodes(self) -> bool {
        matches!(self, Mechanism::Fixed | Mechanism::Adaptive | Mechanism::Expire)
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            mechanism: Mechanism::Fixed,
            span: 128,
            expire: ExpireConfig::default(),
            adaptive: AdaptiveConfig::default(),
            compressive: CompressiveConfig::default(),
            infinity: InfinityConfig::default(),
        }
    }
}

impl MemoryConfig {
    /// `block` is the block length the memory will be used with, `arch` the layers'
    /// architecture. On the papers' backbone a query sees itself and `memory.span`
    /// earlier positions, so the span must cover the block. On GPT-2 a query always sees
    /// its block up to itself, and `memory.span` counts the earlier blocks' states kept
    /// besides (0: none, as GPT-2); its absolute positions leave no relative distance for
    /// Expire-Span and Adaptive-Span to act on. On a Llama-family decoder the fixed
    /// window's span counts as on GPT-2, its states rotated at their positions in the
    /// window; Expire-Span's `memory.span` is its largest span `L`, as on the papers'
    /// backbone, each memory rotated at the position it was written at; the ∞-former's
    /// short-term memory is the fixed window.
    pub fn validate(&self, block: usize, arch: Arch) -> Result<()> {
        match arch {
            Arch::Lethe => self.validate_window(block)?,
            Arch::Gpt2 if matches!(self.mechanism, Mechanism::Expire | Mechanism::Adaptive) => {
                return Err(LetheError::config(
                    "memory.mechanism",
                    self.mechanism.name(),
                    "needs the relative positions of model.arch = \"lethe\"; on GPT-2 use fixed, compressive or infinity",
                ));
            }
            Arch::Gpt2 => {}
            Arch::Llama if !matches!(self.mechanism, Mechanism::Fixed | Mechanism::Expire | Mechanism::Infinity) => {
                return Err(LetheError::config(
                    "memory.mechanism",
                    self.mechanism.name(),
                    "model.arch = \"llama\" implements the fixed window (Transformer-XL's cache, rotated at its positions), Expire-Span and the ∞-former; its key-value cache policies are `lethe generate --policy`",
                ));
            }
            Arch::Llama if self.mechanism == Mechanism::Expire => {
                positive("memory.span", self.span)?;
                if self.expire.as_official {
                    return Err(LetheError::config(
                        "memory.expire.as_official",
                        true,
                        "the official code's zero first cache and raw cached states are the papers' backbone's; a Llama-family decoder caches its normed states",
                    ));
                }
            }
            Arch::Llama => {}
        }
        match self.mechanism {
            Mechanism::Expire => self.expire.validate()?,
            Mechanism::Adaptive => self.adaptive.validate()?,
            Mechanism::Compressive => self.compressive.validate()?,
            Mechanism::Infinity => self.infinity.validate()?,
            Mechanism::Fixed => {}
        }
        Ok(())
    }

    /// The span covers the block, on the papers' backbone.
    fn validate_window(&self, block: usize) -> Result<()> {
        positive("memory.span", self.span)?;
        if block > self.span {
            return Err(LetheError::config(
                "train.block",
                block,
                format!("a block may not be longer than the span memory.span = {}", self.span),
            ));
        }
        Ok(())
    }

    /// The factor on the memory's auxiliary loss at optimiser step `step` (0-based):
    /// Expire-Span's `alpha` warm-up, 1 otherwise.
    pub fn aux_scale(&self, step: usize) -> f64 {
        match (self.mechanism, self.expire.alpha_warmup) {
            (Mechanism::Expire, n) if n > 0 => ((step + 1) as f64 / n as f64).min(1.0),
            _ => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alpha_warm_up_rises_linearly_and_only_for_expire_span() {
        let mut m = MemoryConfig { mechanism: Mechanism::Expire, ..MemoryConfig::default() };
        assert_eq!(m.aux_scale(0), 1.0);
        m.expire.alpha_warmup = 4;
        let scales: Vec<f64> = (0..6).map(|s| m.aux_scale(s)).collect();
        assert_eq!(scales, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
        m.mechanism = Mechanism::Adaptive;
        assert_eq!(m.aux_scale(0), 1.0);
    }

    #[test]
    fn a_memory_target_needs_a_starting_alpha_and_a_positive_rate() {
        let mut m = MemoryConfig { mechanism: Mechanism::Expire, ..MemoryConfig::default() };
        m.expire.target = 40.0;
        m.validate(64, Arch::Lethe).unwrap();
        let refused = |m: &MemoryConfig| m.validate(64, Arch::Lethe).unwrap_err().to_string();
        let mut no_alpha = m.clone();
        no_alpha.expire.alpha = 0.0;
        let msg = refused(&no_alpha);
        assert!(msg.contains("memory.expire.target") && msg.contains("alpha"), "{msg}");
        let mut no_rate = m.clone();
        no_rate.expire.target_rate = 0.0;
        assert!(refused(&no_rate).contains("memory.expire.target_rate"));
        let mut negative = m;
        negative.expire.target = -1.0;
        assert!(refused(&negative).contains("memory.expire.target"));
    }

    #[test]
    fn every_mechanism_has_one_name_in_configs_messages_and_the_command_line() {
        for &m in Mechanism::all() {
            let serde_name = toml::Value::try_from(m).unwrap();
            assert_eq!(serde_name.as_str(), Some(m.name()));
            assert_eq!(m.to_possible_value().unwrap().get_name(), m.name());
            assert_eq!(Mechanism::parse(m.name()).unwrap(), m);
        }
        assert_eq!(Mechanism::all().len(), 5);
        let msg = Mechanism::parse("lstm").unwrap_err().to_string();
        assert!(msg.contains("lstm") && msg.contains("fixed, expire, adaptive, compressive, infinity"), "{msg}");
    }
}
