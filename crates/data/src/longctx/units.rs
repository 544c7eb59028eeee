//! The model's units: what a sample's length counts and what its input holds. A byte
//! model reads bytes ([`ByteUnits`]); a tokenised model its tokenizer's ids.

use lethe_core::error::Result;

use crate::seq::Token;
use crate::tokenizer::Tokenizer;

/// Text to units and back.
pub trait Units {
    /// The units of `text`.
    fn encode(&self, text: &str) -> Result<Vec<Token>>;
    /// The text of `units` (lossy where they cut a character).
    fn decode(&self, units: &[Token]) -> Result<String>;
}

/// Bytes: a unit per byte of UTF-8.
pub struct ByteUnits;

impl Units for ByteUnits {
    fn encode(&self, text: &str) -> Result<Vec<Token>> {
        Ok(text.bytes().map(Token::from).collect())
    }

    fn decode(&self, units: &[Token]) -> Result<String> {
        let bytes: Vec<u8> = units.iter().map(|&u| u.min(255) as u8).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl Units for Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<Token>> {
        crate::text::encode_long(self, text)
    }

    fn decode(&self, units: &[Token]) -> Result<String> {
        Tokenizer::decode(self, units)
    }
}

/// Whether `unit`'s text ends a sentence (a `.`, `?` or `!`, or a line break, spaces
/// aside): a needle may go right after it.
pub fn ends_sentence(units: &dyn Units, unit: Token) -> Result<bool> {
    let text = units.decode(&[unit])?;
    Ok(text.trim_end_matches(' ').ends_with(['.', '?', '!', '\n']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        let u = ByteUnits.encode("né.").unwrap();
        assert_eq!(u.len(), 4);
        assert_eq!(ByteUnits.decode(&u).unwrap(), "né.");
        assert!(ends_sentence(&ByteUnits, u[3]).unwrap());
        assert!(!ends_sentence(&ByteUnits, u[0]).unwrap());
    }
}
