//! Validation: the artifact and the original model (ONNX Runtime CPU, optimizations
//! disabled) run on the same seeded random inputs; per output, the max abs and rel error are
//! recorded against tolerances that depend on the precision.
//!
//! Enters: a session on the artifact, the original model path, the profile and
//! [`ValidationConfig`]. Leaves: a [`ValidationReport`] (stored in the record; `passed == false`
//! means the artifact is never served) or an error when the model cannot be run at all.
//!
//! Inputs: a golden `.npz` when one is given. Otherwise seeded random values whose shapes
//! come from a search that stops at the first set the *reference* (the original model under
//! ONNX Runtime CPU, optimizations off) runs: the profile's opt shape for every input it
//! names (binding its symbolic dimensions for the other inputs); one value per symbolic
//! dimension name, shared by every input that uses it, with exporters' expressions such as
//! `past_sequence + sequence` evaluated from their parts; every dimension 1 first, then cache
//! lengths (`past*`) 0, then the sizes of [`SEARCH_SIZES`] for every non-batch dimension
//! (batch stays 1). When no candidate runs, the error names the inputs and axes, gives ONNX
//! Runtime's message and says what to add (a profile or golden inputs). Floats are uniform in
//! [-1, 1), integers uniform in `int_range` (default [0, 2), safe for ids, masks and
//! indices), bools fair coins, strings the decimals of such integers; every element type
//! ONNX Runtime runs is read back and compared ([`values`]): floats with the tolerance
//! (float16/bfloat16 outputs also within steps of their own type at the output's scale:
//! [`compare_as`]), integers, bools and strings exactly, maps key by key, sequences item by
//! item.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ort::session::Session;
use ort::value::{DynValue, TensorElementType, ValueType};

use super::search::{
    batch_leaves, candidates, leaves, shape_under, tensor_of, unnamed, Axis, Candidate,
    MAX_CANDIDATES, SEARCH_SIZES,
};
use super::values::{self, Out};
use super::vocab;
use super::{BuildError, Runtime};
use crate::plan::{Precision, ShapeProfile};
use crate::rng::SplitMix64;

pub use crate::cache::{OutputError, ValidationReport};
/// Allowed error per element: the sidecar's tolerance type (`atol + rtol·|reference|`, and
/// for float16/bfloat16 outputs `ulps` steps of their type: [`Tolerance::half_bound`]).
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
    /// Largest total size of the random inputs, in bytes (`limits.validation_max_bytes`): a
    /// model with a huge fixed input is refused with this, before anything is allocated.
    #[serde(default = "default_max_input_bytes")]
    pub max_input_bytes: u64,
    /// `ort-cpu`: after validation, time the artifact's runs with ONNX Runtime's default
    /// thread pool and on one thread (`cache::ThreadProbe`) when its first validation run
    /// took at most this many milliseconds (`limits.thread_probe_max_run_ms`); 0: never.
    #[serde(default = "default_thread_probe_max_run_ms")]
    pub thread_probe_max_run_ms: u64,
    /// `ort-cpu`: after the thread probe, time the artifact's sessions and runs with and
    /// without prepacked weights (`cache::PrepackProbe`) when its first validation run took
    /// at most this many milliseconds (`limits.prepack_probe_max_run_ms`); 0: never.
    #[serde(default = "default_prepack_probe_max_run_ms")]
    pub prepack_probe_max_run_ms: u64,
}

/// Default [`ValidationConfig::thread_probe_max_run_ms`]: 10 ms, so the probe adds at most
/// about 2 × [`THREAD_PROBE_RUNS`] × 10 ms and a session to a build.
pub const DEFAULT_THREAD_PROBE_MAX_RUN_MS: u64 = 10;

/// Fewest runs the thread and prepack probes time each way.
pub const THREAD_PROBE_RUNS: u32 = 9;

/// Most runs the thread and prepack probes time each way: after the first
/// [`THREAD_PROBE_RUNS`] pairs, runs go on while [`PROBE_RUN_BUDGET`] lasts (a 15 µs run's
/// fastest of 9 moved by 2-3 % between builds; of 50, by under 1 %).
pub const PROBE_MAX_RUNS: u32 = 50;

