//! **`conv-integer-uint8`**: a `ConvInteger` whose weights are int8 constants gets the same weights
//! as uint8, `w + 128` with the zero point `w_zp + 128` (128 when it had none). Every product
//! `(x − x_zp)·(w − w_zp)` is the same integer, so the int32 result is identical, bit for bit.
//! Why: ONNX Runtime 1.31 runs `ConvInteger` with int8 weights several times slower than with
//! uint8 ones, which run as fast as its float Conv (`benches/conv_integer.py`; the numbers:
//! BENCHMARKS.md, "Time to first inference, real-world models"), and ONNX Runtime's own
//! dynamic quantization (`quantize_dynamic`, int8 weights by default) writes every Conv as
//! `DynamicQuantizeLinear → ConvInteger`, so such models spend most of a run there.
//!
//! Left alone: uint8 weights (already the fast kind), weights computed at run time, stored
//! outside the graph file or overridable (a graph input), a weight zero point of more than one
//! value (per channel, which ONNX Runtime 1.31's `ConvInteger` refuses itself) or not a
//! constant, and `ConvInteger`s in control-flow bodies.
//!
//! Enters: a decoded [`ModelProto`]. Leaves: the model with every such `ConvInteger`'s weights
//! given as uint8 and one line in `applied`; `None` when there is none.

use std::collections::HashSet;

use bytes::Bytes;

use super::graph::{bytes8, drop_constants};
use crate::onnx::proto::{GraphProto, ModelProto, NodeProto, TensorProto};
use crate::onnx::ElemType;

/// One `ConvInteger` taken: its weights and zero point, shifted into uint8.
struct Found {
    conv: usize,
    weights: Vec<u8>,
    dims: Vec<i64>,
    zero: u8,
    /// The zero point's shape (`[]` when the node had none).
    zero_dims: Vec<i64>,
    /// Constants only this node read (dropped with their int8 form).
    unread: Vec<String>,
}

pub(super) fn conv_integer(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    let g: &GraphProto = proto.graph.as_ref()?;
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    if !g.node.iter().any(|n| std(n) && n.op_type == "ConvInteger") {
        return None;
    }
    let consts = super::graph::Constants::of(g);
    let uses = super::graph::read_counts(g);
    let once = |name: &str| uses.get(name) == Some(&1);
    let mut found = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        if !std(n) || n.op_type != "ConvInteger" || n.output.len() != 1 {
            continue;
        }
        let input = |k: usize| n.input.get(k).map(String::as_str).filter(|s| !s.is_empty());
        let Some(w) = input(1) else {
            continue;
        };
        let Some(wt) = consts.tensor(g, w) else {
            continue;
        };
        let Some(weights) = int8s(wt).filter(|v| !v.is_empty()) else {
            continue;
        };
        let (zero, zero_dims) = match input(3) {
            None => (0, vec![]),
            Some(z) => match consts.tensor(g, z) {
                Some(t) => match int8s(t).as_deref() {
                    Some(&[v]) => (v, t.dims.clone()),
                    _ => continue,
                },
                None => continue,
            },
        };
        let unread = [Some(w), input(3)]
            .into_iter()
            .flatten()
            .filter(|c| once(c))
            .map(str::to_string)
            .collect();
        found.push(Found {
            conv: i,
            weights: weights.iter().map(|&v| shift(v)).collect(),
            dims: wt.dims.clone(),
            zero: shift(zero),
            zero_dims,
            unread,
        });
    }
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = super::graph::Names::of(graph);
    let mut unread: HashSet<String> = HashSet::new();
    let count = found.len();
    for f in found {
        let p = names.prefix(&graph.node[f.conv].output[0]);
        let (w, z) = (format!("{p}_w_u8"), format!("{p}_w_zero_u8"));
        let uint8 = |name: &str, dims: Vec<i64>, v: Vec<u8>| TensorProto {
            name: name.into(),
            dims,
            data_type: ElemType::Uint8.code(),
            raw_data: Bytes::from(v),
            ..Default::default()
        };
        graph.initializer.push(uint8(&w, f.dims, f.weights));
        graph.initializer.push(uint8(&z, f.zero_dims, vec![f.zero]));
        let conv = &mut graph.node[f.conv];
        conv.input.resize(4, String::new());
        conv.input[1] = w;
        conv.input[3] = z;
        unread.extend(f.unread);
    }
    drop_constants(graph, &unread);
    applied.push(format!(
        "conv-integer-uint8: {count} ConvInteger with int8 weights given them as uint8 (+128, the same integers)"
    ));
    Some(model)
}

