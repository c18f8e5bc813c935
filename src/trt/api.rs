//! The safe wrapper over the shim: [`Trt`] (a loaded shim), [`Network`] (a parsed model),
//! [`Engine`] (a deserialized plan) and the plain-data types that cross the boundary.
//!
//! Every call copies what the shim returns into Rust-owned values and frees the shim's
//! memory with the matching `*_free` before returning; errors carry the calling thread's
//! `trtcache_trt_last_error()` read right after the failing call.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::{Status, TrtError};
use super::ffi;
use super::loader::{self, LoaderConfig, Opened};
use crate::plan::ShapeProfile;

/// A TensorRT version as `getInferLibVersion` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TrtVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl TrtVersion {
    /// Decodes `MAJOR*10000 + MINOR*100 + PATCH` (TensorRT 10 and later) or, below 100000,
    /// TensorRT 8's `MAJOR*1000 + MINOR*100 + PATCH`.
    pub fn from_raw(v: i32) -> Self {
        let v = v.max(0) as u32;
        if v >= 100_000 {
            Self {
                major: v / 10_000,
                minor: v / 100 % 100,
                patch: v % 100,
            }
        } else {
            Self {
                major: v / 1000,
                minor: v / 100 % 10,
                patch: v % 100,
            }
        }
    }
}

impl std::fmt::Display for TrtVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Element types (TensorRT's `DataType`), named as in the artifact metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Float32,
    Float16,
    Int8,
    Int32,
    Bool,
    Uint8,
    Fp8,
    Bfloat16,
    Int64,
    Int4,
    Fp4,
    Other,
}

impl DType {
    pub fn from_code(c: u32) -> Self {
        match c {
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_FLOAT => DType::Float32,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_HALF => DType::Float16,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_INT8 => DType::Int8,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_INT32 => DType::Int32,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_BOOL => DType::Bool,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_UINT8 => DType::Uint8,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_FP8 => DType::Fp8,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_BF16 => DType::Bfloat16,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_INT64 => DType::Int64,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_INT4 => DType::Int4,
            ffi::trtcache_trt_dtype_TRTCACHE_TRT_FP4 => DType::Fp4,
            _ => DType::Other,
        }
    }

    pub fn code(self) -> u32 {
        match self {
            DType::Float32 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_FLOAT,
            DType::Float16 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_HALF,
            DType::Int8 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_INT8,
            DType::Int32 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_INT32,
            DType::Bool => ffi::trtcache_trt_dtype_TRTCACHE_TRT_BOOL,
            DType::Uint8 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_UINT8,
            DType::Fp8 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_FP8,
            DType::Bfloat16 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_BF16,
            DType::Int64 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_INT64,
            DType::Int4 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_INT4,
            DType::Fp4 => ffi::trtcache_trt_dtype_TRTCACHE_TRT_FP4,
            DType::Other => ffi::trtcache_trt_dtype_TRTCACHE_TRT_DTYPE_OTHER,
        }
    }

    /// Bytes per element for the types validation reads; `None` for sub-byte and unknown ones.
    pub fn size(self) -> Option<usize> {
        Some(match self {
            DType::Float32 | DType::Int32 => 4,
            DType::Float16 | DType::Bfloat16 => 2,
            DType::Int8 | DType::Uint8 | DType::Bool | DType::Fp8 => 1,
            DType::Int64 => 8,
            DType::Int4 | DType::Fp4 | DType::Other => return None,
        })
    }
}

/// One I/O tensor of a network or engine (`-1` for a dynamic dimension).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<i64>,
}

/// Inputs and outputs, and (for an engine) its number of optimization profiles.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoInfo {
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    #[serde(default)]
    pub profiles: Option<u32>,
}

#[derive(Deserialize)]
struct RawTensor {
    name: String,
    dtype: u32,
    shape: Vec<i64>,
}

#[derive(Deserialize)]
struct RawIo {
    inputs: Vec<RawTensor>,
    outputs: Vec<RawTensor>,
    #[serde(default)]
    profiles: Option<u32>,
}

impl From<RawIo> for IoInfo {
    fn from(r: RawIo) -> Self {
        let conv = |v: Vec<RawTensor>| {
            v.into_iter()
                .map(|t| TensorInfo {
                    name: t.name,
                    dtype: DType::from_code(t.dtype),
                    shape: t.shape,
                })
                .collect()
        };
        IoInfo {
            inputs: conv(r.inputs),
            outputs: conv(r.outputs),
            profiles: r.profiles,
        }
    }
}

