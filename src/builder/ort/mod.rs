//! ONNX Runtime as the build stage uses it: finding and loading the library once per process
//! ([`runtime`]), what its refusals mean to a user ([`explain`]), and the sessions every
//! backend and the validation open alike ([`session`]: the reference session on the model
//! as given).
//!
//! Enters: an optional configured library path. Leaves: a process-wide [`Runtime`], sessions,
//! or errors that say what to do.

pub(crate) mod explain;
pub mod runtime;
pub(crate) mod session;

pub use runtime::{load, Runtime, RuntimeError};
pub(crate) use session::base_builder;
pub use session::open_raw;
