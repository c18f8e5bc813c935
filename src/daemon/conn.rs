//! One client connection's framing: length-prefixed JSON frames read with the size, idle and
//! frame deadlines of `limits`, responses written within the frame deadline with an
//! artifact's descriptors riding on their first bytes (`SCM_RIGHTS`), the peer's
//! credentials, and noticing a peer that hung up while its request waits.
//!
//! Enters: an accepted [`UnixStream`]. Leaves: parsed [`Request`]s (or the error body of a
//! frame that is not one) for [`super::dispatch`], until the connection is over; every way a
//! connection ends (closed, idle, too large, too slow, reclaimed) is answered here.

use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::Notify;
use trtcache_client::frame;
use trtcache_client::protocol::*;

use crate::config::Limits;

/// Who is on the other end of a connection.
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer {
    pub uid: u32,
    pub pid: Option<i32>,
}

impl Peer {
    /// Whether the peer may make admin requests: root or the daemon's own user.
    pub fn is_admin(&self) -> bool {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        self.uid == 0 || self.uid == me
    }
}

/// One connection as the accept loop sees it: since when it has been waiting for the first
/// byte of its next request (None while a frame arrives or a request runs), and how to tell it
/// to give its slot up.
#[derive(Default)]
pub(super) struct Slot {
    waiting_since: std::sync::Mutex<Option<Instant>>,
    pub(super) reclaim: Notify,
}

impl Slot {
    pub(super) fn set_waiting(&self, on: bool) {
        *self.waiting_since.lock().unwrap_or_else(|e| e.into_inner()) = on.then(Instant::now);
    }
    pub(super) fn waiting_since(&self) -> Option<Instant> {
        *self.waiting_since.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An error response.
pub(super) fn error(code: ErrorCode, msg: impl Into<String>) -> Response {
    Response::Error(ErrorBody {
        code,
        message: msg.into(),
    })
}

/// A connection: the stream and the limits its frames are read and written under.
pub(super) struct Connection {
    stream: UnixStream,
    max_frame: u32,
    idle: Duration,
    deadline: Duration,
}

impl Connection {
    pub fn new(stream: UnixStream, limits: &Limits) -> Self {
        Self {
            stream,
            max_frame: limits.max_frame_bytes,
            idle: Duration::from_secs(limits.idle_timeout_secs),
            deadline: Duration::from_secs(limits.frame_timeout_secs),
        }
    }

    /// The peer's credentials (SO_PEERCRED).
    pub fn peer(&self) -> std::io::Result<Peer> {
        let c = self.stream.peer_cred()?;
        Ok(Peer {
            uid: c.uid(),
            pid: c.pid(),
        })
    }

    /// Sends one response within the frame deadline.
    pub async fn send(&mut self, resp: &Response, fds: &[RawFd]) -> std::io::Result<()> {
        respond(&mut self.stream, self.deadline, resp, fds).await
    }

    /// Resolves when the peer has gone (see [`hung_up`]).
    pub async fn hung_up(&self) {
        hung_up(&self.stream).await
    }

    /// For a connection that takes no further requests (a watch): resolves when the peer
    /// closes (or shuts down its writing side: `false`) or sends anything (`true`; the byte
    /// is consumed, the connection is to be closed).
    pub async fn input(&self) -> bool {
        loop {
            if self.stream.readable().await.is_err() {
                return false;
            }
            let mut b = [0u8; 1];
            match self.stream.try_read(&mut b) {
                Ok(n) => return n > 0,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return false,
            }
        }
    }

    /// The next request: `Some(Ok)` to dispatch, `Some(Err)` for a frame that is not a
    /// request (answer it and read on), `None` when the connection is over; why it ended has
    /// been answered and logged.
    pub async fn next_request(
        &mut self,
        slot: &Slot,
        peer: Peer,
    ) -> Option<Result<Request, ErrorBody>> {
        let out = read_request(
            &mut self.stream,
            self.max_frame,
            self.idle,
            self.deadline,
            slot,
        )
        .await;
        let closing = match out {
            Ok(ReadOutcome::Frame(body)) => {
                let r = parse(&body);
                if let Err(body) = &r {
                    // debug: a client sending garbage must not flood the daemon's log.
                    tracing::debug!(uid = peer.uid, code = %body.code, "rejected request: {}", body.message);
                }
                return Some(r);
            }
            Ok(ReadOutcome::Closed) => return None,
            Ok(ReadOutcome::TooLarge(n)) => {
                let msg = format!("frame of {n} bytes exceeds the limit of {}", self.max_frame);
                tracing::warn!(uid = peer.uid, "{msg}; closing");
                error(ErrorCode::FrameTooLarge, msg)
            }
            Ok(ReadOutcome::Slow) => {
                tracing::warn!(
                    uid = peer.uid,
                    "request frame not completed in time; closing"
                );
                let msg = format!(
                    "request frame not completed within {} s",
                    self.deadline.as_secs()
                );
                error(ErrorCode::IdleTimeout, msg)
            }
            Ok(ReadOutcome::Reclaimed) => {
                tracing::info!(uid = peer.uid, "idle connection closed to make room");
                // Best effort: an idle peer has room for one small frame, and waiting here
                // would keep the new connection waiting for this slot.
                if let Ok(b) = frame::encode(&error(
                    ErrorCode::IdleTimeout,
                    "idle connection closed to make room (max_connections)",
                )) {
                    let _ = self.stream.try_write(&b);
                }
                return None;
            }
            Ok(ReadOutcome::Idle) => error(ErrorCode::IdleTimeout, "idle too long"),
            Err(e) => {
                tracing::debug!(error = %e, "connection read failed");
                return None;
            }
        };
        let _ = self.send(&closing, &[]).await;
        None
    }
}

/// Writes one frame; the descriptors ride on its first bytes.
pub(super) async fn write_response(
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
    conn: &Slot,
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
