//! On a local miss: the manifest, its signature, every blob re-hashed while it downloads
//! into a staging directory of the local store, this host's own check, then the local
//! store's ordinary (atomic) put. A crash at any point leaves only a staging directory,
//! which the store removes at its next open.

use std::io::Write;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use object_store::ObjectStoreExt;
use sha2::{Digest, Sha256};

use super::manifest::{Envelope, Manifest, Rejection};
use super::{Counters, Inner, RemoteError, RemoteTier};
use crate::cache::{
    now_secs, Lookup, Provenance, Record, StagedArtifact, Status, Store, StoredFile, RECORD_FORMAT,
};
use crate::key::{hex, CacheKey, KeyParts};

/// This host's own check of a fetched artifact before it is stored (at least: it opens).
pub type Check<'a> = &'a dyn Fn(&StagedArtifact, &Manifest) -> Result<(), String>;

enum Fail {
    Bad(Rejection),
    Io(PathBuf, std::io::Error),
    /// No answer, or no next piece of the body, within `stall`.
    Stalled,
}

/// Streams `path` into `dest`, hashing as it goes; refuses more bytes than the manifest
/// says, fewer, or other bytes. The answer and each piece of the body must come within
/// `stall` (a slow but moving download goes on; a stuck one ends). The outer error is the
/// network's.
async fn download(
    os: &dyn object_store::ObjectStore,
    path: &object_store::path::Path,
    dest: &Path,
    want: &StoredFile,
    stall: std::time::Duration,
) -> object_store::Result<Result<(), Fail>> {
    let Ok(got) = tokio::time::timeout(stall, os.get(path)).await else {
        return Ok(Err(Fail::Stalled));
    };
    let mut stream = got?.into_stream();
    let io = |e| Ok(Err(Fail::Io(dest.to_path_buf(), e)));
    let mut f = match std::fs::File::create(dest) {
        Ok(f) => f,
        Err(e) => return io(e),
    };
    let bad = |why: String| {
        Ok(Err(Fail::Bad(Rejection::Integrity {
            name: want.name.clone(),
            sha256: want.sha256.clone(),
            why,
        })))
    };
    let mut h = Sha256::new();
    let mut n = 0u64;
    loop {
        let Ok(next) = tokio::time::timeout(stall, stream.next()).await else {
            return Ok(Err(Fail::Stalled));
        };
        let Some(chunk) = next else { break };
        let chunk = chunk?;
        n += chunk.len() as u64;
        if n > want.bytes {
            return bad(format!("longer than the manifest's {} bytes", want.bytes));
        }
        h.update(&chunk);
        if let Err(e) = f.write_all(&chunk) {
            return io(e);
        }
    }
    if n != want.bytes {
        return bad(format!("truncated: {n} of {} bytes", want.bytes));
    }
    let digest = hex(&h.finalize());
    if digest != want.sha256 {
        return bad(format!("its SHA-256 is {digest}"));
    }
    if let Err(e) = f.sync_all() {
        return io(e);
    }
    Ok(Ok(()))
}

impl RemoteTier {
    /// The remote manifest for `key`, verified (signature, key, parts, verdict), or `None`
    /// when the bucket has none. Counts nothing.
    pub fn manifest(&self, key: &CacheKey) -> Result<Option<Manifest>, RemoteError> {
        Ok(self.inner.manifest(key)?.map(|(m, _)| m))
    }

    /// On a local miss: fetches `parts`' artifact into `store` when the bucket holds one that
    /// this host trusts, whose every file re-hashes to the manifest and that passes `check`.
    /// `Ok(None)`: the bucket has none (a miss). Every `Err` is counted and logged; the
    /// caller builds locally. `model_path` is recorded as the record's (informational) model.
    #[tracing::instrument(skip_all, fields(key = %parts.key()))]
    pub fn fetch(
        &self,
        parts: &KeyParts,
        model_path: &str,
        store: &dyn Store,
        check: Check,
    ) -> Result<Option<Record>, RemoteError> {
        let c = &self.inner.counters;
        match self.inner.fetch(parts, model_path, store, check) {
            Ok(Some(r)) => {
                Counters::add(&c.hits);
                tracing::info!(bytes = r.bytes(), "fetched from the remote tier");
                Ok(Some(r))
            }
            Ok(None) => {
                Counters::add(&c.misses);
                Ok(None)
            }
            Err(e) => {
                c.count_err(&e);
                tracing::warn!(error = %e, "remote fetch failed; building locally");
                Err(e)
            }
        }
    }
}

