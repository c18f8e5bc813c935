//! `watch` against the real daemon: a watcher hears of a model's new content being built, of
//! an eviction and of the model leaving; the clients' followers swap their ONNX Runtime
//! session for one of the new artifact (its outputs change) and keep it across evictions; an
//! unknown model is `not_found`; a watcher that never reads stalls neither builds nor other
//! clients; `limits.max_watchers` bounds subscriptions; shutdown ends subscriptions; both
//! followers keep their session while the daemon is down and catch up with a model replaced
//! meanwhile once it is back. The Python client's watcher and `watch_session` run the same
//! story.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, random_f32, tensor_f32, write};
use trtcache_client::protocol::{Request, WatchEvent, WatchReason};
use trtcache_client::{AcquireRequest, ErrorCode, Follower, VariantState, Watcher};

use crate::daemon::{artifact_session, ort_env, reference, run_encoder, Daemon};
use crate::support;

/// The tiny encoder with its bias drawn from `seed`: same inputs and outputs, other numbers.
fn encoder(seed: u64) -> trtcache::onnx::proto::ModelProto {
    let mut m = models::tiny_encoder(false);
    if seed != 0 {
        let g = m.graph.as_mut().expect("graph");
        g.initializer[3] = tensor_f32("fc.bias", &[64], &random_f32(seed, 64, 0.5));
    }
    m
}

/// Replaces `models/NAME.onnx` in one rename, as a deploy does.
fn deploy(d: &Daemon, name: &str, seed: u64) {
    let staged = d.root.join("outside").join(format!("{name}.onnx"));
    write(&encoder(seed), &staged).unwrap();
    std::fs::rename(&staged, d.models().join(format!("{name}.onnx"))).unwrap();
}

