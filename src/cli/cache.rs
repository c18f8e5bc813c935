//! The cache maintenance commands: `trtcache ls`, `rm KEY`, `gc [--max-size SIZE]
//! [--dry-run]`, `verify [--repair]`; each with `--json`. Also the shared `--cache-dir`
//! argument and the one rule for a cache directory that does not exist.
//!
//! While a daemon serves the cache it holds the cache's lock; these commands then go through
//! its socket (the `cache_*` requests, docs/protocol.md), which applies them to its open store
//! and to its memory. Otherwise they open the cache directly.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use trtcache_client::protocol::{CacheGcReport, CacheVerifyReport};
use trtcache_client::Client;

use super::output::{human_bytes, table, Style};
use crate::cache::{parse_size, Record, SledStore, Store, StoreError, StoreOptions};

/// Where the cache lives; every command that touches the cache flattens this, so all of
/// them resolve the same directory ([`crate::config::default_cache_dir`]).
#[derive(Debug, Clone, Args)]
pub struct CacheArgs {
    /// Cache directory (default: the config file's cache_dir where the command reads one,
    /// else TRTCACHE_CACHE_DIR, else /var/cache/trtcache under systemd, else the cache/ of the
    /// checkout the executable was built in (never one above the working directory), else
    /// $XDG_CACHE_HOME/trtcache, else ~/.cache/trtcache). It must be a trtcache cache
    /// (CACHEDIR.TAG) or a new or empty folder.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

impl CacheArgs {
    pub fn dir(&self) -> PathBuf {
        self.cache_dir
            .clone()
            .unwrap_or_else(crate::config::default_cache_dir)
    }
}

/// A cache directory that does not exist: commands that read the cache refuse it (a typo in
/// `--cache-dir` must not look like an empty cache).
#[derive(Debug, thiserror::Error)]
#[error("cache directory {} does not exist (a typo in --cache-dir?); `trtcache serve` or `trtcache build` creates it", .0.display())]
pub struct NoSuchCache(pub PathBuf);

/// A cache directory that does not exist and whose parent does not either: commands that
/// write the cache create the directory itself, never a chain of folders from a typo.
#[derive(Debug, thiserror::Error)]
#[error("cache directory {}: its parent folder does not exist (a typo in --cache-dir?); create the parent first", .0.display())]
pub struct NoCacheParent(pub PathBuf);

/// For commands that read the cache: the directory must exist.
pub fn require_cache(dir: &Path) -> Result<(), NoSuchCache> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(NoSuchCache(dir.to_path_buf()))
    }
}

/// For commands that write the cache (`serve`, `build`, `pull`, `warm`): the directory may
/// be created, but only inside a folder that exists.
pub fn creatable_cache(dir: &Path) -> Result<(), NoCacheParent> {
    let parent = match dir.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return Ok(()),
    };
    if dir.is_dir() || parent.is_dir() {
        Ok(())
    } else {
        Err(NoCacheParent(dir.to_path_buf()))
    }
}

/// Opens the store for a command that writes it (creating the directory inside an existing
/// parent), reporting on stderr what the open cleaned up.
pub fn open_store(a: &CacheArgs, max_bytes: Option<u64>) -> anyhow::Result<(SledStore, PathBuf)> {
    let dir = a.dir();
    creatable_cache(&dir)?;
    open_at(&dir, max_bytes)
}

/// Opens an existing cache for a command that only reads it (`export`): nothing in the
/// folder is created, cleaned or rewritten, and a folder that is not a cache is refused.
pub fn open_store_read_only(a: &CacheArgs) -> anyhow::Result<(SledStore, PathBuf)> {
    let dir = a.dir();
    require_cache(&dir)?;
    let store = SledStore::open_read_only(&dir)
        .with_context(|| format!("opening cache {}", dir.display()))?;
    Ok((store, dir))
}

fn open_at(dir: &Path, max_bytes: Option<u64>) -> anyhow::Result<(SledStore, PathBuf)> {
    let store = SledStore::open(dir, StoreOptions { max_bytes })
        .with_context(|| format!("opening cache {}", dir.display()))?;
    report_cleaning(&store, dir);
    Ok((store, dir.to_path_buf()))
}

