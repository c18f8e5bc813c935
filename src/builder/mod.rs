//! Stage 8: building artifacts. This file is the stage's face (what callers import); the
//! rooms behind it:
//!
//! - [`pipeline`]: key → store lookup → build → validate → store, with the planned key and
//!   cancellation observed between phases ([`Builder`], [`BuildJob`], [`BuildOutcome`]).
//! - [`worker`]: the process boundary: a build and its validation in a bounded worker process.
//! - [`backends`]: one trait ([`BackendImpl`]) and one room per backend.
//! - [`ort`]: loading ONNX Runtime, its error texts, the reference session.
//! - [`validate`]: comparison, typed values, golden files, input synthesis.
//! - [`options`] ([`BuildOptions`], the key's options) and [`error`] ([`BuildError`]).
//!
//! Enters: a model path, a backend name and [`BuildOptions`]. Leaves: a validated record in
//! the store, or a typed [`BuildError`]. GPU providers are registered with
//! `error_on_failure`, never ort's silent CPU fallback.

pub mod backends;
pub mod error;
pub(crate) mod job;
pub mod options;
pub mod ort;
pub(crate) mod pipeline;
pub mod progress;
pub(crate) mod stage;
pub mod validate;
pub mod worker;

pub use self::ort::{runtime, Runtime, RuntimeError};
pub use crate::cache::StagedArtifact;
pub use backends::{backend, BackendImpl};
pub use error::BuildError;
pub use job::{BuildJob, BuildOutcome, Source};
pub use options::{BuildOptions, OptLevel, OrtCpuOptions, TrtOptions, DEFAULT_EXTERNAL_MIN_BYTES};
pub use pipeline::{Builder, Watch};
pub use progress::{Fallback, Progress};
pub use worker::WorkerLimits;
