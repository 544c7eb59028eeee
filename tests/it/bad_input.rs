//! Regression tests: bad input gets one clear error and a non-zero exit,
//! never a panic, a hang, lost work or a silently wrong result. One test per class.

use crate::common::cli::{fails_with, lethe, sets, spawn, succeeds, train, SMALL_MODEL, TINY};

/// Lost work: a refused resume rewrote `config.toml` first, so every later resume was
/// refused too. Nothing in the folder may change before a resume is accepted.
#[test]
fn a_refused_resume_changes_nothing_in_the_run_folder() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "4", "--stop-after", "2", "--name", "r"]));
    let files = ["config.toml", "metrics.jsonl", "checkpoint.safetensors"].map(|f| d.join("runs/r").join(f));
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    fails_with(&train(d, &["--steps", "4", "--name", "r", "--resume", "--seed", "9"]), &["seed"]);
    // Silently accepted: a changed learning rate or schedule. Each is named.
    let changed =
        ["--steps", "4", "--name", "r", "--resume", "--set", "train.lr=0.0001", "--set", "train.schedule=linear"];
    fails_with(
        &train(d, &changed),
        &["train.lr 0.001 -> 0.0001", "train.schedule \"cosine\" -> \"linear\"", "--accept-changes", "--init-from"],
    );
    let after: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(before == after, "a refused resume changed the run folder");
    fails_with(&lethe(d, &["train", "--name", "r", "--accept-changes"]), &["--resume"]);
    let mut accepted = vec!["train", "--out", "runs"];
    accepted.extend_from_slice(TINY);
    accepted.extend_from_slice(&changed);
    accepted.push("--accept-changes");
    let out = lethe(d, &accepted);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("at step 2, with changed settings: train.lr 0.001 -> 0.0001"),
        "{stderr}"
    );
}

/// Lost work: records written after the checkpoint appeared twice after a resume.
#[test]
fn a_resumed_run_logs_each_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "6", "--name", "m", "--set", "train.checkpoint_every=2", "--stop-after", "3"]));
    // The checkpoint is at step 3 (the stop); fake a later record, as a kill after it leaves.
    let log = d.join("runs/m/metrics.jsonl");
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"step\":5,\"split\":\"train\",\"loss\":1.0}\n{\"step\":6,\"spl");
    std::fs::write(&log, text).unwrap();
    succeeds(&train(d, &["--steps", "6", "--name", "m", "--resume"]));
    let text = std::fs::read_to_string(&log).unwrap();
    let train_steps: Vec<u64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("every line is whole JSON"))
        .filter(|r| r["split"] == "train")
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(train_steps, vec![1, 2, 3, 4, 5, 6], "{text}");
}

/// Lost work: two trainings on one run folder raced and corrupted its files.
#[test]
fn a_second_training_on_a_locked_run_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let folder = d.join("runs/busy");
    std::fs::create_dir_all(&folder).unwrap();
    let lock =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(folder.join(".lethe.lock")).unwrap();
    lock.lock().unwrap(); // as a running training holds it
    fails_with(&train(d, &["--steps", "2", "--name", "busy"]), &["runs/busy", "in use by another training"]);
    assert!(!folder.join("config.toml").exists(), "the refused run wrote into the folder");
    lock.unlock().unwrap();
    succeeds(&train(d, &["--steps", "2", "--name", "busy"]));
}

/// Lost work: SIGINT, SIGTERM and SIGHUP killed training with no checkpoint. The first
/// signal finishes the step, writes a checkpoint and exits non-zero; resume goes on.
#[test]
fn a_signal_stops_training_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let run = format!("sig{signal}");
        let mut args =
            vec!["train", "--out", "runs", "--name", &run, "--steps", "100000", "--set", "train.checkpoint_every=0"];
        args.extend_from_slice(TINY);
        let child = spawn(d, &args);
        // Wait until training has started (the first progress line is written to the log).
        let log = d.join("runs").join(&run).join("metrics.jsonl");
        crate::common::wait_until("training did not start", 120, || {
            std::fs::read_to_string(&log).is_ok_and(|t| !t.is_empty())
        });
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(child.id() as i32, signal) };
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {stderr}");
        assert!(stderr.contains(name) && stderr.contains("--resume"), "{name}: {stderr}");
        assert!(d.join("runs").join(&run).join("checkpoint.safetensors").exists(), "{name}: no checkpoint");
    }
}

/// Litter: a signal killed `lethe eval --per-token`, leaving its partial rows in a
/// temporary file (gigabytes for a long text). It now stops between rows, removes them and
/// says the file was not written.
#[test]
fn a_signal_stops_a_per_token_evaluation_and_removes_its_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text: String = (0..400_000).map(|i| format!("word{} ", i * 7919 % 997)).collect();
    std::fs::write(d.join("text.txt"), text).unwrap();
    let args =
        ["train", "--quiet", "-p", "enwik8-tiny", "--data", "text.txt", "--steps", "1", "--name", "t", "--no-eval"];
    succeeds(&lethe(d, &args));
    let child = spawn(d, &["eval", "--checkpoint", "runs/t", "--per-token", "tok.csv"]);
    // The rows' temporary file: `.tok.csv.<process>-<count>.tmp`.
    let partial = || {
        let names = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path());
        names.filter(|p| p.to_string_lossy().contains(".tok.csv.")).collect::<Vec<_>>()
    };
    crate::common::wait_until("the rows did not start", 120, || {
        partial().first().is_some_and(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
    });
    // SAFETY: signals a child process this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("stopped by SIGTERM; `tok.csv` not written"), "{stderr}");
    assert!(partial().is_empty() && !d.join("tok.csv").exists(), "the partial rows were left");
}

