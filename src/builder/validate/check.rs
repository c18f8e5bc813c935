//! One validation: the reference session (the original model under ONNX Runtime CPU,
//! optimizations disabled) finds the inputs ([`super::inputs`]) and its outputs on them, the
//! candidate (the backend's runner) runs the artifact on the same inputs, and per output the
//! max abs and rel error are recorded against tolerances that depend on the precision.
//!
//! Enters: a way to run the artifact, the original model path, the profile and
//! [`ValidationConfig`]. Leaves: a [`ValidationReport`] (stored in the record; `passed == false`
//! means the artifact is never served) or an error when the model cannot be run at all.
//!

use std::collections::BTreeMap;
use std::path::Path;

use super::compare::{compare_out_at, non_finite_warning, UNBOUNDED};
use super::config::ValidationConfig;
use super::inputs::{reference_inputs, Inputs};
use super::run::Outs;
use super::{OutputError, Tolerance, ValidationReport};
use crate::builder::ort::{open_raw, Runtime};
use crate::builder::BuildError;
use crate::plan::{Precision, ShapeProfile};

/// The inputs validation runs on, and the original model's outputs on them.
pub(crate) struct Reference {
    pub(crate) inputs: Inputs,
    pub(crate) shapes: super::Shapes,
    pub(crate) want: Outs,
    /// A second run at every free batch axis doubled ([`super::inputs::Second`]).
    pub(crate) second: Option<super::inputs::Second>,
}

/// Runs `model` on ONNX Runtime CPU with optimizations disabled to find the inputs to
/// validate on ([`reference_inputs`]: golden, or the default search announcing each
/// candidate through `progress`) and its outputs on them. The session is closed before
/// this returns, so a build that follows never shares memory or threads with it.
pub(crate) fn find_reference(
    rt: &Runtime,
    model: &Path,
    profile: Option<&ShapeProfile>,
    cfg: &ValidationConfig,
    threads: usize,
    progress: &dyn Fn(&crate::builder::Progress),
) -> Result<Reference, BuildError> {
    let mut session = open_raw(
        rt,
        model,
        ort::session::builder::GraphOptimizationLevel::Disable,
        threads,
    )?;
    let (inputs, shapes, want, second) =
        reference_inputs(&mut session, model, profile, cfg, progress)?;
    Ok(Reference {
        inputs,
        shapes,
        want,
        second,
    })
}

/// Validates a candidate (`candidate` runs the artifact on the inputs the reference accepted
/// and returns its outputs by name) against `reference` ([`find_reference`]); also returns
/// the inputs it validated on and the reference's outputs on them (another run of the
/// artifact is checked against those with [`compare_outputs`], without the reference again).
pub(crate) fn validate_against(
    reference: Reference,
    model: &Path,
    precision: Precision,
    cfg: &ValidationConfig,
    candidate: &mut dyn FnMut(&Inputs) -> Result<Outs, BuildError>,
) -> Result<(ValidationReport, Inputs, Outs), BuildError> {
    let Reference {
        inputs,
        shapes,
        want,
        second,
    } = reference;
    let got = candidate(&inputs)?;
    let tol = cfg
        .tolerance
        .unwrap_or_else(|| Tolerance::default_for(precision));
    let half = resolutions(model);
    let mut outputs = compare_at(model, &half, &want, &got, tol);
    let mut also_at = None;
    if let Some((inputs2, shapes2, want2)) = second {
        let got2 = candidate(&inputs2)?;
        merge(&mut outputs, compare_at(model, &half, &want2, &got2, tol));
        also_at = Some(shapes2);
    }
    let report = ValidationReport {
        passed: outputs.iter().all(|o| o.passed),
        tolerance: tol,
        seed: cfg.seed,
        golden: cfg.golden.as_ref().map(|p| p.display().to_string()),
        shapes,
        outputs,
        opt_level: None,
        rejected: Vec::new(),
        threads: None,
        prepack: None,
        rewrites: Vec::new(),
        reference: None,
        also_at,
    };
    Ok((report, inputs, want))
}

