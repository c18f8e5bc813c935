//! The facts the analysis stages share: symbolic dimensions ([`SymDim`]), what is known about
//! one tensor ([`TensorFacts`]) and every tensor of a graph ([`GraphFacts`]), value classes,
//! data-dependent-shape origins ([`DdsOrigin`]), a rule's answer for one output ([`Out`]) and
//! the shape arithmetic every rule uses (broadcasting, axes, products).
//!
//! A leaf of `analysis/`: `shapes` walks graphs and fills these, `infer` and `layout` hold the
//! per-operator rules, `dds`, `restrict` and `partition` read them. Nothing here imports
//! another analysis file.

use serde::Serialize;

use crate::onnx::facts::Dim;
use crate::onnx::proto::TensorProto;
use crate::onnx::ElemType;

pub use crate::onnx::fxhash::{FastMap, FastSet};

/// Largest integer tensor whose values are tracked (TensorRT's shape-tensor limit is 64).
pub const MAX_TRACKED_VALUES: usize = 64;

/// One dimension (or one element of a tracked integer value).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SymDim {
    Known(i64),
    /// A named symbol (`batch`), equal wherever the same name appears.
    Sym(std::sync::Arc<str>),
    Unknown,
}

impl SymDim {
    pub fn known(&self) -> Option<i64> {
        match self {
            SymDim::Known(v) => Some(*v),
            _ => None,
        }
    }
}

impl std::fmt::Display for SymDim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SymDim::Known(v) => write!(f, "{v}"),
            SymDim::Sym(s) => f.write_str(s),
            SymDim::Unknown => f.write_str("?"),
        }
    }
}

/// Where a tensor's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ValueClass {
    /// Initializers, Constant nodes and anything computed only from them.
    Constant,
    /// Computed only from the shapes of tensors and constants.
    ShapeDerived,
    /// Depends on the data of a graph input (or on randomness).
    DataDerived,
}

/// What is known about one tensor.
#[derive(Clone, Debug)]
pub struct TensorFacts {
    pub dtype: Option<ElemType>,
    /// `None` when even the rank is unknown.
    pub shape: Option<Vec<SymDim>>,
    pub class: ValueClass,
    /// Elements of a small integer/bool tensor when known (row-major).
    pub value: Option<Vec<SymDim>>,
    /// Index into [`GraphFacts::dds`] of the data-dependent-shape origin this tensor's shape
    /// inherits, if any.
    pub dds: Option<usize>,
    /// What TensorRT's ONNX parser imports as weights rather than as a tensor: an
    /// initializer (not overridable by a graph input), or the output of a `Constant` node
    /// (onnx-tensorrt's Constant importer returns weights). Inputs TensorRT requires "to be an
    /// initializer" accept both; exporters (optimum at opset 18, onnxruntime-genai) write
    /// reduction axes as Constant nodes.
    pub weights: bool,
}

impl TensorFacts {
    pub fn unknown(class: ValueClass) -> Self {
        Self {
            dtype: None,
            shape: None,
            class,
            value: None,
            dds: None,
            weights: false,
        }
    }

    /// Size in bytes when element type and every dimension are known.
    pub fn bytes(&self) -> Option<u64> {
        let mut n: u64 = 1;
        for d in self.shape.as_ref()? {
            n = n.checked_mul(u64::try_from(d.known()?).ok()?)?;
        }
        self.dtype?.bytes_for(n)
    }

    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(|s| s.len())
    }
}

/// Facts about every tensor of one graph.
#[derive(Debug, Default)]
pub struct GraphFacts<'a> {
    /// Keyed by names borrowed from the model (no copy per tensor).
    pub tensors: FastMap<&'a str, TensorFacts>,
    /// Data-dependent-shape origins, in discovery order.
    pub dds: Vec<DdsOrigin>,
}

impl GraphFacts<'_> {
    pub fn get(&self, name: &str) -> Option<&TensorFacts> {
        if name.is_empty() {
            return None;
        }
        self.tensors.get(name)
    }

    /// Tracked integer value of a tensor.
    pub fn value(&self, name: &str) -> Option<&[SymDim]> {
        self.get(name)?.value.as_deref()
    }

    /// Known integer values of a tensor (every element known).
    pub fn known_ints(&self, name: &str) -> Option<Vec<i64>> {
        self.value(name)?.iter().map(|d| d.known()).collect()
    }

    pub fn class(&self, name: &str) -> ValueClass {
        self.get(name)
            .map(|t| t.class)
            .unwrap_or(ValueClass::DataDerived)
    }
}

