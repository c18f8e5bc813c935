//! The cache folder a [`super::DiskBuildCache`] serves from, and what it opened there: the
//! store and the builders over it. An operator's `rm -rf CACHE` (or a folder moved or
//! replaced) under a running daemon would otherwise leave it writing into deleted files
//! without lock or index, recreating a folder without an index the next start refuses (a
//! crash loop under systemd). So the folder's identity (device and inode of the folder, its
//! `lock` and its `db/`) is remembered at open and compared before every lookup and build,
//! while builds run (a build whose folder went is stopped before it stores anything) and
//! every `limits.cache_check_secs`; when it differs, a fresh cache is opened at the same
//! path through the store's normal open (created and marked as any new cache) and everything
//! after that uses it. Consumers keep working: an artifact whose files went is rebuilt on its
//! next acquire.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use super::super::build_cache::BuildCacheError;
use super::store_err;
use crate::builder::{Builder, WorkerLimits};
use crate::cache::{SledStore, Store, StoreOptions};

/// How soon a failed reopen is tried again (each try logs).
const REOPEN_BACKOFF: Duration = Duration::from_secs(1);

/// Device and inode of the cache folder, its lock file and its index folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FolderId([(u64, u64); 3]);

impl FolderId {
    fn of(dir: &Path) -> std::io::Result<FolderId> {
        use std::os::unix::fs::MetadataExt;
        let id = |p: &Path| std::fs::symlink_metadata(p).map(|m| (m.dev(), m.ino()));
        Ok(FolderId([
            id(dir)?,
            id(&dir.join("lock"))?,
            id(&dir.join("db"))?,
        ]))
    }
}

/// One opening of the cache folder.
pub(super) struct Opened {
    pub(super) store: Arc<SledStore>,
    /// Keys repository files (digest memo; files read, never mapped).
    pub(super) builder: Builder,
    /// Builds private snapshots in bounded workers (no memo: each snapshot is a new file).
    pub(super) snap_builder: Builder,
    /// The folder's identity right after it was opened (`None`: it could not be read, and
    /// the folder is then never taken for replaced).
    id: Option<FolderId>,
}

/// What opening (and reopening) the cache needs.
pub(super) struct CacheFolder {
    dir: PathBuf,
    ort_library: Option<PathBuf>,
    worker: WorkerLimits,
    max_bytes: u64,
    current: RwLock<Arc<Opened>>,
    /// Held while reopening: the failed tries since the folder went.
    reopening: Mutex<Failed>,
    /// Fresh caches opened since the first.
    generation: AtomicU64,
}

