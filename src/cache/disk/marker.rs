//! What makes a folder a trtcache cache, and which names inside it the store may delete.
//!
//! A cache folder carries `CACHEDIR.TAG` (the Cache Directory Tagging Specification's file, so
//! backup tools skip it) with a trtcache line, written when the store creates the folder or
//! adopts an empty one. Opening refuses an existing non-empty folder without it: `--cache-dir .`
//! or a project's own `cache/` is never taken over, cleaned or listed as a cache. A cache made
//! by a trtcache that predates the marker (its `db/conf` and `records/` are there) is adopted
//! and tagged, so upgrades keep their artifacts.
//!
//! Inside a cache the store deletes only what carries its own naming ([`own_temp`],
//! [`own_blob`], [`own_quarantine`]): anything else a user put there is left alone and logged.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::cache::store::StoreError;

/// The marker's file name.
pub const MARKER: &str = "CACHEDIR.TAG";

/// The marker's content: the specification's signature line, then ours.
const MARKER_TEXT: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by trtcache.\n\
# It marks a trtcache artifact cache (https://bford.info/cachedir/); trtcache deletes files\n\
# only in folders that carry it, and only names it created itself.\n\
trtcache-cache: 1\n";

/// The line that tells our tag from another program's (cargo's `target/` has a tag too).
const OUR_LINE: &str = "trtcache-cache:";

/// How a folder stands as a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Does not exist: the store may create it.
    Missing,
    /// Exists and is empty (but for a `.gitkeep`): the store may make it a cache.
    Empty,
    /// Carries our marker.
    Tagged,
    /// An older trtcache's cache (index and manifests, no marker): adopted when opened for
    /// writing.
    Legacy,
    /// Anything else: never opened as a cache. A few of its entries, for the message.
    Foreign(Vec<String>),
}

/// Reads how `dir` stands, touching nothing.
pub fn standing(dir: &Path) -> Result<Standing, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Standing::Missing),
        Err(e) => return Err(StoreError::io(dir, e)),
    };
    // Still empty: a checkout's `.gitkeep` (git keeps the empty `cache/` folder with it),
    // and what a daemon starting on the folder may have made before it opened its store: its
    // socket (`CACHE/trtcache.sock` by default) and that socket's ready index.
    let names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| !made_before_the_store(e))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        return Ok(Standing::Empty);
    }
    if is_tagged(dir) {
        return Ok(Standing::Tagged);
    }
    if dir.join("db/conf").is_file() && dir.join("records").is_dir() {
        return Ok(Standing::Legacy);
    }
    let mut sample = names;
    sample.sort();
    sample.truncate(5);
    Ok(Standing::Foreign(sample))
}

/// `.gitkeep`, a socket, a `NAME.sock.ready` folder, or the marker's temp file of another
/// trtcache tagging the folder right now ([`tag`]: a `.tmp-XXXXXX` file written in the last
/// [`TAGGING_SECS`] seconds): two commands claiming one new folder at once (a daemon starting
/// while `status` reads the cache) both adopt it instead of one refusing it as foreign.
fn made_before_the_store(e: &std::fs::DirEntry) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let name = e.file_name();
    let name = name.to_string_lossy();
    let Ok(t) = e.file_type() else {
        return false;
    };
    // Another trtcache of this user only: a file of that name from someone else keeps the
    // folder foreign (it is never adopted, nor later cleaned up as our leftover).
    let tagging = || {
        use std::os::unix::fs::MetadataExt;
        t.is_file()
            && name.starts_with(".tmp-")
            && own_temp(&name)
            && e.metadata().ok().is_some_and(|m| {
                // SAFETY: geteuid has no preconditions.
                m.uid() == unsafe { libc::geteuid() }
                    && m.modified()
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age.as_secs() < TAGGING_SECS)
            })
    };
    name == ".gitkeep"
        || t.is_socket()
        || (t.is_dir() && name.ends_with(".sock.ready"))
        || tagging()
}

/// How young a `.tmp-XXXXXX` file must be to count as another trtcache's tagging in
/// progress (an older one is someone's file: the folder is not empty).
const TAGGING_SECS: u64 = 60;

/// Whether every entry of `dir` carries a name of the store's own layout (what is left of a
/// cache while `rm -rf` deletes it, or just after): `lock`, `db`, `blobs`, `tmp`,
/// `quarantine`, `records`, the digest memo, the tag, `db.corrupt-*`, temp files, and what
/// [`made_before_the_store`] allows.
pub fn only_own_names(dir: &Path) -> bool {
    const OWN: [&str; 10] = [
        MARKER,
        "lock",
        "db",
        "blobs",
        "tmp",
        "quarantine",
        "records",
        "timing",
        "digests.json",
        "digests.json.log",
    ];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(|e| e.ok()).all(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        made_before_the_store(&e)
            || OWN.contains(&name.as_ref())
            || name.starts_with("db.corrupt-")
            || own_temp(&name)
            || (name.starts_with(".digests.") && name.ends_with(".tmp"))
    })
}

/// Whether `dir` carries our marker.
pub fn is_tagged(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(MARKER))
        .map(|t| {
            t.starts_with("Signature: 8a477f597d28d172789f06886806bc55") && t.contains(OUR_LINE)
        })
        .unwrap_or(false)
}

