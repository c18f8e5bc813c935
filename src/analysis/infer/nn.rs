//! Neural-network layers: MatMul (with numpy-style batch broadcasting), Gemm, Conv,
//! ConvTranspose, pooling (windowed and global) and the recurrent layers (RNN, GRU, LSTM).
//!
//! Enters: a [`NodeCx`]. Leaves: `None` for ops of other families, else one [`Out`] per
//! output (MaxPool's second is its int64 Indices). Spatial sizes follow the kernel, stride,
//! dilation, padding and `auto_pad`/`ceil_mode` attributes; a dim that cannot be worked out
//! is unknown.

use super::{one, shape, Answer, NodeCx};
use crate::analysis::facts::{broadcast, Out, SymDim};
use crate::onnx::attr;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// RNN, GRU and LSTM: `Y` is `[seq, directions, batch, hidden]` (`[batch, seq, directions,
/// hidden]` with `layout = 1`), `Y_h` (and LSTM's `Y_c`) `[directions, batch, hidden]`
/// (`[batch, directions, hidden]`), all of X's type.
fn recurrent(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let n = cx.n;
    let dirs = match attr::string(n, "direction").as_deref() {
        Some("bidirectional") => 2,
        _ => 1,
    };
    let hidden = attr::int(n, "hidden_size").map_or(SymDim::Unknown, SymDim::Known);
    let batch_major = attr::int(n, "layout").unwrap_or(0) == 1;
    let x = cx.in_shape(0).filter(|s| s.len() == 3);
    let (seq, batch) = match &x {
        Some(s) if batch_major => (s[1].clone(), s[0].clone()),
        Some(s) => (s[0].clone(), s[1].clone()),
        None => (SymDim::Unknown, SymDim::Unknown),
    };
    let d = SymDim::Known(dirs);
    let y = if batch_major {
        vec![batch.clone(), seq, d.clone(), hidden.clone()]
    } else {
        vec![seq, d.clone(), batch.clone(), hidden.clone()]
    };
    let state = if batch_major {
        vec![batch, d, hidden]
    } else {
        vec![d, batch, hidden]
    };
    let dt = cx.in_dt(0);
    let known = x.is_some();
    let mut v = vec![
        shape(dt, known.then_some(y)),
        shape(dt, known.then(|| state.clone())),
    ];
    if cx.op == "LSTM" {
        v.push(shape(dt, known.then_some(state)));
    }
    v
}

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    let (n, op) = (cx.n, cx.op);
    Some(match op {
        "RNN" | "GRU" | "LSTM" => recurrent(cx),
        "MatMul" => {
            let (Some(a), Some(b)) = (cx.in_shape(0), cx.in_shape(1)) else {
                return Some(one(shape(cx.in_dt(0), None)));
            };
            one(shape(cx.in_dt(0), matmul(&a, &b)))
        }
        "Gemm" => {
            let (Some(a), Some(b)) = (cx.in_shape(0), cx.in_shape(1)) else {
                return Some(one(shape(cx.in_dt(0), None)));
            };
            if a.len() != 2 || b.len() != 2 {
                return Some(one(shape(cx.in_dt(0), None)));
            }
            let ta = attr::int(n, "transA").unwrap_or(0) != 0;
            let tb = attr::int(n, "transB").unwrap_or(0) != 0;
            let m = if ta { a[1].clone() } else { a[0].clone() };
            let nn = if tb { b[0].clone() } else { b[1].clone() };
            one(shape(cx.in_dt(0), Some(vec![m, nn])))
        }
        "Conv" | "MaxPool" | "AveragePool" | "LpPool" => {
            let w = cx.in_shape(1);
            let s = match (cx.in_shape(0), op) {
                // X's rank unknown: a Conv's output still has W's rank and W's output
                // channels (ONNX requires X and W of one rank).
                (None, "Conv") => w.filter(|w| w.len() >= 3).map(|w| {
                    let mut s = vec![SymDim::Unknown, w[0].clone()];
                    s.extend(std::iter::repeat_n(SymDim::Unknown, w.len() - 2));
                    s
                }),
                (x, _) => conv_like(n, op, x, w),
            };
            let mut v = vec![shape(cx.in_dt(0), s.clone())];
            if op == "MaxPool" {
                v.push(shape(Some(ElemType::Int64), s));
            }
            v
        }
        "ConvTranspose" => {
            let (x, w) = (cx.in_shape(0), cx.in_shape(1));
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
            one(shape(cx.in_dt(0), s))
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
            let s = cx.in_shape(0).filter(|s| s.len() >= 2).map(|s| {
                let mut o = s[..2].to_vec();
                o.extend(std::iter::repeat_n(SymDim::Known(1), s.len() - 2));
                o
            });
            one(shape(cx.in_dt(0), s))
        }
        _ => return None,
    })
}

