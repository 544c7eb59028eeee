//! The agent: the lethe backbone over one observation per time step, with a policy and a
//! value head (Expire-Span paper, A.3.1: 2-layer, 64-unit transformers trained with
//! actor-critic). The flattened `3 x 3 x vocabulary` observation is projected to the
//! model width (the role the byte embedding plays for text); every layer remembers the
//! past through the configured memory mechanism. The policy and value heads start at
//! zero, so the untrained agent walks at random, evenly.

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use super::env::{observation_size, Action};
use lethe_core::checkpoint::Checkpoint;
use lethe_core::config::Config;
use lethe_core::error::Result;
use lethe_model::{Backbone, Memory};

/// A policy with its parameter store and the config it was built from.
pub struct Agent {
    /// The parameters.
    pub vs: nn::VarStore,
    /// The config the agent was built from.
    pub config: Config,
    obs: nn::Linear,
    body: Backbone,
    policy: nn::Linear,
    value: nn::Linear,
}

/// The agent's outputs for a block of steps.
pub struct AgentOutput {
    /// Action logits `(b, m, 4)`.
    pub logits: Tensor,
    /// State values `(b, m)`.
    pub value: Tensor,
    /// The memories' auxiliary losses (a scalar).
    pub aux_loss: Tensor,
}

impl Agent {
    /// A freshly initialised agent for the task of `config` (seeded by `config.seed`, in
    /// a seeded section of libtorch's generator: see [`lethe_core::rng::seed_torch`]).
    pub fn new(config: &Config, device: Device) -> Result<Agent> {
        // The observation layer takes every cell of the view in the task's vocabulary
        // (the portal task's grows with its rooms): four copies of its weights.
        let observation = lethe_model::Part {
            bytes: 16.0 * observation_size(config) as f64 * config.model.d_model as f64,
            what: match config.data.source {
                lethe_core::config::Source::Portal => format!(
                    "the observation layer (data.portal.rooms = {} in the view's {} inputs x model.d_model = {})",
                    config.data.portal.rooms,
                    observation_size(config),
                    config.model.d_model
                ),
                _ => format!(
                    "the observation layer ({} inputs x model.d_model = {})",
                    observation_size(config),
                    config.model.d_model
                ),
            },
        };
        lethe_model::check_fits_with(config, device, Some(observation))?;
        let _seed = lethe_core::rng::seed_torch(config.seed as i64);
        let vs = nn::VarStore::new(device);
        let p = vs.root();
        let d = config.model.d_model as i64;
        let block = config.train.block.min(config.memory.span);
        // The heads start at zero: the first policy is uniform (a random walk explores
        // evenly) and the first values are 0.
        let zero = nn::LinearConfig { ws_init: nn::Init::Const(0.0), bs_init: Some(nn::Init::Const(0.0)), bias: true };
        Ok(Agent {
            obs: nn::linear(&p / "obs", observation_size(config) as i64, d, Default::default()),
            body: Backbone::new(&p, &config.model, &config.memory, block)?,
            policy: nn::linear(&p / "policy", d, Action::COUNT as i64, zero),
            value: nn::linear(&p / "value", d, 1, zero),
            config: config.clone(),
            vs,
        })
    }

    /// An agent with the parameters (and config) of a checkpoint.
    pub fn from_checkpoint(ckpt: &Checkpoint, device: Device) -> Result<Agent> {
        let agent = Agent::new(&ckpt.config, device)?;
        ckpt.load_parameters(&agent.vs.variables())?;
        Ok(agent)
    }

    /// The parameters by name, sorted.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        lethe_model::sorted_parameters(&self.vs)
    }

    /// Number of scalar parameters.
    pub fn parameter_count(&self) -> usize {
        lethe_model::parameter_count(&self.vs)
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// Empty memories for a batch of episodes.
    pub fn new_memory(&self) -> Memory {
        self.body.new_memory()
    }

    /// Lets the memories enforce their parameter constraints after an optimiser step.
    pub fn after_step(&self) {
        self.body.after_step();
    }

    /// Runs a block of observations `(b, m, F)` with the memory carried in `mem`;
    /// `episodes` `(b, m)`, when given, numbers each step's episode, and a step then
    /// remembers only its own episode (see [`lethe_model::memory::AttendInput::episodes`]).
    pub fn forward(
        &self,
        obs: &Tensor,
        mem: &mut Memory,
        train: bool,
        episodes: Option<&Tensor>,
    ) -> Result<AgentOutput> {
        let x = self.obs.forward(&obs.to_kind(Kind::Float)); // (b, m, d)
        let out = self.body.forward(x, mem, train, episodes)?;
        Ok(AgentOutput {
            logits: self.policy.forward(&out.h),               // (b, m, 4)
            value: self.value.forward(&out.h).squeeze_dim(-1), // (b, m)
            aux_loss: out.aux_loss,
        })
    }
}
