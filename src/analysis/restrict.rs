//! Whether TensorRT's ONNX parser takes one node: operator table, element types and the
//! restrictions that can be checked from the graph (Resize modes, TopK's K, pooling rank,
//! If branch ranks, Loop scan outputs, constant-only inputs, …), recursing into If/Loop/Scan
//! bodies. Enters: a node with its graph's facts. Leaves: a [`Verdict`] — reasons TensorRT
//! declines it (empty when it takes it) and notes about what it will change (DOUBLE cast).
//! The op-specific restrictions are grouped by operator family (resampling, pooling,
//! build-time inputs, Q/DQ and scatter, recurrent, attention, Constant), one function each.

use super::facts::{axis, FastSet, GraphFacts, ValueClass};
use super::partition::topo_order;
use super::shapes::propagate;
use super::tables::{is_qdq_only, trt_type_token, TrtTable};
use crate::onnx::attr;
use crate::onnx::graph::Graph;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// TensorRT's answer for one node.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Why TensorRT declines the node; empty when it takes it.
    pub reasons: Vec<String>,
    /// Caveats when it takes it (DOUBLE cast down, …).
    pub notes: Vec<String>,
}

/// Everything the check needs besides the node.
pub struct TrtCheck<'t> {
    pub table: &'t TrtTable,
    pub opset: i64,
    pub exclude: &'t FastSet<String>,
    /// `--trt-exclude-dds`: keep NonMaxSuppression, NonZero, RoiAlign off TensorRT.
    pub exclude_dds: bool,
    /// Names of the top-level graph's inputs and outputs (UINT8 is only allowed there).
    pub io: &'t FastSet<String>,
    /// How deep bodies may nest before the check gives up (hostile models).
    pub max_depth: usize,
}

const QDQ: [&str; 2] = ["QuantizeLinear", "DequantizeLinear"];

