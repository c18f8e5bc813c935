//! The ready index (`<socket>.ready/`, format and the consumer's checks in
//! [`trtcache_client::ready`]): one pointer file per model whose default artifact is ready,
//! so that a local consumer opens it without a round trip on the socket. This module owns the
//! folder: it empties it at start, keeps it equal to the [`Wanted`] pointers it is handed on
//! each pass (rewritten with a rename when a pointer changes, removed when an artifact stops
//! being served or a file of its model changes), empties it again at shutdown, and reports
//! every open of a pointer (an inotify watch) as a hit of its artifact. It knows nothing of
//! the service: the daemon hands [`publish`] a function that returns the pointers (the
//! service's `ready_pointers`) and [`count_opens`] one that counts a hit.
//!
//! Who may write it: only the daemon's user, who owns the socket. Consumers trust the folder
//! only when it is a real folder owned by the socket's owner that nobody else may write, and
//! only while the daemon that made it runs: the daemon holds a write lock on
//! [`READY_LOCK`] in it for as long as it runs, so a killed daemon's pointers, or those left
//! by a daemon started with `ready_index = false` (which also removes them), are never read.
//! A folder, link or file at the index's path that is not the daemon's own (planted by
//! another user in a shared folder before the daemon started) is replaced when the daemon may
//! remove it and refused otherwise (no index; every acquire goes over the socket), logged
//! either way.
//!
//! The folder may be read by whoever may use the socket: its mode follows the socket's (a
//! class with read or write on the socket gets `r-x` on the folder and `r--` on the
//! pointers) and so does its group.
//!
//! A pointer that cannot be written, or a folder that cannot be made, is logged when that
//! first happens and when it ends, never once per pass.
//!
//! Enters: the socket path, [`Wanted`] pointers, repository events. Leaves: files in the
//! folder, the keys of opened pointers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trtcache_client::protocol::valid_model_name;
use trtcache_client::ready::{ready_dir, ReadyPointer, ReadySource, READY_LOCK};

use crate::spec::CacheKey;

/// A model's pointer as the daemon wants it published, and what the daemon checks for it.
pub struct Wanted {
    pub key: CacheKey,
    /// What consumers read (its `sources`: the bounded set they check).
    pub pointer: ReadyPointer,
    /// Every file of the model (and the paths that must stay absent), as scanned.
    pub watched: Vec<ReadySource>,
}

/// Wanted pointers by model name.
pub type Pointers = BTreeMap<String, Wanted>;

/// One pass's pointers (see [`publish`]): with `full`, every model's; else only those of the
/// models whose pointer may have changed since the last pass, with their names as the scope
/// (a model in the scope without a pointer has none now).
pub type Scoped = (Option<BTreeSet<String>>, Pointers);

/// Prefix of a pointer being written (hidden: never a model name, never counted). The rest
/// of its name is a number, so that every valid model name (up to 255 bytes, the file
/// system's limit) can be written.
const TMP_PREFIX: &str = ".tmp-";

/// How often a watch of a folder deleted by hand is tried again when nothing says it is back.
const REWATCH_EVERY: Duration = Duration::from_secs(5);

/// Reads of the index's event queue per tick of `count_opens` (each up to 16 KiB): enough
/// for the kernel's default queue (16,384 events) twice over.
const MAX_READS_PER_TICK: usize = 64;

/// What was last written for a model.
struct Published {
    key: CacheKey,
    text: String,
    /// The model's files (and folder) the daemon watches for it.
    paths: Vec<PathBuf>,
}

/// What the publisher holds under one lock: the pointers written, the model each watched
/// path belongs to, and the conditions already logged.
#[derive(Default)]
struct Book {
    published: HashMap<String, Published>,
    /// Every watched file (and model folder) of a published pointer → its models.
    watched: HashMap<PathBuf, Vec<String>>,
    /// Models whose pointer could not be written, with the reason last logged.
    failing: HashMap<String, String>,
    /// Why the folder could not be made, when that was logged.
    dir_failing: Option<String>,
    /// Why the lock could not be made again, when that was logged.
    lock_failing: Option<String>,
}

impl Book {
    /// Forgets a model's pointer and the paths watched for it; whether there was one.
    fn forget(&mut self, name: &str) -> bool {
        let Some(p) = self.published.remove(name) else {
            return false;
        };
        for path in &p.paths {
            if let Some(names) = self.watched.get_mut(path) {
                names.retain(|n| n != name);
                if names.is_empty() {
                    self.watched.remove(path);
                }
            }
        }
        true
    }

