//! The digest memo: per-file digests remembered by file identity so an unchanged model is not
//! re-hashed. Identity is (device, inode, size, mtime_ns, ctime_ns); any write changes ctime,
//! so a same-size rewrite (even with mtime restored by `touch -d`) is a miss.
//!
//! Stored as a snapshot (`CACHE_DIR/digests.json`, written whole to a temp file and renamed
//! over the old one) plus a journal beside it (`digests.json.log`, one JSON entry per line,
//! appended with `O_APPEND`), so remembering a digest costs one short append, not a rewrite
//! of every entry. When the journal holds more lines than the snapshot has entries (or the
//! memo is a quarter over [`DigestMemo::max_entries`]; compaction drops the least recently
//! used down to it), the next
//! save compacts: a new snapshot, then the journal emptied; that whole-file write happens
//! once per as many appends as there are entries, so a save is O(1) amortised. Concurrent
//! writers (`trtcache key` never takes the cache's lock): the last snapshot rename wins and
//! a line appended during a compaction may be lost, never mixed; a half-written last line
//! is skipped. Within a process the parsed memo is kept and only the journal's new tail is
//! read at the next open, so an open is O(new lines) while no other process compacted.
//!
//! Racy entries: file timestamps come from a coarse clock, so a file modified again within
//! the same tick keeps its (mtime, ctime). An entry is therefore only trusted when the file's
//! ctime is older than the moment hashing started by at least the racy margin
//! (`TRTCACHE_DIGEST_RACY_MS`, default 100 ms); younger files are hashed again next time.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
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

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct MemoFile {
    scheme: String,
    entries: BTreeMap<String, Entry>,
}

/// A journal line: the scheme travels with each entry (a journal of another scheme is
/// ignored line by line).
#[derive(Serialize, Deserialize)]
struct LogLine<'a> {
    scheme: std::borrow::Cow<'a, str>,
    entry: Entry,
}

/// Identity of the snapshot file as last read or written.
type Stamp = (u64, u64, u64, i128, i128);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    let id = FileId::from_meta(&m);
    Some((id.dev, id.ino, id.size, id.mtime_ns, id.ctime_ns))
}

/// The memo of one path as this process holds it.
#[derive(Debug, Default)]
struct Loaded {
    file: MemoFile,
    /// The snapshot read (None: absent).
    snapshot: Option<Stamp>,
    /// Bytes of the journal applied so far, and its lines.
    log_offset: u64,
    log_lines: usize,
}

/// The memos this process has opened, by path (see the module docs).
fn loaded(path: &Path) -> Arc<Mutex<Loaded>> {
    static ALL: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<Loaded>>>>> = OnceLock::new();
    ALL.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(path.to_path_buf())
        .or_default()
        .clone()
}

fn journal_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".log");
    PathBuf::from(p)
}

impl Loaded {
    /// Brings this copy up to date with the files: the journal's new tail when the snapshot
    /// is the one read before, else everything again.
    fn refresh(&mut self, path: &Path) {
        let snap = stamp(path);
        let jpath = journal_path(path);
        let jlen = std::fs::metadata(&jpath).map_or(0, |m| m.len());
        if snap != self.snapshot || jlen < self.log_offset {
            self.file = read_snapshot(path);
            self.snapshot = snap;
            self.log_offset = 0;
            self.log_lines = 0;
        }
        if jlen > self.log_offset {
            self.apply_journal(&jpath);
        }
    }

    fn apply_journal(&mut self, jpath: &Path) {
        use std::io::{Read, Seek};
        let Ok(mut f) = std::fs::File::open(jpath) else {
            return;
        };
        let mut tail = Vec::new();
        if f.seek(std::io::SeekFrom::Start(self.log_offset)).is_err()
            || f.read_to_end(&mut tail).is_err()
        {
            return;
        }
        // Only whole lines: a writer's line may be half-appended right now.
        let Some(end) = tail.iter().rposition(|&b| b == b'\n') else {
            return;
        };
        for line in tail[..end].split(|&b| b == b'\n') {
            self.log_lines += 1;
            match serde_json::from_slice::<LogLine>(line) {
                Ok(l) if l.scheme == TREE_SCHEME => {
                    self.file.entries.insert(l.entry.id.slot(), l.entry);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "digest memo journal line skipped"),
            }
        }
        self.log_offset += end as u64 + 1;
    }
}

fn read_snapshot(path: &Path) -> MemoFile {
    match std::fs::read(path) {
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
    }
}

