//! The README's quoted figures against what the code prints today. `scripts/docs.sh`
//! regenerates them; these tests fail when the code has changed what it prints and the
//! README was not regenerated.

use crate::common::cli::lethe;

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
/// README's quoted lines and `docs/results/default/default-run.txt` against its output. Only on a machine
/// that rounds as that CPU did (the run's `machine.json` has the fingerprint of
/// `docs/results/default/machine.json`): another CPU's kernels train the same seed to other
/// figures, and this test says so and checks nothing there.
#[test]
#[ignore]
fn the_readme_quotes_what_the_default_run_prints() {
    let dir = tempfile::tempdir().unwrap();
    let out = lethe(dir.path(), &["train", "--overwrite", "--set", "train.threads=2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reference = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/results/default/machine.json"));
    let (here, there) = (numerics(&dir.path().join("runs/copy-tiny/machine.json")), numerics(reference));
    if here != there {
        eprintln!("not checked: this machine rounds differently (numerics {here}) from the one docs/results/default/default-run.txt comes from ({there})");
        return;
    }
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    let printed: Vec<String> = settled(&printed.lines().map(str::to_string).collect::<Vec<_>>());

    let quoted = settled(&quoted_block("What the default run prints"));
    assert!(quoted.len() >= 4, "{quoted:?}");
    for line in &quoted {
        assert!(printed.contains(line), "the README quotes\n  {line}\nbut the default run printed\n  {}\n(run scripts/docs.sh default and update the README)", printed.join("\n  "));
    }
    let kept =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/results/default/default-run.txt")).unwrap();
    assert_eq!(
        settled(&kept.lines().map(str::to_string).collect::<Vec<_>>()),
        printed,
        "docs/results/default/default-run.txt is stale: run scripts/docs.sh default"
    );
}

/// The pages a reader opens: the README, the guide's chapters, the design notes and the
/// results records' own notes.
fn pages() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    for dir in ["docs/guide/src", "docs/design", "docs/results"] {
        markdown_under(&root.join(dir), &mut pages);
    }
    pages
}

fn markdown_under(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    let before = found.len();
    collect_files(dir, found);
    let mut added = found.split_off(before);
    added.retain(|p| p.extension().is_some_and(|e| e == "md"));
    added.sort();
    found.extend(added);
}

/// The targets of a page's Markdown links that point into the repository.
fn local_links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|t| !t.contains("://") && !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// The anchor mdBook and GitHub give a heading: lower case, spaces to dashes, other
/// punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors_of(text: &str) -> Vec<String> {
    text.lines().filter(|l| l.starts_with('#')).map(|l| anchor(l.trim_start_matches('#'))).collect()
}

/// Every link of the README, the guide, the design notes and the records leads to a file
/// that exists, and every `#anchor` to a heading of its page: a renamed chapter or a
/// never-generated figure is a broken link.
#[test]
fn every_page_links_only_to_files_and_headings_that_exist() {
    let pages = pages();
    assert!(pages.len() >= 25, "the guide's pages were not found: {pages:?}");
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for link in local_links(&text) {
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            if !target.exists() {
                broken.push(format!("{}: {link}", page.display()));
            } else if !fragment.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let headings = anchors_of(&std::fs::read_to_string(&target).unwrap());
                if !headings.iter().any(|h| h == fragment) {
                    broken.push(format!("{}: {link} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
}

/// The guide's table of contents names every chapter, and every chapter is in it.
#[test]
fn the_guide_contents_list_every_chapter() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guide/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed = local_links(&summary);
    let mut chapters = Vec::new();
    markdown_under(&src, &mut chapters);
    for chapter in chapters {
        let name = chapter.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        if name != "SUMMARY.md" {
            assert!(listed.contains(&name), "SUMMARY.md does not list {name}");
        }
    }
}

/// The README stays a front page: at most 400 lines, the rest in the guide.
#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 400, "the README has {lines} lines; move the detail into docs/guide");
}

/// The project speaks of itself alone: its pages, scripts, code and tests name no
/// development history (that lives in git and CHANGELOG.md), and its prose dates nothing
/// (dates belong to the results records).
#[test]
fn the_project_speaks_of_itself_alone() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = pages().into_iter().filter(|p| !p.starts_with(root.join("docs/results"))).collect::<Vec<_>>();
    for dir in ["src", "crates", "tests", "scripts", "benches"] {
        collect_files(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for (n, line) in text.lines().enumerate() {
            if names_history(line) || dated(line) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "history or dates outside git, CHANGELOG.md and docs/results:\n{}", found.join("\n"));
}

fn collect_files(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, found);
        } else {
            found.push(path);
        }
    }
}

