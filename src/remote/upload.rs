//! Uploads: blobs first (re-hashed from the local files as they are read, so a locally
//! damaged file never reaches the fleet), then the signed manifest, create-only. The
//! manifest is read back after every write, whatever the server answered: a server that
//! ignores `If-None-Match` cannot make two hosts disagree, since both adopt what is there.

use std::io::Read;
use std::path::{Path, PathBuf};

use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::manifest::{BuilderIdentity, Envelope, Manifest};
use super::{Counters, Inner, Mode, RemoteError, RemoteTier};
use crate::cache::{Record, StoredFile};
use crate::key::hex;

/// A validated local record and the directory holding its files.
#[derive(Clone, Debug)]
pub struct UploadJob {
    pub record: Record,
    pub dir: PathBuf,
    /// Release this host's build lease on the key once the upload is done (or failed), so
    /// hosts waiting on the lease find the manifest rather than an empty bucket.
    pub release_lease: bool,
}

/// What an upload did.
#[derive(Clone, Debug, Serialize)]
pub struct UploadOutcome {
    pub key: String,
    /// Blobs sent (the others were already in the bucket, read back and hashed).
    pub blobs_uploaded: usize,
    /// Blobs already in the bucket whose content hashes to the manifest's SHA-256 (not
    /// sent again); a blob of the right size but other bytes is sent again.
    #[serde(default)]
    pub blobs_verified: usize,
    pub bytes_uploaded: u64,
    /// This host's manifest is the one in the bucket.
    pub manifest_written: bool,
    /// Another writer's manifest was there first and is adopted (its builder).
    pub adopted: Option<String>,
}

enum Local {
    Io(PathBuf, std::io::Error),
    Changed(String),
}

/// Sends one local file to `path`, multipart at `part` bytes and above, checking its hash.
async fn put_blob(
    os: &dyn object_store::ObjectStore,
    path: &object_store::path::Path,
    src: &Path,
    f: &StoredFile,
    part: usize,
) -> object_store::Result<Result<(), Local>> {
    let io = |e| Ok(Err(Local::Io(src.to_path_buf(), e)));
    let mut file = match std::fs::File::open(src) {
        Ok(x) => x,
        Err(e) => return io(e),
    };
    let mut h = Sha256::new();
    let mut n = 0u64;
    if f.bytes < part as u64 {
        let mut buf = Vec::with_capacity(f.bytes as usize);
        if let Err(e) = file.read_to_end(&mut buf) {
            return io(e);
        }
        h.update(&buf);
        n = buf.len() as u64;
        if hex(&h.finalize()) != f.sha256 || n != f.bytes {
            return Ok(Err(Local::Changed(f.name.clone())));
        }
        os.put(path, PutPayload::from(buf)).await?;
        return Ok(Ok(()));
    }
    let up = os.put_multipart(path).await?;
    let mut w = WriteMultipart::new_with_chunk_size(up, part);
    let mut buf = vec![0u8; part];
    loop {
        let r = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(r) => r,
            Err(e) => {
                let _ = w.abort().await;
                return io(e);
            }
        };
        h.update(&buf[..r]);
        n += r as u64;
        if let Err(e) = w.wait_for_capacity(4).await {
            let _ = w.abort().await;
            return Err(e);
        }
        w.write(&buf[..r]);
    }
    // Completing a multipart upload publishes it: check the local bytes first.
    if hex(&h.finalize()) != f.sha256 || n != f.bytes {
        let _ = w.abort().await;
        return Ok(Err(Local::Changed(f.name.clone())));
    }
    w.finish().await?;
    Ok(Ok(()))
}

/// Whether the bucket's blob at `path` holds exactly `f`'s bytes: its size, then its content
/// hashed as it streams (sizes alone never repair a damaged blob). `false` when absent.
async fn same_blob(
    os: &dyn object_store::ObjectStore,
    path: &object_store::path::Path,
    f: &StoredFile,
) -> object_store::Result<bool> {
    use futures::StreamExt;
    let got = match os.get(path).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    if got.meta.size != f.bytes {
        return Ok(false);
    }
    let mut stream = got.into_stream();
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        n += chunk.len() as u64;
        if n > f.bytes {
            return Ok(false);
        }
        h.update(&chunk);
    }
    Ok(n == f.bytes && hex(&h.finalize()) == f.sha256)
}

impl RemoteTier {
    /// Uploads one validated record now (blocking): `trtcache push`. Blobs the bucket
    /// already holds are read back and hashed, and sent again unless their content matches;
    /// `overwrite` sends every blob without looking.
    pub fn upload(&self, job: &UploadJob, overwrite: bool) -> Result<UploadOutcome, RemoteError> {
        let r = self.inner.upload(job, overwrite);
        match &r {
            Ok(_) => Counters::add(&self.inner.counters.uploads),
            Err(e) => {
                self.inner.counters.count_err(e);
                tracing::warn!(key = %job.record.key, error = %e, "remote upload failed");
            }
        }
        r
    }

    /// Queues an upload for the worker (after a validated local build): never blocks and
    /// never fails the caller; a full queue drops the upload (counted as an error, logged).
    /// Read-only hosts ignore it.
    pub fn enqueue_upload(&self, job: UploadJob) {
        let Some(q) = &self.queue else {
            return;
        };
        {
            let mut n = self
                .inner
                .pending
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            *n += 1;
        }
        if let Err(e) = q.try_send(job) {
            self.inner.done_one();
            Counters::add(&self.inner.counters.errors);
            let key = match &e {
                std::sync::mpsc::TrySendError::Full(j)
                | std::sync::mpsc::TrySendError::Disconnected(j) => j.record.key,
            };
            tracing::warn!(%key, queue = self.inner.cfg.upload_queue, "remote upload queue full: upload dropped");
        }
    }

