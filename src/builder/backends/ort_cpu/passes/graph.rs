//! What the graph passes share: reading constants (initializers and Constant nodes), who
//! reads and produces a value, fresh names, and building nodes, attributes and tensors.

use std::collections::HashSet;

use bytes::Bytes;

use crate::onnx::load::numel;
use crate::onnx::proto::DataLocation;
use crate::onnx::proto::{
    AttributeProto, AttributeType, GraphProto, ModelProto, NodeProto, TensorProto,
};
use crate::onnx::ElemType;

/// The constants of one graph a caller cannot override, by name: initializers that are not
/// graph inputs (by index) and Constant nodes' values (by node index).
pub(super) struct Constants<'a> {
    init: std::collections::HashMap<&'a str, usize>,
    konst: std::collections::HashMap<&'a str, usize>,
}

impl<'a> Constants<'a> {
    pub(super) fn of(g: &'a GraphProto) -> Self {
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
    pub(super) fn tensor<'g>(&self, g: &'g GraphProto, name: &str) -> Option<&'g TensorProto> {
        match (self.init.get(name), self.konst.get(name)) {
            (Some(&k), _) => g.initializer.get(k),
            (None, Some(&i)) => crate::onnx::attr::tensor(g.node.get(i)?, "value"),
            _ => None,
        }
    }

    /// A finite one-element float32 constant's value.
    pub(super) fn scalar(&self, g: &GraphProto, name: &str) -> Option<f32> {
        self.tensor(g, name)
            .and_then(scalar_f32)
            .filter(|v| v.is_finite())
    }
}

/// Removes the nodes at the indices in `dropped`, keeping the others' order.
pub(super) fn remove_nodes(graph: &mut GraphProto, dropped: &HashSet<usize>) {
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
pub(super) fn scale(
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
pub(super) fn set_floats(t: &mut TensorProto, v: impl Iterator<Item = f32>) {
    let raw: Vec<u8> = v.flat_map(f32::to_le_bytes).collect();
    t.float_data.clear();
    t.raw_data = Bytes::from(raw);
}

/// A scalar (or one-element) integer constant.
pub(super) fn scalar_int(t: &TensorProto) -> Option<i64> {
    if t.dims.iter().product::<i64>() != 1 {
        return None;
    }
    match crate::analysis::facts::tensor_ints(t)?.as_slice() {
        [v] => Some(*v),
        _ => None,
    }
}

/// The value of a one-element float32 constant.
pub(super) fn scalar_f32(t: &TensorProto) -> Option<f32> {
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
pub(super) fn floats(t: &TensorProto) -> Option<Vec<f32>> {
    if t.dims.len() != 1 {
        return None;
    }
    inline_floats(t)
}

/// How many times each name of `g` is read: by its nodes (their bodies' captures included)
/// once per reading node, and twice more when it is a graph output (so that "read once"
/// means one node and nothing else).
pub(super) fn read_counts(
    g: &crate::onnx::proto::GraphProto,
) -> std::collections::HashMap<&str, usize> {
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
pub(super) fn producers(g: &GraphProto) -> std::collections::HashMap<&str, usize> {
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
pub(super) fn readers(g: &GraphProto) -> std::collections::HashMap<&str, usize> {
    let mut by = std::collections::HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for r in n.input.iter().filter(|r| !r.is_empty()) {
            by.insert(r.as_str(), i);
        }
    }
    by
}

/// Names already used in a graph, to make new ones that are not.
pub(super) struct Names(HashSet<String>);

impl Names {
    pub(super) fn of(g: &crate::onnx::proto::GraphProto) -> Self {
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
    pub(super) fn prefix(&mut self, base: &str) -> String {
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
pub(super) fn std_opset(proto: &ModelProto) -> i64 {
    proto
        .opset_import
        .iter()
        .filter(|o| matches!(o.domain.as_str(), "" | "ai.onnx"))
        .map(|o| o.version)
        .max()
        .unwrap_or(0)
}

/// A node named after its one output (new outputs are unique, so the names are too).
pub(super) fn node(
    op: &str,
    inputs: &[&str],
    output: &str,
    attrs: Vec<AttributeProto>,
) -> NodeProto {
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
pub(super) fn attr(name: &str, t: AttributeType) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: t as i32,
        ..Default::default()
    }
}

pub(super) fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: v.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}

pub(super) fn float(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        f,
        ..attr(name, AttributeType::Float)
    }
}

pub(super) fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        i,
        ..attr(name, AttributeType::Int)
    }
}

pub(super) fn tensor_i64(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: ElemType::Int64.code(),
        raw_data: Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
        ..Default::default()
    }
}

/// The values of an inline integer constant (int8, uint8, int16, uint16, int32; raw or
/// `int32_data`), one per element of its shape; `None` for another type, external data, a
/// value out of its type's range or a size mismatch.
pub(super) fn inline_ints(t: &TensorProto) -> Option<Vec<i64>> {
    let ty = ElemType::from_code(t.data_type);
    let width = int_width(ty)?;
    if t.data_location == DataLocation::External as i32 || !t.external_data.is_empty() {
        return None;
    }
    let n = usize::try_from(numel(&t.dims)?).ok()?;
    if !t.raw_data.is_empty() {
        return decode_ints(ty, &t.raw_data, n);
    }
    let bits = 8 * width as u32;
    let (lo, hi) = match ty {
        ElemType::Uint8 | ElemType::Uint16 => (0, (1i64 << bits) - 1),
        _ => (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1),
    };
    let v: Vec<i64> = t.int32_data.iter().map(|&v| i64::from(v)).collect();
    (v.len() == n && v.iter().all(|x| (lo..=hi).contains(x))).then_some(v)
}

/// Bytes per element of the integer types [`inline_ints`] reads.
pub(super) fn int_width(ty: ElemType) -> Option<usize> {
    match ty {
        ElemType::Int8 | ElemType::Uint8 => Some(1),
        ElemType::Int16 | ElemType::Uint16 => Some(2),
        ElemType::Int32 => Some(4),
        _ => None,
    }
}

/// `n` little-endian values of `ty` from `raw`; `None` when it does not hold exactly `n`.
pub(super) fn decode_ints(ty: ElemType, raw: &[u8], n: usize) -> Option<Vec<i64>> {
    if raw.len() != n.checked_mul(int_width(ty)?)? {
        return None;
    }
    Some(match ty {
        ElemType::Int8 => raw.iter().map(|&b| i64::from(b as i8)).collect(),
        ElemType::Uint8 => raw.iter().map(|&b| i64::from(b)).collect(),
        ElemType::Int16 => raw
            .chunks_exact(2)
            .map(|c| i64::from(i16::from_le_bytes([c[0], c[1]])))
            .collect(),
        ElemType::Uint16 => raw
            .chunks_exact(2)
            .map(|c| i64::from(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        _ => raw
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
    })
}

/// The values of an inline int8 or uint8 tensor, one per element of its shape; `None` for
/// another type, external data, a value out of range or a size mismatch.
pub(super) fn bytes8(t: &TensorProto) -> Option<Vec<i64>> {
    if !matches!(
        ElemType::from_code(t.data_type),
        ElemType::Int8 | ElemType::Uint8
    ) {
        return None;
    }
    inline_ints(t)
}

/// Removes the constants named in `unread` (initializers and `Constant` nodes).
pub(super) fn drop_constants(graph: &mut GraphProto, unread: &HashSet<String>) {
    graph
        .initializer
        .retain(|t| !unread.contains(t.name.as_str()));
    graph.node.retain(|n| {
        !(n.op_type == "Constant" && n.output.iter().any(|o| unread.contains(o.as_str())))
    });
}
