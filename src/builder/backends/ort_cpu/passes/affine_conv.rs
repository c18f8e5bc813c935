//! **`affine-conv`**: a scalar scale (and shift) in front of a Conv, folded into its weights
//! (and bias): `Conv(a·x + b; W, B)` is `Conv(x; a·W, B + b·ΣW)` where ΣW sums each output
//! channel's weights, exactly (up to float rounding) when the Conv pads nothing (a padded
//! border would read `b` where the original read zeros); a scale alone folds into any Conv.
//! PaddlePaddle's learnable affine blocks after an activation (PP-LCNetV3: `HardSwish →
//! Mul(a) → Add(b) → Conv`, 12–13 per PP-OCRv5 model into a pointwise Conv) are written this
//! way; ONNX Runtime 1.31 fuses none. A scalar that ends an activation ONNX Runtime fuses is
//! left alone: the `· 0.5` of an erf or tanh GELU (PP-OCRv6 writes its 13 GELUs so, each
//! before a Conv) — folding it broke ORT's GELU fusion and left four elementwise ops and a
//! layout round trip in its place, a longer session and first run (ppocrv6_det_tiny;
//! BENCHMARKS.md, "Time to first inference, real-world models"). The chain may pass through `Identity` nodes (paddle2onnx writes one after
//! nearly every op). Weights stored outside the graph file, shared with another node or
//! overridable, non-finite constants, `auto_pad` other than `NOTSET`/`VALID` with a shift,
//! and Convs in control-flow bodies are left alone.
//!
//! Enters: a decoded [`ModelProto`]. Leaves: the model with every such chain folded and one
//! line in `applied`; `None` when there is none.

use std::collections::{HashMap, HashSet};

use crate::onnx::proto::{GraphProto, ModelProto, NodeProto, TensorProto};
use crate::onnx::ElemType;

/// One Conv whose input chain is folded.
struct Fold {
    conv: usize,
    /// The Mul, the Add and the Identities between them and the Conv.
    drop: Vec<usize>,
    /// What the Conv reads instead: the scaled tensor.
    input: String,
    a: f32,
    b: f32,
}

pub(super) fn affine_conv<'a>(
    proto: &'a ModelProto,
    applied: &mut Vec<String>,
) -> Option<ModelProto> {
    let g: &'a GraphProto = proto.graph.as_ref()?;
    if !g.node.iter().any(|n| n.op_type == "Conv") {
        return None;
    }
    let consts = super::graph::Constants::of(g);
    let found = find(g, &consts);
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = super::graph::Names::of(graph);
    let mut dropped = HashSet::new();
    for f in &found {
        let w = graph.node[f.conv].input[1].clone();
        let bias = graph.node[f.conv].input.get(2).cloned();
        // Each output channel's weight sum, before the scale.
        let sums: Vec<f32> = {
            let t = consts.tensor(graph, &w)?;
            let v = super::graph::inline_floats(t)?;
            let per = v.len() / usize::try_from(t.dims[0]).ok()?.max(1);
            v.chunks(per.max(1)).map(|c| c.iter().sum()).collect()
        };
        let (a, b) = (f.a, f.b);
        let m = super::graph::scale(graph, &consts, &w, |_, v| v * a)?;
        match bias {
            Some(bias) if b != 0.0 => {
                super::graph::scale(graph, &consts, &bias, |k, v| v + b * sums[k])?;
            }
            None if b != 0.0 => {
                let name = format!("{}_bias", names.prefix(&graph.node[f.conv].output[0]));
                let mut t = TensorProto {
                    name: name.clone(),
                    dims: vec![m],
                    data_type: ElemType::Float32.code(),
                    ..Default::default()
                };
                super::graph::set_floats(&mut t, sums.iter().map(|s| b * s));
                graph.initializer.push(t);
                graph.node[f.conv].input.push(name);
            }
            _ => {}
        }
        graph.node[f.conv].input[0] = f.input.clone();
        dropped.extend(f.drop.iter().copied());
    }
    super::graph::remove_nodes(graph, &dropped);
    applied.push(format!(
        "affine-conv: {} scalar Mul/Add before a Conv folded into its weights and bias",
        found.len()
    ));
    Some(model)
}

