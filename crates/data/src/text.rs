//! Text for language models with real vocabularies (∞-former paper 4.2 and App. D):
//! Wikitext-103's three files, and the tokenisation of any text source (`file`, `folder`,
//! `wikitext`) with a pretrained model's tokenizer (`data.tokenizer`), with the words of
//! the raw text counted for perplexity per word.
//!
//! Words: the whitespace-separated tokens of the raw text; for Wikitext also one `<eos>`
//! per line, as the word-level models of Transformer-XL (and the ∞-former's App. D)
//! predict it, which is how its test split counts 245,569 tokens. Perplexity per word is
//! then `exp(loss · tokens / words)`: the mean loss per token scaled by the split's
//! tokens per word, so that a model of any tokenizer (bytes, BPE, words) is compared on
//! the same unit.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::task::spec::{Metric, Task};
use lethe_core::checkpoint::Checkpoint;
use lethe_core::config::{Config, DataConfig, FolderMode};
use lethe_core::error::{LetheError, Result};

use super::seq::{Split, SplitData, Token, TokenSeq};
use super::stream::TrainStreams;
use super::tokenizer::Tokenizer;

/// Words of `text`: whitespace-separated tokens, plus one per line when `eos_per_line`.
pub fn count_words(text: &[u8], eos_per_line: bool) -> u64 {
    let words = text.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty()).count();
    let lines = if eos_per_line { text.split(|&b| b == b'\n').count() - usize::from(text.ends_with(b"\n")) } else { 0 };
    (words + lines) as u64
}

/// Longest piece of text given to the tokenizer at once (bytes), before it is cut at a
/// line start.
const CHUNK_BYTES: usize = 1 << 20;

/// Text each piece is tokenised with beyond its ends (bytes), so that the ids around a
/// cut are those the tokenizer gives with the text on both sides of it.
const SEAM_BYTES: usize = 4096;

/// Tokens in a row on which two neighbouring pieces must agree to be joined there.
const SEAM_AGREE: usize = 8;

/// Starts tried for a piece's window, a byte apart, when it does not fall in step with
/// the piece before it (in a run of one character or pattern longer than a seam, where
/// a BPE's tokens depend on where the run starts): at least any token's length.
const SEAM_STARTS: usize = 256;

/// Most text two or more pieces that fall in step at no start are tokenised in as one
/// window (a word or a run of one character longer than a seam, through a word-level
/// tokenizer): past it, the text is refused rather than the memory bound given up.
const MERGED_BYTES: usize = 8 << 20;

/// `text` in pieces of [`CHUNK_BYTES`] to twice that, each cut at the first of these
/// past [`CHUNK_BYTES`] (where most pre-tokenizers, GPT-2's, Llama 3's and whitespace,
/// end a token anyway):
/// - just after a newline that a non-space character follows, or a single space then one;
/// - else, in a long line, just before a space that a non-space character follows;
/// - else (a run of two megabytes without a space), at the first character boundary,
///   so that no text, however it is written, is handed to the tokenizer whole.
pub fn chunks(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = vec![];
    let mut start = 0;
    while bytes.len() - start > 2 * CHUNK_BYTES {
        let past = start + CHUNK_BYTES..start + 2 * CHUNK_BYTES;
        let cut = past
            .clone()
            .find(|&i| line_start(bytes, i))
            .or_else(|| past.clone().find(|&i| word_start(bytes, i)))
            .unwrap_or_else(|| text.ceil_char_boundary(past.start));
        out.push(&text[start..cut]);
        start = cut;
    }
    // The rest, at most two pieces' worth: cut once more where a line starts, if one does.
    match (start + CHUNK_BYTES..bytes.len()).find(|&i| line_start(bytes, i)) {
        Some(cut) => out.extend([&text[start..cut], &text[cut..]]),
        None => out.push(&text[start..]),
    }
    out
}

/// Whether byte `i` starts a line: a newline before it, and after it a character that
/// is not whitespace, or one space then such a character.
fn line_start(bytes: &[u8], i: usize) -> bool {
    bytes[i - 1] == b'\n' && (solid(bytes, i) || (bytes[i] == b' ' && solid(bytes, i + 1)))
}

/// Whether byte `i` is a space that a non-space character follows.
fn word_start(bytes: &[u8], i: usize) -> bool {
    bytes[i] == b' ' && solid(bytes, i + 1)
}

