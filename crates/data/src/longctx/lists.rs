//! RULER's aggregation tasks, whose context is a list of words rather than a haystack
//! with needles, so that they have no depth: the answer is spread over the whole list.
//!
//! - `cwe`, common-words extraction: a numbered list (`1. tavemo 2. rikola ...`) in
//!   which ten words appear `freq_cw` times each and the others `freq_ucw` times; the
//!   ten are asked. RULER's counts: 30 and 3 from 4096 units on, 6 and 1 below.
//! - `fwe`, frequent-words extraction: a coded text of random six-letter words drawn
//!   from a Zipf law of exponent 2 (word of rank `k` appears `floor(n k^-2 / zeta(2))`
//!   times in a text of `n` words; the top rank is the noise word `...`); the three most
//!   frequent coded words are asked. RULER's vocabulary: a word per 50 units of length.
//!
//! Where lethe differs: RULER's common words are English words from a word list; lethe
//! invents pronounceable ones (a consonant and a vowel, three times), so that any number
//! can be drawn offline. RULER grows the list in steps until the length is reached and
//! prefixes a worked example below 4096 tokens; lethe fits the list to the exact length
//! (padding with words that appear once, or with the noise word, which change no answer)
//! and gives no example. The answers are listed in the order they first appear
//! (`cwe`) or by frequency (`fwe`), the order a trained model is taught to give them.

use lethe_core::error::Result;
use lethe_core::rng::Rng;

use super::assemble::{assemble_list, List};
use super::tasks::distinct;
use super::units::Units;
use super::{Sample, Scoring};

/// The words `cwe` asks for.
const COMMON: usize = 10;

/// The three words `fwe` asks for.
const FREQUENT: usize = 3;

/// Units from which RULER's long-context counts apply.
const LONG: usize = 4096;

/// A `cwe` sample of exactly `length` units.
pub fn common_words(length: usize, units: &dyn Units, rng: &mut Rng) -> Result<Sample> {
    let (freq_cw, freq_ucw) = if length >= LONG { (30, 3) } else { (6, 1) };
    // Enough words for any list the length can hold, and its padding.
    let words = invented_words(COMMON + length + 1, rng);
    let (common, others) = words.split_at(COMMON);
    let order_seed = rng.next_u64();
    let items = |n: usize| {
        let mut items: Vec<&str> = Vec::with_capacity(COMMON * freq_cw + n * freq_ucw);
        for _ in 0..freq_cw {
            items.extend(common.iter().map(String::as_str));
        }
        for _ in 0..freq_ucw {
            items.extend(others[..n.min(others.len())].iter().map(String::as_str));
        }
        Rng::new(order_seed).shuffle(&mut items);
        items
    };
    let body = |n: usize| numbered(&items(n), 1);
    let pad = |n: usize, k: usize| {
        let from = COMMON * freq_cw + n * freq_ucw + 1;
        let fresh: Vec<&str> = others[n.min(others.len())..].iter().map(String::as_str).take(k).collect();
        numbered(&fresh, from)
    };
    let list = List {
        task: "cwe",
        head: "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.".into(),
        body: &body,
        fewest: 0,
        pad: &pad,
        tail: format!(
            " Question: What are the {COMMON} most common words in the above list? Answer: The top {COMMON} words that appear most often in the list are:"
        ),
        answers: common.to_vec(),
        scoring: Scoring::All,
    };
    let mut sample = assemble_list(&list, units, length)?;
    // The answers in the order they first appear in the list that fitted.
    let context = units.decode(&sample.input[sample.haystack.0..sample.haystack.1])?;
    sample.answers.sort_by_key(|w| context.find(&format!(". {w}")).unwrap_or(usize::MAX));
    Ok(sample)
}

/// `" 1. tavemo 2. rikola ..."`, numbered from `from`.
fn numbered(words: &[&str], from: usize) -> String {
    words.iter().enumerate().map(|(i, w)| format!(" {}. {w}", from + i)).collect()
}

/// `n` distinct pronounceable words of three syllables.
pub fn invented_words(n: usize, rng: &mut Rng) -> Vec<String> {
    const CONSONANTS: &[u8] = b"bdfgklmnprstvz";
    const VOWELS: &[u8] = b"aeiou";
    distinct(n, rng, |rng| {
        (0..3)
            .flat_map(|_| {
                let c = CONSONANTS[rng.range(0, CONSONANTS.len() - 1)];
                let v = VOWELS[rng.range(0, VOWELS.len() - 1)];
                [char::from(c), char::from(v)]
            })
            .collect()
    })
}

/// Words a `fwe` text has at least: the three asked then each appear more often than
/// the fourth (2, 1 and 0 times at the floor of Zipf's counts, against 1 below this).
const FWE_FEWEST: usize = 40;

