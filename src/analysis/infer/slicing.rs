//! Ops that cut a tensor apart or join tensors: Concat, Split, Slice, Gather and
//! GatherElements. They are also how shape arithmetic picks and assembles dims, so Concat,
//! Slice and Gather carry small tracked values through.
//!
//! Enters: a [`NodeCx`] (starts, ends, indices and split sizes read from tracked values).
//! Leaves: `None` for ops of other families, else one [`Out`] per output.

use super::{one, shape, Answer, NodeCx};
use crate::analysis::facts::{axis, GraphFacts, Out, SymDim, TensorFacts, MAX_TRACKED_VALUES};
use crate::onnx::attr;
use crate::onnx::proto::NodeProto;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    let (n, f) = (cx.n, cx.f);
    Some(match cx.op {
        "Concat" => one(concat(n, f)),
        "Slice" => one(slice(n, f, cx.opset)),
        "Gather" => one(gather(n, f)),
        "GatherElements" => one(shape(cx.in_dt(0), cx.in_shape(1))),
        "Split" => split(n, f, cx.opset),
        _ => return None,
    })
}

/// Concat along `axis`: the dims of the axis add up, the others are taken from any input that
/// knows them; rank-0/1 values are joined.
fn concat(n: &NodeProto, f: &GraphFacts) -> Option<Out> {
    let ins: Vec<Option<&TensorFacts>> = n.input.iter().map(|i| f.get(i)).collect();
    let dt = ins.iter().flatten().find_map(|t| t.dtype);
    let shapes: Option<Vec<Vec<SymDim>>> = ins
        .iter()
        .map(|t| t.and_then(|t| t.shape.clone()))
        .collect();
    // Without every input's shape, the type is still that of the inputs.
    let typed = Out {
        dtype: dt,
        ..Default::default()
    };
    let Some(shapes) = shapes else {
        return Some(typed);
    };
    let Some(first) = shapes.first() else {
        return Some(typed);
    };
    let Some(a) = attr::int(n, "axis").and_then(|x| axis(x, first.len())) else {
        return Some(typed);
    };
    let mut out = first.clone();
    let mut total = Some(0i64);
    for s in &shapes {
        if s.len() != first.len() {
            return None;
        }
        total = match (total, s[a].known()) {
            (Some(t), Some(v)) => t.checked_add(v),
            _ => None,
        };
    }
    for (i, d) in out.iter_mut().enumerate() {
        if i != a && *d == SymDim::Unknown {
            *d = shapes
                .iter()
                .map(|s| s[i].clone())
                .find(|x| *x != SymDim::Unknown)
                .unwrap_or(SymDim::Unknown);
        }
    }
    out[a] = total.map_or(SymDim::Unknown, SymDim::Known);
    let value = if first.len() <= 1 {
        let vals: Option<Vec<Vec<SymDim>>> = ins
            .iter()
            .map(|t| t.and_then(|t| t.value.clone()))
            .collect();
        vals.map(|v| v.concat())
            .filter(|v| v.len() <= MAX_TRACKED_VALUES)
    } else {
        None
    };
    Some(Out {
        dtype: dt,
        shape: Some(out),
        value,
    })
}

/// Slice with starts/ends/axes/steps from inputs (opset 10 on) or attributes; values of a
/// rank-1 input are sliced too.
fn slice(n: &NodeProto, f: &GraphFacts, opset: i64) -> Option<Out> {
    let x = f.get(n.input.first()?)?;
    let get = |i: usize, a: &str| -> Option<Option<Vec<i64>>> {
        if opset >= 10 {
            match n.input.get(i).filter(|s| !s.is_empty()) {
                None => Some(None),
                Some(s) => f.known_ints(s).map(Some),
            }
        } else {
            Some(attr::ints(n, a))
        }
    };
    let unknown_dims = || x.shape.as_ref().map(|s| vec![SymDim::Unknown; s.len()]);
    let fallback = Some(Out {
        dtype: x.dtype,
        shape: unknown_dims(),
        value: None,
    });
    let (Some(Some(starts)), Some(Some(ends)), Some(axes), Some(steps)) =
        (get(1, "starts"), get(2, "ends"), get(3, "axes"), get(4, ""))
    else {
        return fallback;
    };
    let Some(s) = x.shape.clone() else {
        return fallback;
    };
    let r = s.len();
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if axes.len() != starts.len() || ends.len() != starts.len() || steps.len() != starts.len() {
        return fallback;
    }
    let mut out = s.clone();
    let mut value = if r == 1 { x.value.clone() } else { None };
    for i in 0..starts.len() {
        let Some(a) = axis(axes[i], r) else {
            return fallback;
        };
        let step = steps[i];
        if step == 0 {
            return fallback;
        }
        match &s[a] {
            SymDim::Known(dim) => {
                let dim = *dim;
                let norm = |v: i64, lo: i64, hi: i64| {
                    (if v < 0 { v.saturating_add(dim) } else { v }).clamp(lo, hi)
                };
                let (st, en) = if step > 0 {
                    (norm(starts[i], 0, dim), norm(ends[i], 0, dim))
                } else {
                    (norm(starts[i], -1, dim - 1), norm(ends[i], -1, dim - 1))
                };
                let (st, en, stp) = (st as i128, en as i128, step as i128);
                let len = if stp > 0 {
                    (en - st + stp - 1).div_euclid(stp)
                } else {
                    (st - en - stp - 1).div_euclid(-stp)
                }
                .max(0);
                let Ok(len) = i64::try_from(len) else {
                    return fallback;
                };
                out[a] = SymDim::Known(len);
                value = value.map(|v| {
                    (0..len)
                        .filter_map(|k| {
                            usize::try_from(st + k as i128 * stp)
                                .ok()
                                .and_then(|j| v.get(j).cloned())
                        })
                        .collect()
                });
            }
            d => {
                if starts[i] == 0 && ends[i] >= i32::MAX as i64 && step == 1 {
                    out[a] = d.clone();
                } else {
                    out[a] = SymDim::Unknown;
                    value = None;
                }
            }
        }
    }
    Some(Out {
        dtype: x.dtype,
        shape: Some(out),
        value,
    })
}

