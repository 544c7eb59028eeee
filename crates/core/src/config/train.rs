//! `[train]`: the optimiser, the learning-rate schedule and the training loop's rhythm.

use serde::{Deserialize, Serialize};

use super::check::{non_negative, positive, positive_number};
use crate::error::{LetheError, Result};

/// The optimiser (Adam), the schedule and the training loop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Parallel streams `B` per step; for the gridworlds, episodes played in parallel.
    /// Default 16.
    pub batch: usize,
    /// Block length `M`: tokens per stream per step (`M <= L`); for the gridworlds, the
    /// truncation window in steps (any length: cut into blocks of at most `L`). Default 32.
    pub block: usize,
    /// Optimiser steps. Default 1500.
    pub steps: usize,
    /// Peak learning rate. Default 1e-3.
    pub lr: f64,
    /// Peak learning rate of the memory mechanism's own parameters (the ∞-former's
    /// long-term memory, the Compressive Transformer's compressor and slot positions,
    /// Expire-Span's predictor, Adaptive-Span's ratios), when it should differ from
    /// `lr`: the ∞-former paper fine-tunes GPT-2 at 5e-5 and its new memory at 2.5e-4
    /// (C.2). The schedule scales both alike. 0: `lr`. Default 0.
    #[serde(default)]
    pub memory_lr: f64,
    /// Train only the memory mechanism's own parameters (Expire-Span's span predictor,
    /// the ∞-former's and the Compressive Transformer's), the model's other weights
    /// frozen as they were loaded: a learned memory fitted onto a pretrained decoder
    /// (`train.init_from`) without changing what it computes where nothing is forgotten.
    /// Frozen weights take no gradient and no optimiser state. Default false.
    #[serde(default)]
    pub freeze_base: bool,
    /// Low-rank adapters (LoRA, Hu et al., 2021) of this rank on every attention layer's
    /// query, key, value and output maps, trained with the memory's parameters while
    /// the rest stays frozen: needs `train.freeze_base = true`. `lethe export` folds them
    /// into the maps. 0: none. Default 0.
    #[serde(default)]
    pub lora_rank: usize,
    /// The adapters' scale is `lora_alpha / lora_rank` (PEFT's convention). Default 16.
    #[serde(default = "default_lora_alpha")]
    pub lora_alpha: f64,
    /// Start from the parameters of a Hugging Face GPT-2 folder (`config.json`,
    /// `model.safetensors`) or of a lethe run (its folder or checkpoint file): the
    /// architecture (the `[model]` sizes) is the source's, and the parameters it lacks
    /// (a new memory's) start fresh. Ignored on `--resume`, which continues from the
    /// run's own checkpoint. Default: none.
    #[serde(default)]
    pub init_from: Option<std::path::PathBuf>,
    /// Linear warm-up steps from 0 to `lr`. Default 100.
    pub warmup: usize,
    /// After warm-up: `cosine` or `linear` (decay to `lr * min_lr_ratio` at `steps`), or `constant`.
    pub schedule: Schedule,
    /// Final learning rate of the cosine schedule, as a fraction of `lr`. Default 0.1.
    pub min_lr_ratio: f64,
    /// Adam beta1. Default 0.9.
    pub beta1: f64,
    /// Adam beta2; with RMSProp, the decay of the average of squared gradients.
    /// Default 0.999.
    pub beta2: f64,
    /// Adam (or RMSProp) epsilon, added to the root of the second moment. Default 1e-8.
    pub eps: f64,
    /// The optimiser: `adam` or `rmsprop` (no momentum; decay `beta2`). Default `adam`.
    #[serde(default)]
    pub optimizer: Optimizer,
    /// Decoupled weight decay (AdamW); 0 disables it. Default 0.
    pub weight_decay: f64,
    /// Gradient clipping by global norm; 0 disables it. Default 1.0.
    pub grad_clip: f64,
    /// Gradient accumulation: the batch is processed in this many micro-batches of
    /// `batch / accum` streams, each with its own cache. Default 1.
    pub accum: usize,
    /// Evaluate on the validation stream every this many steps (0: only at the end). Default 250.
    pub eval_every: usize,
    /// Tokens of the validation stream scored at each periodic evaluation
    /// (0: the whole split). Default 16384.
    pub eval_tokens: usize,
    /// Write a checkpoint every this many steps (0: only at the end). Default 500.
    pub checkpoint_every: usize,
    /// Print progress and log training metrics every this many steps. Default 50.
    pub log_every: usize,
    /// `cpu`, `cuda`, `cuda:N` or `auto` (the GPU when there is one). Default `cpu`.
    pub device: String,
    /// CPU threads for libtorch (0: libtorch's default). Default 0.
    pub threads: usize,
    /// On a GPU, float32 matrix products in TensorFloat-32 (inputs rounded to a 10-bit
    /// mantissa, sums in float32): about 8 times the float32 rate of an A100 or H100,
    /// as PyTorch's `torch.backends.cuda.matmul.allow_tf32`. Training (its evaluations
    /// too) and `lethe bench`; `lethe eval` computes in float32; the CPU is unaffected.
    /// Default false.
    pub tf32: bool,
    /// The arithmetic of training's forward passes: `f32`, `bf16` (libtorch's autocast
    /// to bfloat16: matrix products in bfloat16, while the parameters, the optimiser's
    /// moments, the memories, the losses and the checkpoints stay float32, as does what
    /// needs it inside: the ∞-former's regression and densities), or `f16` (the same in
    /// float16, with a dynamic loss scale as PyTorch's GradScaler keeps it: for GPUs
    /// without bfloat16). Evaluations compute in float32. Default `f32`.
    #[serde(default)]
    pub precision: Precision,
    /// Under torchrun: seconds (at most a week) the rendezvous and every collective wait
    /// for the other ranks before the run stops with an error naming the rank (a dead or
    /// stuck peer). Default 600.
    #[serde(default = "default_dist_timeout")]
    pub dist_timeout: u64,
    /// Under torchrun: the collectives of the data-parallel group. `auto`: NCCL for GPU
    /// ranks (one GPU a rank, `cuda:LOCAL_RANK`), Gloo for CPU ranks; `nccl`: NCCL, GPU
    /// ranks only (it needs `liblethe_nccl.so`, which `scripts/build-nccl.sh` builds);
    /// `gloo`: Gloo, whose GPU ranks may share GPUs (`cuda:(LOCAL_RANK mod GPUs)`).
    /// Default `auto`.
    #[serde(default)]
    pub dist_backend: DistBackend,
    /// Under torchrun: sum the gradients over the ranks during the backward pass, bucket
    /// by bucket as they are ready (c10d's Reducer, the engine of PyTorch's DDP), rather
    /// than after it. Default true.
    #[serde(default = "default_true")]
    pub dist_overlap: bool,
}

