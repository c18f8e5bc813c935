//! The ready index (`<socket>.ready/`, format and the consumer's checks in
//! [`trtcache_client::ready`]): one pointer file per model whose default artifact is ready,
//! so that a local consumer opens it without a round trip on the socket. This module owns the
//! folder: it empties it at start, keeps it equal to what [`Service::ready_pointers`] says
//! (rewritten with a rename when a pointer changes, removed when an artifact stops being
//! served), empties it again at shutdown, and counts every open of a pointer (an inotify
//! watch) as a hit of its artifact ([`Service::fast_hit`]).
//!
//! The folder may be read by whoever may use the socket: its mode follows the socket's (a
//! class with read or write on the socket gets `r-x` on the folder and `r--` on the
//! pointers) and so does its group.
//!
//! Enters: the socket path and the service. Leaves: files in the folder, hits.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trtcache_client::protocol::valid_model_name;
use trtcache_client::ready::ready_dir;

use super::service::{DefaultSelections, Service};
use crate::spec::CacheKey;

/// Prefix of a pointer being written (hidden: never a model name, never counted).
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
    published: Mutex<HashMap<String, Published>>,
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

impl ReadyIndex {
    /// Creates (or empties) the index folder of the daemon listening at `socket`, with the
    /// socket's group and a mode derived from the socket's.
    pub fn create(socket: &Path) -> Result<Arc<ReadyIndex>, ReadyIndexError> {
        let dir = ready_dir(socket);
        let err = |source| ReadyIndexError {
            dir: dir.clone(),
            source,
        };
        let sock = std::fs::metadata(socket).map_err(err)?;
        let (dir_mode, file_mode) = modes(sock.mode());
        let idx = ReadyIndex {
            dir: dir.clone(),
            dir_mode,
            file_mode,
            gid: sock.gid(),
            changed: tokio::sync::Notify::new(),
            remade: tokio::sync::Notify::new(),
            published: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        };
        if !idx.ensure_dir().map_err(err)? {
            clear_dir(&dir).map_err(err)?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(dir_mode)).map_err(err)?;
        std::os::unix::fs::chown(&dir, None, Some(idx.gid)).map_err(err)?;
        Ok(Arc::new(idx))
    }

    /// Makes the folder (with its mode and group) when it is missing; `Ok(true)` when it was
    /// made. Something else at its path is an error: the daemon never replaces it.
    fn ensure_dir(&self) -> std::io::Result<bool> {
        match std::fs::symlink_metadata(&self.dir) {
            Ok(m) if m.file_type().is_dir() => Ok(false),
            Ok(_) => Err(std::io::Error::other(
                "exists and is not a folder; refusing to replace it",
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&self.dir)?;
                std::fs::set_permissions(
                    &self.dir,
                    std::fs::Permissions::from_mode(self.dir_mode),
                )?;
                std::os::unix::fs::chown(&self.dir, None, Some(self.gid))?;
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Asks the publisher to compare the index with the state now.
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    fn published(&self) -> std::sync::MutexGuard<'_, HashMap<String, Published>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key a model's pointer names now.
    fn key_of(&self, name: &str) -> Option<CacheKey> {
        self.published().get(name).map(|p| p.key)
    }

    /// Makes the folder hold exactly `want` (model name → key and text); with a `scope`,
    /// only the pointers of the models it names are looked at (the others are as they were).
    /// A pointer that cannot be written is left out (and tried again at the next pass).
    /// `true` when the folder had to be made again (or cannot be): a scoped pass then leaves
    /// the other models' pointers unwritten, and the next pass must look at every model.
    fn reconcile(
        &self,
        want: HashMap<String, (CacheKey, String)>,
        scope: Option<&std::collections::BTreeSet<String>>,
    ) -> bool {
        let mut published = self.published();
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        let mut remade = false;
        match self.ensure_dir() {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(dir = %self.dir.display(), "the ready index folder was gone; made it again");
                published.clear();
                self.remade.notify_one();
                remade = true;
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot make the ready index folder");
                published.clear();
                return true;
            }
        }
        let gone: Vec<String> = match scope {
            None => published
                .keys()
                .filter(|n| !want.contains_key(*n))
                .cloned()
                .collect(),
            Some(names) => names
                .iter()
                .filter(|n| published.contains_key(*n) && !want.contains_key(*n))
                .cloned()
                .collect(),
        };
        for name in gone {
            published.remove(&name);
            match std::fs::remove_file(self.dir.join(&name)) {
                Ok(()) => tracing::debug!(model = %name, "ready pointer removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(model = %name, error = %e, "cannot remove a ready pointer")
                }
            }
        }
        for (name, (key, text)) in want {
            let path = self.dir.join(&name);
            let same = published.get(&name).is_some_and(|p| p.text == text);
            if same && path.exists() {
                continue;
            }
            match self.write(&name, &text) {
                Ok(()) => {
                    tracing::debug!(model = %name, %key, "ready pointer written");
                    published.insert(name, Published { key, text });
                }
                Err(e) => {
                    published.remove(&name);
                    let _ = std::fs::remove_file(&path);
                    tracing::warn!(model = %name, error = %e, "cannot write a ready pointer; the model is served over the socket only");
                }
            }
        }
        remade
    }

    /// Writes one pointer: a hidden temp file, then renamed over the old one, so a consumer
    /// reads the old pointer or the new one, never half of one.
    fn write(&self, name: &str, text: &str) -> std::io::Result<()> {
        let tmp = self.dir.join(format!("{TMP_PREFIX}{name}"));
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

    /// Removes every pointer (the daemon stops: consumers ask the socket, which says so).
    pub fn clear(&self) {
        let mut published = self.published();
        self.closed.store(true, Ordering::SeqCst);
        published.clear();
        if let Err(e) = clear_dir(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot empty the ready index");
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

/// Keeps the index equal to the state until `stop`: after every change signal (bursts are
/// taken together) and every `recheck` (`limits.ready_recheck_secs`; `None`: only on
/// changes).
pub async fn publish(
    svc: Arc<Service>,
    idx: Arc<ReadyIndex>,
    recheck: Option<Duration>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut sels = DefaultSelections::new();
    // The first pass and the periodic recheck look at every model; a change signal, at the
    // models the service marked (see `Service::ready_pointers`).
    let mut full = true;
    loop {
        let pass = {
            let (svc, idx) = (svc.clone(), idx.clone());
            let mut s = std::mem::take(&mut sels);
            tokio::task::spawn_blocking(move || {
                let (scope, pointers) = svc.ready_pointers(&mut s, full);
                let want = pointers
                    .into_iter()
                    .filter_map(|(name, (key, p))| match p.render() {
                        Some(text) => Some((name, (key, text))),
                        None => {
                            tracing::debug!(model = %name, "no ready pointer: a path cannot be written in one");
                            None
                        }
                    })
                    .collect();
                let again = idx.reconcile(want, scope.as_ref()) && scope.is_some();
                (s, again)
            })
        };
        let mut retry_full = false;
        match pass.await {
            Ok((s, again)) => {
                sels = s;
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

/// Counts every open of a pointer as a hit of the artifact it names, until `stop`. Opens of
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
    svc: Arc<Service>,
    idx: Arc<ReadyIndex>,
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
                    svc.fast_hit(key);
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
