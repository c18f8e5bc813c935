//! The contract every backend implements ([`BackendImpl`]): check that it can run here,
//! build an artifact, open it the way consumers will, validate it, the optimization level it
//! builds at, and what to build again after a failed attempt ([`BackendImpl::next_attempt`]:
//! the backend's fallback ladder; the pipeline only walks it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ort::session::Session;

use crate::builder::job::{BuildJob, Built};
use crate::builder::validate::{self, Inputs, Outs, ValidationConfig, ValidationReport};
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

/// Runs a built artifact on validation inputs: all a backend gives the validation
/// ([`BackendImpl::runner`]); the reference, the inputs and the comparison are the stage's.
pub trait Runner {
    /// The artifact's outputs on `inputs`, by name.
    fn run(&mut self, inputs: &Inputs) -> Result<Outs, BuildError>;
    /// The ONNX Runtime session the runner ran, and how long its last run took (`None`
    /// for a runner without one): what a backend's probe times further.
    fn into_session(self: Box<Self>) -> Option<(Session, Duration)> {
        None
    }
}

/// A [`Runner`] on an ONNX Runtime session; its errors name `path`.
pub struct SessionRunner {
    session: Session,
    path: PathBuf,
    last: Duration,
}

impl SessionRunner {
    pub fn new(session: Session, path: &Path) -> Self {
        Self {
            session,
            path: path.to_path_buf(),
            last: Duration::MAX,
        }
    }
}

impl Runner for SessionRunner {
    fn run(&mut self, inputs: &Inputs) -> Result<Outs, BuildError> {
        let t = Instant::now();
        let out = validate::run(&mut self.session, inputs, &self.path).map_err(BuildError::from);
        self.last = t.elapsed();
        out
    }

    fn into_session(self: Box<Self>) -> Option<(Session, Duration)> {
        Some((self.session, self.last))
    }
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
    /// Opens a runner on a built artifact for its validation against `model`: by default
    /// a session [`BackendImpl::open`] makes, its errors naming the model.
    fn runner(
        &self,
        rt: &Runtime,
        model: &Path,
        artifact: &StagedArtifact,
        opts: &BuildOptions,
    ) -> Result<Box<dyn Runner>, BuildError> {
        let session = self.open(rt, &artifact.dir.join(&artifact.entry), opts)?;
        Ok(Box::new(SessionRunner::new(session, model)))
    }
    /// After the validation: what the backend adds to its report (`validated`: the report,
    /// the inputs it ran and the reference's outputs on them), with the runner that ran.
    /// By default nothing.
    #[allow(clippy::too_many_arguments)]
    fn probe(
        &self,
        _rt: &Runtime,
        _model: &Path,
        _artifact: &StagedArtifact,
        _opts: &BuildOptions,
        _cfg: &ValidationConfig,
        _runner: Box<dyn Runner>,
        validated: (ValidationReport, Inputs, Outs),
    ) -> Result<ValidationReport, BuildError> {
        Ok(validated.0)
    }
}
