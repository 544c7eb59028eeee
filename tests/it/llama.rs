//! lethe's Llama-family decoders against Hugging Face `transformers`: the fixture
//! (tests/fixtures/llama, made by scripts/llama-fixture.py) holds one tiny random model of
//! each family saved by `transformers` (Llama 3 with its RoPE scaling, SmolLM2 in
//! bfloat16, Mistral in shards with a sliding window, Qwen2 with its biases, Qwen3 with
//! its query and key norms), a batch of ids and the logits `transformers` computes for
//! them; and a byte-level BPE with Llama 3's pre-tokenizer, a hard sample text and its ids.

use std::path::Path;

use crate::common::llama::{expected, expected_in, fixture, gap, mean_gap};

use lethe::data::tokenizer::Tokenizer;
use lethe::model::llama::{KvCache, Llama};
use tch::Tensor;

const FAMILIES: [&str; 5] = ["llama3", "smollm2", "mistral", "qwen2", "qwen3"];

#[test]
fn the_logits_of_every_family_match_transformers() {
    for name in FAMILIES {
        let model = Llama::load(&fixture(name)).unwrap();
        let want = expected(name);
        let got = model.forward(&want["ids"], &mut KvCache::default());
        let scale = want["logits"].abs().max().double_value(&[]);
        let gap = (&got - &want["logits"]).abs().max().double_value(&[]);
        println!("{name}: largest logit {scale:.3}, difference from transformers {gap:.2e}");
        assert!(scale > 0.5, "{name}: the fixture's logits are not trivially small");
        assert!(gap < 1e-5 * scale.max(1.0), "{name}: logits differ from transformers' by {gap:.2e}");
    }
}

/// Read in bfloat16 or float16, each family computes as `transformers` does in that
/// precision: a prompt under the full cache (libtorch's fused kernel) as its sdpa
/// attention, under a policy that reads the weights (H2O, with a budget that evicts
/// nothing) and token by token as its eager one. Most logits are equal to the bit (a
/// prompt's all of them, on libtorch's CPU kernels); token by token in float16 a few
/// differ by a unit in the last place, so that on average lethe's stay within a quarter
/// of the distance between transformers' half-precision logits and its float32 ones.
#[test]
fn in_half_precision_every_family_computes_as_transformers_does() {
    use lethe::config::train::Precision;
    use lethe::model::kv::{Budget, Policy};
    for name in FAMILIES {
        let want32 = expected(name);
        let ids = &want32["ids"];
        for precision in [Precision::Bf16, Precision::F16] {
            let model = Llama::load_as(&fixture(name), tch::Device::Cpu, precision).unwrap();
            assert_eq!(model.kind(), precision.kind());
            let want = expected_in(name, precision.name());
            let fused = model.forward(ids, &mut KvCache::default());
            assert_eq!(fused.kind(), tch::Kind::Float, "logits are float32");
            let h2o = Policy::parse("h2o", Some(Budget::Entries(64)), 1000).unwrap();
            let written_out = model.forward(ids, &mut KvCache::new(h2o));
            let mut cache = KvCache::default();
            let steps: Vec<Tensor> = (0..20).map(|t| model.forward(&ids.narrow(1, t, 1), &mut cache)).collect();
            let (stepwise, held) = (Tensor::cat(&steps, 1), &cache.layers[0].as_ref().unwrap().keys);
            assert_eq!(held.kind(), precision.kind(), "{name}: the cache is held in {}", precision.name());
            let cases = [
                ("fused", &fused, "logits_sdpa"),
                ("weights", &written_out, "logits"),
                ("stepwise", &stepwise, "logits"),
            ];
            for (how, got, theirs) in cases {
                let rounding = mean_gap(&want[theirs], &want32["logits"]);
                let (off, most) = (mean_gap(got, &want[theirs]), gap(got, &want[theirs]));
                println!("{name} {} {how}: {off:.2e} from transformers on average (at most {most:.2e}), whose own is {rounding:.2e} from f32", precision.name());
                assert!(off < 0.25 * rounding, "{name} in {}, {how}: {off:.2e} from transformers", precision.name());
            }
        }
    }
}

/// Reading the ids a few at a time with the keys and values cached gives the logits of
/// reading them at once (Mistral's sliding window included), step by step.
#[test]
fn decoding_with_the_cache_equals_reading_the_whole_sequence() {
    for name in ["llama3", "mistral", "qwen3"] {
        let model = Llama::load(&fixture(name)).unwrap();
        let ids = expected(name)["ids"].shallow_clone();
        let whole = model.forward(&ids, &mut KvCache::default());
        let mut cache = KvCache::default();
        let mut parts = vec![model.forward(&ids.narrow(1, 0, 7), &mut cache)];
        for t in 7..20 {
            parts.push(model.forward(&ids.narrow(1, t, 1), &mut cache));
        }
        assert_eq!(cache.position, 20);
        let gap = (Tensor::cat(&parts, 1) - &whole).abs().max().double_value(&[]);
        assert!(gap < 1e-5, "{name}: token by token differs from the whole by {gap:.2e}");
    }
}

