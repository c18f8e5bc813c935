//! Build script: binds the project's TensorRT C API and, where TensorRT is installed, builds
//! the shim that implements it.
//!
//! 1. **Always**: bindgen over `include/trtcache_trt.h` writes `$OUT_DIR/trtcache_trt.rs`, the
//!    Rust declarations that `src/trt/mod.rs` includes as the module `trt::ffi`. They are
//!    generated as a struct of function pointers loaded by name from the shim at run time
//!    (bindgen's dynamic-library mode with every symbol required), so the header and the Rust
//!    side agree on every build, and the binary never links TensorRT. Needs libclang
//!    (`apt install libclang-dev`).
//! 2. **When TensorRT's headers are found** (`$TENSORRT_ROOT/include`, else
//!    `/usr/include/x86_64-linux-gnu` or `/usr/include`) together with its libraries and the CUDA
//!    runtime: compiles `shim/trtcache_trt.cpp` into `libtrtcache_trt.so` and places it next
//!    to the binaries (`target/<profile>/`), where the run-time loader looks. When TensorRT is
//!    not there it builds no shim and says why in one cargo warning if `TENSORRT_ROOT` was set
//!    (a host without TensorRT is the normal case, not worth a warning). When TensorRT is
//!    there but the compiler fails, it **always** warns, with the compiler's first errors, and
//!    removes a shim an earlier build left next to the binaries (it would be stale).
//!    `TRTCACHE_BUILD_SHIM=0` skips this step.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=include/trtcache_trt.h");
    println!("cargo:rerun-if-changed=shim/trtcache_trt.cpp");
    for v in [
        "TENSORRT_ROOT",
        "CUDA_HOME",
        "CUDA_PATH",
        "TRTCACHE_BUILD_SHIM",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    bind(&out);
    if env::var("TRTCACHE_BUILD_SHIM").as_deref() != Ok("0") {
        match build_shim(&out) {
            Ok(()) => {}
            Err(ShimError::NotFound(why)) => {
                if env::var_os("TENSORRT_ROOT").is_some() {
                    println!("cargo:warning=TensorRT shim not built: {why}");
                }
            }
            Err(ShimError::Failed(why)) => {
                // Whatever the environment: TensorRT is here and the shim does not compile.
                for line in why.lines() {
                    println!("cargo:warning={line}");
                }
            }
        }
    }
}

/// Why no shim was built.
enum ShimError {
    /// TensorRT or CUDA is not installed where looked (normal on most hosts).
    NotFound(String),
    /// Everything was found and compiling or placing the shim failed.
    Failed(String),
}

impl From<&str> for ShimError {
    fn from(s: &str) -> Self {
        ShimError::NotFound(s.to_string())
    }
}

impl From<String> for ShimError {
    fn from(s: String) -> Self {
        ShimError::NotFound(s)
    }
}

/// Most compiler lines repeated as cargo warnings.
const MAX_COMPILER_LINES: usize = 20;

