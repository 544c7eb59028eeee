//! Streaming evaluation: a split is walked once as parallel streams, block by block, with
//! each layer's memory carried across blocks, no dropout and no gradient
//! (docs/design/algorithms.md, Backbone). The block length may differ from training.

use serde::Serialize;
use tch::{Kind, Tensor};

use lethe_core::dist::ProcessGroup;
use lethe_core::error::{LetheError, Result};
use lethe_data::{EvalWalker, SplitData};
use lethe_model::{host_values, Lm};

/// What to do when an evaluation scored no token (too few `train.eval_tokens` for
/// the task's scored positions), as training, `lethe train` and `lethe sweep` say it.
pub const NOTHING_SCORED_ADVICE: &str = "raise train.eval_tokens, or 0 for the whole split";

/// The scores of one pass over a split.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvalResult {
    /// Mean negative log-likelihood per scored token, in nats.
    pub loss: f64,
    /// Bits per byte (token): `loss / ln 2`.
    pub bpb: f64,
    /// Share of scored tokens predicted exactly (argmax).
    pub accuracy: f64,
    /// Share of answers (maximal runs of consecutive scored tokens) predicted entirely
    /// right; `None` when every token is scored (a plain corpus).
    pub answer_accuracy: Option<f64>,
    /// Perplexity per token: `exp(loss)`.
    pub ppl: f64,
    /// Perplexity per word of the raw text, `exp(loss · tokens / words)` over the split
    /// (see [`lethe_data::text`]); `None` for the synthetic tasks.
    pub word_ppl: Option<f64>,
    /// Scored tokens.
    pub tokens: u64,
    /// Mean memory size `|C_t|` per layer over the pass.
    pub mem_size: Vec<f64>,
    /// Mean cache length actually held per layer (padded width), over the pass.
    pub held: Vec<f64>,
    /// Mean predicted span per layer, for mechanisms that predict spans.
    pub mean_span: Option<Vec<f64>>,
}

/// Per-stream tracking of answers: is the current run of scored tokens all right so far?
#[derive(Default)]
struct Answers {
    open: Vec<Option<bool>>,
    right: u64,
    total: u64,
}

impl Answers {
    fn observe(&mut self, stream: usize, scored: bool, hit: bool) {
        if self.open.len() <= stream {
            self.open.resize(stream + 1, None);
        }
        match (scored, self.open[stream]) {
            (true, Some(ok)) => self.open[stream] = Some(ok && hit),
            (true, None) => self.open[stream] = Some(hit),
            (false, Some(ok)) => {
                self.total += 1;
                self.right += ok as u64;
                self.open[stream] = None;
            }
            (false, None) => {}
        }
    }

    fn finish(&mut self) {
        for ok in self.open.drain(..).flatten() {
            self.total += 1;
            self.right += ok as u64;
        }
    }
}

/// Scores `lm` on `split` as `batch` parallel streams in blocks of `block` tokens.
/// With `max_tokens`, stops after that many target positions (all streams).
pub fn evaluate(
    lm: &Lm,
    split: &SplitData,
    batch: usize,
    block: usize,
    max_tokens: Option<usize>,
) -> Result<EvalResult> {
    evaluate_with_progress(lm, split, batch, block, max_tokens, |_, _| {})
}

/// [`evaluate`], calling `progress(done, total)` (target positions) after every block.
pub fn evaluate_with_progress(
    lm: &Lm,
    split: &SplitData,
    batch: usize,
    block: usize,
    max_tokens: Option<usize>,
    progress: impl FnMut(usize, usize),
) -> Result<EvalResult> {
    evaluate_sharded(lm, split, batch, block, max_tokens, None, progress)
}

