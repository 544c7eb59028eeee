//! `[model]`: the decoder-only, block-recurrent transformer every mechanism shares, in
//! one of three architectures: the papers' own (`lethe`), GPT-2's (`gpt2`) or the Llama
//! family's (`llama`, with its own settings in `[model.llama]`).

use serde::{Deserialize, Serialize};

use super::check::positive;
use crate::error::{LetheError, Result};

/// The decoder-only, block-recurrent transformer (shared by every memory mechanism).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Vocabulary size in tokens. Byte streams use 256. Default 256.
    pub vocab: usize,
    /// Number of transformer layers. Default 2.
    pub layers: usize,
    /// Hidden size (model width). Must be divisible by `heads`. Default 64.
    pub d_model: usize,
    /// Attention heads per layer. Default 4.
    pub heads: usize,
    /// Inner size of the feed-forward sublayer. Default 256.
    pub d_ffn: usize,
    /// Dropout probability on attention weights and sublayer outputs, in [0, 1). Default 0.
    pub dropout: f64,
    /// Pre-norm (LayerNorm before each sublayer, plus a final one) when true; post-norm
    /// (LayerNorm after each residual, as in the adaptive-span code) when false. Default true.
    pub pre_norm: bool,
    /// The architecture of the layers: `lethe` (the papers' backbone: learned relative
    /// positions `key_pe`, attention without biases, ReLU, a separate output head) or
    /// `gpt2` (GPT-2 exactly: learned absolute positions that restart at every block,
    /// biases, the tanh GELU, pre-norm, the output tied to the token embedding; what
    /// `--init-from` a Hugging Face GPT-2 folder sets) or `llama` (the Llama family:
    /// RMSNorm, rotary positions, grouped-query attention, the SiLU-gated MLP; what
    /// `--init-from` a Llama, Mistral, Qwen2/3 or SmolLM2 folder sets; `[model.llama]`).
    /// Default `lethe`.
    #[serde(default)]
    pub arch: Arch,
    /// The Llama family's settings, for `model.arch = "llama"`.
    #[serde(default)]
    pub llama: LlamaShape,
    /// For `gpt2`: rows of the absolute position embedding (GPT-2's `n_positions`), the
    /// longest block. Default 1024.
    #[serde(default = "default_positions")]
    pub positions: usize,
    /// LayerNorm epsilon. Default 1e-5.
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    /// Adaptive input and softmax (Transformer-XL's word-level models): the ids where
    /// the vocabulary's frequency clusters start, ids sorted most frequent first (as
    /// `lethe tokenizer words` numbers them), e.g. `[20000, 40000, 200000]` for
    /// Wikitext-103. The head cluster holds the ids below the first cut-off. Empty: one
    /// plain embedding and softmax. Default empty.
    #[serde(default)]
    pub cutoffs: Vec<usize>,
    /// With `cutoffs`: cluster `i` embeds in `d_model / div_val^i` dimensions, projected
    /// to `d_model` (Transformer-XL's `div_val`; 1 keeps every cluster at `d_model`).
    /// Default 1.
    #[serde(default = "default_div_val")]
    pub div_val: usize,
    /// How the `lethe` backbone's parameters start: `kaiming` (tch's default for linear
    /// layers, Kaiming-uniform with the ReLU gain, weights in `±sqrt(6 / fan_in)`; the
    /// position embeddings `key_pe` from N(0, 1 / d_head)) or `official` (as the
    /// official Expire-Span and adaptive-span code: PyTorch's `nn.Linear` default,
    /// weights and biases in `±1 / sqrt(fan_in)`, the attention output and the second
    /// feed-forward projection divided by `sqrt(2 layers)` under pre-norm, `key_pe` from
    /// N(0, 1)). Embeddings start from N(0, 1) either way; GPT-2 keeps its own. Default
    /// `kaiming`.
    #[serde(default)]
    pub init: Init,
}

/// How the backbone's parameters start (`model.init`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Init {
    /// tch's defaults: Kaiming-uniform linear weights with the ReLU gain.
    #[default]
    Kaiming,
    /// The official Expire-Span code's (facebookresearch/transformer-sequential).
    Official,
}

