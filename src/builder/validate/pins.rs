//! Sizes the graph itself fixes for dynamic input axes, for the default validation inputs
//! ([`super::search`]): an input declared `[time, features]` whose features meet an LSTM's
//! weights (`W: [1, 400, 266]`) can only be 266 wide, whatever the axis is called. Exporters
//! of older frameworks (madmom's, Keras') leave every axis free; no size the bounded search
//! tries fits, and ONNX Runtime only says the weights have the wrong shape.
//!
//! Enters: the model's graph. Leaves: `(input, axis) → size` for the dynamic input axes
//! whose size a weight decides. The axes are followed forward through the ops that only
//! move or keep them (unary and elementwise ops, Cast, Unsqueeze, Squeeze, Transpose, an
//! embedding's Gather) to the first op that contracts or broadcasts them against a weight:
//! MatMul and Gemm (the inner dimension), Conv and ConvTranspose (channels), LSTM, GRU and
//! RNN (the input size), the normalizations (their channels) and elementwise ops with a
//! weight (its dimensions over 1). An axis given two different sizes gets none.
//! Also the sizes the graph records in the shapes it builds ([`recorded`]), which the search
//! tries for free axes after its own.

use std::collections::{BTreeMap, HashMap};

use super::search::{leaves, unnamed, Axis};
use crate::analysis::facts::tensor_ints;
use crate::onnx::attr;
use crate::onnx::facts::{shape_of, Dim};
use crate::onnx::proto::{GraphProto, NodeProto, TensorProto};

/// An input axis, by input name and position.
pub(super) type InputAxis = (String, usize);

/// Where each axis of a value comes from: a dynamic input axis, or nothing known.
type Origins = Vec<Option<InputAxis>>;

/// The graph's constant values by name: its initializers and its Constant nodes' `value`s.
fn constants(g: &GraphProto) -> HashMap<&str, &TensorProto> {
    g.initializer
        .iter()
        .map(|t| (t.name.as_str(), t))
        .chain(g.node.iter().filter_map(|n| {
            (n.op_type == "Constant" && n.domain.is_empty())
                .then(|| Some((n.output.first()?.as_str(), attr::tensor(n, "value")?)))
                .flatten()
        }))
        .collect()
}

/// The sizes the graph fixes for dynamic input axes (see the module docs); empty when
/// nothing is fixed.
pub(super) fn pins(g: &GraphProto) -> BTreeMap<InputAxis, i64> {
    let weights = constants(g);
    let mut at: HashMap<&str, Origins> = HashMap::new();
    for vi in &g.input {
        if weights.contains_key(vi.name.as_str()) {
            continue;
        }
        let Some(shape) = shape_of(vi) else { continue };
        let o: Origins = shape
            .iter()
            .enumerate()
            .map(|(i, d)| (!matches!(d, Dim::Fixed(v) if *v > 0)).then(|| (vi.name.clone(), i)))
            .collect();
        if o.iter().any(Option::is_some) {
            at.insert(vi.name.as_str(), o);
        }
    }
    let mut found = Found::default();
    for n in topological(g) {
        let ins: Vec<Option<&Origins>> = n.input.iter().map(|i| at.get(i.as_str())).collect();
        if ins.iter().all(Option::is_none) {
            continue;
        }
        let w = |i: usize| -> Option<&TensorProto> {
            n.input
                .get(i)
                .and_then(|s| weights.get(s.as_str()).copied())
        };
        if let Some(out) = step(n, &ins, &w, &mut found) {
            if let Some(name) = n.output.first() {
                if out.iter().any(Option::is_some) {
                    at.insert(name.as_str(), out);
                }
            }
        }
    }
    found.into_pins()
}

/// The graph's nodes in a topological order. ONNX Runtime runs graphs whose nodes are not in
/// one (onnxruntime.transformers' float16 conversion with `keep_io_types` appends the input
/// Casts at the end of the node list), and an axis followed in file order would stop there.
fn topological(g: &GraphProto) -> Vec<&NodeProto> {
    let view = crate::onnx::graph::Graph::new(g);
    let (order, _) = crate::analysis::partition::topo_order(&view);
    order.into_iter().filter_map(|i| g.node.get(i)).collect()
}

