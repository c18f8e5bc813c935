//! The repository watcher: the one on the model folder (`super::watch_stream` is the
//! other, the socket's `watch` event stream to subscribed clients). notify events are only hints (a `mv` into the folder gives only a
//! rename event and events can be dropped), so an event marks the paths it names dirty. Once
//! it has been quiet for the debounce, the models those paths may belong to are scanned (a
//! path's top-level name and its prefixes before a `.`, and the models that name the path as
//! external data: [`Service::models_using`]), never the whole repository, so a change costs
//! the same however many models there are; a model whose fingerprint (size, mtime, ctime and
//! mode of its files) differs from the served one is applied only when a second scan one
//! debounce later sees the same fingerprint, so `cp`, `mv`-into and write-then-rename all
//! settle before a build starts. A periodic full rescan covers dropped events, overflow and
//! what a path cannot name (a model linked to a folder elsewhere in the repository). A `rescan` request runs the same two-scan settling once, at once
//! ([`rescan`]), so `trtcache warm` sees models a deploy has just copied in.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use super::repo::{self, RepoModel, Snapshot};
use super::service::Service;

/// What a scan covers: the whole repository (at start, periodically, after an overflow of
/// events, on `rescan`), or the models that the top-level names events touched may be.
#[derive(Clone, Debug, Default)]
enum Scope {
    #[default]
    None,
    All,
    Names(BTreeSet<String>),
}

impl Scope {
    fn names(&self) -> Vec<String> {
        match self {
            Scope::Names(n) => n.iter().cloned().collect(),
            _ => Vec::new(),
        }
    }

    fn add(&mut self, names: impl IntoIterator<Item = String>) {
        match self {
            Scope::All => {}
            Scope::None => *self = Scope::Names(names.into_iter().collect()),
            Scope::Names(n) => n.extend(names),
        }
    }
}

/// Models of `scan` (over `scope`) whose fingerprint differs from the served one, and served
/// names in the scope gone from it. A targeted scope costs what it names, not the repository.
fn diff(svc: &Service, scope: &Scope, scan: &Snapshot) -> (Vec<RepoModel>, Vec<String>) {
    match scope {
        Scope::Names(names) => {
            let served = svc.fingerprints_of(names);
            let changed = scan
                .values()
                .filter(|m| served.get(&m.name) != Some(*m))
                .cloned()
                .collect();
            let removed = served
                .keys()
                .filter(|k| !scan.contains_key(*k))
                .cloned()
                .collect();
            (changed, removed)
        }
        _ => svc.diff_all(scan),
    }
}

/// Paths events named, until the watcher takes them; past `limit` of them, or on any error
/// or overflow, the next pass scans everything instead.
struct Pending {
    scope: Scope,
    paths: BTreeSet<PathBuf>,
    limit: usize,
}

impl Pending {
    fn note(&mut self, ev: &notify::Result<notify::Event>) {
        match ev {
            Ok(e) if !e.need_rescan() && !e.paths.is_empty() => {
                if matches!(self.scope, Scope::All) {
                    return;
                }
                self.paths.extend(e.paths.iter().cloned());
                if self.paths.len() > self.limit {
                    self.paths.clear();
                    self.scope = Scope::All;
                }
            }
            _ => {
                self.paths.clear();
                self.scope = Scope::All;
            }
        }
    }
}

/// The top-level names a changed `path` may belong to: its first component under `root` and
/// every prefix of it before a `.` (a flat model's `NAME.onnx`, `NAME.trtcache.toml`,
/// `NAME.onnx.data`), plus every model that names the path (or a file under it) as external
/// data. `None`: only a full scan can tell (the root itself, a name that is not UTF-8).
fn names_for(svc: &Service, root: &Path, path: &Path) -> Option<Vec<String>> {
    let rel = path.strip_prefix(root).ok()?;
    let Some(Component::Normal(first)) = rel.components().next() else {
        return None;
    };
    let first = first.to_str()?;
    let mut names: Vec<String> = first
        .match_indices('.')
        .map(|(i, _)| first[..i].to_string())
        .chain(std::iter::once(first.to_string()))
        .collect();
    names.extend(svc.models_using(path));
    Some(names)
}

/// The scope events named: the names of every path, or everything.
fn scope_of(svc: &Service, root: &Path, pending: &Mutex<Pending>) -> Scope {
    let (scope, paths) = {
        let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
        (std::mem::take(&mut p.scope), std::mem::take(&mut p.paths))
    };
    let mut scope = scope;
    for path in &paths {
        match names_for(svc, root, path) {
            Some(names) => scope.add(names),
            None => return Scope::All,
        }
    }
    scope
}

