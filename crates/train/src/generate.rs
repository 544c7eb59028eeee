//! Streaming generation: the prompt is read in blocks, then the model continues it one
//! token (a byte, or a tokenizer's id) at a time with the memory carried; a pretrained
//! Llama-family decoder the same way over its key-value cache ([`stream_decoder`]). Memory is
//! bounded by the mechanism (the span for Transformer-XL), so a run of any length uses
//! constant memory; nothing grows with the number of tokens generated.
//!
//! Two ways to feed a new token, chosen by the model ([`Feeding`]):
//! - **one token at a time**: each new token is a block of one (Transformer-XL,
//!   Adaptive-Span and Expire-Span on relative positions: the cache slides by one);
//! - **block by block**: as the model was trained. GPT-2's absolute positions restart at
//!   every block, and the ∞-former and Compressive memories take in a whole block at
//!   once, so the current block fills token by token: each new token is read with the
//!   block so far on top of the memory of the blocks before, and the memory takes in the
//!   block only once it is full. Each token then costs a forward over the partial block.

use tch::{Kind, Tensor};

use lethe_core::config::Arch;
use lethe_core::error::{LetheError, Result};
use lethe_core::rng::Rng;
use lethe_data::Token;
use lethe_model::llama::{KvCache, Llama};
use lethe_model::{Lm, Memory};

/// How the next token is chosen.
#[derive(Clone, Debug)]
pub struct Sampling {
    /// Softmax temperature; 0 means greedy (argmax). Default 1.
    pub temperature: f64,
    /// Keep only the `top_k` most likely tokens (0: all). Default 0.
    pub top_k: usize,
    /// Nucleus sampling: keep the most likely tokens up to this much probability, the
    /// one that crosses it included (the official dialogue evaluation's 0.9; 1: all).
    /// Default 1.
    pub top_p: f64,
    /// Seed of the sampler.
    pub seed: u64,
}

impl Sampling {
    /// Refuses a temperature that is negative or not a number.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(LetheError::Invalid(format!(
                "--temperature {}: must be a finite number, 0 (greedy) or more",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(LetheError::Invalid(format!("--top-p {}: must be in (0, 1]", self.top_p)));
        }
        Ok(())
    }
}

/// How a model takes in the tokens it generates (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feeding {
    /// Each token a block of one.
    OneByOne,
    /// The current block re-read with each new token; the memory takes it in when full.
    BlockByBlock,
}

impl Feeding {
    /// How `lm` was trained to see its input.
    pub fn of(lm: &Lm) -> Feeding {
        let blocks = lethe_model::memory::describe(lm.config.memory.mechanism).reads_whole_blocks();
        if lm.config.model.arch != Arch::Lethe || blocks {
            Feeding::BlockByBlock
        } else {
            Feeding::OneByOne
        }
    }
}

/// A streaming generator: reads a prompt, then yields one token at a time. Its memory is
/// that of the model's mechanism, whatever the number of tokens produced.
pub struct Generator<'a> {
    lm: &'a Lm,
    mem: Memory,
    logits: Tensor,
    rng: Rng,
    sampling: Sampling,
    feeding: Feeding,
    /// The tokens of the block being filled (block-by-block feeding).
    partial: Vec<i64>,
}

impl<'a> Generator<'a> {
    /// Reads `prompt` in blocks of the training block length.
    pub fn new(lm: &'a Lm, prompt: &[Token], sampling: &Sampling) -> Result<Self> {
        Self::with_progress(lm, prompt, sampling, |_, _| {})
    }

    /// Like [`Generator::new`], calling `progress(tokens read, prompt length)` after
    /// every block of the prompt (a long prompt takes a while).
    pub fn with_progress(
        lm: &'a Lm,
        prompt: &[Token],
        sampling: &Sampling,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self> {
        sampling.validate()?;
        if prompt.is_empty() {
            return Err(LetheError::Invalid("the prompt is empty: give at least one token (--prompt)".into()));
        }
        let vocab = lm.config.model.vocab;
        if let Some(t) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(LetheError::Invalid(format!(
                "the prompt holds token id {t}, beyond the model's vocabulary of {vocab}"
            )));
        }
        let mut g = Generator {
            lm,
            mem: lm.model.new_memory(),
            logits: Tensor::zeros([0], (Kind::Float, lm.device())),
            rng: Rng::new(sampling.seed),
            sampling: sampling.clone(),
            feeding: Feeding::of(lm),
            partial: vec![],
        };
        let mut read = 0;
        for chunk in prompt.chunks(lm.config.train.block.max(1)) {
            let ids: Vec<i64> = chunk.iter().map(|&t| t as i64).collect();
            g.feed(&ids)?;
            read += chunk.len();
            progress(read, prompt.len());
        }
        Ok(g)
    }

