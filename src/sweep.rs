//! `lethe sweep`: quality against memory size, the comparison of the Expire-Span
//! paper's Figures 4 and 5. The same backbone is trained once per mechanism, memory size
//! and seed on one task; each run is evaluated on the validation split, and the sweep
//! writes a table (terminal, `sweep.csv`, `sweep.json`), a plot of quality against the
//! measured average memory size (`sweep.svg`, `sweep.png`) and an HTML report (`sweep.html`).
//!
//! The size knob of each mechanism:
//! - `fixed`, `adaptive`, `expire`: the (maximum) span `L`. Adaptive-Span and
//!   Expire-Span learn to use less; the plot's x axis is the memory they actually use.
//! - `compressive`: `size` slots in all, half uncompressed (`L`, at least one block) and
//!   the rest compressed (`C`), so it reaches `L + c C` tokens back.
//!
//! Every run lives in `<sweep>/runs/<mechanism>-<size>-s<seed>` with its own config,
//! metrics and checkpoint. A finished run leaves `point.json`; running the same sweep
//! again skips the runs whose config is unchanged, so an interrupted sweep resumes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::checkpoint::write_atomic;
use crate::config::{Config, Mechanism};
use crate::error::{LetheError, Result};
use crate::metrics::html_escape;
use crate::model::memory::describe;
use crate::plot::SweepSeries;
use crate::task::Metric;
use crate::train::{train, TrainOptions};

/// One mechanism with the sizes to try.
#[derive(Clone, Debug, PartialEq)]
pub struct Arm {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// Memory sizes, in the mechanism's knob (see the module documentation).
    pub sizes: Vec<usize>,
}

/// Parses `mechanism[:size,size,...]` items; an item without sizes gets
/// `default_sizes` of its mechanism.
pub fn parse_arms(items: &[String], default_sizes: &dyn Fn(Mechanism) -> Vec<usize>) -> Result<Vec<Arm>> {
    let arms = items
        .iter()
        .map(|item| {
            let (name, sizes) = item.split_once(':').unwrap_or((item, ""));
            let mechanism = Mechanism::parse(name.trim())?;
            let sizes = if sizes.trim().is_empty() {
                default_sizes(mechanism)
            } else {
                parse_sizes(sizes, &format!("--mechanism {item}"))?
            };
            if sizes.is_empty() {
                return Err(LetheError::Invalid(format!(
                    "sweep arm `{item}`: no sizes (give --sizes or `{name}:16,32`)"
                )));
            }
            Ok(Arm { mechanism, sizes })
        })
        .collect::<Result<Vec<Arm>>>()?;
    // A mechanism given twice would train the same runs twice into one folder, and the
    // report would count them as seeds.
    for (i, arm) in arms.iter().enumerate() {
        if arms[..i].iter().any(|a| a.mechanism == arm.mechanism) {
            return Err(LetheError::Invalid(format!(
                "--mechanism {}: given twice; give its sizes once, as `{}:16,32`",
                arm.mechanism.name(),
                arm.mechanism.name()
            )));
        }
    }
    Ok(arms)
}

/// The sizes tried when none are given: `L/8`, `L/4`, `L/2` and `L` of `cfg`, each at
/// least one block.
pub fn default_sizes(cfg: &Config) -> Vec<usize> {
    let l = cfg.memory.span;
    let mut sizes: Vec<usize> = [l / 8, l / 4, l / 2, l].iter().map(|&x| x.max(cfg.train.block)).collect();
    sizes.dedup();
    sizes
}

/// [`default_sizes`] that `mechanism` can be built with on `cfg`, and why each other
/// one cannot: a two-memory mechanism given one block has no room for its second
/// memory beside the block its recent window takes.
pub fn default_sizes_of(cfg: &Config, mechanism: Mechanism) -> (Vec<usize>, Vec<String>) {
    let (mut kept, mut skipped) = (vec![], vec![]);
    for size in default_sizes(cfg) {
        match configure(cfg, mechanism, size, cfg.seed) {
            Ok(_) => kept.push(size),
            Err(e) => skipped.push(e.to_string()),
        }
    }
    (kept, skipped)
}

