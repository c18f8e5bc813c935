//! Stage 5: building artifacts. A [`BackendImpl`] turns a model file into a [`StagedArtifact`] (one or
//! more files in a staging directory) and opens sessions on artifacts the way they will be
//! served; [`validate`] compares an artifact against the original model; [`pipeline`] ties
//! key, store, build and validation together with single-flight per key.
//!
//! Enters: a model path, a backend name and [`BuildOptions`]. Leaves: a validated record in
//! the store, or a typed [`BuildError`]. ONNX Runtime comes from [`runtime`]; GPU providers
//! are registered with `error_on_failure`, never ort's silent CPU fallback.

pub(crate) mod compact;
pub mod cpu;
pub(crate) mod dequantize;
pub(crate) mod explain;
pub(crate) mod golden;
pub(crate) mod gpu;
pub(crate) mod pickle;
pub(crate) mod pins;
pub(crate) mod pipeline;
pub mod rewrite;
pub mod runtime;
pub(crate) mod search;
pub mod trt;
pub(crate) mod validate;
pub(crate) mod values;
pub(crate) mod vocab;
pub mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ort::session::Session;

pub use crate::cache::StagedArtifact;
use crate::spec::{Backend, Precision, ShapeProfile};
pub use pipeline::{BuildJob, BuildOutcome, Builder, Source, Watch};
pub use runtime::{Runtime, RuntimeError};
pub use worker::WorkerLimits;

