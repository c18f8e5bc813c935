//! Ops that change the element type: Cast, CastLike, QuantizeLinear and DequantizeLinear.
//!
//! Enters: a [`NodeCx`]. Leaves: `None` for ops of other families, else the one [`Out`],
//! shaped like input 0. A Cast between integer types keeps the tracked value (shape
//! arithmetic often passes through int32), and one to or from bool too (a shape check
//! written `bool(x.shape[0])`), bools as 0 and 1.

use super::{one, shape, Answer, NodeCx};
use crate::analysis::facts::{Out, SymDim};
use crate::onnx::attr;
use crate::onnx::ElemType;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    let n = cx.n;
    Some(match cx.op {
        "Cast" => {
            let to = attr::int(n, "to").map(|c| ElemType::from_code(c as i32));
            let t = cx.inp(0);
            let ints = |e: Option<ElemType>| {
                matches!(
                    e,
                    Some(ElemType::Int64 | ElemType::Int32 | ElemType::Int8 | ElemType::Uint8)
                )
            };
            let from = t.and_then(|t| t.dtype);
            let int_or_bool = |e: Option<ElemType>| ints(e) || e == Some(ElemType::Bool);
            let value = t
                .and_then(|t| t.value.clone())
                .filter(|_| int_or_bool(to) && int_or_bool(from))
                .map(|v| {
                    if to == Some(ElemType::Bool) {
                        // Any non-zero integer is true.
                        v.into_iter()
                            .map(|d| match d {
                                SymDim::Known(x) => SymDim::Known(i64::from(x != 0)),
                                _ => SymDim::Unknown,
                            })
                            .collect()
                    } else {
                        v
                    }
                });
            one(Some(Out {
                dtype: to,
                shape: t.and_then(|t| t.shape.clone()),
                value,
            }))
        }
        "CastLike" => one(shape(cx.in_dt(1), cx.in_shape(0))),
        "QuantizeLinear" => {
            // Output type: the attribute (opset 21), else the zero point's, else uint8.
            let dt = attr::int(n, "output_dtype")
                .filter(|&c| c != 0)
                .map(|c| ElemType::from_code(c as i32))
                .or_else(|| cx.in_dt(2))
                .or(Some(ElemType::Uint8));
            one(shape(dt, cx.in_shape(0)))
        }
        "DequantizeLinear" => one(shape(cx.in_dt(1), cx.in_shape(0))),
        _ => return None,
    })
}
