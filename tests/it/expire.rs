//! Expire-Span end to end: gradients through the span predictor, deletion that changes
//! nothing the model computes, a cache that stays bounded, and a model that solves the
//! copy task with a memory far smaller than the distance it must reach.

use lethe::config::{Config, Deletion, Mechanism};
use lethe::model::Lm;
use tch::{Device, Tensor};

fn expire_config(span: usize, block: usize, ramp: usize, init_fraction: f64) -> Config {
    let mut c = crate::common::tiny_config();
    c.memory.mechanism = Mechanism::Expire;
    c.memory.span = span;
    c.memory.expire.ramp = ramp;
    c.memory.expire.init_fraction = init_fraction;
    c.train.block = block;
    c
}

/// Gives the span predictors random (seeded) weights, so spans differ from memory to
/// memory.
fn randomise_spans(lm: &Lm, scale: f64) {
    crate::common::randomise(&lm.vs, 17, scale, |name| name.ends_with("expire.w"));
}

#[test]
fn gradients_through_the_span_predictor_match_finite_differences() {
    // L = 8, R = 4, spans near 4: memories 4-8 back are on the ramp.
    let mut cfg = expire_config(8, 4, 4, 0.5);
    cfg.memory.expire.alpha = 0.5; // a span loss large enough to matter
    cfg.model.vocab = 256;
    check_gradients(&cfg, |name| name.ends_with("expire.w"));
}

/// `memory.expire.as_official`: the cache holds raw states that the current pre-norm
/// normalises every block, so the norm's gradient also runs through the cached rows
/// (finite differences move the norm and see the cache's keys, values and spans move);
/// the zero states at the start, no attention to oneself and `pre_div` outside the bias.
#[test]
fn the_official_reading_s_gradients_match_finite_differences() {
    let mut cfg = expire_config(8, 4, 4, 0.5);
    cfg.memory.expire.alpha = 0.5;
    cfg.memory.expire.as_official = true;
    cfg.memory.expire.pre_div = 2.0;
    cfg.model.pre_norm = true;
    cfg.model.vocab = 256;
    // The norms too: with their bias at zero the zero states' spans would be exactly
    // `p L`, an integer, and their soft mask would sit on the edge `m = 0` where the
    // span loss (a sum of remaining spans on the ramp) jumps.
    check_gradients(&cfg, |name| name.ends_with("expire.w") || name.contains("norm"));
}

/// A span predictor per head (`memory.expire.per_head`): every head's column of `w` and
/// its bias against finite differences, with the cache of plain states (the block's
/// scores apart from the cached rows') and with the official reading's raw states (all
/// rows' scores through the norm).
#[test]
fn per_head_span_predictors_gradients_match_finite_differences() {
    for official in [false, true] {
        let mut cfg = expire_config(8, 4, 4, 0.5);
        (cfg.memory.expire.alpha, cfg.memory.expire.per_head, cfg.model.vocab) = (0.5, true, 256);
        (cfg.memory.expire.as_official, cfg.model.pre_norm) = (official, official);
        check_gradients(&cfg, |name| name.ends_with("expire.w") || (official && name.contains("norm")));
    }
}

/// With the parameters `randomised` picks given random (seeded) values: every parameter
/// of the span predictor, and three entries of every other parameter:
/// the gradient of two blocks' loss (the second after the first's cache) against central
/// finite differences, in double precision.
fn check_gradients(cfg: &Config, randomised: impl Fn(&str) -> bool) {
    let mut lm = Lm::new(cfg, Device::Cpu).unwrap();
    lm.vs.double();
    crate::common::randomise(&lm.vs, 17, 0.5, randomised);
    let x: Vec<i64> = vec![1, 4, 2, 8, 5, 7, 3, 0, 9, 10, 2, 6, 4, 1, 3, 5];
    let y: Vec<i64> = x.iter().map(|t| (t * 3 + 1) % 11).collect();
    let cache = crate::common::first_block_cache(&lm, &x);
    crate::common::two_block_loss(&lm, &x, &y, &cache).backward();
    let mut predictor_grads = 0.0;
    for (name, p) in lm.named_parameters() {
        let grad = p.grad().flatten(0, -1);
        let n = p.numel() as i64;
        let picks: Vec<i64> = if name.contains("expire") { (0..n).collect() } else { vec![0, n / 2, n - 1] };
        for idx in picks {
            let analytic = grad.double_value(&[idx]);
            let numeric = crate::common::numeric_grad(&p, idx, || {
                crate::common::two_block_loss(&lm, &x, &y, &cache).double_value(&[])
            });
            let tol = 1e-6 + 1e-4 * analytic.abs().max(numeric.abs());
            assert!((analytic - numeric).abs() < tol, "{name}[{idx}]: analytic {analytic} vs numeric {numeric}");
            if name.contains("expire") {
                predictor_grads += analytic.abs();
            }
        }
    }
    assert!(predictor_grads > 1e-4, "the soft mask passed no gradient to w and b ({predictor_grads})");
}

