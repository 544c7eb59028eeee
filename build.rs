//! Embeds an rpath to the libtorch that torch-sys linked against, so that the `lethe`
//! binary (and the test binaries) find `libtorch_cpu.so` without `LD_LIBRARY_PATH`,
//! and records that folder for loading the CUDA backend at run time.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        // For `device::load_cuda_backend`: the linker's --as-needed drops libtorch_cuda,
        // so lethe loads it itself when a GPU is asked for.
        println!("cargo:rustc-env=LETHE_LIBTORCH_LIB={lib}");
    }
}
