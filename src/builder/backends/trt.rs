//! The `trt` backend: a plain TensorRT engine built through the project's shim
//! ([`crate::trt`], `include/trtcache_trt.h`), for consumers that load engines (Triton's
//! `tensorrt_plan`, `trtexec --loadEngine`, `tensorrt.Runtime().deserialize_cuda_engine`).
//!
//! Enters: a model file and [`BuildOptions`] (precision, the profile as one optimization
//! profile, workspace, builder level, hardware-compatibility level, the shared timing
//! caches' folder). Leaves: an artifact of `engine.plan` (the serialized engine) and
//! `engine.json` ([`EngineMeta`]), or [`BuildError::Trt`]: on a host without TensorRT,
//! [`crate::trt::TrtError::Unavailable`] naming what is missing and how to install it.
//!
//! A build loads the shared timing cache for (this GPU, the loaded TensorRT), parses the
//! model from memory (external data relative to its folder), builds, and merges the build's
//! timing cache back (kept whatever validation says: the timings are right either way).
//! Validation runs the engine once through the shim on the inputs the reference accepted,
//! found and compared exactly as for every backend ([`super::validate`]); an engine over
//! tolerance is stored as failed and never served.
//!
//! **Never run against TensorRT**: tested here through the C test double of the header
//! (`shim/double/`), which proves the plumbing only (docs/trt.md).

use std::collections::BTreeMap;
use std::path::Path;

use ort::session::Session;
use ort::value::TensorElementType as T;

use super::backend::{BackendImpl, Runner};
use crate::builder::validate::values;
use crate::builder::validate::{Inputs, Outs};
use crate::builder::{BuildError, BuildOptions, Runtime, StagedArtifact};
use crate::spec::Backend;
use crate::trt::artifact::{self, EngineMeta, META_FILE, PLAN_FILE};
use crate::trt::timing::TimingCacheStore;
use crate::trt::{DType, Engine, HostTensor, LoaderConfig, Trt, TrtError};

/// The loaded shim (once per process; see [`Trt::shared`]), configured from the
/// environment (`TRTCACHE_TRT_SHIM`, `TENSORRT_ROOT`).
pub fn shim() -> Result<Trt, TrtError> {
    Trt::shared(&LoaderConfig::from_env())
}

/// TensorRT engines built through the shim.
#[derive(Debug, Clone, Copy)]
pub struct NativeTrt;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl BackendImpl for NativeTrt {
    fn backend(&self) -> Backend {
        Backend::Trt
    }

    fn key_options(&self, opts: &BuildOptions) -> BTreeMap<String, String> {
        let mut m = crate::trt::keys::key_options(&opts.engine_options());
        m.insert("device_id".into(), opts.device_id.to_string());
        m
    }

    fn check(&self, _rt: &Runtime) -> Result<(), BuildError> {
        shim().map(drop).map_err(BuildError::from)
    }

