//! The `ort-cpu` backend: the model optimized offline for this CPU SKU by ONNX Runtime and
//! saved, with its prepacked constant initializers next to it; served with optimizations
//! disabled, so session creation skips graph rewriting. (ONNX Runtime still packs the weights
//! while it creates the session, to find the saved copy by the packed bytes' hash; the saved
//! copies then replace the heap ones, so the packed weights are file pages shared between
//! consumer processes rather than private memory. They do not make the session faster.)
//!
//! Enters: a model file (external data included). Leaves: `model.onnx` (with the
//! initializers under [`BuildOptions::external_min_bytes`]) plus, when ORT writes any,
//! `model.onnx.data` (the larger initializers, prepacked ones included) in the staging
//! directory. The external initializers file is always named explicitly: without it ORT
//! writes an optimized model that points at a data file it never wrote. One exception: a
//! control-flow graph (without external data of its own) that ONNX Runtime refuses to load
//! after that save is saved again with every initializer inline and no prepacked weights
//! (ONNX Runtime 1.31 breaks a Loop whose If branches share a constant's name).

use std::collections::BTreeMap;
use std::path::Path;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;

use super::passes;
use crate::builder::{BuildError, BuildOptions, Runtime, StagedArtifact};
use crate::onnx::facts::Dim;
use crate::onnx::Model;
use crate::plan::ModelInputs;
use crate::spec::ShapeProfile;

/// File name of the optimized graph inside the artifact.
pub const ENTRY: &str = "model.onnx";
/// File name of its external initializers.
pub const DATA: &str = "model.onnx.data";

/// The artifact ONNX Runtime wrote into `out` when saving an optimized model: the graph, and
/// its external initializers when there are any.
pub fn optimized_artifact(out: &Path) -> StagedArtifact {
    let mut files = vec![ENTRY.to_string()];
    if out.join(DATA).is_file() {
        files.push(DATA.to_string());
    }
    StagedArtifact {
        dir: out.to_path_buf(),
        entry: ENTRY.into(),
        files,
        rewrites: Vec::new(),
    }
}

/// The named dimensions `profile` fixes, by name: a dimension is fixed when the profile's
/// min and max agree at its position in every input that uses the name (ONNX Runtime
/// overrides free dimensions by name, model-wide). A name the profile leaves free anywhere,
/// gives two sizes, or that an input outside the profile uses, stays free; so do unnamed
/// dimensions. Empty when nothing can be fixed.
pub fn fixed_dims(inputs: &ModelInputs, profile: &ShapeProfile) -> BTreeMap<String, i64> {
    let mut fixed: BTreeMap<String, Option<i64>> = BTreeMap::new();
    for input in &inputs.0 {
        let Some(dims) = &input.shape else { continue };
        let min = profile.min.get(&input.name);
        let max = profile.max.get(&input.name);
        for (i, d) in dims.iter().enumerate() {
            let Dim::Named(name) = d else { continue };
            let size = match (min.and_then(|m| m.get(i)), max.and_then(|m| m.get(i))) {
                (Some(lo), Some(hi)) if lo == hi && *lo > 0 => Some(*lo),
                _ => None,
            };
            let slot = fixed.entry(name.clone()).or_insert(size);
            if *slot != size {
                *slot = None;
            }
        }
    }
    fixed
        .into_iter()
        .filter_map(|(name, size)| size.map(|s| (name, s)))
        .collect()
}

/// For an IR < 4 model (old Caffe2 and PyTorch exports), where the IR required every
/// initializer to be listed as a graph input too: the model re-encoded with those inputs
/// removed and the IR raised to 4, so ONNX Runtime treats the weights as constants. Built as
/// they are, ORT keeps them overridable: the saved artifact then takes inputs the original
/// never asked a caller for (`…__SHAPE` from folded shape arithmetic) and is slower.
/// The inputs a caller feeds are unchanged: ORT never counts initializer-backed inputs as
/// required inputs. `None` when nothing needs to change, or when the model has external
/// data (which resolves relative to the model's file, so it must be read from its path).
pub fn initializers_as_constants(m: &Model) -> Option<crate::onnx::proto::ModelProto> {
    if m.proto.ir_version >= 4 || !m.external_files.is_empty() {
        return None;
    }
    let g = m.graph();
    let inits: std::collections::HashSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    if !g.input.iter().any(|i| inits.contains(i.name.as_str())) {
        return None;
    }
    let mut proto = m.proto.clone();
    let graph = proto.graph.as_mut()?;
    graph.input.retain(|i| !inits.contains(i.name.as_str()));
    proto.ir_version = 4;
    tracing::info!(
        ir_version = m.proto.ir_version,
        "IR < 4: initializers listed as graph inputs are built as constants"
    );
    Some(proto)
}

