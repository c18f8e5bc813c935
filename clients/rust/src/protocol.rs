//! The wire types shared by the daemon and every client: requests, responses, typed error
//! codes, and the metadata of an artifact. `docs/protocol.md` is the contract these follow.
//!
//! Every message is one frame (see [`crate::frame`]): a JSON object whose `op` (requests) or
//! `kind` (responses) field names the variant. Unknown fields are ignored, so a newer peer
//! may add optional fields without a version bump; removing or retyping one bumps
//! [`PROTOCOL_VERSION`].

use serde::{Deserialize, Serialize};

/// Version of this protocol; both sides send theirs in `hello` and the server refuses a
/// client whose version it does not speak.
pub const PROTOCOL_VERSION: u32 = 1;

/// The oldest client protocol version the server still accepts.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// Default largest frame (header JSON) in bytes; the daemon's limit is configurable.
pub const DEFAULT_MAX_FRAME: u32 = 1 << 20;

/// Every request name, so a server can tell an unknown request from a malformed one.
pub const REQUEST_OPS: &[&str] = &[
    "hello",
    "list",
    "status",
    "acquire",
    "build",
    "evict",
    "stats",
    "shutdown",
    "rescan",
    "cache_list",
    "cache_remove",
    "cache_gc",
    "cache_verify",
    "watch",
];

/// A request from a client; the first one on a connection must be [`Request::Hello`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Version handshake: the client's protocol version and a free-form name for logs.
    Hello {
        /// The client's [`PROTOCOL_VERSION`].
        version: u32,
        /// The client's name and version, e.g. `trtcache-client/0.1.0`.
        #[serde(default)]
        client: String,
    },
    /// Every model in the repository with its versions and per-variant state.
    List,
    /// One model's state.
    Status {
        /// Model name as it appears in the repository.
        model: String,
    },
    /// A ready artifact (metadata plus its files as descriptors), building it if asked to wait.
    Acquire(AcquireRequest),
    /// Enqueue builds (client priority) and stream [`Response::Progress`] until all are done.
    Build(BuildRequest),
    /// Admin: drop a model's artifacts (or one key) from the cache.
    Evict {
        /// Model whose artifacts to evict.
        #[serde(default)]
        model: Option<String>,
        /// One cache key (64 hex digits) to evict.
        #[serde(default)]
        key: Option<String>,
    },
    /// Counters: hits, misses, builds, failures, build seconds, queue depth.
    Stats {
        /// JSON (the default) or Prometheus text exposition.
        #[serde(default)]
        format: StatsFormat,
    },
    /// Admin: stop accepting, cancel builds, flush and exit.
    Shutdown,
    /// Subscribe to a model: answered with [`Response::Watching`], then a
    /// [`Response::WatchEvent`] each time the model's ready artifact changes, until the
    /// client closes the connection. The connection takes no other request afterwards.
    Watch {
        /// Model name as it appears in the repository.
        model: String,
    },
    /// Scan the repository now and report every model present, including files still being
    /// written; models whose files have settled are taken into the served set at once.
    Rescan,
    /// The daemon's cache: every record, most recently used first (`trtcache ls`).
    CacheList,
    /// Admin: remove one cache entry by key or unique prefix (`trtcache rm`).
    CacheRemove {
        /// 64 hex digits, or a unique prefix of at least 8.
        key: String,
    },
    /// Admin unless `dry_run`: evict least-recently-used entries to `max_bytes` and drop
    /// quarantined ones (`trtcache gc`).
    CacheGc {
        /// The size to evict down to, in bytes.
        max_bytes: u64,
        /// Report what would be evicted without deleting anything.
        #[serde(default)]
        dry_run: bool,
    },
    /// Admin: re-hash every stored artifact and quarantine the ones whose files changed
    /// (`trtcache verify`).
    CacheVerify,
}

