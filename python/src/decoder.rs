//! A pretrained Llama-family decoder under a key-value cache policy:
//! `lethe._lethe.Decoder` and its cache `lethe._lethe.KvCache`, which `lethe.Decoder`
//! (python/lethe/decoder.py) wraps.
//!
//! The decoder is lethe's inference path for a Hugging Face folder (`lethe generate
//! --init-from`, `lethe eval --init-from`): the weights as the folder holds them, each
//! layer's keys and values kept by one of the training-free policies (the full cache,
//! a sliding window, StreamingLLM, H2O, TOVA, SnapKV) within a budget of entries.

use std::path::Path;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3_tch::PyTensor;
use tch::Device;

use lethe_model::kv::{Budget, Policy};
use lethe_model::llama::{KvCache as Cache, Llama};

use crate::{check_ids, guarded, invalid, lock};

/// A pretrained decoder. See the module documentation.
#[pyclass(module = "lethe._lethe")]
pub struct Decoder {
    model: Mutex<Llama>,
}

/// The keys and values a [`Decoder`] holds for the tokens it has read, under a policy;
/// each call of [`Decoder::forward`] adds to it (and evicts what the policy says).
#[pyclass(module = "lethe._lethe")]
pub struct KvCache {
    cache: Mutex<Cache>,
    policy: String,
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
        Ok(KvCache { cache: Mutex::new(Cache::new(parsed)), policy: shown })
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
    /// The Llama-family model in the Hugging Face folder `path`.
    #[new]
    fn new(path: &str) -> PyResult<Decoder> {
        let model = guarded(|| Llama::load(Path::new(path)).map_err(|e| invalid(e.to_string())))?;
        Ok(Decoder { model: Mutex::new(model) })
    }

    /// The size of the vocabulary.
    fn vocab(&self) -> PyResult<i64> {
        Ok(lock(&self.model)?.config.vocab_size)
    }

    /// The logits `(b, t, vocab)` of `ids` `(b, t)` read after what `cache` holds; the
    /// cache then holds them too, as its policy keeps them.
    fn forward(&self, py: Python<'_>, ids: PyTensor, cache: &KvCache) -> PyResult<PyTensor> {
        py.allow_threads(move || {
            let model = lock(&self.model)?;
            if ids.device() != Device::Cpu {
                return Err(invalid("ids: the decoder runs on the CPU (ids.cpu())"));
            }
            check_ids("ids", &ids, model.config.vocab_size, None)?;
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
