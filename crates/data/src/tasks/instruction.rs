//! Instruction following with distractors: a synthetic stand-in for the LIGHT task of
//! the Expire-Span paper (section 5.3, A.3.2; docs/design/algorithms.md, Tasks), whose dataset is
//! not public in a usable form. It tests the same ability: keep one instruction in mind
//! through hundreds of words of unrelated text, and act on it when its moment comes.
//!
//! An episode is lowercase text, one sentence per line:
//!
//! ```text
//! the wizard says: tell the baker that the guard wants to see them.
//! the knight gives the lantern to the miller.          <- distractors, ~950 words
//! ...
//! the baker enters.
//! you: tell the baker that the guard wants to see them.   <- the execution (scored)
//! ```
//!
//! - Each episode holds 1 to `queue_max` instructions, issued close together so that
//!   several are pending at once. Instruction `i` is executed when its recipient `X`
//!   enters, `D_i ~ U[distance_min, distance_max]` words of distractor text later (the
//!   arrival waits for the end of the sentence in progress).
//! - Only the execution is scored: the agent's line after `you: `, up to its newline.
//!   To get it right the model must remember *whether* someone wanted to see `X` and
//!   *who* (`Y`).
//! - Against shortcuts: characters with no pending instruction also enter and are
//!   greeted (`you: hello, miller.`, not scored), so an arrival alone does not mean an
//!   execution; distractors mention every character, and some say that someone
//!   "wants to see" something, so the last "wants to see" is not the answer; the
//!   instruction comes in several phrasings; `Y` is uniform over the characters.
//! - As in LIGHT, where the agent answers `You tell the butler "town official wants to
//!   see you!"` to "can you tell the butler that the town official wants to see them?",
//!   the execution repeats the message of the instruction.

use crate::seq::TokenSeq;
use lethe_core::config::tasks::INSTRUCTION_CHARACTERS;
use lethe_core::config::{DataConfig, InstructionConfig};
use lethe_core::rng::Rng;

use super::Generator;
use crate::task::spec::{Metric, Task};

/// The characters of the world. `characters` in the config takes the first n.
pub const CHARACTERS: [&str; INSTRUCTION_CHARACTERS] = [
    "guard",
    "wizard",
    "baker",
    "knight",
    "queen",
    "king",
    "merchant",
    "farmer",
    "priest",
    "thief",
    "blacksmith",
    "hunter",
    "sailor",
    "monk",
    "healer",
    "bard",
    "miller",
    "weaver",
    "potter",
    "scribe",
    "soldier",
    "captain",
    "fisherman",
    "shepherd",
    "innkeeper",
    "jester",
    "witch",
    "ranger",
    "servant",
    "cook",
    "gardener",
    "mason",
    "tailor",
    "carpenter",
    "herbalist",
    "alchemist",
    "squire",
    "duke",
    "beggar",
    "pilgrim",
];
const OBJECTS: [&str; 30] = [
    "sword", "lantern", "bread", "key", "map", "ring", "cup", "book", "shield", "rope", "apple", "coin", "candle",
    "cloak", "bottle", "basket", "hammer", "scroll", "bow", "flute", "crown", "axe", "bell", "mirror", "blanket",
    "knife", "boot", "jar", "stone", "feather",
];
const PLACES: [&str; 20] = [
    "market", "river", "tower", "garden", "castle", "forest", "tavern", "chapel", "bridge", "well", "kitchen",
    "stable", "harbour", "square", "library", "cellar", "field", "mill", "gate", "road",
];
const ADJECTIVES: [&str; 16] = [
    "old", "red", "heavy", "small", "broken", "shiny", "strange", "wooden", "golden", "dusty", "quiet", "dark",
    "bright", "cold", "warm", "tiny",
];
/// Distractor templates: `{c}`, `{d}` characters, `{o}` object, `{p}` place, `{a}` adjective.
const DISTRACTORS: [&str; 16] = [
    "the {c} walks to the {p}.",
    "the {c} picks up the {o}.",
    "the {c} gives the {o} to the {d}.",
    "the {c} looks at the {a} {o}.",
    "the {c} says: the {o} in the {p} is {a}.",
    "the {c} sits near the {p}.",
    "the {c} asks the {d} about the {o}.",
    "a {a} {o} lies in the {p}.",
    "the {c} and the {d} talk about the {p}.",
    "the {c} drops the {o}.",
    "the {c} smiles at the {d}.",
    "the {c} wants the {a} {o}.",
    "the {c} leaves the {p}.",
    "the {c} says that the {d} wants to see the {o}.",
    "the {c} tells the {d} a story about the {a} {p}.",
    "the {c} hides the {o} in the {p}.",
];
/// Phrasings of an instruction: `{g}` gives it, `{x}` receives it, `{y}` wants to see
/// `{x}`. As in LIGHT ("can you tell the butler that the town official wants to see
/// them?"), each holds the message the agent must later deliver.
const INSTRUCTIONS: [&str; 4] = [
    "the {g} says: tell the {x} that the {y} wants to see them.",
    "the {g} asks you: can you tell the {x} that the {y} wants to see them?",
    "the {g} whispers: if you meet the {x}, tell the {x} that the {y} wants to see them.",
    "the {g} says to you: please, tell the {x} that the {y} wants to see them!",
];

