//! Synthetic tasks that lethe generates itself (no downloads). Each task draws whole
//! episodes from a seeded [`Rng`]; the same seed gives the same episodes.

pub mod collision;
pub mod copy;
pub mod instruction;
pub mod sorting;

use crate::seq::TokenSeq;
use lethe_core::rng::Rng;

/// A generator of episodes: token sequences whose scored tokens are the answers.
pub trait Generator: Send {
    /// The next episode.
    fn episode(&self, rng: &mut Rng) -> TokenSeq;

    /// The next episode of a training stream that has given `step` blocks so far: the
    /// hook of a curriculum. The same as [`Generator::episode`] unless a task has one.
    fn episode_at(&self, rng: &mut Rng, step: u64) -> TokenSeq {
        let _ = step;
        self.episode(rng)
    }

    /// The most tokens an episode can hold (an upper bound, computed without overflow),
    /// and the config field that sets it: checked against the machine before any
    /// episode is drawn ([`check_sizes`]).
    fn longest_episode(&self) -> (u64, &'static str);
}

/// What a generated token costs in memory while it is held (the token, its target and
/// whether it is scored, with room for the vectors' growth).
const BYTES_PER_TOKEN: u64 = 16;

/// Refuses, before any episode is drawn, a task whose episodes for `batch` streams, or
/// whose fixed evaluation stream of `eval_tokens` (set by `eval_field`), would not fit
/// in what lethe lets one input hold ([`lethe_core::input::max_bytes`]), naming the field.
pub fn check_sizes(
    task: &dyn Generator,
    batch: usize,
    eval_tokens: usize,
    eval_field: &str,
) -> lethe_core::error::Result<()> {
    let most = lethe_core::input::max_bytes();
    let (longest, field) = task.longest_episode();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let episodes = longest.saturating_mul(batch as u64).saturating_mul(BYTES_PER_TOKEN);
    if episodes > most {
        return Err(lethe_core::error::LetheError::Invalid(format!(
            "config: `{field}`: an episode could hold {longest} tokens, {:.1} GiB for the {batch} streams of a batch, more than lethe holds for one input ({:.1} GiB, half this machine's memory)",
            gib(episodes),
            gib(most)
        )));
    }
    let eval = (eval_tokens as u64).saturating_add(longest).saturating_mul(BYTES_PER_TOKEN);
    if eval > most {
        return Err(lethe_core::error::LetheError::config(
            eval_field,
            eval_tokens,
            format!("the evaluation stream would take {:.1} GiB, more than lethe holds for one input ({:.1} GiB, half this machine's memory)", gib(eval), gib(most)),
        ));
    }
    Ok(())
}

/// A fixed evaluation split of a task: `batch` documents of whole episodes, about
/// `tokens` tokens in all, from a seed of its own per split.
pub fn eval_split(
    task: &dyn Generator,
    name: &str,
    seed: u64,
    split: crate::seq::Split,
    batch: usize,
    tokens: usize,
) -> crate::seq::SplitData {
    use crate::seq::Split;
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
    crate::seq::SplitData {
        origin: format!("{name} task ({split})").into(),
        docs,
        mode: lethe_core::config::FolderMode::Documents,
        words: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::config::{CollisionConfig, CopyConfig};

    /// A task whose episodes or evaluation stream could not be held is refused before
    /// any is drawn, naming the field; sizes near 2^64 do not overflow the arithmetic.
    #[test]
    fn sizes_that_cannot_be_held_are_refused_by_their_field() {
        let copy = |count_max: usize, distance_max: usize| {
            copy::CopyTask::new(&CopyConfig { count_max, distance_max, ..CopyConfig::default() })
        };
        assert!(check_sizes(&copy(8, 100), 16, 1 << 20, "data.copy.eval_tokens").is_ok());
        let e = check_sizes(&copy(usize::MAX, 100), 16, 1 << 20, "data.copy.eval_tokens").unwrap_err().to_string();
        assert!(e.contains("data.copy.count_max") && e.contains("16 streams"), "{e}");
        let e = check_sizes(&copy(8, 100), 16, usize::MAX, "data.copy.eval_tokens").unwrap_err().to_string();
        assert!(e.contains("data.copy.eval_tokens"), "{e}");
        let collision =
            collision::CollisionTask::new(&CollisionConfig { steps: 1 << 60, ..CollisionConfig::default() });
        let e = check_sizes(&collision, 1, 1000, "data.collision.eval_tokens").unwrap_err().to_string();
        assert!(e.contains("data.collision.steps"), "{e}");
    }
}