/// Lost work: a signal killed `lethe bench`, and with it the configs already timed.
/// The first one lets the config under way finish, skips the rest, writes the report of
/// those done and exits 130.
#[test]
fn a_signal_stops_bench_between_configs_and_keeps_the_results_done() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Three configs of a second or more each (500 steps of about 2 ms).
    let mut args = vec![
        "bench",
        "--out",
        "runs",
        "--bench-steps",
        "500",
        "--warmup",
        "0",
        "--set",
        "train.threads=1",
        "--mechanism",
        "fixed:8",
        "--mechanism",
        "fixed:16",
        "--mechanism",
        "fixed:32",
    ];
    args.extend_from_slice(TINY);
    let mut child = spawn(d, &args);
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let (stdout, lines) = (child.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            std::io::BufReader::new(stdout).lines().map_while(Result::ok).for_each(|l| lines.lock().unwrap().push(l))
        })
    };
    let benched_one = || lines.lock().unwrap().iter().any(|l| l.contains("step median"));
    crate::common::wait_until("the first config was not benched", 120, || {
        benched_one() || child.try_wait().unwrap().is_some()
    });
    assert!(benched_one(), "lethe bench ended early: {:?}", child.wait_with_output().unwrap());
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    reader.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("runs/copy-tiny/bench.json")).unwrap()).unwrap();
    let done = report["results"].as_array().unwrap().len();
    // The signal came while the second config ran (or, on a slow machine, the third).
    assert!((1..3).contains(&done), "{done} results");
    let said = format!("interrupted by SIGINT after {done} of 3 configs; the rest were skipped");
    assert!(stderr.contains(&said) && stderr.contains("bench.json"), "{stderr}");
    assert_eq!(lines.lock().unwrap().iter().filter(|l| l.contains("step median")).count(), done);
}

/// `--rounds`: a signal stops the bench after the round under way, and every config's
/// figures over the rounds done are reported and written.
#[test]
fn a_signal_stops_bench_rounds_after_a_round_and_keeps_every_config() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Rounds of a fraction of a second each (two configs, 100 steps of about 2 ms).
    let mut args = vec![
        "bench",
        "--out",
        "runs",
        "--bench-steps",
        "100",
        "--warmup",
        "0",
        "--rounds",
        "50",
        "--set",
        "train.threads=1",
        "--mechanism",
        "fixed:8",
        "--mechanism",
        "fixed:16",
    ];
    args.extend_from_slice(TINY);
    let mut child = spawn(d, &args);
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let (stderr, lines) = (child.stderr.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            std::io::BufReader::new(stderr).lines().map_while(Result::ok).for_each(|l| lines.lock().unwrap().push(l))
        })
    };
    // With 50 rounds the bench tells every fifth: the first is round 5.
    let one_round = || lines.lock().unwrap().iter().any(|l| l.starts_with("round 5 of 50"));
    crate::common::wait_until("no round was timed", 120, || one_round() || child.try_wait().unwrap().is_some());
    assert!(one_round(), "lethe bench ended early: {:?}", lines.lock().unwrap());
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    reader.join().unwrap();
    let stderr = lines.lock().unwrap().join("\n");
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let said_rounds: Vec<usize> = lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| l.strip_prefix("round ")?.split(' ').next()?.parse().ok())
        .collect();
    assert!(said_rounds.iter().all(|r| r % 5 == 0), "{stderr}");
    let done: usize = stderr
        .split("after ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!((5..50).contains(&done), "{done} rounds: {stderr}");
    let said =
        format!("interrupted by SIGINT after {done} of 50 rounds; every config's figures are over the rounds done");
    assert!(stderr.contains(&said) && stderr.contains("bench.json"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("runs/copy-tiny/bench.json")).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "every config is reported");
    for r in results {
        assert_eq!(r["steps"].as_u64(), Some(100 * done as u64));
        assert_eq!(r["round_medians_s"].as_array().unwrap().len(), done);
    }
}

/// Lost work: a failed checkpoint write left its temporary file behind.
/// Standard output on a full disk (`/dev/full`): the commands that print their result
/// panicked ("failed printing to stdout", exit 101, a backtrace); each now says so in one
/// line and exits 1 (`play` went on playing, its lines lost). Standard error on a full
/// disk panicked at the first line said.
#[test]
fn standard_output_on_a_full_disk_is_an_error_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("lines.txt"), "the cat sat\n").unwrap();
    let mut cases = vec![
        vec!["train", "--list-presets"],
        vec!["score", "lines.txt", "lines.txt"],
        vec!["play", "-p", "corridor-small", "--episodes", "1"],
    ];
    succeeds(&train(d, &["--steps", "1", "--no-eval", "--name", "r"]));
    cases.push(vec!["generate", "--checkpoint", "runs/r", "--prompt", "ab", "--bytes", "3"]);
    for args in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lethe"))
            .current_dir(d)
            .args(&args)
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.trim(), "error: standard output: No space left on device (os error 28)", "{args:?}");
    }
    // Standard error on a full disk: what is said there is dropped, the work is done
    // (before: a panic at the first progress line), and a failure still exits 1.
    let full_stderr = |args: &[&str]| {
        let err = std::fs::File::create("/dev/full").unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lethe"))
            .current_dir(d)
            .args(args)
            .stderr(err)
            .output()
            .unwrap();
        out.status.code()
    };
    assert_eq!(full_stderr(&["tokenizer", "words", "lines.txt", "--out", "tok"]), Some(0));
    assert!(d.join("tok/tokenizer.json").is_file());
    assert_eq!(full_stderr(&["eval", "--checkpoint", "nosuch"]), Some(1));
}

