//! Stage 7: the artifact store. A [`Store`] maps a [`CacheKey`] to a versioned [`Record`] and
//! holds the artifact files it names; [`disk::SledStore`] is the local implementation (sled
//! index + content-addressed blob directories), and a remote tier or an in-memory store can
//! implement the same trait.
//!
//! Enters: records and staged artifact directories from `build`. Leaves: servable artifacts
//! (paths checked to exist with the recorded sizes), listings, verify/gc reports. A failed,
//! quarantined or incomplete entry is never returned as a hit.

pub(crate) mod disk;
pub(crate) mod files;
pub(crate) mod lock;
pub(crate) mod record;
pub(crate) mod store;

use std::path::Path;

pub use disk::{OpenReport, SledStore, StoreOptions};

/// Makes `dir` a cache folder when it is missing (its parent must exist) or empty, or checks
/// it is one: what a command that writes its own files there (`key`'s digest memo) needs.
/// A folder that is not a cache is refused, untouched.
pub fn claim_dir(dir: &Path) -> Result<(), StoreError> {
    disk::SledStore::claim(dir, false)
}

/// Whether `dir` is a trtcache cache folder (tagged, or made by an older trtcache): the
/// only folders trtcache writes its own files into ([`disk::marker`]).
pub fn is_cache(dir: &std::path::Path) -> bool {
    matches!(
        disk::marker::standing(dir),
        Ok(disk::marker::Standing::Tagged | disk::marker::Standing::Legacy)
    )
}
pub use record::{
    OutputError, PrepackProbe, Provenance, Record, ScaledProbe, StagedArtifact, Status,
    StoredArtifact, StoredFile, ThreadProbe, ValidationReport, RECORD_FORMAT,
};

pub use store::{
    free_bytes, is_no_space, now_secs, parse_size, resolve_key, GcReport, KeyPrefixError, Lookup,
    RepairReport, RuntimeKeep, Served, Store, StoreError, VerifyReport, DIGEST_MEMO,
    DIGEST_MEMO_JOURNAL,
};