/// [`evaluate_with_progress`] over the ranks of a data-parallel `group`: every rank walks
/// the same blocks of all `batch` streams but runs the model on its own share of them
/// (rank `r` the streams `r * b / n .. (r + 1) * b / n`), and the sums are reduced, so
/// every rank returns what one process scoring all the streams would.
pub fn evaluate_sharded(
    lm: &Lm,
    split: &SplitData,
    batch: usize,
    block: usize,
    max_tokens: Option<usize>,
    group: Option<&ProcessGroup>,
    progress: impl FnMut(usize, usize),
) -> Result<EvalResult> {
    run(lm, split, (batch, block, max_tokens), group, progress, None)
}

/// One target position of an evaluation (`eval --per-token`).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenScore {
    /// The stream, `0..batch`.
    pub stream: usize,
    /// The position of the target in its stream (documents read one at a time: in the
    /// stream's rounds one after another, padding included).
    pub position: usize,
    /// The token to predict.
    pub target: lethe_data::Token,
    /// Its negative log-likelihood, in nats.
    pub loss: f64,
    /// Whether the task scores it (a copy task scores only its answers).
    pub scored: bool,
    /// Per layer, the span the model gave the input token at this position (Expire-Span;
    /// empty for other mechanisms).
    pub spans: Vec<f32>,
    /// Per layer, the memory size over this block (mean over the streams).
    pub mem_size: Vec<f64>,
}

/// [`evaluate_with_progress`], handing `sink` every target position's [`TokenScore`],
/// block by block, each block's stream by stream (one process).
pub fn evaluate_per_token(
    lm: &Lm,
    split: &SplitData,
    (batch, block, max_tokens): (usize, usize, Option<usize>),
    progress: impl FnMut(usize, usize),
    mut sink: impl FnMut(&TokenScore) -> Result<()>,
) -> Result<EvalResult> {
    run(lm, split, (batch, block, max_tokens), None, progress, Some(&mut sink))
}

/// Writes [`TokenScore`]s as CSV (`eval --per-token FILE`), one row per target: `stream,
/// position, target, text, loss, scored`, then `span_<layer>` (Expire-Span) and
/// `mem_<layer>`. The rows go to a temporary file beside it
/// ([`lethe_core::output::temporary`]), renamed to `FILE` once complete.
pub struct PerTokenCsv {
    path: std::path::PathBuf,
    tmp: std::path::PathBuf,
    writer: csv::Writer<std::io::BufWriter<std::fs::File>>,
    header: bool,
}

impl PerTokenCsv {
    /// Starts the file at `path` (nothing appears there until [`PerTokenCsv::finish`]).
    pub fn create(path: &std::path::Path) -> Result<PerTokenCsv> {
        lethe_core::output::check("--per-token", path, &[])?;
        let tmp = lethe_core::output::temporary(path);
        let file = std::fs::File::create(&tmp).map_err(|e| LetheError::io(&tmp, e))?;
        let writer = csv::Writer::from_writer(std::io::BufWriter::new(file));
        Ok(PerTokenCsv { path: path.to_path_buf(), tmp, writer, header: false })
    }

    /// Adds `s`, whose target reads as `text`.
    pub fn write(&mut self, s: &TokenScore, text: &str) -> Result<()> {
        if !self.header {
            let mut names: Vec<String> =
                ["stream", "position", "target", "text", "loss", "scored"].map(String::from).to_vec();
            names.extend((0..s.spans.len()).map(|l| format!("span_{l}")));
            names.extend((0..s.mem_size.len()).map(|l| format!("mem_{l}")));
            self.writer.write_record(&names).map_err(|e| self.failed(e))?;
            self.header = true;
        }
        let mut row = vec![
            s.stream.to_string(),
            s.position.to_string(),
            s.target.to_string(),
            text.to_string(),
            format!("{:.6}", s.loss),
            (s.scored as u8).to_string(),
        ];
        row.extend(s.spans.iter().map(|v| format!("{v:.2}")));
        row.extend(s.mem_size.iter().map(|v| format!("{v:.1}")));
        self.writer.write_record(&row).map_err(|e| self.failed(e))
    }

