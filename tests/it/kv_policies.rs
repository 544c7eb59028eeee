//! The key-value cache policies on the Llama fixture against NVIDIA's kvpress: the
//! fixture (tests/fixtures/llama/kvpress.safetensors, made by scripts/kvpress-fixture.py)
//! holds, for two models, each press and two budgets, the entries kvpress keeps after
//! reading a prompt of 48 ids, and the keys StreamingLLM's re-assigned positions give.
//! Then what no reference covers: memory that follows the budget over a long stream, and
//! the policies that keep everything agreeing with the full cache.

use std::collections::HashMap;
use std::path::Path;

use crate::common::llama::fixture;
use crate::common::random_tokens;

use lethe::model::kv::{Budget, Policy};
use lethe::model::llama::{KvCache, Llama};
use tch::{Kind, Tensor};

fn kvpress() -> HashMap<String, Tensor> {
    Tensor::read_safetensors(fixture("kvpress.safetensors")).unwrap().into_iter().collect()
}

fn policy(spec: &str, budget: i64, context: i64) -> Policy {
    Policy::parse(spec, Some(Budget::Entries(budget)), context).unwrap()
}

/// lethe's policy as kvpress's press: `(lethe spec, fixture name)`.
const PRESSES: [(&str, &str); 4] =
    [("window", "window"), ("streaming", "streaming"), ("tova", "tova"), ("snapkv:window=8", "snapkv")];

#[test]
fn each_policy_keeps_the_entries_kvpress_keeps() {
    let want = kvpress();
    let ids = &want["ids"];
    for model_name in ["llama3", "qwen3"] {
        let model = Llama::load(&fixture(model_name)).unwrap();
        for (spec, press) in PRESSES {
            for budget in [24, 12] {
                let mut cache = KvCache::new(policy(spec, budget, 48));
                let _ = model.forward(ids, &mut cache);
                for (layer, held) in cache.layers.iter().enumerate() {
                    let held = held.as_ref().unwrap();
                    let expected = &want[&format!("{model_name}.{press}.{budget}.{layer}")];
                    assert_eq!(
                        held.positions,
                        *expected,
                        "{model_name} {spec} budget {budget} layer {layer}: kept {:?}, kvpress {:?}",
                        Vec::<i64>::try_from(held.positions.flatten(0, -1)).unwrap(),
                        Vec::<i64>::try_from(expected.flatten(0, -1)).unwrap()
                    );
                }
            }
        }
    }
}

/// StreamingLLM holds its keys unrotated and places them in the cache: rotated at the
/// places 0, 1, ... they are the keys kvpress's KeyRerotationPress gives.
#[test]
fn streaming_keys_rotated_in_the_cache_equal_kvpress_rerotation() {
    let want = kvpress();
    for model_name in ["llama3", "qwen3"] {
        let model = Llama::load(&fixture(model_name)).unwrap();
        for budget in [24, 12] {
            let mut cache = KvCache::new(policy("streaming", budget, 48));
            let _ = model.forward(&want["ids"], &mut cache);
            for (layer, held) in cache.layers.iter().enumerate() {
                let held = held.as_ref().unwrap();
                let placed = model.rotate_at(&held.keys, &Tensor::arange(budget, (Kind::Int64, tch::Device::Cpu)));
                let expected = &want[&format!("{model_name}.streaming_keys.{budget}.{layer}")];
                let gap = (&placed - expected).abs().max().double_value(&[]);
                assert!(gap < 1e-5, "{model_name} budget {budget} layer {layer}: keys differ by {gap:.2e}");
            }
        }
    }
}

/// Every policy holds no more than its budget (SnapKV its budget and its window) after
/// each token of a stream four times as long, prompt blocks and decoding alike, and the
/// bytes held are those of the budget.
#[test]
fn memory_follows_the_budget_over_a_long_stream() {
    let model = Llama::load(&fixture("llama3")).unwrap();
    let ids = random_tokens(3, 300, &[1, 160]);
    // Two layers, two key-value heads of 8 floats: a key, a value and a position an entry.
    let entry_bytes = 2 * 2 * (2 * 8 * 4 + 8);
    for (spec, extra) in [("window", 0), ("streaming", 0), ("h2o", 0), ("tova", 0), ("snapkv:window=8", 8)] {
        let budget = 40;
        let mut cache = KvCache::new(policy(spec, budget, 160));
        let _ = model.forward(&ids.narrow(1, 0, 64), &mut cache);
        let mut bytes = Vec::new();
        for t in 64..160 {
            let logits = model.forward(&ids.narrow(1, t, 1), &mut cache);
            assert!(bool::try_from(logits.isfinite().all()).unwrap(), "{spec}: logits not finite at {t}");
            for (layer, n) in cache.entries().into_iter().enumerate() {
                assert!(n <= budget + extra, "{spec}: layer {layer} holds {n} entries at token {t}");
            }
            bytes.push(cache.bytes());
        }
        let most = *bytes.iter().max().unwrap();
        assert!(most <= entry_bytes * (budget + extra) as usize, "{spec}: {most} bytes held");
        if extra == 0 {
            assert!(bytes.iter().all(|&b| b == entry_bytes * budget as usize), "{spec}: bytes held {bytes:?}");
        }
    }
}

