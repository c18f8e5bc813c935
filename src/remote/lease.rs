//! Fleet single flight and bucket maintenance. A lease (`leases/<key>`: holder + expiry,
//! created create-only) says one host is building a key; others wait for its manifest,
//! bounded by the lease, instead of building too. An expired lease (its holder died) is taken
//! over with a conditional overwrite; as with manifests, the lease is read back after every
//! write, so a server that ignores preconditions cannot give two hosts the same lease.
//! `remote gc` prunes by age; local eviction never deletes remote objects.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::manifest::{Envelope, Manifest};
use super::{Inner, Mode, RemoteError, RemoteTier};
use crate::cache::{now_secs, Record, Store};
use crate::key::{CacheKey, KeyParts};

/// The object at `leases/<key>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub key: String,
    pub holder: String,
    /// Unix seconds after which anyone may take it over.
    pub expires: u64,
}

/// The outcome of [`RemoteTier::lease`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// This host holds the lease: build, then [`RemoteTier::release`].
    Acquired,
    /// Another live holder is building: wait for its manifest.
    HeldBy(Lease),
    /// No live lease (read-only hosts only: they never take one).
    Free,
}

/// One step of [`RemoteTier::before_build`].
#[derive(Debug)]
pub enum Before {
    /// Fetched, checked and stored.
    Fetched(Box<Record>),
    /// Another host holds the build lease: ask again after `lease_poll_ms`.
    Wait {
        lease: Lease,
        /// How long its lease may still be waited on ([`RemoteTier::lease_left`]).
        left: Duration,
    },
    /// Build here (this host holds the lease, is read-only with no live lease, or the tier
    /// failed).
    Build,
}

/// What `trtcache remote gc` did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RemoteGcReport {
    pub dry_run: bool,
    pub older_than_secs: u64,
    pub manifests_deleted: Vec<String>,
    pub blobs_deleted: Vec<String>,
    pub leases_deleted: Vec<String>,
    pub manifests_kept: usize,
    pub blobs_kept: usize,
}

impl RemoteTier {
    /// Takes the build lease for `key` (read-write hosts), or reports who holds it.
    pub fn lease(&self, key: &CacheKey) -> Result<LeaseState, RemoteError> {
        let r = self.inner.lease(key);
        if let Err(e) = &r {
            self.inner.counters.count_err(e);
        }
        r
    }

    /// Gives the lease back if this host holds it.
    pub fn release(&self, key: &CacheKey) -> Result<(), RemoteError> {
        self.inner.release_lease(key)
    }

    /// One step before building `parts` locally: the remote artifact if there is one; else,
    /// when another host holds a live lease, [`Before::Wait`] (ask again after
    /// `lease_poll_ms`, for no longer than [`Before::Wait::left`]); else take the lease
    /// (read-write) and [`Before::Build`]: build, upload, then
    /// [`release`](RemoteTier::release). Remote errors are `Build` (counted, logged). The
    /// caller does the waiting, so that no build slot or thread is held while it waits.
    pub fn before_build(
        &self,
        parts: &KeyParts,
        model_path: &str,
        store: &dyn Store,
        check: super::Check,
    ) -> Before {
        match self.fetch(parts, model_path, store, check) {
            Ok(Some(r)) => return Before::Fetched(Box::new(r)),
            Ok(None) => {}
            Err(_) => return Before::Build,
        }
        match self.lease(&parts.key()) {
            Ok(LeaseState::HeldBy(l)) => Before::Wait {
                left: self.lease_left(&l),
                lease: l,
            },
            Ok(LeaseState::Acquired) | Ok(LeaseState::Free) | Err(_) => Before::Build,
        }
    }

    /// How long `lease` may still be waited on: what it claims, never more than this host's
    /// own `lease_secs` (a lease that names an expiry far in the future, or a holder that
    /// keeps renewing, must not hold this host's builds longer than its own leases last).
    pub fn lease_left(&self, lease: &Lease) -> Duration {
        let claimed = lease.expires.saturating_sub(now_secs());
        Duration::from_secs(claimed.min(self.inner.cfg.lease_secs))
    }

