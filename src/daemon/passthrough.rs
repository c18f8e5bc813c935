//! `OrtPassthrough`: the FALLBACK engine the daemon runs with until the real build/cache stage
//! (`src/build/`, `src/cache/`) is wired in; the lead replaces it in `daemon::open_engine`.
//! It is honest but minimal: the key is SHA-256 over the model's bytes, every external-data
//! file, the sidecar and the selection; a "build" copies the model and its external data into
//! a content-addressed folder `CACHE/passthrough/artifacts/KEY/` (temp folder, fsync, rename)
//! and validates it by creating a real ONNX Runtime CPU session from the copy (a model ORT
//! cannot load fails). Only the `ort-cpu` backend exists here.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use trtcache_client::protocol::{ArtifactFile, ArtifactMeta, TensorInfo, Validation};

use super::engine::*;
use crate::key::{hex, CacheKey};
use crate::onnx::Model;

const FORMAT: &str = "trtcache-passthrough-v1";
const BACKEND: &str = "ort-cpu";
const COPY_CHUNK: usize = 1 << 20;

static ORT: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();

/// Loads ONNX Runtime once per process from `dylib` (later calls reuse the first result).
pub fn ort_environment(
    dylib: Option<&Path>,
) -> Result<&'static ort::environment::Environment, EngineError> {
    let r = ORT.get_or_init(|| {
        let Some(p) = dylib else {
            return Err("ONNX Runtime not found: set ORT_DYLIB_PATH or `ort_dylib` in the config to libonnxruntime.so".into());
        };
        if !p.is_file() {
            return Err(format!("ONNX Runtime library {} does not exist", p.display()));
        }
        ort::init_from(p)
            .map_err(|e| format!("loading ONNX Runtime from {}: {e}", p.display()))?
            .with_name("trtcache")
            .build()
            .map_err(|e| format!("creating the ONNX Runtime environment: {e}"))
    });
    r.as_ref().map_err(|e| EngineError::Runtime(e.clone()))
}

/// The fallback engine (see the module docs).
pub struct OrtPassthrough {
    artifacts: PathBuf,
    tmp: PathBuf,
    env: &'static ort::environment::Environment,
    _lock: File,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl OrtPassthrough {
    /// Opens (creating) the store under `cache_dir`, takes its lock (one daemon per cache),
    /// removes temp folders a crash left behind, and loads ONNX Runtime.
    pub fn open(cache_dir: &Path, ort_dylib: Option<&Path>) -> Result<Self, EngineError> {
        let root = cache_dir.join("passthrough");
        let artifacts = root.join("artifacts");
        let tmp = root.join("tmp");
        fs::create_dir_all(&artifacts).map_err(EngineError::io(&artifacts))?;
        let lock_path = root.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(EngineError::io(&lock_path))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&lock),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } != 0
        {
            return Err(EngineError::Runtime(format!(
                "cache {} is in use by another trtcache process (lock {})",
                cache_dir.display(),
                lock_path.display()
            )));
        }
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(EngineError::io(&tmp))?;
        }
        fs::create_dir_all(&tmp).map_err(EngineError::io(&tmp))?;
        let env = ort_environment(ort_dylib)?;
        Ok(OrtPassthrough {
            artifacts,
            tmp,
            env,
            _lock: lock,
        })
    }

    /// Where temporary build folders live (empty when no build runs).
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp
    }

    fn dir(&self, key: &CacheKey) -> PathBuf {
        self.artifacts.join(key.hex())
    }

    fn validate(&self, graph: &Path) -> Result<(Vec<TensorInfo>, Vec<TensorInfo>), EngineError> {
        let mut b = ort::session::Session::builder(self.env)
            .map_err(|e| EngineError::Runtime(e.to_string()))?
            .with_optimization_level(ort::session::builder::GraphOptimizationLevel::Disable)
            .map_err(|e| EngineError::Runtime(e.to_string()))?;
        let s = b.commit_from_file(graph).map_err(|e| {
            EngineError::Invalid(format!("ONNX Runtime cannot load the model: {e}"))
        })?;
        let info = |o: &ort::value::Outlet| {
            let (dtype, shape) = match o.dtype() {
                ort::value::ValueType::Tensor {
                    ty,
                    shape,
                    dimension_symbols,
                } => {
                    let dims = shape
                        .iter()
                        .enumerate()
                        .map(|(i, d)| match dimension_symbols.get(i) {
                            Some(sym) if *d < 0 && !sym.is_empty() => serde_json::json!(sym),
                            _ => serde_json::json!(d),
                        })
                        .collect();
                    (ty.to_string(), dims)
                }
                other => (other.to_string(), Vec::new()),
            };
            TensorInfo {
                name: o.name().to_string(),
                dtype,
                shape,
            }
        };
        Ok((
            s.inputs().iter().map(info).collect(),
            s.outputs().iter().map(info).collect(),
        ))
    }
}

/// SHA-256 (hex) and length of each input file; the key is derived from these, so a build
/// can check that what it copied is what was planned.
struct Digests {
    graph: (String, u64),
    external: Vec<(String, (String, u64))>,
    sidecar: Option<(String, u64)>,
}

