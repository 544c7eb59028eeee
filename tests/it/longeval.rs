//! `lethe longeval` as a user runs it: a byte model trained for a few steps, scored on
//! passkey and a needle task, the table written and a rerun resuming from it.

use crate::common::cli::{fails_with, lethe, sets, succeeds, SMALL_MODEL};

/// A byte model (enwik8-tiny on a small seeded text) trained for two steps in `dir`.
fn byte_model(dir: &std::path::Path) {
    let text: String =
        (0..400).map(|i| format!("The grass is green {i}. The pass key is {}. ", i * 7919 % 100_000)).collect();
    std::fs::write(dir.join("text.txt"), text).unwrap();
    let args =
        ["train", "-q", "-p", "enwik8-tiny", "--data", "text.txt", "--steps", "2", "--seed", "3", "--out", "runs"];
    let mut args = args.to_vec();
    args.extend(["--name", "m"]);
    args.extend(sets(&[SMALL_MODEL, &["train.eval_tokens=256"]].concat()));
    succeeds(&lethe(dir, &args));
}

fn longeval(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["longeval", "--checkpoint", "runs/m", "--lengths", "400,600", "--depths", "0,100"];
    args.extend_from_slice(&["--samples", "1", "--out", "ev"]);
    args.extend_from_slice(extra);
    lethe(dir, &args)
}

fn rows(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ev/longeval.csv")).unwrap().lines().skip(1).map(str::to_string).collect()
}

