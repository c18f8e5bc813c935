//! Shape specs and profile validation against the model's inputs: trtexec-syntax parsing
//! ([`parse_shapes`]), the model's dynamic-input signature ([`ModelInputs`]), the checks of
//! [`validate_profile`] and the first shapes validation tries ([`concrete_shapes`]).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Bound, PlanError, ShapeProfile};
use crate::onnx::facts::{elem_type_of, shape_of, Dim};
use crate::onnx::{Graph, Model};

/// Parses trtexec's shape syntax: `name:1x3x224x224,other:1x128` (a scalar is `name:`).
/// The last `:` splits name from dims, so names may contain `:`; names may be quoted `'a:b'`.
pub fn parse_shapes(flag: &str, spec: &str) -> Result<BTreeMap<String, Vec<i64>>, PlanError> {
    let bad = |why: String| PlanError::BadSpec {
        flag: flag.into(),
        spec: spec.into(),
        why,
    };
    let mut out = BTreeMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, dims) = item
            .rsplit_once(':')
            .ok_or_else(|| bad(format!("`{item}` has no `:` between input name and dims")))?;
        let name = name.trim().trim_matches('\'');
        if name.is_empty() {
            return Err(bad(format!("`{item}` has an empty input name")));
        }
        let dims: Vec<i64> = if dims.trim().is_empty() {
            Vec::new()
        } else {
            dims.split('x')
                .map(|d| {
                    d.trim()
                        .parse::<i64>()
                        .map_err(|_| bad(format!("`{d}` in `{item}` is not an integer dimension")))
                })
                .collect::<Result<_, _>>()?
        };
        if out.insert(name.to_string(), dims).is_some() {
            return Err(bad(format!("input `{name}` is given twice")));
        }
    }
    if out.is_empty() {
        return Err(bad("no shapes".into()));
    }
    Ok(out)
}

/// One graph input (initializers excluded) as profiles see it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InputSig {
    pub name: String,
    /// Element type name (`float32`, `int64`, …); `None` for non-tensor inputs.
    pub dtype: Option<String>,
    /// `None` when the model gives no shape (rank unknown).
    pub shape: Option<Vec<Dim>>,
}

impl InputSig {
    /// Axes that are not fixed (named or unknown).
    pub fn dynamic_axes(&self) -> Vec<usize> {
        match &self.shape {
            None => Vec::new(),
            Some(s) => s
                .iter()
                .enumerate()
                .filter(|(_, d)| !matches!(d, Dim::Fixed(_)))
                .map(|(i, _)| i)
                .collect(),
        }
    }

    /// Whether some axis is dynamic or the rank is unknown.
    pub fn is_dynamic(&self) -> bool {
        self.shape.is_none() || !self.dynamic_axes().is_empty()
    }
}

/// The model's inputs, in graph order.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ModelInputs(pub Vec<InputSig>);

