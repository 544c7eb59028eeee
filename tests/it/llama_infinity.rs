//! The ∞-former on a Llama-family decoder (`model.arch = "llama"`, `memory.mechanism =
//! "infinity"`): the short-term memory is the window of keys rotated at the places they
//! were written, the long-term memory is read with the model's own queries before their
//! rotation (its keys live on the signal's axis, not at token positions), and its
//! contribution is added to the attention's output. A long-term memory that adds nothing
//! leaves a pretrained model's logits as its window gives them; the gradients of every
//! long-term memory parameter equal finite differences; `train.freeze_base` trains the
//! long-term memory alone; a head width other than `d_model / heads` is refused by name.

use crate::common::llama::{expected, fixture, gap};

use lethe::config::{Arch, Config, Mechanism};
use lethe::model::{init, Lm};
use tch::{Device, Kind, Tensor};

/// The fixture `name` in the backbone with `mechanism` and a window of `span`, read in
/// blocks of 6; the ∞-former's long-term memory a basis of 8 with 16 samples, its output
/// map starting at zero (`memory.infinity.zero_output`).
fn pretrained(name: &str, mechanism: Mechanism, span: usize) -> Lm {
    let mut cfg = Config::default();
    init::adopt(&mut cfg, &fixture(name)).unwrap();
    assert_eq!(cfg.model.arch, Arch::Llama);
    (cfg.memory.mechanism, cfg.memory.span, cfg.train.block) = (mechanism, span, 6);
    (cfg.memory.infinity.basis, cfg.memory.infinity.samples) = (8, 16);
    cfg.memory.infinity.zero_output = true;
    cfg.memory.validate(6, Arch::Llama).unwrap();
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let loaded = init::load(&lm, &fixture(name)).unwrap();
    assert!(loaded.fresh.iter().all(|n| n.contains(".attn.ltm.")), "{name}: left fresh {:?}", loaded.fresh);
    lm
}

/// The logits of `ids` `(b, t)` read in blocks of 6, the memory carried.
fn logits_in_blocks(lm: &Lm, ids: &Tensor) -> Tensor {
    let _guard = tch::no_grad_guard();
    let mut mem = lm.model.new_memory();
    let t = ids.size()[1];
    let parts: Vec<Tensor> = (0..t)
        .step_by(6)
        .map(|s| lm.model.forward(&ids.narrow(1, s, 6.min(t - s)), &mut mem, false).unwrap().logits)
        .collect();
    Tensor::cat(&parts, 1)
}

/// With its output map starting at zero the long-term memory adds nothing: the logits
/// are the window's (and, with a window over the whole text, `transformers`'); with the
/// output map drawn at random, the states that left the window change them.
#[test]
fn a_long_term_memory_that_adds_nothing_leaves_the_pretrained_logits_unchanged() {
    for name in ["llama3", "smollm2", "qwen2"] {
        let want = expected(name);
        let ids = &want["ids"];
        let scale = want["logits"].abs().max().double_value(&[]).max(1.0);
        let whole = pretrained(name, Mechanism::Infinity, 4096);
        let d = gap(&logits_in_blocks(&whole, ids), &want["logits"]);
        assert!(d < 1e-5 * scale, "{name}: a window over the whole text differs from transformers by {d:.2e}");

        let window = logits_in_blocks(&pretrained(name, Mechanism::Fixed, 6), ids);
        let short = pretrained(name, Mechanism::Infinity, 6);
        let d = gap(&logits_in_blocks(&short, ids), &window);
        assert!(d < 1e-5 * scale, "{name}: an ∞-former adding nothing differs from its window by {d:.2e}");
        crate::common::randomise(&short.vs, 2, 0.5, |n| n.ends_with("ltm.o"));
        let d = gap(&logits_in_blocks(&short, ids), &window);
        assert!(d > 1e-4, "{name}: the long-term memory changed nothing ({d:.2e})");
    }
}

/// A head width that is not `d_model / heads` (Qwen3's fixture: 4 heads of 16 over 32)
/// is refused by the field's name, before anything is built.
#[test]
fn a_head_width_other_than_d_model_over_heads_is_refused() {
    let mut cfg = Config::default();
    init::adopt(&mut cfg, &fixture("qwen3")).unwrap();
    (cfg.memory.mechanism, cfg.memory.span, cfg.train.block) = (Mechanism::Infinity, 6, 6);
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("model.llama.head_dim") && e.contains("4 heads x 16 make 64"), "{e}");
}

/// A small random Llama (grouped keys, query and key norms, Llama 3's scaled rotation)
/// with the ∞-former: a window of 4, blocks of 4, a basis of 8, 16 samples, 8 bins.
fn small_llama_with_infinity() -> Config {
    let mut cfg = Config::default();
    cfg.model.arch = Arch::Llama;
    (cfg.model.vocab, cfg.model.layers, cfg.model.d_model, cfg.model.heads, cfg.model.d_ffn) = (256, 1, 16, 4, 24);
    (cfg.model.llama.kv_heads, cfg.model.llama.qk_norm, cfg.model.llama.rope_factor) = (2, true, 8.0);
    cfg.model.llama.rope_original_positions = 4;
    (cfg.memory.mechanism, cfg.memory.span, cfg.train.block) = (Mechanism::Infinity, 4, 4);
    let i = &mut cfg.memory.infinity;
    (i.basis, i.widths, i.samples, i.bins, i.kl_coef) = (8, vec![0.1, 0.3], 16, 8, 0.01);
    cfg.validate().unwrap();
    cfg
}

