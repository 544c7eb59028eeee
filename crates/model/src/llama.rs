//! Llama-family decoders read from a local Hugging Face folder: Llama 2 and 3.x (Touvron et
//! al., 2023; RoPE with the `llama3` frequency scaling), Mistral, Qwen2 and 2.5 (biases on
//! the query, key and value maps), Qwen3 (RMSNorm on queries and keys), and SmolLM2 (a
//! Llama). Nothing is downloaded: the user fetches the folder (`config.json`,
//! `model.safetensors` or shards with `model.safetensors.index.json`, `tokenizer.json`).
//!
//! The architecture, as `transformers` computes it:
//! - token embedding; `num_hidden_layers` pre-norm blocks `h = h + Attn(RMSNorm(h))`,
//!   `h = h + MLP(RMSNorm(h))`; a final RMSNorm; the output map (or the embedding, tied).
//! - RMSNorm: `w * x / sqrt(mean(x^2) + eps)`.
//! - Attention with grouped queries: `num_attention_heads` query heads share
//!   `num_key_value_heads` key and value heads; scores `q·k / sqrt(head_dim)`, causal (and
//!   within `sliding_window` where Mistral sets one); Qwen3 normalises each head's query
//!   and key by RMSNorm first.
//! - Rotary positions (Su et al., 2021): each query and key rotated by its absolute
//!   position, the pairs `(i, i + head_dim / 2)` at the frequencies `theta^(-2i /
//!   head_dim)`, with Llama 3's scaling of the low frequencies when `rope_scaling` says
//!   `llama3`. Keys are cached rotated, at the positions they were written.
//! - MLP: `down(silu(gate(x)) * up(x))`.
//!
//! Every field of `config.json` is known: the ones that change the computation are read
//! and checked, the descriptive ones (token ids, dtype, versions) pass, and any other is
//! refused by name.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use lethe_core::config::train::Precision;
use lethe_core::error::{LetheError, Result};

use crate::kv::{Chunk, Held, LayerPolicy, Policy, Positions};

/// Which family a folder holds (`model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `llama`: Llama 2, 3.x, SmolLM2.
    Llama,
    /// `mistral`.
    Mistral,
    /// `qwen2`: Qwen2 and 2.5, biases on the query, key and value maps.
    Qwen2,
    /// `qwen3`: RMSNorm on each head's query and key.
    Qwen3,
}

/// Whether `dir` holds a Hugging Face folder of a Llama-family model (its `config.json`
/// names one of the families), rather than a lethe run or another architecture.
pub fn is_llama_folder(dir: &Path) -> bool {
    let Ok(text) = lethe_core::input::read_to_string(&dir.join("config.json")) else { return false };
    let Ok(value) = serde_json::from_str::<Value>(&text) else { return false };
    matches!(value.get("model_type").and_then(Value::as_str), Some("llama" | "mistral" | "qwen2" | "qwen3"))
}

pub use crate::rope::Llama3Scaling;

/// A Llama-family model's shape and settings, read from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub family: Family,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub layers: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Scaling>,
    pub max_positions: i64,
    pub tie_word_embeddings: bool,
    /// Biases on the query, key and value maps (Qwen2; `attention_bias` elsewhere).
    pub qkv_bias: bool,
    /// A bias on the output map (`attention_bias` of Llama and Qwen3).
    pub o_bias: bool,
    /// Biases on the MLP's maps (`mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm on each head's query and key (Qwen3).
    pub qk_norm: bool,
    /// Keys further than this from a query are not seen (Mistral's `sliding_window`).
    pub sliding_window: Option<i64>,
}

/// Fields that describe a model without changing what it computes.
const DESCRIPTIVE: &[&str] = &[
    "_name_or_path",
    "architectures",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "initializer_range",
    "use_cache",
    "id2label",
    "label2id",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "problem_type",
    "is_encoder_decoder",
    "chunk_size_feed_forward",
    "tokenizer_class",
    "max_window_layers",
    "is_llama_config",
];

/// Fields that change the computation, each read and checked below.
const READ: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "attention_dropout",
    "mlp_bias",
    "pretraining_tp",
    "sliding_window",
    "use_sliding_window",
    "layer_types",
    "rope_interleaved",
];

