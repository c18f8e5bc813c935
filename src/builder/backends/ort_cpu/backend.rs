//! The `ort-cpu` backend ([`OrtCpu`]): built by [`super::save`] (optimized offline and
//! saved), opened the way consumers open it, validated as every backend is and then timed
//! by [`super::probes`]; a rewritten artifact over tolerance is first held to the exact
//! reference ([`passes::exact_reference`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ort::session::Session;

use super::passes;
use super::probes::{open_artifact, probe_prepack, probe_threads, static_inputs, Scale};
use super::save::{
    clear, compact_saved, fixed_dims, fold_saved, initializers_as_constants, optimize,
    optimized_artifact, prepare, reopen, Save, Source, ENTRY,
};
use crate::builder::backends::backend::{BackendImpl, Failure, Retry, Runner, SessionRunner};
use crate::builder::job::BuildJob;
use crate::builder::validate::{self, Inputs, Outs, ValidationReport};
use crate::builder::{BuildError, BuildOptions, OptLevel, Runtime, StagedArtifact};
use crate::onnx::Model;
use crate::plan::ModelInputs;
use crate::spec::Backend;

/// Offline-optimized model for ONNX Runtime's CPU provider.
#[derive(Debug, Clone, Copy)]
pub struct OrtCpu;

impl BackendImpl for OrtCpu {
    fn backend(&self) -> Backend {
        Backend::OrtCpu
    }

    fn opt_level(&self, opts: &BuildOptions) -> Option<OptLevel> {
        Some(opts.opt_level)
    }

    fn key_options(&self, opts: &BuildOptions) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("opt_level".into(), opts.opt_level.name().into());
        m.insert("prepack".into(), opts.ort_cpu.prepack.to_string());
        m.insert(
            "external_min_bytes".into(),
            opts.ort_cpu.external_min_bytes.to_string(),
        );
        m.insert("specialize".into(), opts.ort_cpu.specialize.to_string());
        let rewrites = if opts.ort_cpu.rewrite {
            passes::key_list()
        } else {
            "none".into()
        };
        m.insert("rewrites".into(), rewrites);
        m
    }

    fn next_attempt(&self, job: &mut BuildJob, failure: &Failure) -> Option<Retry> {
        super::ladder::next_attempt(job, failure)
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
        let (constants, rewrites) = prepare(&m, opts.ort_cpu.rewrite);
        let dims = match (opts.ort_cpu.specialize, &opts.profile) {
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
        if opts.ort_cpu.rewrite {
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

    /// A session opened as consumers open it, its errors naming the artifact's graph file.
    fn runner(
        &self,
        rt: &Runtime,
        _model: &Path,
        artifact: &StagedArtifact,
        opts: &BuildOptions,
    ) -> Result<Box<dyn Runner>, BuildError> {
        let entry = artifact.dir.join(&artifact.entry);
        let session = self.open(rt, &entry, opts)?;
        Ok(Box::new(SessionRunner::new(session, &entry)))
    }

    /// A rewritten artifact over tolerance is held to the exact reference; one that passed
    /// is timed with ONNX Runtime's default pool and on one thread ([`probe_threads`]), and
    /// opened without prepacking ([`probe_prepack`]).
    fn probe(
        &self,
        rt: &Runtime,
        model: &Path,
        artifact: &StagedArtifact,
        opts: &BuildOptions,
        cfg: &validate::ValidationConfig,
        runner: Box<dyn Runner>,
        validated: (ValidationReport, Inputs, Outs),
    ) -> Result<ValidationReport, BuildError> {
        let entry = artifact.dir.join(&artifact.entry);
        let Some((mut session, first)) = runner.into_session() else {
            return Ok(validated.0);
        };
        let (mut report, inputs, want) = validated;
        // Timings say what suits the inputs they were taken on: inputs a consumer will feed
        // (golden ones, a profile's opt shapes, or the only shapes a static-shape artifact
        // takes) stand for themselves; the smallest sizes the default search finds for a
        // free dimension do not (a batch of 1 says little about a batch of 1,000), so one
        // thread must then also suit inputs scaled up ([`validate::scaled_shapes`]).
        let representative =
            cfg.golden.is_some() || opts.profile.is_some() || static_inputs(&session);
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
                    validate::vocab::known_values(model),
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
        &mut |inputs| validate::run(session, inputs, &entry).map_err(BuildError::from),
        // A crash here is the rewritten reference's: the ladder drops the rewrites.
        &|_| {},
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