/// Parses `16,32,64`, given by the flag `flag` (named in the error).
/// Each size once: a repeated size would train the same run twice into one folder.
pub fn parse_sizes(text: &str, flag: &str) -> Result<Vec<usize>> {
    let mut sizes: Vec<usize> = vec![];
    for s in text.split(',') {
        let size = s.trim().parse::<usize>().ok().filter(|&n| n > 0);
        let size = size
            .ok_or_else(|| LetheError::Invalid(format!("{flag}: memory size `{s}` is not a positive whole number")))?;
        if sizes.contains(&size) {
            return Err(LetheError::Invalid(format!("{flag}: memory size {size} is given twice")));
        }
        sizes.push(size);
    }
    Ok(sizes)
}

/// Seeds from `1,2,3`: whole numbers, each once (a repeated seed would train the same
/// run twice into one folder).
pub fn parse_seeds(text: &str) -> Result<Vec<u64>> {
    let mut seeds: Vec<u64> = vec![];
    for s in text.split(',') {
        let seed = s.trim().parse::<u64>().map_err(|_| {
            LetheError::Invalid(format!("--seeds: seed `{s}` is not a whole number (give them as 1,2,3)"))
        })?;
        if seeds.contains(&seed) {
            return Err(LetheError::Invalid(format!("--seeds: seed {seed} is given twice")));
        }
        seeds.push(seed);
    }
    Ok(seeds)
}

/// The run's config: `base` with the mechanism, its size and the seed.
pub fn configure(base: &Config, mechanism: Mechanism, size: usize, seed: u64) -> Result<Config> {
    let mut c = base.clone();
    c.memory.mechanism = mechanism;
    c.seed = seed;
    c.name = format!("{}-{size}-s{seed}", mechanism.name());
    describe(mechanism).set_size(&mut c, size);
    c.validate().map_err(|e| LetheError::Invalid(format!("sweep run `{}`: {e}", c.name)))?;
    Ok(c)
}

/// What a run of the sweep measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// The mechanism.
    pub mechanism: String,
    /// The size knob.
    pub size: usize,
    /// The seed.
    pub seed: u64,
    /// The run's name (its folder under `runs/`).
    pub run: String,
    /// What `quality` measures: `answers %`, `error %` or `bpb`.
    pub metric: String,
    /// The task's quality figure on the validation split.
    pub quality: f64,
    /// Validation loss (nats per scored token).
    pub loss: f64,
    /// Token accuracy on the scored tokens.
    pub accuracy: f64,
    /// Average number of memories a query attends to, averaged over layers.
    pub mem_size: f64,
    /// Training and evaluation time, seconds.
    pub seconds: f64,
    /// The run's config (TOML), to tell whether a rerun can reuse the point.
    pub config: String,
}

/// Trains every run of the plan under `dir` (skipping finished ones) and writes the
/// report. `say` receives one progress line per run.
///
/// A run folder of the plan that holds a run with other settings (a finished one whose
/// point has another config, or any checkpoint trained under another config) is
/// replaced only with `overwrite`; without it the sweep refuses before training
/// anything, as `lethe train` refuses to replace a run.
pub fn run(
    base: &Config,
    arms: &[Arm],
    seeds: &[u64],
    dir: &Path,
    overwrite: bool,
    say: &mut dyn FnMut(&str),
) -> Result<Vec<SweepPoint>> {
    let mut plan = vec![];
    for arm in arms {
        for &size in &arm.sizes {
            for &seed in seeds {
                plan.push(configure(base, arm.mechanism, size, seed)?);
            }
        }
    }
    // Every run must fit before the first one starts, and before anything is written.
    for cfg in &plan {
        crate::model::check_fits(cfg, crate::device::parse(&cfg.train.device)?)?;
    }
    if !overwrite {
        refuse_other_runs(&plan, &dir.join("runs"))?;
    }
    let made = crate::output::MadeFolder::make(dir)?;
    let base_toml = dir.join("base.toml");
    let points = write_atomic(&base_toml, base.to_toml()?.as_bytes()).and_then(|()| run_plan(&plan, dir, say));
    if points.is_err() && !dir.join("runs").exists() {
        // Nothing was trained (the first run could not start): no folder is left behind.
        let _ = std::fs::remove_file(&base_toml);
        made.remove_if_empty();
    }
    let points = points?;
    write_report(base, &points, dir)?;
    Ok(points)
}

