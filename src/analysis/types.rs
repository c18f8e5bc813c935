//! Full ONNX types of the tensors [`super::facts`] cannot describe, for [`super::export`]:
//! sequences, maps and optionals, and tensors whose element type only a body graph says
//! (If, Loop, Scan, SequenceMap outputs).
//!
//! Enters: a [`Graph`] with its [`GraphFacts`]. Leaves: a map from value name to
//! [`TypeProto`] for every node output whose type the facts and the declared `value_info`
//! leave open and a rule here can name. Rules follow the op schemas; a body's outputs are
//! typed from their declarations, or from the body's own facts and rules when undeclared.
//! A rule that is not sure answers nothing (the export then says which tensor is untyped).

use super::facts::{FastMap, GraphFacts, SymDim};
use super::partition::bodies_of;
use super::shapes::propagate;
use crate::onnx::attr;
use crate::onnx::graph::Graph;
use crate::onnx::proto::{
    tensor_shape_proto::{dimension, Dimension},
    type_proto, NodeProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use crate::onnx::ElemType;

/// Types by value name, for the values the facts cannot type.
pub type Types<'a> = FastMap<&'a str, TypeProto>;

/// A type is complete when every element type in it is known (what ONNX Runtime needs of
/// a graph input or output).
pub fn complete(t: &TypeProto) -> bool {
    match &t.value {
        Some(type_proto::Value::TensorType(x)) => x.elem_type != 0,
        Some(type_proto::Value::SequenceType(s)) => s.elem_type.as_deref().is_some_and(complete),
        Some(type_proto::Value::OptionalType(o)) => o.elem_type.as_deref().is_some_and(complete),
        Some(type_proto::Value::MapType(m)) => {
            m.key_type != 0 && m.value_type.as_deref().is_some_and(complete)
        }
        Some(type_proto::Value::SparseTensorType(x)) => x.elem_type != 0,
        Some(type_proto::Value::OpaqueType(_)) => true,
        None => false,
    }
}

/// A tensor type, with the shape when one is known.
pub fn tensor(dt: ElemType, shape: Option<&[SymDim]>) -> TypeProto {
    let shape = shape.map(|s| TensorShapeProto {
        dim: s
            .iter()
            .map(|d| Dimension {
                value: match d {
                    SymDim::Known(v) => Some(dimension::Value::DimValue(*v)),
                    SymDim::Sym(p) => Some(dimension::Value::DimParam(p.to_string())),
                    SymDim::Unknown => None,
                },
                denotation: String::new(),
            })
            .collect(),
    });
    wrap(type_proto::Value::TensorType(type_proto::Tensor {
        elem_type: dt.code(),
        shape,
    }))
}

fn wrap(v: type_proto::Value) -> TypeProto {
    TypeProto {
        value: Some(v),
        denotation: String::new(),
    }
}

fn sequence(elem: TypeProto) -> TypeProto {
    wrap(type_proto::Value::SequenceType(type_proto::Sequence {
        elem_type: Some(Box::new(elem)),
    }))
}

fn optional(elem: TypeProto) -> TypeProto {
    wrap(type_proto::Value::OptionalType(type_proto::Optional {
        elem_type: Some(Box::new(elem)),
    }))
}

/// The element type of a sequence (or of an optional) type.
fn inner(t: &TypeProto) -> Option<&TypeProto> {
    match &t.value {
        Some(type_proto::Value::SequenceType(s)) => s.elem_type.as_deref(),
        Some(type_proto::Value::OptionalType(o)) => o.elem_type.as_deref(),
        _ => None,
    }
}

fn tensor_elem(t: &TypeProto) -> Option<ElemType> {
    match &t.value {
        Some(type_proto::Value::TensorType(x)) if x.elem_type != 0 => {
            Some(ElemType::from_code(x.elem_type))
        }
        _ => None,
    }
}

/// Tensor types keep only the element type when two candidates disagree on the shape
/// (If branches, a loop-carried value and its update).
fn join(a: TypeProto, b: Option<TypeProto>) -> TypeProto {
    match b {
        Some(b) if a != b => match (tensor_elem(&a), tensor_elem(&b)) {
            (Some(x), Some(y)) if x == y => tensor(x, None),
            _ => a,
        },
        _ => a,
    }
}

/// What is known of value `name`: its declared type when complete, else the facts' tensor
/// type, else what the rules found.
fn type_of(name: &str, g: &Graph<'_>, f: &GraphFacts, found: &Types<'_>) -> Option<TypeProto> {
    if name.is_empty() {
        return None;
    }
    if let Some(t) = g.value_info.get(name).and_then(|v| v.r#type.as_ref()) {
        if complete(t) {
            return Some(t.clone());
        }
    }
    if let Some(t) = f.get(name) {
        if let Some(dt) = t.dtype.filter(|d| d.code() != 0) {
            return Some(tensor(dt, t.shape.as_deref()));
        }
    }
    found.get(name).cloned()
}

/// Types every node output of `g` that the facts and declarations leave open, in `order`.
pub fn infer_types<'a>(
    g: &Graph<'a>,
    f: &GraphFacts<'_>,
    order: &[usize],
    opset: i64,
    max_depth: usize,
) -> Types<'a> {
    infer_in(g, f, order, opset, max_depth, Types::default())
}

