//! The contract every backend implements ([`BackendImpl`]): check that it can run here,
//! build an artifact, open it the way consumers will, and validate it.

use std::path::Path;

use ort::session::Session;

use crate::builder::validate;
use crate::builder::{BuildError, BuildOptions, Runtime, StagedArtifact};
use crate::spec::Backend;

/// How a [`Backend`] builds and serves artifacts.
pub trait BackendImpl: Send + Sync {
    /// Which backend this is.
    fn backend(&self) -> Backend;
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
