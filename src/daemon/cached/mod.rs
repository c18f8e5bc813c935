//! `DiskBuildCache`: the daemon's [`BuildCache`] over the build and cache stages. Keys come from
//! [`Builder::key_parts`](crate::builder::Builder::key_parts) (the code path of `trtcache key`
//! and `trtcache build`, so the three agree for the same model, sidecar and options), builds
//! from [`Builder::build_watched`](crate::builder::Builder::build_watched) (build, validate
//! against the original model, store), lookups from the
//! [`SledStore`](crate::cache::SledStore) with its cheap integrity checks (a failed,
//! quarantined or incomplete entry is never served).
//!
//! Enters: a [`ModelEntry`] and a [`Selection`]; the model's sidecar (flat
//! `NAME.trtcache.toml`, Triton `NAME/trtcache.toml`) supplies profiles, backends, precision,
//! tolerances and golden inputs exactly as it does for `trtcache build --sidecar`. Leaves: an
//! [`Handout`] (wire metadata plus the stored files, graph first). The store keeps the
//! configured size with LRU eviction after every store (an artifact bigger than the whole
//! limit is refused before it is stored); digests are remembered in
//! `CACHE_DIR/digests.json`, shared with `trtcache key`. Builds run on a private copy of the
//! model that costs only its data (`stage`); the cache folder is checked to still be the
//! one opened, and opened afresh when it was deleted or replaced (`folder`); a build worker
//! killed from outside is built again, a bounded number of times.

use std::path::Path;
use std::sync::Arc;

mod folder;
mod handout;
mod stage;

use trtcache_client::protocol::Origin;

use super::build_cache::*;
use crate::builder::{runtime, BuildError, BuildJob, BuildOptions, Progress, Watch};
use crate::cache::{Lookup, Record, Served, Status, Store, StoreError};
use crate::key::memo::FileId;
use crate::onnx::facts::{elem_type_of, shape_of, Dim};
use crate::onnx::Model;
use crate::plan::{resolve, ModelInputs, Plan, ProfileArgs, Sidecar};
use crate::spec::{Backend, CacheKey, Precision};
use folder::{CacheFolder, Opened};
use stage::snapshot;

mod fleet;

/// The real build cache (see the module docs).
pub struct DiskBuildCache {
    /// The cache folder, its store and the builders over it (opened again when the folder
    /// is deleted or replaced under the daemon).
    cache: Arc<CacheFolder>,
    /// [`BuildOptions::external_min_bytes`] for every build (config `external_min_bytes`).
    external_min_bytes: u64,
    /// [`BuildOptions::rewrite`] for every build (config `rewrite`; a sidecar can still turn
    /// it off for its model).
    rewrite: bool,
    /// The `trt` builder settings of every build (config `[trt]`).
    trt: crate::config::TrtSettings,
    /// `limits.validation_max_bytes` for every build.
    validation_max_bytes: u64,
    /// `limits.validation_crash_retries` for every build.
    validation_crash_retries: u32,
    /// `limits.thread_probe_max_run_ms` for every build.
    thread_probe_max_run_ms: u64,
    /// `limits.prepack_probe_max_run_ms` for every build.
    prepack_probe_max_run_ms: u64,
    /// `limits.worker_kill_retries`: builds tried again after their worker was killed from
    /// outside.
    worker_kill_retries: u32,
    /// The fleet tier (config `[remote]`): consulted before a build, fed after one.
    remote: Option<crate::remote::RemoteTier>,
    /// The request and key parts of keys waiting on another host's build lease, so that
    /// each poll does not read and plan the model again.
    waiting:
        std::sync::Mutex<std::collections::HashMap<CacheKey, (BuildJob, crate::key::KeyParts)>>,
    /// The current and incoming ONNX Runtime libraries (`daemon::runtimes`).
    runtimes: std::sync::Mutex<crate::daemon::runtimes::Runtimes>,
    /// `[runtimes] keep_used_secs`.
    keep_used_secs: u64,
}

