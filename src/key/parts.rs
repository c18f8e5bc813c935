//! Assembling [`KeyParts`]: the model digest (with the memo), opsets, the canonical profile,
//! the SKU a backend builds for, and the backend's identity with its library versions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::digest::{default_threads, plain_sha256, tree_digests_of, Input};
use super::memo::{now_ns, DigestMemo, FileId};
use super::{hex, BackendId, ExternalDigest, KeyError, KeyParts, ModelDigest, KEY_FORMAT};
use crate::device::{DeviceReport, Sku};
use crate::onnx::Model;
use crate::spec::{Backend, Precision, ShapeProfile, HALF_RULE};

/// How to digest a model.
#[derive(Clone, Debug)]
pub struct DigestOptions {
    /// Hashing threads (default: available parallelism).
    pub threads: usize,
    /// The digest memo file (e.g. `CACHE_DIR/digests.json`); `None` hashes every time.
    pub memo: Option<PathBuf>,
}

impl Default for DigestOptions {
    fn default() -> Self {
        Self {
            threads: default_threads(),
            memo: None,
        }
    }
}

/// What digesting cost.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DigestReport {
    /// Graph file plus external-data files.
    pub files: usize,
    /// Files whose digest came from the memo.
    pub memo_hits: usize,
    /// Bytes actually hashed.
    pub hashed_bytes: u64,
    pub threads: usize,
    pub seconds: f64,
    pub memo: Option<PathBuf>,
    /// The memo could not be written (the digest is still right).
    pub memo_error: Option<String>,
}

/// The model's content digest (tree scheme, see [`super::digest`]), hashing on every core,
/// without a memo.
pub fn model_digest(model: &Model) -> Result<ModelDigest, KeyError> {
    model_digest_with(model, &DigestOptions::default()).map(|(d, _)| d)
}

struct FileSlot<'a> {
    path: &'a Path,
    location: Option<&'a str>,
    /// `None` when the memo must not be used for this file.
    id: Option<FileId>,
    bytes: u64,
    digest: Option<String>,
}

