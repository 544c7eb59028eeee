//! The backbone against references: shapes, a finite-difference gradient check, and
//! streaming (block by block, memory carried) against one long block.

use lethe::config::FolderMode;
use lethe::data::{SplitData, TokenSeq};
use lethe::eval::evaluate;
use lethe::model::Lm;
use tch::{Device, Tensor};

use crate::common::tokens;

#[test]
fn forward_shapes_and_the_cache_is_bounded_by_the_span() {
    let cfg = crate::common::tiny_config(); // span 16, block 8
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let mut mem = lm.model.new_memory();
    let x = tokens(&(0..24).map(|i| i % 7).collect::<Vec<_>>(), 3); // (3, 8)
    for block in 1..=4 {
        let out = lm.model.forward(&x, &mut mem, false).unwrap();
        assert_eq!(out.logits.size(), vec![3, 8, 256]);
        let held = mem.reports()[0].held;
        assert_eq!(held, (8 * block).min(16), "after block {block}");
    }
    // A query sees at most `span` earlier positions: mean over the block is 16 once full.
    assert_eq!(mem.reports()[0].mem_size, 16.0);
}

#[test]
fn gradients_match_finite_differences() {
    let mut cfg = crate::common::tiny_config();
    cfg.memory.span = 6; // the second block sees part of the first through the cache
    cfg.model.vocab = 11;
    let mut lm = Lm::new(&cfg, Device::Cpu).unwrap();
    lm.vs.double();
    let x: Vec<i64> = vec![1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5];
    let y: Vec<i64> = x.iter().map(|t| (t * 3 + 1) % 11).collect();
    let cache = crate::common::first_block_cache(&lm, &x);
    assert_eq!(cache[0].1.size(), vec![2, 4, 16], "the first block is cached");
    let loss = crate::common::two_block_loss(&lm, &x, &y, &cache);
    loss.backward();
    let params = lm.named_parameters();
    let mut checked = 0;
    for (name, p) in &params {
        let grad = p.grad().flatten(0, -1);
        let n = p.numel() as i64;
        // A few entries of every parameter, spread over the tensor.
        for idx in [0, n / 3, n - 1] {
            let analytic = grad.double_value(&[idx]);
            let numeric = crate::common::numeric_grad(p, idx, || {
                crate::common::two_block_loss(&lm, &x, &y, &cache).double_value(&[])
            });
            let tol = 1e-6 + 1e-5 * analytic.abs().max(numeric.abs());
            assert!((analytic - numeric).abs() < tol, "{name}[{idx}]: analytic {analytic} vs numeric {numeric}");
            checked += 1;
        }
    }
    assert!(checked >= 3 * 12, "only {checked} entries checked");
}

#[test]
fn streaming_in_blocks_equals_one_long_block_when_the_span_covers_it() {
    let mut cfg = crate::common::tiny_config();
    cfg.memory.span = 32;
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let seq: Vec<i64> = (0..2 * 24).map(|i| (i * 7 + 3) % 256).collect();
    let x = tokens(&seq, 2); // (2, 24)
    let _guard = tch::no_grad_guard();
    let whole = lm.model.forward(&x, &mut lm.model.new_memory(), false).unwrap().logits;
    let mut mem = lm.model.new_memory();
    let pieces: Vec<Tensor> =
        (0..4).map(|i| lm.model.forward(&x.narrow(1, i * 6, 6), &mut mem, false).unwrap().logits).collect();
    let streamed = Tensor::cat(&pieces, 1);
    let diff = (whole - streamed).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "max logit difference {diff}");

    // The same through `evaluate`, with different block lengths.
    let bytes: Vec<u8> = (0..2 * 25).map(|i| (i * 13 % 97) as u8).collect();
    let split = SplitData {
        origin: "mem".into(),
        docs: vec![TokenSeq::bytes(&bytes, None, None)],
        mode: FolderMode::Concat,
        words: None,
    };
    let one = evaluate(&lm, &split, 2, 24, None).unwrap();
    let blocks = evaluate(&lm, &split, 2, 5, None).unwrap();
    assert_eq!(one.tokens, 48);
    assert_eq!(blocks.tokens, 48);
    assert!((one.loss - blocks.loss).abs() < 1e-5, "{} vs {}", one.loss, blocks.loss);
}