    /// Takes in `ids` as the model's feeding says (at most the rest of a block).
    fn feed(&mut self, ids: &[i64]) -> Result<()> {
        match self.feeding {
            Feeding::OneByOne => self.absorb(ids),
            Feeding::BlockByBlock => {
                self.partial.extend_from_slice(ids);
                self.step_block()
            }
        }
    }

    /// Runs `ids` through the model, the memory taking them in; keeps the logits of
    /// the last one.
    fn absorb(&mut self, ids: &[i64]) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let x = Tensor::from_slice(ids).view([1, -1]).to_device(self.lm.device()); // (1, m)
        let out = self.lm.model.forward(&x, &mut self.mem, false)?;
        self.logits = out.logits.select(1, -1).squeeze_dim(0); // (V)
        Ok(())
    }

    /// Block-by-block feeding: a full block is taken into memory; a partial one is read
    /// over the memory, which is then put back as it was.
    fn step_block(&mut self) -> Result<()> {
        let ids = std::mem::take(&mut self.partial);
        if ids.len() >= self.lm.config.train.block {
            return self.absorb(&ids);
        }
        let before = self.mem.state();
        self.absorb(&ids)?;
        self.mem.load_state(&before)?;
        self.partial = ids;
        Ok(())
    }

    /// The logits `(V)` of the next token.
    pub fn next_logits(&self) -> &Tensor {
        &self.logits
    }

    /// The next token, which is also fed back as the next input.
    pub fn next_token(&mut self) -> Result<Token> {
        let next = choose(&self.logits, &self.sampling, &mut self.rng);
        self.feed(&[next as i64])?;
        Ok(next)
    }

    /// Takes in `tokens` as if they had been generated (the other speaker's turn, or a
    /// reference response): no sampling, the memory carried.
    pub fn read(&mut self, tokens: &[Token]) -> Result<()> {
        let block = self.lm.config.train.block.max(1);
        let mut rest: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        while !rest.is_empty() {
            // Block-by-block feeding fills the current block first (it holds fewer than
            // a block's tokens: a full one is taken into memory); never more than a block.
            let room = (block - self.partial.len()).min(rest.len());
            let piece: Vec<i64> = rest.drain(..room).collect();
            self.feed(&piece)?;
        }
        Ok(())
    }

    /// Everything the next token depends on, to come back to with [`Generator::restore`]
    /// (cheap: the memory's tensors are shared, not copied).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot { memory: self.mem.state(), logits: self.logits.shallow_clone(), partial: self.partial.clone() }
    }

    /// Returns to a [`Generator::snapshot`].
    pub fn restore(&mut self, s: &Snapshot) -> Result<()> {
        self.mem.load_state(&s.memory)?;
        self.logits = s.logits.shallow_clone();
        self.partial = s.partial.clone();
        Ok(())
    }

    /// Takes in `token` without sampling (beam search chooses its own).
    pub fn push(&mut self, token: Token) -> Result<()> {
        self.feed(&[token as i64])
    }

    /// States held by each layer's memory now.
    pub fn memory_held(&self) -> Vec<usize> {
        self.mem.reports().iter().map(|r| r.held).collect()
    }

    /// Bytes of every tensor the memory holds now.
    pub fn memory_bytes(&self) -> usize {
        self.mem.state().iter().map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum()
    }
}

/// A generator's state at one point (see [`Generator::snapshot`]).
pub struct Snapshot {
    memory: Vec<(String, Tensor)>,
    logits: Tensor,
    partial: Vec<i64>,
}

/// Continues `prompt` by `count` tokens, calling `emit` on each new one as it is made.
/// Returns the generated tokens.
pub fn generate(
    lm: &Lm,
    prompt: &[Token],
    count: usize,
    sampling: &Sampling,
    mut emit: impl FnMut(Token),
) -> Result<Vec<Token>> {
    let mut out = vec![];
    stream(
        lm,
        prompt,
        count,
        sampling,
        |_, _| {},
        |t| {
            emit(t);
            out.push(t);
            Ok(())
        },
    )?;
    Ok(out)
}

