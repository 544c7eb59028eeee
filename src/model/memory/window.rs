//! The sliding-window cache shared by the window-based memories: Transformer-XL
//! ([`super::fixed`]), Adaptive-Span ([`super::adaptive`]), and the short-term memories
//! of the Compressive Transformer ([`super::compressive`]) and the ∞-former
//! ([`super::infinity`]). It keeps a layer's last input states (detached) and, per recent
//! `(cached, m)` shape, the distance and visibility masks of a window of `span`
//! (Transformer-XL's `C_t = {t-L, ..., t-1}`), built once and reused.

use std::collections::HashMap;

use tch::Tensor;

use super::layer::{mem_rows, same_episode, with_cached_episodes, AttendInput};
use crate::error::{LetheError, Result};
use crate::model::attention::{attend, window, window_bias};

/// `[prev, x]` along the time axis of `(b, n, d)` states; `x` alone when there is no `prev`.
pub(crate) fn concat_time(prev: Option<&Tensor>, x: &Tensor) -> Tensor {
    match prev {
        Some(p) => Tensor::cat(&[p, x], 1),
        None => x.shallow_clone(),
    }
}

/// The last `keep` states of `all` `(b, n, d)` (all of them when there are fewer).
pub(crate) fn keep_last(all: Tensor, keep: i64) -> Tensor {
    let n = all.size()[1];
    if n > keep {
        all.narrow(1, n - keep, keep).contiguous()
    } else {
        all
    }
}

/// How far back a query of a block of `m` sees, for a memory of `span`: the span, and
/// never less than the block itself (on GPT-2 `memory.span` may be shorter than the
/// block, even 0, and a query still sees its block up to itself).
pub(crate) fn reach(span: i64, m: i64) -> i64 {
    span.max(m - 1)
}

/// Mean over `m` queries that follow `cached` states of the earlier positions each one
/// sees within a window of `span`.
pub(crate) fn window_mem_size(cached: i64, m: i64, span: i64) -> f64 {
    (0..m).map(|q| (cached + q).min(span) as f64).sum::<f64>() / m as f64
}

/// Most `(cached, m)` mask shapes a [`WindowCache`] keeps. While the cache fills, every
/// block has a new shape; keeping them all cost `L / M` masks of `M x L` (9.6 GB for
/// L = 32k, M = 256), so older shapes are dropped and only the steady ones stay.
const MAX_WINDOW_SHAPES: usize = 4;

/// A sliding window over a layer's past inputs, shared by the window-based memories
/// (Transformer-XL, Adaptive-Span, the Compressive Transformer's and the ∞-former's
/// short-term memory): the cached states, and the distance and visibility masks of the
/// recent `(cached, m)` shapes, built once and reused.
#[derive(Default)]
pub(crate) struct WindowCache {
    cache: Option<Tensor>,
    /// The episode of each cached state `(b, cached)`, when the stream has episodes.
    episodes: Option<Tensor>,
    windows: HashMap<(i64, i64), (Tensor, Tensor)>,
    /// The last block given to [`WindowCache::keys`] and `[cache, block]` as built
    /// there (detached), so that [`WindowCache::append`] of the same block reuses the
    /// concatenation instead of copying the cache again.
    last: Option<(Tensor, Tensor)>,
}

/// Keys and values of `[cache, block]` with the window masks.
pub(crate) struct WindowKeys {
    /// Keys `(b, h, n, dh)`.
    pub k: Tensor,
    /// Values `(b, h, n, dh)`.
    pub v: Tensor,
    /// Distance index `(m, n)`, clamped to `[0, span]`.
    pub dist: Tensor,
    /// Which keys each query may see, `(m, n)`.
    pub visible: Tensor,
    /// Cached states before the block.
    pub cached: i64,
    /// Which keys are of the query's own episode, `(b, m, n)`, when there are episodes.
    pub same: Option<Tensor>,
}

impl WindowCache {
    /// States held.
    pub fn len(&self) -> i64 {
        self.cache.as_ref().map_or(0, |c| c.size()[1])
    }