/// Whether byte `i` is there and not whitespace.
fn solid(bytes: &[u8], i: usize) -> bool {
    bytes.get(i).is_some_and(|b| !b.is_ascii_whitespace())
}

/// The ids of a long `text`: those of the text tokenised whole, computed in [`chunks`]
/// so that memory stays bounded (the tokenizer's encodings of a piece, with offsets,
/// strings and masks, take about 35 times its bytes: 19 GB for all of Wikitext-103 at
/// once).
///
/// Each piece is tokenised with [`SEAM_BYTES`] of the text on either side, and
/// neighbours are joined at the first token after their cut where both give the same
/// [`SEAM_AGREE`] tokens at the same places. That makes the join exact for tokenizers
/// whose ids at a piece's start depend on what precedes it, such as Llama 2's and
/// Mistral's, which put a `▁` before the first word of every text they are given.
///
/// Where the cut falls in a run longer than a seam (a megabyte of spaces or of one
/// letter), a BPE's tokens in the run depend on where it starts, and a piece whose
/// window starts in the run may never fall in step with the piece before. Its window
/// is then started up to [`SEAM_STARTS`] bytes earlier, one byte at a time, until the
/// two agree. Where no start does (a word longer than a seam through a word-level
/// tokenizer is one token), the two pieces are tokenised as one window, and so on with
/// the next, up to [`MERGED_BYTES`] of text; a text that needs more is refused with an
/// error naming the byte, rather than tokenised whole beyond the memory bound.
pub fn encode_long(tokenizer: &Tokenizer, text: &str) -> Result<Vec<Token>> {
    encode_prefix(tokenizer, text, usize::MAX)
}

/// The first ids of a long `text`, as [`encode_long`] gives them, tokenising no more
/// pieces than it takes to know at least `wanted` of them (all, in a shorter text):
/// for a command that reads only the start of a large file.
pub fn encode_prefix(tokenizer: &Tokenizer, text: &str, wanted: usize) -> Result<Vec<Token>> {
    // As many pieces at a time as the machine has cores.
    let at_once = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
    encode_in_groups(tokenizer, text, wanted, at_once)
}

/// [`encode_prefix`], tokenising `at_once` pieces at a time (at least 2).
pub(crate) fn encode_in_groups(tokenizer: &Tokenizer, text: &str, wanted: usize, at_once: usize) -> Result<Vec<Token>> {
    let spans = piece_spans(text);
    if spans.len() == 1 {
        return tokenizer.encode(text);
    }
    let mut ids = Vec::with_capacity((text.len() / 4).min(wanted));
    // The piece before the one in hand, and the byte where its tokens to keep start.
    let mut before: Option<Window> = None;
    let mut from = 0;
    for group in spans.chunks(at_once.max(2)) {
        let windows: Vec<(usize, usize)> = group
            .iter()
            .map(|&(s, e)| {
                (text.floor_char_boundary(s.saturating_sub(SEAM_BYTES)), text.ceil_char_boundary(e + SEAM_BYTES))
            })
            .collect();
        let texts: Vec<&str> = windows.iter().map(|&(a, b)| &text[a..b]).collect();
        let encoded = tokenizer.encode_batch_at(&texts)?;
        for ((&(cut, _), &(a, b)), (piece_ids, starts)) in group.iter().zip(&windows).zip(encoded) {
            let window = Window::at(a, piece_ids, starts);
            before = Some(match before.take() {
                None => window,
                Some(left) => match hand_over(tokenizer, text, &left, window, (from, cut, b))? {
                    Handover::At(join, window) => {
                        ids.extend_from_slice(&left.ids[left.first_at(from)..join]);
                        from = left.starts[join];
                        window
                    }
                    Handover::Merged(both) => both,
                },
            });
        }
        if ids.len() >= wanted {
            return Ok(ids);
        }
    }
    if let Some(last) = before {
        ids.extend_from_slice(&last.ids[last.first_at(from)..]);
    }
    Ok(ids)
}

/// How a piece follows the one before it.
enum Handover {
    /// At the earlier piece's token `.0`, with the later piece's window `.1`.
    At(usize, Window),
    /// As one: the two pieces' text tokenised together.
    Merged(Window),
}

