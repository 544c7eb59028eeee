//! The model: the shared backbone, its attention helpers, and the memory mechanisms.

pub mod attention;
pub mod backbone;
pub mod memory;

use std::collections::HashMap;

use tch::{nn, Device, Tensor};

pub use backbone::{correct, token_nll, Backbone, Forward, Hidden, Memory, Model};

use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::error::Result;

/// The parameters of `vs` by name, sorted (a stable order for the optimiser and
/// checkpoints). Shared by the language model and the gridworld agent.
pub fn sorted_parameters(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let vars: HashMap<String, Tensor> = vs.variables();
    let mut out: Vec<(String, Tensor)> = vars.into_iter().collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Number of scalar parameters in `vs`.
pub fn parameter_count(vs: &nn::VarStore) -> usize {
    vs.variables().values().map(Tensor::numel).sum()
}

/// A model with its parameter store and the config it was built from.
pub struct Lm {
    /// The parameters.
    pub vs: nn::VarStore,
    /// The network.
    pub model: Model,
    /// The config the model was built from.
    pub config: Config,
}

impl Lm {
    /// A freshly initialised model (initialisation is seeded by `config.seed`, in a
    /// seeded section of libtorch's generator, so the same seed gives the same model
    /// whatever other threads do). Fails only for a config that does not validate.
    pub fn new(config: &Config, device: Device) -> Result<Self> {
        let _seed = crate::rng::seed_torch(config.seed as i64);
        let vs = nn::VarStore::new(device);
        let model = Model::new(&vs.root(), &config.model, &config.memory, config.train.block)?;
        Ok(Lm { vs, model, config: config.clone() })
    }

    /// A model with the parameters (and config) of a checkpoint.
    pub fn from_checkpoint(ckpt: &Checkpoint, device: Device) -> Result<Self> {
        let lm = Lm::new(&ckpt.config, device)?;
        ckpt.load_parameters(&lm.vs.variables())?;
        Ok(lm)
    }

    /// The parameters by name, sorted (a stable order for the optimiser and checkpoints).
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        sorted_parameters(&self.vs)
    }

    /// Number of scalar parameters.
    pub fn parameter_count(&self) -> usize {
        parameter_count(&self.vs)
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.vs.device()
    }
}
