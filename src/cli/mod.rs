//! The command-line surface: clap definitions and one function per subcommand. Library
//! errors get their context here (`anyhow`), naming the path, model or key involved.

mod capability;
mod inspect;
pub mod output;

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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Runs one subcommand; the exit code is the command's verdict (errors are `Err`).
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
    }
}
