//! Text to token ids and back for pretrained models, through Hugging Face's `tokenizers`
//! crate (the library `transformers` uses; lethe writes no BPE of its own). It reads a
//! model folder's `tokenizer.json`, or the older pair `vocab.json` + `merges.txt` of
//! GPT-2's byte-level BPE, which it puts together as GPT-2 does: a byte-level
//! pre-tokenizer without a prefix space and a byte-level decoder.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;

use lethe_core::error::{LetheError, Result};

/// A pretrained model's tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// The tokenizer of the model folder `dir`: `tokenizer.json` when there is one,
    /// otherwise `vocab.json` + `merges.txt`.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let json = dir.join("tokenizer.json");
        if json.exists() {
            let bytes = lethe_core::input::read(&json).map_err(|e| LetheError::data(&json, e))?;
            let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| data_error(&json, e))?;
            return Tokenizer::whole(inner).map_err(|e| data_error(&json, e));
        }
        let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if !vocab.exists() || !merges.exists() {
            let reason = "holds no tokenizer: neither tokenizer.json nor vocab.json with merges.txt".to_string();
            return Err(LetheError::Data { path: dir.to_path_buf(), reason });
        }
        for file in [&vocab, &merges] {
            lethe_core::input::check_file(file).map_err(|e| LetheError::data(file, e))?;
        }
        let (vocab_text, merges_text) = (vocab.display().to_string(), merges.display().to_string());
        let bpe = BPE::from_file(&vocab_text, &merges_text).build().map_err(|e| data_error(&vocab, e))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        Ok(Tokenizer { inner })
    }

    /// The `tokenizer.json` of a pretrained decoder's folder, if it has one; refused when
    /// it gives ids past the model's `vocab` rows (config.json's `vocab_size`).
    pub fn of_decoder_folder(folder: &Path, vocab: usize) -> Result<Option<Tokenizer>> {
        let json = folder.join("tokenizer.json");
        if !json.exists() {
            return Ok(None);
        }
        let tokenizer = Tokenizer::from_dir(folder)?;
        if tokenizer.vocab_size() > vocab {
            let reason = format!("has {} tokens, more than config.json's vocab_size = {vocab}", tokenizer.vocab_size());
            return Err(LetheError::data(json, reason));
        }
        Ok(Some(tokenizer))
    }

    /// The tokenizer a `tokenizer.json` text describes (as [`Tokenizer::to_json`] writes).
    pub fn from_json(json: &str) -> Result<Tokenizer> {
        let inner = json
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| LetheError::Invalid(format!("cannot read the tokenizer: {e}")))?;
        Tokenizer::whole(inner).map_err(|e| LetheError::Invalid(format!("cannot read the tokenizer: {e}")))
    }

    /// `inner` with the truncation and padding a `tokenizer.json` may carry turned off:
    /// lethe tokenises whole texts, and a saved `max_length` would silently cut each
    /// piece of a long text short, and padding add ids that are not in the text.
    fn whole(mut inner: tokenizers::Tokenizer) -> tokenizers::Result<Tokenizer> {
        inner.with_truncation(None)?.with_padding(None);
        Ok(Tokenizer { inner })
    }

    /// The ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| LetheError::Invalid(format!("cannot tokenise the text: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The ids of each of `texts` (no special tokens added), tokenised in parallel, with
    /// the byte offset in its text at which each id's token starts.
    pub fn encode_batch_at(&self, texts: &[&str]) -> Result<Vec<(Vec<u32>, Vec<usize>)>> {
        let encodings = self
            .inner
            .encode_batch(texts.to_vec(), false)
            .map_err(|e| LetheError::Invalid(format!("cannot tokenise the text: {e}")))?;
        Ok(encodings.iter().map(|e| (e.get_ids().to_vec(), e.get_offsets().iter().map(|o| o.0).collect())).collect())
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| LetheError::Invalid(format!("cannot decode token ids: {e}")))
    }

    /// Token ids the tokenizer knows, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// A word-level vocabulary (Transformer-XL's for Wikitext-103): the whitespace-separated
    /// words of `texts` and an `<eos>` at every line end, numbered most frequent first
    /// (ties in byte order), so that the adaptive softmax's clusters hold the frequent
    /// words first. Words seen fewer than `min_count` times, and any beyond the
    /// `max_size` most frequent (0: no limit), read as `<unk>`, which is added last
    /// unless the text has it.
    pub fn train_words(texts: &[&str], min_count: u64, max_size: usize) -> Result<Tokenizer> {
        let mut counts: HashMap<&str, u64> = HashMap::new();
        for text in texts {
            for line in text.split_inclusive('\n') {
                line.split_whitespace().for_each(|w| *counts.entry(w).or_default() += 1);
                if line.ends_with('\n') {
                    *counts.entry(EOS).or_default() += 1;
                }
            }
        }
        let mut order: Vec<(&str, u64)> = counts.into_iter().filter(|&(_, n)| n >= min_count.max(1)).collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        if max_size > 0 {
            order.truncate(max_size);
        }
        let mut words: Vec<String> = order.into_iter().map(|(w, _)| w.to_string()).collect();
        if !words.iter().any(|w| w == UNK) {
            words.push(UNK.to_string());
        }
        let model = WordLevel::builder()
            .vocab(words.into_iter().enumerate().map(|(i, w)| (w, i as u32)).collect())
            .unk_token(UNK.to_string())
            .build()
            .map_err(|e| LetheError::Invalid(format!("cannot build the word vocabulary: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(model);
        let eos = Replace::new("\n", format!(" {EOS} "))
            .map_err(|e| LetheError::Invalid(format!("cannot build the word vocabulary: {e}")))?;
        inner.with_normalizer(Some(eos));
        inner.with_pre_tokenizer(Some(WhitespaceSplit));
        Ok(Tokenizer { inner })
    }

    /// A byte-level BPE of `vocab` ids (GPT-2's kind: any text encodes, no unknown
    /// token) learned from `texts` by the `tokenizers` crate's trainer.
    pub fn train_bpe(texts: &[&str], vocab: usize) -> Result<Tokenizer> {
        let alphabet = ByteLevel::alphabet();
        // The trainer reserves room for every id up front (1e9 ids asked for 70 GB).
        if vocab > MAX_BPE_VOCAB {
            return Err(LetheError::Invalid(format!(
                "--vocab {vocab}: at most {MAX_BPE_VOCAB} ids (GPT-2 has 50,257)"
            )));
        }
        if vocab < alphabet.len() {
            return Err(LetheError::Invalid(format!(
                "--vocab {vocab}: a byte-level BPE needs at least its {} byte symbols",
                alphabet.len()
            )));
        }
        let mut inner = tokenizers::Tokenizer::new(BPE::default());
        inner.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let trainer = BpeTrainer::builder()
            .vocab_size(vocab)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(alphabet.into_iter().collect())
            .build();
        let mut trainer = TrainerWrapper::from(trainer);
        // Fed in the pieces long texts are tokenised in (cut where the pre-tokenizer cuts
        // anyway, but in two megabytes without a space): a whole file at once is
        // pre-tokenised at once, 80 bytes a byte.
        inner
            .train(&mut trainer, texts.iter().flat_map(|text| crate::text::chunks(text)))
            .map_err(|e| LetheError::Invalid(format!("cannot learn the BPE: {e}")))?;
        Ok(Tokenizer { inner })
    }

    /// Whether decoded tokens are joined by spaces (a word vocabulary has no decoder of
    /// its own, so `tokenizers` puts a space between words).
    pub fn spaced(&self) -> bool {
        self.inner.get_decoder().is_none()
    }

    /// The tokenizer as a `tokenizer.json` text, which [`Tokenizer::from_dir`] reads back.
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(|e| LetheError::Invalid(format!("cannot write the tokenizer: {e}")))
    }
}

/// The largest byte-level BPE `lethe tokenizer bpe` learns (2^20 ids).
pub const MAX_BPE_VOCAB: usize = 1 << 20;

/// The word vocabulary's end of line.
pub const EOS: &str = "<eos>";
/// The word vocabulary's unknown word.
pub const UNK: &str = "<unk>";

/// Text from token ids arriving one at a time (generation): each call returns the text
/// completed so far. A byte-level token may hold half of a character; such ids wait
/// until the character is whole, so no replacement character is printed mid-stream.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    waiting: Vec<u32>,
}