/// Logits of `blocks` consecutive blocks of a random stream, and the cache held after each.
fn run_stream(lm: &Lm, blocks: usize, block: i64, seed: u64) -> (Vec<Tensor>, Vec<usize>) {
    let _guard = tch::no_grad_guard();
    let stream = crate::common::random_tokens(seed, 256, &[2, blocks as i64 * block]);
    let mut mem = lm.model.new_memory();
    let mut logits = vec![];
    let mut held = vec![];
    for i in 0..blocks as i64 {
        logits.push(lm.model.forward(&stream.narrow(1, i * block, block), &mut mem, false).unwrap().logits);
        held.push(mem.reports().iter().map(|r| r.held).max().unwrap_or(0));
    }
    (logits, held)
}

fn with_deletion(base: &Lm, deletion: Deletion) -> Lm {
    let mut cfg = base.config.clone();
    cfg.memory.expire.deletion = deletion;
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    let _guard = tch::no_grad_guard();
    for (name, mut p) in lm.named_parameters() {
        p.copy_(&base.vs.variables()[&name]);
    }
    lm
}

#[test]
fn deleting_expired_memories_changes_no_output() {
    let mut cfg = expire_config(32, 4, 4, 0.3);
    cfg.model.layers = 2;
    let reference = Lm::new(&cfg, Device::Cpu).unwrap();
    randomise_spans(&reference, 1.0);
    let (off, off_held) = run_stream(&with_deletion(&reference, Deletion::Off), 30, 4, 7);
    for policy in [Deletion::Stream, Deletion::Batch] {
        let (got, held) = run_stream(&with_deletion(&reference, policy), 30, 4, 7);
        for (i, (a, b)) in off.iter().zip(&got).enumerate() {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{policy:?}: block {i} differs by {diff}");
        }
        let (kept, window): (usize, usize) = (held[20..].iter().sum(), off_held[20..].iter().sum());
        assert!(kept < window, "{policy:?} deleted nothing: {kept} vs {window}");
    }
}

/// Regression: per stream, the block just read is deleted too where the next
/// block's first query cannot see it (paper 4.1); the official batch policy keeps it
/// whole. The outputs are those of no deletion either way.
#[test]
fn per_stream_deletion_drops_the_block_just_read_where_nothing_will_see_it() {
    // L = 64, R = 4, blocks of 8; untrained spans are all 0.02 L = 1.28. After a block,
    // its j-th memory is 8 - j from the next block's first query and stays while
    // 1.28 + 4 > 8 - j: j = 3..7, five memories a stream.
    let mut cfg = expire_config(64, 8, 4, 0.02);
    cfg.model.layers = 2;
    let reference = Lm::new(&cfg, Device::Cpu).unwrap();
    let (off, _) = run_stream(&with_deletion(&reference, Deletion::Off), 12, 8, 5);
    let (stream, stream_held) = run_stream(&with_deletion(&reference, Deletion::Stream), 12, 8, 5);
    let (_, batch_held) = run_stream(&with_deletion(&reference, Deletion::Batch), 12, 8, 5);
    for (i, (a, b)) in off.iter().zip(&stream).enumerate() {
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "block {i} differs by {diff}");
    }
    assert!(stream_held.iter().all(|&h| h == 5), "per stream held {stream_held:?}, not 5 after every block");
    assert!(batch_held.iter().all(|&h| h == 8), "the batch policy held {batch_held:?}, not the whole block");
}

#[test]
fn the_cache_stays_bounded_over_a_long_stream() {
    // L = 4096 but every span starts at 0.02 L = 82: a memory lives at most e + R.
    let mut cfg = expire_config(4096, 8, 8, 0.02);
    cfg.memory.expire.alpha = 0.0;
    let base = Lm::new(&cfg, Device::Cpu).unwrap();
    for policy in [Deletion::Stream, Deletion::Batch] {
        let lm = with_deletion(&base, policy);
        let (_, held) = run_stream(&lm, 200, 8, 3); // 1600 tokens per stream
        let max = *held.iter().max().unwrap();
        assert!(max <= 82 + 8 + 2 * 8, "{policy:?}: held {max}");
        assert!(held[199] >= 82, "{policy:?} deleted live memories: {}", held[199]);
    }
}

