//! `ort` feature: turns an acquired [`Artifact`] into a running `ort` session. When the daemon
//! sent the artifact's directory (`dir_fd`), the graph is opened in place as
//! `/proc/self/fd/D/<graph name>`, so ONNX Runtime finds the external data next to it by name
//! (the fastest way: it reads the files themselves). Otherwise, or when that path is not
//! usable (the directory is not searchable by this uid, a file there is not the one sent, the
//! artifact was evicted since), a graph with no external data is opened through
//! `/proc/self/fd/N`, and a graph with external data through a private temporary folder
//! (`model.onnx` and each external file's `location`) of symlinks pointing at
//! `/proc/self/fd/N` or, when a file was removed since it was sent (evicted by `rm`, `gc` or
//! the LRU: ONNX Runtime resolves an external file's real path, which a removed file no
//! longer has), of copies read from the descriptors; that folder is removed once the session
//! exists. So the descriptors stay enough for a session whatever happens to the cache.
//! ONNX Runtime reads (or maps) everything while it creates the session, so the session does
//! not need the descriptors afterwards.

use std::path::{Component, Path, PathBuf};

use ort::session::builder::SessionBuilder;
use ort::session::Session;

use crate::client::Artifact;
use crate::protocol::AcquireRequest;
use crate::watch::{FollowError, Follower};

/// Why an artifact could not become a session.
#[derive(Debug)]
pub enum SessionError {
    /// Reading a descriptor or preparing the symlink folder failed.
    Io(std::io::Error),
    /// An external file's name is not a plain relative path.
    BadName(String),
    /// ONNX Runtime refused the model.
    Ort(String),
    /// The artifact was built for another ONNX Runtime than the one this process loaded
    /// (its metadata's `runtime`); acquire with [`crate::Client::set_runtime`] to get the one
    /// built for this version.
    RuntimeMismatch {
        /// The version the artifact was built and validated with.
        artifact: String,
        /// The version this process loaded.
        loaded: String,
    },
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::Io(e) => write!(f, "preparing the artifact: {e}"),
            SessionError::BadName(n) => {
                write!(f, "external data name `{n}` is not a relative path")
            }
            SessionError::Ort(e) => write!(f, "ONNX Runtime: {e}"),
            SessionError::RuntimeMismatch { artifact, loaded } => write!(
                f,
                "the artifact was built for onnxruntime {artifact}, this process loaded {loaded}: acquire it with Client::set_runtime(Some(Runtime::onnxruntime(\"{loaded}\")))"
            ),
        }
    }
}

impl std::error::Error for SessionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SessionError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for SessionError {
    fn from(e: std::io::Error) -> Self {
        SessionError::Io(e)
    }
}