/// Folds a second run's comparison into the first's, output by output: the counts add up,
/// the worst errors stay, an output passes when it passed both times.
fn merge(first: &mut [OutputError], second: Vec<OutputError>) {
    for b in second {
        let Some(a) = first.iter_mut().find(|a| a.name == b.name) else {
            continue;
        };
        a.elements += b.elements;
        a.mismatched += b.mismatched;
        a.non_finite += b.non_finite;
        a.max_abs = a.max_abs.max(b.max_abs);
        a.max_rel = a.max_rel.max(b.max_rel);
        a.max_ulps = match (a.max_ulps, b.max_ulps) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        a.passed &= b.passed;
    }
}

/// [`find_reference`], then [`validate_against`] it: its intra-op threads (which spin a
/// while after each run) are gone before the candidate runs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn validate_keeping_inputs(
    rt: &Runtime,
    model: &Path,
    profile: Option<&ShapeProfile>,
    precision: Precision,
    cfg: &ValidationConfig,
    threads: usize,
    candidate: &mut dyn FnMut(&Inputs) -> Result<Outs, BuildError>,
    progress: &dyn Fn(&crate::builder::Progress),
) -> Result<(ValidationReport, Inputs, Outs), BuildError> {
    let reference = find_reference(rt, model, profile, cfg, threads, progress)?;
    validate_against(reference, model, precision, cfg, candidate)
}

/// Each of the reference's outputs (`want`) against the candidate's (`got`, by name; a
/// missing one fails), within `tol`; float32/float64 outputs that are a Cast of a float16 or
/// bfloat16 tensor in `model` are compared at that type's resolution
/// ([`crate::onnx::resolution::half_outputs`]), and float outputs of dynamically quantized
/// activations in int8 steps of their range ([`crate::spec::DYNAMIC_INT8`]).
pub(crate) fn compare_outputs(
    model: &Path,
    want: &Outs,
    got: &Outs,
    tol: Tolerance,
) -> Vec<OutputError> {
    compare_at(model, &resolutions(model), want, got, tol)
}

/// `model`'s output resolutions ([`crate::onnx::resolution::output_resolutions`]); empty when
/// it does not load (the reference ran it, so it does; if not, every output keeps its own
/// type).
fn resolutions(model: &Path) -> BTreeMap<String, String> {
    match crate::onnx::Model::load(model) {
        Ok(m) => crate::onnx::resolution::output_resolutions(m.graph()),
        Err(e) => {
            tracing::debug!(error = %e, "no output resolutions: the model does not load");
            BTreeMap::new()
        }
    }
}

/// [`compare_outputs`] with the model's resolutions read already.
fn compare_at(
    model: &Path,
    half: &BTreeMap<String, String>,
    want: &Outs,
    got: &Outs,
    tol: Tolerance,
) -> Vec<OutputError> {
    let mut outputs = Vec::new();
    for (name, reference) in want {
        let e = match got.iter().find(|(n, _)| n == name) {
            Some((_, g)) => {
                compare_out_at(name, reference, g, tol, half.get(name).map(String::as_str))
            }
            None => OutputError {
                name: name.clone(),
                elements: 0,
                max_abs: UNBOUNDED,
                max_rel: UNBOUNDED,
                mismatched: 1,
                passed: false,
                non_finite: 0,
                dtype: None,
                rule: None,
                max_ulps: None,
            },
        };
        tracing::debug!(output = %name, dtype = ?e.dtype, max_abs = e.max_abs, max_rel = e.max_rel, max_ulps = ?e.max_ulps, passed = e.passed, "validated output");
        if e.non_finite > 0 {
            tracing::warn!(
                model = %model.display(),
                output = %name,
                non_finite = e.non_finite,
                elements = e.elements,
                "{}",
                non_finite_warning(&e)
            );
        }
        outputs.push(e);
    }
    outputs
}
