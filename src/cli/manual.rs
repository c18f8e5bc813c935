//! `trtcache completions SHELL` (clap_complete) and `trtcache man [COMMAND]` (clap_mangen):
//! both generated from the same clap definitions as `--help`, so they cannot drift from it.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

/// Print a shell completion script on stdout, e.g.
/// `trtcache completions bash > /etc/bash_completion.d/trtcache`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// Print the man page (roff) on stdout: `trtcache man | man -l -`, or
/// `trtcache man > /usr/local/share/man/man1/trtcache.1`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// A subcommand's page (`trtcache-serve(1)`) instead of the overview.
    pub command: Option<String>,
}

/// `cmd`: the whole command line's definition (`Cli::command()`).
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut cmd, "trtcache", &mut out);
    out.flush().context("writing the completions")?;
    Ok(ExitCode::SUCCESS)
}

/// `cmd`: the whole command line's definition (`Cli::command()`).
pub fn man(a: ManArgs, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    cmd.build();
    let page = match &a.command {
        None => cmd,
        Some(name) => {
            let sub = cmd
                .get_subcommands()
                .find(|s| s.get_name() == name && !s.is_hide_set())
                .with_context(|| format!("no subcommand `{name}` (see `trtcache --help`)"))?;
            sub.clone().name(format!("trtcache-{name}"))
        }
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut out)
        .context("rendering the man page")?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&out)
        .and_then(|()| stdout.flush())
        .context("writing the man page")?;
    Ok(ExitCode::SUCCESS)
}
