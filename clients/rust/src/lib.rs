//! Client for the trtcache daemon: the wire protocol ([`protocol`]), framing with descriptor
//! passing ([`frame`]) and a blocking [`Client`]. The daemon uses these same types, so this
//! crate is the protocol's single definition (`docs/protocol.md` describes it in prose).
//!
//! ```no_run
//! use trtcache_client::{Client, AcquireRequest};
//! let mut c = Client::connect("/run/trtcache/trtcache.sock")?;
//! // `..Default::default()` waits for a build, as the wire's default does.
//! let artifact = c.acquire(&AcquireRequest { model: "resnet50".into(), dir_fd: true, ..Default::default() })?;
//! println!("{} ({} files)", artifact.metadata.key, artifact.files.len());
//! # Ok::<(), trtcache_client::ClientError>(())
//! ```
//!
//! With the `ort` feature, [`Artifact::session`] opens an `ort::session::Session` from the
//! acquired descriptors. A `trt` artifact is a TensorRT engine instead:
//! [`Artifact::engine_file`], [`Artifact::engine_proc_path`] and [`Artifact::engine_meta`]
//! ([`engine`]).

#![deny(missing_docs)]

mod client;
pub mod engine;
pub mod frame;
pub mod protocol;
#[cfg(feature = "ort")]
mod session;

pub use client::{Artifact, Client, ClientError, DEFAULT_MAX_RESPONSE};
pub use protocol::{
    AcquireRequest, ArtifactMeta, BuildRequest, ErrorCode, ModelStatus, Progress, Request,
    Response, Stats, VariantState, PROTOCOL_VERSION,
};
#[cfg(feature = "ort")]
pub use session::SessionError;

/// The README's example, compiled as a doc test.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
