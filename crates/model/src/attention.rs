//! Multi-head attention pieces shared by every memory mechanism: the projections
//! (paper Eq. 1), relative-position scores with the learned `key_pe` (A.1), and the
//! masked softmax mix (Eq. 2).
//!
//! A mechanism decides *which* states a query may see; these helpers do the arithmetic.
//! Shapes: `b` streams, `h` heads, `m` queries (the block), `n` keys, `dh` head size.

use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use lethe_core::config::{Arch, Init, ModelConfig};

use crate::lora::Adapted;
use crate::rope::Rope;
use lethe_core::error::{LetheError, Result};

/// How a layer's linear projections start (`model.init`).
#[derive(Clone, Copy, Debug)]
pub struct LinearInit {
    scheme: Scheme,
    /// The factor on a residual branch's last projection (the attention output, the
    /// second feed-forward layer): `1 / sqrt(2 layers)` for `official` under pre-norm.
    residual: f64,
}

/// The schemes of [`LinearInit`].
#[derive(Clone, Copy, Debug)]
enum Scheme {
    /// `model.init = "kaiming"`.
    Kaiming,
    /// `model.init = "official"`.
    Official,
    /// Weights from N(0, std), biases 0: `transformers`' Llama (`initializer_range`).
    Normal(f64),
}

impl LinearInit {
    /// tch's default, Kaiming-uniform with the ReLU gain.
    pub const KAIMING: LinearInit = LinearInit { scheme: Scheme::Kaiming, residual: 1.0 };

    /// The scheme `cfg.init` gives the `lethe` backbone (GPT-2 keeps tch's default, its
    /// weights come from a checkpoint; a Llama starts as `transformers` starts one, every
    /// weight from N(0, 0.02), for a model pretrained by lethe).
    pub fn of(cfg: &ModelConfig) -> LinearInit {
        match (cfg.arch, cfg.init) {
            (Arch::Llama, _) => LinearInit { scheme: Scheme::Normal(0.02), residual: 1.0 },
            (Arch::Gpt2, _) | (_, Init::Kaiming) => LinearInit::KAIMING,
            (Arch::Lethe, Init::Official) => {
                let residual = if cfg.pre_norm { 1.0 / ((2 * cfg.layers.max(1)) as f64).sqrt() } else { 1.0 };
                LinearInit { scheme: Scheme::Official, residual }
            }
        }
    }

    /// The projection `inp -> out` under `p`; `residual`: the last of a residual branch.
    /// Its weight and bias are left zero where their values will be given
    /// ([`crate::undrawn`]).
    pub fn linear(&self, p: nn::Path, inp: i64, out: i64, bias: bool, residual: bool) -> nn::Linear {
        let config = crate::undrawn::drawn_linear(&p, self.config(inp, bias, residual));
        nn::linear(p, inp, out, config)
    }

    /// The initialisers of a projection `fan_in` wide. `official` is PyTorch's
    /// `nn.Linear` default, weights and bias uniform in `±1 / sqrt(fan_in)`, both times
    /// the residual factor where it applies (as the official code divides them after
    /// drawing).
    fn config(&self, fan_in: i64, bias: bool, residual: bool) -> nn::LinearConfig {
        match self.scheme {
            Scheme::Kaiming => nn::LinearConfig { bias, ..Default::default() },
            Scheme::Normal(stdev) => nn::LinearConfig {
                ws_init: nn::Init::Randn { mean: 0.0, stdev },
                bs_init: Some(nn::Init::Const(0.0)),
                bias,
            },
            Scheme::Official => {
                let scale = if residual { self.residual } else { 1.0 };
                let bound = scale / (fan_in.max(1) as f64).sqrt();
                let uniform = nn::Init::Uniform { lo: -bound, up: bound };
                nn::LinearConfig { ws_init: uniform, bs_init: Some(uniform), bias }
            }
        }
    }

    /// The standard deviation of the relative-position embeddings `key_pe`.
    pub fn key_pe_std(&self, d_head: i64) -> f64 {
        match self.scheme {
            Scheme::Kaiming | Scheme::Normal(_) => 1.0 / (d_head as f64).sqrt(),
            Scheme::Official => 1.0,
        }
    }
}

/// How [`Attention::project_after_cache`] projects a window and lays out its keys and
/// values `(b, h, n, dh)`.
#[derive(Clone, Copy)]
pub enum Window<'a> {
    /// Every row, copied head-major: libtorch's batched products read `(b * h)`
    /// matrices of `(n, dh)`.
    Padded,
    /// Each stream's rows from its first `valid` one `(b, n)` on (zero before), as
    /// views of `(b, n, h dh)`: for the ragged attention, which reads any row stride and
    /// skips each stream's padding (`csrc/cache_grad.cpp`, `csrc/expire_attend.cpp`).
    Ragged { valid: &'a Tensor },
}

/// Keys and values of a window, heads split, and the span predictor's scores
/// ([`Attention::project_after_cache`]).
pub struct Projected {
    /// Keys `(b, h, n, dh)`.
    pub k: Tensor,
    /// Values `(b, h, n, dh)`.
    pub v: Tensor,
    /// `states w`: `(b, n)` of a vector `w`, `(b, n, g)` of a matrix (Expire-Span per
    /// key-value head).
    pub scores: Tensor,
}