/// Trains the runs of `plan` in turn into `dir/runs` (or reads the points of those done).
fn run_plan(plan: &[Config], dir: &Path, say: &mut dyn FnMut(&str)) -> Result<Vec<SweepPoint>> {
    let mut points = vec![];
    for (i, cfg) in plan.iter().enumerate() {
        let point = run_one(cfg, &dir.join("runs"))?;
        say(&format!(
            "[{}/{}] {:<22} {} {:.2} | mem {:.1} | {:.0} s",
            i + 1,
            plan.len(),
            point.run,
            point.metric,
            point.quality,
            point.mem_size,
            point.seconds
        ));
        points.push(point);
    }
    Ok(points)
}

/// Refuses the first run of `plan` whose folder under `runs` holds a run trained with
/// other settings.
fn refuse_other_runs(plan: &[Config], runs: &Path) -> Result<()> {
    for cfg in plan {
        let folder = runs.join(&cfg.name);
        if !folder.join(crate::checkpoint::FILE_NAME).exists() {
            continue;
        }
        let toml = cfg.to_toml()?;
        let saved = crate::input::read_to_string(&folder.join("config.toml")).unwrap_or_default();
        if saved != toml {
            return Err(LetheError::Invalid(format!(
                "sweep run `{}` already holds a run trained with other settings: pass --overwrite to retrain it, or --out for another sweep folder",
                folder.display()
            )));
        }
    }
    Ok(())
}

/// Trains one run, or reads its point when it finished earlier with the same config.
fn run_one(cfg: &Config, runs: &Path) -> Result<SweepPoint> {
    let toml = cfg.to_toml()?;
    let path = runs.join(&cfg.name).join("point.json");
    if let Some(done) =
        crate::input::read_to_string(&path).ok().and_then(|t| serde_json::from_str::<SweepPoint>(&t).ok())
    {
        if done.config == toml {
            return Ok(done);
        }
    }
    let start = Instant::now();
    let opts = TrainOptions { out_dir: runs.to_path_buf(), overwrite: true, quiet: true, ..TrainOptions::default() };
    let m = if cfg.data.source.is_rl() { train_agent(cfg, &opts)? } else { train_lm(cfg, &opts)? };
    let point = SweepPoint {
        mechanism: cfg.memory.mechanism.name().to_string(),
        size: describe(cfg.memory.mechanism).size(cfg),
        seed: cfg.seed,
        run: cfg.name.clone(),
        metric: crate::task::metric(cfg).name().to_string(),
        quality: m.quality,
        loss: m.loss,
        accuracy: m.accuracy,
        mem_size: crate::metrics::mean(&m.mem_size),
        seconds: start.elapsed().as_secs_f64(),
        config: toml,
    };
    let json = serde_json::to_string_pretty(&point)?;
    write_atomic(&path, json.as_bytes())?;
    Ok(point)
}

/// What a run measured (see [`SweepPoint`] for each figure).
struct Measured {
    quality: f64,
    loss: f64,
    accuracy: f64,
    /// Per layer.
    mem_size: Vec<f64>,
}

fn no_evaluation(cfg: &Config) -> LetheError {
    LetheError::Invalid(format!("sweep run `{}` finished without an evaluation", cfg.name))
}

/// Trains an agent on a gridworld and reads its last evaluation: quality is the success
/// rate (corridor) or the mean rooms reached (portal), `loss` the mean return, `accuracy`
/// the success rate.
fn train_agent(cfg: &Config, opts: &TrainOptions) -> Result<Measured> {
    let r = crate::rl::train::train(cfg, opts)?.last_eval.ok_or_else(|| no_evaluation(cfg))?;
    Ok(Measured {
        quality: r.mean_rooms.unwrap_or(100.0 * r.success_rate),
        loss: r.mean_return,
        accuracy: r.success_rate,
        mem_size: r.mem_size,
    })
}

