//! The shared backbone: a decoder-only, block-recurrent transformer (Expire-Span paper,
//! section 3; docs/design/algorithms.md, Backbone). Embedding, `layers` blocks of attention +
//! feed-forward (pre-norm or post-norm, dropout), and a linear output head. How each
//! layer remembers the past is its [`MemoryLayer`]'s business.
//!
//! Three architectures (`model.arch`) share this code, so that a memory mechanism is the
//! same on each:
//! - `lethe`, the papers' backbone: learned relative positions `key_pe` shared by every
//!   layer (A.1), attention without biases, ReLU, a separate output head;
//! - `gpt2`, GPT-2 as Hugging Face `transformers` defines it (Radford et al., 2019; the
//!   ∞-former paper's 4.2): learned absolute positions added to the token embedding and
//!   restarting at every block (as GPT-2 is fine-tuned on blocks of 512 tokens), biases
//!   on every projection, the tanh approximation of GELU, pre-norm with a final norm, and
//!   the output projection tied to the token embedding. [`super::gpt2`] reads a
//!   pretrained GPT-2 into it;
//! - `llama`, the Llama family as `transformers` defines it (Touvron et al., 2023):
//!   RMSNorm before each sublayer and at the end, grouped-query attention with rotary
//!   positions (Su et al., 2021) at each state's place in the window, the SiLU-gated MLP
//!   `down(silu(gate(x)) * up(x))`, no biases (but Qwen2's on the query, key and value
//!   maps), the output map separate or tied. [`super::init`] reads a pretrained
//!   Llama-family folder into it, and [`super::export`] writes one back.

use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::attention::{Attention, LinearInit};
use super::memory::{self, AttendInput, LayerShape, MemoryLayer, MemoryReport};
use super::undrawn::drawn;
use lethe_core::config::{Arch, Mechanism, MemoryConfig, ModelConfig};
use lethe_core::error::{LetheError, Result, TorchContext};
use lethe_core::profile;

/// A normalisation layer: LayerNorm (`lethe`, `gpt2`) or RMSNorm (`llama`).
#[derive(Debug)]
enum Norm {
    Layer(nn::LayerNorm),
    /// `weight * x / sqrt(mean(x^2) + eps)`.
    Rms {
        weight: Tensor,
        eps: f64,
    },
}

impl Norm {
    /// The norm `model.arch` has, `weight` (and `bias` for LayerNorm) under `p`.
    fn new(p: nn::Path, cfg: &ModelConfig, d: i64) -> Norm {
        match cfg.arch {
            Arch::Llama => Norm::Rms { weight: p.var("weight", &[d], nn::Init::Const(1.0)), eps: cfg.norm_eps },
            _ => {
                Norm::Layer(nn::layer_norm(p, vec![d], nn::LayerNormConfig { eps: cfg.norm_eps, ..Default::default() }))
            }
        }
    }

    /// The LayerNorm, for a memory that normalises the raw states it caches.
    fn layer_norm(&self) -> Option<&nn::LayerNorm> {
        match self {
            Norm::Layer(n) => Some(n),
            Norm::Rms { .. } => None,
        }
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Tensor {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms { weight, eps } => super::llama::rms_norm(x, weight, *eps),
        }
    }
}

/// One transformer layer's parameters.
#[derive(Debug)]
struct Layer {
    attn: Attention,
    norm1: Norm,
    ff1: nn::Linear,
    /// The gate of the SiLU-gated MLP (`llama`); `ff1` is then its `up` map.
    ff_gate: Option<nn::Linear>,
    ff2: nn::Linear,
    norm2: Norm,
    arch: Arch,
}

