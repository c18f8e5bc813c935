//! The blocking client: one Unix-socket connection, a `hello` handshake on connect, then one
//! typed call per request. Acquired artifacts come back as read-only descriptors.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::frame::{self, FrameError};
use crate::protocol::*;

/// Largest response frame accepted by default (a `list` of many models stays far below it);
/// [`Client::set_max_response`] changes it.
pub const DEFAULT_MAX_RESPONSE: u32 = 64 << 20;

/// Errors a client call can return.
#[derive(Debug)]
pub enum ClientError {
    /// Could not connect to the daemon's socket.
    Connect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The connection failed or a frame was malformed.
    Frame(FrameError),
    /// The daemon answered with a typed error.
    Server {
        /// Machine-readable code.
        code: ErrorCode,
        /// Human-readable message.
        message: String,
    },
    /// The daemon answered with something this request does not expect.
    Unexpected(String),
    /// No answer (or the request not taken) within the connection's timeout
    /// ([`Client::set_timeout`]). The connection was reset: the late answer and its
    /// descriptors are dropped with the old socket, and the next request connects again.
    Timeout {
        /// The timeout that passed.
        after: Option<Duration>,
    },
}

impl ClientError {
    /// The server's error code, when the daemon answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Connect { path, source } => {
                write!(f, "cannot connect to {}: {source}", path.display())
            }
            ClientError::Frame(e) => write!(f, "{e}"),
            ClientError::Server { code, message } => write!(f, "{code}: {message}"),
            ClientError::Unexpected(s) => write!(f, "unexpected response: {s}"),
            ClientError::Timeout { after } => {
                f.write_str("no answer from the daemon")?;
                if let Some(t) = after {
                    write!(f, " within {:.3} s", t.as_secs_f64())?;
                }
                f.write_str("; the connection was reset (the next request connects again)")
            }
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Connect { source, .. } => Some(source),
            ClientError::Frame(e) => Some(e),
            _ => None,
        }
    }
}

impl From<FrameError> for ClientError {
    fn from(e: FrameError) -> Self {
        ClientError::Frame(e)
    }
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        ClientError::Frame(FrameError::Io(e))
    }
}

/// An acquired artifact: its metadata and one open read-only file per entry of
/// `metadata.files` (graph first), plus, when asked for and sent, the artifact's directory.
/// The files stay valid after the daemon evicts the entry.
#[derive(Debug)]
pub struct Artifact {
    /// What the artifact is.
    pub metadata: ArtifactMeta,
    /// Open files, in the order of `metadata.files`.
    pub files: Vec<File>,
    /// Read-only descriptor of the directory holding the files under their names (sent when
    /// the request set `dir_fd` and the daemon supports it).
    pub dir: Option<File>,
}

impl Artifact {
    /// Reads the graph file (the first descriptor) into memory.
    pub fn graph_bytes(&self) -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Seek};
        let mut f = self
            .files
            .first()
            .ok_or_else(|| std::io::Error::other("artifact has no files"))?;
        f.rewind()?;
        let mut out = Vec::new();
        f.read_to_end(&mut out)?;
        Ok(out)
    }

    /// `/proc/self/fd/D` path of the artifact's directory, when the daemon sent one.
    pub fn dir_proc_path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        self.dir
            .as_ref()
            .map(|d| PathBuf::from(format!("/proc/self/fd/{}", d.as_raw_fd())))
    }

    /// `/proc/self/fd/N` paths of the files, usable by libraries that want paths.
    pub fn proc_paths(&self) -> Vec<PathBuf> {
        use std::os::fd::AsRawFd;
        self.files
            .iter()
            .map(|f| PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())))
            .collect()
    }
}

/// A connection to the trtcache daemon.
///
/// After a timeout, a frame cut short, a malformed or oversized response, or an error code
/// after which the daemon closes the connection (`busy`, `idle_timeout`, `frame_too_large`,
/// `shutting_down`), the connection is *reset*: its socket is shut down, and the next
/// [`Client::send`] (every request method sends) connects and says `hello` again, so a late
/// answer is never read as the answer to a later request.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    path: PathBuf,
    server: String,
    max_frame: u32,
    max_response: u32,
    broken: bool,
    resets: u64,
    runtime: Option<crate::protocol::Runtime>,
}

/// The connection's socket, for callers that multiplex many connections with `poll`/`epoll`
/// and call [`Client::send`] / [`Client::recv`] when it is ready (a response arrives as one
/// frame, so `recv` on a readable socket does not wait for the daemon). A reset (see
/// [`Client`]) replaces the socket at the next `send`, so read the descriptor again then.
impl std::os::fd::AsRawFd for Client {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}

