//! ∞-former end to end: queries reach the long-term memory, gradients through μ, σ,
//! the gate and the projections match finite differences, the memory stays bounded
//! however long the stream, and sticky memories sample where attention went.

use lethe::config::{Config, Mechanism};
use lethe::model::Lm;
use tch::{Device, Kind, Tensor};

/// One layer, STM of 4, blocks of 4, a basis of 8 functions, 16 samples, 8 bins.
fn infinity_config() -> Config {
    let mut c = crate::common::tiny_config();
    c.memory.mechanism = Mechanism::Infinity;
    c.memory.span = 4;
    c.train.block = 4;
    let i = &mut c.memory.infinity;
    i.basis = 8;
    i.widths = vec![0.1, 0.3];
    i.samples = 16;
    i.bins = 8;
    i.kl_coef = 0.01;
    c
}

fn param(lm: &Lm, suffix: &str) -> Tensor {
    lm.named_parameters().into_iter().find(|(n, _)| n.ends_with(suffix)).unwrap_or_else(|| panic!("no {suffix}")).1
}

const X: [i64; 40] = [
    1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5, 7, 7, 2, 9, //
    0, 3, 8, 6, 6, 2, 11, 4, 1, 0, 5, 9, 3, 3, 8, 2, 7, 1, 4, 6,
];

/// The memory after three blocks of 4 (2 streams): the STM holds 4 states, the LTM the
/// 4 absorbed at block 3, and 4 more wait to be absorbed.
fn three_block_memory(lm: &Lm) -> Vec<(String, Tensor)> {
    crate::common::memory_after(lm, &X, 3, 4)
}

/// Task and auxiliary loss of the fourth block, given the memory of the first three.
fn fourth_block_losses(lm: &Lm, state: &[(String, Tensor)]) -> (Tensor, Tensor) {
    crate::common::block_losses(lm, &X, 3, 4, state)
}

fn replace(state: &[(String, Tensor)], name: &str, f: impl Fn(&Tensor) -> Tensor) -> Vec<(String, Tensor)> {
    state.iter().map(|(n, t)| (n.clone(), if n.ends_with(name) { f(t) } else { t.copy() })).collect()
}

#[test]
fn queries_see_the_long_term_memory() {
    let lm = Lm::new(&infinity_config(), Device::Cpu).unwrap();
    let state = three_block_memory(&lm);
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        vec!["layers.0.cache", "layers.0.ltm", "layers.0.incoming", "layers.0.histogram", "layers.0.absorbed"]
    );
    let (task, _) = fourth_block_losses(&lm, &state);
    let (task2, _) = fourth_block_losses(&lm, &replace(&state, "ltm", |t| t + 1.0));
    assert!((task.double_value(&[]) - task2.double_value(&[])).abs() > 1e-4, "the LTM does not reach the loss");
    let mut mem = lm.model.new_memory();
    mem.load_state(&state).unwrap();
    let _ = tch::no_grad(|| lm.model.forward(&crate::common::tokens(&X, 2).narrow(1, 12, 4), &mut mem, false).unwrap());
    let r = &mem.reports()[0];
    assert_eq!(r.mem_size, 4.0 + 8.0, "4 STM positions plus 8 basis coefficients");
    assert_eq!(r.extra("ltm_tokens"), Some(8.0));
    let (name, hist) = &r.series[0];
    assert_eq!((name.as_str(), hist.len()), ("ltm_attention", 8));
    assert!((hist.iter().sum::<f64>() - 1.0).abs() < 1e-6, "{hist:?}");
    let fit = r.extra("ltm_fit_error").unwrap();
    assert!(fit > 0.0 && fit < 1.0, "relative regression error {fit}");
}

#[test]
fn gradients_through_mu_sigma_gate_and_projections_match_finite_differences() {
    let mut lm = Lm::new(&infinity_config(), Device::Cpu).unwrap();
    lm.vs.double();
    let state = three_block_memory(&lm);
    let loss = || {
        let (task, aux) = fourth_block_losses(&lm, &state);
        task + aux
    };
    loss().backward();
    for name in
        ["ltm.mu", "ltm.sigma_w", "ltm.sigma_b", "ltm.gate_w", "ltm.gate_b", "ltm.k", "ltm.v", "ltm.o", "attn.q.weight"]
    {
        let p = param(&lm, name);
        let grad = p.grad().flatten(0, -1);
        assert!(grad.abs().sum(Kind::Double).double_value(&[]) > 0.0, "no gradient reached {name}");
        for idx in [0i64, 5] {
            if idx >= p.numel() as i64 {
                continue;
            }
            let analytic = grad.double_value(&[idx]);
            let numeric = crate::common::numeric_grad(&p, idx, || loss().double_value(&[]));
            assert!((analytic - numeric).abs() < 1e-6 + 1e-4 * numeric.abs(), "{name}[{idx}]: {analytic} vs {numeric}");
        }
    }
}

#[test]
fn the_kl_regulariser_matches_its_formula() {
    let lm = Lm::new(&infinity_config(), Device::Cpu).unwrap();
    let state = three_block_memory(&lm);
    let (_, aux) = fourth_block_losses(&lm, &state);
    let mut mem = lm.model.new_memory();
    mem.load_state(&state).unwrap();
    let _ = tch::no_grad(|| lm.model.forward(&crate::common::tokens(&X, 2).narrow(1, 12, 4), &mut mem, true).unwrap());
    let kl = mem.reports()[0].extra("ltm_kl").unwrap();
    assert!((aux.double_value(&[]) - 0.01 * kl).abs() < 1e-6 * kl, "aux {} vs 0.01 x {kl}", aux.double_value(&[]));
    assert!(kl >= 0.0);
}