fn bind(out: &Path) {
    // bindgen panics when it cannot load libclang, and returns an error when the header does
    // not parse: either way, one message that says what to install, not a backtrace.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let generated = std::panic::catch_unwind(generate);
    std::panic::set_hook(default_hook);
    let why = match generated {
        Ok(Ok(bindings)) => {
            bindings
                .write_to_file(out.join("trtcache_trt.rs"))
                .expect("writing the TensorRT bindings to OUT_DIR");
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    };
    eprintln!(
        "error: bindgen over include/trtcache_trt.h failed: {why}\n\
         trtcache's build needs libclang for the TensorRT bindings (not TensorRT itself): \
         `apt-get install libclang-dev`, or set LIBCLANG_PATH to the folder that holds \
         libclang.so"
    );
    std::process::exit(1);
}

fn generate() -> Result<bindgen::Bindings, bindgen::BindgenError> {
    bindgen::Builder::default()
        .header("include/trtcache_trt.h")
        .allowlist_function("trtcache_trt_.*")
        .allowlist_type("trtcache_trt_.*")
        .allowlist_var("TRTCACHE_TRT_.*")
        .dynamic_library_name("TrtShim")
        .dynamic_link_require_all(true)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .layout_tests(true)
        .generate()
}

/// Compiles the shim when TensorRT and CUDA are installed; `Err` says what is missing or what
/// failed.
fn build_shim(out: &Path) -> Result<(), ShimError> {
    let root = env::var_os("TENSORRT_ROOT").map(PathBuf::from);
    let (inc, libdir) = match &root {
        Some(r) => (r.join("include"), r.join("lib")),
        None => {
            let inc = [
                "/usr/include/x86_64-linux-gnu",
                "/usr/include/aarch64-linux-gnu",
                "/usr/include",
            ]
            .iter()
            .map(PathBuf::from)
            .find(|d| d.join("NvInfer.h").is_file())
            .ok_or("no NvInfer.h in /usr/include (set TENSORRT_ROOT)")?;
            let lib = [
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu",
                "/usr/lib64",
                "/usr/lib",
            ]
            .iter()
            .map(PathBuf::from)
            .find(|d| has_lib(d, "libnvinfer.so"))
            .ok_or("no libnvinfer.so next to the system headers")?;
            (inc, lib)
        }
    };
    for h in ["NvInfer.h", "NvOnnxParser.h", "NvInferVersion.h"] {
        if !inc.join(h).is_file() {
            return Err(format!("{} not found", inc.join(h).display()).into());
        }
        println!("cargo:rerun-if-changed={}", inc.join(h).display());
    }
    for l in ["libnvinfer.so", "libnvonnxparser.so"] {
        if !has_lib(&libdir, l) {
            return Err(format!("{}/{l} not found", libdir.display()).into());
        }
    }
    let cuda = [env::var_os("CUDA_HOME"), env::var_os("CUDA_PATH")]
        .into_iter()
        .flatten()
        .map(PathBuf::from)
        .chain([PathBuf::from("/usr/local/cuda")])
        .find(|c| c.join("include/cuda_runtime_api.h").is_file())
        .ok_or("no CUDA runtime headers (set CUDA_HOME to a CUDA toolkit)")?;
    let cuda_lib = ["lib64", "lib", "targets/x86_64-linux/lib"]
        .iter()
        .map(|l| cuda.join(l))
        .find(|d| has_lib(d, "libcudart.so"))
        .ok_or_else(|| format!("no libcudart.so under {}", cuda.display()))?;

    let compiler = cc::Build::new().cpp(true).get_compiler();
    let so = out.join("libtrtcache_trt.so");
    // OUT_DIR is target/<profile>/build/trtcache-<hash>/out: the binaries are three up.
    let dest = out.ancestors().nth(3).map(|d| d.join("libtrtcache_trt.so"));
    let output = compiler
        .to_command()
        .args([
            "-std=c++17",
            "-O2",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wno-deprecated-declarations",
        ])
        .arg("-Iinclude")
        .arg("-isystem")
        .arg(&inc)
        .arg("-isystem")
        .arg(cuda.join("include"))
        .arg("shim/trtcache_trt.cpp")
        .arg("-o")
        .arg(&so)
        .arg(format!("-L{}", libdir.display()))
        .arg(format!("-L{}", cuda_lib.display()))
        // Recorded as dependencies even where the toolchain links --as-needed, so the loader's
        // message names a missing TensorRT library rather than a missing symbol.
        .args([
            "-Wl,--no-as-needed",
            "-lnvinfer",
            "-lnvonnxparser",
            "-lcudart",
        ])
        .output()
        .map_err(|e| {
            ShimError::Failed(format!(
                "TensorRT shim not built: running the C++ compiler: {e}"
            ))
        })?;
    if !output.status.success() {
        let stale = match &dest {
            Some(d) if std::fs::remove_file(d).is_ok() => {
                format!(" (removed the stale {})", d.display())
            }
            _ => String::new(),
        };
        let diag = String::from_utf8_lossy(&output.stderr);
        let mut lines: Vec<&str> = diag.lines().filter(|l| l.contains("error")).collect();
        if lines.is_empty() {
            lines = diag.lines().collect();
        }
        lines.truncate(MAX_COMPILER_LINES);
        return Err(ShimError::Failed(format!(
            "TensorRT shim not built: compiling shim/trtcache_trt.cpp against the TensorRT \
             headers in {} failed ({}){stale}; the compiler said:\n{}",
            inc.display(),
            output.status,
            lines.join("\n")
        )));
    }
    if let Some(dest) = dest {
        std::fs::copy(&so, &dest).map_err(|e| {
            ShimError::Failed(format!(
                "TensorRT shim not built: copying to {}: {e}",
                dest.display()
            ))
        })?;
    }
    Ok(())
}

fn has_lib(dir: &Path, name: &str) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(name))
}
