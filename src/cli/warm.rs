//! `trtcache warm` (the deploy step: every model ready and validated, or a non-zero exit) and
//! `trtcache status`. Both talk to the running daemon when its socket answers; otherwise they
//! work in-process against the cache directory through the same engine the daemon uses.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use trtcache_client::protocol::{
    BuildRequest, BuildResult, ModelStatus, VariantState, VariantStatus,
};
use trtcache_client::{Client, ClientError};

use super::output::{table, Style};
use super::serve::PathArgs;
use crate::config::Config;
use crate::daemon::repo;

/// Build (or confirm in the cache) every model in the repository, with progress per model on
/// stderr and a summary table. Exits 0 only when every model/profile/backend is ready and
/// validated, 1 when any failed, 2 on bad input.
#[derive(Debug, Args)]
pub struct WarmArgs {
    #[command(flatten)]
    pub paths: PathArgs,
    /// Only these models (names in the repository); all when omitted.
    pub model: Vec<String>,
    /// Also build this model file from outside the repository into the cache (repeatable),
    /// e.g. a release staged for deployment. Through a running daemon this is an admin
    /// request (root or the daemon's user), since the daemon reads the file. With --path and
    /// no model names, only the paths are built.
    #[arg(long = "path", value_name = "FILE")]
    pub files: Vec<std::path::PathBuf>,
    /// Give up after this many seconds (the unfinished builds count as failed).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Show every model's (or one model's) state per backend/profile: missing, queued, building,
/// ready or failed with the reason.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub paths: PathArgs,
    /// One model; all when omitted.
    pub model: Option<String>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Progress per model/backend/profile on stderr: a spinner line each (phase, elapsed) on a
/// terminal, plain lines otherwise (logs, CI).
struct Bars {
    multi: Option<indicatif::MultiProgress>,
    bars: std::cell::RefCell<std::collections::HashMap<String, indicatif::ProgressBar>>,
}

impl Bars {
    fn new() -> Self {
        use std::io::IsTerminal;
        Bars {
            multi: std::io::stderr()
                .is_terminal()
                .then(indicatif::MultiProgress::new),
            bars: Default::default(),
        }
    }