fn copy_run(mechanism: Mechanism, span: usize, dir: &std::path::Path) -> lethe::eval::EvalResult {
    let mut cfg = crate::common::copy_learning_config(&format!("copy-{mechanism:?}-{span}"));
    cfg.memory.mechanism = mechanism;
    cfg.memory.span = span;
    cfg.memory.expire.ramp = 8;
    cfg.memory.expire.init_fraction = 0.9;
    cfg.memory.expire.alpha = 0.01;
    // At the shared setup's 3e-3, two seeds of ten stayed at chance where the CPU's
    // kernels round otherwise; at 1.5e-3, seeds 0-9 answer 0.84-0.98 with an average
    // memory of 10-13.
    cfg.train.lr = 1.5e-3;
    crate::common::train_and_eval(&cfg, dir)
}

#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn expire_span_solves_the_copy_task_with_a_memory_far_below_the_distance() {
    let dir = tempfile::tempdir().unwrap();
    // The run of A's lies 25 to 33 tokens back; blocks are 8 long.
    let expire = copy_run(Mechanism::Expire, 64, dir.path());
    let answers = expire.answer_accuracy.unwrap();
    let mem = expire.mem_size.iter().sum::<f64>() / expire.mem_size.len() as f64;
    assert!(answers > 0.6, "Expire-Span answered {answers} (chance 0.25)");
    assert!(mem < 0.6 * 24.0, "average memory {mem} is not far below the distance 24-32");
    // A fixed span of 8 over 2 layers reaches 16 tokens back: it cannot see the run.
    let fixed = copy_run(Mechanism::Fixed, 8, dir.path());
    let fixed_answers = fixed.answer_accuracy.unwrap();
    assert!(fixed_answers < 0.35, "a fixed span of 8 answered {fixed_answers}");
}

#[test]
fn inspect_traces_one_span_per_byte_and_layer_and_refuses_fixed_models() {
    let mut cfg = expire_config(32, 4, 4, 0.3);
    cfg.model.layers = 2;
    let lm = Lm::new(&cfg, Device::Cpu).unwrap();
    randomise_spans(&lm, 1.0);
    let bytes = b"It was the best of times,\nit was the worst of times.";
    let text = &lethe::inspect::Text::bytes(bytes);
    let trace = lethe::inspect::trace_spans(&lm, text).unwrap();
    assert_eq!(trace.spans.len(), 2);
    assert!(trace.spans.iter().all(|s| s.len() == bytes.len()));
    assert!(trace.spans[0].iter().all(|&s| (0.0..=32.0).contains(&s)));
    // Spans depend on the byte: a random predictor does not give every byte the same span.
    let first = trace.spans[0][0];
    assert!(trace.spans[0].iter().any(|&s| (s - first).abs() > 1e-3));
    let dir = tempfile::tempdir().unwrap();
    lethe::inspect::write(&trace, dir.path()).unwrap();
    let html = std::fs::read_to_string(dir.path().join("spans.html")).unwrap();
    assert_eq!(html.matches("<h2>").count(), 2);

    let fixed = Lm::new(&crate::common::tiny_config(), Device::Cpu).unwrap();
    let err = lethe::inspect::trace_spans(&fixed, text).unwrap_err().to_string();
    assert!(err.contains("`fixed` memory") && err.contains("Expire-Span"), "{err}");
}

#[test]
fn an_inference_cap_shortens_every_span_and_the_memory() {
    let cfg = expire_config(64, 4, 4, 0.9);
    let base = Lm::new(&cfg, Device::Cpu).unwrap();
    let mut capped_cfg = cfg.clone();
    capped_cfg.memory.expire.inference_cap = 8;
    let capped = {
        let lm = Lm::new(&capped_cfg, Device::Cpu).unwrap();
        let _guard = tch::no_grad_guard();
        for (name, mut p) in lm.named_parameters() {
            p.copy_(&base.vs.variables()[&name]);
        }
        lm
    };
    let (_, held_full) = run_stream(&base, 30, 4, 5);
    let (_, held_capped) = run_stream(&capped, 30, 4, 5);
    assert!(held_full[29] >= 50, "uncapped spans near 58 keep ~58 memories: {}", held_full[29]);
    assert!(held_capped[29] <= 8 + 4 + 4, "capped at 8: {}", held_capped[29]);
}

/// The language-model trainer weighs the span loss by the warm-up too: with
/// `alpha_warmup = 2` the first update is that of alpha / 2, the second is not.
#[test]
fn the_alpha_warm_up_weighs_the_span_loss_of_language_model_updates() {
    let losses = |alpha: f64, warmup: usize| {
        let mut cfg = expire_config(16, 8, 8, 0.5);
        cfg.memory.expire.alpha = alpha;
        cfg.memory.expire.alpha_warmup = warmup;
        (cfg.train.steps, cfg.train.log_every) = (3, 1);
        let dir = tempfile::tempdir().unwrap();
        lethe::train::train(&cfg, &crate::common::quiet(dir.path())).unwrap().losses
    };
    let (warm, half) = (losses(0.5, 2), losses(0.25, 0));
    // The losses are the task's: the first two follow the same first update.
    assert_eq!(warm[..2], half[..2]);
    assert_ne!(warm[2], half[2], "the second update has the full alpha");
}

