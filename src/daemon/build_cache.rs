//! What the daemon needs from the build and cache stages, as one small trait: [`BuildCache`]
//! (it plans keys, looks artifacts up, builds and stores them; it is not a TensorRT engine).
//! The daemon owns the repository, the queue and the socket; a [`BuildCache`] owns keys,
//! builds, validation and storage. Models enter as [`ModelEntry`] (a file in the repository)
//! plus a [`Selection`] (profile/backend/precision); they leave as a [`Handout`]: wire
//! metadata plus the paths of its files, graph first. Every method blocks (hashing, building, fsync): the daemon calls
//! them through `spawn_blocking`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use trtcache_client::protocol::{ArtifactMeta, ErrorCode, Origin};

use crate::key::memo::FileId;
use crate::spec::{Backend, CacheKey, Precision};

/// How a model sits in the repository.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `NAME.onnx` (version 0) with an optional `NAME.trtcache.toml`.
    Flat,
    /// `NAME/VERSION/model.onnx`.
    Triton,
}

/// One servable model file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// Repository name (never a path).
    pub name: String,
    /// Version (0 for flat models).
    pub version: u64,
    /// The graph file.
    pub path: PathBuf,
    /// `NAME.trtcache.toml` (flat) or `NAME/trtcache.toml` (Triton), when present.
    pub sidecar: Option<PathBuf>,
    /// Flat or Triton.
    pub layout: Layout,
}

/// A model's background selections, and the profile an acquire that names none gets.
#[derive(Clone, Debug, Default)]
pub struct Variants {
    /// One per backend and per profile the model declares.
    pub selections: Vec<Selection>,
    /// The sidecar's `default_profile` or only profile, named so that an acquire naming none
    /// shares the plan and artifact of that background variant; `None` when the model has no
    /// named profiles.
    pub default_profile: Option<String>,
}

/// What a client or the background queue asks to build.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Selection {
    /// Profile name; the model's default when `None`.
    pub profile: Option<String>,
    pub backend: Backend,
    /// Precision.
    pub precision: Precision,
    /// The incoming runtime it is built for (`None`: the current runtime): an ONNX Runtime's
    /// version, or `tensorrt VERSION` (`daemon::runtimes::Incoming::id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

/// A model and selection resolved to a cache key.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The model.
    pub model: ModelEntry,
    /// The selection, with the profile resolved to a name.
    pub selection: Selection,
    /// Resolved profile name (`default` when the model declares none).
    pub profile: String,
    /// The cache key.
    pub key: CacheKey,
    /// Fingerprint of what decides whether a build validates without being in the key: the
    /// golden settings and tolerance, and the identity of the sidecar and golden files. A
    /// remembered failure holds only while it is unchanged.
    pub validation: u64,
}

/// A ready, validated artifact.
#[derive(Clone, Debug)]
pub struct Handout {
    /// Wire metadata (files listed in the order of `paths`).
    pub metadata: ArtifactMeta,
    /// The files, graph first, then external data.
    pub paths: Vec<PathBuf>,
    /// Identity of each file (same order) when its content was last known good; empty when
    /// the build cache does not track it. The daemon compares the descriptors it is about to hand
    /// out against these (one `fstat` each) and asks the build cache again on any difference. A
    /// write always changes device, inode, size, mtime or ctime (ctime cannot be set back
    /// from user space); bit rot on the medium changes none of them, which is what hashing
    /// (`trtcache verify`, and the build cache's check when it loads an artifact) is for.
    pub stamps: Vec<FileId>,
    /// Where it came from (`status` shows it).
    pub origin: Origin,
}

/// What the fleet tier answers before a local build ([`BuildCache::prefetch`]), asked without a
/// build slot.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per step of a job
pub enum Prefetch {
    /// Build here.
    Build,
    /// The bucket's artifact, fetched, checked and stored.
    Ready(Handout),
    /// Another host holds the build lease: ask again after `poll`. Its lease claims `left`
    /// more (already capped at this host's `lease_secs`); the queue waits no longer than the
    /// least it was told, then builds here.
    Wait {
        poll: std::time::Duration,
        left: std::time::Duration,
        holder: String,
    },
}

/// Phases a build reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildPhase {
    Building,
    Validating,
    Storing,
    /// Building again after the build worker was killed from outside (the OOM killer, an
    /// admin), at most `limits.worker_kill_retries` times.
    Retrying,
}

impl BuildPhase {
    /// Name used in progress events.
    pub fn as_str(&self) -> &'static str {
        match self {
            BuildPhase::Building => "building",
            BuildPhase::Validating => "validating",
            BuildPhase::Storing => "storing",
            BuildPhase::Retrying => "retrying",
        }
    }
}

