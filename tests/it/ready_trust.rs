//! Who may write the ready index (docs/protocol.md, "Who may write the ready index"): the
//! Rust and Python clients take a pointer only from a folder and file of the socket's owner
//! that nobody else may write, while the daemon that made them runs (it holds the folder's
//! lock), naming an artifact of that owner; the daemon replaces what another user planted at
//! the folder's path; a killed daemon's pointers, or a previous daemon's under
//! `ready_index = false`, are never read. Tests run as root; "another user" is `nobody`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use trtcache::fixtures::{models, write};
use trtcache_client::ready::{self, ReadyPointer};

use crate::clients::python_client;
use crate::daemon::Daemon;
use crate::ready_index::{pointer_path, socket_key, started, wait_pointer};
use crate::support;

/// Holds an open file description write lock on `path` (created), as a running daemon holds
/// its index's [`ready::READY_LOCK`] (`write`), or a read lock, as any consumer may.
fn hold_lock(path: &Path, write: bool) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = if write { libc::F_WRLCK } else { libc::F_RDLCK } as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: a valid descriptor and `flock`.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &l) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    f
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The uid the hostile layouts belong to ("another user"): `nobody`.
const OTHER: u32 = 65534;

/// A copy of a daemon's pointer in an index of its own, laid out as a running daemon keeps
/// one (a root-owned folder `0750` and pointer `0640`, its lock held: by this process), next
/// to a socket file where nothing listens: a client that trusts the copy takes the artifact
/// from it; one that does not asks the socket and fails to connect.
pub(crate) struct FakeIndex {
    tmp: tempfile::TempDir,
    pub(crate) socket: PathBuf,
    lock: Option<std::fs::File>,
}

impl FakeIndex {
    pub(crate) fn new(d: &Daemon, model: &str) -> FakeIndex {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("d.sock");
        // Bound, then closed: a socket file that refuses connections.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let dir = ready::ready_dir(&socket);
        std::fs::create_dir(&dir).unwrap();
        set_mode(&dir, 0o750);
        let ptr = dir.join(model);
        std::fs::copy(pointer_path(d, model), &ptr).unwrap();
        set_mode(&ptr, 0o640);
        let lock = Some(hold_lock(&dir.join(ready::READY_LOCK), true));
        FakeIndex { tmp, socket, lock }
    }

    fn dir(&self) -> PathBuf {
        ready::ready_dir(&self.socket)
    }
}

/// Hostile layouts of the index, each in its own [`FakeIndex`], with whether a client may
/// take the artifact from it. Only the first and the last (controls) may.
fn hostile_layouts(d: &Daemon) -> Vec<(&'static str, FakeIndex, bool)> {
    use std::os::unix::fs::{chown, symlink, MetadataExt};
    let fake = || FakeIndex::new(d, "enc");
    let mut out = Vec::new();
    out.push(("intact", fake(), true));
    let f = fake();
    chown(f.dir(), Some(OTHER), Some(OTHER)).unwrap();
    out.push(("the folder is another user's", f, false));
    let f = fake();
    set_mode(&f.dir(), 0o777);
    out.push(("others may write the folder", f, false));
    let f = fake();
    let real = f.tmp.path().join("real.ready");
    std::fs::rename(f.dir(), &real).unwrap();
    symlink(&real, f.dir()).unwrap();
    out.push(("the folder is a link to a good one", f, false));
    let f = fake();
    chown(f.dir().join("enc"), Some(OTHER), Some(OTHER)).unwrap();
    out.push(("the pointer is another user's", f, false));
    let f = fake();
    set_mode(&f.dir().join("enc"), 0o660);
    out.push(("the group may write the pointer", f, false));
    let f = fake();
    std::fs::rename(f.dir().join("enc"), f.tmp.path().join("enc")).unwrap();
    symlink(f.tmp.path().join("enc"), f.dir().join("enc")).unwrap();
    out.push(("the pointer is a link to a good one", f, false));
    let mut f = fake();
    f.lock = None;
    out.push(("no running daemon holds the index", f, false));
    let f = fake();
    chown(&f.socket, Some(OTHER), Some(OTHER)).unwrap();
    out.push(("the socket is another user's", f, false));
    let f = fake();
    std::fs::remove_file(&f.socket).unwrap();
    std::fs::write(&f.socket, "").unwrap();
    out.push(("the socket is not a socket", f, false));
    // A pointer naming a planted artifact folder whose files carry the stamps the pointer
    // says (what another user who could write a pointer would plant): refused for being
    // another user's; the same folder as the daemon's user's is taken (the control).
    for (what, uid, ok) in [
        ("the artifact's folder is another user's", OTHER, false),
        ("the artifact's folder is the socket owner's", 0, true),
    ] {
        let f = fake();
        let ptr = f.dir().join("enc");
        let mut p = ReadyPointer::parse(&std::fs::read_to_string(&ptr).unwrap()).unwrap();
        let planted = f.tmp.path().join("planted");
        std::fs::create_dir(&planted).unwrap();
        set_mode(&planted, 0o755);
        for file in p.files.iter_mut() {
            let to = planted.join(&file.name);
            std::fs::copy(p.dir.join(&file.name), &to).unwrap();
            set_mode(&to, 0o644);
            chown(&to, Some(uid), Some(uid)).unwrap();
            let m = std::fs::metadata(&to).unwrap();
            let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
            (file.dev, file.ino, file.size) = (m.dev(), m.ino(), m.size());
            file.mtime_ns = ns(m.mtime(), m.mtime_nsec());
            file.ctime_ns = ns(m.ctime(), m.ctime_nsec());
        }
        chown(&planted, Some(uid), Some(uid)).unwrap();
        p.dir = planted;
        std::fs::write(&ptr, p.render().unwrap()).unwrap();
        out.push((what, f, ok));
    }
    out
}

