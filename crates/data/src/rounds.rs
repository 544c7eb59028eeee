//! One document per stream at a time (`FolderMode::Separate`): the memory is emptied
//! before every document, as the official ∞-former dialogue code reads each
//! conversation on its own (∞-former paper §4.3, App. C.3).
//!
//! The `B` streams of a step read their documents in **rounds**: a round gives each
//! stream one document, all starting together with an empty memory; a stream whose
//! document is shorter than the round's longest reads unscored padding (token 0) until
//! the round ends. A memory is per stream, but emptying it is per batch (the
//! Compressive and ∞-former memories cannot empty one stream of a batch), so the
//! streams must start their documents together.
//!
//! Training ([`RoundStreams`]) draws the rounds anew every epoch: the documents
//! shuffled, then sorted by length within windows of [`WINDOW`] rounds so that a round's
//! documents are of similar length (little padding), then the rounds shuffled. As in
//! evaluation, a round's last block is only as long as its longest document needs (a
//! shorter block, not padding). Evaluation ([`EvalRounds`]) reads the documents in
//! their order, `B` at a time.

use serde::{Deserialize, Serialize};

use super::batch::Batch;
use super::seq::{SplitData, TokenSeq};
use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

/// Rounds per window within which training sorts the documents by length.
pub const WINDOW: usize = 16;

/// Positions of a round that have a target: the longest document's length minus one.
fn round_targets(docs: &[TokenSeq], rows: &[usize]) -> usize {
    rows.iter().map(|&i| docs[i].len().saturating_sub(1)).max().unwrap_or(0)
}

/// The rounds of the epoch that starts with `rng` (per round, the document of each
/// stream), and the generator after drawing them: the next epoch's start.
fn draw_rounds(docs: &[TokenSeq], batch: usize, rng: &Rng) -> (Vec<Vec<usize>>, Rng) {
    let mut rng = rng.clone();
    let mut order: Vec<usize> = (0..docs.len()).collect();
    rng.shuffle(&mut order);
    for window in order.chunks_mut(WINDOW * batch) {
        window.sort_by_key(|&i| std::cmp::Reverse(docs[i].len()));
    }
    let mut rounds: Vec<Vec<usize>> = order.chunks(batch).map(<[usize]>::to_vec).collect();
    rng.shuffle(&mut rounds);
    (rounds, rng)
}

/// Training streams over a split read one document per stream at a time. Never ends:
/// after the last round of an epoch the next epoch's rounds are drawn.
#[derive(Debug)]
pub struct RoundStreams {
    /// The documents that have a target (two tokens or more).
    docs: Vec<TokenSeq>,
    batch: usize,
    block: usize,
    /// The generator as the current epoch began: its rounds follow from it.
    epoch_rng: Rng,
    /// This epoch's rounds: per round, the document of each stream (fewer than `batch`
    /// in the last round when the documents do not divide evenly).
    rounds: Vec<Vec<usize>>,
    /// The generator after drawing this epoch's rounds: the next epoch's start.
    next_rng: Rng,
    round: usize,
    pos: usize,
}

/// Where [`RoundStreams`] stands, for exact resume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundState {
    epoch_rng: Rng,
    round: usize,
    pos: usize,
}

impl RoundStreams {
    /// `batch` streams of blocks of `block` tokens over the documents of `split`. Fails
    /// when no document has two tokens (nothing to predict).
    pub fn new(split: &SplitData, batch: usize, block: usize, seed: u64) -> Result<Self> {
        let docs: Vec<TokenSeq> = split.docs.iter().filter(|d| d.len() >= 2).cloned().collect();
        if docs.is_empty() {
            return Err(LetheError::data(
                &split.origin,
                format!("has no document of two tokens or more to train on ({} documents)", split.docs.len()),
            ));
        }
        let epoch_rng = Rng::derive(seed, 0x5E9A);
        let (rounds, next_rng) = draw_rounds(&docs, batch, &epoch_rng);
        Ok(RoundStreams { docs, batch, block, epoch_rng, rounds, next_rng, round: 0, pos: 0 })
    }

    /// The layout in words: rounds per epoch and the share of positions that are padding
    /// (in the current epoch).
    pub fn describe(&self) -> String {
        let targets: usize = self.docs.iter().map(|d| d.len() - 1).sum();
        let positions: usize = self.rounds.iter().map(|r| round_targets(&self.docs, r) * self.batch).sum();
        let padding = 100.0 * (1.0 - targets as f64 / positions as f64);
        format!("one document per stream at a time, the memory emptied before each: {} rounds of {} an epoch, {padding:.1}% of the positions padding", self.rounds.len(), self.batch)
    }

    /// Input positions of the current round: its longest document's targets.
    fn round_len(&self) -> usize {
        round_targets(&self.docs, &self.rounds[self.round])
    }

