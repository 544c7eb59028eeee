//! An Expire-Span run on a Llama-family model (`lethe train` with `memory.mechanism =
//! "expire"`) read through the decoding path: the decoder with the run's weights (its
//! low-rank adapters folded in) and, for every prompt, a fresh key-value cache whose
//! layers are the run's span predictors ([`crate::kv::expire`]: the soft mask of Eq. 5 as
//! `ln m` on the scores, expired entries deleted). `lethe eval --learned`, `lethe
//! longeval --learned`, `lethe generate --checkpoint` and `lethe bench --learned` read a
//! run this way.

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};

use super::{KvCache, Llama};
use lethe_core::config::train::Precision;
use lethe_core::config::{Config, ExpireConfig};
use lethe_core::error::Result;

/// A run's decoder and span predictors.
pub struct ExpireRun {
    model: Llama,
    /// The span predictors, `layers.<i>.attn.expire.w` and `.b`.
    predictors: HashMap<String, Tensor>,
    config: Config,
    /// What names the learned memory ([`ExpireRun::memory_fingerprint`]).
    fingerprint: String,
}

impl ExpireRun {
    /// The run of `config` with the parameters `params` (lethe's names), on their device;
    /// refused unless it is Expire-Span on a Llama-family model with a span predictor in
    /// every layer.
    pub fn new(config: &Config, params: &HashMap<String, Tensor>) -> Result<ExpireRun> {
        let predictors: HashMap<String, Tensor> = params
            .iter()
            .filter(|(name, _)| name.contains(".attn.expire."))
            .map(|(name, t)| (name.clone(), t.shallow_clone()))
            .collect();
        crate::kv::expire::layers(config, &predictors)?;
        let fingerprint = fingerprint_of(config, &predictors);
        Ok(ExpireRun { model: Llama::from_run(config, params)?, predictors, config: config.clone(), fingerprint })
    }

    /// The run with its decoder in `precision` ([`Llama::into_precision`]); the span
    /// predictors compute in float32.
    pub fn into_precision(self, precision: Precision) -> ExpireRun {
        ExpireRun { model: self.model.into_precision(precision), ..self }
    }

    /// The decoder with the run's weights, which reads the caches of [`ExpireRun::cache`].
    pub fn decoder(&self) -> &Llama {
        &self.model
    }

    /// Names the run's learned memory: a checksum of its span predictors' values and of
    /// the settings they are read with (`memory.span`, `[memory.expire]` but its budget),
    /// as `crc32 1a2b3c4d`. Two decoders of one run, in any precision and on any device,
    /// give the same one, so that a cache one of them made (saved and read back, say)
    /// is read on by the other, and by no run whose memory keeps other entries.
    pub fn memory_fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// A fresh cache under the run's own `memory.expire.budget`.
    pub fn cache(&self) -> Result<KvCache> {
        Ok(KvCache::with_layers(crate::kv::expire::layers(&self.config, &self.predictors)?))
    }

    /// A fresh cache holding at most `budget` entries a layer (0: as the spans say).
    pub fn cache_at(&self, budget: usize) -> Result<KvCache> {
        let mut config = self.config.clone();
        config.memory.expire.budget = budget;
        Ok(KvCache::with_layers(crate::kv::expire::layers(&config, &self.predictors)?))
    }
}

/// [`ExpireRun::memory_fingerprint`] of the run of `config` with span predictors
/// `predictors`: their names, shapes and float32 values in the order of their names, then
/// the settings.
fn fingerprint_of(config: &Config, predictors: &HashMap<String, Tensor>) -> String {
    let mut hasher = crc32fast::Hasher::new();
    let mut names: Vec<&String> = predictors.keys().collect();
    names.sort();
    for name in names {
        let t = predictors[name].detach().to_device(Device::Cpu).to_kind(Kind::Float).contiguous();
        hasher.update(format!("{name} {:?};", t.size()).as_bytes());
        let values = Vec::<f32>::try_from(t.view([-1])).unwrap_or_default();
        values.iter().for_each(|v| hasher.update(&v.to_le_bytes()));
    }
    let settings = ExpireConfig { budget: 0, ..config.memory.expire.clone() };
    hasher.update(format!("span {}; {settings:?}", config.memory.span).as_bytes());
    format!("crc32 {:08x}", hasher.finalize())
}
