//! A pretrained Llama-family decoder under a key-value cache policy:
//! `lethe._lethe.Decoder` and its cache `lethe._lethe.KvCache`, which `lethe.Decoder`
//! (python/lethe/decoder.py) wraps.
//!
//! The decoder is lethe's inference path for a Hugging Face folder (`lethe generate
//! --init-from`, `lethe eval --init-from`): the weights as the folder holds them, each
//! layer's keys and values kept by one of the training-free policies (the full cache,
//! a sliding window, StreamingLLM, H2O, TOVA, SnapKV) within a budget of entries. Given
//! a lethe run of Expire-Span fitted onto such a model (`lethe train --init-from`), it is
//! the run's decoder (its low-rank adapters folded in), whose caches can also keep what
//! the run's span predictors say (`lethe generate --checkpoint`, `--learned`).

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3_tch::PyTensor;
use tch::{Device, Tensor};

use lethe_core::checkpoint::{self, Checkpoint};
use lethe_core::config::{Arch, Mechanism, Precision};
use lethe_data::text;
use lethe_data::tokenizer::Tokenizer;
use lethe_data::Token;
use lethe_model::kv::{Budget, Policy};
use lethe_model::llama::{ExpireRun, KvCache as Cache, Llama};
use lethe_model::Lm;
use lethe_train::generate;

use crate::{check_id_list, check_ids, generation, guarded, invalid, lock, Named};

/// Where a [`Decoder`]'s weights come from.
enum Weights {
    /// A Hugging Face folder.
    Folder(Llama),
    /// A lethe run of Expire-Span on a Llama-family model: its decoder and span
    /// predictors, and its `train.block`, the blocks a learned cache reads a prompt in.
    Run { run: Box<ExpireRun>, block: usize },
}

impl Weights {
    fn llama(&self) -> &Llama {
        match self {
            Weights::Folder(model) => model,
            Weights::Run { run, .. } => run.decoder(),
        }
    }
}

/// What a [`Decoder`] owns.
struct Inner {
    weights: Weights,
    /// The folder's `tokenizer.json` or the run's tokenizer, if it has one.
    tokenizer: Option<Tokenizer>,
    /// The path it was read from, for messages.
    origin: String,
    /// [`Llama::fingerprint`] of its decoder, which marks the caches it reads.
    fingerprint: String,
}

impl Inner {
    /// The model at `path` on `device` in `precision`: a Hugging Face folder, or a lethe
    /// run folder or checkpoint of Expire-Span on a Llama-family model (its span
    /// predictors in float32); with its tokenizer.
    fn open(path: &Path, device: Device, precision: Precision) -> PyResult<Inner> {
        let origin = path.display().to_string();
        let file = checkpoint::resolve(path);
        if path.join("config.json").is_file() || !file.is_file() {
            let model = Llama::load_as(path, device, precision).map_err(|e| invalid(e.to_string()))?;
            let tokenizer = Tokenizer::of_decoder_folder(path, model.config.vocab_size as usize)
                .map_err(|e| invalid(e.to_string()))?;
            let fingerprint = model.fingerprint();
            return Ok(Inner { weights: Weights::Folder(model), tokenizer, origin, fingerprint });
        }
        let ckpt = Checkpoint::load(path).map_err(|e| invalid(e.to_string()))?;
        let (arch, mechanism) = (ckpt.config.model.arch, ckpt.config.memory.mechanism);
        let refused = |why: String| invalid(format!("`{origin}`: {why}"));
        if arch != Arch::Llama {
            return Err(refused(format!(
                "a lethe run of model.arch = \"{}\"; lethe.Decoder reads a Llama-family model (lethe.load reads this run)",
                arch.name()
            )));
        }
        if mechanism != Mechanism::Expire {
            return Err(refused(format!(
                "a lethe run whose memory is {}; lethe.Decoder reads Expire-Span runs through the key-value cache (lethe.load reads this one, lethe export makes a Hugging Face folder of it)",
                mechanism.name()
            )));
        }
        let lm = Lm::from_checkpoint(&ckpt, device).map_err(|e| invalid(e.to_string()))?;
        let run = ExpireRun::new(&ckpt.config, &lm.vs.variables()).map_err(|e| refused(e.to_string()))?;
        let run = run.into_precision(precision);
        let tokenizer = text::tokenizer_of_checkpoint(&ckpt).map_err(|e| invalid(e.to_string()))?;
        let fingerprint = run.decoder().fingerprint();
        let weights = Weights::Run { run: Box::new(run), block: ckpt.config.train.block };
        Ok(Inner { weights, tokenizer, origin, fingerprint })
    }

