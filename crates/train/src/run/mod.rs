//! What both trainers share about a training run: its folder ([`folder`]: the checks
//! before a run may touch it, the lock, the files it starts with), the loop that steps
//! it ([`driver`]), the signals that stop it with a checkpoint (`signals`; `lethe
//! bench` watches them too, to stop between configs) and Expire-Span's memory target
//! ([`span_target`]).

pub mod driver;
pub mod folder;
mod signals;
pub mod span_target;

pub use driver::{begin_step, broadcast_parameters, check_finite, drive, opening_line, Looped};
pub use driver::{Scales, TrainOptions};
pub use folder::{Intent, RunFolder, LOCK_FILE};
pub use signals::{stop_requested, Signals};
