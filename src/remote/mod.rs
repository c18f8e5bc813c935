//! Stage 9, the fleet tier: artifacts shared between hosts through S3-compatible object storage.
//!
//! Layout under `s3://BUCKET/PREFIX`: `blobs/sha256/<digest>` (content-addressed files,
//! multipart for big ones; an overwrite writes identical bytes), `manifests/<key>` (one signed
//! [`manifest::Envelope`] per key, written create-only: the first writer wins and later ones
//! adopt it) and `leases/<key>` (who is building a key, until when).
//!
//! Enters: a key's parts and a local [`Store`](crate::cache::Store) on a local miss
//! ([`RemoteTier::fetch`]), validated local records after a build
//! ([`RemoteTier::enqueue_upload`], [`RemoteTier::upload`]). Leaves: records stored through the
//! same atomic path as a local build, after every file was re-hashed against a manifest that
//! one of `trusted_keys` signed. Nothing here ever fails a local build: every error is
//! counted, logged and returned for the caller to build locally instead. A circuit breaker
//! stops a dead endpoint from being hit on every acquire.
//!
//! The API is blocking (the tier runs its own small tokio runtime); call it from a
//! blocking thread, never from an async task.

#[cfg(feature = "fleet")]
mod bounded;
pub mod fetch;
mod lease;
pub mod manifest;
pub mod sign;
mod trust;
mod upload;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use serde::Serialize;

pub use crate::config::remote::{Mode, RemoteConfig};
pub use fetch::Check;
pub use lease::{Before, Lease, LeaseState, RemoteGcReport};
pub use manifest::{BuilderIdentity, Envelope, Manifest, Rejection};
pub use sign::{keygen, KeygenReport, NamedPublicKey, NamedSigningKey};
pub use upload::{UploadJob, UploadOutcome};

use crate::cache::StoreError;

/// Errors of the remote tier. None of them may fail a local build: callers log and build.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{0}")]
    Config(String),
    #[error("key file {}: {message}", path.display())]
    Key { path: PathBuf, message: String },
    /// The endpoint failed: connection refused, a timeout, 5xx after the retries.
    #[error("remote {op}: {message}")]
    Unavailable { op: String, message: String },
    /// A response (a manifest, a lease, a listing page, an error body) over
    /// `remote.max_response_bytes`: refused before anything of it was parsed.
    #[error("remote {op}: {object}: the response is larger than remote.max_response_bytes ({limit} bytes); refused unread")]
    TooLarge {
        op: String,
        object: String,
        limit: u64,
    },
    /// The circuit breaker is open after repeated failures; no request was sent.
    #[error("remote endpoint skipped for {secs}s more after {failures} consecutive failures (circuit breaker open)")]
    CircuitOpen { secs: u64, failures: u32 },
    /// A manifest (or a blob it names) was refused; nothing of it was stored.
    #[error("remote artifact {key} refused: {reason}")]
    Rejected { key: String, reason: Rejection },
    /// A manifest names a blob the bucket does not hold.
    #[error("remote artifact {key}: blob {sha256} ({name}) is missing from the bucket")]
    MissingBlob {
        key: String,
        name: String,
        sha256: String,
    },
    /// The fetched artifact did not pass this host's own check (it does not open).
    #[error("remote artifact {key} does not pass this host's check: {message}")]
    CheckFailed { key: String, message: String },
    #[error("this host is read-only (remote.mode = \"read-only\"): it never writes to the bucket")]
    ReadOnly,
    /// `push` of an entry this host did not build and validate itself.
    #[error("{key} is not uploaded: {why}")]
    NotBuiltHere { key: String, why: &'static str },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The tier's counters (`stats`, `/metrics`).
#[derive(Debug, Default)]
pub struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    uploads: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
}

/// A snapshot of [`Counters`], with the names `stats` and `/metrics` use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemoteStats {
    pub remote_hits: u64,
    pub remote_misses: u64,
    pub remote_uploads: u64,
    pub remote_rejected: u64,
    pub remote_errors: u64,
}

impl Counters {
    fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an error by kind: refusals as rejected, everything else as errors.
    fn count_err(&self, e: &RemoteError) {
        match e {
            RemoteError::Rejected { .. } | RemoteError::CheckFailed { .. } => {
                Self::add(&self.rejected)
            }
            RemoteError::ReadOnly | RemoteError::NotBuiltHere { .. } => {}
            _ => Self::add(&self.errors),
        }
    }