/// The projections of one layer's attention: no biases on the papers' backbone, as in
/// the adaptive-span code; biases on GPT-2. A Llama-family layer adds grouped keys and
/// values (`kv_heads` of them, each read by `heads / kv_heads` query heads), RMSNorm on
/// each head's query and key (Qwen3) and the rotary positions, applied where the
/// positions are known ([`Attention::rotate`]).
#[derive(Debug)]
pub struct Attention {
    q: Adapted,
    k: Adapted,
    v: Adapted,
    o: Adapted,
    heads: i64,
    kv_heads: i64,
    d_head: i64,
    /// RMSNorm weights `(dh)` on each head's query and key, and the epsilon (Qwen3).
    qk_norm: Option<(Tensor, Tensor, f64)>,
    rope: Option<Rope>,
    /// Dropout probability on the attention weights.
    pub dropout: f64,
}

impl Attention {
    /// Projections `d_model -> d_model` for queries, keys, values and the output, with
    /// biases when `bias`, from tch's default initialisation.
    pub fn new(p: nn::Path, d_model: i64, heads: i64, dropout: f64, bias: bool) -> Self {
        Attention::with_init(p, d_model, heads, dropout, bias, LinearInit::KAIMING)
    }

    /// [`Attention::new`] with the initialisation `init`.
    pub fn with_init(p: nn::Path, d_model: i64, heads: i64, dropout: f64, bias: bool, init: LinearInit) -> Self {
        let linear = |name: &str, residual| Adapted::plain(init.linear(&p / name, d_model, d_model, bias, residual));
        Attention {
            q: linear("q", false),
            k: linear("k", false),
            v: linear("v", false),
            o: linear("o", true),
            heads,
            kv_heads: heads,
            d_head: d_model / heads,
            qk_norm: None,
            rope: None,
            dropout,
        }
    }

    /// A Llama-family layer's attention (`model.arch = "llama"`): queries `d -> heads
    /// dh`, keys and values `d -> kv_heads dh` (biases with `qkv_bias`), the output
    /// `heads dh -> d` without bias, `q_norm` and `k_norm` with `qk_norm`, and the rotation.
    pub fn llama(p: nn::Path, cfg: &ModelConfig) -> Self {
        let init = LinearInit::of(cfg);
        let (d, dh, heads, kv) = (cfg.d_model as i64, cfg.head_dim() as i64, cfg.heads as i64, cfg.kv_heads() as i64);
        let bias = cfg.llama.qkv_bias;
        let ones = || nn::Init::Const(1.0);
        let qk_norm = cfg.llama.qk_norm.then(|| {
            ((&p / "q_norm").var("weight", &[dh], ones()), (&p / "k_norm").var("weight", &[dh], ones()), cfg.norm_eps)
        });
        Attention {
            q: Adapted::plain(init.linear(&p / "q", d, heads * dh, bias, false)),
            k: Adapted::plain(init.linear(&p / "k", d, kv * dh, bias, false)),
            v: Adapted::plain(init.linear(&p / "v", d, kv * dh, bias, false)),
            o: Adapted::plain(init.linear(&p / "o", heads * dh, d, false, true)),
            heads,
            kv_heads: kv,
            d_head: dh,
            qk_norm,
            rope: Some(Rope::of(cfg, p.device())),
            dropout: cfg.dropout,
        }
    }

    /// Queries `(b, h, m, dh)` after `cached` earlier states and the keys
    /// `(b, h, cached + m, dh)` of those states and the block, rotated at their places in
    /// that window (RoPE sees only distances, so the window's first state may take
    /// position 0); the same tensors without rotary positions.
    pub fn rotate(&self, q: &Tensor, k: &Tensor, cached: i64) -> (Tensor, Tensor) {
        match &self.rope {
            Some(rope) => (rope.rotate_from(q, cached), rope.rotate_from(k, 0)),
            None => (q.shallow_clone(), k.shallow_clone()),
        }
    }

    /// Queries `(b, h, m, dh)` of a block after a cache of `cached` slots, and keys
    /// `(b, h, cached + m, dh)` of `[cache, block]` whose distances to the block's first
    /// query are `counter` `(b, cached + m)` (a block's own keys at `-j`): each rotated
    /// at the place it was written, the queries at `cached + j` and the keys at
    /// `cached - counter`, so that a query and a key are `counter + j` apart however the
    /// cache was compacted; with no slot deleted, the places [`Attention::rotate`]
    /// gives. The same tensors without rotary positions.
    pub fn rotate_by_counter(&self, q: &Tensor, k: &Tensor, counter: &Tensor) -> (Tensor, Tensor) {
        let Some(rope) = &self.rope else { return (q.shallow_clone(), k.shallow_clone()) };
        let cached = counter.size()[1] - q.size()[2];
        (rope.rotate_from(q, cached), rope.rotate_at(k, &(-counter + cached as f64)))
    }

