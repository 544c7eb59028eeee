//! GPT-2 read from the Hugging Face layout gives the logits `transformers` gives, and its
//! tokenizer the ids Hugging Face `tokenizers` gives: the fixture (tests/fixtures/gpt2-tiny,
//! made by scripts/gpt2-fixture.py) is a tiny random GPT-2 saved by `transformers` with a
//! byte-level BPE trained by `tokenizers`, a batch of ids and the logits computed for it,
//! and a sample text with its ids.

use std::path::{Path, PathBuf};

use lethe::data::tokenizer::Tokenizer;
use lethe::model::gpt2::{Gpt2, Gpt2Config};
use tch::{Device, Tensor};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-tiny")
}

fn expected() -> (Tensor, Tensor) {
    let mut t: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(fixture().join("expected.safetensors")).unwrap().into_iter().collect();
    (t.remove("ids").unwrap(), t.remove("logits").unwrap())
}

#[test]
fn the_logits_match_transformers() {
    let model = Gpt2::load(&fixture(), Device::Cpu).unwrap();
    let (ids, want) = expected();
    let got = tch::no_grad(|| model.forward(&ids)).unwrap();
    assert_eq!(got.size(), want.size());
    let diff = (&got - &want).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "largest difference {diff}");
    assert!(want.abs().max().double_value(&[]) > 0.1, "the fixture's logits are not trivially small");
}

#[test]
fn each_position_sees_only_the_past() {
    let model = Gpt2::load(&fixture(), Device::Cpu).unwrap();
    let (ids, _) = expected();
    let full = tch::no_grad(|| model.forward(&ids)).unwrap();
    let prefix = tch::no_grad(|| model.forward(&ids.narrow(1, 0, 7))).unwrap();
    let diff = (&full.narrow(1, 0, 7) - &prefix).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "{diff}");
}

#[test]
fn bad_folders_and_inputs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = Gpt2::load(dir.path(), Device::Cpu).err().unwrap().to_string();
    assert!(err.contains("config.json"), "{err}");
    std::fs::copy(fixture().join("config.json"), dir.path().join("config.json")).unwrap();
    let err = Gpt2::load(dir.path(), Device::Cpu).err().unwrap().to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    let text = std::fs::read_to_string(fixture().join("config.json")).unwrap().replace("\"n_embd\": 24", "\"n_embd\": 30");
    std::fs::write(dir.path().join("config.json"), text).unwrap();
    std::fs::copy(fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let err = Gpt2::load(dir.path(), Device::Cpu).err().unwrap().to_string();
    assert!(err.contains("wte.weight") && err.contains("[300, 24]"), "{err}");
    let model = Gpt2::load(&fixture(), Device::Cpu).unwrap();
    let too_long = Tensor::zeros([1, 33], (tch::Kind::Int64, Device::Cpu));
    assert!(model.forward(&too_long).err().unwrap().to_string().contains("1 to 32 positions"));
    for bad in [Tensor::from_slice(&[0i64, 300]).unsqueeze(0), Tensor::from_slice(&[-1i64, 3]).unsqueeze(0), Tensor::from_slice(&[1.0f32, 2.0]).unsqueeze(0)] {
        assert!(model.forward(&bad).err().unwrap().to_string().contains("int64 in 0..300"));
    }
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
    let (ids, want) = expected();
    let got = tch::no_grad(|| Gpt2::load(dir.path(), Device::Cpu).unwrap().forward(&ids)).unwrap();
    assert!((&got - &want).abs().max().double_value(&[]) < 1e-5);
}

#[test]
fn a_tensor_gpt2_does_not_have_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("config.json"), dir.path().join("config.json")).unwrap();
    let mut named = Tensor::read_safetensors(fixture().join("model.safetensors")).unwrap();
    named.push(("transformer.h.0.attn.q_norm.weight".into(), Tensor::ones([24], (tch::Kind::Float, Device::Cpu))));
    Tensor::write_safetensors(&named, dir.path().join("model.safetensors")).unwrap();
    let err = Gpt2::load(dir.path(), Device::Cpu).err().unwrap().to_string();
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
    let model = Gpt2::load(&fixture(), Device::Cpu).unwrap();
    let ids: Vec<i64> = tokenizer.encode(&text).unwrap().into_iter().take(32).map(i64::from).collect();
    let logits = tch::no_grad(|| model.forward(&Tensor::from_slice(&ids).unsqueeze(0))).unwrap();
    assert_eq!(logits.size(), [1, ids.len() as i64, tokenizer.vocab_size() as i64]);
}

