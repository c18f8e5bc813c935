//! Ops whose output size depends on tensor values: NonZero, NonMaxSuppression, Compress,
//! Unique and TopK (whose K may be computed in the graph).
//!
//! Enters: a [`NodeCx`]. Leaves: `None` for ops of other families, else one [`Out`] per
//! output, with the data-dependent dims unknown (and the rank and the other dims as far as
//! they are known). [`crate::analysis::dds`] decides which of these start a data-dependent
//! shape; here only the shapes are worked out.

use super::{one, shape, Answer, NodeCx};
use crate::analysis::facts::{axis, SymDim};
use crate::onnx::attr;
use crate::onnx::ElemType;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    let n = cx.n;
    Some(match cx.op {
        "NonZero" => one(shape(
            Some(ElemType::Int64),
            cx.in_shape(0)
                .map(|s| vec![SymDim::Known(s.len() as i64), SymDim::Unknown]),
        )),
        "NonMaxSuppression" => one(shape(
            Some(ElemType::Int64),
            Some(vec![SymDim::Unknown, SymDim::Known(3)]),
        )),
        "Compress" => {
            let s = match attr::int(n, "axis") {
                None => Some(vec![SymDim::Unknown]),
                Some(a) => cx.in_shape(0).and_then(|mut s| {
                    let a = axis(a, s.len())?;
                    s[a] = SymDim::Unknown;
                    Some(s)
                }),
            };
            one(shape(cx.in_dt(0), s))
        }
        "Unique" => {
            let s = if attr::has(n, "axis") {
                None
            } else {
                Some(vec![SymDim::Unknown])
            };
            let i64s = Some(vec![SymDim::Unknown]);
            vec![
                shape(cx.in_dt(0), s),
                shape(Some(ElemType::Int64), i64s.clone()),
                shape(Some(ElemType::Int64), i64s.clone()),
                shape(Some(ElemType::Int64), i64s),
            ]
        }
        "TopK" => {
            let k = if cx.opset >= 10 {
                cx.in_value(1).and_then(|v| v.first().cloned())
            } else {
                attr::int(n, "k").map(SymDim::Known)
            };
            let s = cx.in_shape(0).and_then(|mut s| {
                let a = axis(attr::int(n, "axis").unwrap_or(-1), s.len())?;
                s[a] = k.unwrap_or(SymDim::Unknown);
                Some(s)
            });
            vec![
                shape(cx.in_dt(0), s.clone()),
                shape(Some(ElemType::Int64), s),
            ]
        }
        _ => return None,
    })
}
