//! The native libraries trtcache loads or keys by, found without initialising them: ONNX
//! Runtime ([`onnxruntime`]), TensorRT (`libnvinfer.so.X.Y.Z` on one search list,
//! [`library_dirs`]), and the CUDA driver's version (`device::gpu`). A leaf: imports only
//! `config` for the executable's checkout. Every library loaded passes [`trust`] first.

pub(crate) mod onnxruntime;
pub(crate) mod trust;

use std::path::PathBuf;

/// A library found on disk and its version.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FoundLibrary {
    pub path: PathBuf,
    pub version: String,
}

/// `1.31.1`, `10.15.1`: dot-separated numbers.
fn is_version(v: &str) -> bool {
    !v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
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
pub fn tensorrt_in(dirs: &[PathBuf]) -> Option<FoundLibrary> {
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
pub fn tensorrt() -> Option<FoundLibrary> {
    tensorrt_in(&library_dirs())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let f = tensorrt_in(&[PathBuf::from("/nonexistent"), d.path().to_path_buf()]).unwrap();
        assert_eq!(f.version, "10.15.1");
        assert_eq!(tensorrt_in(&[PathBuf::from("/nonexistent")]), None);
    }
}
