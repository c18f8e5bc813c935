//! The TensorRT layer's errors: what is missing on a host without TensorRT, and the shim's
//! statuses with its messages.

use std::fmt;
use std::path::PathBuf;

use super::ffi;

/// A status the shim returned (`trtcache_trt_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    InvalidArgument,
    ParseFailed,
    BuildFailed,
    DeserializeFailed,
    RunFailed,
    CudaFailed,
    Unsupported,
    OutOfMemory,
    Internal,
    /// A value this trtcache does not know (a newer shim).
    Unknown(u32),
}

impl Status {
    /// `None` for `TRTCACHE_TRT_OK`.
    pub fn from_raw(v: ffi::trtcache_trt_status) -> Option<Self> {
        Some(match v {
            ffi::trtcache_trt_status_TRTCACHE_TRT_OK => return None,
            ffi::trtcache_trt_status_TRTCACHE_TRT_INVALID_ARGUMENT => Status::InvalidArgument,
            ffi::trtcache_trt_status_TRTCACHE_TRT_PARSE_FAILED => Status::ParseFailed,
            ffi::trtcache_trt_status_TRTCACHE_TRT_BUILD_FAILED => Status::BuildFailed,
            ffi::trtcache_trt_status_TRTCACHE_TRT_DESERIALIZE_FAILED => Status::DeserializeFailed,
            ffi::trtcache_trt_status_TRTCACHE_TRT_RUN_FAILED => Status::RunFailed,
            ffi::trtcache_trt_status_TRTCACHE_TRT_CUDA_FAILED => Status::CudaFailed,
            ffi::trtcache_trt_status_TRTCACHE_TRT_UNSUPPORTED => Status::Unsupported,
            ffi::trtcache_trt_status_TRTCACHE_TRT_OUT_OF_MEMORY => Status::OutOfMemory,
            ffi::trtcache_trt_status_TRTCACHE_TRT_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Status::InvalidArgument => "invalid argument",
            Status::ParseFailed => "ONNX parse failed",
            Status::BuildFailed => "engine build failed",
            Status::DeserializeFailed => "deserialization failed",
            Status::RunFailed => "engine run failed",
            Status::CudaFailed => "CUDA error",
            Status::Unsupported => "not supported by this TensorRT",
            Status::OutOfMemory => "out of host memory",
            Status::Internal => "internal error",
            Status::Unknown(v) => return write!(f, "unknown status {v}"),
        };
        f.write_str(s)
    }
}

/// What a host lacks to run the native TensorRT backend, found by [`super::Trt::load`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// TensorRT libraries that could not be found or opened (`libnvinfer.so.10`, …), each with
    /// the loader's reason.
    pub libraries: Vec<(String, String)>,
    /// Where the shim was looked for, when it was not found.
    pub shim_searched: Vec<PathBuf>,
    /// The shim was found but could not be opened: its path and the loader's message (a
    /// missing dependency such as `libcudart.so.12` is named there).
    pub shim_unloadable: Option<(PathBuf, String)>,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.libraries.is_empty() {
            let names: Vec<&str> = self.libraries.iter().map(|(n, _)| n.as_str()).collect();
            let why: Vec<String> = self
                .libraries
                .iter()
                .map(|(n, w)| format!("{n}: {w}"))
                .collect();
            parts.push(format!(
                "TensorRT's {} not found ({})",
                names.join(" and "),
                why.join("; ")
            ));
        }
        if let Some((p, why)) = &self.shim_unloadable {
            parts.push(format!(
                "the TensorRT shim {} could not be opened: {why}",
                p.display()
            ));
        } else if !self.shim_searched.is_empty() {
            let looked: Vec<String> = self
                .shim_searched
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            parts.push(format!(
                "the TensorRT shim {} not found (looked at {})",
                super::SHIM_FILE,
                looked.join(", ")
            ));
        }
        let mut hints = Vec::new();
        if !self.libraries.is_empty() {
            // The major the names ask for (`libnvinfer.so.11`): the one a shim was linked against.
            let major = self
                .libraries
                .first()
                .and_then(|(n, _)| n.rsplit('.').next())
                .filter(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
                .unwrap_or("10");
            hints.push(format!(
                "install TensorRT {major} (NVIDIA's packages: `apt install libnvinfer{major} \
                 libnvonnxparsers{major} libnvinfer-dev libnvonnxparsers-dev` from the CUDA \
                 repository; or the wheel for the host's CUDA major, `pip install \
                 'tensorrt-cu13=={major}.*'` (or tensorrt-cu12), and set TENSORRT_ROOT to its \
                 `tensorrt_libs` folder)"
            ));
        }
        if self.shim_unloadable.is_some() || !self.shim_searched.is_empty() {
            hints.push(format!(
                "build the shim with `TENSORRT_ROOT=DIR cargo build --release` (it lands next \
                 to the binary) or point {} at it",
                super::SHIM_ENV
            ));
        }
        write!(
            f,
            "{}; {} (docs/trt.md)",
            parts.join("; "),
            hints.join(", then ")
        )
    }
}

/// Errors of the TensorRT layer.
#[derive(Debug, thiserror::Error)]
pub enum TrtError {
    /// TensorRT (or the shim) is not installed on this host.
    #[error("TensorRT is not available: {0}")]
    Unavailable(Missing),
    /// The shim speaks another version of `include/trtcache_trt.h`.
    #[error(
        "the TensorRT shim {path} implements C API version {found}, this trtcache needs \
         {expected}: rebuild it from this checkout (docs/trt.md)"
    )]
    AbiMismatch {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    /// The shim cannot run with the TensorRT on this host (linked against another or two
    /// majors, or the loaded library is of another major or older than its headers).
    #[error("the TensorRT shim {path} cannot be used: {reason} (docs/trt.md)")]
    ShimMismatch { path: PathBuf, reason: String },
    /// A call into the shim failed.
    #[error("TensorRT {call}: {status}: {message}")]
    Call {
        call: &'static str,
        status: Status,
        message: String,
    },
    /// Rust-side validation of an argument before it crosses the boundary.
    #[error("TensorRT: {0}")]
    InvalidArgument(String),
    /// The shim returned JSON this side cannot read.
    #[error("TensorRT {call}: malformed JSON from the shim: {source}")]
    Json {
        call: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A file of the artifact, timing cache or export.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The engine's outputs are over tolerance: it is never served.
    #[error("the engine failed validation and is not served: {0}")]
    ValidationFailed(String),
    /// An artifact on disk that does not hold together.
    #[error("{}: {what}", path.display())]
    BadArtifact { path: PathBuf, what: String },
}

impl TrtError {
    /// TensorRT refused the timing cache handed to a build (unreadable, or written on another
    /// device property set or TensorRT version): the build can go on without it.
    pub fn is_timing_cache_refusal(&self) -> bool {
        matches!(self, TrtError::Call { status: Status::DeserializeFailed, message, .. } if message.contains("timing cache"))
    }

    /// Whether this is the host's problem (TensorRT or the shim missing or mismatched), not
    /// the model's: such a failure is not remembered against the model.
    pub fn is_host_problem(&self) -> bool {
        matches!(
            self,
            TrtError::Unavailable(_) | TrtError::AbiMismatch { .. } | TrtError::ShimMismatch { .. }
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TrtError {
        let path = path.into();
        move |source| TrtError::Io { path, source }
    }
}
