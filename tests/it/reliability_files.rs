//! What the file system can do to the CLI and the daemon (issue 13): a cache `lock` that is a
//! symbolic link, the modes of a new cache whatever the umask, repository entries that cannot
//! be served (names the protocol cannot carry, links out of the repository, a link to `/usr`),
//! and the daemon's socket file deleted, taken over, or the daemon sent SIGHUP.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, write};
use trtcache_client::Client;

use crate::daemon::Daemon;
use crate::support::{self, trtcache};

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_lock_that_is_a_symbolic_link_is_refused_and_its_target_untouched() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    // A cache (tagged by a first open), whose lock someone replaced with a link.
    let out = trtcache([
        "gc",
        "--max-size",
        "1M",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(cache.join("lock")).unwrap();
    let target = d.path().join("passwd");
    std::fs::write(&target, b"root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::os::unix::fs::symlink(&target, cache.join("lock")).unwrap();
    for args in [&["ls"][..], &["gc", "--max-size", "1M"], &["verify"]] {
        let out = trtcache(
            args.iter()
                .copied()
                .chain(["--cache-dir", cache.to_str().unwrap()]),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("lock") && err.contains("is a symbolic link"),
            "{args:?}: {err}"
        );
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"root:x:0:0:root:/root:/bin/sh\n",
            "{args:?} wrote through the link"
        );
    }
}

#[test]
fn a_new_cache_is_closed_to_others_whatever_the_umask() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    // `build` creates a cache (`ls` refuses a missing one: a typo'd --cache-dir).
    let m = d.path().join("enc.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let mut c = support::cmd();
    c.arg("build").arg(&m).arg("--cache-dir").arg(&cache);
    // SAFETY: umask in the child before exec; async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&cache), 0o750);
    for sub in ["blobs", "tmp", "records", "quarantine"] {
        assert_eq!(mode(&cache.join(sub)), 0o750, "{sub}");
    }
    assert_eq!(mode(&cache.join("db")), 0o700);
    let mut files = 0;
    for e in std::fs::read_dir(cache.join("db")).unwrap().flatten() {
        let want = if e.path().is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&e.path()), want, "{}", e.path().display());
        files += 1;
    }
    assert!(files > 0, "sled wrote no files");
    assert_eq!(mode(&cache.join("lock")) & 0o007, 0, "lock open to others");
}

/// The inotify watches `pid` holds (`wd:` lines of its inotify descriptors' fdinfo).
fn inotify_watches(pid: u32) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let link = std::fs::read_link(e.path()).unwrap_or_default();
        if link.to_string_lossy().contains("inotify") {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            n += info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
        }
    }
    n
}

#[test]
fn unservable_entries_are_reported_once_and_never_break_the_rest() {
    use std::os::unix::ffi::OsStrExt;
    let mut d = Daemon::new();
    let enc = models::tiny_encoder(false);
    write(&enc, &d.models().join("good.onnx")).unwrap();
    write(&enc, &d.models().join("back\\slash.onnx")).unwrap();
    write(&enc, &d.models().join("esc\x1b]0;pwned\x07.onnx")).unwrap();
    write(
        &enc,
        &d.models()
            .join(std::ffi::OsStr::from_bytes(b"latin1-\xe9.onnx")),
    )
    .unwrap();
    let outside = d.root.join("outside");
    write(&enc, &outside.join("elsewhere.onnx")).unwrap();
    std::os::unix::fs::symlink(
        outside.join("elsewhere.onnx"),
        d.models().join("linked.onnx"),
    )
    .unwrap();
    // A folder linked from far away: never descended into by the watcher.
    std::os::unix::fs::symlink("/usr", d.models().join("usr")).unwrap();
    d.start();
    let pid = d.child.as_ref().unwrap().id();
    let list = d.wait_settled(&["good"]);
    let names: Vec<&str> = list.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["good"], "{}", d.log());
    // Several rescans (every 2 s): each refusal is still logged once.
    std::thread::sleep(Duration::from_secs(5));
    let log = d.log();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("skipped: ")).collect();
    // backslash, escape, not UTF-8, the file link and the folder link.
    assert_eq!(refusals.len(), 5, "{refusals:#?}");
    assert!(
        refusals
            .iter()
            .any(|l| l.contains("a folder out of the repository")),
        "{refusals:#?}"
    );
    assert!(
        refusals.iter().any(|l| l.contains("not UTF-8")),
        "{refusals:#?}"
    );
    assert!(
        refusals
            .iter()
            .any(|l| l.contains("leading out of the repository")),
        "{refusals:#?}"
    );
    assert!(!log.contains('\x1b'), "a raw escape reached the log");
    let watches = inotify_watches(pid);
    assert!(
        watches < 20,
        "{watches} inotify watches (the link to /usr was followed)"
    );
    // `status` and `warm` through the socket see the good model only, and succeed.
    let st = support::cmd()
        .args(["status", "--socket"])
        .arg(d.socket())
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(text.contains("good") && !text.contains('\x1b'), "{text}");
    let warm = support::cmd()
        .args(["warm", "--config"])
        .arg(d.config())
        .output()
        .unwrap();
    assert!(
        warm.status.success(),
        "{}{}",
        String::from_utf8_lossy(&warm.stdout),
        String::from_utf8_lossy(&warm.stderr)
    );
    assert!(d.stop());
}