/// Time a probe's runs may take beyond the first [`THREAD_PROBE_RUNS`] pairs.
pub const PROBE_RUN_BUDGET: std::time::Duration = std::time::Duration::from_millis(100);

/// The thread probe's scale for batch dimensions when the validation inputs came from the
/// default search: a batch of 256 where the search found 1 ([`scaled_inputs`]).
pub const THREAD_PROBE_SCALE: i64 = 256;

/// Largest total size of the thread probe's scaled inputs (the scale halves to fit).
pub const THREAD_PROBE_SCALED_MAX_BYTES: u64 = 16 << 20;

fn default_thread_probe_max_run_ms() -> u64 {
    DEFAULT_THREAD_PROBE_MAX_RUN_MS
}

/// Default [`ValidationConfig::prepack_probe_max_run_ms`]: 50 ms, so the probe adds at most
/// about 2 × [`THREAD_PROBE_RUNS`] × 50 ms and six sessions to a build.
pub const DEFAULT_PREPACK_PROBE_MAX_RUN_MS: u64 = 50;

fn default_prepack_probe_max_run_ms() -> u64 {
    DEFAULT_PREPACK_PROBE_MAX_RUN_MS
}

/// Default [`ValidationConfig::max_input_bytes`]: 2 GiB.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 2 << 30;

fn default_max_input_bytes() -> u64 {
    DEFAULT_MAX_INPUT_BYTES
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
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            thread_probe_max_run_ms: DEFAULT_THREAD_PROBE_MAX_RUN_MS,
            prepack_probe_max_run_ms: DEFAULT_PREPACK_PROBE_MAX_RUN_MS,
        }
    }
}

/// Bytes one random input of type `vt` and `dims` takes, with checked arithmetic (`None`:
/// the element count overflows). Strings are counted at 16 bytes an element.
fn input_bytes(vt: &ValueType, dims: &[i64]) -> Option<u64> {
    let n = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(u64::try_from(d.max(0)).ok()?))?;
    match vt {
        ValueType::Tensor { ty, .. } => n.checked_mul(ty.byte_size(1).unwrap_or(16) as u64),
        ValueType::Optional(inner) => input_bytes(inner, dims),
        ValueType::Sequence(inner) => input_bytes(inner, dims)?.checked_mul(2),
        _ => Some(0),
    }
}

/// Named input values, in the session's input order.
pub type Inputs = Vec<(String, DynValue)>;
/// Input name → concrete shape.
pub type Shapes = BTreeMap<String, Vec<i64>>;
/// Output name and value read back.
pub(crate) type Outs = Vec<(String, Out)>;

fn bad(path: &Path, what: String) -> BuildError {
    BuildError::Validation(format!("{}: {what}", path.display()))
}

/// Inputs from a golden `.npz`, one array per session input.
fn golden_inputs(session: &Session, gpath: &Path) -> Result<(Inputs, Shapes), BuildError> {
    let arrays = super::golden::read_npz(gpath)?;
    let mut values = Vec::new();
    let mut shapes = BTreeMap::new();
    for input in session.inputs() {
        let name = input.name().to_string();
        let a = arrays.get(&name).ok_or_else(|| {
            bad(
                gpath,
                format!("has no array named `{name}` (the model's input)"),
            )
        })?;
        let v = golden_value(a, input.dtype()).map_err(|w| bad(gpath, format!("`{name}`: {w}")))?;
        shapes.insert(name.clone(), a.shape.clone());
        values.push((name, v));
    }
    Ok((values, shapes))
}

/// A value from a golden array; its dtype must be the input's (a bfloat16 input also takes
/// uint16 arrays of the raw bits).
fn golden_value(a: &super::golden::GoldenArray, vt: &ValueType) -> Result<DynValue, String> {
    use super::golden::GoldenData as G;
    let ty = match vt {
        ValueType::Tensor { ty, .. } => *ty,
        ValueType::Optional(inner) => match inner.as_ref() {
            ValueType::Tensor { ty, .. } => *ty,
            other => {
                return Err(format!(
                    "the model input is {other}; golden arrays are tensors"
                ))
            }
        },
        other => {
            return Err(format!(
                "the model input is {other}; golden arrays are tensors"
            ))
        }
    };
    match (&a.data, ty) {
        (G::Str(d), TensorElementType::String) => values::string_tensor(&a.shape, d.clone()),
        (G::Raw { ty: have, bytes }, want)
            if *have == want
                || (*have == TensorElementType::Uint16 && want == TensorElementType::Bfloat16) =>
        {
            values::tensor_from_bytes(want, &a.shape, bytes)
        }
        (d, t) => Err(format!(
            "array is {}, the model input is {}",
            d.type_name(),
            crate::onnx::ElemType::from_code(values::elem_code(t))
        )),
    }
}

