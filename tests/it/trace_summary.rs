//! `scripts/trace-summary.py`, which sums `lethe bench --trace`'s Chrome traces per
//! operation: self times of nested events and backward nodes, on a hand-made trace.

use std::process::Command;

/// Runs the script on `traces` (JSON texts written to files) with `args`.
fn summary(traces: &[&str], args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<String> = traces
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let p = dir.path().join(format!("t{i}.json"));
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        })
        .collect();
    let out =
        Command::new("python3").arg("scripts/trace-summary.py").args(&paths).args(args).output().expect("python3 runs");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn event(name: &str, ts: f64, dur: f64, tid: i64) -> String {
    format!(
        r#"{{"name": "{name}", "ph": "X", "ts": {ts}, "dur": {dur}, "tid": {tid}, "pid": "CPU Functions", "args": {{}}}}"#
    )
}

/// The line of `table` (the text after its title) that ends with `name`.
fn row<'a>(out: &'a str, title: &str, name: &str) -> &'a str {
    let table = out.split(title).nth(1).unwrap_or_else(|| panic!("no table {title} in {out}"));
    table.lines().find(|l| l.ends_with(&format!("  {name}"))).unwrap_or_else(|| panic!("no row {name} in {out}"))
}

/// Nested events: `aten::mm` (1000 us) holds `aten::copy_` (300 us) and, on another
/// thread at the same time, `aten::copy_` runs 200 us alone; a backward node holds an
/// `aten::mm` of 400 us. Self times: mm 700 + 400, copy_ 300 + 200, the node's 100.
#[test]
fn self_times_subtract_the_nested_operations() {
    let trace = format!(
        "[{}]",
        [
            event("aten::mm", 0.0, 1000.0, 1),
            event("aten::copy_", 100.0, 300.0, 1),
            event("aten::copy_", 150.0, 200.0, 2),
            event("autograd::engine::evaluate_function: MmBackward0", 2000.0, 500.0, 1),
            event("aten::mm", 2050.0, 400.0, 1),
        ]
        .join(",")
    );
    let (ok, out) = summary(&[&trace], &["--steps", "2"]);
    assert!(ok, "{out}");
    // Per step (2 steps): mm 1100 / 2 us = 0.550 ms in 1 call a step; copy_ 0.250 ms.
    assert!(row(&out, "self time per operation", "aten::mm").trim_start().starts_with("0.550      1.0"), "{out}");
    assert!(row(&out, "self time per operation", "aten::copy_").trim_start().starts_with("0.250      1.0"), "{out}");
    let node = row(&out, "self time per operation", "autograd::engine::evaluate_function: MmBackward0");
    assert!(node.trim_start().starts_with("0.050"), "{out}");
    // The backward table counts the node with what it called: 500 us over 2 steps.
    assert!(row(&out, "per autograd node", "MmBackward0").trim_start().starts_with("0.250"), "{out}");

    // Two traces: the second's copy_ takes 100 us more, the difference column says so.
    let slower = trace.replace(r#""ts": 150, "dur": 200"#, r#""ts": 150, "dur": 300"#);
    assert_ne!(slower, trace);
    let (ok, out) = summary(&[&trace, &slower], &[]);
    assert!(ok, "{out}");
    assert!(row(&out, "self time per operation", "aten::copy_").trim_start().starts_with("+0.100"), "{out}");
}

/// A file that is not a trace is one readable error, not a Python traceback.
#[test]
fn a_file_that_is_not_a_trace_is_refused_by_name() {
    let (ok, out) = summary(&["{\"name\": 1"], &[]);
    assert!(!ok);
    assert!(out.contains("t0.json: not a readable trace") && !out.contains("Traceback"), "{out}");
    // A trace whose event has a start that is not a number: named, not a traceback.
    let (ok, out) = summary(&[r#"[{"name": "aten::mm", "ph": "X", "ts": "soon", "dur": 3}]"#], &[]);
    assert!(!ok);
    assert!(
        out.contains("t0.json: complete event 0 needs a name, a numeric ts and a numeric dur")
            && !out.contains("Traceback"),
        "{out}"
    );
}