impl std::fmt::Debug for DiskBuildCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskBuildCache")
            .field("cache", &self.cache.dir())
            .field("max_bytes", &self.cache.max_bytes())
            .finish()
    }
}

/// The store failing (full, I/O) is the machine's condition, never the model's.
fn store_err(e: StoreError) -> BuildCacheError {
    BuildCacheError::Storage(e.into())
}

/// How a build-stage error reaches the daemon: cancellations and changed files are not
/// memoised as failures; a model ONNX Runtime cannot build or that fails validation is.
fn build_err(e: BuildError) -> BuildCacheError {
    match e {
        BuildError::Cancelled => BuildCacheError::Cancelled,
        BuildError::Changed(m) => BuildCacheError::Changed(m.into()),
        // A model file that vanished or cannot be read while it is hashed: planned again.
        BuildError::Key(crate::key::KeyError::Io { .. }) => BuildCacheError::Changed(e.into()),
        // The store failing (a full disk, an I/O error) says nothing about the model.
        BuildError::Store(_) => BuildCacheError::Storage(e.into()),
        BuildError::Runtime(_)
        | BuildError::ProviderMissing { .. }
        | BuildError::Key(_)
        | BuildError::WorkerUnavailable(_) => BuildCacheError::Runtime(e.into()),
        BuildError::Trt(ref t) if t.is_host_problem() => BuildCacheError::Runtime(e.into()),
        BuildError::Io { path, source } => BuildCacheError::Io {
            path,
            error: source,
        },
        // A worker that crashed or was killed at its limits (or killed from outside more
        // often than `limits.worker_kill_retries` allows), an artifact bigger than the whole
        // cache: the model's failure.
        BuildError::Killed(_) | BuildError::TooLarge { .. } => BuildCacheError::Invalid(e.into()),
        BuildError::Ort { .. }
        | BuildError::Model { .. }
        | BuildError::Validation(_)
        | BuildError::Trt(_)
        | BuildError::Worker(_)
        | BuildError::Crashed(_)
        | BuildError::ReferenceCrashed { .. } => BuildCacheError::Invalid(e.into()),
    }
}

/// [`Planned::validation`]: the golden settings and tolerance as planned, and the identity
/// (device, inode, size, times) of the sidecar and the golden file, so that a sidecar added
/// or edited, or a golden file replaced, retries a remembered failure.
fn validation_fingerprint(model: &ModelEntry, plan: &Plan) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{:?} {:?}", plan.golden, plan.tolerance).hash(&mut h);
    for f in [model.sidecar.as_deref(), plan.golden.npz.as_deref()]
        .into_iter()
        .flatten()
    {
        let id = FileId::of(f).ok();
        format!("{:?}", id).hash(&mut h);
    }
    h.finish()
}

/// An error of a build from the staged copy (`CACHE/tmp/build-…/NAME.onnx`) as it would read
/// for the repository's file: paths inside the staging folder become the model folder's.
/// Storage errors keep their paths: they are about the cache's own file system.
fn name_the_original(e: BuildCacheError, staged: &Path, model: &Path) -> BuildCacheError {
    let folder = model.parent().unwrap_or(Path::new("."));
    let inside = format!("{}/", staged.display());
    let outside = format!("{}/", folder.display());
    let cause = |c: Cause| -> Cause { format!("{c}").replace(&inside, &outside).into() };
    match e {
        BuildCacheError::NotFound(c) => BuildCacheError::NotFound(cause(c)),
        BuildCacheError::Invalid(c) => BuildCacheError::Invalid(cause(c)),
        BuildCacheError::Changed(c) => BuildCacheError::Changed(cause(c)),
        BuildCacheError::Runtime(c) => BuildCacheError::Runtime(cause(c)),
        BuildCacheError::Io { path, error } => BuildCacheError::Io {
            path: match path.strip_prefix(staged) {
                Ok(rest) if !rest.as_os_str().is_empty() => folder.join(rest),
                _ => path,
            },
            error,
        },
        e @ (BuildCacheError::Storage(_) | BuildCacheError::Cancelled) => e,
    }
}