    /// The next block of every stream, `reset` on a round's first block; a round's last
    /// block is shorter when its longest document ends before a whole block.
    pub fn next_batch(&mut self) -> Batch {
        if self.round >= self.rounds.len() {
            self.epoch_rng = self.next_rng.clone();
            (self.rounds, self.next_rng) = draw_rounds(&self.docs, self.batch, &self.epoch_rng);
            (self.round, self.pos) = (0, 0);
        }
        let len = self.block.min(self.round_len() - self.pos);
        let mut batch = Batch::with_capacity(self.batch, len, self.pos == 0);
        let (rows, empty) = (&self.rounds[self.round], TokenSeq::default());
        for row in 0..self.batch {
            batch.push_from(rows.get(row).map_or(&empty, |&i| &self.docs[i]), self.pos);
            // none: padding
        }
        self.pos += len;
        if self.pos >= self.round_len() {
            (self.round, self.pos) = (self.round + 1, 0);
        }
        batch
    }

    /// Where the streams stand.
    pub fn state(&self) -> RoundState {
        RoundState { epoch_rng: self.epoch_rng.clone(), round: self.round, pos: self.pos }
    }

    /// Moves to a saved position. Fails when it does not fit these documents and sizes.
    pub fn restore(&mut self, state: RoundState) -> Result<()> {
        let (rounds, next_rng) = draw_rounds(&self.docs, self.batch, &state.epoch_rng);
        let round_len = rounds.get(state.round).map(|r| round_targets(&self.docs, r));
        if !round_len.is_some_and(|n| state.pos < n && state.pos.is_multiple_of(self.block)) {
            return Err(LetheError::Invalid(
                "the saved data position does not fit these documents, batch and block size".into(),
            ));
        }
        (self.epoch_rng, self.rounds, self.next_rng, self.round, self.pos) =
            (state.epoch_rng, rounds, next_rng, state.round, state.pos);
        Ok(())
    }
}

/// Evaluation over a split read one document per stream at a time: the documents in
/// their order, `B` per round.
pub struct EvalRounds {
    docs: Vec<TokenSeq>,
    batch: usize,
    round: usize,
    pos: usize,
}

impl EvalRounds {
    /// Rounds of `batch` documents of `split` (fewer streams when it has fewer documents).
    pub fn new(split: &SplitData, batch: usize) -> Result<Self> {
        if split.docs.iter().all(|d| d.len() < 2) {
            return Err(LetheError::data(
                &split.origin,
                format!("too short to evaluate: no document of two tokens or more ({} documents)", split.docs.len()),
            ));
        }
        let batch = batch.min(split.docs.len()).max(1);
        Ok(EvalRounds { docs: split.docs.clone(), batch, round: 0, pos: 0 })
    }

    /// Parallel streams.
    pub fn batch(&self) -> usize {
        self.batch
    }

    fn rounds(&self) -> usize {
        self.docs.len().div_ceil(self.batch)
    }

    /// The documents of round `r`.
    fn rows(&self, r: usize) -> std::ops::Range<usize> {
        r * self.batch..((r + 1) * self.batch).min(self.docs.len())
    }

    fn targets(&self, r: usize) -> usize {
        self.rows(r).map(|i| self.docs[i].len().saturating_sub(1)).max().unwrap_or(0)
    }

    /// Target positions the whole walk covers (all streams, padding included).
    pub fn positions(&self) -> usize {
        (0..self.rounds()).map(|r| self.targets(r) * self.batch).sum()
    }

    /// The next block of at most `block` tokens (a round's last is shorter), `reset` on
    /// a round's first block; `None` at the end.
    pub fn next_block(&mut self, block: usize) -> Option<Batch> {
        while self.round < self.rounds() && self.pos >= self.targets(self.round) {
            (self.round, self.pos) = (self.round + 1, 0);
        }
        if self.round >= self.rounds() {
            return None;
        }
        let len = block.min(self.targets(self.round) - self.pos);
        let mut batch = Batch::with_capacity(self.batch, len, self.pos == 0);
        let (rows, empty) = (self.rows(self.round), TokenSeq::default());
        for row in 0..self.batch {
            batch.push_from(rows.clone().nth(row).map_or(&empty, |i| &self.docs[i]), self.pos);
            // none: padding
        }
        self.pos += len;
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::config::FolderMode;

    /// Documents `0..n` whose tokens are `100 * (i + 1) + position`, of the given lengths.
    fn split(lengths: &[usize]) -> SplitData {
        let docs = lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| TokenSeq::all_scored((0..n).map(|p| (100 * (i + 1) + p) as _).collect()))
            .collect();
        SplitData { origin: "mem".into(), docs, mode: FolderMode::Separate, words: None }
    }

    /// The document a token belongs to (`token / 100 - 1`).
    fn doc_of(token: i64) -> usize {
        (token / 100 - 1) as usize
    }

