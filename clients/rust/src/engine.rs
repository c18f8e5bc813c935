//! A `trt` artifact's TensorRT engine: the descriptor of `engine.plan` (what
//! `IRuntime::deserializeCudaEngine`, `trtexec --loadEngine` and Triton load) and its
//! metadata, `engine.json` (written by the daemon's `trt` backend; docs/trt.md).

use std::fs::File;
use std::io::{Read, Seek};
use std::path::PathBuf;

use serde::Deserialize;

use crate::client::Artifact;

/// The engine file's name in a `trt` artifact.
pub const PLAN_FILE: &str = "engine.plan";
/// The metadata file's name in a `trt` artifact.
pub const META_FILE: &str = "engine.json";

/// Why an engine accessor failed.
#[derive(Debug)]
pub enum EngineError {
    /// The artifact is not a `trt` engine (an `ort-*` backend's ONNX model).
    NotAnEngine {
        /// The backend that built it.
        backend: String,
    },
    /// The artifact lacks one of its files (an older or foreign daemon).
    Missing(&'static str),
    /// Reading a descriptor failed.
    Io(std::io::Error),
    /// `engine.json` is not engine metadata.
    Json(serde_json::Error),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::NotAnEngine { backend } => write!(
                f,
                "the artifact was built by {backend}: an ONNX model, not a TensorRT engine (acquire backend `trt`)"
            ),
            EngineError::Missing(name) => write!(f, "the trt artifact has no {name}"),
            EngineError::Io(e) => write!(f, "reading the engine: {e}"),
            EngineError::Json(e) => write!(f, "{META_FILE}: {e}"),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Io(e) => Some(e),
            EngineError::Json(e) => Some(e),
            _ => None,
        }
    }
}

/// One engine I/O tensor.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct EngineTensor {
    /// Tensor name.
    pub name: String,
    /// Element type as TensorRT names it here (`float32`, `float16`, `int64`, …).
    pub dtype: String,
    /// Dimensions; -1 for a dynamic one (set it within a profile's range).
    pub shape: Vec<i64>,
}

/// One optimization profile: per input, the min/opt/max shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct EngineProfile {
    /// The profile's name in the model's sidecar (or `flags`).
    #[serde(default)]
    pub name: String,
    /// Smallest shape per input.
    pub min: std::collections::BTreeMap<String, Vec<i64>>,
    /// The shape TensorRT tuned for.
    pub opt: std::collections::BTreeMap<String, Vec<i64>>,
    /// Largest shape per input.
    pub max: std::collections::BTreeMap<String, Vec<i64>>,
}

/// What `engine.json` says about an engine.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct EngineMeta {
    /// The TensorRT version that built it (an engine loads only on that version).
    pub tensorrt_version: String,
    /// The GPU it was built on.
    pub gpu: String,
    /// Its compute capability (`9.0`).
    pub compute_capability: Option<String>,
    /// `none`, `ampere-plus` or `same-compute-capability`.
    pub hardware_compatibility: String,
    /// TensorRT's precision flags (`fp16`, `int8`, … as booleans).
    pub precision: serde_json::Value,
    /// The optimization profiles, in engine order (profile index = position).
    pub profiles: Vec<EngineProfile>,
    /// Input tensors.
    pub inputs: Vec<EngineTensor>,
    /// Output tensors.
    pub outputs: Vec<EngineTensor>,
    /// Size of `engine.plan`.
    pub plan_bytes: u64,
    /// SHA-256 of `engine.plan`, lower-case hex.
    pub plan_sha256: String,
}

impl Artifact {
    fn engine_part(&self, name: &'static str) -> Result<&File, EngineError> {
        if self.metadata.backend != "trt" {
            return Err(EngineError::NotAnEngine {
                backend: self.metadata.backend.clone(),
            });
        }
        self.metadata
            .files
            .iter()
            .zip(&self.files)
            .find(|(m, _)| m.name == name)
            .map(|(_, f)| f)
            .ok_or(EngineError::Missing(name))
    }

    /// The open, read-only descriptor of a `trt` artifact's serialized engine.
    pub fn engine_file(&self) -> Result<&File, EngineError> {
        self.engine_part(PLAN_FILE)
    }

    /// `/proc/self/fd/N` of the engine, for APIs that take a path; valid while this
    /// artifact lives.
    pub fn engine_proc_path(&self) -> Result<PathBuf, EngineError> {
        use std::os::fd::AsRawFd;
        let f = self.engine_file()?;
        Ok(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
    }

    /// The serialized engine's bytes (for `IRuntime::deserializeCudaEngine`).
    pub fn engine_bytes(&self) -> Result<Vec<u8>, EngineError> {
        read_all(self.engine_file()?)
    }

    /// The engine's metadata: TensorRT version, GPU, profiles, I/O tensors.
    pub fn engine_meta(&self) -> Result<EngineMeta, EngineError> {
        let bytes = read_all(self.engine_part(META_FILE)?)?;
        serde_json::from_slice(&bytes).map_err(EngineError::Json)
    }
}

fn read_all(mut f: &File) -> Result<Vec<u8>, EngineError> {
    f.rewind().map_err(EngineError::Io)?;
    let mut out = Vec::new();
    f.read_to_end(&mut out).map_err(EngineError::Io)?;
    Ok(out)
}