/// Seeded random inputs for the session's inputs with `shapes`.
pub(crate) fn random_inputs(
    session: &Session,
    model: &Path,
    shapes: &Shapes,
    cfg: &ValidationConfig,
    known: &BTreeMap<String, vocab::Known>,
) -> Result<Inputs, BuildError> {
    // The byte budget first, with checked arithmetic: a fixed float32[100000, 100000] input
    // (40 GB) or a shape whose element count overflows is refused before any allocation.
    let mut total: u64 = 0;
    for input in session.inputs() {
        let dims = shapes.get(input.name()).cloned().unwrap_or_default();
        let what = format!("input `{}` {dims:?}", input.name());
        total = input_bytes(input.dtype(), &dims)
            .and_then(|b| total.checked_add(b))
            .ok_or_else(|| {
                BuildError::Validation(format!(
                    "{what}: the element count overflows; give golden inputs (--golden or [golden] npz)"
                ))
            })?;
        if total > cfg.max_input_bytes {
            return Err(BuildError::Validation(format!(
                "validation inputs need at least {total} bytes ({what}), over limits.validation_max_bytes ({}); give golden inputs, a smaller profile, or raise the limit",
                cfg.max_input_bytes
            )));
        }
    }
    let mut rng = SplitMix64(cfg.seed);
    let mut values = Vec::new();
    for input in session.inputs() {
        let name = input.name().to_string();
        let dims = shapes.get(&name).cloned().unwrap_or_default();
        // The values the graph names for the input (a one-hot column's categories) when
        // it names any that suit its type, else random ones.
        let from_graph = match (input.dtype(), known.get(&name)) {
            (ValueType::Tensor { ty, .. }, Some(k)) => {
                values::known_tensor(*ty, &dims, &mut rng, k)
            }
            _ => None,
        };
        let v = from_graph
            .unwrap_or_else(|| values::random_value(input.dtype(), &dims, &mut rng, cfg.int_range))
            .map_err(|w| bad(model, format!("input `{name}`: {w}")))?;
        values.push((name, v));
    }
    Ok(values)
}

