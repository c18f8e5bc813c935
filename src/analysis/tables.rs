//! Operator tables compiled into the binary: one TensorRT ONNX-parser table per TensorRT
//! version (`data/trt-<version>.tsv`, from onnx-tensorrt `docs/operators.md`) and ONNX
//! Runtime's CUDA kernel registry with opset ranges (`data/cuda-ep-ops.txt`, from
//! `docs/OperatorKernels.md`). Text enters through `include_str!`; lookups leave as
//! [`TrtTable`] / [`CudaTable`]. Parsing is lenient: a malformed line is skipped, never a panic.

use super::facts::{FastMap as HashMap, FastSet as HashSet};

use crate::onnx::ElemType;

/// TensorRT versions with a bundled table, newest first; the first is the default.
const TRT_TABLES: &[(&str, &str)] = &[
    ("10.15", include_str!("data/trt-10.15.tsv")),
    ("10.1", include_str!("data/trt-10.1.tsv")),
];

const CUDA_TABLE: &str = include_str!("data/cuda-ep-ops.txt");

/// Versions `--trt-version` accepts.
pub fn trt_versions() -> Vec<&'static str> {
    TRT_TABLES.iter().map(|(v, _)| *v).collect()
}

/// The newest bundled TensorRT version.
pub fn default_trt_version() -> &'static str {
    TRT_TABLES[0].0
}

/// The TensorRT version installed here (`libs::tensorrt`, the one search list), as `"X.Y"`;
/// `None` when absent.
pub fn detect_trt_version() -> Option<String> {
    let found = crate::libs::tensorrt()?;
    let mut parts = found.version.split('.');
    Some(format!("{}.{}", parts.next()?, parts.next()?))
}

/// The table to use when `--trt-version` is not given: the installed TensorRT's when it has
/// one, else the newest bundled.
pub fn host_trt_version() -> String {
    match detect_trt_version() {
        Some(v) if trt_versions().contains(&v.as_str()) => v,
        Some(v) => {
            tracing::warn!(
                detected = %v,
                using = default_trt_version(),
                "no operator table for the installed TensorRT; using the newest bundled one"
            );
            default_trt_version().to_string()
        }
        None => default_trt_version().to_string(),
    }
}

/// One operator row of a TensorRT table.
#[derive(Clone, Debug)]
pub struct TrtOp {
    pub supported: bool,
    /// Type tokens as written in the table: `FP32`, `FP16`, `BF16`, `INT32`, `INT64`, …
    pub types: Vec<String>,
    /// The restriction text, paraphrased from the parser's documentation.
    pub restrictions: String,
}

/// What one TensorRT version's ONNX parser takes.
#[derive(Clone, Debug)]
pub struct TrtTable {
    pub version: String,
    pub min_opset: i64,
    pub max_opset: i64,
    pub ops: HashMap<String, TrtOp>,
    /// Ops this version's `supportsModel` reports unsupported regardless of the importer.
    pub dds_filtered: Vec<String>,
    /// `"TensorRT 10.15"`.
    label: String,
}

/// A `--trt-version` that has no bundled table.
#[derive(Debug, thiserror::Error)]
#[error("no TensorRT operator table for version `{asked}`; known versions: {known}")]
pub struct UnknownTrtVersion {
    pub asked: String,
    pub known: String,
}

impl TrtTable {
    /// The table for `version` (`"10.15"`, `"10.1"`, …).
    pub fn load(version: &str) -> Result<Self, UnknownTrtVersion> {
        let (v, text) = TRT_TABLES
            .iter()
            .find(|(v, _)| *v == version)
            .ok_or_else(|| UnknownTrtVersion {
                asked: version.to_string(),
                known: trt_versions().join(", "),
            })?;
        Ok(Self::parse(v, text))
    }

