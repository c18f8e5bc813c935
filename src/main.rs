//! The `trtcache` binary: parse arguments, install logging, hand over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = trtcache::cli::Cli::parse();
    trtcache::cli::init_tracing(cli.verbose);
    match trtcache::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
