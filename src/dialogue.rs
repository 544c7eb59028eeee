//! Responses to document-grounded dialogues, generated and scored as the ∞-former
//! paper's Table 2 (§4.3, App. C.3; the official `eval.py`): for every turn after the
//! first `min_history`, the model reads the document and the conversation so far with
//! its memory, then writes the next turn after its speaker's marker, up to a newline or
//! `max_length` tokens. The reply is scored against the turn that was said (unigram F1,
//! ROUGE-1, ROUGE-L, METEOR: [`crate::textmetrics`]); then the true turn is read in its
//! place and the conversation goes on. One pass per conversation: the state before each
//! reply is kept and restored ([`Generator::snapshot`]), nothing is read twice.
//!
//! Decoding: greedy, sampling (temperature, top-k, nucleus top-p: the official
//! evaluation samples with top-p 0.9), or beam search, whose hypotheses each carry
//! their own memory state and are ranked by log-probability per token.

use crate::data::dialogue::Conversation;
use crate::data::tokenizer::Tokenizer;
use crate::data::Token;
use crate::error::{LetheError, Result};
use crate::generate::{Generator, Sampling, Snapshot};
use crate::model::Lm;
use crate::textmetrics::{Scorer, Scores};

/// How a reply is produced.
#[derive(Clone, Debug)]
pub enum Decoding {
    /// One token at a time by `Sampling` (temperature 0: greedy).
    Sample(Sampling),
    /// Beam search over `width` hypotheses.
    Beam { width: usize },
}

impl Decoding {
    /// The sampling a [`Generator`] is built with: this one's, or greedy for beam search
    /// (which picks its own tokens and never samples).
    fn generator_sampling(&self) -> Sampling {
        match self {
            Decoding::Sample(s) => s.clone(),
            Decoding::Beam { .. } => Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 },
        }
    }
}

/// What [`respond_to_split`] does.
#[derive(Clone, Debug)]
pub struct Options {
    pub decoding: Decoding,
    /// Most tokens in a reply (the official evaluation's 50).
    pub max_length: usize,
    /// Turns read before the first reply is asked for (the official `min_history`, 2).
    pub min_history: usize,
    /// Whether each conversation starts with its document.
    pub with_document: bool,
}

/// One reply and the turn it is compared with.
#[derive(Clone, Debug)]
pub struct Reply {
    /// Which conversation (in the split's order) and which of its turns.
    pub conversation: usize,
    pub turn: usize,
    pub prediction: String,
    pub reference: String,
    pub scores: Scores,
}

/// Text in and out of a model: its tokenizer, or bytes.
pub struct Codec<'a> {
    tokenizer: Option<&'a Tokenizer>,
    /// The ids of a line break: a reply ends there.
    stops: Vec<Token>,
}

impl<'a> Codec<'a> {
    pub fn new(tokenizer: Option<&'a Tokenizer>) -> Result<Self> {
        let mut codec = Codec { tokenizer, stops: vec![] };
        codec.stops = codec.encode("\n")?;
        Ok(codec)
    }

    pub fn encode(&self, text: &str) -> Result<Vec<Token>> {
        crate::data::dialogue::encoder(self.tokenizer)(text)
    }

    pub fn decode(&self, ids: &[Token]) -> Result<String> {
        match self.tokenizer {
            Some(t) => t.decode(ids),
            None => Ok(String::from_utf8_lossy(&crate::data::bytes_of(ids)).into_owned()),
        }
    }

    /// Whether `token` ends a reply: a line break, or a token whose text holds one.
    fn ends_reply(&self, token: Token) -> Result<bool> {
        Ok(self.stops.contains(&token) || self.decode(&[token])?.contains('\n'))
    }
}

/// Writes a reply at the generator's position, leaving the generator where it was.
pub fn reply(g: &mut Generator, codec: &Codec, decoding: &Decoding, max_length: usize) -> Result<String> {
    let start = g.snapshot();
    let ids = match decoding {
        Decoding::Sample(_) => sample_reply(g, codec, max_length)?,
        Decoding::Beam { width } => beam_reply(g, codec, *width, max_length)?,
    };
    g.restore(&start)?;
    Ok(codec.decode(&ids)?.trim().to_string())
}

/// Tokens drawn one at a time until a line break.
fn sample_reply(g: &mut Generator, codec: &Codec, max_length: usize) -> Result<Vec<Token>> {
    let mut ids = vec![];
    for _ in 0..max_length {
        let t = g.next_token()?;
        if codec.ends_reply(t)? {
            break;
        }
        ids.push(t);
    }
    Ok(ids)
}

/// A beam-search hypothesis: its tokens, their log-probability, and the generator's
/// state after them.
struct Hypothesis {
    ids: Vec<Token>,
    logp: f64,
    state: Snapshot,
}

/// A reply's rank in the beam: log-probability per token (a finished reply counts its
/// line break).
fn per_token(logp: f64, tokens: usize) -> f64 {
    logp / tokens.max(1) as f64
}

