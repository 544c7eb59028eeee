//! `lethe longeval`: the long-context suite by length and depth, for one run or several
//! side by side, or for a pretrained decoder under each key-value cache policy at each
//! budget beside the learned memories fitted onto it (`--init-from`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};

use lethe::config::train::Precision;
use lethe::data::longctx::{ByteUnits, Haystack, Units};
use lethe::data::tokenizer::Tokenizer;
use lethe::data::Token;
use lethe::longeval::{fingerprint, Cell, Decoder, Grid, Progress, Reader, Subject};
use lethe::metrics::format_duration;
use lethe::model::kv::Budget;
use lethe::model::llama::Llama;
use lethe::model::Lm;
use lethe::plot::{Heatmap, SweepSeries};

use super::decoder::{block_for, each_file_once, each_once};
use super::learned::Learned;
use super::train::load_checkpoint;
use crate::cli::LongevalArgs;

/// Evaluates the grid the flags give for `--checkpoint` (or `--init-from`'s decoder
/// under each policy and budget, and the `--learned` runs) and each `--compare` run,
/// resuming from each one's table, prints the accuracy of each task by length, and draws
/// the heatmaps and the accuracy-by-length charts.
pub(crate) fn longeval(a: LongevalArgs) -> Result<()> {
    lethe::longeval::check_samples(a.samples)?;
    let text = match a.haystack.as_deref() {
        Some(p) if p == Path::new("digits") => Some(Haystack::Digits),
        Some(p) if p == Path::new("noise") => Some(Haystack::Noise),
        Some(p) => Some(Haystack::from_file(p)?),
        None => None,
    };
    let grid = Grid {
        tasks: a.suite.0.clone(),
        lengths: a.lengths.0.clone(),
        depths: a.depths.0.clone(),
        samples: a.samples,
        seed: a.seed,
        text,
        report_every: lethe::longeval::REPORT_EVERY,
    };
    if a.init_from.is_none() {
        let given = [
            ("--policies", a.policies.is_some()),
            ("--budgets", a.budgets.is_some()),
            ("--learned", a.learned.is_some()),
            ("--block", a.block.is_some()),
            ("--precision", a.precision.is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
            bail!("{flag} applies to a pretrained decoder: give --init-from FOLDER");
        }
    }
    let checkpoints: Vec<&PathBuf> = a.checkpoint.iter().chain(&a.compare).collect();
    // A run that is not there is named before any other is evaluated.
    for path in checkpoints.iter().copied().chain(a.learned.iter().flatten()) {
        let file = lethe::checkpoint::resolve(path);
        if !file.is_file() {
            bail!("checkpoint `{}`: no such file (a run folder holds checkpoint.safetensors)", file.display());
        }
    }
    // A run given twice would be evaluated twice and drawn as two runs.
    each_file_once("--compare", &checkpoints)?;
    let names = run_names(&checkpoints);
    if checkpoints.len() + usize::from(a.init_from.is_some()) > 1 {
        refuse_mixed_units(&checkpoints, a.init_from.is_some())?;
    }
    let started = Instant::now();
    let mut runs = match &a.init_from {
        Some(folder) => decoder_runs(&a, folder, &grid)?,
        None => vec![],
    };
    let several = runs.len() + checkpoints.len() > 1;
    for (checkpoint, name) in checkpoints.iter().zip(&names) {
        // One run writes into --out; several each into their own folder inside it.
        let out = if several { a.out.join(name) } else { a.out.clone() };
        if several {
            lethe::say!("longeval: {name} ({})", checkpoint.display());
        }
        let (table, unit) = evaluate_run(checkpoint, &grid, &out, &a.device)?;
        runs.push(Run { name: name.clone(), table, unit });
    }
    if several {
        println!();
        for run in &runs {
            println!("{}:", run.name);
            print_summary(&run.table, &grid, run.unit);
        }
        let charts = compare_charts(&runs, &grid, &a.out)?;
        println!("wrote {}", charts.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "));
    }
    let peak = lethe::metrics::peak_rss_bytes()
        .map_or(String::new(), |b| format!(", peak memory {:.0} MiB", b as f64 / (1u64 << 20) as f64));
    println!("suite done in {}{peak}", format_duration(started.elapsed()));
    Ok(())
}

/// Refuses runs side by side whose lengths count different units (a byte model beside a
/// tokenised one, or beside `--init-from`'s decoder, which reads tokens): their charts
/// would put 1024 bytes and 1024 tokens at one point.
fn refuse_mixed_units(checkpoints: &[&PathBuf], decoder: bool) -> Result<()> {
    let mut units: Vec<(String, &str)> = Vec::new();
    if decoder {
        units.push(("--init-from's decoder".into(), "tokens"));
    }
    for path in checkpoints {
        // The header alone says it: a run reads tokens when its config names a tokenizer.
        let tokenised = lethe::checkpoint::read_config(path)?.data.tokenizer.is_some();
        units.push((format!("`{}`", path.display()), if tokenised { "tokens" } else { "bytes" }));
    }
    if let Some((other, unit)) = units.iter().find(|(_, u)| *u != units[0].1) {
        bail!(
            "--compare: {} reads {} and {other} {unit}: lengths in different units do not compare (compare runs that all read bytes, or all read tokens)",
            units[0].0,
            units[0].1
        );
    }
    Ok(())
}

/// `--init-from FOLDER`: the decoder under each policy of `--policies` at each of
/// `--budgets` (the full cache once), then each `--learned` run (Expire-Span at each
/// budget and uncapped, an ∞-former once), each into its own folder of `--out`. Every
/// policy, budget and run is checked before the first is evaluated.
fn decoder_runs(a: &LongevalArgs, folder: &Path, grid: &Grid) -> Result<Vec<Run>> {
    let device = lethe::device::parse_flag("--device", &a.device)?;
    let full = vec!["full".to_string()];
    let policies = a.policies.as_ref().unwrap_or(&full);
    each_once("--policies", policies, String::clone)?;
    each_once("--budgets", a.budgets.as_deref().unwrap_or_default(), String::clone)?;
    each_file_once("--learned", a.learned.as_deref().unwrap_or_default())?;
    let precision = a.precision.unwrap_or_default();
    let model = Llama::load_as(folder, device, precision)?;
    // What the results were computed in, when not float32 (a folder's results resume
    // only under the same).
    let in_precision = match precision {
        Precision::F32 => String::new(),
        p => format!(", in {}", p.name()),
    };
    let Some(tokenizer) = Tokenizer::of_decoder_folder(folder, model.config.vocab_size as usize)? else {
        bail!("`{}` has no tokenizer.json: lethe longeval writes its samples through it", folder.display());
    };
    lethe::longeval::check(grid, &tokenizer)?;
    let budgets: Vec<(String, Budget)> = a
        .budgets
        .iter()
        .flatten()
        .map(|b| Ok((b.clone(), Budget::parse(b).map_err(|e| anyhow::anyhow!("--budgets `{b}`: {e}"))?)))
        .collect::<Result<_>>()?;
    let shortest = grid.lengths.iter().copied().min().unwrap_or(1);
    let mut plans: Vec<(String, Decoder)> = Vec::new();
    for policy in policies {
        let budgeted: Vec<(String, Option<Budget>)> = match policy.as_str() {
            "full" => vec![("full".into(), None)],
            _ if budgets.is_empty() => {
                bail!("--policies `{policy}` needs --budgets (entries, or fractions of a sample)")
            }
            _ => budgets
                .iter()
                .map(|(text, b)| (format!("{}-{}", folder_safe(policy), folder_safe(text)), Some(*b)))
                .collect(),
        };
        for (name, budget) in budgeted {
            let mut decoder = Decoder { model: &model, policy: policy.clone(), budget, block: 1 };
            let parsed = decoder
                .policy_for(shortest)
                .map_err(|e| anyhow::anyhow!("--policies `{policy}` at {shortest} tokens: {e}"))?;
            decoder.block = block_for(a.block, &parsed)?;
            plans.push((name, decoder));
        }
    }
    let probe_ids = tokenizer.encode(PROBE)?;
    let learned: Vec<Learned> = a
        .learned
        .iter()
        .flatten()
        .map(|run| Learned::load(run, (PROBE, &probe_ids), folder, (device, precision)))
        .collect::<Result<_>>()?;
    let model_files = super::decoder::folder_files(folder)?;
    let folder_print = fingerprint(&model_files)?;
    let mut runs = Vec::new();
    for (name, decoder) in &plans {
        lethe::say!("longeval: {name} ({})", folder.display());
        let budget = decoder.budget.map_or(String::new(), |b| format!(" at {b}"));
        let who = format!("{folder_print}, {}{budget}, blocks of {}{in_precision}", decoder.policy, decoder.block);
        let table = evaluate(decoder, (&tokenizer, "tokens"), grid, (&a.out.join(name), &who))?;
        runs.push(Run { name: name.clone(), table, unit: "tokens" });
    }
    for run in &learned {
        let block = run.block(a.block);
        let mut at: Vec<(String, Option<Budget>)> = Vec::new();
        if run.capped() {
            at.extend(
                budgets.iter().map(|(text, b)| (format!("{}-{}", run.ckpt.config.name, folder_safe(text)), Some(*b))),
            );
        }
        let uncapped =
            if run.capped() { format!("{}-uncapped", run.ckpt.config.name) } else { run.ckpt.config.name.clone() };
        at.push((uncapped, None));
        let run_print = fingerprint(std::slice::from_ref(&run.ckpt.path))?;
        for (name, budget) in at {
            lethe::say!("longeval: {name} ({})", run.name);
            let subject = LearnedAt::new(run, budget, block, &grid.lengths)?;
            let cap = budget.map_or(String::new(), |b| format!(" at {b}"));
            let who = match run.capped() {
                true => format!("{run_print}{cap}, blocks of {block}{in_precision}"),
                false => format!("{run_print}{cap}, blocks of {block}"),
            };
            let table = evaluate(&subject, (&tokenizer, "tokens"), grid, (&a.out.join(&name), &who))?;
            runs.push(Run { name, table, unit: "tokens" });
        }
    }
    Ok(runs)
}

/// A text both the folder's tokenizer and a `--learned` run's must read as the same ids.
const PROBE: &str = "The pass key is 71432. Remember it. What is the pass key? The pass key is 71432.";

/// `text` as a folder name: letters, digits, `.`, `-` and `_` kept, `a/b` as `aofb`,
/// anything else `_`.
fn folder_safe(text: &str) -> String {
    text.replace('/', "of")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' })
        .collect()
}

/// A learned run as a subject of the suite: Expire-Span capped at a budget (resolved
/// against each length of the grid) or uncapped, or an ∞-former.
enum LearnedAt<'a> {
    /// Expire-Span on a Llama, read through the decoding path `block` tokens at a time.
    Decoding { run: &'a Learned, model: &'a Llama, budget: Option<Budget>, block: usize },
    /// The run's training model, one per length.
    Training(Vec<(usize, lethe::model::Lm)>),
}

impl<'a> LearnedAt<'a> {
    fn new(run: &'a Learned, budget: Option<Budget>, block: usize, lengths: &[usize]) -> Result<LearnedAt<'a>> {
        let entries =
            |length: usize| budget.map(|b| b.entries(length as i64)).transpose().map(Option::unwrap_or_default);
        if let Some(model) = run.decoder() {
            lengths.iter().try_for_each(|&length| entries(length).map(drop))?;
            return Ok(LearnedAt::Decoding { run, model, budget, block });
        }
        let mut by_length = Vec::new();
        for &length in lengths {
            by_length.push((length, run.at_budget(entries(length)?, block)?));
        }
        Ok(LearnedAt::Training(by_length))
    }
}

impl Subject for LearnedAt<'_> {
    fn read<'s>(
        &'s self,
        input: &[Token],
        length: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> lethe::error::Result<Box<dyn Reader + 's>> {
        match self {
            LearnedAt::Decoding { run, model, budget, block } => {
                let entries = budget.map(|b| b.entries(length as i64)).transpose()?.unwrap_or(0);
                let cache = run.cache_at(entries)?;
                Ok(Box::new(lethe::generate::DecoderGenerator::with_progress(model, cache, input, *block, progress)?))
            }
            LearnedAt::Training(by_length) => {
                let lm = by_length.iter().find(|(l, _)| *l == length).map(|(_, lm)| lm);
                let lm = lm.ok_or_else(|| {
                    lethe::error::LetheError::Invalid(format!("longeval: no model for length {length}"))
                })?;
                lm.read(input, length, progress)
            }
        }
    }
}

