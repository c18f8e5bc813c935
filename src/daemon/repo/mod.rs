//! The model repository on disk: scans a folder into named models. Three forms are accepted:
//! `NAME.onnx` (+ optional `NAME.trtcache.toml`), `NAME/model.onnx` (a folder, for models with
//! external data) and Triton's `NAME/VERSION/model.onnx` (numeric versions, not starting with
//! `0`; newest served by default; sidecar `NAME/trtcache.toml`). A Triton `NAME/config.pbtxt`
//! may name the model file with `default_model_filename`, which then replaces `model.onnx` in
//! both folder forms. Hidden names (leading `.`) are skipped so half-written temp files never
//! become models. Each model carries a fingerprint (size, mtime, ctime and mode of every file
//! it is made of: its graphs, its sidecar, every file of its folder, and every file its graphs
//! name as external data, under any name and in any subfolder ([`refs`]); a named file that is
//! missing is in it as missing) that the watcher compares. Model files that are links leading
//! out of the repository are skipped unless `follow_symlinks_outside_repo` is set.
//!
//! Enters: a folder, and for a targeted scan ([`scan_names`]) the top-level names a change
//! touched. Leaves: a [`Scan`]: the models by name, and every entry that is not one with the
//! reason ([`Skipped`]), which the watcher logs as warnings and `rescan` reports.

mod pbtxt;
mod refs;
mod skipped;
mod stamp;

pub use skipped::{Skipped, Warned};
pub use stamp::{FileStamp, Fingerprint};

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::build_cache::{Layout, ModelEntry};

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

    /// Whether every file of the model was last modified at least `d` ago: its copy is over
    /// by the watcher's rule (a writer that pauses longer than `d` mid-copy looks done too).
    pub fn quiet_for(&self, d: std::time::Duration) -> bool {
        let now = SystemTime::now();
        !self.fingerprint.is_empty()
            && self.fingerprint.iter().all(|f| {
                f.is_missing()
                    || f.mtime
                        .is_some_and(|t| now.duration_since(t).is_ok_and(|age| age >= d))
            })
    }

    /// Total bytes of the model's files.
    pub fn bytes(&self) -> u64 {
        self.fingerprint.iter().map(|f| f.size).sum()
    }
}

/// A scan of the whole repository, by name.
pub type Snapshot = BTreeMap<String, RepoModel>;

/// Everything one scan found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scan {
    pub models: Snapshot,
    pub skipped: Vec<Skipped>,
}

/// The repository folder itself could not be read.
#[derive(Debug, thiserror::Error)]
#[error("model repository {}: {source}", path.display())]
pub struct ScanError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The model file of a folder when `config.pbtxt` names none.
const DEFAULT_MODEL_FILE: &str = "model.onnx";

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

/// Scans the repository with the default rules: its models only (see [`scan_all_with`]).
#[cfg(test)]
pub fn scan(root: &Path) -> Result<Snapshot, ScanError> {
    scan_all(root).map(|s| s.models)
}

/// [`scan`], serving links out of the repository when `follow_outside`.
pub fn scan_with(root: &Path, follow_outside: bool) -> Result<Snapshot, ScanError> {
    scan_all_with(root, follow_outside).map(|s| s.models)
}

/// [`scan_all_with`] with the default rules (links out of the repository are skipped).
#[cfg(test)]
pub fn scan_all(root: &Path) -> Result<Scan, ScanError> {
    scan_all_with(root, false)
}

/// The canonical root when links leading out of it are refused (`follow_outside` false).
fn inside_root(root: &Path, follow_outside: bool) -> Result<Option<PathBuf>, ScanError> {
    if follow_outside {
        return Ok(None);
    }
    fs::canonicalize(root)
        .map(Some)
        .map_err(|source| ScanError {
            path: root.to_path_buf(),
            source,
        })
}

