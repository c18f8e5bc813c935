//! Validation inputs: a golden `.npz` when one is given. Otherwise seeded random values whose shapes
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
use super::run::{bad, run, Outs};
use super::search::{
    batch_leaves, candidates, leaves, shape_under, tensor_of, unnamed, Axis, Candidate,
    MAX_CANDIDATES, REALISTIC_MAX_BYTES, SEARCH_SIZES,
};
use super::values;
use super::vocab;
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
        let v = from_graph
            .unwrap_or_else(|| values::random_value(input.dtype(), &dims, &mut rng, cfg.int_range))
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
pub(super) fn reference_inputs(
    reference: &mut Session,
    model: &Path,
    profile: Option<&ShapeProfile>,
    cfg: &ValidationConfig,
) -> Result<(Inputs, Shapes, Outs), ValidateError> {
    if let Some(g) = &cfg.golden {
        let (inputs, shapes) = golden_inputs(reference, g)?;
        let want = run(reference, &inputs, model).map_err(|e| match e {
            ValidateError::Ort { message, .. } => ValidateError::Invalid(format!(
                "the original model rejects the golden inputs in {}: {message}",
                g.display()
            )),
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
    // Candidates not run: over the byte budget, or at least as large as one memory ran out
    // on (with why).
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut exhausted: Vec<&BTreeMap<String, i64>> = Vec::new();
    // The first inputs the reference ran whose outputs are all constant, kept while the
    // next candidates are tried.
    let mut fallback: Option<(Inputs, Shapes, Outs)> = None;
    let mut fallback_tries = 0;
    for c in &cands {
        if fallback_tries >= NOT_EXERCISED_TRIES {
            break;
        }
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
        let inputs = match random_inputs(reference, model, &shapes, cfg, &known) {
            Ok(i) => i,
            Err(e) if out_of_memory(&e.to_string()) => {
                tracing::debug!(candidate = %c.label, error = %e, "out of memory making the inputs");
                exhausted.push(&c.leaf);
                tried.push((c.label.clone(), format!("out of memory: {e}")));
                continue;
            }
            Err(e) => return Err(e),
        };
        match run(reference, &inputs, model) {
            Ok(want) if !exercised(&want) && fallback_tries < NOT_EXERCISED_TRIES => {
                tracing::info!(candidate = %c.label, "every float output is constant on these inputs: not exercised, trying the next sizes");
                fallback_tries += 1;
                if fallback.is_none() {
                    fallback = Some((inputs, shapes, want));
                }
            }
            Ok(want) => {
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
        &axes,
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
        if !out.iter().any(|o| o.leaf == c.leaf) {
            out.push(c);
        }
    }
    out.truncate(MAX_CANDIDATES);
    out
}

/// What the default search did: the candidates run and ONNX Runtime's message for each, and
/// those not run (over the byte budget, or at least as large as one memory ran out on).
struct Tries<'a> {
    run: &'a [(String, String)],
    skipped: &'a [(String, String)],
}

/// Widest line of a refusal (a quoted ONNX Runtime message may be longer, as one line).
const WIDTH: usize = 100;
/// Most characters of an ONNX Runtime message a refusal quotes.
const QUOTE: usize = 320;

/// `text` in lines of at most [`WIDTH`] columns, broken at spaces only (a longer word keeps
/// its own line), every line after the first indented by `indent`.
fn wrap(text: &str, indent: &str) -> String {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for w in text.split(' ').filter(|w| !w.is_empty()) {
        let lead = if lines.is_empty() { 0 } else { indent.len() };
        if !cur.is_empty() && lead + cur.chars().count() + 1 + w.chars().count() > WIDTH {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines.join(&format!("\n{indent}"))
}

/// ONNX Runtime's message on one line, cut at a word boundary to [`QUOTE`] characters with
/// "…" (never inside a word; a single word longer than that is kept whole).
fn quote(message: &str) -> String {
    let one: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let one = one.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= QUOTE {
        return one;
    }
    let mut end = one.char_indices().nth(QUOTE).map_or(one.len(), |(i, _)| i);
    match one[..end].rfind(' ') {
        Some(sp) if sp > 0 => end = sp,
        _ => end = one[end..].find(' ').map_or(one.len(), |sp| end + sp),
    }
    format!("{} …", one[..end].trim_end())
}

/// Whether ONNX Runtime refused the values rather than the sizes (an index out of range, a
/// count a Range or Expand reads from the inputs): no shape profile can help then.
fn about_values(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "out of data bounds",
        "out of bounds",
        "out of range",
        "indices element",
        "idx=",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// Whether ONNX Runtime refused the sizes (shapes, ranks, dimensions): a profile may help.
fn about_sizes(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["shape", "rank", "dimension", "dims", "broadcast", "reshape"]
        .iter()
        .any(|w| m.contains(w))
}

/// The error when no default candidate works: what was tried and ONNX Runtime's messages,
/// then what helps, first golden inputs (the `np.savez` line with the model's input names and
/// the sidecar lines), then a shape profile, only when what ONNX Runtime refused was the
/// sizes. Several lines, each at most [`WIDTH`] columns but the quoted messages.
fn no_inputs(
    model: &Path,
    axes: &[Axis],
    sigs: &[(String, Vec<i64>)],
    names: &[String],
    tries: &Tries<'_>,
) -> ValidateError {
    let tried = tries.run;
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
    let listed = {
        let mut l: Vec<&str> = tried.iter().take(3).map(|t| t.0.as_str()).collect();
        let more = tried.len().saturating_sub(3);
        let tail = format!(
            "and {more} more: other sizes up to {}, one axis at a time",
            SEARCH_SIZES[SEARCH_SIZES.len() - 1]
        );
        if more > 0 {
            l.push(&tail);
        }
        l.join("; ")
    };
    let stem = model
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let sidecar = crate::plan::sidecar_candidates(model)
        .first()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let npz = format!("{stem}.golden.npz");
    // The first line short: the build's context goes in front of it.
    let mut out: Vec<String> = vec![
        "no default validation inputs that the original model accepts.".into(),
        wrap(
            &format!(
                "ONNX Runtime (CPU, optimizations off) refused the {} shape sets tried ({listed}) over the dynamic axes: {axes_txt}",
                tried.len()
            ),
            "  ",
        ),
    ];
    if !tried.is_empty() {
        out.push(format!("ONNX Runtime: {}", quote(first)));
    }
    if tried.len() > 1 && last != first {
        out.push(format!("last: {}", quote(last)));
    }
    if let Some((label, why)) = tries.skipped.first() {
        out.push(wrap(
            &format!(
                "not run: {} shape sets, the first ({label}) because {why}",
                tries.skipped.len()
            ),
            "  ",
        ));
    }
    let arrays = if names.is_empty() {
        "x=…".to_string()
    } else {
        names
            .iter()
            .map(|n| {
                if n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !n.starts_with(|c: char| c.is_ascii_digit())
                {
                    format!("{n}=…")
                } else {
                    format!("**{{\"{n}\": …}}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push(
        "What helps: golden inputs, the inputs the model really takes, one array per input:".into(),
    );
    out.push(format!(
        "  {}",
        wrap(&format!("np.savez(\"{npz}\", {arrays})"), "      ")
    ));
    out.push(format!(
        "then either these lines in {sidecar} next to the model:"
    ));
    out.push("  [golden]".into());
    out.push(format!("  npz = \"{npz}\""));
    out.push(format!("or `--golden {npz}` on the command line."));
    let values = tried.iter().any(|t| about_values(&t.1));
    let sizes = tried.iter().any(|t| about_sizes(&t.1));
    if values {
        out.push(wrap(
            "A shape profile cannot help: ONNX Runtime refused the input values (an index or a count \
             read from them), not their sizes.",
            "  ",
        ));
    } else if sizes || tried.is_empty() {
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
        out.push(wrap(
            &format!(
                "Or, as ONNX Runtime refused the sizes, a shape profile: {example}, or [profiles] in {sidecar}."
            ),
            "  ",
        ));
    }
    ValidateError::Invalid(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(input: &str, symbol: &str) -> Axis {
        Axis {
            input: input.into(),
            axis: 0,
            rank: 1,
            symbol: symbol.into(),
        }
    }

    fn lines_fit(msg: &str) {
        for l in msg.lines() {
            let quoted = l.starts_with("ONNX Runtime: ") || l.starts_with("last: ");
            assert!(quoted || l.chars().count() <= WIDTH, "too long: {l}");
        }
    }

    #[test]
    fn refusal_leads_with_golden_inputs_and_cuts_only_between_words() {
        let long = format!(
            "Non-zero status code returned while running Gather node. Name:'/Gather' Status Message: indices element out of data bounds, idx=40 must be within the inclusive range [-3,2] {}noteToCharIndexExpandedShape",
            "and more words ".repeat(30)
        );
        let tried = vec![
            ("every dynamic dimension 1".to_string(), long.clone()),
            ("batch 1, the rest 2".to_string(), long),
        ];
        let e = no_inputs(
            Path::new("/m/voice.onnx"),
            &[axis("durations", "n"), axis("phonemes", "n")],
            &[
                ("durations".into(), vec![-1]),
                ("phonemes".into(), vec![-1]),
            ],
            &["durations".into(), "phonemes".into(), "past.0.key".into()],
            &Tries {
                run: &tried,
                skipped: &[],
            },
        )
        .to_string();
        lines_fit(&e);
        for want in [
            "  np.savez(\"voice.golden.npz\", durations=…, phonemes=…, **{\"past.0.key\": …})",
            "voice.trtcache.toml",
            "  [golden]\n  npz = \"voice.golden.npz\"",
            "--golden voice.golden.npz",
            "A shape profile cannot help",
        ] {
            assert!(e.contains(want), "missing `{want}` in:\n{e}");
        }
        assert!(!e.contains("--opt-shapes"), "{e}");
        assert!(!e.contains("noteToChar"), "cut inside a word? {e}");
        let golden = e.find("What helps").unwrap();
        assert!(golden < e.find("cannot help").unwrap());
        // Every cut ends a word.
        for l in e.lines().filter(|l| l.ends_with('…')) {
            assert!(l.ends_with(" …"), "{l}");
        }
    }

    #[test]
    fn a_profile_is_suggested_when_the_sizes_were_refused() {
        let tried = vec![(
            "every dynamic dimension 1".to_string(),
            "Reshape: the input tensor cannot be reshaped to the requested shape".to_string(),
        )];
        let skipped = vec![(
            "batch 1, the rest 640".to_string(),
            "validation inputs need at least 3 bytes".to_string(),
        )];
        let e = no_inputs(
            Path::new("m.onnx"),
            &[axis("x", "n")],
            &[("x".into(), vec![-1])],
            &["x".into()],
            &Tries {
                run: &tried,
                skipped: &skipped,
            },
        )
        .to_string();
        lines_fit(&e);
        assert!(e.contains("--opt-shapes x:N"), "{e}");
        assert!(e.contains("not run: 1 shape sets"), "{e}");
        assert!(e.find("np.savez").unwrap() < e.find("--opt-shapes").unwrap());
    }

    #[test]
    fn quotes_cut_between_words() {
        let q = quote(&"word ".repeat(100));
        assert!(
            q.ends_with("word …") && q.chars().count() <= QUOTE + 2,
            "{q}"
        );
        assert_eq!(quote("short\nmessage"), "short message");
    }

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
