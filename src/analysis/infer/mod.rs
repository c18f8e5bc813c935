//! Per-operator shape, element-type and small-value rules for [`super::shapes`].
//!
//! Enters: one node and the facts known so far. Leaves: one [`Out`] per output slot (or
//! `None`). The rules live in one file per operator family; each family answers for its own
//! ops and says "not mine" for the rest, so [`infer`] only asks them in turn:
//! [`elementwise`] (unary, broadcasting binary, normalisations), [`reduce`] (reductions and
//! ArgMax/ArgMin), [`nn`] (MatMul, Gemm, Conv, pooling), [`shape_ops`] (Reshape, Transpose,
//! Squeeze/Unsqueeze, Flatten, Shape, Size, Expand, Tile, Pad, Resize, …), [`slicing`]
//! (Concat, Split, Slice, Gather), [`data_dependent`] (NonZero, NonMaxSuppression, Compress,
//! Unique, TopK), [`constants`] (Constant, ConstantOfShape, Range, EyeLike, OneHot) and
//! [`types`] (Cast, CastLike, Quantize/DequantizeLinear); `ai.onnx.ml` nodes go to [`ml`].
//! Whenever a rule is not sure it answers unknown; it never guesses. Last, [`schema`] types
//! what the rules left untyped (ops without rules, contrib domains) where the op's schema
//! alone fixes the element type.

mod constants;
mod data_dependent;
mod elementwise;
mod ml;
mod nn;
mod reduce;
mod schema;
mod shape_ops;
mod slicing;
mod types;

use super::facts::{GraphFacts, Out, SymDim, TensorFacts};
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// What a family answers for one node: `None` when the op is not one of its own, else one
/// entry per output slot (an empty list when the node is its own but cannot be answered).
type Answer = Option<Vec<Option<Out>>>;

/// The families, most common ops first; every op type belongs to at most one of them.
const FAMILIES: [fn(&NodeCx<'_>) -> Answer; 8] = [
    elementwise::rules,
    nn::rules,
    shape_ops::rules,
    slicing::rules,
    reduce::rules,
    types::rules,
    constants::rules,
    data_dependent::rules,
];

/// Rules for one node; one entry per output slot.
pub fn infer(n: &NodeProto, f: &GraphFacts, opset: i64) -> Vec<Option<Out>> {
    let cx = NodeCx {
        n,
        f,
        opset,
        op: n.op_type.as_str(),
    };
    let (mut outs, version) = match n.domain.as_str() {
        "" | "ai.onnx" => (
            FAMILIES
                .iter()
                .find_map(|family| family(&cx))
                .unwrap_or_default(),
            Some(opset),
        ),
        "ai.onnx.ml" => (ml::rules(&cx).unwrap_or_default(), None),
        _ => (Vec::new(), None),
    };
    with_schema_types(&cx, &mut outs, version);
    outs
}

/// Fills the element type of every output the rules left untyped from the op's schema
/// ([`schema`]): what the schema alone fixes, never a guess. Control-flow ops are typed from
/// their bodies by the caller, and this leaves their (open) outputs alone.
fn with_schema_types(cx: &NodeCx<'_>, outs: &mut Vec<Option<Out>>, version: Option<i64>) {
    let types = schema::output_types(&cx.n.domain, cx.op, version, cx.n.output.len(), |i| {
        cx.in_dt(i)
    });
    if outs.len() < types.len() {
        outs.resize_with(types.len(), || None);
    }
    for (o, dt) in outs.iter_mut().zip(types) {
        let Some(dt) = dt else { continue };
        match o {
            Some(o) if o.dtype.is_none() => o.dtype = Some(dt),
            Some(_) => {}
            None => *o = shape(Some(dt), None),
        }
    }
}

/// One node with the facts about its graph: what every family rule reads.
struct NodeCx<'a> {
    n: &'a NodeProto,
    f: &'a GraphFacts<'a>,
    opset: i64,
    op: &'a str,
}

impl<'a> NodeCx<'a> {
    /// Facts about input `i` (none for a missing or empty input).
    fn inp(&self, i: usize) -> Option<&'a TensorFacts> {
        self.n.input.get(i).and_then(|s| self.f.get(s))
    }

    fn in_shape(&self, i: usize) -> Option<Vec<SymDim>> {
        self.inp(i).and_then(|t| t.shape.clone())
    }

    fn in_dt(&self, i: usize) -> Option<ElemType> {
        self.inp(i).and_then(|t| t.dtype)
    }

    /// Tracked integer value of input `i`.
    fn in_value(&self, i: usize) -> Option<&'a [SymDim]> {
        self.n.input.get(i).and_then(|s| self.f.value(s))
    }
}

/// The answer of a single-output op.
fn one(o: Option<Out>) -> Vec<Option<Out>> {
    vec![o]
}

/// An output with `t`'s type and shape (no value).
fn same(t: &TensorFacts) -> Out {
    Out {
        dtype: t.dtype,
        shape: t.shape.clone(),
        value: None,
    }
}

/// An output with this type and shape (no value).
fn shape(dtype: Option<ElemType>, s: Option<Vec<SymDim>>) -> Option<Out> {
    Some(Out {
        dtype,
        shape: s,
        value: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::tables::{trt_versions, TrtTable};

    /// The dispatcher asks the families in turn, so an op claimed by two of them would be
    /// answered by whichever comes first: every op type must have at most one family.
    #[test]
    fn every_op_type_has_at_most_one_family() {
        let mut ops: Vec<String> = Vec::new();
        for v in trt_versions() {
            ops.extend(TrtTable::load(v).unwrap().ops.into_keys());
        }
        ops.extend(["Upsample", "CenterCropPad", "Scatter"].map(String::from));
        ops.sort();
        ops.dedup();
        let f = GraphFacts::default();
        let mut answered = 0;
        for op in &ops {
            let n = NodeProto {
                op_type: op.clone(),
                ..Default::default()
            };
            let cx = NodeCx {
                n: &n,
                f: &f,
                opset: 18,
                op,
            };
            let claims = FAMILIES.iter().filter(|fam| fam(&cx).is_some()).count();
            assert!(claims <= 1, "`{op}` is claimed by {claims} families");
            answered += usize::from(claims == 1);
        }
        assert!(answered > 100, "only {answered} op types have rules");
    }
}
