//! The shared vocabulary every stage speaks: which [`Backend`] builds an artifact, which
//! execution [`Provider`]s it registers, the numeric [`Precision`] and its [`Tolerance`], a
//! [`ShapeProfile`], and the [`CacheKey`] an artifact is stored under.
//!
//! A leaf: nothing here imports another module of the crate. Backend and provider names
//! appear as strings only in this file, which parses and prints them; everything else
//! matches on the enums.
//!
//! Enters: names from flags, config, sidecars and the wire. Leaves: typed values.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A name that is not one of the known values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("unknown backend `{0}` (known: {known})", known = Backend::names().join(", "))]
    UnknownBackend(String),
    #[error("unknown provider `{0}` (known: tensorrt, cuda, cpu)")]
    UnknownProvider(String),
    #[error("unknown precision `{0}` (known: fp32, fp16)")]
    BadPrecision(String),
    #[error("`{0}` is not a cache key (64 hex digits)")]
    BadKey(String),
}

/// A way of building and serving artifacts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// ONNX Runtime's CPU provider: an offline-optimized model for this CPU SKU.
    OrtCpu,
    /// ONNX Runtime's CUDA provider: an offline-optimized model for this GPU SKU.
    OrtCuda,
    /// ONNX Runtime's TensorRT provider: an EP-context model with the engine embedded.
    OrtTensorRt,
    /// TensorRT itself, through the project's shim (`include/trtcache_trt.h`): a plain
    /// serialized engine (`engine.plan`) plus its metadata, for consumers that load engines.
    Trt,
}

impl Backend {
    /// Every backend, in the order help texts list them.
    pub const ALL: [Backend; 4] = [
        Backend::OrtCpu,
        Backend::OrtCuda,
        Backend::OrtTensorRt,
        Backend::Trt,
    ];

    /// The default backend: the one that runs on every host.
    pub const DEFAULT: Backend = Backend::OrtCpu;

    /// The name used in flags, config, sidecars, keys and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::OrtCpu => "ort-cpu",
            Backend::OrtCuda => "ort-cuda",
            Backend::OrtTensorRt => "ort-tensorrt",
            Backend::Trt => "trt",
        }
    }

    /// Every backend's name.
    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|b| b.as_str()).collect()
    }

    /// Whether the artifact is built for (and keyed by) an NVIDIA GPU.
    pub fn is_gpu(self) -> bool {
        !matches!(self, Backend::OrtCpu)
    }

    /// Whether the backend builds with TensorRT (its version goes into the key).
    pub fn uses_tensorrt(self) -> bool {
        matches!(self, Backend::OrtTensorRt | Backend::Trt)
    }

    /// Whether the artifact is an ONNX model an ONNX Runtime session opens (every backend
    /// but `trt`, whose artifact is a TensorRT engine).
    pub fn is_onnx(self) -> bool {
        !matches!(self, Backend::Trt)
    }

    /// The execution providers a session on this backend's artifact registers, in ONNX
    /// Runtime's priority order (`trt`: TensorRT alone, which must take every node).
    pub fn providers(self) -> &'static [Provider] {
        match self {
            Backend::OrtCpu => &[Provider::Cpu],
            Backend::OrtCuda => &[Provider::Cuda, Provider::Cpu],
            Backend::OrtTensorRt => &[Provider::TensorRt, Provider::Cuda, Provider::Cpu],
            Backend::Trt => &[Provider::TensorRt],
        }
    }
}

impl Default for Backend {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| SpecError::UnknownBackend(s.to_string()))
    }
}

