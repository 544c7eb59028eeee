//! Low-rank adapters on a Llama-family model's attention maps (`train.lora_rank`, the
//! rest frozen): they start as the pretrained model; their gradients, through the
//! window's projection of the cache, equal finite differences; `lethe export` folds them
//! into the maps, so the folder computes what the adapted run computes.

use crate::common::llama::{fixture, gap};

use lethe::config::{Arch, Config, Mechanism};
use lethe::model::llama::{layout, KvCache, Llama};
use lethe::model::Lm;
use tch::{Device, Tensor};

/// A small random Llama (grouped keys, query and key norms) with adapters of rank 2 on
/// every attention map, the base frozen; blocks of 4.
fn small_adapted_llama(mechanism: Mechanism, span: usize) -> Config {
    let mut cfg = Config::default();
    cfg.model.arch = Arch::Llama;
    (cfg.model.vocab, cfg.model.layers, cfg.model.d_model, cfg.model.heads, cfg.model.d_ffn) = (256, 2, 16, 4, 24);
    (cfg.model.llama.kv_heads, cfg.model.llama.qk_norm) = (2, true);
    (cfg.memory.mechanism, cfg.memory.span, cfg.train.block) = (mechanism, span, 4);
    (cfg.train.freeze_base, cfg.train.lora_rank, cfg.train.lora_alpha) = (true, 2, 4.0);
    cfg.validate().unwrap();
    cfg
}

fn logits(lm: &Lm, ids: &Tensor) -> Tensor {
    tch::no_grad(|| lm.model.forward(ids, &mut lm.model.new_memory(), false)).unwrap().logits
}

/// Adapters start as zero updates (`B = 0`): the adapted model computes what the same
/// weights compute without them. With `B` moved, a folder written with the adapters
/// folded in computes what the adapted model computes.
#[test]
fn adapters_start_as_the_pretrained_model_and_fold_into_an_exported_folder() {
    let _seed = lethe::rng::seed_torch(3);
    let cfg = small_adapted_llama(Mechanism::Fixed, 0);
    let adapted = Lm::new(&cfg, Device::Cpu).unwrap();
    let names: Vec<String> =
        adapted.named_parameters().into_iter().map(|(n, _)| n).filter(|n| lethe::model::lora::is_adapter(n)).collect();
    assert_eq!(names.len(), 2 * 4 * 2, "two tensors on each of 4 maps in 2 layers: {names:?}");
    let mut plain_cfg = cfg.clone();
    (plain_cfg.train.lora_rank, plain_cfg.train.freeze_base) = (0, false);
    let plain = Lm::new(&plain_cfg, Device::Cpu).unwrap();
    tch::no_grad(|| {
        for (name, mut p) in plain.named_parameters() {
            p.copy_(&adapted.vs.variables()[&name]);
        }
    });
    let ids = Tensor::from_slice(&[3i64, 7, 1, 19]).view([1, 4]);
    assert!(gap(&logits(&adapted, &ids), &logits(&plain, &ids)) == 0.0, "zero adapters changed the logits");

    crate::common::randomise(&adapted.vs, 5, 0.5, |n| n.ends_with(".lora_b"));
    let moved = logits(&adapted, &ids);
    assert!(gap(&moved, &logits(&plain, &ids)) > 1e-3, "the adapters' update changed nothing");
    let params: std::collections::HashMap<String, Tensor> = adapted.named_parameters().into_iter().collect();
    let folded = lethe::model::lora::merged(&params, cfg.train.lora_rank, cfg.train.lora_alpha);
    assert!(folded.keys().all(|n| !lethe::model::lora::is_adapter(n)));
    let dir = tempfile::tempdir().unwrap();
    layout::write_folder(&cfg.model, &folded, None, &dir.path().join("m")).unwrap();
    let decoder = Llama::load(&dir.path().join("m")).unwrap();
    let d = gap(&decoder.forward(&ids, &mut KvCache::default()), &moved);
    assert!(d < 1e-5, "the folded folder differs from the adapted run by {d:.2e}");
}