/// How `left`, whose tokens from byte `from` are still to keep, hands over to `right`,
/// the piece whose own text starts at byte `cut` and whose window ends at byte `end`
/// (see [`encode_long`]): where the two fall in step; else where they do once `right`
/// is tokenised from an earlier start; else as one window, up to [`MERGED_BYTES`].
fn hand_over(
    tokenizer: &Tokenizer,
    text: &str,
    left: &Window,
    right: Window,
    (from, cut, end): (usize, usize, usize),
) -> Result<Handover> {
    if let Some(join) = left.join(&right, cut) {
        return Ok(Handover::At(join, right));
    }
    if let Some(start) = in_step_start(tokenizer, text, left, cut)? {
        let window = Window::of(tokenizer, text, start, end)?;
        if let Some(join) = left.join(&window, cut) {
            return Ok(Handover::At(join, window));
        }
    }
    if end - left.begins <= MERGED_BYTES {
        let both = Window::of(tokenizer, text, left.begins, end)?;
        if both.starts.get(both.first_at(from)) == Some(&from) {
            return Ok(Handover::Merged(both));
        }
    }
    Err(LetheError::Invalid(format!(
        "cannot tokenise the text in pieces: the tokens around byte {cut} depend on more than {} MiB of text \
         (a word or a run of one character that long?)",
        MERGED_BYTES >> 20
    )))
}

/// A start for the window of the piece that begins at byte `cut` that puts it in step
/// with `left`, if one of [`SEAM_STARTS`] a byte apart does: short probes, ending where
/// `left`'s window ends, from starts back from one of `left`'s token boundaries a seam
/// before the cut.
fn in_step_start(tokenizer: &Tokenizer, text: &str, left: &Window, cut: usize) -> Result<Option<usize>> {
    let Some(&boundary) = left.starts.get(left.first_at(cut.saturating_sub(SEAM_BYTES))) else { return Ok(None) };
    let starts: Vec<usize> =
        (0..SEAM_STARTS).filter_map(|back| boundary.checked_sub(back)).filter(|&s| text.is_char_boundary(s)).collect();
    let probe_end = text.ceil_char_boundary(cut + SEAM_BYTES);
    let probes: Vec<&str> = starts.iter().map(|&s| &text[s..probe_end]).collect();
    Ok(starts
        .iter()
        .zip(tokenizer.encode_batch_at(&probes)?)
        .find_map(|(&s, (ids, at))| left.join(&Window::at(s, ids, at), cut).map(|_| s)))
}

/// The byte ranges of `text`'s [`chunks`], a last piece shorter than two seams joined
/// to the one before it (so that every piece but the last ends a seam before the text).
fn piece_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for piece in chunks(text) {
        let start = spans.last().map_or(0, |s| s.1);
        spans.push((start, start + piece.len()));
    }
    if let [.., before, (_, end)] = spans[..] {
        if end - before.1 < 2 * SEAM_BYTES {
            spans.pop();
            if let Some(last) = spans.last_mut() {
                last.1 = end;
            }
        }
    }
    spans
}

/// A piece of text as the tokenizer gave it: its ids, and the byte of the whole text
/// at which each one's token starts.
struct Window {
    /// The byte of the whole text where the piece's text starts.
    begins: usize,
    ids: Vec<Token>,
    starts: Vec<usize>,
}

impl Window {
    /// The window of `ids`, tokenised from the text at byte `begins`, their tokens
    /// starting at bytes `starts` of it.
    fn at(begins: usize, ids: Vec<Token>, starts: Vec<usize>) -> Window {
        Window { begins, ids, starts: starts.into_iter().map(|s| s + begins).collect() }
    }

    /// The window of `text` from byte `begins` to byte `end`.
    fn of(tokenizer: &Tokenizer, text: &str, begins: usize, end: usize) -> Result<Window> {
        let (ids, starts) = tokenizer.encode_batch_at(&[&text[begins..end]])?.pop().unwrap_or_default();
        Ok(Window::at(begins, ids, starts))
    }

    /// The first token starting at or after byte `at`.
    fn first_at(&self, at: usize) -> usize {
        self.starts.partition_point(|&s| s < at)
    }

