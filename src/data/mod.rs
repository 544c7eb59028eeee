//! Data: token sequences, the three splits of a corpus or task, and the parallel
//! streams that feed the model `B` blocks of `M` tokens at a time.
//!
//! Every source yields bytes (vocabulary 256). A sequence may flag which tokens are
//! scored: predicting a flagged token counts in the loss and the metrics, the others are
//! context only (the copy task scores only its answers; byte corpora score everything).
//! A sequence may also carry labels: the target at a position is then the label, not
//! the next input (the collision task's answer is a quadrant, not the next token).

pub mod bytes;
pub mod seq;
pub mod stream;
pub mod tasks;

use crate::config::{Config, Source};
use crate::error::{LetheError, Result};

pub use seq::{Split, SplitData, TokenSeq};
pub use stream::{Batch, BlockStreams, EvalWalker, TrainStreams};

/// Loads one split of the data the config names. For a generated task the split is
/// generated from the seed (valid and test are fixed streams, train is a sample of the
/// same generator used only by `eval --split train`).
pub fn load_split(cfg: &Config, split: Split, batch: usize) -> Result<SplitData> {
    let seed = cfg.data_seed();
    match cfg.data.source {
        Source::Copy => Ok(tasks::copy::eval_split(&cfg.data.copy, seed, split, batch)),
        Source::Collision => {
            let k = &cfg.data.collision;
            Ok(tasks::eval_split(&tasks::collision::CollisionTask::new(k), "collision", seed, split, batch, k.eval_tokens))
        }
        Source::Instruction => {
            let k = &cfg.data.instruction;
            let task = tasks::instruction::InstructionTask::new(k);
            Ok(tasks::eval_split(&task, "instruction", seed, split, batch, k.eval_tokens))
        }
        Source::Sorting => {
            let k = &cfg.data.sorting;
            Ok(tasks::eval_split(&tasks::sorting::SortingTask::new(k), "sorting", seed, split, batch, k.eval_tokens))
        }
        Source::File | Source::Folder => bytes::load(&cfg.data, split),
        Source::Corridor | Source::Portal => Err(not_a_stream(cfg)),
    }
}

/// The error for asking a gridworld for tokens.
fn not_a_stream(cfg: &Config) -> LetheError {
    LetheError::Invalid(format!(
        "`{}` is a reinforcement-learning task: it has episodes, not a token stream (train it with `lethe train`, evaluate it with `lethe eval`)",
        cfg.data.source.name()
    ))
}

/// The training streams the config names, positioned at the start.
pub fn train_streams(cfg: &Config, batch: usize) -> Result<TrainStreams> {
    let seed = cfg.data_seed();
    match cfg.data.source {
        Source::Copy => Ok(TrainStreams::Generated(tasks::copy::train_streams(&cfg.data.copy, seed, batch, cfg.train.block))),
        Source::Collision => {
            let task = Box::new(tasks::collision::CollisionTask::new(&cfg.data.collision));
            Ok(TrainStreams::Generated(stream::GeneratedStreams::new(task, seed, batch, cfg.train.block)))
        }
        Source::Sorting => {
            let task = Box::new(tasks::sorting::SortingTask::new(&cfg.data.sorting));
            Ok(TrainStreams::Generated(stream::GeneratedStreams::new(task, seed, batch, cfg.train.block)))
        }
        Source::Instruction => {
            let task = Box::new(tasks::instruction::InstructionTask::new(&cfg.data.instruction));
            Ok(TrainStreams::Generated(stream::GeneratedStreams::new(task, seed, batch, cfg.train.block)))
        }
        Source::File | Source::Folder => {
            let split = bytes::load(&cfg.data, Split::Train)?;
            Ok(TrainStreams::Fixed(BlockStreams::new(&split, batch, cfg.train.block, seed)?))
        }
        Source::Corridor | Source::Portal => Err(not_a_stream(cfg)),
    }
}

