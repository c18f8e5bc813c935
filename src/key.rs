//! Stage 4: cache keys. A key is SHA-256 over a versioned, canonical encoding of everything an
//! artifact depends on ([`KeyParts`]): the model's content digest (graph bytes plus every
//! external-data file), opset imports, the shape profile, the device SKU, the backend with its
//! library versions, the precision and every build option. Never a path, file name or mtime.
//!
//! [`digest`] hashes files (a parallel SHA-256 tree), [`memo`] remembers digests by file
//! identity, [`versions`] finds library versions without loading them, and `parts` assembles
//! [`KeyParts`] from a loaded model, a plan, the device SKU and a backend. See docs/keys.md.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::device::Sku;
use crate::plan::{Precision, ShapeProfile};

/// Version of the key encoding; bump it whenever [`KeyParts`] or its encoding changes.
pub const KEY_FORMAT: u32 = 1;

/// Errors of key derivation.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("`{0}` is not a cache key (64 hex digits)")]
    BadKey(String),
    #[error("{path}: cannot hash: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown backend `{0}`; known: ort-cpu, ort-cuda, ort-tensorrt")]
    UnknownBackend(String),
    #[error("backend {backend}: {why}")]
    Library { backend: String, why: String },
    #[error("backend {backend} builds for an NVIDIA GPU, and none is usable: {why}")]
    NoGpu { backend: String, why: String },
}

/// A cache key: SHA-256 of the canonical encoding of [`KeyParts`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey(pub [u8; 32]);

/// Lower-case hex of bytes (sha2 0.11 digests do not implement `LowerHex`).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

impl CacheKey {
    /// 64 lower-case hex digits.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex digits.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(KeyError::BadKey(s.into()));
        }
        let nib = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            match (nib(b[2 * i]), nib(b[2 * i + 1])) {
                (Some(h), Some(l)) => *o = h << 4 | l,
                _ => return Err(KeyError::BadKey(s.into())),
            }
        }
        Ok(Self(out))
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.hex())
    }
}

impl Serialize for CacheKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for CacheKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CacheKey::parse(&s).map_err(serde::de::Error::custom)
    }
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
    /// `ort-cpu`, `ort-cuda`, `ort-tensorrt`.
    pub name: String,
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

pub mod digest;
pub mod memo;
mod parts;
pub mod versions;

pub use parts::{
    backend_id, backend_id_with, detect_sku, key_for_plan, key_parts, model_digest,
    model_digest_with, opsets_of, plain_model_digest, sku_for_backend, DigestOptions, DigestReport,
    BACKENDS,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let k = CacheKey([0xab; 32]);
        assert_eq!(CacheKey::parse(&k.hex()).unwrap(), k);
        assert!(CacheKey::parse("xyz").is_err());
        assert!(CacheKey::parse(&"g".repeat(64)).is_err());
    }
}
