//! An incoming TensorRT (issue 43): a TensorRT install other than the one this process
//! loads, that a daemon builds `trt` (and `ort-tensorrt`) artifacts for before a deploy
//! switches to it. Two TensorRTs never share a process, so its version is asked in a child
//! process ([`probe`]: `trtcache probe-tensorrt`, hidden, which loads the shim with
//! `TENSORRT_ROOT` and `TRTCACHE_TRT_SHIM` pointing at it and prints what
//! `getInferLibVersion` said), and every build for it runs in a worker whose environment
//! points at it ([`IncomingTrt::env`]).
//!
//! Enters: an install root (`ROOT/lib` holds `libnvinfer.so.*`) and optionally its own shim
//! (a shim is linked against one TensorRT major: a new major needs a shim built against it).
//! Leaves: the probed [`IncomingTrt`], or a [`ProbeError`] saying what is wrong. The root,
//! its `lib/` and the shim pass [`crate::libs::trust`] before anything is run with them.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::loader::ROOT_ENV as ROOT_ENV_NAME;
use super::{TrtVersion, SHIM_ENV, SHIM_FILE};

/// How long the probe may take (loading TensorRT takes seconds; a hung one is killed).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// The most stderr of a failed probe kept for its error.
const STDERR_TAIL: usize = 1024;

/// A probed incoming TensorRT.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncomingTrt {
    /// The install root as configured (trust-checked, resolved).
    pub root: PathBuf,
    /// The shim its builds load: the configured one, else `ROOT/lib/libtrtcache_trt.so`
    /// when there is one; `None`: the one this daemon's own search finds (same major).
    pub shim: Option<PathBuf>,
    /// `getInferLibVersion()` of its library, through the shim.
    pub version: TrtVersion,
}

impl IncomingTrt {
    /// The environment of a process that builds for it: `TENSORRT_ROOT`, the shim (when it
    /// has its own) and `LD_LIBRARY_PATH` with `ROOT/lib` first (the TensorRT execution
    /// provider of ONNX Runtime dlopens `libnvinfer` by name).
    pub fn env(&self) -> Vec<(String, OsString)> {
        env_for(&self.root, self.shim.as_deref())
    }
}

fn env_for(root: &Path, shim: Option<&Path>) -> Vec<(String, OsString)> {
    let mut ld = OsString::from(root.join("lib"));
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    let mut env = vec![
        (ROOT_ENV_NAME.to_string(), root.as_os_str().to_owned()),
        ("LD_LIBRARY_PATH".to_string(), ld),
    ];
    if let Some(s) = shim {
        env.push((SHIM_ENV.to_string(), s.as_os_str().to_owned()));
    }
    env
}

/// Why an incoming TensorRT cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("TensorRT at {}: {why}", .root.display())]
    NotARoot { root: PathBuf, why: String },
    #[error("TensorRT at {}: {error}", .root.display())]
    Untrusted {
        root: PathBuf,
        error: crate::libs::trust::Untrusted,
    },
    #[error("TensorRT at {}: cannot start the probe {}: {error}", .root.display(), .exe.display())]
    Start {
        root: PathBuf,
        exe: PathBuf,
        error: std::io::Error,
    },
    #[error("TensorRT at {}: the version probe {how}{}", .root.display(), tail(.stderr))]
    Failed {
        root: PathBuf,
        how: String,
        stderr: String,
    },
    #[error("TensorRT at {}: the version probe did not finish in {} s and was killed", .root.display(), .timeout.as_secs())]
    Timeout { root: PathBuf, timeout: Duration },
    #[error("TensorRT at {}: the version probe's answer is not readable ({why}): {output}", .root.display())]
    Unreadable {
        root: PathBuf,
        why: String,
        output: String,
    },
}

fn tail(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; its stderr ends: {stderr}")
    }
}

/// What the probe prints on stdout.
#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    tensorrt: TrtVersion,
    shim: PathBuf,
}

