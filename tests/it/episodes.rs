//! Episodes that follow each other in a row of the batch (`AttendInput::episodes`, used
//! by the actor-critic trainer with `rl.reset = "episode"`): a position must see only
//! its own episode, exactly as if the row's memory had been reset where its episode
//! began, and nothing of an earlier episode may reach it, not even through the gradient.

use lethe::config::{Config, Mechanism, MemoryConfig, ModelConfig};
use lethe::model::{Backbone, Memory};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

const D: i64 = 16;
/// Positions per row, and the block the streams are cut into.
const T: i64 = 12;
const BLOCK: i64 = 4;
/// Row 0 switches from episode 5 to episode 6 at this position, inside the second block.
const SWITCH: i64 = 6;

fn configs(mechanism: Mechanism) -> (ModelConfig, MemoryConfig) {
    let base = Config::preset("corridor-small").unwrap();
    let mut model = base.model.clone();
    (model.layers, model.d_model, model.heads, model.d_ffn, model.dropout) = (2, D as usize, 2, 32, 0.0);
    let mut memory = base.memory.clone();
    memory.mechanism = mechanism;
    memory.span = 8;
    memory.expire.ramp = 2;
    memory.expire.init_fraction = 0.5;
    memory.adaptive.init_ratio = 0.6;
    (model, memory)
}

/// A backbone in double precision; Expire-Span's span predictor gets random weights, so
/// that every memory has its own span.
fn backbone(mechanism: Mechanism) -> (VarStore, Backbone) {
    let (model, memory) = configs(mechanism);
    let mut vs = VarStore::new(Device::Cpu);
    let body = {
        let _seed = lethe::rng::seed_torch(7);
        Backbone::new(&vs.root(), &model, &memory, BLOCK as usize).unwrap()
    };
    vs.double();
    crate::common::randomise(&vs, 7, 2.0, |name| name.ends_with("expire.w"));
    (vs, body)
}

/// Runs `x` `(b, t, d)` block by block from `mem`, with the episodes `(b, t)` if any.
fn run(body: &Backbone, mem: &mut Memory, x: &Tensor, episodes: Option<&Tensor>, from: i64) -> Tensor {
    let t = x.size()[1];
    let mut out = vec![];
    let mut at = 0;
    while at < t {
        // Blocks aligned to the stream's block grid, wherever the run starts.
        let len = (BLOCK - (from + at) % BLOCK).min(t - at);
        let e = episodes.map(|e| e.narrow(1, at, len));
        out.push(body.forward(x.narrow(1, at, len), mem, false, e.as_ref()).unwrap().h);
        at += len;
    }
    Tensor::cat(&out, 1)
}

/// Row 0: episode 5 until `SWITCH`, then episode 6. Row 1: episode 9 throughout.
fn episodes() -> Tensor {
    let row0: Vec<i64> = (0..T).map(|i| if i < SWITCH { 5 } else { 6 }).collect();
    Tensor::from_slice(&[row0, vec![9; T as usize]].concat()).view([2, T])
}

fn close(a: &Tensor, b: &Tensor) -> bool {
    a.allclose(b, 1e-10, 1e-10, false)
}

/// For every mechanism that keeps episodes apart: the new episode's outputs equal a
/// fresh memory's over the new episode alone; the other positions equal an unnumbered
/// run's; an unnumbered run does see the old episode (so the check has teeth); and no
/// gradient flows from the new episode to the old one, while it does flow within the new
/// one. The gradient is that of the outputs projected on a fixed random vector: the
/// outputs leave a final LayerNorm, whose plain sum over features does not depend on
/// its input, so the gradient of `tail.sum()` was rounding noise, sometimes exactly 0
/// (regression).
#[test]
fn a_new_episode_sees_only_itself_as_if_its_row_had_been_reset() {
    for mechanism in [Mechanism::Fixed, Mechanism::Adaptive, Mechanism::Expire] {
        let (_vs, body) = backbone(mechanism);
        let x = crate::common::randn(1, &[2, T, D], Kind::Double).set_requires_grad(true);
        let e = episodes();
        let numbered = run(&body, &mut body.new_memory(), &x, Some(&e), 0);
        let plain = run(&body, &mut body.new_memory(), &x, None, 0);
        let new = x.narrow(0, 0, 1).narrow(1, SWITCH, T - SWITCH);
        let alone = run(&body, &mut body.new_memory(), &new, None, SWITCH);

        let tail = numbered.narrow(0, 0, 1).narrow(1, SWITCH, T - SWITCH);
        assert!(close(&tail, &alone), "{mechanism:?}: the new episode must equal a fresh memory's run");
        assert!(
            !close(&plain.narrow(0, 0, 1).narrow(1, SWITCH, T - SWITCH), &alone),
            "{mechanism:?}: without episodes the old one is seen"
        );
        assert!(
            close(&numbered.narrow(0, 1, 1), &plain.narrow(0, 1, 1)),
            "{mechanism:?}: one episode throughout is unchanged"
        );
        assert!(
            close(&numbered.narrow(1, 0, SWITCH), &plain.narrow(1, 0, SWITCH)),
            "{mechanism:?}: the old episode is unchanged"
        );

        let projection = crate::common::randn(2, &tail.size(), Kind::Double);
        let grad = Tensor::run_backward(&[(&tail * projection).sum(Kind::Double)], &[&x], false, false).remove(0);
        let old = grad.narrow(0, 0, 1).narrow(1, 0, SWITCH);
        assert_eq!(old.abs().max().double_value(&[]), 0.0, "{mechanism:?}: gradient reached the old episode");
        // Every position of the new episode reaches the last one: gradients of order 1,
        // far above rounding.
        let new_grad = grad.narrow(0, 0, 1).narrow(1, SWITCH, T - SWITCH).abs().amax([2].as_slice(), false);
        assert!(new_grad.min().double_value(&[]) > 1e-3, "{mechanism:?}: gradient within the new episode {new_grad}");
    }
}