impl Digests {
    fn key(&self, sel: &Selection) -> CacheKey {
        let mut h = Sha256::new();
        h.update(format!("{FORMAT}\n").as_bytes());
        let line =
            |h: &mut Sha256, (d, n): &(String, u64)| h.update(format!("{d} {n}\n").as_bytes());
        line(&mut h, &self.graph);
        for (loc, d) in &self.external {
            h.update(format!("external {loc}\n").as_bytes());
            line(&mut h, d);
        }
        if let Some(d) = &self.sidecar {
            h.update(b"sidecar\n");
            line(&mut h, d);
        }
        h.update(serde_json::to_vec(sel).unwrap_or_default());
        CacheKey(h.finalize().into())
    }
}

fn digest_bytes(b: &[u8]) -> (String, u64) {
    (hex(&Sha256::digest(b)), b.len() as u64)
}

fn digest_file(path: &Path) -> Result<(String, u64), EngineError> {
    let mut f = File::open(path).map_err(EngineError::io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut n_total = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(EngineError::io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        n_total += n as u64;
    }
    Ok((hex(&h.finalize()), n_total))
}

/// Reads the graph into memory (not mapped: a file rewritten in place under a map would
/// fault) and decodes it to find its external data.
fn read_model(path: &Path) -> Result<(bytes::Bytes, Model), EngineError> {
    let b = bytes::Bytes::from(fs::read(path).map_err(EngineError::io(path))?);
    let m = Model::from_bytes(path, b.clone()).map_err(|e| EngineError::Invalid(e.to_string()))?;
    Ok((b, m))
}

/// Copies `src` to `dst` (fsynced), hashing what it copies; observes `cancel`.
fn copy_synced(src: &Path, dst: &Path, cancel: &CancelToken) -> Result<(String, u64), EngineError> {
    let mut from = File::open(src).map_err(EngineError::io(src))?;
    if let Some(p) = dst.parent() {
        fs::create_dir_all(p).map_err(EngineError::io(p))?;
    }
    let mut to = File::create(dst).map_err(EngineError::io(dst))?;
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut h = Sha256::new();
    let mut total = 0u64;
    loop {
        if cancel.is_cancelled() {
            return Err(EngineError::Cancelled);
        }
        let n = from.read(&mut buf).map_err(EngineError::io(src))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        to.write_all(&buf[..n]).map_err(EngineError::io(dst))?;
        total += n as u64;
    }
    to.sync_all().map_err(EngineError::io(dst))?;
    Ok((hex(&h.finalize()), total))
}

fn write_synced(dst: &Path, data: &[u8]) -> Result<(), EngineError> {
    let mut f = File::create(dst).map_err(EngineError::io(dst))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(EngineError::io(dst))
}

fn sync_dir(dir: &Path) -> Result<(), EngineError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(EngineError::io(dir))
}

/// Removes a temp folder when dropped unless disarmed (so every error path cleans up).
struct TmpGuard(Option<PathBuf>);

impl Drop for TmpGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_dir_all(p);
        }
    }
}

impl Engine for OrtPassthrough {
    fn variants(&self, _model: &ModelEntry, backends: &[String]) -> Vec<Selection> {
        backends
            .iter()
            .map(|b| Selection {
                profile: None,
                backend: b.clone(),
                precision: Default::default(),
            })
            .collect()
    }

    fn plan(&self, model: &ModelEntry, sel: &Selection) -> Result<Planned, EngineError> {
        if sel.backend != BACKEND {
            return Err(EngineError::NotFound(format!(
                "backend `{}` is not available in the passthrough engine (only `{BACKEND}`)",
                sel.backend
            )));
        }
        if let Some(p) = sel.profile.as_deref().filter(|p| *p != "default") {
            return Err(EngineError::NotFound(format!(
                "profile `{p}` is not declared for `{}`",
                model.name
            )));
        }
        let (bytes, m) = read_model(&model.path)?;
        let mut digests = Digests {
            graph: digest_bytes(&bytes),
            external: Vec::new(),
            sidecar: model.sidecar.as_deref().map(digest_file).transpose()?,
        };
        for ext in &m.external_files {
            digests
                .external
                .push((ext.location.clone(), digest_file(&ext.path)?));
        }
        Ok(Planned {
            model: model.clone(),
            selection: sel.clone(),
            profile: "default".into(),
            key: digests.key(sel),
        })
    }

    fn lookup(&self, planned: &Planned) -> Result<Option<Artifact>, EngineError> {
        let dir = self.dir(&planned.key);
        let meta_path = dir.join("meta.json");
        let text = match fs::read(&meta_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(EngineError::io(&meta_path)(e)),
        };
        let Ok(mut metadata) = serde_json::from_slice::<ArtifactMeta>(&text) else {
            tracing::warn!(key = %planned.key, "unreadable artifact metadata; treating as missing");
            return Ok(None);
        };
        let mut paths = Vec::new();
        for f in &metadata.files {
            let p = dir.join(&f.name);
            match fs::metadata(&p) {
                Ok(m) if m.len() == f.bytes => paths.push(p),
                _ => {
                    tracing::warn!(key = %planned.key, file = %f.name, "artifact file missing or resized; treating as missing");
                    return Ok(None);
                }
            }
        }
        // A name is not part of the key: two models with identical bytes share an artifact.
        metadata.model = planned.model.name.clone();
        metadata.version = planned.model.version;
        Ok(Some(Artifact { metadata, paths }))
    }

