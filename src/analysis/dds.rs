//! Data-dependent shapes: which nodes make an output whose shape depends on tensor values.
//!
//! Enters: one node with the facts known so far (called by [`super::shapes::propagate`] as it
//! walks). Leaves: a [`DdsOrigin`] naming the node and why. Two kinds: ops whose output size
//! is data-dependent by definition (NonZero, NonMaxSuppression, Unique, Compress), and ops
//! whose shape-defining input is data-derived (Reshape's shape, Expand's shape, Tile's
//! repeats, ConstantOfShape, Range, Slice, Pad, Resize, OneHot's depth, TopK's K, Split's
//! sizes, Squeeze/Unsqueeze axes, a Loop trip count feeding scan outputs, …). Tensors
//! downstream inherit the origin in [`super::shapes::TensorInfo::dds`].

use super::facts::{DdsOrigin, GraphFacts, ValueClass};
use crate::onnx::graph::Graph;
use crate::onnx::proto::NodeProto;

/// The ONNX Runtime / onnx-tensorrt "DDS ops" set that `--trt-exclude-dds` excludes.
pub const DDS_OPS: [&str; 3] = ["NonMaxSuppression", "NonZero", "RoiAlign"];

/// Which input of an op defines (part of) its output shape, with a label.
fn shape_inputs(op: &str, opset: i64) -> &'static [(usize, &'static str)] {
    match op {
        "Reshape" => &[(1, "shape")],
        "Expand" => &[(1, "shape")],
        "Tile" => &[(1, "repeats")],
        "ConstantOfShape" => &[(0, "input (the shape)")],
        "Range" => &[(0, "start"), (1, "limit"), (2, "delta")],
        "Slice" if opset >= 10 => &[(1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")],
        "Pad" if opset >= 11 => &[(1, "pads"), (3, "axes")],
        "Resize" => &[(2, "scales"), (3, "sizes")],
        "Upsample" => &[(1, "scales")],
        "OneHot" => &[(1, "depth")],
        "TopK" if opset >= 10 => &[(1, "K")],
        "Split" if opset >= 13 => &[(1, "split")],
        "Squeeze" | "Unsqueeze" if opset >= 13 => &[(1, "axes")],
        "ReduceSum" if opset >= 13 => &[(1, "axes")],
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare"
            if opset >= 18 =>
        {
            &[(1, "axes")]
        }
        "CenterCropPad" => &[(1, "shape")],
        "NonMaxSuppression" => &[(2, "max_output_boxes_per_class")],
        _ => &[],
    }
}

/// Whether output `slot` of `node` is the data-dependent one (for ops where only some are).
pub fn output_is_dynamic(node: &NodeProto, slot: usize) -> bool {
    match node.op_type.as_str() {
        // Loop: only scan outputs (after the loop-carried ones) grow with the trip count.
        "Loop" => slot >= node.input.len().saturating_sub(2),
        _ => true,
    }
}

/// The origin a node starts, if any.
pub fn origin(
    g: &Graph<'_>,
    id: usize,
    node: &NodeProto,
    f: &GraphFacts,
    opset: i64,
) -> Option<DdsOrigin> {
    if !matches!(node.domain.as_str(), "" | "ai.onnx") {
        return None;
    }
    let op = node.op_type.as_str();
    let first_out = |from: usize| {
        node.output
            .iter()
            .skip(from)
            .find(|o| !o.is_empty())
            .cloned()
    };
    let mk = |tensor: String, why: String| DdsOrigin {
        tensor,
        node: g.names.get(id).cloned().unwrap_or_default(),
        op_type: op.to_string(),
        why,
    };
    let why = match op {
        "NonZero" => {
            Some("output size is the number of non-zero elements of its input".to_string())
        }
        "NonMaxSuppression" => Some(
            "output size is the number of boxes selected, known only after running".to_string(),
        ),
        "Unique" => Some("output size is the number of distinct values of its input".to_string()),
        "Compress" => Some("output size is the number of true elements of `condition`".to_string()),
        _ => None,
    };
    if let Some(why) = why {
        return first_out(0).map(|t| mk(t, why));
    }
    if op == "Loop" {
        let carried = node.input.len().saturating_sub(2);
        if node.output.len() <= carried {
            return None;
        }
        let m = node.input.first().filter(|s| !s.is_empty());
        let dyn_trip = match m {
            None => true,
            Some(m) => f.class(m) == ValueClass::DataDerived,
        };
        let cond = node.input.get(1).filter(|s| !s.is_empty());
        let dyn_cond = cond.is_some_and(|c| f.class(c) == ValueClass::DataDerived);
        if dyn_trip || dyn_cond {
            let why = if dyn_trip {
                "scan outputs grow with a trip count that is absent or computed from data"
            } else {
                "scan outputs grow until a condition computed from data turns false"
            };
            return first_out(carried).map(|t| mk(t, why.into()));
        }
        return None;
    }
    for &(i, label) in shape_inputs(op, opset) {
        let Some(inp) = node.input.get(i).filter(|s| !s.is_empty()) else {
            continue;
        };
        let t = f.get(inp);
        let data = match t {
            None => true,
            Some(t) => t.class == ValueClass::DataDerived || t.dds.is_some() && t.value.is_none(),
        };
        if data {
            let src = match t.and_then(|t| t.dds) {
                Some(o) => f
                    .dds
                    .get(o)
                    .map(|o| format!(" (downstream of {} `{}`)", o.op_type, o.node))
                    .unwrap_or_default(),
                None => String::new(),
            };
            return first_out(0).map(|out| {
                mk(
                    out,
                    format!("{op}'s {label} input `{inp}` is computed from tensor data{src}"),
                )
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::shapes::propagate;
    use crate::fixtures::{model, tensor_i64, GraphBuilder, D};
    use crate::onnx::ElemType::{Float32, Int64};

    #[test]
    fn nonzero_and_data_shapes_are_origins_shape_shapes_are_not() {
        let mut g = GraphBuilder::new("t");
        g.input("x", Float32, &[D::Named("n")])
            .input("s", Int64, &[D::Fixed(1)])
            .output("y", Float32, None)
            .init(tensor_i64("minus1", &[1], &[-1]));
        g.node("NonZero", &["x"], &["nz"]);
        g.node("Reshape", &["nz", "minus1"], &["flat"]);
        g.node("Gather", &["x", "flat"], &["picked"]);
        g.node("Shape", &["x"], &["sh"]);
        g.node("Reshape", &["x", "sh"], &["same"]);
        g.node("Reshape", &["x", "s"], &["y"]);
        let m = model(g.build(), &[("", 17)]);
        let view = Graph::new(m.graph.as_ref().unwrap());
        let f = propagate(&view, &[0, 1, 2, 3, 4, 5], None, 17);
        let origins: Vec<(&str, &str)> = f
            .dds
            .iter()
            .map(|o| (o.tensor.as_str(), o.op_type.as_str()))
            .collect();
        assert_eq!(origins, [("nz", "NonZero"), ("y", "Reshape")]);
        assert_eq!(f.get("picked").unwrap().dds, Some(0));
        assert_eq!(f.get("flat").unwrap().dds, Some(0));
        assert_eq!(f.get("same").unwrap().dds, None);
    }
}
