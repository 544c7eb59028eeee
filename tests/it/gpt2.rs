//! GPT-2 read from the Hugging Face layout into lethe's backbone gives the logits
//! `transformers` gives, with and without an (empty) memory, and its tokenizer the ids
//! Hugging Face `tokenizers` gives: the fixture (tests/fixtures/gpt2-tiny, made by
//! scripts/gpt2-fixture.py) is a tiny random GPT-2 saved by `transformers` with a
//! byte-level BPE trained by `tokenizers`, a batch of ids and the logits computed for it,
//! and a sample text with its ids. The ∞-former and Compressive memories on GPT-2 pass
//! the gradient and state checks they pass on the papers' backbone.

use std::path::{Path, PathBuf};

use lethe::config::{Arch, Config, Mechanism};
use lethe::data::tokenizer::Tokenizer;
use lethe::model::gpt2::{read_weights, Gpt2Config};
use lethe::model::{init, Lm};
use tch::{Device, Kind, Tensor};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-tiny")
}

fn expected() -> (Tensor, Tensor) {
    let mut t: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(fixture().join("expected.safetensors")).unwrap().into_iter().collect();
    (t.remove("ids").unwrap(), t.remove("logits").unwrap())
}

/// The fixture's GPT-2 with `mechanism` (memory.span 0: GPT-2's own block, plus the
/// mechanism's long-term part), its parameters read from the folder.
fn gpt2_with(mechanism: Mechanism, edit: impl Fn(&mut Config)) -> Lm {
    let mut cfg = Config::default();
    init::adopt(&mut cfg, &fixture()).unwrap();
    assert_eq!(cfg.model.arch, Arch::Gpt2);
    cfg.memory.mechanism = mechanism;
    cfg.memory.span = 0;
    cfg.train.block = 8;
    cfg.memory.infinity.basis = 8;
    cfg.memory.infinity.widths = vec![0.1, 0.3];
    cfg.memory.infinity.samples = 16;
    cfg.memory.infinity.bins = 8;
    cfg.memory.infinity.kl_coef = 0.01;
    (cfg.memory.compressive.rate, cfg.memory.compressive.slots) = (2, 4);
    edit(&mut cfg);
    cfg.memory.validate(cfg.train.block, cfg.model.arch).unwrap();
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let loaded = init::load(&lm, &fixture()).unwrap();
    assert_eq!(loaded.copied, 2 + 2 * 16 + 2, "every GPT-2 tensor (q, k, v split) was read");
    assert!(loaded.fresh.iter().all(|n| lethe::model::memory::is_mechanism_parameter(n)), "{:?}", loaded.fresh);
    lm
}

fn logits(lm: &Lm, ids: &Tensor) -> Tensor {
    let mut mem = lm.model.new_memory();
    tch::no_grad(|| lm.model.forward(ids, &mut mem, false)).unwrap().logits
}

#[test]
fn the_logits_match_transformers() {
    let lm = gpt2_with(Mechanism::Fixed, |_| {});
    let (ids, want) = expected();
    let got = logits(&lm, &ids);
    assert_eq!(got.size(), want.size());
    let diff = (&got - &want).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "largest difference {diff}");
    assert!(want.abs().max().double_value(&[]) > 0.1, "the fixture's logits are not trivially small");
}

/// With the memory added but empty (the first block), GPT-2 + memory is GPT-2.
#[test]
fn an_empty_memory_leaves_the_logits_of_gpt2() {
    let (ids, want) = expected();
    for mechanism in [Mechanism::Infinity, Mechanism::Compressive] {
        let lm = gpt2_with(mechanism, |_| {});
        let diff = (&logits(&lm, &ids) - &want).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{mechanism}: largest difference {diff}");
    }
}

#[test]
fn each_position_sees_only_the_past() {
    let lm = gpt2_with(Mechanism::Fixed, |_| {});
    let (ids, _) = expected();
    let full = logits(&lm, &ids);
    let prefix = logits(&lm, &ids.narrow(1, 0, 7));
    let diff = (&full.narrow(1, 0, 7) - &prefix).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "{diff}");
}

