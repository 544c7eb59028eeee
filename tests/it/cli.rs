//! The binary as a user runs it: each bad input gives one clear message naming the file,
//! field or value, a non-zero exit, and never a panic.

use crate::common::cli::{fails_with, lethe, sets, succeeds, train, SMALL_MODEL};

#[test]
fn missing_empty_and_short_corpora_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails_with(&train(d, &["--data", "no/such/file.txt"]), &["no/such/file.txt", "cannot read"]);
    std::fs::write(d.join("empty.txt"), b"").unwrap();
    fails_with(&train(d, &["--data", "empty.txt"]), &["empty.txt", "empty"]);
    std::fs::write(d.join("short.txt"), vec![b'x'; 15]).unwrap();
    fails_with(&train(d, &["--data", "short.txt"]), &["short.txt", "too short", "18 tokens"]);
    std::fs::create_dir(d.join("emptydir")).unwrap();
    fails_with(&train(d, &["--data", "emptydir"]), &["emptydir", "no non-empty documents"]);
}

#[test]
fn impossible_config_values_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails_with(&train(d, &["--set", "model.heads=0"]), &["model.heads", "at least 1"]);
    fails_with(&train(d, &["--set", "model.d_model=15"]), &["model.d_model", "divisible"]);
    fails_with(&train(d, &["--set", "train.block=64"]), &["train.block", "memory.span"]);
    fails_with(&train(d, &["--set", "train.lr=-1"]), &["train.lr"]);
    fails_with(&train(d, &["--set", "model.layerz=2"]), &["model.layerz"]);
    fails_with(&train(d, &["--set", "model.vocab=100"]), &["model.vocab", "256"]);
    fails_with(&train(d, &["--preset", "nope"]), &["nope", "copy-tiny"]);
    std::fs::write(d.join("bad.toml"), "[model]\nlayers = \"two\"\n").unwrap();
    fails_with(&train(d, &["--config", "bad.toml"]), &["bad.toml", "layers"]);
}

#[test]
fn corrupt_truncated_and_foreign_checkpoints_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "2", "--name", "ok"]));
    let good = d.join("runs/ok/checkpoint.safetensors");
    let bytes = std::fs::read(&good).unwrap();

    std::fs::write(d.join("garbage.safetensors"), b"this is not a checkpoint at all").unwrap();
    fails_with(
        &lethe(d, &["eval", "--checkpoint", "garbage.safetensors"]),
        &["garbage.safetensors", "not a safetensors file"],
    );
    let mut garbled = bytes.clone();
    garbled[8] = b'[';
    std::fs::write(d.join("garbled.safetensors"), garbled).unwrap();
    fails_with(&lethe(d, &["eval", "--checkpoint", "garbled.safetensors"]), &["garbled.safetensors", "corrupt"]);
    std::fs::write(d.join("cut.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    fails_with(&lethe(d, &["eval", "--checkpoint", "cut.safetensors"]), &["cut.safetensors", "truncated"]);
    fails_with(&lethe(d, &["eval", "--checkpoint", "missing.safetensors"]), &["missing.safetensors", "cannot read"]);

    // Resuming under another model config names the field that differs.
    let out = train(d, &["--steps", "4", "--name", "ok", "--resume", "--set", "model.d_ffn=48"]);
    fails_with(&out, &["checkpoint.safetensors", "model.d_ffn"]);
    // Starting over a run folder without --resume or --overwrite is refused, not clobbered.
    fails_with(&train(d, &["--steps", "2", "--name", "ok"]), &["runs/ok", "--resume"]);
    assert_eq!(std::fs::read(&good).unwrap(), bytes, "the checkpoint was left untouched");
}

#[test]
fn a_nan_loss_exits_with_the_step_and_keeps_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "2", "--name", "nan"]));
    let out = train(
        d,
        &[
            "--steps",
            "10",
            "--name",
            "nan",
            "--resume",
            "--set",
            "train.lr=1e38",
            "--set",
            "train.warmup=0",
            "--set",
            "train.grad_clip=0",
            "--accept-changes",
        ],
    );
    fails_with(&out, &["at step", "last good checkpoint"]);
    succeeds(&lethe(d, &["eval", "--checkpoint", "runs/nan", "--max-tokens", "32"]));
}

