//! One owner per cache directory: an advisory `flock` on `DIR/lock` holding the owner's pid.
//!
//! Enters: a cache directory. Leaves: a [`DirLock`] held until dropped, or
//! [`StoreError::InUse`] naming the pid that holds it. sled's own lock error has kind `Other`
//! and no pid, so the store takes this lock before it opens sled.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

use super::StoreError;

/// An exclusive lock on a cache directory; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock on `dir/lock` without waiting.
    pub fn acquire(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join("lock");
        let io = |source| StoreError::io(&path, source);
        // Never through a link: a root-run command would otherwise truncate whatever
        // `lock` points at (see `files`).
        let mut file = super::files::open_rw(&path, 0o640).map_err(io)?;
        // SAFETY: flock on a valid, owned file descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut s = String::new();
                let _ = file.read_to_string(&mut s);
                return Err(StoreError::InUse {
                    dir: dir.to_path_buf(),
                    pid: s.trim().parse().ok(),
                });
            }
            return Err(io(err));
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_names_the_owner_pid() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err();
        match &err {
            StoreError::InUse { pid, .. } => assert_eq!(*pid, Some(std::process::id())),
            other => panic!("unexpected {other}"),
        }
        assert!(err.to_string().contains("in use by pid"));
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_linked_lock_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("passwd");
        std::fs::write(&target, b"root:x:0:0\n").unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::os::unix::fs::symlink(&target, cache.join("lock")).unwrap();
        let e = DirLock::acquire(&cache).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"root:x:0:0\n");
    }
}
