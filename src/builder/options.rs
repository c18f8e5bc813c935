//! The options of a build: every one that changes an artifact goes into the key
//! ([`BuildOptions::key_options`], the single source of a key's `options`), plus runtime-only
//! knobs (threads, the timing-cache folder) that do not.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::spec::{Precision, ShapeProfile};

/// ONNX Runtime graph optimization level used by the `ort-cpu` offline optimization.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptLevel {
    /// No graph optimization: the model's own graph (saved by ONNX Runtime, with the
    /// `ort-cpu` options that apply), computing exactly what the unoptimized reference
    /// computes. The last rung of the fallback ladder: a model whose every optimized graph
    /// is over tolerance (a dynamically quantized T5 decoder: ONNX Runtime's reordered sums
    /// flip activations across quantization steps, 25 % off at `basic` on some inputs) is
    /// served as it is rather than not at all.
    Disabled,
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
            OptLevel::Disabled => "disabled",
            OptLevel::Basic => "basic",
            OptLevel::Extended => "extended",
            OptLevel::All => "all",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "disabled" | "0" => Some(OptLevel::Disabled),
            "basic" | "1" => Some(OptLevel::Basic),
            "extended" | "2" => Some(OptLevel::Extended),
            "all" | "3" | "99" => Some(OptLevel::All),
            _ => None,
        }
    }

    /// The next level down (`None` below Disabled): where an artifact over tolerance is
    /// built again (see [`crate::cache::ValidationReport::rejected`]).
    pub fn lower(self) -> Option<Self> {
        match self {
            OptLevel::All => Some(OptLevel::Extended),
            OptLevel::Extended => Some(OptLevel::Basic),
            OptLevel::Basic => Some(OptLevel::Disabled),
            OptLevel::Disabled => None,
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

    pub fn ort(self) -> ::ort::session::builder::GraphOptimizationLevel {
        use ::ort::session::builder::GraphOptimizationLevel as G;
        match self {
            OptLevel::Disabled => G::Disable,
            OptLevel::Basic => G::Level1,
            OptLevel::Extended => G::Level2,
            OptLevel::All => G::All,
        }
    }
}

pub use crate::config::DEFAULT_EXTERNAL_MIN_BYTES;

/// Every option that changes an artifact (all of them go into the key: each backend says
/// which of its own, [`BackendImpl::key_options`](super::BackendImpl::key_options)), plus
/// runtime-only knobs that do not (threads, the timing-cache folder). What one backend alone
/// reads is in its own group: [`OrtCpuOptions`], [`TrtOptions`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BuildOptions {
    pub precision: Precision,
    pub profile: Option<ShapeProfile>,
    /// `ort-cpu`/`ort-cuda` offline optimization level.
    pub opt_level: OptLevel,
    /// The `ort-cpu` backend's own options.
    pub ort_cpu: OrtCpuOptions,
    /// The TensorRT builder's options (`trt`; `ort-tensorrt` reads the builder level).
    pub trt: TrtOptions,
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

/// What only the `ort-cpu` backend reads.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OrtCpuOptions {
    /// Save prepacked constant initializers next to the optimized model.
    pub prepack: bool,
    /// Initializers of at least this many bytes go to the external data file (memory-mapped
    /// at load, shared between processes); smaller ones stay inside the graph file (parsed
    /// with it, no per-tensor open and map). See [`DEFAULT_EXTERNAL_MIN_BYTES`].
    pub external_min_bytes: u64,
    /// Bake the profile's fixed dimensions (min = max) into the artifact, so ONNX Runtime
    /// folds the shape arithmetic and plans static tensors. The artifact then accepts only
    /// those sizes, like a TensorRT engine built for the profile.
    pub specialize: bool,
    /// Apply the graph passes (`backends::ort_cpu::passes`: an op ONNX Runtime's CPU provider
    /// runs slowly replaced by the same computation in ops it runs well) before optimizing.
    pub rewrite: bool,
}

impl Default for OrtCpuOptions {
    fn default() -> Self {
        Self {
            prepack: true,
            external_min_bytes: DEFAULT_EXTERNAL_MIN_BYTES,
            specialize: true,
            rewrite: true,
        }
    }
}

/// What the TensorRT builder reads (`trt`; `ort-tensorrt` passes the builder level to the
/// TensorRT provider).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrtOptions {
    /// Builder optimization level, 0–5 (TensorRT's default is 3).
    pub builder_level: u8,
    /// `trt`: TensorRT's hardware-compatibility level. With a level set, the key records the
    /// class of GPUs the engine runs on instead of the exact GPU.
    pub hardware_compat: crate::trt::HwCompat,
    /// `trt`: the builder's workspace memory limit in bytes (`None`: TensorRT's default).
    pub workspace_bytes: Option<u64>,
}

impl Default for TrtOptions {
    fn default() -> Self {
        Self {
            builder_level: 3,
            hardware_compat: crate::trt::HwCompat::None,
            workspace_bytes: None,
        }
    }
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            precision: Precision::Fp32,
            profile: None,
            opt_level: OptLevel::All,
            ort_cpu: OrtCpuOptions::default(),
            trt: TrtOptions::default(),
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
            ort_cpu: OrtCpuOptions {
                specialize: self.ort_cpu.specialize && plan.specialize.unwrap_or(true),
                rewrite: self.ort_cpu.rewrite && plan.rewrite.unwrap_or(true),
                ..self.ort_cpu
            },
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
            workspace_bytes: self.trt.workspace_bytes,
            builder_optimization_level: Some(self.trt.builder_level),
            hardware_compatibility: self.trt.hardware_compat,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Backend;

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
