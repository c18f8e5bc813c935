//! Validation inputs: a golden `.npz` when one is given. Otherwise seeded random values whose shapes
//! come from a search that stops at the first set the *reference* (the original model under
//! ONNX Runtime CPU, optimizations off) runs: the profile's opt shape for every input it
//! names (binding its symbolic dimensions for the other inputs); one value per symbolic
//! dimension name, shared by every input that uses it, with exporters' expressions such as
//! `past_sequence + sequence` evaluated from their parts; realistic sizes first (a batch of 2,
//! sequences of 16, image sides of 32), then every dimension 1, then cache lengths (`past*`) 0,
//! then the sizes of [`super::search::SEARCH_SIZES`] for every non-batch dimension (batch
//! stays 1). A set over the byte budget is skipped; one memory runs out on ends the sets at
//! least as large; one on which every float output is constant is kept only until a few more
//! sets have been tried. When no candidate runs, the error ([`super::refusal`]) gives ONNX
//! Runtime's messages and says what helps (golden inputs; a profile for sizes). Floats are uniform in
//! [-1, 1), integers uniform in `int_range` (default [0, 2), safe for ids, masks and
//! indices), bools fair coins, strings the decimals of such integers; every element type
//! ONNX Runtime runs is read back and compared ([`super::values`]): floats with the tolerance
//! (float16/bfloat16 outputs also within steps of their own type at the output's scale:
//! [`super::compare::compare_as`]), integers, bools and strings exactly, maps key by key, sequences item by
//! item.
//!
//! Enters: the reference session, the model path, the profile and the [`ValidationConfig`].
//! Leaves: the inputs, their shapes and the reference's outputs on them, or a
//! [`ValidateError::Invalid`] naming the inputs and axes tried.

use std::collections::BTreeMap;
use std::path::Path;

use ort::session::Session;
use ort::value::{DynValue, TensorElementType, ValueType};

