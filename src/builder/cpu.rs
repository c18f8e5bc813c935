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
use std::time::{Duration, Instant};

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;

use super::backends::ort_cpu::passes;
use super::{validate, BackendImpl, BuildError, BuildOptions, Runtime, StagedArtifact};
use crate::cache::{PrepackProbe, ScaledProbe, ThreadProbe};
use crate::onnx::facts::Dim;
use crate::onnx::Model;
use crate::plan::ModelInputs;
use crate::spec::Backend;
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
fn prepare(m: &Model, rewrite: bool) -> (Option<Vec<u8>>, Vec<String>) {
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

/// Offline-optimized model for ONNX Runtime's CPU provider.
#[derive(Debug, Clone, Copy)]
pub struct OrtCpu;

/// What [`optimize`] builds from: the model's path, or its re-encoded bytes
/// ([`initializers_as_constants`]), and the dimensions to fix ([`fixed_dims`]).
struct Source<'a> {
    model: &'a Path,
    constants: Option<&'a [u8]>,
    dims: &'a BTreeMap<String, i64>,
}

/// How [`optimize`] saves the graph's initializers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Save {
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
fn optimize(
    rt: &Runtime,
    src: &Source,
    opts: &BuildOptions,
    out: &Path,
    save: Save,
) -> Result<(), BuildError> {
    let (model, entry) = (src.model, out.join(ENTRY));
    let stage = "optimize (ort-cpu)";
    let mut b = crate::builder::ort::base_builder(rt, model, opts.threads)?;
    if opts.opt_level == super::OptLevel::All && !tracing::enabled!(tracing::Level::DEBUG) {
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
                opts.external_min_bytes.to_string(),
            )
            .map_err(|e| BuildError::ort(stage, model, e))?;
        if opts.prepack {
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
fn reopen(rt: &Runtime, entry: &Path, opts: &BuildOptions) -> Result<Session, ort::Error> {
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
fn compact_saved(rt: &Runtime, entry: &Path, opts: &BuildOptions) -> Result<(), BuildError> {
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
fn fold_saved(
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
    let min = usize::try_from(opts.external_min_bytes).unwrap_or(usize::MAX);
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
fn clear(out: &Path) -> Result<(), BuildError> {
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

impl BackendImpl for OrtCpu {
    fn backend(&self) -> Backend {
        Backend::OrtCpu
    }

    fn check(&self, _rt: &Runtime) -> Result<(), BuildError> {
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(model = %model.display(), backend = %Backend::OrtCpu))]
    fn build(
        &self,
        rt: &Runtime,
        model: &Path,
        opts: &BuildOptions,
        out: &Path,
    ) -> Result<StagedArtifact, BuildError> {
        let m = Model::load(model).map_err(|e| BuildError::Model {
            path: model.to_path_buf(),
            message: e.to_string(),
        })?;
        let (constants, rewrites) = prepare(&m, opts.rewrite);
        let dims = match (opts.specialize, &opts.profile) {
            (true, Some(profile)) => fixed_dims(&ModelInputs::of(&m), profile),
            _ => BTreeMap::new(),
        };
        if !dims.is_empty() {
            tracing::info!(
                ?dims,
                "specializing the artifact to the profile's fixed dimensions"
            );
        }
        // Inline saves keep data files out of it: a model with external data keeps them.
        let control_flow =
            m.graph().node.iter().any(crate::onnx::attr::has_body) && m.external_files.is_empty();
        drop(m);
        let mut source = Source {
            model,
            constants: constants.as_deref(),
            dims: &dims,
        };
        let plain;
        let mut rewrites = rewrites;
        if let Err(e) = optimize(rt, &source, opts, out, Save::External) {
            if rewrites.is_empty() {
                return Err(e);
            }
            // ONNX Runtime's checks can be stricter on a rewritten graph than on the model
            // (an inlined `If` branch hands `Range` a one-element vector where ONNX's shape
            // inference wants a scalar, which ORT's kernel takes at run time): the rewrites
            // must never cost a model its artifact, so build it as given.
            tracing::warn!(error = %e, ?rewrites, "ONNX Runtime refused the rewritten graph; building the model without rewrites");
            clear(out)?;
            let m = Model::load(model).map_err(|e| BuildError::Model {
                path: model.to_path_buf(),
                message: e.to_string(),
            })?;
            plain = prepare(&m, false).0;
            source.constants = plain.as_deref();
            rewrites = Vec::new();
            optimize(rt, &source, opts, out, Save::External)?;
        }
        if control_flow {
            // ONNX Runtime's save with external initializers can write a control-flow graph
            // it then refuses to load (a Loop whose If branches both define `constant_in`:
            // "Graph must be in single static assignment (SSA) form"), at every level. The
            // same graph saved inline loads: check before validation sees the refusal.
            if let Err(e) = reopen(rt, &out.join(ENTRY), opts) {
                if e.code() != ort::error::ErrorCode::InvalidGraph {
                    return Err(BuildError::ort("open artifact", &out.join(ENTRY), e));
                }
                tracing::warn!(error = %e, "ONNX Runtime refuses the control-flow graph it saved with external initializers; saving it inline, without prepacked weights");
                clear(out)?;
                optimize(rt, &source, opts, out, Save::Inline)?;
            }
        }
        if opts.rewrite {
            for (_, pass) in passes::saved() {
                rewrites.extend(fold_saved(rt, out, opts, pass)?);
            }
        }
        compact_saved(rt, &out.join(ENTRY), opts)?;
        Ok(StagedArtifact {
            rewrites,
            ..optimized_artifact(out)
        })
    }

    fn open(&self, rt: &Runtime, entry: &Path, opts: &BuildOptions) -> Result<Session, BuildError> {
        open_artifact(rt, entry, opts.threads)
    }

    /// Validates as every backend does, then times the artifact's runs on the validation
    /// inputs with ONNX Runtime's default pool and on one thread ([`probe_threads`]).
    fn validate(
        &self,
        rt: &Runtime,
        model: &Path,
        artifact: &StagedArtifact,
        opts: &BuildOptions,
        cfg: &validate::ValidationConfig,
    ) -> Result<crate::cache::ValidationReport, BuildError> {
        let entry = artifact.dir.join(&artifact.entry);
        let mut session = self.open(rt, &entry, opts)?;
        // Timings say what suits the inputs they were taken on: inputs a consumer will feed
        // (golden ones, a profile's opt shapes, or the only shapes a static-shape artifact
        // takes) stand for themselves; the smallest sizes the default search finds for a
        // free dimension do not (a batch of 1 says little about a batch of 1,000), so one
        // thread must then also suit inputs scaled up ([`validate::scaled_shapes`]).
        let representative =
            cfg.golden.is_some() || opts.profile.is_some() || static_inputs(&session);
        let mut first = Duration::MAX;
        let (mut report, inputs, want) = validate::validate_keeping_inputs(
            rt,
            model,
            opts.profile.as_ref(),
            opts.precision,
            cfg,
            opts.threads,
            &mut |inputs| {
                let t = Instant::now();
                let out = validate::run(&mut session, inputs, &entry);
                first = t.elapsed();
                out
            },
        )?;
        if !report.passed && !artifact.rewrites.is_empty() {
            if let Some(mut exact) = exact_report(rt, model, artifact, opts, cfg, &mut session)? {
                exact.reference = Some(format!(
                    "{}; against ONNX Runtime's run of the model as given: {}",
                    passes::EXACT_REFERENCE,
                    report.worst()
                ));
                report = exact;
            }
        }
        // Only with ORT's default thread count (a build limited to N threads would compare
        // N with one) and for a run short enough to time cheaply.
        let cap = Duration::from_millis(cfg.thread_probe_max_run_ms);
        if report.passed && opts.threads == 0 && first <= cap {
            let scale = if representative {
                Scale::Fed
            } else {
                Scale::Batch(
                    validate::scaled_shapes(&session, &report.shapes, cfg),
                    super::validate::vocab::known_values(model),
                )
            };
            let probe = probe_threads(rt, &entry, &mut session, &inputs, scale, cfg, cap);
            report.threads = match probe {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %e, "thread probe failed; consumers keep ONNX Runtime's default threads");
                    None
                }
            };
        }
        let cap = Duration::from_millis(cfg.prepack_probe_max_run_ms);
        if report.passed && opts.threads == 0 && first <= cap {
            // With the thread count consumers are told.
            let threads = usize::from(report.threads.as_ref().is_some_and(|t| t.single));
            drop(session);
            // The same validation as the artifact's (inputs, the model's outputs on them,
            // tolerance), on the session consumers would open without prepacking.
            let tol = report.tolerance;
            let again = |unpacked: &mut Session| {
                let got = validate::run(unpacked, &inputs, &entry)?;
                let outputs = validate::compare_outputs(model, &want, &got, tol);
                Ok(outputs.iter().all(|o| o.passed))
            };
            report.prepack = match probe_prepack(rt, &entry, &inputs, threads, again) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %e, "prepack probe failed; consumers keep ONNX Runtime's prepacking");
                    None
                }
            };
        }
        Ok(report)
    }
}

