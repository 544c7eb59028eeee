//! The commands on a pretrained Llama-family decoder read from its Hugging Face folder
//! (`--init-from FOLDER`): generating, and scoring a text, each over a key-value cache
//! kept by `--policy` within `--budget`.

use anyhow::Result;

use crate::cli::{BenchArgs, EvalArgs, GenerateArgs, KvCacheArgs};
use crate::commands::train::{prompt_progress, prompt_tokens, Printer, Prompt};
use lethe::generate::Sampling;
use lethe::model::kv::{Budget, Policy};
use lethe::model::llama::{KvCache, Llama};

/// The policy `--policy` and `--budget` give for a stream of `context` tokens.
fn policy_of(kv: &KvCacheArgs, context: usize) -> Result<Policy> {
    let budget = kv.budget.as_deref().map(Budget::parse).transpose()?;
    Ok(Policy::parse(&kv.policy, budget, context as i64)?)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// `lethe generate --init-from FOLDER`: a pretrained Llama-family decoder as it is, on
/// the CPU, with its tokenizer.json when the prompt is text.
pub(crate) fn generate(
    a: &GenerateArgs,
    folder: &std::path::Path,
    prompt: Prompt,
    sampling: &Sampling,
    device: tch::Device,
) -> Result<()> {
    if device != tch::Device::Cpu {
        anyhow::bail!("--init-from FOLDER generates on the CPU: give --device cpu");
    }
    if a.max_span.is_some() {
        anyhow::bail!("--max-span caps Expire-Span's spans: a pretrained decoder from --init-from has none");
    }
    let model = Llama::load(folder)?;
    let vocab = model.config.vocab_size as usize;
    let tokenizer = pretrained_tokenizer(folder, vocab)?;
    if let (Prompt::Text(_), None) = (&prompt, &tokenizer) {
        anyhow::bail!("`{}` has no tokenizer.json: give the prompt as --prompt-ids 1,2,3", folder.display());
    }
    let ids = prompt_tokens(a, &prompt, tokenizer.as_ref(), vocab)?;
    let policy = policy_of(&a.kv, ids.len() + a.bytes)?;
    let mut cache = KvCache::new(policy.clone());
    let mut printer = Printer::new(a, tokenizer.as_ref());
    printer.prompt(&prompt, &ids)?;
    let progress = prompt_progress("tokens");
    lethe::generate::stream_decoder(&model, &mut cache, &ids, a.bytes, sampling, progress, |t| printer.token(t))?;
    printer.finish()?;
    let most = cache.entries().into_iter().max().unwrap_or(0);
    let budget = policy.budget.map_or(String::new(), |b| format!(", budget {b}"));
    eprintln!(
        "cache ({}{budget}): {most} entries a layer and key-value head, {:.1} MiB",
        policy.name,
        mib(cache.bytes())
    );
    Ok(())
}

/// The folder's tokenizer.json, if it has one; refused when it gives ids the model has no
/// row for.
fn pretrained_tokenizer(folder: &std::path::Path, vocab: usize) -> Result<Option<lethe::data::tokenizer::Tokenizer>> {
    if !folder.join("tokenizer.json").is_file() {
        return Ok(None);
    }
    let tokenizer = lethe::data::tokenizer::Tokenizer::from_dir(folder)?;
    if tokenizer.vocab_size() > vocab {
        anyhow::bail!(
            "`{}`: tokenizer.json has {} tokens, more than config.json's vocab_size = {vocab}",
            folder.join("tokenizer.json").display(),
            tokenizer.vocab_size()
        );
    }
    Ok(Some(tokenizer))
}

/// `lethe eval --init-from FOLDER --data FILE`: the decoder's perplexity on the text, one
/// stream through the folder's tokenizer, read `--block` tokens at a time over a cache
/// kept by `--policy`.
pub(crate) fn eval(a: &EvalArgs, folder: &std::path::Path, device: tch::Device) -> Result<()> {
    refuse_run_flags(a)?;
    if device != tch::Device::Cpu {
        anyhow::bail!("--init-from FOLDER evaluates on the CPU: give --device cpu");
    }
    let data =
        a.data.as_deref().ok_or_else(|| anyhow::anyhow!("--init-from FOLDER scores a text: give --data FILE"))?;
    let model = Llama::load(folder)?;
    let Some(tokenizer) = pretrained_tokenizer(folder, model.config.vocab_size as usize)? else {
        anyhow::bail!("`{}` has no tokenizer.json: lethe eval reads the text through it", folder.display());
    };
    let text = lethe::input::read_to_string(data).map_err(|e| anyhow::anyhow!("--data `{}`: {e}", data.display()))?;
    let mut ids = tokenizer.encode(&text)?;
    if let Some(max) = a.max_tokens {
        if max == 0 {
            anyhow::bail!("--max-tokens must be at least 1");
        }
        ids.truncate(max + 1);
    }
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
        let sweep = Sweep { data, ids: &ids, context, block: a.block, policies, budgets };
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
        "{}: loss {:.4} nats, perplexity {:.3}, accuracy {:.2}% over {} tokens (policy {}{budget}, block {block}{windows})",
        data.display(),
        r.loss,
        r.ppl,
        100.0 * r.accuracy,
        r.tokens,
        policy.name,
        windows = if context < ids.len() { format!(", windows of {context}") } else { String::new() }
    );
    let held = r.held.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    println!("cache held per layer [{held}] entries a key-value head at most, {:.1} MiB", mib(r.cache_bytes));
    println!("evaluated in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Tokens read at a time: `--block`, else one under a budget (each token predicted from
/// the budget's entries alone) and blocks of 512 with the full cache.
fn block_for(block: Option<usize>, policy: &Policy) -> Result<usize> {
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
            eprintln!(
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
    let model = Llama::load(folder)?;
    let contexts = a.contexts.as_ref().map_or(vec![1024], |l| l.0.clone());
    let kv = if a.kv.is_empty() { vec!["full".to_string()] } else { a.kv.clone() };
    let mut cases = Vec::new();
    for item in &kv {
        let (spec, budget) = match item.rsplit_once('@') {
            Some((spec, budget)) => {
                (spec, Some(Budget::parse(budget).map_err(|e| anyhow::anyhow!("--kv {item}: {e}"))?))
            }
            None => (item.as_str(), None),
        };
        for &context in &contexts {
            cases.push(lethe::bench::decode::DecodeCase { spec: spec.to_string(), budget, context });
        }
    }
    println!(
        "{}: {:.1} MiB of weights read per token | {} threads",
        folder.display(),
        mib(model.weight_bytes()),
        tch::get_num_threads()
    );
    let results = lethe::bench::decode::run(&model, &cases, a.decode_tokens, a.rounds, |r| {
        let budget = r.budget.map_or(String::new(), |b| format!("@{b}"));
        let rss = r.peak_rss_bytes.map_or("n/a".into(), |b| format!("{:.0} MiB", mib(b as usize)));
        println!(
            "{:<16} context {:>6} | prefill {:>7.1} tok/s | decode {:>6.2} tok/s, {:.1} ms (p10 {:.1}, p90 {:.1}) | reads {:.1} MiB a token, {:.0}% of the read rate ({:.1} GB/s) | cache {:.1} MiB | peak RSS {rss}",
            format!("{}{budget}", r.policy),
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
    ];
    if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
        anyhow::bail!("{flag} applies to the training bench; --init-from a Llama-family folder times decoding (--kv, --contexts, --decode-tokens)");
    }
    Ok(())
}

/// `lethe export --checkpoint RUN --out DIR`: a Llama-family run as a Hugging Face folder,
/// with the run's tokenizer.json when it was trained through one.
pub(crate) fn export(a: crate::cli::ExportArgs) -> Result<()> {
    let ckpt = lethe::checkpoint::Checkpoint::load(&a.checkpoint)?;
    let tokenizer = ckpt.run_tokenizer().or_else(|| ckpt.config.data.tokenizer.clone());
    let tokenizer = tokenizer.filter(|dir| dir.join("tokenizer.json").is_file());
    lethe::model::llama::layout::write_folder(&ckpt.config.model, &ckpt.parameters(), tokenizer.as_deref(), &a.out)
        .map_err(|e| anyhow::anyhow!("--out `{}`: {e}", a.out.display()))?;
    let with = if tokenizer.is_some() { " and tokenizer.json" } else { " (the run has no tokenizer.json)" };
    println!("wrote {} (config.json, model.safetensors{with})", a.out.display());
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
}

/// One evaluation of a [`Sweep`].
#[derive(serde::Serialize)]
struct SweepRow {
    policy: String,
    /// The budget as asked (`full` for the full cache).
    budget: String,
    /// The entries each layer held per key-value head at most.
    entries: i64,
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
    fn plans(&self) -> Result<Vec<(String, Policy, usize)>> {
        let full = Policy::parse("full", None, self.context as i64)?;
        let mut plans = vec![("full".to_string(), full)];
        for name in self.policies.iter().filter(|p| p.as_str() != "full") {
            for budget in self.budgets {
                let parsed = Budget::parse(budget).map_err(|e| anyhow::anyhow!("--budgets `{budget}`: {e}"))?;
                let policy = Policy::parse(name, Some(parsed), self.context as i64)
                    .map_err(|e| anyhow::anyhow!("--policies `{name}` at budget {budget}: {e}"))?;
                plans.push((budget.clone(), policy));
            }
        }
        plans
            .into_iter()
            .map(|(budget, policy)| {
                let block = block_for(self.block, &policy)?;
                Ok((budget, policy, block))
            })
            .collect()
    }

    fn run(&self, model: &Llama, out: &std::path::Path) -> Result<()> {
        let plans = self.plans()?;
        std::fs::create_dir_all(out).map_err(|e| anyhow::anyhow!("--out `{}`: {e}", out.display()))?;
        let mut rows = Vec::new();
        for (i, (budget, policy, block)) in plans.iter().enumerate() {
            let block = *block;
            let started = std::time::Instant::now();
            let r = lethe::eval::evaluate_decoder_windows(
                model,
                policy,
                self.ids,
                block,
                self.context,
                eval_progress(started),
            )?;
            let seconds = started.elapsed().as_secs_f64();
            let entries = r.held.iter().copied().max().unwrap_or(0);
            let (n, name, ppl) = (plans.len(), policy.name, r.ppl);
            eprintln!("[{}/{n}] {name} at {budget}: perplexity {ppl:.3}, {entries} entries, {seconds:.1} s", i + 1);
            let (loss, ppl, accuracy, tokens, cache_bytes) = (r.loss, r.ppl, r.accuracy, r.tokens, r.cache_bytes);
            rows.push(SweepRow {
                policy: policy.name.to_string(),
                budget: budget.clone(),
                entries,
                loss,
                ppl,
                accuracy,
                tokens,
                cache_bytes,
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

    /// budget.md (a row per policy, a column per budget) and the chart.
    fn write(&self, rows: &[SweepRow], out: &std::path::Path) -> Result<()> {
        let full = rows.iter().find(|r| r.budget == "full").map_or(f64::NAN, |r| r.ppl);
        let mut md = format!(
            "Perplexity of `{}` in windows of {} tokens ({} scored), full cache {full:.3}:\n\n| policy |",
            self.data.display(),
            self.context,
            rows.first().map_or(0, |r| r.tokens)
        );
        let budgets: Vec<&String> = self.budgets.iter().collect();
        for b in &budgets {
            let entries = rows.iter().find(|r| &&r.budget == b).map_or(0, |r| r.entries);
            md += &format!(" {b} ({entries}) |");
        }
        md += &format!("\n|---|{}\n", "---:|".repeat(budgets.len()));
        let mut names: Vec<&str> = rows.iter().filter(|r| r.budget != "full").map(|r| r.policy.as_str()).collect();
        names.dedup();
        for name in &names {
            md += &format!("| {name} |");
            for b in &budgets {
                let ppl = rows.iter().find(|r| r.policy == *name && &&r.budget == b).map_or(f64::NAN, |r| r.ppl);
                md += &format!(" {ppl:.3} |");
            }
            md += "\n";
        }
        lethe::output::write("--out", &out.join("budget.md"), md.as_bytes(), &[self.data])?;
        let mut series: Vec<lethe::plot::SweepSeries> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let points: Vec<(f64, f64)> =
                    rows.iter().filter(|r| r.policy == *name).map(|r| (r.entries as f64, r.ppl)).collect();
                let mut means = points.clone();
                means.sort_by(|a, b| a.0.total_cmp(&b.0));
                lethe::plot::SweepSeries { name: name.to_string(), colour: lethe::plot::colour(i + 1), points, means }
            })
            .collect();
        let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let line: Vec<(f64, f64)> = [xs.iter().copied().fold(f64::INFINITY, f64::min), self.context as f64]
            .into_iter()
            .filter(|x| x.is_finite())
            .map(|x| (x, full))
            .collect();
        series.insert(
            0,
            lethe::plot::SweepSeries {
                name: "full".into(),
                colour: lethe::plot::colour(0),
                points: vec![(self.context as f64, full)],
                means: line,
            },
        );
        let labels = ("entries kept per layer and key-value head", "perplexity");
        let svg = lethe::plot::sweep_chart(&series, labels, None, &out.join("budget.png"))?;
        lethe::output::write("--out", &out.join("budget.svg"), svg.as_bytes(), &[self.data])?;
        print!("{md}");
        println!("wrote {}/budget.csv, budget.md, budget.svg and budget.png", out.display());
        Ok(())
    }
}
