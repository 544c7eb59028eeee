//! Fits a sample to its length: the instruction, then exactly as much haystack as the
//! length leaves, with each needle inserted on the sentence boundary nearest its depth,
//! then the question. The depth of a needle is where it starts, as a fraction of the
//! haystack (0: before the first sentence, 1: after the last), as RULER and the original
//! needle-in-a-haystack test place it.
//!
//! The word-list tasks have no haystack: their list is the context. [`assemble_list`]
//! fits them, with as many items as the length holds and a padding that cannot change
//! the answer.

use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

use super::haystack::Haystack;
use super::units::{ends_sentence, Units};
use super::{Sample, Scoring};
use crate::seq::Token;

/// A fact to hide, at a depth in [0, 1].
#[derive(Clone, Debug, PartialEq)]
pub struct Needle {
    /// Its sentence.
    pub text: String,
    /// Where it starts, as a fraction of the haystack.
    pub depth: f64,
}

/// A sample's text before its length is fitted.
#[derive(Clone, Debug, PartialEq)]
pub struct Pieces {
    /// The task's name.
    pub task: &'static str,
    /// The instruction, before the haystack.
    pub head: String,
    /// The needles; the first is the one whose depth the sample reports.
    pub needles: Vec<Needle>,
    /// The question and the answer's prefix, after the haystack.
    pub tail: String,
    /// What the continuation must contain.
    pub answers: Vec<String>,
    /// How it is scored.
    pub scoring: Scoring,
}

/// The sample of `pieces` in `units`, exactly `length` long, its haystack drawn from
/// `haystack` with `rng`. A length too short for the instruction, needles and question
/// is refused, naming the shortest that fits.
pub fn assemble(
    pieces: &Pieces,
    haystack: &Haystack,
    units: &dyn Units,
    length: usize,
    rng: &mut Rng,
) -> Result<Sample> {
    let head = units.encode(&pieces.head)?;
    let tail = units.encode(&pieces.tail)?;
    let needles = pieces.needles.iter().map(|n| units.encode(&format!(" {}", n.text))).collect::<Result<Vec<_>>>()?;
    let fixed = head.len() + tail.len() + needles.iter().map(Vec::len).sum::<usize>();
    if length < fixed + MIN_HAYSTACK {
        return Err(LetheError::Invalid(format!(
            "a {} sample of length {length} leaves no room for its haystack: the shortest is {}",
            pieces.task,
            fixed + MIN_HAYSTACK
        )));
    }
    let hay = haystack.fill(units, length - fixed, rng)?;
    let boundaries = sentence_boundaries(units, &hay)?;
    let mut at: Vec<(usize, usize)> =
        pieces.needles.iter().enumerate().map(|(i, n)| (nearest(&boundaries, n.depth * hay.len() as f64), i)).collect();
    at.sort();
    let mut input = head.clone();
    let (mut from, mut needle_at) = (0, 0);
    for &(pos, i) in &at {
        input.extend_from_slice(&hay[from..pos]);
        if i == 0 {
            needle_at = input.len();
        }
        input.extend_from_slice(&needles[i]);
        from = pos;
    }
    input.extend_from_slice(&hay[from..]);
    let haystack_span = (head.len(), input.len());
    input.extend_from_slice(&tail);
    debug_assert_eq!(input.len(), length);
    Ok(Sample {
        task: pieces.task,
        input,
        answers: pieces.answers.clone(),
        scoring: pieces.scoring.clone(),
        depth: pieces.needles.first().map_or(0.0, |n| n.depth),
        needle_at,
        haystack: haystack_span,
    })
}

/// A sample whose context is a list the task builds (RULER's word-extraction tasks).
pub struct List<'a> {
    /// The task's name.
    pub task: &'static str,
    /// The instruction, before the list.
    pub head: String,
    /// The list with `n` items (its text starts with a space); the answers must not
    /// depend on `n` from [`List::fewest`] on.
    pub body: &'a dyn Fn(usize) -> String,
    /// The fewest items a list may have.
    pub fewest: usize,
    /// At least `k` units of padding after the list of `n` items, that cannot change the
    /// answer (more unrepeated words, the noise word); cut to what the length leaves.
    pub pad: &'a dyn Fn(usize, usize) -> String,
    /// The question and the answer's prefix.
    pub tail: String,
    /// What the continuation must contain.
    pub answers: Vec<String>,
    /// How it is scored.
    pub scoring: Scoring,
}