/// [`model_digest`] with options: files whose identity is in the memo are not read.
pub fn model_digest_with(
    model: &Model,
    opts: &DigestOptions,
) -> Result<(ModelDigest, DigestReport), KeyError> {
    let t0 = Instant::now();
    let started = now_ns();
    let mut memo = opts.memo.as_deref().map(DigestMemo::open);
    let mut slots = vec![FileSlot {
        path: &model.path,
        location: None,
        // The graph bytes hashed are the mapped ones the model was decoded from. A model
        // built from bytes (no such file), or a file that no longer has their size (replaced
        // since loading), bypasses the memo.
        id: FileId::of(&model.path)
            .ok()
            .filter(|id| id.size == model.bytes.len() as u64),
        bytes: model.bytes.len() as u64,
        digest: None,
    }];
    for f in &model.external_files {
        slots.push(FileSlot {
            path: &f.path,
            location: Some(&f.location),
            id: Some(FileId::of(&f.path)?),
            bytes: 0,
            digest: None,
        });
    }
    let mut report = DigestReport {
        files: slots.len(),
        threads: opts.threads.max(1),
        memo: opts.memo.clone(),
        ..Default::default()
    };
    if let Some(m) = memo.as_mut() {
        for s in slots.iter_mut() {
            s.digest = s.id.as_ref().and_then(|id| m.lookup(id));
            report.memo_hits += s.digest.is_some() as usize;
        }
    }
    // What to hash for each file not found in the memo.
    enum Source {
        Graph,
        Empty,
        File(usize, u64),
    }
    let mut open_files = Vec::new();
    let mut todo = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        if s.digest.is_some() {
            continue;
        }
        if i == 0 {
            todo.push((i, Source::Graph));
            continue;
        }
        let io = |source| KeyError::Io {
            path: s.path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(s.path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        if size == 0 {
            todo.push((i, Source::Empty));
            continue;
        }
        // Read, not mapped: the daemon hashes files in a watched repository, and a file
        // truncated in place while mapped would kill it with SIGBUS.
        open_files.push(file);
        todo.push((i, Source::File(open_files.len() - 1, size)));
    }
    let inputs: Vec<Input> = todo
        .iter()
        .map(|(_, src)| match src {
            Source::Graph => Input::Bytes(&model.bytes[..]),
            Source::Empty => Input::Bytes(&[][..]),
            Source::File(j, size) => Input::File(&open_files[*j], *size),
        })
        .collect();
    report.hashed_bytes = inputs.iter().map(|s| s.len()).sum();
    let digests = tree_digests_of(&inputs, report.threads).map_err(|source| {
        // Which file failed is not reported by the hasher; name the model.
        KeyError::Io {
            path: model.path.clone(),
            source,
        }
    })?;
    for ((i, _), d) in todo.iter().zip(digests) {
        let s = &mut slots[*i];
        let h = hex(&d);
        if let Some(m) = memo.as_mut() {
            if let Some(id) = s.id {
                if FileId::of(s.path).is_ok_and(|now| now == id) {
                    m.insert(id, h.clone(), started);
                }
            }
        }
        s.digest = Some(h);
    }
    if let Some(m) = memo.as_mut() {
        if let Err(e) = m.save() {
            tracing::warn!(error = %e, "digest memo not saved");
            report.memo_error = Some(e.to_string());
        }
    }
    let mut external = Vec::new();
    for s in &slots[1..] {
        external.push(ExternalDigest {
            location: s.location.unwrap_or_default().to_string(),
            sha256: s.digest.clone().unwrap_or_default(),
            bytes: s.id.map_or(s.bytes, |id| id.size),
        });
    }
    report.seconds = t0.elapsed().as_secs_f64();
    Ok((
        ModelDigest {
            sha256: slots[0].digest.clone().unwrap_or_default(),
            bytes: model.bytes.len() as u64,
            external,
        },
        report,
    ))
}

/// Plain SHA-256 of the graph file and each external-data file (what `sha256sum` prints),
/// for display; keys use the tree digest.
pub fn plain_model_digest(model: &Model, threads: usize) -> Result<ModelDigest, KeyError> {
    let mut maps = Vec::new();
    for f in &model.external_files {
        let io = |source| KeyError::Io {
            path: f.path.clone(),
            source,
        };
        let file = std::fs::File::open(&f.path).map_err(io)?;
        maps.push(if file.metadata().map_err(io)?.len() == 0 {
            None
        } else {
            // SAFETY: as in model_digest_with.
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        });
    }
    let mut slices: Vec<&[u8]> = vec![&model.bytes[..]];
    slices.extend(maps.iter().map(|m| m.as_deref().unwrap_or(&[])));
    let d = plain_sha256(&slices, threads);
    Ok(ModelDigest {
        sha256: hex(&d[0]),
        bytes: model.bytes.len() as u64,
        external: model
            .external_files
            .iter()
            .zip(&d[1..])
            .map(|(f, h)| ExternalDigest {
                location: f.location.clone(),
                sha256: hex(h),
                bytes: f.size,
            })
            .collect(),
    })
}

/// Opset imports by domain (`ai.onnx` written as `""`), the highest version per domain.
pub fn opsets_of(model: &Model) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for o in &model.proto.opset_import {
        let d = if o.domain == "ai.onnx" { "" } else { &o.domain };
        let v = out.entry(d.to_string()).or_insert(o.version);
        *v = (*v).max(o.version);
    }
    out
}

