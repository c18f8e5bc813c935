//! The repository watcher. notify events are only hints (a `mv` into the folder gives only a
//! rename event and events can be dropped), so every event just marks the repository dirty.
//! Once it has been quiet for the debounce, the whole repository is scanned; a model whose
//! fingerprint (size, mtime, ctime and mode of its files) differs from the served one is applied only when
//! a second scan one debounce later sees the same fingerprint, so `cp`, `mv`-into and
//! write-then-rename all settle before a build starts. A periodic full rescan covers dropped
//! events and overflow.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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

async fn scan(root: PathBuf, follow_outside: bool) -> Option<Snapshot> {
    match tokio::task::spawn_blocking(move || repo::scan_with(&root, follow_outside)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "repository scan failed");
            None
        }
        Err(_) => None,
    }
}

/// Whether every file of the model was last modified at least `d` ago.
fn quiet_for(m: &RepoModel, d: Duration) -> bool {
    let now = SystemTime::now();
    !m.fingerprint.is_empty()
        && m.fingerprint.iter().all(|f| {
            f.mtime
                .is_some_and(|t| now.duration_since(t).is_ok_and(|age| age >= d))
        })
}

/// Scans once and applies everything (startup: files already present count as stable).
pub async fn initial(svc: &Arc<Service>, root: PathBuf) -> std::io::Result<usize> {
    let r = root.clone();
    let follow = svc.cfg.follow_symlinks_outside_repo;
    let s = tokio::task::spawn_blocking(move || repo::scan_with(&r, follow))
        .await
        .map_err(std::io::Error::other)??;
    let (changed, removed) = diff(&svc.fingerprints(), &s);
    Ok(svc.apply(changed, removed))
}

/// Starts the notify watcher and runs the debounce/stability loop until shutdown.
pub async fn run(svc: Arc<Service>, root: PathBuf, mut shutdown: watch::Receiver<bool>) {
    let debounce = Duration::from_millis(svc.cfg.limits.debounce_ms);
    let rescan = match svc.cfg.limits.rescan_secs {
        0 => Duration::from_secs(u64::MAX / 4),
        s => Duration::from_secs(s),
    };
    let follow = svc.cfg.follow_symlinks_outside_repo;
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
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
        let Some(first) = scan(root.clone(), follow).await else {
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
        let Some(second) = scan(root.clone(), follow).await else {
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