#[test]
fn a_failed_atomic_write_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("occupied");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("inside"), b"x").unwrap(); // a folder that rename cannot replace
    assert!(lethe::checkpoint::write_atomic(&target, b"bytes").is_err());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("occupied")], "temporary file left behind");
}

/// Lost work: a checkpoint past the file-size limit (`ulimit -f`) ended training by
/// SIGXFSZ without a word. It is an error naming the file; the last checkpoint stays,
/// and the run resumes from it once the limit allows.
#[test]
fn a_checkpoint_past_the_file_size_limit_is_an_error_and_the_last_one_stays() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let every = ["--set", "train.checkpoint_every=2"];
    succeeds(&train(d, &[&every[..], &["--steps", "4", "--name", "f", "--stop-after", "2"]].concat()));
    let checkpoint = d.join("runs/f/checkpoint.safetensors");
    let before = std::fs::read(&checkpoint).unwrap();
    let limit = before.len() as u64 / 2;
    let mut args = vec!["train", "--quiet", "--out", "runs"];
    args.extend_from_slice(TINY);
    args.extend_from_slice(&[&every[..], &["--steps", "4", "--name", "f", "--resume"]].concat());
    let mut limited = std::process::Command::new(env!("CARGO_BIN_EXE_lethe"));
    limited.current_dir(d).args(&args).stdin(std::process::Stdio::null());
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        limited.pre_exec(move || {
            let rlimit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            match libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let out = limited.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "status {:?}; stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The file named is the checkpoint, not the temporary file that is gone.
    fails_with(&out, &["runs/f/checkpoint.safetensors`: File too large", "still holds step 2's", "--resume"]);
    assert_eq!(std::fs::read(&checkpoint).unwrap(), before, "the last checkpoint changed");
    let left: Vec<_> = std::fs::read_dir(d.join("runs/f")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!left.iter().any(|f| f.to_string_lossy().ends_with(".tmp")), "temporary file left behind: {left:?}");
    succeeds(&train(d, &[&every[..], &["--steps", "4", "--name", "f", "--resume"]].concat()));
}

/// Silently wrong: flipped bits in tensor data, NaN weights, a checkpoint already at
/// `train.steps`, and options that contradict each other.
#[test]
fn damaged_checkpoints_and_contradictory_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "2", "--name", "c"]));
    let ckpt = d.join("runs/c/checkpoint.safetensors");
    let bytes = std::fs::read(&ckpt).unwrap();
    let mut flipped = bytes.clone();
    let last = flipped.len() - 3; // inside the last tensor's data
    flipped[last] ^= 0x10;
    std::fs::write(d.join("flipped.safetensors"), &flipped).unwrap();
    fails_with(&lethe(d, &["eval", "--checkpoint", "flipped.safetensors"]), &["flipped.safetensors", "checksum"]);

    fails_with(&train(d, &["--steps", "2", "--name", "c", "--resume"]), &["step 2", "--steps"]);
    fails_with(
        &train(d, &["--steps", "4", "--name", "c", "--resume", "--stop-after", "1"]),
        &["--stop-after", "step 2"],
    );
    fails_with(&train(d, &["--steps", "4", "--name", "z", "--stop-after", "0"]), &["--stop-after"]);
    fails_with(&train(d, &["--steps", "4", "--name", "c", "--resume", "--overwrite"]), &["--overwrite"]);
    let long = "x".repeat(201);
    for name in ["../../x", "", "a/b", "..", "a\nb", &long] {
        fails_with(&train(d, &["--steps", "2", "--name", name]), &["name"]);
    }
    assert!(!d.join("x").exists() && !d.parent().unwrap().join("x").exists());
    fails_with(
        &lethe(d, &["generate", "--checkpoint", "runs/c", "--prompt", "a", "--temperature", "-1"]),
        &["--temperature"],
    );
    fails_with(
        &lethe(d, &["generate", "--checkpoint", "runs/c", "--prompt", "a", "--temperature", "NaN"]),
        &["--temperature"],
    );
    fails_with(&lethe(d, &["eval", "--checkpoint", "runs/c", "--block", "0"]), &["--block"]);
    fails_with(&lethe(d, &["eval", "--checkpoint", "runs/c", "--batch", "0"]), &["--batch"]);
    fails_with(&lethe(d, &["sweep", "--seeds", "1,1"]), &["seed 1", "twice"]);
    let out = lethe(d, &["sweep", "--seeds", ""]);
    fails_with(&out, &["--seeds"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("memory size"));
    fails_with(&lethe(d, &["train", "--steps", "-5"]), &["-5", "--steps"]);
}

/// Misleading: a NaN at the first steps named a checkpoint that did not exist.
#[test]
fn a_nan_before_any_checkpoint_says_that_none_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = train(
        d,
        &[
            "--steps",
            "10",
            "--name",
            "nan",
            "--set",
            "train.lr=1e38",
            "--set",
            "train.warmup=0",
            "--set",
            "train.grad_clip=0",
        ],
    );
    fails_with(&out, &["at step", "No checkpoint had been written yet"]);
    assert!(!d.join("runs/nan/checkpoint.safetensors").exists());
}

/// Hangs: a thread count far beyond the cores started that many libtorch threads.
#[test]
fn more_threads_than_cores_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    fails_with(&train(dir.path(), &["--steps", "2", "--set", "train.threads=1000000"]), &["train.threads", "cores"]);
}

