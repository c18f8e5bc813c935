//! The build queue: single-flight per cache key (any number of waiters share one build),
//! bounded concurrency (a semaphore sized from the config), client-requested builds ahead of
//! background ones, a timeout per build, cancellation, and a failure memo (a key that failed
//! is not rebuilt; a changed model or config has a new key). A failure of the store itself
//! (disk full, I/O error) is shown but not memoised: the next request builds again. Builds
//! run on tokio's blocking pool; their outcome reaches waiters through a `watch` channel per
//! job.
//!
//! With a fleet tier ([`BuildCache::prefetch_concurrency`] above 0) a new job first asks the
//! bucket, holding no build slot (bounded apart, by the tier's own concurrency): a fetched
//! artifact finishes the job without a build; another host's build lease is waited on by
//! polling, no longer than the least expiry the lease claimed (capped at `lease_secs` by the
//! build cache), then the job is built here. A cancelled job stops polling at its next step.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify, Semaphore};
use trtcache_client::protocol::ErrorCode;

use super::build_cache::{BuildCache, BuildCacheError, CancelToken, Handout, Planned, Prefetch};
use crate::key::CacheKey;

/// A job's state as waiters see it.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // one per job, cloned rarely
pub enum JobStatus {
    /// Waiting for a build slot.
    Queued,
    /// Building; the phase name.
    Running(&'static str),
    /// Finished: the artifact, or a typed failure.
    Done(Result<Handout, (ErrorCode, String)>),
}

struct Job {
    planned: Planned,
    cancel: CancelToken,
    client: AtomicBool,
    tx: watch::Sender<JobStatus>,
}

#[derive(Default)]
struct Inner {
    jobs: HashMap<CacheKey, Arc<Job>>,
    client: VecDeque<CacheKey>,
    background: VecDeque<CacheKey>,
    /// Background builds for an incoming runtime: taken only when no client or current-
    /// runtime background build waits.
    prewarm: VecDeque<CacheKey>,
    /// Keys whose build failed, with the [`Planned::validation`] fingerprint the failure was
    /// found under: a plan with another fingerprint (golden inputs added or changed) builds
    /// again.
    failed: HashMap<CacheKey, (u64, (ErrorCode, String))>,
    /// The last failure of keys whose build failed for a reason outside the model (the
    /// store: disk full, I/O error). Shown by `status`, never memoised: the next request
    /// builds again.
    transient: HashMap<CacheKey, (ErrorCode, String)>,
    closed: bool,
}

impl Inner {
    /// Puts a job in its lane: a client's first, then background builds for the current
    /// runtime, then those for an incoming runtime (never ahead of a current-runtime build).
    fn enqueue(&mut self, job: &Job) {
        let key = job.planned.key;
        if job.client.load(Ordering::SeqCst) {
            self.client.push_back(key);
        } else if job.planned.selection.runtime.is_some() {
            self.prewarm.push_back(key);
        } else {
            self.background.push_back(key);
        }
    }
}

/// Counters the queue maintains (read by `stats`).
#[derive(Default)]
pub struct QueueStats {
    /// Jobs that built (and validated) an artifact here.
    pub builds: AtomicU64,
    /// Jobs answered by an artifact fetched from the fleet bucket: not builds.
    pub fetches: AtomicU64,
    pub failures: AtomicU64,
    pub cancelled: AtomicU64,
    pub build_millis: AtomicU64,
    pub running: AtomicU64,
    /// Jobs asking the fleet tier (or waiting on another host's lease), outside the slots.
    pub prefetching: AtomicU64,
}

/// The queue (see module docs). Cheap to share behind an `Arc`.
pub struct Queue {
    inner: Mutex<Inner>,
    wake: Notify,
    slots: Arc<Semaphore>,
    /// Bounds the fleet tier's steps ([`BuildCache::prefetch`]); `None` without a tier.
    prefetch_slots: Option<Arc<Semaphore>>,
    /// This queue, for the prefetch tasks `submit` starts.
    me: std::sync::Weak<Queue>,
    timeout: Duration,
    build_cache: Arc<dyn BuildCache>,
    pub stats: QueueStats,
    /// Build time by outcome (the metrics' histogram).
    pub build_seconds: super::metrics::Durations,
    idle: Notify,
}

impl Queue {
    /// A queue running at most `concurrency` builds, each for at most `timeout`.
    pub fn new(cache: Arc<dyn BuildCache>, concurrency: usize, timeout: Duration) -> Arc<Self> {
        let prefetch = cache.prefetch_concurrency();
        Arc::new_cyclic(|me| Queue {
            inner: Mutex::new(Inner::default()),
            wake: Notify::new(),
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            prefetch_slots: (prefetch > 0).then(|| Arc::new(Semaphore::new(prefetch))),
            me: me.clone(),
            timeout,
            build_cache: cache,
            stats: QueueStats::default(),
            build_seconds: super::metrics::Durations::builds(),
            idle: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enqueues a build of `planned` (or joins the one in flight) and returns its status
    /// channel; a memoised failure is returned at once.
    pub fn submit(
        &self,
        planned: &Planned,
        client: bool,
    ) -> Result<watch::Receiver<JobStatus>, (ErrorCode, String)> {
        let mut g = self.lock();
        if g.closed {
            return Err((
                ErrorCode::ShuttingDown,
                "the daemon is shutting down".into(),
            ));
        }
        match g.failed.get(&planned.key) {
            Some((fp, f)) if *fp == planned.validation => return Err(f.clone()),
            Some(_) => {
                tracing::info!(model = %planned.model.name, key = %planned.key, "validation settings changed since the build failed: building again");
                g.failed.remove(&planned.key);
            }
            None => {}
        }
        // A cancelled job (its model was replaced, perhaps by identical bytes) is not joined:
        // a fresh job replaces it.
        if let Some(job) = g
            .jobs
            .get(&planned.key)
            .filter(|j| !j.cancel.is_cancelled())
            .cloned()
        {
            if client && !job.client.swap(true, Ordering::SeqCst) {
                // Promote a waiting background job.
                let g = &mut *g;
                for lane in [&mut g.background, &mut g.prewarm] {
                    if let Some(i) = lane.iter().position(|k| *k == planned.key) {
                        lane.remove(i);
                        g.client.push_back(planned.key);
                        break;
                    }
                }
            }
            return Ok(job.tx.subscribe());
        }
        let (tx, rx) = watch::channel(JobStatus::Queued);
        let job = Arc::new(Job {
            planned: planned.clone(),
            cancel: CancelToken::new(),
            client: AtomicBool::new(client),
            tx,
        });
        g.jobs.insert(planned.key, job.clone());
        let fleet = self.prefetch_slots.clone().zip(self.me.upgrade());
        if fleet.is_none() {
            g.enqueue(&job);
        }
        drop(g);
        match fleet {
            Some((slots, q)) => {
                self.stats.prefetching.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    q.prefetch(job, slots).await;
                    q.stats.prefetching.fetch_sub(1, Ordering::SeqCst);
                    q.idle.notify_waiters();
                });
            }
            None => self.wake.notify_one(),
        }
        Ok(rx)
    }

    /// A new job's fleet step (see the module docs), then its place in the build queue
    /// unless the bucket answered it.
    async fn prefetch(&self, job: Arc<Job>, slots: Arc<Semaphore>) {
        let key = job.planned.key;
        let mut deadline: Option<Instant> = None;
        loop {
            if job.cancel.is_cancelled() {
                // `cancel` answered the waiters of a queued job.
                return;
            }
            let step = {
                // Never closed; a slot per step, so a lease wait holds none while it sleeps.
                let _slot = slots.acquire().await.ok();
                let (cache, j) = (self.build_cache.clone(), job.clone());
                tokio::task::spawn_blocking(move || cache.prefetch(&j.planned)).await
            };
            match step {
                Ok(Prefetch::Ready(h)) => return self.fetched(&job, h),
                Ok(Prefetch::Wait { poll, left, holder }) => {
                    let now = Instant::now();
                    let until = deadline.map_or(now + left, |d| d.min(now + left));
                    if deadline.is_none() {
                        tracing::info!(model = %job.planned.model.name, %key, %holder, wait_s = left.as_secs(), "another host is building this key: waiting for its manifest (no build slot held)");
                    }
                    deadline = Some(until);
                    if now >= until {
                        tracing::info!(model = %job.planned.model.name, %key, %holder, "gave up waiting on another host's build lease: building here");
                        break;
                    }
                    tokio::time::sleep(poll.min(until - now)).await;
                }
                Ok(Prefetch::Build) => break,
                Err(e) => {
                    tracing::warn!(%key, error = %e, "fleet step failed: building here");
                    break;
                }
            }
        }
        let mut g = self.lock();
        if job.cancel.is_cancelled() || !g.jobs.get(&key).is_some_and(|j| Arc::ptr_eq(j, &job)) {
            return;
        }
        g.enqueue(&job);
        drop(g);
        self.wake.notify_one();
    }

    /// A job the fleet tier answered: done without a build (not counted as one).
    fn fetched(&self, job: &Arc<Job>, h: Handout) {
        let key = job.planned.key;
        {
            let mut g = self.lock();
            if job.cancel.is_cancelled() || !g.jobs.get(&key).is_some_and(|j| Arc::ptr_eq(j, job)) {
                return;
            }
            g.jobs.remove(&key);
            g.transient.remove(&key);
        }
        // A fetch, never a build (`trtcache_fetches_total`, `stats.fetches`).
        self.stats.fetches.fetch_add(1, Ordering::Relaxed);
        tracing::info!(model = %job.planned.model.name, %key, "ready from the fleet tier");
        job.tx.send_replace(JobStatus::Done(Ok(h)));
    }

    /// The memoised failure of a key, if any.
    pub fn failure(&self, key: &CacheKey) -> Option<(ErrorCode, String)> {
        self.lock().failed.get(key).map(|(_, f)| f.clone())
    }

    /// Forgets a memoised failure (after an explicit evict).
    pub fn forget_failure(&self, key: &CacheKey) {
        let mut g = self.lock();
        g.failed.remove(key);
        g.transient.remove(key);
    }

    /// The last failure of a key that is retried on the next request (see `Inner::transient`).
    pub fn transient_failure(&self, key: &CacheKey) -> Option<(ErrorCode, String)> {
        self.lock().transient.get(key).cloned()
    }

    /// The state of a key's job: `None` when no job exists.
    pub fn job_status(&self, key: &CacheKey) -> Option<JobStatus> {
        self.lock().jobs.get(key).map(|j| j.tx.borrow().clone())
    }

    /// Cancels a key's job (queued or running); waiters get `cancelled`.
    pub fn cancel(&self, key: &CacheKey) {
        let job = {
            let mut g = self.lock();
            let job = g.jobs.get(key).cloned();
            if let Some(j) = &job {
                if matches!(*j.tx.borrow(), JobStatus::Queued) {
                    g.jobs.remove(key);
                    g.client.retain(|k| k != key);
                    g.background.retain(|k| k != key);
                    g.prewarm.retain(|k| k != key);
                    self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                    j.tx.send_replace(JobStatus::Done(Err((
                        ErrorCode::Cancelled,
                        "the build was cancelled before it started".into(),
                    ))));
                }
            }
            job
        };
        if let Some(j) = job {
            j.cancel.cancel();
        }
    }

    /// Builds waiting for a slot.
    pub fn depth(&self) -> u64 {
        let g = self.lock();
        (g.client.len() + g.background.len() + g.prewarm.len()) as u64
    }

    /// Stops accepting jobs and cancels every one; returns once no build runs or `grace`
    /// has passed (whichever first).
    pub async fn close(&self, grace: Duration) {
        let keys: Vec<CacheKey> = {
            let mut g = self.lock();
            g.closed = true;
            g.jobs.keys().copied().collect()
        };
        for k in keys {
            self.cancel(&k);
        }
        self.wake.notify_one();
        let deadline = Instant::now() + grace;
        while self.stats.running.load(Ordering::SeqCst)
            + self.stats.prefetching.load(Ordering::SeqCst)
            > 0
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!("builds still running after the shutdown grace period");
                break;
            }
            let _ =
                tokio::time::timeout(left.min(Duration::from_millis(100)), self.idle.notified())
                    .await;
        }
    }