    fn build(
        &self,
        _rt: &Runtime,
        model: &Path,
        opts: &BuildOptions,
        out: &Path,
    ) -> Result<StagedArtifact, BuildError> {
        let trt = shim()?;
        let bytes = std::fs::read(model).map_err(io_err(model))?;
        // The exact GPU, whatever the hardware-compatibility level: timings are per GPU model.
        let gpu = crate::key::detect_sku(Backend::Trt, opts.device_id)?;
        let version = trt.version().to_string();
        let store = opts.timing_cache_dir.as_deref().map(TimingCacheStore::at);
        let mut eo = opts.engine_options();
        if let Some(s) = &store {
            eo.timing_cache = s.load(&gpu, &version)?;
        }
        // Parsed, built and timed on the GPU the key names (`--device`, TRTCACHE_DEVICE).
        let mut network = trt.parse(&bytes, model.parent(), opts.device_id)?;
        let io = network.io()?;
        unprofiled_inputs(&io.inputs, eo.profiles.first(), model)?;
        let built = match network.build(&eo) {
            // A shared timing cache TensorRT will not attach (another device property set, a
            // damaged file) would fail every build for this SKU: set it aside and build
            // without it; the new build's cache takes its place.
            Err(e) if e.is_timing_cache_refusal() && !eo.timing_cache.is_empty() => {
                let moved = match &store {
                    Some(s) => s.quarantine(&gpu, &version)?,
                    None => None,
                };
                tracing::warn!(
                    error = %e,
                    moved_to = ?moved,
                    "TensorRT refused the shared timing cache: set aside, building without it"
                );
                eo.timing_cache.clear();
                network.build(&eo)?
            }
            r => r?,
        };
        drop(network);
        if let Some(s) = &store {
            // A cache TensorRT cannot merge (another device or version) leaves the stored
            // one as it was; the engine is good either way.
            match s.merge_with(&trt, opts.device_id, &gpu, &built.timing_cache) {
                Ok(p) => tracing::debug!(timing_cache = %p.display(), "timing cache merged"),
                Err(e) => tracing::warn!(error = %e, "timing cache not merged"),
            }
        }
        let meta = EngineMeta {
            format: artifact::META_FORMAT,
            tensorrt_version: version,
            gpu: gpu.name.clone(),
            compute_capability: gpu.compute_capability.clone(),
            hardware_compatibility: eo.hardware_compatibility,
            precision: eo.precision,
            workspace_bytes: eo.workspace_bytes,
            builder_optimization_level: eo.builder_optimization_level,
            profiles: eo.profiles,
            inputs: io.inputs,
            outputs: io.outputs,
            plan_bytes: 0,
            plan_sha256: String::new(),
            cuda_driver: crate::device::gpu::driver_version(),
        };
        let meta = artifact::write_artifact(out, &built.plan, &meta)?;
        tracing::info!(plan_bytes = meta.plan_bytes, tensorrt = %meta.tensorrt_version, "trt engine built");
        Ok(StagedArtifact {
            dir: out.to_path_buf(),
            entry: PLAN_FILE.into(),
            files: vec![PLAN_FILE.into(), META_FILE.into()],
            rewrites: Vec::new(),
        })
    }

    fn open(
        &self,
        _rt: &Runtime,
        entry: &Path,
        _opts: &BuildOptions,
    ) -> Result<Session, BuildError> {
        Err(BuildError::Trt(TrtError::InvalidArgument(format!(
            "{} is a TensorRT engine, not an ONNX model: ONNX Runtime cannot open it (load it \
             with TensorRT's runtime)",
            entry.display()
        ))))
    }

    fn check_artifact(
        &self,
        _rt: &Runtime,
        art: &StagedArtifact,
        opts: &BuildOptions,
    ) -> Result<(), BuildError> {
        artifact::read_meta(&art.dir)?;
        let plan_path = artifact::plan_path(&art.dir);
        let plan = std::fs::read(&plan_path).map_err(io_err(&plan_path))?;
        shim()?.load_engine(&plan, opts.device_id)?;
        Ok(())
    }

    /// The engine, loaded through the shim, run on the validation inputs.
    fn runner(
        &self,
        _rt: &Runtime,
        _model: &Path,
        art: &StagedArtifact,
        opts: &BuildOptions,
    ) -> Result<Box<dyn Runner>, BuildError> {
        let trt = shim()?;
        // The metadata re-checks the plan's size and digest: what runs is what is stored.
        artifact::read_meta(&art.dir)?;
        let plan_path = artifact::plan_path(&art.dir);
        let plan = std::fs::read(&plan_path).map_err(io_err(&plan_path))?;
        let engine = trt.load_engine(&plan, opts.device_id)?;
        Ok(Box::new(EngineRunner(engine)))
    }
}

/// The file name ONNX Runtime's TensorRT provider reads and writes its timing cache under,
/// in the folder `trt_timing_cache_path` names (`TensorrtExecutionProvider_cache_sm90.timing`
/// on a compute capability 9.0 GPU).
fn ep_timing_file(cc: &str) -> String {
    format!(
        "TensorrtExecutionProvider_cache_sm{}.timing",
        cc.replace('.', "")
    )
}

/// The shared timing cache `ort-tensorrt` builds use: the store, this GPU and the TensorRT
/// version the provider runs with (asked of `libnvinfer` itself). `None` (the build times
/// from scratch, as before) when the store is not configured or either is unknown.
fn ep_shared_cache(opts: &BuildOptions) -> Option<(TimingCacheStore, crate::device::Sku, String)> {
    let store = TimingCacheStore::at(opts.timing_cache_dir.as_deref()?);
    let gpu = crate::key::detect_sku(Backend::OrtTensorRt, opts.device_id).ok()?;
    let version = crate::trt::loader::tensorrt_library_version(&LoaderConfig::from_env())
        .map_err(|e| tracing::debug!(error = %e, "no shared timing cache for ort-tensorrt"))
        .ok()?
        .to_string();
    Some((store, gpu, version))
}

