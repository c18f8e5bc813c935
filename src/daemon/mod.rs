//! Stage 10, serving: a tokio daemon that watches the model repository (`repo`, `folder_watch`),
//! keeps every model's artifacts built through the [`build_cache::BuildCache`] with a single-flight
//! build queue (`queue`), and hands them to local processes over a Unix socket (`server`)
//! speaking [`trtcache_client::protocol`]. `service` holds the state between them; `systemd`
//! does readiness, watchdog and socket activation; `watch_stream` streams a model's artifact
//! changes to subscribed clients. Shutdown happens in one place, [`serve`]:
//! a watch channel that the accept loop, the watcher and the queue all observe.

pub(crate) mod build_cache;
pub(crate) mod cached;
mod conn;
mod dispatch;
mod failure;
pub(crate) mod folder_watch;
mod http;
pub mod metrics;
pub(crate) mod queue;
mod ready;
pub(crate) mod repo;
pub(crate) mod runtimes;
pub(crate) mod server;
pub(crate) mod service;
mod socket;
pub(crate) mod systemd;
mod watch_stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use build_cache::{BuildCache, BuildCacheError};
pub use conn::parse as parse_request;

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("model repository {}", path.display())]
    Models {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Scan(#[from] repo::ScanError),
    #[error("opening the cache")]
    BuildCache(#[from] BuildCacheError),
    #[error(transparent)]
    Socket(#[from] socket::SocketError),
    #[error("metrics listener {addr} (metrics_listen)")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Runtime(std::io::Error),
}

/// The build+cache stage the daemon (and `trtcache warm`/`status` without a daemon) runs
/// with: [`cached::DiskBuildCache`] over the cache directory.
pub fn open_build_cache(cfg: &Config) -> Result<Arc<dyn BuildCache>, BuildCacheError> {
    Ok(Arc::new(cached::open(cfg)?))
}

/// The socket file this daemon bound (none when systemd passed the listener): removed, if it
/// is still ours, when this goes out of scope: on every way out of `serve`, a failed start
/// included, so no dead socket is left for clients to find and a successor's is never taken.
struct RemoveAtExit(Option<socket::Owned>);

impl Drop for RemoveAtExit {
    fn drop(&mut self) {
        if let Some(o) = &self.0 {
            o.remove();
        }
    }
}

/// `trtcache warm` when no daemon runs: the daemon's own service (the same planning, queue,
/// single flight, builds in workers, timeouts and results as a `build` request on the
/// socket), run in this process on the configured repository and cache, without the socket,
/// the watcher or background builds. `progress` sees every progress event.
pub fn warm_in_process(
    cfg: &Config,
    req: &trtcache_client::protocol::BuildRequest,
    progress: &mut dyn FnMut(&trtcache_client::protocol::Progress),
) -> Result<Vec<trtcache_client::protocol::BuildResult>, WarmError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| WarmError::Failed(format!("starting the runtime: {e}")))?;
    let grace = Duration::from_secs(cfg.limits.shutdown_grace_secs);
    let out = rt.block_on(async {
        let root = repo::canonical_root(&cfg.models)
            .map_err(|e| WarmError::Failed(format!("{}: {e}", cfg.models.display())))?;
        let c2 = cfg.clone();
        let cache = tokio::task::spawn_blocking(move || open_build_cache(&c2))
            .await
            .map_err(|e| WarmError::Failed(e.to_string()))?
            .map_err(WarmError::BuildCache)?;
        let svc = service::Service::new(
            Config {
                models: root.clone(),
                ..cfg.clone()
            },
            cache,
        );
        tokio::spawn(svc.queue.clone().run());
        let r = root.clone();
        let follow = cfg.follow_symlinks_outside_repo;
        let snapshot = tokio::task::spawn_blocking(move || repo::scan_with(&r, follow))
            .await
            .map_err(|e| WarmError::Failed(e.to_string()))?
            .map_err(|e| WarmError::Failed(e.to_string()))?;
        svc.register(snapshot.into_values().collect(), Vec::new())
            .await;
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let s2 = svc.clone();
        let req = req.clone();
        let task = tokio::spawn(async move { s2.build(&req, tx).await });
        while let Some(p) = rx.recv().await {
            progress(&p);
        }
        let results = task
            .await
            .map_err(|e| WarmError::Failed(e.to_string()))?
            .map_err(|(code, m)| WarmError::Request { code, message: m })?;
        svc.queue.close(grace).await;
        let e = svc.build_cache.clone();
        if let Ok(Err(err)) = tokio::task::spawn_blocking(move || e.flush()).await {
            tracing::warn!(error = %err, "flushing the cache failed");
        }
        Ok(results)
    });
    rt.shutdown_timeout(grace);
    out
}

/// Why an in-process warm could not run (a model's failure is a result, not this).
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("opening the cache: {0}")]
    BuildCache(#[source] BuildCacheError),
    #[error("{code}: {message}")]
    Request {
        code: trtcache_client::protocol::ErrorCode,
        message: String,
    },
    #[error("{0}")]
    Failed(String),
}

