//! The tasks by name: passkey retrieval, RULER's eight needle-in-a-haystack tasks with
//! its templates and its choice of haystack, key and value for each, its variable
//! tracking and word extraction ([`super::lists`]), and BABILong's first five
//! reasoning tasks ([`super::babi`]).
//!
//! | task | haystack | keys | values | needles |
//! |---|---|---|---|---|
//! | `passkey` | noise | - | 5-digit number | 1 |
//! | `niah_single_1` | noise | words | 7-digit numbers | 1 |
//! | `niah_single_2` | text | words | numbers | 1 |
//! | `niah_single_3` | text | words | UUIDs | 1 |
//! | `niah_multikey_1` | text | words | numbers | 4 keys, 1 asked |
//! | `niah_multikey_2` | distractor needles | words | numbers | 1 among many |
//! | `niah_multikey_3` | distractor needles | UUIDs | UUIDs | 1 among many |
//! | `niah_multivalue` | text | words | numbers | 4 values of one key |
//! | `niah_multiquery` | text | words | numbers | 4 keys, all asked |
//! | `vt` | noise | - | 5-letter names | a chain of 5 assignments, all asked |
//! | `cwe` | - | - | invented words | the 10 most common of a numbered list |
//! | `fwe` | - | - | coded words | the 3 most frequent of a Zipf-drawn text |
//! | `qa1`-`qa5` | text | - | places, people, objects | bAbI facts scattered in order |
//!
//! "text" is the haystack the caller gives ([`Spec::text`]; RULER uses Paul Graham's
//! essays), or the noise without one. The asked needles sit at the requested depth, one
//! after the other; the others at seeded random depths. Variable tracking (RULER's `vt`:
//! `VAR QWERT = 41234.`, then `VAR ASDFG = VAR QWERT.` four times) starts its chain at
//! the requested depth and places the later links at random depths after it, in order.
//!
//! The word-extraction and reasoning tasks have no depth ([`takes_depth`]): their answer
//! is spread over the whole context.

use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

use super::assemble::{assemble, Needle, Pieces};
use super::haystack::Haystack;
use super::units::Units;
use super::{babi, lists, Sample, Scoring};

/// Every task, in the order a suite runs them.
pub const TASKS: [&str; 17] = [
    "passkey",
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
    "qa1",
    "qa2",
    "qa3",
    "qa4",
    "qa5",
];

/// Whether `task`'s samples place their facts at a depth (the others spread them over
/// the whole context, and are evaluated at one depth-less cell per length).
pub fn takes_depth(task: &str) -> bool {
    !matches!(task, "cwe" | "fwe") && !babi::QA.contains(&task)
}

/// What to generate: one sample of a task.
#[derive(Clone, Debug)]
pub struct Spec {
    /// In the model's units.
    pub length: usize,
    /// Of the asked needles, in [0, 1].
    pub depth: f64,
    /// The text haystack of the tasks that take one; the noise when `None`.
    pub text: Option<Haystack>,
}

/// What a key or a value is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An adjective and a noun, hyphenated (`tame-harbour`).
    Words,
    /// A 7-digit number.
    Numbers,
    /// A version-4 UUID.
    Uuids,
}

impl Kind {
    /// A random key or value of this kind.
    pub fn draw(self, rng: &mut Rng) -> String {
        match self {
            Kind::Words => {
                let adjective = ADJECTIVES[rng.range(0, ADJECTIVES.len() - 1)];
                format!("{adjective}-{}", NOUNS[rng.range(0, NOUNS.len() - 1)])
            }
            Kind::Numbers => rng.range(1_000_000, 9_999_999).to_string(),
            Kind::Uuids => {
                let (hi, lo) = (rng.next_u64(), rng.next_u64());
                let hi = (hi & !0xF000) | 0x4000; // version 4
                let lo = (lo & !(0xC << 60)) | (0x8 << 60); // RFC 4122 variant
                format!(
                    "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                    hi >> 32,
                    (hi >> 16) & 0xFFFF,
                    hi & 0xFFFF,
                    lo >> 48,
                    lo & 0xFFFF_FFFF_FFFF
                )
            }
        }
    }