/// Continues `prompt` by `count` tokens, handing each to `emit` and keeping none (memory
/// stays constant however large `count` is), with `progress` as for
/// [`Generator::with_progress`]. `emit` may stop the stream early by returning an error.
pub fn stream(
    lm: &Lm,
    prompt: &[Token],
    count: usize,
    sampling: &Sampling,
    progress: impl FnMut(usize, usize),
    mut emit: impl FnMut(Token) -> Result<()>,
) -> Result<()> {
    let mut g = Generator::with_progress(lm, prompt, sampling, progress)?;
    for _ in 0..count {
        emit(g.next_token()?)?;
    }
    Ok(())
}

/// Tokens a pretrained decoder reads its prompt in at a time ([`stream_decoder`]).
pub const PROMPT_BLOCK: usize = 512;

/// [`stream`] for a Llama-family decoder over `cache`, which keeps what its policy says
/// (the whole cache by default): the prompt read in blocks of [`PROMPT_BLOCK`] tokens,
/// then one token at a time, each reading the cache.
pub fn stream_decoder(
    model: &Llama,
    cache: &mut KvCache,
    prompt: &[Token],
    count: usize,
    sampling: &Sampling,
    progress: impl FnMut(usize, usize),
    emit: impl FnMut(Token) -> Result<()>,
) -> Result<()> {
    stream_decoder_in(model, cache, (prompt, PROMPT_BLOCK), count, sampling, progress, emit)
}

/// [`stream_decoder`] with the prompt read in blocks of `block` tokens (`(prompt,
/// block)`): a learned policy's run reads its prompt in its training blocks.
pub fn stream_decoder_in(
    model: &Llama,
    cache: &mut KvCache,
    (prompt, block): (&[Token], usize),
    count: usize,
    sampling: &Sampling,
    progress: impl FnMut(usize, usize),
    mut emit: impl FnMut(Token) -> Result<()>,
) -> Result<()> {
    check_prompt(model, prompt)?;
    let mut g = DecoderGenerator::with_progress(model, std::mem::take(cache), prompt, block, progress)?;
    let mut rng = Rng::new(sampling.seed);
    let emitted = (0..count).try_for_each(|i| {
        let next = choose(&g.logits, sampling, &mut rng);
        emit(next)?;
        if i + 1 < count {
            g.push(next)?;
        }
        Ok(())
    });
    // What was read stays in the caller's cache, also when `emit` stopped the stream.
    *cache = g.cache;
    emitted
}

/// Refuses an empty prompt or one with a token beyond `model`'s vocabulary.
fn check_prompt(model: &Llama, prompt: &[Token]) -> Result<()> {
    let vocab = model.config.vocab_size;
    if prompt.is_empty() {
        return Err(LetheError::Invalid("the prompt is empty: a decoder continues at least one token".into()));
    }
    match prompt.iter().find(|&&t| t as i64 >= vocab) {
        Some(&bad) => {
            Err(LetheError::Invalid(format!("prompt token {bad} is not below the model's vocab_size = {vocab}")))
        }
        None => Ok(()),
    }
}

/// [`Generator`] for a Llama-family decoder over a key-value cache, greedy: the prompt
/// read `block` tokens at a time (each block's entries join the cache and the policy
/// evicts after it: a block of 1 predicts each token from what the policy kept alone),
/// then one token at a time.
pub struct DecoderGenerator<'a> {
    model: &'a Llama,
    cache: KvCache,
    logits: Tensor,
}

impl<'a> DecoderGenerator<'a> {
    /// Reads `prompt` into `cache`, `block` tokens at a time.
    pub fn new(model: &'a Llama, cache: KvCache, prompt: &[Token], block: usize) -> Result<Self> {
        Self::with_progress(model, cache, prompt, block, |_, _| {})
    }

    /// Like [`DecoderGenerator::new`], calling `progress(tokens read, prompt length)`
    /// after every block.
    pub fn with_progress(
        model: &'a Llama,
        cache: KvCache,
        prompt: &[Token],
        block: usize,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self> {
        check_prompt(model, prompt)?;
        let mut g = DecoderGenerator { model, cache, logits: Tensor::new() };
        let mut read = 0;
        for chunk in prompt.chunks(block.max(1)) {
            g.read(chunk);
            read += chunk.len();
            progress(read, prompt.len());
        }
        Ok(g)
    }

    /// Runs `tokens` through the model over the cache; keeps the last one's logits.
    fn read(&mut self, tokens: &[Token]) {
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        self.logits = self.model.forward(&Tensor::from_slice(&ids).unsqueeze(0), &mut self.cache).get(0).get(-1);
    }

    /// Takes in `token` without choosing it.
    pub fn push(&mut self, token: Token) -> Result<()> {
        if token as i64 >= self.model.config.vocab_size {
            return Err(LetheError::Invalid(format!(
                "token {token} is not below the model's vocab_size = {}",
                self.model.config.vocab_size
            )));
        }
        self.read(&[token]);
        Ok(())
    }

    /// The most likely next token, which is also fed back as the next input.
    pub fn next_token(&mut self) -> Result<Token> {
        let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 };
        let next = choose(&self.logits, &greedy, &mut Rng::new(0));
        self.push(next)?;
        Ok(next)
    }