/// The sample of `list` in `units`, exactly `length` long: the list with the most items
/// that fit (binary search over the item count), then padding. A length too short for
/// the fewest items is refused, naming the shortest that fits.
pub fn assemble_list(list: &List, units: &dyn Units, length: usize) -> Result<Sample> {
    let head = units.encode(&list.head)?;
    let tail = units.encode(&list.tail)?;
    let encode_body = |n: usize| units.encode(&(list.body)(n));
    let fewest = encode_body(list.fewest)?;
    let fixed = head.len() + tail.len();
    if length < fixed + fewest.len() {
        return Err(LetheError::Invalid(format!(
            "a {} sample of length {length} leaves no room for its list: the shortest is {}",
            list.task,
            fixed + fewest.len()
        )));
    }
    let room = length - fixed;
    // The most items that fit: double the count until the list is too long, then halve
    // the gap (the list's length grows with its items, as near as matters).
    let (mut lo, mut body, mut step) = (list.fewest, fewest, list.fewest.max(1));
    let mut hi = loop {
        let encoded = encode_body(lo + step)?;
        if encoded.len() > room {
            break lo + step - 1;
        }
        (lo, body, step) = (lo + step, encoded, step * 2);
    };
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        let encoded = encode_body(mid)?;
        if encoded.len() <= room {
            (lo, body) = (mid, encoded);
        } else {
            hi = mid - 1;
        }
    }
    let missing = room - body.len();
    let mut pad = units.encode(&(list.pad)(lo, missing))?;
    if pad.len() < missing {
        return Err(LetheError::Invalid(format!("the {} padding is shorter than asked", list.task)));
    }
    pad.truncate(missing);
    let mut input = head;
    let start = input.len();
    input.extend(body);
    input.extend(pad);
    let end = input.len();
    input.extend(tail);
    debug_assert_eq!(input.len(), length);
    Ok(Sample {
        task: list.task,
        input,
        answers: list.answers.clone(),
        scoring: list.scoring.clone(),
        depth: 0.0,
        needle_at: start,
        haystack: (start, end),
    })
}

/// Units of haystack a sample must have at least.
pub const MIN_HAYSTACK: usize = 16;

/// The positions in `hay` where a needle may go: 0, and after each unit that ends a
/// sentence (the haystack's sentences each start with a space, as the needles do).
fn sentence_boundaries(units: &dyn Units, hay: &[Token]) -> Result<Vec<usize>> {
    let mut out = vec![0];
    for (i, &u) in hay.iter().enumerate() {
        if ends_sentence(units, u)? {
            out.push(i + 1);
        }
    }
    Ok(out)
}

/// The boundary nearest `target` (the earlier of two as near).
fn nearest(boundaries: &[usize], target: f64) -> usize {
    let mut best = boundaries[0];
    for &b in boundaries {
        if (b as f64 - target).abs() < (best as f64 - target).abs() {
            best = b;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::super::units::ByteUnits;
    use super::*;

    fn pieces(depths: &[f64]) -> Pieces {
        Pieces {
            task: "test",
            head: "Find it.".into(),
            needles: depths
                .iter()
                .enumerate()
                .map(|(i, &d)| Needle { text: format!("Key {i} is {i}{i}."), depth: d })
                .collect(),
            tail: " What is key 0? Key 0 is".into(),
            answers: vec!["00".into()],
            scoring: Scoring::All,
        }
    }

    #[test]
    fn the_length_is_exact_and_the_needle_sits_at_its_depth_on_a_boundary() {
        let sentence = super::super::haystack::NOISE.split(". ").map(str::len).max().unwrap() + 2;
        for length in [200, 1000, 4096] {
            for depth in [0.0, 0.1, 0.5, 0.9, 1.0] {
                let s = assemble(&pieces(&[depth]), &Haystack::Noise, &ByteUnits, length, &mut Rng::new(1)).unwrap();
                assert_eq!(s.input.len(), length);
                let (start, end) = s.haystack;
                let hay_len = (end - start) - " Key 0 is 00.".len();
                let offset = s.needle_at - start;
                assert!((offset as f64 - depth * hay_len as f64).abs() <= sentence as f64, "{length} {depth} {offset}");
                let text = ByteUnits.decode(&s.input).unwrap();
                assert!(text[s.needle_at..].starts_with(" Key 0 is 00."), "{text}");
                // On a boundary: the haystack before the needle ends a sentence.
                let on_boundary = offset == 0 || text[..s.needle_at].ends_with('.');
                assert!(on_boundary, "{}", &text[..s.needle_at]);
            }
        }
    }

    #[test]
    fn several_needles_all_arrive_and_a_short_length_is_refused() {
        let s = assemble(&pieces(&[0.7, 0.2, 0.95]), &Haystack::Noise, &ByteUnits, 900, &mut Rng::new(2)).unwrap();
        let text = ByteUnits.decode(&s.input).unwrap();
        let (k0, k1, k2) =
            (text.find("Key 0 is").unwrap(), text.find("Key 1 is").unwrap(), text.find("Key 2 is").unwrap());
        assert!(k1 < k0 && k0 < k2, "{text}");
        let err = assemble(&pieces(&[0.5]), &Haystack::Noise, &ByteUnits, 40, &mut Rng::new(2)).unwrap_err();
        assert!(err.to_string().contains("the shortest is"), "{err}");
    }
}
