//! Comparison: an artifact's outputs against the reference's, element by element. Floats
//! pass within the tolerance (float16/bfloat16, and float32/float64 made by a Cast of them,
//! also within steps of their type at the output's scale); integers, bools and strings must
//! be equal; sequences compare item by item, maps key by key.
//!
//! Enters: two [`Out`]s (or flattened floats) and a [`Tolerance`]. Leaves: an
//! [`OutputError`] per output (what the record's validation report holds).

use super::values::{Data, Out};
use super::{OutputError, Tolerance};
use crate::spec::DYNAMIC_INT8;

/// Stands for an unbounded error (NaN against a number, zero reference, shape mismatch).
/// JSON has no infinity (serde_json writes `null`, which would not read back into the
/// record), so the largest finite value is used.
pub const UNBOUNDED: f64 = f64::MAX;

/// Compares two flattened float32 outputs ([`compare_as`]).
#[cfg(test)]
pub fn compare(name: &str, reference: &[f64], got: &[f64], tol: Tolerance) -> OutputError {
    compare_as(name, "float32", reference, got, tol)
}

/// Root mean square of the finite values: an output's scale, at which float16/bfloat16 steps
/// are taken for its elements nearer zero (0 for none).
pub fn rms(values: &[f64]) -> f64 {
    let (sum, n) = values
        .iter()
        .filter(|v| v.is_finite())
        .fold((0.0, 0usize), |(s, n), v| (s + v * v, n + 1));
    if n == 0 {
        0.0
    } else {
        (sum / n as f64).sqrt()
    }
}

/// One step of an `elem` output's resolution at the element `r`, for `max_ulps`: its float
/// type's spacing at max(|r|, `scale`), or for [`DYNAMIC_INT8`] `scale` itself (the int8 step).
fn step_at(elem: &str, r: f64, scale: f64) -> Option<f64> {
    if elem == DYNAMIC_INT8 {
        Some(scale)
    } else {
        crate::spec::float_step(elem, r.abs().max(scale))
    }
}

/// One int8 step of an output's range: (max − min) / 255 of its finite values (0 for none).
pub fn int8_step(values: &[f64]) -> f64 {
    let (lo, hi) = values
        .iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if hi >= lo {
        (hi - lo) / 255.0
    } else {
        0.0
    }
}

/// Compares two flattened outputs of element type `elem` (`float16`, `float32`, …): an
/// element passes within [`Tolerance::half_bound`], which is `atol + rtol·|ref|` except for
/// float16/bfloat16, whose elements also pass within `tol.ulps` steps of their type at the
/// output's scale. Records the largest error in those steps (`max_ulps`) for every float type.
pub fn compare_as(
    name: &str,
    elem: &str,
    reference: &[f64],
    got: &[f64],
    tol: Tolerance,
) -> OutputError {
    let mut e = OutputError {
        name: name.into(),
        elements: reference.len(),
        max_abs: 0.0,
        max_rel: 0.0,
        mismatched: 0,
        passed: true,
        non_finite: reference.iter().filter(|r| !r.is_finite()).count(),
        dtype: Some(elem.to_string()),
        rule: Some(tol.rule(elem)),
        max_ulps: step_at(elem, 1.0, 1.0).map(|_| 0.0),
    };
    let worst = |e: &mut OutputError| {
        e.max_abs = UNBOUNDED;
        e.max_rel = UNBOUNDED;
        if let Some(u) = e.max_ulps.as_mut() {
            *u = UNBOUNDED;
        }
    };
    if reference.len() != got.len() {
        e.mismatched = reference.len().max(got.len());
        worst(&mut e);
        e.passed = false;
        return e;
    }
    let scale = if elem == DYNAMIC_INT8 {
        int8_step(reference)
    } else {
        rms(reference)
    };
    for (&r, &g) in reference.iter().zip(got) {
        if r.is_nan() && g.is_nan() || r == g {
            continue;
        }
        if !r.is_finite() || !g.is_finite() {
            // NaN or infinity on one side only (or infinities of opposite sign).
            worst(&mut e);
            e.mismatched += 1;
            continue;
        }
        let d = (r - g).abs();
        let rel = if r != 0.0 { d / r.abs() } else { UNBOUNDED };
        e.max_abs = e.max_abs.max(d);
        e.max_rel = e.max_rel.max(rel);
        if let (Some(u), Some(step)) = (e.max_ulps.as_mut(), step_at(elem, r, scale)) {
            if step > 0.0 {
                *u = u.max(d / step);
            }
        }
        // A NaN bound (a library caller's NaN tolerance) passes nothing.
        let bound = tol.half_bound(elem, r, scale);
        if bound.is_nan() || d > bound {
            e.mismatched += 1;
        }
    }
    e.passed = e.mismatched == 0;
    e
}

