//! Finding and loading ONNX Runtime at run time (ort `load-dynamic`), once per process.
//!
//! Enters: an optional configured library path (`ort_library`). Leaves: a process-wide
//! [`Runtime`] (the ort `Environment`, the library path and its version) or one
//! [`RuntimeError`] that lists every place looked at and how to fix it. The library is always
//! loaded through `ort::init_from`, never through ort's implicit `ORT_DYLIB_PATH` path, which
//! panics when the library is missing.
//!
//! Search order and the trust check: [`crate::libs::onnxruntime`] (never the working
//! directory; never a library another user could have written).
//!
//! Supported range: ONNX Runtime >= 1.20 (ort is compiled with `api-20`); tested with 1.31.1.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::libs::onnxruntime::locate;
pub use crate::libs::onnxruntime::{RuntimeError, MIN_MINOR};

/// The loaded ONNX Runtime: one per process.
pub struct Runtime {
    /// The ort environment every session is built from.
    pub env: ort::environment::Environment,
    /// The library that was loaded.
    pub path: PathBuf,
    /// Its version, e.g. `1.31.1`.
    pub version: String,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Loads ONNX Runtime (first call) or returns the already loaded one. `configured` is the
/// `ort_library` setting; later calls ignore it (one library per process).
pub fn load(configured: Option<&Path>) -> Result<&'static Runtime, RuntimeError> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let _guard = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    // The same search and version as `trtcache key` (locate), so keys agree.
    let (path, version) = locate(configured)?;
    let minor = version
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    if !version.starts_with("1.") || minor < MIN_MINOR {
        return Err(RuntimeError::TooOld { path, version });
    }
    // The resolved, re-checked file: what was checked is what is loaded.
    let real = crate::libs::onnxruntime::loadable(&path)?;
    let builder = ort::init_from(&real).map_err(|e| RuntimeError::Load {
        path: path.clone(),
        why: e.to_string(),
    })?;
    let env = builder
        .with_name("trtcache")
        .build()
        .map_err(|e| RuntimeError::Environment(e.to_string()))?;
    // ort registers its tracing logger at VERBOSE, so ONNX Runtime formats every verbose
    // message (several per node per optimizer pass) only for tracing to drop it; on a
    // 20,000-node graph that costs a third of session creation. Ask ORT only for what the
    // installed subscriber will show (warnings and errors carry provider fallbacks).
    use ort::logging::LogLevel;
    env.set_log_level(if tracing::enabled!(tracing::Level::TRACE) {
        LogLevel::Verbose
    } else if tracing::enabled!(tracing::Level::DEBUG) {
        LogLevel::Info
    } else {
        LogLevel::Warning
    });
    tracing::info!(path = %path.display(), %version, "loaded ONNX Runtime");
    crate::libs::onnxruntime::note_loaded(&path);
    Ok(RUNTIME.get_or_init(|| Runtime { env, path, version }))
}

/// Returns the runtime if it is loaded already.
pub fn loaded() -> Option<&'static Runtime> {
    RUNTIME.get()
}
