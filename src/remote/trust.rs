//! Trust checked again after a fetch. A fetched entry records the key whose signature this
//! host verified ([`Provenance::Fetched`]); when that key leaves `remote.trusted_keys` (or
//! signatures become required) the entry is refused: the daemon's engine treats it as a
//! miss when it loads it (once per key after every start; a configuration reload restarts
//! the daemon), and `pull` and `push` drop it before they use the cache. Only entries this
//! host built and validated itself are ever uploaded: a fetched one signed again with this
//! host's key would reach hosts that never trusted its builder.

use super::RemoteTier;
use crate::cache::{Provenance, Status, Store, StoreError};
use crate::key::CacheKey;

impl RemoteTier {
    /// Why an entry of this provenance may no longer be served under the current trust set;
    /// `None` when it may (built here, recorded before provenance was kept, or this host
    /// accepts unsigned manifests).
    pub fn distrusts(&self, p: &Provenance) -> Option<String> {
        let trusted = &self.inner.trusted;
        if trusted.is_empty() {
            return None;
        }
        match p {
            Provenance::Fetched {
                signer: Some(s), ..
            } if !trusted.iter().any(|k| k.name == *s) => Some(format!(
                "fetched under the signature of `{s}`, which remote.trusted_keys no longer lists"
            )),
            Provenance::Fetched { signer: None, .. } => Some(
                "fetched unsigned while remote.trusted_keys was empty; signatures are required now"
                    .into(),
            ),
            _ => None,
        }
    }

    /// Removes every entry of `store` that [`RemoteTier::distrusts`]; the keys removed, with
    /// why.
    pub fn drop_untrusted(&self, store: &dyn Store) -> Result<Vec<(CacheKey, String)>, StoreError> {
        let mut dropped = Vec::new();
        for r in store.list()? {
            if r.status != Status::Ready {
                continue;
            }
            if let Some(why) = self.distrusts(&r.provenance) {
                if store.remove(&r.key)? {
                    tracing::warn!(key = %r.key, model = %r.model_path, %why, "dropped a fetched entry this host no longer trusts");
                    dropped.push((r.key, why));
                }
            }
        }
        Ok(dropped)
    }
}

/// Why an entry of this provenance is never uploaded, if it is not.
pub(super) fn not_pushable(p: &Provenance) -> Option<&'static str> {
    match p {
        Provenance::Built => None,
        Provenance::Fetched { .. } => Some(
            "it was fetched from the fleet tier, not built here (only what this host built and validated is uploaded)",
        ),
        Provenance::Unknown => Some(
            "its record predates provenance, so it may have been fetched rather than built here; rebuild it (`trtcache build --force`) to upload it",
        ),
    }
}
