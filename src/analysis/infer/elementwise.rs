//! Element-wise ops: unary maths and activations, normalisations and the other ops whose
//! output is shaped like their first input (Dropout adds its mask), and the broadcasting
//! binary and variadic ops (arithmetic, comparisons, logic, Where).
//!
//! Enters: a [`NodeCx`]. Leaves: `None` for ops of other families, else one [`Out`] per
//! output. Add, Sub, Mul and Div also fold small integer values (shape arithmetic), so a
//! shape computed in the graph stays known; comparisons, Not, And, Or and Xor fold them to
//! bools (0 and 1), so a shape check an exporter wrote as an `If` condition is known too.

use super::{one, same, shape, Answer, NodeCx};
use crate::analysis::facts::{broadcast, Out, SymDim};
use crate::onnx::ElemType;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    Some(match cx.op {
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
        | "Identity" => like_input(cx),
        "IsNaN" | "IsInf" => one(shape(Some(ElemType::Bool), cx.in_shape(0))),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Max" | "Min" | "Sum" | "Mean" | "And"
        | "Or" | "Xor" | "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual"
        | "BitShift" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" | "Where" => broadcasting(cx),
        _ => return None,
    })
}

/// Ops whose (first) output has the type and shape of input 0.
fn like_input(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let Some(t) = cx.inp(0) else { return vec![] };
    let mut o = same(t);
    if cx.op == "Identity" {
        o.value = t.value.clone();
    }
    if cx.op == "Not" && t.dtype == Some(ElemType::Bool) {
        // Tracked bools are 0 and 1 (a folded comparison, a Cast to bool).
        o.value = t.value.as_ref().map(|v| {
            v.iter()
                .map(|d| match d {
                    SymDim::Known(x @ (0 | 1)) => SymDim::Known(1 - x),
                    _ => SymDim::Unknown,
                })
                .collect()
        });
    }
    let mut v = vec![Some(o)];
    if cx.op == "Dropout" {
        // The mask is bool from Dropout-10 on; before, it has the type of the data.
        let mask = if cx.opset >= 10 {
            Some(ElemType::Bool)
        } else {
            t.dtype
        };
        v.push(shape(mask, t.shape.clone()));
    }
    v
}

/// Multidirectional broadcasting over every input; comparisons give bool, Where takes the
/// type of its X.
fn broadcasting(cx: &NodeCx<'_>) -> Vec<Option<Out>> {
    let (n, op) = (cx.n, cx.op);
    let shapes: Option<Vec<Vec<SymDim>>> = (0..n.input.len()).map(|i| cx.in_shape(i)).collect();
    let dt = match op {
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => Some(ElemType::Bool),
        "Where" => cx.in_dt(1),
        _ => cx.in_dt(0),
    };
    let s = shapes.map(|s| broadcast(&s.iter().map(|v| v.as_slice()).collect::<Vec<_>>()));
    let value = match (
        op,
        cx.inp(0).and_then(|t| t.value.as_ref()),
        cx.inp(1).and_then(|t| t.value.as_ref()),
    ) {
        (
            "Add" | "Sub" | "Mul" | "Div" | "Equal" | "Less" | "Greater" | "LessOrEqual"
            | "GreaterOrEqual" | "And" | "Or" | "Xor",
            Some(a),
            Some(b),
        ) if n.input.len() == 2 && !a.is_empty() && !b.is_empty() => {
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

/// One element of integer shape arithmetic, or of a comparison or logic op on tracked
/// values (bools as 0 and 1); unknown unless it is sure. Two equal symbols are not taken
/// to be equal numbers: ONNX Runtime does not check that inputs sharing a dimension name
/// agree, and a folded condition must hold for every input it accepts.
fn arith(op: &str, a: &SymDim, b: &SymDim) -> SymDim {
    use SymDim::*;
    let truth = |c: bool| Known(i64::from(c));
    match (op, a, b) {
        ("Equal", Known(x), Known(y)) => truth(x == y),
        ("Less", Known(x), Known(y)) => truth(x < y),
        ("Greater", Known(x), Known(y)) => truth(x > y),
        ("LessOrEqual", Known(x), Known(y)) => truth(x <= y),
        ("GreaterOrEqual", Known(x), Known(y)) => truth(x >= y),
        ("And", Known(x @ (0 | 1)), Known(y @ (0 | 1))) => truth(*x == 1 && *y == 1),
        ("Or", Known(x @ (0 | 1)), Known(y @ (0 | 1))) => truth(*x == 1 || *y == 1),
        ("Xor", Known(x @ (0 | 1)), Known(y @ (0 | 1))) => truth(x != y),
        (
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor",
            _,
            _,
        ) => Unknown,
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

    #[test]
    fn comparisons_and_logic_fold_known_values_only() {
        let b = SymDim::Sym("b".into());
        assert_eq!(
            arith("Equal", &SymDim::Known(2), &SymDim::Known(2)),
            SymDim::Known(1)
        );
        assert_eq!(
            arith("Less", &SymDim::Known(2), &SymDim::Known(1)),
            SymDim::Known(0)
        );
        assert_eq!(
            arith("And", &SymDim::Known(1), &SymDim::Known(0)),
            SymDim::Known(0)
        );
        assert_eq!(
            arith("Or", &SymDim::Known(1), &SymDim::Known(0)),
            SymDim::Known(1)
        );
        // Two equal names are not taken as equal numbers; bools are 0 and 1 only.
        assert_eq!(arith("Equal", &b, &b), SymDim::Unknown);
        assert_eq!(
            arith("And", &SymDim::Known(2), &SymDim::Known(1)),
            SymDim::Unknown
        );
    }
}