/// One line on where the data comes from and how it is split, for the training header.
pub fn describe(cfg: &Config) -> String {
    let d = &cfg.data;
    let path = d.path.as_deref().unwrap_or(std::path::Path::new("?"));
    match d.source {
        Source::Copy => format!(
            "copy task, counts {}-{}, distances {}-{}",
            d.copy.count_min, d.copy.count_max, d.copy.distance_min, d.copy.distance_max
        ),
        Source::Collision => format!(
            "object collision ({}), {} steps of 8 tokens per simulation; chance error 75%",
            if d.collision.easy { "easy" } else { "hard" },
            d.collision.steps
        ),
        Source::Instruction => format!(
            "instruction following, {} characters, up to {} instructions pending, {}-{} distractor words; only executions scored",
            d.instruction.characters, d.instruction.queue_max, d.instruction.distance_min, d.instruction.distance_max
        ),
        Source::Sorting => format!(
            "sorting by frequency, {} symbols, sequences of {}; only the sorted symbols scored",
            d.sorting.symbols, d.sorting.length
        ),
        Source::Folder => format!("folder {} ({:?} mode)", path.display(), d.folder_mode).to_lowercase(),
        Source::Corridor => format!(
            "corridor gridworld, lengths {}-{}, at most {} steps per episode; chance success 50%",
            d.corridor.length_min, d.corridor.length_max, d.corridor.max_steps
        ),
        Source::Portal => format!(
            "multi-room portal gridworld, {} rooms of {}x{}, {} mistakes per room end an episode, at most {} steps",
            d.portal.rooms, d.portal.size, d.portal.size, d.portal.mistakes, d.portal.max_steps
        ),
        Source::File => {
            let len = std::fs::metadata(path).map(|m| m.len() as usize).unwrap_or(0);
            match bytes::file_ranges(path, len, d.format, d.split) {
                Ok(r) if len == bytes::ENWIK8_BYTES && r[0].1 == bytes::ENWIK8_SPLIT[0] && d.format != crate::config::FileFormat::Bytes => {
                    format!("{} as enwik8: standard split, train 90M / valid 5M / test 5M bytes", path.display())
                }
                Ok(r) => format!(
                    "{}: {len} bytes split by fractions {:?}: train {} / valid {} / test {} bytes",
                    path.display(),
                    d.split,
                    r[0].1 - r[0].0,
                    r[1].1 - r[1].0,
                    r[2].1 - r[2].0
                ),
                Err(e) => e.to_string(),
            }
        }
    }
}

/// Entropy in nats of the unigram distribution of the scored tokens of `seqs`: the loss
/// of the best model that ignores context.
pub fn unigram_entropy(seqs: &[TokenSeq]) -> f64 {
    let mut counts = [0u64; 256];
    for s in seqs {
        for i in 0..s.len() {
            if s.is_scored(i) {
                counts[s.target(i) as usize] += 1;
            }
        }
    }
    let total: u64 = counts.iter().sum();
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / total as f64;
            -p * p.ln()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FolderMode;

    #[test]
    fn concat_cuts_equal_streams_and_documents_stay_whole() {
        let docs = vec![
            TokenSeq::all_scored(vec![1; 5]),
            TokenSeq::all_scored(vec![2; 3]),
            TokenSeq::all_scored(vec![3; 4]),
        ];
        let mut split = SplitData { origin: "t".into(), docs, mode: FolderMode::Concat };
        let s = split.into_streams(2);
        assert_eq!(s[0].tokens, vec![1, 1, 1, 1, 1, 2]);
        assert_eq!(s[1].tokens, vec![2, 2, 3, 3, 3, 3]);
        split.mode = FolderMode::Documents;
        let s = split.into_streams(2);
        assert_eq!(s[0].tokens, vec![1; 5]);
        assert_eq!(s[1].tokens, vec![2, 2, 2, 3, 3, 3, 3]);
    }

    #[test]
    fn extend_keeps_scored_flags_aligned() {
        let mut a = TokenSeq::all_scored(vec![1, 2]);
        a.extend(&TokenSeq { tokens: vec![3, 4], scored: Some(vec![false, true]), labels: Some(vec![7, 8]) });
        assert_eq!(a.scored, Some(vec![true, true, false, true]));
        assert_eq!(a.labels, Some(vec![1, 2, 7, 8]));
        assert_eq!(a.target(3), 8);
        assert_eq!(a.slice(1, 3).labels, Some(vec![2, 7]));
    }

    #[test]
    fn unigram_entropy_of_two_equal_symbols_is_ln2() {
        let s = TokenSeq::all_scored(vec![7, 9, 7, 9]);
        assert!((unigram_entropy(&[s]) - std::f64::consts::LN_2).abs() < 1e-12);
    }
}
