//! The clients against the real daemon: the Python package installed with pip into a fresh
//! venv, its typed exceptions, provider defaults, timeouts that reset the connection, the
//! response cap and dropped descriptors (`MSG_CTRUNC` at `RLIMIT_NOFILE`); the same
//! behaviours of the Rust client. The daemon is paused with SIGSTOP where a call must time
//! out, so no test depends on how long anything takes. Sessions from artifacts evicted
//! between the acquire and the session. Also the install side: the systemd unit's security
//! exposure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use trtcache::fixtures::{models, write};
use trtcache_client::frame::FrameError;
use trtcache_client::{AcquireRequest, Client, ClientError, ErrorCode};

use crate::daemon::Daemon;
use crate::support;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn python_client() -> PathBuf {
    repo().join("clients/python")
}

/// A daemon serving `enc` (the tiny encoder) and `bad` (an op ONNX Runtime cannot load),
/// with `limits` appended to its `[limits]`, started and with both models settled.
fn daemon_with(limits: &str) -> Daemon {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    write(&models::custom_domain(), &d.models().join("bad.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("{cfg}{limits}")).unwrap();
    d.start();
    d.wait_settled(&["enc", "bad"]);
    d
}

/// Pauses the daemon (SIGSTOP) until dropped (SIGCONT), so a request sent meanwhile gets
/// no answer however long the client waits.
struct Paused(i32);

impl Paused {
    fn new(d: &Daemon) -> Paused {
        let pid = d.child.as_ref().expect("running").id() as i32;
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        let paused = Paused(pid);
        let t0 = std::time::Instant::now();
        while !all_stopped(pid) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "daemon did not stop"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        paused
    }
}

/// Whether every thread of `pid` is in the stopped state (`T` in `/proc/PID/task/*/stat`).
fn all_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
            .unwrap_or(false)
    })
}

/// Python for the same: `stop(pid)` pauses the daemon and returns once all its threads
/// are stopped.
const PY_STOP: &str = r#"
import glob, signal, time
def stop(pid):
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while True:
        states = []
        for p in glob.glob("/proc/%d/task/*/stat" % pid):
            try:
                states.append(open(p).read().rsplit(") ", 1)[1][0])
            except (OSError, IndexError):
                states.append("?")
        if states and all(s == "T" for s in states):
            return
        assert time.monotonic() < deadline, states
        time.sleep(0.005)
"#;

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[test]
fn python_client_installs_with_pip_into_a_fresh_venv_and_talks_to_the_daemon() {
    let mut d = daemon_with("");
    let tmp = tempfile::tempdir().unwrap();
    let venv = tmp.path().join("venv");
    let st = Command::new(support::python())
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(st.success(), "python -m venv");
    let py = venv.join("bin/python");
    // Offline and without build isolation: the package's build backend is the standard
    // library's, so a fresh venv needs nothing from an index.
    let out = Command::new(&py)
        .args([
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-build-isolation",
            "--disable-pip-version-check",
        ])
        .arg(python_client())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pip install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let script = r#"
import os, sys, importlib.metadata as md
import trtcache_client as t
here = os.path.dirname(t.__file__)
assert "site-packages" in here, here          # the installed copy, not the checkout
assert os.path.exists(os.path.join(here, "py.typed")), os.listdir(here)
assert md.version("trtcache-client") == t.__version__ == "0.1.0"
c = t.Client(sys.argv[1])
names = [m["name"] for m in c.list()]
with c.acquire("enc", timeout=60) as art:
    g = art.graph_bytes()
    assert len(g) == art.metadata["files"][0]["bytes"], (len(g), art.metadata["files"])
try:
    c.acquire("nope")
except t.NotFound as e:
    assert e.code == "not_found" and isinstance(e, t.TrtcacheError)
else:
    raise SystemExit("no NotFound")
print("ok", sorted(names), art.metadata["backend"])
"#;
    let out = Command::new(&py)
        .arg("-c")
        .arg(script)
        .arg(d.socket())
        .current_dir(tmp.path())
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "installed client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ok ['bad', 'enc'] ort-cpu"), "{stdout}");
    assert!(d.stop());
}

