//! Starting a run from trained parameters (`train.init_from`, `--init-from`): a
//! pretrained GPT-2 ([`super::gpt2`]) or Llama-family decoder ([`super::llama::layout`])
//! in the Hugging Face layout, or a lethe run. The
//! architecture is the source's: [`adopt`] sets the config's `[model]` sizes (and the
//! tokenizer) from it before the model is built, then [`build`] makes the model and copies
//! every parameter the source has into it; only the ones it lacks (a memory mechanism
//! added for fine-tuning, as the ∞-former's long-term memory on GPT-2) are drawn, and
//! they are listed. [`load`] copies into a model already made.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::{Device, Tensor};

use super::gpt2::{self, Gpt2Config};
use super::llama::{self, LlamaConfig};
use super::Lm;
use lethe_core::checkpoint::Checkpoint;
use lethe_core::config::{Config, ModelConfig};
use lethe_core::error::{LetheError, Result};

/// Where the parameters come from.
pub enum Source {
    /// A Hugging Face GPT-2 folder.
    HuggingFace {
        /// The folder.
        dir: PathBuf,
        /// Its `config.json`.
        config: Gpt2Config,
    },
    /// A Hugging Face Llama-family folder (Llama, Mistral, Qwen2/3, SmolLM2).
    Llama {
        /// The folder.
        dir: PathBuf,
        /// Its `config.json`.
        config: Box<LlamaConfig>,
        /// The `[model]` section it makes.
        model: Box<ModelConfig>,
    },
    /// A lethe checkpoint (a run folder's, or a file).
    Run(Box<Checkpoint>),
}

impl Source {
    /// Reads what `path` holds: a Hugging Face folder, or a lethe run folder or
    /// checkpoint file. The error names the path and what was missing.
    pub fn open(path: &Path) -> Result<Source> {
        let file = path.join("config.json");
        if file.exists() {
            lethe_core::input::check_file(&file).map_err(|why| LetheError::checkpoint(&file, why))?;
        }
        if llama::is_llama_folder(path) {
            let config = LlamaConfig::from_file(&file)?;
            let model = llama::layout::model_config(&config, 0.0).map_err(|why| LetheError::checkpoint(&file, why))?;
            return Ok(Source::Llama { dir: path.to_path_buf(), config: Box::new(config), model: Box::new(model) });
        }
        if gpt2::is_hugging_face_folder(path) {
            let config = Gpt2Config::from_file(&file)?;
            return Ok(Source::HuggingFace { dir: path.to_path_buf(), config });
        }
        if !path.exists() {
            let why = "does not exist; train.init_from (--init-from) names a Hugging Face model folder, a lethe run folder or a checkpoint file";
            return Err(LetheError::checkpoint(path, why));
        }
        if path.is_dir() && !path.join("checkpoint.safetensors").is_file() {
            let why = "is neither a Hugging Face model folder (config.json and model.safetensors) nor a lethe run folder (checkpoint.safetensors)";
            return Err(LetheError::checkpoint(path, why));
        }
        let ckpt = Checkpoint::load(path)?;
        if ckpt.config.data.source.is_rl() {
            return Err(LetheError::checkpoint(&ckpt.path, "holds a gridworld agent, not a language model"));
        }
        Ok(Source::Run(Box::new(ckpt)))
    }

    /// The source's architecture, with `dropout` (the new run's).
    pub fn model_config(&self, dropout: f64) -> ModelConfig {
        match self {
            Source::HuggingFace { config, .. } => config.model_config(dropout),
            Source::Llama { model, .. } => ModelConfig { dropout, ..(**model).clone() },
            Source::Run(ckpt) => ModelConfig { dropout, ..ckpt.config.model.clone() },
        }
    }

    /// The tokenizer the source was trained with: a Hugging Face folder's own (when it
    /// holds one), or the run's: its folder's copy, else its `data.tokenizer`.
    pub fn tokenizer(&self) -> Option<PathBuf> {
        match self {
            Source::HuggingFace { dir, .. } | Source::Llama { dir, .. } => {
                let has = dir.join("tokenizer.json").is_file() || dir.join("vocab.json").is_file();
                has.then(|| dir.clone())
            }
            Source::Run(ckpt) => ckpt.run_tokenizer().or_else(|| ckpt.config.data.tokenizer.clone()),
        }
    }

    /// The parameters, by lethe's names.
    fn parameters(&self) -> Result<HashMap<String, Tensor>> {
        match self {
            Source::HuggingFace { dir, config } => Ok(gpt2::read_weights(dir, config)?.into_iter().collect()),
            Source::Llama { dir, config, .. } => Ok(llama::layout::read_parameters(dir, config)?.into_iter().collect()),
            Source::Run(ckpt) => Ok(ckpt.parameters()),
        }
    }

    fn path(&self) -> &Path {
        match self {
            Source::HuggingFace { dir, .. } | Source::Llama { dir, .. } => dir,
            Source::Run(ckpt) => &ckpt.path,
        }
    }
}

/// Makes `cfg` build the source's architecture: its `[model]` sizes (the dropout stays
/// the config's) and, when the config names none, its tokenizer.
pub fn adopt(cfg: &mut Config, from: &Path) -> Result<()> {
    let source = Source::open(from)?;
    cfg.model = source.model_config(cfg.model.dropout);
    if cfg.data.tokenizer.is_none() {
        cfg.data.tokenizer = source.tokenizer();
    }
    cfg.train.init_from = Some(from.to_path_buf());
    Ok(())
}

/// What [`load`] did.
#[derive(Debug)]
pub struct Loaded {
    /// Parameters copied from the source.
    pub copied: usize,
    /// Parameters the source lacks, left at their initialisation (sorted); with
    /// [`load_fitting`], also those the source has in another shape.
    pub fresh: Vec<String>,
}