    /// Keys, values and masks for the block of `input`, each query seeing itself and at
    /// most `span` earlier positions.
    pub fn keys(&mut self, input: &AttendInput, span: i64) -> WindowKeys {
        let m = input.x.size()[1];
        let cached = self.len();
        let states = concat_time(self.cache.as_ref(), input.x); // (b, cached + m, d)
        let (k, v) = input.attn.keys_values(&states); // (b, h, n, dh)
        self.last = Some((input.x.shallow_clone(), states.detach()));
        let device = input.x.device();
        if !self.windows.contains_key(&(cached, m)) && self.windows.len() >= MAX_WINDOW_SHAPES {
            self.windows.clear();
        }
        let reach = reach(span, m);
        let (dist, visible) = self.windows.entry((cached, m)).or_insert_with(|| window(cached, m, reach, device));
        let same = input.episodes.map(|e| same_episode(e, &with_cached_episodes(self.episodes.as_ref(), cached, e)));
        WindowKeys { k, v, dist: dist.shallow_clone(), visible: visible.shallow_clone(), cached, same }
    }

    /// Attention of the block of `input` over the window, each query seeing itself and
    /// at most `span` earlier positions: the context `(b, h, m, dh)`, and the mean number
    /// of earlier positions the queries saw, per stream (one value when every stream has
    /// the same).
    pub fn attend(&mut self, input: &AttendInput, span: i64) -> (Tensor, Vec<f64>) {
        let m = input.x.size()[1];
        let w = self.keys(input, span);
        let bias = window_bias(input.q, input.key_pe, w.cached, &w.visible); // (b, h, m, n), or (m, n) without positions
        let (bias, mem_rows) = match &w.same {
            None => (bias, vec![window_mem_size(w.cached, m, reach(span, m))]),
            Some(same) => (
                bias.masked_fill(&same.logical_not().unsqueeze(1), f64::NEG_INFINITY), // (b, h or 1, m, n)
                mem_rows(&w.visible.logical_and(same).logical_and(&w.dist.ge(1))), // from (b, m, n)
            ),
        };
        let context = attend(input.q, &w.k, &w.v, &bias, input.attn.dropout, input.train);
        (context, mem_rows)
    }

    /// Appends the block `x` `(b, m, d)`, with its positions' episodes `(b, m)` when the
    /// stream has episodes, and keeps the last `keep` states. Returns the states that
    /// left the window, oldest first, if any.
    /// The cache may be a view of the last concatenation (no copy); the next block's
    /// concatenation copies it once.
    pub fn append(&mut self, x: &Tensor, episodes: Option<&Tensor>, keep: i64) -> Option<Tensor> {
        self.episodes = episodes.map(|e| keep_last(with_cached_episodes(self.episodes.as_ref(), self.len(), e), keep));
        let all = match self.last.take() {
            // The block the keys were built for (the same storage, kept alive by the
            // clone, so an equal pointer is the same tensor): its concatenation is `all`.
            Some((block, all)) if block.data_ptr() == x.data_ptr() && block.size() == x.size() => all,
            _ => concat_time(self.cache.as_ref(), x),
        };
        let n = all.size()[1];
        let evicted = (n > keep).then(|| all.narrow(1, 0, n - keep));
        self.cache = Some(if n > keep { all.narrow(1, n - keep, keep) } else { all });
        evicted
    }

    /// The states that [`WindowCache::append`] of the block `x` would evict when keeping
    /// `keep`, without changing the window.
    pub fn leaving(&self, x: &Tensor, keep: i64) -> Option<Tensor> {
        let over = self.len() + x.size()[1] - keep;
        if over <= 0 {
            return None;
        }
        Some(match &self.cache {
            Some(c) if over <= c.size()[1] => c.narrow(1, 0, over),
            Some(c) => Tensor::cat(&[c, &x.narrow(1, 0, over - c.size()[1])], 1),
            None => x.narrow(1, 0, over),
        })
    }

    /// Empties the window.
    pub fn reset(&mut self) {
        self.cache = None;
        self.episodes = None;
        self.last = None;
    }