/// A policy whose budget holds the whole stream keeps everything and reads like the full
/// cache, token by token; StreamingLLM's places are then the absolute positions.
#[test]
fn a_budget_that_holds_the_stream_reads_like_the_full_cache() {
    let model = Llama::load(&fixture("qwen3")).unwrap();
    let ids = kvpress()["ids"].shallow_clone();
    let read = |cache: &mut KvCache| {
        let mut parts = vec![model.forward(&ids.narrow(1, 0, 16), cache)];
        for t in 16..48 {
            parts.push(model.forward(&ids.narrow(1, t, 1), cache));
        }
        Tensor::cat(&parts, 1)
    };
    let full = read(&mut KvCache::default());
    for spec in ["window", "streaming", "h2o", "tova", "snapkv:window=8"] {
        let got = read(&mut KvCache::new(policy(spec, 48, 48)));
        let gap = (&got - &full).abs().max().double_value(&[]);
        assert!(gap < 1e-5, "{spec}: differs from the full cache by {gap:.2e}");
    }
}

/// A forked cache reads on as its original would have: a prompt read once (a block, then
/// token by token, the budget already pressing), the original continued one way and the
/// fork another, in turns (the original's block first, then a token each), each gives
/// the logits and keeps the entries of a cache that read the prompt and its continuation
/// alone; the original's block leaves the fork as it was.
#[test]
fn a_forked_cache_reads_on_as_its_original_would_have() {
    let model = Llama::load(&fixture("llama3")).unwrap();
    let ids = random_tokens(5, 300, &[2, 40]);
    let (prompt, one_way, another) = (ids.narrow(1, 0, 24), ids.narrow(1, 24, 16), ids.narrow(1, 8, 16));
    let read = |cache: &mut KvCache, ids: &Tensor| {
        let mut parts = vec![model.forward(&ids.narrow(1, 0, 4), cache)];
        parts.extend((4..ids.size()[1]).map(|t| model.forward(&ids.narrow(1, t, 1), cache)));
        Tensor::cat(&parts, 1)
    };
    let fresh = |spec: &str| match spec {
        "full" => KvCache::default(),
        spec => KvCache::new(policy(spec, 10, 40)),
    };
    for spec in ["full", "window", "streaming", "h2o", "tova", "snapkv:window=6"] {
        let mut cache = fresh(spec);
        let _ = read(&mut cache, &prompt);
        let mut fork = cache.fork();
        let held = fork.entries();
        let mut first = vec![model.forward(&one_way.narrow(1, 0, 4), &mut cache)];
        assert_eq!((fork.entries(), fork.position), (held, 24), "{spec}: the original's reading changed the fork");
        let mut second = vec![model.forward(&another.narrow(1, 0, 4), &mut fork)];
        for t in 4..16 {
            first.push(model.forward(&one_way.narrow(1, t, 1), &mut cache));
            second.push(model.forward(&another.narrow(1, t, 1), &mut fork));
        }
        for (cont, got, cache) in [(&one_way, first, &cache), (&another, second, &fork)] {
            let mut alone = fresh(spec);
            let _ = read(&mut alone, &prompt);
            let want = read(&mut alone, cont);
            assert!(Tensor::cat(&got, 1).equal(&want), "{spec}: a continuation's logits differ from reading it alone");
            assert_eq!(cache.entries(), alone.entries(), "{spec}: entries held");
            assert_eq!(cache.position, 40, "{spec}: position");
        }
    }
}