impl Layer {
    fn new(p: nn::Path, cfg: &ModelConfig) -> Self {
        let (d, f) = (cfg.d_model as i64, cfg.d_ffn as i64);
        let init = LinearInit::of(cfg);
        let llama = cfg.arch == Arch::Llama;
        let attn = match cfg.arch {
            Arch::Llama => Attention::llama(&p / "attn", cfg),
            _ => Attention::with_init(&p / "attn", d, cfg.heads as i64, cfg.dropout, cfg.arch == Arch::Gpt2, init),
        };
        Layer {
            attn,
            norm1: Norm::new(&p / "norm1", cfg, d),
            ff1: init.linear(&p / "ff1", d, f, !llama, false),
            ff_gate: llama.then(|| init.linear(&p / "ff_gate", d, f, false, false)),
            ff2: init.linear(&p / "ff2", f, d, !llama, true),
            norm2: Norm::new(&p / "norm2", cfg, d),
            arch: cfg.arch,
        }
    }

    fn ffn(&self, x: &Tensor, dropout: f64, train: bool) -> Tensor {
        let a = self.ff1.forward(x); // (b, m, d_ffn)
        let a = match (self.arch, &self.ff_gate) {
            // Not in place: `a` is a view of the product's output, and autograd would copy
            // it in the backward pass (CopySlices), which measured slower.
            (Arch::Lethe, _) => a.relu(),
            (Arch::Gpt2, _) => a.gelu("tanh"), // GPT-2's `gelu_new`
            (Arch::Llama, Some(gate)) => gate.forward(x).silu() * a,
            (Arch::Llama, None) => a.silu(),
        };
        self.ff2.forward(&a.dropout(dropout, train))
    }
}

/// The memory state of every layer for one group of streams.
pub struct Memory {
    layers: Vec<Box<dyn MemoryLayer>>,
}

impl Memory {
    /// Empties every layer's memory.
    pub fn reset(&mut self) {
        self.layers.iter_mut().for_each(|l| l.reset());
    }

    /// Figures per layer.
    pub fn reports(&self) -> Vec<MemoryReport> {
        self.layers.iter().map(|l| l.report()).collect()
    }

    /// Per layer, the spans predicted for the last block's tokens `(b, m)`, when the
    /// mechanism predicts spans.
    pub fn token_spans(&self) -> Vec<Option<Tensor>> {
        self.layers.iter().map(|l| l.token_spans()).collect()
    }

    /// Per layer, what the last block did to its continuous long-term memory, when the
    /// mechanism has one.
    pub fn ltm_traces(&self) -> Vec<Option<memory::LtmTrace>> {
        self.layers.iter().map(|l| l.ltm_trace()).collect()
    }

    /// Saved state, named `layers.<i>.<name>`.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        for (i, l) in self.layers.iter().enumerate() {
            out.extend(l.state().into_iter().map(|(n, t)| (format!("layers.{i}.{n}"), t)));
        }
        out
    }

    /// Restores a state saved by [`Memory::state`]. Every layer read the same blocks,
    /// so each layer's state has the same tensors: a state where one layer lacks a tensor
    /// that another holds is refused, naming both, not loaded as an empty memory.
    pub fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let mut first_names: Option<Vec<String>> = None;
        for (i, l) in self.layers.iter_mut().enumerate() {
            let prefix = format!("layers.{i}.");
            let mine: Vec<(String, Tensor)> = state
                .iter()
                .filter_map(|(n, t)| n.strip_prefix(&prefix).map(|rest| (rest.to_string(), t.shallow_clone())))
                .collect();
            let mut names: Vec<String> = mine.iter().map(|(n, _)| n.clone()).collect();
            names.sort();
            match &first_names {
                None => first_names = Some(names),
                Some(first) if *first != names => {
                    let lacks = |a: &[String], b: &[String]| b.iter().find(|n| !a.contains(n)).cloned();
                    let why = match (lacks(&names, first), lacks(first, &names)) {
                        (Some(n), _) => format!("layer {i} lacks `{n}`, which layer 0 holds"),
                        (None, Some(n)) => format!("layer 0 lacks `{n}`, which layer {i} holds"),
                        (None, None) => format!("layer {i} holds other tensors than layer 0"),
                    };
                    return Err(LetheError::Invalid(format!("memory state incomplete: {why}")));
                }
                Some(_) => {}
            }
            l.load_state(&mine)?;
        }
        Ok(())
    }
}