/// Gather along `axis`; gathering from a tracked rank-1 value picks its elements.
fn gather(n: &NodeProto, f: &GraphFacts) -> Option<Out> {
    let x = f.get(n.input.first()?)?;
    let idx = n.input.get(1).and_then(|i| f.get(i));
    let s = x.shape.as_ref().and_then(|s| {
        let a = axis(attr::int(n, "axis").unwrap_or(0), s.len())?;
        let is = idx?.shape.as_ref()?;
        let mut o = s[..a].to_vec();
        o.extend(is.iter().cloned());
        o.extend(s[a + 1..].iter().cloned());
        Some(o)
    });
    let value = match (
        x.shape.as_deref(),
        x.value.as_ref(),
        idx.and_then(|i| i.value.as_ref()),
    ) {
        (Some([len]), Some(v), Some(ix)) if attr::int(n, "axis").unwrap_or(0) == 0 => ix
            .iter()
            .map(|i| {
                let i = i.known()?;
                let j = if i < 0 { i + len.known()? } else { i };
                v.get(usize::try_from(j).ok()?).cloned()
            })
            .collect(),
        _ => None,
    };
    Some(Out {
        dtype: x.dtype,
        shape: s,
        value,
    })
}

/// Split into equal parts, or by `split` sizes from input 1 (opset 13 on) or the attribute;
/// opset 18 lets the last part be smaller.
fn split(n: &NodeProto, f: &GraphFacts, opset: i64) -> Vec<Option<Out>> {
    let Some(x) = n.input.first().and_then(|i| f.get(i)) else {
        return vec![];
    };
    let k = n.output.len();
    // Sizes given (as an input from opset 13, else as an attribute) but not known here are
    // unknown, never the equal split of a missing `split`.
    let given = if opset >= 13 {
        n.input.get(1).is_some_and(|s| !s.is_empty())
    } else {
        attr::ints(n, "split").is_some()
    };
    let sizes: Option<Vec<i64>> = if opset >= 13 {
        n.input
            .get(1)
            .filter(|s| !s.is_empty())
            .and_then(|s| f.known_ints(s))
    } else {
        attr::ints(n, "split")
    };
    let Some(s) = x.shape.clone() else {
        return vec![
            Some(Out {
                dtype: x.dtype,
                ..Default::default()
            });
            k
        ];
    };
    let Some(a) = axis(attr::int(n, "axis").unwrap_or(0), s.len()) else {
        return vec![];
    };
    let sizes = sizes.or_else(|| {
        if given {
            return None;
        }
        let d = s[a].known()?;
        let k = k as i64;
        if k == 0 {
            return None;
        }
        if d % k == 0 {
            Some(vec![d / k; k as usize])
        } else if opset >= 18 {
            let c = d.saturating_add(k - 1) / k;
            Some(
                (0..k)
                    .map(|i| d.saturating_sub(i.saturating_mul(c)).clamp(0, c))
                    .collect(),
            )
        } else {
            None
        }
    });
    (0..k)
        .map(|i| {
            let mut o = s.clone();
            o[a] = sizes
                .as_ref()
                .and_then(|v| v.get(i))
                .map_or(SymDim::Unknown, |&v| SymDim::Known(v));
            Some(Out {
                dtype: x.dtype,
                shape: Some(o),
                value: None,
            })
        })
        .collect()
}