/// The gradient of two blocks' loss, the second reading the first's cache through the
/// window's projection (`cache_grad`, which gives the block's rows the adapted maps'
/// gradient), to entries of every adapter equals central finite differences in double
/// precision; the frozen weights take none.
#[test]
fn the_adapters_gradients_equal_finite_differences() {
    let _seed = lethe::rng::seed_torch(11);
    let cfg = small_adapted_llama(Mechanism::Expire, 8);
    let mut lm = Lm::new(&cfg, Device::Cpu).unwrap();
    lm.vs.double();
    crate::common::randomise(&lm.vs, 17, 0.5, |n| n.ends_with(".lora_b") || n.ends_with("expire.w"));
    let trained = lethe::model::trainable(lm.named_parameters(), true);
    let x: Vec<i64> = vec![1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5];
    let y: Vec<i64> = x.iter().map(|t| (t * 3 + 1) % 11).collect();
    let cache = crate::common::first_block_cache(&lm, &x);
    crate::common::two_block_loss(&lm, &x, &y, &cache).backward();
    for (name, p) in lm.named_parameters() {
        let is_trained = trained.iter().any(|(n, _)| n == &name);
        assert_eq!(p.grad().defined(), is_trained, "{name}: a gradient only where trained");
    }
    let mut checked = 0;
    for (name, p) in trained.iter().filter(|(n, _)| lethe::model::lora::is_adapter(n)) {
        let grad = p.grad().flatten(0, -1);
        let n = p.numel() as i64;
        for idx in [0, n / 2, n - 1] {
            let analytic = grad.double_value(&[idx]);
            let numeric = crate::common::numeric_grad(p, idx, || {
                crate::common::two_block_loss(&lm, &x, &y, &cache).double_value(&[])
            });
            let tol = 1e-6 + 1e-4 * analytic.abs().max(numeric.abs());
            assert!((analytic - numeric).abs() < tol, "{name}[{idx}]: analytic {analytic} vs numeric {numeric}");
            checked += usize::from(analytic.abs() > 1e-8);
        }
    }
    assert!(checked > 20, "only {checked} adapter entries had a gradient");
}

/// From the command line: a fixture folder fine-tuned through adapters only (the
/// fixed window), its base weights unchanged in the checkpoint, exported with the
/// adapters folded in; the folder's logits moved away from the original's.
#[test]
fn a_folder_fine_tuned_through_adapters_exports_with_them_folded_in() {
    let dir = tempfile::tempdir().unwrap();
    let folder = fixture("qwen2");
    let sets = ["train.lr=0.01", "train.freeze_base=true", "train.lora_rank=2", "memory.span=8"];
    let said = crate::common::cli::fine_tune_fixture(dir.path(), &folder, "lora", &sets);
    assert!(said.contains("frozen base: training the memory's"), "{said}");
    let ck = lethe::checkpoint::Checkpoint::load(&dir.path().join("runs/lora")).unwrap();
    let original: std::collections::HashMap<String, Tensor> =
        layout::read_parameters(&folder, &Llama::load(&folder).unwrap().config).unwrap().into_iter().collect();
    for (name, t) in ck.parameters() {
        match original.get(&name) {
            Some(o) => assert!(t.equal(o), "{name}: a frozen weight changed"),
            None => assert!(lethe::model::lora::is_adapter(&name), "{name}: neither the folder's nor an adapter"),
        }
    }
    let out = crate::common::cli::lethe(dir.path(), &["export", "--checkpoint", "runs/lora", "--out", "lora-hf"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success() && said.contains("folded"), "{said}");
    let ids = Tensor::from_slice(&[5i64, 9, 2, 31, 7, 7, 1]).view([1, 7]);
    let before = Llama::load(&folder).unwrap().forward(&ids, &mut KvCache::default());
    let after = Llama::load(&dir.path().join("lora-hf")).unwrap().forward(&ids, &mut KvCache::default());
    assert!(gap(&before, &after) > 1e-4, "the adapters changed nothing in the exported folder");
    let lm = Lm::from_checkpoint(&ck, Device::Cpu).unwrap();
    let d = gap(&logits(&lm, &ids), &after);
    assert!(d < 1e-5, "the exported folder differs from the adapted run by {d:.2e}");
}
