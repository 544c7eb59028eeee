//! The WordNet database (Princeton WordNet 3.0's `index.*`, `data.*` and `*.exc` files),
//! read as NLTK's `WordNetCorpusReader` reads it, for METEOR's third stage: the synonyms
//! of a word are the names of the lemmas of every synset the word belongs to
//! (`nltk.corpus.wordnet.synsets(word)`, every part of speech).
//!
//! A word is looked up as NLTK 3.10's `synsets` does (`_morphy`, per part of speech:
//! noun, verb, adjective, adverb): the word itself and, if it is in the part of speech's
//! exception list (`noun.exc`: `geese goose`), the base forms listed there, otherwise
//! the forms one detachment rule gives (`ches` → `ch`, `ies` → `y`, `ing` → `e`, ...);
//! each form in the part of speech's index contributes its synsets. A synset's lemma
//! names are read from its line in `data.<pos>` (the index names it by byte offset),
//! with the adjective markers `(a)`, `(p)`, `(ip)` removed.
//!
//! Every file is read and checked when the database is opened, so that a lookup cannot
//! fail halfway through scoring.
//!
//! Debian's `wordnet-base` package installs these files in `/usr/share/wordnet`;
//! NLTK's `wordnet` corpus is the same database.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::error::{LetheError, Result};

/// A part of speech's files: `index.<suffix>`, `data.<suffix>`, `<exc>.exc`.
struct PosFiles {
    suffix: &'static str,
    exc: &'static str,
    /// NLTK's detachment rules: a form ending in `.0` may be the base form ending in `.1`.
    rules: &'static [(&'static str, &'static str)],
}

/// Noun, verb, adjective, adverb: NLTK's `POS_LIST` order.
const PARTS: [PosFiles; 4] = [
    PosFiles {
        suffix: "noun",
        exc: "noun",
        rules: &[
            ("s", ""),
            ("ses", "s"),
            ("ves", "f"),
            ("xes", "x"),
            ("zes", "z"),
            ("ches", "ch"),
            ("shes", "sh"),
            ("men", "man"),
            ("ies", "y"),
        ],
    },
    PosFiles {
        suffix: "verb",
        exc: "verb",
        rules: &[("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")],
    },
    PosFiles { suffix: "adj", exc: "adj", rules: &[("er", ""), ("est", ""), ("er", "e"), ("est", "e")] },
    PosFiles { suffix: "adv", exc: "adv", rules: &[] },
];

/// One part of speech of the database.
struct Part {
    /// Lemma (lower case, `_` for spaces) → byte offsets of its synsets in `data.<pos>`.
    index: HashMap<String, Vec<usize>>,
    /// Inflected form → its base forms.
    exceptions: HashMap<String, Vec<String>>,
    /// Byte offset of a synset's line in `data.<pos>` → its lemma names.
    synsets: HashMap<usize, Vec<String>>,
}

/// A WordNet database read into memory.
pub struct WordNet {
    parts: Vec<Part>,
}

impl WordNet {
    /// Reads the database in `dir`. A missing or malformed file is an error naming it.
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(LetheError::data(dir, "is not a folder: --wordnet wants the folder of WordNet's index.noun, data.noun, noun.exc, ... (Debian's wordnet-base installs /usr/share/wordnet)"));
        }
        let parts = PARTS.iter().map(|p| Part::open(dir, p)).collect::<Result<Vec<_>>>()?;
        Ok(WordNet { parts })
    }

    /// The synonyms NLTK's METEOR gives `word`: the names of the lemmas of its synsets in
    /// every part of speech, without those holding `_` (multi-word lemmas), and the word.
    pub fn synonyms(&self, word: &str) -> BTreeSet<String> {
        let word = word.to_lowercase();
        let mut out = BTreeSet::new();
        for (part, files) in self.parts.iter().zip(&PARTS) {
            for form in part.morphy(&word, files.rules) {
                let offsets = part.index.get(&form).into_iter().flatten();
                let names = offsets.filter_map(|o| part.synsets.get(o)).flatten();
                out.extend(names.filter(|n| !n.contains('_')).cloned());
            }
        }
        out.insert(word);
        out
    }
}

impl Part {
    fn open(dir: &Path, files: &PosFiles) -> Result<Self> {
        let read = |name: String| -> Result<(PathBuf, Vec<u8>)> {
            let path = dir.join(name);
            let bytes = crate::input::read(&path).map_err(|e| LetheError::data(&path, e))?;
            Ok((path, bytes))
        };
        let (index_path, index) = read(format!("index.{}", files.suffix))?;
        let (_, exceptions) = read(format!("{}.exc", files.exc))?;
        let (data_path, data) = read(format!("data.{}", files.suffix))?;
        let index = parse_index(&index_path, &index)?;
        let synsets = parse_data(&data_path, &data)?;
        // Every synset the index names must be a line of the data file.
        for (lemma, offsets) in &index {
            if let Some(o) = offsets.iter().find(|o| !synsets.contains_key(o)) {
                let reason =
                    format!("`{lemma}` names a synset at byte {o}, where `{}` has no synset line", data_path.display());
                return Err(LetheError::data(index_path, reason));
            }
        }
        Ok(Part { index, exceptions: parse_exceptions(&exceptions), synsets })
    }

