//! lethe: transformers with long memory that learn what to keep and what to forget.
//!
//! The library behind the `lethe` binary: a block-recurrent transformer backbone
//! ([`model`]) whose layers remember the past through pluggable memory mechanisms
//! ([`model::memory`]), byte corpora and synthetic tasks ([`data`]), the training loop
//! ([`train`]), streaming evaluation ([`eval`]) and generation ([`generate`]),
//! checkpoints ([`checkpoint`]), benchmarks ([`bench`]) and reinforcement learning on the
//! paper's gridworlds ([`rl`]).

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod device;
pub mod error;
pub mod eval;
pub mod generate;
pub mod inspect;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod rl;
pub mod rng;
pub mod run;
pub mod sweep;
pub mod train;

pub use config::Config;
pub use error::{LetheError, Result};
