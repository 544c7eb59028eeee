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
//!
//! The decoder may be timed in several precisions in turns (`--precision f32,bf16`): in
//! bfloat16 a token reads half the bytes of weights and cache.

use std::time::Instant;

use serde::Serialize;
use tch::{Kind, Tensor};

use crate::config::{Arch, Mechanism, Precision};
use crate::error::Result;
use crate::generate::{Generator, Sampling};
use crate::metrics::{peak_rss_bytes, reset_peak_rss};
use crate::model::kv::{Budget, Policy};
use crate::model::llama::{ExpireRun, KvCache, Llama};
use crate::model::Lm;

/// Tokens the prompt is read in at a time, as `lethe generate` reads it.
pub const PREFILL_BLOCK: usize = crate::generate::PROMPT_BLOCK;

/// One configuration to time: a policy (`NAME[:KEY=VALUE,...]`) with its budget, at a
/// context length, on one of the models [`run`] is given (the decoder in a precision).
#[derive(Clone, Debug)]
pub struct DecodeCase {
    pub spec: String,
    pub budget: Option<Budget>,
    pub context: usize,
    /// Which model of [`run`]'s.
    pub model: usize,
}

/// What one configuration measured, over every round.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeResult {
    pub policy: String,
    /// The precision of the decoder's weights and cache: `f32`, `bf16` or `f16`.
    pub precision: String,
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

/// A lethe run with a learned memory (Expire-Span, the ∞-former) to time beside the
/// policies. Expire-Span on a Llama-family model reads as the policies read, through the
/// decoding path with the run's span predictors on the key-value cache
/// ([`crate::model::kv::expire`]); otherwise the prompt is read in blocks of its model's
/// `train.block`, as `lethe generate` reads one, then decoded token by token with its
/// memory, through the training model.
pub struct LearnedCase<'a> {
    /// The name its rows carry.
    pub name: String,
    /// The precision of the decoding path (an ∞-former reads in float32).
    precision: Precision,
    pub lm: &'a Lm,
    pub context: usize,
    /// The decoding path's model and span predictors, where it reads the run.
    decoding: Option<ExpireRun>,
}

impl<'a> LearnedCase<'a> {
    /// The run `lm`, named `name` in the rows, after a prompt of `context` tokens;
    /// Expire-Span on a Llama read in `precision`.
    pub fn new(name: String, lm: &'a Lm, context: usize, precision: Precision) -> Result<LearnedCase<'a>> {
        let cfg = &lm.config;
        let decoding = match (cfg.memory.mechanism, cfg.model.arch) {
            (Mechanism::Expire, Arch::Llama) => {
                Some(ExpireRun::new(cfg, &lm.vs.variables())?.into_precision(precision))
            }
            _ => None,
        };
        let precision = if decoding.is_some() { precision } else { Precision::F32 };
        Ok(LearnedCase { name, precision, lm, context, decoding })
    }
}

/// Times every case in turn (each on its model of `models`), then every learned run,
/// `rounds` times over, with `decode` decoded tokens after each prompt; `report` gets
/// each case's result once its last round is done.
pub fn run(
    models: &[Llama],
    cases: &[DecodeCase],
    learned: &[LearnedCase],
    decode: usize,
    rounds: usize,
    mut report: impl FnMut(&DecodeResult),
) -> Result<Vec<DecodeResult>> {
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); cases.len() + learned.len()];
    let mut policies = Vec::new();
    for case in cases {
        if case.model >= models.len() {
            return Err(crate::LetheError::Invalid(format!("a case on model {} of {}", case.model, models.len())));
        }
        policies.push(Policy::parse(&case.spec, case.budget, (case.context + decode) as i64)?);
    }
    let summary = |i: usize, samples: &[Sample]| match i.checked_sub(cases.len()) {
        None => {
            let (policy, model) = (&policies[i], &models[cases[i].model]);
            summarise((policy.name, policy.budget, model.precision()), model.weight_bytes(), cases[i].context, samples)
        }
        Some(j) => {
            let (case, name) = (&learned[j], learned[j].name.as_str());
            let weights = case.decoding.as_ref().map_or(weight_bytes(case.lm), |run| run.decoder().weight_bytes());
            summarise((name, None, case.precision), weights, case.context, samples)
        }
    };
    for round in 0..rounds {
        for i in 0..samples.len() {
            let sample = match i.checked_sub(cases.len()) {
                None => {
                    let fresh = || Ok(KvCache::new(policies[i].clone()));
                    measure(&models[cases[i].model], fresh, cases[i].context, decode, round as i64)?
                }
                Some(j) => measure_learned(&learned[j], decode, round as i64)?,
            };
            samples[i].push(sample);
            if round + 1 == rounds {
                report(&summary(i, &samples[i]));
            }
        }
    }
    Ok(samples.iter().enumerate().map(|(i, s)| summary(i, s)).collect())
}