/// What [`Request::Acquire`] asks for. [`Default`] is the wire's default: `wait: true`, the
/// rest unset (so `AcquireRequest { model, ..Default::default() }` waits for a build, as a
/// bare `{"op":"acquire","model":...}` does).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AcquireRequest {
    /// Model name in the repository (never a path).
    pub model: String,
    /// Triton version number; the newest when absent.
    #[serde(default)]
    pub version: Option<u64>,
    /// Shape-profile name; the model's default when absent.
    #[serde(default)]
    pub profile: Option<String>,
    /// Backend (`ort-cpu`, `ort-cuda`, `ort-tensorrt`); the daemon's default when absent.
    #[serde(default)]
    pub backend: Option<String>,
    /// Wait for a build when the artifact is not ready (otherwise `not_ready`).
    #[serde(default = "yes")]
    pub wait: bool,
    /// Longest wait in milliseconds; the daemon's build timeout when absent.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Also send a read-only descriptor of the artifact's directory (after the files'
    /// descriptors; see [`ArtifactMeta::dir_fd_index`]), so a consumer can open the graph as
    /// `/proc/self/fd/D/<name>` and ONNX Runtime finds the external data next to it. A
    /// daemon that predates this field ignores it and sends no directory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dir_fd: bool,
    /// The runtime the consumer will run the artifact with. The daemon then serves the
    /// artifact built for exactly that runtime (building it when none exists and the runtime
    /// is one it has), and never one built for another version; it answers
    /// [`ErrorCode::RuntimeUnavailable`] when it has no such runtime. Absent: the daemon's
    /// current runtime (what a consumer that does not say always got).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
}

/// A consumer's runtime: the library versions an artifact must have been built with for it.
/// A field left out matches any version of that library.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Runtime {
    /// ONNX Runtime's version, e.g. `1.31.1` (`onnxruntime.__version__`; Rust: the loaded
    /// library's, `session::loaded_onnxruntime` with the `ort` feature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onnxruntime: Option<String>,
    /// TensorRT's version, e.g. `10.16.0` (`trt` and `ort-tensorrt` artifacts; the daemon
    /// serves an incoming TensorRT's engines to a consumer naming its version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensorrt: Option<String>,
}

impl Runtime {
    /// An ONNX Runtime consumer of `version`.
    pub fn onnxruntime(version: impl Into<String>) -> Self {
        Runtime {
            onnxruntime: Some(version.into()),
            tensorrt: None,
        }
    }

    /// Whether an artifact built with library `versions` (its key's backend versions, e.g.
    /// `{"onnxruntime": "1.31.1"}`) is for this runtime: every library this runtime names
    /// that the artifact records is at the named version. A library the artifact does not
    /// record is one its backend does not build with (TensorRT for `ort-cpu`, ONNX Runtime
    /// for `trt`), which the daemon ignores too, so it cannot differ.
    pub fn matches(&self, versions: &std::collections::BTreeMap<String, String>) -> bool {
        let want = [
            ("onnxruntime", self.onnxruntime.as_deref()),
            ("tensorrt", self.tensorrt.as_deref()),
        ];
        want.iter().all(|(lib, v)| match (v, versions.get(*lib)) {
            (Some(v), Some(have)) => have == v,
            _ => true,
        })
    }

    /// `onnxruntime 1.30.0`, `tensorrt 10.16.0`, or `any runtime`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = &self.onnxruntime {
            parts.push(format!("onnxruntime {v}"));
        }
        if let Some(v) = &self.tensorrt {
            parts.push(format!("tensorrt {v}"));
        }
        if parts.is_empty() {
            "any runtime".into()
        } else {
            parts.join(", ")
        }
    }
}

fn yes() -> bool {
    true
}

impl Default for AcquireRequest {
    fn default() -> Self {
        AcquireRequest {
            model: String::new(),
            version: None,
            profile: None,
            backend: None,
            wait: yes(),
            timeout_ms: None,
            dir_fd: false,
            runtime: None,
        }
    }
}

/// What [`Request::Build`] asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BuildRequest {
    /// Models to build; every model in the repository when empty.
    #[serde(default)]
    pub models: Vec<String>,
    /// Backend; every configured backend when absent.
    #[serde(default)]
    pub backend: Option<String>,
    /// Longest wait in milliseconds for all builds together.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Admin (root or the daemon's user): model files outside the repository, by absolute
    /// path, to build into the cache, e.g. to warm a release before it is deployed. The
    /// daemon reads them with its own privileges, hence admin only; a sidecar
    /// `NAME.trtcache.toml` next to the file is used. Progress and results name the path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Admin: an ONNX Runtime library (a file) or a TensorRT install root (a folder), by
    /// absolute path, to build the models for instead of the current runtime, added to the
    /// daemon's incoming runtimes (`trtcache warm --runtime`, docs/daemon.md "Upgrading the
    /// runtime"). The daemon's workers load it, hence admin only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

