//! lethe-train: the run loop over the model and the data.
//!
//! [`run`] (the run folder and the loop that steps, logs, evaluates and checkpoints),
//! [`train`] (language models and tasks), [`rl`] (gridworld agents), [`eval`]
//! (streaming evaluation with the memory carried) and [`generate`] (token by token, in
//! constant memory).

pub mod eval;
pub mod generate;
pub mod rl;
pub mod run;
pub mod train;