#[test]
fn longeval_writes_a_row_per_cell_and_a_rerun_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    byte_model(d);
    let out = longeval(d, &["--suite", "passkey,niah_single_1"]);
    let stdout = succeeds(&out);
    assert!(
        stdout.contains("passkey") && stdout.contains("niah_single_1") && stdout.contains("longeval.json"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(8/8 cells"), "{stderr}");
    assert!(stderr.starts_with("longeval: 8 cells of 1 sample each, up to 600 bytes long, into ev\n"), "{stderr}");
    let table = rows(d);
    assert_eq!(table.len(), 8, "{table:?}");
    assert!(table[0].starts_with("passkey,400,0.0,1,0,"), "{table:?}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("ev/longeval.json")).unwrap()).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 8);
    for task in ["passkey", "niah_single_1"] {
        for ext in ["svg", "png"] {
            assert!(d.join(format!("ev/heatmap-{task}.{ext}")).is_file(), "no heatmap-{task}.{ext}");
        }
    }
    // An interrupted run leaves the cells it finished: a marked row stands for one, and
    // the rerun keeps it rather than evaluating it again.
    let csv = std::fs::read_to_string(d.join("ev/longeval.csv")).unwrap();
    let first = &table[0];
    let fields: Vec<&str> = first.split(',').collect();
    let marked = format!("{},0.125,{}", fields[..5].join(","), fields[6..].join(","));
    let kept: Vec<String> = std::iter::once(csv.lines().next().unwrap().to_string()).chain([marked.clone()]).collect();
    std::fs::write(d.join("ev/longeval.csv"), kept.join("\n") + "\n").unwrap();
    succeeds(&longeval(d, &["--suite", "passkey,niah_single_1"]));
    let table = rows(d);
    assert_eq!(table.len(), 8);
    assert_eq!(table[0], marked, "the finished cell was evaluated again");
    // Another grid into the same folder adds its rows and keeps the first grid's; so
    // does another haystack.
    succeeds(&longeval(d, &["--suite", "passkey", "--seed", "5"]));
    let table = rows(d);
    assert_eq!(table.len(), 8 + 4, "{table:?}");
    assert!(table.contains(&marked));
    succeeds(&longeval(d, &["--suite", "niah_single_2"]));
    succeeds(&longeval(d, &["--suite", "niah_single_2", "--haystack", "digits"]));
    assert_eq!(rows(d).len(), 8 + 4 + 4 + 4, "a cell of the noise haystack was taken for the digits'");
}

/// A folder holding another model's table is refused, the table untouched: a changed
/// checkpoint (the same run trained on) and a table that names no model alike.
#[test]
fn a_rerun_on_another_model_is_refused_and_the_table_kept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    byte_model(d);
    succeeds(&longeval(d, &["--suite", "passkey"]));
    let before = std::fs::read_to_string(d.join("ev/longeval.csv")).unwrap();
    // While another evaluation writes the folder's table, a second one is refused.
    let lock = std::fs::OpenOptions::new().write(true).open(d.join("ev/.longeval.lock")).unwrap();
    lock.lock().unwrap();
    fails_with(&longeval(d, &["--suite", "niah_single_1"]), &["--out `ev`", "another lethe longeval"]);
    lock.unlock().unwrap();
    assert_eq!(std::fs::read_to_string(d.join("ev/longeval.csv")).unwrap(), before);
    let more = ["train", "-q", "--resume", "--out", "runs", "--name", "m", "--steps", "3"];
    succeeds(&lethe(d, &more));
    fails_with(
        &longeval(d, &["--suite", "passkey"]),
        &["ev/longeval.csv", "holds the results of crc32", "another --out"],
    );
    assert_eq!(std::fs::read_to_string(d.join("ev/longeval.csv")).unwrap(), before);
    // A table written before rows named their model (its last two columns dropped).
    let old: Vec<String> = before.lines().map(|l| l.split(',').take(8).collect::<Vec<_>>().join(",")).collect();
    std::fs::write(d.join("ev/longeval.csv"), old.join("\n") + "\n").unwrap();
    fails_with(&longeval(d, &["--suite", "passkey"]), &["a model it does not name"]);
}

/// The tasks without a depth have one cell per length, their depth left empty; several
/// runs side by side each get a folder and share the accuracy-by-length charts.
#[test]
fn depthless_tasks_and_a_comparison_of_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    byte_model(d);
    let grid = ["--suite", "qa4,cwe", "--lengths", "1000,1200", "--depths", "0,50,100", "--samples", "1"];
    let out = lethe(d, &[&["longeval", "--checkpoint", "runs/m", "--out", "ev"], &grid[..]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    succeeds(&out);
    assert!(stderr.contains("(4/4 cells") && stderr.contains("spread"), "{stderr}");
    let table = rows(d);
    assert_eq!(table.len(), 4, "{table:?}");
    assert!(table[0].starts_with("qa4,1000,,1,0,"), "{table:?}");
    assert!(d.join("ev/accuracy.svg").is_file() && d.join("ev/heatmap-cwe.png").is_file());
    // The built-in haystacks by name: the digits one hides niah_single_2's needle among numbers.
    let args =
        ["longeval", "--checkpoint", "runs/m", "--out", "dg", "--suite", "niah_single_2", "--haystack", "digits"];
    succeeds(&lethe(d, &[&args[..], &["--lengths", "600", "--depths", "50", "--samples", "1"]].concat()));
    // The same run given twice is refused, however it is spelled.
    let args = ["longeval", "--checkpoint", "runs/m", "--compare", "./runs/m/checkpoint.safetensors", "--out", "twice"];
    fails_with(
        &lethe(d, &[&args[..], &grid[..]].concat()),
        &["--compare: `./runs/m/checkpoint.safetensors` is given twice"],
    );
    assert!(!d.join("twice").exists());
    // A copy of it in another folder of the same name is a second run, named m-2.
    std::fs::create_dir_all(d.join("copy/m")).unwrap();
    std::fs::copy(d.join("runs/m/checkpoint.safetensors"), d.join("copy/m/checkpoint.safetensors")).unwrap();
    let args = ["longeval", "--checkpoint", "runs/m", "--compare", "copy/m", "--out", "cmp"];
    let stdout = succeeds(&lethe(d, &[&args[..], &grid[..]].concat()));
    assert!(stdout.contains("m-2:"), "{stdout}");
    for file in
        ["m/longeval.csv", "m-2/longeval.csv", "accuracy.svg", "accuracy.png", "accuracy-qa4.svg", "compare.csv"]
    {
        assert!(d.join("cmp").join(file).is_file(), "no {file}");
    }
    let compare = std::fs::read_to_string(d.join("cmp/compare.csv")).unwrap();
    // A row per run, task and length; the same model scores the same twice.
    let lines: Vec<&str> = compare.lines().collect();
    assert_eq!(lines.len(), 1 + 2 * 2 * 2, "{compare}");
    let figures = |line: &str| line.splitn(3, ',').nth(2).unwrap().to_string();
    assert_eq!(figures(lines[1]), figures(lines[5]), "{compare}");
    // A missing run is named before the others are evaluated: nothing is written.
    let args = ["longeval", "--checkpoint", "runs/m", "--compare", "runs/gone", "--out", "cmp2"];
    fails_with(&lethe(d, &[&args[..], &grid[..]].concat()), &["runs/gone", "checkpoint"]);
    assert!(!d.join("cmp2").exists());
}

#[test]
fn longeval_refuses_bad_flags_and_short_lengths_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails_with(
        &lethe(d, &["longeval", "--checkpoint", "x", "--out", "ev", "--suite", "niah_double"]),
        &["niah_double", "niah_multiquery"],
    );
    fails_with(&lethe(d, &["longeval", "--checkpoint", "x", "--out", "ev", "--lengths", "4q"]), &["4q", "`k` is 1024"]);
    fails_with(
        &lethe(d, &["longeval", "--checkpoint", "x", "--out", "ev", "--depths", "50,120"]),
        &["120", "0 to 100"],
    );
    byte_model(d);
    let out = lethe(d, &["longeval", "--checkpoint", "runs/m", "--out", "ev", "--suite", "niah", "--lengths", "100"]);
    fails_with(&out, &["--lengths 100", "the shortest is"]);
    assert!(!d.join("ev").exists(), "a refused grid made its folder");
    fails_with(
        &lethe(d, &["longeval", "--checkpoint", "runs/m", "--out", "ev", "--haystack", "none.txt"]),
        &["none.txt"],
    );
    for samples in ["0", "100001"] {
        let out = lethe(d, &["longeval", "--checkpoint", "runs/m", "--out", "ev", "--samples", samples]);
        fails_with(&out, &[&format!("--samples {samples}"), "from 1 to 100000"]);
    }
    std::fs::write(d.join("file"), "x").unwrap();
    let out =
        lethe(d, &["longeval", "--checkpoint", "runs/m", "--out", "file", "--lengths", "400", "--suite", "passkey"]);
    fails_with(&out, &["--out `file`", "not a folder"]);
}

#[test]
fn the_help_names_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let help = succeeds(&lethe(dir.path(), &["longeval", "--help"]));
    for task in lethe::data::longctx::TASKS {
        assert!(help.contains(task), "--help does not name {task}:\n{help}");
    }
}

/// The suite as a training source: a model trained on it (`longctx-tiny`, shrunk) has
/// its answers scored in training, and `lethe longeval` reads its checkpoint.
#[test]
fn a_model_trained_on_the_suite_is_scored_by_longeval() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = vec!["train", "-q", "-p", "longctx-tiny", "--steps", "2", "--out", "runs", "--name", "m"];
    args.extend(sets(&[SMALL_MODEL, &["data.longctx.eval_tokens=2048", "train.batch=2"]].concat()));
    succeeds(&lethe(d, &args));
    let metrics = std::fs::read_to_string(d.join("runs/m/metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"answer_accuracy\""), "no answer accuracy logged:\n{metrics}");
    let args = ["longeval", "--checkpoint", "runs/m", "--suite", "passkey", "--lengths", "600", "--depths", "50"];
    succeeds(&lethe(d, &[&args[..], &["--samples", "1", "--out", "ev"]].concat()));
    assert_eq!(rows(d).len(), 1);
    let bad = ["train", "-q", "--set", "data.source=longctx", "--set", "data.longctx.tasks=[\"passkey\",\"nope\"]"];
    fails_with(&lethe(d, &bad), &["data.longctx.tasks", "nope"]);
}

