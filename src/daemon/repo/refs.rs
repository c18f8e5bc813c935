//! The files a model's graph names as external data. torch and onnx write them under any
//! name (one file per tensor, named after the tensor, or one `weights.bin`), in the model's
//! folder or a subfolder of it; each one is part of what the artifact is built from, so each
//! is part of the model's fingerprint (a replaced weights file is a changed model) and of its
//! ready pointer's sources.
//!
//! Enters: a graph file's path and stamp. Leaves: the paths its tensors' `location`s name,
//! resolved against the graph's folder (locations that are absolute or leave the folder are
//! left out: planning refuses those with the reason). Reading a graph costs its size, so the
//! answer is remembered by the graph's stamp (size, mtime, ctime, mode): a scan reads only the
//! graphs that changed since the last one. The memo holds the graphs of the last scans: every
//! full scan prunes it to its graphs ([`prune`]), and it is emptied when targeted scans alone
//! grew it past twice the last full scan's graphs (plus 1,024).

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::stamp::FileStamp;

/// Remembered answers, by graph path: the stamp they were read at and the files.
type Memo = HashMap<PathBuf, (FileStamp, Vec<PathBuf>)>;

/// How many graphs the memo may hold before it is emptied (see the module docs).
static LIMIT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1024);

fn memo() -> std::sync::MutexGuard<'static, Memo> {
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    MEMO.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The files `graph` (stamped `stamp`) names as external data, sorted, each once. A graph
/// that cannot be read or decoded names none (planning reports why).
pub fn referenced(graph: &Path, stamp: &FileStamp) -> Vec<PathBuf> {
    if let Some((s, files)) = memo().get(graph) {
        if s == stamp {
            return files.clone();
        }
    }
    let files = read_refs(graph).unwrap_or_else(|why| {
        tracing::debug!(path = %graph.display(), %why, "external data not listed");
        Vec::new()
    });
    remember(graph, stamp, &files);
    files
}

/// The golden file (`[golden] npz`) the sidecar at `sidecar` (stamped `stamp`) names: what
/// a build validates against is part of the model too (a new golden file retries a model
/// that failed validation). A sidecar that cannot be read names none (planning says why).
pub fn named_by_sidecar(sidecar: &Path, stamp: &FileStamp) -> Vec<PathBuf> {
    if let Some((s, files)) = memo().get(sidecar) {
        if s == stamp {
            return files.clone();
        }
    }
    let files: Vec<PathBuf> = crate::plan::Sidecar::load(sidecar)
        .ok()
        .and_then(|s| s.golden.npz)
        .into_iter()
        .collect();
    remember(sidecar, stamp, &files);
    files
}

fn remember(path: &Path, stamp: &FileStamp, files: &[PathBuf]) {
    let mut m = memo();
    if m.len() >= LIMIT.load(std::sync::atomic::Ordering::Relaxed) {
        m.clear();
    }
    m.insert(path.to_path_buf(), (stamp.clone(), files.to_vec()));
}

/// Forgets every graph and sidecar not in `keep` (a full scan's).
pub fn prune(keep: &BTreeSet<PathBuf>) {
    memo().retain(|p, _| keep.contains(p));
    LIMIT.store(
        keep.len().saturating_mul(2).saturating_add(1024),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Reads and decodes `graph` (plain reads: a file truncated under the reader is an error,
/// never a fault) and lists its external data files.
fn read_refs(graph: &Path) -> Result<Vec<PathBuf>, String> {
    use prost::Message;
    use std::io::Read;
    let opts = crate::onnx::LoadOptions::default();
    let mut f = crate::onnx::load::open_regular(graph).map_err(|e| e.to_string())?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    if size > opts.max_model_bytes {
        return Err(format!("{size} bytes is over the model size limit"));
    }
    let mut buf = Vec::with_capacity(size as usize);
    f.by_ref()
        .take(opts.max_model_bytes)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    crate::onnx::budget::check(&buf, &opts.decode)?;
    let proto = crate::onnx::proto::ModelProto::decode(bytes::Bytes::from(buf))
        .map_err(|e| e.to_string())?;
    let dir = graph.parent().unwrap_or(Path::new("."));
    let mut locations = BTreeSet::new();
    crate::onnx::load::for_each_tensor(&proto, &mut |t| {
        if let Ok(Some(r)) = crate::onnx::load::external_ref(t) {
            locations.insert(r.location);
        }
    });
    Ok(locations
        .into_iter()
        .filter(|l| inside(l))
        .map(|l| dir.join(l))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect())
}

/// Whether `location` is a plain relative path that stays in the graph's folder (the rule
/// the loader applies; anything else fails planning and is not watched).
fn inside(location: &str) -> bool {
    let p = Path::new(location);
    !p.is_absolute()
        && !location.starts_with('\\')
        && !location.contains(':')
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}
