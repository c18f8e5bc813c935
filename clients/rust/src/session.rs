//! `ort` feature: turns an acquired [`Artifact`] into a running `ort` session. A graph with no
//! external data is opened through `/proc/self/fd/N`; a graph with external data is opened
//! through a private temporary folder of symlinks (`model.onnx` and each external file's
//! `location`) pointing at `/proc/self/fd/N`, so ONNX Runtime resolves the data by name while
//! reading the daemon's read-only descriptors. The folder is removed once the session exists.

use std::path::{Component, Path, PathBuf};

use ort::session::builder::SessionBuilder;
use ort::session::Session;

use crate::client::Artifact;

/// Why an artifact could not become a session.
#[derive(Debug)]
pub enum SessionError {
    /// Reading a descriptor or preparing the symlink folder failed.
    Io(std::io::Error),
    /// An external file's name is not a plain relative path.
    BadName(String),
    /// ONNX Runtime refused the model.
    Ort(String),
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::Io(e) => write!(f, "preparing the artifact: {e}"),
            SessionError::BadName(n) => {
                write!(f, "external data name `{n}` is not a relative path")
            }
            SessionError::Ort(e) => write!(f, "ONNX Runtime: {e}"),
        }
    }
}

impl std::error::Error for SessionError {}

impl From<std::io::Error> for SessionError {
    fn from(e: std::io::Error) -> Self {
        SessionError::Io(e)
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn private_dir() -> std::io::Result<TempDir> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let p = std::env::temp_dir().join(format!(
        "trtcache-artifact-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&p)?;
    Ok(TempDir(p))
}

fn plain_relative(name: &str) -> bool {
    let p = Path::new(name);
    !name.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)))
}

impl Artifact {
    /// Opens an `ort` session from this artifact with `builder` (providers, threads and
    /// optimisation level are the caller's choice).
    pub fn session(&self, builder: &mut SessionBuilder) -> Result<Session, SessionError> {
        let procs = self.proc_paths();
        if self.files.len() == 1 {
            // ONNX Runtime opens the descriptor through /proc (no copy into this process).
            return builder
                .commit_from_file(&procs[0])
                .map_err(|e| SessionError::Ort(e.to_string()));
        }
        if self.files.is_empty() {
            return Err(SessionError::Io(std::io::Error::other(
                "artifact has no files",
            )));
        }
        let dir = private_dir()?;
        let mut graph = dir.0.join("model.onnx");
        for (i, (meta, proc_path)) in self.metadata.files.iter().zip(&procs).enumerate() {
            let link = if i == 0 {
                graph.clone()
            } else {
                if !plain_relative(&meta.name) {
                    return Err(SessionError::BadName(meta.name.clone()));
                }
                dir.0.join(&meta.name)
            };
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::os::unix::fs::symlink(proc_path, &link)?;
            if i == 0 {
                graph = link;
            }
        }
        builder
            .commit_from_file(&graph)
            .map_err(|e| SessionError::Ort(e.to_string()))
    }
}
