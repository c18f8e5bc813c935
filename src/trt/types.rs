//! The plain data of the TensorRT layer: versions, element types, I/O descriptions, the
//! parser's support report, build options (precision flags, hardware-compatibility level,
//! profiles) and host tensors.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::TrtError;
use super::ffi;
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

    /// The ONNX `TensorProto.DataType` code of the type (0 for `Other`).
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::Float32 => 1,
            DType::Uint8 => 2,
            DType::Int8 => 3,
            DType::Int32 => 6,
            DType::Int64 => 7,
            DType::Bool => 9,
            DType::Float16 => 10,
            DType::Bfloat16 => 16,
            DType::Fp8 => 17,
            DType::Int4 => 22,
            DType::Fp4 => 23,
            DType::Other => 0,
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
pub(crate) struct RawTensor {
    name: String,
    dtype: u32,
    shape: Vec<i64>,
}

#[derive(Deserialize)]
pub(crate) struct RawIo {
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

    /// The flags as a canonical comma-separated list (`fp32` when none; `fp32,no-tf32` for
    /// strict fp32), for keys.
    pub fn canonical(self) -> String {
        let reduced = self.fp16 || self.bf16 || self.int8 || self.fp8;
        let mut names: Vec<&str> = if reduced { Vec::new() } else { vec!["fp32"] };
        names.extend(
            [
                (self.fp16, "fp16"),
                (self.bf16, "bf16"),
                (self.int8, "int8"),
                (self.fp8, "fp8"),
                (self.no_tf32, "no-tf32"),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n),
        );
        names.join(",")
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

    pub(crate) fn raw(self) -> i32 {
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
pub fn f16_to_f32(h: u16) -> f32 {
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
}
