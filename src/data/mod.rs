//! Data: token sequences, the three splits of a corpus or task, and the parallel
//! streams that feed the model `B` blocks of `M` tokens at a time.
//!
//! Every source yields bytes (vocabulary 256). A sequence may flag which tokens are
//! scored: predicting a flagged token counts in the loss and the metrics, the others are
//! context only (the copy task scores only its answers; byte corpora score everything).
//! A sequence may also carry labels: the target at a position is then the label, not
//! the next input (the collision task's answer is a quadrant, not the next token).

pub mod bytes;
pub mod stream;
pub mod tasks;

use std::path::PathBuf;

use crate::config::{Config, FolderMode, Source};
use crate::error::{LetheError, Result};

pub use stream::{Batch, BlockStreams, EvalWalker, TrainStreams};

/// A finite token sequence. Position `i` is predicted from the inputs before it: its
/// target is `labels[i]` when there are labels, `tokens[i]` otherwise. `scored[i]` says
/// whether that prediction counts; `None` means every position counts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenSeq {
    /// The tokens (the inputs).
    pub tokens: Vec<u8>,
    /// Which targets are scored (`None`: all).
    pub scored: Option<Vec<bool>>,
    /// Targets that differ from the tokens (`None`: the targets are the tokens).
    pub labels: Option<Vec<u8>>,
}

impl TokenSeq {
    /// A sequence in which every token is scored.
    pub fn all_scored(tokens: Vec<u8>) -> Self {
        TokenSeq { tokens, scored: None, labels: None }
    }

    /// The target of position `i`.
    pub fn target(&self, i: usize) -> u8 {
        self.labels.as_ref().map_or(self.tokens[i], |l| l[i])
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether predicting token `i` counts.
    pub fn is_scored(&self, i: usize) -> bool {
        self.scored.as_ref().is_none_or(|s| s[i])
    }

    /// Appends another sequence.
    pub fn extend(&mut self, other: &TokenSeq) {
        if self.labels.is_some() || other.labels.is_some() {
            let mine = self.labels.get_or_insert_with(|| self.tokens.clone());
            mine.extend_from_slice(other.labels.as_ref().unwrap_or(&other.tokens));
        }
        match (&mut self.scored, &other.scored) {
            (None, None) => {}
            (mine, theirs) => {
                let own_len = self.tokens.len();
                let s = mine.get_or_insert_with(|| vec![true; own_len]);
                match theirs {
                    Some(t) => s.extend_from_slice(t),
                    None => s.extend(std::iter::repeat_n(true, other.len())),
                }
            }
        }
        self.tokens.extend_from_slice(&other.tokens);
    }

    /// The sub-sequence `[start, end)`.
    pub fn slice(&self, start: usize, end: usize) -> TokenSeq {
        TokenSeq {
            tokens: self.tokens[start..end].to_vec(),
            scored: self.scored.as_ref().map(|s| s[start..end].to_vec()),
            labels: self.labels.as_ref().map(|l| l[start..end].to_vec()),
        }
    }
}

/// Which split of the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Training data.
    Train,
    /// Validation data.
    Valid,
    /// Test data.
    Test,
}

impl std::str::FromStr for Split {
    type Err = LetheError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Split::Train),
            "valid" | "validation" => Ok(Split::Valid),
            "test" => Ok(Split::Test),
            _ => Err(LetheError::Invalid(format!("unknown split `{s}`: use train, valid or test"))),
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Valid => "valid",
            Split::Test => "test",
        })
    }
}

/// A split as documents, with how they become parallel streams.
#[derive(Clone, Debug)]
pub struct SplitData {
    /// Where it came from, for messages (a path or a task name).
    pub origin: PathBuf,
    /// The documents (one for a single file).
    pub docs: Vec<TokenSeq>,
    /// Concatenate and cut, or keep documents whole per stream.
    pub mode: FolderMode,
}

impl SplitData {
    /// Total tokens.
    pub fn total_len(&self) -> usize {
        self.docs.iter().map(TokenSeq::len).sum()
    }

    /// Lays the split out as `batch` parallel streams.
    ///
    /// `concat`: all documents end to end, cut into `batch` equal pieces (the remainder
    /// of fewer than `batch` tokens is dropped). `documents`: each document goes whole
    /// to the currently shortest stream.
    pub fn into_streams(&self, batch: usize) -> Vec<TokenSeq> {
        match self.mode {
            FolderMode::Concat => {
                let mut all = TokenSeq::default();
                for d in &self.docs {
                    all.extend(d);
                }
                let per = all.len() / batch;
                (0..batch).map(|b| all.slice(b * per, (b + 1) * per)).collect()
            }
            FolderMode::Documents => {
                let mut streams = vec![TokenSeq::default(); batch];
                for d in &self.docs {
                    if let Some(s) = streams.iter_mut().min_by_key(|s| s.len()) {
                        s.extend(d);
                    }
                }
                streams
            }
        }
    }
}

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
