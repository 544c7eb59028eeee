//! Reinforcement learning on the gridworlds: the agent's two passes agree, a tiny
//! corridor is learned only with enough memory, a tiny portal is learned by remembering
//! doors, runs resume exactly, and every memory mechanism can drive an agent.

use lethe::config::CorridorConfig;
use lethe::config::{Config, Mechanism};
use lethe::rl::agent::Agent;
use lethe::rl::env::{observation_size, Episodes};
use lethe::rl::train::{train, RlSummary};
use lethe::train::TrainOptions;
use tch::{Device, Kind, Tensor};

fn options(dir: &std::path::Path) -> TrainOptions {
    TrainOptions { overwrite: true, ..crate::common::quiet(dir) }
}

/// The `corridor-small` agent (2 layers x 64) on corridors of 5 to 8 cells, where the
/// colour is 4 to 7 steps back when the agent picks a door; windows of 16 steps.
fn tiny_corridor(name: &str, span: usize) -> Config {
    let mut c = Config::preset("corridor-small").unwrap();
    c.name = name.into();
    c.data.corridor = CorridorConfig { length_min: 5, length_max: 8, max_steps: 40 };
    c.memory.span = span;
    c.train.block = 16;
    c.train.steps = 250;
    c.train.eval_every = 0;
    c.train.checkpoint_every = 0;
    c.train.log_every = 50;
    c.rl.eval_episodes = 256;
    c
}

fn run(cfg: &Config) -> RlSummary {
    let dir = tempfile::tempdir().unwrap();
    train(cfg, &options(dir.path())).unwrap()
}

/// Acting feeds one observation per step; learning replays the window as one block
/// from the same starting memory. The two must give the same policy and values, with
/// and without episodes that end inside the window.
fn check_step_by_step_equals_block(mechanism: Mechanism, episodes: Option<&Tensor>) {
    let mut cfg = tiny_corridor("passes", 16);
    cfg.memory.mechanism = mechanism;
    cfg.memory.expire.init_fraction = 0.3; // spans of about 5: memories expire within the window
    cfg.memory.expire.ramp = 4;
    let agent = Agent::new(&cfg, Device::Cpu).unwrap();
    let f = observation_size(&cfg) as i64;
    let _guard = tch::no_grad_guard();
    // The heads start at zero; give them weights so that the logits say something.
    crate::common::randomise(&agent.vs, 3, 0.3, |name| name.starts_with("policy") || name.starts_with("value"));
    // Random binary observations: 3 streams, a first block of 6 steps, then 12 more.
    let obs = crate::common::randn(4, &[3, 18, f], Kind::Float).ge(0.52).to_kind(Kind::Float);
    let at = |from: i64, len: i64| episodes.map(|e| e.narrow(1, from, len));
    let mut mem = agent.new_memory();
    agent.forward(&obs.narrow(1, 0, 6), &mut mem, false, at(0, 6).as_ref()).unwrap();
    let start: Vec<(String, Tensor)> = mem.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
    let stepped: Vec<Tensor> = (6..18)
        .map(|t| agent.forward(&obs.narrow(1, t, 1), &mut mem, false, at(t, 1).as_ref()).unwrap().logits)
        .collect();
    let stepped = Tensor::cat(&stepped, 1);
    let mut replay = agent.new_memory();
    replay.load_state(&start).unwrap();
    let block = agent.forward(&obs.narrow(1, 6, 12), &mut replay, false, at(6, 12).as_ref()).unwrap().logits;
    let diff = (&stepped - &block).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "{mechanism:?}: step-by-step and block logits differ by {diff}");
    assert!(stepped.std(false).double_value(&[]) > 1e-2, "the logits vary");
    // And the memory matters: the block without its starting memory differs.
    let alone =
        agent.forward(&obs.narrow(1, 6, 12), &mut agent.new_memory(), false, at(6, 12).as_ref()).unwrap().logits;
    assert!((&alone - &block).abs().max().double_value(&[]) > 1e-3, "{mechanism:?}: the memory was ignored");
}