/// Output format of [`Request::Stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatsFormat {
    /// [`Response::Stats`].
    #[default]
    Json,
    /// [`Response::StatsText`] in the Prometheus text exposition format.
    Prometheus,
}

/// A response from the daemon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// Answer to `hello`.
    Hello {
        /// The server's [`PROTOCOL_VERSION`].
        version: u32,
        /// Server name and version.
        server: String,
        /// Largest frame the server accepts, in bytes.
        max_frame: u32,
    },
    /// Answer to `list`.
    Models {
        /// Every model, sorted by name.
        models: Vec<ModelStatus>,
    },
    /// Answer to `status`.
    Status {
        /// The model's state.
        model: ModelStatus,
    },
    /// Answer to `acquire`: the frame carries `metadata.files.len()` descriptors, in order,
    /// then the directory's descriptor when `metadata.dir_fd_index` is set.
    Artifact {
        /// What the artifact is and how it was validated.
        metadata: ArtifactMeta,
    },
    /// A progress event of `build` (zero or more before [`Response::Built`]).
    Progress(Progress),
    /// Final answer to `build`.
    Built {
        /// One entry per model and variant.
        results: Vec<BuildResult>,
    },
    /// Answer to `evict`.
    Evicted {
        /// Number of artifacts removed.
        removed: u64,
    },
    /// Answer to `stats` in JSON.
    Stats {
        /// The counters.
        stats: Stats,
    },
    /// Answer to `stats` in Prometheus text.
    StatsText {
        /// Prometheus text exposition.
        text: String,
    },
    /// Answer to `shutdown`.
    ShuttingDown,
    /// Answer to `watch`: the model's state at the moment the subscription started (every
    /// change after it arrives as a [`Response::WatchEvent`]).
    Watching {
        /// The model's state.
        model: ModelStatus,
    },
    /// A change of a watched model's ready artifact (after [`Response::Watching`]).
    WatchEvent(WatchEvent),
    /// Answer to `rescan`.
    Rescanned(RescanReport),
    /// Answer to `cache_list`.
    CacheEntries {
        /// The daemon's cache directory.
        cache_dir: String,
        /// Every record as `trtcache ls --json` prints it (docs/cache.md), most recently
        /// used first.
        records: Vec<serde_json::Value>,
    },
    /// Answer to `cache_remove`.
    CacheRemoved {
        /// The daemon's cache directory.
        cache_dir: String,
        /// The full key removed.
        key: String,
    },
    /// Answer to `cache_gc`.
    CacheGc(CacheGcReport),
    /// Answer to `cache_verify`.
    CacheVerified(CacheVerifyReport),
    /// The request failed; the connection stays usable unless the code says otherwise.
    Error(ErrorBody),
}

/// What a `rescan` found in the repository.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RescanReport {
    /// The repository the daemon serves (canonical path).
    pub root: String,
    /// How long a model's files must keep their size and mtime to count as written
    /// (`limits.debounce_ms`).
    pub settle_ms: u64,
    /// Every model found, sorted by name.
    pub models: Vec<FoundModel>,
    /// Entries of the repository that are not models, each with the reason.
    #[serde(default)]
    pub skipped: Vec<SkippedEntry>,
}

/// One model a `rescan` found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoundModel {
    /// Repository name.
    pub name: String,
    /// Files the model is made of (every version).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// `true` once the daemon serves exactly these files (they kept their size and mtime for
    /// `settle_ms`); `false` while they are still changing.
    pub settled: bool,
}

/// A repository entry that is not a model, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedEntry {
    /// The entry's path.
    pub path: String,
    /// Why it is not served.
    pub reason: String,
}

/// What `cache_gc` evicted (or would have).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheGcReport {
    /// The daemon's cache directory.
    #[serde(default)]
    pub cache_dir: String,
    /// Nothing was deleted.
    pub dry_run: bool,
    /// The limit evicted down to.
    pub max_bytes: u64,
    /// Artifact bytes before.
    pub bytes_before: u64,
    /// Artifact bytes after.
    pub bytes_after: u64,
    /// Keys evicted (or that would be).
    pub evicted: Vec<String>,
}