/// MatMul's output shape: rank-1 operands are promoted and the promoted dim dropped again.
fn matmul(a: &[SymDim], b: &[SymDim]) -> Option<Vec<SymDim>> {
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

/// Output shape of Conv and the windowed pools (`x`: input, `w`: Conv's weight).
fn conv_like(
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
                    let out = (num + s - 1).div_euclid(s) + 1;
                    // A last window that would start in the end padding is dropped, as
                    // ONNX Runtime and PyTorch do.
                    if (out - 1) * s >= *v as i128 + pb {
                        out - 1
                    } else {
                        out
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn k(v: &[i64]) -> Vec<SymDim> {
        v.iter().map(|&x| SymDim::Known(x)).collect()
    }

    #[test]
    fn ceil_mode_drops_a_last_window_that_starts_in_the_padding() {
        use crate::fixtures::attr as a;
        // Shapes ONNX Runtime 1.31 produces for MaxPool k=2 s=2 ceil_mode=1 over [1, 1, n].
        for (n, pads, want) in [(4, [0, 1], 2), (5, [0, 1], 3), (6, [1, 1], 4)] {
            let node = NodeProto {
                op_type: "MaxPool".into(),
                attribute: vec![
                    a::ints("kernel_shape", &[2]),
                    a::ints("strides", &[2]),
                    a::ints("pads", &pads),
                    a::int("ceil_mode", 1),
                ],
                ..Default::default()
            };
            let out = conv_like(&node, "MaxPool", Some(k(&[1, 1, n])), None);
            assert_eq!(out, Some(k(&[1, 1, want])), "n = {n}, pads {pads:?}");
        }
    }

    #[test]
    fn lstm_outputs_follow_direction_hidden_size_and_layout() {
        use crate::analysis::shapes::propagate;
        use crate::fixtures::{attr as a, model, GraphBuilder, D};
        use crate::onnx::graph::Graph;
        let mut g = GraphBuilder::new("t");
        g.input(
            "x",
            ElemType::Float32,
            &[D::Fixed(7), "b".into(), D::Fixed(3)],
        )
        .output("y", ElemType::Float32, None);
        g.node("LSTM", &["x", "w", "r"], &["y", "yh", "yc"])
            .attribute
            .extend([
                a::int("hidden_size", 5),
                a::string("direction", "bidirectional"),
            ]);
        let m = model(g.build(), &[("", 17)]);
        let view = Graph::new(m.graph.as_ref().unwrap());
        let f = propagate(&view, &[0], None, 17);
        let dims = |t: &str| f.get(t).and_then(|t| t.shape.clone()).unwrap();
        let b = SymDim::Sym("b".into());
        let y = vec![
            SymDim::Known(7),
            SymDim::Known(2),
            b.clone(),
            SymDim::Known(5),
        ];
        assert_eq!(dims("y"), y);
        assert_eq!(dims("yc"), vec![SymDim::Known(2), b, SymDim::Known(5)]);
        assert_eq!(f.get("yh").unwrap().dtype, Some(ElemType::Float32));
    }

    #[test]
    fn matmul_broadcasts_batch_and_drops_promoted_dims() {
        assert_eq!(matmul(&k(&[2, 3, 4]), &k(&[4, 5])), Some(k(&[2, 3, 5])));
        assert_eq!(matmul(&k(&[4]), &k(&[4, 5])), Some(k(&[5])));
    }
}