impl ModelInputs {
    /// The non-initializer inputs of the model's top graph.
    pub fn of(model: &Model) -> Self {
        let g = Graph::new(model.graph());
        ModelInputs(
            g.inputs
                .iter()
                .map(|v| InputSig {
                    name: v.name.clone(),
                    dtype: elem_type_of(v).map(|t| t.name().into_owned()),
                    shape: shape_of(v),
                })
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&InputSig> {
        self.0.iter().find(|i| i.name == name)
    }
}

/// Checks `profile` against the model's inputs and returns its canonical form: only inputs
/// with a dynamic axis (or unknown rank) are kept, since fixed inputs are already in the model
/// digest. `Ok(None)` when nothing dynamic remains (an empty profile, or a static model).
pub fn validate_profile(
    inputs: &ModelInputs,
    profile: &ShapeProfile,
) -> Result<Option<ShapeProfile>, PlanError> {
    let pname = || profile.name.clone();
    let sets = [
        (Bound::Min, &profile.min),
        (Bound::Opt, &profile.opt),
        (Bound::Max, &profile.max),
    ];
    // Every named input must exist and appear in all three sets.
    for (which, set) in sets {
        for (name, shape) in set.iter() {
            if inputs.get(name).is_none() {
                return Err(PlanError::UnknownInput {
                    profile: pname(),
                    input: name.clone(),
                    known: inputs.0.iter().map(|i| i.name.clone()).collect(),
                });
            }
            for (other, oset) in sets {
                if !oset.contains_key(name) {
                    return Err(PlanError::MissingBound {
                        profile: pname(),
                        input: name.clone(),
                        which,
                        shape: shape.clone(),
                        missing: other,
                    });
                }
            }
        }
    }
    let mut symbols: BTreeMap<(String, usize), (String, usize, i64)> = BTreeMap::new();
    for input in &inputs.0 {
        let name = &input.name;
        let Some(opt) = profile.opt.get(name) else {
            continue;
        };
        let (min, max) = (&profile.min[name], &profile.max[name]);
        // opt first: with opt alone, min and max are copies of it.
        for (which, shape) in [(Bound::Opt, opt), (Bound::Min, min), (Bound::Max, max)] {
            let rank_err = |expected| PlanError::WrongRank {
                profile: pname(),
                input: name.clone(),
                which,
                shape: shape.clone(),
                got: shape.len(),
                expected,
            };
            match &input.shape {
                Some(dims) if dims.len() != shape.len() => return Err(rank_err(dims.len())),
                None if shape.len() != opt.len() => return Err(rank_err(opt.len())),
                _ => {}
            }
            for (axis, &v) in shape.iter().enumerate() {
                if v < 0 {
                    return Err(PlanError::NegativeDim {
                        profile: pname(),
                        input: name.clone(),
                        axis,
                        which,
                        value: v,
                    });
                }
                match input.shape.as_ref().and_then(|s| s.get(axis)) {
                    Some(Dim::Fixed(f)) if *f != v => {
                        return Err(PlanError::FixedDimContradicted {
                            profile: pname(),
                            input: name.clone(),
                            axis,
                            which,
                            value: v,
                            fixed: *f,
                        })
                    }
                    Some(Dim::Named(param)) => {
                        let k = (param.clone(), which as usize);
                        match symbols.get(&k) {
                            Some((a_input, a_axis, a_value)) if *a_value != v => {
                                return Err(PlanError::SymbolMismatch {
                                    profile: pname(),
                                    param: param.clone(),
                                    which,
                                    a: format!("{a_value} at `{a_input}` axis {a_axis}"),
                                    b: format!("{v} at `{name}` axis {axis}"),
                                })
                            }
                            Some(_) => {}
                            None => {
                                symbols.insert(k, (name.clone(), axis, v));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        for axis in 0..opt.len() {
            for (lo_name, lo, hi_name, hi) in [
                (Bound::Min, min[axis], Bound::Opt, opt[axis]),
                (Bound::Opt, opt[axis], Bound::Max, max[axis]),
            ] {
                if lo > hi {
                    return Err(PlanError::Order {
                        profile: pname(),
                        input: name.clone(),
                        axis,
                        lo_name,
                        lo,
                        hi_name,
                        hi,
                    });
                }
            }
        }
    }
    let mut out = ShapeProfile {
        name: profile.name.clone(),
        ..Default::default()
    };
    for input in inputs.0.iter().filter(|i| i.is_dynamic()) {
        if let Some(opt) = profile.opt.get(&input.name) {
            out.min
                .insert(input.name.clone(), profile.min[&input.name].clone());
            out.opt.insert(input.name.clone(), opt.clone());
            out.max
                .insert(input.name.clone(), profile.max[&input.name].clone());
        }
    }
    if out.opt.is_empty() {
        return Ok(None);
    }
    for input in inputs
        .0
        .iter()
        .filter(|i| i.is_dynamic() && i.dtype.is_some())
    {
        if !out.opt.contains_key(&input.name) {
            return Err(PlanError::DynamicInputWithoutShape {
                profile: pname(),
                input: input.name.clone(),
                axes: input.dynamic_axes(),
            });
        }
    }
    Ok(Some(out))
}

/// The first shape set a validation run tries for every tensor input: the profile's opt
/// shape, else the model's dims with every dynamic axis set to 1. When the original model
/// refuses it, validation searches further (`builder::validate`: shared symbol values,
/// `past + sequence` expressions, growing sizes); the shapes it used are in the record.
pub fn concrete_shapes(
    inputs: &ModelInputs,
    profile: Option<&ShapeProfile>,
) -> Result<BTreeMap<String, Vec<i64>>, PlanError> {
    let mut out = BTreeMap::new();
    for input in inputs.0.iter().filter(|i| i.dtype.is_some()) {
        let shape = match (profile.and_then(|p| p.opt.get(&input.name)), &input.shape) {
            (Some(opt), _) => opt.clone(),
            (None, Some(dims)) => dims
                .iter()
                .map(|d| match d {
                    Dim::Fixed(v) => *v,
                    _ => 1,
                })
                .collect(),
            (None, None) => {
                return Err(PlanError::UnknownRank {
                    input: input.name.clone(),
                })
            }
        };
        out.insert(input.name.clone(), shape);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(name: &str, dims: &[Dim]) -> InputSig {
        InputSig {
            name: name.into(),
            dtype: Some("int64".into()),
            shape: Some(dims.to_vec()),
        }
    }

    fn bert() -> ModelInputs {
        let n = |s: &str| Dim::Named(s.into());
        ModelInputs(vec![
            sig("ids", &[n("batch"), n("seq")]),
            sig("mask", &[n("batch"), n("seq")]),
            sig("pos", &[Dim::Fixed(1), Dim::Unknown]),
        ])
    }

    fn prof(min: &str, opt: &str, max: &str) -> ShapeProfile {
        ShapeProfile {
            name: "p".into(),
            min: parse_shapes("min-shapes", min).unwrap(),
            opt: parse_shapes("opt-shapes", opt).unwrap(),
            max: parse_shapes("max-shapes", max).unwrap(),
        }
    }

    const MIN: &str = "ids:1x1,mask:1x1,pos:1x1";
    const OPT: &str = "ids:2x16,mask:2x16,pos:1x16";
    const MAX: &str = "ids:8x128,mask:8x128,pos:1x128";

    #[test]
    fn parses_trtexec_syntax() {
        let s = parse_shapes("opt-shapes", "ids:1x128, 'a:b':3x4,s:").unwrap();
        assert_eq!(s["ids"], [1, 128]);
        assert_eq!(s["a:b"], [3, 4]);
        assert_eq!(s["s"], Vec::<i64>::new());
        for bad in ["ids", "ids:1xa", ":1x2", "a:1,a:2", ""] {
            let e = parse_shapes("opt-shapes", bad).unwrap_err().to_string();
            assert!(e.contains("--opt-shapes"), "{bad}: {e}");
        }
    }

    #[test]
    fn valid_profile_passes() {
        let p = validate_profile(&bert(), &prof(MIN, OPT, MAX))
            .unwrap()
            .unwrap();
        assert_eq!(p.opt["ids"], [2, 16]);
        let c = concrete_shapes(&bert(), Some(&p)).unwrap();
        assert_eq!(c["pos"], [1, 16]);
        let c = concrete_shapes(&bert(), None).unwrap();
        assert_eq!(c["ids"], [1, 1]);
    }

    fn err(min: &str, opt: &str, max: &str) -> String {
        validate_profile(&bert(), &prof(min, opt, max))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn unknown_input() {
        let e = err("x:1", "x:1", "x:1");
        assert!(
            e.contains("profile `p`: input `x` is not an input") && e.contains("ids, mask, pos"),
            "{e}"
        );
    }

    #[test]
    fn wrong_rank() {
        let e = err(MIN, "ids:2x16x1,mask:2x16,pos:1x16", MAX);
        assert!(
            e.contains("input `ids` opt shape [2, 16, 1] has rank 3") && e.contains("rank 2"),
            "{e}"
        );
    }

    #[test]
    fn min_greater_than_opt_and_opt_greater_than_max() {
        let e = err("ids:4x1,mask:4x1,pos:1x1", OPT, MAX);
        assert!(e.contains("input `ids` axis 0: min 4 > opt 2"), "{e}");
        let e = err(MIN, OPT, "ids:8x128,mask:8x128,pos:1x8");
        assert!(e.contains("input `pos` axis 1: opt 16 > max 8"), "{e}");
    }

    #[test]
    fn fixed_dim_contradicted() {
        let e = err(MIN, OPT, "ids:8x128,mask:8x128,pos:2x128");
        assert!(
            e.contains("input `pos` axis 0 is fixed to 1 in the model, but max gives 2"),
            "{e}"
        );
    }

    #[test]
    fn dynamic_input_left_without_shape() {
        let e = err(
            "ids:1x1,mask:1x1",
            "ids:2x16,mask:2x16",
            "ids:8x128,mask:8x128",
        );
        assert!(
            e.contains("dynamic input `pos` (axes 1) has no shape"),
            "{e}"
        );
    }

    #[test]
    fn missing_bound_and_negative_and_symbols() {
        let e = err("ids:1x1,mask:1x1", OPT, MAX);
        assert!(
            e.contains("input `pos` has opt shape") && e.contains("no min shape"),
            "{e}"
        );
        let e = err("ids:1x-1,mask:1x1,pos:1x1", OPT, MAX);
        assert!(e.contains("input `ids` axis 1: min is -1"), "{e}");
        let e = err(MIN, "ids:2x16,mask:2x17,pos:1x16", MAX);
        assert!(
            e.contains("`seq` is 16 at `ids` axis 1 but 17 at `mask` axis 1 (opt)"),
            "{e}"
        );
    }

    #[test]
    fn inputs_of_fixture_models() {
        use crate::fixtures::models;
        use prost::Message;
        let load = |m: crate::onnx::proto::ModelProto| {
            Model::from_bytes("m.onnx", m.encode_to_vec().into()).unwrap()
        };
        let enc = ModelInputs::of(&load(models::tiny_encoder(false)));
        // Initializers are not inputs.
        assert_eq!(enc.0.len(), 1);
        assert_eq!(enc.0[0].dynamic_axes(), [0, 1]);
        assert_eq!(enc.0[0].dtype.as_deref(), Some("float32"));
        assert_eq!(concrete_shapes(&enc, None).unwrap()["x"], [1, 1, 64]);
        let st = ModelInputs::of(&load(models::tiny_encoder(true)));
        assert!(!st.0[0].is_dynamic());
        let p = prof("x:1x16x64", "x:1x16x64", "x:1x16x64");
        assert_eq!(validate_profile(&st, &p).unwrap(), None);
        let il = ModelInputs::of(&load(models::if_loop()));
        let c = concrete_shapes(&il, None).unwrap();
        assert_eq!(c["cond"], Vec::<i64>::new());
        assert_eq!(c["x"], [1]);
    }

    #[test]
    fn unknown_rank_needs_a_profile_shape() {
        let inputs = ModelInputs(vec![InputSig {
            name: "t".into(),
            dtype: Some("float32".into()),
            shape: None,
        }]);
        let e = concrete_shapes(&inputs, None).unwrap_err().to_string();
        assert!(e.contains("input `t` has no known rank"), "{e}");
        let p = prof("t:1x2", "t:2x2", "t:4x2");
        let v = validate_profile(&inputs, &p).unwrap().unwrap();
        assert_eq!(concrete_shapes(&inputs, Some(&v)).unwrap()["t"], [2, 2]);
        // Unknown rank: the three shapes must at least agree with each other.
        let e = validate_profile(&inputs, &prof("t:1", "t:2x2", "t:4x2")).unwrap_err();
        assert!(e.to_string().contains("min shape [1] has rank 1"), "{e}");
    }

    #[test]
    fn static_inputs_are_dropped_from_the_canonical_profile() {
        let inputs = ModelInputs(vec![sig("x", &[Dim::Fixed(1), Dim::Fixed(4)])]);
        let p = prof("x:1x4", "x:1x4", "x:1x4");
        assert_eq!(validate_profile(&inputs, &p).unwrap(), None);
        let e = validate_profile(&inputs, &prof("x:1x4", "x:2x4", "x:2x4")).unwrap_err();
        assert!(e.to_string().contains("axis 0 is fixed to 1"), "{e}");
    }
}
