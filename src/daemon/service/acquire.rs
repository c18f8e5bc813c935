//! Acquire: a model's artifact as metadata and open read-only descriptors, from memory when
//! it is ready, else looked up or built (waited for when the request asks). A file changed
//! under the daemon is never handed out: the descriptors are compared with the stamps the
//! build cache last verified, and a change sends the artifact back to be checked.
//!
//! Enters: an [`AcquireRequest`]. Leaves: [`ArtifactMeta`] and files, or a typed failure;
//! the hit, miss and error counters and the acquire latency histogram.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use trtcache_client::protocol::*;

use super::{wire_backend, Service};
use crate::daemon::build_cache::Handout;
use crate::daemon::failure::{fail, Failure};
use crate::key::memo::FileId;

impl Service {
    pub(super) fn open_files(&self, a: &Handout) -> Result<Vec<File>, std::io::Error> {
        a.paths.iter().map(File::open).collect()
    }

    /// Whether the opened files are still the ones the build cache last checked (one `fstat`
    /// each): a write, truncation or replacement since changes the stamp.
    pub(super) fn unchanged(&self, a: &Handout, files: &[File]) -> Result<(), String> {
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
    pub(super) fn open_dir(&self, a: &Handout) -> Option<File> {
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
    pub(super) async fn acquire_uncounted(
        self: &Arc<Self>,
        req: &AcquireRequest,
    ) -> Result<(ArtifactMeta, Vec<File>, bool), Failure> {
        let (entry, variants) = self.entry_and_variants(&req.model, req.version)?;
        let backend = wire_backend(req.backend.as_deref())?;
        let mut sel = self.selection_for(&variants, req.profile.clone(), backend);
        // The runtime the consumer runs: its own artifact, never another version's.
        // Only the libraries its backend builds with count (`daemon::runtimes`).
        if let Some(want) = &req.runtime {
            sel.runtime = match self.build_cache.runtimes() {
                Some(rts) => rts
                    .serving(Some(want), sel.backend)
                    .map_err(|e| fail(ErrorCode::RuntimeUnavailable, e.to_string()))?,
                None => None,
            };
        }
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
}
