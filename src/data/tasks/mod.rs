//! Synthetic tasks that lethe generates itself (no downloads). Each task draws whole
//! episodes from a seeded [`Rng`]; the same seed gives the same episodes.

pub mod copy;

use crate::data::TokenSeq;
use crate::rng::Rng;

/// A generator of episodes: token sequences whose scored tokens are the answers.
pub trait Task: Send {
    /// The next episode.
    fn episode(&self, rng: &mut Rng) -> TokenSeq;
}