#[test]
fn a_short_span_changes_the_result_so_the_window_matters() {
    // Control for the test above: with a span shorter than the stream, blocks differ from
    // a model that sees everything, so that test can fail.
    let mut cfg = crate::common::tiny_config();
    cfg.memory.span = 32;
    let wide = Lm::new(&cfg, Device::Cpu).unwrap();
    cfg.memory.span = 4;
    cfg.train.block = 4;
    let mut narrow = Lm::new(&cfg, Device::Cpu).unwrap();
    // Same weights except key_pe (its size depends on the span): copy what fits.
    let _guard = tch::no_grad_guard();
    for (name, p) in narrow.named_parameters() {
        let src = wide.vs.variables()[&name].shallow_clone();
        let mut p = p;
        if p.size() == src.size() {
            p.copy_(&src);
        } else {
            p.copy_(&src.narrow(0, 0, p.size()[0]));
        }
    }
    narrow.vs.float();
    let x = tokens(&(0..24).map(|i| (i * 5 + 1) % 256).collect::<Vec<_>>(), 1);
    let a = wide.model.forward(&x, &mut wide.model.new_memory(), false).unwrap().logits;
    let b = narrow.model.forward(&x, &mut narrow.model.new_memory(), false).unwrap().logits;
    let early = (a.narrow(1, 0, 5) - b.narrow(1, 0, 5)).abs().max().double_value(&[]);
    let late = (a.narrow(1, 20, 4) - b.narrow(1, 20, 4)).abs().max().double_value(&[]);
    assert!(early < 1e-4, "positions within the span agree: {early}");
    assert!(late > 1e-3, "positions beyond the span differ: {late}");
}

/// Documents read one at a time (`FolderMode::Separate`: rounds of one document per
/// stream, the memory emptied before each round) score as each document evaluated on
/// its own, for every mechanism; read one after another in a stream (`documents`), the
/// memory carries the earlier ones into the later, which changes the score.
#[test]
fn documents_read_one_at_a_time_score_as_each_document_alone() {
    use lethe::config::Mechanism;
    let docs: Vec<TokenSeq> = [30usize, 21, 25]
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            TokenSeq::bytes(&(0..n).map(|i| ((i * 37 + d * 11 + 5) % 251) as u8).collect::<Vec<_>>(), None, None)
        })
        .collect();
    let split = |docs: Vec<TokenSeq>, mode| SplitData { origin: "mem".into(), docs, mode, words: None };
    for mechanism in
        [Mechanism::Fixed, Mechanism::Expire, Mechanism::Adaptive, Mechanism::Compressive, Mechanism::Infinity]
    {
        let mut cfg = crate::common::tiny_config();
        cfg.memory.mechanism = mechanism;
        let lm = {
            let _seed = lethe::rng::seed_torch(3);
            Lm::new(&cfg, Device::Cpu).unwrap()
        };
        let rounds = evaluate(&lm, &split(docs.clone(), FolderMode::Separate), 2, 8, None).unwrap();
        let alone: Vec<_> = docs
            .iter()
            .map(|d| evaluate(&lm, &split(vec![d.clone()], FolderMode::Concat), 1, 8, None).unwrap())
            .collect();
        let tokens: u64 = alone.iter().map(|r| r.tokens).sum();
        let loss = alone.iter().map(|r| r.loss * r.tokens as f64).sum::<f64>() / tokens as f64;
        assert_eq!(rounds.tokens, tokens, "{mechanism:?}");
        assert!((rounds.loss - loss).abs() < 1e-5, "{mechanism:?}: {} in rounds, {loss} alone", rounds.loss);
        let carried = evaluate(&lm, &split(docs.clone(), FolderMode::Documents), 1, 8, None).unwrap();
        assert_eq!(
            carried.tokens,
            tokens + 2,
            "{mechanism:?}: the first token of the 2nd and 3rd documents is a target when carried"
        );
        assert!(
            (carried.loss - loss).abs() > 1e-4,
            "{mechanism:?}: carrying the memory changed nothing ({})",
            carried.loss
        );
    }
}
