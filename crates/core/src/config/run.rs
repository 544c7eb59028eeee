//! The whole of a run's settings, [`Config`]: one section per part of the run, and the
//! validation that checks them together.

use serde::{Deserialize, Serialize};

use super::check::validate_name;
use super::data::DataConfig;
use super::memory::{Mechanism, MemoryConfig};
use super::model::{Arch, ModelConfig};
use super::rl::{Reset, RlConfig};
use super::train::{Precision, TrainConfig};
use crate::error::{LetheError, Result};

/// Everything a run needs. Serialises to the TOML users write.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Run name; the run folder is `<out>/<name>`. Default: the preset's name.
    pub name: String,
    /// Seed for initialisation, data order, dropout and sampling. Default 1.
    pub seed: u64,
    /// The network.
    pub model: ModelConfig,
    /// How each layer remembers the past.
    pub memory: MemoryConfig,
    /// Where the tokens come from.
    pub data: DataConfig,
    /// The optimiser and the loop.
    pub train: TrainConfig,
    /// Actor-critic settings, for the reinforcement-learning tasks (`corridor`, `portal`).
    #[serde(default)]
    pub rl: RlConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: "copy-tiny".to_string(),
            seed: 1,
            model: ModelConfig::default(),
            memory: MemoryConfig::default(),
            data: DataConfig::default(),
            train: TrainConfig::default(),
            rl: RlConfig::default(),
        }
    }
}