fn daemon_with(limits: &str) -> Daemon {
    let mut d = Daemon::new();
    write(&encoder(0), &d.models().join("enc.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("{cfg}{limits}")).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    d
}

/// Reads events until one matches `want` (panics after 180 s with what came).
fn until(
    d: &Daemon,
    w: &mut Watcher,
    what: &str,
    want: impl Fn(&WatchEvent) -> bool,
) -> WatchEvent {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {what} event; got {seen:#?}\n{}",
            d.log()
        );
        if let Some(e) = w.next_timeout(Some(left)).expect("watching") {
            if want(&e) {
                return e;
            }
            seen.push(e);
        }
    }
}

fn follower(d: &Daemon) -> trtcache_client::SessionFollower {
    Follower::sessions(
        d.socket(),
        AcquireRequest {
            model: "enc".into(),
            dir_fd: true,
            ..Default::default()
        },
        || {
            Ok(ort::session::Session::builder(ort_env())?
                .with_optimization_level(ort::session::builder::GraphOptimizationLevel::Disable)?)
        },
    )
    .expect("following enc")
}

fn run(f: &trtcache_client::SessionFollower) -> Vec<f32> {
    let cur = f.current();
    let mut s = cur.value.lock().unwrap();
    run_encoder(&mut s, 4)
}

#[test]
fn a_watcher_hears_new_content_evictions_and_removal_and_the_follower_swaps_its_session() {
    let mut d = daemon_with("");
    let c = d.client();
    let mut w = c.watch("enc").unwrap();
    let v0 = &w.status().variants[0];
    assert_eq!(v0.state, VariantState::Ready, "{:?}", w.status());
    let k0 = v0.key.clone().unwrap();
    let f = follower(&d);
    assert_eq!(f.current().metadata.key, k0);
    let before = run(&f);

    // New content: `changed`, then `ready` with the new key once it is built.
    deploy(&d, "enc", 9);
    let changed = until(&d, &mut w, "changed", |e| e.reason == WatchReason::Changed);
    assert_eq!((changed.key, changed.profile), (None, None), "model-wide");
    let ready = until(&d, &mut w, "ready", |e| e.reason == WatchReason::Ready);
    let k1 = ready.key.clone().unwrap();
    assert_ne!(k1, k0, "new content, new key");
    assert_eq!(ready.backend.as_deref(), Some("ort-cpu"));
    assert_eq!(ready.origin, Some(trtcache_client::protocol::Origin::Built));

    // The follower swapped: its session runs the new model.
    assert!(
        f.wait_swap(0, Duration::from_secs(180)),
        "no swap: {:?}\n{}",
        f.last_error(),
        d.log()
    );
    assert_eq!(f.current().metadata.key, k1);
    let after = run(&f);
    assert_ne!(after, before, "the outputs changed with the model");
    crate::daemon::assert_close(
        &after,
        &reference(&d.models().join("enc.onnx"), 4),
        "follower's session vs the new model",
    );

    // Evicted: the variant has no ready key; the follower keeps a working session.
    let mut admin = d.client();
    assert_eq!(admin.evict(Some("enc"), None).unwrap(), 1);
    let ev = until(&d, &mut w, "evicted", |e| e.reason == WatchReason::Evicted);
    assert_eq!((ev.key, ev.backend.as_deref()), (None, Some("ort-cpu")));
    // Built again at the next acquire: the same key is ready again, and the follower, which
    // already runs it, does not reopen.
    let art = admin.acquire_model("enc").unwrap();
    assert_eq!(art.metadata.key, k1);
    let again = until(&d, &mut w, "ready again", |e| {
        e.reason == WatchReason::Ready
    });
    assert_eq!(again.key.as_deref(), Some(k1.as_str()));
    assert_eq!(run(&f), after, "the kept session still runs");
    assert_eq!(f.swaps(), 1, "{:?}", f.last_event());
    // The acquired artifact itself is the new model too.
    assert_eq!(run_encoder(&mut artifact_session(&art), 4), after);

    // New content that fails: an op ONNX Runtime cannot load (the build fails), then bytes
    // that are not ONNX (planning fails). Each is `changed`, then `failed` with the reason;
    // the follower keeps its session.
    for (what, bytes) in [
        ("build", None),
        ("plan", Some(b"not an onnx model".to_vec())),
    ] {
        let staged = d.root.join("outside/enc.onnx");
        match bytes {
            None => write(&models::custom_domain(), &staged).unwrap(),
            Some(b) => std::fs::write(&staged, b).unwrap(),
        }
        std::fs::rename(&staged, d.models().join("enc.onnx")).unwrap();
        until(&d, &mut w, "changed", |e| e.reason == WatchReason::Changed);
        let failed = until(&d, &mut w, "failed", |e| e.reason == WatchReason::Failed);
        assert_eq!(failed.key, None, "{what}");
        assert!(
            failed.message.as_deref().is_some_and(|m| !m.is_empty()),
            "{what}: {failed:?}"
        );
    }
    assert_eq!(run(&f), after, "a failed deploy keeps the session");
    assert_eq!(f.swaps(), 1);

    // Gone from the repository: `removed`; the subscription goes on.
    std::fs::remove_file(d.models().join("enc.onnx")).unwrap();
    until(&d, &mut w, "removed", |e| e.reason == WatchReason::Removed);
    assert_eq!(run(&f), after, "a removed model's session keeps working");

    // An unknown model is refused, and the connection it was asked on stays usable.
    let e = c.watch("nope").unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    drop(f);
    drop(w);
    assert!(d.stop());
}

/// Sends `hello` and `watch` on a raw socket and then never reads.
fn deaf_watcher(socket: &Path, model: &str) -> UnixStream {
    let mut s = UnixStream::connect(socket).unwrap();
    for r in [
        Request::Hello {
            version: trtcache_client::PROTOCOL_VERSION,
            client: "deaf".into(),
        },
        Request::Watch {
            model: model.into(),
        },
    ] {
        s.write_all(&trtcache_client::frame::encode(&r).unwrap())
            .unwrap();
    }
    s
}

#[test]
fn a_watcher_that_never_reads_stalls_neither_builds_nor_other_clients() {
    let mut d = daemon_with("max_watchers = 3\nwatch_queue = 2\n");
    let deaf = deaf_watcher(&d.socket(), "enc");
    let c = d.client();
    let mut w = c.watch("enc").unwrap();
    let mut other = d.client();
    let mut keys = vec![w.status().variants[0].key.clone().unwrap()];
    for seed in [11, 12, 13] {
        deploy(&d, "enc", seed);
        let e = until(&d, &mut w, "ready", |e| {
            e.reason == WatchReason::Ready && e.key.as_ref() != keys.last()
        });
        let art = other.acquire_model("enc").unwrap();
        assert_eq!(
            Some(&art.metadata.key),
            e.key.as_ref(),
            "acquire serves the new build"
        );
        keys.push(art.metadata.key);
    }
    keys.dedup();
    assert_eq!(keys.len(), 4, "each deploy built: {keys:?}");
    assert!(other.stats().unwrap().builds >= 4);

    // Three watchers (the deaf one, `w`, this one) fill `max_watchers`; a fourth is busy.
    let third = c.watch("enc").unwrap();
    let e = c.watch("enc").unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Busy), "{e}");
    assert!(e.to_string().contains("max_watchers"), "{e}");
    drop(third);
    // The slot comes back once the daemon sees the close.
    let t0 = Instant::now();
    let again = loop {
        match c.watch("enc") {
            Ok(w) => break w,
            Err(e)
                if e.code() == Some(ErrorCode::Busy) && t0.elapsed() < Duration::from_secs(30) =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    };
    drop((again, deaf));

    // Shutdown ends every subscription with `shutting_down` and does not wait for them.
    assert!(d.stop());
    match w.next_event() {
        Err(e) => assert!(
            e.code() == Some(ErrorCode::ShuttingDown)
                || matches!(
                    e,
                    trtcache_client::ClientError::Frame(trtcache_client::frame::FrameError::Closed)
                ),
            "{e}"
        ),
        Ok(ev) => panic!("an event after shutdown: {ev:?}"),
    }
}

