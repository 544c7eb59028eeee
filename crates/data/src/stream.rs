//! Parallel streams: the data split into `B` streams, each step taking the next `M`
//! tokens of every stream (docs/design/algorithms.md, Backbone). Targets are the inputs shifted by
//! one; the last target of a block is the first input of the next, so nothing is lost
//! at block boundaries.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::batch::Batch;
use super::rounds::{EvalRounds, RoundState, RoundStreams};
use super::seq::{SplitData, Token, TokenSeq};
use super::tasks::Generator;
use lethe_core::config::FolderMode;
use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

/// Training streams over a finite split. At the end of the data, every stream restarts
/// at a random offset in `[0, M)` with a fresh cache.
#[derive(Debug)]
pub struct BlockStreams {
    streams: Vec<TokenSeq>,
    block: usize,
    usable: usize,
    pos: usize,
    rng: Rng,
    started: bool,
}

/// Where [`BlockStreams`] stands, for exact resume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockState {
    pos: usize,
    rng: Rng,
    started: bool,
}

impl BlockStreams {
    /// `batch` streams of blocks of `block` tokens over `split`. Fails when a stream would
    /// be shorter than one block plus its target.
    pub fn new(split: &SplitData, batch: usize, block: usize, seed: u64) -> Result<Self> {
        let streams = split.into_streams(batch);
        let usable = streams.iter().map(TokenSeq::len).min().unwrap_or(0);
        if usable < block + 1 {
            return Err(LetheError::data(
                &split.origin,
                format!(
                    "too short for training: its train split has {} tokens, {batch} streams of {usable}, but each \
                     stream needs at least one block plus one target ({} tokens), so at least {} \
                     tokens in all; use a smaller train.batch or train.block, or more data",
                    split.total_len(),
                    block + 1,
                    batch * (block + 1)
                ),
            ));
        }
        Ok(BlockStreams { streams, block, usable, pos: 0, rng: Rng::derive(seed, 0xB10C), started: false })
    }

    /// The next block of every stream.
    pub fn next_batch(&mut self) -> Batch {
        let mut reset = !self.started;
        self.started = true;
        if self.pos + self.block + 1 > self.usable {
            let max_offset = (self.block - 1).min(self.usable - self.block - 1);
            self.pos = self.rng.range(0, max_offset);
            reset = true;
        }
        let mut batch = Batch::with_capacity(self.streams.len(), self.block, reset);
        for s in &self.streams {
            batch.push_from(s, self.pos); // never past the end: pos + block < usable
        }
        self.pos += self.block;
        batch
    }

    fn state(&self) -> BlockState {
        BlockState { pos: self.pos, rng: self.rng.clone(), started: self.started }
    }
}

/// Training streams from a task generator: each stream draws whole episodes from its own
/// random generator and is consumed `M` tokens at a time. Never ends.
pub struct GeneratedStreams {
    task: Box<dyn Generator>,
    block: usize,
    streams: Vec<GenStream>,
}

/// One generated stream: its generator and the tokens drawn but not yet consumed, with
/// each position's target and scored flag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenStream {
    rng: Rng,
    /// Blocks the stream has given: the training step, for a curriculum.
    #[serde(default)]
    blocks: u64,
    tokens: VecDeque<Token>,
    targets: VecDeque<Token>,
    scored: VecDeque<bool>,
}

impl GeneratedStreams {
    /// `batch` streams of `task`, stream `b` seeded with `Rng::derive(seed, b)`.
    pub fn new(task: Box<dyn Generator>, seed: u64, batch: usize, block: usize) -> Self {
        let streams = (0..batch)
            .map(|b| GenStream {
                rng: Rng::derive(seed, b as u64),
                blocks: 0,
                tokens: VecDeque::new(),
                targets: VecDeque::new(),
                scored: VecDeque::new(),
            })
            .collect();
        GeneratedStreams { task, block, streams }
    }

    /// The next block of every stream.
    pub fn next_batch(&mut self) -> Batch {
        let mut batch = Batch::with_capacity(self.streams.len(), self.block, false);
        for s in &mut self.streams {
            while s.tokens.len() < self.block + 1 {
                let ep = self.task.episode_at(&mut s.rng, s.blocks);
                s.scored.extend((0..ep.len()).map(|i| ep.is_scored(i)));
                s.targets.extend((0..ep.len()).map(|i| ep.target(i)));
                s.tokens.extend(ep.tokens);
            }
            let scored = s.scored.iter().skip(1).map(|&f| if f { 1.0 } else { 0.0 });
            batch.push_stream(s.tokens.iter().copied(), s.targets.iter().skip(1).copied(), scored);
            s.tokens.drain(..self.block);
            s.targets.drain(..self.block);
            s.scored.drain(..self.block);
            s.blocks += 1;
        }
        batch
    }
}