    /// How often a waiting host asks again (`lease_poll_ms`).
    pub fn lease_poll(&self) -> Duration {
        Duration::from_millis(self.inner.cfg.lease_poll_ms)
    }

    /// Polls for `key`'s manifest while `lease` is live, for at most [`Self::lease_left`]
    /// (blocking; `trtcache pull` and tests: the daemon's queue polls through
    /// [`Self::before_build`] instead); `true` once a manifest exists.
    pub fn wait_for_manifest(&self, key: &CacheKey, lease: &Lease) -> bool {
        let inner = &self.inner;
        let poll = self.lease_poll();
        let until = std::time::Instant::now() + self.lease_left(lease);
        loop {
            match inner.manifest(key) {
                Ok(Some(_)) => return true,
                // A refused manifest is there: fetch will count and refuse it.
                Err(RemoteError::Rejected { .. }) => return true,
                Ok(None) => {}
                Err(_) => return false,
            }
            match inner.read_lease(key) {
                Ok(Some((l, _)))
                    if l.holder == lease.holder
                        && l.expires > now_secs()
                        && std::time::Instant::now() < until => {}
                _ => return inner.manifest(key).ok().flatten().is_some(),
            }
            std::thread::sleep(poll);
        }
    }

    /// The manifest, as raw envelope, for tests and `push` reports: `None` when absent.
    pub fn raw_manifest(&self, key: &CacheKey) -> Result<Option<Vec<u8>>, RemoteError> {
        let inner = &self.inner;
        match inner.call("get manifest", async {
            inner.os.get(&inner.manifest_path(key)).await?.bytes().await
        })? {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Inner::unavailable("get manifest", e)),
        }
    }

    /// Deletes manifests older than `older_than`, then blobs of that age no remaining
    /// manifest names, and expired leases. Needs a read-write host.
    pub fn gc(&self, older_than: Duration, dry_run: bool) -> Result<RemoteGcReport, RemoteError> {
        self.inner.gc(older_than, dry_run)
    }
}

impl Inner {
    pub(super) fn release_lease(&self, key: &CacheKey) -> Result<(), RemoteError> {
        if self.cfg.mode != Mode::ReadWrite {
            return Ok(());
        }
        if let Some((l, _)) = self.read_lease(key)? {
            if l.holder == self.holder {
                match self.lookup("delete lease", self.os.delete(&self.lease_path(key)))? {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(Self::unavailable("delete lease", e)),
                }
            }
        }
        Ok(())
    }

