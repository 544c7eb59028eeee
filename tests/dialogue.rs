//! Document-grounded dialogue from the command line (∞-former paper §4.3): the generated
//! CMU-DoG-layout data set, training on it, and evaluation that scores the responses
//! and nothing else.

mod common;

use common::cli::{lethe, succeeds};
use lethe::data::dialogue::read_split;
use lethe::data::Split;

/// A 1-layer model of width 16 on the dialogue-tiny preset, for speed.
const SMALL: &[&str] = &["--set", "model.layers=1", "--set", "model.d_model=16", "--set", "model.heads=2", "--set", "model.d_ffn=32", "--set", "train.batch=4"];

fn eval_json(dir: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["eval", "--checkpoint", "runs/dialogue-tiny", "--split", "test", "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&succeeds(&lethe(dir, &args))).expect("eval --json prints JSON")
}

#[test]
fn generated_dialogues_train_and_only_responses_are_scored() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&lethe(d, &["dialogue-data", "--out", "dog", "--conversations", "40", "--seed", "3"]));
    let mut args = vec!["train", "-p", "dialogue-tiny", "--quiet", "--out", "runs", "--data", "dog", "--set", "data.tokenizer=dog/tokenizer", "--steps", "2", "--no-eval"];
    args.extend_from_slice(SMALL);
    succeeds(&lethe(d, &args));

    // The word vocabulary gives one token per word and one per line end, so the scored
    // targets are each response's words and its end of line: no document, no marker.
    let test = read_split(&d.join("dog"), Split::Test).unwrap();
    let responses: usize = test.iter().flat_map(|c| &c.turns).map(|t| t.text.split_whitespace().count() + 1).sum();
    let with_doc = eval_json(d, &[]);
    assert_eq!(with_doc["tokens"].as_u64(), Some(responses as u64), "{with_doc}");
    // Per word and per token agree for a word vocabulary.
    let (ppl, word_ppl) = (with_doc["ppl"].as_f64().unwrap(), with_doc["word_ppl"].as_f64().unwrap());
    assert!((ppl - word_ppl).abs() < 1e-9 * ppl, "{ppl} {word_ppl}");

    // Without the documents the same targets are scored, with less context.
    let without = eval_json(d, &["--set", "data.dialogue.document=false"]);
    assert_eq!(without["tokens"], with_doc["tokens"]);
    assert_ne!(without["loss"], with_doc["loss"]);
}
