//! The long-context suite as a training source (`data.source = "longctx"`): each episode
//! is one sample of a task and length drawn from `data.longctx`, at a uniform depth,
//! followed by its answer (` 41234.`); only the answer is scored, so the model learns
//! to find and repeat what was hidden, at the lengths it is trained on, to be measured
//! by `lethe longeval` far beyond them. With `curriculum_steps`, the lengths join one by
//! one, shortest first, as BABILong's authors advise training on it. The samples are in
//! bytes, or in the tokens of `data.tokenizer` when the run names one (the lengths then
//! count tokens).

use lethe_core::config::{DataConfig, LongctxConfig};
use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

use super::tasks::{check_length, generate, Spec, TASKS};
use super::units::{ByteUnits, Units};
use crate::seq::TokenSeq;
use crate::task::spec::{Metric, Task};
use crate::tasks::Generator;
use crate::tokenizer::Tokenizer;

/// The suite's episodes, as `cfg` sets them.
pub struct LongctxTask {
    /// Bytes, or a tokenizer's tokens.
    units: Box<dyn Units + Send>,
    tasks: Vec<&'static str>,
    /// Shortest first.
    lengths: Vec<usize>,
    curriculum_steps: usize,
    train_on_context: bool,
}

impl LongctxTask {
    /// The task of `cfg` in bytes; an unknown task name, or a length too short for a
    /// task, is refused naming the field.
    pub fn new(cfg: &LongctxConfig) -> Result<Self> {
        Self::in_units(cfg, Box::new(ByteUnits))
    }

    /// The task of `cfg` in `units` (bytes, or a tokenizer's tokens).
    pub fn in_units(cfg: &LongctxConfig, units: Box<dyn Units + Send>) -> Result<Self> {
        let mut tasks = Vec::new();
        for name in &cfg.tasks {
            let Some(&task) = TASKS.iter().find(|t| **t == name.as_str()) else {
                return Err(LetheError::config(
                    "data.longctx.tasks",
                    name,
                    format!("unknown task; known: {}", TASKS.join(", ")),
                ));
            };
            tasks.push(task);
        }
        let mut lengths = cfg.lengths.clone();
        lengths.sort_unstable();
        lengths.dedup();
        let shortest = lengths.first().copied().unwrap_or(0);
        check_length(&tasks, shortest, units.as_ref(), None)
            .map_err(|e| LetheError::config("data.longctx.lengths", shortest, e.to_string()))?;
        Ok(LongctxTask {
            units,
            tasks,
            lengths,
            curriculum_steps: cfg.curriculum_steps,
            train_on_context: cfg.train_on_context,
        })
    }

    /// The lengths a training stream draws from at `step`: all of them, or with a
    /// curriculum the shortest `step / curriculum_steps + 1`.
    pub fn lengths_at(&self, step: u64) -> &[usize] {
        let reached = match self.curriculum_steps {
            0 => self.lengths.len(),
            per_stage => usize::try_from(step / per_stage as u64).map_or(usize::MAX, |s| s.saturating_add(1)),
        };
        &self.lengths[..reached.min(self.lengths.len())]
    }

    /// A sample of a random task at one of `lengths`, and its answer: the answer alone
    /// scored, or every byte with `context`.
    fn sample(&self, lengths: &[usize], context: bool, rng: &mut Rng) -> TokenSeq {
        let task = self.tasks[rng.range(0, self.tasks.len() - 1)];
        let length = lengths[rng.range(0, lengths.len() - 1)];
        let spec = Spec { length, depth: rng.uniform(), text: None };
        // `new` generated every task at the shortest length: no sample fails here.
        let Ok(sample) = generate(task, &spec, self.units.as_ref(), rng) else { return TokenSeq::default() };
        let Ok(answer) = self.units.encode(&format!(" {}.", sample.answers.join(", "))) else {
            return TokenSeq::default();
        };
        let asked = sample.input.len();
        let mut tokens = sample.input;
        tokens.extend(answer);
        let scored = (0..tokens.len()).map(|i| context || i >= asked).collect();
        TokenSeq { tokens, scored: Some(scored), labels: None }
    }
}

impl std::fmt::Debug for LongctxTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LongctxTask").field("tasks", &self.tasks).field("lengths", &self.lengths).finish()
    }
}

impl Generator for LongctxTask {
    fn episode(&self, rng: &mut Rng) -> TokenSeq {
        self.sample(&self.lengths, false, rng)
    }

    /// Training's episodes: the curriculum's lengths, every byte scored with
    /// `train_on_context`.
    fn episode_at(&self, rng: &mut Rng, step: u64) -> TokenSeq {
        self.sample(self.lengths_at(step), self.train_on_context, rng)
    }

    fn longest_episode(&self) -> (u64, &'static str) {
        let longest = self.lengths.iter().copied().max().unwrap_or(0) as u64;
        (longest.saturating_add(ANSWER_ROOM), "data.longctx.lengths")
    }
}

/// Bytes an answer can take beyond the sample (cwe's ten words, four UUIDs, with their
/// commas).
const ANSWER_ROOM: u64 = 10 * 40;

/// The suite in the registry ([`crate::task::of`]).
pub struct LongctxSpec;