    /// The tokenizer, or an error saying there is none.
    fn tokenizer(&self) -> PyResult<&Tokenizer> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| invalid(format!("`{}` has no tokenizer.json: give the prompt as token ids", self.origin)))
    }
}

/// What a pickled [`KvCache`] is made again from: its policy, budget and tensors, for a
/// learned cache the fingerprint of the memory that keeps it, and the fingerprint of the
/// model whose entries it holds.
type Pickled = (String, Option<i64>, Named, Option<String>, Option<String>);

/// A pretrained decoder. See the module documentation.
#[pyclass(module = "lethe._lethe")]
pub struct Decoder {
    inner: Mutex<Inner>,
}

/// The keys and values a [`Decoder`] holds for the tokens it has read, under a policy;
/// each call of [`Decoder::forward`] adds to it (and evicts what the policy says), and
/// [`KvCache::copy`] forks it.
#[pyclass(module = "lethe._lethe")]
pub struct KvCache {
    cache: Mutex<Cache>,
    /// The policy as given (`snapkv:window=16`; `learned`) and its budget.
    spec: String,
    budget: Option<i64>,
    /// The fingerprint of the run's learned memory that keeps this cache
    /// ([`ExpireRun::memory_fingerprint`], [`Decoder::learned_cache`]); none for a
    /// training-free policy.
    learned_by: Option<String>,
    /// A learned cache unpickled and not read since: what its layers' span predictors
    /// kept (`layers.<i>.policy.*`), taken back when a decoder of its memory first reads
    /// it ([`Decoder::take_up`]); `cache` meanwhile holds its entries under the full
    /// policy.
    pending: Mutex<Option<Vec<(String, Tensor)>>>,
    /// [`Llama::fingerprint`] of the model whose keys and values it holds (the last
    /// decoder that read into it); none before any.
    read_by: Mutex<Option<String>>,
}

#[pymethods]
impl KvCache {
    /// An empty cache under `policy` (`h2o`, `snapkv:window=16`, ...) with `budget`
    /// entries a layer and key-value head (none for `full`).
    #[new]
    #[pyo3(signature = (policy, budget))]
    fn new(policy: &str, budget: Option<i64>) -> PyResult<KvCache> {
        let parsed = parse_policy(policy, budget)?;
        Ok(KvCache::training_free(Cache::new(parsed), policy, budget))
    }

