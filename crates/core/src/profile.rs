//! Wall-clock time per phase of a training step, for `lethe bench --profile`.
//!
//! The code marks its phases with [`phase`] (`let _t = profile::phase("attention");`):
//! while a profile is being taken on this thread ([`start`] .. [`finish`]), the guard
//! adds the time until it is dropped to the phase's total; otherwise it does nothing
//! and costs one thread-local read. Phases nest: a phase opened inside another is
//! recorded under its path (`forward > attention > softmax`), so the report is a tree
//! whose children add up to at most their parent.
//!
//! On a GPU, kernels run asynchronously: every phase boundary then waits for the device
//! ([`tch::Cuda::synchronize`]), so that a phase is charged for its own kernels. That
//! wait slows the step a little; the bench's step times are taken without it.
//!
//! What timers cannot split: the backward pass is one libtorch call (`backward`), so it
//! is one phase. [`Trace`] splits it: libtorch's own profiler records every operation
//! and every autograd node of the backward pass into a Chrome trace
//! (`lethe bench --trace`; `scripts/trace-summary.py` sums it per operation).

use std::cell::RefCell;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use tch::Device;

use crate::error::{LetheError, Result};
use lethe_kernels::{lethe_trace_start, lethe_trace_stop};

/// One phase's time over the profiled steps.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseTime {
    /// The phase's path, outermost first: `["forward", "layer", "attention"]`.
    pub path: Vec<String>,
    /// Total seconds spent in the phase.
    pub seconds: f64,
    /// How many times the phase was entered.
    pub calls: usize,
}

impl PhaseTime {
    /// The path joined with ` > `.
    pub fn name(&self) -> String {
        self.path.join(" > ")
    }
}

struct Recorder {
    device: Device,
    /// Open phases, outermost first.
    stack: Vec<&'static str>,
    /// Totals by path, in the order the paths were first seen.
    totals: Vec<(Vec<&'static str>, f64, usize)>,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Starts a profile on this thread; phases entered from now on are timed. `device` is
/// waited for at each phase boundary when it is a GPU. A profile already running is
/// discarded.
pub fn start(device: Device) {
    RECORDER.with(|r| *r.borrow_mut() = Some(Recorder { device, stack: vec![], totals: vec![] }));
}

/// Ends the profile and returns each phase's time, in the order the phases were first
/// entered (a parent before its children). Empty when no profile was running.
pub fn finish() -> Vec<PhaseTime> {
    let recorder = RECORDER.with(|r| r.borrow_mut().take());
    recorder.map_or_else(Vec::new, |rec| {
        rec.totals
            .into_iter()
            .map(|(path, seconds, calls)| PhaseTime {
                path: path.iter().map(|s| s.to_string()).collect(),
                seconds,
                calls,
            })
            .collect()
    })
}

/// Adds the phase times `more` into `total`, phase by phase (by path); phases new to
/// `total` go at its end, in their order in `more`.
pub fn merge(total: &mut Vec<PhaseTime>, more: Vec<PhaseTime>) {
    for p in more {
        match total.iter_mut().find(|t| t.path == p.path) {
            Some(t) => {
                t.seconds += p.seconds;
                t.calls += p.calls;
            }
            None => total.push(p),
        }
    }
}

/// Times a phase until the returned guard is dropped, when a profile is running.
#[must_use = "the phase ends when the guard is dropped"]
pub fn phase(name: &'static str) -> Option<Phase> {
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        let rec = r.as_mut()?;
        wait_for(rec.device);
        rec.stack.push(name);
        // Listed when first entered, so that a parent comes before its children.
        if !rec.totals.iter().any(|(p, _, _)| *p == rec.stack) {
            rec.totals.push((rec.stack.clone(), 0.0, 0));
        }
        Some(Phase { start: Instant::now() })
    })
}

/// An open phase (see [`phase`]).
pub struct Phase {
    start: Instant,
}

impl Drop for Phase {
    fn drop(&mut self) {
        RECORDER.with(|r| {
            let mut r = r.borrow_mut();
            let Some(rec) = r.as_mut() else { return };
            wait_for(rec.device);
            let seconds = self.start.elapsed().as_secs_f64();
            if let Some((_, total, calls)) = rec.totals.iter_mut().find(|(p, _, _)| *p == rec.stack) {
                *total += seconds;
                *calls += 1;
            }
            rec.stack.pop();
        });
    }
}

