//! Rotary position embeddings (Su et al., 2021, RoFormer Eq. 34), as the Llama family
//! uses them: each query and key of a head of width `dh` turned, pair `(i, i + dh / 2)`
//! by the angle `p theta^(-2i / dh)` at its position `p`, so that a score `q_p · k_s`
//! depends on the distance `p - s` only. Llama 3 scales the low frequencies
//! (`rope_type = "llama3"`). Shared by the decoder read from a folder ([`crate::llama`])
//! and the trainable backbone (`model.arch = "llama"`, [`crate::attention`]).

use tch::{Kind, Tensor};

use lethe_core::config::ModelConfig;

/// Llama 3's scaling of RoPE's frequencies (`rope_type = "llama3"`).
#[derive(Clone, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// The inverse frequencies `(head_dim / 2)`, in float32 as `transformers` computes them.
pub fn inverse_frequencies(head_dim: i64, theta: f64, scaling: Option<&Llama3Scaling>) -> Tensor {
    let exponent = Tensor::arange_start_step(0, head_dim, 2, (Kind::Int64, tch::Device::Cpu)).to_kind(Kind::Float)
        / head_dim as f64;
    let base = Tensor::from(theta as f32);
    let inv = base.pow(&exponent).reciprocal();
    let Some(s) = scaling else { return inv };
    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    // Scalars over tensors in float32, as `transformers` divides them.
    let over = |scalar: f64, t: &Tensor| Tensor::from(scalar as f32) / t;
    let wavelen = over(2.0 * std::f64::consts::PI, &inv);
    let scaled = (&inv / s.factor).where_self(&wavelen.gt(low_wavelen), &inv);
    let smooth = (over(s.original_max_position_embeddings, &wavelen) - s.low_freq_factor)
        / (s.high_freq_factor - s.low_freq_factor);
    let smoothed: Tensor = (-&smooth + 1.0) * &scaled / s.factor + &smooth * &scaled;
    let medium = wavelen.lt(high_wavelen).logical_not().logical_and(&wavelen.gt(low_wavelen).logical_not());
    smoothed.where_self(&medium, &scaled)
}

/// One layer's rotation: the inverse frequencies of its heads.
#[derive(Debug)]
pub struct Rope {
    inv_freq: Tensor,
}

impl Rope {
    /// The rotation `[model.llama]` sets for heads of `cfg.head_dim()`, on `device`.
    pub fn of(cfg: &ModelConfig, device: tch::Device) -> Rope {
        let l = &cfg.llama;
        let scaling = (l.rope_factor > 0.0).then_some(Llama3Scaling {
            factor: l.rope_factor,
            low_freq_factor: l.rope_low_freq_factor,
            high_freq_factor: l.rope_high_freq_factor,
            original_max_position_embeddings: l.rope_original_positions as f64,
        });
        let inv_freq = inverse_frequencies(cfg.head_dim() as i64, l.rope_theta, scaling.as_ref());
        Rope { inv_freq: inv_freq.to_device(device) }
    }

    /// `cos` and `sin` `(t, head_dim)` of the positions `(t)`.
    pub fn rotation(inv_freq: &Tensor, positions: &Tensor) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(1) * inv_freq.unsqueeze(0); // (t, hd / 2)
        let angles = Tensor::cat(&[&freqs, &freqs], 1);
        (angles.cos(), angles.sin())
    }

    /// `x` `(b, h, n, head_dim)` rotated at the positions `start, ..., start + n - 1`.
    pub fn rotate_from(&self, x: &Tensor, start: i64) -> Tensor {
        let n = x.size()[2];
        let positions = Tensor::arange_start(start, start + n, (Kind::Int64, x.device()));
        let (cos, sin) = Rope::rotation(&self.inv_freq, &positions);
        rotate(x, &cos.to_kind(x.kind()), &sin.to_kind(x.kind()))
    }
}

impl Rope {
    /// `x` `(b, h, n, head_dim)` rotated at per-stream positions `(b, n)` (any numeric
    /// kind; a position may be negative or fractional).
    pub fn rotate_at(&self, x: &Tensor, positions: &Tensor) -> Tensor {
        let (b, n) = positions.size2().expect("positions must be (b, n)");
        let (cos, sin) = Rope::rotation(&self.inv_freq, &positions.reshape([b * n]));
        let per_stream = |t: Tensor| t.view([b, 1, n, -1]).to_kind(x.kind()); // (b, 1, n, hd)
        rotate(x, &per_stream(cos), &per_stream(sin))
    }
}

/// `x` `(b, n, t, hd)` rotated by `cos` and `sin` `(t, hd)` (or any shape broadcasting to `x`'s): `x cos + rotate_half(x) sin`.
pub fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let rotated = Tensor::cat(&[-x.narrow(3, half, half), x.narrow(3, 0, half)], 3);
    x * cos + rotated * sin
}