    fn build(
        &self,
        planned: &Planned,
        cancel: &CancelToken,
        progress: &dyn Fn(BuildPhase),
    ) -> Result<Artifact, EngineError> {
        progress(BuildPhase::Building);
        let path = &planned.model.path;
        let bytes = bytes::Bytes::from(fs::read(path).map_err(EngineError::io(path))?);
        let changed = || {
            EngineError::Changed(format!(
                "`{}` changed while it was being built",
                planned.model.name
            ))
        };
        let m = match Model::from_bytes(path, bytes.clone()) {
            Ok(m) => m,
            // Undecodable: a broken model, or bytes read while the file was being rewritten.
            // Broken only if what was read is the file as it is now, and that is what was
            // planned.
            Err(e) => {
                let same_now = digest_file(path).ok() == Some(digest_bytes(&bytes));
                let as_planned = self
                    .plan(&planned.model, &planned.selection)
                    .is_ok_and(|p| p.key == planned.key);
                return Err(if same_now && as_planned {
                    EngineError::Invalid(e.to_string())
                } else {
                    changed()
                });
            }
        };
        let tmp = self.tmp.join(format!(
            "{}-{}-{}",
            planned.key.hex(),
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&tmp).map_err(EngineError::io(&tmp))?;
        let mut guard = TmpGuard(Some(tmp.clone()));
        let graph_name = "model.onnx";
        write_synced(&tmp.join(graph_name), &bytes)?;
        let mut digests = Digests {
            graph: digest_bytes(&bytes),
            external: Vec::new(),
            sidecar: planned
                .model
                .sidecar
                .as_deref()
                .map(digest_file)
                .transpose()?,
        };
        let mut files = vec![ArtifactFile {
            role: "graph".into(),
            name: graph_name.into(),
            bytes: bytes.len() as u64,
        }];
        for ext in &m.external_files {
            let d = copy_synced(&ext.path, &tmp.join(&ext.location), cancel)?;
            files.push(ArtifactFile {
                role: "external".into(),
                name: ext.location.clone(),
                bytes: d.1,
            });
            digests.external.push((ext.location.clone(), d));
        }
        drop(m);
        drop(bytes);
        // Content-addressed: what was copied must be what was planned (a file rewritten in
        // place during the build is caught here, not stored under the wrong key).
        if digests.key(&planned.selection) != planned.key {
            return Err(changed());
        }
        if cancel.is_cancelled() {
            return Err(EngineError::Cancelled);
        }
        progress(BuildPhase::Validating);
        let copy = tmp.join(graph_name);
        // Name the user's file in messages, not the temp copy (gone by the time anyone reads it).
        let (inputs, outputs) = self.validate(&copy).map_err(|e| match e {
            EngineError::Invalid(m) => EngineError::Invalid(m.replace(
                &copy.display().to_string(),
                &planned.model.path.display().to_string(),
            )),
            other => other,
        })?;
        if cancel.is_cancelled() {
            return Err(EngineError::Cancelled);
        }
        progress(BuildPhase::Storing);
        let metadata = ArtifactMeta {
            model: planned.model.name.clone(),
            version: planned.model.version,
            key: planned.key.hex(),
            backend: planned.selection.backend.clone(),
            profile: planned.profile.clone(),
            precision: "fp32".into(),
            inputs,
            outputs,
            providers: vec!["CPUExecutionProvider".into()],
            validation: Validation {
                passed: true,
                method: "passthrough copy; ONNX Runtime CPU session created from the copy".into(),
                max_abs_err: None,
                max_rel_err: None,
            },
            files,
            built_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let meta_path = tmp.join("meta.json");
        let mut f = File::create(&meta_path).map_err(EngineError::io(&meta_path))?;
        f.write_all(&serde_json::to_vec_pretty(&metadata).unwrap_or_default())
            .and_then(|()| f.sync_all())
            .map_err(EngineError::io(&meta_path))?;
        sync_dir(&tmp)?;
        let dir = self.dir(&planned.key);
        match fs::rename(&tmp, &dir) {
            Ok(()) => guard.0 = None,
            // Another build of the same key won the race: keep its copy.
            Err(_) if dir.join("meta.json").is_file() => {}
            Err(e) => return Err(EngineError::io(&dir)(e)),
        }
        sync_dir(&self.artifacts)?;
        drop(guard);
        self.lookup(planned)?
            .ok_or_else(|| EngineError::Invalid("stored artifact vanished after rename".into()))
    }

    fn evict(&self, key: &CacheKey) -> Result<bool, EngineError> {
        let dir = self.dir(key);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(EngineError::io(&dir)(e)),
        }
    }
}
