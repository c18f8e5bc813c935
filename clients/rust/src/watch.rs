//! Hearing about new versions: [`Client::watch`] subscribes to a model on a connection of its
//! own and returns a [`Watcher`] of its [`WatchEvent`]s; [`Follower`] keeps a value built from
//! the model's current artifact (an ONNX Runtime session, with the `ort` feature:
//! `Follower::sessions`) and swaps in a new one, built on a background thread, each time the
//! model's artifact changes. Consumers call [`Follower::current`] and always get a usable
//! value: the old one stays until its replacement is ready.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::client::{Artifact, Client, ClientError};
use crate::frame::FrameError;
use crate::protocol::*;

impl Client {
    /// Subscribes to `model` on a new connection to the same socket (this client stays free
    /// for other requests), with this client's timeout and response cap. The daemon answers
    /// with the model's state ([`Watcher::status`]), then sends an event for every change of
    /// its ready artifacts until the watcher is dropped. A model not in the repository is
    /// `not_found`; a daemon at `limits.max_watchers` answers `busy`; a daemon older than
    /// the `watch` request answers `unknown_request`.
    pub fn watch(&self, model: &str) -> Result<Watcher, ClientError> {
        let mut c = Client::connect(self.socket_path())?;
        c.set_timeout(self.timeout())?;
        c.set_max_response(self.max_response());
        c.send(&Request::Watch {
            model: model.into(),
        })?;
        match c.recv()?.0 {
            Response::Watching { model } => Ok(Watcher {
                client: c,
                status: model,
            }),
            other => Err(crate::client::unexpected(&other)),
        }
    }
}

/// A subscription to one model's changes (see [`Client::watch`]); its connection takes no
/// other request. Dropping it (or [`WatchCloser::close`]) ends the subscription. As an
/// [`Iterator`] it yields events until the daemon closes the connection.
#[derive(Debug)]
pub struct Watcher {
    client: Client,
    status: ModelStatus,
}

/// Ends a [`Watcher`]'s subscription from another thread: a blocked
/// [`Watcher::next_event`] returns [`FrameError::Closed`].
#[derive(Debug)]
pub struct WatchCloser(UnixStream);

impl WatchCloser {
    /// Shuts the watcher's connection down.
    pub fn close(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

impl Watcher {
    /// The model's state when the subscription started; every event after it follows.
    pub fn status(&self) -> &ModelStatus {
        &self.status
    }

    /// The next event, waiting as long as it takes (the client's timeout bounds reading an
    /// event once it has started to arrive, not the wait for one).
    /// `Err(ClientError::Frame(FrameError::Closed))` when the connection ended: the daemon
    /// stopped (a `shutting_down` error comes first when it could send one) or
    /// [`WatchCloser::close`] was called.
    pub fn next_event(&mut self) -> Result<WatchEvent, ClientError> {
        self.next_timeout(None)?
            .ok_or(ClientError::Frame(FrameError::Closed))
    }

    /// The next event if one arrives within `timeout` (`None`: wait for ever); `Ok(None)`
    /// when none did (the subscription goes on).
    pub fn next_timeout(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Option<WatchEvent>, ClientError> {
        if !wait_readable(self.client.as_raw_fd(), timeout)? {
            return Ok(None);
        }
        match self.client.recv()?.0 {
            Response::WatchEvent(e) => Ok(Some(e)),
            other => Err(crate::client::unexpected(&other)),
        }
    }

    /// A handle that ends this subscription from another thread.
    pub fn closer(&self) -> Result<WatchCloser, ClientError> {
        Ok(WatchCloser(self.client.try_clone_stream()?))
    }
}

impl Iterator for Watcher {
    type Item = Result<WatchEvent, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_event() {
            Err(ClientError::Frame(FrameError::Closed)) => None,
            r => Some(r),
        }
    }
}

/// Waits until `fd` is readable or hung up (`true`), or `timeout` passes (`false`).
fn wait_readable(fd: std::os::fd::RawFd, timeout: Option<Duration>) -> std::io::Result<bool> {
    let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A value built from one artifact, and that artifact's metadata.
#[derive(Debug)]
pub struct Loaded<T> {
    /// The artifact the value was built from.
    pub metadata: ArtifactMeta,
    /// The value (with the `ort` feature, `Mutex<ort::session::Session>` for
    /// `Follower::sessions`).
    pub value: T,
}

/// Why a [`Follower`] could not start: its first acquire, or building its first value.
#[derive(Debug)]
pub enum FollowError {
    /// The subscription or the acquire failed.
    Client(ClientError),
    /// Building the value from the artifact failed (the `open` function's error, as text).
    Open(String),
}

impl std::fmt::Display for FollowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FollowError::Client(e) => write!(f, "{e}"),
            FollowError::Open(e) => write!(f, "opening the artifact: {e}"),
        }
    }
}

