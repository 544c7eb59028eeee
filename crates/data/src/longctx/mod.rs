//! Long-context samples as the field measures memory today, generated offline and seeded:
//! passkey retrieval (Mohtashami & Jaggi, 2023), RULER's needle-in-a-haystack tasks
//! (Hsieh et al., 2024: single, multi-key, multi-value, multi-query), its variable
//! tracking and its common- and frequent-words extraction, and BABILong's reasoning
//! over bAbI facts (Kuratov et al., 2024: qa1-qa5), each fact placed at a requested depth
//! of a context of a requested length (or, for the tasks without one, spread over it),
//! counted in the model's own units (bytes for a byte model, tokens through the run's
//! tokenizer otherwise).
//!
//! A sample is the instruction, the haystack with its needles, and the question ending
//! in the answer's prefix ("... The pass key is"); the model continues it, and the
//! continuation is scored by string match against the expected answers, as RULER and
//! BABILong score them ([`score`]).
//!
//! - [`units`]: the model's units ([`ByteUnits`], or a tokenizer);
//! - [`haystack`]: the filler the needles hide in (RULER's repeated noise sentences,
//!   random digits, a text the user gives, or distractor needles);
//! - [`assemble`]: fits the pieces to the exact length and places each needle at its
//!   depth, on a sentence boundary;
//! - [`lists`]: RULER's word-extraction tasks, whose context is a list;
//! - [`babi`]: bAbI's world simulator and its five first tasks;
//! - [`tasks`]: the tasks by name ([`TASKS`], [`generate`]);
//! - [`source`]: the tasks as a training source (`data.source = "longctx"`).
//!
//! Where lethe differs from RULER: lengths are exact rather than "at most" (the haystack
//! is cut to the unit, not grown in steps of 25 sentences), the queried needle sits at the
//! requested depth rather than at a random one (the distractors are placed at random),
//! and RULER's Paul Graham essays are whatever text `--haystack FILE` names (nothing is
//! downloaded; without a file the essay tasks use the noise haystack).

pub mod assemble;
pub mod babi;
pub mod haystack;
pub mod lists;
pub mod source;
pub mod tasks;
pub mod units;

pub use assemble::{assemble, assemble_list, List, Needle, Pieces};
pub use haystack::Haystack;
pub use tasks::{check_length, generate, takes_depth, Spec, TASKS};
pub use units::{ByteUnits, Units};

use crate::seq::Token;

/// One generated sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The task's name, as [`TASKS`] lists it.
    pub task: &'static str,
    /// Instruction, haystack with needles, question and answer prefix, in the model's
    /// units: exactly the requested length.
    pub input: Vec<Token>,
    /// What the continuation must contain (case-insensitive string match).
    pub answers: Vec<String>,
    /// How the answers are scored.
    pub scoring: Scoring,
    /// The requested depth in [0, 1] of the queried needle.
    pub depth: f64,
    /// Where the queried needle starts, in units from the start of `input`.
    pub needle_at: usize,
    /// The haystack's span in `input`: `[start, end)`, needles included.
    pub haystack: (usize, usize),
}

/// RULER's two string-match scores, and BABILong's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// The fraction of the answers that the continuation contains (RULER's
    /// `string_match_all`, for the needle tasks).
    All,
    /// 1 if the continuation contains any answer (RULER's `string_match_part`, for
    /// question answering).
    Part,
    /// 1 if the continuation's first sentence names an answer and none of these other
    /// labels of the task (BABILong's `compare_answers`: the labels the question names
    /// are left out of the list, as they never answer it).
    Only(Vec<String>),
}

/// The score in [0, 1] of `continuation` against `answers`, case-insensitive.
pub fn score(continuation: &str, answers: &[String], scoring: &Scoring) -> f64 {
    if answers.is_empty() {
        return 0.0;
    }
    let said = continuation.to_lowercase();
    let names = |label: &String| said.contains(&label.to_lowercase());
    let found = answers.iter().filter(|a| names(a)).count();
    match scoring {
        Scoring::All => found as f64 / answers.len() as f64,
        Scoring::Part => f64::from(u8::from(found > 0)),
        Scoring::Only(others) => {
            let first = said.split('.').next().unwrap_or("");
            let names = |label: &String| first.contains(&label.to_lowercase());
            f64::from(u8::from(answers.iter().any(names) && !others.iter().any(names)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn string_match_all_counts_the_answers_found() {
        let a = answers(&["1234567", "7654321", "Tame-Fox"]);
        assert_eq!(score(" 1234567 and tame-fox.", &a, &Scoring::All), 2.0 / 3.0);
        assert_eq!(score("nothing", &a, &Scoring::All), 0.0);
        assert_eq!(score("7654321 1234567 TAME-FOX", &a, &Scoring::All), 1.0);
    }

    #[test]
    fn string_match_part_needs_one_answer() {
        let a = answers(&["kitchen", "garden"]);
        assert_eq!(score("in the Garden", &a, &Scoring::Part), 1.0);
        assert_eq!(score("in the hall", &a, &Scoring::Part), 0.0);
        assert_eq!(score("anything", &[], &Scoring::Part), 0.0);
    }

    #[test]
    fn only_needs_the_answer_alone_in_the_first_sentence() {
        let a = answers(&["kitchen"]);
        let only = Scoring::Only(answers(&["garden", "office"]));
        assert_eq!(score(" Kitchen.", &a, &only), 1.0);
        assert_eq!(score(" kitchen or garden.", &a, &only), 0.0);
        assert_eq!(score(" the garden. The kitchen.", &a, &only), 0.0);
        assert_eq!(score(" kitchen. Then the office.", &a, &only), 1.0);
        assert_eq!(score(" hallway.", &a, &only), 0.0);
    }
}
