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
    // `run` installs the logging (`cli::log`) once it knows the format.
    match trtcache::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            trtcache::cli::log::report_error(&e);
            std::process::ExitCode::from(2)
        }
    }
}
