//! Metrics of generated text against a reference, as the ∞-former paper scores its
//! dialogue responses (§4.3, Table 2): unigram F1, ROUGE-1, ROUGE-L and METEOR.
//!
//! Each follows the implementation the paper's evaluation called, so that figures are
//! comparable (`scripts/textmetrics-check.py` compares all four with those packages on
//! generated pairs):
//!
//! - **F1** (`compute_f1_score` of the official `eval.py`, SQuAD's normalisation): lower
//!   case, ASCII punctuation removed, the articles a/an/the removed, then the multiset
//!   overlap of words: P = common / |prediction|, R = common / |reference|, F1 = 2PR/(P+R),
//!   0 when nothing is common.
//! - **ROUGE-1 and ROUGE-L** (Lin 2004, as Google's `rouge-score` package with
//!   `use_stemmer=True`): lower case, every run of characters other than `a-z0-9` a word
//!   break, words longer than 3 characters Porter-stemmed; ROUGE-1 from unigram counts,
//!   ROUGE-L from the longest common subsequence. Each gives precision, recall and F.
//! - **METEOR** (Banerjee & Lavie 2005, as `nltk.translate.meteor_score`): whitespace
//!   words in lower case aligned in stages, exact words then Porter stems, then (given a
//!   WordNet database, [`Scorer::with_wordnet`]) WordNet synonyms, each stage matching
//!   from the hypothesis's last free word to the last free reference word it accepts;
//!   Fmean = PR / (αP + (1-α)R) with α = 0.9, a penalty γ (chunks/matches)^β with
//!   β = 3, γ = 0.5, score = Fmean (1 - penalty). As in NLTK, the synonym stage sees the
//!   words the stem stage left, stemmed: a hypothesis word's stem is looked up in WordNet,
//!   and its synonyms are compared with the reference words' stems (so "film" matches
//!   "flick", whose stem is itself, but not "movie", whose stem is "movi"). Without a
//!   WordNet the third stage is left out (lethe does not ship the database), and the score
//!   is at most NLTK's.
//!
//! The Porter stemmer is the `nltk-porter` crate, a port of NLTK's (both packages stem
//! with it).

use std::collections::HashMap;

use nltk_porter::{Mode, PorterStemmer};
use serde::Serialize;

use crate::wordnet::WordNet;

/// Precision, recall and their harmonic mean, each in [0, 1].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Prf {
    pub precision: f64,
    pub recall: f64,
    pub f: f64,
}

impl Prf {
    /// From the number of matched units and the lengths of prediction and reference.
    /// An empty side gives precision or recall 0 (not a division by zero).
    fn of(matched: usize, predicted: usize, reference: usize) -> Self {
        let precision = matched as f64 / predicted.max(1) as f64;
        let recall = matched as f64 / reference.max(1) as f64;
        let f = if precision + recall > 0.0 { 2.0 * precision * recall / (precision + recall) } else { 0.0 };
        Prf { precision, recall, f }
    }
}

/// All four scores of one prediction against one reference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Scores {
    /// Unigram F1 after SQuAD's normalisation.
    pub f1: f64,
    pub rouge1: Prf,
    pub rouge_l: Prf,
    /// METEOR with exact and stem matching, and synonyms where the scorer has a WordNet.
    pub meteor: f64,
}

/// Scores one prediction against its reference with a shared stemmer and, optionally, a
/// WordNet for METEOR's synonyms.
pub struct Scorer {
    stemmer: PorterStemmer,
    wordnet: Option<WordNet>,
}

impl Default for Scorer {
    /// METEOR without the synonym stage.
    fn default() -> Self {
        Scorer { stemmer: PorterStemmer::new(Mode::Nltk), wordnet: None }
    }
}

impl Scorer {
    /// METEOR with all three of NLTK's stages, synonyms from `wordnet`.
    pub fn with_wordnet(wordnet: WordNet) -> Self {
        Scorer { wordnet: Some(wordnet), ..Scorer::default() }
    }

    /// The WordNet of METEOR's synonym stage, if any.
    pub fn wordnet(&self) -> Option<&WordNet> {
        self.wordnet.as_ref()
    }

    /// All four metrics of `prediction` against `reference`.
    pub fn score(&self, prediction: &str, reference: &str) -> Scores {
        let (p, r) = (self.rouge_tokens(prediction), self.rouge_tokens(reference));
        Scores {
            f1: f1(prediction, reference),
            rouge1: rouge_n1(&p, &r),
            rouge_l: rouge_lcs(&p, &r),
            meteor: self.meteor(prediction, reference),
        }
    }