    /// NLTK's `_morphy`: the forms of `form` that are in this part's index, the form
    /// itself first, each once.
    fn morphy(&self, form: &str, rules: &[(&str, &str)]) -> Vec<String> {
        let forms: Vec<String> = match self.exceptions.get(form) {
            Some(bases) => bases.clone(),
            None => rules
                .iter()
                .filter_map(|(old, new)| form.strip_suffix(old).map(|stem| format!("{stem}{new}")))
                .collect(),
        };
        let mut out: Vec<String> = vec![];
        for f in std::iter::once(form.to_string()).chain(forms) {
            if self.index.contains_key(&f) && !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }
}

/// `data.<pos>`: after the licence, one synset a line, `offset lex_filenum ss_type
/// w_cnt (2 hex digits) [word lex_id]{w_cnt} ...`; returns each line's offset and its
/// words, markers removed.
fn parse_data(path: &Path, bytes: &[u8]) -> Result<HashMap<usize, Vec<String>>> {
    let mut synsets = HashMap::new();
    let mut offset = 0;
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let at = offset;
        offset += line.len();
        if line.starts_with(b" ") || line.trim_ascii().is_empty() {
            continue;
        }
        let bad = |why: &str| LetheError::data(path, format!("the line at byte {at}: {why}"));
        let text = std::str::from_utf8(line).map_err(|_| bad("not UTF-8"))?;
        let mut fields = text.split_whitespace();
        if fields.next().and_then(|f| f.parse::<usize>().ok()) != Some(at) {
            return Err(bad("does not start with its own byte offset"));
        }
        let count =
            fields.nth(2).and_then(|c| usize::from_str_radix(c, 16).ok()).ok_or_else(|| bad("no word count"))?;
        let mut names = Vec::with_capacity(count);
        for _ in 0..count {
            let name = fields.next().ok_or_else(|| bad("fewer words than its count"))?;
            names.push(strip_marker(name).to_string());
            fields.next();
        }
        synsets.insert(at, names);
    }
    Ok(synsets)
}

/// `outback(a)` → `outback`: an adjective's syntactic marker is not part of its name.
fn strip_marker(name: &str) -> &str {
    match name.find('(') {
        Some(i) if name.ends_with(')') => &name[..i],
        _ => name,
    }
}

/// `index.<pos>`: after the licence (lines starting with a space), one lemma a line:
/// `lemma pos synset_cnt p_cnt [ptr_symbol]{p_cnt} sense_cnt tagsense_cnt offset{synset_cnt}`.
fn parse_index(path: &Path, bytes: &[u8]) -> Result<HashMap<String, Vec<usize>>> {
    let text = std::str::from_utf8(bytes).map_err(|_| LetheError::data(path, "is not UTF-8"))?;
    let mut index = HashMap::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.starts_with(' ') && !l.is_empty()) {
        let bad = || {
            LetheError::data(
                path,
                format!("line {}: not an index line (lemma pos synset_cnt p_cnt ... offsets)", n + 1),
            )
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| fields.get(i).and_then(|f| f.parse::<usize>().ok()).ok_or_else(bad);
        let synsets = number(2)?;
        let pointers = number(3)?;
        let first = 4 + pointers + 2;
        let offsets = (first..first + synsets).map(number).collect::<Result<Vec<_>>>()?;
        index.insert(fields[0].to_string(), offsets);
    }
    if index.is_empty() {
        return Err(LetheError::data(path, "holds no lemmas"));
    }
    Ok(index)
}