#[test]
fn python_errors_are_typed_and_sessions_use_the_artifacts_provider() {
    let mut d = daemon_with("max_connections = 3\nreclaim_idle_secs = 3600\n");
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    let script = r#"
import sys, json
sys.path.insert(0, sys.argv[1])
import onnxruntime as ort
import trtcache_client as t
from trtcache_client import errors

# One subclass per daemon error code, all under TrtcacheError.
for code in json.loads(sys.argv[3]):
    cls = t.BY_CODE[code]
    assert issubclass(cls, t.TrtcacheError) and cls.code == code, code
    e = t.error_for(code, "m")
    assert type(e) is cls and e.code == code and str(e) == code + ": m", (code, e)
assert type(t.error_for("from_the_future", "x")) is t.TrtcacheError

def raises(cls, f, *a, **k):
    try:
        f(*a, **k)
    except t.TrtcacheError as e:
        assert type(e) is cls, (cls, type(e), e)
        return e
    raise SystemExit("%s not raised" % cls.__name__)

c = t.Client(sys.argv[2])
raises(t.NotFound, c.acquire, "nope")
raises(t.BadName, c.acquire, "../etc/passwd")
raises(t.BuildFailed, c.acquire, "bad")
raises(t.NotFound, c.acquire, "enc", backend="no-such-backend")

# The other requests answer typed values.
events = []
res = c.build(["enc"], on_progress=events.append)
assert [(r["model"], r["state"]) for r in res] == [("enc", "ready")], res
assert all(e["kind"] == "progress" for e in events), events
assert c.status("enc")["name"] == "enc"
assert "trtcache_builds_total" in c.stats(prometheus=True)

# ort-cpu: CPU only by default, whatever else onnxruntime has.
with c.acquire("enc", timeout=60) as art:
    assert art.backend == "ort-cpu" and art.providers() == ["CPUExecutionProvider"]
    sess = art.session()
    assert sess.get_providers() == ["CPUExecutionProvider"], sess.get_providers()
    meta, fds = art.metadata, list(art.fds)
    # A GPU artifact asks for its provider; this CPU wheel lacks CUDA and TensorRT, so the
    # client refuses instead of ONNX Runtime falling back to CPU. (The metadata is relabelled:
    # no GPU builds run here.)
    for backend, provider in [("ort-cuda", "CUDAExecutionProvider"), ("ort-tensorrt", "TensorrtExecutionProvider")]:
        gpu = t.Artifact(dict(meta, backend=backend), fds)
        assert gpu.providers()[0] == provider and gpu.providers()[-1] == "CPUExecutionProvider"
        assert provider not in ort.get_available_providers()
        e = raises(t.ProviderUnavailable, gpu.session)
        assert provider in e.message and backend in e.message, e.message
        # An explicit provider list is the caller's choice.
        s = gpu.session(providers=["CPUExecutionProvider"])
        assert s.get_providers() == ["CPUExecutionProvider"]
        # fp32 means fp32: where the CUDA provider serves an fp32 artifact it gets
        # use_tf32 = 0 (checked on the arguments: this wheel has no CUDA provider).
        real = ort.get_available_providers
        ort.get_available_providers = lambda: [provider, "CUDAExecutionProvider", "CPUExecutionProvider"]
        try:
            got = gpu._ort_defaults({})["providers"]
            assert ("CUDAExecutionProvider", {"use_tf32": "0"}) in got, got
            half = t.Artifact(dict(meta, backend=backend, precision="fp16"), [])
            assert "CUDAExecutionProvider" in half._ort_defaults({})["providers"]
        finally:
            ort.get_available_providers = real
        gpu.fds = []  # the descriptors belong to `art`
    plan = t.Artifact(dict(meta, backend="trt"), [])
    raises(t.ProviderUnavailable, plan.session)

# The response cap: a `list` bigger than max_response is refused and resets the connection;
# the next call connects again and works.
c.max_response = 64
e = raises(t.ResponseTooLarge, c.list)
assert "64" in e.message and c.resets == 1, (e, c.resets)
c.max_response = t.DEFAULT_MAX_RESPONSE
assert sorted(m["name"] for m in c.list()) == ["bad", "enc"] and c.resets == 1

# At max_connections (3) the next connection is refused with Busy, once the daemon has seen
# the reset connection go.
import time
deadline = time.monotonic() + 30
while c.stats()["connections"] != 1:
    assert time.monotonic() < deadline, c.stats()
    time.sleep(0.02)
# Clients connect at their first call that needs the socket (or `connect()`).
others = [t.Client(sys.argv[2]).connect(), t.Client(sys.argv[2]).connect()]
# The hello's answer is read with the first request's: the refusal comes there.
raises(t.Busy, lambda: t.Client(sys.argv[2]).list())
print("typed ok")
"#;
    let out = support::run_python(
        script,
        &[
            &python_client(),
            &d.socket(),
            Path::new(&serde_json::to_string(&codes).unwrap()),
        ],
    );
    assert!(out.contains("typed ok"), "{out}");
    assert!(d.stop());
}

