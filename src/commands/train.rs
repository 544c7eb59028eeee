//! `lethe train`, `eval` and `generate`: a run trained, scored, and continued.

use std::io::Write;

use anyhow::{Context, Result};

use crate::cli::{EvalArgs, GenerateArgs, TrainArgs};
use crate::commands::decoder;
use lethe::checkpoint::Checkpoint;
use lethe::config::{Arch, Mechanism, Source, PRESETS};
use lethe::data::Split;
use lethe::generate::Sampling;
use lethe::model::Lm;

/// Handles --list-presets, --print-config and --help-config; returns true when the
/// command is done.
pub(crate) fn informational(args: &crate::cli::ConfigArgs) -> Result<bool> {
    if let Some(prefix) = &args.help_config {
        let keys = lethe::config::reference::keys()?;
        let text = lethe::config::reference::text(&keys, prefix);
        anyhow::ensure!(!text.is_empty(), "--help-config: no config key starts with `{prefix}`");
        print!("{text}");
        return Ok(true);
    }
    if args.list_presets {
        let width = PRESETS.iter().map(|p| p.name.len()).max().unwrap_or(0);
        for p in PRESETS {
            println!("{:<width$}  {}", p.name, p.about);
        }
        return Ok(true);
    }
    if args.print_config {
        print!("{}", args.resolve()?.to_toml()?);
        return Ok(true);
    }
    Ok(false)
}

pub(crate) fn train(a: TrainArgs) -> Result<()> {
    if informational(&a.config)? {
        return Ok(());
    }
    if a.resume
        && (a.config.init_from.is_some()
            || a.config.overrides.iter().any(|o| o.trim_start().starts_with("train.init_from")))
    {
        anyhow::bail!("--init-from starts a run from another run's parameters, and --resume continues this run from its own checkpoint: give one of them");
    }
    let cfg = if a.resume { a.config.resolve_for_resume(&a.out)? } else { a.config.resolve()? };
    let opts = lethe::train::TrainOptions {
        out_dir: a.out,
        resume: a.resume,
        overwrite: a.overwrite,
        quiet: a.quiet,
        stop_after: a.stop_after,
        no_eval: a.no_eval,
        accept_changes: a.accept_changes,
    };
    let leader = lethe::dist::Launch::from_env()?.is_none_or(|l| l.rank == 0); // rank 0 speaks for a torchrun launch
    if cfg.data.source.is_rl() {
        let summary = lethe::rl::train::train(&cfg, &opts)?;
        super::quiet_on_closed_pipe(); // all is saved; the summary line may meet a closed pipe
        match summary.last_eval.filter(|_| leader) {
            Some(r) => println!("done: {}; run folder {}", r.line(), summary.run_dir.display()),
            None if leader => println!("done: not evaluated (--no-eval); run folder {}", summary.run_dir.display()),
            None => {}
        }
        return Ok(());
    }
    let summary = lethe::train::train(&cfg, &opts)?;
    super::quiet_on_closed_pipe();
    if summary.last_eval.is_none() && leader {
        println!("done: not evaluated (--no-eval); run folder {}", summary.run_dir.display());
    } else if summary.last_eval.as_ref().is_some_and(|r| leader && r.tokens == 0) {
        println!(
            "done: the last evaluation scored no token ({}); run folder {}",
            lethe::eval::NOTHING_SCORED_ADVICE,
            summary.run_dir.display()
        );
    } else if let Some(r) = summary.last_eval.filter(|_| leader) {
        let rate = if cfg.data.tokenizer.is_some() {
            format!("perplexity {}", lethe::metrics::format_perplexity(r.ppl, 2))
        } else {
            format!("{:.4} bpb", r.bpb)
        };
        println!(
            "done: valid loss {:.4} nats ({rate}), accuracy {:.1}% (unigram baseline {:.4} nats); run folder {}",
            r.loss,
            100.0 * r.accuracy,
            summary.unigram_baseline,
            summary.run_dir.display()
        );
    }
    Ok(())
}