fn wait_for(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// The profile as a table: each phase's milliseconds per step (over `steps` steps),
/// its share of the outermost phases' time, and its calls per step, indented by depth.
pub fn table(phases: &[PhaseTime], steps: usize) -> String {
    let steps = steps.max(1) as f64;
    let step_s = phases.iter().filter(|p| p.path.len() == 1).map(|p| p.seconds).sum::<f64>() / steps;
    let mut out = format!("{:<44} {:>10} {:>7} {:>9}\n", "phase", "ms/step", "share", "calls");
    for p in phases {
        let name =
            format!("{}{}", "  ".repeat(p.path.len().saturating_sub(1)), p.path.last().map_or("", String::as_str));
        let ms = p.seconds / steps * 1e3;
        let share = if step_s > 0.0 { p.seconds / steps / step_s * 100.0 } else { 0.0 };
        out += &format!("{name:<44} {ms:>10.2} {share:>6.1}% {:>9.1}\n", p.calls as f64 / steps);
    }
    out
}

/// A recording of libtorch's profiler (csrc/trace.cpp): every libtorch operation run on
/// this thread between [`Trace::start`] and [`Trace::finish`], forward and backward,
/// with its time, written as a Chrome trace (JSON; chrome://tracing or
/// ui.perfetto.dev). On a GPU the times are the CPU's, not the kernels'.
///
/// The profiler writes `<path>.partial`, renamed to `path` once it is whole, so that a
/// trace at `path` is never a half-written one: a recording that stops on an error
/// leaves its `.partial` file.
pub struct Trace {
    handle: *mut c_void,
    path: PathBuf,
}

impl Trace {
    /// Starts recording into `path` (written by [`Trace::finish`]).
    pub fn start(path: &Path) -> Result<Trace> {
        let partial = partial_path(path);
        let text = CString::new(partial.to_string_lossy().as_bytes())
            .map_err(|_| LetheError::Invalid(format!("`{}`: a trace path cannot hold a NUL byte", path.display())))?;
        let mut handle = std::ptr::null_mut();
        let what = format!("`{}`: libtorch's profiler did not start", path.display());
        // SAFETY: `text` is a NUL-terminated string alive for the call; the function
        // writes a handle or an error message through the two pointers.
        lethe_kernels::call(&what, |error| unsafe { lethe_trace_start(text.as_ptr(), &mut handle, error) })?;
        Ok(Trace { handle, path: path.to_path_buf() })
    }

    /// Stops recording and writes the trace; an error if the file was not written.
    pub fn finish(mut self) -> Result<PathBuf> {
        let handle = std::mem::replace(&mut self.handle, std::ptr::null_mut());
        stop(handle)?;
        let partial = partial_path(&self.path);
        match std::fs::metadata(&partial) {
            Ok(m) if m.len() > 0 => {}
            Ok(_) => {
                return Err(LetheError::Invalid(format!(
                    "`{}`: libtorch's profiler wrote an empty trace",
                    partial.display()
                )))
            }
            Err(e) => return Err(LetheError::io(&partial, e)),
        }
        // The profiler does not say when a write fails: a full disk cuts the file short.
        if !ends_whole(&partial)? {
            let _ = std::fs::remove_file(&partial);
            return Err(LetheError::Invalid(format!(
                "`{}`: libtorch's profiler could not write the whole trace (is the disk full?)",
                self.path.display()
            )));
        }
        std::fs::rename(&partial, &self.path).map_err(|e| LetheError::io(&self.path, e))?;
        Ok(self.path.clone())
    }
}

/// Whether the trace at `path` is whole: its list of events closed (`]`, the last
/// character but whitespace; no event holds a list).
fn ends_whole(path: &Path) -> Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|e| LetheError::io(path, e))?;
    let mut tail = Vec::with_capacity(64);
    file.seek(SeekFrom::End(-(file.metadata().map_or(0, |m| m.len()).min(64) as i64)))
        .and_then(|_| file.read_to_end(&mut tail))
        .map_err(|e| LetheError::io(path, e))?;
    Ok(tail.iter().rev().find(|b| !b.is_ascii_whitespace()) == Some(&b']'))
}

/// Where a trace for `path` is written until it is whole: `path` with `.partial` added.
fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".partial");
    PathBuf::from(name)
}

