//! Ops that rearrange or resize a tensor without looking at its data: Reshape (0 and -1),
//! Transpose, Squeeze/Unsqueeze, Flatten, Expand, Tile, Pad, CenterCropPad, Resize/Upsample,
//! DepthToSpace/SpaceToDepth, and Shape and Size, which turn a shape into a value.
//!
//! Enters: a [`NodeCx`] (shape-like inputs are read from tracked small values). Leaves: `None`
//! for ops of other families, else one [`Out`] per output. Reshape, Squeeze and Unsqueeze
//! carry their input's tracked value; Shape and Size produce one.

use super::{one, shape, Answer, NodeCx};
use crate::analysis::facts::{axis, broadcast, prod, Out, SymDim};
use crate::onnx::attr;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    let n = cx.n;
    Some(match cx.op {
        "Reshape" => one(shape(
            cx.in_dt(0),
            reshape(
                n,
                cx.in_shape(0),
                cx.f.value(n.input.get(1).map_or("", |s| s)),
            ),
        ))
        .into_iter()
        .map(|o| {
            o.map(|mut o| {
                o.value = cx.inp(0).and_then(|t| t.value.clone());
                o
            })
        })
        .collect(),
        "Transpose" => {
            let s = cx.in_shape(0).and_then(|s| {
                let perm =
                    attr::ints(n, "perm").unwrap_or_else(|| (0..s.len() as i64).rev().collect());
                if perm.len() != s.len() {
                    return None;
                }
                perm.iter()
                    .map(|&p| axis(p, s.len()).map(|a| s[a].clone()))
                    .collect()
            });
            one(shape(cx.in_dt(0), s))
        }
        "Squeeze" | "Unsqueeze" => squeeze_unsqueeze(cx),
        "Flatten" => {
            let s = cx.in_shape(0).and_then(|s| {
                let a = attr::int(n, "axis").unwrap_or(1);
                let a = if a < 0 { a + s.len() as i64 } else { a };
                let a = usize::try_from(a).ok().filter(|&a| a <= s.len())?;
                Some(vec![prod(&s[..a]), prod(&s[a..])])
            });
            one(shape(cx.in_dt(0), s))
        }
        "Shape" => shape_of(cx),
        "Size" => one(Some(Out {
            dtype: Some(ElemType::Int64),
            shape: Some(vec![]),
            value: cx.in_shape(0).map(|s| vec![prod(&s)]),
        })),
        "Expand" => {
            let s = match (cx.in_shape(0), cx.in_value(1)) {
                (Some(a), Some(b)) => Some(broadcast(&[&a, b])),
                _ => None,
            };
            one(shape(cx.in_dt(0), s))
        }
        "Tile" => tile(cx),
        "Pad" => pad(cx),
        "CenterCropPad" => center_crop_pad(cx),
        "Resize" | "Upsample" => {
            let sizes = cx.in_value(3).map(|v| v.to_vec());
            let s = match sizes {
                Some(v) if !attr::has(n, "axes") => Some(v),
                _ => cx.in_shape(0).map(|s| vec![SymDim::Unknown; s.len()]),
            };
            one(shape(cx.in_dt(0), s))
        }
        "DepthToSpace" | "SpaceToDepth" => depth_space(cx),
        _ => return None,
    })
}

/// Axes from input 1 (opset 13 on) or the `axes` attribute; Squeeze without axes drops the
/// 1-dims only when every dim is known.
fn squeeze_unsqueeze(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let (n, f, opset) = (cx.n, cx.f, cx.opset);
    let axes = if opset >= 13 {
        n.input.get(1).and_then(|a| f.known_ints(a))
    } else {
        attr::ints(n, "axes")
    };
    let axes_given = if opset >= 13 {
        n.input.get(1).is_some_and(|a| !a.is_empty())
    } else {
        attr::has(n, "axes")
    };
    let s = cx.in_shape(0).and_then(|s| {
        if cx.op == "Squeeze" {
            if !axes_given {
                if s.iter().all(|d| d.known().is_some()) {
                    return Some(s.into_iter().filter(|d| *d != SymDim::Known(1)).collect());
                }
                return None;
            }
            let ax: Option<Vec<usize>> = axes?.iter().map(|&a| axis(a, s.len())).collect();
            let ax = ax?;
            Some(
                s.into_iter()
                    .enumerate()
                    .filter(|(i, _)| !ax.contains(i))
                    .map(|(_, d)| d)
                    .collect(),
            )
        } else {
            let r = s.len() + axes.as_ref()?.len();
            let ax: Option<Vec<usize>> = axes?.iter().map(|&a| axis(a, r)).collect();
            let ax = ax?;
            let mut it = s.into_iter();
            (0..r)
                .map(|i| {
                    if ax.contains(&i) {
                        Some(SymDim::Known(1))
                    } else {
                        it.next()
                    }
                })
                .collect()
        }
    });
    one(Some(Out {
        dtype: cx.in_dt(0),
        shape: s,
        value: cx.inp(0).and_then(|t| t.value.clone()),
    }))
}