    /// Completes the file.
    pub fn finish(mut self) -> Result<()> {
        self.writer.flush().map_err(|e| LetheError::io(&self.path, e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| LetheError::io(&self.path, e))
    }

    /// A failed write, named by the file the user asked for (a full disk, as a rule).
    fn failed(&self, e: csv::Error) -> LetheError {
        if !e.is_io_error() {
            return LetheError::Csv(e);
        }
        match e.into_kind() {
            csv::ErrorKind::Io(e) => LetheError::io(&self.path, e),
            kind => LetheError::Invalid(format!("`{}`: {kind:?}", self.path.display())),
        }
    }
}

/// A file left unfinished (a write failed, the evaluation stopped) takes its partial
/// rows with it, rather than leave them filling the disk.
impl Drop for PerTokenCsv {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// The figures of one evaluated block, as [`TokenScore`]s.
fn token_scores(
    mem: &lethe_model::Memory,
    targets: &Tensor,
    nll: &Tensor,
    weights: &[f32],
    start: usize,
) -> Result<Vec<TokenScore>> {
    let (losses, ids) = (host_values(nll)?, host_values(targets)?);
    let m = targets.size()[1] as usize;
    let spans: Vec<Vec<f64>> = mem.token_spans().iter().flatten().map(host_values).collect::<Result<_>>()?;
    let mem_size: Vec<f64> = mem.reports().iter().map(|r| r.mem_size).collect();
    Ok((0..losses.len())
        .map(|i| TokenScore {
            stream: i / m,
            position: start + i % m,
            target: ids[i] as lethe_data::Token,
            loss: losses[i],
            scored: weights[i] > 0.0,
            spans: spans.iter().map(|s| s[i] as f32).collect(),
            mem_size: mem_size.clone(),
        })
        .collect())
}

/// Where [`evaluate_per_token`] hands each target's figures.
type TokenSink<'a> = &'a mut dyn FnMut(&TokenScore) -> Result<()>;

/// The evaluation loop of [`evaluate_sharded`] and [`evaluate_per_token`].
fn run(
    lm: &Lm,
    split: &SplitData,
    (batch, block, max_tokens): (usize, usize, Option<usize>),
    group: Option<&ProcessGroup>,
    mut progress: impl FnMut(usize, usize),
    mut sink: Option<TokenSink>,
) -> Result<EvalResult> {
    let _guard = tch::no_grad_guard();
    let device = lm.device();
    let mut walker = EvalWalker::new(split, batch)?;
    let every_token_scored = split.docs.iter().all(|d| d.scored.is_none());
    let b = walker.batch();
    let (rank, world) = group.map_or((0, 1), |g| (g.rank(), g.world_size()));
    let (lo, hi) = (rank * b / world, (rank + 1) * b / world); // this rank's streams
    let share = (hi - lo) as f64 / b as f64;
    let total = walker.positions().min(max_tokens.unwrap_or(usize::MAX));
    let mut mem = lm.model.new_memory();
    let mut s = Sums::new(lm.config.model.layers);
    let (mut seen, mut blocks) = (0usize, 0usize);
    let mut answers = Answers::default();
    while let Some(batch) = walker.next_block(block) {
        if batch.reset && blocks > 0 {
            mem.reset(); // a new round of documents read one at a time
        }
        if hi > lo {
            let (x, y, w) = batch.tensors(lo, hi, device);
            let (nll, predicted) = lm.model.forward_eval(&x, &y, &mut mem)?;
            let nll = nll.to_kind(Kind::Double); // (hi - lo, m)
            s.nll += (&nll * w.to_kind(Kind::Double)).sum(Kind::Double).double_value(&[]);
            let weights = &batch.weights[lo * batch.len..hi * batch.len];
            s.weight += weights.iter().map(|&w| w as f64).sum::<f64>();
            let hit: Vec<f32> =
                predicted.eq_tensor(&y).to_kind(Kind::Float).flatten(0, -1).try_into().unwrap_or_default();
            for (i, (&h, &wt)) in hit.iter().zip(weights).enumerate() {
                s.hits += (h * wt) as f64;
                answers.observe(i / batch.len, wt > 0.0, h > 0.0);
            }
            s.observe_memory(&mem, share);
            if let Some(sink) = sink.as_mut() {
                for score in token_scores(&mem, &y, &nll, weights, seen / batch.batch)? {
                    sink(&score)?;
                }
            }
        }
        blocks += 1;
        seen += batch.batch * batch.len;
        progress(seen, total);
        if max_tokens.is_some_and(|m| seen >= m) {
            break;
        }
    }
    answers.finish();
    (s.right, s.answers) = (answers.right as f64, answers.total as f64);
    if let Some(g) = group {
        s = s.reduced(g)?;
    }
    // `words` counts the scored words (all of them, but for dialogue's responses).
    let per_word = split.words.filter(|&w| w > 0).map(|w| split.scored_len() as f64 / w as f64);
    Ok(s.result(blocks, every_token_scored, per_word))
}

/// What an evaluation adds up, per rank before the reduction.
struct Sums {
    nll: f64,
    weight: f64,
    hits: f64,
    right: f64,
    answers: f64,
    /// Per layer, summed over the blocks: memory size and span (weighted by the rank's
    /// share of the streams), and the cache held (the widest rank's).
    mem_size: Vec<f64>,
    spans: Vec<f64>,
    held: Vec<f64>,
    has_spans: bool,
}

impl Sums {
    fn new(layers: usize) -> Sums {
        let zeros = vec![0.0; layers];
        Sums {
            nll: 0.0,
            weight: 0.0,
            hits: 0.0,
            right: 0.0,
            answers: 0.0,
            mem_size: zeros.clone(),
            spans: zeros.clone(),
            held: zeros,
            has_spans: false,
        }
    }