/// The output of one block.
pub struct Forward {
    /// Next-token logits `(b, m, vocab)` (with the adaptive softmax, its log-probabilities).
    pub logits: Tensor,
    /// Sum of the layers' auxiliary losses (a zero scalar when there are none).
    pub aux_loss: Tensor,
}

/// The layers every task shares: `layers` blocks of attention + feed-forward, each with
/// its memory, the relative-position embeddings `key_pe`, and the final norm. It maps
/// input vectors `(b, m, d)` to output vectors `(b, m, d)`; what comes in (byte
/// embeddings, gridworld observations) and what goes out (next-byte logits, a policy)
/// belongs to the model that wraps it.
pub struct Backbone {
    cfg: ModelConfig,
    layers: Vec<Layer>,
    final_norm: Option<Norm>,
    /// Relative positions (`lethe`); none on GPT-2.
    key_pe: Option<Tensor>,
    memories: Vec<Box<dyn MemoryLayer>>,
    mechanism: Mechanism,
}

/// The output of the backbone for one block.
pub struct Hidden {
    /// Output vectors `(b, m, d)` (after the final norm when pre-norm is on).
    pub h: Tensor,
    /// Sum of the layers' auxiliary losses (a zero scalar when there are none).
    pub aux_loss: Tensor,
}

impl Backbone {
    /// Creates the parameters under `p` (`layers.<i>...`, `key_pe`, `final_norm`).
    /// `block` is the training block length (it sets Expire-Span's position rows).
    pub fn new(p: &nn::Path, cfg: &ModelConfig, mem: &MemoryConfig, block: usize) -> Result<Self> {
        let d = cfg.d_model as i64;
        let d_head = d / cfg.heads as i64;
        let layers = (0..cfg.layers).map(|i| Layer::new(p / "layers" / i, cfg)).collect();
        let shape = LayerShape { d_model: d, heads: cfg.heads as i64, kv_heads: cfg.kv_heads() as i64, block };
        let memories = (0..cfg.layers)
            .map(|i| memory::build(mem, p / "layers" / i / "attn", shape))
            .collect::<Result<Vec<_>>>()?;
        let final_norm = cfg.pre_norm.then(|| Norm::new(p / "final_norm", cfg, d));
        let key_pe = match cfg.arch {
            Arch::Gpt2 | Arch::Llama => None,
            Arch::Lethe => {
                let rows = memory::position_rows(mem, block);
                // The one parameter whose size the memory sets: allocated fallibly, so that
                // a span the device cannot hold is an error, not a panic.
                let std = LinearInit::of(cfg).key_pe_std(d_head);
                let init = drawn(p, "key_pe", nn::Init::Randn { mean: 0.0, stdev: std });
                let pe = p.f_var("key_pe", &[rows, d_head], init);
                Some(pe.torch(&format!(
                    "allocating the position embeddings for memory.span = {} ({rows} x {d_head})",
                    mem.span
                ))?)
            }
        };
        Ok(Backbone { cfg: cfg.clone(), layers, final_norm, key_pe, memories, mechanism: mem.mechanism })
    }

    /// Lets every layer's mechanism enforce its parameter constraints after an
    /// optimiser step.
    pub fn after_step(&self) {
        self.memories.iter().for_each(|m| m.after_step());
    }

    /// Low-rank adapters of rank `rank` (scaled by `alpha / rank`) on every layer's
    /// attention maps, under `p` (`layers.<i>.attn.q.lora_a`, ...; [`crate::lora`]).
    pub fn adapt(&mut self, p: &nn::Path, rank: usize, alpha: f64) {
        for (i, layer) in self.layers.iter_mut().enumerate() {
            layer.attn.adapt(&(p / "layers" / i / "attn"), rank as i64, alpha);
        }
    }