    /// Where this piece hands over to the `next`, whose own text starts at byte `cut`:
    /// the index of this piece's first token at or after `cut` with which both pieces
    /// give the same [`SEAM_AGREE`] tokens at the same bytes (this piece's last token,
    /// which its window may cut short, left out).
    fn join(&self, next: &Window, cut: usize) -> Option<usize> {
        let agree = |i: usize| {
            let j = next.first_at(self.starts[i]);
            let (ours, theirs) = (i..i + SEAM_AGREE, j..j + SEAM_AGREE);
            theirs.end <= next.ids.len()
                && self.ids[ours.clone()] == next.ids[theirs.clone()]
                && self.starts[ours] == next.starts[theirs]
        };
        let last = self.ids.len().checked_sub(SEAM_AGREE + 1)?;
        (self.first_at(cut)..=last).find(|&i| (i == 0 || self.starts[i - 1] != self.starts[i]) && agree(i))
    }
}

/// The tokenizer `data.tokenizer` names, checked against the model's vocabulary.
pub fn tokenizer_of(cfg: &Config) -> Result<Option<Tokenizer>> {
    let Some(dir) = &cfg.data.tokenizer else { return Ok(None) };
    let tokenizer = Tokenizer::from_dir(dir)?;
    if tokenizer.vocab_size() > cfg.model.vocab {
        return Err(LetheError::config(
            "model.vocab",
            cfg.model.vocab,
            format!(
                "the tokenizer in `{}` has {} ids; the model needs at least as many",
                dir.display(),
                tokenizer.vocab_size()
            ),
        ));
    }
    Ok(Some(tokenizer))
}

/// The tokenizer of a trained model: the run folder's own copy
/// ([`Checkpoint::run_tokenizer`]), else the config's `data.tokenizer`. `None` for a
/// byte-level model.
pub fn tokenizer_of_checkpoint(ckpt: &Checkpoint) -> Result<Option<Tokenizer>> {
    match ckpt.run_tokenizer() {
        Some(dir) => Tokenizer::from_dir(&dir).map(Some),
        None => tokenizer_of(&ckpt.config),
    }
}

/// `bytes` as text for a tokenizer; the error names `origin` and the first byte that is
/// not UTF-8.
pub fn utf8(bytes: Vec<u8>, origin: &Path) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        LetheError::data(origin, format!("is not UTF-8 text (an invalid byte at offset {at}), and the tokenizer reads text; convert it, e.g. `iconv -f latin1 -t utf-8`"))
    })
}

/// A split read as bytes, made ready for the model: its words counted, then tokenised
/// when the config names a tokenizer. `eos_per_line`: count one word per line too.
pub fn prepare(cfg: &Config, bytes: SplitData, eos_per_line: bool) -> Result<SplitData> {
    let words = bytes.docs.iter().map(|d| count_words(&super::seq::bytes_of(&d.tokens), eos_per_line)).sum();
    let docs = match tokenizer_of(cfg)? {
        None => bytes.docs,
        Some(tokenizer) => {
            let mut docs = Vec::with_capacity(bytes.docs.len());
            let total: usize = bytes.docs.iter().map(|d| d.tokens.len()).sum();
            let (mut done, mut said) = (0, std::time::Instant::now());
            for d in &bytes.docs {
                // A large corpus (PG-19) takes minutes: say how far it is every 10 s.
                done += d.tokens.len();
                if said.elapsed().as_secs() >= 10 {
                    // Progress that cannot be written (standard error on a full disk) is dropped.
                    let _ = writeln!(
                        std::io::stderr(),
                        "tokenising `{}`: {:.0} of {:.0} MB",
                        bytes.origin.display(),
                        done as f64 / 1e6,
                        total as f64 / 1e6
                    );
                    said = std::time::Instant::now();
                }
                let text = utf8(super::seq::bytes_of(&d.tokens), &bytes.origin)?;
                let ids = encode_long(&tokenizer, &text).map_err(|e| LetheError::data(&bytes.origin, e.to_string()))?;
                if !ids.is_empty() {
                    docs.push(TokenSeq::all_scored(ids));
                }
            }
            docs
        }
    };
    Ok(SplitData { docs, words: Some(words), ..bytes })
}

