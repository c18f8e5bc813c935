//! What the pipeline and the worker process share about one build attempt: what it gives
//! ([`Built`]: the staged artifact and its validation) and how a backend's failure on a full
//! or unwritable cache is told apart from the model's ([`disk_full`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::validate::ValidationReport;
use super::{BuildError, StagedArtifact};

/// What a worker built and how it validated.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Built {
    pub artifact: StagedArtifact,
    pub validation: ValidationReport,
    pub build_ms: u64,
}

/// Space the staging file system must have left for a failed backend build not to be blamed
/// on it (ONNX Runtime reports a failed write without the errno).
const FULL_SLACK: u64 = 1 << 20;

/// A backend failure while the cache's file system is (nearly) full is that, not a broken
/// model: ONNX Runtime says only "Failed to write ..." when it hits ENOSPC. Judged before the
/// staging directory (and its partial files) is removed: less than max(1 MiB, the model's
/// size) left means the artifact could not have fit.
///
/// The same goes for a staging folder that cannot be written at all (a read-only or failing
/// file system, the cache's folders deleted): a probe file is created in it, and when that
/// fails the error is the store's (not remembered as the model's failure, retried).
pub(crate) fn disk_full(staging: &Path, model: &Path, e: BuildError) -> BuildError {
    let need = std::fs::metadata(model)
        .map(|m| m.len())
        .unwrap_or(0)
        .max(FULL_SLACK);
    match crate::cache::free_bytes(staging) {
        Ok(free) if free < need => BuildError::Store(crate::cache::StoreError::Full {
            path: staging.parent().unwrap_or(staging).to_path_buf(),
            detail: format!("{free} bytes free while the backend wrote the artifact ({e})"),
        }),
        _ => match tempfile::tempfile_in(staging) {
            Ok(_) => e,
            Err(probe) => BuildError::Store(crate::cache::StoreError::io(
                staging,
                std::io::Error::new(
                    probe.kind(),
                    format!("the cache cannot be written ({probe}) while the backend wrote the artifact ({e})"),
                ),
            )),
        },
    }
}
