//! The build script of every lethe crate but the kernels: embeds an rpath to the libtorch
//! that torch-sys linked against, so that the `lethe` binary and each crate's test
//! binaries find `libtorch_cpu.so` without `LD_LIBRARY_PATH` (a build script's link
//! arguments reach only its own crate's binaries, so each crate runs this one).
fn main() {
    // Rerun only when libtorch moves (cargo reruns a changed build script by itself).
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        panic!("torch-sys did not say where libtorch is (DEP_TCH_LIBTORCH_LIB): run `. scripts/env.sh` first");
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
}
