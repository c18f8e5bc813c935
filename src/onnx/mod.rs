//! Stage 1 of the data flow: loading ONNX models.
//!
//! A model file is memory-mapped and decoded with prost straight from the map
//! ([`load::Model`]): weights stay in the map as `bytes::Bytes`, so loading a 400 MB model
//! touches only the graph structure. External-data files are resolved relative to the model's
//! folder and checked (never outside it, offsets in range). [`graph::Graph`] is the
//! index-based view the later stages work on; [`model_facts`](facts) summarises a model
//! for `inspect`.

pub(crate) mod attr;
pub mod budget;
pub(crate) mod dtype;
pub mod facts;
pub(crate) mod fxhash;
pub(crate) mod graph;
pub(crate) mod load;
pub mod proto;
pub mod resolution;

pub use budget::DecodeLimits;
pub use dtype::ElemType;
pub use graph::{Graph, NodeId};
pub use load::{ExternalFile, LoadOptions, Model};

use std::path::PathBuf;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The OS error is part of the message (not a `source`), so `{:#}` prints it once.
    #[error("{path}: cannot open: {err}")]
    Open { path: PathBuf, err: std::io::Error },
    #[error("{path}: is a directory, not an ONNX model file")]
    IsDirectory { path: PathBuf },
    /// A FIFO, socket or device: reading one could block forever or never end.
    #[error("{path}: is a {kind}, not a regular file; give the path of an ONNX model file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: empty file (0 bytes), not an ONNX model")]
    Empty { path: PathBuf },
    #[error("{path}: {size} bytes exceeds the model size limit of {limit} bytes")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("{path}: not a valid ONNX model: protobuf decode failed ({message}); the file is truncated or not ONNX")]
    Decode { path: PathBuf, message: String },
    #[error("{path}: not an ONNX model: {why}")]
    NotAModel { path: PathBuf, why: String },
    /// Decoding would allocate far more than the file's size (see `onnx::budget`).
    #[error("{path}: {why}")]
    TooCostly { path: PathBuf, why: String },
    #[error("{path}: tensor `{tensor}`: external data {why}")]
    ExternalData {
        path: PathBuf,
        tensor: String,
        why: String,
    },
}