/// The client's own JSON codec (CPython's `_json` accelerator, without `json`'s import cost)
/// reads and writes what `json` does, on random values and on malformed text; and importing
/// the client loads none of `json`, `socket` (nor `_socket`, `_json`), `threading`,
/// `dataclasses`, nor its own `errors`, `watch`, `_wire`, `_codec` and `_files` modules until
/// they are needed (the import is part of every consumer's
/// first inference; BENCHMARKS.md, "Time to first inference").
#[test]
fn python_client_codec_matches_json_and_its_import_stays_lean() {
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
before = set(sys.modules)
import trtcache_client as t
heavy = {"json", "socket", "selectors", "threading", "dataclasses", "tempfile", "shutil",
         "trtcache_client.errors", "trtcache_client.watch",
         # the socket side, the JSON codec and the cold artifact paths load on first use: an
         # acquire from the ready index needs none of them
         "_socket", "_json", "trtcache_client._wire", "trtcache_client._codec",
         "trtcache_client._files"}
loaded = sorted(heavy & (set(sys.modules) - before))
assert not loaded, "importing trtcache_client loaded %s" % loaded
assert t.Watcher.__name__ == "Watcher" and "ready" in t.WATCH_REASONS  # loaded on first use
# The exceptions too, by attribute, by `from ... import` and in the package's __all__.
from trtcache_client import errors, NotFound
assert NotFound is errors.NotFound and t.TrtcacheError is errors.TrtcacheError
assert sorted(t._ERROR_NAMES) == sorted(errors.__all__) and set(errors.__all__) <= set(t.__all__)
try:
    t.NoSuchThing
except AttributeError:
    pass
else:
    raise SystemExit("t.NoSuchThing resolved")
import json, random
for c in ['{"a":1}', ' {"a":[1,2.5,-3e10,true,false,null,"x\\u00e9\\n\\ud83d\\ude00"]}\n', '[]', '"s"',
          'NaN', '-Infinity', '{"a":{"b":{"c":[[]]}}}', '1.5e-300', '{"kind":"artifact","metadata":{"files":[]}}']:
    assert repr(json.loads(c)) == repr(t._loads(c)), c
for bad in ['', ' ', '{', '{"a":1} x', '[1,]', '{"a" 1}', '"\\x"', '01', '{"a":1}{}', 'nul']:
    try:
        t._loads(bad)
    except ValueError:
        pass
    else:
        raise SystemExit("accepted %r" % bad)
rnd = random.Random(0)
def gen(d=0):
    k = rnd.randrange(7 if d < 4 else 4)
    if k == 0: return rnd.randrange(-10**20, 10**20)
    if k == 1: return "".join(chr(rnd.randrange(1, 0xD000)) for _ in range(rnd.randrange(8)))
    if k == 2: return None
    if k == 3: return rnd.random() < .5
    if k == 4: return [gen(d + 1) for _ in range(rnd.randrange(4))]
    if k == 5: return {str(gen(d + 1)): gen(d + 1) for _ in range(rnd.randrange(4))}
    return rnd.uniform(-1e9, 1e9)
for _ in range(5000):
    v = gen()
    text = json.dumps(v)
    assert json.loads(t._dumps(v)) == json.loads(text), v
    assert t._loads(text) == json.loads(text), text
print("codec ok")
"#;
    let out = support::run_python(script, &[&python_client()]);
    assert!(out.contains("codec ok"), "{out}");
}