    /// Records a pointer written, watching `paths` for it (in place of what it had).
    fn record(&mut self, name: String, key: CacheKey, text: String, paths: Vec<PathBuf>) {
        self.forget(&name);
        for p in &paths {
            self.watched
                .entry(p.clone())
                .or_default()
                .push(name.clone());
        }
        self.published.insert(name, Published { key, text, paths });
    }

    fn forget_all(&mut self) {
        self.published.clear();
        self.watched.clear();
    }
}

/// The folder and what it holds.
pub struct ReadyIndex {
    dir: PathBuf,
    dir_mode: u32,
    file_mode: u32,
    gid: u32,
    changed: tokio::sync::Notify,
    /// Told when the folder was made again (deleted by hand): the opens' watch is re-added.
    remade: tokio::sync::Notify,
    book: Mutex<Book>,
    /// The lock consumers test ([`READY_LOCK`]), held from the folder's making to the exit.
    lock: Mutex<Option<File>>,
    /// Numbers the temp files of pointers being written.
    tmp_seq: AtomicU64,
    /// Set by [`ReadyIndex::clear`] at shutdown: no pointer is written after it.
    closed: AtomicBool,
}

/// Why the index could not be set up (the daemon then serves over the socket only).
#[derive(Debug, thiserror::Error)]
#[error("ready index {}: {source}", dir.display())]
pub struct ReadyIndexError {
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// This process's effective uid.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Opens the folder `p` itself (never through a link at its path).
fn open_dir_nofollow(p: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p)
}

