//! `lethe bench --init-from FOLDER`: a pretrained decoder's speed and memory when it
//! reads a prompt of `context` tokens (prefill, in blocks of 512 as `lethe generate`
//! reads one) and then decodes token by token, under each key-value cache policy asked.
//!
//! Decoding one token reads every weight and the cache once and does little arithmetic
//! with them, so this machine's memory read rate bounds it: [`read_rate`] measures that
//! rate with the decode product's own read loop (a sum over 1 GiB, far larger than the
//! caches) before each prompt, and
//! each result gives the bytes a decoded token reads (weights, and the keys and values
//! held) and the share of the read rate its decode speed reaches. Under a fixed budget
//! the bytes read per token, and so the decode time, do not grow with the context.

use std::time::Instant;

use serde::Serialize;
use tch::{Kind, Tensor};

use crate::error::Result;
use crate::metrics::{peak_rss_bytes, reset_peak_rss};
use crate::model::kv::{Budget, Policy};
use crate::model::llama::{KvCache, Llama};

/// Tokens the prompt is read in at a time, as `lethe generate` reads it.
pub const PREFILL_BLOCK: usize = crate::generate::PROMPT_BLOCK;

/// One configuration to time: a policy (`NAME[:KEY=VALUE,...]`) with its budget, at a
/// context length.
#[derive(Clone, Debug)]
pub struct DecodeCase {
    pub spec: String,
    pub budget: Option<Budget>,
    pub context: usize,
}

/// What one configuration measured, over every round.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeResult {
    pub policy: String,
    /// Entries per layer and key-value head; `None` for the full cache.
    pub budget: Option<i64>,
    /// Tokens of prompt read before decoding.
    pub context: usize,
    /// Prompt tokens read per second (median over the rounds).
    pub prefill_tok_s: f64,
    /// Decoded tokens per second: 1 / the median time of a token over every round.
    pub decode_tok_s: f64,
    /// Median, 10th and 90th percentile time of a decoded token, in ms.
    pub decode_ms: [f64; 3],
    /// Bytes of keys and values held after the last token.
    pub cache_bytes: usize,
    /// Bytes a decoded token reads: the weights and the keys and values held.
    pub read_bytes_per_token: usize,
    /// The machine's read rate, bytes per second, measured before each round's prompt
    /// (the median over the rounds): the machine's bandwidth drifts.
    pub read_rate_bytes_s: f64,
    /// `read_bytes_per_token * decode_tok_s` over that read rate.
    pub bandwidth_share: f64,
    /// Peak resident memory of the process during the configuration (the highest of
    /// the rounds), in bytes, where the OS reports it.
    pub peak_rss_bytes: Option<u64>,
}

/// This machine's memory read rate, bytes per second: the median of three streaming sums
/// over 1 GiB of floats ([`crate::model::decode::read_sum`], the read loop of the decode
/// product) with libtorch's threads.
pub fn read_rate() -> Result<f64> {
    let x = Tensor::ones([1 << 28], (Kind::Float, tch::Device::Cpu));
    let mut times = Vec::new();
    for i in 0..4 {
        let start = Instant::now();
        let sum = crate::model::decode::read_sum(&x)?;
        let t = start.elapsed().as_secs_f64();
        if sum != x.numel() as f64 {
            return Err(crate::LetheError::Invalid(format!("the read probe summed {sum}, not {}", x.numel())));
        }
        if i > 0 {
            times.push(t);
        }
    }
    Ok((x.numel() * 4) as f64 / quantile(&mut times, 0.5))
}

/// Times every case in turn, `rounds` times over, with `decode` decoded tokens after each
/// prompt; `report` gets each case's result once its last round is done.
pub fn run(
    model: &Llama,
    cases: &[DecodeCase],
    decode: usize,
    rounds: usize,
    mut report: impl FnMut(&DecodeResult),
) -> Result<Vec<DecodeResult>> {
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); cases.len()];
    let mut policies = Vec::new();
    for case in cases {
        policies.push(Policy::parse(&case.spec, case.budget, (case.context + decode) as i64)?);
    }
    for round in 0..rounds {
        for (i, (case, policy)) in cases.iter().zip(&policies).enumerate() {
            samples[i].push(measure(model, policy, case.context, decode, round as i64)?);
            if round + 1 == rounds {
                report(&summarise(model, policy, case.context, &samples[i]));
            }
        }
    }
    Ok(cases.iter().zip(&policies).zip(&samples).map(|((c, p), s)| summarise(model, p, c.context, s)).collect())
}

#[derive(Clone)]
struct Sample {
    prefill_s: f64,
    token_s: Vec<f64>,
    cache_bytes: usize,
    peak_rss: Option<u64>,
    /// The read rate measured just before.
    rate: f64,
}

/// The read rate, then one prompt of `context` random ids (seeded by `seed`) and
/// `decode` tokens, greedy, with the peak resident memory of these two alone.
fn measure(model: &Llama, policy: &Policy, context: usize, decode: usize, seed: i64) -> Result<Sample> {
    let rate = read_rate()?;
    let prompt = {
        let _seed = crate::rng::seed_torch(seed);
        Tensor::randint(model.config.vocab_size, [1, context as i64], (Kind::Int64, tch::Device::Cpu))
    };
    reset_peak_rss();
    let mut cache = KvCache::new(policy.clone());
    let start = Instant::now();
    let mut logits = Tensor::new();
    for s in (0..context).step_by(PREFILL_BLOCK) {
        let t = PREFILL_BLOCK.min(context - s);
        logits = model.forward(&prompt.narrow(1, s as i64, t as i64), &mut cache);
    }
    let prefill_s = start.elapsed().as_secs_f64();
    let mut token_s = Vec::with_capacity(decode);
    for _ in 0..decode {
        let next = logits.select(1, -1).argmax(-1, true); // (1, 1)
        let start = Instant::now();
        logits = model.forward(&next, &mut cache);
        token_s.push(start.elapsed().as_secs_f64());
    }
    Ok(Sample { prefill_s, token_s, cache_bytes: cache.kv_bytes(), peak_rss: peak_rss_bytes(), rate })
}

fn summarise(model: &Llama, policy: &Policy, context: usize, samples: &[Sample]) -> DecodeResult {
    let mut rates: Vec<f64> = samples.iter().map(|s| s.rate).collect();
    let rate = quantile(&mut rates, 0.5);
    let mut prefill: Vec<f64> = samples.iter().map(|s| s.prefill_s).collect();
    let mut tokens: Vec<f64> = samples.iter().flat_map(|s| s.token_s.iter().copied()).collect();
    let cache_bytes = samples.last().map_or(0, |s| s.cache_bytes);
    let mut ms = |q: f64| 1e3 * quantile(&mut tokens, q);
    let decode_ms = [ms(0.5), ms(0.1), ms(0.9)];
    let decode_tok_s = 1e3 / decode_ms[0];
    let read_bytes_per_token = model.weight_bytes() + cache_bytes;
    DecodeResult {
        policy: policy.name.to_string(),
        budget: policy.budget,
        context,
        prefill_tok_s: context as f64 / quantile(&mut prefill, 0.5),
        decode_tok_s,
        decode_ms,
        cache_bytes,
        read_bytes_per_token,
        read_rate_bytes_s: rate,
        bandwidth_share: read_bytes_per_token as f64 * decode_tok_s / rate,
        peak_rss_bytes: samples.iter().filter_map(|s| s.peak_rss).max(),
    }
}

/// The `q` quantile of `values` (nearest rank); 0 for none.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}