/// Beam search: each step extends every live hypothesis by its `width` best tokens and
/// keeps the `width` best extensions; a hypothesis that picks a line break is finished.
/// Ends when `width` are finished or after `max_length` tokens; returns the best.
fn beam_reply(g: &mut Generator, codec: &Codec, width: usize, max_length: usize) -> Result<Vec<Token>> {
    let mut live = vec![Hypothesis { ids: vec![], logp: 0.0, state: g.snapshot() }];
    let mut finished: Vec<(f64, Vec<Token>)> = vec![];
    for _ in 0..max_length {
        let mut candidates: Vec<(usize, Token, f64)> = vec![];
        for (h, hyp) in live.iter().enumerate() {
            g.restore(&hyp.state)?;
            let logp = g.next_logits().log_softmax(-1, tch::Kind::Float);
            let k = width.min(logp.size()[0] as usize) as i64;
            let (values, indices) = logp.topk(k, -1, true, true);
            let values = crate::model::host_values(&values)?;
            let indices = crate::model::host_values(&indices)?;
            candidates.extend(values.iter().zip(&indices).map(|(&v, &i)| (h, i as Token, hyp.logp + v)));
        }
        candidates.sort_by(|a, b| b.2.total_cmp(&a.2));
        let mut next = vec![];
        for (h, token, logp) in candidates {
            if next.len() >= width {
                break;
            }
            let mut ids = live[h].ids.clone();
            if codec.ends_reply(token)? {
                if finished.len() < width {
                    finished.push((per_token(logp, ids.len() + 1), ids));
                }
                continue;
            }
            g.restore(&live[h].state)?;
            g.push(token)?;
            ids.push(token);
            next.push(Hypothesis { ids, logp, state: g.snapshot() });
        }
        live = next;
        if finished.len() >= width || live.is_empty() {
            break;
        }
    }
    // At the length limit, unfinished hypotheses compete with the finished ones.
    if finished.len() < width {
        finished.extend(live.into_iter().map(|h| (per_token(h.logp, h.ids.len()), h.ids)));
    }
    let best = finished.into_iter().max_by(|a, b| a.0.total_cmp(&b.0));
    Ok(best.map(|(_, ids)| ids).unwrap_or_default())
}

/// The replies to every turn after the first `min_history` of `conversation` (number
/// `index` in its split).
pub fn respond_to(
    lm: &Lm,
    codec: &Codec,
    conversation: &Conversation,
    index: usize,
    opts: &Options,
    scorer: &Scorer,
) -> Result<Vec<Reply>> {
    let sampling = opts.decoding.generator_sampling();
    let segments = conversation.segments(opts.with_document);
    let (first, rest) =
        segments.split_first().ok_or_else(|| LetheError::Invalid("a conversation without turns".into()))?;
    let mut g = Generator::new(lm, &codec.encode(&first.0)?, &sampling)?;
    let (mut turn, mut replies) = (0, vec![]);
    for (text, is_turn) in rest {
        if *is_turn {
            if turn >= opts.min_history {
                let prediction = reply(&mut g, codec, &opts.decoding, opts.max_length)?;
                let reference = conversation.turns[turn].text.clone();
                let scores = scorer.score(&prediction, &reference);
                replies.push(Reply { conversation: index, turn, prediction, reference, scores });
            }
            turn += 1;
        }
        g.read(&codec.encode(text)?)?;
    }
    Ok(replies)
}

/// The replies to every conversation of a split, scored by `scorer`, calling
/// `progress(done, total)` after each.
pub fn respond_to_split(
    lm: &Lm,
    codec: &Codec,
    conversations: &[Conversation],
    opts: &Options,
    scorer: &Scorer,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<Reply>> {
    if let Decoding::Beam { width: 0 } = opts.decoding {
        return Err(LetheError::Invalid("--beam 0: a beam needs at least one hypothesis".into()));
    }
    if opts.max_length == 0 {
        return Err(LetheError::Invalid("--max-length 0: a reply needs room for at least one token".into()));
    }
    let mut out = vec![];
    for (i, c) in conversations.iter().enumerate() {
        out.extend(respond_to(lm, codec, c, i, opts, scorer)?);
        progress(i + 1, conversations.len());
    }
    Ok(out)
}

/// A conversation with a person about a document: the document is read into memory
/// first, then each of the person's lines (speaker `A`) is read and the model replies
/// as `B`, its reply read back as said. Memory stays bounded by the mechanism however
/// long the talk goes on.
pub struct Chat<'a> {
    generator: Generator<'a>,
    codec: Codec<'a>,
    decoding: Decoding,
    max_length: usize,
}

impl<'a> Chat<'a> {
    /// Reads `document` (text; at least one token).
    pub fn new(lm: &'a Lm, codec: Codec<'a>, document: &str, decoding: Decoding, max_length: usize) -> Result<Self> {
        let sampling = decoding.generator_sampling();
        let text = format!("{}\n", document.trim_end());
        let generator = Generator::new(lm, &codec.encode(&text)?, &sampling)?;
        Ok(Chat { generator, codec, decoding, max_length })
    }

    /// Reads the person's `line` and returns the model's reply.
    pub fn turn(&mut self, line: &str) -> Result<String> {
        let said =
            format!("{} {}\n{}", crate::data::dialogue::SPEAKERS[0], line.trim(), crate::data::dialogue::SPEAKERS[1]);
        self.generator.read(&self.codec.encode(&said)?)?;
        let answer = reply(&mut self.generator, &self.codec, &self.decoding, self.max_length)?;
        self.generator.read(&self.codec.encode(&format!(" {answer}\n"))?)?;
        Ok(answer)
    }

    /// States held by each layer's memory now.
    pub fn memory_held(&self) -> Vec<usize> {
        self.generator.memory_held()
    }
}

/// The replies as CSV: conversation, turn, reference, prediction and every score.
pub fn replies_csv(replies: &[Reply]) -> Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["conversation", "turn", "reference", "prediction", "f1", "rouge1_f", "rougeL_f", "meteor"])?;
    for r in replies {
        let s = &r.scores;
        let scores = [s.f1, s.rouge1.f, s.rouge_l.f, s.meteor].map(|v| format!("{v:.6}"));
        let mut row = vec![r.conversation.to_string(), r.turn.to_string(), r.reference.clone(), r.prediction.clone()];
        row.extend(scores);
        w.write_record(&row)?;
    }
    w.into_inner().map_err(|e| LetheError::Invalid(format!("csv: {e}")))
}