/// Checks `root` (and its `lib/`) and `shim`, then asks the TensorRT there for its version
/// in a child process: `exe probe-tensorrt` (`exe`: normally this binary), killed after
/// `timeout`.
pub fn probe(
    root: &Path,
    shim: Option<&Path>,
    exe: &Path,
    timeout: Duration,
) -> Result<IncomingTrt, ProbeError> {
    let (root, shim) = checked(root, shim)?;
    let mut cmd = Command::new(exe);
    cmd.arg("probe-tensorrt");
    let answer = run(cmd, &root, shim.as_deref(), timeout)?;
    tracing::debug!(root = %root.display(), shim = %answer.shim.display(), tensorrt = %answer.tensorrt, "incoming TensorRT probed");
    Ok(IncomingTrt {
        root,
        shim,
        version: answer.tensorrt,
    })
}

/// The root resolved and trusted (it and `ROOT/lib`), and the shim to use (trusted).
fn checked(root: &Path, shim: Option<&Path>) -> Result<(PathBuf, Option<PathBuf>), ProbeError> {
    let not_root = |why: String| ProbeError::NotARoot {
        root: root.to_path_buf(),
        why,
    };
    if !root.is_absolute() {
        return Err(not_root("not an absolute path".into()));
    }
    match std::fs::metadata(root) {
        Err(e) => return Err(not_root(e.to_string())),
        Ok(m) if !m.is_dir() => {
            return Err(not_root(
                "not a folder (an install root, whose lib/ holds libnvinfer.so.*)".into(),
            ))
        }
        Ok(_) => {}
    }
    if !root.join("lib").is_dir() {
        return Err(not_root(
            "no lib/ folder: not a TensorRT install root (what TENSORRT_ROOT names)".into(),
        ));
    }
    let untrusted = |error| ProbeError::Untrusted {
        root: root.to_path_buf(),
        error,
    };
    let real = crate::libs::trust::trusted_dir(root).map_err(untrusted)?;
    crate::libs::trust::trusted_dir(&real.join("lib")).map_err(untrusted)?;
    let own = real.join("lib").join(SHIM_FILE);
    let shim = match shim {
        Some(s) => Some(s.to_path_buf()),
        None if own.exists() => Some(own),
        None => None,
    };
    let shim = shim
        .map(|s| crate::libs::trust::trusted_file(&s).map_err(untrusted))
        .transpose()?;
    Ok((real, shim))
}

/// Runs `cmd` with the environment of `root`, reading its answer.
fn run(
    mut cmd: Command,
    root: &Path,
    shim: Option<&Path>,
    timeout: Duration,
) -> Result<Answer, ProbeError> {
    cmd.envs(env_for(root, shim))
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let exe = PathBuf::from(cmd.get_program());
    let mut child = cmd.spawn().map_err(|error| ProbeError::Start {
        root: root.to_path_buf(),
        exe,
        error,
    })?;
    let reader = |s: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut s) = s {
                let _ = s.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = reader(child.stdout.take().map(|s| Box::new(s) as _));
    let err = reader(child.stderr.take().map(|s| Box::new(s) as _));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if started.elapsed() >= timeout => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(ProbeError::Timeout {
            root: root.to_path_buf(),
            timeout,
        });
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    let stderr = text_tail(&err);
    if !status.success() {
        use std::os::unix::process::ExitStatusExt;
        let how = match status.signal() {
            Some(sig) => format!("crashed (signal {sig})"),
            None => format!("failed (exit status {})", status.code().unwrap_or(-1)),
        };
        return Err(ProbeError::Failed {
            root: root.to_path_buf(),
            how,
            stderr,
        });
    }
    // The answer is the last line (a TensorRT that logs to stdout writes before it).
    let text = String::from_utf8_lossy(&out);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(last.trim()).map_err(|e| ProbeError::Unreadable {
        root: root.to_path_buf(),
        why: e.to_string(),
        output: text_tail(&out),
    })
}

