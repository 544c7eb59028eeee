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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3_tch::PyTensor;
use tch::Device;

use lethe_core::checkpoint::{self, Checkpoint};
use lethe_core::config::{Arch, Mechanism};
use lethe_model::kv::{Budget, Policy};
use lethe_model::llama::{ExpireRun, KvCache as Cache, Llama};
use lethe_model::Lm;

use crate::{check_ids, guarded, invalid, lock};

/// Where a [`Decoder`]'s weights come from.
enum Weights {
    /// A Hugging Face folder.
    Folder(Llama),
    /// A lethe run of Expire-Span on a Llama-family model: its decoder and span
    /// predictors.
    Run(Box<ExpireRun>),
}

impl Weights {
    /// The model at `path`: a Hugging Face folder, or a lethe run folder or checkpoint
    /// of Expire-Span on a Llama-family model.
    fn open(path: &Path) -> PyResult<Weights> {
        let file = checkpoint::resolve(path);
        if path.join("config.json").is_file() || !file.is_file() {
            return Llama::load(path).map(Weights::Folder).map_err(|e| invalid(e.to_string()));
        }
        let ckpt = Checkpoint::load(path).map_err(|e| invalid(e.to_string()))?;
        let (arch, mechanism) = (ckpt.config.model.arch, ckpt.config.memory.mechanism);
        let refused = |why: String| invalid(format!("`{}`: {why}", path.display()));
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
        let lm = Lm::from_checkpoint(&ckpt, Device::Cpu).map_err(|e| invalid(e.to_string()))?;
        let run = ExpireRun::new(&ckpt.config, &lm.vs.variables()).map_err(|e| refused(e.to_string()))?;
        Ok(Weights::Run(Box::new(run)))
    }

    fn llama(&self) -> &Llama {
        match self {
            Weights::Folder(model) => model,
            Weights::Run(run) => run.decoder(),
        }
    }
}

/// Numbers each [`Decoder`], so that a learned cache is read by the decoder it was made by.
static DECODERS: AtomicU64 = AtomicU64::new(0);

/// A pretrained decoder. See the module documentation.
#[pyclass(module = "lethe._lethe")]
pub struct Decoder {
    model: Mutex<Weights>,
    /// Which decoder this is ([`DECODERS`]).
    id: u64,
}

/// The keys and values a [`Decoder`] holds for the tokens it has read, under a policy;
/// each call of [`Decoder::forward`] adds to it (and evicts what the policy says), and
/// [`KvCache::copy`] forks it.
#[pyclass(module = "lethe._lethe")]
pub struct KvCache {
    cache: Mutex<Cache>,
    policy: String,
    /// The decoder whose learned memory keeps this cache ([`Decoder::learned_cache`]);
    /// none for a training-free policy.
    learned_by: Option<u64>,
}

#[pymethods]
impl KvCache {
    /// An empty cache under `policy` (`h2o`, `snapkv:window=16`, ...) with `budget`
    /// entries a layer and key-value head (none for `full`).
    #[new]
    #[pyo3(signature = (policy, budget))]
    fn new(policy: &str, budget: Option<i64>) -> PyResult<KvCache> {
        let budget = match budget {
            Some(n) if n < 1 => return Err(invalid(format!("budget = {n}: a budget keeps at least one entry"))),
            Some(n) => Some(Budget::Entries(n)),
            None => None,
        };
        let parsed = Policy::parse(policy, budget, i64::MAX)
            .map_err(|e| invalid(e.to_string().replace("--policy", "policy").replace("--budget", "budget")))?;
        let shown = match parsed.budget {
            Some(b) => format!("{policy} @ {b}"),
            None => policy.to_string(),
        };
        Ok(KvCache { cache: Mutex::new(Cache::new(parsed)), policy: shown, learned_by: None })
    }

    /// An independent copy: what the cache holds and what its policy keeps about it, in
    /// memory of its own; the two read on apart (a prompt read once, continued several
    /// ways). `copy.copy` and `copy.deepcopy` make the same.
    fn copy(&self, py: Python<'_>) -> PyResult<KvCache> {
        py.allow_threads(|| {
            let held = lock(&self.cache)?;
            let cache = guarded(|| Ok(held.fork()))?;
            Ok(KvCache { cache: Mutex::new(cache), policy: self.policy.clone(), learned_by: self.learned_by })
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
        Ok(format!("KvCache({}: {} tokens read, {:?} entries a layer)", self.policy, cache.position, cache.entries()))
    }
}

#[pymethods]
impl Decoder {
    /// The Llama-family model in the Hugging Face folder `path`, or the decoder of the
    /// lethe run (folder or checkpoint) of Expire-Span at `path`.
    #[new]
    fn new(path: &str) -> PyResult<Decoder> {
        let model = guarded(|| Weights::open(Path::new(path)))?;
        Ok(Decoder { model: Mutex::new(model), id: DECODERS.fetch_add(1, Ordering::Relaxed) })
    }

    /// The size of the vocabulary.
    fn vocab(&self) -> PyResult<i64> {
        Ok(lock(&self.model)?.llama().config.vocab_size)
    }

    /// Whether the decoder is a lethe run's, with a learned memory.
    fn learned(&self) -> PyResult<bool> {
        Ok(matches!(*lock(&self.model)?, Weights::Run(_)))
    }

    /// An empty cache kept by the run's span predictors: under the run's own
    /// `memory.expire.budget` (`budget` none), or at most `budget` entries a layer.
    #[pyo3(signature = (budget))]
    fn learned_cache(&self, budget: Option<i64>) -> PyResult<KvCache> {
        let weights = lock(&self.model)?;
        let Weights::Run(run) = &*weights else {
            return Err(invalid(
                "policy learned: this decoder reads a Hugging Face folder; a learned memory comes with a lethe run of Expire-Span fitted onto it (lethe train --init-from FOLDER --set memory.mechanism=expire), given to lethe.Decoder",
            ));
        };
        let (cache, shown) = match budget {
            Some(n) if n < 1 => return Err(invalid(format!("budget = {n}: a budget keeps at least one entry"))),
            Some(n) => (run.cache_at(n as usize), format!("learned @ {n} entries")),
            None => (run.cache(), "learned".to_string()),
        };
        let cache = cache.map_err(|e| invalid(e.to_string()))?;
        Ok(KvCache { cache: Mutex::new(cache), policy: shown, learned_by: Some(self.id) })
    }

    /// The logits `(b, t, vocab)` of `ids` `(b, t)` read after what `cache` holds; the
    /// cache then holds them too, as its policy keeps them.
    fn forward(&self, py: Python<'_>, ids: PyTensor, cache: &KvCache) -> PyResult<PyTensor> {
        py.allow_threads(move || {
            let weights = lock(&self.model)?;
            let model = weights.llama();
            if ids.device() != Device::Cpu {
                return Err(invalid("ids: the decoder runs on the CPU (ids.cpu())"));
            }
            check_ids("ids", &ids, model.config.vocab_size, None)?;
            if cache.learned_by.is_some_and(|id| id != self.id) {
                return Err(invalid(
                    "cache: kept by another decoder's learned memory; make it with this decoder's cache(\"learned\")",
                ));
            }
            let mut held = lock(&cache.cache)?;
            if let Some(first) = held.layers.iter().flatten().next() {
                let streams = first.keys.size()[0];
                if streams != ids.size()[0] {
                    return Err(invalid(format!(
                        "cache: holds {streams} streams and ids {} (a cache carries the streams it read)",
                        ids.size()[0]
                    )));
                }
            }
            guarded(|| Ok(PyTensor(model.forward(&ids, &mut held))))
        })
    }
}