/// The sidecar the repository found for a model (`None`: the model has none).
fn profile_args(model: &ModelEntry, profile: Option<&str>) -> ProfileArgs {
    ProfileArgs {
        profile: profile.filter(|p| *p != "default").map(str::to_string),
        sidecar: model.sidecar.clone(),
        no_sidecar: model.sidecar.is_none(),
        ..Default::default()
    }
}

impl DiskBuildCache {
    /// Opens the cache at `cache_dir` (taking its lock: one owner per cache), loads ONNX
    /// Runtime (once per process, from `ort_library` else the documented search), and evicts
    /// down to `max_bytes` if a smaller limit was configured since the last run. `trt` is
    /// the `trt` builds' builder settings (config `[trt]`).
    pub fn open(
        cache_dir: &Path,
        ort_library: Option<&Path>,
        external_min_bytes: u64,
        limits: &crate::config::Limits,
        trt: &crate::config::TrtSettings,
    ) -> Result<Self, BuildCacheError> {
        // Checked by the config's validation; refused here too for library callers.
        crate::trt::HwCompat::parse(&trt.hardware_compatibility)
            .map_err(|e| BuildCacheError::Invalid(format!("[trt] {e}").into()))?;
        let cache = CacheFolder::open(
            cache_dir,
            ort_library,
            limits.worker(),
            limits.cache_size_bytes,
        )?;
        runtime::load(ort_library).map_err(|e| BuildCacheError::Runtime(e.into()))?;
        let current = crate::daemon::runtimes::OrtRuntime::locate(ort_library)
            .map_err(|e| BuildCacheError::Runtime(e.into()))?;
        if limits.cache_check_secs > 0 {
            cache.watch(std::time::Duration::from_secs(limits.cache_check_secs));
        }
        Ok(DiskBuildCache {
            cache,
            external_min_bytes,
            rewrite: true,
            trt: trt.clone(),
            validation_max_bytes: limits.validation_max_bytes,
            validation_crash_retries: limits.validation_crash_retries,
            thread_probe_max_run_ms: limits.thread_probe_max_run_ms,
            prepack_probe_max_run_ms: limits.prepack_probe_max_run_ms,
            worker_kill_retries: limits.worker_kill_retries,
            remote: None,
            waiting: Default::default(),
            runtimes: std::sync::Mutex::new(
                crate::daemon::runtimes::Runtimes::resolve(current, &[])
                    .map_err(|e| BuildCacheError::Runtime(e.into()))?,
            ),
            keep_used_secs: crate::config::RuntimesConfig::default().keep_used_secs,
        })
    }

    /// Uses the fleet tier on local misses and uploads validated builds (docs/fleet.md).
    pub fn with_remote(mut self, tier: crate::remote::RemoteTier) -> Self {
        self.remote = Some(tier);
        self
    }

