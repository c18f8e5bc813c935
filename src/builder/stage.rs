//! What the pipeline and the worker process share about one build attempt: its validation
//! ([`validate`]: the backend gives a runner, the validation is the stage's) and how a
//! backend's failure on a full or unwritable cache is told apart from the model's
//! ([`disk_full`]).

use std::path::Path;

use super::backends::BackendImpl;
use super::validate::{self, Reference, ValidationConfig, ValidationReport};
use super::{BuildError, BuildOptions, Progress, Runtime, StagedArtifact};

/// The inputs `model` is validated on and its outputs on them (ONNX Runtime CPU on the
/// model as given, see [`validate`](super::validate)), found *before* the backend builds:
/// the search depends only on the model, its session is closed before the build starts, and
/// a crash of ONNX Runtime on one of its candidates costs the next attempt the search, not
/// a build ([`super::Fallback::ReferenceCrashed`]).
pub(crate) fn reference(
    rt: &Runtime,
    model: &Path,
    opts: &BuildOptions,
    cfg: &ValidationConfig,
    progress: &dyn Fn(&Progress),
) -> Result<Reference, BuildError> {
    tracing::info_span!("validation_inputs", model = %model.display()).in_scope(|| {
        validate::find_reference(
            rt,
            model,
            opts.profile.as_ref(),
            cfg,
            opts.threads,
            progress,
        )
    })
}

/// Validates a built artifact against `reference` ([`reference`]): the backend's runner on
/// its inputs, compared with its outputs, then the backend's own probe of the result.
pub(crate) fn validate(
    b: &dyn BackendImpl,
    rt: &Runtime,
    model: &Path,
    artifact: &StagedArtifact,
    opts: &BuildOptions,
    cfg: &ValidationConfig,
    reference: Reference,
) -> Result<ValidationReport, BuildError> {
    let mut runner = b.runner(rt, model, artifact, opts)?;
    let validated =
        tracing::info_span!("validate_with", model = %model.display()).in_scope(|| {
            validate::validate_against(reference, model, opts.precision, cfg, &mut |inputs| {
                runner.run(inputs)
            })
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
