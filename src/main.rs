//! The `trtcache` binary: parse arguments, install logging, hand over to the library.

use clap::Parser;

/// mimalloc: the analysis of large graphs makes hundreds of thousands of small allocations
/// (names, shapes), where it is measurably faster than glibc's allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