impl LlamaConfig {
    /// Reads `config.json`; the error names the file and the field.
    pub fn from_file(path: &Path) -> Result<LlamaConfig> {
        let text = lethe_core::input::read_to_string(path).map_err(|e| LetheError::checkpoint(path, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| LetheError::Invalid(format!("`{}`: not a JSON config: {e}", path.display())))?;
        Self::from_json(&value).map_err(|reason| LetheError::Invalid(format!("`{}`: {reason}", path.display())))
    }

    /// The config of a `config.json`'s object, or what is wrong with it.
    pub fn from_json(value: &Value) -> std::result::Result<LlamaConfig, String> {
        let fields = value.as_object().ok_or("not a JSON object")?;
        if let Some(unknown) = fields.keys().find(|k| !DESCRIPTIVE.contains(&k.as_str()) && !READ.contains(&k.as_str()))
        {
            return Err(format!("`{unknown}` is a setting lethe's Llama-family reader does not implement"));
        }
        let family = match fields.get("model_type").and_then(Value::as_str) {
            Some("llama") => Family::Llama,
            Some("mistral") => Family::Mistral,
            Some("qwen2") => Family::Qwen2,
            Some("qwen3") => Family::Qwen3,
            Some(other) => return Err(format!("model_type `{other}`: lethe reads llama, mistral, qwen2 and qwen3")),
            None => return Err("no model_type".into()),
        };
        let int = |name: &str| -> std::result::Result<Option<i64>, String> {
            match fields.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => {
                    v.as_i64().filter(|&n| n > 0).map(Some).ok_or(format!("`{name}` must be a whole number above 0"))
                }
            }
        };
        let need = |name: &str| int(name)?.ok_or(format!("no `{name}`"));
        let float = |name: &str, default: f64| -> std::result::Result<f64, String> {
            match fields.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_f64().ok_or(format!("`{name}` must be a number")),
            }
        };
        let flag = |name: &str, default: bool| -> std::result::Result<bool, String> {
            match fields.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_bool().ok_or(format!("`{name}` must be true or false")),
            }
        };
        let (hidden_size, heads) = (need("hidden_size")?, need("num_attention_heads")?);
        let kv_heads = int("num_key_value_heads")?.unwrap_or(heads);
        let head_dim = int("head_dim")?.unwrap_or(hidden_size / heads);
        if fields.get("head_dim").is_none_or(Value::is_null) && hidden_size % heads != 0 {
            return Err(format!("hidden_size = {hidden_size} is not a multiple of num_attention_heads = {heads}"));
        }
        if heads % kv_heads != 0 {
            return Err(format!("num_attention_heads = {heads} is not a multiple of num_key_value_heads = {kv_heads}"));
        }
        if head_dim % 2 != 0 {
            return Err(format!("head_dim = {head_dim} is odd: RoPE rotates pairs"));
        }
        match fields.get("hidden_act").and_then(Value::as_str) {
            None | Some("silu") => {}
            Some(other) => return Err(format!("hidden_act `{other}`: lethe's Llama-family MLP has silu only")),
        }
        if flag("rope_interleaved", false)? {
            return Err("rope_interleaved = true: lethe rotates the halves of each head, as transformers does".into());
        }
        if float("attention_dropout", 0.0)? != 0.0 {
            return Err("attention_dropout other than 0 is not implemented".into());
        }
        if int("pretraining_tp")?.unwrap_or(1) != 1 {
            return Err("pretraining_tp other than 1 is not implemented".into());
        }
        if let Some(types) = fields.get("layer_types").and_then(Value::as_array) {
            if let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return Err(format!("layer_types holds {other}: lethe implements full_attention layers only"));
            }
        }
        let sliding_window = match family {
            Family::Mistral => int("sliding_window")?,
            _ if flag("use_sliding_window", false)? => {
                return Err("use_sliding_window = true is not implemented for Qwen".into());
            }
            _ => None,
        };
        let (rope_theta, rope_scaling) = rope(fields)?;
        let attention_bias = flag("attention_bias", false)?;
        Ok(LlamaConfig {
            family,
            vocab_size: need("vocab_size")?,
            hidden_size,
            intermediate_size: need("intermediate_size")?,
            layers: need("num_hidden_layers")?,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: within("rms_norm_eps", float("rms_norm_eps", 1e-6)?, 0.0, 1.0)?,
            rope_theta,
            rope_scaling,
            max_positions: int("max_position_embeddings")?.unwrap_or(2048),
            tie_word_embeddings: flag("tie_word_embeddings", false)?,
            qkv_bias: family == Family::Qwen2 || attention_bias,
            o_bias: family != Family::Qwen2 && attention_bias,
            mlp_bias: flag("mlp_bias", false)?,
            qk_norm: family == Family::Qwen3,
            sliding_window,
        })
    }
}

/// RoPE's base and scaling, from `rope_parameters` (transformers 5) or `rope_theta` and
/// `rope_scaling` (the files most folders hold).
fn rope(fields: &serde_json::Map<String, Value>) -> std::result::Result<(f64, Option<Llama3Scaling>), String> {
    let params = fields.get("rope_parameters").filter(|v| !v.is_null());
    let scaling = fields.get("rope_scaling").filter(|v| !v.is_null()).or(params);
    let theta = params
        .and_then(|p| p.get("rope_theta"))
        .or(fields.get("rope_theta"))
        .map(|v| v.as_f64().ok_or("`rope_theta` must be a number"))
        .transpose()?
        .unwrap_or(10000.0);
    let theta = within("rope_theta", theta, 1.0, f64::INFINITY)?;
    let Some(scaling) = scaling else { return Ok((theta, None)) };
    let kind = scaling.get("rope_type").or(scaling.get("type")).and_then(Value::as_str).unwrap_or("default");
    let number = |name: &str| scaling.get(name).and_then(Value::as_f64).ok_or(format!("rope_scaling: no `{name}`"));
    match kind {
        "default" => Ok((theta, None)),
        "llama3" => {
            let positive = |name: &str| within(&format!("rope_scaling: {name}"), number(name)?, 0.0, f64::INFINITY);
            let scaling = Llama3Scaling {
                factor: positive("factor")?,
                low_freq_factor: positive("low_freq_factor")?,
                high_freq_factor: positive("high_freq_factor")?,
                original_max_position_embeddings: positive("original_max_position_embeddings")?,
            };
            if scaling.high_freq_factor <= scaling.low_freq_factor {
                return Err(format!(
                    "rope_scaling: high_freq_factor = {} must be above low_freq_factor = {} (llama3's scaling divides by their difference)",
                    scaling.high_freq_factor, scaling.low_freq_factor
                ));
            }
            Ok((theta, Some(scaling)))
        }
        other => Err(format!("rope_scaling type `{other}`: lethe implements the default RoPE and llama3's scaling")),
    }
}

/// `value` of the field `name`, refused unless it is a finite number in `(low, high)`.
fn within(name: &str, value: f64, low: f64, high: f64) -> std::result::Result<f64, String> {
    if value.is_finite() && value > low && value < high {
        return Ok(value);
    }
    let range = if high.is_finite() { format!("in ({low}, {high})") } else { format!("above {low}") };
    Err(format!("`{name}` = {value} must be a finite number {range}"))
}

/// RoPE's inverse frequencies `(head_dim / 2)` of `cfg`, as `transformers` computes them.
pub fn inverse_frequencies(cfg: &LlamaConfig) -> Tensor {
    crate::rope::inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling.as_ref())
}