/// With `data.tokenizer`, the source's samples and lengths are in its tokens, and
/// `lethe longeval` reads the run's tokenizer to evaluate in the same units.
#[test]
fn a_tokenised_model_is_trained_and_evaluated_in_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text: String =
        (0..300).map(|i| format!("The grass is green. The pass key is {}. ", i * 7919 % 100_000)).collect();
    std::fs::write(d.join("text.txt"), text).unwrap();
    succeeds(&lethe(d, &["tokenizer", "bpe", "text.txt", "--out", "tok", "--vocab", "300"]));
    let mut args = vec!["train", "-q", "-p", "longctx-tiny", "--steps", "2", "--out", "runs", "--name", "m"];
    args.extend([
        "--set",
        "data.tokenizer=tok",
        "--set",
        "model.vocab=300",
        "--set",
        "data.longctx.tasks=[\"passkey\"]",
    ]);
    args.extend(["--set", "data.longctx.lengths=[300]", "--set", "data.longctx.eval_tokens=1024"]);
    args.extend(["--set", "model.layers=1", "--set", "model.d_model=16", "--set", "model.heads=2"]);
    succeeds(&lethe(d, &args));
    let args = ["longeval", "--checkpoint", "runs/m", "--suite", "passkey", "--lengths", "400", "--depths", "50"];
    let stdout = succeeds(&lethe(d, &[&args[..], &["--samples", "1", "--out", "ev"]].concat()));
    assert!(stdout.contains("tokens"), "{stdout}");
    assert_eq!(rows(d).len(), 1);
    // A tokenizer on a task with symbols of its own is still refused.
    let bad = ["train", "-q", "-p", "copy-tiny", "--set", "data.tokenizer=tok"];
    fails_with(&lethe(d, &bad), &["data.tokenizer", "longctx"]);
    // Beside a byte model, its lengths would not compare: refused before either is read.
    std::fs::rename(d.join("runs/m"), d.join("tokenised")).unwrap();
    byte_model(d);
    let mixed =
        ["longeval", "--checkpoint", "tokenised", "--compare", "runs/m", "--suite", "passkey", "--out", "mixed"];
    fails_with(&lethe(d, &mixed), &["--compare: `tokenised` reads tokens and `runs/m` bytes", "do not compare"]);
    assert!(!d.join("mixed").exists());
}

