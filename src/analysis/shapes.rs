//! Symbolic shapes, element types and value classes of every tensor of one graph.
//!
//! Enters: a [`Graph`] view, the node order to walk, the model's ai.onnx opset and, for
//! If/Loop/Scan bodies, the facts of the enclosing graph (outer-scope captures). Leaves:
//! [`GraphFacts`], a map from tensor name to [`TensorInfo`]. Per-op rules live in
//! [`super::infer`]; data-dependent-shape origins are recorded here as the walk goes
//! (see [`super::dds`]) because a `Shape` of a data-dependent tensor is itself data-derived.
//!
//! Unknown stays unknown: a rule that cannot be sure yields [`SymDim::Unknown`] or no shape.

use serde::Serialize;

use super::dds::{self, DdsOrigin};
use super::infer;
use crate::onnx::facts::{elem_type_of, shape_of, Dim};
use crate::onnx::graph::Graph;
use crate::onnx::proto::{NodeProto, TensorProto};
use crate::onnx::ElemType;

pub use crate::onnx::fxhash::{FastMap, FastSet, FxHasher};

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
pub struct TensorInfo {
    pub dtype: Option<ElemType>,
    /// `None` when even the rank is unknown.
    pub shape: Option<Vec<SymDim>>,
    pub class: ValueClass,
    /// Elements of a small integer/bool tensor when known (row-major).
    pub value: Option<Vec<SymDim>>,
    /// Index into [`GraphFacts::dds`] of the data-dependent-shape origin this tensor's shape
    /// inherits, if any.
    pub dds: Option<usize>,
    /// Produced by an initializer (not overridable by a graph input).
    pub initializer: bool,
}

impl TensorInfo {
    pub fn unknown(class: ValueClass) -> Self {
        Self {
            dtype: None,
            shape: None,
            class,
            value: None,
            dds: None,
            initializer: false,
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
    pub tensors: FastMap<&'a str, TensorInfo>,
    /// Data-dependent-shape origins, in discovery order.
    pub dds: Vec<DdsOrigin>,
}

impl GraphFacts<'_> {
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
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
pub fn tensor_info(t: &TensorProto) -> TensorInfo {
    TensorInfo {
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
        initializer: true,
    }
}

/// Walks `order` (node ids of `g`) and records what is known about every tensor.
/// `outer` supplies captured outer-scope tensors of a body; `opset` is the ai.onnx opset.
pub fn propagate<'a>(
    g: &Graph<'a>,
    order: &[usize],
    outer: Option<&GraphFacts<'_>>,
    opset: i64,
) -> GraphFacts<'a> {
    propagate_with(g, order, outer, opset, |_, _| {})
}

/// [`propagate`], calling `visit(node_id, facts)` right after each node's outputs are known,
/// while its tensors are still hot in cache (the capability checks run there).
pub fn propagate_with<'a>(
    g: &Graph<'a>,
    order: &[usize],
    outer: Option<&GraphFacts<'_>>,
    opset: i64,
    mut visit: impl FnMut(usize, &GraphFacts<'a>),
) -> GraphFacts<'a> {
    let mut f = GraphFacts::default();
    f.tensors
        .reserve(g.initializers.len() + g.inputs.len() + g.producer.len());
    if let Some(o) = outer {
        for &c in &g.captures {
            if let Some(t) = o.get(c) {
                let mut t = t.clone();
                // Outer origins are reported by the outer graph.
                t.dds = None;
                f.tensors.insert(c, t);
            }
        }
    }
    let input_names: FastSet<&str> = g.proto.input.iter().map(|i| i.name.as_str()).collect();
    for (name, t) in &g.initializers {
        let mut info = tensor_info(t);
        if input_names.contains(name) {
            // An initializer that is also an input is only a default: callers may override it.
            info.class = ValueClass::DataDerived;
            info.value = None;
            info.initializer = false;
        }
        f.tensors.insert(name, info);
    }
    for v in &g.inputs {
        f.tensors.insert(
            v.name.as_str(),
            TensorInfo {
                dtype: elem_type_of(v),
                shape: shape_of(v).map(|s| s.iter().map(from_dim).collect()),
                class: ValueClass::DataDerived,
                value: None,
                dds: None,
                initializer: false,
            },
        );
    }
    for &id in order {
        let Some(node) = g.nodes.get(id) else {
            continue;
        };
        step(g, id, node, opset, &mut f);
        visit(id, &f);
    }
    f
}

