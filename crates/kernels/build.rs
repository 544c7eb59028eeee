//! Embeds an rpath to the libtorch that torch-sys linked against, so that this crate's
//! test binaries find `libtorch_cpu.so` without `LD_LIBRARY_PATH` (the other crates do the
//! same in `rpath.rs`), records that folder for loading the CUDA backend at run time
//! ([`LIBTORCH_LIB`](crate::LIBTORCH_LIB)), and compiles lethe's
//! C++ against the same libtorch's headers: `csrc/dist.cpp`, the bridge to c10d, and
//! `csrc/expire_scores.cpp` and `csrc/expire_attend.cpp`, Expire-Span's fused and ragged
//! attention (their score rows in `csrc/expire_rows.h`), `csrc/expire_bias.cpp`,
//! its attention bias for the GPU, and `csrc/expire_forget.cpp`, its deletion after a block on the GPU
//! (the kernels themselves are `csrc/cuda/`, built apart by `scripts/build-cuda.sh`), `csrc/compact.cpp`,
//! the compaction of its cache, `csrc/cache_grad.cpp`, the gradient of the keys and
//! values for the block's rows only and the ragged projection (with `csrc/blas.h` and
//! `csrc/shares.h`, shared with the ragged attention), `csrc/chunks.cpp`, the attention chunks'
//! narrows as one autograd node, `csrc/skew.cpp`, the relative positions' skew, `csrc/expectation.cpp`, the
//! ∞-former's densities against its basis,
//! `csrc/adam.cpp`, the optimiser's update, `csrc/context.cpp`, libtorch's global
//! settings, and `csrc/widened.cpp`, autocast's products on a CPU without half-precision
//! instructions.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        panic!("torch-sys did not say where libtorch is (DEP_TCH_LIBTORCH_LIB): run `. scripts/env.sh` first");
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // For lethe-core's `device::load_cuda_backend`: the linker's --as-needed drops libtorch_cuda,
    // so lethe loads it itself when a GPU is asked for.
    println!("cargo:rustc-env=LETHE_LIBTORCH_LIB={lib}");
    compile_csrc(std::path::Path::new(&lib));
}

/// The C++ parts: libtorch's headers (beside its `lib` folder, as in the torch wheel)
/// and the Gloo headers in `csrc/third_party`, which the wheel leaves out.
fn compile_csrc(lib: &std::path::Path) {
    let include = lib.parent().map(|p| p.join("include")).filter(|p| p.join("torch").is_dir());
    let Some(include) = include else {
        panic!(
            "no libtorch headers beside {}: lethe needs the include folder of the torch wheel or libtorch archive",
            lib.display()
        );
    };
    cc::Build::new()
        .cpp(true)
        .file("csrc/adam.cpp")
        .file("csrc/cache_grad.cpp")
        .file("csrc/chunks.cpp")
        .file("csrc/compact.cpp")
        .file("csrc/context.cpp")
        .file("csrc/decode.cpp")
        .file("csrc/dist.cpp")
        .file("csrc/expectation.cpp")
        .file("csrc/expire_attend.cpp")
        .file("csrc/expire_bias.cpp")
        .file("csrc/expire_forget.cpp")
        .file("csrc/expire_scores.cpp")
        .file("csrc/skew.cpp")
        .file("csrc/trace.cpp")
        .file("csrc/widened.cpp")
        // libtorch's and Gloo's headers are system headers: their warnings are not ours.
        .flag("-isystem")
        .flag(include.to_string_lossy().as_ref())
        .flag("-isystem")
        .flag(include.join("torch/csrc/api/include").to_string_lossy().as_ref())
        .flag("-isystem")
        .flag("csrc/third_party")
        .flag("-std=c++17")
        // libtorch's `at::parallel_for` is a template in its headers that spreads the
        // work over OpenMP threads only where `_OPENMP` is defined: without this flag
        // the fused Expire-Span kernel ran on one thread while libtorch's others waited.
        .flag("-fopenmp")
        // No fused multiply-adds but the ones written out: the vector loops keep the bits
        // of the plain ones only if each product is rounded before it is added (GCC fuses
        // them by default wherever a function's target has FMA).
        .flag("-ffp-contract=off")
        .define("USE_C10D_GLOO", None)
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        // lethe's own C++ compiles clean: every warning is an error.
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("lethe_csrc");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    // The OpenMP runtime of `-fopenmp`: at run time the loader finds libtorch's own
    // `libgomp.so.1` first (the rpath above), so there is one thread pool.
    println!("cargo:rustc-link-lib=dylib=gomp");
}