/// What ONNX Runtime optimizes when it is not the model's file as it is: the model with
/// [`initializers_as_constants`] and, when `rewrite` is on, [`passes::apply`]'s rewrites,
/// encoded; and the rewrites applied, one line each. `(None, [])` when nothing changes, and
/// always for a model with external data (it must be read from its path).
pub(super) fn prepare(m: &Model, rewrite: bool) -> (Option<Vec<u8>>, Vec<String>) {
    use prost::Message;
    if !m.external_files.is_empty() {
        return (None, Vec::new());
    }
    let constants = initializers_as_constants(m);
    let rewritten = if rewrite {
        passes::apply(constants.as_ref().unwrap_or(&m.proto))
    } else {
        None
    };
    match (constants, rewritten) {
        (_, Some(r)) => (Some(r.model.encode_to_vec()), r.applied),
        (Some(p), None) => (Some(p.encode_to_vec()), Vec::new()),
        (None, None) => (None, Vec::new()),
    }
}

/// What [`optimize`] builds from: the model's path, or its re-encoded bytes
/// ([`initializers_as_constants`]), and the dimensions to fix ([`fixed_dims`]).
pub(super) struct Source<'a> {
    pub(super) model: &'a Path,
    pub(super) constants: Option<&'a [u8]>,
    pub(super) dims: &'a BTreeMap<String, i64>,
}

/// How [`optimize`] saves the graph's initializers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Save {
    /// Those of at least [`BuildOptions::external_min_bytes`] in `model.onnx.data`, with the
    /// prepacked weights when [`BuildOptions::prepack`] asks for them.
    External,
    /// All of them inside `model.onnx`, without prepacked weights (the fall-back for graphs
    /// ONNX Runtime cannot reload from the external save).
    Inline,
}

/// Has ONNX Runtime optimize `src` at `opts.opt_level` and save the result as `out/model.onnx`
/// (plus `out/model.onnx.data` when `save` is [`Save::External`] and any initializer goes
/// there).
pub(super) fn optimize(
    rt: &Runtime,
    src: &Source,
    opts: &BuildOptions,
    out: &Path,
    save: Save,
) -> Result<(), BuildError> {
    let (model, entry) = (src.model, out.join(ENTRY));
    let stage = "optimize (ort-cpu)";
    let mut b = crate::builder::ort::base_builder(rt, model, opts.threads)?;
    if opts.opt_level == crate::builder::OptLevel::All && !tracing::enabled!(tracing::Level::DEBUG)
    {
        // ORT warns that a level-All model is specific to this environment; the key pins
        // the SKU and the ORT version, so the warning is expected, not actionable.
        b = b
            .with_log_level(ort::logging::LogLevel::Error)
            .map_err(|e| BuildError::ort(stage, model, e))?;
    }
    let mut b = b
        .with_optimization_level(opts.opt_level.ort())
        .map_err(|e| BuildError::ort(stage, model, e))?
        .with_optimized_model_path(&entry)
        .map_err(|e| BuildError::ort(stage, model, e))?;
    if save == Save::External {
        b = b
            .with_config_entry(
                "session.optimized_model_external_initializers_file_name",
                DATA,
            )
            .map_err(|e| BuildError::ort(stage, model, e))?
            .with_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes",
                opts.ort_cpu.external_min_bytes.to_string(),
            )
            .map_err(|e| BuildError::ort(stage, model, e))?;
        if opts.ort_cpu.prepack {
            b = b
                .with_config_entry("session.save_external_prepacked_constant_initializers", "1")
                .map_err(|e| BuildError::ort(stage, model, e))?;
        }
    }
    for (name, size) in src.dims {
        b = b
            .with_dimension_override(name, *size)
            .map_err(|e| BuildError::ort(stage, model, e))?;
    }
    let session = match src.constants {
        Some(bytes) => b.commit_from_memory(bytes),
        None => b.commit_from_file(model),
    }
    .map_err(|e| BuildError::ort(stage, model, e))?;
    drop(session);
    if !entry.is_file() {
        return Err(BuildError::ort(
            stage,
            model,
            "ONNX Runtime did not write the optimized model",
        ));
    }
    Ok(())
}

