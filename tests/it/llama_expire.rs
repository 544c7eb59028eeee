//! Expire-Span on a Llama-family decoder (`model.arch = "llama"`, `memory.mechanism =
//! "expire"`): a span predictor per layer on the layer's normed input, the soft mask
//! through `ln m` on the attention scores, each memory's key rotated at the place it was
//! written. A predictor that keeps everything leaves a pretrained model's logits as
//! `transformers` computes them; deleting expired memories gives the logits of masking
//! them; the predictor's gradients equal finite differences; `train.freeze_base` trains
//! the predictor alone.

use crate::common::llama::{expected, fixture, gap};

use lethe::config::{Arch, Config, Deletion, Mechanism};
use lethe::model::llama::ExpireRun;
use lethe::model::{init, Lm};
use tch::{Device, Kind, Tensor};

/// The fixture `name` in the backbone with Expire-Span, read in blocks of `block`: largest
/// span `span`, every memory's span starting at `fraction` of it, a ramp of 2.
fn pretrained_with_expire(name: &str, block: usize, span: usize, fraction: f64) -> Lm {
    let mut cfg = Config::default();
    init::adopt(&mut cfg, &fixture(name)).unwrap();
    assert_eq!(cfg.model.arch, Arch::Llama);
    (cfg.memory.mechanism, cfg.memory.span, cfg.train.block) = (Mechanism::Expire, span, block);
    (cfg.memory.expire.ramp, cfg.memory.expire.init_fraction) = (2, fraction);
    cfg.memory.validate(block, Arch::Llama).unwrap();
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let loaded = init::load(&lm, &fixture(name)).unwrap();
    assert!(loaded.fresh.iter().all(|n| n.contains(".attn.expire.")), "{name}: left fresh {:?}", loaded.fresh);
    lm
}

/// The logits of `ids` `(b, t)` read in blocks of `block`, the memory carried, and the
/// states held after the last block (the most of any layer).
fn logits_in_blocks(lm: &Lm, ids: &Tensor, block: i64) -> (Tensor, usize) {
    let _guard = tch::no_grad_guard();
    let mut mem = lm.model.new_memory();
    let t = ids.size()[1];
    let parts: Vec<Tensor> = (0..t)
        .step_by(block as usize)
        .map(|s| lm.model.forward(&ids.narrow(1, s, block.min(t - s)), &mut mem, false).unwrap().logits)
        .collect();
    (Tensor::cat(&parts, 1), mem.reports().iter().map(|r| r.held).max().unwrap_or(0))
}

/// Spans that start at nearly the largest span keep every memory of the text with a
/// mask of exactly 1: in blocks of 6, each key rotated at the place it was written, the
/// logits are `transformers`' over the whole text. Spans of about 1 change them.
#[test]
fn a_predictor_that_keeps_everything_leaves_the_pretrained_logits_unchanged() {
    for name in ["llama3", "smollm2", "qwen2", "qwen3"] {
        let want = expected(name);
        let scale = want["logits"].abs().max().double_value(&[]).max(1.0);
        let (got, held) = logits_in_blocks(&pretrained_with_expire(name, 6, 4096, 0.999), &want["ids"], 6);
        let d = gap(&got, &want["logits"]);
        assert!(d < 1e-5 * scale, "{name}: differs from transformers by {d:.2e}");
        let t = want["ids"].size()[1] as usize;
        assert_eq!(held, t, "{name}: every memory of the text is kept");
        let (short, held) = logits_in_blocks(&pretrained_with_expire(name, 6, 4096, 0.0003), &want["ids"], 6);
        assert!(gap(&short, &want["logits"]) > 1e-3, "{name}: spans of about 1 changed nothing");
        assert!(held < 6, "{name}: spans of about 1 kept {held} memories");
    }
}

/// A small random Llama (grouped keys, query and key norms, Llama 3's scaled rotation)
/// with Expire-Span: largest span 12, ramp 2, blocks of 4, spans varied by a random
/// predictor.
fn small_llama_with_expire(layers: usize) -> Config {
    let mut cfg = Config::default();
    cfg.model.arch = Arch::Llama;
    (cfg.model.vocab, cfg.model.layers, cfg.model.d_model, cfg.model.heads, cfg.model.d_ffn) = (256, layers, 16, 4, 24);
    (cfg.model.llama.kv_heads, cfg.model.llama.qk_norm, cfg.model.llama.rope_factor) = (2, true, 8.0);
    cfg.model.llama.rope_original_positions = 4;
    (cfg.memory.mechanism, cfg.memory.span, cfg.train.block) = (Mechanism::Expire, 12, 4);
    (cfg.memory.expire.ramp, cfg.memory.expire.init_fraction) = (2, 0.4);
    cfg.validate().unwrap();
    cfg
}

