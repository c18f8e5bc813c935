//! The fleet tier's commands: `keygen PATH`, `push [KEY…|--all]`, `pull MODEL [build flags]`
//! and `remote gc --older-than AGE`. The tier itself is [`crate::remote`]; its settings are
//! the config file's `[remote]` section (docs/fleet.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde::Serialize;

use super::build::BuildArgs;
use super::cache::{open_store, CacheArgs};
use super::output::{human_bytes, table};
use crate::builder::{runtime, Builder};
use crate::cache::{Lookup, Store, DIGEST_MEMO};
use crate::config::{Config, Overrides};
use crate::key::CacheKey;
use crate::remote::{Mode, RemoteConfig, RemoteError, RemoteStats, RemoteTier, UploadJob};

/// Where the `[remote]` settings come from.
#[derive(Debug, Clone, Args)]
pub struct RemoteConfigArgs {
    /// TOML config file with a `[remote]` section [default: /etc/trtcache/config.toml].
    #[arg(long, env = "TRTCACHE_CONFIG")]
    pub config: Option<PathBuf>,
}

impl RemoteConfigArgs {
    fn load(&self) -> anyhow::Result<RemoteConfig> {
        let c = Config::load(&Overrides {
            config: self.config.clone(),
            ..Default::default()
        })
        .context("reading the configuration")?;
        let Some(r) = c.remote else {
            bail!(
                "{}: no [remote] section (set remote.url = \"s3://BUCKET/PREFIX\"; see docs/fleet.md)",
                self.config
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| crate::config::SYSTEM_CONFIG.into())
            );
        };
        Ok(r)
    }

    fn open(&self) -> anyhow::Result<RemoteTier> {
        let cfg = self.load()?;
        RemoteTier::open(&cfg).with_context(|| format!("opening the remote tier {}", cfg.url))
    }
}

/// Write a new Ed25519 keypair: PATH.key (mode 0600) and PATH.pub. The key's name is PATH's
/// file name; list PATH.pub in other hosts' remote.trusted_keys and PATH.key as this
/// writer's remote.signing_key.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Path without extension, e.g. /etc/trtcache/keys/ci-builder.
    pub path: PathBuf,
    #[arg(long)]
    pub json: bool,
}

/// Upload local cache entries to the bucket, signed (needs remote.mode = "read-write").
#[derive(Debug, Args)]
pub struct PushArgs {
    /// Keys (hex) to upload.
    #[arg(required_unless_present = "all")]
    pub keys: Vec<String>,
    /// Upload every servable entry.
    #[arg(long, conflicts_with = "keys")]
    pub all: bool,
    /// Send every blob without reading back the bucket's copy first (by default a blob
    /// already there is hashed and sent again only when its content differs).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub remote: RemoteConfigArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[arg(long)]
    pub json: bool,
}

/// Fetch a model's artifact from the bucket into the local cache (same flags and key as
/// `build`): verified signature, every file re-hashed, and opened before it is stored.
#[derive(Debug, Args)]
pub struct PullArgs {
    #[command(flatten)]
    pub build: BuildArgs,
    #[command(flatten)]
    pub remote: RemoteConfigArgs,
}

/// Bucket maintenance.
#[derive(Debug, Subcommand)]
pub enum RemoteCommand {
    /// Delete manifests older than AGE, then blobs of that age no manifest names, and
    /// expired leases (needs a read-write host). Local eviction never deletes remote objects.
    Gc(RemoteGcArgs),
}

#[derive(Debug, Args)]
pub struct RemoteGcArgs {
    /// Age, e.g. 30d, 12h, 90m, 3600s.
    #[arg(long, value_parser = parse_age)]
    pub older_than: Duration,
    /// List what would be deleted without deleting.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub remote: RemoteConfigArgs,
    #[arg(long)]
    pub json: bool,
}

