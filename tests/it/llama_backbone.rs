//! The Llama family in lethe's trainable backbone (`model.arch = "llama"`): a folder of
//! the fixture (tests/fixtures/llama, made by `transformers`) read with `--init-from`
//! gives `transformers`' logits, in one block and in blocks through the window's memory;
//! a lethe Llama written back as a folder gives the same logits through the decoder that
//! `lethe generate` and `lethe eval` use; the gradients of the pieces lethe composes
//! (RMSNorm, the rotation, grouped keys, the gated MLP) equal finite differences.

use std::path::Path;

use crate::common::llama::{expected, fixture, gap};

use lethe::config::{Arch, Config, Mechanism};
use lethe::model::llama::{layout, KvCache, Llama};
use lethe::model::{init, Lm};
use tch::{Device, Kind, Tensor};

/// The families lethe trains (Mistral's sliding window is read by the decoder only).
const TRAINABLE: [&str; 4] = ["llama3", "smollm2", "qwen2", "qwen3"];

/// The fixture `name` in the backbone, read in blocks of `block` with a window of `span`.
fn backbone(name: &str, block: usize, span: usize) -> Lm {
    let mut cfg = Config::default();
    init::adopt(&mut cfg, &fixture(name)).unwrap();
    assert_eq!(cfg.model.arch, Arch::Llama);
    (cfg.memory.mechanism, cfg.memory.span, cfg.train.block) = (Mechanism::Fixed, span, block);
    cfg.model.validate(false).unwrap();
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let loaded = init::load(&lm, &fixture(name)).unwrap();
    assert!(loaded.fresh.is_empty(), "{name}: left fresh {:?}", loaded.fresh);
    lm
}

/// The logits of `ids` `(b, t)` read in blocks of `block`, the memory carried.
fn logits_in_blocks(lm: &Lm, ids: &Tensor, block: i64) -> Tensor {
    let mut mem = lm.model.new_memory();
    let t = ids.size()[1];
    let parts: Vec<Tensor> = (0..t)
        .step_by(block as usize)
        .map(|s| {
            let ids = ids.narrow(1, s, block.min(t - s));
            tch::no_grad(|| lm.model.forward(&ids, &mut mem, false)).unwrap().logits
        })
        .collect();
    Tensor::cat(&parts, 1)
}

#[test]
fn every_trainable_family_read_into_the_backbone_gives_the_logits_of_transformers() {
    for name in TRAINABLE {
        let want = expected(name);
        let t = want["ids"].size()[1] as usize;
        let scale = want["logits"].abs().max().double_value(&[]);
        let whole = logits_in_blocks(&backbone(name, t, 0), &want["ids"], t as i64);
        let d = gap(&whole, &want["logits"]);
        assert!(d < 1e-5 * scale.max(1.0), "{name}: one block differs from transformers by {d:.2e}");
        // Blocks of 6 with a window that holds the sequence: the rotation at each
        // state's place in the window keeps the distances, so the logits are the same.
        let blocks = logits_in_blocks(&backbone(name, 6, t), &want["ids"], 6);
        let d = gap(&blocks, &want["logits"]);
        assert!(d < 1e-5 * scale.max(1.0), "{name}: blocks of 6 differ from transformers by {d:.2e}");
    }
}

/// A small random Llama of one layer (grouped keys, query and key norms, Llama 3's
/// scaled rotation), `model.arch = "llama"`, reading blocks of 4 with a window of 6.
fn small_llama() -> Config {
    let mut cfg = Config::default();
    cfg.model.arch = Arch::Llama;
    (cfg.model.vocab, cfg.model.layers, cfg.model.d_model, cfg.model.heads, cfg.model.d_ffn) = (20, 1, 16, 4, 24);
    (cfg.model.llama.kv_heads, cfg.model.llama.qk_norm, cfg.model.llama.rope_factor) = (2, true, 8.0);
    cfg.model.llama.rope_original_positions = 4;
    (cfg.memory.span, cfg.train.block) = (6, 4);
    cfg.model.validate(false).unwrap();
    cfg
}

