//! The sliding-window cache shared by the window-based memories: Transformer-XL
//! ([`super::fixed`]), Adaptive-Span ([`super::adaptive`]), and the short-term memories
//! of the Compressive Transformer ([`super::compressive`]) and the ∞-former
//! ([`super::infinity`]). It keeps a layer's last input states (detached) and, per recent
//! `(cached, m)` shape, the distance and visibility masks of a window of `span`
//! (Transformer-XL's `C_t = {t-L, ..., t-1}`), built once and reused.
//!
//! On the CPU a block's queries attend in chunks of [`QUERY_CHUNK`] ([`query_chunks`]):
//! each chunk's scores cover only the keys from its first query's reach to its last
//! query, not all of `[cache, block]`. A block of `M` queries with a reach of `L` over
//! `L + M` keys computes about `L + 64` scores a query instead of `L + M` (a quarter
//! fewer at `L = 512`, `M = 256`; two thirds fewer for Adaptive-Span's short spans),
//! and the same numbers: a key out of a chunk's range was masked with `-inf`.

use std::collections::HashMap;

use tch::Tensor;

use super::layer::{mem_rows, same_episode, with_cached_episodes, AttendInput};
use crate::attention::{attend, part, window, window_bias};
use crate::chunks::narrows;
use lethe_core::error::{LetheError, Result};

/// `[prev, x]` along the time axis of `(b, n, d)` states; `x` alone when there is no `prev`.
pub fn concat_time(prev: Option<&Tensor>, x: &Tensor) -> Tensor {
    match prev {
        Some(p) => Tensor::cat(&[p, x], 1),
        None => x.shallow_clone(),
    }
}

/// The last `keep` states of `all` `(b, n, d)` (all of them when there are fewer).
pub fn keep_last(all: Tensor, keep: i64) -> Tensor {
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
pub fn reach(span: i64, m: i64) -> i64 {
    span.max(m - 1)
}

/// Mean over `m` queries that follow `cached` states of the earlier positions each one
/// sees within a window of `span`.
pub fn window_mem_size(cached: i64, m: i64, span: i64) -> f64 {
    (0..m).map(|q| (cached + q).min(span) as f64).sum::<f64>() / m as f64
}

/// Queries per chunk of a block's attention on the CPU (see the module doc).
pub const QUERY_CHUNK: i64 = 64;

/// A run of a block's queries and the range of `[cache, block]` they may see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The chunk's first query (0 = the block's first), and how many queries.
    pub q0: i64,
    pub queries: i64,
    /// The first key the chunk's first query may see, and how many keys from there to
    /// the chunk's last query.
    pub k0: i64,
    pub keys: i64,
}

impl Chunk {
    /// Keys before the chunk's first query: the `cached` of the chunk's own window.
    pub fn cached(&self) -> i64 {
        self.keys - self.queries
    }

    /// The chunk's rows and columns of a `(.., m, n)` tensor of the block (a view).
    pub fn of(&self, t: &Tensor) -> Tensor {
        part(&part(t, -2, self.q0, self.queries), -1, self.k0, self.keys)
    }
}

