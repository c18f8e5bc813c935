//! The digest memo: per-file digests remembered by file identity so an unchanged model is not
//! re-hashed. Identity is (device, inode, size, mtime_ns, ctime_ns); any write changes ctime,
//! so a same-size rewrite (even with mtime restored by `touch -d`) is a miss.
//!
//! Stored as one small JSON file (`CACHE_DIR/digests.json`), read whole, written whole to a
//! temp file in the same folder and renamed over the old one (concurrent writers: the last
//! rename wins, entries of the other are only lost, never mixed). At most
//! [`DigestMemo::max_entries`] entries; the least recently used go first.
//!
//! Racy entries: file timestamps come from a coarse clock, so a file modified again within
//! the same tick keeps its (mtime, ctime). An entry is therefore only trusted when the file's
//! ctime is older than the moment hashing started by at least the racy margin
//! (`TRTCACHE_DIGEST_RACY_MS`, default 100 ms); younger files are hashed again next time.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::digest::TREE_SCHEME;
use super::KeyError;

/// Environment variable overriding the racy margin, in milliseconds.
pub const RACY_ENV: &str = "TRTCACHE_DIGEST_RACY_MS";

/// A hit refreshes an entry's LRU stamp (and so rewrites the memo) at most once an hour.
const LRU_REFRESH_NS: i128 = 3600 * 1_000_000_000;

/// Default racy margin.
pub const DEFAULT_RACY: Duration = Duration::from_millis(100);

/// Temp files of [`DigestMemo::save`]: `.digests.XXXXXX.tmp` next to the memo.
const TEMP_PREFIX: &str = ".digests.";
const TEMP_SUFFIX: &str = ".tmp";

/// Removes memo temp files that a writer killed between create and rename left in `dir`.
/// `trtcache key` writes the memo without the cache's lock, so a temp file may be a live
/// writer's: each writer holds a `flock` on its temp file until the rename, and only files
/// whose lock can be taken (the writer is gone) are removed. Returns how many were.
pub fn remove_dead_temps(dir: &Path) -> usize {
    use std::os::fd::AsRawFd;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX)) {
            continue;
        }
        let Ok(f) = std::fs::File::open(e.path()) else {
            continue;
        };
        // SAFETY: flock on a valid, owned file descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue; // a live writer's
        }
        match std::fs::remove_file(e.path()) {
            Ok(()) => removed += 1,
            Err(err) => {
                tracing::warn!(path = %e.path().display(), error = %err, "cannot remove digest memo temp file")
            }
        }
    }
    removed
}