    fn parse(version: &str, text: &str) -> Self {
        let mut t = TrtTable {
            version: version.to_string(),
            min_opset: 1,
            max_opset: i64::MAX,
            ops: HashMap::default(),
            dds_filtered: Vec::new(),
            label: format!("TensorRT {version}"),
        };
        for line in text.lines() {
            if let Some(meta) = line.strip_prefix("# ") {
                let f: Vec<&str> = meta.split('\t').collect();
                match f.as_slice() {
                    ["opset_range", lo, hi] => {
                        t.min_opset = lo.trim().parse().unwrap_or(t.min_opset);
                        t.max_opset = hi.trim().parse().unwrap_or(t.max_opset);
                    }
                    ["dds_filtered", ops] => {
                        t.dds_filtered = ops.split(',').map(|s| s.trim().to_string()).collect();
                    }
                    _ => {}
                }
                continue;
            }
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() < 2 || f[0] == "op" || f[0].is_empty() || f[0].starts_with('#') {
                continue;
            }
            let types = f
                .get(2)
                .map(|s| {
                    s.split(',')
                        .map(|x| x.trim().to_string())
                        .filter(|x| !x.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            t.ops.insert(
                f[0].to_string(),
                TrtOp {
                    supported: f[1].trim() == "Y",
                    types,
                    restrictions: f.get(3).unwrap_or(&"").trim().to_string(),
                },
            );
        }
        t
    }

    /// `"TensorRT 10.15"`.
    pub fn who(&self) -> &str {
        &self.label
    }
}

/// The token the TensorRT table uses for an element type, `None` when TensorRT has no such
/// tensor type at all.
pub fn trt_type_token(t: ElemType) -> Option<&'static str> {
    use ElemType::*;
    Some(match t {
        Float32 => "FP32",
        Float16 => "FP16",
        Bfloat16 => "BF16",
        Int32 => "INT32",
        Int64 => "INT64",
        Bool => "BOOL",
        Int8 => "INT8",
        Uint8 => "UINT8",
        Int4 => "INT4",
        Float8e4m3fn | Float8e4m3fnuz | Float8e5m2 | Float8e5m2fnuz => "FP8",
        Float4e2m1 => "FP4",
        // DOUBLE is cast down to FLOAT by the parser.
        Float64 => "FP32",
        _ => return None,
    })
}

/// Low-precision types TensorRT accepts only through quantize/dequantize.
pub fn is_qdq_only(t: ElemType) -> bool {
    use ElemType::*;
    matches!(
        t,
        Int8 | Int4
            | Uint4
            | Float8e4m3fn
            | Float8e4m3fnuz
            | Float8e5m2
            | Float8e5m2fnuz
            | Float4e2m1
    )
}

/// An opset range of one CUDA kernel registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRange {
    pub from: i64,
    /// Inclusive upper bound; `None` = open-ended (`N+`).
    pub to: Option<i64>,
}

/// ONNX Runtime CUDA execution provider kernels: `ai.onnx` ops with opset ranges and the
/// names registered in `com.microsoft` (all since version 1).
#[derive(Clone, Debug, Default)]
pub struct CudaTable {
    pub onnx: HashMap<String, Vec<KernelRange>>,
    pub microsoft: HashSet<String>,
}

impl CudaTable {
    /// The bundled table.
    pub fn bundled() -> Self {
        Self::parse(CUDA_TABLE)
    }

    fn parse(text: &str) -> Self {
        let mut t = CudaTable::default();
        let mut in_ms = false;
        for line in text.lines() {
            if let Some(c) = line.strip_prefix('#') {
                let c = c.trim();
                if c.starts_with("--- Other CUDA domains") {
                    in_ms = true;
                } else if c.starts_with("com.ms.internal") {
                    in_ms = false;
                }
                if in_ms {
                    let c = c
                        .split_once("com.microsoft:")
                        .map(|(_, r)| r)
                        .unwrap_or(if c.starts_with("---") { "" } else { c });
                    for w in c.split_whitespace() {
                        let w = w.trim_end_matches(['.', ',', ')']).trim_start_matches('(');
                        if w.chars().next().is_some_and(|ch| ch.is_ascii_uppercase())
                            && w.chars().all(|ch| ch.is_ascii_alphanumeric())
                        {
                            t.microsoft.insert(w.to_string());
                        }
                    }
                }
                continue;
            }
            let Some((op, ranges)) = line.split_once(':') else {
                continue;
            };
            let op = op.trim();
            if op.is_empty() || !op.chars().all(|c| c.is_ascii_alphanumeric()) {
                continue;
            }
            let ranges = ranges.split("(from").next().unwrap_or("");
            let mut out = Vec::new();
            let mut rest = ranges;
            while let Some(tok) = next_range(&mut rest) {
                out.push(tok);
            }
            if !out.is_empty() {
                t.onnx.entry(op.to_string()).or_default().extend(out);
            }
        }
        t
    }

    /// Whether a CUDA kernel covers `op` of `domain` at ai.onnx opset `opset`.
    ///
    /// The kernel is matched by opset containment: ONNX Runtime matches by the since-version
    /// of the op's schema at the model's opset, which needs ONNX's schema history; an
    /// open-ended `N+` registration is taken to cover every later opset.
    pub fn covers(&self, domain: &str, op: &str, opset: i64) -> bool {
        match domain {
            "" | "ai.onnx" => self.onnx.get(op).is_some_and(|rs| {
                rs.iter()
                    .any(|r| r.from <= opset && r.to.is_none_or(|to| opset <= to))
            }),
            "com.microsoft" => self.microsoft.contains(op),
            _ => false,
        }
    }