/// Every Conv of `g` that [`affine_conv`] can fold the scale and shift before it into, with
/// what goes.
fn find<'a>(g: &'a GraphProto, consts: &super::graph::Constants<'a>) -> Vec<Fold> {
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    let producer = super::graph::producers(g);
    let tensor = |name: &str| consts.tensor(g, name);
    let scalar = |name: &str| consts.scalar(g, name);
    let uses = super::graph::read_counts(g);
    let once = |name: &str| uses.get(name) == Some(&1);
    // The node producing `name` when `name` feeds nothing else and the node is `op` with one
    // output reading a finite one-element float32 constant: (node, the other input, value).
    let scaled = |name: &str, op: &str| -> Option<(usize, &'a str, f32)> {
        if !once(name) {
            return None;
        }
        let j = *producer.get(name)?;
        let n: &'a NodeProto = &g.node[j];
        if !std(n) || n.op_type != op || n.output.len() != 1 {
            return None;
        }
        match n.input.as_slice() {
            [p, q] if p != q => match (scalar(p), scalar(q)) {
                (None, Some(v)) => Some((j, p.as_str(), v)),
                (Some(v), None) => Some((j, q.as_str(), v)),
                _ => None,
            },
            _ => None,
        }
    };
    // `name` followed back through Identities that feed nothing else.
    let back = |mut name: &'a str, passed: &mut Vec<usize>| -> &'a str {
        while once(name) {
            let Some(&j) = producer.get(name) else { break };
            let n: &'a NodeProto = &g.node[j];
            if !std(n) || n.op_type != "Identity" || n.input.len() != 1 || n.output.len() != 1 {
                break;
            }
            passed.push(j);
            name = &n.input[0];
        }
        name
    };
    let mut found = Vec::new();
    let mut taken: HashSet<usize> = HashSet::new();
    for (i, n) in g.node.iter().enumerate() {
        if !std(n) || n.op_type != "Conv" || n.output.len() != 1 {
            continue;
        }
        let (x, w, b) = match n.input.as_slice() {
            [x, w] => (x.as_str(), w.as_str(), None),
            [x, w, b] if !b.is_empty() => (x.as_str(), w.as_str(), Some(b.as_str())),
            _ => continue,
        };
        let Some(m) = tensor(w)
            .filter(|t| t.dims.len() >= 3 && super::graph::inline_floats(t).is_some())
            .map(|t| t.dims[0])
        else {
            continue;
        };
        if !once(w) || b.is_some_and(|b| !once(b)) {
            continue;
        }
        if let Some(b) = b {
            let ok = tensor(b).is_some_and(|t| {
                t.dims.as_slice() == [m] && super::graph::inline_floats(t).is_some()
            });
            if !ok {
                continue;
            }
        }
        let mut drop = Vec::new();
        let mut at = back(x, &mut drop);
        let mut shift = 0.0;
        if let Some((add, y, v)) = scaled(at, "Add") {
            drop.push(add);
            shift = v;
            at = back(y, &mut drop);
        }
        let Some((mul, y, a)) = scaled(at, "Mul") else {
            continue;
        };
        if ends_gelu(g, &producer, y) {
            continue;
        }
        drop.push(mul);
        if shift != 0.0 && !unpadded(n) {
            continue;
        }
        // Two Convs never share a chain (each name in it is read once), but be sure.
        if drop.iter().any(|d| !taken.insert(*d)) {
            continue;
        }
        found.push(Fold {
            conv: i,
            drop,
            input: y.to_string(),
            a,
            b: shift,
        });
    }
    found
}

/// Whether `name` comes out of an erf or tanh GELU short of its last scalar factor
/// (`x · (1 + erf(x/√2))`, `x · (1 + tanh(…))`): an `Erf` or `Tanh` within four elementwise
/// steps up. ONNX Runtime fuses the whole GELU (its `· 0.5` included) into one kernel.
fn ends_gelu(g: &GraphProto, producer: &HashMap<&str, usize>, name: &str) -> bool {
    let mut at = vec![name];
    for _ in 0..4 {
        let mut next = Vec::new();
        for x in at {
            let Some(&j) = producer.get(x) else { continue };
            let n = &g.node[j];
            match n.op_type.as_str() {
                "Erf" | "Tanh" => return true,
                "Mul" | "Add" | "Div" | "Sub" | "Pow" | "Identity" => {
                    next.extend(n.input.iter().map(String::as_str))
                }
                _ => {}
            }
        }
        at = next;
    }
    false
}