/// One subgraph of the parser's support query.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubgraphSupport {
    pub supported: bool,
    /// Node indices in the model's graph order.
    pub nodes: Vec<usize>,
}

/// The ONNX parser's own verdict (`IParser::supportsModelV2`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupportReport {
    pub supported: bool,
    pub subgraphs: Vec<SubgraphSupport>,
    #[serde(default)]
    pub errors: Vec<serde_json::Value>,
}

impl SupportReport {
    /// Node index → supported, for every node a subgraph names (the rest the parser did not
    /// place in any subgraph, which `inspect --trt` shows as unsupported).
    pub fn node_verdicts(&self) -> BTreeMap<usize, bool> {
        let mut m = BTreeMap::new();
        for s in &self.subgraphs {
            for &n in &s.nodes {
                m.insert(n, s.supported);
            }
        }
        m
    }
}

/// TensorRT 10's weakly typed precision flags (TensorRT 11 refuses them: its networks take
/// their precision from the model's types).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Precision {
    #[serde(default)]
    pub fp16: bool,
    #[serde(default)]
    pub bf16: bool,
    #[serde(default)]
    pub int8: bool,
    #[serde(default)]
    pub fp8: bool,
    /// Disallow TF32 for fp32 layers.
    #[serde(default)]
    pub no_tf32: bool,
}

impl Precision {
    pub fn flags(self) -> u32 {
        let mut f = 0;
        for (on, bit) in [
            (self.fp16, ffi::TRTCACHE_TRT_PRECISION_FP16),
            (self.bf16, ffi::TRTCACHE_TRT_PRECISION_BF16),
            (self.int8, ffi::TRTCACHE_TRT_PRECISION_INT8),
            (self.fp8, ffi::TRTCACHE_TRT_PRECISION_FP8),
            (self.no_tf32, ffi::TRTCACHE_TRT_PRECISION_NO_TF32),
        ] {
            if on {
                f |= bit;
            }
        }
        f
    }

    /// The flags as a canonical comma-separated list (`fp32` when none), for keys.
    pub fn canonical(self) -> String {
        let names: Vec<&str> = [
            (self.fp16, "fp16"),
            (self.bf16, "bf16"),
            (self.int8, "int8"),
            (self.fp8, "fp8"),
            (self.no_tf32, "no-tf32"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        if names.is_empty() {
            "fp32".into()
        } else {
            names.join(",")
        }
    }

    /// Reads `fp32`, `fp16`, `fp16,no-tf32`, …
    pub fn parse(s: &str) -> Result<Self, TrtError> {
        let mut p = Precision::default();
        for part in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            match part {
                "fp32" => {}
                "fp16" => p.fp16 = true,
                "bf16" => p.bf16 = true,
                "int8" => p.int8 = true,
                "fp8" => p.fp8 = true,
                "no-tf32" => p.no_tf32 = true,
                other => {
                    return Err(TrtError::InvalidArgument(format!(
                        "unknown precision `{other}` (fp32, fp16, bf16, int8, fp8, no-tf32)"
                    )))
                }
            }
        }
        Ok(p)
    }
}

/// TensorRT's hardware-compatibility level: whether an engine runs only on the GPU model it
/// was built on (`none`), on any Ampere or newer GPU, or on any GPU of the same compute
/// capability.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HwCompat {
    #[default]
    None,
    AmperePlus,
    SameComputeCapability,
}

impl HwCompat {
    pub fn name(self) -> &'static str {
        match self {
            HwCompat::None => "none",
            HwCompat::AmperePlus => "ampere-plus",
            HwCompat::SameComputeCapability => "same-compute-capability",
        }
    }

    pub fn parse(s: &str) -> Result<Self, TrtError> {
        match s {
            "none" => Ok(HwCompat::None),
            "ampere-plus" => Ok(HwCompat::AmperePlus),
            "same-compute-capability" => Ok(HwCompat::SameComputeCapability),
            other => Err(TrtError::InvalidArgument(format!(
                "unknown hardware-compatibility level `{other}` (none, ampere-plus, \
                 same-compute-capability)"
            ))),
        }
    }

    fn raw(self) -> i32 {
        (match self {
            HwCompat::None => ffi::TRTCACHE_TRT_HWCOMPAT_NONE,
            HwCompat::AmperePlus => ffi::TRTCACHE_TRT_HWCOMPAT_AMPERE_PLUS,
            HwCompat::SameComputeCapability => ffi::TRTCACHE_TRT_HWCOMPAT_SAME_COMPUTE_CAPABILITY,
        }) as i32
    }
}

