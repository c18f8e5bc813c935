//! The daemon's configuration: a TOML file (`--config`, else `/etc/trtcache/config.toml` when
//! present), then command-line flags on top. Every limit the daemon enforces lives here.
//! Defaults depend on where trtcache runs: under systemd (`INVOCATION_ID`, `NOTIFY_SOCKET` or
//! `LISTEN_FDS` set) the cache is `/var/cache/trtcache` and the socket
//! `/run/trtcache/trtcache.sock`; from a checkout, the repository's `cache/` holds both.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::spec::Backend;

mod decode;
pub mod remote;
mod runtimes;
mod trt;

pub use decode::DecodeLimits;
pub use runtimes::{RuntimesConfig, TensorrtInstall, TensorrtRuntime};
pub use trt::TrtSettings;

/// Default `external_min_bytes` (`BuildOptions::external_min_bytes`): 64 KiB. ONNX Runtime
/// maps each external initializer with its own open and mmap, which costs more than copying a
/// small tensor out of the parsed graph, while an inline one is copied two or three times
/// (parse, tensor, packing) through freshly faulted heap pages. Measured on this project's
/// machines (BENCHMARKS.md): at 64 KiB sessions of a 4-layer BERT and of a 20,000-node graph
/// open as fast as at 256 KiB and 10–16 % faster than at ORT's default of 1 KiB, and conv
/// nets' 30–300 KiB weights no longer go through the heap: YOLOv8n's artifact opens in 11
/// instead of 16.5 ms, PP-OCR rec's in 15 instead of 19.5 ms.
pub const DEFAULT_EXTERNAL_MIN_BYTES: u64 = 64 * 1024;

/// The system-wide config file read when `--config` is not given.
pub const SYSTEM_CONFIG: &str = "/etc/trtcache/config.toml";

/// Errors reading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

/// Effective configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Model repository (flat `NAME.onnx` files and/or Triton `NAME/VERSION/model.onnx`).
    pub models: PathBuf,
    /// Cache directory (artifacts, index, temp files).
    pub cache_dir: PathBuf,
    /// Unix socket path (ignored when systemd passes a listener).
    pub socket: PathBuf,
    /// Socket permission bits (octal in TOML as a string, e.g. "0660").
    pub socket_mode: String,
    /// Group that owns the socket; the daemon's group when unset.
    pub socket_group: Option<String>,
    /// ONNX Runtime shared library (`ort_library`, as `--ort-library` and every hint name
    /// it; the older spelling `ort_dylib` is read too); `ORT_DYLIB_PATH` when unset.
    #[serde(alias = "ort_dylib")]
    pub ort_library: Option<PathBuf>,
    /// Backends built in the background for every model; the first is the default for
    /// acquires that name none.
    pub backends: Vec<Backend>,
    /// `ort-cpu` artifacts: initializers of at least this many bytes go to the external data
    /// file (memory-mapped, shared between consumers), smaller ones stay in the graph file
    /// (faster session creation). Part of the cache key, as `trtcache build
    /// --external-min-size`; the default matches it.
    pub external_min_bytes: u64,
    /// `ort-cpu` artifacts: apply the build's graph rewrites (`builder::backends::ort_cpu::passes`: an op ONNX
    /// Runtime's CPU provider runs slowly replaced by the same computation in ops it runs
    /// well). A model's sidecar `rewrite = false` turns them off for that model; this, for
    /// every model. Part of the cache key, as `trtcache build --no-rewrite`.
    pub rewrite: bool,
    /// Log lines on stderr: `text` (human; under journald without timestamps, with syslog
    /// priorities) or `json` (one JSON object a line, for log shippers). `--log-format`
    /// overrides it.
    pub log_format: LogFormat,
    /// Address of the HTTP listener serving `/metrics`, `/healthz` and `/readyz`
    /// (`"127.0.0.1:9464"`); absent = off. `serve --metrics-listen` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// Serve model files that are symbolic links leading out of the repository (off: such a
    /// file is refused with a warning, the rule external data files follow too).
    pub follow_symlinks_outside_repo: bool,
    /// Publish the ready index next to the socket (`<socket>.ready/`, one pointer per model
    /// whose default artifact is ready): local consumers that can read the artifact files
    /// open them directly and skip the socket round trip; each open counts as a hit
    /// (docs/protocol.md, "The ready index"). Off: every acquire goes over the socket, and
    /// the index a previous daemon left is removed.
    pub ready_index: bool,
    /// Limits.
    pub limits: Limits,
    /// The fleet tier (`[remote]`, see docs/fleet.md); absent = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<remote::RemoteConfig>,
    /// TensorRT builder settings of the daemon's `trt` builds (`[trt]`, docs/trt.md).
    #[serde(default)]
    pub trt: TrtSettings,
    /// Runtimes a deploy will switch to (`[runtimes]`, docs/daemon.md "Upgrading the
    /// runtime"): every model gets artifacts for each in the background before the switch.
    #[serde(default)]
    pub runtimes: RuntimesConfig,
}