    /// Adds a block's memory report, as `share` of all the streams.
    fn observe_memory(&mut self, mem: &lethe_model::Memory, share: f64) {
        for (l, r) in mem.reports().iter().enumerate() {
            self.mem_size[l] += share * r.mem_size;
            self.held[l] += r.held as f64;
            if let Some(span) = r.extra("mean_span") {
                self.spans[l] += share * span;
                self.has_spans = true;
            }
        }
    }

    /// The sums over the ranks (the held cache: the maximum).
    fn reduced(self, g: &ProcessGroup) -> Result<Sums> {
        let layers = self.mem_size.len();
        let mut flat =
            vec![self.nll, self.weight, self.hits, self.right, self.answers, f64::from(u8::from(self.has_spans))];
        flat.extend(&self.mem_size);
        flat.extend(&self.spans);
        let sums = g.sum_f64(&flat)?;
        let held = g.max_f64(&self.held)?;
        let (scalars, per_layer) = sums.split_at(6);
        Ok(Sums {
            nll: scalars[0],
            weight: scalars[1],
            hits: scalars[2],
            right: scalars[3],
            answers: scalars[4],
            has_spans: scalars[5] > 0.0,
            mem_size: per_layer[..layers].to_vec(),
            spans: per_layer[layers..].to_vec(),
            held,
        })
    }