/// Stops the recording `handle` (null: none) and writes its file.
fn stop(handle: *mut c_void) -> Result<()> {
    if handle.is_null() {
        return Ok(());
    }
    // SAFETY: `handle` came from `lethe_trace_start` and is stopped once (callers
    // replace it with null first).
    Ok(lethe_kernels::call("libtorch's profiler", |error| unsafe { lethe_trace_stop(handle, error) })?)
}

impl Drop for Trace {
    /// A recording that is not finished (an error in the steps) stops, writing what it has.
    fn drop(&mut self) {
        let _ = stop(std::mem::replace(&mut self.handle, std::ptr::null_mut()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(ms: u64) {
        let start = Instant::now();
        while start.elapsed().as_millis() < ms as u128 {}
    }

    #[test]
    fn a_trace_that_is_not_finished_is_left_as_partial() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.json");
        {
            let _trace = Trace::start(&path).unwrap();
            let _ = tch::Tensor::ones([4], (tch::Kind::Float, Device::Cpu)).sum(tch::Kind::Float);
        }
        assert!(!path.exists(), "an unfinished trace never takes the final name");
        let partial = dir.path().join("trace.json.partial");
        assert!(std::fs::metadata(&partial).unwrap().len() > 0, "what it recorded is kept beside it");
        let trace = Trace::start(&path).unwrap();
        let _ = tch::Tensor::ones([4], (tch::Kind::Float, Device::Cpu)).sum(tch::Kind::Float);
        assert_eq!(trace.finish().unwrap(), path);
        assert!(std::fs::read_to_string(&path).unwrap().contains("aten::sum"));
        assert!(!partial.exists(), "finishing renames its .partial file (the unfinished one was overwritten)");
    }

    /// A trace cut short (the profiler writes on through a full disk without a word)
    /// is told from a whole one.
    #[test]
    fn a_trace_cut_short_is_not_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.json");
        let whole = "[\n\n{\n  \"name\": \"aten::sum\",\n  \"args\": {}\n}]\n";
        std::fs::write(&path, whole).unwrap();
        assert!(ends_whole(&path).unwrap());
        for cut in [whole.len() - 3, whole.len() / 2, 1] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            assert!(!ends_whole(&path).unwrap(), "{:?} read as whole", &whole[..cut]);
        }
    }

    #[test]
    fn merged_profiles_add_phase_by_phase() {
        let t = |path: &[&str], seconds: f64, calls: usize| PhaseTime {
            path: path.iter().map(|s| s.to_string()).collect(),
            seconds,
            calls,
        };
        let mut total = vec![];
        merge(&mut total, vec![t(&["step"], 1.0, 1), t(&["step", "a"], 0.25, 2)]);
        merge(&mut total, vec![t(&["step"], 2.0, 1), t(&["step", "b"], 0.5, 1), t(&["step", "a"], 0.5, 3)]);
        assert_eq!(total, [t(&["step"], 3.0, 2), t(&["step", "a"], 0.75, 5), t(&["step", "b"], 0.5, 1)]);
    }

    #[test]
    fn phases_nest_add_up_and_cost_nothing_when_off() {
        assert!(phase("off").is_none(), "no profile running: no guard");
        start(Device::Cpu);
        for _ in 0..2 {
            let _outer = phase("forward");
            for _ in 0..3 {
                let _inner = phase("attention");
                busy(2);
            }
            busy(1);
        }
        {
            let _b = phase("backward");
        }
        let phases = finish();
        assert!(phase("after").is_none(), "finish ends the profile");
        let names: Vec<String> = phases.iter().map(PhaseTime::name).collect();
        assert_eq!(names, ["forward", "forward > attention", "backward"]);
        let calls: Vec<usize> = phases.iter().map(|p| p.calls).collect();
        assert_eq!(calls, [2, 6, 1]);
        let (outer, inner) = (phases[0].seconds, phases[1].seconds);
        assert!(inner >= 0.012 && outer >= inner + 0.002, "outer {outer} s, inner {inner} s");
        let text = table(&phases, 2);
        assert!(
            text.contains("\nforward ") && text.contains("\n  attention ") && text.contains("\nbackward "),
            "{text}"
        );
        assert!(finish().is_empty(), "a second finish has nothing");
    }
}