/// A `fwe` sample of exactly `length` units.
pub fn frequent_words(length: usize, units: &dyn Units, rng: &mut Rng) -> Result<Sample> {
    let vocab_size = (length / 50).max(FREQUENT + 2);
    let mut vocab = coded_words(vocab_size, rng);
    vocab[0] = NOISE_WORD.to_string();
    let order_seed = rng.next_u64();
    let body = |n: usize| {
        let mut words: Vec<&str> = Vec::new();
        for (rank, word) in vocab.iter().enumerate() {
            words.extend(std::iter::repeat_n(word.as_str(), zipf_count(n, rank + 1)));
        }
        Rng::new(order_seed).shuffle(&mut words);
        words.iter().map(|w| format!(" {w}")).collect::<String>()
    };
    let pad = |_: usize, k: usize| format!(" {NOISE_WORD}").repeat(k);
    let list = List {
        task: "fwe",
        head: "Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words.".into(),
        body: &body,
        fewest: FWE_FEWEST,
        pad: &pad,
        tail: " Question: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text? Answer: According to the coded text above, the three most frequently appeared words are:".into(),
        answers: vocab[1..=FREQUENT].to_vec(),
        scoring: Scoring::All,
    };
    assemble_list(&list, units, length)
}

/// The word of the top rank in a `fwe` text, to be ignored.
const NOISE_WORD: &str = "...";

/// How often the word of `rank` (from 1) appears in a `fwe` text of `n` words.
fn zipf_count(n: usize, rank: usize) -> usize {
    let zeta_2 = std::f64::consts::PI * std::f64::consts::PI / 6.0;
    (n as f64 / (rank * rank) as f64 / zeta_2) as usize
}

/// `n` distinct random six-letter lowercase words.
fn coded_words(n: usize, rng: &mut Rng) -> Vec<String> {
    distinct(n, rng, |rng| (0..6).map(|_| char::from(b'a' + rng.range(0, 25) as u8)).collect())
}

#[cfg(test)]
mod tests {
    use super::super::units::ByteUnits;
    use super::*;

    /// Counts of each word of a text, the numbers of a numbered list left out.
    fn counts(text: &str) -> Vec<(String, usize)> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for word in text.split(' ').filter(|w| !w.is_empty() && !w.ends_with('.')) {
            match counts.iter_mut().find(|(w, _)| w == word) {
                Some((_, c)) => *c += 1,
                None => counts.push((word.to_string(), 1)),
            }
        }
        counts.sort_by_key(|c| std::cmp::Reverse(c.1));
        counts
    }

    /// The context of a sample: between the instruction and the question.
    fn context(s: &Sample) -> String {
        ByteUnits.decode(&s.input[s.haystack.0..s.haystack.1]).unwrap()
    }

    #[test]
    fn the_ten_common_words_are_the_ten_most_frequent_of_the_list() {
        for (length, seed) in [(1200, 1), (3000, 2), (5000, 3)] {
            let s = common_words(length, &ByteUnits, &mut Rng::new(seed)).unwrap();
            assert_eq!(s.input.len(), length);
            let counts = counts(&context(&s));
            let (top, rest) = counts.split_at(COMMON);
            let mut read: Vec<&str> = top.iter().map(|(w, _)| w.as_str()).collect();
            let mut expected: Vec<&str> = s.answers.iter().map(String::as_str).collect();
            read.sort();
            expected.sort();
            assert_eq!(read, expected, "{length}");
            assert!(top[COMMON - 1].1 > rest[0].1, "{length}: {counts:?}");
            assert!(top[0].1 == if length >= LONG { 30 } else { 6 }, "{counts:?}");
        }
    }

    #[test]
    fn the_three_frequent_words_are_the_three_most_frequent_coded_words() {
        for (length, seed) in [(700, 1), (2000, 2), (9000, 3)] {
            let s = frequent_words(length, &ByteUnits, &mut Rng::new(seed)).unwrap();
            assert_eq!(s.input.len(), length);
            let counts: Vec<(String, usize)> =
                counts(&context(&s)).into_iter().filter(|(w, _)| w.len() == 6 && !w.contains('.')).collect();
            let read: Vec<&str> = counts[..FREQUENT].iter().map(|(w, _)| w.as_str()).collect();
            assert_eq!(read, s.answers.iter().map(String::as_str).collect::<Vec<_>>(), "{length}: {counts:?}");
            assert!(counts[FREQUENT - 1].1 > counts.get(FREQUENT).map_or(0, |c| c.1), "{counts:?}");
        }
    }

    #[test]
    fn the_lists_are_seeded_and_a_short_length_is_refused() {
        let a = common_words(1500, &ByteUnits, &mut Rng::new(4)).unwrap();
        assert_eq!(a, common_words(1500, &ByteUnits, &mut Rng::new(4)).unwrap());
        assert_ne!(a, common_words(1500, &ByteUnits, &mut Rng::new(5)).unwrap());
        let err = frequent_words(300, &ByteUnits, &mut Rng::new(4)).unwrap_err().to_string();
        assert!(err.contains("fwe") && err.contains("the shortest is"), "{err}");
    }

    #[test]
    fn zipf_counts_follow_the_law() {
        // 1000 / (k^2 * pi^2 / 6): 607.9, 151.9, 67.5, 37.9.
        assert_eq!((1..=4).map(|k| zipf_count(1000, k)).collect::<Vec<_>>(), vec![607, 151, 67, 37]);
    }
}