/// Takes an open file description write lock on all of `f` without waiting.
fn lock_whole(f: &File) -> std::io::Result<()> {
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_WRLCK as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: a valid descriptor and a valid `flock` (l_pid 0, as OFD locks require).
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &l) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl ReadyIndex {
    /// Creates (or empties) the index folder of the daemon listening at `socket`, with the
    /// socket's group and a mode derived from the socket's, and takes its lock. Refused when
    /// the socket is not this daemon's user's (consumers would not trust the folder), or
    /// when something that is not the daemon's own sits at the folder's path and cannot be
    /// removed.
    pub fn create(socket: &Path) -> Result<Arc<ReadyIndex>, ReadyIndexError> {
        let dir = ready_dir(socket);
        let err = |source| ReadyIndexError {
            dir: dir.clone(),
            source,
        };
        let sock = std::fs::metadata(socket).map_err(err)?;
        if sock.uid() != euid() {
            return Err(err(std::io::Error::other(format!(
                "the socket belongs to uid {}, not to this daemon's uid {}: consumers trust \
                 only an index of the socket's owner (systemd: SocketUser= the service's User=)",
                sock.uid(),
                euid()
            ))));
        }
        let (dir_mode, file_mode) = modes(sock.mode());
        let idx = ReadyIndex {
            dir: dir.clone(),
            dir_mode,
            file_mode,
            gid: sock.gid(),
            changed: tokio::sync::Notify::new(),
            remade: tokio::sync::Notify::new(),
            book: Mutex::new(Book::default()),
            lock: Mutex::new(None),
            tmp_seq: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        };
        if !idx.ensure_dir().map_err(err)? {
            clear_dir(&dir).map_err(err)?;
            let f = open_dir_nofollow(&dir).map_err(err)?;
            f.set_permissions(std::fs::Permissions::from_mode(dir_mode))
                .map_err(err)?;
            std::os::unix::fs::fchown(&f, None, Some(idx.gid)).map_err(err)?;
            idx.take_lock().map_err(err)?;
        }
        Ok(Arc::new(idx))
    }

    /// Makes the folder (with its mode and group, and its lock taken) when it is missing;
    /// `Ok(true)` when it was made. Something at its path that is not this user's own folder
    /// (another user's folder, a link, a file) is removed and replaced when this process
    /// may; otherwise it is refused (an error naming it).
    fn ensure_dir(&self) -> std::io::Result<bool> {
        match std::fs::symlink_metadata(&self.dir) {
            Ok(m) if m.file_type().is_dir() && m.uid() == euid() => return Ok(false),
            Ok(m) => {
                let what = if m.file_type().is_symlink() {
                    "a symbolic link".to_string()
                } else if m.file_type().is_dir() {
                    format!("a folder of uid {}", m.uid())
                } else {
                    format!("a file of uid {} that is not a folder", m.uid())
                };
                let removed = if m.file_type().is_dir() {
                    std::fs::remove_dir_all(&self.dir)
                } else {
                    std::fs::remove_file(&self.dir)
                };
                if let Err(e) = removed {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!(
                            "its path holds {what}, not this daemon's (uid {}) own folder, and \
                             removing it failed ({e}): refusing it (remove it, or put the socket \
                             in a folder only the daemon's user may write)",
                            euid()
                        ),
                    ));
                }
                tracing::warn!(dir = %self.dir.display(), "the ready index's path held {what}, not this daemon's own folder: removed it and made the daemon's");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::DirBuilder::new()
            .mode(self.dir_mode)
            .create(&self.dir)?;
        let f = open_dir_nofollow(&self.dir)?;
        f.set_permissions(std::fs::Permissions::from_mode(self.dir_mode))?;
        std::os::unix::fs::fchown(&f, None, Some(self.gid))?;
        self.take_lock()?;
        Ok(true)
    }

    /// Makes [`READY_LOCK`] in the folder afresh and holds its write lock (replacing any lock
    /// held on a folder that was deleted). A fresh file, not the one found: a consumer who may
    /// read the old one could hold a read lock on it, which would keep the daemon from ever
    /// taking its write lock.
    fn take_lock(&self) -> std::io::Result<()> {
        let path = self.dir.join(READY_LOCK);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(self.file_mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        f.set_permissions(std::fs::Permissions::from_mode(self.file_mode))?;
        std::os::unix::fs::fchown(&f, None, Some(self.gid))?;
        lock_whole(&f)?;
        *self.lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
        Ok(())
    }

    /// Whether the lock held is the file at [`READY_LOCK`]'s path.
    fn lock_intact(&self) -> bool {
        let held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Ok(h)) = held.as_ref().map(|f| f.metadata()) else {
            return false;
        };
        std::fs::symlink_metadata(self.dir.join(READY_LOCK))
            .is_ok_and(|m| (m.dev(), m.ino()) == (h.dev(), h.ino()))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Asks the publisher to compare the index with the state now.
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key a model's pointer names now.
    fn key_of(&self, name: &str) -> Option<CacheKey> {
        self.book().published.get(name).map(|p| p.key)
    }

    /// Repository paths that changed (a watcher's event): the pointer of every model one of
    /// them belongs to (a file, or a file in its folder) is removed now, before the watcher
    /// settles the change; the publisher writes it again only once every file of the model
    /// has the stamp the state says.
    pub fn touched(&self, paths: &[PathBuf]) {
        let mut book = self.book();
        let mut hit = false;
        for p in paths {
            for q in [Some(p.as_path()), p.parent()].into_iter().flatten() {
                let Some(names) = book.watched.get(q).cloned() else {
                    continue;
                };
                for name in names {
                    if book.forget(&name) {
                        let _ = std::fs::remove_file(self.dir.join(&name));
                        tracing::debug!(model = %name, path = %p.display(), "a file of the model changed: its ready pointer removed");
                        hit = true;
                    }
                }
            }
        }
        if hit {
            drop(book);
            self.changed();
        }
    }

    /// Makes the folder hold exactly `want`. A pointer whose model's files no longer have
    /// the scanned stamps is left out (written once the state catches up); one that cannot
    /// be written is left out too (and tried again at the next pass), logged once.
    ///
    /// With a `scope`, only the pointers of the models it names are looked at (the others
    /// are as they were): a build costs the index what its models need, not a pass over the
    /// repository. `true` when the folder had to be made again (or cannot be): a scoped pass
    /// then leaves the other models' pointers unwritten, and the next pass must look at every
    /// model.
    fn reconcile(
        &self,
        want: HashMap<String, Wanted>,
        scope: Option<&std::collections::BTreeSet<String>>,
    ) -> bool {
        let mut book = self.book();
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        let mut remade = false;
        match self.ensure_dir() {
            Ok(false) => {
                if !self.lock_intact() {
                    // `.lock` deleted or replaced by hand: consumers would stop trusting the
                    // index until it is back.
                    match self.take_lock() {
                        Ok(()) => book.lock_failing = None,
                        Err(e) if book.lock_failing.is_none() => {
                            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot make the ready index's lock again; consumers ask the socket until it is (logged once)");
                            book.lock_failing = Some(e.to_string());
                        }
                        Err(_) => {}
                    }
                }
            }
            Ok(true) => {
                tracing::info!(dir = %self.dir.display(), "the ready index folder was gone; made it again");
                book.forget_all();
                self.remade.notify_one();
                remade = true;
            }
            Err(e) => {
                let why = e.to_string();
                if book.dir_failing.as_deref() != Some(why.as_str()) {
                    tracing::warn!(dir = %self.dir.display(), error = %why, "cannot make the ready index folder; every acquire goes over the socket until it can (logged again only when this changes)");
                    book.dir_failing = Some(why);
                }
                book.forget_all();
                return true;
            }
        }
        if book.dir_failing.take().is_some() {
            tracing::info!(dir = %self.dir.display(), "the ready index folder is back");
        }
        let gone: Vec<String> = match scope {
            None => book
                .published
                .keys()
                .filter(|n| !want.contains_key(*n))
                .cloned()
                .collect(),
            Some(names) => names
                .iter()
                .filter(|n| book.published.contains_key(*n) && !want.contains_key(*n))
                .cloned()
                .collect(),
        };
        for name in gone {
            book.forget(&name);
            match std::fs::remove_file(self.dir.join(&name)) {
                Ok(()) => tracing::debug!(model = %name, "ready pointer removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(model = %name, error = %e, "cannot remove a ready pointer")
                }
            }
        }
        book.failing
            .retain(|n, _| want.contains_key(n) || scope.is_some_and(|s| !s.contains(n)));
        for (name, w) in want {
            let path = self.dir.join(&name);
            let Some(text) = w.pointer.render() else {
                tracing::debug!(model = %name, "no ready pointer: a path cannot be written in one");
                if book.forget(&name) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            };
            let same = book.published.get(&name).is_some_and(|p| p.text == text);
            if !(same && path.exists()) {
                if let Some(p) = w.watched.iter().find(|s| !still(s)) {
                    // Changed since the scan: the watcher will settle it; never published
                    // meanwhile (the socket serves the state, the index waits).
                    tracing::debug!(model = %name, path = %p.path.display(), "not published: a file of the model changed since it was scanned");
                    if book.forget(&name) {
                        let _ = std::fs::remove_file(&path);
                    }
                    continue;
                }
                match self.write(&name, &text) {
                    Ok(()) => {
                        tracing::debug!(model = %name, key = %w.key, "ready pointer written");
                        if book.failing.remove(&name).is_some() {
                            tracing::info!(model = %name, "ready pointer written again");
                        }
                        let paths = w.watched.into_iter().map(|s| s.path).collect();
                        book.record(name, w.key, text, paths);
                    }
                    Err(e) => {
                        book.forget(&name);
                        let _ = std::fs::remove_file(&path);
                        let why = e.to_string();
                        if book.failing.get(&name) != Some(&why) {
                            tracing::warn!(model = %name, error = %why, "cannot write a ready pointer; the model is served over the socket only (logged again only when this changes)");
                            book.failing.insert(name, why);
                        }
                    }
                }
            }
        }
        remade
    }

    /// Writes one pointer: a hidden temp file, then renamed over the old one, so a consumer
    /// reads the old pointer or the new one, never half of one.
    fn write(&self, name: &str, text: &str) -> std::io::Result<()> {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!("{TMP_PREFIX}{n}"));
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(self.file_mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        let r = (|| {
            f.write_all(text.as_bytes())?;
            f.set_permissions(std::fs::Permissions::from_mode(self.file_mode))?;
            std::os::unix::fs::fchown(&f, None, Some(self.gid))?;
            std::fs::rename(&tmp, self.dir.join(name))
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    /// Removes every pointer and the lock file (the daemon stops: consumers ask the socket,
    /// which says so).
    pub fn clear(&self) {
        let mut book = self.book();
        self.closed.store(true, Ordering::SeqCst);
        book.forget_all();
        if let Err(e) = clear_dir(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot empty the ready index");
        }
        // Held until the process exits; gone from the folder now, so nobody trusts it.
        let _ = std::fs::remove_file(self.dir.join(READY_LOCK));
    }
}

/// Whether a scanned file still has its stamp (a path recorded absent is still absent).
fn still(s: &ReadySource) -> bool {
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    match (s.stamp, std::fs::metadata(&s.path)) {
        (None, Err(e)) => e.kind() == std::io::ErrorKind::NotFound,
        (None, Ok(_)) => false,
        (Some(_), Err(_)) => false,
        (Some((size, mtime, ctime)), Ok(m)) => {
            (
                m.size(),
                ns(m.mtime(), m.mtime_nsec()),
                ns(m.ctime(), m.ctime_nsec()),
            ) == (size, mtime, ctime)
        }
    }
}

/// A daemon started with `ready_index = false`: the index a previous daemon left next to
/// `socket` is removed when it is this user's own folder (consumers would not trust it
/// anyway: no running daemon holds its lock).
pub fn retire(socket: &Path) {
    let dir = ready_dir(socket);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.file_type().is_dir() && m.uid() == euid() => {}
        _ => return,
    }
    let r = clear_dir(&dir)
        .and_then(|()| match std::fs::remove_file(dir.join(READY_LOCK)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .and_then(|()| std::fs::remove_dir(&dir));
    match r {
        Ok(()) => {
            tracing::info!(dir = %dir.display(), "ready_index is off: removed the ready index a previous daemon left")
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "ready_index is off: cannot remove the ready index a previous daemon left (consumers do not trust it: no daemon holds its lock)")
        }
    }
}

/// The folder's and the pointers' modes for a socket of mode `sock`: the owner always reads
/// and writes; group and others read where they may use the socket.
fn modes(sock: u32) -> (u32, u32) {
    let (mut dir, mut file) = (0o700, 0o600);
    for shift in [3, 0] {
        if (sock >> shift) & 0o6 != 0 {
            dir |= 0o5 << shift;
            file |= 0o4 << shift;
        }
    }
    (dir, file)
}

/// Removes the pointers (and stray temp files) in `dir`, leaving anything else.
fn clear_dir(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(valid_model_name(name) || name.starts_with(TMP_PREFIX)) {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()) {
            match std::fs::remove_file(e.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Keeps the index equal to what `wanted` returns until `stop`: after every change signal
/// (bursts are taken together) and every `recheck` (`limits.ready_recheck_secs`; `None`:
/// only on changes). `wanted(full)` runs on the blocking pool (it may stat model folders).
pub async fn publish<F>(
    idx: Arc<ReadyIndex>,
    wanted: F,
    recheck: Option<Duration>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    F: Fn(bool) -> Scoped + Send + Sync + 'static,
{
    let wanted = Arc::new(wanted);
    // The first pass and the periodic recheck look at every model; a change signal, at the
    // models marked since the last pass.
    let mut full = true;
    loop {
        let pass = {
            let (wanted, idx) = (wanted.clone(), idx.clone());
            tokio::task::spawn_blocking(move || {
                let (scope, pointers) = wanted(full);
                let want = pointers.into_iter().collect();
                idx.reconcile(want, scope.as_ref()) && scope.is_some()
            })
        };
        let mut retry_full = false;
        match pass.await {
            Ok(again) => {
                if again {
                    full = true;
                    continue;
                }
            }
            Err(e) => {
                // The models it had taken to look at are looked at by a full pass.
                tracing::warn!(error = %e, "the ready index pass failed");
                retry_full = true;
            }
        }
        full = retry_full
            | tokio::select! {
                _ = stop.changed() => return,
                _ = idx.changed.notified() => false,
                _ = tokio::time::sleep(recheck.unwrap_or_default()), if recheck.is_some() => true,
            };
        if *stop.borrow() {
            return;
        }
    }
}

/// Reports every open of a pointer to `hit` with the key it names, until `stop`. Opens of
/// temp files and of the folder itself are not hits; an overflowing event queue loses some
/// counts (logged), never correctness. A folder deleted by hand ends its watch; the watch is
/// added again once the publisher has made the folder again.
///
/// The events are read every `poll` (`limits.ready_hits_poll_ms`), not awaited: a task
/// waiting on the inotify descriptor is woken by every consumer's open of a pointer, in that
/// consumer's `open(2)` (a cross-core wake-up, and the daemon's thread preempting the
/// consumer on a shared core: 20–70 µs of a fresh consumer's acquire on this project's VM
/// against 9–13 µs with nothing waiting; BENCHMARKS.md, "Stop 30"). The kernel queues the
/// events meanwhile (`fs.inotify.max_queued_events`, 16,384 by default); a hit is counted up
/// to `poll` late. Unread events that are identical in a row are merged by the kernel, so
/// closes are watched too: a consumer's open and close alternate and each open stays one
/// event; two opens of one pointer at the same moment (before either closes) may count once.
pub async fn count_opens(
    idx: Arc<ReadyIndex>,
    hit: impl Fn(CacheKey),
    poll: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use inotify::{EventMask, Inotify, WatchMask};
    const WATCHED: WatchMask = WatchMask::OPEN.union(WatchMask::CLOSE_NOWRITE);
    let mut ino = match Inotify::init().and_then(|ino| {
        ino.watches().add(&idx.dir, WATCHED)?;
        Ok(ino)
    }) {
        Ok(ino) => ino,
        Err(e) => {
            tracing::warn!(dir = %idx.dir.display(), error = %e, "cannot watch the ready index; its hits are not counted");
            return;
        }
    };
    let mut buf = vec![0u8; 16 * 1024];
    let mut overflowed = false;
    let mut watching = true;
    let mut since_rewatch = Duration::ZERO;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = idx.remade.notified(), if !watching => {
                watching = ino.watches().add(&idx.dir, WATCHED).is_ok();
                continue;
            }
            _ = tokio::time::sleep(poll) => {}
        }
        if !watching {
            since_rewatch += poll;
            if since_rewatch >= REWATCH_EVERY {
                since_rewatch = Duration::ZERO;
                watching = ino.watches().add(&idx.dir, WATCHED).is_ok();
            }
        }
        // What was queued since the last tick, one read(2) of up to 16 KiB (at least 512
        // events) at a time; at most MAX_READS_PER_TICK reads, so that a local flood of opens
        // cannot hold the socket's thread (what is left waits for the next tick).
        for _ in 0..MAX_READS_PER_TICK {
            let events = match ino.read_events(&mut buf) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "the ready index's watch failed; its hits are no longer counted");
                    return;
                }
            };
            for ev in events {
                if ev.mask.contains(EventMask::IGNORED) {
                    // The folder was deleted (or its file system unmounted).
                    watching = false;
                    continue;
                }
                if ev.mask.contains(EventMask::Q_OVERFLOW) {
                    if !overflowed {
                        tracing::warn!(
                            "the ready index's event queue overflowed; some hits were not counted \
                             (raise fs.inotify.max_queued_events or lower limits.ready_hits_poll_ms)"
                        );
                        overflowed = true;
                    }
                    continue;
                }
                if !ev.mask.contains(EventMask::OPEN) {
                    continue;
                }
                let Some(name) = ev.name.and_then(|n| n.to_str()) else {
                    continue;
                };
                if let Some(key) = idx.key_of(name) {
                    hit(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_follow_the_socket() {
        assert_eq!(modes(0o660), (0o750, 0o640));
        assert_eq!(modes(0o600), (0o700, 0o600));
        assert_eq!(modes(0o666), (0o755, 0o644));
        assert_eq!(modes(0o620), (0o750, 0o640));
    }

    #[test]
    fn a_path_shared_by_two_pointers_stays_watched_until_both_are_gone() {
        let key = CacheKey::parse(&"ab".repeat(32)).unwrap();
        let (shared, own) = (PathBuf::from("/m/weights.bin"), PathBuf::from("/m/a.onnx"));
        let mut b = Book::default();
        b.record(
            "a".into(),
            key,
            "x".into(),
            vec![shared.clone(), own.clone()],
        );
        b.record("b".into(), key, "y".into(), vec![shared.clone()]);
        assert!(b.forget("a"));
        assert!(!b.forget("a"));
        assert_eq!(b.watched.get(&shared), Some(&vec!["b".to_string()]));
        assert!(!b.watched.contains_key(&own));
        // Recorded again: the old paths go, the new ones come.
        b.record("b".into(), key, "z".into(), vec![own.clone()]);
        assert!(!b.watched.contains_key(&shared));
        assert_eq!(b.watched.get(&own), Some(&vec!["b".to_string()]));
    }

    #[test]
    fn clearing_leaves_what_is_not_a_pointer() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("m"), "x").unwrap();
        std::fs::write(d.path().join(".tmp-m"), "x").unwrap();
        std::fs::write(d.path().join(".keep"), "x").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        clear_dir(d.path()).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [".keep", "sub"]);
    }
}
