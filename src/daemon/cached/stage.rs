//! The private copy a daemon build runs on (`CACHE/tmp/build-…/`): the model's graph and its
//! external-data files, with their names relative to the graph. ONNX Runtime and the key
//! read files by path (and map external data), so a repository file replaced or rewritten in
//! place during a build would otherwise be built under the key of other content, or kill the
//! daemon with SIGBUS when a mapped file shrinks.
//!
//! The copy costs the cache only the bytes the originals hold: an external-data file is
//! cloned where the file system can (`FICLONE`: no bytes written), else copied extent by
//! extent (`SEEK_DATA`/`SEEK_HOLE`) with runs of zeros left as holes, so a 2 GiB sparse file
//! holding 16 KiB of weights stages as 16 KiB, with the same content (and key). A file whose
//! data does not fit in what the cache's file system has free is refused before a byte is
//! written, naming the file: the model's final answer, not a full disk blamed on the machine
//! and retried for ever.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::super::build_cache::{BuildCacheError, ModelEntry};
use crate::cache::StoreError;
use crate::key::memo::FileId;
use crate::onnx::Model;

/// Bytes read and written at a time when copying a data extent.
const CHUNK: usize = 1 << 20;

/// File-system identity (device, inode, size, mtime, ctime) of each file; `None` for a file
/// that cannot be read.
fn identity<'a>(files: impl IntoIterator<Item = &'a Path>) -> Vec<Option<FileId>> {
    files.into_iter().map(|p| FileId::of(p).ok()).collect()
}

/// Copies a model's graph and external-data files into `dir` (see the module docs) and
/// returns the copy's graph path. Files are read with plain reads; a file that changes while
/// it is copied is reported as [`BuildCacheError::Changed`] (the key check would catch the mixed
/// copy anyway).
pub(super) fn snapshot(model: &ModelEntry, dir: &Path) -> Result<PathBuf, BuildCacheError> {
    let changed = |why: String| {
        BuildCacheError::Changed(
            format!("`{}` changed since it was planned ({why})", model.name).into(),
        )
    };
    let graph = Model::read(&model.path).map_err(|e| changed(e.to_string()))?;
    let files: Vec<&Path> = std::iter::once(model.path.as_path())
        .chain(graph.external_files.iter().map(|f| f.path.as_path()))
        .collect();
    let before = identity(files.iter().copied());
    let name = model
        .path
        .file_name()
        .ok_or_else(|| changed("no file name".into()))?;
    let copy = dir.join(name);
    // The copy goes to the cache's staging folder: failing to write there (no space, a
    // read-only or failing file system, the folder deleted) is the cache's condition,
    // reported as such and never remembered as the model's failure.
    let full = |what: &Path, e: io::Error| {
        BuildCacheError::Storage(
            format!(
                "staging a copy of {} for the build: {}",
                what.display(),
                StoreError::io(dir, e)
            )
            .into(),
        )
    };
    std::fs::write(&copy, &graph.bytes).map_err(|e| full(&model.path, e))?;
    for f in &graph.external_files {
        // The loader checked every location stays inside the model's folder.
        let to = dir.join(&f.location);
        if to.symlink_metadata().is_ok() {
            // The same file under another spelling of its location (`w.bin`, `./w.bin`).
            continue;
        }
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| full(&f.path, e))?;
        }
        match copy_sparse(&f.path, &to, free_bytes(dir)) {
            Ok(()) => {}
            Err(Staging::TooBig { data, free }) => {
                return Err(BuildCacheError::Invalid(
                    format!(
                        "{}: staging a copy for the build needs {data} bytes (the file's data, holes left out) but the cache's file system has {free} bytes free ({}); free space there or give the cache a larger file system",
                        f.path.display(),
                        dir.display()
                    )
                    .into(),
                ))
            }
            Err(Staging::Write(e)) => return Err(full(&f.path, e)),
            Err(Staging::Read(e)) => return Err(changed(format!("{}: {e}", f.path.display()))),
        }
    }
    if identity(files.iter().copied()) != before || before.iter().any(Option::is_none) {
        return Err(changed("rewritten while it was copied".into()));
    }
    Ok(copy)
}

/// Why [`copy_sparse`] failed.
#[derive(Debug)]
enum Staging {
    /// Reading the original failed (it vanished, was truncated, an I/O error).
    Read(io::Error),
    /// Writing the copy failed (no space, the folder deleted, an I/O error).
    Write(io::Error),
    /// The original's data is more than the destination's file system has free.
    TooBig { data: u64, free: u64 },
}

