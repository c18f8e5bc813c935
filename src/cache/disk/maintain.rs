//! Maintenance of the local store: reconciling the index with the files at open, `verify`
//! (re-hash and quarantine) and `gc` (LRU eviction to a size limit).

use std::collections::{BTreeMap, BTreeSet};

use super::{hash_file, io, OpenReport, SledStore};
use crate::cache::record::{Record, Status};
use crate::cache::{now_secs, GcReport, Store, StoreError, VerifyReport};
use crate::key::CacheKey;

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
    pub(super) fn reconcile(&self) -> Result<OpenReport, StoreError> {
        let mut rep = OpenReport::default();
        let tmp = self.root.join("tmp");
        for e in std::fs::read_dir(&tmp).map_err(io(&tmp))? {
            let p = e.map_err(io(&tmp))?.path();
            let r = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            r.map_err(io(&p))?;
            rep.temp_removed += 1;
        }
        // The digest memo is written next to the index (temp file, then rename); a writer
        // killed in between leaves its temp file behind.
        rep.temp_removed += crate::key::memo::remove_dead_temps(&self.root);
        let mut named = BTreeSet::new();
        for r in self.all_records()? {
            if let (Status::Ready, Some(a)) = (&r.status, &r.artifact) {
                if let Err(why) = self.cheap_check(a) {
                    tracing::warn!(key = %r.key, %why, "dropping cache record: artifact files missing");
                    self.records.remove(r.key.0).map_err(|e| self.db_err(e))?;
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
            if !named.contains(&name) {
                let p = e.path();
                let r = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                r.map_err(io(&p))?;
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
            let dst = self
                .root
                .join("quarantine")
                .join(format!("{digest}-{}", now_secs()));
            std::fs::rename(&src, &dst).map_err(io(&src))?;
        }
        Ok(())
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
            let dir = self.blob_dir(&a.digest);
            let mut why = None;
            for f in &a.files {
                let p = dir.join(&f.name);
                match hash_file(&p) {
                    Ok((sha, n)) if sha == f.sha256 && n == f.bytes => {}
                    Ok((sha, n)) => {
                        why = Some(format!(
                            "{}: sha256 {sha} ({n} B), recorded {} ({} B)",
                            f.name, f.sha256, f.bytes
                        ));
                        break;
                    }
                    Err(e) => {
                        why = Some(format!("{}: {e}", f.name));
                        break;
                    }
                }
            }
            match why {
                None => {
                    good.insert(a.digest.clone());
                }
                Some(w) => {
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
        records.sort_by(|a, b| {
            a.last_used
                .cmp(&b.last_used)
                .then(a.created.cmp(&b.created))
        });
        let mut remaining = records.clone();
        for r in &records {
            if Self::stored_bytes(&remaining) <= max_bytes {
                break;
            }
            if r.artifact.is_none() {
                continue;
            }
            rep.evicted.push(r.key.hex());
            remaining.retain(|x| x.key != r.key);
        }
        rep.bytes_after = Self::stored_bytes(&remaining);
        if !dry_run {
            for k in &rep.evicted {
                if let Ok(key) = CacheKey::parse(k) {
                    self.remove(&key)?;
                }
            }
            if !quarantined.is_empty() {
                let q = self.root.join("quarantine");
                for e in std::fs::read_dir(&q).map_err(io(&q))?.flatten() {
                    let p = e.path();
                    std::fs::remove_dir_all(&p).map_err(io(&p))?;
                }
            }
        }
        Ok(rep)
    }
}
