//! The daemon's state behind the service's one lock: the served models (each with its
//! repository scan, its plans by version and selection, and what was last announced about each
//! variant), the ready artifacts, and the indexes kept beside them (which models a path or a
//! key belongs to, which models' ready pointers may have changed). Plain data and its
//! bookkeeping: no I/O but the stat of a model's links when it is indexed, no locking.
//!
//! Enters: repository models, plans, handouts. Leaves: what the service's operations read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use crate::daemon::build_cache::{Handout, Planned, Selection, Variants};
use crate::daemon::failure::Failure;
use crate::daemon::repo::RepoModel;
use crate::daemon::watch_stream::Announced;
use crate::spec::CacheKey;

pub(super) struct ModelState {
    pub(super) repo: RepoModel,
    /// The paths [`State::sources`] holds for it: its files, and where those that are links
    /// lead (a change there is reported under the link's target).
    pub(super) indexed: Vec<PathBuf>,
    /// Bumped whenever the model's files change, so stale plans are discarded.
    pub(super) generation: u64,
    /// What the model serves (its sidecar's backends, profiles and precision, and the profile
    /// an acquire naming none gets): read on the blocking pool when the model was registered,
    /// again only when the watcher sees its files (the sidecar among them) change.
    pub(super) variants: Variants,
    /// Plans by (version, selection): the key, or why planning failed.
    pub(super) plans: HashMap<(u64, Selection), Result<Planned, Failure>>,
    /// The last watch event sent about each variant of the served version.
    pub(super) announced: HashMap<Selection, Announced>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) models: BTreeMap<String, ModelState>,
    pub(super) ready: HashMap<CacheKey, Handout>,
    /// When each ready artifact's use was last passed on to the store ([`BuildCache::touch`]).
    pub(super) touched: HashMap<CacheKey, Instant>,
    /// Every file of every model's fingerprint, and the models made of it: which models a
    /// changed path may have changed (`folder_watch`), without a look at the others.
    pub(super) sources: BTreeMap<PathBuf, BTreeSet<String>>,
    /// The models whose plans name each key, with how many of their plans do: who hears of
    /// a key's change, and whether an artifact is still anyone's. Kept with `plans`, so a
    /// build's end costs the same however many models there are.
    pub(super) key_models: HashMap<CacheKey, HashMap<String, usize>>,
    /// Models whose ready pointer may have changed since the ready index last looked.
    pub(super) ready_dirty: BTreeSet<String>,
}

impl State {
    /// Indexes a model's files ([`State::sources`]); returns the paths indexed.
    pub(super) fn index_sources(&mut self, m: &RepoModel) -> Vec<PathBuf> {
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
    pub(super) fn drop_model(&mut self, old: &ModelState) -> Vec<CacheKey> {
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
    pub(super) fn ref_key(&mut self, key: CacheKey, model: &str) {
        *self
            .key_models
            .entry(key)
            .or_default()
            .entry(model.to_string())
            .or_default() += 1;
    }

    /// One plan of `model` no longer names `key`; once no plan does, its artifact is
    /// forgotten (the store still has it: the same content found again is one lookup).
    pub(super) fn unref_key(&mut self, key: CacheKey, model: &str) {
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
    pub(super) fn named(&self, key: &CacheKey) -> bool {
        self.key_models.contains_key(key)
    }

    /// Keeps a ready artifact in memory when a current plan names it (a path built by
    /// request, which no plan remembers, is looked up again instead).
    pub(super) fn remember_ready(&mut self, key: CacheKey, a: Handout) {
        if self.named(&key) {
            self.ready.insert(key, a);
        }
        self.dirty_key(&key);
    }

    /// Forgets a ready artifact; its models' pointers are looked at again.
    pub(super) fn forget_ready(&mut self, key: &CacheKey) -> bool {
        self.touched.remove(key);
        let was = self.ready.remove(key).is_some();
        self.dirty_key(key);
        was
    }

    /// The ready pointers of every model planned to `key` may have changed.
    pub(super) fn dirty_key(&mut self, key: &CacheKey) {
        if let Some(models) = self.key_models.get(key) {
            self.ready_dirty.extend(models.keys().cloned());
        }
    }
}
