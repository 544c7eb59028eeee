//! A Llama-family model in the Hugging Face layout and in lethe's backbone
//! (`model.arch = "llama"`), both ways: [`model_config`] and [`read_parameters`] read a
//! folder for fine-tuning (`--init-from`), [`write_folder`] writes a lethe run as a folder
//! that `transformers`, `lethe generate --init-from` and `lethe eval --init-from` read.
//!
//! The names: `model.embed_tokens` is `embed`; block `i`'s `self_attn.{q,k,v,o}_proj` are
//! `layers.i.attn.{q,k,v,o}`, its `self_attn.{q,k}_norm` are `layers.i.attn.{q,k}_norm`,
//! `input_layernorm` and `post_attention_layernorm` are `layers.i.norm1` and `norm2`,
//! `mlp.gate_proj`, `up_proj` and `down_proj` are `layers.i.ff_gate`, `ff1` and `ff2`;
//! `model.norm` is `final_norm`, `lm_head` is `head` (absent when tied). Every map is
//! `(out, in)` in both.

use std::path::Path;

use serde_json::{json, Value};
use tch::Tensor;

use super::{read_weights, LlamaConfig};
use lethe_core::config::{Arch, LlamaShape, ModelConfig};
use lethe_core::error::{LetheError, Result};

/// The `[model]` section of the folder's model, with `dropout`; what lethe's trainable
/// Llama does not have (a bias on the output or MLP maps, Mistral's sliding window) is
/// refused by name.
pub fn model_config(cfg: &LlamaConfig, dropout: f64) -> std::result::Result<ModelConfig, String> {
    if cfg.o_bias || cfg.mlp_bias {
        return Err("attention_bias or mlp_bias: biases on the output or MLP maps are not in lethe's trainable Llama (generate and eval read them)".into());
    }
    if let Some(w) = cfg.sliding_window {
        return Err(format!(
            "sliding_window = {w}: lethe's trainable Llama sees its whole window (generate and eval keep Mistral's)"
        ));
    }
    let natural = cfg.hidden_size / cfg.heads;
    let scaling = cfg.rope_scaling.clone();
    let defaults = LlamaShape::default();
    let llama = LlamaShape {
        kv_heads: cfg.kv_heads as usize,
        head_dim: if cfg.head_dim == natural { 0 } else { cfg.head_dim as usize },
        rope_theta: cfg.rope_theta,
        rope_factor: scaling.as_ref().map_or(0.0, |s| s.factor),
        rope_low_freq_factor: scaling.as_ref().map_or(defaults.rope_low_freq_factor, |s| s.low_freq_factor),
        rope_high_freq_factor: scaling.as_ref().map_or(defaults.rope_high_freq_factor, |s| s.high_freq_factor),
        rope_original_positions: scaling
            .as_ref()
            .map_or(defaults.rope_original_positions, |s| s.original_max_position_embeddings as usize),
        qkv_bias: cfg.qkv_bias,
        qk_norm: cfg.qk_norm,
        tie_embeddings: cfg.tie_word_embeddings,
    };
    Ok(ModelConfig {
        vocab: cfg.vocab_size as usize,
        layers: cfg.layers as usize,
        d_model: cfg.hidden_size as usize,
        heads: cfg.heads as usize,
        d_ffn: cfg.intermediate_size as usize,
        dropout,
        pre_norm: true,
        arch: Arch::Llama,
        llama,
        positions: cfg.max_positions as usize,
        norm_eps: cfg.rms_norm_eps,
        ..ModelConfig::default()
    })
}

/// `(lethe's name, the folder's name)` of every parameter of `cfg`'s model.
pub fn names(cfg: &ModelConfig) -> Vec<(String, String)> {
    let mut out = vec![("embed.weight".to_string(), "model.embed_tokens.weight".to_string())];
    for i in 0..cfg.layers {
        let (l, h) = (format!("layers.{i}"), format!("model.layers.{i}"));
        let mut pair = |ours: &str, theirs: &str| out.push((format!("{l}.{ours}"), format!("{h}.{theirs}")));
        for p in ["q", "k", "v", "o"] {
            pair(&format!("attn.{p}.weight"), &format!("self_attn.{p}_proj.weight"));
            if cfg.llama.qkv_bias && p != "o" {
                pair(&format!("attn.{p}.bias"), &format!("self_attn.{p}_proj.bias"));
            }
        }
        if cfg.llama.qk_norm {
            pair("attn.q_norm.weight", "self_attn.q_norm.weight");
            pair("attn.k_norm.weight", "self_attn.k_norm.weight");
        }
        pair("norm1.weight", "input_layernorm.weight");
        pair("norm2.weight", "post_attention_layernorm.weight");
        for (ours, theirs) in [("ff_gate", "gate_proj"), ("ff1", "up_proj"), ("ff2", "down_proj")] {
            pair(&format!("{ours}.weight"), &format!("mlp.{theirs}.weight"));
        }
    }
    out.push(("final_norm.weight".to_string(), "model.norm.weight".to_string()));
    if !cfg.llama.tie_embeddings {
        out.push(("head.weight".to_string(), "lm_head.weight".to_string()));
    }
    out
}