    /// The plural noun RULER's templates call values of this kind.
    fn plural(self) -> &'static str {
        match self {
            Kind::Words => "words",
            Kind::Numbers => "numbers",
            Kind::Uuids => "uuids",
        }
    }
}

/// Refuses a length too short for one of `tasks` (or a task name unknown) before any
/// sample is drawn: one sample of each at `length`, the shortest a caller will ask for.
pub fn check_length(tasks: &[&str], length: usize, units: &dyn Units, text: Option<&Haystack>) -> Result<()> {
    for &task in tasks {
        let spec = Spec { length, depth: 0.5, text: text.cloned() };
        generate(task, &spec, units, &mut Rng::new(0))?;
    }
    Ok(())
}

/// `n` distinct strings from `draw`, in the order first drawn (a repeat is drawn again).
pub fn distinct(n: usize, rng: &mut Rng, mut draw: impl FnMut(&mut Rng) -> String) -> Vec<String> {
    let (mut seen, mut out) = (std::collections::HashSet::new(), Vec::with_capacity(n));
    while out.len() < n {
        let item = draw(rng);
        if seen.insert(item.clone()) {
            out.push(item);
        }
    }
    out
}

/// RULER's needle: "One of the special magic numbers for KEY is: VALUE."
pub fn needle_sentence(value_kind: Kind, key: &str, value: &str) -> String {
    format!("One of the special magic {} for {key} is: {value}.", value_kind.plural())
}

/// One sample of `task` at `spec`'s length and depth, in `units`, drawn from `rng`.
pub fn generate(task: &str, spec: &Spec, units: &dyn Units, rng: &mut Rng) -> Result<Sample> {
    if !(0.0..=1.0).contains(&spec.depth) {
        return Err(LetheError::Invalid(format!("depth {} is not in [0, 1]", spec.depth)));
    }
    let text = || spec.text.clone().unwrap_or(Haystack::Noise);
    let name = TASKS.iter().find(|t| **t == task).copied().unwrap_or("?");
    let (pieces, haystack) = match task {
        "passkey" => (passkey(spec.depth, rng), Haystack::Noise),
        "niah_single_1" => (niah(Shape::single(Kind::Numbers), spec.depth, rng), Haystack::Noise),
        "niah_single_2" => (niah(Shape::single(Kind::Numbers), spec.depth, rng), text()),
        "niah_single_3" => (niah(Shape::single(Kind::Uuids), spec.depth, rng), text()),
        "niah_multikey_1" => (niah(Shape { keys: 4, ..Shape::single(Kind::Numbers) }, spec.depth, rng), text()),
        "niah_multikey_2" => distracted(Shape::single(Kind::Numbers), spec.depth, rng),
        "niah_multikey_3" => distracted(Shape { key: Kind::Uuids, ..Shape::single(Kind::Uuids) }, spec.depth, rng),
        "niah_multivalue" => (niah(Shape { values: 4, ..Shape::single(Kind::Numbers) }, spec.depth, rng), text()),
        "niah_multiquery" => {
            (niah(Shape { keys: 4, queries: 4, ..Shape::single(Kind::Numbers) }, spec.depth, rng), text())
        }
        "vt" => (variable_tracking(spec.depth, rng), Haystack::Noise),
        "cwe" => return lists::common_words(spec.length, units, rng),
        "fwe" => return lists::frequent_words(spec.length, units, rng),
        "qa1" | "qa2" | "qa3" | "qa4" | "qa5" => (babi::pieces(name, rng), text()),
        other => {
            return Err(LetheError::Invalid(format!(
                "unknown long-context task `{other}`; known: {}",
                TASKS.join(", ")
            )))
        }
    };
    let pieces = Pieces { task: name, ..pieces };
    assemble(&pieces, &haystack, units, spec.length, rng)
}

/// The passkey test (Mohtashami & Jaggi, 2023), as RULER and the long-context papers
/// since run it.
fn passkey(depth: f64, rng: &mut Rng) -> Pieces {
    let key = rng.range(10_000, 99_999).to_string();
    Pieces {
        task: "passkey",
        head: "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.".into(),
        needles: vec![Needle { text: format!("The pass key is {key}. Remember it. {key} is the pass key."), depth }],
        tail: " What is the pass key? The pass key is".into(),
        answers: vec![key],
        scoring: Scoring::All,
    }
}

