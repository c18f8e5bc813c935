//! The `[remote]` section of the configuration: where the bucket is, whether this host may
//! write, which keys it trusts and signs with, and every limit the tier enforces.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Whether a host uploads what it builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Fetch only; never writes an object (no blobs, manifests or leases).
    #[default]
    ReadOnly,
    /// Also uploads (signed) what this host builds and takes build leases.
    ReadWrite,
}

/// `[remote]`: the fleet tier. Present = enabled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteConfig {
    /// `s3://BUCKET/PREFIX` (the prefix may be empty).
    pub url: String,
    /// Any S3-compatible endpoint, e.g. `http://127.0.0.1:9000` (AWS when unset).
    pub endpoint: Option<String>,
    pub region: String,
    /// `read-only` (default) or `read-write`.
    pub mode: Mode,
    /// Ed25519 public key files (`name:base64`); non-empty = only manifests signed by one
    /// of them are used. Several keys = rotation.
    pub trusted_keys: Vec<PathBuf>,
    /// The Ed25519 secret key file (`name:base64`) a read-write host signs uploads with.
    pub signing_key: Option<PathBuf>,
    /// Bound on one request, body included (milliseconds).
    pub timeout_ms: u64,
    /// Bound on connecting (milliseconds).
    pub connect_timeout_ms: u64,
    /// Retries of a failed request (with exponential backoff), 0 = none.
    pub retries: usize,
    /// Bound on one lookup on the build path (milliseconds, retries included): a manifest or
    /// lease read or write, and each wait for the next piece of a blob. A lookup that gets no
    /// answer in time opens the circuit breaker at once, so a hung endpoint delays a local
    /// build by at most this, once per `breaker_cooldown_secs`.
    pub lookup_timeout_ms: u64,
    /// The most bytes read from any response but a blob's (manifests, leases, listing pages,
    /// error bodies), checked before anything is parsed; a blob is bounded by the size its
    /// signed manifest states.
    pub max_response_bytes: u64,
    /// Consecutive failed operations that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker fails calls at once before trying the endpoint again.
    pub breaker_cooldown_secs: u64,
    /// Lookups and fetches of the daemon's queue running at once; they hold no build slot.
    pub concurrency: usize,
    /// Uploads waiting for the upload worker; beyond it an upload is dropped (and counted).
    pub upload_queue: usize,
    /// How long a build lease is held before other hosts may take it over.
    pub lease_secs: u64,
    /// How often a host waiting on another's lease looks for the manifest (milliseconds).
    pub lease_poll_ms: u64,
    /// Files of at least this size are uploaded in parts of this size (multipart).
    pub part_bytes: u64,
    /// Also re-validate a pulled artifact against the model (the builder's verdict is in
    /// the signed manifest; a host always checks hashes and that the artifact opens).
    pub revalidate: bool,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            endpoint: None,
            region: "us-east-1".into(),
            mode: Mode::ReadOnly,
            trusted_keys: Vec::new(),
            signing_key: None,
            timeout_ms: 60_000,
            connect_timeout_ms: 3_000,
            retries: 3,
            lookup_timeout_ms: 2_000,
            max_response_bytes: 4 << 20,
            breaker_failures: 3,
            breaker_cooldown_secs: 30,
            concurrency: 8,
            upload_queue: 64,
            lease_secs: 900,
            lease_poll_ms: 1_000,
            part_bytes: 16 << 20,
            revalidate: false,
        }
    }
}

impl RemoteConfig {
    /// `(bucket, prefix)` of [`RemoteConfig::url`]; the prefix has no leading or trailing `/`.
    pub fn bucket_prefix(&self) -> Result<(String, String), String> {
        let bad = |why: &str| format!("remote.url `{}`: {why}", self.url);
        let rest = self
            .url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("expected s3://BUCKET/PREFIX"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket name"));
        }
        Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
    }

    /// Checks the settings that can be checked without the network.
    pub fn validate(&self) -> Result<(), String> {
        self.bucket_prefix()?;
        if self.mode == Mode::ReadWrite && self.signing_key.is_none() {
            return Err(
                "remote.mode = \"read-write\" needs remote.signing_key (writers sign what they upload; `trtcache keygen PATH` makes one)".into(),
            );
        }
        for (name, v) in [
            ("remote.timeout_ms", self.timeout_ms),
            ("remote.connect_timeout_ms", self.connect_timeout_ms),
            ("remote.lookup_timeout_ms", self.lookup_timeout_ms),
            ("remote.max_response_bytes", self.max_response_bytes),
            ("remote.lease_secs", self.lease_secs),
            ("remote.lease_poll_ms", self.lease_poll_ms),
            ("remote.upload_queue", self.upload_queue as u64),
            ("remote.concurrency", self.concurrency as u64),
        ] {
            if v == 0 {
                return Err(format!("{name} must be above 0"));
            }
        }
        if self.part_bytes < (5 << 20) {
            return Err(
                "remote.part_bytes must be at least 5 MiB (the S3 minimum part size)".into(),
            );
        }
        Ok(())
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// [`RemoteConfig::lookup_timeout_ms`].
    pub fn lookup_timeout(&self) -> Duration {
        Duration::from_millis(self.lookup_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_issue_section_and_checks_it() {
        let c: RemoteConfig = toml::from_str(
            r#"url = "s3://fleet/engines/v1/"
endpoint = "http://127.0.0.1:9000"
region = "us-east-1"
mode = "read-write"
trusted_keys = ["/etc/trtcache/keys/ci-builder.pub"]
signing_key = "/etc/trtcache/keys/this-host.key""#,
        )
        .unwrap();
        assert_eq!(c.mode, Mode::ReadWrite);
        assert_eq!(
            c.bucket_prefix().unwrap(),
            ("fleet".into(), "engines/v1".into())
        );
        c.validate().unwrap();
        let ro: RemoteConfig = toml::from_str("url = \"s3://b\"").unwrap();
        assert_eq!(ro.mode, Mode::ReadOnly);
        assert_eq!(ro.bucket_prefix().unwrap().1, "");
        let no_key = RemoteConfig {
            mode: Mode::ReadWrite,
            ..ro.clone()
        };
        assert!(no_key.validate().is_err());
        let bad = RemoteConfig {
            url: "http://b/x".into(),
            ..ro
        };
        assert!(bad.validate().is_err());
        assert!(toml::from_str::<RemoteConfig>("url = \"s3://b\"\nmod = \"x\"").is_err());
    }

    #[test]
    fn the_fleet_limits_have_bounded_defaults_and_zero_is_refused() {
        let c: RemoteConfig = toml::from_str("url = \"s3://b\"").unwrap();
        assert_eq!(c.lookup_timeout(), Duration::from_secs(2));
        assert_eq!(c.max_response_bytes, 4 << 20);
        assert!(c.concurrency > 0);
        for bad in [
            "lookup_timeout_ms = 0",
            "max_response_bytes = 0",
            "concurrency = 0",
        ] {
            let c: RemoteConfig = toml::from_str(&format!("url = \"s3://b\"\n{bad}")).unwrap();
            let e = c.validate().unwrap_err();
            assert!(e.contains(bad.split(' ').next().unwrap()), "{e}");
        }
    }
}