    /// What pickling (`torch.save`) keeps: the policy, its budget and the cache's
    /// tensors ([`Cache::state`], copied so that none carries a buffer's spare room),
    /// and for a learned cache the fingerprint of its memory; made again by
    /// [`kv_cache_from_state`].
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Pickled)> {
        let state = guarded(|| {
            let held = lock(&self.cache)?;
            let pending = lock(&self.pending)?;
            let state =
                held.state().into_iter().chain(pending.iter().flatten().map(|(n, t)| (n.clone(), t.shallow_clone())));
            Ok(state.map(|(n, t)| (n, PyTensor(t.copy()))).collect())
        })?;
        let make = py.import("lethe._lethe")?.getattr("_kv_cache_from_state")?;
        let read_by = lock(&self.read_by)?.clone();
        Ok((make, (self.spec.clone(), self.budget, state, self.learned_by.clone(), read_by)))
    }

    /// An independent copy: what the cache holds and what its policy keeps about it, in
    /// memory of its own; the two read on apart (a prompt read once, continued several
    /// ways). `copy.copy` and `copy.deepcopy` make the same.
    fn copy(&self, py: Python<'_>) -> PyResult<KvCache> {
        py.allow_threads(|| {
            let held = lock(&self.cache)?;
            let pending = lock(&self.pending)?;
            let (cache, pending) = guarded(|| Ok((held.fork(), pending.as_ref().map(|state| forked_state(state)))))?;
            Ok(KvCache {
                cache: Mutex::new(cache),
                spec: self.spec.clone(),
                budget: self.budget,
                learned_by: self.learned_by.clone(),
                pending: Mutex::new(pending),
                read_by: Mutex::new(lock(&self.read_by)?.clone()),
            })
        })
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<KvCache> {
        self.copy(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<KvCache> {
        self.copy(py)
    }

    /// The entries each layer holds per key-value head.
    fn entries(&self) -> PyResult<Vec<i64>> {
        Ok(lock(&self.cache)?.entries())
    }

    /// The bytes of keys, values and positions held.
    fn nbytes(&self) -> PyResult<usize> {
        Ok(lock(&self.cache)?.bytes())
    }

    /// The position the next token takes (the tokens read so far).
    fn position(&self) -> PyResult<i64> {
        Ok(lock(&self.cache)?.position)
    }

    fn __repr__(&self) -> PyResult<String> {
        let cache = lock(&self.cache)?;
        let policy = match self.budget {
            Some(b) => format!("{} @ {b} entries", self.spec),
            None => self.spec.clone(),
        };
        Ok(format!("KvCache({policy}: {} tokens read, {:?} entries a layer)", cache.position, cache.entries()))
    }
}

#[pymethods]
impl Decoder {
    /// The Llama-family model in the Hugging Face folder `path`, or the decoder of the
    /// lethe run (folder or checkpoint) of Expire-Span at `path`, on `device` (`cpu`,
    /// `cuda`, `cuda:N`), in `precision` (`f32`, `bf16`, `f16`).
    #[new]
    #[pyo3(signature = (path, device = "cpu", precision = "f32"))]
    fn new(path: &str, device: &str, precision: &str) -> PyResult<Decoder> {
        let device = lethe_core::device::parse_flag("device", device).map_err(|e| invalid(e.to_string()))?;
        let precision = Precision::parse(precision).map_err(|e| invalid(format!("dtype: {e}")))?;
        let inner = guarded(|| Inner::open(Path::new(path), device, precision))?;
        Ok(Decoder { inner: Mutex::new(inner) })
    }

    /// Where the weights are (`cpu`, `cuda:N`).
    fn device(&self) -> PyResult<String> {
        Ok(lethe_core::device::name(lock(&self.inner)?.weights.llama().device()))
    }

    /// The precision of the weights and the caches' entries (`f32`, `bf16`, `f16`).
    fn precision(&self) -> PyResult<&'static str> {
        Ok(lock(&self.inner)?.weights.llama().precision().name())
    }

    /// The size of the vocabulary.
    fn vocab(&self) -> PyResult<i64> {
        Ok(lock(&self.inner)?.weights.llama().config.vocab_size)
    }

    /// Whether the decoder is a lethe run's, with a learned memory.
    fn learned(&self) -> PyResult<bool> {
        Ok(matches!(lock(&self.inner)?.weights, Weights::Run { .. }))
    }

    /// What names a run's learned memory, and so the caches it keeps
    /// ([`ExpireRun::memory_fingerprint`]); none for a Hugging Face folder.
    fn memory(&self) -> PyResult<Option<String>> {
        Ok(match &lock(&self.inner)?.weights {
            Weights::Run { run, .. } => Some(run.memory_fingerprint().to_string()),
            Weights::Folder(_) => None,
        })
    }

    /// An empty cache kept by the run's span predictors: under the run's own
    /// `memory.expire.budget` (`budget` none), or at most `budget` entries a layer.
    #[pyo3(signature = (budget))]
    fn learned_cache(&self, budget: Option<i64>) -> PyResult<KvCache> {
        let inner = lock(&self.inner)?;
        let Weights::Run { run, .. } = &inner.weights else {
            return Err(invalid(
                "policy learned: this decoder reads a Hugging Face folder; a learned memory comes with a lethe run of Expire-Span fitted onto it (lethe train --init-from FOLDER --set memory.mechanism=expire), given to lethe.Decoder",
            ));
        };
        let cache = learned_of(run, budget)?;
        Ok(KvCache {
            learned_by: Some(run.memory_fingerprint().into()),
            ..KvCache::training_free(cache, "learned", budget)
        })
    }

    /// `text` as the model's token ids (its tokenizer's; a long text in pieces).
    fn encode(&self, text: &str) -> PyResult<Vec<i64>> {
        let inner = lock(&self.inner)?;
        let ids = lethe_data::text::encode_long(inner.tokenizer()?, text).map_err(|e| invalid(e.to_string()))?;
        Ok(ids.into_iter().map(i64::from).collect())
    }

    /// Token ids as text.
    fn decode(&self, ids: Vec<i64>) -> PyResult<String> {
        let inner = lock(&self.inner)?;
        check_id_list("ids", &ids, inner.weights.llama().config.vocab_size)?;
        let ids: Vec<Token> = ids.into_iter().map(|i| i as Token).collect();
        inner.tokenizer()?.decode(&ids).map_err(|e| invalid(e.to_string()))
    }

    /// The logits `(b, t, vocab)` of `ids` `(b, t)` read after what `cache` holds; the
    /// cache then holds them too, as its policy keeps them.
    fn forward(&self, py: Python<'_>, ids: PyTensor, cache: &KvCache) -> PyResult<PyTensor> {
        py.allow_threads(move || {
            let inner = lock(&self.inner)?;
            let model = inner.weights.llama();
            if ids.device() != model.device() {
                let on = |d| lethe_core::device::name(d);
                return Err(invalid(format!(
                    "ids: on {}, the decoder runs on {} (ids.to(decoder.device))",
                    on(ids.device()),
                    on(model.device())
                )));
            }
            guarded(|| check_ids("ids", &ids, model.config.vocab_size, None))?;
            let mut held = take_up(&inner, cache, ids.size()[0])?;
            guarded(|| Ok(PyTensor(model.forward(&ids, &mut held))))
        })
    }

    /// `count` tokens after `prompt` (ids) read after what `cache` holds, as `lethe
    /// generate --init-from` (a learned cache: `--checkpoint`) makes them: the prompt read
    /// in blocks (a learned cache's: the run's `train.block`), then each token chosen
    /// from the logits by `sampling`, `(temperature, top_k, top_p, seed)`, and taken in
    /// but the last. Ctrl-C stops a long generation, the cache keeping what it read.
    #[pyo3(signature = (prompt, count, cache, sampling))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: Vec<i64>,
        count: usize,
        cache: &KvCache,
        sampling: (f64, usize, f64, u64),
    ) -> PyResult<Vec<i64>> {
        generation::check_count(count)?;
        py.allow_threads(move || {
            let inner = lock(&self.inner)?;
            let model = inner.weights.llama();
            let prompt = generation::prompt_tokens(prompt, model.config.vocab_size)?;
            let sampling = generation::sampling(sampling)?;
            let mut held = take_up(&inner, cache, 1)?;
            let block = match (&inner.weights, &cache.learned_by) {
                (Weights::Run { block, .. }, Some(_)) => *block,
                _ => generate::PROMPT_BLOCK,
            };
            guarded(|| {
                generation::collect(count, |emit| {
                    generate::stream_decoder_in(model, &mut held, (&prompt, block), count, &sampling, |_, _| {}, emit)
                })
            })
        })
    }
}