#[test]
fn resume_picks_up_the_saved_config_without_repeating_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "4", "--name", "r", "--stop-after", "2"]));
    // Only the name: the model size comes from runs/r/config.toml, not from the default preset.
    succeeds(&lethe(d, &["train", "--quiet", "--out", "runs", "--name", "r", "--resume"]));
    let metrics = std::fs::read_to_string(d.join("runs/r/metrics.jsonl")).unwrap();
    assert!(metrics.lines().any(|l| l.contains("\"step\":4")), "{metrics}");
    fails_with(
        &lethe(d, &["train", "--out", "runs", "--name", "nothing-here", "--resume"]),
        &["nothing-here", "config.toml"],
    );
}

#[test]
fn train_eval_and_generate_run_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let corpus: Vec<u8> =
        b"It was the best of times, it was the worst of times. ".iter().cycle().take(4000).copied().collect();
    std::fs::write(d.join("book.txt"), corpus).unwrap();
    succeeds(&train(d, &["--data", "book.txt", "--steps", "6", "--name", "book"]));
    let config = std::fs::read_to_string(d.join("runs/book/config.toml")).unwrap();
    assert!(config.contains("book.txt"), "{config}");
    let metrics = std::fs::read_to_string(d.join("runs/book/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().filter(|l| l.contains("\"split\":\"train\"")).count(), 6);
    assert!(metrics.lines().any(|l| l.contains("\"split\":\"valid\"") && l.contains("\"bpb\"")));
    // TensorBoard: the same losses at the same steps, in the run folder's event file.
    let events = std::fs::read_dir(d.join("runs/book"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("events.out.tfevents."))
        .unwrap();
    let losses: Vec<(i64, f32)> = lethe::tensorboard::read_events(&events)
        .unwrap()
        .iter()
        .flat_map(|e| {
            e.summary
                .iter()
                .flat_map(|s| s.value.iter())
                .filter(|v| v.tag == "train/loss")
                .map(|v| (e.step, v.simple_value.unwrap()))
        })
        .collect();
    let logged: Vec<(i64, f32)> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["split"] == "train")
        .map(|r| (r["step"].as_i64().unwrap(), r["loss"].as_f64().unwrap() as f32))
        .collect();
    assert_eq!(losses, logged);

    let out = succeeds(&lethe(d, &["eval", "--checkpoint", "runs/book", "--split", "test", "--block", "4"]));
    assert!(out.contains("test: loss") && out.contains("bits per byte"), "{out}");
    let out = succeeds(&lethe(d, &["generate", "--checkpoint", "runs/book", "--prompt", "It was", "--bytes", "40"]));
    assert!(out.starts_with("It was") && out.len() >= 46, "{out:?}");
    fails_with(&lethe(d, &["generate", "--checkpoint", "runs/book", "--prompt", ""]), &["prompt is empty"]);
    fails_with(&lethe(d, &["eval", "--checkpoint", "runs/book", "--block", "64"]), &["train.block", "64"]);
    // A smoke run: one step, its checkpoint, and no evaluation at all.
    let out = succeeds(&train(d, &["--data", "book.txt", "--steps", "1", "--name", "smoke", "--no-eval"]));
    assert!(out.contains("not evaluated (--no-eval)"), "{out}");
    let metrics = std::fs::read_to_string(d.join("runs/smoke/metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"split\":\"train\"") && !metrics.contains("\"split\":\"valid\""), "{metrics}");
    assert!(d.join("runs/smoke/checkpoint.safetensors").is_file());
}

/// Checks that the SVG picture `svg` has its PNG beside it, at twice its size.
fn png_beside(svg: &std::path::Path) {
    let text = std::fs::read_to_string(svg).unwrap();
    let twice = |name: &str| -> u32 {
        let start = text.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        let len = text[start..].find('"').unwrap();
        (2.0 * text[start..start + len].parse::<f64>().unwrap()).ceil() as u32
    };
    let png = resvg::tiny_skia::Pixmap::load_png(svg.with_extension("png")).unwrap();
    assert_eq!((png.width(), png.height()), (twice("width"), twice("height")), "{}", svg.display());
}