impl Serialize for Backend {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An execution provider, as ONNX Runtime names them in `--providers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    TensorRt,
    Cuda,
    Cpu,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::TensorRt => "tensorrt",
            Provider::Cuda => "cuda",
            Provider::Cpu => "cpu",
        }
    }

    /// Whether the provider's tensors live in GPU memory.
    pub fn on_device(self) -> bool {
        !matches!(self, Provider::Cpu)
    }

    /// Parses `tensorrt`, `trt`, `cuda`, `cpu` (case-insensitive).
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tensorrt" | "trt" => Ok(Provider::TensorRt),
            "cuda" => Ok(Provider::Cuda),
            "cpu" => Ok(Provider::Cpu),
            other => Err(SpecError::UnknownProvider(other.to_string())),
        }
    }
}

/// Numeric precision of a build.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Fp32,
    Fp16,
}

impl Precision {
    /// `fp32` or `fp16`.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Precision {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fp32" | "float32" => Ok(Precision::Fp32),
            "fp16" | "float16" => Ok(Precision::Fp16),
            _ => Err(SpecError::BadPrecision(s.to_string())),
        }
    }
}

/// Allowed error of a validated output: an element passes when
/// `|actual - expected| <= atol + rtol * |expected|` (numpy's `allclose`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Absolute part (`abs` in records written before the build stage shared this type).
    #[serde(alias = "abs")]
    pub atol: f64,
    /// Relative part (`rel` in older records).
    #[serde(alias = "rel")]
    pub rtol: f64,
}

impl Tolerance {
    /// Defaults: fp32 atol 1e-4 / rtol 1e-3; fp16 atol 1e-2 / rtol 1e-2.
    pub fn default_for(p: Precision) -> Self {
        match p {
            Precision::Fp32 => Tolerance {
                atol: 1e-4,
                rtol: 1e-3,
            },
            Precision::Fp16 => Tolerance {
                atol: 1e-2,
                rtol: 1e-2,
            },
        }
    }

    /// Whether `actual` is close enough to `expected` (NaN never is, unless both are NaN).
    pub fn allows(&self, actual: f64, expected: f64) -> bool {
        if actual.is_nan() || expected.is_nan() {
            return actual.is_nan() && expected.is_nan();
        }
        if actual == expected {
            return true;
        }
        (actual - expected).abs() <= self.atol + self.rtol * expected.abs()
    }
}

/// One named optimisation profile: per input name, the min/opt/max shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeProfile {
    pub name: String,
    pub min: BTreeMap<String, Vec<i64>>,
    pub opt: BTreeMap<String, Vec<i64>>,
    pub max: BTreeMap<String, Vec<i64>>,
}

/// Lower-case hex of bytes (sha2 0.11 digests do not implement `LowerHex`).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// A cache key: SHA-256 of the canonical encoding of the key parts (`key::KeyParts`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// 64 lower-case hex digits.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex digits.
    pub fn parse(s: &str) -> Result<Self, SpecError> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(SpecError::BadKey(s.into()));
        }
        let nib = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            match (nib(b[2 * i]), nib(b[2 * i + 1])) {
                (Some(h), Some(l)) => *o = h << 4 | l,
                _ => return Err(SpecError::BadKey(s.into())),
            }
        }
        Ok(Self(out))
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.hex())
    }
}

impl Serialize for CacheKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for CacheKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CacheKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_round_trip_through_every_parser() {
        for b in Backend::ALL {
            assert_eq!(b.as_str().parse::<Backend>().unwrap(), b);
            let json = serde_json::to_string(&b).unwrap();
            assert_eq!(json, format!("\"{}\"", b.as_str()));
            assert_eq!(serde_json::from_str::<Backend>(&json).unwrap(), b);
        }
        let e = "ort-gpu".parse::<Backend>().unwrap_err().to_string();
        assert!(
            e.contains("ort-gpu") && e.contains("ort-cpu, ort-cuda, ort-tensorrt, trt"),
            "{e}"
        );
        assert!(serde_json::from_str::<Backend>("\"ort-gpu\"").is_err());
    }

    #[test]
    fn gpu_backends_register_cpu_last() {
        for b in Backend::ALL.into_iter().filter(|b| b.is_onnx()) {
            assert_eq!(b.providers().last(), Some(&Provider::Cpu));
            assert_eq!(b.is_gpu(), b.providers().iter().any(|p| p.on_device()));
        }
    }

    #[test]
    fn hex_round_trip() {
        let k = CacheKey([0xab; 32]);
        assert_eq!(CacheKey::parse(&k.hex()).unwrap(), k);
        assert!(CacheKey::parse("xyz").is_err());
        assert!(CacheKey::parse(&"g".repeat(64)).is_err());
    }
}
