//! Per-store cost against the number of entries already in the cache (`benches/store_scale.sh`,
//! RELIABILITY.md): fills a cache through the real store API (`SledStore::put` of a small
//! staged artifact, as a build stores one) and the real digest memo, and at each size in
//! SIZES times a batch of further stores.
//!
//! `store_scale DIR SIZES [BATCH]` — SIZES comma-separated, ascending (e.g.
//! `10,1000,10000,100000`). Per size, two JSON lines: `mode: "under"` (a size limit far
//! above the cache: nothing is evicted) and `mode: "at_limit"` (a second store whose limit
//! the cache sits at, so every store evicts the least recently used entry), each with the
//! mean and p99 of BATCH stores (default 200) and of the memo's open + insert + save a
//! build does per model.

use std::path::{Path, PathBuf};
use std::time::Instant;

use trtcache::cache::{Record, SledStore, StagedArtifact, Store, StoreOptions};
use trtcache::key::hex;
use trtcache::key::memo::{DigestMemo, FileId};

fn record(n: u64) -> Record {
    trtcache::fixtures::synthetic_record(n, 0)
}

/// A staged artifact of one 64-byte file whose bytes depend on `n` (a distinct blob).
fn staged(dir: &Path, n: u64) -> StagedArtifact {
    std::fs::create_dir_all(dir).unwrap();
    let mut bytes = [0u8; 64];
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    std::fs::write(dir.join("model.onnx"), bytes).unwrap();
    StagedArtifact {
        dir: dir.to_path_buf(),
        entry: "model.onnx".into(),
        files: vec!["model.onnx".into()],
        rewrites: Vec::new(),
    }
}

fn memo_id(n: u64) -> FileId {
    FileId {
        dev: 1,
        ino: n,
        size: 64,
        mtime_ns: 0,
        ctime_ns: 0,
    }
}

struct Timed {
    store_ms: Vec<f64>,
    memo_ms: Vec<f64>,
}

/// `batch` stores of new entries numbered from `next`, each with the memo work of its build.
fn batch(s: &SledStore, memo: &Path, stage: &Path, next: &mut u64, batch: usize) -> Timed {
    let mut t = Timed {
        store_ms: Vec::new(),
        memo_ms: Vec::new(),
    };
    for _ in 0..batch {
        let n = *next;
        *next += 1;
        let a = staged(&stage.join(n.to_string()), n);
        let t0 = Instant::now();
        s.put(record(n), Some(&a)).unwrap();
        t.store_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        let _ = std::fs::remove_dir_all(&a.dir);
        let t0 = Instant::now();
        let mut m = DigestMemo::open(memo);
        m.racy = std::time::Duration::ZERO;
        m.insert(memo_id(n), hex(&n.to_le_bytes()), 1);
        m.save().unwrap();
        t.memo_ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    t
}

fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let p99 = v[((v.len() as f64 * 0.99) as usize).min(v.len() - 1)];
    (mean, p99)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_none_or(|a| a.starts_with('-')) {
        // `cargo bench` and `cargo test --all-targets` run every bench target, with `--bench`
        // or the test harness's flags: nothing to measure (benches/store_scale.sh drives this
        // one).
        eprintln!("usage: store_scale DIR SIZES [BATCH] (see benches/store_scale.sh)");
        return;
    }
    if args.len() < 3 {
        eprintln!("usage: store_scale DIR SIZES [BATCH]");
        std::process::exit(2);
    }
    let dir = PathBuf::from(&args[1]);
    let sizes: Vec<u64> = args[2].split(',').map(|s| s.parse().unwrap()).collect();
    let per: usize = args.get(3).map_or(200, |b| b.parse().unwrap());
    let cache = dir.join("cache");
    let memo = cache.join("digests.json");
    let stage = dir.join("stage");
    let mut next = 0u64;
    for &size in &sizes {
        // Fill (untimed) to `size` entries with a limit far above what they take.
        {
            let s = SledStore::open(
                &cache,
                StoreOptions {
                    max_bytes: Some(u64::MAX / 2),
                },
            )
            .unwrap();
            let t0 = Instant::now();
            while next < size {
                let n = next;
                next += 1;
                let a = staged(&stage.join(n.to_string()), n);
                s.put(record(n), Some(&a)).unwrap();
                let _ = std::fs::remove_dir_all(&a.dir);
                let mut m = DigestMemo::open(&memo);
                m.racy = std::time::Duration::ZERO;
                m.insert(memo_id(n), hex(&n.to_le_bytes()), 1);
                m.save().unwrap();
            }
            eprintln!("filled to {size} in {:.1} s", t0.elapsed().as_secs_f64());
            let mut t = batch(&s, &memo, &stage, &mut next, per);
            let (sm, sp) = stats(&mut t.store_ms);
            let (mm, mp) = stats(&mut t.memo_ms);
            println!(
                "{{\"entries\":{size},\"mode\":\"under\",\"store_mean_ms\":{sm:.3},\"store_p99_ms\":{sp:.3},\"memo_mean_ms\":{mm:.3},\"memo_p99_ms\":{mp:.3}}}"
            );
        }
        // The same cache at its limit: each store evicts (LRU) to make room.
        {
            let probe = SledStore::open(&cache, StoreOptions::default()).unwrap();
            let used: u64 = probe.list().unwrap().iter().map(|r| r.bytes()).sum();
            drop(probe);
            let s = SledStore::open(
                &cache,
                StoreOptions {
                    max_bytes: Some(used),
                },
            )
            .unwrap();
            let mut t = batch(&s, &memo, &stage, &mut next, per);
            let (sm, sp) = stats(&mut t.store_ms);
            println!(
                "{{\"entries\":{size},\"mode\":\"at_limit\",\"store_mean_ms\":{sm:.3},\"store_p99_ms\":{sp:.3}}}"
            );
            // Back to `size` entries + the batch evicted: refill the evicted count next round.
            next = next.max(size);
        }
    }
}