/// Copies the parameters of the source at `from` into `lm`. Fails, naming the tensor,
/// when a parameter of the same name has another shape (another architecture), or
/// when the source shares no parameter with the model.
pub fn load(lm: &Lm, from: &Path) -> Result<Loaded> {
    copy_parameters(lm, from, true)
}

/// [`load`], leaving a parameter that the source has in another shape at its
/// initialisation (listed in `fresh`) instead of failing: for `lethe bench`, where one
/// trained run is timed beside other mechanisms whose position tables cover other
/// spans. Still fails when the source shares no parameter with the model.
pub fn load_fitting(lm: &Lm, from: &Path) -> Result<Loaded> {
    copy_parameters(lm, from, false)
}

/// The settings that give parameter `name` its shape, as an error names them.
fn sized_by(name: &str) -> &'static str {
    if name.contains(".expire.") {
        "`memory.expire.per_head` (one span predictor a layer, or one per key-value head)"
    } else if name.contains("lora") {
        "`train.lora_rank`"
    } else {
        "the [model] sizes"
    }
}

/// A model of `cfg` on `device` holding the parameters of the source at `from`, as
/// [`Lm::new`] and then [`load`] would make it, except that what the source has is not
/// drawn first only to be overwritten: only the parameters it lacks are drawn.
pub fn build(cfg: &Config, device: Device, from: &Path) -> Result<(Lm, Loaded)> {
    let source = Source::open(from)?;
    let saved = source.parameters()?;
    let lm = Lm::drawing_all_but(cfg, device, saved.keys().cloned().collect())?;
    let loaded = copy_into(&lm, &source, &saved, true)?;
    Ok((lm, loaded))
}

fn copy_parameters(lm: &Lm, from: &Path, strict: bool) -> Result<Loaded> {
    let source = Source::open(from)?;
    copy_into(lm, &source, &source.parameters()?, strict)
}

/// Copies `saved`, read from `source`, into `lm` ([`load`], [`load_fitting`]).
fn copy_into(lm: &Lm, source: &Source, saved: &HashMap<String, Tensor>, strict: bool) -> Result<Loaded> {
    let _guard = tch::no_grad_guard();
    let mut loaded = Loaded { copied: 0, fresh: vec![] };
    for (name, mut var) in lm.named_parameters() {
        let Some(t) = saved.get(&name) else {
            loaded.fresh.push(name);
            continue;
        };
        if t.size() != var.size() {
            if !strict {
                loaded.fresh.push(name);
                continue;
            }
            let why = format!(
                "parameter `{name}` has shape {:?}, this model's has {:?}: {} must be the source's",
                t.size(),
                var.size(),
                sized_by(&name)
            );
            return Err(LetheError::checkpoint(source.path(), why));
        }
        var.f_copy_(&t.to_device(var.device()).to_kind(var.kind()))
            .map_err(|e| LetheError::checkpoint(source.path(), format!("parameter `{name}`: {e}")))?;
        loaded.copied += 1;
    }
    if loaded.copied == 0 {
        return Err(LetheError::checkpoint(source.path(), "shares no parameter with this model"));
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::config::Mechanism;

    /// A run started from a source draws only the parameters the source lacks: from a
    /// source holding all of them nothing is drawn (torch's stream is where seeding left
    /// it), while the ∞-former's memory added to a Transformer-XL source is drawn; what
    /// the source holds is copied either way, and `load`'s report is the same.
    #[test]
    fn a_model_built_from_a_source_draws_only_what_it_lacks() {
        let mut source_cfg = Config::preset("enwik8-tiny").unwrap();
        source_cfg.memory.mechanism = Mechanism::Fixed;
        let mut with_memory = source_cfg.clone();
        (with_memory.memory.mechanism, with_memory.memory.infinity.gate) = (Mechanism::Infinity, true);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("source.safetensors");
        let source = Lm::new(&source_cfg, Device::Cpu).unwrap();
        let state = lethe_core::checkpoint::TrainState::new(1, &(), 0).unwrap();
        lethe_core::checkpoint::save(&path, &source_cfg, &state, &source.named_parameters()).unwrap();
        let saved: HashMap<String, Tensor> = source.named_parameters().into_iter().collect();
        // One section of torch's generator around each build and the draw after it.
        let build_then_draw = |cfg: &Config| {
            let _section = lethe_core::rng::seed_torch(0);
            let (lm, loaded) = build(cfg, Device::Cpu, &path).unwrap();
            (lm, loaded, Tensor::randn([4], (tch::Kind::Float, Device::Cpu)))
        };
        let seeded_only = {
            let _section = lethe_core::rng::seed_torch(source_cfg.seed as i64);
            Tensor::randn([4], (tch::Kind::Float, Device::Cpu))
        };
        for (cfg, draws) in [(&source_cfg, false), (&with_memory, true)] {
            let (lm, loaded, next) = build_then_draw(cfg);
            assert_eq!(!next.equal(&seeded_only), draws, "{:?}: drew {}", cfg.memory.mechanism, !draws);
            let reference = Lm::new(cfg, Device::Cpu).unwrap();
            let reference_loaded = load(&reference, &path).unwrap();
            assert_eq!((loaded.copied, &loaded.fresh), (reference_loaded.copied, &reference_loaded.fresh));
            assert_eq!(loaded.fresh.is_empty(), !draws);
            for (name, t) in lm.named_parameters() {
                match saved.get(&name) {
                    Some(want) => assert!(t.equal(want), "`{name}` is not the source's"),
                    None if name.ends_with(".sigma_b") => {} // starts at zero
                    None => assert!(t.abs().sum(tch::Kind::Float).double_value(&[]) > 0.0, "`{name}` left undrawn"),
                }
            }
        }
    }
}