/// Issue 39: a pointer is trusted only in a folder that is a real folder of the socket's
/// owner, written by nobody else, while the daemon that made it runs, and only when it names
/// an artifact folder and files of that owner that nobody else may write. The Rust and Python
/// clients read each hostile layout the same way.
#[test]
fn clients_trust_only_an_index_the_socket_owner_keeps_while_its_daemon_runs() {
    let d = started(&[("enc", models::tiny_encoder(false))]);
    wait_pointer(&d, "enc", "written", |p| p.is_some());
    let layouts = hostile_layouts(&d);
    for (what, f, ok) in &layouts {
        let got = ready::acquire(&f.socket, "enc").is_some();
        assert_eq!(got, *ok, "Rust client: {what}");
    }
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
import trtcache_client as t
bad = []
for sock, what, ok in zip(sys.argv[2::3], sys.argv[3::3], sys.argv[4::3]):
    try:
        got = t.Client(sock).acquire("enc").from_index
    except t.ConnectionFailed:
        got = False
    if got != (ok == "1"):
        bad.append(what)
assert not bad, bad
print("layouts ok")
"#;
    let mut args: Vec<PathBuf> = vec![python_client()];
    for (what, f, ok) in &layouts {
        args.extend([
            f.socket.clone(),
            PathBuf::from(what),
            PathBuf::from(if *ok { "1" } else { "0" }),
        ]);
    }
    let refs: Vec<&Path> = args.iter().map(|p| p.as_path()).collect();
    let out = support::run_python(script, &refs);
    assert!(out.contains("layouts ok"), "{out}");
}