/// Silently wrong: a checkpoint whose weights hold NaN (with valid checksums) evaluated
/// to NaN without a word.
#[test]
fn nan_weights_in_a_checkpoint_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "2", "--name", "w"]));
    let ck = lethe::checkpoint::Checkpoint::load(&d.join("runs/w")).unwrap();
    let mut tensors = ck.with_prefix("");
    let (name, t) = tensors.iter_mut().find(|(n, _)| n.starts_with("layers.0")).unwrap();
    *t = t.fill(f64::NAN);
    let name = name.clone();
    lethe::checkpoint::save(&d.join("nan.safetensors"), &ck.config, ck.state.as_ref().unwrap(), &tensors).unwrap();
    fails_with(&lethe(d, &["eval", "--checkpoint", "nan.safetensors"]), &["nan.safetensors", &name, "NaN"]);
}

/// Panics: sizes that cannot be allocated made libtorch abort (a span of 10^12 asked
/// for 64 TB). They are refused before anything is allocated or written, naming the
/// field, through train, bench and sweep alike.
#[test]
fn sizes_that_cannot_be_allocated_are_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let huge = "memory.span=1000000000000";
    fails_with(&train(d, &["--steps", "2", "--name", "big", "--set", huge]), &["memory.span", "GiB"]);
    assert!(!d.join("runs").exists(), "a refused run left its folder");
    fails_with(
        &lethe(d, &["bench", "--out", "runs", "--bench-steps", "1", "--mechanism", "expire:1000000000000"]),
        &["memory.span", "GiB"],
    );
    fails_with(
        &lethe(d, &["sweep", "--out", "runs", "--mechanism", "fixed", "--sizes", "1000000000000"]),
        &["memory.span", "GiB"],
    );
    assert!(!d.join("runs").exists(), "a refused sweep wrote its folder");
}

/// Panics: past the size check (which a GPU skips), the position embeddings a huge
/// span asks for are allocated fallibly: libtorch's refusal is an error naming the span.
#[test]
fn a_backbone_too_large_to_allocate_is_an_error() {
    let cfg = lethe::config::Config::preset("copy-tiny").unwrap();
    let mut memory = cfg.memory.clone();
    memory.span = 1_000_000_000_000;
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _seed = lethe::rng::seed_torch(1); // the layers before it draw their initial weights
    let err = lethe::model::Backbone::new(&vs.root(), &cfg.model, &memory, cfg.train.block)
        .err()
        .expect("64 TB cannot be allocated");
    assert!(err.to_string().contains("memory.span = 1000000000000"), "{err}");
}

/// Found by `scripts/hostile.sh`: flags that did nothing, misleading messages, a batch
/// whose streams aborted on allocation, and a locked folder reported as "holds a checkpoint".
#[test]
fn the_campaigns_finds_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "2", "--name", "lm"]));
    // Silently wrong: `--max-tokens 0` scored tokens anyway; `--episodes` was ignored on a language model.
    fails_with(&lethe(d, &["eval", "--checkpoint", "runs/lm", "--max-tokens", "0"]), &["--max-tokens"]);
    fails_with(&lethe(d, &["eval", "--checkpoint", "runs/lm", "--episodes", "3"]), &["--episodes", "gridworld"]);
    // Panic: the streams of a huge batch aborted the process before the size check ran.
    fails_with(
        &train(d, &["--steps", "2", "--name", "wide", "--set", "train.batch=1000000000"]),
        &["train.batch", "GiB"],
    );
    fails_with(&lethe(d, &["eval", "--checkpoint", "runs/lm", "--batch", "1000000000"]), &["--batch", "GiB"]);
    // Misleading: resuming a run that does not exist named a missing config.toml.
    fails_with(&train(d, &["--steps", "2", "--name", "nosuch", "--resume"]), &["no run to resume", "runs/nosuch"]);
    // Misleading: a second training on a busy folder that already held a checkpoint was
    // told to pass --resume, which the lock then refused.
    let lock = std::fs::OpenOptions::new().write(true).open(d.join("runs/lm/.lethe.lock")).unwrap();
    lock.lock().unwrap();
    fails_with(&train(d, &["--steps", "4", "--name", "lm"]), &["in use by another training"]);
    lock.unlock().unwrap();
    // An unwritable --out names the run folder it could not create.
    let mut args = vec!["train", "--quiet", "--steps", "2", "--out", "/proc/lethe-none"];
    args.extend_from_slice(TINY);
    fails_with(&lethe(d, &args), &["cannot create the run folder", "/proc/lethe-none"]);
}

/// Found by `scripts/hostile.sh`: a gridworld agent's checkpoint given to `generate`
/// failed on a missing parameter, and `eval` ignored the token-stream flags for it.
#[test]
fn an_agent_checkpoint_is_named_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args =
        vec!["train", "--quiet", "--out", "runs", "--steps", "1", "--name", "rl", "--preset", "corridor-small"];
    args.extend(sets(&[SMALL_MODEL, &["rl.eval_episodes=2"]].concat()));
    succeeds(&lethe(d, &args));
    fails_with(
        &lethe(d, &["generate", "--checkpoint", "runs/rl", "--prompt", "a"]),
        &["gridworld agent", "corridor", "lethe play"],
    );
    for flag in [["--block", "8"], ["--split", "test"], ["--max-tokens", "5"]] {
        fails_with(&lethe(d, &["eval", "--checkpoint", "runs/rl", flag[0], flag[1]]), &[flag[0], "gridworld agent"]);
    }
    fails_with(&lethe(d, &["play", "--preset", "copy-tiny"]), &["data.source is `copy`"]);
}