/// Cooperative cancellation: the daemon sets it when the model is replaced or removed, the
/// build times out or the daemon shuts down; builds check it between steps.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A fresh, uncancelled token.
    pub fn new() -> Self {
        Self::default()
    }
    /// Requests cancellation.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The most bytes of a failure reason that travel in a frame or stay in the daemon's
/// memory: a reason quotes model-controlled text (a sidecar line, a node name, a worker's
/// stderr), and a 64 MB reason once made every `list` frame too large for every model.
pub const MAX_REASON_BYTES: usize = 1024;

/// A failure reason as the daemon keeps and sends it: control characters (terminal escapes
/// included) replaced by spaces, cut to [`MAX_REASON_BYTES`] by dropping its middle at word
/// boundaries (never inside a word, when a space is near): the head says what failed, the
/// tail is where build errors say what to do about it ("Fix: declare a shape profile …"),
/// the middle is ONNX Runtime's quotes.
pub fn bounded_reason(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.len() <= MAX_REASON_BYTES {
        return clean;
    }
    const CUT: &str = " … ";
    let budget = MAX_REASON_BYTES - CUT.len();
    // How far a cut may move to land on a space instead of inside a word.
    const SLACK: usize = 48;
    let mut head = budget * 3 / 5;
    while !clean.is_char_boundary(head) {
        head -= 1;
    }
    if let Some(sp) = clean[..head].rfind(' ').filter(|&i| head - i <= SLACK) {
        head = sp;
    }
    let mut tail = clean.len() - (budget - head);
    while !clean.is_char_boundary(tail) {
        tail += 1;
    }
    if let Some(sp) = clean[tail..].find(' ').filter(|&i| i <= SLACK) {
        tail += sp + 1;
    }
    format!("{}{CUT}{}", clean[..head].trim_end(), &clean[tail..])
}

/// The cause behind a [`BuildCacheError`]: the build, plan, key or store stage's own typed error
/// (downcast to it), or a message.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Errors of the build and cache stages as the daemon sees them: a class (what the daemon
/// does about it) over the stage's typed cause.
#[derive(Debug, thiserror::Error)]
pub enum BuildCacheError {
    /// The selection names a profile or backend this model or build cache does not have.
    #[error("{0}")]
    NotFound(Cause),
    /// The model cannot be built or failed validation (memoised until it changes).
    #[error("{0}")]
    Invalid(Cause),
    /// The build was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The model's files changed since it was planned (not memoised: it is planned again).
    #[error("{0}")]
    Changed(Cause),
    /// The runtime (ONNX Runtime, CUDA, TensorRT) is missing or broken.
    #[error("{0}")]
    Runtime(Cause),
    /// The cache could not store or read (disk full, I/O error): a condition of the machine,
    /// not of the model, so it is reported but not memoised; the next request retries.
    #[error("{0}")]
    Storage(Cause),
    /// File system trouble (the cause is in the message: it travels to clients as text).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl BuildCacheError {
    /// The wire's code for this error: the one mapping the queue, the socket and `warm` use.
    pub fn code(&self) -> ErrorCode {
        match self {
            BuildCacheError::NotFound(_) => ErrorCode::NotFound,
            // A changed model is planned again, as a cancelled build is asked again.
            BuildCacheError::Cancelled | BuildCacheError::Changed(_) => ErrorCode::Cancelled,
            BuildCacheError::Invalid(_)
            | BuildCacheError::Runtime(_)
            | BuildCacheError::Storage(_)
            | BuildCacheError::Io { .. } => ErrorCode::BuildFailed,
        }
    }

    /// Whether the error is a condition of the machine or of the moment rather than of the
    /// model: not remembered as the model's failure, retried later.
    pub fn transient(&self) -> bool {
        matches!(
            self,
            BuildCacheError::Storage(_) | BuildCacheError::Cancelled | BuildCacheError::Changed(_)
        )
    }

    /// Wraps an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |error| BuildCacheError::Io { path, error }
    }
}