    /// Waits until every queued upload has finished, up to `timeout`; `false` if some are
    /// still pending then.
    pub fn flush_uploads(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let (m, cv) = &self.inner.pending;
        let mut n = m.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            n = cv
                .wait_timeout(n, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

/// The upload worker: one job at a time, each failure retried by the client's retry policy,
/// then counted and logged.
pub(super) fn worker(inner: &Inner, rx: std::sync::mpsc::Receiver<UploadJob>) {
    while let Ok(job) = rx.recv() {
        match inner.upload(&job, true) {
            Ok(o) => {
                Counters::add(&inner.counters.uploads);
                tracing::info!(key = %o.key, blobs = o.blobs_uploaded, bytes = o.bytes_uploaded, adopted = ?o.adopted, "uploaded to the remote tier");
            }
            Err(e) => {
                inner.counters.count_err(&e);
                tracing::warn!(key = %job.record.key, error = %e, "remote upload failed");
            }
        }
        if job.release_lease {
            if let Err(e) = inner.release_lease(&job.record.key) {
                tracing::warn!(key = %job.record.key, error = %e, "cannot release the build lease (it expires by itself)");
            }
        }
        inner.done_one();
    }
}

impl Inner {
    fn done_one(&self) {
        let mut n = self.pending.0.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        self.pending.1.notify_all();
    }

    fn upload(&self, job: &UploadJob, overwrite: bool) -> Result<UploadOutcome, RemoteError> {
        if self.cfg.mode != Mode::ReadWrite {
            return Err(RemoteError::ReadOnly);
        }
        let rec = &job.record;
        if let Some(why) = super::trust::not_pushable(&rec.provenance) {
            return Err(RemoteError::NotBuiltHere {
                key: rec.key.hex(),
                why,
            });
        }
        let builder = BuilderIdentity {
            host: self.host.clone(),
            key: self.signer.as_ref().map(|k| k.name.clone()),
            trtcache: env!("CARGO_PKG_VERSION").into(),
        };
        let manifest = Manifest::of(rec, builder).ok_or_else(|| RemoteError::CheckFailed {
            key: rec.key.hex(),
            message: "the record has no artifact to upload".into(),
        })?;
        manifest
            .check(&rec.key)
            .map_err(|reason| RemoteError::Rejected {
                key: rec.key.hex(),
                reason,
            })?;
        let mut out = UploadOutcome {
            key: rec.key.hex(),
            blobs_uploaded: 0,
            blobs_verified: 0,
            bytes_uploaded: 0,
            manifest_written: false,
            adopted: None,
        };
        let part = self.cfg.part_bytes as usize;
        for f in &manifest.files {
            let path = self.blob_path(&f.sha256);
            if !overwrite {
                match self.call("check blob", same_blob(&*self.os, &path, f))? {
                    Ok(true) => {
                        out.blobs_verified += 1;
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => return Err(Self::unavailable("check blob", e)),
                }
            }
            let src = job.dir.join(&f.name);
            match self.call("put blob", put_blob(&*self.os, &path, &src, f, part))? {
                Ok(Ok(())) => {}
                Ok(Err(Local::Io(p, source))) => return Err(RemoteError::Io { path: p, source }),
                Ok(Err(Local::Changed(name))) => {
                    return Err(RemoteError::CheckFailed {
                        key: rec.key.hex(),
                        message: format!("local file {name} no longer matches its record (run `trtcache verify`); not uploaded"),
                    })
                }
                Err(e) => return Err(Self::unavailable("put blob", e)),
            }
            out.blobs_uploaded += 1;
            out.bytes_uploaded += f.bytes;
        }
        let env = manifest.seal(self.signer.as_ref());
        // Plain strings and structs: cannot fail.
        let bytes = serde_json::to_vec(&env).unwrap_or_default();
        let mpath = self.manifest_path(&rec.key);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self.call(
            "put manifest",
            self.os
                .put_opts(&mpath, PutPayload::from(bytes.clone()), opts),
        )? {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(Self::unavailable("put manifest", e)),
        }
        // Read back whatever the server answered: what is there now is the fleet's manifest.
        let there = match self.call("get manifest", async {
            self.os.get(&mpath).await?.bytes().await
        })? {
            Ok(b) => b,
            Err(e) => return Err(Self::unavailable("get manifest", e)),
        };
        if there.as_ref() == bytes.as_slice() {
            out.manifest_written = true;
            return Ok(out);
        }
        let mut trusted = self.trusted.clone();
        if let Some(k) = &self.signer {
            trusted.push(k.public());
        }
        let theirs =
            Envelope::open(&there, &trusted, &rec.key).map_err(|reason| RemoteError::Rejected {
                key: rec.key.hex(),
                reason,
            })?;
        let same_writer = theirs.builder.host == self.host
            && theirs.builder.key == self.signer.as_ref().map(|k| k.name.clone());
        if same_writer && theirs.files == manifest.files {
            return Ok(out); // this host's own earlier upload
        }
        out.adopted = Some(format!(
            "{} ({})",
            theirs.builder.host,
            theirs.builder.key.as_deref().unwrap_or("unsigned")
        ));
        Ok(out)
    }
}
