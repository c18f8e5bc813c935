//! Shape rules of the ops that move, combine or reduce data — MatMul, Conv and pooling,
//! Reshape (0 and -1), Concat, Slice, Gather, reductions, Split — called from
//! [`super::infer::infer`]. Enters: a node and the facts so far; leaves: an [`Out`] per
//! output. A rule that cannot be sure answers unknown.

use super::facts::{axis, broadcast, GraphFacts, Out, SymDim, TensorInfo, MAX_TRACKED_VALUES};
use crate::onnx::attr;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

pub fn matmul(a: &[SymDim], b: &[SymDim]) -> Option<Vec<SymDim>> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (a2, pa) = if a.len() == 1 {
        (vec![SymDim::Known(1), a[0].clone()], true)
    } else {
        (a.to_vec(), false)
    };
    let (b2, pb) = if b.len() == 1 {
        (vec![b[0].clone(), SymDim::Known(1)], true)
    } else {
        (b.to_vec(), false)
    };
    let batch = broadcast(&[&a2[..a2.len() - 2], &b2[..b2.len() - 2]]);
    let mut out = batch;
    if !pa {
        out.push(a2[a2.len() - 2].clone());
    }
    if !pb {
        out.push(b2[b2.len() - 1].clone());
    }
    Some(out)
}

pub fn conv_like(
    n: &NodeProto,
    op: &str,
    x: Option<Vec<SymDim>>,
    w: Option<Vec<SymDim>>,
) -> Option<Vec<SymDim>> {
    let x = x?;
    if x.len() < 3 {
        return None;
    }
    let sp = x.len() - 2;
    let kernel: Vec<i64> = match attr::ints(n, "kernel_shape") {
        Some(k) => k,
        None if op == "Conv" => w
            .as_ref()?
            .get(2..)?
            .iter()
            .map(|d| d.known())
            .collect::<Option<Vec<_>>>()?,
        None => return None,
    };
    if kernel.len() != sp {
        return None;
    }
    let strides = attr::ints(n, "strides").unwrap_or_else(|| vec![1; sp]);
    let dil = attr::ints(n, "dilations").unwrap_or_else(|| vec![1; sp]);
    let pads = attr::ints(n, "pads").unwrap_or_else(|| vec![0; 2 * sp]);
    let auto = attr::string(n, "auto_pad").unwrap_or_default();
    let ceil = attr::int(n, "ceil_mode").unwrap_or(0) != 0;
    if strides.len() != sp || dil.len() != sp || pads.len() != 2 * sp {
        return None;
    }
    let ch = if op == "Conv" {
        w.as_ref()
            .and_then(|w| w.first().cloned())
            .unwrap_or(SymDim::Unknown)
    } else {
        x[1].clone()
    };
    let mut out = vec![x[0].clone(), ch];
    for i in 0..sp {
        // i128: hostile attributes must not overflow.
        let s = strides[i].max(1) as i128;
        let ek = dil[i] as i128 * (kernel[i] as i128 - 1) + 1;
        let (pb, pe) = (pads[i] as i128, pads[i + sp] as i128);
        let fit = |v: i128| i64::try_from(v).map_or(SymDim::Unknown, SymDim::Known);
        let d = match (&x[i + 2], auto.as_str()) {
            (SymDim::Known(v), "SAME_UPPER" | "SAME_LOWER") => fit((*v as i128 + s - 1) / s),
            (d, "SAME_UPPER" | "SAME_LOWER") if s == 1 => d.clone(),
            (SymDim::Known(v), "VALID") => fit((*v as i128 - ek) / s + 1),
            (SymDim::Known(v), _) => {
                let num = *v as i128 + pb + pe - ek;
                fit(if ceil {
                    (num + s - 1) / s + 1
                } else {
                    num.div_euclid(s) + 1
                })
            }
            (d, "" | "NOTSET") if s == 1 && ek == 1 && pb == 0 && pe == 0 => d.clone(),
            _ => SymDim::Unknown,
        };
        out.push(match d {
            SymDim::Known(v) if v < 0 => SymDim::Unknown,
            d => d,
        });
    }
    Some(out)
}

