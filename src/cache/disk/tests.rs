//! The disk store's unit tests: blob sharing and modes, what is never served, LRU gc, the
//! size limit, and a put that cannot finish.

use super::*;
use crate::key::{BackendId, KeyParts, ModelDigest, KEY_FORMAT};
use std::collections::BTreeSet;

pub(super) fn record(n: u8, last_used: u64) -> Record {
    let parts = KeyParts {
        format: KEY_FORMAT,
        model: ModelDigest {
            sha256: hex(&[n; 32]),
            bytes: 1,
            external: vec![],
        },
        opsets: Default::default(),
        profile: None,
        sku: Default::default(),
        backend: BackendId {
            name: crate::spec::Backend::OrtCpu,
            versions: Default::default(),
        },
        precision: Default::default(),
        options: Default::default(),
    };
    Record {
        format: RECORD_FORMAT,
        key: parts.key(),
        parts,
        status: Status::Ready,
        artifact: None,
        backend: crate::spec::Backend::OrtCpu,
        providers: None,
        partitions: None,
        model_path: format!("m{n}.onnx"),
        build_ms: 1,
        validation: None,
        created: last_used,
        last_used,
        hits: 0,
        provenance: Default::default(),
    }
}

fn artifact(dir: &Path, content: &[u8]) -> StagedArtifact {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("model.onnx"), content).unwrap();
    std::fs::write(dir.join("model.onnx.data"), [content, content].concat()).unwrap();
    StagedArtifact {
        dir: dir.to_path_buf(),
        entry: "model.onnx".into(),
        files: vec!["model.onnx".into(), "model.onnx.data".into()],
        rewrites: Vec::new(),
    }
}

fn blobs(root: &Path) -> usize {
    std::fs::read_dir(root.join("blobs")).unwrap().count()
}

#[test]
fn blob_directories_are_group_searchable_and_never_open_to_others() {
    let d = tempfile::tempdir().unwrap();
    let s = SledStore::open(&d.path().join("c"), StoreOptions::default()).unwrap();
    let a = artifact(&d.path().join("a"), b"bytes");
    // A file the build left owner-only still becomes readable by the group.
    let data = d.path().join("a/model.onnx.data");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = record(1, 10);
    s.put(r.clone(), Some(&a)).unwrap();
    let Lookup::Hit { served, .. } = s.lookup(&r.key).unwrap() else {
        panic!("not served")
    };
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&served.dir), 0o750, "{}", served.dir.display());
    for f in &served.files {
        assert_eq!(mode(f) & 0o040, 0o040, "{}", f.display());
    }
    assert_eq!(mode(&served.dir.join("model.onnx.data")), 0o640);
    // A blob stored before (0700) is made group-searchable when the store opens.
    std::fs::set_permissions(&served.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    drop(s);
    let _s = SledStore::open(&d.path().join("c"), StoreOptions::default()).unwrap();
    assert_eq!(mode(&served.dir), 0o750);
}

#[test]
fn identical_artifacts_share_a_blob_until_the_last_record_goes() {
    let d = tempfile::tempdir().unwrap();
    let s = SledStore::open(&d.path().join("c"), StoreOptions::default()).unwrap();
    let a = artifact(&d.path().join("a"), b"same bytes");
    let (r1, r2) = (record(1, 10), record(2, 10));
    let s1 = s.put(r1.clone(), Some(&a)).unwrap();
    let s2 = s.put(r2.clone(), Some(&a)).unwrap();
    assert_eq!(s1.artifact, s2.artifact);
    assert_eq!(blobs(s.root()), 1);
    match s.lookup(&r1.key).unwrap() {
        Lookup::Hit { record, served } => {
            assert_eq!(record.hits, 1);
            assert_eq!(served.files.len(), 2);
            assert_eq!(std::fs::read(&served.entry).unwrap(), b"same bytes");
        }
        other => panic!("{other:?}"),
    }
    assert!(s.remove(&r1.key).unwrap());
    assert_eq!(blobs(s.root()), 1, "still named by the second record");
    assert!(s.remove(&r2.key).unwrap());
    assert_eq!(blobs(s.root()), 0);
    assert!(!s.remove(&r2.key).unwrap());
    assert!(matches!(s.lookup(&r2.key).unwrap(), Lookup::Miss));
}