/// For a rewritten artifact over tolerance against the model as given: the report against
/// [`passes::exact_reference`] (the rewritten ops computed
/// in float64; written next to the staging directory for the comparison and removed after)
/// when the artifact passes that, naming that reference; `None` when it does not either (the
/// pipeline then builds without rewrites) or there is no such reference.
fn exact_report(
    rt: &Runtime,
    model: &Path,
    artifact: &StagedArtifact,
    opts: &BuildOptions,
    cfg: &validate::ValidationConfig,
    session: &mut Session,
) -> Result<Option<crate::cache::ValidationReport>, BuildError> {
    use prost::Message;
    let m = Model::load(model).map_err(|e| BuildError::Model {
        path: model.to_path_buf(),
        message: e.to_string(),
    })?;
    let base = initializers_as_constants(&m);
    let Some(exact) = passes::exact_reference(base.as_ref().unwrap_or(&m.proto)) else {
        return Ok(None);
    };
    drop(m);
    let folder = artifact.dir.parent().unwrap_or(&artifact.dir);
    let io = |source| BuildError::Io {
        path: folder.to_path_buf(),
        source,
    };
    let mut file = tempfile::Builder::new()
        .prefix("reference-")
        .suffix(".onnx")
        .tempfile_in(folder)
        .map_err(io)?;
    std::io::Write::write_all(&mut file, &exact.encode_to_vec()).map_err(io)?;
    let entry = artifact.dir.join(&artifact.entry);
    let (mut report, _, _) = validate::validate_keeping_inputs(
        rt,
        file.path(),
        opts.profile.as_ref(),
        opts.precision,
        cfg,
        opts.threads,
        &mut |inputs| validate::run(session, inputs, &entry),
    )?;
    tracing::info!(
        passed = report.passed,
        "validated the rewritten artifact against the model with its rewritten ops in float64"
    );
    if !report.passed {
        return Ok(None);
    }
    report.reference = Some(passes::EXACT_REFERENCE.into());
    Ok(Some(report))
}