    /// The logits `(V)` of the next token.
    pub fn next_logits(&self) -> &Tensor {
        &self.logits
    }

    /// Entries each layer's cache holds per key-value head now.
    pub fn memory_held(&self) -> Vec<usize> {
        self.cache.entries().into_iter().map(|n| n as usize).collect()
    }
}

/// Picks a token from `logits` `(V)` by `sampling`.
fn choose(logits: &Tensor, sampling: &Sampling, rng: &mut Rng) -> Token {
    let values: Vec<f32> = logits.to_kind(Kind::Float).to_device(tch::Device::Cpu).try_into().unwrap_or_default();
    if sampling.temperature <= 0.0 {
        let best = values.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i);
        return best as Token;
    }
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    if sampling.top_k > 0 {
        order.truncate(sampling.top_k);
    }
    let top = values[order[0]] as f64;
    let mut weights: Vec<f32> =
        order.iter().map(|&i| ((values[i] as f64 - top) / sampling.temperature).exp() as f32).collect();
    if sampling.top_p < 1.0 {
        // Keep the smallest prefix whose probability reaches top_p (at least one token).
        let total: f64 = weights.iter().map(|&w| w as f64).sum();
        let mut mass = 0.0;
        let keep = weights.iter().position(|&w| {
            mass += w as f64 / total;
            mass >= sampling.top_p
        });
        weights.truncate(keep.map_or(weights.len(), |k| k + 1));
    }
    order[rng.categorical(&weights)] as Token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_holds_constant_memory_however_long_it_runs() {
        let mut cfg = lethe_core::config::Config::default();
        cfg.model.layers = 2;
        cfg.model.d_model = 16;
        cfg.model.heads = 2;
        cfg.memory.span = 12;
        cfg.train.block = 4;
        let lm = Lm::new(&cfg, tch::Device::Cpu).unwrap();
        let sampling = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 3 };
        let hello: Vec<Token> = b"hello".iter().map(|&b| b as Token).collect();
        let mut g = Generator::new(&lm, &hello, &sampling).unwrap();
        assert_eq!(g.memory_held(), vec![5, 5]);
        let mut held = vec![];
        for i in 0..300 {
            g.next_token().unwrap();
            if i % 50 == 49 {
                held.push(g.memory_held());
            }
        }
        assert!(held.iter().all(|h| h == &vec![12, 12]), "{held:?}");
        // Same seed, same bytes.
        let a = generate(&lm, &hello, 20, &sampling, |_| {}).unwrap();
        let b = generate(&lm, &hello, 20, &sampling, |_| {}).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn greedy_takes_the_argmax_and_top_k_limits_the_choice() {
        let logits = Tensor::from_slice(&[0.0f32, 3.0, 2.9, -1.0]);
        let mut rng = Rng::new(1);
        let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 };
        assert_eq!(choose(&logits, &greedy, &mut rng), 1);
        let top2 = Sampling { temperature: 1.0, top_k: 2, top_p: 1.0, seed: 1 };
        for _ in 0..200 {
            assert!(matches!(choose(&logits, &top2, &mut rng), 1 | 2));
        }
        // Probabilities of [0, 3, 2.9, -1] are about .03 .51 .46 .01: top_p 0.5 keeps
        // token 1 alone (it crosses 0.5), 0.9 keeps 1 and 2, 0.99 adds 0.
        let nucleus = |p: f64| Sampling { temperature: 1.0, top_k: 0, top_p: p, seed: 1 };
        let seen = |p: f64, rng: &mut Rng| {
            (0..300).map(|_| choose(&logits, &nucleus(p), rng)).collect::<std::collections::BTreeSet<_>>()
        };
        assert_eq!(seen(0.5, &mut rng).into_iter().collect::<Vec<_>>(), vec![1]);
        assert_eq!(seen(0.9, &mut rng).into_iter().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(seen(0.99, &mut rng).into_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
    }
}
