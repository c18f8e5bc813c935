//! Stage 6: cache keys. A key is SHA-256 over a versioned, canonical encoding of everything an
//! artifact depends on ([`KeyParts`]): the model's content digest (graph bytes plus every
//! external-data file), opset imports, the shape profile, the device SKU, the backend with its
//! library versions, the precision and every build option. Never a path, file name or mtime.
//!
//! [`digest`] hashes files (a parallel SHA-256 tree), [`memo`] remembers digests by file
//! identity (library versions come from `libs`), and `parts` assembles
//! [`KeyParts`] from a loaded model, a plan, the device SKU and a backend. See docs/keys.md.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::device::Sku;
pub use crate::spec::{hex, CacheKey};
use crate::spec::{Backend, Precision, ShapeProfile};

/// Version of the key encoding; bump it whenever [`KeyParts`] or its encoding changes.
pub const KEY_FORMAT: u32 = 1;

/// Errors of key derivation.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    #[error("{path}: cannot hash: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("backend {backend}: {why}")]
    Library { backend: Backend, why: String },
    #[error("backend {backend} builds for an NVIDIA GPU, and none is usable: {why}")]
    NoGpu { backend: Backend, why: String },
}

/// SHA-256 of one external-data file, by its location relative to the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalDigest {
    pub location: String,
    pub sha256: String,
    pub bytes: u64,
}

/// Content digest of a model: the graph file and its external-data files (sorted by location).
/// The `sha256` fields hold the tree digest of [`digest`] (SHA-256 over 4 MiB chunk hashes),
/// not `sha256sum`'s value; [`plain_model_digest`] gives that.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDigest {
    pub sha256: String,
    pub bytes: u64,
    pub external: Vec<ExternalDigest>,
}

/// A backend and the versions of the libraries it builds with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendId {
    pub name: Backend,
    /// Library → version, e.g. `onnxruntime` → `1.31.1`, `tensorrt` → `10.15.1`.
    pub versions: BTreeMap<String, String>,
}

/// Everything an artifact depends on. Field order and `BTreeMap`s make the JSON encoding
/// canonical.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyParts {
    pub format: u32,
    pub model: ModelDigest,
    pub opsets: BTreeMap<String, i64>,
    pub profile: Option<ShapeProfile>,
    pub sku: Sku,
    pub backend: BackendId,
    pub precision: Precision,
    /// Every other build option, as canonical strings.
    pub options: BTreeMap<String, String>,
}

impl KeyParts {
    /// The canonical encoding that is hashed.
    pub fn canonical(&self) -> Vec<u8> {
        let mut out = format!("trtcache-key-v{}\n", self.format).into_bytes();
        // Serialising plain structs, strings, integers and BTreeMaps cannot fail.
        out.extend(serde_json::to_vec(self).unwrap_or_default());
        out
    }

    /// The cache key.
    pub fn key(&self) -> CacheKey {
        CacheKey(Sha256::digest(self.canonical()).into())
    }
}

pub(crate) mod digest;
pub mod memo;
mod parts;

pub use parts::{
    backend_id, detect_sku, key_for, key_parts, model_digest, model_digest_with, opsets_of,
    plain_model_digest, sku_for_backend, DigestOptions, DigestReport, KeyInput,
};