/// Blocks of 8 from the fixture's ids: the second block's logits depend on the first
/// through the memory (and only through it: GPT-2's positions restart at each block).
#[test]
fn the_memory_carries_the_previous_block_to_the_next() {
    let (ids, _) = expected();
    for mechanism in [Mechanism::Infinity, Mechanism::Compressive, Mechanism::Fixed] {
        let lm = gpt2_with(mechanism, |c| c.memory.span = if c.memory.mechanism == Mechanism::Fixed { 8 } else { 0 });
        let mut mem = lm.model.new_memory();
        let second = tch::no_grad(|| {
            lm.model.forward(&ids.narrow(1, 0, 8), &mut mem, false).unwrap();
            lm.model.forward(&ids.narrow(1, 8, 8), &mut mem, false).unwrap().logits
        });
        let alone = logits(&lm, &ids.narrow(1, 8, 8));
        let diff = (&second - &alone).abs().max().double_value(&[]);
        assert!(diff > 1e-4, "{mechanism}: the first block changed nothing ({diff})");
    }
}

/// The ∞-former's long-term memory and the Compressive memory on GPT-2: the gradient of
/// the fourth block's loss matches finite differences for the memory's own parameters
/// and GPT-2's, given the memory of the first three blocks of 4. The loss is the task's
/// plus the auxiliary one, except for the Compressive memory's reconstruction loss,
/// which by design (Rae et al., 3.2) reaches only the compressor: its inputs are
/// detached, so a finite difference of another parameter would see it move and the
/// gradient would not.
#[test]
fn gradients_of_the_memories_on_gpt2_match_finite_differences() {
    let seq: Vec<i64> = (0..32).map(|i| (i * 37 + 11) % 300).collect();
    let checks: [(Mechanism, &[&str]); 2] = [
        (
            Mechanism::Infinity,
            &[
                "ltm.mu",
                "ltm.sigma_w",
                "ltm.gate_w",
                "ltm.k",
                "ltm.v",
                "ltm.o",
                "layers.1.attn.q.weight",
                "layers.0.attn.k.bias",
            ],
        ),
        (
            Mechanism::Compressive,
            &["compressive.slot_pe", "compressive.conv_w", "layers.1.attn.v.bias", "positions.weight"],
        ),
    ];
    for (mechanism, names) in checks {
        let mut lm = gpt2_with(mechanism, |c| {
            c.train.block = 4;
            c.memory.compressive.compressor = lethe::config::Compressor::Conv;
        });
        lm.vs.double();
        let state = crate::common::memory_after(&lm, &seq, 3, 4);
        for name in names {
            let with_aux = mechanism == Mechanism::Infinity || name.contains("conv");
            let loss = || {
                let (task, aux) = crate::common::block_losses(&lm, &seq, 3, 4, &state);
                if with_aux {
                    task + aux
                } else {
                    task
                }
            };
            for v in lm.vs.variables().values_mut() {
                v.zero_grad();
            }
            loss().backward();
            let (_, p) = lm
                .named_parameters()
                .into_iter()
                .find(|(n, _)| n.contains(name))
                .unwrap_or_else(|| panic!("no {name}"));
            let grad = p.grad().flatten(0, -1);
            assert!(grad.abs().sum(Kind::Double).double_value(&[]) > 0.0, "{mechanism}: no gradient reached {name}");
            for idx in [0i64, 5] {
                let analytic = grad.double_value(&[idx]);
                let numeric = crate::common::numeric_grad(&p, idx, || loss().double_value(&[]));
                assert!(
                    (analytic - numeric).abs() < 1e-6 + 1e-4 * numeric.abs(),
                    "{mechanism} {name}[{idx}]: {analytic} vs {numeric}"
                );
            }
        }
    }
}