    /// `tokens_per_word`: the split's, for the perplexity per word.
    fn result(&self, blocks: usize, every_token_scored: bool, tokens_per_word: Option<f64>) -> EvalResult {
        let loss = self.nll / self.weight.max(1.0);
        EvalResult {
            loss,
            bpb: loss / std::f64::consts::LN_2,
            ppl: loss.exp(),
            word_ppl: tokens_per_word.map(|r| (loss * r).exp()),
            accuracy: self.hits / self.weight.max(1.0),
            answer_accuracy: (!every_token_scored).then(|| self.right / self.answers.max(1.0)),
            tokens: self.weight as u64,
            mem_size: per_block(&self.mem_size, blocks),
            held: per_block(&self.held, blocks),
            mean_span: self.has_spans.then(|| per_block(&self.spans, blocks)),
        }
    }
}

fn per_block(sums: &[f64], blocks: usize) -> Vec<f64> {
    sums.iter().map(|s| s / blocks.max(1) as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::{Answers, PerTokenCsv, TokenScore};

    /// The rows appear at the path only once the file is finished; a file dropped
    /// unfinished (a failed write, a stopped evaluation) leaves nothing behind, and a
    /// failed write names the file asked for.
    #[test]
    fn a_per_token_file_is_whole_or_absent() {
        let dir = tempfile::tempdir().unwrap();
        let score = TokenScore {
            stream: 0,
            position: 3,
            target: 65,
            loss: 0.5,
            scored: true,
            spans: vec![],
            mem_size: vec![2.0],
        };
        let (done, dropped) = (dir.path().join("done.csv"), dir.path().join("dropped.csv"));
        let mut csv = PerTokenCsv::create(&done).unwrap();
        csv.write(&score, "A").unwrap();
        assert!(!done.exists(), "rows appeared before the file was finished");
        csv.finish().unwrap();
        let text = std::fs::read_to_string(&done).unwrap();
        assert_eq!(text, "stream,position,target,text,loss,scored,mem_0\n0,3,65,A,0.500000,1,2.0\n");
        let mut csv = PerTokenCsv::create(&dropped).unwrap();
        csv.write(&score, "A").unwrap();
        let failed = csv.failed(csv::Error::from(std::io::Error::other("no space left")));
        assert_eq!(failed.to_string(), format!("`{}`: no space left", dropped.display()));
        drop(csv);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["done.csv"], "an unfinished file left {left:?}");
    }

    /// Two writers of one file at once (two evaluations given the same --per-token)
    /// each write their own rows: the file is the last one finished, whole.
    #[test]
    fn two_writers_of_one_file_do_not_mix_their_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tok.csv");
        let score = |position| TokenScore {
            stream: 0,
            position,
            target: 65,
            loss: 0.5,
            scored: true,
            spans: vec![],
            mem_size: vec![],
        };
        let (mut first, mut second) = (PerTokenCsv::create(&path).unwrap(), PerTokenCsv::create(&path).unwrap());
        for position in 0..1000 {
            first.write(&score(position), "A").unwrap();
            second.write(&score(position + 5000), "B").unwrap();
        }
        second.finish().unwrap();
        first.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1001);
        assert!(text.lines().skip(1).all(|row| row.ends_with(",A,0.500000,1")), "the rows are mixed");
    }

    #[test]
    fn answers_count_runs_of_scored_tokens_per_stream() {
        let mut a = Answers::default();
        // stream 0: run [hit, hit] then unscored; stream 1: run [hit, miss] left open
        for (s, scored, hit) in [(0, true, true), (1, true, true), (0, true, true), (1, true, false), (0, false, false)]
        {
            a.observe(s, scored, hit);
        }
        a.finish();
        assert_eq!((a.right, a.total), (1, 2));
    }
}

/// A pretrained decoder's scores over one stream ([`evaluate_decoder`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecoderEval {
    /// Mean negative log-likelihood per predicted token, in nats.
    pub loss: f64,
    /// `exp(loss)`.
    pub ppl: f64,
    /// Share of tokens predicted exactly (argmax).
    pub accuracy: f64,
    /// Predicted tokens (every token but the first).
    pub tokens: usize,
    /// Tokens read at a time.
    pub block: usize,
    /// The most entries each layer held per key-value head, after any chunk.
    pub held: Vec<i64>,
    /// The most bytes the cache held (keys, values, positions), after any chunk.
    pub cache_bytes: usize,
    /// The entries a layer held after a chunk (a key-value head's, or a lethe memory's
    /// states), averaged over the layers and over the tokens read: the memory the
    /// comparisons at equal memory equalise.
    pub mean_held: f64,
}

impl DecoderEval {
    fn empty(block: usize) -> DecoderEval {
        DecoderEval {
            loss: 0.0,
            ppl: 0.0,
            accuracy: 0.0,
            tokens: 0,
            block,
            held: vec![],
            cache_bytes: 0,
            mean_held: 0.0,
        }
    }