/// Links of the variable-tracking chain after its first assignment (RULER's default).
const HOPS: usize = 4;

/// RULER's variable tracking: one chain of `HOPS + 1` variables that all end up holding
/// the first one's value; all of them are asked for.
fn variable_tracking(depth: f64, rng: &mut Rng) -> Pieces {
    let names = distinct(HOPS + 1, rng, |rng| (0..5).map(|_| char::from(b'A' + rng.range(0, 25) as u8)).collect());
    let value = rng.range(10_000, 99_999);
    let mut depths: Vec<f64> = (0..HOPS).map(|_| depth + (1.0 - depth) * rng.uniform()).collect();
    depths.sort_by(f64::total_cmp);
    let mut needles = vec![Needle { text: format!("VAR {} = {value}.", names[0]), depth }];
    for (pair, d) in names.windows(2).zip(depths) {
        needles.push(Needle { text: format!("VAR {} = VAR {}.", pair[1], pair[0]), depth: d });
    }
    Pieces {
        task: "vt",
        head: "Memorize and track the chain(s) of variable assignment hidden in the following text.".into(),
        needles,
        tail: format!(
            " Question: Find all variables that are assigned the value {value} in the text above. Answer: According to the chain(s) of variable assignment in the text above, {} variables are assigned the value {value}, they are:",
            HOPS + 1
        ),
        answers: names,
        scoring: Scoring::All,
    }
}

/// How many keys, values per key and asked keys a needle task has.
#[derive(Clone, Copy, Debug)]
struct Shape {
    key: Kind,
    value: Kind,
    keys: usize,
    values: usize,
    queries: usize,
}

impl Shape {
    fn single(value: Kind) -> Shape {
        Shape { key: Kind::Words, value, keys: 1, values: 1, queries: 1 }
    }
}

/// A needle task whose haystack is distractor needles of the same kinds, none of them
/// with an asked key (RULER's `needle` haystack).
fn distracted(shape: Shape, depth: f64, rng: &mut Rng) -> (Pieces, Haystack) {
    let pieces = niah(shape, depth, rng);
    let except = pieces.needles.iter().map(|n| key_of(&n.text).to_string()).collect();
    (pieces, Haystack::Needles { key: shape.key, value: shape.value, except })
}

/// The key of a needle sentence.
pub fn key_of(needle: &str) -> &str {
    let after = needle.split_once(" for ").map_or("", |(_, rest)| rest);
    after.split_once(" is: ").map_or(after, |(key, _)| key)
}

/// A RULER needle task: `keys` keys with `values` values each; the first `queries` keys
/// are asked, their needles at `depth`, the rest at random depths.
fn niah(shape: Shape, depth: f64, rng: &mut Rng) -> Pieces {
    let keys = distinct(shape.keys, rng, |rng| shape.key.draw(rng));
    let (mut needles, mut answers) = (Vec::new(), Vec::new());
    for (i, key) in keys.iter().enumerate() {
        let asked = i < shape.queries;
        for _ in 0..shape.values {
            let value = shape.value.draw(rng);
            let d = if asked { depth } else { rng.uniform() };
            needles.push(Needle { text: needle_sentence(shape.value, key, &value), depth: d });
            if asked {
                answers.push(value);
            }
        }
    }
    let asked = &keys[..shape.queries];
    let query = match asked {
        [one] => one.clone(),
        [init @ .., last] => format!("{}, and {last}", init.join(", ")),
        [] => String::new(),
    };
    let noun = shape.value.plural();
    let (some, is, noun) =
        if answers.len() == 1 { ("A", "is", &noun[..noun.len() - 1]) } else { ("Some", "are", noun) };
    let all = if answers.len() == 1 { "is" } else { "are all" };
    Pieces {
        task: "niah",
        head: format!("{some} special magic {noun} {is} hidden within the following text. Make sure to memorize it. I will quiz you about the {noun} afterwards."),
        needles,
        tail: format!(
            " What {all} the special magic {noun} for {query} mentioned in the provided text? The special magic {noun} for {query} mentioned in the provided text {is}"
        ),
        answers,
        scoring: Scoring::All,
    }
}