/// The longest wait for the other ranks lethe accepts, seconds (a week): longer ones
/// would overflow c10d's clock arithmetic.
pub const MAX_DIST_TIMEOUT_S: u64 = 7 * 24 * 3600;

fn default_true() -> bool {
    true
}

fn default_dist_timeout() -> u64 {
    600
}

fn default_lora_alpha() -> f64 {
    16.0
}

/// Optimisers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Adam (AdamW with `weight_decay`).
    #[default]
    Adam,
    /// RMSProp: `v = beta2 v + (1 - beta2) g^2`, `p -= lr g / (sqrt(v) + eps)`.
    RmsProp,
}

/// The arithmetic of training (`train.precision`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Float32 throughout.
    #[default]
    F32,
    /// Bfloat16 autocast over float32 weights.
    Bf16,
    /// Float16 autocast over float32 weights, with a dynamic loss scale
    /// ([`crate::loss_scale`]).
    F16,
}

impl Precision {
    /// Every precision, in the order `lethe bench --precision` lists them.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::F16];

    /// The name the config and the command line use: `f32`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// The element type its arithmetic runs in: float32, bfloat16 or float16.
    pub fn kind(self) -> tch::Kind {
        match self {
            Precision::F32 => tch::Kind::Float,
            Precision::Bf16 => tch::Kind::BFloat16,
            Precision::F16 => tch::Kind::Half,
        }
    }

    /// The precision whose arithmetic runs in `kind`, if one does.
    pub fn of_kind(kind: tch::Kind) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.kind() == kind)
    }

    /// The precision named `text`; the error lists the names.
    pub fn parse(text: &str) -> std::result::Result<Precision, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == text.trim())
            .ok_or_else(|| format!("`{text}` is not a precision: f32, bf16 or f16"))
    }
}