/// A memory saved and restored gives the next block the same logits (exact resume).
#[test]
fn a_saved_memory_on_gpt2_restores_exactly() {
    let seq: Vec<i64> = (0..32).map(|i| (i * 53 + 7) % 300).collect();
    for mechanism in [Mechanism::Infinity, Mechanism::Compressive] {
        let lm = gpt2_with(mechanism, |c| c.train.block = 4);
        let state = crate::common::memory_after(&lm, &seq, 3, 4);
        let x = crate::common::tokens(&seq, 2).narrow(1, 12, 4);
        let run = |state: &[(String, Tensor)]| {
            let mut mem = lm.model.new_memory();
            mem.load_state(state).unwrap();
            tch::no_grad(|| lm.model.forward(&x, &mut mem, false)).unwrap().logits
        };
        let once = run(&state);
        assert!(once.equal(&run(&state)), "{mechanism}");
        let mut straight = lm.model.new_memory();
        let want = tch::no_grad(|| {
            for i in 0..3 {
                lm.model.forward(&crate::common::tokens(&seq, 2).narrow(1, 4 * i, 4), &mut straight, true).unwrap();
            }
            lm.model.forward(&x, &mut straight, false).unwrap().logits
        });
        assert!(once.allclose(&want, 1e-6, 1e-6, false), "{mechanism}: restored differs from straight");
    }
}

/// The ∞-former's memory threshold empties the long-term memory once it has absorbed
/// that many tokens (the official GPT-2 code's `mem_threshold`).
#[test]
fn the_memory_threshold_starts_a_new_long_term_memory() {
    let seq: Vec<i64> = (0..32).map(|i| (i * 29 + 3) % 300).collect();
    let lm = gpt2_with(Mechanism::Infinity, |c| {
        c.train.block = 4;
        c.memory.infinity.threshold = 8;
    });
    let mut mem = lm.model.new_memory();
    let x = crate::common::tokens(&seq, 2);
    let mut absorbed = vec![];
    tch::no_grad(|| {
        for i in 0..6 {
            lm.model.forward(&x.narrow(1, 4 * (i % 4), 4), &mut mem, false).unwrap();
            absorbed.push(mem.reports()[0].extra("ltm_tokens").unwrap());
        }
    });
    // Block i absorbs block i-1's 4 states; at 8 the memory starts again.
    assert_eq!(absorbed, vec![0.0, 4.0, 8.0, 4.0, 8.0, 4.0]);
}

#[test]
fn bad_folders_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = init::Source::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("neither a Hugging Face model folder"), "{err}");
    std::fs::copy(fixture().join("config.json"), dir.path().join("config.json")).unwrap();
    let err = init::Source::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    let text =
        std::fs::read_to_string(fixture().join("config.json")).unwrap().replace("\"n_embd\": 24", "\"n_embd\": 30");
    std::fs::write(dir.path().join("config.json"), text).unwrap();
    std::fs::copy(fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let cfg = Gpt2Config::from_file(&dir.path().join("config.json")).unwrap();
    let err = read_weights(dir.path(), &cfg).err().unwrap().to_string();
    assert!(err.contains("wte.weight") && err.contains("[300, 24]"), "{err}");
    let text = std::fs::read_to_string(fixture().join("config.json")).unwrap().replace("gelu_new", "swish");
    std::fs::write(dir.path().join("config.json"), text).unwrap();
    let err = Gpt2Config::from_file(&dir.path().join("config.json")).err().unwrap().to_string();
    assert!(err.contains("swish") && err.contains("config.json"), "{err}");
    let cfg = Gpt2Config::from_file(&fixture().join("config.json")).unwrap();
    assert_eq!((cfg.n_layer, cfg.n_head, cfg.inner(), cfg.activation_function.as_str()), (2, 3, 96, "gelu_new"));
}