/// The error for a folder that is not a cache.
pub fn not_a_cache(dir: &Path, sample: Vec<String>) -> StoreError {
    StoreError::NotACache {
        dir: dir.to_path_buf(),
        holds: sample,
    }
}

/// Writes the marker into `dir` (durably: temp file, fsync, rename).
pub fn tag(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(MARKER);
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .map_err(|e| StoreError::io(dir, e))?;
    tmp.write_all(MARKER_TEXT.as_bytes())
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(|e| StoreError::io(&path, e))?;
    // Readable by anyone who can reach the folder (backup tools read it); nothing secret.
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(|e| StoreError::io(&path, e))?;
    tmp.persist(&path)
        .map_err(|e| StoreError::io(&path, e.error))?;
    Ok(())
}

/// Names that the store's temp files and folders get from `tempfile` (`prefix` + 6
/// alphanumerics): `build-`/`commit-` staging folders in `tmp/`, `.tmp-` files anywhere.
pub fn own_temp(name: &str) -> bool {
    ["build-", "commit-", ".tmp-"].iter().any(|p| {
        name.strip_prefix(p)
            .is_some_and(|rest| rest.len() == 6 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
    })
}

/// A blob folder's name: a SHA-256 digest in lowercase hex.
pub fn own_blob(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A quarantined blob's name: `<digest>-<unix secs>[-<n>]`.
pub fn own_quarantine(name: &str) -> bool {
    let Some((digest, rest)) = name.split_at_checked(64) else {
        return false;
    };
    own_blob(digest)
        && rest.strip_prefix('-').is_some_and(|r| {
            !r.is_empty()
                && r.split('-')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Removes `p` (a folder recursively, without following links; a file or link itself).
pub fn remove(p: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(p)?;
    if m.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}

/// Entries of `dir` whose name passes `named`.
pub fn matching(dir: &Path, named: fn(&str) -> bool) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| named(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(own_temp("build-a1B2c3") && own_temp("commit-zzzzzz") && own_temp(".tmp-AbC123"));
        // Another trtcache tagging a new folder right now leaves it claimable; an old file
        // of that name is someone's, and the folder is not empty.
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(".tmp-Ab12Cd"), "trtcache").unwrap();
        assert!(matches!(standing(d.path()).unwrap(), Standing::Empty));
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(d.path().join(".tmp-Ab12Cd"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(matches!(standing(d.path()).unwrap(), Standing::Foreign(_)));
        assert!(!own_temp("thesis.tex") && !own_temp("build-") && !own_temp("build-abc/def"));
        let d = "0123456789abcdef".repeat(4);
        assert!(own_blob(&d) && !own_blob("photo.jpg") && !own_blob(&d.to_uppercase()));
        assert!(own_quarantine(&format!("{d}-1700000000")));
        assert!(own_quarantine(&format!("{d}-1700000000-2")));
        assert!(
            !own_quarantine(&d) && !own_quarantine(&format!("{d}-x")) && !own_quarantine("notes")
        );
    }

    #[test]
    fn remains_of_a_cache_are_told_from_a_users_folder() {
        let d = tempfile::tempdir().unwrap();
        for sub in ["db", "blobs", "tmp", "records"] {
            std::fs::create_dir(d.path().join(sub)).unwrap();
        }
        std::fs::write(d.path().join("lock"), b"1").unwrap();
        assert!(only_own_names(d.path()));
        std::fs::write(d.path().join("thesis.tex"), b"x").unwrap();
        assert!(!only_own_names(d.path()));
    }

    #[test]
    fn standings() {
        let d = tempfile::tempdir().unwrap();
        let c = d.path().join("c");
        assert_eq!(standing(&c).unwrap(), Standing::Missing);
        std::fs::create_dir(&c).unwrap();
        assert_eq!(standing(&c).unwrap(), Standing::Empty);
        std::fs::write(c.join(".gitkeep"), b"").unwrap();
        std::fs::create_dir(c.join("trtcache.sock.ready")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(c.join("trtcache.sock")).unwrap();
        assert_eq!(standing(&c).unwrap(), Standing::Empty);
        std::fs::write(c.join("thesis.tex"), b"x").unwrap();
        assert_eq!(
            standing(&c).unwrap(),
            Standing::Foreign(vec!["thesis.tex".into()])
        );
        std::fs::remove_file(c.join(".gitkeep")).unwrap();
        // Another program's tag is not ours.
        std::fs::write(
            c.join(MARKER),
            "Signature: 8a477f597d28d172789f06886806bc55\n",
        )
        .unwrap();
        assert!(matches!(standing(&c).unwrap(), Standing::Foreign(_)));
        tag(&c).unwrap();
        assert_eq!(standing(&c).unwrap(), Standing::Tagged);
        let l = d.path().join("legacy");
        std::fs::create_dir_all(l.join("db")).unwrap();
        std::fs::create_dir_all(l.join("records")).unwrap();
        std::fs::write(l.join("db/conf"), b"").unwrap();
        assert_eq!(standing(&l).unwrap(), Standing::Legacy);
    }
}