/// The parts of a key. The profile's name is cleared: it is a label, and two names for the
/// same shapes build the same artifact. A model with float16/bfloat16 outputs gets the
/// option `validation` = [`HALF_RULE`] (and one with float outputs of dynamically quantized
/// activations [`crate::spec::DYNAMIC_INT8_RULE`], joined by `+` when it has both): the rule that accepts its artifacts is not the one
/// older keys were validated under (a remembered failure under the old rule is not this
/// key's). Other models' keys are unchanged: their rule is.
pub fn key_parts(
    model: &Model,
    digest: ModelDigest,
    profile: Option<&ShapeProfile>,
    sku: Sku,
    backend: BackendId,
    precision: Precision,
    mut options: BTreeMap<String, String>,
) -> KeyParts {
    let resolutions = crate::onnx::resolution::output_resolutions(model.graph());
    let rules: Vec<&str> = [
        (
            resolutions.values().any(|r| crate::spec::is_half(r)),
            HALF_RULE,
        ),
        (
            resolutions.values().any(|r| r == crate::spec::DYNAMIC_INT8),
            crate::spec::DYNAMIC_INT8_RULE,
        ),
    ]
    .into_iter()
    .filter_map(|(has, rule)| has.then_some(rule))
    .collect();
    if !rules.is_empty() {
        // `half-ulps-v1` alone as before; a model with both rules names both.
        options.insert("validation".into(), rules.join("+"));
    }
    KeyParts {
        format: KEY_FORMAT,
        model: digest,
        opsets: opsets_of(model),
        profile: profile.map(|p| ShapeProfile {
            name: String::new(),
            ..p.clone()
        }),
        sku,
        backend,
        precision,
        options,
    }
}

/// The versions of the libraries `backend` builds with: `onnxruntime` for the ONNX Runtime
/// backends (the version of the runtime that builds, or would build: the loaded one in the
/// build stage, the one the loader would load for `trtcache key`), `cuda` for the GPU ones
/// (the CUDA major ONNX Runtime's GPU build was made for, from its
/// `build_and_package_info.py`: a cu12 and a cu13 wheel of one version are different
/// runtimes), and `tensorrt`. The CUDA driver is not a key part: engines depend on the
/// TensorRT version and the GPU, not the driver (it is kept in the artifact's metadata), so
/// a driver update rebuilds nothing:
/// - `trt`: `getInferLibVersion()` of the TensorRT the shim loaded, and the shim's C API
///   version; without TensorRT or the shim, [`KeyError::Library`] says what is missing;
/// - `ort-tensorrt`: `getInferLibVersion()` of the `libnvinfer.so.10` the dynamic loader
///   opens (`TENSORRT_ROOT/lib` first), the library the TensorRT provider runs with; when it
///   cannot be opened, the version in the name of the first `libnvinfer.so.X.Y.Z` on the
///   library path (`libs::tensorrt`), as before, and none when there is none either.
///
/// `tensorrt`: the version of an incoming TensorRT that this process did not load (asked in
/// a child process, `crate::trt::incoming`), recorded for `trt` and `ort-tensorrt` instead
/// of the loaded one's, with the shim C API version this binary speaks (the probe's loader
/// refused any other).
pub fn backend_id(
    backend: Backend,
    onnxruntime: &str,
    tensorrt: Option<crate::trt::TrtVersion>,
) -> Result<BackendId, KeyError> {
    let mut versions = BTreeMap::new();
    if backend.is_onnx() {
        versions.insert("onnxruntime".to_string(), onnxruntime.to_string());
    }
    if backend.is_gpu() && backend.is_onnx() {
        if let Some(major) = crate::libs::onnxruntime::cuda_major_of_loader_choice() {
            versions.insert("cuda".to_string(), major);
        }
    }
    if let Some(v) = tensorrt.filter(|_| backend.uses_tensorrt()) {
        if backend == Backend::Trt {
            versions.extend(crate::trt::keys::versions_for(v));
        } else {
            versions.insert("tensorrt".to_string(), v.to_string());
        }
    } else if backend == Backend::Trt {
        let trt = crate::trt::Trt::shared(&crate::trt::LoaderConfig::from_env()).map_err(|e| {
            KeyError::Library {
                backend,
                why: e.to_string(),
            }
        })?;
        versions.extend(crate::trt::keys::backend_versions(&trt));
    } else if backend.uses_tensorrt() {
        match crate::trt::loader::tensorrt_library_version(&crate::trt::LoaderConfig::from_env()) {
            Ok(v) => {
                versions.insert("tensorrt".to_string(), v.to_string());
            }
            Err(e) => {
                tracing::debug!(error = %e, "TensorRT not loadable; its version comes from a file name");
                if let Some(t) = crate::libs::tensorrt() {
                    versions.insert("tensorrt".to_string(), t.version);
                }
            }
        }
    }
    Ok(BackendId {
        name: backend,
        versions,
    })
}

