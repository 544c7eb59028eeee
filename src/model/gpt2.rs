//! GPT-2 (Radford et al., 2019) exactly as Hugging Face `transformers` defines it, read
//! from a local folder in its layout (`config.json`, `model.safetensors`): the first step
//! of the ∞-former paper's language-modelling experiments (section 4.2, C.2), which
//! fine-tune a pretrained GPT-2 with a long-term memory.
//!
//! The architecture: token and learned absolute position embeddings; `n_layer` pre-norm
//! blocks `h = h + Attn(LN_1(h))`, `h = h + MLP(LN_2(h))` with causal multi-head
//! attention scaled by `1/sqrt(d_head)` and an MLP of width `n_inner` (default `4 d`)
//! through the tanh approximation of GELU (`gelu_new`); a final LayerNorm; the output
//! projection tied to the token embedding (unless `tie_word_embeddings` is false).
//! `transformers` stores the linear maps as `Conv1D`, weight `(in, out)`, so a layer is
//! `x W + b`, not `x W^T + b`. Nothing is downloaded: the user fetches the weights.

use std::path::Path;

use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use crate::error::{LetheError, Result};

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
        let text = std::fs::read_to_string(path).map_err(|e| LetheError::io(path, e))?;
        let cfg: Gpt2Config = serde_json::from_str(&text).map_err(|e| LetheError::Invalid(format!("`{}`: not a GPT-2 config: {e}", path.display())))?;
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
        if !["gelu_new", "gelu_pytorch_tanh", "gelu", "relu"].contains(&self.activation_function.as_str()) {
            return bad(format!("activation_function `{}` is not one GPT-2 uses", self.activation_function));
        }
        Ok(())
    }

    /// The MLP width.
    pub fn inner(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }
}

/// One block's parameters, by their `transformers` names.
struct Block {
    ln_1: (Tensor, Tensor),
    c_attn: (Tensor, Tensor),
    attn_proj: (Tensor, Tensor),
    ln_2: (Tensor, Tensor),
    c_fc: (Tensor, Tensor),
    mlp_proj: (Tensor, Tensor),
}

/// A GPT-2 language model with its weights.
pub struct Gpt2 {
    /// The model's `config.json`.
    pub config: Gpt2Config,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: (Tensor, Tensor),
    lm_head: Tensor,
}

impl Gpt2 {
    /// Reads `dir/config.json` and `dir/model.safetensors` onto `device`. Every tensor
    /// the architecture needs must be there with its shape; the causal-mask buffers some
    /// files carry (`attn.bias`, `attn.masked_bias`) are not needed.
    pub fn load(dir: &Path, device: Device) -> Result<Gpt2> {
        let config = Gpt2Config::from_file(&dir.join("config.json"))?;
        let path = dir.join("model.safetensors");
        let raw = Tensor::read_safetensors(&path).map_err(|e| LetheError::checkpoint(&path, format!("cannot read: {e}")))?;
        let mut weights: std::collections::HashMap<String, Tensor> =
            raw.into_iter().map(|(name, t)| (name.strip_prefix("transformer.").unwrap_or(&name).to_string(), t)).collect();
        let (d, inner, v) = (config.n_embd as i64, config.inner() as i64, config.vocab_size as i64);
        let mut take = |name: &str, shape: &[i64]| -> Result<Tensor> {
            let t = weights.remove(name).ok_or_else(|| LetheError::checkpoint(&path, format!("has no tensor `{name}`")))?;
            if t.size() != shape {
                return Err(LetheError::checkpoint(&path, format!("tensor `{name}` has shape {:?}, the config says {shape:?}", t.size())));
            }
            Ok(t.to_kind(Kind::Float).to_device(device))
        };
        let wte = take("wte.weight", &[v, d])?;
        let wpe = take("wpe.weight", &[config.n_positions as i64, d])?;
        let mut blocks = vec![];
        for i in 0..config.n_layer {
            let mut pair = |name: &str, w: &[i64], b: i64| -> Result<(Tensor, Tensor)> {
                Ok((take(&format!("h.{i}.{name}.weight"), w)?, take(&format!("h.{i}.{name}.bias"), &[b])?))
            };
            blocks.push(Block {
                ln_1: pair("ln_1", &[d], d)?,
                c_attn: pair("attn.c_attn", &[d, 3 * d], 3 * d)?,
                attn_proj: pair("attn.c_proj", &[d, d], d)?,
                ln_2: pair("ln_2", &[d], d)?,
                c_fc: pair("mlp.c_fc", &[d, inner], inner)?,
                mlp_proj: pair("mlp.c_proj", &[inner, d], d)?,
            });
        }
        let ln_f = (take("ln_f.weight", &[d])?, take("ln_f.bias", &[d])?);
        let lm_head = if config.tie_word_embeddings { wte.shallow_clone() } else { take("lm_head.weight", &[v, d])? };
        // What may be left: the causal-mask buffers, and a tied head saved twice.
        let needless = |name: &str| name.ends_with("attn.bias") || name.ends_with("attn.masked_bias") || name == "lm_head.weight";
        if let Some(name) = weights.keys().filter(|n| !needless(n)).min() {
            return Err(LetheError::checkpoint(&path, format!("holds `{name}`, which GPT-2 does not have: is it another architecture?")));
        }
        Ok(Gpt2 { config, wte, wpe, blocks, ln_f, lm_head })
    }

