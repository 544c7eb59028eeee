//! Document-grounded dialogue from the command line (∞-former paper §4.3): the generated
//! CMU-DoG-layout data set, training on it, and evaluation that scores the responses
//! and nothing else.

use crate::common::cli::{lethe, sets, succeeds, SMALL_MODEL};
use lethe::data::dialogue::read_split;
use lethe::data::Split;

/// A 1-layer model of width 16 on the dialogue-tiny preset, batches of 4, for speed.
fn small() -> Vec<&'static str> {
    sets(&[SMALL_MODEL, &["train.batch=4"]].concat())
}

/// Trains preset `preset` in `dir` on the generated data in `dir/dog` with its word
/// tokenizer (`dog/tokenizer`, found by `--data dog` in place of the preset's
/// `data/dialogue/tokenizer`), into `dir/runs`, without evaluating; `extra` adds arguments.
fn train_on_dog(dir: &std::path::Path, preset: &str, extra: &[&str]) {
    let mut args = vec!["train", "-p", preset, "--quiet", "--out", "runs", "--data", "dog", "--no-eval"];
    args.extend_from_slice(extra);
    succeeds(&lethe(dir, &args));
}

fn eval_json(dir: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["eval", "--checkpoint", "runs/dialogue-tiny-infinity", "--split", "test", "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&succeeds(&lethe(dir, &args))).expect("eval --json prints JSON")
}

#[test]
fn generated_dialogues_train_and_only_responses_are_scored() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&lethe(d, &["dialogue-data", "--out", "dog", "--conversations", "40", "--seed", "3"]));
    train_on_dog(d, "dialogue-tiny-infinity", &[&["--steps", "2"][..], &small()].concat());

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

    // The long-term memory over a test conversation, read as in training (Figure 5).
    let out = succeeds(&lethe(
        d,
        &["inspect", "ltm", "--checkpoint", "runs/dialogue-tiny-infinity", "--conversation", "1", "--out", "ltm"],
    ));
    assert!(out.contains("tokens absorbed"), "{out}");
    assert!(d.join("ltm/ltm.html").is_file());
    crate::common::cli::fails_with(
        &lethe(d, &["inspect", "ltm", "--checkpoint", "runs/dialogue-tiny-infinity", "--conversation", "6"]),
        &["--conversation 6", "6 conversations (0 to 5)"],
    );

    // Two runs side by side (here the same run twice: the two panels are equal).
    let run = "runs/dialogue-tiny-infinity";
    succeeds(&lethe(
        d,
        &["inspect", "ltm", "--checkpoint", run, "--compare", run, "--conversation", "1", "--out", "both"],
    ));
    let svg = std::fs::read_to_string(d.join("both/ltm.svg")).unwrap();
    let panels: Vec<&str> = svg
        .split("<g transform=")
        .skip(1)
        .map(|p| p.split_once('>').unwrap().1.split("</g>").next().unwrap())
        .collect();
    assert_eq!(panels.len(), 2);
    assert!(panels[0] == panels[1], "the same run draws the same panel twice");
    assert_eq!(svg.matches(run).count(), 2, "each panel is named");
    crate::common::cli::fails_with(
        &lethe(d, &["inspect", "spans", "--checkpoint", run, "--compare", run, "--conversation", "1"]),
        &["--compare", "inspect ltm"],
    );
}

/// A byte-level model of 1 layer with a block of 8, randomly initialised, with `mechanism`.
fn byte_model(mechanism: &str) -> lethe::model::Lm {
    let mut cfg = crate::common::tiny_config();
    cfg.train.block = 8;
    cfg = cfg.apply_overrides(&[format!("memory.mechanism={mechanism}")]).unwrap();
    // (No `tch::manual_seed` here: `Lm::new` seeds its own section with `cfg.seed`, and an
    // unlocked reseed could land in another test's initialisation.)
    lethe::model::Lm::new(&cfg, tch::Device::Cpu).unwrap()
}

fn conversation() -> lethe::data::dialogue::Conversation {
    use lethe::data::dialogue::{Conversation, Turn};
    let turns = ["hi", "hello there", "who is it by?", "nora vance", "thanks"];
    Conversation {
        document: "a film by nora vance".into(),
        turns: turns.iter().enumerate().map(|(i, t)| Turn { speaker: i % 2, text: t.to_string() }).collect(),
    }
}

