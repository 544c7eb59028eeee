//! `lethe longeval`: passkey and RULER's needle tasks by length and depth.

use std::time::Instant;

use anyhow::{bail, Context, Result};

use lethe::data::longctx::{ByteUnits, Haystack, Units};
use lethe::longeval::{Cell, Grid};
use lethe::metrics::format_duration;
use lethe::model::Lm;
use lethe::plot::Heatmap;

use super::train::load_checkpoint;
use crate::cli::LongevalArgs;

/// Evaluates the grid the flags give, resuming from `--out`'s table, and prints the
/// accuracy of each task by length.
pub(crate) fn longeval(a: LongevalArgs) -> Result<()> {
    let device = lethe::device::parse(&a.device)?;
    if a.samples == 0 {
        bail!("--samples must be at least 1");
    }
    let text = a.haystack.as_deref().map(Haystack::from_file).transpose()?;
    let ckpt = load_checkpoint(&a.checkpoint, None)?;
    lethe::device::apply_threads(ckpt.config.train.threads.min(lethe::device::cores()))?;
    let tokenizer = lethe::data::text::tokenizer_of_checkpoint(&ckpt)?;
    let vocab = ckpt.config.model.vocab;
    if tokenizer.is_none() && vocab < 256 {
        bail!(
            "{}: this model reads a task's {vocab} symbols, not text; longeval needs a model of bytes or of a tokenizer's tokens",
            a.checkpoint.display()
        );
    }
    let lm = Lm::from_checkpoint(&ckpt, device)?;
    let units: &dyn Units = match &tokenizer {
        Some(t) => t,
        None => &ByteUnits,
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("--out `{}`", a.out.display()))?;
    let grid =
        Grid { tasks: a.suite.0, lengths: a.lengths.0, depths: a.depths.0, samples: a.samples, seed: a.seed, text };
    let unit = if tokenizer.is_some() { "tokens" } else { "bytes" };
    let started = Instant::now();
    let table = lethe::longeval::run(&lm, units, &grid, &a.out, |cell, done, total| {
        let elapsed = started.elapsed();
        let eta = elapsed.mul_f64((total - done) as f64 / done as f64);
        eprintln!(
            "longeval: {} at {} {unit}, depth {:.0}%: accuracy {:.2}, memory {:.0} per layer ({done}/{total} cells, {} elapsed, about {} to go)",
            cell.task,
            cell.length,
            cell.depth,
            cell.accuracy,
            cell.memory,
            format_duration(elapsed),
            format_duration(eta)
        );
    })?;
    print_summary(&table, &grid, unit);
    println!("wrote {} and {}", a.out.join("longeval.csv").display(), a.out.join("longeval.json").display());
    for task in &grid.tasks {
        let map = heatmap(&table, &grid, task, unit);
        let svg_path = a.out.join(format!("heatmap-{task}.svg"));
        let png = lethe::plot::write_svg_and_png(&svg_path, &lethe::plot::heatmap(&map)?)?;
        println!("wrote {} and {}", svg_path.display(), png.display());
    }
    Ok(())
}

/// `task`'s accuracy by depth (rows) and length (columns).
fn heatmap(table: &[Cell], grid: &Grid, task: &str, unit: &str) -> Heatmap {
    let find = |length: usize, depth: f64| {
        table.iter().find(|c| c.task == task && c.length == length && (c.depth - 100.0 * depth).abs() < 1e-9)
    };
    Heatmap {
        title: format!("{task}: accuracy (%) by length and depth"),
        lengths: (grid.lengths.clone(), unit.to_string()),
        depths: grid.depths.iter().map(|d| 100.0 * d).collect(),
        accuracy: grid
            .depths
            .iter()
            .map(|&d| grid.lengths.iter().map(|&l| find(l, d).map(|c| c.accuracy)).collect())
            .collect(),
    }
}

/// Each task's accuracy by length, averaged over depths, with the memory held.
fn print_summary(table: &[Cell], grid: &Grid, unit: &str) {
    println!("{:<16} {:>10} {:>9} {:>12}", "task", unit, "accuracy", "memory/layer");
    for &task in &grid.tasks {
        for &length in &grid.lengths {
            let cells: Vec<&Cell> = table.iter().filter(|c| c.task == task && c.length == length).collect();
            let n = cells.len().max(1) as f64;
            let accuracy = cells.iter().map(|c| c.accuracy).sum::<f64>() / n;
            let memory = cells.iter().map(|c| c.memory).sum::<f64>() / n;
            println!("{task:<16} {length:>10} {accuracy:>9.3} {memory:>12.1}");
        }
    }
}