/// Adds `session.prepack.enable_parallel=1` to `builder`: ONNX Runtime then packs the
/// weights on the session's intra-op threads instead of one (measured on the 4-layer BERT
/// artifact: 9.6 → 8.0 ms per session, BENCHMARKS.md). Versions without the key ignore it;
/// a builder that refuses it is left as it was.
fn parallel_prepack(builder: &mut SessionBuilder) {
    if let Ok(b) = builder
        .clone()
        .with_config_entry("session.prepack.enable_parallel", "1")
    {
        *builder = b;
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
    /// The settings [`Artifact::session`] adds to a caller's builder: parallel prepacking,
    /// and no prepacking at all when the metadata's session hints say so.
    fn session_settings(&self, builder: &mut SessionBuilder) {
        parallel_prepack(builder);
        let hinted = self.metadata.session_hints.as_ref();
        if hinted.and_then(|h| h.disable_prepacking) == Some(true) {
            if let Ok(b) = builder
                .clone()
                .with_config_entry("session.disable_prepacking", "1")
            {
                *builder = b;
            }
        }
    }

    /// The graph's path through the directory descriptor, `/proc/self/fd/D/<graph name>`,
    /// when the daemon sent the directory and every file of the artifact opens there as the
    /// very file whose descriptor was sent (same device and inode); `None` otherwise (no
    /// directory, not searchable by this uid, names that are not plain, a file gone).
    pub fn dir_graph_path(&self) -> Option<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.dir_proc_path()?;
        let graph = self.metadata.files.first()?;
        if !plain_relative(&graph.name) || graph.name.contains('/') {
            return None;
        }
        if self.files.len() != self.metadata.files.len() {
            return None;
        }
        for (meta, sent) in self.metadata.files.iter().zip(&self.files) {
            if !plain_relative(&meta.name) {
                return None;
            }
            let here = std::fs::File::open(dir.join(&meta.name))
                .and_then(|f| f.metadata())
                .ok()?;
            let sent = sent.metadata().ok()?;
            if (here.dev(), here.ino()) != (sent.dev(), sent.ino()) {
                return None;
            }
        }
        Some(dir.join(&graph.name))
    }

    /// Opens an `ort` session from this artifact with `builder` (providers, threads and
    /// optimisation level are the caller's choice): in place through the directory
    /// descriptor when [`Artifact::dir_graph_path`] allows, else through the per-file
    /// descriptors. Adds `session.prepack.enable_parallel=1` to `builder` (weights packed on
    /// the session's intra-op threads), and `session.disable_prepacking=1` when the
    /// metadata's [`crate::SessionHints::disable_prepacking`] says the build found the
    /// artifact's runs no slower without prepacked weights. The thread count stays the
    /// caller's: [`crate::SessionHints::intra_op_num_threads`] says when the build found one
    /// intra-op thread no slower (`builder.with_intra_threads(1)`).
    ///
    /// An artifact with a free input dimension pays ONNX Runtime's memory-reuse planning,
    /// which grows with the square of its symbolic-shape tensors and which ONNX Runtime's C
    /// API cannot turn off (the Python client does): about 3 ms of an 11 ms session on a
    /// 4-layer BERT, seconds on a 20,000-node graph. A consumer that runs one shape gets the
    /// fastest session from a profile that fixes it (a sidecar profile with `opt` alone, or
    /// min = max: docs/cache.md), whose artifact has static shapes.
    pub fn session(&self, builder: &mut SessionBuilder) -> Result<Session, SessionError> {
        self.same_runtime()?;
        self.session_settings(builder);
        if let Some(graph) = self.dir_graph_path() {
            // A failure here (say the blob was garbage-collected in between) falls back to
            // the per-file descriptors, which stay valid whatever happens to the directory.
            if let Ok(s) = builder.commit_from_file(&graph) {
                return Ok(s);
            }
        }
        self.session_from_files(builder)
    }

    /// Opens an `ort` session through the per-file descriptors only, ignoring the
    /// directory: a lone graph through `/proc/self/fd/N`; a graph with external data through
    /// a private folder of symlinks to the descriptors, or, when a file was removed since it
    /// was opened (the artifact evicted: ONNX Runtime resolves each external file's real
    /// path, and a removed file has none), through a private folder of copies made from the
    /// descriptors. Either folder is removed once the session exists.
    pub fn session_from_files(
        &self,
        builder: &mut SessionBuilder,
    ) -> Result<Session, SessionError> {
        self.same_runtime()?;
        self.session_settings(builder);
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
        if !self.any_removed() {
            let linked = self.private_view(false)?;
            match builder.commit_from_file(&linked.1) {
                Ok(s) => return Ok(s),
                // Evicted while ONNX Runtime read it: copies next.
                Err(_) if self.any_removed() => {}
                Err(e) => return Err(SessionError::Ort(e.to_string())),
            }
        }
        let copied = self.private_view(true)?;
        builder
            .commit_from_file(&copied.1)
            .map_err(|e| SessionError::Ort(e.to_string()))
    }

    /// Whether a file of the artifact has no name left (`st_nlink` 0: evicted, removed).
    fn any_removed(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.files
            .iter()
            .any(|f| f.metadata().map_or(true, |m| m.nlink() == 0))
    }

    /// A private folder holding the graph as `model.onnx` and each external file under its
    /// name: symlinks to `/proc/self/fd/N`, or (`copy`) copies read from the descriptors
    /// (with their own offsets: the artifact's descriptors are left as they were). Returns
    /// the folder (removed on drop) and the graph's path.
    fn private_view(&self, copy: bool) -> Result<(TempDir, PathBuf), SessionError> {
        let dir = private_dir()?;
        let graph = dir.0.join("model.onnx");
        for (i, (meta, proc_path)) in self
            .metadata
            .files
            .iter()
            .zip(self.proc_paths())
            .enumerate()
        {
            let at = if i == 0 {
                graph.clone()
            } else {
                if !plain_relative(&meta.name) {
                    return Err(SessionError::BadName(meta.name.clone()));
                }
                dir.0.join(&meta.name)
            };
            if let Some(parent) = at.parent() {
                std::fs::create_dir_all(parent)?;
            }
            if copy {
                // A fresh open of the descriptor's file (it works for a removed one too).
                let mut from = std::fs::File::open(&proc_path)?;
                let mut to = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&at)?;
                std::io::copy(&mut from, &mut to)?;
            } else {
                std::os::unix::fs::symlink(&proc_path, &at)?;
            }
        }
        Ok((dir, graph))
    }
}