#[test]
fn a_beam_of_one_replies_as_greedy_decoding_and_replying_leaves_the_state_as_it_was() {
    use lethe::dialogue::{reply, Codec, Decoding};
    use lethe::generate::{Generator, Sampling};
    let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 };
    for mechanism in ["fixed", "infinity"] {
        let lm = byte_model(mechanism);
        let codec = Codec::new(None).unwrap();
        let prompt = codec.encode("a film by nora vance\nA: who is it by?\nB:").unwrap();
        let mut g = Generator::new(&lm, &prompt, &greedy).unwrap();
        let before = g.next_logits().copy();
        let a = reply(&mut g, &codec, &Decoding::Sample(greedy.clone()), 12).unwrap();
        let b = reply(&mut g, &codec, &Decoding::Beam { width: 1 }, 12).unwrap();
        assert_eq!(a, b, "{mechanism}");
        assert!(g.next_logits().equal(&before), "{mechanism}: the reply moved the generator");
        // A wider beam finds a reply too, and the generator is still where it was.
        reply(&mut g, &codec, &Decoding::Beam { width: 3 }, 12).unwrap();
        assert!(g.next_logits().equal(&before), "{mechanism}");
    }
}

#[test]
fn every_turn_after_the_history_gets_one_reply_scored_against_it() {
    use lethe::dialogue::{respond_to_split, Codec, Decoding, Options};
    use lethe::generate::Sampling;
    use lethe::textmetrics::Scorer;
    let lm = byte_model("fixed");
    let codec = Codec::new(None).unwrap();
    let sampled = Decoding::Sample(Sampling { temperature: 1.0, top_k: 0, top_p: 0.9, seed: 2 });
    let opts = Options { decoding: sampled, max_length: 6, min_history: 2, with_document: true };
    let convs = [conversation(), conversation()];
    let scorer = Scorer::default();
    let replies = respond_to_split(&lm, &codec, &convs, &opts, &scorer, |_, _| {}).unwrap();
    assert_eq!(
        replies.iter().map(|r| (r.conversation, r.turn)).collect::<Vec<_>>(),
        vec![(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]
    );
    for r in &replies {
        assert_eq!(r.reference, convs[r.conversation].turns[r.turn].text);
        assert!(r.prediction.chars().count() <= 6 && !r.prediction.contains('\n'), "{:?}", r.prediction);
        assert_eq!(r.scores, scorer.score(&r.prediction, &r.reference));
    }
    // The same seed samples the same replies.
    let again = respond_to_split(&lm, &codec, &convs, &opts, &scorer, |_, _| {}).unwrap();
    assert_eq!(
        replies.iter().map(|r| &r.prediction).collect::<Vec<_>>(),
        again.iter().map(|r| &r.prediction).collect::<Vec<_>>()
    );
}

#[test]
fn chat_reads_a_document_and_replies_to_each_line() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&lethe(d, &["dialogue-data", "--out", "dog", "--conversations", "20"]));
    train_on_dog(d, "dialogue-tiny", &[&["--steps", "2"][..], &small()].concat());
    std::fs::write(d.join("doc.txt"), "the quiet road (1990)\nDirector: nora vance\n").unwrap();
    let talk = || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lethe"))
            .current_dir(d)
            .args(["chat", "--checkpoint", "runs/dialogue-tiny", "--document", "doc.txt", "--max-length", "8"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"hi !\n\nwho directed it ?\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let first = talk();
    assert_eq!(first.lines().count(), 2, "one reply per non-empty line: {first:?}");
    assert_eq!(first, talk(), "greedy replies are the same every time");

    // Regression: dialogue-eval read the true responses through the data folder's
    // tokenizer and the replies through the run's own copy; both now use the run's
    // copy, so the evaluation works once the data's tokenizer folder is gone.
    std::fs::remove_dir_all(d.join("dog/tokenizer")).unwrap();
    let out = succeeds(&lethe(
        d,
        &["dialogue-eval", "--checkpoint", "runs/dialogue-tiny", "--conversations", "2", "--max-length", "4"],
    ));
    assert!(out.contains("perplexity of the true responses"), "{out}");
}

/// Share of the replies to "what did the critics say ?" that give the critics' word of
/// the document ("critics called it gripping ."): one of 10 words, drawn per movie, that
/// only the document holds, about 250 words before the question. With `with_document`
/// false the conversations are read without their documents.
fn critics_right(run: &std::path::Path, data: &std::path::Path, with_document: bool) -> (usize, usize) {
    use lethe::dialogue::{respond_to_split, Codec, Decoding, Options};
    use lethe::textmetrics::Scorer;
    let ckpt = lethe::checkpoint::Checkpoint::load(run).unwrap();
    let lm = lethe::model::Lm::from_checkpoint(&ckpt, tch::Device::Cpu).unwrap();
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt).unwrap();
    let codec = Codec::new(tokenizer.as_ref()).unwrap();
    let greedy = Decoding::Sample(lethe::generate::Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 });
    let opts = Options { decoding: greedy, max_length: 8, min_history: 2, with_document };
    let replies = respond_to_split(&lm, &codec, &asked_test(data), &opts, &Scorer::default(), |_, _| {}).unwrap();
    let word = |t: &str| t.split_whitespace().nth(3).map(str::to_string);
    let asked: Vec<_> = replies.iter().filter(|r| r.reference.starts_with("critics called it")).collect();
    (asked.iter().filter(|r| word(&r.prediction) == word(&r.reference)).count(), asked.len())
}

