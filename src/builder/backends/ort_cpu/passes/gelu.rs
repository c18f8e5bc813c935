//! **`gelu`**: an erf GELU spelled out in five elementwise ops, `x · ½ · (1 + erf(x / √2))`
//! (`x · (1/√2)` for the division too), becomes one `com.microsoft.Gelu(x)`: the node ONNX
//! Runtime's own GELU fusion makes, whatever the grouping of the two products. ONNX Runtime
//! 1.31 fuses `(x · (1 + erf)) · ½` and `(x · ½) · (1 + erf)`, not `x · (½ · (1 + erf))` as
//! PyTorch's quantized exports write it; and in a QDQ model its pass that gives every
//! consumer of a `DequantizeLinear` its own copy makes the GELU's two reads of `x` two
//! tensors, which no fusion matches (smart_turn_v3_2's GELUs; the numbers: BENCHMARKS.md,
//! "Time to first inference, real-world models"). Only float32 constants, intermediates
//! nothing else reads, and the top-level graph.
//!
//! Enters: a decoded [`ModelProto`]. Leaves: the model with every such GELU replaced and one
//! line in `applied`; `None` when there is none.

use std::collections::HashSet;

use crate::onnx::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto};

/// ONNX Runtime's contrib domain, where `Gelu` lives.
const MS_DOMAIN: &str = "com.microsoft";

/// One GELU found: the nodes to drop, the node whose output `Gelu` takes over, and `x`.
struct Found {
    drop: Vec<usize>,
    last: usize,
    x: String,
}

/// `v` is `want` to float32 rounding.
fn near(v: f32, want: f64) -> bool {
    (f64::from(v) - want).abs() <= want.abs() * 1e-6
}