/// What a person is told when a reference output holds NaN or infinity: those elements pass
/// when the artifact gives the same value, which proves little about them.
pub fn non_finite_warning(e: &OutputError) -> String {
    format!(
        "the reference output `{}` has {} NaN or infinite values of {}: validation only checks that the artifact gives the same there (an overflow in the model or its validation inputs?)",
        e.name, e.non_finite, e.elements
    )
}

/// Running totals of one output's comparison, and the half type whose resolution its float32
/// and float64 values have (a Cast of a float16/bfloat16 tensor), if any.
struct Acc(OutputError, Option<String>);

impl Acc {
    fn all_wrong(&mut self, n: usize) {
        self.0.elements += n;
        self.0.mismatched += n.max(1);
        self.0.max_abs = UNBOUNDED;
        self.0.max_rel = UNBOUNDED;
    }

    /// The first tensor's element type and rule name the output's.
    fn typed(&mut self, ty: &str, rule: impl FnOnce() -> String) {
        if self.0.dtype.is_none() {
            self.0.dtype = Some(ty.to_string());
            self.0.rule = Some(rule());
        }
    }

    /// The type whose rule `ty`'s float values are held to.
    fn rule_type<'a>(&'a self, ty: &'a str) -> &'a str {
        match (&self.1, ty) {
            (Some(half), "float32" | "float64") => half,
            _ => ty,
        }
    }

    fn add(&mut self, r: &Out, g: &Out, tol: Tolerance) {
        if let Out::Tensor { ty, data, .. } = r {
            match data {
                Data::Float(_) => {
                    let elem = self.rule_type(ty).to_string();
                    let cast = if crate::spec::is_half(&elem) && elem != *ty {
                        format!(" (a Cast of {elem})")
                    } else {
                        String::new()
                    };
                    self.typed(ty, || format!("{}{cast}", tol.rule(&elem)))
                }
                _ => self.typed(ty, || "exact".into()),
            }
        }
        match (r, g) {
            (
                Out::Tensor {
                    ty,
                    shape: rs,
                    data: rd,
                    ..
                },
                Out::Tensor {
                    shape: gs,
                    data: gd,
                    ..
                },
            ) if rs == gs => match (rd, gd) {
                (Data::Float(a), Data::Float(b)) => {
                    let e = compare_as(&self.0.name, self.rule_type(ty), a, b, tol);
                    self.0.elements += e.elements;
                    self.0.mismatched += e.mismatched;
                    self.0.max_abs = self.0.max_abs.max(e.max_abs);
                    self.0.max_rel = self.0.max_rel.max(e.max_rel);
                    if let Some(u) = e.max_ulps {
                        self.0.max_ulps = Some(self.0.max_ulps.unwrap_or(0.0).max(u));
                    }
                }
                (Data::Exact(a), Data::Exact(b)) if a.len() == b.len() => {
                    self.0.elements += a.len();
                    for (x, y) in a.iter().zip(b) {
                        if x != y {
                            self.0.mismatched += 1;
                            let d = (x - y).unsigned_abs() as f64;
                            self.0.max_abs = self.0.max_abs.max(d);
                            let rel = if *x != 0 {
                                d / (x.unsigned_abs() as f64)
                            } else {
                                UNBOUNDED
                            };
                            self.0.max_rel = self.0.max_rel.max(rel);
                        }
                    }
                }
                (Data::Str(a), Data::Str(b)) if a.len() == b.len() => {
                    self.0.elements += a.len();
                    let wrong = a.iter().zip(b).filter(|(x, y)| x != y).count();
                    if wrong > 0 {
                        self.0.mismatched += wrong;
                        self.0.max_abs = UNBOUNDED;
                        self.0.max_rel = UNBOUNDED;
                    }
                }
                _ => self.all_wrong(len(r)),
            },
            (Out::Seq(a), Out::Seq(b)) if a.len() == b.len() => {
                for (x, y) in a.iter().zip(b) {
                    self.add(x, y, tol);
                }
            }
            (Out::Map(a), Out::Map(b))
                if a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0) =>
            {
                for (x, y) in a.iter().zip(b) {
                    self.add(&x.1, &y.1, tol);
                }
            }
            _ => self.all_wrong(len(r)),
        }
    }
}

fn len(o: &Out) -> usize {
    match o {
        Out::Tensor { data, .. } => match data {
            Data::Float(v) => v.len(),
            Data::Exact(v) => v.len(),
            Data::Str(v) => v.len(),
        },
        Out::Seq(v) => v.iter().map(len).sum(),
        Out::Map(v) => v.len(),
    }
}

