//! lethe: transformers with long memory that learn what to keep and what to forget.
//!
//! The library behind the `lethe` binary, and the one name its layers are known by: the
//! crates under `crates/` are re-exported here under their module names, so that
//! `lethe::model::memory`, `lethe::data::tasks` or `lethe::train` name the same items
//! wherever lethe is used.
//!
//! # Layers
//!
//! Dependencies point one way, down this list; each layer is a crate, so the compiler
//! refuses an import that points up.
//!
//! 1. **Commands** (`main.rs`, `cli.rs`, `commands/`): parse and validate flags, call
//!    one library function, print. A new command goes here and in the module it calls.
//! 2. **Applications** (this crate): [`dialogue`] (replies to conversations, scored with
//!    [`textmetrics`]' F1, ROUGE and METEOR, METEOR's synonyms from [`wordnet`]),
//!    [`sweep`], [`bench`](mod@bench), [`inspect`] and [`plot`].
//! 3. **lethe-train** (`crates/train`): [`run`] (the run folder and the loop that steps,
//!    logs, evaluates and checkpoints), [`train`] for language models and tasks,
//!    [`rl`] for gridworld agents, [`eval`], [`generate`] and [`longeval`].
//! 4. **lethe-model** (`crates/model`, here [`model`]) and **lethe-data**
//!    (`crates/data`, here [`data`] and [`task`]), side by side: the backbone and, in
//!    [`model::memory`], one unit per mechanism (a new mechanism is a file there that
//!    implements [`model::memory::MemoryLayer`] and [`model::memory::Descriptor`], a
//!    variant of [`config::Mechanism`], and a line in [`model::memory::describe`]); the
//!    corpora, dialogues, streams, the generated tasks ([`data::tasks`]), the gridworlds
//!    ([`data::gridworld`]) and the registry of tasks ([`task`]: a new task is a file that
//!    implements [`task::Task`], its settings in [`config::tasks`] with a `data.source`
//!    name, and one line in [`task::of`]).
//! 5. **lethe-core** (`crates/core`): [`config`], [`checkpoint`], [`input`] and
//!    [`output`], [`error`], [`rng`], [`device`], [`profile`], [`metrics`] with
//!    [`tensorboard`], [`optim`] and [`dist`].
//! 6. **lethe-kernels** (`crates/kernels`, here [`ffi`]): lethe's C++ (`csrc/`) and the
//!    one Rust mirror of its C ABI.

pub use lethe_core::{
    checkpoint, config, device, dist, error, input, metrics, optim, output, profile, rng, tensorboard,
};
pub use lethe_data::{self as data, task};
pub use lethe_kernels as ffi;
pub use lethe_model as model;
pub use lethe_train::{eval, generate, longeval, rl, run, train};

pub mod bench;
pub mod dialogue;
pub mod inspect;
pub mod plot;
pub mod sweep;
pub mod textmetrics;
pub mod wordnet;

pub use config::Config;
pub use error::{LetheError, Result};

/// `eprintln!` for what a command says on standard error (its progress, notes and last
/// error): a line that cannot be written (standard error on a full disk) is dropped
/// rather than panicking, as the command's work matters more than its commentary.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
