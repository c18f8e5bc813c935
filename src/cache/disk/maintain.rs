//! Maintenance of the local store: reconciling the index with the files at open (and
//! detecting a damaged index), `verify` (re-hash and quarantine), `repair` (rebuild a damaged
//! index from the record manifests and the blobs) and `gc` (LRU eviction to a size limit).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{hash_file, io, marker, write_durably, OpenReport, SledStore, StoreOptions};
use crate::cache::lock::DirLock;
use crate::cache::record::{Record, Status, StoredArtifact};
use crate::cache::store::{now_secs, GcReport, RepairReport, Store, StoreError, VerifyReport};
use crate::key::CacheKey;

/// The keys of the manifests under `records/` (file name `<key>.json`); names that are not a
/// key are skipped.
fn manifest_keys(dir: &Path) -> Result<Vec<(CacheKey, PathBuf)>, StoreError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let p = e.map_err(io(dir))?.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        let Some(name) = name else { continue };
        if let Some(k) = name
            .strip_suffix(".json")
            .and_then(|h| CacheKey::parse(h).ok())
        {
            out.push((k, p));
        }
    }
    Ok(out)
}

/// Blob directories stored before they were made `0750` are `0700`: add group read and
/// search (never anything for others) so consumers in the daemon's group can open artifact
/// files through a directory descriptor. A failure only costs them that fast path.
fn group_searchable(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        return;
    };
    let mode = m.permissions().mode() & 0o7777;
    if m.is_dir() && mode & 0o050 != 0o050 {
        if let Err(e) = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o050))
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot make blob directory group-searchable");
        }
    }
}

impl SledStore {
    /// A manifest whose key the index lacks: the index lost records (sled reads a truncated
    /// or corrupt log as a shorter one). Refuse before anything is deleted as an "orphan".
    pub(super) fn check_manifests(&self) -> Result<Vec<(CacheKey, PathBuf)>, StoreError> {
        let dir = self.root.join("records");
        let manifests = if dir.is_dir() {
            manifest_keys(&dir)?
        } else {
            Vec::new()
        };
        let lost: Vec<&CacheKey> = manifests
            .iter()
            .map(|(k, _)| k)
            .filter(|k| !self.records.contains_key(k.0).unwrap_or(false))
            .collect();
        if let Some(first) = lost.first() {
            return Err(StoreError::IndexDamaged {
                dir: self.root.clone(),
                detail: format!(
                    "{} of {} stored records are missing from it (e.g. {first}): the index is missing, truncated or corrupt",
                    lost.len(),
                    manifests.len()
                ),
            });
        }
        Ok(manifests)
    }

