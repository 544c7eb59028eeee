//! The bench's report: the table on the terminal, and `bench.json` and `bench.csv`.

use super::*;

/// The results as a terminal table, one row per config.
/// On a GPU the memory column is the allocator's peak ([`BenchResult::peak_gpu_mib`]).
pub fn table(results: &[BenchResult]) -> String {
    let mut s = String::new();
    let gpu = results.iter().any(|r| r.peak_gpu_mib.is_some());
    let peak = |r: &BenchResult| if gpu { r.peak_gpu_mib } else { r.peak_rss_mib };
    let _ = writeln!(
        s,
        "{:<12} {:<4} {:>10} {:>9} {:>10} {:>16} {:>9} {:>9} {:>8} {:>6} {:>12} {:>9}",
        "mechanism",
        "prec",
        "knob",
        "span",
        "context",
        "ms/step (p10-90)",
        "tok/s",
        if gpu { "GPU MiB" } else { "peak MiB" },
        "GFLOP/s",
        "MFU",
        "mem/layer",
        "vs first"
    );
    for r in results {
        let knob = match (&r.knob, r.value) {
            (Some(k), Some(v)) => format!("{k}={v}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:<12} {:<4} {:>10} {:>9} {:>10} {:>16} {:>9.0} {:>9} {:>8.1} {:>6} {:>12.1} {:>9}",
            r.mechanism,
            r.precision,
            knob,
            r.span,
            r.context_tokens,
            format!("{:.1} ({:.1}-{:.1})", 1e3 * r.median_s, 1e3 * r.p10_s, 1e3 * r.p90_s),
            r.tokens_per_s,
            peak(r).map(|m| format!("{m:.0}")).unwrap_or_else(|| "n/a".into()),
            r.gflops,
            r.mfu.map(|m| format!("{:.1}%", 100.0 * m)).unwrap_or_else(|| "n/a".into()),
            r.mean_mem_size(),
            r.relative.map(|x| format!("{x:.3}x")).unwrap_or_else(|| "-".into())
        );
    }
    s
}

/// One row of `bench.csv`: a result with its per-layer figures averaged.
#[derive(Serialize)]
pub(crate) struct CsvRow<'a> {
    name: &'a str,
    mechanism: &'a str,
    precision: &'a str,
    knob: Option<&'a str>,
    value: Option<usize>,
    span: usize,
    parameters: usize,
    tokens_per_step: usize,
    steps: usize,
    median_s: f64,
    p10_s: f64,
    p90_s: f64,
    rounds: usize,
    relative: Option<f64>,
    last_loss: f64,
    tokens_per_s: f64,
    peak_rss_mib: Option<f64>,
    peak_gpu_mib: Option<f64>,
    mean_mem_size: f64,
    flops_per_step: f64,
    gflops: f64,
    mfu: Option<f64>,
    threads: i32,
    ranks: usize,
    comm_s: f64,
    context_tokens: usize,
}

/// The results as CSV, one row per config (an empty cell where a figure is unknown).
pub fn csv(results: &[BenchResult]) -> Result<String> {
    crate::metrics::csv_text(results.iter().map(|r| CsvRow {
        name: &r.name,
        mechanism: &r.mechanism,
        precision: &r.precision,
        knob: r.knob.as_deref(),
        value: r.value,
        span: r.span,
        parameters: r.parameters,
        tokens_per_step: r.tokens_per_step,
        steps: r.steps,
        median_s: r.median_s,
        p10_s: r.p10_s,
        p90_s: r.p90_s,
        rounds: r.round_medians_s.len(),
        relative: r.relative,
        last_loss: r.last_loss,
        tokens_per_s: r.tokens_per_s,
        peak_rss_mib: r.peak_rss_mib,
        peak_gpu_mib: r.peak_gpu_mib,
        mean_mem_size: r.mean_mem_size(),
        flops_per_step: r.flops_per_step,
        gflops: r.gflops,
        mfu: r.mfu,
        threads: r.threads,
        ranks: r.ranks,
        comm_s: r.comm_s,
        context_tokens: r.context_tokens,
    }))
}

/// What `bench.json` holds: the machine's GEMM rate and every result.
#[derive(Serialize)]
pub(crate) struct Report<'a> {
    lethe: &'static str,
    /// Seconds since the Unix epoch when the report was written.
    written_at: u64,
    gemm_gflops: f64,
    threads: i32,
    results: &'a [BenchResult],
}

/// Writes `bench.json` and `bench.csv` into `dir` (atomically). Returns their paths.
pub fn write_report(dir: &Path, results: &[BenchResult], gemm_gflops: f64) -> Result<Vec<PathBuf>> {
    crate::output::MadeFolder::make(dir)?.unless_failed(write_files(dir, results, gemm_gflops))
}

/// Writes `bench.json` and `bench.csv` into the folder `dir`.
fn write_files(dir: &Path, results: &[BenchResult], gemm_gflops: f64) -> Result<Vec<PathBuf>> {
    let written_at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let report =
        Report { lethe: env!("CARGO_PKG_VERSION"), written_at, gemm_gflops, threads: tch::get_num_threads(), results };
    let json = serde_json::to_string_pretty(&report)?;
    let (j, c) = (dir.join("bench.json"), dir.join("bench.csv"));
    write_atomic(&j, json.as_bytes())?;
    write_atomic(&c, csv(results)?.as_bytes())?;
    Ok(vec![j, c])
}
