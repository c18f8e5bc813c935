//! The command-line surface: clap definitions and one function per subcommand. Library
//! errors get their context here (`anyhow`), naming the path, model or key involved.

mod build;
mod cache;
mod capability;
mod inspect;
pub(crate) mod key;
pub(crate) mod output;
pub use output::printable;
mod sku;

pub use inspect::opset_bounds;
mod remote;
mod serve;
mod warm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// trtcache: build TensorRT engines once, cache them by content, hand them to every process.
#[derive(Debug, Parser)]
#[command(name = "trtcache", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
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
    /// List cache entries: key, state, backend, size, hits, last use, model.
    Ls(cache::LsArgs),
    /// Remove one cache entry (and its files when no other entry shares them).
    Rm(cache::RmArgs),
    /// Evict least-recently-used entries to a size limit; drop quarantined ones.
    Gc(cache::GcArgs),
    /// Re-hash every stored artifact; quarantine the ones whose files changed.
    Verify(cache::VerifyArgs),
    /// Run the daemon: watch models, build and cache artifacts, serve them on a Unix socket.
    ///
    /// SIGTERM/SIGINT stop it cleanly (exit 0). SIGHUP loads the configuration again: when it
    /// does not load, the error is logged and the daemon keeps serving; when it loads, the
    /// daemon stops as cleanly and exits 75 so that its service manager starts it with the new
    /// configuration (the systemd unit's `ExecReload=` and `RestartForceExitStatus=75`).
    Serve(serve::ServeArgs),
    /// Print the effective configuration (file + flags).
    Config(serve::ConfigArgs),
    /// Build every model (through the daemon when one runs); exit 0 only when all are ready.
    Warm(warm::WarmArgs),
    /// Show each model's state per backend/profile (from the daemon when one runs).
    Status(warm::StatusArgs),
    /// Internal: build and validate one job read from stdin (the daemon and `build` run
    /// every build in such a bounded worker process).
    #[command(hide = true)]
    Worker,
    /// Write an Ed25519 keypair (PATH.key, mode 0600, and PATH.pub) for signing fleet uploads.
    Keygen(remote::KeygenArgs),
    /// Upload local entries to the fleet bucket, signed (docs/fleet.md).
    Push(remote::PushArgs),
    /// Fetch a model's artifact from the fleet bucket into the local cache (build's flags).
    Pull(Box<remote::PullArgs>),
    /// The fleet bucket: `remote gc --older-than AGE`.
    #[command(subcommand)]
    Remote(remote::RemoteCommand),
}

/// Installs the tracing subscriber (stderr). ort reports provider fallbacks only through
/// tracing, so every binary installs one.
pub fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn,ort=warn",
        1 => "info,ort=warn",
        2 => "debug,ort=info",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only for a person at a terminal: never in journald, files or pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Runs one subcommand; the exit code is the command's verdict (errors are `Err`).
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Key(a) => key::run(*a),
        Command::Sku(a) => sku::run(a),
        Command::Build(a) => build::run(*a),
        Command::Ls(a) => cache::ls(a),
        Command::Rm(a) => cache::rm(a),
        Command::Gc(a) => cache::gc(a),
        Command::Verify(a) => cache::verify(a),
        Command::Serve(a) => serve::serve(a),
        Command::Config(a) => serve::config(a),
        Command::Warm(a) => warm::warm(a),
        Command::Status(a) => warm::status(a),
        Command::Worker => Ok(ExitCode::from(
            u8::try_from(crate::build::worker::serve_one()).unwrap_or(2),
        )),
        Command::Keygen(a) => remote::keygen(a),
        Command::Push(a) => remote::push(a),
        Command::Pull(a) => remote::pull(*a),
        Command::Remote(c) => remote::remote(c),
    }
}