/// The files on the Hugging Face hub for `gpt2` name their tensors without the
/// `transformer.` prefix and carry the causal-mask buffers; both read the same.
#[test]
fn hub_style_names_and_mask_buffers_are_read_alike() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("config.json"), dir.path().join("config.json")).unwrap();
    let mut named: Vec<(String, Tensor)> = Tensor::read_safetensors(fixture().join("model.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n.trim_start_matches("transformer.").to_string(), t))
        .collect();
    named.push(("h.0.attn.bias".into(), Tensor::ones([1, 1, 32, 32], (tch::Kind::Float, Device::Cpu)).tril(0)));
    Tensor::write_safetensors(&named, dir.path().join("model.safetensors")).unwrap();
    let cfg = Gpt2Config::from_file(&fixture().join("config.json")).unwrap();
    let theirs: std::collections::HashMap<String, Tensor> =
        read_weights(dir.path(), &cfg).unwrap().into_iter().collect();
    let ours = read_weights(&fixture(), &cfg).unwrap();
    assert_eq!(theirs.len(), ours.len());
    for (name, t) in &ours {
        assert!(theirs[name].equal(t), "{name}");
    }
}

#[test]
fn a_tensor_gpt2_does_not_have_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("config.json"), dir.path().join("config.json")).unwrap();
    let mut named = Tensor::read_safetensors(fixture().join("model.safetensors")).unwrap();
    named.push(("transformer.h.0.attn.q_norm.weight".into(), Tensor::ones([24], (tch::Kind::Float, Device::Cpu))));
    Tensor::write_safetensors(&named, dir.path().join("model.safetensors")).unwrap();
    let cfg = Gpt2Config::from_file(&fixture().join("config.json")).unwrap();
    let err = read_weights(dir.path(), &cfg).err().unwrap().to_string();
    assert!(err.contains("h.0.attn.q_norm.weight") && err.contains("another architecture"), "{err}");
}

fn sample() -> (String, Vec<u32>) {
    let text = std::fs::read_to_string(fixture().join("sample.txt")).unwrap();
    let ids: Vec<i64> = Tensor::read_safetensors(fixture().join("expected.safetensors"))
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == "sample_ids")
        .map(|(_, t)| Vec::try_from(&t).unwrap())
        .unwrap();
    (text, ids.into_iter().map(|i| i as u32).collect())
}

#[test]
fn the_tokenizer_gives_the_ids_of_hugging_face_tokenizers_and_round_trips() {
    let (text, want) = sample();
    let tokenizer = Tokenizer::from_dir(&fixture()).unwrap();
    assert_eq!(tokenizer.vocab_size(), 300);
    let ids = tokenizer.encode(&text).unwrap();
    assert_eq!(ids, want);
    assert_eq!(tokenizer.decode(&ids).unwrap(), text);
    assert!(ids.len() < text.len(), "merges were applied: {} ids for {} bytes", ids.len(), text.len());
}

#[test]
fn the_older_vocab_and_merges_pair_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["vocab.json", "merges.txt"] {
        std::fs::copy(fixture().join(f), dir.path().join(f)).unwrap();
    }
    let (text, want) = sample();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.encode(&text).unwrap(), want);
    assert_eq!(tokenizer.decode(&want).unwrap(), text);
}

#[test]
fn a_folder_without_a_tokenizer_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_dir(dir.path()).err().unwrap().to_string();
    assert!(err.contains("neither tokenizer.json nor vocab.json"), "{err}");
    std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
    let err = Tokenizer::from_dir(dir.path()).err().unwrap().to_string();
    assert!(err.contains("tokenizer.json") && err.contains("not a tokenizer"), "{err}");
}

#[test]
fn the_model_reads_the_tokenizers_ids() {
    let (text, _) = sample();
    let tokenizer = Tokenizer::from_dir(&fixture()).unwrap();
    let lm = gpt2_with(Mechanism::Fixed, |_| {});
    let ids: Vec<i64> = tokenizer.encode(&text).unwrap().into_iter().take(32).map(i64::from).collect();
    let out = logits(&lm, &Tensor::from_slice(&ids).unsqueeze(0));
    assert_eq!(out.size(), [1, ids.len() as i64, tokenizer.vocab_size() as i64]);
}

/// Long text is tokenised in pieces cut at line starts; the ids are those of the whole.
#[test]
fn long_text_tokenised_in_pieces_gives_the_ids_of_the_whole() {
    let (text, _) = sample();
    let tokenizer = Tokenizer::from_dir(&fixture()).unwrap();
    let mut long = String::new();
    let mut i = 0;
    while long.len() < 3 << 20 {
        long.push_str(&text);
        long.push_str(["\n", "\n\n", " = = Heading = = \n\n", "\n  two spaces\n", ""][i % 5]);
        i += 1;
    }
    assert!(lethe::data::text::chunks(&long).len() >= 3);
    assert_eq!(lethe::data::text::encode_long(&tokenizer, &long).unwrap(), tokenizer.encode(&long).unwrap());
}

