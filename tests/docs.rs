//! The README's quoted figures against what the code prints today. `scripts/docs.sh`
//! regenerates them; these tests fail when the code has changed what it prints and the
//! README was not regenerated.

mod common;

use common::cli::lethe;

/// The lines of the README's fenced block that follows `heading`.
fn quoted_block(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let after = &readme[readme.find(heading).unwrap_or_else(|| panic!("no `{heading}` in the README"))..];
    let start = after.find("```\n").unwrap() + 4;
    let len = after[start..].find("```").unwrap();
    after[start..start + len].lines().map(str::to_string).collect()
}

/// The lines whose figures do not depend on the machine's speed: not the progress lines
/// (tokens/s, ETA) nor the README's `...`.
fn settled(lines: &[String]) -> Vec<String> {
    lines.iter().filter(|l| !l.starts_with("step ") && *l != "...").cloned().collect()
}

/// The `numerics` fingerprint of a `machine.json`.
fn numerics(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["numerics"].as_str().unwrap().to_string()
}

/// Trains the default preset as `./run.sh` does, on the reference settings (2 threads, as
/// on the 2-core CPU the README's figures come from), about a minute, and checks the
/// README's quoted lines and `docs/default-run.txt` against its output. Only on a machine
/// that rounds as that CPU did (the run's `machine.json` has the fingerprint of
/// `docs/default-run-machine.json`): another CPU's kernels train the same seed to other
/// figures, and this test says so and checks nothing there.
#[test]
#[ignore]
fn the_readme_quotes_what_the_default_run_prints() {
    let dir = tempfile::tempdir().unwrap();
    let out = lethe(dir.path(), &["train", "--overwrite", "--set", "train.threads=2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reference = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/default-run-machine.json"));
    let (here, there) = (numerics(&dir.path().join("runs/copy-tiny/machine.json")), numerics(reference));
    if here != there {
        eprintln!("not checked: this machine rounds differently (numerics {here}) from the one docs/default-run.txt comes from ({there})");
        return;
    }
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    let printed: Vec<String> = settled(&printed.lines().map(str::to_string).collect::<Vec<_>>());

    let quoted = settled(&quoted_block("What the default run prints"));
    assert!(quoted.len() >= 4, "{quoted:?}");
    for line in &quoted {
        assert!(printed.contains(line), "the README quotes\n  {line}\nbut the default run printed\n  {}\n(run scripts/docs.sh default and update the README)", printed.join("\n  "));
    }
    let kept = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/default-run.txt")).unwrap();
    assert_eq!(
        settled(&kept.lines().map(str::to_string).collect::<Vec<_>>()),
        printed,
        "docs/default-run.txt is stale: run scripts/docs.sh default"
    );
}

/// Every file of the repository that the README links to (`](docs/...)`,
/// `](scripts/...)`) exists: a renamed or never-generated figure is a broken link.
#[test]
fn the_readme_links_only_to_files_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let targets: Vec<&str> = readme
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|t| !t.contains("://") && !t.starts_with('#'))
        .collect();
    assert!(
        targets.iter().filter(|t| t.starts_with("docs/")).count() >= 10,
        "the README's links were not found: {targets:?}"
    );
    let missing: Vec<&&str> =
        targets.iter().filter(|t| !root.join(t.split('#').next().unwrap_or(t)).exists()).collect();
    assert!(missing.is_empty(), "the README links to files that do not exist: {missing:?}");
}