/// Before an `ort-tensorrt` build: copies the shared timing cache for (this GPU, this
/// TensorRT) into `dir`, the folder the provider's `trt_timing_cache_path` names.
pub(crate) fn seed_ep_timing_cache(opts: &BuildOptions, dir: &Path) {
    if let Some((store, gpu, version)) = ep_shared_cache(opts) {
        seed_into(&store, &gpu, &version, dir);
    }
}

fn seed_into(store: &TimingCacheStore, gpu: &crate::device::Sku, version: &str, dir: &Path) {
    let cc = gpu.compute_capability.clone().unwrap_or_default();
    match store.load(gpu, version) {
        Ok(b) if !b.is_empty() => {
            let p = dir.join(ep_timing_file(&cc));
            if let Err(e) = std::fs::write(&p, b) {
                tracing::warn!(path = %p.display(), error = %e, "timing cache not seeded");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "shared timing cache not read"),
    }
}

/// After an `ort-tensorrt` build: merges the provider's timing cache from `dir` back into
/// the shared one, with TensorRT's `combine` when the shim is there, else by taking the
/// provider's file (it started from the shared cache, so it holds its entries too; a build
/// that finished in between may then lose its new entries, never the file). Never fails
/// the build.
pub(crate) fn merge_ep_timing_cache(opts: &BuildOptions, dir: &Path) {
    if let Some((store, gpu, version)) = ep_shared_cache(opts) {
        let trt = shim().ok();
        merge_from(
            &store,
            &gpu,
            &version,
            dir,
            trt.as_ref().map(|t| (t, opts.device_id)),
        );
    }
}

fn merge_from(
    store: &TimingCacheStore,
    gpu: &crate::device::Sku,
    version: &str,
    dir: &Path,
    trt: Option<(&Trt, i32)>,
) {
    let cc = gpu.compute_capability.clone().unwrap_or_default();
    let produced = match std::fs::read(dir.join(ep_timing_file(&cc))) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(error = %e, "the TensorRT provider wrote no timing cache");
            return;
        }
    };
    let merged = match trt {
        Some((trt, device)) => store.merge_with(trt, device, gpu, &produced),
        None => store.merge_and_store(gpu, version, &produced, |_, ep| Ok(ep.to_vec())),
    };
    if let Err(e) = merged {
        tracing::warn!(error = %e, "timing cache not merged");
    }
}