/// With a window shorter than the sequence, each query of a one-layer model sees itself
/// and the `span` positions before it (Transformer-XL's window): its logits
/// are those of the decoder (written as a folder) reading just those tokens.
#[test]
fn a_short_window_sees_exactly_its_span() {
    let _seed = lethe::rng::seed_torch(5);
    let cfg = small_llama();
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let params: std::collections::HashMap<String, Tensor> = lm.named_parameters().into_iter().collect();
    layout::write_folder(&cfg.model, &params, None, &dir.path().join("m")).unwrap();
    let decoder = Llama::load(&dir.path().join("m")).unwrap();
    let ids = Tensor::from_slice(&[3i64, 7, 1, 19, 4, 4, 0, 12, 9, 9, 2, 15, 6, 1, 8, 3]).view([1, 16]);
    let got = logits_in_blocks(&lm, &ids, 4);
    for (block_start, q) in [(8i64, 0i64), (8, 3), (12, 2)] {
        let first = (block_start + q - 6).max(0);
        let seen = ids.narrow(1, first, block_start + q + 1 - first);
        let alone = decoder.forward(&seen, &mut KvCache::default());
        let alone = alone.narrow(1, alone.size()[1] - 1, 1);
        let d = gap(&got.narrow(1, block_start + q, 1), &alone);
        assert!(
            d < 1e-5,
            "query {q} of the block at {block_start}: differs from the decoder over its window by {d:.2e}"
        );
    }
}

/// A Llama written back as a folder reads into lethe's decoder (the one `lethe generate
/// --init-from` uses) with the same logits as the backbone's, and its config.json names
/// the family its settings make.
#[test]
fn a_llama_written_as_a_folder_reads_back_with_the_same_logits() {
    for name in ["llama3", "qwen2", "qwen3"] {
        let want = expected(name);
        let t = want["ids"].size()[1] as usize;
        let lm = backbone(name, t, 0);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("exported");
        let params: std::collections::HashMap<String, Tensor> = lm.named_parameters().into_iter().collect();
        layout::write_folder(&lm.config.model, &params, Some(&fixture(name)), &out).unwrap();
        let decoder = Llama::load(&out).unwrap();
        let got = decoder.forward(&want["ids"], &mut KvCache::default());
        let d = gap(&got, &want["logits"]);
        assert!(d < 1e-5, "{name}: the written folder's logits differ by {d:.2e}");
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        let family = if name == "llama3" { "llama" } else { name };
        assert_eq!(config["model_type"], family);
        assert!(out.join("tokenizer.json").is_file());
        // An existing folder is not written over.
        let again = layout::write_folder(&lm.config.model, &params, None, &out).unwrap_err().to_string();
        assert!(again.contains("exists already"), "{again}");
    }
}

