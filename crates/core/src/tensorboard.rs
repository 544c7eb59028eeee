//! TensorBoard event files (`events.out.tfevents.<time>.<host>` in the run folder), so
//! that `tensorboard --logdir runs` shows every run's curves. Each metrics record
//! becomes one event of scalars named `<split>/<field>` (a per-layer list gives
//! `<split>/<field>/<layer>`), at the record's step.
//!
//! The file is TensorFlow's record format: per record the length (u64, little end), its
//! masked CRC-32C, the bytes, their masked CRC-32C; each record one `Event` protocol
//! buffer (tensorflow/core/util/event.proto). The messages are encoded by `prost` and the
//! checksums by `crc32c`. lethe declares the few message fields it writes rather than
//! depend on `tensorboard-rs`, which is no longer maintained, pulls in an old image
//! stack, and panics when a write fails.

use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;

use crate::error::{LetheError, Result};

/// `tensorflow.Event`: the fields lethe writes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// The file's first event names the format (`brain.Event:2`).
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// The values of this step.
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// Named values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<Value>,
}

/// `tensorflow.Summary.Value` with a scalar (`simple_value`) or a histogram (`histo`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    /// The curve's name.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// The scalar.
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    /// The histogram.
    #[prost(message, optional, tag = "5")]
    pub histo: Option<Histogram>,
}

/// `tensorflow.HistogramProto`: bucket `i` counts the values up to `bucket_limit[i]`
/// (and above the previous limit).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    /// Smallest value.
    #[prost(double, tag = "1")]
    pub min: f64,
    /// Largest value.
    #[prost(double, tag = "2")]
    pub max: f64,
    /// Total count.
    #[prost(double, tag = "3")]
    pub num: f64,
    /// Sum of the values.
    #[prost(double, tag = "4")]
    pub sum: f64,
    /// Sum of their squares.
    #[prost(double, tag = "5")]
    pub sum_squares: f64,
    /// Upper edge of each bucket.
    #[prost(double, repeated, tag = "6")]
    pub bucket_limit: Vec<f64>,
    /// Count of each bucket.
    #[prost(double, repeated, tag = "7")]
    pub bucket: Vec<f64>,
}

impl Histogram {
    /// `values` in `buckets` equal buckets between their least and greatest.
    pub fn of(values: &[f64], buckets: usize) -> Histogram {
        let (min, max) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
        let (min, max) = if values.is_empty() { (0.0, 0.0) } else { (min, max) };
        let n = buckets.max(1);
        let width = (max - min) / n as f64;
        let bucket_limit: Vec<f64> = (1..=n).map(|i| if i == n { max } else { min + width * i as f64 }).collect();
        let mut bucket = vec![0.0; n];
        for &v in values {
            // Bucket i holds (limit[i - 1], limit[i]]; the least value the first.
            let i = if width > 0.0 { (((v - min) / width).ceil() as usize).clamp(1, n) - 1 } else { n - 1 };
            bucket[i] += 1.0;
        }
        let sum = values.iter().sum();
        let sum_squares = values.iter().map(|v| v * v).sum();
        Histogram { min, max, num: values.len() as f64, sum, sum_squares, bucket_limit, bucket }
    }

    /// A distribution over the equal bins of `[0, 1]` given by their masses (the
    /// ∞-former's attention over its memory's axis).
    pub fn over_unit_interval(mass: &[f64]) -> Histogram {
        let n = mass.len().max(1) as f64;
        let centres: Vec<f64> = (0..mass.len()).map(|i| (i as f64 + 0.5) / n).collect();
        Histogram {
            min: 0.0,
            max: 1.0,
            num: mass.iter().sum(),
            sum: mass.iter().zip(&centres).map(|(m, c)| m * c).sum(),
            sum_squares: mass.iter().zip(&centres).map(|(m, c)| m * c * c).sum(),
            bucket_limit: (1..=mass.len()).map(|i| i as f64 / n).collect(),
            bucket: mass.to_vec(),
        }
    }
}

