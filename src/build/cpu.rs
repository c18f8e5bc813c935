//! The `ort-cpu` backend: the model optimized offline for this CPU SKU by ONNX Runtime and
//! saved, with its prepacked constant initializers next to it; served with optimizations
//! disabled, so session creation skips graph rewriting. (ONNX Runtime still packs the weights
//! while it creates the session, to find the saved copy by the packed bytes' hash; the saved
//! copies then replace the heap ones, so the packed weights are file pages shared between
//! consumer processes rather than private memory. They do not make the session faster.)
//!
//! Enters: a model file (external data included). Leaves: `model.onnx` (with the
//! initializers under [`BuildOptions::external_min_bytes`]) plus, when ORT writes any,
//! `model.onnx.data` (the larger initializers, prepacked ones included) in the staging
//! directory. The external initializers file is always named explicitly: without it ORT
//! writes an optimized model that points at a data file it never wrote.

use std::path::Path;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;

use super::{Artifact, Backend, BuildError, BuildOptions, Runtime};

/// File name of the optimized graph inside the artifact.
pub const ENTRY: &str = "model.onnx";
/// File name of its external initializers.
pub const DATA: &str = "model.onnx.data";

/// The artifact ONNX Runtime wrote into `out` when saving an optimized model: the graph, and
/// its external initializers when there are any.
pub fn optimized_artifact(out: &Path) -> Artifact {
    let mut files = vec![ENTRY.to_string()];
    if out.join(DATA).is_file() {
        files.push(DATA.to_string());
    }
    Artifact {
        dir: out.to_path_buf(),
        entry: ENTRY.into(),
        files,
    }
}

/// Offline-optimized model for ONNX Runtime's CPU provider.
#[derive(Debug, Clone, Copy)]
pub struct OrtCpu;

fn base_builder(
    rt: &Runtime,
    model: &Path,
    threads: usize,
) -> Result<ort::session::builder::SessionBuilder, BuildError> {
    let b = Session::builder(&rt.env).map_err(|e| BuildError::ort("session options", model, e))?;
    if threads > 0 {
        b.with_intra_threads(threads)
            .map_err(|e| BuildError::ort("intra-op threads", model, e))
    } else {
        Ok(b)
    }
}

impl Backend for OrtCpu {
    fn name(&self) -> &'static str {
        "ort-cpu"
    }

    fn check(&self, _rt: &Runtime) -> Result<(), BuildError> {
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(model = %model.display(), backend = "ort-cpu"))]
    fn build(
        &self,
        rt: &Runtime,
        model: &Path,
        opts: &BuildOptions,
        out: &Path,
    ) -> Result<Artifact, BuildError> {
        let entry = out.join(ENTRY);
        let stage = "optimize (ort-cpu)";
        let mut b = base_builder(rt, model, opts.threads)?;
        if opts.opt_level == super::OptLevel::All && !tracing::enabled!(tracing::Level::DEBUG) {
            // ORT warns that a level-All model is specific to this environment; the key pins
            // the SKU and the ORT version, so the warning is expected, not actionable.
            b = b
                .with_log_level(ort::logging::LogLevel::Error)
                .map_err(|e| BuildError::ort(stage, model, e))?;
        }
        let mut b = b
            .with_optimization_level(opts.opt_level.ort())
            .map_err(|e| BuildError::ort(stage, model, e))?
            .with_optimized_model_path(&entry)
            .map_err(|e| BuildError::ort(stage, model, e))?
            .with_config_entry(
                "session.optimized_model_external_initializers_file_name",
                DATA,
            )
            .map_err(|e| BuildError::ort(stage, model, e))?
            .with_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes",
                opts.external_min_bytes.to_string(),
            )
            .map_err(|e| BuildError::ort(stage, model, e))?;
        if opts.prepack {
            b = b
                .with_config_entry("session.save_external_prepacked_constant_initializers", "1")
                .map_err(|e| BuildError::ort(stage, model, e))?;
        }
        let session = b
            .commit_from_file(model)
            .map_err(|e| BuildError::ort(stage, model, e))?;
        drop(session);
        if !entry.is_file() {
            return Err(BuildError::ort(
                stage,
                model,
                "ONNX Runtime did not write the optimized model",
            ));
        }
        Ok(optimized_artifact(out))
    }

    fn open(&self, rt: &Runtime, entry: &Path, opts: &BuildOptions) -> Result<Session, BuildError> {
        base_builder(rt, entry, opts.threads)?
            .with_optimization_level(GraphOptimizationLevel::Disable)
            .map_err(|e| BuildError::ort("open artifact", entry, e))?
            .commit_from_file(entry)
            .map_err(|e| BuildError::ort("open artifact", entry, e))
    }
}

/// A session on the original model the way a user would create one without trtcache.
pub fn open_raw(
    rt: &Runtime,
    model: &Path,
    level: GraphOptimizationLevel,
    threads: usize,
) -> Result<Session, BuildError> {
    base_builder(rt, model, threads)?
        .with_optimization_level(level)
        .map_err(|e| BuildError::ort("open model", model, e))?
        .commit_from_file(model)
        .map_err(|e| BuildError::ort("open model", model, e))
}