/// One evaluated run.
struct Run {
    name: String,
    table: Vec<Cell>,
    unit: &'static str,
}

/// Each checkpoint's name in the charts: its run folder's name, made unique.
fn run_names(checkpoints: &[&PathBuf]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for path in checkpoints {
        let folder =
            if path.extension().is_some_and(|e| e == "safetensors") { path.parent() } else { Some(path.as_path()) };
        let base = folder.and_then(Path::file_name).map_or("run".to_string(), |n| n.to_string_lossy().into_owned());
        let mut name = base.clone();
        let mut i = 2;
        while names.contains(&name) {
            name = format!("{base}-{i}");
            i += 1;
        }
        names.push(name);
    }
    names
}

/// Evaluates `grid` on the model of `checkpoint` into `out`, printing progress, the
/// summary and the heatmaps. Returns the table and the model's unit.
fn evaluate_run(checkpoint: &Path, grid: &Grid, out: &Path, device: &str) -> Result<(Vec<Cell>, &'static str)> {
    let device = lethe::device::parse_flag("--device", device)?;
    let ckpt = load_checkpoint(checkpoint, None)?;
    lethe::device::apply_threads(ckpt.config.train.threads.min(lethe::device::cores()))?;
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
    let vocab = ckpt.config.model.vocab;
    if tokenizer.is_none() && vocab < 256 {
        bail!(
            "{}: this model reads a task's {vocab} symbols, not text; longeval needs a model of bytes or of a tokenizer's tokens",
            checkpoint.display()
        );
    }
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let (units, unit): (&dyn Units, _) = match &tokenizer {
        Some(t) => (t, "tokens"),
        None => (&ByteUnits, "bytes"),
    };
    let who = fingerprint(std::slice::from_ref(&ckpt.path))?;
    Ok((evaluate(&lm, (units, unit), grid, (out, &who))?, unit))
}

