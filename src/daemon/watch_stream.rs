//! Watch subscriptions (`watch` requests): long-running consumers hear when a model's ready
//! artifact changes instead of polling `status`. (`super::folder_watch` is the other watcher: the
//! one on the model folder.)
//!
//! Enters: [`WatchEvent`]s that the service publishes, always with its state
//! lock held, from the one place each kind of change happens (`announce` for a variant
//! becoming ready, evicted or failed; `register` for a model changed or removed), onto one
//! tokio broadcast channel. Leaves: `watch_event` frames on each subscribed connection,
//! written by [`stream`], which runs in that connection's own task.
//!
//! Bounds: at most `limits.max_watchers` subscriptions (each also holds a connection slot);
//! the channel keeps `limits.watch_queue` events, and a watcher that falls further behind
//! (its writes wait on a peer that reads slowly) loses them and gets one `resync` event
//! instead, so publishing never waits for anyone. A watcher that takes no frame within
//! `limits.frame_timeout_secs` is closed, as any connection that stops reading.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use trtcache_client::protocol::*;

use super::conn::{error, Connection};
use super::failure::Failure;
use crate::config::Limits;
use crate::spec::CacheKey;

/// The subscriptions' shared half: the broadcast channel and the subscription slots.
pub struct Watchers {
    tx: broadcast::Sender<Arc<WatchEvent>>,
    slots: Arc<Semaphore>,
    limit: usize,
}

impl Watchers {
    pub fn new(limits: &Limits) -> Self {
        Watchers {
            tx: broadcast::channel(limits.watch_queue.max(1)).0,
            slots: Arc::new(Semaphore::new(limits.max_watchers)),
            limit: limits.max_watchers,
        }
    }

    /// Sends an event to every subscription (none may be listening); never waits.
    pub fn publish(&self, ev: WatchEvent) {
        tracing::debug!(model = %ev.model, reason = %ev.reason, key = ?ev.key, "watch event");
        let _ = self.tx.send(Arc::new(ev));
    }

    /// A receiver of every event published from now on. Taken under the service's state lock
    /// together with the model's status, so the status and the events after it fit exactly.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<WatchEvent>> {
        self.tx.subscribe()
    }

    /// A subscription slot (`limits.max_watchers`), released when dropped.
    pub fn slot(&self) -> Result<OwnedSemaphorePermit, Failure> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            (
                ErrorCode::Busy,
                format!(
                    "too many watchers (limits.max_watchers = {}); close one first",
                    self.limit
                ),
            )
        })
    }
}

/// The last event sent about one variant, so that a change seen twice (a build two waiters
/// shared, a lookup after a recheck) is announced once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announced {
    key: Option<CacheKey>,
    reason: WatchReason,
}

/// What happened to a variant's artifact.
#[derive(Clone, Debug)]
pub enum Change {
    /// Ready (in memory now) with this key, from where.
    Ready(CacheKey, Origin),
    /// Evicted from the cache.
    Evicted,
    /// Its build failed, with the reason.
    Failed(String),
}

/// A variant of a model, as events name it.
pub struct VariantId<'a> {
    pub model: &'a str,
    pub version: u64,
    pub profile: &'a str,
    pub backend: String,
}

impl Change {
    /// The event for `variant`, or `None` when `last` already said the same.
    pub fn event(
        &self,
        variant: VariantId<'_>,
        last: &mut Option<Announced>,
    ) -> Option<WatchEvent> {
        let (key, reason, origin, message) = match self {
            Change::Ready(k, o) => (Some(*k), WatchReason::Ready, Some(*o), None),
            Change::Evicted => (None, WatchReason::Evicted, None, None),
            Change::Failed(m) => (None, WatchReason::Failed, None, Some(m.clone())),
        };
        let now = Announced { key, reason };
        if last.as_ref() == Some(&now) {
            return None;
        }
        *last = Some(now);
        Some(WatchEvent {
            model: variant.model.into(),
            reason,
            version: Some(variant.version),
            profile: Some(variant.profile.into()),
            backend: Some(variant.backend),
            key: key.map(|k| k.hex()),
            origin,
            message,
        })
    }
}