/// Found by hand: `lethe eval … | head` panicked ("failed printing to stdout: Broken
/// pipe") once the reader had gone. A closed pipe now ends the command as it ends any
/// Unix filter: by SIGPIPE, with nothing on stderr.
#[test]
fn a_reader_that_stops_early_gets_no_panic() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    // The pipe's reading end is closed before the command starts, so its first print fails.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lethe"))
        .current_dir(dir.path())
        .args(["train", "--list-presets"])
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "status {:?}; stderr:\n{stderr}", out.status);
}

/// Found by `scripts/hostile.sh` on the options of GPT-2 and tokenised corpora: `--set
/// data.tokenizer` was an "unknown config field" (an unset option has no table entry);
/// a non-UTF-8 corpus was tokenised with its bytes replaced; a huge `model.positions`
/// was blamed on `memory.span`; a missing `--init-from` was "cannot read".
#[test]
fn the_gpt2_campaigns_finds_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fixture = format!(
        "data.tokenizer={}",
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-tiny").display()
    );
    fails_with(&train(d, &["--steps", "1", "--set", &fixture]), &["data.tokenizer", "copy"]);
    std::fs::create_dir(d.join("wt")).unwrap();
    for split in ["train", "valid", "test"] {
        std::fs::write(d.join(format!("wt/wiki.{split}.tokens")), b" = T = \n caf\xe9 au lait \n".repeat(50)).unwrap();
    }
    let gpt2 =
        ["train", "--quiet", "--out", "runs", "-p", "gpt2-tiny", "--steps", "1", "--data", "wt", "--set", &fixture];
    fails_with(&lethe(d, &gpt2), &["wiki.train.tokens", "not UTF-8", "offset 12"]);
    let mut huge = gpt2.to_vec();
    huge.extend(["--set", "model.positions=1000000000000"]);
    fails_with(&lethe(d, &huge), &["model.positions", "GiB"]);
    let mut missing = gpt2.to_vec();
    missing.extend(["--init-from", "nosuch"]);
    fails_with(&lethe(d, &missing), &["nosuch", "does not exist", "--init-from"]);
    assert!(!d.join("runs").exists(), "a refused run wrote {:?}", std::fs::read_dir(d.join("runs")).map(|r| r.count()));
    // Abort: a BPE of 10^9 ids made the trainer ask for 70 GB.
    std::fs::write(d.join("t.txt"), "a b c\n").unwrap();
    fails_with(
        &lethe(d, &["tokenizer", "bpe", "t.txt", "--out", "tok", "--vocab", "1000000000"]),
        &["--vocab 1000000000", "at most"],
    );
    assert!(!d.join("tok").exists());
}

/// Found by `scripts/hostile.sh` on the pretrained-decoder commands: a lethe run or an
/// empty folder given to `--init-from` was named by a missing config.json; a budget or
/// policy given twice was scored twice; `bench --init-from` ignored the training
/// bench's flags and overflowed libtorch on a huge context; a file as `--out` surfaced
/// as an OS error;
/// `chat` talked with a model never trained on dialogues.
#[test]
fn the_decoder_campaigns_finds_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "2", "--name", "lm"]));
    std::fs::create_dir(d.join("empty")).unwrap();
    std::fs::write(d.join("text.txt"), "some text to score, a line of it\n".repeat(20)).unwrap();
    let folder = crate::common::llama::fixture("llama3");
    let folder = folder.to_str().unwrap();
    fails_with(&lethe(d, &["generate", "--init-from", "empty", "--prompt", "a"]), &["`empty`", "no config.json"]);
    fails_with(
        &lethe(d, &["generate", "--init-from", "runs/lm", "--prompt", "a"]),
        &["`runs/lm`", "lethe run folder", "--checkpoint"],
    );
    let sweep = |policies: &str, budgets: &str, out: &str| {
        let args = ["eval", "--init-from", folder, "--data", "text.txt", "--policies", policies, "--budgets", budgets];
        lethe(d, &[&args[..], &["--out", out]].concat())
    };
    fails_with(&sweep("window", "1/2,1/2", "ev"), &["--budgets", "`1/2` is given twice"]);
    fails_with(&sweep("window,h2o,window", "8", "ev"), &["--policies", "`window` is given twice"]);
    fails_with(&sweep("window", "8", "text.txt"), &["--out `text.txt`", "not a folder"]);
    let bench = |extra: &[&str]| lethe(d, &[&["bench", "--init-from", folder][..], extra].concat());
    fails_with(&bench(&["--scale", "span=8,16"]), &["--scale", "training bench"]);
    fails_with(&bench(&["--precision", "f32,f32"]), &["--precision", "`f32` is given twice"]);
    fails_with(
        &bench(&["--contexts", "1152921504606846976"]),
        &["--contexts 1152921504606846976", "full cache", "GiB"],
    );
    fails_with(
        &bench(&["--contexts", "32", "--decode-tokens", "1152921504606846976"]),
        &["--decode-tokens 1152921504606846976", "full cache", "GiB"],
    );
    // A count of tokens past i64::MAX is endless, not a context of nothing (1 + 2^64 - 1
    // had wrapped to 0: "--budget 4 is more than the 0 tokens of context").
    let endless = ["--tokens", "18446744073709551615", "--budget", "4"];
    fails_with(
        &lethe(
            d,
            &[
                &["generate", "--init-from", folder, "--prompt-ids", "1"][..],
                &endless,
                &["--policy", "streaming:sinks=100"],
            ]
            .concat(),
        ),
        &["100 sinks leave no room for a window in a budget of 4"],
    );
    fails_with(&bench(&["--contexts", "32", "--kv", "window@8", "--kv", "window@8"]), &["--kv", "given twice"]);
    fails_with(&bench(&["--contexts", "32", "--out", "text.txt"]), &["--out `text.txt`", "not a folder"]);
    fails_with(&lethe(d, &["dialogue-data", "--out", "text.txt"]), &["text.txt", "is a file"]);
    fails_with(
        &lethe(d, &["chat", "--checkpoint", "runs/lm", "--document", "text.txt"]),
        &["trained on `copy`", "not on dialogues"],
    );
    assert!(!d.join("ev").exists(), "a refused sweep wrote its folder");
    // A tokenised model onto the default preset's copy task, which has symbols of its own.
    fails_with(
        &lethe(d, &["train", "--init-from", folder, "--steps", "1", "--out", "runs", "--name", "t"]),
        &["--init-from", "reads text through the tokenizer", "give --data FILE"],
    );
    // Weights whose header places a tensor past the end of the file.
    std::fs::create_dir(d.join("lies")).unwrap();
    std::fs::copy(std::path::Path::new(folder).join("config.json"), d.join("lies/config.json")).unwrap();
    let header =
        br#"{"model.embed_tokens.weight": {"dtype": "F32", "shape": [320, 32], "data_offsets": [0, 1000000000000]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[0; 100]);
    std::fs::write(d.join("lies/model.safetensors"), bytes).unwrap();
    fails_with(
        &lethe(d, &["generate", "--init-from", "lies", "--prompt-ids", "1"]),
        &["lies/model.safetensors", "shape, type and size disagree"],
    );
    // A config asking for more layers than the weights hold names the weights' file.
    std::fs::create_dir(d.join("deep")).unwrap();
    std::fs::copy(std::path::Path::new(folder).join("model.safetensors"), d.join("deep/model.safetensors")).unwrap();
    let config = std::fs::read_to_string(std::path::Path::new(folder).join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["num_hidden_layers"] = 3.into();
    std::fs::write(d.join("deep/config.json"), config.to_string()).unwrap();
    fails_with(
        &lethe(d, &["generate", "--init-from", "deep", "--prompt-ids", "1"]),
        &["deep/model.safetensors`: has no tensor `model.layers.2.", "which the config asks for"],
    );
    // A pretrained folder without its tokenizer trains on bytes, and says so.
    std::fs::create_dir(d.join("bare")).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(std::path::Path::new(folder).join(file), d.join("bare").join(file)).unwrap();
    }
    let args = ["train", "--init-from", "bare", "--data", "text.txt", "--steps", "1", "--out", "runs", "--name", "b"];
    let sets = ["--set", "train.block=16", "--set", "train.batch=2", "--set", "train.eval_tokens=64"];
    let out = lethe(d, &[&args[..], &sets].concat());
    succeeds(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("note: bare holds no tokenizer") && stderr.contains("read as bytes"), "{stderr}");
}

