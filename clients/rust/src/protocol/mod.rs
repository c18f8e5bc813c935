//! The wire types shared by the daemon and every client: requests, responses, typed error
//! codes, and the metadata of an artifact. `docs/protocol.md` is the contract these follow.
//!
//! Every message is one frame (see [`crate::frame`]): a JSON object whose `op` (requests) or
//! `kind` (responses) field names the variant. Unknown fields are ignored, so a newer peer
//! may add optional fields without a version bump; removing or retyping one bumps
//! [`PROTOCOL_VERSION`].

use serde::{Deserialize, Serialize};

mod artifact;
mod error;
mod reports;
mod status;

pub use artifact::*;
pub use error::*;
pub use reports::*;
pub use status::*;

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
mod tests;
