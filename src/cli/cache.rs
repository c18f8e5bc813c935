//! The cache maintenance commands: `trtcache ls`, `rm KEY`, `gc [--max-size SIZE]
//! [--dry-run]`, `verify [--repair]`; each with `--json`. Also the shared `--cache-dir` argument.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use super::output::{human_bytes, table, Style};
use crate::cache::{parse_size, Record, SledStore, Store, StoreOptions};
use crate::key::CacheKey;

/// Where the cache lives; every command that touches the cache flattens this, so all of
/// them resolve the same directory ([`crate::config::default_cache_dir`]).
#[derive(Debug, Clone, Args)]
pub struct CacheArgs {
    /// Cache directory (default: TRTCACHE_CACHE_DIR, else the checkout's cache/ when run from
    /// a checkout, else $XDG_CACHE_HOME/trtcache, else ~/.cache/trtcache).
    #[arg(long, value_name = "DIR", env = "TRTCACHE_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
}

impl CacheArgs {
    pub fn dir(&self) -> PathBuf {
        self.cache_dir
            .clone()
            .unwrap_or_else(crate::config::default_cache_dir)
    }
}

/// Opens the store, reporting on stderr what the open cleaned up.
pub fn open_store(a: &CacheArgs, max_bytes: Option<u64>) -> anyhow::Result<(SledStore, PathBuf)> {
    let dir = a.dir();
    let store = SledStore::open(&dir, StoreOptions { max_bytes })
        .with_context(|| format!("opening cache {}", dir.display()))?;
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
    Ok((store, dir))
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Print the records as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// The key (64 hex digits, or a unique prefix of at least 8).
    pub key: String,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Evict least-recently-used artifacts until the cache holds at most SIZE (e.g. 10G,
    /// 512M); quarantined entries are always removed.
    #[arg(long, value_name = "SIZE", default_value = "10G")]
    pub max_size: String,
    /// Show what would be evicted without deleting anything.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub cache: CacheArgs,
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
touched. Stop the daemon first: it owns the cache while it runs."
)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub cache: CacheArgs,
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

pub fn ls(a: LsArgs) -> anyhow::Result<ExitCode> {
    let (store, dir) = open_store(&a.cache, None)?;
    let records = store.list().context("listing the cache")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(ExitCode::SUCCESS);
    }
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

/// Resolves a full key or a unique prefix.
fn resolve(store: &SledStore, s: &str) -> anyhow::Result<CacheKey> {
    if let Ok(k) = CacheKey::parse(s) {
        return Ok(k);
    }
    let p = s.to_ascii_lowercase();
    if p.len() < 8 || !p.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("`{s}` is not a cache key (64 hex digits, or a unique prefix of at least 8)");
    }
    let hits: Vec<Record> = store
        .list()?
        .into_iter()
        .filter(|r| r.key.hex().starts_with(&p))
        .collect();
    match hits.as_slice() {
        [one] => Ok(one.key),
        [] => bail!("no cache entry with key {s}"),
        _ => bail!("key prefix {s} is ambiguous ({} entries)", hits.len()),
    }
}

pub fn rm(a: RmArgs) -> anyhow::Result<ExitCode> {
    let (store, _) = open_store(&a.cache, None)?;
    let key = resolve(&store, &a.key)?;
    let removed = store
        .remove(&key)
        .with_context(|| format!("removing {key}"))?;
    if !removed {
        bail!("no cache entry with key {key}");
    }
    if a.json {
        println!("{}", serde_json::json!({ "removed": key.hex() }));
    } else {
        println!("removed {key}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn gc(a: GcArgs) -> anyhow::Result<ExitCode> {
    let max = parse_size(&a.max_size).with_context(|| {
        format!(
            "--max-size: `{}` is not a size (e.g. 512M, 10G)",
            a.max_size
        )
    })?;
    let (store, _) = open_store(&a.cache, None)?;
    let rep = store
        .gc(max, a.dry_run)
        .context("garbage-collecting the cache")?;
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
    report: &'a crate::cache::VerifyReport,
    passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    repair: Option<&'a crate::cache::RepairReport>,
}

pub fn verify(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let (store, dir, repair) = if a.repair {
        let dir = a.cache.dir();
        let (store, rep) = SledStore::repair(&dir, StoreOptions::default())
            .with_context(|| format!("repairing cache {}", dir.display()))?;
        (store, dir, Some(rep))
    } else {
        let (store, dir) = open_store(&a.cache, None)?;
        (store, dir, None)
    };
    let rep = store.verify().context("verifying the cache")?;
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