impl TrtCheck<'_> {
    /// Checks node `id` of `g`.
    pub fn node(&self, g: &Graph<'_>, id: usize, f: &GraphFacts, depth: usize) -> Verdict {
        let mut v = Verdict::default();
        let Some(n) = g.nodes.get(id) else {
            return v;
        };
        let op = n.op_type.as_str();
        let who = self.table.who();
        match n.domain.as_str() {
            "" | "ai.onnx" => {}
            "ai.onnx.ml" => {
                v.reasons.push(format!(
                    "ai.onnx.ml operator `{op}`: {who}'s ONNX parser has no ONNX-ML operators"
                ));
                return v;
            }
            d => {
                v.reasons.push(format!(
                    "custom domain `{d}`: {who} can run `{op}` only through a plugin registered for it"
                ));
                return v;
            }
        }
        if self.opset < self.table.min_opset || self.opset > self.table.max_opset {
            v.reasons.push(format!(
                "model opset {} is outside {who}'s supported range {}..{}",
                self.opset, self.table.min_opset, self.table.max_opset
            ));
            return v;
        }
        if self.exclude.contains(op) {
            v.reasons
                .push(format!("`{op}` excluded from TensorRT (--trt-exclude)"));
            return v;
        }
        if self.exclude_dds && super::dds::DDS_OPS.contains(&op) {
            v.reasons.push(format!(
                "data-dependent-shape op `{op}` excluded from TensorRT (--trt-exclude-dds)"
            ));
            return v;
        }
        if self.table.dds_filtered.iter().any(|d| d == op) {
            v.reasons.push(format!(
                "{who}'s parser reports data-dependent-shape op `{op}` unsupported when partitioning"
            ));
            return v;
        }
        let Some(row) = self.table.ops.get(op) else {
            v.reasons
                .push(format!("`{op}` is not in {who}'s ONNX operator table"));
            return v;
        };
        if !row.supported {
            v.reasons
                .push(format!("{who}'s ONNX parser does not support `{op}`"));
            return v;
        }
        self.types(n, f, &row.types, &mut v);
        restrictions(n, f, self.opset, &mut v.reasons);
        if matches!(op, "If" | "Loop" | "Scan") {
            self.bodies(g, id, f, depth, &mut v);
        }
        v
    }

    fn types(&self, n: &NodeProto, f: &GraphFacts, listed: &[String], v: &mut Verdict) {
        let op = n.op_type.as_str();
        let lists = |tok: &str| listed.iter().any(|t| t == tok);
        if let Some(t) = n.input.first().and_then(|i| f.get(i)).and_then(|t| t.dtype) {
            if let Some(tok) = trt_type_token(t) {
                if !(listed.is_empty() || lists(tok) || is_qdq_only(t) && QDQ.contains(&op)) {
                    v.reasons.push(format!(
                        "`{op}` in TensorRT does not take {t} input (takes {})",
                        listed.join(", ")
                    ));
                }
            }
        }
        let tensors = n.input.iter().chain(&n.output).filter(|s| !s.is_empty());
        // A linear duplicate check for ordinary nodes, a set for very wide ones.
        let wide = n.input.len() + n.output.len() > 16;
        let mut seen_set: FastSet<&str> = FastSet::default();
        let mut seen: Vec<&str> = Vec::new();
        for name in tensors {
            let dup = if wide {
                !seen_set.insert(name.as_str())
            } else if seen.contains(&name.as_str()) {
                true
            } else {
                seen.push(name.as_str());
                false
            };
            if dup {
                continue;
            }
            let Some(t) = f.get(name).and_then(|t| t.dtype) else {
                continue;
            };
            match trt_type_token(t) {
                None if t == ElemType::Undefined => {}
                None => v
                    .reasons
                    .push(format!("TensorRT has no {t} tensors (`{name}`)")),
                Some(tok) if is_qdq_only(t) && !QDQ.contains(&op) && !lists(tok) => {
                    v.reasons.push(format!(
                        "{t} tensor `{name}`: TensorRT takes INT8/INT4/FP8/FP4 only through QuantizeLinear/DequantizeLinear"
                    ))
                }
                Some(_) if t == ElemType::Uint8 && !self.io.contains(name.as_str()) => {
                    v.reasons.push(format!(
                        "uint8 tensor `{name}` is not a network input or output (TensorRT takes UINT8 only at I/O)"
                    ))
                }
                Some(_) if t == ElemType::Float64 => v.notes.push(format!(
                    "float64 tensor `{name}` is cast down to float32 by TensorRT (clamped to ±FLT_MAX)"
                )),
                Some(_) => {}
            }
        }
    }

    fn bodies(&self, g: &Graph<'_>, id: usize, f: &GraphFacts, depth: usize, v: &mut Verdict) {
        if depth >= self.max_depth {
            v.reasons.push(format!(
                "bodies nested deeper than {} levels are not analysed",
                self.max_depth
            ));
            return;
        }
        let n = g.nodes[id];
        let mut out_ranks: Vec<Vec<Option<usize>>> = Vec::new();
        for b in super::partition::bodies_of(g, id) {
            let (order, _) = topo_order(&b.graph);
            let bf = propagate(&b.graph, &order, Some(f), self.opset);
            for &bid in &order {
                let bv = self.node(&b.graph, bid, &bf, depth + 1);
                for r in bv.reasons {
                    if v.reasons.len() < 8 {
                        v.reasons.push(format!(
                            "body `{}`: node `{}` ({}): {r}",
                            b.attr,
                            b.graph.names.get(bid).map_or("?", |s| s.as_str()),
                            b.graph.nodes[bid].op_type
                        ));
                    }
                }
            }
            out_ranks.push(
                b.graph
                    .proto
                    .output
                    .iter()
                    .map(|o| bf.get(&o.name).and_then(|t| t.rank()))
                    .collect(),
            );
            if n.op_type == "Loop" {
                loop_body(n, &b.graph, &bf, f, &mut v.reasons);
            }
        }
        if n.op_type == "If" && out_ranks.len() == 2 {
            for (i, (a, b)) in out_ranks[0].iter().zip(&out_ranks[1]).enumerate() {
                if let (Some(a), Some(b)) = (a, b) {
                    if a != b {
                        v.reasons.push(format!(
                            "If output {i}: then-branch rank {a} differs from else-branch rank {b}"
                        ));
                    }
                }
            }
        }
    }
}