impl Client {
    /// Connects to the daemon's socket and performs the version handshake.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        Self::connect_with(path.as_ref(), None)
    }

    /// [`Client::connect`] with a timeout on the handshake and every later call (as
    /// [`Client::set_timeout`]): a daemon that accepts but does not answer is
    /// [`ClientError::Timeout`] instead of a wait without end (health checks, probes).
    pub fn connect_timeout(path: impl AsRef<Path>, timeout: Duration) -> Result<Self, ClientError> {
        Self::connect_with(path.as_ref(), Some(timeout))
    }

    fn connect_with(path: &Path, timeout: Option<Duration>) -> Result<Self, ClientError> {
        let stream = Self::open(path)?;
        stream.set_read_timeout(timeout)?;
        stream.set_write_timeout(timeout)?;
        let mut c = Client {
            stream,
            path: path.to_path_buf(),
            server: String::new(),
            max_frame: u32::MAX,
            max_response: DEFAULT_MAX_RESPONSE,
            broken: false,
            resets: 0,
            runtime: None,
        };
        c.hello()?;
        Ok(c)
    }

    fn open(path: &Path) -> Result<UnixStream, ClientError> {
        UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })
    }

    fn hello(&mut self) -> Result<(), ClientError> {
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            client: concat!("trtcache-client/", env!("CARGO_PKG_VERSION")).into(),
        };
        match self.call(&hello)? {
            (
                Response::Hello {
                    server, max_frame, ..
                },
                _,
            ) => {
                self.server = server;
                self.max_frame = max_frame;
                Ok(())
            }
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// Drops the connection's socket; the next `send` connects again.
    fn reset(&mut self) {
        if !self.broken {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            self.broken = true;
            self.resets += 1;
        }
    }

    /// Connects again after a reset (and says `hello`).
    fn reconnect(&mut self) -> Result<(), ClientError> {
        let stream = Self::open(&self.path)?;
        stream.set_read_timeout(self.stream.read_timeout()?)?;
        stream.set_write_timeout(self.stream.write_timeout()?)?;
        self.stream = stream;
        self.broken = false;
        self.hello()
    }

    /// Sets a read/write timeout on the connection (none by default), kept across resets.
    /// When it passes, the call returns [`ClientError::Timeout`] and the connection is reset.
    pub fn set_timeout(&self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)?;
        Ok(())
    }

    /// Sets the largest response frame accepted ([`DEFAULT_MAX_RESPONSE`] by default); a
    /// larger one is refused with [`FrameError::TooLarge`] and resets the connection.
    pub fn set_max_response(&mut self, bytes: u32) {
        self.max_response = bytes;
    }

    /// How many times the connection was reset (see [`Client`]).
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Maps a framing error: a timeout or a frame left half-read resets the connection.
    fn framing(&mut self, e: FrameError) -> ClientError {
        match e {
            FrameError::DescriptorsTruncated { .. } => ClientError::Frame(e),
            FrameError::Io(io) if frame::is_timeout(&io) => {
                let after = self.stream.read_timeout().ok().flatten();
                self.reset();
                ClientError::Timeout { after }
            }
            e => {
                self.reset();
                ClientError::Frame(e)
            }
        }
    }

    /// The socket this client connects to.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// The read/write timeout set with [`Client::set_timeout`].
    pub fn timeout(&self) -> Option<Duration> {
        self.stream.read_timeout().ok().flatten()
    }

    /// The largest response frame accepted ([`Client::set_max_response`]).
    pub fn max_response(&self) -> u32 {
        self.max_response
    }

    /// A second handle on the connection's socket (to shut it down from another thread).
    pub(crate) fn try_clone_stream(&self) -> std::io::Result<UnixStream> {
        self.stream.try_clone()
    }

    /// The server's name and version from the handshake.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Sends one request (without descriptors), connecting again first after a reset.
    pub fn send(&mut self, req: &Request) -> Result<(), ClientError> {
        let bytes = frame::encode(req)?;
        if self.broken && !matches!(req, Request::Hello { .. }) {
            self.reconnect()?;
        }
        frame::write_frame(&self.stream, &bytes, &[]).map_err(|e| self.framing(e.into()))
    }

    /// Reads one response; a server error becomes [`ClientError::Server`].
    pub fn recv(&mut self) -> Result<(Response, Vec<OwnedFd>), ClientError> {
        if self.broken {
            return Err(ClientError::Frame(FrameError::Closed));
        }
        let (body, fds) =
            frame::read_frame(&self.stream, self.max_response).map_err(|e| self.framing(e))?;
        let resp: Response = match decode(&body) {
            Ok(r) => r,
            Err(e) => {
                self.reset();
                return Err(e);
            }
        };
        if let Response::Error(ErrorBody { code, message }) = resp {
            if matches!(
                code,
                ErrorCode::Busy
                    | ErrorCode::IdleTimeout
                    | ErrorCode::FrameTooLarge
                    | ErrorCode::ShuttingDown
            ) {
                self.reset();
            }
            return Err(ClientError::Server { code, message });
        }
        Ok((resp, fds))
    }

    fn call(&mut self, req: &Request) -> Result<(Response, Vec<OwnedFd>), ClientError> {
        if self.broken && !matches!(req, Request::Hello { .. }) {
            self.reconnect()?;
        }
        let bytes = frame::encode(req)?;
        if let Err(io) = frame::write_frame(&self.stream, &bytes, &[]) {
            // The daemon may have answered and closed before reading (`busy` at its
            // connection limit): its error frame says why, the broken pipe does not.
            if matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) {
                if let Err(server @ ClientError::Server { .. }) = self.recv() {
                    self.reset();
                    return Err(server);
                }
            }
            return Err(self.framing(io.into()));
        }
        self.recv()
    }

    /// Every model with its versions and per-variant state.
    pub fn list(&mut self) -> Result<Vec<ModelStatus>, ClientError> {
        match self.call(&Request::List)?.0 {
            Response::Models { models } => Ok(models),
            other => Err(unexpected(&other)),
        }
    }

    /// One model's state.
    pub fn status(&mut self, model: &str) -> Result<ModelStatus, ClientError> {
        match self
            .call(&Request::Status {
                model: model.into(),
            })?
            .0
        {
            Response::Status { model } => Ok(model),
            other => Err(unexpected(&other)),
        }
    }

    /// The runtime this client's acquires ask artifacts for when a request names none
    /// ([`AcquireRequest::runtime`]): e.g. `Runtime::onnxruntime("1.31.1")`, or, with the
    /// `ort` feature once ort is initialized, the library ort loaded:
    /// `trtcache_client::loaded_onnxruntime().map(Runtime::onnxruntime)`. `None` (the
    /// default): the daemon's current runtime. Either way, [`Artifact::session`] refuses an
    /// artifact built for another version than the loaded one.
    pub fn set_runtime(&mut self, runtime: Option<crate::protocol::Runtime>) {
        self.runtime = runtime;
    }

    /// The runtime set with [`Client::set_runtime`].
    pub fn runtime(&self) -> Option<&crate::protocol::Runtime> {
        self.runtime.as_ref()
    }

    /// Acquires a ready artifact, waiting for a build when `req.wait` is set; with
    /// `req.dir_fd` the artifact's directory comes too (see [`Artifact::dir`]). A request
    /// without a runtime asks for the client's ([`Client::set_runtime`]).
    pub fn acquire(&mut self, req: &AcquireRequest) -> Result<Artifact, ClientError> {
        let mut req = req.clone();
        if req.runtime.is_none() {
            req.runtime = self.runtime.clone();
        }
        match self.call(&Request::Acquire(req.clone()))? {
            (Response::Artifact { metadata }, fds) => {
                let n = metadata.files.len();
                let dir_ok = match metadata.dir_fd_index {
                    None => true,
                    Some(i) => req.dir_fd && usize::try_from(i).is_ok_and(|i| i == n),
                };
                let want = n + usize::from(metadata.dir_fd_index.is_some());
                if fds.len() != want || !dir_ok {
                    return Err(ClientError::Unexpected(format!(
                        "{} descriptors for {n} files (directory descriptor index {:?})",
                        fds.len(),
                        metadata.dir_fd_index
                    )));
                }
                let mut files: Vec<File> = fds.into_iter().map(File::from).collect();
                let dir = if metadata.dir_fd_index.is_some() {
                    files.pop()
                } else {
                    None
                };
                Ok(Artifact {
                    metadata,
                    files,
                    dir,
                })
            }
            (other, _) => Err(unexpected(&other)),
        }
    }

    /// Acquires the default variant of `model`, waiting for it (with the directory
    /// descriptor, so [`Artifact::session`] can open the graph in place). Answered from the
    /// daemon's ready index without a round trip when the daemon published the artifact
    /// there and every check holds ([`crate::ready::acquire`]); otherwise over the socket.
    pub fn acquire_model(&mut self, model: &str) -> Result<Artifact, ClientError> {
        if let Some(a) = crate::ready::acquire_for(&self.path, model, self.runtime.as_ref()) {
            return Ok(a);
        }
        self.acquire(&AcquireRequest {
            model: model.into(),
            wait: true,
            dir_fd: true,
            ..Default::default()
        })
    }

    /// Builds (or confirms in the cache) models; `on_progress` sees each progress event.
    pub fn build(
        &mut self,
        req: &BuildRequest,
        mut on_progress: impl FnMut(&Progress),
    ) -> Result<Vec<BuildResult>, ClientError> {
        self.send(&Request::Build(req.clone()))?;
        loop {
            match self.recv()?.0 {
                Response::Progress(p) => on_progress(&p),
                Response::Built { results } => return Ok(results),
                other => return Err(unexpected(&other)),
            }
        }
    }

    /// Admin: evicts a model's artifacts or one key; returns how many were removed.
    pub fn evict(&mut self, model: Option<&str>, key: Option<&str>) -> Result<u64, ClientError> {
        let req = Request::Evict {
            model: model.map(Into::into),
            key: key.map(Into::into),
        };
        match self.call(&req)?.0 {
            Response::Evicted { removed } => Ok(removed),
            other => Err(unexpected(&other)),
        }
    }

    /// Daemon counters.
    pub fn stats(&mut self) -> Result<Stats, ClientError> {
        match self
            .call(&Request::Stats {
                format: StatsFormat::Json,
            })?
            .0
        {
            Response::Stats { stats } => Ok(stats),
            other => Err(unexpected(&other)),
        }
    }

    /// Daemon counters as Prometheus text.
    pub fn stats_prometheus(&mut self) -> Result<String, ClientError> {
        match self
            .call(&Request::Stats {
                format: StatsFormat::Prometheus,
            })?
            .0
        {
            Response::StatsText { text } => Ok(text),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks the daemon to scan its repository now: every model present (settled or still
    /// being written) and every entry it skips, with the reason. Models whose files have
    /// settled join the served set before the answer.
    pub fn rescan(&mut self) -> Result<RescanReport, ClientError> {
        match self.call(&Request::Rescan)?.0 {
            Response::Rescanned(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// The daemon's cache directory and every record in it (as `trtcache ls --json`).
    pub fn cache_list(&mut self) -> Result<(String, Vec<serde_json::Value>), ClientError> {
        match self.call(&Request::CacheList)?.0 {
            Response::CacheEntries { cache_dir, records } => Ok((cache_dir, records)),
            other => Err(unexpected(&other)),
        }
    }

    /// Admin: removes one cache entry (key or unique prefix); returns the daemon's cache
    /// directory and the full key.
    pub fn cache_remove(&mut self, key: &str) -> Result<(String, String), ClientError> {
        match self.call(&Request::CacheRemove { key: key.into() })?.0 {
            Response::CacheRemoved { cache_dir, key } => Ok((cache_dir, key)),
            other => Err(unexpected(&other)),
        }
    }

    /// Admin unless `dry_run`: evicts least-recently-used entries down to `max_bytes`.
    pub fn cache_gc(
        &mut self,
        max_bytes: u64,
        dry_run: bool,
    ) -> Result<CacheGcReport, ClientError> {
        match self.call(&Request::CacheGc { max_bytes, dry_run })?.0 {
            Response::CacheGc(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// Admin: re-hashes every stored artifact; quarantines those whose files changed.
    pub fn cache_verify(&mut self) -> Result<CacheVerifyReport, ClientError> {
        match self.call(&Request::CacheVerify)?.0 {
            Response::CacheVerified(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// Admin: asks the daemon to shut down.
    pub fn shutdown(&mut self) -> Result<(), ClientError> {
        match self.call(&Request::Shutdown)?.0 {
            Response::ShuttingDown => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Largest frame the server accepts.
    pub fn max_frame(&self) -> u32 {
        self.max_frame
    }
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ClientError> {
    serde_json::from_slice(body).map_err(|e| ClientError::Frame(FrameError::Json(e)))
}

/// "`kind` frame: {first 200 bytes of its JSON}", so the message says what came without
/// pasting a whole model list.
pub(crate) fn unexpected(r: &Response) -> ClientError {
    let json = serde_json::to_string(r).unwrap_or_else(|_| format!("{r:?}"));
    let kind = serde_json::from_str::<serde_json::Value>(&json)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(String::from))
        .unwrap_or_else(|| "unknown".into());
    let mut shown: String = json.chars().take(200).collect();
    if shown.len() < json.len() {
        shown.push('…');
    }
    ClientError::Unexpected(format!("a `{kind}` frame ({shown})"))
}