fn step<'a>(g: &Graph<'a>, id: usize, node: &'a NodeProto, opset: i64, f: &mut GraphFacts<'a>) {
    let mut outs = infer::infer(node, f, opset);
    outs.resize_with(node.output.len(), || None);
    // Value class: the worst class among everything the node reads.
    let reads = super::partition::reads(g, id);
    let mut class = ValueClass::Constant;
    let mut inherited = None;
    for r in &reads {
        match f.get(r) {
            Some(t) => {
                class = class.max(t.class);
                if inherited.is_none() {
                    inherited = t.dds;
                }
            }
            None => class = ValueClass::DataDerived,
        }
    }
    let op = node.op_type.as_str();
    let std_domain = matches!(node.domain.as_str(), "" | "ai.onnx");
    if std_domain && matches!(op, "Shape" | "Size") {
        let src = node.input.first().and_then(|i| f.get(i));
        class = match src {
            Some(t) if t.dds.is_some() => ValueClass::DataDerived,
            Some(t) if t.class == ValueClass::Constant => ValueClass::Constant,
            _ => ValueClass::ShapeDerived,
        };
    }
    if std_domain && (op.starts_with("Random") || op == "Multinomial" || op == "Bernoulli") {
        class = ValueClass::DataDerived;
    }
    let origin = dds::origin(g, id, node, f, opset).map(|o| {
        f.dds.push(o);
        f.dds.len() - 1
    });
    for (slot, out) in node.output.iter().enumerate() {
        if out.is_empty() {
            continue;
        }
        let inferred = outs.get_mut(slot).and_then(|o| o.take());
        let declared = g.value_info.get(out.as_str());
        let mut info = merge(inferred, declared.copied());
        info.class = class;
        if class == ValueClass::DataDerived && !matches!(op, "Shape" | "Size") {
            info.value = None;
        }
        info.dds = match origin {
            Some(o) if dds::output_is_dynamic(node, slot) => Some(o),
            _ => inherited,
        };
        f.tensors.insert(out.as_str(), info);
    }
}

/// Combines an inferred shape with the declared `value_info`: per dimension the inferred
/// value wins unless unknown; on a rank conflict the declaration wins.
fn merge(
    inferred: Option<infer::Out>,
    declared: Option<&crate::onnx::proto::ValueInfoProto>,
) -> TensorInfo {
    let (dt, sh, val) = match inferred {
        Some(o) => (o.dtype, o.shape, o.value),
        None => (None, None, None),
    };
    let decl_shape: Option<Vec<SymDim>> =
        declared.and_then(|d| shape_of(d).map(|s| s.iter().map(from_dim).collect()));
    let shape = match (sh, decl_shape) {
        (Some(i), Some(d)) if i.len() == d.len() => Some(
            i.into_iter()
                .zip(d)
                .map(|(a, b)| if a == SymDim::Unknown { b } else { a })
                .collect(),
        ),
        (_, Some(d)) => Some(d),
        (i, None) => i,
    };
    TensorInfo {
        dtype: dt.or_else(|| declared.and_then(elem_type_of)),
        shape,
        class: ValueClass::DataDerived,
        value: val,
        dds: None,
        initializer: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attr, model, tensor_i64, GraphBuilder, D};
    use crate::onnx::ElemType::{Float32, Int64};

    fn run(m: &crate::onnx::proto::ModelProto) -> GraphFacts<'_> {
        let g = Graph::new(m.graph.as_ref().unwrap());
        let order: Vec<usize> = (0..g.nodes.len()).collect();
        propagate(&g, &order, None, 17)
    }

    fn dims(f: &GraphFacts, t: &str) -> Vec<String> {
        f.get(t)
            .and_then(|t| t.shape.clone())
            .unwrap_or_default()
            .iter()
            .map(|d| d.to_string())
            .collect()
    }

    #[test]
    fn reshape_transpose_matmul_and_shape_values() {
        let mut g = GraphBuilder::new("t");
        g.input("x", Float32, &["batch".into(), "seq".into(), D::Fixed(64)])
            .output("y", Float32, None)
            .init(tensor_i64("rs", &[4], &[0, 0, 8, -1]))
            .init(tensor_i64("ix", &[1], &[0]));
        g.node("Reshape", &["x", "rs"], &["r"]);
        g.node("Transpose", &["r"], &["t"])
            .attribute
            .push(attr::ints("perm", &[0, 2, 1, 3]));
        g.node("MatMul", &["t", "t2"], &["mm"]);
        g.node("Shape", &["x"], &["sh"]);
        g.node("Gather", &["sh", "ix"], &["b"]);
        g.node("Flatten", &["x"], &["fl"])
            .attribute
            .push(attr::int("axis", 2));
        g.node("ReduceMean", &["x"], &["y"])
            .attribute
            .push(attr::ints("axes", &[-1]));
        let m = model(g.build(), &[("", 17)]);
        let f = run(&m);
        assert_eq!(dims(&f, "r"), ["batch", "seq", "8", "8"]);
        assert_eq!(dims(&f, "t"), ["batch", "8", "seq", "8"]);
        assert!(f.get("mm").unwrap().shape.is_none(), "t2 is unknown");
        assert_eq!(f.class("sh"), ValueClass::ShapeDerived);
        assert_eq!(f.value("b").unwrap(), &[SymDim::Sym("batch".into())]);
        assert_eq!(f.class("b"), ValueClass::ShapeDerived);
        assert_eq!(dims(&f, "fl"), ["?", "64"]);
        assert_eq!(dims(&f, "y"), ["batch", "seq", "1"]);
        assert_eq!(f.class("rs"), ValueClass::Constant);
        assert_eq!(f.class("r"), ValueClass::DataDerived);
        assert_eq!(f.get("sh").unwrap().dtype, Some(Int64));
    }
}
