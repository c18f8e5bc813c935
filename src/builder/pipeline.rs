//! The build pipeline: key → store lookup → build → validate → store. It names no backend:
//! a backend's build, validation runner and fallback ladder come through
//! [`BackendImpl`](super::BackendImpl). Single flight is the daemon's build queue; across
//! processes the cache lock.
//!
//! Enters: a [`BuildJob`]. Leaves: a [`BuildOutcome`] with the stored record and, when it
//! is servable, the artifact's paths. Progress goes to a caller-supplied callback.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::backends::{backend, Failure};
use super::job::Built;
use super::job::{BuildJob, BuildOutcome, Source};
use super::stage::{self, disk_full};
use super::worker::{self, WorkerLimits};
use super::{runtime, OptLevel, StagedArtifact};
use super::{BuildError, Progress};
use crate::cache::{now_secs, Lookup, Record, Status, Store, ValidationReport, RECORD_FORMAT};
use crate::key::{self, DigestOptions, KeyInput, KeyParts};
use crate::onnx::Model;
use crate::spec::{Backend, CacheKey};

/// Called between steps (for progress output).
pub type ProgressFn<'a> = &'a dyn Fn(&Progress);

/// A hook run on the staged artifact before validation (tests use it to prove that a wrong
/// artifact is caught).
pub type ArtifactHook = Arc<dyn Fn(&StagedArtifact) + Send + Sync>;

/// What a caller that may abandon a build (the daemon) asks the pipeline to observe. ONNX
/// Runtime calls cannot be interrupted, so `cancelled` is polled between phases (after
/// keying, building and validating); a cancelled build stores nothing.
#[derive(Clone, Copy)]
pub struct Watch<'a> {
    /// The key the caller planned: a model whose key is different now (changed since it was
    /// planned) fails with [`BuildError::Changed`] instead of building under another key.
    pub expect: Option<CacheKey>,
    /// Polled between phases.
    pub cancelled: &'a (dyn Fn() -> bool + Sync),
    /// The repository file the model being built is a private snapshot of (the daemon
    /// builds from a copy): the record names it instead of the snapshot.
    pub snapshot_of: Option<&'a Path>,
}

impl Watch<'_> {
    /// Nothing to observe (the CLI).
    pub fn none() -> Watch<'static> {
        Watch {
            expect: None,
            cancelled: &|| false,
            snapshot_of: None,
        }
    }

    fn check(&self) -> Result<(), BuildError> {
        if (self.cancelled)() {
            return Err(BuildError::Cancelled);
        }
        Ok(())
    }
}

/// Builds artifacts into a store.
pub struct Builder {
    store: Arc<dyn Store>,
    ort_library: Option<PathBuf>,
    digest: DigestOptions,
    hook: Option<ArtifactHook>,
    /// Read model files into memory instead of mapping them (see [`Model::read`]).
    read_models: bool,
    /// Build and validate in a bounded worker process (see [`Builder::with_worker`]).
    worker: Option<WorkerLimits>,
    /// The shared TensorRT timing caches' folder (see [`Builder::with_timing_caches`]).
    timing_caches: Option<PathBuf>,
    /// The store's size limit (see [`Builder::with_size_limit`]).
    size_limit: Option<u64>,
    /// Builds for the ONNX Runtime at `ort_library` of this version, which is not the one
    /// this process loaded (see [`Builder::for_runtime`]).
    target_version: Option<String>,
    /// Builds for this incoming TensorRT, which this process did not load (see
    /// [`Builder::for_tensorrt`]).
    target_trt: Option<crate::trt::incoming::IncomingTrt>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("ort_library", &self.ort_library)
            .finish_non_exhaustive()
    }
}

impl Builder {
    pub fn new(store: Arc<dyn Store>, ort_library: Option<PathBuf>) -> Self {
        Self {
            store,
            ort_library,
            digest: DigestOptions::default(),
            hook: None,
            read_models: false,
            worker: None,
            timing_caches: None,
            size_limit: None,
            target_version: None,
            target_trt: None,
        }
    }