#[test]
fn a_link_out_of_the_repository_is_served_when_the_config_says_so() {
    let mut d = Daemon::new();
    let outside = d.root.join("outside");
    write(&models::tiny_encoder(false), &outside.join("m.onnx")).unwrap();
    std::os::unix::fs::symlink(outside.join("m.onnx"), d.models().join("linked.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        cfg.replace("[limits]", "follow_symlinks_outside_repo = true\n[limits]"),
    )
    .unwrap();
    d.start();
    let list = d.wait_settled(&["linked"]);
    assert_eq!(list.len(), 1);
    assert!(d.stop());
}

/// A config for a second daemon on `socket` with its own cache and repository under `dir`.
fn second_daemon(dir: &Path, socket: &Path) -> std::process::Child {
    std::fs::create_dir_all(dir.join("models")).unwrap();
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "models = {:?}\ncache_dir = {:?}\nsocket = {:?}\nort_library = {:?}\n[limits]\nsocket_check_secs = 0\n",
            dir.join("models"),
            dir.join("cache"),
            socket,
            support::ort_dylib()
        ),
    )
    .unwrap();
    Command::new(support::bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
        .spawn()
        .unwrap()
}

fn wait_connect(socket: &Path, what: &str) {
    let t0 = Instant::now();
    while Client::connect(socket).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: no daemon on {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn set_limit(d: &Daemon, line: &str) {
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        cfg.replace("[limits]\n", &format!("[limits]\n{line}\n")),
    )
    .unwrap();
}

#[test]
fn stopping_a_daemon_never_removes_a_successors_socket() {
    let mut a = Daemon::new();
    set_limit(&a, "socket_check_secs = 0");
    a.start();
    // A's socket file goes (a cleaner of /run), B binds the path.
    std::fs::remove_file(a.socket()).unwrap();
    let bdir = tempfile::tempdir().unwrap();
    let mut b = second_daemon(bdir.path(), &a.socket());
    wait_connect(&a.socket(), "B");
    assert!(a.stop(), "A did not stop cleanly: {}", a.log());
    assert!(a.socket().exists(), "stopping A removed B's socket");
    Client::connect(a.socket()).expect("B still answers");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(b.id() as i32, libc::SIGTERM) };
    assert!(b.wait().unwrap().success());
    assert!(!a.socket().exists(), "B removes its own socket");
}

#[test]
fn a_deleted_socket_is_bound_again() {
    let mut d = Daemon::new();
    set_limit(&d, "socket_check_secs = 1");
    d.start();
    std::fs::remove_file(d.socket()).unwrap();
    let t0 = Instant::now();
    wait_connect(&d.socket(), "rebind");
    eprintln!("socket bound again after {:?}", t0.elapsed());
    assert!(
        d.log().contains("the socket file was deleted"),
        "{}",
        d.log()
    );
    let mut c = d.client();
    c.list().unwrap();
    assert!(d.stop());
    assert!(!d.socket().exists());
}