/// Sizes found per key (an input axis, or a search leaf); a key found with two different
/// sizes is dropped.
struct Found<K>(BTreeMap<K, Option<i64>>);

impl<K: Ord> Default for Found<K> {
    fn default() -> Self {
        Found(BTreeMap::new())
    }
}

impl<K: Ord> Found<K> {
    fn agree(&mut self, key: K, size: i64) {
        if size <= 0 {
            return;
        }
        self.0
            .entry(key)
            .and_modify(|v| {
                if *v != Some(size) {
                    *v = None;
                }
            })
            .or_insert(Some(size));
    }

    fn into_pins(self) -> BTreeMap<K, i64> {
        self.0
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect()
    }
}

impl Found<InputAxis> {
    fn pin(&mut self, origin: &Option<InputAxis>, size: i64) {
        if let Some(o) = origin {
            self.agree(o.clone(), size);
        }
    }
}

/// [`pins`] as the search's leaves ([`super::search::candidates`]): an unnamed axis's own
/// leaf or a plain symbol (shared by every axis that names it, which must then agree); axes
/// named by an expression and leaves `bound` already sizes are left out.
pub(super) fn leaf_pins(
    pins: &BTreeMap<InputAxis, i64>,
    axes: &[Axis],
    bound: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    let mut found = Found::default();
    for a in axes {
        let Some(&size) = pins.get(&(a.input.clone(), a.axis)) else {
            continue;
        };
        let leaf = if a.symbol.is_empty() {
            unnamed(a)
        } else if leaves(&a.symbol) == [a.symbol.clone()] {
            a.symbol.clone()
        } else {
            continue;
        };
        if !bound.contains_key(&leaf) {
            found.agree(leaf, size);
        }
    }
    found.into_pins()
}

/// Most recorded sizes the search tries.
pub(super) const MAX_RECORDED: usize = 6;

/// Sizes the graph records in the shapes it builds: the integers of the small constants that
/// reach a Reshape's, Expand's, Tile's, ConstantOfShape's or Resize's shape input (through
/// Concat, Unsqueeze, Squeeze, Cast, Identity). An exporter that traced the model at some
/// size and kept it in a shape (torch's legacy exporter and `nn.MultiheadAttention`: a
/// Reshape to `[10, batch·heads, 8]` for a sequence declared dynamic) runs at that size only.
/// Values from 2 to 4,096 that the search does not try anyway, most often seen first, at
/// most [`MAX_RECORDED`].
pub(super) fn recorded(g: &GraphProto) -> Vec<i64> {
    let consts = constants(g);
    let producer: HashMap<&str, &NodeProto> = g
        .node
        .iter()
        .flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n)))
        .collect();
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<(&str, usize)> = g
        .node
        .iter()
        .filter(|n| n.domain.is_empty())
        .filter_map(|n| {
            let at = match n.op_type.as_str() {
                "Reshape" | "Expand" | "Tile" => 1,
                "ConstantOfShape" => 0,
                "Resize" => 3,
                _ => return None,
            };
            n.input.get(at).map(|i| (i.as_str(), 0))
        })
        .collect();
    while let Some((name, depth)) = stack.pop() {
        if name.is_empty() || !seen.insert(name) {
            continue;
        }
        if let Some(t) = consts.get(name) {
            if t.dims.len() <= 1 {
                for v in tensor_ints(t).unwrap_or_default() {
                    if (2..=4096).contains(&v) && !super::search::SEARCH_SIZES.contains(&v) {
                        *counts.entry(v).or_default() += 1;
                    }
                }
            }
            continue;
        }
        let Some(n) = producer.get(name) else {
            continue;
        };
        if depth < 4
            && n.domain.is_empty()
            && matches!(
                n.op_type.as_str(),
                "Concat" | "Unsqueeze" | "Squeeze" | "Cast" | "Identity"
            )
        {
            stack.extend(n.input.iter().map(|i| (i.as_str(), depth + 1)));
        }
    }
    let mut by: Vec<(i64, usize)> = counts.into_iter().collect();
    by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    by.into_iter().take(MAX_RECORDED).map(|(v, _)| v).collect()
}

