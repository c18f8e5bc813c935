//! Per-operator shape, element-type and small-value rules for [`super::shapes`].
//!
//! Enters: one node and the facts known so far. Leaves: one [`Out`] per output slot (or
//! `None`). Covers the common ops (elementwise with broadcasting, MatMul, Gemm, Conv,
//! pooling, Reshape, Transpose, Concat, Slice, Gather, Squeeze/Unsqueeze, Flatten, Shape,
//! Cast, normalisations, Softmax, reductions, Split, Expand, Tile, …). Whenever a rule is
//! not sure it answers unknown; it never guesses.

use super::facts::{
    axis, broadcast, prod, tensor_info, GraphFacts, Out, SymDim, TensorInfo, MAX_TRACKED_VALUES,
};
use super::layout::{concat, conv_like, gather, matmul, reduce, reshape, slice, split};
use crate::onnx::attr;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

fn same(t: &TensorInfo) -> Out {
    Out {
        dtype: t.dtype,
        shape: t.shape.clone(),
        value: None,
    }
}

fn shape(dtype: Option<ElemType>, s: Option<Vec<SymDim>>) -> Option<Out> {
    Some(Out {
        dtype,
        shape: s,
        value: None,
    })
}

fn arith(op: &str, a: &SymDim, b: &SymDim) -> SymDim {
    use SymDim::*;
    match (op, a, b) {
        ("Add", Known(x), Known(y)) => Known(x.saturating_add(*y)),
        ("Sub", Known(x), Known(y)) => Known(x.saturating_sub(*y)),
        ("Mul", Known(x), Known(y)) => Known(x.saturating_mul(*y)),
        ("Div", Known(x), Known(y)) => x.checked_div_euclid(*y).map_or(Unknown, Known),
        ("Add" | "Sub", s, Known(0)) | ("Mul" | "Div", s, Known(1)) | ("Mul", Known(1), s) => {
            s.clone()
        }
        ("Add", Known(0), s) => s.clone(),
        _ => Unknown,
    }
}

