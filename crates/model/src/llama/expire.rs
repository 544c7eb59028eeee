//! An Expire-Span run on a Llama-family model (`lethe train` with `memory.mechanism =
//! "expire"`) read through the decoding path: the decoder with the run's weights (its
//! low-rank adapters folded in) and, for every prompt, a fresh key-value cache whose
//! layers are the run's span predictors ([`crate::kv::expire`]: the soft mask of Eq. 5 as
//! `ln m` on the scores, expired entries deleted). `lethe eval --learned`, `lethe
//! longeval --learned`, `lethe generate --checkpoint` and `lethe bench --learned` read a
//! run this way.

use std::collections::HashMap;

use tch::Tensor;

use super::{KvCache, Llama};
use lethe_core::config::train::Precision;
use lethe_core::config::Config;
use lethe_core::error::Result;

/// A run's decoder and span predictors.
pub struct ExpireRun {
    model: Llama,
    /// The span predictors, `layers.<i>.attn.expire.w` and `.b`.
    predictors: HashMap<String, Tensor>,
    config: Config,
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
        Ok(ExpireRun { model: Llama::from_run(config, params)?, predictors, config: config.clone() })
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
