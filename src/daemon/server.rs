//! The Unix-socket server: accepts connections (bounded by a semaphore, reclaiming the
//! longest-idle one at the limit), and runs each: [`super::conn`] frames it,
//! [`super::dispatch`] applies its requests to the [`Service`]. Protocol types and framing
//! come from `trtcache_client`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use trtcache_client::protocol::*;

use super::conn::{error, write_response, Connection, Slot};
use super::dispatch::{Flow, Session};
use super::service::Service;

/// The live connections, so that at the limit the longest-idle one can be reclaimed.
#[derive(Default)]
struct Conns {
    next: AtomicU64,
    live: std::sync::Mutex<HashMap<u64, Arc<Slot>>>,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
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
    mut listener: UnixListener,
    mut rebound: tokio::sync::mpsc::Receiver<UnixListener>,
    mut shutdown: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
) {
    let slots = Arc::new(Semaphore::new(svc.cfg.limits.max_connections));
    let conns = Arc::new(Conns::default());
    let reclaim_after = Duration::from_secs(svc.cfg.limits.reclaim_idle_secs);
    svc.accepting.store(true, Ordering::SeqCst);
    loop {
        let conn = tokio::select! {
            r = listener.accept() => r,
            // The socket file was deleted and bound again (`socket::watch`).
            Some(l) = rebound.recv() => {
                listener = l;
                continue;
            }
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
            let conn = Arc::new(Slot::default());
            conns.lock().insert(id, conn.clone());
            svc.counters.connections.fetch_add(1, Ordering::Relaxed);
            handle(svc.clone(), stream, stop, shutdown, &conn).await;
            svc.counters.connections.fetch_sub(1, Ordering::Relaxed);
            conns.lock().remove(&id);
            drop(permit);
        });
    }
    svc.accepting.store(false, Ordering::SeqCst);
}

/// Serves one connection until it ends.
#[tracing::instrument(skip_all, fields(uid, pid))]
async fn handle(
    svc: Arc<Service>,
    stream: UnixStream,
    stop: watch::Sender<bool>,
    shutdown: watch::Receiver<bool>,
    slot: &Slot,
) {
    let mut conn = Connection::new(stream, &svc.cfg.limits);
    let peer = match conn.peer() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "SO_PEERCRED failed; closing");
            return;
        }
    };
    tracing::Span::current()
        .record("uid", peer.uid)
        .record("pid", peer.pid.unwrap_or(-1));
    // debug: one line per connection would drown the builds at the daemon's default level.
    tracing::debug!(uid = peer.uid, pid = ?peer.pid, "connection");
    let mut session = Session::new(svc, peer, stop, shutdown);
    while let Some(req) = conn.next_request(slot, peer).await {
        let flow = match req {
            Ok(req) => session.apply(req, &mut conn).await,
            Err(body) => match conn.send(&Response::Error(body), &[]).await {
                Ok(()) => Flow::Continue,
                Err(_) => Flow::Close,
            },
        };
        if flow == Flow::Close {
            return;
        }
    }
}