#[test]
fn inspect_and_max_span_need_an_expire_span_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("probe.txt"), b"AAAABBBBBBBBBBBBBBBBBBBB=aaaa.").unwrap();
    succeeds(&train(d, &["--steps", "2", "--name", "fixed"]));
    fails_with(&lethe(d, &["inspect", "spans", "--checkpoint", "runs/fixed", "--text", "probe.txt"]), &["Expire-Span"]);
    fails_with(&lethe(d, &["eval", "--checkpoint", "runs/fixed", "--max-span", "4"]), &["--max-span", "Expire-Span"]);

    succeeds(&train(d, &["--steps", "2", "--name", "expire", "--set", "memory.mechanism=expire"]));
    let out = succeeds(&lethe(
        d,
        &["inspect", "spans", "--checkpoint", "runs/expire", "--text", "probe.txt", "--out", "pics"],
    ));
    assert!(out.contains("layer 0: mean span"), "{out}");
    assert!(d.join("pics/spans.html").exists());
    png_beside(&d.join("pics/spans.svg"));
    let out = succeeds(&lethe(d, &["eval", "--checkpoint", "runs/expire", "--max-span", "4", "--max-tokens", "64"]));
    assert!(out.contains("mean span per layer"), "{out}");
    fails_with(
        &lethe(d, &["inspect", "spans", "--checkpoint", "runs/expire", "--text", "missing.txt"]),
        &["missing.txt"],
    );
    // A text too long to draw is refused before it is streamed, and nothing is written:
    // 200,001 bytes in one layer or more is past the pictures' 200,000 cells.
    std::fs::write(d.join("long.txt"), "a".repeat(200_001)).unwrap();
    let long = ["inspect", "spans", "--checkpoint", "runs/expire", "--text", "long.txt", "--out", "long"];
    fails_with(&lethe(d, &long), &["--text `long.txt`: 200001 tokens", "the pictures draw at most 200000"]);
    assert!(!d.join("long").exists());
    let onto_a_file = ["inspect", "spans", "--checkpoint", "runs/expire", "--text", "probe.txt", "--out", "probe.txt"];
    fails_with(&lethe(d, &onto_a_file), &["--out `probe.txt`: is a file, not a folder"]);
}

#[test]
fn inspect_ltm_draws_an_infinity_former_memory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let infinity = [
        "--set",
        "memory.mechanism=infinity",
        "--set",
        "memory.infinity.basis=8",
        "--set",
        "memory.infinity.samples=16",
    ];
    succeeds(&train(d, &[&["--steps", "2", "--name", "inf"], &infinity[..]].concat()));
    std::fs::write(d.join("short.txt"), b"too short").unwrap();
    fails_with(
        &lethe(d, &["inspect", "ltm", "--checkpoint", "runs/inf", "--text", "short.txt"]),
        &["too short", "memory.span = 16"],
    );
    std::fs::write(d.join("long.txt"), "the quick brown fox jumps over the lazy dog. ".repeat(3)).unwrap();
    let out =
        succeeds(&lethe(d, &["inspect", "ltm", "--checkpoint", "runs/inf", "--text", "long.txt", "--out", "pics"]));
    // 135 bytes in blocks of 8: the STM keeps 16 + the block, the rest was absorbed.
    assert!(out.contains("layer 0: mean attended position") && out.contains("112 tokens absorbed"), "{out}");
    assert!(d.join("pics/ltm.html").exists());
    png_beside(&d.join("pics/ltm.svg"));
    // The picture says what its marks mean: the y axis of the bars and the tau line.
    let svg = std::fs::read_to_string(d.join("pics/ltm.svg")).unwrap();
    assert!(svg.contains("τ = 0.75: older memory | the last block") && svg.contains("stroke-dasharray"), "no tau line");
    assert!(svg.contains(">0.000</text>"), "no y axis");
    succeeds(&train(d, &["--steps", "2", "--name", "fixed"]));
    fails_with(&lethe(d, &["inspect", "ltm", "--checkpoint", "runs/fixed", "--text", "long.txt"]), &["∞-former"]);
}

/// Regression: evaluating fewer tokens than reach a task's first answer printed a loss
/// of 0 over 0 scored tokens as if it were a result.
#[test]
fn eval_with_no_scored_token_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "2", "--name", "sort", "--preset", "sorting-tiny", "--length", "64"]));
    fails_with(
        &lethe(d, &["eval", "--checkpoint", "runs/sort", "--max-tokens", "32"]),
        &["no scored token", "--max-tokens 32"],
    );
    let out = succeeds(&lethe(d, &["eval", "--checkpoint", "runs/sort", "--max-tokens", "1024"]));
    assert!(out.contains("scored tokens"), "{out}");
}

