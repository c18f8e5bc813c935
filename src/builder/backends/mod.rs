//! The backends: one trait ([`BackendImpl`]: check, build, open, validate) and the one place
//! that maps a [`crate::spec::Backend`] to its implementation ([`backend`]).

pub(crate) mod backend;
pub mod ort_cpu;
pub(crate) mod select;

pub use backend::BackendImpl;
pub use select::backend;
