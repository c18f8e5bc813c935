//! The Unix-socket server: accepts connections (bounded by a semaphore), logs each peer's
//! SO_PEERCRED, reads length-prefixed JSON frames with size and idle limits, dispatches them to
//! the [`Service`], and writes responses, attaching an artifact's files as `SCM_RIGHTS`
//! descriptors. Protocol types and framing come from `trtcache_client`.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use trtcache_client::frame;
use trtcache_client::protocol::*;

use super::service::{Failure, Service};

/// Who is on the other end of a connection.
#[derive(Clone, Copy, Debug)]
struct Peer {
    uid: u32,
    pid: Option<i32>,
}

/// One connection as the accept loop sees it: since when it has been waiting for the first
/// byte of its next request (None while a frame arrives or a request runs), and how to tell it
/// to give its slot up.
#[derive(Default)]
struct Conn {
    waiting_since: std::sync::Mutex<Option<Instant>>,
    reclaim: Notify,
}

impl Conn {
    fn set_waiting(&self, on: bool) {
        *self.waiting_since.lock().unwrap_or_else(|e| e.into_inner()) = on.then(Instant::now);
    }
    fn waiting_since(&self) -> Option<Instant> {
        *self.waiting_since.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The live connections, so that at the limit the longest-idle one can be reclaimed.
#[derive(Default)]
struct Conns {
    next: AtomicU64,
    live: std::sync::Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the connection that has waited longest for a request (at least `min`) to close.
    fn reclaim_one(&self, min: Duration) -> bool {
        let now = Instant::now();
        let oldest = self
            .lock()
            .values()
            .filter_map(|c| Some((c.waiting_since()?, c.clone())))
            .filter(|(t, _)| now.duration_since(*t) >= min)
            .min_by_key(|(t, _)| *t);
        match oldest {
            Some((_, c)) => {
                c.set_waiting(false);
                c.reclaim.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Raises the soft open-files limit to the hard one (systemd's default soft limit is 1024,
/// below `max_connections` plus the descriptors each acquire opens): out of descriptors,
/// `accept` fails and every client waits in the backlog. Warns when even the hard limit is
/// short of the connection limit.
pub fn raise_nofile(max_connections: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        if lim.rlim_cur < lim.rlim_max {
            let old = lim.rlim_cur;
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                tracing::debug!(from = old, to = lim.rlim_cur, "raised the open-files limit");
            } else {
                lim.rlim_cur = old;
            }
        }
    }
    // Each connection holds one descriptor, an acquire briefly a few more; the cache and the
    // runtime need some of their own.
    let want = (max_connections as u64)
        .saturating_mul(2)
        .saturating_add(64);
    if lim.rlim_cur < want {
        tracing::warn!(
            open_files = lim.rlim_cur,
            max_connections,
            "the open-files limit is low for limits.max_connections; raise LimitNOFILE"
        );
    }
}

/// Accepts connections until `shutdown` turns true.
pub async fn accept_loop(
    svc: Arc<Service>,
    listener: UnixListener,
    mut shutdown: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
) {
    let slots = Arc::new(Semaphore::new(svc.cfg.limits.max_connections));
    let conns = Arc::new(Conns::default());
    let reclaim_after = Duration::from_secs(svc.cfg.limits.reclaim_idle_secs);
    loop {
        let conn = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => break,
        };
        let stream = match conn {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let mut permit = slots.clone().try_acquire_owned().ok();
        if permit.is_none() && conns.reclaim_one(reclaim_after) {
            // The reclaimed connection only has to notice and drop its permit.
            permit = tokio::time::timeout(Duration::from_secs(1), slots.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok);
        }
        let Some(permit) = permit else {
            tracing::warn!(
                limit = svc.cfg.limits.max_connections,
                "connection refused: too many connections"
            );
            tokio::spawn(async move {
                let mut s = stream;
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    write_response(&mut s, &error(ErrorCode::Busy, "too many connections"), &[]),
                )
                .await;
            });
            continue;
        };
        let svc = svc.clone();
        let stop = stop.clone();
        let shutdown = shutdown.clone();
        let conns = conns.clone();
        tokio::spawn(async move {
            let id = conns.next.fetch_add(1, Ordering::Relaxed);
            let conn = Arc::new(Conn::default());
            conns.lock().insert(id, conn.clone());
            svc.counters.connections.fetch_add(1, Ordering::Relaxed);
            handle(svc.clone(), stream, stop, shutdown, &conn).await;
            svc.counters.connections.fetch_sub(1, Ordering::Relaxed);
            conns.lock().remove(&id);
            drop(permit);
        });
    }
}

fn error(code: ErrorCode, msg: impl Into<String>) -> Response {
    Response::Error(ErrorBody {
        code,
        message: msg.into(),
    })
}

fn failure(f: Failure) -> Response {
    error(f.0, f.1)
}

/// Writes one frame; the descriptors ride on its first bytes.
async fn write_response(
    s: &mut UnixStream,
    resp: &Response,
    fds: &[std::os::fd::RawFd],
) -> std::io::Result<()> {
    let bytes = frame::encode(resp).map_err(std::io::Error::other)?;
    if fds.is_empty() {
        return s.write_all(&bytes).await;
    }
    let sent = loop {
        s.writable().await?;
        match s.try_io(tokio::io::Interest::WRITABLE, || {
            frame::send_with_fds(s.as_raw_fd(), &bytes, fds)
        }) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    s.write_all(&bytes[sent..]).await
}

/// [`write_response`] within the frame deadline: a peer that stops reading loses its
/// connection rather than holding a slot.
async fn respond(
    s: &mut UnixStream,
    limit: Duration,
    resp: &Response,
    fds: &[std::os::fd::RawFd],
) -> std::io::Result<()> {
    tokio::time::timeout(limit, write_response(s, resp, fds))
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "peer did not read the response",
            ))
        })
}

enum ReadOutcome {
    Frame(Vec<u8>),
    Closed,
    TooLarge(u32),
    Idle,
    /// The frame started but did not complete within the frame deadline.
    Slow,
    /// The accept loop gave this idle connection's slot to a new one.
    Reclaimed,
}

/// Reads one request frame: up to `idle` for its first byte (while the connection counts as
/// waiting, so it can be reclaimed), then up to `frame` for the rest. The body grows as bytes
/// arrive, so a length prefix alone reserves no memory.
async fn read_request(
    s: &mut UnixStream,
    max: u32,
    idle: Duration,
    frame: Duration,
    conn: &Conn,
) -> std::io::Result<ReadOutcome> {
    let mut first = [0u8; 1];
    conn.set_waiting(true);
    let r = tokio::select! {
        r = tokio::time::timeout(idle, s.read(&mut first)) => r,
        _ = conn.reclaim.notified() => return Ok(ReadOutcome::Reclaimed),
    };
    conn.set_waiting(false);
    match r {
        Err(_) => return Ok(ReadOutcome::Idle),
        Ok(Ok(0)) => return Ok(ReadOutcome::Closed),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(e),
    }
    let rest = async {
        let mut len = [first[0], 0, 0, 0];
        match s.read_exact(&mut len[1..]).await {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Ok(ReadOutcome::Closed)
            }
            r => r?,
        };
        let len = u32::from_be_bytes(len);
        if len > max {
            return Ok(ReadOutcome::TooLarge(len));
        }
        let mut body = Vec::with_capacity((len as usize).min(64 << 10));
        (&mut *s).take(len.into()).read_to_end(&mut body).await?;
        Ok(if body.len() < len as usize {
            ReadOutcome::Closed
        } else {
            ReadOutcome::Frame(body)
        })
    };
    tokio::time::timeout(frame, rest)
        .await
        .unwrap_or(Ok(ReadOutcome::Slow))
}