/// One instruction of an episode, for checking the generator.
#[derive(Clone, Debug, PartialEq)]
pub struct InstructionRecord {
    /// Who must be told.
    pub recipient: &'static str,
    /// Who wants to see them.
    pub sender: &'static str,
    /// The distance drawn, in words.
    pub drawn: usize,
    /// Distractor words between the instruction and the arrival of the recipient (other
    /// instructions, executions and greetings in between are not counted).
    pub distractor_words: usize,
    /// Byte range of the instruction's line.
    pub instruction: std::ops::Range<usize>,
    /// Byte range of the scored execution (after `you: `, newline included).
    pub execution: std::ops::Range<usize>,
}

/// The instruction task with its parameters.
#[derive(Clone, Debug)]
pub struct InstructionTask {
    cfg: InstructionConfig,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Issue(usize),
    Execute(usize),
}

/// The text of an episode being written: tokens, scored flags, and a word count.
#[derive(Default)]
struct Writer {
    tokens: Vec<u8>,
    scored: Vec<bool>,
    words: usize,
}

impl Writer {
    fn line(&mut self, text: &str, scored: bool) {
        self.tokens.extend_from_slice(text.as_bytes());
        self.tokens.push(b'\n');
        self.scored.extend(std::iter::repeat_n(scored, text.len() + 1));
        self.words += text.split_whitespace().count();
    }
}

impl InstructionTask {
    /// The task with `cfg`'s parameters.
    pub fn new(cfg: &InstructionConfig) -> Self {
        InstructionTask { cfg: cfg.clone() }
    }