/// Normalizes a possibly negative axis against `rank`.
fn norm(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

/// An op's axes list: its `axes` attribute (older opsets) or its second input, a weight.
fn axes_of<'a>(n: &NodeProto, w: &dyn Fn(usize) -> Option<&'a TensorProto>) -> Option<Vec<i64>> {
    attr::ints(n, "axes").or_else(|| w(1).and_then(tensor_ints))
}

const UNARY: &[&str] = &[
    "Abs",
    "Acos",
    "Asin",
    "Atan",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Clip",
    "Cos",
    "Dropout",
    "Elu",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "IsInf",
    "IsNaN",
    "LeakyRelu",
    "Log",
    "LogSoftmax",
    "Mish",
    "Neg",
    "Not",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Softmax",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "QuantizeLinear",
    "DequantizeLinear",
];

const BINARY: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Mod",
    "And",
    "Or",
    "Xor",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "PRelu",
    "BitShift",
];

/// One node: records the sizes its weights fix for tracked axes, and returns its first
/// output's origins when it only moves or keeps them.
///
/// One piece: one arm per op family (elementwise, reshaping, MatMul/Gemm, Conv, the RNNs,
/// the normalizations, Gather), each a few lines over the same inputs; the table of which op
/// reads which axis is easiest to check when it is read in one place.
fn step<'a>(
    n: &NodeProto,
    ins: &[Option<&Origins>],
    w: &dyn Fn(usize) -> Option<&'a TensorProto>,
    found: &mut Found<InputAxis>,
) -> Option<Origins> {
    let standard = n.domain.is_empty() || n.domain == "ai.onnx";
    if !standard {
        return None;
    }
    let x = ins.first().copied().flatten();
    let op = n.op_type.as_str();
    match op {
        _ if UNARY.contains(&op) => x.cloned(),
        _ if BINARY.contains(&op) => {
            // Right-aligned broadcasting against a weight: its dimensions over 1 fix the
            // tracked axis they meet.
            let (t, other) = match (
                ins.first().copied().flatten(),
                ins.get(1).copied().flatten(),
            ) {
                (Some(t), None) => (t, w(1)),
                (None, Some(t)) => (t, w(0)),
                (Some(t), Some(_)) => (t, None),
                (None, None) => return None,
            };
            if let Some(c) = other {
                if c.dims.len() <= t.len() {
                    let off = t.len() - c.dims.len();
                    for (k, &d) in c.dims.iter().enumerate() {
                        if d > 1 {
                            found.pin(&t[off + k], d);
                        }
                    }
                } else {
                    return None;
                }
            }
            Some(t.clone())
        }
        "Unsqueeze" => {
            let x = x?;
            let axes = axes_of(n, w)?;
            let rank = x.len() + axes.len();
            let mut axes: Vec<usize> =
                axes.iter().map(|&a| norm(a, rank)).collect::<Option<_>>()?;
            axes.sort_unstable();
            let mut src = x.iter();
            Some(
                (0..rank)
                    .map(|i| {
                        if axes.binary_search(&i).is_ok() {
                            None
                        } else {
                            src.next().cloned().flatten()
                        }
                    })
                    .collect(),
            )
        }
        "Squeeze" => {
            let x = x?;
            let axes: Vec<usize> = axes_of(n, w)?
                .iter()
                .map(|&a| norm(a, x.len()))
                .collect::<Option<_>>()?;
            Some(
                x.iter()
                    .enumerate()
                    .filter(|(i, _)| !axes.contains(i))
                    .map(|(_, o)| o.clone())
                    .collect(),
            )
        }
        "Transpose" => {
            let x = x?;
            let perm = attr::ints(n, "perm").unwrap_or_else(|| (0..x.len() as i64).rev().collect());
            (perm.len() == x.len()).then_some(())?;
            perm.iter()
                .map(|&p| x.get(usize::try_from(p).ok()?).cloned())
                .collect()
        }
        "MatMul" | "MatMulInteger" => {
            match (
                ins.first().copied().flatten(),
                ins.get(1).copied().flatten(),
            ) {
                (Some(a), None) => {
                    let b = w(1)?;
                    if a.len() >= 2 && b.dims.len() >= 2 {
                        found.pin(&a[a.len() - 1], b.dims[b.dims.len() - 2]);
                    }
                    let mut out = a.clone();
                    *out.last_mut()? = None;
                    Some(out)
                }
                (None, Some(b)) => {
                    let a = w(0)?;
                    if b.len() >= 2 && !a.dims.is_empty() {
                        found.pin(&b[b.len() - 2], a.dims[a.dims.len() - 1]);
                    }
                    None
                }
                _ => None,
            }
        }
        "Gemm" => {
            let a = x?;
            let b = w(1)?;
            if a.len() != 2 || b.dims.len() != 2 {
                return None;
            }
            let (ta, tb) = (
                attr::int(n, "transA").unwrap_or(0) != 0,
                attr::int(n, "transB").unwrap_or(0) != 0,
            );
            found.pin(&a[usize::from(!ta)], b.dims[usize::from(tb)]);
            Some(vec![a[usize::from(ta)].clone(), None])
        }
        "Conv" | "ConvInteger" | "ConvTranspose" => {
            let x = x?;
            let k = w(1)?;
            if x.len() < 3 || k.dims.len() != x.len() {
                return None;
            }
            let channels = if op == "ConvTranspose" {
                k.dims[0]
            } else {
                k.dims[1] * attr::int(n, "group").unwrap_or(1)
            };
            found.pin(&x[1], channels);
            None
        }
        "LSTM" | "GRU" | "RNN" => {
            let x = x?;
            let wt = w(1)?;
            // X is [seq, batch, input] (or [batch, seq, input] with `layout` 1): the input
            // size is last either way, W is [directions, gates·hidden, input].
            if x.len() == 3 && wt.dims.len() == 3 {
                found.pin(&x[2], wt.dims[2]);
            }
            None
        }
        "BatchNormalization" | "InstanceNormalization" => {
            let x = x?;
            let scale = w(1)?;
            if x.len() >= 2 && scale.dims.len() == 1 {
                found.pin(&x[1], scale.dims[0]);
            }
            Some(x.clone())
        }
        "LayerNormalization" => {
            let x = x?;
            let scale = w(1)?;
            let first = norm(attr::int(n, "axis").unwrap_or(-1), x.len())?;
            if scale.dims.len() == x.len() - first {
                for (k, &d) in scale.dims.iter().enumerate() {
                    if d > 1 {
                        found.pin(&x[first + k], d);
                    }
                }
            }
            Some(x.clone())
        }
        "Gather" => {
            // An embedding: a weight gathered by tracked indices keeps their axes.
            let idx = ins.get(1).copied().flatten()?;
            let data = w(0)?;
            (attr::int(n, "axis").unwrap_or(0) == 0 && !data.dims.is_empty()).then_some(())?;
            let mut out = idx.clone();
            out.extend(std::iter::repeat_n(None, data.dims.len() - 1));
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attr as a, tensor_f32, tensor_i64, GraphBuilder, D};
    use crate::onnx::ElemType;

    /// A float input whose every axis is unnamed-free (`D::Unknown`), as madmom's are.
    fn free(b: &mut GraphBuilder, name: &str, rank: usize) {
        b.input(name, ElemType::Float32, &vec![D::Unknown; rank]);
    }

    fn weight(b: &mut GraphBuilder, name: &str, dims: &[i64]) {
        let n = dims.iter().product::<i64>() as usize;
        b.init(tensor_f32(name, dims, &vec![0.5; n]));
    }

    #[test]
    fn sizes_recorded_in_built_shapes() {
        // torch's legacy export of nn.MultiheadAttention: Reshape(q, Concat([10], [-1], [8]))
        // with the traced sequence length 10 kept; 16 is searched anyway, 7 is no shape.
        let mut b = GraphBuilder::new("mha");
        free(&mut b, "q", 3);
        b.init(tensor_i64("seq", &[1], &[10]));
        b.init(tensor_i64("rest", &[2], &[-1, 8]));
        b.init(tensor_i64("other", &[1], &[7]));
        b.init(tensor_i64("emb", &[3], &[1, 10, 16]));
        b.node("Concat", &["seq", "rest"], &["shape"])
            .attribute
            .push(a::int("axis", 0));
        b.node("Reshape", &["q", "shape"], &["r"]);
        b.node("Expand", &["r", "emb"], &["e"]);
        b.node("Add", &["e", "other"], &["y"]);
        b.output("y", ElemType::Float32, None);
        assert_eq!(recorded(&b.build()), vec![10]);
    }

    #[test]
    fn lstm_input_size_through_unsqueeze() {
        // madmom's exported BLSTM: input [time, features] → Unsqueeze(1) → LSTM(W [1, 100, 266]).
        let mut b = GraphBuilder::new("blstm");
        free(&mut b, "input", 2);
        b.init(tensor_i64("axes", &[1], &[1]));
        weight(&mut b, "W", &[1, 100, 266]);
        weight(&mut b, "R", &[1, 100, 25]);
        b.node("Unsqueeze", &["input", "axes"], &["u"]);
        b.node("LSTM", &["u", "W", "R"], &["y"])
            .attribute
            .push(a::int("hidden_size", 25));
        b.output("y", ElemType::Float32, None);
        let p = pins(&b.build());
        assert_eq!(p, BTreeMap::from([(("input".into(), 1), 266)]));
    }

    #[test]
    fn matmul_gemm_conv_and_broadcast_weights() {
        let mut b = GraphBuilder::new("mix");
        free(&mut b, "a", 2);
        free(&mut b, "c", 3);
        free(&mut b, "img", 4);
        weight(&mut b, "W", &[1575, 4]);
        weight(&mut b, "G", &[8, 4]);
        weight(&mut b, "S", &[80, 3]);
        weight(&mut b, "K", &[8, 3, 3, 3]);
        b.node("MatMul", &["a", "W"], &["m"]);
        b.node("Relu", &["m"], &["r"]);
        // m's last axis is the weight's, no longer the input's: Gemm pins nothing more.
        b.node("Gemm", &["r", "G"], &["g"])
            .attribute
            .push(a::int("transB", 1));
        b.node("Mul", &["c", "S"], &["cs"]);
        b.node("Transpose", &["img"], &["t"])
            .attribute
            .push(a::ints("perm", &[0, 3, 1, 2]));
        b.node("Conv", &["t", "K"], &["k"]);
        b.output("g", ElemType::Float32, None);
        let p = pins(&b.build());
        assert_eq!(
            p,
            BTreeMap::from([
                (("a".into(), 1), 1575),
                (("c".into(), 1), 80),
                (("c".into(), 2), 3),
                (("img".into(), 3), 3),
            ])
        );
    }

    #[test]
    fn nodes_out_of_file_order_are_followed() {
        // onnxruntime.transformers float16 with keep_io_types: the input's Cast is the last
        // node of the file, yet feeds the Conv whose weights fix the channels.
        let mut b = GraphBuilder::new("keepio");
        free(&mut b, "img", 4);
        weight(&mut b, "K", &[8, 3, 3, 3]);
        b.node("Conv", &["img16", "K"], &["k"]);
        b.node("Cast", &["img"], &["img16"])
            .attribute
            .push(a::int("to", 10));
        b.output("k", ElemType::Float32, None);
        let p = pins(&b.build());
        assert_eq!(p, BTreeMap::from([(("img".into(), 1), 3)]));
    }

    #[test]
    fn an_axis_given_two_sizes_gets_none() {
        let mut b = GraphBuilder::new("conflict");
        free(&mut b, "x", 2);
        weight(&mut b, "W1", &[16, 4]);
        weight(&mut b, "W2", &[32, 4]);
        b.node("MatMul", &["x", "W1"], &["y1"]);
        b.node("MatMul", &["x", "W2"], &["y2"]);
        b.output("y1", ElemType::Float32, None);
        assert!(pins(&b.build()).is_empty());
    }

    #[test]
    fn fixed_axes_and_custom_domains_pin_nothing() {
        let mut b = GraphBuilder::new("fixed");
        b.input("x", ElemType::Float32, &[D::Fixed(1), D::Fixed(16)]);
        weight(&mut b, "W", &[16, 4]);
        b.node("MatMul", &["x", "W"], &["y"]);
        free(&mut b, "z", 2);
        b.node("MatMul", &["z", "W"], &["q"]).domain = "com.example".into();
        b.output("y", ElemType::Float32, None);
        assert!(pins(&b.build()).is_empty());
    }
}