    /// Cleans what a crash left: the store's own temp files in `tmp/`, records whose files
    /// are gone, blob folders no record names. Only names the store creates are deleted
    /// ([`marker`]); anything else found there is left alone and logged.
    pub(super) fn reconcile(&self) -> Result<OpenReport, StoreError> {
        let mut rep = OpenReport::default();
        let tmp = self.root.join("tmp");
        for e in std::fs::read_dir(&tmp).map_err(io(&tmp))? {
            let e = e.map_err(io(&tmp))?;
            let p = e.path();
            if !marker::own_temp(&e.file_name().to_string_lossy()) {
                tracing::warn!(path = %p.display(), "not a trtcache temp file: left alone");
                continue;
            }
            marker::remove(&p).map_err(io(&p))?;
            rep.temp_removed += 1;
        }
        // Manifests being written when a crash came.
        let records = self.root.join("records");
        for p in marker::matching(&records, marker::own_temp) {
            let _ = std::fs::remove_file(&p);
        }
        let manifests = self.check_manifests()?;
        // Records without a manifest (stored before manifests existed, or a crash between
        // the index write and the manifest's): write it now, best effort.
        let have: BTreeSet<CacheKey> = manifests.iter().map(|(k, _)| *k).collect();
        for item in self.records.iter() {
            let (k, v) = item.map_err(|e| self.db_err(e))?;
            let Ok(key) = <[u8; 32]>::try_from(k.as_ref()).map(CacheKey) else {
                continue;
            };
            if !have.contains(&key) {
                if let Err(e) = write_durably(&self.manifest_path(&key), &v) {
                    tracing::warn!(key = %key, error = %e, "cannot write the record manifest");
                }
            }
        }
        // The digest memo is written next to the index (temp file, then rename); a writer
        // killed in between leaves its temp file behind.
        rep.temp_removed += crate::key::memo::remove_dead_temps(&self.root);
        let mut named = BTreeSet::new();
        for r in self.all_records()? {
            if let (Status::Ready, Some(a)) = (&r.status, &r.artifact) {
                if let Err(why) = self.cheap_check(a) {
                    tracing::warn!(key = %r.key, %why, "dropping cache record: artifact files missing");
                    self.remove_manifest(&r.key)?;
                    self.unindex(&r.key)?;
                    rep.records_dropped.push(r.key.hex());
                    continue;
                }
            }
            if let Some(a) = &r.artifact {
                named.insert(a.digest.clone());
            }
        }
        // Records this version cannot parse (a newer trtcache's) still own their blobs.
        for item in self.records.iter() {
            let (_, v) = item.map_err(|e| self.db_err(e))?;
            if serde_json::from_slice::<Record>(&v).is_err() {
                if let Ok(j) = serde_json::from_slice::<serde_json::Value>(&v) {
                    if let Some(d) = j.pointer("/artifact/digest").and_then(|d| d.as_str()) {
                        named.insert(d.to_string());
                    }
                }
            }
        }
        let blobs = self.root.join("blobs");
        for e in std::fs::read_dir(&blobs).map_err(io(&blobs))? {
            let e = e.map_err(io(&blobs))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !marker::own_blob(&name) {
                tracing::warn!(path = %e.path().display(), "not a trtcache blob: left alone");
            } else if !named.contains(&name) {
                let p = e.path();
                marker::remove(&p).map_err(io(&p))?;
                tracing::info!(blob = %name, "removed orphan blob");
                rep.orphans_removed.push(name);
            } else {
                group_searchable(&e.path());
            }
        }
        self.records.flush().map_err(|e| self.db_err(e))?;
        Ok(rep)
    }

    /// Total bytes of distinct stored artifacts of servable records.
    pub(super) fn stored_bytes(records: &[Record]) -> u64 {
        let mut seen = BTreeMap::new();
        for r in records {
            if let (Status::Ready, Some(a)) = (&r.status, &r.artifact) {
                seen.insert(a.digest.clone(), a.bytes);
            }
        }
        seen.values().sum()
    }

    fn quarantine(&self, digest: &str) -> Result<(), StoreError> {
        let src = self.blob_dir(digest);
        if src.exists() {
            // Unique: the same digest can be quarantined again within a second (a rebuild
            // is byte-identical).
            let q = self.root.join("quarantine");
            let mut dst = q.join(format!("{digest}-{}", now_secs()));
            let mut n = 1;
            while dst.exists() {
                dst = q.join(format!("{digest}-{}-{n}", now_secs()));
                n += 1;
            }
            std::fs::rename(&src, &dst).map_err(io(&src))?;
        }
        Ok(())
    }

    /// Re-hashes an artifact's files against its record: `Err(why)` at the first mismatch.
    pub fn check_hashes(&self, a: &StoredArtifact) -> Result<(), String> {
        let dir = self.blob_dir(&a.digest);
        for f in &a.files {
            let p = dir.join(&f.name);
            match hash_file(&p) {
                Ok((sha, n)) if sha == f.sha256 && n == f.bytes => {}
                Ok((sha, n)) => {
                    return Err(format!(
                        "{}: sha256 {sha} ({n} B), recorded {} ({} B)",
                        f.name, f.sha256, f.bytes
                    ))
                }
                Err(e) => return Err(format!("{}: {e}", f.name)),
            }
        }
        Ok(())
    }