/// The gradient of a loss through a small Llama (grouped keys, query and key norms, the
/// rotation, the gated MLP, RMSNorm) to its input embedding and to a few weights equals
/// central finite differences, in double precision, for the second block read after a
/// window cached from the first (held fixed: Transformer-XL's cache carries no gradient).
#[test]
fn the_llama_layers_gradients_equal_finite_differences() {
    let _seed = lethe::rng::seed_torch(11);
    let mut cfg = small_llama();
    cfg.model.layers = 2;
    let mut lm = Lm::new(&cfg, Device::Cpu).unwrap();
    lm.vs.double();
    let ids = Tensor::from_slice(&[3i64, 7, 1, 19, 4, 4, 0, 12]).view([1, 8]);
    let weights = Tensor::randn([1, 4, 20], (Kind::Double, Device::Cpu));
    let mut first = lm.model.new_memory();
    tch::no_grad(|| lm.model.forward(&ids.narrow(1, 0, 4), &mut first, false)).unwrap();
    let cached = first.state();
    let loss = |lm: &Lm| -> Tensor {
        let mut mem = lm.model.new_memory();
        mem.load_state(&cached).unwrap();
        (lm.model.forward(&ids.narrow(1, 4, 4), &mut mem, true).unwrap().logits * &weights).sum(Kind::Double)
    };
    let params: std::collections::HashMap<String, Tensor> = lm.named_parameters().into_iter().collect();
    let names = ["embed.weight", "layers.0.attn.k.weight", "layers.1.attn.q_norm.weight", "layers.0.ff_gate.weight"];
    let vars: Vec<&Tensor> = names.iter().map(|n| &params[*n]).collect();
    let grads = Tensor::run_backward(&[loss(&lm)], &vars, false, false);
    for ((name, var), grad) in names.iter().zip(&vars).zip(&grads) {
        let flat = var.view([-1]);
        // The embedding's rows of tokens the second block reads (4, 0 and 12); the others'
        // ends and middle.
        let n = flat.size()[0];
        let entries = if *name == "embed.weight" { [4 * 16 + 3, 5, 12 * 16 + 15] } else { [0, n / 2 + 1, n - 1] };
        for i in entries {
            let eps = 1e-6;
            let at = |delta: f64| {
                tch::no_grad(|| {
                    let _ = flat.get(i).f_add_(&Tensor::from(delta)).unwrap();
                });
                let l = tch::no_grad(|| loss(&lm)).double_value(&[]);
                tch::no_grad(|| {
                    let _ = flat.get(i).f_sub_(&Tensor::from(delta)).unwrap();
                });
                l
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            let analytic = grad.view([-1]).double_value(&[i]);
            let tolerance = 1e-6 * (1.0 + numeric.abs());
            assert!(
                (numeric - analytic).abs() < tolerance,
                "{name}[{i}]: {analytic} by autograd, {numeric} by differences"
            );
            assert!(analytic.abs() > 1e-9, "{name}[{i}]: no gradient");
        }
    }
}

fn lethe(dir: &Path, args: &[&str]) -> std::process::Output {
    crate::common::cli::lethe(dir, args)
}

fn said(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The user's path end to end: fine-tune a Llama-family folder with `lethe train
/// --init-from` on a text, write the run back with `lethe export`, and score a text under
/// several policies and budgets with `lethe eval --init-from --policies --budgets`; the
/// exported folder's full-cache perplexity equals the library's over the same windows.
#[test]
fn a_llama_folder_fine_tuned_exported_and_swept_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture("llama3").join("sample.txt")).unwrap().repeat(6);
    std::fs::write(dir.path().join("text.txt"), &text).unwrap();
    let folder = fixture("smollm2");
    let folder = folder.to_str().unwrap();
    let out = lethe(
        dir.path(),
        &[
            "train",
            "--init-from",
            folder,
            "--data",
            "text.txt",
            "--steps",
            "4",
            "--name",
            "ft",
            "--set",
            "train.block=16",
            "--set",
            "train.batch=2",
            "--set",
            "train.eval_every=0",
            "--set",
            "train.eval_tokens=64",
            "--set",
            "memory.span=16",
            "--set",
            "train.warmup=1",
        ],
    );
    let text_said = said(&out);
    assert!(out.status.success(), "{text_said}");
    assert!(text_said.contains("initialised from") && !text_said.contains("start fresh"), "{text_said}");
    let out = lethe(dir.path(), &["export", "--checkpoint", "runs/ft", "--out", "ft-hf"]);
    assert!(out.status.success(), "{}", said(&out));
    let exported = dir.path().join("ft-hf");
    assert!(exported.join("tokenizer.json").is_file());
    // The fine-tuned weights moved away from the folder's.
    let before = Llama::load(&fixture("smollm2")).unwrap();
    let after = Llama::load(&exported).unwrap();
    let ids = expected("smollm2")["ids"].shallow_clone();
    let moved = gap(&before.forward(&ids, &mut KvCache::default()), &after.forward(&ids, &mut KvCache::default()));
    assert!(moved > 1e-4, "fine-tuning left the logits as they were ({moved:.2e})");

    let out = lethe(
        dir.path(),
        &[
            "eval",
            "--init-from",
            "ft-hf",
            "--data",
            "text.txt",
            "--context",
            "24",
            "--max-tokens",
            "96",
            "--policies",
            "window,tova",
            "--budgets",
            "1/2,1/4",
            "--out",
            "sweep",
        ],
    );
    assert!(out.status.success(), "{}", said(&out));
    let mut rows = csv::Reader::from_path(dir.path().join("sweep/budget.csv")).unwrap();
    let rows: Vec<csv::StringRecord> = rows.records().map(|r| r.unwrap()).collect();
    let cells: Vec<(String, String, i64)> =
        rows.iter().map(|r| (r[0].to_string(), r[1].to_string(), r[2].parse().unwrap())).collect();
    let want =
        [("full", "full", 23), ("window", "1/2", 12), ("tova", "1/2", 12), ("window", "1/4", 6), ("tova", "1/4", 6)];
    let want: Vec<(String, String, i64)> = want.iter().map(|(p, b, e)| (p.to_string(), b.to_string(), *e)).collect();
    assert_eq!(cells, want);
    for file in ["budget.md", "budget.svg", "budget.png"] {
        assert!(dir.path().join("sweep").join(file).is_file(), "no {file}");
    }
    // The full cache's perplexity over windows of 24 is the library's.
    let tokenizer = lethe::data::tokenizer::Tokenizer::from_dir(&exported).unwrap();
    let mut ids = tokenizer.encode(&text).unwrap();
    ids.truncate(97);
    let full = lethe::model::kv::Policy::parse("full", None, 24).unwrap();
    let r = lethe::eval::evaluate_decoder_windows(&after, &full, &ids, 512, 24, |_, _| {}).unwrap();
    let csv_ppl: f64 = rows[0][5].parse().unwrap();
    assert!((csv_ppl - r.ppl).abs() < 1e-9 * r.ppl, "{csv_ppl} in budget.csv, {} from the library", r.ppl);
    assert_eq!(r.tokens, 96);
    // The run itself scores the same windows, each one block from an empty memory, as
    // the folder it was written as does with the full cache.
    let args = ["eval", "--checkpoint", "runs/ft", "--data", "text.txt", "--context", "24", "--block", "24"];
    let out = lethe(dir.path(), &[&args[..], &["--max-tokens", "96", "--json"]].concat());
    assert!(out.status.success(), "{}", said(&out));
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run_ppl = run["ppl"].as_f64().unwrap();
    assert!((run_ppl - r.ppl).abs() < 1e-5 * r.ppl, "the run's windows: {run_ppl}, its folder's {}", r.ppl);
    assert_eq!(run["tokens"], 96);
}

