//! The daemon's state and the operations requests map to: the served model set (from
//! repository snapshots), each variant's plan, the ready-artifact map, and the acquire / list /
//! build logic on top of the [`Queue`]. Socket I/O lives in `server`; this module only deals
//! in protocol types and build-cache artifacts. Every change of what a model serves is published
//! to watchers ([`Watchers`]) from here, with the state lock held: `announce` for a variant
//! (ready, evicted, failed), `register` for a whole model (changed, removed).
//! `maintain` serves the cache commands against the
//! daemon's open store.

mod maintain;
mod ready;

pub use ready::{DefaultSelections, Published};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use trtcache_client::protocol::*;

use super::build_cache::{BuildCache, Handout, ModelEntry, Planned, Selection};
use super::metrics::Durations;
use super::queue::{JobStatus, Queue};
use super::repo::{RepoModel, Snapshot};
use super::watch_stream::{model_event, Announced, Change, VariantId, Watchers};
use crate::config::Config;
use crate::key::memo::FileId;
use crate::spec::{Backend, CacheKey};

/// A typed failure of a request.
pub type Failure = (ErrorCode, String);

fn fail(code: ErrorCode, msg: impl Into<String>) -> Failure {
    (code, super::build_cache::bounded_reason(&msg.into()))
}

struct ModelState {
    repo: RepoModel,
    /// The paths [`State::sources`] holds for it: its files, and where those that are links
    /// lead (a change there is reported under the link's target).
    indexed: Vec<PathBuf>,
    /// Bumped whenever the model's files change, so stale plans are discarded.
    generation: u64,
    /// Plans by (version, selection): the key, or why planning failed.
    plans: HashMap<(u64, Selection), Result<Planned, Failure>>,
    /// The last watch event sent about each variant of the served version.
    announced: HashMap<Selection, Announced>,
}

#[derive(Default)]
struct State {
    models: BTreeMap<String, ModelState>,
    ready: HashMap<CacheKey, Handout>,
    /// When each ready artifact's use was last passed on to the store ([`BuildCache::touch`]).
    touched: HashMap<CacheKey, Instant>,
    /// Every file of every model's fingerprint, and the models made of it: which models a
    /// changed path may have changed (`folder_watch`), without a look at the others.
    sources: BTreeMap<PathBuf, BTreeSet<String>>,
    /// The models whose plans name each key, with how many of their plans do: who hears of
    /// a key's change, and whether an artifact is still anyone's. Kept with `plans`, so a
    /// build's end costs the same however many models there are.
    key_models: HashMap<CacheKey, HashMap<String, usize>>,
    /// Models whose ready pointer may have changed since the ready index last looked.
    ready_dirty: BTreeSet<String>,
}

impl State {
    /// Indexes a model's files ([`State::sources`]); returns the paths indexed.
    fn index_sources(&mut self, m: &RepoModel) -> Vec<PathBuf> {
        let mut paths = Vec::with_capacity(m.fingerprint.len());
        for f in &m.fingerprint {
            paths.push(f.path.clone());
            let linked = std::fs::symlink_metadata(&f.path).is_ok_and(|l| l.is_symlink());
            if let Some(target) = linked
                .then(|| std::fs::canonicalize(&f.path).ok())
                .flatten()
            {
                paths.push(target);
            }
        }
        for p in &paths {
            self.sources
                .entry(p.clone())
                .or_default()
                .insert(m.name.clone());
        }
        paths
    }

    /// Drops what a model leaving the served set held: its files from [`State::sources`],
    /// its plans' keys (an artifact no model names any more is forgotten); returns the keys
    /// of its plans.
    fn drop_model(&mut self, old: &ModelState) -> Vec<CacheKey> {
        for p in &old.indexed {
            if let Some(names) = self.sources.get_mut(p) {
                names.remove(&old.repo.name);
                if names.is_empty() {
                    self.sources.remove(p);
                }
            }
        }
        let keys: Vec<CacheKey> = old
            .plans
            .values()
            .filter_map(|p| p.as_ref().ok().map(|p| p.key))
            .collect();
        for k in &keys {
            self.unref_key(*k, &old.repo.name);
        }
        self.ready_dirty.insert(old.repo.name.clone());
        keys
    }

    /// One plan of `model` names `key`.
    fn ref_key(&mut self, key: CacheKey, model: &str) {
        *self
            .key_models
            .entry(key)
            .or_default()
            .entry(model.to_string())
            .or_default() += 1;
    }

    /// One plan of `model` no longer names `key`; once no plan does, its artifact is
    /// forgotten (the store still has it: the same content found again is one lookup).
    fn unref_key(&mut self, key: CacheKey, model: &str) {
        let Some(models) = self.key_models.get_mut(&key) else {
            return;
        };
        if let Some(n) = models.get_mut(model) {
            *n -= 1;
            if *n == 0 {
                models.remove(model);
            }
        }
        if models.is_empty() {
            self.key_models.remove(&key);
            self.ready.remove(&key);
            self.touched.remove(&key);
        }
    }

    /// Whether some model's plan names `key` (what `ready` may hold).
    fn named(&self, key: &CacheKey) -> bool {
        self.key_models.contains_key(key)
    }