/// Whether every input of `session` has one size only: a tensor of fixed dimensions, or a
/// map (one sample, as DictVectorizer reads it: no batch to grow). A sequence's length is
/// free, like a free dimension.
fn static_inputs(session: &Session) -> bool {
    session.inputs().iter().all(|i| match i.dtype() {
        ort::value::ValueType::Tensor { shape, .. } => shape.iter().all(|&d| d > 0),
        ort::value::ValueType::Map { .. } => true,
        _ => false,
    })
}

/// Opens an artifact's graph the way the clients do: optimizations off (it is optimized),
/// weights packed on the intra-op threads; `threads` intra-op threads (0: ORT's default).
fn open_artifact(rt: &Runtime, entry: &Path, threads: usize) -> Result<Session, BuildError> {
    open_artifact_with(rt, entry, threads, true)
}

/// [`open_artifact`], with its constant weights prepacked or not
/// (`session.disable_prepacking`).
fn open_artifact_with(
    rt: &Runtime,
    entry: &Path,
    threads: usize,
    prepack: bool,
) -> Result<Session, BuildError> {
    let mut b = crate::builder::ort::base_builder(rt, entry, threads)?
        .with_optimization_level(GraphOptimizationLevel::Disable)
        .map_err(|e| BuildError::ort("open artifact", entry, e))?
        .with_config_entry("session.prepack.enable_parallel", "1")
        .map_err(|e| BuildError::ort("open artifact", entry, e))?;
    if !prepack {
        b = b
            .with_config_entry("session.disable_prepacking", "1")
            .map_err(|e| BuildError::ort("open artifact", entry, e))?;
    }
    b.commit_from_file(entry)
        .map_err(|e| BuildError::ort("open artifact", entry, e))
}