/// Every limit the daemon enforces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Builds running at once (1 for GPU backends: concurrent TensorRT builds contend).
    pub build_concurrency: usize,
    /// Longest build, in seconds; longer builds are cancelled and recorded as failed.
    pub build_timeout_secs: u64,
    /// Largest request frame in bytes.
    pub max_frame_bytes: u32,
    /// A connection idle this long (seconds) is closed.
    pub idle_timeout_secs: u64,
    /// Connections served at once; more are refused with `busy` unless one can be reclaimed
    /// (`reclaim_idle_secs`).
    pub max_connections: usize,
    /// Longest time (seconds) to receive one request frame once its first byte arrived, and to
    /// send one response frame: a client trickling bytes (or not reading) is closed after this.
    pub frame_timeout_secs: u64,
    /// At `max_connections`, a new connection takes the slot of the connection that has waited
    /// longest for its next request, if that wait is at least this many seconds (a leaked or
    /// idle pool must not lock everyone out until `idle_timeout_secs`). Set it to
    /// `idle_timeout_secs` or more to never reclaim.
    pub reclaim_idle_secs: u64,
    /// Quiet time (milliseconds) a model file must stay unchanged before it is built.
    pub debounce_ms: u64,
    /// Cache size limit in bytes (enforced by the cache stage's GC).
    pub cache_size_bytes: u64,
    /// Longest wait for builds to stop on shutdown, in seconds.
    pub shutdown_grace_secs: u64,
    /// Full rescan of the repository every this many seconds (0: only on events).
    pub rescan_secs: u64,
    /// Paths the repository watcher takes from events in one debounce before it scans the
    /// whole repository instead of only the models those paths belong to.
    pub watch_max_paths: usize,
    /// Models keyed (loaded and hashed) at once; 0 means one per CPU. Bounds the blocking
    /// threads a startup scan of a large repository spawns.
    pub plan_concurrency: usize,
    /// Threads serving the socket (the async runtime's workers). Everything slow (planning,
    /// building, hashing, the store) runs on separate blocking threads, so one thread serves
    /// tens of thousands of acquires a second; more threads add cross-thread wake-ups that
    /// lengthen the tail when consumers share the cores (BENCHMARKS.md, "Daemon overhead").
    pub io_threads: usize,
    /// Memory bound of a build worker process (`RLIMIT_DATA`: heap and private mappings), in
    /// bytes; 0 means three quarters of this machine's memory. A build that needs more fails
    /// (the worker aborts) instead of taking the host down. GPU memory is not counted.
    pub worker_memory_bytes: u64,
    /// CPU-seconds bound of a build worker (`RLIMIT_CPU`); 0: none (`build_timeout_secs`
    /// bounds the wall time, after which the worker is killed).
    pub worker_cpu_secs: u64,
    /// Times a build is tried again after its worker was killed by a SIGKILL the daemon did
    /// not send (the kernel's OOM killer under host pressure, an admin); past them the kill
    /// is the model's failure. 0: never tried again.
    pub worker_kill_retries: u32,
    /// Largest total size of a model's random validation inputs, in bytes: a model whose
    /// fixed input would need more is refused (give it golden inputs) before anything is
    /// allocated.
    pub validation_max_bytes: u64,
    /// Default validation candidates a build gives up because ONNX Runtime crashed running
    /// the original model on them (each a new worker: the candidate is left out and the
    /// search goes on), before the crash is the build's failure.
    pub validation_crash_retries: u32,
    /// `ort-cpu`: after validation, the artifact's runs are timed on ONNX Runtime's default
    /// thread pool and on one thread when its first validation run took at most this many
    /// milliseconds; when one thread is no slower, consumers are told to use it (the
    /// acquire's `session_hints`). 0: never.
    pub thread_probe_max_run_ms: u64,
    /// `ort-cpu`: after the thread probe, the artifact's sessions and runs are timed with and
    /// without its weights prepacked when its first validation run took at most this many
    /// milliseconds; when prepacking makes the session slower and the runs no faster, and the
    /// session without it passes validation too, consumers are told to skip it (the
    /// acquire's `session_hints`). 0: never.
    pub prepack_probe_max_run_ms: u64,
    /// Connections subscribed with `watch` at once (each also holds one of
    /// `max_connections`, and is never reclaimed: it is not waiting for a request); more get
    /// `busy`.
    pub max_watchers: usize,
    /// Events a watcher may fall behind (its backlog, shared ring of this many events) before
    /// the daemon drops them and sends it one `resync` event instead.
    pub watch_queue: usize,
    /// Connections the metrics listener serves at once, so a scraper flood cannot take the
    /// socket service's memory or threads. At the limit a new connection closes the oldest
    /// one: idle or slow connections never lock a liveness probe out.
    pub metrics_max_connections: usize,
    /// Longest time (milliseconds) the metrics listener waits for a connection's request
    /// head (request line and headers) from the moment it is accepted: an idle connection
    /// or one trickling its head (slowloris) is closed then. At most `frame_timeout_secs`.
    pub metrics_header_timeout_ms: u64,
    /// Largest HTTP request head (request line and headers) the metrics listener reads, in
    /// bytes (at least 8192).
    pub metrics_max_request_bytes: usize,
    /// Models with their own `model` label in the per-model metrics (in name order); the
    /// others are summed under `model="/other"`, so a large repository cannot blow up the
    /// number of series. 0: every model under `/other`.
    pub metrics_max_models: usize,
    /// How often (seconds) the daemon checks that its socket file is still its own: a
    /// deleted one is bound again, one replaced by another file stops the daemon with an
    /// error. 0: never checked.
    pub socket_check_secs: u64,
    /// How often (seconds) the daemon checks that its cache folder is still the one it
    /// opened (the folder, its `lock` and its index, by device and inode); it is also checked
    /// before every lookup and while every build runs. A folder deleted or replaced under the
    /// daemon (`rm -rf CACHE`) is opened afresh, as an empty cache, and artifacts are built
    /// again as they are asked for. 0: checked on lookups and builds only.
    pub cache_check_secs: u64,
    /// How often (seconds) the ready index (`ready_index`) is compared with what the daemon
    /// serves even when nothing signalled a change: a pointer or the folder deleted by hand
    /// is written again. 0: only on changes.
    pub ready_recheck_secs: u64,
    /// How often (milliseconds) the daemon reads the ready index's open events, each a hit of
    /// the artifact a consumer opened through it (`fast_hits`, the LRU order). Read on a
    /// timer rather than awaited, so that a consumer's open wakes nothing (20–70 µs of a
    /// fresh consumer's acquire otherwise); a hit is counted up to this late, and more opens
    /// than the kernel queues (`fs.inotify.max_queued_events`) in one interval go uncounted
    /// (logged). At least 1.
    pub ready_hits_poll_ms: u64,
    /// Longest wait (seconds) between retries of a background build that failed for a
    /// reason of the machine (the cache full, read-only, failing, or its folders deleted);
    /// the wait doubles from 1 s up to this.
    pub storage_retry_max_secs: u64,
    /// Decode budget of every model file read (`onnx::budget`, checked before decoding):
    /// nodes, attributes and tensors in the whole model, and an estimate of the decoded size
    /// of `decode_base_bytes` + `decode_bytes_per_file_byte` × the file's size. A model over
    /// any of them is refused ("decoding it would allocate …"), never decoded.
    pub decode_max_nodes: u64,
    pub decode_max_attributes: u64,
    pub decode_max_tensors: u64,
    pub decode_base_bytes: u64,
    pub decode_bytes_per_file_byte: u64,
}

