//! Builds and validation in a bounded worker process. ONNX Runtime (and TensorRT's builder)
//! can abort, allocate without bound or loop forever on a hostile or broken model, so the
//! daemon never runs them in its own process: [`run`] re-executes `trtcache` as `trtcache
//! worker` (hidden), hands it one [`Job`] as JSON on stdin, and reads its stdout: one JSON
//! line per [`Progress`] step (`{"progress": "validating"}`), then one [`Reply`]. The worker
//! builds the artifact into the job's staging directory and validates it; the parent keeps
//! the store (the key check and `put` stay on its side).
//!
//! Bounds ([`WorkerLimits`], from the config's `limits.worker_*`): the data segment
//! (`RLIMIT_DATA`: heap and private writable mappings; unlike `RLIMIT_AS` it does not count
//! the address space CUDA reserves), CPU seconds (`RLIMIT_CPU`), and wall time, after which
//! the parent SIGKILLs it. A cancelled build (its model replaced, the queue's timeout) is
//! killed at once. The worker dies with its parent (`PR_SET_PDEATHSIG`). A worker that
//! crashes is reported as that model's failure, naming the signal and the last lines of its
//! stderr; the daemon keeps serving. A SIGKILL the parent did not send (the OOM killer, an
//! admin) is [`BuildError::Killed`]: the daemon builds again, a bounded number of times.
//!
//! GPU memory is not bounded by rlimits: on a GPU host, bound it with the TensorRT workspace
//! limit of the build options and `CUDA_VISIBLE_DEVICES`/MPS for the worker (docs/daemon.md).

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use super::job::Built;
use super::stage;
use super::validate::ValidationConfig;
use super::{backend, runtime, BuildError, BuildOptions, Progress, StagedArtifact};
pub use crate::config::WorkerLimits;
use crate::spec::Backend;

/// Environment variable naming the executable to run as the worker (default: this one).
/// For hosts of the library other than the `trtcache` binary (tests, embedders).
pub const WORKER_EXE_ENV: &str = "TRTCACHE_WORKER_EXE";

/// The most stderr kept from a worker for its failure reason.
const STDERR_TAIL: usize = 1024;

/// How often the parent checks the worker, cancellation and the deadline.
const POLL: Duration = Duration::from_millis(20);

/// One build for a worker.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub model: PathBuf,
    pub backend: Backend,
    pub options: BuildOptions,
    pub validation: ValidationConfig,
    /// The empty staging directory the artifact is written to.
    pub out: PathBuf,
    /// The configured ONNX Runtime library, if any.
    pub ort_library: Option<PathBuf>,
    /// The parent's decode limits (config `limits.decode_*`), for every model the worker
    /// loads.
    #[serde(default)]
    pub decode: crate::onnx::DecodeLimits,
    /// A fetched artifact to check instead of a build (`out` is then unused): that it opens
    /// the way consumers will, and with `revalidate` that it passes validation against
    /// `model`. The daemon never opens an ONNX Runtime or TensorRT session itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckArtifact>,
    /// Set in the worker's environment (a build for an incoming TensorRT:
    /// `crate::trt::incoming::IncomingTrt::env`); not sent.
    #[serde(skip)]
    pub env: Vec<(String, std::ffi::OsString)>,
}

/// [`Job::check`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckArtifact {
    pub artifact: StagedArtifact,
    pub revalidate: bool,
}

/// One line of a worker's stdout.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Progress(Progress),
    Reply(Reply),
}

/// A worker's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Built(Box<Built>),
    /// The fetched artifact of a [`Job::check`] passed.
    Checked,
    /// The build or validation failed; `kind` tells the parent how to classify it.
    Failed {
        kind: FailKind,
        message: String,
    },
}

/// The class of a worker's failure, so the parent maps it as an in-process build would.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailKind {
    /// ONNX Runtime or a provider is missing or broken (the machine's problem).
    Runtime,
    /// The cache's file system is full.
    Full,
    /// The cache cannot be written for another reason (read-only, I/O error, its folders
    /// deleted): the machine's condition, retried, never the model's failure.
    Storage,
    /// The model cannot be built or validated.
    Model,
}

/// Builds and validates `job` in a worker process, killing it when `cancelled` turns true or
/// the wall limit passes.
pub fn run(
    job: &Job,
    limits: &WorkerLimits,
    cancelled: &(dyn Fn() -> bool + Sync),
    progress: &dyn Fn(&Progress),
) -> Result<Built, BuildError> {
    match exchange(job, limits, cancelled, progress)? {
        Reply::Built(b) => Ok(*b),
        Reply::Checked => Err(BuildError::Worker(
            "the worker checked instead of building".into(),
        )),
        Reply::Failed { kind, message } => Err(failure(job, kind, message)),
    }
}

