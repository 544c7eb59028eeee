//! `lethe plot`: the curves of several runs on one figure.

use anyhow::{Context, Result};

use super::decoder::{each_once_by, the_file};
use crate::cli::PlotArgs;

/// Draws the curves of the runs into `<out>.png` and `<out>.svg`.
pub(crate) fn plot(a: PlotArgs) -> Result<()> {
    // A run given twice, however its path is spelled, would be drawn as two curves.
    each_once_by("lethe plot", &a.runs, |run| the_file(run), |run| run.display().to_string())?;
    let metrics: Vec<std::path::PathBuf> = a.runs.iter().map(|r| r.join("metrics.jsonl")).collect();
    let inputs: Vec<&std::path::Path> = metrics.iter().map(|m| m.as_path()).collect();
    for extension in ["png", "svg"] {
        lethe::output::check("--out", &a.out.with_extension(extension), &inputs)?;
    }
    let runs =
        a.runs.iter().map(|r| lethe::plot::read_curves(r, &a.metric)).collect::<lethe::error::Result<Vec<_>>>()?;
    if let Some(parent) = a.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating `{}`", parent.display()))?;
    }
    let [png, svg] = lethe::plot::plot(&runs, &a.metric, &a.out)?;
    println!("wrote {} and {}", png.display(), svg.display());
    Ok(())
}