/// TensorFlow's checksum of a record part: CRC-32C, rotated and offset.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One record: length, its checksum, the bytes, their checksum.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The events of a record file, checksums verified (for tests and tools).
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let bytes = crate::input::read(path).map_err(|e| LetheError::data(path, e))?;
    let corrupt = |why: &str| LetheError::Data {
        path: path.to_path_buf(),
        reason: format!("not a TensorBoard event file: {why}"),
    };
    let (mut at, mut events) = (0, vec![]);
    while at < bytes.len() {
        let head = bytes.get(at..at + 12).ok_or_else(|| corrupt("a truncated record header"))?;
        let len = u64::from_le_bytes(head[..8].try_into().map_err(|_| corrupt("a bad length"))?) as usize;
        if u32::from_le_bytes(head[8..12].try_into().map_err(|_| corrupt("a bad length"))?) != masked_crc(&head[..8]) {
            return Err(corrupt("a length checksum does not match"));
        }
        let data = bytes.get(at + 12..at + 12 + len).ok_or_else(|| corrupt("a truncated record"))?;
        let crc = bytes.get(at + 12 + len..at + 16 + len).ok_or_else(|| corrupt("a truncated record"))?;
        if u32::from_le_bytes(crc.try_into().map_err(|_| corrupt("a bad checksum"))?) != masked_crc(data) {
            return Err(corrupt("a data checksum does not match"));
        }
        events.push(Event::decode(data).map_err(|e| corrupt(&e.to_string()))?);
        at += 16 + len;
    }
    Ok(events)
}

/// Appends events to one event file of a run folder.
pub struct EventWriter {
    path: PathBuf,
    file: std::fs::File,
}

impl EventWriter {
    /// A new event file in `dir`, opened with the format's version event.
    pub fn create(dir: &Path) -> Result<EventWriter> {
        let now = wall_time();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let path = dir.join(format!("events.out.tfevents.{}.{host}", now as u64));
        let file =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| LetheError::io(&path, e))?;
        let mut w = EventWriter { path, file };
        w.append(&Event { wall_time: now, step: 0, file_version: Some("brain.Event:2".into()), summary: None })?;
        Ok(w)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn append(&mut self, event: &Event) -> Result<()> {
        self.file.write_all(&record(&event.encode_to_vec())).map_err(|e| LetheError::io(&self.path, e))
    }

    /// Writes the numbers of a metrics `record` (an object with `step` and `split`) as
    /// scalars; a record without them, or without a number, writes nothing.
    pub fn write_metrics(&mut self, record: &serde_json::Value) -> Result<()> {
        let (Some(step), Some(split)) = (
            record.get("step").and_then(serde_json::Value::as_i64),
            record.get("split").and_then(serde_json::Value::as_str),
        ) else {
            return Ok(());
        };
        self.write_values(step, scalars(split, record))
    }

    /// Writes histograms `(tag, histogram)` at `step`.
    pub fn write_histograms(&mut self, step: i64, histograms: Vec<(String, Histogram)>) -> Result<()> {
        self.write_values(
            step,
            histograms.into_iter().map(|(tag, h)| Value { tag, simple_value: None, histo: Some(h) }).collect(),
        )
    }

    /// One event of `value` at `step`; nothing when there is no value.
    fn write_values(&mut self, step: i64, value: Vec<Value>) -> Result<()> {
        if value.is_empty() {
            return Ok(());
        }
        self.append(&Event { wall_time: wall_time(), step, file_version: None, summary: Some(Summary { value }) })
    }
}