#[test]
fn acting_step_by_step_matches_the_window_replayed_as_a_block() {
    // Row 0 starts a new episode at step 10 (inside the window), row 1 at steps 4
    // (before it) and 14, row 2 plays one episode throughout.
    let numbers =
        |switches: &[i64]| (0..18).map(|t| switches.iter().filter(|&&s| t >= s).count() as i64).collect::<Vec<_>>();
    let rows = [numbers(&[10]), numbers(&[4, 14]).iter().map(|n| n + 10).collect(), vec![20; 18]];
    let episodes = Tensor::from_slice(&rows.concat()).view([3, 18]);
    for mechanism in [Mechanism::Fixed, Mechanism::Expire, Mechanism::Adaptive] {
        check_step_by_step_equals_block(mechanism, None);
        check_step_by_step_equals_block(mechanism, Some(&episodes));
    }
}

#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn a_tiny_corridor_is_learned_with_memory_and_guessed_without() {
    // Transformer-XL with a span of 16: the object is always in reach.
    let with = run(&tiny_corridor("with-memory", 16)).last_eval.unwrap();
    // A span of 1 in each of 2 layers reaches 2 steps back: the colour is out of reach
    // at the doors, so the agent can only learn to walk there and guess.
    let without = run(&tiny_corridor("without-memory", 1)).last_eval.unwrap();
    eprintln!("the tiny corridor with memory: {}\nwithout: {}", with.line(), without.line());
    assert!(with.success_rate > 0.8, "with memory: {}", with.line());
    assert!((0.35..0.65).contains(&without.success_rate), "without memory: {}", without.line());
    assert!(without.mean_length < 20.0, "the short-memory agent still learns to walk to the doors: {}", without.line());
    assert!(with.mem_size[0] > 2.0 * without.mem_size[0]);
}

/// `portal-small` with 3 rooms of 2x2: an agent that remembers which door it took in a
/// room picks right when it comes back (recall 100%); one that cannot, guesses (50%),
/// and reaches 2.25 rooms on average.
#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn a_tiny_portal_is_learned_by_remembering_the_doors() {
    let mut c = Config::preset("portal-small").unwrap();
    c.name = "tiny-portal".into();
    c.data.portal.rooms = 3;
    c.train.steps = 150;
    (c.train.eval_every, c.train.checkpoint_every, c.train.log_every) = (0, 0, 50);
    let r = run(&c).last_eval.unwrap();
    eprintln!("the tiny portal after {} steps: {}", c.train.steps, r.line());
    assert!(r.recall.unwrap() > 0.8, "recall well above the 50% of guessing: {}", r.line());
    assert!(r.mean_rooms.unwrap() > 2.6, "more rooms than the 2.25 of guessing: {}", r.line());
}

#[test]
fn resuming_an_rl_run_repeats_the_losses_of_a_straight_run() {
    // Windows of 8 over episodes of up to 12 steps: checkpoints fall inside episodes.
    let mut cfg = tiny_corridor("resume", 8);
    cfg.memory.mechanism = Mechanism::Expire;
    cfg.train.block = 8;
    cfg.train.batch = 4;
    cfg.train.steps = 8;
    cfg.data.corridor.max_steps = 12;
    cfg.rl.eval_episodes = 4;
    let straight_dir = tempfile::tempdir().unwrap();
    let straight = train(&cfg, &options(straight_dir.path())).unwrap().losses;

    let dir = tempfile::tempdir().unwrap();
    let first = train(&cfg, &TrainOptions { stop_after: Some(3), ..options(dir.path()) }).unwrap().losses;
    let second = train(&cfg, &TrainOptions { resume: true, overwrite: false, ..options(dir.path()) }).unwrap().losses;
    assert_eq!((first.len(), second.len()), (3, 5));
    let resumed: Vec<f64> = first.into_iter().chain(second).collect();
    assert_eq!(straight, resumed);
    cfg.seed = 2;
    let other_dir = tempfile::tempdir().unwrap();
    assert_ne!(straight, train(&cfg, &options(other_dir.path())).unwrap().losses);
}