/// `lethe ARGS` from the repository's root (every path given is absolute).
fn lethe(args: &[&str]) -> std::process::Output {
    crate::common::cli::lethe(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

/// A cache saved as named tensors and made again from copies of them reads on as the
/// original does: the same logits and entries, for every policy (H2O's scores and
/// SnapKV's window of queries among the tensors); a state out of place (a tensor missing,
/// misnamed or misshapen, layers of different streams, a layer holding nothing, entries
/// written after the cache's position) is refused in one line, and a cache of another
/// model's shape is named as such.
#[test]
fn a_cache_made_again_from_its_state_reads_on_as_the_original() {
    let model = Llama::load(&fixture("llama3")).unwrap();
    let ids = random_tokens(9, 300, &[2, 36]);
    for spec in ["full", "window", "streaming", "h2o", "tova", "snapkv:window=6"] {
        let policy = match spec {
            "full" => Policy::default(),
            spec => policy(spec, 10, 36),
        };
        let mut cache = KvCache::new(policy.clone());
        let _ = model.forward(&ids.narrow(1, 0, 16), &mut cache);
        (16..20).for_each(|t| drop(model.forward(&ids.narrow(1, t, 1), &mut cache)));
        let saved: Vec<(String, Tensor)> = cache.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
        let mut again = KvCache::from_state(policy, saved).unwrap();
        assert_eq!((again.entries(), again.position), (cache.entries(), 20), "{spec}");
        for t in 20..36 {
            let (want, got) =
                (model.forward(&ids.narrow(1, t, 1), &mut cache), model.forward(&ids.narrow(1, t, 1), &mut again));
            assert!(got.equal(&want), "{spec}: token {t} reads otherwise from the cache made again");
        }
        assert_eq!(again.entries(), cache.entries(), "{spec}");
    }

    let mut cache = KvCache::new(policy("h2o", 10, 36));
    let _ = model.forward(&ids.narrow(1, 0, 12), &mut cache);
    let state = || cache.state().into_iter().map(|(n, t)| (n, t.copy())).collect::<Vec<_>>();
    let without = |name: &str| state().into_iter().filter(|(n, _)| n != name).collect::<Vec<_>>();
    let renamed = |from: &str, to: &str| {
        state().into_iter().map(|(n, t)| (if n == from { to.to_string() } else { n }, t)).collect::<Vec<_>>()
    };
    let refused = |state: Vec<(String, Tensor)>, spec: &str| {
        KvCache::from_state(policy(spec, 10, 36), state).err().expect("refused").to_string()
    };
    assert!(refused(without("layers.1.values"), "h2o").contains("`layers.1.values`: missing"));
    assert!(refused(renamed("layers.0.keys", "layers.0.key"), "h2o").contains("`layers.0.key`: not a name"));
    assert!(refused(renamed("layers.0.keys", "layers.99999.keys"), "h2o").contains("no such layer"));
    assert!(refused(state(), "tova").contains("`layers.0.policy`: `scores`: the policy keeps nothing"));
    let mut flat = state();
    flat[1].1 = flat[1].1.flatten(0, -1);
    assert!(refused(flat, "h2o").contains("`layers.0.keys`: a 4-dimensional Float tensor"));
    let edited = |edit: &dyn Fn(&str, Tensor) -> Tensor| {
        state().into_iter().map(|(n, t)| (n.clone(), edit(&n, t))).collect::<Vec<_>>()
    };
    let held = ["keys", "values", "positions", "policy.scores"];
    let one_stream = edited(&|n, t| if n.starts_with("layers.1.") { t.narrow(0, 0, 1) } else { t });
    assert!(refused(one_stream, "h2o").contains("`layers.1.keys`: holds 1 streams, layers.0 2"));
    let none = edited(&|n, t| if held.iter().any(|f| n == format!("layers.0.{f}")) { t.narrow(2, 0, 0) } else { t });
    assert!(refused(none, "h2o").contains("`layers.0.keys`: holds no entry"));
    let behind = edited(&|n, t| if n == "position" { Tensor::from(5i64) } else { t });
    assert!(refused(behind, "h2o").contains("where the cache has read 5 tokens"));
    let negative = edited(&|n, t| if n == "position" { Tensor::from(-1i64) } else { t });
    assert!(refused(negative, "h2o").contains("`position`: -1 is negative"));
    // What a policy keeps must describe the entries held: H2O a score for each.
    let short = edited(&|n, t| if n == "layers.1.policy.scores" { t.narrow(2, 0, 3) } else { t });
    let why = refused(short, "h2o");
    assert!(
        why.contains("`layers.1.policy`: `scores`: of shape [2, 2, 3], where the entries held make [2, 2, 10]"),
        "{why}"
    );
    let orphan = without("layers.1.keys")
        .into_iter()
        .filter(|(n, _)| !n.starts_with("layers.1.v") && !n.starts_with("layers.1.pos"));
    let why = refused(orphan.collect(), "h2o");
    assert!(why.contains("`layers.1.policy`: `scores`: kept for a layer that holds no entry"), "{why}");
    let mut snap = KvCache::new(policy("snapkv:window=6", 10, 36));
    let _ = model.forward(&ids.narrow(1, 0, 12), &mut snap);
    let _ = model.forward(&ids.narrow(1, 12, 1), &mut snap); // a query in its window
    let one_query_stream = snap.state().into_iter().map(|(n, t)| match n.ends_with("policy.queries") {
        true => (n, t.narrow(0, 0, 1).copy()),
        false => (n, t.copy()),
    });
    let why = refused(one_query_stream.collect(), "snapkv:window=6");
    assert!(why.contains("`layers.0.policy`: `queries`: of shape [1, ") && !why.contains('\n'), "{why}");
    let qwen3 = Llama::load(&fixture("qwen3")).unwrap();
    assert_eq!(cache.check_fits(&model), Ok(()));
    let why = cache.check_fits(&qwen3).unwrap_err();
    assert!(why.contains("2 key-value heads of width 8, the model 2 of width 16 (a cache of another model)"), "{why}");
}

/// In bfloat16 every policy holds its cache in bfloat16 (half the bytes of float32's for
/// as many entries) within its budget over a stream three times as long; the policies
/// that keep by position (a window, StreamingLLM) keep float32's entries, those that keep
/// by attention (H2O, TOVA, SnapKV) nearly all of them. A cache saved in bfloat16 is made
/// again as it was; a model in float32 refuses it, naming the two precisions.
#[test]
fn in_bfloat16_every_policy_keeps_what_it_keeps_in_float32() {
    use lethe::config::train::Precision;
    let single = Llama::load(&fixture("llama3")).unwrap();
    let half = Llama::load_as(&fixture("llama3"), tch::Device::Cpu, Precision::Bf16).unwrap();
    let ids = random_tokens(5, 300, &[1, 96]);
    for spec in ["window", "streaming", "h2o", "tova", "snapkv:window=8"] {
        let read = |model: &Llama| {
            let mut cache = KvCache::new(policy(spec, 24, 96));
            let _ = model.forward(&ids.narrow(1, 0, 32), &mut cache);
            (32..96).for_each(|t| drop(model.forward(&ids.narrow(1, t, 1), &mut cache)));
            cache
        };
        let (want, got) = (read(&single), read(&half));
        assert_eq!(got.layers[0].as_ref().unwrap().keys.kind(), Kind::BFloat16, "{spec}");
        assert_eq!(got.entries(), want.entries(), "{spec}");
        assert_eq!(2 * got.kv_bytes(), want.kv_bytes(), "{spec}");
        for (layer, (a, b)) in got.layers.iter().zip(&want.layers).enumerate() {
            let (a, b) = (&a.as_ref().unwrap().positions, &b.as_ref().unwrap().positions);
            let shared = a.unsqueeze(-1).eq_tensor(&b.unsqueeze(-2)).any_dim(-1, false);
            let shared = shared.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
            println!("{spec} layer {layer}: {:.0}% of float32's entries kept in bfloat16", 100.0 * shared);
            let least = if matches!(spec, "window" | "streaming") { 1.0 } else { 0.8 };
            assert!(shared >= least, "{spec} layer {layer}: {shared:.2} of float32's entries kept");
        }
    }
    let mut cache = KvCache::new(policy("snapkv:window=6", 10, 36));
    let _ = half.forward(&ids.narrow(1, 0, 16), &mut cache);
    let saved: Vec<(String, Tensor)> = cache.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
    let mut again = KvCache::from_state(policy("snapkv:window=6", 10, 36), saved).unwrap();
    assert_eq!(again.check_fits(&half), Ok(()));
    for t in 16..30 {
        let (want, got) =
            (half.forward(&ids.narrow(1, t, 1), &mut cache), half.forward(&ids.narrow(1, t, 1), &mut again));
        assert!(got.equal(&want), "token {t} reads otherwise from the bfloat16 cache made again");
    }
    let why = again.check_fits(&single).unwrap_err();
    assert!(why.contains("holds `layers.0.keys` in bf16, the model computes in f32"), "{why}");
}

/// A generation its consumer stops (Ctrl-C in Python) leaves in the cache what it read:
/// the prompt and the tokens taken in before the stop, not an empty cache; a prompt
/// refused leaves the cache as it was.
#[test]
fn a_stopped_generation_leaves_what_it_read_in_the_cache() {
    let model = Llama::load(&fixture("llama3")).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 300).collect();
    let greedy = lethe::generate::Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 };
    let mut cache = KvCache::new(policy("h2o", 16, 64));
    let mut emitted = 0;
    let stopped = lethe::generate::stream_decoder(
        &model,
        &mut cache,
        &prompt,
        10,
        &greedy,
        |_, _| {},
        |_| {
            emitted += 1;
            match emitted {
                3 => Err(lethe::LetheError::Invalid("stopped".into())),
                _ => Ok(()),
            }
        },
    );
    assert!(stopped.is_err());
    // The first two tokens were taken in after they were emitted; the third was not.
    assert_eq!((cache.position, cache.entries()), (22, vec![16, 16]));
    let empty = lethe::generate::stream_decoder(&model, &mut cache, &[], 4, &greedy, |_, _| {}, |_| Ok(()));
    assert!(empty.unwrap_err().to_string().contains("the prompt is empty"));
    assert_eq!((cache.position, cache.entries()), (22, vec![16, 16]));
}