fn loop_body(
    n: &NodeProto,
    body: &Graph<'_>,
    bf: &GraphFacts,
    outer: &GraphFacts,
    r: &mut Vec<String>,
) {
    let carried = n.input.len().saturating_sub(2);
    let has_scan = n.output.len() > carried;
    if has_scan {
        let m_const = n
            .input
            .first()
            .filter(|s| !s.is_empty())
            .is_some_and(|m| outer.class(m) != ValueClass::DataDerived);
        // The body's condition must simply pass its input through (or be constant).
        let cond_out = body.proto.output.first().map(|o| o.name.as_str());
        let cond_in = body.proto.input.get(1).map(|i| i.name.as_str());
        let passthrough = match cond_out {
            Some(c) if Some(c) == cond_in => true,
            Some(c) => {
                bf.class(c) == ValueClass::Constant
                    || body.producer.get(c).is_some_and(|o| {
                        let p = body.nodes[o.node];
                        p.op_type == "Identity" && p.input.first().map(|s| s.as_str()) == cond_in
                    })
            }
            None => true,
        };
        let outer_cond_ok = n
            .input
            .get(1)
            .filter(|s| !s.is_empty())
            .is_none_or(|c| outer.class(c) != ValueClass::DataDerived);
        if !m_const || !passthrough || !outer_cond_ok {
            r.push(
                "Loop scan outputs have a dynamic length (trip count not a build-time constant or condition computed in the loop)"
                    .into(),
            );
        }
    }
    for k in 0..carried {
        let (Some(i), Some(o)) = (body.proto.input.get(k + 2), body.proto.output.get(k + 1)) else {
            continue;
        };
        let si = bf.get(&i.name).and_then(|t| t.shape.as_ref());
        let so = bf.get(&o.name).and_then(|t| t.shape.as_ref());
        if let (Some(a), Some(b)) = (si, so) {
            let differs = a.len() != b.len()
                || a.iter()
                    .zip(b)
                    .any(|(x, y)| matches!((x.known(), y.known()), (Some(p), Some(q)) if p != q));
            if differs {
                r.push(format!(
                    "Loop-carried value `{}` changes shape across iterations",
                    i.name
                ));
            }
        }
    }
}

/// Op-specific restrictions that the graph can show. Every op type has its rules in one
/// family below; a family ignores the ops that are not its own.
fn restrictions(n: &NodeProto, f: &GraphFacts, opset: i64, r: &mut Vec<String>) {
    const FAMILIES: [fn(&RestrictCx<'_>, &mut Vec<String>); 7] = [
        resampling,
        pooling,
        build_time_inputs,
        quantize_scatter,
        recurrent,
        attention,
        constant,
    ];
    let cx = RestrictCx {
        n,
        f,
        opset,
        op: n.op_type.as_str(),
    };
    for family in FAMILIES {
        family(&cx, r);
    }
}

/// One node with its graph's facts: what the restriction families read.
struct RestrictCx<'a> {
    n: &'a NodeProto,
    f: &'a GraphFacts<'a>,
    opset: i64,
    op: &'a str,
}

impl<'a> RestrictCx<'a> {
    /// Input `i`'s name, when present and not empty.
    fn input(&self, i: usize) -> Option<&'a String> {
        self.n.input.get(i).filter(|s| !s.is_empty())
    }

    fn rank0(&self) -> Option<usize> {
        self.n
            .input
            .first()
            .and_then(|i| self.f.get(i))
            .and_then(|t| t.rank())
    }

    fn is_const(&self, i: usize) -> bool {
        self.input(i)
            .is_some_and(|s| self.f.class(s) == ValueClass::Constant)
    }

    /// Whether input `i` reaches TensorRT as weights: an initializer or a `Constant` node's
    /// output (what the parser's "must be an initializer" checks accept).
    fn is_weights(&self, i: usize) -> bool {
        self.input(i)
            .is_some_and(|s| self.f.get(s).is_some_and(|t| t.weights))
    }

    fn out_used(&self, i: usize) -> bool {
        self.n.output.get(i).is_some_and(|s| !s.is_empty())
    }
}

