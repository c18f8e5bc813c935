//! **`conv-affine`**: a scalar scale and shift after a Conv, folded into its weights and bias
//! (see [`conv_affine`]).

use std::collections::HashSet;

use super::graph::{
    inline_floats, read_counts, readers, remove_nodes, scale, set_floats, Constants, Names,
};
use crate::onnx::proto::{GraphProto, ModelProto, NodeProto, TensorProto};
use crate::onnx::ElemType;

/// A Conv whose weights (and bias, if any) are float32 constants in the graph that nothing
/// else reads, whose output only a `Mul` by a one-element float32 constant reads, itself
/// optionally read only by an `Add` of one: `a·Conv(x; W, B) + b` is `Conv(x; a·W, a·B + b)`
/// exactly (up to float rounding), so the Mul and Add go and the Conv takes over the last
/// one's output. Before the Mul there may be an `Add` of one float32 constant per channel
/// (`[1, M, 1, …]`: a bias paddle2onnx writes apart from a Conv), which goes into `B` first
/// (`a·(B + c) + b`), and `Identity` nodes anywhere in the chain (paddle2onnx writes one
/// after nearly every op), which go too. PaddlePaddle exports its learnable affine blocks (PP-LCNetV3's scalar scale
/// and shift after each Conv) this way; ONNX Runtime 1.31 fuses neither op into the Conv, and
/// each splits the NCHWc layout around it, costing a consumer's session and first run (on
/// ppocr_rec: BENCHMARKS.md, "Time to first inference, real-world models"). Weights
/// stored outside the graph file, shared with another node or overridable as graph inputs,
/// non-finite scales or shifts, and Convs inside control-flow bodies are left alone.
pub(super) fn conv_affine<'a>(
    proto: &'a ModelProto,
    applied: &mut Vec<String>,
) -> Option<ModelProto> {
    let g: &'a GraphProto = proto.graph.as_ref()?;
    if !g.node.iter().any(|n| n.op_type == "Conv") {
        return None;
    }
    let consts = Constants::of(g);
    let found = find(g, &consts);
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = Names::of(graph);
    let mut dropped = HashSet::new();
    for f in &found {
        let (a, shift) = (f.a, f.shift);
        let out = graph.node[f.last].output[0].clone();
        let w = graph.node[f.conv].input[1].clone();
        let b = graph.node[f.conv].input.get(2).cloned();
        let c = |k: usize| f.bias.as_ref().map_or(0.0, |c| c[k]);
        let m = scale(graph, &consts, &w, |_, v| v * a)?;
        match b {
            Some(b) => {
                scale(graph, &consts, &b, |k, v| (v + c(k)) * a + shift)?;
            }
            None if shift != 0.0 || f.bias.is_some() => {
                let name = format!("{}_bias", names.prefix(&out));
                let mut t = TensorProto {
                    name: name.clone(),
                    dims: vec![m],
                    data_type: ElemType::Float32.code(),
                    ..Default::default()
                };
                set_floats(
                    &mut t,
                    (0..usize::try_from(m).ok()?).map(|k| c(k) * a + shift),
                );
                graph.initializer.push(t);
                graph.node[f.conv].input.push(name);
            }
            None => {}
        }
        graph.node[f.conv].output[0] = out;
        dropped.extend(f.drop.iter().copied());
    }
    remove_nodes(graph, &dropped);
    applied.push(format!(
        "conv-affine: {} scalar Mul/Add after a Conv folded into its weights and bias",
        found.len()
    ));
    Some(model)
}

