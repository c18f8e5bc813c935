//! Hostile and broken clients against a live daemon (RELIABILITY: hostile clients). While
//! well-behaved clients acquire in a loop, attacker threads send oversized length prefixes,
//! random bytes, invalid JSON, unknown protocol versions, hold a thousand idle connections,
//! trickle a frame one byte per second, hang up during descriptor transfer, name paths and
//! made-up models/backends/profiles, flood `build`, and pipeline requests without reading.
//! The daemon must stay up with bounded memory and descriptors, answer each bad client with a
//! typed error or drop it, and keep serving the good clients. A second test checks that the
//! socket's group decides who may connect, with clients running as another uid.
//! Uses the harness in `daemon.rs`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, write};
use trtcache_client::protocol::{ErrorCode, VariantState};
use trtcache_client::Client;

use crate::daemon::Daemon;

/// Limits the storm runs under: fewer slots than idle attackers, short deadlines so the test
/// sees them fire (the reclaim age well above any pause of the busy clients between requests,
/// which would otherwise lose their connection on a stalled machine).
const MAX_CONNECTIONS: usize = 256;
const FRAME_TIMEOUT_SECS: u64 = 2;
const RECLAIM_IDLE_SECS: u64 = 3;
const IDLE_CONNECTIONS: usize = 1000;

fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|r| r.count())
        .unwrap_or(0)
}

/// Deterministic noise (xorshift), so a failing run can be replayed.
struct Noise(u64);
impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn word(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| (b'a' + (self.next() % 26) as u8) as char)
            .collect()
    }
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

#[derive(Debug)]
enum Got {
    Frame(serde_json::Value),
    Closed,
    Silent,
}

/// One response frame (descriptors, if any, are discarded by the plain read), or how the
/// connection ended.
fn read_frame(s: &mut UnixStream, timeout: Duration) -> Got {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut len = [0u8; 4];
    match s.read_exact(&mut len) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Got::Silent
        }
        Err(_) => return Got::Closed,
    }
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    match s.read_exact(&mut buf) {
        Ok(()) => Got::Frame(serde_json::from_slice(&buf).expect("daemon frames are JSON")),
        Err(_) => Got::Closed,
    }
}

/// Whether the daemon closes its end within `limit`, without reading what it sent.
fn wait_hangup(s: &UnixStream, limit: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        let mut p = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 100) };
        if r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return true;
        }
        if r > 0 {
            // Readable (unread answers) but not hung up yet.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    false
}

fn code(v: &serde_json::Value) -> String {
    assert_eq!(v["kind"], "error", "expected an error frame: {v}");
    v["code"].as_str().unwrap_or("").to_string()
}

