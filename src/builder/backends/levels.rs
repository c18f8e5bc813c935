//! The rung the ONNX Runtime backends share on their fallback ladders: an artifact over
//! tolerance is built again one graph optimization level lower (fusions change rounding; a
//! quantized graph can move past fp32 tolerance), down to disabled (the model's own graph,
//! which computes what the reference computes), before the build counts as
//! failed. The key stays the one asked for, and the report says which level the stored
//! artifact is and why the higher ones were refused.

use super::backend::Retry;
use crate::builder::job::Built;
use crate::builder::{Fallback, OptLevel};

/// The next level down from `level` for an artifact over tolerance (`built`), set by `set`;
/// `None` below basic or when it passed.
pub(crate) fn lower(level: OptLevel, built: &Built, set: impl FnOnce(OptLevel)) -> Option<Retry> {
    if built.validation.passed {
        return None;
    }
    let lower = level.lower()?;
    let worst = built.validation.worst();
    tracing::warn!(
        level = level.name(),
        %worst,
        "artifact over tolerance; building it again at {}",
        lower.name()
    );
    set(lower);
    Some(Retry {
        fallback: Fallback::LowerLevel {
            from: level,
            to: lower,
        },
        rejected: format!("{}: {worst}", level.name()),
    })
}
