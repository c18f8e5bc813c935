//! What `inspect` reports about a model itself: metadata, inputs/outputs with types and
//! shapes, an operator histogram, and warnings about things that break deployments
//! (static batch, unnamed dynamic dims, opsets outside what TensorRT/ONNX Runtime take, …).

use std::collections::BTreeMap;

use serde::Serialize;

use super::load::numel;
use super::proto::NodeProto;
use super::proto::{tensor_shape_proto::dimension, type_proto, TypeProto, ValueInfoProto};
use super::{ElemType, Model};

/// Opset bounds `inspect` warns against.
#[derive(Clone, Debug, Serialize)]
pub struct OpsetBounds {
    /// Who sets the bound, e.g. "TensorRT 10.15".
    pub who: String,
    pub min: i64,
    pub max: i64,
}

/// Newest IR version ONNX Runtime 1.31 loads.
pub const MAX_IR_VERSION: i64 = 13;

/// One dimension of a shape: fixed, named, or unknown (`null` in JSON).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum Dim {
    Fixed(i64),
    Named(String),
    Unknown,
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(v) => write!(f, "{v}"),
            Dim::Named(n) => f.write_str(n),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// A graph input or output.
#[derive(Clone, Debug, Serialize)]
pub struct ValueFacts {
    pub name: String,
    /// Element type (`float32`, …); `seq(T)`, `map(K,V)`, `optional(T)`, `sparse(T)` for
    /// non-tensor types; `unknown` when the type is missing.
    pub dtype: String,
    /// `null` when the rank is unknown.
    pub shape: Option<Vec<Dim>>,
}

/// A warning with a stable code.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Warning {
    pub code: &'static str,
    pub message: String,
}

/// Model metadata for `inspect`.
#[derive(Clone, Debug, Serialize)]
pub struct ModelFacts {
    pub path: String,
    pub ir_version: i64,
    pub producer_name: String,
    pub producer_version: String,
    pub opset_imports: BTreeMap<String, i64>,
    pub node_count: usize,
    pub node_count_total: usize,
    pub initializer_count: usize,
    pub initializer_bytes: u64,
    pub external_data_files: Vec<String>,
    pub file_bytes: u64,
}

/// Everything `inspect` says about a model before capability analysis.
#[derive(Clone, Debug, Serialize)]
pub struct Facts {
    pub model: ModelFacts,
    pub inputs: Vec<ValueFacts>,
    pub outputs: Vec<ValueFacts>,
    pub op_histogram: BTreeMap<String, usize>,
    pub warnings: Vec<Warning>,
}

/// Element type of a value info, as `inspect` prints it.
pub fn type_name(t: Option<&TypeProto>) -> String {
    use type_proto::Value;
    let Some(v) = t.and_then(|t| t.value.as_ref()) else {
        return "unknown".into();
    };
    match v {
        Value::TensorType(t) => ElemType::from_code(t.elem_type).name().into_owned(),
        Value::SparseTensorType(t) => format!("sparse({})", ElemType::from_code(t.elem_type)),
        Value::SequenceType(s) => format!("seq({})", type_name(s.elem_type.as_deref())),
        Value::OptionalType(o) => format!("optional({})", type_name(o.elem_type.as_deref())),
        Value::MapType(m) => format!(
            "map({},{})",
            ElemType::from_code(m.key_type),
            type_name(m.value_type.as_deref())
        ),
        Value::OpaqueType(o) => format!("opaque({}.{})", o.domain, o.name),
    }
}

/// Shape of a tensor value info; `None` when it has no shape (or is not a tensor).
pub fn shape_of(v: &ValueInfoProto) -> Option<Vec<Dim>> {
    use type_proto::Value;
    let shape = match v.r#type.as_ref()?.value.as_ref()? {
        Value::TensorType(t) => t.shape.as_ref()?,
        Value::SparseTensorType(t) => t.shape.as_ref()?,
        _ => return None,
    };
    Some(
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                // ONNX Runtime treats a negative dim_value (exporters write -1) as dynamic.
                Some(dimension::Value::DimValue(v)) if *v >= 0 => Dim::Fixed(*v),
                Some(dimension::Value::DimParam(p)) if !p.is_empty() => Dim::Named(p.clone()),
                _ => Dim::Unknown,
            })
            .collect(),
    )
}

/// Element type of a tensor value info, `None` for non-tensors.
pub fn elem_type_of(v: &ValueInfoProto) -> Option<ElemType> {
    match v.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(ElemType::from_code(t.elem_type)),
        _ => None,
    }
}

