//! Training end to end: a tiny model learns the copy task, the run folder records its
//! machine, a resumed run repeats the same losses, and a NaN stops training without
//! touching the last checkpoint.

use lethe::checkpoint::Checkpoint;
use lethe::config::CopyConfig;
use lethe::train::{train, TrainOptions};
use lethe::LetheError;

use crate::common::quiet as options;

#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn a_tiny_model_learns_the_copy_task_below_the_unigram_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::common::tiny_config();
    cfg.model.d_model = 32;
    cfg.model.d_ffn = 64;
    cfg.memory.span = 32;
    cfg.train.batch = 16;
    cfg.train.block = 16;
    cfg.train.steps = 400;
    cfg.train.warmup = 20;
    cfg.train.lr = 3e-3;
    cfg.train.eval_tokens = 0;
    cfg.data.copy = CopyConfig { count_min: 1, count_max: 4, distance_min: 6, distance_max: 12, eval_tokens: 4096 };
    let summary = train(&cfg, &options(dir.path())).unwrap();
    let first: f64 = summary.losses[..10].iter().sum::<f64>() / 10.0;
    let r = summary.last_eval.unwrap();
    let baseline = summary.unigram_baseline;
    assert!(r.loss < 0.7 * baseline, "valid loss {} not clearly below the unigram baseline {baseline}", r.loss);
    assert!(r.loss < 0.5 * first, "loss fell from {first} to only {}", r.loss);
    // Answers are counts 1..4: guessing gets about a quarter of them right.
    let answers = r.answer_accuracy.unwrap();
    assert!(answers > 0.6, "answer accuracy {answers}");
    // The run folder holds the resolved config, the metrics and the checkpoint.
    for f in ["config.toml", "metrics.jsonl", "checkpoint.safetensors"] {
        assert!(summary.run_dir.join(f).exists(), "{f} missing");
    }
}

/// The run folder says on what machine it trained: the CPU, the thread count, and the
/// fingerprint of how this process's libtorch rounds.
#[test]
fn the_run_folder_records_its_machine() {
    let mut cfg = crate::common::tiny_config();
    cfg.train.steps = 2;
    cfg.train.threads = 1;
    let dir = tempfile::tempdir().unwrap();
    let summary = train(&cfg, &options(dir.path())).unwrap();
    let text = std::fs::read_to_string(summary.run_dir.join("machine.json")).expect("machine.json is written");
    let machine: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(machine["threads"], 1, "{text}");
    assert!(!machine["cpu"].as_str().unwrap().is_empty(), "{text}");
    let numerics = machine["numerics"].as_str().unwrap();
    assert_eq!(numerics.len(), 16, "{text}");
    assert_eq!(
        numerics,
        lethe::device::numerics_fingerprint(),
        "the fingerprint is the same every time on one machine"
    );
}

/// `train.tf32` is for GPUs: a CPU run with it on gives the losses of one without, to
/// the bit (a setting that reached the CPU's matrix products, as libtorch's matmul
/// precision "medium" can through oneDNN, would change them).
#[test]
fn tf32_leaves_a_cpu_run_unchanged() {
    let mut cfg = crate::common::tiny_config();
    cfg.train.steps = 4;
    let dir = tempfile::tempdir().unwrap();
    let off = train(&cfg, &options(dir.path())).unwrap().losses;
    (cfg.name, cfg.train.tf32) = ("tiny-tf32".into(), true);
    let on = train(&cfg, &options(dir.path())).unwrap();
    assert_eq!(off.len(), 4);
    assert_eq!(off, on.losses);
    let saved = std::fs::read_to_string(on.run_dir.join("config.toml")).unwrap();
    assert!(saved.contains("tf32 = true"), "the run folder's config records it");
}

#[test]
fn resuming_repeats_the_losses_of_a_straight_run() {
    let mut cfg = crate::common::tiny_config();
    cfg.model.dropout = 0.1; // dropout must be reproduced too
    cfg.train.steps = 8;
    cfg.train.accum = 2; // and each micro-batch's memory
    let straight_dir = tempfile::tempdir().unwrap();
    let straight = train(&cfg, &options(straight_dir.path())).unwrap().losses;

    let dir = tempfile::tempdir().unwrap();
    let first = train(&cfg, &TrainOptions { stop_after: Some(4), ..options(dir.path()) }).unwrap().losses;
    let second = train(&cfg, &TrainOptions { resume: true, ..options(dir.path()) }).unwrap().losses;
    assert_eq!(first.len(), 4);
    assert_eq!(second.len(), 4);
    let resumed: Vec<f64> = first.into_iter().chain(second).collect();
    assert_eq!(straight, resumed);
    // And the data itself matters: another seed gives other losses.
    cfg.seed = 2;
    let other_dir = tempfile::tempdir().unwrap();
    let other = train(&cfg, &options(other_dir.path())).unwrap().losses;
    assert_ne!(straight, other);
}

/// Trains `cfg` straight, and again stopped after 17 steps and resumed: the losses must
/// be the same.
fn assert_resuming_after_17_steps_repeats_the_straight_run(cfg: &lethe::config::Config) {
    let straight = train(cfg, &options(tempfile::tempdir().unwrap().path())).unwrap().losses;
    let dir = tempfile::tempdir().unwrap();
    let mut losses = train(cfg, &TrainOptions { stop_after: Some(17), ..options(dir.path()) }).unwrap().losses;
    losses.extend(train(cfg, &TrainOptions { resume: true, ..options(dir.path()) }).unwrap().losses);
    assert_eq!(straight, losses);
}

