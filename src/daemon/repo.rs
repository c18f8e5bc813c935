//! The model repository on disk: scans a folder into named models. Three forms are accepted:
//! `NAME.onnx` (+ optional `NAME.trtcache.toml`), `NAME/model.onnx` (a folder, for models with
//! external data) and Triton's `NAME/VERSION/model.onnx` (numeric versions, not starting with
//! `0`; newest served by default; sidecar `NAME/trtcache.toml`). Hidden names (leading `.`)
//! are skipped so half-written temp files never become models. Each model carries a
//! fingerprint (size, mtime, ctime and mode of every file it is made of) that the watcher
//! compares.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::engine::{Layout, ModelEntry};

/// What the watcher compares of each file a model version is made of, sorted by path.
pub type Fingerprint = Vec<FileStamp>;

/// One file's size, mtime, ctime and mode. ctime and mode are in it so that a `chmod` (a
/// model that was unreadable made readable) counts as a change and the model is planned
/// again, though its content and mtime are the same.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileStamp {
    pub path: PathBuf,
    pub size: u64,
    pub mtime: Option<SystemTime>,
    pub ctime_ns: i128,
    pub mode: u32,
}

impl FileStamp {
    /// The stamp of `p` (following links, as the build reads it); `None` when it cannot be
    /// stat'ed.
    pub fn of(p: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(p).ok()?;
        Some(FileStamp {
            path: p.to_path_buf(),
            size: m.len(),
            mtime: m.modified().ok(),
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
            mode: m.mode(),
        })
    }
}

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

/// Every regular file under `dir` (recursively), fingerprinted.
fn fingerprint_dir(dir: &Path, out: &mut Fingerprint, depth: usize) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() && depth < 4 {
            fingerprint_dir(&p, out, depth + 1);
        } else if let Some(s) = FileStamp::of(&p) {
            out.push(s);
        }
    }
}

/// A repository entry that is not served, and why; each is logged once (`warn_once`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Refused {
    pub path: PathBuf,
    pub why: String,
}

/// Scans the repository with the default rules (a model file that is a link leading out of
/// the repository is refused). Unreadable entries are skipped (the next scan retries them).
pub fn scan(root: &Path) -> std::io::Result<Snapshot> {
    scan_with(root, false)
}

/// Scans the repository; `follow_outside` (config `follow_symlinks_outside_repo`) serves
/// model files that are links leading out of it. Entries that cannot be served (a name the
/// protocol cannot carry, a link out of the repository) are left out and reported once.
pub fn scan_with(root: &Path, follow_outside: bool) -> std::io::Result<Snapshot> {
    let mut refused = Vec::new();
    let mut out = scan_names(root, &mut refused)?;
    if !follow_outside {
        let croot = fs::canonicalize(root)?;
        out.retain(|_, m| {
            let outside: Vec<&ModelEntry> = m
                .versions
                .values()
                .filter(|v| fs::canonicalize(&v.path).is_ok_and(|c| !c.starts_with(&croot)))
                .collect();
            for v in &outside {
                refused.push(Refused {
                    path: v.path.clone(),
                    why: "a symbolic link leading out of the repository (set `follow_symlinks_outside_repo = true` to serve it)".into(),
                });
            }
            outside.is_empty()
        });
    }
    warn_once(root, refused);
    Ok(out)
}

/// Logs each refused entry the first time a scan of `root` finds it (the watcher scans every
/// few seconds); an entry fixed and broken again is logged again.
fn warn_once(root: &Path, refused: Vec<Refused>) {
    use std::collections::{HashMap, HashSet};
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashMap<PathBuf, HashSet<Refused>>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let now: HashSet<Refused> = refused.into_iter().collect();
    let before = seen.entry(root.to_path_buf()).or_default();
    for r in now.difference(before) {
        tracing::warn!(path = %r.path.display().to_string().escape_debug(), why = %r.why, "model not served");
    }
    *before = now;
}

/// The protocol's rule for names ([`valid_model_name`]), as a refusal.
fn unservable(path: &Path, name: Option<&str>) -> Option<Refused> {
    use trtcache_client::protocol::valid_model_name;
    let why = match name {
        None => "an unservable name: not UTF-8".to_string(),
        Some(n) if !valid_model_name(n) => {
            "an unservable name: a model name has no `/`, `\\` or control characters and at most 255 bytes".to_string()
        }
        Some(_) => return None,
    };
    Some(Refused {
        path: path.to_path_buf(),
        why,
    })
}

fn scan_names(root: &Path, refused: &mut Vec<Refused>) -> std::io::Result<Snapshot> {
    let mut out = Snapshot::new();
    let mut root_files: Vec<(String, PathBuf)> = Vec::new();
    for e in fs::read_dir(root)?.flatten() {
        let raw = e.file_name();
        let Some(name) = raw.to_str().map(str::to_owned) else {
            // Only a name that would be a model (`.onnx`, or a folder) is worth a warning.
            let path = e.path();
            if raw.as_encoded_bytes().ends_with(b".onnx") || path.join("model.onnx").exists() {
                refused.extend(unservable(&path, None));
            }
            continue;
        };
        if hidden(&name) {
            continue;
        }
        let path = e.path();
        if path.is_dir() {
            if let Some(m) = scan_folder(&name, &path) {
                match unservable(&path, Some(&name)) {
                    Some(r) => refused.push(r),
                    None => {
                        out.insert(name, m);
                    }
                }
            }
        } else if let Some(r) = name
            .strip_suffix(".onnx")
            .and_then(|n| unservable(&path, Some(n)))
        {
            refused.push(r);
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
            .filter_map(|(_, p)| FileStamp::of(p))
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

    #[test]
    fn a_chmod_changes_the_fingerprint() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.onnx");
        fs::write(&p, b"x").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o000)).unwrap();
        let before = scan(d.path()).unwrap()["a"].fingerprint.clone();
        // Same bytes, same mtime: only the mode (and ctime) move.
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        let after = scan(d.path()).unwrap()["a"].fingerprint.clone();
        assert_eq!(before[0].mtime, after[0].mtime);
        assert_ne!(after, before);
    }

    #[test]
    fn unservable_names_and_links_out_of_the_repository_are_left_out() {
        use std::os::unix::ffi::OsStrExt;
        let d = tempfile::tempdir().unwrap();
        let (repo, outside) = (d.path().join("repo"), d.path().join("outside"));
        fs::create_dir_all(&repo).unwrap();
        fs::create_dir_all(outside.join("f")).unwrap();
        fs::write(outside.join("m.onnx"), b"x").unwrap();
        fs::write(outside.join("f/model.onnx"), b"x").unwrap();
        for name in ["good.onnx", "back\\slash.onnx", "esc\x1b[31m.onnx"] {
            fs::write(repo.join(name), b"x").unwrap();
        }
        let bad = std::ffi::OsStr::from_bytes(b"not-utf8-\xff.onnx");
        fs::write(repo.join(bad), b"x").unwrap();
        std::os::unix::fs::symlink(outside.join("m.onnx"), repo.join("out.onnx")).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), repo.join("outdir")).unwrap();
        // A link that stays inside is served.
        std::os::unix::fs::symlink(repo.join("good.onnx"), repo.join("alias.onnx")).unwrap();
        let s = scan(&repo).unwrap();
        assert_eq!(s.keys().collect::<Vec<_>>(), ["alias", "good"]);
        let s = scan_with(&repo, true).unwrap();
        assert_eq!(
            s.keys().collect::<Vec<_>>(),
            ["alias", "good", "out", "outdir"]
        );
    }
}