/// The SKU the `trt` key records for `gpu` under the options' hardware-compatibility level
/// (`trt.hardware_compatibility`): the exact GPU without one, the class of GPUs the engine
/// runs on with one. Other backends record the GPU as it is.
fn key_sku(
    backend: Backend,
    gpu: Sku,
    options: &BTreeMap<String, String>,
) -> Result<Sku, KeyError> {
    if backend != Backend::Trt {
        return Ok(gpu);
    }
    let hw = match options.get("trt.hardware_compatibility") {
        None => crate::trt::HwCompat::None,
        Some(l) => crate::trt::HwCompat::parse(l).map_err(|e| KeyError::Library {
            backend,
            why: e.to_string(),
        })?,
    };
    Ok(crate::trt::keys::key_sku(&gpu, hw))
}

/// The SKU `backend` builds for, detecting only what it needs: `ort-cpu` reads cpuinfo and
/// never initialises the CUDA driver (cuInit can take a second on a GPU host).
pub fn detect_sku(backend: Backend, device: i32) -> Result<Sku, KeyError> {
    if !backend.is_gpu() {
        return Ok(crate::device::cpu_info().sku());
    }
    let ordinal = usize::try_from(device).map_err(|_| device.to_string());
    sku_for_backend(&crate::device::detect_with(ordinal), backend)
}

/// The SKU `backend` builds for: the CPU's for `ort-cpu` (even on a GPU host), the selected
/// GPU's otherwise (an error naming why there is none).
pub fn sku_for_backend(report: &DeviceReport, backend: Backend) -> Result<Sku, KeyError> {
    if !backend.is_gpu() {
        return Ok(report.cpu_sku());
    }
    report
        .gpu_sku()
        .map_err(|why| KeyError::NoGpu { backend, why })
}

/// What a key is made of besides the model: the plan's profile and precision, the backend,
/// the GPU it builds on (GPU backends; `BuildOptions::device_id`) and the backend's key
/// options (`BuildOptions::key_options`).
#[derive(Clone, Debug)]
pub struct KeyInput<'a> {
    pub profile: Option<&'a ShapeProfile>,
    pub precision: Precision,
    pub backend: Backend,
    pub device: i32,
    pub options: BTreeMap<String, String>,
    /// An incoming TensorRT's version to key with instead of the loaded one's
    /// ([`backend_id`]); `None`: the one this process loads.
    pub tensorrt: Option<crate::trt::TrtVersion>,
}

