//! The validation's own error ([`ValidateError`]): inputs or outputs that do not fit, ONNX
//! Runtime refusing a run, a golden file that cannot be read. The build stage takes it as
//! the [`BuildError`] of the same words ([`From`]), so a record's reason reads as before.

use std::path::{Path, PathBuf};

use crate::builder::BuildError;

/// Why a validation could not run.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// The inputs or outputs do not fit the validation (golden arrays of the wrong type, no
    /// shapes the reference accepts, inputs over the size limit, an output missing).
    #[error("validation: {0}")]
    Invalid(String),
    /// ONNX Runtime refused a run at `stage` (its message, with what to do in front).
    #[error("{}: {stage}: {message}", path.display())]
    Ort {
        stage: &'static str,
        path: PathBuf,
        message: String,
    },
    /// A golden file cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ValidateError {
    /// ONNX Runtime's error at `stage`, explained as [`BuildError::ort`] explains it.
    pub(crate) fn ort(stage: &'static str, path: &Path, e: impl std::fmt::Display) -> Self {
        ValidateError::Ort {
            stage,
            path: path.to_path_buf(),
            message: crate::builder::ort::explain::ort_message(&e.to_string()),
        }
    }
}

impl From<ValidateError> for BuildError {
    fn from(e: ValidateError) -> Self {
        match e {
            ValidateError::Invalid(m) => BuildError::Validation(m),
            ValidateError::Ort {
                stage,
                path,
                message,
            } => BuildError::Ort {
                stage,
                path,
                message,
            },
            ValidateError::Io { path, source } => BuildError::Io { path, source },
        }
    }
}