impl<'a> TextStream<'a> {
    /// A stream with nothing waiting.
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        TextStream { tokenizer, waiting: vec![] }
    }

    /// Adds `id`; returns the text it completes (empty while a character is unfinished).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.waiting.push(id);
        let text = self.tokenizer.decode(&self.waiting)?;
        // Give up waiting after a few ids: the model may never finish the character.
        if text.ends_with('\u{FFFD}') && self.waiting.len() < 4 {
            return Ok(String::new());
        }
        self.waiting.clear();
        // A word vocabulary joins its words by spaces.
        Ok(if self.tokenizer.spaced() { format!(" {text}") } else { text })
    }

    /// Whatever is still waiting, as text.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tokenizer.decode(&self.waiting)?;
        self.waiting.clear();
        Ok(text)
    }
}

fn data_error(path: &Path, e: impl std::fmt::Display) -> LetheError {
    LetheError::Data { path: path.to_path_buf(), reason: format!("not a tokenizer lethe can read: {e}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokenizer_round_trips_through_its_json() {
        let text = "the span keeps the memory the span forgets the stream";
        let bpe = Tokenizer::train_bpe(&[text], 300).unwrap();
        let back = Tokenizer::from_json(&bpe.to_json().unwrap()).unwrap();
        assert_eq!(back.encode(text).unwrap(), bpe.encode(text).unwrap());
        assert!(bpe.encode(text).unwrap().len() < text.len(), "the BPE learned no merge");
        assert_eq!(back.decode(&back.encode(text).unwrap()).unwrap(), text);
        let words = Tokenizer::train_words(&[text], 1, 100).unwrap();
        let back = Tokenizer::from_json(&words.to_json().unwrap()).unwrap();
        assert_eq!(back.encode(text).unwrap(), words.encode(text).unwrap());
        assert!(back.spaced());
        let Err(bad) = Tokenizer::from_json("{\"model\": 3}") else { panic!("a bad tokenizer.json was read") };
        assert!(bad.to_string().contains("cannot read the tokenizer"), "{bad}");
    }

    /// The BPE learned from a long text fed in pieces is the one learned from it whole:
    /// the pieces are cut where the pre-tokenizer cuts anyway (runs of blank lines and
    /// spaces included).
    #[test]
    fn a_bpe_learned_in_pieces_is_the_bpe_of_the_whole_text() {
        let mut rng = lethe_core::rng::Rng::new(5);
        let words = ["memory", "span", " forget", "\n\n", "keep", "  indented", "=", "\n", " the", "stream"];
        let text: String = (0..600_000).map(|_| words[rng.range(0, words.len() - 1)]).collect();
        // And as one line, cut before its words.
        for text in [text.clone(), text.replace('\n', " ")] {
            assert!(crate::text::chunks(&text).len() >= 2, "the text is not cut");
            assert_eq!(Tokenizer::train_bpe(&[&text], 300).unwrap().to_json().unwrap(), bpe_of_whole(&text));
        }
    }

    /// The BPE [`Tokenizer::train_bpe`] learns, learned from `text` given whole.
    fn bpe_of_whole(text: &str) -> String {
        let mut whole = tokenizers::Tokenizer::new(BPE::default());
        whole.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        whole.with_decoder(Some(ByteLevelDecoder::default()));
        let trainer = BpeTrainer::builder()
            .vocab_size(300)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        whole.train(&mut TrainerWrapper::from(trainer), [text].iter()).unwrap();
        Tokenizer { inner: whole }.to_json().unwrap()
    }

    /// A `tokenizer.json` saved with truncation and padding on (as `transformers` saves
    /// some) still gives every id of a long text, and no padding.
    #[test]
    fn a_saved_truncation_and_padding_are_not_applied() {
        use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};
        let text = "a b c d e f g h i j\n".repeat(40);
        let words = Tokenizer::train_words(&[&text], 1, 100).unwrap();
        let mut saved = words.inner.clone();
        saved.with_truncation(Some(TruncationParams { max_length: 4, ..Default::default() })).unwrap();
        saved.with_padding(Some(PaddingParams { strategy: PaddingStrategy::Fixed(4096), ..Default::default() }));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), saved.to_string(false).unwrap()).unwrap();
        assert_eq!(saved.encode(text.as_str(), false).unwrap().get_ids().len(), 4096, "the settings do not bite");
        for read in
            [Tokenizer::from_dir(dir.path()).unwrap(), Tokenizer::from_json(&saved.to_string(false).unwrap()).unwrap()]
        {
            assert_eq!(read.encode(&text).unwrap(), words.encode(&text).unwrap());
            let batch = read.encode_batch_at(&[&text, "a b"]).unwrap();
            assert_eq!(batch[0].0.len(), 40 * 11);
            assert_eq!(batch[1].0.len(), 2);
        }
    }

    /// A BPE of `vocab` ids with `normalizer` and `pre_tokenizer`, learned from `text`'s lines.
    fn bpe_with(
        normalizer: Option<tokenizers::NormalizerWrapper>,
        pre_tokenizer: Option<tokenizers::PreTokenizerWrapper>,
        text: &str,
        vocab: usize,
    ) -> Tokenizer {
        let mut inner = tokenizers::Tokenizer::new(BPE::default());
        inner.with_normalizer(normalizer);
        inner.with_pre_tokenizer(pre_tokenizer);
        let trainer = BpeTrainer::builder().vocab_size(vocab).min_frequency(2).show_progress(false).build();
        inner.train(&mut TrainerWrapper::from(trainer), text.split_inclusive('\n')).unwrap();
        Tokenizer { inner }
    }

    /// Llama 2's and Mistral's tokenizers put a `▁` before the first word of whatever
    /// they are given (a Metaspace pre-tokenizer prepending to the first word only, or
    /// the legacy Prepend normalizer), so a long text cut into pieces and each tokenised
    /// alone gives other ids at every cut. The pieces' seams make the ids those of the
    /// whole text all the same.
    #[test]
    fn a_long_text_gives_the_ids_of_the_whole_with_prefix_dependent_tokenizers() {
        use tokenizers::normalizers::{Prepend, Sequence};
        use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
        let mut rng = lethe_core::rng::Rng::new(11);
        let words = ["memory", "span", " forget", "\n", "keep", " Senjō", " —", "=", " the", "stream", "\n\n", " "];
        let text: String = (0..640_000).map(|_| words[rng.range(0, words.len() - 1)]).collect();
        assert!(crate::text::chunks(&text).len() >= 3, "the text is not cut");
        let sample = &text[..text.floor_char_boundary(20_000)];
        let metaspace = Metaspace::new('▁', PrependScheme::First, true);
        let legacy = Sequence::new(vec![Prepend::new("▁".into()).into(), Replace::new(" ", "▁").unwrap().into()]);
        let tokenizers =
            [bpe_with(None, Some(metaspace.into()), sample, 300), bpe_with(Some(legacy.into()), None, sample, 300)];
        for tokenizer in tokenizers {
            let whole = tokenizer.encode(&text).unwrap();
            let alone: Vec<u32> =
                crate::text::chunks(&text).into_iter().flat_map(|piece| tokenizer.encode(piece).unwrap()).collect();
            assert_ne!(alone, whole, "pieces tokenised alone give the ids of the whole: the test does not bite");
            assert_eq!(crate::text::encode_long(&tokenizer, &text).unwrap(), whole);
            // The start alone: exact, and (two pieces at a time) the third not tokenised.
            let head = crate::text::encode_prefix(&tokenizer, &text, 10).unwrap();
            assert!(head.len() >= 10 && whole.starts_with(&head));
            let head = crate::text::encode_in_groups(&tokenizer, &text, 10, 2).unwrap();
            assert!(head.len() >= 10 && head.len() < whole.len() / 2, "{} of {} ids", head.len(), whole.len());
            assert!(whole.starts_with(&head));
        }
        // A GPT-2 BPE on one long line cut before its words, and on a text without a
        // space, cut anywhere.
        let gpt2 = Tokenizer::train_bpe(&[sample], 300).unwrap();
        let solid: String = text.split_whitespace().collect::<String>().repeat(2);
        for text in [text.replace('\n', " "), solid] {
            assert!(crate::text::chunks(&text).len() >= 2, "the text is not cut");
            assert_eq!(crate::text::encode_long(&gpt2, &text).unwrap(), gpt2.encode(&text).unwrap());
        }
    }

    /// A cut in a run longer than a seam (megabytes of one letter, of spaces): a BPE's
    /// tokens in the run depend on where it starts, so a piece whose window starts in it
    /// is out of step with the piece before. Its window is started again, earlier, until
    /// the two agree, and the ids are those of the whole text.
    #[test]
    fn a_cut_in_a_long_run_of_one_character_is_joined_in_step() {
        use tokenizers::normalizers::{Prepend, Sequence};
        let sample = "a x eeeeeeee eeeeeeeeeeeeeeee and\n".repeat(40) + &"x                   y\n".repeat(40);
        let legacy = Sequence::new(vec![Prepend::new("▁".into()).into(), Replace::new(" ", "▁").unwrap().into()]);
        let tokenizers =
            [Tokenizer::train_bpe(&[&sample], 300).unwrap(), bpe_with(Some(legacy.into()), None, &sample, 300)];
        // Runs that start at odd bytes, cut at even ones.
        let text = format!("a x{} and {}y\n", "e".repeat(2_500_001), " ".repeat(2_500_000));
        assert!(crate::text::chunks(&text).len() >= 4, "the text is not cut");
        for tokenizer in tokenizers {
            let ee = tokenizer.encode("eeee").unwrap();
            assert!(ee.len() < 4, "no merges of e: the test does not bite");
            let (long, whole) =
                (crate::text::encode_long(&tokenizer, &text).unwrap(), tokenizer.encode(&text).unwrap());
            let first = long.iter().zip(&whole).position(|(a, b)| a != b);
            assert!(long == whole, "{} ids against {}, first differs at {first:?}", long.len(), whole.len());
        }
    }

    /// A word longer than a seam is one token through a word-level tokenizer, so no
    /// piece it crosses falls in step with the next: they are tokenised as one window,
    /// the ids those of the whole text, up to 8 MiB; a longer word is refused, naming
    /// the byte, rather than the whole text tokenised at once.
    #[test]
    fn a_word_longer_than_the_pieces_is_one_token_up_to_a_bound() {
        let words = Tokenizer::train_words(&["a b c x"], 1, 100).unwrap();
        let text = format!("a b {} c\n", "x".repeat(5_000_000));
        assert!(crate::text::chunks(&text).len() >= 4, "the text is not cut");
        assert_eq!(crate::text::encode_long(&words, &text).unwrap(), words.encode(&text).unwrap());
        assert_eq!(words.encode(&text).unwrap().len(), 5, "a, b, the word, c and the line end");
        let Err(e) = crate::text::encode_long(&words, &"x".repeat(9 << 20)) else { panic!("a 9 MiB word was read") };
        assert!(e.to_string().contains("around byte 7340032") && e.to_string().contains("8 MiB"), "{e}");
    }

    #[test]
    fn a_decoder_folder_s_tokenizer_must_fit_its_vocabulary() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Tokenizer::of_decoder_folder(dir.path(), 10).unwrap().is_none());
        let words = Tokenizer::train_words(&["a b c d e f"], 1, 100).unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), words.to_json().unwrap()).unwrap();
        let held = words.vocab_size();
        assert!(Tokenizer::of_decoder_folder(dir.path(), held).unwrap().is_some());
        let Err(e) = Tokenizer::of_decoder_folder(dir.path(), held - 1) else { panic!("a tokenizer past the rows") };
        let line = e.to_string();
        assert!(line.contains("tokenizer.json") && line.contains(&format!("vocab_size = {}", held - 1)), "{line}");
    }
}