fn value_facts(v: &ValueInfoProto) -> ValueFacts {
    ValueFacts {
        name: v.name.clone(),
        dtype: type_name(v.r#type.as_ref()),
        shape: shape_of(v),
    }
}

fn op_key(domain: &str, op: &str) -> String {
    if domain.is_empty() || domain == "ai.onnx" {
        op.to_string()
    } else {
        format!("{domain}::{op}")
    }
}

/// Domains every ONNX consumer knows; anything else is a custom op set.
pub fn is_standard_domain(d: &str) -> bool {
    matches!(d, "" | "ai.onnx" | "ai.onnx.ml")
}

/// Nodes in `nodes` and, recursively, in every graph attribute (If/Loop/Scan bodies).
pub fn count_nodes(nodes: &[NodeProto]) -> usize {
    nodes.len()
        + nodes
            .iter()
            .flat_map(|n| &n.attribute)
            .map(|a| {
                a.g.iter().map(|g| count_nodes(&g.node)).sum::<usize>()
                    + a.graphs.iter().map(|g| count_nodes(&g.node)).sum::<usize>()
            })
            .sum::<usize>()
}

/// Collects the facts and warnings for a loaded model.
pub fn facts(model: &Model, bounds: &[OpsetBounds]) -> Facts {
    let g = model.graph();
    let initializer_names: super::fxhash::FastSet<&str> = g
        .initializer
        .iter()
        .map(|t| t.name.as_str())
        .chain(
            g.sparse_initializer
                .iter()
                .filter_map(|s| s.values.as_ref().map(|v| v.name.as_str())),
        )
        .collect();
    let mut op_histogram = BTreeMap::new();
    for n in &g.node {
        *op_histogram
            .entry(op_key(&n.domain, &n.op_type))
            .or_insert(0) += 1;
    }
    let mut initializer_bytes = 0u64;
    let mut initializer_count = 0usize;
    for t in g.initializer.iter().chain(
        g.sparse_initializer
            .iter()
            .filter_map(|s| s.values.as_ref()),
    ) {
        initializer_count += 1;
        initializer_bytes += numel(&t.dims)
            .and_then(|n| ElemType::from_code(t.data_type).bytes_for(n))
            .unwrap_or(t.raw_data.len() as u64);
    }
    let mut opset_imports = BTreeMap::new();
    for o in &model.proto.opset_import {
        let d = if o.domain == "ai.onnx" { "" } else { &o.domain };
        opset_imports.insert(d.to_string(), o.version);
    }
    let inputs: Vec<ValueFacts> = g
        .input
        .iter()
        .filter(|v| !initializer_names.contains(v.name.as_str()))
        .map(value_facts)
        .collect();
    let outputs: Vec<ValueFacts> = g.output.iter().map(value_facts).collect();
    let warnings = warnings(model, &inputs, &opset_imports, bounds);
    Facts {
        model: ModelFacts {
            path: model.path.display().to_string(),
            ir_version: model.proto.ir_version,
            producer_name: model.proto.producer_name.clone(),
            producer_version: model.proto.producer_version.clone(),
            opset_imports,
            node_count: g.node.len(),
            node_count_total: count_nodes(&g.node)
                + model
                    .proto
                    .functions
                    .iter()
                    .map(|f| count_nodes(&f.node))
                    .sum::<usize>(),
            initializer_count,
            initializer_bytes,
            external_data_files: model
                .external_files
                .iter()
                .map(|f| f.location.clone())
                .collect(),
            file_bytes: model.bytes.len() as u64,
        },
        inputs,
        outputs,
        op_histogram,
        warnings,
    }
}

fn warnings(
    model: &Model,
    inputs: &[ValueFacts],
    opsets: &BTreeMap<String, i64>,
    bounds: &[OpsetBounds],
) -> Vec<Warning> {
    let mut w = Vec::new();
    let mut push = |code, message: String| w.push(Warning { code, message });
    if model.proto.ir_version > MAX_IR_VERSION {
        push(
            "ir-version-too-new",
            format!(
                "IR version {} is above {MAX_IR_VERSION}, the newest ONNX Runtime 1.31 loads; \
                 re-save with an older ir_version (python onnx's helper writes 14 by default)",
                model.proto.ir_version
            ),
        );
    }
    let ranked: Vec<&ValueFacts> = inputs
        .iter()
        .filter(|i| i.shape.as_ref().is_some_and(|s| !s.is_empty()))
        .collect();
    if !ranked.is_empty()
        && ranked.len() == inputs.len()
        && ranked.iter().all(|i| {
            matches!(
                i.shape.as_ref().and_then(|s| s.first()),
                Some(Dim::Fixed(_))
            )
        })
    {
        let b = match ranked[0].shape.as_ref().and_then(|s| s.first()) {
            Some(Dim::Fixed(b)) => *b,
            _ => 0,
        };
        push(
            "static-batch",
            format!(
                "every input has a fixed leading dimension ({b} for `{}`): fails on batch {}; \
                 re-export with dynamic axes",
                ranked[0].name,
                if b == 2 { 3 } else { 2 }
            ),
        );
    }
    for i in inputs {
        match &i.shape {
            None if i.dtype.starts_with("seq(")
                || i.dtype.starts_with("map(")
                || i.dtype.starts_with("optional(") => {}
            None => push(
                "no-shape",
                format!("input `{}` has no shape information", i.name),
            ),
            Some(s) => {
                for (axis, d) in s.iter().enumerate() {
                    if *d == Dim::Unknown {
                        push(
                            "unnamed-dynamic-dim",
                            format!(
                                "input `{}` axis {axis} is dynamic without a name; name it so \
                                 shape profiles can refer to it",
                                i.name
                            ),
                        );
                    }
                }
            }
        }
    }
    if let Some(&v) = opsets.get("") {
        for b in bounds {
            if v > b.max {
                push(
                    "opset-too-new",
                    format!(
                        "ai.onnx opset {v} is newer than {} supports (max {})",
                        b.who, b.max
                    ),
                );
            }
            if v < b.min {
                push(
                    "opset-too-old",
                    format!(
                        "ai.onnx opset {v} is older than {} supports (min {})",
                        b.who, b.min
                    ),
                );
            }
        }
    }
    let mut custom: Vec<&str> = opsets
        .keys()
        .map(|d| d.as_str())
        .filter(|d| !is_standard_domain(d))
        .collect();
    for n in &model.graph().node {
        if !is_standard_domain(&n.domain) && !custom.contains(&n.domain.as_str()) {
            custom.push(&n.domain);
        }
    }
    for d in custom {
        push(
            "custom-domain",
            format!(
                "operator domain `{d}` is not standard ONNX: TensorRT needs a plugin for its \
                 ops and ONNX Runtime a custom-op library (com.microsoft ops run on ONNX Runtime only)"
            ),
        );
    }
    w
}