    /// Keys or values `(b, n, kv_heads dh)` as `(b, h, n, dh)`: each key-value head
    /// repeated for the query heads of its group (a view of a copy, when grouped).
    fn split_kv_heads(&self, x: &Tensor) -> Tensor {
        if self.kv_heads == self.heads {
            return self.split_heads(x);
        }
        let (b, n, _) = x.size3().expect("keys must be (b, n, kv_heads dh)");
        let group = self.heads / self.kv_heads;
        x.view([b, n, self.kv_heads, 1, self.d_head])
            .expand([b, n, self.kv_heads, group, self.d_head], false)
            .reshape([b, n, self.heads, self.d_head])
            .transpose(1, 2)
    }

    /// A Llama layer's keys and values `(b, n, kv_heads dh)` as `(b, h, n, dh)` each,
    /// head-major, the keys normed per head (Qwen3's `k_norm`) where the layer has it.
    fn grouped(&self, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let k = self.split_kv_heads(k);
        let k = match &self.qk_norm {
            Some((_, w, eps)) => crate::llama::rms_norm(&k, w, *eps),
            None => k,
        };
        (k.contiguous(), self.split_kv_heads(v).contiguous())
    }

    /// Low-rank adapters of rank `rank`, scaled by `alpha / rank`, on the query, key,
    /// value and output maps, their parameters under `p` (the layer's attention path).
    pub fn adapt(&mut self, p: &nn::Path, rank: i64, alpha: f64) {
        for (name, map) in [("q", &mut self.q), ("k", &mut self.k), ("v", &mut self.v), ("o", &mut self.o)] {
            map.adapt(p / name, rank, alpha);
        }
    }

    /// Size of one head.
    pub fn d_head(&self) -> i64 {
        self.d_head
    }

    /// `(b, n, d)` -> `(b, h, n, dh)`.
    pub fn split_heads(&self, x: &Tensor) -> Tensor {
        let (b, n, _) = x.size3().expect("attention input must be (b, n, d)");
        x.view([b, n, self.heads, self.d_head]).transpose(1, 2) // (b, h, n, dh)
    }

    /// Queries of the block `x` `(b, m, d)`: `(b, h, m, dh)` (normed per head on Qwen3;
    /// not yet rotated).
    pub fn queries(&self, x: &Tensor) -> Tensor {
        let q = self.split_heads(&self.q.forward(x));
        match &self.qk_norm {
            Some((w, _, eps)) => crate::llama::rms_norm(&q, w, *eps),
            None => q,
        }
    }

    /// Keys and values of `states` `(b, n, d)`: each `(b, h, n, dh)`, laid out head-major
    /// ([`Attention::head_major`]).
    pub fn keys_values(&self, states: &Tensor) -> (Tensor, Tensor) {
        if self.rope.is_some() {
            return self.grouped(&self.k.forward(states), &self.v.forward(states));
        }
        (self.head_major(states, &self.k.linear()), self.head_major(states, &self.v.linear()))
    }

    /// [`Attention::keys_values`] of `states` `(b, n, d)`, a cache without gradient joined
    /// with a detached copy of `block` `(b, m, d)`: the same keys and values, with the
    /// gradient going to `block`, computed for its rows only ([`super::cache_grad`]).
    pub fn keys_values_after_cache(&self, states: &Tensor, block: &Tensor) -> Result<(Tensor, Tensor)> {
        let (k, v) = super::cache_grad::keys_values_after_cache(states, block, &self.k.linear(), &self.v.linear())?; // (b, n, d) each
        if self.rope.is_some() {
            return Ok(self.grouped(&k, &v));
        }
        Ok((self.split_heads(&k).contiguous(), self.split_heads(&v).contiguous()))
        // (b, h, n, dh) each
    }

    /// [`Attention::keys_values_after_cache`] and the scores `states w` `(b, n)` of the
    /// vector `w` `(d)` (Expire-Span's span predictor), their gradients to the block
    /// summed in one: keys and values `(b, h, n, dh)`, laid out for their reader
    /// ([`Window`]).
    pub fn project_after_cache(
        &self,
        states: &Tensor,
        block: &Tensor,
        w: &Tensor,
        window: Window,
    ) -> Result<Projected> {
        let (lk, lv) = (self.k.linear(), self.v.linear());
        let p = match window {
            Window::Ragged { valid } => super::cache_grad::project_ragged(states, block, valid, &lk, &lv, w, true)?,
            Window::Padded => super::cache_grad::project_after_cache(states, block, &lk, &lv, Some(w))?,
        };
        let scores = p.scores.ok_or_else(|| {
            lethe_core::error::LetheError::Invalid("the window's projection returned no scores".into())
        })?;
        if self.rope.is_some() {
            let (k, v) = self.grouped(&p.k, &p.v);
            return Ok(Projected { k, v, scores });
        }
        let (k, v) = (self.split_heads(&p.k), self.split_heads(&p.v));
        Ok(match window {
            Window::Padded => Projected { k: k.contiguous(), v: v.contiguous(), scores },
            Window::Ragged { .. } => Projected { k, v, scores },
        })
    }