    #[test]
    fn a_round_starts_every_stream_on_a_document_with_a_reset_and_pads_the_shorter() {
        // One round of both documents, the longer first (a window is sorted by length).
        let mut s = RoundStreams::new(&split(&[9, 5]), 2, 4, 1).unwrap();
        let b1 = s.next_batch();
        assert!(b1.reset);
        assert_eq!(b1.inputs, [100, 101, 102, 103, 200, 201, 202, 203]);
        let b2 = s.next_batch();
        assert!(!b2.reset);
        // The 5-token document's 4 targets filled the first block: its last token, then
        // padding, unscored.
        assert_eq!(b2.inputs, [104, 105, 106, 107, 204, 0, 0, 0]);
        assert_eq!(b2.targets, [105, 106, 107, 108, 0, 0, 0, 0]);
        assert_eq!(b2.weights, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        // 8 targets of the long document fill two blocks exactly: the next block starts
        // the next epoch's round, with a reset.
        let b3 = s.next_batch();
        assert!(b3.reset);
        assert_eq!(b3.inputs, b1.inputs);
    }

    #[test]
    fn a_rounds_last_block_is_as_long_as_its_longest_document_needs() {
        let mut s = RoundStreams::new(&split(&[7, 3]), 2, 4, 1).unwrap();
        let b1 = s.next_batch();
        assert!(b1.reset && b1.len == 4);
        let b2 = s.next_batch(); // the 7-token document's last 2 targets; the other: padding
        assert!(!b2.reset);
        assert_eq!(
            (b2.len, b2.inputs.clone(), b2.targets.clone(), b2.weights.clone()),
            (2, vec![104, 105, 0, 0], vec![105, 106, 0, 0], vec![1.0, 1.0, 0.0, 0.0])
        );
        assert!(s.next_batch().reset);
    }

    #[test]
    fn every_document_is_read_once_per_epoch_and_the_epochs_differ() {
        let lengths: Vec<usize> = (0..40).map(|i| 3 + i % 7).collect();
        let mut s = RoundStreams::new(&split(&lengths), 3, 4, 7).unwrap();
        let epoch = |s: &mut RoundStreams| {
            let mut seen = vec![];
            for _ in 0..s.rounds.len() {
                let b = s.next_batch();
                assert!(b.reset);
                seen.extend((0..3).map(|r| b.inputs[r * b.len]).filter(|&t| t > 0).map(doc_of));
                while s.pos > 0 {
                    assert!(!s.next_batch().reset);
                }
            }
            seen
        };
        let first = epoch(&mut s);
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, (0..40).collect::<Vec<_>>());
        let second = epoch(&mut s);
        assert_ne!(first, second);
    }

    #[test]
    fn restore_gives_the_same_blocks_and_refuses_a_position_that_does_not_fit() {
        let lengths: Vec<usize> = (0..20).map(|i| 5 + i % 4).collect();
        let mut a = RoundStreams::new(&split(&lengths), 2, 3, 9).unwrap();
        for _ in 0..37 {
            a.next_batch(); // into the second epoch
        }
        let state = a.state();
        let mut b = RoundStreams::new(&split(&lengths), 2, 3, 9).unwrap();
        b.restore(state.clone()).unwrap();
        for _ in 0..30 {
            assert_eq!(a.next_batch(), b.next_batch());
        }
        let mut c = RoundStreams::new(&split(&lengths[..2]), 2, 3, 9).unwrap();
        let before = c.state();
        assert!(c.restore(RoundState { round: 5, ..state }).is_err());
        assert_eq!(c.state(), before);
    }

    #[test]
    fn evaluation_reads_the_documents_in_order_and_each_round_ends_with_its_longest() {
        let mut w = EvalRounds::new(&split(&[3, 6, 2]), 2).unwrap();
        assert_eq!(w.positions(), 5 * 2 + 2); // (longest targets) x streams per round
        let b1 = w.next_block(4).unwrap();
        assert!(b1.reset);
        assert_eq!(b1.inputs, [100, 101, 102, 0, 200, 201, 202, 203]);
        assert_eq!(b1.weights, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
        let b2 = w.next_block(4).unwrap();
        assert!(!b2.reset && b2.len == 1);
        assert_eq!(b2.targets, [0, 205]);
        let b3 = w.next_block(4).unwrap();
        assert!(b3.reset && b3.len == 1);
        assert_eq!(
            (b3.inputs.clone(), b3.targets.clone(), b3.weights.clone()),
            (vec![300, 0], vec![301, 0], vec![1.0, 0.0])
        );
        assert!(w.next_block(4).is_none());
    }

    #[test]
    fn documents_without_a_target_are_an_error_naming_the_split() {
        let err = RoundStreams::new(&split(&[1, 0]), 2, 4, 1).unwrap_err().to_string();
        assert!(err.contains("mem") && err.contains("two tokens"), "{err}");
        assert!(EvalRounds::new(&split(&[1]), 2).is_err());
    }
}