/// The numbers of `record` as tagged scalars: `<split>/<field>`, for a list
/// `<split>/<field>/<index>`, for an object in a list (a layer's memory report)
/// `<split>/<field>/<index>/<key>`. `null` (no scored token) writes no point.
fn scalars(split: &str, record: &serde_json::Value) -> Vec<Value> {
    let mut out = vec![];
    for (field, v) in record.as_object().into_iter().flatten() {
        if field != "step" && field != "split" {
            numbers(&format!("{split}/{field}"), v, 2, &mut out);
        }
    }
    out
}

/// The numbers in `v` under `tag`, lists and objects `depth` levels down.
fn numbers(tag: &str, v: &serde_json::Value, depth: usize, out: &mut Vec<Value>) {
    match v {
        serde_json::Value::Number(n) => {
            out.extend(n.as_f64().map(|x| Value { tag: tag.to_string(), simple_value: Some(x as f32), histo: None }))
        }
        serde_json::Value::Array(items) if depth > 0 => {
            items.iter().enumerate().for_each(|(i, item)| numbers(&format!("{tag}/{i}"), item, depth - 1, out))
        }
        serde_json::Value::Object(map) if depth > 0 => {
            map.iter().for_each(|(k, item)| numbers(&format!("{tag}/{k}"), item, depth - 1, out))
        }
        _ => {}
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720), and the mask is
    /// TensorFlow's (tensorflow/core/lib/hash/crc32c.h): rotate right by 15, add
    /// 0xa282ead8.
    #[test]
    fn the_checksum_is_tensorflows_masked_crc32c() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        // By hand: 0xE3069283 rotated right by 15 is 0x2507C60D; plus 0xa282ead8.
        assert_eq!(masked_crc(b"123456789"), 0xC78A_B0E5);
    }

    #[test]
    fn metrics_records_become_scalars_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.write_metrics(&serde_json::json!({"step": 3, "split": "train", "loss": 1.5, "mem_size": [4.0, 8.0], "memory": [{"mean_span": 2.0}], "note": "x"})).unwrap();
        w.write_metrics(&serde_json::json!({"step": 4, "split": "valid", "loss": null})).unwrap();
        w.write_metrics(&serde_json::json!({"kind": "no step"})).unwrap();
        let events = read_events(w.path()).unwrap();
        assert_eq!(events.len(), 2, "the version event and one of scalars");
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(events[1].step, 3);
        let values = &events[1].summary.as_ref().unwrap().value;
        let tags: Vec<(&str, f32)> = values.iter().map(|v| (v.tag.as_str(), v.simple_value.unwrap())).collect();
        assert_eq!(
            tags,
            vec![
                ("train/loss", 1.5),
                ("train/mem_size/0", 4.0),
                ("train/mem_size/1", 8.0),
                ("train/memory/0/mean_span", 2.0)
            ]
        );
        // A damaged byte is caught by the checksum.
        let mut bytes = std::fs::read(w.path()).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        std::fs::write(w.path(), bytes).unwrap();
        assert!(read_events(w.path()).unwrap_err().to_string().contains("checksum"));
    }

    #[test]
    fn histograms_count_by_hand() {
        let h = Histogram::of(&[0.0, 1.0, 1.5, 4.0], 4);
        assert_eq!((h.min, h.max, h.num, h.sum, h.sum_squares), (0.0, 4.0, 4.0, 6.5, 19.25));
        assert_eq!(h.bucket_limit, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(h.bucket, vec![2.0, 1.0, 0.0, 1.0], "(0, 1] holds 0 and 1; (1, 2] 1.5; (3, 4] 4");
        let u = Histogram::over_unit_interval(&[0.25, 0.75]);
        assert_eq!((u.bucket_limit.clone(), u.num, u.sum), (vec![0.5, 1.0], 1.0, 0.25 * 0.25 + 0.75 * 0.75));
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.write_histograms(7, vec![("train/spans/0".into(), h.clone())]).unwrap();
        let events = read_events(w.path()).unwrap();
        assert_eq!(events[1].summary.as_ref().unwrap().value[0].histo.as_ref(), Some(&h));
    }
}