/// The build and cache stages, seen from the daemon.
pub trait BuildCache: Send + Sync + 'static {
    /// The selections built in the background for a model (one per configured backend and
    /// per profile the model declares) and its default profile, from one read of its sidecar.
    /// The daemon calls it when a model is registered (on the blocking pool) and keeps the
    /// result with the model's state, so no request reads the sidecar.
    fn variants(&self, model: &ModelEntry, backends: &[Backend]) -> Variants;
    /// Key and plan for a model file and a selection; blocking (hashes the file).
    fn plan(&self, model: &ModelEntry, sel: &Selection) -> Result<Planned, BuildCacheError>;
    /// A ready, validated artifact for this key, after cheap integrity checks.
    fn lookup(&self, planned: &Planned) -> Result<Option<Handout>, BuildCacheError>;
    /// Builds, validates and stores; observes `cancel`; reports phases through `progress`.
    /// Leaves no temporary files behind, whether it succeeds, fails or is cancelled.
    fn build(
        &self,
        planned: &Planned,
        cancel: &CancelToken,
        progress: &dyn Fn(BuildPhase),
    ) -> Result<Handout, BuildCacheError>;
    /// Why the fleet tier is unreachable, while it is (see
    /// [`crate::remote::RemoteTier::down`]).
    fn remote_down(&self) -> Option<String> {
        None
    }
    /// How many [`BuildCache::prefetch`] calls may run at once; 0 (the default): the build cache has
    /// no fleet tier and the queue never calls it.
    fn prefetch_concurrency(&self) -> usize {
        0
    }
    /// Before a local build, on the queue's side and without a build slot: the fleet tier's
    /// artifact for `planned`, or whether another host is building it. Blocking, bounded by
    /// the tier's lookup deadline (and the download of a fetched artifact); never an error:
    /// any trouble is [`Prefetch::Build`].
    fn prefetch(&self, _planned: &Planned) -> Prefetch {
        Prefetch::Build
    }
    /// Removes one artifact; whether it existed.
    fn evict(&self, key: &CacheKey) -> Result<bool, BuildCacheError>;
    /// The fleet tier's counters, when the build cache has a tier.
    fn remote_stats(&self) -> Option<crate::remote::RemoteStats> {
        None
    }
    /// Artifacts the store evicted least-recently-used to fit its size limit so far.
    fn evictions(&self) -> u64 {
        0
    }
    /// Records a use of a ready artifact served from the daemon's memory, so that the
    /// store's least-recently-used eviction sees it (the daemon calls it at most every
    /// few seconds per key).
    fn touch(&self, _key: &CacheKey) {}
    /// The store behind the build cache, for cache maintenance (`ls`, `rm`, `gc`, `verify`)
    /// while the daemon holds the cache's lock; `None` when the build cache has none.
    fn store(&self) -> Option<Arc<dyn crate::cache::Store>> {
        None
    }
    /// How many times the build cache's folder was opened afresh since it started (the folder was
    /// deleted or replaced under the daemon; see `cached`): when it grows, every artifact the
    /// daemon remembers as ready may be gone, and is looked up again before it is trusted.
    fn generation(&self) -> u64 {
        0
    }
    /// Flushes the store (called on shutdown).
    fn flush(&self) -> Result<(), BuildCacheError> {
        Ok(())
    }
    /// The runtimes this build cache builds for (the current one and the incoming ones);
    /// `None` (the default): only the one it was opened with, and a selection naming another
    /// cannot be planned.
    fn runtimes(&self) -> Option<crate::daemon::runtimes::Runtimes> {
        None
    }
    /// Tells the store which runtimes gc evicts last (before a gc; after runtimes change).
    fn refresh_keep(&self) {}
    /// Adds an incoming runtime (`warm --runtime`); whether it was new.
    fn add_runtime(&self, rt: crate::daemon::runtimes::Incoming) -> Result<bool, BuildCacheError> {
        Err(BuildCacheError::Invalid(
            format!(
                "this build cache builds for one runtime only; cannot add {}",
                crate::daemon::runtimes::describe(&rt.id())
            )
            .into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_one_bounded_line_without_escapes() {
        let huge = format!("\x1b[2J{}\nend", "é".repeat(100_000));
        let r = bounded_reason(&huge);
        assert!(r.len() <= MAX_REASON_BYTES, "{}", r.len());
        assert!(!r.contains('\x1b') && !r.contains('\n'));
        assert!(
            r.contains(" … ") && r.ends_with("é end"),
            "the tail survives"
        );
        assert_eq!(bounded_reason("short"), "short");
        // Words are never cut when a space is near: every word of the result is whole.
        let words: Vec<String> = (0..2000).map(|i| format!("word{i}")).collect();
        let text = words.join(" ");
        let r = bounded_reason(&text);
        assert!(r.len() <= MAX_REASON_BYTES, "{}", r.len());
        for w in r.split(' ').filter(|w| *w != "…") {
            assert!(words.iter().any(|x| x == w), "`{w}` was cut");
        }
    }
}
