//! The `trtcache` binary: parse arguments, install logging, hand over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = trtcache::cli::Cli::parse();
    if !matches!(cli.command, trtcache::cli::Command::Serve(_)) {
        // A command's output piped into `head` ends it quietly, as for any Unix tool, instead
        // of a "Broken pipe" panic. The daemon keeps Rust's default (SIGPIPE ignored): a
        // client that hangs up is an error on that connection, never the daemon's death.
        // SAFETY: setting a signal disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    trtcache::cli::init_tracing(cli.verbose);
    match trtcache::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Paths and reasons come from files and sockets: no terminal escape reaches the
            // terminal raw (the message's own line breaks are kept).
            eprintln!("error: {}", trtcache::cli::printable(&format!("{e:#}")));
            std::process::ExitCode::from(2)
        }
    }
}