/// The one assembler of [`KeyParts`], for `trtcache key`, `trtcache build` and the daemon:
/// digests the model (memo per `digest`), detects the SKU for the backend, records the library
/// versions (`onnxruntime`: see [`backend_id`]) and assembles the parts.
pub fn key_for(
    model: &Model,
    input: KeyInput<'_>,
    onnxruntime: &str,
    digest: &DigestOptions,
) -> Result<(KeyParts, DigestReport), KeyError> {
    let sku = key_sku(
        input.backend,
        detect_sku(input.backend, input.device)?,
        &input.options,
    )?;
    let backend = backend_id(input.backend, onnxruntime, input.tensorrt)?;
    let (d, report) = model_digest_with(model, digest)?;
    Ok((
        key_parts(
            model,
            d,
            input.profile,
            sku,
            backend,
            input.precision,
            input.options,
        ),
        report,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{models, write};
    use prost::Message;

    #[test]
    fn model_from_bytes_digests_like_the_file_and_skips_the_memo() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.onnx");
        let proto = models::tiny_encoder(false);
        write(&proto, &p).unwrap();
        let from_file = model_digest(&Model::load(&p).unwrap()).unwrap();
        let mem =
            Model::from_bytes(d.path().join("absent.onnx"), proto.encode_to_vec().into()).unwrap();
        let opts = DigestOptions {
            threads: 2,
            memo: Some(d.path().join("digests.json")),
        };
        let (from_mem, report) = model_digest_with(&mem, &opts).unwrap();
        assert_eq!(from_mem, from_file);
        assert_eq!(report.memo_hits, 0);
        assert!(!d.path().join("digests.json").exists());
    }

    #[test]
    fn an_incoming_tensorrts_version_is_keyed_without_loading_it() {
        let v = crate::trt::TrtVersion::from_raw(101700);
        let trt = backend_id(Backend::Trt, "1.31.1", Some(v)).unwrap();
        assert_eq!(trt.versions, crate::trt::keys::versions_for(v));
        assert_eq!(trt.versions["tensorrt"], "10.17.0");
        let ort = backend_id(Backend::OrtTensorRt, "1.31.1", Some(v)).unwrap();
        assert_eq!(ort.versions["tensorrt"], "10.17.0");
        assert_eq!(ort.versions["onnxruntime"], "1.31.1");
        // A backend that does not build with TensorRT keys none.
        let cpu = backend_id(Backend::OrtCpu, "1.31.1", Some(v)).unwrap();
        assert!(!cpu.versions.contains_key("tensorrt"));
    }

    #[test]
    fn only_models_with_half_outputs_key_the_half_rule() {
        let parts = |proto: crate::onnx::proto::ModelProto| {
            let m = Model::from_bytes("m.onnx", proto.encode_to_vec().into()).unwrap();
            let digest = model_digest(&m).unwrap();
            key_parts(
                &m,
                digest,
                None,
                Sku::default(),
                BackendId {
                    name: Backend::OrtCpu,
                    versions: BTreeMap::new(),
                },
                Precision::Fp32,
                BTreeMap::new(),
            )
        };
        let half = parts(models::half_layer_norm(true, None));
        assert_eq!(
            half.options.get("validation").map(String::as_str),
            Some(HALF_RULE)
        );
        assert!(!parts(models::tiny_encoder(false))
            .options
            .contains_key("validation"));
    }

    #[test]
    fn parts_clear_the_profile_name_and_normalise_opsets() {
        let mut proto = models::custom_domain();
        proto
            .opset_import
            .push(crate::onnx::proto::OperatorSetIdProto {
                domain: "ai.onnx".into(),
                version: 18,
            });
        let m = Model::from_bytes("m.onnx", proto.encode_to_vec().into()).unwrap();
        let ops = opsets_of(&m);
        assert_eq!(ops.get(""), Some(&18));
        assert_eq!(ops.get("com.example"), Some(&1));
        let digest = model_digest(&m).unwrap();
        let prof = |name: &str| ShapeProfile {
            name: name.into(),
            opt: [("x".to_string(), vec![2, 8])].into(),
            ..Default::default()
        };
        let parts = |p: &ShapeProfile| {
            key_parts(
                &m,
                digest.clone(),
                Some(p),
                Sku::default(),
                BackendId {
                    name: Backend::OrtCpu,
                    versions: BTreeMap::new(),
                },
                Precision::Fp32,
                BTreeMap::new(),
            )
        };
        assert_eq!(parts(&prof("a")).key(), parts(&prof("b")).key());
        assert_eq!(parts(&prof("a")).profile.unwrap().name, "");
        let mut other = prof("a");
        other.opt.insert("x".into(), vec![4, 8]);
        assert_ne!(parts(&prof("a")).key(), parts(&other).key());
    }
}