/// The daemon replaces what another user planted at the index's path before it started (a
/// folder open to all with a pointer in it, or a link to their own folder), and says so.
#[test]
fn a_planted_index_folder_is_replaced_when_the_daemon_starts() {
    use std::os::unix::fs::{chown, symlink, MetadataExt};
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let dir = ready::ready_dir(&d.socket());
    std::fs::create_dir(&dir).unwrap();
    set_mode(&dir, 0o777);
    std::fs::write(dir.join("enc"), "trtcache-ready 1\n").unwrap();
    chown(dir.join("enc"), Some(OTHER), Some(OTHER)).unwrap();
    chown(&dir, Some(OTHER), Some(OTHER)).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    let p = wait_pointer(&d, "enc", "written by the daemon", |p| p.is_some()).unwrap();
    assert_eq!(p.metadata.key, socket_key(&d, "enc"));
    let m = std::fs::symlink_metadata(&dir).unwrap();
    assert!(m.is_dir() && m.uid() == 0, "{m:?}");
    assert_eq!(m.permissions().mode() & 0o777, 0o750);
    assert!(
        d.log().contains("a folder of uid 65534")
            && d.log().contains("removed it and made the daemon's"),
        "{}",
        d.log()
    );
    assert!(d.stop());

    // A link to another user's folder: the link is replaced, their folder left as it was.
    let theirs = d.root.join("outside/theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("enc"), "theirs").unwrap();
    chown(&theirs, Some(OTHER), Some(OTHER)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    symlink(&theirs, &dir).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    wait_pointer(&d, "enc", "written by the daemon", |p| p.is_some());
    assert!(std::fs::symlink_metadata(&dir).unwrap().is_dir());
    assert_eq!(
        std::fs::read_to_string(theirs.join("enc")).unwrap(),
        "theirs"
    );
    assert!(d.log().contains("a symbolic link"), "{}", d.log());
    assert!(d.stop());

    // A consumer holding a read lock on a lock file left behind cannot keep the next daemon
    // from taking its own (it makes the file afresh).
    let _theirs = hold_lock(&dir.join(ready::READY_LOCK), false);
    d.start();
    d.wait_settled(&["enc"]);
    wait_pointer(&d, "enc", "written by the daemon", |p| p.is_some());
    assert!(ready::acquire(&d.socket(), "enc").is_some(), "{}", d.log());
}

/// Issue 39: a killed daemon's pointers are never read (no running daemon holds the index's
/// lock), and a daemon started with `ready_index = false` removes the index it finds.
#[test]
fn a_dead_daemon_s_pointers_are_never_trusted_and_ready_index_off_removes_them() {
    let mut d = started(&[("enc", models::tiny_encoder(false))]);
    let p = wait_pointer(&d, "enc", "written", |p| p.is_some()).unwrap();
    assert!(ready::acquire(&d.socket(), "enc").is_some());
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        pointer_path(&d, "enc").exists(),
        "SIGKILL leaves the pointer"
    );
    assert!(
        ready::acquire(&d.socket(), "enc").is_none(),
        "a dead daemon's pointer was trusted"
    );
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
import trtcache_client as t
try:
    t.Client(sys.argv[2]).acquire("enc")
    print("served")
except t.ConnectionFailed:
    print("asked the socket")
"#;
    let out = support::run_python(script, &[&python_client(), &d.socket()]);
    assert!(out.contains("asked the socket"), "{out}");

    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("ready_index = false\n{cfg}")).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    let dir = ready::ready_dir(&d.socket());
    assert!(!dir.exists(), "the old index is left\n{}", d.log());
    assert_eq!(
        d.client().acquire_model("enc").unwrap().metadata.key,
        p.metadata.key
    );
}

/// `chattr +i` on a path until dropped: not even root may remove what is in it.
struct Immutable(PathBuf);

impl Immutable {
    fn new(p: &Path) -> Immutable {
        let st = std::process::Command::new("chattr")
            .arg("+i")
            .arg(p)
            .status()
            .expect("running chattr");
        assert!(
            st.success(),
            "chattr +i {} (the test needs it)",
            p.display()
        );
        Immutable(p.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

/// What another user planted at the index's path and the daemon cannot remove (here an
/// immutable folder, as a non-root daemon meets another user's folder in a sticky `/tmp`):
/// refused, with the reason logged, and no pointer anywhere; acquires go over the socket.
#[test]
fn a_planted_index_folder_the_daemon_cannot_remove_is_refused() {
    use std::os::unix::fs::chown;
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let dir = ready::ready_dir(&d.socket());
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("enc"), "trtcache-ready 1\n").unwrap();
    chown(dir.join("enc"), Some(OTHER), Some(OTHER)).unwrap();
    chown(&dir, Some(OTHER), Some(OTHER)).unwrap();
    let _guard = Immutable::new(&dir);
    d.start();
    d.wait_settled(&["enc"]);
    let log = d.log();
    assert!(
        log.contains("refusing it") && log.contains("no ready index"),
        "{log}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("enc")).unwrap(),
        "trtcache-ready 1\n"
    );
    assert!(ready::acquire(&d.socket(), "enc").is_none());
    assert_eq!(
        d.client().acquire_model("enc").unwrap().metadata.key,
        socket_key(&d, "enc")
    );
    assert!(d.stop());
}

/// The index's lock file deleted by hand under a running daemon: consumers stop trusting the
/// index at once and trust it again once the daemon's next pass has made it again.
#[test]
fn a_deleted_lock_file_is_made_again() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("{cfg}ready_recheck_secs = 1\n")).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    wait_pointer(&d, "enc", "written", |p| p.is_some());
    assert!(ready::acquire(&d.socket(), "enc").is_some());
    std::fs::remove_file(ready::ready_dir(&d.socket()).join(ready::READY_LOCK)).unwrap();
    assert!(ready::acquire(&d.socket(), "enc").is_none());
    let t0 = std::time::Instant::now();
    while ready::acquire(&d.socket(), "enc").is_none() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "{}",
            d.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
