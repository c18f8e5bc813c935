//! What `status` and `watch` say of the repository's models and their variants.

use serde::{Deserialize, Serialize};

/// State of one variant (profile × backend × precision) of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VariantState {
    /// Not built and not queued.
    Missing,
    /// Waiting for a build slot.
    Queued,
    /// Being built.
    Building,
    /// Built, validated and in the cache.
    Ready,
    /// The last build failed (see `reason`).
    Failed,
}

impl std::fmt::Display for VariantState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VariantState::Missing => "missing",
            VariantState::Queued => "queued",
            VariantState::Building => "building",
            VariantState::Ready => "ready",
            VariantState::Failed => "failed",
        })
    }
}

/// One model in the repository.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelStatus {
    /// Repository name.
    pub name: String,
    /// The version served by default (the newest; 0 for a flat `NAME.onnx`).
    pub version: u64,
    /// Every version present, ascending.
    pub versions: Vec<u64>,
    /// `flat` or `triton`.
    pub layout: String,
    /// Per variant of the served version.
    pub variants: Vec<VariantStatus>,
}

/// One variant's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantStatus {
    /// Shape-profile name (`default` when the model declares none).
    pub profile: String,
    /// Backend name.
    pub backend: String,
    /// `fp32` or `fp16`.
    pub precision: String,
    /// Where it stands.
    pub state: VariantState,
    /// Cache key, once the model has been hashed.
    #[serde(default)]
    pub key: Option<String>,
    /// Why it failed (for `failed`).
    #[serde(default)]
    pub reason: Option<String>,
    /// The current build phase (for `building`).
    #[serde(default)]
    pub phase: Option<String>,
    /// Where the ready artifact came from (for `ready`): built by this daemon, found in its
    /// local cache, or fetched from the fleet tier. Absent from daemons that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// The incoming runtime this variant is built for (docs/daemon.md, "Upgrading the
    /// runtime"): an ONNX Runtime's version (`1.32.0`) or `tensorrt VERSION`; absent for the
    /// daemon's current runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// For `ready`: input name → the shape validation ran it at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validated_at: Option<std::collections::BTreeMap<String, Vec<i64>>>,
    /// For `ready`: input name → the shape of validation's second run (every free batch axis
    /// doubled), when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub also_validated_at: Option<std::collections::BTreeMap<String, Vec<i64>>>,
}

/// Where a ready artifact came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Built (and validated) by this daemon since it started.
    Built,
    /// Found in this host's cache.
    Local,
    /// Fetched from the fleet tier (S3) and verified against its signed manifest.
    Remote,
}

/// Why a [`WatchEvent`] was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchReason {
    /// A variant's artifact became ready (built, found in the cache or fetched: see
    /// [`WatchEvent::origin`]); [`WatchEvent::key`] is the key to acquire.
    Ready,
    /// The model's files changed (new content, a new version, a new sidecar): the artifacts
    /// of its old content are no longer served; a `ready` (or `failed`) event per variant
    /// follows once the new content is built. Model-wide: no profile, backend or key.
    Changed,
    /// The model left the repository. Model-wide. Should it come back, `changed` and
    /// `ready` events follow on the same subscription.
    Removed,
    /// A variant's artifact was evicted from the cache (the admin `evict` request); it is
    /// built again at the next acquire, then a `ready` event follows.
    Evicted,
    /// Building a variant's new content failed; [`WatchEvent::message`] says why.
    Failed,
    /// This watcher fell behind and events were dropped (`limits.watch_queue`): ask for
    /// `status` (or acquire) to learn the current state. Model-wide.
    Resync,
}

impl WatchReason {
    /// The snake_case name used on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            WatchReason::Ready => "ready",
            WatchReason::Changed => "changed",
            WatchReason::Removed => "removed",
            WatchReason::Evicted => "evicted",
            WatchReason::Failed => "failed",
            WatchReason::Resync => "resync",
        }
    }
}

impl std::fmt::Display for WatchReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A change of a watched model's ready artifact. Variant events (`ready`, `evicted`,
/// `failed`) name the profile and backend; model-wide ones (`changed`, `removed`, `resync`)
/// leave them out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// Model name.
    pub model: String,
    /// What happened.
    pub reason: WatchReason,
    /// The version the event is about (the served one); absent for `removed` and `resync`.
    #[serde(default)]
    pub version: Option<u64>,
    /// Shape-profile name of the variant; absent for model-wide events.
    #[serde(default)]
    pub profile: Option<String>,
    /// Backend of the variant; absent for model-wide events.
    #[serde(default)]
    pub backend: Option<String>,
    /// The variant's new ready key (for `ready`); absent when it has none.
    #[serde(default)]
    pub key: Option<String>,
    /// Where the ready artifact came from (for `ready`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Details for people: why a build failed, how many events a `resync` dropped.
    #[serde(default)]
    pub message: Option<String>,
}
