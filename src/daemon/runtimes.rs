//! The ONNX Runtime libraries the daemon builds for: the current one (`ort_library`, the one
//! this process loads) and the incoming ones (`[runtimes] onnxruntime`, and those a
//! `warm --runtime` added), each found and trust-checked like `ort_library` and identified by
//! its version. A build for an incoming runtime runs in a worker that loads only that
//! library; its key names that version, so the artifacts of two runtimes never mix.
//!
//! Enters: configured paths, a consumer's [`ClientRuntime`]. Leaves: which runtime serves it,
//! and the versions gc evicts last ([`RuntimeKeep`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use trtcache_client::protocol::Runtime as ClientRuntime;

use crate::cache::RuntimeKeep;
use crate::libs::onnxruntime::{locate, RuntimeError};

/// One ONNX Runtime library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrtRuntime {
    /// Its version, e.g. `1.32.0` (what keys name).
    pub version: String,
    /// The library, as found (trust-checked).
    pub path: PathBuf,
}

impl OrtRuntime {
    /// Finds and checks the library at `path` (or, for `None`, the documented search).
    pub fn locate(path: Option<&Path>) -> Result<Self, RuntimeError> {
        let (path, version) = locate(path)?;
        Ok(OrtRuntime { version, path })
    }
}

/// Why a consumer's runtime cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this daemon builds for onnxruntime {current}{incoming}, not for the consumer's {wanted}; add that library to [runtimes] onnxruntime (docs/daemon.md, \"Upgrading the runtime\") or run `trtcache warm --runtime LIBRARY`")]
pub struct Unavailable {
    pub current: String,
    pub incoming: String,
    pub wanted: String,
}

/// The current runtime and the incoming ones.
#[derive(Clone, Debug)]
pub struct Runtimes {
    pub current: OrtRuntime,
    incoming: Vec<OrtRuntime>,
}

impl Runtimes {
    /// `current` and each incoming library located; an incoming library of the current
    /// version, or two of one version, is refused (one version, one library).
    pub fn resolve(current: OrtRuntime, incoming: &[PathBuf]) -> Result<Self, String> {
        let mut r = Runtimes {
            current,
            incoming: Vec::new(),
        };
        for p in incoming {
            let rt = OrtRuntime::locate(Some(p))
                .map_err(|e| format!("[runtimes] onnxruntime {}: {e}", p.display()))?;
            r.add(rt)?;
        }
        Ok(r)
    }

    /// Adds an incoming runtime (`warm --runtime`); the same library again is no change.
    /// Returns whether it was new.
    pub fn add(&mut self, rt: OrtRuntime) -> Result<bool, String> {
        if rt.version == self.current.version {
            if rt.path == self.current.path {
                return Ok(false);
            }
            return Err(format!(
                "{} is onnxruntime {}, the current runtime's version ({}): one library per version",
                rt.path.display(),
                rt.version,
                self.current.path.display()
            ));
        }
        if let Some(have) = self.incoming.iter().find(|i| i.version == rt.version) {
            if have.path == rt.path {
                return Ok(false);
            }
            return Err(format!(
                "{} and {} are both onnxruntime {}: one library per version",
                have.path.display(),
                rt.path.display(),
                rt.version
            ));
        }
        self.incoming.push(rt);
        Ok(true)
    }

    /// The incoming runtimes, in the order configured.
    pub fn incoming(&self) -> &[OrtRuntime] {
        &self.incoming
    }

    /// The incoming runtime of `version`.
    pub fn incoming_of(&self, version: &str) -> Option<&OrtRuntime> {
        self.incoming.iter().find(|i| i.version == version)
    }