/// The validation's `shapes` with every batch dimension of the session's inputs
/// ([`batch_leaves`]: named `batch…`, or the first axis of inputs of rank 2 or more)
/// [`THREAD_PROBE_SCALE`] times its size: the thread probe's second timing, for validation
/// inputs the default search found at the smallest sizes the model accepts. Only batch
/// dimensions: a batch scales a model's work and memory linearly, where a sequence or an
/// image side changes what it computes (and attention's memory grows with its square). The
/// factor halves until the inputs fit in [`THREAD_PROBE_SCALED_MAX_BYTES`] and
/// `cfg.max_input_bytes`. The values are made only when they are timed ([`random_inputs`]).
///
/// `Err` (why, for the record) when no input has a batch dimension, when no factor of 2 or
/// more fits, or when a free dimension is not a batch (a sequence, an image side, an audio
/// length): the search sized it at the smallest the model accepts (madmom_key_cnn's
/// spectrogram at 1 × 1, where consumers feed 100 × 105), so neither timing says what a
/// consumer's inputs cost, and one thread, no slower on a few elements, ran a real input
/// twice as long on this project's two cores (and would run it up to a core count's times as
/// long on a large host). Consumers then keep ONNX Runtime's pool; a profile or golden
/// inputs make the probe time what they name instead.
pub(crate) fn scaled_shapes(
    session: &Session,
    shapes: &Shapes,
    cfg: &ValidationConfig,
) -> Result<(i64, Shapes), String> {
    let mut axes = Vec::new();
    let mut tensors = Vec::new();
    for input in session.inputs() {
        let (Some(dims), Some((_, sig, symbols))) =
            (shapes.get(input.name()), tensor_of(input.dtype()))
        else {
            continue;
        };
        for i in (0..dims.len()).filter(|&i| sig.get(i).is_some_and(|&d| d < 0)) {
            axes.push(Axis {
                input: input.name().to_string(),
                axis: i,
                rank: sig.len(),
                symbol: symbols.get(i).cloned().unwrap_or_default(),
            });
        }
        tensors.push((input.name(), input.dtype()));
    }
    let batch = batch_leaves(&axes);
    let (on, off): (Vec<&Axis>, Vec<&Axis>) = axes.iter().partition(|a| {
        let leaf = if a.symbol.is_empty() {
            unnamed(a)
        } else {
            a.symbol.clone()
        };
        batch.contains(&leaf)
    });
    if let Some(a) = off.first() {
        let size = shapes.get(&a.input).and_then(|d| d.get(a.axis)).copied();
        let name = if a.symbol.is_empty() {
            String::new()
        } else {
            format!(" (`{}`)", a.symbol)
        };
        return Err(format!(
            "input `{}` axis {}{name} is free and not a batch: the size consumers feed is unknown (the search's {}), so one thread is not advised; a profile or golden inputs make the probe time what they name",
            a.input,
            a.axis,
            size.map_or_else(|| "?".to_string(), |s| s.to_string())
        ));
    }
    if on.is_empty() {
        return Err("no batch dimension to scale up".into());
    }
    let cap = THREAD_PROBE_SCALED_MAX_BYTES.min(cfg.max_input_bytes);
    let mut factor = THREAD_PROBE_SCALE;
    while factor >= 2 {
        let mut scaled = shapes.clone();
        for a in &on {
            if let Some(d) = scaled.get_mut(&a.input) {
                d[a.axis] = d[a.axis].saturating_mul(factor);
            }
        }
        let total = tensors.iter().try_fold(0u64, |t, (name, vt)| {
            t.checked_add(input_bytes(vt, scaled.get(*name)?)?)
        });
        if total.is_some_and(|t| t <= cap) {
            return Ok((factor, scaled));
        }
        factor /= 2;
    }
    Err("no batch dimension to scale up within the probe's byte budget".into())
}

/// Finds inputs the reference accepts and its outputs on them: the golden file when one is
/// given, else the profile's opt shapes and the bounded search of [`candidates`].
fn reference_inputs(
    reference: &mut Session,
    model: &Path,
    profile: Option<&ShapeProfile>,
    cfg: &ValidationConfig,
) -> Result<(Inputs, Shapes, Outs), BuildError> {
    if let Some(g) = &cfg.golden {
        let (inputs, shapes) = golden_inputs(reference, g)?;
        let want = run(reference, &inputs, model).map_err(|e| match e {
            BuildError::Ort { message, .. } => bad(
                model,
                format!(
                    "the original model rejects the golden inputs in {}: {message}",
                    g.display()
                ),
            ),
            e => e,
        })?;
        return Ok((inputs, shapes, want));
    }
    let mut axes = Vec::new();
    let mut sigs = Vec::new();
    for input in reference.inputs() {
        let name = input.name().to_string();
        let Some((_, shape, symbols)) = tensor_of(input.dtype()) else {
            // A map (DictVectorizer's features): no shape to search; `values::random_map`
            // fills it with the keys the graph names.
            sigs.push((name, Vec::new(), Vec::new(), None));
            continue;
        };
        let from_profile = profile.and_then(|p| p.opt.get(&name)).cloned();
        if from_profile.is_none() {
            for (i, &d) in shape.iter().enumerate() {
                if d < 0 {
                    axes.push(Axis {
                        input: name.clone(),
                        axis: i,
                        rank: shape.len(),
                        symbol: symbols.get(i).cloned().unwrap_or_default(),
                    });
                }
            }
        }
        sigs.push((name, shape, symbols, from_profile));
    }
    // The profile's opt shapes bind the plain symbols of the inputs they name, so other
    // inputs sharing a symbol get the same size.
    let mut bound = BTreeMap::new();
    for (_, shape, symbols, opt) in &sigs {
        let Some(opt) = opt else { continue };
        for (i, &d) in shape.iter().enumerate() {
            let sym = symbols.get(i).map(String::as_str).unwrap_or("");
            if d < 0 && !sym.is_empty() && leaves(sym) == [sym.to_string()] {
                if let Some(&v) = opt.get(i) {
                    bound.entry(sym.to_string()).or_insert(v);
                }
            }
        }
    }
    let facts = GraphFacts::read(model);
    let cands = with_graph_pins(&facts, &axes, &bound);
    let known = facts.known;
    let mut tried: Vec<(String, String)> = Vec::new();
    for c in &cands {
        let mut shapes = BTreeMap::new();
        let mut ok = true;
        for (name, shape, symbols, opt) in &sigs {
            let s = match opt {
                Some(o) => Some(o.clone()),
                None => shape_under(name, shape, symbols, &c.leaf),
            };
            match s {
                Some(s) => {
                    shapes.insert(name.clone(), s);
                }
                None => ok = false,
            }
        }
        if !ok {
            continue;
        }
        let inputs = random_inputs(reference, model, &shapes, cfg, &known)?;
        match run(reference, &inputs, model) {
            Ok(want) => {
                if !tried.is_empty() {
                    tracing::info!(shapes = ?shapes, candidate = %c.label, rejected = tried.len(), "validation inputs found by the default search");
                }
                return Ok((inputs, shapes, want));
            }
            Err(BuildError::Ort { message, .. }) => {
                tracing::debug!(candidate = %c.label, error = %message, "the original model rejects these inputs");
                tried.push((c.label.clone(), message));
            }
            Err(e) => return Err(e),
        }
    }
    let dynamic: Vec<(String, Vec<i64>)> = sigs
        .iter()
        .filter(|(n, shape, _, opt)| opt.is_none() && shape.iter().any(|&d| d < 0) && !n.is_empty())
        .map(|(n, shape, _, _)| (n.clone(), shape.clone()))
        .collect();
    Err(no_inputs(model, &axes, &dynamic, &tried))
}