const X: [i64; 40] = [
    1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5, 7, 7, 2, 9, //
    0, 3, 8, 6, 6, 2, 11, 4, 1, 0, 5, 9, 3, 3, 8, 2, 7, 1, 4, 6,
];

/// The gradient of the fourth block's loss (the KL term included), given the memory of
/// the first three (the long-term memory holding 4 states, 4 more waiting to be
/// absorbed), to entries of every long-term memory parameter and of the rotated query
/// map, equals central finite differences in double precision.
#[test]
fn the_long_term_memory_s_gradients_equal_finite_differences() {
    let _seed = lethe::rng::seed_torch(13);
    let mut lm = Lm::new(&small_llama_with_infinity(), Device::Cpu).unwrap();
    lm.vs.double();
    let state = crate::common::memory_after(&lm, &X, 3, 4);
    assert!(state.iter().any(|(n, _)| n.ends_with(".ltm")), "the long-term memory holds nothing");
    let loss = || {
        let (task, aux) = crate::common::block_losses(&lm, &X, 3, 4, &state);
        task + aux
    };
    loss().backward();
    let params = lm.named_parameters();
    for suffix in
        ["ltm.mu", "ltm.sigma_w", "ltm.sigma_b", "ltm.gate_w", "ltm.gate_b", "ltm.k", "ltm.v", "ltm.o", "attn.q.weight"]
    {
        let (_, p) = params.iter().find(|(n, _)| n.ends_with(suffix)).unwrap_or_else(|| panic!("no {suffix}"));
        let grad = p.grad().flatten(0, -1);
        assert!(grad.abs().sum(Kind::Double).double_value(&[]) > 0.0, "no gradient reached {suffix}");
        for idx in [0i64, 5].into_iter().filter(|&i| i < p.numel() as i64) {
            let analytic = grad.double_value(&[idx]);
            let numeric = crate::common::numeric_grad(p, idx, || loss().double_value(&[]));
            assert!(
                (analytic - numeric).abs() < 1e-6 + 1e-4 * numeric.abs(),
                "{suffix}[{idx}]: {analytic} vs {numeric}"
            );
        }
    }
}

/// `train.freeze_base` on a Llama-family folder with the ∞-former: the run trains the
/// long-term memory alone (the folder's weights unchanged, bit for bit, without
/// optimiser state).
#[test]
fn a_frozen_pretrained_model_trains_only_its_long_term_memory() {
    let dir = tempfile::tempdir().unwrap();
    let folder = fixture("smollm2");
    let sets = [
        "train.lr=0.01",
        "train.freeze_base=true",
        "memory.mechanism=\"infinity\"",
        "memory.span=8",
        "memory.infinity.basis=8",
        "memory.infinity.samples=16",
    ];
    let said = crate::common::cli::fine_tune_fixture(dir.path(), &folder, "frozen", &sets);
    assert!(said.contains("frozen base: training the memory's"), "{said}");
    let ck = lethe::checkpoint::Checkpoint::load(&dir.path().join("runs/frozen")).unwrap();
    let trained = Lm::from_checkpoint(&ck, Device::Cpu).unwrap();
    let before = pretrained("smollm2", Mechanism::Infinity, 8).vs.variables();
    let mut pushed = 0;
    for (name, p) in trained.named_parameters() {
        let moments = ck.tensor(&format!("optim.exp_avg.{name}"));
        if name.contains(".attn.ltm.") {
            let moments = moments.unwrap_or_else(|| panic!("{name}: no optimiser state"));
            pushed += usize::from(moments.abs().sum(Kind::Double).double_value(&[]) > 0.0);
        } else {
            assert!(p.equal(&before[&name]), "{name}: a frozen weight changed");
            assert!(moments.is_none(), "{name}: optimiser state for a frozen weight");
        }
    }
    assert!(pushed > 0, "no gradient reached the long-term memory");

    // Beside the folder's policies: scored once, at its trained memory, in blocks of its
    // own train.block, with the entries held (window, states waiting, basis).
    let text = std::fs::read_to_string(dir.path().join("text.txt")).unwrap();
    let learned = crate::common::cli::learned_sweep_rows(dir.path(), &folder, "1/2", "frozen", "infinity");
    assert_eq!(learned.iter().map(|r| r[1].to_string()).collect::<Vec<_>>(), ["uncapped"]);
    let entries: i64 = learned[0][2].parse().unwrap();
    assert!(entries <= 8 + 8 + 8, "{entries} entries held by a window of 8, a block of 8 waiting and 8 coefficients");
    let text_ids = lethe::data::tokenizer::Tokenizer::from_dir(&folder).unwrap().encode(&text).unwrap();
    let r = lethe::eval::evaluate_run_windows(&trained, &text_ids[..49], 8, 24, |_, _| {}).unwrap();
    let csv_ppl: f64 = learned[0][5].parse().unwrap();
    assert!((csv_ppl - r.ppl).abs() < 1e-9 * r.ppl, "{csv_ppl} in budget.csv, {} from the library", r.ppl);
}
