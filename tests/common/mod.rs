//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod cli;
pub mod llama;

use lethe::config::{Config, CopyConfig};

/// Polls `done` until it holds, failing the test with `never` after `secs` seconds: for
/// waiting on another process (a store opened, a step logged) without a fixed sleep.
pub fn wait_until(never: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{never} (waited {secs} s)");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A model and task small enough to train in a second or two on 2 cores.
pub fn tiny_config() -> Config {
    let mut c = Config::preset("copy-tiny").unwrap();
    c.name = "tiny".into();
    c.model.layers = 1;
    c.model.d_model = 16;
    c.model.heads = 2;
    c.model.d_ffn = 32;
    c.memory.span = 16;
    c.train.batch = 4;
    c.train.block = 8;
    c.train.steps = 6;
    c.train.warmup = 2;
    c.train.log_every = 2;
    c.train.eval_every = 0;
    c.train.eval_tokens = 256;
    c.train.checkpoint_every = 0;
    c.data.copy = CopyConfig { count_min: 1, count_max: 3, distance_min: 4, distance_max: 8, eval_tokens: 256 };
    c
}

/// The copy-task learning setup shared by the mechanism tests: 2 layers x 32, blocks of
/// 8, counts 1-4 and the run of `A`s 25 to 33 tokens back, 800 steps. The caller sets the
/// mechanism and its parameters.
pub fn copy_learning_config(name: &str) -> Config {
    let mut c = tiny_config();
    c.name = name.to_string();
    c.model.layers = 2;
    c.model.d_model = 32;
    c.model.d_ffn = 64;
    c.train.batch = 16;
    c.train.block = 8;
    c.train.steps = 800;
    c.train.warmup = 20;
    c.train.lr = 3e-3;
    c.train.log_every = 100;
    c.train.eval_tokens = 0;
    c.data.copy = CopyConfig { count_min: 1, count_max: 4, distance_min: 24, distance_max: 32, eval_tokens: 4096 };
    c
}

/// Options for a quiet training run under `dir` (the run folder is `dir/<name>`).
pub fn quiet(dir: &std::path::Path) -> lethe::train::TrainOptions {
    lethe::train::TrainOptions { out_dir: dir.to_path_buf(), quiet: true, ..Default::default() }
}

/// Trains `cfg` quietly under `dir` and returns its last validation result.
pub fn train_and_eval(cfg: &Config, dir: &std::path::Path) -> lethe::eval::EvalResult {
    lethe::train::train(cfg, &quiet(dir)).unwrap().last_eval.unwrap()
}

/// Standard normal draws of `shape` and `kind` from lethe's own generator seeded with
/// `seed`: reproducible whatever other tests run beside it (libtorch's generator is one
/// per process, shared by the harness's threads, so tests never draw inputs from it).
pub fn randn(seed: u64, shape: &[i64], kind: tch::Kind) -> tch::Tensor {
    lethe::rng::Rng::new(seed).normal_tensor(shape, kind)
}

/// Tokens uniform in `0..vocab`, `shape`, from lethe's generator seeded with `seed`.
pub fn random_tokens(seed: u64, vocab: usize, shape: &[i64]) -> tch::Tensor {
    let mut rng = lethe::rng::Rng::new(seed);
    let n: i64 = shape.iter().product();
    let tokens: Vec<i64> = (0..n).map(|_| rng.range(0, vocab - 1) as i64).collect();
    tch::Tensor::from_slice(&tokens).view(shape)
}

/// Replaces every variable of `vs` whose name satisfies `pick` by seeded normal draws
/// times `scale` (for example to give zero-initialised heads some weights).
pub fn randomise(vs: &tch::nn::VarStore, seed: u64, scale: f64, pick: impl Fn(&str) -> bool) {
    let mut rng = lethe::rng::Rng::new(seed);
    let mut vars: Vec<(String, tch::Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| {
        for (_, mut var) in vars.into_iter().filter(|(n, _)| pick(n)) {
            let values = rng.normal_tensor(&var.size(), var.kind()).to_device(var.device()) * scale;
            var.copy_(&values);
        }
    });
}

/// `(b, -1)` token tensor from a flat list.
pub fn tokens(seq: &[i64], b: i64) -> tch::Tensor {
    tch::Tensor::from_slice(seq).view([b, -1])
}

/// Task loss plus auxiliary loss of two blocks of 4 tokens (2 streams of 8 in `x`, `y`).
/// The second block attends to the first through the cache, which training detaches
/// (truncated back-propagation), so the objective whose gradient training follows treats
/// the cache as a constant: `cache`, the memory after the first block computed once with
/// the unperturbed parameters ([`first_block_cache`]), is reused for every evaluation.
pub fn two_block_loss(lm: &lethe::model::Lm, x: &[i64], y: &[i64], cache: &[(String, tch::Tensor)]) -> tch::Tensor {
    let (x, y) = (tokens(x, 2), tokens(y, 2));
    let block_loss = |half: i64, mem: &mut lethe::model::Memory| {
        let out = lm.model.forward(&x.narrow(1, half * 4, 4), mem, true).unwrap();
        lethe::model::token_nll(&out.logits, &y.narrow(1, half * 4, 4)).sum(tch::Kind::Double) + out.aux_loss
    };
    let first = block_loss(0, &mut lm.model.new_memory());
    let mut mem = lm.model.new_memory();
    mem.load_state(cache).unwrap();
    first + block_loss(1, &mut mem)
}

/// The memory state after the first block of 4 tokens of `x`.
pub fn first_block_cache(lm: &lethe::model::Lm, x: &[i64]) -> Vec<(String, tch::Tensor)> {
    let mut mem = lm.model.new_memory();
    let _ = lm.model.forward(&tokens(x, 2).narrow(1, 0, 4), &mut mem, true).unwrap();
    mem.state().into_iter().map(|(n, t)| (n, t.detach().copy())).collect()
}

/// Central finite difference (step 1e-6) of `loss` with respect to entry `idx` of the
/// flattened `param`, which is restored afterwards.
pub fn numeric_grad(param: &tch::Tensor, idx: i64, loss: impl Fn() -> f64) -> f64 {
    let flat = param.detach().flatten(0, -1); // shares storage with `param`
    let orig = flat.double_value(&[idx]);
    let h = 1e-6;
    let _ = flat.get(idx).fill_(orig + h);
    let up = loss();
    let _ = flat.get(idx).fill_(orig - h);
    let down = loss();
    let _ = flat.get(idx).fill_(orig);
    (up - down) / (2.0 * h)
}

/// The memory state after the first `blocks` blocks of `len` tokens of `seq` (2 streams),
/// run in training mode without gradient, detached and copied.
pub fn memory_after(lm: &lethe::model::Lm, seq: &[i64], blocks: i64, len: i64) -> Vec<(String, tch::Tensor)> {
    let x = tokens(seq, 2);
    let mut mem = lm.model.new_memory();
    tch::no_grad(|| {
        for i in 0..blocks {
            lm.model.forward(&x.narrow(1, len * i, len), &mut mem, true).unwrap();
        }
    });
    mem.state().into_iter().map(|(n, t)| (n, t.detach().copy())).collect()
}

/// Task loss (targets `seq mod 7`, summed) and auxiliary loss of block `index` of `len`
/// tokens of `seq` (2 streams), in training mode, starting from the memory `state`.
pub fn block_losses(
    lm: &lethe::model::Lm,
    seq: &[i64],
    index: i64,
    len: i64,
    state: &[(String, tch::Tensor)],
) -> (tch::Tensor, tch::Tensor) {
    let x = tokens(seq, 2);
    let y = x.remainder(7);
    let mut mem = lm.model.new_memory();
    mem.load_state(state).unwrap();
    let out = lm.model.forward(&x.narrow(1, index * len, len), &mut mem, true).unwrap();
    (lethe::model::token_nll(&out.logits, &y.narrow(1, index * len, len)).sum(tch::Kind::Double), out.aux_loss)
}
