//! Stage 11, the command-line surface: clap definitions and one function per subcommand. Library
//! errors get their context here (`anyhow`), naming the path, model or key involved.

mod build;
mod cache;
mod capability;
mod export;
mod failure;
mod health;
mod inspect;
pub(crate) mod key;
pub mod log;
mod manual;
pub(crate) mod output;
pub use output::printable;
mod sku;

pub use inspect::opset_bounds;
mod remote;
mod serve;
mod stats;
mod warm;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// trtcache: build TensorRT engines once, cache them by content, hand them to every process.
#[derive(Debug, Parser)]
#[command(name = "trtcache", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace; `serve` logs at info without
    /// -v); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log line format on stderr [default: the config's log_format for `serve`, else text].
    #[arg(long, global = true, value_enum, env = "TRTCACHE_LOG_FORMAT")]
    pub log_format: Option<log::LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a model's inputs, outputs, operators, warnings and what TensorRT can take.
    Inspect(inspect::InspectArgs),
    /// Print a model's cache key and every part hashed into it.
    ///
    /// The key is SHA-256 over: the model's content digest (graph file plus every
    /// external-data file; never its path, name or mtime), opsets, the shape profile, the
    /// device SKU, the backend with its library versions, the precision and build options.
    /// Digests are remembered in CACHE_DIR/digests.json by (device, inode, size, mtime,
    /// ctime), so an unchanged model is not hashed again. See docs/keys.md.
    Key(Box<key::KeyArgs>),
    /// Show the GPUs, the CPU and the device SKU cache keys are made for.
    ///
    /// GPUs come from the CUDA driver when libcuda is present (name, compute capability,
    /// SMs, memory, driver, UUID); the GPU keys use is TRTCACHE_DEVICE (default 0). Without
    /// a driver or GPU the CPU SKU is used (model and the ISA flags that change kernels), and
    /// the report says why no GPU was found.
    Sku(sku::SkuArgs),
    /// Build (or find in the cache) a validated artifact for a model and backend.
    Build(Box<build::BuildArgs>),
    /// List cache entries: key, state, backend, size, hits, last use, model (through the
    /// daemon when one holds the cache).
    Ls(cache::LsArgs),
    /// Remove one cache entry (and its files when no other entry shares them); through the
    /// daemon when one holds the cache.
    Rm(cache::RmArgs),
    /// Evict least-recently-used entries to a size limit; drop quarantined ones (through the
    /// daemon when one holds the cache).
    Gc(cache::GcArgs),
    /// Re-hash every stored artifact; quarantine the ones whose files changed (through the
    /// daemon when one holds the cache).
    Verify(cache::VerifyArgs),
    /// Print the running daemon's counters: hits, misses, builds, failures, queue, connections.
    Stats(stats::StatsArgs),
    /// Write a Triton model repository (`--triton-repo DIR`) from the cache's `trt` engines:
    /// NAME/config.pbtxt (platform tensorrt_plan, cc_model_filenames) and NAME/VERSION/*.plan.
    Export(export::ExportArgs),
    /// Run the daemon: watch models, build and cache artifacts, serve them on a Unix socket.
    ///
    /// SIGTERM/SIGINT stop it cleanly (exit 0). SIGHUP loads the configuration again: when it
    /// does not load, the error is logged and the daemon keeps serving; when it loads, the
    /// daemon stops as cleanly and exits 75 so that its service manager starts it with the new
    /// configuration (the systemd unit's `ExecReload=` and `RestartForceExitStatus=75`).
    Serve(serve::ServeArgs),
    /// Print the effective configuration (file + flags).
    Config(serve::ConfigArgs),
    /// Build every model present, waiting for files still being copied in (through the
    /// daemon when one runs); exit 0 only when all are ready.
    Warm(warm::WarmArgs),
    /// Show each model's state per backend/profile (from the daemon when one runs).
    Status(warm::StatusArgs),
    /// Check that the daemon answers on its socket (--ready: and that every model is
    /// ready); exit 0, 1 not ready, 3 not answering. For probes and deploy gates. Warns
    /// (exit status unchanged) when the daemon's remote tier is unreachable.
    Health(health::HealthArgs),
    /// Internal: build and validate one job read from stdin (the daemon and `build` run
    /// every build in such a bounded worker process).
    #[command(hide = true)]
    Worker,
    /// Internal: print the version of the TensorRT that `TENSORRT_ROOT` and
    /// `TRTCACHE_TRT_SHIM` name, as JSON (the daemon asks an incoming TensorRT this way, never
    /// loading a second TensorRT itself).
    #[command(hide = true)]
    ProbeTensorrt,
    /// Write an Ed25519 keypair (PATH.key, mode 0600, and PATH.pub) for signing fleet uploads.
    Keygen(remote::KeygenArgs),
    /// Upload local entries to the fleet bucket, signed (docs/fleet.md).
    Push(remote::PushArgs),
    /// Fetch a model's artifact from the fleet bucket into the local cache (build's flags).
    Pull(Box<remote::PullArgs>),
    /// The fleet bucket: `remote gc --older-than AGE`.
    #[command(subcommand)]
    Remote(remote::RemoteCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions(manual::CompletionsArgs),
    /// Print the man page (roff) on stdout: `trtcache man | man -l -`.
    Man(manual::ManArgs),
}

