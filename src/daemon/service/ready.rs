//! What the ready index ([`crate::daemon::ready`]) publishes: for every model, the artifact a
//! plain acquire (no profile, backend or version named) would hand out right now without
//! waiting, as a [`ReadyPointer`] in a plain [`Wanted`] the index is handed; and the count of
//! consumers who opened one ([`Service::fast_hit`]), which the store's LRU order sees like
//! any other hit.
//!
//! A pointer names a bounded set of the model's files for consumers to check (its graph, its
//! sidecar or the sidecar's absence, Triton's `config.pbtxt`, its folder): a consumer's
//! checks cost the same for a model of one file and one of 3,000 external-data files. Every
//! other file of the model (external data, whatever the scan fingerprinted) is the daemon's
//! to check: [`Wanted::watched`] lists them all, the index is written only while each
//! still has the scanned stamp, and a repository event on one of them removes the pointer at
//! once (`ReadyIndex::touched`), before the watcher settles the change.
//!
//! Enters: the state (models, plans, ready artifacts). Leaves: pointers by model name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use trtcache_client::ready::{ReadyFile, ReadyPointer, ReadySource};

use super::state::{ModelState, State};
use super::{Service, TOUCH_EVERY};
use crate::daemon::build_cache::{Handout, Layout, ModelEntry, Selection};
use crate::daemon::ready::{Scoped, Wanted};
use crate::daemon::repo::FileStamp;
use crate::spec::CacheKey;

fn ns(t: SystemTime) -> Option<i128> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_nanos() as i128)
}

fn source(f: &FileStamp) -> Option<ReadySource> {
    Some(ReadySource {
        path: f.path.clone(),
        stamp: Some((f.size, ns(f.mtime?)?, f.ctime_ns)),
    })
}

/// A stamp of `p` taken now (a model's folder: an entry added or removed changes its mtime).
fn stat_source(p: &Path) -> Option<ReadySource> {
    source(&FileStamp::of(p)?)
}

/// Where the model's sidecar would be: a consumer checks that it is still absent, so a
/// sidecar written since (a new profile or backend) is never answered with the old artifact.
fn sidecar_path(root: &Path, e: &ModelEntry) -> PathBuf {
    if in_folder(root, e) {
        root.join(&e.name).join("trtcache.toml")
    } else {
        root.join(format!("{}.trtcache.toml", e.name))
    }
}

/// Whether the model is a folder (`NAME/model.onnx` or Triton's `NAME/VERSION/…`) rather than
/// `NAME.onnx` at the repository's top.
fn in_folder(root: &Path, e: &ModelEntry) -> bool {
    e.layout == Layout::Triton || e.path.parent() != Some(root)
}

/// What a consumer checks of a model (a bounded subset of `watched`, every file the scan
/// recorded): its graph, its sidecar (or the sidecar's absence), Triton's `config.pbtxt`, and
/// its folder's own stamp.
fn checked_sources(root: &Path, e: &ModelEntry, watched: &[ReadySource]) -> Vec<ReadySource> {
    let folder = in_folder(root, e).then(|| root.join(&e.name));
    let config = folder.as_ref().map(|f| f.join("config.pbtxt"));
    let sidecar = sidecar_path(root, e);
    watched
        .iter()
        .filter(|s| {
            s.path == e.path
                || s.path == sidecar
                || Some(&s.path) == config.as_ref()
                || Some(&s.path) == folder.as_ref()
        })
        .cloned()
        .collect()
}

/// The pointer to `a`, served for `entry`; `None` when the daemon cannot vouch for its files
/// (no verified stamps, files in more than one folder, a name that is not a plain path in it).
fn pointer(entry: &ModelEntry, a: &Handout, sources: Vec<ReadySource>) -> Option<ReadyPointer> {
    let mut metadata = a.metadata.clone();
    metadata.model = entry.name.clone();
    metadata.version = entry.version;
    metadata.dir_fd_index = None;
    if a.paths.is_empty()
        || a.stamps.len() != a.paths.len()
        || metadata.files.len() != a.paths.len()
    {
        return None;
    }
    let dir = std::path::absolute(a.paths[0].parent()?).ok()?;
    let mut files = Vec::with_capacity(a.paths.len());
    for ((p, s), f) in a.paths.iter().zip(&a.stamps).zip(&metadata.files) {
        if std::path::absolute(p).ok()? != dir.join(&f.name) || f.name.split('/').any(|c| c == "..")
        {
            return None;
        }
        files.push(ReadyFile {
            name: f.name.clone(),
            dev: s.dev,
            ino: s.ino,
            size: s.size,
            mtime_ns: s.mtime_ns,
            ctime_ns: s.ctime_ns,
        });
    }
    Some(ReadyPointer {
        metadata,
        dir,
        files,
        sources,
    })
}