impl Inner {
    /// The verified manifest and the trusted key that signed it (see
    /// [`Envelope::open_signed`]).
    pub(super) fn manifest(
        &self,
        key: &CacheKey,
    ) -> Result<Option<(Manifest, Option<String>)>, RemoteError> {
        let op = "get manifest";
        let bytes = match self.lookup(op, async {
            let r = self.os.get(&self.manifest_path(key)).await?;
            r.bytes().await
        })? {
            Ok(b) => b,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Self::unavailable(op, e)),
        };
        Envelope::open_signed(&bytes, &self.trusted, key)
            .map(Some)
            .map_err(|reason| RemoteError::Rejected {
                key: key.hex(),
                reason,
            })
    }

    fn fetch(
        &self,
        parts: &KeyParts,
        model_path: &str,
        store: &dyn Store,
        check: Check,
    ) -> Result<Option<Record>, RemoteError> {
        let key = parts.key();
        let Some((m, signer)) = self.manifest(&key)? else {
            return Ok(None);
        };
        let rejected = |reason| RemoteError::Rejected {
            key: key.hex(),
            reason,
        };
        if m.parts != *parts {
            return Err(rejected(Rejection::WrongKey {
                want: key.hex(),
                why: "its key parts differ from this host's".into(),
            }));
        }
        let staging = store.staging_dir()?;
        for f in &m.files {
            let dest = staging.path().join(&f.name);
            let op = "get blob";
            let stall = self.cfg.lookup_timeout();
            match self.call(
                op,
                download(&*self.os, &self.blob_path(&f.sha256), &dest, f, stall),
            )? {
                Ok(Ok(())) => {}
                Ok(Err(Fail::Stalled)) => return Err(self.no_answer(op)),
                Ok(Err(Fail::Bad(reason))) => return Err(rejected(reason)),
                Ok(Err(Fail::Io(path, source))) => {
                    return Err(RemoteError::Store(crate::cache::StoreError::io(
                        &path, source,
                    )))
                }
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(RemoteError::MissingBlob {
                        key: key.hex(),
                        name: f.name.clone(),
                        sha256: f.sha256.clone(),
                    })
                }
                Err(e) => return Err(Self::unavailable(op, e)),
            }
        }
        let artifact = StagedArtifact {
            dir: staging.path().to_path_buf(),
            entry: m.entry.clone(),
            files: m.files.iter().map(|f| f.name.clone()).collect(),
            rewrites: Vec::new(),
        };
        check(&artifact, &m).map_err(|message| RemoteError::CheckFailed {
            key: key.hex(),
            message,
        })?;
        let now = now_secs();
        let record = Record {
            format: RECORD_FORMAT,
            key,
            parts: m.parts.clone(),
            status: Status::Ready,
            artifact: None,
            backend: m.backend,
            providers: m.providers.clone(),
            partitions: m.partitions.clone(),
            model_path: model_path.to_string(),
            build_ms: m.build_ms,
            validation: m.validation.clone(),
            created: now,
            last_used: now,
            hits: 0,
            provenance: Provenance::Fetched {
                signer,
                builder: m.builder.host.clone(),
            },
        };
        // The store's own put hashes the files again and commits them atomically.
        let stored = store.put(record, Some(&artifact))?;
        drop(staging);
        match store.peek(&key)? {
            Lookup::Hit { .. } => Ok(Some(stored)),
            Lookup::Unservable { why, .. } => Err(RemoteError::CheckFailed {
                key: key.hex(),
                message: format!("stored but not servable: {why}"),
            }),
            Lookup::Miss => Err(RemoteError::CheckFailed {
                key: key.hex(),
                message: "stored but gone (evicted at once by the size limit?)".into(),
            }),
        }
    }
}