/// Runs the daemon until SIGTERM, SIGINT, SIGHUP (see [`signals`]) or an admin `shutdown`;
/// returns once builds are cancelled (within the grace period), the store is flushed and the
/// socket removed (when it is still this daemon's).
pub fn serve(cfg: Config, reload: Reload) -> Result<Ending, ServeError> {
    server::raise_nofile(cfg.limits.max_connections);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.limits.io_threads)
        .enable_all()
        .thread_name("trtcache")
        .build()
        .map_err(ServeError::Runtime)?;
    let grace = Duration::from_secs(cfg.limits.shutdown_grace_secs);
    let r = rt.block_on(serve_async(cfg, reload));
    // Dropping a runtime waits for blocking tasks without limit; a build that ignores its
    // cancellation must not hold the exit (its temp folder is removed at the next start).
    rt.shutdown_timeout(grace);
    r
}

async fn serve_async(mut cfg: Config, reload: Reload) -> Result<Ending, ServeError> {
    let root = repo::canonical_root(&cfg.models).map_err(|source| ServeError::Models {
        path: cfg.models.clone(),
        source,
    })?;
    cfg.models = root.clone();
    let c2 = cfg.clone();
    let cache = tokio::task::spawn_blocking(move || open_build_cache(&c2))
        .await
        .map_err(|e| ServeError::Runtime(std::io::Error::other(e)))??;
    let (std_listener, remove_at_exit) = match systemd::listener().map_err(ServeError::Runtime)? {
        Some(l) => (l, RemoveAtExit(None)),
        None => {
            let (l, id) = socket::bind(&cfg)?;
            (l, RemoveAtExit(Some(socket::Owned::new(&cfg.socket, id))))
        }
    };
    // The path clients reach: a socket systemd passed may be bound elsewhere than the config
    // says (the socket unit's ListenStream= is what counts).
    let socket_path = std_listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .unwrap_or_else(|| cfg.socket.clone());
    let listener = tokio::net::UnixListener::from_std(std_listener).map_err(ServeError::Runtime)?;
    let metrics_listener = match cfg.metrics_addr() {
        Ok(Some(addr)) => {
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "metrics_listen is not a loopback address: whoever reaches it reads model names and states");
            }
            Some(http::bind(addr).map_err(|source| ServeError::Metrics { addr, source })?)
        }
        // Validated when the configuration was loaded.
        _ => None,
    };
    let svc = service::Service::new(cfg.clone(), cache);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(svc.queue.clone().run());
    if cfg.ready_index {
        match ready::ReadyIndex::create(&socket_path) {
            Ok(idx) => {
                tracing::info!(dir = %idx.dir().display(), "ready index: consumers that can read it skip the socket");
                let _ = svc.ready_index.set(idx.clone());
                let recheck = match cfg.limits.ready_recheck_secs {
                    0 => None,
                    s => Some(Duration::from_secs(s)),
                };
                let s = svc.clone();
                let wanted = move |full| {
                    s.catch_up_with_the_cache();
                    s.ready_pointers(full)
                };
                tokio::spawn(ready::publish(
                    idx.clone(),
                    wanted,
                    recheck,
                    stop_rx.clone(),
                ));
                let poll = Duration::from_millis(cfg.limits.ready_hits_poll_ms.max(1));
                let s = svc.clone();
                let hit = move |key| s.fast_hit(key);
                tokio::spawn(ready::count_opens(idx, hit, poll, stop_rx.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "no ready index; every acquire goes over the socket")
            }
        }
    } else {
        ready::retire(&socket_path);
    }
    let n = folder_watch::initial(&svc, root.clone()).await?;
    if let Some(l) = metrics_listener {
        let addr = l.local_addr().map_err(ServeError::Runtime)?;
        tracing::info!(%addr, "metrics listener: /metrics, /healthz, /readyz");
        tokio::spawn(http::run(svc.clone(), l, stop_rx.clone()));
    }
    tracing::info!(socket = %socket_path.display(), models = n, repository = %root.display(), cache = %cfg.cache_dir.display(), "ready");
    systemd::notify(&format!(
        "READY=1\nSTATUS=serving {n} models\nMAINPID={}",
        std::process::id()
    ));
    tokio::spawn(folder_watch::run(svc.clone(), root, stop_rx.clone()));
    tokio::spawn(heartbeat(svc.clone(), stop_rx.clone()));
    let ending = Arc::new(std::sync::Mutex::new(None::<Ending>));
    tokio::spawn(signals(stop_tx.clone(), reload, ending.clone()));
    let (rebound_tx, rebound_rx) = tokio::sync::mpsc::channel(1);
    let fatal = Arc::new(std::sync::Mutex::new(None));
    if let (Some(owned), s @ 1..) = (&remove_at_exit.0, cfg.limits.socket_check_secs) {
        tokio::spawn(socket::watch(
            cfg.clone(),
            owned.clone(),
            Duration::from_secs(s),
            rebound_tx,
            stop_tx.clone(),
            fatal.clone(),
        ));
    }
    // On a worker, not on this (block_on) thread: a connection's task then starts on the
    // thread that accepted it instead of waking another (a cold consumer's first answer
    // came ~0.3 ms later through the extra hand-off; BENCHMARKS.md, time to first inference).
    let accepting = tokio::spawn(server::accept_loop(
        svc.clone(),
        listener,
        rebound_rx,
        stop_rx,
        stop_tx,
    ));
    if let Err(e) = accepting.await {
        tracing::error!(error = %e, "the accept loop failed");
    }

    systemd::notify("STOPPING=1\nSTATUS=stopping: cancelling builds");
    tracing::info!("shutting down");
    if let Some(idx) = svc.ready_index.get() {
        idx.clear();
    }
    drop(remove_at_exit);
    svc.queue
        .close(Duration::from_secs(cfg.limits.shutdown_grace_secs))
        .await;
    let e = svc.build_cache.clone();
    match tokio::task::spawn_blocking(move || e.flush()).await {
        Ok(Err(err)) => tracing::warn!(error = %err, "flushing the cache failed"),
        Err(err) => tracing::warn!(error = %err, "flush task failed"),
        Ok(Ok(())) => {}
    }
    tracing::info!("stopped");
    if let Some(why) = fatal.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(socket::socket_err(&cfg.socket, why).into());
    }
    let ending = *ending.lock().unwrap_or_else(|p| p.into_inner());
    Ok(ending.unwrap_or(Ending::Stopped))
}