    /// The projection `lin` of `states` `(b, n, d)` as `(b, h, n, dh)`, copied once into
    /// that layout: the attention's batched products read `(b * h)` matrices of `(n, dh)`,
    /// which `split_heads`' view of `(b, n, h, dh)` cannot give, so `matmul` copied the
    /// keys and values for every product (each query chunk's, and again in the backward
    /// pass). (The queries, `m` rows, are left as views: copying them once measured the
    /// same.) At the comparison model of `scripts/vs-official.sh` (d 256, blocks of 256 in 4 query chunks) a
    /// Transformer-XL L = 512 step went from 193 to 178 ms.
    fn head_major(&self, states: &Tensor, lin: &nn::Linear) -> Tensor {
        self.split_heads(&lin.forward(states)).contiguous() // (b, h, n, dh)
    }

    /// Content-only attention of the block `h` `(b, m, d)` over `states` `(b, n, d)`, with
    /// the query, key and value projections detached: `(b, h, m, dh)`. This is the
    /// `attn(h, mem)` of the Compressive Transformer's attention-reconstruction loss,
    /// whose gradient must reach only the compression network (Rae et al., 2020, 3.2).
    pub fn detached_content_attention(&self, h: &Tensor, states: &Tensor) -> Tensor {
        let project = |x: &Tensor, lin: &nn::Linear| {
            self.split_heads(&x.linear(&lin.ws.detach(), lin.bs.as_ref().map(Tensor::detach)))
        };
        let (q, k, v) =
            (project(h, &self.q.linear()), project(states, &self.k.linear()), project(states, &self.v.linear()));
        let scores = q.matmul(&k.transpose(-2, -1)) / (self.d_head as f64).sqrt(); // (b, h, m, n)
        scores.softmax(-1, scores.kind()).matmul(&v)
    }

    /// Heads `(b, h, m, dh)` merged and projected: `(b, m, d)`.
    pub fn output(&self, context: &Tensor) -> Tensor {
        self.o.forward(&merge_heads(context))
    }
}

/// Heads `(b, h, m, dh)` concatenated: `(b, m, h·dh)`.
pub fn merge_heads(context: &Tensor) -> Tensor {
    let (b, h, m, dh) = context.size4().expect("context must be (b, h, m, dh)");
    context.transpose(1, 2).contiguous().view([b, m, h * dh])
}

/// Relative-position attention scores `(q·k + q·key_pe[dist]) / sqrt(dh)` for a window:
/// `m` queries after `cached` states, where a key at distance `dist = cached + i - j`
/// from query `i` is visible only within `[0, P - 1]`. The position term is laid out by
/// a skew (pad, reshape, slice; the adaptive-span code's `_skew`) instead of a gather,
/// which in training also spares the scatter of the gather's backward pass. Equal to
/// the gather (the tests' `relative_scores`) on every visible pair; the others (later
/// keys, and keys more than `P - 1` back) are `-inf`, the padding of the skew, so the
/// scores come out masked. Needs `cached <= P - 1`.
/// Shapes: `q` `(b, h, m, dh)`, `k` `(b, h, cached + m, dh)`, `key_pe` `(P, dh)`;
/// returns `(b, h, m, cached + m)`.
pub fn window_scores(q: &Tensor, k: &Tensor, key_pe: &Tensor, cached: i64) -> Result<Tensor> {
    let dh = q.size()[3];
    let q = q / (dh as f64).sqrt();
    let mut scores = q.matmul(&k.transpose(-2, -1)); // (b, h, m, n)
    scores += window_positions(&q, key_pe, cached, k.size()[2])?;
    Ok(scores)
}

/// The position term of [`window_scores`], `q·key_pe[dist]` for queries `q`
/// `(b, h, m, dh)` already divided by `sqrt(dh)`, over `n = cached + m` keys: `(b, h, m, n)`,
/// `-inf` where a key is later than the query or more than `P - 1` back.
pub fn window_positions(q: &Tensor, key_pe: &Tensor, cached: i64, n: i64) -> Result<Tensor> {
    let m = q.size()[2];
    if cached >= key_pe.size()[0] || n != cached + m {
        return Err(LetheError::Invalid(format!(
            "window positions: {cached} cached states and {m} queries over {n} keys, {:?} position rows",
            key_pe.size()
        )));
    }
    // No pair is further apart than n - 1: a cache shorter than the span (filling, or
    // trimmed by Adaptive-Span) needs only the first n rows.
    let p = key_pe.size()[0].min(n);
    // Column c of `flipped` is distance p-1-c; row i shifted right by i puts distance
    // cached+i-j at column j + (p-1-cached).
    let flipped = q.matmul(&part(key_pe, 0, 0, p).flip([0]).tr()); // (b, h, m, p)
    super::skew::skew(&flipped, cached, n) // (b, h, m, n)
}

/// Attention scores over a window: the content score `q·k / sqrt(dh)` plus its
/// [`window_bias`] (the learned relative positions when the layers have them; `-inf`
/// where a key may not be seen), the scores [`attend`] builds on the CPU.
/// Shapes: `q` `(b, h, m, dh)`, `k` `(b, h, cached + m, dh)`, `visible` `(m, n)`;
/// returns `(b, h, m, cached + m)`.
pub fn scores_over_window(
    q: &Tensor,
    k: &Tensor,
    key_pe: Option<&Tensor>,
    cached: i64,
    visible: &Tensor,
) -> Result<Tensor> {
    let dh = q.size()[3];
    let mut scores = (q / (dh as f64).sqrt()).matmul(&k.transpose(-2, -1)); // (b, h, m, n)

    // In place: the product's output is not needed for its backward pass.
    scores += window_bias(q, key_pe, cached, visible)?;
    Ok(scores)
}

