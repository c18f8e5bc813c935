//! Validation: the artifact and the original model (ONNX Runtime CPU, optimizations
//! disabled) run on the same seeded random inputs; per output, the max abs and rel error are
//! recorded against tolerances that depend on the precision.
//!
//! Enters: a session on the artifact, the original model path, the profile and
//! [`ValidationConfig`]. Leaves: a [`Validation`] (stored in the record; `passed == false`
//! means the artifact is never served) or an error when the model cannot be run at all.
//!
//! Input shapes: the profile's opt shape when it names the input, else the model's fixed
//! dims with 1 for every dynamic dim. Floats are uniform in [-1, 1), integers uniform in
//! `int_range` (default [0, 2), safe for ids, masks and indices), bools fair coins.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ort::session::Session;
use ort::value::{DynValue, Tensor, TensorElementType, ValueType};

use super::{BuildError, Runtime};
use crate::plan::{Precision, ShapeProfile};
use crate::rng::SplitMix64;

pub use crate::cache::{OutputError, Validation};
/// Allowed error per element: the sidecar's tolerance type (`atol + rtol·|reference|`).
pub use crate::spec::Tolerance;

/// How to validate.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ValidationConfig {
    pub seed: u64,
    /// Integer inputs are drawn from `[lo, hi)`.
    pub int_range: (i64, i64),
    /// Overrides the precision's default tolerance.
    pub tolerance: Option<Tolerance>,
    /// Golden inputs (`.npz`, one array per input name) instead of random ones.
    pub golden: Option<PathBuf>,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            // The sidecar's defaults (`plan::GoldenSettings`), so the library and the CLI
            // validate on the same inputs.
            seed: 0,
            int_range: (0, 2),
            tolerance: None,
            golden: None,
        }
    }
}

/// Named input values, in the session's input order.
pub type Inputs = Vec<(String, DynValue)>;
/// Input name → concrete shape.
pub type Shapes = BTreeMap<String, Vec<i64>>;
/// Output name, shape and values as f64.
type Flat = Vec<(String, Vec<i64>, Vec<f64>)>;

fn concrete_shape(name: &str, shape: &[i64], profile: Option<&ShapeProfile>) -> Vec<i64> {
    if let Some(dims) = profile.and_then(|p| p.opt.get(name)) {
        return dims.clone();
    }
    shape.iter().map(|&d| if d > 0 { d } else { 1 }).collect()
}

fn bad(path: &Path, what: String) -> BuildError {
    BuildError::Validation(format!("{}: {what}", path.display()))
}

/// Makes one seeded input per model input.
pub fn make_inputs(
    session: &Session,
    model: &Path,
    profile: Option<&ShapeProfile>,
    cfg: &ValidationConfig,
) -> Result<(Inputs, Shapes), BuildError> {
    let mut rng = SplitMix64(cfg.seed);
    let mut values = Vec::new();
    let mut shapes = BTreeMap::new();
    let golden = match &cfg.golden {
        Some(p) => Some((p, super::golden::read_npz(p)?)),
        None => None,
    };
    for input in session.inputs() {
        let name = input.name().to_string();
        let ValueType::Tensor { ty, shape, .. } = input.dtype() else {
            return Err(bad(model, format!("input `{name}` is not a tensor")));
        };
        if let Some((gpath, arrays)) = &golden {
            let a = arrays.get(&name).ok_or_else(|| {
                bad(
                    gpath,
                    format!("has no array named `{name}` (the model's input)"),
                )
            })?;
            let v = golden_value(a, *ty).map_err(|w| bad(gpath, format!("`{name}`: {w}")))?;
            shapes.insert(name.clone(), a.shape.clone());
            values.push((name, v));
            continue;
        }
        let dims = concrete_shape(&name, shape, profile);
        let n: usize = dims.iter().map(|&d| d.max(0) as usize).product();
        let (lo, hi) = cfg.int_range;
        let shp = dims.clone();
        let err = |e: ort::Error| bad(model, format!("input `{name}`: {e}"));
        let v: DynValue = match ty {
            TensorElementType::Float32 => Tensor::from_array((
                shp,
                (0..n)
                    .map(|_| (rng.unit() * 2.0 - 1.0) as f32)
                    .collect::<Vec<_>>(),
            ))
            .map_err(err)?
            .into_dyn(),
            TensorElementType::Float64 => Tensor::from_array((
                shp,
                (0..n).map(|_| rng.unit() * 2.0 - 1.0).collect::<Vec<_>>(),
            ))
            .map_err(err)?
            .into_dyn(),
            TensorElementType::Int64 => {
                Tensor::from_array((shp, (0..n).map(|_| rng.int(lo, hi)).collect::<Vec<_>>()))
                    .map_err(err)?
                    .into_dyn()
            }
            TensorElementType::Int32 => Tensor::from_array((
                shp,
                (0..n).map(|_| rng.int(lo, hi) as i32).collect::<Vec<_>>(),
            ))
            .map_err(err)?
            .into_dyn(),
            TensorElementType::Int8 => Tensor::from_array((
                shp,
                (0..n).map(|_| rng.int(lo, hi) as i8).collect::<Vec<_>>(),
            ))
            .map_err(err)?
            .into_dyn(),
            TensorElementType::Uint8 => Tensor::from_array((
                shp,
                (0..n).map(|_| rng.int(lo, hi) as u8).collect::<Vec<_>>(),
            ))
            .map_err(err)?
            .into_dyn(),
            TensorElementType::Bool => {
                Tensor::from_array((shp, (0..n).map(|_| rng.next() & 1 == 1).collect::<Vec<_>>()))
                    .map_err(err)?
                    .into_dyn()
            }
            other => {
                return Err(bad(
                    model,
                    format!(
                        "input `{name}`: element type {other:?} is not supported by validation yet"
                    ),
                ))
            }
        };
        shapes.insert(name.clone(), dims);
        values.push((name, v));
    }
    Ok((values, shapes))
}