/// A session on a saved artifact graph as consumers open it, with ONNX Runtime's own error.
pub(super) fn reopen(
    rt: &Runtime,
    entry: &Path,
    opts: &BuildOptions,
) -> Result<Session, ort::Error> {
    let mut b = Session::builder(&rt.env)?;
    if opts.threads > 0 {
        b = b.with_intra_threads(opts.threads)?;
    }
    b.with_optimization_level(GraphOptimizationLevel::Disable)?
        .commit_from_file(entry)
}

/// The saved graph trimmed by [`compact`](super::compact) (no `value_info`, doc strings or
/// long names), written in place; kept as ONNX Runtime wrote it when ORT will not open the
/// trimmed one (which validation would otherwise refuse).
pub(super) fn compact_saved(
    rt: &Runtime,
    entry: &Path,
    opts: &BuildOptions,
) -> Result<(), BuildError> {
    use prost::Message;
    let io = |source| BuildError::Io {
        path: entry.to_path_buf(),
        source,
    };
    let saved = std::fs::read(entry).map_err(io)?;
    let Ok(mut proto) = crate::onnx::proto::ModelProto::decode(&saved[..]) else {
        return Ok(()); // validation reports what ORT says of it
    };
    let renamed = super::compact::compact(&mut proto);
    let trimmed = proto.encode_to_vec();
    drop(proto);
    let tmp = entry.with_extension("onnx.compact");
    std::fs::write(&tmp, &trimmed).map_err(io)?;
    std::fs::rename(&tmp, entry).map_err(io)?;
    match reopen(rt, entry, opts) {
        Ok(_) => {
            tracing::debug!(
                bytes = saved.len(),
                trimmed = trimmed.len(),
                renamed,
                "trimmed the saved graph"
            );
            Ok(())
        }
        Err(e) => {
            tracing::warn!(error = %e, "ONNX Runtime refuses the trimmed graph; keeping the graph as it saved it");
            std::fs::write(entry, &saved).map_err(io)
        }
    }
}

/// The saved graph after one [`passes::Phase::Saved`] pass (`dequantize-constants`: the
/// constant `DequantizeLinear`s ONNX Runtime left folded into float constants), written in
/// place with the data file appended to; both restored, and `None`, when ORT will not open
/// the result (which validation would otherwise refuse). The report's line when it changed
/// anything.
pub(super) fn fold_saved(
    rt: &Runtime,
    out: &Path,
    opts: &BuildOptions,
    pass: passes::SavedPass,
) -> Result<Option<String>, BuildError> {
    use prost::Message;
    let (entry, data) = (out.join(ENTRY), out.join(DATA));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BuildError::Io { path, source }
    };
    let saved = std::fs::read(&entry).map_err(io(&entry))?;
    let Ok(mut proto) = crate::onnx::proto::ModelProto::decode(&saved[..]) else {
        return Ok(None); // validation reports what ORT says of it
    };
    let data_len = std::fs::metadata(&data).ok().map(|m| m.len());
    let min = usize::try_from(opts.ort_cpu.external_min_bytes).unwrap_or(usize::MAX);
    let line = pass(&mut proto, out, DATA, min).map_err(io(&data));
    let restore = || -> Result<(), BuildError> {
        std::fs::write(&entry, &saved).map_err(io(&entry))?;
        match data_len {
            Some(len) => std::fs::OpenOptions::new()
                .write(true)
                .open(&data)
                .and_then(|f| f.set_len(len))
                .map_err(io(&data)),
            None => match std::fs::remove_file(&data) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&data)(e)),
                _ => Ok(()),
            },
        }
    };
    let line = match line {
        Ok(Some(line)) => line,
        Ok(None) => return Ok(None),
        Err(e) => {
            restore()?;
            return Err(e);
        }
    };
    let tmp = entry.with_extension("onnx.folded");
    std::fs::write(&tmp, proto.encode_to_vec()).map_err(io(&tmp))?;
    drop(proto);
    std::fs::rename(&tmp, &entry).map_err(io(&entry))?;
    match reopen(rt, &entry, opts) {
        Ok(_) => Ok(Some(line)),
        Err(e) => {
            tracing::warn!(error = %e, "ONNX Runtime refuses the graph with its constant DequantizeLinear folded; keeping the graph as it saved it");
            restore()?;
            Ok(None)
        }
    }
}

