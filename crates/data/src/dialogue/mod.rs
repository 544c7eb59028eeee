//! Document-grounded dialogue (∞-former paper §4.3 and App. C.3): the CMU Document
//! Grounded Conversations layout, and the input format in which a model reads a
//! document first and then a conversation about it.
//!
//! **Layout** (github.com/festvox/datasets-CMU_DoG, as downloaded):
//!
//! ```text
//! DIR/WikiData/<movie>.json             {"0": {"movieName", "year", "director", "genre", "cast",
//!                                        "introduction", "rating", "critical_response"},
//!                                        "1": plot, "2": plot, "3": plot, "index": N}
//! DIR/Conversations/{train,valid,test}/<id>.json
//!                                       {"docLinkIdx": N, "history": [{"text", "uid"}, ...]}
//! ```
//!
//! The dataset's own folders are its split, 0.8 / 0.05 / 0.15 of the 4,112
//! conversations, as the paper's C.3 gives. A conversation names its document by
//! `docLinkIdx` (older copies: `wikiDocumentIdx`), the `index` of a WikiData file.
//!
//! **Format.** As in the paper, the model is given the document only before the
//! dialogue starts, so that it must keep the document in memory:
//!
//! ```text
//! Mean Girls (2004)                 <- the document: section 0 as lines, then sections 1-3
//! Director: Mark Waters
//! ...
//! A: hey there, you like mean girls as much as i do?     <- one line per turn
//! B: Oh, Mean Girls? It's a great movie.
//! ```
//!
//! Speakers are `A` (the first to speak) and `B`; consecutive messages of one speaker
//! form one turn, and line breaks inside a message become spaces. **Only responses are
//! scored**: the text of each turn after its `A:`/`B:` marker, with the newline that
//! ends it (so that a model learns where a response ends). The document and the
//! markers are context. Every turn is the response to the history before it, which is
//! how the official evaluation's perplexity counts (it scores every utterance).
//!
//! The official code adds special tokens to GPT-2's vocabulary (`<speaker1>`, `<doc>`,
//! ...) and token-type embeddings; lethe writes the markers as text that every
//! tokenizer already has, so that a pretrained model needs no new embeddings and a
//! byte-level or word-level model reads the same data. The official training also
//! scores the document and the history; lethe scores only responses, as the issue of
//! this feature asks (README, "Dialogue").

pub mod synthetic;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::task::spec::{Metric, Task};
use lethe_core::config::{Config, DataConfig, DialogueConfig, FolderMode};
use lethe_core::error::{LetheError, Result};

use super::seq::{Split, SplitData, Token, TokenSeq};
use super::stream::TrainStreams;
use super::tokenizer::Tokenizer;

/// The marker that opens a turn of speaker 0 or 1.
pub const SPEAKERS: [&str; 2] = ["A:", "B:"];

/// One turn: who speaks (0 or 1) and what they say (one line).
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub speaker: usize,
    pub text: String,
}

/// A conversation with the document it is grounded in.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    /// The document as text, one section per line.
    pub document: String,
    pub turns: Vec<Turn>,
}

/// A piece of a conversation's text and whether its tokens are scored.
pub type Segment = (String, bool);

impl Conversation {
    /// The conversation as text segments in reading order: the document (unless
    /// `with_document` is false: the paper's "GPT-2 w/o doc" row), then per turn its
    /// marker (context) and ` text\n` (scored).
    pub fn segments(&self, with_document: bool) -> Vec<Segment> {
        let mut out = Vec::with_capacity(1 + 2 * self.turns.len());
        if with_document {
            out.push((format!("{}\n", self.document.trim_end()), false));
        }
        for t in &self.turns {
            out.push((SPEAKERS[t.speaker].to_string(), false));
            out.push((format!(" {}\n", t.text), true));
        }
        out
    }

    /// The conversation as tokens with the responses scored: each segment encoded on
    /// its own by `encode` (bytes, or a tokenizer's ids), so that no token straddles a
    /// scored and an unscored piece.
    pub fn encode(&self, with_document: bool, encode: &dyn Fn(&str) -> Result<Vec<Token>>) -> Result<TokenSeq> {
        let (mut tokens, mut scored) = (Vec::new(), Vec::new());
        for (text, is_response) in self.segments(with_document) {
            let ids = encode(&text)?;
            scored.extend(std::iter::repeat_n(is_response, ids.len()));
            tokens.extend(ids);
        }
        Ok(TokenSeq { tokens, scored: Some(scored), labels: None })
    }
}

/// One message of a CMU-DoG conversation file.
#[derive(Deserialize)]
struct Message {
    text: String,
    uid: String,
}

/// A CMU-DoG conversation file (the fields lethe reads).
#[derive(Deserialize)]
struct ConversationFile {
    #[serde(rename = "docLinkIdx", alias = "wikiDocumentIdx")]
    doc: i64,
    history: Vec<Message>,
}