/// A model-wide event (`changed`, `removed`, `resync`).
pub fn model_event(
    model: &str,
    reason: WatchReason,
    version: Option<u64>,
    message: Option<String>,
) -> WatchEvent {
    WatchEvent {
        model: model.into(),
        reason,
        version,
        profile: None,
        backend: None,
        key: None,
        origin: None,
        message,
    }
}

/// Streams `model`'s events from `rx` to the connection until the peer closes it (or sends
/// anything: a watch connection takes no other request), stops reading (a write not taken
/// within the frame deadline), or `shutdown` resolves. The caller has sent `watching`.
pub async fn stream(
    conn: &mut Connection,
    mut rx: broadcast::Receiver<Arc<WatchEvent>>,
    model: &str,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let next = tokio::select! {
            r = rx.recv() => r,
            sent = conn.input() => {
                if sent {
                    let e = error(
                        ErrorCode::BadRequest,
                        "a watch connection takes no further requests: send them on another connection (close this one to stop watching)",
                    );
                    let _ = conn.send(&e, &[]).await;
                }
                return;
            }
            () = &mut shutdown => {
                let _ = conn.send(&error(ErrorCode::ShuttingDown, "the daemon is shutting down"), &[]).await;
                return;
            }
        };
        let ev = match next {
            Ok(ev) if ev.model == model => ev,
            Ok(_) => continue,
            Err(RecvError::Lagged(n)) => {
                // Start again from the newest event: the backlog is what this watcher could
                // not take, and the resync tells it to ask for the state instead.
                rx = rx.resubscribe();
                tracing::info!(model, dropped = n, "watcher fell behind; sent resync");
                Arc::new(model_event(
                    model,
                    WatchReason::Resync,
                    None,
                    Some(format!(
                        "{n} events (of all models) passed while this watcher was behind (limits.watch_queue); ask for the model's status"
                    )),
                ))
            }
            Err(RecvError::Closed) => return,
        };
        let frame = Response::WatchEvent(WatchEvent::clone(&ev));
        if let Err(e) = conn.send(&frame, &[]).await {
            tracing::info!(model, error = %e, "watcher closed: it did not take an event within limits.frame_timeout_secs");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(key: u8) -> (Change, CacheKey) {
        let k = CacheKey([key; 32]);
        (Change::Ready(k, Origin::Built), k)
    }

    fn variant() -> VariantId<'static> {
        VariantId {
            model: "m",
            version: 3,
            profile: "default",
            backend: "ort-cpu".into(),
        }
    }

    #[test]
    fn a_change_seen_twice_is_announced_once() {
        let mut last = None;
        let (c, k) = ready(1);
        let ev = c.event(variant(), &mut last).expect("first");
        assert_eq!(ev.key.as_deref(), Some(k.hex().as_str()));
        assert_eq!((ev.reason, ev.version), (WatchReason::Ready, Some(3)));
        assert!(c.event(variant(), &mut last).is_none(), "repeat");
        let ev = Change::Evicted.event(variant(), &mut last).unwrap();
        assert_eq!((ev.reason, ev.key), (WatchReason::Evicted, None));
        assert!(Change::Evicted.event(variant(), &mut last).is_none());
        // Built again after the eviction: the same key is news again.
        assert!(c.event(variant(), &mut last).is_some());
        let (c2, _) = ready(2);
        assert!(c2.event(variant(), &mut last).is_some(), "new key");
        let failed = Change::Failed("no".into());
        assert_eq!(
            failed
                .event(variant(), &mut last)
                .unwrap()
                .message
                .as_deref(),
            Some("no")
        );
        assert!(failed.event(variant(), &mut last).is_none());
    }

    fn limits(queue: usize, frame_secs: u64) -> Limits {
        Limits {
            watch_queue: queue,
            frame_timeout_secs: frame_secs,
            ..Limits::default()
        }
    }

    async fn read_event(s: &mut tokio::net::UnixStream) -> Option<WatchEvent> {
        use tokio::io::AsyncReadExt;
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).await.ok()?;
        match serde_json::from_slice(&body).ok()? {
            Response::WatchEvent(e) => Some(e),
            other => panic!("not an event: {other:?}"),
        }
    }

    /// A real socket pair: a peer that does not read while thousands of events are published
    /// (publishing never waits for it); once it reads, it finds the events its socket held
    /// and a `resync` in place of each run of dropped ones, then live events again.
    #[tokio::test]
    async fn a_watcher_that_falls_behind_gets_a_resync_instead_of_the_dropped_events() {
        let l = limits(4, 30);
        let w = Watchers::new(&l);
        let (ours, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let rx = w.subscribe();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut conn = Connection::new(ours, &l);
            stream(&mut conn, rx, "m", async {
                let _ = stop_rx.await;
            })
            .await;
        });
        let big = "x".repeat(4000);
        // Far more than the socket buffer holds: the stream's write blocks and the channel
        // overflows behind it.
        for i in 0..5000u64 {
            w.publish(model_event(
                "m",
                WatchReason::Changed,
                Some(i),
                Some(big.clone()),
            ));
            w.publish(model_event("other", WatchReason::Changed, Some(i), None));
            if i % 500 == 0 {
                tokio::task::yield_now().await;
            }
        }
        let (mut changed, mut resyncs) = (Vec::new(), 0);
        loop {
            let e = read_event(&mut peer).await.expect("an event");
            assert_eq!(e.model, "m", "only the watched model's events");
            match e.reason {
                WatchReason::Changed => changed.push(e.version.unwrap()),
                WatchReason::Resync => {
                    resyncs += 1;
                    assert!(e.message.unwrap().contains("limits.watch_queue"));
                    // Published after the stream started again from the newest event: it
                    // arrives, unless the stream falls behind again (then another resync).
                    w.publish(model_event("m", WatchReason::Removed, None, None));
                }
                WatchReason::Removed => break,
                other => panic!("unexpected {other}"),
            }
        }
        assert!(resyncs >= 1);
        assert!(
            changed.len() < 5000,
            "events were dropped, not queued without bound"
        );
        assert!(
            changed.windows(2).all(|p| p[0] < p[1]),
            "in order: {changed:?}"
        );
        stop_tx.send(()).unwrap();
        task.await.unwrap();
    }

    /// A peer that never reads is closed once a write waits past the frame deadline, and the
    /// stream task ends: it holds nothing of the daemon's.
    #[tokio::test]
    async fn a_watcher_that_never_reads_is_closed() {
        let l = limits(4, 1);
        let w = Watchers::new(&l);
        let (ours, peer) = tokio::net::UnixStream::pair().unwrap();
        let rx = w.subscribe();
        let task = tokio::spawn(async move {
            let mut conn = Connection::new(ours, &l);
            stream(&mut conn, rx, "m", std::future::pending()).await;
        });
        let big = "x".repeat(60_000);
        let publish = async {
            while !task.is_finished() {
                w.publish(model_event(
                    "m",
                    WatchReason::Changed,
                    None,
                    Some(big.clone()),
                ));
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(120), publish)
            .await
            .expect("the stream of a peer that never reads ends");
        task.await.unwrap();
        drop(peer);
    }

    /// Closing the connection ends the stream; a request on it is refused, then it ends.
    #[tokio::test]
    async fn the_stream_ends_when_the_peer_closes_or_sends_a_request() {
        use tokio::io::AsyncWriteExt;
        let l = limits(4, 30);
        let w = Watchers::new(&l);
        let (ours, peer) = tokio::net::UnixStream::pair().unwrap();
        let (rx, l2) = (w.subscribe(), l.clone());
        let task = tokio::spawn(async move {
            let mut conn = Connection::new(ours, &l2);
            stream(&mut conn, rx, "m", std::future::pending()).await;
        });
        drop(peer);
        task.await.unwrap();

        let (ours, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let rx = w.subscribe();
        let task = tokio::spawn(async move {
            let mut conn = Connection::new(ours, &l);
            stream(&mut conn, rx, "m", std::future::pending()).await;
        });
        let req = trtcache_client::frame::encode(&Request::List).unwrap();
        peer.write_all(&req).await.unwrap();
        task.await.unwrap();
        use tokio::io::AsyncReadExt;
        let mut len = [0u8; 4];
        peer.read_exact(&mut len).await.unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        peer.read_exact(&mut body).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["code"], "bad_request", "{body}");
    }
}
