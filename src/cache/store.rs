//! The store's vocabulary: the [`Store`] trait every tier implements, its error type, what a
//! lookup returns, the verify/repair/gc reports, and the small helpers (sizes, free space,
//! the clock) the store and its callers share. A leaf of `cache/`: it imports none of its
//! siblings but `record`.

use std::path::{Path, PathBuf};

use super::record::{Record, StagedArtifact};
use crate::key::CacheKey;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The cache's lock is held: usually by a running `trtcache serve`, which owns its cache
    /// for as long as it runs (maintenance goes through it or waits until it stops).
    #[error("cache {} is in use by {} (a running `trtcache serve` daemon, or another trtcache build)\nfix: while a daemon serves this cache, use `trtcache status` to see what it holds and `trtcache warm` to build through it; to run this command, stop the daemon first (e.g. `systemctl stop trtcache`), or point --cache-dir elsewhere", dir.display(), pid.map(|p| format!("pid {p}")).unwrap_or_else(|| "another process (pid unknown)".into()))]
    InUse { dir: PathBuf, pid: Option<u32> },
    /// The cause is in the message only (not a `source` as well, which `{:#}` would print
    /// a second time).
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cache index {}: {message}", path.display())]
    Db { path: PathBuf, message: String },
    #[error("cache record {key}: {message}")]
    BadRecord { key: String, message: String },
    #[error("artifact file `{name}` is not a plain file name inside the artifact directory")]
    BadArtifact { name: String },
    /// The file system holding the cache is full (ENOSPC or EDQUOT): a condition of the
    /// machine, not of the model; nothing was stored and the next attempt may succeed.
    #[error("no space left on the file system holding {}: {detail}\nfix: free space there (e.g. `trtcache gc --max-size SIZE`, or delete other files), or point --cache-dir at a larger disk; nothing was stored", path.display())]
    Full { path: PathBuf, detail: String },
    /// The sled index is missing, truncated or corrupt (sled reads a damaged log as shorter
    /// or empty, so this is detected from the record manifests under `records/`). Nothing
    /// was changed: blobs and manifests are intact.
    #[error("cache index {}/db is damaged: {detail}\nfix: run `trtcache verify --repair --cache-dir {}` (moves the damaged index aside and rebuilds it from the stored artifacts; models are not touched)", dir.display(), dir.display())]
    IndexDamaged { dir: PathBuf, detail: String },
    /// The folder exists and is not a trtcache cache (no `CACHEDIR.TAG` of ours): it is
    /// never opened, cleaned or listed as one.
    #[error("{} is not a trtcache cache: {}\nfix: point --cache-dir (or `cache_dir`) at a trtcache cache, or at a new or empty folder, which trtcache then tags with CACHEDIR.TAG", dir.display(), if holds.is_empty() { "it has no CACHEDIR.TAG written by trtcache (read-only commands never create one)".to_string() } else { format!("it holds other files ({}, …) and no CACHEDIR.TAG written by trtcache; nothing in it was changed", holds.join(", ")) })]
    NotACache { dir: PathBuf, holds: Vec<String> },
}

impl StoreError {
    /// An I/O error at `path`: out of space or quota is [`StoreError::Full`], anything else
    /// [`StoreError::Io`].
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        if is_no_space(&source) {
            StoreError::Full {
                path: path.to_path_buf(),
                detail: source.to_string(),
            }
        } else {
            StoreError::Io {
                path: path.to_path_buf(),
                error: source,
            }
        }
    }

    /// Whether this is the file system running out of space (a transient condition).
    pub fn is_full(&self) -> bool {
        matches!(self, StoreError::Full { .. })
    }
}

/// Whether an I/O error means the file system is out of space or quota.
pub fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// What [`Store::lookup`] found for a key.
#[derive(Debug)]
pub enum Lookup {
    /// Ready and passed the cheap checks (files exist, sizes match); hit counted.
    Hit { record: Record, served: Served },
    /// A record exists but must not be served (failed validation, quarantined, files gone).
    Unservable { record: Record, why: String },
    /// No record.
    Miss,
}

/// A servable artifact on disk: open `entry`; the other files sit next to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub dir: PathBuf,
    pub entry: PathBuf,
    pub files: Vec<PathBuf>,
}

/// Result of [`Store::verify`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    pub checked: usize,
    pub ok: usize,
    /// (key, why) of every record quarantined by this run.
    pub quarantined: Vec<(String, String)>,
}

/// Result of [`SledStore::repair`] (`trtcache verify --repair`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepairReport {
    /// Whether the index was damaged (else nothing was rebuilt and `verify` ran as usual).
    pub damaged: bool,
    /// Why the index was judged damaged.
    pub reason: Option<String>,
    /// Where the damaged index was moved (kept for inspection; delete it once satisfied).
    pub moved_to: Option<PathBuf>,
    /// Keys re-indexed from their manifests after their files re-hashed clean.
    pub recovered: Vec<String>,
    /// (key or manifest, why) of entries that could not be recovered; their models are
    /// rebuilt on the next request.
    pub dropped: Vec<(String, String)>,
    /// Blob directories no recoverable record names, moved to `quarantine/` (not deleted).
    pub unreferenced_blobs: Vec<String>,
}