/// Scans the repository. An entry that cannot be read or is not a model is listed in
/// [`Scan::skipped`] with the reason (the next scan looks again); hidden names are skipped
/// without a word (they are how writers stage files). Unless `follow_outside` (config
/// `follow_symlinks_outside_repo`), a model whose file is a link leading out of the
/// repository is skipped too: the rule external data files follow. A file or folder that a
/// model names as external data is part of that model, not a skipped entry.
pub fn scan_all_with(root: &Path, follow_outside: bool) -> Result<Scan, ScanError> {
    let croot = inside_root(root, follow_outside)?;
    let mut skipped = Vec::new();
    let mut names = BTreeSet::new();
    let mut root_files: Vec<(String, PathBuf)> = Vec::new();
    let rd = fs::read_dir(root).map_err(|source| ScanError {
        path: root.to_path_buf(),
        source,
    })?;
    for e in rd {
        let e = match e {
            Ok(e) => e,
            Err(err) => {
                skipped.push(Skipped {
                    path: root.to_path_buf(),
                    reason: format!("reading the folder: {err}"),
                });
                continue;
            }
        };
        let path = e.path();
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            skipped.push(Skipped {
                path,
                reason: "the name is not UTF-8".into(),
            });
            continue;
        };
        if hidden(&name) {
            tracing::debug!(path = %path.display(), "hidden name skipped");
            continue;
        }
        match fs::metadata(&path) {
            Err(err) => skipped.push(Skipped {
                path,
                reason: format!("cannot read it: {err}"),
            }),
            Ok(m) if m.is_dir() => {
                names.insert(name);
            }
            Ok(m) if m.is_file() => match name.strip_suffix(".onnx") {
                Some(n) if !n.is_empty() => {
                    names.insert(n.to_string());
                }
                _ => root_files.push((name, path)),
            },
            Ok(_) => skipped.push(Skipped {
                path,
                reason: "not a regular file or folder".into(),
            }),
        }
    }
    let mut models = Snapshot::new();
    for name in &names {
        if let Some(m) = model_at(root, croot.as_deref(), name, &mut skipped) {
            models.insert(name.clone(), m);
        }
    }
    // Files named after a flat model (`NAME.…`: its sidecar, notes, data) belong to it.
    for (file, path) in root_files {
        if !names.iter().any(|m| file.starts_with(&format!("{m}."))) {
            skipped.push(Skipped {
                path,
                reason: "not a model: models are NAME.onnx files or NAME/ folders (a \
                         sidecar or data file must start with its model's `NAME.` or be \
                         named by a model as external data)"
                    .into(),
            });
        }
    }
    // What models name (remembered: no graph or sidecar is read again).
    let used: BTreeSet<PathBuf> = models.values().flat_map(named_files).collect();
    // Paths sort each folder's contents right after it: one look per skipped entry.
    skipped.retain(|s| {
        !used
            .range(s.path.clone()..)
            .next()
            .is_some_and(|u| u.starts_with(&s.path))
    });
    refs::prune(
        &models
            .values()
            .flat_map(|m| m.versions.values())
            .flat_map(|v| std::iter::once(v.path.clone()).chain(v.sidecar.clone()))
            .collect(),
    );
    skipped.sort();
    Ok(Scan { models, skipped })
}

/// Scans only the models that `names` (top-level entries of the repository: a folder's
/// name, or a flat model's) may be: what a change under those entries can have changed,
/// at a cost that does not grow with the repository. A name that is no model is simply not
/// in [`Scan::models`]; entries that are not models are reported by full scans only.
pub fn scan_names(
    root: &Path,
    follow_outside: bool,
    names: &BTreeSet<String>,
) -> Result<Scan, ScanError> {
    let croot = inside_root(root, follow_outside)?;
    let mut scan = Scan::default();
    for name in names.iter().filter(|n| !n.is_empty() && !hidden(n)) {
        if let Some(m) = model_at(root, croot.as_deref(), name, &mut scan.skipped) {
            scan.models.insert(name.clone(), m);
        }
    }
    scan.skipped.sort();
    Ok(scan)
}