/// One timed run of `session` on `inputs`, in microseconds.
fn time_run(
    session: &mut Session,
    inputs: &validate::Inputs,
    entry: &Path,
) -> Result<f64, BuildError> {
    let feed: Vec<(&str, &ort::value::DynValue)> =
        inputs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t = Instant::now();
    drop(
        session
            .run(feed)
            .map_err(|e| BuildError::ort("run", entry, e))?,
    );
    Ok(t.elapsed().as_secs_f64() * 1e6)
}

/// The fastest run, to the nanosecond (the record shows `2.804`, not `2.8040000000000003`).
/// Not the median: the daemon builds beside other builds, and a busy core only ever adds
/// time, more to a pooled run (it needs two cores at once) than to one on a single thread,
/// so medians taken under load lean towards one thread; each way's fastest of the
/// alternating runs is what it does when the cores it uses are free.
fn fastest(v: Vec<f64>) -> f64 {
    let best = v.into_iter().fold(f64::INFINITY, f64::min);
    (best * 1e3).round() / 1e3
}

/// Alternating runs of `a` and `b` on `inputs` (so a drift in the machine's load falls on
/// both): at least [`validate::THREAD_PROBE_RUNS`] pairs, then more while
/// [`validate::PROBE_RUN_BUDGET`] lasts, up to [`validate::PROBE_MAX_RUNS`] (a microsecond
/// run's fastest of 9 moves by several per cent between builds, enough to flip a decision
/// taken at a 5 % margin; of 50, by under 1 %). Returns each way's fastest and the pairs run.
fn time_pairs(
    a: &mut Session,
    b: &mut Session,
    inputs: &validate::Inputs,
    entry: &Path,
) -> Result<(f64, f64, u32), BuildError> {
    let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
    let t = Instant::now();
    while on_a.len() < validate::THREAD_PROBE_RUNS as usize
        || (on_a.len() < validate::PROBE_MAX_RUNS as usize
            && t.elapsed() < validate::PROBE_RUN_BUDGET)
    {
        on_a.push(time_run(a, inputs, entry)?);
        on_b.push(time_run(b, inputs, entry)?);
    }
    let runs = on_a.len() as u32;
    Ok((fastest(on_a), fastest(on_b), runs))
}

/// A warm-up run of `a` and of `b` on `inputs`, then [`time_pairs`].
fn warm_pairs(
    a: &mut Session,
    b: &mut Session,
    inputs: &validate::Inputs,
    entry: &Path,
) -> Result<(f64, f64, u32), BuildError> {
    time_run(a, inputs, entry)?;
    time_run(b, inputs, entry)?;
    time_pairs(a, b, inputs, entry)
}