/// The turns of a message history: one speaker's consecutive messages joined, line
/// breaks made spaces, empty messages dropped; speaker 0 is whoever speaks first.
fn turns_of(history: &[Message]) -> Vec<Turn> {
    let mut uids: Vec<&str> = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    for m in history {
        let text = m.text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() {
            continue;
        }
        let speaker = uids.iter().position(|&u| u == m.uid).unwrap_or_else(|| {
            uids.push(&m.uid);
            uids.len() - 1
        });
        match turns.last_mut() {
            Some(last) if last.speaker == speaker.min(1) => {
                last.text.push(' ');
                last.text.push_str(&text);
            }
            _ => turns.push(Turn { speaker: speaker.min(1), text }),
        }
    }
    turns
}

/// A WikiData file's text: section 0's fields as lines, then the plot sections 1-3.
fn document_text(value: &serde_json::Value) -> String {
    let field = |v: &serde_json::Value, key: &str| -> String {
        match v.get(key) {
            Some(serde_json::Value::String(s)) => s.trim().to_string(),
            Some(serde_json::Value::Array(items)) => {
                items.iter().filter_map(|i| i.as_str()).map(str::trim).collect::<Vec<_>>().join("; ")
            }
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => String::new(),
        }
    };
    let head = &value["0"];
    let mut lines = vec![format!("{} ({})", field(head, "movieName"), field(head, "year"))];
    for (label, key) in [("Director", "director"), ("Genre", "genre"), ("Cast", "cast"), ("Rating", "rating")] {
        let v = field(head, key);
        if !v.is_empty() {
            lines.push(format!("{label}: {v}"));
        }
    }
    for key in ["introduction", "critical_response"] {
        lines.push(field(head, key));
    }
    lines.extend(["1", "2", "3"].iter().map(|k| field(value, k)));
    lines.retain(|l| !l.is_empty());
    lines.iter().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>().join("\n")
}

/// Reads and parses one JSON file; the error names it.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = lethe_core::input::read(path).map_err(|e| LetheError::data(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| LetheError::data(path, format!("is not a CMU-DoG JSON file: {e}")))
}

/// The `.json` files of a folder, in name order; the error says what the folder should hold.
fn json_files(dir: &Path, what: &str) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        LetheError::data(dir, format!("cannot be read ({e}); a CMU-DoG folder holds {what} (get it with `git clone https://github.com/festvox/datasets-CMU_DoG`, or make a small one with `lethe dialogue-data`)"))
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(LetheError::data(dir, format!("holds no .json files; it should hold {what}")));
    }
    Ok(files)
}

/// The documents of `DIR/WikiData`, by their `index`.
fn read_documents(dir: &Path) -> Result<HashMap<i64, String>> {
    let mut docs = HashMap::new();
    for path in json_files(&dir.join("WikiData"), "the movie documents as WikiData/*.json")? {
        let value: serde_json::Value = read_json(&path)?;
        let index = value.get("index").or_else(|| value.get("wikiDocumentIdx")).and_then(|v| v.as_i64());
        let index = index.ok_or_else(|| LetheError::data(&path, "has no \"index\" number naming the document"))?;
        docs.insert(index, document_text(&value));
    }
    Ok(docs)
}

/// The name of a split's folder under `Conversations/`.
fn split_folder(split: Split) -> &'static str {
    match split {
        Split::Train => "train",
        Split::Valid => "valid",
        Split::Test => "test",
    }
}

/// The conversations of one split of a CMU-DoG folder, each with its document, in file
/// name order. Conversations without turns are skipped.
pub fn read_split(dir: &Path, split: Split) -> Result<Vec<Conversation>> {
    let docs = read_documents(dir)?;
    let folder = dir.join("Conversations").join(split_folder(split));
    let mut out = Vec::new();
    for path in json_files(&folder, "the conversations as Conversations/{train,valid,test}/*.json")? {
        let file: ConversationFile = read_json(&path)?;
        let document = docs.get(&file.doc).ok_or_else(|| {
            LetheError::data(
                &path,
                format!("names document {} (docLinkIdx), which no WikiData file has as its index", file.doc),
            )
        })?;
        let turns = turns_of(&file.history);
        if !turns.is_empty() {
            out.push(Conversation { document: document.clone(), turns });
        }
    }
    Ok(out)
}

/// CMU-DoG in the registry ([`crate::task::of`]): `data.source = "dialogue"`.
pub struct Dialogue;

/// `conversations` of `split` of the CMU-DoG folder `dir` as a model reads them: token
/// sequences (`tokenizer`'s ids, or bytes without one), each with its document first
/// when `opts.document`, one sequence per conversation, read whole by the streams (one
/// at a time with the memory emptied before each when `opts.reset`), with the words of
/// the responses (and a line end each) counted for perplexity per word.
pub fn split_data(
    tokenizer: Option<&Tokenizer>,
    opts: &DialogueConfig,
    conversations: &[Conversation],
    dir: &Path,
    split: Split,
) -> Result<SplitData> {
    let encode = encoder(tokenizer);
    let origin = dir.join("Conversations").join(split_folder(split));
    let docs = conversations.iter().map(|c| c.encode(opts.document, &encode)).collect::<Result<Vec<_>>>()?;
    let words = conversations.iter().flat_map(|c| &c.turns).map(|t| t.text.split_whitespace().count() as u64 + 1).sum();
    let mode = if opts.reset { FolderMode::Separate } else { FolderMode::Documents };
    Ok(SplitData { origin, docs, mode, words: Some(words) })
}

