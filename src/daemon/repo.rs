//! The model repository on disk: scans a folder into named models. Three forms are accepted:
//! `NAME.onnx` (+ optional `NAME.trtcache.toml`), `NAME/model.onnx` (a folder, for models with
//! external data) and Triton's `NAME/VERSION/model.onnx` (numeric versions, not starting with
//! `0`; newest served by default; sidecar `NAME/trtcache.toml`). Hidden names (leading `.`)
//! are skipped so half-written temp files never become models. Each model carries a
//! fingerprint (size and mtime of every file it is made of) that the watcher compares.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::engine::{Layout, ModelEntry};

/// Size and mtime of each file a model version is made of, sorted by path.
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// One model with every version present.
#[derive(Clone, Debug, PartialEq)]
pub struct RepoModel {
    /// Repository name.
    pub name: String,
    /// Flat or Triton.
    pub layout: Layout,
    /// Versions, ascending; the last is served by default.
    pub versions: BTreeMap<u64, ModelEntry>,
    /// Fingerprint over every version's files.
    pub fingerprint: Fingerprint,
}

impl RepoModel {
    /// The version served when a client names none.
    pub fn served(&self) -> Option<&ModelEntry> {
        self.versions.values().next_back()
    }
}

/// A scan of the whole repository, by name.
pub type Snapshot = BTreeMap<String, RepoModel>;

fn hidden(name: &str) -> bool {
    name.starts_with('.')
}

fn stat(p: &Path) -> Option<(PathBuf, u64, Option<SystemTime>)> {
    let m = fs::metadata(p).ok()?;
    Some((p.to_path_buf(), m.len(), m.modified().ok()))
}

/// Every regular file under `dir` (recursively), fingerprinted.
fn fingerprint_dir(dir: &Path, out: &mut Fingerprint, depth: usize) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() && depth < 4 {
            fingerprint_dir(&p, out, depth + 1);
        } else if let Some(s) = stat(&p) {
            out.push(s);
        }
    }
}

/// Scans the repository. Unreadable entries are skipped (the next scan retries them).
pub fn scan(root: &Path) -> std::io::Result<Snapshot> {
    let mut out = Snapshot::new();
    let mut root_files: Vec<(String, PathBuf)> = Vec::new();
    for e in fs::read_dir(root)?.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if hidden(&name) {
            continue;
        }
        let path = e.path();
        if path.is_dir() {
            if let Some(m) = scan_folder(&name, &path) {
                out.insert(name, m);
            }
        } else {
            root_files.push((name, path));
        }
    }
    for (file, path) in &root_files {
        let Some(name) = file.strip_suffix(".onnx") else {
            continue;
        };
        if name.is_empty() || out.contains_key(name) {
            if out.contains_key(name) {
                tracing::warn!(
                    model = name,
                    "both NAME.onnx and a NAME/ folder exist; serving the folder"
                );
            }
            continue;
        }
        let sidecar = root.join(format!("{name}.trtcache.toml"));
        let mut fp: Fingerprint = root_files
            .iter()
            .filter(|(f, _)| f.starts_with(&format!("{name}.")))
            .filter_map(|(_, p)| stat(p))
            .collect();
        fp.sort();
        let entry = ModelEntry {
            name: name.to_string(),
            version: 0,
            path: path.clone(),
            sidecar: sidecar.is_file().then_some(sidecar),
            layout: Layout::Flat,
        };
        out.insert(
            name.to_string(),
            RepoModel {
                name: name.to_string(),
                layout: Layout::Flat,
                versions: BTreeMap::from([(0, entry)]),
                fingerprint: fp,
            },
        );
    }
    Ok(out)
}

