//! `lethe._lethe`: lethe's memories for the Python package `lethe` (python/lethe), which
//! makes them `torch.nn.Module`s.
//!
//! - [`layer::Layer`]: one attention layer of lethe's backbone with its memory mechanism;
//! - [`model::Model`]: a whole lethe model, read from a run folder, a checkpoint or a
//!   Hugging Face folder lethe reads;
//! - [`decoder::Decoder`]: a pretrained Llama-family decoder under a key-value cache
//!   policy;
//! - [`main`]: the `lethe` command line, for the package's `lethe` command.
//!
//! Parameters are tensors of this extension's `VarStore`, handed to Python as the very
//! same libtorch tensors (pyo3-tch), so that the Python module registers them as its
//! `nn.Parameter`s: an optimiser in Python updates what this code computes with, and
//! autograd records lethe's operations in the graph of the user's model, its fused
//! kernels' backward passes included.
//!
//! Memory is an explicit value: each call takes the state of the previous block as named
//! tensors (the same tensors a checkpoint saves for exact resume), restores a copy of it
//! into a fresh memory, runs the block and returns the new state.

mod decoder;
mod generation;
mod layer;
mod model;

// The `lethe` command line: the binary's own source, so that the package's `lethe`
// command (`python -m lethe`) is the same program.
#[path = "../../src/cli.rs"]
mod cli;
#[path = "../../src/commands/mod.rs"]
mod commands;

use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3_tch::PyTensor;
use tch::{Kind, Tensor};

use lethe_core::error::libtorch_failure;

/// Named tensors: parameters, or a memory's state.
type Named = Vec<(String, PyTensor)>;

/// A Python `ValueError` saying `what`.
fn invalid(what: impl Into<String>) -> PyErr {
    PyValueError::new_err(what.into())
}

/// An error about lethe's config fields in the names of the layer's arguments
/// (`train.block` is `block`, `memory.expire.ramp` is `ramp`).
fn as_arguments(message: &str) -> String {
    let mut said = message
        .trim_start_matches("config: ")
        .replace("train.block", "block")
        .replace("span memory.span", "span")
        .replace("memory.span", "span");
    for mechanism in ["expire", "adaptive", "compressive", "infinity"] {
        said = said.replace(&format!("memory.{mechanism}."), "");
    }
    said
}

/// PyTorch's name of a dtype.
fn dtype_name(kind: Kind) -> String {
    match kind {
        Kind::Float => "torch.float32".into(),
        Kind::Double => "torch.float64".into(),
        Kind::Half => "torch.float16".into(),
        Kind::BFloat16 => "torch.bfloat16".into(),
        Kind::Int64 => "torch.int64".into(),
        Kind::Int => "torch.int32".into(),
        Kind::Int16 => "torch.int16".into(),
        Kind::Int8 => "torch.int8".into(),
        Kind::Uint8 => "torch.uint8".into(),
        Kind::Bool => "torch.bool".into(),
        other => format!("{other:?}"),
    }
}

/// Refuses `t` (the argument `what`) unless it has the parameters' dtype `kind`.
fn check_float(what: &str, t: &Tensor, kind: Kind) -> PyResult<()> {
    if t.kind() == kind {
        return Ok(());
    }
    Err(invalid(format!(
        "{what}: dtype {} differs from the parameters' {} (convert one: {what}.to(dtype) or module.to(dtype))",
        dtype_name(t.kind()),
        dtype_name(kind)
    )))
}

/// Refuses `t` (the argument `what`) unless it is on the parameters' `device`.
fn check_device(what: &str, t: &Tensor, device: tch::Device) -> PyResult<()> {
    if t.device() == device {
        return Ok(());
    }
    Err(invalid(format!(
        "{what}: on {}, the parameters on {} (move one: {what}.to(device) or module.to(device))",
        device_name(t.device()),
        device_name(device)
    )))
}

/// A device as torch names it: `cpu`, `cuda:0`, `mps`.
fn device_name(device: tch::Device) -> String {
    match device {
        tch::Device::Cpu => "cpu".into(),
        tch::Device::Cuda(i) => format!("cuda:{i}"),
        tch::Device::Mps => "mps".into(),
        tch::Device::Vulkan => "vulkan".into(),
    }
}

