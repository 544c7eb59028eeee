//! Expire-Span's attention bias in one autograd node (`csrc/expire_bias.cpp`), the GPU's
//! path: the soft mask of Eq. 5 applied after the softmax with renormalisation (Eq. 4)
//! as the additive bias `ln m`, the relative positions (A.1) beside it, and the ramp
//! span loss (4.2) with its ramp counts, for libtorch's `scaled_dot_product_attention`.
//! On a GPU four CUDA kernels (`csrc/cuda/expire_bias.cu`, in `liblethe_cuda.so`) take
//! the place of about forty libtorch operations on `(b, m, n)` and `(b, h, m, n)` tensors
//! and their backward passes; on the CPU the same element functions
//! (`csrc/expire_bias.h`) run in loops, which is how the tests check the kernels'
//! arithmetic without a GPU.
//!
//! `liblethe_cuda.so` is built by `scripts/build-cuda.sh` (CUDA's compiler from PyPI) and
//! loaded when Expire-Span first runs on a GPU ([`runs_on`]): from `LETHE_CUDA_KERNELS`, or
//! beside the `lethe` executable. Without it Expire-Span takes the written-out path on a
//! GPU, with the same numbers.

use std::ffi::{c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tch::{Device, Tensor};

use lethe_core::error::{LetheError, Result};
use lethe_kernels::{lethe_cuda_kernels_load, lethe_cuda_kernels_ready, lethe_expire_bias, raw, ExpireOperands};

/// The CUDA library's file name.
pub const LIBRARY: &str = "liblethe_cuda.so";

/// The variable that names the CUDA library's path.
pub const LIBRARY_VAR: &str = "LETHE_CUDA_KERNELS";

/// What [`expire_bias`] returns.
pub struct Bias {
    /// `(b, h, m, n)`: `ln m + positions` where a query sees a key, `-inf` elsewhere; with
    /// gradient to the positions and the spans.
    pub bias: Tensor,
    /// With `loss`: per key, how many queries see it on the ramp `(b, n)`, and the sum of
    /// their distances `(b, n)`, double; no gradient.
    pub ramp: Option<(Tensor, Tensor)>,
    /// With `loss`: the span loss times the scale asked for, `scale * mean over streams of
    /// sum over keys of (e counts - distances)` (one value, the spans' kind), with
    /// gradient to the spans ([`super::expire::ramp_loss_of_counts`] from the same parts).
    pub loss: Option<Tensor>,
}

/// The bias of `m` queries over `n` keys: `positions` `(b, h, m, P)` (`q·key_pe[d] /
/// sqrt(dh)` for distances `d < P`), the spans `(b, n)` the mask uses, each key's
/// distance to the first query `counter` `(b, n)`, the keys each query may use `usable`
/// `(b, 1, n)` or `(b, m, n)`, the ramp `R`; `loss`: the span loss's scale, `alpha / (R
/// M)` (then the loss and its parts come back too; a scale of 0 gives the parts alone).
/// Float or double, on the CPU or (once [`load_kernels`] has found the library) a GPU.
pub fn expire_bias(
    positions: &Tensor,
    spans: &Tensor,
    counter: &Tensor,
    usable: &Tensor,
    ramp: f64,
    loss: Option<f64>,
) -> Result<Bias> {
    let mut out: [*mut c_void; 4] = [std::ptr::null_mut(); 4];
    // SAFETY: each pointer is a live `at::Tensor*` owned by its `Tensor` for the call (the
    // node reads them only); on success it writes four new `at::Tensor*`, which
    // `ffi::tensor` takes over.
    lethe_kernels::call("expire-span bias", |error| unsafe {
        let ops = ExpireOperands {
            pq: raw(positions),
            spans: raw(spans),
            counter: raw(counter),
            usable: raw(usable),
            ramp,
            width: 0,
        };
        lethe_expire_bias(&ops, c_int::from(loss.is_some()), loss.unwrap_or(0.0), out.as_mut_ptr(), error)
    })?;
    // SAFETY: see above; each pointer is taken over once.
    let [bias, counts, distances, value] = out.map(|p| unsafe { lethe_kernels::tensor(p) });
    let value = loss.filter(|&scale| scale > 0.0).map(|_| value);
    Ok(Bias { bias, ramp: loss.map(|_| (counts, distances)), loss: value })
}

/// Whether [`expire_bias`] runs on `device`: always on the CPU; on a GPU once the kernels
/// are loaded, which the first call on a GPU tries ([`gpu_kernels`]).
pub fn runs_on(device: Device) -> Result<bool> {
    if !device.is_cuda() {
        return Ok(device == Device::Cpu);
    }
    // SAFETY: reads a flag.
    Ok(gpu_kernels()?.is_some() && unsafe { lethe_cuda_kernels_ready() } == 1)
}

/// The GPU kernels' library, loaded on the first call ([`load_kernels`]): its path, `None`
/// when there is none, an error when `LETHE_CUDA_KERNELS` names one that does not load.
pub fn gpu_kernels() -> Result<Option<PathBuf>> {
    static LOADED: OnceLock<std::result::Result<Option<PathBuf>, String>> = OnceLock::new();
    LOADED.get_or_init(|| load_kernels().map_err(|e| e.to_string())).clone().map_err(LetheError::Invalid)
}

/// One line on how Expire-Span attends on a GPU (the bench prints it): through the
/// kernels, and from where, or written out, and why.
pub fn gpu_path(fused: bool) -> Result<String> {
    Ok(match (fused, gpu_kernels()?) {
        (false, _) => "Expire-Span on the GPU: written out (memory.expire.fused = false)".into(),
        (true, Some(path)) => format!("Expire-Span on the GPU: bias kernels from {}", path.display()),
        (true, None) => format!(
            "Expire-Span on the GPU: written out (no {LIBRARY} beside lethe or in {LIBRARY_VAR}; scripts/build-cuda.sh builds it)"
        ),
    })
}

/// Loads the GPU kernels from `LETHE_CUDA_KERNELS` if it is set (an error if that fails),
/// else from beside the running executable if the library is there. Returns the path
/// loaded, `None` when there is none to load.
pub fn load_kernels() -> Result<Option<PathBuf>> {
    // The library needs libtorch's CUDA runtime loaded first.
    lethe_core::device::load_cuda_backend();
    let named = std::env::var_os(LIBRARY_VAR).filter(|v| !v.is_empty()).map(PathBuf::from);
    let beside = || {
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.join(LIBRARY)).filter(|p| p.is_file())
    };
    let Some(path) = named.clone().or_else(beside) else {
        return Ok(None);
    };
    if named.is_some() && !path.is_file() {
        return Err(LetheError::Invalid(format!("{LIBRARY_VAR}: no file {}", path.display())));
    }
    load(&path).map(|()| Some(path))
}

fn load(path: &Path) -> Result<()> {
    let c = CString::new(path.to_string_lossy().as_bytes())
        .map_err(|_| LetheError::Invalid(format!("{LIBRARY_VAR}: {} holds a NUL byte", path.display())))?;
    // SAFETY: a valid NUL-terminated path; the library stays loaded for the process.
    Ok(lethe_kernels::call("loading the GPU kernels", |error| unsafe { lethe_cuda_kernels_load(c.as_ptr(), error) })?)
}

#[cfg(test)]
mod tests;
