//! The served model set: what the watcher (or an in-process `warm`) brings in and takes out
//! (`apply`, `register`), what a targeted scan is compared with, which models a changed path
//! belongs to, a model's entry by name and version, and the selection a request means.
//! A cache folder opened afresh under the daemon is caught up with here too.
//!
//! Enters: repository models and removed names; request names. Leaves: model entries and
//! selections for planning, watch events for changed and removed models.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use trtcache_client::protocol::*;

use super::state::ModelState;
use super::Service;
use crate::daemon::build_cache::{ModelEntry, Planned, Selection, Variants};
use crate::daemon::failure::{fail, Failure};
use crate::daemon::repo::{RepoModel, Snapshot};
use crate::daemon::watch_stream::model_event;
use crate::spec::Backend;

impl Service {
    /// When the build cache opened its cache folder afresh (it was deleted under the daemon),
    /// every artifact remembered as ready may be gone with it: forget them all (an acquire
    /// looks each up again), let the ready index look at every model, and warm every planned
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

    /// The selection an acquire means: the requested profile (the model's default when
    /// none), the requested backend or else the model's first variant's (its sidecar's first
    /// backend, else the first configured one), and that backend's precision. `variants` is
    /// what the model serves (kept with its state: no sidecar is read here).
    pub(super) fn selection_for(
        &self,
        variants: &Variants,
        profile: Option<String>,
        backend: Option<Backend>,
    ) -> Selection {
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
            profile: profile.or_else(|| variants.default_profile.clone()),
            backend,
            precision,
            runtime: None,
        }
    }

    /// A model's variants followed by the same variants for each incoming runtime, those
    /// of the backends that build with it (an ONNX Runtime: `ort-*`; a TensorRT: `trt` and
    /// `ort-tensorrt`): what is built in the background and what `status` lists.
    pub(super) fn with_incoming(&self, variants: &Variants) -> Vec<Selection> {
        let mut all = variants.selections.clone();
        if let Some(rts) = self.build_cache.runtimes() {
            for rt in rts.all_incoming() {
                all.extend(
                    variants
                        .selections
                        .iter()
                        .filter(|s| rt.builds(s.backend))
                        .map(|s| Selection {
                            runtime: Some(rt.id()),
                            ..s.clone()
                        }),
                );
            }
        }
        all
    }

    /// Applies changed models (new or modified) and removed names from the watcher: cancels
    /// builds of replaced or removed content, then plans and queues the new content in the
    /// background. Returns how many models changed.
    pub async fn apply(self: &Arc<Self>, changed: Vec<RepoModel>, removed: Vec<String>) -> usize {
        let n = changed.len() + removed.len();
        for name in self.register(changed, removed).await {
            let svc = self.clone();
            tokio::spawn(async move { svc.warm_model(&name).await });
        }
        n
    }

    /// [`Service::apply`] without the background warming: the models are known (and builds
    /// of replaced or removed content cancelled), nothing is planned or queued until a
    /// request asks. `trtcache warm` without a daemon runs this service in-process this way
    /// (`super::warm_in_process`). Returns the names of the new or changed models.
    ///
    /// The changed models' sidecars are read first, on the blocking pool, and what they say
    /// is kept with each model's state ([`Service::read_variants`]).
    pub async fn register(
        self: &Arc<Self>,
        changed: Vec<RepoModel>,
        removed: Vec<String>,
    ) -> Vec<String> {
        let changed = self.read_variants(changed).await;
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
            for (m, variants) in changed {
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
                        variants,
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

    /// What each of `models` serves: its served version's variants, from one read of its
    /// sidecar, on the blocking pool (parsing TOML has no place on the socket's threads). A
    /// model without a servable version serves nothing. Should the read panic, the models are
    /// left out: the watcher's next scan brings them again.
    pub(super) async fn read_variants(&self, models: Vec<RepoModel>) -> Vec<(RepoModel, Variants)> {
        if models.is_empty() {
            return Vec::new();
        }
        let cache = self.build_cache.clone();
        let backends = self.cfg.backends.clone();
        let read = tokio::task::spawn_blocking(move || {
            models
                .into_iter()
                .map(|m| {
                    let v = m
                        .served()
                        .map(|e| cache.variants(e, &backends))
                        .unwrap_or_default();
                    (m, v)
                })
                .collect()
        });
        read.await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the models' sidecars failed");
            Vec::new()
        })
    }

    /// What the files outside the repository a `build` request names serve (as
    /// [`Service::read_variants`], on the blocking pool; planned afresh each time, since no
    /// watcher tells when they change).
    pub(super) async fn variants_of(
        &self,
        entries: Vec<ModelEntry>,
    ) -> Result<Vec<(ModelEntry, Variants)>, Failure> {
        let cache = self.build_cache.clone();
        let backends = self.cfg.backends.clone();
        tokio::task::spawn_blocking(move || {
            entries
                .into_iter()
                .map(|e| {
                    let v = cache.variants(&e, &backends);
                    (e, v)
                })
                .collect()
        })
        .await
        .map_err(|e| fail(ErrorCode::Internal, e.to_string()))
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

    /// A model's entry: its served version, or `version`.
    pub(super) fn entry(&self, name: &str, version: Option<u64>) -> Result<ModelEntry, Failure> {
        self.entry_and_variants(name, version).map(|(e, _)| e)
    }

    /// [`Service::entry`], and what the model serves, under one lock.
    pub(super) fn entry_and_variants(
        &self,
        name: &str,
        version: Option<u64>,
    ) -> Result<(ModelEntry, Variants), Failure> {
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
        .map(|e| (e, m.variants.clone()))
        .ok_or_else(|| {
            fail(
                ErrorCode::NotFound,
                format!("model `{name}` has no version {version:?}"),
            )
        })
    }
}