impl KvCache {
    /// `cache` under the training-free policy `spec` with `budget`, as given.
    fn training_free(cache: Cache, spec: &str, budget: Option<i64>) -> KvCache {
        KvCache {
            cache: Mutex::new(cache),
            spec: spec.into(),
            budget,
            learned_by: None,
            pending: Mutex::new(None),
            read_by: Mutex::new(None),
        }
    }
}

/// `cache`, locked for a read of `streams` streams by the decoder `inner`: refused when
/// it is learned and the decoder's memory is not the one that keeps it, when it holds
/// another number of streams, or entries of another model's shape, precision or device,
/// or of another model of the same shape. A learned cache unpickled takes back what its
/// span predictors kept here.
fn take_up<'a>(inner: &Inner, cache: &'a KvCache, streams: i64) -> PyResult<MutexGuard<'a, Cache>> {
    let weights = &inner.weights;
    let mut held = lock(&cache.cache)?;
    held.check_fits(weights.llama()).map_err(|why| invalid(format!("cache: {why}")))?;
    if let Some(memory) = &cache.learned_by {
        let Weights::Run { run, .. } = weights else {
            return Err(invalid(format!(
                "cache: kept by a run's learned memory ({memory}); this decoder reads a Hugging Face folder"
            )));
        };
        if run.memory_fingerprint() != memory {
            return Err(invalid(format!(
                "cache: kept by another run's learned memory ({memory}; this decoder's is {}): make it with this decoder's cache(\"learned\")",
                run.memory_fingerprint()
            )));
        }
        let mut pending = lock(&cache.pending)?;
        if let Some(state) = pending.as_ref() {
            *held = guarded(|| bind_learned(run, cache.budget, &held, state))?;
            *pending = None;
        }
    }
    let mut read_by = lock(&cache.read_by)?;
    if let Some(theirs) = read_by.as_deref().filter(|theirs| held.position > 0 && *theirs != inner.fingerprint) {
        let ours = &inner.fingerprint;
        let why = format!("holds what another model read ({theirs}; this decoder's weights are {ours})");
        return Err(invalid(format!("cache: {why}: a cache of another model")));
    }
    *read_by = Some(inner.fingerprint.clone());
    if let Some(first) = held.layers.iter().flatten().next() {
        let holds = first.keys.size()[0];
        if holds != streams {
            return Err(invalid(format!(
                "cache: holds {holds} streams and ids {streams} (a cache carries the streams it read)"
            )));
        }
    }
    Ok(held)
}

