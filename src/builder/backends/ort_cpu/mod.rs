//! The `ort-cpu` backend's room: the model optimized offline for this CPU SKU by ONNX Runtime
//! and saved ([`save`], with [`compact`] names and the [`passes`] before and after ONNX
//! Runtime's optimization), the backend itself ([`backend`]: open, validate), what its
//! validation times ([`probes`]) and its fallback ladder ([`ladder`]: what a failed attempt
//! is built again without).

pub(crate) mod backend;
pub(crate) mod compact;
pub(crate) mod ladder;
pub mod passes;
pub(crate) mod probes;
pub(crate) mod save;

pub use backend::OrtCpu;
pub use save::{fixed_dims, initializers_as_constants, optimized_artifact, DATA, ENTRY};
