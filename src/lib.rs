//! trtcache: a TensorRT engine-build and caching daemon.
//!
//! One module per stage of the data flow (see `docs/architecture.md`):
//! [`onnx`] loads models zero-copy; `analysis` decides what TensorRT, CUDA and CPU take;
//! `key` derives content keys; `builder` runs backends; `cache` stores artifacts; `daemon`
//! serves them. [`cli`] is the command-line surface over all of it.

pub mod analysis;
pub mod builder;
pub mod cache;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod device;
#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
#[cfg(feature = "test-support")]
pub mod fuzzing;
pub mod key;
pub mod libs;
pub mod onnx;
pub mod plan;
pub mod remote;
pub mod rng;
pub mod spec;
pub mod trt;