#[test]
fn python_timeout_resets_the_connection_and_drops_the_late_answer() {
    let mut d = daemon_with("");
    let pid = d.child.as_ref().unwrap().id();
    // Before the fix the late `artifact` answer was read by the next call (KeyError: 'model')
    // and its descriptors leaked into the process.
    let script = r#"
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import trtcache_client as t
pid = int(sys.argv[3])
# Over the socket (the ready index would answer without asking the stopped daemon).
c = t.Client(sys.argv[2], timeout=1.0, ready_index=False)
c.acquire("enc").close()          # ready and served once
before = sorted(os.listdir("/proc/self/fd"))
stop(pid)
try:
    try:
        c.acquire("enc")
    except t.ConnectionTimeout as e:
        assert isinstance(e, t.Timeout) and e.code == "timeout", e
        assert "reset" in e.message, e.message
    else:
        raise SystemExit("no timeout from a stopped daemon")
    assert c.resets == 1
finally:
    os.kill(pid, signal.SIGCONT)
# The next call is answered on a new connection: its own answer, not the late artifact.
st = c.status("enc")
assert st["name"] == "enc" and st["variants"][0]["state"] == "ready", st
assert sorted(os.listdir("/proc/self/fd")) == before, (before, os.listdir("/proc/self/fd"))
with c.acquire("enc") as art:
    assert art.metadata["model"] == "enc"
print("timeout ok", c.resets)
"#;
    let script = format!("import os\n{PY_STOP}\n{script}");
    let out = support::run_python(
        &script,
        &[&python_client(), &d.socket(), Path::new(&pid.to_string())],
    );
    assert!(out.contains("timeout ok 1"), "{out}");
    assert!(d.stop());
}

#[test]
fn python_reports_descriptors_dropped_at_the_open_files_limit() {
    let mut d = daemon_with("");
    let script = r#"
import os, resource, sys
sys.path.insert(0, sys.argv[1])
import trtcache_client as t
# Descriptors sent over the socket (not the ready index's, opened by this process).
c = t.Client(sys.argv[2], ready_index=False)
c.acquire("enc").close()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
probe = os.open("/dev/null", os.O_RDONLY); os.close(probe)
# Room for exactly one more descriptor: the artifact's file fits, its directory does not.
resource.setrlimit(resource.RLIMIT_NOFILE, (probe + 1, hard))
before = sorted(os.listdir("/proc/self/fd"))
try:
    c.acquire("enc")
except t.DescriptorsTruncated as e:
    assert e.code == "descriptors_truncated" and "RLIMIT_NOFILE" in e.message, e.message
    assert "soft limit %d" % (probe + 1) in e.message, e.message
else:
    raise SystemExit("no DescriptorsTruncated")
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
assert sorted(os.listdir("/proc/self/fd")) == before, "the descriptors that arrived are closed"
# The frame was read whole: the same connection goes on.
with c.acquire("enc") as art:
    assert len(art.fds) == 1 and art.dir_fd is not None
assert c.resets == 0
print("ctrunc ok")
"#;
    let out = support::run_python(script, &[&python_client(), &d.socket()]);
    assert!(out.contains("ctrunc ok"), "{out}");
    assert!(d.stop());
}

