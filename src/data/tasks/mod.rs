//! Synthetic tasks that lethe generates itself (no downloads). Each task draws whole
//! episodes from a seeded [`Rng`]; the same seed gives the same episodes.

pub mod collision;
pub mod copy;
pub mod instruction;
pub mod sorting;

use crate::data::seq::TokenSeq;
use crate::rng::Rng;

/// A generator of episodes: token sequences whose scored tokens are the answers.
pub trait Generator: Send {
    /// The next episode.
    fn episode(&self, rng: &mut Rng) -> TokenSeq;
}

/// A fixed evaluation split of a task: `batch` documents of whole episodes, about
/// `tokens` tokens in all, from a seed of its own per split.
pub fn eval_split(task: &dyn Generator, name: &str, seed: u64, split: crate::data::seq::Split, batch: usize, tokens: usize) -> crate::data::seq::SplitData {
    use crate::data::seq::Split;
    let split_index = match split {
        Split::Train => 0,
        Split::Valid => 1,
        Split::Test => 2,
    };
    let per_doc = tokens.div_ceil(batch);
    let docs = (0..batch)
        .map(|b| {
            let mut rng = Rng::derive(seed ^ (0x5EED_0000 + split_index), b as u64);
            let mut doc = TokenSeq::default();
            while doc.len() < per_doc {
                doc.extend(&task.episode(&mut rng));
            }
            doc
        })
        .collect();
    crate::data::seq::SplitData { origin: format!("{name} task ({split})").into(), docs, mode: crate::config::FolderMode::Documents, words: None }
}