/// The file of `split` in a Wikitext folder: `wiki.<split>.tokens`, or the `.raw` of
/// the raw variant.
fn wikitext_file(dir: &Path, split: Split) -> Result<PathBuf> {
    let name = match split {
        Split::Train => "train",
        Split::Valid => "valid",
        Split::Test => "test",
    };
    let candidates = [format!("wiki.{name}.tokens"), format!("wiki.{name}.raw")];
    candidates.iter().map(|c| dir.join(c)).find(|p| p.is_file()).ok_or_else(|| {
        let hint = if dir.is_dir() { "" } else { " (the folder does not exist)" };
        LetheError::data(
            dir,
            format!(
                "holds no wiki.{name}.tokens{hint}; get Wikitext-103 with `curl -LO https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip && unzip wikitext-103-v1.zip` and pass --data wikitext-103"
            ),
        )
    })
}

/// One split of a Wikitext folder, as bytes.
fn load_wikitext_bytes(dir: &Path, split: Split) -> Result<SplitData> {
    let path = wikitext_file(dir, split)?;
    let bytes = lethe_core::input::read(&path).map_err(|e| LetheError::data(&path, e))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(LetheError::data(&path, "holds no text"));
    }
    Ok(SplitData {
        origin: path,
        docs: vec![TokenSeq::bytes(&bytes, None, None)],
        mode: FolderMode::Concat,
        words: None,
    })
}

/// Wikitext-103 (or -2) in the registry ([`crate::task::of`]): `data.source = "wikitext"`.
pub struct Wikitext;

impl Task for Wikitext {
    fn name(&self) -> &'static str {
        "wikitext"
    }

    fn describe(&self, d: &DataConfig) -> String {
        let path = d.path.as_deref().unwrap_or(Path::new("?"));
        match &d.tokenizer {
            Some(t) => format!("wikitext {} tokenised by {}", path.display(), t.display()),
            None => format!("wikitext {} as bytes", path.display()),
        }
    }

    fn metric(&self) -> Metric {
        Metric::WordPerplexity
    }

    fn load_split(&self, cfg: &Config, split: Split, _batch: usize) -> Result<SplitData> {
        let dir = cfg
            .data
            .path
            .as_deref()
            .ok_or_else(|| LetheError::config("data.path", "none", "the Wikitext folder is needed (--data DIR)"))?;
        prepare(cfg, load_wikitext_bytes(dir, split)?, true)
    }

    fn train_streams(&self, cfg: &Config, batch: usize) -> Result<TrainStreams> {
        let split = self.load_split(cfg, Split::Train, batch)?;
        TrainStreams::of_split(&split, batch, cfg.train.block, cfg.data_seed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_whitespace_tokens_and_wikitext_adds_one_per_line() {
        let text = b" = Valkyria = \n\n Senj\xc5\x8d no Valkyria 3 @-@ sequel .\n";
        assert_eq!(count_words(text, false), 3 + 7);
        assert_eq!(count_words(text, true), 3 + 7 + 3);
        assert_eq!(count_words(b"no newline at the end", true), 5 + 1);
        assert_eq!(count_words(b"", false), 0);
    }

    #[test]
    fn chunks_cut_only_at_line_starts_and_cover_the_text() {
        let line = " = = Gameplay = = \n\n\n  indented\n plain text follows\n";
        let text = line.repeat(CHUNK_BYTES / line.len() * 3);
        let pieces = chunks(&text);
        assert!(pieces.len() >= 3, "{} pieces", pieces.len());
        assert_eq!(pieces.concat(), text);
        for p in &pieces[1..] {
            assert!(p.starts_with(" = =") || p.starts_with(" plain"), "{:?}", &p[..12]);
        }
        // One long line is cut before its words; a text without spaces anywhere.
        let line = text.replace('\n', " ");
        let pieces = chunks(&line);
        assert!(pieces.len() >= 2, "{} pieces", pieces.len());
        assert_eq!(pieces.concat(), line);
        for p in &pieces[1..] {
            assert!(p.starts_with(' ') && !p[1..].starts_with(' '), "{:?}", &p[..12]);
        }
        let solid = "Senjō—".repeat(CHUNK_BYTES / 8 * 5);
        let pieces = chunks(&solid);
        assert!(pieces.len() >= 3 && pieces.iter().all(|p| p.len() <= 2 * CHUNK_BYTES), "{} pieces", pieces.len());
        assert_eq!(pieces.concat(), solid);
    }
}
