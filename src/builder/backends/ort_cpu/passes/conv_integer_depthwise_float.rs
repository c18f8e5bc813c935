//! **`conv-integer-depthwise-float`** ([`depthwise_float`], applied first): a depthwise
//! `ConvInteger` (`group` > 1, one input channel per group) becomes
//! `DequantizeLinear(x, 1, x_zp) → Conv → Cast(int32)`, the `Conv`'s weights the constant
//! `w − w_zp` in float32. ONNX Runtime 1.31 runs a grouped `ConvInteger` as one small integer
//! GEMM per group, whatever the weights' type; its float `Conv` has a depthwise kernel, much
//! faster on the depthwise shapes of MobileNetV3 and EfficientNet, one thread or its pool
//! (`benches/conv_integer.py --grouped`; the numbers: BENCHMARKS.md). Exact: every product of two values of at most
//! 255 in magnitude is an integer, and the rewrite is taken only where no sum of a window's
//! `k` products can reach 2²⁴ in magnitude (`k · 255 · max|w − w_zp| < 2²⁴`), so float32
//! holds every partial sum exactly, in any order, and the cast gives back the int32 result
//! bit for bit. A plain (`group` 1) `ConvInteger` keeps its integers (`conv-integer-uint8`):
//! the float form is no faster there and takes four times the weights' bytes; nor is it
//! reliably faster for groups of several channels (ResNeXt's groups of 4: slower on one
//! thread, faster on the pool), which are left to `conv-integer-uint8` too.
//!
//! Left alone besides what `conv-integer-uint8` leaves: an input zero point that is neither
//! `DynamicQuantizeLinear`'s nor a one-element constant, and windows too long to be exact.

use std::collections::HashSet;

use bytes::Bytes;

use super::graph::{bytes8, drop_constants};
use crate::onnx::proto::{AttributeType, GraphProto, ModelProto, NodeProto, TensorProto};
use crate::onnx::ElemType;

/// Sums of products of 8-bit values below this magnitude are exact in float32 (24 bits).
const EXACT_F32: i64 = 1 << 24;

/// One depthwise `ConvInteger` taken for the float form.
struct Depthwise {
    conv: usize,
    /// `w − w_zp` as float32, in the weight's shape.
    weights: Vec<f32>,
    dims: Vec<i64>,
    /// The input's zero point: a name to read as it is (`DynamicQuantizeLinear`'s scalar),
    /// or a one-element constant given again as a scalar of its type.
    zero: Option<ZeroPoint>,
    unread: Vec<String>,
}

enum ZeroPoint {
    Name(String),
    Value(ElemType, u8),
}

/// Every depthwise `ConvInteger` of `g` that [`depthwise_float`] computes exactly in float.
fn find_depthwise(g: &GraphProto) -> Vec<Depthwise> {
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    let consts = super::graph::Constants::of(g);
    let uses = super::graph::read_counts(g);
    let once = |name: &str| uses.get(name) == Some(&1);
    let producer = super::graph::producers(g);
    let mut found = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        if !std(n)
            || n.op_type != "ConvInteger"
            || n.output.len() != 1
            || crate::onnx::attr::int(n, "group").unwrap_or(1) <= 1
        {
            continue;
        }
        let input = |k: usize| n.input.get(k).map(String::as_str).filter(|s| !s.is_empty());
        let (Some(_), Some(w)) = (input(0), input(1)) else {
            continue;
        };
        // Depthwise: one input channel per group.
        let Some(wt) = consts
            .tensor(g, w)
            .filter(|t| t.dims.len() >= 3 && t.dims[1] == 1)
        else {
            continue;
        };
        let Some(wv) = bytes8(wt).filter(|v| !v.is_empty()) else {
            continue;
        };
        let wzp = match input(3) {
            None => 0,
            Some(z) => match consts
                .tensor(g, z)
                .filter(|t| t.data_type == wt.data_type)
                .and_then(bytes8)
                .as_deref()
            {
                Some(&[v]) => v,
                _ => continue,
            },
        };
        let zero = match input(2) {
            None => None,
            Some(z) => {
                let dynamic = producer.get(z).is_some_and(|&p| {
                    let q = &g.node[p];
                    std(q)
                        && q.op_type == "DynamicQuantizeLinear"
                        && q.output.get(2).is_some_and(|o| o == z)
                });
                if dynamic {
                    Some(ZeroPoint::Name(z.to_string()))
                } else {
                    match consts.tensor(g, z).and_then(|t| {
                        let v = bytes8(t)?;
                        (v.len() == 1).then(|| (ElemType::from_code(t.data_type), v[0]))
                    }) {
                        Some((ty, v)) => Some(ZeroPoint::Value(ty, v as u8)),
                        None => continue,
                    }
                }
            }
        };
        // Exact only while no window's sum can reach 2^24: its k products, each at most
        // 255 · max|w − w_zp| in magnitude.
        let window: i64 = wt.dims[1..].iter().product();
        let widest = wv.iter().map(|&v| (v - wzp).abs()).max().unwrap_or(0);
        if window.saturating_mul(255).saturating_mul(widest) >= EXACT_F32 {
            continue;
        }
        let unread = [Some(w), input(3)]
            .into_iter()
            .flatten()
            .filter(|c| once(c))
            .map(str::to_string)
            .collect();
        found.push(Depthwise {
            conv: i,
            weights: wv.iter().map(|&v| (v - wzp) as f32).collect(),
            dims: wt.dims.clone(),
            zero,
            unread,
        });
    }
    found
}

