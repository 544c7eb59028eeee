//! lethe-train: the run loop over the model and the data.
//!
//! [`run`] (the run folder and the loop that steps, logs, evaluates and checkpoints),
//! [`train`] (language models and tasks), [`rl`] (gridworld agents), [`eval`]
//! (streaming evaluation with the memory carried), [`generate`] (token by token, in
//! constant memory) and [`longeval`] (passkey and RULER's needle tasks by length and
//! depth).

pub mod eval;
pub mod generate;
pub mod longeval;
pub mod rl;
pub mod run;
pub mod train;