    pub fn snapshot(&self) -> RemoteStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RemoteStats {
            remote_hits: g(&self.hits),
            remote_misses: g(&self.misses),
            remote_uploads: g(&self.uploads),
            remote_rejected: g(&self.rejected),
            remote_errors: g(&self.errors),
        }
    }
}

/// Consecutive failures open the breaker for a cooldown; then one request is let through
/// (half-open) and its failure opens it again at once.
#[derive(Debug)]
struct Breaker {
    threshold: u32,
    cooldown: Duration,
    state: Mutex<(u32, Option<Instant>)>,
    /// The last failure, while failures are counting (`status`, `health`).
    last: Mutex<Option<String>>,
}

impl Breaker {
    fn admit(&self) -> Result<(), RemoteError> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(until) = s.1 {
            let now = Instant::now();
            if now < until {
                return Err(RemoteError::CircuitOpen {
                    secs: (until - now).as_secs().max(1),
                    failures: s.0,
                });
            }
        }
        Ok(())
    }

    fn ok(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = (0, None);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// A failed operation; `now` opens the breaker at once (an endpoint that gave no answer
    /// within a lookup's deadline would cost every later lookup that deadline too).
    fn fail(&self, why: &str, now: bool) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = s.0.saturating_add(1);
        if now {
            s.0 = s.0.max(self.threshold);
        }
        if s.0 >= self.threshold {
            if s.1.is_none_or(|u| u <= Instant::now()) {
                tracing::warn!(
                    failures = s.0,
                    cooldown_s = self.cooldown.as_secs(),
                    "remote endpoint failing: circuit breaker open"
                );
            }
            s.1 = Some(Instant::now() + self.cooldown);
        }
    }

    /// `Some(why)` while the endpoint is failing: the breaker is open, or the last operation
    /// failed.
    fn down(&self) -> Option<String> {
        let last = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let left = s.1.map(|u| u.saturating_duration_since(Instant::now()));
        Some(match left {
            Some(l) if !l.is_zero() => format!(
                "{last} ({} consecutive failures; not asked for {} s more)",
                s.0,
                l.as_secs().max(1)
            ),
            _ => last,
        })
    }
}

/// The shared state the caller's threads and the upload worker use.
struct Inner {
    cfg: RemoteConfig,
    os: Arc<dyn ObjectStore>,
    prefix: String,
    rt: Option<tokio::runtime::Runtime>,
    trusted: Vec<NamedPublicKey>,
    signer: Option<NamedSigningKey>,
    counters: Counters,
    breaker: Breaker,
    /// This process's identity in leases and manifests: `host:pid:nonce`.
    holder: String,
    host: String,
    /// Uploads queued or running, for [`RemoteTier::flush_uploads`].
    pending: (Mutex<usize>, Condvar),
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping a runtime inside an async context panics; never wait for its tasks here.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The fleet tier of one host.
pub struct RemoteTier {
    inner: Arc<Inner>,
    queue: Option<std::sync::mpsc::SyncSender<UploadJob>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier")
            .field("url", &self.inner.cfg.url)
            .field("mode", &self.inner.cfg.mode)
            .finish_non_exhaustive()
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it
    // or truncates, and the last byte stays 0.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn nonce() -> String {
    let mut b = [0u8; 6];
    let _ = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    crate::key::hex(&b)
}

impl RemoteTier {
    /// Opens the tier: checks the config, loads the keys (an unreadable trusted key is an
    /// error, never silently dropped) and configures the S3 client. No request is sent.
    pub fn open(cfg: &RemoteConfig) -> Result<Self, RemoteError> {
        Self::open_inner(cfg, None)
    }

    /// [`RemoteTier::open`] with static credentials instead of the AWS chain (tools and
    /// tests that must not depend on this process's environment).
    pub fn open_with_credentials(
        cfg: &RemoteConfig,
        access_key_id: &str,
        secret_access_key: &str,
    ) -> Result<Self, RemoteError> {
        Self::open_inner(cfg, Some((access_key_id, secret_access_key)))
    }

