//! What the daemon's administrative requests answer: `rescan`, `cache_gc`, `cache_verify`
//! and `stats`.

use serde::{Deserialize, Serialize};

/// What a `rescan` found in the repository.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RescanReport {
    /// The repository the daemon serves (canonical path).
    pub root: String,
    /// How long a model's files must keep their size and mtime to count as written
    /// (`limits.debounce_ms`).
    pub settle_ms: u64,
    /// Every model found, sorted by name.
    pub models: Vec<FoundModel>,
    /// Entries of the repository that are not models, each with the reason.
    #[serde(default)]
    pub skipped: Vec<SkippedEntry>,
}

/// One model a `rescan` found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoundModel {
    /// Repository name.
    pub name: String,
    /// Files the model is made of (every version).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// `true` once the daemon serves exactly these files (they kept their size and mtime for
    /// `settle_ms`); `false` while they are still changing.
    pub settled: bool,
}

/// A repository entry that is not a model, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedEntry {
    /// The entry's path.
    pub path: String,
    /// Why it is not served.
    pub reason: String,
}

/// What `cache_gc` evicted (or would have).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheGcReport {
    /// The daemon's cache directory.
    #[serde(default)]
    pub cache_dir: String,
    /// Nothing was deleted.
    pub dry_run: bool,
    /// The limit evicted down to.
    pub max_bytes: u64,
    /// Artifact bytes before.
    pub bytes_before: u64,
    /// Artifact bytes after.
    pub bytes_after: u64,
    /// Keys evicted (or that would be).
    pub evicted: Vec<String>,
}

/// What `cache_verify` found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheVerifyReport {
    /// The daemon's cache directory.
    #[serde(default)]
    pub cache_dir: String,
    /// Artifacts re-hashed.
    pub checked: u64,
    /// Artifacts whose files matched.
    pub ok: u64,
    /// (key, why) of every entry quarantined by this run.
    pub quarantined: Vec<(String, String)>,
}

/// Daemon counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Acquires answered with an artifact already in the cache (those through the ready
    /// index included).
    pub hits: u64,
    /// Of `hits`, artifacts taken through the ready index (a consumer opened the daemon's
    /// pointer instead of asking over the socket); absent (0) from daemons that predate it.
    #[serde(default)]
    pub fast_hits: u64,
    /// Acquires that had to wait for a build.
    pub misses: u64,
    /// Builds finished successfully: artifacts this daemon built and validated (never those
    /// fetched from the fleet bucket: `fetches`).
    pub builds: u64,
    /// Artifacts fetched from the fleet bucket (verified and stored) in place of a build;
    /// absent (0) from daemons that predate it.
    #[serde(default)]
    pub fetches: u64,
    /// Builds that failed (including timeouts).
    pub failures: u64,
    /// Builds cancelled.
    pub cancelled: u64,
    /// Total seconds spent in successful and failed builds.
    pub build_seconds: f64,
    /// Builds waiting for a slot.
    pub queue_depth: u64,
    /// Builds running.
    pub building: u64,
    /// Models served.
    pub models: u64,
    /// Open connections.
    pub connections: u64,
    /// Seconds since the daemon started.
    pub uptime_seconds: f64,
    /// Ready artifacts the daemon holds in memory (for the current models' plans); absent
    /// (0) from daemons that predate it.
    #[serde(default)]
    pub artifacts_in_memory: u64,
    /// Fleet tier: local misses answered from the bucket (0 without a `[remote]` tier).
    #[serde(default)]
    pub remote_hits: u64,
    /// Fleet tier: local misses the bucket could not answer.
    #[serde(default)]
    pub remote_misses: u64,
    /// Fleet tier: artifacts uploaded (signed) by this host.
    #[serde(default)]
    pub remote_uploads: u64,
    /// Fleet tier: manifests or blobs refused (unsigned, untrusted, edited, wrong bytes).
    #[serde(default)]
    pub remote_rejected: u64,
    /// Fleet tier: network or server errors (timeouts, 5xx, an open circuit breaker).
    #[serde(default)]
    pub remote_errors: u64,
    /// Fleet tier: why it is unreachable (its last operation failed, or its circuit breaker
    /// is open); absent while it answers, without a tier, and from daemons that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_down: Option<String>,
    /// Acquires answered with an error (`not_ready`, `not_found`, a failed build, ...).
    #[serde(default)]
    pub acquire_errors: u64,
    /// Artifacts evicted least-recently-used to keep the cache under its size limit.
    #[serde(default)]
    pub evictions: u64,
    /// Artifacts removed by `evict` requests.
    #[serde(default)]
    pub evictions_requested: u64,
}