/// A model with `base`'s parameters under `base`'s config edited by `edit`.
fn edited(base: &Lm, edit: impl FnOnce(&mut Config)) -> Lm {
    let mut cfg = base.config.clone();
    edit(&mut cfg);
    cfg.validate().unwrap();
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    tch::no_grad(|| {
        for (name, mut p) in lm.named_parameters() {
            p.copy_(&base.vs.variables()[&name]);
        }
    });
    lm
}

fn with_deletion(base: &Lm, deletion: Deletion) -> Lm {
    edited(base, |cfg| cfg.memory.expire.deletion = deletion)
}

/// Deleting the expired memories of each stream (compacting the cache, so the streams'
/// memories sit at different slots) gives the logits of keeping them masked: the keys
/// keep their rotation, and fewer entries are held. Per key-value head too: a memory
/// that one head still sees is kept, for that head alone.
#[test]
fn deleting_expired_memories_gives_the_logits_of_masking_them() {
    for per_head in [false, true] {
        let _seed = lethe::rng::seed_torch(7);
        let mut cfg = small_llama_with_expire(2);
        cfg.memory.expire.per_head = per_head;
        let reference = Lm::new(&cfg, Device::Cpu).unwrap();
        crate::common::randomise(&reference.vs, 17, 1.0, |name| name.ends_with("expire.w"));
        let ids = crate::common::random_tokens(3, 20, &[2, 96]);
        let (masked, window) = logits_in_blocks(&with_deletion(&reference, Deletion::Off), &ids, 4);
        let (deleted, held) = logits_in_blocks(&with_deletion(&reference, Deletion::Stream), &ids, 4);
        let d = gap(&masked, &deleted);
        assert!(d < 1e-5, "per head {per_head}: deletion changed the logits by {d:.2e}");
        assert!(held < window, "per head {per_head}: deletion held {held} states, masking {window}");
        assert!(window <= 12 + 2 + 4, "per head {per_head}: masking held {window} states, beyond L + R + a block");
    }
}

/// `base`'s model with a span predictor per key-value head, every head's column of `w`
/// and entry of `b` the shared predictor's, the other parameters `base`'s; in `base`'s
/// precision.
fn per_head_copy(base: &Lm) -> Lm {
    let mut cfg = base.config.clone();
    cfg.memory.expire.per_head = true;
    cfg.validate().unwrap();
    let mut lm = Lm::new(&cfg, Device::Cpu).unwrap();
    lm.vs.set_kind(base.vs.variables().values().next().unwrap().kind());
    let source = base.vs.variables();
    tch::no_grad(|| {
        for (name, mut p) in lm.named_parameters() {
            let s = &source[&name];
            let s = if s.dim() < p.dim() { s.unsqueeze(-1) } else { s.shallow_clone() };
            p.copy_(&s.expand_as(&p));
        }
    });
    lm
}

/// Per key-value head (`memory.expire.per_head`), predictors that all equal the shared
/// one compute what it computes, on a grouped Llama (4 query heads on 2 key-value
/// heads) and on the papers' backbone (whose shared predictor runs the fused kernel):
/// the logits, and two blocks' loss with the span loss; the shared predictor's gradient
/// is the sum of the heads' (each head's span is its span). Heads that differ change
/// the logits.
#[test]
fn per_head_predictors_that_agree_compute_the_shared_predictor() {
    let mut lethe_cfg = crate::common::tiny_config();
    (lethe_cfg.memory.mechanism, lethe_cfg.memory.span, lethe_cfg.train.block) = (Mechanism::Expire, 12, 4);
    (lethe_cfg.model.vocab, lethe_cfg.model.heads, lethe_cfg.memory.expire.ramp) = (256, 4, 2);
    lethe_cfg.memory.expire.init_fraction = 0.4;
    for mut cfg in [small_llama_with_expire(2), lethe_cfg] {
        let _seed = lethe::rng::seed_torch(5);
        cfg.memory.expire.alpha = 0.5;
        cfg.validate().unwrap();
        let mut shared = Lm::new(&cfg, Device::Cpu).unwrap();
        shared.vs.double();
        crate::common::randomise(&shared.vs, 17, 0.5, |name| name.ends_with("expire.w"));
        let heads = per_head_copy(&shared);
        let arch = cfg.model.arch;
        let w = |lm: &Lm| lm.vs.variables()["layers.0.attn.expire.w"].shallow_clone();
        assert_eq!(w(&heads).size(), [cfg.model.d_model as i64, cfg.model.kv_heads() as i64], "{arch:?}");

        let ids = crate::common::random_tokens(3, 20, &[2, 24]);
        let (want, _) = logits_in_blocks(&shared, &ids, 4);
        let (got, _) = logits_in_blocks(&heads, &ids, 4);
        assert!(gap(&want, &got) < 1e-9, "{arch:?}: logits differ by {:.2e}", gap(&want, &got));

        let x: Vec<i64> = vec![1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5];
        let y: Vec<i64> = x.iter().map(|t| (t * 3 + 1) % 11).collect();
        let losses = [&shared, &heads].map(|lm| {
            let loss = crate::common::two_block_loss(lm, &x, &y, &crate::common::first_block_cache(lm, &x));
            loss.backward();
            loss.double_value(&[])
        });
        assert!((losses[0] - losses[1]).abs() < 1e-9 * losses[0].abs(), "{arch:?}: losses {losses:?}");
        let (g_shared, g_heads) = (w(&shared).grad(), w(&heads).grad().sum_dim_intlist([1i64].as_slice(), false, None));
        let d = gap(&g_shared, &g_heads);
        assert!(d < 1e-9 && g_shared.abs().sum(None).double_value(&[]) > 1e-6, "{arch:?}: gradients differ by {d:.2e}");

        crate::common::randomise(&heads.vs, 23, 0.5, |name| name.ends_with("expire.w"));
        let (apart, _) = logits_in_blocks(&heads, &ids, 4);
        assert!(gap(&want, &apart) > 1e-4, "{arch:?}: heads of their own changed nothing");
    }
}

