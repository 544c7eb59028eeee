//! The library's error type. Every variant names the file, field or value at fault, so
//! that `main` can print one readable line and exit non-zero.

use std::path::PathBuf;

/// Everything that can go wrong in lethe, as one message a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum LetheError {
    /// A config field holds an impossible value.
    #[error("config: `{field}` = {value}: {reason}")]
    Config { field: String, value: String, reason: String },

    /// A config file or override could not be parsed.
    #[error("config: {0}")]
    ConfigParse(String),

    /// A named preset does not exist.
    #[error("unknown preset `{name}`; known presets: {known}")]
    UnknownPreset { name: String, known: String },

    /// A corpus is missing, unreadable, empty or too short.
    #[error("data `{path}`: {reason}")]
    Data { path: PathBuf, reason: String },

    /// A checkpoint is missing, corrupt, truncated or from a different model.
    #[error("checkpoint `{path}`: {reason}")]
    Checkpoint { path: PathBuf, reason: String },

    /// The training loss became NaN or infinite. `kept` says what is left to go on from.
    #[error("loss became {value} at step {step}; training stopped. {kept}")]
    NonFiniteLoss { step: usize, value: f64, kept: String },

    /// Logging or evaluating failed during training (a full disk under the metrics, a
    /// validation file gone). `kept` says what the run folder holds to go on from.
    #[error("training stopped after step {step}: {error}; {kept}")]
    StepFailed { step: usize, error: String, kept: String },

    /// A checkpoint could not be written (a full disk, a folder gone). `kept` says what
    /// the run folder still holds to go on from.
    #[error("the checkpoint of step {step} was not written: {error}. {kept}")]
    CheckpointNotWritten { step: usize, error: String, kept: String },

    /// Training was stopped by a signal (SIGINT, SIGTERM or SIGHUP) after a checkpoint.
    #[error("interrupted by {signal} after step {step}; the checkpoint is saved in `{dir}`: continue with --resume")]
    Interrupted { signal: String, step: usize, dir: PathBuf },

    /// `lethe bench` was stopped by a signal between configs; `kept` says where the
    /// results of the configs done are.
    #[error("interrupted by {signal} after {done} of {total} configs; the rest were skipped. {kept}")]
    BenchInterrupted { signal: String, done: usize, total: usize, kept: String },

    /// `lethe bench --rounds` was stopped by a signal after a round: every config's
    /// figures are over the rounds done.
    #[error("interrupted by {signal} after {done} of {total} rounds; every config's figures are over the rounds done. {kept}")]
    BenchRoundsInterrupted { signal: String, done: usize, total: usize, kept: String },

    /// A file could not be read or written. The message holds the reason, so `error`
    /// is not also given as the error's `source()` (which would print it twice in a
    /// chain, as `main`'s `{:#}` does).
    #[error("`{path}`: {error}")]
    Io { path: PathBuf, error: std::io::Error },

    /// An error from libtorch, with what lethe was doing at the time (the reason in the
    /// message, as for `Io`).
    #[error("{context}: {error}")]
    Torch { context: String, error: tch::TchError },

    /// A long loop (a bench's warm-up or timed steps) stopped at a step because a signal
    /// asked it to; the command that runs the loop says what was kept.
    #[error("stopped by {signal}")]
    Stopped { signal: String },

    /// A value could not be turned into JSON or back (a report, a metrics record, a
    /// checkpoint's training state). The reason is in the message, not also the error's
    /// `source()` (which `main`'s `{:#}` would print a second time).
    #[error("JSON: {0}")]
    Json(serde_json::Error),

    /// A collective of the distributed process group failed: a peer is gone, the
    /// rendezvous or a collective timed out, or the launch environment is inconsistent.
    #[error("distributed (rank {rank}): {reason}")]
    Distributed { rank: usize, reason: String },

    /// A table could not be written as CSV (the reason in the message, as for `Json`).
    #[error("csv: {0}")]
    Csv(csv::Error),

    /// A request that makes no sense for this model or input (e.g. an empty prompt).
    #[error("{0}")]
    Invalid(String),
}

impl From<serde_json::Error> for LetheError {
    fn from(e: serde_json::Error) -> Self {
        LetheError::Json(e)
    }
}

impl From<csv::Error> for LetheError {
    fn from(e: csv::Error) -> Self {
        LetheError::Csv(e)
    }
}

/// Result with [`LetheError`].
pub type Result<T, E = LetheError> = std::result::Result<T, E>;

impl LetheError {
    /// Shorthand for [`LetheError::Config`].
    pub fn config(field: &str, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        LetheError::Config { field: field.to_string(), value: value.to_string(), reason: reason.into() }
    }