#[test]
fn a_socket_taken_over_stops_the_daemon_with_an_error() {
    let mut d = Daemon::new();
    set_limit(&d, "socket_check_secs = 1");
    d.start();
    // Another socket file at the path (what another daemon binding it leaves): not ours any
    // more. Renamed over it in one step, so the daemon never sees the path empty.
    let aside = d.root.join("other.sock");
    let other = std::os::unix::net::UnixListener::bind(&aside).unwrap();
    std::fs::rename(&aside, d.socket()).unwrap();
    let mut child = d.child.take().unwrap();
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "daemon kept running: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!st.success(), "{st}");
    assert!(d.log().contains("replaced by another file"), "{}", d.log());
    assert!(d.socket().exists(), "the other socket was removed");
    drop(other);
}

#[test]
fn sighup_restarts_only_with_a_config_that_loads() {
    let mut d = Daemon::new();
    d.start();
    let good = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("{good}no_such_setting = 1\n")).unwrap();
    let pid = d.child.as_ref().unwrap().id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        d.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "a bad config stopped it: {}",
        d.log()
    );
    d.client().list().unwrap();
    assert!(
        d.log().contains("configuration does not load"),
        "{}",
        d.log()
    );
    std::fs::write(d.config(), &good).unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let mut child = d.child.take().unwrap();
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st.code(), Some(75), "{}", d.log());
    assert!(!d.socket().exists(), "socket left behind");
    // The next start takes the cache (the lock was released).
    d.start();
    assert!(d.stop());
}