/// How log lines are written (`log_format`, `--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object a line.
    Json,
}

impl Limits {
    /// The decode budget these limits set (see `decode_max_nodes`).
    pub fn decode(&self) -> DecodeLimits {
        DecodeLimits {
            max_nodes: self.decode_max_nodes,
            max_attributes: self.decode_max_attributes,
            max_tensors: self.decode_max_tensors,
            base_bytes: self.decode_base_bytes,
            per_file_byte: self.decode_bytes_per_file_byte,
        }
    }

    /// The bounds of a build worker: `worker_memory_bytes` (or three quarters of physical
    /// memory), `worker_cpu_secs`, and `build_timeout_secs` of wall time.
    pub fn worker(&self) -> WorkerLimits {
        let memory_bytes = match self.worker_memory_bytes {
            0 => physical_memory().map_or(0, |m| m / 4 * 3),
            n => n,
        };
        WorkerLimits {
            memory_bytes,
            cpu_secs: self.worker_cpu_secs,
            wall: std::time::Duration::from_secs(self.build_timeout_secs),
        }
    }
}

/// The worker's bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerLimits {
    /// `RLIMIT_DATA` in bytes (0: none).
    pub memory_bytes: u64,
    /// `RLIMIT_CPU` in seconds (0: none).
    pub cpu_secs: u64,
    /// Wall-clock limit; the worker is killed after it.
    pub wall: std::time::Duration,
}