use super::config::{ValidationConfig, THREAD_PROBE_SCALE, THREAD_PROBE_SCALED_MAX_BYTES};
use super::error::ValidateError;
use super::refusal::{no_inputs, Tries};
use super::run::{bad, run, Outs};
use super::search::{
    batch_leaves, candidates, leaf_of, leaves, shape_under, tensor_of, Axis, Candidate,
    MAX_CANDIDATES, REALISTIC_MAX_BYTES,
};
use super::values;
use super::vocab;
use crate::builder::Progress;
use crate::plan::ShapeProfile;
use crate::rng::SplitMix64;

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
/// Inputs from a golden `.npz`, one array per session input.
fn golden_inputs(session: &Session, gpath: &Path) -> Result<(Inputs, Shapes), ValidateError> {
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

/// Whether the random inputs of `shapes` fit `cfg.max_input_bytes`, with checked
/// arithmetic: a fixed float32[100000, 100000] input (40 GB) or a shape whose element count
/// overflows is refused before any allocation (`Err`: why, naming the input).
fn over_budget(session: &Session, shapes: &Shapes, cfg: &ValidationConfig) -> Result<(), String> {
    let mut total: u64 = 0;
    for input in session.inputs() {
        let dims = shapes.get(input.name()).cloned().unwrap_or_default();
        let what = format!("input `{}` {dims:?}", input.name());
        total = input_bytes(input.dtype(), &dims)
            .and_then(|b| total.checked_add(b))
            .ok_or_else(|| format!("{what}: the element count overflows"))?;
        if total > cfg.max_input_bytes {
            return Err(format!(
                "validation inputs need at least {total} bytes ({what}), over limits.validation_max_bytes ({})",
                cfg.max_input_bytes
            ));
        }
    }
    Ok(())
}

/// Whether ONNX Runtime's (or the allocator's) message says memory ran out: the inputs are
/// too large for this host, and so is every larger candidate.
fn out_of_memory(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("bad_alloc")
        || m.contains("failed to allocate")
        || m.contains("out of memory")
        || m.contains("allocation failed")
}

/// Candidates tried after one on which every float output is constant, before that one is
/// used all the same (validation runs on every build).
const NOT_EXERCISED_TRIES: usize = 4;

/// Whether the outputs say the inputs exercised the model: `false` when it has float outputs
/// of two or more elements and every one of them is constant (all zeros, or one value
/// throughout: a ReLU network on inputs its first layer zeroes, a 1×1 image through a
/// pooling head).
fn exercised(outs: &Outs) -> bool {
    use super::values::{Data, Out};
    let mut judged = false;
    for (_, o) in outs {
        if let Out::Tensor {
            data: Data::Float(v),
            ..
        } = o
        {
            if v.len() >= 2 {
                judged = true;
                if v.iter().any(|x| x.to_bits() != v[0].to_bits()) {
                    return true;
                }
            }
        }
    }
    !judged
}

/// Whether candidate `c` is at least as large as `than` in every leaf (a larger size along
/// some axis, the rest the same or larger).
fn at_least(c: &BTreeMap<String, i64>, than: &BTreeMap<String, i64>) -> bool {
    than.iter().all(|(l, v)| c.get(l).is_some_and(|cv| cv >= v))
}

/// Seeded random inputs for the session's inputs with `shapes`.
pub(crate) fn random_inputs(
    session: &Session,
    _model: &Path,
    shapes: &Shapes,
    cfg: &ValidationConfig,
    known: &BTreeMap<String, vocab::Known>,
) -> Result<Inputs, ValidateError> {
    over_budget(session, shapes, cfg).map_err(|why| {
        ValidateError::Invalid(format!(
            "{why}; give golden inputs (--golden or [golden] npz), a smaller profile, or raise the limit"
        ))
    })?;
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
        // An attention mask of ones, as consumers feed it: random 0s and 1s give attention
        // that reads its lengths from the mask (GroupQueryAttention's `seqlens_k`) lengths
        // shorter than the sequence, which it refuses.
        let range = if name.to_ascii_lowercase().contains("attention_mask") {
            (1, 2)
        } else {
            cfg.int_range
        };
        let v = from_graph
            .unwrap_or_else(|| values::random_value(input.dtype(), &dims, &mut rng, range))
            .map_err(|w| ValidateError::Invalid(format!("input `{name}`: {w}")))?;
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
    let (on, off): (Vec<&Axis>, Vec<&Axis>) =
        axes.iter().partition(|a| batch.contains(&leaf_of(a)));
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

/// An input's name, shape (`-1` dynamic), symbols and the profile's opt shape for it.
type Sig = (String, Vec<i64>, Vec<String>, Option<Vec<i64>>);

/// The reference's inputs as the search sees them: the dynamic axes the profile leaves free,
/// each input's [`Sig`], and the sizes the profile's opt shapes bind.
fn signatures(
    reference: &Session,
    profile: Option<&ShapeProfile>,
) -> (Vec<Axis>, Vec<Sig>, BTreeMap<String, i64>) {
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
    (axes, sigs, bound)
}

/// Finds inputs the reference accepts and its outputs on them: the golden file when one is
/// given, else the profile's opt shapes and the bounded search of [`candidates`]. Each
/// candidate's reference run is announced first ([`Progress::TryingInputs`]) and the end of
/// the search after it ([`Progress::InputsFound`]), so the worker's parent knows on which
/// sizes ONNX Runtime died, if it does; candidates in `cfg.avoid_inputs` are not run.
pub(super) fn reference_inputs(
    reference: &mut Session,
    model: &Path,
    profile: Option<&ShapeProfile>,
    cfg: &ValidationConfig,
    progress: &dyn Fn(&Progress),
) -> Result<(Inputs, Shapes, Outs, Option<Second>), ValidateError> {
    let found = match &cfg.golden {
        Some(g) => golden_reference(reference, model, g).map(|(i, s, o)| (i, s, o, None)),
        None => {
            // Read once, for the search and for its second run.
            let (axes, sigs, bound) = signatures(reference, profile);
            let facts = GraphFacts::read(model);
            let sig = Signature {
                axes: &axes,
                sigs: &sigs,
                bound: &bound,
            };
            search_inputs(reference, model, cfg, progress, &sig, &facts).map(|(i, s, o)| {
                let second =
                    second_inputs(reference, model, &axes, &facts.known, &s, cfg, progress);
                (i, s, o, second)
            })
        }
    };
    progress(&Progress::InputsFound);
    found
}

/// The reference's inputs as the search sees them ([`signatures`]).
struct Signature<'a> {
    axes: &'a [Axis],
    sigs: &'a [Sig],
    bound: &'a BTreeMap<String, i64>,
}

/// The golden file's inputs and the reference's outputs on them.
fn golden_reference(
    reference: &mut Session,
    model: &Path,
    g: &Path,
) -> Result<(Inputs, Shapes, Outs), ValidateError> {
    let (inputs, shapes) = golden_inputs(reference, g)?;
    let want = run(reference, &inputs, model).map_err(|e| match e {
        ValidateError::Ort { message, .. } => ValidateError::Invalid(format!(
            "the original model rejects the golden inputs in {}: {message}",
            g.display()
        )),
        e => e,
    })?;
    Ok((inputs, shapes, want))
}

/// A second set of validation inputs and the reference's outputs on them.
pub(crate) type Second = (Inputs, Shapes, Outs);

/// The label of the second validation run ([`second_inputs`]), as progress and
/// `avoid_inputs` name it.
pub(super) const SECOND_LABEL: &str = "every free batch axis doubled (the second validation run)";

/// The default search's inputs (`shapes`) with every free batch axis doubled, new random
/// values, and the reference's outputs on them: a second run that catches an artifact right
/// at one batch and wrong, or crashing, at another. `None` when the model has no free batch
/// axis, the inputs would take over [`REALISTIC_MAX_BYTES`] (or the budget), the reference
/// refuses them, or an earlier attempt's reference crashed on them.
fn second_inputs(
    reference: &mut Session,
    model: &Path,
    axes: &[Axis],
    known: &BTreeMap<String, vocab::Known>,
    shapes: &Shapes,
    cfg: &ValidationConfig,
    progress: &dyn Fn(&Progress),
) -> Option<Second> {
    if cfg.avoid_inputs.iter().any(|a| a == SECOND_LABEL) {
        return None;
    }
    let batch = batch_leaves(axes);
    let mut doubled = shapes.clone();
    let mut any = false;
    for a in axes {
        if !batch.contains(&leaf_of(a)) {
            continue;
        }
        if let Some(d) = doubled.get_mut(&a.input).and_then(|d| d.get_mut(a.axis)) {
            *d = d.saturating_mul(2).max(2);
            any = true;
        }
    }
    if !any {
        return None;
    }
    let small = ValidationConfig {
        max_input_bytes: cfg.max_input_bytes.min(REALISTIC_MAX_BYTES),
        // Other values than the first run's.
        seed: cfg.seed.wrapping_add(1),
        ..cfg.clone()
    };
    if let Err(why) = over_budget(reference, &doubled, &small) {
        tracing::debug!(%why, "no second validation run");
        return None;
    }
    let inputs = match random_inputs(reference, model, &doubled, &small, known) {
        Ok(i) => i,
        Err(e) => {
            tracing::debug!(error = %e, "no second validation run");
            return None;
        }
    };
    progress(&Progress::TryingInputs(SECOND_LABEL.to_string()));
    match run(reference, &inputs, model) {
        Ok(want) => Some((inputs, doubled, want)),
        Err(e) => {
            tracing::debug!(error = %e, shapes = ?doubled, "the original model refuses the doubled batch: no second validation run");
            None
        }
    }
}

/// The default search: the profile's opt shapes and the bounded [`candidates`], the first set
/// the reference runs (and exercises).
fn search_inputs(
    reference: &mut Session,
    model: &Path,
    cfg: &ValidationConfig,
    progress: &dyn Fn(&Progress),
    sig: &Signature,
    facts: &GraphFacts,
) -> Result<(Inputs, Shapes, Outs), ValidateError> {
    let Signature { axes, sigs, bound } = *sig;
    let cands = with_graph_pins(facts, axes, bound);
    let known = &facts.known;
    let mut tried: Vec<(String, String)> = Vec::new();
    // Candidates not run: over the byte budget, or at least as large as one memory ran out
    // on (with why).
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut exhausted: Vec<&BTreeMap<String, i64>> = Vec::new();
    // The first inputs the reference ran whose outputs are all constant, kept while the
    // next candidates are tried.
    let mut fallback: Option<(Inputs, Shapes, Outs)> = None;
    let mut fallback_tries = 0;
    // The sets run already (a realistic set and a plain one can be the same).
    let mut ran: Vec<&BTreeMap<String, i64>> = Vec::new();
    for c in &cands {
        if fallback_tries >= NOT_EXERCISED_TRIES {
            break;
        }
        if ran.contains(&&c.leaf) {
            continue;
        }
        if cfg.avoid_inputs.contains(&c.label) {
            skipped.push((
                c.label.clone(),
                "ONNX Runtime crashed running the original model on these sizes".into(),
            ));
            continue;
        }
        let mut shapes = BTreeMap::new();
        let mut ok = true;
        for (name, shape, symbols, opt) in sigs {
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
        if c.realistic {
            let small = ValidationConfig {
                max_input_bytes: cfg.max_input_bytes.min(REALISTIC_MAX_BYTES),
                ..cfg.clone()
            };
            if let Err(why) = over_budget(reference, &shapes, &small) {
                tracing::debug!(candidate = %c.label, %why, "realistic validation sizes skipped");
                continue;
            }
        }
        if let Err(why) = over_budget(reference, &shapes, cfg) {
            tracing::debug!(candidate = %c.label, %why, "validation candidate skipped");
            skipped.push((c.label.clone(), why));
            continue;
        }
        if exhausted.iter().any(|e| at_least(&c.leaf, e)) {
            skipped.push((
                c.label.clone(),
                "no smaller than a set memory ran out on".into(),
            ));
            continue;
        }
        ran.push(&c.leaf);
        let inputs = match random_inputs(reference, model, &shapes, cfg, known) {
            Ok(i) => i,
            Err(e) if out_of_memory(&e.to_string()) => {
                tracing::debug!(candidate = %c.label, error = %e, "out of memory making the inputs");
                exhausted.push(&c.leaf);
                tried.push((c.label.clone(), format!("out of memory: {e}")));
                continue;
            }
            Err(e) => return Err(e),
        };
        progress(&Progress::TryingInputs(c.label.clone()));
        match run(reference, &inputs, model) {
            Ok(want) if !exercised(&want) && fallback_tries < NOT_EXERCISED_TRIES => {
                tracing::info!(candidate = %c.label, "every float output is constant on these inputs: not exercised, trying the next sizes");
                fallback_tries += 1;
                if fallback.is_none() {
                    fallback = Some((inputs, shapes, want));
                }
            }
            Ok(want) => {
                if !c.realistic && c.leaf.values().all(|&v| v <= 1) {
                    tracing::warn!(shapes = ?shapes, "the model refused the realistic sizes; validated on degenerate inputs (every dynamic dimension 1 or 0): golden inputs or a profile validate it better");
                }
                if !tried.is_empty() || !skipped.is_empty() {
                    tracing::info!(shapes = ?shapes, candidate = %c.label, rejected = tried.len(), skipped = skipped.len(), "validation inputs found by the default search");
                }
                return Ok((inputs, shapes, want));
            }
            Err(ValidateError::Ort { message, .. }) => {
                tracing::debug!(candidate = %c.label, error = %message, "the original model rejects these inputs");
                if out_of_memory(&message) {
                    exhausted.push(&c.leaf);
                }
                // The realistic sizes are a preference: the refusal reports the search.
                if !c.realistic {
                    tried.push((c.label.clone(), message));
                }
            }
            Err(e) => return Err(e),
        }
    }
    if let Some((inputs, shapes, want)) = fallback {
        tracing::warn!(shapes = ?shapes, "validation inputs do not exercise the model: every float output is constant on every candidate tried; golden inputs would validate it");
        return Ok((inputs, shapes, want));
    }
    let dynamic: Vec<(String, Vec<i64>)> = sigs
        .iter()
        .filter(|(n, shape, _, opt)| opt.is_none() && shape.iter().any(|&d| d < 0) && !n.is_empty())
        .map(|(n, shape, _, _)| (n.clone(), shape.clone()))
        .collect();
    let names: Vec<String> = sigs.iter().map(|s| s.0.clone()).collect();
    Err(no_inputs(
        model,
        axes,
        &dynamic,
        &names,
        &Tries {
            run: &tried,
            skipped: &skipped,
        },
    ))
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
        if !out
            .iter()
            .any(|o| o.leaf == c.leaf && o.realistic == c.realistic)
        {
            out.push(c);
        }
    }
    out.truncate(MAX_CANDIDATES);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_outputs_are_not_exercised() {
        use crate::builder::validate::values::{Data, Out};
        let t = |v: Vec<f64>| Out::Tensor {
            ty: "float32".into(),
            shape: vec![v.len() as i64],
            data: Data::Float(v),
        };
        let ids = Out::Tensor {
            ty: "int64".into(),
            shape: vec![2],
            data: Data::Exact(vec![3, 4]),
        };
        assert!(!exercised(&vec![("y".into(), t(vec![0.0; 4]))]));
        assert!(!exercised(&vec![
            ("y".into(), t(vec![0.5; 4])),
            ("z".into(), t(vec![0.0; 2]))
        ]));
        assert!(exercised(&vec![
            ("y".into(), t(vec![0.0; 4])),
            ("z".into(), t(vec![0.0, 1.0]))
        ]));
        // One element, or no float output: nothing to judge.
        assert!(exercised(&vec![("y".into(), t(vec![0.0]))]));
        assert!(exercised(&vec![("c".into(), ids)]));
    }

    #[test]
    fn out_of_memory_and_larger_candidates() {
        assert!(out_of_memory("input `sample`: std::bad_alloc"));
        assert!(out_of_memory(
            "Failed to allocate memory for requested buffer of size 34359738368"
        ));
        assert!(!out_of_memory("Reshape failed"));
        let small: BTreeMap<String, i64> = [("a".into(), 32), ("b".into(), 1)].into();
        let big: BTreeMap<String, i64> = [("a".into(), 64), ("b".into(), 1)].into();
        let other: BTreeMap<String, i64> = [("a".into(), 1), ("b".into(), 64)].into();
        assert!(at_least(&big, &small));
        assert!(at_least(&small, &small));
        assert!(!at_least(&other, &small));
    }
}