/// Converts a declared dimension.
pub fn from_dim(d: &Dim) -> SymDim {
    match d {
        Dim::Fixed(v) if *v >= 0 => SymDim::Known(*v),
        Dim::Named(n) => SymDim::Sym(n.as_str().into()),
        _ => SymDim::Unknown,
    }
}

/// Reads the elements of a small integer or bool tensor; `None` for other types, external
/// data or more than [`MAX_TRACKED_VALUES`] elements.
pub fn tensor_ints(t: &TensorProto) -> Option<Vec<i64>> {
    let n = crate::onnx::load::numel(&t.dims)?;
    if n > MAX_TRACKED_VALUES as u64 {
        return None;
    }
    let n = n as usize;
    let et = ElemType::from_code(t.data_type);
    let raw = &t.raw_data;
    let out: Vec<i64> = match et {
        ElemType::Int64 if !raw.is_empty() => raw
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        ElemType::Int64 => t.int64_data.clone(),
        ElemType::Int32 if !raw.is_empty() => raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect(),
        ElemType::Int32 | ElemType::Bool | ElemType::Int8 | ElemType::Uint8 if raw.is_empty() => {
            t.int32_data.iter().map(|&v| v as i64).collect()
        }
        ElemType::Bool | ElemType::Uint8 => raw.iter().map(|&b| b as i64).collect(),
        ElemType::Int8 => raw.iter().map(|&b| b as i8 as i64).collect(),
        _ => return None,
    };
    (out.len() == n).then_some(out)
}

/// Info for an initializer or constant tensor.
pub fn tensor_info(t: &TensorProto) -> TensorFacts {
    TensorFacts {
        dtype: Some(ElemType::from_code(t.data_type)),
        shape: Some(
            t.dims
                .iter()
                .map(|&d| {
                    if d >= 0 {
                        SymDim::Known(d)
                    } else {
                        SymDim::Unknown
                    }
                })
                .collect(),
        ),
        class: ValueClass::Constant,
        value: tensor_ints(t).map(|v| v.into_iter().map(SymDim::Known).collect()),
        dds: None,
        weights: true,
    }
}

/// Where a data-dependent shape starts.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DdsOrigin {
    /// The first output whose shape depends on data.
    pub tensor: String,
    /// The node's stable name.
    pub node: String,
    pub op_type: String,
    pub why: String,
}

/// What a rule says about one output.
#[derive(Clone, Debug, Default)]
pub struct Out {
    pub dtype: Option<ElemType>,
    pub shape: Option<Vec<SymDim>>,
    pub value: Option<Vec<SymDim>>,
}

/// Normalises a possibly negative axis against `rank`.
pub fn axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

/// Product of dims: known when all are known, the single symbol when the rest multiply to 1.
pub fn prod(dims: &[SymDim]) -> SymDim {
    let mut k: i64 = 1;
    let mut other = None;
    for d in dims {
        match d {
            SymDim::Known(v) => k = k.saturating_mul(*v),
            d if other.is_none() => other = Some(d.clone()),
            _ => return SymDim::Unknown,
        }
    }
    match other {
        None => SymDim::Known(k),
        Some(SymDim::Sym(s)) if k == 1 => SymDim::Sym(s),
        _ => SymDim::Unknown,
    }
}

fn bcast_dim(a: &SymDim, b: &SymDim) -> SymDim {
    use SymDim::*;
    match (a, b) {
        (x, y) if x == y && *x != Unknown => x.clone(),
        (Known(1), y) | (y, Known(1)) => y.clone(),
        (Known(x), _) | (_, Known(x)) if *x != 1 => {
            // A valid model broadcasts the other side (1 or x) to x, unless both are known
            // and differ, which is an invalid model.
            match (a, b) {
                (Known(p), Known(q)) if p != q => Unknown,
                _ => Known(*x),
            }
        }
        _ => Unknown,
    }
}

/// Multidirectional (numpy) broadcasting of known-rank shapes.
pub fn broadcast(shapes: &[&[SymDim]]) -> Vec<SymDim> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    (0..rank)
        .map(|i| {
            let mut acc = SymDim::Known(1);
            for s in shapes {
                if let Some(d) = (i + s.len()).checked_sub(rank).and_then(|j| s.get(j)) {
                    acc = bcast_dim(&acc, d);
                }
            }
            acc
        })
        .collect()
}