    /// Adds a chunk of `t` predicted tokens: their summed log-likelihood `nll`, the
    /// number `right` predicted exactly, and the entries each layer held after it.
    fn add_chunk(&mut self, t: usize, nll: f64, right: i64, held: &[i64], bytes: usize) {
        self.loss += nll;
        self.accuracy += right as f64;
        self.tokens += t;
        self.held.resize(held.len(), 0);
        self.held.iter_mut().zip(held).for_each(|(h, e)| *h = (*h).max(*e));
        self.mean_held += t as f64 * held.iter().sum::<i64>() as f64 / held.len().max(1) as f64;
        self.cache_bytes = self.cache_bytes.max(bytes);
    }

    /// Adds the figures of a window `w` scored apart.
    fn add_window(&mut self, w: &DecoderEval) {
        self.loss += w.loss * w.tokens as f64;
        self.accuracy += w.accuracy * w.tokens as f64;
        self.mean_held += w.mean_held * w.tokens as f64;
        self.tokens += w.tokens;
        self.held.resize(w.held.len(), 0);
        self.held.iter_mut().zip(&w.held).for_each(|(a, b)| *a = (*a).max(*b));
        self.cache_bytes = self.cache_bytes.max(w.cache_bytes);
    }

    /// Sums turned into means per token.
    fn finish(mut self) -> DecoderEval {
        let n = self.tokens.max(1) as f64;
        (self.loss, self.accuracy, self.mean_held) = (self.loss / n, self.accuracy / n, self.mean_held / n);
        self.ppl = self.loss.exp();
        self
    }
}

