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

/// An execution provider, as ONNX Runtime names them in `--providers`. Serialized (in
/// `inspect --json`, partition manifests) by its short name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

    /// ONNX Runtime's own name of the provider (`TensorrtExecutionProvider`, …).
    pub fn ort_name(self) -> &'static str {
        match self {
            Provider::TensorRt => "TensorrtExecutionProvider",
            Provider::Cuda => "CUDAExecutionProvider",
            Provider::Cpu => "CPUExecutionProvider",
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

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Provider {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
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
/// `|actual - expected| <= atol + rtol * |expected|` (numpy's `allclose`); an element of a
/// float16 or bfloat16 output also passes within `ulps` steps of its own type
/// ([`Tolerance::half_bound`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Absolute part (`abs` in records written before the build stage shared this type).
    #[serde(alias = "abs")]
    pub atol: f64,
    /// Relative part (`rel` in older records).
    #[serde(alias = "rel")]
    pub rtol: f64,
    /// Steps of a float16/bfloat16 output's own type an element may differ by, at the
    /// output's scale (`None`: [`DEFAULT_HALF_ULPS`]). float32, float64 and integer outputs
    /// ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ulps: Option<f64>,
}

/// Default [`Tolerance::ulps`]: 8 steps of float16 (bfloat16) at the output's scale. One step
/// is the output's own rounding, which any reordering of the sums before it can flip (a
/// float16 output in [2, 4) moves by 1.95e-3, over fp32's 1e-4 + 1e-3·|ref| where the values
/// are small); the rest is the half steps of intermediate float16 tensors that an optimized
/// graph keeps in float32 (fused or cast-eliminated) and the reference rounds, carried to
/// the output, more of them the deeper the graph. Measured: up to 2 steps on a float16
/// LayerNorm, 3 on a 2-layer BERT converted by ONNX Runtime's float16 converter (at 1 to 32
/// × 64 tokens); 8 leaves room for deeper graphs. It is 0.8 % of the output's scale in
/// float16 (6 % in bfloat16, whose step is 8 times coarser), stricter than fp16 builds'
/// own tolerance (1e-2 + 1e-2·|ref|: about 10 float16 steps); a dropped bias or a wrong
/// fusion moves outputs by a bias's or an activation's size, far more.
pub const DEFAULT_HALF_ULPS: f64 = 8.0;

/// The comparison rule of float16/bfloat16 outputs ([`Tolerance::half_bound`]), as the key of
/// a model with such outputs records it (key option `validation`): artifacts the rule accepts
/// are not those an older trtcache accepted, so they are never looked up under its keys.
pub const HALF_RULE: &str = "half-ulps-v1";

/// The resolution of a float32/float64 output computed from activations quantized to 8 bits
/// at run time (`DynamicQuantizeLinear` upstream: [`crate::onnx::resolution`]): one step is
/// 1/255 of the reference output's range (max − min), and an element passes within
/// [`Tolerance::ulps`] (default [`DEFAULT_HALF_ULPS`]) such steps. ONNX Runtime's optimized
/// graph sums in another order than the unoptimized reference, which moves some activation
/// across a rounding boundary of its quantizer; every layer after it then differs by about a
/// step. Measured on an int8 T5 encoder shipped in a wheel (`quantize_dynamic`, 8 layers, 2 ×
/// 16 tokens, 12 random draws): bit-identical on 7, 0.6 to 4.2 steps on the other 5, at
/// `basic` as at `all`. Eight steps is 3 % of the output's range: a dropped layer, bias or
/// scale moves outputs by far more; an error below that is not seen in such a model.
pub const DYNAMIC_INT8: &str = "int8-dynamic";

/// The comparison rule of [`DYNAMIC_INT8`] outputs, as the key of a model with such outputs
/// records it (key option `validation`).
pub const DYNAMIC_INT8_RULE: &str = "int8-dynamic-steps-v1";

/// Whether `elem` (an element type name: `float16`, `bfloat16`, …) is compared in steps of
/// its own type.
pub fn is_half(elem: &str) -> bool {
    matches!(elem, "float16" | "bfloat16")
}

/// The spacing of `elem`'s representable values at `magnitude` (its ulp there): 2^(e − p)
/// for a magnitude in [2^e, 2^(e+1)) with p mantissa bits, the subnormal spacing below the
/// smallest normal. `None` for types without a float step (integers, strings, float8).
pub fn float_step(elem: &str, magnitude: f64) -> Option<f64> {
    let (mantissa, min_exp) = match elem {
        "float16" => (10, -14),
        "bfloat16" => (7, -126),
        "float32" | "float" | "complex64" => (23, -126),
        "float64" | "double" | "complex128" => (52, -1022),
        _ => return None,
    };
    let m = magnitude.abs();
    let exp = if m.is_finite() && m > 0.0 {
        // A positive normal f64's unbiased exponent; f64 subnormals are below every min_exp.
        ((m.to_bits() >> 52) & 0x7ff) as i32 - 1023
    } else {
        min_exp
    };
    Some(2f64.powi(exp.max(min_exp) - mantissa))
}

impl Tolerance {
    /// Defaults: fp32 atol 1e-4 / rtol 1e-3; fp16 atol 1e-2 / rtol 1e-2; float16/bfloat16
    /// outputs also [`DEFAULT_HALF_ULPS`] steps of their type.
    pub fn default_for(p: Precision) -> Self {
        match p {
            Precision::Fp32 => Tolerance {
                atol: 1e-4,
                rtol: 1e-3,
                ulps: None,
            },
            Precision::Fp16 => Tolerance {
                atol: 1e-2,
                rtol: 1e-2,
                ulps: None,
            },
        }
    }

    /// [`Tolerance::ulps`] or its default.
    pub fn half_ulps(&self) -> f64 {
        self.ulps.unwrap_or(DEFAULT_HALF_ULPS)
    }

    /// The allowed error of one element of an `elem` output whose reference is `expected`
    /// and whose scale (the root mean square of the reference's finite values) is `scale`:
    /// `max(atol + rtol·|expected|, ulps · step(max(|expected|, scale)))` for float16 and
    /// bfloat16, `atol + rtol·|expected|` for every other type. The step is taken at the
    /// output's scale as well as the element's: a float16 element near zero that a sum of
    /// larger terms produced carries their rounding, not its own.
    ///
    /// For [`DYNAMIC_INT8`] outputs `scale` is the output's int8 step ((max − min) / 255 of
    /// the reference): `max(atol + rtol·|expected|, ulps · scale)`.
    pub fn half_bound(&self, elem: &str, expected: f64, scale: f64) -> f64 {
        let plain = self.atol + self.rtol * expected.abs();
        if elem == DYNAMIC_INT8 && !plain.is_nan() {
            return plain.max(self.half_ulps() * scale);
        }
        // A NaN bound (a library caller's NaN tolerance) stays NaN: it passes nothing.
        if !is_half(elem) || plain.is_nan() {
            return plain;
        }
        match float_step(elem, expected.abs().max(scale)) {
            Some(step) => plain.max(self.half_ulps() * step),
            None => plain,
        }
    }

    /// The rule an `elem` output's float elements are held to, as records say it.
    pub fn rule(&self, elem: &str) -> String {
        if elem == DYNAMIC_INT8 {
            format!(
                "max(atol + rtol·|ref|, {} int8 steps of (max(ref) − min(ref)) / 255: activations quantized at run time)",
                self.half_ulps()
            )
        } else if is_half(elem) {
            format!(
                "max(atol + rtol·|ref|, {} {elem} steps at max(|ref|, rms(ref)))",
                self.half_ulps()
            )
        } else {
            "atol + rtol·|ref|".into()
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
    fn float_steps_are_each_types_ulp() {
        // float16: 2^-10 in [1, 2), 2^-9 in [2, 4) (the 1.953e-3 of a float16 output), the
        // subnormal 2^-24 near zero.
        assert_eq!(float_step("float16", 1.0), Some(2f64.powi(-10)));
        assert_eq!(float_step("float16", 1.999), Some(2f64.powi(-10)));
        assert_eq!(float_step("float16", -3.0), Some(1.953125e-3));
        assert_eq!(float_step("float16", 0.0), Some(2f64.powi(-24)));
        assert_eq!(float_step("float16", 1e-9), Some(2f64.powi(-24)));
        assert_eq!(float_step("bfloat16", 1.0), Some(2f64.powi(-7)));
        assert_eq!(float_step("float32", 1.0), Some(f32::EPSILON as f64));
        assert_eq!(float_step("float64", 1.0), Some(f64::EPSILON));
        assert_eq!(
            float_step("float64", f64::MIN_POSITIVE / 4.0),
            Some(2f64.powi(-1074))
        );
        assert_eq!(float_step("int64", 1.0), None);
        assert_eq!(float_step("float16", f64::NAN), Some(2f64.powi(-24)));
    }

    #[test]
    fn only_half_outputs_get_steps_of_their_type() {
        let t = Tolerance::default_for(Precision::Fp32);
        // One float16 step at 2.5 (1.95e-3) is within 8 steps; at fp32 it is what it was.
        assert!(t.half_bound("float16", 0.05, 0.0) >= 8.0 * 2f64.powi(-15));
        assert!(t.half_bound("float16", 2.5, 0.0) >= 1.953125e-3 * 8.0);
        assert_eq!(t.half_bound("float32", 2.5, 0.0), 1e-4 + 1e-3 * 2.5);
        assert_eq!(t.half_bound("float64", 0.01, 3.0), 1e-4 + 1e-3 * 0.01);
        // An element near zero in an output of scale 3 gets steps at 3.
        assert_eq!(t.half_bound("float16", 0.01, 3.0), 8.0 * 1.953125e-3);
        assert_eq!(t.half_bound("bfloat16", 1.0, 0.0), 8.0 * 2f64.powi(-7));
        let one = Tolerance {
            ulps: Some(1.0),
            ..t
        };
        assert_eq!(one.half_bound("float16", 0.01, 3.0), 1.953125e-3);
        let nan = Tolerance {
            atol: f64::NAN,
            ..t
        };
        assert!(nan.half_bound("float16", 1.0, 1.0).is_nan());
        assert!(t.rule("float16").contains("8 float16 steps"));
        assert_eq!(t.rule("float32"), "atol + rtol·|ref|");
    }

    #[test]
    fn tolerances_without_ulps_read_and_write_as_before() {
        let t: Tolerance = serde_json::from_str(r#"{"abs":1e-4,"rel":1e-3}"#).unwrap();
        assert_eq!(t, Tolerance::default_for(Precision::Fp32));
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"atol":0.0001,"rtol":0.001}"#
        );
        let t: Tolerance = serde_json::from_str(r#"{"atol":0,"rtol":0,"ulps":1}"#).unwrap();
        assert_eq!(t.half_ulps(), 1.0);
    }

    #[test]
    fn hex_round_trip() {
        let k = CacheKey([0xab; 32]);
        assert_eq!(CacheKey::parse(&k.hex()).unwrap(), k);
        assert!(CacheKey::parse("xyz").is_err());
        assert!(CacheKey::parse(&"g".repeat(64)).is_err());
    }
}