/// A tensor from a golden array; its dtype must be the input's.
fn golden_value(a: &super::golden::GoldenArray, ty: TensorElementType) -> Result<DynValue, String> {
    use super::golden::GoldenData as G;
    let shape = a.shape.clone();
    let e = |e: ort::Error| e.to_string();
    Ok(match (&a.data, ty) {
        (G::F32(d), TensorElementType::Float32) => Tensor::from_array((shape, d.clone()))
            .map_err(e)?
            .into_dyn(),
        (G::F64(d), TensorElementType::Float64) => Tensor::from_array((shape, d.clone()))
            .map_err(e)?
            .into_dyn(),
        (G::I64(d), TensorElementType::Int64) => Tensor::from_array((shape, d.clone()))
            .map_err(e)?
            .into_dyn(),
        (G::I32(d), TensorElementType::Int32) => Tensor::from_array((shape, d.clone()))
            .map_err(e)?
            .into_dyn(),
        (G::I8(d), TensorElementType::Int8) => Tensor::from_array((shape, d.clone()))
            .map_err(e)?
            .into_dyn(),
        (G::U8(d), TensorElementType::Uint8) => Tensor::from_array((shape, d.clone()))
            .map_err(e)?
            .into_dyn(),
        (G::Bool(d), TensorElementType::Bool) => Tensor::from_array((shape, d.clone()))
            .map_err(e)?
            .into_dyn(),
        (d, t) => {
            let have = match d {
                G::F32(_) => "float32",
                G::F64(_) => "float64",
                G::I64(_) => "int64",
                G::I32(_) => "int32",
                G::I8(_) => "int8",
                G::U8(_) => "uint8",
                G::Bool(_) => "bool",
            };
            return Err(format!("array is {have}, the model input is {t:?}"));
        }
    })
}

/// Flattens an output tensor to f64 with its shape.
fn to_f64(v: &DynValue, name: &str, path: &Path) -> Result<(Vec<i64>, Vec<f64>), BuildError> {
    let ValueType::Tensor { ty, .. } = v.dtype() else {
        return Err(bad(path, format!("output `{name}` is not a tensor")));
    };
    let err = |e: ort::Error| bad(path, format!("output `{name}`: {e}"));
    macro_rules! ext {
        ($t:ty) => {{
            let (s, d) = v.try_extract_tensor::<$t>().map_err(err)?;
            (s.to_vec(), d.iter().map(|x| *x as f64).collect())
        }};
    }
    Ok(match ty {
        TensorElementType::Float32 => ext!(f32),
        TensorElementType::Float64 => ext!(f64),
        TensorElementType::Int64 => ext!(i64),
        TensorElementType::Int32 => ext!(i32),
        TensorElementType::Int8 => ext!(i8),
        TensorElementType::Uint8 => ext!(u8),
        TensorElementType::Bool => {
            let (s, d) = v.try_extract_tensor::<bool>().map_err(err)?;
            (s.to_vec(), d.iter().map(|&x| x as u8 as f64).collect())
        }
        other => {
            return Err(bad(
                path,
                format!(
                    "output `{name}`: element type {other:?} is not supported by validation yet"
                ),
            ))
        }
    })
}

/// Runs `session` on `inputs` and returns every output flattened, by name.
fn run(
    session: &mut Session,
    inputs: &[(String, DynValue)],
    path: &Path,
) -> Result<Flat, BuildError> {
    let feed: Vec<(&str, &DynValue)> = inputs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let names: Vec<String> = session
        .outputs()
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    let out = session
        .run(feed)
        .map_err(|e| BuildError::ort("run", path, e))?;
    let mut res = Vec::new();
    for name in names {
        let v = out
            .get(name.as_str())
            .ok_or_else(|| bad(path, format!("output `{name}` missing from the run")))?;
        let (shape, data) = to_f64(v, &name, path)?;
        res.push((name, shape, data));
    }
    Ok(res)
}