#[test]
fn sweep_writes_a_table_a_plot_and_a_report_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["sweep"];
    args.extend(sets(&[SMALL_MODEL, &["train.batch=2", "train.block=8", "data.copy.eval_tokens=128"]].concat()));
    args.extend(["--distance", "5-20", "--steps", "3", "--name", "tiny", "--seeds", "1,2"]);
    args.extend(["--mechanism", "fixed:8,16", "--mechanism", "compressive:16"]);
    let out = succeeds(&lethe(dir.path(), &args));
    assert!(out.contains("[6/6] compressive-16-s2"), "{out}");
    assert!(out.contains("over 2 seeds:"), "{out}");
    let sweep = dir.path().join("runs/tiny-sweep");
    let csv = std::fs::read_to_string(sweep.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 7, "{csv}");
    assert!(csv.lines().nth(3).unwrap().starts_with("fixed,16,1,fixed-16-s1,answers %,"), "{csv}");
    let summary = std::fs::read_to_string(sweep.join("summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 4, "{summary}");
    assert!(summary.lines().nth(3).unwrap().starts_with("compressive,16,2,"), "{summary}");
    let svg = std::fs::read_to_string(sweep.join("sweep.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("compressive"));
    assert!(std::fs::read_to_string(sweep.join("sweep.html")).unwrap().contains("<table>"));
    assert!(sweep.join("runs/fixed-8-s1/checkpoint.safetensors").exists());
    // Run again: nothing is retrained, the points are read back.
    let stamp = std::fs::metadata(sweep.join("runs/fixed-8-s1/checkpoint.safetensors")).unwrap().modified().unwrap();
    succeeds(&lethe(dir.path(), &args));
    let again = std::fs::metadata(sweep.join("runs/fixed-8-s1/checkpoint.safetensors")).unwrap().modified().unwrap();
    assert_eq!(stamp, again);
}

#[test]
fn impossible_sweep_sizes_are_refused_before_any_training() {
    let dir = tempfile::tempdir().unwrap();
    let out = lethe(dir.path(), &["sweep", "--mechanism", "fixed:64,8"]);
    fails_with(&out, &["fixed-8-s1", "train.block"]);
    assert!(!dir.path().join("runs/copy-tiny-sweep/runs/fixed-64-s1").exists());
    fails_with(&lethe(dir.path(), &["sweep", "--mechanism", "lstm"]), &["lstm"]);
    // A sweep whose first run cannot start (its data missing) leaves no folder behind
    // (before, `--out` and the sweep folder with its base.toml).
    let out = lethe(dir.path(), &["sweep", "--data", "no-such.txt", "--mechanism", "fixed:64", "--out", "new/sweeps"]);
    fails_with(&out, &["no-such.txt"]);
    assert!(!dir.path().join("new").exists());
}

/// Regression: the default sweep of the sweep preset failed before its first run, its
/// compressive and ∞-former arms given one block (8) with no room for a second memory.
#[test]
fn the_default_sizes_leave_out_those_a_mechanism_cannot_take() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["sweep", "--preset", "copy-sweep-tiny", "--steps", "1", "--set", "data.copy.eval_tokens=256"];
    let out = lethe(dir.path(), &args);
    let stdout = succeeds(&out);
    assert!(stdout.contains("18 runs") && stdout.contains("[18/18] infinity-64-s1"), "{stdout}");
    assert!(!stdout.contains("compressive-8-s1") && stdout.contains("compressive-16-s1"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("note: a default size is left out: sweep run `compressive-8-s1`"), "{stderr}");
    assert!(stderr.contains("`infinity-8-s1`"), "{stderr}");
}

/// Regression: a sweep point whose evaluation scored no token (collisions are rare: the
/// first 64 tokens of the split hold no answer) was written as an error of 100%.
#[test]
fn a_sweep_run_whose_evaluation_scored_nothing_is_an_error_not_a_figure() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["sweep", "--preset", "collision-tiny"];
    args.extend(sets(&[SMALL_MODEL, &["train.batch=2", "train.block=8", "train.eval_tokens=64"]].concat()));
    args.extend(["--steps", "1", "--name", "empty", "--mechanism", "fixed:8"]);
    let out = lethe(dir.path(), &args);
    fails_with(&out, &["fixed-8-s1", "scored no token", "error %", "train.eval_tokens"]);
    assert!(!dir.path().join("runs/empty-sweep/sweep.csv").exists());
}

#[test]
fn task_options_reach_the_task_or_say_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = succeeds(&lethe(
        dir.path(),
        &["train", "--length", "5", "--distance", "30-60", "--data-seed", "9", "--print-config"],
    ));
    for needle in ["count_max = 5", "distance_min = 30", "distance_max = 60", "seed = 9"] {
        assert!(cfg.contains(needle), "`{needle}` missing:\n{cfg}");
    }
    let cfg =
        succeeds(&lethe(dir.path(), &["train", "--preset", "instruction-tiny", "--distance", "100", "--print-config"]));
    assert!(cfg.contains("distance_min = 100") && cfg.contains("distance_max = 100"), "{cfg}");
    let cfg = succeeds(&lethe(dir.path(), &["train", "--preset", "sorting-tiny", "--length", "300", "--print-config"]));
    assert!(cfg.contains("length = 300"), "{cfg}");
    fails_with(
        &lethe(dir.path(), &["train", "--preset", "collision-tiny", "--distance", "10-20", "--print-config"]),
        &["--distance"],
    );
    fails_with(&lethe(dir.path(), &["train", "--distance", "9-3", "--print-config"]), &["data.copy.distance_max"]);
}

/// A gridworld run small enough for a CLI test.
const GRID: &[&str] = &[
    "--preset",
    "corridor-small",
    "--set",
    "train.batch=4",
    "--set",
    "train.block=8",
    "--set",
    "rl.eval_episodes=8",
    "--set",
    "data.corridor.length_max=6",
    "--set",
    "train.log_every=1",
];

#[test]
fn gridworlds_train_evaluate_play_and_sweep_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = vec!["train", "--quiet", "--steps", "3", "--name", "grid"];
    args.extend_from_slice(GRID);
    let out = succeeds(&lethe(d, &args));
    assert!(out.contains("done: 8 episodes") && out.contains("success"), "{out}");
    let run = d.join("runs/grid");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().filter(|l| l.contains("\"split\":\"train\"")).count(), 3, "{metrics}");
    assert!(metrics.lines().any(|l| l.contains("\"split\":\"eval\"") && l.contains("\"success_rate\"")), "{metrics}");

    let out = succeeds(&lethe(d, &["eval", "--checkpoint", "runs/grid", "--episodes", "6"]));
    assert!(out.starts_with("8 episodes"), "whole batches of 4: {out}");
    let out = succeeds(&lethe(d, &["play", "--checkpoint", "runs/grid", "--seed", "3"]));
    assert!(out.contains("with a trained agent") && out.contains("step 1: ") && out.contains("#A"), "{out}");
    let first = out.lines().find(|l| l.starts_with("step 1: ")).unwrap();
    assert!(
        ["up", "down", "left", "right"].iter().any(|a| first.starts_with(&format!("step 1: {a}, reward"))),
        "moves by their names: {first}"
    );
    assert!(out.contains("(episode over)"), "{out}");
    let out = succeeds(&lethe(d, &["play", "--preset", "portal-small", "--episodes", "2", "--summary"]));
    assert!(out.contains("with an untrained agent") && out.contains("room ") && out.contains("2 episodes"), "{out}");
    let out = succeeds(&lethe(d, &["play", "--preset", "portal-expire-small", "--episodes", "2", "--spans", "spans"]));
    assert!(
        out.contains("layer 1: mean span 64.0") && out.contains("wrote agent-spans.svg"),
        "untrained: every span L/2: {out}"
    );
    png_beside(&d.join("spans/agent-spans.svg"));
    let csv = std::fs::read_to_string(d.join("spans/agent-spans.csv")).unwrap();
    assert!(csv.starts_with("episode,step,room,action,reward,door,span_0,span_1\n0,0,1,"), "{csv}");
    assert!(std::fs::read_to_string(d.join("spans/agent-spans.html")).unwrap().contains("<svg"));
    let onto_a_file = ["play", "--preset", "portal-expire-small", "--spans", "spans/agent-spans.csv"];
    fails_with(&lethe(d, &onto_a_file), &["--spans `spans/agent-spans.csv`: is a file, not a folder"]);
    // A corridor of a billion cells prints the 400 columns around the agent, not the billion.
    let long = ["play", "--preset", "corridor-small", "--length", "1000000000", "--summary"];
    let out = succeeds(&lethe(d, &long));
    assert!(out.contains("\ncolumns 0-399 of ") && out.len() < 10_000, "{}", &out[..out.len().min(2000)]);

    let mut sweep =
        vec!["sweep", "--steps", "2", "--name", "gs", "--mechanism", "fixed:4,8", "--mechanism", "expire:8"];
    sweep.extend_from_slice(GRID);
    let out = succeeds(&lethe(d, &sweep));
    assert!(out.contains("success %") && out.contains("return") && out.contains("[3/3] expire-8-s1"), "{out}");
}