/// The bytes of a run's parameters (what a token's forward pass reads whole).
fn weight_bytes(lm: &Lm) -> usize {
    lm.vs.variables().values().map(|t| t.numel() * t.kind().elt_size_in_bytes()).sum()
}

/// [`measure`] for a learned run: the read rate, then one prompt of the case's length and
/// `decode` tokens, greedy, through [`Generator`].
fn measure_learned(case: &LearnedCase, decode: usize, seed: i64) -> Result<Sample> {
    if let Some(run) = &case.decoding {
        return measure(run.decoder(), || run.cache(), case.context, decode, seed);
    }
    let rate = read_rate()?;
    let vocab = case.lm.config.model.vocab as u64;
    let mut rng = crate::rng::Rng::new(seed as u64);
    let prompt: Vec<crate::data::Token> =
        (0..case.context).map(|_| (rng.next_u64() % vocab) as crate::data::Token).collect();
    reset_peak_rss();
    let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 };
    let start = Instant::now();
    let mut g = Generator::new(case.lm, &prompt, &greedy)?;
    let prefill_s = start.elapsed().as_secs_f64();
    let mut token_s = Vec::with_capacity(decode);
    for _ in 0..decode {
        let start = Instant::now();
        g.next_token()?;
        token_s.push(start.elapsed().as_secs_f64());
    }
    Ok(Sample { prefill_s, token_s, cache_bytes: g.memory_bytes(), peak_rss: peak_rss_bytes(), rate })
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
/// `decode` tokens, greedy, into the cache `fresh` makes, with the peak resident memory
/// of these two alone.
fn measure(
    model: &Llama,
    fresh: impl Fn() -> Result<KvCache>,
    context: usize,
    decode: usize,
    seed: i64,
) -> Result<Sample> {
    let rate = read_rate()?;
    let prompt = {
        let _seed = crate::rng::seed_torch(seed);
        Tensor::randint(model.config.vocab_size, [1, context as i64], (Kind::Int64, tch::Device::Cpu))
    };
    reset_peak_rss();
    let mut cache = fresh()?;
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

/// One case's result over its rounds: `(name, budget, precision)` as its rows give
/// them, the bytes of weights a token reads.
fn summarise(
    policy: (&str, Option<i64>, Precision),
    weights: usize,
    context: usize,
    samples: &[Sample],
) -> DecodeResult {
    let mut rates: Vec<f64> = samples.iter().map(|s| s.rate).collect();
    let rate = quantile(&mut rates, 0.5);
    let mut prefill: Vec<f64> = samples.iter().map(|s| s.prefill_s).collect();
    let mut tokens: Vec<f64> = samples.iter().flat_map(|s| s.token_s.iter().copied()).collect();
    let cache_bytes = samples.last().map_or(0, |s| s.cache_bytes);
    let mut ms = |q: f64| 1e3 * quantile(&mut tokens, q);
    let decode_ms = [ms(0.5), ms(0.1), ms(0.9)];
    let decode_tok_s = 1e3 / decode_ms[0];
    let read_bytes_per_token = weights + cache_bytes;
    DecodeResult {
        policy: policy.0.to_string(),
        precision: policy.2.name().to_string(),
        budget: policy.1,
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