    /// Which runtime serves a consumer on `want`: `Ok(None)` the current one (also when it
    /// names no ONNX Runtime version), `Ok(Some(v))` the incoming one of version `v`.
    pub fn serving(&self, want: Option<&ClientRuntime>) -> Result<Option<String>, Unavailable> {
        let Some(v) = want.and_then(|w| w.onnxruntime.as_deref()) else {
            return Ok(None);
        };
        if v == self.current.version {
            return Ok(None);
        }
        if self.incoming_of(v).is_some() {
            return Ok(Some(v.to_string()));
        }
        Err(Unavailable {
            current: self.current.version.clone(),
            incoming: if self.incoming.is_empty() {
                String::new()
            } else {
                format!(
                    " (and incoming {})",
                    self.incoming
                        .iter()
                        .map(|i| i.version.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            wanted: v.to_string(),
        })
    }

    /// The ONNX Runtime versions gc evicts last: current, incoming, and `used` (those
    /// consumers asked for recently).
    pub fn keep(&self, used: impl IntoIterator<Item = String>) -> RuntimeKeep {
        let mut versions: BTreeSet<String> = used.into_iter().collect();
        versions.insert(self.current.version.clone());
        versions.extend(self.incoming.iter().map(|i| i.version.clone()));
        RuntimeKeep(BTreeMap::from([("onnxruntime".to_string(), versions)]))
    }
}

/// What gc keeps last in `store`: `rts`'s current and incoming versions, and those of
/// artifacts a consumer used within `keep_used_secs` (0: none kept for use alone).
pub fn keep_in(
    store: &dyn crate::cache::Store,
    rts: &Runtimes,
    keep_used_secs: u64,
) -> RuntimeKeep {
    let mut used = Vec::new();
    if keep_used_secs > 0 {
        let since = crate::cache::now_secs().saturating_sub(keep_used_secs);
        match store.list() {
            Ok(records) => used.extend(
                records
                    .iter()
                    .filter(|r| r.last_used >= since)
                    .filter_map(|r| r.parts.backend.versions.get("onnxruntime").cloned()),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "listing the cache for the runtimes in use failed; keeping the current and incoming ones only")
            }
        }
    }
    rts.keep(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(v: &str) -> OrtRuntime {
        OrtRuntime {
            version: v.into(),
            path: PathBuf::from(format!("/o/libonnxruntime.so.{v}")),
        }
    }

    #[test]
    fn a_consumer_is_served_by_the_runtime_of_its_version_or_told_what_exists() {
        let mut r = Runtimes {
            current: rt("1.31.1"),
            incoming: Vec::new(),
        };
        assert_eq!(r.add(rt("1.32.0")), Ok(true));
        assert_eq!(r.add(rt("1.32.0")), Ok(false), "the same library again");
        assert!(r
            .add(OrtRuntime {
                path: "/elsewhere/libonnxruntime.so.1.32.0".into(),
                ..rt("1.32.0")
            })
            .is_err());
        assert!(r
            .add(OrtRuntime {
                path: "/x/libonnxruntime.so".into(),
                ..rt("1.31.1")
            })
            .is_err());
        assert_eq!(r.serving(None), Ok(None));
        assert_eq!(r.serving(Some(&ClientRuntime::default())), Ok(None));
        assert_eq!(
            r.serving(Some(&ClientRuntime::onnxruntime("1.31.1"))),
            Ok(None)
        );
        assert_eq!(
            r.serving(Some(&ClientRuntime::onnxruntime("1.32.0"))),
            Ok(Some("1.32.0".into()))
        );
        let e = r
            .serving(Some(&ClientRuntime::onnxruntime("1.30.0")))
            .unwrap_err();
        assert_eq!(
            e.to_string().split(';').next().unwrap(),
            "this daemon builds for onnxruntime 1.31.1 (and incoming 1.32.0), not for the consumer's 1.30.0"
        );
        let keep = r.keep(["1.30.0".to_string()]);
        let v = |s: &str| BTreeMap::from([("onnxruntime".to_string(), s.to_string())]);
        assert!(keep.keeps(&v("1.30.0")) && keep.keeps(&v("1.32.0")));
        assert!(!keep.keeps(&v("1.29.0")));
    }
}