#[test]
fn a_follower_keeps_its_session_while_the_daemon_is_away_and_catches_up_after() {
    let mut d = daemon_with("");
    let f = follower(&d);
    let before = run(&f);
    let k0 = f.current().metadata.key.clone();
    assert!(d.stop());
    assert_eq!(run(&f), before, "the session works with no daemon");
    // Deployed while the daemon is down: no event can tell the follower, the reconnect does.
    deploy(&d, "enc", 31);
    d.start();
    assert!(
        f.wait_swap(0, Duration::from_secs(180)),
        "no swap after the restart: {:?}\n{}",
        f.last_error(),
        d.log()
    );
    assert_ne!(f.current().metadata.key, k0);
    assert_ne!(run(&f), before);
    drop(f);
    assert!(d.stop());
}

#[test]
fn python_watcher_and_watch_session_follow_a_new_version() {
    let mut d = daemon_with("");
    let script = r#"
import os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import onnxruntime as ort
import trtcache_client as t
sock, staged, target = sys.argv[2], sys.argv[3], sys.argv[4]
c = t.Client(sock, timeout=300)
x = {"x": (np.arange(4 * 64, dtype=np.float32).reshape(1, 4, 64) % 7) / 3}
with c.watch("enc") as w, c.watch_session("enc", providers=["CPUExecutionProvider"]) as h:
    k0 = w.status["variants"][0]["key"]
    assert h.key == k0, (h.key, k0)
    before = h.current().run(None, x)[0]
    os.rename(staged, target)
    seen = []
    for ev in w:
        seen.append(ev)
        assert isinstance(ev, t.WatchEvent) and ev.model == "enc", ev
        if ev.reason == "ready":
            break
    assert [e.reason for e in seen][0] == "changed", seen
    k1 = seen[-1].key
    assert k1 and k1 != k0 and seen[-1].backend == "ort-cpu", seen
    assert h.wait_swap(0, timeout=180), h.last_error
    assert h.key == k1 and h.swaps == 1
    after = h.current().run(None, x)[0]
    assert not np.allclose(after, before), "the outputs changed"
    ref = ort.InferenceSession(target, providers=["CPUExecutionProvider"]).run(None, x)[0]
    assert np.allclose(after, ref, atol=1e-4, rtol=1e-3)
    assert c.evict("enc") == 1
    ev = w.next(timeout=180)
    assert ev is not None and ev.reason == "evicted" and ev.key is None, ev
    assert np.allclose(h.current().run(None, x)[0], after), "the kept session still runs"
    assert h.swaps == 1
try:
    c.watch("nope")
except t.NotFound as e:
    assert "nope" in e.message, e.message
else:
    raise SystemExit("watching an unknown model did not fail")
print("watch ok")
"#;
    let staged = d.root.join("outside/enc.onnx");
    write(&encoder(21), &staged).unwrap();
    let out = support::run_python(
        script,
        &[
            &crate::clients::python_client(),
            &d.socket(),
            &staged,
            &d.models().join("enc.onnx"),
        ],
    );
    assert!(out.contains("watch ok"), "{out}");
    assert!(d.stop());
}

#[test]
fn python_watch_session_keeps_its_session_while_the_daemon_is_away_and_catches_up_after() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut d = daemon_with("");
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import trtcache_client as t
x = {"x": np.ones((1, 3, 64), np.float32)}
with t.Client(sys.argv[2], timeout=300).watch_session("enc", providers=["CPUExecutionProvider"]) as h:
    k0, before = h.key, h.current().run(None, x)[0]
    print("following", flush=True)
    sys.stdin.readline()                    # the daemon was stopped, the model replaced, restarted
    assert np.allclose(h.current().run(None, x)[0], before), "the session worked meanwhile"
    assert h.wait_swap(0, timeout=180), h.last_error
    assert h.key != k0 and not np.allclose(h.current().run(None, x)[0], before)
print("caught up", flush=True)
"#;
    let mut child = Command::new(support::python())
        .arg("-c")
        .arg(script)
        .arg(crate::clients::python_client())
        .arg(d.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "following", "{}", d.log());
    assert!(d.stop());
    deploy(&d, "enc", 41);
    d.start();
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let st = child.wait().unwrap();
    assert!(
        st.success() && line.trim() == "caught up",
        "{line:?} {st}\n{}",
        d.log()
    );
    assert!(d.stop());
}
