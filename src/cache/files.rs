//! How the cache creates what it writes: files are opened with `O_NOFOLLOW` (and, as every
//! descriptor std opens, `O_CLOEXEC`), so a symbolic link planted in a cache folder never
//! makes a root-run `trtcache` truncate or write whatever it points at; folders and files
//! get their mode explicitly after creation, because the umask applies at `mkdir`/`open`.
//!
//! Enters: paths inside a cache folder and the mode each should have. Leaves: an open
//! [`File`], or an I/O error (`ELOOP` for a link, which [`refused_link`] words).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of the cache root and its folders: the daemon's group may search them (consumers in
/// it open artifact files through a directory descriptor), others nothing.
pub const DIR_MODE: u32 = 0o750;
/// Mode of the sled index folder and its files: the owner's only.
pub const INDEX_DIR_MODE: u32 = 0o700;
pub const INDEX_FILE_MODE: u32 = 0o600;

/// Creates `dir` and any missing parents with `mode` (applied with `chmod` after each
/// `mkdir`, so the umask cannot widen or narrow it). Folders that exist are left as they are.
pub fn create_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir(parent, mode)?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)),
        // Created by someone else meanwhile: theirs to have made.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens `path` for reading and writing, creating it with `mode` when absent; never follows
/// a symbolic link at `path` (the open fails with `ELOOP`) and never truncates.
pub fn open_rw(path: &Path, mode: u32) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(refused_link)?;
    // Only a regular file is ours to write (a FIFO would block, a device is not a lock).
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::other(
            "is not a regular file; trtcache refuses to write it (remove it)",
        ));
    }
    Ok(f)
}

/// `ELOOP` from an `O_NOFOLLOW` open, said as what it means (callers name the path).
pub fn refused_link(e: std::io::Error) -> std::io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        std::io::Error::other(
            "is a symbolic link; trtcache never writes through a link in its cache (remove it)",
        )
    } else {
        e
    }
}

/// Sets the sled index's folder to [`INDEX_DIR_MODE`] and every file directly in it to
/// [`INDEX_FILE_MODE`]; sled creates them with the process's umask. Links are skipped.
pub fn restrict_index(db: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(db)?;
    if !m.is_dir() {
        return Ok(());
    }
    if m.permissions().mode() & 0o7777 != INDEX_DIR_MODE {
        std::fs::set_permissions(db, std::fs::Permissions::from_mode(INDEX_DIR_MODE))?;
    }
    for e in std::fs::read_dir(db)?.flatten() {
        // Gone since it was listed (see below): nothing to restrict.
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        let want = if m.is_dir() {
            INDEX_DIR_MODE
        } else if m.is_file() {
            INDEX_FILE_MODE
        } else {
            continue;
        };
        if m.permissions().mode() & 0o7777 != want {
            match std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(want)) {
                // sled's own threads remove snapshot temp files while the store opens.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => r?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn modes_are_explicit_whatever_the_umask() {
        let d = tempfile::tempdir().unwrap();
        // SAFETY: umask only changes this process's file-creation mask.
        let old = unsafe { libc::umask(0o000) };
        let dir = d.path().join("a/b");
        let r = create_dir(&dir, DIR_MODE);
        let f = open_rw(&dir.join("lock"), 0o600);
        unsafe { libc::umask(old) };
        r.unwrap();
        drop(f.unwrap());
        assert_eq!(mode(&dir), 0o750);
        assert_eq!(mode(&d.path().join("a")), 0o750);
        assert_eq!(mode(&dir.join("lock")), 0o600);
    }

    #[test]
    fn a_link_is_never_opened_for_writing() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        let link = d.path().join("lock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_rw(&link, 0o600).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    }
}