/// The folder's parameters under lethe's names, float32, each checked against the shape
/// `cfg` gives (by [`super::Weights`]); a tensor left over is refused by name.
pub fn read_parameters(dir: &Path, cfg: &LlamaConfig) -> Result<Vec<(String, Tensor)>> {
    let model = model_config(cfg, 0.0).map_err(|why| LetheError::checkpoint(dir.join("config.json"), why))?;
    let mut weights = read_weights(dir)?;
    let (d, dh, f, v) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size);
    let (q, kv) = (cfg.heads * dh, cfg.kv_heads * dh);
    let mut out = Vec::new();
    for (ours, theirs) in names(&model) {
        let shape: Vec<i64> = match ours.rsplit('.').nth(1).unwrap_or("") {
            "embed" | "head" => vec![v, d],
            "q" if ours.ends_with("bias") => vec![q],
            "k" | "v" if ours.ends_with("bias") => vec![kv],
            "q" => vec![q, d],
            "k" | "v" => vec![kv, d],
            "o" => vec![d, q],
            "q_norm" | "k_norm" => vec![dh],
            "ff_gate" | "ff1" => vec![f, d],
            "ff2" => vec![d, f],
            _ => vec![d], // the norms
        };
        out.push((ours, weights.take(&theirs, &shape)?));
    }
    if cfg.tie_word_embeddings {
        weights.skip("lm_head.weight");
    }
    weights.finish()?;
    Ok(out)
}

/// `config.json` of a lethe Llama `cfg`: the family its settings make (`qwen3` with
/// `qk_norm`, `qwen2` with `qkv_bias`, else `llama`).
pub fn config_json(cfg: &ModelConfig) -> Value {
    let l = &cfg.llama;
    let (family, architecture) = match (l.qk_norm, l.qkv_bias) {
        (true, false) => ("qwen3", "Qwen3ForCausalLM"),
        (false, true) => ("qwen2", "Qwen2ForCausalLM"),
        _ => ("llama", "LlamaForCausalLM"),
    };
    let rope_scaling = (l.rope_factor > 0.0).then(|| {
        json!({
            "rope_type": "llama3", "factor": l.rope_factor, "low_freq_factor": l.rope_low_freq_factor,
            "high_freq_factor": l.rope_high_freq_factor, "original_max_position_embeddings": l.rope_original_positions
        })
    });
    json!({
        "architectures": [architecture],
        "model_type": family,
        "vocab_size": cfg.vocab,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ffn,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads(),
        "head_dim": cfg.head_dim(),
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": l.rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": cfg.positions,
        "tie_word_embeddings": l.tie_embeddings,
        "attention_bias": l.qkv_bias && family != "qwen2",
        "torch_dtype": "float32",
    })
}

/// Writes the parameters `params` (by lethe's names) of a lethe Llama `cfg` into the new
/// folder `out` as `config.json` and `model.safetensors`, with `tokenizer.json` copied from
/// `tokenizer` when given. The files are written into a sibling folder first and it is
/// renamed at the end, so `out` is complete or absent. Refuses an `out` that exists, a
/// model that is not a Llama, a Llama that both keys' norms and biases (no family has
/// both), a missing parameter.
pub fn write_folder(
    cfg: &ModelConfig,
    params: &std::collections::HashMap<String, Tensor>,
    tokenizer: Option<&Path>,
    out: &Path,
) -> Result<()> {
    if cfg.arch != Arch::Llama {
        return Err(LetheError::Invalid(format!(
            "model.arch = \"{}\": only a Llama-family model (model.arch = \"llama\") is written as a Hugging Face folder",
            cfg.arch.name()
        )));
    }
    if cfg.llama.qk_norm && cfg.llama.qkv_bias {
        return Err(LetheError::Invalid("model.llama.qk_norm and qkv_bias together: no Llama family has both".into()));
    }
    if out.exists() {
        return Err(LetheError::Invalid("exists already: give a new folder".into()));
    }
    let mut tensors = Vec::new();
    for (ours, theirs) in names(cfg) {
        let t = params.get(&ours).ok_or_else(|| LetheError::Invalid(format!("the run has no parameter `{ours}`")))?;
        tensors.push((theirs, t.to_kind(tch::Kind::Float).to_device(tch::Device::Cpu).contiguous()));
    }
    // A folder of this writer's own beside `out` (two exports to one folder at once each
    // write their own; the first renamed wins, the second is refused).
    let staging = lethe_core::output::temporary(out);
    let io = |e: std::io::Error| LetheError::checkpoint(&staging, e.to_string());
    std::fs::create_dir_all(&staging).map_err(io)?;
    let written = (|| -> Result<()> {
        let text = serde_json::to_string_pretty(&config_json(cfg)).map_err(|e| LetheError::Invalid(e.to_string()))?;
        std::fs::write(staging.join("config.json"), text + "\n").map_err(io)?;
        let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let file = staging.join("model.safetensors");
        Tensor::write_safetensors(&named, &file).map_err(|e| LetheError::checkpoint(&file, e.to_string()))?;
        if let Some(dir) = tokenizer {
            let from = dir.join("tokenizer.json");
            std::fs::copy(&from, staging.join("tokenizer.json"))
                .map_err(|e| LetheError::checkpoint(&from, e.to_string()))?;
        }
        std::fs::rename(&staging, out).map_err(|e| LetheError::checkpoint(out, e.to_string()))
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    written
}
