//! `lethe bench`: time training steps of a config (forward, backward, clip, Adam) after a
//! warm-up, and report the median and spread of the step time, tokens per second, the
//! peak resident memory and the memory size per layer. The tokens are uniform random
//! bytes of the configured shape: step time does not depend on their content, and the
//! bench needs no corpus. Before timing, forward-only blocks fill the memory to its
//! steady size, so a long span is timed full, not empty. With a given context
//! ([`bench`]'s `context`), that many tokens per stream are streamed through first
//! instead: the time per block at 8k, 64k or 1M tokens of context shows whether a
//! mechanism's cost grows with what it has seen (the ∞-former's must not).

use std::time::Instant;

use serde::Serialize;

use crate::config::Config;
use crate::data::Batch;
use crate::error::Result;
use crate::metrics::peak_rss_bytes;
use crate::model::Lm;
use crate::optim::Adam;
use crate::rng::Rng;
use crate::train::optimisation_step;

/// Timings of one config.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    /// Config name.
    pub name: String,
    /// Memory mechanism.
    pub mechanism: String,
    /// Scalar parameters.
    pub parameters: usize,
    /// Tokens per step (`batch * block`).
    pub tokens_per_step: usize,
    /// Timed steps.
    pub steps: usize,
    /// Median seconds per step.
    pub median_s: f64,
    /// 10th percentile seconds per step.
    pub p10_s: f64,
    /// 90th percentile seconds per step.
    pub p90_s: f64,
    /// Tokens per second at the median.
    pub tokens_per_s: f64,
    /// Peak resident memory of the process, MiB.
    pub peak_rss_mib: Option<f64>,
    /// Mean memory size `|C_t|` per layer at the last step.
    pub mem_size: Vec<f64>,
    /// libtorch CPU threads.
    pub threads: i32,
    /// Forward-only blocks run first so that the memory is at its steady size.
    pub fill_blocks: usize,
    /// Tokens per stream seen before the timed steps (`fill_blocks * block`).
    pub context_tokens: usize,
}

/// Most forward-only blocks run to fill the memory before timing.
const MAX_FILL_BLOCKS: usize = 4096;

/// Runs `warmup` untimed then `steps` timed training steps of `cfg`, after streaming
/// `context` tokens per stream (default: enough to fill the memory).
pub fn bench(cfg: &Config, steps: usize, warmup: usize, context: Option<usize>) -> Result<BenchResult> {
    cfg.validate()?;
    let device = crate::device::parse(&cfg.train.device)?;
    if cfg.train.threads > 0 {
        tch::set_num_threads(cfg.train.threads as i32);
    }
    let lm = Lm::new(cfg, device)?;
    let mut opt = Adam::new(lm.named_parameters(), &cfg.train);
    let mut mems: Vec<_> = (0..cfg.train.accum).map(|_| lm.model.new_memory()).collect();
    let mut rng = Rng::new(cfg.seed);
    let fill_blocks = fill_memory(&lm, &mut mems, cfg, &mut rng, context)?;
    let mut times = Vec::with_capacity(steps);
    for i in 0..warmup + steps {
        let batch = random_batch(&mut rng, cfg.train.batch, cfg.train.block, cfg.model.vocab, false);
        let start = Instant::now();
        optimisation_step(&lm, &mut opt, &mut mems, &batch, &cfg.train, cfg.train.lr)?;
        if device.is_cuda() {
            tch::Cuda::synchronize(0);
        }
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let tokens = cfg.train.batch * cfg.train.block;
    Ok(BenchResult {
        name: cfg.name.clone(),
        mechanism: format!("{:?}", cfg.memory.mechanism).to_lowercase(),
        parameters: lm.parameter_count(),
        tokens_per_step: tokens,
        steps,
        median_s: pick(0.5),
        p10_s: pick(0.1),
        p90_s: pick(0.9),
        tokens_per_s: tokens as f64 / pick(0.5),
        peak_rss_mib: peak_rss_bytes().map(|b| b as f64 / (1024.0 * 1024.0)),
        mem_size: mems[0].reports().iter().map(|r| r.mem_size).collect(),
        threads: tch::get_num_threads(),
        fill_blocks,
        context_tokens: fill_blocks * cfg.train.block,
    })
}

/// Runs forward-only blocks over `context` tokens per stream, or by default until the
/// memory can hold a full span (`L / M` blocks, at most [`MAX_FILL_BLOCKS`]), so that the
/// timed steps see the steady-state memory and not an empty cache. Returns the number
/// of blocks run.
fn fill_memory(lm: &Lm, mems: &mut [crate::model::Memory], cfg: &Config, rng: &mut Rng, context: Option<usize>) -> Result<usize> {
    let _guard = tch::no_grad_guard();
    let blocks = match context {
        Some(tokens) => tokens.div_ceil(cfg.train.block),
        None => memory_reach(cfg).div_ceil(cfg.train.block).min(MAX_FILL_BLOCKS),
    };
    let per = cfg.train.batch / mems.len();
    for i in 0..blocks {
        if context.is_some() && blocks >= 1000 && (i + 1) % (blocks / 10) == 0 {
            eprintln!("streamed {} of {} context tokens", (i + 1) * cfg.train.block, blocks * cfg.train.block);
        }
        for mem in mems.iter_mut() {
            let batch = random_batch(rng, per, cfg.train.block, cfg.model.vocab, false);
            let (x, _, _) = batch.tensors(0, per, lm.device());
            lm.model.forward(&x, mem, false)?;
        }
    }
    Ok(blocks)
}

/// Tokens the memory must have seen to be full: the span, plus what the compressed
/// slots cover for the Compressive Transformer, and a little past the short-term memory
/// for the ∞-former.
fn memory_reach(cfg: &Config) -> usize {
    match cfg.memory.mechanism {
        crate::config::Mechanism::Compressive => cfg.memory.span + cfg.memory.compressive.rate * cfg.memory.compressive.slots,
        // The LTM is unbounded; two blocks past the STM have been absorbed into it.
        crate::config::Mechanism::Infinity => cfg.memory.span + 2 * cfg.train.block,
        _ => cfg.memory.span,
    }
}

fn random_batch(rng: &mut Rng, batch: usize, block: usize, vocab: usize, reset: bool) -> Batch {
    let n = batch * block;
    let tokens: Vec<i64> = (0..n + batch).map(|_| rng.range(0, vocab - 1) as i64).collect();
    Batch { batch, len: block, inputs: tokens[..n].to_vec(), targets: tokens[batch..].to_vec(), weights: vec![1.0; n], reset }
}
