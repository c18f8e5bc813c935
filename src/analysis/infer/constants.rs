//! Ops that make a tensor from attributes or small inputs: Constant, ConstantOfShape, Range,
//! EyeLike and OneHot.
//!
//! Enters: a [`NodeCx`]. Leaves: `None` for ops of other families, else the one [`Out`].
//! Integer Constants (up to [`MAX_TRACKED_VALUES`] elements) carry their value, which is how
//! shapes written into the graph become known.

use super::{one, shape, Answer, NodeCx};
use crate::analysis::facts::{axis, tensor_info, Out, SymDim, TensorFacts, MAX_TRACKED_VALUES};
use crate::onnx::attr;
use crate::onnx::ElemType;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    let (n, f) = (cx.n, cx.f);
    Some(match cx.op {
        "Constant" => constant(cx),
        "ConstantOfShape" => {
            let dt = attr::tensor(n, "value")
                .map(|t| ElemType::from_code(t.data_type))
                .or(Some(ElemType::Float32));
            let s = n.input.first().and_then(|s| f.value(s)).map(|v| v.to_vec());
            one(shape(dt, s))
        }
        "Range" => {
            let k: Option<Vec<i64>> = (0..3)
                .map(|i| {
                    n.input
                        .get(i)
                        .and_then(|s| f.known_ints(s))
                        .and_then(|v| v.first().copied())
                })
                .collect();
            let len = match k.as_deref() {
                Some(&[s, l, d]) if d != 0 => {
                    SymDim::Known(((l as f64 - s as f64) / d as f64).ceil().max(0.0) as i64)
                }
                _ => SymDim::Unknown,
            };
            one(shape(cx.in_dt(0), Some(vec![len])))
        }
        "EyeLike" => one(shape(
            attr::int(n, "dtype")
                .map(|c| ElemType::from_code(c as i32))
                .or(cx.in_dt(0)),
            cx.in_shape(0),
        )),
        "OneHot" => {
            let depth = cx.in_value(1).and_then(|v| v.first().cloned());
            let s = cx.in_shape(0).and_then(|mut s| {
                let a = attr::int(n, "axis").unwrap_or(-1);
                let r = s.len() + 1;
                let a = axis(a, r)?;
                s.insert(a, depth.unwrap_or(SymDim::Unknown));
                Some(s)
            });
            one(shape(cx.in_dt(2), s))
        }
        _ => return None,
    })
}

/// Constant: the type, shape and (for integers) value of its one attribute.
fn constant(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let Some(a) = cx.n.attribute.first() else {
        return vec![];
    };
    let o = match a.name.as_str() {
        "value" => a.t.as_ref().map(tensor_info).map(|t: TensorFacts| Out {
            dtype: t.dtype,
            shape: t.shape,
            value: t.value,
        }),
        "value_float" => Some(Out {
            dtype: Some(ElemType::Float32),
            shape: Some(vec![]),
            value: None,
        }),
        "value_floats" => Some(Out {
            dtype: Some(ElemType::Float32),
            shape: Some(vec![SymDim::Known(a.floats.len() as i64)]),
            value: None,
        }),
        "value_int" => Some(Out {
            dtype: Some(ElemType::Int64),
            shape: Some(vec![]),
            value: Some(vec![SymDim::Known(a.i)]),
        }),
        "value_ints" => Some(Out {
            dtype: Some(ElemType::Int64),
            shape: Some(vec![SymDim::Known(a.ints.len() as i64)]),
            value: (a.ints.len() <= MAX_TRACKED_VALUES)
                .then(|| a.ints.iter().map(|&v| SymDim::Known(v)).collect()),
        }),
        _ => None,
    };
    one(o)
}