/// A development history's words: the periods of work by their name, or issues by number.
fn names_history(line: &str) -> bool {
    let lower = line.to_lowercase();
    let by_number = |word: &str| {
        lower.match_indices(word).any(|(i, _)| lower[i + word.len()..].starts_with(|c: char| c.is_ascii_digit()))
    };
    lower.contains(&["ses", "sion"].concat()) || by_number("issue ") || by_number("issue-")
}

/// A calendar date, `YYYY-MM-DD`.
fn dated(line: &str) -> bool {
    line.as_bytes().windows(10).any(|w| {
        w.iter().enumerate().all(|(i, b)| if i == 4 || i == 7 { *b == b'-' } else { b.is_ascii_digit() })
            && w.starts_with(b"20")
    })
}

/// The guide's Config chapter holds the config reference between these lines.
const REFERENCE_START: &str =
    "<!-- the config reference: `lethe train --help-config`, from the fields' doc comments -->";
const REFERENCE_END: &str = "<!-- end of the config reference -->";

/// The guide's config reference is what `--help-config` reads from the code's doc
/// comments, key for key. `LETHE_BLESS=1` writes it there after a change to a field.
#[test]
fn the_guide_s_config_reference_is_the_code_s() {
    let path = std::path::Path::new("docs/guide/src/config.md");
    let page = std::fs::read_to_string(path).unwrap();
    let (Some(start), Some(end)) = (page.find(REFERENCE_START), page.find(REFERENCE_END)) else {
        panic!("{} lacks the markers of the config reference", path.display());
    };
    let table = lethe::config::reference::markdown(&lethe::config::reference::keys().unwrap());
    let written = &page[start + REFERENCE_START.len()..end];
    if written.trim() != table.trim() && std::env::var("LETHE_BLESS").is_ok_and(|v| v == "1") {
        let blessed = format!("{}\n{table}{}", &page[..start + REFERENCE_START.len()], &page[end..]);
        std::fs::write(path, blessed).unwrap();
        return;
    }
    let first = written.trim().lines().zip(table.trim().lines()).find(|(a, b)| a != b);
    assert!(
        written.trim() == table.trim(),
        "the guide's config reference differs from the fields' doc comments (run the test with LETHE_BLESS=1); first difference:\n  guide: {:?}\n  code:  {:?}",
        first.map(|f| f.0),
        first.map(|f| f.1)
    );
}

/// Each crate's versions in a `Cargo.lock`: `name` -> every `version` locked for it.
fn locked(path: &std::path::Path) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut found = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for package in text.split("[[package]]").skip(1) {
        let field = |key: &str| {
            let line = package.lines().find(|l| l.starts_with(&format!("{key} = ")))?;
            Some(line.split('"').nth(1)?.to_string())
        };
        found.entry(field("name").unwrap()).or_default().insert(field("version").unwrap());
    }
    found
}

/// The Python extension builds in the workspace's target folder (scripts/python-test.sh),
/// sharing the dependencies built for the crates; that holds only while its lock file
/// locks every crate the root's locks at the root's versions.
#[test]
fn the_python_crate_locks_the_workspace_s_versions() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let (workspace, python) = (locked(&root.join("Cargo.lock")), locked(&root.join("python/Cargo.lock")));
    assert!(workspace.len() > 100 && python.contains_key("pyo3"), "{} crates, {:?}", workspace.len(), python.keys());
    let apart: Vec<String> = workspace
        .iter()
        .filter_map(|(name, versions)| {
            let theirs = python.get(name)?;
            (!versions.is_subset(theirs)).then(|| format!("{name}: {versions:?} at the root, {theirs:?} in python/"))
        })
        .collect();
    assert!(
        apart.is_empty(),
        "python/Cargo.lock locks other versions (cargo update --manifest-path python/Cargo.toml -p CRATE --precise VERSION):\n{}",
        apart.join("\n")
    );
}