impl Service {
    /// Every model's pointer: its served version's default variant when that is planned and
    /// ready. With `full` false, only the models whose pointer may have changed since the
    /// last call are looked at, and their names come back as the scope (a model in it without
    /// a pointer has none now): a build costs the index what its models need, not a pass over
    /// the repository. Blocking: it stats model folders.
    pub fn ready_pointers(&self, full: bool) -> Scoped {
        let root = self.cfg.models.clone();
        let (scope, models) = {
            let mut st = self.lock();
            let dirty = std::mem::take(&mut st.ready_dirty);
            // The default selection, from what the model serves (kept with its state).
            let one = |(name, m): (&String, &ModelState)| {
                let entry = m.repo.served()?.clone();
                let sources: Option<Vec<ReadySource>> =
                    m.repo.fingerprint.iter().map(source).collect();
                let sel = self.selection_for(&m.variants, None, None);
                Some((name.clone(), sel, entry, sources?))
            };
            let models: Vec<(String, Selection, ModelEntry, Vec<ReadySource>)> = if full {
                st.models.iter().filter_map(one).collect()
            } else {
                dirty
                    .iter()
                    .filter_map(|n| st.models.get_key_value(n))
                    .filter_map(one)
                    .collect()
            };
            ((!full).then_some(dirty), models)
        };
        let mut todo = Vec::with_capacity(models.len());
        for (name, sel, entry, mut sources) in models {
            if entry.sidecar.is_none() {
                sources.push(ReadySource {
                    path: sidecar_path(&root, &entry),
                    stamp: None,
                });
            }
            // A folder's own stamp: a version folder, `config.pbtxt` or sidecar added to it
            // changes what is served.
            if in_folder(&root, &entry) {
                match stat_source(&root.join(&entry.name)) {
                    Some(s) => sources.push(s),
                    None => continue,
                }
            }
            todo.push((name, entry, sel, sources));
        }
        let st = self.lock();
        let mut out = BTreeMap::new();
        for (name, entry, sel, watched) in todo {
            let Some(m) = st.models.get(&name) else {
                continue;
            };
            if m.repo.served().map(|e| e.version) != Some(entry.version) {
                continue;
            }
            let Some(Ok(p)) = m.plans.get(&(entry.version, sel)) else {
                continue;
            };
            let Some(a) = st.ready.get(&p.key) else {
                continue;
            };
            let checked = checked_sources(&root, &entry, &watched);
            if let Some(pointer) = pointer(&entry, a, checked) {
                out.insert(
                    name,
                    Wanted {
                        key: p.key,
                        pointer,
                        watched,
                    },
                );
            }
        }
        (scope, out)
    }

    /// A consumer opened the pointer of `key` (the index's inotify watch saw it): a hit, as
    /// an acquire over the socket would have been, and a use for the LRU order.
    pub fn fast_hit(&self, key: CacheKey) {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        self.counters.fast_hits.fetch_add(1, Ordering::Relaxed);
        let mut st = self.lock();
        self.note_use(&mut st, key);
    }

    /// Passes a use of `key` on to the store, at most every [`TOUCH_EVERY`] per artifact.
    pub(super) fn note_use(&self, st: &mut State, key: CacheKey) {
        let now = Instant::now();
        let due = st
            .touched
            .get(&key)
            .is_none_or(|t| now.duration_since(*t) >= TOUCH_EVERY);
        if due {
            st.touched.insert(key, now);
            self.toucher.touch(key);
        }
    }

    /// Tells the ready index that what a model serves may have changed.
    pub(super) fn ready_changed(&self) {
        if let Some(r) = self.ready_index.get() {
            r.changed();
        }
    }
}