/// Softmax over the keys of masked scores `(b, h, m, n)` (`-inf` where a key is not
/// visible), dropout, then the weighted sum of `v` `(b, h, n, dh)`: `(b, h, m, dh)`.
/// Every query must see at least one key.
pub fn mix(scores: &Tensor, v: &Tensor, dropout: f64, train: bool) -> Tensor {
    weigh(&scores.softmax(-1, scores.kind()), v, dropout, train)
}

/// [`mix`] from the weights, the scores' softmax already taken `(b, h, m, n)`: dropout
/// on the weights in training, then `weights · v` `(b, h, m, dh)`.
pub fn weigh(weights: &Tensor, v: &Tensor, dropout: f64, train: bool) -> Tensor {
    weights.dropout(dropout, train).matmul(v)
}

/// `len` entries of `t` from `start` along `dim` (a view); `t` itself when that is all of
/// it. A narrow over the whole dimension is a view too, but its backward pass fills a
/// zero tensor of the whole size and copies the gradient into it (`SliceBackward`): in
/// one-chunk attention that was 8 of those per step for the keys, values and queries.
pub fn part(t: &Tensor, dim: i64, start: i64, len: i64) -> Tensor {
    let size = t.size();
    let d = if dim < 0 { size.len() as i64 + dim } else { dim };
    if start == 0 && size.get(d as usize) == Some(&len) {
        return t.shallow_clone();
    }
    t.narrow(dim, start, len)
}

/// Attention with an additive bias: `softmax(q·k / sqrt(dh) + bias) v`, with dropout on
/// the weights in training. `bias` holds everything a mechanism adds to the content
/// score: the relative positions (`q·key_pe[dist] / sqrt(dh)`), `-inf` where a key may
/// not be seen, and `ln m` for a soft mask `m` applied after the softmax with
/// renormalisation, since `softmax(s) m / sum(softmax(s) m) = softmax(s + ln m)`.
///
/// On a GPU this is libtorch's fused `scaled_dot_product_attention` ([`fused`]; its
/// memory-efficient CUDA kernel takes a bias with a gradient). On the CPU it is the same
/// operations written out: libtorch's CPU kernel refuses a bias with a gradient (every
/// mechanism's has one, through the positions) and falls back to its reference path,
/// which checks for fully masked rows first and was about 4% slower on a training step
/// (`lethe bench`, Expire-Span, 2 threads); and the written-out path keeps the CPU's
/// figures what they were to the last bit.
/// Shapes: `q` `(b, h, m, dh)`, `k` and `v` `(b, h, n, dh)`, `bias` broadcastable to
/// `(b, h, m, n)`; returns `(b, h, m, dh)`. Every query must see at least one key.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, dropout: f64, train: bool) -> Tensor {
    if q.device().is_cuda() {
        return fused(q, k, v, bias, dropout, train);
    }
    let dh = q.size()[3];
    let mut scores = (q / (dh as f64).sqrt()).matmul(&k.transpose(-2, -1)); // (b, h, m, n)

    // In place: the product's output is not needed for its backward pass.
    scores += bias;
    mix(&scores, v, dropout, train)
}

/// [`attend`] through libtorch's `scaled_dot_product_attention`, on any device.
pub fn fused(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, dropout: f64, train: bool) -> Tensor {
    let p = if train { dropout } else { 0.0 };
    Tensor::scaled_dot_product_attention(q, k, v, Some(&aligned(bias)), p, false, None, false)
}

/// `bias`, copied when its first element is not aligned to 16 of its elements: the
/// memory-efficient CUDA kernel of `scaled_dot_product_attention` reads the bias in
/// aligned vectors. libtorch checks a bias's strides (and pads it when they are not
/// multiples of the alignment) but not where it starts, so a view that begins mid-row,
/// as the relative positions' skew does ([`window_positions`]), stopped the kernel with
/// "CUDA error: misaligned address" (an H100, libtorch 2.11; `tests/gpu.rs`). A copy
/// starts where the allocator puts it, aligned; the values and the gradient are the same.
/// A view that is not contiguous (the skew's) is copied once, by `contiguous`.
fn aligned(bias: &Tensor) -> Tensor {
    let alignment = 16 * bias.kind().elt_size_in_bytes();
    if (bias.data_ptr() as usize).is_multiple_of(alignment) {
        bias.shallow_clone()
    } else if !bias.is_contiguous() {
        bias.contiguous()
    } else {
        bias.copy()
    }
}