/// The model called `name`: the folder `root/name` when it is one, else the flat
/// `root/name.onnx`; `None` (with the reason in `skipped` when there is one) when neither
/// is. `inside`: the canonical repository root when links leading out of it are refused (a
/// linked folder out of it is then skipped without a look inside: a link to `/usr` is not a
/// model folder, and reading it would only be slow).
fn model_at(
    root: &Path,
    inside: Option<&Path>,
    name: &str,
    skipped: &mut Vec<Skipped>,
) -> Option<RepoModel> {
    let dir = root.join(name);
    let mut model = None;
    if fs::metadata(&dir).is_ok_and(|m| m.is_dir()) {
        let linked_out = inside.is_some_and(|croot| {
            fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink())
                && leads_out(&dir, croot)
        });
        if linked_out {
            skipped.push(Skipped {
                path: dir.clone(),
                reason: format!("a symbolic link to a folder out of the repository {FOLLOW_HINT}"),
            });
        } else if !trtcache_client::protocol::valid_model_name(name) {
            skipped.push(Skipped {
                path: dir.clone(),
                reason: "the folder's name is not a valid model name".into(),
            });
        } else {
            model = scan_folder(name, &dir, skipped);
        }
    }
    let graph = root.join(format!("{name}.onnx"));
    let flat = fs::metadata(&graph).is_ok_and(|m| m.is_file());
    if model.is_some() && flat {
        skipped.push(Skipped {
            path: graph.clone(),
            reason: format!("a folder `{name}/` exists too; the folder is served"),
        });
    } else if model.is_none() && flat {
        if !trtcache_client::protocol::valid_model_name(name) {
            skipped.push(Skipped {
                path: graph,
                reason: format!("`{name}` is not a valid model name"),
            });
            return None;
        }
        let sidecar = root.join(format!("{name}.trtcache.toml"));
        let sidecar = sidecar.is_file().then_some(sidecar);
        let fingerprint = sidecar
            .iter()
            .chain(std::iter::once(&graph))
            .filter_map(|p| FileStamp::of(p))
            .collect();
        let entry = ModelEntry {
            name: name.to_string(),
            version: 0,
            path: graph,
            sidecar,
            layout: Layout::Flat,
        };
        model = Some(RepoModel {
            name: name.to_string(),
            layout: Layout::Flat,
            versions: BTreeMap::from([(0, entry)]),
            fingerprint,
        });
    }
    let mut m = model?;
    if let Some(croot) = inside {
        let outside: Vec<PathBuf> = m
            .versions
            .values()
            .filter(|v| leads_out(&v.path, croot))
            .map(|v| v.path.clone())
            .collect();
        if !outside.is_empty() {
            for path in outside {
                skipped.push(Skipped {
                    path,
                    reason: format!("a symbolic link leading out of the repository {FOLLOW_HINT}"),
                });
            }
            return None;
        }
    }
    add_external_data(&mut m);
    Some(m)
}

/// Adds every file the model's graphs name as external data, and the golden file its
/// sidecar names, to its fingerprint; a named file that is missing is in it too, as
/// [`FileStamp::missing`], so that it appearing is a change of the model.
fn add_external_data(m: &mut RepoModel) {
    let mut have: BTreeSet<PathBuf> = m.fingerprint.iter().map(|f| f.path.clone()).collect();
    let mut extra = Vec::new();
    for p in named_files(m) {
        if have.insert(p.clone()) {
            extra.push(FileStamp::of(&p).unwrap_or_else(|| FileStamp::missing(&p)));
        }
    }
    if !extra.is_empty() {
        m.fingerprint.extend(extra);
    }
    m.fingerprint.sort();
}

/// The files the model's graphs name as external data and its sidecars name as golden
/// inputs (from the memo when the graph or sidecar is as stamped in the fingerprint).
fn named_files(m: &RepoModel) -> Vec<PathBuf> {
    let stamp = |p: &Path| m.fingerprint.iter().find(|f| f.path == p);
    let mut out = Vec::new();
    for v in m.versions.values() {
        if let Some(s) = stamp(&v.path) {
            out.extend(refs::referenced(&v.path, s));
        }
        if let Some((p, s)) = v.sidecar.as_deref().and_then(|p| Some((p, stamp(p)?))) {
            out.extend(refs::named_by_sidecar(p, s));
        }
    }
    out
}

/// How to serve what a link out of the repository points at.
const FOLLOW_HINT: &str = "(set `follow_symlinks_outside_repo = true` to serve it)";

/// Whether `path` resolves to somewhere outside `croot` (the canonical repository root).
fn leads_out(path: &Path, croot: &Path) -> bool {
    fs::canonicalize(path).is_ok_and(|c| !c.starts_with(croot))
}

