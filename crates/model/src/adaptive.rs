//! Adaptive input (Baevski and Auli, 2019) and adaptive softmax (Grave et al., 2017),
//! tied as in Transformer-XL's word-level models (its `AdaptiveEmbedding` and
//! `ProjectedAdaptiveLogSoftmax` with `tie_weight` and `tie_projs`), which the ∞-former
//! paper's appendix D trains on Wikitext-103 (cut-offs 20000, 40000, 200000).
//!
//! The vocabulary, numbered most frequent first, is cut into clusters at `cutoffs`:
//! `[0, c_1)`, `[c_1, c_2)`, ..., `[c_n, V)`. Cluster `i` has an embedding `E_i` of
//! `(n_i, d_i)` with `d_i = d / div_val^i`, a projection `P_i` of `(d, d_i)` when
//! `d_i < d`, and an output bias `b_i`; `E_i` and `P_i` serve input and output alike.
//!
//! - **Input**: token `w` of cluster `i` becomes `sqrt(d) · P_i E_i[w - c_i]`.
//! - **Output**: the head scores the words of cluster 0 and one entry per tail cluster,
//!   `head = log_softmax([h E_0ᵀ + b_0, h W_cᵀ + b_c])`; a word of tail cluster `i`
//!   gets `log p(w) = head[c_1 + i - 1] + log_softmax(h P_i E_iᵀ + b_i)[w - c_i]`.
//!   Every tail's softmax sums to 1, so the probabilities of all `V` words do too.

use tch::{nn, Tensor};

use crate::undrawn::var;
use lethe_core::config::ModelConfig;

/// The tied adaptive input and softmax of one model.
pub struct Adaptive {
    d: i64,
    /// Cluster bounds `[0, c_1, ..., c_n, V]`.
    bounds: Vec<i64>,
    /// Per cluster, the embedding `(n_i, d_i)`.
    emb: Vec<Tensor>,
    /// Per cluster, the projection `(d, d_i)`; none where `d_i = d`.
    proj: Vec<Option<Tensor>>,
    /// Per cluster, the output bias `(n_i)`.
    bias: Vec<Tensor>,
    /// The head's entries for the tail clusters: `(n, d)` and `(n)`.
    cluster_weight: Tensor,
    cluster_bias: Tensor,
}

impl Adaptive {
    /// Parameters under `p` (`emb.<i>`, `proj.<i>`, `bias.<i>`, `cluster.weight`,
    /// `cluster.bias`), initialised as Transformer-XL: N(0, 0.02) weights, N(0, 0.01)
    /// projections, zero biases. `cfg.cutoffs` must be validated and non-empty.
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> Adaptive {
        let d = cfg.d_model as i64;
        let mut bounds = vec![0];
        bounds.extend(cfg.cutoffs.iter().map(|&c| c as i64));
        bounds.push(cfg.vocab as i64);
        let (mut emb, mut proj, mut bias) = (vec![], vec![], vec![]);
        for i in 0..bounds.len() - 1 {
            let n = bounds[i + 1] - bounds[i];
            let di = (d / (cfg.div_val as i64).pow(i as u32)).max(1);
            let name = i.to_string();
            emb.push(var(&(p / "emb"), &name, &[n, di], nn::Init::Randn { mean: 0.0, stdev: 0.02 }));
            let proj_init = nn::Init::Randn { mean: 0.0, stdev: 0.01 };
            proj.push((di != d).then(|| var(&(p / "proj"), &name, &[d, di], proj_init)));
            bias.push((p / "bias").zeros(&name, &[n]));
        }
        let tails = bounds.len() as i64 - 2;
        let cluster_weight = var(&(p / "cluster"), "weight", &[tails, d], nn::Init::Randn { mean: 0.0, stdev: 0.02 });
        let cluster_bias = (p / "cluster").zeros("bias", &[tails]);
        Adaptive { d, bounds, emb, proj, bias, cluster_weight, cluster_bias }
    }

    fn clusters(&self) -> usize {
        self.emb.len()
    }

    /// The input vectors of `tokens` `(b, m)`: `(b, m, d)`.
    pub fn embed(&self, tokens: &Tensor) -> Tensor {
        let size = tokens.size();
        let flat = tokens.flatten(0, -1); // (N)
        let mut out = Tensor::zeros([flat.size()[0], self.d], (self.emb[0].kind(), self.emb[0].device()));
        for i in 0..self.clusters() {
            let (lo, hi) = (self.bounds[i], self.bounds[i + 1]);
            let at = flat.ge(lo).logical_and(&flat.lt(hi)).nonzero().squeeze_dim(1); // (k)
            if at.numel() == 0 {
                continue;
            }
            let mut e = self.emb[i].index_select(0, &(flat.index_select(0, &at) - lo)); // (k, d_i)
            if let Some(p) = &self.proj[i] {
                e = e.matmul(&p.tr()); // (k, d)
            }
            out = out.index_add(0, &at, &e);
        }
        (out * (self.d as f64).sqrt()).view([size[0], size[1], self.d]) // (b, m, d)
    }