/// Times [`PrepackProbe::SESSIONS`] session creations of `entry` with its weights prepacked
/// and without, alternating, then (after a warm-up run each) runs of the last of each on
/// `inputs`, alternating ([`time_pairs`]); when the timings favour skipping
/// prepacking, times a fresh pair of sessions the same way, and when those agree, validates
/// the session without it (`validate_unpacked`: whether it passes)
/// and says whether consumers should skip it ([`PrepackProbe::disable`]). At most two of
/// these sessions are open at once.
fn probe_prepack(
    rt: &Runtime,
    entry: &Path,
    inputs: &validate::Inputs,
    threads: usize,
    validate_unpacked: impl FnOnce(&mut Session) -> Result<bool, BuildError>,
) -> Result<PrepackProbe, BuildError> {
    let (mut packed_us, mut unpacked_us) = (Vec::new(), Vec::new());
    let open = |prepack: bool, times: &mut Vec<f64>| {
        let t = Instant::now();
        let s = open_artifact_with(rt, entry, threads, prepack)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        Ok::<_, BuildError>(s)
    };
    let mut packed = open(true, &mut packed_us)?;
    let mut unpacked = open(false, &mut unpacked_us)?;
    for _ in 1..PrepackProbe::SESSIONS {
        drop(packed);
        packed = open(true, &mut packed_us)?;
        drop(unpacked);
        unpacked = open(false, &mut unpacked_us)?;
    }
    let (run_us, unpacked_run_us, runs) = warm_pairs(&mut packed, &mut unpacked, inputs, entry)?;
    let (session_us, unpacked_session_us) = (fastest(packed_us), fastest(unpacked_us));
    drop(packed);
    let mut suits =
        PrepackProbe::unpacked_suits(session_us, unpacked_session_us, run_us, unpacked_run_us);
    let mut confirm = None;
    if suits {
        // Skipping prepacking costs every run where the timings were wrong, and one pair of
        // sessions' fastest runs moves by up to ~10 % from the next pair's in the same
        // process: a second pair of fresh sessions must agree.
        drop(unpacked);
        let mut packed = open_artifact_with(rt, entry, threads, true)?;
        unpacked = open_artifact_with(rt, entry, threads, false)?;
        let (again, unpacked_again, _) = warm_pairs(&mut packed, &mut unpacked, inputs, entry)?;
        drop(packed);
        confirm = Some([again, unpacked_again]);
        suits =
            PrepackProbe::unpacked_suits(session_us, unpacked_session_us, again, unpacked_again);
    }
    let validated = if suits {
        Some(validate_unpacked(&mut unpacked)?)
    } else {
        None
    };
    let probe = PrepackProbe {
        session_us,
        unpacked_session_us,
        run_us,
        unpacked_run_us,
        runs,
        confirm_run_us: confirm,
        validated,
        disable: suits && validated == Some(true),
    };
    tracing::info!(
        session_us = format!("{session_us:.1}"),
        unpacked_session_us = format!("{unpacked_session_us:.1}"),
        run_us = format!("{run_us:.1}"),
        unpacked_run_us = format!("{unpacked_run_us:.1}"),
        confirm_run_us = ?confirm,
        validated = ?validated,
        disable = probe.disable,
        "timed the artifact's sessions and runs with its weights prepacked and without"
    );
    Ok(probe)
}

/// What the thread probe times besides the validation inputs.
enum Scale {
    /// Nothing: the validation inputs are what consumers feed (golden inputs, a profile's
    /// opt shapes, a static-shape model's only shapes).
    Fed,
    /// Inputs the default search sized: also the batch-scaled shapes
    /// ([`validate::scaled_shapes`]; `Err`: why there are none), which one thread must suit too, and
    /// the values the graph names for its inputs ([`super::vocab`]) to fill them with.
    Batch(
        Result<(i64, validate::Shapes), String>,
        BTreeMap<String, super::validate::vocab::Known>,
    ),
}