/// Shape, with `start`/`end` clamped as the spec says; the dims become the tracked value.
fn shape_of(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let n = cx.n;
    let s = cx.in_shape(0);
    let value = s.map(|s| {
        let r = s.len() as i64;
        let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let st = clampi(attr::int(n, "start").unwrap_or(0));
        let en = clampi(attr::int(n, "end").unwrap_or(r));
        s[st..en.max(st)].to_vec()
    });
    one(Some(Out {
        dtype: Some(ElemType::Int64),
        shape: value.as_ref().map(|v| vec![SymDim::Known(v.len() as i64)]),
        value,
    }))
}

fn tile(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let s = match (cx.in_shape(0), cx.in_value(1)) {
        (Some(a), Some(r)) if a.len() == r.len() => Some(
            a.iter()
                .zip(r)
                .map(|(d, r)| match (d, r) {
                    (_, SymDim::Known(1)) => d.clone(),
                    (SymDim::Known(x), SymDim::Known(y)) => SymDim::Known(x.saturating_mul(*y)),
                    _ => SymDim::Unknown,
                })
                .collect(),
        ),
        _ => None,
    };
    one(shape(cx.in_dt(0), s))
}

/// Pads from input 1 (opset 11 on) or the `pads` attribute; with an `axes` input (or pads
/// that are not known) the rank is kept and every dim is unknown.
fn pad(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let (n, f) = (cx.n, cx.f);
    let pads = if cx.opset >= 11 {
        n.input.get(1).and_then(|s| f.known_ints(s))
    } else {
        attr::ints(n, "pads")
    };
    let axes_given = n.input.get(3).is_some_and(|s| !s.is_empty());
    let s = cx.in_shape(0).map(|s| {
        let r = s.len();
        match pads {
            Some(p) if p.len() == 2 * r && !axes_given => s
                .iter()
                .enumerate()
                .map(|(i, d)| match d {
                    SymDim::Known(v) => {
                        SymDim::Known(v.saturating_add(p[i]).saturating_add(p[i + r]))
                    }
                    d if p[i] == 0 && p[i + r] == 0 => d.clone(),
                    _ => SymDim::Unknown,
                })
                .collect(),
            _ => vec![SymDim::Unknown; r],
        }
    });
    one(shape(cx.in_dt(0), s))
}

fn center_crop_pad(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let s = match (cx.in_shape(0), cx.in_value(1)) {
        (Some(mut x), Some(v)) => {
            let axes = attr::ints(cx.n, "axes").unwrap_or_else(|| (0..x.len() as i64).collect());
            if axes.len() == v.len() && axes.iter().all(|&a| axis(a, x.len()).is_some()) {
                for (a, d) in axes.iter().zip(v) {
                    if let Some(i) = axis(*a, x.len()) {
                        x[i] = d.clone();
                    }
                }
                Some(x)
            } else {
                None
            }
        }
        _ => None,
    };
    one(shape(cx.in_dt(0), s))
}

/// DepthToSpace and SpaceToDepth on NCHW with a positive `blocksize`.
fn depth_space(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let b = attr::int(cx.n, "blocksize").unwrap_or(0);
    let s = cx.in_shape(0).filter(|s| s.len() == 4 && b > 0).map(|s| {
        let k = |d: &SymDim, f: &dyn Fn(i64) -> Option<i64>| {
            d.known().and_then(f).map_or(SymDim::Unknown, SymDim::Known)
        };
        if cx.op == "DepthToSpace" {
            vec![
                s[0].clone(),
                k(&s[1], &|c| {
                    let bb = b.saturating_mul(b);
                    (c % bb == 0).then(|| c / bb)
                }),
                k(&s[2], &|h| Some(h.saturating_mul(b))),
                k(&s[3], &|w| Some(w.saturating_mul(b))),
            ]
        } else {
            vec![
                s[0].clone(),
                k(&s[1], &|c| Some(c.saturating_mul(b).saturating_mul(b))),
                k(&s[2], &|h| (h % b == 0).then(|| h / b)),
                k(&s[3], &|w| (w % b == 0).then(|| w / b)),
            ]
        }
    });
    one(shape(cx.in_dt(0), s))
}

/// Reshape's output shape: 0 copies the input dim (unless `allowzero`), one -1 is solved by
/// cancelling known and symbolic dims between input and target.
fn reshape(
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
    }
}