/// Errors of building, opening and validating artifacts.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("{provider} execution provider is not available: {message}\nfix: {fix}")]
    ProviderMissing {
        provider: &'static str,
        message: String,
        fix: &'static str,
    },
    #[error("{}: {stage}: {message}", path.display())]
    Ort {
        stage: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Model { path: PathBuf, message: String },
    #[error("validation: {0}")]
    Validation(String),
    #[error(transparent)]
    Store(#[from] crate::cache::StoreError),
    #[error(transparent)]
    Key(#[from] crate::key::KeyError),
    #[error("the build was cancelled")]
    Cancelled,
    /// The build worker was killed (a deadline, a limit, the OOM killer), aborted, exited
    /// with an error or lost its answer (the reason names which): the model's failure.
    #[error("{0}")]
    Worker(String),
    /// The build worker died of a fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE): the model's
    /// failure, after the pipeline has built an `ort-cpu` artifact again without saved
    /// prepacked weights and without rewrites (ONNX Runtime can crash on a saved artifact
    /// where it runs the model).
    #[error("{0}")]
    Crashed(String),
    /// No build worker could be started or reaped: the machine's problem, not the model's.
    #[error("{0}")]
    WorkerUnavailable(String),
    /// The build worker was killed by SIGKILL from outside (the kernel's OOM killer under
    /// host pressure, an admin): neither its own limits nor a cancellation did it, so the
    /// build is tried again a bounded number of times (`limits.worker_kill_retries`) before
    /// it counts as the model's failure.
    #[error("{0}")]
    Killed(String),
    /// The artifact is bigger than the cache may hold (`limits.cache_size_bytes`): storing
    /// it would evict every other artifact and then itself. The model's final answer (until
    /// it or the limit changes), never stored.
    #[error("the artifact is {bytes} bytes, more than the whole cache may hold (limits.cache_size_bytes = {limit}; for `trtcache build`, --max-size); raise the limit to build and serve it")]
    TooLarge { bytes: u64, limit: u64 },
    /// The model's files changed since it was keyed; nothing was stored.
    #[error("{0}")]
    Changed(String),
    /// The `trt` backend: TensorRT or its shim missing ([`crate::trt::TrtError::Unavailable`],
    /// the host's problem), or a parse, build or run that failed (the model's).
    #[error(transparent)]
    Trt(#[from] crate::trt::TrtError),
}

impl BuildError {
    /// Whether the failure is this machine's (a missing library or provider, no worker), not
    /// the model's: it is not remembered against the model.
    pub fn is_host_problem(&self) -> bool {
        match self {
            BuildError::Runtime(_)
            | BuildError::ProviderMissing { .. }
            | BuildError::WorkerUnavailable(_) => true,
            BuildError::Trt(t) => t.is_host_problem(),
            _ => false,
        }
    }
}

impl BuildError {
    /// ONNX Runtime's error at `stage`, with what to do about it in front when it is one of
    /// the ways ORT says it cannot run the model at all ([`explain`]).
    pub(crate) fn ort(stage: &'static str, path: &Path, e: impl std::fmt::Display) -> Self {
        BuildError::Ort {
            stage,
            path: path.to_path_buf(),
            message: explain::ort_message(&e.to_string()),
        }
    }
}

/// ONNX Runtime graph optimization level used by the `ort-cpu` offline optimization.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptLevel {
    /// Level 1: constant folding, redundant-node removal.
    Basic,
    /// Level 2 (ORT_ENABLE_EXTENDED): fusions; portable across machines with the same ISA.
    Extended,
    /// Level 3 / All: adds layout transforms (NCHWc) tied to this machine's vector ISA.
    /// The default for `ort-cpu`: the key holds the CPU SKU (model + ISA flags) and the ONNX
    /// Runtime version, so an artifact is only ever served where ORT's "same environment"
    /// condition holds.
    #[default]
    All,
}

impl OptLevel {
    pub fn name(self) -> &'static str {
        match self {
            OptLevel::Basic => "basic",
            OptLevel::Extended => "extended",
            OptLevel::All => "all",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "basic" | "1" => Some(OptLevel::Basic),
            "extended" | "2" => Some(OptLevel::Extended),
            "all" | "3" | "99" => Some(OptLevel::All),
            _ => None,
        }
    }

    /// The next level down (`None` below Basic): where an artifact over tolerance is built
    /// again (see [`crate::cache::ValidationReport::rejected`]).
    pub fn lower(self) -> Option<Self> {
        match self {
            OptLevel::All => Some(OptLevel::Extended),
            OptLevel::Extended => Some(OptLevel::Basic),
            OptLevel::Basic => None,
        }
    }

    /// `ort-cuda` stays at or below Extended: ONNX Runtime's layout transforms at All are CPU
    /// ones and its docs advise Extended for offline models of non-CPU providers.
    pub fn for_cuda(self) -> Self {
        match self {
            OptLevel::All => OptLevel::Extended,
            l => l,
        }
    }

    pub fn ort(self) -> ort::session::builder::GraphOptimizationLevel {
        use ort::session::builder::GraphOptimizationLevel as G;
        match self {
            OptLevel::Basic => G::Level1,
            OptLevel::Extended => G::Level2,
            OptLevel::All => G::All,
        }
    }
}

pub use crate::config::DEFAULT_EXTERNAL_MIN_BYTES;

/// Every option that changes an artifact (all of them go into the key), plus runtime-only
/// knobs that do not (threads).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BuildOptions {
    pub precision: Precision,
    pub profile: Option<ShapeProfile>,
    /// `ort-cpu`/`ort-cuda` offline optimization level.
    pub opt_level: OptLevel,
    /// Save prepacked constant initializers next to the optimized model (`ort-cpu`).
    pub prepack: bool,
    /// `ort-cpu`: initializers of at least this many bytes go to the external data file
    /// (memory-mapped at load, shared between processes); smaller ones stay inside the graph
    /// file (parsed with it, no per-tensor open and map). See [`DEFAULT_EXTERNAL_MIN_BYTES`].
    pub external_min_bytes: u64,
    /// `ort-cpu`: bake the profile's fixed dimensions (min = max) into the artifact, so ONNX
    /// Runtime folds the shape arithmetic and plans static tensors (see
    /// [`cpu::fixed_dims`]). The artifact then accepts only those sizes, like a TensorRT
    /// engine built for the profile.
    pub specialize: bool,
    /// `ort-cpu`: apply the graph rewrites of [`rewrite`] (an op ONNX Runtime's CPU provider
    /// runs slowly replaced by the same computation in ops it runs well) before optimizing.
    #[serde(default = "yes")]
    pub rewrite: bool,
    /// TensorRT builder optimization level, 0–5 (TensorRT's default is 3).
    pub trt_builder_level: u8,
    /// `trt`: TensorRT's hardware-compatibility level. With a level set, the key records the
    /// class of GPUs the engine runs on instead of the exact GPU.
    #[serde(default)]
    pub trt_hardware_compat: crate::trt::HwCompat,
    /// `trt`: the builder's workspace memory limit in bytes (`None`: TensorRT's default).
    #[serde(default)]
    pub trt_workspace_bytes: Option<u64>,
    /// `trt` and `ort-tensorrt`: the folder of the shared timing caches, one per (GPU SKU,
    /// TensorRT version) (`CACHE_DIR/timing`, set by [`Builder::with_timing_caches`]);
    /// `None` times every build from scratch. Not part of the key: it changes which tactics
    /// are timed, not what an engine computes, and every engine is validated.
    #[serde(default)]
    pub timing_cache_dir: Option<PathBuf>,
    /// GPU ordinal for the GPU backends.
    pub device_id: i32,
    /// Further options a user keys artifacts by (`-o KEY=VALUE`), e.g. a label for a custom
    /// build environment; they go into the key as given and do not change the build.
    pub extra: BTreeMap<String, String>,
    /// ONNX Runtime intra-op threads for builds and validation (0 = ORT's default); not part
    /// of the key.
    pub threads: usize,
}