fn report_cleaning(store: &SledStore, dir: &Path) {
    let r = store.open_report();
    if r.temp_removed + r.records_dropped.len() + r.orphans_removed.len() > 0 {
        eprintln!(
            "trtcache: cleaned {}: {} temp leftovers, {} records without files, {} orphan blobs",
            dir.display(),
            r.temp_removed,
            r.records_dropped.len(),
            r.orphans_removed.len()
        );
    }
}

/// The cache of a maintenance command, and how to reach the daemon that may own it.
#[derive(Debug, Clone, Args)]
pub struct MaintainArgs {
    #[command(flatten)]
    pub cache: CacheArgs,
    /// The daemon's socket, used when a daemon holds the cache [default: the config's
    /// socket, else TRTCACHE_SOCKET, else CACHE_DIR/trtcache.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// TOML config file (its cache_dir and socket) [default: /etc/trtcache/config.toml when
    /// present].
    #[arg(long, value_name = "FILE", env = "TRTCACHE_CONFIG")]
    pub config: Option<PathBuf>,
}

impl MaintainArgs {
    /// The cache directory and the sockets a daemon owning it may answer on, most likely
    /// first.
    fn resolve(&self) -> anyhow::Result<(PathBuf, Vec<PathBuf>)> {
        let cfg = self.config()?;
        let mut sockets = vec![cfg.socket.clone()];
        if self.socket.is_none() {
            let own = cfg.cache_dir.join("trtcache.sock");
            if own != cfg.socket {
                sockets.push(own);
            }
        }
        Ok((cfg.cache_dir, sockets))
    }

    /// The effective configuration (file, then these flags).
    fn config(&self) -> anyhow::Result<crate::config::Config> {
        crate::config::Config::load(&crate::config::Overrides {
            config: self.config.clone(),
            models: None,
            cache_dir: self.cache.cache_dir.clone(),
            socket: self.socket.clone(),
            ..Default::default()
        })
        .context("reading the configuration")
    }
}

/// The cache as a command reaches it: opened here, or through the daemon that holds it.
pub enum Target {
    Local(Box<SledStore>, PathBuf),
    Daemon {
        client: Box<Client>,
        dir: PathBuf,
        socket: PathBuf,
    },
}

/// How a maintenance command uses the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `ls`: nothing in the folder is created, cleaned or rewritten.
    Read,
    /// `rm`, `gc`, `verify`: the store's usual open, which cleans what a crash left (only
    /// names the store creates, in a folder tagged as a cache).
    Write,
}

/// Opens the cache directly when it is free; when a daemon holds it, connects to that
/// daemon instead. The directory must exist, and be a cache.
pub fn open_target(a: &MaintainArgs, access: Access) -> anyhow::Result<Target> {
    let (dir, sockets) = a.resolve()?;
    require_cache(&dir)?;
    let opened = match access {
        Access::Read => SledStore::open_read_only(&dir),
        Access::Write => SledStore::open(&dir, StoreOptions::default()),
    };
    match opened {
        Ok(store) => {
            report_cleaning(&store, &dir);
            Ok(Target::Local(Box::new(store), dir))
        }
        Err(e @ StoreError::InUse { .. }) => {
            for s in &sockets {
                if let Ok(client) = Client::connect(s) {
                    return Ok(Target::Daemon {
                        client: Box::new(client),
                        dir,
                        socket: s.clone(),
                    });
                }
            }
            let tried: Vec<String> = sockets.iter().map(|s| s.display().to_string()).collect();
            Err(anyhow::Error::new(e).context(format!(
                "no daemon answers at {} to do it for the lock's holder (--socket names the daemon's socket)",
                tried.join(" or ")
            )))
        }
        Err(e) => {
            Err(anyhow::Error::new(e)).with_context(|| format!("opening cache {}", dir.display()))
        }
    }
}

/// The daemon's answer is about the cache this command names (a socket of another daemon
/// would silently report on another cache).
fn same_cache(mine: &Path, theirs: &str, socket: &Path) -> anyhow::Result<()> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    anyhow::ensure!(
        canon(mine) == canon(Path::new(theirs)),
        "the daemon at {} serves the cache {theirs}, not {}",
        socket.display(),
        mine.display()
    );
    Ok(())
}