/// Resize's modes and axes; GridSample's rank.
fn resampling(cx: &RestrictCx<'_>, r: &mut Vec<String>) {
    let n = cx.n;
    match cx.op {
        "Resize" => {
            let mode = attr::string(n, "mode").unwrap_or_else(|| "nearest".into());
            if !matches!(mode.as_str(), "nearest" | "linear") {
                r.push(format!(
                    "Resize mode `{mode}` is not supported (nearest, linear only)"
                ));
            }
            let ctm = attr::string(n, "coordinate_transformation_mode")
                .unwrap_or_else(|| "half_pixel".into());
            if !matches!(
                ctm.as_str(),
                "half_pixel"
                    | "pytorch_half_pixel"
                    | "tf_half_pixel_for_nn"
                    | "asymmetric"
                    | "align_corners"
            ) {
                r.push(format!(
                    "Resize coordinate_transformation_mode `{ctm}` is not supported"
                ));
            }
            let nm = attr::string(n, "nearest_mode").unwrap_or_else(|| "round_prefer_floor".into());
            if !matches!(
                nm.as_str(),
                "floor" | "ceil" | "round_prefer_floor" | "round_prefer_ceil"
            ) {
                r.push(format!("Resize nearest_mode `{nm}` is not supported"));
            }
            if let Some(p) = attr::string(n, "keep_aspect_ratio_policy").filter(|p| p != "stretch")
            {
                r.push(format!(
                    "Resize keep_aspect_ratio_policy `{p}` is not supported (stretch only)"
                ));
            }
            if attr::int(n, "antialias").unwrap_or(0) != 0 {
                r.push("Resize antialias is not supported".into());
            }
            if let (Some(axes), Some(_)) = (attr::ints(n, "axes"), cx.input(2)) {
                let iota = cx.rank0().is_some_and(|rk| {
                    axes.len() == rk
                        && axes
                            .iter()
                            .enumerate()
                            .all(|(i, &a)| axis(a, rk) == Some(i))
                });
                if !iota {
                    r.push("Resize with a `scales` tensor needs axes 0..rank-1".into());
                }
            }
        }
        "GridSample" if cx.rank0().is_some_and(|r| r != 4) => {
            r.push("GridSample input must be 4D".into())
        }
        _ => {}
    }
}

/// Pooling rank, dilations and Indices; DeformConv's pads.
fn pooling(cx: &RestrictCx<'_>, r: &mut Vec<String>) {
    let (n, op) = (cx.n, cx.op);
    match op {
        "MaxPool" | "AveragePool" | "LpPool" => {
            let dil_ok = attr::ints(n, "dilations").is_none_or(|d| d.iter().all(|&x| x == 1));
            let sp = attr::ints(n, "kernel_shape")
                .map(|k| k.len())
                .or(cx.rank0().map(|r| r.saturating_sub(2)));
            if let Some(sp) = sp.filter(|s| !matches!(s, 2 | 3)) {
                r.push(format!(
                    "{op} over {sp} spatial dims: TensorRT pools 2D or 3D only"
                ));
            }
            if !dil_ok {
                r.push(format!("{op} dilations other than 1 are not supported"));
            }
            if op == "MaxPool" && cx.out_used(1) {
                r.push("MaxPool's Indices output is not supported".into());
            }
        }
        "DeformConv" => {
            if let Some(p) = attr::ints(n, "pads") {
                let h = p.len() / 2;
                if p[..h] != p[h..] {
                    r.push("DeformConv begin and end pads must be equal".into());
                }
            }
        }
        _ => {}
    }
}

