//! The ready index (`<socket>.ready/`, docs/protocol.md): the real daemon publishes a pointer
//! for each model whose default artifact is ready, keeps it in step with what an acquire
//! over the socket hands out (a changed model, a sidecar added, an eviction), empties the
//! folder at start and stop, and counts consumers' opens as hits; the Rust and Python
//! clients take artifacts from it without the socket and fall back to the socket whenever a
//! check fails (a damaged pointer, a model or artifact changed since the daemon verified it).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, write};
use trtcache::onnx::proto::ModelProto;
use trtcache_client::protocol::AcquireRequest;
use trtcache_client::ready::{self, ReadyPointer};

use crate::clients::python_client;
use crate::daemon::Daemon;
use crate::ready_trust::FakeIndex;
use crate::support;

pub(crate) fn pointer_path(d: &Daemon, model: &str) -> PathBuf {
    ready::ready_dir(&d.socket()).join(model)
}

/// Polls until the pointer of `model` names a key for which `ok` holds (`None`: no pointer).
pub(crate) fn wait_pointer(
    d: &Daemon,
    model: &str,
    what: &str,
    ok: impl Fn(Option<&ReadyPointer>) -> bool,
) -> Option<ReadyPointer> {
    let t0 = Instant::now();
    loop {
        let p = std::fs::read_to_string(pointer_path(d, model))
            .ok()
            .map(|t| ReadyPointer::parse(&t).expect("the daemon writes pointers that parse"));
        if ok(p.as_ref()) {
            return p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "pointer of {model}: never {what} (now {p:?})\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The key an acquire over the socket hands out for `model`'s default variant.
pub(crate) fn socket_key(d: &Daemon, model: &str) -> String {
    d.client()
        .acquire(&AcquireRequest {
            model: model.into(),
            wait: true,
            ..Default::default()
        })
        .unwrap()
        .metadata
        .key
}

fn fast_hits(d: &Daemon) -> u64 {
    d.client().stats().unwrap().fast_hits
}

/// Polls the daemon's `fast_hits` until it reaches `n` (the inotify count is asynchronous).
fn wait_fast_hits(d: &Daemon, n: u64) {
    let t0 = Instant::now();
    while fast_hits(d) < n {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "fast_hits stayed at {} (< {n})\n{}",
            fast_hits(d),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn started(models_: &[(&str, ModelProto)]) -> Daemon {
    let mut d = Daemon::new();
    for (name, m) in models_ {
        write(m, &d.models().join(format!("{name}.onnx"))).unwrap();
    }
    d.start();
    let names: Vec<&str> = models_.iter().map(|(n, _)| *n).collect();
    d.wait_settled(&names);
    d
}

#[test]
fn the_index_follows_what_the_socket_serves() {
    let mut d = started(&[("enc", models::tiny_encoder(false))]);
    let key = socket_key(&d, "enc");
    let p = wait_pointer(&d, "enc", "written", |p| p.is_some()).unwrap();
    assert_eq!(p.metadata.key, key);
    assert_eq!(p.metadata.model, "enc");
    assert!(p.dir.is_absolute(), "{:?}", p.dir);

    // Readable by whoever may use the socket (0660 by default), written by the daemon only.
    let dir = ready::ready_dir(&d.socket());
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o750);
    let mode = std::fs::metadata(pointer_path(&d, "enc"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o640);

    // The Rust client takes it from the index (no request), the same artifact as the socket's;
    // the daemon counts the open as a hit. The baseline waits for the count of the one open
    // `wait_pointer` made, so the next one is the acquire's.
    wait_fast_hits(&d, 1);
    let before = d.client().stats().unwrap();
    let a = ready::acquire(&d.socket(), "enc").expect("from the index");
    // The metadata an acquire with `dir_fd` returns: the directory after the files.
    let mut want = p.metadata.clone();
    want.dir_fd_index = Some(p.files.len() as u32);
    assert_eq!(a.metadata, want);
    assert_eq!(a.files.len(), p.files.len());
    assert!(a.dir.is_some());
    wait_fast_hits(&d, before.fast_hits + 1);
    let after = d.client().stats().unwrap();
    assert!(after.hits > before.hits, "{before:?} -> {after:?}");
    let mut c = d.client();
    let via = c.acquire_model("enc").unwrap();
    assert_eq!(via.metadata.key, key);
    wait_fast_hits(&d, before.fast_hits + 2);

    // A sidecar written next to the model: not answered from the index from that moment on,
    // before the daemon has even seen it (and again once it is gone: nothing else changed,
    // the daemon writes the pointer again once its watch has seen the sidecar come and go).
    let sidecar = d.models().join("enc.trtcache.toml");
    std::fs::write(&sidecar, "[golden]\nseed = 7\n").unwrap();
    assert!(ready::acquire(&d.socket(), "enc").is_none());
    std::fs::remove_file(&sidecar).unwrap();
    let t0 = Instant::now();
    while ready::acquire(&d.socket(), "enc").is_none() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }

    // The model rewritten: refused at once (its stamp changed), then the daemon replaces the
    // pointer with the new content's artifact.
    write(&models::tiny_encoder(true), &d.models().join("enc.onnx")).unwrap();
    assert!(ready::acquire(&d.socket(), "enc").is_none());
    let p2 = wait_pointer(&d, "enc", "replaced", |p| {
        p.is_some_and(|p| p.metadata.key != key)
    })
    .unwrap();
    assert_eq!(p2.metadata.key, socket_key(&d, "enc"));
    assert!(ready::acquire(&d.socket(), "enc").is_some());

    // An artifact file changed since the daemon verified it: the index is not trusted. (Last
    // before the eviction: the chmod leaves the file's ctime changed for good.)
    let graph = p2.dir.join(&p2.files[0].name);
    let mut perms = std::fs::metadata(&graph).unwrap().permissions();
    let ro = perms.mode();
    perms.set_mode(ro | 0o200);
    std::fs::set_permissions(&graph, perms.clone()).unwrap();
    assert!(
        ready::acquire(&d.socket(), "enc").is_none(),
        "a chmod changes ctime"
    );
    perms.set_mode(ro);
    std::fs::set_permissions(&graph, perms).unwrap();

    // Evicted: the pointer goes with the artifact.
    assert!(d.client().evict(Some("enc"), None).unwrap() >= 1);
    wait_pointer(&d, "enc", "removed after the eviction", |p| {
        p.is_none_or(|p| p.metadata.key != p2.metadata.key)
    });

    // Stopped: the folder is emptied (consumers then ask the socket, which is gone).
    assert!(d.stop());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The daemon reads the index's open events on a timer (`limits.ready_hits_poll_ms`), so a
/// consumer's open wakes nothing. A burst of opens of one pointer inside one interval still
/// counts once each (the kernel merges identical unread events; the closes between the opens
/// keep them apart), and nothing is counted twice.
#[test]
fn a_burst_of_opens_inside_one_poll_interval_counts_once_each() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    // The config ends in its [limits] table.
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("{cfg}ready_hits_poll_ms = 1500\n")).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    wait_pointer(&d, "enc", "written", |p| p.is_some());
    wait_fast_hits(&d, 1);
    let before = fast_hits(&d);
    // Eight opens well inside one 1.5 s interval: five acquires, three plain reads.
    for _ in 0..5 {
        assert!(ready::acquire(&d.socket(), "enc").is_some());
    }
    for _ in 0..3 {
        std::fs::read_to_string(pointer_path(&d, "enc")).unwrap();
    }
    wait_fast_hits(&d, before + 8);
    // Two more intervals: no open is counted twice.
    std::thread::sleep(Duration::from_millis(3200));
    assert_eq!(fast_hits(&d), before + 8, "{}", d.log());
}

/// A local flood of pointer opens (far more in one tick than the kernel queues) costs counts,
/// logged once, and nothing else: acquires over the socket are answered throughout, and no
/// more hits are counted than there were opens.
#[test]
fn a_flood_of_pointer_opens_loses_counts_not_the_socket() {
    let d = started(&[("enc", models::tiny_encoder(false))]);
    wait_pointer(&d, "enc", "written", |p| p.is_some());
    wait_fast_hits(&d, 1);
    let before = fast_hits(&d);
    let path = pointer_path(&d, "enc");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders: Vec<_> = (0..2)
        .map(|_| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut opens = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    drop(std::fs::File::open(&path).unwrap());
                    opens += 1;
                }
                opens
            })
        })
        .collect();
    let mut c = d.client();
    let t0 = Instant::now();
    let mut answered = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        let a = c
            .acquire(&AcquireRequest {
                model: "enc".into(),
                ..Default::default()
            })
            .unwrap();
        assert!(!a.files.is_empty());
        answered += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opens: u64 = flooders.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(answered > 0);
    // Let the last ticks drain what is queued, then compare.
    std::thread::sleep(Duration::from_millis(1500));
    let counted = fast_hits(&d) - before;
    eprintln!("flood: {opens} opens, {counted} counted, {answered} acquires answered");
    assert!(counted <= opens, "{counted} hits counted for {opens} opens");
    let queued: u64 = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(16_384);
    // Two events an open (the close too), eight 250 ms ticks in 2 s, `queued` events a tick:
    // 4 × `queued` opens fit (65,536 by default); four times that cannot, however they fall.
    if opens > 16 * queued {
        assert!(
            d.log().contains("event queue overflowed"),
            "{opens} opens, {counted} counted, no overflow logged\n{}",
            d.log()
        );
    }
}