    /// Keeps a ready artifact in memory when a current plan names it (a path built by
    /// request, which no plan remembers, is looked up again instead).
    fn remember_ready(&mut self, key: CacheKey, a: Handout) {
        if self.named(&key) {
            self.ready.insert(key, a);
        }
        self.dirty_key(&key);
    }

    /// Forgets a ready artifact; its models' pointers are looked at again.
    fn forget_ready(&mut self, key: &CacheKey) -> bool {
        self.touched.remove(key);
        let was = self.ready.remove(key).is_some();
        self.dirty_key(key);
        was
    }

    /// The ready pointers of every model planned to `key` may have changed.
    fn dirty_key(&mut self, key: &CacheKey) {
        if let Some(models) = self.key_models.get(key) {
            self.ready_dirty.extend(models.keys().cloned());
        }
    }
}

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
    pub(super) warned: super::folder_watch::Warned,
    /// Serialises `rescan` requests.
    pub(super) rescanning: tokio::sync::Mutex<()>,
    /// Records artifact uses off the acquire path.
    toucher: Toucher,
    /// The ready index, when the daemon publishes one (`serve`, `ready_index = true`).
    pub ready_index: OnceLock<Arc<super::ready::ReadyIndex>>,
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

    /// When the build cache opened a fresh cache (its folder was deleted under the daemon), every
    /// artifact remembered as ready may be gone with it: forget them all (an acquire looks
    /// each up again), let the ready index look at every model, and warm every planned
    /// variant again in the fresh cache. One atomic load when nothing happened; called on
    /// every acquire, status and ready-index pass.
    pub fn catch_up_with_the_cache(self: &Arc<Self>) {
        let g = self.build_cache.generation();
        if self.cache_generation.swap(g, Ordering::SeqCst) == g {
            return;
        }
        let planned: Vec<Planned> = {
            let mut st = self.lock();
            let forgotten = st.ready.len();
            st.ready.clear();
            let names: Vec<String> = st.models.keys().cloned().collect();
            st.ready_dirty.extend(names);
            tracing::warn!(
                generation = g,
                forgotten,
                "the cache was opened afresh: every ready artifact is looked up again and the models are warmed again"
            );
            st.models
                .values()
                .flat_map(|m| m.plans.values())
                .filter_map(|p| p.as_ref().ok().cloned())
                .collect()
        };
        self.ready_changed();
        for p in &planned {
            self.submit_tracked(p);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The selection an acquire means: the requested profile (the model's default when
    /// none), the requested backend or else the model's first variant's (its sidecar's first
    /// backend, else the first configured one), and that backend's precision.
    fn selection_for(
        &self,
        entry: &ModelEntry,
        profile: Option<String>,
        backend: Option<Backend>,
    ) -> Selection {
        let variants = self.build_cache.variants(entry, &self.cfg.backends);
        let backend = backend
            .or_else(|| variants.selections.first().map(|v| v.backend))
            .unwrap_or(self.cfg.backends[0]);
        let precision = variants
            .selections
            .iter()
            .find(|v| v.backend == backend)
            .map(|v| v.precision)
            .unwrap_or_default();
        Selection {
            // Named, so an acquire that names no profile shares the background variant's
            // plan instead of planning (reading the model) again.
            profile: profile.or(variants.default_profile),
            backend,
            precision,
        }
    }

    /// Applies changed models (new or modified) and removed names from the watcher: cancels
    /// builds of replaced or removed content, then plans and queues the new content in the
    /// background. Returns how many models changed.
    pub fn apply(self: &Arc<Self>, changed: Vec<RepoModel>, removed: Vec<String>) -> usize {
        let n = changed.len() + removed.len();
        for name in self.register(changed, removed) {
            let svc = self.clone();
            tokio::spawn(async move { svc.warm_model(&name).await });
        }
        n
    }

    /// [`Service::apply`] without the background warming: the models are known (and builds
    /// of replaced or removed content cancelled), nothing is planned or queued until a
    /// request asks. `trtcache warm` without a daemon runs this service in-process this way
    /// (`super::warm_in_process`). Returns the names of the new or changed models.
    pub fn register(
        self: &Arc<Self>,
        changed: Vec<RepoModel>,
        removed: Vec<String>,
    ) -> Vec<String> {
        let mut cancel = Vec::new();
        let mut fresh = Vec::new();
        {
            let mut st = self.lock();
            for name in &removed {
                if let Some(old) = st.models.remove(name) {
                    tracing::info!(model = %name, "model removed from the repository");
                    self.watchers
                        .publish(model_event(name, WatchReason::Removed, None, None));
                    cancel.extend(st.drop_model(&old));
                }
            }
            for m in changed {
                // The watcher and a `rescan` may both bring the same scan: the second is no
                // change (applying it again would cancel the build the first one queued).
                if st.models.get(&m.name).is_some_and(|old| old.repo == m) {
                    continue;
                }
                let generation = self.generation.fetch_add(1, Ordering::SeqCst);
                if let Some(old) = st.models.remove(&m.name) {
                    tracing::info!(model = %m.name, "model changed");
                    cancel.extend(st.drop_model(&old));
                } else {
                    tracing::info!(model = %m.name, versions = m.versions.len(), "model added");
                }
                fresh.push(m.name.clone());
                let version = m.served().map(|e| e.version);
                self.watchers
                    .publish(model_event(&m.name, WatchReason::Changed, version, None));
                let indexed = st.index_sources(&m);
                st.ready_dirty.insert(m.name.clone());
                st.models.insert(
                    m.name.clone(),
                    ModelState {
                        repo: m,
                        indexed,
                        generation,
                        plans: HashMap::new(),
                        announced: HashMap::new(),
                    },
                );
            }
            // A key another model still plans to (identical content) keeps its build.
            cancel.retain(|k| !st.named(k));
        }
        self.ready_changed();
        for k in &cancel {
            self.queue.cancel(k);
        }
        fresh
    }

    /// The served models among `names`, as the repository scan saw them (the watcher's
    /// diff of a targeted scan: what it costs does not grow with the repository).
    pub fn fingerprints_of(&self, names: &BTreeSet<String>) -> Snapshot {
        let st = self.lock();
        names
            .iter()
            .filter_map(|n| st.models.get(n).map(|m| (n.clone(), m.repo.clone())))
            .collect()
    }

    /// The models of a whole-repository `scan` that differ from the served ones, and the
    /// served names it no longer has.
    pub fn diff_all(&self, scan: &Snapshot) -> (Vec<RepoModel>, Vec<String>) {
        let st = self.lock();
        let changed = scan
            .values()
            .filter(|m| st.models.get(&m.name).map(|s| &s.repo) != Some(*m))
            .cloned()
            .collect();
        let removed = st
            .models
            .keys()
            .filter(|k| !scan.contains_key(*k))
            .cloned()
            .collect();
        (changed, removed)
    }

    /// The models made of `path` or of a file under it (a folder renamed): a model naming
    /// a file of any name as external data is scanned again when that file changes.
    pub fn models_using(&self, path: &std::path::Path) -> Vec<String> {
        let st = self.lock();
        let mut out = Vec::new();
        for (p, names) in st.sources.range(path.to_path_buf()..) {
            if !p.starts_with(path) {
                break;
            }
            out.extend(names.iter().cloned());
        }
        out
    }

    /// Background: plan every variant of a model's served version, look it up, queue builds.
    async fn warm_model(self: &Arc<Self>, name: &str) {
        let Some(entry) = self.entry(name, None).ok() else {
            return;
        };
        for sel in self.build_cache.variants(&entry, &self.cfg.backends).selections {
            if let Ok(p) = self.planned(&entry, &sel).await {
                if self.ready_artifact(&p).await.is_none() {
                    self.submit_tracked(&p);
                }
            }
        }
    }

    fn entry(&self, name: &str, version: Option<u64>) -> Result<ModelEntry, Failure> {
        if !valid_model_name(name) {
            return Err(fail(
                ErrorCode::BadName,
                format!("`{name}` is not a model name (names, never paths)"),
            ));
        }
        let st = self.lock();
        let m = st.models.get(name).ok_or_else(|| {
            fail(
                ErrorCode::NotFound,
                format!("no model `{name}` in the repository"),
            )
        })?;
        match version {
            None => m.repo.served().cloned(),
            Some(v) => m.repo.versions.get(&v).cloned(),
        }
        .ok_or_else(|| {
            fail(
                ErrorCode::NotFound,
                format!("model `{name}` has no version {version:?}"),
            )
        })
    }

    /// The plan of a variant, computing (hashing) it once per model generation.
    pub async fn planned(&self, entry: &ModelEntry, sel: &Selection) -> Result<Planned, Failure> {
        let slot = (entry.version, sel.clone());
        let generation = {
            let st = self.lock();
            let m = st.models.get(&entry.name).ok_or_else(|| {
                fail(
                    ErrorCode::NotFound,
                    format!("model `{}` was removed", entry.name),
                )
            })?;
            if let Some(p) = m.plans.get(&slot) {
                return p.clone();
            }
            m.generation
        };
        let r = self.plan_uncached(entry, sel).await;
        if matches!(&r, Err((ErrorCode::BuildFailed, _))) {
            // The file is not what the watcher last saw settle (deleted, rewritten in place,
            // still being written): planning read a moving file, which says nothing about
            // the model. Not remembered; the watcher's next pass brings a fresh generation.
            match self.changed_since_scan(entry) {
                Some(false) => {}
                Some(true) => {
                    return Err(fail(
                        ErrorCode::NotReady,
                        format!(
                            "`{}` changed on disk since it was scanned; it is planned again once it is stable",
                            entry.name
                        ),
                    ))
                }
                None => {
                    return Err(fail(
                        ErrorCode::NotFound,
                        format!("model `{}` was removed from the repository", entry.name),
                    ))
                }
            }
        }
        // Failures are remembered only for the model's own variants: a client naming endless
        // made-up backends or profiles must not grow this map (those fail before any hashing).
        let keep = r.is_ok()
            || self
                .build_cache
                .variants(entry, &self.cfg.backends)
                .selections
                .contains(sel);
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(m) = st.models.get_mut(&entry.name) {
            if keep && m.generation == generation {
                let old = m.plans.insert(slot, r.clone());
                if let Some(Ok(p)) = old {
                    st.unref_key(p.key, &entry.name);
                }
                if let Ok(p) = &r {
                    st.ref_key(p.key, &entry.name);
                }
                st.ready_dirty.insert(entry.name.clone());
                self.ready_changed();
                let Some(m) = st.models.get_mut(&entry.name) else {
                    return r;
                };
                // A model whose new content cannot even be planned (not ONNX, an unknown
                // profile in its sidecar) tells its watchers so, as a failed build does.
                let served = m.repo.served().map(|e| e.version);
                if let (Err((_, msg)), Some(v)) = (&r, served) {
                    if v == entry.version {
                        let profile = sel.profile.clone().unwrap_or_else(|| "default".into());
                        let change = Change::Failed(msg.clone());
                        self.announce_variant(&entry.name, m, v, sel, &profile, &change);
                    }
                }
            }
        }
        r
    }

    /// Whether the model's graph file differs (size, mtime, ctime or mode) from what the
    /// repository scan recorded for it; `None` when it is gone. A file the scan did not
    /// fingerprint counts as unchanged.
    fn changed_since_scan(&self, entry: &ModelEntry) -> Option<bool> {
        let now = super::repo::FileStamp::of(&entry.path)?;
        let st = self.lock();
        let m = st.models.get(&entry.name)?;
        Some(
            m.repo
                .fingerprint
                .iter()
                .find(|f| f.path == entry.path)
                .is_some_and(|f| *f != now),
        )
    }

    /// Plans a variant on the blocking pool, bounded by the planning slots.
    async fn plan_uncached(&self, entry: &ModelEntry, sel: &Selection) -> Result<Planned, Failure> {
        let cache = self.build_cache.clone();
        let (e, s) = (entry.clone(), sel.clone());
        // The semaphore is never closed, so acquiring only waits.
        let _slot = self.plan_slots.acquire().await.ok();
        let planned = tokio::task::spawn_blocking(move || cache.plan(&e, &s))
            .await
            .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?;
        match &planned {
            Ok(p) => {
                tracing::info!(model = %entry.name, version = entry.version, profile = ?sel.profile, backend = %sel.backend, key = %p.key, "planned")
            }
            Err(e) => {
                tracing::warn!(model = %entry.name, version = entry.version, profile = ?sel.profile, backend = %sel.backend, error = %e, "cannot plan")
            }
        }
        planned.map_err(|e| match e.code() {
            ErrorCode::BuildFailed => fail(
                ErrorCode::BuildFailed,
                format!("cannot plan `{}`: {e}", entry.name),
            ),
            code => fail(code, e.to_string()),
        })
    }

    /// Drops a variant's plan if it still has `key`, so that it is computed again.
    fn forget_plan(&self, entry: &ModelEntry, sel: &Selection, key: CacheKey) {
        let mut st = self.lock();
        if let Some(m) = st.models.get_mut(&entry.name) {
            let slot = (entry.version, sel.clone());
            if matches!(m.plans.get(&slot), Some(Ok(p)) if p.key == key) {
                m.plans.remove(&slot);
                st.unref_key(key, &entry.name);
                st.ready_dirty.insert(entry.name.clone());
            }
        }
        drop(st);
        self.ready_changed();
    }

    /// Queues a background build and records its artifact as ready when it completes.
    fn submit_tracked(self: &Arc<Self>, p: &Planned) {
        self.submit_retrying(p.clone(), 0);
    }

    /// Queues a background build; when it fails for a reason of the machine (the cache full,
    /// read-only, failing or its folders deleted: the queue's transient failures), queues it
    /// again after a backoff that doubles from 1 s up to `limits.storage_retry_max_secs`,
    /// for as long as the model's current plan is still this key.
    fn submit_retrying(self: &Arc<Self>, p: Planned, attempt: u32) {
        let Ok(mut rx) = self.queue.submit(&p, false) else {
            return;
        };
        let svc = self.clone();
        let key = p.key;
        tokio::spawn(async move {
            let failed = loop {
                if let JobStatus::Done(r) = &*rx.borrow_and_update() {
                    svc.finished(key, r);
                    break r.is_err();
                }
                if rx.changed().await.is_err() {
                    return;
                }
            };
            if !failed || svc.queue.transient_failure(&key).is_none() {
                return;
            }
            let cap = svc.cfg.limits.storage_retry_max_secs.max(1);
            let delay = Duration::from_secs((1u64 << attempt.min(20)).min(cap));
            tracing::info!(model = %p.model.name, key = %key, retry_in_s = delay.as_secs(), "build failed for a reason of the machine; retrying");
            tokio::time::sleep(delay).await;
            let Ok(entry) = svc.entry(&p.model.name, Some(p.model.version)) else {
                return;
            };
            // Replanned to other content (the watcher queues that) or gone: no retry.
            let Ok(now) = svc.planned(&entry, &p.selection).await else {
                return;
            };
            if now.key == key && svc.ready_artifact(&now).await.is_none() {
                svc.submit_retrying(now, attempt + 1);
            }
        });
    }

    /// A finished job of `key`: a ready artifact goes into memory; either way watchers hear
    /// of it (a cancellation is not news: the `changed` that caused it was).
    fn finished(&self, key: CacheKey, r: &Result<Handout, Failure>) {
        let mut st = self.lock();
        match r {
            Ok(a) => {
                st.remember_ready(key, a.clone());
                self.announce(&mut st, key, Change::Ready(key, a.origin));
                self.ready_changed();
            }
            Err((ErrorCode::Cancelled | ErrorCode::ShuttingDown, _)) => {}
            Err((_, msg)) => self.announce(&mut st, key, Change::Failed(msg.clone())),
        }
    }

    /// Tells watchers what happened to `key`, once per change, for every model whose served
    /// version has a variant planned to it (identical models share a key).
    fn announce(&self, st: &mut State, key: CacheKey, change: Change) {
        let mut names: Vec<String> = st
            .key_models
            .get(&key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        names.sort();
        for name in &names {
            let Some(m) = st.models.get_mut(name) else {
                continue;
            };
            let Some(version) = m.repo.served().map(|e| e.version) else {
                continue;
            };
            let hits: Vec<(Selection, String)> = m
                .plans
                .iter()
                .filter_map(|((v, sel), p)| match p {
                    Ok(p) if *v == version && p.key == key => {
                        Some((sel.clone(), p.profile.clone()))
                    }
                    _ => None,
                })
                .collect();
            for (sel, profile) in hits {
                self.announce_variant(name, m, version, &sel, &profile, &change);
            }
        }
    }

    /// Publishes `change` of one variant of `m` unless it was the last thing said about it.
    fn announce_variant(
        &self,
        name: &str,
        m: &mut ModelState,
        version: u64,
        sel: &Selection,
        profile: &str,
        change: &Change,
    ) {
        let variant = VariantId {
            model: name,
            version,
            profile,
            backend: sel.backend.to_string(),
        };
        let mut last = m.announced.get(sel).cloned();
        if let Some(ev) = change.event(variant, &mut last) {
            if let Some(l) = last {
                m.announced.insert(sel.clone(), l);
            }
            self.watchers.publish(ev);
        }
    }

    /// A watch subscription: the model's status and a receiver of every event after it,
    /// taken together under the state lock (events are published with it held), so none is
    /// missed or seen twice.
    pub fn watch(
        &self,
        name: &str,
    ) -> Result<
        (
            ModelStatus,
            tokio::sync::broadcast::Receiver<Arc<WatchEvent>>,
        ),
        Failure,
    > {
        self.entry(name, None)?;
        let st = self.lock();
        let m = st
            .models
            .get(name)
            .ok_or_else(|| fail(ErrorCode::NotFound, format!("no model `{name}`")))?;
        Ok((self.model_status(m, &st), self.watchers.subscribe()))
    }

    /// A ready artifact from memory or, failing that, from the build cache's store.
    async fn ready_artifact(&self, p: &Planned) -> Option<Handout> {
        {
            let mut st = self.lock();
            if let Some(a) = st.ready.get(&p.key).cloned() {
                self.note_use(&mut st, p.key);
                return Some(a);
            }
        }
        let cache = self.build_cache.clone();
        let pc = p.clone();
        match tokio::task::spawn_blocking(move || cache.lookup(&pc)).await {
            Ok(Ok(Some(a))) => {
                let mut st = self.lock();
                st.remember_ready(p.key, a.clone());
                self.announce(&mut st, p.key, Change::Ready(p.key, a.origin));
                drop(st);
                self.ready_changed();
                Some(a)
            }
            Ok(Err(e)) => {
                tracing::warn!(key = %p.key, error = %e, "cache lookup failed");
                None
            }
            _ => None,
        }
    }

    fn open_files(&self, a: &Handout) -> Result<Vec<File>, std::io::Error> {
        a.paths.iter().map(File::open).collect()
    }

    /// Whether the opened files are still the ones the build cache last checked (one `fstat`
    /// each): a write, truncation or replacement since changes the stamp.
    fn unchanged(&self, a: &Handout, files: &[File]) -> Result<(), String> {
        if a.stamps.is_empty() {
            return Ok(());
        }
        for ((f, p), want) in files.iter().zip(&a.paths).zip(&a.stamps) {
            let now = f.metadata().map_err(|e| format!("{}: {e}", p.display()))?;
            if FileId::from_meta(&now) != *want {
                return Err(format!(
                    "{} changed since it was verified ({} bytes, verified {})",
                    p.display(),
                    now.len(),
                    want.size
                ));
            }
        }
        Ok(())
    }

    /// A read-only descriptor of the directory holding every file of `a` (`None` when the
    /// files do not share one directory, or it cannot be opened: the client then uses the
    /// per-file descriptors alone).
    fn open_dir(&self, a: &Handout) -> Option<File> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = a.paths.first()?.parent()?;
        if a.paths.iter().any(|p| p.parent() != Some(dir)) {
            return None;
        }
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)
        {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot open artifact directory");
                None
            }
        }
    }

    /// Acquire: the artifact's metadata and open read-only files (then the artifact's
    /// directory, when the request asks for it and `metadata.dir_fd_index` says so).
    /// Counted by outcome (hit, miss, error) with its latency.
    pub async fn acquire(
        self: &Arc<Self>,
        req: &AcquireRequest,
    ) -> Result<(ArtifactMeta, Vec<File>), Failure> {
        let t0 = Instant::now();
        self.catch_up_with_the_cache();
        let r = self.acquire_uncounted(req).await;
        let (counter, outcome) = match &r {
            Ok((_, _, true)) => (&self.counters.hits, "hit"),
            Ok((_, _, false)) => (&self.counters.misses, "miss"),
            Err(_) => (&self.counters.acquire_errors, "error"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.acquire_seconds.observe(outcome, t0.elapsed());
        r.map(|(meta, files, _)| (meta, files))
    }

    /// [`Service::acquire`]; the flag says whether the artifact was ready (a hit).
    async fn acquire_uncounted(
        self: &Arc<Self>,
        req: &AcquireRequest,
    ) -> Result<(ArtifactMeta, Vec<File>, bool), Failure> {
        let entry = self.entry(&req.model, req.version)?;
        let backend = wire_backend(req.backend.as_deref())?;
        let sel = self.selection_for(&entry, req.profile.clone(), backend);
        let planned = self.planned(&entry, &sel).await?;
        let mut hit = true;
        // A file changed under the daemon is never handed out: the build cache re-checks it (a
        // full hash), quarantining it when damaged, and the loop builds or serves again.
        let mut rechecks = 0;
        let (artifact, mut files) = loop {
            let artifact = match self.ready_artifact(&planned).await {
                Some(a) => a,
                None => {
                    if let Some(f) = self.queue.failure(&planned.key) {
                        return Err(f);
                    }
                    if !req.wait {
                        self.submit_tracked(&planned);
                        return Err(fail(
                            ErrorCode::NotReady,
                            format!("`{}` is not built yet", req.model),
                        ));
                    }
                    hit = false;
                    let rx = self.queue.submit(&planned, true)?;
                    let limit = req
                        .timeout_ms
                        .map(Duration::from_millis)
                        .unwrap_or(Duration::from_secs(self.cfg.limits.build_timeout_secs));
                    match self.wait_job(rx, &planned, limit).await {
                        Ok(a) => a,
                        Err(f) => {
                            // Cancelled, often because the file no longer hashes to the
                            // plan's key (rewritten before the watcher applied it): the next
                            // acquire plans from the file again instead of building the stale
                            // key over and over (each try copies the model).
                            if f.0 == ErrorCode::Cancelled {
                                self.forget_plan(&entry, &sel, planned.key);
                            }
                            return Err(f);
                        }
                    }
                }
            };
            let files = match self.open_files(&artifact) {
                Ok(f) => f,
                Err(e) if rechecks < 2 => {
                    tracing::warn!(key = %planned.key, error = %e, "artifact files vanished; checking the store");
                    self.lock().forget_ready(&planned.key);
                    self.ready_changed();
                    rechecks += 1;
                    continue;
                }
                Err(e) => {
                    self.lock().forget_ready(&planned.key);
                    self.ready_changed();
                    return Err(fail(
                        ErrorCode::NotReady,
                        format!("artifact files vanished ({e}); retry to rebuild"),
                    ));
                }
            };
            match self.unchanged(&artifact, &files) {
                Ok(()) => break (artifact, files),
                Err(why) => {
                    tracing::warn!(key = %planned.key, %why, "served artifact changed on disk; checking it");
                    self.lock().forget_ready(&planned.key);
                    self.ready_changed();
                    if rechecks >= 2 {
                        return Err(fail(
                            ErrorCode::NotReady,
                            format!("the artifact keeps changing on disk ({why}); retry"),
                        ));
                    }
                    rechecks += 1;
                }
            }
        };
        let mut meta = artifact.metadata.clone();
        meta.model = entry.name.clone();
        meta.version = entry.version;
        meta.dir_fd_index = None;
        if req.dir_fd {
            if let (Some(d), Ok(i)) = (self.open_dir(&artifact), u32::try_from(files.len())) {
                meta.dir_fd_index = Some(i);
                files.push(d);
            }
        }
        Ok((meta, files, hit))
    }

    async fn wait_job(
        &self,
        mut rx: watch::Receiver<JobStatus>,
        planned: &Planned,
        limit: Duration,
    ) -> Result<Handout, Failure> {
        let wait = async {
            loop {
                if let JobStatus::Done(r) = &*rx.borrow_and_update() {
                    self.finished(planned.key, r);
                    return r.clone();
                }
                if rx.changed().await.is_err() {
                    return Err(fail(ErrorCode::Cancelled, "the build went away"));
                }
            }
        };
        tokio::time::timeout(limit, wait).await.map_err(|_| {
            fail(
                ErrorCode::Timeout,
                format!("not ready within {} ms", limit.as_millis()),
            )
        })?
    }

    fn variant_status(
        &self,
        p: &Result<Planned, Failure>,
        sel: &Selection,
        st: &State,
    ) -> VariantStatus {
        let mut v = VariantStatus {
            profile: sel.profile.clone().unwrap_or_else(|| "default".into()),
            backend: sel.backend.to_string(),
            precision: sel.precision.as_str().into(),
            state: VariantState::Missing,
            key: None,
            reason: None,
            phase: None,
            origin: None,
        };
        match p {
            Err((_, msg)) => {
                v.state = VariantState::Failed;
                v.reason = Some(msg.clone());
            }
            Ok(p) => {
                v.key = Some(p.key.hex());
                v.profile = p.profile.clone();
                if let Some(h) = st.ready.get(&p.key) {
                    v.state = VariantState::Ready;
                    v.origin = Some(h.origin);
                } else if let Some(js) = self.queue.job_status(&p.key) {
                    match js {
                        JobStatus::Queued => v.state = VariantState::Queued,
                        JobStatus::Running(ph) => {
                            v.state = VariantState::Building;
                            v.phase = Some(ph.into());
                        }
                        JobStatus::Done(_) => {}
                    }
                } else if let Some((_, msg)) = self
                    .queue
                    .failure(&p.key)
                    .or_else(|| self.queue.transient_failure(&p.key))
                {
                    v.state = VariantState::Failed;
                    v.reason = Some(msg);
                }
            }
        }
        v
    }

    fn model_status(&self, m: &ModelState, st: &State) -> ModelStatus {
        let served = m.repo.served();
        let version = served.map(|e| e.version).unwrap_or(0);
        let variants = served
            .map(|e| {
                self.build_cache
                    .variants(e, &self.cfg.backends)
                    .selections
                    .into_iter()
                    .map(|sel| match m.plans.get(&(version, sel.clone())) {
                        Some(p) => self.variant_status(p, &sel, st),
                        None => VariantStatus {
                            profile: sel.profile.clone().unwrap_or_else(|| "default".into()),
                            backend: sel.backend.to_string(),
                            precision: "fp32".into(),
                            state: VariantState::Queued,
                            key: None,
                            reason: None,
                            phase: Some("planning".into()),
                            origin: None,
                        },
                    })
                    .collect()
            })
            .unwrap_or_default();
        ModelStatus {
            name: m.repo.name.clone(),
            version,
            versions: m.repo.versions.keys().copied().collect(),
            layout: match m.repo.layout {
                super::build_cache::Layout::Flat => "flat".into(),
                super::build_cache::Layout::Triton => "triton".into(),
            },
            variants,
        }
    }

    /// Every model's status.
    pub fn list(&self) -> Vec<ModelStatus> {
        let st = self.lock();
        st.models
            .values()
            .map(|m| self.model_status(m, &st))
            .collect()
    }

    /// One model's status.
    pub fn status(&self, name: &str) -> Result<ModelStatus, Failure> {
        self.entry(name, None)?;
        let st = self.lock();
        st.models
            .get(name)
            .map(|m| self.model_status(m, &st))
            .ok_or_else(|| fail(ErrorCode::NotFound, format!("no model `{name}`")))
    }

    /// Build: streams progress into `events` and returns one result per variant.
    pub async fn build(
        self: &Arc<Self>,
        req: &BuildRequest,
        events: mpsc::Sender<Progress>,
    ) -> Result<Vec<BuildResult>, Failure> {
        let mut names: Vec<String> = if req.models.is_empty() && req.paths.is_empty() {
            self.lock().models.keys().cloned().collect()
        } else {
            req.models.clone()
        };
        // A name listed many times is built (and reported) once: a 1 MiB request must not
        // fan out into hundreds of thousands of tasks and progress frames.
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        // (entry, outside the repository): a path entry is planned afresh each time, since
        // no watcher tells when its file changes.
        let mut entries = Vec::new();
        for n in &names {
            entries.push((self.entry(n, None)?, false));
        }
        for p in &req.paths {
            let e = super::repo::entry_for_path(std::path::Path::new(p))
                .map_err(|m| fail(ErrorCode::BadRequest, m))?;
            entries.push((e, true));
        }

        let backend = wire_backend(req.backend.as_deref())?;
        let limit = req
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_secs(self.cfg.limits.build_timeout_secs));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (e, outside) in entries {
            // The model's variants (its sidecar's backends and profiles), narrowed to the
            // requested backend; a backend none of them uses is built with the defaults.
            let mut sels: Vec<Selection> = self
                .build_cache
                .variants(&e, &self.cfg.backends)
                .selections
                .into_iter()
                .filter(|s| backend.is_none_or(|b| s.backend == b))
                .collect();
            if sels.is_empty() {
                if let Some(b) = backend {
                    sels.push(self.selection_for(&e, None, Some(b)));
                }
            }
            for sel in sels {
                let svc = self.clone();
                let ev = events.clone();
                let e = e.clone();
                tasks.push(tokio::spawn(async move {
                    svc.build_one(e, outside, sel, ev, start, limit).await
                }));
            }
        }
        drop(events);
        let mut out = Vec::new();
        for t in tasks {
            match t.await {
                Ok(r) => out.push(r),
                Err(e) => return Err(fail(ErrorCode::Internal, e.to_string())),
            }
        }
        Ok(out)
    }

    async fn build_one(
        self: Arc<Self>,
        entry: ModelEntry,
        outside: bool,
        sel: Selection,
        events: mpsc::Sender<Progress>,
        start: Instant,
        limit: Duration,
    ) -> BuildResult {
        let profile = sel.profile.clone().unwrap_or_else(|| "default".into());
        let emit = |phase: &str| Progress {
            model: entry.name.clone(),
            backend: sel.backend.to_string(),
            profile: profile.clone(),
            phase: phase.into(),
            elapsed_ms: start.elapsed().as_millis() as u64,
        };
        let mut res = BuildResult {
            model: entry.name.clone(),
            backend: sel.backend.to_string(),
            profile: profile.clone(),
            state: VariantState::Failed,
            key: None,
            cached: false,
            code: None,
            reason: None,
            seconds: 0.0,
        };
        let _ = events.send(emit("planning")).await;
        let planned = if outside {
            self.plan_uncached(&entry, &sel).await
        } else {
            self.planned(&entry, &sel).await
        };
        let planned = match planned {
            Ok(p) => p,
            Err((code, msg)) => {
                res.code = Some(code);
                res.reason = Some(msg);
                let _ = events.send(emit("failed")).await;
                return res;
            }
        };
        res.key = Some(planned.key.hex());
        res.profile = planned.profile.clone();
        if self.ready_artifact(&planned).await.is_some() {
            res.state = VariantState::Ready;
            res.cached = true;
            let _ = events.send(emit("ready")).await;
            return res;
        }
        let t0 = Instant::now();
        let outcome = match self.queue.submit(&planned, true) {
            Err(f) => Err(f),
            Ok(mut rx) => {
                let wait = async {
                    loop {
                        let st = rx.borrow_and_update().clone();
                        match st {
                            JobStatus::Done(r) => {
                                self.finished(planned.key, &r);
                                return r;
                            }
                            JobStatus::Queued => {
                                let _ = events.send(emit("queued")).await;
                            }
                            JobStatus::Running(p) => {
                                let _ = events.send(emit(p)).await;
                            }
                        }
                        if rx.changed().await.is_err() {
                            return Err(fail(ErrorCode::Cancelled, "the build went away"));
                        }
                    }
                };
                match tokio::time::timeout(limit.saturating_sub(start.elapsed()), wait).await {
                    Ok(r) => r,
                    Err(_) => Err(fail(
                        ErrorCode::Timeout,
                        "not ready within the build request's timeout",
                    )),
                }
            }
        };
        res.seconds = t0.elapsed().as_secs_f64();
        match outcome {
            Ok(_) => {
                res.state = VariantState::Ready;
                let _ = events.send(emit("ready")).await;
            }
            Err((code, msg)) => {
                res.code = Some(code);
                res.reason = Some(msg);
                let _ = events.send(emit("failed")).await;
            }
        }
        res
    }

    /// Evicts a model's artifacts (every plan of every version) or one key.
    pub async fn evict(&self, model: Option<&str>, key: Option<&str>) -> Result<u64, Failure> {
        let mut keys = Vec::new();
        if let Some(k) = key {
            keys.push(CacheKey::parse(k).map_err(|e| fail(ErrorCode::BadRequest, e.to_string()))?);
        }
        if let Some(m) = model {
            self.entry(m, None)?;
            let st = self.lock();
            if let Some(ms) = st.models.get(m) {
                keys.extend(
                    ms.plans
                        .values()
                        .filter_map(|p| p.as_ref().ok().map(|p| p.key)),
                );
            }
        }
        let mut removed = 0;
        for k in keys {
            let was_ready = self.lock().forget_ready(&k);
            self.ready_changed();
            self.queue.forget_failure(&k);
            let cache = self.build_cache.clone();
            let gone = tokio::task::spawn_blocking(move || cache.evict(&k))
                .await
                .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?
                .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?;
            if was_ready || gone {
                // After the store forgot it: a watcher that acquires on this event gets a
                // fresh build, not the evicted files.
                self.announce(&mut self.lock(), k, Change::Evicted);
            }
            if gone {
                tracing::info!(key = %k, model = ?model, "evicted by request");
            }
            removed += gone as u64;
        }
        self.counters
            .evictions_requested
            .fetch_add(removed, Ordering::Relaxed);
        Ok(removed)
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        let q = &self.queue.stats;
        // One lock: a second `self.lock()` in the literal below would deadlock (temporaries
        // live to the end of the statement).
        let (models, artifacts_in_memory) = {
            let st = self.lock();
            (st.models.len() as u64, st.ready.len() as u64)
        };
        let remote = self.build_cache.remote_stats().unwrap_or_default();
        Stats {
            remote_hits: remote.remote_hits,
            remote_misses: remote.remote_misses,
            remote_uploads: remote.remote_uploads,
            remote_rejected: remote.remote_rejected,
            remote_errors: remote.remote_errors,
            remote_down: self.build_cache.remote_down(),
            acquire_errors: self.counters.acquire_errors.load(Ordering::Relaxed),
            evictions: self.build_cache.evictions(),
            evictions_requested: self.counters.evictions_requested.load(Ordering::Relaxed),
            hits: self.counters.hits.load(Ordering::Relaxed),
            fast_hits: self.counters.fast_hits.load(Ordering::Relaxed),
            misses: self.counters.misses.load(Ordering::Relaxed),
            builds: q.builds.load(Ordering::Relaxed),
            fetches: q.fetches.load(Ordering::Relaxed),
            failures: q.failures.load(Ordering::Relaxed),
            cancelled: q.cancelled.load(Ordering::Relaxed),
            build_seconds: q.build_millis.load(Ordering::Relaxed) as f64 / 1000.0,
            queue_depth: self.queue.depth(),
            building: q.running.load(Ordering::Relaxed),
            models,
            connections: self.counters.connections.load(Ordering::Relaxed),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            artifacts_in_memory,
        }
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
