//! The shared timing cache: one file per (GPU SKU, TensorRT version) under
//! `CACHE_DIR/timing/`, loaded before every build on that GPU and TensorRT, and merged and
//! written back after it. Later builds of similar models skip the kernel timing the cache
//! already holds, which is most of a TensorRT build.
//!
//! [`TimingCacheStore::merge_and_store`] takes an exclusive `flock` on the file's `.lock`
//! sibling, re-reads the current cache (another build may have written it since this one
//! loaded), merges what the build produced into it (`ITimingCache::combine` through the shim,
//! [`Trt::combine_timing_caches`]) and replaces the file atomically (temp file, fsync,
//! rename), so concurrent builds never lose each other's entries and a reader never sees half
//! a cache. Both the `trt` and the `ort-tensorrt` backends are meant to use it: the latter
//! copies [`TimingCacheStore::load`] into the folder the TensorRT EP reads its timing cache
//! from and hands the EP's file back after the build.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::api::Trt;
use super::error::TrtError;
use crate::device::Sku;

/// The timing caches' folder in a cache directory.
pub const TIMING_DIR: &str = "timing";

/// The timing caches under a cache directory.
#[derive(Clone, Debug)]
pub struct TimingCacheStore {
    dir: PathBuf,
}

/// A file name from free text: letters, digits, `.`, `-`, `_` kept, the rest `_`.
fn safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

struct Lock(File);

impl Lock {
    fn exclusive(path: &Path) -> Result<Self, TrtError> {
        use std::os::unix::fs::OpenOptionsExt;
        // Never through a link planted in the cache (as the cache's own lock).
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(TrtError::io(path))?;
        // SAFETY: flock on an fd this struct owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(TrtError::io(path)(std::io::Error::last_os_error()));
        }
        Ok(Lock(f))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // SAFETY: unlocking our own fd (closing it would too).
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl TimingCacheStore {
    /// The store under `cache_dir` (`cache_dir/timing`).
    pub fn new(cache_dir: &Path) -> Self {
        Self {
            dir: cache_dir.join(TIMING_DIR),
        }
    }

    /// The store in `dir` itself (`BuildOptions::timing_cache_dir`).
    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// The folder holding the caches.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache file for a GPU SKU and TensorRT version: a readable name plus a digest of
    /// the whole SKU, so two SKUs never share a file even when their names sanitise alike.
    pub fn path_for(&self, sku: &Sku, tensorrt_version: &str) -> PathBuf {
        let canonical = serde_json::to_vec(sku).unwrap_or_default();
        let h = crate::spec::hex(&Sha256::digest(&canonical));
        self.dir.join(format!(
            "{}-cc{}-trt{}-{}.timing",
            safe(&sku.name),
            safe(sku.compute_capability.as_deref().unwrap_or("none")),
            safe(tensorrt_version),
            &h[..12]
        ))
    }

    /// The current cache, empty when there is none yet.
    pub fn load(&self, sku: &Sku, tensorrt_version: &str) -> Result<Vec<u8>, TrtError> {
        let p = self.path_for(sku, tensorrt_version);
        match std::fs::read(&p) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(TrtError::io(p)(e)),
        }
    }

    /// Merges `produced` (the cache a build returned) into the stored one with `merge(current,
    /// produced)` under the file's lock and writes the result back atomically. With no stored
    /// cache, `produced` is stored as it is. Returns the file's path.
    pub fn merge_and_store(
        &self,
        sku: &Sku,
        tensorrt_version: &str,
        produced: &[u8],
        merge: impl FnOnce(&[u8], &[u8]) -> Result<Vec<u8>, TrtError>,
    ) -> Result<PathBuf, TrtError> {
        std::fs::create_dir_all(&self.dir).map_err(TrtError::io(&self.dir))?;
        let path = self.path_for(sku, tensorrt_version);
        let mut lock_name = path.clone().into_os_string();
        lock_name.push(".lock");
        let _lock = Lock::exclusive(Path::new(&lock_name))?;
        let current = self.load(sku, tensorrt_version)?;
        let merged = if current.is_empty() {
            produced.to_vec()
        } else if produced.is_empty() {
            return Ok(path);
        } else {
            merge(&current, produced)?
        };
        let mut tmp =
            tempfile::NamedTempFile::new_in(&self.dir).map_err(TrtError::io(&self.dir))?;
        tmp.write_all(&merged).map_err(TrtError::io(tmp.path()))?;
        tmp.as_file().sync_all().map_err(TrtError::io(tmp.path()))?;
        tmp.persist(&path)
            .map_err(|e| TrtError::io(&path)(e.error))?;
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        tracing::debug!(path = %path.display(), bytes = merged.len(), "timing cache stored");
        Ok(path)
    }