impl std::error::Error for FollowError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FollowError::Client(e) => Some(e),
            FollowError::Open(_) => None,
        }
    }
}

impl From<ClientError> for FollowError {
    fn from(e: ClientError) -> Self {
        FollowError::Client(e)
    }
}

/// What the follower's thread reports.
#[derive(Debug, Default)]
struct Report {
    swaps: u64,
    last_error: Option<String>,
    last_event: Option<WatchEvent>,
}

struct Shared<T> {
    current: RwLock<Arc<Loaded<T>>>,
    report: Mutex<Report>,
    changed: Condvar,
    stop: AtomicBool,
    /// The live subscription's connection, so that dropping the follower wakes its thread.
    closer: Mutex<Option<WatchCloser>>,
}

impl<T> Shared<T> {
    fn report(&self) -> MutexGuard<'_, Report> {
        self.report.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps a value built from a model's current artifact: on every `ready` event of its
/// variant with a new key (and after a `resync` or a reconnect) a background thread
/// acquires the artifact, builds a new value with `open` and swaps it in atomically; the
/// previous value is dropped once the last [`Follower::current`] holder lets it go.
/// `changed`, `evicted`, `removed` and `failed` events keep the current value (a session
/// keeps working after its artifact is evicted or its model replaced). When the daemon
/// goes away the thread reconnects (every 1 s, up to every 30 s) and keeps the value
/// meanwhile. Follows the served version: the request's `version` is ignored. Dropping the
/// follower ends its subscription; its thread exits once a build it waits for is over.
pub struct Follower<T> {
    shared: Arc<Shared<T>>,
    /// Detached on drop: the thread may be in an acquire that waits for a build, and
    /// dropping a follower must not wait for that; it exits once it notices.
    _thread: JoinHandle<()>,
}

impl<T> std::fmt::Debug for Follower<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("key", &self.current().metadata.key)
            .field("swaps", &self.swaps())
            .finish()
    }
}

/// Type-erased opener run on the follower's thread.
type Open<T> = Box<dyn FnMut(&Artifact) -> Result<T, String> + Send>;

impl<T: Send + Sync + 'static> Follower<T> {
    /// Subscribes to `req.model` on `socket`, acquires the artifact `req` names (its profile
    /// and backend; `wait` and `timeout_ms` apply to every acquire) and builds the first
    /// value with `open` before returning, so [`Follower::current`] is usable at once.
    pub fn start<E: std::fmt::Display>(
        socket: impl AsRef<Path>,
        req: AcquireRequest,
        mut open: impl FnMut(&Artifact) -> Result<T, E> + Send + 'static,
    ) -> Result<Self, FollowError> {
        let socket = socket.as_ref().to_path_buf();
        let req = AcquireRequest {
            version: None,
            ..req
        };
        let mut open: Open<T> = Box::new(move |a| open(a).map_err(|e| e.to_string()));
        let watcher = Client::connect(&socket)?.watch(&req.model)?;
        let first = load(&socket, &req, &mut open)?;
        let shared = Arc::new(Shared {
            current: RwLock::new(Arc::new(first)),
            report: Mutex::new(Report::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            closer: Mutex::new(Some(watcher.closer()?)),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("trtcache-follow-{}", req.model))
            .spawn(move || follow(s, socket, req, open, watcher))
            .map_err(|e| FollowError::Client(e.into()))?;
        Ok(Follower {
            shared,
            _thread: thread,
        })
    }
}

impl<T> Follower<T> {
    /// The current value and its artifact's metadata. Cheap (a read lock and a reference
    /// count); hold the `Arc` for one request, not for ever, so an old value can go.
    pub fn current(&self) -> Arc<Loaded<T>> {
        self.shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many times a new value was swapped in.
    pub fn swaps(&self) -> u64 {
        self.shared.report().swaps
    }

    /// Why the last attempt to acquire or build a new value failed (the current value was
    /// kept), or why the subscription broke; `None` after a swap.
    pub fn last_error(&self) -> Option<String> {
        self.shared.report().last_error.clone()
    }

    /// The last event the subscription delivered.
    pub fn last_event(&self) -> Option<WatchEvent> {
        self.shared.report().last_event.clone()
    }

    /// Waits until more than `after` swaps have happened (pass [`Follower::swaps`] read
    /// before the change) or `timeout` passes; returns whether a swap happened.
    pub fn wait_swap(&self, after: u64, timeout: Duration) -> bool {
        let g = self.shared.report();
        let (g, _) = self
            .shared
            .changed
            .wait_timeout_while(g, timeout, |r| r.swaps <= after)
            .unwrap_or_else(|e| e.into_inner());
        g.swaps > after
    }
}

impl<T> Drop for Follower<T> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(c) = self
            .shared
            .closer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            c.close();
        }
        self.shared.changed.notify_all();
    }
}