    /// `rouge-score`'s tokens: lower case, non-`[a-z0-9]` runs as breaks, words of more
    /// than 3 characters stemmed.
    pub fn rouge_tokens(&self, text: &str) -> Vec<String> {
        let lower = text.to_lowercase();
        lower
            .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
            .filter(|w| !w.is_empty())
            .map(|w| if w.chars().count() > 3 { self.stemmer.stem(w) } else { w.to_string() })
            .filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
            .collect()
    }

    /// METEOR of `hypothesis` against `reference` (exact, stem and, with a WordNet,
    /// synonym stages).
    pub fn meteor(&self, hypothesis: &str, reference: &str) -> f64 {
        let hyp: Vec<String> = hypothesis.split_whitespace().map(str::to_lowercase).collect();
        let refs: Vec<String> = reference.split_whitespace().map(str::to_lowercase).collect();
        let mut free_hyp: Vec<(usize, String)> = hyp.iter().cloned().enumerate().collect();
        let mut free_ref: Vec<(usize, String)> = refs.iter().cloned().enumerate().collect();
        let itself = |w: &str| vec![w.to_string()];
        let mut matches = match_stage(&mut free_hyp, &mut free_ref, itself);
        let stem = |list: &mut Vec<(usize, String)>| list.iter_mut().for_each(|(_, w)| *w = self.stemmer.stem(w));
        stem(&mut free_hyp);
        stem(&mut free_ref);
        matches.extend(match_stage(&mut free_hyp, &mut free_ref, itself));
        if let Some(wordnet) = &self.wordnet {
            matches.extend(match_stage(&mut free_hyp, &mut free_ref, |w| wordnet.synonyms(w).into_iter().collect()));
        }
        matches.sort_by_key(|&(h, _)| h);
        meteor_of(&matches, hyp.len(), refs.len())
    }
}

/// One alignment stage: from the last free hypothesis word backwards, each takes the
/// last free reference word among the words `accepts` gives it (itself, or its
/// synonyms). Matched words leave both lists.
fn match_stage(
    hyp: &mut Vec<(usize, String)>,
    reference: &mut Vec<(usize, String)>,
    accepts: impl Fn(&str) -> Vec<String>,
) -> Vec<(usize, usize)> {
    let mut positions: HashMap<&str, Vec<usize>> = HashMap::new();
    for (j, (_, w)) in reference.iter().enumerate() {
        positions.entry(w.as_str()).or_default().push(j);
    }
    let (mut hyp_taken, mut ref_taken) = (vec![false; hyp.len()], vec![false; reference.len()]);
    let mut matches = Vec::new();
    for i in (0..hyp.len()).rev() {
        // The accepted word whose last free position is the latest.
        let accepted = accepts(&hyp[i].1);
        let best = accepted
            .iter()
            .filter_map(|w| positions.get(w.as_str()).and_then(|p| p.last()).map(|&j| (j, w)))
            .max_by_key(|&(j, _)| j);
        if let Some(j) = best.and_then(|(_, w)| positions.get_mut(w.as_str())).and_then(Vec::pop) {
            hyp_taken[i] = true;
            ref_taken[j] = true;
            matches.push((hyp[i].0, reference[j].0));
        }
    }
    let keep = |list: &mut Vec<(usize, String)>, taken: &[bool]| {
        let mut k = 0;
        list.retain(|_| {
            k += 1;
            !taken[k - 1]
        });
    };
    keep(hyp, &hyp_taken);
    keep(reference, &ref_taken);
    matches
}

/// METEOR from the alignment (sorted by hypothesis position) and the two lengths.
fn meteor_of(matches: &[(usize, usize)], hyp_len: usize, ref_len: usize) -> f64 {
    const ALPHA: f64 = 0.9;
    const BETA: f64 = 3.0;
    const GAMMA: f64 = 0.5;
    let m = matches.len();
    if m == 0 {
        return 0.0;
    }
    let precision = m as f64 / hyp_len as f64;
    let recall = m as f64 / ref_len as f64;
    let fmean = precision * recall / (ALPHA * precision + (1.0 - ALPHA) * recall);
    let chunks = 1 + matches.windows(2).filter(|w| !(w[1].0 == w[0].0 + 1 && w[1].1 == w[0].1 + 1)).count();
    let penalty = GAMMA * (chunks as f64 / m as f64).powf(BETA);
    (1.0 - penalty) * fmean
}

/// ROUGE-1: clipped unigram counts.
pub fn rouge_n1(prediction: &[String], reference: &[String]) -> Prf {
    let (p, r) = (counts(prediction), counts(reference));
    let common: usize = r.iter().map(|(w, &n)| n.min(p.get(w).copied().unwrap_or(0))).sum();
    Prf::of(common, prediction.len(), reference.len())
}