#[test]
fn rust_timeout_resets_the_connection_and_errors_read_well() {
    let mut d = daemon_with("");
    let mut c = d.client();
    c.set_timeout(Some(Duration::from_millis(1000))).unwrap();
    let req = AcquireRequest {
        model: "enc".into(),
        ..Default::default()
    };
    assert!(req.wait, "the default waits, as on the wire");
    drop(c.acquire(&req).unwrap());
    {
        let _paused = Paused::new(&d);
        let e = c.acquire(&req).unwrap_err();
        assert!(
            matches!(e, ClientError::Timeout { after: Some(t) } if t == Duration::from_millis(1000)),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "no answer from the daemon within 1.000 s; the connection was reset (the next request connects again)"
        );
        assert_eq!(c.resets(), 1);
    }
    // Answered on a new connection: the status, not the late artifact.
    let st = c.status("enc").unwrap();
    assert_eq!(st.name, "enc");
    let a = c.acquire(&req).unwrap();
    assert_eq!(a.metadata.model, "enc");
    assert_eq!(c.resets(), 1);

    // Server errors read as `code: message`.
    let e = c
        .acquire(&AcquireRequest {
            model: "nope".into(),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    assert!(e.to_string().starts_with("not_found: "), "{e}");
    let e = c
        .acquire(&AcquireRequest {
            model: "bad".into(),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BuildFailed), "{e}");

    // The response cap resets too, and is configurable.
    c.set_max_response(64);
    let e = c.list().unwrap_err();
    assert!(
        matches!(e, ClientError::Frame(FrameError::TooLarge { max: 64, .. })),
        "{e:?}"
    );
    assert_eq!(c.resets(), 2);
    c.set_max_response(trtcache_client::DEFAULT_MAX_RESPONSE);
    assert_eq!(c.list().unwrap().len(), 2);
    assert!(d.stop());
}

/// Runs [`rust_descriptors_dropped_child`] in a process of its own (it lowers the process's
/// `RLIMIT_NOFILE`, which would starve the other tests' threads).
#[test]
fn rust_reports_descriptors_dropped_at_the_open_files_limit() {
    let mut d = daemon_with("");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "clients::rust_descriptors_dropped_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TRTCACHE_TEST_SOCKET", d.socket())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
    assert!(text.contains("ctrunc ok"), "{text}");
    assert!(d.stop());
}

#[test]
#[ignore = "run by rust_reports_descriptors_dropped_at_the_open_files_limit in its own process"]
fn rust_descriptors_dropped_child() {
    let socket = std::env::var_os("TRTCACHE_TEST_SOCKET").expect("TRTCACHE_TEST_SOCKET");
    let mut c = Client::connect(&socket).unwrap();
    let req = AcquireRequest {
        model: "enc".into(),
        dir_fd: true,
        ..Default::default()
    };
    drop(c.acquire(&req).unwrap());
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit/open/close with valid arguments.
    let probe = unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        assert!(fd >= 0);
        libc::close(fd);
        fd
    };
    let low = libc::rlimit {
        rlim_cur: probe as libc::rlim_t + 1,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let got = c.acquire(&req);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let e = got.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Frame(FrameError::DescriptorsTruncated { received: 1, nofile_limit: Some(n) })
                if n == probe as u64 + 1
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("RLIMIT_NOFILE"), "{e}");
    // The frame was read whole: the same connection goes on.
    let a = c.acquire(&req).unwrap();
    assert!(a.dir.is_some() && a.files.len() == 1);
    assert_eq!(c.resets(), 0);
    println!("ctrunc ok");
}

/// `systemd-analyze security` rates the shipped unit at most 4.0 (issue 16; 6.2 before the
/// hardening, 1.3 now), and keeps the NVIDIA device nodes reachable.
#[test]
fn the_systemd_unit_is_hardened_and_keeps_gpu_access() {
    let unit = repo().join("systemd/trtcache.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    for line in [
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=char-nvidia-uvm rw",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing");
    }
    assert!(
        !text.lines().any(|l| l.starts_with("PrivateDevices=yes")),
        "PrivateDevices hides /dev/nvidia*"
    );
    assert!(!text.contains("After=network.target"));
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("skipped the score: systemd-analyze is not installed (.ci/run installs it)");
        return;
    };
    assert!(out.status.success());
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let score: f64 = report
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for trtcache.service: "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no score in: {report}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(score <= 4.0, "exposure {score} > 4.0:\n{report}");
}

