//! Builds run in a bounded worker process (issue: a hostile model can never take the daemon
//! down): a model whose validation would allocate 40 GB, and one that loops forever, sit in
//! the repository next to a good model. The real daemon reports each as that model's
//! failure, naming the signal or the time limit, frees its build slot, and keeps serving.

use std::time::{Duration, Instant};

use trtcache::fixtures::{models, write};
use trtcache_client::protocol::{AcquireRequest, ErrorCode, VariantState};

use crate::daemon::Daemon;
use crate::support;

fn reason(list: &[trtcache_client::ModelStatus], name: &str) -> String {
    let m = list.iter().find(|m| m.name == name).expect(name);
    assert_eq!(m.variants[0].state, VariantState::Failed, "{name}: {m:?}");
    m.variants[0].reason.clone().unwrap_or_default()
}

#[test]
fn hostile_models_fail_in_their_worker_and_the_daemon_keeps_serving() {
    let mut d = Daemon::new();
    write(&models::huge_fixed_input(), &d.models().join("huge.onnx")).unwrap();
    write(&models::big_fixed_input(), &d.models().join("big.onnx")).unwrap();
    write(&models::endless_loop(), &d.models().join("spin.onnx")).unwrap();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    // One build slot: the endless loop holds it until the worker is killed at 15 s, and the
    // others must still get built after it. The worker's memory bound is 512 MiB, under the
    // 1 GB of inputs `big` needs and over what ONNX Runtime needs for the others. (The limit is
    // generous so that the other builds, which take well under a second alone, never reach
    // it on a loaded machine.)
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        format!("{cfg}build_concurrency = 1\nbuild_timeout_secs = 15\nworker_memory_bytes = 536870912\n"),
    )
    .unwrap();
    d.start();
    let pid = d.child.as_ref().unwrap().id();
    let list = d.wait_settled(&["huge", "big", "spin", "enc"]);
    // 40 GB of inputs: the validation byte budget refuses it before allocating anything.
    let huge = reason(&list, "huge");
    assert!(
        huge.contains("validation inputs need at least 40000000000 bytes"),
        "{huge}\n{}",
        d.log()
    );
    // 1 GB of inputs, within the budget: the worker aborts at its memory bound.
    let big = reason(&list, "big");
    assert!(big.contains("killed by SIGABRT"), "{big}\n{}", d.log());
    assert!(big.contains("memory allocation of"), "{big}");
    let spin = reason(&list, "spin");
    assert!(
        spin.contains("time limit of 15 s") || spin.contains("exceeded the limit of 15 s"),
        "{spin}\n{}",
        d.log()
    );
    // Reasons travel in frames: bounded, one line.
    assert!(big.len() < 2048 && !big.contains('\n'), "{}", big.len());
    // The daemon is the same process and serves the good model.
    assert!(d.child.as_mut().unwrap().try_wait().unwrap().is_none());
    assert_eq!(d.child.as_ref().unwrap().id(), pid);
    let mut c = d.client();
    let art = c
        .acquire(&AcquireRequest {
            model: "enc".into(),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("acquire enc: {e}\n{}", d.log()));
    assert!(!art.files.is_empty());
    // A failed model is remembered, not rebuilt on every acquire.
    let e = c
        .acquire(&AcquireRequest {
            model: "big".into(),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BuildFailed), "{e}");
    // No worker is left behind: the killed one was reaped.
    let t0 = Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if children.trim().is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "worker processes left: {children}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(d.stop(), "{}", d.log());
}

#[test]
fn the_cli_build_kills_an_endless_model_at_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("spin.onnx");
    write(&models::endless_loop(), &m).unwrap();
    let t0 = Instant::now();
    let out = support::trtcache([
        "build",
        m.to_str().unwrap(),
        "--timeout",
        "2",
        "--cache-dir",
        dir.path().join("cache").to_str().unwrap(),
    ]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains("time limit of 2 s") && e.contains("killed"),
        "{e}"
    );
    // Not a timing assertion: an unkilled loop of 10^15 trips would never return at all.
    assert!(t0.elapsed() < Duration::from_secs(120));
}