/// One block's weights, `(out, in)` maps.
struct Block {
    input_norm: Tensor,
    q: (Tensor, Option<Tensor>),
    k: (Tensor, Option<Tensor>),
    v: (Tensor, Option<Tensor>),
    o: (Tensor, Option<Tensor>),
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_norm: Tensor,
    gate: (Tensor, Option<Tensor>),
    up: (Tensor, Option<Tensor>),
    down: (Tensor, Option<Tensor>),
}

/// A Llama-family decoder, on the device and in the precision it was read in
/// ([`Llama::load_as`]): float32 by default; in bfloat16 or float16 its weights,
/// activations and key-value cache are held in that precision and computed as
/// `transformers` computes them, RMSNorm's statistics, RoPE's angles and the softmax in
/// float32.
pub struct Llama {
    pub config: LlamaConfig,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    head: Tensor,
    inv_freq: Tensor,
}

/// What each block holds ([`Held`]: keys, values and their positions) under a policy
/// ([`Policy`]: the full cache by default), and the position the next token takes.
pub struct KvCache {
    pub layers: Vec<Option<Held>>,
    policies: Vec<Box<dyn LayerPolicy>>,
    policy: Policy,
    pub position: i64,
}

impl Default for KvCache {
    /// The full cache.
    fn default() -> KvCache {
        KvCache::new(Policy::default())
    }
}

impl KvCache {
    /// An empty cache that keeps what `policy` says.
    pub fn new(policy: Policy) -> KvCache {
        KvCache { layers: Vec::new(), policies: Vec::new(), policy, position: 0 }
    }

    /// An empty cache whose layers keep what `layers` say, one a layer (a learned
    /// memory's, [`crate::kv::expire`]); layers beyond them keep everything.
    pub fn with_layers(layers: Vec<Box<dyn LayerPolicy>>) -> KvCache {
        KvCache { layers: Vec::new(), policies: layers, policy: Policy::default(), position: 0 }
    }

    /// An independent copy: the entries held and what each layer's policy keeps about
    /// them (H2O's scores, SnapKV's window of queries, Expire-Span's spans), in memory of
    /// its own, at the same position. A prompt read once can so be continued several
    /// ways, each continuation reading what the original cache would have read.
    pub fn fork(&self) -> KvCache {
        KvCache {
            layers: self.layers.iter().map(|h| h.as_ref().map(Held::fork)).collect(),
            policies: self.policies.iter().map(|p| p.fork()).collect(),
            policy: self.policy.clone(),
            position: self.position,
        }
    }

