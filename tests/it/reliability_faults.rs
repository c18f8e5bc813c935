//! Faults and limits with a final, explained answer (issue 39, section 4), each against the
//! real daemon: a sparse 1 GiB external-data file holding a few KiB of weights stages
//! without writing its holes, and one whose data cannot fit fails for good naming it;
//! `rm -rf CACHE` under a running daemon, idle or building, is noticed and a fresh cache
//! opened (and the next start succeeds); a build worker SIGKILLed from outside is
//! built again and the model ends ready; an artifact bigger than `limits.cache_size_bytes`
//! fails for good naming the size and the limit; idle and slowloris connections to the
//! metrics listener never fail a `/healthz` probe.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use trtcache::fixtures::{
    attr, model, models, tensor_bool, tensor_i64, write, write_external, GraphBuilder, D,
};
use trtcache::onnx::ElemType;
use trtcache_client::protocol::{AcquireRequest, ErrorCode, VariantState};

use crate::daemon::Daemon;

/// Appends `limits` lines to the daemon's `[limits]` (the last table of its config) and
/// puts `top` lines before it.
fn configure(d: &Daemon, top: &str, limits: &str) {
    let text = std::fs::read_to_string(d.config()).unwrap();
    let (head, tail) = text.split_once("[limits]\n").unwrap();
    std::fs::write(
        d.config(),
        format!("{head}{top}\n[limits]\n{tail}{limits}\n"),
    )
    .unwrap();
}

/// Moves the daemon's cache to `ROOT/store`, a folder of its own (the harness keeps the
/// socket in `cache/`), so a test can delete the whole cache folder; returns its path.
fn own_cache_folder(d: &Daemon) -> std::path::PathBuf {
    let store = d.root.join("store");
    let text = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        text.replace(
            &format!("cache_dir = {:?}", d.cache()),
            &format!("cache_dir = {store:?}"),
        ),
    )
    .unwrap();
    store
}

/// Polls until `f` returns `Some` (panics with the daemon's log after `secs`).
fn eventually<T>(d: &Daemon, secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "{what} never happened:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn acquire(
    d: &Daemon,
    name: &str,
) -> Result<trtcache_client::Artifact, trtcache_client::ClientError> {
    d.client().acquire(&AcquireRequest {
        model: name.into(),
        ..Default::default()
    })
}

/// Bytes the process has handed to `write`-like calls (`wchar` of `/proc/PID/io`: writes,
/// `copy_file_range`, `sendfile`), whatever the file system does with them.
fn written(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("reading /proc/PID/io");
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("wchar in /proc/PID/io")
}

#[test]
fn a_sparse_external_data_file_is_staged_without_its_holes() {
    let mut d = Daemon::new();
    d.start();
    let pid = d.child.as_ref().unwrap().id();
    // A Triton-layout model whose weights (a few KiB) sit at the start of a 1 GiB sparse
    // external-data file: what costs nothing on disk must cost nothing in the cache either.
    let staging = d.root.join("staging");
    std::fs::create_dir_all(staging.join("m/1")).unwrap();
    let graph = staging.join("m/1/model.onnx");
    write_external(&models::tiny_encoder(false), &graph, "model.onnx.data", 128).unwrap();
    let data = staging.join("m/1/model.onnx.data");
    let len = 1u64 << 30;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(len)
        .unwrap();
    let before = written(pid);
    std::fs::rename(staging.join("m"), d.models().join("m")).unwrap();
    let list = d.wait_settled(&["m"]);
    let m = list.iter().find(|m| m.name == "m").unwrap();
    assert_eq!(
        m.variants[0].state,
        VariantState::Ready,
        "{m:?}\n{}",
        d.log()
    );
    let art = acquire(&d, "m").unwrap_or_else(|e| panic!("acquire: {e}\n{}", d.log()));
    assert!(!art.files.is_empty());
    // The daemon copied the model into CACHE/tmp for the build: its holes stayed holes.
    let spent = written(pid) - before;
    eprintln!("the daemon wrote {spent} bytes to stage, build and store the model");
    assert!(
        spent < 64 << 20,
        "the daemon wrote {spent} bytes to build a model of a few KiB of weights in a sparse {len}-byte file\n{}",
        d.log()
    );
    assert!(d.stop(), "{}", d.log());
}

