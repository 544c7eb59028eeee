//! Text to token ids and back for pretrained models, through Hugging Face's `tokenizers`
//! crate (the library `transformers` uses; lethe writes no BPE of its own). It reads a
//! model folder's `tokenizer.json`, or the older pair `vocab.json` + `merges.txt` of
//! GPT-2's byte-level BPE, which it puts together as GPT-2 does: a byte-level
//! pre-tokenizer without a prefix space and a byte-level decoder.

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use crate::error::{LetheError, Result};

/// A pretrained model's tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// The tokenizer of the model folder `dir`: `tokenizer.json` when there is one,
    /// otherwise `vocab.json` + `merges.txt`.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let json = dir.join("tokenizer.json");
        if json.is_file() {
            let inner = tokenizers::Tokenizer::from_file(&json).map_err(|e| data_error(&json, e))?;
            return Ok(Tokenizer { inner });
        }
        let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
        if !vocab.is_file() || !merges.is_file() {
            let reason = "holds no tokenizer: neither tokenizer.json nor vocab.json with merges.txt".to_string();
            return Err(LetheError::Data { path: dir.to_path_buf(), reason });
        }
        let (vocab_text, merges_text) = (vocab.display().to_string(), merges.display().to_string());
        let bpe = BPE::from_file(&vocab_text, &merges_text).build().map_err(|e| data_error(&vocab, e))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        Ok(Tokenizer { inner })
    }

    /// The ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, false).map_err(|e| LetheError::Invalid(format!("cannot tokenise the text: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The ids of each of `texts` (no special tokens added), tokenised in parallel.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let encodings = self.inner.encode_batch(texts.to_vec(), false).map_err(|e| LetheError::Invalid(format!("cannot tokenise the text: {e}")))?;
        Ok(encodings.iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| LetheError::Invalid(format!("cannot decode token ids: {e}")))
    }

    /// Token ids the tokenizer knows, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The tokenizer as a `tokenizer.json` text, which [`Tokenizer::from_dir`] reads back.
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(|e| LetheError::Invalid(format!("cannot write the tokenizer: {e}")))
    }
}

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
        Ok(text)
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