/// Evaluates `grid` on `subject` (named `who` in the table's rows), which reads `units`
/// (named `unit` in the tables), into `out`, printing progress, the summary and the
/// heatmaps.
fn evaluate(
    subject: &dyn Subject,
    (units, unit): (&dyn Units, &str),
    grid: &Grid,
    (out, who): (&Path, &str),
) -> Result<Vec<Cell>> {
    // A grid with a cell that cannot be made is refused before the folder is.
    lethe::longeval::check(grid, units)?;
    // The folder stays, whatever follows: it holds the lock file of the table.
    super::decoder::make_folder("--out", out)?;
    let (cells, longest) = (grid.cells(), grid.lengths.iter().max().copied().unwrap_or(0));
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    lethe::say!(
        "longeval: {} of {} each, up to {longest} {unit} long, into {}",
        plural(cells, "cell"),
        plural(grid.samples, "sample"),
        out.display()
    );
    let started = Instant::now();
    let table = lethe::longeval::run(subject, units, grid, (out, who), |event| match event {
        Progress::Cell(cell, done, total) => {
            let elapsed = started.elapsed();
            let eta = elapsed.mul_f64((total - done) as f64 / done as f64);
            lethe::say!(
                "longeval: {} at {} {unit}, {}: accuracy {:.2}, memory {:.0} per layer ({done}/{total} cells, {} elapsed, about {} to go)",
                cell.task,
                cell.length,
                depth_label(cell.depth, "depth "),
                cell.accuracy,
                cell.memory,
                format_duration(elapsed),
                format_duration(eta)
            );
        }
        Progress::Samples(task, length, depth, done, of) => {
            let depth = depth_label(depth.map(|d| 100.0 * d), "depth ");
            lethe::say!("longeval: {task} at {length} {unit}, {depth}: {done}/{of} samples");
        }
        Progress::Reading { task, length, depth, sample: (i, of), read: (read, input) } => {
            let depth = depth_label(depth.map(|d| 100.0 * d), "depth ");
            let percent = 100.0 * read as f64 / input.max(1) as f64;
            lethe::say!("longeval: {task} at {length} {unit}, {depth}: sample {i}/{of}, {read}/{input} {unit} read ({percent:.0}%)");
        }
    })?;
    print_summary(&table, grid, unit);
    println!("wrote {} and {}", out.join("longeval.csv").display(), out.join("longeval.json").display());
    for task in &grid.tasks {
        let svg_path = out.join(format!("heatmap-{task}.svg"));
        let png =
            lethe::plot::write_svg_and_png(&svg_path, &lethe::plot::heatmap(&heatmap(&table, grid, task, unit))?)?;
        println!("wrote {} and {}", svg_path.display(), png.display());
    }
    // Accuracy against length, a line per task, where there is more than one length.
    if grid.lengths.len() > 1 {
        let series: Vec<SweepSeries> = grid
            .tasks
            .iter()
            .enumerate()
            .map(|(i, task)| series(task.to_string(), i, by_length(&table, grid, |c| c.task == *task)))
            .collect();
        let path = out.join("accuracy.svg");
        let x_label = format!("length ({unit})");
        let svg = lethe::plot::sweep_chart(&series, (&x_label, "accuracy"), ACCURACY, &path.with_extension("png"))?;
        lethe::output::write("--out", &path, svg.as_bytes(), &[])?;
        println!("wrote {} and its .png", path.display());
    }
    Ok(table)
}