/// Rules for one node; one entry per output slot.
pub fn infer(n: &NodeProto, f: &GraphFacts, opset: i64) -> Vec<Option<Out>> {
    if !matches!(n.domain.as_str(), "" | "ai.onnx") {
        return Vec::new();
    }
    let inp = |i: usize| n.input.get(i).and_then(|s| f.get(s));
    let in_shape = |i: usize| inp(i).and_then(|t| t.shape.clone());
    let in_dt = |i: usize| inp(i).and_then(|t| t.dtype);
    let op = n.op_type.as_str();
    let one = |o: Option<Out>| vec![o];
    match op {
        "Relu"
        | "Sigmoid"
        | "Tanh"
        | "Exp"
        | "Log"
        | "Neg"
        | "Abs"
        | "Sqrt"
        | "Erf"
        | "Gelu"
        | "Softmax"
        | "LogSoftmax"
        | "Hardmax"
        | "Clip"
        | "LeakyRelu"
        | "Elu"
        | "Selu"
        | "HardSigmoid"
        | "HardSwish"
        | "Softplus"
        | "Softsign"
        | "Mish"
        | "Celu"
        | "Reciprocal"
        | "Floor"
        | "Ceil"
        | "Round"
        | "Sign"
        | "Sin"
        | "Cos"
        | "Tan"
        | "Asin"
        | "Acos"
        | "Atan"
        | "Sinh"
        | "Cosh"
        | "Asinh"
        | "Acosh"
        | "Atanh"
        | "Not"
        | "InstanceNormalization"
        | "LpNormalization"
        | "MeanVarianceNormalization"
        | "LRN"
        | "CumSum"
        | "Shrink"
        | "ThresholdedRelu"
        | "Trilu"
        | "ReverseSequence"
        | "ScatterElements"
        | "ScatterND"
        | "Scatter"
        | "BatchNormalization"
        | "GroupNormalization"
        | "RMSNormalization"
        | "LayerNormalization"
        | "PRelu"
        | "Dropout"
        | "Identity" => {
            let Some(t) = inp(0) else { return vec![] };
            let mut o = same(t);
            if op == "Identity" {
                o.value = t.value.clone();
            }
            let mut v = vec![Some(o)];
            if op == "Dropout" {
                v.push(shape(Some(ElemType::Bool), t.shape.clone()));
            }
            v
        }
        "CenterCropPad" => {
            let s = match (in_shape(0), n.input.get(1).and_then(|s| f.value(s))) {
                (Some(mut x), Some(v)) => {
                    let axes =
                        attr::ints(n, "axes").unwrap_or_else(|| (0..x.len() as i64).collect());
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
            one(shape(in_dt(0), s))
        }
        "IsNaN" | "IsInf" => one(shape(Some(ElemType::Bool), in_shape(0))),
        "Cast" => {
            let to = attr::int(n, "to").map(|c| ElemType::from_code(c as i32));
            let t = inp(0);
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
        "CastLike" => one(shape(in_dt(1), in_shape(0))),
        "QuantizeLinear" => {
            let dt = attr::int(n, "output_dtype")
                .filter(|&c| c != 0)
                .map(|c| ElemType::from_code(c as i32))
                .or_else(|| in_dt(2))
                .or(Some(ElemType::Uint8));
            one(shape(dt, in_shape(0)))
        }
        "DequantizeLinear" => one(shape(in_dt(1), in_shape(0))),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Max" | "Min" | "Sum" | "Mean" | "And"
        | "Or" | "Xor" | "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual"
        | "BitShift" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" | "Where" => {
            let shapes: Option<Vec<Vec<SymDim>>> = (0..n.input.len()).map(in_shape).collect();
            let dt = match op {
                "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
                    Some(ElemType::Bool)
                }
                "Where" => in_dt(1),
                _ => in_dt(0),
            };
            let s = shapes.map(|s| broadcast(&s.iter().map(|v| v.as_slice()).collect::<Vec<_>>()));
            let value = match (
                op,
                inp(0).and_then(|t| t.value.as_ref()),
                inp(1).and_then(|t| t.value.as_ref()),
            ) {
                ("Add" | "Sub" | "Mul" | "Div", Some(a), Some(b)) if n.input.len() == 2 => {
                    let len = a.len().max(b.len());
                    if (a.len() == len || a.len() == 1) && (b.len() == len || b.len() == 1) {
                        Some(
                            (0..len)
                                .map(|i| arith(op, &a[i.min(a.len() - 1)], &b[i.min(b.len() - 1)]))
                                .collect(),
                        )
                    } else {
                        None
                    }
                }
                _ => None,
            };
            one(Some(Out {
                dtype: dt,
                shape: s,
                value,
            }))
        }
        "MatMul" => {
            let (Some(a), Some(b)) = (in_shape(0), in_shape(1)) else {
                return one(shape(in_dt(0), None));
            };
            one(shape(in_dt(0), matmul(&a, &b)))
        }
        "Gemm" => {
            let (Some(a), Some(b)) = (in_shape(0), in_shape(1)) else {
                return one(shape(in_dt(0), None));
            };
            if a.len() != 2 || b.len() != 2 {
                return one(shape(in_dt(0), None));
            }
            let ta = attr::int(n, "transA").unwrap_or(0) != 0;
            let tb = attr::int(n, "transB").unwrap_or(0) != 0;
            let m = if ta { a[1].clone() } else { a[0].clone() };
            let nn = if tb { b[0].clone() } else { b[1].clone() };
            one(shape(in_dt(0), Some(vec![m, nn])))
        }
        "Conv" | "MaxPool" | "AveragePool" | "LpPool" => {
            let s = conv_like(n, op, in_shape(0), in_shape(1));
            let mut v = vec![shape(in_dt(0), s.clone())];
            if op == "MaxPool" {
                v.push(shape(Some(ElemType::Int64), s));
            }
            v
        }
        "ConvTranspose" => {
            let (x, w) = (in_shape(0), in_shape(1));
            let s = match (x, w) {
                (Some(x), Some(w)) if x.len() >= 3 && w.len() == x.len() => {
                    let g = attr::int(n, "group").unwrap_or(1);
                    let mut s = vec![
                        x[0].clone(),
                        w[1].known()
                            .map_or(SymDim::Unknown, |c| SymDim::Known(c.saturating_mul(g))),
                    ];
                    s.extend(std::iter::repeat_n(SymDim::Unknown, x.len() - 2));
                    Some(s)
                }
                _ => None,
            };
            one(shape(in_dt(0), s))
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
            let s = in_shape(0).filter(|s| s.len() >= 2).map(|s| {
                let mut o = s[..2].to_vec();
                o.extend(std::iter::repeat_n(SymDim::Known(1), s.len() - 2));
                o
            });
            one(shape(in_dt(0), s))
        }
        "Reshape" => one(shape(
            in_dt(0),
            reshape(n, in_shape(0), f.value(n.input.get(1).map_or("", |s| s))),
        ))
        .into_iter()
        .map(|o| {
            o.map(|mut o| {
                o.value = inp(0).and_then(|t| t.value.clone());
                o
            })
        })
        .collect(),
        "Transpose" => {
            let s = in_shape(0).and_then(|s| {
                let perm =
                    attr::ints(n, "perm").unwrap_or_else(|| (0..s.len() as i64).rev().collect());
                if perm.len() != s.len() {
                    return None;
                }
                perm.iter()
                    .map(|&p| axis(p, s.len()).map(|a| s[a].clone()))
                    .collect()
            });
            one(shape(in_dt(0), s))
        }
        "Concat" => one(concat(n, f)),
        "Slice" => one(slice(n, f, opset)),
        "Gather" => one(gather(n, f)),
        "GatherElements" => one(shape(in_dt(0), in_shape(1))),
        "Squeeze" | "Unsqueeze" => {
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
            let s = in_shape(0).and_then(|s| {
                if op == "Squeeze" {
                    if !axes_given {
                        if s.iter().all(|d| d.known().is_some()) {
                            return Some(
                                s.into_iter().filter(|d| *d != SymDim::Known(1)).collect(),
                            );
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
                dtype: in_dt(0),
                shape: s,
                value: inp(0).and_then(|t| t.value.clone()),
            }))
        }
        "Flatten" => {
            let s = in_shape(0).and_then(|s| {
                let a = attr::int(n, "axis").unwrap_or(1);
                let a = if a < 0 { a + s.len() as i64 } else { a };
                let a = usize::try_from(a).ok().filter(|&a| a <= s.len())?;
                Some(vec![prod(&s[..a]), prod(&s[a..])])
            });
            one(shape(in_dt(0), s))
        }
        "Shape" => {
            let s = in_shape(0);
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
        "Size" => one(Some(Out {
            dtype: Some(ElemType::Int64),
            shape: Some(vec![]),
            value: in_shape(0).map(|s| vec![prod(&s)]),
        })),
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
        | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare" | "ArgMax"
        | "ArgMin" => one(reduce(n, f, opset)),
        "Split" => split(n, f, opset),
        "Expand" => {
            let s = match (in_shape(0), n.input.get(1).and_then(|s| f.value(s))) {
                (Some(a), Some(b)) => Some(broadcast(&[&a, b])),
                _ => None,
            };
            one(shape(in_dt(0), s))
        }
        "Tile" => {
            let s = match (in_shape(0), n.input.get(1).and_then(|s| f.value(s))) {
                (Some(a), Some(r)) if a.len() == r.len() => Some(
                    a.iter()
                        .zip(r)
                        .map(|(d, r)| match (d, r) {
                            (_, SymDim::Known(1)) => d.clone(),
                            (SymDim::Known(x), SymDim::Known(y)) => {
                                SymDim::Known(x.saturating_mul(*y))
                            }
                            _ => SymDim::Unknown,
                        })
                        .collect(),
                ),
                _ => None,
            };
            one(shape(in_dt(0), s))
        }
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
            one(shape(in_dt(0), Some(vec![len])))
        }
        "NonZero" => one(shape(
            Some(ElemType::Int64),
            in_shape(0).map(|s| vec![SymDim::Known(s.len() as i64), SymDim::Unknown]),
        )),
        "NonMaxSuppression" => one(shape(
            Some(ElemType::Int64),
            Some(vec![SymDim::Unknown, SymDim::Known(3)]),
        )),
        "Compress" => {
            let s = match attr::int(n, "axis") {
                None => Some(vec![SymDim::Unknown]),
                Some(a) => in_shape(0).and_then(|mut s| {
                    let a = axis(a, s.len())?;
                    s[a] = SymDim::Unknown;
                    Some(s)
                }),
            };
            one(shape(in_dt(0), s))
        }
        "Unique" => {
            let s = if attr::has(n, "axis") {
                None
            } else {
                Some(vec![SymDim::Unknown])
            };
            let i64s = Some(vec![SymDim::Unknown]);
            vec![
                shape(in_dt(0), s),
                shape(Some(ElemType::Int64), i64s.clone()),
                shape(Some(ElemType::Int64), i64s.clone()),
                shape(Some(ElemType::Int64), i64s),
            ]
        }
        "TopK" => {
            let k = if opset >= 10 {
                n.input
                    .get(1)
                    .and_then(|s| f.value(s))
                    .and_then(|v| v.first().cloned())
            } else {
                attr::int(n, "k").map(SymDim::Known)
            };
            let s = in_shape(0).and_then(|mut s| {
                let a = axis(attr::int(n, "axis").unwrap_or(-1), s.len())?;
                s[a] = k.unwrap_or(SymDim::Unknown);
                Some(s)
            });
            vec![shape(in_dt(0), s.clone()), shape(Some(ElemType::Int64), s)]
        }
        "Pad" => {
            let pads = if opset >= 11 {
                n.input.get(1).and_then(|s| f.known_ints(s))
            } else {
                attr::ints(n, "pads")
            };
            let axes_given = n.input.get(3).is_some_and(|s| !s.is_empty());
            let s = in_shape(0).map(|s| {
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
            one(shape(in_dt(0), s))
        }
        "Resize" | "Upsample" => {
            let sizes = n.input.get(3).and_then(|s| f.value(s)).map(|v| v.to_vec());
            let s = match sizes {
                Some(v) if !attr::has(n, "axes") => Some(v),
                _ => in_shape(0).map(|s| vec![SymDim::Unknown; s.len()]),
            };
            one(shape(in_dt(0), s))
        }
        "DepthToSpace" | "SpaceToDepth" => {
            let b = attr::int(n, "blocksize").unwrap_or(0);
            let s = in_shape(0).filter(|s| s.len() == 4 && b > 0).map(|s| {
                let k = |d: &SymDim, f: &dyn Fn(i64) -> Option<i64>| {
                    d.known().and_then(f).map_or(SymDim::Unknown, SymDim::Known)
                };
                if op == "DepthToSpace" {
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
            one(shape(in_dt(0), s))
        }
        "Constant" => {
            let Some(a) = n.attribute.first() else {
                return vec![];
            };
            let o = match a.name.as_str() {
                "value" => a.t.as_ref().map(tensor_info).map(|t: TensorInfo| Out {
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
        "EyeLike" => one(shape(
            attr::int(n, "dtype")
                .map(|c| ElemType::from_code(c as i32))
                .or(in_dt(0)),
            in_shape(0),
        )),
        "OneHot" => {
            let depth = n
                .input
                .get(1)
                .and_then(|s| f.value(s))
                .and_then(|v| v.first().cloned());
            let s = in_shape(0).and_then(|mut s| {
                let a = attr::int(n, "axis").unwrap_or(-1);
                let r = s.len() + 1;
                let a = axis(a, r)?;
                s.insert(a, depth.unwrap_or(SymDim::Unknown));
                Some(s)
            });
            one(shape(in_dt(2), s))
        }
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(v: &[i64]) -> Vec<SymDim> {
        v.iter().map(|&x| SymDim::Known(x)).collect()
    }

    #[test]
    fn broadcasting_never_guesses() {
        let b = SymDim::Sym("b".into());
        assert_eq!(
            broadcast(&[&[b.clone(), SymDim::Known(1)], &k(&[4])]),
            vec![b.clone(), SymDim::Known(4)]
        );
        assert_eq!(
            broadcast(&[std::slice::from_ref(&b), &[SymDim::Sym("c".into())]]),
            vec![SymDim::Unknown]
        );
        assert_eq!(broadcast(&[&k(&[3]), &k(&[4])]), vec![SymDim::Unknown]);
        assert_eq!(broadcast(&[&[SymDim::Unknown], &k(&[5])]), k(&[5]));
    }
}
