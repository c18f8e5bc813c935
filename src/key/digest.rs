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
#[cfg(test)]
pub fn tree_digests(files: &[&[u8]], threads: usize) -> Vec<[u8; 32]> {
    let inputs: Vec<Input> = files.iter().map(|d| Input::Bytes(d)).collect();
    tree_digests_of(&inputs, threads).expect("hashing bytes in memory does no I/O")
}

/// What [`tree_digests_of`] hashes: bytes in memory, or an open file of a known size read
/// chunk by chunk with positional reads. Files are read, never mapped: a file another
/// process truncates while it is hashed gives an error, where a shrunken map would kill the
/// process with SIGBUS.
pub enum Input<'a> {
    Bytes(&'a [u8]),
    File(&'a std::fs::File, u64),
}

impl Input<'_> {
    /// Bytes to hash.
    pub fn len(&self) -> u64 {
        match self {
            Input::Bytes(d) => d.len() as u64,
            Input::File(_, n) => *n,
        }
    }
}

/// [`tree_digests`] over [`Input`]s; the first read error (a file that shrank) fails it.
pub fn tree_digests_of(files: &[Input], threads: usize) -> std::io::Result<Vec<[u8; 32]>> {
    let chunks = |n: u64| n.div_ceil(CHUNK as u64) as usize;
    let jobs: Vec<(usize, usize)> = files
        .iter()
        .enumerate()
        .flat_map(|(f, d)| (0..chunks(d.len())).map(move |c| (f, c)))
        .collect();
    let mut leaves: Vec<Vec<[u8; 32]>> = files
        .iter()
        .map(|d| vec![[0u8; 32]; chunks(d.len())])
        .collect();
    let threads = threads.clamp(1, jobs.len().max(1));
    if threads == 1 {
        let mut buf = Vec::new();
        for &(f, c) in &jobs {
            leaves[f][c] = leaf(&files[f], c, &mut buf)?;
        }
    } else {
        let next = AtomicUsize::new(0);
        let done = Mutex::new(Vec::with_capacity(jobs.len()));
        let failed = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    let mut buf = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(f, c)) = jobs.get(i) else { break };
                        match leaf(&files[f], c, &mut buf) {
                            Ok(h) => mine.push((f, c, h)),
                            Err(e) => {
                                if let Ok(mut x) = failed.lock() {
                                    x.get_or_insert(e);
                                }
                                // Stop every thread: the result is an error anyway.
                                next.store(jobs.len(), Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                    if let Ok(mut d) = done.lock() {
                        d.extend(mine);
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().ok().flatten() {
            return Err(e);
        }
        for (f, c, h) in done.into_inner().unwrap_or_default() {
            leaves[f][c] = h;
        }
    }
    Ok(files
        .iter()
        .zip(leaves)
        .map(|(d, l)| root(d.len(), &l))
        .collect())
}

fn leaf(data: &Input, c: usize, buf: &mut Vec<u8>) -> std::io::Result<[u8; 32]> {
    let start = (c * CHUNK) as u64;
    let end = ((c + 1) as u64 * CHUNK as u64).min(data.len());
    match data {
        Input::Bytes(d) => Ok(Sha256::digest(&d[start as usize..end as usize]).into()),
        Input::File(f, _) => {
            use std::os::unix::fs::FileExt;
            buf.resize((end - start) as usize, 0);
            f.read_exact_at(buf, start)?;
            Ok(Sha256::digest(&buf[..]).into())
        }
    }
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
    fn files_read_match_bytes_and_a_shrunken_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..(CHUNK * 2 + 7)).map(|i| (i % 13) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        for threads in [1, 3] {
            let got = tree_digests_of(&[Input::File(&f, data.len() as u64)], threads).unwrap();
            assert_eq!(got[0], tree_digests(&[&data], 1)[0]);
        }
        // Truncated after its size was taken (a copy rewriting it in place).
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(CHUNK as u64)
            .unwrap();
        let e = tree_digests_of(&[Input::File(&f, data.len() as u64)], 2).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
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