/// [`infer_types`] for a graph whose captures `outer` already types (a body).
fn infer_in<'a>(
    g: &Graph<'a>,
    f: &GraphFacts<'_>,
    order: &[usize],
    opset: i64,
    max_depth: usize,
    outer: Types<'a>,
) -> Types<'a> {
    let mut found = outer;
    for &id in order {
        let Some(n) = g.nodes.get(id) else { continue };
        if n.output
            .iter()
            .all(|o| o.is_empty() || type_of(o, g, f, &found).is_some())
        {
            continue;
        }
        let outs = rule(g, id, n, f, &found, opset, max_depth);
        for (o, t) in n.output.iter().zip(outs) {
            if let Some(t) = t.filter(complete) {
                if !o.is_empty() && type_of(o, g, f, &found).is_none() {
                    found.insert(o.as_str(), t);
                }
            }
        }
    }
    found
}

/// The output types of body `attr` of node `id`, in output order; `found` types what the
/// body captures.
fn body_outputs<'a>(
    g: &Graph<'a>,
    id: usize,
    attr: &str,
    f: &GraphFacts,
    found: &Types<'a>,
    opset: i64,
    max_depth: usize,
) -> Vec<Option<TypeProto>> {
    let Some(b) = bodies_of(g, id).iter().find(|b| b.attr == attr) else {
        return Vec::new();
    };
    let declared: Vec<Option<TypeProto>> = b
        .graph
        .outputs
        .iter()
        .map(|o| o.r#type.clone().filter(complete))
        .collect();
    if declared.iter().all(Option::is_some) || max_depth == 0 {
        return declared;
    }
    let order: Vec<usize> = (0..b.graph.nodes.len()).collect();
    let bf = propagate(&b.graph, &order, Some(f), opset);
    let outer: Types<'a> = found
        .iter()
        .filter(|(k, _)| b.graph.captures.contains(*k))
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    let found = infer_in(&b.graph, &bf, &order, opset, max_depth - 1, outer);
    b.graph
        .outputs
        .iter()
        .map(|o: &&ValueInfoProto| type_of(&o.name, &b.graph, &bf, &found))
        .collect()
}

/// One node's output types (an entry per output slot; fewer when unknown).
fn rule<'a>(
    g: &Graph<'a>,
    id: usize,
    n: &NodeProto,
    f: &GraphFacts,
    found: &Types<'a>,
    opset: i64,
    max_depth: usize,
) -> Vec<Option<TypeProto>> {
    let input = |i: usize| n.input.get(i).and_then(|s| type_of(s, g, f, found));
    let elem_dt = |i: usize| {
        input(i)
            .as_ref()
            .and_then(inner)
            .and_then(tensor_elem)
            .or_else(|| n.input.get(i).and_then(|s| f.get(s)).and_then(|t| t.dtype))
    };
    match (n.domain.as_str(), n.op_type.as_str()) {
        ("ai.onnx.ml", "ZipMap") => {
            let key = if attr::has(n, "classlabels_strings") {
                ElemType::String
            } else {
                ElemType::Int64
            };
            let map = wrap(type_proto::Value::MapType(type_proto::Map {
                key_type: key.code(),
                value_type: Some(Box::new(tensor(ElemType::Float32, None))),
            }));
            vec![Some(sequence(map))]
        }
        ("" | "ai.onnx", op) => match op {
            "Identity" => vec![input(0)],
            "SequenceEmpty" => {
                let dt = attr::int(n, "dtype").map_or(ElemType::Float32, |c| {
                    ElemType::from_code(i32::try_from(c).unwrap_or(0))
                });
                vec![Some(sequence(tensor(dt, None)))]
            }
            "SequenceConstruct" => vec![input(0).map(|t| sequence(join(t, input(1))))],
            "SequenceInsert" => vec![input(0).or_else(|| input(1).map(sequence))],
            "SequenceErase" => vec![input(0)],
            "SequenceAt" => vec![input(0).as_ref().and_then(inner).cloned()],
            "SplitToSequence" => vec![elem_dt(0).map(|dt| sequence(tensor(dt, None)))],
            "ConcatFromSequence" => vec![elem_dt(0).map(|dt| tensor(dt, None))],
            "SequenceLength" => vec![Some(tensor(ElemType::Int64, Some(&[])))],
            "OptionalHasElement" => vec![Some(tensor(ElemType::Bool, Some(&[])))],
            "Optional" => {
                let t = attr::get(n, "type")
                    .and_then(|a| a.tp.clone())
                    .or_else(|| input(0));
                vec![t.map(optional)]
            }
            "OptionalGetElement" => vec![input(0).map(|t| match &t.value {
                Some(type_proto::Value::OptionalType(o)) => {
                    o.elem_type.as_deref().cloned().unwrap_or(t)
                }
                _ => t,
            })],
            "If" => {
                let then = body_outputs(g, id, "then_branch", f, found, opset, max_depth);
                let other = body_outputs(g, id, "else_branch", f, found, opset, max_depth);
                (0..n.output.len())
                    .map(|i| {
                        let e = other.get(i).cloned().flatten();
                        match then.get(i).cloned().flatten() {
                            Some(t) => Some(join(t, e)),
                            None => e,
                        }
                    })
                    .collect()
            }
            "Loop" => {
                // Body outputs: cond, then N carried values, then the scan outputs, which
                // the Loop stacks along a new first axis.
                let body = body_outputs(g, id, "body", f, found, opset, max_depth);
                let carried = n.input.len().saturating_sub(2);
                (0..n.output.len())
                    .map(|i| {
                        let b = body.get(i + 1).cloned().flatten();
                        if i < carried {
                            match input(i + 2) {
                                Some(t) => Some(join(t, b)),
                                None => b,
                            }
                        } else {
                            b.as_ref().and_then(tensor_elem).map(|dt| tensor(dt, None))
                        }
                    })
                    .collect()
            }
            "Scan" => {
                let body = body_outputs(g, id, "body", f, found, opset, max_depth);
                let states = n.input.len().saturating_sub(
                    usize::try_from(attr::int(n, "num_scan_inputs").unwrap_or(0)).unwrap_or(0),
                );
                (0..n.output.len())
                    .map(|i| {
                        let b = body.get(i).cloned().flatten();
                        if i < states {
                            b
                        } else {
                            b.as_ref().and_then(tensor_elem).map(|dt| tensor(dt, None))
                        }
                    })
                    .collect()
            }
            "SequenceMap" => body_outputs(g, id, "body", f, found, opset, max_depth)
                .into_iter()
                .map(|t| t.map(|t| sequence(t.clone())))
                .collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attr as fattr, model, GraphBuilder, D};
    use crate::onnx::ElemType::{Float32, Int64};

    fn types_of(m: &crate::onnx::proto::ModelProto) -> Vec<(String, TypeProto)> {
        let g = Graph::new(m.graph.as_ref().unwrap());
        let order: Vec<usize> = (0..g.nodes.len()).collect();
        let f = propagate(&g, &order, None, 17);
        let mut v: Vec<(String, TypeProto)> = infer_types(&g, &f, &order, 17, 4)
            .into_iter()
            .map(|(k, t)| (k.to_string(), t))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[test]
    fn sequences_zipmap_and_if_branches_are_typed() {
        let mut g = GraphBuilder::new("t");
        g.input("x", Float32, &[D::Fixed(2), D::Fixed(3)])
            .input("c", crate::onnx::ElemType::Bool, &[])
            .output("n", Int64, None);
        g.node("SplitToSequence", &["x"], &["seq"]);
        g.node("SequenceAt", &["seq", "c"], &["item"]);
        let z = g.node("ZipMap", &["x"], &["zip"]);
        z.domain = "ai.onnx.ml".into();
        z.attribute
            .push(fattr::ints("classlabels_int64s", &[0, 1, 2]));
        let mut then = GraphBuilder::new("then");
        then.output("tx", Float32, None);
        then.node("Identity", &["x"], &["tx"]);
        let mut other = GraphBuilder::new("else");
        other.output("ex", Float32, None);
        other.node("Neg", &["x"], &["ex"]);
        let mut then_g = then.build();
        // An untyped branch output: the branch's own facts type it.
        then_g.output[0] = ValueInfoProto {
            name: "tx".into(),
            ..Default::default()
        };
        let i = g.node("If", &["c"], &["branch"]);
        i.attribute.push(fattr::graph("then_branch", then_g));
        i.attribute.push(fattr::graph("else_branch", other.build()));
        let m = model(g.build(), &[("", 17), ("ai.onnx.ml", 3)]);
        let t = types_of(&m);
        let names: Vec<&str> = t.iter().map(|(k, _)| k.as_str()).collect();
        // The If's tensor output is the facts' (see shapes::control_flow), not this map's.
        assert_eq!(names, ["item", "seq", "zip"]);
        assert_eq!(t[0].1, tensor(Float32, None));
        assert_eq!(inner(&t[1].1).and_then(tensor_elem), Some(Float32));
        let Some(type_proto::Value::SequenceType(s)) = &t[2].1.value else {
            panic!("ZipMap gives a sequence: {:?}", t[2].1)
        };
        let Some(type_proto::Value::MapType(map)) = &s.elem_type.as_ref().unwrap().value else {
            panic!("of maps")
        };
        assert_eq!(map.key_type, Int64.code());
    }
}