#[test]
fn the_memory_stays_bounded_however_long_the_stream() {
    let lm = Lm::new(&infinity_config(), Device::Cpu).unwrap();
    let mut mem = lm.model.new_memory();
    let x = crate::common::tokens(&X, 2);
    tch::no_grad(|| {
        for i in 0..30 {
            lm.model.forward(&x.narrow(1, 4 * (i % 5), 4), &mut mem, false).unwrap();
        }
    });
    let r = &mem.reports()[0];
    // STM 4 + waiting 4 + N 8, after 120 tokens.
    assert_eq!(r.held, 16);
    assert_eq!(r.extra("ltm_tokens"), Some(4.0 * 28.0), "blocks 3..30 each absorbed 4 states");
    let state = mem.state();
    let ltm = &state.iter().find(|(n, _)| n.ends_with("ltm")).unwrap().1;
    assert_eq!(ltm.size(), vec![2, 8, 16]);
    assert!(bool::try_from(ltm.isfinite().all()).unwrap());
    mem.reset();
    assert_eq!(mem.reports()[0].held, 0);
}

/// The coefficients after the fourth block, with `sticky` and a histogram set by `hist`.
fn ltm_after_fourth_block(sticky: bool, hist: &dyn Fn(&Tensor) -> Tensor) -> Tensor {
    let mut cfg = infinity_config();
    cfg.memory.infinity.sticky = sticky;
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let state = replace(&three_block_memory(&lm), "histogram", hist);
    let mut mem = lm.model.new_memory();
    mem.load_state(&state).unwrap();
    let _ = tch::no_grad(|| lm.model.forward(&crate::common::tokens(&X, 2).narrow(1, 12, 4), &mut mem, false).unwrap());
    mem.state().into_iter().find(|(n, _)| n.ends_with("ltm")).unwrap().1
}

#[test]
fn sticky_memories_sample_where_the_attention_went() {
    let plain = ltm_after_fourth_block(false, &|h| h.copy());
    // A flat histogram: the sticky positions are the even ones.
    let flat = ltm_after_fourth_block(true, &|h| h.ones_like());
    let diff = (&flat - &plain).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "flat sticky vs even sampling differ by {diff}");
    // All attention on the first bin: the old signal is sampled only in [0, 1/8), so
    // the new LTM differs.
    let focused = ltm_after_fourth_block(true, &|h| {
        let z = h.zeros_like();
        let _ = z.narrow(1, 0, 1).fill_(1.0);
        z
    });
    let moved = (&focused - &plain).abs().max().double_value(&[]);
    assert!(moved > 1e-3, "a focused histogram changed the LTM by only {moved}");
}

#[test]
fn the_attention_histogram_is_a_distribution_over_the_bins() {
    let lm = Lm::new(&infinity_config(), Device::Cpu).unwrap();
    let state = three_block_memory(&lm);
    let hist = &state.iter().find(|(n, _)| n.ends_with("histogram")).unwrap().1;
    assert_eq!(hist.size(), vec![2, 8]);
    let row_sums = hist.sum_dim_intlist([1i64].as_slice(), false, Kind::Double);
    // Summed over 2 heads x 4 queries: each density gives [0, 1] at most its whole mass.
    let sums: Vec<f64> = row_sums.try_into().unwrap();
    for s in sums {
        assert!(s > 0.0 && s <= 8.0 + 1e-4, "bin masses sum to {s}");
    }
}

#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn a_tiny_infinity_former_learns_to_sort_by_frequency() {
    let dir = tempfile::tempdir().unwrap();
    // 4 symbols, sequences of 96: the STM of 16 (plus the block of 16) sees a third of
    // a sequence, the LTM all of it.
    let mut cfg = Config::preset("sorting-infinity-tiny").unwrap();
    cfg.name = "sort-infinity".into();
    cfg.data.sorting.symbols = 4;
    cfg.data.sorting.length = 96;
    cfg.data.sorting.eval_tokens = 8192;
    cfg.memory.span = 16;
    cfg.train.block = 16;
    cfg.train.steps = 600;
    cfg.train.eval_every = 0;
    cfg.train.log_every = 100;
    let r = crate::common::train_and_eval(&cfg, dir.path());
    eprintln!("∞-former sorting accuracy {} (chance 0.25), loss {}", r.accuracy, r.loss);
    assert!(r.accuracy > 0.45, "sorted {} of the symbols right (chance 0.25)", r.accuracy);
    assert!(r.loss < 4f64.ln() - 0.2, "loss {} is not below the unigram ln 4", r.loss);
}

#[test]
fn resuming_an_infinity_former_repeats_the_losses_of_a_straight_run() {
    use lethe::train::{train, TrainOptions};
    let mut cfg = infinity_config();
    cfg.memory.infinity.sticky = true; // the histogram is part of the state
    cfg.train.steps = 12;
    let options = crate::common::quiet;
    let straight_dir = tempfile::tempdir().unwrap();
    let straight = train(&cfg, &options(straight_dir.path())).unwrap().losses;
    let dir = tempfile::tempdir().unwrap();
    let first = train(&cfg, &TrainOptions { stop_after: Some(6), ..options(dir.path()) }).unwrap().losses;
    let second = train(&cfg, &TrainOptions { resume: true, ..options(dir.path()) }).unwrap().losses;
    let resumed: Vec<f64> = first.into_iter().chain(second).collect();
    assert_eq!(straight, resumed);
}