/// How to build an engine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BuildOptions {
    pub precision: Precision,
    /// Workspace pool limit; `None` keeps TensorRT's default.
    pub workspace_bytes: Option<u64>,
    /// 0..=5; `None` keeps TensorRT's default (3).
    pub builder_optimization_level: Option<u8>,
    pub hardware_compatibility: HwCompat,
    /// One TensorRT optimization profile each (the model's dynamic inputs).
    pub profiles: Vec<ShapeProfile>,
    /// The timing cache to start from (empty: none).
    pub timing_cache: Vec<u8>,
}

/// A built engine and the timing cache after the build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Built {
    pub plan: Vec<u8>,
    pub timing_cache: Vec<u8>,
}

/// A host tensor, row-major, in the element type's native byte order.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub data: Vec<u8>,
}

impl HostTensor {
    /// An fp32 tensor.
    pub fn f32(name: &str, shape: &[i64], values: &[f32]) -> Self {
        Self {
            name: name.into(),
            dtype: DType::Float32,
            shape: shape.to_vec(),
            data: values.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        }
    }

    /// The values as f64 (what validation compares); `None` for fp8 and sub-byte types.
    pub fn to_f64(&self) -> Option<Vec<f64>> {
        let size = self.dtype.size()?;
        if self.dtype == DType::Fp8 || !self.data.len().is_multiple_of(size) {
            return None;
        }
        let it = self.data.chunks_exact(size);
        Some(match self.dtype {
            DType::Float32 => it
                .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            DType::Float16 => it
                .map(|c| f16_to_f32(u16::from_ne_bytes([c[0], c[1]])) as f64)
                .collect(),
            DType::Bfloat16 => it
                .map(|c| f32::from_bits((u16::from_ne_bytes([c[0], c[1]]) as u32) << 16) as f64)
                .collect(),
            DType::Int32 => it
                .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            DType::Int64 => it
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap_or([0; 8])) as f64)
                .collect(),
            DType::Int8 => it.map(|c| c[0] as i8 as f64).collect(),
            DType::Uint8 | DType::Bool => it.map(|c| c[0] as f64).collect(),
            _ => return None,
        })
    }
}

/// IEEE half to single precision.
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: normalise.
            let shift = f.leading_zeros() - 21;
            let f = (f << shift) & 0x3ff;
            sign | ((113 - shift) << 23) | (f << 13)
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 112) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

/// A loaded shim. Cheap to clone; the libraries stay open while any clone (or a network or
/// engine made from it) lives.
#[derive(Clone)]
pub struct Trt {
    inner: Arc<Opened>,
}

impl std::fmt::Debug for Trt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trt")
            .field("shim", &self.inner.path)
            .field("version", &self.version())
            .finish()
    }
}

struct ShimBytes<'a> {
    api: &'a ffi::TrtShim,
    raw: ffi::trtcache_trt_bytes,
}

impl<'a> ShimBytes<'a> {
    fn new(api: &'a ffi::TrtShim) -> Self {
        Self {
            api,
            raw: ffi::trtcache_trt_bytes {
                data: ptr::null_mut(),
                len: 0,
            },
        }
    }

    fn to_vec(&self) -> Vec<u8> {
        if self.raw.data.is_null() || self.raw.len == 0 {
            return Vec::new();
        }
        // SAFETY: the shim returned `len` bytes at `data`, alive until freed in Drop.
        unsafe { std::slice::from_raw_parts(self.raw.data, self.raw.len) }.to_vec()
    }
}

impl Drop for ShimBytes<'_> {
    fn drop(&mut self) {
        // SAFETY: bytes the shim allocated (or null), freed once.
        unsafe { (self.api.trtcache_trt_bytes_free)(&mut self.raw) }
    }
}