    /// Moves the cache file for (`sku`, `tensorrt_version`) aside as
    /// `<name>.refused-<unix time>` (kept for a look, never read again), under the file's
    /// lock: what a build does when TensorRT refuses to attach it (written on another device
    /// property set, or corrupt), so the next build starts a fresh cache instead of failing
    /// for good. `None` when there was no file.
    pub fn quarantine(
        &self,
        sku: &Sku,
        tensorrt_version: &str,
    ) -> Result<Option<PathBuf>, TrtError> {
        let path = self.path_for(sku, tensorrt_version);
        if !path.exists() {
            return Ok(None);
        }
        let mut lock_name = path.clone().into_os_string();
        lock_name.push(".lock");
        let _lock = Lock::exclusive(Path::new(&lock_name))?;
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut moved = path.clone().into_os_string();
        moved.push(format!(".refused-{secs}"));
        let moved = PathBuf::from(moved);
        match std::fs::rename(&path, &moved) {
            Ok(()) => Ok(Some(moved)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(TrtError::io(&path)(e)),
        }
    }

    /// [`Self::merge_and_store`] merging with TensorRT's own `ITimingCache::combine`.
    /// `device` is the CUDA ordinal of the GPU `sku` describes (TensorRT checks the caches
    /// against it).
    pub fn merge_with(
        &self,
        trt: &Trt,
        device: i32,
        sku: &Sku,
        produced: &[u8],
    ) -> Result<PathBuf, TrtError> {
        let v = trt.version().to_string();
        self.merge_and_store(sku, &v, produced, |a, b| {
            trt.combine_timing_caches(device, a, b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sku(name: &str) -> Sku {
        Sku {
            kind: "gpu".into(),
            name: name.into(),
            compute_capability: Some("9.0".into()),
            sm_count: Some(132),
            isa: vec![],
        }
    }

    /// Line-set union: the stand-in for TensorRT's combine in these tests of the store's
    /// locking and file handling.
    fn union(a: &[u8], b: &[u8]) -> Result<Vec<u8>, TrtError> {
        let mut lines: Vec<&[u8]> = a
            .split(|&c| c == b'\n')
            .chain(b.split(|&c| c == b'\n'))
            .filter(|l| !l.is_empty())
            .collect();
        lines.sort();
        lines.dedup();
        Ok(lines.join(&b'\n'))
    }

    #[test]
    fn one_file_per_sku_and_version() {
        let d = tempfile::tempdir().unwrap();
        let s = TimingCacheStore::new(d.path());
        let a = s.path_for(&sku("NVIDIA H200"), "10.16.1");
        assert_ne!(a, s.path_for(&sku("NVIDIA H200"), "10.15.1"));
        assert_ne!(a, s.path_for(&sku("NVIDIA H100"), "10.16.1"));
        // Names that sanitise alike still differ by the digest.
        assert_ne!(s.path_for(&sku("a/b"), "10"), s.path_for(&sku("a_b"), "10"));
        assert!(a.starts_with(d.path().join("timing")));
        assert_eq!(
            s.load(&sku("NVIDIA H200"), "10.16.1").unwrap(),
            Vec::<u8>::new()
        );
    }

    #[test]
    fn concurrent_merges_keep_every_entry() {
        let d = tempfile::tempdir().unwrap();
        let s = TimingCacheStore::new(d.path());
        let k = sku("NVIDIA H200");
        std::thread::scope(|sc| {
            for t in 0..8 {
                let (s, k) = (&s, &k);
                sc.spawn(move || {
                    for i in 0..10 {
                        let entry = format!("tactic-{t}-{i}");
                        s.merge_and_store(k, "10.16.1", entry.as_bytes(), union)
                            .unwrap();
                    }
                });
            }
        });
        let got = String::from_utf8(s.load(&k, "10.16.1").unwrap()).unwrap();
        assert_eq!(got.lines().count(), 80, "{got}");
        // A failing merge leaves the stored cache as it was.
        let before = s.load(&k, "10.16.1").unwrap();
        let e = s
            .merge_and_store(&k, "10.16.1", b"x", |_, _| {
                Err(TrtError::InvalidArgument("refused".into()))
            })
            .unwrap_err();
        assert!(e.to_string().contains("refused"));
        assert_eq!(s.load(&k, "10.16.1").unwrap(), before);
    }
}