    /// The lease object and its version, `None` when absent; an unreadable one counts as
    /// expired (held by nobody).
    fn read_lease(&self, key: &CacheKey) -> Result<Option<(Lease, UpdateVersion)>, RemoteError> {
        let path = self.lease_path(key);
        let got = self.lookup("get lease", async {
            let r = self.os.get(&path).await?;
            let v = UpdateVersion {
                e_tag: r.meta.e_tag.clone(),
                version: r.meta.version.clone(),
            };
            Ok((r.bytes().await?, v))
        })?;
        match got {
            Ok((b, v)) => {
                let l = serde_json::from_slice::<Lease>(&b).unwrap_or(Lease {
                    key: key.hex(),
                    holder: "(unreadable lease)".into(),
                    expires: 0,
                });
                Ok(Some((l, v)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Self::unavailable("get lease", e)),
        }
    }

    fn lease(&self, key: &CacheKey) -> Result<LeaseState, RemoteError> {
        if self.cfg.mode != Mode::ReadWrite {
            return Ok(match self.read_lease(key)? {
                Some((l, _)) if l.expires > now_secs() => LeaseState::HeldBy(l),
                _ => LeaseState::Free,
            });
        }
        let path = self.lease_path(key);
        for _ in 0..4 {
            let mine = Lease {
                key: key.hex(),
                holder: self.holder.clone(),
                expires: now_secs() + self.cfg.lease_secs,
            };
            let body = PutPayload::from(serde_json::to_vec(&mine).unwrap_or_default());
            let mode = match self.read_lease(key)? {
                None => PutMode::Create,
                Some((l, _)) if l.expires > now_secs() && l.holder != self.holder => {
                    return Ok(LeaseState::HeldBy(l))
                }
                Some((l, v)) => {
                    tracing::info!(%key, holder = %l.holder, "taking over an expired build lease");
                    PutMode::Update(v)
                }
            };
            let opts = PutOptions {
                mode,
                ..Default::default()
            };
            match self.lookup("put lease", self.os.put_opts(&path, body, opts))? {
                Ok(_) => {}
                // Someone else wrote it between our read and our write: look again.
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => continue,
                Err(e) => return Err(Self::unavailable("put lease", e)),
            }
            // Read back: the holder named there holds it, whatever the server said.
            return Ok(match self.read_lease(key)? {
                Some((l, _)) if l.holder == self.holder => LeaseState::Acquired,
                Some((l, _)) => LeaseState::HeldBy(l),
                None => continue,
            });
        }
        Err(RemoteError::Unavailable {
            op: "put lease".into(),
            message: "the lease kept changing under this host (4 tries)".into(),
        })
    }

    fn gc(&self, older_than: Duration, dry_run: bool) -> Result<RemoteGcReport, RemoteError> {
        if self.cfg.mode != Mode::ReadWrite {
            return Err(RemoteError::ReadOnly);
        }
        let cutoff = now_secs().saturating_sub(older_than.as_secs()) as i64;
        let mut rep = RemoteGcReport {
            dry_run,
            older_than_secs: older_than.as_secs(),
            ..Default::default()
        };
        let list = |rel: &str| {
            let p = self.path(rel);
            let os = self.os.clone();
            async move { os.list(Some(&p)).try_collect::<Vec<_>>().await }
        };
        let manifests = self
            .call("list manifests", list("manifests"))?
            .map_err(|e| Self::unavailable("list manifests", e))?;
        let mut referenced = BTreeSet::new();
        for m in &manifests {
            if m.last_modified.timestamp() < cutoff {
                rep.manifests_deleted.push(m.location.to_string());
                continue;
            }
            rep.manifests_kept += 1;
            let bytes = self
                .call("get manifest", async {
                    self.os.get(&m.location).await?.bytes().await
                })?
                .map_err(|e| Self::unavailable("get manifest", e))?;
            // Any readable manifest keeps its blobs, trusted or not: gc only removes by age.
            if let Some(man) = serde_json::from_slice::<Envelope>(&bytes)
                .ok()
                .and_then(|e| serde_json::from_str::<Manifest>(&e.manifest).ok())
            {
                referenced.extend(man.files.into_iter().map(|f| f.sha256));
            }
        }
        let blobs = self
            .call("list blobs", list("blobs/sha256"))?
            .map_err(|e| Self::unavailable("list blobs", e))?;
        for b in &blobs {
            let digest = b.location.filename().unwrap_or_default().to_string();
            if b.last_modified.timestamp() < cutoff && !referenced.contains(&digest) {
                rep.blobs_deleted.push(b.location.to_string());
            } else {
                rep.blobs_kept += 1;
            }
        }
        let leases = self
            .call("list leases", list("leases"))?
            .map_err(|e| Self::unavailable("list leases", e))?;
        for l in &leases {
            if l.last_modified.timestamp() + (self.cfg.lease_secs as i64) < now_secs() as i64 {
                rep.leases_deleted.push(l.location.to_string());
            }
        }
        if !dry_run {
            for p in rep
                .manifests_deleted
                .iter()
                .chain(&rep.blobs_deleted)
                .chain(&rep.leases_deleted)
            {
                let path = object_store::path::Path::from(p.as_str());
                match self.call("delete", self.os.delete(&path))? {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(Self::unavailable("delete", e)),
                }
            }
        }
        Ok(rep)
    }
}