/// TensorRT builds a network with dynamic inputs only over an optimization profile that
/// gives each of them min/opt/max shapes: an input left out is refused here, naming it and
/// the flags that give it, before TensorRT's builder says the same less plainly.
fn unprofiled_inputs(
    inputs: &[crate::trt::TensorInfo],
    profile: Option<&crate::spec::ShapeProfile>,
    model: &Path,
) -> Result<(), BuildError> {
    let missing: Vec<String> = inputs
        .iter()
        .filter(|t| t.shape.iter().any(|&d| d < 0))
        .filter(|t| profile.is_none_or(|p| !p.min.contains_key(&t.name)))
        .map(|t| {
            let dims: Vec<String> = t
                .shape
                .iter()
                .map(|&d| if d < 0 { "N".into() } else { d.to_string() })
                .collect();
            format!("{}:{}", t.name, dims.join("x"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(BuildError::Model {
        path: model.to_path_buf(),
        message: format!(
            "the trt backend needs a shape profile for every dynamic input, and {} has none: \
             give --min-shapes/--opt-shapes/--max-shapes (e.g. `--opt-shapes {}` with sizes \
             for N) or [profiles] in the model's sidecar",
            missing.join(", "),
            missing.join(",")
        ),
    })
}

/// ONNX Runtime's element type for a TensorRT one (`None`: validation cannot read it).
fn ort_type(t: DType) -> Option<T> {
    Some(match t {
        DType::Float32 => T::Float32,
        DType::Float16 => T::Float16,
        DType::Bfloat16 => T::Bfloat16,
        DType::Int8 => T::Int8,
        DType::Int32 => T::Int32,
        DType::Int64 => T::Int64,
        DType::Uint8 => T::Uint8,
        DType::Bool => T::Bool,
        DType::Fp8 => T::Float8E4M3FN,
        DType::Int4 | DType::Fp4 | DType::Other => return None,
    })
}

/// TensorRT's element type for an ONNX Runtime one (`None`: TensorRT has no such I/O type).
fn trt_type(t: T) -> Option<DType> {
    Some(match t {
        T::Float32 => DType::Float32,
        T::Float16 => DType::Float16,
        T::Bfloat16 => DType::Bfloat16,
        T::Int8 => DType::Int8,
        T::Int32 => DType::Int32,
        T::Int64 => DType::Int64,
        T::Uint8 => DType::Uint8,
        T::Bool => DType::Bool,
        T::Float8E4M3FN => DType::Fp8,
        _ => return None,
    })
}

/// The engine as the validation's [`Runner`].
struct EngineRunner(Engine);

impl Runner for EngineRunner {
    fn run(&mut self, inputs: &Inputs) -> Result<Outs, BuildError> {
        run_engine(&mut self.0, inputs)
    }
}

/// Runs the engine once (profile 0) on the validation inputs and reads every output back.
fn run_engine(engine: &mut Engine, inputs: &Inputs) -> Result<Outs, BuildError> {
    let bad = |what: String| BuildError::Trt(TrtError::InvalidArgument(what));
    let mut host = Vec::with_capacity(inputs.len());
    for (name, v) in inputs {
        let (ty, shape, data) =
            values::tensor_bytes(v).map_err(|w| bad(format!("input `{name}`: {w}")))?;
        let dtype = trt_type(ty).ok_or_else(|| {
            bad(format!(
                "input `{name}` has element type {ty}, which a TensorRT engine cannot take"
            ))
        })?;
        host.push(HostTensor {
            name: name.clone(),
            dtype,
            shape,
            data,
        });
    }
    let got = engine.run(0, &host)?;
    got.into_iter()
        .map(|t| {
            let ty = ort_type(t.dtype).ok_or_else(|| {
                bad(format!(
                    "output `{}` has type {:?}, which validation cannot read",
                    t.name, t.dtype
                ))
            })?;
            let out = values::out_of_bytes(ty, t.shape, &t.data)
                .map_err(|w| bad(format!("output `{}`: {w}", t.name)))?;
            Ok((t.name, out))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_types_map_both_ways() {
        for d in [
            DType::Float32,
            DType::Float16,
            DType::Bfloat16,
            DType::Int8,
            DType::Int32,
            DType::Int64,
            DType::Uint8,
            DType::Bool,
            DType::Fp8,
        ] {
            assert_eq!(trt_type(ort_type(d).unwrap()), Some(d));
        }
        assert_eq!(ort_type(DType::Int4), None);
        assert_eq!(trt_type(T::String), None);
    }

    #[test]
    fn ort_tensorrt_builds_start_from_and_return_to_the_shared_timing_cache() {
        let d = tempfile::tempdir().unwrap();
        let store = TimingCacheStore::at(&d.path().join("timing"));
        let gpu = crate::device::Sku {
            kind: "gpu".into(),
            name: "NVIDIA H200".into(),
            compute_capability: Some("9.0".into()),
            sm_count: Some(132),
            isa: vec![],
        };
        let ep = d.path().join("ep");
        std::fs::create_dir(&ep).unwrap();
        let file = ep.join("TensorrtExecutionProvider_cache_sm90.timing");
        // Nothing shared yet: nothing seeded; the provider's file becomes the shared one.
        seed_into(&store, &gpu, "10.16.1", &ep);
        assert!(!file.exists());
        std::fs::write(&file, b"first build").unwrap();
        merge_from(&store, &gpu, "10.16.1", &ep, None);
        assert_eq!(store.load(&gpu, "10.16.1").unwrap(), b"first build");
        // The next build (another staging folder) starts from it.
        let ep2 = d.path().join("ep2");
        std::fs::create_dir(&ep2).unwrap();
        seed_into(&store, &gpu, "10.16.1", &ep2);
        assert_eq!(
            std::fs::read(ep2.join("TensorrtExecutionProvider_cache_sm90.timing")).unwrap(),
            b"first build"
        );
        // Another TensorRT version has its own.
        assert!(store.load(&gpu, "10.17.0").unwrap().is_empty());
    }
}
