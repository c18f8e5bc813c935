//! The `ort-cpu` fallback ladder: what a failed attempt is built again without.
//!
//! ONNX Runtime can crash on an artifact where it runs the model (1.31 segfaults running
//! ppocrv5_rec's conv-affine artifact with its prepacked weights saved, and runs it without
//! them): the worker's death costs the saved prepacked weights first (memory shared between
//! consumers, no speed), then the thread and prepack probes (sessions the consumers' defaults
//! would open some other way: an optimization, never worth the artifact), then the graph
//! passes, never the artifact. A rewritten artifact over tolerance (against the model and
//! against its exact reference) is built again without the passes first; then, like every
//! ONNX Runtime backend, one optimization level lower ([`levels`]), with the passes again
//! when the artifact without them was over tolerance too (they were not the cause). The key
//! stays the one asked for.

use crate::builder::backends::backend::{Failure, Retry};
use crate::builder::backends::levels;
use crate::builder::job::BuildJob;
use crate::builder::validate::ValidationConfig;
use crate::builder::Fallback;

/// The next attempt of `job` after `failure` (see the module's ladder).
pub(super) fn next_attempt(job: &mut BuildJob, failure: &Failure) -> Option<Retry> {
    match failure {
        Failure::Crashed(why) => {
            if !(job.options.ort_cpu.prepack
                || probes(&job.validation)
                || job.options.ort_cpu.rewrite)
            {
                return None;
            }
            let what = if job.options.ort_cpu.prepack {
                job.options.ort_cpu.prepack = false;
                "prepack"
            } else if probes(&job.validation) {
                job.validation.thread_probe_max_run_ms = 0;
                job.validation.prepack_probe_max_run_ms = 0;
                "probes"
            } else {
                job.options.ort_cpu.rewrite = false;
                "rewrites"
            };
            tracing::warn!(%why, what, "the build worker died; building again without {what}");
            Some(Retry {
                fallback: Fallback::WorkerDied {
                    without: what.into(),
                },
                rejected: format!("{what}: {why}"),
            })
        }
        Failure::OverTolerance(built) if !built.artifact.rewrites.is_empty() => {
            let worst = built.validation.worst();
            tracing::warn!(%worst, "rewritten artifact over tolerance; building it again without rewrites");
            job.options.ort_cpu.rewrite = false;
            job.rewrites_dropped = true;
            Some(Retry {
                fallback: Fallback::WithoutRewrites,
                rejected: format!("rewrites at {}: {worst}", job.options.opt_level.name()),
            })
        }
        Failure::OverTolerance(built) => {
            let retry = levels::lower(job.options.opt_level, built, |l| job.options.opt_level = l)?;
            // Over tolerance without the rewrites as with them: they were not the cause
            // (smart_turn's int8 path is 2.0e-3 off at `all` both ways), and a lower level
            // without them would lose what they save for nothing (its constant weights
            // dequantized again on every run).
            if std::mem::take(&mut job.rewrites_dropped) {
                job.options.ort_cpu.rewrite = true;
            }
            Some(retry)
        }
    }
}

/// Whether a build times the thread or the prepack probe.
fn probes(v: &ValidationConfig) -> bool {
    v.thread_probe_max_run_ms > 0 || v.prepack_probe_max_run_ms > 0
}
