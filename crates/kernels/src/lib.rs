//! lethe-kernels: how lethe calls its own C++ (`csrc/`, compiled by `build.rs`): the one mirror of its
//! C ABI, `csrc/lethe.h` (every entry point and argument struct, declared here once and
//! called from the module that wraps it), and the helpers every call shares. Every entry
//! point that can fail returns 0, or -1 with a `malloc`'ed message (`csrc/guard.h` turns
//! any C++ exception into one, never an abort). [`call`] turns that status into a [`Result`] whose error
//! names the piece, and [`tensor`] takes over an `at::Tensor*` that an entry point made.

use std::ffi::{c_char, c_int, c_void, CStr};

use tch::Tensor;

/// A failed call into `csrc/`: the piece that failed and the first line of its message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KernelError(pub String);

/// The result of a call into `csrc/`.
pub type Result<T> = std::result::Result<T, KernelError>;

/// The folder of the libtorch that lethe was built against, where the CUDA backend is
/// looked for when a GPU is asked for (the linker's `--as-needed` drops it from the
/// binary).
pub const LIBTORCH_LIB: Option<&str> = option_env!("LETHE_LIBTORCH_LIB");

/// An `at::Tensor*`, as tch's `Tensor::as_ptr` gives it.
pub type RawTensor = *mut c_void;

/// The tensor pointer of `t`, for a call that reads it (or writes its storage in place).
pub fn raw(t: &Tensor) -> RawTensor {
    t.as_ptr() as RawTensor
}

/// [`raw`] of an optional tensor: null for none.
pub fn raw_or_null(t: Option<&Tensor>) -> RawTensor {
    t.map_or(std::ptr::null_mut(), raw)
}

/// `lethe_optimiser_args`.
#[repr(C)]
pub struct OptimiserArgs {
    pub params: *mut RawTensor,
    pub grads: *mut RawTensor,
    pub exp_avg: *mut RawTensor,
    pub exp_avg_sq: *mut RawTensor,
    pub count: i64,
    pub steps: *const f64,
    pub decays: *const f64,
    pub constants: *const f64,
    pub rmsprop: c_int,
    pub decay: c_int,
    pub multi_tensor: c_int,
}

/// `lethe_cache_tail_args`.
#[repr(C)]
pub struct CacheTailArgs {
    pub k: RawTensor,
    pub v: RawTensor,
    pub s: RawTensor,
    pub block: RawTensor,
    pub wk: RawTensor,
    pub wv: RawTensor,
    pub ws: RawTensor,
}

/// `lethe_ragged_project_args`.
#[repr(C)]
pub struct RaggedProjectArgs {
    pub states: RawTensor,
    pub block: RawTensor,
    pub valid: RawTensor,
    pub wk: RawTensor,
    pub bk: RawTensor,
    pub wv: RawTensor,
    pub bv: RawTensor,
    pub ws: RawTensor,
    pub blas: c_int,
}

/// `lethe_expire_operands`.
#[repr(C)]
pub struct ExpireOperands {
    pub pq: RawTensor,
    pub spans: RawTensor,
    pub counter: RawTensor,
    pub usable: RawTensor,
    pub ramp: f64,
    pub width: c_int,
}

/// `lethe_expire_attend_args`.
#[repr(C)]
pub struct ExpireAttendArgs {
    pub q: RawTensor,
    pub k: RawTensor,
    pub v: RawTensor,
    pub ops: ExpireOperands,
    pub loss_scale: f64,
    pub blas: c_int,
}

/// `lethe_dist_options`.
#[repr(C)]
pub struct DistOptions {
    pub host: *const c_char,
    pub port: c_int,
    pub rank: c_int,
    pub world: c_int,
    pub store_server: c_int,
    pub prefix: *const c_char,
    pub timeout_ms: i64,
    pub device: c_int,
}

/// `lethe_reducer`: c10d's Reducer over a group's parameters, opaque here.
#[repr(C)]
pub struct RawReducer {
    _private: [u8; 0],
}

/// `lethe_pg`: a process group, opaque here.
#[repr(C)]
pub struct RawGroup {
    _private: [u8; 0],
}