#[test]
fn failed_quarantined_and_newer_records_are_never_served() {
    let d = tempfile::tempdir().unwrap();
    let s = SledStore::open(&d.path().join("c"), StoreOptions::default()).unwrap();
    let mut failed = record(1, 1);
    failed.status = Status::Failed {
        reason: "over tolerance".into(),
    };
    s.put(failed.clone(), None).unwrap();
    assert!(matches!(
        s.lookup(&failed.key).unwrap(),
        Lookup::Unservable { .. }
    ));
    let a = artifact(&d.path().join("a"), b"x");
    let good = s.put(record(2, 1), Some(&a)).unwrap();
    // A record from a newer trtcache is left alone.
    let mut newer = good.clone();
    newer.format = RECORD_FORMAT + 1;
    s.write_record(&newer).unwrap();
    assert!(matches!(
        s.lookup(&good.key).unwrap(),
        Lookup::Unservable { .. }
    ));
    s.write_record(&good).unwrap();
    // Corrupt one byte: verify quarantines, lookup refuses.
    let data = s
        .blob_dir(&good.artifact.as_ref().unwrap().digest)
        .join("model.onnx.data");
    std::fs::write(&data, b"y").unwrap();
    std::fs::write(&data, b"yy").unwrap();
    let rep = s.verify().unwrap();
    assert_eq!(rep.quarantined.len(), 1);
    assert!(matches!(
        s.lookup(&good.key).unwrap(),
        Lookup::Unservable { .. }
    ));
    // gc always collects quarantined entries and their files.
    let gc = s.gc(u64::MAX, false).unwrap();
    assert_eq!(gc.evicted, vec![good.key.hex()]);
    assert_eq!(
        std::fs::read_dir(s.root().join("quarantine"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn gc_evicts_least_recently_used_first() {
    let d = tempfile::tempdir().unwrap();
    let s = SledStore::open(&d.path().join("c"), StoreOptions::default()).unwrap();
    let mut recs = Vec::new();
    for n in 0..3u8 {
        let a = artifact(&d.path().join(format!("a{n}")), &[n; 100]);
        recs.push(s.put(record(n, 100 - n as u64), Some(&a)).unwrap());
    }
    let one = recs[0].bytes();
    let dry = s.gc(one, true).unwrap();
    // Oldest use first: record 2 (last_used 98), then record 1 (99).
    assert_eq!(dry.evicted, vec![recs[2].key.hex(), recs[1].key.hex()]);
    assert_eq!(s.list().unwrap().len(), 3, "dry run deletes nothing");
    let rep = s.gc(one, false).unwrap();
    assert_eq!(rep.bytes_after, one);
    let left: Vec<_> = s.list().unwrap().into_iter().map(|r| r.key).collect();
    assert_eq!(left, vec![recs[0].key]);
    assert_eq!(blobs(s.root()), 1);
}

/// A record of `n` built with ONNX Runtime `ort`, last used at `used`.
fn record_for(n: u8, used: u64, ort: &str) -> Record {
    let mut r = record(n, used);
    r.parts
        .backend
        .versions
        .insert("onnxruntime".into(), ort.into());
    r.key = r.parts.key();
    r
}

#[test]
fn gc_and_the_size_limit_evict_runtimes_nobody_keeps_first() {
    use crate::cache::store::RuntimeKeep;
    let d = tempfile::tempdir().unwrap();
    let s = SledStore::open(&d.path().join("c"), StoreOptions::default()).unwrap();
    // Oldest first: 1.31.1 (used at 10), 1.30.0 (used at 50), 1.32.0 (used at 20).
    let mut recs = Vec::new();
    for (n, used, ort) in [(0u8, 10, "1.31.1"), (1, 50, "1.30.0"), (2, 20, "1.32.0")] {
        let a = artifact(&d.path().join(format!("a{n}")), &[n; 100]);
        recs.push(s.put(record_for(n, used, ort), Some(&a)).unwrap());
    }
    let one = recs[0].bytes();
    // Plain LRU without a keep set: the two oldest go.
    let dry = s.gc(one, true).unwrap();
    assert_eq!(dry.evicted, vec![recs[0].key.hex(), recs[2].key.hex()]);
    // Current 1.31.1 and incoming 1.32.0 kept: 1.30.0 goes first although used last.
    let keep = RuntimeKeep(
        [(
            "onnxruntime".to_string(),
            ["1.31.1".to_string(), "1.32.0".to_string()].into(),
        )]
        .into(),
    );
    s.keep_runtimes(keep);
    let dry = s.gc(2 * one, true).unwrap();
    assert_eq!(dry.evicted, vec![recs[1].key.hex()]);
    // The size limit at put follows the same order.
    let s = {
        drop(s);
        SledStore::open(
            &d.path().join("c"),
            StoreOptions {
                max_bytes: Some(3 * one),
            },
        )
        .unwrap()
    };
    s.keep_runtimes(RuntimeKeep(
        [(
            "onnxruntime".to_string(),
            ["1.31.1".to_string(), "1.32.0".to_string()].into(),
        )]
        .into(),
    ));
    let a = artifact(&d.path().join("a3"), &[3; 100]);
    s.put(record_for(3, 60, "1.32.0"), Some(&a)).unwrap();
    let left: BTreeSet<_> = s.list().unwrap().into_iter().map(|r| r.key).collect();
    assert!(!left.contains(&recs[1].key), "1.30.0's artifact went first");
    assert!(
        left.contains(&recs[0].key),
        "the oldest kept runtime's stays"
    );
}

#[test]
fn size_limit_applies_on_put() {
    let d = tempfile::tempdir().unwrap();
    let a0 = artifact(&d.path().join("a0"), &[0; 100]);
    let a1 = artifact(&d.path().join("a1"), &[1; 100]);
    let s = SledStore::open(
        &d.path().join("c"),
        StoreOptions {
            max_bytes: Some(300),
        },
    )
    .unwrap();
    let r0 = s.put(record(0, 1), Some(&a0)).unwrap();
    assert_eq!(s.evictions(), 0);
    let r1 = s.put(record(1, 2), Some(&a1)).unwrap();
    let keys: Vec<_> = s.list().unwrap().into_iter().map(|r| r.key).collect();
    assert_eq!(keys, vec![r1.key]);
    assert!(s.get(&r0.key).unwrap().is_none());
    // Counted for the daemon's `trtcache_evictions_total{reason="size"}`.
    assert_eq!(s.evictions(), 1);
}

#[test]
fn a_put_that_cannot_finish_leaves_the_previous_entry_and_no_blob() {
    let d = tempfile::tempdir().unwrap();
    let s = SledStore::open(&d.path().join("c"), StoreOptions::default()).unwrap();
    let r = s
        .put(record(1, 1), Some(&artifact(&d.path().join("a"), b"old")))
        .unwrap();
    // The manifest cannot be written (what a full disk does to the last write).
    let records = s.root().join("records");
    std::fs::remove_dir_all(&records).unwrap();
    std::fs::write(&records, b"not a directory").unwrap();
    let new = artifact(&d.path().join("b"), b"new");
    assert!(s.put(record(1, 2), Some(&new)).is_err());
    assert_eq!(
        s.get(&r.key).unwrap(),
        Some(r.clone()),
        "previous record back"
    );
    assert_eq!(blobs(s.root()), 1, "the new blob is gone");
    assert!(s.put(record(2, 2), Some(&new)).is_err());
    assert!(
        s.get(&record(2, 2).key).unwrap().is_none(),
        "no partial entry"
    );
    assert_eq!(blobs(s.root()), 1);
}

#[test]
fn an_index_that_lost_records_is_refused_and_repair_rebuilds_it() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("c");
    let (r1, r2) = {
        let s = SledStore::open(&root, StoreOptions::default()).unwrap();
        let r1 = s
            .put(record(1, 1), Some(&artifact(&d.path().join("a"), b"one")))
            .unwrap();
        let r2 = s
            .put(record(2, 1), Some(&artifact(&d.path().join("b"), b"two")))
            .unwrap();
        // What a truncated log reads as: the index silently lost a record.
        s.records.remove(r2.key.0).unwrap();
        (r1, r2)
    };
    let e = SledStore::open(&root, StoreOptions::default()).unwrap_err();
    assert!(matches!(e, StoreError::IndexDamaged { .. }), "{e}");
    assert!(e.to_string().contains("verify --repair"), "{e}");
    assert_eq!(blobs(&root), 2, "nothing deleted as an orphan");
    let (s, rep) = SledStore::repair(&root, StoreOptions::default()).unwrap();
    assert!(rep.damaged);
    assert_eq!(rep.recovered.len(), 2);
    assert!(rep.moved_to.as_ref().unwrap().is_dir(), "old index kept");
    for r in [&r1, &r2] {
        assert!(matches!(s.lookup(&r.key).unwrap(), Lookup::Hit { .. }));
    }
}

#[test]
fn artifact_names_must_be_plain() {
    let d = tempfile::tempdir().unwrap();
    let s = SledStore::open(&d.path().join("c"), StoreOptions::default()).unwrap();
    let mut a = artifact(&d.path().join("a"), b"x");
    a.files.push("../escape".into());
    assert!(matches!(
        s.put(record(1, 1), Some(&a)),
        Err(StoreError::BadArtifact { .. })
    ));
}

#[test]
fn records_from_a_newer_version_keep_their_blobs_at_open() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("c");
    let a = artifact(&d.path().join("a"), b"x");
    let stored = {
        let s = SledStore::open(&root, StoreOptions::default()).unwrap();
        let r = s.put(record(1, 1), Some(&a)).unwrap();
        // Rewrite it as a future version would: a field changes type.
        let mut j = serde_json::to_value(&r).unwrap();
        j["hits"] = serde_json::json!({"total": 3});
        s.records
            .insert(r.key.0, serde_json::to_vec(&j).unwrap())
            .unwrap();
        r
    };
    let s = SledStore::open(&root, StoreOptions::default()).unwrap();
    assert!(s.open_report().orphans_removed.is_empty());
    assert!(s
        .blob_dir(&stored.artifact.unwrap().digest)
        .join("model.onnx")
        .is_file());
}
