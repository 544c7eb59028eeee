//! One step's worth of tokens (`B` streams of `M` inputs, their targets and which are
//! scored), as every kind of training and evaluation stream hands it to the model.

use tch::{Device, Kind, Tensor};

use super::seq::{Token, TokenSeq};

/// One step's worth of tokens: `batch` streams of `len` tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Parallel streams.
    pub batch: usize,
    /// Tokens per stream in this block.
    pub len: usize,
    /// Inputs, row-major `(batch, len)`.
    pub inputs: Vec<i64>,
    /// Next tokens, row-major `(batch, len)`.
    pub targets: Vec<i64>,
    /// 1 where the target is scored, 0 where it is context or padding.
    pub weights: Vec<f32>,
    /// True when the streams restarted: the memory must be emptied before this block.
    pub reset: bool,
}

impl Batch {
    pub(super) fn with_capacity(batch: usize, len: usize, reset: bool) -> Self {
        let n = batch * len;
        Batch {
            batch,
            len,
            inputs: Vec::with_capacity(n),
            targets: Vec::with_capacity(n),
            weights: Vec::with_capacity(n),
            reset,
        }
    }

    /// Appends one stream's `len` inputs, targets and scored flags.
    pub(super) fn push_stream(
        &mut self,
        inputs: impl Iterator<Item = Token>,
        targets: impl Iterator<Item = Token>,
        scored: impl Iterator<Item = f32>,
    ) {
        self.inputs.extend(inputs.take(self.len).map(i64::from));
        self.targets.extend(targets.take(self.len).map(i64::from));
        self.weights.extend(scored.take(self.len));
    }

    /// Appends the `len` positions of `seq` from `pos`: its inputs, their targets and
    /// scored flags; positions past its end are padding (token 0, target 0, unscored).
    pub(super) fn push_from(&mut self, seq: &TokenSeq, pos: usize) {
        let n = seq.len();
        let inputs = (pos..pos + self.len).map(|i| seq.tokens.get(i).copied().unwrap_or(0));
        let targets = (pos + 1..=pos + self.len).map(|i| if i < n { seq.target(i) } else { 0 });
        let flags = (pos + 1..=pos + self.len).map(|i| if i < n && seq.is_scored(i) { 1.0 } else { 0.0 });
        self.push_stream(inputs, targets, flags);
    }

    /// Number of scored targets.
    pub fn scored(&self) -> f64 {
        self.weights.iter().map(|&w| w as f64).sum()
    }

    /// Streams `[from, to)` of this batch, as tensors `(inputs, targets, weights)` on `device`.
    pub fn tensors(&self, from: usize, to: usize, device: Device) -> (Tensor, Tensor, Tensor) {
        let (a, b) = (from * self.len, to * self.len);
        let shape = [(to - from) as i64, self.len as i64];
        let x = Tensor::from_slice(&self.inputs[a..b]).view(shape).to_device(device);
        let y = Tensor::from_slice(&self.targets[a..b]).view(shape).to_device(device);
        let w = Tensor::from_slice(&self.weights[a..b]).view(shape).to_kind(Kind::Float).to_device(device);
        (x, y, w)
    }
}