/// `memory.expire.budget`: at most that many memories a stream after every block, the
/// `kept` figure reporting them; a budget above what the spans keep changes nothing.
#[test]
fn a_budget_caps_the_memories_kept() {
    let _seed = lethe::rng::seed_torch(7);
    let reference = Lm::new(&small_llama_with_expire(2), Device::Cpu).unwrap();
    crate::common::randomise(&reference.vs, 17, 1.0, |name| name.ends_with("expire.w"));
    let ids = crate::common::random_tokens(3, 20, &[2, 96]);
    let with_budget = |budget: usize| edited(&reference, |cfg| cfg.memory.expire.budget = budget);
    let (free, held) = logits_in_blocks(&reference, &ids, 4);
    let (roomy, _) = logits_in_blocks(&with_budget(20), &ids, 4);
    assert!(gap(&free, &roomy) < 1e-6, "a budget above the {held} kept changed the logits");
    let capped = with_budget(3);
    let mut mem = capped.model.new_memory();
    for s in (0..96).step_by(4) {
        tch::no_grad(|| capped.model.forward(&ids.narrow(1, s, 4), &mut mem, false)).unwrap();
        for r in mem.reports() {
            assert!(r.held <= 3 && r.extra("kept").unwrap() <= 3.0, "held {} under a budget of 3", r.held);
        }
    }
    let (tight, _) = logits_in_blocks(&capped, &ids, 4);
    assert!(gap(&free, &tight) > 1e-4, "a budget of 3 against {held} kept changed nothing");
    let mut cfg = reference.config.clone();
    (cfg.memory.expire.budget, cfg.memory.expire.deletion) = (3, Deletion::Batch);
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("memory.expire.budget"), "{e}");
}

/// The gradient of two blocks' loss (the span loss included, alpha 0.5) to the span
/// predictor, every entry, and to entries of the attention's weights equals central
/// finite differences, in double precision: one predictor a layer, and one per
/// key-value head.
#[test]
fn the_span_predictor_s_gradients_equal_finite_differences() {
    for per_head in [false, true] {
        span_predictor_gradients(per_head);
    }
}

fn span_predictor_gradients(per_head: bool) {
    let _seed = lethe::rng::seed_torch(11);
    let mut cfg = small_llama_with_expire(2);
    (cfg.memory.span, cfg.memory.expire.ramp, cfg.memory.expire.init_fraction) = (8, 4, 0.5);
    (cfg.memory.expire.alpha, cfg.memory.expire.per_head) = (0.5, per_head);
    let mut lm = Lm::new(&cfg, Device::Cpu).unwrap();
    lm.vs.double();
    crate::common::randomise(&lm.vs, 17, 0.5, |name| name.ends_with("expire.w"));
    let x: Vec<i64> = vec![1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5];
    let y: Vec<i64> = x.iter().map(|t| (t * 3 + 1) % 11).collect();
    let cache = crate::common::first_block_cache(&lm, &x);
    crate::common::two_block_loss(&lm, &x, &y, &cache).backward();
    let mut predictor = 0.0;
    for (name, p) in lm.named_parameters() {
        let n = p.numel() as i64;
        let picks: Vec<i64> = match name.as_str() {
            _ if name.contains("expire") => (0..n).collect(),
            _ if name.contains("attn.k.") || name.contains("attn.q.") => vec![0, n / 2, n - 1],
            _ => continue,
        };
        let grad = p.grad().flatten(0, -1);
        for idx in picks {
            let analytic = grad.double_value(&[idx]);
            let numeric = crate::common::numeric_grad(&p, idx, || {
                crate::common::two_block_loss(&lm, &x, &y, &cache).double_value(&[])
            });
            let tol = 1e-6 + 1e-4 * analytic.abs().max(numeric.abs());
            let at = format!("per head {per_head}: {name}[{idx}]");
            assert!((analytic - numeric).abs() < tol, "{at}: analytic {analytic} vs numeric {numeric}");
            if name.contains("expire") {
                predictor += analytic.abs();
            }
        }
    }
    assert!(predictor > 1e-4, "per head {per_head}: the soft mask passed no gradient to the predictor ({predictor})");
}

