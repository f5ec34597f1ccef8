//! Build script shared by the crates whose binaries link libtorch.
//!
//! * adds an rpath to libtorch's directory, so built binaries run without `LD_LIBRARY_PATH`;
//! * links `libtorch_cuda` with `--no-as-needed` when the torch wheel ships it, so one build uses
//!   CUDA on a GPU machine and the CPU elsewhere (tch-rs issue #980).
//!
//! libtorch's directory comes from torch-sys (`DEP_TCH_LIBTORCH_LIB`), else from `LIBTORCH`.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let lib_dir = std::env::var_os("DEP_TCH_LIBTORCH_LIB")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("LIBTORCH").map(|p| PathBuf::from(p).join("lib")));
    let Some(lib_dir) = lib_dir else {
        println!("cargo:warning=libtorch directory unknown: binaries need LD_LIBRARY_PATH");
        return;
    };
    // Swapping the wheel in place (CPU ↔ CUDA) must relink.
    println!("cargo:rerun-if-changed={}", lib_dir.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    if lib_dir.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-search=native={}", lib_dir.display());
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