/// `lethe longeval --init-from FOLDER ARGS --out ev` in `dir`, on passkey at 210 and 240
/// tokens, depths 0 and 100, one sample a cell.
fn decoder_longeval(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let folder = crate::common::llama::fixture("smollm2");
    let grid = ["--suite", "passkey", "--lengths", "210,240", "--depths", "0,100", "--samples", "1", "--out", "ev"];
    let head = ["longeval", "--init-from", folder.to_str().unwrap()];
    lethe(dir, &[&head[..], args, &grid[..]].concat())
}

/// The `compare.csv` rows of group `group`: `(length, memory)`.
fn compared(dir: &std::path::Path, group: &str) -> Vec<(usize, f64)> {
    let mut rows = csv::Reader::from_path(dir.join("ev/compare.csv")).unwrap();
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    rows.iter().filter(|r| &r[0] == group).map(|r| (r[3].parse().unwrap(), r[5].parse().unwrap())).collect()
}

/// A pretrained decoder under each policy at each budget, and an Expire-Span run fitted
/// onto it, each into its own folder: the memory held when the answer begins is what the
/// budget says, entries or a share of each sample's length (the full cache: the whole
/// sample), and Expire-Span capped at a budget holds no more than it.
#[test]
fn a_decoder_is_evaluated_under_each_policy_and_budget_beside_a_learned_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let folder = crate::common::llama::fixture("smollm2");
    let sets = ["train.freeze_base=true", "memory.mechanism=\"expire\"", "memory.span=64", "memory.expire.alpha=0.1"];
    crate::common::cli::fine_tune_fixture(d, &folder, "fitted", &sets);
    let args = ["--policies", "full,window,h2o", "--budgets", "1/2,16", "--learned", "runs/fitted"];
    succeeds(&decoder_longeval(d, &args));
    for name in
        ["full", "window-1of2", "window-16", "h2o-1of2", "h2o-16", "fitted-1of2", "fitted-16", "fitted-uncapped"]
    {
        assert!(d.join("ev").join(name).join("longeval.csv").is_file(), "{name}");
    }
    assert_eq!(compared(d, "full"), vec![(210, 210.0), (240, 240.0)]);
    for policy in ["window", "h2o"] {
        assert_eq!(compared(d, &format!("{policy}-16")), vec![(210, 16.0), (240, 16.0)]);
        assert_eq!(compared(d, &format!("{policy}-1of2")), vec![(210, 105.0), (240, 120.0)]);
    }
    for (length, memory) in compared(d, "fitted-16") {
        assert!(memory <= 16.0 && memory > 0.0, "{length}: {memory}");
    }
    for (length, memory) in compared(d, "fitted-1of2") {
        assert!(memory <= length as f64 / 2.0, "{length}: {memory}");
    }
    // A rerun evaluates nothing again: every cell, with the seconds it took, is read
    // back from the tables.
    let table = |name: &str| std::fs::read_to_string(d.join("ev").join(name).join("longeval.csv")).unwrap();
    let before = [table("h2o-16"), table("fitted-1of2")];
    succeeds(&decoder_longeval(d, &args));
    assert_eq!([table("h2o-16"), table("fitted-1of2")], before);
    // The learned run given twice, however spelled, is refused, nothing rewritten.
    let twice = ["--policies", "window", "--budgets", "16", "--learned", "runs/fitted,./runs/fitted/"];
    fails_with(&decoder_longeval(d, &twice), &["--learned: `./runs/fitted/` is given twice"]);
    assert_eq!([table("h2o-16"), table("fitted-1of2")], before);
    // The run beside another model: refused where its shape differs (naming the field),
    // noted where only the folder does (a copy of the same model).
    let other = crate::common::llama::fixture("llama3");
    let grid = ["--suite", "passkey", "--lengths", "210", "--depths", "0", "--samples", "1", "--out", "ev2"];
    let beside = |folder: &str| {
        lethe(d, &[&["longeval", "--init-from", folder, "--learned", "runs/fitted"][..], &grid].concat())
    };
    fails_with(&beside(other.to_str().unwrap()), &["--learned `runs/fitted`", "its model is not", "model."]);
    let copy = d.join("copy");
    std::fs::create_dir(&copy).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(folder.join(file), copy.join(file)).unwrap();
    }
    let out = beside("copy");
    succeeds(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("note: --learned `runs/fitted") && stderr.contains("is compared here with `copy`"),
        "{stderr}"
    );
}

