//! ONNX Runtime sessions every backend and the validation open the same way: the session
//! options with the thread count, and the reference session on the model as given (what a
//! user would create without trtcache; validation compares an artifact against it).

use std::path::Path;

use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::Session;

use super::Runtime;
use crate::builder::BuildError;

/// Session options on `rt` with `threads` intra-op threads (0: ONNX Runtime's default).
pub(crate) fn base_builder(
    rt: &Runtime,
    model: &Path,
    threads: usize,
) -> Result<SessionBuilder, BuildError> {
    let b = Session::builder(&rt.env).map_err(|e| BuildError::ort("session options", model, e))?;
    if threads > 0 {
        b.with_intra_threads(threads)
            .map_err(|e| BuildError::ort("intra-op threads", model, e))
    } else {
        Ok(b)
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