/// A tmpfs of `size` over `dir` for the test's life, or `None` with the reason printed
/// (mounting needs root or a user namespace; without it no file system can be made to fill).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount_or_skip(dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir.to_path_buf())),
            Ok(o) => {
                let e = String::from_utf8_lossy(&o.stderr);
                eprintln!("SKIPPED: cannot mount a tmpfs over {} ({e})", dir.display());
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount ({e})");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn external_data_that_cannot_fit_in_the_cache_fails_for_good_naming_the_file() {
    let mut d = Daemon::new();
    let Some(_fs) = Tmpfs::mount_or_skip(&d.cache(), "8m") else {
        return;
    };
    // 16 MiB of real data (not holes) in the external-data file, on a cache of 8 MiB: the
    // build's private copy cannot fit, whatever is evicted.
    let dir = d.root.join("staging/m/1");
    std::fs::create_dir_all(&dir).unwrap();
    write_external(
        &models::tiny_encoder(false),
        &dir.join("model.onnx"),
        "model.onnx.data",
        128,
    )
    .unwrap();
    let data = dir.join("model.onnx.data");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&data)
        .unwrap();
    f.write_all(&vec![0xa5u8; 16 << 20]).unwrap();
    drop(f);
    d.start();
    std::fs::rename(d.root.join("staging/m"), d.models().join("m")).unwrap();
    let list = d.wait_settled(&["m"]);
    let v = &list.iter().find(|m| m.name == "m").unwrap().variants[0];
    assert_eq!(v.state, VariantState::Failed, "{v:?}\n{}", d.log());
    let reason = v.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("model.onnx.data") && reason.contains("bytes free"),
        "names the file and the space: {reason}"
    );
    // A final answer: the same to an acquire, and no build tried again (the storage
    // retries of a full disk came every 1, 2, 4 … s).
    let mut c = d.client();
    let before = c.stats().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let e = acquire(&d, "m").unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BuildFailed), "{e}");
    assert!(e.to_string().contains("model.onnx.data"), "{e}");
    let after = c.stats().unwrap();
    assert_eq!(after.failures, before.failures, "built again: {after:?}");
    assert!(
        std::fs::read_dir(d.cache().join("tmp"))
            .unwrap()
            .next()
            .is_none(),
        "staging leftovers"
    );
    drop(c);
    assert!(d.stop(), "{}", d.log());
}

#[test]
fn rm_rf_of_the_cache_under_a_running_daemon_opens_a_fresh_one() {
    let mut d = Daemon::new();
    let store = own_cache_folder(&d);
    configure(&d, "", "cache_check_secs = 1");
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    d.start();
    let pid = d.child.as_ref().unwrap().id();
    d.wait_settled(&["enc"]);
    acquire(&d, "enc").unwrap_or_else(|e| panic!("acquire: {e}\n{}", d.log()));
    std::fs::remove_dir_all(&store).unwrap();
    // Noticed, and a fresh cache opened in its place (by the periodic check or the next
    // acquire): consumers keep working, the artifact built again into it.
    let art =
        acquire(&d, "enc").unwrap_or_else(|e| panic!("acquire after rm -rf: {e}\n{}", d.log()));
    assert!(!art.files.is_empty());
    let mut graph = Vec::new();
    (&art.files[0]).read_to_end(&mut graph).unwrap();
    assert!(!graph.is_empty());
    eventually(&d, 30, "a fresh cache with its index", || {
        (store.join("lock").exists() && store.join("db").is_dir()).then_some(())
    });
    assert!(
        d.log()
            .contains("the cache folder was deleted or replaced under the daemon"),
        "{}",
        d.log()
    );
    assert!(d.child.as_mut().unwrap().try_wait().unwrap().is_none());
    assert_eq!(d.child.as_ref().unwrap().id(), pid);
    assert!(d.stop(), "{}", d.log());
    // The next start opens the cache the daemon left (no "index is damaged", no exit 2),
    // and serves the artifact it rebuilt.
    d.start();
    acquire(&d, "enc").unwrap_or_else(|e| panic!("acquire after a restart: {e}\n{}", d.log()));
    assert!(d.stop(), "{}", d.log());
}

