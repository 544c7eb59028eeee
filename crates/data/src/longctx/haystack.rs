//! The haystacks needles hide in, each filled to an exact number of units.
//!
//! - [`Haystack::Noise`]: RULER's `repeat` haystack (and the passkey test's filler), the
//!   same five sentences over and over: "The grass is green. The sky is blue. ...".
//! - [`Haystack::Digits`]: sentences of random four-digit groups, a haystack in which a
//!   number cannot be found by being the only one.
//! - [`Haystack::Text`]: a text the user gives (`--haystack FILE`), whitespace folded to
//!   single spaces, from its start, repeated when it is too short (RULER's `essay`).
//! - [`Haystack::Needles`]: RULER's `needle` haystack, distractor needles of random keys
//!   and values, in the same form as the needles themselves.

use std::sync::Arc;

use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;

use super::tasks::{needle_sentence, Kind};
use super::units::Units;
use crate::seq::Token;

/// RULER's repeated noise (from the passkey test of Mohtashami & Jaggi, 2023).
pub const NOISE: &str = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

/// Bytes of a text haystack read at a time (a large file is not tokenised whole).
const TEXT_PIECE: usize = 4096;

/// Where the needles hide.
#[derive(Clone, Debug, PartialEq)]
pub enum Haystack {
    /// The five noise sentences, repeated.
    Noise,
    /// Sentences of eight random four-digit groups.
    Digits,
    /// A text, its whitespace folded.
    Text(Arc<String>),
    /// Distractor needles: random keys and values of these kinds, no key among `except`.
    Needles {
        /// What the keys are made of.
        key: Kind,
        /// What the values are made of.
        value: Kind,
        /// Keys never drawn (the asked ones).
        except: Vec<String>,
    },
}

impl Haystack {
    /// The text of `path` as a haystack: read bounded, whitespace folded; an empty file
    /// is refused.
    pub fn from_file(path: &std::path::Path) -> Result<Haystack> {
        let text = lethe_core::input::read_to_string(path).map_err(|e| LetheError::data(path, e))?;
        let folded = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if folded.is_empty() {
            return Err(LetheError::data(path, "holds no text to make a haystack of"));
        }
        Ok(Haystack::Text(Arc::new(folded)))
    }

    /// Exactly `n` units of haystack, starting with a space. The text is drawn from `rng`
    /// where it is random.
    pub fn fill(&self, units: &dyn Units, n: usize, rng: &mut Rng) -> Result<Vec<Token>> {
        let (mut text, mut cursor) = (String::new(), 0);
        let mut want = n.max(64);
        loop {
            while text.len() < want {
                self.push_piece(&mut text, rng, &mut cursor);
            }
            let mut encoded = units.encode(&text)?;
            if encoded.len() >= n {
                encoded.truncate(n);
                return Ok(encoded);
            }
            want *= 2;
        }
    }

    /// Appends the next piece of the haystack's text to `text`; `cursor` is how far
    /// into a [`Haystack::Text`] the pieces have read.
    fn push_piece(&self, text: &mut String, rng: &mut Rng, cursor: &mut usize) {
        // Every sentence of the haystack starts with a space, the first too: a needle
        // (which starts with one) may go before any of them.
        if *cursor == 0 {
            text.push(' ');
        }
        match self {
            Haystack::Noise => text.push_str(NOISE),
            Haystack::Digits => {
                let groups: Vec<String> = (0..8).map(|_| format!("{:04}", rng.range(0, 9999))).collect();
                text.push_str(&groups.join(" "));
                text.push('.');
            }
            Haystack::Text(source) => {
                // The next few kilobytes from the cursor, cut on a character boundary; at
                // the end the text starts again after a space.
                let mut end = (*cursor + TEXT_PIECE).min(source.len());
                while !source.is_char_boundary(end) {
                    end += 1;
                }
                text.push_str(&source[*cursor..end]);
                *cursor = if end == source.len() { 0 } else { end };
            }
            Haystack::Needles { key, value, except } => {
                let mut k = key.draw(rng);
                while except.contains(&k) {
                    k = key.draw(rng);
                }
                text.push_str(&needle_sentence(*value, &k, &value.draw(rng)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::units::ByteUnits;
    use super::*;

    #[test]
    fn every_haystack_fills_exactly_and_the_same_seed_gives_the_same_bytes() {
        let text = Haystack::Text(Arc::new("A short text. It repeats.".into()));
        for h in [
            Haystack::Noise,
            Haystack::Digits,
            text,
            Haystack::Needles { key: Kind::Words, value: Kind::Numbers, except: vec![] },
        ] {
            for n in [0, 1, 63, 500, 3001] {
                let a = h.fill(&ByteUnits, n, &mut Rng::new(3)).unwrap();
                assert_eq!(a.len(), n, "{h:?}");
                assert_eq!(a, h.fill(&ByteUnits, n, &mut Rng::new(3)).unwrap());
            }
        }
        let d = ByteUnits.decode(&Haystack::Digits.fill(&ByteUnits, 80, &mut Rng::new(1)).unwrap()).unwrap();
        assert!(d.chars().all(|c| c.is_ascii_digit() || c == ' ' || c == '.'), "{d}");
        assert_ne!(d, ByteUnits.decode(&Haystack::Digits.fill(&ByteUnits, 80, &mut Rng::new(2)).unwrap()).unwrap());
    }

    #[test]
    fn a_file_haystack_folds_whitespace_and_an_empty_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.txt");
        std::fs::write(&path, "one\n\n two\tthree ").unwrap();
        assert_eq!(Haystack::from_file(&path).unwrap(), Haystack::Text(Arc::new("one two three".into())));
        std::fs::write(&path, " \n").unwrap();
        let err = Haystack::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("h.txt") && err.contains("no text"), "{err}");
    }
}
