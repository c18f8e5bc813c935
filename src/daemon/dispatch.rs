//! Dispatch: what each request does, one method per request, over a [`Connection`] that did
//! the framing. Mini-redis's `Command::apply` is the model: [`Session::apply`] checks the
//! handshake, the shutdown state and permissions, runs the request against the [`Service`]
//! and writes its answer (an acquire's descriptors, a build's progress frames, a watch's
//! events through [`super::watch_stream::stream`]).
//!
//! Enters: a parsed [`Request`] from [`super::conn`]. Leaves: response frames on the
//! connection, and a [`Flow`] saying whether the connection goes on.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use trtcache_client::protocol::*;

use super::conn::{error, Connection, Peer};
use super::failure::Failure;
use super::service::Service;

/// Whether the connection goes on after a request.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    Close,
}

/// One connection's state between requests.
pub(super) struct Session {
    svc: Arc<Service>,
    peer: Peer,
    greeted: bool,
    /// Asks the daemon to stop (the admin `shutdown` request).
    stop: watch::Sender<bool>,
    /// Turns true when the daemon is shutting down.
    shutdown: watch::Receiver<bool>,
}

fn failure(f: Failure) -> Response {
    error(f.0, f.1)
}

impl Session {
    pub fn new(
        svc: Arc<Service>,
        peer: Peer,
        stop: watch::Sender<bool>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            svc,
            peer,
            greeted: false,
            stop,
            shutdown,
        }
    }

    /// Runs one request and writes its answer.
    pub async fn apply(&mut self, req: Request, conn: &mut Connection) -> Flow {
        if *self.shutdown.borrow() && !matches!(req, Request::Hello { .. }) {
            let resp = error(ErrorCode::ShuttingDown, "the daemon is shutting down");
            let _ = conn.send(&resp, &[]).await;
            return Flow::Close;
        }
        let result = match req {
            Request::Hello { version, client } => self.hello(version, &client),
            _ if !self.greeted => Err((ErrorCode::UnsupportedVersion, "send `hello` first".into())),
            Request::List => Ok(Response::Models {
                models: self.svc.list(),
            }),
            Request::Status { model } => self
                .svc
                .status(&model)
                .map(|model| Response::Status { model }),
            Request::Acquire(a) => return self.acquire(&a, conn).await,
            Request::Build(b) => match self.admin_for_paths(&b) {
                Ok(()) => return self.build(b, conn).await,
                Err(e) => Err(e),
            },
            Request::Evict { model, key } => match self.admin("evict") {
                Ok(()) => self
                    .svc
                    .evict(model.as_deref(), key.as_deref())
                    .await
                    .map(|removed| Response::Evicted { removed }),
                Err(e) => Err(e),
            },
            Request::Stats { format } => Ok(match format {
                StatsFormat::Json => Response::Stats {
                    stats: self.svc.stats(),
                },
                StatsFormat::Prometheus => {
                    let svc = self.svc.clone();
                    // A series per model and state: off the socket's thread.
                    let text = tokio::task::spawn_blocking(move || {
                        let snap = svc.metrics_snapshot();
                        super::metrics::encode(snap, super::metrics::Format::Prometheus)
                    })
                    .await;
                    match text {
                        Ok(Ok(text)) => Response::StatsText { text },
                        Ok(Err(e)) => error(ErrorCode::Internal, format!("encoding metrics: {e}")),
                        Err(e) => error(ErrorCode::Internal, e.to_string()),
                    }
                }
            }),
            Request::Watch { model } => return self.watch(&model, conn).await,
            Request::Rescan => super::folder_watch::rescan(&self.svc, self.svc.cfg.models.clone())
                .await
                .map(Response::Rescanned)
                .map_err(|e| (ErrorCode::Internal, e.to_string())),
            Request::CacheList => self
                .svc
                .cache_list()
                .await
                .map(|(cache_dir, records)| Response::CacheEntries { cache_dir, records }),
            Request::CacheRemove { key } => match self.admin("cache_remove") {
                Ok(()) => self
                    .svc
                    .cache_remove(&key)
                    .await
                    .map(|(cache_dir, key)| Response::CacheRemoved { cache_dir, key }),
                Err(e) => Err(e),
            },
            Request::CacheGc { max_bytes, dry_run } => {
                match if dry_run {
                    Ok(())
                } else {
                    self.admin("cache_gc")
                } {
                    Ok(()) => self
                        .svc
                        .cache_gc(max_bytes, dry_run)
                        .await
                        .map(Response::CacheGc),
                    Err(e) => Err(e),
                }
            }
            Request::CacheVerify => match self.admin("cache_verify") {
                Ok(()) => self.svc.cache_verify().await.map(Response::CacheVerified),
                Err(e) => Err(e),
            },
            Request::Shutdown => self.admin("shutdown").map(|()| {
                tracing::info!(uid = self.peer.uid, "shutdown requested");
                let _ = self.stop.send(true);
                Response::ShuttingDown
            }),
        };
        let resp = result.unwrap_or_else(failure);
        Self::sent(conn.send(&resp, &[]).await)
    }

    fn sent(r: std::io::Result<()>) -> Flow {
        if r.is_ok() {
            Flow::Continue
        } else {
            Flow::Close
        }
    }

    fn hello(&mut self, version: u32, client: &str) -> Result<Response, Failure> {
        if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            return Err((
                ErrorCode::UnsupportedVersion,
                format!("protocol {version} not supported (server speaks {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION})"),
            ));
        }
        self.greeted = true;
        tracing::debug!(client = %client, version, "hello");
        Ok(Response::Hello {
            version: PROTOCOL_VERSION,
            server: concat!("trtcache/", env!("CARGO_PKG_VERSION")).into(),
            max_frame: self.svc.cfg.limits.max_frame_bytes,
        })
    }

    /// Admin requests need root or the daemon's user.
    fn admin(&self, what: &str) -> Result<(), Failure> {
        if self.peer.is_admin() {
            return Ok(());
        }
        tracing::warn!(uid = self.peer.uid, request = what, "admin request refused");
        Err((
            ErrorCode::PermissionDenied,
            format!("`{what}` needs root or the daemon's user"),
        ))
    }

    /// Building from a path (outside the repository) is an admin request too.
    fn admin_for_paths(&self, b: &BuildRequest) -> Result<(), Failure> {
        if (b.paths.is_empty() && b.runtime.is_none()) || self.peer.is_admin() {
            return Ok(());
        }
        tracing::warn!(uid = self.peer.uid, "build from a path refused");
        Err((
            ErrorCode::PermissionDenied,
            if b.runtime.is_some() {
                "building for another runtime needs root or the daemon's user (the daemon's workers load the library)".into()
            } else {
                "building from a path needs root or the daemon's user; others name models in the repository".into()
            },
        ))
    }

    async fn acquire(&self, a: &AcquireRequest, conn: &mut Connection) -> Flow {
        let r = tokio::select! {
            r = self.svc.acquire(a) => r,
            _ = wait_true(self.shutdown.clone()) => Err((ErrorCode::ShuttingDown, "the daemon is shutting down".into())),
            // A consumer that dies while its acquire waits for a build (minutes for
            // TensorRT) must not hold its connection slot until the build ends.
            _ = conn.hung_up() => {
                tracing::info!(uid = self.peer.uid, model = %a.model, "client gone while its acquire waited; connection closed");
                return Flow::Close;
            }
        };
        match r {
            Ok((metadata, files)) => {
                tracing::debug!(model = %metadata.model, key = %metadata.key, "acquire");
                let fds: Vec<_> = files.iter().map(|f| f.as_raw_fd()).collect();
                Self::sent(conn.send(&Response::Artifact { metadata }, &fds).await)
            }
            Err(f) => Self::sent(conn.send(&failure(f), &[]).await),
        }
    }

    /// A watch: `watching` with the model's status, then its events until the connection
    /// ends; the connection takes no other request. Holds a `limits.max_watchers` slot.
    async fn watch(&self, model: &str, conn: &mut Connection) -> Flow {
        let slot = match self.svc.watchers.slot() {
            Ok(s) => s,
            Err(f) => {
                tracing::warn!(
                    uid = self.peer.uid,
                    model,
                    "watch refused: too many watchers"
                );
                let _ = conn.send(&failure(f), &[]).await;
                return Flow::Close;
            }
        };
        let (status, rx) = match self.svc.watch(model) {
            Ok(w) => w,
            Err(f) => return Self::sent(conn.send(&failure(f), &[]).await),
        };
        tracing::info!(uid = self.peer.uid, model, "watching");
        if conn
            .send(&Response::Watching { model: status }, &[])
            .await
            .is_ok()
        {
            super::watch_stream::stream(conn, rx, model, wait_true(self.shutdown.clone())).await;
        }
        tracing::info!(uid = self.peer.uid, model, "watch ended");
        drop(slot);
        Flow::Close
    }

    /// A build streams progress frames, then its results.
    async fn build(&self, b: BuildRequest, conn: &mut Connection) -> Flow {
        let (tx, mut rx) = mpsc::channel(64);
        let svc = self.svc.clone();
        let task = tokio::spawn(async move { svc.build(&b, tx).await });
        while let Some(p) = rx.recv().await {
            if conn.send(&Response::Progress(p), &[]).await.is_err() {
                return Flow::Close;
            }
        }
        let resp = match task.await {
            Ok(Ok(results)) => Response::Built { results },
            Ok(Err(f)) => failure(f),
            Err(e) => error(ErrorCode::Internal, e.to_string()),
        };
        Self::sent(conn.send(&resp, &[]).await)
    }
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
