//! A pretrained GPT-2 (Radford et al., 2019) read from a local folder in the Hugging Face
//! layout (`config.json`, `model.safetensors`) into lethe's backbone with
//! `model.arch = "gpt2"` ([`super::backbone`]): the first step of the ∞-former paper's
//! language-modelling experiments (section 4.2, C.2), which fine-tune a pretrained GPT-2
//! with a long-term memory. Nothing is downloaded: the user fetches the weights.
//!
//! The architecture: token and learned absolute position embeddings; `n_layer` pre-norm
//! blocks `h = h + Attn(LN_1(h))`, `h = h + MLP(LN_2(h))` with causal multi-head
//! attention scaled by `1/sqrt(d_head)` and an MLP of width `n_inner` (default `4 d`)
//! through the tanh approximation of GELU (`gelu_new`); a final LayerNorm; the output
//! projection tied to the token embedding. `transformers` stores the linear maps as
//! `Conv1D`, weight `(in, out)` (a layer is `x W + b`), and the query, key and value
//! maps as one `c_attn` of width `3d`: they are transposed and split into lethe's
//! `(out, in)` weights of `attn.q`, `attn.k` and `attn.v`.

use std::path::Path;

use serde::Deserialize;
use tch::{Kind, Tensor};

use lethe_core::config::{Arch, ModelConfig};

use lethe_core::error::{LetheError, Result};

/// The fields of `config.json` GPT-2 needs (the others are ignored).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Gpt2Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Longest context (rows of the position embedding).
    pub n_positions: usize,
    /// Width `d`.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Attention heads (`d` must be a multiple).
    pub n_head: usize,
    /// MLP width; `None`: `4 d`.
    #[serde(default)]
    pub n_inner: Option<usize>,
    /// LayerNorm epsilon. Default 1e-5.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// The MLP's activation: `gelu_new` (GPT-2's), `gelu_pytorch_tanh`, `gelu` or `relu`.
    #[serde(default = "default_activation")]
    pub activation_function: String,
    /// Whether the output projection is the token embedding. Default true.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Variants of the attention lethe does not implement (refused when set).
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// See `scale_attn_by_inverse_layer_idx`.
    #[serde(default)]
    pub reorder_and_upcast_attn: bool,
    /// Attention scaled by `1/sqrt(d_head)`. Default true (refused when false).
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
}

fn default_eps() -> f64 {
    1e-5
}

fn default_activation() -> String {
    "gelu_new".to_string()
}

fn default_true() -> bool {
    true
}

impl Gpt2Config {
    /// Reads `config.json`; the error names the file.
    pub fn from_file(path: &Path) -> Result<Gpt2Config> {
        let text = lethe_core::input::read_to_string(path).map_err(|e| LetheError::checkpoint(path, e))?;
        let cfg: Gpt2Config = serde_json::from_str(&text)
            .map_err(|e| LetheError::Invalid(format!("`{}`: not a GPT-2 config: {e}", path.display())))?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| Err(LetheError::Invalid(format!("`{}`: {reason}", path.display())));
        if [self.vocab_size, self.n_positions, self.n_embd, self.n_layer, self.n_head].contains(&0) {
            return bad("vocab_size, n_positions, n_embd, n_layer and n_head must all be at least 1".into());
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return bad(format!("n_embd = {} is not a multiple of n_head = {}", self.n_embd, self.n_head));
        }
        if !["gelu_new", "gelu_pytorch_tanh"].contains(&self.activation_function.as_str()) {
            return bad(format!(
                "activation_function `{}`: lethe's GPT-2 has the tanh GELU (gelu_new) only",
                self.activation_function
            ));
        }
        if !self.tie_word_embeddings {
            return bad("tie_word_embeddings = false: lethe's GPT-2 ties the output to the token embedding".into());
        }
        if self.scale_attn_by_inverse_layer_idx || self.reorder_and_upcast_attn || !self.scale_attn_weights {
            return bad("an attention variant lethe does not implement (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn or scale_attn_weights = false)".into());
        }
        Ok(())
    }

    /// The `[model]` section of this GPT-2, with `dropout`.
    pub fn model_config(&self, dropout: f64) -> ModelConfig {
        ModelConfig {
            vocab: self.vocab_size,
            layers: self.n_layer,
            d_model: self.n_embd,
            heads: self.n_head,
            d_ffn: self.inner(),
            dropout,
            pre_norm: true,
            arch: Arch::Gpt2,
            positions: self.n_positions,
            norm_eps: self.layer_norm_epsilon,
            ..ModelConfig::default()
        }
    }

