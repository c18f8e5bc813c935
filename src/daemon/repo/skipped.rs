//! What a scan found that is not a model ([`Skipped`], with the reason), and which of those
//! were already warned about ([`Warned`]): a rescan every few seconds logs each once.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// An entry of the repository that is not (part of) a model, and why.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// Skipped entries already warned about, so that a rescan every few seconds does not repeat
/// the same warning: each is logged when it first appears (again after it went away).
#[derive(Default)]
pub struct Warned(std::sync::Mutex<BTreeSet<Skipped>>);

impl Warned {
    /// Warns about what is new in `skipped`; a full scan's list replaces what was seen (an
    /// entry fixed and broken again is news again), a targeted scan's adds to it.
    pub fn report(&self, skipped: &[Skipped], full: bool) {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for s in skipped.iter().filter(|s| !seen.contains(*s)) {
            // `?`: the path quoted and escaped, so no control character in a file name reaches
            // the log (or a terminal following it) raw.
            tracing::warn!(path = ?s.path, "skipped: {}", s.reason);
        }
        if full {
            *seen = skipped.iter().cloned().collect();
        } else {
            seen.extend(skipped.iter().cloned());
        }
    }
}
