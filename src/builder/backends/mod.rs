//! The backends: one trait ([`BackendImpl`]: check, build, open, validate) and the one place
//! that maps a [`crate::spec::Backend`] to its implementation ([`backend`]).

pub(crate) mod backend;
pub(crate) mod levels;
pub mod ort_cpu;
pub(crate) mod ort_gpu;
pub(crate) mod select;
pub mod trt;

pub use backend::{BackendImpl, Failure, Retry, Runner, SessionRunner};
pub use select::backend;