/// Inputs TensorRT needs at build time: constants, initializers, static dims, TopK's K.
fn build_time_inputs(cx: &RestrictCx<'_>, r: &mut Vec<String>) {
    let (n, f, op) = (cx.n, cx.f, cx.op);
    match op {
        "TopK" => {
            if attr::int(n, "sorted").unwrap_or(1) != 1 {
                r.push("TopK with sorted=0 is not supported".into());
            }
            let k = if cx.opset >= 10 {
                cx.input(1)
                    .and_then(|s| f.known_ints(s))
                    .and_then(|v| v.first().copied())
            } else {
                attr::int(n, "k")
            };
            if let Some(k) = k.filter(|&k| k >= 3840) {
                r.push(format!("TopK K={k} is not below TensorRT's limit of 3840"));
            }
        }
        "CumSum" if !cx.is_const(1) => r.push("CumSum axis must be a build-time constant".into()),
        "OneHot" if !cx.is_const(1) => r.push("OneHot depth must be a build-time constant".into()),
        "Dropout" => {
            if let Some(t) = cx.input(2) {
                let ok =
                    cx.is_weights(2) && f.known_ints(t).is_some_and(|v| v.iter().all(|&x| x == 0));
                if !ok {
                    r.push(
                        "Dropout is_training must be an initializer whose value is False".into(),
                    );
                }
            }
        }
        "ReduceL1" | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceMax"
        | "ReduceMean" | "ReduceMin" | "ReduceProd" | "ReduceSum" | "ReduceSumSquare"
            if cx.input(1).is_some() && !cx.is_weights(1) =>
        {
            r.push(format!("{op} axes must be an initializer"));
        }
        "Squeeze" | "Unsqueeze" => {
            if let Some(a) = cx.input(1) {
                if f.known_ints(a).is_none() {
                    r.push(format!("{op} axes cannot be resolved to a constant"));
                }
            }
        }
        "STFT" if !(cx.is_weights(1) && (cx.input(2).is_none() || cx.is_weights(2))) => {
            r.push("STFT frame_step and window must be initializers".into())
        }
        "EyeLike" => {
            let static_dims = n
                .input
                .first()
                .and_then(|i| f.get(i))
                .and_then(|t| t.shape.as_ref())
                .is_some_and(|s| s.iter().all(|d| d.known().is_some()));
            if !static_dims {
                r.push("EyeLike input dims must be static".into());
            }
        }
        "Hardmax" => {
            let s = n
                .input
                .first()
                .and_then(|i| f.get(i))
                .and_then(|t| t.shape.as_ref());
            let ok = s.is_some_and(|s| {
                axis(attr::int(n, "axis").unwrap_or(-1), s.len())
                    .and_then(|a| s[a].known())
                    .is_some()
            });
            if !ok {
                r.push(
                    "Hardmax: size of the `axis` dimension must be a build-time constant".into(),
                );
            }
        }
        _ => {}
    }
}

/// Q/DQ zero points; ScatterND's reduction.
fn quantize_scatter(cx: &RestrictCx<'_>, r: &mut Vec<String>) {
    let (n, f, op) = (cx.n, cx.f, cx.op);
    match op {
        "QuantizeLinear" | "DequantizeLinear" => {
            if let Some(z) = cx.input(2) {
                let zero = f.known_ints(z).is_some_and(|v| v.iter().all(|&x| x == 0));
                let float_zp = f.get(z).and_then(|t| t.dtype).is_some_and(|t| t.is_float());
                if !zero && !float_zp {
                    r.push(format!("{op} zero point must be 0 (known at build time)"));
                }
            }
        }
        "ScatterND" | "ScatterElements" => {
            if let Some(red) = attr::string(n, "reduction").filter(|s| s != "none") {
                if op == "ScatterND" {
                    r.push(format!(
                        "ScatterND reduction `{red}` is not supported (none only)"
                    ));
                }
            }
        }
        _ => {}
    }
}

/// LSTM, GRU and RNN attributes.
fn recurrent(cx: &RestrictCx<'_>, r: &mut Vec<String>) {
    let (n, op) = (cx.n, cx.op);
    if !matches!(op, "LSTM" | "GRU" | "RNN") {
        return;
    }
    if op == "LSTM" && attr::int(n, "input_forget").unwrap_or(0) != 0 {
        r.push("LSTM input_forget must be 0".into());
    }
    if attr::int(n, "layout").unwrap_or(0) != 0 {
        r.push(format!("{op} layout must be 0"));
    }
    let bidir = attr::string(n, "direction").is_some_and(|d| d == "bidirectional");
    let acts: Vec<Vec<u8>> = n
        .attribute
        .iter()
        .find(|a| a.name == "activations")
        .map(|a| a.strings.clone())
        .unwrap_or_default();
    if bidir && acts.len() >= 2 && acts.len().is_multiple_of(2) {
        let h = acts.len() / 2;
        if acts[..h] != acts[h..] {
            r.push(format!(
                "{op} bidirectional: forward and reverse must use the same activations"
            ));
        }
    }
}

