//! The daemon's service: the state between the repository watcher, the queue and the socket,
//! and the operations requests map to. Socket I/O lives in `server`; this module only deals in
//! protocol types and build-cache artifacts. Its rooms: `state` (the data behind the one
//! lock), `models` (the served model set), `plan` (plans, background builds and the watch
//! events they end in), `acquire`, `build` (the `build` request), `status` (statuses,
//! counters, the metrics snapshot), `ready` (what the ready index publishes) and `maintain`
//! (the cache commands against the daemon's open store, and evictions).
//!
//! Every change of what a model serves is published to watchers ([`Watchers`]) with the state
//! lock held: `announce` for a variant (ready, evicted, failed), `register` for a whole model
//! (changed, removed). A model's sidecar is read when the model is registered, on the
//! blocking pool, and what it says is kept with the model's state: no request reads it.

mod acquire;
mod build;
mod maintain;
mod models;
mod plan;
mod ready;
mod state;
mod status;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use trtcache_client::protocol::ErrorCode;

use super::build_cache::BuildCache;
use super::failure::{fail, Failure};
use super::metrics::Durations;
use super::queue::Queue;
use super::ready::ReadyIndex;
use super::repo::Warned;
use super::watch_stream::Watchers;
use crate::config::Config;
use crate::spec::{Backend, CacheKey};
use state::State;

/// How often a hot artifact's use is passed on to the store. Hits are served from memory;
/// without this the store's LRU eviction saw only build times and evicted the most used
/// artifacts first (the soak rebuilt every steady model again and again).
const TOUCH_EVERY: Duration = Duration::from_secs(5);

/// Counters not owned by the queue.
#[derive(Default)]
pub struct Counters {
    pub hits: AtomicU64,
    /// Hits through the ready index (a consumer opened a pointer; also in `hits`).
    pub fast_hits: AtomicU64,
    pub misses: AtomicU64,
    pub acquire_errors: AtomicU64,
    pub evictions_requested: AtomicU64,
    pub connections: AtomicU64,
}

/// Shared daemon state.
pub struct Service {
    pub cfg: Config,
    pub build_cache: Arc<dyn BuildCache>,
    pub queue: Arc<Queue>,
    pub counters: Counters,
    /// Acquire latency by outcome (the metrics' histogram).
    pub acquire_seconds: Durations,
    /// Whether the socket's accept loop runs (`/healthz`).
    pub accepting: AtomicBool,
    pub started: Instant,
    /// Watch subscriptions; published to with `state` locked.
    pub watchers: Watchers,
    state: Mutex<State>,
    generation: AtomicU64,
    /// Bounds concurrent `plan` calls (`limits.plan_concurrency`).
    plan_slots: tokio::sync::Semaphore,
    /// Skipped repository entries already warned about (`folder_watch`).
    pub(super) warned: Warned,
    /// Serialises `rescan` requests.
    pub(super) rescanning: tokio::sync::Mutex<()>,
    /// Records artifact uses off the acquire path.
    toucher: Toucher,
    /// The ready index, when the daemon publishes one (`serve`, `ready_index = true`).
    pub ready_index: OnceLock<Arc<ReadyIndex>>,
    /// The build cache's cache generation the ready artifacts belong to ([`BuildCache::generation`]).
    cache_generation: AtomicU64,
}

/// Stamps artifacts' last use (the LRU order `gc` evicts by) on a thread of its own: a
/// blocking-pool task started from an acquire cost a thread start (0.1–0.3 ms) before the
/// answer went out whenever the pool had no idle thread, which is every consumer's first
/// acquire after a quiet spell. The thread ends with the service (the channel closes).
struct Toucher(Option<std::sync::mpsc::Sender<CacheKey>>);

impl Toucher {
    fn start(cache: Arc<dyn BuildCache>) -> Toucher {
        let (tx, rx) = std::sync::mpsc::channel::<CacheKey>();
        let started = std::thread::Builder::new()
            .name("trtcache-touch".into())
            .spawn(move || {
                for key in rx {
                    cache.touch(&key);
                }
            });
        match started {
            Ok(_) => Toucher(Some(tx)),
            Err(e) => {
                tracing::warn!(error = %e, "no thread for recording artifact uses; the LRU order falls back to build times");
                Toucher(None)
            }
        }
    }

    fn touch(&self, key: CacheKey) {
        if let Some(tx) = &self.0 {
            let _ = tx.send(key);
        }
    }
}

impl Service {
    pub fn new(cfg: Config, cache: Arc<dyn BuildCache>) -> Arc<Self> {
        let plan_slots = match cfg.limits.plan_concurrency {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let queue = Queue::new(
            cache.clone(),
            cfg.limits.build_concurrency,
            Duration::from_secs(cfg.limits.build_timeout_secs),
        );
        let toucher = Toucher::start(cache.clone());
        Arc::new(Service {
            watchers: Watchers::new(&cfg.limits),
            cfg,
            build_cache: cache,
            queue,
            counters: Counters::default(),
            acquire_seconds: Durations::acquires(),
            accepting: AtomicBool::new(false),
            started: Instant::now(),
            state: Mutex::new(State::default()),
            generation: AtomicU64::new(1),
            plan_slots: tokio::sync::Semaphore::new(plan_slots),
            warned: Default::default(),
            rescanning: Default::default(),
            toucher,
            ready_index: OnceLock::new(),
            cache_generation: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A backend named on the wire: unknown names are `not_found` (the model has no such
/// variant), as an unknown profile is.
fn wire_backend(name: Option<&str>) -> Result<Option<Backend>, Failure> {
    name.map(|b| {
        b.parse()
            .map_err(|e: crate::spec::SpecError| fail(ErrorCode::NotFound, e.to_string()))
    })
    .transpose()
}