/// The collectives of a data-parallel run (`train.dist_backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DistBackend {
    /// NCCL for GPU ranks, Gloo for CPU ranks.
    #[default]
    Auto,
    /// c10d's Gloo: CPU tensors (a GPU rank's gradients cross host memory).
    Gloo,
    /// c10d's NCCL: one GPU a rank.
    Nccl,
}

/// Learning-rate schedule after warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Cosine decay to `lr * min_lr_ratio` at the last step.
    Cosine,
    /// Constant `lr`.
    Constant,
    /// Linear decay to `lr * min_lr_ratio` at the last step (the schedule of
    /// `transformers`' Trainer, with which the ∞-former paper fine-tunes GPT-2).
    Linear,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            batch: 16,
            block: 32,
            steps: 1500,
            lr: 1e-3,
            memory_lr: 0.0,
            freeze_base: false,
            lora_rank: 0,
            lora_alpha: default_lora_alpha(),
            init_from: None,
            warmup: 100,
            schedule: Schedule::Cosine,
            min_lr_ratio: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            optimizer: Optimizer::Adam,
            weight_decay: 0.0,
            grad_clip: 1.0,
            accum: 1,
            eval_every: 250,
            eval_tokens: 16384,
            checkpoint_every: 500,
            log_every: 50,
            device: "cpu".to_string(),
            threads: 0,
            tf32: false,
            precision: Precision::F32,
            dist_timeout: default_dist_timeout(),
            dist_backend: DistBackend::Auto,
            dist_overlap: true,
        }
    }
}

impl TrainConfig {
    /// The factor on the learning rate of the memory mechanism's parameters:
    /// `memory_lr / lr`, or 1.
    pub fn memory_lr_scale(&self) -> f64 {
        if self.memory_lr > 0.0 {
            self.memory_lr / self.lr
        } else {
            1.0
        }
    }

    /// Checks every field for impossible values; the error names the field.
    pub fn validate(&self) -> Result<()> {
        positive("train.batch", self.batch)?;
        positive("train.block", self.block)?;
        positive("train.steps", self.steps)?;
        positive("train.accum", self.accum)?;
        positive("train.log_every", self.log_every)?;
        positive("train.dist_timeout", self.dist_timeout as usize)?;
        if self.dist_timeout > MAX_DIST_TIMEOUT_S {
            return Err(LetheError::config(
                "train.dist_timeout",
                self.dist_timeout,
                format!("must be at most {} s (a week)", MAX_DIST_TIMEOUT_S),
            ));
        }
        if !self.batch.is_multiple_of(self.accum) {
            return Err(LetheError::config(
                "train.accum",
                self.accum,
                format!("must divide train.batch = {}", self.batch),
            ));
        }
        positive_number("train.lr", self.lr)?;
        for (field, v) in [("train.beta1", self.beta1), ("train.beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(LetheError::config(field, v, "must be in [0, 1)"));
            }
        }
        // Adam divides by sqrt(v) + eps: with eps 0 a parameter whose gradient is 0
        // becomes 0 / 0, and the loss NaN.
        positive_number("train.eps", self.eps)?;
        // The decay ends at lr * min_lr_ratio: above 1 it would climb, not decay.
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(LetheError::config(
                "train.min_lr_ratio",
                self.min_lr_ratio,
                "must be in [0, 1]: the learning rate decays to lr * min_lr_ratio",
            ));
        }
        for (field, v) in [
            ("train.weight_decay", self.weight_decay),
            ("train.grad_clip", self.grad_clip),
            ("train.memory_lr", self.memory_lr),
            ("train.lora_alpha", self.lora_alpha),
        ] {
            non_negative(field, v)?;
        }
        if self.lora_rank > 0 && !self.freeze_base {
            return Err(LetheError::config(
                "train.lora_rank",
                self.lora_rank,
                "adapters train in place of the pretrained weights: set train.freeze_base = true",
            ));
        }
        crate::device::parse(&self.device).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::Precision;

    /// Each precision's element type names it back, and a type none computes in names none.
    #[test]
    fn a_precision_is_known_by_its_element_type() {
        for p in Precision::ALL {
            assert_eq!(Precision::of_kind(p.kind()), Some(p));
            assert_eq!(Precision::parse(p.name()), Ok(p));
        }
        assert_eq!(Precision::of_kind(tch::Kind::Double), None);
        assert_eq!(Precision::of_kind(tch::Kind::BFloat16).map(Precision::name), Some("bf16"));
    }
}