/// STATUS= with the queue depth every few seconds, and WATCHDOG=1 when systemd asks.
async fn heartbeat(svc: Arc<service::Service>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let wd = systemd::watchdog_interval();
    let every = wd
        .unwrap_or(Duration::from_secs(5))
        .min(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let s = svc.stats();
        let mut msg = format!(
            "STATUS={} models, {} queued, {} building, {} connections",
            s.models, s.queue_depth, s.building, s.connections
        );
        if wd.is_some() {
            msg.push_str("\nWATCHDOG=1");
        }
        systemd::notify(&msg);
    }
}

/// How the daemon ended (when it ended without an error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// SIGTERM, SIGINT or an admin `shutdown`.
    Stopped,
    /// SIGHUP with a configuration that loads: stopped cleanly to be started again with it
    /// (`trtcache serve` exits with [`RESTART_EXIT_CODE`]; the systemd unit restarts on it).
    Restart,
}

/// `trtcache serve`'s exit status after a SIGHUP: "restart me with the new configuration"
/// (the unit's `RestartForceExitStatus=`). EX_TEMPFAIL of sysexits.h.
pub const RESTART_EXIT_CODE: u8 = 75;

/// SIGTERM/SIGINT stop the daemon. SIGHUP first loads the configuration again with `reload`:
/// when it does not load (a typo in the file), the error is logged and the daemon keeps
/// serving with what it has; when it loads, the daemon stops as cleanly as for SIGTERM and
/// asks to be restarted ([`Ending::Restart`]). Nothing is reloaded in place: the cache, the
/// socket, the repository and the limits are bound into every task at start, and a clean
/// restart applies all of them the same way.
async fn signals(
    stop: tokio::sync::watch::Sender<bool>,
    reload: Reload,
    ending: Arc<std::sync::Mutex<Option<Ending>>>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::warn!("cannot install signal handlers");
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
            _ = hup.recv() => {
                match reload() {
                    Ok(()) => {
                        tracing::info!("SIGHUP: the configuration loads; stopping to restart with it");
                        *ending.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ending::Restart);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "SIGHUP: the configuration does not load; still serving with the one loaded at start");
                        continue;
                    }
                }
            }
        }
        break;
    }
    let _ = stop.send(true);
}

/// Loads the configuration again (what `serve` started from: the file, then the flags);
/// `Err(why)` when it does not load.
pub type Reload = Box<dyn Fn() -> Result<(), String> + Send + Sync>;