/// What `cache_verify` found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheVerifyReport {
    /// The daemon's cache directory.
    #[serde(default)]
    pub cache_dir: String,
    /// Artifacts re-hashed.
    pub checked: u64,
    /// Artifacts whose files matched.
    pub ok: u64,
    /// (key, why) of every entry quarantined by this run.
    pub quarantined: Vec<(String, String)>,
}

/// A typed error on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, machine-readable.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

/// Machine-readable error codes. Clients match on these, never on messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame is not a JSON object with a string `op` (the connection stays open).
    BadFrame,
    /// The frame's length exceeds the server's limit (the connection is closed after this).
    FrameTooLarge,
    /// The `op` is not one this server knows.
    UnknownRequest,
    /// The request's fields do not match its `op`.
    BadRequest,
    /// `hello` was missing or the client's version is not supported.
    UnsupportedVersion,
    /// The model name is not a plain repository name (a path, `..`, empty, control chars).
    BadName,
    /// No such model, version, profile or backend in the repository.
    NotFound,
    /// The artifact is not ready and the client did not wait.
    NotReady,
    /// The build failed (and is memoised until the model or its config changes).
    BuildFailed,
    /// The build was cancelled (model replaced or removed, or daemon shutting down).
    Cancelled,
    /// The wait exceeded the timeout.
    Timeout,
    /// The request needs root or the daemon's user.
    PermissionDenied,
    /// Too many connections.
    Busy,
    /// The connection was idle longer than the server allows.
    /// Also sent when a request frame was not completed in time, or when an idle connection
    /// is closed to make room at the connection limit.
    IdleTimeout,
    /// The daemon is shutting down.
    ShuttingDown,
    /// The request named a runtime (`AcquireRequest::runtime`) the daemon has no library
    /// for, so it can neither serve nor build an artifact for it.
    RuntimeUnavailable,
    /// Anything else (I/O on the daemon's side, a bug).
    Internal,
}

impl ErrorCode {
    /// Every code, in declaration order (clients map each to their own error type).
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::BadFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnknownRequest,
        ErrorCode::BadRequest,
        ErrorCode::UnsupportedVersion,
        ErrorCode::BadName,
        ErrorCode::NotFound,
        ErrorCode::NotReady,
        ErrorCode::BuildFailed,
        ErrorCode::Cancelled,
        ErrorCode::Timeout,
        ErrorCode::PermissionDenied,
        ErrorCode::Busy,
        ErrorCode::IdleTimeout,
        ErrorCode::ShuttingDown,
        ErrorCode::RuntimeUnavailable,
        ErrorCode::Internal,
    ];

    /// The snake_case name used on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::UnknownRequest => "unknown_request",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::BadName => "bad_name",
            ErrorCode::NotFound => "not_found",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::BuildFailed => "build_failed",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Timeout => "timeout",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Busy => "busy",
            ErrorCode::IdleTimeout => "idle_timeout",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::RuntimeUnavailable => "runtime_unavailable",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// State of one variant (profile × backend × precision) of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VariantState {
    /// Not built and not queued.
    Missing,
    /// Waiting for a build slot.
    Queued,
    /// Being built.
    Building,
    /// Built, validated and in the cache.
    Ready,
    /// The last build failed (see `reason`).
    Failed,
}

impl std::fmt::Display for VariantState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VariantState::Missing => "missing",
            VariantState::Queued => "queued",
            VariantState::Building => "building",
            VariantState::Ready => "ready",
            VariantState::Failed => "failed",
        })
    }
}

/// One model in the repository.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelStatus {
    /// Repository name.
    pub name: String,
    /// The version served by default (the newest; 0 for a flat `NAME.onnx`).
    pub version: u64,
    /// Every version present, ascending.
    pub versions: Vec<u64>,
    /// `flat` or `triton`.
    pub layout: String,
    /// Per variant of the served version.
    pub variants: Vec<VariantStatus>,
}