    fn open_inner(cfg: &RemoteConfig, creds: Option<(&str, &str)>) -> Result<Self, RemoteError> {
        cfg.validate().map_err(RemoteError::Config)?;
        let (bucket, prefix) = cfg.bucket_prefix().map_err(RemoteError::Config)?;
        let trusted = cfg
            .trusted_keys
            .iter()
            .map(|p| NamedPublicKey::load(p))
            .collect::<Result<Vec<_>, _>>()?;
        if trusted.is_empty() {
            tracing::warn!("remote.trusted_keys is empty: manifests are used without a signature check (set trusted_keys to require signed manifests)");
        }
        let signer = match (&cfg.mode, &cfg.signing_key) {
            (Mode::ReadWrite, Some(p)) => Some(NamedSigningKey::load(p)?),
            _ => None,
        };
        let os = s3_store(cfg, &bucket, creds)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("trtcache-remote")
            .enable_all()
            .build()
            .map_err(|source| RemoteError::Io {
                path: PathBuf::from("tokio runtime"),
                source,
            })?;
        let host = hostname();
        let inner = Arc::new(Inner {
            holder: format!("{host}:{}:{}", std::process::id(), nonce()),
            host,
            os: Arc::new(os),
            prefix,
            rt: Some(rt),
            trusted,
            signer,
            counters: Counters::default(),
            breaker: Breaker {
                threshold: cfg.breaker_failures.max(1),
                cooldown: Duration::from_secs(cfg.breaker_cooldown_secs),
                state: Mutex::new((0, None)),
                last: Mutex::new(None),
            },
            pending: (Mutex::new(0), Condvar::new()),
            cfg: cfg.clone(),
        });
        let (queue, worker) = if cfg.mode == Mode::ReadWrite {
            let (tx, rx) = std::sync::mpsc::sync_channel(cfg.upload_queue);
            let w = inner.clone();
            let h = std::thread::Builder::new()
                .name("trtcache-upload".into())
                .spawn(move || upload::worker(&w, rx))
                .map_err(|source| RemoteError::Io {
                    path: PathBuf::from("upload worker"),
                    source,
                })?;
            (Some(tx), Some(h))
        } else {
            (None, None)
        };
        Ok(Self {
            inner,
            queue,
            worker,
        })
    }

    pub fn config(&self) -> &RemoteConfig {
        &self.inner.cfg
    }

    /// The counters so far.
    pub fn stats(&self) -> RemoteStats {
        self.inner.counters.snapshot()
    }

    /// This process's lease holder identity.
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// `Some(why)` while the endpoint is failing (the last operation failed, or the circuit
    /// breaker is open): `status` and `health` say the remote tier is unreachable.
    pub fn down(&self) -> Option<String> {
        self.inner.breaker.down()
    }

