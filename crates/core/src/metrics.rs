//! Run folders, the metrics log (`metrics.jsonl`, one JSON object per line), tables as
//! CSV and the progress line on the terminal.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{LetheError, Result};

/// Appends JSON objects to `metrics.jsonl`, one per line, each line in one write (so
/// that a kill leaves whole lines), and their numbers to a TensorBoard event file
/// beside it ([`crate::tensorboard`]; one file per launch of the run).
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
    events: crate::tensorboard::EventWriter,
}

impl MetricsLog {
    /// Opens (creating if needed) `<dir>/metrics.jsonl` for appending, and a new
    /// TensorBoard event file in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("metrics.jsonl");
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(|e| LetheError::io(&path, e))?;
        Ok(MetricsLog { path, file, events: crate::tensorboard::EventWriter::create(dir)? })
    }

    /// Opens `<dir>/metrics.jsonl` for a run that goes on from step `from` (0: a new
    /// run): the records of later steps, which a resumed run writes again, and a torn
    /// last line are removed first (the file is rewritten atomically).
    pub fn open_from(dir: &Path, from: usize) -> Result<Self> {
        let path = dir.join("metrics.jsonl");
        if path.exists() {
            let text = crate::input::read(&path).map_err(|e| LetheError::data(&path, e))?;
            let kept = records_through(&text, from);
            if kept.len() != text.len() {
                crate::checkpoint::write_atomic(&path, &kept)?;
            }
        }
        Self::open(dir)
    }

    /// Writes TensorBoard histograms `(tag, histogram)` at `step`.
    pub fn histograms(&mut self, step: usize, histograms: Vec<(String, crate::tensorboard::Histogram)>) -> Result<()> {
        self.events.write_histograms(step as i64, histograms)
    }

    /// Appends one record.
    pub fn write(&mut self, record: &serde_json::Value) -> Result<()> {
        let line = format!("{record}\n");
        self.file.write_all(line.as_bytes()).map_err(|e| LetheError::io(&self.path, e))?;
        self.events.write_metrics(record)
    }
}

/// The complete lines of a metrics log whose `step` is at most `step`, in order.
fn records_through(text: &[u8], step: usize) -> Vec<u8> {
    let mut kept = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|&b| b == b'\n').filter(|l| l.ends_with(b"\n")) {
        let record: Option<serde_json::Value> = serde_json::from_slice(line).ok();
        let line_step = record.as_ref().and_then(|r| r.get("step")).and_then(serde_json::Value::as_u64);
        if line_step.is_some_and(|s| s <= step as u64) {
            kept.extend_from_slice(line);
        }
    }
    kept
}

/// Text with the HTML markup characters (`&`, `<`, `>`, `"`, `'`) escaped, for names
/// and paths written into reports.
pub fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// `rows` as CSV text (the `csv` crate), with a header row of their field names.
pub fn csv_text<T: serde::Serialize>(rows: impl IntoIterator<Item = T>) -> Result<String> {
    let mut w = csv::Writer::from_writer(vec![]);
    for row in rows {
        w.serialize(row)?;
    }
    records_text(w)
}

/// The text of a CSV writer whose records are written.
pub fn records_text(w: csv::Writer<Vec<u8>>) -> Result<String> {
    let bytes = w.into_inner().map_err(|e| csv::Error::from(e.into_error()))?;
    String::from_utf8(bytes).map_err(|e| LetheError::Invalid(format!("csv: {e}")))
}

/// The mean of `values` (0 for none).
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// `1h02m`, `3m05s` or `12s`.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `950`, `12.3k`, `4.56M`.
pub fn format_count(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A perplexity with `decimals` places (`303.83`), or in scientific notation past a
/// million (`1.355e190`, the perplexity per word of a text with few words), so that no
/// line holds two hundred digits; infinite or NaN as Rust writes them.
pub fn format_perplexity(p: f64, decimals: usize) -> String {
    if p.is_finite() && p.abs() >= 1e6 {
        format!("{p:.3e}")
    } else {
        format!("{p:.decimals$}")
    }
}

/// Peak resident memory of this process in bytes (`VmHWM`), where the OS reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Starts a new peak for [`peak_rss_bytes`], so that configs benched one after another
/// in one process each report their own peak: memory the allocator still holds is
/// returned to the system first, then Linux resets the peak to the current resident
/// size (`/proc/self/clear_refs`). Does nothing where that is not available.
pub fn reset_peak_rss() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the system.
    unsafe {
        libc::malloc_trim(0);
    }
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_counts_read_naturally() {
        assert_eq!(format_duration(Duration::from_secs(12)), "12s");
        assert_eq!(format_duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(format_duration(Duration::from_secs(3720)), "1h02m");
        assert_eq!(format_count(950.0), "950");
        assert_eq!(format_count(12_345.0), "12.3k");
        assert_eq!(format_perplexity(303.834, 2), "303.83");
        assert_eq!(format_perplexity(999_999.0, 3), "999999.000");
        assert_eq!(format_perplexity(1.3548e190, 2), "1.355e190");
        assert_eq!(format_perplexity(f64::INFINITY, 2), "inf");
    }

    #[test]
    fn metrics_are_appended_as_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = MetricsLog::open(dir.path()).unwrap();
        log.write(&serde_json::json!({"step": 1})).unwrap();
        let mut log = MetricsLog::open(dir.path()).unwrap();
        log.write(&serde_json::json!({"step": 2})).unwrap();
        let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(text, "{\"step\":1}\n{\"step\":2}\n");
    }

    /// Regression: a kill could leave a torn last line, and the records
    /// written after the checkpoint appeared twice after a resume.
    #[test]
    fn a_resumed_log_keeps_whole_records_up_to_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "{\"step\":2}\n{\"step\":4,\"split\":\"valid\"}\n{\"step\":6}\n{\"step\":8,\"lo")
            .unwrap();
        let mut log = MetricsLog::open_from(dir.path(), 4).unwrap();
        log.write(&serde_json::json!({"step": 6})).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"step\":2}\n{\"step\":4,\"split\":\"valid\"}\n{\"step\":6}\n");
        MetricsLog::open_from(dir.path(), 0).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "a new run starts an empty log");
    }
}