#[test]
fn gridworld_mistakes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let train = |extra: &[&str]| {
        let mut args = vec!["train", "--quiet", "--steps", "1"];
        args.extend_from_slice(GRID);
        args.extend_from_slice(extra);
        lethe(d, &args)
    };
    fails_with(&train(&["--set", "data.corridor.length_min=1"]), &["data.corridor.length_min", "at least 2"]);
    fails_with(&train(&["--distance", "9-3"]), &["data.corridor.length_max"]);
    fails_with(&train(&["--set", "rl.gamma=1.5"]), &["rl.gamma"]);
    fails_with(&train(&["--set", "train.optimizer=sgd"]), &["optimizer", "sgd"]);
    fails_with(
        &lethe(d, &["train", "--preset", "portal-small", "--set", "data.portal.rooms=1"]),
        &["data.portal.rooms"],
    );
    fails_with(&lethe(d, &["play", "--preset", "copy-tiny"]), &["plays gridworlds"]);
    fails_with(&lethe(d, &["play", "--preset", "corridor-small", "--episodes", "0"]), &["--episodes"]);
    fails_with(&lethe(d, &["play", "--preset", "corridor-small", "--spans", "s"]), &["--spans", "Expire-Span"]);
    // An unwritable output folder names the path and gives the reason once (it used to
    // be printed twice: in the message and again as the error's source).
    std::fs::write(d.join("blocker"), "a file, not a folder").unwrap();
    let out = lethe(d, &["play", "--preset", "corridor-expire-small", "--spans", "blocker/spans"]);
    fails_with(&out, &["blocker/spans", "os error"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr).matches("os error").count(), 1, "{out:?}");
    // A language-model checkpoint is not an agent, and a gridworld has no token stream.
    succeeds(&lethe(
        d,
        &[
            "train",
            "--quiet",
            "--steps",
            "1",
            "--name",
            "lm",
            "--set",
            "train.eval_tokens=64",
            "--set",
            "data.copy.eval_tokens=128",
        ],
    ));
    fails_with(&lethe(d, &["play", "--checkpoint", "runs/lm"]), &["plays gridworlds"]);
    let mut bench = vec!["bench", "--bench-steps", "1"];
    bench.extend_from_slice(GRID);
    fails_with(&lethe(d, &bench), &["reinforcement-learning task"]);
}