/// Parses a request body, telling malformed frames from unknown requests from bad fields.
pub fn parse(body: &[u8]) -> Result<Request, ErrorBody> {
    let error = |code, message: String| ErrorBody { code, message };
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| error(ErrorCode::BadFrame, format!("frame is not JSON: {e}")))?;
    let op = v.get("op").and_then(|o| o.as_str()).ok_or_else(|| {
        error(
            ErrorCode::BadFrame,
            "frame is not a JSON object with a string `op`".into(),
        )
    })?;
    if !REQUEST_OPS.contains(&op) {
        return Err(error(
            ErrorCode::UnknownRequest,
            format!("unknown request `{op}`"),
        ));
    }
    serde_json::from_value(v.clone())
        .map_err(|e| error(ErrorCode::BadRequest, format!("bad `{op}` request: {e}")))
}

#[tracing::instrument(skip_all, fields(uid, pid))]
async fn handle(
    svc: Arc<Service>,
    mut s: UnixStream,
    stop: watch::Sender<bool>,
    shutdown: watch::Receiver<bool>,
    conn: &Conn,
) {
    let peer = match s.peer_cred() {
        Ok(c) => Peer {
            uid: c.uid(),
            pid: c.pid(),
        },
        Err(e) => {
            tracing::warn!(error = %e, "SO_PEERCRED failed; closing");
            return;
        }
    };
    tracing::Span::current()
        .record("uid", peer.uid)
        .record("pid", peer.pid.unwrap_or(-1));
    tracing::info!(uid = peer.uid, pid = ?peer.pid, "connection");
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let admin = peer.uid == 0 || peer.uid == me;
    let limits = &svc.cfg.limits;
    let idle = Duration::from_secs(limits.idle_timeout_secs);
    let deadline = Duration::from_secs(limits.frame_timeout_secs);
    let mut greeted = false;
    loop {
        let body = match read_request(&mut s, limits.max_frame_bytes, idle, deadline, conn).await {
            Ok(ReadOutcome::Frame(b)) => b,
            Ok(ReadOutcome::Closed) => return,
            Ok(ReadOutcome::TooLarge(n)) => {
                let msg = format!(
                    "frame of {n} bytes exceeds the limit of {}",
                    limits.max_frame_bytes
                );
                tracing::warn!(uid = peer.uid, "{msg}; closing");
                let _ = respond(&mut s, deadline, &error(ErrorCode::FrameTooLarge, msg), &[]).await;
                return;
            }
            Ok(ReadOutcome::Slow) => {
                tracing::warn!(
                    uid = peer.uid,
                    "request frame not completed in time; closing"
                );
                let msg = format!(
                    "request frame not completed within {} s",
                    limits.frame_timeout_secs
                );
                let _ = respond(&mut s, deadline, &error(ErrorCode::IdleTimeout, msg), &[]).await;
                return;
            }
            Ok(ReadOutcome::Reclaimed) => {
                tracing::info!(uid = peer.uid, "idle connection closed to make room");
                // Best effort: an idle peer has room for one small frame, and waiting here
                // would keep the new connection waiting for this slot.
                if let Ok(b) = frame::encode(&error(
                    ErrorCode::IdleTimeout,
                    "idle connection closed to make room (max_connections)",
                )) {
                    let _ = s.try_write(&b);
                }
                return;
            }
            Ok(ReadOutcome::Idle) => {
                let _ = respond(
                    &mut s,
                    deadline,
                    &error(ErrorCode::IdleTimeout, "idle too long"),
                    &[],
                )
                .await;
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "connection read failed");
                return;
            }
        };
        let req = match parse(&body) {
            Ok(r) => r,
            Err(body) => {
                tracing::info!(uid = peer.uid, code = %body.code, "rejected request: {}", body.message);
                let resp = Response::Error(body);
                if respond(&mut s, deadline, &resp, &[]).await.is_err() {
                    return;
                }
                continue;
            }
        };
        if *shutdown.borrow() && !matches!(req, Request::Hello { .. }) {
            let _ = respond(
                &mut s,
                deadline,
                &error(ErrorCode::ShuttingDown, "the daemon is shutting down"),
                &[],
            )
            .await;
            return;
        }
        let result = match req {
            Request::Hello { version, client } => {
                if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
                    Err(error(
                        ErrorCode::UnsupportedVersion,
                        format!("protocol {version} not supported (server speaks {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION})"),
                    ))
                } else {
                    greeted = true;
                    tracing::debug!(client = %client, version, "hello");
                    Ok(Response::Hello {
                        version: PROTOCOL_VERSION,
                        server: concat!("trtcache/", env!("CARGO_PKG_VERSION")).into(),
                        max_frame: limits.max_frame_bytes,
                    })
                }
            }
            _ if !greeted => Err(error(ErrorCode::UnsupportedVersion, "send `hello` first")),
            Request::List => Ok(Response::Models { models: svc.list() }),
            Request::Status { model } => svc
                .status(&model)
                .map(|model| Response::Status { model })
                .map_err(failure),
            Request::Acquire(a) => {
                let r = tokio::select! {
                    r = svc.acquire(&a) => r,
                    _ = wait_true(shutdown.clone()) => Err((ErrorCode::ShuttingDown, "the daemon is shutting down".into())),
                    // A consumer that dies while its acquire waits for a build (minutes for
                    // TensorRT) must not hold its connection slot until the build ends.
                    _ = hung_up(&s) => {
                        tracing::info!(uid = peer.uid, model = %a.model, "client gone while its acquire waited; connection closed");
                        return;
                    }
                };
                match r {
                    Ok((metadata, files)) => {
                        tracing::debug!(model = %metadata.model, key = %metadata.key, "acquire");
                        let fds: Vec<_> = files.iter().map(|f| f.as_raw_fd()).collect();
                        if respond(&mut s, deadline, &Response::Artifact { metadata }, &fds)
                            .await
                            .is_err()
                        {
                            return;
                        }
                        continue;
                    }
                    Err(f) => Err(failure(f)),
                }
            }
            Request::Build(b) if !b.paths.is_empty() && !admin => {
                tracing::warn!(uid = peer.uid, "build from a path refused");
                Err(error(
                    ErrorCode::PermissionDenied,
                    "building from a path needs root or the daemon's user; others name models in the repository",
                ))
            }
            Request::Build(b) => {
                let (tx, mut rx) = mpsc::channel(64);
                let svc2 = svc.clone();
                let task = tokio::spawn(async move { svc2.build(&b, tx).await });
                while let Some(p) = rx.recv().await {
                    if respond(&mut s, deadline, &Response::Progress(p), &[])
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                match task.await {
                    Ok(Ok(results)) => Ok(Response::Built { results }),
                    Ok(Err(f)) => Err(failure(f)),
                    Err(e) => Err(error(ErrorCode::Internal, e.to_string())),
                }
            }
            Request::Evict { .. } | Request::Shutdown if !admin => {
                tracing::warn!(uid = peer.uid, "admin request refused");
                Err(error(
                    ErrorCode::PermissionDenied,
                    "evict and shutdown need root or the daemon's user",
                ))
            }
            Request::Evict { model, key } => svc
                .evict(model.as_deref(), key.as_deref())
                .await
                .map(|removed| Response::Evicted { removed })
                .map_err(failure),
            Request::Stats { format } => Ok(match format {
                StatsFormat::Json => Response::Stats { stats: svc.stats() },
                StatsFormat::Prometheus => Response::StatsText {
                    text: svc.stats().prometheus(),
                },
            }),
            Request::Shutdown => {
                tracing::info!(uid = peer.uid, "shutdown requested");
                let _ = stop.send(true);
                Ok(Response::ShuttingDown)
            }
        };
        let resp = result.unwrap_or_else(|e| e);
        if respond(&mut s, deadline, &resp, &[]).await.is_err() {
            return;
        }
    }
}