impl Config {
    /// The seed of the data: `data.seed`, or the run's seed when that is 0.
    pub fn data_seed(&self) -> u64 {
        if self.data.seed == 0 {
            self.seed
        } else {
            self.data.seed
        }
    }

    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        validate_name(&self.name)?;
        if self.data.source.is_rl() {
            // Observations come in through their own projection: no vocabulary. The
            // truncation window is cut into blocks of at most the span (see `rl::train`).
            self.model.validate_layers()?;
            if self.model.arch != Arch::Lethe {
                return Err(LetheError::config(
                    "model.arch",
                    self.model.arch.name(),
                    "the gridworld agents are built on the papers' backbone (model.arch = \"lethe\")",
                ));
            }
            self.memory.validate(self.train.block.min(self.memory.span), Arch::Lethe)?;
            self.rl.validate()?;
            if self.rl.reset == Reset::Episode && !self.memory.mechanism.separates_episodes() {
                return Err(LetheError::config(
                    "rl.reset",
                    "\"episode\"",
                    format!(
                        "the {} memory cannot keep the episodes of a row apart: set rl.reset = \"batch\" (synchronous batches)",
                        self.memory.mechanism.name()
                    ),
                ));
            }
            if self.rl.reset == Reset::Episode
                && self.memory.mechanism == Mechanism::Expire
                && self.memory.expire.as_official
            {
                return Err(LetheError::config(
                    "memory.expire.as_official",
                    true,
                    "the official code's first cache belongs to no episode, so episodes in a row cannot be kept apart: set rl.reset = \"batch\" or as_official = false",
                ));
            }
        } else {
            self.model.validate(self.data.tokenizer.is_none())?;
            self.memory.validate(self.train.block, self.model.arch)?;
            let inner = self.model.heads * self.model.head_dim();
            if self.memory.mechanism == Mechanism::Infinity && inner != self.model.d_model {
                return Err(LetheError::config(
                    "model.llama.head_dim",
                    self.model.llama.head_dim,
                    format!(
                        "the ∞-former's long-term memory maps d_model = {} to its heads' keys and values, and {} heads x {} make {inner}",
                        self.model.d_model,
                        self.model.heads,
                        self.model.head_dim()
                    ),
                ));
            }
            if self.model.arch == Arch::Gpt2 && self.train.block > self.model.positions {
                return Err(LetheError::config(
                    "train.block",
                    self.train.block,
                    format!(
                        "GPT-2's positions restart at every block, and it has model.positions = {} of them",
                        self.model.positions
                    ),
                ));
            }
        }
        self.data.validate()?;
        self.train.validate()?;
        if self.train.lora_rank > 0 && self.data.source.is_rl() {
            return Err(LetheError::config(
                "train.lora_rank",
                self.train.lora_rank,
                "adapters fit a pretrained language model; a gridworld agent trains whole",
            ));
        }
        if self.train.freeze_base && self.memory.mechanism == Mechanism::Fixed && self.train.lora_rank == 0 {
            return Err(LetheError::config(
                "train.freeze_base",
                true,
                "leaves nothing to train: the fixed window has no parameters of its own (choose a learned memory, add adapters with train.lora_rank, or train the whole model)",
            ));
        }
        self.validate_precision()
    }

    /// Reduced precision where it is supported: language models' training, and float16
    /// not with the ∞-former (its long-term memory drifts from float32's: 19% on the
    /// validation loss of 50 steps of `copy-sweep-tiny`, where bfloat16 stays within 0.3%).
    fn validate_precision(&self) -> Result<()> {
        let precision = self.train.precision;
        if precision != Precision::F32 && self.data.source.is_rl() {
            return Err(LetheError::config(
                "train.precision",
                precision.name(),
                "reduced precision trains language models; a gridworld agent trains in f32",
            ));
        }
        if precision == Precision::F16 && self.memory.mechanism == Mechanism::Infinity {
            return Err(LetheError::config(
                "train.precision",
                precision.name(),
                "the ∞-former's long-term memory does not train in float16 (it drifts from float32): use bf16, or f32",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Mechanism, Schedule};

    #[test]
    fn overrides_set_typed_values_and_reject_unknown_fields() {
        let c = Config::default()
            .apply_overrides(&[
                "model.layers=3".into(),
                "train.schedule=constant".into(),
                "data.split=[0.8,0.1,0.1]".into(),
            ])
            .unwrap();
        assert_eq!(c.model.layers, 3);
        assert_eq!(c.train.schedule, Schedule::Constant);
        assert_eq!(c.data.split, [0.8, 0.1, 0.1]);
        let err = Config::default().apply_overrides(&["model.layerz=3".into()]).unwrap_err();
        assert!(err.to_string().contains("model.layerz"), "{err}");
    }

    type Breaker = Box<dyn Fn(&mut Config)>;

    #[test]
    fn impossible_values_name_their_field() {
        let cases: Vec<(&str, Breaker)> = vec![
            ("model.heads", Box::new(|c| c.model.heads = 0)),
            ("model.d_model", Box::new(|c| c.model.d_model = 66)),
            ("train.block", Box::new(|c| c.train.block = 1000)),
            ("train.accum", Box::new(|c| c.train.accum = 3)),
            ("model.dropout", Box::new(|c| c.model.dropout = 1.5)),
            ("data.split", Box::new(|c| c.data.split = [0.5, 0.1, 0.1])),
            ("train.device", Box::new(|c| c.train.device = "tpu".into())),
            (
                "memory.compressive.rate",
                Box::new(|c| {
                    c.memory.mechanism = Mechanism::Compressive;
                    c.memory.compressive.rate = 0;
                }),
            ),
            ("data.instruction.queue_max", Box::new(|c| c.data.instruction.queue_max = 39)),
            ("data.instruction.characters", Box::new(|c| c.data.instruction.characters = 41)),
            ("data.instruction.distance_max", Box::new(|c| c.data.instruction.distance_max = 10)),
            ("data.sorting.symbols", Box::new(|c| c.data.sorting.symbols = 30)),
            ("train.eps", Box::new(|c| c.train.eps = 0.0)),
            ("train.min_lr_ratio", Box::new(|c| c.train.min_lr_ratio = 50.0)),
            (
                "rl.eval_episodes",
                Box::new(|c| {
                    c.data.source = crate::config::Source::Corridor;
                    c.rl.eval_episodes = usize::MAX;
                }),
            ),
        ];
        for (field, breaker) in cases {
            let mut c = Config::default();
            breaker(&mut c);
            let msg = c.validate().unwrap_err().to_string();
            assert!(msg.contains(field), "expected `{field}` in: {msg}");
        }
    }
}
