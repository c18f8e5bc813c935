//! The repository watcher. notify events are only hints (a `mv` into the folder gives only a
//! rename event and events can be dropped), so every event just marks the repository dirty.
//! Once it has been quiet for the debounce, the whole repository is scanned; a model whose
//! fingerprint (size, mtime, ctime and mode of its files) differs from the served one is applied only when
//! a second scan one debounce later sees the same fingerprint, so `cp`, `mv`-into and
//! write-then-rename all settle before a build starts. A periodic full rescan covers dropped
//! events and overflow. A `rescan` request runs the same two-scan settling once, at once
//! ([`rescan`]), so `trtcache warm` sees models a deploy has just copied in.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use super::repo::{self, RepoModel, Snapshot};
use super::service::Service;

/// Models whose fingerprint differs between `served` and `scan`, and names gone from `scan`.
fn diff(served: &Snapshot, scan: &Snapshot) -> (Vec<RepoModel>, Vec<String>) {
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

/// Skipped entries already warned about, so that a rescan every few seconds does not repeat
/// the same warning: each is logged when it first appears (again after it went away).
#[derive(Default)]
pub struct Warned(std::sync::Mutex<std::collections::BTreeSet<repo::Skipped>>);

impl Warned {
    fn report(&self, skipped: &[repo::Skipped]) {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for s in skipped.iter().filter(|s| !seen.contains(*s)) {
            // `?`: the path quoted and escaped, so no control character in a file name reaches
            // the log (or a terminal following it) raw.
            tracing::warn!(path = ?s.path, "skipped: {}", s.reason);
        }
        *seen = skipped.iter().cloned().collect();
    }
}

/// One full scan on the blocking pool; its skipped entries are warned about once.
async fn scan_full(svc: &Service, root: PathBuf) -> Result<repo::Scan, repo::ScanError> {
    let follow = svc.cfg.follow_symlinks_outside_repo;
    let s = tokio::task::spawn_blocking(move || repo::scan_all_with(&root, follow))
        .await
        .map_err(|e| repo::ScanError {
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })??;
    svc.warned.report(&s.skipped);
    Ok(s)
}

async fn scan(svc: &Service, root: PathBuf) -> Option<Snapshot> {
    match scan_full(svc, root).await {
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
    let (changed, removed) = diff(&svc.fingerprints(), &s);
    Ok(svc.apply(changed, removed))
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
    let (changed, removed) = diff(&svc.fingerprints(), &first.models);
    let (settled, changed): (Vec<RepoModel>, Vec<RepoModel>) =
        changed.into_iter().partition(|m| quiet_for(m, debounce));
    if !settled.is_empty() {
        svc.apply(settled, Vec::new());
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
            svc.apply(stable, gone);
        }
        second
    };
    let served = svc.fingerprints();
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

/// Starts the notify watcher and runs the debounce/stability loop until shutdown.
pub async fn run(svc: Arc<Service>, root: PathBuf, mut shutdown: watch::Receiver<bool>) {
    let debounce = Duration::from_millis(svc.cfg.limits.debounce_ms);
    let rescan = match svc.cfg.limits.rescan_secs {
        0 => Duration::from_secs(u64::MAX / 4),
        s => Duration::from_secs(s),
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let events_svc = svc.clone();
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
        let Some(first) = scan(&svc, root.clone()).await else {
            continue;
        };
        let (changed, removed) = diff(&svc.fingerprints(), &first);
        if changed.is_empty() && removed.is_empty() {
            dirty = false;
            continue;
        }
        // Files untouched for a whole debounce (e.g. a `mv` of an old file) are stable now;
        // the rest must look the same in a second scan.
        let (settled, changed): (Vec<RepoModel>, Vec<RepoModel>) =
            changed.into_iter().partition(|m| quiet_for(m, debounce));
        if !settled.is_empty() {
            svc.apply(settled, Vec::new());
        }
        if changed.is_empty() && removed.is_empty() {
            dirty = false;
            continue;
        }
        // Stability: the same fingerprints one debounce later.
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(debounce) => {}
        }
        let Some(second) = scan(&svc, root.clone()).await else {
            continue;
        };
        let stable: Vec<RepoModel> = changed
            .into_iter()
            .filter(|m| second.get(&m.name) == Some(m))
            .collect();
        let gone: Vec<String> = removed
            .into_iter()
            .filter(|n| !second.contains_key(n))
            .collect();
        let (still_changed, still_removed) = diff(&svc.fingerprints(), &second);
        dirty = still_changed.len() + still_removed.len() > stable.len() + gone.len();
        if !stable.is_empty() || !gone.is_empty() {
            svc.apply(stable, gone);
        }
    }
}