/// `lethe generate --init-from FOLDER --policy NAME --budget N` decodes greedily the ids
/// the library gives over a cache under that policy, and says what the cache held.
#[test]
fn generation_under_a_policy_gives_the_ids_of_the_library() {
    let folder = fixture("llama3");
    let model = Llama::load(&folder).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 300).collect();
    let prompt_ids = prompt.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let greedy = lethe::generate::Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 };
    for (spec, budget) in [("h2o", "16"), ("tova", "1/4"), ("streaming:sinks=2", "12"), ("snapkv:window=4", "0.5")] {
        let context = (prompt.len() + 10) as i64;
        let policy = Policy::parse(spec, Some(Budget::parse(budget).unwrap()), context).unwrap();
        let mut want = Vec::new();
        let mut cache = KvCache::new(policy);
        lethe::generate::stream_decoder(
            &model,
            &mut cache,
            &prompt,
            10,
            &greedy,
            |_, _| {},
            |t| {
                want.push(t.to_string());
                Ok(())
            },
        )
        .unwrap();
        let out = lethe(&[
            "generate",
            "--init-from",
            folder.to_str().unwrap(),
            "--prompt-ids",
            &prompt_ids,
            "--print-ids",
            "--temperature",
            "0",
            "--tokens",
            "10",
            "--policy",
            spec,
            "--budget",
            budget,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{spec}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want.join(","), "{spec}");
        let held = cache.entries()[0];
        assert!(stderr.contains(&format!("{held} entries a layer")), "{spec}: {stderr}");
    }
}

