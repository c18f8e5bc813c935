//! `trtcache warm` (the deploy step: every model ready and validated, or a non-zero exit) and
//! `trtcache status`. Both talk to the running daemon when its socket answers; otherwise they
//! work in-process against the cache directory through the same build cache the daemon uses.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use trtcache_client::protocol::{
    BuildRequest, BuildResult, ErrorCode, ModelStatus, VariantState, VariantStatus,
};
use trtcache_client::{Client, ClientError};

use super::output::{table, Style};
use super::serve::PathArgs;
use crate::config::Config;
use crate::daemon::repo;

/// Build (or confirm in the cache) every model in the repository, with progress per model on
/// stderr and a summary table. Every model file present when it starts counts, including
/// files still being written: it first has the daemon rescan the repository and waits until
/// each model's files keep their size and mtime for the settle interval
/// (`limits.debounce_ms`). Exits 0 only when every model/profile/backend is ready and
/// validated, 1 when any failed or was still being written at --timeout, 2 on bad input (an
/// empty repository too, unless --allow-empty).
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
    /// Give up after this many seconds (the unfinished builds, and models still being
    /// written, count as failed).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Succeed on an empty repository (by default no model to warm is an error: a deploy
    /// that copied nothing, or a wrong --models).
    #[arg(long)]
    pub allow_empty: bool,
    /// Build for this runtime instead of the current one: the deploy step before a runtime
    /// upgrade. An ONNX Runtime library (a file, `…/libonnxruntime.so.1.32.0`: the `ort-*`
    /// variants) or a TensorRT install root (a folder, what TENSORRT_ROOT names, its shim
    /// `ROOT/lib/libtrtcache_trt.so` or the daemon's: the `trt` and `ort-tensorrt` variants).
    /// Through a running daemon it is an admin request, and the runtime joins the daemon's
    /// incoming runtimes (pre-built in the background from then on, served to consumers that
    /// say they run it). Exits 0 only when every model has a validated artifact for it.
    /// docs/daemon.md, "Upgrading the runtime".
    #[arg(long, value_name = "LIBRARY|TENSORRT_ROOT")]
    pub runtime: Option<std::path::PathBuf>,
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
    let start = Instant::now();
    let deadline = a.timeout.map(|t| start + Duration::from_secs(t));
    let files = a
        .files
        .iter()
        .map(|p| std::path::absolute(p).with_context(|| format!("resolving {}", p.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // With --path and no names only the paths are built; otherwise the repository's models.
    let repository = !a.model.is_empty() || files.is_empty();
    let bars = Bars::new();
    let mut show = |p: &trtcache_client::protocol::Progress| {
        let elapsed = Duration::from_millis(p.elapsed_ms);
        bars.update(&p.model, &p.backend, &p.profile, &p.phase, elapsed);
    };
    let mut client = connect(&cfg)?;
    if client.is_some() {
        eprintln!("warm: using the daemon at {}", cfg.socket.display());
    }
    let (names, mut unsettled) = if !repository {
        (Vec::new(), Vec::new())
    } else if let Some(c) = &mut client {
        settle_through_daemon(c, &cfg, &a, deadline)?
    } else {
        settle_in_process(&cfg, &a, deadline)?
    };
    if repository && names.is_empty() && unsettled.is_empty() {
        if !a.allow_empty {
            return Err(EmptyRepository(cfg.models.clone()).into());
        }
        eprintln!(
            "warm: no models in {} (--allow-empty)",
            cfg.models.display()
        );
    }
    let req = BuildRequest {
        models: names.clone(),
        backend: None,
        timeout_ms: deadline
            .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
        paths: files.iter().map(|f| f.display().to_string()).collect(),
        runtime: a
            .runtime
            .as_deref()
            .map(|r| {
                std::path::absolute(r)
                    .with_context(|| format!("resolving {}", r.display()))
                    .map(|p| p.display().to_string())
            })
            .transpose()?,
    };
    let mut results = if req.models.is_empty() && req.paths.is_empty() {
        // An empty request means "every model" on the wire: never send it.
        Vec::new()
    } else {
        match &mut client {
            Some(c) => c
                .build(&req, |p| show(p))
                .map_err(anyhow::Error::new)
                .context("warming through the daemon")?,
            None => {
                super::cache::creatable_cache(&cfg.cache_dir)?;
                // The daemon's own warm, run here (same planning, queue, worker builds,
                // results).
                eprintln!(
                    "warm: no daemon at {}; building in-process into {}",
                    cfg.socket.display(),
                    cfg.cache_dir.display()
                );
                crate::daemon::warm_in_process(&cfg, &req, &mut show)
                    .map_err(anyhow::Error::new)
                    .context("warming in-process")?
            }
        }
    };
    // A model that built no variant is not ready either.
    for n in &names {
        if !results.iter().any(|r| &r.model == n) {
            unsettled.push(not_built(n, "no variant was built for it"));
        }
    }
    results.append(&mut unsettled);
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

/// `warm` found no model to warm: a deploy that copied nothing, or the wrong folder.
#[derive(Debug, thiserror::Error)]
#[error("no models in the repository {} (nothing to warm; --allow-empty accepts an empty repository)", .0.display())]
pub struct EmptyRepository(pub std::path::PathBuf);

/// A failed result for a model warm could not build (still being written at the deadline).
fn not_built(model: &str, reason: &str) -> BuildResult {
    BuildResult {
        model: model.into(),
        backend: String::new(),
        profile: String::new(),
        state: VariantState::Failed,
        key: None,
        cached: false,
        code: Some(ErrorCode::Timeout),
        reason: Some(reason.into()),
        seconds: 0.0,
        runtime: None,
    }
}

/// The models to warm: the names given (each must exist), else every model found.
fn wanted<'a>(
    found: impl Iterator<Item = &'a str>,
    a: &WarmArgs,
    root: &str,
) -> anyhow::Result<Vec<String>> {
    let found: Vec<&str> = found.collect();
    if a.model.is_empty() {
        return Ok(found.iter().map(|s| s.to_string()).collect());
    }
    for n in &a.model {
        anyhow::ensure!(
            found.contains(&n.as_str()),
            "no model `{n}` in the repository {root}"
        );
    }
    Ok(a.model.clone())
}

/// Asks the daemon to rescan until every model present has settled (its files kept their
/// size and mtime for the daemon's settle interval) and is served, or until the deadline.
/// Returns the settled names and a failed result for each model still being written.
fn settle_through_daemon(
    c: &mut Client,
    cfg: &Config,
    a: &WarmArgs,
    deadline: Option<Instant>,
) -> anyhow::Result<(Vec<String>, Vec<BuildResult>)> {
    let mut warned = std::collections::BTreeSet::new();
    let mut waiting = std::collections::BTreeMap::new();
    loop {
        let t0 = Instant::now();
        let r = match c.rescan() {
            Ok(r) => r,
            // A daemon older than `rescan`: the folder is read here, as the daemon sees it.
            Err(ClientError::Server {
                code: ErrorCode::UnknownRequest,
                ..
            }) => {
                eprintln!(
                    "warm: the daemon at {} predates `rescan`; reading {} here",
                    cfg.socket.display(),
                    cfg.models.display()
                );
                return settle_in_process(cfg, a, deadline);
            }
            Err(e) => {
                return Err(anyhow::Error::new(e))
                    .context("asking the daemon to rescan its repository")
            }
        };
        if a.paths.models.is_some() {
            let mine = std::fs::canonicalize(&cfg.models)
                .with_context(|| format!("model repository {}", cfg.models.display()))?;
            anyhow::ensure!(
                mine == std::path::Path::new(&r.root),
                "the daemon at {} serves {}, not {} (the --models given)",
                cfg.socket.display(),
                r.root,
                mine.display()
            );
        }
        for s in &r.skipped {
            if warned.insert((s.path.clone(), s.reason.clone())) {
                eprintln!("warm: skipped {}: {}", s.path, s.reason);
            }
        }
        let names = wanted(r.models.iter().map(|m| m.name.as_str()), a, &r.root)?;
        let pending: Vec<_> = r
            .models
            .iter()
            .filter(|m| !m.settled && names.contains(&m.name))
            .collect();
        if pending.is_empty() {
            return Ok((names, Vec::new()));
        }
        for m in &pending {
            if waiting.insert(m.name.clone(), m.bytes) != Some(m.bytes) {
                eprintln!(
                    "warm: {} is still being written ({}); waiting for it to settle",
                    m.name,
                    super::output::human_bytes(m.bytes)
                );
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let late: Vec<BuildResult> = pending
                .iter()
                .map(|m| not_built(&m.name, "still being written when --timeout ran out"))
                .collect();
            let ready = names
                .into_iter()
                .filter(|n| !pending.iter().any(|m| &m.name == n))
                .collect();
            return Ok((ready, late));
        }
        // The daemon waited a settle interval itself when something was changing.
        let settle = Duration::from_millis(r.settle_ms.max(10));
        std::thread::sleep(settle.saturating_sub(t0.elapsed()));
    }
}

/// Without a daemon: scans the repository until two scans one settle interval
/// (`limits.debounce_ms`) apart agree for every model, or every file is older than that.
fn settle_in_process(
    cfg: &Config,
    a: &WarmArgs,
    deadline: Option<Instant>,
) -> anyhow::Result<(Vec<String>, Vec<BuildResult>)> {
    let settle = Duration::from_millis(cfg.limits.debounce_ms);
    let root = cfg.models.display().to_string();
    let mut first = repo::scan_all_with(&cfg.models, cfg.follow_symlinks_outside_repo)?;
    for s in &first.skipped {
        eprintln!("warm: skipped {}: {}", s.path.display(), s.reason);
    }
    loop {
        let names = wanted(first.models.keys().map(String::as_str), a, &root)?;
        if names.iter().all(|n| first.models[n].quiet_for(settle)) {
            return Ok((names, Vec::new()));
        }
        std::thread::sleep(settle);
        let second = repo::scan_all_with(&cfg.models, cfg.follow_symlinks_outside_repo)?;
        let names2 = wanted(second.models.keys().map(String::as_str), a, &root)?;
        let pending: Vec<String> = names2
            .iter()
            .filter(|n| first.models.get(*n) != second.models.get(*n))
            .cloned()
            .collect();
        if pending.is_empty() {
            return Ok((names2, Vec::new()));
        }
        for n in &pending {
            eprintln!("warm: {n} is still being written; waiting for it to settle");
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let late = pending
                .iter()
                .map(|n| not_built(n, "still being written when --timeout ran out"))
                .collect();
            let ready = names2
                .into_iter()
                .filter(|n| !pending.contains(n))
                .collect();
            return Ok((ready, late));
        }
        first = second;
    }
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
            match &r.runtime {
                // Built for an incoming runtime (`warm --runtime`).
                Some(v) => format!("{} ({})", r.backend, crate::daemon::runtimes::describe(v)),
                None => r.backend.clone(),
            },
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
        Some(mut c) => {
            let models = match &a.model {
                Some(m) => vec![c
                    .status(m)
                    .map_err(anyhow::Error::new)
                    .with_context(|| format!("status of `{m}`"))?],
                None => c
                    .list()
                    .map_err(anyhow::Error::new)
                    .context("listing models")?,
            };
            // The daemon builds locally while its fleet tier is down: say so.
            if let Some(why) = c.stats().ok().and_then(|s| s.remote_down) {
                eprintln!(
                    "status: the remote tier is unreachable (building locally meanwhile): {why}"
                );
            }
            models
        }
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
    super::cache::require_cache(&cfg.cache_dir)?;
    let cache = crate::daemon::open_build_cache(cfg).context("opening the cache")?;
    let snapshot = repo::scan_with(&cfg.models, cfg.follow_symlinks_outside_repo)
        .with_context(|| format!("scanning {}", cfg.models.display()))?;
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
        for sel in cache.variants(entry, &cfg.backends).selections {
            let mut v = VariantStatus {
                profile: sel.profile.clone().unwrap_or_else(|| "default".into()),
                backend: sel.backend.to_string(),
                precision: "fp32".into(),
                state: VariantState::Missing,
                key: None,
                reason: None,
                phase: None,
                origin: None,
                runtime: None,
                validated_at: None,
                also_validated_at: None,
            };
            match cache.plan(entry, &sel) {
                Ok(p) => {
                    v.key = Some(p.key.hex());
                    if let Some(h) = cache.lookup(&p).ok().flatten() {
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
                match &v.runtime {
                    Some(rt) => {
                        format!("{} ({})", v.backend, crate::daemon::runtimes::describe(rt))
                    }
                    None => v.backend.clone(),
                },
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