/// One scan of `scope` on the blocking pool; its skipped entries are warned about once.
async fn scan_scope(
    svc: &Service,
    root: PathBuf,
    scope: &Scope,
) -> Result<repo::Scan, repo::ScanError> {
    let follow = svc.cfg.follow_symlinks_outside_repo;
    let names = match scope {
        Scope::Names(n) => Some(n.clone()),
        _ => None,
    };
    let full = names.is_none();
    let s = tokio::task::spawn_blocking(move || match names {
        Some(n) => repo::scan_names(&root, follow, &n),
        None => repo::scan_all_with(&root, follow),
    })
    .await
    .map_err(|e| repo::ScanError {
        path: PathBuf::new(),
        source: std::io::Error::other(e),
    })??;
    svc.warned.report(&s.skipped, full);
    Ok(s)
}

async fn scan_full(svc: &Service, root: PathBuf) -> Result<repo::Scan, repo::ScanError> {
    scan_scope(svc, root, &Scope::All).await
}

async fn scan(svc: &Service, root: PathBuf, scope: &Scope) -> Option<Snapshot> {
    match scan_scope(svc, root, scope).await {
        Ok(s) => Some(s.models),
        Err(e) => {
            tracing::warn!(error = %e, "repository scan failed");
            None
        }
    }
}

fn quiet_for(m: &RepoModel, d: Duration) -> bool {
    m.quiet_for(d)
}

/// Scans once and applies everything (startup: files already present count as stable).
pub async fn initial(svc: &Arc<Service>, root: PathBuf) -> Result<usize, repo::ScanError> {
    let s = scan_full(svc, root).await?.models;
    let (changed, removed) = svc.diff_all(&s);
    Ok(svc.apply(changed, removed).await)
}

/// A `rescan` request: scans now, takes in every model whose files have settled (unchanged
/// for a debounce: quiet already, or the same in a second scan one debounce later, as the
/// watcher does) and drops models gone in both scans; reports every model of the last scan
/// with whether the daemon now serves exactly its files, and every skipped entry.
pub async fn rescan(
    svc: &Arc<Service>,
    root: PathBuf,
) -> Result<trtcache_client::protocol::RescanReport, repo::ScanError> {
    use trtcache_client::protocol::{FoundModel, RescanReport, SkippedEntry};
    let debounce = Duration::from_millis(svc.cfg.limits.debounce_ms);
    // One at a time: concurrent rescans would only scan the same folder twice.
    let _one = svc.rescanning.lock().await;
    let first = scan_full(svc, root.clone()).await?;
    let (changed, removed) = svc.diff_all(&first.models);
    let (settled, changed): (Vec<RepoModel>, Vec<RepoModel>) =
        changed.into_iter().partition(|m| quiet_for(m, debounce));
    if !settled.is_empty() {
        svc.apply(settled, Vec::new()).await;
    }
    let last = if changed.is_empty() && removed.is_empty() {
        first
    } else {
        tokio::time::sleep(debounce).await;
        let second = scan_full(svc, root.clone()).await?;
        let stable: Vec<RepoModel> = changed
            .into_iter()
            .filter(|m| second.models.get(&m.name) == Some(m))
            .collect();
        let gone: Vec<String> = removed
            .into_iter()
            .filter(|n| !second.models.contains_key(n))
            .collect();
        if !stable.is_empty() || !gone.is_empty() {
            svc.apply(stable, gone).await;
        }
        second
    };
    let served = svc.fingerprints_of(&last.models.keys().cloned().collect());
    Ok(RescanReport {
        root: root.display().to_string(),
        settle_ms: svc.cfg.limits.debounce_ms,
        models: last
            .models
            .values()
            .map(|m| FoundModel {
                name: m.name.clone(),
                files: m.fingerprint.len() as u64,
                bytes: m.bytes(),
                settled: served.get(&m.name) == Some(m),
            })
            .collect(),
        skipped: last
            .skipped
            .iter()
            .map(|s| SkippedEntry {
                path: s.path.display().to_string(),
                reason: s.reason.clone(),
            })
            .collect(),
    })
}