    /// Asks the endpoint once, on a thread of its own (one lookup of a manifest no key
    /// has), so that [`RemoteTier::down`] knows an unreachable endpoint before the first
    /// local miss. The daemon calls it at start.
    pub fn probe_in_background(&self) {
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("trtcache-probe".into())
            .spawn(move || {
                let probe = crate::key::CacheKey([0; 32]);
                match inner.manifest(&probe) {
                    Ok(_) | Err(RemoteError::Rejected { .. }) => {
                        tracing::info!(url = %inner.cfg.url, "remote tier answers")
                    }
                    Err(e) => {
                        inner.counters.count_err(&e);
                        tracing::warn!(url = %inner.cfg.url, error = %e, "remote tier unreachable; building locally until it answers");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread to probe the remote tier");
        }
    }
}

/// The S3 client for `[remote]`: the standard AWS credential chain unless `creds` are given,
/// the configured timeouts and retries, and conditional puts (ETag match) for the leases.
#[cfg(feature = "fleet")]
fn s3_store(
    cfg: &RemoteConfig,
    bucket: &str,
    creds: Option<(&str, &str)>,
) -> Result<object_store::aws::AmazonS3, RemoteError> {
    use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
    use object_store::{BackoffConfig, ClientOptions, RetryConfig};
    let timeout = cfg.timeout();
    let options = ClientOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
        .with_allow_http(
            cfg.endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://")),
        );
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: cfg.retries,
        retry_timeout: timeout.saturating_mul(cfg.retries as u32 + 1),
    };
    // from_env: the standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    // AWS_SESSION_TOKEN, web identity, ECS) and, without them, instance metadata.
    let mut b = AmazonS3Builder::from_env()
        .with_http_connector(bounded::Connector {
            limit: cfg.max_response_bytes,
        })
        .with_bucket_name(bucket)
        .with_region(&cfg.region)
        .with_client_options(options)
        .with_retry(retry)
        .with_conditional_put(S3ConditionalPut::ETagMatch);
    if let Some(e) = &cfg.endpoint {
        b = b.with_endpoint(e);
    }
    if let Some((id, secret)) = creds {
        b = b.with_access_key_id(id).with_secret_access_key(secret);
    }
    b.build()
        .map_err(|e| RemoteError::Config(format!("remote {}: {e}", cfg.url)))
}

/// Built without the `fleet` feature (the fuzz crate, to keep its sanitizer build small): no
/// S3 client, so a configured `[remote]` is refused at open.
#[cfg(not(feature = "fleet"))]
fn s3_store(
    cfg: &RemoteConfig,
    _bucket: &str,
    _creds: Option<(&str, &str)>,
) -> Result<object_store::memory::InMemory, RemoteError> {
    Err(RemoteError::Config(format!(
        "remote {}: this trtcache was built without the `fleet` cargo feature (no S3 client)",
        cfg.url
    )))
}

impl Drop for RemoteTier {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Inner {
    fn path(&self, rel: &str) -> object_store::path::Path {
        if self.prefix.is_empty() {
            object_store::path::Path::from(rel)
        } else {
            object_store::path::Path::from(format!("{}/{rel}", self.prefix))
        }
    }

    fn blob_path(&self, sha256: &str) -> object_store::path::Path {
        self.path(&format!("blobs/sha256/{sha256}"))
    }

    fn manifest_path(&self, key: &crate::key::CacheKey) -> object_store::path::Path {
        self.path(&format!("manifests/{}", key.hex()))
    }

    fn lease_path(&self, key: &crate::key::CacheKey) -> object_store::path::Path {
        self.path(&format!("leases/{}", key.hex()))
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        // Taken only in drop.
        self.rt.as_ref().expect("runtime present until drop")
    }

    /// Runs one remote operation through the breaker. `Ok` and the answers that mean the
    /// server is alive (not found, already exists, precondition failed) close the breaker;
    /// anything else counts towards opening it.
    fn call<T, F>(&self, op: &str, fut: F) -> Result<object_store::Result<T>, RemoteError>
    where
        F: std::future::Future<Output = object_store::Result<T>>,
    {
        self.breaker.admit()?;
        let r = self.rt().block_on(fut);
        self.judge(op, &r);
        Ok(r)
    }

    /// [`Inner::call`] for a lookup on the build path: the whole operation, retries
    /// included, ends after `remote.lookup_timeout_ms`; no answer by then opens the breaker
    /// at once.
    fn lookup<T, F>(&self, op: &str, fut: F) -> Result<object_store::Result<T>, RemoteError>
    where
        F: std::future::Future<Output = object_store::Result<T>>,
    {
        self.breaker.admit()?;
        let limit = self.cfg.lookup_timeout();
        // The timer is made inside the tier's runtime (the caller may have none).
        match self
            .rt()
            .block_on(async { tokio::time::timeout(limit, fut).await })
        {
            Ok(r) => {
                self.judge(op, &r);
                Ok(r)
            }
            Err(_) => Err(self.no_answer(op)),
        }
    }

    /// The error of an operation the endpoint did not answer within the lookup deadline;
    /// opens the breaker.
    fn no_answer(&self, op: &str) -> RemoteError {
        let message = format!(
            "no answer within {} ms (remote.lookup_timeout_ms)",
            self.cfg.lookup_timeout_ms
        );
        tracing::warn!(op, %message, "remote request failed");
        self.breaker.fail(&format!("{op}: {message}"), true);
        RemoteError::Unavailable {
            op: op.to_string(),
            message,
        }
    }

    /// Feeds an answer to the breaker: `Ok` and the answers that mean the server is alive
    /// (not found, already exists, precondition failed) close it; anything else counts.
    fn judge<T>(&self, op: &str, r: &object_store::Result<T>) {
        match r {
            Ok(_)
            | Err(object_store::Error::NotFound { .. })
            | Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::NotModified { .. }) => self.breaker.ok(),
            Err(e) => {
                tracing::warn!(op, error = %e, "remote request failed");
                self.breaker.fail(&format!("{op}: {e}"), false);
            }
        }
    }

    fn unavailable(op: &str, e: object_store::Error) -> RemoteError {
        #[cfg(feature = "fleet")]
        if let Some(t) = bounded::too_large(&e) {
            return RemoteError::TooLarge {
                op: op.to_string(),
                object: t.object.clone(),
                limit: t.limit,
            };
        }
        // The causes say what happened (refused, timed out, a status): keep them all.
        let mut message = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            let m = s.to_string();
            if !message.contains(&m) {
                message.push_str(": ");
                message.push_str(&m);
            }
            src = s.source();
        }
        RemoteError::Unavailable {
            op: op.to_string(),
            message,
        }
    }
}
