//! `lethe bench` as a user runs it: one config or several, alone or in turns, with
//! profiles, knobs and training data; its table, JSON and CSV.

use crate::common::cli::{fails_with, lethe, succeeds, TINY};

#[test]
fn bench_reports_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = vec!["bench", "--bench-steps", "2", "--warmup", "1", "--out", "runs"];
    args.extend_from_slice(TINY);
    let out = succeeds(&lethe(d, &args));
    assert!(out.contains("step median") && out.contains("peak RSS"), "{out}");
    let text = std::fs::read_to_string(d.join("runs/copy-tiny/bench.json")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(report["gemm_gflops"].as_f64().unwrap() > 0.0);
    let json = &report["results"][0];
    assert!(json["mfu"].as_f64().unwrap() > 0.0);
    assert_eq!(json["steps"], 2);
    assert_eq!(json["fill_blocks"], 2, "span 16 / block 8");
    assert!(json["median_s"].as_f64().unwrap() > 0.0);
    assert_eq!(json["mem_size"].as_array().unwrap().len(), 1);
    // With a context, that many tokens are streamed first: here through an ∞-former,
    // whose memory is the STM (16) plus its 8 basis functions.
    args.extend_from_slice(&[
        "--context",
        "60",
        "--set",
        "memory.mechanism=infinity",
        "--set",
        "memory.infinity.basis=8",
    ]);
    let out = succeeds(&lethe(d, &args));
    assert!(out.contains("context 64 tokens"), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("runs/copy-tiny/bench.json")).unwrap()).unwrap();
    let json = &report["results"][0];
    assert_eq!(json["fill_blocks"], 8, "60 tokens in blocks of 8");
    assert_eq!(json["mechanism"], "infinity");
    assert_eq!(json["mem_size"][0], 24.0);
}

/// `--profile` times each phase of the step: the table is printed, `bench.json` keeps
/// every phase by its path, the phases of each mechanism's attention sit under
/// "memory attend", a phase holds no more time than its parent, and each is entered
/// once per step (per layer under "layer").
#[test]
fn bench_profile_reports_each_mechanism_s_phases_nested() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: [(&str, &[&str]); 2] = [
        ("fixed", &["keys, values", "positions", "attention"]),
        ("expire", &["spans", "keys, values", "positions", "attention"]),
    ];
    for (mechanism, phases) in cases {
        let mut args = vec![
            "bench",
            "--bench-steps",
            "3",
            "--warmup",
            "1",
            "--profile",
            "--mechanism",
            mechanism,
            "--out",
            "runs",
        ];
        args.extend_from_slice(TINY);
        args.extend_from_slice(&["--set", "model.layers=2"]);
        let out = succeeds(&lethe(d, &args));
        assert!(out.contains("memory attend") && out.contains("optimiser"), "{out}");
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("runs/copy-tiny/bench.json")).unwrap()).unwrap();
        let profile = report["results"][0]["profile"].as_array().unwrap();
        let path_of = |p: &serde_json::Value| {
            p["path"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect::<Vec<_>>()
        };
        let find = |path: &[&str]| {
            profile
                .iter()
                .find(|p| path_of(p) == path)
                .unwrap_or_else(|| panic!("{mechanism}: no phase {path:?} in {profile:?}"))
        };
        let attend = ["step", "forward", "layer", "memory attend"];
        for phase in phases {
            let mut path = attend.to_vec();
            path.push(phase);
            assert_eq!(find(&path)["calls"], 6, "{mechanism}: {phase} once per layer and step");
        }
        assert_eq!(find(&["step"])["calls"], 3);
        assert_eq!(find(&["step", "backward"])["calls"], 3);
        for p in profile {
            let path = path_of(p);
            if path.len() > 1 {
                let parent: Vec<&str> = path[..path.len() - 1].iter().map(String::as_str).collect();
                let seconds = |q: &serde_json::Value| q["seconds"].as_f64().unwrap();
                assert!(seconds(p) <= seconds(find(&parent)), "{mechanism}: {path:?} longer than its parent");
            }
        }
    }
}

