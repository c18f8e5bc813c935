//! The daemon as a system service: config printing, connection limits and admin checks,
//! systemd socket activation and readiness notification, and `systemd-analyze verify` on the
//! shipped units. Uses the harness in `daemon.rs`.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, write};
use trtcache_client::protocol::ErrorCode;
use trtcache_client::Client;

use crate::daemon::Daemon;
use crate::support;

#[test]
fn config_prints_the_effective_values_and_flags_override() {
    let d = Daemon::new();
    let out = support::trtcache(
        ["config", "--json", "--config"]
            .iter()
            .map(|s| s.to_string())
            .chain([
                d.config().display().to_string(),
                "--socket".into(),
                "/tmp/x.sock".into(),
            ]),
    );
    let v = support::json(&out);
    assert_eq!(v["socket"], "/tmp/x.sock");
    assert_eq!(v["limits"]["debounce_ms"], 150);
    assert_eq!(v["limits"]["build_concurrency"], 1);
    let bad = d.root.join("bad.toml");
    std::fs::write(&bad, "[limits]\nmax_connections = 0\n").unwrap();
    let out = support::trtcache(
        ["config", "--config"]
            .iter()
            .map(|s| s.to_string())
            .chain([bad.display().to_string()]),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_connections"));
}

#[test]
fn systemd_units_verify() {
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("skipped: systemd-analyze is not installed");
        return;
    };
    assert!(out.status.success());
    let tmp = tempfile::tempdir().unwrap();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for unit in ["trtcache.service", "trtcache.socket"] {
        let text = std::fs::read_to_string(repo.join("systemd").join(unit)).unwrap();
        // verify checks that ExecStart exists: point it at the binary under test.
        let text = text.replace(
            "/usr/local/bin/trtcache",
            &support::bin().display().to_string(),
        );
        std::fs::write(tmp.path().join(unit), text).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(tmp.path().join("trtcache.socket"))
        .arg(tmp.path().join("trtcache.service"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn connection_limit_idle_timeout_and_admin_requests_are_enforced() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let mut cfg = std::fs::read_to_string(d.config()).unwrap();
    cfg = cfg.replace(
        "[limits]\n",
        "socket_mode = \"0666\"\n[limits]\nmax_connections = 2\nidle_timeout_secs = 1\n",
    );
    std::fs::write(d.config(), cfg).unwrap();
    d.start();
    let mut a = d.client();
    let _b = d.client();
    // The third connection is refused with `busy`.
    let mut third = UnixStream::connect(d.socket()).unwrap();
    let mut len = [0u8; 4];
    third.read_exact(&mut len).unwrap();
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    third.read_exact(&mut buf).unwrap();
    assert!(
        String::from_utf8_lossy(&buf).contains("\"busy\""),
        "{}",
        String::from_utf8_lossy(&buf)
    );
    // `a` stays usable, then goes idle and is closed with `idle_timeout`.
    assert_eq!(a.list().unwrap().len(), 1);
    std::thread::sleep(Duration::from_millis(1500));
    let e = a.recv().unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::IdleTimeout), "{e}");
    drop(a);
    drop(_b);

    // Admin requests from another uid are refused; from ours they work.
    let setpriv = Path::new("/usr/bin/setpriv");
    let py = Path::new("/usr/bin/python3");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !setpriv.exists() || !py.exists() {
        println!("skipped the other-uid part: needs root, /usr/bin/setpriv and /usr/bin/python3");
    } else {
        use std::os::unix::fs::PermissionsExt;
        // Let uid 65534 reach the socket through the temp folders.
        for p in [d.root.clone(), d.cache()] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        write(
            &models::tiny_encoder(true),
            &d.root.join("outside/staged.onnx"),
        )
        .unwrap();
        let script = r#"
import sys; sys.path.insert(0, sys.argv[1])
from trtcache_client import Client, TrtcacheError
c = Client(sys.argv[2])
for call in (lambda: c.evict(model="enc"), c.shutdown, lambda: c.build(paths=[sys.argv[3]])):
    try:
        call(); print("allowed")
    except TrtcacheError as e:
        print(e.code)
print(c.status("enc")["name"])
"#;
        let t0 = Instant::now();
        let out = loop {
            let out = Command::new(setpriv)
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(py)
                .arg("-c")
                .arg(script)
                .arg(repo.join("clients/python"))
                .arg(d.socket())
                .arg(d.root.join("outside/staged.onnx"))
                .output()
                .unwrap();
            // The refused connections above may still hold slots for a moment.
            if out.status.success() || t0.elapsed() > Duration::from_secs(10) {
                break out;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "permission_denied",
                "permission_denied",
                "permission_denied",
                "enc"
            ],
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut c = d.client();
    d.wait_settled(&["enc"]);
    assert_eq!(c.evict(Some("enc"), None).unwrap(), 1);
    c.shutdown().unwrap();
    let mut child = d.child.take().unwrap();
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "shutdown request ignored"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success());
}

/// A child process killed and reaped when dropped (a no-op once it has been waited for).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn socket_activation_and_readiness_notification() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    // systemd's side: a listening socket at a path the config does not name, and a notify socket.
    let activated = d.root.join("activated.sock");
    let listener = std::os::unix::net::UnixListener::bind(&activated).unwrap();
    let notify_path = d.root.join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" serve --config \"$1\"")
        .arg(support::bin())
        .arg(d.config())
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "400000")
        .stderr(std::fs::File::create(d.root.join("daemon.log")).unwrap());
    // SAFETY: dup2 in the child before exec, as systemd does for fd 3.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would keep close-on-exec; clear it instead.
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Killed if an assertion below fails: a panicking test leaves no daemon running.
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let mut buf = [0u8; 4096];
    let mut seen = String::new();
    while !(seen.contains("READY=1") && seen.contains("WATCHDOG=1")) {
        let n = notify
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification ({e}); got {seen:?}; log: {}", d.log()));
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        seen.push('\n');
    }
    assert!(seen.contains("STATUS="), "{seen}");
    // The daemon serves on the inherited socket, not on the configured path.
    let mut c = Client::connect(&activated).unwrap();
    assert_eq!(c.list().unwrap().len(), 1);
    assert!(
        !d.socket().exists(),
        "no socket bound at the configured path"
    );
    // And says so: the `ready` log line names the socket it listens on.
    let log = d.log();
    assert!(
        log.contains(&format!("socket={}", activated.display())),
        "the ready line names the inherited socket: {log}"
    );
    assert!(
        !log.contains(&format!("socket={}", d.socket().display())),
        "{log}"
    );
    drop(c);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    assert!(child.0.wait().unwrap().success());
    let mut stopping = String::new();
    notify
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    while let Ok(n) = notify.recv(&mut buf) {
        stopping.push_str(&String::from_utf8_lossy(&buf[..n]));
        if stopping.contains("STOPPING=1") {
            break;
        }
    }
    assert!(stopping.contains("STOPPING=1"), "{stopping}");
}
