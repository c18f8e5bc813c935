//! The local store: a sled index (`trt_engine_cache`: key → [`Record`] JSON) plus
//! content-addressed artifact directories under `blobs/`. Model digests are remembered in
//! `digests.json` ([`crate::key::memo`]), not in sled, so `trtcache key` can read and write
//! them while a builder or daemon holds this store's lock.
//!
//! Layout of a cache dir: `lock` (owner pid, flock), `db/` (sled), `blobs/<digest>/<files>`,
//! `records/<key>.json` (each record as stored, outside sled), `tmp/` (staging and commits in
//! progress), `quarantine/` (what `verify` moved aside).
//! Writes go to `tmp/`, are fsynced, renamed into `blobs/`, then indexed, then the record's
//! manifest is written, so a crash leaves at worst leftovers that the next
//! [`SledStore::open`] removes: temp files, records whose blob is gone, blobs no record names
//! ([`maintain`] holds reconcile, verify, repair and gc).
//!
//! The manifests exist because sled reads a truncated or corrupt log as a shorter (often
//! empty) index without an error: a manifest whose key the index lacks means the index lost
//! it, and open refuses (rather than deleting the "orphan" blobs) until
//! [`SledStore::repair`] rebuilds the index from the manifests and the blobs.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::files;
use super::lock::DirLock;
use super::record::{Record, StagedArtifact, Status, StoredArtifact, StoredFile, RECORD_FORMAT};
use super::store::{
    now_secs, GcReport, Lookup, RuntimeKeep, Served, Store, StoreError, VerifyReport,
};
use crate::key::{hex, CacheKey};

mod maintain;
pub mod marker;
mod usage;

const RECORDS_TREE: &str = "trt_engine_cache";

/// Store settings.
#[derive(Clone, Debug, Default)]
pub struct StoreOptions {
    /// Evict least-recently-used artifacts after each put to stay under this many bytes.
    pub max_bytes: Option<u64>,
}

/// What [`SledStore::open`] cleaned up.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpenReport {
    /// Staging/commit leftovers removed from `tmp/`.
    pub temp_removed: usize,
    /// Records dropped because their artifact files were missing.
    pub records_dropped: Vec<String>,
    /// Blob directories no record named, deleted.
    pub orphans_removed: Vec<String>,
}

/// The sled-backed store; one per cache directory and process (see [`DirLock`]).
#[derive(Debug)]
pub struct SledStore {
    root: PathBuf,
    db: sled::Db,
    records: sled::Tree,
    opts: StoreOptions,
    report: OpenReport,
    /// Entries evicted least-recently-used to fit the size limit since the store opened.
    evicted: std::sync::atomic::AtomicU64,
    /// Sizes, blob references and LRU order, kept in step with `records`.
    usage: std::sync::Mutex<usage::Usage>,
    _lock: DirLock,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::io(path, source)
}

/// A sled error as a store error: out of space is [`StoreError::Full`], corruption is
/// [`StoreError::IndexDamaged`].
fn sled_err(root: &Path, e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(source) => io(&root.join("db"))(source),
        sled::Error::Corruption { at, .. } => StoreError::IndexDamaged {
            dir: root.to_path_buf(),
            detail: match at {
                Some(at) => format!("sled found corrupted data at {at:?}"),
                None => "sled found corrupted data".into(),
            },
        },
        e => StoreError::Db {
            path: root.join("db"),
            message: e.to_string(),
        },
    }
}

/// Writes `bytes` to `path` durably: a temp file in the same directory, fsynced, renamed,
/// then the directory fsynced.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .map_err(io(dir))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(io(path))?;
    tmp.persist(path).map_err(|e| io(path)(e.error))?;
    fsync_dir(dir)
}

/// SHA-256 (hex) and size of a file.
pub fn hash_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let r = f.read(&mut buf)?;
        if r == 0 {
            break;
        }
        h.update(&buf[..r]);
        n += r as u64;
    }
    Ok((hex(&h.finalize()), n))
}