    /// The saved state: the cache, if any (contiguous), and its episodes, if any.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let cache = self.cache.iter().map(|c| ("cache".to_string(), c.contiguous()));
        cache.chain(self.episodes.iter().map(|e| ("episode".to_string(), e.contiguous()))).collect()
    }

    /// Restores a state saved by [`WindowCache::state`], of at most `max` states; `what`
    /// names the memory in errors.
    pub fn load_state(&mut self, state: &[(String, Tensor)], max: i64, what: &str) -> Result<()> {
        self.reset();
        for (name, t) in state {
            match name.as_str() {
                "cache" if t.dim() == 3 && t.size()[1] <= max => self.cache = Some(t.shallow_clone()),
                "episode" if t.dim() == 2 && t.size()[1] <= max => self.episodes = Some(t.to_kind(tch::Kind::Int64)),
                _ => {
                    return Err(LetheError::Invalid(format!(
                        "{what} memory: unexpected state `{name}` of shape {:?}",
                        t.size()
                    )))
                }
            }
        }
        match (&self.cache, &self.episodes) {
            (Some(c), Some(e)) if e.size() != c.size()[..2] => Err(LetheError::Invalid(format!(
                "{what} memory: episodes of shape {:?} for a cache of shape {:?}",
                e.size(),
                c.size()
            ))),
            (None, Some(_)) => Err(LetheError::Invalid(format!("{what} memory: episodes saved without a cache"))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::Attention;

    /// `append` after `keys` of the same block reuses their concatenation; it must hold
    /// exactly what a plain concatenation holds, and a different block is not mistaken
    /// for the keyed one.
    #[test]
    fn append_reuses_the_keyed_concatenation_only_for_the_same_block() {
        let _seed = crate::rng::seed_torch(3);
        let mut rng = crate::rng::Rng::new(3);
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let attn = Attention::new(vs.root(), 4, 1, 0.0, false);
        let key_pe = Tensor::zeros([8, 4], (tch::Kind::Float, tch::Device::Cpu));
        let (mut reused, mut plain) = (WindowCache::default(), WindowCache::default());
        for _ in 0..5 {
            let x = rng.normal_tensor(&[2, 3, 4], tch::Kind::Float);
            let q = attn.queries(&x);
            reused.keys(&AttendInput { x: &x, q: &q, attn: &attn, key_pe: Some(&key_pe), train: false, episodes: None }, 7);
            let a = reused.append(&x.detach(), None, 7);
            let b = plain.append(&x, None, 7);
            assert_eq!(a.is_some(), b.is_some());
            assert!(reused.cache.as_ref().unwrap().equal(plain.cache.as_ref().unwrap()));
            assert!(reused.state()[0].1.is_contiguous());
        }
        assert_eq!(reused.len(), 7);
        let keyed = rng.normal_tensor(&[2, 3, 4], tch::Kind::Float);
        let other = rng.normal_tensor(&[2, 3, 4], tch::Kind::Float);
        let q = attn.queries(&keyed);
        reused.keys(&AttendInput { x: &keyed, q: &q, attn: &attn, key_pe: Some(&key_pe), train: false, episodes: None }, 7);
        reused.append(&other, None, 7);
        assert!(reused.cache.as_ref().unwrap().narrow(1, 4, 3).equal(&other));
    }

    /// Regression: the masks of every shape seen while the cache filled were kept
    /// (12 GB of resident memory for a span of 32k in blocks of 256).
    #[test]
    fn the_window_keeps_the_masks_of_a_few_shapes_only() {
        let _seed = crate::rng::seed_torch(3);
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let attn = Attention::new(vs.root(), 4, 1, 0.0, false);
        let key_pe = Tensor::zeros([65, 4], (tch::Kind::Float, tch::Device::Cpu));
        let mut w = WindowCache::default();
        for _ in 0..20 {
            let x = Tensor::ones([1, 2, 4], (tch::Kind::Float, tch::Device::Cpu));
            let q = attn.queries(&x);
            let input = AttendInput { x: &x, q: &q, attn: &attn, key_pe: Some(&key_pe), train: false, episodes: None };
            let keys = w.keys(&input, 64);
            assert_eq!(keys.visible.size(), vec![2, keys.cached + 2]);
            w.append(&x, None, 64);
            assert!(w.windows.len() <= MAX_WINDOW_SHAPES, "{} mask shapes kept", w.windows.len());
        }
    }
}