fn daemon_err(e: trtcache_client::ClientError, socket: &Path) -> anyhow::Error {
    anyhow::Error::new(e).context(format!("through the daemon at {}", socket.display()))
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub target: MaintainArgs,
    /// Print the records as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// The key (64 hex digits, or a unique prefix of at least 8).
    pub key: String,
    #[command(flatten)]
    pub target: MaintainArgs,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Evict least-recently-used artifacts until the cache holds at most SIZE (e.g. 10G,
    /// 512M); quarantined entries are always removed [default: the daemon's limit, the
    /// config's limits.cache_size_bytes (50 GiB unless set)].
    #[arg(long, value_name = "SIZE")]
    pub max_size: Option<String>,
    /// Show what would be evicted without deleting anything.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub target: MaintainArgs,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "A damaged index (other commands stop with `cache index DIR/db is damaged`): \
`trtcache verify --repair` moves it aside to DIR/db.corrupt-<unix time> (kept; delete it once \
satisfied), rebuilds the index from DIR/records/<key>.json and the blobs whose files re-hash \
clean, lists entries it could not recover (their models are rebuilt on the next request), and \
moves blob directories nothing names to DIR/quarantine/. The model repository is never \
touched. --repair needs the daemon stopped (it rebuilds the index the daemon has open); a \
plain verify runs through a running daemon."
)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub target: MaintainArgs,
    /// If the cache index is damaged, move it aside and rebuild it from the stored record
    /// manifests and artifacts; then verify as usual.
    #[arg(long)]
    pub repair: bool,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

fn ago(t: u64) -> String {
    let now = crate::cache::now_secs();
    let d = now.saturating_sub(t);
    match d {
        0..60 => format!("{d}s ago"),
        60..3600 => format!("{}m ago", d / 60),
        3600..86400 => format!("{}h ago", d / 3600),
        _ => format!("{}d ago", d / 86400),
    }
}

fn short_model(p: &str) -> String {
    let name = Path::new(p)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.to_string());
    super::output::printable(&name)
}

fn via(cmd: &str, socket: &Path) {
    eprintln!(
        "{cmd}: the daemon at {} holds the cache; asking it",
        socket.display()
    );
}