fn fsync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Adds `bits` (group permission bits) to an open file's mode; other bits are kept as built.
fn group_readable(f: &File, bits: u32) -> std::io::Result<()> {
    let mode = f.metadata()?.permissions().mode() & 0o7777;
    if mode & bits != bits {
        f.set_permissions(std::fs::Permissions::from_mode(mode | bits))?;
    }
    Ok(())
}

fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

impl SledStore {
    /// Opens (creating) the store at `root`: checks the folder is a cache or may become one
    /// ([`marker`]), takes the directory lock, opens sled, then reconciles the index with the
    /// files on disk (read-only: only checks it).
    pub fn open(root: &Path, opts: StoreOptions) -> Result<Self, StoreError> {
        Self::open_with(root, opts, false)
    }

    /// Opens the store at `root` again after its folder was deleted or replaced under the
    /// process that had it open (the daemon's `rm -rf CACHE` recovery): like [`Self::open`],
    /// and a folder holding nothing but the store's own names ([`marker::only_own_names`]:
    /// what `rm -rf` has not removed yet) is taken back and tagged rather than refused.
    pub fn reopen(root: &Path, opts: StoreOptions) -> Result<Self, StoreError> {
        if matches!(marker::standing(root)?, marker::Standing::Foreign(_))
            && marker::only_own_names(root)
        {
            tracing::info!(dir = %root.display(), "taking back what is left of this process's cache folder");
            marker::tag(root)?;
        }
        Self::open(root, opts)
    }

    /// Opens an existing cache for reading (`ls`, `verify` without `--repair`): the folder
    /// must already be a cache; nothing is created, tagged, cleaned or rewritten (only the
    /// lock's owner line and sled's own files are written).
    pub fn open_read_only(root: &Path) -> Result<Self, StoreError> {
        Self::open_with(root, StoreOptions::default(), true)
    }

    fn open_with(root: &Path, opts: StoreOptions, read_only: bool) -> Result<Self, StoreError> {
        Self::claim(root, read_only)?;
        let lock = DirLock::acquire(root)?;
        if !read_only {
            Self::create_dirs(root)?;
        }
        let mut store = Self::with_index(root, lock, opts)?;
        store.report = if read_only {
            store.check_manifests()?;
            OpenReport::default()
        } else {
            store.reconcile()?
        };
        Ok(store)
    }

    /// The folder is a cache (tagged, or an older trtcache's), or is missing or empty and then
    /// becomes one (created and tagged) unless `read_only`. Anything else is refused before
    /// anything in it is touched.
    pub(crate) fn claim(root: &Path, read_only: bool) -> Result<(), StoreError> {
        use marker::Standing;
        match marker::standing(root)? {
            Standing::Tagged => Ok(()),
            Standing::Legacy if read_only => Ok(()),
            Standing::Legacy => {
                tracing::info!(dir = %root.display(), "tagging a cache made by an older trtcache ({})", marker::MARKER);
                marker::tag(root)
            }
            Standing::Missing | Standing::Empty if read_only => {
                Err(marker::not_a_cache(root, Vec::new()))
            }
            Standing::Missing | Standing::Empty => {
                files::create_dir(root, files::DIR_MODE).map_err(io(root))?;
                marker::tag(root)
            }
            Standing::Foreign(sample) => Err(marker::not_a_cache(root, sample)),
        }
    }