/// The guide's preset table is the one `--list-presets` prints, row for row: a preset
/// added, renamed or redescribed without the guide fails here.
#[test]
fn the_guide_lists_every_preset_as_list_presets_does() {
    let page = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide/src/presets.md");
    let guide = std::fs::read_to_string(page).unwrap();
    let header = "| preset | what it is for |\n|---|---|\n";
    let start = guide.find(header).expect("the guide's Presets page has a preset table") + header.len();
    let table: Vec<&str> = guide[start..].lines().take_while(|l| l.starts_with('|')).collect();
    let expected: Vec<String> =
        lethe::config::PRESETS.iter().map(|p| format!("| `{}` | {} |", p.name, p.about)).collect();
    assert_eq!(table, expected, "docs/guide/src/presets.md's preset table should read:\n{}", expected.join("\n"));
    let listed = succeeds(&lethe(std::path::Path::new("."), &["train", "--list-presets"]));
    for p in lethe::config::PRESETS {
        assert!(
            listed.lines().any(|l| l.starts_with(p.name) && l.ends_with(p.about)),
            "--list-presets lacks {}",
            p.name
        );
    }
}

/// `--help-config` prints every key under a prefix with its default and the meaning from
/// the field's doc comment, for any command that takes a config; a prefix that names no
/// key is one line and a failure.
#[test]
fn help_config_explains_the_keys_under_a_prefix() {
    let here = std::path::Path::new(".");
    for command in ["train", "bench"] {
        let text = succeeds(&lethe(here, &[command, "--help-config", "memory.expire"]));
        assert!(text.starts_with("memory.expire.ramp = 16\n    Ramp length `R` of the soft mask"), "{text}");
        assert!(text.contains("memory.expire.fused = true") && !text.contains("memory.adaptive"), "{text}");
    }
    let all = succeeds(&lethe(here, &["train", "--help-config"]));
    assert!(all.starts_with("name = ") && all.contains("\nrl.reset = \"episode\""), "{all}");
    fails_with(
        &lethe(here, &["train", "--help-config", "memory.nothing"]),
        &["no config key starts with `memory.nothing`"],
    );
}