/// Identity of a file's content as the file system reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl FileId {
    /// From `stat` (follows symlinks).
    pub fn of(path: &Path) -> Result<Self, KeyError> {
        let m = std::fs::metadata(path).map_err(|source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::from_meta(&m))
    }

    pub fn from_meta(m: &std::fs::Metadata) -> Self {
        FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        }
    }

    fn slot(&self) -> String {
        format!("{}:{}", self.dev, self.ino)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    id: FileId,
    digest: String,
    used_ns: i128,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct MemoFile {
    scheme: String,
    entries: BTreeMap<String, Entry>,
}

/// The memo, loaded in memory; [`DigestMemo::save`] writes it back.
#[derive(Debug)]
pub struct DigestMemo {
    path: PathBuf,
    file: MemoFile,
    dirty: bool,
    /// Entry limit (least recently used dropped first).
    pub max_entries: usize,
    /// Files whose ctime is within this of the hash start are not remembered.
    pub racy: Duration,
}

/// Nanoseconds since the epoch now.
pub fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

impl DigestMemo {
    /// Opens the memo at `path`; a missing file is empty, an unreadable or corrupt one is
    /// logged and started afresh (it is only a cache).
    pub fn open(path: &Path) -> Self {
        let file = match std::fs::read(path) {
            Ok(b) => match serde_json::from_slice::<MemoFile>(&b) {
                Ok(f) if f.scheme == TREE_SCHEME => f,
                Ok(f) => {
                    tracing::info!(path = %path.display(), scheme = %f.scheme, "digest memo of another scheme; starting afresh");
                    MemoFile::default()
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "digest memo unreadable; starting afresh");
                    MemoFile::default()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => MemoFile::default(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read digest memo");
                MemoFile::default()
            }
        };
        let racy = std::env::var(RACY_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_RACY, Duration::from_millis);
        DigestMemo {
            path: path.to_path_buf(),
            file,
            dirty: false,
            max_entries: 10_000,
            racy,
        }
    }

    /// The remembered digest of a file with exactly this identity.
    pub fn lookup(&mut self, id: &FileId) -> Option<String> {
        let e = self.file.entries.get_mut(&id.slot())?;
        if e.id != *id {
            return None;
        }
        // A hit rewrites the file only to refresh a stale LRU stamp, so the common case
        // (an unchanged model) is read-only.
        let now = now_ns();
        if now - e.used_ns > LRU_REFRESH_NS {
            e.used_ns = now;
            self.dirty = true;
        }
        Some(e.digest.clone())
    }

    /// Remembers `digest` for `id` unless the file changed too recently before
    /// `hash_started_ns` to be trusted (see the module docs). Returns whether it was kept.
    pub fn insert(&mut self, id: FileId, digest: String, hash_started_ns: i128) -> bool {
        let newest = id.ctime_ns.max(id.mtime_ns);
        if newest + self.racy.as_nanos() as i128 > hash_started_ns {
            tracing::debug!(
                ino = id.ino,
                "file changed too recently to remember its digest"
            );
            return false;
        }
        self.file.entries.insert(
            id.slot(),
            Entry {
                id,
                digest,
                used_ns: now_ns(),
            },
        );
        self.dirty = true;
        true
    }

    /// Number of entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.file.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.file.entries.is_empty()
    }

    /// Writes the memo if it changed: temp file in the same folder, fsync, rename.
    pub fn save(&mut self) -> Result<(), KeyError> {
        if !self.dirty {
            return Ok(());
        }
        if self.file.entries.len() > self.max_entries {
            let mut by_age: Vec<(i128, String)> = self
                .file
                .entries
                .iter()
                .map(|(k, e)| (e.used_ns, k.clone()))
                .collect();
            by_age.sort();
            let excess = self.file.entries.len() - self.max_entries;
            for (_, k) in by_age.into_iter().take(excess) {
                self.file.entries.remove(&k);
            }
        }
        self.file.scheme = TREE_SCHEME.into();
        let io = |source| KeyError::Io {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        // The cache folder's mode (`cache::files::DIR_MODE`) when `trtcache key` creates it.
        {
            use std::os::unix::fs::DirBuilderExt;
            if !dir.is_dir() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o750)
                    .create(dir)
                    .map_err(io)?;
            }
        }
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .suffix(TEMP_SUFFIX)
            .tempfile_in(dir)
            .map_err(io)?;
        // Held until the file is renamed (or this process dies): tells a cache open that
        // the temp file is not a dead writer's leftover (`remove_dead_temps`).
        {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a valid, owned file descriptor.
            if unsafe { libc::flock(tmp.as_file().as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(io(std::io::Error::last_os_error()));
            }
        }
        let bytes = serde_json::to_vec(&self.file).map_err(|e| io(std::io::Error::other(e)))?;
        tmp.write_all(&bytes).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(&self.path).map_err(|e| io(e.error))?;
        self.dirty = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64, ctime_ns: i128) -> FileId {
        FileId {
            dev: 1,
            ino,
            size: 10,
            mtime_ns: ctime_ns,
            ctime_ns,
        }
    }

    #[test]
    fn hit_miss_and_persistence() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/digests.json");
        let mut m = DigestMemo::open(&p);
        m.racy = Duration::from_millis(100);
        let t0 = 1_000_000_000_000i128;
        assert!(m.insert(id(5, t0), "d5".into(), t0 + 200_000_000));
        // Changed too recently: not remembered.
        assert!(!m.insert(id(6, t0), "d6".into(), t0 + 50_000_000));
        m.save().unwrap();
        let mut m = DigestMemo::open(&p);
        assert_eq!(m.lookup(&id(5, t0)).as_deref(), Some("d5"));
        assert_eq!(m.lookup(&id(6, t0)), None);
        // Same inode, new ctime (a rewrite): miss.
        assert_eq!(m.lookup(&id(5, t0 + 1)), None);
        let mut other = id(5, t0);
        other.size = 11;
        assert_eq!(m.lookup(&other), None);
    }

    #[test]
    fn corrupt_memo_starts_afresh_and_lru_bounds_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("digests.json");
        std::fs::write(&p, b"{not json").unwrap();
        let mut m = DigestMemo::open(&p);
        assert!(m.is_empty());
        m.racy = Duration::ZERO;
        m.max_entries = 2;
        for i in 0..4 {
            assert!(m.insert(id(i, 0), format!("d{i}"), 1));
        }
        m.save().unwrap();
        assert_eq!(DigestMemo::open(&p).len(), 2);
    }

    #[test]
    fn dead_writers_temp_files_are_removed_live_ones_kept() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join(".digests.AAAAAA.tmp");
        std::fs::write(&dead, b"{\"half").unwrap();
        let live = dir.path().join(".digests.BBBBBB.tmp");
        let held = std::fs::File::create(&live).unwrap();
        // SAFETY: flock on a valid, owned file descriptor.
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
        std::fs::write(dir.path().join("digests.json"), b"{}").unwrap();
        assert_eq!(remove_dead_temps(dir.path()), 1);
        assert!(!dead.exists());
        assert!(live.exists(), "a live writer's temp file is kept");
        assert!(dir.path().join("digests.json").exists());
        drop(held);
        assert_eq!(remove_dead_temps(dir.path()), 1);
    }
}