/// Removes what a first save left in `out` (the staging directory holds nothing else).
pub(super) fn clear(out: &Path) -> Result<(), BuildError> {
    for name in [ENTRY, DATA] {
        let p = out.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(BuildError::Io { path: p, source }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::InputSig;

    fn input(name: &str, dims: &[&str]) -> InputSig {
        InputSig {
            name: name.into(),
            dtype: Some("int64".into()),
            shape: Some(
                dims.iter()
                    .map(|d| match d.parse() {
                        Ok(v) => Dim::Fixed(v),
                        Err(_) if d.is_empty() => Dim::Unknown,
                        Err(_) => Dim::Named(d.to_string()),
                    })
                    .collect(),
            ),
        }
    }

    fn profile(shapes: &[(&str, &[i64], &[i64])]) -> ShapeProfile {
        ShapeProfile {
            name: "p".into(),
            min: shapes
                .iter()
                .map(|(n, lo, _)| (n.to_string(), lo.to_vec()))
                .collect(),
            opt: shapes
                .iter()
                .map(|(n, lo, _)| (n.to_string(), lo.to_vec()))
                .collect(),
            max: shapes
                .iter()
                .map(|(n, _, hi)| (n.to_string(), hi.to_vec()))
                .collect(),
        }
    }

    #[test]
    fn fixed_dims_takes_names_the_profile_pins_everywhere() {
        let ids = ModelInputs(vec![
            input("ids", &["batch", "seq"]),
            input("mask", &["batch", "seq"]),
        ]);
        // Both pinned in both inputs.
        let p = profile(&[
            ("ids", &[1, 128], &[1, 128]),
            ("mask", &[1, 128], &[1, 128]),
        ]);
        let want: BTreeMap<String, i64> = [("batch".into(), 1), ("seq".into(), 128)].into();
        assert_eq!(fixed_dims(&ids, &p), want);
        // A range leaves that name free; the pinned one still counts.
        let p = profile(&[("ids", &[1, 1], &[1, 512]), ("mask", &[1, 1], &[1, 512])]);
        assert_eq!(fixed_dims(&ids, &p), [("batch".into(), 1)].into());
        // Two sizes for one name, or a range in one input: free.
        let p = profile(&[
            ("ids", &[1, 128], &[1, 128]),
            ("mask", &[2, 128], &[2, 512]),
        ]);
        assert!(fixed_dims(&ids, &p).is_empty());
        // An input the profile does not name keeps its names free.
        let p = profile(&[("ids", &[1, 128], &[1, 128])]);
        assert!(fixed_dims(&ids, &p).is_empty());
    }

    #[test]
    fn fixed_dims_ignores_unnamed_and_fixed_dimensions() {
        let ins = ModelInputs(vec![input("x", &["", "8", "n"])]);
        let p = profile(&[("x", &[4, 8, 3], &[4, 8, 3])]);
        assert_eq!(fixed_dims(&ins, &p), [("n".into(), 3)].into());
        let none = ModelInputs(vec![InputSig {
            name: "x".into(),
            dtype: None,
            shape: None,
        }]);
        assert!(fixed_dims(&none, &p).is_empty());
    }
}