/// Bad policies and budgets end with one line naming the flag and a non-zero exit.
#[test]
fn bad_policies_and_budgets_are_refused_in_one_line() {
    let folder = fixture("qwen3");
    let folder = folder.to_str().unwrap();
    let base = ["generate", "--init-from", folder, "--prompt-ids", "1,2,3,4,5,6,7,8", "--tokens", "4"];
    for (extra, needle) in [
        (&["--policy", "h2o", "--budget", "0"][..], "--budget 0: a budget must keep at least one entry"),
        (&["--policy", "h2o", "--budget", "13"], "--budget 13 is more than the 12 tokens of context"),
        (&["--policy", "h2o"], "--policy h2o needs --budget"),
        (&["--budget", "4"], "--policy full keeps every entry"),
        (&["--policy", "lru", "--budget", "4"], "--policy lru: unknown"),
        (&["--policy", "snapkv", "--budget", "8"], "window = 64"),
        (&["--policy", "h2o", "--budget", "1.5"], "--budget 1.5: a fraction must be in (0, 1]"),
        (&["--policy", "h2o", "--budget", "-5"], "--budget -5: a budget must keep at least one entry"),
        (&["--policy", "h2o", "--budget", "nan"], "--budget nan: a fraction must be in (0, 1]"),
    ] {
        let out = lethe(&[&base[..], extra].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{extra:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{extra:?}: {err}");
    }
    let out = lethe(&["generate", "--checkpoint", "run", "--policy", "h2o", "--budget", "4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--init-from"), "{err}");
}

/// A decoder's loss over a stream, from the full cache, is the mean negative
/// log-likelihood `transformers`' logits give the same ids, whatever the block.
#[test]
fn decoder_loss_equals_the_one_transformers_logits_give() {
    for name in ["llama3", "qwen3", "mistral"] {
        let folder = fixture(name);
        let model = Llama::load(&folder).unwrap();
        let want: HashMap<String, Tensor> =
            Tensor::read_safetensors(folder.join("expected.safetensors")).unwrap().into_iter().collect();
        let ids = Vec::<i64>::try_from(want["ids"].get(0)).unwrap();
        let logp = want["logits"].get(0).narrow(0, 0, 19).log_softmax(-1, Kind::Double);
        let targets = Tensor::from_slice(&ids[1..]).unsqueeze(1);
        let reference = -logp.gather(1, &targets, false).mean(Kind::Double).double_value(&[]);
        let ids: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
        for block in [1, 5, 512] {
            let mut cache = KvCache::default();
            let r = lethe::eval::evaluate_decoder(&model, &mut cache, &ids, block, |_, _| {}).unwrap();
            assert_eq!((r.tokens, r.held.clone()), (19, vec![19, 19]), "{name} block {block}");
            assert!((r.loss - reference).abs() < 1e-5, "{name} block {block}: {} against {reference}", r.loss);
        }
    }
}

/// `lethe eval --init-from FOLDER --data FILE --policy NAME --budget N` scores the text
/// with the cache within its budget; flags of a lethe run are refused.
#[test]
fn eval_from_a_folder_scores_a_text_within_the_budget() {
    let folder = fixture("llama3");
    let folder = folder.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "The cache keeps 1024 entries: StreamingLLM keeps the first tokens and a window. ".repeat(8))
        .unwrap();
    let text = text.to_str().unwrap();
    let out = lethe(&["eval", "--init-from", folder, "--data", text, "--policy", "h2o", "--budget", "16", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["held"], serde_json::json!([16, 16]), "{r}");
    assert_eq!(r["block"], 1);
    assert!(r["loss"].as_f64().unwrap() > 0.0 && r["tokens"].as_u64().unwrap() > 16, "{r}");
    let refused = |args: &[&str], needle: &str| {
        let out = lethe(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    };
    refused(&["eval", "--init-from", folder, "--data", text, "--split", "test"], "--split applies to a lethe run");
    refused(
        &["eval", "--init-from", folder, "--data", text, "--policy", "tova", "--budget", "100000"],
        "100000 is more",
    );
    refused(&["eval", "--init-from", folder, "--data", "/nonexistent/text.txt"], "--data `/nonexistent/text.txt`");
    refused(&["eval", "--init-from", folder], "give --data FILE");
}

/// `lethe bench --init-from FOLDER` times prefill and decoding under each `--kv` policy
/// at each context, and writes bench.json; the training bench's flags are refused.
#[test]
fn bench_from_a_folder_times_each_policy_at_each_context() {
    let folder = fixture("llama3");
    let folder = folder.to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let run = lethe(&[
        "bench",
        "--init-from",
        folder,
        "--contexts",
        "24,40",
        "--kv",
        "full",
        "--kv",
        "h2o@16",
        "--decode-tokens",
        "3",
        "--out",
        dir,
        "--name",
        "b",
    ]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("b/bench.json")).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    let found: Vec<(String, u64, Option<u64>)> = results
        .iter()
        .map(|r| (r["policy"].as_str().unwrap().to_string(), r["context"].as_u64().unwrap(), r["budget"].as_u64()))
        .collect();
    let want = [("full", 24, None), ("full", 40, None), ("h2o", 24, Some(16)), ("h2o", 40, Some(16))];
    assert_eq!(found, want.map(|(p, c, b)| (p.to_string(), c, b)).to_vec());
    // Two layers, two key-value heads of 8 floats, a key and a value an entry.
    let entry = 2 * 2 * 2 * 8 * 4;
    for r in results {
        let held = match r["budget"].as_u64() {
            Some(b) => b,
            None => r["context"].as_u64().unwrap() + 3,
        };
        assert_eq!(r["cache_bytes"].as_u64().unwrap(), held * entry, "{r}");
        assert!(r["decode_tok_s"].as_f64().unwrap() > 0.0 && r["bandwidth_share"].as_f64().unwrap() > 0.0, "{r}");
    }
    for flag in [&["--mechanism", "fixed"][..], &["--data", folder], &["--steps", "3"]] {
        let refused = lethe(&[&["bench", "--init-from", folder][..], flag].concat());
        let err = String::from_utf8_lossy(&refused.stderr);
        let said = format!("{} applies to the training bench", flag[0]);
        assert!(!refused.status.success() && err.contains(&said), "{err}");
    }
}

/// `--precision` reads the decoder in that precision: `generate` gives the library's
/// greedy ids in bfloat16 and says so, `eval` scores in float16, `bench` times each
/// policy in each precision (bfloat16's cache half float32's bytes); a run's flags or a
/// precision lethe lacks are refused in one line.
#[test]
fn the_commands_read_a_decoder_in_the_precision_asked() {
    use lethe::config::train::Precision;
    let folder = fixture("llama3");
    let model = Llama::load_as(&folder, tch::Device::Cpu, Precision::Bf16).unwrap();
    let folder = folder.to_str().unwrap();
    let prompt: Vec<u32> = (0..24).map(|i| (i * 5 + 1) % 300).collect();
    let greedy = lethe::generate::Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 };
    let mut want = Vec::new();
    let keep = |t: u32| {
        want.push(t.to_string());
        Ok(())
    };
    lethe::generate::stream_decoder(&model, &mut KvCache::default(), &prompt, 8, &greedy, |_, _| {}, keep).unwrap();
    let ids = prompt.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let args = ["--prompt-ids", &ids, "--print-ids", "--tokens", "8", "--temperature", "0", "--precision", "bf16"];
    let out = lethe(&[&["generate", "--init-from", folder][..], &args].concat());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want.join(","));
    assert!(said.contains("cache (full, bf16): 31 entries"), "{said}");

    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "Tokens kept in half precision read as in float32, nearly. ".repeat(6)).unwrap();
    let text = text.to_str().unwrap();
    let out = lethe(&["eval", "--init-from", folder, "--data", text, "--precision", "f16"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("(policy full, f16, block 512)"), "{said}");

    let bench = dir.path().to_str().unwrap();
    let args = ["--contexts", "24", "--kv", "h2o@16", "--decode-tokens", "2", "--precision", "f32,bf16"];
    let out = lethe(&[&["bench", "--init-from", folder, "--out", bench, "--name", "b"][..], &args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("b/bench.json")).unwrap()).unwrap();
    let rows: Vec<(String, u64)> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["precision"].as_str().unwrap().to_string(), r["cache_bytes"].as_u64().unwrap()))
        .collect();
    // Two layers, two key-value heads of 8, a key and a value an entry: 16 entries.
    assert_eq!(rows, [("f32".to_string(), 16 * 2 * 2 * 2 * 8 * 4), ("bf16".to_string(), 16 * 2 * 2 * 2 * 8 * 2)]);

    let refused = |args: &[&str], needle: &str| {
        let out = lethe(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    };
    let (run, out) = (dir.path().join("nothing"), dir.path().join("out"));
    let (run, out) = (run.to_str().unwrap(), out.to_str().unwrap());
    refused(&["eval", "--checkpoint", run, "--precision", "bf16"], "--precision bf16 applies to a pretrained decoder");
    refused(
        &["longeval", "--checkpoint", run, "--out", out, "--precision", "bf16"],
        "--precision applies to a pretrained decoder",
    );
    refused(&["bench", "--init-from", folder, "--precision", "bf16,bf16"], "--precision: `bf16` is given twice");
}