/// The chunks in which `m` queries after `cached` states attend when each sees at most
/// `reach` states before itself: runs of `chunk` queries, each over the keys from its
/// first query's reach to its last query. The leading runs that would all start at key
/// 0 are one chunk (nothing to save between them), so a window that spans the whole
/// block is a single chunk, the block.
pub fn query_chunks(cached: i64, m: i64, reach: i64, chunk: i64) -> Vec<Chunk> {
    let mut chunks: Vec<Chunk> = Vec::new();
    for q0 in (0..m).step_by(chunk.max(1) as usize) {
        let queries = chunk.min(m - q0);
        let k0 = (cached + q0 - reach).max(0);
        match chunks.last_mut() {
            Some(first) if k0 == 0 => {
                first.queries += queries;
                first.keys += queries;
            }
            _ => chunks.push(Chunk { q0, queries, k0, keys: cached + q0 + queries - k0 }),
        }
    }
    chunks
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
pub struct WindowCache {
    cache: Option<Tensor>,
    /// The episode of each cached state `(b, cached)`, when the stream has episodes.
    episodes: Option<Tensor>,
    windows: HashMap<(i64, i64), (Tensor, Tensor)>,
}

/// `[cache, block]` as [`WindowCache::keys`] built it (detached): the carry a window
/// mechanism hands from its attend to its update, so that [`WindowCache::append`] of the
/// same block reuses the concatenation instead of copying the cache again.
pub struct Joined(pub Tensor);

/// Keys and values of `[cache, block]` with the window masks.
pub struct WindowKeys {
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
    /// `[cache, block]`, detached: for [`WindowCache::append`] of the same block.
    pub joined: Joined,
    /// Which keys are of the query's own episode, `(b, m, n)`, when there are episodes.
    pub same: Option<Tensor>,
}

impl WindowKeys {
    /// The chunks in which the block's queries `q` `(b, h, m, dh)` attend when each sees
    /// at most `reach` earlier states: chunks of [`QUERY_CHUNK`] on the CPU; the whole
    /// block on a GPU, whose fused kernel is not measured chunked.
    pub fn chunks(&self, q: &Tensor, reach: i64) -> Vec<Chunk> {
        let m = q.size()[2];
        let chunk = if q.device().is_cuda() { m } else { QUERY_CHUNK };
        query_chunks(self.cached, m, reach, chunk)
    }
}

/// Each chunk's queries `(b, h, queries, dh)` of the block's `q` `(b, h, m, dh)`: views,
/// with one backward pass for all ([`narrows`]).
pub fn chunk_queries(q: &Tensor, chunks: &[Chunk]) -> Result<Vec<Tensor>> {
    narrows(q, 2, &chunks.iter().map(|c| (c.q0, c.queries)).collect::<Vec<_>>())
}

/// Each chunk's keys or values `(b, h, keys, dh)` of the block's `(b, h, n, dh)`: views,
/// with one backward pass for all ([`narrows`]).
pub fn chunk_keys(k: &Tensor, chunks: &[Chunk]) -> Result<Vec<Tensor>> {
    narrows(k, 2, &chunks.iter().map(|c| (c.k0, c.keys)).collect::<Vec<_>>())
}

/// The contexts `(b, h, queries, dh)` of a block's chunks, in order: `(b, h, m, dh)`.
pub fn cat_chunks(mut contexts: Vec<Tensor>) -> Tensor {
    match contexts.len() {
        1 => contexts.remove(0),
        _ => Tensor::cat(&contexts, 2),
    }
}

impl WindowCache {
    /// States held.
    pub fn len(&self) -> i64 {
        self.cache.as_ref().map_or(0, |c| c.size()[1])
    }

    /// Whether no state is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys, values and masks for the block of `input`, each query seeing itself and at
    /// most `span` earlier positions.
    pub fn keys(&mut self, input: &AttendInput, span: i64) -> Result<WindowKeys> {
        let m = input.x.size()[1];
        let cached = self.len();
        // The block joined detached: its gradient comes from the projection (`cache_grad`).
        let states = concat_time(self.cache.as_ref(), &input.x.detach()); // (b, cached + m, d)
        let (k, v) = input.attn.keys_values_after_cache(&states, input.x)?; // (b, h, n, dh)
        let device = input.x.device();
        if !self.windows.contains_key(&(cached, m)) && self.windows.len() >= MAX_WINDOW_SHAPES {
            self.windows.clear();
        }
        let reach = reach(span, m);
        let (dist, visible) = self.windows.entry((cached, m)).or_insert_with(|| window(cached, m, reach, device));
        let same = input.episodes.map(|e| same_episode(e, &with_cached_episodes(self.episodes.as_ref(), cached, e)));
        let joined = Joined(states);
        Ok(WindowKeys { k, v, dist: dist.shallow_clone(), visible: visible.shallow_clone(), cached, same, joined })
    }

    /// Attention of the block of `input` over the window, each query seeing itself and
    /// at most `span` earlier positions: the context `(b, h, m, dh)`, and the mean number
    /// of earlier positions the queries saw, per stream (one value when every stream has
    /// the same), and `[cache, block]` for [`WindowCache::append`].
    pub fn attend(&mut self, input: &AttendInput, span: i64) -> Result<(Tensor, Vec<f64>, Joined)> {
        let m = input.x.size()[1];
        let reach = reach(span, m);
        let keys = lethe_core::profile::phase("keys, values");
        let w = self.keys(input, span)?;
        drop(keys);
        let mem_rows = match &w.same {
            None => vec![window_mem_size(w.cached, m, reach)],
            Some(same) => mem_rows(&w.visible.logical_and(same).logical_and(&w.dist.ge(1))), // from (b, m, n)
        };
        // Positions are learned up to P - 1 back: no key further back can be seen.
        let seen = input.key_pe.map_or(reach, |pe| reach.min(pe.size()[0] - 1));
        // Rotary positions (a Llama-family layer) at the states' places in the window.
        let (q, k) = input.attn.rotate(input.q, &w.k, w.cached);
        let chunks = w.chunks(&q, seen);
        let (qs, ks, vs) = (chunk_queries(&q, &chunks)?, chunk_keys(&k, &chunks)?, chunk_keys(&w.v, &chunks)?);
        let contexts: Vec<Tensor> = chunks
            .iter()
            .zip(qs.iter().zip(ks.iter().zip(&vs)))
            .map(|(c, (q, (k, v)))| {
                // q (b, h, queries, dh); k, v (b, h, keys, dh)
                let positions = lethe_core::profile::phase("positions");
                let bias = window_bias(q, input.key_pe, c.cached(), &c.of(&w.visible))?; // (b, h, queries, keys), or (queries, keys) without positions
                drop(positions);
                let _attention = lethe_core::profile::phase("attention");
                let bias = match &w.same {
                    None => bias,
                    Some(same) => bias.masked_fill(&c.of(same).logical_not().unsqueeze(1), f64::NEG_INFINITY), // (b, h or 1, queries, keys)
                };
                Ok(attend(q, k, v, &bias, input.attn.dropout, input.train))
            })
            .collect::<Result<_>>()?;
        Ok((cat_chunks(contexts), mem_rows, w.joined))
    }

    /// Appends the block `x` `(b, m, d)`, with its positions' episodes `(b, m)` when the
    /// stream has episodes, and keeps the last `keep` states. Returns the states that
    /// left the window, oldest first, if any. `joined`, the block's `[cache, block]` from
    /// [`WindowCache::keys`], is reused when given. The cache may be a view of that
    /// concatenation (no copy); the next block's concatenation copies it once.
    pub fn append(
        &mut self,
        x: &Tensor,
        episodes: Option<&Tensor>,
        keep: i64,
        joined: Option<Joined>,
    ) -> Option<Tensor> {
        self.episodes = episodes.map(|e| keep_last(with_cached_episodes(self.episodes.as_ref(), self.len(), e), keep));
        let all = match joined {
            Some(Joined(all)) => all,
            None => concat_time(self.cache.as_ref(), x),
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
    use crate::attention::Attention;

    /// `append` given the concatenation `keys` built for the block reuses it; it must
    /// hold exactly what a plain concatenation holds, and a block appended without one
    /// is joined anew.
    #[test]
    fn append_reuses_the_keyed_concatenation_it_is_handed() {
        let _seed = lethe_core::rng::seed_torch(3);
        let mut rng = lethe_core::rng::Rng::new(3);
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let attn = Attention::new(vs.root(), 4, 1, 0.0, false);
        let key_pe = Tensor::zeros([8, 4], (tch::Kind::Float, tch::Device::Cpu));
        let (mut reused, mut plain) = (WindowCache::default(), WindowCache::default());
        for _ in 0..5 {
            let x = rng.normal_tensor(&[2, 3, 4], tch::Kind::Float);
            let q = attn.queries(&x);
            let w = reused
                .keys(
                    &AttendInput {
                        x: &x,
                        q: &q,
                        attn: &attn,
                        key_pe: Some(&key_pe),
                        train: false,
                        episodes: None,
                        norm: None,
                    },
                    7,
                )
                .unwrap();
            let a = reused.append(&x.detach(), None, 7, Some(w.joined));
            let b = plain.append(&x, None, 7, None);
            assert_eq!(a.is_some(), b.is_some());
            assert!(reused.cache.as_ref().unwrap().equal(plain.cache.as_ref().unwrap()));
            assert!(reused.state()[0].1.is_contiguous());
        }
        assert_eq!(reused.len(), 7);
        let keyed = rng.normal_tensor(&[2, 3, 4], tch::Kind::Float);
        let other = rng.normal_tensor(&[2, 3, 4], tch::Kind::Float);
        let q = attn.queries(&keyed);
        reused
            .keys(
                &AttendInput {
                    x: &keyed,
                    q: &q,
                    attn: &attn,
                    key_pe: Some(&key_pe),
                    train: false,
                    episodes: None,
                    norm: None,
                },
                7,
            )
            .unwrap();
        reused.append(&other, None, 7, None);
        assert!(reused.cache.as_ref().unwrap().narrow(1, 4, 3).equal(&other));
    }

    /// Chunks of a block's queries: runs of `chunk`, each from its first query's reach to
    /// its last query; the leading runs that start at key 0 are one.
    #[test]
    fn queries_attend_in_chunks_over_the_keys_they_reach() {
        let c = |q0, queries, k0, keys| Chunk { q0, queries, k0, keys };
        // A full cache of 512 before a block of 256, span 512: every chunk over 576 keys.
        assert_eq!(
            query_chunks(512, 256, 512, 64),
            vec![c(0, 64, 0, 576), c(64, 64, 64, 576), c(128, 64, 128, 576), c(192, 64, 192, 576)]
        );
        // An empty cache, reach 100: the first two runs both start at key 0, so are one.
        assert_eq!(query_chunks(0, 256, 100, 64), vec![c(0, 128, 0, 128), c(128, 64, 28, 164), c(192, 64, 92, 164)]);
        // A window over the whole block is the block; a last run shorter than the rest.
        assert_eq!(query_chunks(10, 100, 200, 64), vec![c(0, 100, 0, 110)]);
        assert_eq!(query_chunks(64, 100, 64, 64), vec![c(0, 64, 0, 128), c(64, 36, 64, 100)]);
        assert_eq!(c(64, 36, 64, 100).cached(), 64);
    }

    /// The chunked attention equals the block's attention over all of `[cache, block]`
    /// (the keys a chunk leaves out were masked), in value and in the gradients to the
    /// inputs and positions, in double precision: while the cache fills and after it,
    /// with and without episodes.
    #[test]
    fn chunked_attention_equals_the_whole_block() {
        use crate::attention::window_bias;
        use tch::Kind::{Double, Int64};
        let _seed = lethe_core::rng::seed_torch(5);
        let mut rng = lethe_core::rng::Rng::new(5);
        let mut vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let attn = Attention::new(vs.root(), 8, 2, 0.0, false);
        vs.double();
        let (span, m) = (40, 150);
        let key_pe = rng.normal_tensor(&[span + 1, 4], Double).set_requires_grad(true);
        for with_episodes in [false, true] {
            let mut w = WindowCache::default();
            for block in 0..3 {
                let x = rng.normal_tensor(&[2, m, 8], Double).set_requires_grad(true);
                // Episodes of 70 steps in the first stream and 110 in the second.
                let pos = Tensor::arange_start(block * m, (block + 1) * m, (Int64, tch::Device::Cpu));
                let episodes = with_episodes
                    .then(|| Tensor::stack(&[pos.floor_divide_scalar(70), pos.floor_divide_scalar(110)], 0));
                let q = attn.queries(&x);
                let input = AttendInput {
                    x: &x,
                    q: &q,
                    attn: &attn,
                    key_pe: Some(&key_pe),
                    train: true,
                    episodes: episodes.as_ref(),
                    norm: None,
                };
                let keys = w.keys(&input, span).unwrap();
                assert!(keys.chunks(&q, span).len() > 1, "block {block}: one chunk");
                let mut bias = window_bias(&q, Some(&key_pe), keys.cached, &keys.visible).unwrap(); // (b, h, m, n)
                if let Some(same) = &keys.same {
                    bias = bias.masked_fill(&same.logical_not().unsqueeze(1), f64::NEG_INFINITY);
                }
                let whole = attend(&q, &keys.k, &keys.v, &bias, 0.0, true);
                let (chunked, _, joined) = w.attend(&input, span).unwrap();
                let gap = (&chunked - &whole).abs().max().double_value(&[]);
                assert!(gap < 1e-12, "block {block}, episodes {with_episodes}: outputs differ by {gap}");
                let weights = rng.normal_tensor(&whole.size(), Double);
                let inputs = [&x, &key_pe];
                let g1 = Tensor::run_backward(&[(&chunked * &weights).sum(Double)], &inputs, true, false);
                let g2 = Tensor::run_backward(&[(&whole * &weights).sum(Double)], &inputs, false, false);
                for (i, (a, b)) in g1.iter().zip(&g2).enumerate() {
                    let gap = (a - b).abs().max().double_value(&[]);
                    assert!(
                        gap < 1e-10 && a.abs().sum(Double).double_value(&[]) > 0.0,
                        "block {block}, input {i}: gradients differ by {gap}"
                    );
                }
                w.append(&x.detach(), episodes.as_ref(), span, Some(joined));
            }
        }
    }

    /// Regression: the masks of every shape seen while the cache filled were kept
    /// (12 GB of resident memory for a span of 32k in blocks of 256).
    #[test]
    fn the_window_keeps_the_masks_of_a_few_shapes_only() {
        let _seed = lethe_core::rng::seed_torch(3);
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let attn = Attention::new(vs.root(), 4, 1, 0.0, false);
        let key_pe = Tensor::zeros([65, 4], (tch::Kind::Float, tch::Device::Cpu));
        let mut w = WindowCache::default();
        for _ in 0..20 {
            let x = Tensor::ones([1, 2, 4], (tch::Kind::Float, tch::Device::Cpu));
            let q = attn.queries(&x);
            let input = AttendInput {
                x: &x,
                q: &q,
                attn: &attn,
                key_pe: Some(&key_pe),
                train: false,
                episodes: None,
                norm: None,
            };
            let keys = w.keys(&input, 64).unwrap();
            assert_eq!(keys.visible.size(), vec![2, keys.cached + 2]);
            w.append(&x, None, 64, None);
            assert!(w.windows.len() <= MAX_WINDOW_SHAPES, "{} mask shapes kept", w.windows.len());
        }
    }
}
