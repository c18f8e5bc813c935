//! `trtcache health`: whether the daemon answers on its socket (liveness) and, with
//! `--ready`, whether every model is ready (the rule `/readyz` uses,
//! `daemon::metrics::not_ready`). For systemd's `ExecStartPost=`, Kubernetes exec probes
//! and deploy gates.
//!
//! A daemon whose fleet tier is unreachable is still healthy (it builds locally); the
//! verdict says so (`remote_unreachable`, and a warning line).
//!
//! Exit status: 0 healthy (and, with `--ready`, ready); 1 answering but not ready; 3 not
//! answering (no socket, refused, no answer within `--timeout`, shutting down); 2 bad flags
//! or configuration.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use trtcache_client::protocol::ErrorCode;
use trtcache_client::{Client, ClientError};

use super::serve::PathArgs;
use crate::daemon::metrics::{not_ready, NotReady};

/// Exit status: answering, not ready.
const NOT_READY: u8 = 1;
/// Exit status: not answering.
const NOT_ANSWERING: u8 = 3;

/// Check the daemon on its socket: exit 0 when it answers (with --ready: and every model is
/// ready), 1 when it answers but is not ready, 3 when it does not answer, 2 on bad flags or
/// configuration. A daemon whose fleet tier ([remote]) is unreachable is warned about
/// (`remote_unreachable` in --json) but still healthy: it builds locally.
#[derive(Debug, Args)]
pub struct HealthArgs {
    #[command(flatten)]
    pub paths: PathArgs,
    /// Also require every variant of every model to be built and ready.
    #[arg(long)]
    pub ready: bool,
    /// Seconds to wait for the daemon's answer on each try.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Try again every second for up to this many seconds until the check passes (a deploy
    /// gate that waits for builds); the last try's verdict is the exit status.
    #[arg(long, value_name = "SECS")]
    pub wait: Option<u64>,
    /// Print the verdict as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What one try found.
#[derive(Debug, Serialize)]
struct Verdict {
    socket: String,
    answering: bool,
    /// Whether every model is ready; absent when not asked (`--ready`) or not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    models: Option<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_ready: Vec<NotReady>,
    /// Why the daemon's fleet tier (`[remote]`) is unreachable, while it is. The daemon
    /// builds locally meanwhile, so this never changes the exit status: a liveness probe
    /// must not restart a daemon because the bucket is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    remote_unreachable: Option<String>,
    /// Why the daemon does not answer (or its readiness is unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Verdict {
    fn code(&self) -> u8 {
        match (self.answering, self.ready) {
            (false, _) => NOT_ANSWERING,
            (true, Some(false)) => NOT_READY,
            (true, _) => 0,
        }
    }
}

pub fn health(a: HealthArgs) -> anyhow::Result<ExitCode> {
    let cfg = a.paths.load()?;
    let timeout = Duration::from_secs(a.timeout);
    let deadline = a.wait.map(|w| Instant::now() + Duration::from_secs(w));
    let verdict = loop {
        let v = check(&cfg.socket, a.ready, timeout);
        let left = deadline.map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        });
        if v.code() == 0 || left.is_zero() {
            break v;
        }
        std::thread::sleep(left.min(Duration::from_secs(1)));
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        print_human(&verdict);
    }
    Ok(ExitCode::from(verdict.code()))
}

fn check(socket: &std::path::Path, ready: bool, timeout: Duration) -> Verdict {
    let mut v = Verdict {
        socket: socket.display().to_string(),
        answering: false,
        ready: None,
        server: None,
        models: None,
        not_ready: Vec::new(),
        remote_unreachable: None,
        error: None,
    };
    let mut c = match Client::connect_timeout(socket, timeout) {
        Ok(c) => c,
        // At its connection limit the daemon still answers: alive, readiness unknown. A
        // liveness probe must not restart a daemon for being busy.
        Err(e) if e.code() == Some(ErrorCode::Busy) => {
            v.answering = true;
            v.ready = ready.then_some(false);
            v.error = Some(format!("{e:#}"));
            return v;
        }
        Err(e) => {
            v.error = Some(not_answering(&e, timeout));
            return v;
        }
    };
    v.server = Some(c.server().to_string());
    match c.list() {
        Ok(models) => {
            v.answering = true;
            v.models = Some(models.len());
            if ready {
                v.not_ready = not_ready(&models);
                v.ready = Some(v.not_ready.is_empty());
            }
            v.remote_unreachable = c.stats().ok().and_then(|s| s.remote_down);
        }
        Err(e) if e.code() == Some(ErrorCode::Busy) => {
            v.answering = true;
            v.ready = ready.then_some(false);
            v.error = Some(format!("{e:#}"));
        }
        Err(e) => v.error = Some(not_answering(&e, timeout)),
    }
    v
}

fn not_answering(e: &ClientError, timeout: Duration) -> String {
    match e {
        ClientError::Timeout { .. } => format!("no answer within {} s", timeout.as_secs()),
        e => format!("{e:#}"),
    }
}

fn print_human(v: &Verdict) {
    let server = v.server.as_deref().unwrap_or("the daemon");
    if let Some(why) = &v.remote_unreachable {
        eprintln!("warning: the remote tier is unreachable (building locally meanwhile): {why}");
    }
    match (v.answering, v.ready) {
        (false, _) => eprintln!(
            "not answering: {} ({})",
            v.socket,
            v.error.as_deref().unwrap_or("no answer")
        ),
        (true, Some(false)) => {
            match &v.error {
                Some(e) => eprintln!("not ready: {server} at {} answers, but {e}", v.socket),
                None => eprintln!(
                    "not ready: {server} at {}: {} variant(s) of {} model(s) not ready",
                    v.socket,
                    v.not_ready.len(),
                    v.models.unwrap_or(0)
                ),
            }
            for n in &v.not_ready {
                match &n.reason {
                    Some(r) => eprintln!("  {n}: {r}"),
                    None => eprintln!("  {n}"),
                }
            }
        }
        (true, ready) => match (&v.error, v.models) {
            (Some(e), _) => println!("ok: {server} answers at {} ({e})", v.socket),
            (None, models) => println!(
                "ok: {server} answers at {} ({} models{})",
                v.socket,
                models.unwrap_or(0),
                if ready == Some(true) {
                    ", all ready"
                } else {
                    ""
                }
            ),
        },
    }
}
