//! A whole lethe model: `lethe._lethe.Model`, which `lethe.load` (python/lethe/model.py)
//! makes a `torch.nn.Module`.
//!
//! It is the language model the `lethe` command trains and evaluates ([`Lm`]: embedding,
//! the backbone's layers each with its memory, the output head), read from a run folder
//! or a checkpoint file, or from a Hugging Face folder lethe reads (GPT-2, the Llama
//! family) with lethe's default memory settings.

use std::path::Path;
use std::sync::Mutex;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3_tch::PyTensor;
use tch::{Device, Tensor};

use lethe_core::config::Config;
use lethe_data::text;
use lethe_data::tokenizer::Tokenizer;
use lethe_data::Token;
use lethe_model::init::{self, Source};
use lethe_model::Lm;
use lethe_train::generate;

use crate::{check_device, check_id_list, check_ids, generation, guarded, invalid, lock, restore, Named};

/// A lethe language model. See the module documentation.
#[pyclass(module = "lethe._lethe")]
pub struct Model {
    inner: Mutex<Inner>,
}

/// What a [`Model`] owns.
struct Inner {
    lm: Lm,
    /// The tokenizer the model reads text with; none for a byte-level model.
    tokenizer: Option<Tokenizer>,
    /// A parameter, for the device and dtype the parameters have now (Python may move
    /// them: `model.to(device)` changes the tensors in place).
    probe: Tensor,
}

/// The model at `path`: a run folder or checkpoint file with its parameters, or a
/// Hugging Face folder's parameters in lethe's default memory and training settings.
fn open(path: &Path) -> lethe_core::error::Result<(Lm, Option<Tokenizer>)> {
    match Source::open(path)? {
        Source::Run(ckpt) => Ok((Lm::from_checkpoint(&ckpt, Device::Cpu)?, text::tokenizer_of_checkpoint(&ckpt)?)),
        _ => {
            let mut cfg = Config::default();
            init::adopt(&mut cfg, path)?;
            let (lm, _) = init::build(&cfg, Device::Cpu, path)?;
            let tokenizer = text::tokenizer_of(&cfg)?;
            Ok((lm, tokenizer))
        }
    }
}

impl Inner {
    /// Checks `tokens`: `(b, m)` int64 ids below the vocabulary, `1 <= m <= block`, on
    /// the parameters' device.
    fn check_tokens(&self, tokens: &Tensor) -> PyResult<()> {
        let (vocab, block) = (self.lm.config.model.vocab as i64, self.lm.config.train.block as i64);
        check_device("tokens", tokens, self.probe.device())?;
        check_ids("tokens", tokens, vocab, Some(block))?;
        Ok(())
    }
}

impl Model {
    /// The model owning `lm` and `tokenizer` (`what` names where they came from).
    fn holding(lm: Lm, tokenizer: Option<Tokenizer>, what: &str) -> PyResult<Model> {
        let probe = lm
            .named_parameters()
            .first()
            .map(|(_, t)| t.shallow_clone())
            .ok_or_else(|| invalid(format!("{what}: a model without parameters")))?;
        Ok(Model { inner: Mutex::new(Inner { lm, tokenizer, probe }) })
    }
}

#[pymethods]
impl Model {
    /// The model at `path` (see the module documentation).
    #[new]
    fn new(path: &str) -> PyResult<Model> {
        let (lm, tokenizer) = guarded(|| open(Path::new(path)).map_err(|e| invalid(e.to_string())))?;
        Model::holding(lm, tokenizer, path)
    }

    /// A model of `config` (JSON, as [`Model::config`] gives it) reading text with the
    /// tokenizer `tokenizer` (a `tokenizer.json` text; none: bytes), its parameters zero
    /// and nothing drawn ([`Lm::undrawn`]): what a copy is made from, before the copied
    /// parameters take their place.
    #[staticmethod]
    #[pyo3(signature = (config, tokenizer))]
    fn from_parts(config: &str, tokenizer: Option<&str>) -> PyResult<Model> {
        let cfg: Config = serde_json::from_str(config).map_err(|e| invalid(format!("config: {e}")))?;
        let tokenizer =
            tokenizer.map(Tokenizer::from_json).transpose().map_err(|e| invalid(format!("tokenizer: {e}")))?;
        guarded(|| {
            let lm = Lm::undrawn(&cfg, Device::Cpu).map_err(|e| invalid(e.to_string()))?;
            Model::holding(lm, tokenizer, "the copied config")
        })
    }

