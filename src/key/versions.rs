//! Library versions that go into a backend's identity, found without initialising them:
//! ONNX Runtime's from its file name (`libonnxruntime.so.1.31.1`; a name without a version
//! falls back to the library's `GetVersionString` through `dlopen`), TensorRT's from
//! `libnvinfer.so.10.x.y` on the library path, the CUDA driver's from `cuDriverGetVersion`.
//!
//! [`find_onnxruntime_version`] uses the loader's own search (`build::runtime::locate`), so
//! `trtcache key` and `trtcache build` always name the same library and version.

use std::path::{Path, PathBuf};

/// Where an ONNX Runtime version came from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FoundLibrary {
    pub path: PathBuf,
    pub version: String,
}

/// `1.31.1` from `libonnxruntime.so.1.31.1` (or `libonnxruntime.1.31.1.dylib`); a symlink
/// such as `libonnxruntime.so` is followed to its versioned target.
pub fn onnxruntime_version_from_path(path: &Path) -> Option<String> {
    let from_name = |p: &Path| {
        let name = p.file_name()?.to_str()?;
        let v = name
            .strip_prefix("libonnxruntime.so.")
            .or_else(|| name.strip_prefix("libonnxruntime.")?.strip_suffix(".dylib"))?;
        is_version(v).then(|| v.to_string())
    };
    from_name(path).or_else(|| from_name(&std::fs::canonicalize(path).ok()?))
}

fn is_version(v: &str) -> bool {
    !v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Finds the ONNX Runtime library the build stage would load and its version, WITHOUT
/// loading it: the path comes from [`crate::build::runtime::find`] (the one search: config
/// `ort_library`, `ORT_DYLIB_PATH`, the checkout's `.venv`, `$VIRTUAL_ENV`, `python3`), the
/// version from the file name, else from the library itself
/// ([`crate::build::runtime::locate`]). `Err` says what was looked for.
pub fn find_onnxruntime_version(explicit: Option<&Path>) -> Result<FoundLibrary, String> {
    crate::build::runtime::locate(explicit)
        .map(|(path, version)| FoundLibrary { path, version })
        .map_err(|e| e.to_string())
}

/// Folders searched for TensorRT: `LD_LIBRARY_PATH`, then the usual system and TensorRT
/// install folders.
pub fn library_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/usr/local/tensorrt/lib",
        "/opt/tensorrt/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

/// TensorRT's version from the first `libnvinfer.so.MAJOR.MINOR.PATCH` in `dirs` (the
/// highest version within that folder); `None` when TensorRT is absent.
pub fn tensorrt_version_in(dirs: &[PathBuf]) -> Option<FoundLibrary> {
    for d in dirs {
        let mut found: Vec<(Vec<u64>, FoundLibrary)> = std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let v = name.strip_prefix("libnvinfer.so.")?;
                if !is_version(v) || v.split('.').count() < 2 {
                    return None;
                }
                let parts = v.split('.').filter_map(|p| p.parse().ok()).collect();
                Some((
                    parts,
                    FoundLibrary {
                        path: e.path(),
                        version: v.to_string(),
                    },
                ))
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some((_, f)) = found.pop() {
            return Some(f);
        }
    }
    None
}

/// TensorRT's version on this machine's library path.
pub fn tensorrt_version() -> Option<FoundLibrary> {
    tensorrt_version_in(&library_dirs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_names() {
        let v = |s: &str| onnxruntime_version_from_path(Path::new(s));
        assert_eq!(v("/x/libonnxruntime.so.1.31.1").as_deref(), Some("1.31.1"));
        assert_eq!(v("libonnxruntime.1.22.0.dylib").as_deref(), Some("1.22.0"));
        assert_eq!(v("/nonexistent/libonnxruntime.so"), None);
        assert_eq!(v("libonnxruntime.so.1.x"), None);
    }

    #[test]
    fn symlink_is_followed() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("libonnxruntime.so.1.30.2");
        std::fs::write(&real, b"").unwrap();
        let link = d.path().join("libonnxruntime.so");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            onnxruntime_version_from_path(&link).as_deref(),
            Some("1.30.2")
        );
    }

    #[test]
    fn tensorrt_highest_in_first_folder() {
        let d = tempfile::tempdir().unwrap();
        for n in [
            "libnvinfer.so.10",
            "libnvinfer.so.10.9.0",
            "libnvinfer.so.10.15.1",
            "libnvinfer_plugin.so.10.15.1",
        ] {
            std::fs::write(d.path().join(n), b"").unwrap();
        }
        let f =
            tensorrt_version_in(&[PathBuf::from("/nonexistent"), d.path().to_path_buf()]).unwrap();
        assert_eq!(f.version, "10.15.1");
        assert_eq!(tensorrt_version_in(&[PathBuf::from("/nonexistent")]), None);
    }
}