/// Result of [`Store::gc`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    pub max_bytes: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Keys evicted (or that would be, with `dry_run`).
    pub evicted: Vec<String>,
}

/// A key → record store with artifact files. Implementations must never return a failed or
/// corrupt artifact from [`lookup`](Store::lookup).
pub trait Store: Send + Sync {
    /// A fresh directory for a build to write its artifact into, on the store's file system,
    /// removed when dropped (or at the next open if the process dies).
    fn staging_dir(&self) -> Result<tempfile::TempDir, StoreError>;
    /// The record for `key`, whatever its status; no side effects.
    fn get(&self, key: &CacheKey) -> Result<Option<Record>, StoreError>;
    /// The servable artifact for `key` after the cheap checks; counts a hit.
    fn lookup(&self, key: &CacheKey) -> Result<Lookup, StoreError>;
    /// Like [`lookup`](Store::lookup) without counting a hit.
    fn peek(&self, key: &CacheKey) -> Result<Lookup, StoreError>;
    /// Stores `record` and, when given, the artifact's files (copied in as one unit,
    /// fsynced, then indexed). Returns the record as stored.
    fn put(&self, record: Record, artifact: Option<&StagedArtifact>) -> Result<Record, StoreError>;
    /// Every record, most recently used first.
    fn list(&self) -> Result<Vec<Record>, StoreError>;
    /// Removes a record and any blob no other record names. `false` if there was none.
    fn remove(&self, key: &CacheKey) -> Result<bool, StoreError>;
    /// Re-hashes every artifact; mismatches are quarantined and their records made
    /// unservable.
    fn verify(&self) -> Result<VerifyReport, StoreError>;
    /// Evicts least-recently-used entries until the artifacts fit in `max_bytes`: first
    /// those built for no runtime of [`Store::keep_runtimes`], then the rest.
    fn gc(&self, max_bytes: u64, dry_run: bool) -> Result<GcReport, StoreError>;
    /// The runtimes whose artifacts gc (and the size limit) evicts last: the daemon's
    /// current and incoming runtimes and those consumers used recently. Empty (the default):
    /// plain least-recently-used order.
    fn keep_runtimes(&self, _keep: RuntimeKeep) {}
}

/// Runtime versions whose artifacts are evicted last: library (`onnxruntime`, `tensorrt`) →
/// versions. A record is kept when, for every library of its key's backend versions that
/// this names, its version is one of those listed ([`RuntimeKeep::keeps`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeKeep(pub std::collections::BTreeMap<String, std::collections::BTreeSet<String>>);

impl RuntimeKeep {
    /// Whether an artifact built with library `versions` is of a kept runtime (always, when
    /// nothing is kept).
    pub fn keeps(&self, versions: &std::collections::BTreeMap<String, String>) -> bool {
        versions.iter().all(|(lib, v)| {
            self.0
                .get(lib)
                .is_none_or(|kept| kept.is_empty() || kept.contains(v))
        })
    }
}

/// Why a key given by a person (`trtcache rm KEY`) names no single entry.
#[derive(Debug, thiserror::Error)]
pub enum KeyPrefixError {
    #[error("`{0}` is not a cache key (64 hex digits, or a unique prefix of at least 8)")]
    NotAKey(String),
    #[error("no cache entry with key {0}")]
    NoEntry(String),
    #[error("key prefix {prefix} is ambiguous ({entries} entries)")]
    Ambiguous { prefix: String, entries: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Resolves a full key, or a unique prefix of at least 8 hex digits among the store's
/// records.
pub fn resolve_key(store: &dyn Store, s: &str) -> Result<CacheKey, KeyPrefixError> {
    if let Ok(k) = CacheKey::parse(s) {
        return Ok(k);
    }
    let p = s.to_ascii_lowercase();
    if p.len() < 8 || !p.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(KeyPrefixError::NotAKey(s.into()));
    }
    let hits: Vec<CacheKey> = store
        .list()?
        .into_iter()
        .map(|r| r.key)
        .filter(|k| k.hex().starts_with(&p))
        .collect();
    match hits.as_slice() {
        [one] => Ok(*one),
        [] => Err(KeyPrefixError::NoEntry(s.into())),
        _ => Err(KeyPrefixError::Ambiguous {
            prefix: s.into(),
            entries: hits.len(),
        }),
    }
}

/// The digest memo's file in a cache directory: model digests by file identity, shared by
/// `trtcache key` (which never takes the cache's lock) and builds (see `key::memo`).
pub const DIGEST_MEMO: &str = "digests.json";

/// The digest memo's journal beside it (entries appended between compactions).
pub const DIGEST_MEMO_JOURNAL: &str = "digests.json.log";

/// Parses a size: `1048576`, `512K`, `200M`, `1.5G`, `2GiB`, `10 MB` (binary units).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    Some((v * mult as f64).round() as u64)
}

/// Bytes an unprivileged writer can still allocate on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is written by statvfs before it is read.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // fsblkcnt_t and c_ulong are 32 bits on some targets.
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("2K"), Some(2048));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("10 MiB"), Some(10 << 20));
        assert_eq!(parse_size("ten"), None);
        assert_eq!(parse_size("5X"), None);
    }
}