/// What the graph itself says about its inputs, from one load of the model: the sizes its
/// weights fix and the sizes its shapes record ([`super::pins`]), and the values it names
/// ([`super::vocab`]). Empty when the model does not load (the reference's own error says
/// why).
#[derive(Default)]
struct GraphFacts {
    pins: BTreeMap<(String, usize), i64>,
    recorded: Vec<i64>,
    known: BTreeMap<String, vocab::Known>,
}

impl GraphFacts {
    fn read(model: &Path) -> Self {
        match crate::onnx::Model::load(model) {
            Ok(m) => {
                let g = m.graph();
                GraphFacts {
                    pins: super::pins::pins(g),
                    recorded: super::pins::recorded(g),
                    known: vocab::known(g),
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "no graph facts for the default inputs: the model does not load");
                GraphFacts::default()
            }
        }
    }
}

/// The default candidates, first with the sizes the graph's weights fix for free axes
/// ([`super::pins`]: an LSTM's input size, a MatMul's inner dimension) bound in every one,
/// then the plain search (in case a pin is wrong), at most [`MAX_CANDIDATES`] in all.
fn with_graph_pins(
    facts: &GraphFacts,
    axes: &[Axis],
    bound: &BTreeMap<String, i64>,
) -> Vec<Candidate> {
    let recorded = &facts.recorded;
    let plain = candidates(axes, bound, recorded);
    let pinned = super::pins::leaf_pins(&facts.pins, axes, bound);
    if pinned.is_empty() {
        return plain;
    }
    let what = pinned
        .iter()
        .map(|(l, v)| format!("{l} = {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    tracing::debug!(pins = %what, "sizes the graph's weights fix for free input axes");
    let mut with = bound.clone();
    with.extend(pinned);
    let mut out: Vec<Candidate> = candidates(axes, &with, recorded)
        .into_iter()
        .map(|mut c| {
            c.label = format!("{} (the weights fix {what})", c.label);
            c
        })
        .collect();
    for c in plain {
        if !out.iter().any(|o| o.leaf == c.leaf) {
            out.push(c);
        }
    }
    out.truncate(MAX_CANDIDATES);
    out
}

/// The error when no default candidate works: the inputs and axes, what was tried, ORT's
/// messages, and what to add.
fn no_inputs(
    model: &Path,
    axes: &[Axis],
    sigs: &[(String, Vec<i64>)],
    tried: &[(String, String)],
) -> BuildError {
    let axes_txt = if axes.is_empty() {
        "none: every input shape is fixed, so the random values themselves are refused".into()
    } else {
        axes.iter()
            .map(|a| {
                let sym = if a.symbol.is_empty() {
                    String::new()
                } else {
                    format!(" `{}`", a.symbol)
                };
                format!("`{}` axis {}{sym}", a.input, a.axis)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let first = tried.first().map(|t| t.1.as_str()).unwrap_or("");
    let last = tried.last().map(|t| t.1.as_str()).unwrap_or("");
    let example = if sigs.is_empty() {
        "`--opt-shapes NAME:1x…`".to_string()
    } else {
        format!(
            "`--opt-shapes {}` with sizes for N",
            sigs.iter()
                .map(|(n, shape)| {
                    let dims: Vec<String> = shape
                        .iter()
                        .map(|&d| {
                            if d < 0 {
                                "N".to_string()
                            } else {
                                d.to_string()
                            }
                        })
                        .collect();
                    format!("{n}:{}", dims.join("x"))
                })
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let name = crate::plan::sidecar_candidates(model)
        .first()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut msg = format!(
        "no default validation inputs that the original model (ONNX Runtime CPU, optimizations off) accepts: tried {} shape sets ({}) over the dynamic axes: {axes_txt}; ONNX Runtime: {first}",
        tried.len(),
        {
            let mut l: Vec<&str> = tried.iter().take(3).map(|t| t.0.as_str()).collect();
            let more = tried.len().saturating_sub(3);
            let tail = format!("and {more} more: other sizes up to {}, one axis at a time", SEARCH_SIZES[SEARCH_SIZES.len() - 1]);
            if more > 0 {
                l.push(&tail);
            }
            l.join("; ")
        },
    );
    if tried.len() > 1 && last != first {
        msg.push_str(&format!(" (last: {last})"));
    }
    msg.push_str(&format!(
        ". Fix: declare a shape profile ({example}, or [profiles] in {name}) or golden inputs (`--golden FILE.npz`, or [golden] npz = … in the sidecar)"
    ));
    bad(model, msg)
}

/// Runs `session` on `inputs` and returns every output read back, by name.
pub(crate) fn run(
    session: &mut Session,
    inputs: &[(String, DynValue)],
    path: &Path,
) -> Result<Outs, BuildError> {
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
        let o = values::read(v).map_err(|w| bad(path, format!("output `{name}`: {w}")))?;
        res.push((name, o));
    }
    Ok(res)
}

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
        max_ulps: crate::spec::float_step(elem, 1.0).map(|_| 0.0),
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
    let scale = rms(reference);
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
        if let (Some(u), Some(step)) = (
            e.max_ulps.as_mut(),
            crate::spec::float_step(elem, r.abs().max(scale)),
        ) {
            *u = u.max(d / step);
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

/// Validates `candidate` (a session on the artifact) against `model` run on ORT CPU with
/// optimizations disabled.
pub fn validate(
    rt: &Runtime,
    model: &Path,
    candidate: &mut Session,
    profile: Option<&ShapeProfile>,
    precision: Precision,
    cfg: &ValidationConfig,
    threads: usize,
) -> Result<ValidationReport, BuildError> {
    validate_with(rt, model, profile, precision, cfg, threads, &mut |inputs| {
        run(candidate, inputs, model)
    })
}

/// [`validate`] with any candidate: `candidate` runs the artifact on the inputs the
/// reference accepted (found as for every backend) and returns its outputs by name. The
/// `trt` backend runs its engine through the TensorRT shim here.
#[tracing::instrument(skip_all, fields(model = %model.display()))]
pub(crate) fn validate_with(
    rt: &Runtime,
    model: &Path,
    profile: Option<&ShapeProfile>,
    precision: Precision,
    cfg: &ValidationConfig,
    threads: usize,
    candidate: &mut dyn FnMut(&Inputs) -> Result<Outs, BuildError>,
) -> Result<ValidationReport, BuildError> {
    validate_keeping_inputs(rt, model, profile, precision, cfg, threads, candidate)
        .map(|(r, _, _)| r)
}

/// [`validate_with`], also returning the inputs it validated on, once the reference session
/// is closed (its threads gone, so timing the candidate on them competes with nothing), and
/// the reference's outputs on them (another run of the artifact is checked against those
/// with [`compare_outputs`], without the reference again).
pub(crate) fn validate_keeping_inputs(
    rt: &Runtime,
    model: &Path,
    profile: Option<&ShapeProfile>,
    precision: Precision,
    cfg: &ValidationConfig,
    threads: usize,
    candidate: &mut dyn FnMut(&Inputs) -> Result<Outs, BuildError>,
) -> Result<(ValidationReport, Inputs, Outs), BuildError> {
    let mut reference = super::cpu::open_raw(
        rt,
        model,
        ort::session::builder::GraphOptimizationLevel::Disable,
        threads,
    )?;
    let (inputs, shapes, want) = reference_inputs(&mut reference, model, profile, cfg)?;
    // Its intra-op threads spin a while after each run: gone before the candidate runs.
    drop(reference);
    let got = candidate(&inputs)?;
    let tol = cfg
        .tolerance
        .unwrap_or_else(|| Tolerance::default_for(precision));
    let outputs = compare_outputs(model, &want, &got, tol);
    let report = ValidationReport {
        passed: outputs.iter().all(|o| o.passed),
        tolerance: tol,
        seed: cfg.seed,
        golden: cfg.golden.as_ref().map(|p| p.display().to_string()),
        shapes,
        outputs,
        opt_level: None,
        rejected: Vec::new(),
        threads: None,
        prepack: None,
        rewrites: Vec::new(),
        reference: None,
    };
    Ok((report, inputs, want))
}

/// Each of the reference's outputs (`want`) against the candidate's (`got`, by name; a
/// missing one fails), within `tol`; float32/float64 outputs that are a Cast of a float16 or
/// bfloat16 tensor in `model` are compared at that type's resolution
/// ([`crate::onnx::resolution::half_outputs`]).
pub(crate) fn compare_outputs(
    model: &Path,
    want: &Outs,
    got: &Outs,
    tol: Tolerance,
) -> Vec<OutputError> {
    let half = match crate::onnx::Model::load(model) {
        Ok(m) => crate::onnx::resolution::half_outputs(m.graph()),
        Err(e) => {
            // The reference ran it, so it loads; if not, every output keeps its own type.
            tracing::debug!(error = %e, "no output resolutions: the model does not load");
            BTreeMap::new()
        }
    };
    let mut outputs = Vec::new();
    for (name, reference) in want {
        let e = match got.iter().find(|(n, _)| n == name) {
            Some((_, g)) => {
                values::compare_out_at(name, reference, g, tol, half.get(name).map(String::as_str))
            }
            None => OutputError {
                name: name.clone(),
                elements: 0,
                max_abs: UNBOUNDED,
                max_rel: UNBOUNDED,
                mismatched: 1,
                passed: false,
                non_finite: 0,
                dtype: None,
                rule: None,
                max_ulps: None,
            },
        };
        tracing::debug!(output = %name, dtype = ?e.dtype, max_abs = e.max_abs, max_rel = e.max_rel, max_ulps = ?e.max_ulps, passed = e.passed, "validated output");
        if e.non_finite > 0 {
            tracing::warn!(
                model = %model.display(),
                output = %name,
                non_finite = e.non_finite,
                elements = e.elements,
                "{}",
                non_finite_warning(&e)
            );
        }
        outputs.push(e);
    }
    outputs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_and_the_cli_probe_threads_under_the_same_default() {
        assert_eq!(
            crate::config::Limits::default().thread_probe_max_run_ms,
            DEFAULT_THREAD_PROBE_MAX_RUN_MS
        );
        assert_eq!(
            ValidationConfig::default().thread_probe_max_run_ms,
            DEFAULT_THREAD_PROBE_MAX_RUN_MS
        );
        assert_eq!(
            crate::config::Limits::default().prepack_probe_max_run_ms,
            DEFAULT_PREPACK_PROBE_MAX_RUN_MS
        );
        assert_eq!(
            ValidationConfig::default().prepack_probe_max_run_ms,
            DEFAULT_PREPACK_PROBE_MAX_RUN_MS
        );
    }

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
        };
        let back: ValidationReport =
            serde_json::from_slice(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(back, v);
    }
}
