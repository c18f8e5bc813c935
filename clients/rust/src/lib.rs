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
//!
//! Long-running consumers hear about new versions: [`Client::watch`] streams a model's
//! [`WatchEvent`]s, and [`Follower`] keeps a value (with `ort`, a session:
//! `Follower::sessions`) built from the model's current artifact, swapped on each change.

#![deny(missing_docs)]

mod client;
pub mod engine;
pub mod frame;
pub mod protocol;
pub mod ready;
#[cfg(feature = "ort")]
mod session;
mod watch;

pub use client::{Artifact, Client, ClientError, DEFAULT_MAX_RESPONSE};
pub use protocol::{
    AcquireRequest, ArtifactMeta, BuildRequest, ErrorCode, ModelStatus, Progress, Request,
    Response, SessionHints, Stats, VariantState, WatchEvent, WatchReason, PROTOCOL_VERSION,
};
#[cfg(feature = "ort")]
pub use session::{loaded_onnxruntime, SessionError, SessionFollower};
pub use watch::{FollowError, Follower, Loaded, WatchCloser, Watcher};

/// The README's example, compiled as a doc test.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