    /// Marks a key's record quarantined (never served; the next build replaces it) and moves
    /// its blob directory to `quarantine/`. `false` when there is no such record.
    pub fn quarantine_key(&self, key: &CacheKey, why: &str) -> Result<bool, StoreError> {
        let Some(mut r) = self.read_record(key)? else {
            return Ok(false);
        };
        r.status = Status::Quarantined {
            reason: why.to_string(),
        };
        self.write_record(&r)?;
        if let Some(a) = &r.artifact {
            self.quarantine(&a.digest)?;
        }
        Ok(true)
    }

    /// `trtcache verify --repair`: opens the store; when the index is damaged
    /// ([`StoreError::IndexDamaged`]), moves it aside to `db.corrupt-<unix time>` (kept, never
    /// deleted), rebuilds it from the manifests under `records/` whose artifact files re-hash
    /// clean, moves blob directories no recovered record names to `quarantine/`, and opens the
    /// store on the new index. The model repository is never read or written.
    pub fn repair(root: &Path, opts: StoreOptions) -> Result<(Self, RepairReport), StoreError> {
        let reason = match Self::open(root, opts.clone()) {
            Ok(s) => return Ok((s, RepairReport::default())),
            Err(StoreError::IndexDamaged { detail, .. }) => detail,
            Err(e) => return Err(e),
        };
        let mut rep = RepairReport {
            damaged: true,
            reason: Some(reason),
            ..RepairReport::default()
        };
        let lock = DirLock::acquire(root)?;
        let dbp = root.join("db");
        if dbp.exists() {
            let mut moved = root.join(format!("db.corrupt-{}", now_secs()));
            let mut n = 1;
            while moved.exists() {
                moved = root.join(format!("db.corrupt-{}-{n}", now_secs()));
                n += 1;
            }
            std::fs::rename(&dbp, &moved).map_err(io(&dbp))?;
            super::fsync_dir(root)?;
            tracing::warn!(moved = %moved.display(), "damaged cache index moved aside");
            rep.moved_to = Some(moved);
        }
        let mut store = Self::with_index(root, lock, opts)?;
        let mut named = BTreeSet::new();
        for (key, path) in manifest_keys(&root.join("records"))? {
            match store.recover(&key, &path) {
                Ok(digest) => {
                    named.extend(digest);
                    rep.recovered.push(key.hex());
                }
                Err(why) => {
                    tracing::warn!(key = %key, %why, "cache record not recoverable: dropped");
                    store.remove_manifest(&key)?;
                    rep.dropped.push((key.hex(), why));
                }
            }
        }
        store.records.flush().map_err(|e| store.db_err(e))?;
        store.recount()?;
        // Blobs nothing names would be deleted as orphans by the open below: keep them.
        let blobs = root.join("blobs");
        for e in std::fs::read_dir(&blobs).map_err(io(&blobs))? {
            let e = e.map_err(io(&blobs))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if marker::own_blob(&name) && !named.contains(&name) {
                let dst = root
                    .join("quarantine")
                    .join(format!("{name}-{}", now_secs()));
                std::fs::rename(e.path(), &dst).map_err(io(&e.path()))?;
                rep.unreferenced_blobs.push(name);
            }
        }
        store.report = store.reconcile()?;
        Ok((store, rep))
    }

