//! The commands on a pretrained Llama-family decoder read from its Hugging Face folder
//! (`--init-from FOLDER`): generating, and scoring a text, each over a key-value cache
//! kept by `--policy` within `--budget`.

use anyhow::Result;

use crate::cli::{BenchArgs, EvalArgs, GenerateArgs, KvCacheArgs};
use crate::commands::learned::Learned;
use crate::commands::train::{prompt_progress, prompt_tokens, Printer, Prompt};
use lethe::config::train::Precision;
use lethe::data::tokenizer::Tokenizer;
use lethe::generate::Sampling;
use lethe::model::kv::{Budget, Policy};
use lethe::model::llama::{KvCache, Llama};

/// The policy `--policy` and `--budget` give for a stream of `context` tokens (a count
/// past `i64::MAX`, as `--tokens 18446744073709551615` asks, is as good as endless).
fn policy_of(kv: &KvCacheArgs, context: usize) -> Result<Policy> {
    let budget = kv.budget.as_deref().map(Budget::parse).transpose()?;
    Ok(Policy::parse(&kv.policy, budget, i64::try_from(context).unwrap_or(i64::MAX))?)
}

pub(crate) fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// `lethe generate --init-from FOLDER`: a pretrained Llama-family decoder as it is, on
/// `device`, with its tokenizer.json when the prompt is text.
pub(crate) fn generate(
    a: &GenerateArgs,
    folder: &std::path::Path,
    prompt: Prompt,
    sampling: &Sampling,
    device: tch::Device,
) -> Result<()> {
    if a.max_span.is_some() {
        anyhow::bail!("--max-span caps Expire-Span's spans: a pretrained decoder from --init-from has none");
    }
    let precision = a.precision.unwrap_or_default();
    let model = Llama::load_as(folder, device, precision)?;
    let vocab = model.config.vocab_size as usize;
    let tokenizer = Tokenizer::of_decoder_folder(folder, vocab)?;
    if let (Prompt::Text(_), None) = (&prompt, &tokenizer) {
        anyhow::bail!("`{}` has no tokenizer.json: give the prompt as --prompt-ids 1,2,3", folder.display());
    }
    let ids = prompt_tokens(a, &prompt, tokenizer.as_ref(), vocab)?;
    let policy = policy_of(&a.kv, ids.len().saturating_add(a.bytes))?;
    let mut cache = KvCache::new(policy.clone());
    let mut printer = Printer::new(a, tokenizer.as_ref());
    printer.prompt(&prompt, &ids)?;
    let progress = prompt_progress("tokens");
    lethe::generate::stream_decoder(&model, &mut cache, &ids, a.bytes, sampling, progress, |t| printer.token(t))?;
    printer.finish()?;
    let most = cache.entries().into_iter().max().unwrap_or(0);
    let budget = policy.budget.map_or(String::new(), |b| format!(", budget {b}"));
    lethe::say!(
        "cache ({}{budget}, {}): {most} entries a layer and key-value head, {:.1} MiB",
        policy.name,
        precision.name(),
        mib(cache.bytes())
    );
    Ok(())
}

/// The files that make `folder`'s model, in a fixed order: `config.json` and its weights
/// (`model.safetensors`, or the index and its shards).
pub(crate) fn folder_files(folder: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut weights: Vec<std::path::PathBuf> = std::fs::read_dir(folder)
        .map_err(|e| anyhow::anyhow!("`{}`: {e}", folder.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            (p.is_file() && p.to_string_lossy().ends_with(".safetensors"))
                || p.ends_with("model.safetensors.index.json")
        })
        .collect();
    weights.sort();
    Ok(std::iter::once(folder.join("config.json")).chain(weights).collect())
}