/// `--learned RUN[@BUDGET]` times a run with a learned memory in turns with the
/// policies: a row per context, named after the run (and its cap), the memory it held
/// after decoding no larger capped than uncapped; a run without a learned memory, or a
/// budget on an ∞-former, is refused.
#[test]
fn bench_from_a_folder_times_a_learned_run_beside_the_policies() {
    let folder = fixture("llama3");
    let dir = tempfile::tempdir().unwrap();
    let sets = ["train.freeze_base=true", "memory.mechanism=\"expire\"", "memory.span=32"];
    crate::common::cli::fine_tune_fixture(dir.path(), &folder, "fitted", &sets);
    let run = dir.path().join("runs/fitted");
    let (run, folder) = (run.to_str().unwrap(), folder.to_str().unwrap());
    let capped = format!("{run}@8");
    let out = dir.path().to_str().unwrap();
    let args = ["bench", "--init-from", folder, "--contexts", "24", "--kv", "window@8", "--learned", &capped];
    let bench = lethe(&[&args[..], &["--learned", run, "--decode-tokens", "3", "--out", out, "--name", "b"]].concat());
    assert!(bench.status.success(), "{}", String::from_utf8_lossy(&bench.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("b/bench.json")).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    let names: Vec<&str> = results.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["window", "expire (fitted)@8", "expire (fitted)"]);
    let bytes = |i: usize| results[i]["cache_bytes"].as_u64().unwrap();
    assert!(bytes(1) > 0 && bytes(1) <= bytes(2), "{results:?}");
    assert!(results.iter().all(|r| r["decode_tok_s"].as_f64().unwrap() > 0.0));
    let plain = format!("{out}/runs/none");
    let refused = lethe(&["bench", "--init-from", folder, "--learned", &plain]);
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("runs/none"));
    // The run at one budget twice, however spelled, is refused; at two budgets it is not.
    let again = format!("{out}/runs/../runs/fitted/checkpoint.safetensors@8");
    let twice = lethe(&["bench", "--init-from", folder, "--learned", &capped, "--learned", &again]);
    assert!(String::from_utf8_lossy(&twice.stderr).contains(&format!("--learned: `{again}` is given twice")));
}

