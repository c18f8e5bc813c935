//! Stage 3: the build plan's parts that users choose: shape profiles (min/opt/max per dynamic
//! input, from a `MODEL.trtcache.toml` sidecar or trtexec-style flags) and precision.
//!
//! Data enters as command-line flags ([`ProfileArgs`]) and the sidecar file (`sidecar.rs`);
//! [`resolve`] checks the chosen profile against the model's inputs (`validate.rs`) and
//! returns a [`Plan`] (canonical profile, precision, backends, tolerance, golden settings)
//! for the key and build stages. Every error is a [`PlanError`] naming profile, input, axis.

use serde::Serialize;

pub use crate::spec::{Precision, ShapeProfile, Tolerance};

mod sidecar;
mod validate;

use std::path::{Path, PathBuf};

pub use sidecar::{load_sidecar, sidecar_candidates, GoldenSettings, ProfileSpec, Sidecar};
pub use validate::{concrete_shapes, parse_shapes, validate_profile, InputSig, ModelInputs};

/// Which of a profile's three shape sets an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Min,
    Opt,
    Max,
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Bound::Min => "min",
            Bound::Opt => "opt",
            Bound::Max => "max",
        })
    }
}

/// Errors of profile parsing, sidecar loading and validation; each names the profile, input
/// and axis involved.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    #[error("--{flag} `{spec}`: {why} (expected trtexec syntax `name:1x3x224x224,other:1x128`)")]
    BadSpec {
        flag: String,
        spec: String,
        why: String,
    },
    #[error("{path}: cannot read the sidecar: {source}")]
    SidecarRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid sidecar: {message}")]
    SidecarParse { path: PathBuf, message: String },
    #[error("{a} and {b} both exist; keep one sidecar per model")]
    AmbiguousSidecar { a: PathBuf, b: PathBuf },
    #[error("profile `{name}` is not defined{}; available: {}", where_.as_ref().map(|p| format!(" in {}", p.display())).unwrap_or_default(), if available.is_empty() { "(none)".to_string() } else { available.join(", ") })]
    NoSuchProfile {
        name: String,
        where_: Option<PathBuf>,
        available: Vec<String>,
    },
    #[error("{path} defines several profiles ({}) and no `default_profile`; choose one with --profile", available.join(", "))]
    NoDefaultProfile {
        path: PathBuf,
        available: Vec<String>,
    },
    #[error("profile `{profile}`: --{given} is given without --{missing}; give --opt-shapes alone (min = max = opt) or all three")]
    IncompleteFlags {
        profile: String,
        given: String,
        missing: String,
    },
    #[error("profile `{profile}`: input `{input}` is not an input of the model (inputs: {})", known.join(", "))]
    UnknownInput {
        profile: String,
        input: String,
        known: Vec<String>,
    },
    #[error("profile `{profile}`: input `{input}` has {which} shape {shape:?} but no {missing} shape; give min, opt and max for every input (or opt alone)")]
    MissingBound {
        profile: String,
        input: String,
        which: Bound,
        shape: Vec<i64>,
        missing: Bound,
    },
    #[error("profile `{profile}`: input `{input}` {which} shape {shape:?} has rank {got}, the model's input has rank {expected}")]
    WrongRank {
        profile: String,
        input: String,
        which: Bound,
        shape: Vec<i64>,
        got: usize,
        expected: usize,
    },
    #[error("profile `{profile}`: input `{input}` axis {axis}: {which} is {value}; dimensions must be >= 0")]
    NegativeDim {
        profile: String,
        input: String,
        axis: usize,
        which: Bound,
        value: i64,
    },
    #[error("profile `{profile}`: input `{input}` axis {axis}: {lo_name} {lo} > {hi_name} {hi}; need min <= opt <= max")]
    Order {
        profile: String,
        input: String,
        axis: usize,
        lo_name: Bound,
        lo: i64,
        hi_name: Bound,
        hi: i64,
    },
    #[error("profile `{profile}`: input `{input}` axis {axis} is fixed to {fixed} in the model, but {which} gives {value}")]
    FixedDimContradicted {
        profile: String,
        input: String,
        axis: usize,
        which: Bound,
        value: i64,
        fixed: i64,
    },
    #[error("profile `{profile}`: dynamic dimension `{param}` is {a} but {b} ({which}); inputs sharing a named dimension must agree")]
    SymbolMismatch {
        profile: String,
        param: String,
        which: Bound,
        /// e.g. "16 at `ids` axis 1".
        a: String,
        b: String,
    },
    #[error("profile `{profile}`: dynamic input `{input}` (axes {}) has no shape while other inputs do; add `{input}:...` to the min/opt/max shapes", axes.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", "))]
    DynamicInputWithoutShape {
        profile: String,
        input: String,
        axes: Vec<usize>,
    },
    #[error("input `{input}` has no known rank in the model and no shape in the profile; give it with --opt-shapes {input}:...")]
    UnknownRank { input: String },
    /// TensorRT builds an engine with dynamic inputs only over a profile that covers them
    /// all: without one, ONNX Runtime's TensorRT provider defers the build to the first run
    /// (and writes no EP-context model), and TensorRT's builder refuses the network.
    #[error("the {backend} backend needs a shape profile for every dynamic input, and {} has none\nfix: give --min-shapes/--opt-shapes/--max-shapes (e.g. `--opt-shapes {}` with sizes for N), or [profiles] in the model's sidecar (docs/cache.md, \"Profiles and validation\")", .inputs.join(", "), .inputs.join(","))]
    Unprofiled {
        backend: crate::spec::Backend,
        /// Each input as `name:dims` with `N` for a dynamic axis.
        inputs: Vec<String>,
    },
    /// ONNX Runtime's TensorRT provider takes profiles as `name:dims,name:dims` strings and
    /// splits them at `,` and the first `:`: a name holding either cannot be given to it.
    #[error("the ort-tensorrt backend cannot take a shape profile for input `{input}`: ONNX Runtime's trt_profile_*_shapes options split at `,` and `:`, which the name contains\nfix: build it with the trt backend (names go to TensorRT as they are), or rename the input in the model")]
    UnprofilableName { input: String },
    /// ONNX Runtime's TensorRT provider writes one EP-context model per TensorRT subgraph
    /// (the last one wins, with that subgraph's inputs and outputs, not the model's) and loads
    /// only a context model that is a single `EPContext` node: an `ort-tensorrt` artifact is
    /// correct only when TensorRT takes the whole graph.
    #[error("the ort-tensorrt backend needs TensorRT to take the whole model, and it does not: {declined}\nONNX Runtime's TensorRT provider writes its EP-context model per TensorRT subgraph and loads only one that is a single EPContext node, so a partitioned model cannot be served from one (`trtcache inspect MODEL` shows the partitions)\nfix: the ort-cuda backend serves it (CUDA kernels for every node); or make TensorRT take every node (a profile for the data-dependent shapes, no control flow), which the trt backend needs too")]
    NotWholeGraph { declined: String },
}