/// Issue 39: the descriptors of an acquire are enough for a session after the artifact is
/// evicted, for a one-file artifact and for an artifact with external data too (ONNX Runtime resolves an external file's
/// real path, which an evicted file no longer has): the Rust and Python clients, each from
/// the ready index and over the socket, open sessions after `evict` whose outputs are those
/// of a session opened before it.
#[test]
fn evicted_artifacts_with_external_data_still_open_as_sessions() {
    use std::io::{BufRead, Read, Write};
    use std::os::unix::fs::MetadataExt;
    use std::process::Stdio;
    let mut d = Daemon::new();
    write(&models::big_weights(2, 512), &d.models().join("big.onnx")).unwrap();
    // And the other layout: one file, no external data.
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    d.start();
    d.wait_settled(&["big", "enc"]);
    let t0 = std::time::Instant::now();
    let via_index = loop {
        if let Some(a) = trtcache_client::ready::acquire(&d.socket(), "big") {
            break a;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never published\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let via_socket = d
        .client()
        .acquire(&AcquireRequest {
            model: "big".into(),
            dir_fd: true,
            wait: true,
            ..Default::default()
        })
        .unwrap();
    assert!(via_index.files.len() >= 2, "{:?}", via_index.metadata.files);
    let x: Vec<f32> = (0..2 * 512).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect();
    let run = |a: &trtcache_client::Artifact| -> Vec<f32> {
        let mut s = crate::daemon::artifact_session(a);
        let t = ort::value::Tensor::from_array(([2usize, 512], x.clone())).unwrap();
        let out = s.run(ort::inputs!["x" => t]).unwrap();
        out["y"].try_extract_tensor::<f32>().unwrap().1.to_vec()
    };
    let want = run(&via_socket);
    let enc = d
        .client()
        .acquire(&AcquireRequest {
            model: "enc".into(),
            dir_fd: true,
            wait: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(enc.files.len(), 1, "{:?}", enc.metadata.files);
    let want_enc = crate::daemon::run_encoder(&mut crate::daemon::artifact_session(&enc), 3);

    let script = r#"
import os, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import trtcache_client as t
sock = sys.argv[2]
a = t.Client(sock).acquire("big")
assert a.from_index
b = t.Client(sock, ready_index=False).acquire("big")
assert not b.from_index and len(b.fds) >= 2
x = np.linspace(-1, 1, 2 * 512, dtype=np.float32).reshape(2, 512)
want = b.session().run(None, {"x": x})[0]
e = t.Client(sock, ready_index=False).acquire("enc")
assert len(e.fds) == 1
xe = np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(1, 3, 64)
want_e = e.session().run(None, {"x": xe})[0]
print("acquired", flush=True)
sys.stdin.readline()
for art, inp, w in ((a, x, want), (b, x, want), (e, xe, want_e)):
    assert all(os.fstat(fd).st_nlink == 0 for fd in art.fds), "not evicted"
    got = art.session().run(None, {"x": inp})[0]
    assert np.allclose(got, w, atol=1e-5), (got, w)
print("sessions ok", flush=True)
"#;
    let mut py = Command::new(support::python())
        .arg("-c")
        .arg(script)
        .arg(python_client())
        .arg(d.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "acquired", "{}", {
        let mut e = String::new();
        py.stderr.as_mut().unwrap().read_to_string(&mut e).unwrap();
        e
    });

    assert!(d.client().evict(Some("big"), None).unwrap() >= 1);
    assert!(d.client().evict(Some("enc"), None).unwrap() >= 1);
    let t0 = std::time::Instant::now();
    let removed = |a: &trtcache_client::Artifact| {
        a.files
            .iter()
            .all(|f| f.metadata().is_ok_and(|m| m.nlink() == 0))
    };
    while !(removed(&via_index) && removed(&via_socket) && removed(&enc)) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never evicted\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for (what, a) in [("index", &via_index), ("socket", &via_socket)] {
        crate::daemon::assert_close(&run(a), &want, what);
    }
    let got = crate::daemon::run_encoder(&mut crate::daemon::artifact_session(&enc), 3);
    crate::daemon::assert_close(&got, &want_enc, "one file");

    py.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let r = py.wait_with_output().unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(
        r.status.success() && rest.contains("sessions ok"),
        "{rest}\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
}
