//! Validation: the artifact and the original model (ONNX Runtime CPU, optimizations
//! disabled) run on the same inputs; per output, the max abs and rel error are recorded
//! against tolerances that depend on the precision. A backend supplies only a way to run its
//! artifact (a session, or a closure for the `trt` engine); the reference, the inputs and the
//! comparison are this folder's.
//!
//! - [`config`]: how to validate ([`ValidationConfig`]) and the shared defaults.
//! - [`check`]: the reference session, the candidate's run and the report.
//! - [`inputs`]: input synthesis: golden files ([`golden`], [`pickle`]), the bounded shape
//!   search ([`search`]) seeded with the sizes ([`pins`]) and values ([`vocab`]) the graph fixes.
//! - [`refusal`]: the error when no default inputs work, golden inputs first.
//! - [`values`]: typed values, every element type ONNX Runtime runs; [`compare`]: comparison.
//!
//! Enters: a way to run the artifact, the original model path, the profile and
//! [`ValidationConfig`]. Leaves: a [`ValidationReport`] (stored in the record; `passed ==
//! false` means the artifact is never served) or an error when the model cannot be run at all.

pub(crate) mod check;
pub(crate) mod compare;
pub(crate) mod config;
pub mod error;
pub(crate) mod golden;
pub(crate) mod inputs;
pub(crate) mod pickle;
pub(crate) mod pins;
pub(crate) mod refusal;
pub(crate) mod run;
pub(crate) mod search;
pub(crate) mod values;
pub(crate) mod vocab;

pub use crate::cache::{OutputError, ValidationReport};
/// Allowed error per element: the sidecar's tolerance type (`atol + rtol·|reference|`, and
/// for float16/bfloat16 outputs `ulps` steps of their type: [`Tolerance::half_bound`]).
pub use crate::spec::Tolerance;

pub(crate) use check::{
    compare_outputs, find_reference, validate_against, validate_keeping_inputs, Reference,
};
pub use compare::{compare_as, non_finite_warning, rms, UNBOUNDED};
pub use config::{
    ValidationConfig, DEFAULT_CRASH_RETRIES, DEFAULT_MAX_INPUT_BYTES,
    DEFAULT_PREPACK_PROBE_MAX_RUN_MS, DEFAULT_THREAD_PROBE_MAX_RUN_MS, PROBE_MAX_RUNS,
    PROBE_RUN_BUDGET, THREAD_PROBE_RUNS, THREAD_PROBE_SCALE, THREAD_PROBE_SCALED_MAX_BYTES,
};
pub use error::ValidateError;
pub(crate) use inputs::{random_inputs, scaled_shapes, Inputs, Shapes};
pub(crate) use run::{run, Outs};
pub use search::MAX_CANDIDATES;