    fn character(&self, rng: &mut Rng) -> &'static str {
        CHARACTERS[rng.range(0, self.cfg.characters.min(CHARACTERS.len()) - 1)]
    }

    /// A character other than those in `not`.
    fn other(&self, rng: &mut Rng, not: &[&str]) -> &'static str {
        loop {
            let c = self.character(rng);
            if !not.contains(&c) {
                return c;
            }
        }
    }

    fn distractor(&self, rng: &mut Rng) -> String {
        let c = self.character(rng);
        let d = self.other(rng, &[c]);
        DISTRACTORS[rng.range(0, DISTRACTORS.len() - 1)]
            .replace("{c}", c)
            .replace("{d}", d)
            .replace("{o}", OBJECTS[rng.range(0, OBJECTS.len() - 1)])
            .replace("{p}", PLACES[rng.range(0, PLACES.len() - 1)])
            .replace("{a}", ADJECTIVES[rng.range(0, ADJECTIVES.len() - 1)])
    }

    /// The pending recipients must stay distinct, so draw `k` distinct recipients, then
    /// for each a sender and a giver.
    fn draw_instructions(&self, rng: &mut Rng) -> Vec<InstructionRecord> {
        let k = rng.range(1, self.cfg.queue_max);
        let mut records: Vec<InstructionRecord> = vec![];
        for _ in 0..k {
            let taken: Vec<&str> = records.iter().map(|r| r.recipient).collect();
            let recipient = self.other(rng, &taken);
            let sender = self.other(rng, &[recipient]);
            let drawn = rng.range(self.cfg.distance_min, self.cfg.distance_max);
            records.push(InstructionRecord {
                recipient,
                sender,
                drawn,
                distractor_words: 0,
                instruction: 0..0,
                execution: 0..0,
            });
        }
        records
    }

    /// One episode and the record of its instructions.
    pub fn simulate(&self, rng: &mut Rng) -> (TokenSeq, Vec<InstructionRecord>) {
        let mut records = self.draw_instructions(rng);
        // Issue times (in distractor words) close together, so that instructions queue
        // up; each execution is scheduled `drawn` words after its instruction is written.
        let spread = (self.cfg.distance_min / 2).max(1);
        let mut issues = vec![];
        let mut t = 0;
        for i in 0..records.len() {
            issues.push((t, i));
            t += rng.range(0, spread);
        }
        issues.reverse();
        let mut executions: Vec<(usize, usize)> = vec![];
        let mut w = Writer::default();
        let mut clock = 0; // distractor words written, the schedule's time
        let mut issued_at = vec![0; records.len()];
        let mut pending: Vec<&str> = vec![];
        while let Some((time, event)) = next_event(&mut issues, &mut executions) {
            while clock < time {
                clock += self.distractors(rng, &mut w, &pending);
            }
            match event {
                Event::Issue(i) => {
                    let r = &mut records[i];
                    let giver = self.other(rng, &[r.recipient, r.sender]);
                    let template = INSTRUCTIONS[rng.range(0, INSTRUCTIONS.len() - 1)];
                    let start = w.tokens.len();
                    w.line(&template.replace("{g}", giver).replace("{x}", r.recipient).replace("{y}", r.sender), false);
                    r.instruction = start..w.tokens.len();
                    issued_at[i] = clock;
                    pending.push(r.recipient);
                    executions.push((clock + r.drawn, i));
                }
                Event::Execute(i) => {
                    let r = &mut records[i];
                    r.distractor_words = clock - issued_at[i];
                    w.line(&format!("the {} enters.", r.recipient), false);
                    w.tokens.extend_from_slice(b"you: ");
                    w.scored.extend([false; 5]);
                    let start = w.tokens.len();
                    w.line(&format!("tell the {} that the {} wants to see them.", r.recipient, r.sender), true);
                    w.words += 1; // "you:"
                    r.execution = start..w.tokens.len();
                    pending.retain(|&p| p != r.recipient);
                }
            }
        }
        (TokenSeq::bytes(&w.tokens, Some(w.scored), None), records)
    }

    /// One distractor sentence, sometimes followed by the greeting of a character with
    /// nothing pending. Returns the distractor words written.
    fn distractors(&self, rng: &mut Rng, w: &mut Writer, pending: &[&str]) -> usize {
        let before = w.words;
        w.line(&self.distractor(rng), false);
        let words = w.words - before;
        if rng.uniform() < self.cfg.greet_rate {
            let visitor = self.other(rng, pending);
            w.line(&format!("the {visitor} enters."), false);
            w.line(&format!("you: hello, {visitor}."), false);
        }
        words
    }
}

/// The earliest of the remaining events: `issues` is sorted latest first; at equal
/// times an instruction is issued before an execution.
fn next_event(issues: &mut Vec<(usize, usize)>, executions: &mut Vec<(usize, usize)>) -> Option<(usize, Event)> {
    let first_exec = executions.iter().enumerate().min_by_key(|(_, e)| **e).map(|(j, e)| (j, *e));
    let issue_first = match (issues.last(), first_exec) {
        (Some(&(ti, _)), Some((_, (te, _)))) => ti <= te,
        (issue, _) => issue.is_some(),
    };
    if issue_first {
        return issues.pop().map(|(t, i)| (t, Event::Issue(i)));
    }
    let (j, (te, e)) = first_exec?;
    executions.swap_remove(j);
    Some((te, Event::Execute(e)))
}

impl Generator for InstructionTask {
    fn episode(&self, rng: &mut Rng) -> TokenSeq {
        self.simulate(rng).0
    }

    /// A generous bound: every instruction issued half the shortest distance after the
    /// last, the last executed the longest distance later, each distractor word under 16
    /// bytes and each instruction's lines under 256.
    fn longest_episode(&self) -> (u64, &'static str) {
        let (q, dmin, dmax) = (self.cfg.queue_max as u64, self.cfg.distance_min as u64, self.cfg.distance_max as u64);
        let words = q.saturating_mul(dmin / 2 + 1).saturating_add(dmax);
        (words.saturating_mul(16).saturating_add(q.saturating_mul(256)), "data.instruction.distance_max")
    }
}

/// The instruction task in the registry ([`crate::task::of`]).
pub struct InstructionSpec;

