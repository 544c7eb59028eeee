//! Training in reduced precision (`train.precision`, libtorch's autocast on the CPU):
//! every mechanism's 50 steps track float32's losses, and what the run keeps (its
//! checkpoint) stays float32. Bfloat16 keeps float32's range, so it tracks closely;
//! float16 skips the first steps whose scaled gradients overflow while its loss scale
//! settles, and the ∞-former, the most sensitive to its arithmetic here, moves further.

use lethe::checkpoint::Checkpoint;
use lethe::config::{Config, Mechanism, Precision};

use crate::common::quiet;

/// `copy-sweep-tiny` (2 layers x 32, blocks of 8) for 50 steps with `mechanism`.
fn config(mechanism: Mechanism, precision: Precision) -> Config {
    let mut c = Config::preset("copy-sweep-tiny").unwrap();
    c.name = format!("{}-{}", mechanism.name(), precision.name());
    c.memory.mechanism = mechanism;
    c.train.steps = 50;
    c.train.log_every = 10;
    c.train.eval_every = 0;
    c.train.precision = precision;
    c
}

/// Trains every mechanism in float32 and in `precision` and checks the relative gaps of
/// their validation losses (at most `valid(mechanism)`) and of the means of their last 10
/// training losses, where each step's batch weighs more (at most `train(mechanism)`).
fn tracks_float32(precision: Precision, valid: impl Fn(Mechanism) -> f64, train: impl Fn(Mechanism) -> f64) {
    let dir = tempfile::tempdir().unwrap();
    for &mechanism in Mechanism::all() {
        if config(mechanism, precision).validate().is_err() {
            continue; // a combination lethe refuses (tested below)
        }
        let run = |precision| lethe::train::train(&config(mechanism, precision), &quiet(dir.path())).unwrap();
        let (full, low) = (run(Precision::F32), run(precision));
        let (a, b) = (full.last_eval.unwrap().loss, low.last_eval.unwrap().loss);
        let gap = (a - b).abs() / a;
        let last = |l: &[f64]| l[l.len() - 10..].iter().sum::<f64>() / 10.0;
        let (ta, tb) = (last(&full.losses), last(&low.losses));
        let train_gap = (ta - tb).abs() / ta;
        eprintln!("{mechanism} {}: valid gap {gap:.5}, train gap {train_gap:.5}", precision.name());
        assert!(gap < valid(mechanism), "{mechanism}: {precision:?} validation loss {b:.4} vs float32's {a:.4}");
        // The step losses differ (the arithmetic did change) and track each other.
        assert_ne!(full.losses, low.losses, "{mechanism}: {precision:?} changed nothing");
        assert!(train_gap < train(mechanism), "{mechanism}: last 10 training losses {tb:.4} vs {ta:.4}");
        let ckpt = Checkpoint::load(&low.run_dir).unwrap();
        for (name, t) in ckpt.parameters() {
            assert_eq!(t.kind(), tch::Kind::Float, "{mechanism}: the checkpoint's {name} is not float32");
        }
    }
}

/// Bfloat16: validation losses within 2% (measured at most 0.42%, the Compressive
/// Transformer), the ∞-former's within 6% (its regression over the absorbed states
/// carries the inputs' rounding into every later block: measured 3.4%, and 0.3% on
/// another draw of the data); the last 10 training losses within 6%, the ∞-former's
/// within 15%. libtorch's bfloat16 kernels round otherwise from one CPU to another: on an
/// Intel Xeon with AVX-512 BF16 and AMX the ∞-former's training losses were 3.4% apart
/// (the rest below 0.3%), on an AMD EPYC with AVX2 5.4% with the products widened
/// (`csrc/widened.cpp`; 10.4% through libtorch's emulated products), its validation loss
/// 3.4%, the rest below 0.42%.
#[test]
fn bfloat16_training_tracks_float32_for_every_mechanism() {
    let (valid, train) = (
        |m| if m == Mechanism::Infinity { 0.06 } else { 0.02 },
        |m| if m == Mechanism::Infinity { 0.15 } else { 0.06 },
    );
    tracks_float32(Precision::Bf16, valid, train);
}

/// Float16 with its loss scale, every mechanism but the ∞-former (refused): validation
/// losses within 6% (measured at most 3.8%, the Compressive Transformer, and 1.4% on
/// another draw of the data; 1.8% Transformer-XL, 1.0% Adaptive-Span, 0.3% Expire-Span),
/// the last 10 training losses within 12% (measured at most 7.7%, the Compressive
/// Transformer; the rest below 1%). The ∞-former's
/// drift (19% and 46%) is why a float16 ∞-former is refused.
#[test]
fn float16_training_tracks_float32_for_every_mechanism_it_takes() {
    tracks_float32(Precision::F16, |_| 0.06, |_| 0.12);
}

#[test]
fn float16_is_refused_for_the_infinity_former_and_reduced_precision_for_agents() {
    let mut c = config(Mechanism::Infinity, Precision::F16);
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("train.precision") && e.contains("use bf16"), "{e}");
    c.train.precision = Precision::Bf16;
    c.validate().unwrap();
    let mut agent = Config::preset("corridor-small").unwrap();
    agent.train.precision = Precision::Bf16;
    let e = agent.validate().unwrap_err().to_string();
    assert!(e.contains("train.precision") && e.contains("gridworld"), "{e}");
}