/// Refuses `ort-tensorrt` for a model the capability analysis does not give to TensorRT
/// whole ([`PlanError::NotWholeGraph`]); other backends pass. Run before any library is
/// loaded, with the bundled operator table of the newest TensorRT, so the refusal is the same
/// on a host without a GPU; the build then checks the context model ONNX Runtime wrote
/// against the model's inputs and outputs, which catches what the table misjudges.
pub fn check_whole_graph(
    model: &crate::onnx::Model,
    backend: crate::spec::Backend,
) -> Result<(), PlanError> {
    if backend != crate::spec::Backend::OrtTensorRt {
        return Ok(());
    }
    let opts = crate::analysis::Options {
        providers: backend.providers().to_vec(),
        ..Default::default()
    };
    let cap = match crate::analysis::analyse(model, &opts) {
        Ok(c) => c,
        Err(e) => {
            // No analysis, no refusal: the context-model check at build time still holds.
            tracing::warn!(error = %e, "capability analysis failed; the whole-graph check is left to the build");
            return Ok(());
        }
    };
    let declined = cap.declined_by_trt();
    if declined.is_empty() {
        return Ok(());
    }
    let total: usize = declined.iter().map(|d| d.count).sum();
    let mut rows: Vec<String> = declined
        .iter()
        .take(3)
        .map(|d| format!("{} ×{} ({})", d.op, d.count, d.reason))
        .collect();
    if declined.len() > 3 {
        rows.push(format!("and {} more kinds", declined.len() - 3));
    }
    Err(PlanError::NotWholeGraph {
        declined: format!(
            "{total} of {} nodes go elsewhere: {}",
            cap.nodes.len(),
            rows.join("; ")
        ),
    })
}

