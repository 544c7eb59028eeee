//! Streaming evaluation: a split is walked once as parallel streams, block by block, with
//! each layer's memory carried across blocks, no dropout and no gradient
//! (ALGORITHMS.md, backbone). The block length may differ from training.

use serde::Serialize;
use tch::Kind;

use crate::data::{EvalWalker, SplitData};
use crate::error::Result;
use crate::model::{token_nll, Lm};

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
pub fn evaluate(lm: &Lm, split: &SplitData, batch: usize, block: usize, max_tokens: Option<usize>) -> Result<EvalResult> {
    evaluate_with_progress(lm, split, batch, block, max_tokens, |_, _| {})
}

/// [`evaluate`], calling `progress(done, total)` (target positions) after every block.
pub fn evaluate_with_progress(
    lm: &Lm,
    split: &SplitData,
    batch: usize,
    block: usize,
    max_tokens: Option<usize>,
    mut progress: impl FnMut(usize, usize),
) -> Result<EvalResult> {
    let _guard = tch::no_grad_guard();
    let device = lm.device();
    let mut walker = EvalWalker::new(split, batch)?;
    let every_token_scored = split.docs.iter().all(|d| d.scored.is_none());
    let b = walker.batch();
    let total = walker.positions().min(max_tokens.unwrap_or(usize::MAX));
    let mut mem = lm.model.new_memory();
    let (mut nll_sum, mut weight, mut hits, mut seen) = (0.0f64, 0.0f64, 0.0f64, 0usize);
    let layers = lm.config.model.layers;
    let (mut mem_size, mut held, mut spans) = (vec![0.0; layers], vec![0.0; layers], vec![0.0; layers]);
    let mut has_spans = false;
    let mut blocks = 0usize;
    let mut answers = Answers::default();
    while let Some(batch) = walker.next_block(block) {
        let (x, y, w) = batch.tensors(0, b, device);
        let out = lm.model.forward(&x, &mut mem, false)?;
        let nll = token_nll(&out.logits, &y).to_kind(Kind::Double); // (b, m)
        nll_sum += (&nll * w.to_kind(Kind::Double)).sum(Kind::Double).double_value(&[]);
        weight += batch.scored();
        let hit: Vec<f32> = out.logits.argmax(-1, false).eq_tensor(&y).to_kind(Kind::Float).flatten(0, -1).try_into().unwrap_or_default();
        for (i, (&h, &wt)) in hit.iter().zip(&batch.weights).enumerate() {
            hits += (h * wt) as f64;
            answers.observe(i / batch.len, wt > 0.0, h > 0.0);
        }
        for (l, r) in mem.reports().iter().enumerate() {
            mem_size[l] += r.mem_size;
            held[l] += r.held as f64;
            if let Some(s) = r.extra("mean_span") {
                spans[l] += s;
                has_spans = true;
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
    let loss = nll_sum / weight.max(1.0);
    Ok(EvalResult {
        loss,
        bpb: loss / std::f64::consts::LN_2,
        accuracy: hits / weight.max(1.0),
        answer_accuracy: (!every_token_scored).then(|| answers.right as f64 / answers.total.max(1) as f64),
        tokens: weight as u64,
        mem_size: per_block(&mem_size, blocks),
        held: per_block(&held, blocks),
        mean_span: has_spans.then(|| per_block(&spans, blocks)),
    })
}

fn per_block(sums: &[f64], blocks: usize) -> Vec<f64> {
    sums.iter().map(|s| s / blocks.max(1) as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::Answers;

    #[test]
    fn answers_count_runs_of_scored_tokens_per_stream() {
        let mut a = Answers::default();
        // stream 0: run [hit, hit] then unscored; stream 1: run [hit, miss] left open
        for (s, scored, hit) in [(0, true, true), (1, true, true), (0, true, true), (1, true, false), (0, false, false)] {
            a.observe(s, scored, hit);
        }
        a.finish();
        assert_eq!((a.right, a.total), (1, 2));
    }
}