    /// The cache as named tensors, its own (not copies): `position`, and for each layer
    /// holding entries `layers.<i>.keys`, `.values`, `.positions` and what its policy
    /// keeps (`layers.<i>.policy.<name>`). [`KvCache::from_state`] makes it again.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut state = vec![("position".to_string(), Tensor::from(self.position))];
        for (i, held) in self.layers.iter().enumerate() {
            if let Some(h) = held {
                let layer = [("keys", &h.keys), ("values", &h.values), ("positions", &h.positions)];
                state.extend(layer.map(|(name, t)| (format!("layers.{i}.{name}"), t.shallow_clone())));
            }
            if let Some(policy) = self.policies.get(i) {
                state.extend(policy.state().into_iter().map(|(name, t)| (format!("layers.{i}.policy.{name}"), t)));
            }
        }
        state
    }

    /// The cache under `policy` that `state` ([`KvCache::state`] of a cache under the
    /// same policy) describes; one line naming the first tensor out of place.
    pub fn from_state(policy: Policy, state: Vec<(String, Tensor)>) -> Result<KvCache> {
        KvCache::new(policy).restored(state)
    }

    /// This empty cache ([`KvCache::new`] or [`KvCache::with_layers`]) holding what
    /// `state` ([`KvCache::state`] of a cache under the same policies) describes, each
    /// layer's policy taking back what it kept; one line naming the first tensor out of
    /// place.
    pub fn restored(self, state: Vec<(String, Tensor)>) -> Result<KvCache> {
        let bad = |name: &str, why: String| LetheError::Invalid(format!("cache state: `{name}`: {why}"));
        let mut cache = KvCache { layers: Vec::new(), position: 0, ..self };
        let mut layers: BTreeMap<usize, SavedLayer> = BTreeMap::new();
        for (name, t) in state {
            if name == "position" {
                cache.position =
                    crate::kv::saved(&name, t, 0, Kind::Int64).map_err(|e| bad(&name, e))?.int64_value(&[]);
                continue;
            }
            let Some((i, field)) = name.strip_prefix("layers.").and_then(|rest| rest.split_once('.')) else {
                return Err(bad(&name, "not a name a cache's state holds".into()));
            };
            let i: usize =
                i.parse().ok().filter(|&i| i < MAX_LAYERS).ok_or_else(|| bad(&name, "no such layer".into()))?;
            let (held, policy) = layers.entry(i).or_default();
            match field.strip_prefix("policy.") {
                Some(kept) => policy.push((kept.to_string(), t)),
                None if ["keys", "values", "positions"].contains(&field) => drop(held.insert(field.to_string(), t)),
                None => return Err(bad(&name, "not a name a cache's state holds".into())),
            }
        }
        let count = layers.keys().next_back().map_or(0, |&i| i + 1);
        cache.layers = (0..count).map(|_| None).collect();
        while cache.policies.len() < count {
            cache.policies.push(cache.policy.layer());
        }
        for (i, (held, policy)) in layers {
            cache.layers[i] = held_of(i, held).map_err(|(name, why)| bad(&name, why))?;
            cache.policies[i].restore(policy).map_err(|why| bad(&format!("layers.{i}.policy"), why))?;
        }
        cache.check_held().map_err(|(name, why)| bad(&name, why))?;
        for (i, policy) in cache.policies.iter().enumerate() {
            let held = cache.layers.get(i).and_then(Option::as_ref);
            policy.fits(held).map_err(|why| bad(&format!("layers.{i}.policy"), why))?;
        }
        Ok(cache)
    }

    /// Refuses what no reading makes: layers holding different numbers of streams, a
    /// layer holding no entry, entries written at a negative position or at or after the
    /// cache's position.
    fn check_held(&self) -> std::result::Result<(), (String, String)> {
        if self.position < 0 {
            return Err(("position".into(), format!("{} is negative", self.position)));
        }
        let mut streams = None;
        for (i, held) in self.layers.iter().enumerate() {
            let Some(held) = held else { continue };
            let name = |field: &str| format!("layers.{i}.{field}");
            let (b, n) = (held.keys.size()[0], held.len());
            let (first, s) = *streams.get_or_insert((i, b));
            if s != b {
                return Err((name("keys"), format!("holds {b} streams, layers.{first} {s}")));
            }
            if n == 0 {
                return Err((name("keys"), "holds no entry (a layer that holds none is left out)".into()));
            }
            let (low, high) = (held.positions.min().int64_value(&[]), held.positions.max().int64_value(&[]));
            if low < 0 || high >= self.position {
                return Err((
                    name("positions"),
                    format!("entries written at {low} to {high}, where the cache has read {} tokens", self.position),
                ));
            }
        }
        Ok(())
    }

    /// Refuses a cache of another model than `model` (more layers, or entries of another
    /// number of key-value heads or head width), or one that holds its entries in another
    /// precision or its tensors on another device than the model's, naming what differs.
    pub fn check_fits(&self, model: &Llama) -> std::result::Result<(), String> {
        let (config, device) = (&model.config, model.device());
        if self.layers.len() > config.layers as usize {
            return Err(format!(
                "holds {} layers, the model has {} (a cache of another model)",
                self.layers.len(),
                config.layers
            ));
        }
        for held in self.layers.iter().flatten().filter(|h| h.keys.dim() == 4) {
            let size = held.keys.size();
            if (size[1], size[3]) != (config.kv_heads, config.head_dim) {
                return Err(format!(
                    "holds {} key-value heads of width {}, the model {} of width {} (a cache of another model)",
                    size[1], size[3], config.kv_heads, config.head_dim
                ));
            }
        }
        let layers = self.layers.iter().enumerate();
        if let Some((i, held)) =
            layers.filter_map(|(i, h)| Some((i, h.as_ref()?))).find(|(_, h)| h.keys.kind() != model.kind())
        {
            return Err(format!(
                "holds `layers.{i}.keys` in {}, the model computes in {} (read it in the precision the cache was made in)",
                precision_name(held.keys.kind()),
                precision_name(model.kind())
            ));
        }
        // Scalars (the position, SnapKV's count of pending tokens) are read as numbers.
        let elsewhere = self.state().into_iter().find(|(_, t)| t.dim() > 0 && t.device() != device);
        if let Some((name, t)) = elsewhere {
            let on = |d| lethe_core::device::name(d);
            return Err(format!("holds `{name}` on {}, the model runs on {}", on(t.device()), on(device)));
        }
        Ok(())
    }

    /// The entries each layer holds per key-value head.
    pub fn entries(&self) -> Vec<i64> {
        self.layers.iter().map(|h| h.as_ref().map_or(0, Held::len)).collect()
    }

    /// The bytes of keys and values held (what attention reads).
    pub fn kv_bytes(&self) -> usize {
        let size = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        self.layers.iter().flatten().map(|h| size(&h.keys) + size(&h.values)).sum()
    }

    /// The bytes of keys, values and positions held.
    pub fn bytes(&self) -> usize {
        let size = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        self.layers.iter().flatten().map(|h| size(&h.keys) + size(&h.values) + size(&h.positions)).sum()
    }
}

/// `f32`, `bf16` or `f16`, as `--precision` names them; another kind as libtorch does.
fn precision_name(kind: Kind) -> String {
    Precision::of_kind(kind).map_or_else(|| format!("{kind:?}"), |p| p.name().to_string())
}

/// A saved layer of a cache: its entries' tensors by name, and what its policy keeps.
type SavedLayer = (BTreeMap<String, Tensor>, Vec<(String, Tensor)>);

/// The most layers a saved cache may name (no decoder has more).
const MAX_LAYERS: usize = 4096;

/// Layer `i`'s entries from its saved `keys`, `values` and `positions` (none: it held
/// nothing), refused (the tensor's name and why) unless they are one cache's:
/// `(b, kv_heads, n, head_dim)` twice, in float32, bfloat16 or float16 alike, and
/// `(b, kv_heads, n)` int64.
fn held_of(i: usize, mut saved: BTreeMap<String, Tensor>) -> std::result::Result<Option<Held>, (String, String)> {
    let name = |field: &str| format!("layers.{i}.{field}");
    if saved.is_empty() {
        return Ok(None);
    }
    let mut take = |field: &str, dims: usize, kind: Option<Kind>| {
        let t = saved.remove(field).ok_or_else(|| (name(field), "missing beside the layer's other entries".into()))?;
        match kind {
            Some(kind) => crate::kv::saved(&name(field), t, dims, kind),
            None => crate::kv::saved_float(&name(field), t, dims),
        }
        .map_err(|why| (name(field), why))
    };
    let keys = take("keys", 4, None)?;
    let (values, positions) = (take("values", 4, Some(keys.kind()))?, take("positions", 3, Some(Kind::Int64))?);
    if values.size() != keys.size() || positions.size() != keys.size()[..3] {
        let shapes = format!("keys {:?}, values {:?}, positions {:?}", keys.size(), values.size(), positions.size());
        return Err((name("keys"), format!("the shapes do not make one cache ({shapes})")));
    }
    Ok(Some(Held::new(keys, values, positions)))
}

impl Llama {
    /// Reads the model in `dir`: its `config.json` and weights (see [`read_weights`]).
    pub fn load(dir: &Path) -> Result<Llama> {
        Self::load_on(dir, Device::Cpu)
    }