/// Bad requests around a Llama run: one line each, nothing written.
#[test]
fn bad_export_and_sweep_requests_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("text.txt"), "a few words of text to score, and a few more words.").unwrap();
    let copy = lethe(dir.path(), &["train", "--steps", "2", "--name", "copy", "--set", "train.eval_every=0"]);
    assert!(copy.status.success(), "{}", said(&copy));
    let folder = fixture("qwen3");
    let folder = folder.to_str().unwrap();
    let mistral = fixture("mistral");
    let sweep = |policies, budgets| {
        let at = ["--policies", policies, "--budgets", budgets, "--out", "s"];
        [&["eval", "--init-from", folder, "--data", "text.txt"][..], &at[..]].concat()
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["export", "--checkpoint", "runs/copy", "--out", "x"], "only a Llama-family model"),
        (vec!["export", "--checkpoint", "nowhere", "--out", "x"], "nowhere"),
        (vec!["eval", "--init-from", folder, "--data", "text.txt", "--context", "1"], "--context must be at least 2"),
        (sweep("window", "0"), "--budgets `0`"),
        (sweep("lru", "1/2"), "--policies `lru`"),
        ([sweep("window", "1/2"), vec!["--block", "0"]].concat(), "--block must be at least 1"),
        (vec!["eval", "--checkpoint", "runs/copy", "--context", "8"], "--context scores a text: give --data"),
        (
            vec!["eval", "--checkpoint", "runs/copy", "--context", "8", "--data", "text.txt", "--split", "test"],
            "--split does not apply with --context",
        ),
        (
            [sweep("window", "1/2"), vec!["--learned", "runs/copy"]].concat(),
            "--learned `runs/copy`: its memory is fixed",
        ),
        (
            [sweep("window", "1/2"), vec!["--learned", "runs/copy,runs/../runs/copy/checkpoint.safetensors"]].concat(),
            "--learned: `runs/../runs/copy/checkpoint.safetensors` is given twice",
        ),
        (
            vec!["train", "--init-from", mistral.to_str().unwrap(), "--data", "text.txt", "--steps", "1"],
            "sliding_window",
        ),
    ];
    for (args, needle) in cases {
        let out = lethe(dir.path(), &args);
        let text = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(text.contains(needle), "{args:?}: {text}");
        assert_eq!(text.trim().lines().count(), 1, "{args:?}: {text}");
        assert!(!dir.path().join("x").exists() && !dir.path().join("s").exists(), "{args:?} wrote a folder");
    }
}