    /// The build request for a model and selection, as `trtcache build MODEL --sidecar S
    /// [--profile P] [--backend B] [--precision X]` makes it, and the resolved plan.
    fn request(
        &self,
        model: &ModelEntry,
        sel: &Selection,
    ) -> Result<(BuildJob, Plan), BuildCacheError> {
        // Read, not mapped: a repository file truncated in place would fault a map.
        let m = Model::read(&model.path).map_err(|e| BuildCacheError::Invalid(e.into()))?;
        let args = profile_args(model, sel.profile.as_deref());
        let inputs = ModelInputs::of(&m);
        let plan = resolve(&model.path, &inputs, &args, Some(sel.precision))
            .and_then(|plan| crate::plan::check_backend(&plan, &inputs, sel.backend).map(|()| plan))
            .and_then(|plan| crate::plan::check_whole_graph(&m, sel.backend).map(|()| plan))
            .map_err(|e| match e {
                crate::plan::PlanError::NoSuchProfile { .. } => BuildCacheError::NotFound(e.into()),
                e => BuildCacheError::Invalid(format!("{}: {e}", model.path.display()).into()),
            })?;
        drop(m);
        let mut req = BuildJob::from_plan(
            &model.path,
            sel.backend,
            &plan,
            BuildOptions {
                ort_cpu: crate::builder::OrtCpuOptions {
                    external_min_bytes: self.external_min_bytes,
                    rewrite: self.rewrite,
                    ..Default::default()
                },
                trt: crate::builder::TrtOptions {
                    builder_level: self.trt.builder_optimization_level,
                    hardware_compat: crate::trt::HwCompat::parse(&self.trt.hardware_compatibility)
                        .unwrap_or_default(),
                    workspace_bytes: (self.trt.workspace_bytes > 0)
                        .then_some(self.trt.workspace_bytes),
                },
                ..BuildOptions::default()
            },
        );
        req.validation.max_input_bytes = self.validation_max_bytes;
        req.validation.crash_retries = self.validation_crash_retries;
        req.validation.thread_probe_max_run_ms = self.thread_probe_max_run_ms;
        req.validation.prepack_probe_max_run_ms = self.prepack_probe_max_run_ms;
        Ok((req, plan))
    }
}

impl BuildCache for DiskBuildCache {
    /// One selection per sidecar profile × backend: the sidecar's backends when it lists any,
    /// else `backends` (the daemon's configured ones, `ort-cpu` by default); the default
    /// profile when the sidecar declares none; the sidecar's precision.
    fn variants(&self, model: &ModelEntry, backends: &[Backend]) -> Variants {
        let sidecar = match model.sidecar.as_deref().map(Sidecar::load).transpose() {
            Ok(s) => s,
            Err(e) => {
                // `plan` reports the same error per variant; build the configured ones.
                tracing::warn!(model = %model.name, error = %e, "unreadable sidecar");
                None
            }
        };
        let mut bs: Vec<Backend> = match &sidecar {
            Some(s) if !s.backends.is_empty() => s.backends.clone(),
            _ => backends.to_vec(),
        };
        if bs.is_empty() {
            bs.push(Backend::DEFAULT);
        }
        let profiles: Vec<Option<String>> = match &sidecar {
            Some(s) if !s.profiles.is_empty() => s.profiles.keys().cloned().map(Some).collect(),
            _ => vec![None],
        };
        let precision = sidecar
            .as_ref()
            .and_then(|s| s.precision)
            .unwrap_or(Precision::Fp32);
        let mut selections = Vec::new();
        for b in &bs {
            for p in &profiles {
                selections.push(Selection {
                    profile: p.clone(),
                    backend: *b,
                    precision,
                    runtime: None,
                });
            }
        }
        let default_profile = sidecar
            .and_then(|s| s.profile(None).ok().flatten())
            .map(|p| p.name);
        Variants {
            selections,
            default_profile,
        }
    }

    fn plan(&self, model: &ModelEntry, sel: &Selection) -> Result<Planned, BuildCacheError> {
        let (req, plan) = self.request(model, sel)?;
        let o = self.cache.opened();
        let parts = self
            .builders(&o, sel.runtime.as_deref())?
            .key()
            .key_parts(&req)
            .map_err(build_err)?;
        Ok(Planned {
            model: model.clone(),
            selection: sel.clone(),
            profile: plan
                .profile
                .as_ref()
                .map(|p| p.name.clone())
                .or_else(|| sel.profile.clone())
                .unwrap_or_else(|| "default".into()),
            key: parts.key(),
            validation: validation_fingerprint(model, &plan),
        })
    }