/// Trains a language model and reads its last validation.
fn train_lm(cfg: &Config, opts: &TrainOptions) -> Result<Measured> {
    let r = train(cfg, opts)?.last_eval.ok_or_else(|| no_evaluation(cfg))?;
    let metric = crate::task::metric(cfg);
    if r.tokens == 0 {
        // Every figure would be 0 over 0 tokens: an error of 100%, a loss of 0.
        let why = crate::eval::NOTHING_SCORED_ADVICE;
        return Err(LetheError::Invalid(format!(
            "sweep run `{}`: its evaluation scored no token, so it has no {}: {why}",
            cfg.name,
            metric.name()
        )));
    }
    let quality = match metric {
        Metric::Answers => 100.0 * r.answer_accuracy.unwrap_or(0.0),
        Metric::Error => 100.0 * (1.0 - r.accuracy),
        Metric::Accuracy => 100.0 * r.accuracy,
        Metric::Bpb => r.bpb,
        Metric::WordPerplexity => r.word_ppl.unwrap_or(f64::NAN),
        Metric::Success | Metric::Rooms => {
            return Err(LetheError::Invalid("gridworlds have no validation stream".into()))
        }
    };
    Ok(Measured { quality, loss: r.loss, accuracy: r.accuracy, mem_size: r.mem_size })
}

/// The runs of one mechanism and size, summarised over their seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedSummary {
    /// The mechanism.
    pub mechanism: String,
    /// The size knob.
    pub size: usize,
    /// How many seeds were run.
    pub seeds: usize,
    /// Mean and sample standard deviation (0 for one seed) of the quality figure.
    pub quality: (f64, f64),
    /// Mean and sample standard deviation of the memory size.
    pub mem_size: (f64, f64),
}

/// Mean and sample standard deviation (`n - 1` in the denominator; 0 for one value).
pub fn mean_sd(values: &[f64]) -> (f64, f64) {
    let m = crate::metrics::mean(values);
    if values.len() < 2 {
        return (m, 0.0);
    }
    let ss: f64 = values.iter().map(|v| (v - m) * (v - m)).sum();
    (m, (ss / (values.len() - 1) as f64).sqrt())
}

/// One summary per (mechanism, size), in the order the runs came.
pub fn summarise(points: &[SweepPoint]) -> Vec<SeedSummary> {
    let mut keys: Vec<(&str, usize)> = vec![];
    for p in points {
        if !keys.contains(&(p.mechanism.as_str(), p.size)) {
            keys.push((p.mechanism.as_str(), p.size));
        }
    }
    keys.into_iter()
        .map(|(mechanism, size)| {
            let same: Vec<&SweepPoint> = points.iter().filter(|p| p.mechanism == mechanism && p.size == size).collect();
            let quality: Vec<f64> = same.iter().map(|p| p.quality).collect();
            let mem: Vec<f64> = same.iter().map(|p| p.mem_size).collect();
            SeedSummary {
                mechanism: mechanism.to_string(),
                size,
                seeds: same.len(),
                quality: mean_sd(&quality),
                mem_size: mean_sd(&mem),
            }
        })
        .collect()
}

/// The summary over seeds as aligned text (mean ± sample standard deviation).
pub fn summary_table(summaries: &[SeedSummary], metric: &str) -> String {
    let mut out = format!("{:<12} {:>6} {:>5} {:>17} {:>15}\n", "mechanism", "size", "seeds", metric, "mem size");
    for s in summaries {
        let q = format!("{:.2} ± {:.2}", s.quality.0, s.quality.1);
        let m = format!("{:.1} ± {:.1}", s.mem_size.0, s.mem_size.1);
        let _ = writeln!(out, "{:<12} {:>6} {:>5} {:>17} {:>15}", s.mechanism, s.size, s.seeds, q, m);
    }
    out
}

/// One row of `summary.csv`.
#[derive(Serialize)]
struct SummaryRow<'a> {
    mechanism: &'a str,
    size: usize,
    seeds: usize,
    quality_mean: f64,
    quality_sd: f64,
    mem_size_mean: f64,
    mem_size_sd: f64,
}