/// The bytes of every file in a run folder, by name.
fn folder_bytes(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Lost work: a command wrote its output over whatever path it was given, a run's own
/// checkpoint or metrics included, or over its own input, and exited 0. Every output
/// path is checked before any work: never an input, a run's own file, a folder or a
/// device; a new file in a run folder is fine.
#[test]
fn outputs_never_replace_an_input_or_a_runs_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&train(d, &["--steps", "2", "--name", "r"]));
    let run = d.join("runs/r");
    let before = folder_bytes(&run);
    let eval = |path: &str| lethe(d, &["eval", "--checkpoint", "runs/r", "--per-token", path]);
    fails_with(
        &eval("runs/r/checkpoint.safetensors"),
        &["--per-token `runs/r/checkpoint.safetensors`", "is the same file as the input"],
    );
    fails_with(&eval("runs/r/metrics.jsonl"), &["is its metrics log in the run folder", "which only training writes"]);
    fails_with(&eval("runs/r/config.toml"), &["is its config in the run folder"]);
    fails_with(&eval("/dev/null"), &["is a device"]);
    fails_with(&eval("runs"), &["is a folder"]);
    std::fs::write(d.join("words.txt"), "one two three\n").unwrap();
    fails_with(
        &lethe(d, &["tokenizer", "words", "words.txt", "--out", "runs/r", "--overwrite"]),
        &["is its tokenizer in the run folder"],
    );
    std::fs::write(d.join("p.txt"), "a b\n").unwrap();
    std::fs::write(d.join("q.txt"), "a c\n").unwrap();
    fails_with(
        &lethe(d, &["score", "p.txt", "q.txt", "--csv", "p.txt"]),
        &["--csv `p.txt`: is the same file as the input `p.txt`"],
    );
    assert_eq!(std::fs::read(d.join("p.txt")).unwrap(), b"a b\n");
    assert!(before == folder_bytes(&run), "a refused output changed the run folder");
    // A folder that is not a run's but holds a file training writes is not taken over.
    std::fs::create_dir_all(d.join("runs/mine")).unwrap();
    std::fs::write(d.join("runs/mine/config.toml"), "my own notes").unwrap();
    fails_with(
        &train(d, &["--steps", "2", "--name", "mine"]),
        &["`runs/mine` is not a lethe run folder but holds `config.toml`"],
    );
    assert_eq!(std::fs::read(d.join("runs/mine/config.toml")).unwrap(), b"my own notes");
    // A new file beside the run's own is an output like any other.
    succeeds(&eval("runs/r/per-token.csv"));
    assert!(std::fs::read_to_string(run.join("per-token.csv")).unwrap().starts_with("stream,position,target"));
}

