//! Stage 5: the native TensorRT backend's own parts: the bound C API (`include/trtcache_trt.h`), the
//! run-time loader of the shim that implements it, a safe wrapper over it, and what a `trt`
//! artifact is made of (`engine.plan` plus `engine.json`), its key parts, the shared timing
//! cache per (GPU SKU, TensorRT version) and the Triton model-repository export.
//!
//! Data enters as ONNX bytes (plus the external-data folder) and build options; it leaves as
//! a serialized engine, its metadata, key contributions for [`crate::key::KeyParts`] and
//! files on disk. The `trt` backend that runs a build and validates it is
//! `crate::builder::backends::trt`; this module imports neither `builder` nor `key` (the key stage asks it
//! for the loaded TensorRT's version). Nothing here links TensorRT: [`Trt::load`] opens `libtrtcache_trt.so` (built
//! from `shim/trtcache_trt.cpp` on a host with TensorRT) at run time, so one binary runs with
//! and without TensorRT, and without it [`Trt::load`] says exactly what is missing.
//!
//! **Never run against TensorRT.** The machines this was written on have no GPU and no
//! TensorRT: the shim was only compiled (against TensorRT 10.16.1 and 11.1 headers), and the
//! Rust side is tested against a C test double (`shim/double/`) that implements the header
//! with canned behaviour. See `docs/trt.md`.

mod api;
pub mod artifact;
mod elf;
mod error;
pub mod incoming;
pub mod inspect;
pub mod keys;
pub mod loader;
pub mod timing;
pub mod triton;
mod types;

pub use api::{Engine, Network, Trt};
pub use error::{Missing, Status, TrtError};
pub use loader::LoaderConfig;
pub use types::{
    BuildOptions, Built, DType, HostTensor, HwCompat, IoInfo, Precision, SubgraphSupport,
    SupportReport, TensorInfo, TrtVersion,
};

/// The shim's file name.
pub const SHIM_FILE: &str = "libtrtcache_trt.so";
/// Environment variable naming the shim's path.
pub const SHIM_ENV: &str = "TRTCACHE_TRT_SHIM";

/// The bindgen output over `include/trtcache_trt.h` (`build.rs`): constants, the C structs,
/// and `TrtShim`, a struct of function pointers loaded from the shim by name.
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all
)]
pub mod ffi {
    include!(concat!(env!("OUT_DIR"), "/trtcache_trt.rs"));
}
