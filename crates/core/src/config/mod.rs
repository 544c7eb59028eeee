//! Run configuration: plain structs with documented defaults, named presets, TOML files
//! and command-line overrides. One file per job:
//!
//! - [`run`]: [`Config`], the whole of a run's settings, and its validation;
//! - one file per section, each struct with its defaults and its validation beside it:
//!   [`model`] (`[model]`), [`memory`] (`[memory]` and each mechanism's settings),
//!   [`data`] (`[data]`), [`tasks`] (`[data.<task>]`), [`train`] (`[train]`), [`rl`]
//!   (`[rl]`); [`check`] holds the field checks they share;
//! - [`presets`]: the named presets, one table and one small TOML file each;
//! - [`merge`]: TOML files merged over a config, `--set` overrides, `config.toml`.
//!
//! Resolution order: a preset (default `copy-tiny`), then a TOML file merged on top of
//! it, then `--set section.field=value` overrides and the dedicated CLI flags. The
//! resolved config is written to `runs/<name>/config.toml` and into every checkpoint.

pub mod check;
pub mod data;
pub mod memory;
pub mod merge;
pub mod model;
pub mod presets;
pub mod reference;
pub mod rl;
pub mod run;
pub mod tasks;
pub mod train;

pub use data::{DataConfig, FileFormat, FolderMode, Source};
pub use memory::{
    AdaptiveConfig, CompressiveConfig, Compressor, Deletion, ExpireConfig, InfinityConfig, Mechanism, MemoryConfig,
};
pub use model::{Arch, Init, LlamaShape, ModelConfig};
pub use presets::{Preset, PRESETS};
pub use rl::{Reset, RlConfig, MAX_EPISODES};
pub use run::Config;
pub use tasks::{
    CollisionConfig, CopyConfig, CorridorConfig, DialogueConfig, InstructionConfig, LongctxConfig, PortalConfig,
    SortingConfig,
};
pub use train::{Optimizer, Precision, Schedule, TrainConfig};