    /// Empty memories for a group of streams (one per micro-batch, or for evaluation).
    pub fn new_memory(&self) -> Memory {
        Memory { layers: self.memories.iter().map(|m| m.fresh()).collect() }
    }

    /// Runs one block of input vectors `h` `(b, m, d)` with the memory carried in
    /// `mem`, then lets each layer's memory absorb the block. `episodes` `(b, m)`, when
    /// given, numbers the episode of each position: a position then sees only its own
    /// episode (see [`AttendInput::episodes`]); it fails for a mechanism that cannot
    /// keep episodes apart.
    pub fn forward(&self, h: Tensor, mem: &mut Memory, train: bool, episodes: Option<&Tensor>) -> Result<Hidden> {
        if episodes.is_some() && !self.mechanism.separates_episodes() {
            return Err(LetheError::Invalid(format!(
                "the {} memory cannot keep the episodes of a row apart; play them in synchronous batches (rl.reset = \"batch\")",
                self.mechanism.name()
            )));
        }
        let p = self.cfg.dropout;
        let mut h = h;
        let mut aux = Tensor::zeros([], (h.kind(), h.device()));
        for (layer, memory) in self.layers.iter().zip(mem.layers.iter_mut()) {
            let _layer = profile::phase("layer");
            let queries = profile::phase("norm, queries");
            let x = if self.cfg.pre_norm { layer.norm1.forward(&h) } else { h.shallow_clone() };
            let q = layer.attn.queries(&x); // (b, heads, m, dh)
            drop(queries);
            let attend = profile::phase("memory attend");
            // A memory that caches raw states normalises them itself (`caches_raw_states`).
            let raw = self.cfg.pre_norm && memory.caches_raw_states();
            let norm = if raw { layer.norm1.layer_norm() } else { None };
            let out = memory.attend(&AttendInput {
                x: &x,
                q: &q,
                attn: &layer.attn,
                key_pe: self.key_pe.as_ref(),
                train,
                episodes,
                norm,
            })?;
            drop(attend);
            let update = profile::phase("memory update");
            memory.update(&if raw { h.detach() } else { x.detach() }, episodes, out.carry)?;
            drop(update);
            if let Some(a) = out.aux_loss {
                aux += a;
            }
            let _rest = profile::phase("output, feed-forward");
            let mut a = layer.attn.output(&out.context); // (b, m, d)
            if let Some(added) = out.added {
                a += added;
            }
            let a = a.dropout(p, train);
            h = if self.cfg.pre_norm {
                let h = h + a;
                let f = layer.ffn(&layer.norm2.forward(&h), p, train).dropout(p, train);
                h + f
            } else {
                let h = layer.norm1.forward(&(h + a));
                let f = layer.ffn(&h, p, train).dropout(p, train);
                layer.norm2.forward(&(h + f))
            };
        }
        if let Some(n) = &self.final_norm {
            h = n.forward(&h);
        }
        Ok(Hidden { h, aux_loss: aux })
    }
}

/// The language model: token embeddings (plus absolute positions on GPT-2), the
/// [`Backbone`], and a linear output head, tied to the embedding on GPT-2 (its parameters
/// live in the `VarStore` the model was built in).
pub struct Model {
    cfg: ModelConfig,
    vocabulary: Vocabulary,
    /// GPT-2's absolute positions `(positions, d)`.
    positions: Option<nn::Embedding>,
    body: Backbone,
}

/// The two ends of the model that touch the vocabulary: token ids in, scores out.
enum Vocabulary {
    /// One embedding and one softmax layer.
    Plain {
        embed: nn::Embedding,
        /// The output head; none when tied to `embed` (GPT-2, some Llamas).
        head: Option<nn::Linear>,
    },
    /// Adaptive input and softmax in frequency clusters (`model.cutoffs`).
    Adaptive(super::adaptive::Adaptive),
}

/// lethe's own initialisation of its embeddings, tch's: N(0, 1).
fn lethe_embedding(p: &nn::Path) -> nn::EmbeddingConfig {
    let config = nn::EmbeddingConfig::default();
    nn::EmbeddingConfig { ws_init: drawn(p, "weight", config.ws_init), ..config }
}