/// The training data of a run: a finite corpus or an endless generator.
pub enum TrainStreams {
    /// A finite split read as parallel streams.
    Fixed(BlockStreams),
    /// A task generator.
    Generated(GeneratedStreams),
    /// A split read one document per stream at a time (`FolderMode::Separate`).
    Rounds(RoundStreams),
}

/// Where the training data stands, saved in checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DataState {
    /// Position in a finite corpus.
    Fixed(BlockState),
    /// Generator state of each stream.
    Generated(Vec<GenStream>),
    /// Epoch and position in rounds of documents.
    Rounds(RoundState),
}

impl TrainStreams {
    /// `batch` streams of blocks of `block` tokens over a finite split, laid out as its
    /// mode says: in rounds of one document per stream for `FolderMode::Separate`,
    /// else as [`BlockStreams`].
    pub fn of_split(split: &SplitData, batch: usize, block: usize, seed: u64) -> Result<Self> {
        Ok(match split.mode {
            FolderMode::Separate => TrainStreams::Rounds(RoundStreams::new(split, batch, block, seed)?),
            FolderMode::Concat | FolderMode::Documents => {
                TrainStreams::Fixed(BlockStreams::new(split, batch, block, seed)?)
            }
        })
    }

    /// The next block of every stream.
    pub fn next_batch(&mut self) -> Batch {
        match self {
            TrainStreams::Fixed(s) => s.next_batch(),
            TrainStreams::Generated(s) => s.next_batch(),
            TrainStreams::Rounds(s) => s.next_batch(),
        }
    }

    /// How the streams read the data, when that needs saying (rounds of documents).
    pub fn describe(&self) -> Option<String> {
        match self {
            TrainStreams::Rounds(s) => Some(s.describe()),
            TrainStreams::Fixed(_) | TrainStreams::Generated(_) => None,
        }
    }

    /// The position in the data, for checkpoints.
    pub fn state(&self) -> DataState {
        match self {
            TrainStreams::Fixed(s) => DataState::Fixed(s.state()),
            TrainStreams::Generated(s) => DataState::Generated(s.streams.clone()),
            TrainStreams::Rounds(s) => DataState::Rounds(s.state()),
        }
    }

    /// Moves to a saved position. Fails when the state belongs to another kind of data
    /// or another batch size.
    pub fn restore(&mut self, state: DataState) -> Result<()> {
        match (self, state) {
            (TrainStreams::Fixed(s), DataState::Fixed(st)) if st.pos <= s.usable => {
                s.pos = st.pos;
                s.rng = st.rng;
                s.started = st.started;
                Ok(())
            }
            (TrainStreams::Generated(s), DataState::Generated(streams)) if streams.len() == s.streams.len() => {
                s.streams = streams;
                Ok(())
            }
            (TrainStreams::Rounds(s), DataState::Rounds(st)) => s.restore(st),
            _ => Err(LetheError::Invalid("the saved data position does not fit this data and batch size".into())),
        }
    }
}

/// Walks a split once as parallel streams for evaluation, block by block: streams of
/// unequal length are padded with unscored tokens once they run out; a
/// `FolderMode::Separate` split is read in rounds of one document per stream
/// ([`EvalRounds`]), the memory emptied before each (`Batch::reset`).
pub enum EvalWalker {
    /// The split as `B` streams read from start to end.
    Streams { streams: Vec<TokenSeq>, longest: usize, pos: usize },
    /// Rounds of documents.
    Rounds(EvalRounds),
}

impl EvalWalker {
    /// `batch` streams over `split` (fewer when the split is too short to give each
    /// stream two tokens, or has fewer documents to read one at a time).
    pub fn new(split: &SplitData, batch: usize) -> Result<Self> {
        if split.mode == FolderMode::Separate {
            return Ok(EvalWalker::Rounds(EvalRounds::new(split, batch)?));
        }
        let total = split.total_len();
        let batch = batch.min(total / 2).max(1);
        let streams = split.into_streams(batch);
        let longest = streams.iter().map(TokenSeq::len).max().unwrap_or(0);
        if longest < 2 {
            return Err(LetheError::data(&split.origin, format!("too short to evaluate: {total} tokens")));
        }
        Ok(EvalWalker::Streams { streams, longest, pos: 0 })
    }

