//! The learned memories compared with the key-value cache policies on a pretrained
//! decoder (`--learned` of `lethe eval --init-from` and `lethe longeval --init-from`):
//! lethe runs of the folder's model with Expire-Span, capped at each budget, or with the
//! ∞-former, at the memory it was trained with. Expire-Span on a Llama-family model is
//! read as the policies are, through the decoding path with the run's span predictors on
//! the key-value cache (`lethe::model::kv::expire`: the training model's logits, faster);
//! the ∞-former through its training model.

use anyhow::Result;
use lethe::config::train::Precision;
use lethe::model::llama::{ExpireRun, KvCache, Llama};

/// A run of `--learned`: an Expire-Span model, scored at every budget of a sweep and
/// uncapped, or an ∞-former, whose memory has the size it was trained with (its window
/// and basis), scored once, in blocks of its own `train.block`.
pub(crate) struct Learned {
    pub name: String,
    pub ckpt: lethe::checkpoint::Checkpoint,
    /// Expire-Span on a Llama: the decoder with the run's weights (adapters folded) and
    /// its span predictors, which make its caches' layers.
    decoding: Option<ExpireRun>,
    /// Where the run's models are read.
    device: tch::Device,
    /// The precision of an Expire-Span Llama's decoder (an ∞-former reads in float32).
    precision: Precision,
}

impl Learned {
    /// The run at `path`, refused unless it is an Expire-Span model or an ∞-former of the
    /// shape of `folder`'s model that reads `text` as the ids `ids` (the folder's
    /// tokenizer), ready to be scored on `device` (an Expire-Span Llama through the
    /// decoding path, its decoder in `precision`; an ∞-former in float32, with a note
    /// when another precision is asked for). A run fitted onto another folder of the same
    /// shape is scored, with a note.
    pub fn load(
        path: &std::path::Path,
        (text, ids): (&str, &[lethe::data::Token]),
        folder: &std::path::Path,
        (device, precision): (tch::Device, Precision),
    ) -> Result<Learned> {
        let mut learned = Learned::open(path)?;
        (learned.device, learned.precision) = (device, precision);
        if !learned.capped() && precision != Precision::F32 {
            lethe::say!(
                "note: --learned `{}` is an ∞-former, read through its training model in f32; --precision {} applies to the decoder and Expire-Span runs",
                path.display(),
                precision.name()
            );
        }
        learned.refuse_another_model(folder).map_err(|e| at(path, &e))?;
        let own = super::decoder::run_ids(&learned.ckpt, text, ids.len()).map_err(|e| at(path, &e))?;
        if !own.starts_with(ids) {
            return Err(at(path, &"reads the text as other ids than the folder's tokenizer.json: a run compared with the folder must share its tokenizer"));
        }
        learned.build_decoder().map_err(|e| at(path, &e))?;
        Ok(learned)
    }

    /// Refuses a run whose model is not of `folder`'s shape (its first differing
    /// `[model]` field named); notes one fitted onto another folder.
    pub fn refuse_another_model(&self, folder: &std::path::Path) -> Result<()> {
        let model = &self.ckpt.config.model;
        let theirs = lethe::model::llama::LlamaConfig::from_file(&folder.join("config.json"))?;
        let theirs = lethe::model::llama::layout::model_config(&theirs, model.dropout).map_err(anyhow::Error::msg)?;
        let (ours, theirs) = (serde_json::to_value(model)?, serde_json::to_value(&theirs)?);
        if let Some((field, value, folder_value)) = first_difference("model", &ours, &theirs) {
            anyhow::bail!(
                "its model is not `{}`'s: {field} = {value} where the folder's gives {folder_value}",
                folder.display()
            );
        }
        let same = |a: &std::path::Path| a.canonicalize().ok() == folder.canonicalize().ok();
        if let Some(from) = self.ckpt.config.train.init_from.as_deref().filter(|from| !same(from)) {
            lethe::say!(
                "note: --learned `{}` was fitted onto `{}` and is compared here with `{}`, a model of the same shape",
                self.ckpt.path.display(),
                from.display(),
                folder.display()
            );
        }
        Ok(())
    }