    /// Logits `(b, t, vocab)` for token ids `(b, t)` (int64, each below `vocab_size`),
    /// `t` at most `n_positions`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.size().get(1).copied().unwrap_or(0);
        if ids.dim() != 2 || t == 0 || t > self.config.n_positions as i64 {
            return Err(LetheError::Invalid(format!("GPT-2 reads ids (batch, 1 to {} positions), not a tensor of shape {:?}", self.config.n_positions, ids.size())));
        }
        let v = self.config.vocab_size as i64;
        if ids.kind() != Kind::Int64 || ids.numel() == 0 || ids.min().int64_value(&[]) < 0 || ids.max().int64_value(&[]) >= v {
            return Err(LetheError::Invalid(format!("GPT-2's token ids must be int64 in 0..{v}")));
        }
        let positions = Tensor::arange(t, (Kind::Int64, ids.device()));
        let mut h = self.wte.index_select(0, &ids.flatten(0, -1)).view([ids.size()[0], t, -1]) + self.wpe.index_select(0, &positions); // (b, t, d)
        for block in &self.blocks {
            h = &h + self.attention(block, &self.norm(&h, &block.ln_1));
            h = &h + self.mlp(block, &self.norm(&h, &block.ln_2));
        }
        Ok(self.norm(&h, &self.ln_f).matmul(&self.lm_head.tr())) // (b, t, vocab)
    }

    fn norm(&self, x: &Tensor, (w, b): &(Tensor, Tensor)) -> Tensor {
        x.layer_norm([self.config.n_embd as i64], Some(w), Some(b), self.config.layer_norm_epsilon, false)
    }

    /// Causal multi-head self-attention of one block on the normalised `x` `(b, t, d)`.
    fn attention(&self, block: &Block, x: &Tensor) -> Tensor {
        let (b, t, d) = x.size3().unwrap_or((0, 0, 0));
        let heads = self.config.n_head as i64;
        let dh = d / heads;
        let qkv = conv1d(x, &block.c_attn); // (b, t, 3d)
        let split = |i: i64| qkv.narrow(-1, i * d, d).view([b, t, heads, dh]).transpose(1, 2); // (b, heads, t, dh)
        let (q, k, v) = (split(0), split(1), split(2));
        let scores = q.matmul(&k.transpose(-2, -1)) / (dh as f64).sqrt(); // (b, heads, t, t)
        let future = Tensor::ones([t, t], (Kind::Bool, x.device())).triu(1);
        let probs = scores.masked_fill(&future, f64::NEG_INFINITY).softmax(-1, Kind::Float);
        let context = probs.matmul(&v).transpose(1, 2).contiguous().view([b, t, d]); // (b, t, d)
        conv1d(&context, &block.attn_proj)
    }

    fn mlp(&self, block: &Block, x: &Tensor) -> Tensor {
        let a = conv1d(x, &block.c_fc);
        let a = match self.config.activation_function.as_str() {
            "gelu" => a.gelu("none"),
            "relu" => a.relu(),
            _ => a.gelu("tanh"), // gelu_new, gelu_pytorch_tanh
        };
        conv1d(&a, &block.mlp_proj)
    }
}

/// `transformers`' `Conv1D`: `x W + b` with `W` `(in, out)`.
fn conv1d(x: &Tensor, (w, b): &(Tensor, Tensor)) -> Tensor {
    x.matmul(w) + b
}
