//! **`conv-integer`**: a `ConvInteger` whose weights are constants, and whose int32 result goes
//! only to a float cast (through at most one `Add`, of the quantized bias), becomes the same
//! sum computed by a float `Conv`: `DequantizeLinear(x, 1, x_zp)` is `x − x_zp` exactly, and
//! the weights become the constant `w − w_zp` in float32. This is what ONNX Runtime's own
//! dynamic quantization (`quantize_dynamic`) writes for every Conv:
//! `DynamicQuantizeLinear → ConvInteger → Cast(float) → Mul(scales)`, older versions with an
//! int32 `Add` of the bias before the cast. ONNX Runtime 1.31 runs `ConvInteger` through
//! im2col and an integer GEMM with no layout of its own and fuses nothing around it; its float
//! Conv is 3–4× faster on the same shapes (hifigan_int8's 74: 133 ms of a 146 ms first run,
//! the rewritten model's whole run 55 ms).
//!
//! Exactness: each product of two 8-bit values, and every partial sum under 2²⁴ in magnitude,
//! is exact in float32; a longer sum rounds to float32's 24 bits as the reference's own cast
//! of the int32 result does. hifigan_int8's outputs came out bit-identical. The validation
//! compares the artifact with the model as given, as for every rewrite.
//!
//! The float weights take four times the int8 ones' bytes (in the artifact and in a
//! consumer's memory). `--no-rewrite` (or `rewrite = false`) keeps `ConvInteger`.
//!
//! Left alone: weights computed at run time, stored outside the graph file, or overridable
//! (a graph input); a weight zero point of more than one value (per channel, which ONNX
//! Runtime 1.31's `ConvInteger` refuses itself); an input zero point other than
//! `DynamicQuantizeLinear`'s or a one-element constant; an int32 result read by anything
//! else; and `ConvInteger`s in control-flow bodies.
//!
//! Enters: a decoded [`ModelProto`]. Leaves: the model with every such `ConvInteger` replaced
//! and one line in `applied`; `None` when there is none.

use std::collections::{HashMap, HashSet};

use crate::onnx::proto::{GraphProto, ModelProto, NodeProto, TensorProto};
use crate::onnx::ElemType;

/// Where the input's zero point comes from.
enum InputZero {
    /// None given: zero.
    Absent,
    /// A scalar tensor of the graph (`DynamicQuantizeLinear`'s third output).
    Scalar(String),
    /// A one-element constant, given again as a scalar of its type.
    Value(ElemType, i32),
}

/// One `ConvInteger` taken.
struct Found {
    conv: usize,
    x: String,
    zero: InputZero,
    /// `w − w_zp` as float32, in the weight's shape.
    weights: Vec<f32>,
    dims: Vec<i64>,
    /// The `Add` of the int32 bias between the Conv and the cast: (node, its other input).
    add: Option<(usize, String)>,
    /// The cast to float, whose output the float result takes over.
    cast: usize,
    /// Constants only this node read (dropped with it).
    unread: Vec<String>,
}

