//! Neural-network layers: MatMul (with numpy-style batch broadcasting), Gemm, Conv,
//! ConvTranspose and pooling (windowed and global).
//!
//! Enters: a [`NodeCx`]. Leaves: `None` for ops of other families, else one [`Out`] per
//! output (MaxPool's second is its int64 Indices). Spatial sizes follow the kernel, stride,
//! dilation, padding and `auto_pad`/`ceil_mode` attributes; a dim that cannot be worked out
//! is unknown.

use super::{one, shape, Answer, NodeCx};
use crate::analysis::facts::{broadcast, SymDim};
use crate::onnx::attr;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    let (n, op) = (cx.n, cx.op);
    Some(match op {
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
            let s = conv_like(n, op, cx.in_shape(0), cx.in_shape(1));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn k(v: &[i64]) -> Vec<SymDim> {
        v.iter().map(|&x| SymDim::Known(x)).collect()
    }

    #[test]
    fn matmul_broadcasts_batch_and_drops_promoted_dims() {
        assert_eq!(matmul(&k(&[2, 3, 4]), &k(&[4, 5])), Some(k(&[2, 3, 5])));
        assert_eq!(matmul(&k(&[4]), &k(&[4, 5])), Some(k(&[5])));
    }
}