/// `lethe eval --init-from FOLDER --data FILE`: the decoder's perplexity on the text, one
/// stream through the folder's tokenizer, read `--block` tokens at a time over a cache
/// kept by `--policy`.
pub(crate) fn eval(a: &EvalArgs, folder: &std::path::Path, device: tch::Device) -> Result<()> {
    refuse_run_flags(a)?;
    let data =
        a.data.as_deref().ok_or_else(|| anyhow::anyhow!("--init-from FOLDER scores a text: give --data FILE"))?;
    let precision = a.precision.unwrap_or_default();
    let model = Llama::load_as(folder, device, precision)?;
    let Some(tokenizer) = Tokenizer::of_decoder_folder(folder, model.config.vocab_size as usize)? else {
        anyhow::bail!("`{}` has no tokenizer.json: lethe eval reads the text through it", folder.display());
    };
    let text = lethe::input::read_to_string(data).map_err(|e| anyhow::anyhow!("--data `{}`: {e}", data.display()))?;
    let read = tokens_to_read(a.max_tokens)?;
    let mut ids = lethe::data::text::encode_prefix(&tokenizer, &text, read)
        .map_err(|e| anyhow::anyhow!("--data `{}`: {e}", data.display()))?;
    ids.truncate(read);
    if ids.len() < 2 {
        anyhow::bail!("--data `{}`: {} token(s); a decoder is scored on at least 2", data.display(), ids.len());
    }
    let context = match a.context {
        Some(n) if n < 2 => anyhow::bail!("--context must be at least 2 tokens"),
        Some(n) => n.min(ids.len()),
        None => ids.len(),
    };
    if let (Some(policies), Some(budgets), Some(out)) = (&a.policies, &a.budgets, &a.out) {
        if a.kv.given() {
            anyhow::bail!("--policies and --budgets sweep what --policy and --budget give once: give one or the other");
        }
        each_once("--policies", policies, String::clone)?;
        each_once("--budgets", budgets, String::clone)?;
        each_file_once("--learned", a.learned.as_deref().unwrap_or_default())?;
        let learned = a
            .learned
            .iter()
            .flatten()
            .map(|run| Learned::load(run, (&text, &ids), folder, (device, precision)))
            .collect::<Result<_>>()?;
        let sweep = Sweep { data, ids: &ids, context, block: a.block, policies, budgets, learned, precision };
        return sweep.run(&model, out);
    }
    let policy = policy_of(&a.kv, context)?;
    let block = block_for(a.block, &policy)?;
    let started = std::time::Instant::now();
    let r = lethe::eval::evaluate_decoder_windows(&model, &policy, &ids, block, context, eval_progress(started))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let budget = policy.budget.map_or(String::new(), |b| format!(", budget {b}"));
    println!(
        "{}: loss {:.4} nats, perplexity {}, accuracy {:.2}% over {} tokens (policy {}{budget}, {}, block {block}{windows})",
        data.display(),
        r.loss,
        lethe::metrics::format_perplexity(r.ppl, 3),
        100.0 * r.accuracy,
        r.tokens,
        policy.name,
        precision.name(),
        windows = if context < ids.len() { format!(", windows of {context}") } else { String::new() }
    );
    let held = r.held.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    println!("cache held per layer [{held}] entries a key-value head at most, {:.1} MiB", mib(r.cache_bytes));
    println!("evaluated in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// `lethe eval --checkpoint RUN --data FILE --context N`: the run's model scores the text
/// as `--init-from` scores a decoder's, in windows of N tokens each read from an empty
/// memory, `--block` tokens at a time (default: the training block).
pub(crate) fn eval_run_windows(
    a: &EvalArgs,
    ckpt: &lethe::checkpoint::Checkpoint,
    context: usize,
    device: tch::Device,
) -> Result<()> {
    let given = [
        ("--split", a.split.is_some()),
        ("--batch", a.batch.is_some()),
        ("--per-token", a.per_token.is_some()),
        ("--episodes", a.episodes.is_some()),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
        anyhow::bail!("{flag} does not apply with --context, which scores one stream of --data in windows");
    }
    if ckpt.config.data.source.is_rl() {
        anyhow::bail!("--context scores a text; this checkpoint is a gridworld agent");
    }
    if context < 2 {
        anyhow::bail!("--context must be at least 2 tokens");
    }
    let data = a.data.as_deref().ok_or_else(|| anyhow::anyhow!("--context scores a text: give --data FILE"))?;
    let text = lethe::input::read_to_string(data).map_err(|e| anyhow::anyhow!("--data `{}`: {e}", data.display()))?;
    let read = tokens_to_read(a.max_tokens)?;
    let mut ids = run_ids(ckpt, &text, read)?;
    ids.truncate(read);
    if ids.len() < 2 {
        anyhow::bail!("--data `{}`: {} token(s); a model is scored on at least 2", data.display(), ids.len());
    }
    let block = match a.block.unwrap_or(ckpt.config.train.block) {
        0 => anyhow::bail!("--block must be at least 1"),
        n => n,
    };
    ckpt.config.memory.validate(block, ckpt.config.model.arch)?;
    let lm = lethe::model::Lm::from_checkpoint(ckpt, device)?;
    let started = std::time::Instant::now();
    let r = lethe::eval::evaluate_run_windows(&lm, &ids, block, context.min(ids.len()), eval_progress(started))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "{}: loss {:.4} nats, perplexity {}, accuracy {:.2}% over {} tokens ({} memory, block {block}, windows of {context})",
        data.display(),
        r.loss,
        lethe::metrics::format_perplexity(r.ppl, 3),
        100.0 * r.accuracy,
        r.tokens,
        ckpt.config.memory.mechanism.name(),
    );
    let held = r.held.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    println!(
        "memory held per layer [{held}] states at most, {:.1} on average, {:.1} MiB",
        r.mean_held,
        mib(r.cache_bytes)
    );
    println!("evaluated in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The first ids of `text` (at least `wanted`, all of a shorter text) through the
/// tokenizer `ckpt`'s model reads (bytes when none); a long text is tokenised in pieces
/// ([`lethe::data::text::encode_prefix`]), only as far as needed.
pub(crate) fn run_ids(
    ckpt: &lethe::checkpoint::Checkpoint,
    text: &str,
    wanted: usize,
) -> Result<Vec<lethe::data::Token>> {
    Ok(match lethe::data::text::tokenizer_of_checkpoint(ckpt)? {
        Some(t) => lethe::data::text::encode_prefix(&t, text, wanted)?,
        None => text.bytes().take(wanted).map(lethe::data::Token::from).collect(),
    })
}

/// The tokens `--max-tokens` asks to read: its scored tokens and one more (all when
/// not given).
fn tokens_to_read(max: Option<usize>) -> Result<usize> {
    match max {
        Some(0) => anyhow::bail!("--max-tokens must be at least 1"),
        Some(n) => Ok(n.saturating_add(1)),
        None => Ok(usize::MAX),
    }
}

/// Tokens read at a time: `--block`, else one under a budget (each token predicted from
/// the budget's entries alone) and blocks of 512 with the full cache.
pub(crate) fn block_for(block: Option<usize>, policy: &Policy) -> Result<usize> {
    match block.unwrap_or(if policy.budget.is_some() { 1 } else { lethe::generate::PROMPT_BLOCK }) {
        0 => anyhow::bail!("--block must be at least 1"),
        n => Ok(n),
    }
}

/// Refuses the flags of `lethe eval` that belong to a lethe run.
fn refuse_run_flags(a: &EvalArgs) -> Result<()> {
    let given = [
        ("--split", a.split.is_some()),
        ("--batch", a.batch.is_some()),
        ("--per-token", a.per_token.is_some()),
        ("--max-span", a.max_span.is_some()),
        ("--episodes", a.episodes.is_some()),
        ("--set", !a.overrides.is_empty()),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
        anyhow::bail!("{flag} applies to a lethe run (--checkpoint); --init-from FOLDER scores one stream of --data");
    }
    Ok(())
}

/// Reports the tokens scored so far every 5 s, with the time left.
fn eval_progress(started: std::time::Instant) -> impl FnMut(usize, usize) {
    let mut last_report = started;
    move |done: usize, total: usize| {
        if last_report.elapsed().as_secs_f64() >= 5.0 && done < total {
            last_report = std::time::Instant::now();
            let eta = started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64;
            lethe::say!(
                "eval: {done}/{total} tokens ({:.0}%), ETA {}",
                100.0 * done as f64 / total as f64,
                lethe::metrics::format_duration(std::time::Duration::from_secs_f64(eta))
            );
        }
    }
}

/// `lethe bench --init-from FOLDER`: prefill and decode speed and memory of a
/// Llama-family decoder under each `--kv` policy at each `--contexts` length, in turns.
pub(crate) fn bench(a: &BenchArgs, folder: &std::path::Path) -> Result<()> {
    refuse_training_bench_flags(a)?;
    let device = a.config.device.as_deref().unwrap_or("cpu");
    if device != "cpu" {
        anyhow::bail!("--init-from FOLDER benches on the CPU: give --device cpu");
    }
    if a.rounds == 0 || a.decode_tokens == 0 {
        anyhow::bail!("--rounds and --decode-tokens must be at least 1");
    }
    let precisions = if a.precisions.is_empty() { vec![Precision::F32] } else { a.precisions.clone() };
    each_once("--precision", &precisions, |p| p.name().to_string())?;
    let contexts = a.contexts.as_ref().map_or(vec![1024], |l| l.0.clone());
    each_once("--contexts", &contexts, usize::to_string)?;
    each_once("--kv", &a.kv, String::clone)?;
    // A run at a budget given twice, however the run's path is spelled, is timed once.
    let run_at = |item: &String| {
        let (path, budget) = item.rsplit_once('@').map_or((item.as_str(), ""), |(p, b)| (p, b));
        (run_file(std::path::Path::new(path)), budget.to_string())
    };
    each_once_by("--learned", &a.learned, run_at, String::clone)?;
    let config = lethe::model::llama::LlamaConfig::from_file(&folder.join("config.json"))?;
    let widest = precisions.iter().map(|p| p.kind().elt_size_in_bytes()).max().unwrap_or(4);
    refuse_caches_too_large(&config, &contexts, a.decode_tokens, widest)?;
    let models =
        precisions.iter().map(|&p| Llama::load_as(folder, tch::Device::Cpu, p)).collect::<lethe::Result<Vec<_>>>()?;
    let kv = if a.kv.is_empty() { vec!["full".to_string()] } else { a.kv.clone() };
    let mut cases = Vec::new();
    for item in &kv {
        let (spec, budget) = match item.rsplit_once('@') {
            Some((spec, budget)) => {
                (spec, Some(Budget::parse(budget).map_err(|e| anyhow::anyhow!("--kv {item}: {e}"))?))
            }
            None => (item.as_str(), None),
        };
        for model in 0..models.len() {
            for &context in &contexts {
                cases.push(lethe::bench::decode::DecodeCase { spec: spec.to_string(), budget, context, model });
            }
        }
    }
    let mut runs = Vec::new();
    for item in &a.learned {
        let (path, budget) = match item.rsplit_once('@') {
            Some((path, budget)) => {
                (path, Some(Budget::parse(budget).map_err(|e| anyhow::anyhow!("--learned {item}: {e}"))?))
            }
            None => (item.as_str(), None),
        };
        let run = Learned::open(std::path::Path::new(path))?;
        run.refuse_another_model(folder).map_err(|e| anyhow::anyhow!("--learned `{path}`: {e}"))?;
        if budget.is_some() && !run.capped() {
            anyhow::bail!(
                "--learned {item}: a budget caps Expire-Span; an ∞-former keeps the memory it was trained with"
            );
        }
        for &context in &contexts {
            let entries = budget.map(|b| b.entries((context + a.decode_tokens) as i64)).transpose()?.unwrap_or(0);
            let lm = run.at_budget(entries, run.block(None))?;
            let name = budget.map_or(run.name.clone(), |_| format!("{}@{entries}", run.name));
            runs.push((name, lm, context));
        }
    }
    let learned = runs
        .iter()
        .map(|(name, lm, context)| lethe::bench::decode::LearnedCase::new(name.clone(), lm, *context, precisions[0]))
        .collect::<lethe::Result<Vec<_>>>()?;
    let weights: Vec<String> = models
        .iter()
        .zip(&precisions)
        .map(|(m, p)| format!("{:.1} MiB in {}", mib(m.weight_bytes()), p.name()))
        .collect();
    println!(
        "{}: weights read per token {} | {} threads",
        folder.display(),
        weights.join(", "),
        tch::get_num_threads()
    );
    let results = lethe::bench::decode::run(&models, &cases, &learned, a.decode_tokens, a.rounds, |r| {
        let budget = r.budget.map_or(String::new(), |b| format!("@{b}"));
        let rss = r.peak_rss_bytes.map_or("n/a".into(), |b| format!("{:.0} MiB", mib(b as usize)));
        println!(
            "{:<16} {:<4} context {:>6} | prefill {:>7.1} tok/s | decode {:>6.2} tok/s, {:.1} ms (p10 {:.1}, p90 {:.1}) | reads {:.1} MiB a token, {:.0}% of the read rate ({:.1} GB/s) | cache {:.1} MiB | peak RSS {rss}",
            format!("{}{budget}", r.policy),
            r.precision,
            r.context,
            r.prefill_tok_s,
            r.decode_tok_s,
            r.decode_ms[0],
            r.decode_ms[1],
            r.decode_ms[2],
            mib(r.read_bytes_per_token),
            100.0 * r.bandwidth_share,
            r.read_rate_bytes_s / 1e9,
            mib(r.cache_bytes)
        );
    })?;
    let out = a.out.join(a.config.name.as_deref().unwrap_or("decode-bench"));
    std::fs::create_dir_all(&out).map_err(|e| lethe::LetheError::io(&out, e))?;
    let json = serde_json::json!({ "folder": folder, "threads": tch::get_num_threads(), "results": results });
    lethe::checkpoint::write_atomic(&out.join("bench.json"), serde_json::to_string_pretty(&json)?.as_bytes())?;
    println!("wrote {}", out.join("bench.json").display());
    Ok(())
}

/// Refuses an item given twice in a list flag: it would be scored twice, its row or
/// folder written over.
pub(crate) fn each_once<T: PartialEq>(flag: &str, items: &[T], show: impl Fn(&T) -> String) -> Result<()> {
    each_once_by(flag, items, |item| item, show)
}

/// [`each_once`] with items compared by `key` (a file however its path is spelled),
/// the repeat shown as it was given.
pub(crate) fn each_once_by<'a, T, K: PartialEq>(
    flag: &str,
    items: &'a [T],
    key: impl Fn(&'a T) -> K,
    show: impl Fn(&T) -> String,
) -> Result<()> {
    let keys: Vec<K> = items.iter().map(key).collect();
    match (0..keys.len()).find(|&i| keys[..i].contains(&keys[i])) {
        Some(i) => anyhow::bail!("{flag}: `{}` is given twice", show(&items[i])),
        None => Ok(()),
    }
}

/// Refuses a run given twice in a list of run folders or checkpoints, however its path
/// is spelled (`runs/m`, `./runs/m/checkpoint.safetensors`).
pub(crate) fn each_file_once<P: AsRef<std::path::Path>>(flag: &str, runs: &[P]) -> Result<()> {
    each_once_by(flag, runs, |run| run_file(run.as_ref()), |run| run.as_ref().display().to_string())
}

/// The checkpoint file of the run folder or checkpoint `run`, as [`the_file`].
pub(crate) fn run_file(run: &std::path::Path) -> std::path::PathBuf {
    the_file(&lethe::checkpoint::resolve(run))
}

/// `path` with its links and `.`/`..` resolved, or as given where it is not there (to
/// be refused by name later).
pub(crate) fn the_file(path: &std::path::Path) -> std::path::PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// Makes the folder `out` of `flag`, refusing a file there by name; the folders made are
/// returned, for a command that fails before writing into them to remove.
pub(crate) fn make_folder(flag: &str, out: &std::path::Path) -> Result<lethe::output::MadeFolder> {
    check_folder(flag, out)?;
    lethe::output::MadeFolder::make(out).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// Refuses a file where the folder `out` of `flag` is to be made.
pub(crate) fn check_folder(flag: &str, out: &std::path::Path) -> Result<()> {
    if out.exists() && !out.is_dir() {
        anyhow::bail!("{flag} `{}`: is a file, not a folder", out.display());
    }
    Ok(())
}

/// Refuses a context whose full cache (its keys and values of `width` bytes, the widest
/// precision timed, every layer and key-value head, with the decoded tokens) would hold
/// more than half the machine's memory.
fn refuse_caches_too_large(
    config: &lethe::model::llama::LlamaConfig,
    contexts: &[usize],
    decoded: usize,
    width: usize,
) -> Result<()> {
    let per_token = 2.0 * width as f64 * (config.layers * config.kv_heads * config.head_dim) as f64;
    let most = lethe::input::max_bytes() as f64;
    for &context in contexts {
        let bytes = per_token * (context as f64 + decoded as f64);
        if bytes > most {
            anyhow::bail!(
                "--contexts {context} with --decode-tokens {decoded}: the full cache would hold {:.1} GiB, more than half this machine's memory ({:.1} GiB)",
                bytes / GIB,
                most / GIB
            );
        }
    }
    Ok(())
}

const GIB: f64 = (1u64 << 30) as f64;

/// Refuses the flags of the training bench.
fn refuse_training_bench_flags(a: &BenchArgs) -> Result<()> {
    let given = [
        ("--mechanism", !a.mechanisms.is_empty()),
        ("--scale", a.scale.is_some()),
        ("--context", a.context.is_some()),
        ("--profile", a.profile),
        ("--trace", a.trace),
        ("--train-data", a.train_data),
        ("--frozen", a.frozen),
        ("--preset", a.config.preset.is_some()),
        ("--config", a.config.config.is_some()),
        ("--set", !a.config.overrides.is_empty()),
        ("--data", a.config.data.is_some()),
        ("--steps", a.config.steps.is_some()),
        ("--length", a.config.length.is_some()),
        ("--distance", a.config.distance.is_some()),
        ("--data-seed", a.config.data_seed.is_some()),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
        anyhow::bail!("{flag} applies to the training bench; --init-from a Llama-family folder times decoding (--kv, --contexts, --decode-tokens)");
    }
    Ok(())
}

/// `lethe export --checkpoint RUN --out DIR`: a Llama-family run as a Hugging Face folder,
/// with the run's tokenizer.json when it was trained through one.
pub(crate) fn export(a: crate::cli::ExportArgs) -> Result<()> {
    if a.out.exists() {
        anyhow::bail!("--out `{}`: exists already: give a new folder", a.out.display());
    }
    let ckpt = lethe::checkpoint::Checkpoint::load(&a.checkpoint)?;
    let tokenizer = ckpt.run_tokenizer().or_else(|| ckpt.config.data.tokenizer.clone());
    let tokenizer = tokenizer.filter(|dir| dir.join("tokenizer.json").is_file());
    let train = &ckpt.config.train;
    let params = match train.lora_rank {
        0 => ckpt.parameters(),
        rank => lethe::model::lora::merged(&ckpt.parameters(), rank, train.lora_alpha),
    };
    lethe::model::llama::layout::write_folder(&ckpt.config.model, &params, tokenizer.as_deref(), &a.out)
        .map_err(|e| anyhow::anyhow!("--out `{}`: {e}", a.out.display()))?;
    let with = if tokenizer.is_some() { " and tokenizer.json" } else { " (the run has no tokenizer.json)" };
    println!("wrote {} (config.json, model.safetensors{with})", a.out.display());
    if train.lora_rank > 0 {
        println!("the low-rank adapters are folded into the attention maps");
    }
    let mechanism = ckpt.config.memory.mechanism;
    if mechanism != lethe::config::Mechanism::Fixed {
        println!(
            "the {} memory's own parameters are not part of a Hugging Face folder: the run keeps them (lethe eval and generate --checkpoint)",
            mechanism.name()
        );
    }
    Ok(())
}

/// `lethe eval --init-from FOLDER --policies ... --budgets ...`: the text's perplexity
/// under every policy at every budget (the full cache once), in turns.
struct Sweep<'a> {
    data: &'a std::path::Path,
    ids: &'a [lethe::data::Token],
    context: usize,
    block: Option<usize>,
    policies: &'a [String],
    budgets: &'a [String],
    learned: Vec<Learned>,
    /// The decoder's precision (`--precision`).
    precision: lethe::config::train::Precision,
}

/// The budget column of a learned run scored without a cap, its own spans deciding.
const UNCAPPED: &str = "uncapped";

/// What one evaluation of a [`Sweep`] scores: the folder's decoder under a policy, or a
/// learned run under its budget of memories.
enum Scored {
    Policy(Policy),
    Learned { run: usize, budget: i64 },
}

/// One planned evaluation: the budget as asked, what is scored, tokens read at a time.
struct Plan {
    budget: String,
    scored: Scored,
    block: usize,
}

/// One evaluation of a [`Sweep`].
#[derive(serde::Serialize)]
struct SweepRow {
    policy: String,
    /// The budget as asked (`full` for the full cache).
    budget: String,
    /// The entries each layer held per key-value head (a learned run: states) at most.
    entries: i64,
    /// The entries a layer held, averaged over layers and tokens.
    mean_entries: f64,
    loss: f64,
    ppl: f64,
    accuracy: f64,
    tokens: usize,
    cache_bytes: usize,
    seconds: f64,
}

impl Sweep<'_> {
    /// Every policy is parsed and every budget and block checked before the first
    /// evaluation: `(the budget as asked, the policy, its block)`.
    fn plans(&self) -> Result<Vec<Plan>> {
        let full = Policy::parse("full", None, self.context as i64)?;
        let mut plans = vec![("full".to_string(), Scored::Policy(full))];
        for budget in self.budgets {
            let parsed = Budget::parse(budget).map_err(|e| anyhow::anyhow!("--budgets `{budget}`: {e}"))?;
            for name in self.policies.iter().filter(|p| p.as_str() != "full") {
                let policy = Policy::parse(name, Some(parsed), self.context as i64)
                    .map_err(|e| anyhow::anyhow!("--policies `{name}` at budget {budget}: {e}"))?;
                plans.push((budget.clone(), Scored::Policy(policy)));
            }
            let entries =
                parsed.entries(self.context as i64).map_err(|e| anyhow::anyhow!("--budgets `{budget}`: {e}"))?;
            let capped = (0..self.learned.len()).filter(|&run| self.learned[run].capped());
            plans.extend(capped.map(|run| (budget.clone(), Scored::Learned { run, budget: entries })));
        }
        // Each learned run once more as trained: the memory its own spans keep.
        plans.extend((0..self.learned.len()).map(|run| (UNCAPPED.to_string(), Scored::Learned { run, budget: 0 })));
        plans
            .into_iter()
            .map(|(budget, scored)| {
                let block = match &scored {
                    Scored::Policy(policy) => block_for(self.block, policy)?,
                    Scored::Learned { run, .. } => self.learned[*run].block(self.block),
                };
                Ok(Plan { budget, scored, block })
            })
            .collect()
    }

    fn run(&self, model: &Llama, out: &std::path::Path) -> Result<()> {
        let plans = self.plans()?;
        make_folder("--out", out)?.unless_failed(self.run_plans(model, &plans, out))
    }

    /// Scores the text under each of `plans` and writes the table and charts into `out`.
    fn run_plans(&self, model: &Llama, plans: &[Plan], out: &std::path::Path) -> Result<()> {
        let mut rows = Vec::new();
        for (i, plan) in plans.iter().enumerate() {
            let started = std::time::Instant::now();
            let (name, r) = match &plan.scored {
                Scored::Policy(policy) => {
                    let progress = eval_progress(started);
                    let r = lethe::eval::evaluate_decoder_windows(
                        model,
                        policy,
                        self.ids,
                        plan.block,
                        self.context,
                        progress,
                    )?;
                    (policy.name.to_string(), r)
                }
                Scored::Learned { run, budget } => {
                    let learned = &self.learned[*run];
                    let progress = eval_progress(started);
                    let (ids, block, context) = (self.ids, plan.block, self.context);
                    let r = match learned.decoder() {
                        Some(model) => {
                            let fresh = || learned.cache_at(*budget);
                            lethe::eval::evaluate_decoder_windows_over(model, fresh, ids, block, context, progress)?
                        }
                        None => {
                            let lm = learned.at_budget(*budget, block)?;
                            lethe::eval::evaluate_run_windows(&lm, ids, block, context, progress)?
                        }
                    };
                    (learned.name.clone(), r)
                }
            };
            let seconds = started.elapsed().as_secs_f64();
            let entries = r.held.iter().copied().max().unwrap_or(0);
            let (n, ppl, budget) = (plans.len(), lethe::metrics::format_perplexity(r.ppl, 3), &plan.budget);
            lethe::say!("[{}/{n}] {name} at {budget}: perplexity {ppl}, {entries} entries, {seconds:.1} s", i + 1);
            rows.push(SweepRow {
                policy: name,
                budget: plan.budget.clone(),
                entries,
                mean_entries: r.mean_held,
                loss: r.loss,
                ppl: r.ppl,
                accuracy: r.accuracy,
                tokens: r.tokens,
                cache_bytes: r.cache_bytes,
                seconds,
            });
            self.write_csv(&rows, out)?;
        }
        self.write(&rows, out)
    }

    /// `budget.csv` of the evaluations so far, written whole after each one, so that a
    /// sweep stopped midway keeps what it measured.
    fn write_csv(&self, rows: &[SweepRow], out: &std::path::Path) -> Result<()> {
        let mut csv = csv::Writer::from_writer(Vec::new());
        rows.iter().try_for_each(|r| csv.serialize(r))?;
        let bytes = csv.into_inner().map_err(|e| anyhow::anyhow!("budget.csv: {e}"))?;
        lethe::output::write("--out", &out.join("budget.csv"), &bytes, &[self.data])?;
        Ok(())
    }

    /// budget.md (a row per policy, a column per budget, each cell the perplexity and the
    /// mean entries held) and the chart of perplexity against the mean entries held.
    fn write(&self, rows: &[SweepRow], out: &std::path::Path) -> Result<()> {
        let full = rows.iter().find(|r| r.budget == "full");
        let (full_ppl, full_entries) = full.map_or((f64::NAN, f64::NAN), |r| (r.ppl, r.mean_entries));
        let mut md = format!(
            "Perplexity of `{}` in windows of {} tokens ({} scored, the decoder in {}), full cache {full_ppl:.3}; in brackets the mean entries a layer held:\n\n| policy |",
            self.data.display(),
            self.context,
            rows.first().map_or(0, |r| r.tokens),
            self.precision.name()
        );
        let mut budgets: Vec<&str> = self.budgets.iter().map(String::as_str).collect();
        if !self.learned.is_empty() {
            budgets.push(UNCAPPED);
        }
        for b in &budgets {
            match rows.iter().filter(|r| r.budget == *b).map(|r| r.entries).max() {
                Some(entries) if *b != UNCAPPED => md += &format!(" {b} ({entries}) |"),
                _ => md += &format!(" {b} |"),
            }
        }
        md += &format!("\n|---|{}\n", "---:|".repeat(budgets.len()));
        let mut names: Vec<&str> = Vec::new();
        for r in rows.iter().filter(|r| r.budget != "full") {
            if !names.contains(&r.policy.as_str()) {
                names.push(&r.policy);
            }
        }
        for name in &names {
            md += &format!("| {name} |");
            for b in &budgets {
                match rows.iter().find(|r| r.policy == *name && r.budget == *b) {
                    Some(r) => {
                        md += &format!(" {} ({:.0}) |", lethe::metrics::format_perplexity(r.ppl, 3), r.mean_entries)
                    }
                    None => md += " |",
                }
            }
            md += "\n";
        }
        lethe::output::write("--out", &out.join("budget.md"), md.as_bytes(), &[self.data])?;
        let mut series: Vec<lethe::plot::SweepSeries> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let points: Vec<(f64, f64)> =
                    rows.iter().filter(|r| r.policy == *name).map(|r| (r.mean_entries, r.ppl)).collect();
                let mut means = points.clone();
                means.sort_by(|a, b| a.0.total_cmp(&b.0));
                lethe::plot::SweepSeries { name: name.to_string(), colour: lethe::plot::colour(i + 1), points, means }
            })
            .collect();
        let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let line: Vec<(f64, f64)> = [xs.iter().copied().fold(f64::INFINITY, f64::min), full_entries]
            .into_iter()
            .filter(|x| x.is_finite())
            .map(|x| (x, full_ppl))
            .collect();
        series.insert(
            0,
            lethe::plot::SweepSeries {
                name: "full".into(),
                colour: lethe::plot::colour(0),
                points: vec![(full_entries, full_ppl)],
                means: line,
            },
        );
        let labels = ("mean entries held per layer (a key-value head's, or a memory's states)", "perplexity");
        let svg = lethe::plot::sweep_chart(&series, labels, None, &out.join("budget.png"))?;
        lethe::output::write("--out", &out.join("budget.svg"), svg.as_bytes(), &[self.data])?;
        print!("{md}");
        println!("wrote {}/budget.csv, budget.md, budget.svg and budget.png", out.display());
        Ok(())
    }
}