pub(super) fn conv_integer(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    let g: &GraphProto = proto.graph.as_ref()?;
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    if !g.node.iter().any(|n| std(n) && n.op_type == "ConvInteger") {
        return None;
    }
    let consts = super::Constants::of(g);
    let uses = super::read_counts(g);
    let once = |name: &str| uses.get(name) == Some(&1);
    let (producer, reader) = (super::producers(g), super::readers(g));
    let cast_to_float = |i: usize| {
        let n = &g.node[i];
        std(n)
            && n.op_type == "Cast"
            && n.output.len() == 1
            && crate::onnx::attr::int(n, "to") == Some(ElemType::Float32.code() as i64)
    };
    let mut found = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        if !std(n) || n.op_type != "ConvInteger" || n.output.len() != 1 {
            continue;
        }
        let input = |k: usize| n.input.get(k).map(String::as_str).filter(|s| !s.is_empty());
        let (Some(x), Some(w)) = (input(0), input(1)) else {
            continue;
        };
        let Some(wt) = consts.tensor(g, w).filter(|t| t.dims.len() >= 3) else {
            continue;
        };
        let Some(wv) = small_ints(wt) else {
            continue;
        };
        if wv.is_empty() {
            continue;
        }
        let wzp = match input(3) {
            None => vec![0],
            Some(z) => match consts
                .tensor(g, z)
                .filter(|t| t.data_type == wt.data_type && t.dims.len() <= 1)
                .and_then(small_ints)
            {
                Some(v) if v.len() == 1 => v,
                _ => continue,
            },
        };
        let zero = match input(2) {
            None => InputZero::Absent,
            Some(z) => {
                let dynamic = producer.get(z).is_some_and(|&p| {
                    let q = &g.node[p];
                    std(q)
                        && q.op_type == "DynamicQuantizeLinear"
                        && q.output.get(2).is_some_and(|o| o == z)
                });
                match consts.tensor(g, z) {
                    _ if dynamic => InputZero::Scalar(z.to_string()),
                    Some(t) => match small_ints(t).as_deref() {
                        Some(&[v]) => InputZero::Value(ElemType::from_code(t.data_type), v),
                        _ => continue,
                    },
                    None => continue,
                }
            }
        };
        // The int32 result: cast to float, or first added to the int32 bias.
        let out = n.output[0].as_str();
        if !once(out) {
            continue;
        }
        let Some(&r) = reader.get(out) else {
            continue;
        };
        let (add, cast) = if cast_to_float(r) {
            (None, r)
        } else {
            let a = &g.node[r];
            let other = match a.input.as_slice() {
                [p, q] if p == out && q != out => q,
                [q, p] if p == out && q != out => q,
                _ => continue,
            };
            if !std(a) || a.op_type != "Add" || a.output.len() != 1 || !once(&a.output[0]) {
                continue;
            }
            match reader.get(a.output[0].as_str()) {
                Some(&c) if cast_to_float(c) => (Some((r, other.clone())), c),
                _ => continue,
            }
        };
        let weights = wv.iter().map(|&v| (v - wzp[0]) as f32).collect();
        let x_zero = input(2).filter(|_| matches!(zero, InputZero::Value(..)));
        let unread = [Some(w), input(3), x_zero]
            .into_iter()
            .flatten()
            .filter(|c| once(c))
            .map(str::to_string)
            .collect();
        found.push(Found {
            conv: i,
            x: x.to_string(),
            zero,
            weights,
            dims: wt.dims.clone(),
            add,
            cast,
            unread,
        });
    }
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = super::Names::of(graph);
    let one = format!("{}_one", names.prefix("conv_integer"));
    graph.initializer.push(scalar_f32(&one, 1.0));
    // Nodes to insert before an index, nodes to drop, and what replaces a node.
    let mut before: HashMap<usize, Vec<NodeProto>> = HashMap::new();
    let mut dropped: HashSet<usize> = HashSet::new();
    let mut unread: HashSet<String> = HashSet::new();
    for f in &found {
        let p = names.prefix(&graph.node[f.conv].output[0]);
        let (xf, wf) = (format!("{p}_x"), format!("{p}_w"));
        let mut dq = vec![f.x.clone(), one.clone()];
        match &f.zero {
            InputZero::Absent => {}
            InputZero::Scalar(z) => dq.push(z.clone()),
            InputZero::Value(t, v) => {
                let z = format!("{p}_x_zero");
                graph.initializer.push(TensorProto {
                    name: z.clone(),
                    data_type: t.code(),
                    int32_data: vec![*v],
                    ..Default::default()
                });
                dq.push(z);
            }
        }
        let dq: Vec<&str> = dq.iter().map(String::as_str).collect();
        before
            .entry(f.conv)
            .or_default()
            .push(super::node("DequantizeLinear", &dq, &xf, vec![]));
        let mut w = TensorProto {
            name: wf.clone(),
            dims: f.dims.clone(),
            data_type: ElemType::Float32.code(),
            ..Default::default()
        };
        super::set_floats(&mut w, f.weights.iter().copied());
        graph.initializer.push(w);
        let cast_out = graph.node[f.cast].output[0].clone();
        let conv_out = match &f.add {
            None => cast_out.clone(),
            Some(_) => format!("{p}_sum"),
        };
        let conv = &mut graph.node[f.conv];
        let int_out = conv.output[0].clone();
        conv.op_type = "Conv".into();
        conv.input = vec![xf, wf];
        conv.output = vec![conv_out.clone()];
        if let Some((a, other)) = &f.add {
            let bias = format!("{p}_bias");
            let to = super::int("to", ElemType::Float32.code() as i64);
            before
                .entry(*a)
                .or_default()
                .push(super::node("Cast", &[other], &bias, vec![to]));
            let add = &mut graph.node[*a];
            for i in add.input.iter_mut() {
                *i = if *i == int_out {
                    conv_out.clone()
                } else {
                    bias.clone()
                };
            }
            add.output = vec![cast_out];
        }
        dropped.insert(f.cast);
        unread.extend(f.unread.iter().cloned());
    }
    graph
        .initializer
        .retain(|t| !unread.contains(t.name.as_str()));
    let old = std::mem::take(&mut graph.node);
    for (i, n) in old.into_iter().enumerate() {
        graph.node.extend(before.remove(&i).unwrap_or_default());
        let constant = n.op_type == "Constant" && n.output.iter().any(|o| unread.contains(o));
        if !dropped.contains(&i) && !constant {
            graph.node.push(n);
        }
    }
    applied.push(format!(
        "conv-integer: {} ConvInteger as a float Conv of the same integers",
        found.len()
    ));
    Some(model)
}