    /// The daemon calls this when it has no artifact for the key in memory: at its first
    /// request after a start, or after the files it serves changed. So the artifact is
    /// re-hashed here (once per load, not per acquire): the stamps taken first, then every
    /// byte checked against the record. A mismatch, or files missing or of the wrong size,
    /// quarantines the entry (files moved to `quarantine/`) and answers `None`: the daemon
    /// rebuilds it.
    fn lookup(&self, planned: &Planned) -> Result<Option<Handout>, BuildCacheError> {
        let o = self.cache.opened();
        let quarantine = |why: &str| {
            tracing::warn!(key = %planned.key, %why, "stored artifact damaged: quarantined, will rebuild");
            if let Err(e) = o.store.quarantine_key(&planned.key, why) {
                tracing::warn!(key = %planned.key, error = %e, "cannot quarantine");
            }
        };
        match o.store.lookup(&planned.key).map_err(store_err)? {
            // Trust is checked again on every load (the daemon loads each artifact once after
            // a start, and a configuration reload restarts it): an entry fetched under a key
            // that left remote.trusted_keys is a miss, fetched again or rebuilt (which
            // replaces its record).
            Lookup::Hit { record, .. }
                if self
                    .remote
                    .as_ref()
                    .and_then(|t| t.distrusts(&record.provenance))
                    .inspect(|why| tracing::warn!(key = %planned.key, %why, "refusing a fetched entry this host no longer trusts"))
                    .is_some() =>
            {
                Ok(None)
            }
            Lookup::Hit { record, served } => {
                match self.artifact(planned, &record, &served, Origin::Local) {
                    Ok(a) => match record.artifact.as_ref().map(|s| o.store.check_hashes(s)) {
                        Some(Err(why)) => {
                            quarantine(&why);
                            Ok(None)
                        }
                        _ => Ok(Some(a)),
                    },
                    Err(e) => {
                        tracing::warn!(key = %planned.key, error = %e, "stored artifact unreadable; treating as missing");
                        Ok(None)
                    }
                }
            }
            Lookup::Unservable { why, record } => {
                // A ready record that failed the cheap checks: its files were truncated or
                // removed under us.
                if record.status == Status::Ready {
                    quarantine(&why);
                } else {
                    tracing::debug!(key = %planned.key, %why, "not servable");
                }
                Ok(None)
            }
            Lookup::Miss => Ok(None),
        }
    }

    fn build(
        &self,
        planned: &Planned,
        cancel: &CancelToken,
        progress: &dyn Fn(BuildPhase),
    ) -> Result<Handout, BuildCacheError> {
        progress(BuildPhase::Building);
        if cancel.is_cancelled() {
            return Err(BuildCacheError::Cancelled);
        }
        // A build whose cache folder is deleted or replaced under it is stopped before it
        // stores anything (its worker killed), and built once more in the fresh cache.
        let mut again = false;
        loop {
            let o = self.cache.opened();
            // Build from a private copy (see `snapshot`); planning succeeded on the content
            // the key names, so a copy that no longer plans is a change, not a broken model.
            let staging = o.store.staging_dir().map_err(store_err)?;
            let staged = staging.path().to_path_buf();
            let r = self
                .build_staged(&o, planned, staging, cancel, progress)
                .map_err(|e| name_the_original(e, &staged, &planned.model.path));
            match r {
                Err(e) if !cancel.is_cancelled() && !self.cache.intact(&o) => {
                    if again {
                        return Err(BuildCacheError::Storage(
                            format!(
                                "the cache folder {} was deleted or replaced during the build ({e})",
                                self.cache.dir().display()
                            )
                            .into(),
                        ));
                    }
                    tracing::warn!(model = %planned.model.name, key = %planned.key, error = %e, "the cache folder went during the build; building again in the fresh cache");
                    again = true;
                }
                r => return r,
            }
        }
    }

