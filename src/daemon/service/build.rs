//! The `build` request (and `trtcache warm`): every variant of the named models (or of model
//! files outside the repository), planned, looked up or built, with progress events streamed
//! as each goes and one result per variant.
//!
//! Enters: a [`BuildRequest`] and a progress channel. Leaves: [`Progress`] events and
//! [`BuildResult`]s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use trtcache_client::protocol::*;

use super::{wire_backend, Service};
use crate::daemon::build_cache::{ModelEntry, Selection};
use crate::daemon::failure::{fail, Failure};
use crate::daemon::queue::JobStatus;

impl Service {
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
        // (entry, outside the repository, its variants): a path entry is planned afresh each
        // time, since no watcher tells when its file changes.
        let mut entries = Vec::new();
        for n in &names {
            let (e, variants) = self.entry_and_variants(n, None)?;
            entries.push((e, false, variants));
        }
        let mut paths = Vec::new();
        for p in &req.paths {
            let e = crate::daemon::repo::entry_for_path(std::path::Path::new(p))
                .map_err(|m| fail(ErrorCode::BadRequest, m))?;
            paths.push(e);
        }
        if !paths.is_empty() {
            for (e, variants) in self.variants_of(paths).await? {
                entries.push((e, true, variants));
            }
        }

        let backend = wire_backend(req.backend.as_deref())?;
        let runtime = match &req.runtime {
            Some(path) => Some(self.add_runtime(path).await?),
            None => None,
        };
        let limit = req
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_secs(self.cfg.limits.build_timeout_secs));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (e, outside, variants) in entries {
            // The model's variants (its sidecar's backends and profiles), narrowed to the
            // requested backend; a backend none of them uses is built with the defaults.
            let mut sels: Vec<Selection> = variants
                .selections
                .iter()
                .filter(|s| backend.is_none_or(|b| s.backend == b))
                .cloned()
                .collect();
            if sels.is_empty() {
                if let Some(b) = backend {
                    sels.push(self.selection_for(&variants, None, Some(b)));
                }
            }
            if let Some((rt, id)) = &runtime {
                // An ONNX Runtime library serves the `ort-*` backends, a TensorRT `trt` and
                // `ort-tensorrt`.
                sels.retain(|s| rt.builds(s.backend));
                for s in &mut sels {
                    s.runtime = id.clone();
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

    /// Adds the runtime at `path` to the incoming runtimes: an ONNX Runtime library (a
    /// file, found and trust-checked) or a TensorRT install root (a folder, its version asked
    /// in a child process), on the blocking pool. Its models are then pre-built in the
    /// background too, as for a configured one. Returns it and the id selections name it by
    /// (`None`: it is the current runtime, whose variants are the current ones).
    async fn add_runtime(
        self: &Arc<Self>,
        path: &str,
    ) -> Result<(crate::daemon::runtimes::Incoming, Option<String>), Failure> {
        use crate::daemon::runtimes::{probe_tensorrt, Incoming, OrtRuntime};
        let p = std::path::PathBuf::from(path);
        if !p.is_absolute() {
            return Err(fail(
                ErrorCode::BadRequest,
                format!("runtime `{path}`: an absolute path to libonnxruntime.so.* or to a TensorRT install root"),
            ));
        }
        let cache = self.build_cache.clone();
        let (rt, added) = tokio::task::spawn_blocking(move || {
            let rt = if p.is_dir() {
                probe_tensorrt(&p, None)
                    .map(Incoming::Trt)
                    .map_err(|e| e.to_string())
            } else {
                OrtRuntime::locate(Some(&p))
                    .map(Incoming::Ort)
                    .map_err(|e| format!("runtime {}: {e}", p.display()))
            }?;
            let added = cache.add_runtime(rt.clone()).map_err(|e| e.to_string())?;
            Ok::<_, String>((rt, added))
        })
        .await
        .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?
        .map_err(|e| fail(ErrorCode::BadRequest, e))?;
        if added {
            tracing::info!(runtime = %crate::daemon::runtimes::describe(&rt.id()), path, "incoming runtime added");
            let names: Vec<String> = self.lock().models.keys().cloned().collect();
            for name in names {
                let svc = self.clone();
                tokio::spawn(async move { svc.warm_model(&name).await });
            }
        }
        let id = rt.id();
        let incoming = self
            .build_cache
            .runtimes()
            .is_some_and(|r| r.incoming_by_id(&id).is_some());
        Ok((rt, incoming.then_some(id)))
    }

    pub(super) async fn build_one(
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
            runtime: sel.runtime.clone(),
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
}