    /// [`Llama::load`] onto `device`, the weights moved there shard by shard
    /// ([`read_weights_on`]).
    pub fn load_on(dir: &Path, device: Device) -> Result<Llama> {
        Self::load_as(dir, device, Precision::F32)
    }

    /// [`Llama::load_on`] in `precision`: the weights converted to it on the device, the
    /// activations and the cache held in it.
    pub fn load_as(dir: &Path, device: Device, precision: Precision) -> Result<Llama> {
        // A `config.json` that is not a regular file is named by the reader below.
        if !dir.join("config.json").exists() {
            let why = if !dir.exists() {
                "does not exist"
            } else if dir.is_file() {
                "is a file, where a Hugging Face model folder is wanted (a lethe run is given as --checkpoint)"
            } else if dir.join("checkpoint.safetensors").is_file() {
                "is a lethe run folder, not a Hugging Face one: give it as --checkpoint"
            } else {
                "is not a Hugging Face model folder: it has no config.json"
            };
            return Err(LetheError::checkpoint(dir, why));
        }
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        Self::assemble(config, read_weights_on(dir, device, precision.kind())?)
    }

    /// The model of a lethe run of `model.arch = "llama"` (its config `cfg`) from its
    /// parameters `params` (by lethe's names; low-rank adapters are folded into their
    /// maps, [`crate::lora::merged`]), as `lethe export` would write it and
    /// [`Llama::load`] read it back, without the folder; on the parameters' device.
    pub fn from_run(cfg: &lethe_core::config::Config, params: &HashMap<String, Tensor>) -> Result<Llama> {
        let merged;
        let params = match cfg.train.lora_rank {
            0 => params,
            rank => {
                merged = crate::lora::merged(params, rank, cfg.train.lora_alpha);
                &merged
            }
        };
        let config = LlamaConfig::from_json(&layout::config_json(&cfg.model))
            .map_err(|e| LetheError::Invalid(format!("the run's model is not a Llama-family decoder: {e}")))?;
        let mut tensors = HashMap::new();
        for (ours, theirs) in layout::names(&cfg.model) {
            let t =
                params.get(&ours).ok_or_else(|| LetheError::Invalid(format!("the run has no parameter `{ours}`")))?;
            let t = t.detach().to_kind(Kind::Float).contiguous();
            tensors.insert(theirs, (t, PathBuf::from(format!("the run's `{ours}`"))));
        }
        Self::assemble(config, Weights { tensors, source: PathBuf::from("the run") })
    }

    /// What tells this model's weights from another's of the same shape, as `crc32
    /// 1a2b3c4d`: a checksum of its config and of the first rows of its embedding and
    /// output layer and its final norm, as it holds them (in its precision). Two decoders
    /// of one folder in one precision give the same one, so that a cache one of them
    /// filled is read on by the other, and by no other model's.
    pub fn fingerprint(&self) -> String {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(format!("{:?}", self.config).as_bytes());
        for t in [&self.embed, &self.head] {
            let rows = t.size()[0].min(8);
            hash_values(&mut hasher, &t.narrow(0, 0, rows));
        }
        hash_values(&mut hasher, &self.norm);
        format!("crc32 {:08x}", hasher.finalize())
    }

    /// The device the weights are on.
    pub fn device(&self) -> Device {
        self.embed.device()
    }

    /// The element type of the weights, the activations and the cache.
    pub fn kind(&self) -> Kind {
        self.embed.kind()
    }

    /// The precision the model computes in ([`Llama::kind`]).
    pub fn precision(&self) -> Precision {
        Precision::of_kind(self.kind()).unwrap_or_default()
    }

    /// The model with its weights in `precision` (a run's decoder, [`Llama::from_run`],
    /// read as a folder's is with [`Llama::load_as`]).
    pub fn into_precision(self, precision: Precision) -> Llama {
        let kind = precision.kind();
        let to = |t: Tensor| t.to_kind(kind);
        let map = |(w, b): (Tensor, Option<Tensor>)| (to(w), b.map(to));
        let blocks = self
            .blocks
            .into_iter()
            .map(|b| Block {
                input_norm: to(b.input_norm),
                q: map(b.q),
                k: map(b.k),
                v: map(b.v),
                o: map(b.o),
                q_norm: b.q_norm.map(to),
                k_norm: b.k_norm.map(to),
                post_norm: to(b.post_norm),
                gate: map(b.gate),
                up: map(b.up),
                down: map(b.down),
            })
            .collect();
        let tied = self.config.tie_word_embeddings;
        let embed = to(self.embed);
        let head = if tied { embed.shallow_clone() } else { to(self.head) };
        Llama { config: self.config, embed, blocks, norm: to(self.norm), head, inv_freq: self.inv_freq }
    }

