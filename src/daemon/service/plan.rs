//! Planning and background builds: a variant's plan (its key, computed once per model
//! generation on the blocking pool, bounded by the planning slots), the background warming of
//! a model's variants, queued builds retried after failures of the machine, a finished job's
//! artifact kept in memory, and the watch events every outcome is announced with.
//!
//! Enters: model entries and selections. Leaves: plans, queued jobs, ready artifacts in the
//! state, watch events.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use trtcache_client::protocol::*;

use super::state::{ModelState, State};
use super::Service;
use crate::daemon::build_cache::{Handout, ModelEntry, Planned, Selection};
use crate::daemon::failure::{fail, Failure};
use crate::daemon::queue::JobStatus;
use crate::daemon::watch_stream::{Change, VariantId};
use crate::spec::CacheKey;

impl Service {
    /// Background: plan every variant of a model's served version, look it up, queue builds.
    pub(super) async fn warm_model(self: &Arc<Self>, name: &str) {
        let Some((entry, variants)) = self.entry_and_variants(name, None).ok() else {
            return;
        };
        // The current runtime's variants first; the incoming runtimes' ride the queue's
        // lowest lane, behind every current-runtime build.
        for sel in self.with_incoming(&variants) {
            if let Ok(p) = self.planned(&entry, &sel).await {
                if self.ready_artifact(&p).await.is_none() {
                    self.submit_tracked(&p);
                }
            }
        }
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
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(m) = st.models.get_mut(&entry.name) {
            // Failures are remembered only for the model's own variants: a client naming
            // endless made-up backends or profiles must not grow this map (those fail before
            // any hashing).
            let keep = r.is_ok() || m.variants.selections.contains(sel);
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
    pub(super) fn changed_since_scan(&self, entry: &ModelEntry) -> Option<bool> {
        let now = crate::daemon::repo::FileStamp::of(&entry.path)?;
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
    pub(super) async fn plan_uncached(
        &self,
        entry: &ModelEntry,
        sel: &Selection,
    ) -> Result<Planned, Failure> {
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
    pub(super) fn forget_plan(&self, entry: &ModelEntry, sel: &Selection, key: CacheKey) {
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
    pub(super) fn submit_tracked(self: &Arc<Self>, p: &Planned) {
        self.submit_retrying(p.clone(), 0);
    }

    /// Queues a background build; when it fails for a reason of the machine (the cache full,
    /// read-only, failing or its folders deleted: the queue's transient failures), queues it
    /// again after a backoff that doubles from 1 s up to `limits.storage_retry_max_secs`,
    /// for as long as the model's current plan is still this key.
    pub(super) fn submit_retrying(self: &Arc<Self>, p: Planned, attempt: u32) {
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
    pub(super) fn finished(&self, key: CacheKey, r: &Result<Handout, Failure>) {
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

    pub(super) async fn wait_job(
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

    /// A ready artifact from memory or, failing that, from the build cache's store.
    pub(super) async fn ready_artifact(&self, p: &Planned) -> Option<Handout> {
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

    /// Tells watchers what happened to `key`, once per change, for every model whose served
    /// version has a variant planned to it (identical models share a key).
    pub(super) fn announce(&self, st: &mut State, key: CacheKey, change: Change) {
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
    pub(super) fn announce_variant(
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
}
