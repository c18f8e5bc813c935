//! A `trt` artifact on disk: a folder with `engine.plan` (the serialized engine, what
//! `trtexec --loadEngine`, Triton's `tensorrt_plan` backend and
//! `tensorrt.Runtime().deserialize_cuda_engine` load) and `engine.json` ([`EngineMeta`]:
//! profiles, I/O names and types, precision, hardware-compatibility level, the plan's digest).
//!
//! Both files are written to a temporary name, fsynced and renamed, metadata last, so a
//! folder with `engine.json` always has the plan it describes; [`read_meta`] re-checks the
//! plan's size and SHA-256 against it.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::TrtError;
use super::types::{HwCompat, Precision, TensorInfo};
use crate::plan::ShapeProfile;

/// The engine's file name in an artifact folder.
pub const PLAN_FILE: &str = "engine.plan";
/// The metadata's file name.
pub const META_FILE: &str = "engine.json";
/// Version of the [`EngineMeta`] layout.
pub const META_FORMAT: u32 = 1;

/// What a consumer needs to know about an engine without deserializing it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineMeta {
    pub format: u32,
    /// The TensorRT version that built it (engines load only on that version, unless built
    /// version-compatible).
    pub tensorrt_version: String,
    /// The GPU it was built on and its compute capability (`9.0`).
    pub gpu: String,
    pub compute_capability: Option<String>,
    pub hardware_compatibility: HwCompat,
    pub precision: Precision,
    pub workspace_bytes: Option<u64>,
    pub builder_optimization_level: Option<u8>,
    /// The optimization profiles, in engine order (profile index = position).
    pub profiles: Vec<ShapeProfile>,
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    pub plan_bytes: u64,
    pub plan_sha256: String,
    /// The CUDA driver of the host that built it (`12.8`): metadata, not a key part. A plan
    /// depends on the TensorRT version and the GPU (or its class), not on the driver, so a
    /// driver update rebuilds nothing and hosts on different driver builds share engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver: Option<String>,
}

/// SHA-256 of a plan, lower-case hex.
pub fn plan_digest(plan: &[u8]) -> String {
    crate::spec::hex(&Sha256::digest(plan))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrtError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(TrtError::io(dir))?;
    tmp.write_all(bytes).map_err(TrtError::io(tmp.path()))?;
    tmp.as_file().sync_all().map_err(TrtError::io(tmp.path()))?;
    tmp.persist(path).map_err(|e| TrtError::io(path)(e.error))?;
    Ok(())
}

/// Writes `engine.plan` and `engine.json` into `dir` (created when missing). The metadata's
/// `plan_bytes` and `plan_sha256` are set from `plan`.
pub fn write_artifact(dir: &Path, plan: &[u8], meta: &EngineMeta) -> Result<EngineMeta, TrtError> {
    std::fs::create_dir_all(dir).map_err(TrtError::io(dir))?;
    let mut meta = meta.clone();
    meta.format = META_FORMAT;
    meta.plan_bytes = plan.len() as u64;
    meta.plan_sha256 = plan_digest(plan);
    write_atomic(&dir.join(PLAN_FILE), plan)?;
    let json = serde_json::to_vec_pretty(&meta).map_err(|source| TrtError::Json {
        call: "write_artifact",
        source,
    })?;
    write_atomic(&dir.join(META_FILE), &json)?;
    // The renames are durable once the folder is.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(meta)
}

/// Reads `engine.json` from an artifact folder and checks `engine.plan` against it.
pub fn read_meta(dir: &Path) -> Result<EngineMeta, TrtError> {
    let mp = dir.join(META_FILE);
    let bytes = std::fs::read(&mp).map_err(TrtError::io(&mp))?;
    let meta: EngineMeta = serde_json::from_slice(&bytes).map_err(|e| TrtError::BadArtifact {
        path: mp.clone(),
        what: format!("not engine metadata: {e}"),
    })?;
    if meta.format != META_FORMAT {
        return Err(TrtError::BadArtifact {
            path: mp,
            what: format!(
                "metadata format {} (this trtcache reads {META_FORMAT})",
                meta.format
            ),
        });
    }
    let pp = plan_path(dir);
    let plan = std::fs::read(&pp).map_err(TrtError::io(&pp))?;
    if plan.len() as u64 != meta.plan_bytes || plan_digest(&plan) != meta.plan_sha256 {
        return Err(TrtError::BadArtifact {
            path: pp,
            what: format!(
                "{} bytes with SHA-256 {}, the metadata says {} bytes with {}",
                plan.len(),
                plan_digest(&plan),
                meta.plan_bytes,
                meta.plan_sha256
            ),
        });
    }
    Ok(meta)
}

/// The plan's path in an artifact folder.
pub fn plan_path(dir: &Path) -> PathBuf {
    dir.join(PLAN_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trt::DType;

    pub(crate) fn sample_meta() -> EngineMeta {
        EngineMeta {
            format: 0,
            tensorrt_version: "10.16.1".into(),
            gpu: "NVIDIA H200".into(),
            compute_capability: Some("9.0".into()),
            hardware_compatibility: HwCompat::None,
            precision: Precision::default(),
            workspace_bytes: None,
            builder_optimization_level: Some(3),
            profiles: vec![],
            inputs: vec![TensorInfo {
                name: "x".into(),
                dtype: DType::Float32,
                shape: vec![-1, 4],
            }],
            outputs: vec![],
            plan_bytes: 0,
            plan_sha256: String::new(),
            cuda_driver: Some("12.8".into()),
        }
    }

    #[test]
    fn written_artifact_reads_back_and_a_changed_plan_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let m = write_artifact(d.path(), b"plan bytes", &sample_meta()).unwrap();
        assert_eq!(m.plan_bytes, 10);
        assert_eq!(read_meta(d.path()).unwrap(), m);
        std::fs::write(d.path().join(PLAN_FILE), b"plan bytez").unwrap();
        let e = read_meta(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("engine.plan") && e.contains("the metadata says"),
            "{e}"
        );
    }
}