/// One variant's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantStatus {
    /// Shape-profile name (`default` when the model declares none).
    pub profile: String,
    /// Backend name.
    pub backend: String,
    /// `fp32` or `fp16`.
    pub precision: String,
    /// Where it stands.
    pub state: VariantState,
    /// Cache key, once the model has been hashed.
    #[serde(default)]
    pub key: Option<String>,
    /// Why it failed (for `failed`).
    #[serde(default)]
    pub reason: Option<String>,
    /// The current build phase (for `building`).
    #[serde(default)]
    pub phase: Option<String>,
    /// Where the ready artifact came from (for `ready`): built by this daemon, found in its
    /// local cache, or fetched from the fleet tier. Absent from daemons that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// The incoming runtime this variant is built for (docs/daemon.md, "Upgrading the
    /// runtime"): an ONNX Runtime's version (`1.32.0`) or `tensorrt VERSION`; absent for the
    /// daemon's current runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// For `ready`: input name → the shape validation ran it at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validated_at: Option<std::collections::BTreeMap<String, Vec<i64>>>,
    /// For `ready`: input name → the shape of validation's second run (every free batch axis
    /// doubled), when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub also_validated_at: Option<std::collections::BTreeMap<String, Vec<i64>>>,
}

/// Where a ready artifact came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Built (and validated) by this daemon since it started.
    Built,
    /// Found in this host's cache.
    Local,
    /// Fetched from the fleet tier (S3) and verified against its signed manifest.
    Remote,
}

/// Why a [`WatchEvent`] was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchReason {
    /// A variant's artifact became ready (built, found in the cache or fetched: see
    /// [`WatchEvent::origin`]); [`WatchEvent::key`] is the key to acquire.
    Ready,
    /// The model's files changed (new content, a new version, a new sidecar): the artifacts
    /// of its old content are no longer served; a `ready` (or `failed`) event per variant
    /// follows once the new content is built. Model-wide: no profile, backend or key.
    Changed,
    /// The model left the repository. Model-wide. Should it come back, `changed` and
    /// `ready` events follow on the same subscription.
    Removed,
    /// A variant's artifact was evicted from the cache (the admin `evict` request); it is
    /// built again at the next acquire, then a `ready` event follows.
    Evicted,
    /// Building a variant's new content failed; [`WatchEvent::message`] says why.
    Failed,
    /// This watcher fell behind and events were dropped (`limits.watch_queue`): ask for
    /// `status` (or acquire) to learn the current state. Model-wide.
    Resync,
}

impl WatchReason {
    /// The snake_case name used on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            WatchReason::Ready => "ready",
            WatchReason::Changed => "changed",
            WatchReason::Removed => "removed",
            WatchReason::Evicted => "evicted",
            WatchReason::Failed => "failed",
            WatchReason::Resync => "resync",
        }
    }
}

impl std::fmt::Display for WatchReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A change of a watched model's ready artifact. Variant events (`ready`, `evicted`,
/// `failed`) name the profile and backend; model-wide ones (`changed`, `removed`, `resync`)
/// leave them out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// Model name.
    pub model: String,
    /// What happened.
    pub reason: WatchReason,
    /// The version the event is about (the served one); absent for `removed` and `resync`.
    #[serde(default)]
    pub version: Option<u64>,
    /// Shape-profile name of the variant; absent for model-wide events.
    #[serde(default)]
    pub profile: Option<String>,
    /// Backend of the variant; absent for model-wide events.
    #[serde(default)]
    pub backend: Option<String>,
    /// The variant's new ready key (for `ready`); absent when it has none.
    #[serde(default)]
    pub key: Option<String>,
    /// Where the ready artifact came from (for `ready`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Details for people: why a build failed, how many events a `resync` dropped.
    #[serde(default)]
    pub message: Option<String>,
}

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
    /// [`AcquireRequest::dir_fd`] and the daemon could open the directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir_fd_index: Option<u32>,
    /// Session options measured for this artifact when it was built, for a consumer that
    /// does not choose its own (absent: none measured, ONNX Runtime's defaults suit it). The
    /// Python client's `session()` applies them unless given `sess_options`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_hints: Option<SessionHints>,
    /// The runtime libraries the artifact was built and validated with (its key's backend
    /// versions, e.g. `{"onnxruntime": "1.31.1"}`): a consumer on another version must not
    /// use it ([`Runtime::matches`]). Empty from a daemon that predates the field.
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