/// The y range of the accuracy charts.
const ACCURACY: Option<(f64, f64)> = Some((0.0, 1.0));

/// `42%`, or `spread` for a task without a depth, after `prefix` when there is one.
fn depth_label(depth: Option<f64>, prefix: &str) -> String {
    depth.map_or("spread".to_string(), |d| format!("{prefix}{d:.0}%"))
}

/// `task`'s accuracy by depth (rows) and length (columns); a task without a depth has
/// one row.
fn heatmap(table: &[Cell], grid: &Grid, task: &str, unit: &str) -> Heatmap {
    let depths = grid.depths_of(task);
    let find = |length: usize, depth: Option<f64>| {
        table.iter().find(|c| c.task == task && c.length == length && c.at(depth)).map(|c| c.accuracy)
    };
    Heatmap {
        title: format!("{task}: accuracy (%) by length and depth"),
        lengths: (grid.lengths.clone(), unit.to_string()),
        rows: depths.iter().map(|d| depth_label(d.map(|d| 100.0 * d), "")).collect(),
        accuracy: depths.iter().map(|&d| grid.lengths.iter().map(|&l| find(l, d)).collect()).collect(),
    }
}

/// The mean accuracy and memory per layer at each length of the cells `keep` picks:
/// `(length, accuracy, memory)`.
fn by_length(table: &[Cell], grid: &Grid, keep: impl Fn(&Cell) -> bool) -> Vec<(f64, f64, f64)> {
    grid.lengths
        .iter()
        .filter_map(|&length| {
            let cells: Vec<&Cell> = table.iter().filter(|c| c.length == length && keep(c)).collect();
            let n = cells.len() as f64;
            (n > 0.0).then(|| {
                let accuracy = cells.iter().map(|c| c.accuracy).sum::<f64>() / n;
                (length as f64, accuracy, cells.iter().map(|c| c.memory).sum::<f64>() / n)
            })
        })
        .collect()
}

