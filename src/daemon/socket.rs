//! The daemon's socket file: binding it (refusing a live daemon's, replacing a stale one),
//! knowing it by device and inode, and keeping it. The file is removed at shutdown only while
//! it is still the one this daemon bound, so stopping a daemon never removes a successor's
//! live socket. A periodic check ([`watch`]) notices the file gone (deleted by hand, a
//! cleaner of `/run`) and binds the path again; a path now holding another file (another
//! daemon took it over) ends the daemon with an error, so a service manager restarts it.
//! A socket passed by systemd (socket activation) is systemd's: never checked nor removed.
//!
//! Enters: the configured path, mode and group. Leaves: listeners for the accept loop.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch as tokio_watch};

use crate::config::Config;

/// The socket could not be bound, set up or kept (the daemon does not start, or stops).
#[derive(Debug, thiserror::Error)]
#[error("socket {path}: {message}")]
pub struct SocketError {
    pub path: PathBuf,
    pub message: String,
}

pub(super) fn socket_err(path: &Path, message: impl Into<String>) -> SocketError {
    SocketError {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// A socket file by identity: what [`bind`] created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketId {
    dev: u64,
    ino: u64,
}

impl SocketId {
    /// The identity of whatever is at `path` now (not following a link).
    fn at(path: &Path) -> std::io::Result<SocketId> {
        let m = std::fs::symlink_metadata(path)?;
        Ok(SocketId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// Binds the configured socket path: refuses when a live daemon answers there, replaces a
/// stale socket file, then applies the mode and group. Returns the listener and the file's
/// identity.
pub fn bind(cfg: &Config) -> Result<(std::os::unix::net::UnixListener, SocketId), SocketError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let path = &cfg.socket;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| socket_err(path, e.to_string()))?;
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(socket_err(
                path,
                "exists and is not a socket; refusing to replace it",
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(socket_err(
                path,
                "another trtcache daemon is listening there",
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| socket_err(path, format!("removing stale socket: {e}")))?;
    }
    let l = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| socket_err(path, e.to_string()))?;
    // From here on a failure (mode, group) removes the file again: a failed start leaves
    // no socket behind for clients to find.
    let setup = || -> Result<SocketId, SocketError> {
        let id = SocketId::at(path).map_err(|e| socket_err(path, e.to_string()))?;
        let mode = cfg
            .socket_mode_bits()
            .map_err(|e| socket_err(path, e.to_string()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| socket_err(path, format!("chmod: {e}")))?;
        if let Some(group) = &cfg.socket_group {
            let c = std::ffi::CString::new(group.as_str())
                .map_err(|_| socket_err(path, "bad group name"))?;
            // SAFETY: getgrnam with a valid C string; the result is read before any other call.
            let gid = unsafe {
                let g = libc::getgrnam(c.as_ptr());
                if g.is_null() {
                    return Err(socket_err(path, format!("no group `{group}`")));
                }
                (*g).gr_gid
            };
            std::os::unix::fs::chown(path, None, Some(gid))
                .map_err(|e| socket_err(path, format!("chown to group `{group}`: {e}")))?;
        }
        l.set_nonblocking(true)
            .map_err(|e| socket_err(path, e.to_string()))?;
        Ok(id)
    };
    match setup() {
        Ok(id) => Ok((l, id)),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
}

/// The socket file this daemon owns now (replaced when [`watch`] binds it again).
#[derive(Clone, Debug)]
pub struct Owned {
    path: PathBuf,
    id: Arc<Mutex<SocketId>>,
}

impl Owned {
    pub fn new(path: &Path, id: SocketId) -> Self {
        Owned {
            path: path.to_path_buf(),
            id: Arc::new(Mutex::new(id)),
        }
    }

    fn id(&self) -> SocketId {
        *self.id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes the socket file if it is still the one this daemon bound; another file at
    /// the path (a successor's socket) is left alone.
    pub fn remove(&self) {
        match SocketId::at(&self.path) {
            Ok(now) if now == self.id() => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(socket = %self.path.display(), error = %e, "cannot remove the socket");
                }
            }
            Ok(_) => {
                tracing::info!(socket = %self.path.display(), "the socket path holds another file now; left in place")
            }
            Err(_) => {}
        }
    }
}

/// Checks every `every` that the socket file is still ours. When it is gone, binds the path
/// again and hands the new listener to the accept loop through `rebound`; when another file
/// took its place, records why in `fatal` and stops the daemon. Ends at shutdown.
pub async fn watch(
    cfg: Config,
    owned: Owned,
    every: Duration,
    rebound: mpsc::Sender<tokio::net::UnixListener>,
    stop: tokio_watch::Sender<bool>,
    fatal: Arc<Mutex<Option<String>>>,
) {
    let mut shutdown = stop.subscribe();
    let die = |why: String| {
        tracing::error!(socket = %owned.path.display(), "{why}");
        *fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        let _ = stop.send(true);
    };
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match SocketId::at(&owned.path) {
            Ok(now) if now == owned.id() => continue,
            Ok(_) => {
                return die(
                    "the socket file was replaced by another file (another daemon on this path?); stopping so the service manager restarts this one".into(),
                )
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(socket = %owned.path.display(), error = %e, "cannot check the socket file");
                continue;
            }
        }
        tracing::error!(socket = %owned.path.display(), "the socket file was deleted; binding it again");
        let bound = bind(&cfg).and_then(|(l, id)| {
            tokio::net::UnixListener::from_std(l)
                .map(|l| (l, id))
                .map_err(|e| socket_err(&owned.path, e.to_string()))
        });
        match bound {
            Ok((l, id)) => {
                *owned.id.lock().unwrap_or_else(|p| p.into_inner()) = id;
                if rebound.send(l).await.is_err() {
                    return;
                }
                tracing::info!(socket = %owned.path.display(), "socket bound again");
            }
            Err(e) => {
                return die(format!(
                    "the socket file was deleted and cannot be bound again: {e}"
                ))
            }
        }
    }
}