    /// Builds for the ONNX Runtime at `ort_library` (given to [`Builder::new`]), of
    /// `version`, although this process loaded another: keys name `version` (and, for the GPU
    /// backends, the CUDA major that library was built for), and builds and validations run
    /// in the worker process, which loads exactly that library. Needs
    /// [`Builder::with_worker`]: one process never holds two ONNX Runtimes.
    pub fn for_runtime(mut self, version: String) -> Self {
        self.target_version = Some(version);
        self
    }

    /// Builds `trt` and `ort-tensorrt` artifacts for the incoming TensorRT `trt` (probed in
    /// a child process, never loaded here): keys name its version, and builds and
    /// validations run in the worker process with its environment ([`IncomingTrt::env`]:
    /// `TENSORRT_ROOT`, the shim, `LD_LIBRARY_PATH`). Needs [`Builder::with_worker`].
    ///
    /// [`IncomingTrt::env`]: crate::trt::incoming::IncomingTrt::env
    pub fn for_tensorrt(mut self, trt: crate::trt::incoming::IncomingTrt) -> Self {
        self.target_trt = Some(trt);
        self
    }

    /// The worker's extra environment (an incoming TensorRT's).
    fn worker_env(&self) -> Vec<(String, std::ffi::OsString)> {
        self.target_trt
            .as_ref()
            .map(crate::trt::incoming::IncomingTrt::env)
            .unwrap_or_default()
    }

    /// The backend's check of this process's runtime, where this process builds with it: a
    /// build for an incoming TensorRT is checked by its worker (this process may not load
    /// any TensorRT).
    fn check_here(&self, rt: &runtime::Runtime, b: Backend) -> Result<(), BuildError> {
        if self.target_trt.is_some() && b.uses_tensorrt() {
            return Ok(());
        }
        backend(b).check(rt)
    }

    /// Keeps TensorRT's timing caches in `dir` (normally `CACHE_DIR/timing`), one per (GPU
    /// SKU, TensorRT version), shared by every `trt` and `ort-tensorrt` build that does not
    /// name its own ([`BuildOptions::timing_cache_dir`](super::BuildOptions)).
    pub fn with_timing_caches(mut self, dir: PathBuf) -> Self {
        self.timing_caches = Some(dir);
        self
    }

    /// The size limit of the store the builds go to (`limits.cache_size_bytes`): an
    /// artifact bigger than the whole cache is refused before it is stored
    /// ([`BuildError::TooLarge`]), instead of evicting every other artifact and then itself.
    pub fn with_size_limit(mut self, bytes: u64) -> Self {
        self.size_limit = Some(bytes);
        self
    }

    /// Reads model files into memory instead of mapping them when keying: for files in a
    /// repository that other processes may rewrite in place (see [`Model::read`]).
    pub fn with_read_models(mut self) -> Self {
        self.read_models = true;
        self
    }