/// Lost work: a sweep rerun with other settings retrained its finished runs over the
/// old ones without a word, where `train` asks for --overwrite. Now it refuses before
/// training anything, and retrains with --overwrite.
#[test]
fn a_sweep_rerun_with_other_settings_keeps_its_finished_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sweep = |steps: &str, extra: &[&str]| {
        let mut args = vec!["sweep", "--out", "runs", "--mechanism", "fixed:16", "--steps", steps];
        args.extend_from_slice(TINY);
        args.extend_from_slice(extra);
        lethe(d, &args)
    };
    succeeds(&sweep("2", &[]));
    let checkpoint = d.join("runs/copy-tiny-sweep/runs/fixed-16-s1/checkpoint.safetensors");
    let before = std::fs::read(&checkpoint).unwrap();
    succeeds(&sweep("2", &[])); // the same settings: the finished run is reused
    fails_with(&sweep("3", &[]), &["fixed-16-s1", "already holds a run trained with other settings", "--overwrite"]);
    assert_eq!(std::fs::read(&checkpoint).unwrap(), before, "the refused sweep replaced a finished run");
    succeeds(&sweep("3", &["--overwrite"]));
    assert_ne!(std::fs::read(&checkpoint).unwrap(), before);
}

/// Rewrites the safetensors file `path` without `drop`, keeping its metadata, or with
/// `drop`'s checksum taken out of the metadata too (`unlisted`).
fn without_tensor(path: &std::path::Path, drop: &str, unlisted: bool) {
    use safetensors::tensor::{SafeTensors, TensorView};
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let mut metadata = meta.metadata().clone().unwrap();
    if unlisted {
        let mut sums: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&metadata["checksums"]).unwrap();
        assert!(sums.remove(drop).is_some(), "no checksum of {drop}");
        metadata.insert("checksums".into(), serde_json::Value::Object(sums).to_string());
    }
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView)> = st.tensors().into_iter().filter(|(n, _)| n != drop).collect();
    assert!(kept.len() + 1 == st.names().len(), "no tensor {drop}");
    std::fs::write(path, safetensors::serialize(kept, &Some(metadata)).unwrap()).unwrap();
}

/// Silently wrong: a checkpoint missing one memory tensor resumed as if that layer's
/// memory were empty and trained on to other losses. A tensor its checksums list must
/// be there; and every layer of a memory holds the same tensors.
#[test]
fn a_checkpoint_missing_a_tensor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let two_layers = ["--steps", "4", "--stop-after", "2", "--name", "m", "--set", "model.layers=2"];
    succeeds(&train(d, &two_layers));
    let ckpt = d.join("runs/m/checkpoint.safetensors");
    let whole = std::fs::read(&ckpt).unwrap();
    let resume = ["--steps", "4", "--name", "m", "--resume", "--set", "model.layers=2"];
    without_tensor(&ckpt, "memory.0.layers.1.cache", false);
    fails_with(&train(d, &resume), &["memory.0.layers.1.cache", "listed in its checksums but missing"]);
    std::fs::write(&ckpt, &whole).unwrap();
    without_tensor(&ckpt, "memory.0.layers.1.cache", true);
    fails_with(&train(d, &resume), &["memory state incomplete: layer 1 lacks `cache`, which layer 0 holds"]);
    std::fs::write(&ckpt, &whole).unwrap();
    succeeds(&train(d, &resume));
}

/// Aborts, hangs and overflows: sizes and counts near 2^64 were allocated or looped
/// over. Each is refused before any work, naming what drives it.
#[test]
fn huge_sizes_and_counts_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let huge = "18446744073709551615";
    fails_with(
        &train(d, &["--length", "99999999999", "--name", "a"]),
        &["`data.copy.count_max`", "more than lethe holds"],
    );
    fails_with(
        &train(d, &["--set", "data.copy.eval_tokens=99999999999999", "--name", "a"]),
        &["`data.copy.eval_tokens`"],
    );
    fails_with(
        &lethe(d, &["train", "-p", "collision-tiny", "--length", "999999999999", "--name", "a"]),
        &["`data.collision.steps`"],
    );
    fails_with(
        &lethe(d, &["train", "-p", "portal-small", "--length", "999999999999", "--name", "a"]),
        &["the observation layer", "data.portal.rooms = 999999999999"],
    );
    fails_with(&lethe(d, &["train", "--length", huge, "--name", "a"]), &["--length", "at most"]);
    for (flag, value) in [("--warmup", huge), ("--bench-steps", huge), ("--context", huge)] {
        let mut args = vec!["bench", "--out", "runs", flag, value];
        args.extend_from_slice(TINY);
        fails_with(&lethe(d, &args), &[flag, "at most"]);
    }
    let mut args = vec!["bench", "--out", "runs", "--context", "64", "--scale", "context=64,128"];
    args.extend_from_slice(TINY);
    fails_with(&lethe(d, &args), &["--context 64 and --scale context="]);
    fails_with(
        &train(d, &["--set", "model.layers=100000", "--set", "model.d_model=1024", "--name", "a"]),
        &["the layers' weights", "model.layers = 100000"],
    );
    assert!(!d.join("runs/a").exists(), "a refused run left a folder");
}

/// Hang: `lethe bench` watched for signals only between configs, so a long warm-up
/// ignored SIGTERM. One signal now stops it at the next step.
#[test]
fn one_signal_stops_a_bench_in_its_warm_up() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["bench", "--out", "runs", "--warmup", "10000"];
    args.extend_from_slice(TINY);
    let mut child = spawn(dir.path(), &args);
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap(); // the GEMM rate: the configs come next
    assert!(line.starts_with("matrix multiply"), "{line}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: signals a child process this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted by SIGTERM after 0 of 1 configs") && stderr.contains("Nothing was timed"),
        "{stderr}"
    );
}