/// The bias of a window attention (see [`attend`]): the relative positions
/// `q·key_pe[dist] / sqrt(dh)` laid out by [`window_positions`] when the layers have
/// them, otherwise zero (GPT-2: its absolute positions are in its inputs already), and
/// `-inf` where a key is not `visible` `(m, n)`. `q` `(b, h, m, dh)`; returns
/// `(b, h, m, n)` with positions, `(m, n)` without.
pub fn window_bias(q: &Tensor, key_pe: Option<&Tensor>, cached: i64, visible: &Tensor) -> Result<Tensor> {
    match key_pe {
        Some(pe) => window_positions(&(q / (q.size()[3] as f64).sqrt()), pe, cached, visible.size()[1]),
        None => Ok(Tensor::zeros(visible.size(), (q.kind(), q.device()))
            .masked_fill(&visible.logical_not(), f64::NEG_INFINITY)),
    }
}

/// The smallest normal float16, `2^-14`: below it a half-precision mask's log loses
/// its gradient (a float32 floor rounds to zero in half precision).
const HALF_MIN_POSITIVE: f64 = 6.103515625e-5;

/// `ln m` of a soft mask `m` `(.., m, n)` in `[0, 1]` as an additive attention bias, and
/// `-inf` where `m = 0` or `visible` is false, with no infinite or undefined gradient:
/// `m` is floored at the smallest normal number of its precision before the log (float16
/// autocast computes it in half precision), and the floored entries are then replaced
/// (their gradient is zero).
pub fn log_mask(mask: &Tensor, visible: &Tensor) -> Tensor {
    log_mask_of_visible(mask, &visible.logical_and(&mask.gt(0.0)))
}

/// [`log_mask`] where `visible` is already false wherever `m = 0` (Expire-Span's is).
pub fn log_mask_of_visible(mask: &Tensor, visible: &Tensor) -> Tensor {
    let floor = match mask.kind() {
        Kind::Half => HALF_MIN_POSITIVE,
        _ => f64::from(f32::MIN_POSITIVE),
    };
    mask.clamp_min(floor).log().masked_fill(&visible.logical_not(), f64::NEG_INFINITY)
}

