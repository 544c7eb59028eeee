//! Every refusal speaks the user's language: one `error:` line that names the
//! flag, field or file at fault in the words of the command line and the config (`fixed`,
//! `infinity`, `copy`, `model.d_model`), never Rust's own rendering of a value
//! (`Some(..)`, `Fixed`, `PathBuf`), and no panic. A table of mistakes, each cheap:
//! refused before any training.

use crate::common::cli::{fails_with, lethe, TINY};

/// Rust's `Debug` rendering of lethe's values, which a message must never show.
const DEBUG_LEAKS: &[&str] = &[
    "Some(", "None", "Ok(", "Err(", "PathBuf", "Fixed", "Infinity", "Gpt2", "Lethe ", " Copy", "Corridor", "Sorting",
    "{ ",
];

#[test]
fn refusals_name_what_is_wrong_in_the_users_words() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("text.txt"), "some text\n".repeat(50)).unwrap();
    std::fs::write(d.join("one.txt"), "a line\n").unwrap();
    std::fs::write(d.join("empty.txt"), "").unwrap();
    // Two broken CMU-DoG folders: a conversation that is not JSON, and one naming a
    // document that no WikiData file has.
    for (folder, conversation) in
        [("badjson", "{not json"), ("nodoc", r#"{"docLinkIdx": 9, "history": [{"text": "hi", "uid": "u"}]}"#)]
    {
        std::fs::create_dir_all(d.join(folder).join("WikiData")).unwrap();
        std::fs::create_dir_all(d.join(folder).join("Conversations/train")).unwrap();
        std::fs::write(
            d.join(folder).join("WikiData/m.json"),
            r#"{"0": {"movieName": "M"}, "1": "", "2": "", "3": "", "wikiDocumentIdx": 1}"#,
        )
        .unwrap();
        std::fs::write(d.join(folder).join("Conversations/train/1.json"), conversation).unwrap();
    }
    let train = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<&str> = vec!["train", "--quiet", "--out", "runs", "--steps", "1"];
        args.extend_from_slice(TINY);
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect()
    };
    let plain = |args: &[&str]| -> Vec<String> { args.iter().map(|s| s.to_string()).collect() };
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (train(&["--set", "model.d_model=0"]), vec!["model.d_model"]),
        (train(&["--set", "model.heads=3"]), vec!["model.d_model", "model.heads = 3"]),
        (train(&["--set", "memory.mechanism=lstm"]), vec!["lstm"]),
        (train(&["--set", "train.lr=-1"]), vec!["train.lr"]),
        (train(&["--set", "train.schedule=sideways"]), vec!["sideways"]),
        (train(&["--set", "train.optimizer=sgdx"]), vec!["sgdx"]),
        (train(&["--set", "data.split=[0.5,0.5,0.5]"]), vec!["data.split"]),
        (train(&["--set", "model.cutoffs=[300]"]), vec!["model.cutoffs", "model.vocab = 256"]),
        (train(&["--set", "data.max_documents=3"]), vec!["data.max_documents", "`copy`"]),
        (train(&["--set", "data.tokenizer=tok"]), vec!["data.tokenizer", "copy"]),
        (
            train(&["--set", "memory.infinity.widths=[]", "--set", "memory.mechanism=infinity"]),
            vec!["memory.infinity.widths"],
        ),
        (
            train(&["--set", "model.arch=gpt2", "--set", "memory.mechanism=expire"]),
            vec!["memory.mechanism", "expire", "fixed, compressive or infinity"],
        ),
        (train(&["--set", "nosuch.field=1"]), vec!["nosuch"]),
        (train(&["--name", "never", "--resume"]), vec!["no run to resume", "runs/never"]),
        (train(&["--init-from", "nosuch"]), vec!["nosuch", "does not exist"]),
        (train(&["--data", "missing.txt"]), vec!["missing.txt"]),
        (plain(&["eval", "--checkpoint", "nosuch"]), vec!["nosuch"]),
        (plain(&["generate", "--checkpoint", "nosuch", "--prompt", "a"]), vec!["nosuch"]),
        (plain(&["play", "--preset", "copy-tiny"]), vec!["data.source is `copy`"]),
        (plain(&["inspect", "ltm", "--checkpoint", "nosuch", "--text", "text.txt"]), vec!["nosuch"]),
        (plain(&["plot", "nosuch"]), vec!["nosuch/metrics.jsonl"]),
        (plain(&["plot", "nosuch", "nosuch/"]), vec!["lethe plot: `nosuch/` is given twice"]),
        (plain(&["tokenizer", "bpe", "text.txt", "--out", "tok", "--vocab", "10"]), vec!["--vocab 10"]),
        (plain(&["tokenizer", "words", "missing.txt", "--out", "tok"]), vec!["missing.txt"]),
        (
            plain(&["tokenizer", "words", "text.txt", "--out", "one.txt"]),
            vec!["--out `one.txt`", "is a file, not a folder"],
        ),
        (plain(&["bench", "--mechanism", "lstm"]), vec!["lstm"]),
        (plain(&["sweep", "--sizes", "0"]), vec!["--sizes"]),
        (
            plain(&["dialogue-eval", "--checkpoint", "nosuch", "--max-length", "100000000"]),
            vec!["--max-length 100000000", "at most 4096"],
        ),
        (
            plain(&["export", "--checkpoint", "nosuch", "--out", "text.txt"]),
            vec!["--out `text.txt`: exists already: give a new folder"],
        ),
        (plain(&["score", "text.txt", "missing.txt"]), vec!["missing.txt"]),
        (plain(&["score", "text.txt", "one.txt"]), vec!["text.txt", "50 lines", "one.txt", "has 1"]),
        (plain(&["dialogue-data", "--out", "dog", "--conversations", "5"]), vec!["--conversations", "at least 20"]),
        (
            plain(&["dialogue-data", "--out", "dog", "--conversations", "1000000000"]),
            vec!["--conversations", "at most 1000000"],
        ),
        (train(&["--set", "data.source=dialogue", "--set", "data.path=."]), vec!["WikiData", "CMU-DoG"]),
        (
            train(&["--set", "data.source=dialogue", "--set", "data.path=badjson"]),
            vec!["badjson/Conversations/train/1.json", "not a CMU-DoG JSON file"],
        ),
        (
            train(&["--set", "data.source=dialogue", "--set", "data.path=nodoc"]),
            vec!["nodoc/Conversations/train/1.json", "document 9"],
        ),
        (plain(&["score", "empty.txt", "empty.txt"]), vec!["empty.txt", "no lines"]),
        (
            plain(&["score", "text.txt", "text.txt", "--wordnet", "nowhere"]),
            vec!["--wordnet", "nowhere", "not a folder"],
        ),
        (plain(&["score", "text.txt", "text.txt", "--wordnet", "."]), vec!["--wordnet", "index.noun"]),
        (
            plain(&["dialogue-eval", "--checkpoint", "nosuch", "--decode", "topk"]),
            vec!["--decode topk", "greedy, sample or beam"],
        ),
        (plain(&["dialogue-eval", "--checkpoint", "nosuch", "--decode", "beam", "--beam", "0"]), vec!["--beam 0"]),
        (plain(&["dialogue-eval", "--checkpoint", "nosuch", "--decode", "sample", "--top-p", "0"]), vec!["--top-p 0"]),
        (plain(&["dialogue-eval", "--checkpoint", "nosuch"]), vec!["nosuch"]),
        (plain(&["chat", "--checkpoint", "nosuch", "--document", "missing.txt"]), vec!["missing.txt"]),
        (plain(&["chat", "--checkpoint", "nosuch", "--document", "empty.txt"]), vec!["empty.txt", "no text"]),
        (plain(&["inspect", "ltm", "--checkpoint", "nosuch", "--conversation", "0"]), vec!["nosuch"]),
    ];
    for (args, needles) in &cases {
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = lethe(d, &argv);
        fails_with(&out, needles);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
        for leak in DEBUG_LEAKS {
            assert!(!line.contains(leak), "`lethe {}` shows Rust's `{leak}`: {line}", args.join(" "));
        }
    }
    assert!(!d.join("runs").exists() && !d.join("tok").exists(), "a refused command wrote files");
}