fn default_div_val() -> usize {
    1
}

/// The layers' architecture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// The papers' backbone (Expire-Span section 3, the adaptive-span code).
    #[default]
    Lethe,
    /// GPT-2 (Radford et al., 2019) as Hugging Face `transformers` defines it.
    Gpt2,
    /// The Llama family (Touvron et al., 2023) as `transformers` defines it.
    Llama,
}

/// `[model.llama]`: what a Llama-family decoder sets beyond the shared sizes (`d_model`,
/// `heads`, `d_ffn`, `norm_eps` as RMSNorm's epsilon).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlamaShape {
    /// Key and value heads, shared by groups of query heads (grouped-query attention);
    /// 0: one per query head. Default 0.
    pub kv_heads: usize,
    /// Width of one head; 0: `d_model / heads`. Default 0.
    pub head_dim: usize,
    /// The base `theta` of the rotary positions' frequencies `theta^(-2i / head_dim)`.
    /// Default 10000.
    pub rope_theta: f64,
    /// Llama 3's scaling of the low rotary frequencies (`rope_scaling` of type `llama3`):
    /// its `factor`; 0: no scaling. Default 0.
    pub rope_factor: f64,
    /// With `rope_factor`: Llama 3's `low_freq_factor`. Default 1.
    pub rope_low_freq_factor: f64,
    /// With `rope_factor`: Llama 3's `high_freq_factor`. Default 4.
    pub rope_high_freq_factor: f64,
    /// With `rope_factor`: Llama 3's `original_max_position_embeddings`. Default 8192.
    pub rope_original_positions: usize,
    /// Biases on the query, key and value maps (Qwen2). Default false.
    pub qkv_bias: bool,
    /// RMSNorm on each head's query and key before the rotation (Qwen3). Default false.
    pub qk_norm: bool,
    /// The output map is the token embedding (SmolLM2, Llama 3.2 1B). Default false.
    pub tie_embeddings: bool,
}

impl Default for LlamaShape {
    fn default() -> Self {
        LlamaShape {
            kv_heads: 0,
            head_dim: 0,
            rope_theta: 10000.0,
            rope_factor: 0.0,
            rope_low_freq_factor: 1.0,
            rope_high_freq_factor: 4.0,
            rope_original_positions: 8192,
            qkv_bias: false,
            qk_norm: false,
            tie_embeddings: false,
        }
    }
}

impl ModelConfig {
    /// Key and value heads (`model.llama.kv_heads`; one per query head elsewhere).
    pub fn kv_heads(&self) -> usize {
        match (self.arch, self.llama.kv_heads) {
            (Arch::Llama, k) if k > 0 => k,
            _ => self.heads,
        }
    }

    /// Width of one head (`model.llama.head_dim`; `d_model / heads` elsewhere).
    pub fn head_dim(&self) -> usize {
        match (self.arch, self.llama.head_dim) {
            (Arch::Llama, h) if h > 0 => h,
            _ => self.d_model / self.heads.max(1),
        }
    }
}

impl Arch {
    /// The name in configs and messages.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Lethe => "lethe",
            Arch::Gpt2 => "gpt2",
            Arch::Llama => "llama",
        }
    }
}

fn default_positions() -> usize {
    1024
}

fn default_norm_eps() -> f64 {
    1e-5
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            vocab: 256,
            layers: 2,
            d_model: 64,
            heads: 4,
            d_ffn: 256,
            dropout: 0.0,
            pre_norm: true,
            arch: Arch::Lethe,
            llama: LlamaShape::default(),
            positions: default_positions(),
            norm_eps: default_norm_eps(),
            cutoffs: vec![],
            div_val: default_div_val(),
            init: Init::default(),
        }
    }
}