/// `--precision bf16` evaluates the decoder in bfloat16, and its table says so: a rerun
/// in float32 into the same folder is refused rather than resumed from bfloat16's cells,
/// the table kept.
#[test]
fn a_decoder_in_bfloat16_is_evaluated_and_its_table_is_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&decoder_longeval(d, &["--precision", "bf16"]));
    let before = std::fs::read_to_string(d.join("ev/full/longeval.csv")).unwrap();
    assert!(before.lines().skip(1).all(|row| row.contains("in bf16")), "{before}");
    assert_eq!(before.lines().count(), 5, "{before}");
    fails_with(&decoder_longeval(d, &[]), &["longeval.csv", "holds the results of", "in bf16"]);
    assert_eq!(std::fs::read_to_string(d.join("ev/full/longeval.csv")).unwrap(), before);
}

/// What `--init-from` cannot evaluate is refused before anything is written.
#[test]
fn a_decoder_longeval_refuses_what_it_cannot_evaluate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails_with(&decoder_longeval(d, &["--policies", "h2o"]), &["--policies `h2o`", "--budgets"]);
    fails_with(&decoder_longeval(d, &["--policies", "window", "--budgets", "220"]), &["at 210 tokens", "220"]);
    fails_with(&decoder_longeval(d, &["--policies", "lru", "--budgets", "8"]), &["lru", "known policies"]);
    fails_with(&decoder_longeval(d, &["--policies", "window", "--budgets", "0"]), &["--budgets `0`", "at least one"]);
    fails_with(&decoder_longeval(d, &["--learned", "runs/none"]), &["runs/none"]);
    let bare = d.join("bare");
    std::fs::create_dir(&bare).unwrap();
    let folder = crate::common::llama::fixture("smollm2");
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(folder.join(file), bare.join(file)).unwrap();
    }
    let out = lethe(d, &["longeval", "--init-from", "bare", "--out", "ev", "--suite", "passkey", "--lengths", "210"]);
    fails_with(&out, &["bare", "tokenizer.json"]);
    fails_with(&lethe(d, &["longeval", "--checkpoint", "x", "--policies", "h2o", "--out", "ev"]), &["--init-from"]);
    assert!(!d.join("ev").exists(), "a refused evaluation wrote into --out");
}
