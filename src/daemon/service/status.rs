//! What the service reports: each model's status (every variant's state, key, phase, origin
//! or reason), a watch subscription taken together with that status, the counters, and the
//! snapshot the metrics are encoded from.
//!
//! Enters: the state, the queue's jobs and failures, the build cache's counters. Leaves:
//! protocol types ([`ModelStatus`], [`Stats`]) and [`crate::daemon::metrics::Snapshot`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use trtcache_client::protocol::*;

use super::state::{ModelState, State};
use super::Service;
use crate::daemon::build_cache::{Layout, Planned, Selection};
use crate::daemon::failure::{fail, Failure};
use crate::daemon::metrics::Snapshot;
use crate::daemon::queue::JobStatus;

impl Service {
    pub(super) fn variant_status(
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
            runtime: sel.runtime.clone(),
            validated_at: None,
            also_validated_at: None,
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
                    let shapes = &h.metadata.validation.shapes;
                    v.validated_at = (!shapes.is_empty()).then(|| shapes.clone());
                    let also = &h.metadata.validation.also_at;
                    v.also_validated_at = (!also.is_empty()).then(|| also.clone());
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

    pub(super) fn model_status(&self, m: &ModelState, st: &State) -> ModelStatus {
        let served = m.repo.served();
        let version = served.map(|e| e.version).unwrap_or(0);
        let variants = served
            .map(|_| {
                self.with_incoming(&m.variants)
                    .iter()
                    .map(|sel| match m.plans.get(&(version, sel.clone())) {
                        Some(p) => self.variant_status(p, sel, st),
                        None => VariantStatus {
                            profile: sel.profile.clone().unwrap_or_else(|| "default".into()),
                            backend: sel.backend.to_string(),
                            precision: "fp32".into(),
                            state: VariantState::Queued,
                            key: None,
                            reason: None,
                            phase: Some("planning".into()),
                            origin: None,
                            runtime: sel.runtime.clone(),
                            validated_at: None,
                            also_validated_at: None,
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
                Layout::Flat => "flat".into(),
                Layout::Triton => "triton".into(),
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

    /// What the metrics are encoded from, taken now.
    pub fn metrics_snapshot(&self) -> Snapshot {
        Snapshot {
            stats: self.stats(),
            models: self.list(),
            max_models: self.cfg.limits.metrics_max_models,
            acquire_seconds: self.acquire_seconds.clone(),
            build_seconds: self.queue.build_seconds.clone(),
        }
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