/// Daemon counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Acquires answered with an artifact already in the cache (those through the ready
    /// index included).
    pub hits: u64,
    /// Of `hits`, artifacts taken through the ready index (a consumer opened the daemon's
    /// pointer instead of asking over the socket); absent (0) from daemons that predate it.
    #[serde(default)]
    pub fast_hits: u64,
    /// Acquires that had to wait for a build.
    pub misses: u64,
    /// Builds finished successfully: artifacts this daemon built and validated (never those
    /// fetched from the fleet bucket: `fetches`).
    pub builds: u64,
    /// Artifacts fetched from the fleet bucket (verified and stored) in place of a build;
    /// absent (0) from daemons that predate it.
    #[serde(default)]
    pub fetches: u64,
    /// Builds that failed (including timeouts).
    pub failures: u64,
    /// Builds cancelled.
    pub cancelled: u64,
    /// Total seconds spent in successful and failed builds.
    pub build_seconds: f64,
    /// Builds waiting for a slot.
    pub queue_depth: u64,
    /// Builds running.
    pub building: u64,
    /// Models served.
    pub models: u64,
    /// Open connections.
    pub connections: u64,
    /// Seconds since the daemon started.
    pub uptime_seconds: f64,
    /// Ready artifacts the daemon holds in memory (for the current models' plans); absent
    /// (0) from daemons that predate it.
    #[serde(default)]
    pub artifacts_in_memory: u64,
    /// Fleet tier: local misses answered from the bucket (0 without a `[remote]` tier).
    #[serde(default)]
    pub remote_hits: u64,
    /// Fleet tier: local misses the bucket could not answer.
    #[serde(default)]
    pub remote_misses: u64,
    /// Fleet tier: artifacts uploaded (signed) by this host.
    #[serde(default)]
    pub remote_uploads: u64,
    /// Fleet tier: manifests or blobs refused (unsigned, untrusted, edited, wrong bytes).
    #[serde(default)]
    pub remote_rejected: u64,
    /// Fleet tier: network or server errors (timeouts, 5xx, an open circuit breaker).
    #[serde(default)]
    pub remote_errors: u64,
    /// Fleet tier: why it is unreachable (its last operation failed, or its circuit breaker
    /// is open); absent while it answers, without a tier, and from daemons that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_down: Option<String>,
    /// Acquires answered with an error (`not_ready`, `not_found`, a failed build, ...).
    #[serde(default)]
    pub acquire_errors: u64,
    /// Artifacts evicted least-recently-used to keep the cache under its size limit.
    #[serde(default)]
    pub evictions: u64,
    /// Artifacts removed by `evict` requests.
    #[serde(default)]
    pub evictions_requested: u64,
}

