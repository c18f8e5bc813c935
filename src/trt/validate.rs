//! Validation of a native engine: its outputs from one run through the shim
//! ([`super::Engine::run`]) against ONNX Runtime CPU's outputs of the raw model on the same
//! inputs, with the tolerance rules every backend uses ([`crate::build::validate::compare`]).
//! An engine that fails is never served: [`ensure_servable`] turns the verdict into an error.

use crate::build::validate::{compare, OutputError, Tolerance, UNBOUNDED};

use super::error::TrtError;
use super::types::HostTensor;

/// One reference output: name, shape, values.
pub type Reference = (String, Vec<i64>, Vec<f64>);

/// Compares every reference output with the engine's output of the same name. A missing
/// output, another shape, or an element type validation cannot read fails that output.
pub fn compare_outputs(
    reference: &[Reference],
    got: &[HostTensor],
    tol: Tolerance,
) -> Vec<OutputError> {
    reference
        .iter()
        .map(|(name, shape, want)| {
            let found = got
                .iter()
                .find(|t| &t.name == name)
                .filter(|t| &t.shape == shape)
                .and_then(HostTensor::to_f64);
            match found {
                Some(values) => compare(name, want, &values, tol),
                None => OutputError {
                    name: name.clone(),
                    elements: want.len(),
                    max_abs: UNBOUNDED,
                    max_rel: UNBOUNDED,
                    mismatched: want.len(),
                    passed: false,
                    non_finite: 0,
                },
            }
        })
        .collect()
}

/// `Err` naming every output over tolerance.
pub fn ensure_servable(outputs: &[OutputError]) -> Result<(), TrtError> {
    let bad: Vec<String> = outputs
        .iter()
        .filter(|o| !o.passed)
        .map(|o| {
            format!(
                "`{}` ({} of {} elements off, max abs {:e}, max rel {:e})",
                o.name, o.mismatched, o.elements, o.max_abs, o.max_rel
            )
        })
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(TrtError::ValidationFailed(bad.join(", ")))
    }
}
