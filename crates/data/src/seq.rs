//! The token sequences every data source yields: a sequence with its scored positions
//! ([`TokenSeq`]), the three splits, and one split's documents ([`SplitData`]).

use std::path::PathBuf;

use lethe_core::config::FolderMode;
use lethe_core::error::{LetheError, Result};

/// A token id: a byte for the byte-level sources and the synthetic tasks, an id of the
/// tokenizer's vocabulary for tokenised text (GPT-2's 50,257, a word vocabulary's
/// hundreds of thousands).
pub type Token = u32;

/// Tokens of a byte vocabulary as bytes (an id above 255, which no byte source
/// yields, becomes `?`).
pub fn bytes_of(tokens: &[Token]) -> Vec<u8> {
    tokens.iter().map(|&t| u8::try_from(t).unwrap_or(b'?')).collect()
}

/// A finite token sequence. Position `i` is predicted from the inputs before it: its
/// target is `labels[i]` when there are labels, `tokens[i]` otherwise. `scored[i]` says
/// whether that prediction counts; `None` means every position counts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenSeq {
    /// The tokens (the inputs).
    pub tokens: Vec<Token>,
    /// Which targets are scored (`None`: all).
    pub scored: Option<Vec<bool>>,
    /// Targets that differ from the tokens (`None`: the targets are the tokens).
    pub labels: Option<Vec<Token>>,
}

impl TokenSeq {
    /// A sequence in which every token is scored.
    pub fn all_scored(tokens: Vec<Token>) -> Self {
        TokenSeq { tokens, scored: None, labels: None }
    }

    /// A sequence of bytes (the synthetic tasks' and byte corpora's tokens), with which
    /// targets are scored and the labels that replace them, if any.
    pub fn bytes(tokens: &[u8], scored: Option<Vec<bool>>, labels: Option<&[u8]>) -> Self {
        let ids = |b: &[u8]| b.iter().map(|&t| Token::from(t)).collect::<Vec<Token>>();
        TokenSeq { tokens: ids(tokens), scored, labels: labels.map(ids) }
    }

    /// The target of position `i`.
    pub fn target(&self, i: usize) -> Token {
        self.labels.as_ref().map_or(self.tokens[i], |l| l[i])
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether predicting token `i` counts.
    pub fn is_scored(&self, i: usize) -> bool {
        self.scored.as_ref().is_none_or(|s| s[i])
    }

    /// Appends another sequence.
    pub fn extend(&mut self, other: &TokenSeq) {
        if self.labels.is_some() || other.labels.is_some() {
            let mine = self.labels.get_or_insert_with(|| self.tokens.clone());
            mine.extend_from_slice(other.labels.as_ref().unwrap_or(&other.tokens));
        }
        match (&mut self.scored, &other.scored) {
            (None, None) => {}
            (mine, theirs) => {
                let own_len = self.tokens.len();
                let s = mine.get_or_insert_with(|| vec![true; own_len]);
                match theirs {
                    Some(t) => s.extend_from_slice(t),
                    None => s.extend(std::iter::repeat_n(true, other.len())),
                }
            }
        }
        self.tokens.extend_from_slice(&other.tokens);
    }

    /// The sub-sequence `[start, end)`.
    pub fn slice(&self, start: usize, end: usize) -> TokenSeq {
        TokenSeq {
            tokens: self.tokens[start..end].to_vec(),
            scored: self.scored.as_ref().map(|s| s[start..end].to_vec()),
            labels: self.labels.as_ref().map(|l| l[start..end].to_vec()),
        }
    }
}

/// Which split of the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Training data.
    Train,
    /// Validation data.
    Valid,
    /// Test data.
    Test,
}

impl std::str::FromStr for Split {
    type Err = LetheError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Split::Train),
            "valid" | "validation" => Ok(Split::Valid),
            "test" => Ok(Split::Test),
            _ => Err(LetheError::Invalid(format!("unknown split `{s}`: use train, valid or test"))),
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Valid => "valid",
            Split::Test => "test",
        })
    }
}

/// A split as documents, with how they become parallel streams.
#[derive(Clone, Debug)]
pub struct SplitData {
    /// Where it came from, for messages (a path or a task name).
    pub origin: PathBuf,
    /// The documents (one for a single file).
    pub docs: Vec<TokenSeq>,
    /// Concatenate and cut, or keep documents whole per stream.
    pub mode: FolderMode,
    /// Words of the scored text, for perplexity per word (see [`super::text`]): the
    /// whole raw text of a corpus, the responses of dialogues; `None` for the
    /// synthetic tasks.
    pub words: Option<u64>,
}

impl SplitData {
    /// Total tokens.
    pub fn total_len(&self) -> usize {
        self.docs.iter().map(TokenSeq::len).sum()
    }

    /// Tokens whose prediction counts.
    pub fn scored_len(&self) -> usize {
        self.docs.iter().map(|d| d.scored.as_ref().map_or(d.len(), |s| s.iter().filter(|&&x| x).count())).sum()
    }

    /// Lays the split out as `batch` parallel streams.
    ///
    /// `concat`: all documents end to end, cut into `batch` equal pieces (the remainder
    /// of fewer than `batch` tokens is dropped). `documents` (and `separate`, whose
    /// streams [`super::rounds`] reads in rounds instead): each document goes whole to
    /// the currently shortest stream.
    pub fn into_streams(&self, batch: usize) -> Vec<TokenSeq> {
        match self.mode {
            FolderMode::Concat => {
                let mut all = TokenSeq::default();
                for d in &self.docs {
                    all.extend(d);
                }
                let per = all.len() / batch;
                (0..batch).map(|b| all.slice(b * per, (b + 1) * per)).collect()
            }
            FolderMode::Documents | FolderMode::Separate => {
                let mut streams = vec![TokenSeq::default(); batch];
                for d in &self.docs {
                    if let Some(s) = streams.iter_mut().min_by_key(|s| s.len()) {
                        s.extend(d);
                    }
                }
                streams
            }
        }
    }
}
