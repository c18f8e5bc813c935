//! The manifest that describes one artifact in the bucket, and its signed envelope.
//!
//! The manifest is serialized once, canonically (struct field order, `BTreeMap`s), and the
//! signatures are over exactly those bytes, which the envelope carries as a string: a
//! verifier never re-serializes, so no canonicalization can differ between hosts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sign::{NamedPublicKey, NamedSigningKey, Signature};
use crate::cache::ValidationReport;
use crate::cache::{Record, StoredFile};
use crate::key::{CacheKey, KeyParts};

/// Version of the manifest encoding.
pub const MANIFEST_FORMAT: u32 = 1;

/// Who built and uploaded an artifact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuilderIdentity {
    /// Host name of the builder.
    pub host: String,
    /// Name of the key that signed the upload (none when unsigned).
    pub key: Option<String>,
    /// trtcache version of the builder.
    pub trtcache: String,
}

/// Everything a host needs to trust and fetch one artifact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub key: CacheKey,
    /// Every key part; `parts.key()` must equal `key`.
    pub parts: KeyParts,
    pub backend: crate::spec::Backend,
    /// The file to open.
    pub entry: String,
    /// Each file's name, SHA-256 and size; blobs are `blobs/sha256/<sha256>`.
    pub files: Vec<StoredFile>,
    /// Library → version of the runtime that built it (the key parts' backend versions).
    pub runtime: BTreeMap<String, String>,
    pub builder: BuilderIdentity,
    /// The builder's validation verdict (passed, tolerances, errors per output).
    pub validation: Option<ValidationReport>,
    pub providers: Option<BTreeMap<String, usize>>,
    pub partitions: Option<Vec<String>>,
    pub build_ms: u64,
    /// Unix seconds of the upload.
    pub created: u64,
}

/// The object stored at `manifests/<key>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub format: u32,
    /// The canonical JSON of the [`Manifest`]: the bytes the signatures cover.
    pub manifest: String,
    pub signatures: Vec<Signature>,
}

/// Why a manifest was refused (fail closed: nothing it names is served).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("manifest is not valid JSON of a signed manifest: {0}")]
    Malformed(String),
    #[error("manifest is unsigned and remote.trusted_keys requires a signature")]
    Unsigned,
    #[error("manifest is signed only by keys this host does not trust ({0})")]
    Untrusted(String),
    #[error("manifest signature by `{0}` does not verify: the manifest was changed after signing")]
    BadSignature(String),
    #[error("manifest does not describe key {want}: {why}")]
    WrongKey { want: String, why: String },
    #[error("manifest's artifact failed its builder's validation")]
    NotValidated,
    #[error("manifest names an unusable file: {0}")]
    BadFile(String),
    #[error("blob {name} ({sha256}) does not match the manifest: {why}")]
    Integrity {
        name: String,
        sha256: String,
        why: String,
    },
}

impl Manifest {
    /// The manifest of a stored, servable record.
    pub fn of(record: &Record, builder: BuilderIdentity) -> Option<Self> {
        let a = record.artifact.as_ref()?;
        Some(Self {
            format: MANIFEST_FORMAT,
            key: record.key,
            parts: record.parts.clone(),
            backend: record.backend,
            entry: a.entry.clone(),
            files: a.files.clone(),
            runtime: record.parts.backend.versions.clone(),
            builder,
            validation: record.validation.clone(),
            providers: record.providers.clone(),
            partitions: record.partitions.clone(),
            build_ms: record.build_ms,
            created: crate::cache::now_secs(),
        })
    }

    /// Serializes and signs (unsigned when `key` is `None`).
    pub fn seal(&self, key: Option<&NamedSigningKey>) -> Envelope {
        // Plain structs, strings, integers and BTreeMaps: serializing cannot fail.
        let manifest = serde_json::to_string(self).unwrap_or_default();
        let signatures = key
            .map(|k| vec![k.sign(manifest.as_bytes())])
            .unwrap_or_default();
        Envelope {
            format: MANIFEST_FORMAT,
            manifest,
            signatures,
        }
    }

    /// Total bytes of the files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// The structural checks: the key, its parts, the verdict, the file names.
    pub fn check(&self, want: &CacheKey) -> Result<(), Rejection> {
        let wrong = |why: String| Rejection::WrongKey {
            want: want.hex(),
            why,
        };
        if self.key != *want {
            return Err(wrong(format!("it is for {}", self.key)));
        }
        if self.parts.key() != *want {
            return Err(wrong(format!("its key parts hash to {}", self.parts.key())));
        }
        if !self.validation.as_ref().is_some_and(|v| v.passed) {
            return Err(Rejection::NotValidated);
        }
        let plain = |n: &str| {
            !n.is_empty() && n != "." && n != ".." && !n.contains('/') && !n.contains('\0')
        };
        let mut names = std::collections::BTreeSet::new();
        for f in &self.files {
            let hex_ok = f.sha256.len() == 64 && f.sha256.bytes().all(|b| b.is_ascii_hexdigit());
            if !plain(&f.name) || !hex_ok || !names.insert(f.name.as_str()) {
                return Err(Rejection::BadFile(f.name.clone()));
            }
        }
        if !names.contains(self.entry.as_str()) {
            return Err(Rejection::BadFile(format!(
                "entry `{}` is not among the files",
                self.entry
            )));
        }
        Ok(())
    }
}

impl Envelope {
    /// Parses an envelope and returns its manifest if it may be used: with `trusted` keys,
    /// only when one of them signed exactly these bytes; then the structural checks.
    pub fn open(
        bytes: &[u8],
        trusted: &[NamedPublicKey],
        want: &CacheKey,
    ) -> Result<Manifest, Rejection> {
        Self::open_signed(bytes, trusted, want).map(|(m, _)| m)
    }

    /// [`Envelope::open`], and the name of the trusted key whose signature verified (`None`
    /// when `trusted` is empty: nothing was checked).
    pub fn open_signed(
        bytes: &[u8],
        trusted: &[NamedPublicKey],
        want: &CacheKey,
    ) -> Result<(Manifest, Option<String>), Rejection> {
        let env: Envelope =
            serde_json::from_slice(bytes).map_err(|e| Rejection::Malformed(e.to_string()))?;
        if env.format > MANIFEST_FORMAT {
            return Err(Rejection::Malformed(format!(
                "format {} is newer than this trtcache ({MANIFEST_FORMAT})",
                env.format
            )));
        }
        let mut ok = None;
        if !trusted.is_empty() {
            if env.signatures.is_empty() {
                return Err(Rejection::Unsigned);
            }
            let mut known = None;
            for s in &env.signatures {
                for k in trusted.iter().filter(|k| k.name == s.key) {
                    known = Some(s.key.clone());
                    if ok.is_none() && k.verifies(env.manifest.as_bytes(), s) {
                        ok = Some(s.key.clone());
                    }
                }
            }
            match (&ok, known) {
                (Some(_), _) => {}
                (None, Some(name)) => return Err(Rejection::BadSignature(name)),
                (None, None) => {
                    let names: Vec<&str> = env.signatures.iter().map(|s| s.key.as_str()).collect();
                    return Err(Rejection::Untrusted(names.join(", ")));
                }
            }
        }
        let m: Manifest =
            serde_json::from_str(&env.manifest).map_err(|e| Rejection::Malformed(e.to_string()))?;
        m.check(want)?;
        Ok((m, ok))
    }
}