/// Regression: the bias was `-ln(1/p - 1)` inside the division by `pre_div`,
/// so spans started at 46.9 with pre_div 4 and 62.9 with 64 instead of `p L` = 12.8.
/// Every memory must start at span `p L` whatever the divisor.
#[test]
fn spans_start_at_the_initial_fraction_whatever_the_divisor() {
    for pre_div in [1.0, 4.0, 64.0] {
        for (span, p) in [(128usize, 0.1), (64, 0.01)] {
            let mut cfg = expire_config(span, 8, 16, p);
            cfg.memory.expire.pre_div = pre_div;
            let lm = Lm::new(&cfg, Device::Cpu).unwrap();
            let mut mem = lm.model.new_memory();
            let x = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6]).view([1, 8]);
            tch::no_grad(|| lm.model.forward(&x, &mut mem, false).unwrap());
            for report in mem.reports() {
                let mean = report.extra("mean_span").expect("Expire-Span reports its mean span");
                let want = p * span as f64;
                assert!(
                    (mean - want).abs() < 1e-3 * want,
                    "pre_div {pre_div}, L {span}, p {p}: mean span {mean}, want {want}"
                );
            }
        }
    }
}

/// The train-split lines of a run's metrics log: each step's mean memory a layer and
/// the span loss's weight it logged.
fn memory_and_alpha(run_dir: &std::path::Path) -> Vec<(f64, f64)> {
    let log = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    log.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == "train")
        .map(|v| {
            let sizes: Vec<f64> = v["mem_size"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
            (sizes.iter().sum::<f64>() / sizes.len() as f64, v["alpha"].as_f64().unwrap())
        })
        .collect()
}

/// `memory.expire.target` moves the span loss's weight: up while the memory is above
/// the target, down while it is below, logged at every progress line; without a
/// target nothing is logged.
#[test]
fn a_memory_target_moves_the_span_loss_weight_toward_it() {
    let mut cfg = expire_config(32, 8, 4, 0.3);
    (cfg.memory.expire.alpha, cfg.train.steps) = (1e-3, 12);
    for (target, rises) in [(1.0, true), (1000.0, false)] {
        cfg.memory.expire.target = target;
        let dir = tempfile::tempdir().unwrap();
        let run = lethe::train::train(&cfg, &crate::common::quiet(dir.path())).unwrap();
        let logged = memory_and_alpha(&run.run_dir);
        let (first, last) = (logged[0].1, logged[logged.len() - 1].1);
        assert_eq!(rises, last > first, "target {target}: the weight went from {first:e} to {last:e} ({logged:?})");
        assert!(first != 1e-3 && last != 1e-3, "target {target}: the weight stayed at alpha ({logged:?})");
    }
    cfg.memory.expire.target = 0.0;
    let dir = tempfile::tempdir().unwrap();
    let run = lethe::train::train(&cfg, &crate::common::quiet(dir.path())).unwrap();
    let log = std::fs::read_to_string(run.run_dir.join("metrics.jsonl")).unwrap();
    assert!(log.contains("\"alpha\":null"), "{log}");
}

/// With a target, the span loss caps the memory near it: on the copy task (which needs
/// little memory at this size, so that the spans shrink under the loss and the task
/// does not grow them back), the memory ends at most a quarter above each target, and
/// the lower target keeps less.
#[test]
#[ignore = "slow tier (a model must learn): ./test.sh -- --include-ignored, as CI runs it"]
fn a_memory_target_bounds_the_memory_near_it() {
    let mut cfg = Config::preset("copy-tiny").unwrap();
    cfg.memory.mechanism = Mechanism::Expire;
    cfg.memory.span = 64;
    (cfg.memory.expire.ramp, cfg.memory.expire.init_fraction, cfg.memory.expire.alpha) = (4, 0.5, 1e-4);
    (cfg.train.steps, cfg.train.log_every, cfg.train.eval_every) = (300, 30, 0);
    let mut ends = vec![];
    for target in [12.0, 24.0] {
        cfg.memory.expire.target = target;
        let dir = tempfile::tempdir().unwrap();
        let run = lethe::train::train(&cfg, &crate::common::quiet(dir.path())).unwrap();
        let logged = memory_and_alpha(&run.run_dir);
        let (start, end) = (logged[0].0, logged[logged.len() - 1].0);
        eprintln!("target {target}: memory {start:.1} after the first steps, {end:.1} at the end");
        assert!(start > 1.25 * target, "target {target}: the memory started at {start}, already below it");
        assert!(end <= 1.25 * target, "target {target}: the memory ended at {end}");
        ends.push(end);
    }
    assert!(ends[0] < ends[1], "the memories {ends:?} do not follow the targets 12 and 24");
}
