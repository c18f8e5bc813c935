//! One owner per cache directory: an advisory `flock` on `DIR/lock` holding the owner's pid.
//!
//! Enters: a cache directory. Leaves: a [`DirLock`] held until dropped, or
//! [`StoreError::InUse`] naming the pid that holds it. sled's own lock error has kind `Other`
//! and no pid, so the store takes this lock before it opens sled.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::store::StoreError;

/// How long [`DirLock::acquire`] waits for a lock whose recorded owner is no longer alive.
/// An owner killed while it was starting a child (a build worker between `fork` and `exec`)
/// leaves that child holding the lock's descriptor for a moment; a restart right after the
/// kill (systemd's, a crash test's `verify`) must not mistake it for a live owner.
pub const DEAD_OWNER_GRACE: Duration = Duration::from_secs(2);

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
        let started = Instant::now();
        loop {
            // SAFETY: flock on a valid, owned file descriptor.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(err));
            }
            let mut s = String::new();
            let _ = file.seek(SeekFrom::Start(0));
            let _ = file.read_to_string(&mut s);
            let pid: Option<u32> = s.trim().parse().ok();
            if let Some(dead) = pid.filter(|&p| !alive(p)) {
                if started.elapsed() < DEAD_OWNER_GRACE {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                tracing::warn!(
                    dir = %dir.display(),
                    pid = dead,
                    "the cache's recorded owner is gone but its lock is still held after {DEAD_OWNER_GRACE:?} (a process it started?)"
                );
            }
            return Err(StoreError::InUse {
                dir: dir.to_path_buf(),
                pid,
            });
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(Self { _file: file })
    }
}

/// Whether a process with this pid exists (one of another user's counts).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 checks existence and permission only.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_after_its_owner_died_is_waited_for() {
        // The owner recorded in the file is gone (a reaped child), but another descriptor
        // still holds the lock, as a dead daemon's half-started worker would: acquire waits
        // for its release instead of failing at once.
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert!(!alive(dead));
        let path = dir.path().join("lock");
        std::fs::write(&path, format!("{dead}\n")).unwrap();
        let holder = File::open(&path).unwrap();
        // SAFETY: flock on a valid, owned file descriptor.
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(holder);
        });
        let t = Instant::now();
        let lock = DirLock::acquire(dir.path()).expect("waited for the dead owner's lock");
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
        release.join().unwrap();
        drop(lock);
        // A live owner (this process) is refused at once, as before.
        let first = DirLock::acquire(dir.path()).unwrap();
        match DirLock::acquire(dir.path()) {
            Err(StoreError::InUse { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("unexpected {other:?}"),
        }
        drop(first);
    }

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