/// Fine-tuning the fixture's GPT-2 with the ∞-former on tokenised text, its memory at 5
/// times the learning rate (two optimiser groups): a run stopped and resumed repeats the
/// losses of a straight run, and the evaluation reports perplexity per word.
#[test]
fn fine_tuning_gpt2_with_two_learning_rates_resumes_exactly() {
    use lethe::config::Source;
    use lethe::train::{train, TrainOptions};
    let data = tempfile::tempdir().unwrap();
    let (sample, _) = sample();
    let text: String = (0..120).map(|i| format!("line {i}: {sample}\n")).collect();
    std::fs::write(data.path().join("text.txt"), &text).unwrap();
    let mut cfg = Config::default();
    (cfg.data.source, cfg.data.path) = (Source::File, Some(data.path().join("text.txt")));
    init::adopt(&mut cfg, &fixture()).unwrap();
    assert_eq!(cfg.data.tokenizer.as_deref(), Some(fixture().as_path()), "the folder's tokenizer is adopted");
    cfg.memory.mechanism = Mechanism::Infinity;
    cfg.memory.span = 0;
    let i = &mut cfg.memory.infinity;
    (i.basis, i.widths, i.samples, i.sticky, i.bins) = (8, vec![0.1, 0.3], 16, true, 8);
    (cfg.train.batch, cfg.train.block, cfg.train.steps, cfg.train.warmup) = (2, 16, 6, 0);
    (cfg.train.lr, cfg.train.memory_lr, cfg.train.eval_every, cfg.train.eval_tokens) = (1e-3, 5e-3, 0, 256);
    cfg.validate().unwrap();
    let straight_dir = tempfile::tempdir().unwrap();
    let straight = train(&cfg, &crate::common::quiet(straight_dir.path())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let first = train(&cfg, &TrainOptions { stop_after: Some(3), ..crate::common::quiet(dir.path()) }).unwrap().losses;
    let second = train(&cfg, &TrainOptions { resume: true, ..crate::common::quiet(dir.path()) }).unwrap().losses;
    let resumed: Vec<f64> = first.into_iter().chain(second).collect();
    assert_eq!(straight.losses.len(), 6);
    assert_eq!(straight.losses, resumed);
    let eval = straight.last_eval.unwrap();
    let words = eval.word_ppl.expect("text has words");
    assert!(words > eval.ppl, "a word spans several tokens: {words} vs {}", eval.ppl);
}

/// Generation on GPT-2 (and with the block-wise memories) fills the current block token
/// by token over the memory of the blocks before: at every step its next-token logits
/// are those of the whole sequence read in blocks, as in training. A partial block read
/// to predict must not change the memory, and the positions restart at each block.
#[test]
fn generation_predicts_as_the_sequence_read_in_blocks() {
    use lethe::generate::{Feeding, Generator, Sampling};
    for mechanism in [Mechanism::Fixed, Mechanism::Infinity, Mechanism::Compressive] {
        let lm = gpt2_with(mechanism, |c| c.memory.infinity.threshold = 16);
        assert_eq!(Feeding::of(&lm), Feeding::BlockByBlock);
        let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 300).collect();
        let sampling = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 4 };
        let mut g = Generator::new(&lm, &prompt, &sampling).unwrap();
        let (mut all, mut predicted) = (prompt.clone(), vec![]);
        for _ in 0..22 {
            predicted.push(g.next_logits().shallow_clone());
            all.push(g.next_token().unwrap());
        }
        let ids: Vec<i64> = all.iter().map(|&t| t as i64).collect();
        let mut mem = lm.model.new_memory();
        let read: Vec<Tensor> = ids
            .chunks(8)
            .map(|c| {
                tch::no_grad(|| lm.model.forward(&Tensor::from_slice(c).view([1, -1]), &mut mem, false))
                    .unwrap()
                    .logits
                    .squeeze_dim(0)
            })
            .collect();
        let read = Tensor::cat(&read, 0); // (len, V)
        for (k, p) in predicted.iter().enumerate() {
            let want = read.get(prompt.len() as i64 - 1 + k as i64);
            let diff = (p - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-4, "{mechanism}: step {k}: largest difference {diff}");
        }
        assert!(
            all[prompt.len()..].iter().collect::<std::collections::BTreeSet<_>>().len() > 3,
            "{mechanism}: sampling gave {:?}",
            &all[prompt.len()..]
        );
    }
}

