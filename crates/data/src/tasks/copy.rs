//! The copy task of the Expire-Span paper (section 5.3, Table 1): a run of `A`s far in
//! the past; the rest are `B`s; the model must reproduce how many `A`s it saw.
//!
//! One episode is `A^n B^d = a^n .` with `n ~ U[count_min, count_max]` and
//! `d ~ U[distance_min, distance_max]` (up to 128k). Only the answer `a^n .` is scored:
//! to get it right the model must count a run that lies `d + 1` tokens back.
//!
//! The paper does not give the format. The answer is written in its own symbol `a`
//! rather than `A`, so that the run and the answer are told apart by content; with `A`
//! in both, a 1-layer model at 400 steps reached 79.6% token accuracy against 96.4%
//! with `a` (distances 6-12, counts 1-4), because it must otherwise separate its own
//! answer from the run by position.

use crate::seq::TokenSeq;
use crate::task::spec::{Metric, Task};
use lethe_core::config::{CopyConfig, DataConfig};
use lethe_core::rng::Rng;

use super::Generator;

/// The symbol of the run to copy.
pub const RUN: u8 = b'A';
/// The symbol of the answer: one per `A` of the run.
pub const COPY: u8 = b'a';
/// The filler symbol.
pub const FILL: u8 = b'B';
/// Marks the question: the answer follows.
pub const ASK: u8 = b'=';
/// Ends the answer.
pub const END: u8 = b'.';

/// The copy task with its parameters.
#[derive(Clone, Debug)]
pub struct CopyTask {
    cfg: CopyConfig,
}

impl CopyTask {
    /// The task with `cfg`'s counts and distances.
    pub fn new(cfg: &CopyConfig) -> Self {
        CopyTask { cfg: cfg.clone() }
    }
}

impl Generator for CopyTask {
    fn episode(&self, rng: &mut Rng) -> TokenSeq {
        let n = rng.range(self.cfg.count_min, self.cfg.count_max);
        let d = rng.range(self.cfg.distance_min, self.cfg.distance_max);
        let mut tokens = Vec::with_capacity(2 * n + d + 2);
        tokens.extend(std::iter::repeat_n(RUN, n));
        tokens.extend(std::iter::repeat_n(FILL, d));
        tokens.push(ASK);
        let question_len = tokens.len();
        tokens.extend(std::iter::repeat_n(COPY, n));
        tokens.push(END);
        let scored = (0..tokens.len()).map(|i| i >= question_len).collect();
        TokenSeq::bytes(&tokens, Some(scored), None)
    }

    fn longest_episode(&self) -> (u64, &'static str) {
        let (n, d) = (self.cfg.count_max as u64, self.cfg.distance_max as u64);
        let field = if n.saturating_mul(2) >= d { "data.copy.count_max" } else { "data.copy.distance_max" };
        (n.saturating_mul(2).saturating_add(d).saturating_add(2), field)
    }
}

/// The copy task in the registry ([`crate::task::of`]).
pub struct CopySpec;

impl Task for CopySpec {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn describe(&self, d: &DataConfig) -> String {
        let c = &d.copy;
        format!("copy task, counts {}-{}, distances {}-{}", c.count_min, c.count_max, c.distance_min, c.distance_max)
    }

    fn metric(&self) -> Metric {
        Metric::Answers
    }

    /// The most `A`s in a run.
    fn set_length(&self, d: &mut DataConfig, n: usize) -> bool {
        d.copy.count_max = n;
        true
    }

    /// The filler tokens between the run and the question.
    fn set_distance(&self, d: &mut DataConfig, min: usize, max: usize) -> bool {
        (d.copy.distance_min, d.copy.distance_max) = (min, max);
        true
    }

    fn generator(&self, d: &DataConfig) -> Option<(Box<dyn Generator>, usize)> {
        Some((Box::new(CopyTask::new(&d.copy)), d.copy.eval_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episode_has_the_run_the_gap_and_a_scored_answer_of_the_same_length() {
        let cfg = CopyConfig { count_min: 3, count_max: 3, distance_min: 5, distance_max: 5, eval_tokens: 10 };
        let ep = CopyTask::new(&cfg).episode(&mut Rng::new(1));
        assert_eq!(crate::bytes_of(&ep.tokens), b"AAABBBBB=aaa.".to_vec());
        let scored: Vec<usize> = (0..ep.len()).filter(|&i| ep.is_scored(i)).collect();
        assert_eq!(scored, vec![9, 10, 11, 12]);
    }

    #[test]
    fn counts_and_distances_cover_their_ranges() {
        let cfg = CopyConfig { count_min: 1, count_max: 4, distance_min: 10, distance_max: 13, eval_tokens: 10 };
        let task = CopyTask::new(&cfg);
        let mut rng = Rng::new(3);
        let (mut counts, mut gaps) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
        for _ in 0..200 {
            let ep = task.episode(&mut rng);
            let n = ep.tokens.iter().take_while(|&&t| t == u32::from(RUN)).count();
            let d = ep.tokens.iter().filter(|&&t| t == u32::from(FILL)).count();
            assert_eq!(ep.len(), 2 * n + d + 2);
            counts.insert(n);
            gaps.insert(d);
        }
        assert_eq!(counts.into_iter().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        assert_eq!(gaps.into_iter().collect::<Vec<_>>(), vec![10, 11, 12, 13]);
    }

    #[test]
    fn eval_splits_are_fixed_and_differ_between_valid_and_test() {
        use crate::seq::Split;
        let cfg = lethe_core::config::Config::default();
        let a = CopySpec.load_split(&cfg, Split::Valid, 4).unwrap();
        let b = CopySpec.load_split(&cfg, Split::Valid, 4).unwrap();
        let c = CopySpec.load_split(&cfg, Split::Test, 4).unwrap();
        assert_eq!(a.docs, b.docs);
        assert_ne!(a.docs, c.docs);
        assert!(a.total_len() >= cfg.data.copy.eval_tokens);
    }
}
