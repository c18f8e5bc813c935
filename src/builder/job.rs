//! What the pipeline is asked to build ([`BuildJob`], with [`BuildJob::from_plan`] the one
//! mapping of a resolved [`Plan`] to a request, for the CLI's `build` and the daemon alike)
//! and what it answers ([`BuildOutcome`]).

use std::path::PathBuf;

use super::validate::ValidationConfig;
use super::BuildOptions;
use super::StagedArtifact;
use crate::cache::{Record, Served, ValidationReport};
use crate::plan::Plan;
use crate::spec::{Backend, CacheKey};

/// What to build.
#[derive(Clone, Debug)]
pub struct BuildJob {
    pub model: PathBuf,
    pub backend: Backend,
    pub options: BuildOptions,
    pub validation: ValidationConfig,
    /// Rebuild even when a record exists (a failed one, or to refresh).
    pub force: bool,
    /// Set by a fallback ladder that built an attempt again without its graph rewrites
    /// (the artifact with them was over tolerance): when that one is over tolerance too, the
    /// rewrites were not what moved it, and the next optimization level down has them again.
    pub rewrites_dropped: bool,
}

impl BuildJob {
    pub fn new(model: impl Into<PathBuf>, backend: Backend) -> Self {
        Self {
            model: model.into(),
            backend,
            options: BuildOptions::default(),
            validation: ValidationConfig::default(),
            force: false,
            rewrites_dropped: false,
        }
    }

    /// The request for `model` as `plan` resolved it: the plan's profile, precision,
    /// `specialize` (unless `options` turned it off), tolerance and golden settings;
    /// everything else from `options`. The one mapping of a plan to a build, for
    /// `trtcache build` and the daemon alike (flags that override the plan's validation
    /// settings are applied to the result by the CLI).
    pub fn from_plan(
        model: impl Into<PathBuf>,
        backend: Backend,
        plan: &Plan,
        options: BuildOptions,
    ) -> Self {
        Self {
            model: model.into(),
            backend,
            options: options.for_plan(plan),
            validation: ValidationConfig {
                seed: plan.golden.seed,
                int_range: (plan.golden.int_range[0], plan.golden.int_range[1]),
                tolerance: Some(plan.tolerance),
                golden: plan.golden.npz.clone(),
                ..ValidationConfig::default()
            },
            force: false,
            rewrites_dropped: false,
        }
    }
}

/// Where the outcome came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Built by this call.
    Built,
    /// Found in the store.
    Cached,
}

/// The result of [`Builder::build`].
#[derive(Clone, Debug)]
pub struct BuildOutcome {
    pub key: CacheKey,
    pub source: Source,
    pub record: Record,
    /// Set when the record is servable.
    pub served: Option<Served>,
    /// Why it is not servable, when it is not.
    pub unservable: Option<String>,
}

/// What one attempt built and how it validated (in process or from the worker).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Built {
    pub artifact: StagedArtifact,
    pub validation: ValidationReport,
    pub build_ms: u64,
}
