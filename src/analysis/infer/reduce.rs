//! Reductions (ReduceSum, ReduceMean, ReduceMax, …, ReduceSumSquare) and ArgMax/ArgMin.
//!
//! Enters: a [`NodeCx`]. Leaves: `None` for ops of other families, else the one reduced
//! [`Out`]. Axes come from input 1 where the opset puts them there (ReduceSum from 13, the
//! others from 18), else from the attribute; `keepdims` and `noop_with_empty_axes` are
//! honoured, and axes that are not known leave the shape unknown.

use super::{one, Answer, NodeCx};
use crate::analysis::facts::{axis, GraphFacts, Out, SymDim};
use crate::onnx::attr;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    Some(match cx.op {
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
        | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare" | "ArgMax"
        | "ArgMin" => one(reduce(cx.n, cx.f, cx.opset)),
        _ => return None,
    })
}

fn reduce(n: &NodeProto, f: &GraphFacts, opset: i64) -> Option<Out> {
    let op = n.op_type.as_str();
    let x = f.get(n.input.first()?)?;
    let keep = attr::int(n, "keepdims").unwrap_or(1) != 0;
    let arg = op.starts_with("Arg");
    let dt = if arg { Some(ElemType::Int64) } else { x.dtype };
    let axes_from_input = !arg && (opset >= 18 || (op == "ReduceSum" && opset >= 13));
    let axes: Option<Vec<i64>> = if arg {
        Some(vec![attr::int(n, "axis").unwrap_or(0)])
    } else if axes_from_input {
        match n.input.get(1).filter(|s| !s.is_empty()) {
            None => Some(vec![]),
            Some(s) => match f.known_ints(s) {
                Some(v) => Some(v),
                None => {
                    return Some(Out {
                        dtype: dt,
                        shape: None,
                        value: None,
                    })
                }
            },
        }
    } else {
        Some(attr::ints(n, "axes").unwrap_or_default())
    };
    let s = x.shape.as_ref().and_then(|s| {
        let mut ax = axes?;
        if ax.is_empty() {
            if attr::int(n, "noop_with_empty_axes").unwrap_or(0) != 0 {
                return Some(s.clone());
            }
            ax = (0..s.len() as i64).collect();
        }
        let ax: Option<Vec<usize>> = ax.iter().map(|&a| axis(a, s.len())).collect();
        let ax = ax?;
        Some(
            s.iter()
                .enumerate()
                .filter_map(|(i, d)| {
                    if ax.contains(&i) {
                        keep.then_some(SymDim::Known(1))
                    } else {
                        Some(d.clone())
                    }
                })
                .collect(),
        )
    });
    Some(Out {
        dtype: dt,
        shape: s,
        value: None,
    })
}
