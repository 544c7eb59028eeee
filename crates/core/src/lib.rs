//! lethe-core: the bottom layer every other lethe crate stands on.
//!
//! [`config`] (every setting, with the task settings in [`config::tasks`]),
//! [`checkpoint`] (the file format; each trainer serialises its own data position into
//! it), [`input`] and [`output`] (the files a user names: read bounded, written only
//! where nothing is lost), [`error`], [`rng`], [`device`], [`profile`], [`metrics`] (with
//! [`tensorboard`]'s event files), [`optim`] (the optimisers, over lethe-kernels' fused
//! update) and [`dist`] (the c10d process group that data-parallel ranks share).

pub mod checkpoint;
pub mod config;
pub mod device;
pub mod dist;
pub mod error;
pub mod input;
pub mod lock;
pub mod loss_scale;
pub mod metrics;
pub mod optim;
pub mod output;
pub mod profile;
pub mod rng;
pub mod tensorboard;

pub use config::Config;
pub use error::{LetheError, Result};