fn summary_csv(summaries: &[SeedSummary]) -> Result<String> {
    crate::metrics::csv_text(summaries.iter().map(|s| SummaryRow {
        mechanism: &s.mechanism,
        size: s.size,
        seeds: s.seeds,
        quality_mean: s.quality.0,
        quality_sd: s.quality.1,
        mem_size_mean: s.mem_size.0,
        mem_size_sd: s.mem_size.1,
    }))
}

/// The table as aligned text.
pub fn table(points: &[SweepPoint]) -> String {
    let metric = points.first().map_or("quality", |p| p.metric.as_str());
    // Gridworld points carry the mean return where language models carry the loss.
    let loss = if matches!(metric, "success %" | "rooms") { "return" } else { "loss" };
    let mut out = format!(
        "{:<12} {:>6} {:>5} {:>10} {:>10} {:>9} {:>8}\n",
        "mechanism", "size", "seed", metric, "mem size", loss, "time s"
    );
    for p in points {
        let _ = writeln!(
            out,
            "{:<12} {:>6} {:>5} {:>10.2} {:>10.1} {:>9.4} {:>8.0}",
            p.mechanism, p.size, p.seed, p.quality, p.mem_size, p.loss, p.seconds
        );
    }
    out
}

/// One row of `sweep.csv`: a point without its config.
#[derive(Serialize)]
struct PointRow<'a> {
    mechanism: &'a str,
    size: usize,
    seed: u64,
    run: &'a str,
    metric: &'a str,
    quality: f64,
    mem_size: f64,
    loss: f64,
    accuracy: f64,
    seconds: f64,
}

fn csv(points: &[SweepPoint]) -> Result<String> {
    crate::metrics::csv_text(points.iter().map(|p| PointRow {
        mechanism: &p.mechanism,
        size: p.size,
        seed: p.seed,
        run: &p.run,
        metric: &p.metric,
        quality: p.quality,
        mem_size: p.mem_size,
        loss: p.loss,
        accuracy: p.accuracy,
        seconds: p.seconds,
    }))
}

/// Writes `sweep.json`, `sweep.csv`, `summary.csv` (mean and standard deviation over
/// seeds), `sweep.svg`, `sweep.png` and `sweep.html` into `dir`.
pub fn write_report(base: &Config, points: &[SweepPoint], dir: &Path) -> Result<Vec<PathBuf>> {
    let json = serde_json::to_string_pretty(points)?;
    let png = dir.join("sweep.png");
    let svg = plot(points, crate::task::metric(base).higher_is_better(), &png)?;
    let html = report_html(base, points, &svg);
    let summary = summary_csv(&summarise(points))?;
    let files = [
        ("sweep.json", json),
        ("sweep.csv", csv(points)?),
        ("summary.csv", summary),
        ("sweep.svg", svg),
        ("sweep.html", html),
    ];
    let mut written = vec![png];
    for (name, body) in files {
        let path = dir.join(name);
        write_atomic(&path, body.as_bytes())?;
        written.push(path);
    }
    Ok(written)
}

/// The colour of a mechanism's points and line (grey for a name lethe does not know).
fn rgb_of(mechanism: &str) -> (u8, u8, u8) {
    Mechanism::parse(mechanism).map_or((85, 85, 85), |m| describe(m).colour())
}

