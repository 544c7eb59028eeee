//! The model: the shared backbone, its attention helpers, and the memory mechanisms.

pub mod adaptive;
pub mod attention;
pub mod backbone;
pub mod cache_grad;
pub mod chunks;
pub mod decode;
pub mod gpt2;
pub mod init;
pub mod kv;
pub mod llama;
pub mod lora;
pub mod memory;
pub mod rope;
pub mod skew;
mod undrawn;

use std::collections::{HashMap, HashSet};

use tch::{nn, Device, Tensor};

pub use backbone::{correct, token_nll, Backbone, Forward, Hidden, Memory, Model};

use lethe_core::checkpoint::Checkpoint;
use lethe_core::config::Config;
use lethe_core::error::{LetheError, Result};
use undrawn::Given;

/// The parameters of `vs` by name, sorted (a stable order for the optimiser and
/// checkpoints). Shared by the language model and the gridworld agent.
pub fn sorted_parameters(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let vars: HashMap<String, Tensor> = vs.variables();
    let mut out: Vec<(String, Tensor)> = vars.into_iter().collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The parameters the optimiser updates, of `params` (name, tensor): all of them, or
/// with `freeze_base` (`train.freeze_base`) only the memory mechanism's own
/// ([`memory::is_mechanism_parameter`]) and the low-rank adapters ([`lora::is_adapter`]),
/// the others set to take no gradient, so that the backward pass computes none for them
/// and the optimiser keeps no moments.
pub fn trainable(params: Vec<(String, Tensor)>, freeze_base: bool) -> Vec<(String, Tensor)> {
    if !freeze_base {
        return params;
    }
    let (mechanism, base): (Vec<_>, Vec<_>) =
        params.into_iter().partition(|(name, _)| memory::is_mechanism_parameter(name) || lora::is_adapter(name));
    for (_, p) in base {
        let _ = p.set_requires_grad(false);
    }
    mechanism
}

/// The entries of `t`, flattened, as numbers on the host.
pub fn host_values(t: &Tensor) -> Result<Vec<f64>> {
    Vec::<f64>::try_from(t.to_kind(tch::Kind::Double).to_device(Device::Cpu).flatten(0, -1))
        .map_err(|e| LetheError::Invalid(format!("reading a tensor: {e}")))
}

/// Central difference (step 1e-6) of `loss` at entry `at` of `t`: `loss` of two copies of
/// `t` without gradient, that entry moved up and down. For the gradient checks of the
/// custom autograd pieces' unit tests.
#[cfg(test)]
pub fn central_difference(t: &Tensor, at: &[i64], loss: impl Fn(&Tensor) -> Tensor) -> f64 {
    let eps = 1e-6;
    let moved = |by: f64| {
        let copy = t.detach().copy();
        let mut entry = at.iter().fold(copy.shallow_clone(), |e, &i| e.get(i));
        let _ = entry.fill_(t.double_value(at) + by);
        tch::no_grad(|| loss(&copy)).double_value(&[])
    };
    (moved(eps) - moved(-eps)) / (2.0 * eps)
}

/// Number of scalar parameters in `vs`.
pub fn parameter_count(vs: &nn::VarStore) -> usize {
    vs.variables().values().map(Tensor::numel).sum()
}

/// A part of a training step's memory: its bytes, and what it is, with the config
/// fields that multiply into it and their values.
#[derive(Clone, Debug)]
pub struct Part {
    /// Bytes (a lower bound).
    pub bytes: f64,
    /// What the part holds and the fields that size it, e.g. "the layers' weights
    /// (model.layers = 2 x model.d_model = 64, model.d_ffn = 256)".
    pub what: String,
}

/// A lower bound of the bytes one training step of `config` needs, by part.
pub fn footprint_parts(config: &Config) -> Vec<Part> {
    let (m, d, l) = (&config.model, config.model.d_model as f64, config.model.layers as f64);
    // On GPT-2 and Llama a query sees its whole block even when memory.span is shorter (or 0).
    let span = match m.arch {
        lethe_core::config::Arch::Lethe => config.memory.span,
        _ => config.memory.span.max(config.train.block),
    };
    let (batch, block) = (config.train.batch as f64, config.train.block.min(span) as f64);
    // Every stream keeps its memory through the step; a micro-batch's streams
    // (`train.accum`) hold their attention and activations at a time.
    let micro = (config.train.batch / config.train.accum.max(1)) as f64;
    let reach = span as f64 + block;
    let rows = memory::position_rows(&config.memory, config.train.block) as f64;
    let f32s = |n: f64| 4.0 * n;
    let (layers, width, ffn, streams) = (
        format!("model.layers = {}", m.layers),
        format!("model.d_model = {}", m.d_model),
        format!("model.d_ffn = {}", m.d_ffn),
        format!("train.batch = {}", config.train.batch),
    );
    let micro_streams = match config.train.accum {
        1 => streams.clone(),
        accum => format!("train.batch = {} / train.accum = {accum}", config.train.batch),
    };
    // Parameters, their gradients and two Adam moments: four copies; one of frozen
    // pretrained weights (`train.freeze_base`).
    let positions = match m.arch {
        lethe_core::config::Arch::Lethe => Part {
            bytes: 4.0 * f32s(rows * d / m.heads as f64),
            what: format!("the position table (memory.span = {} x {width})", config.memory.span),
        },
        lethe_core::config::Arch::Gpt2 => Part {
            bytes: 4.0 * f32s(m.positions as f64 * d),
            what: format!("the position table (model.positions = {} x {width})", m.positions),
        },
        lethe_core::config::Arch::Llama => Part { bytes: 0.0, what: "rotary positions (no table)".to_string() },
    };
    let copies = if config.train.freeze_base { 1.0 } else { 4.0 };
    let cache = f32s(l * batch * reach * d);
    let attention = 3.0 * f32s(l * micro * m.heads as f64 * block * reach);
    vec![
        positions,
        Part {
            bytes: cache,
            what: format!("the memory held (memory.span = {} x {streams} x {layers}, {width})", config.memory.span),
        },
        Part {
            bytes: attention,
            what: format!(
                "the memory's attention (memory.span = {} x {micro_streams} x {layers}, model.heads = {})",
                config.memory.span, m.heads
            ),
        },
        Part {
            bytes: copies * f32s(2.0 * m.vocab as f64 * d),
            what: format!("the embeddings (model.vocab = {} x {width})", m.vocab),
        },
        Part {
            bytes: copies * f32s(l * (4.0 * d * d + 2.0 * d * m.d_ffn as f64)),
            what: format!("the layers' weights ({layers} x {width}, {ffn})"),
        },
        Part {
            bytes: f32s(l * micro * block * (10.0 * d + 2.0 * m.d_ffn as f64)),
            what: format!(
                "the activations ({micro_streams} x train.block = {} x {layers}, {width}, {ffn})",
                config.train.block
            ),
        },
    ]
}

/// A lower bound of the bytes one training step of `config` needs.
pub fn footprint(config: &Config) -> f64 {
    footprint_parts(config).iter().map(|p| p.bytes).sum()
}

/// Refuses, before anything is allocated, a config whose training step cannot fit in
/// this machine's memory on the CPU (a span of 10^12 made libtorch abort on a 64 TB
/// allocation), naming the largest part and every field that sizes it. GPUs are not
/// checked here: libtorch's own error says so there.
pub fn check_fits(config: &Config, device: Device) -> Result<()> {
    check_fits_with(config, device, None)
}

/// [`check_fits`] with one more part of the step's memory that the model's own config
/// does not show (a gridworld agent's observation layer).
pub fn check_fits_with(config: &Config, device: Device, extra: Option<Part>) -> Result<()> {
    if device != Device::Cpu {
        return Ok(());
    }
    let Some(available) = lethe_core::input::total_memory_bytes() else { return Ok(()) };
    fits_within(footprint_parts(config).into_iter().chain(extra).collect(), available as f64)
}

fn fits_within(parts: Vec<Part>, available: f64) -> Result<()> {
    let need: f64 = parts.iter().map(|p| p.bytes).sum();
    if need <= available {
        return Ok(());
    }
    let gib = |b: f64| b / (1u64 << 30) as f64;
    let largest = parts
        .iter()
        .max_by(|a, b| a.bytes.total_cmp(&b.bytes))
        .map(|p| format!("; the largest part, {:.1} GiB, is {}", gib(p.bytes), p.what))
        .unwrap_or_default();
    Err(LetheError::Invalid(format!(
        "config: a step would need at least {:.1} GiB, more than this machine's {:.1} GiB of memory{largest}",
        gib(need),
        gib(available)
    )))
}

/// Refuses, before anything is allocated, configs that are to be held in memory at once
/// (`lethe bench --rounds` builds every config before timing them in turns) when their
/// training steps together cannot fit in this machine's memory on the CPU, even if
/// each fits alone ([`check_fits`]).
pub fn check_fit_together(configs: &[&Config], device: Device) -> Result<()> {
    if device != Device::Cpu {
        return Ok(());
    }
    let Some(available) = lethe_core::input::total_memory_bytes() else { return Ok(()) };
    fit_together_within(configs, available as f64)
}

fn fit_together_within(configs: &[&Config], available: f64) -> Result<()> {
    let need: f64 = configs.iter().map(|c| footprint(c)).sum();
    if need <= available {
        return Ok(());
    }
    let gib = |b: f64| b / (1u64 << 30) as f64;
    Err(LetheError::Invalid(format!(
        "--rounds holds all {} configs in memory at once: their training steps together would need at least {:.1} GiB, more than this machine's {:.1} GiB; bench them one at a time (without --rounds) or fewer at once",
        configs.len(),
        gib(need),
        gib(available)
    )))
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
    /// whatever other threads do). The parameters are drawn on the CPU and copied to
    /// `device`, so a seed gives the same model on a GPU as on the CPU (a GPU's own
    /// generator draws other numbers). Fails only for a config that does not validate.
    pub fn new(config: &Config, device: Device) -> Result<Self> {
        check_fits(config, device)?;
        let (vs, model) = Self::build(config, Device::Cpu)?;
        if device == Device::Cpu {
            return Ok(Lm { vs, model, config: config.clone() });
        }
        let (mut on_device, model) = undrawn::given(Given::All, || Self::assemble(config, device))?;
        on_device.copy(&vs).map_err(|e| {
            LetheError::Invalid(format!("copying the initial parameters to {}: {e}", lethe_core::device::name(device)))
        })?;
        Ok(Lm { vs: on_device, model, config: config.clone() })
    }

    /// The parameter store and network of `config` on `device`, initialised under its seed.
    fn build(config: &Config, device: Device) -> Result<(nn::VarStore, Model)> {
        let _seed = lethe_core::rng::seed_torch(config.seed as i64);
        Self::assemble(config, device)
    }

    /// The parameter store and network of `config` on `device`, initialised from torch's
    /// stream as it is.
    fn assemble(config: &Config, device: Device) -> Result<(nn::VarStore, Model)> {
        let vs = nn::VarStore::new(device);
        let mut model = Model::new(&vs.root(), &config.model, &config.memory, config.train.block)?;
        if config.train.lora_rank > 0 {
            model.adapt(&vs.root(), config.train.lora_rank, config.train.lora_alpha);
        }
        Ok((vs, model))
    }

    /// The model of `config` on `device` with every parameter zero, nothing drawn and
    /// torch's random stream left where it was: for parameters copied in whole, a
    /// checkpoint's or a copy's ([`undrawn`]).
    pub fn undrawn(config: &Config, device: Device) -> Result<Self> {
        check_fits(config, device)?;
        let (vs, model) = undrawn::given(Given::All, || Self::assemble(config, device))?;
        Ok(Lm { vs, model, config: config.clone() })
    }

    /// [`Lm::new`], but the parameters `given` names (their values to be copied in, as
    /// [`init::build`] copies a source's) left zero, not drawn.
    fn drawing_all_but(config: &Config, device: Device, given: HashSet<String>) -> Result<Self> {
        undrawn::given(Given::These(given), || Lm::new(config, device))
    }

    /// A model with the parameters (and config) of a checkpoint, made on `device` with
    /// nothing drawn (every parameter is the checkpoint's): torch's random stream is left
    /// where it was.
    pub fn from_checkpoint(ckpt: &Checkpoint, device: Device) -> Result<Self> {
        let task = ckpt.config.data.source;
        if task.is_rl() {
            let why = format!(
                "holds a gridworld agent ({task}), not a language model: use `lethe play` or `lethe eval` on it"
            );
            return Err(LetheError::checkpoint(&ckpt.path, why));
        }
        let lm = Lm::undrawn(&ckpt.config, device)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use lethe_core::config::{Arch, Compressor, Init, Mechanism};

    /// `Lm::from_checkpoint` draws nothing (torch's random stream is where it was) and
    /// holds the checkpoint's parameters, for every mechanism, the Conv compressor, the
    /// ∞-former's gate, adaptive embeddings, a Llama with low-rank adapters; a model built
    /// after it draws its parameters again.
    #[test]
    fn a_model_read_from_a_checkpoint_draws_nothing() {
        let mut configs = Vec::new();
        for mechanism in
            [Mechanism::Fixed, Mechanism::Expire, Mechanism::Adaptive, Mechanism::Compressive, Mechanism::Infinity]
        {
            let mut cfg = Config::preset("enwik8-tiny").unwrap();
            (cfg.memory.mechanism, cfg.memory.compressive.compressor, cfg.memory.infinity.gate) =
                (mechanism, Compressor::Conv, true);
            configs.push(cfg);
        }
        let mut adaptive = Config::preset("enwik8-tiny").unwrap();
        (adaptive.model.vocab, adaptive.model.cutoffs) = (1000, vec![100, 400]);
        let mut llama = Config::preset("enwik8-tiny").unwrap();
        (llama.model.arch, llama.model.heads, llama.model.llama.kv_heads) = (Arch::Llama, 4, 2);
        (llama.train.lora_rank, llama.train.freeze_base) = (2, true);
        configs.extend([adaptive, llama]);
        let dir = tempfile::tempdir().unwrap();
        for (i, cfg) in configs.iter().enumerate() {
            cfg.validate().unwrap();
            let lm = Lm::new(cfg, Device::Cpu).unwrap();
            let path = dir.path().join(format!("{i}.safetensors"));
            let state = lethe_core::checkpoint::TrainState::new(1, &(), 0).unwrap();
            lethe_core::checkpoint::save(&path, cfg, &state, &lm.named_parameters()).unwrap();
            let ckpt = Checkpoint::load(&path).unwrap();
            let next = || {
                let _seed = lethe_core::rng::seed_torch(5);
                Tensor::randn([4], (tch::Kind::Float, Device::Cpu))
            };
            let draw_after = |f: &dyn Fn()| {
                let _seed = lethe_core::rng::seed_torch(5);
                f();
                Tensor::randn([4], (tch::Kind::Float, Device::Cpu))
            };
            let read = std::cell::RefCell::new(None);
            let drawn = draw_after(&|| *read.borrow_mut() = Some(Lm::from_checkpoint(&ckpt, Device::Cpu).unwrap()));
            assert!(drawn.equal(&next()), "config {i}: reading the checkpoint drew from torch's stream");
            let read = read.into_inner().unwrap();
            for ((name, got), (_, want)) in read.named_parameters().iter().zip(lm.named_parameters()) {
                assert!(got.equal(&want), "config {i}: `{name}` is not the checkpoint's");
            }
            let fresh = draw_after(&|| drop(Lm::new(cfg, Device::Cpu).unwrap()));
            assert!(!fresh.equal(&next()), "config {i}: a model built after the read drew nothing");
        }
    }

    /// Configs held at once must fit together, not only each alone: two that need 0.4
    /// of the memory each fit, three do not, and the message names `--rounds`.
    #[test]
    fn configs_held_at_once_must_fit_together() {
        let one = Config::preset("enwik8-tiny").unwrap();
        let available = footprint(&one) / 0.4;
        assert!(fit_together_within(&[&one, &one], available).is_ok());
        let err = fit_together_within(&[&one, &one, &one], available).unwrap_err().to_string();
        assert!(
            err.contains("--rounds holds all 3 configs in memory at once") && err.contains("one at a time"),
            "{err}"
        );
    }

    /// A step that does not fit names the part that is largest and every field that
    /// sizes it, whichever field that is (here the layers, not the span or the batch).
    #[test]
    fn a_step_too_large_names_the_fields_of_its_largest_part() {
        let mut c = Config::preset("enwik8-tiny").unwrap();
        (c.model.layers, c.model.d_model, c.model.d_ffn) = (1000, 4096, 16384);
        let need = footprint(&c);
        let err = fits_within(footprint_parts(&c), need / 2.0).unwrap_err().to_string();
        assert!(
            err.contains("the largest part")
                && err.contains("the layers' weights")
                && err.contains("model.layers = 1000")
                && err.contains("model.d_ffn = 16384"),
            "{err}"
        );
        assert!(fits_within(footprint_parts(&c), need * 1.01).is_ok());
    }

    /// Micro-batches (`train.accum`) shrink the attention and the activations, which a
    /// micro-batch holds at a time, not the memory every stream keeps: the SmolLM2 preset,
    /// refused on 24 GB at its batch of 4, fits in micro-batches of 1.
    #[test]
    fn micro_batches_shrink_the_attention_not_the_memory_held() {
        let whole = Config::preset("smollm2-135m-expire").unwrap();
        let mut micro = whole.clone();
        micro.train.accum = 4;
        micro.validate().unwrap();
        let part = |c: &Config, what: &str| {
            footprint_parts(c).into_iter().find(|p| p.what.starts_with(what)).map(|p| p.bytes).unwrap()
        };
        assert_eq!(part(&whole, "the memory held"), part(&micro, "the memory held"));
        for what in ["the memory's attention", "the activations"] {
            assert!((part(&whole, what) / part(&micro, what) - 4.0).abs() < 1e-9, "{what}");
        }
        let gib = f64::from(1u32 << 30);
        assert!(footprint(&whole) > 24.0 * gib && footprint(&micro) < 16.0 * gib);
        let err = fits_within(footprint_parts(&micro), gib).unwrap_err().to_string();
        assert!(err.contains("train.batch = 4 / train.accum = 4"), "{err}");
    }

    fn parameters(init: Init, pre_norm: bool) -> std::collections::HashMap<String, Tensor> {
        let mut config = Config::default();
        (config.model.d_model, config.model.d_ffn, config.model.layers) = (64, 256, 2);
        (config.model.init, config.model.pre_norm, config.memory.mechanism) = (init, pre_norm, Mechanism::Fixed);
        Lm::new(&config, Device::Cpu).unwrap().vs.variables()
    }

    /// Largest absolute value and standard deviation.
    fn spread(t: &Tensor) -> (f64, f64) {
        (t.abs().max().double_value(&[]), t.std(true).double_value(&[]))
    }

    /// `official` draws as PyTorch's `nn.Linear` (uniform in ±1/sqrt(fan_in): standard
    /// deviation 1/sqrt(3 fan_in)), the residual branches' last projections divided by
    /// sqrt(2 layers) under pre-norm, and `key_pe` from N(0, 1); `kaiming` as tch's
    /// default (±sqrt(6 / fan_in)) and N(0, 1/d_head).
    #[test]
    fn the_official_initialisation_has_the_official_code_s_scales() {
        let (d, f) = (64f64, 256f64);
        let official = parameters(Init::Official, true);
        let expect = |name: &str, bound: f64| {
            let (max, std) = spread(&official[name]);
            assert!(max <= bound && max > 0.9 * bound, "{name}: max {max} against {bound}");
            assert!(
                (std / (bound / 3f64.sqrt()) - 1.0).abs() < 0.1,
                "{name}: std {std} against {}",
                bound / 3f64.sqrt()
            );
        };
        expect("layers.0.attn.q.weight", 1.0 / d.sqrt());
        expect("layers.1.attn.o.weight", 1.0 / d.sqrt() / 2.0); // sqrt(2 * 2 layers)
        expect("layers.0.ff1.weight", 1.0 / d.sqrt());
        expect("layers.1.ff2.weight", 1.0 / f.sqrt() / 2.0);
        expect("head.weight", 1.0 / d.sqrt());
        let (_, pe) = spread(&official["key_pe"]);
        assert!((pe - 1.0).abs() < 0.1, "key_pe std {pe}");
        // Without pre-norm, no residual factor.
        let (max, _) = spread(&parameters(Init::Official, false)["layers.1.attn.o.weight"]);
        assert!(max > 0.9 / d.sqrt(), "post-norm output projection: max {max}");

        let kaiming = parameters(Init::Kaiming, true);
        let (max, _) = spread(&kaiming["layers.1.attn.o.weight"]);
        assert!(max > 0.9 * (6.0 / d).sqrt() && max <= (6.0 / d).sqrt(), "kaiming: max {max}");
        let (_, pe) = spread(&kaiming["key_pe"]);
        assert!((pe * 16f64.sqrt() - 1.0).abs() < 0.1, "kaiming key_pe std {pe}");
        // d_head 16
    }
}
