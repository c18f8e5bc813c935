//! Symbolic shapes, element types and value classes of every tensor of one graph.
//!
//! Enters: a [`Graph`] view, the node order to walk, the model's ai.onnx opset and, for
//! If/Loop/Scan bodies, the facts of the enclosing graph (outer-scope captures). Leaves:
//! [`GraphFacts`], a map from tensor name to [`TensorFacts`]. Per-op rules live in
//! [`super::infer`]; data-dependent-shape origins are recorded here as the walk goes
//! (see [`super::dds`]) because a `Shape` of a data-dependent tensor is itself data-derived.
//!
//! Unknown stays unknown: a rule that cannot be sure yields [`SymDim::Unknown`] or no shape.

use super::dds;
use super::facts::{
    from_dim, tensor_info, FastSet, GraphFacts, Out, SymDim, TensorFacts, ValueClass,
};
use super::infer;
use crate::onnx::facts::{elem_type_of, shape_of};
use crate::onnx::graph::Graph;
use crate::onnx::proto::NodeProto;

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
        if input_names.contains(name) && !g.initializer_inputs_are_constants {
            // An initializer that is also an input is only a default: callers may override it.
            info.class = ValueClass::DataDerived;
            info.value = None;
            info.weights = false;
        }
        f.tensors.insert(name, info);
    }
    for v in &g.inputs {
        f.tensors.insert(
            v.name.as_str(),
            TensorFacts {
                dtype: elem_type_of(v),
                shape: shape_of(v).map(|s| s.iter().map(from_dim).collect()),
                class: ValueClass::DataDerived,
                value: None,
                dds: None,
                weights: false,
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
    if matches!(node.domain.as_str(), "" | "ai.onnx")
        && matches!(node.op_type.as_str(), "If" | "Loop" | "Scan")
    {
        outs = control_flow(g, id, node, f, opset);
    }
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
        // A Constant's type and shape are its tensor's, exactly: a declaration that says
        // otherwise is the exporter's mistake (onnxruntime-genai declares a 4-element shape
        // Constant as a scalar), not a reason to believe it.
        let exact = std_domain
            && op == "Constant"
            && inferred.as_ref().is_some_and(|o| {
                o.dtype.is_some()
                    && o.shape
                        .as_ref()
                        .is_some_and(|s| s.iter().all(|d| d.known().is_some()))
            });
        let declared = g.value_info.get(out.as_str()).filter(|_| !exact);
        let mut info = merge(inferred, declared.copied());
        info.class = class;
        info.weights = std_domain && op == "Constant";
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

/// If, Loop and Scan outputs from their bodies' outputs: the declared type when the body
/// declares it, else what the body's own facts say (the body is walked only then). If's
/// branches keep what they agree on; Loop's carried values what the initial value and the
/// body agree on; a scan output is the body's with an unknown leading axis.
fn control_flow(
    g: &Graph<'_>,
    id: usize,
    node: &NodeProto,
    f: &GraphFacts<'_>,
    opset: i64,
) -> Vec<Option<Out>> {
    let body = |attr: &str| -> Vec<Option<Out>> {
        let Some(b) = super::partition::bodies_of(g, id)
            .iter()
            .find(|b| b.attr == attr)
        else {
            return Vec::new();
        };
        let declared: Vec<Option<Out>> = b.graph.outputs.iter().map(|o| declared_out(o)).collect();
        if declared.iter().all(Option::is_some) {
            return declared;
        }
        let order: Vec<usize> = (0..b.graph.nodes.len()).collect();
        let bf = propagate(&b.graph, &order, Some(f), opset);
        b.graph
            .outputs
            .iter()
            .zip(declared)
            .map(|(o, d)| {
                d.or_else(|| {
                    bf.get(&o.name).map(|t| Out {
                        dtype: t.dtype,
                        shape: t.shape.clone(),
                        value: None,
                    })
                })
            })
            .collect()
    };
    let input = |i: usize| -> Option<Out> {
        node.input.get(i).and_then(|s| f.get(s)).map(|t| Out {
            dtype: t.dtype,
            shape: t.shape.clone(),
            value: None,
        })
    };
    let scanned = |o: Option<Out>| {
        o.map(|o| Out {
            dtype: o.dtype,
            shape: o.shape.map(|s| {
                let mut v = vec![SymDim::Unknown];
                v.extend(s);
                v
            }),
            value: None,
        })
    };
    let k = node.output.len();
    match node.op_type.as_str() {
        "If" => {
            let (then, other) = (body("then_branch"), body("else_branch"));
            (0..k)
                .map(|i| {
                    agree(
                        then.get(i).cloned().flatten(),
                        other.get(i).cloned().flatten(),
                    )
                })
                .collect()
        }
        "Loop" => {
            // Body outputs: cond, the carried values, then the scan outputs.
            let b = body("body");
            let carried = node.input.len().saturating_sub(2);
            (0..k)
                .map(|i| {
                    let out = b.get(i + 1).cloned().flatten();
                    if i < carried {
                        agree(input(i + 2), out)
                    } else {
                        scanned(out)
                    }
                })
                .collect()
        }
        _ => {
            let b = body("body");
            let scans = crate::onnx::attr::int(node, "num_scan_inputs")
                .and_then(|v| usize::try_from(v).ok())
                .unwrap_or(0);
            let states = node.input.len().saturating_sub(scans);
            (0..k)
                .map(|i| {
                    let out = b.get(i).cloned().flatten();
                    if i < states {
                        agree(input(i), out)
                    } else {
                        // The scan axis may be any axis (`scan_output_axes`): rank only.
                        scanned(out).map(|mut o| {
                            o.shape = o.shape.map(|s| vec![SymDim::Unknown; s.len()]);
                            o
                        })
                    }
                })
                .collect()
        }
    }
}

/// A declared tensor value as an [`Out`] (`None` when not a typed tensor).
fn declared_out(v: &crate::onnx::proto::ValueInfoProto) -> Option<Out> {
    let dtype = elem_type_of(v).filter(|t| t.code() != 0)?;
    Some(Out {
        dtype: Some(dtype),
        shape: shape_of(v).map(|s| s.iter().map(from_dim).collect()),
        value: None,
    })
}

/// What two candidate facts of one value agree on: the type when equal (else the one
/// known), each dimension when equal, the rank when equal; only the type when one of them
/// is unknown (ONNX requires one type, not one shape).
fn agree(a: Option<Out>, b: Option<Out>) -> Option<Out> {
    let (a, b) = match (a, b) {
        (Some(a), Some(b)) => (a, b),
        (a, b) => {
            return a.or(b).map(|o| Out {
                dtype: o.dtype,
                shape: None,
                value: None,
            })
        }
    };
    let dtype = match (a.dtype, b.dtype) {
        (Some(x), Some(y)) if x != y => None,
        (x, y) => x.or(y),
    };
    let shape = match (a.shape, b.shape) {
        (Some(x), Some(y)) if x.len() == y.len() => Some(
            x.into_iter()
                .zip(y)
                .map(|(p, q)| if p == q { p } else { SymDim::Unknown })
                .collect(),
        ),
        _ => None,
    };
    Some(Out {
        dtype,
        shape,
        value: None,
    })
}

/// Combines an inferred shape with the declared `value_info`: per dimension the inferred
/// value wins unless unknown; on a rank conflict the declaration wins.
fn merge(
    inferred: Option<Out>,
    declared: Option<&crate::onnx::proto::ValueInfoProto>,
) -> TensorFacts {
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
    TensorFacts {
        dtype: dt.or_else(|| declared.and_then(elem_type_of)),
        shape,
        class: ValueClass::DataDerived,
        value: val,
        dds: None,
        weights: false,
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
    #[test]
    fn dropout_mask_split_sizes_and_if_outputs() {
        use crate::onnx::ElemType::Bool;
        let mut g = GraphBuilder::new("t");
        g.input("x", Float32, &[D::Fixed(4), D::Fixed(6)])
            .input("sizes", Int64, &[D::Fixed(2)])
            .input("c", Bool, &[])
            .output("y", Float32, None);
        g.node("Dropout", &["x"], &["d", "mask"]);
        g.node("Split", &["x", "sizes"], &["s0", "s1"])
            .attribute
            .push(attr::int("axis", 1));
        g.node("Split", &["x"], &["e0", "e1"])
            .attribute
            .push(attr::int("axis", 1));
        let branch = |name: &str, op: &str| {
            let mut b = GraphBuilder::new(name);
            // Undeclared: the branch's own facts type it.
            b.graph.output.push(Default::default());
            b.graph.output[0].name = format!("{name}_o");
            b.node(op, &["x"], &[&format!("{name}_o")]);
            b.build()
        };
        g.node("If", &["c"], &["branch"]).attribute.extend([
            attr::graph("then_branch", branch("th", "Relu")),
            attr::graph("else_branch", branch("el", "Neg")),
        ]);
        let m = model(g.build(), &[("", 9)]);
        let view = Graph::new(m.graph.as_ref().unwrap());
        let order: Vec<usize> = (0..view.nodes.len()).collect();
        // Dropout-7 (opset 9): the mask has the data's type; from Dropout-10 it is bool.
        let f = propagate(&view, &order, None, 9);
        assert_eq!(f.get("mask").unwrap().dtype, Some(Float32));
        assert_eq!(
            propagate(&view, &order, None, 13)
                .get("mask")
                .unwrap()
                .dtype,
            Some(Bool)
        );
        // Split sizes given at run time: unknown, not the equal split.
        let f = propagate(&view, &order, None, 13);
        assert_eq!(dims(&f, "s0"), ["4", "?"]);
        assert_eq!(dims(&f, "e0"), ["4", "3"]);
        // If: what both branches agree on.
        assert_eq!(f.get("branch").unwrap().dtype, Some(Float32));
        assert_eq!(dims(&f, "branch"), ["4", "6"]);
    }
}
