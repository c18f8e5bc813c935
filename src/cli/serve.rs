//! `trtcache serve` (run the daemon) and `trtcache config` (print the effective config).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::config::{Config, Overrides};

/// Where the config, models, cache and socket are; each flag overrides the config file.
#[derive(Debug, Clone, Args)]
pub struct PathArgs {
    /// TOML config file [default: /etc/trtcache/config.toml when present].
    #[arg(long, env = "TRTCACHE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Model repository: NAME.onnx files, NAME/model.onnx folders or Triton NAME/VERSION/model.onnx.
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Cache directory [default: the config file's cache_dir, else TRTCACHE_CACHE_DIR, else
    /// /var/cache/trtcache under systemd, else the cache/ of the checkout the executable was
    /// built in, else ~/.cache/trtcache].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Unix socket [default: the config file's socket, else TRTCACHE_SOCKET, else
    /// CACHE/trtcache.sock, /run/trtcache/trtcache.sock under systemd].
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

impl PathArgs {
    /// The effective configuration.
    pub fn load(&self) -> anyhow::Result<Config> {
        let cfg = Config::load(&self.overrides()).context("reading the configuration")?;
        // Every model this process (and its build workers) reads is held to the config's
        // decode budget.
        crate::onnx::DecodeLimits::set_process_default(cfg.limits.decode());
        Ok(cfg)
    }

    pub(crate) fn overrides(&self) -> Overrides {
        Overrides {
            config: self.config.clone(),
            models: self.models.clone(),
            cache_dir: self.cache_dir.clone(),
            socket: self.socket.clone(),
            ..Default::default()
        }
    }
}

/// Run the daemon: watch the model repository, build and cache artifacts, serve them on a
/// Unix socket. Stops cleanly on SIGTERM/SIGINT. On SIGHUP it loads the configuration again:
/// if that fails it logs why and keeps serving; if it loads, it stops as cleanly and exits with
/// status 75 so the service manager starts it again with the new configuration (the systemd
/// unit's `ExecReload` sends SIGHUP, `RestartForceExitStatus=75` restarts it). Under systemd it
/// reports readiness (Type=notify), pings the watchdog and accepts a socket-activated
/// listener.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub paths: PathArgs,
    /// Serve /metrics (Prometheus), /healthz and /readyz over HTTP on this address, e.g.
    /// 127.0.0.1:9464 [default: the config's metrics_listen; off when unset].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

/// Loads the configuration, starts logging in its format (the `--log-format` flag wins),
/// then runs the daemon.
pub fn serve(
    a: ServeArgs,
    format_flag: Option<super::log::LogFormat>,
    logs: super::log::LogSettings,
) -> anyhow::Result<ExitCode> {
    let loaded = Config::load(&Overrides {
        metrics_listen: a.metrics_listen.clone(),
        ..a.paths.overrides()
    })
    .context("reading the configuration");
    let format = match (&loaded, format_flag) {
        (_, Some(f)) => f,
        (Ok(cfg), None) => cfg.log_format,
        (Err(_), None) => logs.format,
    };
    super::log::init(super::log::LogSettings { format, ..logs });
    let cfg = loaded?;
    crate::onnx::DecodeLimits::set_process_default(cfg.limits.decode());
    super::cache::creatable_cache(&cfg.cache_dir)?;
    // The socket is named by the `ready` line: an inherited one (socket activation) replaces
    // the configured path.
    tracing::info!(models = %cfg.models.display(), cache = %cfg.cache_dir.display(), "starting");
    let paths = a.paths;
    let reload = Box::new(move || paths.load().map(drop).map_err(|e| format!("{e:#}")));
    match crate::daemon::serve(cfg, reload).map_err(anyhow::Error::new)? {
        crate::daemon::Ending::Stopped => Ok(ExitCode::SUCCESS),
        crate::daemon::Ending::Restart => {
            eprintln!("trtcache: stopped on SIGHUP to restart with the new configuration (exit status {})", crate::daemon::RESTART_EXIT_CODE);
            Ok(ExitCode::from(crate::daemon::RESTART_EXIT_CODE))
        }
    }
}

/// Print the effective configuration as TOML (with where the paths came from as comments), or
/// JSON with --json. Precedence, the same for every command: flags, then the config file,
/// then the environment (TRTCACHE_CACHE_DIR, TRTCACHE_SOCKET, ORT_DYLIB_PATH), then defaults.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub paths: PathArgs,
    /// Print JSON instead of TOML.
    #[arg(long)]
    pub json: bool,
}

pub fn config(a: ConfigArgs) -> anyhow::Result<ExitCode> {
    let cfg = a.paths.load()?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&cfg).context("serialising the config")?
        );
    } else {
        for (key, source) in Config::sources(&a.paths.overrides()) {
            println!("# {key}: from {source}");
        }
        print!(
            "{}",
            toml::to_string_pretty(&cfg).context("serialising the config")?
        );
    }
    Ok(ExitCode::SUCCESS)
}