fn cstring(what: &str, s: &str) -> Result<CString, TrtError> {
    CString::new(s).map_err(|_| TrtError::InvalidArgument(format!("{what} `{s}` contains a NUL")))
}

fn dir_cstring(dir: Option<&Path>) -> Result<Option<CString>, TrtError> {
    dir.map(|d| {
        CString::new(d.as_os_str().as_bytes())
            .map_err(|_| TrtError::InvalidArgument(format!("{} contains a NUL", d.display())))
    })
    .transpose()
}

impl Trt {
    /// Loads the shim (and TensorRT) as [`LoaderConfig`] says; `Unavailable` names what is
    /// missing and how to install it.
    pub fn load(cfg: &LoaderConfig) -> Result<Trt, TrtError> {
        loader::open(cfg).map(|o| Trt { inner: Arc::new(o) })
    }

    fn api(&self) -> &ffi::TrtShim {
        &self.inner.api
    }

    fn check(&self, call: &'static str, st: ffi::trtcache_trt_status) -> Result<(), TrtError> {
        match Status::from_raw(st) {
            None => Ok(()),
            Some(status) => Err(TrtError::Call {
                call,
                status,
                message: self.last_error(),
            }),
        }
    }

    fn last_error(&self) -> String {
        // SAFETY: a NUL-terminated thread-local string owned by the shim.
        let p = unsafe { (self.api().trtcache_trt_last_error)() };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated, valid until the next call on this thread.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The shim's path.
    pub fn shim_path(&self) -> &Path {
        &self.inner.path
    }

    /// The TensorRT libraries opened for the shim.
    pub fn libraries(&self) -> Vec<&Path> {
        self.inner
            .libraries
            .iter()
            .map(|(p, _)| p.as_path())
            .collect()
    }

    /// The loaded TensorRT's version (`getInferLibVersion`, through the shim).
    pub fn version(&self) -> TrtVersion {
        // SAFETY: no arguments.
        TrtVersion::from_raw(unsafe { (self.api().trtcache_trt_library_version)() })
    }

    /// The TensorRT major version the shim was compiled against.
    pub fn compiled_major(&self) -> i32 {
        // SAFETY: no arguments.
        unsafe { (self.api().trtcache_trt_compiled_major)() }
    }

    /// A status's name as the shim spells it.
    pub fn status_name(&self, raw: i32) -> String {
        // SAFETY: returns a static string.
        let p = unsafe { (self.api().trtcache_trt_status_name)(raw) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: static, NUL-terminated.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn json<T: serde::de::DeserializeOwned>(call: &'static str, b: &[u8]) -> Result<T, TrtError> {
        serde_json::from_slice(b).map_err(|source| TrtError::Json { call, source })
    }

    /// Parses an ONNX model; `external_dir` is the folder external-data locations are
    /// relative to.
    pub fn parse(&self, model: &[u8], external_dir: Option<&Path>) -> Result<Network, TrtError> {
        let dir = dir_cstring(external_dir)?;
        let mut out = ptr::null_mut();
        // SAFETY: `model` and `dir` outlive the call; `out` receives an owned handle.
        let st = unsafe {
            (self.api().trtcache_trt_parse)(
                model.as_ptr(),
                model.len(),
                dir.as_ref().map_or(ptr::null(), |d| d.as_ptr()),
                &mut out,
            )
        };
        self.check("parse", st)?;
        let ptr = NonNull::new(out).ok_or_else(|| TrtError::Call {
            call: "parse",
            status: Status::Internal,
            message: "the shim returned no network".into(),
        })?;
        Ok(Network {
            trt: self.clone(),
            ptr,
        })
    }

    /// The parser's support query over a model.
    pub fn supports(
        &self,
        model: &[u8],
        external_dir: Option<&Path>,
    ) -> Result<SupportReport, TrtError> {
        let dir = dir_cstring(external_dir)?;
        let mut b = ShimBytes::new(self.api());
        // SAFETY: inputs outlive the call; `b` receives shim-owned bytes.
        let st = unsafe {
            (self.api().trtcache_trt_supports)(
                model.as_ptr(),
                model.len(),
                dir.as_ref().map_or(ptr::null(), |d| d.as_ptr()),
                &mut b.raw,
            )
        };
        self.check("supports", st)?;
        Self::json("supports", &b.to_vec())
    }

    /// Merges two serialized timing caches (either may be empty).
    pub fn combine_timing_caches(&self, a: &[u8], b: &[u8]) -> Result<Vec<u8>, TrtError> {
        let mut out = ShimBytes::new(self.api());
        // SAFETY: inputs outlive the call.
        let st = unsafe {
            (self.api().trtcache_trt_timing_cache_combine)(
                a.as_ptr(),
                a.len(),
                b.as_ptr(),
                b.len(),
                &mut out.raw,
            )
        };
        self.check("timing_cache_combine", st)?;
        Ok(out.to_vec())
    }

    /// Deserializes a plan on the current CUDA device.
    pub fn load_engine(&self, plan: &[u8]) -> Result<Engine, TrtError> {
        let mut out = ptr::null_mut();
        // SAFETY: `plan` outlives the call.
        let st =
            unsafe { (self.api().trtcache_trt_engine_load)(plan.as_ptr(), plan.len(), &mut out) };
        self.check("engine_load", st)?;
        let ptr = NonNull::new(out).ok_or_else(|| TrtError::Call {
            call: "engine_load",
            status: Status::Internal,
            message: "the shim returned no engine".into(),
        })?;
        Ok(Engine {
            trt: self.clone(),
            ptr,
        })
    }
}

/// A parsed model, ready to build.
pub struct Network {
    trt: Trt,
    ptr: NonNull<ffi::trtcache_trt_network>,
}

// SAFETY: the handle is used by one thread at a time (&mut self for builds); TensorRT's
// builder objects may move between threads.
unsafe impl Send for Network {}

impl Drop for Network {
    fn drop(&mut self) {
        // SAFETY: an owned handle, freed once.
        unsafe { (self.trt.api().trtcache_trt_network_free)(self.ptr.as_ptr()) }
    }
}

/// Shapes of one profile, in the C layout, with the names they point to kept alive.
struct RawProfile {
    _names: Vec<CString>,
    shapes: Vec<ffi::trtcache_trt_profile_shape>,
}

fn raw_profile(p: &ShapeProfile) -> Result<RawProfile, TrtError> {
    let max_dims = ffi::TRTCACHE_TRT_MAX_DIMS as usize;
    let mut names = Vec::new();
    let mut shapes = Vec::new();
    for (input, min) in &p.min {
        let bad = |what: &str| {
            TrtError::InvalidArgument(format!("profile `{}`, input `{input}`: {what}", p.name))
        };
        let opt = p.opt.get(input).ok_or_else(|| bad("no opt shape"))?;
        let max = p.max.get(input).ok_or_else(|| bad("no max shape"))?;
        if opt.len() != min.len() || max.len() != min.len() {
            return Err(bad("min, opt and max have different ranks"));
        }
        if min.len() > max_dims {
            return Err(bad(&format!("rank {} is over {max_dims}", min.len())));
        }
        let name = cstring("input name", input)?;
        let mut s = ffi::trtcache_trt_profile_shape {
            input: name.as_ptr(),
            nb_dims: min.len() as i32,
            ..Default::default()
        };
        s.min[..min.len()].copy_from_slice(min);
        s.opt[..opt.len()].copy_from_slice(opt);
        s.max[..max.len()].copy_from_slice(max);
        names.push(name);
        shapes.push(s);
    }
    for input in p.opt.keys().chain(p.max.keys()) {
        if !p.min.contains_key(input) {
            return Err(TrtError::InvalidArgument(format!(
                "profile `{}`, input `{input}`: no min shape",
                p.name
            )));
        }
    }
    Ok(RawProfile {
        _names: names,
        shapes,
    })
}

impl Network {
    /// The network's inputs and outputs.
    pub fn io(&mut self) -> Result<IoInfo, TrtError> {
        let mut b = ShimBytes::new(self.trt.api());
        // SAFETY: a live handle.
        let st =
            unsafe { (self.trt.api().trtcache_trt_network_io_json)(self.ptr.as_ptr(), &mut b.raw) };
        self.trt.check("network_io_json", st)?;
        Trt::json::<RawIo>("network_io_json", &b.to_vec()).map(IoInfo::from)
    }

    /// Builds a serialized engine.
    pub fn build(&mut self, opts: &BuildOptions) -> Result<Built, TrtError> {
        if let Some(l) = opts.builder_optimization_level {
            if l > 5 {
                return Err(TrtError::InvalidArgument(format!(
                    "builder optimization level {l} is outside 0..=5"
                )));
            }
        }
        let profiles = opts
            .profiles
            .iter()
            .map(raw_profile)
            .collect::<Result<Vec<_>, _>>()?;
        let raw_profiles: Vec<ffi::trtcache_trt_profile> = profiles
            .iter()
            .map(|p| ffi::trtcache_trt_profile {
                shapes: p.shapes.as_ptr(),
                nb_shapes: p.shapes.len(),
            })
            .collect();
        let raw = ffi::trtcache_trt_build_options {
            precision_flags: opts.precision.flags(),
            workspace_bytes: opts.workspace_bytes.unwrap_or(0),
            builder_optimization_level: opts.builder_optimization_level.map_or(-1, i32::from),
            hardware_compatibility_level: opts.hardware_compatibility.raw(),
            profiles: if raw_profiles.is_empty() {
                ptr::null()
            } else {
                raw_profiles.as_ptr()
            },
            nb_profiles: raw_profiles.len(),
            timing_cache: if opts.timing_cache.is_empty() {
                ptr::null()
            } else {
                opts.timing_cache.as_ptr()
            },
            timing_cache_len: opts.timing_cache.len(),
        };
        let api = self.trt.api();
        let mut plan = ShimBytes::new(api);
        let mut cache = ShimBytes::new(api);
        // SAFETY: `raw` and everything it points to (profiles, names, cache) outlive the call.
        let st = unsafe {
            (api.trtcache_trt_build)(self.ptr.as_ptr(), &raw, &mut plan.raw, &mut cache.raw)
        };
        self.trt.check("build", st)?;
        Ok(Built {
            plan: plan.to_vec(),
            timing_cache: cache.to_vec(),
        })
    }
}

/// A deserialized engine with its execution context.
pub struct Engine {
    trt: Trt,
    ptr: NonNull<ffi::trtcache_trt_engine>,
}

// SAFETY: as for Network: one thread at a time (&mut self for every call).
unsafe impl Send for Engine {}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: an owned handle, freed once.
        unsafe { (self.trt.api().trtcache_trt_engine_free)(self.ptr.as_ptr()) }
    }
}

struct ShimOutputs<'a> {
    api: &'a ffi::TrtShim,
    ptr: *mut ffi::trtcache_trt_outputs,
}