impl Task for LongctxSpec {
    fn name(&self) -> &'static str {
        "longctx"
    }

    fn describe(&self, d: &DataConfig) -> String {
        let unit = if d.tokenizer.is_some() { "tokens" } else { "bytes" };
        format!("long-context suite ({}), lengths {:?} {unit}", d.longctx.tasks.join(", "), d.longctx.lengths)
    }

    fn metric(&self) -> Metric {
        Metric::Answers
    }

    fn generator(&self, d: &DataConfig) -> Option<(Box<dyn Generator>, usize)> {
        self.checked_generator(d).ok()
    }

    /// Unknown task names and lengths too short for a task are refused naming the field;
    /// with `data.tokenizer`, the samples are in its tokens.
    fn checked_generator(&self, d: &DataConfig) -> Result<(Box<dyn Generator>, usize)> {
        let units: Box<dyn Units + Send> = match &d.tokenizer {
            Some(dir) => Box::new(Tokenizer::from_dir(dir)?),
            None => Box::new(ByteUnits),
        };
        Ok((Box::new(LongctxTask::in_units(&d.longctx, units)?), d.longctx.eval_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokenised_episode_counts_its_length_in_tokens() {
        let corpus = format!("{} The pass key is 12345. What is the pass key?", super::super::haystack::NOISE);
        let tokenizer = Tokenizer::train_bpe(&[corpus.as_str()], 300).unwrap();
        let cfg = LongctxConfig { tasks: vec!["passkey".into()], lengths: vec![260], ..LongctxConfig::default() };
        let task =
            LongctxTask::in_units(&cfg, Box::new(Tokenizer::train_bpe(&[corpus.as_str()], 300).unwrap())).unwrap();
        let ep = task.episode(&mut Rng::new(3));
        let answer: Vec<_> = (0..ep.len()).filter(|&i| ep.is_scored(i)).map(|i| ep.tokens[i]).collect();
        assert_eq!(ep.len(), 260 + answer.len());
        let key = Units::decode(&tokenizer, &answer).unwrap();
        let text = Units::decode(&tokenizer, &ep.tokens[..260]).unwrap();
        assert!(text.contains(&format!("The pass key is {}.", key.trim().trim_end_matches('.'))), "{text} / {key}");
    }

    #[test]
    fn an_episode_is_a_sample_and_its_scored_answer() {
        let cfg = LongctxConfig { tasks: vec!["passkey".into()], lengths: vec![300], ..LongctxConfig::default() };
        let ep = LongctxTask::new(&cfg).unwrap().episode(&mut Rng::new(2));
        let text = String::from_utf8(crate::bytes_of(&ep.tokens)).unwrap();
        let scored: String = text.chars().enumerate().filter(|&(i, _)| ep.is_scored(i)).map(|(_, c)| c).collect();
        assert_eq!(ep.len(), 300 + scored.len());
        let key = scored.trim().trim_end_matches('.');
        assert_eq!(key.len(), 5, "{scored}");
        assert!(text[..300].contains(&format!("The pass key is {key}.")), "{text}");
        assert!(text[..300].ends_with("The pass key is"));
    }

    #[test]
    fn unknown_tasks_and_too_short_lengths_name_the_field() {
        let cfg = LongctxConfig {
            tasks: vec!["passkey".into(), "nope".into()],
            lengths: vec![300],
            ..LongctxConfig::default()
        };
        let err = LongctxTask::new(&cfg).unwrap_err().to_string();
        assert!(err.contains("data.longctx.tasks") && err.contains("nope") && err.contains("niah_single_1"), "{err}");
        let cfg = LongctxConfig {
            tasks: vec!["niah_multiquery".into()],
            lengths: vec![100, 900],
            ..LongctxConfig::default()
        };
        let err = LongctxTask::new(&cfg).unwrap_err().to_string();
        assert!(err.contains("data.longctx.lengths") && err.contains("the shortest is"), "{err}");
    }

    #[test]
    fn a_curriculum_adds_the_lengths_one_by_one_shortest_first() {
        let cfg = LongctxConfig {
            tasks: vec!["passkey".into()],
            lengths: vec![700, 300, 500],
            curriculum_steps: 10,
            ..LongctxConfig::default()
        };
        let task = LongctxTask::new(&cfg).unwrap();
        assert_eq!(task.lengths_at(0), &[300]);
        assert_eq!(task.lengths_at(9), &[300]);
        assert_eq!(task.lengths_at(10), &[300, 500]);
        assert_eq!(task.lengths_at(25), &[300, 500, 700]);
        assert_eq!(task.lengths_at(u64::MAX), &[300, 500, 700]);
        // Early episodes are all of the shortest length; plain episodes of every one.
        let mut rng = Rng::new(1);
        let answer = |ep: &TokenSeq| (0..ep.len()).filter(|&i| ep.is_scored(i)).count();
        for _ in 0..20 {
            let ep = task.episode_at(&mut rng, 3);
            assert_eq!(ep.len() - answer(&ep), 300);
        }
        let mut seen: Vec<usize> = (0..60).map(|_| task.episode(&mut rng)).map(|ep| ep.len() - answer(&ep)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, vec![300, 500, 700]);
        let off = LongctxTask::new(&LongctxConfig { curriculum_steps: 0, ..cfg.clone() }).unwrap();
        assert_eq!(off.lengths_at(0), &[300, 500, 700]);
    }

    #[test]
    fn training_on_the_context_scores_every_byte_and_validation_the_answer() {
        let cfg = LongctxConfig { tasks: vec!["passkey".into()], lengths: vec![300], ..LongctxConfig::default() };
        let task = LongctxTask::new(&LongctxConfig { train_on_context: true, ..cfg }).unwrap();
        let train = task.episode_at(&mut Rng::new(1), 0);
        assert!((0..train.len()).all(|i| train.is_scored(i)));
        let valid = task.episode(&mut Rng::new(1));
        assert_eq!((0..valid.len()).filter(|&i| valid.is_scored(i)).count(), valid.len() - 300);
    }
}