/// Checks a fetched artifact ([`Job::check`]) in a worker process, under the same limits as
/// a build.
pub fn check(
    job: &Job,
    limits: &WorkerLimits,
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<(), BuildError> {
    match exchange(job, limits, cancelled, &|_| {})? {
        Reply::Checked => Ok(()),
        Reply::Built(_) => Err(BuildError::Worker(
            "the worker built instead of checking".into(),
        )),
        Reply::Failed { kind, message } => Err(failure(job, kind, message)),
    }
}

/// A worker's [`Reply::Failed`] as the error an in-process build would have given.
fn failure(job: &Job, kind: FailKind, message: String) -> BuildError {
    match kind {
        FailKind::Runtime => BuildError::WorkerUnavailable(message),
        FailKind::Full => BuildError::Store(crate::cache::StoreError::Full {
            path: job.out.clone(),
            detail: message,
        }),
        FailKind::Storage => BuildError::Store(crate::cache::StoreError::io(
            &job.out,
            std::io::Error::other(message),
        )),
        FailKind::Model => BuildError::Model {
            path: job.model.clone(),
            message,
        },
    }
}

/// Runs `job` in a worker process and reads its reply (see [`run`]).
fn exchange(
    job: &Job,
    limits: &WorkerLimits,
    cancelled: &(dyn Fn() -> bool + Sync),
    progress: &dyn Fn(&Progress),
) -> Result<Reply, BuildError> {
    let (mut child, started) = start(job, limits)?;
    // Lines from the worker's stdout, read on a thread so the loop below can keep watching
    // the deadline and cancellation.
    let stdout = child.stdout.take();
    let (tx, rx) = std::sync::mpsc::channel::<Result<Line, String>>();
    let out_reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let Some(s) = stdout else { return };
        for line in std::io::BufReader::new(s).lines() {
            let Ok(line) = line else { return };
            let parsed = serde_json::from_str::<Line>(&line).map_err(|e| e.to_string());
            if tx.send(parsed).is_err() {
                return;
            }
        }
    });
    let mut reply: Option<Result<Reply, String>> = None;
    // The validation candidate whose reference run began and has not ended: a worker that
    // dies of a fault meanwhile died in ONNX Runtime running the original model on it.
    let pending = std::cell::RefCell::new(None::<String>);
    let drain = |reply: &mut Option<Result<Reply, String>>| {
        while let Ok(l) = rx.try_recv() {
            match l {
                Ok(Line::Progress(p)) => {
                    match &p {
                        Progress::TryingInputs(label) => {
                            *pending.borrow_mut() = Some(label.clone())
                        }
                        Progress::InputsFound => *pending.borrow_mut() = None,
                        _ => {}
                    }
                    progress(&p)
                }
                Ok(Line::Reply(r)) => *reply = Some(Ok(r)),
                Err(e) => *reply = Some(Err(e)),
            }
        }
    };
    let mut stderr = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut tail = Tail::default();
        if let Some(s) = stderr.as_mut() {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = s.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                tail.push(&chunk[..n]);
            }
        }
        tail.text()
    });
    let killed = loop {
        drain(&mut reply);
        match child.try_wait() {
            Ok(Some(_)) => break None,
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                return Err(BuildError::WorkerUnavailable(format!(
                    "cannot wait for the worker: {e}"
                )));
            }
        }
        if cancelled() {
            break Some("cancelled".to_string());
        }
        if started.elapsed() >= limits.wall {
            break Some(format!(
                "the build exceeded its time limit of {} s (limits.build_timeout_secs); the worker was killed",
                limits.wall.as_secs()
            ));
        }
        std::thread::sleep(POLL);
    };
    if killed.is_some() {
        let _ = child.kill();
    }
    let status = child
        .wait()
        .map_err(|e| BuildError::WorkerUnavailable(format!("cannot reap the worker: {e}")))?;
    let _ = out_reader.join();
    drain(&mut reply);
    let err_tail = err_reader.join().unwrap_or_default();
    tracing::debug!(
        ?status,
        ms = started.elapsed().as_millis() as u64,
        "worker ended"
    );
    match killed.as_deref() {
        Some("cancelled") => return Err(BuildError::Cancelled),
        Some(why) => return Err(BuildError::Worker(why.to_string())),
        None => {}
    }
    if !status.success() {
        let why = crash_reason(status, limits, &err_tail);
        // A fault is the code's (ONNX Runtime's on this graph); an abort or SIGXCPU is a
        // limit doing its job, which a second try would only hit again. A SIGKILL the parent
        // did not send (its own kills are `killed` above) came from outside: the kernel's
        // OOM killer under host pressure, an admin. The caller may try that again.
        return Err(match status.signal() {
            Some(libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE) => {
                match pending.into_inner() {
                    Some(inputs) => BuildError::ReferenceCrashed { inputs, why },
                    None => BuildError::Crashed(why),
                }
            }
            Some(libc::SIGKILL) => BuildError::Killed(why),
            _ => BuildError::Worker(why),
        });
    }
    match reply {
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(BuildError::Worker(format!(
            "the worker's answer is not readable ({e}); its stderr ends: {err_tail}"
        ))),
        None => Err(BuildError::Worker(format!(
            "the worker exited without an answer; its stderr ends: {err_tail}"
        ))),
    }
}

