//! One `trt` build from model bytes to a validated artifact folder, in the order the backend
//! runs it: load the shared timing cache for (GPU, TensorRT version), parse, build, merge the
//! build's timing cache back, deserialize the engine, run it on seeded inputs, compare with
//! the reference outputs (ONNX Runtime CPU on the raw model, supplied by the caller), and
//! only when every output is within tolerance write `engine.plan` + `engine.json`. An engine
//! over tolerance is never written, so it can never be served.

use std::path::{Path, PathBuf};

use super::api::Trt;
use super::artifact::{self, EngineMeta};
use super::error::TrtError;
use super::timing::TimingCacheStore;
use super::types::{BuildOptions, DType, HostTensor, IoInfo};
use super::validate::{self, Reference};
use crate::build::validate::{OutputError, Tolerance};
use crate::device::Sku;
use crate::plan::ShapeProfile;
use crate::rng::SplitMix64;

/// What to build and how to validate it.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub model: &'a [u8],
    /// The folder external-data locations are relative to.
    pub external_dir: Option<&'a Path>,
    /// Build options; `timing_cache` is replaced by the shared one.
    pub options: BuildOptions,
    /// The GPU this host builds on (its exact SKU: the timing cache is per GPU model).
    pub gpu: Sku,
    /// Validation inputs: seed and the range integer inputs are drawn from.
    pub seed: u64,
    pub int_range: (i64, i64),
    pub tolerance: Tolerance,
}

/// A validated artifact.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub meta: EngineMeta,
    pub validation: Vec<OutputError>,
    /// The shared timing cache the build read and updated.
    pub timing_cache: PathBuf,
}

/// Seeded host inputs for every engine input: the first profile's opt shape, else the
/// engine's shape with dynamic dimensions 1. Floats uniform in [-1, 1), integers and bools in
/// `int_range`.
pub fn make_inputs(
    io: &IoInfo,
    profile: Option<&ShapeProfile>,
    seed: u64,
    int_range: (i64, i64),
) -> Result<Vec<HostTensor>, TrtError> {
    let mut rng = SplitMix64(seed);
    io.inputs
        .iter()
        .map(|t| {
            let shape: Vec<i64> = profile
                .and_then(|p| p.opt.get(&t.name).cloned())
                .unwrap_or_else(|| t.shape.iter().map(|&d| if d > 0 { d } else { 1 }).collect());
            let n = shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
                .ok_or_else(|| {
                    TrtError::InvalidArgument(format!("input `{}`: bad shape {shape:?}", t.name))
                })?;
            let (lo, hi) = int_range;
            let mut data = Vec::new();
            for _ in 0..n {
                match t.dtype {
                    DType::Float32 => data.extend(((rng.unit() * 2.0 - 1.0) as f32).to_ne_bytes()),
                    DType::Int32 => data.extend((rng.int(lo, hi) as i32).to_ne_bytes()),
                    DType::Int64 => data.extend(rng.int(lo, hi).to_ne_bytes()),
                    DType::Int8 => data.push(rng.int(lo, hi) as i8 as u8),
                    DType::Uint8 => data.push(rng.int(lo, hi) as u8),
                    DType::Bool => data.push((rng.int(lo, hi) != 0) as u8),
                    other => {
                        return Err(TrtError::InvalidArgument(format!(
                            "input `{}`: validation inputs of type {other:?} are not supported",
                            t.name
                        )))
                    }
                }
            }
            Ok(HostTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape,
                data,
            })
        })
        .collect()
}

/// Builds, validates and (only when valid) writes the artifact into `out_dir`.
pub fn build_artifact(
    trt: &Trt,
    store: &TimingCacheStore,
    req: &Request<'_>,
    out_dir: &Path,
    reference: impl FnOnce(&[HostTensor]) -> Result<Vec<Reference>, TrtError>,
) -> Result<Outcome, TrtError> {
    let version = trt.version().to_string();
    let mut opts = req.options.clone();
    opts.timing_cache = store.load(&req.gpu, &version)?;
    let mut network = trt.parse(req.model, req.external_dir)?;
    let built = network.build(&opts)?;
    drop(network);
    // The timing data is good whatever validation says: keep it for the next build.
    let timing_cache = store.merge_with(trt, &req.gpu, &built.timing_cache)?;
    let mut engine = trt.load_engine(&built.plan)?;
    let io = engine.io()?;
    let inputs = make_inputs(&io, opts.profiles.first(), req.seed, req.int_range)?;
    let got = engine.run(0, &inputs)?;
    let want = reference(&inputs)?;
    let validation = validate::compare_outputs(&want, &got, req.tolerance);
    validate::ensure_servable(&validation)?;
    let meta = EngineMeta {
        format: artifact::META_FORMAT,
        tensorrt_version: version,
        gpu: req.gpu.name.clone(),
        compute_capability: req.gpu.compute_capability.clone(),
        hardware_compatibility: opts.hardware_compatibility,
        precision: opts.precision,
        workspace_bytes: opts.workspace_bytes,
        builder_optimization_level: opts.builder_optimization_level,
        profiles: opts.profiles.clone(),
        inputs: io.inputs,
        outputs: io.outputs,
        plan_bytes: 0,
        plan_sha256: String::new(),
    };
    let meta = artifact::write_artifact(out_dir, &built.plan, &meta)?;
    tracing::info!(plan_bytes = meta.plan_bytes, dir = %out_dir.display(), "trt engine built and validated");
    Ok(Outcome {
        meta,
        validation,
        timing_cache,
    })
}
