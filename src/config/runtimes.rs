//! `[runtimes]`: the runtimes a deploy will switch to (docs/daemon.md, "Upgrading the
//! runtime").

use std::path::{Path, PathBuf};

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
    /// TensorRT installs (what `TENSORRT_ROOT` names: `ROOT/lib` holds `libnvinfer.so.*`),
    /// each a root (`"/opt/TensorRT-10.17.0"`) or a table naming the shim its builds load
    /// (`{ root = "/opt/TensorRT-11.2.0", shim = "/opt/trtcache/trt11/libtrtcache_trt.so" }`:
    /// a shim is linked against one TensorRT major, a new major needs one built against it).
    /// Without `shim`: `ROOT/lib/libtrtcache_trt.so` when there is one, else the daemon's own.
    /// The daemon asks each one's version in a child process, never loading it itself.
    #[serde(default)]
    pub tensorrt: Vec<TensorrtRuntime>,
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
            tensorrt: Vec::new(),
            keep_used_secs: default_keep_used_secs(),
        }
    }
}

/// One incoming TensorRT of `[runtimes] tensorrt`: a bare root, or a root with its shim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TensorrtRuntime {
    Root(PathBuf),
    With(TensorrtInstall),
}

/// `{ root = "...", shim = "..." }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorrtInstall {
    pub root: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shim: Option<PathBuf>,
}

impl TensorrtRuntime {
    /// The install root.
    pub fn root(&self) -> &Path {
        match self {
            TensorrtRuntime::Root(r) | TensorrtRuntime::With(TensorrtInstall { root: r, .. }) => r,
        }
    }

    /// The shim named for it, if any.
    pub fn shim(&self) -> Option<&Path> {
        match self {
            TensorrtRuntime::Root(_) => None,
            TensorrtRuntime::With(i) => i.shim.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RuntimesConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn tensorrt_entries_are_roots_or_tables_with_a_shim() {
        let c = parse(
            r#"
tensorrt = [
  "/opt/TensorRT-10.17.0",
  { root = "/opt/TensorRT-11.2.0", shim = "/opt/trt11/libtrtcache_trt.so" },
  { root = "/opt/TensorRT-10.18.0" },
]
"#,
        )
        .unwrap();
        assert!(c.onnxruntime.is_empty());
        let roots: Vec<&Path> = c.tensorrt.iter().map(TensorrtRuntime::root).collect();
        assert_eq!(
            roots,
            [
                Path::new("/opt/TensorRT-10.17.0"),
                Path::new("/opt/TensorRT-11.2.0"),
                Path::new("/opt/TensorRT-10.18.0")
            ]
        );
        let shims: Vec<Option<&Path>> = c.tensorrt.iter().map(TensorrtRuntime::shim).collect();
        assert_eq!(
            shims,
            [None, Some(Path::new("/opt/trt11/libtrtcache_trt.so")), None]
        );
        // A table without a root, or with a misspelt key, is an error, not a silent default.
        assert!(parse("tensorrt = [{ shim = \"/s.so\" }]").is_err());
        assert!(parse("tensorrt = [{ root = \"/r\", shims = \"/s.so\" }]").is_err());
        assert!(parse("tensorrt = \"/opt/TensorRT\"").is_err());
        // Written back as it reads.
        let shown = toml::to_string(&c).unwrap();
        assert_eq!(parse(&shown).unwrap(), c);
        assert_eq!(parse("").unwrap(), RuntimesConfig::default());
    }
}