pub fn reshape(
    n: &NodeProto,
    x: Option<Vec<SymDim>>,
    target: Option<&[SymDim]>,
) -> Option<Vec<SymDim>> {
    let t = target?;
    let allowzero = attr::int(n, "allowzero").unwrap_or(0) != 0;
    let mut out: Vec<SymDim> = Vec::with_capacity(t.len());
    let mut neg = None;
    for (i, d) in t.iter().enumerate() {
        match d {
            SymDim::Known(0) if !allowzero => out.push(
                x.as_ref()
                    .and_then(|x| x.get(i).cloned())
                    .unwrap_or(SymDim::Unknown),
            ),
            SymDim::Known(-1) => {
                if neg.is_some() {
                    return None;
                }
                neg = Some(i);
                out.push(SymDim::Unknown);
            }
            SymDim::Known(v) if *v < 0 => return None,
            d => out.push(d.clone()),
        }
    }
    if let (Some(i), Some(x)) = (neg, x) {
        // Cancel the input dims against the known output dims; what remains is the -1 dim.
        let mut rest: Vec<SymDim> = x.clone();
        let mut known_in: i64 = 1;
        let mut known_out: i64 = 1;
        rest.retain(|d| match d {
            SymDim::Known(v) => {
                known_in = known_in.saturating_mul(*v);
                false
            }
            _ => true,
        });
        for (j, d) in out.iter().enumerate() {
            if j == i {
                continue;
            }
            match d {
                SymDim::Known(v) => known_out = known_out.saturating_mul(*v),
                SymDim::Sym(_) => {
                    if let Some(p) = rest.iter().position(|r| r == d) {
                        rest.remove(p);
                    } else {
                        return Some(out);
                    }
                }
                SymDim::Unknown => return Some(out),
            }
        }
        if rest.contains(&SymDim::Unknown) || known_out == 0 || known_in % known_out != 0 {
            return Some(out);
        }
        let k = known_in / known_out;
        out[i] = match rest.as_slice() {
            [] => SymDim::Known(k),
            [s] if k == 1 => s.clone(),
            _ => SymDim::Unknown,
        };
    }
    Some(out)
}

pub fn concat(n: &NodeProto, f: &GraphFacts) -> Option<Out> {
    let ins: Vec<Option<&TensorInfo>> = n.input.iter().map(|i| f.get(i)).collect();
    let dt = ins.iter().flatten().find_map(|t| t.dtype);
    let shapes: Option<Vec<Vec<SymDim>>> = ins
        .iter()
        .map(|t| t.and_then(|t| t.shape.clone()))
        .collect();
    let shapes = shapes?;
    let first = shapes.first()?;
    let a = axis(attr::int(n, "axis")?, first.len())?;
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

pub fn slice(n: &NodeProto, f: &GraphFacts, opset: i64) -> Option<Out> {
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

pub fn gather(n: &NodeProto, f: &GraphFacts) -> Option<Out> {
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

pub fn reduce(n: &NodeProto, f: &GraphFacts, opset: i64) -> Option<Out> {
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

pub fn split(n: &NodeProto, f: &GraphFacts, opset: i64) -> Vec<Option<Out>> {
    let Some(x) = n.input.first().and_then(|i| f.get(i)) else {
        return vec![];
    };
    let k = n.output.len();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn k(v: &[i64]) -> Vec<SymDim> {
        v.iter().map(|&x| SymDim::Known(x)).collect()
    }

    #[test]
    fn reshape_minus_one_cancels_symbols() {
        let n = NodeProto::default();
        let x = vec![SymDim::Sym("b".into()), SymDim::Known(6), SymDim::Known(4)];
        assert_eq!(
            reshape(&n, Some(x.clone()), Some(&k(&[0, -1]))),
            Some(vec![SymDim::Sym("b".into()), SymDim::Known(24)])
        );
        assert_eq!(
            reshape(&n, Some(x.clone()), Some(&k(&[-1, 4]))),
            Some(vec![SymDim::Unknown, SymDim::Known(4)])
        );
        assert_eq!(reshape(&n, Some(x), Some(&k(&[-1, -1]))), None);
        assert_eq!(matmul(&k(&[2, 3, 4]), &k(&[4, 5])), Some(k(&[2, 3, 5])));
        assert_eq!(matmul(&k(&[4]), &k(&[4, 5])), Some(k(&[5])));
    }
}
