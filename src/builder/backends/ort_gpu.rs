//! The GPU backends over ONNX Runtime's execution providers: `ort-cuda` (an offline-optimized
//! model served on the CUDA provider) and `ort-tensorrt` (an EP-context model with the
//! TensorRT engine embedded, built with an engine cache in the build's staging directory, the
//! timing cache shared per (GPU, TensorRT version) with the `trt` backend (`build::trt`), the
//! shape profile, fp16 and the builder optimization level).
//!
//! Enters: a model file and [`BuildOptions`]. Leaves: the artifact files, or
//! [`BuildError::ProviderMissing`] naming the provider and how to install it. Providers are
//! registered with `error_on_failure`: ort's default silently falls back to CPU.
//!
//! Not run on a GPU in this repository's CI (no GPU, CUDA or TensorRT there); written for a
//! host with `onnxruntime-gpu` (CUDA 12/13 build) and TensorRT 10.

use std::collections::BTreeMap;
use std::path::Path;

use ort::ep::{ExecutionProvider, ExecutionProviderDispatch};
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::Session;

use super::backend::{BackendImpl, Failure, Retry};
use super::levels;
use super::ort_cpu::save::{optimized_artifact, DATA, ENTRY};
use crate::builder::job::BuildJob;
use crate::builder::{BuildError, BuildOptions, OptLevel, Runtime, StagedArtifact};
use crate::spec::{Backend, Precision, ShapeProfile};

const CUDA_FIX: &str = "install onnxruntime-gpu (`pip install onnxruntime-gpu`) with the CUDA and cuDNN libraries it needs, then point ORT_DYLIB_PATH or `ort_library` at its capi/libonnxruntime.so.*";
const TRT_FIX: &str = "install onnxruntime-gpu and TensorRT 10 (libnvinfer.so.10, libnvonnxparser.so.10) plus the CUDA libraries it was built for, then point ORT_DYLIB_PATH or `ort_library` at its capi/libonnxruntime.so.*";

/// File name of the TensorRT EP-context model inside the artifact.
pub const CTX_ENTRY: &str = "model_ctx.onnx";

fn require(
    provider: &'static str,
    available: ort::Result<bool>,
    rt: &Runtime,
    fix: &'static str,
) -> Result<(), BuildError> {
    match available {
        Ok(true) => Ok(()),
        Ok(false) => Err(BuildError::ProviderMissing {
            provider,
            message: format!(
                "{provider} execution provider is not enabled in this build (ONNX Runtime {} at {})",
                rt.version,
                rt.path.display()
            ),
            fix,
        }),
        Err(e) => Err(BuildError::ProviderMissing {
            provider,
            message: e.to_string(),
            fix,
        }),
    }
}

fn register(
    provider: &'static str,
    b: SessionBuilder,
    eps: Vec<ExecutionProviderDispatch>,
    model: &Path,
    fix: &'static str,
) -> Result<SessionBuilder, BuildError> {
    b.with_execution_providers(eps)
        .map_err(|e| BuildError::ProviderMissing {
            provider,
            message: format!("{}: {e}", model.display()),
            fix,
        })
}

fn cuda_ep(opts: &BuildOptions) -> ExecutionProviderDispatch {
    ort::ep::CUDA::default()
        .with_device_id(opts.device_id)
        .with_tf32(opts.cuda_tf32())
        .build()
        .error_on_failure()
}