/// The learned cache of `run` under `budget` (none: the run's own) holding the entries
/// `held` holds and what its span predictors kept of them, `kept` (an unpickled cache's).
fn bind_learned(run: &ExpireRun, budget: Option<i64>, held: &Cache, kept: &[(String, Tensor)]) -> PyResult<Cache> {
    let state = held.state().into_iter().chain(kept.iter().map(|(n, t)| (n.clone(), t.shallow_clone())));
    learned_of(run, budget)?.restored(state.collect()).map_err(|e| invalid(format!("cache: {e}")))
}

/// An empty cache kept by `run`'s span predictors within `budget` entries a layer (none:
/// the run's own `memory.expire.budget`); a budget below one refused.
fn learned_of(run: &ExpireRun, budget: Option<i64>) -> PyResult<Cache> {
    let cache = match budget {
        Some(n) if n < 1 => return Err(invalid(format!("budget = {n}: a budget keeps at least one entry"))),
        Some(n) => run.cache_at(n as usize),
        None => run.cache(),
    };
    cache.map_err(|e| invalid(e.to_string()))
}

/// `state` with each tensor copied.
fn forked_state(state: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    state.iter().map(|(n, t)| (n.clone(), t.copy())).collect()
}

/// `policy` (`h2o`, `snapkv:window=16`, ...) with `budget` entries a layer and key-value
/// head (none for `full`), read as `lethe generate --policy --budget` reads them.
fn parse_policy(policy: &str, budget: Option<i64>) -> PyResult<Policy> {
    let budget = match budget {
        Some(n) if n < 1 => return Err(invalid(format!("budget = {n}: a budget keeps at least one entry"))),
        Some(n) => Some(Budget::Entries(n)),
        None => None,
    };
    Policy::parse(policy, budget, i64::MAX)
        .map_err(|e| invalid(e.to_string().replace("--policy", "policy").replace("--budget", "budget")))
}

/// A pickled [`KvCache`] made again: the cache under `policy` and `budget` holding
/// `state` ([`KvCache::__reduce__`]). A learned one (`memory` its memory's fingerprint)
/// holds its entries under the full policy until a decoder of that memory reads it, its
/// span predictors' spans kept aside till then ([`take_up`]).
#[pyfunction]
#[pyo3(name = "_kv_cache_from_state", signature = (policy, budget, state, memory = None, model = None))]
pub fn kv_cache_from_state(
    policy: &str,
    budget: Option<i64>,
    state: Named,
    memory: Option<String>,
    model: Option<String>,
) -> PyResult<KvCache> {
    let mut cache = cache_from_state(policy, budget, state, memory)?;
    cache.read_by = Mutex::new(model);
    Ok(cache)
}

/// [`kv_cache_from_state`] but the model that read it.
fn cache_from_state(policy: &str, budget: Option<i64>, state: Named, memory: Option<String>) -> PyResult<KvCache> {
    let tensors: Vec<(String, Tensor)> = state.into_iter().map(|(name, t)| (name, t.0)).collect();
    let Some(memory) = memory else {
        let parsed = parse_policy(policy, budget)?;
        let cache = guarded(|| Cache::from_state(parsed, tensors).map_err(|e| invalid(e.to_string())))?;
        return Ok(KvCache::training_free(cache, policy, budget));
    };
    if let Some(n) = budget.filter(|&n| n < 1) {
        return Err(invalid(format!("budget = {n}: a budget keeps at least one entry")));
    }
    let (kept, entries): (Vec<_>, Vec<_>) = tensors.into_iter().partition(|(name, _)| name.contains(".policy."));
    let cache = guarded(|| Cache::from_state(Policy::default(), entries).map_err(|e| invalid(e.to_string())))?;
    Ok(KvCache {
        learned_by: Some(memory),
        pending: Mutex::new(Some(kept)),
        ..KvCache::training_free(cache, "learned", budget)
    })
}