impl ModelConfig {
    /// Checks every field for impossible values; the error names the field. `bytes`:
    /// the data are bytes (no tokenizer), so the vocabulary must hold 256 ids; a
    /// tokenizer's vocabulary is checked when it is read.
    pub fn validate(&self, bytes: bool) -> Result<()> {
        if bytes && self.vocab < 256 {
            return Err(LetheError::config(
                "model.vocab",
                self.vocab,
                "must be at least 256: the data are bytes (set data.tokenizer for a smaller vocabulary)",
            ));
        }
        positive("model.vocab", self.vocab)?;
        self.validate_cutoffs()?;
        self.validate_layers()
    }

    /// The adaptive input and softmax's cut-offs: increasing, inside the vocabulary, and
    /// every cluster at least one dimension wide.
    pub fn validate_cutoffs(&self) -> Result<()> {
        if self.cutoffs.is_empty() {
            return Ok(());
        }
        let shown = format!("{:?}", self.cutoffs);
        if self.arch != Arch::Lethe {
            return Err(LetheError::config(
                "model.cutoffs",
                shown,
                format!(
                    "model.arch = \"{}\" has one softmax; adaptive clusters are for model.arch = \"lethe\"",
                    self.arch.name()
                ),
            ));
        }
        let mut previous = 0;
        for &c in &self.cutoffs {
            if c <= previous || c >= self.vocab {
                return Err(LetheError::config(
                    "model.cutoffs",
                    shown,
                    format!("must increase from above 0 to below model.vocab = {}", self.vocab),
                ));
            }
            previous = c;
        }
        positive("model.div_val", self.div_val)?;
        let narrowest = (self.div_val as f64).powi(self.cutoffs.len() as i32);
        if (self.d_model as f64) < narrowest {
            return Err(LetheError::config(
                "model.div_val",
                self.div_val,
                format!("the last cluster would embed in d_model / div_val^{} < 1 dimension", self.cutoffs.len()),
            ));
        }
        Ok(())
    }

    /// Everything but the vocabulary.
    pub fn validate_layers(&self) -> Result<()> {
        positive("model.layers", self.layers)?;
        positive("model.heads", self.heads)?;
        positive("model.d_model", self.d_model)?;
        positive("model.d_ffn", self.d_ffn)?;
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(LetheError::config(
                "model.d_model",
                self.d_model,
                format!("must be divisible by model.heads = {}", self.heads),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(LetheError::config("model.dropout", self.dropout, "must be in [0, 1)"));
        }
        positive("model.positions", self.positions)?;
        if !(self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            return Err(LetheError::config("model.norm_eps", self.norm_eps, "must be in (0, 1)"));
        }
        if self.arch != Arch::Lethe && !self.pre_norm {
            let why = format!("model.arch = \"{}\" is pre-norm", self.arch.name());
            return Err(LetheError::config("model.pre_norm", false, why));
        }
        if self.arch == Arch::Llama {
            self.validate_llama()?;
        }
        Ok(())
    }

    /// `[model.llama]`: the query heads in whole groups per key-value head, an even head
    /// width (the rotation turns pairs), a positive rotary base.
    fn validate_llama(&self) -> Result<()> {
        let l = &self.llama;
        if !self.heads.is_multiple_of(self.kv_heads()) {
            let why = format!("must divide model.heads = {} (whole groups of query heads)", self.heads);
            return Err(LetheError::config("model.llama.kv_heads", l.kv_heads, why));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(LetheError::config("model.llama.head_dim", self.head_dim(), "must be even (RoPE turns pairs)"));
        }
        if !(l.rope_theta > 1.0 && l.rope_theta.is_finite()) {
            return Err(LetheError::config("model.llama.rope_theta", l.rope_theta, "must be a finite number above 1"));
        }
        if !(l.rope_factor >= 0.0 && l.rope_factor.is_finite()) {
            return Err(LetheError::config("model.llama.rope_factor", l.rope_factor, "must be 0 (none) or positive"));
        }
        if l.rope_factor > 0.0 && !(l.rope_high_freq_factor > l.rope_low_freq_factor && l.rope_low_freq_factor > 0.0) {
            let why = "with model.llama.rope_factor, must be above model.llama.rope_low_freq_factor, itself above 0";
            return Err(LetheError::config("model.llama.rope_high_freq_factor", l.rope_high_freq_factor, why));
        }
        Ok(())
    }
}
