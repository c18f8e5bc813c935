//! Ops that change the element type: Cast, CastLike, QuantizeLinear and DequantizeLinear.
//!
//! Enters: a [`NodeCx`]. Leaves: `None` for ops of other families, else the one [`Out`],
//! shaped like input 0. A Cast between integer types keeps the tracked value (shape
//! arithmetic often passes through int32).

use super::{one, shape, Answer, NodeCx};
use crate::analysis::facts::Out;
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
            let value = t
                .and_then(|t| t.value.clone())
                .filter(|_| ints(to) && ints(t.and_then(|t| t.dtype)));
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