/// A line of an accuracy-by-length chart, its legend naming the memory held.
fn series(name: String, i: usize, points: Vec<(f64, f64, f64)>) -> SweepSeries {
    let memory = points.iter().map(|p| p.2).sum::<f64>() / points.len().max(1) as f64;
    let means: Vec<(f64, f64)> = points.iter().map(|&(l, a, _)| (l, a)).collect();
    SweepSeries {
        name: format!("{name} ({memory:.0} memories/layer)"),
        colour: lethe::plot::colour(i),
        points: means.clone(),
        means,
    }
}

/// The comparison of several runs: `accuracy.svg` (each run's mean over the suite) and
/// `accuracy-TASK.svg` per task, one line per group of runs (the runs whose names differ
/// only in a seed suffix, `-s1`, `-s2`: the line through their mean, a dot per run), and
/// `compare.csv` with every run's accuracy and memory per task and length.
fn compare_charts(runs: &[Run], grid: &Grid, out: &Path) -> Result<Vec<PathBuf>> {
    let unit = runs.first().map_or("bytes", |r| r.unit);
    let x_label = format!("length ({unit})");
    let groups = seed_groups(runs);
    let mut written = Vec::new();
    let mut chart = |file: String, title: &str, keep: &dyn Fn(&Cell) -> bool| -> Result<()> {
        let lines: Vec<SweepSeries> =
            groups.iter().enumerate().map(|(i, (name, members))| group_series(name, i, members, grid, keep)).collect();
        let path = out.join(file);
        let svg = lethe::plot::sweep_chart(&lines, (&x_label, title), ACCURACY, &path.with_extension("png"))?;
        lethe::output::write("--out", &path, svg.as_bytes(), &[])?;
        written.push(path);
        Ok(())
    };
    chart("accuracy.svg".into(), "accuracy, mean over the suite", &|_| true)?;
    for task in &grid.tasks {
        chart(format!("accuracy-{task}.svg"), &format!("{task} accuracy"), &|c| c.task == *task)?;
    }
    let mut csv = csv::Writer::from_writer(vec![]);
    csv.write_record(["group", "run", "task", "length", "accuracy", "memory"])?;
    for (group, members) in &groups {
        for run in members {
            for task in &grid.tasks {
                for (length, accuracy, memory) in by_length(&run.table, grid, |c| c.task == *task) {
                    let row =
                        [group, &run.name, *task, &length.to_string(), &accuracy.to_string(), &memory.to_string()];
                    csv.write_record(row)?;
                }
            }
        }
    }
    let path = out.join("compare.csv");
    lethe::output::write("--out", &path, &csv.into_inner()?, &[])?;
    written.push(path);
    print_groups(&groups, grid, unit);
    Ok(written)
}