    /// The model of `config` from its weights `w`, every one of which it must take.
    fn assemble(config: LlamaConfig, mut w: Weights) -> Result<Llama> {
        let (d, hd, f) = (config.hidden_size, config.head_dim, config.intermediate_size);
        let (q_rows, kv_rows) = (config.heads * hd, config.kv_heads * hd);
        let embed = w.take("model.embed_tokens.weight", &[config.vocab_size, d])?;
        let mut blocks = Vec::new();
        for i in 0..config.layers {
            let p = format!("model.layers.{i}");
            let mut map = |name: &str, out: i64, inn: i64, bias: bool| -> Result<(Tensor, Option<Tensor>)> {
                let weight = w.take(&format!("{p}.{name}.weight"), &[out, inn])?;
                let bias = if bias { Some(w.take(&format!("{p}.{name}.bias"), &[out])?) } else { None };
                Ok((weight, bias))
            };
            let (qkv, o, mlp) = (config.qkv_bias, config.o_bias, config.mlp_bias);
            let (q, k, v) = (
                map("self_attn.q_proj", q_rows, d, qkv)?,
                map("self_attn.k_proj", kv_rows, d, qkv)?,
                map("self_attn.v_proj", kv_rows, d, qkv)?,
            );
            let o = map("self_attn.o_proj", d, q_rows, o)?;
            let (gate, up, down) =
                (map("mlp.gate_proj", f, d, mlp)?, map("mlp.up_proj", f, d, mlp)?, map("mlp.down_proj", d, f, mlp)?);
            let (q_norm, k_norm) = match config.qk_norm {
                true => (
                    Some(w.take(&format!("{p}.self_attn.q_norm.weight"), &[hd])?),
                    Some(w.take(&format!("{p}.self_attn.k_norm.weight"), &[hd])?),
                ),
                false => (None, None),
            };
            let input_norm = w.take(&format!("{p}.input_layernorm.weight"), &[d])?;
            let post_norm = w.take(&format!("{p}.post_attention_layernorm.weight"), &[d])?;
            blocks.push(Block { input_norm, q, k, v, o, q_norm, k_norm, post_norm, gate, up, down });
        }
        let norm = w.take("model.norm.weight", &[d])?;
        let head = match config.tie_word_embeddings {
            true => {
                w.skip("lm_head.weight");
                embed.shallow_clone()
            }
            false => w.take("lm_head.weight", &[config.vocab_size, d])?,
        };
        w.finish()?;
        let inv_freq = inverse_frequencies(&config).to_device(embed.device());
        Ok(Llama { config, embed, blocks, norm, head, inv_freq })
    }

    /// The logits `(b, t, vocab)` of the tokens `ids` `(b, t)` that follow what `cache`
    /// holds (their positions from `cache.position` on); the cache then holds them too.
    /// The logits are float32 whatever the model's precision (their values those of its
    /// precision).
    pub fn forward(&self, ids: &Tensor, cache: &mut KvCache) -> Tensor {
        let _guard = tch::no_grad_guard();
        let t = ids.size()[1];
        let ids = ids.to_device(self.device());
        cache.layers.resize_with(self.blocks.len(), || None);
        while cache.policies.len() < self.blocks.len() {
            cache.policies.push(cache.policy.layer());
        }
        let positions = Tensor::arange_start(cache.position, cache.position + t, (Kind::Int64, self.device()));
        let (cos, sin) = self.rotation(&positions);
        let mut h = self.embed.index_select(0, &ids.flatten(0, -1)).view([ids.size()[0], t, self.config.hidden_size]);
        let layers = self.blocks.iter().zip(cache.layers.iter_mut()).zip(cache.policies.iter_mut());
        for ((block, held), policy) in layers {
            let x = rms_norm(&h, &block.input_norm, self.config.rms_norm_eps);
            h += self.attention(block, &x, (&positions, &cos, &sin), held, policy.as_mut());
            let x = rms_norm(&h, &block.post_norm, self.config.rms_norm_eps);
            let gated = linear(&x, &block.gate).silu() * linear(&x, &block.up);
            h += linear(&gated, &block.down);
        }
        cache.position += t;
        let h = rms_norm(&h, &self.norm, self.config.rms_norm_eps);
        let logits = crate::decode::linear(&h, &self.head, None).unwrap_or_else(|_| h.matmul(&self.head.tr()));
        logits.to_kind(Kind::Float)
    }