    fn update(&self, model: &str, backend: &str, profile: &str, phase: &str, elapsed: Duration) {
        let Some(multi) = &self.multi else {
            eprintln!(
                "[{:>6.1}s] {model} {backend} {profile}: {phase}",
                elapsed.as_secs_f64()
            );
            return;
        };
        let id = format!("{model} {backend} {profile}");
        let mut bars = self.bars.borrow_mut();
        let bar = bars.entry(id.clone()).or_insert_with(|| {
            let b = multi.add(indicatif::ProgressBar::new_spinner());
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {prefix:40} {msg:12} {elapsed:>5}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.set_prefix(id);
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        bar.set_message(phase.to_string());
        if phase == "ready" || phase == "failed" {
            bar.finish();
        }
    }
}

/// Connects to the daemon when one answers on the configured socket.
fn connect(cfg: &Config) -> anyhow::Result<Option<Client>> {
    match Client::connect(&cfg.socket) {
        Ok(c) => Ok(Some(c)),
        Err(ClientError::Connect { source, .. })
            if matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(anyhow::Error::new(e))
            .with_context(|| format!("talking to the daemon at {}", cfg.socket.display())),
    }
}

pub fn warm(a: WarmArgs) -> anyhow::Result<ExitCode> {
    let cfg = a.paths.load()?;
    let timeout = a.timeout.map(Duration::from_secs);
    // With --models the names come from that folder, so the daemon builds exactly those.
    let mut names = a.model.clone();
    let files = a
        .files
        .iter()
        .map(|p| std::path::absolute(p).with_context(|| format!("resolving {}", p.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if names.is_empty() && a.paths.models.is_some() && files.is_empty() {
        names = repo::scan(&cfg.models)
            .with_context(|| format!("scanning {}", cfg.models.display()))?
            .into_keys()
            .collect();
    }
    let start = Instant::now();
    let req = BuildRequest {
        models: names,
        backend: None,
        timeout_ms: timeout.map(|t| t.as_millis() as u64),
        paths: files.iter().map(|f| f.display().to_string()).collect(),
    };
    let bars = Bars::new();
    let mut show = |p: &trtcache_client::protocol::Progress| {
        let elapsed = Duration::from_millis(p.elapsed_ms);
        bars.update(&p.model, &p.backend, &p.profile, &p.phase, elapsed);
    };
    let results = match connect(&cfg)? {
        Some(mut c) => {
            eprintln!("warm: using the daemon at {}", cfg.socket.display());
            c.build(&req, |p| show(p))
                .map_err(anyhow::Error::new)
                .context("warming through the daemon")?
        }
        None => {
            // The daemon's own warm, run here (same planning, queue, worker builds, results).
            eprintln!(
                "warm: no daemon at {}; building in-process into {}",
                cfg.socket.display(),
                cfg.cache_dir.display()
            );
            crate::daemon::warm_in_process(&cfg, &req, &mut show)
                .map_err(anyhow::Error::new)
                .context("warming in-process")?
        }
    };
    let ok = results.iter().all(|r| r.state == VariantState::Ready);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&results).context("serialising results")?
        );
    } else {
        print!("{}", render_results(&results, Style::stdout()));
    }
    let failed = results
        .iter()
        .filter(|r| r.state != VariantState::Ready)
        .count();
    eprintln!(
        "warm: {} ready, {failed} failed in {:.1}s",
        results.len() - failed,
        start.elapsed().as_secs_f64()
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn render_results(results: &[BuildResult], st: Style) -> String {
    let mut rows = vec![[
        "MODEL", "BACKEND", "PROFILE", "STATE", "KEY", "SECONDS", "REASON",
    ]
    .iter()
    .map(|s| st.heading(s))
    .collect::<Vec<_>>()];
    for r in results {
        let state = match r.state {
            VariantState::Ready if r.cached => st.good("ready (cached)"),
            VariantState::Ready => st.good("ready"),
            s => st.bad(&s.to_string()),
        };
        rows.push(vec![
            r.model.clone(),
            r.backend.clone(),
            r.profile.clone(),
            state,
            r.key
                .as_deref()
                .map(|k| k.get(..12).unwrap_or(k).to_string())
                .unwrap_or_default(),
            format!("{:.2}", r.seconds),
            r.reason.clone().unwrap_or_default(),
        ]);
    }
    table("", &rows)
}

pub fn status(a: StatusArgs) -> anyhow::Result<ExitCode> {
    let cfg = a.paths.load()?;
    let conn = connect(&cfg)?;
    // A socket named on the command line that does not answer is an error: reading the cache
    // instead would print every model as `missing` and exit 0.
    if conn.is_none() && a.paths.socket.is_some() {
        anyhow::bail!(
            "no daemon answers at {} (the --socket given); start it (`trtcache serve`) or drop --socket to read the cache directly",
            cfg.socket.display()
        );
    }
    let models = match conn {
        Some(mut c) => match &a.model {
            Some(m) => vec![c
                .status(m)
                .map_err(anyhow::Error::new)
                .with_context(|| format!("status of `{m}`"))?],
            None => c
                .list()
                .map_err(anyhow::Error::new)
                .context("listing models")?,
        },
        None => {
            eprintln!(
                "status: no daemon at {}; reading the cache directly",
                cfg.socket.display()
            );
            local_status(&cfg, a.model.as_deref())?
        }
    };
    if a.json {
        let v = match (&a.model, models.first()) {
            (Some(_), Some(m)) => serde_json::to_value(m),
            _ => serde_json::to_value(&models),
        }
        .context("serialising status")?;
        println!(
            "{}",
            serde_json::to_string_pretty(&v).context("serialising status")?
        );
    } else {
        print!("{}", render_status(&models, Style::stdout()));
    }
    Ok(ExitCode::SUCCESS)
}

fn local_status(cfg: &Config, only: Option<&str>) -> anyhow::Result<Vec<ModelStatus>> {
    let engine = crate::daemon::open_engine(cfg).context("opening the cache")?;
    let snapshot =
        repo::scan(&cfg.models).with_context(|| format!("scanning {}", cfg.models.display()))?;
    if let Some(n) = only {
        anyhow::ensure!(
            snapshot.contains_key(n),
            "no model `{n}` in {}",
            cfg.models.display()
        );
    }
    let mut out = Vec::new();
    for m in snapshot
        .values()
        .filter(|m| only.is_none_or(|n| n == m.name))
    {
        let Some(entry) = m.served() else { continue };
        let mut variants = Vec::new();
        for sel in engine.variants(entry, &cfg.backends).selections {
            let mut v = VariantStatus {
                profile: sel.profile.clone().unwrap_or_else(|| "default".into()),
                backend: sel.backend.to_string(),
                precision: "fp32".into(),
                state: VariantState::Missing,
                key: None,
                reason: None,
                phase: None,
                origin: None,
            };
            match engine.plan(entry, &sel) {
                Ok(p) => {
                    v.key = Some(p.key.hex());
                    if let Some(h) = engine.lookup(&p).ok().flatten() {
                        v.state = VariantState::Ready;
                        v.origin = Some(h.origin);
                    }
                }
                Err(e) => {
                    v.state = VariantState::Failed;
                    v.reason = Some(e.to_string());
                }
            }
            variants.push(v);
        }
        out.push(ModelStatus {
            name: m.name.clone(),
            version: entry.version,
            versions: m.versions.keys().copied().collect(),
            layout: format!("{:?}", m.layout).to_lowercase(),
            variants,
        });
    }
    Ok(out)
}

fn render_status(models: &[ModelStatus], st: Style) -> String {
    let mut rows = vec![[
        "MODEL", "VERSION", "BACKEND", "PROFILE", "STATE", "KEY", "REASON",
    ]
    .iter()
    .map(|s| st.heading(s))
    .collect::<Vec<_>>()];
    for m in models {
        for v in &m.variants {
            let state = match v.state {
                VariantState::Ready => st.good("ready"),
                VariantState::Failed => st.bad("failed"),
                VariantState::Building => {
                    st.warn(&format!("building ({})", v.phase.as_deref().unwrap_or("?")))
                }
                s => st.warn(&s.to_string()),
            };
            rows.push(vec![
                m.name.clone(),
                m.version.to_string(),
                v.backend.clone(),
                v.profile.clone(),
                state,
                v.key
                    .as_deref()
                    .map(|k| k.get(..12).unwrap_or(k).to_string())
                    .unwrap_or_default(),
                v.reason.clone().unwrap_or_default(),
            ]);
        }
    }
    table("", &rows)
}