    /// The MLP width.
    pub fn inner(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }
}

/// Whether `dir` holds a Hugging Face model (`config.json` and `model.safetensors`).
pub fn is_hugging_face_folder(dir: &Path) -> bool {
    dir.join("config.json").is_file() && dir.join("model.safetensors").is_file()
}

/// The weights of `dir/model.safetensors` under lethe's names (see the module
/// documentation), on the CPU in float32, checked against `config`: every tensor GPT-2
/// needs must be there with its shape; the causal-mask buffers some files carry
/// (`attn.bias`, `attn.masked_bias`) and a tied head saved twice are skipped; anything
/// else is refused, naming the tensor.
pub fn read_weights(dir: &Path, config: &Gpt2Config) -> Result<Vec<(String, Tensor)>> {
    let path = dir.join("model.safetensors");
    lethe_core::input::check_file(&path).map_err(|e| LetheError::checkpoint(&path, e))?;
    let raw = Tensor::read_safetensors(&path).map_err(|e| {
        LetheError::checkpoint(
            &path,
            format!("cannot read: {}", lethe_core::checkpoint::safetensors_reason(&e.to_string())),
        )
    })?;
    let mut weights: std::collections::HashMap<String, Tensor> =
        raw.into_iter().map(|(name, t)| (name.strip_prefix("transformer.").unwrap_or(&name).to_string(), t)).collect();
    let (d, inner, v) = (config.n_embd as i64, config.inner() as i64, config.vocab_size as i64);
    let mut take = |name: &str, shape: &[i64]| -> Result<Tensor> {
        let t = weights.remove(name).ok_or_else(|| LetheError::checkpoint(&path, format!("has no tensor `{name}`")))?;
        if t.size() != shape {
            return Err(LetheError::checkpoint(
                &path,
                format!("tensor `{name}` has shape {:?}, the config says {shape:?}", t.size()),
            ));
        }
        Ok(t.to_kind(Kind::Float))
    };
    let mut out = vec![
        ("embed.weight".to_string(), take("wte.weight", &[v, d])?),
        ("positions.weight".to_string(), take("wpe.weight", &[config.n_positions as i64, d])?),
    ];
    for i in 0..config.n_layer {
        let h = format!("h.{i}");
        let l = format!("layers.{i}");
        let c_attn = take(&format!("{h}.attn.c_attn.weight"), &[d, 3 * d])?; // (in, 3 out)
        let c_attn_b = take(&format!("{h}.attn.c_attn.bias"), &[3 * d])?;
        for (j, part) in ["q", "k", "v"].iter().enumerate() {
            let j = j as i64;
            out.push((format!("{l}.attn.{part}.weight"), c_attn.narrow(1, j * d, d).tr().contiguous())); // (out, in)
            out.push((format!("{l}.attn.{part}.bias"), c_attn_b.narrow(0, j * d, d).contiguous()));
        }
        for (theirs, ours, shape) in
            [("attn.c_proj", "attn.o", [d, d]), ("mlp.c_fc", "ff1", [d, inner]), ("mlp.c_proj", "ff2", [inner, d])]
        {
            out.push((format!("{l}.{ours}.weight"), take(&format!("{h}.{theirs}.weight"), &shape)?.tr().contiguous()));
            out.push((format!("{l}.{ours}.bias"), take(&format!("{h}.{theirs}.bias"), &[shape[1]])?));
        }
        for (theirs, ours) in [("ln_1", "norm1"), ("ln_2", "norm2")] {
            out.push((format!("{l}.{ours}.weight"), take(&format!("{h}.{theirs}.weight"), &[d])?));
            out.push((format!("{l}.{ours}.bias"), take(&format!("{h}.{theirs}.bias"), &[d])?));
        }
    }
    out.push(("final_norm.weight".to_string(), take("ln_f.weight", &[d])?));
    out.push(("final_norm.bias".to_string(), take("ln_f.bias", &[d])?));
    // What may be left: the causal-mask buffers, and a tied head saved twice.
    let needless =
        |name: &str| name.ends_with("attn.bias") || name.ends_with("attn.masked_bias") || name == "lm_head.weight";
    if let Some(name) = weights.keys().filter(|n| !needless(n)).min() {
        return Err(LetheError::checkpoint(
            &path,
            format!("holds `{name}`, which GPT-2 does not have: is it another architecture?"),
        ));
    }
    Ok(out)
}