/// Every Conv of `g` that [`conv_affine`] can fold a scale and shift into, with what goes.
fn find<'a>(g: &'a GraphProto, consts: &Constants<'a>) -> Vec<Affine> {
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    let tensor = |name: &str| consts.tensor(g, name);
    let scalar = |name: &str| consts.scalar(g, name);
    let uses = read_counts(g);
    let reader = readers(g);
    // The node that alone reads `name`, when it is `op` with one output and reads `name` and
    // a finite one-element float32 constant: (the node, the constant's value).
    let scaled_by = |name: &str, op: &str| -> Option<(usize, f32)> {
        if uses.get(name) != Some(&1) {
            return None;
        }
        let j = *reader.get(name)?;
        let n = &g.node[j];
        if !std(n) || n.op_type != op || n.output.len() != 1 {
            return None;
        }
        match n.input.as_slice() {
            [x, c] | [c, x] if x == name && c != name => Some((j, scalar(c)?)),
            _ => None,
        }
    };
    let once = |name: &str| uses.get(name) == Some(&1);
    // `name` followed through the Identity nodes that alone read it (paddle2onnx writes one
    // after nearly every op): the last name, the Identities passed pushed to `passed`.
    let through = |mut name: &'a str, passed: &mut Vec<usize>| -> &'a str {
        while once(name) {
            let Some(&j) = reader.get(name) else { break };
            let n = &g.node[j];
            if !std(n) || n.op_type != "Identity" || n.output.len() != 1 || n.input.len() != 1 {
                break;
            }
            passed.push(j);
            name = &n.output[0];
        }
        name
    };
    // The `Add` that alone reads `name` (a Conv's output of `rank` dimensions and `m`
    // channels) when its other input is a float32 constant of one value per channel
    // (`[1, m, 1, …]` or `[m, 1, …]`): the node and the values.
    let channel_bias = |name: &str, rank: usize, m: i64| -> Option<(usize, Vec<f32>)> {
        if !once(name) {
            return None;
        }
        let j = *reader.get(name)?;
        let n = &g.node[j];
        if !std(n) || n.op_type != "Add" || n.output.len() != 1 {
            return None;
        }
        let c = match n.input.as_slice() {
            [x, c] | [c, x] if x == name && c != name => c,
            _ => return None,
        };
        let t = tensor(c)?;
        let d = t.dims.as_slice();
        let per_channel = match d.len() {
            r if r == rank => d[1] == m && d.iter().enumerate().all(|(k, &v)| k == 1 || v == 1),
            r if r + 1 == rank => d[0] == m && d[1..].iter().all(|&v| v == 1),
            _ => false,
        };
        let v = inline_floats(t).filter(|v| v.iter().all(|x| x.is_finite()))?;
        (per_channel && v.len() == usize::try_from(m).ok()?).then_some((j, v))
    };
    let mut found: Vec<Affine> = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        if !std(n) || n.op_type != "Conv" || n.output.len() != 1 {
            continue;
        }
        let (w, b) = match n.input.as_slice() {
            [_, w] => (w.as_str(), None),
            [_, w, b] if !b.is_empty() => (w.as_str(), Some(b.as_str())),
            _ => continue,
        };
        let Some((m, rank)) = tensor(w)
            .filter(|t| t.dims.len() >= 3 && inline_floats(t).is_some())
            .map(|t| (t.dims[0], t.dims.len()))
        else {
            continue;
        };
        if !once(w) {
            continue;
        }
        if let Some(b) = b {
            let ok =
                tensor(b).is_some_and(|t| t.dims.as_slice() == [m] && inline_floats(t).is_some());
            if !ok || !once(b) {
                continue;
            }
        }
        let mut drop = Vec::new();
        let mut at = through(&n.output[0], &mut drop);
        let mut bias = None;
        if let Some((add, c)) = channel_bias(at, rank, m) {
            drop.push(add);
            bias = Some(c);
            at = through(&g.node[add].output[0], &mut drop);
        }
        let Some((mul, a)) = scaled_by(at, "Mul") else {
            continue;
        };
        drop.push(mul);
        let mut last = mul;
        let mut passed = Vec::new();
        let after = through(&g.node[mul].output[0], &mut passed);
        let shift = match scaled_by(after, "Add") {
            Some((add, b)) => {
                drop.extend(passed);
                drop.push(add);
                last = add;
                b
            }
            None => 0.0,
        };
        found.push(Affine {
            conv: i,
            drop,
            last,
            bias,
            a,
            shift,
        });
    }
    found
}

/// One Conv [`conv_affine`] folds a scale and shift into.
struct Affine {
    conv: usize,
    /// The nodes that go: Identities, the per-channel bias Add, the Mul, the Add.
    drop: Vec<usize>,
    /// The node whose output the Conv takes over.
    last: usize,
    /// A per-channel bias added before the scale (an `Add` of `[1, M, 1, …]`).
    bias: Option<Vec<f32>>,
    a: f32,
    shift: f32,
}