/// Adjectives of the word keys.
const ADJECTIVES: [&str; 32] = [
    "amber", "ancient", "bitter", "brave", "calm", "clever", "crisp", "curious", "distant", "eager", "faint", "fierce",
    "gentle", "golden", "hollow", "humble", "icy", "jolly", "lively", "lucky", "mellow", "misty", "noble", "quiet",
    "rapid", "rustic", "silent", "silver", "tame", "tender", "vivid", "wild",
];

/// Nouns of the word keys.
const NOUNS: [&str; 32] = [
    "anchor", "badger", "basket", "beacon", "canyon", "castle", "cedar", "comet", "falcon", "feather", "garden",
    "harbour", "island", "lantern", "meadow", "mirror", "orchard", "otter", "pebble", "pepper", "quarry", "river",
    "saddle", "shelter", "spindle", "thistle", "timber", "tunnel", "valley", "violin", "willow", "window",
];

#[cfg(test)]
mod tests {
    use super::super::units::ByteUnits;
    use super::*;

    /// A rule-based reader: the value of `key` in the text's needles, as the needle's
    /// form gives it.
    fn read_values(text: &str, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        let marker = format!(" for {key} is: ");
        let mut rest = text;
        while let Some(i) = rest.find(&marker) {
            let after = &rest[i + marker.len()..];
            out.push(after[..after.find(". ").unwrap_or(after.len() - 1)].to_string());
            rest = after;
        }
        out
    }

    /// Variable tracking read by rule: the variables that hold the asked value, directly
    /// or through a chain of assignments, in the order they are assigned.
    fn follow_chain(text: &str) -> Vec<String> {
        let value = text.split("assigned the value ").nth(1).unwrap().split(' ').next().unwrap().to_string();
        let mut holders = vec![value.clone()];
        let mut names = Vec::new();
        for sentence in text.split('.').map(str::trim) {
            let Some((name, rhs)) = sentence.strip_prefix("VAR ").and_then(|a| a.split_once(" = ")) else { continue };
            let source = rhs.strip_prefix("VAR ").unwrap_or(rhs);
            if holders.iter().any(|h| h == source) {
                holders.push(name.to_string());
                names.push(name.to_string());
            }
        }
        names
    }

    /// The asked keys, read from the question.
    fn asked_keys(text: &str) -> Vec<String> {
        let q = text.rsplit(" magic ").nth(1).unwrap_or("");
        let q = q.split(" for ").nth(1).unwrap_or("").split(" mentioned").next().unwrap_or("");
        q.replace(", and ", ", ").split(", ").map(str::to_string).collect()
    }