impl Task for InstructionSpec {
    fn name(&self) -> &'static str {
        "instruction"
    }

    fn describe(&self, d: &DataConfig) -> String {
        let i = &d.instruction;
        format!(
            "instruction following, {} characters, up to {} instructions pending, {}-{} distractor words; only executions scored",
            i.characters, i.queue_max, i.distance_min, i.distance_max
        )
    }

    fn metric(&self) -> Metric {
        Metric::Answers
    }

    /// The most instructions pending in an episode.
    fn set_length(&self, d: &mut DataConfig, n: usize) -> bool {
        d.instruction.queue_max = n;
        true
    }

    /// The distractor words between an instruction and its execution.
    fn set_distance(&self, d: &mut DataConfig, min: usize, max: usize) -> bool {
        (d.instruction.distance_min, d.instruction.distance_max) = (min, max);
        true
    }

    fn generator(&self, d: &DataConfig) -> Option<(Box<dyn Generator>, usize)> {
        Some((Box::new(InstructionTask::new(&d.instruction)), d.instruction.eval_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> InstructionConfig {
        InstructionConfig {
            characters: 12,
            queue_max: 3,
            distance_min: 30,
            distance_max: 60,
            greet_rate: 0.2,
            eval_tokens: 4096,
        }
    }

    fn text(seq: &TokenSeq, range: std::ops::Range<usize>) -> String {
        String::from_utf8(crate::bytes_of(&seq.tokens[range])).unwrap()
    }

    #[test]
    fn every_instruction_is_executed_by_its_recipient_with_its_sender() {
        let task = InstructionTask::new(&small());
        let mut rng = Rng::new(7);
        for _ in 0..200 {
            let (seq, records) = task.simulate(&mut rng);
            assert!(!records.is_empty() && records.len() <= 3);
            for r in &records {
                let said = text(&seq, r.execution.clone());
                assert_eq!(said, format!("tell the {} that the {} wants to see them.\n", r.recipient, r.sender));
                let before = text(&seq, 0..r.execution.start);
                assert!(before.ends_with(&format!("the {} enters.\nyou: ", r.recipient)), "{before}");
                let told = text(&seq, r.instruction.clone());
                assert!(r.instruction.end <= r.execution.start);
                assert!(
                    told.contains(&format!("the {}", r.recipient))
                        && told.contains(&format!("the {} wants to see", r.sender)),
                    "{told}"
                );
                assert_ne!(r.recipient, r.sender);
            }
        }
    }

    #[test]
    fn the_scored_positions_are_exactly_the_executions() {
        let task = InstructionTask::new(&small());
        let mut rng = Rng::new(11);
        for _ in 0..100 {
            let (seq, records) = task.simulate(&mut rng);
            let scored: Vec<usize> = (0..seq.len()).filter(|&i| seq.is_scored(i)).collect();
            let expected: Vec<usize> = records
                .iter()
                .flat_map(|r| r.execution.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            assert_eq!(scored, expected);
            // Greetings are never scored.
            let all = text(&seq, 0..seq.len());
            for (at, _) in all.match_indices("you: hello") {
                assert!(!seq.is_scored(at + 5));
            }
        }
    }

    #[test]
    fn distances_follow_the_configured_distribution() {
        let cfg = small();
        let task = InstructionTask::new(&cfg);
        let mut rng = Rng::new(3);
        let mut drawn = vec![];
        for _ in 0..400 {
            for r in task.simulate(&mut rng).1 {
                assert!((cfg.distance_min..=cfg.distance_max).contains(&r.drawn));
                // The arrival waits for the end of the sentence in progress (11 words at most).
                assert!(r.distractor_words >= r.drawn && r.distractor_words < r.drawn + 11, "{r:?}");
                drawn.push(r.drawn as f64);
            }
        }
        let mean = drawn.iter().sum::<f64>() / drawn.len() as f64;
        assert!((mean - 45.0).abs() < 1.5, "mean drawn distance {mean}");
        let low = drawn.iter().filter(|&&d| d < 45.0).count() as f64 / drawn.len() as f64;
        assert!((low - 0.5).abs() < 0.06, "share below the middle {low}");
    }

    #[test]
    fn instructions_queue_up_before_they_are_executed() {
        let task = InstructionTask::new(&small());
        let mut rng = Rng::new(5);
        let mut queued = 0;
        for _ in 0..200 {
            let (_, r) = task.simulate(&mut rng);
            for pair in r.windows(2) {
                assert!(
                    pair[1].instruction.end < pair[0].execution.start,
                    "the next instruction comes while this one is pending"
                );
                queued += 1;
            }
        }
        assert!(queued > 100, "{queued} queued pairs in 200 episodes");
    }
}