/// This machine's physical memory in bytes (`sysconf`), if known.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && size > 0).then(|| pages as u64 * size as u64)
}

impl Default for Limits {
    fn default() -> Self {
        let decode = DecodeLimits::builtin();
        Limits {
            build_concurrency: 1,
            build_timeout_secs: 3600,
            max_frame_bytes: 1 << 20,
            idle_timeout_secs: 300,
            max_connections: 1024,
            frame_timeout_secs: 10,
            reclaim_idle_secs: 5,
            debounce_ms: 500,
            cache_size_bytes: 50 << 30,
            shutdown_grace_secs: 10,
            rescan_secs: 60,
            watch_max_paths: 4096,
            plan_concurrency: 0,
            io_threads: 1,
            worker_memory_bytes: 0,
            worker_cpu_secs: 0,
            worker_kill_retries: 2,
            validation_max_bytes: 2 << 30,
            // builder::validate::DEFAULT_CRASH_RETRIES.
            validation_crash_retries: 16,
            // builder::validate::DEFAULT_THREAD_PROBE_MAX_RUN_MS (config is below build).
            thread_probe_max_run_ms: 10,
            // builder::validate::DEFAULT_PREPACK_PROBE_MAX_RUN_MS.
            prepack_probe_max_run_ms: 50,
            max_watchers: 256,
            watch_queue: 256,
            metrics_max_connections: 8,
            metrics_header_timeout_ms: 2000,
            metrics_max_request_bytes: 16 * 1024,
            metrics_max_models: 100,
            socket_check_secs: 5,
            cache_check_secs: 5,
            ready_recheck_secs: 5,
            ready_hits_poll_ms: 250,
            storage_retry_max_secs: 60,
            decode_max_nodes: decode.max_nodes,
            decode_max_attributes: decode.max_attributes,
            decode_max_tensors: decode.max_tensors,
            decode_base_bytes: decode.base_bytes,
            decode_bytes_per_file_byte: decode.per_file_byte,
        }
    }
}