    fn next(&self) -> Option<Arc<Job>> {
        let mut g = self.lock();
        loop {
            let key = g
                .client
                .pop_front()
                .or_else(|| g.background.pop_front())
                .or_else(|| g.prewarm.pop_front())?;
            if let Some(j) = g.jobs.get(&key) {
                return Some(j.clone());
            }
        }
    }

    /// The dispatcher: takes a slot, then the highest-priority job, and runs it. Runs until
    /// the queue is closed.
    pub async fn run(self: Arc<Self>) {
        loop {
            let Ok(permit) = self.slots.clone().acquire_owned().await else {
                return;
            };
            let job = loop {
                if self.lock().closed {
                    return;
                }
                let notified = self.wake.notified();
                if let Some(j) = self.next() {
                    break j;
                }
                notified.await;
            };
            let q = self.clone();
            self.stats.running.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                q.execute(job).await;
                q.stats.running.fetch_sub(1, Ordering::SeqCst);
                q.idle.notify_waiters();
                drop(permit);
            });
        }
    }

    async fn execute(&self, job: Arc<Job>) {
        let key = job.planned.key;
        let started = Instant::now();
        job.tx.send_replace(JobStatus::Running("building"));
        tracing::info!(model = %job.planned.model.name, key = %key, backend = %job.planned.selection.backend, "build started");
        let cache = self.build_cache.clone();
        let j = job.clone();
        let handle = tokio::task::spawn_blocking(move || {
            let tx = j.tx.clone();
            let r = cache.build(&j.planned, &j.cancel, &|p| {
                tx.send_replace(JobStatus::Running(p.as_str()));
            });
            // A build allocates and frees hundreds of MiB (ONNX Runtime sessions, model
            // bytes) on blocking-pool threads, each with its own malloc arena; glibc keeps
            // what is freed in those arenas, and the daemon's RSS ratcheted up with every
            // build in the soak. Hand it back.
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only releases free memory; callable from any thread.
            unsafe {
                libc::malloc_trim(0);
            }
            r
        });
        let mut transient = false;
        let result = match tokio::time::timeout(self.timeout, handle).await {
            Ok(Ok(r)) => r.map_err(|e| {
                // Storage trouble is the machine's; a cancelled or changed build never ran
                // to an answer: none of them is remembered as the model's failure.
                transient = matches!(e, BuildCacheError::Storage(_));
                let msg = match e {
                    BuildCacheError::Cancelled => "the build was cancelled".into(),
                    ref e => e.to_string(),
                };
                (e.code(), msg)
            }),
            Ok(Err(join)) => Err((ErrorCode::Internal, format!("build task failed: {join}"))),
            Err(_) => {
                // The blocking build observes the token and cleans its temp files up.
                job.cancel.cancel();
                Err((
                    ErrorCode::Timeout,
                    format!("build exceeded the limit of {} s", self.timeout.as_secs()),
                ))
            }
        };
        let result = result.map_err(|(code, msg)| (code, super::build_cache::bounded_reason(&msg)));
        // A build that was cancelled and then failed failed because of the cancellation:
        // never memoise that.
        let result = match result {
            Err((code, msg)) if job.cancel.is_cancelled() && code != ErrorCode::Timeout => Err((
                ErrorCode::Cancelled,
                format!("the build was cancelled ({msg})"),
            )),
            r => r,
        };
        let took = started.elapsed();
        let ms = took.as_millis() as u64;
        let seconds = took.as_secs_f64();
        {
            let mut g = self.lock();
            if g.jobs.get(&key).is_some_and(|j| Arc::ptr_eq(j, &job)) {
                g.jobs.remove(&key);
            }
            match &result {
                Ok(h) if h.origin == trtcache_client::protocol::Origin::Remote => {
                    self.stats.fetches.fetch_add(1, Ordering::Relaxed);
                    g.transient.remove(&key);
                }
                Ok(_) => {
                    self.stats.builds.fetch_add(1, Ordering::Relaxed);
                    self.stats.build_millis.fetch_add(ms, Ordering::Relaxed);
                    g.transient.remove(&key);
                }
                Err((ErrorCode::Cancelled, _)) => {
                    self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                }
                Err(f) => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    self.stats.build_millis.fetch_add(ms, Ordering::Relaxed);
                    if transient {
                        g.transient.insert(key, f.clone());
                    } else {
                        g.failed.insert(key, (job.planned.validation, f.clone()));
                    }
                }
            }
        }
        let model = &job.planned.model.name;
        let backend = job.planned.selection.backend;
        match &result {
            Ok(h) if h.origin == trtcache_client::protocol::Origin::Remote => {
                self.build_seconds.observe("fetched", took);
                tracing::info!(model = %model, %backend, key = %key, seconds, "fetched from the fleet bucket; not built")
            }
            Ok(_) => {
                self.build_seconds.observe("ok", took);
                tracing::info!(model = %model, %backend, key = %key, seconds, "build ready")
            }
            Err((ErrorCode::Cancelled, msg)) => {
                self.build_seconds.observe("cancelled", took);
                tracing::info!(model = %model, %backend, key = %key, seconds, reason = %msg, "build cancelled")
            }
            Err((code, msg)) => {
                self.build_seconds.observe("failed", took);
                tracing::warn!(model = %model, %backend, key = %key, seconds, %code, reason = %msg, "build failed")
            }
        }
        job.tx.send_replace(JobStatus::Done(result));
    }
}