impl Drop for ShimOutputs<'_> {
    fn drop(&mut self) {
        // SAFETY: an owned handle (or null), freed once.
        unsafe { (self.api.trtcache_trt_outputs_free)(self.ptr) }
    }
}

impl Engine {
    /// The engine's I/O tensors and number of profiles.
    pub fn io(&mut self) -> Result<IoInfo, TrtError> {
        let mut b = ShimBytes::new(self.trt.api());
        // SAFETY: a live handle.
        let st =
            unsafe { (self.trt.api().trtcache_trt_engine_io_json)(self.ptr.as_ptr(), &mut b.raw) };
        self.trt.check("engine_io_json", st)?;
        Trt::json::<RawIo>("engine_io_json", &b.to_vec()).map(IoInfo::from)
    }

    /// The engine inspector's layer information.
    pub fn inspect(&mut self) -> Result<serde_json::Value, TrtError> {
        let mut b = ShimBytes::new(self.trt.api());
        // SAFETY: a live handle.
        let st = unsafe {
            (self.trt.api().trtcache_trt_engine_inspect_json)(self.ptr.as_ptr(), &mut b.raw)
        };
        self.trt.check("engine_inspect_json", st)?;
        Trt::json("engine_inspect_json", &b.to_vec())
    }

    /// Runs once on host tensors with optimization profile `profile`.
    pub fn run(
        &mut self,
        profile: u32,
        inputs: &[HostTensor],
    ) -> Result<Vec<HostTensor>, TrtError> {
        let max_dims = ffi::TRTCACHE_TRT_MAX_DIMS as usize;
        let names = inputs
            .iter()
            .map(|t| cstring("input name", &t.name))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raw = Vec::with_capacity(inputs.len());
        for (t, name) in inputs.iter().zip(&names) {
            if t.shape.len() > max_dims {
                return Err(TrtError::InvalidArgument(format!(
                    "input `{}`: rank {} is over {max_dims}",
                    t.name,
                    t.shape.len()
                )));
            }
            let mut r = ffi::trtcache_trt_tensor {
                name: name.as_ptr(),
                dtype: t.dtype.code() as i32,
                nb_dims: t.shape.len() as i32,
                data: t.data.as_ptr().cast(),
                bytes: t.data.len(),
                ..Default::default()
            };
            r.dims[..t.shape.len()].copy_from_slice(&t.shape);
            raw.push(r);
        }
        let profile = i32::try_from(profile)
            .map_err(|_| TrtError::InvalidArgument(format!("profile {profile} is too large")))?;
        let api = self.trt.api();
        let mut out = ShimOutputs {
            api,
            ptr: ptr::null_mut(),
        };
        // SAFETY: `raw`, the names and the data it points to outlive the call.
        let st = unsafe {
            (api.trtcache_trt_engine_run)(
                self.ptr.as_ptr(),
                profile,
                raw.as_ptr(),
                raw.len(),
                &mut out.ptr,
            )
        };
        self.trt.check("engine_run", st)?;
        // SAFETY: a live outputs handle.
        let n = unsafe { (api.trtcache_trt_outputs_count)(out.ptr) };
        let mut res = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: i < count; the tensor lives until `out` is dropped (after this loop).
            let t = unsafe { (api.trtcache_trt_outputs_get)(out.ptr, i).as_ref() }.ok_or_else(
                || TrtError::Call {
                    call: "outputs_get",
                    status: Status::Internal,
                    message: format!("output {i} of {n} missing"),
                },
            )?;
            let rank = usize::try_from(t.nb_dims).unwrap_or(usize::MAX);
            if rank > max_dims || t.name.is_null() || (t.data.is_null() && t.bytes > 0) {
                return Err(TrtError::Call {
                    call: "outputs_get",
                    status: Status::Internal,
                    message: format!("output {i}: malformed tensor from the shim"),
                });
            }
            // SAFETY: checked non-null above; NUL-terminated names and `bytes` bytes of data
            // owned by `out`.
            let name = unsafe { CStr::from_ptr(t.name) }
                .to_string_lossy()
                .into_owned();
            let data = if t.bytes == 0 {
                Vec::new()
            } else {
                // SAFETY: as above.
                unsafe { std::slice::from_raw_parts(t.data.cast::<u8>(), t.bytes) }.to_vec()
            };
            res.push(HostTensor {
                name,
                dtype: DType::from_code(t.dtype as u32),
                shape: t.dims[..rank].to_vec(),
                data,
            });
        }
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode() {
        assert_eq!(TrtVersion::from_raw(101601).to_string(), "10.16.1");
        assert_eq!(TrtVersion::from_raw(110100).to_string(), "11.1.0");
        assert_eq!(TrtVersion::from_raw(8601).to_string(), "8.6.1");
    }