/// Regression: steps and evaluations without a scored token were logged as a
/// loss of 0; they are logged as null and printed as `-`.
#[test]
fn a_window_without_a_scored_token_logs_no_loss_rather_than_zero() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The answer lies 60-80 tokens away: the first blocks of 8 hold only the run and filler.
    let far = [
        "--steps",
        "4",
        "--set",
        "data.copy.distance_min=60",
        "--set",
        "data.copy.distance_max=80",
        "--set",
        "train.eval_tokens=8",
    ];
    let said = succeeds(&train(d, &far));
    assert!(said.contains("scored no token"), "{said}");
    let text = std::fs::read_to_string(d.join("runs/copy-tiny/metrics.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 5, "4 steps and 1 evaluation");
    for r in &records {
        assert!(r["loss"].is_null() && r["bpb"].is_null(), "{r}");
    }
    assert!(records.iter().any(|r| r["split"] == "valid" && r["accuracy"].is_null() && r["tokens"] == 0));
}

/// `eval --per-token` writes one row per target: its loss, span and memory size per
/// layer; the scored rows' mean loss is the reported loss, and a span cap shows in the
/// spans (Expire-Span Fig. 9 compares two caps token by token).
#[test]
fn eval_per_token_writes_each_targets_loss_and_span() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(
        d,
        &[
            "--steps",
            "3",
            "--name",
            "expire",
            "--set",
            "memory.mechanism=expire",
            "--set",
            "memory.expire.init_fraction=0.9",
        ],
    ));
    let rows = |file: &str, extra: &[&str]| -> (serde_json::Value, Vec<csv::StringRecord>, csv::StringRecord) {
        let mut args =
            vec!["eval", "--checkpoint", "runs/expire", "--max-tokens", "128", "--json", "--per-token", file];
        args.extend_from_slice(extra);
        let r = serde_json::from_str(&succeeds(&lethe(d, &args))).unwrap();
        let mut reader = csv::Reader::from_path(d.join(file)).unwrap();
        let header = reader.headers().unwrap().clone();
        (r, reader.records().map(|r| r.unwrap()).collect(), header)
    };
    let (r, all, header) = rows("all.csv", &[]);
    assert_eq!(
        header.iter().collect::<Vec<_>>(),
        vec!["stream", "position", "target", "text", "loss", "scored", "span_0", "mem_0"]
    );
    assert_eq!(all.len(), 128, "2 streams x 64 positions");
    let scored: Vec<f64> = all.iter().filter(|row| &row[5] == "1").map(|row| row[4].parse().unwrap()).collect();
    let mean = scored.iter().sum::<f64>() / scored.len() as f64;
    assert!((mean - r["loss"].as_f64().unwrap()).abs() < 1e-4, "rows {mean}, reported {}", r["loss"]);
    let stream0: Vec<usize> = all.iter().filter(|row| &row[0] == "0").map(|row| row[1].parse().unwrap()).collect();
    assert_eq!(stream0, (0..64).collect::<Vec<_>>());
    let (_, capped, _) = rows("capped.csv", &["--max-span", "2"]);
    let longest =
        |rows: &[csv::StringRecord]| rows.iter().map(|row| row[6].parse::<f64>().unwrap()).fold(0.0, f64::max);
    assert!(longest(&capped) <= 2.0 && longest(&all) > 2.0, "capped {} against {}", longest(&capped), longest(&all));
    assert!(!d.join("all.csv.tmp").exists());
}