#[cfg(test)]
mod tests {
    //! Queue semantics (order, single flight, memo) with a build cache whose builds wait for a
    //! release token, so the order in which the queue starts them is observable.
    use std::sync::mpsc;

    use super::*;
    use crate::daemon::build_cache::{BuildPhase, Layout, ModelEntry, Selection, Variants};

    struct GateCache {
        started: Mutex<Vec<String>>,
        release: Mutex<mpsc::Receiver<()>>,
    }

    impl BuildCache for GateCache {
        fn variants(&self, _: &ModelEntry, _: &[crate::spec::Backend]) -> Variants {
            Variants::default()
        }
        fn plan(&self, _: &ModelEntry, _: &Selection) -> Result<Planned, BuildCacheError> {
            Err(BuildCacheError::Runtime("unused".into()))
        }
        fn lookup(&self, _: &Planned) -> Result<Option<Handout>, BuildCacheError> {
            Ok(None)
        }
        fn build(
            &self,
            p: &Planned,
            _: &CancelToken,
            _: &dyn Fn(BuildPhase),
        ) -> Result<Handout, BuildCacheError> {
            self.started.lock().unwrap().push(p.model.name.clone());
            let _ = self.release.lock().unwrap().recv();
            Err(BuildCacheError::Invalid(
                format!("{} does not build", p.model.name).into(),
            ))
        }
        fn evict(&self, _: &CacheKey) -> Result<bool, BuildCacheError> {
            Ok(false)
        }
    }