/// A chunk of tokens reads like the same tokens one by one when the policy evicts
/// nothing in between, even where each key-value head holds other entries (SnapKV) and
/// Mistral's sliding window masks each head by its own entries' positions.
#[test]
fn a_chunk_reads_like_its_tokens_one_by_one_when_each_head_holds_its_own() {
    let model = Llama::load(&fixture("mistral")).unwrap();
    let ids = kvpress()["ids"].narrow(1, 0, 15);
    let mut masks_differed = false;
    // Windows of 4 or more queries are not full again after the chunk's 3 tokens.
    let configs = (5..12).flat_map(|budget| (4..budget).map(move |window| (budget, window)));
    for (budget, window) in configs {
        let pressed = || {
            let mut cache = KvCache::new(policy(&format!("snapkv:window={window}"), budget, 15));
            let _ = model.forward(&ids.narrow(1, 0, 12), &mut cache);
            cache
        };
        let mut whole = pressed();
        // The first query of the chunk (position 12) sees positions from 7 on: do two
        // heads see different slots?
        masks_differed |= whole.layers.iter().flatten().any(|h| {
            let seen = h.positions.ge(7);
            seen.get(0).get(0) != seen.get(0).get(1)
        });
        let chunk = model.forward(&ids.narrow(1, 12, 3), &mut whole);
        let mut single = pressed();
        let steps: Vec<Tensor> = (12..15).map(|t| model.forward(&ids.narrow(1, t, 1), &mut single)).collect();
        let gap = (&chunk - Tensor::cat(&steps, 1)).abs().max().double_value(&[]);
        assert!(
            gap < 1e-5,
            "budget {budget}, window {window}: a chunk differs from its tokens one by one by {gap:.2e}"
        );
    }
    assert!(masks_differed, "the fixture must have two heads whose window sees other slots");
}