/// Transformer blocks: LayerNormalization's extra outputs, Attention's caches,
/// RotaryEmbedding's position ids, TensorScatter's axis.
fn attention(cx: &RestrictCx<'_>, r: &mut Vec<String>) {
    let (n, f) = (cx.n, cx.f);
    match cx.op {
        "LayerNormalization" if cx.out_used(1) || cx.out_used(2) => {
            r.push("LayerNormalization: only the first output (Y) is supported".into())
        }
        "TensorScatter" if attr::int(n, "axis").unwrap_or(-2) != -2 => {
            r.push("TensorScatter axis must be -2".into())
        }
        "RotaryEmbedding" => {
            if let Some(t) = cx.input(3).and_then(|s| f.get(s)).and_then(|t| t.dtype) {
                if t != ElemType::Int64 {
                    r.push("RotaryEmbedding position_ids must be int64".into());
                }
            }
        }
        "Attention" => {
            for (i, what) in [(3, "past_key"), (4, "past_value"), (5, "nonpad_kv_seqlen")] {
                if cx.input(i).is_some() {
                    r.push(format!("Attention input {what} is not supported"));
                }
            }
            if (1..4).any(|i| cx.out_used(i)) {
                r.push("Attention outputs present_key/present_value/qk_matmul_output are not supported".into());
            }
        }
        _ => {}
    }
}