/// `train.freeze_base` on a Llama-family folder with Expire-Span: the run trains the span
/// predictor alone (the checkpoint's other weights are the folder's, bit for bit), and
/// its optimiser keeps moments for the predictor only.
#[test]
fn a_frozen_pretrained_model_trains_only_its_span_predictor() {
    let dir = tempfile::tempdir().unwrap();
    let folder = fixture("smollm2");
    let sets = [
        "train.lr=0.01",
        "train.freeze_base=true",
        "memory.mechanism=\"expire\"",
        "memory.span=32",
        "memory.expire.alpha=0.1",
    ];
    let said = crate::common::cli::fine_tune_fixture(dir.path(), &folder, "frozen", &sets);
    let text = std::fs::read_to_string(dir.path().join("text.txt")).unwrap();
    assert!(said.contains("frozen base: training the memory's"), "{said}");
    let ck = lethe::checkpoint::Checkpoint::load(&dir.path().join("runs/frozen")).unwrap();
    let trained = Lm::from_checkpoint(&ck, Device::Cpu).unwrap();
    let source = pretrained_with_expire("smollm2", 8, 32, 0.5);
    let before = source.vs.variables();
    let mut moved = 0;
    for (name, p) in trained.named_parameters() {
        let same = p.equal(&before[&name]);
        if name.contains(".attn.expire.") {
            moved += usize::from(!same);
            assert!(ck.tensor(&format!("optim.exp_avg.{name}")).is_some(), "{name}: no optimiser state");
        } else {
            assert!(same, "{name}: a frozen weight changed");
            assert!(
                ck.tensor(&format!("optim.exp_avg.{name}")).is_none(),
                "{name}: optimiser state for a frozen weight"
            );
        }
    }
    assert!(moved > 0, "the span predictor did not move");

    // Compared with the folder's key-value policies at each budget: the run's rows hold
    // at most the budget's states, their figures (read through the decoding path) those
    // of scoring the training model alone, to float32 rounding.
    let learned = crate::common::cli::learned_sweep_rows(dir.path(), &folder, "1/2,4", "frozen", "expire");
    assert_eq!(learned.iter().map(|r| r[1].to_string()).collect::<Vec<_>>(), ["1/2", "4", "uncapped"]);
    for (row, budget) in learned.iter().zip([12, 4]) {
        let entries: i64 = row[2].parse().unwrap();
        assert!(entries <= budget, "{entries} states held under a budget of {budget}");
    }
    let text_ids = lethe::data::tokenizer::Tokenizer::from_dir(&folder).unwrap().encode(&text).unwrap();
    let mut cfg = ck.config.clone();
    cfg.memory.expire.budget = 4;
    let capped = Lm::new(&cfg, Device::Cpu).unwrap();
    ck.load_parameters(&capped.vs.variables()).unwrap();
    let r = lethe::eval::evaluate_run_windows(&capped, &text_ids[..49], 1, 24, |_, _| {}).unwrap();
    let csv_ppl: f64 = learned[1][5].parse().unwrap();
    assert!((csv_ppl - r.ppl).abs() < 1e-5 * r.ppl, "{csv_ppl} in budget.csv, {} from the library", r.ppl);
    let csv_mean: f64 = learned[1][3].parse().unwrap();
    assert!(
        (csv_mean - r.mean_held).abs() < 1e-9,
        "{csv_mean} entries in budget.csv, {} from the library",
        r.mean_held
    );
}

/// A fixed window has nothing of its own to train; `as_official`'s zero cache is the
/// papers' backbone's: both refused by name.
#[test]
fn freezing_a_fixed_window_and_official_expire_on_a_llama_are_refused() {
    let mut cfg = small_llama_with_expire(1);
    cfg.train.freeze_base = true;
    cfg.memory.mechanism = Mechanism::Fixed;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("train.freeze_base") && e.contains("nothing to train"), "{e}");
    let mut cfg = small_llama_with_expire(1);
    cfg.memory.expire.as_official = true;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("memory.expire.as_official"), "{e}");
}