#[test]
fn every_memory_mechanism_drives_an_agent() {
    for mechanism in
        [Mechanism::Fixed, Mechanism::Expire, Mechanism::Adaptive, Mechanism::Compressive, Mechanism::Infinity]
    {
        let mut cfg = tiny_corridor("mechanisms", 16);
        cfg.memory.mechanism = mechanism;
        cfg.memory.compressive.slots = 8;
        cfg.memory.infinity.basis = 8;
        cfg.memory.infinity.samples = 16;
        if matches!(mechanism, Mechanism::Compressive | Mechanism::Infinity) {
            // They cannot keep a row's episodes apart: synchronous batches.
            cfg.rl.reset = lethe::rl::Reset::Batch;
        }
        cfg.train.batch = 4;
        cfg.train.steps = 3;
        cfg.rl.eval_episodes = 4;
        let summary = run(&cfg);
        assert_eq!(summary.losses.len(), 3);
        assert!(summary.losses.iter().all(|l| l.is_finite()), "{mechanism:?}: {:?}", summary.losses);
        let eval = summary.last_eval.unwrap();
        assert_eq!(eval.episodes, 4, "{mechanism:?}");
        assert!(eval.mem_size.iter().all(|&m| m > 0.0), "{mechanism:?}: {}", eval.line());
    }
}

/// `memory.expire.alpha_warmup = 2` weighs the span loss by 1/2 at the first update and
/// fully at the second: its first loss is that of a run at alpha / 2 without warm-up,
/// and the second is not.
#[test]
fn the_alpha_warm_up_weighs_the_span_loss_of_each_update() {
    let losses = |alpha: f64, warmup: usize| {
        let mut cfg = tiny_corridor("warmup", 16);
        cfg.memory.mechanism = Mechanism::Expire;
        cfg.memory.expire.alpha = alpha;
        cfg.memory.expire.alpha_warmup = warmup;
        (cfg.train.batch, cfg.train.steps, cfg.rl.eval_episodes) = (4, 2, 4);
        run(&cfg).losses
    };
    let (warm, half, full) = (losses(0.5, 2), losses(0.25, 0), losses(0.5, 0));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(1.0);
    assert!(close(warm[0], half[0]), "{warm:?} {half:?}");
    assert!(!close(warm[0], full[0]), "the span loss must count: {warm:?} {full:?}");
    assert!(!close(warm[1], half[1]), "the second update has the full alpha: {warm:?} {half:?}");
}

/// Evaluation averages the memory size over every step of every episode played: with
/// a span longer than any episode, step `t` of an episode sees its `t` earlier steps,
/// so the mean is `sum T (T - 1) / 2 / sum T` over the episodes' lengths `T`, in both
/// reset modes (rows whose episode has ended do not count), for each mechanism that
/// counts its streams apart (Adaptive-Span and Expire-Span with spans that start
/// beyond the 40 steps an episode may last).
#[test]
fn evaluation_averages_the_memory_over_the_steps_of_the_episodes() {
    let resets = [lethe::rl::Reset::Episode, lethe::rl::Reset::Batch];
    for (mechanism, reset) in
        [Mechanism::Fixed, Mechanism::Adaptive, Mechanism::Expire].into_iter().flat_map(|m| resets.map(|r| (m, r)))
    {
        let mut cfg = tiny_corridor("eval-memory", 64);
        cfg.memory.mechanism = mechanism;
        cfg.memory.adaptive.init_ratio = 1.0;
        cfg.memory.expire.init_fraction = 0.9;
        cfg.rl.reset = reset;
        cfg.train.batch = 4;
        let agent = Agent::new(&cfg, Device::Cpu).unwrap();
        let mut lengths = vec![];
        let r = lethe::rl::train::play(&agent, 12, 5, &mut |eps, _, outcomes, _| {
            lengths.extend(outcomes.iter().zip(&eps.slots).filter(|(o, _)| o.done).map(|(_, s)| s.length as f64));
            Ok(())
        })
        .unwrap();
        assert_eq!(lengths.len(), 12, "{mechanism:?} {reset:?}");
        assert!(lengths.iter().any(|&t| t != lengths[0]), "episodes of different lengths: {lengths:?}");
        let expected = lengths.iter().map(|t| t * (t - 1.0) / 2.0).sum::<f64>() / lengths.iter().sum::<f64>();
        for m in &r.mem_size {
            assert!(
                (m - expected).abs() < 1e-9,
                "{mechanism:?} {reset:?}: memory {m}, expected {expected} from {lengths:?}"
            );
        }
    }
}

#[test]
fn a_batch_of_episodes_replays_from_its_seed() {
    let cfg = Config::preset("portal-small").unwrap();
    let mut a = Episodes::new(&cfg, 8, 3).unwrap();
    let mut b = Episodes::new(&cfg, 8, 3).unwrap();
    let mut rng = lethe::rng::Rng::new(9);
    for _ in 0..200 {
        let actions: Vec<_> = (0..8).map(|_| lethe::rl::env::Action::from_index(rng.range(0, 3))).collect();
        assert_eq!(a.step(&actions), b.step(&actions));
    }
    assert_eq!(a, b);
}

