//! Adaptive-Span end to end: the span loss by hand, gradients through the span ratio,
//! clamping after a step, and a tiny model that learns the copy task.

use lethe::config::{Config, Mechanism};
use lethe::model::Lm;
use tch::{Device, Tensor};

fn adaptive_config(span: usize, ramp: usize, init_ratio: f64, coef: f64) -> Config {
    let mut c = crate::common::tiny_config();
    c.memory.mechanism = Mechanism::Adaptive;
    c.memory.span = span;
    c.memory.adaptive.ramp = ramp;
    c.memory.adaptive.init_ratio = init_ratio;
    c.memory.adaptive.loss_coef = coef;
    c.train.block = 4;
    c
}

fn z_of(lm: &Lm) -> Tensor {
    lm.named_parameters().into_iter().find(|(n, _)| n.ends_with("adaptive.z")).unwrap().1
}

use crate::common::tokens;

#[test]
fn the_span_loss_is_coef_times_l_times_mean_ratio() {
    let lm = Lm::new(&adaptive_config(16, 4, 0.0, 0.01), Device::Cpu).unwrap();
    let _guard = tch::no_grad_guard();
    z_of(&lm).copy_(&Tensor::from_slice(&[0.25f32, 0.75]));
    let out = lm.model.forward(&tokens(&[1, 2, 3, 4], 1), &mut lm.model.new_memory(), true).unwrap();
    let expected = 0.01 * 16.0 * 0.5;
    assert!((out.aux_loss.double_value(&[]) - expected).abs() < 1e-7, "{}", out.aux_loss.double_value(&[]));
}

#[test]
fn ratios_are_clamped_to_the_unit_interval_after_a_step() {
    let lm = Lm::new(&adaptive_config(16, 4, 0.5, 0.0), Device::Cpu).unwrap();
    tch::no_grad(|| z_of(&lm).copy_(&Tensor::from_slice(&[1.3f32, -0.2])));
    lm.model.after_step();
    let z: Vec<f32> = z_of(&lm).detach().try_into().unwrap();
    assert_eq!(z, vec![1.0, 0.0]);
}

#[test]
fn gradients_through_the_span_ratio_match_finite_differences() {
    // L = 8, R = 4, z = 0.3: distances 2.4 to 6.4 are on the ramp.
    let mut lm = Lm::new(&adaptive_config(8, 4, 0.3, 0.5), Device::Cpu).unwrap();
    lm.vs.double();
    tch::no_grad(|| z_of(&lm).copy_(&Tensor::from_slice(&[0.3f64, 0.45])));
    let x: Vec<i64> = vec![1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5];
    let y: Vec<i64> = x.iter().map(|t| (t * 3 + 1) % 11).collect();
    let cache = crate::common::first_block_cache(&lm, &x);
    crate::common::two_block_loss(&lm, &x, &y, &cache).backward();
    let z = z_of(&lm);
    let grad: Vec<f64> = z.grad().try_into().unwrap();
    for (i, &analytic) in grad.iter().enumerate() {
        let numeric = crate::common::numeric_grad(&z, i as i64, || {
            crate::common::two_block_loss(&lm, &x, &y, &cache).double_value(&[])
        });
        assert!((analytic - numeric).abs() < 1e-6 + 1e-4 * numeric.abs(), "z[{i}]: {analytic} vs {numeric}");
        assert!(analytic.abs() > 1e-4, "no gradient reached z[{i}]");
    }
}

#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn adaptive_span_learns_the_copy_task_with_shrinking_spans() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::common::copy_learning_config("copy-adaptive");
    cfg.memory.mechanism = Mechanism::Adaptive;
    cfg.memory.span = 64;
    cfg.memory.adaptive.ramp = 8;
    cfg.memory.adaptive.init_ratio = 1.0;
    cfg.memory.adaptive.loss_coef = 1e-3;
    let r = crate::common::train_and_eval(&cfg, dir.path());
    let answers = r.answer_accuracy.unwrap();
    // Chance is 0.25. At this budget the result moves with rounding: seed 1 gave 0.86
    // and 0.54 before and after the attention was reordered for speed (the same maths),
    // seed 2 gives 0.89; 0.45 asks for clear learning without betting on the seed.
    assert!(answers > 0.45, "Adaptive-Span answered {answers} (chance 0.25)");
    let spans = r.mean_span.unwrap();
    assert!(spans.iter().all(|&s| s < 64.0), "spans did not shrink from L: {spans:?}");
}

#[test]
fn the_cache_holds_only_what_the_widest_head_can_see() {
    // L = 512 but every head's ratio is 0.1: 52 + R 8 = 60 states, rounded up to 64.
    let mut cfg = adaptive_config(512, 8, 0.1, 0.0);
    cfg.train.block = 8;
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let _guard = tch::no_grad_guard();
    let mut mem = lm.model.new_memory();
    let x = crate::common::random_tokens(1, 256, &[2, 8]);
    for _ in 0..20 {
        lm.model.forward(&x, &mut mem, false).unwrap();
    }
    assert_eq!(mem.reports()[0].held, 64, "160 tokens seen, 64 kept");
    // Memory size: each query sees about z L + R/2 earlier positions, far below L.
    let size = mem.reports()[0].mem_size;
    assert!(size > 50.0 && size < 60.0, "mem size {size}");
}
