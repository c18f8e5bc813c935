//! What the pipeline and the worker process share about one build attempt: its validation
//! ([`validate`]: the backend gives a runner, the validation is the stage's) and how a
//! backend's failure on a full or unwritable cache is told apart from the model's
//! ([`disk_full`]).

use std::path::Path;

use super::backends::BackendImpl;
use super::validate::{self, ValidationConfig, ValidationReport};
use super::{BuildError, BuildOptions, Runtime, StagedArtifact};

/// Validates a built artifact against `model` (ONNX Runtime CPU on the model as given, see
/// [`validate`](super::validate)): the backend's runner on the inputs the reference accepts,
/// compared with the reference's outputs, then the backend's own probe of the result.
pub(crate) fn validate(
    b: &dyn BackendImpl,
    rt: &Runtime,
    model: &Path,
    artifact: &StagedArtifact,
    opts: &BuildOptions,
    cfg: &ValidationConfig,
) -> Result<ValidationReport, BuildError> {
    let mut runner = b.runner(rt, model, artifact, opts)?;
    let validated =
        tracing::info_span!("validate_with", model = %model.display()).in_scope(|| {
            validate::validate_keeping_inputs(
                rt,
                model,
                opts.profile.as_ref(),
                opts.precision,
                cfg,
                opts.threads,
                &mut |inputs| runner.run(inputs),
            )
        })?;
    b.probe(rt, model, artifact, opts, cfg, runner, validated)
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