    /// The run at `path`, refused unless it is an Expire-Span model or an ∞-former; its
    /// decoder not built (`lethe bench` builds its own per case); on the CPU.
    pub fn open(path: &std::path::Path) -> Result<Learned> {
        use lethe::config::Mechanism;
        let ckpt = lethe::checkpoint::Checkpoint::load(path).map_err(|e| at(path, &e))?;
        let mechanism = ckpt.config.memory.mechanism;
        if !matches!(mechanism, Mechanism::Expire | Mechanism::Infinity) {
            return Err(at(path, &format!(
                "its memory is {}; a sweep compares Expire-Span runs (capped at each budget by memory.expire.budget) and ∞-former runs (at the memory they were trained with)",
                mechanism.name()
            )));
        }
        Ok(Learned {
            name: format!("{} ({})", mechanism.name(), ckpt.config.name),
            ckpt,
            decoding: None,
            device: tch::Device::Cpu,
            precision: Precision::F32,
        })
    }

    /// Expire-Span on a Llama: builds the decoder with the run's weights, through which
    /// [`Learned::decoder`] and [`Learned::cache_at`] read it (other runs: nothing).
    fn build_decoder(&mut self) -> Result<()> {
        let cfg = &self.ckpt.config;
        if cfg.memory.mechanism == lethe::config::Mechanism::Expire && cfg.model.arch == lethe::config::Arch::Llama {
            let params = self.at_budget(0, 1)?.vs.variables();
            self.decoding = Some(ExpireRun::new(&self.ckpt.config, &params)?.into_precision(self.precision));
        }
        Ok(())
    }

    /// Expire-Span on a Llama: the decoder with the run's weights, which reads the caches
    /// of [`Learned::cache_at`].
    pub fn decoder(&self) -> Option<&Llama> {
        self.decoding.as_ref().map(ExpireRun::decoder)
    }

    /// A fresh cache of the run's span predictors' layers (Expire-Span on a Llama),
    /// holding at most `budget` entries a layer (0: as the spans say).
    pub fn cache_at(&self, budget: i64) -> lethe::Result<KvCache> {
        match &self.decoding {
            Some(run) => run.cache_at(budget as usize),
            None => Err(lethe::LetheError::Invalid(format!("{}: not Expire-Span on a Llama-family model", self.name))),
        }
    }

    /// Whether a budget caps the run (Expire-Span), rather than its trained size.
    pub fn capped(&self) -> bool {
        self.ckpt.config.memory.mechanism == lethe::config::Mechanism::Expire
    }

    /// Tokens read at a time: `--block` (else 1) for Expire-Span, the run's own block for
    /// an ∞-former, whose long-term memory absorbs whole blocks.
    pub fn block(&self, asked: Option<usize>) -> usize {
        match self.capped() {
            true => asked.unwrap_or(1),
            false => self.ckpt.config.train.block,
        }
    }

    /// The run's model holding at most `budget` memories a layer (0: as its spans say),
    /// reading `block` tokens at a time (Expire-Span; an ∞-former keeps its own).
    pub fn at_budget(&self, budget: i64, block: usize) -> Result<lethe::model::Lm> {
        let mut cfg = self.ckpt.config.clone();
        if self.capped() {
            cfg.memory.expire.budget = budget as usize;
            cfg.memory.expire.deletion = lethe::config::Deletion::Stream;
            cfg.train.block = block;
        }
        let lm = lethe::model::Lm::undrawn(&cfg, self.device)?;
        self.ckpt.load_parameters(&lm.vs.variables())?;
        Ok(lm)
    }
}

/// The first field (by its dotted name under `at`) where `ours` and `theirs` differ,
/// with the two values; objects are compared field by field.
fn first_difference(
    at: &str,
    ours: &serde_json::Value,
    theirs: &serde_json::Value,
) -> Option<(String, String, String)> {
    match (ours.as_object(), theirs.as_object()) {
        (Some(ours), Some(theirs)) => ours.iter().find_map(|(key, value)| {
            let there = theirs.get(key).unwrap_or(&serde_json::Value::Null);
            first_difference(&format!("{at}.{key}"), value, there)
        }),
        _ if ours == theirs => None,
        _ => Some((at.to_string(), ours.to_string(), theirs.to_string())),
    }
}

/// An error about the `--learned` run at `path`.
fn at(path: &std::path::Path, e: &dyn std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("--learned `{}`: {e}", path.display())
}
