//! The build stage's error: building, opening and validating artifacts, and the worker that
//! does it. [`BuildError::is_host_problem`] is the line between the machine's failures
//! (retried, never remembered against the model) and the model's.

use std::path::PathBuf;

use crate::libs::onnxruntime::RuntimeError;

/// Errors of building, opening and validating artifacts.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("{provider} execution provider is not available: {message}\nfix: {fix}")]
    ProviderMissing {
        provider: &'static str,
        message: String,
        fix: &'static str,
    },
    #[error("{}: {stage}: {message}", path.display())]
    Ort {
        stage: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Model { path: PathBuf, message: String },
    #[error("validation: {0}")]
    Validation(String),
    #[error(transparent)]
    Store(#[from] crate::cache::StoreError),
    #[error(transparent)]
    Key(#[from] crate::key::KeyError),
    #[error("the build was cancelled")]
    Cancelled,
    /// The build worker was killed (a deadline, a limit, the OOM killer), aborted, exited
    /// with an error or lost its answer (the reason names which): the model's failure.
    #[error("{0}")]
    Worker(String),
    /// The build worker died of a fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE): the model's
    /// failure, after the pipeline has built an `ort-cpu` artifact again without saved
    /// prepacked weights and without rewrites (ONNX Runtime can crash on a saved artifact
    /// where it runs the model).
    #[error("{0}")]
    Crashed(String),
    /// The build worker died of a fault while ONNX Runtime ran the *original* model on the
    /// default validation inputs `inputs` (a candidate of the search): the runtime's fault at
    /// those sizes, not the artifact's. The pipeline validates again without that candidate
    /// ([`crate::builder::Fallback::ReferenceCrashed`]), a bounded number of times.
    #[error("{why} (ONNX Runtime ran the original model at {inputs})")]
    ReferenceCrashed { inputs: String, why: String },
    /// No build worker could be started or reaped: the machine's problem, not the model's.
    #[error("{0}")]
    WorkerUnavailable(String),
    /// The build worker was killed by SIGKILL from outside (the kernel's OOM killer under
    /// host pressure, an admin): neither its own limits nor a cancellation did it, so the
    /// build is tried again a bounded number of times (`limits.worker_kill_retries`) before
    /// it counts as the model's failure.
    #[error("{0}")]
    Killed(String),
    /// The artifact is bigger than the cache may hold (`limits.cache_size_bytes`): storing
    /// it would evict every other artifact and then itself. The model's final answer (until
    /// it or the limit changes), never stored.
    #[error("the artifact is {bytes} bytes, more than the whole cache may hold (limits.cache_size_bytes = {limit}; for `trtcache build`, --max-size); raise the limit to build and serve it")]
    TooLarge { bytes: u64, limit: u64 },
    /// The model's files changed since it was keyed; nothing was stored.
    #[error("{0}")]
    Changed(String),
    /// The `trt` backend: TensorRT or its shim missing ([`crate::trt::TrtError::Unavailable`],
    /// the host's problem), or a parse, build or run that failed (the model's).
    #[error(transparent)]
    Trt(#[from] crate::trt::TrtError),
}

impl BuildError {
    /// Whether the failure is this machine's (a missing library or provider, no worker), not
    /// the model's: it is not remembered against the model.
    pub fn is_host_problem(&self) -> bool {
        match self {
            BuildError::Runtime(_)
            | BuildError::ProviderMissing { .. }
            | BuildError::WorkerUnavailable(_) => true,
            BuildError::Trt(t) => t.is_host_problem(),
            _ => false,
        }
    }
}