/// Times `pooled` (a session with ONNX Runtime's default intra-op pool, run once already)
/// against a new one-thread session of `entry` on `inputs`: one warm-up run of the new
/// session, then alternating runs ([`time_pairs`]), and says whether
/// one thread suits the artifact ([`ThreadProbe::single_suits`]). With [`Scale::Batch`],
/// one thread must also suit the scaled inputs ([`ScaledProbe::single_suits`]), whose
/// values are made only when one thread suits the validation inputs; scaled inputs that
/// cannot be made, that the model refuses, or whose first run is over `cap` are recorded and
/// advise the pool.
fn probe_threads(
    rt: &Runtime,
    entry: &Path,
    pooled: &mut Session,
    inputs: &validate::Inputs,
    scale: Scale,
    cfg: &validate::ValidationConfig,
    cap: Duration,
) -> Result<ThreadProbe, BuildError> {
    let mut single = open_artifact(rt, entry, 1)?;
    time_run(&mut single, inputs, entry)?;
    let (default_us, single_us, runs) = time_pairs(pooled, &mut single, inputs, entry)?;
    let mut fits = ThreadProbe::single_suits(default_us, single_us);
    let scaled = match scale {
        Scale::Fed => None,
        Scale::Batch(shaped, known) => {
            let mut p = ScaledProbe {
                factor: 1,
                shapes: Default::default(),
                default_us: None,
                single_us: None,
                runs: None,
                note: None,
            };
            match shaped {
                Err(why) => p.note = Some(why),
                Ok((factor, shapes)) => {
                    (p.factor, p.shapes) = (factor, shapes);
                    if fits {
                        time_scaled(&mut p, pooled, &mut single, entry, &known, cfg, cap)?;
                    } else if default_us > ThreadProbe::MAX_RUN_US {
                        p.note = Some(format!(
                            "not timed: the pooled run at the validation inputs is over {} µs",
                            ThreadProbe::MAX_RUN_US
                        ));
                    } else {
                        p.note =
                            Some("not timed: one thread is slower at the validation inputs".into());
                    }
                }
            }
            fits = fits && p.single_suits();
            Some(p)
        }
    };
    let probe = ThreadProbe {
        default_us,
        single_us,
        runs,
        single: fits,
        scaled,
    };
    tracing::info!(
        default_us = format!("{default_us:.1}"),
        single_us = format!("{single_us:.1}"),
        scaled = ?probe.scaled,
        single = probe.single,
        "timed the artifact's runs on ONNX Runtime's default pool and on one thread"
    );
    Ok(probe)
}

/// Times `pooled` and `single` on random inputs of `p.shapes` into `p`, or says in
/// `p.note` why not.
fn time_scaled(
    p: &mut ScaledProbe,
    pooled: &mut Session,
    single: &mut Session,
    entry: &Path,
    known: &BTreeMap<String, super::validate::vocab::Known>,
    cfg: &validate::ValidationConfig,
    cap: Duration,
) -> Result<(), BuildError> {
    let big = match validate::random_inputs(pooled, entry, &p.shapes, cfg, known) {
        Ok(big) => big,
        Err(e) => {
            p.note = Some(format!("the scaled inputs could not be made: {e}"));
            return Ok(());
        }
    };
    match time_run(pooled, &big, entry) {
        Ok(first) if first > cap.as_secs_f64() * 1e6 => {
            p.note = Some(format!(
                "a run took {:.1} ms, over the probe's budget (limits.thread_probe_max_run_ms)",
                first / 1e3
            ));
        }
        Ok(_) => {
            time_run(single, &big, entry)?;
            let (d, s, runs) = time_pairs(pooled, single, &big, entry)?;
            (p.default_us, p.single_us, p.runs) = (Some(d), Some(s), Some(runs));
        }
        Err(e) => p.note = Some(format!("the artifact refused them: {e}")),
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