    /// Shorthand for [`LetheError::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LetheError::Io { path: path.into(), error: source }
    }

    /// Shorthand for [`LetheError::Checkpoint`].
    pub fn checkpoint(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        LetheError::Checkpoint { path: path.into(), reason: reason.into() }
    }

    /// Shorthand for [`LetheError::Data`].
    pub fn data(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        LetheError::Data { path: path.into(), reason: reason.into() }
    }
}

/// A failed call into lethe's C++ names its piece and says why, as [`LetheError::Invalid`].
impl From<lethe_kernels::KernelError> for LetheError {
    fn from(e: lethe_kernels::KernelError) -> Self {
        LetheError::Invalid(e.0)
    }
}

/// Adds context to a fallible libtorch call.
pub trait TorchContext<T> {
    /// Wraps a [`tch::TchError`] with what lethe was doing.
    fn torch(self, context: &str) -> Result<T>;
}

impl<T> TorchContext<T> for std::result::Result<T, tch::TchError> {
    fn torch(self, context: &str) -> Result<T> {
        self.map_err(|error| LetheError::Torch { context: context.to_string(), error })
    }
}

/// The one-line account of a libtorch error that a tensor operation panicked with (tch's
/// infallible operations unwrap libtorch's errors, so a GPU that runs out of memory, or a
/// kernel that fails, stops the program there): the error's first line, without the C++
/// stack that follows it, and what to change when the GPU ran out of memory. `None` for
/// any other panic, which is a bug and keeps its own message.
pub fn libtorch_failure(panic: &str) -> Option<String> {
    let start = panic.find("Torch(\"")? + "Torch(\"".len();
    let text = &panic[start..];
    // The message is the error's Debug form: its line breaks are written `\n`.
    let first = text.split("\\n").next().unwrap_or(text).trim_end_matches("\")").trim();
    if let Some(bytes) = cpu_allocation(first) {
        let have = crate::input::total_memory_bytes()
            .map_or(String::new(), |b| format!(" (this machine has {:.1} GiB)", b as f64 / GIB));
        Some(format!(
            "libtorch could not allocate {:.1} GiB of the CPU's memory{have}: a shorter block or fewer streams need less",
            bytes as f64 / GIB
        ))
    } else if first.contains("out of memory") {
        Some(format!(
            "libtorch: {first}\nthe GPU ran out of memory: fewer streams a micro-batch need less (train.batch, or more micro-batches with train.accum), as does a shorter memory.span"
        ))
    } else {
        Some(format!("libtorch: {first}"))
    }
}

/// The bytes a failed CPU allocation asked for, from libtorch's message
/// (`DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes`).
fn cpu_allocation(message: &str) -> Option<u64> {
    let rest = message.split("DefaultCPUAllocator: can't allocate memory: you tried to allocate ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

const GIB: f64 = (1u64 << 30) as f64;

#[cfg(test)]
mod tests {
    use super::*;

    /// A JSON or CSV error is said once in the line `main` prints (`{:#}` writes the
    /// chain of sources after the message).
    #[test]
    fn a_json_or_csv_error_is_said_once() {
        let json = LetheError::from(serde_json::from_str::<u32>("x").unwrap_err());
        let csv = LetheError::from(csv::Error::from(std::io::Error::other("disk full")));
        for e in [json, csv] {
            let mut line = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                line += &format!(": {s}");
                source = s.source();
            }
            assert!(line.matches("line 1").count() + line.matches("disk full").count() == 1, "{line}");
        }
    }

    /// As the H100 printed it when the paper-size Expire-Span bench did not fit.
    #[test]
    fn a_libtorch_panic_becomes_its_first_line() {
        let oom = r#"called `Result::unwrap()` on an `Err` value: Torch("CUDA out of memory. Tried to allocate 286.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which 120.19 MiB is free.\nException raised from malloc at /pytorch/c10/cuda/CUDACachingAllocator.cpp:1574 (most recent call first):\nframe #0: c10::Error::Error")"#;
        let said = libtorch_failure(oom).unwrap();
        assert!(said.starts_with("libtorch: CUDA out of memory. Tried to allocate 286.00 MiB."), "{said}");
        assert!(!said.contains("frame #0") && said.contains("train.accum"), "{said}");
        let misaligned = r#"called `Result::unwrap()` on an `Err` value: Torch("CUDA error: misaligned address\nSearch for `cudaErrorMisalignedAddress'")"#;
        assert_eq!(libtorch_failure(misaligned).unwrap(), "libtorch: CUDA error: misaligned address");
        assert_eq!(libtorch_failure("index out of bounds: the len is 3 but the index is 5"), None);
        let cpu = r#"called `Result::unwrap()` on an `Err` value: Torch("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)\nException raised from alloc_cpu")"#;
        let said = libtorch_failure(cpu).unwrap();
        assert!(said.starts_with("libtorch could not allocate 1024.0 GiB of the CPU's memory"), "{said}");
        assert!(!said.contains("enforce") && !said.contains('\n'), "{said}");
    }
}