impl Command {
    /// Whether the command was asked for JSON output; its errors are then JSON too
    /// ([`failure::report_error`]).
    pub fn json(&self) -> bool {
        match self {
            Command::Inspect(a) => a.json,
            Command::Key(a) => a.json,
            Command::Sku(a) => a.json,
            Command::Build(a) => a.json,
            Command::Ls(a) => a.json,
            Command::Rm(a) => a.json,
            Command::Gc(a) => a.json,
            Command::Verify(a) => a.json,
            Command::Stats(a) => a.json,
            Command::Config(a) => a.json,
            Command::Warm(a) => a.json,
            Command::Status(a) => a.json,
            Command::Keygen(a) => a.json,
            Command::Push(a) => a.json,
            Command::Pull(a) => a.build.json,
            Command::Remote(remote::RemoteCommand::Gc(a)) => a.json,
            Command::Health(a) => a.json,
            Command::Export(a) => a.json,
            Command::Serve(_)
            | Command::Worker
            | Command::ProbeTensorrt
            | Command::Completions(_)
            | Command::Man(_) => false,
        }
    }
}

pub use failure::report_error;

/// Runs one subcommand; the exit code is the command's verdict (errors are `Err`).
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let logs = log::LogSettings {
        verbose: cli.verbose,
        daemon: false,
        format: cli.log_format.unwrap_or_default(),
    };
    // The daemon's log format may come from its config file: it starts logging once that
    // is read.
    if !matches!(cli.command, Command::Serve(_)) {
        log::init(logs);
    }
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Key(a) => key::run(*a),
        Command::Sku(a) => sku::run(a),
        Command::Build(a) => build::run(*a),
        Command::Ls(a) => cache::ls(a),
        Command::Rm(a) => cache::rm(a),
        Command::Gc(a) => cache::gc(a),
        Command::Verify(a) => cache::verify(a),
        Command::Stats(a) => stats::run(a),
        Command::Export(a) => export::export(a),
        Command::Serve(a) => serve::serve(
            a,
            cli.log_format,
            log::LogSettings {
                daemon: true,
                ..logs
            },
        ),
        Command::Config(a) => serve::config(a),
        Command::Warm(a) => warm::warm(a),
        Command::Status(a) => warm::status(a),
        Command::Health(a) => health::health(a),
        Command::Worker => Ok(ExitCode::from(
            u8::try_from(crate::builder::worker::serve_one()).unwrap_or(2),
        )),
        Command::ProbeTensorrt => Ok(ExitCode::from(
            u8::try_from(crate::trt::incoming::probe_main()).unwrap_or(2),
        )),
        Command::Keygen(a) => remote::keygen(a),
        Command::Push(a) => remote::push(a),
        Command::Pull(a) => remote::pull(*a),
        Command::Remote(c) => remote::remote(c),
        Command::Completions(a) => manual::completions(a, Cli::command()),
        Command::Man(a) => manual::man(a, Cli::command()),
    }
}