#[test]
fn the_tokenizer_gives_the_ids_of_hugging_face_tokenizers() {
    let tokenizer = Tokenizer::from_dir(&fixture("llama3")).unwrap();
    let text = std::fs::read_to_string(fixture("llama3").join("sample.txt")).unwrap();
    let ids = tokenizer.encode(&text).unwrap();
    let want = Vec::<i64>::try_from(&expected("llama3")["sample_ids"]).unwrap();
    assert_eq!(ids.iter().map(|&i| i as i64).collect::<Vec<_>>(), want);
    assert_eq!(tokenizer.decode(&ids).unwrap(), text);
    // A long text, in lines and on one line, tokenised in pieces reads as it does whole.
    let long = format!("{text}\n").repeat(2_300_000 / text.len());
    for long in [long.clone(), long.replace('\n', " ")] {
        assert!(lethe::data::text::chunks(&long).len() >= 2);
        assert_eq!(lethe::data::text::encode_long(&tokenizer, &long).unwrap(), tokenizer.encode(&long).unwrap());
    }
}

/// A folder that is not what its files say is refused with one line naming the file:
/// a missing shard, a shard without a tensor its index places there, a shape that does
/// not match the config, a tensor no Llama has, a missing weight.
#[test]
fn bad_folders_are_refused_by_name() {
    let copy = |from: &str| {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(fixture(from)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        dir
    };
    let err = |dir: &Path| Llama::load(dir).err().expect("refused").to_string();

    let missing = copy("mistral");
    std::fs::remove_file(missing.path().join("model-00002-of-00004.safetensors")).unwrap();
    let e = err(missing.path());
    assert!(e.contains("model-00002-of-00004.safetensors"), "{e}");

    let mismatched = copy("mistral");
    let index = mismatched.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let moved = text.replacen("model-00001-of-00004", "model-00004-of-00004", 1);
    std::fs::write(&index, moved).unwrap();
    let e = err(mismatched.path());
    assert!(e.contains("index"), "{e}");

    let reshaped = copy("llama3");
    let config = reshaped.path().join("config.json");
    std::fs::write(
        &config,
        std::fs::read_to_string(&config).unwrap().replace("\"intermediate_size\": 48", "\"intermediate_size\": 40"),
    )
    .unwrap();
    let e = err(reshaped.path());
    assert!(e.contains("model.safetensors") && e.contains("shape"), "{e}");

    // Qwen2's weights under a Llama config: its biases are tensors a Llama does not have.
    let biased = copy("qwen2");
    let config = biased.path().join("config.json");
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap().replace("\"qwen2\"", "\"llama\"")).unwrap();
    let e = err(biased.path());
    assert!(e.contains("bias") && e.contains("does not have"), "{e}");

    // A Llama config over Qwen3's weights with the norms taken away: a weight is missing.
    let unnormed = copy("llama3");
    let config = unnormed.path().join("config.json");
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap().replace("\"llama\"", "\"qwen3\"")).unwrap();
    let e = err(unnormed.path());
    assert!(e.contains("q_norm"), "{e}");
}

fn lethe(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_lethe")).args(args).output().unwrap()
}

/// `lethe generate --init-from FOLDER` continues a prompt given as ids with the ids
/// `transformers`' greedy `generate` gives, for every family, straight from the folder;
/// a text prompt goes through the folder's tokenizer.
#[test]
fn greedy_generation_from_a_folder_gives_the_ids_of_transformers() {
    for name in FAMILIES {
        let want = expected(name);
        let prompt = Vec::<i64>::try_from(want["ids"].get(0).narrow(0, 0, 8)).unwrap();
        let prompt = prompt.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let folder = fixture(name);
        let out = lethe(&[
            "generate",
            "--init-from",
            folder.to_str().unwrap(),
            "--prompt-ids",
            &prompt,
            "--print-ids",
            "--temperature",
            "0",
            "--tokens",
            "6",
        ]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let greedy = Vec::<i64>::try_from(&want["greedy"]).unwrap();
        let greedy = greedy.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), greedy, "{name}");
    }
    let folder = fixture("llama3");
    let out =
        lethe(&["generate", "--init-from", folder.to_str().unwrap(), "--prompt", "The cache keeps", "--tokens", "4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("The cache keeps"));
}

/// Bad generation requests end with one line and a non-zero exit: an id beyond the
/// vocabulary, a text prompt without a tokenizer, a tokenizer larger than the model's
/// vocabulary, a GPU asked for.
#[test]
fn bad_generation_requests_are_refused_in_one_line() {
    let folder = fixture("qwen3");
    let folder = folder.to_str().unwrap();
    let refused = |args: &[&str], needle: &str| {
        let out = lethe(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    };
    refused(&["generate", "--init-from", folder, "--prompt-ids", "1,2,999", "--print-ids"], "999");
    // A device lethe does not know, and a GPU the machine does not have, named by the flag.
    refused(&["generate", "--init-from", folder, "--prompt-ids", "1", "--device", "tpu"], "--device tpu: must be");
    refused(
        &["eval", "--init-from", folder, "--data", "x.txt", "--device", "cuda:99"],
        "--device cuda:99: no such GPU",
    );
    let bare = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("qwen3").join(file), bare.path().join(file)).unwrap();
    }
    let bare_path = bare.path().to_str().unwrap();
    refused(&["generate", "--init-from", bare_path, "--prompt", "hi"], "tokenizer.json");
    // A word tokenizer of 400 words, more than the model's 320 rows.
    let words: Vec<String> = (0..400).map(|i| format!("w{i}")).collect();
    let big = Tokenizer::train_words(&[words.join(" ").as_str()], 1, 1000).unwrap();
    std::fs::write(bare.path().join("tokenizer.json"), big.to_json().unwrap()).unwrap();
    refused(&["generate", "--init-from", bare_path, "--prompt", "w1 w2"], "vocab_size = 320");
}