/// Environment variable choosing the GPU ordinal (the `--device` flags read it too).
pub const DEVICE_ENV: &str = "TRTCACHE_DEVICE";

/// The GPU ordinal builds run on and keys are made for, when no `--device` flag gives one:
/// `TRTCACHE_DEVICE`, else 0 (`Err(text)` when the variable is not an ordinal).
pub fn gpu_ordinal() -> Result<usize, String> {
    match std::env::var(DEVICE_ENV) {
        Ok(v) => v.trim().parse::<usize>().map_err(|_| v),
        Err(_) => Ok(0),
    }
}

/// Whether this process was started by systemd.
pub fn under_systemd() -> bool {
    ["INVOCATION_ID", "NOTIFY_SOCKET", "LISTEN_FDS"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The checkout the running `trtcache` executable was built in: the nearest folder above the
/// executable (`target/release/trtcache`, a test binary in `target/debug/deps`) holding
/// `Cargo.toml`; `None` for an installed binary. Never derived from the working directory: a
/// folder above wherever a command happens to run may belong to anyone (any shared folder
/// under `/tmp`), and its `.venv` or `cache/` would then be theirs.
pub fn exe_checkout() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    exe.ancestors()
        .skip(1)
        .find(|d| d.join("Cargo.toml").is_file())
        .map(Path::to_path_buf)
}

/// The executable's checkout when it has a `cache/` folder: its `cache/` is the default cache
/// and its `examples/models` the default model folder.
fn checkout() -> Option<PathBuf> {
    exe_checkout().filter(|d| d.join("cache").is_dir())
}

/// Environment variable naming the cache directory.
pub const CACHE_DIR_ENV: &str = "TRTCACHE_CACHE_DIR";

/// The cache directory when neither `--cache-dir` nor the config's `cache_dir` gives one: the
/// one rule every command and the daemon follow. `TRTCACHE_CACHE_DIR`, then (under systemd)
/// `/var/cache/trtcache`, then the `cache/` folder of the checkout the executable was built in
/// ([`exe_checkout`]; never one above the working directory), then `$XDG_CACHE_HOME/trtcache`,
/// then `~/.cache/trtcache`, then `/var/cache/trtcache`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(CACHE_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if under_systemd() {
        return PathBuf::from("/var/cache/trtcache");
    }
    if let Some(repo) = checkout() {
        return repo.join("cache");
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("trtcache");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Path::new(&h).join(".cache/trtcache");
    }
    PathBuf::from("/var/cache/trtcache")
}

/// Environment variable naming the socket (below `--socket` and the config file's `socket`).
pub const SOCKET_ENV: &str = "TRTCACHE_SOCKET";