/// Starts the notify watcher and runs the debounce/stability loop until shutdown. Events
/// name paths; once they have been quiet for the debounce, only the models those paths may
/// belong to are scanned ([`names_for`]), so one changed model costs the same in a
/// repository of ten models or of a hundred thousand. The periodic rescan (and an event
/// queue that overflowed, or more than `limits.watch_max_paths` paths in one debounce)
/// scans everything.
pub async fn run(svc: Arc<Service>, root: PathBuf, mut shutdown: watch::Receiver<bool>) {
    let debounce = Duration::from_millis(svc.cfg.limits.debounce_ms);
    let rescan = match svc.cfg.limits.rescan_secs {
        0 => Duration::from_secs(u64::MAX / 4),
        s => Duration::from_secs(s),
    };
    let pending = Arc::new(Mutex::new(Pending {
        scope: Scope::None,
        paths: BTreeSet::new(),
        limit: svc.cfg.limits.watch_max_paths.max(1),
    }));
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let events_svc = svc.clone();
    let noted = pending.clone();
    let handler = move |ev: notify::Result<notify::Event>| {
        // Every event that may change a file, and every error (overflow included), means
        // "look again". Opening and reading a model (builds, key hashing, ONNX Runtime)
        // raises access events that change nothing; counting them restarted the debounce
        // for as long as anything read the repository (a stale plan retried every few ms
        // then kept the rescan from ever running).
        if let Ok(e) = &ev {
            if matches!(e.kind, notify::EventKind::Access(_)) {
                return;
            }
            // A changed file's model leaves the ready index now, not once the change settles.
            if let Some(idx) = events_svc.ready_index.get() {
                idx.touched(&e.paths);
            }
        }
        noted.lock().unwrap_or_else(|p| p.into_inner()).note(&ev);
        let _ = tx.send(());
    };
    // Never into linked folders: a link to `/usr` in the repository cost 15,000 inotify
    // watches. Folders linked from inside the repository are watched where they are; a
    // linked folder elsewhere is seen by the periodic rescan.
    let watcher = notify::RecommendedWatcher::new(
        handler,
        notify::Config::default().with_follow_symlinks(false),
    );
    let _watcher = match watcher {
        Ok(mut w) => match w.watch(&root, RecursiveMode::Recursive) {
            Ok(()) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, root = %root.display(), "cannot watch the repository; relying on periodic rescans");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot create a watcher; relying on periodic rescans");
            None
        }
    };
    let mut dirty = false;
    loop {
        let wait = if dirty { debounce } else { rescan };
        tokio::select! {
            _ = shutdown.changed() => return,
            ev = rx.recv() => {
                if ev.is_none() { return; }
                dirty = true;
                // Drain a burst; the timer restarts on the next loop turn (debounce).
                while rx.try_recv().is_ok() {}
                continue;
            }
            _ = tokio::time::sleep(wait) => {}
        }
        // Quiet for a debounce after events: what they named; else the periodic rescan.
        let scope = if dirty {
            scope_of(&svc, &root, &pending)
        } else {
            Scope::All
        };
        dirty = false;
        if matches!(scope, Scope::None) {
            continue;
        }
        let Some(first) = scan(&svc, root.clone(), &scope).await else {
            pending.lock().unwrap_or_else(|p| p.into_inner()).scope = Scope::All;
            dirty = true;
            continue;
        };
        let (changed, removed) = diff(&svc, &scope, &first);
        // Files untouched for a whole debounce (e.g. a `mv` of an old file) are stable now;
        // the rest must look the same in a second scan.
        let (settled, changed): (Vec<RepoModel>, Vec<RepoModel>) =
            changed.into_iter().partition(|m| quiet_for(m, debounce));
        if !settled.is_empty() {
            svc.apply(settled, Vec::new()).await;
        }
        if changed.is_empty() && removed.is_empty() {
            continue;
        }
        // Stability: the same fingerprints one debounce later, looking again at those models
        // only.
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(debounce) => {}
        }
        let again = Scope::Names(
            changed
                .iter()
                .map(|m| m.name.clone())
                .chain(removed.iter().cloned())
                .collect(),
        );
        let Some(second) = scan(&svc, root.clone(), &again).await else {
            pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .scope
                .add(again.names());
            dirty = true;
            continue;
        };
        let (stable, moving): (Vec<RepoModel>, Vec<RepoModel>) = changed
            .into_iter()
            .partition(|m| second.get(&m.name) == Some(m));
        let (gone, back): (Vec<String>, Vec<String>) =
            removed.into_iter().partition(|n| !second.contains_key(n));
        // Still moving (or back again): looked at after the next debounce.
        if !moving.is_empty() || !back.is_empty() {
            let names = moving.into_iter().map(|m| m.name).chain(back);
            pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .scope
                .add(names);
            dirty = true;
        }
        if !stable.is_empty() || !gone.is_empty() {
            svc.apply(stable, gone).await;
        }
    }
}