/// Silently wrong: settings that make no sense, or flags a command would ignore, are
/// refused, not taken.
#[test]
fn settings_that_would_be_ignored_or_make_no_sense_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails_with(
        &train(d, &["--set", "train.min_lr_ratio=50", "--name", "a"]),
        &["train.min_lr_ratio", "must be in [0, 1]"],
    );
    fails_with(&train(d, &["--set", "train.eps=0", "--name", "a"]), &["train.eps", "positive"]);
    succeeds(&train(d, &["--steps", "2", "--name", "r"]));
    fails_with(
        &train(d, &["--steps", "4", "--name", "r", "--resume", "--init-from", "runs/r"]),
        &["--init-from", "--resume", "give one of them"],
    );
    std::fs::create_dir(d.join("tk")).unwrap();
    std::fs::write(d.join("words.txt"), "one two three\n").unwrap();
    succeeds(&lethe(d, &["tokenizer", "words", "words.txt", "--out", "tk"]));
    fails_with(
        &lethe(d, &["eval", "--checkpoint", "runs/r", "--set", "data.tokenizer=tk"]),
        &["--set data.tokenizer", "trained with"],
    );
    fails_with(
        &lethe(d, &["play", "--checkpoint", "runs/r", "-p", "portal-small"]),
        &["--preset", "with --checkpoint"],
    );
    fails_with(&lethe(d, &["train", "--config", "nowhere.toml", "--set", "model=3"]), &["nowhere.toml"]);
    fails_with(
        &train(d, &["--set", "model=3", "--name", "a"]),
        &["`model`: invalid type: integer `3`, expected a table of fields"],
    );
}

/// Hangs: a FIFO or a device named as an input was read until the kernel killed lethe,
/// or forever. Only regular files are read; the rest are refused by name, unopened.
#[test]
fn devices_and_fifos_are_refused_as_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: makes a FIFO at a path in the test's own folder.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    fails_with(
        &lethe(d, &["train", "-p", "enwik8-tiny", "--data", "/dev/zero", "--name", "a"]),
        &["data `/dev/zero`: is a device, not a regular file"],
    );
    fails_with(
        &lethe(d, &["train", "-p", "enwik8-tiny", "--data", "fifo", "--name", "a"]),
        &["data `fifo`: is a FIFO"],
    );
    fails_with(&lethe(d, &["eval", "--checkpoint", "/dev/urandom"]), &["is a device"]);
    fails_with(&lethe(d, &["train", "--config", "fifo"]), &["is a FIFO"]);
    std::fs::create_dir_all(d.join("books/sub")).unwrap();
    std::fs::write(d.join("books/sub/a.txt"), "some text to read ".repeat(200)).unwrap();
    std::os::unix::fs::symlink("..", d.join("books/sub/loop")).unwrap();
    std::os::unix::fs::symlink("../../fifo", d.join("books/sub/z.txt")).unwrap();
    fails_with(
        &lethe(d, &["train", "-p", "books-tiny", "--data", "books", "--steps", "1", "--name", "b"]),
        &["is a FIFO"],
    );
    // A model folder whose config.json is a FIFO, a device or a folder.
    for (name, target) in [("fifo-hf", d.join("fifo")), ("zero-hf", "/dev/zero".into())] {
        std::fs::create_dir(d.join(name)).unwrap();
        std::os::unix::fs::symlink(target, d.join(name).join("config.json")).unwrap();
    }
    std::fs::create_dir_all(d.join("dir-hf/config.json")).unwrap();
    for (folder, what) in [("fifo-hf", "is a FIFO"), ("zero-hf", "is a device"), ("dir-hf", "is a folder")] {
        let named = format!("{folder}/config.json`: {what}");
        fails_with(&lethe(d, &["train", "--init-from", folder, "--steps", "1", "--name", "c"]), &[&named]);
        fails_with(&lethe(d, &["generate", "--init-from", folder, "--prompt-ids", "1", "--tokens", "1"]), &[&named]);
    }
    // A model folder whose tokenizer.json is a FIFO.
    let model = crate::common::llama::fixture("llama3");
    std::fs::create_dir(d.join("tok-hf")).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::os::unix::fs::symlink(model.join(file), d.join("tok-hf").join(file)).unwrap();
    }
    std::os::unix::fs::symlink(d.join("fifo"), d.join("tok-hf/tokenizer.json")).unwrap();
    let named = ["tok-hf/tokenizer.json`: is a FIFO"];
    fails_with(&lethe(d, &["generate", "--init-from", "tok-hf", "--prompt", "hi", "--tokens", "1"]), &named);
    fails_with(&lethe(d, &["eval", "--init-from", "tok-hf", "--data", "books/sub/a.txt"]), &named);
}

/// `memory.expire.target` where it cannot steer anything: with no starting `alpha`, or
/// on an agent's run (its trainer sets `alpha` itself). One line naming the field, and
/// no run folder.
#[test]
fn a_memory_target_that_cannot_steer_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let expire = ["--set", "memory.mechanism=\"expire\"", "--set", "memory.expire.target=10"];
    let mut args = vec!["--set", "memory.expire.alpha=0", "--name", "a"];
    args.extend_from_slice(&expire);
    fails_with(&train(d, &args), &["memory.expire.target", "alpha"]);
    let mut args = vec!["train", "-p", "portal-expire-small", "--steps", "1", "--name", "b"];
    args.extend_from_slice(&expire[2..]);
    fails_with(&lethe(d, &args), &["memory.expire.target", "agent"]);
    assert!(!d.join("runs/a").exists() && !d.join("runs/b").exists());
}
