//! Choosing where tensors live: `cpu`, `cuda`, `cuda:N` or `auto`.

use std::ffi::c_int;

use tch::Device;

use crate::error::{LetheError, Result};
use lethe_kernels::{
    lethe_autocast_enter, lethe_autocast_exit, lethe_autocast_widen_products, lethe_gpu_memory,
    lethe_set_cpp_log_level, lethe_set_tf32, lethe_tf32,
};

/// Keeps libtorch's own log lines (c10d's connection errors and warnings, each with a
/// C++ stack of 40 frames) off stderr, where lethe says what failed in one line; unless
/// `TORCH_CPP_LOG_LEVEL` is set, as libtorch reads it (`INFO`, `WARNING`, `ERROR`):
/// then libtorch keeps the level it asks for.
pub fn quiet_libtorch_log() {
    if std::env::var_os("TORCH_CPP_LOG_LEVEL").is_none() {
        // SAFETY: sets one of libtorch's global flags (an int) before any thread logs.
        unsafe { lethe_set_cpp_log_level(3) };
    }
}

/// What libtorch's caching allocator holds for tensors on one GPU, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuMemory {
    /// Allocated now (`torch.cuda.memory_allocated`).
    pub current: u64,
    /// Allocated at most since the last [`reset_gpu_peak`] (`max_memory_allocated`).
    pub peak: u64,
}

/// The allocator's figures for `device`; `None` on the CPU, or where the CUDA backend
/// registered no caching allocator.
pub fn gpu_memory(device: Device) -> Option<GpuMemory> {
    allocator_call(device, false)
}

/// Starts a new peak of [`gpu_memory`] from what is allocated now (PyTorch's
/// `reset_peak_memory_stats`); nothing on the CPU.
pub fn reset_gpu_peak(device: Device) {
    let _ = allocator_call(device, true);
}

fn allocator_call(device: Device, reset: bool) -> Option<GpuMemory> {
    let Device::Cuda(index) = device else { return None };
    let (mut current, mut peak) = (0i64, 0i64);
    // SAFETY: reads (and with `reset` resets) the allocator's counters for one GPU; the
    // two outputs are written only on success.
    let status = lethe_kernels::status(|error| unsafe {
        lethe_gpu_memory(index as c_int, c_int::from(reset), &mut current, &mut peak, error)
    });
    status.ok().map(|()| GpuMemory { current: current.max(0) as u64, peak: peak.max(0) as u64 })
}

/// The device of a run (`train.device`), after applying its thread count
/// (`train.threads`, 0 = libtorch's default) and its matrix products' precision on a
/// GPU (`train.tf32`).
pub fn for_training(device: &str, threads: usize, tf32: bool) -> Result<Device> {
    let device = parse(device)?;
    apply_threads(threads)?;
    set_tf32(tf32)?;
    Ok(device)
}

/// `c10::ScalarType::BFloat16`.
const BFLOAT16: c_int = 15;
/// `c10::ScalarType::Half`.
const HALF: c_int = 5;

/// Mixed precision on this thread while the guard lives (libtorch's autocast, as
/// `torch.autocast` sets it): [`Autocast::bf16`] (or [`Autocast::f16`]) computes matrix
/// products and the other operations autocast lists in bfloat16 (float16), [`Autocast::off`] computes everything in the
/// inputs' precision again, for the arithmetic that needs float32 inside a bfloat16
/// region (spans and masks, the ∞-former's ridge regression and densities, losses).
/// Dropping the guard restores what was there before: guards nest. On a CPU without
/// instructions for the half precision ([`half_products_native`]), autocast's matrix
/// products and 1-D convolutions are computed on the values widened to float32 and
/// rounded once, as libtorch's emulated ones round, about six times faster
/// (`csrc/widened.cpp`).
#[must_use = "autocast lasts as long as the guard"]
pub struct Autocast {
    device_type: c_int,
    saved: [c_int; 2],
}

impl Autocast {
    /// Autocast to bfloat16 on `device`'s kind (the CPU or a GPU).
    pub fn bf16(device: Device) -> Result<Autocast> {
        Autocast::enter(device, true, BFLOAT16)
    }