    /// The bytes of the weights a token's forward pass reads whole: every block's, the
    /// final norm and the output map (the embedding gives one row).
    pub fn weight_bytes(&self) -> usize {
        let size = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        let map = |(w, b): &(Tensor, Option<Tensor>)| size(w) + b.as_ref().map_or(0, size);
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                let norms = [Some(&b.input_norm), Some(&b.post_norm), b.q_norm.as_ref(), b.k_norm.as_ref()];
                let maps = [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down];
                norms.into_iter().flatten().map(size).sum::<usize>() + maps.into_iter().map(map).sum::<usize>()
            })
            .sum();
        blocks + size(&self.norm) + size(&self.head)
    }

    /// `x` `(b, n, t, head_dim)` rotated by RoPE at `positions` `(t)`: what the cache
    /// holds for keys written at those positions.
    pub fn rotate_at(&self, x: &Tensor, positions: &Tensor) -> Tensor {
        let (cos, sin) = self.rotation(positions);
        rotate(x, &cos, &sin)
    }

    /// `cos` and `sin` `(t, head_dim)` of the positions `(t)`, the angles in float32,
    /// the two in the model's precision.
    fn rotation(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let (cos, sin) = crate::rope::Rope::rotation(&self.inv_freq, positions);
        (cos.to_kind(self.kind()), sin.to_kind(self.kind()))
    }

    /// One block's attention of `x` `(b, t, d)` at `positions` `(t)` (rotated by `cos`
    /// and `sin`) over what it holds and itself; then its policy updates what it holds.
    fn attention(
        &self,
        block: &Block,
        x: &Tensor,
        (positions, cos, sin): (&Tensor, &Tensor, &Tensor),
        held: &mut Option<Held>,
        policy: &mut dyn LayerPolicy,
    ) -> Tensor {
        let c = &self.config;
        let (b, t, _) = x.size3().expect("(b, t, d)");
        let heads = |y: Tensor, n: i64| y.view([b, t, n, c.head_dim]).transpose(1, 2); // (b, n, t, hd)
        let mut q = heads(linear(x, &block.q), c.heads);
        let mut k = heads(linear(x, &block.k), c.kv_heads);
        let v = heads(linear(x, &block.v), c.kv_heads);
        if let (Some(qn), Some(kn)) = (&block.q_norm, &block.k_norm) {
            q = rms_norm(&q, qn, c.rms_norm_eps);
            k = rms_norm(&k, kn, c.rms_norm_eps);
        }
        let in_cache = policy.positions() == Positions::InCache;
        if !in_cache {
            (q, k) = (rotate(&q, cos, sin), rotate(&k, cos, sin));
        }
        let written = positions.view([1, 1, t]).expand([b, c.kv_heads, t], false);
        let mut all = held.take().unwrap_or_else(Held::empty);
        all.append(&k, &v, &written);
        let n = all.len();
        let keys = match in_cache {
            true => {
                let (cos, sin) = self.rotation(&Tensor::arange(n, (Kind::Int64, x.device())));
                q = rotate(&q, &cos.narrow(0, n - t, t), &sin.narrow(0, n - t, t));
                rotate(&all.keys, &cos, &sin)
            }
            false => all.keys.shallow_clone(),
        };
        let scale = (c.head_dim as f64).powf(-0.5);
        let bias = policy.bias(x, &all, positions);
        // The fused kernel takes one mask for every head: right when the heads hold the
        // same entries, or when only causality masks (what is held precedes the chunk).
        let one_mask = policy.same_entries_in_every_head() || c.sliding_window.is_none();
        // A policy's bias (which masks what a query does not see) goes in as the mask.
        let fused = t > 1 && !policy.needs_weights() && one_mask && (bias.is_none() || c.sliding_window.is_none());
        let (context, weights) = match fused {
            true => (self.fused_attention(&q, &keys, &all, positions, scale, bias.as_ref()), None),
            false => {
                let (context, weights) = self.explicit_attention(&q, &keys, &all, positions, scale, bias.as_ref());
                (context, Some(weights))
            }
        };
        let context = context.transpose(1, 2).contiguous().view([b, t, c.heads * c.head_dim]);
        let chunk = Chunk { queries: &q, query_positions: positions, weights: weights.as_ref(), scale };
        policy.update(&mut all, &chunk);
        *held = Some(all);
        linear(&context, &block.o)
    }

    /// Whether the query at `query_pos` `(t, 1)` sees each key at `key_pos` `(.., n)`:
    /// written at or before it and, with Mistral's sliding window, within it.
    fn seen(&self, key_pos: &Tensor, query_pos: &Tensor) -> Tensor {
        let seen = key_pos.le_tensor(query_pos);
        match self.config.sliding_window {
            Some(w) => seen.logical_and(&(query_pos - key_pos).lt(w)),
            None => seen,
        }
    }

    /// Attention of `q` `(b, heads, t, hd)` over `keys` (as held, rotated for the
    /// queries) with the weights written out `(b, heads, t, n)`: the queries of a
    /// key-value head's group side by side, so that keys and values are read in place;
    /// one token's by the decode kernel ([`crate::decode::attention`]); a policy's `bias`
    /// `(b, 1 or kv_heads, t, n)` joins the scores. Returns the context
    /// `(b, heads, t, hd)` and the weights.
    fn explicit_attention(
        &self,
        q: &Tensor,
        keys: &Tensor,
        held: &Held,
        positions: &Tensor,
        scale: f64,
        bias: Option<&Tensor>,
    ) -> (Tensor, Tensor) {
        let c = &self.config;
        let (b, h, t, hd) = q.size4().expect("(b, h, t, hd)");
        let (kvh, n) = (c.kv_heads, held.len());
        let group = h / kvh;
        let decode_kernel = matches!(q.kind(), Kind::Float | Kind::BFloat16 | Kind::Half);
        if t == 1 && c.sliding_window.is_none() && q.device() == Device::Cpu && decode_kernel {
            let q = q.reshape([b, kvh, group, hd]);
            if let Ok((context, weights)) = crate::decode::attention(&q, keys, &held.values, bias, scale) {
                return (context.view([b, h, 1, hd]), weights.view([b, h, 1, n]));
            }
        }
        let q = q.reshape([b, kvh, group * t, hd]);
        let mut scores = (q.matmul(&keys.transpose(-2, -1)) * scale).view([b, kvh, group, t, n]);
        if t > 1 || c.sliding_window.is_some() {
            let seen = self.seen(&held.positions.view([b, kvh, 1, 1, n]), &positions.view([t, 1]));
            scores = scores.masked_fill(&seen.logical_not(), f64::NEG_INFINITY);
        }
        if let Some(bias) = bias {
            // (b, 1 or kv_heads, 1, t, n), added in float32 (a bias of `ln m` is fine-grained).
            scores = scores.to_kind(Kind::Float) + bias.unsqueeze(2);
        }
        // The softmax in float32; its weights meet the values in the model's precision.
        let weights = scores.softmax(-1, Kind::Float).view([b, kvh, group * t, n]);
        let context = weights.to_kind(held.values.kind()).matmul(&held.values).view([b, h, t, hd]);
        (context, weights.view([b, h, t, n]))
    }

    /// Attention of `q` over `keys` by libtorch's fused kernel (no weights written out),
    /// for a chunk of several tokens where one mask serves every head: the mask from the
    /// first head's positions, or a policy's `bias` added to the scores.
    fn fused_attention(
        &self,
        q: &Tensor,
        keys: &Tensor,
        held: &Held,
        positions: &Tensor,
        scale: f64,
        bias: Option<&Tensor>,
    ) -> Tensor {
        let (h, t) = (q.size()[1], q.size()[2]);
        let mask = match bias {
            // `(b, 1 or kv_heads, t, n)`, minus infinity where a query does not see: a
            // bias a key-value head goes to each of its query heads.
            Some(bias) => match bias.size()[1] {
                1 => bias.to_kind(q.kind()),
                g => bias.repeat_interleave_self_int(h / g, 1, None).to_kind(q.kind()),
            },
            None => {
                let key_pos = held.positions.get(0).get(0).view([1, -1]);
                self.seen(&key_pos, &positions.view([t, 1]))
            }
        };
        Tensor::scaled_dot_product_attention(q, keys, &held.values, Some(mask), 0.0, false, scale, true)
    }
}