/// A 10 MB protobuf of 5,000,000 empty nodes (2 bytes each) would decode to gigabytes in
/// `key`, `inspect` and the daemon's planner, which run in the daemon: it is refused before
/// decoding, by the CLI and by the daemon, which keeps serving.
fn amplification_model() -> Vec<u8> {
    let nodes = 5_000_000usize;
    let mut graph = Vec::with_capacity(2 * nodes);
    for _ in 0..nodes {
        graph.extend_from_slice(&[0x0a, 0x00]); // GraphProto.node (field 1), empty
    }
    let mut out = vec![0x08, 0x08]; // ModelProto.ir_version = 8
    out.push(0x3a); // ModelProto.graph (field 7)
    let mut len = graph.len() as u64;
    while len >= 0x80 {
        out.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(&graph);
    out
}

#[test]
fn a_protobuf_that_decodes_to_gigabytes_is_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let amp = dir.path().join("amp.onnx");
    std::fs::write(&amp, amplification_model()).unwrap();
    for cmd in [&["key"][..], &["inspect", "--json"]] {
        let mut args: Vec<&str> = cmd.to_vec();
        args.push(amp.to_str().unwrap());
        let out = support::trtcache(&args);
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {e}");
        assert!(e.contains("decoding it would allocate"), "{cmd:?}: {e}");
    }
    let mut d = Daemon::new();
    std::fs::write(d.models().join("amp.onnx"), amplification_model()).unwrap();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    d.start();
    let list = d.wait_settled(&["amp", "enc"]);
    let why = reason(&list, "amp");
    assert!(why.contains("decoding it would allocate"), "{why}");
    let enc = list.iter().find(|m| m.name == "enc").unwrap();
    assert_eq!(enc.variants[0].state, VariantState::Ready, "{}", d.log());
    assert!(d.stop(), "{}", d.log());
}

/// A cgroup v1 memory group of its own for one test, removed at drop (best effort).
struct MemoryCgroup(std::path::PathBuf);

impl MemoryCgroup {
    /// `None` where this machine has no writable cgroup v1 memory controller (not root, or
    /// cgroup v2 only): the test then says so and checks nothing.
    fn create(limit: u64) -> Option<MemoryCgroup> {
        let base = std::path::Path::new("/sys/fs/cgroup/memory");
        let dir = base.join(format!("trtcache-test-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let cg = MemoryCgroup(dir);
        std::fs::write(cg.0.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        Some(cg)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// How many times the kernel's OOM killer ran in the group (`oom_kill` of
    /// memory.oom_control, on kernels that report it).
    fn oom_kills(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.0.join("memory.oom_control")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The kernel's OOM killer, not the worker's own memory bound: the daemon runs in a memory
/// cgroup of 768 MiB with no worker bound, and a model whose validation needs 2 GB. The
/// kernel kills the largest process in the group, the worker; the daemon reports the
/// model's failure naming SIGKILL and keeps serving the good model.
#[test]
fn under_a_memory_cgroup_the_oom_killer_takes_the_worker_not_the_daemon() {
    let Some(cg) = MemoryCgroup::create(768 << 20) else {
        eprintln!("skipped: no writable cgroup v1 memory controller here (needs root)");
        return;
    };
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    // worker_memory_bytes = 0: three quarters of the machine, far over the group's limit, so
    // it is the kernel that stops the worker.
    std::fs::write(
        d.config(),
        format!("{cfg}build_concurrency = 1\nworker_memory_bytes = 0\n"),
    )
    .unwrap();
    d.start();
    let pid = d.child.as_ref().unwrap().id();
    // The daemon joins the group before the big model exists: every worker it starts for
    // that model is in the group too.
    cg.add(pid);
    d.wait_settled(&["enc"]);
    write(&models::big_fixed_input(), &d.models().join("big.onnx")).unwrap();
    let list = d.wait_settled(&["big", "enc"]);
    let big = reason(&list, "big");
    assert!(big.contains("killed by SIGKILL"), "{big}\n{}", d.log());
    eprintln!("big: {big}; oom kills in the group: {:?}", cg.oom_kills());
    if let Some(n) = cg.oom_kills() {
        assert!(n >= 1, "no OOM kill in the group: {n}");
    }
    assert!(d.child.as_mut().unwrap().try_wait().unwrap().is_none());
    assert_eq!(d.child.as_ref().unwrap().id(), pid);
    let art = d
        .client()
        .acquire(&AcquireRequest {
            model: "enc".into(),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("acquire enc: {e}\n{}", d.log()));
    assert!(!art.files.is_empty());
    assert!(d.stop(), "{}", d.log());
}