/// With `rl.reset = "episode"` every row starts its next episode at once, so every step
/// of every window is played; with `batch`, rows whose episode has ended wait.
#[test]
fn resetting_by_episode_leaves_no_step_idle() {
    let env_steps = |reset: lethe::rl::Reset| {
        let mut cfg = tiny_corridor("idle", 16);
        (cfg.train.batch, cfg.train.steps, cfg.train.log_every, cfg.rl.eval_episodes) = (8, 6, 6, 8);
        cfg.rl.reset = reset;
        let dir = tempfile::tempdir().unwrap();
        let summary = train(&cfg, &options(dir.path())).unwrap();
        let metrics = std::fs::read_to_string(summary.run_dir.join("metrics.jsonl")).unwrap();
        let last = metrics.lines().rfind(|l| l.contains("\"split\":\"train\"")).unwrap().to_string();
        serde_json::from_str::<serde_json::Value>(&last).unwrap()["env_steps"].as_u64().unwrap()
    };
    assert_eq!(env_steps(lethe::rl::Reset::Episode), 6 * 16 * 8);
    let together = env_steps(lethe::rl::Reset::Batch);
    assert!(together < 6 * 16 * 8, "synchronous batches idle: {together} steps played");
}

/// `lethe play --spans`: every step of the played episodes is recorded once, with the
/// door it took, and a step's span depends only on what its episode has seen (the
/// memory is reset per episode): the first steps of corridor episodes see the object
/// in one of two colours, so their spans take at most two values per layer.
#[test]
fn an_expire_span_agent_trace_records_every_step_and_its_door() {
    let mut cfg = tiny_corridor("trace", 16);
    cfg.memory.mechanism = Mechanism::Expire;
    cfg.train.batch = 1;
    let agent = Agent::new(&cfg, Device::Cpu).unwrap();
    // The span predictors start at zero (every span L/2); give them weights, so that a
    // step's span says what the step saw.
    crate::common::randomise(&agent.vs, 5, 0.5, |name| name.contains("expire"));
    let (trace, eval) = lethe::inspect::agent::trace_agent(&agent, 8, 3).unwrap();
    assert_eq!(trace.steps.len() as f64, eval.mean_length * 8.0, "every step of the 8 episodes");
    assert_eq!(trace.steps.last().unwrap().episode, 7);
    let right = trace.steps.iter().filter(|s| s.door == Some(true)).count();
    assert_eq!(right as f64, eval.success_rate * 8.0, "one right door per success");
    for e in 0..8 {
        let steps: Vec<_> = trace.steps.iter().filter(|s| s.episode == e).collect();
        let doors = steps.iter().filter(|s| s.door.is_some()).count();
        assert!(doors <= 1 && steps.last().unwrap().door.is_some() == (doors == 1), "a door ends a corridor episode");
        assert!(steps.iter().enumerate().all(|(i, s)| s.step == i && s.room.is_none()));
    }
    for layer in 0..2 {
        let mut firsts: Vec<f32> = trace.steps.iter().filter(|s| s.step == 0).map(|s| s.spans[layer]).collect();
        assert!(trace.steps.iter().all(|s| (0.0..=16.0).contains(&s.spans[layer])), "spans within [0, L]");
        let distinct = |v: &mut Vec<f32>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v.dedup_by(|a, b| (*a - *b).abs() < 1e-4);
            v.len()
        };
        assert!(distinct(&mut firsts) <= 2, "layer {layer}: first-step spans {firsts:?}");
        let mut all: Vec<f32> = trace.steps.iter().map(|s| s.spans[layer]).collect();
        assert!(distinct(&mut all) > 4, "layer {layer}: the other steps' spans vary with what they saw");
    }
    // A fixed-span agent has no spans to show.
    cfg.memory.mechanism = Mechanism::Fixed;
    let fixed = Agent::new(&cfg, Device::Cpu).unwrap();
    let err = lethe::inspect::agent::trace_agent(&fixed, 1, 3).unwrap_err().to_string();
    assert!(err.contains("Expire-Span"), "{err}");
}