    /// The store over the index `root/db` (opened, or created when absent) under `lock`,
    /// with an empty open report: what `open` and `repair` both start from.
    fn with_index(root: &Path, lock: DirLock, opts: StoreOptions) -> Result<Self, StoreError> {
        let dbp = root.join("db");
        files::create_dir(&dbp, files::INDEX_DIR_MODE).map_err(io(&dbp))?;
        let db = sled::open(&dbp).map_err(|e| sled_err(root, e))?;
        let records = db.open_tree(RECORDS_TREE).map_err(|e| sled_err(root, e))?;
        // sled creates its files with the umask: the index is the owner's alone (`db/` is
        // created 0700 above, so a file left wider here is still unreachable to others: a
        // failure only warns).
        if let Err(e) = files::restrict_index(&dbp) {
            tracing::warn!(db = %dbp.display(), error = %e, "cannot restrict the index files' modes");
        }
        let mut store = Self {
            root: root.to_path_buf(),
            db,
            records,
            opts,
            report: OpenReport::default(),
            evicted: Default::default(),
            usage: Default::default(),
            _lock: lock,
        };
        store.recount()?;
        Ok(store)
    }

    /// Builds the in-memory accounting from the whole index (at open, after repair).
    fn recount(&mut self) -> Result<(), StoreError> {
        let all = self.all_records()?;
        let u = self.usage.get_mut().unwrap_or_else(|p| p.into_inner());
        *u = usage::Usage::keeping(&all, u.keep().clone());
        Ok(())
    }

    fn usage(&self) -> std::sync::MutexGuard<'_, usage::Usage> {
        self.usage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes a key from the index (and the accounting); not flushed.
    fn unindex(&self, key: &CacheKey) -> Result<(), StoreError> {
        self.records.remove(key.0).map_err(|e| self.db_err(e))?;
        self.usage().set(*key, None);
        Ok(())
    }

    /// Creates the store's folders that are missing (at open, and again when they were
    /// deleted under a running daemon), each [`files::DIR_MODE`].
    fn create_dirs(root: &Path) -> Result<(), StoreError> {
        for sub in ["blobs", "tmp", "quarantine", "records"] {
            let p = root.join(sub);
            files::create_dir(&p, files::DIR_MODE).map_err(io(&p))?;
        }
        Ok(())
    }

