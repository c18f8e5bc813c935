//! Content hashing of model files, in parallel.
//!
//! The digest of one file ([`TREE_SCHEME`]) is a one-level SHA-256 tree so that one big file
//! can be hashed on every core: the file is cut into [`CHUNK`]-byte chunks (the last one
//! shorter), each chunk is hashed with SHA-256, and the file digest is
//!
//! ```text
//! SHA-256( "trtcache-tree-v1\0" || u64le(file size) || u64le(CHUNK) || H(chunk 0) || … || H(chunk n-1) )
//! ```
//!
//! (an empty file has no chunks). It is *not* equal to `sha256sum`'s output; [`plain_sha256`]
//! gives that when asked (`trtcache key --sha256`). sha2 0.11 detects the CPU's SHA
//! instructions (x86 SHA-NI, ARMv8 SHA2) at run time, so no feature flag is needed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// Chunk size of the tree digest: 4 MiB (part of the digest's definition).
pub const CHUNK: usize = 4 << 20;

/// Name of the per-file digest scheme, recorded in the digest memo.
pub const TREE_SCHEME: &str = "trtcache-tree-v1/sha256/4MiB";

/// Threads to hash with by default: the available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Tree digests of several byte slices (whole files), chunks spread over `threads` threads.
pub fn tree_digests(files: &[&[u8]], threads: usize) -> Vec<[u8; 32]> {
    let jobs: Vec<(usize, usize)> = files
        .iter()
        .enumerate()
        .flat_map(|(f, d)| (0..d.len().div_ceil(CHUNK)).map(move |c| (f, c)))
        .collect();
    let mut leaves: Vec<Vec<[u8; 32]>> = files
        .iter()
        .map(|d| vec![[0u8; 32]; d.len().div_ceil(CHUNK)])
        .collect();
    let threads = threads.clamp(1, jobs.len().max(1));
    if threads == 1 {
        for &(f, c) in &jobs {
            leaves[f][c] = leaf(files[f], c);
        }
    } else {
        let next = AtomicUsize::new(0);
        let done = Mutex::new(Vec::with_capacity(jobs.len()));
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(f, c)) = jobs.get(i) else { break };
                        mine.push((f, c, leaf(files[f], c)));
                    }
                    if let Ok(mut d) = done.lock() {
                        d.extend(mine);
                    }
                });
            }
        });
        for (f, c, h) in done.into_inner().unwrap_or_default() {
            leaves[f][c] = h;
        }
    }
    files
        .iter()
        .zip(leaves)
        .map(|(d, l)| root(d.len() as u64, &l))
        .collect()
}

fn leaf(data: &[u8], c: usize) -> [u8; 32] {
    let end = ((c + 1) * CHUNK).min(data.len());
    Sha256::digest(&data[c * CHUNK..end]).into()
}

fn root(size: u64, leaves: &[[u8; 32]]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"trtcache-tree-v1\0");
    h.update(size.to_le_bytes());
    h.update((CHUNK as u64).to_le_bytes());
    for l in leaves {
        h.update(l);
    }
    h.finalize().into()
}

/// Plain SHA-256 (what `sha256sum` prints) of several files, one thread per file at most.
pub fn plain_sha256(files: &[&[u8]], threads: usize) -> Vec<[u8; 32]> {
    let threads = threads.clamp(1, files.len().max(1));
    let next = AtomicUsize::new(0);
    let out = Mutex::new(vec![[0u8; 32]; files.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(d) = files.get(i) else { break };
                let h: [u8; 32] = Sha256::digest(d).into();
                if let Ok(mut o) = out.lock() {
                    o[i] = h;
                }
            });
        }
    });
    out.into_inner().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::hex;

    #[test]
    fn tree_is_defined_as_documented() {
        let data: Vec<u8> = (0..(2 * CHUNK + 5)).map(|i| (i % 251) as u8).collect();
        let mut h = Sha256::new();
        h.update(b"trtcache-tree-v1\0");
        h.update((data.len() as u64).to_le_bytes());
        h.update((CHUNK as u64).to_le_bytes());
        for c in data.chunks(CHUNK) {
            h.update(Sha256::digest(c));
        }
        let want: [u8; 32] = h.finalize().into();
        for threads in [1, 2, 3] {
            assert_eq!(
                tree_digests(&[&data], threads)[0],
                want,
                "{threads} threads"
            );
        }
    }

    #[test]
    fn several_files_in_parallel_match_one_by_one() {
        let a = vec![1u8; CHUNK + 1];
        let b = b"hello".to_vec();
        let e: Vec<u8> = Vec::new();
        let many = tree_digests(&[&a, &b, &e], 2);
        assert_eq!(many[0], tree_digests(&[&a], 1)[0]);
        assert_eq!(many[1], tree_digests(&[&b], 1)[0]);
        assert_eq!(many[2], tree_digests(&[&e], 1)[0]);
        assert_ne!(many[0], many[1]);
    }

    #[test]
    fn plain_matches_sha256sum() {
        // sha256("abc") from FIPS 180-2.
        let d = plain_sha256(&[b"abc", b""], 2);
        assert_eq!(
            hex(&d[0]),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&d[1]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