    fn planned(name: &str, k: u8) -> Planned {
        Planned {
            model: ModelEntry {
                name: name.into(),
                version: 0,
                path: name.into(),
                sidecar: None,
                layout: Layout::Flat,
            },
            selection: Selection {
                profile: None,
                backend: crate::spec::Backend::OrtCpu,
                precision: Default::default(),
                runtime: None,
            },
            profile: "default".into(),
            key: CacheKey([k; 32]),
            validation: 0,
        }
    }

    async fn done(mut rx: watch::Receiver<JobStatus>) -> Result<Handout, (ErrorCode, String)> {
        loop {
            if let JobStatus::Done(r) = &*rx.borrow_and_update() {
                return r.clone();
            }
            rx.changed().await.unwrap();
        }
    }

    /// A background build for an incoming runtime (pre-warm) waits behind every current-
    /// runtime build, background ones included, until a client asks for it.
    #[tokio::test]
    async fn incoming_runtime_builds_wait_behind_current_ones_until_a_client_asks() {
        let (tx, rx) = mpsc::channel();
        let cache = Arc::new(GateCache {
            started: Mutex::new(Vec::new()),
            release: Mutex::new(rx),
        });
        let q = Queue::new(cache.clone(), 1, Duration::from_secs(60));
        tokio::spawn(q.clone().run());
        let incoming = |name: &str, k: u8| {
            let mut p = planned(name, k);
            p.selection.runtime = Some("1.32.0".into());
            p
        };
        let a = q.submit(&planned("a", 1), false).unwrap();
        while cache.started.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let pre1 = q.submit(&incoming("pre1", 2), false).unwrap();
        let pre2 = q.submit(&incoming("pre2", 3), false).unwrap();
        let b = q.submit(&planned("b", 4), false).unwrap();
        let _pre2 = q.submit(&incoming("pre2", 3), true).unwrap(); // a consumer on 1.32.0
        assert_eq!(q.depth(), 3);
        for _ in 0..4 {
            tx.send(()).unwrap();
        }
        for rx in [a, pre1, pre2, b] {
            done(rx).await.unwrap_err();
        }
        assert_eq!(*cache.started.lock().unwrap(), ["a", "pre2", "b", "pre1"]);
    }