/// The last [`STDERR_TAIL`] bytes of `b`, one line, control characters as spaces.
fn text_tail(b: &[u8]) -> String {
    let start = b.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&b[start..])
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The child's side (`trtcache probe-tensorrt`): loads the shim as its environment says
/// (`TENSORRT_ROOT`, `TRTCACHE_TRT_SHIM`), prints the TensorRT version as JSON; exit code 0,
/// or 2 with the loader's error on stderr.
pub fn probe_main() -> i32 {
    match super::Trt::load(&super::LoaderConfig::from_env()) {
        Ok(t) => {
            let a = Answer {
                tensorrt: t.version(),
                shim: t.shim_path().to_path_buf(),
            };
            match serde_json::to_string(&a) {
                Ok(s) => {
                    println!("{s}");
                    0
                }
                Err(e) => {
                    eprintln!("trtcache probe-tensorrt: {e}");
                    2
                }
            }
        }
        Err(e) => {
            eprintln!("trtcache probe-tensorrt: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("lib")).unwrap();
        std::fs::set_permissions(d.path().join("lib"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        d
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn a_root_is_an_absolute_trusted_folder_with_lib() {
        let e = probe(
            Path::new("/nonexistent/TensorRT"),
            None,
            Path::new("/bin/true"),
            PROBE_TIMEOUT,
        )
        .unwrap_err();
        assert!(matches!(e, ProbeError::NotARoot { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("TensorRT at /nonexistent/TensorRT: "),
            "{e}"
        );
        let e = checked(Path::new("rel/TensorRT"), None).unwrap_err();
        assert!(e.to_string().contains("not an absolute path"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let e = checked(d.path(), None).unwrap_err();
        assert!(e.to_string().contains("no lib/ folder"), "{e}");
        let d = root();
        let lib = d.path().join("lib");
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = checked(d.path(), None).unwrap_err();
        assert!(matches!(e, ProbeError::Untrusted { .. }), "{e}");
        assert!(e.to_string().contains("writable by"), "{e}");
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
        // No shim of its own: none (the daemon's search); one in lib/: that one.
        assert_eq!(checked(d.path(), None).unwrap().1, None);
        let shim = lib.join(SHIM_FILE);
        std::fs::write(&shim, b"").unwrap();
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = checked(d.path(), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("libtrtcache_trt.so: refusing to load it: writable by"),
            "{e}"
        );
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            checked(d.path(), None).unwrap().1,
            Some(std::fs::canonicalize(&shim).unwrap())
        );
        let e = checked(d.path(), Some(Path::new("/nonexistent/libtrtcache_trt.so"))).unwrap_err();
        assert!(e.to_string().contains("cannot resolve"), "{e}");
    }

    #[test]
    fn a_probe_that_crashes_hangs_fails_or_babbles_is_a_precise_error() {
        let d = root();
        let r = d.path();
        let e = run(
            sh("echo 'no shim here' >&2; kill -SEGV $$"),
            r,
            None,
            PROBE_TIMEOUT,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("the version probe crashed (signal 11); its stderr ends: no shim here"),
            "{e}"
        );
        let t0 = Instant::now();
        let e = run(sh("sleep 30"), r, None, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, ProbeError::Timeout { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
        let e = run(
            sh("echo 'TensorRT is not available' >&2; exit 2"),
            r,
            None,
            PROBE_TIMEOUT,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("failed (exit status 2); its stderr ends: TensorRT is not available"),
            "{e}"
        );
        let e = run(sh("echo hello"), r, None, PROBE_TIMEOUT).unwrap_err();
        assert!(matches!(e, ProbeError::Unreadable { .. }), "{e}");
        let logged = r#"echo '[TRT] [I] loaded'; echo '{"tensorrt":{"major":10,"minor":17,"patch":1},"shim":"/s"}'"#;
        let a = run(sh(logged), r, None, PROBE_TIMEOUT).unwrap();
        assert_eq!(a.tensorrt.to_string(), "10.17.1");
        let e = probe(r, None, Path::new("/nonexistent/trtcache"), PROBE_TIMEOUT).unwrap_err();
        assert!(matches!(e, ProbeError::Start { .. }), "{e}");
        // The child sees the root, its lib/ first on the library path, and the shim.
        let shim = r.join("lib").join(SHIM_FILE);
        let a = run(
            sh(r#"printf '{"tensorrt":{"major":10,"minor":17,"patch":0},"shim":"%s|%s|%s"}' "$TENSORRT_ROOT" "${LD_LIBRARY_PATH%%:*}" "$TRTCACHE_TRT_SHIM""#),
            r,
            Some(&shim),
            PROBE_TIMEOUT,
        )
        .unwrap();
        assert_eq!(a.tensorrt.to_string(), "10.17.0");
        assert_eq!(
            a.shim,
            PathBuf::from(format!(
                "{}|{}|{}",
                r.display(),
                r.join("lib").display(),
                shim.display()
            ))
        );
    }
}