/// `name:1x3x224x224,other:1x16` in trtexec / TensorRT EP syntax.
pub fn shapes_arg(shapes: &std::collections::BTreeMap<String, Vec<i64>>) -> String {
    shapes
        .iter()
        .map(|(name, dims)| {
            let d: Vec<String> = dims.iter().map(|v| v.to_string()).collect();
            format!("{name}:{}", d.join("x"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn trt_ep(
    opts: &BuildOptions,
    profile: Option<&ShapeProfile>,
    caches: Option<&Path>,
    ctx_out: Option<&Path>,
) -> ExecutionProviderDispatch {
    let mut ep = ort::ep::TensorRT::default()
        .with_device_id(opts.device_id)
        .with_fp16(opts.precision == Precision::Fp16)
        .with_builder_optimization_level(opts.trt_builder_level);
    if let Some(dir) = caches {
        let d = dir.display().to_string();
        ep = ep
            .with_engine_cache(true)
            .with_engine_cache_path(&d)
            .with_timing_cache(true)
            .with_timing_cache_path(&d);
    }
    if let Some(p) = profile.filter(|p| !p.opt.is_empty()) {
        ep = ep
            .with_profile_min_shapes(shapes_arg(&p.min))
            .with_profile_opt_shapes(shapes_arg(&p.opt))
            .with_profile_max_shapes(shapes_arg(&p.max));
    }
    if let Some(ctx) = ctx_out {
        ep = ep
            .with_dump_ep_context_model(true)
            .with_ep_context_file_path(ctx.display().to_string())
            .with_ep_context_embed_mode(1);
    }
    ep.build().error_on_failure()
}

/// Offline-optimized model served on ONNX Runtime's CUDA provider.
#[derive(Debug, Clone, Copy)]
pub struct OrtCuda;

impl BackendImpl for OrtCuda {
    fn backend(&self) -> Backend {
        Backend::OrtCuda
    }

    fn opt_level(&self, opts: &BuildOptions) -> Option<OptLevel> {
        Some(opts.opt_level.for_cuda())
    }

    fn key_options(&self, opts: &BuildOptions) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("opt_level".into(), opts.opt_level.for_cuda().name().into());
        m.insert("device_id".into(), opts.device_id.to_string());
        m.insert("use_tf32".into(), opts.cuda_tf32().to_string());
        m
    }

    /// One optimization level lower for an artifact over tolerance ([`levels`]).
    fn next_attempt(&self, job: &mut BuildJob, failure: &Failure) -> Option<Retry> {
        match failure {
            Failure::OverTolerance(built) => {
                let level = job.options.opt_level.for_cuda();
                levels::lower(level, built, |l| job.options.opt_level = l)
            }
            Failure::Crashed(_) => None,
        }
    }

    fn check(&self, rt: &Runtime) -> Result<(), BuildError> {
        require("CUDA", ort::ep::CUDA::is_available(), rt, CUDA_FIX)
    }

    fn build(
        &self,
        rt: &Runtime,
        model: &Path,
        opts: &BuildOptions,
        out: &Path,
    ) -> Result<StagedArtifact, BuildError> {
        self.check(rt)?;
        let stage = "optimize (ort-cuda)";
        let entry = out.join(ENTRY);
        let b = Session::builder(&rt.env).map_err(|e| BuildError::ort(stage, model, e))?;
        let b = register("CUDA", b, vec![cuda_ep(opts)], model, CUDA_FIX)?;
        let session = b
            .with_optimization_level(opts.opt_level.for_cuda().ort())
            .map_err(|e| BuildError::ort(stage, model, e))?
            .with_optimized_model_path(&entry)
            .map_err(|e| BuildError::ort(stage, model, e))?
            .with_config_entry(
                "session.optimized_model_external_initializers_file_name",
                DATA,
            )
            .map_err(|e| BuildError::ort(stage, model, e))?
            .commit_from_file(model)
            .map_err(|e| BuildError::ort(stage, model, e))?;
        drop(session);
        Ok(optimized_artifact(out))
    }

    fn open(&self, rt: &Runtime, entry: &Path, opts: &BuildOptions) -> Result<Session, BuildError> {
        self.check(rt)?;
        let b =
            Session::builder(&rt.env).map_err(|e| BuildError::ort("open artifact", entry, e))?;
        register("CUDA", b, vec![cuda_ep(opts)], entry, CUDA_FIX)?
            .with_optimization_level(GraphOptimizationLevel::Disable)
            .map_err(|e| BuildError::ort("open artifact", entry, e))?
            .commit_from_file(entry)
            .map_err(|e| BuildError::ort("open artifact", entry, e))
    }
}

/// TensorRT engines embedded in an EP-context model, served on the TensorRT provider (CUDA
/// for the nodes TensorRT does not take).
#[derive(Debug, Clone, Copy)]
pub struct OrtTensorRt;

impl BackendImpl for OrtTensorRt {
    fn backend(&self) -> Backend {
        Backend::OrtTensorRt
    }

    fn key_options(&self, opts: &BuildOptions) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert(
            "trt_builder_optimization_level".into(),
            opts.trt_builder_level.to_string(),
        );
        m.insert("device_id".into(), opts.device_id.to_string());
        m.insert("trt_ep_context_embed_mode".into(), "1".into());
        m
    }

    fn check(&self, rt: &Runtime) -> Result<(), BuildError> {
        require("TensorRT", ort::ep::TensorRT::is_available(), rt, TRT_FIX)?;
        require("CUDA", ort::ep::CUDA::is_available(), rt, CUDA_FIX)
    }

    fn build(
        &self,
        rt: &Runtime,
        model: &Path,
        opts: &BuildOptions,
        out: &Path,
    ) -> Result<StagedArtifact, BuildError> {
        self.check(rt)?;
        let stage = "build engine (ort-tensorrt)";
        // Engine and timing caches live in the staging dir's scratch folder, not in the
        // artifact: the engine ends up embedded in the context model. The timing cache is
        // seeded from, and merged back into, the one shared per (GPU, TensorRT version).
        let caches = out.join(".trt-caches");
        std::fs::create_dir_all(&caches).map_err(|source| BuildError::Io {
            path: caches.clone(),
            source,
        })?;
        super::trt::seed_ep_timing_cache(opts, &caches);
        let ctx = out.join(CTX_ENTRY);
        let b = Session::builder(&rt.env).map_err(|e| BuildError::ort(stage, model, e))?;
        let eps = vec![
            trt_ep(opts, opts.profile.as_ref(), Some(&caches), Some(&ctx)),
            cuda_ep(opts),
        ];
        let session = register("TensorRT", b, eps, model, TRT_FIX)?
            .commit_from_file(model)
            .map_err(|e| BuildError::ort(stage, model, e))?;
        drop(session);
        super::trt::merge_ep_timing_cache(opts, &caches);
        let _ = std::fs::remove_dir_all(&caches);
        if !ctx.is_file() {
            return Err(BuildError::ort(
                stage,
                model,
                "the TensorRT provider did not write an EP-context model",
            ));
        }
        Ok(StagedArtifact {
            dir: out.to_path_buf(),
            entry: CTX_ENTRY.into(),
            files: vec![CTX_ENTRY.into()],
            rewrites: Vec::new(),
        })
    }

    fn open(&self, rt: &Runtime, entry: &Path, opts: &BuildOptions) -> Result<Session, BuildError> {
        self.check(rt)?;
        let b =
            Session::builder(&rt.env).map_err(|e| BuildError::ort("open artifact", entry, e))?;
        let eps = vec![trt_ep(opts, None, None, None), cuda_ep(opts)];
        register("TensorRT", b, eps, entry, TRT_FIX)?
            .commit_from_file(entry)
            .map_err(|e| BuildError::ort("open artifact", entry, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn shapes_in_trtexec_syntax() {
        let m = BTreeMap::from([
            ("ids".to_string(), vec![1, 128]),
            ("mask".to_string(), vec![1, 128]),
        ]);
        assert_eq!(shapes_arg(&m), "ids:1x128,mask:1x128");
    }
}