impl CacheFolder {
    /// Opens the store at `dir` (taking its lock), evicting down to `max_bytes`.
    pub(super) fn open(
        dir: &Path,
        ort_library: Option<&Path>,
        worker: WorkerLimits,
        max_bytes: u64,
    ) -> Result<Arc<CacheFolder>, BuildCacheError> {
        let ort_library = ort_library.map(Path::to_path_buf);
        let opened = open_once(dir, &ort_library, &worker, max_bytes, false)?;
        Ok(Arc::new(CacheFolder {
            dir: dir.to_path_buf(),
            ort_library,
            worker,
            max_bytes,
            current: RwLock::new(Arc::new(opened)),
            reopening: Mutex::new(Failed::default()),
            generation: AtomicU64::new(0),
        }))
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Fresh caches opened since the first ([`super::BuildCache::generation`]).
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Checks the folder every `every` on a thread of its own, for as long as the build cache
    /// lives, so that an idle daemon notices too.
    pub(super) fn watch(self: &Arc<Self>, every: Duration) {
        let weak: Weak<CacheFolder> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("trtcache-cache-check".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                let Some(folder) = weak.upgrade() else {
                    return;
                };
                folder.opened();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the cache folder check; checked on builds only");
        }
    }

    /// The current opening, without checking the folder.
    pub(super) fn current(&self) -> Arc<Opened> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The current opening, after checking the folder is still the one it opened (a fresh
    /// cache is opened when it is not).
    pub(super) fn opened(&self) -> Arc<Opened> {
        let cur = self.current();
        if self.intact(&cur) {
            return cur;
        }
        self.reopen(cur)
    }

    /// Whether `o` is the current opening and its folder is still there, unchanged.
    pub(super) fn intact(&self, o: &Arc<Opened>) -> bool {
        if !Arc::ptr_eq(o, &self.current()) {
            return false;
        }
        let Some(id) = o.id else {
            return true;
        };
        match FolderId::of(&self.dir) {
            Ok(now) => now == id,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            // Cannot tell (permissions, I/O): keep what is open; the store reports errors.
            Err(_) => true,
        }
    }

    /// Opens a fresh cache in place of `stale` (once: concurrent callers get the new one).
    /// Logs the condition once, and a failure to open once per distinct error.
    fn reopen(&self, stale: Arc<Opened>) -> Arc<Opened> {
        let mut failed = self.reopening.lock().unwrap_or_else(|p| p.into_inner());
        let cur = self.current();
        if !Arc::ptr_eq(&cur, &stale) {
            return cur;
        }
        if failed.at.is_some_and(|t| t.elapsed() < REOPEN_BACKOFF) {
            return stale;
        }
        if failed.at.is_none() {
            tracing::error!(
                cache = %self.dir.display(),
                "the cache folder was deleted or replaced under the daemon; opening a fresh one (artifacts are built again as they are asked for)"
            );
        }
        match open_once(
            &self.dir,
            &self.ort_library,
            &self.worker,
            self.max_bytes,
            true,
        ) {
            Ok(o) => {
                let o = Arc::new(o);
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = o.clone();
                *failed = Failed::default();
                self.generation.fetch_add(1, Ordering::SeqCst);
                tracing::info!(cache = %self.dir.display(), "opened a fresh cache");
                o
            }
            Err(e) => {
                let why = e.to_string();
                if failed.error.as_deref() != Some(why.as_str()) {
                    tracing::error!(cache = %self.dir.display(), error = %why, "cannot open a fresh cache; trying again every {REOPEN_BACKOFF:?} while it is used");
                }
                *failed = Failed {
                    at: Some(Instant::now()),
                    error: Some(why),
                };
                stale
            }
        }
    }
}

/// Failed tries to open a fresh cache.
#[derive(Default)]
struct Failed {
    /// When the last one failed.
    at: Option<Instant>,
    /// Its error (a new one is logged, a repeated one not).
    error: Option<String>,
}

/// The key builder (digest memo; files read, never mapped) and the build builder (bounded
/// workers) over `store`, for the ONNX Runtime at `ort_library`; `version`: an incoming
/// runtime's, which this process did not load ([`Builder::for_runtime`]).
fn builders(
    store: &Arc<SledStore>,
    dir: &Path,
    ort_library: Option<PathBuf>,
    version: Option<String>,
    worker: &WorkerLimits,
    max_bytes: u64,
) -> (Builder, Builder) {
    let store: Arc<dyn crate::cache::Store> = store.clone();
    let mut key = Builder::new(store.clone(), ort_library.clone())
        .with_digest_memo(dir.join(crate::cache::DIGEST_MEMO))
        .with_read_models();
    // Every build and validation runs in a bounded worker process, never in the daemon.
    let mut build = Builder::new(store, ort_library)
        .with_worker(worker.clone())
        .with_size_limit(max_bytes)
        .with_timing_caches(dir.join(crate::trt::timing::TIMING_DIR));
    if let Some(v) = version {
        key = key.for_runtime(v.clone());
        build = build.for_runtime(v);
    }
    (key, build)
}

impl CacheFolder {
    /// [`builders`] over `o`'s store for an incoming runtime: an ONNX Runtime's library in
    /// place of the current one, or the current one with an incoming TensorRT
    /// ([`Builder::for_tensorrt`]).
    pub(super) fn builders_for(
        &self,
        o: &Opened,
        rt: &crate::daemon::runtimes::Incoming,
    ) -> (Builder, Builder) {
        use crate::daemon::runtimes::Incoming;
        match rt {
            Incoming::Ort(rt) => builders(
                &o.store,
                &self.dir,
                Some(rt.path.clone()),
                Some(rt.version.clone()),
                &self.worker,
                self.max_bytes,
            ),
            Incoming::Trt(t) => {
                let (key, build) = builders(
                    &o.store,
                    &self.dir,
                    self.ort_library.clone(),
                    None,
                    &self.worker,
                    self.max_bytes,
                );
                (key.for_tensorrt(t.clone()), build.for_tensorrt(t.clone()))
            }
        }
    }
}

/// Opens the store at `dir` and its builders (`again`: after the folder went, see
/// [`SledStore::reopen`]).
fn open_once(
    dir: &Path,
    ort_library: &Option<PathBuf>,
    worker: &WorkerLimits,
    max_bytes: u64,
    again: bool,
) -> Result<Opened, BuildCacheError> {
    let opts = StoreOptions {
        max_bytes: Some(max_bytes),
    };
    // Opened again after the folder went: what `rm -rf` left of it is still ours.
    let store = if again {
        SledStore::reopen(dir, opts)
    } else {
        SledStore::open(dir, opts)
    }
    .map_err(store_err)?;
    let id = FolderId::of(dir).ok();
    let r = store.open_report();
    if r.temp_removed + r.records_dropped.len() + r.orphans_removed.len() > 0 {
        tracing::info!(
            cache = %dir.display(),
            temp_removed = r.temp_removed,
            records_dropped = r.records_dropped.len(),
            orphans_removed = r.orphans_removed.len(),
            "cleaned the cache at open"
        );
    }
    let gc = store.gc(max_bytes, false).map_err(store_err)?;
    if !gc.evicted.is_empty() {
        tracing::info!(
            evicted = gc.evicted.len(),
            max_bytes,
            "cache over its size limit at open"
        );
    }
    let store = Arc::new(store);
    let (builder, snap_builder) =
        builders(&store, dir, ort_library.clone(), None, worker, max_bytes);
    Ok(Opened {
        store,
        builder,
        snap_builder,
        id,
    })
}