/// `<pos>.exc`: `inflected base [base...]` a line.
fn parse_exceptions(bytes: &[u8]) -> HashMap<String, Vec<String>> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .filter_map(|line| {
            let mut terms = line.split_whitespace().map(str::to_string);
            Some((terms.next()?, terms.collect()))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a WordNet in WordNet's file format: `synsets` per part of speech as
    /// (lemma names, with markers), the index built from them, offsets computed.
    pub(crate) fn write_wordnet(dir: &Path, synsets: [&[&[&str]]; 4], exceptions: [&str; 4]) {
        for ((files, sets), exc) in PARTS.iter().zip(synsets).zip(exceptions) {
            let licence =
                "  1 This software and database is being provided to you, the LICENSEE, by\n  2 Princeton University\n";
            let mut data = licence.to_string();
            let mut index: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
            for words in sets {
                let offset = data.len();
                let pairs: Vec<String> = words.iter().map(|w| format!("{w} 0")).collect();
                data.push_str(&format!(
                    "{offset:08} 00 {} {:02x} {} 000 | a gloss\n",
                    &files.suffix[..1],
                    words.len(),
                    pairs.join(" ")
                ));
                for w in *words {
                    index.entry(strip_marker(w).to_lowercase()).or_default().push(offset);
                }
            }
            let mut idx = licence.to_string();
            for (lemma, offsets) in index {
                let offs: Vec<String> = offsets.iter().map(|o| format!("{o:08}")).collect();
                idx.push_str(&format!(
                    "{lemma} {} {} 1 @ {} 0 {}\n",
                    &files.suffix[..1],
                    offsets.len(),
                    offsets.len(),
                    offs.join(" ")
                ));
            }
            std::fs::write(dir.join(format!("data.{}", files.suffix)), data).unwrap();
            std::fs::write(dir.join(format!("index.{}", files.suffix)), idx).unwrap();
            std::fs::write(dir.join(format!("{}.exc", files.exc)), exc).unwrap();
        }
    }

    pub(crate) fn small_wordnet() -> (tempfile::TempDir, WordNet) {
        let dir = tempfile::tempdir().unwrap();
        let nouns: &[&[&str]] =
            &[&["movie", "film", "picture", "flick", "motion_picture"], &["film", "cinema"], &["goose"], &["box"]];
        let verbs: &[&[&str]] = &[&["film", "shoot", "take"], &["direct", "conduct"]];
        let adjs: &[&[&str]] = &[&["glad", "happy", "felicitous(a)"], &["quick", "speedy"]];
        let advs: &[&[&str]] = &[&["fast", "quickly"]];
        write_wordnet(dir.path(), [nouns, verbs, adjs, advs], ["geese goose\n", "shot shoot\n", "", ""]);
        let wn = WordNet::open(dir.path()).unwrap();
        (dir, wn)
    }

    fn set(words: &[&str]) -> BTreeSet<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn synonyms_gather_every_synset_of_every_part_of_speech() {
        let (_dir, wn) = small_wordnet();
        // Two noun synsets and one verb synset hold "film"; "motion_picture" has a `_`.
        assert_eq!(wn.synonyms("film"), set(&["cinema", "film", "flick", "movie", "picture", "shoot", "take"]));
        // The adjective marker is not part of the name; capitals are looked up lowered.
        assert_eq!(wn.synonyms("Happy"), set(&["felicitous", "glad", "happy"]));
        // A word WordNet does not know is its own only synonym.
        assert_eq!(wn.synonyms("zzz"), set(&["zzz"]));
    }

    #[test]
    fn inflected_forms_are_found_by_rules_and_exceptions() {
        let (_dir, wn) = small_wordnet();
        // Noun rule "s" → "" and verb rule "ing" → "": both parts contribute.
        assert!(wn.synonyms("films").contains("movie"));
        assert!(wn.synonyms("filming").contains("shoot"));
        assert!(!wn.synonyms("filming").contains("movie"));
        // "boxes": the noun rule "xes" → "x" finds "box".
        assert_eq!(wn.synonyms("boxes"), set(&["box", "boxes"]));
        // The exception list replaces the rules: "geese" → "goose"; "shot" → "shoot".
        assert_eq!(wn.synonyms("geese"), set(&["geese", "goose"]));
        assert!(wn.synonyms("shot").contains("take"));
        // Adjective rule "er" → "": "quicker" → "quick" (but "gladder" → "gladd", which
        // only WordNet's adj.exc turns into "glad"). Adverbs have no rules.
        assert!(wn.synonyms("quicker").contains("speedy"));
        assert_eq!(wn.synonyms("gladder"), set(&["gladder"]));
        assert_eq!(wn.synonyms("fasts"), set(&["fasts"]));
    }

    #[test]
    fn a_missing_or_malformed_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = WordNet::open(&dir.path().join("nowhere")).err().unwrap().to_string();
        assert!(err.contains("nowhere") && err.contains("not a folder"), "{err}");
        let err = WordNet::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("index.noun"), "{err}");
        let (dir, _) = small_wordnet();
        std::fs::write(dir.path().join("index.verb"), "film v x\n").unwrap();
        let err = WordNet::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("index.verb") && err.contains("line 1"), "{err}");
        // An offset that points into the middle of a line.
        std::fs::write(dir.path().join("index.verb"), "film v 1 0 1 0 00000005\n").unwrap();
        let err = WordNet::open(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("index.verb") && err.contains("`film`") && err.contains("byte 5") && err.contains("data.verb"),
            "{err}"
        );
        // A data line whose offset is not where it stands.
        let (dir, _) = small_wordnet();
        std::fs::write(dir.path().join("data.adv"), "00000003 00 r 01 fast 0 000 | quickly\n").unwrap();
        let err = WordNet::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("data.adv") && err.contains("byte 0"), "{err}");
    }
}