/// Checks that `backend` can build `plan` for a model with `inputs`, before any library is
/// loaded, so the refusal reads the same on a host without a GPU: the TensorRT backends need a
/// profile over every dynamic input, and `ort-tensorrt` cannot carry names holding `,` or `:`.
pub fn check_backend(
    plan: &Plan,
    inputs: &ModelInputs,
    backend: crate::spec::Backend,
) -> Result<(), PlanError> {
    use crate::spec::Backend;
    if !matches!(backend, Backend::OrtTensorRt | Backend::Trt) {
        return Ok(());
    }
    let covered = |name: &str| {
        plan.profile
            .as_ref()
            .is_some_and(|p| p.opt.contains_key(name))
    };
    let missing: Vec<String> = inputs
        .0
        .iter()
        .filter(|i| i.is_dynamic() && !covered(&i.name))
        .map(|i| {
            let dims = match &i.shape {
                Some(s) => s
                    .iter()
                    .map(|d| match d {
                        crate::onnx::facts::Dim::Fixed(n) => n.to_string(),
                        _ => "N".into(),
                    })
                    .collect::<Vec<_>>()
                    .join("x"),
                None => "?".into(),
            };
            format!("{}:{dims}", i.name)
        })
        .collect();
    if !missing.is_empty() {
        return Err(PlanError::Unprofiled {
            backend,
            inputs: missing,
        });
    }
    if backend == Backend::OrtTensorRt {
        if let Some(p) = &plan.profile {
            if let Some(name) = p.opt.keys().find(|n| n.contains([',', ':'])) {
                return Err(PlanError::UnprofilableName {
                    input: name.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Shape-profile flags shared by every command that keys or builds a model; flatten it into
/// a command's args with `#[command(flatten)]`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ProfileArgs {
    /// Named profile from the model's sidecar (`MODEL.trtcache.toml`).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Minimum shapes, trtexec syntax: `ids:1x1,mask:1x1`. Needs --opt-shapes and
    /// --max-shapes; overrides the sidecar.
    #[arg(long = "min-shapes", value_name = "SPEC")]
    pub min_shapes: Option<String>,
    /// Optimal shapes, trtexec syntax; alone it means min = opt = max.
    #[arg(long = "opt-shapes", value_name = "SPEC")]
    pub opt_shapes: Option<String>,
    /// Maximum shapes, trtexec syntax.
    #[arg(long = "max-shapes", value_name = "SPEC")]
    pub max_shapes: Option<String>,
    /// Sidecar file to use instead of the one next to the model.
    #[arg(long, value_name = "FILE")]
    pub sidecar: Option<PathBuf>,
    /// Ignore any sidecar next to the model.
    #[arg(long, conflicts_with = "sidecar")]
    pub no_sidecar: bool,
}

impl ProfileArgs {
    /// Whether any shape flag was given.
    pub fn has_shape_flags(&self) -> bool {
        self.min_shapes.is_some() || self.opt_shapes.is_some() || self.max_shapes.is_some()
    }

    /// The profile the flags describe (unvalidated), named `name`; `None` without flags.
    pub fn flag_profile(&self, name: &str) -> Result<Option<ShapeProfile>, PlanError> {
        if !self.has_shape_flags() {
            return Ok(None);
        }
        let parse = |flag: &str, v: &Option<String>| {
            v.as_deref().map(|s| parse_shapes(flag, s)).transpose()
        };
        let min = parse("min-shapes", &self.min_shapes)?;
        let opt = parse("opt-shapes", &self.opt_shapes)?;
        let max = parse("max-shapes", &self.max_shapes)?;
        let incomplete = |given: &str, missing: &str| PlanError::IncompleteFlags {
            profile: name.into(),
            given: given.into(),
            missing: missing.into(),
        };
        let Some(opt) = opt else {
            let given = if min.is_some() {
                "min-shapes"
            } else {
                "max-shapes"
            };
            return Err(incomplete(given, "opt-shapes"));
        };
        match (&min, &max) {
            (Some(_), None) => return Err(incomplete("min-shapes", "max-shapes")),
            (None, Some(_)) => return Err(incomplete("max-shapes", "min-shapes")),
            _ => {}
        }
        Ok(Some(ShapeProfile {
            name: name.into(),
            min: min.unwrap_or_else(|| opt.clone()),
            max: max.unwrap_or_else(|| opt.clone()),
            opt,
        }))
    }
}

/// Everything the plan stage decides for one build: the validated profile (`None` for a
/// model without dynamic inputs), precision, backends, tolerances, golden inputs.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub profile: Option<ShapeProfile>,
    pub precision: Precision,
    /// Backends the sidecar lists (empty: the command's default).
    pub backends: Vec<crate::spec::Backend>,
    /// Tolerance for `precision`.
    pub tolerance: Tolerance,
    pub golden: GoldenSettings,
    /// The sidecar's `specialize` (`None` when it does not say).
    pub specialize: Option<bool>,
    /// The sidecar's `rewrite` (`None` when it does not say).
    pub rewrite: Option<bool>,
    /// The sidecar used, if any.
    pub sidecar: Option<PathBuf>,
}

/// Resolves the plan for `model` from the sidecar (next to `model_path`, or `args.sidecar`)
/// and the flags: flags override the sidecar's profile, `precision` (a command's
/// `--precision`) overrides the sidecar's. The profile is validated against the model.
pub fn resolve(
    model_path: &Path,
    inputs: &ModelInputs,
    args: &ProfileArgs,
    precision: Option<Precision>,
) -> Result<Plan, PlanError> {
    let sidecar = match (&args.sidecar, args.no_sidecar) {
        (_, true) => None,
        (Some(p), false) => Some(Sidecar::load(p)?),
        (None, false) => load_sidecar(model_path)?,
    };
    let profile = if let Some(p) = args.flag_profile(args.profile.as_deref().unwrap_or("flags"))? {
        Some(p)
    } else if let Some(sc) = &sidecar {
        sc.profile(args.profile.as_deref())?
    } else if let Some(name) = &args.profile {
        return Err(PlanError::NoSuchProfile {
            name: name.clone(),
            where_: None,
            available: Vec::new(),
        });
    } else {
        None
    };
    let profile = match profile {
        Some(p) => validate_profile(inputs, &p)?,
        None => validate_profile(inputs, &ShapeProfile::default())?,
    };
    let precision = precision
        .or(sidecar.as_ref().and_then(|s| s.precision))
        .unwrap_or_default();
    let tolerance = sidecar
        .as_ref()
        .map(|s| s.tolerance(precision))
        .unwrap_or_else(|| Tolerance::default_for(precision));
    Ok(Plan {
        profile,
        precision,
        backends: sidecar
            .as_ref()
            .map(|s| s.backends.clone())
            .unwrap_or_default(),
        tolerance,
        golden: sidecar
            .as_ref()
            .map(|s| s.golden.clone())
            .unwrap_or_default(),
        specialize: sidecar.as_ref().and_then(|s| s.specialize),
        rewrite: sidecar.as_ref().and_then(|s| s.rewrite),
        sidecar: sidecar.map(|s| s.path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(min: Option<&str>, opt: Option<&str>, max: Option<&str>) -> ProfileArgs {
        ProfileArgs {
            min_shapes: min.map(String::from),
            opt_shapes: opt.map(String::from),
            max_shapes: max.map(String::from),
            ..Default::default()
        }
    }

    fn plan_for(inputs: &ModelInputs, args: &ProfileArgs) -> Plan {
        resolve(Path::new("/nonexistent/m.onnx"), inputs, args, None).unwrap()
    }

    fn sig(name: &str, dims: &[Option<i64>]) -> InputSig {
        use crate::onnx::facts::Dim;
        InputSig {
            name: name.into(),
            dtype: Some("float32".into()),
            shape: Some(
                dims.iter()
                    .map(|d| d.map_or(Dim::Unknown, Dim::Fixed))
                    .collect(),
            ),
        }
    }

    #[test]
    fn tensorrt_backends_need_a_profile_over_every_dynamic_input() {
        use crate::spec::Backend;
        let inputs = ModelInputs(vec![
            sig("ids", &[None, None]),
            sig("mask", &[None, None]),
            sig("scale", &[Some(1)]),
        ]);
        let bare = plan_for(&inputs, &ProfileArgs::default());
        for b in [Backend::OrtTensorRt, Backend::Trt] {
            let e = check_backend(&bare, &inputs, b).unwrap_err().to_string();
            assert!(
                e.contains("ids:NxN, mask:NxN") && e.contains(b.as_str()),
                "{e}"
            );
            assert!(!e.contains("scale"), "{e}");
            assert!(e.contains("--opt-shapes ids:NxN,mask:NxN"), "{e}");
        }
        for b in [Backend::OrtCpu, Backend::OrtCuda] {
            check_backend(&bare, &inputs, b).unwrap();
        }
        // (A profile that covers some dynamic inputs and not others is refused by `resolve`.)
        let full = plan_for(&inputs, &flags(None, Some("ids:1x8,mask:1x8"), None));
        check_backend(&full, &inputs, Backend::OrtTensorRt).unwrap();
        check_backend(&full, &inputs, Backend::Trt).unwrap();
    }

    #[test]
    fn ort_tensorrt_refuses_names_its_profile_strings_cannot_carry() {
        use crate::spec::Backend;
        // A TensorFlow export's `input:0`: given through a sidecar (the flags' own syntax
        // splits at `:` too).
        let inputs = ModelInputs(vec![sig("input:0", &[None, Some(3)])]);
        let mut p = plan_for(&ModelInputs::default(), &ProfileArgs::default());
        let mut opt = std::collections::BTreeMap::new();
        opt.insert("input:0".to_string(), vec![1, 3]);
        p.profile = Some(ShapeProfile {
            name: "s".into(),
            min: opt.clone(),
            max: opt.clone(),
            opt,
        });
        let e = check_backend(&p, &inputs, Backend::OrtTensorRt)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`input:0`") && e.contains("trt backend"), "{e}");
        check_backend(&p, &inputs, Backend::Trt).unwrap();
    }

    #[test]
    fn shape_flags() {
        let p = flags(Some("x:1x1x64"), Some("x:2x16x64"), Some("x:8x128x64"))
            .flag_profile("f")
            .unwrap()
            .unwrap();
        assert_eq!(p.opt["x"], vec![2, 16, 64]);
        assert_eq!(p.max["x"], vec![8, 128, 64]);
        // opt alone: min = opt = max.
        let p = flags(None, Some("x:2x16x64,m:2x16"), None)
            .flag_profile("f")
            .unwrap()
            .unwrap();
        assert_eq!(p.min, p.opt);
        assert_eq!(p.max, p.opt);
        assert!(flags(None, None, None).flag_profile("f").unwrap().is_none());
        for (min, opt, max, want) in [
            (Some("x:1x1"), None, None, "without --opt-shapes"),
            (Some("x:1x1"), Some("x:2x2"), None, "without --max-shapes"),
            (None, Some("x:2x2"), Some("x:4x4"), "without --min-shapes"),
            (None, Some("x:2xAx3"), None, "--opt-shapes"),
            (None, Some("x2x3"), None, "--opt-shapes"),
        ] {
            let e = flags(min, opt, max)
                .flag_profile("f")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{min:?} {opt:?} {max:?}: {e}");
        }
    }
}