fn scan_folder(name: &str, dir: &Path) -> Option<RepoModel> {
    let sidecar = dir.join("trtcache.toml");
    let sidecar = sidecar.is_file().then_some(sidecar);
    let mut versions = BTreeMap::new();
    for e in fs::read_dir(dir).ok()?.flatten() {
        let fname = e.file_name();
        let Some(v) = fname.to_str() else { continue };
        if v.starts_with('0') || !v.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(version) = v.parse::<u64>() else {
            continue;
        };
        let graph = e.path().join("model.onnx");
        if graph.is_file() {
            versions.insert(
                version,
                ModelEntry {
                    name: name.to_string(),
                    version,
                    path: graph,
                    sidecar: sidecar.clone(),
                    layout: Layout::Triton,
                },
            );
        }
    }
    let layout = if versions.is_empty() {
        let graph = dir.join("model.onnx");
        if !graph.is_file() {
            return None;
        }
        versions.insert(
            0,
            ModelEntry {
                name: name.to_string(),
                version: 0,
                path: graph,
                sidecar,
                layout: Layout::Flat,
            },
        );
        Layout::Flat
    } else {
        Layout::Triton
    };
    let mut fp = Fingerprint::new();
    fingerprint_dir(dir, &mut fp, 0);
    fp.sort();
    Some(RepoModel {
        name: name.to_string(),
        layout,
        versions,
        fingerprint: fp,
    })
}

/// Resolves a directory given on the command line.
/// A model file outside the repository (an admin's `build` by path, `warm --path`) as a
/// flat entry named by its canonical path, with `NAME.trtcache.toml` next to it as sidecar.
pub fn entry_for_path(path: &Path) -> Result<ModelEntry, String> {
    if !path.is_absolute() {
        return Err(format!(
            "`{}` is not an absolute path (the daemon resolves paths itself)",
            path.display()
        ));
    }
    let path = path
        .canonicalize()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !path.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    let stem = path
        .file_name()
        .and_then(|f| f.to_str())
        .map(|f| f.strip_suffix(".onnx").unwrap_or(f).to_string())
        .unwrap_or_default();
    let sidecar = path.with_file_name(format!("{stem}.trtcache.toml"));
    Ok(ModelEntry {
        name: path.display().to_string(),
        version: 0,
        path: path.clone(),
        sidecar: sidecar.is_file().then_some(sidecar),
        layout: Layout::Flat,
    })
}

pub fn canonical_root(p: &Path) -> std::io::Result<PathBuf> {
    let c = fs::canonicalize(p)?;
    if !c.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a folder",
            p.display()
        )));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_folder_and_triton_layouts() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::write(r.join("a.onnx"), b"x").unwrap();
        fs::write(r.join("a.trtcache.toml"), b"").unwrap();
        fs::write(r.join(".b.onnx.tmp"), b"x").unwrap();
        fs::write(r.join("notes.txt"), b"x").unwrap();
        fs::create_dir_all(r.join("c/1")).unwrap();
        fs::create_dir_all(r.join("c/3")).unwrap();
        fs::create_dir_all(r.join("c/010")).unwrap();
        fs::write(r.join("c/1/model.onnx"), b"x").unwrap();
        fs::write(r.join("c/3/model.onnx"), b"x").unwrap();
        fs::write(r.join("c/010/model.onnx"), b"x").unwrap();
        fs::create_dir_all(r.join("d")).unwrap();
        fs::write(r.join("d/model.onnx"), b"x").unwrap();
        fs::create_dir_all(r.join("empty")).unwrap();
        let s = scan(r).unwrap();
        assert_eq!(s.keys().collect::<Vec<_>>(), ["a", "c", "d"]);
        assert!(s["a"].served().unwrap().sidecar.is_some());
        assert_eq!(s["c"].layout, Layout::Triton);
        assert_eq!(s["c"].versions.keys().copied().collect::<Vec<_>>(), [1, 3]);
        assert_eq!(s["c"].served().unwrap().version, 3);
        assert_eq!(s["d"].served().unwrap().path, r.join("d/model.onnx"));
    }

    #[test]
    fn fingerprint_changes_with_content() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a.onnx"), b"x").unwrap();
        let before = scan(d.path()).unwrap()["a"].fingerprint.clone();
        fs::write(d.path().join("a.onnx"), b"xy").unwrap();
        assert_ne!(scan(d.path()).unwrap()["a"].fingerprint, before);
    }
}