/// Stands for an unbounded error (NaN against a number, zero reference, shape mismatch).
/// JSON has no infinity (serde_json writes `null`, which would not read back into the
/// record), so the largest finite value is used.
pub const UNBOUNDED: f64 = f64::MAX;

/// Compares two flattened outputs.
pub fn compare(name: &str, reference: &[f64], got: &[f64], tol: Tolerance) -> OutputError {
    let mut e = OutputError {
        name: name.into(),
        elements: reference.len(),
        max_abs: 0.0,
        max_rel: 0.0,
        mismatched: 0,
        passed: true,
    };
    if reference.len() != got.len() {
        e.mismatched = reference.len().max(got.len());
        e.max_abs = UNBOUNDED;
        e.max_rel = UNBOUNDED;
        e.passed = false;
        return e;
    }
    for (&r, &g) in reference.iter().zip(got) {
        if r.is_nan() && g.is_nan() || r == g {
            continue;
        }
        if !r.is_finite() || !g.is_finite() {
            // NaN or infinity on one side only (or infinities of opposite sign).
            e.max_abs = UNBOUNDED;
            e.max_rel = UNBOUNDED;
            e.mismatched += 1;
            continue;
        }
        let d = (r - g).abs();
        let rel = if r != 0.0 { d / r.abs() } else { UNBOUNDED };
        e.max_abs = e.max_abs.max(d);
        e.max_rel = e.max_rel.max(rel);
        // A NaN bound (a library caller's NaN tolerance) passes nothing.
        let bound = tol.atol + tol.rtol * r.abs();
        if bound.is_nan() || d > bound {
            e.mismatched += 1;
        }
    }
    e.passed = e.mismatched == 0;
    e
}

/// Validates `candidate` (a session on the artifact) against `model` run on ORT CPU with
/// optimizations disabled.
#[tracing::instrument(skip_all, fields(model = %model.display()))]
pub fn validate(
    rt: &Runtime,
    model: &Path,
    candidate: &mut Session,
    profile: Option<&ShapeProfile>,
    precision: Precision,
    cfg: &ValidationConfig,
    threads: usize,
) -> Result<Validation, BuildError> {
    let mut reference = super::cpu::open_raw(
        rt,
        model,
        ort::session::builder::GraphOptimizationLevel::Disable,
        threads,
    )?;
    let (inputs, shapes) = make_inputs(&reference, model, profile, cfg)?;
    let want = run(&mut reference, &inputs, model)?;
    let got = run(candidate, &inputs, model)?;
    let tol = cfg
        .tolerance
        .unwrap_or_else(|| Tolerance::default_for(precision));
    let mut outputs = Vec::new();
    for (name, shape, data) in &want {
        let e = match got.iter().find(|(n, _, _)| n == name) {
            Some((_, gshape, gdata)) if gshape == shape => compare(name, data, gdata, tol),
            Some(_) | None => OutputError {
                name: name.clone(),
                elements: data.len(),
                max_abs: UNBOUNDED,
                max_rel: UNBOUNDED,
                mismatched: data.len(),
                passed: false,
            },
        };
        tracing::debug!(output = %name, max_abs = e.max_abs, max_rel = e.max_rel, passed = e.passed, "validated output");
        outputs.push(e);
    }
    Ok(Validation {
        passed: outputs.iter().all(|o| o.passed),
        tolerance: tol,
        seed: cfg.seed,
        golden: cfg.golden.as_ref().map(|p| p.display().to_string()),
        shapes,
        outputs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_counts_elements_outside_both_tolerances() {
        let tol = Tolerance {
            atol: 1e-3,
            rtol: 1e-2,
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
    }

    #[test]
    fn unbounded_errors_survive_a_json_round_trip() {
        let tol = Tolerance::default_for(Precision::Fp32);
        // Zero reference, NaN and infinity against numbers.
        let e = compare("y", &[0.0, 1.0, 2.0], &[0.5, f64::NAN, f64::INFINITY], tol);
        assert_eq!(e.mismatched, 3);
        assert_eq!(e.max_rel, UNBOUNDED);
        assert_eq!(e.max_abs, UNBOUNDED);
        let v = Validation {
            passed: false,
            tolerance: tol,
            seed: 1,
            golden: None,
            shapes: BTreeMap::new(),
            outputs: vec![e, compare("z", &[1.0], &[1.0, 2.0], tol)],
        };
        let back: Validation = serde_json::from_slice(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn shapes_use_profile_then_fixed_then_one() {
        let mut p = ShapeProfile::default();
        p.opt.insert("x".into(), vec![2, 8, 64]);
        assert_eq!(concrete_shape("x", &[-1, -1, 64], Some(&p)), vec![2, 8, 64]);
        assert_eq!(concrete_shape("z", &[-1, 3, 64], Some(&p)), vec![1, 3, 64]);
    }
}