    #[tokio::test]
    async fn client_builds_go_first_one_build_per_key_and_failures_are_memoised() {
        let (tx, rx) = mpsc::channel();
        let cache = Arc::new(GateCache {
            started: Mutex::new(Vec::new()),
            release: Mutex::new(rx),
        });
        let q = Queue::new(cache.clone(), 1, Duration::from_secs(60));
        tokio::spawn(q.clone().run());
        let a = q.submit(&planned("a", 1), false).unwrap();
        while cache.started.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let b = q.submit(&planned("b", 2), false).unwrap();
        let c = q.submit(&planned("c", 3), false).unwrap();
        let d = q.submit(&planned("d", 4), true).unwrap();
        let d2 = q.submit(&planned("d", 4), true).unwrap();
        let _c2 = q.submit(&planned("c", 3), true).unwrap(); // promotes c
        assert_eq!(q.depth(), 3);
        for _ in 0..4 {
            tx.send(()).unwrap();
        }
        for rx in [a, b, c, d, d2] {
            let (code, _) = done(rx).await.unwrap_err();
            assert_eq!(code, ErrorCode::BuildFailed);
        }
        assert_eq!(*cache.started.lock().unwrap(), ["a", "d", "c", "b"]);
        assert_eq!(q.stats.failures.load(Ordering::SeqCst), 4);
        // Memoised: no new build, the failure comes back at once.
        let (code, msg) = q.submit(&planned("b", 2), true).unwrap_err();
        assert_eq!(code, ErrorCode::BuildFailed);
        assert!(msg.contains("b does not build"), "{msg}");
        assert_eq!(cache.started.lock().unwrap().len(), 4);
        // Same key, other validation settings (a golden-only sidecar appeared): built again.
        let mut changed = planned("b", 2);
        changed.validation = 1;
        let again = q.submit(&changed, true).unwrap();
        tx.send(()).unwrap();
        done(again).await.unwrap_err();
        assert_eq!(cache.started.lock().unwrap().len(), 5);
        assert!(
            q.submit(&changed, true).is_err(),
            "memoised under the new settings"
        );
        assert_eq!(cache.started.lock().unwrap().len(), 5);
    }