fn parse_age(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}`: expected e.g. 30d, 12h, 90m, 60s"))?;
    let mult = match unit {
        "s" | "" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("`{s}`: the unit is s, m, h or d")),
    };
    Ok(Duration::from_secs(n.saturating_mul(mult)))
}

pub fn keygen(a: KeygenArgs) -> anyhow::Result<ExitCode> {
    let r = crate::remote::keygen(&a.path)
        .with_context(|| format!("writing a keypair at {}", a.path.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "secret key {} (mode 0600: keep it on the writer)\npublic key {} ({})",
            r.secret_key.display(),
            r.public_key.display(),
            r.public
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct PushReport {
    uploaded: Vec<crate::remote::UploadOutcome>,
    failed: Vec<(String, String)>,
    /// Entries `--all` does not upload (fetched, or recorded before provenance), with why.
    skipped: Vec<(String, String)>,
    stats: RemoteStats,
}

pub fn push(a: PushArgs) -> anyhow::Result<ExitCode> {
    let tier = a.remote.open()?;
    if tier.config().mode != Mode::ReadWrite {
        return Err(RemoteError::ReadOnly).context("push");
    }
    let (store, _dir) = open_store(&a.cache, None)?;
    for (key, why) in tier.drop_untrusted(&store).context("checking trust")? {
        eprintln!("push: dropped {key} from the local cache: {why}");
    }
    let keys: Vec<CacheKey> = if a.all {
        store
            .list()
            .context("listing the cache")?
            .into_iter()
            .map(|r| r.key)
            .collect()
    } else {
        a.keys
            .iter()
            .map(|k| CacheKey::parse(k).with_context(|| format!("key `{k}`")))
            .collect::<anyhow::Result<_>>()?
    };
    let mut rep = PushReport {
        uploaded: Vec::new(),
        failed: Vec::new(),
        skipped: Vec::new(),
        stats: RemoteStats::default(),
    };
    for key in keys {
        let job = match store.peek(&key).with_context(|| format!("reading {key}"))? {
            Lookup::Hit { record, served } => UploadJob {
                record,
                dir: served.dir,
                release_lease: false,
            },
            Lookup::Unservable { why, .. } if !a.all => {
                rep.failed.push((key.hex(), format!("not servable: {why}")));
                continue;
            }
            Lookup::Miss if !a.all => {
                rep.failed
                    .push((key.hex(), "no such entry in the local cache".into()));
                continue;
            }
            _ => continue,
        };
        match tier.upload(&job, a.force) {
            Ok(o) => rep.uploaded.push(o),
            // `--all` uploads what this host built; the rest is listed, not a failure.
            Err(e @ RemoteError::NotBuiltHere { .. }) if a.all => {
                rep.skipped.push((key.hex(), e.to_string()))
            }
            Err(e) => rep.failed.push((key.hex(), format!("{e:#}"))),
        }
    }
    rep.stats = tier.stats();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        let mut rows: Vec<Vec<String>> = rep
            .uploaded
            .iter()
            .map(|o| {
                let what = match &o.adopted {
                    Some(b) => format!("adopted the manifest of {b}"),
                    None if o.manifest_written => "manifest written".into(),
                    None => "manifest already there".into(),
                };
                vec![
                    o.key[..16].to_string(),
                    format!(
                        "{} blobs, {}",
                        o.blobs_uploaded,
                        human_bytes(o.bytes_uploaded)
                    ),
                    what,
                ]
            })
            .collect();
        rows.extend(rep.skipped.iter().map(|(k, why)| {
            vec![
                k[..16.min(k.len())].to_string(),
                "skipped".into(),
                why.clone(),
            ]
        }));
        rows.extend(rep.failed.iter().map(|(k, why)| {
            vec![
                k[..16.min(k.len())].to_string(),
                "FAILED".into(),
                why.clone(),
            ]
        }));
        print!("{}", table("", &rows));
    }
    Ok(if rep.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[derive(Serialize)]
struct PullReport {
    key: String,
    /// `local` (already in the cache: nothing was fetched) or `remote`; none when not pulled.
    origin: Option<&'static str>,
    /// Why nothing was pulled.
    refused: Option<String>,
    entry: Option<PathBuf>,
    bytes: u64,
    seconds: f64,
    stats: RemoteStats,
}

pub fn pull(a: PullArgs) -> anyhow::Result<ExitCode> {
    let b = &a.build;
    let (req, max_bytes) = super::build::request(b)?;
    let rt = runtime::load(b.ort_library.as_deref()).map_err(anyhow::Error::new)?;
    let backend = crate::builder::backend(req.backend);
    backend.check(rt).map_err(anyhow::Error::new)?;
    let (store, dir) = open_store(&b.cache, max_bytes)?;
    let builder = Builder::new(Arc::new(store), b.ort_library.clone())
        .with_digest_memo(dir.join(DIGEST_MEMO))
        .with_timing_caches(dir.join(crate::trt::timing::TIMING_DIR));
    let parts = builder
        .key_parts(&req)
        .with_context(|| format!("keying {}", b.model.display()))?;
    let key = parts.key();
    let store = builder.store().clone();
    let started = Instant::now();
    let mut rep = PullReport {
        key: key.hex(),
        origin: None,
        refused: None,
        entry: None,
        bytes: 0,
        seconds: 0.0,
        stats: RemoteStats::default(),
    };
    // A local hit never touches the network (opening the tier sends no request), unless
    // it was fetched under a key this host no longer trusts: then it is dropped and fetched
    // again.
    let tier = a.remote.open()?;
    let local = match store.peek(&key)? {
        Lookup::Hit { served, record } if !b.force => match tier.distrusts(&record.provenance) {
            None => Some((served, record)),
            Some(why) => {
                eprintln!("pull: dropping the local entry {key}: {why}");
                store.remove(&key)?;
                None
            }
        },
        _ => None,
    };
    if let Some((served, record)) = local {
        rep.origin = Some("local");
        rep.entry = Some(served.entry);
        rep.bytes = record.bytes();
    } else {
        let revalidate = tier.config().revalidate;
        let check = |art: &crate::cache::StagedArtifact, _m: &crate::remote::Manifest| {
            builder
                .check_fetched(&req, art, revalidate)
                .map_err(|e| format!("it does not pass: {e}"))
        };
        let model_path = b.model.display().to_string();
        match tier.fetch(&parts, &model_path, &*store, &check) {
            Ok(Some(r)) => {
                rep.origin = Some("remote");
                rep.bytes = r.bytes();
                if let Lookup::Hit { served, .. } = store.peek(&key)? {
                    rep.entry = Some(served.entry);
                }
            }
            Ok(None) => rep.refused = Some("the bucket has no artifact for this key".into()),
            Err(
                e @ (RemoteError::Rejected { .. }
                | RemoteError::CheckFailed { .. }
                | RemoteError::MissingBlob { .. }
                | RemoteError::TooLarge { .. }),
            ) => rep.refused = Some(e.to_string()),
            Err(e) => {
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("pulling {} ({key})", b.model.display()))
            }
        }
        rep.stats = tier.stats();
    }
    rep.seconds = started.elapsed().as_secs_f64();
    if b.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        let rows = vec![
            vec!["model".into(), b.model.display().to_string()],
            vec!["key".into(), rep.key.clone()],
            vec![
                "result".into(),
                match (rep.origin, &rep.refused) {
                    (Some("local"), _) => "already in the local cache (no network)".into(),
                    (Some(_), _) => {
                        format!("pulled {} in {:.2} s", human_bytes(rep.bytes), rep.seconds)
                    }
                    (None, Some(why)) => format!("not pulled: {why}"),
                    (None, None) => "not pulled".into(),
                },
            ],
        ];
        print!("{}", table("", &rows));
        if let Some(e) = &rep.entry {
            println!("artifact {}", e.display());
        }
    }
    Ok(if rep.origin.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub fn remote(c: RemoteCommand) -> anyhow::Result<ExitCode> {
    match c {
        RemoteCommand::Gc(a) => {
            let tier = a.remote.open()?;
            let rep = tier.gc(a.older_than, a.dry_run).context("remote gc")?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&rep)?);
            } else {
                let verb = if a.dry_run { "would delete" } else { "deleted" };
                println!(
                    "{verb} {} manifests, {} blobs, {} leases; kept {} manifests, {} blobs",
                    rep.manifests_deleted.len(),
                    rep.blobs_deleted.len(),
                    rep.leases_deleted.len(),
                    rep.manifests_kept,
                    rep.blobs_kept
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
