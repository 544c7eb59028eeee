//! The long-context suite as a training source (`data.source = "longctx"`): each episode
//! is one sample of a task and length drawn from `data.longctx`, at a uniform depth,
//! followed by its answer (` 41234.`); only the answer is scored, so the model learns
//! to find and repeat what was hidden, at the lengths it is trained on, to be measured
//! by `lethe longeval` far beyond them. Bytes only.

use lethe_core::config::{DataConfig, LongctxConfig};
use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

use super::tasks::{generate, Spec, TASKS};
use super::units::ByteUnits;
use crate::seq::TokenSeq;
use crate::task::spec::{Metric, Task};
use crate::tasks::Generator;

/// The suite's episodes, as `cfg` sets them.
#[derive(Clone, Debug)]
pub struct LongctxTask {
    tasks: Vec<&'static str>,
    lengths: Vec<usize>,
}

impl LongctxTask {
    /// The task of `cfg`; an unknown task name, or a length too short for a task, is
    /// refused naming the field.
    pub fn new(cfg: &LongctxConfig) -> Result<Self> {
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
        let shortest = cfg.lengths.iter().copied().min().unwrap_or(0);
        for &task in &tasks {
            let spec = Spec { length: shortest, depth: 0.5, text: None };
            generate(task, &spec, &ByteUnits, &mut Rng::new(0))
                .map_err(|e| LetheError::config("data.longctx.lengths", shortest, e.to_string()))?;
        }
        Ok(LongctxTask { tasks, lengths: cfg.lengths.clone() })
    }
}

impl Generator for LongctxTask {
    fn episode(&self, rng: &mut Rng) -> TokenSeq {
        let task = self.tasks[rng.range(0, self.tasks.len() - 1)];
        let length = self.lengths[rng.range(0, self.lengths.len() - 1)];
        let spec = Spec { length, depth: rng.uniform(), text: None };
        // `new` generated every task at the shortest length: no sample fails here.
        let Ok(sample) = generate(task, &spec, &ByteUnits, rng) else { return TokenSeq::default() };
        let answer = format!(" {}.", sample.answers.join(", "));
        let mut bytes: Vec<u8> = sample.input.iter().map(|&u| u as u8).collect();
        let asked = bytes.len();
        bytes.extend_from_slice(answer.as_bytes());
        let scored = (0..bytes.len()).map(|i| i >= asked).collect();
        TokenSeq::bytes(&bytes, Some(scored), None)
    }

    fn longest_episode(&self) -> (u64, &'static str) {
        let longest = self.lengths.iter().copied().max().unwrap_or(0) as u64;
        (longest.saturating_add(ANSWER_ROOM), "data.longctx.lengths")
    }
}

/// Bytes an answer can take beyond the sample (four UUIDs and their commas).
const ANSWER_ROOM: u64 = 4 * 38 + 2;

/// The suite in the registry ([`crate::task::of`]).
pub struct LongctxSpec;

impl Task for LongctxSpec {
    fn name(&self) -> &'static str {
        "longctx"
    }

    fn describe(&self, d: &DataConfig) -> String {
        format!("long-context suite ({}), lengths {:?} bytes", d.longctx.tasks.join(", "), d.longctx.lengths)
    }

    fn metric(&self) -> Metric {
        Metric::Answers
    }

    fn generator(&self, d: &DataConfig) -> Option<(Box<dyn Generator>, usize)> {
        self.checked_generator(d).ok()
    }

    /// Unknown task names and lengths too short for a task are refused naming the field.
    fn checked_generator(&self, d: &DataConfig) -> Result<(Box<dyn Generator>, usize)> {
        Ok((Box::new(LongctxTask::new(&d.longctx)?), d.longctx.eval_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_is_a_sample_and_its_scored_answer() {
        let cfg = LongctxConfig { tasks: vec!["passkey".into()], lengths: vec![300], eval_tokens: 1000 };
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
        let cfg = LongctxConfig { tasks: vec!["passkey".into(), "nope".into()], lengths: vec![300], eval_tokens: 1000 };
        let err = LongctxTask::new(&cfg).unwrap_err().to_string();
        assert!(err.contains("data.longctx.tasks") && err.contains("nope") && err.contains("niah_single_1"), "{err}");
        let cfg = LongctxConfig { tasks: vec!["niah_multiquery".into()], lengths: vec![100, 900], eval_tokens: 1000 };
        let err = LongctxTask::new(&cfg).unwrap_err().to_string();
        assert!(err.contains("data.longctx.lengths") && err.contains("the shortest is"), "{err}");
    }
}