/// Expire-Span with per-stream deletion: the checkpoint holds each layer's compacted
/// cache (a view of the buffer with room for the next block), and the resumed run,
/// which joins cache and block anew, repeats the straight one.
#[test]
fn resuming_expire_span_repeats_the_losses_of_a_straight_run() {
    assert_resuming_after_17_steps_repeats_the_straight_run(&expire_to_resume());
}

/// A tiny Expire-Span run of 30 steps whose spans (L = 32, R = 4, starting at 0.3 L)
/// feel a span loss of 0.01.
fn expire_to_resume() -> lethe::config::Config {
    let mut cfg = crate::common::tiny_config();
    cfg.memory.mechanism = lethe::config::Mechanism::Expire;
    cfg.memory.span = 32;
    cfg.memory.expire.ramp = 4;
    cfg.memory.expire.init_fraction = 0.3;
    cfg.memory.expire.alpha = 0.01;
    cfg.train.steps = 30;
    cfg
}

#[test]
fn resuming_on_a_byte_corpus_repeats_the_losses_too() {
    let data_dir = tempfile::tempdir().unwrap();
    let corpus = data_dir.path().join("text.txt");
    let text: Vec<u8> = (0..3000u32)
        .map(|i| b"the quick brown fox jumps over the lazy dog. "[(i % 45) as usize] ^ ((i / 45 % 2) as u8))
        .collect();
    std::fs::write(&corpus, text).unwrap();
    let mut cfg = crate::common::tiny_config();
    cfg.data.source = lethe::config::Source::File;
    cfg.data.path = Some(corpus);
    cfg.train.steps = 6;
    cfg.train.batch = 8;
    cfg.train.block = 16; // 2700 train bytes / 8 streams = 337 per stream: wraps around after 21 blocks
    cfg.memory.span = 32;
    cfg.train.steps = 30;
    assert_resuming_after_17_steps_repeats_the_straight_run(&cfg);
}

/// Documents read one at a time (`folder_mode = "separate"`): rounds of one document per
/// stream, drawn anew each epoch; a resumed run repeats the straight one across rounds
/// and epochs.
#[test]
fn resuming_over_documents_read_one_at_a_time_repeats_the_losses_too() {
    let data_dir = tempfile::tempdir().unwrap();
    for d in 0..20u32 {
        let text: Vec<u8> =
            (0..30 + 7 * (d % 6)).map(|i| b"abcdefghij klmnopq rstuvwxyz. "[((i * (d + 3)) % 30) as usize]).collect();
        std::fs::write(data_dir.path().join(format!("doc{d:02}.txt")), text).unwrap();
    }
    let mut cfg = crate::common::tiny_config();
    cfg.data.source = lethe::config::Source::Folder;
    cfg.data.path = Some(data_dir.path().to_path_buf());
    cfg.data.folder_mode = lethe::config::FolderMode::Separate;
    cfg.data.split = [0.8, 0.1, 0.1];
    cfg.train.batch = 4; // 16 training documents: 4 rounds of 4 blocks or so an epoch
    cfg.train.steps = 30;
    assert_resuming_after_17_steps_repeats_the_straight_run(&cfg);
}

#[test]
fn a_nan_loss_stops_training_and_keeps_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::common::tiny_config();
    cfg.train.steps = 4;
    train(&cfg, &options(dir.path())).unwrap();
    let path = dir.path().join("tiny").join("checkpoint.safetensors");
    let before = std::fs::read(&path).unwrap();

    cfg.train.steps = 12;
    cfg.train.lr = 1e38; // blows the weights up within a step or two
    cfg.train.warmup = 0;
    cfg.train.checkpoint_every = 1; // would overwrite the checkpoint at every good step
    cfg.train.grad_clip = 0.0;
    let err = train(&cfg, &TrainOptions { resume: true, accept_changes: true, ..options(dir.path()) }).unwrap_err();
    let LetheError::NonFiniteLoss { step, kept, .. } = &err else { panic!("unexpected error {err}") };
    assert!(*step > 4 && *step <= 12, "step {step}");
    assert!(kept.contains(&format!("checkpoint (step {})", *step - 1)), "{kept}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("at step {step}")) && msg.contains("last good checkpoint"), "{msg}");
    // The checkpoint on disk is the one written after the last good step, and loads.
    let ck = Checkpoint::load(&path).unwrap();
    assert_eq!(ck.state.clone().unwrap().step, *step - 1);
    if *step == 5 {
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }
    for (name, t) in ck.with_prefix("") {
        let finite = t.isfinite().all().int64_value(&[]) == 1;
        assert!(finite, "{name} is not finite in the kept checkpoint");
    }
}

/// Expire-Span with a memory target: the checkpoint keeps the controller of the span
/// loss's weight, so the resumed run weighs its span loss as the straight one did.
#[test]
fn resuming_with_a_memory_target_repeats_the_losses_of_a_straight_run() {
    let mut cfg = expire_to_resume();
    cfg.memory.expire.target = 2.0;
    assert_resuming_after_17_steps_repeats_the_straight_run(&cfg);
}