/// GPT-2's and Llama's initialisation of their embeddings: N(0, 0.02).
fn gpt2_embedding(p: &nn::Path) -> nn::EmbeddingConfig {
    nn::EmbeddingConfig {
        ws_init: drawn(p, "weight", nn::Init::Randn { mean: 0.0, stdev: 0.02 }),
        ..Default::default()
    }
}

impl Vocabulary {
    fn new(p: &nn::Path, cfg: &ModelConfig) -> Vocabulary {
        if !cfg.cutoffs.is_empty() {
            return Vocabulary::Adaptive(super::adaptive::Adaptive::new(&(p / "adaptive"), cfg));
        }
        let d = cfg.d_model as i64;
        let (tied, bias) = match cfg.arch {
            Arch::Lethe => (false, true),
            Arch::Gpt2 => (true, false),
            Arch::Llama => (cfg.llama.tie_embeddings, false),
        };
        let at = p / "embed";
        let config = if cfg.arch == Arch::Lethe { lethe_embedding(&at) } else { gpt2_embedding(&at) };
        Vocabulary::Plain {
            embed: nn::embedding(at, cfg.vocab as i64, d, config),
            head: (!tied).then(|| LinearInit::of(cfg).linear(p / "head", d, cfg.vocab as i64, bias, false)),
        }
    }

    /// `(b, m)` token ids to `(b, m, d)` vectors.
    fn embed(&self, tokens: &Tensor) -> Tensor {
        match self {
            Vocabulary::Plain { embed, .. } => embed.forward(tokens),
            Vocabulary::Adaptive(a) => a.embed(tokens),
        }
    }

    /// `(b, m, d)` to scores `(b, m, V)`: logits, or the adaptive softmax's
    /// log-probabilities (logits whose log-sum-exp is already 0).
    fn scores(&self, h: &Tensor) -> Tensor {
        match self {
            Vocabulary::Plain { head: Some(head), .. } => head.forward(h),
            Vocabulary::Plain { embed, head: None } => h.matmul(&embed.ws.tr()), // tied
            Vocabulary::Adaptive(a) => a.log_probs(h),
        }
    }

    /// The negative log-likelihood `(b, m)` of `targets` after `h`; the adaptive softmax
    /// scores only the targets' clusters.
    fn nll(&self, h: &Tensor, targets: &Tensor) -> Tensor {
        match self {
            Vocabulary::Adaptive(a) => -a.target_log_probs(h, targets),
            plain => token_nll(&plain.scores(h), targets),
        }
    }

    /// The negative log-likelihood of `targets` and the most likely tokens, `(b, m)`
    /// each, from one scoring of the vocabulary (the adaptive softmax's a few hundred
    /// positions at a time).
    fn nll_and_argmax(&self, h: &Tensor, targets: &Tensor) -> (Tensor, Tensor) {
        match self {
            Vocabulary::Adaptive(a) => {
                let (logp, best) = a.score_in_chunks(h, targets, 512);
                (-logp, best)
            }
            plain => {
                let logits = plain.scores(h); // (b, m, V)
                (token_nll(&logits, targets), logits.argmax(-1, false))
            }
        }
    }
}

impl Model {
    /// Creates the parameters under `p`. Tensor names follow the module path
    /// (`layers.1.attn.q.weight`, `key_pe`, `embed.weight`, `head.weight`, and on GPT-2
    /// `positions.weight`, ...). `block` is the training block length (it sets
    /// Expire-Span's position rows).
    pub fn new(p: &nn::Path, cfg: &ModelConfig, mem: &MemoryConfig, block: usize) -> Result<Self> {
        let d = cfg.d_model as i64;
        let body = Backbone::new(p, cfg, mem, block)?;
        cfg.validate_cutoffs()?; // the clusters' sizes come from them
        Ok(Model {
            cfg: cfg.clone(),
            vocabulary: Vocabulary::new(p, cfg),
            positions: (cfg.arch == Arch::Gpt2)
                .then(|| nn::embedding(p / "positions", cfg.positions as i64, d, gpt2_embedding(&(p / "positions")))),
            body,
        })
    }