/// Polls `list` until `name` has a ready variant (panics after 90 s with the log).
fn wait_ready(d: &Daemon, name: &str) -> Duration {
    use trtcache_client::protocol::VariantState;
    let mut c = d.client();
    let t0 = Instant::now();
    loop {
        let l = c.list().unwrap();
        if l.iter()
            .any(|m| m.name == name && m.variants.iter().any(|v| v.state == VariantState::Ready))
        {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{name} never ready: {l:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cache_folders_deleted_under_the_daemon_come_back_and_builds_go_on() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("first.onnx")).unwrap();
    d.start();
    wait_ready(&d, "first");
    for sub in ["tmp", "blobs", "records", "quarantine"] {
        std::fs::remove_dir_all(d.cache().join(sub)).unwrap();
    }
    // A new model: its build needs tmp/ (staging), blobs/ and records/.
    write(&models::tiny_encoder(true), &d.models().join("second.onnx")).unwrap();
    let took = wait_ready(&d, "second");
    eprintln!("built {took:?} after its folders were deleted");
    for sub in ["tmp", "blobs", "records"] {
        assert!(d.cache().join(sub).is_dir(), "{sub} not recreated");
    }
    // The first model's artifact went with blobs/: an acquire rebuilds it, never fails.
    let mut c = d.client();
    for name in ["first", "second"] {
        c.acquire(&trtcache_client::protocol::AcquireRequest {
            model: name.into(),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("acquire {name}: {e}\n{}", d.log()));
    }
    assert!(d.stop());
}

/// `dir` bind-mounted over itself read-only (root only); unmounted on drop.
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn mount(dir: &Path) -> Result<ReadOnly, String> {
        let run = |args: &[&str]| {
            let out = Command::new("mount").args(args).arg(dir).output();
            match out {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
                Err(e) => Err(e.to_string()),
            }
        };
        let d = dir.to_str().unwrap();
        run(&["--bind", d])?;
        let ro = ReadOnly(dir.to_path_buf());
        run(&["-o", "remount,bind,ro"])?;
        Ok(ro)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_read_only_cache_is_not_the_models_failure_and_builds_resume_when_writable() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root to bind-mount the cache read-only (chmod does not stop root, and a non-root test has no other way); the deletion test covers the retry");
        return;
    }
    let mut d = Daemon::new();
    d.start();
    let ro = match ReadOnly::mount(&d.cache().join("tmp")) {
        Ok(ro) => ro,
        Err(e) => {
            eprintln!(
                "SKIPPED: cannot bind-mount {} read-only ({e})",
                d.cache().display()
            );
            return;
        }
    };
    write(&models::tiny_encoder(false), &d.models().join("m.onnx")).unwrap();
    // The build fails with EROFS: reported, not remembered as the model's failure.
    let t0 = Instant::now();
    let reason = loop {
        let mut c = d.client();
        let l = c.list().unwrap();
        let r = l
            .iter()
            .find(|m| m.name == "m")
            .and_then(|m| m.variants.first())
            .and_then(|v| v.reason.clone());
        if let Some(r) = r {
            break r;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{l:?}\n{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(reason.contains("Read-only file system"), "{reason}");
    std::thread::sleep(Duration::from_secs(2));
    drop(ro);
    // No request: the daemon's own retry (backoff 1, 2, 4 … s) builds it.
    let took = wait_ready(&d, "m");
    eprintln!("built {took:?} after the cache became writable again");
    assert!(d.log().contains("retrying"), "{}", d.log());
    assert!(d.stop());
}

#[test]
fn decode_limits_come_from_the_config_file_and_are_validated() {
    let mut d = Daemon::new();
    // A 200-node chain is within the built-in budget (10M nodes); the config allows 50.
    write(&models::long_chain(200), &d.models().join("chain.onnx")).unwrap();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("{cfg}decode_max_nodes = 0\n")).unwrap();
    let out = support::cmd()
        .args(["config", "--config"])
        .arg(d.config())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("limits.decode_max_nodes"), "{err}");
    std::fs::write(d.config(), format!("{cfg}decode_max_nodes = 50\n")).unwrap();
    d.start();
    let list = d.wait_settled(&["chain", "enc"]);
    let chain = list.iter().find(|m| m.name == "chain").unwrap();
    let reason = chain.variants[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("over the limit of 50"),
        "{reason}\n{}",
        d.log()
    );
    let enc = list.iter().find(|m| m.name == "enc").unwrap();
    assert_eq!(
        enc.variants[0].state,
        trtcache_client::protocol::VariantState::Ready,
        "{}",
        d.log()
    );
    assert!(d.stop());
}

#[test]
fn terminal_escapes_in_a_path_are_never_printed_raw() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x\x1b]0;pwned\x07\x1b[31m.onnx");
    std::fs::write(&p, b"not a model").unwrap();
    for cmd in ["inspect", "key"] {
        let out = trtcache([std::ffi::OsStr::new(cmd), p.as_os_str()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            !err.contains('\x1b') && !err.contains('\x07'),
            "{cmd}: {err:?}"
        );
        assert!(err.contains("\\u{1b}"), "{cmd}: {err:?}");
    }
    // A model built from such a path: `build` and `ls` print its name escaped too.
    let m = d.path().join("enc\x1b[31m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let cache = d.path().join("cache");
    let c = cache.to_str().unwrap();
    let build = trtcache([
        std::ffi::OsStr::new("build"),
        m.as_os_str(),
        "--cache-dir".as_ref(),
        c.as_ref(),
    ]);
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let ls = trtcache(["ls", "--cache-dir", c]);
    for out in [&build.stdout, &ls.stdout] {
        let text = String::from_utf8_lossy(out);
        assert!(
            !text.contains('\x1b') && text.contains("enc\\u{1b}[31m"),
            "{text:?}"
        );
    }
}

#[test]
fn a_fifo_given_as_a_model_is_refused_at_once() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("m.onnx");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let cache = d.path().join("cache");
    for args in [
        vec!["inspect", fifo.to_str().unwrap()],
        vec!["key", fifo.to_str().unwrap()],
        vec![
            "build",
            fifo.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
    ] {
        let mut child = support::cmd()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("{args:?} blocked on the FIFO");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(st.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("is a FIFO, not a regular file"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_model_made_readable_is_planned_again() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root to run the daemon as another uid (the owner of an unreadable file can always read it back)");
        return;
    }
    let mut d = Daemon::new();
    // The daemon runs as uid 65534, for which a 0600 root file is unreadable.
    std::fs::set_permissions(&d.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    for p in [d.models(), d.cache()] {
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    }
    let m = d.models().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    std::fs::set_permissions(&m, std::fs::Permissions::from_mode(0o600)).unwrap();
    let child = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(support::bin())
        .args(["-v", "serve", "--config"])
        .arg(d.config())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.root.join("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    d.child = Some(child);
    wait_connect(&d.socket(), "daemon as uid 65534");
    let list = d.wait_settled(&["m"]);
    let reason = list[0].variants[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("Permission denied"),
        "{reason}\n{}",
        d.log()
    );
    // Same bytes, same mtime; only the mode (and ctime) change.
    std::fs::set_permissions(&m, std::fs::Permissions::from_mode(0o644)).unwrap();
    let took = wait_ready(&d, "m");
    eprintln!("ready {took:?} after the chmod");
    assert!(d.stop());
}