/// The first 120 test conversations that ask for the critics' word.
fn asked_test(data: &std::path::Path) -> Vec<lethe::data::dialogue::Conversation> {
    let mut test = read_split(data, Split::Test).unwrap();
    test.retain(|c| c.turns.iter().any(|t| t.text.starts_with("critics called it")));
    test.truncate(120);
    test
}

/// The fewest words between a critics' word in its document and the question that asks
/// for it, over `conversations`: a lower bound on the tokens between them.
fn fewest_words_back(conversations: &[lethe::data::dialogue::Conversation]) -> usize {
    let words = |t: &str| t.split_whitespace().count();
    conversations
        .iter()
        .map(|c| {
            let (_, after) = c.document.split_once("critics called it").expect("a document with critics");
            let asked = c.turns.iter().position(|t| t.text.starts_with("critics called it")).unwrap();
            words(after) - 1 + c.turns[..asked].iter().map(|t| words(&t.text)).sum::<usize>()
        })
        .min()
        .unwrap()
}

/// The document reaches an answer only through memory once it is out of the window: a
/// word-level model with a memory of 384 words, trained on the generated dialogues,
/// answers the critics' word above chance (1 in 10), which lies more than the preset's
/// window of 64 words before every question; read without the documents, the same model
/// is at chance, so nothing in the dialogue gives the word away. About 6 minutes on 2
/// cores.
#[test]
#[ignore]
fn a_word_only_the_document_holds_is_answered_through_memory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    succeeds(&lethe(d, &["dialogue-data", "--out", "dog", "--conversations", "3000", "--seed", "11"]));
    let back = fewest_words_back(&asked_test(&d.join("dog")));
    assert!(back > 64, "a critics' word {back} words before its question, within dialogue-tiny's window of 64");
    // At lr 2e-3, each conversation starting with an empty memory: 7k steps give 48 of
    // 120 right, 10k give 111, 15k 101 (measured on 2 cores, AMD EPYC).
    let settings = ["--name", "span384", "--set", "memory.span=384", "--set", "train.lr=2e-3", "--seed", "3"];
    train_on_dog(d, "dialogue-tiny", &[settings.as_slice(), &["--steps", "10000"]].concat());
    let run = d.join("runs/span384");
    let (memory, without) = (critics_right(&run, &d.join("dog"), true), critics_right(&run, &d.join("dog"), false));
    eprintln!("the critics' word right: {memory:?} with the documents, {without:?} without; {back}+ words back");
    let share = |(r, n): (usize, usize)| r as f64 / n as f64;
    assert!(memory.1 == 120 && without.1 == memory.1, "{memory:?} {without:?}");
    // Measured on 2 cores (AMD EPYC): 111 of 120 with the documents, 9 of 120 without,
    // the nearest critics' word 160 words back. Chance is 12 of 120 (sd 3), so the
    // figure without documents may stray 2-3 sd above it.
    assert!(share(memory) > 0.35, "with memory: {memory:?} right, chance is 1 in 10");
    assert!(share(without) < 0.25, "without the documents: {without:?} right, chance is 1 in 10");
    assert!(memory.0 >= 2 * without.0, "with {memory:?} against without {without:?}");
}