/// Token by token, the text stream prints each character once it is whole: the pieces
/// join to the text, and none holds a replacement character (the sample has 東京 and 🙂,
/// several byte-level tokens each).
#[test]
fn a_text_stream_prints_whole_characters() {
    let (text, ids) = sample();
    let tokenizer = Tokenizer::from_dir(&fixture()).unwrap();
    let mut stream = lethe::data::tokenizer::TextStream::new(&tokenizer);
    let mut pieces: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    pieces.push(stream.finish().unwrap());
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert!(pieces.iter().filter(|p| p.is_empty()).count() >= 2, "some ids waited for the rest of their character");
    assert_eq!(pieces.concat(), text);
}

/// `lethe generate` on a GPT-2 run prints text through the run's tokenizer, which the run
/// folder keeps: the run still generates when moved away from the tokenizer it named.
#[test]
fn generate_prints_text_from_a_run_that_moved() {
    use crate::common::cli::{lethe, sets, succeeds, SMALL_MODEL};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("text.txt"), "the memory keeps what matters, and forgets the rest.\n".repeat(40)).unwrap();
    std::fs::create_dir(d.join("tok")).unwrap();
    std::fs::copy(fixture().join("tokenizer.json"), d.join("tok/tokenizer.json")).unwrap();
    let mut args = vec!["train", "--quiet", "--out", "runs", "--name", "g", "-p", "gpt2-tiny-infinity"];
    args.extend(["--steps", "2", "--data", "text.txt"]);
    args.extend(sets(&[SMALL_MODEL, &["data.tokenizer=tok", "train.batch=2", "train.block=8"]].concat()));
    args.extend(sets(&["memory.infinity.threshold=32"]));
    succeeds(&lethe(d, &args));
    assert!(d.join("runs/g/tokenizer.json").is_file());
    std::fs::remove_dir_all(d.join("tok")).unwrap();
    let out = succeeds(&lethe(
        d,
        &["generate", "--checkpoint", "runs/g", "--prompt", "the memory 東京", "--tokens", "30", "--seed", "3"],
    ));
    assert!(out.starts_with("the memory 東京"), "{out}");
    let generated = &out["the memory 東京".len()..];
    assert!(generated.trim_end().chars().count() >= 30, "30 tokens of at least a character each: {generated:?}");
    let again = succeeds(&lethe(
        d,
        &["generate", "--checkpoint", "runs/g", "--prompt", "the memory 東京", "--tokens", "30", "--seed", "3"],
    ));
    assert_eq!(out, again, "the same seed gives the same text");
    // `inspect ltm` reads the text through the tokenizer and draws each token's text.
    let out = succeeds(&lethe(d, &["inspect", "ltm", "--checkpoint", "runs/g", "--text", "text.txt", "--out", "ltm"]));
    let text = std::fs::read_to_string(d.join("text.txt")).unwrap();
    let tokens = lethe::inspect::Text::tokens(&Tokenizer::from_dir(&fixture()).unwrap(), &text).unwrap();
    assert!(out.contains("tokens absorbed"), "{out}");
    assert!(
        tokens.pieces.iter().any(|p| p.chars().count() > 1),
        "the tokenizer merged bytes: {:?}",
        &tokens.pieces[..10]
    );
    let svg = std::fs::read_to_string(d.join("ltm/ltm.svg")).unwrap();
    for piece in tokens.pieces.iter().take(6).filter(|p| p.trim() == p.as_str()) {
        assert!(svg.contains(&format!(">{piece}</text>")), "`{piece}` is not drawn");
    }
}