/// Resolves when the peer has closed its socket (or reset it). Peeks, so a request the peer
/// queued behind the current one stays in the socket; once one is queued, or once the peer
/// has only shut down its writing side (it still reads the answer), this never resolves.
async fn hung_up(s: &UnixStream) {
    loop {
        if s.readable().await.is_err() {
            return;
        }
        let mut b = [0u8; 1];
        let r = s.try_io(tokio::io::Interest::READABLE, || {
            // SAFETY: a one-byte receive into a valid buffer on this stream's open descriptor.
            let n = unsafe {
                libc::recv(
                    s.as_raw_fd(),
                    b.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n)
            }
        });
        match r {
            // End of stream: gone, unless it only shut down its writing side and still
            // reads (then both directions are not shut and there is no POLLHUP).
            Ok(0) => {
                let mut p = libc::pollfd {
                    fd: s.as_raw_fd(),
                    events: 0,
                    revents: 0,
                };
                // SAFETY: poll on one valid pollfd, without waiting.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                if n < 0 || p.revents & libc::POLLHUP != 0 {
                    return;
                }
                std::future::pending::<()>().await
            }
            Ok(_) => std::future::pending::<()>().await,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
    }
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_tells_bad_frames_from_unknown_requests() {
        let code = |b: &[u8]| match parse(b) {
            Err(e) => Some(e.code),
            _ => None,
        };
        assert_eq!(code(b"not json"), Some(ErrorCode::BadFrame));
        assert_eq!(code(b"[1,2]"), Some(ErrorCode::BadFrame));
        assert_eq!(
            code(br#"{"op":"frobnicate"}"#),
            Some(ErrorCode::UnknownRequest)
        );
        assert_eq!(code(br#"{"op":"status"}"#), Some(ErrorCode::BadRequest));
        assert!(parse(br#"{"op":"list"}"#).is_ok());
    }
}