/// The actor-critic trainer replays a window from a saved memory: a memory restored
/// from its saved state (episodes included) must continue exactly as the original.
#[test]
fn a_restored_memory_keeps_its_episodes() {
    for mechanism in [Mechanism::Fixed, Mechanism::Adaptive, Mechanism::Expire] {
        let (_vs, body) = backbone(mechanism);
        let x = crate::common::randn(3, &[2, T, D], Kind::Double);
        let e = episodes();
        let mut mem = body.new_memory();
        // Stop at the switch: the saved memory holds episode 5, the next block starts 6.
        let _ = run(&body, &mut mem, &x.narrow(1, 0, SWITCH), Some(&e.narrow(1, 0, SWITCH)), 0);
        let state: Vec<_> = mem.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
        assert!(state.iter().any(|(n, _)| n.ends_with("episode")), "{mechanism:?}: episodes are saved");
        let rest = |mem: &mut Memory| {
            run(&body, mem, &x.narrow(1, SWITCH, T - SWITCH), Some(&e.narrow(1, SWITCH, T - SWITCH)), SWITCH)
        };
        let straight = rest(&mut mem);
        let mut restored = body.new_memory();
        restored.load_state(&state).unwrap();
        assert!(close(&rest(&mut restored), &straight), "{mechanism:?}");
    }
}

/// The Compressive Transformer and the ∞-former mix states into shared slots, so they
/// cannot keep episodes apart: the backbone says so instead of leaking one into the
/// next, and the config check names the field to change.
#[test]
fn mechanisms_that_cannot_keep_episodes_apart_refuse_them() {
    for mechanism in [Mechanism::Compressive, Mechanism::Infinity] {
        let (_vs, body) = backbone(mechanism);
        let x = crate::common::randn(4, &[2, BLOCK, D], Kind::Double);
        let e = episodes().narrow(1, 0, BLOCK);
        let err = body.forward(x, &mut body.new_memory(), false, Some(&e)).err().expect("episodes must be refused");
        assert!(err.to_string().contains("rl.reset"), "{err}");

        let mut cfg = Config::preset("corridor-small").unwrap();
        cfg.memory.mechanism = mechanism;
        let err = cfg.validate().expect_err("rl.reset = episode must be refused").to_string();
        assert!(err.contains("rl.reset") && err.contains("batch"), "{err}");
        cfg.rl.reset = lethe::rl::Reset::Batch;
        cfg.validate().unwrap();
    }
}

/// `memory.expire.as_official` starts every stream's cache with zero states that belong
/// to no episode, so it refuses episodes: at the layer, and by name in the config check.
#[test]
fn the_official_reading_of_expire_span_refuses_episodes() {
    let (mut model, mut memory) = configs(Mechanism::Expire);
    memory.expire.as_official = true;
    model.pre_norm = true;
    let body = Backbone::new(&VarStore::new(Device::Cpu).root(), &model, &memory, BLOCK as usize).unwrap();
    let x = crate::common::randn(4, &[2, BLOCK, D], Kind::Float);
    let e = episodes().narrow(1, 0, BLOCK);
    let err = body
        .forward(x.shallow_clone(), &mut body.new_memory(), false, Some(&e))
        .err()
        .expect("episodes must be refused");
    assert!(err.to_string().contains("as_official"), "{err}");
    body.forward(x, &mut body.new_memory(), false, None).unwrap();

    let mut cfg = Config::preset("corridor-expire-small").unwrap();
    cfg.rl.reset = lethe::rl::Reset::Episode;
    cfg.validate().unwrap();
    cfg.memory.expire.as_official = true;
    let err = cfg.validate().expect_err("as_official with rl.reset = episode must be refused").to_string();
    assert!(err.contains("memory.expire.as_official") && err.contains("rl.reset"), "{err}");
}
