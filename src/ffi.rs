//! How lethe calls its own C++ (`csrc/`, compiled by `build.rs`): every entry point
//! returns 0, or -1 with a `malloc`'ed message (`csrc/guard.h` turns any C++ exception
//! into one, never an abort). [`call`] turns that status into a [`Result`] whose error
//! names the piece, and [`tensor`] takes over an `at::Tensor*` that an entry point made.

use std::ffi::{c_char, c_int, c_void, CStr};

use tch::Tensor;

use crate::error::{LetheError, Result};

extern "C" {
    fn lethe_free_error(error: *mut c_char);
}

/// Runs `entry(&mut error)`, one C++ entry point; a non-zero status becomes
/// `LetheError::Invalid("{what}: {message}")`.
pub(crate) fn call(what: &str, entry: impl FnOnce(*mut *mut c_char) -> c_int) -> Result<()> {
    status(entry).map_err(|message| LetheError::Invalid(format!("{what}: {message}")))
}

/// Runs `entry(&mut error)`, one C++ entry point; a non-zero status gives its message,
/// for a caller with its own kind of error ([`call`] for the usual one).
pub(crate) fn status(entry: impl FnOnce(*mut *mut c_char) -> c_int) -> std::result::Result<(), String> {
    let mut error: *mut c_char = std::ptr::null_mut();
    if entry(&mut error) == 0 {
        return Ok(());
    }
    Err(take_error(error))
}

/// The message of a failed call into `csrc/`, first line only; frees it.
pub(crate) fn take_error(error: *mut c_char) -> String {
    if error.is_null() {
        return "no message".to_string();
    }
    // SAFETY: a non-null `error` is a NUL-terminated string malloc'ed by csrc/guard.h.
    let text = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    unsafe { lethe_free_error(error) };
    text.lines().next().unwrap_or("").to_string()
}

/// The tensor behind `p`, an `at::Tensor*` that a successful entry point wrote.
///
/// # Safety
/// `p` must be a new `at::Tensor*` from `csrc/` that nothing else owns, taken over once.
pub(crate) unsafe fn tensor(p: *mut c_void) -> Tensor {
    // SAFETY: as the caller promises.
    unsafe { Tensor::from_ptr(p as *mut torch_sys::C_tensor) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_names_the_piece() {
        assert!(call("the skew", |_| 0).is_ok());
        let err = call("the skew", |_| -1).unwrap_err().to_string();
        assert!(err.contains("the skew: no message"), "{err}");
    }

    #[test]
    fn the_message_of_a_real_failure_comes_back_with_its_first_line() {
        // A skew over more cached keys than distances is refused by csrc/skew.cpp.
        let flipped = Tensor::zeros([1, 1, 2, 3], (tch::Kind::Float, tch::Device::Cpu));
        let err = crate::model::skew::skew(&flipped, 3, 5).unwrap_err().to_string();
        assert!(err.starts_with("the relative positions' skew: "), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