    /// The cache directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Makes every write durable (hit counters and last-use times are written lazily).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| self.db_err(e))?;
        Ok(())
    }

    /// What the last open cleaned up.
    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    fn db_err(&self, e: sled::Error) -> StoreError {
        sled_err(&self.root, e)
    }

    /// The manifest of a key's record (`records/<key>.json`).
    fn manifest_path(&self, key: &CacheKey) -> PathBuf {
        self.root
            .join("records")
            .join(format!("{}.json", key.hex()))
    }

    /// Writes a record's manifest: what [`SledStore::repair`] rebuilds the index from.
    fn write_manifest(&self, r: &Record) -> Result<(), StoreError> {
        let v = serde_json::to_vec_pretty(r).map_err(|e| StoreError::BadRecord {
            key: r.key.hex(),
            message: e.to_string(),
        })?;
        write_durably(&self.manifest_path(&r.key), &v)
    }

    fn remove_manifest(&self, key: &CacheKey) -> Result<(), StoreError> {
        let p = self.manifest_path(key);
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&p)(e)),
            _ => Ok(()),
        }
    }

    fn blob_dir(&self, digest: &str) -> PathBuf {
        self.root.join("blobs").join(digest)
    }

    fn all_records(&self) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        for item in self.records.iter() {
            let (k, v) = item.map_err(|e| self.db_err(e))?;
            match serde_json::from_slice::<Record>(&v) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::warn!(key = %hex(&k), error = %e, "unreadable cache record skipped")
                }
            }
        }
        Ok(out)
    }

    /// Writes a record and flushes sled (a new artifact or a status change must survive a
    /// crash).
    fn write_record(&self, r: &Record) -> Result<(), StoreError> {
        self.write_record_lazy(r)?;
        self.records.flush().map_err(|e| self.db_err(e))?;
        Ok(())
    }

    /// Writes a record without waiting for the disk: hit counters and last-use times are
    /// statistics, and a flush costs ~10 ms on the serving path (sled flushes on its own
    /// every 500 ms and when the store closes).
    fn write_record_lazy(&self, r: &Record) -> Result<(), StoreError> {
        let v = serde_json::to_vec(r).map_err(|e| StoreError::BadRecord {
            key: r.key.hex(),
            message: e.to_string(),
        })?;
        self.records
            .insert(r.key.0, v)
            .map_err(|e| self.db_err(e))?;
        self.usage().set(r.key, Some(r));
        Ok(())
    }

    fn read_record(&self, key: &CacheKey) -> Result<Option<Record>, StoreError> {
        match self.records.get(key.0).map_err(|e| self.db_err(e))? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| StoreError::BadRecord {
                    key: key.hex(),
                    message: e.to_string(),
                }),
        }
    }

    /// The cheap checks before serving: every file exists as a plain file of the recorded
    /// size.
    fn cheap_check(&self, a: &StoredArtifact) -> Result<Served, String> {
        let dir = self.blob_dir(&a.digest);
        let mut files = Vec::new();
        for f in &a.files {
            let p = dir.join(&f.name);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_file() && m.len() == f.bytes => files.push(p),
                Ok(m) if m.is_file() => {
                    return Err(format!(
                        "{}: {} bytes, recorded {}",
                        p.display(),
                        m.len(),
                        f.bytes
                    ))
                }
                Ok(_) => return Err(format!("{}: not a plain file", p.display())),
                Err(e) => return Err(format!("{}: {e}", p.display())),
            }
        }
        Ok(Served {
            entry: dir.join(&a.entry),
            dir,
            files,
        })
    }

    /// Looks a key up; `count` records a hit (hits, last used).
    fn find(&self, key: &CacheKey, count: bool) -> Result<Lookup, StoreError> {
        let Some(mut r) = self.read_record(key)? else {
            return Ok(Lookup::Miss);
        };
        if r.format > RECORD_FORMAT {
            let why = format!(
                "record format {} is newer than this trtcache ({RECORD_FORMAT})",
                r.format
            );
            return Ok(Lookup::Unservable { record: r, why });
        }
        let why = match (&r.status, &r.artifact) {
            (Status::Failed { reason }, _) => format!("build failed: {reason}"),
            (Status::Quarantined { reason }, _) => format!("quarantined: {reason}"),
            (Status::Ready, None) => "no artifact recorded".into(),
            (Status::Ready, Some(a)) => match self.cheap_check(a) {
                Ok(served) => {
                    if count {
                        r.hits += 1;
                        r.last_used = now_secs();
                        self.write_record_lazy(&r)?;
                    }
                    return Ok(Lookup::Hit { record: r, served });
                }
                Err(why) => format!("artifact incomplete: {why}"),
            },
        };
        Ok(Lookup::Unservable { record: r, why })
    }

    /// Copies (hard-links where possible) the artifact into `blobs/<digest>/` as one unit.
    fn commit_blob(&self, art: &StagedArtifact) -> Result<StoredArtifact, StoreError> {
        if !art.files.iter().any(|f| f == &art.entry) {
            return Err(StoreError::BadArtifact {
                name: art.entry.clone(),
            });
        }
        let mut files = Vec::new();
        for name in &art.files {
            if !plain_name(name) {
                return Err(StoreError::BadArtifact { name: name.clone() });
            }
            let p = art.dir.join(name);
            let (sha256, bytes) = hash_file(&p).map_err(io(&p))?;
            files.push(StoredFile {
                name: name.clone(),
                sha256,
                bytes,
            });
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        let mut h = Sha256::new();
        for f in &files {
            h.update(format!("{}\0{}\0{}\n", f.name, f.sha256, f.bytes).as_bytes());
        }
        let digest = hex(&h.finalize());
        let bytes = files.iter().map(|f| f.bytes).sum();
        let stored = StoredArtifact {
            digest: digest.clone(),
            entry: art.entry.clone(),
            files,
            bytes,
        };
        let dest = self.blob_dir(&digest);
        if dest.is_dir() && self.cheap_check(&stored).is_ok() {
            return Ok(stored); // identical artifact already stored (dedup)
        }
        let tmp_root = self.root.join("tmp");
        let staging = tempfile::Builder::new()
            .prefix("commit-")
            .tempdir_in(&tmp_root)
            .map_err(io(&tmp_root))?;
        for f in &stored.files {
            let src = art.dir.join(&f.name);
            let dst = staging.path().join(&f.name);
            if std::fs::hard_link(&src, &dst).is_err() {
                std::fs::copy(&src, &dst).map_err(io(&dst))?;
            }
            File::open(&dst)
                .and_then(|h| {
                    group_readable(&h, 0o040)?;
                    h.sync_all()
                })
                .map_err(io(&dst))?;
        }
        // Searchable by the daemon's group (tempdirs are 0700), so a consumer in that group
        // can open the files by name through a directory descriptor (`/proc/self/fd/D/NAME`);
        // never by others.
        std::fs::set_permissions(staging.path(), std::fs::Permissions::from_mode(0o750))
            .map_err(io(staging.path()))?;
        fsync_dir(staging.path())?;
        if dest.exists() {
            // A partial or damaged directory of the same digest: replace it.
            std::fs::remove_dir_all(&dest).map_err(io(&dest))?;
        }
        let staged = staging.keep();
        if let Err(e) = std::fs::rename(&staged, &dest) {
            let _ = std::fs::remove_dir_all(&staged);
            if !(dest.is_dir() && self.cheap_check(&stored).is_ok()) {
                return Err(io(&dest)(e));
            }
        }
        fsync_dir(&self.root.join("blobs"))?;
        Ok(stored)
    }

    /// Best effort after a failed put: the previous record (or none) back in the index,
    /// the new blob gone unless something else names it.
    fn undo_put(&self, record: &Record, previous: Option<&Record>) {
        let restored = match previous {
            Some(p) => self.write_record(p),
            None => self
                .unindex(&record.key)
                .and_then(|_| self.records.flush().map(drop).map_err(|e| self.db_err(e))),
        };
        if let Err(e) = restored {
            tracing::warn!(key = %record.key, error = %e, "cannot undo a failed cache write");
        }
        if previous.is_none() {
            let _ = self.remove_manifest(&record.key);
        }
        if let Some(a) = &record.artifact {
            if previous
                .and_then(|p| p.artifact.as_ref())
                .map(|p| &p.digest)
                != Some(&a.digest)
            {
                let _ = self.remove_blob_if_unused(&a.digest, &record.key);
            }
        }
    }

    fn digest_in_use(&self, digest: &str, except: &CacheKey) -> Result<bool, StoreError> {
        Ok(self.usage().named_by_other(digest, except))
    }

    /// Evicts least-recently-used records until the servable artifacts fit in `max`: one
    /// record at a time from the LRU order (O(log n) each), not a pass over the index.
    /// Returns the keys evicted.
    fn evict_to(&self, max: u64) -> Result<Vec<CacheKey>, StoreError> {
        let mut evicted = Vec::new();
        loop {
            let next = {
                let u = self.usage();
                if u.total() <= max {
                    break;
                }
                u.oldest()
            };
            let Some(key) = next else { break };
            if !self.remove(&key)? {
                // Not in the index (cannot happen while the accounting is in step): drop it
                // from the order so the loop ends.
                self.usage().set(key, None);
            }
            evicted.push(key);
        }
        Ok(evicted)
    }

    fn remove_blob_if_unused(&self, digest: &str, except: &CacheKey) -> Result<(), StoreError> {
        if !self.digest_in_use(digest, except)? {
            let d = self.blob_dir(digest);
            if d.exists() {
                std::fs::remove_dir_all(&d).map_err(io(&d))?;
            }
        }
        Ok(())
    }
}