pub(super) fn depthwise_float(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    let g: &GraphProto = proto.graph.as_ref()?;
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    if !g.node.iter().any(|n| {
        std(n) && n.op_type == "ConvInteger" && crate::onnx::attr::int(n, "group").unwrap_or(1) > 1
    }) {
        return None;
    }
    let found = find_depthwise(g);
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = super::graph::Names::of(graph);
    let mut unread: HashSet<String> = HashSet::new();
    let count = found.len();
    let mut by_node: std::collections::HashMap<usize, Vec<NodeProto>> = Default::default();
    for f in found {
        let conv = graph.node[f.conv].clone();
        let p = names.prefix(&conv.output[0]);
        let (one, zp, xf, w, yf) = (
            format!("{p}_one"),
            format!("{p}_x_zero"),
            format!("{p}_x_float"),
            format!("{p}_w_float"),
            format!("{p}_y_float"),
        );
        graph.initializer.push(TensorProto {
            name: one.clone(),
            data_type: ElemType::Float32.code(),
            raw_data: Bytes::from(1f32.to_le_bytes().to_vec()),
            ..Default::default()
        });
        graph.initializer.push(TensorProto {
            name: w.clone(),
            dims: f.dims,
            data_type: ElemType::Float32.code(),
            raw_data: Bytes::from(
                f.weights
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
            ..Default::default()
        });
        let zero = match f.zero {
            None => None,
            Some(ZeroPoint::Name(z)) => Some(z),
            Some(ZeroPoint::Value(ty, v)) => {
                graph.initializer.push(TensorProto {
                    name: zp.clone(),
                    data_type: ty.code(),
                    raw_data: Bytes::from(vec![v]),
                    ..Default::default()
                });
                Some(zp)
            }
        };
        let mut dq_in = vec![conv.input[0].as_str(), one.as_str()];
        if let Some(z) = &zero {
            dq_in.push(z);
        }
        let mut float_conv = super::graph::node("Conv", &[&xf, &w], &yf, Vec::new());
        // Conv and ConvInteger share their attributes (pads, strides, dilations, group, ...).
        float_conv.attribute = conv
            .attribute
            .iter()
            .filter(|a| a.r#type != AttributeType::Graph as i32)
            .cloned()
            .collect();
        let cast = super::graph::node(
            "Cast",
            &[&yf],
            &conv.output[0],
            vec![super::graph::int("to", ElemType::Int32.code() as i64)],
        );
        by_node.insert(
            f.conv,
            vec![
                super::graph::node("DequantizeLinear", &dq_in, &xf, Vec::new()),
                float_conv,
                cast,
            ],
        );
        unread.extend(f.unread);
    }
    let nodes = std::mem::take(&mut graph.node);
    for (i, n) in nodes.into_iter().enumerate() {
        match by_node.remove(&i) {
            Some(replacement) => graph.node.extend(replacement),
            None => graph.node.push(n),
        }
    }
    drop_constants(graph, &unread);
    applied.push(format!(
        "conv-integer-depthwise-float: {count} depthwise ConvInteger computed by a float Conv of the same integers (exact: every window's sum under 2^24)"
    ));
    Some(model)
}

#[cfg(test)]
mod tests {
    use super::super::conv_integer_uint8::conv_integer;
    use super::*;
    use crate::fixtures::models;

    fn ops(m: &ModelProto) -> Vec<&str> {
        let g = m.graph.as_ref().unwrap();
        g.node.iter().map(|n| n.op_type.as_str()).collect()
    }

    fn init<'a>(m: &'a ModelProto, name: &str) -> &'a TensorProto {
        let g = m.graph.as_ref().unwrap();
        g.initializer.iter().find(|t| t.name == name).unwrap()
    }

    fn node<'a>(m: &'a ModelProto, op: &str) -> &'a NodeProto {
        let g = m.graph.as_ref().unwrap();
        g.node.iter().find(|n| n.op_type == op).unwrap()
    }

    fn f32s(t: &TensorProto) -> Vec<f32> {
        t.raw_data
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    const GROUPED: &str = "conv-integer-depthwise-float: 1 depthwise ConvInteger computed by a float Conv of the same integers (exact: every window's sum under 2^24)";

    #[test]
    fn a_depthwise_conv_integer_becomes_a_float_conv_of_the_same_integers() {
        let m = models::conv_integer_grouped(1);
        let mut applied = Vec::new();
        let r = depthwise_float(&m, &mut applied).expect("rewritten");
        assert_eq!(applied, [GROUPED]);
        assert_eq!(
            ops(&r),
            [
                "DynamicQuantizeLinear",
                "DequantizeLinear",
                "Conv",
                "Cast",
                "Cast",
                "Mul"
            ]
        );
        // x − x_zp exactly: scale 1, DynamicQuantizeLinear's zero point.
        let dq = node(&r, "DequantizeLinear");
        assert_eq!(dq.input[0], "xq");
        assert_eq!(dq.input[2], "xzp");
        assert_eq!(f32s(init(&r, &dq.input[1])), [1.0]);
        // The Conv keeps ConvInteger's attributes and takes w − w_zp.
        let conv = node(&r, "Conv");
        assert_eq!(conv.input[0], dq.output[0]);
        assert_eq!(crate::onnx::attr::int(conv, "group"), Some(8));
        assert_eq!(
            crate::onnx::attr::ints(conv, "pads"),
            Some(vec![1, 1, 1, 1])
        );
        let w = init(&r, &conv.input[1]);
        assert_eq!(
            (w.data_type, w.dims.as_slice()),
            (ElemType::Float32.code(), &[8, 1, 3, 3][..])
        );
        let (q, zp) = models::conv_integer_weights();
        let want: Vec<f32> = q
            .iter()
            .map(|&v| f32::from(i16::from(v) - i16::from(zp)))
            .collect();
        assert_eq!(f32s(w), want);
        // Cast back to int32 under the ConvInteger's output name: the rest is untouched.
        let cast = &r.graph.as_ref().unwrap().node[3];
        assert_eq!(
            (cast.input[0].as_str(), cast.output[0].as_str()),
            (conv.output[0].as_str(), "c")
        );
        assert_eq!(
            crate::onnx::attr::int(cast, "to"),
            Some(ElemType::Int32.code() as i64)
        );
        let g = r.graph.as_ref().unwrap();
        assert!(!g
            .initializer
            .iter()
            .any(|t| t.name == "w_q" || t.name == "w_zp"));
        // Nothing left for the uint8 form; a plain ConvInteger is not this rewrite's.
        assert!(conv_integer(&r, &mut Vec::new()).is_none());
        // A plain ConvInteger, and groups of two channels, are not this rewrite's.
        assert!(depthwise_float(&models::conv_integer(false, false), &mut Vec::new()).is_none());
        assert!(depthwise_float(&models::conv_integer_grouped(2), &mut Vec::new()).is_none());
    }

    #[test]
    fn a_constant_input_zero_point_is_given_as_a_scalar_and_others_are_left_alone() {
        let mut m = models::conv_integer_grouped(1);
        let g = m.graph.as_mut().unwrap();
        g.initializer.push(TensorProto {
            name: "xz".into(),
            dims: vec![1],
            data_type: ElemType::Uint8.code(),
            raw_data: vec![117u8].into(),
            ..Default::default()
        });
        g.node[1].input[2] = "xz".into();
        let r = depthwise_float(&m, &mut Vec::new()).expect("rewritten");
        let z = init(&r, &node(&r, "DequantizeLinear").input[2]);
        assert_eq!(
            (z.data_type, z.dims.as_slice(), z.raw_data.as_ref()),
            (ElemType::Uint8.code(), &[][..], &[117u8][..])
        );
        // A zero point computed some other way: its shape is not known to be a scalar.
        let g = m.graph.as_mut().unwrap();
        g.node[1].input[2] = "xs".into();
        assert!(depthwise_float(&m, &mut Vec::new()).is_none());
    }

    #[test]
    fn windows_whose_sums_could_reach_2_to_the_24_are_left_alone() {
        // 255 · max|w − w_zp| (132 here) · window: 480 stays under 2^24, 512 does not.
        for (dims, taken) in [([1i64, 1, 20, 24], true), ([1, 1, 16, 32], false)] {
            let mut m = models::conv_integer_grouped(1);
            let g = m.graph.as_mut().unwrap();
            let n: i64 = dims.iter().product();
            let w = &mut g.initializer[0];
            w.dims = dims.to_vec();
            w.raw_data = (0..n)
                .map(|k| ((k * 37) % 255 - 127) as i8 as u8)
                .collect::<Vec<u8>>()
                .into();
            assert_eq!(
                depthwise_float(&m, &mut Vec::new()).is_some(),
                taken,
                "weights {dims:?}"
            );
        }
    }
}