/// A Llama pretrained on the copy task (`A^n B^d = a^n .`, the run 24-32 tokens back)
/// with a window of 72, then Expire-Span fitted onto it with the base frozen, its spans
/// starting at 0.9 L of 64 (so that at first it sees what the window saw): the answers
/// stay right while the memory held falls far below the window, the upper layer's below
/// the distance to the run.
#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn a_frozen_llama_learns_spans_that_keep_the_answers_and_expire_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::common::copy_learning_config("llama-copy");
    cfg.model.arch = Arch::Llama;
    (cfg.model.heads, cfg.model.llama.kv_heads) = (4, 2);
    (cfg.memory.mechanism, cfg.memory.span) = (Mechanism::Fixed, 72);
    cfg.train.steps = 1000;
    let pretrained = crate::common::train_and_eval(&cfg, dir.path());
    let answers = pretrained.answer_accuracy.unwrap();
    assert!(answers > 0.8, "the pretrained Llama answered {answers} (chance 0.25)");

    let mut fit = cfg.clone();
    fit.name = "llama-copy-expire".into();
    fit.train.init_from = Some(dir.path().join("llama-copy"));
    (fit.memory.mechanism, fit.memory.span) = (Mechanism::Expire, 64);
    (fit.memory.expire.ramp, fit.memory.expire.init_fraction, fit.memory.expire.alpha) = (8, 0.9, 1e-3);
    (fit.train.freeze_base, fit.train.steps, fit.train.lr) = (true, 400, 1e-2);
    fit.validate().unwrap();
    let fitted = crate::common::train_and_eval(&fit, dir.path());
    let kept = fitted.answer_accuracy.unwrap();
    let mem = fitted.mem_size.iter().sum::<f64>() / fitted.mem_size.len() as f64;
    eprintln!("pretrained: answers {answers}; fitted: answers {kept}, memory per layer {:?}", fitted.mem_size);
    assert!(kept > 0.6, "with Expire-Span fitted the Llama answered {kept} (before: {answers})");
    assert!(mem < 36.0, "a memory of {mem} a layer is not far below the window of 72");
    assert!(fitted.mem_size[1] < 24.0, "the upper layer kept {} memories, the distance is 24-32", fitted.mem_size[1]);
}

/// The logits of `ids` `(b, t)` through the decoding path (`ExpireRun`: the run's
/// decoder with its Expire-Span layers over the key-value cache), read in chunks of
/// `first` tokens and then one at a time, and the entries each layer held at the end.
fn decoded(lm: &Lm, ids: &Tensor, first: i64) -> (Tensor, Vec<i64>) {
    let run = ExpireRun::new(&lm.config, &lm.vs.variables()).unwrap();
    let (llama, mut cache) = (run.decoder(), run.cache().unwrap());
    let t = ids.size()[1];
    let mut parts = vec![llama.forward(&ids.narrow(1, 0, first), &mut cache)];
    parts.extend((first..t).map(|s| llama.forward(&ids.narrow(1, s, 1), &mut cache)));
    (Tensor::cat(&parts, 1), cache.entries())
}

/// Expire-Span through the decoding path computes what the training model computes:
/// the text read token by token, or its first 16 tokens in one chunk (without a budget
/// the chunking changes nothing), with one span a layer and one per key-value head, the
/// two streams keeping different numbers of entries; under a budget of 3, token by token
/// on both sides; with low-rank adapters, folded into the maps. Expired entries are freed.
#[test]
fn the_decoding_path_reads_expire_span_as_the_training_model_does() {
    for (per_head, budget, lora) in [(false, 0, 0), (true, 0, 0), (false, 3, 0), (true, 3, 0), (false, 0, 2)] {
        let _seed = lethe::rng::seed_torch(7);
        let mut cfg = small_llama_with_expire(2);
        (cfg.memory.expire.per_head, cfg.memory.expire.budget) = (per_head, budget);
        (cfg.train.lora_rank, cfg.train.freeze_base) = (lora, lora > 0);
        cfg.validate().unwrap();
        let lm = Lm::new(&cfg, Device::Cpu).unwrap();
        // The adapters' `B` starts at zero: given weights, they change the maps.
        crate::common::randomise(&lm.vs, 17, 1.0, |name| name.ends_with("expire.w") || name.contains("lora"));
        let ids = crate::common::random_tokens(3, 20, &[2, 40]);
        let (want, held) = logits_in_blocks(&lm, &ids, 1);
        let firsts: &[i64] = if budget == 0 { &[1, 16] } else { &[1] };
        for &first in firsts {
            let (got, entries) = decoded(&lm, &ids, first);
            let d = gap(&want, &got);
            let case = format!("per head {per_head}, budget {budget}, adapters {lora}, first chunk {first}");
            assert!(d < 1e-5, "{case}: differs from the training model by {d:.2e}");
            let most = *entries.iter().max().unwrap();
            assert!(most < 40 && most as usize <= held.max(1), "{case}: {entries:?} held, the training model {held}");
        }
    }
}

/// The small Llama with a span predictor per key-value head, varied at random (seed 7),
/// under `memory.expire.budget = budget`.
fn per_head_expire(budget: usize) -> Lm {
    let _seed = lethe::rng::seed_torch(7);
    let mut cfg = small_llama_with_expire(2);
    (cfg.memory.expire.per_head, cfg.memory.expire.budget) = (true, budget);
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    crate::common::randomise(&lm.vs, 17, 1.0, |name| name.ends_with("expire.w"));
    lm
}