    /// Runs `hook` on every staged artifact before it is validated.
    pub fn with_artifact_hook(mut self, hook: ArtifactHook) -> Self {
        self.hook = Some(hook);
        self
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Remembers model digests in `memo` (normally `CACHE_DIR/digests.json`, the file
    /// `trtcache key` uses too), by file identity, so an unchanged model is not re-hashed.
    pub fn with_digest_memo(mut self, memo: PathBuf) -> Self {
        self.digest.memo = Some(memo);
        self
    }

    /// The key parts of a request, assembled by the key module exactly as `trtcache key`
    /// does: the tree-scheme model digest (memo per [`Builder::with_digest_memo`]), opsets,
    /// the SKU the backend builds for, the backend with the LOADED ONNX Runtime's version,
    /// precision, profile and [`BuildOptions::key_options`](super::BuildOptions::key_options).
    pub fn key_parts(&self, req: &BuildJob) -> Result<KeyParts, BuildError> {
        let rt = runtime::load(self.ort_library.as_deref())?;
        let model = if self.read_models {
            Model::read(&req.model)
        } else {
            Model::load(&req.model)
        }
        .map_err(|e| BuildError::Model {
            path: req.model.clone(),
            message: e.to_string(),
        })?;
        let (parts, report) = key::key_for(
            &model,
            KeyInput {
                profile: req.options.profile.as_ref(),
                precision: req.options.precision,
                backend: req.backend,
                device: req.options.device_id,
                options: req.options.key_options(req.backend),
                tensorrt: self.target_trt.as_ref().map(|t| t.version),
            },
            self.target_version.as_deref().unwrap_or(&rt.version),
            &self.digest,
        )?;
        let mut parts = parts;
        if let (Some(_), Some(lib)) = (&self.target_version, &self.ort_library) {
            // The CUDA major of the library this builds for, not of the loaded one.
            if req.backend.is_gpu() && req.backend.is_onnx() {
                match crate::libs::onnxruntime::cuda_major(lib) {
                    Some(m) => parts.backend.versions.insert("cuda".to_string(), m),
                    None => parts.backend.versions.remove("cuda"),
                };
            }
        }
        tracing::debug!(
            files = report.files,
            memo_hits = report.memo_hits,
            hashed_bytes = report.hashed_bytes,
            seconds = report.seconds,
            "model digest"
        );
        Ok(parts)
    }

    /// Builds and validates in a bounded worker process (`trtcache worker`) instead of in
    /// this one: what the daemon and the CLI do, so a model that aborts, exhausts memory or
    /// never finishes takes only the worker down (see [`worker`]).
    pub fn with_worker(mut self, limits: WorkerLimits) -> Self {
        self.worker = Some(limits);
        self
    }

    /// The backend's build and its validation: in a worker process when one is set up
    /// ([`Builder::with_worker`]), else in this one.
    fn stage(
        &self,
        rt: &runtime::Runtime,
        req: &BuildJob,
        out: &Path,
        progress: ProgressFn,
        watch: &Watch,
    ) -> Result<Built, BuildError> {
        match &self.worker {
            Some(limits) => {
                let job = worker::Job {
                    model: req.model.clone(),
                    backend: req.backend,
                    options: req.options.clone(),
                    validation: req.validation.clone(),
                    out: out.to_path_buf(),
                    ort_library: self.ort_library.clone(),
                    decode: crate::onnx::DecodeLimits::default(),
                    check: None,
                    env: self.worker_env(),
                };
                let built = worker::run(&job, limits, watch.cancelled, progress)?;
                self.built_by_target(req.backend, &built)?;
                Ok(built)
            }
            None if self.target_version.is_some() => Err(BuildError::WorkerUnavailable(format!(
                "building for onnxruntime {} needs the build worker (this process loaded onnxruntime {})",
                self.target_version.as_deref().unwrap_or_default(),
                rt.version
            ))),
            None if self.target_trt.is_some() => Err(BuildError::WorkerUnavailable(format!(
                "building for TensorRT {} needs the build worker (one process never loads two TensorRTs)",
                self.target_trt.as_ref().map(|t| t.version.to_string()).unwrap_or_default()
            ))),
            None => self.build_in_process(rt, req, out, &progress, watch),
        }
    }

    /// A `trt` engine built for an incoming TensorRT was built by that TensorRT (its
    /// `engine.json`): a worker that found another shim (a misconfigured root) must not store
    /// an engine under the incoming version's key.
    fn built_by_target(&self, b: Backend, built: &Built) -> Result<(), BuildError> {
        let Some(t) = self.target_trt.as_ref().filter(|_| b == Backend::Trt) else {
            return Ok(());
        };
        let meta = crate::trt::artifact::read_meta(&built.artifact.dir)?;
        if meta.tensorrt_version != t.version.to_string() {
            return Err(BuildError::WorkerUnavailable(format!(
                "the build for TensorRT {} at {} ran with TensorRT {}: its worker loaded another shim (TRTCACHE_TRT_SHIM, {}/lib/{})",
                t.version,
                t.root.display(),
                meta.tensorrt_version,
                t.root.display(),
                crate::trt::SHIM_FILE
            )));
        }
        Ok(())
    }

    /// This host's own check of a fetched artifact before it is stored (it opens the way
    /// consumers will; with `revalidate` it also passes validation against `req.model`): in
    /// the bounded worker process when the builder has one (the daemon), like every build,
    /// else in this process.
    pub fn check_fetched(
        &self,
        req: &BuildJob,
        artifact: &StagedArtifact,
        revalidate: bool,
    ) -> Result<(), BuildError> {
        let check = worker::CheckArtifact {
            artifact: artifact.clone(),
            revalidate,
        };
        let job = worker::Job {
            model: req.model.clone(),
            backend: req.backend,
            options: req.options.clone(),
            validation: req.validation.clone(),
            out: artifact.dir.clone(),
            ort_library: self.ort_library.clone(),
            decode: crate::onnx::DecodeLimits::default(),
            check: None,
            env: self.worker_env(),
        };
        match &self.worker {
            Some(limits) => worker::check(
                &worker::Job {
                    check: Some(check),
                    ..job
                },
                limits,
                &|| false,
            ),
            None => worker::check_artifact(&job, &check),
        }
    }

    /// The backend's build and the validation, in this process (library callers and tests;
    /// the hook runs between them).
    fn build_in_process(
        &self,
        rt: &runtime::Runtime,
        req: &BuildJob,
        out: &Path,
        progress: &ProgressFn,
        watch: &Watch,
    ) -> Result<Built, BuildError> {
        let backend = backend(req.backend);
        // Found first (see `worker::build_and_validate`); the build's error goes first.
        let reference = stage::reference(rt, &req.model, &req.options, &req.validation, *progress);
        let started = Instant::now();
        let artifact = match backend.build(rt, &req.model, &req.options, out) {
            Ok(a) => a,
            Err(e) => return Err(disk_full(out, &req.model, e)),
        };
        let reference = reference?;
        if let Some(hook) = &self.hook {
            hook(&artifact);
        }
        let build_ms = started.elapsed().as_millis() as u64;
        watch.check()?;
        progress(&Progress::Validating);
        let validation = stage::validate(
            &*backend,
            rt,
            &req.model,
            &artifact,
            &req.options,
            &req.validation,
            reference,
        )?;
        Ok(Built {
            artifact,
            validation,
            build_ms,
        })
    }

    /// Returns the cached artifact for the request, or builds, validates and stores it.
    pub fn build(&self, req: &BuildJob, progress: ProgressFn) -> Result<BuildOutcome, BuildError> {
        self.build_watched(req, progress, Watch::none())
    }

    /// [`Builder::build`] observing `watch`: the planned key and cancellation.
    pub fn build_watched(
        &self,
        req: &BuildJob,
        progress: ProgressFn,
        watch: Watch,
    ) -> Result<BuildOutcome, BuildError> {
        // A backend that cannot run here fails with its precise reason before hashing.
        let rt = runtime::load(self.ort_library.as_deref())?;
        self.check_here(rt, req.backend)?;
        progress(&Progress::Hashing);
        let parts = self.key_parts(req)?;
        let key = parts.key();
        if let Some(expect) = watch.expect.filter(|e| *e != key) {
            return Err(BuildError::Changed(format!(
                "{} changed since it was planned (key {expect}, now {key})",
                watch.snapshot_of.unwrap_or(&req.model).display()
            )));
        }
        watch.check()?;
        if !req.force {
            if let Some(o) = self.cached(key)? {
                return Ok(o);
            }
        }
        // One build per key at a time across processes is the store's lock (the daemon's
        // queue is the single flight within it).
        self.build_now(req, parts, key, progress, watch)
    }

    fn cached(&self, key: CacheKey) -> Result<Option<BuildOutcome>, BuildError> {
        Ok(match self.store.lookup(&key)? {
            Lookup::Hit { record, served } => Some(BuildOutcome {
                key,
                source: Source::Cached,
                record,
                served: Some(served),
                unservable: None,
            }),
            // A failed validation is an answer too: do not rebuild it unless forced.
            Lookup::Unservable { record, why }
                if matches!(record.status, Status::Failed { .. }) =>
            {
                Some(BuildOutcome {
                    key,
                    source: Source::Cached,
                    record,
                    served: None,
                    unservable: Some(why),
                })
            }
            Lookup::Unservable { .. } | Lookup::Miss => None,
        })
    }

    #[tracing::instrument(skip_all, fields(model = %req.model.display(), backend = %req.backend, key = %key))]
    fn build_now(
        &self,
        req: &BuildJob,
        parts: crate::key::KeyParts,
        key: CacheKey,
        progress: ProgressFn,
        watch: Watch,
    ) -> Result<BuildOutcome, BuildError> {
        let rt = runtime::load(self.ort_library.as_deref())?;
        self.check_here(rt, req.backend)?;
        let mut req = req.clone();
        if req.options.timing_cache_dir.is_none() {
            req.options.timing_cache_dir = self.timing_caches.clone();
        }
        let req = &req;
        let plan = provider_plan(&req.model, req.backend);
        progress(&Progress::Building(req.backend));
        // A failed attempt is built again as the backend's fallback ladder says
        // ([`BackendImpl::next_attempt`](super::BackendImpl::next_attempt)) before the build
        // counts as failed: the stored artifact is always one that passed, and its report
        // says what was given up and why. The key stays the one asked for.
        let b = backend(req.backend);
        let mut attempt = req.clone();
        let mut rejected = Vec::new();
        let mut spent_ms = 0;
        let (staging, built) = loop {
            let staging = self.store.staging_dir()?;
            let retry = match self.stage(rt, &attempt, staging.path(), progress, &watch) {
                // ONNX Runtime died running the original model at one candidate's sizes
                // (1.31 divides by zero in asr_wespeaker's pooling at 16 frames): the
                // artifact is not at fault; validate on the search's next candidates.
                Err(BuildError::ReferenceCrashed { inputs, why })
                    if attempt.validation.avoid_inputs.len()
                        < attempt.validation.crash_retries as usize =>
                {
                    tracing::warn!(%why, %inputs, "ONNX Runtime crashed running the original model on validation inputs; validating at other sizes");
                    attempt.validation.avoid_inputs.push(inputs.clone());
                    super::backends::Retry {
                        // The signal, not the stderr tail the error keeps.
                        rejected: format!(
                            "inputs {inputs}: {}",
                            why.split("; its stderr ends").next().unwrap_or(&why)
                        ),
                        fallback: super::Fallback::ReferenceCrashed { inputs },
                    }
                }
                Err(BuildError::Crashed(why)) => {
                    match b.next_attempt(&mut attempt, &Failure::Crashed(&why)) {
                        Some(retry) => retry,
                        None => return Err(BuildError::Crashed(why)),
                    }
                }
                other => {
                    let built = other?;
                    spent_ms += built.build_ms;
                    if built.validation.passed {
                        break (staging, built);
                    }
                    match b.next_attempt(&mut attempt, &Failure::OverTolerance(&built)) {
                        Some(retry) => retry,
                        None => break (staging, built),
                    }
                }
            };
            progress(&Progress::Retrying(retry.fallback));
            rejected.push(retry.rejected);
            drop(staging);
            watch.check()?;
        };
        let Built {
            artifact,
            mut validation,
            build_ms: _,
        } = built;
        let build_ms = spent_ms;
        let level = b.opt_level(&attempt.options);
        if level != b.opt_level(&req.options) {
            validation.opt_level = level.map(|l| l.name().to_string());
        }
        validation.rejected = rejected;
        validation.rewrites = artifact.rewrites.clone();
        watch.check()?;
        // ONNX Runtime read the model by path: what it built from must be what was keyed. A
        // file replaced or rewritten during the build has another identity, so the memo
        // misses and it is hashed again; a different key (or a vanished file) stores nothing.
        match self.key_parts(req).map(|p| p.key()) {
            Ok(now) if now == key => {}
            Ok(now) => {
                return Err(BuildError::Changed(format!(
                    "{} changed during the build (key {key}, now {now}); nothing stored",
                    req.model.display()
                )))
            }
            Err(e) => {
                return Err(BuildError::Changed(format!(
                    "{} changed during the build ({e}); nothing stored",
                    req.model.display()
                )))
            }
        }
        watch.check()?;
        let now = now_secs();
        let mut record = Record {
            format: RECORD_FORMAT,
            key,
            parts,
            status: Status::Ready,
            artifact: None,
            backend: req.backend,
            providers: plan.as_ref().map(|p| p.0.clone()),
            partitions: plan.map(|p| p.1),
            model_path: display_path(watch.snapshot_of.unwrap_or(&req.model)),
            build_ms,
            validation: Some(validation.clone()),
            created: now,
            last_used: now,
            hits: 0,
            provenance: crate::cache::Provenance::Built,
        };
        progress(&Progress::Storing);
        let stored = if validation.passed {
            self.fits(&artifact)?;
            self.store.put(record, Some(&artifact))?
        } else {
            record.status = Status::Failed {
                reason: over_tolerance(&validation, level),
            };
            self.store.put(record, None)?
        };
        drop(staging);
        let (served, unservable) = match self.store.peek(&key)? {
            Lookup::Hit { served, .. } => (Some(served), None),
            Lookup::Unservable { why, .. } => (None, Some(why)),
            Lookup::Miss => (
                None,
                Some("evicted right after the build (cache size limit)".into()),
            ),
        };
        Ok(BuildOutcome {
            key,
            source: Source::Built,
            record: stored,
            served,
            unservable,
        })
    }
}

impl Builder {
    /// Refuses an artifact bigger than the store's size limit ([`Builder::with_size_limit`]).
    fn fits(&self, artifact: &StagedArtifact) -> Result<(), BuildError> {
        let Some(limit) = self.size_limit else {
            return Ok(());
        };
        let mut bytes = 0u64;
        for name in &artifact.files {
            let p = artifact.dir.join(name);
            let m = std::fs::metadata(&p).map_err(|source| BuildError::Io { path: p, source })?;
            bytes = bytes.saturating_add(m.len());
        }
        if bytes > limit {
            return Err(BuildError::TooLarge { bytes, limit });
        }
        Ok(())
    }
}

/// The failure reason of an artifact over tolerance: its worst outputs, the levels tried, and
/// what to change when the difference is acceptable.
/// The steps outputs were also allowed, as a refusal says them (`, float16/bfloat16 8
/// steps`; `, 8 int8 steps of the output's range`), empty when none was held to steps.
fn steps_rule(v: &ValidationReport) -> String {
    let of = |kind: &str| v.outputs.iter().any(|o| o.steps_of() == Some(kind));
    let mut s = String::new();
    if of("float16") || of("bfloat16") {
        s += &format!(", float16/bfloat16 {} steps", v.tolerance.half_ulps());
    }
    if of("int8") {
        s += &format!(
            ", {} int8 steps of the output's range",
            v.tolerance.half_ulps()
        );
    }
    s
}

fn over_tolerance(v: &ValidationReport, level: Option<OptLevel>) -> String {
    let steps = steps_rule(v);
    let tol = format!(
        "validation over tolerance (abs {:e}, rel {:e}{steps})",
        v.tolerance.atol, v.tolerance.rtol
    );
    let fix = "widen the tolerance (--atol/--rtol/--ulps, or [tolerances.<precision>] in the \
               sidecar) if the difference is acceptable";
    match level {
        Some(level) if !v.rejected.is_empty() => {
            let mut tried = v.rejected.clone();
            tried.push(format!("{}: {}", level.name(), v.worst()));
            format!(
                "{tol} at every optimization level down to {}: {}; {fix}",
                level.name(),
                tried.join("; ")
            )
        }
        _ => format!("{tol}: {}; {fix}", v.worst()),
    }
}

/// Which provider runs what, as the capability analysis plans it for `backend`'s provider
/// list: provider → top-level node count, and the provider of each partition in graph order.
/// `None` (with a warning) when the analysis cannot run; a build never fails on it.
fn provider_plan(model: &Path, backend: Backend) -> Option<(BTreeMap<String, usize>, Vec<String>)> {
    use crate::analysis::{analyse, Options};
    if !backend.is_onnx() {
        // A TensorRT engine has no partitions: the parser takes every node or the build fails.
        return None;
    }
    let providers = backend.providers().to_vec();
    let m = match Model::load(model) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(model = %model.display(), error = %e, "capability analysis skipped");
            return None;
        }
    };
    let cap = match analyse(
        &m,
        &Options {
            providers,
            ..Options::default()
        },
    ) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(model = %model.display(), error = %e, "capability analysis failed");
            return None;
        }
    };
    let mut counts = BTreeMap::new();
    for n in &cap.nodes {
        *counts.entry(n.provider.ort_name().to_string()).or_insert(0) += 1;
    }
    let parts = cap
        .partitions
        .iter()
        .map(|p| p.provider.ort_name().to_string())
        .collect();
    Some((counts, parts))
}

fn display_path(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}