/// Loads a checkpoint, applying an inference-time span cap when one is asked for.
pub(crate) fn load_checkpoint(path: &std::path::Path, max_span: Option<usize>) -> Result<Checkpoint> {
    let mut ckpt = Checkpoint::load(path)?;
    if let Some(cap) = max_span {
        if ckpt.config.memory.mechanism != Mechanism::Expire {
            anyhow::bail!(
                "--max-span {cap}: only Expire-Span models predict spans; this checkpoint's memory is `{}`",
                ckpt.config.memory.mechanism
            );
        }
        if cap == 0 {
            anyhow::bail!("--max-span must be at least 1");
        }
        ckpt.config.memory.expire.inference_cap = cap;
    }
    Ok(ckpt)
}

pub(crate) fn eval(a: EvalArgs) -> Result<()> {
    let device = lethe::device::parse_flag("--device", &a.device)?;
    if a.init_from.is_none() && a.kv.given() {
        anyhow::bail!(
            "--policy and --budget choose what a pretrained decoder's key-value cache keeps: give --init-from FOLDER"
        );
    }
    if let (None, Some(p)) = (&a.init_from, a.precision.filter(|&p| p != lethe::config::train::Precision::F32)) {
        anyhow::bail!("--precision {} applies to a pretrained decoder: give --init-from FOLDER", p.name());
    }
    let checkpoint = match (&a.init_from, &a.checkpoint) {
        (Some(folder), _) => return decoder::eval(&a, folder, device),
        (None, Some(checkpoint)) => checkpoint.clone(),
        (None, None) => anyhow::bail!("give a model with --checkpoint RUN or --init-from FOLDER"),
    };
    let mut ckpt = load_checkpoint(&checkpoint, a.max_span)?;
    ckpt.config = same_tokenizer(&ckpt.config, ckpt.config.clone().apply_overrides(&a.overrides)?)?;
    ckpt.config.validate()?;
    if let Some(context) = a.context {
        return decoder::eval_run_windows(&a, &ckpt, context, device);
    }
    if ckpt.config.data.source.is_rl() {
        refuse_stream_flags(&a)?;
        return eval_agent(&ckpt, device, &a);
    }
    if a.episodes.is_some() {
        anyhow::bail!("--episodes applies to gridworld checkpoints (corridor, portal); this one is a language model");
    }
    if a.max_tokens == Some(0) {
        anyhow::bail!("--max-tokens must be at least 1");
    }
    let split: Split = a.split.as_deref().unwrap_or("valid").parse()?;
    let mut cfg = ckpt.config.clone();
    if let Some(path) = a.data {
        cfg.data.source = Source::for_path(&path);
        cfg.data.path = Some(path);
    }
    let block = a.block.unwrap_or(cfg.train.block);
    if block == 0 {
        anyhow::bail!("--block must be at least 1");
    }
    cfg.memory.validate(block, cfg.model.arch)?;
    let batch = a.batch.unwrap_or(cfg.train.batch);
    if batch == 0 {
        anyhow::bail!("--batch must be at least 1");
    }
    if let Some(path) = &a.per_token {
        let checkpoint = lethe::checkpoint::resolve(&checkpoint);
        lethe::output::check("--per-token", path, &[&checkpoint, cfg.data.path.as_deref().unwrap_or(&checkpoint)])?;
    }
    let mut sized = cfg.clone();
    (sized.train.batch, sized.train.block) = (batch, block);
    lethe::model::check_fits(&sized, device)
        .with_context(|| format!("evaluating {batch} streams in blocks of {block} (--batch, --block)"))?;
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let data = lethe::task::load_split(&cfg, split, batch)?;
    let started = std::time::Instant::now();
    let mut last_report = started;
    let progress = |done: usize, total: usize| {
        if last_report.elapsed().as_secs_f64() >= 5.0 && done < total {
            last_report = std::time::Instant::now();
            let elapsed = started.elapsed().as_secs_f64();
            let eta = elapsed / done as f64 * (total - done) as f64;
            lethe::say!(
                "eval {split}: {done}/{total} tokens ({:.0}%), ETA {}",
                100.0 * done as f64 / total as f64,
                lethe::metrics::format_duration(std::time::Duration::from_secs_f64(eta))
            );
        }
    };
    let r = match &a.per_token {
        None => lethe::eval::evaluate_with_progress(&lm, &data, batch, block, a.max_tokens, progress)?,
        Some(path) => {
            let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
            let text = |id: lethe::data::Token| match &tokenizer {
                Some(t) => t.decode(&[id]),
                None => Ok(String::from_utf8_lossy(&[id as u8]).into_owned()),
            };
            let mut csv = lethe::eval::PerTokenCsv::create(path)?;
            // A signal stops the evaluation between rows, the partial file removed.
            let _signals = lethe::run::Signals::watch()?;
            let r = lethe::eval::evaluate_per_token(&lm, &data, (batch, block, a.max_tokens), progress, |s| {
                if let Some(signal) = lethe::run::stop_requested() {
                    return Err(lethe::error::LetheError::Stopped { signal });
                }
                csv.write(s, &text(s.target)?)
            })
            .map_err(|e| anyhow::anyhow!("{e}; `{}` not written", path.display()))?;
            csv.finish()?;
            lethe::say!("wrote {}", path.display());
            r
        }
    };
    if r.tokens == 0 {
        anyhow::bail!(
            "no scored token in the {split} tokens evaluated ({} streams x blocks of {block}{}): this task scores only its answers; raise --max-tokens or lower --batch",
            batch,
            a.max_tokens.map(|m| format!(", --max-tokens {m}")).unwrap_or_default()
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let answers = r.answer_accuracy.map(|x| format!(", answers {:.2}%", 100.0 * x)).unwrap_or_default();
        let unit = if cfg.data.tokenizer.is_some() { "token" } else { "byte" };
        let ppl = |p: f64| lethe::metrics::format_perplexity(p, 2);
        let words = r.word_ppl.map(|p| format!(", per word {}", ppl(p))).unwrap_or_default();
        println!(
            "{split}: loss {:.4} nats, {:.4} bits per {unit}, perplexity {}{words}, accuracy {:.2}%{answers} over {} scored tokens (block {block}, {batch} streams)",
            r.loss,
            r.bpb,
            ppl(r.ppl),
            100.0 * r.accuracy,
            r.tokens
        );
        let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
        let spans = r.mean_span.as_ref().map(|s| format!(" | mean span per layer [{}]", fmt(s))).unwrap_or_default();
        println!("memory size per layer [{}] | cache held per layer [{}]{spans}", fmt(&r.mem_size), fmt(&r.held));
        println!("evaluated in {:.1} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// `cfg` (a checkpoint's config with a command's `--set`s) when it reads text through
/// the tokenizer the model was `trained` with: other ids would be scored against the
/// model's own without a word.
pub(crate) fn same_tokenizer(
    trained: &lethe::config::Config,
    cfg: lethe::config::Config,
) -> Result<lethe::config::Config> {
    if cfg.data.tokenizer != trained.data.tokenizer {
        let name = |t: &Option<std::path::PathBuf>| {
            t.as_ref().map_or("none (bytes)".to_string(), |p| format!("`{}`", p.display()))
        };
        anyhow::bail!("--set data.tokenizer: the model reads the ids of the tokenizer it was trained with ({}); it cannot read another's", name(&trained.data.tokenizer));
    }
    Ok(cfg)
}

/// Refuses the flags of `lethe eval` that apply to token streams only, for an agent.
pub(crate) fn refuse_stream_flags(a: &EvalArgs) -> Result<()> {
    let given = [
        ("--split", a.split.is_some()),
        ("--block", a.block.is_some()),
        ("--max-tokens", a.max_tokens.is_some()),
        ("--data", a.data.is_some()),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
        anyhow::bail!("{flag} applies to language-model checkpoints; a gridworld agent is scored on fresh episodes (see --episodes)");
    }
    Ok(())
}

/// `lethe eval` of a gridworld agent: play episodes apart from training's.
pub(crate) fn eval_agent(ckpt: &Checkpoint, device: tch::Device, a: &EvalArgs) -> Result<()> {
    let mut ckpt_cfg = ckpt.config.clone();
    if let Some(batch) = a.batch {
        if batch == 0 {
            anyhow::bail!("--batch must be at least 1");
        }
        ckpt_cfg.train.batch = batch;
    }
    let agent = lethe::rl::agent::Agent::new(&ckpt_cfg, device)?;
    ckpt.load_parameters(&agent.vs.variables())?;
    let episodes = a.episodes.unwrap_or(ckpt_cfg.rl.eval_episodes);
    if episodes == 0 {
        anyhow::bail!("--episodes must be at least 1");
    }
    let started = std::time::Instant::now();
    let r = lethe::rl::train::evaluate(&agent, episodes)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("{}", r.line());
        println!("evaluated in {:.1} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

pub(crate) fn generate(a: GenerateArgs) -> Result<()> {
    let device = lethe::device::parse_flag("--device", &a.device)?;
    let sampling = Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    sampling.validate()?;
    if a.init_from.is_none() && a.kv.given() {
        anyhow::bail!(
            "--policy and --budget choose what a pretrained decoder's key-value cache keeps: give --init-from FOLDER"
        );
    }
    let prompt = prompt_of(&a)?;
    match (&a.init_from, &a.checkpoint) {
        (Some(folder), _) => decoder::generate(&a, folder, prompt, &sampling, device),
        (None, Some(checkpoint)) => generate_from_run(&a, checkpoint, prompt, &sampling, device),
        (None, None) => anyhow::bail!("give a model with --checkpoint RUN or --init-from FOLDER"),
    }
}

/// The prompt as given: text (`--prompt`, `--prompt-file`) or token ids (`--prompt-ids`).
pub(crate) enum Prompt {
    Text(Vec<u8>),
    Ids(Vec<u32>),
}

fn prompt_of(a: &GenerateArgs) -> Result<Prompt> {
    Ok(match (&a.prompt, &a.prompt_file, &a.prompt_ids) {
        (Some(p), _, _) => Prompt::Text(p.clone().into_bytes()),
        (None, Some(f), _) => {
            Prompt::Text(lethe::input::read(f).map_err(|e| anyhow::anyhow!("--prompt-file `{}`: {e}", f.display()))?)
        }
        (None, None, Some(ids)) => Prompt::Ids(ids.clone()),
        (None, None, None) => {
            anyhow::bail!("give a prompt with --prompt TEXT, --prompt-file FILE or --prompt-ids 1,2,3")
        }
    })
}

/// The prompt's tokens: ids as given (each below `vocab`), or the text through `tokenizer`
/// (bytes without one).
pub(crate) fn prompt_tokens(
    a: &GenerateArgs,
    prompt: &Prompt,
    tokenizer: Option<&lethe::data::tokenizer::Tokenizer>,
    vocab: usize,
) -> Result<Vec<lethe::data::Token>> {
    let ids = match (prompt, tokenizer) {
        (Prompt::Ids(ids), _) => ids.clone(),
        (Prompt::Text(bytes), None) => bytes.iter().map(|&b| b as lethe::data::Token).collect(),
        (Prompt::Text(bytes), Some(t)) => {
            let origin = a.prompt_file.clone().unwrap_or_else(|| "--prompt".into());
            let text = lethe::data::text::utf8(bytes.clone(), &origin)?;
            lethe::data::text::encode_long(t, &text).map_err(|e| anyhow::anyhow!("`{}`: {e}", origin.display()))?
        }
    };
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        anyhow::bail!("--prompt-ids: token {bad} is not below the model's vocabulary of {vocab}");
    }
    Ok(ids)
}

/// Where `lethe generate` writes: the prompt and its continuation as text, or with
/// `--print-ids` the generated ids, comma-separated.
pub(crate) struct Printer<'t> {
    out: std::io::StdoutLock<'static>,
    text: Option<lethe::data::tokenizer::TextStream<'t>>,
    ids: bool,
    written: usize,
}

impl<'t> Printer<'t> {
    pub(crate) fn new(a: &GenerateArgs, tokenizer: Option<&'t lethe::data::tokenizer::Tokenizer>) -> Printer<'t> {
        let text = tokenizer.map(lethe::data::tokenizer::TextStream::new);
        Printer { out: std::io::stdout().lock(), text, ids: a.print_ids, written: 0 }
    }

    /// The prompt, echoed before the continuation (text only).
    pub(crate) fn prompt(&mut self, prompt: &Prompt, tokens: &[lethe::data::Token]) -> Result<()> {
        if self.ids {
            return Ok(());
        }
        match prompt {
            Prompt::Text(bytes) => self.put(bytes)?,
            Prompt::Ids(_) => {
                for &t in tokens {
                    self.token(t)?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn token(&mut self, t: lethe::data::Token) -> lethe::Result<()> {
        let piece = match (self.ids, self.text.as_mut()) {
            (true, _) => format!("{}{t}", if self.written > 0 { "," } else { "" }).into_bytes(),
            (false, None) => vec![t as u8],
            (false, Some(s)) => s.push(t)?.into_bytes(),
        };
        self.written += 1;
        self.put(&piece)
    }

    pub(crate) fn finish(mut self) -> Result<()> {
        let rest = match (self.ids, self.text.as_mut()) {
            (false, Some(s)) => s.finish()?,
            _ => String::new(),
        };
        Ok(self.put(format!("{rest}\n").as_bytes())?)
    }

    /// Writes `bytes` to standard output at once.
    fn put(&mut self, bytes: &[u8]) -> lethe::Result<()> {
        self.out.write_all(bytes).and_then(|()| self.out.flush()).map_err(super::stdout_failed)
    }
}

/// Reports how much of a long prompt has been read, every 2 s.
pub(crate) fn prompt_progress(unit: &'static str) -> impl FnMut(usize, usize) {
    let mut last_report = std::time::Instant::now();
    move |done: usize, total: usize| {
        if last_report.elapsed().as_secs_f64() >= 2.0 && done < total {
            last_report = std::time::Instant::now();
            lethe::say!("reading the prompt: {done}/{total} {unit} ({:.0}%)", 100.0 * done as f64 / total as f64);
        }
    }
}

fn generate_from_run(
    a: &GenerateArgs,
    checkpoint: &std::path::Path,
    prompt: Prompt,
    sampling: &Sampling,
    device: tch::Device,
) -> Result<()> {
    let ckpt = load_checkpoint(checkpoint, a.max_span)?;
    let cfg = &ckpt.config;
    let decoding = (cfg.memory.mechanism, cfg.model.arch) == (Mechanism::Expire, Arch::Llama);
    if let Some(p) = a.precision.filter(|&p| !decoding && p != lethe::config::train::Precision::F32) {
        anyhow::bail!(
            "--precision {}: only Expire-Span on a Llama-family model reads a run through the decoder, in a precision of choice; this run generates in f32",
            p.name()
        );
    }
    // The checkpoint's thread count, at most this machine's cores (it may come from a larger one).
    lethe::device::apply_threads(ckpt.config.train.threads.min(lethe::device::cores()))?;
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
    let ids = prompt_tokens(a, &prompt, tokenizer.as_ref(), ckpt.config.model.vocab)?;
    let unit = if tokenizer.is_some() { "tokens" } else { "bytes" };
    let mut printer = Printer::new(a, tokenizer.as_ref());
    printer.prompt(&prompt, &ids)?;
    let progress = prompt_progress(unit);
    if !decoding {
        lethe::generate::stream(&lm, &ids, a.bytes, sampling, progress, |t| printer.token(t))?;
        return printer.finish();
    }
    // Expire-Span on a Llama: its span predictors on the decoder's key-value cache, the
    // prompt read in training blocks, then a token at a time.
    let precision = a.precision.unwrap_or_default();
    let run = lethe::model::llama::ExpireRun::new(cfg, &lm.vs.variables())?.into_precision(precision);
    let mut cache = run.cache()?;
    let prompt = (ids.as_slice(), cfg.train.block);
    lethe::generate::stream_decoder_in(run.decoder(), &mut cache, prompt, a.bytes, sampling, progress, |t| {
        printer.token(t)
    })?;
    printer.finish()?;
    let most = cache.entries().into_iter().max().unwrap_or(0);
    lethe::say!(
        "cache (expire, {}): {most} entries a layer at most, {:.1} MiB",
        precision.name(),
        decoder::mib(cache.bytes())
    );
    Ok(())
}