/// The distance index and visibility of a window attention: `m` queries that follow
/// `cached` earlier positions, each seeing itself and at most `span` earlier positions.
/// Returns `(dist, visible)`, both `(m, cached + m)`; `dist` is clamped to `[0, span]`.
pub fn window(cached: i64, m: i64, span: i64, device: tch::Device) -> (Tensor, Tensor) {
    let opts = (Kind::Int64, device);
    let query_pos = Tensor::arange(m, opts).unsqueeze(1) + cached; // (m, 1)
    let key_pos = Tensor::arange(cached + m, opts).unsqueeze(0); // (1, n)
    let dist = query_pos - key_pos; // (m, n)
    let visible = dist.ge(0).logical_and(&dist.le(span));
    (dist.clamp(0, span), visible)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (the GPU's "misaligned address"): the skew's view starts mid-row; the
    /// bias handed to `scaled_dot_product_attention` starts aligned, with the same values,
    /// and an aligned bias is passed as it is.
    #[test]
    fn the_fused_attention_s_bias_starts_aligned() {
        let flipped = lethe_core::rng::Rng::new(3).normal_tensor(&[2, 2, 5, 9], tch::Kind::Float); // (b, h, m, p)
        let view = super::super::skew::skew_views(&flipped, 3, 8); // (b, h, m, n), offset p - 1 - cached
        assert_ne!(view.data_ptr() as usize % 64, 0, "the skew's view starts mid-row");
        let bias = aligned(&view);
        assert_eq!(bias.data_ptr() as usize % 64, 0);
        assert!(bias.equal(&view));
        let whole = tch::Tensor::zeros([4, 16], (tch::Kind::Float, tch::Device::Cpu));
        assert_eq!(aligned(&whole).data_ptr(), whole.data_ptr(), "an aligned bias is not copied");
        // Contiguous but starting one element in: copied too.
        let shifted = tch::Tensor::arange(65, (tch::Kind::Float, tch::Device::Cpu)).narrow(0, 1, 64).view([4, 16]);
        assert!(shifted.is_contiguous());
        let copied = aligned(&shifted);
        assert_eq!(copied.data_ptr() as usize % 64, 0);
        assert!(copied.equal(&shifted));
    }

    /// `part` is the tensor itself over a whole dimension (no copy in either pass), a
    /// narrow otherwise, and the gradient reaches the tensor either way.
    #[test]
    fn part_of_a_whole_dimension_is_the_tensor_itself() {
        let t = Tensor::arange(24, (Kind::Double, tch::Device::Cpu)).view([2, 3, 4]).set_requires_grad(true);
        for (dim, start, len) in [(1, 0, 3), (-1, 0, 4), (1, 1, 2), (-1, 0, 3), (2, 1, 3)] {
            let case = format!("dim {dim}, {start}+{len}");
            let p = part(&t, dim, start, len);
            assert!(p.equal(&t.narrow(dim, start, len)), "{case}");
            let whole = start == 0 && len == t.size()[if dim < 0 { 2 } else { dim as usize }];
            assert_eq!(p.size() == t.size() && p.data_ptr() == t.data_ptr(), whole, "{case}");
            // d/dt sum(p^2) = 2 t inside the part, 0 outside.
            let inside = t.detach().zeros_like();
            let _ = inside.narrow(dim, start, len).fill_(1.0);
            let g = Tensor::run_backward(&[(&p * &p).sum(Kind::Double)], &[&t], false, false);
            assert!(g[0].equal(&(t.detach() * 2.0 * inside)), "{case}");
        }
    }

    /// The reference for [`window_scores`]: relative-position attention scores by a
    /// gather, `(q·k + q·key_pe[dist]) / sqrt(dh)`.
    ///
    /// `q` `(b, h, m, dh)`, `k` `(b, h, n, dh)`, `key_pe` `(P, dh)`, `dist` `(m, n)` the
    /// distance index of each query-key pair, already clamped to `[0, P)`. Returns `(b, h, m, n)`.
    fn relative_scores(q: &Tensor, k: &Tensor, key_pe: &Tensor, dist: &Tensor) -> Tensor {
        let (b, h, m, dh) = q.size4().expect("queries must be (b, h, m, dh)");
        let n = k.size()[2];
        // Scaling the queries, not the scores, divides m·dh numbers instead of m·n.
        let q = q / (dh as f64).sqrt();
        let mut scores = q.matmul(&k.transpose(-2, -1)); // (b, h, m, n)
        let by_distance = q.matmul(&key_pe.tr()); // (b, h, m, P)

        // In place: the product's output is not needed for its backward pass.
        scores += by_distance.gather(-1, &dist.expand([b, h, m, n], false), false); // (b, h, m, n)
        scores
    }

    /// libtorch's fused attention (the GPU's path) computes what the written-out one
    /// (the CPU's) does, with a bias that has `-inf` entries and a gradient, in value
    /// and in every gradient.
    #[test]
    fn the_fused_attention_equals_the_written_out_one() {
        let mut rng = lethe_core::rng::Rng::new(12);
        let q = rng.normal_tensor(&[2, 3, 5, 4], Kind::Double).set_requires_grad(true);
        let k = rng.normal_tensor(&[2, 3, 9, 4], Kind::Double).set_requires_grad(true);
        let v = rng.normal_tensor(&[2, 3, 9, 4], Kind::Double).set_requires_grad(true);
        let (_, visible) = window(4, 5, 6, tch::Device::Cpu);
        let bias = rng
            .normal_tensor(&[2, 3, 5, 9], Kind::Double)
            .masked_fill(&visible.logical_not(), f64::NEG_INFINITY)
            .set_requires_grad(true);
        let a = attend(&q, &k, &v, &bias, 0.0, true);
        let b = fused(&q, &k, &v, &bias, 0.0, true);
        assert!(a.allclose(&b, 1e-12, 1e-12, false));
        let w = rng.normal_tensor(&a.size(), Kind::Double);
        let inputs = [&q, &k, &v, &bias];
        let ga = Tensor::run_backward(&[(&a * &w).sum(Kind::Double)], &inputs, false, false);
        let gb = Tensor::run_backward(&[(&b * &w).sum(Kind::Double)], &inputs, false, false);
        for (x, y) in ga.iter().zip(&gb) {
            assert!(x.allclose(y, 1e-10, 1e-10, false));
        }
    }

    /// The window attention through a bias computes, on the CPU, exactly the scores and
    /// softmax it computed before the bias existed (the same operations, so the same
    /// bits), with positions and without.
    #[test]
    fn the_window_attention_through_a_bias_is_bitwise_the_old_one() {
        let mut rng = lethe_core::rng::Rng::new(13);
        let (cached, m, span) = (6, 4, 8);
        let q = rng.normal_tensor(&[2, 2, m, 4], Kind::Float);
        let k = rng.normal_tensor(&[2, 2, cached + m, 4], Kind::Float);
        let v = rng.normal_tensor(&[2, 2, cached + m, 4], Kind::Float);
        let pe = rng.normal_tensor(&[span + 1, 4], Kind::Float);
        let (_, visible) = window(cached, m, span, tch::Device::Cpu);
        // Before the bias: the skewed positions added to the scores (window_scores), or
        // the content scores masked in place.
        let content = (&q / 2.0).matmul(&k.transpose(-2, -1));
        let old_scores = [
            window_scores(&q, &k, &pe, cached).unwrap(),
            content.masked_fill(&visible.logical_not(), f64::NEG_INFINITY),
        ];
        for (key_pe, old_scores) in [Some(&pe), None].into_iter().zip(old_scores) {
            let old = mix(&old_scores, &v, 0.0, false);
            let new = attend(&q, &k, &v, &window_bias(&q, key_pe, cached, &visible).unwrap(), 0.0, false);
            assert!(old.equal(&new), "positions: {}", key_pe.is_some());
            assert!(
                scores_over_window(&q, &k, key_pe, cached, &visible).unwrap().equal(&old_scores),
                "positions: {}",
                key_pe.is_some()
            );
        }
    }

    fn t(v: &[f64], shape: &[i64]) -> Tensor {
        Tensor::from_slice(v).view(shape)
    }

    #[test]
    fn keys_and_values_come_head_major_with_the_projection_s_numbers() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let attn = Attention::new(vs.root(), 8, 2, 0.0, true);
        let states = lethe_core::rng::Rng::new(14).normal_tensor(&[3, 5, 8], Kind::Float);
        let (k, v) = attn.keys_values(&states);
        for (t, lin) in [(&k, &attn.k), (&v, &attn.v)] {
            assert_eq!(t.size(), [3, 2, 5, 4]);
            assert!(t.is_contiguous(), "batched products read (b * h, n, dh) as a view");
            assert!(t.equal(&attn.split_heads(&lin.forward(&states))));
        }
    }

    #[test]
    fn window_sees_itself_and_span_earlier_positions() {
        let (dist, vis) = window(2, 3, 2, tch::Device::Cpu);
        // query 0 is at position 2; keys 0..5
        let d: Vec<i64> = dist.flatten(0, -1).try_into().unwrap();
        assert_eq!(d, vec![2, 1, 0, 0, 0, 2, 2, 1, 0, 0, 2, 2, 2, 1, 0]);
        let v: Vec<bool> = vis.flatten(0, -1).try_into().unwrap();
        let expect =
            [[true, true, true, false, false], [false, true, true, true, false], [false, false, true, true, true]];
        assert_eq!(v, expect.concat());
    }

    /// The skewed window scores equal the gathered ones wherever a key is visible and
    /// are `-inf` elsewhere,
    /// for a cache that is filling, full, or empty, and their gradients agree.
    #[test]
    fn window_scores_equal_relative_scores_on_visible_keys() {
        let mut rng = lethe_core::rng::Rng::new(11);
        for (cached, m, span) in [(0, 3, 4), (2, 3, 4), (4, 3, 4), (5, 5, 5), (1, 4, 9)] {
            let n = cached + m;
            let q = rng.normal_tensor(&[2, 3, m, 4], Kind::Double).set_requires_grad(true);
            let k = rng.normal_tensor(&[2, 3, n, 4], Kind::Double);
            let pe = rng.normal_tensor(&[span + 1, 4], Kind::Double).set_requires_grad(true);
            let (dist, vis) = window(cached, m, span, tch::Device::Cpu);
            let hidden = vis.logical_not();
            let skewed = window_scores(&q, &k, &pe, cached).unwrap();
            assert!(skewed.isinf().equal(&hidden.expand_as(&skewed)), "the invisible keys, and only they, are -inf");
            let gathered = relative_scores(&q, &k, &pe, &dist).masked_fill(&hidden, 0.0);
            let skewed = skewed.masked_fill(&hidden, 0.0);
            assert!(gathered.allclose(&skewed, 1e-12, 1e-12, false), "cached {cached}, m {m}, span {span}");
            let w = rng.normal_tensor(&gathered.size(), Kind::Double);
            let g1 = Tensor::run_backward(&[(&gathered * &w).sum(Kind::Double)], &[&q, &pe], false, false);
            let g2 = Tensor::run_backward(&[(&skewed * &w).sum(Kind::Double)], &[&q, &pe], false, false);
            for (a, b) in g1.iter().zip(&g2) {
                assert!(a.allclose(b, 1e-10, 1e-10, false));
            }
        }
    }

    /// One head, dh = 2, two keys: scores and mix computed by hand.
    #[test]
    fn relative_scores_and_mix_match_a_hand_computation() {
        let q = t(&[1.0, 0.0, 0.0, 1.0], &[1, 1, 2, 2]); // queries q0 = (1,0), q1 = (0,1)
        let k = t(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]); // keys k0 = (1,2), k1 = (3,4)
        let key_pe = t(&[0.5, 0.0, 0.0, 0.25], &[2, 2]); // pe[0] = (.5,0), pe[1] = (0,.25)
        let (dist, vis) = window(0, 2, 1, tch::Device::Cpu);
        let s = relative_scores(&q, &k, &key_pe, &dist);
        let s: Vec<f64> = s.flatten(0, -1).try_into().unwrap();
        let r = 2f64.sqrt();
        // q0·k0 + q0·pe[0] = 1 + .5; q0·k1 (masked later, dist clamped 0) = 3 + .5
        // q1·k0 + q1·pe[1] = 2 + .25; q1·k1 + q1·pe[0] = 4 + 0
        let expect = [1.5 / r, 3.5 / r, 2.25 / r, 4.0 / r];
        for (a, b) in s.iter().zip(expect) {
            assert!((a - b).abs() < 1e-12, "{s:?}");
        }
        let v = t(&[10.0, 0.0, 0.0, 10.0], &[1, 1, 2, 2]);
        let scores = t(&expect, &[1, 1, 2, 2]).masked_fill(&vis.logical_not(), f64::NEG_INFINITY);
        let out: Vec<f64> = mix(&scores, &v, 0.0, false).flatten(0, -1).try_into().unwrap();
        // query 0 sees only key 0; query 1 mixes both with softmax weights
        let w1 = 1.0 / (1.0 + ((2.25 - 4.0) / r).exp());
        let expect = [10.0, 0.0, 10.0 * (1.0 - w1), 10.0 * w1];
        for (a, b) in out.iter().zip(expect) {
            assert!((a - b).abs() < 1e-9, "{out:?} vs {expect:?}");
        }
    }
}