    /// Why the CUDA kernel of a node it [`covers`](Self::covers) cannot take these element
    /// types (`types`: the node's input and output tensors with known types, inputs first;
    /// `first`: input 0's), or `None`. No CUDA kernel has string tensors (every kernel's
    /// type constraints are fixed-size types); a few kernels take fewer types than the op
    /// (the "Types Supported" column the bundled table cites: ArgMax/ArgMin float, double
    /// and half only; GridSample float; NonZero bool, float, half, int32, int64, uint8;
    /// Resize double, float, half, int32, uint8).
    pub fn type_reason<'n>(
        &self,
        op: &str,
        first: Option<ElemType>,
        mut types: impl Iterator<Item = (&'n str, ElemType)>,
    ) -> Option<String> {
        use ElemType::*;
        if let Some((name, _)) = types.find(|(_, t)| *t == String) {
            return Some(format!(
                "ONNX Runtime's CUDA provider has no string kernels (`{name}` is a string tensor)"
            ));
        }
        let takes: &[ElemType] = match op {
            "ArgMax" | "ArgMin" => &[Float32, Float64, Float16],
            "GridSample" => &[Float32],
            "NonZero" => &[Bool, Float32, Float16, Int32, Int64, Uint8],
            "Resize" => &[Float64, Float32, Float16, Int32, Uint8],
            _ => return None,
        };
        let t = first.filter(|t| !takes.contains(t))?;
        let list: Vec<std::borrow::Cow<'_, str>> = takes.iter().map(|t| t.name()).collect();
        Some(format!(
            "ONNX Runtime's CUDA `{op}` kernel does not take {t} input (takes {})",
            list.join(", ")
        ))
    }

    /// Whether any CUDA kernel exists for `op` in `domain`, at any opset.
    pub fn has_any(&self, domain: &str, op: &str) -> bool {
        match domain {
            "" | "ai.onnx" => self.onnx.contains_key(op),
            "com.microsoft" => self.microsoft.contains(op),
            _ => false,
        }
    }
}

/// Parses the next `N+`, `[a,b]` or `N` from a comma-separated list.
fn next_range(rest: &mut &str) -> Option<KernelRange> {
    let s = rest.trim_start_matches([' ', ',']);
    if s.is_empty() {
        return None;
    }
    if let Some(inner) = s.strip_prefix('[') {
        let end = inner.find(']')?;
        let (a, b) = inner[..end].split_once(',')?;
        *rest = &inner[end + 1..];
        return Some(KernelRange {
            from: a.trim().parse().ok()?,
            to: Some(b.trim().parse().ok()?),
        });
    }
    let end = s.find(',').unwrap_or(s.len());
    let tok = s[..end].trim();
    *rest = &s[end..];
    if let Some(n) = tok.strip_suffix('+') {
        return Some(KernelRange {
            from: n.trim().parse().ok()?,
            to: None,
        });
    }
    let n: i64 = tok.split_whitespace().next()?.parse().ok()?;
    Some(KernelRange {
        from: n,
        to: Some(n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trt_tables_parse() {
        let t = TrtTable::load("10.15").unwrap();
        assert_eq!((t.min_opset, t.max_opset), (9, 24));
        assert_eq!(t.ops.len(), 200);
        assert_eq!(t.ops.values().filter(|o| o.supported).count(), 158);
        assert!(t.ops["Conv"].types.contains(&"FP32".to_string()));
        assert!(!t.ops["Unique"].supported);
        let old = TrtTable::load("10.1").unwrap();
        assert_eq!(old.max_opset, 20);
        assert!(!old.ops.contains_key("Attention"));
        assert!(!old.ops["STFT"].supported);
        assert_eq!(old.dds_filtered.len(), 3);
        assert!(TrtTable::load("7.0").is_err());
    }

    #[test]
    fn cuda_table_parses_ranges() {
        let c = CudaTable::bundled();
        assert!(c.covers("", "Add", 17));
        assert!(c.covers("", "Add", 7));
        assert!(!c.covers("", "Add", 6));
        assert!(c.covers("", "NonZero", 13));
        assert!(c.covers("", "NonMaxSuppression", 11));
        assert!(c.covers("", "Scatter", 10));
        assert!(!c.covers("", "Scatter", 11));
        assert!(!c.covers("", "Unique", 17));
        assert!(c.covers("com.microsoft", "FusedMatMul", 1));
        assert!(c.covers("com.microsoft", "SkipLayerNormalization", 1));
        assert!(!c.covers("com.example", "Scale", 17));
        assert_eq!(c.onnx["Reshape"][0], KernelRange { from: 23, to: None });
    }
}
