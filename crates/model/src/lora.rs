//! Low-rank adapters (Hu et al., 2021, "LoRA", Eq. 3): a map `W` kept frozen and a
//! trained update of rank `r`, `h = W x + (alpha / r) B A x`, with `A` `(r, in)` drawn
//! from Kaiming's uniform distribution and `B` `(out, r)` zero (PEFT's initialisation),
//! so that training starts from the pretrained model exactly. lethe puts them on every
//! attention layer's query, key, value and output maps (`train.lora_rank`,
//! `train.lora_alpha`), the rest of the model frozen (`train.freeze_base`).
//!
//! The adapted map is handed to its readers as one linear layer of weight
//! `W + (alpha / r) B A`: the window's projection (`crate::cache_grad`) then gives the
//! block's rows the gradient of the adapted map and `A`, `B` theirs through autograd, with
//! no second path for the adapters. At rank 8 on a 576-wide map the update costs 2.7
//! MFLOP a block, against the projection's `n x 576 x 576`.

use tch::{nn, Tensor};

/// A linear map with an optional low-rank adapter.
#[derive(Debug)]
pub struct Adapted {
    base: nn::Linear,
    adapter: Option<Adapter>,
}

/// `A` `(r, in)`, `B` `(out, r)` and the scale `alpha / r`.
#[derive(Debug)]
struct Adapter {
    a: Tensor,
    b: Tensor,
    scale: f64,
}

/// The suffixes of the adapters' parameters (`layers.<i>.attn.q.lora_a`, ...).
const NAMES: [&str; 2] = ["lora_a", "lora_b"];

/// Whether the parameter `name` is a low-rank adapter's (trained when the rest is frozen).
pub fn is_adapter(name: &str) -> bool {
    NAMES.iter().any(|n| name.ends_with(&format!(".{n}")))
}

impl Adapted {
    /// `base` without an adapter.
    pub fn plain(base: nn::Linear) -> Adapted {
        Adapted { base, adapter: None }
    }

    /// Adds an adapter of rank `rank` scaled by `alpha / rank`, its parameters under `p`
    /// (the map's own path).
    pub fn adapt(&mut self, p: nn::Path, rank: i64, alpha: f64) {
        let (out, inp) = (self.base.ws.size()[0], self.base.ws.size()[1]);
        // PEFT's `kaiming_uniform_(A, a=sqrt(5))`: bound 1 / sqrt(in).
        let bound = 1.0 / (inp as f64).sqrt();
        let a = crate::undrawn::var(&p, "lora_a", &[rank, inp], nn::Init::Uniform { lo: -bound, up: bound });
        let b = p.var("lora_b", &[out, rank], nn::Init::Const(0.0));
        self.adapter = Some(Adapter { a, b, scale: alpha / rank as f64 });
    }

    /// The adapted map as one linear layer: weight `W + (alpha / r) B A` (with the
    /// adapters' gradient), the same bias.
    pub fn linear(&self) -> nn::Linear {
        let ws = match &self.adapter {
            Some(ad) => &self.base.ws + ad.b.matmul(&ad.a) * ad.scale,
            None => self.base.ws.shallow_clone(),
        };
        nn::Linear { ws, bs: self.base.bs.as_ref().map(Tensor::shallow_clone) }
    }

    /// `x W^T + b`, adapted.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let lin = self.linear();
        x.linear(&lin.ws, lin.bs.as_ref())
    }
}

/// `params` (name, tensor) with every adapter folded into the map it adapts,
/// `W + (alpha / r) B A`, and removed: what a folder without adapters holds.
pub fn merged(
    params: &std::collections::HashMap<String, Tensor>,
    rank: usize,
    alpha: f64,
) -> std::collections::HashMap<String, Tensor> {
    let scale = alpha / rank.max(1) as f64;
    let mut out: std::collections::HashMap<String, Tensor> =
        params.iter().filter(|(n, _)| !is_adapter(n)).map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
    for (name, a) in params.iter().filter(|(n, _)| n.ends_with(".lora_a")) {
        let map = name.trim_end_matches(".lora_a");
        let (Some(b), Some(w)) = (params.get(&format!("{map}.lora_b")), params.get(&format!("{map}.weight"))) else {
            continue;
        };
        let folded = tch::no_grad(|| w + b.matmul(a) * scale);
        out.insert(format!("{map}.weight"), folded);
    }
    out
}