    /// Lets every layer's mechanism enforce its parameter constraints after an
    /// optimiser step.
    pub fn after_step(&self) {
        self.body.after_step();
    }

    /// [`Backbone::adapt`]: low-rank adapters on every attention map.
    pub fn adapt(&mut self, p: &nn::Path, rank: usize, alpha: f64) {
        self.body.adapt(p, rank, alpha);
    }

    /// Empty memories for a group of streams (one per micro-batch, or for evaluation).
    pub fn new_memory(&self) -> Memory {
        self.body.new_memory()
    }

    /// Runs one block `tokens` `(b, m)` with the memory carried in `mem`, then lets each
    /// layer's memory absorb the block.
    pub fn forward(&self, tokens: &Tensor, mem: &mut Memory, train: bool) -> Result<Forward> {
        let out = self.hidden(tokens, mem, train)?;
        let logits = self.vocabulary.scores(&out.h); // (b, m, vocab)
        Ok(Forward { logits, aux_loss: out.aux_loss })
    }

    /// As [`Model::forward`], but returns only the negative log-likelihood `(b, m)` of
    /// `targets` `(b, m)` (and the auxiliary loss): with the adaptive softmax, no score
    /// of the whole vocabulary is made.
    pub fn forward_nll(
        &self,
        tokens: &Tensor,
        targets: &Tensor,
        mem: &mut Memory,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        let out = self.hidden(tokens, mem, train)?;
        let _head = profile::phase("head, loss");
        Ok((self.vocabulary.nll(&out.h, targets), out.aux_loss))
    }

    /// Evaluation's view of a block: the negative log-likelihood of `targets` `(b, m)`
    /// and the most likely next tokens `(b, m)`. With the adaptive softmax the whole
    /// vocabulary is scored a few hundred positions at a time, never for the whole block.
    pub fn forward_eval(&self, tokens: &Tensor, targets: &Tensor, mem: &mut Memory) -> Result<(Tensor, Tensor)> {
        let out = self.hidden(tokens, mem, false)?;
        Ok(self.vocabulary.nll_and_argmax(&out.h, targets))
    }

    /// The last layer's output for `tokens`, the memory carried.
    fn hidden(&self, tokens: &Tensor, mem: &mut Memory, train: bool) -> Result<Hidden> {
        let mut h = self.vocabulary.embed(tokens); // (b, m, d)
        if let Some(positions) = &self.positions {
            let m = tokens.size()[1];
            h = &h + positions.forward(&Tensor::arange(m, (Kind::Int64, tokens.device())));
            // (m, d), restarting every block
        }
        self.body.forward(h.dropout(self.cfg.dropout, train), mem, train, None)
    }
}

/// Negative log-likelihood of each target: `logits` `(b, m, V)`, `targets` `(b, m)`.
/// Returns `(b, m)` in the logits' precision, float32 for logits in a lower one
/// (bfloat16 autocast): the log-softmax's statistics need it.
pub fn token_nll(logits: &Tensor, targets: &Tensor) -> Tensor {
    let kind = match logits.kind() {
        Kind::BFloat16 | Kind::Half => Kind::Float,
        kind => kind,
    };
    let logp = logits.log_softmax(-1, kind); // (b, m, V)
    -logp.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1)
}

/// Number of `targets` that are the argmax of `logits`, counting only where `weights > 0`.
pub fn correct(logits: &Tensor, targets: &Tensor, weights: &Tensor) -> f64 {
    let hit = logits.argmax(-1, false).eq_tensor(targets).to_kind(Kind::Float);
    (hit * weights.gt(0.0).to_kind(Kind::Float)).sum(Kind::Double).double_value(&[])
}
