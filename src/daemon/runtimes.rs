//! The runtimes the daemon builds for. ONNX Runtime: the current library (`ort_library`, the
//! one this process loads) and the incoming ones (`[runtimes] onnxruntime`, and those a
//! `warm --runtime LIBRARY` added), each found and trust-checked like `ort_library` and
//! identified by its version. TensorRT: the current one (the shim this process loads, known
//! once an incoming TensorRT is configured) and the incoming installs (`[runtimes]
//! tensorrt`, `warm --runtime ROOT`), each identified by the version a child process asked
//! it for (`crate::trt::incoming`). A build for an incoming runtime runs in a worker that
//! loads only that runtime; its key names that version, so the artifacts of two runtimes
//! never mix. A selection names an incoming runtime by [`Incoming::id`]: the ONNX Runtime
//! version (`1.32.0`) or `tensorrt VERSION`.
//!
//! Enters: configured paths, a consumer's [`ClientRuntime`]. Leaves: which runtime serves it,
//! and the versions gc evicts last ([`RuntimeKeep`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use trtcache_client::protocol::Runtime as ClientRuntime;

use crate::cache::RuntimeKeep;
use crate::libs::onnxruntime::{locate, RuntimeError};
use crate::spec::Backend;
use crate::trt::incoming::{IncomingTrt, ProbeError};

/// How a selection names an incoming TensorRT: this prefix and its version.
const TRT_ID: &str = "tensorrt ";

/// An incoming runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Incoming {
    Ort(OrtRuntime),
    Trt(IncomingTrt),
}

impl Incoming {
    /// What a selection (and `status`, `warm`'s results) names it by: `1.32.0` for an ONNX
    /// Runtime, `tensorrt 10.17.0` for a TensorRT.
    pub fn id(&self) -> String {
        match self {
            Incoming::Ort(o) => o.version.clone(),
            Incoming::Trt(t) => format!("{TRT_ID}{}", t.version),
        }
    }

    /// Whether `backend` builds with it: an ONNX Runtime serves the `ort-*` backends, a
    /// TensorRT `trt` and `ort-tensorrt`.
    pub fn builds(&self, backend: Backend) -> bool {
        match self {
            Incoming::Ort(_) => backend.is_onnx(),
            Incoming::Trt(_) => backend.uses_tensorrt(),
        }
    }
}

/// How a human reads a selection's runtime id: `onnxruntime 1.32.0`, `tensorrt 10.17.0`.
pub fn describe(id: &str) -> String {
    if id.starts_with(TRT_ID) {
        id.to_string()
    } else {
        format!("onnxruntime {id}")
    }
}

