//! lethe: transformers with long memory that learn what to keep and what to forget.
//!
//! The library behind the `lethe` binary: a block-recurrent transformer backbone
//! ([`model`]) whose layers remember the past through pluggable memory mechanisms
//! ([`model::memory`]), byte corpora and synthetic tasks ([`data`]), the training loop
//! ([`train`]), streaming evaluation ([`eval`]) and generation ([`generate`]),
//! checkpoints ([`checkpoint`]), benchmarks ([`bench`](mod@bench)) and reinforcement learning on the
//! paper's gridworlds ([`rl`]).
//!
//! # Layers
//!
//! Dependencies point one way, down this list; nothing imports a module above it
//! (`scripts/module-cycles.py` checks that no `src/` file takes part in an import cycle).
//!
//! 1. **Commands** (`main.rs`, `cli.rs`): parse and validate flags, call one library
//!    function, print. A new command goes here and in the module it calls.
//! 2. **Applications**: [`dialogue`] (replies to conversations, scored), the training loops ([`train`] for language models and tasks,
//!    [`rl::train`] for gridworld agents, sharing [`run`]: the run folder and the loop
//!    that steps, logs, evaluates and checkpoints), [`sweep`],
//!    [`bench`](mod@bench), [`inspect`], [`eval`], [`generate`], [`plot`].
//! 3. **Model, data, tasks, environments**: [`model`] (the backbone and, in
//!    [`model::memory`], one file per mechanism; a new mechanism is a file there that
//!    implements [`model::memory::MemoryLayer`] and [`model::memory::Descriptor`], a
//!    variant of [`config::Mechanism`], and a line in [`model::memory::describe`]), [`data`] (corpora, dialogues, streams, and in
//!    [`data::tasks`] one file per generated task), [`rl`] (the gridworlds and the agent),
//!    [`optim`], [`metrics`] (with [`tensorboard`]'s event files), [`textmetrics`] (F1, ROUGE and METEOR of generated text, with METEOR's synonyms from [`wordnet`]), and [`task`]: the registry of tasks. A new task is a file
//!    that implements [`task::Task`] (its streams or episodes, description, quality
//!    metric and the `--length`/`--distance` it takes), its settings in
//!    [`config::tasks`] with a `data.source` name, and one line in [`task::of`].
//! 4. **Bottom**: [`config`] (every setting, with the task settings in
//!    [`config::tasks`]), [`checkpoint`] (the file format; each trainer serialises its own
//!    data position into it), [`input`] and [`output`] (the files a user names: read
//!    bounded, written only where nothing is lost), [`error`], [`rng`], [`device`], [`dist`] (the c10d process
//!    group that data-parallel ranks share).

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod device;
pub mod dialogue;
pub mod dist;
pub mod error;
pub mod eval;
pub(crate) mod ffi;
pub mod generate;
pub mod input;
pub mod inspect;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod output;
pub mod plot;
pub mod profile;
pub mod rl;
pub mod rng;
pub mod run;
pub mod sweep;
pub mod task;
pub mod tensorboard;
pub mod textmetrics;
pub mod train;
pub mod wordnet;

pub use config::Config;
pub use error::{LetheError, Result};