    fn remote_stats(&self) -> Option<crate::remote::RemoteStats> {
        self.remote.as_ref().map(|t| t.stats())
    }

    fn remote_down(&self) -> Option<String> {
        self.remote.as_ref().and_then(|t| t.down())
    }

    fn prefetch_concurrency(&self) -> usize {
        self.remote.as_ref().map_or(0, |t| t.config().concurrency)
    }

    fn prefetch(&self, planned: &Planned) -> Prefetch {
        self.remote_step(planned)
    }

    fn evict(&self, key: &CacheKey) -> Result<bool, BuildCacheError> {
        self.cache.opened().store.remove(key).map_err(store_err)
    }

    fn evictions(&self) -> u64 {
        self.cache.current().store.evictions()
    }

    fn generation(&self) -> u64 {
        self.cache.generation()
    }

    fn store(&self) -> Option<Arc<dyn Store>> {
        Some(self.cache.opened().store.clone())
    }

    fn touch(&self, key: &CacheKey) {
        // A lookup counts a hit and stamps the record's last use (written lazily).
        if let Err(e) = self.cache.current().store.lookup(key) {
            tracing::debug!(key = %key, error = %e, "recording a use failed");
        }
    }

    fn flush(&self) -> Result<(), BuildCacheError> {
        // Hit counters are written lazily; make them durable at shutdown.
        self.cache.current().store.flush().map_err(store_err)
    }