pub fn ls(a: LsArgs) -> anyhow::Result<ExitCode> {
    let (records, dir) = match open_target(&a.target, Access::Read)? {
        Target::Local(store, dir) => {
            let records = store.list().context("listing the cache")?;
            let values = records
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<Vec<_>, _>>()?;
            (values, dir)
        }
        Target::Daemon {
            mut client,
            dir,
            socket,
        } => {
            via("ls", &socket);
            let (theirs, records) = client.cache_list().map_err(|e| daemon_err(e, &socket))?;
            same_cache(&dir, &theirs, &socket)?;
            (records, dir)
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(ExitCode::SUCCESS);
    }
    let records: Vec<Record> = records
        .into_iter()
        .map(serde_json::from_value)
        .collect::<Result<_, _>>()
        .context("reading the daemon's records")?;
    let st = Style::stdout();
    if records.is_empty() {
        println!("cache {} is empty", dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = vec![[
        "KEY", "STATE", "BACKEND", "SIZE", "HITS", "USED", "BUILD", "MODEL",
    ]
    .map(|s| st.heading(s))
    .to_vec()];
    let mut total = 0;
    for r in &records {
        total += r.bytes();
        let state = match r.state() {
            "ready" => st.good("ready"),
            s => st.bad(s),
        };
        rows.push(vec![
            r.key.hex()[..16].to_string(),
            state,
            r.backend.to_string(),
            human_bytes(r.bytes()),
            r.hits.to_string(),
            ago(r.last_used),
            format!("{} ms", r.build_ms),
            short_model(&r.model_path),
        ]);
    }
    print!("{}", table("", &rows));
    println!(
        "{} entries, {} in {}",
        records.len(),
        human_bytes(total),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn rm(a: RmArgs) -> anyhow::Result<ExitCode> {
    let key = match open_target(&a.target, Access::Write)? {
        Target::Local(store, _) => {
            let key = crate::cache::resolve_key(&*store, &a.key)?;
            let removed = store
                .remove(&key)
                .with_context(|| format!("removing {key}"))?;
            if !removed {
                bail!("no cache entry with key {key}");
            }
            key.hex()
        }
        Target::Daemon {
            mut client,
            dir,
            socket,
        } => {
            via("rm", &socket);
            let (theirs, key) = client
                .cache_remove(&a.key)
                .map_err(|e| daemon_err(e, &socket))?;
            same_cache(&dir, &theirs, &socket)?;
            key
        }
    };
    if a.json {
        println!("{}", serde_json::json!({ "removed": key }));
    } else {
        println!("removed {key}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn gc(a: GcArgs) -> anyhow::Result<ExitCode> {
    let max = match &a.max_size {
        Some(s) => parse_size(s)
            .with_context(|| format!("--max-size: `{s}` is not a size (e.g. 512M, 10G)"))?,
        // The daemon's own limit, so `gc` without a size never evicts what the daemon keeps.
        None => a.target.config()?.limits.cache_size_bytes,
    };
    let rep = match open_target(&a.target, Access::Write)? {
        Target::Local(store, dir) => {
            let r = store
                .gc(max, a.dry_run)
                .context("garbage-collecting the cache")?;
            CacheGcReport {
                cache_dir: dir.display().to_string(),
                dry_run: r.dry_run,
                max_bytes: r.max_bytes,
                bytes_before: r.bytes_before,
                bytes_after: r.bytes_after,
                evicted: r.evicted,
            }
        }
        Target::Daemon {
            mut client,
            dir,
            socket,
        } => {
            via("gc", &socket);
            let r = client
                .cache_gc(max, a.dry_run)
                .map_err(|e| daemon_err(e, &socket))?;
            same_cache(&dir, &r.cache_dir, &socket)?;
            r
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        let verb = if a.dry_run { "would evict" } else { "evicted" };
        println!(
            "{verb} {} entries: {} -> {} (limit {})",
            rep.evicted.len(),
            human_bytes(rep.bytes_before),
            human_bytes(rep.bytes_after),
            human_bytes(rep.max_bytes)
        );
        for k in &rep.evicted {
            println!("  {k}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct VerifyOut<'a> {
    #[serde(flatten)]
    report: &'a CacheVerifyReport,
    passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    repair: Option<&'a crate::cache::RepairReport>,
}

fn local_verify(store: &SledStore, dir: &Path) -> anyhow::Result<CacheVerifyReport> {
    let r = store.verify().context("verifying the cache")?;
    Ok(CacheVerifyReport {
        cache_dir: dir.display().to_string(),
        checked: r.checked as u64,
        ok: r.ok as u64,
        quarantined: r.quarantined,
    })
}

pub fn verify(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let (rep, dir, repair) = if a.repair {
        let (dir, _) = a.target.resolve()?;
        require_cache(&dir)?;
        let (store, rep) = SledStore::repair(&dir, StoreOptions::default())
            .with_context(|| format!("repairing cache {}", dir.display()))?;
        (local_verify(&store, &dir)?, dir, Some(rep))
    } else {
        match open_target(&a.target, Access::Write)? {
            Target::Local(store, dir) => (local_verify(&store, &dir)?, dir, None),
            Target::Daemon {
                mut client,
                dir,
                socket,
            } => {
                via("verify", &socket);
                let r = client.cache_verify().map_err(|e| daemon_err(e, &socket))?;
                same_cache(&dir, &r.cache_dir, &socket)?;
                (r, dir, None)
            }
        }
    };
    let passed = rep.quarantined.is_empty();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&VerifyOut {
                report: &rep,
                passed,
                repair: repair.as_ref(),
            })?
        );
    } else {
        let st = Style::stdout();
        match &repair {
            Some(r) if r.damaged => {
                println!(
                    "repaired the index of {}: {}",
                    dir.display(),
                    r.reason.as_deref().unwrap_or("damaged")
                );
                if let Some(m) = &r.moved_to {
                    println!("  damaged index kept at {}", m.display());
                }
                println!(
                    "  {} records recovered, {} dropped, {} unreferenced blobs moved to quarantine/",
                    r.recovered.len(),
                    r.dropped.len(),
                    r.unreferenced_blobs.len()
                );
                for (k, why) in &r.dropped {
                    println!("  {} {k}: {why}", st.bad("dropped"));
                }
            }
            Some(_) => println!(
                "the index of {} is intact: nothing to repair",
                dir.display()
            ),
            None => {}
        }
        println!(
            "verified {} artifacts in {}: {} ok, {} quarantined",
            rep.checked,
            dir.display(),
            rep.ok,
            rep.quarantined.len()
        );
        for (k, why) in &rep.quarantined {
            println!("  {} {k}: {why}", st.bad("quarantined"));
        }
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