/// Constant attribute kinds TensorRT has no tensors for.
fn constant(cx: &RestrictCx<'_>, r: &mut Vec<String>) {
    if cx.op != "Constant" {
        return;
    }
    for a in &cx.n.attribute {
        if matches!(
            a.name.as_str(),
            "sparse_value" | "value_string" | "value_strings"
        ) {
            r.push(format!("Constant attribute `{}` is not supported", a.name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attr, model, tensor_f32, tensor_i64, GraphBuilder, D};
    use crate::onnx::ElemType::{Bool, Float32, Int8, Uint8};

    /// Runs the check on every node of a built graph; returns the reasons per node.
    fn verdicts(g: GraphBuilder) -> Vec<Vec<String>> {
        let m = model(g.build(), &[("", 18)]);
        let view = Graph::new(m.graph.as_ref().unwrap());
        let (order, _) = topo_order(&view);
        let f = propagate(&view, &order, None, 18);
        let table = TrtTable::load("10.15").unwrap();
        let exclude = FastSet::default();
        let io: FastSet<String> = view
            .proto
            .input
            .iter()
            .chain(&view.proto.output)
            .map(|v| v.name.clone())
            .collect();
        let check = TrtCheck {
            table: &table,
            opset: 18,
            exclude: &exclude,
            exclude_dds: false,
            io: &io,
            max_depth: 4,
        };
        (0..view.nodes.len())
            .map(|id| check.node(&view, id, &f, 0).reasons)
            .collect()
    }

    fn img() -> Vec<D> {
        vec![1.into(), 3.into(), 8.into(), 8.into()]
    }

    #[test]
    fn checkable_restrictions() {
        let mut g = GraphBuilder::new("r");
        g.input("x", Float32, &img())
            .input("q", Int8, &[4.into()])
            .input("u", Uint8, &[4.into()])
            .output("y", Float32, None)
            .init(tensor_f32("scales", &[4], &[1.0, 1.0, 2.0, 2.0]))
            .init(tensor_i64("k_big", &[1], &[4000]))
            .init(tensor_i64("k_ok", &[1], &[3]));
        g.node("Resize", &["x", "", "scales"], &["r1"])
            .attribute
            .push(attr::string("mode", "cubic"));
        g.node("Resize", &["x", "", "scales"], &["r2"])
            .attribute
            .push(attr::string("mode", "linear"));
        g.node("TopK", &["x", "k_big"], &["t1", "i1"]);
        g.node("TopK", &["x", "k_ok"], &["t2", "i2"]);
        g.node("MaxPool", &["x"], &["p1"])
            .attribute
            .push(attr::ints("kernel_shape", &[2]));
        g.node("MaxPool", &["x"], &["p2", "p2i"])
            .attribute
            .push(attr::ints("kernel_shape", &[2, 2]));
        g.node("Relu", &["q"], &["q1"]);
        g.node("Cast", &["u"], &["u1"])
            .attribute
            .push(attr::int("to", Uint8.code() as i64));
        g.node("Cast", &["u"], &["y"])
            .attribute
            .push(attr::int("to", Float32.code() as i64));
        let v = verdicts(g);
        assert!(
            v[0].iter().any(|r| r.contains("mode `cubic`")),
            "{:?}",
            v[0]
        );
        assert!(v[1].is_empty(), "{:?}", v[1]);
        assert!(v[2].iter().any(|r| r.contains("K=4000")), "{:?}", v[2]);
        assert!(v[3].is_empty(), "{:?}", v[3]);
        assert!(
            v[4].iter().any(|r| r.contains("1 spatial dims")),
            "{:?}",
            v[4]
        );
        assert!(v[5].iter().any(|r| r.contains("Indices")), "{:?}", v[5]);
        assert!(
            v[6].iter()
                .any(|r| r.contains("Q/DQ") || r.contains("QuantizeLinear")),
            "{:?}",
            v[6]
        );
        assert!(v[7].iter().any(|r| r.contains("only at I/O")), "{:?}", v[7]);
        assert!(v[8].is_empty(), "uint8 graph input into Cast: {:?}", v[8]);
    }

    /// optimum (opset 18) and onnxruntime-genai write reduction axes as `Constant` nodes;
    /// TensorRT's parser imports a Constant's output as weights, which is what "axes must
    /// be an initializer" asks. Axes from an initializer or a Constant pass; axes a graph
    /// input or a computation gives do not.
    #[test]
    fn reduction_axes_from_a_constant_node_are_weights() {
        let mut g = GraphBuilder::new("r");
        g.input("x", Float32, &img())
            .input("ax_in", crate::onnx::ElemType::Int64, &[1.into()])
            .output("y", Float32, None)
            .init(tensor_i64("ax_init", &[1], &[-1]));
        g.node("Constant", &[], &["ax_const"])
            .attribute
            .push(attr::tensor("value", tensor_i64("v", &[1], &[-1])));
        g.node("ReduceMean", &["x", "ax_const"], &["m1"]);
        g.node("ReduceMean", &["x", "ax_init"], &["m2"]);
        g.node("ReduceMean", &["x", "ax_in"], &["m3"]);
        g.node("Identity", &["ax_const"], &["ax_copy"]);
        g.node("ReduceSum", &["x", "ax_copy"], &["m4"]);
        let v = verdicts(g);
        let about_axes =
            |r: &Vec<String>| r.iter().any(|s| s.contains("axes must be an initializer"));
        assert!(!about_axes(&v[1]), "Constant axes: {:?}", v[1]);
        assert!(!about_axes(&v[2]), "initializer axes: {:?}", v[2]);
        assert!(about_axes(&v[3]), "graph-input axes: {:?}", v[3]);
        // Anything computed, even from constants, is taken as a tensor (conservatively: only
        // initializers and direct Constant outputs count as weights here).
        assert!(about_axes(&v[5]), "Identity of a Constant: {:?}", v[5]);
    }

    #[test]
    fn if_branches_with_different_ranks_are_declined() {
        let mut then_b = GraphBuilder::new("then");
        then_b.output("a", Float32, Some(&[D::Named("n")]));
        then_b.node("Relu", &["x"], &["a"]);
        let mut else_b = GraphBuilder::new("else");
        else_b.output("b", Float32, Some(&[1.into(), D::Named("n")]));
        else_b.node("Unsqueeze", &["x", "zero"], &["b"]);
        let mut g = GraphBuilder::new("if");
        g.input("x", Float32, &[D::Named("n")])
            .input("c", Bool, &[])
            .output("y", Float32, None)
            .init(tensor_i64("zero", &[1], &[0]));
        g.node("If", &["c"], &["y"]).attribute.extend([
            attr::graph("then_branch", then_b.build()),
            attr::graph("else_branch", else_b.build()),
        ]);
        let v = verdicts(g);
        assert!(
            v[0].iter()
                .any(|r| r.contains("rank 1 differs from else-branch rank 2")),
            "{:?}",
            v[0]
        );
    }
}