// Every entry point of `csrc/lethe.h`, in its order (a test compares the two).
extern "C" {
    pub fn lethe_free_error(error: *mut c_char);

    pub fn lethe_optimiser_step(args: *const OptimiserArgs, error: *mut *mut c_char) -> c_int;
    pub fn lethe_clip_foreach(
        grads: *mut RawTensor,
        count: i64,
        max: f64,
        norm: *mut f64,
        error: *mut *mut c_char,
    ) -> c_int;

    pub fn lethe_cache_tail_grad(args: *const CacheTailArgs, out: *mut RawTensor, error: *mut *mut c_char) -> c_int;
    pub fn lethe_ragged_project(args: *const RaggedProjectArgs, out: *mut RawTensor, error: *mut *mut c_char) -> c_int;

    pub fn lethe_chunks(
        t: RawTensor,
        dim: i64,
        starts: *const i64,
        lens: *const i64,
        count: i64,
        out: *mut RawTensor,
        error: *mut *mut c_char,
    ) -> c_int;
    pub fn lethe_skew(flipped: RawTensor, cached: i64, n: i64, out: *mut RawTensor, error: *mut *mut c_char) -> c_int;
    pub fn lethe_expectation(
        mu: RawTensor,
        var: RawTensor,
        centres: RawTensor,
        widths2: RawTensor,
        out: *mut RawTensor,
        error: *mut *mut c_char,
    ) -> c_int;

    pub fn lethe_decode_linear(
        x: RawTensor,
        w: RawTensor,
        bias: RawTensor,
        out: *mut RawTensor,
        error: *mut *mut c_char,
    ) -> c_int;
    pub fn lethe_decode_attention(
        q: RawTensor,
        keys: RawTensor,
        values: RawTensor,
        bias: RawTensor,
        scale: f64,
        out: *mut RawTensor,
        error: *mut *mut c_char,
    ) -> c_int;
    pub fn lethe_read_sum(x: RawTensor, sum: *mut f64, error: *mut *mut c_char) -> c_int;

    pub fn lethe_compact(
        keep: RawTensor,
        tensors: *mut RawTensor,
        count: i64,
        room: i64,
        out: *mut RawTensor,
        error: *mut *mut c_char,
    ) -> c_int;

    pub fn lethe_expire_scores(
        scores: RawTensor,
        ops: *const ExpireOperands,
        softmax: c_int,
        out: *mut RawTensor,
        error: *mut *mut c_char,
    ) -> c_int;
    pub fn lethe_expire_attend(args: *const ExpireAttendArgs, out: *mut RawTensor, error: *mut *mut c_char) -> c_int;
    pub fn lethe_expire_bias(
        ops: *const ExpireOperands,
        stats: c_int,
        loss_scale: f64,
        out: *mut RawTensor,
        error: *mut *mut c_char,
    ) -> c_int;
    pub fn lethe_expire_forget(
        states: RawTensor,
        spans: RawTensor,
        counter: RawTensor,
        valid: RawTensor,
        ramp: f64,
        m: i64,
        out: *mut RawTensor,
        error: *mut *mut c_char,
    ) -> c_int;
    pub fn lethe_cuda_kernels_load(path: *const c_char, error: *mut *mut c_char) -> c_int;
    pub fn lethe_cuda_kernels_ready() -> c_int;
    // A check of the build (OpenMP), for the tests.
    pub fn lethe_parallel_threads(seen: *mut i64, threads: *mut i64);

    pub fn lethe_set_tf32(tf32: c_int, error: *mut *mut c_char) -> c_int;
    pub fn lethe_tf32() -> c_int;
    pub fn lethe_set_cpp_log_level(level: c_int);
    pub fn lethe_autocast_enter(
        device_type: c_int,
        enabled: c_int,
        dtype: c_int,
        saved: *mut c_int,
        error: *mut *mut c_char,
    ) -> c_int;
    pub fn lethe_autocast_exit(device_type: c_int, saved: *const c_int, error: *mut *mut c_char) -> c_int;
    pub fn lethe_autocast_widen_products(error: *mut *mut c_char) -> c_int;
    pub fn lethe_gpu_memory(
        device: c_int,
        reset: c_int,
        current: *mut i64,
        peak: *mut i64,
        error: *mut *mut c_char,
    ) -> c_int;
    pub fn lethe_trace_start(path: *const c_char, out: *mut *mut c_void, error: *mut *mut c_char) -> c_int;
    pub fn lethe_trace_stop(handle: *mut c_void, error: *mut *mut c_char) -> c_int;

    pub fn lethe_dist_nccl_load(path: *const c_char, error: *mut *mut c_char) -> c_int;
    pub fn lethe_dist_init(options: *const DistOptions, error: *mut *mut c_char) -> *mut RawGroup;
    pub fn lethe_dist_all_reduce(pg: *mut RawGroup, tensor: RawTensor, max: c_int, error: *mut *mut c_char) -> c_int;
    pub fn lethe_dist_broadcast(pg: *mut RawGroup, tensor: RawTensor, root: c_int, error: *mut *mut c_char) -> c_int;
    pub fn lethe_dist_barrier(pg: *mut RawGroup, error: *mut *mut c_char) -> c_int;
    pub fn lethe_dist_reducer_new(
        pg: *mut RawGroup,
        params: *const RawTensor,
        n: c_int,
        first_bytes: i64,
        bucket_bytes: i64,
        error: *mut *mut c_char,
    ) -> *mut RawReducer;
    pub fn lethe_dist_reducer_prepare(reducer: *mut RawReducer, loss: RawTensor, error: *mut *mut c_char) -> c_int;
    pub fn lethe_dist_reducer_free(reducer: *mut RawReducer);
    pub fn lethe_dist_free(pg: *mut RawGroup);
}

/// Runs `entry(&mut error)`, one C++ entry point; a non-zero status becomes
/// `KernelError("{what}: {message}")`.
pub fn call(what: &str, entry: impl FnOnce(*mut *mut c_char) -> c_int) -> Result<()> {
    status(entry).map_err(|message| KernelError(format!("{what}: {message}")))
}