impl Dialogue {
    /// One split of the config's CMU-DoG folder through the config's tokenizer, as
    /// [`split_data`].
    fn tokens(cfg: &Config, split: Split) -> Result<SplitData> {
        let dir = cfg
            .data
            .path
            .as_deref()
            .ok_or_else(|| LetheError::config("data.path", "none", "the CMU-DoG folder is needed (--data DIR)"))?;
        let tokenizer = super::text::tokenizer_of(cfg)?;
        split_data(tokenizer.as_ref(), &cfg.data.dialogue, &read_split(dir, split)?, dir, split)
    }
}

impl Task for Dialogue {
    fn name(&self) -> &'static str {
        "dialogue"
    }

    fn describe(&self, d: &DataConfig) -> String {
        let path = d.path.as_deref().unwrap_or(Path::new("?"));
        let reading = match &d.tokenizer {
            Some(t) => format!("tokenised by {}", t.display()),
            None => "as bytes".to_string(),
        };
        let doc = if d.dialogue.document { "document then dialogue" } else { "dialogue without its document" };
        let memory =
            if d.dialogue.reset { "memory emptied per conversation" } else { "memory carried across conversations" };
        format!("CMU-DoG dialogues {} ({doc}, responses scored, {memory}) {reading}", path.display())
    }

    fn metric(&self) -> Metric {
        Metric::WordPerplexity
    }

    fn load_split(&self, cfg: &Config, split: Split, _batch: usize) -> Result<SplitData> {
        Dialogue::tokens(cfg, split)
    }

    fn train_streams(&self, cfg: &Config, batch: usize) -> Result<TrainStreams> {
        let split = Dialogue::tokens(cfg, Split::Train)?;
        TrainStreams::of_split(&split, batch, cfg.train.block, cfg.data_seed())
    }
}

/// Encodes text with `tokenizer` (a long one in pieces, [`crate::text::encode_long`]:
/// `lethe chat --document` may be given any file), or as bytes without one.
pub fn encoder(tokenizer: Option<&Tokenizer>) -> impl Fn(&str) -> Result<Vec<Token>> + '_ {
    move |text| match tokenizer {
        Some(t) => crate::text::encode_long(t, text),
        None => Ok(text.bytes().map(Token::from).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(uid: &str, text: &str) -> Message {
        Message { uid: uid.into(), text: text.into() }
    }

    #[test]
    fn one_speakers_messages_make_one_turn_and_the_first_speaker_is_a() {
        let history =
            [message("user2", "hi\nthere"), message("user2", "  "), message("user2", "you?"), message("user1", "fine")];
        let turns = turns_of(&history);
        assert_eq!(
            turns,
            vec![Turn { speaker: 0, text: "hi there you?".into() }, Turn { speaker: 1, text: "fine".into() }]
        );
    }

    #[test]
    fn only_response_text_and_its_newline_are_scored() {
        let c = Conversation {
            document: "Doc line\nmore".into(),
            turns: vec![Turn { speaker: 0, text: "hi".into() }, Turn { speaker: 1, text: "yo".into() }],
        };
        let seq = c.encode(true, &encoder(None)).unwrap();
        let text = String::from_utf8(super::super::seq::bytes_of(&seq.tokens)).unwrap();
        assert_eq!(text, "Doc line\nmore\nA: hi\nB: yo\n");
        let scored: String =
            text.chars().zip(seq.scored.as_ref().unwrap()).filter(|(_, &s)| s).map(|(c, _)| c).collect();
        assert_eq!(scored, " hi\n yo\n");
        let without = c.encode(false, &encoder(None)).unwrap();
        assert_eq!(String::from_utf8(super::super::seq::bytes_of(&without.tokens)).unwrap(), "A: hi\nB: yo\n");
    }

    #[test]
    fn a_wikidata_file_becomes_lines_of_text() {
        let v: serde_json::Value = serde_json::json!({
            "0": {"movieName": "Jaws", "year": "1975", "director": "Steven Spielberg ", "cast": ["Roy Scheider as Brody", "Robert Shaw as Quint"],
                  "genre": "Thriller", "introduction": "A shark.", "rating": ["Rotten Tomatoes: 97%"], "critical_response": ["Great.", "Scary."]},
            "1": "Plot one.\n", "2": "Plot two.", "3": "", "index": 4
        });
        assert_eq!(
            document_text(&v),
            "Jaws (1975)\nDirector: Steven Spielberg\nGenre: Thriller\nCast: Roy Scheider as Brody; Robert Shaw as Quint\nRating: Rotten Tomatoes: 97%\nA shark.\nGreat.; Scary.\nPlot one.\nPlot two."
        );
    }
}