/// The model file a folder's `config.pbtxt` names (`default_model_filename`), else
/// `model.onnx`; an error when the config cannot be read or names something that is not a
/// plain file name.
fn model_file_name(dir: &Path) -> Result<String, String> {
    let cfg = dir.join("config.pbtxt");
    let text = match fs::read_to_string(&cfg) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DEFAULT_MODEL_FILE.into()),
        Err(e) => return Err(format!("cannot read config.pbtxt: {e}")),
    };
    match pbtxt::top_level_string(&text, "default_model_filename") {
        None => Ok(DEFAULT_MODEL_FILE.into()),
        Some(f) if f.is_empty() || f.contains('/') || f == ".." || hidden(&f) => Err(format!(
            "config.pbtxt: default_model_filename `{f}` is not a plain file name"
        )),
        Some(f) => Ok(f),
    }
}

fn scan_folder(name: &str, dir: &Path, skipped: &mut Vec<Skipped>) -> Option<RepoModel> {
    let mut skip = |path: PathBuf, reason: String| skipped.push(Skipped { path, reason });
    let file = match model_file_name(dir) {
        Ok(f) => f,
        Err(why) => {
            skip(dir.to_path_buf(), why);
            return None;
        }
    };
    let sidecar = dir.join("trtcache.toml");
    let sidecar = sidecar.is_file().then_some(sidecar);
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            skip(dir.to_path_buf(), format!("cannot read the folder: {e}"));
            return None;
        }
    };
    let mut versions = BTreeMap::new();
    let mut other_dirs = Vec::new();
    for e in rd.flatten() {
        let path = e.path();
        if !path.is_dir() {
            continue;
        }
        let fname = e.file_name();
        let Some(v) = fname.to_str() else {
            skip(path, "the name is not UTF-8".into());
            continue;
        };
        if hidden(v) {
            continue;
        }
        if !v.bytes().all(|b| b.is_ascii_digit()) {
            other_dirs.push(path);
            continue;
        }
        let version = match v.parse::<u64>() {
            Ok(n) if !v.starts_with('0') => n,
            _ => {
                skip(
                    path,
                    "not a version folder: versions are numbers without leading zeros (1, 2, 10)"
                        .into(),
                );
                continue;
            }
        };
        let graph = path.join(&file);
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
        } else {
            skip(
                path,
                format!("version folder without its model file `{file}`"),
            );
        }
    }
    let top = dir.join(&file);
    let layout = if versions.is_empty() {
        if !top.is_file() {
            skip(
                dir.to_path_buf(),
                format!("no `{file}` and no version folder (NAME/1/{file}) in it"),
            );
            return None;
        }
        versions.insert(
            0,
            ModelEntry {
                name: name.to_string(),
                version: 0,
                path: top,
                sidecar,
                layout: Layout::Flat,
            },
        );
        Layout::Flat
    } else {
        if top.is_file() {
            skip(
                top,
                "the folder has version folders, which are served instead of this file".into(),
            );
        }
        for p in other_dirs {
            skip(p, "not a version folder (versions are numbers)".into());
        }
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

/// The repository folder given on the command line or in the config, canonical.
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
        // Everything not served is named with its reason; the hidden temp file is not.
        let skipped = scan_all(r).unwrap().skipped;
        let why = |p: &str| {
            skipped
                .iter()
                .find(|s| s.path == r.join(p))
                .map(|s| s.reason.clone())
                .unwrap_or_else(|| panic!("{p} not reported: {skipped:?}"))
        };
        assert!(why("notes.txt").contains("not a model"));
        assert!(why("c/010").contains("leading zeros"));
        assert!(why("empty").contains("no `model.onnx`"));
        assert!(!skipped.iter().any(|s| s.path.ends_with(".b.onnx.tmp")));
        assert_eq!(skipped.len(), 3, "{skipped:?}");
    }

    #[test]
    fn triton_config_names_the_model_file_and_odd_entries_are_reported() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("m/1")).unwrap();
        fs::create_dir_all(r.join("m/2")).unwrap();
        fs::create_dir_all(r.join("m/labels")).unwrap();
        fs::write(
            r.join("m/config.pbtxt"),
            "# default_model_filename: \"commented.onnx\"\nname: \"m\"\nplatform: \"onnxruntime_onnx\"\n\
             input [ { name: \"default_model_filename\" default_model_filename: \"nested.onnx\" } ]\n\
             default_model_filename: \"encoder.onnx\"\n",
        )
        .unwrap();
        fs::write(r.join("m/1/encoder.onnx"), b"x").unwrap();
        fs::write(r.join("m/2/model.onnx"), b"x").unwrap();
        fs::create_dir_all(r.join("n")).unwrap();
        fs::write(
            r.join("n/config.pbtxt"),
            "default_model_filename: '../x.onnx'",
        )
        .unwrap();
        fs::write(r.join("n/model.onnx"), b"x").unwrap();
        let s = scan_all(r).unwrap();
        let m = &s.models["m"];
        assert_eq!(m.layout, Layout::Triton);
        assert_eq!(m.versions.keys().copied().collect::<Vec<_>>(), [1]);
        assert_eq!(m.served().unwrap().path, r.join("m/1/encoder.onnx"));
        assert!(!s.models.contains_key("n"));
        let reasons: Vec<(PathBuf, &str)> = s
            .skipped
            .iter()
            .map(|k| {
                (
                    k.path.strip_prefix(r).unwrap().to_path_buf(),
                    k.reason.as_str(),
                )
            })
            .collect();
        assert!(
            reasons
                .iter()
                .any(|(p, w)| p == Path::new("m/2") && w.contains("`encoder.onnx`")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|(p, w)| p == Path::new("m/labels") && w.contains("not a version folder")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|(p, w)| p == Path::new("n") && w.contains("not a plain file name")),
            "{reasons:?}"
        );
    }

    /// External data of any name, in the repository or a subfolder, is part of the flat
    /// model that names it (never a skipped entry); a named file that is missing is in the
    /// fingerprint as missing; a targeted scan of the model's name finds the same.
    #[test]
    fn external_data_of_any_name_is_part_of_the_model() {
        use crate::fixtures::{models, write_external};
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write_external(
            &models::tiny_encoder(false),
            &r.join("m.onnx"),
            "weights.bin",
            128,
        )
        .unwrap();
        fs::create_dir_all(r.join("data")).unwrap();
        write_external(
            &models::tiny_encoder(true),
            &r.join("n.onnx"),
            "data/fc.weight",
            128,
        )
        .unwrap();
        let s = scan_all(r).unwrap();
        assert_eq!(s.models.keys().collect::<Vec<_>>(), ["m", "n"]);
        assert!(s.skipped.is_empty(), "{:?}", s.skipped);
        let files = |m: &RepoModel| -> Vec<PathBuf> {
            m.fingerprint.iter().map(|f| f.path.clone()).collect()
        };
        assert_eq!(
            files(&s.models["m"]),
            [r.join("m.onnx"), r.join("weights.bin")]
        );
        assert_eq!(
            files(&s.models["n"]),
            [r.join("data/fc.weight"), r.join("n.onnx")]
        );
        let one = scan_names(r, false, &BTreeSet::from(["m".to_string()])).unwrap();
        assert_eq!(one.models["m"], s.models["m"]);
        // Replaced: another stamp, so the model changed.
        fs::write(r.join("weights.bin"), b"other bytes").unwrap();
        assert_ne!(scan(r).unwrap()["m"], s.models["m"]);
        fs::remove_file(r.join("weights.bin")).unwrap();
        let gone = scan(r).unwrap()["m"].clone();
        let w = gone
            .fingerprint
            .iter()
            .find(|f| f.path == r.join("weights.bin"))
            .expect("still named");
        assert!(w.is_missing());
        // Nothing else of the model moved: it counts as settled.
        assert!(gone.quiet_for(std::time::Duration::ZERO));
    }

    /// The golden file a sidecar names is part of the model (under any name).
    #[test]
    fn the_golden_file_a_sidecar_names_is_part_of_the_model() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::write(r.join("g.onnx"), b"x").unwrap();
        fs::write(
            r.join("g.trtcache.toml"),
            "[golden]\nnpz = \"inputs.npz\"\n",
        )
        .unwrap();
        let before = scan(r).unwrap()["g"].clone();
        let f = before
            .fingerprint
            .iter()
            .find(|f| f.path == r.join("inputs.npz"))
            .expect("named");
        assert!(f.is_missing());
        fs::write(r.join("inputs.npz"), b"npz").unwrap();
        assert_ne!(scan(r).unwrap()["g"], before);
        assert!(scan_all(r).unwrap().skipped.is_empty());
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