    /// The log-probability of each of `targets` `(b, m)` after `h` `(b, m, d)`: `(b, m)`,
    /// the entries of [`Adaptive::log_probs`] at the targets, without its `(b, m, V)`
    /// tensor: a tail cluster's scores are computed only where a target falls in it (what
    /// makes training on a vocabulary of 267k words affordable).
    pub fn target_log_probs(&self, h: &Tensor, targets: &Tensor) -> Tensor {
        let (size, head_size) = (targets.size(), self.bounds[1]);
        let h = h.reshape([-1, self.d]); // (N, d)
        let t = targets.flatten(0, -1); // (N)
        let head = Tensor::cat(
            &[h.matmul(&self.emb[0].tr()) + &self.bias[0], h.matmul(&self.cluster_weight.tr()) + &self.cluster_bias],
            -1,
        )
        .log_softmax(-1, h.kind()); // (N, c_1 + tails)
        let mut out = Tensor::zeros([t.size()[0]], (h.kind(), h.device()));
        for i in 0..self.clusters() {
            let (lo, hi) = (self.bounds[i], self.bounds[i + 1]);
            let at = t.ge(lo).logical_and(&t.lt(hi)).nonzero().squeeze_dim(1); // (k)
            if at.numel() == 0 {
                continue;
            }
            let rows = head.index_select(0, &at); // (k, c_1 + tails)
            let logp = if i == 0 {
                rows.gather(1, &t.index_select(0, &at).unsqueeze(1), false).squeeze_dim(1)
            } else {
                let mut hi_ = h.index_select(0, &at); // (k, d)
                if let Some(p) = &self.proj[i] {
                    hi_ = hi_.matmul(p); // (k, d_i)
                }
                let tail = (hi_.matmul(&self.emb[i].tr()) + &self.bias[i]).log_softmax(-1, h.kind()); // (k, n_i)
                let word = tail.gather(1, &(t.index_select(0, &at) - lo).unsqueeze(1), false).squeeze_dim(1);
                word + rows.select(1, head_size + i as i64 - 1)
            };
            out = out.index_add(0, &at, &logp);
        }
        out.view(size.as_slice()) // (b, m)
    }

    /// Evaluation's figures after each of `h` `(b, m, d)`: the log-probability of each of
    /// `targets` `(b, m)` and the most likely word `(b, m)`, both read from the whole
    /// distribution, made for at most `rows` positions at a time (each needs a score per
    /// word).
    pub fn score_in_chunks(&self, h: &Tensor, targets: &Tensor, rows: i64) -> (Tensor, Tensor) {
        let size = targets.size();
        let flat = h.reshape([-1, self.d]); // (N, d)
        let flat_targets = targets.reshape([-1, 1]); // (N, 1)
        let (mut logp, mut best) = (vec![], vec![]);
        for (chunk, t) in flat.split(rows.max(1), 0).iter().zip(flat_targets.split(rows.max(1), 0)) {
            let all = self.log_probs(chunk); // (rows, V)
            logp.push(all.gather(1, &t, false).squeeze_dim(1));
            best.push(all.argmax(-1, false));
        }
        (Tensor::cat(&logp, 0).view(size.as_slice()), Tensor::cat(&best, 0).view(size.as_slice()))
        // (b, m) each
    }

    /// The log-probability of every word after each of `h` `(b, m, d)`: `(b, m, V)`.
    pub fn log_probs(&self, h: &Tensor) -> Tensor {
        let head_size = self.bounds[1];
        let head = Tensor::cat(
            &[h.matmul(&self.emb[0].tr()) + &self.bias[0], h.matmul(&self.cluster_weight.tr()) + &self.cluster_bias],
            -1,
        )
        .log_softmax(-1, h.kind()); // (b, m, c_1 + tails)
        let mut parts = vec![head.narrow(-1, 0, head_size)];
        for i in 1..self.clusters() {
            let hi = match &self.proj[i] {
                Some(p) => h.matmul(p), // (b, m, d_i)
                None => h.shallow_clone(),
            };
            let tail = (hi.matmul(&self.emb[i].tr()) + &self.bias[i]).log_softmax(-1, h.kind()); // (b, m, n_i)
            parts.push(tail + head.narrow(-1, head_size + i as i64 - 1, 1));
        }
        Tensor::cat(&parts, -1)
    }
}