    #[test]
    fn every_answer_can_be_read_from_the_text_alone() {
        // The depth-less tasks' readers are beside their generators.
        for task in TASKS.into_iter().filter(|t| takes_depth(t)) {
            for seed in 0..4 {
                let spec = Spec { length: 2048, depth: 0.25 * seed as f64, text: None };
                let s = generate(task, &spec, &ByteUnits, &mut Rng::new(seed)).unwrap();
                assert_eq!(s.input.len(), 2048, "{task}");
                let text = ByteUnits.decode(&s.input).unwrap();
                let mut read = if task == "passkey" {
                    let after = text.split("The pass key is ").nth(1).unwrap();
                    vec![after[..after.find('.').unwrap()].to_string()]
                } else if task == "vt" {
                    follow_chain(&text)
                } else {
                    asked_keys(&text).iter().flat_map(|k| read_values(&text, k)).collect()
                };
                read.sort();
                let mut expected = s.answers.clone();
                expected.sort();
                assert_eq!(read, expected, "{task} seed {seed}");
                assert_eq!(score(&expected.join(" "), &s.answers, &s.scoring), 1.0);
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_sample_and_another_seed_another() {
        for task in TASKS {
            let spec = Spec { length: 1500, depth: 0.5, text: None };
            let a = generate(task, &spec, &ByteUnits, &mut Rng::new(9)).unwrap();
            assert_eq!(a, generate(task, &spec, &ByteUnits, &mut Rng::new(9)).unwrap());
            assert_ne!(a.input, generate(task, &spec, &ByteUnits, &mut Rng::new(10)).unwrap().input, "{task}");
        }
    }

    #[test]
    fn the_text_tasks_hide_in_the_text_given() {
        let text = Haystack::Text(std::sync::Arc::new("Call me Ishmael. Some years ago I went to sea.".into()));
        let spec = Spec { length: 3000, depth: 0.5, text: Some(text) };
        let s = generate("niah_single_2", &spec, &ByteUnits, &mut Rng::new(1)).unwrap();
        assert!(ByteUnits.decode(&s.input).unwrap().contains("Ishmael"));
        let s = generate("niah_single_1", &spec, &ByteUnits, &mut Rng::new(1)).unwrap();
        assert!(!ByteUnits.decode(&s.input).unwrap().contains("Ishmael"), "single_1 is the noise haystack");
        // The digits haystack: the haystack around the needle is numbers.
        let spec = Spec { text: Some(Haystack::Digits), ..spec };
        let s = generate("niah_single_2", &spec, &ByteUnits, &mut Rng::new(1)).unwrap();
        let hay = ByteUnits.decode(&s.input[s.haystack.0..s.needle_at]).unwrap();
        assert!(hay.len() > 100 && hay.chars().all(|c| c.is_ascii_digit() || c == ' ' || c == '.'), "{hay}");
    }

    #[test]
    fn unknown_tasks_and_depths_are_refused() {
        let spec = Spec { length: 1000, depth: 0.5, text: None };
        let err = generate("niah_double", &spec, &ByteUnits, &mut Rng::new(1)).unwrap_err().to_string();
        assert!(err.contains("niah_double") && err.contains("niah_multiquery"), "{err}");
        let spec = Spec { depth: 1.5, ..spec };
        assert!(generate("passkey", &spec, &ByteUnits, &mut Rng::new(1)).unwrap_err().to_string().contains("1.5"));
    }

    /// In tokens: the length counts the tokenizer's ids, and the answer survives the
    /// round trip through them.
    #[test]
    fn a_tokenised_sample_has_its_length_in_tokens() {
        let corpus = format!(
            "{} The pass key is 12345. What is the special magic number for it?",
            super::super::haystack::NOISE
        );
        let tokenizer = crate::tokenizer::Tokenizer::train_bpe(&[corpus.as_str()], 300).unwrap();
        for task in ["passkey", "niah_single_1", "niah_multiquery"] {
            let spec = Spec { length: 700, depth: 0.4, text: None };
            let s = generate(task, &spec, &tokenizer, &mut Rng::new(4)).unwrap();
            assert_eq!(s.input.len(), 700, "{task}");
            let text = Units::decode(&tokenizer, &s.input).unwrap();
            assert!(s.answers.iter().all(|a| text.contains(a.as_str())), "{task}: {text}");
            assert!(text.contains("The grass is green"), "{text}");
        }
    }

    /// The depth-less tasks in tokens too: the list fitted to the exact count of ids,
    /// the answers in the text.
    #[test]
    fn a_tokenised_list_or_story_has_its_length_in_tokens() {
        let corpus = "1. tavemo 2. rikola Mary went to the kitchen. Where is Mary? Answer: kitchen";
        let tokenizer = crate::tokenizer::Tokenizer::train_bpe(&[corpus], 300).unwrap();
        for task in ["cwe", "fwe", "qa1", "qa5"] {
            let spec = Spec { length: 2500, depth: 0.0, text: None };
            let s = generate(task, &spec, &tokenizer, &mut Rng::new(6)).unwrap();
            assert_eq!(s.input.len(), 2500, "{task}");
            let text = Units::decode(&tokenizer, &s.input).unwrap();
            assert!(s.answers.iter().all(|a| text.contains(a.as_str())), "{task}: {text}");
        }
    }

    #[test]
    fn uuids_have_the_version_4_form() {
        let u = Kind::Uuids.draw(&mut Rng::new(5));
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
    }

    use super::super::score;
}