/// Refuses the token ids `t` (the argument `what`) unless they are a `(batch, length)`
/// int64 tensor of ids below `vocab`, `length` at most `block` when there is one.
fn check_ids(what: &str, t: &Tensor, vocab: i64, block: Option<i64>) -> PyResult<()> {
    let size = t.size();
    let long = block.is_some_and(|b| size.get(1).is_some_and(|&m| m > b));
    if size.len() != 2 || size[0] == 0 || size[1] == 0 || long {
        let bound = block.map_or(String::new(), |b| format!(" with 1 <= length <= block = {b}"));
        return Err(invalid(format!("{what}: expected (batch, length) token ids{bound}, got {size:?}")));
    }
    if t.kind() != Kind::Int64 {
        return Err(invalid(format!("{what}: expected int64 token ids, got {}", dtype_name(t.kind()))));
    }
    let (low, high) = (t.min().int64_value(&[]), t.max().int64_value(&[]));
    if low < 0 || high >= vocab {
        return Err(invalid(format!("{what}: ids from {low} to {high}, the vocabulary has 0 to {}", vocab - 1)));
    }
    Ok(())
}

/// Refuses a list of token ids (the argument `what`) that holds one outside `0..vocab`.
fn check_id_list(what: &str, ids: &[i64], vocab: i64) -> PyResult<()> {
    match ids.iter().find(|&&i| i < 0 || i >= vocab) {
        Some(bad) => Err(invalid(format!("{what}: {bad} is outside the vocabulary (0 to {})", vocab - 1))),
        None => Ok(()),
    }
}

/// The tensors of a caller's `state` for a block of `streams` streams on `device`, through
/// layers of `d_model` (the width of every memory of states), copied, so that the
/// caller's state stays as it was whatever the memory does with them.
fn restore(
    state: &[(String, PyTensor)],
    streams: i64,
    d_model: i64,
    device: tch::Device,
) -> PyResult<Vec<(String, Tensor)>> {
    let mut restored = Vec::with_capacity(state.len());
    for (name, t) in state {
        if t.device() != device {
            return Err(invalid(format!(
                "state: `{name}` is on {}, the block on {} (move the state: state.to(device))",
                device_name(t.device()),
                device_name(device)
            )));
        }
        if t.dim() > 0 && t.size()[0] != streams {
            return Err(invalid(format!(
                "state: `{name}` holds {} streams and the block {streams} (a state carries the streams of the blocks it read)",
                t.size()[0]
            )));
        }
        if t.dim() == 3 && !t.is_floating_point() {
            return Err(invalid(format!("state: `{name}` is {:?}, where states are floating point", t.kind())));
        }
        if t.dim() == 3 && t.size()[2] != d_model {
            return Err(invalid(format!(
                "state: `{name}` holds states of width {}, where this module's d_model is {d_model}",
                t.size()[2]
            )));
        }
        restored.push((name.clone(), t.detach().copy()));
    }
    Ok(restored)
}

/// Locks what a Python object owns (it may be shared by threads).
fn lock<T>(inner: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    inner.lock().map_err(|_| PyRuntimeError::new_err("lethe: the module was poisoned by an earlier failure"))
}

/// Runs `f`, turning a libtorch error that a tensor operation panicked with into a
/// Python `RuntimeError` of one line (and any other panic into one naming it a bug).
/// Everything that touches a caller's tensor runs inside it, checks included, and inside
/// the lock it holds: a failure caught there leaves the module usable (a panic that
/// unwound through the lock would poison it for good).
fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let text = commands::panic_text(payload.as_ref());
            Err(PyRuntimeError::new_err(
                libtorch_failure(&text).unwrap_or_else(|| format!("lethe: internal error (a bug): {text}")),
            ))
        }
    }
}

/// Keeps a libtorch failure that [`guarded`] turns into a Python exception from also
/// printing Rust's panic message; any other panic is reported as usual.
fn quiet_libtorch_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if libtorch_failure(&commands::panic_text(info.payload())).is_none() {
            default(info);
        }
    }));
}

/// Runs lethe's command line `argv` (the program's name first), as the `lethe` binary
/// does; returns its exit status.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.allow_threads(move || commands::main(argv))
}

#[pymodule]
fn _lethe(m: &Bound<'_, PyModule>) -> PyResult<()> {
    quiet_libtorch_panics();
    m.add_class::<layer::Layer>()?;
    m.add_class::<model::Model>()?;
    m.add_class::<decoder::Decoder>()?;
    m.add_class::<decoder::KvCache>()?;
    m.add_function(wrap_pyfunction!(decoder::kv_cache_from_state, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    Ok(())
}
