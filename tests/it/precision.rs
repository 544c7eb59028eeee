//! Training in bfloat16 (`train.precision = "bf16"`, libtorch's autocast on the CPU):
//! every mechanism's 50 steps track float32's losses, and what the run keeps (its
//! checkpoint) stays float32.

use lethe::checkpoint::Checkpoint;
use lethe::config::{Config, Mechanism, Precision};

use crate::common::quiet;

/// The relative gap allowed between the bfloat16 and float32 runs' validation losses
/// after 50 steps; measured at most 0.3% (the ∞-former), the rest below 0.1%.
const TOLERANCE: f64 = 0.02;

/// The gap allowed between the means of their last 10 steps' training losses, where each
/// step's batch weighs more; measured at most 2.7% (the ∞-former).
const TRAIN_TOLERANCE: f64 = 0.06;

/// `copy-sweep-tiny` (2 layers x 32, blocks of 8) for 50 steps with `mechanism`.
fn config(mechanism: Mechanism, precision: Precision) -> Config {
    let mut c = Config::preset("copy-sweep-tiny").unwrap();
    c.name = format!("{}-{precision:?}", mechanism.name()).to_lowercase();
    c.memory.mechanism = mechanism;
    c.train.steps = 50;
    c.train.log_every = 10;
    c.train.eval_every = 0;
    c.train.precision = precision;
    c
}

#[test]
fn bfloat16_training_tracks_float32_for_every_mechanism() {
    let dir = tempfile::tempdir().unwrap();
    for &mechanism in Mechanism::all() {
        let run = |precision| lethe::train::train(&config(mechanism, precision), &quiet(dir.path())).unwrap();
        let (full, half) = (run(Precision::F32), run(Precision::Bf16));
        let (a, b) = (full.last_eval.unwrap().loss, half.last_eval.unwrap().loss);
        let gap = (a - b).abs() / a;
        assert!(gap < TOLERANCE, "{mechanism}: bfloat16 validation loss {b:.4} vs float32's {a:.4} ({gap:.4})");
        // The step losses differ (the arithmetic did change) and track each other.
        assert_ne!(full.losses, half.losses, "{mechanism}: bfloat16 changed nothing");
        let last = |l: &[f64]| l[l.len() - 10..].iter().sum::<f64>() / 10.0;
        let (a, b) = (last(&full.losses), last(&half.losses));
        eprintln!("{mechanism}: valid gap {gap:.5}, train gap {:.5}", (a - b).abs() / a);
        assert!((a - b).abs() / a < TRAIN_TOLERANCE, "{mechanism}: last 10 training losses {b:.4} vs {a:.4}");
        let ckpt = Checkpoint::load(&half.run_dir).unwrap();
        for (name, t) in ckpt.parameters() {
            assert_eq!(t.kind(), tch::Kind::Float, "{mechanism}: the checkpoint's {name} is not float32");
        }
    }
}
