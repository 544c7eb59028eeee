//! lethe-data: token sequences, the three splits of a corpus or task, and the parallel
//! streams that feed the model `B` blocks of `M` tokens at a time.
//!
//! The byte sources and synthetic tasks yield bytes (vocabulary 256); tokenised text
//! yields the ids of its tokenizer's vocabulary ([`Token`]). A sequence may flag which tokens are
//! scored: predicting a flagged token counts in the loss and the metrics, the others are
//! context only (the copy task scores only its answers; byte corpora score everything).
//! A sequence may also carry labels: the target at a position is then the label, not
//! the next input (the collision task's answer is a quadrant, not the next token).
//!
//! [`task`] is the registry of tasks (each a file here: [`tasks`] for the generated ones,
//! [`bytes`], [`text`] and [`dialogue`] for corpora, [`gridworld`] for the environments);
//! [`longctx`] generates the long-context evaluation samples (passkey, RULER's needles).

pub mod batch;
pub mod bytes;
pub mod dialogue;
pub mod gridworld;
pub mod longctx;
pub mod rounds;
pub mod seq;
pub mod stream;
pub mod task;
pub mod tasks;
pub mod text;
pub mod tokenizer;

pub use batch::Batch;
pub use seq::{bytes_of, Split, SplitData, Token, TokenSeq};
pub use stream::{BlockStreams, EvalWalker, TrainStreams};

/// Entropy in nats of the unigram distribution of the scored tokens of `seqs`: the loss
/// of the best model that ignores context.
pub fn unigram_entropy(seqs: &[TokenSeq]) -> f64 {
    let mut counts: std::collections::BTreeMap<Token, u64> = std::collections::BTreeMap::new(); // ordered: a fixed sum order
    for s in seqs {
        for i in 0..s.len() {
            if s.is_scored(i) {
                *counts.entry(s.target(i)).or_default() += 1;
            }
        }
    }
    let total: u64 = counts.values().sum();
    counts
        .values()
        .map(|&c| {
            let p = c as f64 / total as f64;
            -p * p.ln()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::config::FolderMode;

    #[test]
    fn concat_cuts_equal_streams_and_documents_stay_whole() {
        let docs =
            vec![TokenSeq::all_scored(vec![1; 5]), TokenSeq::all_scored(vec![2; 3]), TokenSeq::all_scored(vec![3; 4])];
        let mut split = SplitData { origin: "t".into(), docs, mode: FolderMode::Concat, words: None };
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