impl SledStore {
    /// Entries evicted least-recently-used (to fit the size limit) since the store opened.
    pub fn evictions(&self) -> u64 {
        self.evicted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Store for SledStore {
    fn staging_dir(&self) -> Result<tempfile::TempDir, StoreError> {
        // Folders deleted under a running daemon come back (a few stats when they exist).
        Self::create_dirs(&self.root)?;
        let tmp = self.root.join("tmp");
        tempfile::Builder::new()
            .prefix("build-")
            .tempdir_in(&tmp)
            .map_err(io(&tmp))
    }

    fn get(&self, key: &CacheKey) -> Result<Option<Record>, StoreError> {
        self.read_record(key)
    }

    fn lookup(&self, key: &CacheKey) -> Result<Lookup, StoreError> {
        self.find(key, true)
    }

    fn peek(&self, key: &CacheKey) -> Result<Lookup, StoreError> {
        self.find(key, false)
    }

    fn put(
        &self,
        mut record: Record,
        artifact: Option<&StagedArtifact>,
    ) -> Result<Record, StoreError> {
        let previous = self.read_record(&record.key)?;
        Self::create_dirs(&self.root)?;
        record.artifact = match artifact {
            Some(a) => Some(self.commit_blob(a)?),
            None => None,
        };
        record.format = RECORD_FORMAT;
        // The manifest goes after the index: a manifest always names a record the index
        // holds (or held, if the index was since damaged). Either failing (a full disk)
        // undoes the put, so no partial entry stays behind.
        if let Err(e) = self
            .write_record(&record)
            .and_then(|_| self.write_manifest(&record))
        {
            self.undo_put(&record, previous.as_ref());
            return Err(e);
        }
        if let Some(old) = previous.and_then(|p| p.artifact) {
            if record.artifact.as_ref().map(|a| &a.digest) != Some(&old.digest) {
                self.remove_blob_if_unused(&old.digest, &record.key)?;
            }
        }
        if let Some(max) = self.opts.max_bytes {
            let bytes_before = self.usage().total();
            let evicted = self.evict_to(max)?;
            if evicted.contains(&record.key) {
                tracing::warn!(key = %record.key, max, "the new artifact alone exceeds the cache size limit");
            }
            if !evicted.is_empty() {
                self.evicted
                    .fetch_add(evicted.len() as u64, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(
                    evicted = evicted.len(),
                    // The first few: a line, not a list of thousands.
                    keys = %evicted.iter().take(8).map(CacheKey::hex).collect::<Vec<_>>().join(","),
                    bytes_before,
                    bytes_after = self.usage().total(),
                    max,
                    "evicted least-recently-used artifacts to fit the cache size limit"
                );
            }
        }
        Ok(record)
    }

    fn list(&self) -> Result<Vec<Record>, StoreError> {
        let mut all = self.all_records()?;
        all.sort_by(|a, b| b.last_used.cmp(&a.last_used).then(a.key.cmp(&b.key)));
        Ok(all)
    }

    fn remove(&self, key: &CacheKey) -> Result<bool, StoreError> {
        let Some(r) = self.read_record(key)? else {
            return Ok(false);
        };
        // Manifest first: one without an index entry would read as a damaged index.
        self.remove_manifest(key)?;
        self.unindex(key)?;
        self.records.flush().map_err(|e| self.db_err(e))?;
        if let Some(a) = r.artifact {
            self.remove_blob_if_unused(&a.digest, key)?;
        }
        Ok(true)
    }

    fn verify(&self) -> Result<VerifyReport, StoreError> {
        self.verify_all()
    }

    fn gc(&self, max_bytes: u64, dry_run: bool) -> Result<GcReport, StoreError> {
        self.collect(max_bytes, dry_run)
    }

    fn keep_runtimes(&self, keep: RuntimeKeep) {
        self.usage().set_keep(keep);
    }
}

impl Drop for SledStore {
    fn drop(&mut self) {
        let _ = self.db.flush();
    }
}

#[cfg(test)]
mod tests;