/// How often each word occurs.
fn counts(words: &[String]) -> HashMap<&str, usize> {
    let mut c: HashMap<&str, usize> = HashMap::new();
    words.iter().for_each(|w| *c.entry(w.as_str()).or_default() += 1);
    c
}

/// ROUGE-L: the longest common subsequence; 0 when either side is empty.
pub fn rouge_lcs(prediction: &[String], reference: &[String]) -> Prf {
    if prediction.is_empty() || reference.is_empty() {
        return Prf::default();
    }
    Prf::of(lcs_len(prediction, reference), prediction.len(), reference.len())
}

/// Length of the longest common subsequence, one row of the table at a time.
fn lcs_len(a: &[String], b: &[String]) -> usize {
    let mut row = vec![0usize; b.len() + 1];
    for x in a {
        let mut diagonal = 0;
        for (j, y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if x == y { diagonal + 1 } else { above.max(row[j]) };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// SQuAD's answer normalisation, as words: lower case, ASCII punctuation removed,
/// articles dropped.
pub fn normalised_words(text: &str) -> Vec<String> {
    let cleaned: String = text.to_lowercase().chars().filter(|c| !c.is_ascii_punctuation()).collect();
    cleaned.split_whitespace().filter(|w| !matches!(*w, "a" | "an" | "the")).map(str::to_string).collect()
}

/// Unigram F1 of the official evaluation (`compute_f1_score`).
pub fn f1(prediction: &str, reference: &str) -> f64 {
    let (p, r) = (normalised_words(prediction), normalised_words(reference));
    let common = rouge_n1(&p, &r);
    if common.precision == 0.0 {
        return 0.0;
    }
    common.f
}

/// Means of every score over `(prediction, reference)` pairs; `None` for no pairs.
pub fn mean(scores: &[Scores]) -> Option<Scores> {
    if scores.is_empty() {
        return None;
    }
    let n = scores.len() as f64;
    let avg = |get: &dyn Fn(&Scores) -> f64| scores.iter().map(get).sum::<f64>() / n;
    let prf = |get: &dyn Fn(&Scores) -> Prf| Prf {
        precision: avg(&|s| get(s).precision),
        recall: avg(&|s| get(s).recall),
        f: avg(&|s| get(s).f),
    };
    Some(Scores {
        f1: avg(&|s| s.f1),
        rouge1: prf(&|s| s.rouge1),
        rouge_l: prf(&|s| s.rouge_l),
        meteor: avg(&|s| s.meteor),
    })
}

/// One response per line of a text file (UTF-8; a trailing newline ends the last line).
pub fn read_lines(path: &std::path::Path) -> crate::Result<Vec<String>> {
    let bytes = crate::input::read(path).map_err(|e| crate::LetheError::data(path, e))?;
    let text = crate::data::text::utf8(bytes, path)?;
    Ok(text.lines().map(str::to_string).collect())
}

/// The most words a line [`score_files`] scores may hold: ROUGE-L's longest common
/// subsequence and METEOR's alignment take time in the square of a line's length (a
/// pair of 20,000 words scores in about 2 s on a CPU core, one of 100,000 in 45 s), so a
/// file that is not one response a line (a whole document on one) is refused rather than
/// scored for hours.
pub const MAX_WORDS_PER_LINE: usize = 50_000;

/// Refuses the first line of `lines` (read from `path`) past [`MAX_WORDS_PER_LINE`].
fn check_line_lengths(path: &std::path::Path, lines: &[String]) -> crate::Result<()> {
    let mut counts = lines.iter().enumerate().map(|(i, l)| (i + 1, l.split_whitespace().count()));
    match counts.find(|&(_, words)| words > MAX_WORDS_PER_LINE) {
        Some((line, words)) => Err(crate::LetheError::data(
            path,
            format!(
                "line {line} holds {words} words; score takes one response a line, of at most {MAX_WORDS_PER_LINE} words (ROUGE-L and METEOR take time in the square of a line's length)"
            ),
        )),
        None => Ok(()),
    }
}

/// Scores each prediction against the reference on the same line of two files. The
/// files must hold the same number of lines, at least one, each of at most
/// [`MAX_WORDS_PER_LINE`] words.
pub fn score_files(
    predictions: &std::path::Path,
    references: &std::path::Path,
    scorer: &Scorer,
) -> crate::Result<Vec<Scores>> {
    let (p, r) = (read_lines(predictions)?, read_lines(references)?);
    if p.is_empty() {
        return Err(crate::LetheError::data(predictions, "holds no lines to score"));
    }
    if p.len() != r.len() {
        let reason = format!(
            "has {} lines but `{}` has {}: each prediction needs the reference on the same line",
            p.len(),
            references.display(),
            r.len()
        );
        return Err(crate::LetheError::data(predictions, reason));
    }
    check_line_lengths(predictions, &p)?;
    check_line_lengths(references, &r)?;
    Ok(p.iter().zip(&r).map(|(p, r)| scorer.score(p, r)).collect())
}

/// The scores as CSV, one row per pair (numbered from 1, as lines are) with every
/// precision, recall and F.
pub fn csv(scores: &[Scores]) -> crate::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["line", "f1", "rouge1_p", "rouge1_r", "rouge1_f", "rougeL_p", "rougeL_r", "rougeL_f", "meteor"])?;
    for (i, s) in scores.iter().enumerate() {
        let values = [
            s.f1,
            s.rouge1.precision,
            s.rouge1.recall,
            s.rouge1.f,
            s.rouge_l.precision,
            s.rouge_l.recall,
            s.rouge_l.f,
            s.meteor,
        ];
        let mut row = vec![(i + 1).to_string()];
        row.extend(values.iter().map(|v| format!("{v:.6}")));
        w.write_record(&row)?;
    }
    w.into_inner().map_err(|e| crate::LetheError::Invalid(format!("csv: {e}")))
}

/// The means as lines for a terminal, in percent as the paper's Table 2; METEOR says
/// which stages it had (`synonyms`: whether the scorer had a WordNet).
pub fn summary(mean: &Scores, pairs: usize, synonyms: bool) -> String {
    let prf = |p: &Prf| format!("P {:6.2}  R {:6.2}  F {:6.2}", 100.0 * p.precision, 100.0 * p.recall, 100.0 * p.f);
    let stages = if synonyms { "exact, stem, WordNet synonyms" } else { "exact, stem; --wordnet DIR adds synonyms" };
    format!(
        "pairs    {pairs}\nf1       {:6.2}\nrouge1   {}\nrougeL   {}\nmeteor   {:6.2}  ({stages})",
        100.0 * mean.f1,
        prf(&mean.rouge1),
        prf(&mean.rouge_l),
        100.0 * mean.meteor
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn f1_by_hand() {
        // "the cat sat on the mat" -> cat sat on mat; "a cat, on a mat!" -> cat on mat.
        // common 3: P = 3/3, R = 3/4, F1 = 2 * 1 * 0.75 / 1.75.
        let f = f1("a cat, on a mat!", "the cat sat on the mat");
        assert!((f - 1.5 / 1.75).abs() < 1e-12, "{f}");
        assert_eq!(f1("", "anything"), 0.0);
        assert_eq!(f1("dog", "cat"), 0.0);
        // Repeated words are clipped: "cat cat cat" against "cat": P 1/3, R 1.
        assert!((f1("cat cat cat", "cat") - 0.5).abs() < 1e-12);
    }

    #[test]
    fn a_line_past_the_most_words_is_refused_by_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let (short, long) = (dir.path().join("short.txt"), dir.path().join("long.txt"));
        std::fs::write(&short, "a reply\nanother reply\n").unwrap();
        let words = vec!["w"; MAX_WORDS_PER_LINE + 1].join(" ");
        std::fs::write(&long, format!("fine\n{words}\n")).unwrap();
        let e = score_files(&short, &long, &Scorer::default()).unwrap_err().to_string();
        assert!(e.contains("long.txt") && e.contains("line 2 holds 50001 words"), "{e}");
        std::fs::write(&long, format!("fine\n{}\n", &words[2..])).unwrap(); // one word fewer
        assert_eq!(score_files(&short, &long, &Scorer::default()).unwrap().len(), 2);
    }

    #[test]
    fn rouge_by_hand() {
        // prediction a b c d, reference a c b e d: unigrams 4 common; LCS a b d or a c d = 3.
        let (p, r) = (words("a b c d"), words("a c b e d"));
        let one = rouge_n1(&p, &r);
        assert_eq!((one.precision, one.recall), (1.0, 0.8));
        let l = rouge_lcs(&p, &r);
        assert_eq!((l.precision, l.recall), (0.75, 0.6));
        assert!((l.f - 2.0 * 0.75 * 0.6 / 1.35).abs() < 1e-12);
        assert_eq!(rouge_lcs(&[], &r), Prf::default());
    }

    #[test]
    fn rouge_tokens_break_at_non_alphanumerics_and_stem_long_words() {
        let s = Scorer::default();
        assert_eq!(s.rouge_tokens("The cats' running-dogs, 42x!"), vec!["the", "cat", "run", "dog", "42x"]);
        // Words of 3 characters or fewer are not stemmed ("ran", "was").
        assert_eq!(s.rouge_tokens("was ran"), vec!["was", "ran"]);
    }

    #[test]
    fn meteor_by_hand() {
        let s = Scorer::default();
        // Identical 4-word sentences: P = R = 1, one chunk of 4: penalty 0.5 * (1/4)^3.
        let m = s.meteor("the cat sat down", "The cat sat down");
        assert!((m - (1.0 - 0.5 / 64.0)).abs() < 1e-12, "{m}");
        // "cats" matches "cat" only in the stem stage; "sat" then "down" swapped:
        // matches (0,0) (1,2) (2,1): 3 chunks; P = 1, R = 3/3.
        let m = s.meteor("cats down sat", "cat sat down");
        let expected = 1.0 - 0.5 * (3.0f64 / 3.0).powi(3);
        assert!((m - expected).abs() < 1e-12, "{m}");
        // P = 2/4, R = 2/2: Fmean = 0.5 / (0.45 + 0.1); one chunk of 2.
        let m = s.meteor("a b x y", "a b");
        let fmean = 0.5 / 0.55;
        assert!((m - fmean * (1.0 - 0.5 / 8.0)).abs() < 1e-12, "{m}");
        assert_eq!(s.meteor("", "a b"), 0.0);
        assert_eq!(s.meteor("x", "a b"), 0.0);
    }

    #[test]
    fn meteor_takes_the_last_free_reference_word_from_the_last_hypothesis_word() {
        // hyp "a a", ref "a b a": hyp 1 -> ref 2, hyp 0 -> ref 0: two chunks.
        let s = Scorer::default();
        let m = s.meteor("a a", "a b a");
        let (p, r) = (1.0, 2.0 / 3.0);
        let fmean = p * r / (0.9 * p + 0.1 * r);
        assert!((m - fmean * (1.0 - 0.5 * 1.0f64.powi(3))).abs() < 1e-12, "{m}");
    }

    #[test]
    fn meteor_matches_wordnet_synonyms_of_the_stems_the_stem_stage_left() {
        let (_dir, wn) = crate::wordnet::tests::small_wordnet();
        let (plain, s) = (Scorer::default(), Scorer::with_wordnet(wn));
        // "flick" is a synonym of "film" and its own stem: two matches in one chunk.
        assert!((s.meteor("the film", "the flick") - (1.0 - 0.5 / 8.0)).abs() < 1e-12);
        // Without WordNet only "the" matches: P = R = 1/2, one chunk of one.
        assert!((plain.meteor("the film", "the flick") - 0.5 * 0.5).abs() < 1e-12);
        // The reference word is compared by its stem: "movie" stems to "movi", no lemma.
        assert_eq!(s.meteor("film", "movie"), 0.0);
        // The hypothesis word is looked up by its stem: "happy" stems to "happi", which
        // WordNet does not know, while "glad" (its own stem) finds "happy" but the
        // reference's stem is "happi".
        assert_eq!(s.meteor("happy", "glad"), 0.0);
        assert_eq!(s.meteor("glad", "happy"), 0.0);
        // "films" stems to "film"; the noun rules then find it.
        assert!(s.meteor("films", "flick") > 0.0);
    }

    #[test]
    fn meteor_takes_the_latest_free_synonym_in_the_reference() {
        let (_dir, wn) = crate::wordnet::tests::small_wordnet();
        let s = Scorer::with_wordnet(wn);
        // "the" matches exactly; "film" accepts "cinema" (1) and "flick" (2) and takes
        // "flick": matches (0, 0), (1, 2), two chunks. P = 1, R = 2/3.
        let (p, r) = (1.0, 2.0 / 3.0);
        let fmean = p * r / (0.9 * p + 0.1 * r);
        let m = s.meteor("the film", "the cinema flick");
        assert!((m - fmean * (1.0 - 0.5)).abs() < 1e-12, "{m}");
    }

    #[test]
    fn mean_averages_each_field() {
        let s = Scorer::default();
        let a = s.score("a cat", "a cat");
        let b = s.score("dog", "cat");
        let m = mean(&[a, b]).unwrap();
        assert!((m.f1 - 0.5).abs() < 1e-12);
        assert!((m.rouge1.recall - 0.5).abs() < 1e-12);
        assert!(mean(&[]).is_none());
    }
}