    /// Fails with a storage error first (a full disk), then as a broken model.
    struct FullDiskCache(Mutex<u32>);

    impl BuildCache for FullDiskCache {
        fn variants(&self, _: &ModelEntry, _: &[crate::spec::Backend]) -> Variants {
            Variants::default()
        }
        fn plan(&self, _: &ModelEntry, _: &Selection) -> Result<Planned, BuildCacheError> {
            Err(BuildCacheError::Runtime("unused".into()))
        }
        fn lookup(&self, _: &Planned) -> Result<Option<Handout>, BuildCacheError> {
            Ok(None)
        }
        fn build(
            &self,
            _: &Planned,
            _: &CancelToken,
            _: &dyn Fn(BuildPhase),
        ) -> Result<Handout, BuildCacheError> {
            let mut n = self.0.lock().unwrap();
            *n += 1;
            Err(match *n {
                1 => BuildCacheError::Storage("no space left on the file system holding /c".into()),
                _ => BuildCacheError::Invalid("broken model".into()),
            })
        }
        fn evict(&self, _: &CacheKey) -> Result<bool, BuildCacheError> {
            Ok(false)
        }
    }

    #[tokio::test]
    async fn storage_failures_are_reported_but_not_memoised() {
        let cache = Arc::new(FullDiskCache(Mutex::new(0)));
        let q = Queue::new(cache.clone(), 1, Duration::from_secs(60));
        tokio::spawn(q.clone().run());
        let p = planned("a", 1);
        let (code, msg) = done(q.submit(&p, true).unwrap()).await.unwrap_err();
        assert_eq!(code, ErrorCode::BuildFailed);
        assert!(msg.contains("no space left"), "{msg}");
        assert!(q.failure(&p.key).is_none(), "not memoised");
        assert!(q.transient_failure(&p.key).is_some(), "but shown");
        // The next request builds again; a model failure is memoised as before.
        let (_, msg) = done(q.submit(&p, true).unwrap()).await.unwrap_err();
        assert_eq!(msg, "broken model");
        assert_eq!(*cache.0.lock().unwrap(), 2);
        assert!(q.submit(&p, true).is_err(), "memoised");
        assert_eq!(*cache.0.lock().unwrap(), 2);
    }