/// Scores `model` on the stream `ids`, read `block` tokens at a time over `cache` (whose
/// policy evicts after each chunk, so with a budget each token is predicted from the
/// budget's entries and the chunk's tokens before it), each token predicting the next.
/// Calls `progress(tokens read, tokens)` after every chunk.
pub fn evaluate_decoder(
    model: &lethe_model::llama::Llama,
    cache: &mut lethe_model::llama::KvCache,
    ids: &[lethe_data::Token],
    block: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<DecoderEval> {
    if ids.len() < 2 || block == 0 {
        return Err(LetheError::Invalid(format!(
            "a decoder is scored on at least 2 tokens, read at least 1 at a time (got {} tokens, block {block})",
            ids.len()
        )));
    }
    let vocab = model.config.vocab_size;
    if let Some(&bad) = ids.iter().find(|&&t| t as i64 >= vocab) {
        return Err(LetheError::Invalid(format!("token {bad} is not below the model's vocab_size = {vocab}")));
    }
    let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let predicted = ids.len() - 1;
    let mut all = DecoderEval::empty(block);
    for start in (0..predicted).step_by(block) {
        let t = block.min(predicted - start);
        let logits = model.forward(&Tensor::from_slice(&ids[start..start + t]).unsqueeze(0), cache).get(0); // (t, V)
        let (nll, right) = scored(&logits, &ids[start + 1..start + 1 + t]);
        all.add_chunk(t, nll, right, &cache.entries(), cache.bytes());
        progress(start + t, predicted);
    }
    Ok(all.finish())
}

/// The summed negative log-likelihood of `targets` under `logits` `(t, V)`, and how many
/// are the argmax.
fn scored(logits: &Tensor, targets: &[i64]) -> (f64, i64) {
    let targets = Tensor::from_slice(targets).to_device(logits.device());
    let logp = logits.log_softmax(-1, Kind::Float).gather(1, &targets.unsqueeze(1), false);
    let nll = -logp.to_kind(Kind::Double).sum(Kind::Double).double_value(&[]);
    (nll, logits.argmax(-1, false).eq_tensor(&targets).sum(Kind::Int64).int64_value(&[]))
}

/// [`evaluate_decoder`] over the consecutive windows of `context` tokens of `ids` (the
/// last may be shorter), each read from an empty cache of `policy` (whose budget is then
/// a share of `context`): the figures of all windows together, each window's tokens
/// counted once. Calls `progress(tokens read, tokens)` after every chunk.
pub fn evaluate_decoder_windows(
    model: &lethe_model::llama::Llama,
    policy: &lethe_model::kv::Policy,
    ids: &[lethe_data::Token],
    block: usize,
    context: usize,
    progress: impl FnMut(usize, usize),
) -> Result<DecoderEval> {
    let fresh = || Ok(lethe_model::llama::KvCache::new(policy.clone()));
    evaluate_decoder_windows_over(model, fresh, ids, block, context, progress)
}

/// [`evaluate_decoder_windows`] with each window read into the cache `fresh` makes (a
/// learned policy's layers, [`lethe_model::llama::KvCache::with_layers`]).
pub fn evaluate_decoder_windows_over(
    model: &lethe_model::llama::Llama,
    mut fresh: impl FnMut() -> Result<lethe_model::llama::KvCache>,
    ids: &[lethe_data::Token],
    block: usize,
    context: usize,
    progress: impl FnMut(usize, usize),
) -> Result<DecoderEval> {
    in_windows(ids, context, block, progress, |window, progress| {
        evaluate_decoder(model, &mut fresh()?, window, block, progress)
    })
}

/// The figures of `score(window, progress)` over the consecutive windows of `context`
/// tokens of `ids`, the last token of each beginning the next (the last may be shorter),
/// each window's predicted tokens counted once.
fn in_windows(
    ids: &[lethe_data::Token],
    context: usize,
    block: usize,
    mut progress: impl FnMut(usize, usize),
    mut score: impl FnMut(&[lethe_data::Token], &mut dyn FnMut(usize, usize)) -> Result<DecoderEval>,
) -> Result<DecoderEval> {
    if context < 2 {
        return Err(LetheError::Invalid(format!("a window of {context} token(s): each must hold at least 2")));
    }
    let predicted = ids.len().saturating_sub(1);
    let mut all = DecoderEval::empty(block);
    let mut start = 0;
    while start + 1 < ids.len() {
        let end = (start + context).min(ids.len());
        let done = start;
        all.add_window(&score(&ids[start..end], &mut |read, _| progress(done + read, predicted))?);
        start = end - 1; // the window's last token begins the next one's context
    }
    Ok(all.finish())
}

/// A lethe language model (any `model.arch` and memory) scored as
/// [`evaluate_decoder_windows`] scores a decoder: one stream, windows of `context`
/// tokens each read from an empty memory, `block` tokens at a time. The memory held is
/// each layer's states kept after a block (Expire-Span's `kept`), the bytes those of the
/// memory's saved state.
pub fn evaluate_run_windows(
    lm: &Lm,
    ids: &[lethe_data::Token],
    block: usize,
    context: usize,
    progress: impl FnMut(usize, usize),
) -> Result<DecoderEval> {
    let vocab = lm.config.model.vocab;
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(LetheError::Invalid(format!("token {bad} is not below the model's vocab = {vocab}")));
    }
    if block == 0 {
        return Err(LetheError::Invalid("a model reads at least 1 token at a time (block 0)".into()));
    }
    let _guard = tch::no_grad_guard();
    in_windows(ids, context, block, progress, |window, progress| {
        let ids: Vec<i64> = window.iter().map(|&t| t as i64).collect();
        let predicted = ids.len() - 1;
        let mut mem = lm.model.new_memory();
        let mut all = DecoderEval::empty(block);
        for start in (0..predicted).step_by(block) {
            let t = block.min(predicted - start);
            let input = Tensor::from_slice(&ids[start..start + t]).unsqueeze(0).to_device(lm.device());
            let logits = lm.model.forward(&input, &mut mem, false)?.logits.get(0); // (t, V)
            let (nll, right) = scored(&logits, &ids[start + 1..start + 1 + t]);
            let held: Vec<i64> =
                mem.reports().iter().map(|r| r.extra("kept").unwrap_or(r.held as f64).round() as i64).collect();
            let bytes = mem.state().iter().map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum();
            all.add_chunk(t, nll, right, &held, bytes);
            progress(start + t, predicted);
        }
        Ok(all.finish())
    })
}
