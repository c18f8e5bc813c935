//! Minimal sources of key parts for the build pipeline: the model digest (memoised by file
//! identity in the store's digest tree), opset imports and the CPU SKU.
//!
//! MERGE NOTE: stand-ins until `device::detect`, `plan` and `key::model_digest` land; the
//! pipeline calls only [`model_digest`], [`opsets`] and [`sku`], so swapping them is local.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::BuildError;
use crate::cache::disk::hash_file;
use crate::cache::Store;
use crate::device::Sku;
use crate::key::{ExternalDigest, ModelDigest};
use crate::onnx::Model;

fn identity(path: &Path, id: &mut Vec<u8>) -> Result<(), BuildError> {
    let m = std::fs::metadata(path).map_err(|source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    for v in [
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime() as u64,
        m.mtime_nsec() as u64,
    ] {
        id.extend_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

/// Content digest of the graph file and every external-data file (sorted by location),
/// remembered in `store` by (device, inode, size, mtime) of each file.
pub fn model_digest(model: &Model, store: &dyn Store) -> Result<ModelDigest, BuildError> {
    let mut id = b"trtcache-digest-v1".to_vec();
    identity(&model.path, &mut id)?;
    for f in &model.external_files {
        id.extend_from_slice(f.location.as_bytes());
        identity(&f.path, &mut id)?;
    }
    let id = Sha256::digest(&id).to_vec();
    if let Some(d) = store.digest_get(&id)? {
        return Ok(d);
    }
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| BuildError::Io { path: p, source }
    };
    let (sha256, bytes) = hash_file(&model.path).map_err(io(&model.path))?;
    let mut external = Vec::new();
    for f in &model.external_files {
        let (sha, n) = hash_file(&f.path).map_err(io(&f.path))?;
        external.push(ExternalDigest {
            location: f.location.clone(),
            sha256: sha,
            bytes: n,
        });
    }
    external.sort_by(|a, b| a.location.cmp(&b.location));
    let d = ModelDigest {
        sha256,
        bytes,
        external,
    };
    store.digest_put(&id, &d)?;
    Ok(d)
}

/// Opset imports: domain (`""` is `ai.onnx`) → version.
pub fn opsets(model: &Model) -> BTreeMap<String, i64> {
    model
        .proto
        .opset_import
        .iter()
        .map(|o| (o.domain.clone(), o.version))
        .collect()
}

/// The ISA flags that change CPU kernels.
const ISA: &[&str] = &[
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "sse4_2",
    "neon",
    "asimd",
    "sve",
];

/// The CPU SKU from `/proc/cpuinfo` (vendor + model name, kernel-relevant ISA flags).
pub fn sku() -> Sku {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let vendor = field("vendor_id")
        .or_else(|| field("CPU implementer"))
        .unwrap_or_default();
    let model = field("model name")
        .or_else(|| field("CPU part"))
        .unwrap_or_default();
    let flags = field("flags")
        .or_else(|| field("Features"))
        .unwrap_or_default();
    let mut isa: Vec<String> = flags
        .split_whitespace()
        .filter(|f| ISA.contains(f))
        .map(String::from)
        .collect();
    isa.sort();
    isa.dedup();
    Sku {
        kind: "cpu".into(),
        name: format!("{vendor} {model}").trim().to_string(),
        compute_capability: None,
        sm_count: None,
        isa,
    }
}