    /// Re-indexes one manifest: the digest it names when its files re-hash clean (`None`
    /// for a record without an artifact, e.g. a failed build), or why it cannot be.
    fn recover(&self, key: &CacheKey, path: &Path) -> Result<Option<String>, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("manifest {} is not JSON: {e}", path.display()))?;
        let digest = match serde_json::from_value::<Record>(value.clone()) {
            Ok(r) => {
                if r.key != *key {
                    return Err(format!("manifest {} names key {}", path.display(), r.key));
                }
                match (&r.status, &r.artifact) {
                    (Status::Ready, Some(a)) => {
                        self.check_hashes(a)?;
                        Some(a.digest.clone())
                    }
                    (Status::Ready, None) => return Err("no artifact recorded".into()),
                    (Status::Quarantined { reason }, _) => {
                        return Err(format!("was quarantined: {reason}"))
                    }
                    (Status::Failed { .. }, _) => None,
                }
            }
            // A newer trtcache's record: kept as it was (it still owns its blob).
            Err(_) => value
                .pointer("/artifact/digest")
                .and_then(|d| d.as_str())
                .map(str::to_string),
        };
        self.records
            .insert(key.0, bytes)
            .map_err(|e| format!("writing the index: {e}"))?;
        Ok(digest)
    }

    /// Re-hashes every ready artifact; mismatches are quarantined.
    pub(super) fn verify_all(&self) -> Result<VerifyReport, StoreError> {
        let mut rep = VerifyReport::default();
        let records = self.all_records()?;
        let mut bad: BTreeMap<String, String> = BTreeMap::new();
        let mut good: BTreeSet<String> = BTreeSet::new();
        for r in &records {
            let (Status::Ready, Some(a)) = (&r.status, &r.artifact) else {
                continue;
            };
            if good.contains(&a.digest) || bad.contains_key(&a.digest) {
                continue;
            }
            match self.check_hashes(a) {
                Ok(()) => {
                    good.insert(a.digest.clone());
                }
                Err(w) => {
                    bad.insert(a.digest.clone(), w);
                }
            }
        }
        for r in records {
            let (Status::Ready, Some(a)) = (&r.status, &r.artifact) else {
                continue;
            };
            rep.checked += 1;
            if let Some(why) = bad.get(&a.digest) {
                tracing::warn!(key = %r.key, %why, "artifact corrupt: quarantined");
                let mut q = r.clone();
                q.status = Status::Quarantined {
                    reason: why.clone(),
                };
                self.write_record(&q)?;
                rep.quarantined.push((r.key.hex(), why.clone()));
            } else {
                rep.ok += 1;
            }
        }
        for digest in bad.keys() {
            self.quarantine(digest)?;
        }
        Ok(rep)
    }

    /// Evicts quarantined entries, then least-recently-used ones, to fit `max_bytes`.
    pub(super) fn collect(&self, max_bytes: u64, dry_run: bool) -> Result<GcReport, StoreError> {
        let mut records = self.all_records()?;
        let before = Self::stored_bytes(&records);
        let mut rep = GcReport {
            dry_run,
            max_bytes,
            bytes_before: before,
            bytes_after: before,
            evicted: Vec::new(),
        };
        // Quarantined entries hold nothing servable: always collected.
        let quarantined: Vec<String> = records
            .iter()
            .filter(|r| matches!(r.status, Status::Quarantined { .. }))
            .map(|r| r.key.hex())
            .collect();
        rep.evicted.extend(quarantined.iter().cloned());
        records.retain(|r| !matches!(r.status, Status::Quarantined { .. }));
        // Artifacts of runtimes nobody keeps first, then least recently used.
        let keep = self.usage().keep().clone();
        records.sort_by_cached_key(|r| {
            (
                keep.keeps(&r.parts.backend.versions),
                r.last_used,
                r.created,
            )
        });
        // A running total (not a recount per candidate, which made a large gc quadratic).
        let mut remaining = super::usage::Usage::of(&records);
        for r in &records {
            if remaining.total() <= max_bytes {
                break;
            }
            if r.artifact.is_none() {
                continue;
            }
            rep.evicted.push(r.key.hex());
            remaining.set(r.key, None);
        }
        rep.bytes_after = remaining.total();
        if !dry_run {
            for k in &rep.evicted {
                if let Ok(key) = CacheKey::parse(k) {
                    self.remove(&key)?;
                }
            }
            let by_size = rep.evicted.len() - quarantined.len();
            self.evicted
                .fetch_add(by_size as u64, std::sync::atomic::Ordering::Relaxed);
            if !quarantined.is_empty() {
                let q = self.root.join("quarantine");
                for e in std::fs::read_dir(&q).map_err(io(&q))?.flatten() {
                    if marker::own_quarantine(&e.file_name().to_string_lossy()) {
                        let p = e.path();
                        marker::remove(&p).map_err(io(&p))?;
                    }
                }
            }
        }
        Ok(rep)
    }
}