    /// Autocast to float16 on `device`'s kind (the CPU or a GPU).
    pub fn f16(device: Device) -> Result<Autocast> {
        Autocast::enter(device, true, HALF)
    }

    /// Autocast off on `device`'s kind, whatever encloses it.
    pub fn off(device: Device) -> Result<Autocast> {
        Autocast::enter(device, false, BFLOAT16)
    }

    fn enter(device: Device, enabled: bool, dtype: c_int) -> Result<Autocast> {
        let device_type = c_int::from(device.is_cuda());
        let kind = if dtype == HALF { tch::Kind::Half } else { tch::Kind::BFloat16 };
        if enabled && !device.is_cuda() && !half_products_native(kind) {
            // SAFETY: registers lethe's kernels with libtorch's dispatcher once.
            lethe_kernels::call("autocast", |error| unsafe { lethe_autocast_widen_products(error) })?;
        }
        let mut saved: [c_int; 2] = [0, 0];
        // SAFETY: sets libtorch's thread-local autocast state; `saved` holds two ints.
        lethe_kernels::call("autocast", |error| unsafe {
            lethe_autocast_enter(device_type, c_int::from(enabled), dtype, saved.as_mut_ptr(), error)
        })?;
        Ok(Autocast { device_type, saved })
    }
}

impl Drop for Autocast {
    fn drop(&mut self) {
        // SAFETY: restores the state `enter` saved on this thread; nothing to report.
        let _ = lethe_kernels::call("autocast", |error| unsafe {
            lethe_autocast_exit(self.device_type, self.saved.as_ptr(), error)
        });
    }
}

/// Whether this CPU has instructions for libtorch's matrix products in `kind`: on x86,
/// AVX512-BF16 for bfloat16 (every CPU with AMX has it) and AVX512-FP16 for float16.
/// Without them libtorch emulates the products, and a bfloat16 product of a prompt's
/// rows runs about six times slower than float32's on an AVX2 CPU (91 ms against 16 for
/// `(512, 576) x (576, 1536)` on 2 cores); a decoder's products and autocast's
/// ([`Autocast`]) are then computed widened to float32. Other CPUs keep libtorch's
/// products.
pub fn half_products_native(kind: tch::Kind) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match kind {
            tch::Kind::BFloat16 => std::arch::is_x86_feature_detected!("avx512bf16"),
            tch::Kind::Half => std::arch::is_x86_feature_detected!("avx512fp16"),
            _ => true,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kind;
        true
    }
}

/// Float32 matrix products on a GPU in TensorFloat-32 (`true`) or in full float32
/// (`false`, libtorch's default), for the rest of the process: `csrc/context.cpp`.
pub fn set_tf32(on: bool) -> Result<()> {
    // SAFETY: the function sets one of libtorch's global flags; `error` is written only
    // on failure.
    Ok(lethe_kernels::call("train.tf32", |error| unsafe { lethe_set_tf32(c_int::from(on), error) })?)
}

/// Whether float32 matrix products on a GPU are in TensorFloat-32 now.
pub fn tf32() -> bool {
    // SAFETY: reads one of libtorch's global flags.
    unsafe { lethe_tf32() != 0 }
}

/// Sets libtorch's CPU thread count to `threads`, the config's `train.threads` (0:
/// libtorch's default). Refuses more threads than the machine has cores: libtorch
/// would start them all and spend its time switching between them (a million threads
/// hung the machine).
pub fn apply_threads(threads: usize) -> Result<()> {
    if threads == 0 {
        return Ok(());
    }
    let cores = cores();
    if threads > cores {
        return Err(LetheError::config(
            "train.threads",
            threads,
            format!("more than the {cores} cores of this machine; use at most {cores}, or 0 for libtorch's default"),
        ));
    }
    tch::set_num_threads(threads as i32);
    Ok(())
}