pub(super) fn gelu(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    let g: &GraphProto = proto.graph.as_ref()?;
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    if !g.node.iter().any(|n| std(n) && n.op_type == "Erf") {
        return None;
    }
    let consts = super::graph::Constants::of(g);
    let scalar = |name: &str| consts.scalar(g, name);
    let uses = super::graph::read_counts(g);
    let once = |name: &str| uses.get(name) == Some(&1);
    let (producer, reader) = (super::graph::producers(g), super::graph::readers(g));
    // The one node reading `name` (read once, by a top-level node) when it is a two-input
    // `op`: (node, its other input).
    let next = |name: &str, op: &str| -> Option<(usize, &str)> {
        if !once(name) {
            return None;
        }
        let i = *reader.get(name)?;
        let n = &g.node[i];
        if !std(n) || n.op_type != op || n.output.len() != 1 {
            return None;
        }
        match n.input.as_slice() {
            [a, b] if a == name && b != name => Some((i, b.as_str())),
            [a, b] if b == name && a != name => Some((i, a.as_str())),
            _ => None,
        }
    };
    let half = std::f64::consts::FRAC_1_SQRT_2;
    let mut found = Vec::new();
    let mut taken: HashSet<usize> = HashSet::new();
    for (ei, e) in g.node.iter().enumerate() {
        if !std(e) || e.op_type != "Erf" || e.input.len() != 1 || e.output.len() != 1 {
            continue;
        }
        // x / √2 or x · (1/√2), read only by the Erf.
        let u = e.input[0].as_str();
        let Some(&di) = producer.get(u).filter(|_| once(u)) else {
            continue;
        };
        let d = &g.node[di];
        let x = match (d.op_type.as_str(), d.input.as_slice()) {
            _ if !std(d) => continue,
            ("Div", [x, c]) if scalar(c).is_some_and(|v| near(v, std::f64::consts::SQRT_2)) => x,
            ("Mul", [x, c]) | ("Mul", [c, x]) if scalar(c).is_some_and(|v| near(v, half)) => x,
            _ => continue,
        };
        if scalar(x).is_some() {
            continue;
        }
        // 1 + erf(…)
        let Some((ai, one)) = next(&e.output[0], "Add") else {
            continue;
        };
        if scalar(one) != Some(1.0) {
            continue;
        }
        let Some((m1, with)) = next(&g.node[ai].output[0], "Mul") else {
            continue;
        };
        let hit = if scalar(with) == Some(0.5) {
            // x · (½ · (1 + erf))
            next(&g.node[m1].output[0], "Mul")
                .filter(|&(_, y)| y == x)
                .map(|(m2, _)| (vec![di, ei, ai, m1, m2], m2))
        } else if with == x {
            // (x · (1 + erf)) · ½
            next(&g.node[m1].output[0], "Mul")
                .filter(|&(_, k)| scalar(k) == Some(0.5))
                .map(|(m2, _)| (vec![di, ei, ai, m1, m2], m2))
        } else {
            // (x · ½) · (1 + erf)
            producer
                .get(with)
                .copied()
                .filter(|_| once(with))
                .filter(|&h| {
                    let n = &g.node[h];
                    std(n)
                        && n.op_type == "Mul"
                        && matches!(n.input.as_slice(),
                            [p, q] | [q, p] if p == x && scalar(q) == Some(0.5))
                })
                .map(|h| (vec![di, ei, ai, h, m1], m1))
        };
        let Some((drop, last)) = hit else { continue };
        if drop.iter().any(|d| !taken.insert(*d)) {
            continue;
        }
        found.push(Found {
            drop,
            last,
            x: x.to_string(),
        });
    }
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    if !model.opset_import.iter().any(|o| o.domain == MS_DOMAIN) {
        model.opset_import.push(OperatorSetIdProto {
            domain: MS_DOMAIN.into(),
            version: 1,
        });
    }
    let graph = model.graph.as_mut()?;
    let mut dropped = HashSet::new();
    for f in &found {
        let out = graph.node[f.last].output[0].clone();
        let name = graph.node[f.last].name.clone();
        graph.node[f.last] = NodeProto {
            op_type: "Gelu".into(),
            domain: MS_DOMAIN.into(),
            name,
            input: vec![f.x.clone()],
            output: vec![out],
            ..Default::default()
        };
        dropped.extend(f.drop.iter().copied().filter(|&d| d != f.last));
    }
    super::graph::remove_nodes(graph, &dropped);
    applied.push(format!(
        "gelu: {} x·½·(1 + erf(x/√2)) as com.microsoft.Gelu",
        found.len()
    ));
    Some(model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{model, tensor_f32, GraphBuilder, D};
    use crate::onnx::ElemType::Float32;

    /// x `[2, 8]` → GELU in grouping `grouping` (0: x·(½·p), 1: (x·p)·½, 2: (x·½)·p, where
    /// p = 1 + erf(x/√2)) → y; `leak`: p is also a graph output.
    fn gelu_model(grouping: u8, leak: bool) -> ModelProto {
        let mut g = GraphBuilder::new("gelu");
        g.input("x", Float32, &[D::Fixed(2), D::Fixed(8)])
            .output("y", Float32, None)
            .init(tensor_f32("sqrt2", &[], &[std::f32::consts::SQRT_2]))
            .init(tensor_f32("one", &[1], &[1.0]))
            .init(tensor_f32("half", &[], &[0.5]));
        if leak {
            g.output("p", Float32, None);
        }
        g.node("Div", &["x", "sqrt2"], &["d"]);
        g.node("Erf", &["d"], &["e"]);
        g.node("Add", &["one", "e"], &["p"]);
        match grouping {
            0 => {
                g.node("Mul", &["half", "p"], &["hp"]);
                g.node("Mul", &["x", "hp"], &["y"]);
            }
            1 => {
                g.node("Mul", &["p", "x"], &["xp"]);
                g.node("Mul", &["xp", "half"], &["y"]);
            }
            _ => {
                g.node("Mul", &["x", "half"], &["hx"]);
                g.node("Mul", &["hx", "p"], &["y"]);
            }
        }
        model(g.build(), &[("", 13)])
    }

    #[test]
    fn every_grouping_of_the_erf_gelu_becomes_one_gelu() {
        for grouping in 0..3 {
            let mut applied = Vec::new();
            let r = gelu(&gelu_model(grouping, false), &mut applied).expect("rewritten");
            let g = r.graph.as_ref().unwrap();
            assert_eq!(g.node.len(), 1, "grouping {grouping}");
            let n = &g.node[0];
            assert_eq!((n.op_type.as_str(), n.domain.as_str()), ("Gelu", MS_DOMAIN));
            assert_eq!(
                (n.input.as_slice(), n.output.as_slice()),
                (&["x".to_string()][..], &["y".to_string()][..])
            );
            assert!(r
                .opset_import
                .iter()
                .any(|o| o.domain == MS_DOMAIN && o.version == 1));
            assert_eq!(
                applied,
                ["gelu: 1 x·½·(1 + erf(x/√2)) as com.microsoft.Gelu"]
            );
        }
    }

    #[test]
    fn a_gelu_whose_parts_are_read_elsewhere_is_left_alone() {
        assert!(gelu(&gelu_model(0, true), &mut Vec::new()).is_none());
    }
}