/// An int8 value as uint8 with the same distance to every other value: `v + 128`.
fn shift(v: i8) -> u8 {
    (i16::from(v) + 128) as u8
}

/// The values of an inline int8 tensor (raw or `int32_data`), one per element of its shape;
/// `None` for another type, external data, a value out of range or a size mismatch.
fn int8s(t: &TensorProto) -> Option<Vec<i8>> {
    if ElemType::from_code(t.data_type) != ElemType::Int8 {
        return None;
    }
    Some(bytes8(t)?.into_iter().map(|v| v as i8).collect())
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn int8_weights_become_the_same_integers_as_uint8() {
        let (q, zp) = models::conv_integer_weights();
        for (bias_add, leak) in [(false, false), (true, false), (false, true)] {
            let m = models::conv_integer(bias_add, leak);
            let mut applied = Vec::new();
            let r = conv_integer(&m, &mut applied).expect("rewritten");
            // Only the weights change: the graph's ops and the int32 result stay.
            assert_eq!(ops(&r), ops(&m), "bias_add {bias_add} leak {leak}");
            let g = r.graph.as_ref().unwrap();
            let conv = g.node.iter().find(|n| n.op_type == "ConvInteger").unwrap();
            assert_eq!(&conv.input[..3], &["xq", &conv.input[1], "xzp"]);
            let w = init(&r, &conv.input[1]);
            let z = init(&r, &conv.input[3]);
            assert_eq!(
                (w.data_type, w.dims.as_slice()),
                (ElemType::Uint8.code(), &[4, 2, 3, 3][..])
            );
            assert_eq!(
                (z.data_type, z.dims.as_slice()),
                (ElemType::Uint8.code(), &[][..])
            );
            for (k, (&u, &s)) in w.raw_data.iter().zip(&q).enumerate() {
                // The same distance to the zero point, so the same products.
                assert_eq!(
                    i32::from(u) - i32::from(z.raw_data[0]),
                    i32::from(s) - i32::from(zp),
                    "weight {k}"
                );
            }
            // The int8 forms were read by this node only: gone.
            assert!(!g
                .initializer
                .iter()
                .any(|t| t.name == "w_q" || t.name == "w_zp"));
            assert_eq!(
                applied,
                ["conv-integer-uint8: 1 ConvInteger with int8 weights given them as uint8 (+128, the same integers)"]
            );
        }
    }

    #[test]
    fn weights_without_a_zero_point_get_128() {
        let mut m = models::conv_integer(false, false);
        m.graph.as_mut().unwrap().node[1].input.truncate(3);
        let r = conv_integer(&m, &mut Vec::new()).expect("rewritten");
        let conv = &r.graph.as_ref().unwrap().node[1];
        assert_eq!(conv.input.len(), 4);
        assert_eq!(init(&r, &conv.input[3]).raw_data.as_ref(), &[128]);
        let (q, _) = models::conv_integer_weights();
        let w = init(&r, &conv.input[1]);
        assert!(w
            .raw_data
            .iter()
            .zip(&q)
            .all(|(&u, &s)| i32::from(u) - 128 == i32::from(s)));
    }

    #[test]
    fn uint8_weights_and_graph_inputs_are_left_alone() {
        let mut m = models::conv_integer(false, false);
        for t in &mut m.graph.as_mut().unwrap().initializer {
            t.data_type = ElemType::Uint8.code();
        }
        assert!(conv_integer(&m, &mut Vec::new()).is_none());
        // Overridable weights: an initializer that is also a graph input.
        let mut m = models::conv_integer(false, false);
        let g = m.graph.as_mut().unwrap();
        let w = g.initializer[0].name.clone();
        g.input
            .push(crate::fixtures::value_info(&w, ElemType::Int8, None));
        assert!(conv_integer(&m, &mut Vec::new()).is_none());
    }
}