/// Starts `trtcache worker` for `job` under `limits` and hands it the job: the child and when
/// it started.
fn start(job: &Job, limits: &WorkerLimits) -> Result<(std::process::Child, Instant), BuildError> {
    // `/proc/self/exe` is the running image even after its file was replaced (a package
    // upgrade under a running daemon): the worker is always the daemon's own version.
    let exe = std::env::var_os(WORKER_EXE_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    let input = serde_json::to_vec(job)
        .map_err(|e| BuildError::WorkerUnavailable(format!("cannot encode the job: {e}")))?;
    let mut cmd = Command::new(&exe);
    // A crash's reason is its first words ("memory allocation of N bytes failed"), not a
    // backtrace.
    cmd.arg("worker")
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // No `pre_exec`: with one, the child is a fork() of the daemon, which copies the
    // daemon's page tables (milliseconds per build once it holds 100,000 models); without,
    // it is spawned (posix_spawn, vfork-like). The limits are set on the child from here
    // before it is given its job (it does nothing but wait for it until then), and the
    // worker asks for its death signal itself (`serve_one`), checking that its parent is
    // still the daemon that started it.
    // SAFETY: getpid has no preconditions.
    cmd.env(PARENT_ENV, unsafe { libc::getpid() }.to_string());
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| {
        BuildError::WorkerUnavailable(format!("cannot start the worker {}: {e}", exe.display()))
    })?;
    tracing::debug!(pid = child.id(), model = %job.model.display(), "worker started");
    if let Err(e) = set_limits(child.id(), limits) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(BuildError::WorkerUnavailable(format!(
            "cannot set the worker's limits: {e}"
        )));
    }
    // The job is small; write it and close stdin so the worker sees its end.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&input);
    }
    Ok((child, started))
}

/// Environment variable holding the daemon's pid for its worker (see [`serve_one`]).
const PARENT_ENV: &str = "TRTCACHE_WORKER_PARENT";

/// The worker's data segment and CPU limits (`limits.worker_*`; 0: none), set on it by pid.
fn set_limits(pid: u32, limits: &WorkerLimits) -> std::io::Result<()> {
    for (res, v) in [
        (libc::RLIMIT_DATA, limits.memory_bytes),
        (libc::RLIMIT_CPU, limits.cpu_secs),
    ] {
        if v == 0 {
            continue;
        }
        let lim = libc::rlimit {
            rlim_cur: v as libc::rlim_t,
            rlim_max: v as libc::rlim_t,
        };
        // SAFETY: prlimit on our own child with a valid rlimit and no old-value pointer.
        if unsafe { libc::prlimit(pid as libc::pid_t, res, &lim, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Why a worker exited without answering, for the model's failure reason.
fn crash_reason(status: std::process::ExitStatus, limits: &WorkerLimits, err: &str) -> String {
    let tail = if err.is_empty() {
        String::new()
    } else {
        format!("; its stderr ends: {err}")
    };
    match status.signal() {
        Some(sig) => {
            let name = signal_name(sig);
            let hint = match sig {
                libc::SIGKILL => " (the kernel's OOM killer, or a cgroup memory limit)",
                libc::SIGXCPU => " (limits.worker_cpu_secs)",
                libc::SIGABRT if limits.memory_bytes > 0 => {
                    " (an allocation over limits.worker_memory_bytes aborts)"
                }
                _ => "",
            };
            format!("the build worker was killed by {name}{hint}{tail}")
        }
        None => format!(
            "the build worker exited with status {}{tail}",
            status.code().unwrap_or(-1)
        ),
    }
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGKILL => "SIGKILL",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// The last [`STDERR_TAIL`] bytes of a stream, as text with control characters escaped.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
        if self.0.len() > 2 * STDERR_TAIL {
            let cut = self.0.len() - STDERR_TAIL;
            self.0.drain(..cut);
        }
    }

    fn text(&self) -> String {
        let start = self.0.len().saturating_sub(STDERR_TAIL);
        String::from_utf8_lossy(&self.0[start..])
            .trim()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    }
}

/// The worker's side: reads a [`Job`] from stdin, builds and validates, writes a [`Reply`]
/// to stdout. Returns the process exit code (0 when a reply was written).
pub fn serve_one() -> i32 {
    // Dies with the daemon; a daemon gone before this (the worker re-parented) is checked.
    // SAFETY: prctl and getppid on this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    let parent = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse::<i32>().ok());
    if parent.is_some_and(|p| p != unsafe { libc::getppid() }) {
        eprintln!("trtcache worker: the daemon that started it is gone");
        return 2;
    }
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("trtcache worker: cannot read the job: {e}");
        return 2;
    }
    let job: Job = match serde_json::from_slice(&input) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("trtcache worker: the job is not readable: {e}");
            return 2;
        }
    };
    let out = std::sync::Mutex::new(std::io::stdout());
    let emit = |line: &Line| {
        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
        let ok = serde_json::to_writer(&mut *o, line).is_ok() && o.write_all(b"\n").is_ok();
        ok && o.flush().is_ok()
    };
    let progress = |p: &Progress| {
        emit(&Line::Progress(p.clone()));
    };
    crate::onnx::DecodeLimits::set_process_default(job.decode);
    let done = match &job.check {
        Some(c) => check_artifact(&job, c).map(|()| Reply::Checked),
        None => build_and_validate(&job, &progress).map(|b| Reply::Built(Box::new(b))),
    };
    let reply = match done {
        Ok(r) => r,
        Err(e) => {
            let kind = match &e {
                e if e.is_host_problem() => FailKind::Runtime,
                BuildError::Store(s) if s.is_full() => FailKind::Full,
                BuildError::Store(_) => FailKind::Storage,
                _ => FailKind::Model,
            };
            let message = match e {
                BuildError::Model { message, .. } => message,
                e => {
                    // The parent names the model (`BuildError::Model`): without this, an
                    // error that starts with its path would read `M.onnx: M.onnx: …`.
                    let text = e.to_string();
                    let own = format!("{}: ", job.model.display());
                    text.strip_prefix(&own).map(str::to_string).unwrap_or(text)
                }
            };
            Reply::Failed { kind, message }
        }
    };
    if emit(&Line::Reply(reply)) {
        0
    } else {
        eprintln!("trtcache worker: cannot write the reply");
        2
    }
}