/// How this machine's libtorch rounds, as a short hex string: a hash of the bits of a
/// fixed matrix product, softmax, log and sum, at the current thread count. Two
/// machines whose CPUs take different kernels (MKL picks them by processor: AVX-512,
/// AVX2, AMD's Zen) round differently, so one seed trains to other figures on them;
/// equal fingerprints say that figures can be compared to the last digit.
pub fn numerics_fingerprint() -> String {
    let _guard = tch::no_grad_guard();
    // Inputs made exactly from integers, so that they are the same bits everywhere.
    let values = |rows: i64, cols: i64, salt: i64| {
        let v: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 + salt) % 2003) as f32 / 2003.0 - 0.5).collect();
        tch::Tensor::from_slice(&v).view([rows, cols])
    };
    let product = values(96, 300, 1).matmul(&values(300, 72, 2)); // (96, 72)
    let probs = (&product * 4.0).softmax(-1, tch::Kind::Float);
    let logs = (&probs + 1e-3).log();
    let sums = logs.sum_dim_intlist([0i64].as_slice(), false, tch::Kind::Float);
    // FNV-1a over the bits of every result.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for t in [&product, &probs, &logs, &sums] {
        let bits: Vec<f32> = t.flatten(0, -1).try_into().unwrap_or_default();
        for byte in bits.iter().flat_map(|x| x.to_bits().to_le_bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// The CPU's model name (`/proc/cpuinfo`), or `unknown`.
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info.lines().find_map(|l| {
        l.strip_prefix("model name").and_then(|rest| rest.split_once(':')).map(|(_, name)| name.trim().to_string())
    });
    model.unwrap_or_else(|| "unknown".into())
}

/// This machine's cores, as the OS reports them (1 when it does not).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Parses a device name. `auto` picks the first GPU when libtorch sees one.
pub fn parse(name: &str) -> Result<Device> {
    if name != "cpu" {
        load_cuda_backend();
    }
    match name {
        "cpu" => Ok(Device::Cpu),
        "auto" => Ok(Device::cuda_if_available()),
        "cuda" => cuda(0),
        other => match other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => cuda(n),
            None => Err(LetheError::config("train.device", name, "must be cpu, cuda, cuda:N or auto")),
        },
    }
}

/// [`parse`] for a command's flag or argument `flag` (`--device`): its error names it.
pub fn parse_flag(flag: &str, name: &str) -> Result<Device> {
    parse(name).map_err(|e| match e {
        LetheError::Config { reason, .. } => LetheError::Invalid(format!("{flag} {name}: {reason}")),
        other => other,
    })
}

/// A device's name as `--device` takes it: `cpu`, `cuda:N` (`mps`, `vulkan`).
pub fn name(device: Device) -> String {
    match device {
        Device::Cpu => "cpu".to_string(),
        Device::Cuda(n) => format!("cuda:{n}"),
        Device::Mps => "mps".to_string(),
        Device::Vulkan => "vulkan".to_string(),
    }
}

fn cuda(index: usize) -> Result<Device> {
    // Validation may run before a GPU is needed; only refuse when asked for one that is absent.
    if tch::Cuda::is_available() && index < tch::Cuda::device_count() as usize {
        Ok(Device::Cuda(index))
    } else {
        Err(LetheError::config(
            "train.device",
            format!("cuda:{index}"),
            format!("no such GPU (libtorch sees {})", tch::Cuda::device_count()),
        ))
    }
}

/// Loads libtorch's CUDA backend (`libtorch_cuda.so`) when the libtorch lethe runs on has
/// one. The linker drops it from the binary's needed libraries because no symbol of it is
/// referenced; without it libtorch reports no GPU. It is looked for beside the
/// `libtorch_cpu.so` this process loaded (which `LD_LIBRARY_PATH` may have chosen: a
/// binary built on one machine and run on another with that machine's torch), then in
/// the folder lethe was built against.
pub fn load_cuda_backend() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let candidates = [loaded_libtorch_dir(), lethe_kernels::LIBTORCH_LIB.map(std::path::PathBuf::from)];
        let Some(lib) =
            candidates.into_iter().flatten().map(|dir| dir.join("libtorch_cuda.so")).find(|lib| lib.exists())
        else {
            return;
        };
        if let Ok(c) = std::ffi::CString::new(lib.to_string_lossy().as_bytes()) {
            // SAFETY: dlopen with a valid NUL-terminated path; the handle is kept open
            // for the life of the process, as libtorch expects of its backends.
            unsafe {
                libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            }
        }
    });
}

