//! Build script: nothing to compile or bind yet. The native TensorRT shim (a small C header
//! in `include/`, bound with bindgen here) is a later step; every backend currently goes
//! through ONNX Runtime, loaded at run time.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=include");
}