#[test]
fn a_stale_index_is_emptied_at_start_and_can_be_turned_off() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    // A previous daemon's pointer (killed, not stopped) and a half-written one.
    let dir = ready::ready_dir(&d.socket());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("enc"), "trtcache-ready 1\nkey\tdead\n").unwrap();
    std::fs::write(dir.join(".tmp-enc"), "half").unwrap();
    std::fs::write(dir.join("gone"), "trtcache-ready 1\n").unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    let p = wait_pointer(&d, "enc", "rewritten", |p| p.is_some()).unwrap();
    assert_eq!(p.metadata.key, socket_key(&d, "enc"));
    assert!(!dir.join("gone").exists() && !dir.join(".tmp-enc").exists());
    assert!(d.stop());

    // `ready_index = false`: no folder at all; acquires go over the socket.
    std::fs::remove_dir_all(&dir).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("ready_index = false\n{cfg}")).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    assert!(!dir.exists());
    let mut c = d.client();
    assert_eq!(c.acquire_model("enc").unwrap().metadata.key, p.metadata.key);
    assert_eq!(c.stats().unwrap().fast_hits, 0);
    assert!(d.stop());
}

/// The Python client: an acquire from the index loads neither the socket layer nor the JSON
/// codec and gives a session whose outputs are the socket's; every damaged copy of the
/// pointer (in a [`FakeIndex`], next to a socket where no daemon listens) falls back to the
/// socket, which then fails to connect: proof that the damaged pointer was not used.
#[test]
fn python_takes_ready_artifacts_without_the_socket_and_refuses_damaged_pointers() {
    let d = started(&[("enc", models::tiny_encoder(false))]);
    wait_pointer(&d, "enc", "written", |p| p.is_some());
    // Every open so far (wait_pointer's one) counted, so the script's opens come on top.
    wait_fast_hits(&d, 1);
    let before = fast_hits(&d);
    let fake = FakeIndex::new(&d, "enc");
    let script = r#"
import os, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import trtcache_client as t
sock, fake = sys.argv[2], sys.argv[3]
art = t.Client(sock).acquire("enc")
assert art.from_index, "not from the index"
loaded = {"_socket", "socket", "_json", "json", "trtcache_client._wire", "trtcache_client._codec"} & set(sys.modules)
assert not loaded, loaded
assert art.backend == "ort-cpu" and len(art.key) == 64 and art.free_dims()
x = np.linspace(-1, 1, 2 * 3 * 64, dtype=np.float32).reshape(2, 3, 64)
y = art.session().run(None, {"x": x})[0]
# Over the socket: the same artifact, metadata and outputs.
c = t.Client(sock, ready_index=False)
art2 = c.acquire("enc")
assert not art2.from_index
assert art2.metadata == art.metadata, (art2.metadata, art.metadata)
assert np.array_equal(art2.session().run(None, {"x": x})[0], y)
# A profile, backend or version named: always the socket.
assert not t.Client(sock).acquire("enc", backend="ort-cpu").from_index

text = open(sock + ".ready/enc").read()
def at_fake(body):
    with open(fake + ".ready/enc", "w") as f:
        f.write(body)
    try:
        a = t.Client(fake).acquire("enc")
    except t.ConnectionFailed:
        return "socket"
    assert a.from_index
    return "index"
# The intact pointer works without any daemon at that path.
assert at_fake(text) == "index"
lines = text.split("\n")
def edit(field, fn):
    return "\n".join(fn(l) if l.startswith(field + "\t") else l for l in lines)
def bump(l, i):
    f = l.split("\t"); f[i] = str(int(f[i]) + 1); return "\t".join(f)
damaged = {
    "magic": text.replace("trtcache-ready 1", "trtcache-ready 9", 1),
    "truncated": text[: len(text) // 3],
    "empty": "",
    "no meta": "\n".join(l for l in lines if not l.startswith("meta\t")),
    "file inode": edit("file", lambda l: bump(l, 2)),
    "file size": edit("file", lambda l: bump(l, 3)),
    "source mtime": edit("source", lambda l: bump(l, 2)),
    "source gone": edit("source", lambda l: l + ".nope"),
    "absent exists": edit("absent", lambda l: "absent\t" + sock),
    "dir gone": edit("dir", lambda l: l + "/nope"),
    "name escapes": edit("file", lambda l: l.rsplit("\t", 1)[0] + "\t../model.onnx"),
    "not utf-8": text.replace("enc", "\udcff", 1),
}
for what, body in damaged.items():
    try:
        got = at_fake(body)
    except UnicodeEncodeError:
        with open(fake + ".ready/enc", "wb") as f:
            f.write(text.encode().replace(b"enc", b"\xff", 1))
        try:
            t.Client(fake).acquire("enc"); got = "index"
        except t.ConnectionFailed:
            got = "socket"
    assert got == "socket", what
# Names that are not model names never reach the file system.
for bad in ["../enc", ".enc", "", "a/b"]:
    try:
        t.Client(fake).acquire(bad)
    except t.ConnectionFailed:
        pass
print("index ok")
"#;
    let out = support::run_python(script, &[&python_client(), &d.socket(), &fake.socket]);
    assert!(out.contains("index ok"), "{out}");
    // The Python process's opens of the pointer were counted.
    wait_fast_hits(&d, before + 1);
}

/// What the daemon writes matches what the daemon hands out for a model with external data
/// (two files in one folder).
#[test]
fn external_data_artifacts_are_published_with_every_file() {
    let d = started(&[("big", models::big_weights(2, 512))]);
    let p = wait_pointer(&d, "big", "written", |p| p.is_some()).unwrap();
    let a = ready::acquire(&d.socket(), "big").expect("from the index");
    assert_eq!(a.files.len(), p.metadata.files.len());
    let key = socket_key(&d, "big");
    assert_eq!(p.metadata.key, key);
    for (f, meta) in a.files.iter().zip(&p.metadata.files) {
        assert_eq!(f.metadata().unwrap().len(), meta.bytes, "{}", meta.name);
    }
    assert!(p.files.len() >= 2, "{p:?}");
}

/// The folder deleted by hand under a running daemon: made again with its pointers within a
/// pass (5 s), and opens are counted again (the inotify watch died with the folder).
#[test]
fn a_deleted_index_folder_comes_back_and_its_opens_count_again() {
    let d = started(&[("enc", models::tiny_encoder(false))]);
    let p = wait_pointer(&d, "enc", "written", |p| p.is_some()).unwrap();
    wait_fast_hits(&d, 1);
    let before = fast_hits(&d);
    let dir = ready::ready_dir(&d.socket());
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(ready::acquire(&d.socket(), "enc").is_none());
    let again = wait_pointer(&d, "enc", "written again", |p| p.is_some()).unwrap();
    assert_eq!(again.metadata.key, p.metadata.key);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o750);
    // The watch is added again once the folder is back; until then opens go uncounted, so
    // open until two more are counted: at most one of them is `wait_pointer`'s read just
    // above, so at least one is an acquire from the index.
    let t0 = Instant::now();
    loop {
        assert!(ready::acquire(&d.socket(), "enc").is_some());
        std::thread::sleep(Duration::from_millis(100));
        if fast_hits(&d) >= before + 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "opens are not counted again\n{}",
            d.log()
        );
    }
}

