//! Reinforcement learning with memory: an advantage actor-critic trainer whose policy is
//! the lethe backbone with any memory mechanism, on the corridor and multi-room portal
//! gridworlds of the Expire-Span paper (section 5.2, Figure 4 left and middle, appendix
//! A.3.1), which live in lethe-data ([`lethe_data::gridworld`]) and are re-exported here.
//! The paper's code for these tasks was never released; this is a reimplementation from
//! the text.
//!
//! - [`grid`]: the vocabulary: words, colours, the four moves, a step's outcome.
//! - [`env`](mod@env): 3x3 observations and a batch of episodes stepped together.
//! - [`corridor`], [`portal`]: the two tasks.
//! - [`agent`]: observation projection, backbone, policy and value heads.
//! - [`a2c`]: discounted returns, advantages and the actor-critic loss.
//! - [`train`]: the loop (act over a truncation window, learn on it, log, evaluate,
//!   checkpoint, resume) and evaluation.

pub mod a2c;
pub mod agent;
pub mod train;

pub use lethe_core::config::{Reset, RlConfig};
pub use lethe_data::gridworld::{corridor, env, grid, portal};