/// After a fresh cache is opened in place, nothing the daemon remembered as ready is trusted:
/// the models are warmed again into the fresh cache without waiting for an acquire, so
/// `status` and the ready index never name an artifact that went with the old folder.
#[test]
fn after_rm_rf_the_models_are_warmed_again_without_an_acquire() {
    let mut d = Daemon::new();
    let store = own_cache_folder(&d);
    configure(&d, "", "cache_check_secs = 1\nready_recheck_secs = 1");
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    let manifests = |store: &std::path::Path| {
        std::fs::read_dir(store.join("records"))
            .map(|r| r.flatten().count())
            .unwrap_or(0)
    };
    eventually(&d, 30, "the first artifact stored", || {
        (manifests(&store) > 0).then_some(())
    });
    std::fs::remove_dir_all(&store).unwrap();
    eventually(
        &d,
        60,
        "the model built again into the fresh cache, no acquire sent",
        || (manifests(&store) > 0).then_some(()),
    );
    assert!(
        d.log().contains("the cache was opened afresh"),
        "{}",
        d.log()
    );
    acquire(&d, "enc").unwrap_or_else(|e| panic!("acquire: {e}\n{}", d.log()));
    assert!(d.stop(), "{}", d.log());
}

#[test]
fn rm_rf_of_the_cache_during_a_build_stores_nothing_there_and_builds_again() {
    let mut d = Daemon::new();
    let store = own_cache_folder(&d);
    d.start();
    write(&slow_loop(1_000_000), &d.models().join("slow.onnx")).unwrap();
    d.wait_building(&mut d.client());
    // As `rm -rf` run until it succeeds: the build's worker writes into the folder meanwhile
    // ("directory not empty"), and the daemon may open its fresh cache in between.
    for _ in 0..100 {
        match std::fs::remove_dir_all(&store) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    // The running build is stopped before it stores into the deleted folder's place, and
    // built again in the fresh cache. (The loop above may also delete a fresh cache the
    // daemon opened between two of its tries: that build is stopped too, shown as failed for
    // the machine's reason, and retried after a second; so wait for ready, not for settled.)
    eventually(&d, 90, "slow ready in the fresh cache", || {
        let list = d.client().list().ok()?;
        let m = list.iter().find(|m| m.name == "slow")?;
        (m.variants.first()?.state == VariantState::Ready).then_some(())
    });
    assert!(
        d.log()
            .contains("the cache folder went during the build; building again in the fresh cache"),
        "{}",
        d.log()
    );
    let art = acquire(&d, "slow").unwrap_or_else(|e| panic!("acquire: {e}\n{}", d.log()));
    assert!(art.files[0].metadata().unwrap().len() > 0);
    assert!(d.stop(), "{}", d.log());
    d.start();
    acquire(&d, "slow").unwrap_or_else(|e| panic!("acquire after a restart: {e}\n{}", d.log()));
    assert!(d.stop(), "{}", d.log());
}

/// `y = x` through a `Loop` of `trips` Relu steps: a model that takes a while to validate
/// (its worker lives long enough to be found and killed).
fn slow_loop(trips: i64) -> trtcache::onnx::proto::ModelProto {
    let one = || vec![D::Fixed(1)];
    let mut body = GraphBuilder::new("step");
    body.input("iter", ElemType::Int64, &[])
        .input("cond_in", ElemType::Bool, &[])
        .input("v", ElemType::Float32, &one())
        .output("cond_out", ElemType::Bool, Some(&[]))
        .output("v_out", ElemType::Float32, Some(&one()));
    body.node("Identity", &["cond_in"], &["cond_out"]);
    body.node("Relu", &["v"], &["v_out"]);
    let mut g = GraphBuilder::new("slow_loop");
    g.input("x", ElemType::Float32, &one())
        .output("y", ElemType::Float32, Some(&one()))
        .init(tensor_i64("trips", &[], &[trips]))
        .init(tensor_bool("keep_going", &[], &[true]));
    g.node("Loop", &["trips", "keep_going", "x"], &["y"])
        .attribute
        .push(attr::graph("body", body.build()));
    model(g.build(), &[("", 17)])
}

/// The daemon's child processes running `trtcache worker` (a scan of `/proc`).
fn workers(daemon: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces, so read after its `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(daemon) && cmdline.split(|&b| b == 0).any(|a| a == b"worker") {
            out.push(pid);
        }
    }
    out
}

#[test]
fn a_build_worker_killed_from_outside_is_built_again_and_ends_ready() {
    let mut d = Daemon::new();
    configure(&d, "", "build_concurrency = 1\nworker_kill_retries = 2");
    d.start();
    let pid = d.child.as_ref().unwrap().id();
    write(&slow_loop(1_000_000), &d.models().join("slow.onnx")).unwrap();
    // One SIGKILL from outside (the OOM killer, an admin) of the model's first worker.
    let victim = eventually(&d, 120, "a build worker", || workers(pid).first().copied());
    // SAFETY: signalling a process this test found as the daemon's worker child.
    assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
    let list = d.wait_settled(&["slow"]);
    let m = list.iter().find(|m| m.name == "slow").unwrap();
    assert_eq!(
        m.variants[0].state,
        VariantState::Ready,
        "{m:?}\n{}",
        d.log()
    );
    assert!(
        d.log()
            .contains("the build worker was killed from outside; building again"),
        "{}",
        d.log()
    );
    acquire(&d, "slow").unwrap_or_else(|e| panic!("acquire: {e}\n{}", d.log()));
    assert!(d.stop(), "{}", d.log());
}

#[test]
fn an_artifact_bigger_than_the_cache_fails_for_good_naming_the_limit() {
    let mut d = Daemon::new();
    // The tiny encoder's artifact holds 16 KiB of weights: more than the whole cache.
    configure(&d, "", "cache_size_bytes = 4096");
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    d.start();
    let list = d.wait_settled(&["enc"]);
    let v = &list.iter().find(|m| m.name == "enc").unwrap().variants[0];
    assert_eq!(v.state, VariantState::Failed, "{v:?}\n{}", d.log());
    let reason = v.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("limits.cache_size_bytes = 4096") && reason.contains("bytes, more than"),
        "{reason}"
    );
    // An acquire gets the same final, typed answer, now and again (no "ask again", no
    // rebuild: the failure is remembered until the model or the limit changes).
    let before = d.client().stats().unwrap();
    assert_eq!((before.builds, before.cancelled), (0, 0), "{before:?}");
    for _ in 0..2 {
        let e = acquire(&d, "enc").unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BuildFailed), "{e}");
        assert!(
            e.to_string().contains("limits.cache_size_bytes = 4096"),
            "{e}"
        );
    }
    let s = d.client().stats().unwrap();
    assert_eq!(
        (s.builds, s.failures, s.cancelled),
        (before.builds, before.failures, before.cancelled),
        "built again: {s:?}"
    );
    let list = d.client().list().unwrap();
    assert_eq!(list[0].variants[0].state, VariantState::Failed);
    assert!(d.stop(), "{}", d.log());
}

/// `(status, body)` of a plain `GET path`, or `None` when the connection closed unanswered.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, raw))
}

#[test]
fn idle_and_slowloris_http_connections_never_fail_a_health_probe() {
    let mut d = Daemon::new();
    configure(&d, "metrics_listen = \"127.0.0.1:0\"", "");
    d.start();
    let addr = eventually(&d, 60, "the metrics listener's log line", || {
        let log = d.log();
        let line = log.lines().find(|l| l.contains("metrics listener"))?;
        let addr = line.split("addr=").nth(1)?;
        Some(addr.split_whitespace().next()?.to_string())
    });
    // Twice the default limit (8) of connections that never send a byte, then one that
    // trickles its request head a byte at a time.
    let idle: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let mut slow = TcpStream::connect(&addr).unwrap();
    let trickle = std::thread::spawn(move || {
        let t0 = Instant::now();
        let head = b"GET /healthz HTTP/1.1\r\nX-Slow: ";
        for (i, b) in head.iter().chain(std::iter::repeat(&b'a')).enumerate() {
            if slow.write_all(&[*b]).is_err() {
                return Some(i);
            }
            if t0.elapsed() > Duration::from_secs(120) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    });
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..10 {
        let got = get(&addr, "/healthz");
        assert!(
            matches!(&got, Some((200, body)) if body.ends_with("ok\n")),
            "probe {i}: {got:?}\n{}",
            d.log()
        );
    }
    // The slowloris is closed (its writes start failing) instead of holding a slot.
    assert!(
        trickle.join().unwrap().is_some(),
        "the trickling connection was never closed"
    );
    drop(idle);
    assert!(d.stop(), "{}", d.log());
}