/// The incoming TensorRT at `root` (its shim: `shim`, else its own or the daemon's), its
/// version asked in a child process (this binary's hidden `probe-tensorrt`, or the
/// worker executable `TRTCACHE_WORKER_EXE` names), never in this one.
pub fn probe_tensorrt(root: &Path, shim: Option<&Path>) -> Result<IncomingTrt, ProbeError> {
    let exe = std::env::var_os(crate::builder::worker::WORKER_EXE_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    crate::trt::incoming::probe(root, shim, &exe, crate::trt::incoming::PROBE_TIMEOUT)
}

/// The version of the TensorRT this process loads (the shim's library, else the
/// `libnvinfer` the loader finds), `None` when there is none.
pub fn current_tensorrt() -> Option<String> {
    let cfg = crate::trt::LoaderConfig::from_env();
    match crate::trt::Trt::shared(&cfg) {
        Ok(t) => Some(t.version().to_string()),
        Err(e) => {
            tracing::debug!(error = %e, "no shim; the current TensorRT is the library's");
            crate::trt::loader::tensorrt_library_version(&cfg)
                .ok()
                .map(|v| v.to_string())
        }
    }
}

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

/// Why a consumer's runtime cannot be served (the message says what to do).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// `this daemon builds for LIB CURRENT (and incoming A, B), not for the consumer's V; HINT`.
fn unavailable(
    lib: &str,
    current: &str,
    incoming: &[String],
    wanted: &str,
    hint: &str,
) -> Unavailable {
    let incoming = if incoming.is_empty() {
        String::new()
    } else {
        format!(" (and incoming {})", incoming.join(", "))
    };
    Unavailable(format!(
        "this daemon builds for {lib} {current}{incoming}, not for the consumer's {wanted}; {hint}"
    ))
}

/// The current runtime and the incoming ones.
#[derive(Clone, Debug)]
pub struct Runtimes {
    pub current: OrtRuntime,
    incoming: Vec<OrtRuntime>,
    /// The TensorRT this daemon loads ([`current_tensorrt`]; `None`: unknown, none, or no
    /// incoming TensorRT asked).
    current_trt: Option<String>,
    trt_incoming: Vec<IncomingTrt>,
}

impl Runtimes {
    /// `current` and each incoming library located; an incoming library of the current
    /// version, or two of one version, is refused (one version, one library).
    pub fn resolve(current: OrtRuntime, incoming: &[PathBuf]) -> Result<Self, String> {
        let mut r = Runtimes {
            current,
            incoming: Vec::new(),
            current_trt: None,
            trt_incoming: Vec::new(),
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

    /// Which runtime serves a consumer on `want` with `backend`'s artifacts: `Ok(None)` the
    /// current one (also when it names no version of a library `backend` builds with),
    /// `Ok(Some(id))` the incoming one of [`Incoming::id`] `id`. Only the libraries the
    /// backend builds with count: `onnxruntime` for the `ort-*` backends, `tensorrt` for `trt`
    /// and `ort-tensorrt` (ignored, as before, while the daemon knows no TensorRT).
    pub fn serving(
        &self,
        want: Option<&ClientRuntime>,
        backend: Backend,
    ) -> Result<Option<String>, Unavailable> {
        let Some(want) = want else {
            return Ok(None);
        };
        let ort = match want.onnxruntime.as_deref().filter(|_| backend.is_onnx()) {
            Some(v) => self.serving_ort(v)?,
            None => None,
        };
        let trt = match want.tensorrt.as_deref().filter(|_| backend.uses_tensorrt()) {
            Some(v) => self.serving_trt(v)?,
            None => None,
        };
        match (ort, trt) {
            (Some(o), Some(t)) => Err(Unavailable(format!(
                "this daemon builds {backend} for one incoming runtime at a time, not for onnxruntime {o} with {t} together; run one of them with the current other"
            ))),
            (o, t) => Ok(o.or(t)),
        }
    }

    fn serving_ort(&self, v: &str) -> Result<Option<String>, Unavailable> {
        if v == self.current.version {
            return Ok(None);
        }
        if self.incoming_of(v).is_some() {
            return Ok(Some(v.to_string()));
        }
        let incoming: Vec<String> = self.incoming.iter().map(|i| i.version.clone()).collect();
        Err(unavailable(
            "onnxruntime",
            &self.current.version,
            &incoming,
            v,
            "add that library to [runtimes] onnxruntime (docs/daemon.md, \"Upgrading the runtime\") or run `trtcache warm --runtime LIBRARY`",
        ))
    }

    fn serving_trt(&self, v: &str) -> Result<Option<String>, Unavailable> {
        if self.trt_incoming.is_empty() && self.current_trt.is_none() {
            return Ok(None);
        }
        if self.current_trt.as_deref() == Some(v) {
            return Ok(None);
        }
        let id = format!("{TRT_ID}{v}");
        if self.incoming_by_id(&id).is_some() {
            return Ok(Some(id));
        }
        let incoming: Vec<String> = self
            .trt_incoming
            .iter()
            .map(|t| t.version.to_string())
            .collect();
        Err(unavailable(
            "tensorrt",
            self.current_trt.as_deref().unwrap_or("(none loaded)"),
            &incoming,
            v,
            "add its install root to [runtimes] tensorrt (docs/daemon.md, \"Upgrading the runtime\") or run `trtcache warm --runtime TENSORRT_ROOT`",
        ))
    }

    /// The TensorRT this daemon loads, as [`current_tensorrt`] found it.
    pub fn set_current_tensorrt(&mut self, version: Option<String>) {
        self.current_trt = version;
    }

    /// Whether the current TensorRT was asked for (it is, once one is incoming).
    pub fn knows_current_tensorrt(&self) -> bool {
        self.current_trt.is_some()
    }

    /// Adds an incoming TensorRT; the same root again is no change, and so is one of the
    /// current TensorRT's version (its artifacts are the current ones: a switch that left
    /// the root in `[runtimes]` must not stop the daemon). Refused: a version another root
    /// already brings (one root per version).
    pub fn add_tensorrt(&mut self, t: IncomingTrt) -> Result<bool, String> {
        let v = t.version.to_string();
        if self.current_trt.as_deref() == Some(v.as_str()) {
            tracing::warn!(root = %t.root.display(), tensorrt = %v, "an incoming TensorRT of the current TensorRT's version: nothing to build for it (drop it from [runtimes] tensorrt)");
            return Ok(false);
        }
        if let Some(have) = self.trt_incoming.iter().find(|i| i.version == t.version) {
            if have.root == t.root && have.shim == t.shim {
                return Ok(false);
            }
            return Err(format!(
                "{} and {} are both TensorRT {v}: one root per version",
                have.root.display(),
                t.root.display()
            ));
        }
        self.trt_incoming.push(t);
        Ok(true)
    }

    /// Adds the incoming TensorRTs of `[runtimes] tensorrt` (each probed in a child
    /// process), asking this process's current TensorRT first when there is any or `ask`.
    pub fn add_tensorrt_config(
        &mut self,
        cfg: &[crate::config::TensorrtRuntime],
        ask: bool,
    ) -> Result<(), String> {
        if cfg.is_empty() && !ask {
            return Ok(());
        }
        self.current_trt = current_tensorrt();
        for c in cfg {
            let t = probe_tensorrt(c.root(), c.shim())
                .map_err(|e| format!("[runtimes] tensorrt: {e}"))?;
            self.add_tensorrt(t)
                .map_err(|e| format!("[runtimes] tensorrt: {e}"))?;
        }
        Ok(())
    }

    /// Every incoming runtime: the ONNX Runtimes, then the TensorRTs, in the order added.
    pub fn all_incoming(&self) -> Vec<Incoming> {
        let mut all: Vec<Incoming> = self.incoming.iter().cloned().map(Incoming::Ort).collect();
        all.extend(self.trt_incoming.iter().cloned().map(Incoming::Trt));
        all
    }

    /// The incoming runtime a selection names by `id` ([`Incoming::id`]).
    pub fn incoming_by_id(&self, id: &str) -> Option<Incoming> {
        match id.strip_prefix(TRT_ID) {
            Some(v) => self
                .trt_incoming
                .iter()
                .find(|t| t.version.to_string() == v)
                .cloned()
                .map(Incoming::Trt),
            None => self.incoming_of(id).cloned().map(Incoming::Ort),
        }
    }

    /// The versions gc evicts last: the current and incoming ones, and `used` (library →
    /// version, those consumers asked for recently). TensorRT's only once the current one is
    /// known (else every artifact of the current one would go first).
    pub fn keep(&self, used: impl IntoIterator<Item = (String, String)>) -> RuntimeKeep {
        let mut ort: BTreeSet<String> = BTreeSet::new();
        let mut trt: BTreeSet<String> = BTreeSet::new();
        for (lib, v) in used {
            match lib.as_str() {
                "onnxruntime" => ort.insert(v),
                "tensorrt" => trt.insert(v),
                _ => false,
            };
        }
        ort.insert(self.current.version.clone());
        ort.extend(self.incoming.iter().map(|i| i.version.clone()));
        let mut keep = BTreeMap::from([("onnxruntime".to_string(), ort)]);
        if let Some(current) = &self.current_trt {
            trt.insert(current.clone());
            trt.extend(self.trt_incoming.iter().map(|t| t.version.to_string()));
            keep.insert("tensorrt".to_string(), trt);
        }
        RuntimeKeep(keep)
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
            Ok(records) => used.extend(records.iter().filter(|r| r.last_used >= since).flat_map(
                |r| {
                    let v = &r.parts.backend.versions;
                    ["onnxruntime", "tensorrt"]
                        .into_iter()
                        .filter_map(|lib| v.get(lib).map(|v| (lib.to_string(), v.clone())))
                },
            )),
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
            current_trt: None,
            trt_incoming: Vec::new(),
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
        assert_eq!(r.serving(None, Backend::OrtCpu), Ok(None));
        assert_eq!(
            r.serving(Some(&ClientRuntime::default()), Backend::OrtCpu),
            Ok(None)
        );
        assert_eq!(
            r.serving(Some(&ClientRuntime::onnxruntime("1.31.1")), Backend::OrtCpu),
            Ok(None)
        );
        assert_eq!(
            r.serving(Some(&ClientRuntime::onnxruntime("1.32.0")), Backend::OrtCpu),
            Ok(Some("1.32.0".into()))
        );
        let e = r
            .serving(Some(&ClientRuntime::onnxruntime("1.30.0")), Backend::OrtCpu)
            .unwrap_err();
        assert_eq!(
            e.to_string().split(';').next().unwrap(),
            "this daemon builds for onnxruntime 1.31.1 (and incoming 1.32.0), not for the consumer's 1.30.0"
        );
        let keep = r.keep([("onnxruntime".to_string(), "1.30.0".to_string())]);
        let v = |s: &str| BTreeMap::from([("onnxruntime".to_string(), s.to_string())]);
        assert!(keep.keeps(&v("1.30.0")) && keep.keeps(&v("1.32.0")));
        assert!(!keep.keeps(&v("1.29.0")));
    }

    fn trt(root: &str, v: (u32, u32, u32)) -> IncomingTrt {
        IncomingTrt {
            root: root.into(),
            shim: None,
            version: crate::trt::TrtVersion {
                major: v.0,
                minor: v.1,
                patch: v.2,
            },
        }
    }

    #[test]
    fn a_consumer_naming_a_tensorrt_gets_that_tensorrts_artifacts_for_the_backends_using_it() {
        let mut r = Runtimes::resolve(rt("1.31.1"), &[]).unwrap();
        let on = |o: Option<&str>, t: Option<&str>| ClientRuntime {
            onnxruntime: o.map(str::to_string),
            tensorrt: t.map(str::to_string),
        };
        // No TensorRT known: a consumer's tensorrt is ignored, as it always was.
        assert_eq!(
            r.serving(Some(&on(None, Some("10.9.0"))), Backend::Trt),
            Ok(None)
        );
        r.set_current_tensorrt(Some("10.16.1".into()));
        assert_eq!(
            r.add_tensorrt(trt("/opt/trt-10.16.1", (10, 16, 1))),
            Ok(false)
        );
        assert!(r.incoming_by_id("tensorrt 10.16.1").is_none());
        assert_eq!(r.add_tensorrt(trt("/opt/trt-10.17", (10, 17, 0))), Ok(true));
        assert_eq!(
            r.add_tensorrt(trt("/opt/trt-10.17", (10, 17, 0))),
            Ok(false)
        );
        let two = r.add_tensorrt(trt("/elsewhere", (10, 17, 0))).unwrap_err();
        assert!(two.contains("one root per version"), "{two}");
        r.add(rt("1.32.0")).unwrap();
        for b in [Backend::Trt, Backend::OrtTensorRt] {
            assert_eq!(r.serving(Some(&on(None, Some("10.16.1"))), b), Ok(None));
            assert_eq!(
                r.serving(Some(&on(None, Some("10.17.0"))), b),
                Ok(Some("tensorrt 10.17.0".into()))
            );
            let e = r.serving(Some(&on(None, Some("10.18.0"))), b).unwrap_err();
            assert!(
                e.0.starts_with("this daemon builds for tensorrt 10.16.1 (and incoming 10.17.0), not for the consumer's 10.18.0; add its install root to [runtimes] tensorrt"),
                "{e}"
            );
        }
        // Only the libraries a backend builds with count.
        assert_eq!(
            r.serving(Some(&on(Some("1.30.0"), Some("10.17.0"))), Backend::Trt),
            Ok(Some("tensorrt 10.17.0".into()))
        );
        assert_eq!(
            r.serving(Some(&on(Some("1.32.0"), Some("10.18.0"))), Backend::OrtCpu),
            Ok(Some("1.32.0".into()))
        );
        assert_eq!(
            r.serving(
                Some(&on(Some("1.31.1"), Some("10.17.0"))),
                Backend::OrtTensorRt
            ),
            Ok(Some("tensorrt 10.17.0".into()))
        );
        let both = r
            .serving(
                Some(&on(Some("1.32.0"), Some("10.17.0"))),
                Backend::OrtTensorRt,
            )
            .unwrap_err();
        assert!(both.0.contains("one incoming runtime at a time"), "{both}");
        // Selections name them by id.
        let ids: Vec<String> = r.all_incoming().iter().map(Incoming::id).collect();
        assert_eq!(ids, ["1.32.0", "tensorrt 10.17.0"]);
        assert!(
            matches!(r.incoming_by_id("tensorrt 10.17.0"), Some(Incoming::Trt(t)) if t.root == Path::new("/opt/trt-10.17"))
        );
        assert!(r.incoming_by_id("tensorrt 10.18.0").is_none());
        assert_eq!(describe("tensorrt 10.17.0"), "tensorrt 10.17.0");
        assert_eq!(describe("1.32.0"), "onnxruntime 1.32.0");
        // gc keeps the current, incoming and recently used TensorRTs' artifacts.
        let keep = r.keep([("tensorrt".to_string(), "10.9.0".to_string())]);
        let v = |t: &str| BTreeMap::from([("tensorrt".to_string(), t.to_string())]);
        assert!(keep.keeps(&v("10.16.1")) && keep.keeps(&v("10.17.0")) && keep.keeps(&v("10.9.0")));
        assert!(!keep.keeps(&v("10.8.0")));
        r.set_current_tensorrt(None);
        assert!(
            r.keep([]).keeps(&v("10.8.0")),
            "unknown current: TensorRT is not ordered"
        );
    }
}
