//! Compressive Transformer end to end: attention reaches the compressed slots,
//! gradients match finite differences, the reconstruction loss trains only the
//! compressor, and a tiny model learns the copy task through compressed memory.

use lethe::config::{Compressor, Config, Mechanism};
use lethe::model::Lm;
use tch::{Device, Kind, Tensor};

/// One layer, span 4, blocks of 4, rate 2, 4 slots.
fn compressive_config(compressor: Compressor) -> Config {
    let mut c = crate::common::tiny_config();
    c.memory.mechanism = Mechanism::Compressive;
    c.memory.span = 4;
    c.memory.compressive.rate = 2;
    c.memory.compressive.slots = 4;
    c.memory.compressive.compressor = compressor;
    c.train.block = 4;
    c
}

fn param(lm: &Lm, suffix: &str) -> Tensor {
    lm.named_parameters().into_iter().find(|(n, _)| n.ends_with(suffix)).unwrap_or_else(|| panic!("no {suffix}")).1
}

const X: [i64; 24] = [1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5, 7, 7, 2, 9, 0, 3, 8, 6];

/// The memory after two blocks of 4 (2 streams): 4 states in the window, 2 slots.
fn two_block_memory(lm: &Lm) -> Vec<(String, Tensor)> {
    crate::common::memory_after(lm, &X, 2, 4)
}

/// Task loss and auxiliary loss of the third block, given the memory of the first two.
fn third_block_losses(lm: &Lm, state: &[(String, Tensor)]) -> (Tensor, Tensor) {
    crate::common::block_losses(lm, &X, 2, 4, state)
}

#[test]
fn queries_see_the_compressed_slots() {
    let lm = Lm::new(&compressive_config(Compressor::Pool), Device::Cpu).unwrap();
    let state = two_block_memory(&lm);
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["layers.0.cache", "layers.0.compressed"]);
    let (task, _) = third_block_losses(&lm, &state);
    // Changing a compressed slot changes the third block's loss.
    let changed: Vec<(String, Tensor)> =
        state.iter().map(|(n, t)| (n.clone(), if n.ends_with("compressed") { t + 1.0 } else { t.copy() })).collect();
    let (task2, _) = third_block_losses(&lm, &changed);
    assert!((task.double_value(&[]) - task2.double_value(&[])).abs() > 1e-4);
    let mut mem = lm.model.new_memory();
    mem.load_state(&state).unwrap();
    let _ = tch::no_grad(|| lm.model.forward(&crate::common::tokens(&X, 2).narrow(1, 8, 4), &mut mem, false).unwrap());
    let r = &mem.reports()[0];
    // Each query sees 2 slots plus min(4 + q, 4) = 4 window positions.
    assert_eq!(r.mem_size, 6.0);
    assert_eq!(r.extra("compressed"), Some(4.0), "2 slots + 2 from the 4 states that left");
}

#[test]
fn gradients_through_the_slot_positions_match_finite_differences() {
    let mut lm = Lm::new(&compressive_config(Compressor::Pool), Device::Cpu).unwrap();
    lm.vs.double();
    let state = two_block_memory(&lm);
    let loss = || third_block_losses(&lm, &state).0;
    loss().backward();
    for name in ["compressive.slot_pe", "attn.k.weight", "attn.q.weight"] {
        let p = param(&lm, name);
        let grad = p.grad().flatten(0, -1);
        for idx in [0i64, 3] {
            let analytic = grad.double_value(&[idx]);
            let numeric = crate::common::numeric_grad(&p, idx, || loss().double_value(&[]));
            assert!((analytic - numeric).abs() < 1e-6 + 1e-4 * numeric.abs(), "{name}[{idx}]: {analytic} vs {numeric}");
        }
    }
    let slot_grad = param(&lm, "compressive.slot_pe").grad().abs().sum(Kind::Double).double_value(&[]);
    assert!(slot_grad > 1e-6, "no gradient reached the slot positions");
}

#[test]
fn the_reconstruction_loss_trains_only_the_convolution() {
    let mut lm = Lm::new(&compressive_config(Compressor::Conv), Device::Cpu).unwrap();
    lm.vs.double();
    let state = two_block_memory(&lm);
    let (_, recon) = third_block_losses(&lm, &state);
    assert!(recon.double_value(&[]) > 0.0, "four states leave the window, so two slots are compressed");
    recon.backward();
    let conv = param(&lm, "compressive.conv_w");
    for idx in [0i64, 5, 11] {
        let analytic = conv.grad().flatten(0, -1).double_value(&[idx]);
        let numeric = crate::common::numeric_grad(&conv, idx, || third_block_losses(&lm, &state).1.double_value(&[]));
        assert!((analytic - numeric).abs() < 1e-7 + 1e-4 * numeric.abs(), "conv_w[{idx}]: {analytic} vs {numeric}");
    }
    assert!(conv.grad().abs().sum(Kind::Double).double_value(&[]) > 0.0);
    // The attention projections are detached in the reconstruction loss.
    let q = param(&lm, "attn.q.weight");
    assert!(!q.grad().defined() || q.grad().abs().sum(Kind::Double).double_value(&[]) == 0.0);
    // And the task loss never reaches the convolution: the compressed memory is detached.
    for t in lm.vs.trainable_variables() {
        if t.grad().defined() {
            let _ = t.grad().zero_();
        }
    }
    third_block_losses(&lm, &state).0.backward();
    let g = conv.grad();
    assert!(!g.defined() || g.abs().sum(Kind::Double).double_value(&[]) == 0.0);
}

#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn the_mean_pool_compressive_transformer_learns_the_copy_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::common::copy_learning_config("copy-compressive");
    cfg.memory.mechanism = Mechanism::Compressive;
    cfg.memory.span = 8;
    cfg.memory.compressive.rate = 4;
    cfg.memory.compressive.slots = 8;
    let r = crate::common::train_and_eval(&cfg, dir.path());
    let answers = r.answer_accuracy.unwrap();
    eprintln!("compressive answers {answers}, mem {:?}", r.mem_size);
    assert!(answers > 0.5, "Compressive answered {answers} (chance 0.25)");
}