/// A greeted raw connection; retries while the daemon is full.
fn raw(socket: &Path) -> UnixStream {
    let t0 = Instant::now();
    loop {
        let mut s = UnixStream::connect(socket).unwrap();
        // A refused connection may be closed before the hello is written; its `busy` is
        // still there to read.
        let _ = s.write_all(&framed(br#"{"op":"hello","version":1}"#));
        match read_frame(&mut s, Duration::from_secs(30)) {
            Got::Frame(v) if v["kind"] == "hello" => return s,
            Got::Frame(v) if code(&v) == "busy" => {}
            other => panic!("no hello answer: {other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "daemon stayed full");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Connects and sends `first`; while the daemon answers `busy` (it is kept full by the idle
/// attacker), tries again. Returns the connection and what came back within `wait`.
fn admitted(
    socket: &Path,
    tally: &Tally,
    what: &str,
    first: &[u8],
    wait: Duration,
) -> (UnixStream, Got) {
    let t0 = Instant::now();
    loop {
        let mut s = UnixStream::connect(socket).unwrap();
        let _ = s.write_all(first);
        match read_frame(&mut s, wait) {
            Got::Frame(v) if v["kind"] == "error" && v["code"] == "busy" => {
                tally.add(format!("{what}: busy, retried"));
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "{what}: never admitted"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            got => return (s, got),
        }
    }
}

/// One request and its answer on a greeted connection.
fn call(s: &mut UnixStream, body: &[u8]) -> serde_json::Value {
    s.write_all(&framed(body)).unwrap();
    match read_frame(s, Duration::from_secs(30)) {
        Got::Frame(v) => v,
        other => panic!("no answer to {}: {other:?}", String::from_utf8_lossy(body)),
    }
}

/// Counts of what the attackers saw, for the report.
#[derive(Default)]
struct Tally(Mutex<std::collections::BTreeMap<String, u64>>);
impl Tally {
    fn add(&self, what: impl Into<String>) {
        *self.0.lock().unwrap().entry(what.into()).or_default() += 1;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn hostile_clients_storm_leaves_good_clients_served_and_resources_bounded() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap().replace(
        "[limits]\n",
        &format!(
            "[limits]\nmax_connections = {MAX_CONNECTIONS}\nidle_timeout_secs = 60\n\
             frame_timeout_secs = {FRAME_TIMEOUT_SECS}\nreclaim_idle_secs = {RECLAIM_IDLE_SECS}\n"
        ),
    );
    std::fs::write(d.config(), cfg).unwrap();
    d.start();
    let list = d.wait_settled(&["enc"]);
    assert_eq!(list[0].variants[0].state, VariantState::Ready, "{list:?}");
    let pid = d.child.as_ref().unwrap().id();
    let socket = d.socket();

    let mut good = d.client();
    good.set_timeout(Some(Duration::from_secs(30))).unwrap();
    // Warm the paths the storm uses, then take the baseline.
    for _ in 0..20 {
        good.acquire_model("enc").unwrap();
    }
    let builds_before = good.stats().unwrap().builds;
    // `wait_settled`'s client may still be closing: its descriptor is no baseline.
    d.wait_connections(&mut good, 1);
    let (rss0, fds0) = (rss_kb(pid), fd_count(pid));

    let stop = Arc::new(AtomicBool::new(false));
    let peak_rss = Arc::new(AtomicU64::new(rss0));
    let peak_fds = Arc::new(AtomicU64::new(fds0 as u64));
    let sampler = {
        let (stop, peak_rss, peak_fds) = (stop.clone(), peak_rss.clone(), peak_fds.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak_rss.fetch_max(rss_kb(pid), Ordering::Relaxed);
                peak_fds.fetch_max(fd_count(pid) as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // The good client: one connection, acquire after acquire, each artifact checked.
    let acquirer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut lat = Vec::new();
            let start = Instant::now();
            let mut slow = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let a = good.acquire_model("enc").expect("good acquire");
                lat.push(t0.elapsed());
                if t0.elapsed() > Duration::from_millis(20) {
                    slow.push((t0 - start, t0.elapsed()));
                }
                assert!(!a.files.is_empty() && a.metadata.model == "enc");
            }
            // When the outliers happened, to line them up with what the attackers did.
            let shown: Vec<String> = slow
                .iter()
                .take(10)
                .map(|(at, took): &(Duration, Duration)| format!("{took:.1?} at {at:.1?}"))
                .collect();
            eprintln!(
                "good acquires over 20 ms: {} ({})",
                slow.len(),
                shown.join(", ")
            );
            lat
        })
    };
    // A second good client connecting afresh each time: the connection limit must not lock
    // it out for long while attackers hold idle connections.
    let reconnecter = {
        let (stop, socket) = (stop.clone(), socket.clone());
        std::thread::spawn(move || {
            let mut waits = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let mut c = loop {
                    match Client::connect(&socket) {
                        Ok(c) => break c,
                        Err(e) if e.code() == Some(ErrorCode::Busy) => {
                            assert!(t0.elapsed() < Duration::from_secs(20), "locked out");
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => panic!("fresh client: {e}"),
                    }
                };
                c.set_timeout(Some(Duration::from_secs(30))).unwrap();
                c.acquire_model("enc").expect("fresh client acquire");
                waits.push(t0.elapsed());
                std::thread::sleep(Duration::from_millis(100));
            }
            waits
        })
    };

    let tally = Arc::new(Tally::default());
    let mut attackers: Vec<(&str, std::thread::JoinHandle<()>)> = Vec::new();
    let mut spawn = |name: &'static str, f: Box<dyn FnOnce(PathBuf, Arc<Tally>) + Send>| {
        let (s, t) = (socket.clone(), tally.clone());
        attackers.push((name, std::thread::spawn(move || f(s, t))));
    };

    // A 4 GiB length prefix: `frame_too_large`, then closed.
    spawn(
        "huge prefix",
        Box::new(|socket, tally| {
            for _ in 0..50 {
                let (mut s, got) = admitted(
                    &socket,
                    &tally,
                    "huge prefix",
                    &u32::MAX.to_be_bytes(),
                    Duration::from_secs(30),
                );
                let Got::Frame(v) = got else {
                    panic!("4 GiB prefix: {got:?}")
                };
                assert_eq!(code(&v), "frame_too_large");
                assert!(matches!(
                    read_frame(&mut s, Duration::from_secs(30)),
                    Got::Closed
                ));
                tally.add("huge prefix: frame_too_large + closed");
            }
        }),
    );
    // Random bytes, then the write side closed: typed errors or a drop, never silence.
    spawn(
        "random bytes",
        Box::new(|socket, tally| {
            let mut n = Noise(0x9e3779b97f4a7c15);
            for i in 0..100u32 {
                let len = 1 + (n.next() % 300) as usize;
                let mut junk = n.bytes(len);
                if i.is_multiple_of(2) && junk.len() > 4 {
                    // A plausible small length, so the junk reaches the JSON parser.
                    junk[..4].copy_from_slice(&(len as u32 - 4).to_be_bytes());
                }
                // Half a second to be refused; an admitted connection stays quiet (waiting
                // for the rest of a frame) until the write side closes.
                let (mut s, mut got) = admitted(
                    &socket,
                    &tally,
                    "random bytes",
                    &junk,
                    Duration::from_millis(500),
                );
                let _ = s.shutdown(std::net::Shutdown::Write);
                loop {
                    if matches!(got, Got::Silent) {
                        got = read_frame(&mut s, Duration::from_secs(30));
                    }
                    match std::mem::replace(&mut got, Got::Silent) {
                        Got::Frame(v) => {
                            let c = code(&v);
                            assert!(
                                [
                                    "frame_too_large",
                                    "bad_frame",
                                    "unknown_request",
                                    "bad_request",
                                    "unsupported_version"
                                ]
                                .contains(&c.as_str()),
                                "{v}"
                            );
                            tally.add(format!("random bytes: {c}"));
                        }
                        Got::Closed => {
                            tally.add("random bytes: closed");
                            break;
                        }
                        Got::Silent => panic!("random bytes: neither answered nor dropped"),
                    }
                    got = read_frame(&mut s, Duration::from_secs(30));
                }
            }
        }),
    );
    // Invalid JSON and mistyped requests on one greeted connection, which stays usable.
    spawn(
        "invalid json",
        Box::new(|socket, tally| {
            let mut s = raw(&socket);
            let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
            let cases: [(&[u8], &str); 8] = [
                (b"{\"op\":", "bad_frame"),
                (b"\xff\xfe\x00", "bad_frame"),
                (b"[]", "bad_frame"),
                (b"null", "bad_frame"),
                (deep.as_bytes(), "bad_frame"),
                (br#"{"op":"acquire","model":5}"#, "bad_request"),
                (
                    br#"{"op":"acquire","model":"enc","wait":"yes"}"#,
                    "bad_request",
                ),
                (br#"{"op":"frobnicate"}"#, "unknown_request"),
            ];
            for _ in 0..25 {
                for (body, want) in &cases {
                    assert_eq!(code(&call(&mut s, body)), *want);
                    tally.add(format!("invalid json: {want}"));
                }
            }
            assert_eq!(call(&mut s, br#"{"op":"list"}"#)["kind"], "models");
        }),
    );
    // Unknown protocol versions, and requests before `hello`.
    spawn(
        "protocol version",
        Box::new(|socket, tally| {
            for v in [0u64, 2, 99, u32::MAX as u64, u64::MAX] {
                for _ in 0..10 {
                    let hello = format!(r#"{{"op":"hello","version":{v}}}"#);
                    let (mut s, got) = admitted(
                        &socket,
                        &tally,
                        "version",
                        &framed(hello.as_bytes()),
                        Duration::from_secs(30),
                    );
                    let Got::Frame(got) = got else {
                        panic!("version {v}: {got:?}")
                    };
                    let c = code(&got);
                    // A version beyond u32 does not fit the field: a bad request.
                    let want = if v > u32::MAX as u64 {
                        "bad_request"
                    } else {
                        "unsupported_version"
                    };
                    assert_eq!(c, want, "version {v}: {got}");
                    // Still not greeted: every other request is refused.
                    assert_eq!(
                        code(&call(&mut s, br#"{"op":"acquire","model":"enc"}"#)),
                        "unsupported_version"
                    );
                    tally.add(format!("version {v}: {c}"));
                }
            }
        }),
    );
    // A thousand idle connections (half greeted), kept at a thousand through the storm:
    // each one the daemon refuses (`busy`) or reclaims (`idle_timeout`) is replaced, so the
    // daemon stays full and a new good client gets in only by reclaiming an idle slot.
    let idle_stop = Arc::new(AtomicBool::new(false));
    {
        let idle_stop = idle_stop.clone();
        spawn(
            "idle connections",
            Box::new(move |socket, tally| {
                let open = |i: usize| {
                    let mut s = UnixStream::connect(&socket).unwrap();
                    if i.is_multiple_of(2) {
                        let _ = s.write_all(&framed(br#"{"op":"hello","version":1}"#));
                    }
                    (i, s, Vec::<String>::new())
                };
                let mut conns: Vec<_> = (0..IDLE_CONNECTIONS).map(open).collect();
                let mut opened = IDLE_CONNECTIONS;
                let mut last_round = false;
                loop {
                    let mut ended = Vec::new();
                    for (k, (_, s, seen)) in conns.iter_mut().enumerate() {
                        loop {
                            match read_frame(s, Duration::from_millis(1)) {
                                Got::Frame(v) if v["kind"] == "hello" => seen.push("hello".into()),
                                Got::Frame(v) => seen.push(code(&v)),
                                Got::Closed => {
                                    seen.push("closed".into());
                                    ended.push(k);
                                    break;
                                }
                                Got::Silent => break,
                            }
                        }
                        if last_round && ended.last() != Some(&k) {
                            seen.push("open".into());
                            ended.push(k);
                        }
                    }
                    for k in ended.into_iter().rev() {
                        let (i, _, seen) = conns.swap_remove(k);
                        let what = seen.join("+");
                        assert!(
                            [
                                "busy+closed",
                                "idle_timeout+closed",
                                "hello+idle_timeout+closed",
                                "closed",
                                "hello+closed",
                                "open",
                                "hello+open",
                            ]
                            .contains(&what.as_str()),
                            "idle connection {i} saw {what}"
                        );
                        let kind = if i.is_multiple_of(2) {
                            "greeted"
                        } else {
                            "silent"
                        };
                        tally.add(format!("idle {kind}: {what}"));
                    }
                    if last_round {
                        break;
                    }
                    last_round = idle_stop.load(Ordering::Relaxed);
                    // Replace the ended ones, up to three hundred per round.
                    while conns.len() < IDLE_CONNECTIONS && !last_round {
                        conns.push(open(opened));
                        opened += 1;
                        if opened.is_multiple_of(300) {
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                eprintln!("idle attacker opened {opened} connections");
            }),
        );
    }
    // Slowloris: one byte per second; the frame deadline drops it.
    for k in 0..3 {
        spawn(
            "slowloris",
            Box::new(move |socket, tally| {
                let body = framed(br#"{"op":"hello","version":1,"client":"slowloris"}"#);
                // The first byte, then one a second (the one-second read is the pacing).
                let (mut s, mut got) = admitted(
                    &socket,
                    &tally,
                    "slowloris",
                    &body[..1],
                    Duration::from_secs(1),
                );
                let t0 = Instant::now();
                for b in &body[1..] {
                    if matches!(got, Got::Silent) && s.write_all(&[*b]).is_err() {
                        break;
                    }
                    if matches!(got, Got::Silent) {
                        got = read_frame(&mut s, Duration::from_secs(1));
                    }
                    match std::mem::replace(&mut got, Got::Silent) {
                        Got::Silent => {}
                        Got::Frame(v) => {
                            let c = code(&v);
                            assert_eq!(c, "idle_timeout", "slowloris: {v}");
                            tally.add(format!("slowloris: {c}"));
                            break;
                        }
                        Got::Closed => {
                            tally.add("slowloris: closed");
                            break;
                        }
                    }
                }
                let held = t0.elapsed();
                assert!(
                    held < Duration::from_secs(FRAME_TIMEOUT_SECS + 10),
                    "slowloris held a connection for {held:?}"
                );
                eprintln!("slowloris {k}: dropped {held:.1?} after its second byte");
            }),
        );
    }
    // Hanging up during descriptor transfer: acquire, then close before (or while) reading.
    spawn(
        "hang up on fds",
        Box::new(|socket, tally| {
            for i in 0..200 {
                let mut s = raw(&socket);
                s.write_all(&framed(br#"{"op":"acquire","model":"enc","dir_fd":true}"#))
                    .unwrap();
                if i % 2 == 1 {
                    let _ = s.read(&mut [0u8; 2]);
                }
                drop(s);
                tally.add("hang up during acquire");
            }
        }),
    );
    // Paths, made-up models, and made-up backends/profiles (long ones: a daemon that
    // remembered each would grow by megabytes).
    spawn(
        "names",
        Box::new(|socket, tally| {
            let mut s = raw(&socket);
            let mut n = Noise(42);
            let long = "a".repeat(300);
            let paths = [
                "../../etc/passwd",
                "/etc/passwd",
                "..",
                "enc/../enc",
                "a\\b",
                ".enc",
                "x\u{0}y",
                "",
                long.as_str(),
            ];
            for _ in 0..10 {
                for p in paths {
                    for op in ["acquire", "status"] {
                        let p = serde_json::to_string(p).unwrap();
                        let v = call(&mut s, format!(r#"{{"op":"{op}","model":{p}}}"#).as_bytes());
                        assert_eq!(code(&v), "bad_name", "{op} {p:?}: {v}");
                        tally.add("path name: bad_name");
                    }
                    let p = serde_json::to_string(p).unwrap();
                    let v = call(
                        &mut s,
                        format!(r#"{{"op":"build","models":[{p}]}}"#).as_bytes(),
                    );
                    assert_eq!(code(&v), "bad_name", "build {p:?}: {v}");
                }
            }
            for i in 0..300 {
                let m = format!("missing_{}", n.word(8));
                let v = call(
                    &mut s,
                    format!(r#"{{"op":"acquire","model":"{m}"}}"#).as_bytes(),
                );
                assert_eq!(code(&v), "not_found", "{v}");
                let v = call(
                    &mut s,
                    format!(r#"{{"op":"acquire","model":"enc","version":{}}}"#, i + 1).as_bytes(),
                );
                assert_eq!(code(&v), "not_found", "{v}");
                tally.add("missing model/version: not_found");
            }
            for i in 0..1000u32 {
                let field = if i.is_multiple_of(2) {
                    "backend"
                } else {
                    "profile"
                };
                let junk = n.word(60_000);
                let v = call(
                    &mut s,
                    format!(r#"{{"op":"acquire","model":"enc","{field}":"{junk}"}}"#).as_bytes(),
                );
                assert_eq!(code(&v), "not_found", "{field}: {}", &v.to_string()[..200]);
                tally.add(format!("made-up {field}: not_found"));
            }
        }),
    );
    // A flood of builds: answered from the cache (single flight), never rebuilt.
    for t in 0..3 {
        spawn(
            "build flood",
            Box::new(move |socket, tally| {
                let mut s = raw(&socket);
                let reqs: [&[u8]; 3] = [
                    br#"{"op":"build","models":[]}"#,
                    br#"{"op":"build","models":["enc","enc","enc"],"backend":"ort-cpu"}"#,
                    br#"{"op":"acquire","model":"enc","wait":false}"#,
                ];
                for i in 0..150 {
                    let body = reqs[(i + t) % reqs.len()];
                    s.write_all(&framed(body)).unwrap();
                    loop {
                        let Got::Frame(v) = read_frame(&mut s, Duration::from_secs(30)) else {
                            panic!("build flood: no answer");
                        };
                        match v["kind"].as_str() {
                            Some("progress") => continue,
                            Some("built") => {
                                // `enc` listed three times is built and reported once.
                                assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
                                for r in v["results"].as_array().unwrap() {
                                    assert_eq!(r["state"], "ready", "{v}");
                                    assert_eq!(r["cached"], true, "{v}");
                                }
                                tally.add("build flood: built (cached)");
                            }
                            Some("artifact") => tally.add("build flood: artifact"),
                            _ => panic!("build flood: {v}"),
                        }
                        break;
                    }
                }
            }),
        );
    }
    // Pipelined requests, answers never read: the daemon's writes stall until the frame
    // deadline drops the connection (seen as a hang-up without reading anything).
    spawn(
        "never reads",
        Box::new(|socket, tally| {
            let mut s = raw(&socket);
            s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
            let one = framed(br#"{"op":"list"}"#);
            let t0 = Instant::now();
            for _ in 0..200_000 {
                if s.write_all(&one).is_err() {
                    break;
                }
            }
            let hung_up = wait_hangup(&s, Duration::from_secs(FRAME_TIMEOUT_SECS + 30));
            let held = t0.elapsed();
            assert!(
                hung_up,
                "a client that never reads held its connection for {held:?}"
            );
            tally.add("never reads: dropped");
            eprintln!("never-reads client dropped after {held:.1?}");
        }),
    );

    // Every attacker but the idle holder finishes on its own; then the idle ones leave.
    let mut idle_holder = None;
    for (name, h) in attackers {
        if name == "idle connections" {
            idle_holder = Some(h);
            continue;
        }
        if let Err(e) = h.join() {
            std::panic::resume_unwind(e);
        }
        assert!(
            d.child.as_mut().unwrap().try_wait().unwrap().is_none(),
            "daemon died during `{name}`: {}",
            d.log()
        );
    }
    // Let the reclaim and the reconnecting client meet the idle connections a while longer.
    std::thread::sleep(Duration::from_secs(RECLAIM_IDLE_SECS + 1));
    idle_stop.store(true, Ordering::Relaxed);
    if let Err(e) = idle_holder.unwrap().join() {
        std::panic::resume_unwind(e);
    }
    stop.store(true, Ordering::Relaxed);
    let mut lat = acquirer.join().expect("good client");
    let waits = reconnecter.join().expect("reconnecting client");
    sampler.join().unwrap();
    assert!(
        d.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "daemon died: {}",
        d.log()
    );

    // Descriptors return to the baseline once the attackers are gone.
    let t0 = Instant::now();
    let fds_after = loop {
        let n = fd_count(pid);
        if n <= fds0 + 4 || t0.elapsed() > Duration::from_secs(30) {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let rss_after = rss_kb(pid);
    let (rss_peak, fds_peak) = (
        peak_rss.load(Ordering::Relaxed),
        peak_fds.load(Ordering::Relaxed),
    );

    lat.sort();
    let mut waits_sorted = waits.clone();
    waits_sorted.sort();
    eprintln!(
        "good client: {} acquires, p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().unwrap()
    );
    eprintln!(
        "fresh-connection client: {} connect+acquire, p50 {:.2?}, max {:.2?}",
        waits_sorted.len(),
        percentile(&waits_sorted, 0.5),
        waits_sorted.last().unwrap()
    );
    eprintln!(
        "daemon RSS: {} MB before, {} MB peak, {} MB after; fds: {fds0} before, {fds_peak} peak, {fds_after} after",
        rss0 / 1024,
        rss_peak / 1024,
        rss_after / 1024
    );
    for (what, n) in tally.0.lock().unwrap().iter() {
        eprintln!("  {n:6}  {what}");
    }

    // Liveness, with generous bounds: never the latency target itself.
    assert!(lat.len() > 10, "the good client hardly ran: {}", lat.len());
    let slowest = *lat.last().unwrap();
    assert!(
        slowest < Duration::from_secs(5),
        "a good acquire took {slowest:?}"
    );
    assert!(!waits.is_empty());
    assert!(
        fds_after <= fds0 + 4,
        "descriptors leaked: {fds0} before, {fds_after} after"
    );
    assert!(
        rss_peak.saturating_sub(rss0) < 100 * 1024,
        "RSS grew from {rss0} kB to {rss_peak} kB"
    );
    let mut c = d.client();
    let stats = c.stats().unwrap();
    assert_eq!(stats.builds, builds_before, "the flood rebuilt: {stats:?}");
    let art = c.acquire_model("enc").unwrap();
    assert!(!art.files.is_empty());
    drop(c);
    assert!(d.stop(), "daemon did not stop cleanly: {}", d.log());
    assert!(!d.log().contains("panicked"), "{}", d.log());
}

/// Connects as uid/gid 65534 with the given supplementary groups and says hello with a
/// dependency-free Python script; returns what it printed (`hello`, or `connect EACCES`).
fn connect_as_nobody(socket: &Path, groups: Option<u32>) -> String {
    let script = r#"
import errno, json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect", errno.errorcode.get(e.errno, e.errno)); sys.exit(0)
b = json.dumps({"op": "hello", "version": 1, "client": "other-uid"}).encode()
s.sendall(struct.pack(">I", len(b)) + b)
def rd(n):
    d = b""
    while len(d) < n:
        c = s.recv(n - len(d))
        if not c:
            print("closed"); sys.exit(0)
        d += c
    return d
n = struct.unpack(">I", rd(4))[0]
print(json.loads(rd(n))["kind"])
"#;
    let mut cmd = Command::new("/usr/bin/setpriv");
    cmd.args(["--reuid=65534", "--regid=65534"]);
    match groups {
        Some(g) => cmd.arg(format!("--groups={g}")),
        None => cmd.arg("--clear-groups"),
    };
    let out = cmd
        .args(["/usr/bin/python3", "-c", script])
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn only_the_sockets_group_may_connect() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0
        || !Path::new("/usr/bin/setpriv").exists()
        || !Path::new("/usr/bin/python3").exists()
    {
        println!("skipped: needs root, /usr/bin/setpriv and /usr/bin/python3");
        return;
    }
    // A group the test does not create: `users` (gid 100 on Debian).
    let Some(gid) = std::fs::read_to_string("/etc/group").ok().and_then(|g| {
        g.lines()
            .find_map(|l| l.strip_prefix("users:x:")?.split(':').next()?.parse().ok())
    }) else {
        println!("skipped: no `users` group");
        return;
    };
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap().replace(
        "[limits]\n",
        "socket_mode = \"0660\"\nsocket_group = \"users\"\n[limits]\n",
    );
    std::fs::write(d.config(), cfg).unwrap();
    // The socket's folders must be searchable by consumers (as /run/trtcache is, 0755):
    // the socket's own mode and group are what decide.
    {
        use std::os::unix::fs::PermissionsExt;
        for p in [d.root.clone(), d.cache()] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    d.start();
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = std::fs::metadata(d.socket()).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o660);
        assert_eq!(m.gid(), gid);
    }
    assert_eq!(connect_as_nobody(&d.socket(), None), "connect EACCES");
    assert_eq!(connect_as_nobody(&d.socket(), Some(gid)), "hello");
    // The refused client left nothing behind; the daemon serves on.
    let mut c = d.client();
    assert_eq!(c.list().unwrap().len(), 1);
    drop(c);
    assert!(d.stop());
}

#[test]
fn at_the_connection_limit_the_longest_idle_connection_makes_room() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap().replace(
        "[limits]\n",
        "[limits]\nmax_connections = 4\nidle_timeout_secs = 120\nreclaim_idle_secs = 1\n",
    );
    std::fs::write(d.config(), cfg).unwrap();
    d.start();
    // A leaky client fills every slot with greeted connections and forgets them. The first
    // goes idle well before the others: connections greeted back to back start waiting in
    // whatever order the daemon's tasks get to run, and this test is about which one is
    // longest idle, not about microseconds (a full local run once saw another one reclaimed).
    let mut leaked: Vec<UnixStream> = vec![raw(&d.socket())];
    std::thread::sleep(Duration::from_millis(300));
    leaked.extend((1..4).map(|_| raw(&d.socket())));
    let t0 = Instant::now();
    // A new client is refused at first, then (once the leaked ones have idled a second) takes
    // the oldest one's slot, well before the two-minute idle timeout.
    let mut c = loop {
        match Client::connect(d.socket()) {
            Ok(c) => break c,
            Err(e) if e.code() == Some(ErrorCode::Busy) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "locked out by idle connections: {}",
                    d.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("connect: {e}"),
        }
    };
    eprintln!("admitted after {:.2?}", t0.elapsed());
    assert!(c.acquire_model("enc").is_ok());
    // The first leaked connection (the longest idle) was told why it was closed.
    match read_frame(&mut leaked[0], Duration::from_secs(10)) {
        Got::Frame(v) => assert_eq!(code(&v), "idle_timeout", "{v}"),
        other => panic!("reclaimed connection saw {other:?}"),
    }
    assert!(matches!(
        read_frame(&mut leaked[0], Duration::from_secs(10)),
        Got::Closed
    ));
    // The others still work.
    for s in &mut leaked[1..] {
        assert_eq!(call(s, br#"{"op":"list"}"#)["kind"], "models");
    }
    drop(c);
    drop(leaked);
    assert!(d.stop());
}

#[test]
fn a_refused_client_reads_busy_not_a_broken_pipe() {
    let mut d = Daemon::new();
    // One slot, never reclaimed (reclaim_idle_secs = idle_timeout_secs).
    let cfg = std::fs::read_to_string(d.config()).unwrap().replace(
        "[limits]\n",
        "[limits]\nmax_connections = 1\nidle_timeout_secs = 120\nreclaim_idle_secs = 120\n",
    );
    std::fs::write(d.config(), cfg).unwrap();
    d.start();
    let _holder = raw(&d.socket());
    // The daemon writes `busy` and closes at once, often before the client has sent its
    // `hello`: the clients must report the `busy` they were sent, not the broken pipe.
    for i in 0..200 {
        match Client::connect(d.socket()) {
            Err(e) => assert_eq!(e.code(), Some(ErrorCode::Busy), "attempt {i}: {e}"),
            Ok(_) => panic!("attempt {i}: admitted past the limit"),
        }
    }
    let script = r#"
import sys; sys.path.insert(0, sys.argv[1])
from trtcache_client import Client, TrtcacheError
seen = {}
for _ in range(200):
    try:
        # The hello's answer is read with the first request's: `busy` is raised there.
        Client(sys.argv[2]).list(); what = "admitted"
    except TrtcacheError as e:
        what = e.code
    except OSError as e:
        what = type(e).__name__
    seen[what] = seen.get(what, 0) + 1
print(seen)
"#;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(crate::support::python())
        .arg("-c")
        .arg(script)
        .arg(repo.join("clients/python"))
        .arg(d.socket())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.trim(), "{'busy': 200}", "python client saw {text}");
    assert!(d.stop());
}

#[test]
fn the_daemon_raises_its_soft_open_files_limit() {
    use std::os::unix::process::CommandExt;
    let mut d = Daemon::new();
    // As under systemd's default (soft 1024): a soft limit far below max_connections.
    let mut cmd = Command::new(crate::support::bin());
    cmd.args(["serve", "--config"])
        .arg(d.config())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .stderr(std::fs::File::create(d.root.join("daemon.log")).unwrap());
    // SAFETY: setrlimit in the child before exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut l = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            l.rlim_cur = l.rlim_max.min(256);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    d.child = Some(cmd.spawn().unwrap());
    let t0 = Instant::now();
    while Client::connect(d.socket()).is_err() {
        assert!(
            d.child.as_mut().unwrap().try_wait().unwrap().is_none(),
            "daemon exited: {}",
            d.log()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "daemon did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = d.child.as_ref().unwrap().id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let v: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (v[3], v[4]);
    eprintln!("daemon open-files limit: soft {soft}, hard {hard}");
    assert_eq!(soft, hard, "{line}");
    assert!(d.stop());
}
