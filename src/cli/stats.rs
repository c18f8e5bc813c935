//! `trtcache stats`: the running daemon's counters (hits, misses, builds, fetches, failures, queue,
//! connections, the fleet tier's), from the `stats` request; `--json` prints them as the
//! protocol's `Stats` object.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use trtcache_client::Client;

use super::output::{table, Style};
use super::serve::PathArgs;

/// Print the running daemon's counters.
#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub paths: PathArgs,
    /// Print the counters as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: StatsArgs) -> anyhow::Result<ExitCode> {
    let cfg = a.paths.load()?;
    super::cache::require_cache(&cfg.cache_dir)?;
    let mut c = Client::connect(&cfg.socket)
        .map_err(anyhow::Error::new)
        .with_context(|| {
            format!(
                "no daemon answers at {} (stats are the running daemon's counters; --socket names its socket)",
                cfg.socket.display()
            )
        })?;
    let s = c.stats().map_err(anyhow::Error::new).with_context(|| {
        format!(
            "asking the daemon at {} for its counters",
            cfg.socket.display()
        )
    })?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&s).context("serialising the counters")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let st = Style::stdout();
    let rows: Vec<Vec<String>> = [
        ("uptime", format!("{:.0} s", s.uptime_seconds)),
        ("models", s.models.to_string()),
        ("connections", s.connections.to_string()),
        ("hits", s.hits.to_string()),
        ("of them from the ready index", s.fast_hits.to_string()),
        ("misses", s.misses.to_string()),
        ("builds", s.builds.to_string()),
        ("fetched from the fleet", s.fetches.to_string()),
        ("failures", s.failures.to_string()),
        ("cancelled", s.cancelled.to_string()),
        ("build seconds", format!("{:.1}", s.build_seconds)),
        ("queued", s.queue_depth.to_string()),
        ("building", s.building.to_string()),
        ("artifacts in memory", s.artifacts_in_memory.to_string()),
        (
            "remote hits/misses",
            format!("{}/{}", s.remote_hits, s.remote_misses),
        ),
        (
            "remote uploads/rejected/errors",
            format!(
                "{}/{}/{}",
                s.remote_uploads, s.remote_rejected, s.remote_errors
            ),
        ),
    ]
    .into_iter()
    .chain(
        s.remote_down
            .as_ref()
            .map(|why| ("remote tier", st.bad(&format!("unreachable: {why}")))),
    )
    .map(|(k, v)| vec![st.heading(k), v])
    .collect();
    println!("daemon at {}", cfg.socket.display());
    print!("{}", table("  ", &rows));
    Ok(ExitCode::SUCCESS)
}
