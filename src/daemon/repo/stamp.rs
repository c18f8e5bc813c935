//! What the watcher compares of a model's files: a [`FileStamp`] per file (size, mtime, ctime
//! and mode), a model's [`Fingerprint`] the list of them. Taken by the scan, compared by the
//! watcher, quoted by the ready index's pointers.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What the watcher compares of each file a model version is made of, sorted by path.
pub type Fingerprint = Vec<FileStamp>;

/// One file's size, mtime, ctime and mode. ctime and mode are in it so that a `chmod` (a
/// model that was unreadable made readable) counts as a change and the model is planned
/// again, though its content and mtime are the same.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileStamp {
    pub path: PathBuf,
    pub size: u64,
    pub mtime: Option<SystemTime>,
    pub ctime_ns: i128,
    pub mode: u32,
}

impl FileStamp {
    /// The stamp of `p` (following links, as the build reads it); `None` when it cannot be
    /// stat'ed.
    pub fn of(p: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(p).ok()?;
        Some(FileStamp {
            path: p.to_path_buf(),
            size: m.len(),
            mtime: m.modified().ok(),
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
            mode: m.mode(),
        })
    }

    /// The stamp of a file a model names that does not exist (yet): no time, no mode.
    pub fn missing(p: &Path) -> FileStamp {
        FileStamp {
            path: p.to_path_buf(),
            size: 0,
            mtime: None,
            ctime_ns: 0,
            mode: 0,
        }
    }

    /// Whether this is [`FileStamp::missing`]'s.
    pub fn is_missing(&self) -> bool {
        self.mtime.is_none() && self.mode == 0
    }
}