/// [`rgb_of`] as an HTML colour.
fn colour_of(mechanism: &str) -> String {
    let (r, g, b) = rgb_of(mechanism);
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// The plot (through [`crate::plot::sweep_chart`]): quality against average memory
/// size, one colour per mechanism, a line through each mechanism's mean per size; the x
/// axis on a log scale when the sizes span more than 8x. Returns the SVG text and writes
/// the same chart to `png`.
pub fn plot(points: &[SweepPoint], higher_is_better: bool, png: &Path) -> Result<String> {
    let mut mechanisms: Vec<&str> = points.iter().map(|p| p.mechanism.as_str()).collect();
    mechanisms.sort();
    mechanisms.dedup();
    let series: Vec<SweepSeries> = mechanisms
        .iter()
        .map(|m| {
            let mine: Vec<&SweepPoint> = points.iter().filter(|p| p.mechanism == *m).collect();
            let (r, g, b) = rgb_of(m);
            SweepSeries {
                name: m.to_string(),
                colour: plotters::style::RGBColor(r, g, b),
                points: mine.iter().map(|p| (p.mem_size.max(1e-3), p.quality)).collect(),
                means: means_by_size(&mine),
            }
        })
        .collect();
    let metric = points.first().map_or("quality", |p| p.metric.as_str());
    let better = if higher_is_better { "higher is better" } else { "lower is better" };
    crate::plot::sweep_chart(&series, ("average memory size", &format!("{metric} ({better})")), None, png)
}

/// Mean memory size and quality per size knob, in order of size.
fn means_by_size(points: &[&SweepPoint]) -> Vec<(f64, f64)> {
    let mut sizes: Vec<usize> = points.iter().map(|p| p.size).collect();
    sizes.sort();
    sizes.dedup();
    sizes
        .iter()
        .map(|&size| {
            let same: Vec<&&SweepPoint> = points.iter().filter(|p| p.size == size).collect();
            let n = same.len() as f64;
            (
                same.iter().map(|p| p.mem_size.max(1e-3)).sum::<f64>() / n,
                same.iter().map(|p| p.quality).sum::<f64>() / n,
            )
        })
        .collect()
}

/// A table row: the mechanism in its plot colour, then the cells.
fn html_row(mechanism: &str, cells: &[String]) -> String {
    let cells: String = cells.iter().map(|c| format!("<td>{c}</td>")).collect();
    format!("<tr><td style=\"color:{}\">{}</td>{cells}</tr>\n", colour_of(mechanism), html_escape(mechanism))
}

fn report_html(base: &Config, points: &[SweepPoint], svg: &str) -> String {
    let rows: String = points
        .iter()
        .map(|p| {
            let cells = [
                p.size.to_string(),
                p.seed.to_string(),
                format!("{:.2}", p.quality),
                format!("{:.1}", p.mem_size),
                format!("{:.4}", p.loss),
                format!("{:.1}%", 100.0 * p.accuracy),
                format!("{:.0}", p.seconds),
            ];
            html_row(&p.mechanism, &cells)
        })
        .collect();
    let metric = html_escape(points.first().map_or("quality", |p| p.metric.as_str()));
    let means: String = summarise(points)
        .iter()
        .map(|s| {
            let cells = [
                s.size.to_string(),
                s.seeds.to_string(),
                format!("{:.2} ± {:.2}", s.quality.0, s.quality.1),
                format!("{:.1} ± {:.1}", s.mem_size.0, s.mem_size.1),
            ];
            html_row(&s.mechanism, &cells)
        })
        .collect();
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>lethe sweep: {name}</title>\n<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:2px 10px;text-align:right}} table{{border-collapse:collapse}} tr:nth-child(even){{background:#f4f4f4}}</style></head>\n<body><h1>Quality against memory size</h1>\n<p>Task: {data}. Model: {layers} layers x {d}, {heads} heads, block {block}, batch {batch}, {steps} steps. Validation split.</p>\n{svg}\n<table><tr><th>mechanism</th><th>size</th><th>seed</th><th>{metric}</th><th>mem size</th><th>loss</th><th>token acc.</th><th>time s</th></tr>\n{rows}</table>\n<h2>Over seeds</h2>\n<table><tr><th>mechanism</th><th>size</th><th>seeds</th><th>{metric}, mean ± sd</th><th>mem size, mean ± sd</th></tr>\n{means}</table>\n<p>Size: the span <i>L</i> (fixed, adaptive, expire) or the slots in all (compressive: half uncompressed, half compressed). Memory size: the average number of memories a query attends to, measured on the validation split.</p>\n</body></html>\n",
        name = html_escape(&base.name),
        data = html_escape(&crate::task::describe(base)),
        layers = base.model.layers,
        d = base.model.d_model,
        heads = base.model.heads,
        block = base.train.block,
        batch = base.train.batch,
        steps = base.train.steps,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_sizes_and_mechanisms_are_refused() {
        let e = parse_sizes("16,32,16", "--sizes").unwrap_err().to_string();
        assert!(e.contains("--sizes: memory size 16 is given twice"), "{e}");
        let e = parse_arms(&["fixed:8".into(), "fixed:16".into()], &|_| vec![4]).unwrap_err().to_string();
        assert!(e.contains("--mechanism fixed: given twice"), "{e}");
    }

    #[test]
    fn arms_parse_with_and_without_sizes() {
        let arms = parse_arms(&["fixed:8,16".into(), "expire".into()], &|_| vec![64]).unwrap();
        assert_eq!(arms[0], Arm { mechanism: Mechanism::Fixed, sizes: vec![8, 16] });
        assert_eq!(arms[1], Arm { mechanism: Mechanism::Expire, sizes: vec![64] });
        assert!(parse_arms(&["lstm".into()], &|_| vec![8]).unwrap_err().to_string().contains("lstm"));
        assert!(parse_arms(&["fixed:8,x".into()], &|_| vec![8]).unwrap_err().to_string().contains("`x`"));
        assert!(parse_arms(&["fixed".into()], &|_| vec![]).is_err());
    }

    #[test]
    fn default_sizes_are_fractions_of_the_span_of_at_least_a_block() {
        let mut base = Config::preset("copy-tiny").unwrap(); // span 128, block 32
        assert_eq!(default_sizes(&base), vec![32, 64, 128]);
        base.memory.span = 512;
        assert_eq!(default_sizes(&base), vec![64, 128, 256, 512]);
    }

    #[test]
    fn default_sizes_leave_out_those_a_mechanism_cannot_be_built_with() {
        let base = Config::preset("copy-sweep-tiny").unwrap(); // span 64, block 8
        assert_eq!(default_sizes(&base), vec![8, 16, 32, 64]);
        assert_eq!(default_sizes_of(&base, Mechanism::Fixed), (vec![8, 16, 32, 64], vec![]));
        let (kept, skipped) = default_sizes_of(&base, Mechanism::Compressive);
        assert_eq!(kept, vec![16, 32, 64]);
        assert_eq!(skipped.len(), 1);
        assert!(
            skipped[0].contains("compressive-8-s1") && skipped[0].contains("memory.compressive.slots"),
            "{skipped:?}"
        );
    }

    #[test]
    fn compressive_sizes_split_into_memory_and_slots() {
        let base = Config::preset("copy-tiny").unwrap(); // block 32
        let c = configure(&base, Mechanism::Compressive, 128, 3).unwrap();
        assert_eq!((c.memory.span, c.memory.compressive.slots, c.seed), (64, 64, 3));
        let c = configure(&base, Mechanism::Compressive, 48, 1).unwrap();
        assert_eq!((c.memory.span, c.memory.compressive.slots), (32, 16), "at least one block uncompressed");
        let err = configure(&base, Mechanism::Fixed, 16, 1).unwrap_err().to_string();
        assert!(err.contains("fixed-16-s1") && err.contains("train.block"), "{err}");
    }

    #[test]
    fn infinity_sizes_split_into_stm_and_basis_functions() {
        let base = Config::preset("copy-tiny").unwrap(); // block 32, two widths
        let c = configure(&base, Mechanism::Infinity, 128, 1).unwrap();
        assert_eq!((c.memory.span, c.memory.infinity.basis), (64, 64));
        let c = configure(&base, Mechanism::Infinity, 71, 1).unwrap();
        assert_eq!((c.memory.span, c.memory.infinity.basis), (35, 36), "basis rounded down to the widths");
        let err = configure(&base, Mechanism::Infinity, 34, 1).unwrap_err().to_string();
        assert!(err.contains("infinity-34-s1") && err.contains("memory.infinity.basis"), "{err}");
    }

    #[test]
    fn the_plot_has_a_point_per_run_and_a_legend_per_mechanism() {
        let point = |m: &str, size, q, mem| SweepPoint {
            mechanism: m.into(),
            size,
            seed: 1,
            run: format!("{m}-{size}"),
            metric: "answers %".into(),
            quality: q,
            loss: 0.1,
            accuracy: 0.9,
            mem_size: mem,
            seconds: 1.0,
            config: String::new(),
        };
        let points =
            vec![point("fixed", 8, 20.0, 5.0), point("fixed", 64, 50.0, 57.0), point("expire", 64, 90.0, 11.0)];
        let dir = tempfile::tempdir().unwrap();
        let svg = plot(&points, true, &dir.path().join("sweep.png")).unwrap();
        assert_eq!(svg.matches("<circle").count(), 3 + 2, "a dot per run and one per legend entry");
        assert!(svg.contains("(log scale)"), "5 to 57 spans more than 8x");
        assert!(
            svg.contains("answers % (higher is better)") && svg.contains(">\nexpire\n<") && svg.contains(">\nfixed\n<")
        );
        assert_eq!(&std::fs::read(dir.path().join("sweep.png")).unwrap()[..4], b"\x89PNG");
        let t = table(&points);
        assert_eq!(t.lines().count(), 4);
        assert!(t.lines().nth(3).unwrap().contains("expire"));
    }

    #[test]
    fn seeds_are_summarised_by_mean_and_sample_standard_deviation() {
        let point = |m: &str, size, seed, q, mem| SweepPoint {
            mechanism: m.into(),
            size,
            seed,
            run: format!("{m}-{size}-s{seed}"),
            metric: "success %".into(),
            quality: q,
            loss: 0.0,
            accuracy: 0.0,
            mem_size: mem,
            seconds: 1.0,
            config: String::new(),
        };
        let points = vec![
            point("fixed", 16, 1, 99.0, 8.0),
            point("expire", 64, 1, 100.0, 6.0),
            point("fixed", 16, 2, 100.0, 9.0),
            point("fixed", 16, 3, 98.0, 10.0),
        ];
        let s = summarise(&points);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].mechanism.as_str(), s[0].size, s[0].seeds), ("fixed", 16, 3));
        // Qualities 99, 100, 98: mean 99, squared deviations 0 + 1 + 1 over n - 1 = 2: sd 1.
        assert!((s[0].quality.0 - 99.0).abs() < 1e-12 && (s[0].quality.1 - 1.0).abs() < 1e-12, "{:?}", s[0]);
        assert!((s[0].mem_size.0 - 9.0).abs() < 1e-12 && (s[0].mem_size.1 - 1.0).abs() < 1e-12, "{:?}", s[0]);
        assert_eq!((s[1].seeds, s[1].quality, s[1].mem_size), (1, (100.0, 0.0), (6.0, 0.0)), "one seed has no spread");
        let t = summary_table(&s, "success %");
        assert!(t.lines().nth(1).unwrap().contains("99.00 ± 1.00"), "{t}");
        let csv = summary_csv(&s).unwrap();
        assert_eq!(
            csv.lines().next().unwrap(),
            "mechanism,size,seeds,quality_mean,quality_sd,mem_size_mean,mem_size_sd"
        );
        assert_eq!(csv.lines().nth(2).unwrap(), "expire,64,1,100.0,0.0,6.0,0.0");
    }

    #[test]
    fn reports_quote_csv_fields_and_escape_names_and_paths_in_html() {
        let mut base = Config::preset("copy-sweep-tiny").unwrap();
        base.name = "a<b>&\"c\",d".into();
        let p = SweepPoint {
            mechanism: "fixed".into(),
            size: 8,
            seed: 1,
            run: "run,with \"quotes\"".into(),
            metric: "answers %".into(),
            quality: 50.0,
            loss: 0.5,
            accuracy: 0.5,
            mem_size: 8.0,
            seconds: 1.0,
            config: String::new(),
        };
        let csv = csv(std::slice::from_ref(&p)).unwrap();
        assert_eq!(csv.lines().nth(1).unwrap(), "fixed,8,1,\"run,with \"\"quotes\"\"\",answers %,50.0,8.0,0.5,0.5,1.0");
        let html = report_html(&base, &[p], "");
        assert!(html.contains("lethe sweep: a&lt;b&gt;&amp;&quot;c&quot;,d</title>"), "{html}");
        assert!(!html.contains("a<b>"), "{html}");
    }
}