/// What the worker does for a [`Job::check`]: the artifact opens the way consumers will,
/// and with `revalidate` passes validation against the model.
pub fn check_artifact(job: &Job, c: &CheckArtifact) -> Result<(), BuildError> {
    let rt = runtime::load(job.ort_library.as_deref())?;
    let b = backend(job.backend);
    b.check(rt)?;
    b.check_artifact(rt, &c.artifact, &job.options)?;
    if c.revalidate {
        let reference = stage::reference(rt, &job.model, &job.options, &job.validation, &|_| {})?;
        let v = stage::validate(
            &*b,
            rt,
            &job.model,
            &c.artifact,
            &job.options,
            &job.validation,
            reference,
        )?;
        if !v.passed {
            return Err(BuildError::Validation(format!(
                "re-validation against the model is over tolerance ({})",
                v.worst()
            )));
        }
    }
    Ok(())
}

/// What the worker does: the validation inputs and the original model's outputs on them,
/// the backend's build into `job.out`, then validation against those outputs. The same
/// steps [`super::Builder`] runs in process.
pub fn build_and_validate(job: &Job, progress: &dyn Fn(&Progress)) -> Result<Built, BuildError> {
    let rt = runtime::load(job.ort_library.as_deref())?;
    let b = backend(job.backend);
    b.check(rt)?;
    // Found first; a model that neither builds nor runs reports its build's error, as when
    // validation came after the build.
    let reference = stage::reference(rt, &job.model, &job.options, &job.validation, progress);
    let started = Instant::now();
    let artifact = b
        .build(rt, &job.model, &job.options, &job.out)
        .map_err(|e| stage::disk_full(&job.out, &job.model, e))?;
    let build_ms = started.elapsed().as_millis() as u64;
    let reference = reference?;
    progress(&Progress::Validating);
    let validation = stage::validate(
        &*b,
        rt,
        &job.model,
        &artifact,
        &job.options,
        &job.validation,
        reference,
    )?;
    Ok(Built {
        artifact,
        validation,
        build_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_reasons_name_the_signal_and_keep_a_bounded_tail() {
        let limits = WorkerLimits {
            memory_bytes: 1 << 30,
            cpu_secs: 0,
            wall: Duration::from_secs(1),
        };
        let st = std::process::ExitStatus::from_raw(libc::SIGABRT);
        let r = crash_reason(st, &limits, "memory allocation of 40000000000 bytes failed");
        assert!(
            r.contains("SIGABRT") && r.contains("worker_memory_bytes"),
            "{r}"
        );
        assert!(r.contains("40000000000"), "{r}");
        let mut t = Tail::default();
        for _ in 0..10_000 {
            t.push(b"x\x1b[31m");
        }
        let text = t.text();
        assert!(
            text.len() <= STDERR_TAIL && !text.contains('\x1b'),
            "{}",
            text.len()
        );
    }
}