fn yes() -> bool {
    true
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            precision: Precision::Fp32,
            profile: None,
            opt_level: OptLevel::All,
            prepack: true,
            external_min_bytes: DEFAULT_EXTERNAL_MIN_BYTES,
            specialize: true,
            rewrite: true,
            trt_builder_level: 3,
            trt_hardware_compat: crate::trt::HwCompat::None,
            trt_workspace_bytes: None,
            timing_cache_dir: None,
            device_id: crate::config::gpu_ordinal().map_or(0, |o| o as i32),
            extra: BTreeMap::new(),
            threads: 0,
        }
    }
}

impl BuildOptions {
    /// These options as `plan` resolves them: the plan's profile and precision, and
    /// `specialize` and `rewrite` unless the plan (its sidecar) turns them off.
    pub fn for_plan(self, plan: &crate::plan::Plan) -> Self {
        Self {
            precision: plan.precision,
            profile: plan.profile.clone(),
            specialize: self.specialize && plan.specialize.unwrap_or(true),
            rewrite: self.rewrite && plan.rewrite.unwrap_or(true),
            ..self
        }
    }

    /// Option names [`BuildOptions::key_options`] sets itself (an `extra` entry may not
    /// reuse them).
    pub const BUILT_IN: &'static [&'static str] = &[
        "opt_level",
        "prepack",
        "external_min_bytes",
        "specialize",
        "rewrites",
        "device_id",
        "trt_builder_optimization_level",
        "trt_ep_context_embed_mode",
        "trt.precision",
        "trt.workspace_bytes",
        "trt.builder_optimization_level",
        "trt.hardware_compatibility",
        // Set by `key::key_parts` for models with float16/bfloat16 outputs.
        "validation",
    ];

    /// The `trt` backend's TensorRT build options: precision flags from the precision
    /// (`fp16` turns TensorRT's FP16 flag on; `fp32` clears TensorRT's default TF32 flag, so
    /// fp32 layers compute in fp32 and meet the fp32 tolerance: TF32's 10-bit mantissa misses
    /// it, 6.6e-4 against 1e-4 on tiny_encoder_static), workspace, builder level,
    /// hardware-compatibility level and the profile (one optimization profile when it names
    /// any input). The timing cache is filled in by the backend.
    pub fn engine_options(&self) -> crate::trt::BuildOptions {
        crate::trt::BuildOptions {
            precision: crate::trt::Precision {
                fp16: self.precision == Precision::Fp16,
                no_tf32: self.precision == Precision::Fp32,
                ..Default::default()
            },
            workspace_bytes: self.trt_workspace_bytes,
            builder_optimization_level: Some(self.trt_builder_level),
            hardware_compatibility: self.trt_hardware_compat,
            profiles: self
                .profile
                .iter()
                .filter(|p| !p.min.is_empty())
                .cloned()
                .collect(),
            timing_cache: Vec::new(),
        }
    }

    /// Whether ONNX Runtime's CUDA provider may use TF32 (its `use_tf32`, on by default):
    /// never for an fp32 build, whose artifact is validated at the fp32 tolerance. A consumer
    /// serving an `ort-cuda` artifact passes the same (the metadata's `use_tf32`).
    pub fn cuda_tf32(&self) -> bool {
        self.precision != Precision::Fp32
    }

    /// The options that go into the key for `backend`, as canonical strings: the single
    /// source of a key's `options` for `trtcache key`, `trtcache build` and the daemon.
    /// Precision and profile are key parts of their own.
    pub fn key_options(&self, backend: Backend) -> BTreeMap<String, String> {
        let mut m = self.extra.clone();
        match backend {
            Backend::OrtCpu => {
                m.insert("opt_level".into(), self.opt_level.name().into());
                m.insert("prepack".into(), self.prepack.to_string());
                m.insert(
                    "external_min_bytes".into(),
                    self.external_min_bytes.to_string(),
                );
                m.insert("specialize".into(), self.specialize.to_string());
                let rewrites = if self.rewrite {
                    rewrite::REWRITES.join(",")
                } else {
                    "none".into()
                };
                m.insert("rewrites".into(), rewrites);
            }
            Backend::OrtCuda => {
                m.insert("opt_level".into(), self.opt_level.for_cuda().name().into());
                m.insert("device_id".into(), self.device_id.to_string());
                m.insert("use_tf32".into(), self.cuda_tf32().to_string());
            }
            Backend::OrtTensorRt => {
                m.insert(
                    "trt_builder_optimization_level".into(),
                    self.trt_builder_level.to_string(),
                );
                m.insert("device_id".into(), self.device_id.to_string());
                m.insert("trt_ep_context_embed_mode".into(), "1".into());
            }
            Backend::Trt => {
                m.extend(crate::trt::keys::key_options(&self.engine_options()));
                m.insert("device_id".into(), self.device_id.to_string());
            }
        }
        m
    }
}