#[test]
fn bench_scales_a_knob_for_several_mechanisms_into_a_table_json_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = vec![
        "bench",
        "--bench-steps",
        "1",
        "--warmup",
        "0",
        "--mechanism",
        "fixed",
        "--mechanism",
        "expire",
        "--scale",
        "span=8,16",
    ];
    args.extend_from_slice(TINY);
    let out = succeeds(&lethe(d, &args));
    assert!(out.contains("MFU") && out.contains("span=16"), "{out}");
    let csv = std::fs::read_to_string(d.join("runs/copy-tiny/bench.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 5, "a header and 2 mechanisms x 2 spans: {csv}");
    assert!(
        rows[1].starts_with("copy-tiny,fixed,f32,span,8,8,") && rows[4].starts_with("copy-tiny,expire,f32,span,16,16,"),
        "{csv}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("runs/copy-tiny/bench.json")).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    // A longer span holds more states, which costs more FLOPs.
    assert!(results[1]["flops_per_step"].as_f64() > results[0]["flops_per_step"].as_f64());
    fails_with(&lethe(d, &["bench", "--scale", "width=3"]), &["--scale", "unknown knob"]);
    fails_with(&lethe(d, &["bench", "--mechanism", "lstm"]), &["unknown mechanism `lstm`"]);
}

/// `--rounds`: the configs take turns, round by round; each is timed over all its
/// rounds, and compared with the first config round by round ("vs first").
#[test]
fn bench_in_rounds_times_the_configs_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = vec![
        "bench",
        "--bench-steps",
        "2",
        "--warmup",
        "0",
        "--rounds",
        "3",
        "--profile",
        "--mechanism",
        "fixed:8",
        "--mechanism",
        "expire:16",
    ];
    args.extend_from_slice(TINY);
    let out = lethe(d, &args);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let said: Vec<&str> = stderr.lines().filter(|l| l.starts_with("round ")).collect();
    assert_eq!(said.len(), 3, "{stderr}");
    assert!(said[2].starts_with("round 3 of 3: median ms per step "), "{stderr}");
    assert!(stdout.contains("1.000x the first config over 3 rounds") && stdout.contains("vs first"), "{stdout}");
    let step_rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(step_rows.len(), 2, "{stdout}");
    assert!(step_rows.iter().all(|l| l.ends_with(" 1.0")), "one step call per profiled step: {stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("runs/copy-tiny/bench.json")).unwrap()).unwrap();
    for (i, r) in report["results"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["steps"], 6, "3 rounds of 2");
        let rounds = r["round_medians_s"].as_array().unwrap();
        assert_eq!(rounds.len(), 3);
        // Every round profiles its 2 steps after timing them (before: one profiled step
        // reported as if over the 6 timed ones).
        assert_eq!(r["profile_steps"], 6);
        let step = r["profile"].as_array().unwrap().iter().find(|p| p["path"] == serde_json::json!(["step"])).unwrap();
        assert_eq!(step["calls"], 6);
        assert!(r["peak_rss_mib"].is_null(), "the configs share the process: no peak of their own");
        let relative = r["relative"].as_f64().unwrap();
        if i == 0 {
            assert_eq!(relative, 1.0);
        } else {
            assert!(relative > 0.0 && relative.is_finite());
        }
    }
    let csv = std::fs::read_to_string(d.join("runs/copy-tiny/bench.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains(",rounds,relative,last_loss,"), "{csv}");
    fails_with(&lethe(d, &["bench", "--rounds", "0"]), &["--rounds must be at least 1"]);
    fails_with(&lethe(d, &["bench", "--rounds", "2", "--trace"]), &["not with --rounds"]);
}

/// `--train-data` times steps on the config's own data (the copy task's streams here)
/// instead of random tokens, and `--frozen` leaves the parameters as they are; the report
/// says both. Data that cannot be read is refused by name before anything is written.
#[test]
fn bench_reads_the_training_data_when_asked_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "--bench-steps", "2", "--warmup", "0", "--mechanism", "expire:16"];
        args.extend_from_slice(extra);
        args.extend_from_slice(TINY);
        let out = lethe(d, &args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("runs/copy-tiny/bench.json")).unwrap()).unwrap();
        (String::from_utf8_lossy(&out.stdout).to_string(), report["results"][0].clone())
    };
    let (said, on_data) = bench(&["--train-data", "--frozen"]);
    assert!(said.contains("| training data, parameters frozen"), "{said}");
    assert_eq!(on_data["batches"], "training data");
    assert_eq!(on_data["frozen"], true);
    let (said, random) = bench(&[]);
    assert!(!said.contains("training data") && !said.contains("frozen"), "{said}");
    assert_eq!(random["batches"], "random tokens");
    assert_eq!(random["frozen"], false);
    // Other tokens, another loss (the same steps on random tokens gave the first figure).
    assert_ne!(on_data["last_loss"], random["last_loss"]);
    let missing = d.join("no-such-corpus.txt");
    let out = lethe(
        d,
        &["bench", "-p", "enwik8-tiny", "--train-data", "--data", missing.to_str().unwrap(), "--out", "other"],
    );
    fails_with(&out, &["no-such-corpus.txt"]);
    assert!(!d.join("other").exists(), "nothing is written for a bench that cannot start");
    // Without --train-data the steps read random tokens: a flag choosing the data would
    // be read by nothing (before, a missing corpus was timed as if read).
    for flag in [&["--data", missing.to_str().unwrap()][..], &["--length", "4"], &["--data-seed", "3"]] {
        let out = lethe(d, &[&["bench", "-p", "enwik8-tiny", "--out", "other"][..], flag].concat());
        fails_with(&out, &[flag[0], "only with --train-data"]);
    }
    assert!(!d.join("other").exists());
}

/// A config benched in turns with another trains as it does alone: the same loss after
/// the same steps, bit for bit, dropout on (each bench step seeds libtorch's generator
/// as training does; before, a config drew its dropout from wherever the other config's
/// draws had left the generator).
#[test]
fn a_config_benched_in_turns_trains_as_it_does_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let loss = |extra: &[&str], out: &str| -> Vec<f64> {
        let mut args =
            vec!["bench", "--warmup", "1", "--out", out, "--set", "model.dropout=0.1", "--set", "train.threads=1"];
        args.extend_from_slice(extra);
        args.extend_from_slice(TINY);
        succeeds(&lethe(d, &args));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join(out).join("copy-tiny/bench.json")).unwrap()).unwrap();
        report["results"].as_array().unwrap().iter().map(|r| r["last_loss"].as_f64().unwrap()).collect()
    };
    let turns =
        loss(&["--bench-steps", "1", "--rounds", "2", "--mechanism", "fixed:8", "--mechanism", "expire:16"], "turns");
    let fixed = loss(&["--bench-steps", "2", "--mechanism", "fixed:8"], "fixed");
    let expire = loss(&["--bench-steps", "2", "--mechanism", "expire:16"], "expire");
    assert!(turns.iter().all(|l| l.is_finite() && *l > 0.0), "{turns:?}");
    assert_eq!(turns, [fixed[0], expire[0]]);
}
