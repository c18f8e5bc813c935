//! What decoding a model would cost, found by walking its protobuf wire format before prost
//! decodes it. An empty repeated message costs two bytes in the file and a few hundred
//! decoded (a 10 MB file of empty nodes decoded to 6.7 GB and got the daemon OOM-killed in
//! `key` and the planner, which run in the daemon). [`check`] counts the nodes, attributes
//! and tensors and estimates the decoded bytes (struct sizes, copied strings, packed
//! integers widened to 8 bytes; `raw_data` is zero-copy and not counted), and refuses a file
//! over [`DecodeLimits`] with a clear error before any of it is allocated.
//!
//! Enters: the model's bytes. Leaves: `Ok` or the first limit exceeded. Only the fields the
//! decoder allocates for are modelled; a malformed wire format is left to prost's error.

use std::mem::size_of;

use super::proto::*;

pub use crate::config::DecodeLimits;

/// What a model would decode to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeCost {
    pub nodes: u64,
    pub attributes: u64,
    pub tensors: u64,
    pub bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Model,
    Graph,
    Node,
    Attribute,
    Tensor,
    Sparse,
    ValueInfo,
    Type,
    TypeTensor,
    TypeSequence,
    TypeMap,
    TypeOptional,
    Shape,
    Dim,
    Function,
    /// A message whose fields are all scalars or strings (opset ids, key/value pairs, …).
    Leaf(usize),
}

/// How a length-delimited field of `kind` decodes: a sub-message, a packed list of varints
/// (each widened to 8 bytes), or bytes/string/packed fixed-width (copied as is).
enum Field {
    Message(Kind),
    PackedVarints,
    Bytes,
    ZeroCopy,
}

fn field(kind: Kind, tag: u32) -> Field {
    use Field::*;
    use Kind::*;
    let leaf = |n| Message(Leaf(n));
    match (kind, tag) {
        (Model, 7) => Message(Graph),
        (Model, 25) => Message(Function),
        (Model, 8) => leaf(size_of::<OperatorSetIdProto>()),
        (Model, 14) => leaf(size_of::<StringStringEntryProto>()),
        (Graph, 1) => Message(Node),
        (Graph, 5) => Message(Tensor),
        (Graph, 15) => Message(Sparse),
        (Graph, 11..=13) => Message(ValueInfo),
        (Graph, 14) => leaf(size_of::<TensorAnnotation>() + size_of::<StringStringEntryProto>()),
        (Graph, 16) => leaf(size_of::<StringStringEntryProto>()),
        (Node, 5) => Message(Attribute),
        (Node, 9) => leaf(size_of::<StringStringEntryProto>()),
        (Attribute, 5 | 10) => Message(Tensor),
        (Attribute, 6 | 11) => Message(Graph),
        (Attribute, 22 | 23) => Message(Sparse),
        (Attribute, 14 | 15) => Message(Type),
        (Attribute, 8) => PackedVarints,
        (ValueInfo, 2) => Message(Type),
        (ValueInfo, 4) => leaf(size_of::<StringStringEntryProto>()),
        (Tensor, 3) => leaf(size_of::<TensorSegment>()),
        (Tensor, 13 | 16) => leaf(size_of::<StringStringEntryProto>()),
        (Tensor, 1 | 5 | 7 | 11) => PackedVarints,
        (Tensor, 9) => ZeroCopy,
        (Sparse, 1 | 2) => Message(Tensor),
        (Sparse, 3) => PackedVarints,
        (Type, 1 | 8) => Message(TypeTensor),
        (Type, 4) => Message(TypeSequence),
        (Type, 5) => Message(TypeMap),
        (Type, 9) => Message(TypeOptional),
        (Type, 7) => leaf(size_of::<type_proto::Opaque>()),
        (TypeTensor, 2) => Message(Shape),
        (TypeSequence, 1) | (TypeOptional, 1) | (TypeMap, 2) => Message(Type),
        (Shape, 1) => Message(Dim),
        (Function, 7) => Message(Node),
        (Function, 11) => Message(Attribute),
        (Function, 9) => leaf(size_of::<OperatorSetIdProto>()),
        (Function, 12) => Message(ValueInfo),
        (Function, 14) => leaf(size_of::<StringStringEntryProto>()),
        _ => Bytes,
    }
}

fn struct_size(kind: Kind) -> usize {
    match kind {
        Kind::Model => size_of::<ModelProto>(),
        Kind::Graph => size_of::<GraphProto>(),
        Kind::Node => size_of::<NodeProto>(),
        Kind::Attribute => size_of::<AttributeProto>(),
        Kind::Tensor => size_of::<TensorProto>(),
        Kind::Sparse => size_of::<SparseTensorProto>(),
        Kind::ValueInfo => size_of::<ValueInfoProto>(),
        Kind::Type => size_of::<TypeProto>(),
        Kind::TypeTensor => size_of::<type_proto::Tensor>(),
        Kind::TypeSequence => size_of::<type_proto::Sequence>(),
        Kind::TypeMap => size_of::<type_proto::Map>(),
        Kind::TypeOptional => size_of::<type_proto::Optional>(),
        Kind::Shape => size_of::<TensorShapeProto>(),
        Kind::Dim => size_of::<tensor_shape_proto::Dimension>(),
        Kind::Function => size_of::<FunctionProto>(),
        Kind::Leaf(n) => n,
    }
}

fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Protobuf's own nesting limit (prost refuses deeper input anyway).
const MAX_DEPTH: usize = 100;

fn walk(b: &[u8], kind: Kind, depth: usize, cost: &mut DecodeCost) {
    cost.bytes += struct_size(kind) as u64;
    match kind {
        Kind::Node => cost.nodes += 1,
        Kind::Attribute => cost.attributes += 1,
        Kind::Tensor => cost.tensors += 1,
        _ => {}
    }
    if depth > MAX_DEPTH {
        return;
    }
    let mut i = 0;
    while i < b.len() {
        let Some(key) = varint(b, &mut i) else { return };
        let (tag, wire) = ((key >> 3) as u32, key & 7);
        match wire {
            // A varint or fixed-width scalar: 8 bytes at most once decoded (in a Vec when
            // repeated and not packed).
            0 => {
                if varint(b, &mut i).is_none() {
                    return;
                }
                cost.bytes += 8;
            }
            1 => {
                i += 8;
                cost.bytes += 8;
            }
            5 => {
                i += 4;
                cost.bytes += 8;
            }
            2 => {
                let Some(len) = varint(b, &mut i) else { return };
                let Some(end) = usize::try_from(len).ok().and_then(|l| i.checked_add(l)) else {
                    return;
                };
                let Some(body) = b.get(i..end) else { return };
                match field(kind, tag) {
                    Field::Message(k) => walk(body, k, depth + 1, cost),
                    Field::PackedVarints => cost.bytes += 8 * body.len() as u64,
                    Field::Bytes => cost.bytes += 24 + body.len() as u64,
                    Field::ZeroCopy => cost.bytes += 32,
                }
                i = end;
            }
            // Groups (deprecated) and invalid wire types: prost reports them.
            _ => return,
        }
    }
}

/// The decode cost of a `ModelProto`'s bytes.
pub fn cost(bytes: &[u8]) -> DecodeCost {
    let mut c = DecodeCost::default();
    walk(bytes, Kind::Model, 0, &mut c);
    c
}

/// Refuses bytes whose decode would exceed `limits`; the message names the count and the
/// limit.
pub fn check(bytes: &[u8], limits: &DecodeLimits) -> Result<DecodeCost, String> {
    let c = cost(bytes);
    let max_bytes = limits
        .base_bytes
        .saturating_add(limits.per_file_byte.saturating_mul(bytes.len() as u64));
    let over = |what: &str, n: u64, max: u64| {
        format!("decoding it would allocate {what} {n}, over the limit of {max}; it is not a model trtcache will load (a protobuf of empty repeated messages decodes to many times its size)")
    };
    if c.nodes > limits.max_nodes {
        return Err(over("nodes:", c.nodes, limits.max_nodes));
    }
    if c.attributes > limits.max_attributes {
        return Err(over("attributes:", c.attributes, limits.max_attributes));
    }
    if c.tensors > limits.max_tensors {
        return Err(over("tensors:", c.tensors, limits.max_tensors));
    }
    if c.bytes > max_bytes {
        return Err(over("about this many bytes:", c.bytes, max_bytes));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn empty_repeated_nodes_are_refused_and_real_models_pass() {
        // 1,000,000 empty nodes: 2 bytes each in the file.
        let g = GraphProto {
            node: vec![NodeProto::default(); 1_000_000],
            ..Default::default()
        };
        let m = ModelProto {
            ir_version: 8,
            graph: Some(g),
            ..Default::default()
        };
        let bytes = m.encode_to_vec();
        let c = cost(&bytes);
        assert_eq!(c.nodes, 1_000_000);
        assert!(
            c.bytes > 100 * bytes.len() as u64,
            "{c:?} for {} bytes",
            bytes.len()
        );
        let tight = DecodeLimits {
            base_bytes: 1 << 20,
            ..Default::default()
        };
        let e = check(&bytes, &tight).unwrap_err();
        assert!(e.contains("over the limit"), "{e}");
        let few = DecodeLimits {
            max_nodes: 10,
            ..Default::default()
        };
        assert!(check(&bytes, &few).unwrap_err().contains("nodes: 1000000"));
        // The fixture models are far inside the defaults, raw weights not counted.
        for m in [
            crate::fixtures::models::tiny_encoder(false),
            crate::fixtures::models::if_loop(),
            crate::fixtures::models::big_weights(2, 512),
        ] {
            let b = m.encode_to_vec();
            let c = check(&b, &DecodeLimits::default()).unwrap();
            assert!(
                c.bytes < 4 * b.len() as u64 + (1 << 20),
                "{c:?} for {}",
                b.len()
            );
        }
    }

    #[test]
    fn malformed_bytes_never_panic() {
        for b in [
            &b"\xff\xff\xff"[..],
            b"\x3a\xff\xff\xff\xff\x0f",
            b"\x0a",
            &[0x3a, 5, 0x0a],
        ] {
            let _ = cost(b);
        }
    }
}