/// A decoder reads a prompt alike in one block and token by token over the full cache
/// (the next token's logits to float32 rounding, the same greedy continuation); under a
/// window of 8 read token by token, the cache holds 8 entries a layer and the next
/// logits change, under a window that holds the whole prompt they do not.
#[test]
fn a_decoder_reads_a_prompt_alike_in_blocks_and_token_by_token() {
    use lethe::generate::DecoderGenerator;
    let model = Llama::load(&fixture("smollm2")).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 11 + 5) % 300).collect();
    let mut whole = DecoderGenerator::new(&model, KvCache::default(), &prompt, 512).unwrap();
    let mut single = DecoderGenerator::new(&model, KvCache::default(), &prompt, 1).unwrap();
    assert!(crate::common::llama::gap(whole.next_logits(), single.next_logits()) < 1e-4);
    assert_eq!(whole.memory_held(), vec![40; model.config.layers as usize]);
    let full = whole.next_logits().copy();
    let a: Vec<u32> = (0..6).map(|_| whole.next_token().unwrap()).collect();
    let b: Vec<u32> = (0..6).map(|_| single.next_token().unwrap()).collect();
    assert_eq!(a, b);
    let window = Policy::parse("window", Some(Budget::Entries(8)), 40).unwrap();
    let kept = DecoderGenerator::new(&model, KvCache::new(window), &prompt, 1).unwrap();
    assert_eq!(kept.memory_held(), vec![8; model.config.layers as usize]);
    let roomy = Policy::parse("window", Some(Budget::Entries(40)), 40).unwrap();
    let never = DecoderGenerator::new(&model, KvCache::new(roomy), &prompt, 1).unwrap();
    assert!(crate::common::llama::gap(never.next_logits(), &full) < 1e-4);
    assert!(crate::common::llama::gap(kept.next_logits(), &full) > 1e-3);
}
