//! Running the `lethe` binary as a user does, for the command-line tests.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// A model small enough that a few steps take well under a second.
pub const TINY: &[&str] = &[
    "--set",
    "model.layers=1",
    "--set",
    "model.d_model=16",
    "--set",
    "model.heads=2",
    "--set",
    "model.d_ffn=32",
    "--set",
    "memory.span=16",
    "--set",
    "train.batch=2",
    "--set",
    "train.block=8",
    "--set",
    "train.log_every=1",
    "--set",
    "train.eval_tokens=64",
    "--set",
    "data.copy.eval_tokens=128",
    "--set",
    "data.copy.distance_min=5",
    "--set",
    "data.copy.distance_max=20",
];

/// The model of lethe's backbone most command-line tests train: one layer of width 16,
/// two heads, a feed-forward layer of 32 (`key=value` fields, for [`sets`]).
pub const SMALL_MODEL: &[&str] = &["model.layers=1", "model.d_model=16", "model.heads=2", "model.d_ffn=32"];

/// `--set FIELD` for each of `fields` (`key=value`).
pub fn sets<'a>(fields: &[&'a str]) -> Vec<&'a str> {
    fields.iter().flat_map(|field| ["--set", field]).collect()
}

pub fn lethe(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lethe"))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run lethe")
}

/// Starts `lethe` in `dir` with `args`, stdout and stderr piped, for a test that watches
/// it run (and signals it).
pub fn spawn(dir: &Path, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_lethe"))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lethe")
}

pub fn train(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["train", "--quiet", "--out", "runs"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(extra);
    lethe(dir, &args)
}

/// Asserts a clean failure whose message contains every one of `needles`.
pub fn fails_with(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
    let error_lines = stderr.lines().filter(|l| l.starts_with("error:")).count();
    assert_eq!(error_lines, 1, "expected one error line:\n{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "expected `{n}` in:\n{stderr}");
    }
}

pub fn succeeds(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed:\n{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `lethe train --init-from folder` on `dir/text.txt` (the fixture's sample text six
/// times over, written there) for 3 steps as run `name`, in blocks of 8 of 2 streams with
/// the settings `sets` besides; fails the test unless it succeeds. Returns what it said.
pub fn fine_tune_fixture(dir: &Path, folder: &Path, name: &str, sets: &[&str]) -> String {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama/llama3/sample.txt");
    let text = std::fs::read_to_string(sample).expect("read the fixture's sample").repeat(6);
    std::fs::write(dir.join("text.txt"), text).expect("write text.txt");
    let common = ["train.block=8", "train.batch=2", "train.eval_every=0", "train.eval_tokens=64", "train.warmup=1"];
    let folder = folder.to_str().expect("a UTF-8 fixture path");
    let mut args = vec!["train", "--init-from", folder, "--data", "text.txt", "--steps", "3", "--name", name];
    for s in common.iter().chain(sets) {
        args.extend(["--set", s]);
    }
    let out = lethe(dir, &args);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    said
}

/// `lethe eval --init-from folder` on `dir/text.txt` (as [`fine_tune_fixture`] wrote it) in
/// windows of 24 tokens, 48 scored, under the window policy at `budgets` with the run
/// `runs/<learned>` beside it, into `dir/sweep`; fails the test unless it succeeds.
/// Returns the rows of `budget.csv` whose policy is `<mechanism> (<learned>)`.
pub fn learned_sweep_rows(
    dir: &Path,
    folder: &Path,
    budgets: &str,
    learned: &str,
    mechanism: &str,
) -> Vec<csv::StringRecord> {
    let folder = folder.to_str().expect("a UTF-8 fixture path");
    let run = format!("runs/{learned}");
    let args = [
        "eval",
        "--init-from",
        folder,
        "--data",
        "text.txt",
        "--context",
        "24",
        "--max-tokens",
        "48",
        "--policies",
        "window",
        "--budgets",
        budgets,
        "--learned",
        &run,
        "--out",
        "sweep",
    ];
    let out = lethe(dir, &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut rows = csv::Reader::from_path(dir.join("sweep/budget.csv")).expect("read budget.csv");
    let name = format!("{mechanism} ({learned})");
    rows.records().map(|r| r.expect("a row of budget.csv")).filter(|r| r[0] == *name).collect()
}
