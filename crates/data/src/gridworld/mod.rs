//! The gridworlds of the Expire-Span paper's reinforcement-learning tasks (section 5.2,
//! Figure 4 left and middle, appendix A.3.1), reimplemented from the text: the
//! environments only; the agent and its trainer are lethe-train's `rl`.
//!
//! - [`grid`]: the vocabulary: words, colours, the four moves, a step's outcome.
//! - [`env`](mod@env): 3x3 observations and a batch of episodes stepped together.
//! - [`corridor`], [`portal`]: the two tasks.

pub mod corridor;
pub mod env;
pub mod grid;
pub mod portal;