    fn runtimes(&self) -> Option<crate::daemon::runtimes::Runtimes> {
        Some(
            self.runtimes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }

    fn add_runtime(&self, rt: crate::daemon::runtimes::Incoming) -> Result<bool, BuildCacheError> {
        use crate::daemon::runtimes::{current_tensorrt, Incoming};
        let current_trt = match &rt {
            Incoming::Trt(_) if !self.runtimes().is_some_and(|r| r.knows_current_tensorrt()) => {
                current_tensorrt()
            }
            _ => None,
        };
        let mut rts = self.runtimes.lock().unwrap_or_else(|p| p.into_inner());
        if current_trt.is_some() {
            rts.set_current_tensorrt(current_trt);
        }
        let added = match rt {
            Incoming::Ort(rt) => rts.add(rt),
            Incoming::Trt(t) => rts.add_tensorrt(t),
        }
        .map_err(|e| BuildCacheError::Invalid(e.into()));
        drop(rts);
        let added = added?;
        if added {
            self.refresh_keep();
        }
        Ok(added)
    }

    fn refresh_keep(&self) {
        let rts = self
            .runtimes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let store = self.cache.current().store.clone();
        let keep = crate::daemon::runtimes::keep_in(&*store, &rts, self.keep_used_secs);
        store.keep_runtimes(keep);
    }
}

impl DiskBuildCache {
    /// [`BuildCache::build`] from the staged copy in `staging` (errors name the copy; the
    /// caller maps them back to the repository's file).
    fn build_staged(
        &self,
        o: &Arc<Opened>,
        planned: &Planned,
        staging: tempfile::TempDir,
        cancel: &CancelToken,
        progress: &dyn Fn(BuildPhase),
    ) -> Result<Handout, BuildCacheError> {
        let copy = snapshot(&planned.model, staging.path())?;
        let entry = ModelEntry {
            path: copy,
            ..planned.model.clone()
        };

        let (req, _) = self
            .request(&entry, &planned.selection)
            .map_err(|e| match e {
                BuildCacheError::Runtime(_) | BuildCacheError::Io { .. } => e,
                other => BuildCacheError::Changed(
                    format!(
                        "`{}` no longer plans as it did ({other})",
                        planned.model.name
                    )
                    .into(),
                ),
            })?;
        // Polled while the worker runs and right before the store: a build whose cache
        // folder went stops and stores nothing (`build` builds it again in the fresh one).
        let cancelled = || cancel.is_cancelled() || !self.cache.intact(o);
        let step = |p: &Progress| match p {
            Progress::Validating => progress(BuildPhase::Validating),
            Progress::Storing => progress(BuildPhase::Storing),
            // Built again after validation refused it (the backend's fall-back ladder).
            Progress::Retrying(f) if f.over_tolerance() => progress(BuildPhase::Building),
            _ => {}
        };
        // The copy's key must be the planned one (else: Changed, nothing stored); past that
        // check, a failure belongs to the content the key names and is memoised.
        let watch = Watch {
            expect: Some(planned.key),
            cancelled: &cancelled,
            snapshot_of: Some(&planned.model.path),
        };
        let outcome = self.build_retrying_kills(o, planned, &req, &step, watch, progress);
        if let Some(tier) = &self.remote {
            match outcome
                .as_ref()
                .ok()
                .and_then(|o| o.served.as_ref().map(|s| (o, s)))
            {
                Some((o, served)) => tier.enqueue_upload(crate::remote::UploadJob {
                    record: o.record.clone(),
                    dir: served.dir.clone(),
                    release_lease: true,
                }),
                None => {
                    let _ = tier.release(&planned.key);
                }
            }
        }
        let outcome = outcome.map_err(build_err)?;
        drop(staging);
        match (&outcome.served, &outcome.unservable) {
            (Some(served), _) => self.artifact(planned, &outcome.record, served, Origin::Built),
            // Built and validated, then gone before it could be served: the size limit
            // evicted it (a concurrent build's store), or it was removed. Nothing is wrong
            // with the model, so this must not be remembered as its failure (the soak found
            // keys failed for good this way); waiters are told to ask again.
            (None, why) if outcome.record.status == crate::cache::Status::Ready => {
                Err(BuildCacheError::Changed(
                    format!(
                        "the artifact of `{}` was removed right after its build ({}); ask again",
                        planned.model.name,
                        why.as_deref().unwrap_or("not servable")
                    )
                    .into(),
                ))
            }
            (None, why) => Err(BuildCacheError::Invalid(
                why.clone()
                    .unwrap_or_else(|| "the artifact is not servable".into())
                    .into(),
            )),
        }
    }
}

/// The builders of one runtime: the current one's, kept with the opened folder, or an
/// incoming one's, made for the call.
enum Builders<'a> {
    Current(&'a Opened),
    Incoming(Box<(crate::builder::Builder, crate::builder::Builder)>),
}

impl Builders<'_> {
    /// Keys repository files.
    fn key(&self) -> &crate::builder::Builder {
        match self {
            Builders::Current(o) => &o.builder,
            Builders::Incoming(b) => &b.0,
        }
    }

    /// Builds (and checks fetched artifacts) in bounded workers.
    fn build(&self) -> &crate::builder::Builder {
        match self {
            Builders::Current(o) => &o.snap_builder,
            Builders::Incoming(b) => &b.1,
        }
    }
}