/// The memo of one path; [`DigestMemo::save`] writes what changed.
#[derive(Debug)]
pub struct DigestMemo {
    path: PathBuf,
    shared: Arc<Mutex<Loaded>>,
    /// Entries added or refreshed since the last save.
    pending: Vec<Entry>,
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
        let shared = loaded(path);
        shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refresh(path);
        let racy = std::env::var(RACY_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_RACY, Duration::from_millis);
        DigestMemo {
            path: path.to_path_buf(),
            shared,
            pending: Vec::new(),
            max_entries: 10_000,
            racy,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The remembered digest of a file with exactly this identity.
    pub fn lookup(&mut self, id: &FileId) -> Option<String> {
        let mut g = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let e = g.file.entries.get_mut(&id.slot())?;
        if e.id != *id {
            return None;
        }
        // A hit appends only to refresh a stale LRU stamp, so the common case (an unchanged
        // model) is read-only.
        let now = now_ns();
        if now - e.used_ns > LRU_REFRESH_NS {
            e.used_ns = now;
            self.pending.push(e.clone());
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
        let e = Entry {
            id,
            digest,
            used_ns: now_ns(),
        };
        self.lock().file.entries.insert(id.slot(), e.clone());
        self.pending.push(e);
        true
    }

    /// Number of entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().file.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.lock().file.entries.is_empty()
    }

    /// Writes what changed: the new entries appended to the journal, or a compaction (see
    /// the module docs).
    pub fn save(&mut self) -> Result<(), KeyError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let io = |source| KeyError::Io {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        // The cache folder's mode (`cache::files::DIR_MODE`) when `trtcache key` creates it.
        if !dir.is_dir() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)
                .map_err(io)?;
        }
        let shared = self.shared.clone();
        let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
        let entries = g.file.entries.len();
        // Over the limit by a quarter (not by one: trimming back to the limit then compacts
        // at every save), or a journal longer than the snapshot: compact.
        let over = entries > self.max_entries + self.max_entries / 4;
        // The first save of a memo writes its snapshot (`digests.json` is then always there
        // once anything is remembered).
        if over || g.snapshot.is_none() || g.log_lines + self.pending.len() > entries.max(256) {
            self.compact(&mut g)?;
        } else {
            self.append(&mut g)?;
        }
        self.pending.clear();
        Ok(())
    }

    /// Appends the pending entries to the journal in one write.
    fn append(&self, g: &mut Loaded) -> Result<(), KeyError> {
        use std::os::unix::fs::OpenOptionsExt;
        let jpath = journal_path(&self.path);
        let io = |source| KeyError::Io {
            path: jpath.clone(),
            source,
        };
        let mut buf = Vec::new();
        for e in &self.pending {
            let line = LogLine {
                scheme: TREE_SCHEME.into(),
                entry: e.clone(),
            };
            serde_json::to_writer(&mut buf, &line).map_err(|e| io(std::io::Error::other(e)))?;
            buf.push(b'\n');
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&jpath)
            .map_err(io)?;
        let before = f.metadata().map_err(io)?.len();
        f.write_all(&buf).map_err(io)?;
        // Ours is applied already; skip it at the next refresh when nobody else wrote.
        if before == g.log_offset {
            g.log_offset = before + buf.len() as u64;
            g.log_lines += self.pending.len();
        }
        Ok(())
    }

    /// Writes the whole memo as the new snapshot (least recently used beyond
    /// `max_entries` dropped), then empties the journal.
    fn compact(&self, g: &mut Loaded) -> Result<(), KeyError> {
        use std::os::unix::fs::OpenOptionsExt;
        // Lines other processes appended since the last refresh join first.
        g.apply_journal(&journal_path(&self.path));
        if g.file.entries.len() > self.max_entries {
            let mut by_age: Vec<(i128, String)> = g
                .file
                .entries
                .iter()
                .map(|(k, e)| (e.used_ns, k.clone()))
                .collect();
            by_age.sort();
            let excess = g.file.entries.len() - self.max_entries;
            for (_, k) in by_age.into_iter().take(excess) {
                g.file.entries.remove(&k);
            }
        }
        g.file.scheme = TREE_SCHEME.into();
        let io = |source| KeyError::Io {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
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
        let bytes = serde_json::to_vec(&g.file).map_err(|e| io(std::io::Error::other(e)))?;
        tmp.write_all(&bytes).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(&self.path).map_err(|e| io(e.error))?;
        let jpath = journal_path(&self.path);
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&jpath)
        {
            Ok(f) => f.set_len(0).map_err(io)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        g.snapshot = stamp(&self.path);
        g.log_offset = 0;
        g.log_lines = 0;
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
    fn saves_append_and_compaction_keeps_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("digests.json");
        let journal = journal_path(&p);
        for i in 0..600u64 {
            let mut m = DigestMemo::open(&p);
            m.racy = Duration::ZERO;
            assert!(m.insert(id(i, 0), format!("d{i}"), 1));
            m.save().unwrap();
            // Never more journal lines than max(256, entries): each save is an append or,
            // now and then, one compaction.
            let lines =
                std::fs::read(&journal).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
            assert!(lines <= 256.max(i as usize + 1), "{lines} lines at {i}");
        }
        // What another process sees: the snapshot and the journal from disk alone.
        let mut fresh = Loaded::default();
        fresh.refresh(&p);
        assert_eq!(fresh.file.entries.len(), 600);
        // A half-written last line (a writer killed mid-append) is skipped, the rest kept.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&journal)
            .and_then(|mut f| f.write_all(b"{\"scheme\":\"x"))
            .unwrap();
        let mut fresh = Loaded::default();
        fresh.refresh(&p);
        assert_eq!(fresh.file.entries.len(), 600);
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
