//! Logging: installs the tracing subscriber every command runs with (ort reports provider
//! fallbacks only through tracing) and reports a command's final error in the same format.
//!
//! What decides the output: the level from `-v` (the daemon logs at `info` at least, so
//! builds, failures and evictions show at its default), `RUST_LOG` over that; the format
//! from `--log-format` (else the config's `log_format` for `serve`); and where stderr goes:
//! colour only at a terminal, and when stderr is the journal (`JOURNAL_STREAM` names its
//! device and inode) text lines have no timestamp (journald adds its own) and start with a
//! syslog priority (`<4>` for a warning), so `journalctl -p warning` filters them.

use std::sync::OnceLock;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use crate::config::LogFormat;

/// The format the installed subscriber writes, for [`report_error`].
static INSTALLED: OnceLock<LogFormat> = OnceLock::new();

/// How to log: `-v` count, whether this process is the daemon, and the format.
#[derive(Clone, Copy, Debug)]
pub struct LogSettings {
    pub verbose: u8,
    pub daemon: bool,
    pub format: LogFormat,
}

impl LogSettings {
    /// The filter when `RUST_LOG` is unset: `warn` for commands, `info` for the daemon,
    /// one step more per `-v`.
    fn default_filter(&self) -> &'static str {
        match self.verbose.max(u8::from(self.daemon)) {
            0 => "warn,ort=warn",
            1 => "info,ort=warn",
            2 => "debug,ort=info",
            _ => "trace",
        }
    }
}

/// Installs the subscriber on stderr (once per process; later calls do nothing).
pub fn init(s: LogSettings) {
    use std::io::IsTerminal;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(s.default_filter()));
    let journal = stderr_is_journal();
    let layer = match s.format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_target(false)
            .boxed(),
        LogFormat::Text if journal => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .event_format(Journal(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_target(false),
            ))
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colour only for a person at a terminal: never in journald, files or pipes.
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .boxed(),
    };
    if tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init()
        .is_ok()
    {
        let _ = INSTALLED.set(s.format);
    }
}

/// Prints the error that ends the command: `error: …` on stderr, or an `error` event when
/// the logs are JSON (a shipper parsing the daemon's stderr then sees why it stopped).
pub fn report_error(e: &anyhow::Error) {
    // Paths and reasons in the chain came from files: no terminal escape reaches stderr raw.
    let text = super::output::printable(&format!("{e:#}"));
    if INSTALLED.get() == Some(&LogFormat::Json) {
        tracing::error!(error = %text, "stopped");
    } else {
        eprintln!("error: {text}");
    }
}

/// Whether stderr is the journal: systemd sets `JOURNAL_STREAM=DEV:INODE` for a service whose
/// output goes there; a child whose stderr was redirected elsewhere inherits the variable, so
/// the descriptor itself must match.
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    meta.dev() == dev && meta.ino() == ino
}

/// The default text format with a syslog priority prefix, which journald strips and records
/// as the line's priority.
struct Journal<F>(F);

impl<S, N, F> FormatEvent<S, N> for Journal<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let priority = match *event.metadata().level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            _ => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_logs_at_info_by_default_and_commands_at_warn() {
        let s = |verbose, daemon| LogSettings {
            verbose,
            daemon,
            format: LogFormat::Text,
        };
        assert_eq!(s(0, true).default_filter(), "info,ort=warn");
        assert_eq!(s(1, true).default_filter(), "info,ort=warn");
        assert_eq!(s(2, true).default_filter(), "debug,ort=info");
        assert_eq!(s(0, false).default_filter(), "warn,ort=warn");
        assert_eq!(s(1, false).default_filter(), "info,ort=warn");
    }
}