/// Runs `entry(&mut error)`, one C++ entry point; a non-zero status gives its message,
/// for a caller with its own kind of error ([`call`] for the usual one).
pub fn status(entry: impl FnOnce(*mut *mut c_char) -> c_int) -> std::result::Result<(), String> {
    let mut error: *mut c_char = std::ptr::null_mut();
    if entry(&mut error) == 0 {
        return Ok(());
    }
    // SAFETY: `error` is null or the message the entry point wrote, taken here once.
    Err(unsafe { take_error(error) })
}

/// The message of a failed call into `csrc/`, first line only; frees it.
///
/// # Safety
/// `error` must be null or a message that an entry point wrote, taken once.
pub unsafe fn take_error(error: *mut c_char) -> String {
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
pub unsafe fn tensor(p: *mut c_void) -> Tensor {
    // SAFETY: as the caller promises.
    unsafe { Tensor::from_ptr(p as *mut torch_sys::C_tensor) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The functions of a C or Rust declaration text: each name with its parameters'
    /// names, in order (`void` and `error`-style out-parameters counted like the rest).
    fn functions(text: &str, opener: &str) -> Vec<(String, Vec<String>)> {
        let mut found = Vec::new();
        for (i, _) in text.match_indices(opener) {
            let rest = &text[i + opener.len() - "lethe_".len()..];
            let Some(open) = rest.find('(') else { continue };
            let name = rest[..open].trim().to_string();
            let close = rest[open..].find(')').map_or(rest.len(), |c| open + c);
            let params = rest[open + 1..close]
                .split(',')
                .map(|p| p.trim())
                .filter(|p| !p.is_empty() && *p != "void")
                .map(|p| {
                    let before_colon = p.split(':').next().unwrap_or(p);
                    let word = before_colon.rsplit(|c: char| !(c.is_alphanumeric() || c == '_')).next();
                    word.unwrap_or(p).to_string()
                })
                .collect();
            found.push((name, params));
        }
        found
    }

    /// The field names of each struct, by the C typedef's name (`lethe_x_args`) or the
    /// Rust struct's doc line naming it.
    fn c_structs(header: &str) -> Vec<(String, Vec<String>)> {
        header
            .split("typedef struct ")
            .skip(1)
            .filter_map(|s| {
                let (name, body) = s.split_once('{')?;
                let body = body.split('}').next()?;
                let fields = body
                    .lines()
                    .map(|l| l.split("//").next().unwrap_or("").trim())
                    .filter(|l| l.ends_with(';'))
                    .map(|l| l.trim_end_matches(';').rsplit([' ', '*']).next().unwrap_or("").into())
                    .collect();
                Some((name.trim().to_string(), fields))
            })
            .collect()
    }

    fn rust_structs(source: &str) -> Vec<(String, Vec<String>)> {
        source
            .split("/// `lethe_")
            .skip(1)
            .filter_map(|s| {
                let name = format!("lethe_{}", s.split('`').next()?);
                let body = s.split_once('{')?.1.split('}').next()?;
                let fields = body
                    .lines()
                    .filter_map(|l| l.trim().strip_prefix("pub "))
                    .map(|l| l.split(':').next().unwrap_or("").trim().to_string())
                    .collect();
                Some((name, fields))
            })
            .filter(|(name, _)| name != "lethe_pg" && name != "lethe_reducer")
            .collect()
    }

    /// `csrc/lethe.h` and this module declare the same entry points, with the same
    /// parameters in the same order, and the same argument structs, field by field: the
    /// C++ definitions are checked against the header by the compiler, and this mirror
    /// against the header here.
    #[test]
    fn the_rust_mirror_declares_what_the_c_header_declares() {
        let header = include_str!("../csrc/lethe.h");
        let source = include_str!("lib.rs");
        let mirror = &source[..source.find("#[cfg(test)]\nmod tests").unwrap()];
        let c = functions(header, "\nint lethe_")
            .into_iter()
            .chain(functions(header, "\nvoid lethe_"))
            .chain(functions(header, "\nlethe_pg* lethe_"))
            .chain(functions(header, "\nlethe_reducer* lethe_"))
            .collect::<std::collections::BTreeMap<_, _>>();
        let rust = functions(mirror, "fn lethe_").into_iter().collect::<std::collections::BTreeMap<_, _>>();
        assert!(c.len() >= 20, "the header's functions were not found: {c:?}");
        assert_eq!(c, rust, "csrc/lethe.h and src/lib.rs declare different entry points");
        let (cs, rs) = (c_structs(header), rust_structs(mirror));
        assert!(cs.len() >= 6, "the header's structs were not found: {cs:?}");
        let cs: Vec<_> = cs.into_iter().filter(|(name, _)| name != "lethe_pg").collect();
        assert_eq!(cs, rs, "csrc/lethe.h and src/lib.rs lay out different argument structs");
    }

    #[test]
    fn a_failed_call_names_the_piece() {
        assert!(call("the skew", |_| 0).is_ok());
        let err = call("the skew", |_| -1).unwrap_err().to_string();
        assert!(err.contains("the skew: no message"), "{err}");
    }
}
