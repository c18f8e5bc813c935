//! The optional HTTP listener (`metrics_listen`, `serve --metrics-listen`): `GET /metrics`
//! (Prometheus text, or OpenMetrics when the scraper asks for it), `/healthz` (200 while the
//! socket's accept loop runs) and `/readyz` (200 when every model is ready, else 503 naming
//! the ones that are not). hyper serves HTTP/1.1 on the daemon's runtime.
//!
//! Bounded so that a slow or hostile HTTP client cannot hurt the socket service, and so that
//! a liveness probe always gets its answer: at most `limits.metrics_max_connections`
//! connections at once, and at that limit a new connection closes the *oldest* one (an idle
//! or slow connection never locks a probe out: each new one is served, and a flood only
//! closes itself); a request head of at most `limits.metrics_max_request_bytes`, read within
//! `limits.metrics_header_timeout_ms` of the connection's start (an idle connection or a
//! slowloris is closed then); one request per connection (no keep-alive); and each
//! connection done within `limits.frame_timeout_secs`. Encoding and readiness read every
//! model's state on the blocking pool, never on the thread that serves the socket.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{oneshot, watch};

use super::metrics::{self, Format};
use super::service::Service;

/// At most this many not-ready variants are named in a `/readyz` answer.
const READYZ_NAMED: usize = 10;

/// Binds the listener (before the daemon reports ready, so a taken port stops the start).
pub fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

/// The connections being served, oldest first (ids grow), each with the sender that closes
/// it to make room.
#[derive(Default)]
struct Open {
    next: u64,
    conns: BTreeMap<u64, oneshot::Sender<()>>,
}

/// The open connections, shared by the accept loop and the connection tasks.
#[derive(Clone, Default)]
struct Conns(Arc<Mutex<Open>>);

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new connection, closing the oldest ones while `cap` are open; returns its
    /// id and the receiver that tells it it was closed to make room.
    fn admit(&self, cap: usize) -> (u64, oneshot::Receiver<()>) {
        let mut o = self.lock();
        while o.conns.len() >= cap.max(1) {
            let Some((_, close)) = o.conns.pop_first() else {
                break;
            };
            let _ = close.send(());
        }
        let id = o.next;
        o.next += 1;
        let (tx, rx) = oneshot::channel();
        o.conns.insert(id, tx);
        (id, rx)
    }

    fn leave(&self, id: u64) {
        self.lock().conns.remove(&id);
    }
}

/// Serves HTTP until `shutdown` turns true.
pub async fn run(
    svc: Arc<Service>,
    listener: tokio::net::TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let limits = &svc.cfg.limits;
    let cap = limits.metrics_max_connections;
    let deadline = Duration::from_secs(limits.frame_timeout_secs);
    let head_deadline =
        Duration::from_millis(limits.metrics_header_timeout_ms.max(1)).min(deadline);
    let max_head = limits.metrics_max_request_bytes;
    let conns = Conns::default();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // At the limit the oldest connection goes, not the new one: idle or trickling
        // connections (the ones that stay) must never starve a probe.
        let (id, made_room) = conns.admit(cap);
        let svc = svc.clone();
        let shutdown = shutdown.clone();
        let conns = conns.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(head_deadline)
                .max_buf_size(max_head)
                .keep_alive(false)
                .serve_connection(
                    TokioIo::new(stream),
                    hyper::service::service_fn(move |req| {
                        answer(svc.clone(), shutdown.clone(), req)
                    }),
                );
            tokio::select! {
                r = tokio::time::timeout(deadline, conn) => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics listener: connection"),
                    Err(_) => tracing::debug!(%peer, "metrics listener: connection too slow; closed"),
                },
                _ = made_room => {
                    tracing::debug!(%peer, "metrics listener: at its connection limit; the oldest connection closed")
                }
            }
            conns.leave(id);
        });
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

const PLAIN: &str = "text/plain; charset=utf-8";

/// Answers one request.
async fn answer(
    svc: Arc<Service>,
    shutdown: watch::Receiver<bool>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET and HEAD\n".into(),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            // Prometheus asks for OpenMetrics first when it can read it.
            let format = match req.headers().get(ACCEPT).and_then(|a| a.to_str().ok()) {
                Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
                _ => Format::Prometheus,
            };
            match blocking(svc, move |svc| {
                metrics::encode(svc.metrics_snapshot(), format)
            })
            .await
            {
                Some(Ok(body)) => text(StatusCode::OK, format.content_type(), body),
                _ => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    PLAIN,
                    "encoding the metrics failed\n".into(),
                ),
            }
        }
        "/healthz" => {
            if svc.accepting.load(Ordering::SeqCst) && !*shutdown.borrow() {
                text(StatusCode::OK, PLAIN, "ok\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    "the daemon is not accepting connections\n".into(),
                )
            }
        }
        "/readyz" => match blocking(svc, |svc| metrics::not_ready(&svc.list())).await {
            Some(nr) if nr.is_empty() => text(StatusCode::OK, PLAIN, "ready\n".into()),
            Some(nr) => text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, readyz_body(&nr)),
            None => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                PLAIN,
                "reading the models failed\n".into(),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: /metrics, /healthz, /readyz\n".into(),
        ),
    })
}

/// Runs `f` on the blocking pool; `None` if it panicked.
async fn blocking<T: Send + 'static>(
    svc: Arc<Service>,
    f: impl FnOnce(&Service) -> T + Send + 'static,
) -> Option<T> {
    tokio::task::spawn_blocking(move || f(&svc)).await.ok()
}

/// `not ready: N`, then one line per variant (at most [`READYZ_NAMED`] of them).
fn readyz_body(nr: &[metrics::NotReady]) -> String {
    let mut body = format!("not ready: {}\n", nr.len());
    for n in nr.iter().take(READYZ_NAMED) {
        body.push_str(&format!("{n}\n"));
    }
    if nr.len() > READYZ_NAMED {
        body.push_str(&format!("and {} more\n", nr.len() - READYZ_NAMED));
    }
    body
}