/// The values of an inline int8 or uint8 tensor (raw or `int32_data`), one per element of
/// its shape; `None` for another type, external data or a size mismatch.
fn small_ints(t: &TensorProto) -> Option<Vec<i32>> {
    if !t.external_data.is_empty() {
        return None;
    }
    let n = t
        .dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))?;
    let v: Vec<i32> = match ElemType::from_code(t.data_type) {
        ElemType::Int8 | ElemType::Uint8 if t.raw_data.is_empty() => t.int32_data.clone(),
        ElemType::Int8 => t.raw_data.iter().map(|&b| i32::from(b as i8)).collect(),
        ElemType::Uint8 => t.raw_data.iter().map(|&b| i32::from(b)).collect(),
        _ => return None,
    };
    (v.len() == n).then_some(v)
}

fn scalar_f32(name: &str, v: f32) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: ElemType::Float32.code(),
        float_data: vec![v],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::models;

    fn ops(m: &ModelProto) -> Vec<&str> {
        let g = m.graph.as_ref().unwrap();
        g.node.iter().map(|n| n.op_type.as_str()).collect()
    }

    #[test]
    fn a_dynamically_quantized_conv_becomes_a_float_conv_of_the_same_integers() {
        for bias_add in [false, true] {
            let mut applied = Vec::new();
            let m = models::conv_integer(bias_add, false);
            let r = conv_integer(&m, &mut applied).expect("rewritten");
            let want: &[&str] = if bias_add {
                &[
                    "DynamicQuantizeLinear",
                    "DequantizeLinear",
                    "Conv",
                    "Cast",
                    "Add",
                    "Mul",
                ]
            } else {
                &["DynamicQuantizeLinear", "DequantizeLinear", "Conv", "Mul"]
            };
            assert_eq!(ops(&r), want, "bias_add {bias_add}");
            let g = r.graph.as_ref().unwrap();
            // The int8 weights and their zero point are gone; the float ones are w − w_zp.
            assert!(!g
                .initializer
                .iter()
                .any(|t| t.name == "w_q" || t.name == "w_zp"));
            let wf = g
                .initializer
                .iter()
                .find(|t| t.dims == [4, 2, 3, 3] && t.data_type == ElemType::Float32.code())
                .expect("float weights");
            let v = super::super::inline_floats(wf).unwrap();
            let (q, zp) = models::conv_integer_weights();
            for (k, (&f, &q)) in v.iter().zip(&q).enumerate() {
                assert_eq!(f, f32::from(q) - f32::from(zp), "weight {k}");
            }
            assert_eq!(
                applied,
                ["conv-integer: 1 ConvInteger as a float Conv of the same integers"]
            );
        }
    }

    #[test]
    fn a_constant_input_zero_point_is_given_again_as_a_scalar() {
        // A one-element `[1]` zero point: DequantizeLinear needs a scalar for one per tensor.
        let mut m = models::conv_integer(false, false);
        let g = m.graph.as_mut().unwrap();
        g.initializer.push(TensorProto {
            name: "xzp0".into(),
            dims: vec![1],
            data_type: ElemType::Uint8.code(),
            raw_data: vec![3u8].into(),
            ..Default::default()
        });
        g.node[1].input[2] = "xzp0".into();
        let r = conv_integer(&m, &mut Vec::new()).expect("rewritten");
        let g = r.graph.as_ref().unwrap();
        let dq = g
            .node
            .iter()
            .find(|n| n.op_type == "DequantizeLinear")
            .unwrap();
        let zero = g
            .initializer
            .iter()
            .find(|t| t.name == dq.input[2])
            .unwrap();
        assert!(zero.dims.is_empty());
        assert_eq!(
            (zero.data_type, zero.int32_data.as_slice()),
            (ElemType::Uint8.code(), &[3][..])
        );
        // xzp0 was read by the ConvInteger only: it goes with it.
        assert!(!g.initializer.iter().any(|t| t.name == "xzp0"));
    }

    #[test]
    fn an_int32_result_read_elsewhere_is_left_alone() {
        assert!(conv_integer(&models::conv_integer(false, true), &mut Vec::new()).is_none());
    }
}