/// Copies `from` to the new file `to` with the same length and content, writing only its
/// data: a clone where the file system shares extents, else each data extent (holes stay
/// holes, and so do whole chunks of zeros inside extents), refused when the data is more
/// than `free` bytes (what the destination's file system has free, when known).
fn copy_sparse(from: &Path, to: &Path, free: Option<u64>) -> Result<(), Staging> {
    let src = File::open(from).map_err(Staging::Read)?;
    let len = src.metadata().map_err(Staging::Read)?.len();
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(Staging::Write)?;
    // SAFETY: FICLONE takes the source descriptor as its argument; both stay open.
    if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0 {
        return Ok(());
    }
    let extents = data_extents(&src, len).map_err(Staging::Read)?;
    let data: u64 = extents.iter().map(|(a, b)| b - a).sum();
    if let Some(free) = free {
        if data > free {
            drop(dst);
            let _ = std::fs::remove_file(to);
            return Err(Staging::TooBig { data, free });
        }
    }
    dst.set_len(len).map_err(Staging::Write)?;
    let mut buf = vec![0u8; CHUNK.min(len as usize).max(1)];
    for (start, end) in extents {
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            src.read_exact_at(&mut buf[..n], at)
                .map_err(Staging::Read)?;
            if buf[..n].iter().any(|&b| b != 0) {
                dst.write_all_at(&buf[..n], at).map_err(Staging::Write)?;
            }
            at += n as u64;
        }
    }
    Ok(())
}

/// The `(start, end)` byte ranges of `file` that hold data, from `SEEK_DATA`/`SEEK_HOLE`;
/// the whole file where the file system cannot tell.
fn data_extents(file: &File, len: u64) -> io::Result<Vec<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let seek = |off: u64, whence| -> io::Result<Option<u64>> {
        // SAFETY: lseek on a descriptor we own; the offset is checked by the kernel.
        let r = unsafe { libc::lseek(fd, off as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // No data past `off`.
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        }
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let start = match seek(at, libc::SEEK_DATA) {
            Ok(Some(s)) => s,
            Ok(None) => break,
            // The file system does not support it: all of the file is data.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(vec![(0, len)]),
            Err(e) => return Err(e),
        };
        let end = seek(start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        if end <= start {
            break;
        }
        out.push((start, end));
        at = end;
    }
    Ok(out)
}

/// Bytes an unprivileged writer may still use on the file system holding `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    crate::cache::free_bytes(path).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_file_is_copied_with_its_content_and_without_its_holes() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("weights.bin");
        let f = File::create(&from).unwrap();
        f.write_all_at(&[7u8; 16 << 10], 4096).unwrap();
        f.write_all_at(b"tail", (1 << 30) - 4).unwrap();
        f.set_len(1 << 30).unwrap();
        drop(f);
        let to = dir.path().join("copy.bin");
        copy_sparse(&from, &to, free_bytes(dir.path())).unwrap();
        let (a, b) = (from.metadata().unwrap(), to.metadata().unwrap());
        assert_eq!(a.len(), b.len());
        // Allocated: the data's blocks (and file system overhead), never the gigabyte.
        assert!(
            b.blocks() * 512 < 4 << 20,
            "{} bytes allocated",
            b.blocks() * 512
        );
        let (src, dst) = (File::open(&from).unwrap(), File::open(&to).unwrap());
        for off in [0u64, 4096, 8192, (1 << 30) - 4] {
            let (mut x, mut y) = ([0u8; 4], [0u8; 4]);
            src.read_exact_at(&mut x, off).unwrap();
            dst.read_exact_at(&mut y, off).unwrap();
            assert_eq!(x, y, "at {off}");
        }
    }

    #[test]
    fn data_that_cannot_fit_is_refused_before_a_byte_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("weights.bin");
        std::fs::write(&from, vec![1u8; 64 << 10]).unwrap();
        assert!(free_bytes(dir.path()).is_some_and(|b| b > 0));
        let to = dir.path().join("copy.bin");
        match copy_sparse(&from, &to, Some(4096)) {
            Err(Staging::TooBig { data, free }) => {
                assert_eq!((data, free), (64 << 10, 4096));
                assert!(!to.exists(), "nothing left behind");
            }
            // A file system that clones extents (btrfs, XFS) needs no room for the copy.
            Ok(()) => std::fs::remove_file(&to).unwrap(),
            other => panic!("{other:?}"),
        }
        // With room, the same file copies whole.
        copy_sparse(&from, &to, Some(1 << 20)).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), std::fs::read(&from).unwrap());
    }
}
