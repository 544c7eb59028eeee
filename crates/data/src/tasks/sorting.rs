//! Sorting by frequency (∞-former paper, section 4.1; docs/design/algorithms.md, Tasks): a long
//! sequence of symbols whose distribution drifts, then the symbols in decreasing order
//! of how often they occurred. To answer, a model must keep counts over the whole
//! sequence, which is longer than any short-term memory.
//!
//! - Symbol `j` of a sequence of length `T` is drawn from `(1 - r) p0 + r p1` with
//!   `r = (j + 1) / T`, where `p0` and `p1` are drawn per episode, uniformly from the
//!   simplex (normalised exponentials).
//! - Then the separator `|` and the `symbols` symbols sorted by decreasing count (ties:
//!   alphabetical), then a newline. Only those sorted symbols are scored.
//! - Symbols are the letters `a`, `b`, ... (20 in the paper).

use crate::seq::TokenSeq;
use lethe_core::config::{DataConfig, SortingConfig};
use lethe_core::rng::Rng;

use super::Generator;
use crate::task::spec::{Metric, Task};

/// Marks the end of the sequence: the sorted symbols follow.
pub const SEPARATOR: u8 = b'|';

/// The sorting task with its parameters.
#[derive(Clone, Debug)]
pub struct SortingTask {
    cfg: SortingConfig,
}

impl SortingTask {
    /// The task with `cfg`'s parameters.
    pub fn new(cfg: &SortingConfig) -> Self {
        SortingTask { cfg: cfg.clone() }
    }

    /// A distribution drawn uniformly from the simplex.
    fn simplex(&self, rng: &mut Rng) -> Vec<f64> {
        let e: Vec<f64> = (0..self.cfg.symbols).map(|_| -(rng.uniform().max(1e-300)).ln()).collect();
        let total: f64 = e.iter().sum();
        e.into_iter().map(|x| x / total).collect()
    }

    /// The sequence (symbol indices) of one episode.
    pub fn sequence(&self, rng: &mut Rng) -> Vec<usize> {
        let (p0, p1) = (self.simplex(rng), self.simplex(rng));
        let t = self.cfg.length;
        (0..t)
            .map(|j| {
                let r = (j + 1) as f64 / t as f64;
                let weights: Vec<f32> = p0.iter().zip(&p1).map(|(a, b)| ((1.0 - r) * a + r * b) as f32).collect();
                rng.categorical(&weights)
            })
            .collect()
    }
}

/// The symbols in decreasing order of count in `seq`; ties in alphabetical order.
pub fn by_frequency(seq: &[usize], symbols: usize) -> Vec<usize> {
    let mut counts = vec![0usize; symbols];
    seq.iter().for_each(|&s| counts[s] += 1);
    let mut order: Vec<usize> = (0..symbols).collect();
    order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
    order
}

impl Generator for SortingTask {
    fn episode(&self, rng: &mut Rng) -> TokenSeq {
        let seq = self.sequence(rng);
        let answer = by_frequency(&seq, self.cfg.symbols);
        let letter = |s: usize| b'a' + s as u8;
        let mut tokens: Vec<u8> = seq.iter().map(|&s| letter(s)).collect();
        tokens.push(SEPARATOR);
        let question_len = tokens.len();
        tokens.extend(answer.iter().map(|&s| letter(s)));
        tokens.push(b'\n');
        let scored = (0..tokens.len()).map(|i| i >= question_len && i < tokens.len() - 1).collect();
        TokenSeq::bytes(&tokens, Some(scored), None)
    }

    fn longest_episode(&self) -> (u64, &'static str) {
        ((self.cfg.length as u64).saturating_add(self.cfg.symbols as u64).saturating_add(2), "data.sorting.length")
    }
}

/// The sorting task in the registry ([`crate::task::of`]).
pub struct SortingSpec;

impl Task for SortingSpec {
    fn name(&self) -> &'static str {
        "sorting"
    }

    fn describe(&self, d: &DataConfig) -> String {
        format!(
            "sorting by frequency, {} symbols, sequences of {}; only the sorted symbols scored",
            d.sorting.symbols, d.sorting.length
        )
    }

    fn metric(&self) -> Metric {
        Metric::Accuracy
    }

    /// The symbols to sort per sequence.
    fn set_length(&self, d: &mut DataConfig, n: usize) -> bool {
        d.sorting.length = n;
        true
    }

    fn generator(&self, d: &DataConfig) -> Option<(Box<dyn Generator>, usize)> {
        Some((Box::new(SortingTask::new(&d.sorting)), d.sorting.eval_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_the_symbols_by_decreasing_count() {
        assert_eq!(by_frequency(&[2, 0, 2, 1, 2, 0], 4), vec![2, 0, 1, 3]);
        let task = SortingTask::new(&SortingConfig { symbols: 5, length: 50, eval_tokens: 100 });
        let ep = task.episode(&mut Rng::new(3));
        assert_eq!(ep.len(), 50 + 1 + 5 + 1);
        assert_eq!(ep.tokens[50], u32::from(SEPARATOR));
        let seq: Vec<usize> = ep.tokens[..50].iter().map(|&t| (t - u32::from(b'a')) as usize).collect();
        let answer: Vec<usize> = ep.tokens[51..56].iter().map(|&t| (t - u32::from(b'a')) as usize).collect();
        assert_eq!(answer, by_frequency(&seq, 5));
        let scored: Vec<usize> = (0..ep.len()).filter(|&i| ep.is_scored(i)).collect();
        assert_eq!(scored, (51..56).collect::<Vec<_>>(), "only the sorted symbols are scored");
    }

    #[test]
    fn the_distribution_drifts_from_p0_to_p1() {
        // Over many episodes, symbols frequent at the start and at the end of a sequence
        // differ: the correlation of early and late counts is far below that of two
        // halves of the start.
        let task = SortingTask::new(&SortingConfig { symbols: 4, length: 2000, eval_tokens: 100 });
        let mut rng = Rng::new(9);
        let (mut same, mut across) = (0.0, 0.0);
        for _ in 0..50 {
            let seq = task.sequence(&mut rng);
            let count = |part: &[usize]| {
                let mut c = [0.0f64; 4];
                part.iter().for_each(|&s| c[s] += 1.0);
                c
            };
            let (a, b, z) = (count(&seq[..100]), count(&seq[100..200]), count(&seq[1900..]));
            let dist = |x: &[f64; 4], y: &[f64; 4]| x.iter().zip(y).map(|(p, q)| (p - q).abs()).sum::<f64>();
            same += dist(&a, &b);
            across += dist(&a, &z);
        }
        assert!(across > 2.0 * same, "start-to-end change {across} vs start-to-start {same}");
    }
}