/// `lethe plot` draws two runs' curves into a PNG and an SVG, each run named in the
/// legend; a folder without metrics and an unknown field are named.
#[test]
fn plot_draws_the_curves_of_two_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, mechanism) in [("xl", "fixed"), ("expire", "expire")] {
        succeeds(&train(
            d,
            &[
                "--steps",
                "4",
                "--name",
                name,
                "--set",
                &format!("memory.mechanism={mechanism}"),
                "--set",
                "train.eval_every=2",
            ],
        ));
    }
    let out = succeeds(&lethe(d, &["plot", "runs/xl", "runs/expire", "--out", "figs/curves"]));
    assert!(out.contains("figs/curves.png") && out.contains("figs/curves.svg"), "{out}");
    let png = std::fs::read(d.join("figs/curves.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) =
        (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
    assert_eq!((w, h), (960, 600));
    let svg = std::fs::read_to_string(d.join("figs/curves.svg")).unwrap();
    for label in ["xl (train)", "xl (valid)", "expire (train)", "expire (valid)", "step"] {
        assert!(svg.contains(label), "the SVG lacks `{label}`");
    }
    std::fs::create_dir(d.join("empty")).unwrap();
    fails_with(&lethe(d, &["plot", "runs/xl", "empty"]), &["empty/metrics.jsonl"]);
    // One run twice, however its path is spelled, is one curve: refused.
    fails_with(&lethe(d, &["plot", "runs/xl", "./runs/xl/"]), &["lethe plot: `./runs/xl/` is given twice"]);
    fails_with(&lethe(d, &["plot", "runs/xl", "--metric", "nosuch"]), &["no `nosuch`"]);
}

/// Writes a WordNet of one synset per part of speech, in WordNet's file format.
fn tiny_wordnet(dir: &std::path::Path) {
    for (part, pos, a, b) in [
        ("noun", "n", "film", "flick"),
        ("verb", "v", "begin", "start"),
        ("adj", "a", "glad", "happy"),
        ("adv", "r", "fast", "quickly"),
    ] {
        std::fs::write(dir.join(format!("data.{part}")), format!("00000000 00 {pos} 02 {a} 0 {b} 0 000 | a gloss\n"))
            .unwrap();
        std::fs::write(
            dir.join(format!("index.{part}")),
            format!("{a} {pos} 1 0 1 0 00000000\n{b} {pos} 1 0 1 0 00000000\n"),
        )
        .unwrap();
        std::fs::write(dir.join(format!("{part}.exc")), "").unwrap();
    }
}

/// `lethe score` prints the means, and `--wordnet` adds METEOR's synonym stage: "film"
/// then matches "flick" (its own stem) but not "movie" (whose stem is "movi", as NLTK).
#[test]
fn score_prints_the_means_and_wordnet_adds_synonyms_to_meteor() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("wn")).unwrap();
    tiny_wordnet(&d.join("wn"));
    std::fs::write(d.join("pred.txt"), "the film\nthe film\n").unwrap();
    std::fs::write(d.join("ref.txt"), "the flick\nthe movie\n").unwrap();
    let meteor = |out: &str| -> String { out.lines().find(|l| l.starts_with("meteor")).unwrap().to_string() };
    // Without synonyms each line matches "the" alone: P = R = 1/2, one chunk of one
    // match, METEOR 0.5 * (1 - 0.5) = 25%.
    let plain = succeeds(&lethe(d, &["score", "pred.txt", "ref.txt"]));
    assert!(plain.contains("pairs    2"), "{plain}");
    assert!(meteor(&plain).contains(" 25.00  (exact, stem; --wordnet DIR adds synonyms)"), "{plain}");
    // With them the first line matches both words in one chunk: 1 - 0.5 / 8 = 0.9375;
    // the mean is (0.9375 + 0.25) / 2 = 59.375%.
    let out = succeeds(&lethe(d, &["score", "pred.txt", "ref.txt", "--wordnet", "wn", "--csv", "s.csv"]));
    assert!(meteor(&out).contains(" 59.38  (exact, stem, WordNet synonyms)"), "{out}");
    let csv = std::fs::read_to_string(d.join("s.csv")).unwrap();
    let last: Vec<&str> = csv.lines().skip(1).map(|l| l.rsplit(',').next().unwrap()).collect();
    assert_eq!(last, vec!["0.937500", "0.250000"]);
}