    /// The model's config (JSON) and tokenizer (a `tokenizer.json` text, none for a
    /// byte-level model): with the parameters, all a copy needs ([`Model::from_parts`]).
    fn parts(&self) -> PyResult<(String, Option<String>)> {
        let config = self.config()?;
        let inner = lock(&self.inner)?;
        let tokenizer =
            inner.tokenizer.as_ref().map(Tokenizer::to_json).transpose().map_err(|e| invalid(e.to_string()))?;
        Ok((config, tokenizer))
    }

    /// The model's config as JSON (the run's `config.toml`).
    fn config(&self) -> PyResult<String> {
        let inner = lock(&self.inner)?;
        serde_json::to_string(&inner.lm.config).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The parameters by name (`layers.0.attn.q.weight`, `key_pe`, ...), sorted: the
    /// tensors this model computes with, not copies.
    fn parameters(&self) -> PyResult<Named> {
        let inner = lock(&self.inner)?;
        Ok(inner.lm.named_parameters().into_iter().map(|(n, t)| (n, PyTensor(t))).collect())
    }

    /// One block of `tokens` `(b, m)` over the memory `state` (empty: no memory): the
    /// next-token logits `(b, m, vocab)`, every layer's memory after the block, and the
    /// sum of the layers' auxiliary losses.
    #[pyo3(signature = (tokens, state, train))]
    fn forward(
        &self,
        py: Python<'_>,
        tokens: PyTensor,
        state: Named,
        train: bool,
    ) -> PyResult<(PyTensor, Named, PyTensor)> {
        py.allow_threads(move || {
            let inner = lock(&self.inner)?;
            guarded(|| {
                inner.check_tokens(&tokens)?;
                let mut memory = inner.lm.model.new_memory();
                let d_model = inner.lm.config.model.d_model as i64;
                let restored = restore(&state, tokens.size()[0], d_model, tokens.device())?;
                memory.load_state(&restored).map_err(|e| invalid(format!("state: {e}")))?;
                let out = inner
                    .lm
                    .model
                    .forward(&tokens, &mut memory, train)
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                let state = memory.state().into_iter().map(|(n, t)| (n, PyTensor(t))).collect();
                Ok((PyTensor(out.logits), state, PyTensor(out.aux_loss)))
            })
        })
    }

    /// `text` as the model's token ids (its tokenizer's, a long text in pieces, or UTF-8
    /// bytes).
    fn encode(&self, text: &str) -> PyResult<Vec<i64>> {
        let inner = lock(&self.inner)?;
        Ok(match &inner.tokenizer {
            Some(t) => {
                text::encode_long(t, text).map_err(|e| invalid(e.to_string()))?.into_iter().map(i64::from).collect()
            }
            None => text.bytes().map(i64::from).collect(),
        })
    }

    /// Token ids as text (bytes that are not UTF-8 replaced, for a byte-level model).
    fn decode(&self, ids: Vec<i64>) -> PyResult<String> {
        let inner = lock(&self.inner)?;
        let vocab = inner.lm.config.model.vocab as i64;
        check_id_list("ids", &ids, vocab)?;
        let ids: Vec<Token> = ids.into_iter().map(|i| i as Token).collect();
        match &inner.tokenizer {
            Some(t) => t.decode(&ids).map_err(|e| invalid(e.to_string())),
            None => Ok(String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<u8>>()).into_owned()),
        }
    }

    /// `count` tokens after `prompt` (ids), from an empty memory, as `lethe generate`
    /// makes them: the prompt read in blocks, then each token chosen from the logits by
    /// `sampling`, `(temperature, top_k, top_p, seed)` (greedy at temperature 0). Python's
    /// signals are checked every few tokens, so Ctrl-C stops a long generation.
    #[pyo3(signature = (prompt, count, sampling))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: Vec<i64>,
        count: usize,
        sampling: (f64, usize, f64, u64),
    ) -> PyResult<Vec<i64>> {
        generation::check_count(count)?;
        py.allow_threads(move || {
            let inner = lock(&self.inner)?;
            let prompt = generation::prompt_tokens(prompt, inner.lm.config.model.vocab as i64)?;
            let sampling = generation::sampling(sampling)?;
            guarded(|| {
                let _no_grad = tch::no_grad_guard();
                generation::collect(count, |emit| {
                    generate::stream(&inner.lm, &prompt, count, &sampling, |_, _| {}, emit)
                })
            })
        })
    }
}