/// A session that follows a model's current artifact (see [`Follower`]): `current().value`
/// is the session (behind a `Mutex`: `Session::run` takes `&mut self`).
pub type SessionFollower = Follower<std::sync::Mutex<Session>>;

impl Follower<std::sync::Mutex<Session>> {
    /// Follows `req.model` with ONNX Runtime sessions opened by [`Artifact::session`] on a
    /// builder from `builder` (called once per session: providers, threads and
    /// optimisation level are the caller's, as for [`Artifact::session`]).
    pub fn sessions(
        socket: impl AsRef<Path>,
        req: AcquireRequest,
        mut builder: impl FnMut() -> ort::Result<SessionBuilder> + Send + 'static,
    ) -> Result<Self, FollowError> {
        Follower::start(socket, req, move |a: &Artifact| {
            let mut b = builder().map_err(|e| SessionError::Ort(e.to_string()))?;
            a.session(&mut b).map(std::sync::Mutex::new)
        })
    }
}

/// The version of the ONNX Runtime library ort loaded in this process, from the library's
/// file name (`libonnxruntime.so.1.31.1`, a link followed), found by `dladdr` on ort's API
/// table, which lives in that library (the PyPI wheels' build-info string carries no
/// version). `None` when it cannot be told. Call it once ort is initialized: it uses
/// `ort::api()`.
pub fn loaded_onnxruntime() -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let api: *const ort::sys::OrtApi = ort::api();
    // SAFETY: an all-zero Dl_info is a valid value (null pointers), written by dladdr.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address's mapping; `info` is written before it is read.
    if unsafe { libc::dladdr(api.cast(), &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path that lives as long as the mapping.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let from_name = |p: &std::path::Path| {
        let name = p.file_name()?.to_str()?;
        let v = name.strip_prefix("libonnxruntime.so.")?;
        (v.split('.').count() >= 2 && v.split('.').all(|x| x.parse::<u32>().is_ok()))
            .then(|| v.to_string())
    };
    from_name(path).or_else(|| from_name(&std::fs::canonicalize(path).ok()?))
}

impl crate::Artifact {
    /// Refuses an artifact whose metadata names another ONNX Runtime version than the one
    /// ort loaded in this process (`ort::info()`; a builder exists, so ort is initialized).
    /// Metadata without a runtime (an older daemon) passes.
    fn same_runtime(&self) -> Result<(), SessionError> {
        let Some(want) = self.metadata.runtime.get("onnxruntime") else {
            return Ok(());
        };
        match loaded_onnxruntime() {
            Some(v) if v != *want => Err(SessionError::RuntimeMismatch {
                artifact: want.clone(),
                loaded: v,
            }),
            _ => Ok(()),
        }
    }
}