    #[test]
    fn half_converts() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    }

    #[test]
    fn precision_round_trips() {
        let p = Precision::parse("fp16, no-tf32").unwrap();
        assert_eq!(p.canonical(), "fp16,no-tf32");
        assert_eq!(
            p.flags(),
            ffi::TRTCACHE_TRT_PRECISION_FP16 | ffi::TRTCACHE_TRT_PRECISION_NO_TF32
        );
        assert_eq!(Precision::parse("fp32").unwrap().canonical(), "fp32");
        assert!(Precision::parse("fp64").is_err());
    }

    #[test]
    fn profiles_are_checked_before_the_boundary() {
        let mut p = ShapeProfile::default();
        p.min.insert("x".into(), vec![1, 4]);
        p.opt.insert("x".into(), vec![2, 4]);
        assert!(raw_profile(&p).is_err(), "no max");
        p.max.insert("x".into(), vec![8, 4, 1]);
        assert!(raw_profile(&p).is_err(), "rank mismatch");
        p.max.insert("x".into(), vec![8, 4]);
        let r = raw_profile(&p).unwrap();
        assert_eq!(r.shapes[0].nb_dims, 2);
        assert_eq!(&r.shapes[0].max[..2], &[8, 4]);
        p.opt.insert("y".into(), vec![1]);
        assert!(raw_profile(&p).is_err(), "y has no min");
    }
}
