//! What a consumer is told of an acquired artifact, and of a build's progress and
//! outcome.

use serde::{Deserialize, Serialize};

use super::{ErrorCode, VariantState};

/// Name, element type and shape of one input or output; dynamic dims are names or `-1`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Element type, e.g. `float32`.
    pub dtype: String,
    /// Dims: numbers, or strings for named dynamic dims.
    pub shape: Vec<serde_json::Value>,
}

/// How an artifact was validated before it was stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    /// Passed (an artifact that failed is never served).
    pub passed: bool,
    /// How: e.g. `ort-cpu session created` or `compared to reference on seeded inputs`.
    pub method: String,
    /// Largest absolute error against the reference, when outputs were compared.
    #[serde(default)]
    pub max_abs_err: Option<f64>,
    /// Largest relative error against the reference, when outputs were compared.
    #[serde(default)]
    pub max_rel_err: Option<f64>,
    /// Input name → the shape validation ran it at (absent from daemons that predate it):
    /// whether the inputs exercised the model, at a glance.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub shapes: std::collections::BTreeMap<String, Vec<i64>>,
    /// Input name → the shape of the second validation run (every free batch axis doubled),
    /// when there was one.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub also_at: std::collections::BTreeMap<String, Vec<i64>>,
}

/// One file of an artifact; descriptors arrive in the order of [`ArtifactMeta::files`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactFile {
    /// `graph` (always first) or `external` (external data of the graph).
    pub role: String,
    /// Name the graph expects: for external data, its `location` relative to the graph.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// Everything a consumer needs to know about an acquired artifact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArtifactMeta {
    /// Model name.
    pub model: String,
    /// Model version.
    pub version: u64,
    /// Cache key (64 hex digits).
    pub key: String,
    /// Backend that built it.
    pub backend: String,
    /// Shape-profile name.
    pub profile: String,
    /// `fp32` or `fp16`.
    pub precision: String,
    /// Graph inputs.
    pub inputs: Vec<TensorInfo>,
    /// Graph outputs.
    pub outputs: Vec<TensorInfo>,
    /// Execution provider per partition, in graph order (e.g. `["CPUExecutionProvider"]`).
    pub providers: Vec<String>,
    /// How it was validated.
    pub validation: Validation,
    /// Files, graph first; one descriptor each.
    pub files: Vec<ArtifactFile>,
    /// Seconds since the Unix epoch when it was built.
    #[serde(default)]
    pub built_at: u64,
    /// Position, among the frame's descriptors, of a read-only descriptor of the directory
    /// holding every file of [`ArtifactMeta::files`] under its `name` (always
    /// `files.len()`, i.e. last). Present only when the request set
    /// [`AcquireRequest::dir_fd`](super::AcquireRequest::dir_fd) and the daemon could open the directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir_fd_index: Option<u32>,
    /// Session options measured for this artifact when it was built, for a consumer that
    /// does not choose its own (absent: none measured, ONNX Runtime's defaults suit it). The
    /// Python client's `session()` applies them unless given `sess_options`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_hints: Option<SessionHints>,
    /// The runtime libraries the artifact was built and validated with (its key's backend
    /// versions, e.g. `{"onnxruntime": "1.31.1"}`): a consumer on another version must not
    /// use it ([`Runtime::matches`](super::Runtime::matches)). Empty from a daemon that predates the field.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub runtime: std::collections::BTreeMap<String, String>,
}

/// Session options the build measured to suit an artifact ([`ArtifactMeta::session_hints`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHints {
    /// ONNX Runtime intra-op threads: `1` when the artifact ran no slower on one thread than
    /// on ONNX Runtime's default pool, on the validation inputs at build time (a model whose
    /// run is microseconds then skips creating the pool, and no pool thread spins after
    /// each run). Absent: ONNX Runtime's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_op_num_threads: Option<u32>,
    /// `true` when the artifact's session was created faster without prepacking its weights
    /// and its runs were no slower, at build time (`session.disable_prepacking = 1`: the
    /// session skips packing, and the memory of, weights its runs gain nothing from).
    /// [`crate::Artifact::session`] applies it. Absent: ONNX Runtime's default (prepack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_prepacking: Option<bool>,
}

/// A build progress event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Model name.
    pub model: String,
    /// Backend.
    pub backend: String,
    /// Profile.
    pub profile: String,
    /// Phase: `queued`, `planning`, `building`, `validating`, `storing`, `ready`, `failed`.
    pub phase: String,
    /// Milliseconds since the build request was received.
    pub elapsed_ms: u64,
}

/// The outcome of one variant's build.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuildResult {
    /// Model name.
    pub model: String,
    /// Backend.
    pub backend: String,
    /// Profile.
    pub profile: String,
    /// `ready` or `failed`.
    pub state: VariantState,
    /// Cache key when known.
    #[serde(default)]
    pub key: Option<String>,
    /// Served from the cache without building.
    #[serde(default)]
    pub cached: bool,
    /// Failure code.
    #[serde(default)]
    pub code: Option<ErrorCode>,
    /// Failure message.
    #[serde(default)]
    pub reason: Option<String>,
    /// Wall time of this variant's build (0 when cached).
    #[serde(default)]
    pub seconds: f64,
    /// The incoming runtime it was built for (`1.32.0`, or `tensorrt 10.17.0`); absent for
    /// the current runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}