/// Compares an output with the reference's: floats within `tol`, integers, bools and strings
/// exactly, sequences item by item, maps key by key (the keys must agree).
#[cfg(test)]
pub fn compare_out(name: &str, reference: &Out, got: &Out, tol: Tolerance) -> OutputError {
    compare_out_at(name, reference, got, tol, None)
}

/// [`compare_out`], with float32/float64 values held to the rule of `half` (`float16` or
/// `bfloat16`) when the graph makes the output by a Cast from that type.
pub fn compare_out_at(
    name: &str,
    reference: &Out,
    got: &Out,
    tol: Tolerance,
    half: Option<&str>,
) -> OutputError {
    let mut acc = Acc(
        OutputError {
            name: name.into(),
            elements: 0,
            max_abs: 0.0,
            max_rel: 0.0,
            mismatched: 0,
            passed: true,
            non_finite: non_finite(reference),
            dtype: None,
            rule: None,
            max_ulps: None,
        },
        half.map(str::to_string),
    );
    acc.add(reference, got, tol);
    acc.0.passed = acc.0.mismatched == 0;
    acc.0
}

/// Float elements of an output that are NaN or infinite.
fn non_finite(o: &Out) -> usize {
    match o {
        Out::Tensor {
            data: Data::Float(v),
            ..
        } => v.iter().filter(|x| !x.is_finite()).count(),
        Out::Tensor { .. } => 0,
        Out::Seq(v) => v.iter().map(non_finite).sum(),
        Out::Map(v) => v.iter().map(|(_, o)| non_finite(o)).sum(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::builder::validate::ValidationReport;
    use crate::plan::Precision;

    #[test]
    fn compare_counts_elements_outside_both_tolerances() {
        let tol = Tolerance {
            atol: 1e-3,
            rtol: 1e-2,
            ulps: None,
        };
        let e = compare("y", &[1.0, 100.0, 0.0], &[1.0005, 100.5, 0.0], tol);
        assert!(e.passed, "{e:?}");
        let e = compare("y", &[1.0, 0.0], &[1.1, 0.5], tol);
        assert_eq!(e.mismatched, 2);
        assert!(!e.passed);
        assert!((e.max_abs - 0.5).abs() < 1e-12);
        let e = compare("y", &[1.0], &[1.0, 2.0], tol);
        assert!(!e.passed);
        let e = compare("y", &[f64::NAN], &[f64::NAN], tol);
        assert!(e.passed);
        let e = compare("y", &[1.0], &[f64::NAN], tol);
        assert!(!e.passed);
        let e = compare("y", &[f64::INFINITY], &[1.0], tol);
        assert!(!e.passed);
        let e = compare("y", &[f64::INFINITY], &[f64::INFINITY], tol);
        assert!(e.passed);
        // Passing on non-finite references is counted, so it can be warned about.
        assert_eq!(e.non_finite, 1);
        let e = compare(
            "y",
            &[f64::NAN, 1.0, f64::NEG_INFINITY],
            &[f64::NAN, 1.0, f64::NEG_INFINITY],
            tol,
        );
        assert!(e.passed && e.non_finite == 2, "{e:?}");
        assert!(non_finite_warning(&e).contains("2 NaN or infinite values of 3"));
        assert_eq!(compare("y", &[1.0], &[1.0], tol).non_finite, 0);
    }

    #[test]
    fn float16_outputs_pass_within_steps_at_their_scale_and_float32_as_before() {
        let tol = Tolerance::default_for(Precision::Fp32);
        let step = |v: f64| crate::spec::float_step("float16", v).unwrap();
        // Values of scale ~3: one step of [2, 4) on a large element and on one near zero.
        let r = [3.0, -2.5, 0.01, 2.75];
        let g = [3.0 + step(3.0), -2.5, 0.01 + step(3.0), 2.75];
        let e = compare_as("y", "float16", &r, &g, tol);
        assert!(e.passed, "{e:?}");
        assert_eq!(e.max_ulps, Some(1.0));
        assert_eq!(e.dtype.as_deref(), Some("float16"));
        assert!(e.rule.as_deref().unwrap().contains("8 float16 steps"));
        // The same values as float32 outputs: the near-zero element misses allclose.
        let e = compare_as("y", "float32", &r, &g, tol);
        assert!(!e.passed && e.mismatched == 1, "{e:?}");
        assert_eq!(e.rule.as_deref(), Some("atol + rtol·|ref|"));
        // Nine steps, or a bias of 0.1 dropped, are over.
        let five = [3.0 + 9.0 * step(3.0), -2.5, 0.01, 2.75];
        assert!(!compare_as("y", "float16", &r, &five, tol).passed);
        let biased: Vec<f64> = r.iter().map(|v| v - 0.1).collect();
        let e = compare_as("y", "float16", &r, &biased, tol);
        assert!(!e.passed && e.mismatched == 4, "{e:?}");
        // bfloat16's step is 8 times float16's: 16 float16 steps are 2 of bfloat16.
        let g = [3.0 + 16.0 * step(3.0), -2.5, 0.01, 2.75];
        assert!(compare_as("y", "bfloat16", &r, &g, tol).passed);
        assert!(!compare_as("y", "float16", &r, &g, tol).passed);
        // `ulps = 0` is allclose alone.
        let strict = Tolerance {
            ulps: Some(0.0),
            ..tol
        };
        let g = [3.0, -2.5, 0.01 + step(3.0), 2.75];
        assert!(!compare_as("y", "float16", &r, &g, strict).passed);
        // Non-finite and length mismatches stay unbounded, in steps too.
        let e = compare_as("y", "float16", &[1.0], &[f64::NAN], tol);
        assert!(!e.passed && e.max_ulps == Some(UNBOUNDED));
    }

    #[test]
    fn unbounded_errors_survive_a_json_round_trip() {
        let tol = Tolerance::default_for(Precision::Fp32);
        // Zero reference, NaN and infinity against numbers.
        let e = compare("y", &[0.0, 1.0, 2.0], &[0.5, f64::NAN, f64::INFINITY], tol);
        assert_eq!(e.mismatched, 3);
        assert_eq!(e.max_rel, UNBOUNDED);
        assert_eq!(e.max_abs, UNBOUNDED);
        let v = ValidationReport {
            passed: false,
            tolerance: tol,
            seed: 1,
            golden: None,
            shapes: BTreeMap::new(),
            outputs: vec![e, compare("z", &[1.0], &[1.0, 2.0], tol)],
            opt_level: None,
            rejected: Vec::new(),
            threads: None,
            prepack: None,
            rewrites: Vec::new(),
            reference: None,
            also_at: None,
        };
        let back: ValidationReport =
            serde_json::from_slice(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(back, v);
    }

    fn t(data: Data, shape: &[i64]) -> Out {
        Out::Tensor {
            ty: "x".into(),
            shape: shape.to_vec(),
            data,
        }
    }

    #[test]
    fn exact_types_compare_exactly_and_maps_key_by_key() {
        let tol = Tolerance {
            atol: 1.0,
            rtol: 1.0,
            ulps: None,
        };
        let e = compare_out(
            "y",
            &t(Data::Exact(vec![1, 2]), &[2]),
            &t(Data::Exact(vec![1, 3]), &[2]),
            tol,
        );
        assert!(
            !e.passed,
            "integers within the float tolerance still differ: {e:?}"
        );
        assert_eq!(e.mismatched, 1);
        let s = |v: &[&str]| {
            t(
                Data::Str(v.iter().map(|x| x.to_string()).collect()),
                &[v.len() as i64],
            )
        };
        assert!(compare_out("y", &s(&["a", "b"]), &s(&["a", "b"]), tol).passed);
        assert!(!compare_out("y", &s(&["a", "b"]), &s(&["a", "c"]), tol).passed);
        let f = |x: f64| t(Data::Float(vec![x]), &[]);
        let m = |k: &[&str], v: &[f64]| {
            Out::Map(
                k.iter()
                    .zip(v)
                    .map(|(k, v)| (k.to_string(), f(*v)))
                    .collect(),
            )
        };
        let tol = Tolerance {
            atol: 1e-4,
            rtol: 1e-3,
            ulps: None,
        };
        let a = Out::Seq(vec![m(&["0", "1"], &[0.25, 0.75])]);
        assert!(compare_out("p", &a, &Out::Seq(vec![m(&["0", "1"], &[0.25, 0.75])]), tol).passed);
        assert!(!compare_out("p", &a, &Out::Seq(vec![m(&["0", "1"], &[0.25, 0.8])]), tol).passed);
        assert!(!compare_out("p", &a, &Out::Seq(vec![m(&["0", "2"], &[0.25, 0.75])]), tol).passed);
        assert!(!compare_out("p", &a, &Out::Seq(vec![]), tol).passed);
        let nan = Out::Seq(vec![m(&["0", "1"], &[f64::NAN, 0.5])]);
        let e = compare_out("p", &nan, &nan.clone(), tol);
        assert!(e.passed && e.non_finite == 1, "{e:?}");
        // Shapes must agree even when the values do.
        assert!(
            !compare_out(
                "y",
                &t(Data::Float(vec![1.0, 2.0]), &[2]),
                &t(Data::Float(vec![1.0, 2.0]), &[1, 2]),
                tol
            )
            .passed
        );
    }
}