/// Issue 39: every valid model name can be published (the temp file of a 253-byte name once
/// exceeded NAME_MAX), and a pointer that cannot be written is logged once, not every pass
/// (`ready_recheck_secs = 1`: a pass a second), and once more when it is written at last.
#[test]
fn every_valid_name_is_published_and_a_lasting_failure_is_logged_once() {
    let long = "m".repeat(253);
    let mut d = Daemon::new();
    std::fs::create_dir(d.models().join(&long)).unwrap();
    write(
        &models::tiny_encoder(false),
        &d.models().join(&long).join("model.onnx"),
    )
    .unwrap();
    write(&models::tiny_encoder(true), &d.models().join("stuck.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("{cfg}ready_recheck_secs = 1\n")).unwrap();
    // A folder where `stuck`'s pointer goes (the start leaves folders): no rename over it.
    let dir = ready::ready_dir(&d.socket());
    std::fs::create_dir_all(dir.join("stuck")).unwrap();
    d.start();
    d.wait_settled(&[&long, "stuck"]);
    let p = wait_pointer(&d, &long, "written", |p| p.is_some()).unwrap();
    assert_eq!(p.metadata.key, socket_key(&d, &long));
    // Four passes at least.
    std::thread::sleep(Duration::from_millis(4500));
    let log = d.log();
    let n = log.matches("cannot write a ready pointer").count();
    assert_eq!(n, 1, "{log}");
    std::fs::remove_dir(dir.join("stuck")).unwrap();
    wait_pointer(&d, "stuck", "written once its path is free", |p| {
        p.is_some()
    });
    assert!(
        d.log().contains("ready pointer written again"),
        "{}",
        d.log()
    );
}

/// Writes `m` to `dir/model.onnx` with every initializer in a file of its own (`w<i>.bin`),
/// as torch and onnx write per-tensor external data.
pub(crate) fn write_per_tensor(m: &ModelProto, dir: &Path) {
    use trtcache::onnx::proto::{DataLocation, StringStringEntryProto};
    let mut m = m.clone();
    let entry = |k: &str, v: String| StringStringEntryProto {
        key: k.into(),
        value: v,
    };
    for (i, t) in m.graph.as_mut().unwrap().initializer.iter_mut().enumerate() {
        let name = format!("w{i}.bin");
        std::fs::write(dir.join(&name), &t.raw_data).unwrap();
        t.external_data = vec![
            entry("location", name),
            entry("length", t.raw_data.len().to_string()),
        ];
        t.data_location = DataLocation::External as i32;
        t.raw_data = Default::default();
    }
    write(&m, &dir.join("model.onnx")).unwrap();
}

/// Issue 39: a consumer checks a bounded set of a model's files (its graph, its sidecar's
/// absence, its folder), however many external-data files it has, so the index stays as fast
/// as the socket for a model of thousands of files (benches/ready_many_files.py); every other
/// file is the daemon's to watch: rewriting one in place takes the pointer away at once,
/// while the change is still settling (the socket serves the old artifact meanwhile), and
/// the pointer comes back with the new content's artifact.
#[test]
fn a_model_of_many_files_is_checked_in_bounded_time_and_watched_by_the_daemon() {
    let mut d = Daemon::new();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    // A long settling time: the pointer's removal must come from the watch, not the settle.
    std::fs::write(
        d.config(),
        cfg.replace("debounce_ms = 150", "debounce_ms = 8000"),
    )
    .unwrap();
    let folder = d.models().join("many");
    std::fs::create_dir(&folder).unwrap();
    write_per_tensor(&models::big_weights(40, 8), &folder);
    d.start();
    d.wait_settled(&["many"]);
    let p = wait_pointer(&d, "many", "written", |p| p.is_some()).unwrap();
    assert!(p.sources.len() <= 3, "{:#?}", p.sources);
    assert!(ready::acquire(&d.socket(), "many").is_some());

    let w7 = folder.join("w7.bin");
    let mut bytes = std::fs::read(&w7).unwrap();
    bytes.iter_mut().for_each(|b| *b = b.wrapping_add(1));
    std::fs::write(&w7, &bytes).unwrap();
    wait_pointer(&d, "many", "removed after a weight file changed", |p| {
        p.is_none()
    });
    assert!(ready::acquire(&d.socket(), "many").is_none());
    assert_eq!(
        socket_key(&d, "many"),
        p.metadata.key,
        "the change settled before the pointer went: not the watch's doing"
    );
    let q = wait_pointer(&d, "many", "back with the new weights", |q| {
        q.is_some_and(|q| q.metadata.key != p.metadata.key)
    })
    .unwrap();
    assert_eq!(q.metadata.key, socket_key(&d, "many"));
}
