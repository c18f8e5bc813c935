//! The contract every backend implements ([`BackendImpl`]): check that it can run here,
//! build an artifact, open it the way consumers will, validate it, the optimization level it
//! builds at, and what to build again after a failed attempt ([`BackendImpl::next_attempt`]:
//! the backend's fallback ladder; the pipeline only walks it).

use std::collections::BTreeMap;
use std::path::Path;

use ort::session::Session;

use crate::builder::job::BuildJob;
use crate::builder::stage::Built;
use crate::builder::validate;
use crate::builder::{BuildError, BuildOptions, Fallback, OptLevel, Runtime, StagedArtifact};
use crate::spec::Backend;

/// Why an attempt gave no artifact to store, for [`BackendImpl::next_attempt`].
pub enum Failure<'a> {
    /// The build worker died of a fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE): the reason.
    Crashed(&'a str),
    /// The artifact was built and is over tolerance.
    OverTolerance(&'a Built),
}

/// What the next attempt changed, as the record and the progress output say it.
pub struct Retry {
    /// The line for the report's `rejected` list (`what: why`).
    pub rejected: String,
    /// What the attempt gives up (the progress step announcing it).
    pub fallback: Fallback,
}

/// How a [`Backend`] builds and serves artifacts.
pub trait BackendImpl: Send + Sync {
    /// Which backend this is.
    fn backend(&self) -> Backend;
    /// The options of `opts` that go into this backend's key, as canonical strings (the
    /// user's `extra` ones are added by
    /// [`BuildOptions::key_options`](crate::builder::BuildOptions::key_options)).
    fn key_options(&self, opts: &BuildOptions) -> BTreeMap<String, String>;
    /// Fails with the precise reason when the backend cannot run on this machine.
    fn check(&self, rt: &Runtime) -> Result<(), BuildError>;
    /// Builds the artifact for `model` into `out` (an empty staging directory).
    fn build(
        &self,
        rt: &Runtime,
        model: &Path,
        opts: &BuildOptions,
        out: &Path,
    ) -> Result<StagedArtifact, BuildError>;
    /// Opens a session on an artifact's graph file the way consumers will.
    fn open(&self, rt: &Runtime, entry: &Path, opts: &BuildOptions) -> Result<Session, BuildError>;
    /// Checks that an artifact (a fetched one) opens the way consumers will: by default an
    /// ONNX Runtime session on its entry.
    fn check_artifact(
        &self,
        rt: &Runtime,
        artifact: &StagedArtifact,
        opts: &BuildOptions,
    ) -> Result<(), BuildError> {
        self.open(rt, &artifact.dir.join(&artifact.entry), opts)
            .map(drop)
    }
    /// The graph optimization level `opts` builds at (`None`: the backend has none to
    /// lower): recorded when a fallback lowered it.
    fn opt_level(&self, _opts: &BuildOptions) -> Option<OptLevel> {
        None
    }
    /// After a failed attempt of `job`: changes `job` into the next attempt and says what
    /// changed, or `None` when there is nothing left to try (the failure stands). The key
    /// stays the one asked for; the stored artifact is always one that passed.
    fn next_attempt(&self, _job: &mut BuildJob, _failure: &Failure) -> Option<Retry> {
        None
    }
    /// Validates a built artifact against `model` (ONNX Runtime CPU on the raw model, see
    /// [`validate`]): by default through a session [`BackendImpl::open`] makes.
    fn validate(
        &self,
        rt: &Runtime,
        model: &Path,
        artifact: &StagedArtifact,
        opts: &BuildOptions,
        cfg: &validate::ValidationConfig,
    ) -> Result<crate::cache::ValidationReport, BuildError> {
        let mut session = self.open(rt, &artifact.dir.join(&artifact.entry), opts)?;
        validate::validate(
            rt,
            model,
            &mut session,
            opts.profile.as_ref(),
            opts.precision,
            cfg,
            opts.threads,
        )
    }
}
