//! `[runtimes]`: the runtimes a deploy will switch to (docs/daemon.md, "Upgrading the
//! runtime").

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The incoming runtimes: libraries other than the current one (`ort_library`, the TensorRT
/// the shim finds) that the daemon builds every model's artifacts for, each in a worker that
/// loads only that library, at a lower priority than any current-runtime build or acquire.
/// A consumer that names one of their versions in its acquire is served its artifact; the
/// switch is `ort_library = <one of these>` and a reload, not a rebuild.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimesConfig {
    /// ONNX Runtime shared libraries (`…/libonnxruntime.so.1.32.0`), each checked like
    /// `ort_library` (owned by root or the daemon's user, not writable by others).
    pub onnxruntime: Vec<PathBuf>,
    /// Seconds a runtime a consumer asked for keeps its artifacts out of the first round
    /// of gc (default 7 days); the current and incoming runtimes always do.
    #[serde(default = "default_keep_used_secs")]
    pub keep_used_secs: u64,
}

pub(crate) fn default_keep_used_secs() -> u64 {
    7 * 24 * 3600
}

impl Default for RuntimesConfig {
    fn default() -> Self {
        Self {
            onnxruntime: Vec::new(),
            keep_used_secs: default_keep_used_secs(),
        }
    }
}