/// Where one effective setting came from, most binding first: a flag, the config file, the
/// environment, the built-in default. Every command resolves paths in this one order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Flag(&'static str),
    File(PathBuf),
    Env(&'static str),
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(flag) => write!(f, "the {flag} flag"),
            Source::File(p) => write!(f, "the config file {}", p.display()),
            Source::Env(v) => write!(f, "the environment ({v})"),
            Source::Default => write!(f, "the default"),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        let cache_dir = default_cache_dir();
        let env_socket = std::env::var_os(SOCKET_ENV)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        let (models, socket) = if under_systemd() {
            (
                PathBuf::from("/var/lib/trtcache/models"),
                PathBuf::from("/run/trtcache/trtcache.sock"),
            )
        } else if let Some(repo) = checkout() {
            (
                repo.join("examples/models"),
                cache_dir.join("trtcache.sock"),
            )
        } else {
            (PathBuf::from("models"), cache_dir.join("trtcache.sock"))
        };
        Config {
            models,
            cache_dir,
            socket: env_socket.unwrap_or(socket),
            socket_mode: "0660".into(),
            socket_group: None,
            ort_library: None,
            backends: vec![Backend::DEFAULT],
            external_min_bytes: DEFAULT_EXTERNAL_MIN_BYTES,
            rewrite: true,
            log_format: LogFormat::Text,
            metrics_listen: None,
            follow_symlinks_outside_repo: false,
            ready_index: true,
            limits: Limits::default(),
            trt: TrtSettings::default(),
            remote: None,
            runtimes: RuntimesConfig::default(),
        }
    }
}

/// Command-line overrides, applied over the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub models: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    /// `serve --metrics-listen`.
    pub metrics_listen: Option<String>,
}