/// `x w^T + b`: for a token or a few, the decode product that streams each weight once
/// ([`crate::decode::linear`]).
fn linear(x: &Tensor, (w, b): &(Tensor, Option<Tensor>)) -> Tensor {
    crate::decode::linear(x, w, b.as_ref()).unwrap_or_else(|_| x.linear(w, b.as_ref()))
}

/// RMSNorm over the last dimension, `w * x / sqrt(mean(x^2) + eps)`; a half-precision
/// `x` (bfloat16, float16) normed in float32 and brought back before the weight, as
/// `transformers` computes it.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let kind = x.kind();
    let x = match kind {
        Kind::BFloat16 | Kind::Half => x.to_kind(Kind::Float),
        _ => x.shallow_clone(),
    };
    let variance = x.pow_tensor_scalar(2).mean_dim([-1i64].as_slice(), true, x.kind());
    weight * (x * (variance + eps).rsqrt()).to_kind(kind)
}

use crate::rope::rotate;

/// The tensors of a folder's weights, taken one by one by name and checked against the
/// shapes the config gives; whatever is left at the end is refused by name.
pub struct Weights {
    tensors: HashMap<String, (Tensor, PathBuf)>,
    /// Where the weights come from (a file or index, or a run), named when one is missing.
    source: PathBuf,
}

/// The weights of `dir`: `model.safetensors`, or the shards `model.safetensors.index.json`
/// lists (each must exist and hold the tensors the index gives it), in bfloat16, float16
/// or float32, converted to float32.
pub fn read_weights(dir: &Path) -> Result<Weights> {
    read_weights_on(dir, Device::Cpu, Kind::Float)
}

/// [`read_weights`] onto `device` in `kind`, each tensor moved there as its shard is read
/// (so that the host holds one shard at a time, in the folder's dtype) and converted
/// there.
pub fn read_weights_on(dir: &Path, device: Device, kind: Kind) -> Result<Weights> {
    let index = dir.join("model.safetensors.index.json");
    let single = dir.join("model.safetensors");
    let mut tensors = HashMap::new();
    if index.is_file() {
        let text = lethe_core::input::read_to_string(&index).map_err(|e| LetheError::checkpoint(&index, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| LetheError::checkpoint(&index, format!("not a JSON index: {e}")))?;
        let map = value
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| LetheError::checkpoint(&index, "has no weight_map"))?;
        let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, file) in map {
            let file =
                file.as_str().ok_or_else(|| LetheError::checkpoint(&index, format!("names no file for `{name}`")))?;
            if file.contains('/') || file.contains("..") {
                return Err(LetheError::checkpoint(&index, format!("names `{file}`, outside the folder")));
            }
            by_file.entry(file.to_string()).or_default().push(name.clone());
        }
        for (file, names) in by_file {
            let path = dir.join(&file);
            let mut shard: HashMap<String, Tensor> = read_file(&path, device, kind)?.into_iter().collect();
            for name in names {
                let t = shard.remove(&name).ok_or_else(|| {
                    LetheError::checkpoint(&path, format!("has no tensor `{name}`, which the index places there"))
                })?;
                tensors.insert(name, (t, path.clone()));
            }
            if let Some(extra) = shard.keys().min() {
                return Err(LetheError::checkpoint(&path, format!("holds `{extra}`, which the index does not list")));
            }
        }
        return Ok(Weights { tensors, source: index });
    }
    for (name, t) in read_file(&single, device, kind)? {
        tensors.insert(name, (t, single.clone()));
    }
    Ok(Weights { tensors, source: single })
}

/// Adds the values of `t`, in float32, to `hasher`.
fn hash_values(hasher: &mut crc32fast::Hasher, t: &Tensor) {
    let t = t.detach().to_device(Device::Cpu).to_kind(Kind::Float).contiguous();
    let values = Vec::<f32>::try_from(t.view([-1])).unwrap_or_default();
    values.iter().for_each(|v| hasher.update(&v.to_le_bytes()));
}

/// The tensors of one safetensors file, in `kind`.
fn read_file(path: &Path, device: Device, kind: Kind) -> Result<Vec<(String, Tensor)>> {
    lethe_core::input::check_file(path).map_err(|e| LetheError::checkpoint(path, e))?;
    let raw = Tensor::read_safetensors(path).map_err(|e| {
        LetheError::checkpoint(
            path,
            format!("cannot read: {}", lethe_core::checkpoint::safetensors_reason(&e.to_string())),
        )
    })?;
    raw.into_iter()
        .map(|(name, t)| match t.kind() {
            Kind::BFloat16 | Kind::Half | Kind::Float => Ok((name, t.to_device(device).to_kind(kind))),
            other => Err(LetheError::checkpoint(
                path,
                format!("tensor `{name}` is {other:?}: lethe reads bfloat16, float16 and float32"),
            )),
        })
        .collect()
}

impl Weights {
    /// The tensor `name`, which must have `shape`.
    pub fn take(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        let (t, path) = self.tensors.remove(name).ok_or_else(|| {
            LetheError::checkpoint(&self.source, format!("has no tensor `{name}`, which the config asks for"))
        })?;
        if t.size() != shape {
            return Err(LetheError::checkpoint(
                &path,
                format!("tensor `{name}` has shape {:?}, the config says {shape:?}", t.size()),
            ));
        }
        Ok(t)
    }

    /// Drops `name` if it is there (a tied head saved twice).
    pub fn skip(&mut self, name: &str) {
        self.tensors.remove(name);
    }

    /// Refuses whatever was not taken, naming it.
    pub fn finish(self) -> Result<()> {
        match self.tensors.iter().min_by_key(|(name, _)| name.as_str()) {
            Some((name, (_, path))) => {
                Err(LetheError::checkpoint(path, format!("holds `{name}`, which this architecture does not have")))
            }
            None => Ok(()),
        }
    }
}

pub mod expire;
pub mod layout;

pub use expire::ExpireRun;

#[cfg(test)]
mod tests;