    #[tokio::test]
    async fn cancelling_a_queued_job_answers_its_waiters() {
        let (tx, rx) = mpsc::channel();
        let cache = Arc::new(GateCache {
            started: Mutex::new(Vec::new()),
            release: Mutex::new(rx),
        });
        let q = Queue::new(cache.clone(), 1, Duration::from_secs(60));
        tokio::spawn(q.clone().run());
        let a = q.submit(&planned("a", 1), false).unwrap();
        while cache.started.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let b = q.submit(&planned("b", 2), false).unwrap();
        q.cancel(&CacheKey([2; 32]));
        assert_eq!(done(b).await.unwrap_err().0, ErrorCode::Cancelled);
        tx.send(()).unwrap();
        done(a).await.unwrap_err();
        assert_eq!(*cache.started.lock().unwrap(), ["a"]);
        assert!(
            q.failure(&CacheKey([2; 32])).is_none(),
            "a cancellation is not a failure"
        );
    }

    #[tokio::test]
    async fn a_cancelled_running_job_is_replaced_not_joined() {
        let (tx, rx) = mpsc::channel();
        let cache = Arc::new(GateCache {
            started: Mutex::new(Vec::new()),
            release: Mutex::new(rx),
        });
        let q = Queue::new(cache.clone(), 2, Duration::from_secs(60));
        tokio::spawn(q.clone().run());
        let old = q.submit(&planned("a", 1), false).unwrap();
        while cache.started.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The file is replaced by identical bytes: same key, the old build is cancelled.
        q.cancel(&CacheKey([1; 32]));
        let new = q.submit(&planned("a", 1), false).unwrap();
        while cache.started.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        assert_eq!(done(old).await.unwrap_err().0, ErrorCode::Cancelled);
        assert_eq!(done(new).await.unwrap_err().0, ErrorCode::BuildFailed);
        assert_eq!(
            cache.started.lock().unwrap().len(),
            2,
            "the replacement job ran"
        );
    }
}