/// Checks that a model name is a plain repository name: non-empty, at most 255 bytes, no
/// `/`, `\`, NUL or control characters, not `.` or `..`, not starting with `.`.
pub fn valid_model_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_with_op_tag() {
        let r = Request::Acquire(AcquireRequest {
            model: "m".into(),
            wait: true,
            ..Default::default()
        });
        let j = serde_json::to_string(&r).unwrap();
        assert!(j.contains("\"op\":\"acquire\""), "{j}");
        assert_eq!(serde_json::from_str::<Request>(&j).unwrap(), r);
        let minimal: Request = serde_json::from_str(r#"{"op":"acquire","model":"m"}"#).unwrap();
        assert_eq!(minimal, r, "wait defaults to true");
        let Request::Acquire(defaulted) = minimal else {
            unreachable!()
        };
        assert_eq!(
            defaulted,
            AcquireRequest {
                model: "m".into(),
                ..Default::default()
            },
            "AcquireRequest::default() is the wire's default"
        );
        assert!(AcquireRequest::default().wait);
    }

    #[test]
    fn error_codes_are_snake_case_on_the_wire() {
        let e = Response::Error(ErrorBody {
            code: ErrorCode::BadName,
            message: "x".into(),
        });
        let j = serde_json::to_string(&e).unwrap();
        assert!(j.contains("\"code\":\"bad_name\""), "{j}");
        assert_eq!(ErrorCode::FrameTooLarge.as_str(), "frame_too_large");
        for c in ErrorCode::ALL {
            let wire = serde_json::to_string(c).unwrap();
            assert_eq!(wire, format!("\"{}\"", c.as_str()));
        }
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn watch_frames_round_trip() {
        let r: Request = serde_json::from_str(r#"{"op":"watch","model":"m"}"#).unwrap();
        assert_eq!(r, Request::Watch { model: "m".into() });
        assert!(REQUEST_OPS.contains(&"watch"));
        let ev = Response::WatchEvent(WatchEvent {
            model: "m".into(),
            reason: WatchReason::Ready,
            version: Some(2),
            profile: Some("default".into()),
            backend: Some("ort-cpu".into()),
            key: Some("ab".repeat(32)),
            origin: Some(Origin::Built),
            message: None,
        });
        let j = serde_json::to_string(&ev).unwrap();
        assert!(
            j.contains(r#""kind":"watch_event""#) && j.contains(r#""reason":"ready""#),
            "{j}"
        );
        assert_eq!(serde_json::from_str::<Response>(&j).unwrap(), ev);
        // A model-wide event from a peer that leaves the optional fields out.
        let bare: Response =
            serde_json::from_str(r#"{"kind":"watch_event","model":"m","reason":"resync"}"#)
                .unwrap();
        let Response::WatchEvent(e) = bare else {
            unreachable!()
        };
        assert_eq!(
            (e.reason, e.key, e.profile),
            (WatchReason::Resync, None, None)
        );
        assert_eq!(WatchReason::Evicted.to_string(), "evicted");
    }

    #[test]
    fn names_that_are_paths_are_invalid() {
        for bad in [
            "",
            "..",
            "../x",
            "/etc/passwd",
            "a/b",
            ".hidden",
            "a\\b",
            "a\nb",
        ] {
            assert!(!valid_model_name(bad), "{bad:?}");
        }
        for good in ["resnet50", "tiny_encoder", "bert-base.v2"] {
            assert!(valid_model_name(good), "{good:?}");
        }
    }
}

#[cfg(test)]
mod runtime_tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_runtime_matches_only_artifacts_built_with_its_versions() {
        let built = |v: &str| BTreeMap::from([("onnxruntime".to_string(), v.to_string())]);
        let rt = Runtime::onnxruntime("1.31.1");
        assert!(rt.matches(&built("1.31.1")));
        assert!(!rt.matches(&built("1.30.0")));
        assert!(
            !rt.matches(&BTreeMap::from([
                ("onnxruntime".to_string(), "1.30.0".to_string()),
                ("tensorrt".to_string(), "10.16.0".to_string())
            ])),
            "an ort-tensorrt artifact of another onnxruntime"
        );
        assert!(
            Runtime::default().matches(&built("1.30.0")),
            "names nothing"
        );
        let trt = Runtime {
            tensorrt: Some("10.16.0".into()),
            ..Runtime::onnxruntime("1.31.1")
        };
        // An ort-cpu artifact records no TensorRT: a consumer's TensorRT does not matter to
        // it; a trt engine records no ONNX Runtime.
        let mut v = built("1.31.1");
        assert!(trt.matches(&v));
        v.insert("tensorrt".into(), "10.16.0".into());
        assert!(trt.matches(&v));
        v.insert("tensorrt".into(), "10.17.0".into());
        assert!(!trt.matches(&v));
        let engine = BTreeMap::from([("tensorrt".to_string(), "10.16.0".to_string())]);
        assert!(trt.matches(&engine));
        assert_eq!(trt.describe(), "onnxruntime 1.31.1, tensorrt 10.16.0");
    }

    #[test]
    fn an_acquire_without_a_runtime_is_the_old_wire_format() {
        let req = AcquireRequest {
            model: "m".into(),
            ..Default::default()
        };
        let json = serde_json::to_string(&req).unwrap();
        assert!(!json.contains("runtime"), "{json}");
        let back: AcquireRequest =
            serde_json::from_str(r#"{"model":"m","runtime":{"onnxruntime":"1.30.0"}}"#).unwrap();
        assert_eq!(back.runtime, Some(Runtime::onnxruntime("1.30.0")));
    }
}