/// In bfloat16 the decoding path reads Expire-Span as in float32 to bfloat16's rounding:
/// the decoder and its cache in bfloat16 (half the bytes a key and value), the span
/// predictors in float32, the same entries held at the end, with and without a budget.
#[test]
fn in_bfloat16_the_decoding_path_reads_expire_span_as_in_float32() {
    use lethe::config::train::Precision;
    for budget in [0, 3] {
        let lm = per_head_expire(budget);
        let ids = crate::common::random_tokens(3, 20, &[2, 30]);
        let read = |run: &ExpireRun| {
            let mut cache = run.cache().unwrap();
            let steps: Vec<Tensor> = (0..30).map(|t| run.decoder().forward(&ids.narrow(1, t, 1), &mut cache)).collect();
            (Tensor::cat(&steps, 1), cache)
        };
        let (want, want_cache) = read(&ExpireRun::new(&lm.config, &lm.vs.variables()).unwrap());
        let half = ExpireRun::new(&lm.config, &lm.vs.variables()).unwrap().into_precision(Precision::Bf16);
        assert_eq!(half.decoder().kind(), Kind::BFloat16);
        let (got, cache) = read(&half);
        // Each token's largest difference from float32: bfloat16's rounding, except where
        // a budget meets two entries of nearly the same remaining span and keeps the
        // other one for a token.
        let per_token = Vec::<f64>::try_from((&got - &want).abs().amax([0i64, 2].as_slice(), false)).unwrap();
        let scale = want.abs().max().double_value(&[]);
        let apart = per_token.iter().filter(|&&d| d > 0.02 * scale).count();
        println!("budget {budget}: bf16 from f32 by token {per_token:.4?}, logits up to {scale:.2}");
        assert!(per_token.iter().all(|&d| d > 0.0), "budget {budget}: bf16 reads as f32 to the bit");
        assert!(apart <= usize::from(budget > 0), "budget {budget}: {apart} tokens differ by more than rounding");
        let positions = |c: &lethe::model::llama::KvCache| {
            c.layers
                .iter()
                .map(|h| Vec::<i64>::try_from(h.as_ref().unwrap().positions.flatten(0, -1)).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(positions(&cache), positions(&want_cache), "budget {budget}: entries held");
        assert_eq!(2 * cache.kv_bytes(), want_cache.kv_bytes(), "budget {budget}: bytes of keys and values");
    }
}

/// A forked Expire-Span cache carries the spans of what it holds: continued apart from
/// its original, a token each in turns, it gives the logits and keeps the entries of a
/// cache that read the prompt and its continuation alone, with and without a budget.
#[test]
fn a_forked_expire_span_cache_reads_on_as_its_original_would_have() {
    for budget in [0, 3] {
        let lm = per_head_expire(budget);
        let run = ExpireRun::new(&lm.config, &lm.vs.variables()).unwrap();
        let ids = crate::common::random_tokens(3, 20, &[2, 30]);
        let llama = run.decoder();
        let step = |cache: &mut lethe::model::llama::KvCache, t: i64| llama.forward(&ids.narrow(1, t, 1), cache);
        let mut cache = run.cache().unwrap();
        (0..14).for_each(|t| drop(step(&mut cache, t)));
        let mut fork = cache.fork();
        let (mut first, mut second) = (vec![], vec![]);
        for t in 0..16 {
            first.push(step(&mut cache, 14 + t));
            second.push(step(&mut fork, 2 + t));
        }
        for (got, forked, from) in [(first, &cache, 14), (second, &fork, 2)] {
            let mut alone = run.cache().unwrap();
            (0..14).for_each(|t| drop(step(&mut alone, t)));
            let want: Vec<Tensor> = (from..from + 16).map(|t| step(&mut alone, t)).collect();
            let same = Tensor::cat(&got, 1).equal(&Tensor::cat(&want, 1));
            assert!(same, "budget {budget}: a continuation's logits differ from a cache that read it alone");
            assert_eq!(forked.entries(), alone.entries(), "budget {budget}: entries held");
        }
    }
}

/// A learned cache saved ([`KvCache::state`], each tensor copied) and made again from a
/// fresh cache of the run (`restored`) reads on as the original: the same logits, the
/// same entries, with and without a budget; a state without its spans, with spans or
/// expiries of another shape than the entries held, or with spans for a layer that holds
/// none, is refused in one line naming the tensor. The run's memory has one fingerprint whatever its decoder's
/// precision, and another with another predictor or another largest span.
#[test]
fn a_saved_expire_span_cache_reads_on_as_its_original() {
    use lethe::config::train::Precision;
    use lethe::model::llama::KvCache;
    for budget in [0, 3] {
        let lm = per_head_expire(budget);
        let run = ExpireRun::new(&lm.config, &lm.vs.variables()).unwrap();
        let ids = crate::common::random_tokens(3, 20, &[2, 30]);
        let step = |cache: &mut KvCache, t: i64| run.decoder().forward(&ids.narrow(1, t, 1), cache);
        let mut cache = run.cache().unwrap();
        (0..14).for_each(|t| drop(step(&mut cache, t)));
        let saved: Vec<(String, Tensor)> = cache.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
        assert!(saved.iter().any(|(n, _)| n.ends_with(".policy.spans")), "budget {budget}: no spans saved");
        let mut loaded =
            run.cache().unwrap().restored(saved.iter().map(|(n, t)| (n.clone(), t.copy())).collect()).unwrap();
        assert_eq!(loaded.entries(), cache.entries(), "budget {budget}: entries loaded");
        let want: Vec<Tensor> = (14..30).map(|t| step(&mut cache, t)).collect();
        let got: Vec<Tensor> = (14..30).map(|t| step(&mut loaded, t)).collect();
        assert!(Tensor::cat(&got, 1).equal(&Tensor::cat(&want, 1)), "budget {budget}: the loaded cache reads on apart");
        assert_eq!(loaded.entries(), cache.entries(), "budget {budget}: entries held at the end");

        let refused = |state: Vec<(String, Tensor)>| {
            run.cache().unwrap().restored(state).err().expect("a damaged state was read").to_string()
        };
        let edited = |name: &str, edit: &dyn Fn(&Tensor) -> Tensor| {
            saved.iter().map(|(n, t)| (n.clone(), if n == name { edit(t) } else { t.copy() })).collect::<Vec<_>>()
        };
        let without = saved.iter().filter(|(n, _)| n != "layers.1.policy.spans");
        let err = refused(without.map(|(n, t)| (n.clone(), t.copy())).collect());
        assert!(err.contains("layers.1.policy") && err.contains("go together") && !err.contains('\n'), "{err}");
        let err = refused(edited("layers.0.policy.spans", &|t| t.narrow(2, 0, 2)));
        assert!(
            err.contains("`layers.0.policy`: `spans`: of shape [2, 2, 2], where the entries held make [2, 2, "),
            "{err}"
        );
        let err = refused(edited("layers.1.policy.expiry", &|t| t.narrow(0, 0, 1)));
        assert!(err.contains("`layers.1.policy`: `expiry`: of shape [1, "), "{err}");
        let spans_alone = saved.iter().filter(|(n, _)| !n.starts_with("layers.1.") || n.contains(".policy."));
        let err = refused(spans_alone.map(|(n, t)| (n.clone(), t.copy())).collect());
        assert!(err.contains("`layers.1.policy`: `spans`: kept for a layer that holds no entry"), "{err}");
    }
    let lm = per_head_expire(0);
    let print = |lm: &Lm| ExpireRun::new(&lm.config, &lm.vs.variables()).unwrap().memory_fingerprint().to_string();
    let own = print(&lm);
    let half = ExpireRun::new(&lm.config, &lm.vs.variables()).unwrap().into_precision(Precision::Bf16);
    assert_eq!(half.memory_fingerprint(), own, "in bfloat16");
    assert_eq!(print(&per_head_expire(3)), own, "the budget is the cache's, not the memory's");
    let wider = edited(&lm, |cfg| cfg.memory.span *= 2);
    assert_ne!(print(&wider), own, "another largest span");
    crate::common::randomise(&lm.vs, 18, 1.0, |name| name == "layers.1.attn.expire.b");
    assert_ne!(print(&lm), own, "another predictor");
}

/// `ExpireRun` caps a cache at the budget asked (`cache_at`) where the run's own cache
/// holds more, and refuses a run without Expire-Span in one line naming its memory.
#[test]
fn an_expire_run_caps_on_request_and_refuses_other_memories() {
    let _seed = lethe::rng::seed_torch(7);
    let cfg = small_llama_with_expire(2);
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    crate::common::randomise(&lm.vs, 17, 1.0, |name| name.ends_with("expire.w"));
    let run = ExpireRun::new(&cfg, &lm.vs.variables()).unwrap();
    let ids = crate::common::random_tokens(3, 20, &[1, 12]);
    let most_held = |mut cache: lethe::model::llama::KvCache| {
        for s in 0..12 {
            let _ = run.decoder().forward(&ids.narrow(1, s, 1), &mut cache);
        }
        cache.entries().into_iter().max().unwrap()
    };
    let (own, capped) = (most_held(run.cache().unwrap()), most_held(run.cache_at(3).unwrap()));
    assert!(own > 3, "the run's own cache held {own} entries at most: the cap would change nothing");
    assert_eq!(capped, 3, "capped at 3, the cache held {capped} entries at most");
    let mut fixed = cfg.clone();
    fixed.memory.mechanism = Mechanism::Fixed;
    let lm = Lm::new(&fixed, Device::Cpu).unwrap();
    let err = ExpireRun::new(&fixed, &lm.vs.variables()).err().expect("a run without Expire-Span was read").to_string();
    assert!(err.contains("memory.mechanism = \"fixed\"") && !err.contains('\n'), "{err}");
}

/// `lethe eval --learned` scores Expire-Span on a Llama through the decoding path: the
/// figures of the training model read in windows token by token (deletion per stream,
/// a budget applied after each token on both sides), with the same entries held.
#[test]
fn scoring_through_the_decoding_path_gives_the_training_models_figures() {
    for (per_head, budget) in [(false, 0), (true, 0), (false, 3)] {
        let _seed = lethe::rng::seed_torch(11);
        let mut cfg = small_llama_with_expire(2);
        (cfg.memory.expire.per_head, cfg.memory.expire.budget) = (per_head, budget);
        (cfg.memory.expire.deletion, cfg.train.block) = (Deletion::Stream, 1);
        cfg.validate().unwrap();
        let lm = Lm::new(&cfg, Device::Cpu).unwrap();
        crate::common::randomise(&lm.vs, 17, 1.0, |name| name.ends_with("expire.w"));
        let ids: Vec<lethe::data::Token> = (0..50).map(|i| ((i * 37 + 11) % 251) as lethe::data::Token).collect();
        let want = lethe::eval::evaluate_run_windows(&lm, &ids, 1, 20, |_, _| {}).unwrap();
        let run = ExpireRun::new(&cfg, &lm.vs.variables()).unwrap();
        let got =
            lethe::eval::evaluate_decoder_windows_over(run.decoder(), || run.cache(), &ids, 1, 20, |_, _| {}).unwrap();
        let case = format!("per head {per_head}, budget {budget}");
        assert!((want.loss - got.loss).abs() < 1e-5, "{case}: loss {} against {}", got.loss, want.loss);
        assert_eq!((got.tokens, got.accuracy), (want.tokens, want.accuracy), "{case}");
        assert_eq!(got.held, want.held, "{case}: the most entries held");
        assert!((got.mean_held - want.mean_held).abs() < 1e-9, "{case}: {} against {}", got.mean_held, want.mean_held);
        assert!(want.mean_held < 12.0, "{case}: {} entries held on average; the spans free few", want.mean_held);
    }
}

/// `lethe generate --checkpoint` of Expire-Span fitted onto a Llama decodes through the
/// key-value cache with the run's span predictors: greedy, the ids the training model
/// continues the prompt with.
#[test]
fn generation_from_an_expire_span_run_gives_the_training_models_ids() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sets = ["train.freeze_base=true", "memory.mechanism=\"expire\"", "memory.span=16", "memory.expire.ramp=4"];
    crate::common::cli::fine_tune_fixture(d, &fixture("smollm2"), "fitted", &sets);
    let prompt: Vec<u32> = (0..30).map(|i| (i * 7 + 3) % 300).collect();
    let ckpt = lethe::checkpoint::Checkpoint::load(&d.join("runs/fitted")).unwrap();
    let lm = Lm::from_checkpoint(&ckpt, Device::Cpu).unwrap();
    let greedy = lethe::generate::Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 };
    let want = lethe::generate::generate(&lm, &prompt, 10, &greedy, |_| {}).unwrap();
    let want: Vec<String> = want.iter().map(u32::to_string).collect();
    let prompt_ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let args = ["generate", "--checkpoint", "runs/fitted", "--prompt-ids", &prompt_ids.join(",")];
    let out =
        crate::common::cli::lethe(d, &[&args[..], &["--print-ids", "--temperature", "0", "--tokens", "10"]].concat());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want.join(","));
    // The cache freed what expired: fewer than the 39 tokens read.
    let held: usize =
        said.split("cache (expire, f32): ").nth(1).and_then(|s| s.split(' ').next()).unwrap().parse().unwrap();
    assert!(held < 30, "{held} entries held: {said}");
}

/// A run with a span predictor per key-value head started from a run with one a layer is
/// refused in one line naming the parameter and the setting that shapes it.
#[test]
fn a_per_head_fit_from_a_shared_run_names_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sets = ["train.freeze_base=true", "memory.mechanism=\"expire\"", "memory.span=16"];
    crate::common::cli::fine_tune_fixture(d, &fixture("smollm2"), "shared", &sets);
    let mut args = vec!["train", "--init-from", "runs/shared", "--data", "text.txt", "--steps", "1", "--name", "heads"];
    for s in sets.iter().chain(&["memory.expire.per_head=true", "train.block=8"]) {
        args.extend(["--set", s]);
    }
    let out = crate::common::cli::lethe(d, &args);
    crate::common::cli::fails_with(&out, &["layers.0.attn.expire.", "`memory.expire.per_head`"]);
    assert!(!d.join("runs/heads/checkpoint.safetensors").exists(), "a refused run wrote a checkpoint");
}