/// The runs grouped by name without a trailing seed suffix (`expire-s2` is `expire`),
/// in the order the groups first appear.
fn seed_groups(runs: &[Run]) -> Vec<(String, Vec<&Run>)> {
    let mut groups: Vec<(String, Vec<&Run>)> = Vec::new();
    for run in runs {
        let group = strip_seed(&run.name).to_string();
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, members)) => members.push(run),
            None => groups.push((group, vec![run])),
        }
    }
    groups
}

/// `name` without a trailing `-sN`.
fn strip_seed(name: &str) -> &str {
    match name.rsplit_once("-s") {
        Some((base, seed)) if !base.is_empty() && !seed.is_empty() && seed.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

/// A group's line: a dot per run and length, the line through their means, the legend
/// naming the memory held and the number of runs.
fn group_series(name: &str, i: usize, members: &[&Run], grid: &Grid, keep: &dyn Fn(&Cell) -> bool) -> SweepSeries {
    let per_run: Vec<Vec<(f64, f64, f64)>> = members.iter().map(|r| by_length(&r.table, grid, keep)).collect();
    let points: Vec<(f64, f64, f64)> = per_run.iter().flatten().copied().collect();
    let mut line = series(name.to_string(), i, mean_by_length(&points));
    line.points = points.iter().map(|&(l, a, _)| (l, a)).collect();
    if members.len() > 1 {
        line.name = line.name.replace(" memories/layer)", &format!(" memories/layer, {} runs)", members.len()));
    }
    line
}

/// The mean accuracy and memory at each length of `points` (`(length, accuracy, memory)`).
fn mean_by_length(points: &[(f64, f64, f64)]) -> Vec<(f64, f64, f64)> {
    let mut lengths: Vec<f64> = points.iter().map(|p| p.0).collect();
    lengths.sort_by(f64::total_cmp);
    lengths.dedup();
    lengths
        .into_iter()
        .map(|l| {
            let at: Vec<&(f64, f64, f64)> = points.iter().filter(|p| p.0 == l).collect();
            let n = at.len() as f64;
            (l, at.iter().map(|p| p.1).sum::<f64>() / n, at.iter().map(|p| p.2).sum::<f64>() / n)
        })
        .collect()
}

/// Each group's accuracy over the suite by length: the mean over its runs, their
/// spread (standard deviation), and the memory held.
fn print_groups(groups: &[(String, Vec<&Run>)], grid: &Grid, unit: &str) {
    println!();
    println!("{:<28} {:>5} {:>10} {:>9} {:>7} {:>12}", "group", "runs", unit, "accuracy", "sd", "memory/layer");
    for (group, members) in groups {
        for &length in &grid.lengths {
            let figures: Vec<(f64, f64)> = members
                .iter()
                .filter_map(|r| by_length(&r.table, grid, |_| true).into_iter().find(|p| p.0 == length as f64))
                .map(|(_, a, m)| (a, m))
                .collect();
            let n = figures.len().max(1) as f64;
            let mean = figures.iter().map(|f| f.0).sum::<f64>() / n;
            let sd = (figures.iter().map(|f| (f.0 - mean).powi(2)).sum::<f64>() / n).sqrt();
            let memory = figures.iter().map(|f| f.1).sum::<f64>() / n;
            println!("{group:<28} {:>5} {length:>10} {mean:>9.3} {sd:>7.3} {memory:>12.1}", members.len());
        }
    }
}

/// Each task's accuracy by length, averaged over depths, with the memory held.
fn print_summary(table: &[Cell], grid: &Grid, unit: &str) {
    println!("{:<16} {:>10} {:>9} {:>12}", "task", unit, "accuracy", "memory/layer");
    for &task in &grid.tasks {
        for (length, accuracy, memory) in by_length(table, grid, |c| c.task == task) {
            println!("{task:<16} {length:>10} {accuracy:>9.3} {memory:>12.1}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_suffixes_group_runs() {
        assert_eq!(strip_seed("expire-s12"), "expire");
        assert_eq!(strip_seed("expire-s"), "expire-s");
        assert_eq!(strip_seed("xl-small"), "xl-small");
        assert_eq!(strip_seed("-s1"), "-s1");
        assert_eq!(
            mean_by_length(&[(2.0, 0.5, 10.0), (1.0, 1.0, 4.0), (2.0, 0.0, 20.0)]),
            vec![(1.0, 1.0, 4.0), (2.0, 0.25, 15.0)]
        );
    }
}