impl Config {
    /// Parses a TOML document (missing keys take defaults; unknown keys are errors).
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        c.validate()?;
        Ok(c)
    }

    /// The config file `load` reads: the named one, else the system file when present.
    fn file_of(o: &Overrides) -> Option<PathBuf> {
        match &o.config {
            Some(p) => Some(p.clone()),
            None => Some(PathBuf::from(SYSTEM_CONFIG)).filter(|p| p.is_file()),
        }
    }

    /// Where `models`, `cache_dir`, `socket` and `ort_library` come from under `o`, in the
    /// one order every command follows: flags, then the config file, then the environment
    /// (`TRTCACHE_CACHE_DIR`, `TRTCACHE_SOCKET`, `ORT_DYLIB_PATH`), then the defaults.
    /// `trtcache config` prints it.
    pub fn sources(o: &Overrides) -> Vec<(&'static str, Source)> {
        let file = Self::file_of(o);
        let in_file: std::collections::BTreeSet<String> = file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| t.parse::<toml::Table>().ok())
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        let env = |v: &'static str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
        let pick = |key: &'static str, flag: Option<&'static str>, var: Option<&'static str>| {
            let from_file =
                in_file.contains(key) || (key == "ort_library" && in_file.contains("ort_dylib"));
            let s = match (flag, &file) {
                (Some(f), _) => Source::Flag(f),
                (None, Some(p)) if from_file => Source::File(p.clone()),
                _ if var.is_some_and(env) => Source::Env(var.unwrap_or_default()),
                _ => Source::Default,
            };
            (key, s)
        };
        let socket_flag = if o.socket.is_some() {
            Some("--socket")
        } else if o.cache_dir.is_some() && o.config.is_none() && !under_systemd() {
            Some("--cache-dir")
        } else {
            None
        };
        vec![
            pick("models", o.models.is_some().then_some("--models"), None),
            pick(
                "cache_dir",
                o.cache_dir.is_some().then_some("--cache-dir"),
                Some(CACHE_DIR_ENV),
            ),
            pick("socket", socket_flag, Some(SOCKET_ENV)),
            pick("ort_library", None, Some("ORT_DYLIB_PATH")),
        ]
    }

    /// The effective configuration: the named file (which must exist), else the system file
    /// when present, else defaults (which read the environment: [`Config::sources`]); then
    /// the overrides (flags).
    pub fn load(o: &Overrides) -> Result<Self, ConfigError> {
        let file = Self::file_of(o);
        let mut c = match file {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Self::from_toml(&text, &path)?
            }
            None => Config::default(),
        };
        if let Some(p) = &o.models {
            c.models = p.clone();
        }
        if let Some(p) = &o.cache_dir {
            c.cache_dir = p.clone();
            if o.socket.is_none() && o.config.is_none() && !under_systemd() {
                c.socket = p.join("trtcache.sock");
            }
        }
        if let Some(p) = &o.socket {
            c.socket = p.clone();
        }
        if let Some(a) = &o.metrics_listen {
            c.metrics_listen = Some(a.clone());
        }
        c.validate()?;
        Ok(c)
    }

    /// The socket mode as bits.
    pub fn socket_mode_bits(&self) -> Result<u32, ConfigError> {
        u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| ConfigError::Invalid {
                key: "socket_mode",
                message: format!("`{}` is not an octal mode like \"0660\"", self.socket_mode),
            })
    }

    /// The metrics listener's address, when one is configured.
    pub fn metrics_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        let Some(a) = &self.metrics_listen else {
            return Ok(None);
        };
        a.parse().map(Some).map_err(|_| ConfigError::Invalid {
            key: "metrics_listen",
            message: format!("`{a}` is not an address and port like \"127.0.0.1:9464\""),
        })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.socket_mode_bits()?;
        self.metrics_addr()?;
        let l = &self.limits;
        let positive: [(&'static str, u64); 14] = [
            ("limits.decode_max_nodes", l.decode_max_nodes),
            ("limits.decode_max_attributes", l.decode_max_attributes),
            ("limits.decode_max_tensors", l.decode_max_tensors),
            ("limits.decode_base_bytes", l.decode_base_bytes),
            ("limits.build_concurrency", l.build_concurrency as u64),
            ("limits.io_threads", l.io_threads as u64),
            ("limits.max_connections", l.max_connections as u64),
            ("limits.max_frame_bytes", l.max_frame_bytes as u64),
            ("limits.build_timeout_secs", l.build_timeout_secs),
            ("limits.idle_timeout_secs", l.idle_timeout_secs),
            ("limits.frame_timeout_secs", l.frame_timeout_secs),
            ("limits.max_watchers", l.max_watchers as u64),
            ("limits.watch_queue", l.watch_queue as u64),
            (
                "limits.metrics_max_connections",
                l.metrics_max_connections as u64,
            ),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(ConfigError::Invalid {
                    key,
                    message: "must be at least 1".into(),
                });
            }
        }
        if l.max_frame_bytes < 256 {
            return Err(ConfigError::Invalid {
                key: "limits.max_frame_bytes",
                message: "must be at least 256".into(),
            });
        }
        if l.metrics_max_request_bytes < 8192 {
            // hyper's smallest read buffer.
            return Err(ConfigError::Invalid {
                key: "limits.metrics_max_request_bytes",
                message: "must be at least 8192".into(),
            });
        }
        if let Some(r) = &self.remote {
            r.validate().map_err(|e| ConfigError::Invalid {
                key: "remote",
                message: e.to_string(),
            })?;
        }
        if !["none", "ampere-plus", "same-compute-capability"]
            .contains(&self.trt.hardware_compatibility.as_str())
        {
            return Err(ConfigError::Invalid {
                key: "trt.hardware_compatibility",
                message: format!(
                    "`{}`: expected none, ampere-plus or same-compute-capability",
                    self.trt.hardware_compatibility
                ),
            });
        }
        if self.trt.builder_optimization_level > 5 {
            return Err(ConfigError::Invalid {
                key: "trt.builder_optimization_level",
                message: "must be 0 to 5".into(),
            });
        }
        if self.backends.is_empty() {
            return Err(ConfigError::Invalid {
                key: "backends",
                message: "name at least one backend".into(),
            });
        }
        Ok(())
    }

    /// The ONNX Runtime library: the config's, else `ORT_DYLIB_PATH`.
    pub fn ort_library(&self) -> Option<PathBuf> {
        self.ort_library
            .clone()
            .or_else(|| std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_file_keeps_defaults_and_flags_override() {
        let c = Config::from_toml(
            "models = \"/m\"\n[limits]\nbuild_concurrency = 3\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(c.models, PathBuf::from("/m"));
        assert_eq!(c.limits.build_concurrency, 3);
        assert_eq!(c.limits.debounce_ms, Limits::default().debounce_ms);
        assert_eq!(c.limits.io_threads, 1);
    }

    /// The sample config shipped for systemd parses, and its limits are the defaults it
    /// claims to list (a renamed or mistyped key there would otherwise only fail on a host).
    #[test]
    fn the_sample_config_parses_and_lists_the_defaults() {
        let sample = include_str!("../../systemd/config.toml");
        let c = Config::from_toml(sample, Path::new("systemd/config.toml")).unwrap();
        assert_eq!(c.limits, Limits::default());
        let d = Config::default();
        assert_eq!(
            (c.external_min_bytes, c.rewrite, c.ready_index),
            (d.external_min_bytes, d.rewrite, d.ready_index)
        );
        assert_eq!(c.socket, PathBuf::from("/run/trtcache/trtcache.sock"));
        assert_eq!(c.cache_dir, PathBuf::from("/var/cache/trtcache"));
    }

    /// One name for the ONNX Runtime library: `ort_library`, as the flag and the hints say;
    /// a config written with the older `ort_dylib` still loads.
    #[test]
    fn the_ort_library_setting_has_one_name_and_reads_the_old_one() {
        for key in ["ort_library", "ort_dylib"] {
            let c = Config::from_toml(&format!("{key} = \"/x/libonnxruntime.so\""), Path::new("x"))
                .unwrap();
            assert_eq!(
                c.ort_library,
                Some(PathBuf::from("/x/libonnxruntime.so")),
                "{key}"
            );
        }
        let shown = toml::to_string(&Config::default()).unwrap();
        assert!(!shown.contains("ort_dylib"), "{shown}");
    }

    #[test]
    fn runtimes_default_to_none_incoming_and_a_week_of_keeping() {
        let c = Config::from_toml("models = \"/m\"", Path::new("x")).unwrap();
        assert!(c.runtimes.onnxruntime.is_empty());
        assert_eq!(c.runtimes.keep_used_secs, 7 * 24 * 3600);
        let c = Config::from_toml(
            "[runtimes]\nonnxruntime = [\"/o/libonnxruntime.so.1.32.0\"]\n",
            Path::new("x"),
        )
        .unwrap();
        assert_eq!(c.runtimes.keep_used_secs, 7 * 24 * 3600);
        assert_eq!(c.runtimes.onnxruntime.len(), 1);
        assert!(Config::from_toml("[runtimes]\nonnxruntimes = []", Path::new("x")).is_err());
    }

    #[test]
    fn unknown_keys_and_bad_limits_are_errors() {
        assert!(Config::from_toml("modelz = 1", Path::new("x")).is_err());
        assert!(Config::from_toml("[limits]\nmax_connections = 0", Path::new("x")).is_err());
        assert!(Config::from_toml("[limits]\nio_threads = 0", Path::new("x")).is_err());
        assert!(Config::from_toml("socket_mode = \"999\"", Path::new("x")).is_err());
        assert!(Config::from_toml("[limits]\nframe_timeout_secs = 0", Path::new("x")).is_err());
        let e = Config::from_toml("metrics_listen = \"localhost\"", Path::new("x")).unwrap_err();
        assert!(e.to_string().contains("metrics_listen"), "{e}");
        assert!(
            Config::from_toml("[limits]\nmetrics_max_request_bytes = 100", Path::new("x")).is_err()
        );
        let c = Config::from_toml(
            "metrics_listen = \"127.0.0.1:9464\"\nlog_format = \"json\"",
            Path::new("x"),
        )
        .unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.metrics_addr().unwrap().unwrap().port(), 9464);
        let c = Config::from_toml("socket_mode = \"0600\"", Path::new("x")).unwrap();
        assert_eq!(c.socket_mode_bits().unwrap(), 0o600);
    }
}