/// Whether a Conv pads nothing (no `pads` or all zero, `auto_pad` absent, NOTSET or VALID).
fn unpadded(n: &NodeProto) -> bool {
    let pads = crate::onnx::attr::ints(n, "pads").unwrap_or_default();
    let auto = crate::onnx::attr::string(n, "auto_pad").unwrap_or_default();
    pads.iter().all(|&p| p == 0) && matches!(auto.as_str(), "" | "NOTSET" | "VALID")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attr, model, random_f32, tensor_f32, GraphBuilder, D};
    use crate::onnx::ElemType::Float32;

    /// x `[1, 4, 6, 6]` → Mul(a) [→ Identity → Add(b)] → Conv(W `[8, 4, k, k]`, pads p) → y.
    fn chain(shift: bool, k: i64, pad: i64) -> ModelProto {
        let mut g = GraphBuilder::new("affine_conv");
        g.input(
            "x",
            Float32,
            &[D::Fixed(1), D::Fixed(4), D::Fixed(6), D::Fixed(6)],
        )
        .output("y", Float32, None);
        let n = (8 * 4 * k * k) as usize;
        g.init(tensor_f32("w", &[8, 4, k, k], &random_f32(3, n, 0.3)))
            .init(tensor_f32("a", &[1], &[0.5]))
            .init(tensor_f32("b", &[], &[0.25]));
        g.node("Mul", &["a", "x"], &["scaled"]);
        let into = if shift {
            g.node("Identity", &["scaled"], &["id"]);
            g.node("Add", &["id", "b"], &["shifted"]);
            "shifted"
        } else {
            "scaled"
        };
        g.node("Conv", &[into, "w"], &["y"])
            .attribute
            .push(attr::ints("pads", &[pad; 4]));
        model(g.build(), &[("", 13)])
    }

    fn values(m: &ModelProto, name: &str) -> Vec<f32> {
        let t = m
            .graph
            .as_ref()
            .unwrap()
            .initializer
            .iter()
            .find(|t| t.name == name);
        super::super::graph::inline_floats(t.unwrap()).unwrap()
    }

    #[test]
    fn a_scale_and_shift_before_an_unpadded_conv_go_into_its_weights_and_bias() {
        let m = chain(true, 1, 0);
        let mut applied = Vec::new();
        let r = affine_conv(&m, &mut applied).expect("folded");
        let g = r.graph.as_ref().unwrap();
        let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Conv"]);
        assert_eq!(g.node[0].input[0], "x");
        let (w0, w1) = (values(&m, "w"), values(&r, "w"));
        assert!(w0.iter().zip(&w1).all(|(a, b)| a * 0.5 == *b));
        let bias = values(&r, &g.node[0].input[2]);
        for (k, b) in bias.iter().enumerate() {
            let sum: f32 = w0[k * 4..(k + 1) * 4].iter().sum();
            assert_eq!(*b, 0.25 * sum, "channel {k}");
        }
        assert_eq!(
            applied,
            ["affine-conv: 1 scalar Mul/Add before a Conv folded into its weights and bias"]
        );
    }

    #[test]
    fn the_half_that_ends_a_gelu_is_left_for_onnx_runtime_to_fuse() {
        // x → Div(√2) → Erf → Add(1) → Mul(x) → Mul(0.5) → Conv: ORT fuses the five into Gelu.
        let mut g = GraphBuilder::new("gelu_conv");
        g.input(
            "x",
            Float32,
            &[D::Fixed(1), D::Fixed(4), D::Fixed(6), D::Fixed(6)],
        )
        .output("y", Float32, None)
        .init(tensor_f32("w", &[8, 4, 1, 1], &random_f32(3, 32, 0.3)))
        .init(tensor_f32("sqrt2", &[], &[std::f32::consts::SQRT_2]))
        .init(tensor_f32("one", &[], &[1.0]))
        .init(tensor_f32("half", &[], &[0.5]));
        g.node("Div", &["x", "sqrt2"], &["d"]);
        g.node("Erf", &["d"], &["e"]);
        g.node("Add", &["e", "one"], &["p"]);
        g.node("Mul", &["x", "p"], &["m"]);
        g.node("Mul", &["m", "half"], &["gelu"]);
        g.node("Conv", &["gelu", "w"], &["y"]);
        assert!(affine_conv(&model(g.build(), &[("", 13)]), &mut Vec::new()).is_none());
    }

    #[test]
    fn a_scale_alone_folds_into_a_padded_conv_and_a_shift_does_not() {
        let r = affine_conv(&chain(false, 3, 1), &mut Vec::new()).expect("a scale folds");
        let g = r.graph.as_ref().unwrap();
        assert_eq!(g.node.len(), 1);
        assert_eq!(g.node[0].input.len(), 2, "no bias for a scale alone");
        // A padded border would read b where the model reads zeros.
        assert!(affine_conv(&chain(true, 3, 1), &mut Vec::new()).is_none());
    }
}