/// Acquires `req` on a fresh connection (the follower's acquires are rare; a kept one would
/// be closed as idle between them) and builds its value.
fn load<T>(
    socket: &Path,
    req: &AcquireRequest,
    open: &mut Open<T>,
) -> Result<Loaded<T>, FollowError> {
    let artifact = Client::connect(socket)?.acquire(req)?;
    let value = open(&artifact).map_err(FollowError::Open)?;
    Ok(Loaded {
        metadata: artifact.metadata.clone(),
        value,
    })
}

/// The follower's thread: events in, swaps out, reconnecting while the daemon is away.
fn follow<T>(
    shared: Arc<Shared<T>>,
    socket: PathBuf,
    req: AcquireRequest,
    mut open: Open<T>,
    watcher: Watcher,
) {
    let mut watcher = Some(watcher);
    let mut backoff = Duration::from_secs(1);
    while !shared.stop.load(Ordering::SeqCst) {
        let Some(w) = watcher.as_mut() else {
            // Reconnect, then catch up with whatever changed while away.
            match Client::connect(&socket).and_then(|c| c.watch(&req.model)) {
                Ok(w) => {
                    match w.closer() {
                        Ok(c) => *shared.closer.lock().unwrap_or_else(|e| e.into_inner()) = Some(c),
                        Err(e) => shared.report().last_error = Some(e.to_string()),
                    }
                    watcher = Some(w);
                    backoff = Duration::from_secs(1);
                    refresh(&shared, &socket, &req, &mut open);
                }
                Err(e) => {
                    shared.report().last_error = Some(format!("watching `{}`: {e}", req.model));
                    let g = shared.report();
                    let _ = shared
                        .changed
                        .wait_timeout_while(g, backoff, |_| !shared.stop.load(Ordering::SeqCst));
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            continue;
        };
        match w.next_event() {
            Ok(ev) => {
                let cur = shared
                    .current
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                let news = match ev.reason {
                    WatchReason::Resync => true,
                    WatchReason::Ready => {
                        ev.backend.as_deref() == Some(cur.metadata.backend.as_str())
                            && ev.profile.as_deref() == Some(cur.metadata.profile.as_str())
                            && ev.key.as_deref() != Some(cur.metadata.key.as_str())
                    }
                    _ => false,
                };
                shared.report().last_event = Some(ev);
                if news {
                    refresh(&shared, &socket, &req, &mut open);
                }
            }
            Err(e) => {
                if !shared.stop.load(Ordering::SeqCst) {
                    shared.report().last_error =
                        Some(format!("watch of `{}` ended: {e}", req.model));
                }
                watcher = None;
            }
        }
    }
}

/// Acquires the current artifact and swaps a new value in when its key differs.
fn refresh<T>(shared: &Shared<T>, socket: &Path, req: &AcquireRequest, open: &mut Open<T>) {
    let current_key = shared
        .current
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .metadata
        .key
        .clone();
    let artifact = match Client::connect(socket).and_then(|mut c| c.acquire(req)) {
        Ok(a) => a,
        Err(e) => {
            shared.report().last_error = Some(format!("acquiring `{}`: {e}", req.model));
            return;
        }
    };
    if artifact.metadata.key == current_key {
        return;
    }
    match open(&artifact) {
        Ok(value) => {
            let loaded = Arc::new(Loaded {
                metadata: artifact.metadata.clone(),
                value,
            });
            let old = std::mem::replace(
                &mut *shared.current.write().unwrap_or_else(|e| e.into_inner()),
                loaded,
            );
            // Outside the lock: dropping a session takes a while, and readers wait for none.
            drop(old);
            let mut r = shared.report();
            r.swaps += 1;
            r.last_error = None;
            drop(r);
            shared.changed.notify_all();
        }
        Err(e) => {
            shared.report().last_error = Some(format!(
                "opening `{}` ({}): {e}",
                req.model, artifact.metadata.key
            ))
        }
    }
}