/// How a [`Backend`] builds and serves artifacts.
pub trait BackendImpl: Send + Sync {
    /// Which backend this is.
    fn backend(&self) -> Backend;
    /// Fails with the precise reason when the backend cannot run on this machine.
    fn check(&self, rt: &Runtime) -> Result<(), BuildError>;
    /// Builds the artifact for `model` into `out` (an empty staging directory).
    fn build(
        &self,
        rt: &Runtime,
        model: &Path,
        opts: &BuildOptions,
        out: &Path,
    ) -> Result<StagedArtifact, BuildError>;
    /// Opens a session on an artifact's graph file the way consumers will.
    fn open(&self, rt: &Runtime, entry: &Path, opts: &BuildOptions) -> Result<Session, BuildError>;
    /// Checks that an artifact (a fetched one) opens the way consumers will: by default an
    /// ONNX Runtime session on its entry.
    fn check_artifact(
        &self,
        rt: &Runtime,
        artifact: &StagedArtifact,
        opts: &BuildOptions,
    ) -> Result<(), BuildError> {
        self.open(rt, &artifact.dir.join(&artifact.entry), opts)
            .map(drop)
    }
    /// Validates a built artifact against `model` (ONNX Runtime CPU on the raw model, see
    /// [`validate`]): by default through a session [`BackendImpl::open`] makes.
    fn validate(
        &self,
        rt: &Runtime,
        model: &Path,
        artifact: &StagedArtifact,
        opts: &BuildOptions,
        cfg: &validate::ValidationConfig,
    ) -> Result<crate::cache::ValidationReport, BuildError> {
        let mut session = self.open(rt, &artifact.dir.join(&artifact.entry), opts)?;
        validate::validate(
            rt,
            model,
            &mut session,
            opts.profile.as_ref(),
            opts.precision,
            cfg,
            opts.threads,
        )
    }
}

/// The implementation of `backend`.
pub fn backend(backend: Backend) -> Box<dyn BackendImpl> {
    match backend {
        Backend::OrtCpu => Box::new(cpu::OrtCpu),
        Backend::OrtCuda => Box::new(gpu::OrtCuda),
        Backend::OrtTensorRt => Box::new(gpu::OrtTensorRt),
        Backend::Trt => Box::new(trt::NativeTrt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp32_means_no_tf32_on_every_gpu_backend_that_has_the_switch() {
        let fp32 = BuildOptions::default();
        assert_eq!(fp32.precision, Precision::Fp32);
        assert!(fp32.engine_options().precision.no_tf32);
        assert!(!fp32.cuda_tf32());
        assert_eq!(fp32.key_options(Backend::OrtCuda)["use_tf32"], "false");
        let fp16 = BuildOptions {
            precision: Precision::Fp16,
            ..BuildOptions::default()
        };
        assert!(!fp16.engine_options().precision.no_tf32);
        assert!(fp16.cuda_tf32());
        assert_eq!(fp16.key_options(Backend::OrtCuda)["use_tf32"], "true");
        // The TensorRT EP has no TF32 switch (ONNX Runtime 1.31): nothing to key.
        assert!(!fp32
            .key_options(Backend::OrtTensorRt)
            .contains_key("use_tf32"));
    }
}