/// The folder of the `libtorch_cpu.so` mapped into this process (`/proc/self/maps`).
fn loaded_libtorch_dir() -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    libtorch_dir_in_maps(&maps)
}

/// The folder of the first `libtorch_cpu.so` named in a `/proc/PID/maps` listing.
fn libtorch_dir_in_maps(maps: &str) -> Option<std::path::PathBuf> {
    let path = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.ends_with("/libtorch_cpu.so"))?;
    std::path::Path::new(path).parent().map(std::path::Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    /// A matrix product is in bfloat16 under [`Autocast::bf16`], in float32 again under an
    /// [`Autocast::off`] inside it, and after both guards are dropped.
    #[test]
    fn autocast_guards_nest_and_restore() {
        let (a, b) =
            (Tensor::ones([2, 3], (Kind::Float, Device::Cpu)), Tensor::ones([3, 2], (Kind::Float, Device::Cpu)));
        assert_eq!(a.matmul(&b).kind(), Kind::Float);
        {
            let _on = Autocast::bf16(Device::Cpu).unwrap();
            assert_eq!(a.matmul(&b).kind(), Kind::BFloat16);
            {
                let _off = Autocast::off(Device::Cpu).unwrap();
                assert_eq!(a.matmul(&b).kind(), Kind::Float);
            }
            assert_eq!(a.matmul(&b).kind(), Kind::BFloat16, "the inner guard restored the outer one");
            assert_eq!((a.matmul(&b).to_kind(Kind::Float) - 3.0).abs().max().double_value(&[]), 0.0);
        }
        assert_eq!(a.matmul(&b).kind(), Kind::Float);
    }

    /// Under autocast on the CPU, each product autocast lists (mm, bmm, matmul, addmm,
    /// baddbmm, addbmm, linear, with and without a bias) and conv1d, and the gradients its
    /// backward pass gives its operands, equal the float32 product of the operands rounded
    /// to the half precision, itself rounded once, as libtorch's half-precision products
    /// compute it: to the bit where lethe widens them (a CPU without the instructions),
    /// within a rounding elsewhere.
    #[test]
    fn autocast_products_on_the_cpu_are_the_rounded_float32_products() {
        let _seed = crate::rng::seed_torch(5);
        for (kind, guard) in
            [(Kind::BFloat16, Autocast::bf16 as fn(Device) -> Result<Autocast>), (Kind::Half, Autocast::f16)]
        {
            let exact = !half_products_native(kind);
            let leaf = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu)).set_requires_grad(true);
            let (a, b, c) = (leaf(&[3, 5, 7]), leaf(&[3, 7, 4]), leaf(&[5, 4]));
            let (m, n, bias, kernel) = (leaf(&[5, 7]), leaf(&[7, 4]), leaf(&[4]), leaf(&[4, 5, 3]));
            // Each product of the operands `t` = [a, b, c, m, n, bias, kernel].
            let product = |name: &str, t: &[&Tensor]| match name {
                "mm" => t[3].mm(t[4]),
                "bmm" => t[0].bmm(t[1]),
                "matmul" => t[0].matmul(t[1]),
                "addmm" => t[2].addmm(t[3], t[4]),
                "baddbmm" => t[2].baddbmm(t[0], t[1], 0.5, 2.0),
                "addbmm" => t[2].addbmm(t[0], t[1]),
                "linear" => t[3].linear(&t[4].tr(), Some(t[5])),
                "conv1d" => t[0].conv1d(t[6], Some(t[5]), [2], [1], [1], 1),
                _ => t[3].linear::<&Tensor>(&t[4].tr(), None),
            };
            let inputs = [&a, &b, &c, &m, &n, &bias, &kernel];
            for name in ["mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "linear", "linear without bias", "conv1d"]
            {
                let got = {
                    let _on = guard(Device::Cpu).unwrap();
                    product(name, &inputs)
                };
                assert_eq!(got.kind(), kind, "{name}");
                let rounded = |t: &Tensor| t.detach().to_kind(kind).to_kind(Kind::Float).set_requires_grad(true);
                let copies: Vec<Tensor> = inputs.iter().map(|t| rounded(t)).collect();
                let copies: Vec<&Tensor> = copies.iter().collect();
                let want = product(name, &copies);
                let gap = |x: &Tensor, y: &Tensor| {
                    (x.to_kind(Kind::Float) - y.to_kind(Kind::Float)).abs().max().double_value(&[])
                };
                let within = if exact { 0.0 } else { 0.05 };
                let value_gap = gap(&got, &want.to_kind(kind));
                assert!(value_gap <= within, "{kind:?} {name}: the product differs by {value_gap:e}");
                // The backward pass: the same upstream gradient through both; each operand's
                // gradient rounded to the half precision, as the casts round it.
                let upstream = Tensor::randn(got.size(), (Kind::Float, Device::Cpu));
                let grads = Tensor::run_backward(&[got.to_kind(Kind::Float) * &upstream], &inputs, true, false);
                let upstream_rounded = upstream.to_kind(kind).to_kind(Kind::Float);
                let wants = Tensor::run_backward(
                    &[want.to_kind(kind).to_kind(Kind::Float) * upstream_rounded],
                    &copies,
                    false,
                    false,
                );
                for (i, (g, w)) in grads.iter().zip(&wants).enumerate() {
                    if !g.defined() || !w.defined() {
                        assert_eq!(g.defined(), w.defined(), "{kind:?} {name}: operand {i}'s gradient");
                        continue;
                    }
                    let grad_gap = gap(g, &w.to_kind(kind));
                    assert!(
                        grad_gap <= within * 4.0,
                        "{kind:?} {name}: operand {i}'s gradient differs by {grad_gap:e}"
                    );
                }
            }
        }
    }

    /// Autocast casts no float64 operand: under it, a product of float64 tensors (`linear`,
    /// `mm`) is float64's own, not widened and rounded to the half precision.
    #[test]
    fn autocast_leaves_float64_products_alone() {
        let _seed = crate::rng::seed_torch(6);
        let x = Tensor::randn([5, 7], (Kind::Double, Device::Cpu));
        let w = Tensor::randn([4, 7], (Kind::Double, Device::Cpu));
        let want = x.mm(&w.tr());
        for kind_guard in [Autocast::bf16 as fn(Device) -> Result<Autocast>, Autocast::f16] {
            let _on = kind_guard(Device::Cpu).unwrap();
            let got = x.linear::<&Tensor>(&w, None);
            assert_eq!(got.kind(), Kind::Double);
            assert_eq!((got - &want).abs().max().double_value(&[]), 0.0);
            assert_eq!(x.mm(&w.tr()).kind(), Kind::Double);
        }
    }

    #[test]
    fn devices_are_named_as_the_flag_takes_them() {
        assert_eq!(name(Device::Cpu), "cpu");
        assert_eq!(name(Device::Cuda(1)), "cuda:1");
        assert_eq!(gpu_memory(Device::Cpu), None, "no GPU figures for the CPU");
        assert_eq!(parse(&name(Device::Cpu)).unwrap(), Device::Cpu);
    }

    /// The CUDA backend is looked for beside the libtorch that was loaded, not only where
    /// lethe was built: the folder comes from the mapped `libtorch_cpu.so`.
    #[test]
    fn the_loaded_libtorch_is_found_in_the_process_maps() {
        let maps = "7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\n\
                    7f20-7f30 r--p 00000000 08:01 34 /opt/torch/lib/libtorch_cpu.so\n\
                    7f40-7f50 rw-p 00000000 00:00 0 \n";
        assert_eq!(libtorch_dir_in_maps(maps), Some(std::path::PathBuf::from("/opt/torch/lib")));
        assert_eq!(libtorch_dir_in_maps("7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\n"), None);
        // This process has libtorch mapped: its folder holds the library.
        let here = loaded_libtorch_dir().expect("libtorch_cpu.so is mapped");
        assert!(here.join("libtorch_cpu.so").exists(), "{}", here.display());
    }
}