impl DiskBuildCache {
    /// The builders for `runtime` (an incoming ONNX Runtime version; `None`: the current).
    fn builders<'a>(
        &self,
        o: &'a Opened,
        runtime: Option<&str>,
    ) -> Result<Builders<'a>, BuildCacheError> {
        let Some(v) = runtime else {
            return Ok(Builders::Current(o));
        };
        let rt = self
            .runtimes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .incoming_by_id(v)
            .ok_or_else(|| {
                BuildCacheError::NotFound(
                    format!(
                        "{} is not one of this daemon's incoming runtimes",
                        crate::daemon::runtimes::describe(v)
                    )
                    .into(),
                )
            })?;
        Ok(Builders::Incoming(Box::new(
            self.cache.builders_for(o, &rt),
        )))
    }

    /// [`Builder::build_watched`](crate::builder::Builder::build_watched), tried again (at most `limits.worker_kill_retries` times)
    /// when its worker was killed by a SIGKILL the daemon did not send: the kernel's OOM
    /// killer under host pressure or an admin says nothing about the model the first time.
    /// A worker killed on every try fails the model, saying how often.
    fn build_retrying_kills(
        &self,
        o: &Opened,
        planned: &Planned,
        req: &BuildJob,
        step: &dyn Fn(&Progress),
        watch: Watch,
        progress: &dyn Fn(BuildPhase),
    ) -> Result<crate::builder::BuildOutcome, BuildError> {
        let mut kills = 0u32;
        let builders = self
            .builders(o, planned.selection.runtime.as_deref())
            .map_err(|e| BuildError::WorkerUnavailable(e.to_string()))?;
        loop {
            match builders.build().build_watched(req, step, watch) {
                Err(BuildError::Killed(why)) if kills < self.worker_kill_retries => {
                    kills += 1;
                    tracing::warn!(
                        model = %planned.model.name,
                        key = %planned.key,
                        reason = %why,
                        retry = kills,
                        retries = self.worker_kill_retries,
                        "the build worker was killed from outside; building again"
                    );
                    progress(BuildPhase::Retrying);
                    if (watch.cancelled)() {
                        return Err(BuildError::Cancelled);
                    }
                }
                Err(BuildError::Killed(why)) if kills > 0 => {
                    return Err(BuildError::Killed(format!(
                        "{why}; on each of {} tries (limits.worker_kill_retries = {})",
                        kills + 1,
                        self.worker_kill_retries
                    )))
                }
                other => return other,
            }
        }
    }

    /// Builds for the incoming runtimes of `[runtimes]` too (each located and trust-checked
    /// now; a TensorRT probed in a child process), and tells the store which runtimes gc
    /// evicts last. `tensorrt`: the daemon builds with TensorRT (its backends), so the
    /// current TensorRT's version is asked now, for consumers and gc, even with no incoming
    /// one.
    pub fn with_runtimes(
        mut self,
        cfg: &crate::config::RuntimesConfig,
        tensorrt: bool,
    ) -> Result<Self, BuildCacheError> {
        {
            let mut rts = self.runtimes.lock().unwrap_or_else(|p| p.into_inner());
            let current = rts.current.clone();
            *rts = crate::daemon::runtimes::Runtimes::resolve(current, &cfg.onnxruntime)
                .and_then(|mut r| r.add_tensorrt_config(&cfg.tensorrt, tensorrt).map(|()| r))
                .map_err(|e| BuildCacheError::Invalid(e.into()))?;
            for rt in rts.all_incoming() {
                tracing::info!(runtime = %crate::daemon::runtimes::describe(&rt.id()), "incoming runtime: every model is pre-built for it in the background");
            }
        }
        self.keep_used_secs = cfg.keep_used_secs;
        self.refresh_keep();
        Ok(self)
    }

    /// Whether builds apply the graph rewrites (config `rewrite`; on when not called).
    pub fn with_rewrite(mut self, on: bool) -> Self {
        self.rewrite = on;
        self
    }
}

/// The cache directory's build cache for a daemon config.
pub fn open(cfg: &crate::config::Config) -> Result<DiskBuildCache, BuildCacheError> {
    let cache = DiskBuildCache::open(
        &cfg.cache_dir,
        cfg.ort_library.as_deref(),
        cfg.external_min_bytes,
        &cfg.limits,
        &cfg.trt,
    )?
    .with_rewrite(cfg.rewrite)
    .with_runtimes(
        &cfg.runtimes,
        cfg.backends.iter().any(|b| b.uses_tensorrt()),
    )?;
    Ok(match &cfg.remote {
        Some(r) => {
            let tier = crate::remote::RemoteTier::open(r).map_err(|e| {
                BuildCacheError::Runtime(format!("remote tier {}: {e}", r.url).into())
            })?;
            tier.probe_in_background();
            cache.with_remote(tier)
        }
        None => cache,
    })
}