    /// Number of parallel streams.
    pub fn batch(&self) -> usize {
        match self {
            EvalWalker::Streams { streams, .. } => streams.len(),
            EvalWalker::Rounds(r) => r.batch(),
        }
    }

    /// Target positions the whole walk covers (all streams, padding included).
    pub fn positions(&self) -> usize {
        match self {
            EvalWalker::Streams { streams, longest, .. } => longest.saturating_sub(1) * streams.len(),
            EvalWalker::Rounds(r) => r.positions(),
        }
    }

    /// The next block of at most `block` tokens, or `None` at the end.
    pub fn next_block(&mut self, block: usize) -> Option<Batch> {
        let (streams, longest, pos) = match self {
            EvalWalker::Streams { streams, longest, pos } => (streams, *longest, pos),
            EvalWalker::Rounds(r) => return r.next_block(block),
        };
        if *pos + 1 >= longest {
            return None;
        }
        let len = block.min(longest - 1 - *pos);
        let mut batch = Batch::with_capacity(streams.len(), len, *pos == 0);
        for s in streams.iter() {
            batch.push_from(s, *pos); // a stream that ran out: padding
        }
        *pos += len;
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::config::FolderMode;

    fn split(tokens: Vec<u8>) -> SplitData {
        SplitData {
            origin: "mem".into(),
            docs: vec![TokenSeq::bytes(&tokens, None, None)],
            mode: FolderMode::Concat,
            words: None,
        }
    }

    #[test]
    fn blocks_are_contiguous_and_targets_shift_by_one() {
        let mut s = BlockStreams::new(&split((0..40).collect()), 2, 4, 1).unwrap();
        let b1 = s.next_batch();
        assert!(b1.reset);
        assert_eq!(b1.inputs, vec![0, 1, 2, 3, 20, 21, 22, 23]);
        assert_eq!(b1.targets, vec![1, 2, 3, 4, 21, 22, 23, 24]);
        let b2 = s.next_batch();
        assert!(!b2.reset);
        assert_eq!(b2.inputs[..4], [4, 5, 6, 7]);
    }

    #[test]
    fn end_of_data_restarts_at_an_offset_below_block_with_reset() {
        let mut s = BlockStreams::new(&split((0..40).collect()), 2, 4, 1).unwrap();
        for _ in 0..4 {
            s.next_batch();
        }
        let b = s.next_batch(); // pos 16 + 5 > 20: restart
        assert!(b.reset);
        assert!(b.inputs[0] < 4, "offset {}", b.inputs[0]);
    }

    #[test]
    fn too_short_corpus_names_the_numbers() {
        let err = BlockStreams::new(&split(vec![1; 9]), 2, 4, 1).unwrap_err().to_string();
        assert!(err.contains("mem") && err.contains("too short") && err.contains("10 tokens"), "{err}");
    }

    #[test]
    fn generated_streams_carry_labels_as_targets() {
        use crate::tasks::collision::CollisionTask;
        use crate::tasks::Generator;
        use lethe_core::config::CollisionConfig;
        let cfg = CollisionConfig { steps: 30, ..CollisionConfig::default() };
        let mut streams = GeneratedStreams::new(Box::new(CollisionTask::new(&cfg)), 4, 1, 16);
        // The same episodes drawn directly from the stream's generator.
        let mut rng = Rng::derive(4, 0);
        let mut expect = TokenSeq::default();
        for _ in 0..3 {
            expect.extend(&CollisionTask::new(&cfg).episode(&mut rng));
        }
        for step in 0..40 {
            let b = streams.next_batch();
            for j in 0..16 {
                let i = step * 16 + j;
                assert_eq!(b.inputs[j], expect.tokens[i] as i64);
                assert_eq!(b.targets[j], expect.target(i + 1) as i64, "position {}", i + 1);
                assert_eq!(b.weights[j] > 0.0, expect.is_scored(i + 1));
            }
        }
    }

    #[test]
    fn eval_walker_covers_every_target_once() {
        let mut w = EvalWalker::new(&split((0..23).collect()), 2).unwrap();
        let mut targets = vec![];
        let mut scored = 0.0;
        while let Some(b) = w.next_block(4) {
            scored += b.scored();
            targets.extend(b.targets.iter().zip(&b.weights).filter(|(_, &w)| w > 0.0).map(|(&t, _)| t));
        }
        // 2 streams of 11 tokens: 10 targets each.
        assert_eq!(scored, 20.0);
        targets.sort();
        let mut expect: Vec<i64> = (1..11).chain(12..22).collect();
        expect.sort();
        assert_eq!(targets, expect);
    }
}
