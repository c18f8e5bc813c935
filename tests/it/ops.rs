//! Operating the daemon: `trtcache health`, the HTTP listener's `/metrics`, `/healthz` and
//! `/readyz` (scraped with a plain HTTP/1.1 GET over a real TCP socket), the daemon's logs at
//! its default level in text, JSON and journald form, and the completions and man page.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, write};

use crate::daemon::Daemon;
use crate::support;

/// Rewrites the daemon's config with `top` keys before `[limits]` and `limits` keys in it.
fn configure(d: &Daemon, top: &str, limits: &str) {
    let text = std::fs::read_to_string(d.config()).unwrap();
    let (head, tail) = text.split_once("[limits]\n").unwrap();
    std::fs::write(
        d.config(),
        format!("{head}{top}\n[limits]\n{tail}{limits}\n"),
    )
    .unwrap();
}

/// Starts `trtcache serve` at its default log level (no `-v`) with extra flags and
/// environment; stderr goes to `daemon.log`.
fn start(d: &mut Daemon, flags: &[&str], env: &[(&str, String)]) {
    let log = std::fs::File::create(d.root.join("daemon.log")).unwrap();
    let mut cmd = Command::new(support::bin());
    cmd.args(flags)
        .args(["serve", "--config"])
        .arg(d.config())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .env_remove("TRTCACHE_LOG_FORMAT")
        .stdout(Stdio::null())
        .stderr(log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    d.child = Some(cmd.spawn().expect("spawning trtcache serve"));
    let t0 = Instant::now();
    while trtcache_client::Client::connect(d.socket()).is_err() {
        if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("daemon exited with {st}: {}", d.log());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no daemon: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls until `f` returns `Some` (panics with the daemon's log after 60 s).
fn eventually<T>(d: &Daemon, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{what} never happened:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The metrics listener's address, from the daemon's log (it binds port 0).
fn metrics_addr(d: &Daemon) -> String {
    eventually(d, "the metrics listener's log line", || {
        let log = d.log();
        let line = log.lines().find(|l| l.contains("metrics listener"))?;
        let addr = line.split("addr=").nth(1)?;
        Some(addr.split_whitespace().next()?.to_string())
    })
}

/// A plain HTTP/1.1 GET: (status, headers, body).
fn get(addr: &str, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    // One write, and whatever arrives before the close: a server that refuses a request it
    // has not read in full answers, closes, and the unread bytes reset the connection.
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n");
    let _ = s.write_all(req.as_bytes());
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n @ 1..) = s.read(&mut buf) {
        raw.extend_from_slice(&buf[..n]);
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    (status, head.to_string(), body.to_string())
}

/// Parses Prometheus text exposition strictly: every line is a `# HELP`/`# TYPE` comment or
/// a sample `name{label="value",...} number` whose family was declared by a `# TYPE`.
/// Returns each sample (name with its labels, as written) and its value.
fn parse_exposition(text: &str) -> HashMap<String, f64> {
    let mut families: Vec<String> = Vec::new();
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix("# ") {
            let mut parts = c.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap(), parts.next().unwrap_or(""));
            assert!(matches!(kind, "HELP" | "TYPE"), "unknown comment `{line}`");
            if kind == "TYPE" {
                let t = parts.next().unwrap_or("");
                assert!(
                    matches!(t, "counter" | "gauge" | "histogram" | "summary" | "untyped"),
                    "bad type in `{line}`"
                );
                families.push(name.to_string());
            }
            continue;
        }
        assert!(!line.is_empty(), "empty line in\n{text}");
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("`{line}`"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value of `{line}` is not a number"));
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in `{line}`"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                let inner = labels
                    .strip_prefix('{')
                    .and_then(|l| l.strip_suffix('}'))
                    .unwrap_or_else(|| panic!("bad labels in `{line}`"));
                for pair in inner.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("`{line}`"));
                    assert!(
                        k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                        "bad label name in `{line}`"
                    );
                    assert!(!v.contains('\n'), "`{line}`");
                }
            }
        }
        let declared = families.iter().any(|f| {
            name == f
                || ["_bucket", "_sum", "_count", "_total"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(f))
        });
        assert!(declared, "sample `{line}` has no # TYPE");
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "duplicate series `{series}`"
        );
    }
    samples
}

fn scrape(addr: &str) -> HashMap<String, f64> {
    let (status, head, body) = get(addr, "/metrics", None);
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    parse_exposition(&body)
}

fn health(d: &Daemon, extra: &[&str]) -> Output {
    support::cmd()
        .arg("health")
        .arg("--socket")
        .arg(d.socket())
        .args(["--config"])
        .arg(d.config())
        .args(extra)
        .output()
        .unwrap()
}

fn replace_with(d: &Daemon, name: &str, m: &trtcache::onnx::proto::ModelProto) {
    let staged = d.models().join(".staging.onnx");
    write(m, &staged).unwrap();
    std::fs::rename(&staged, d.models().join(name)).unwrap();
}

/// A failing model, then the same name replaced by a good one: `health --ready` and `/readyz`
/// go from not ready to ready, the counters and histograms move with the build and an acquire,
/// and the failure is in the log at the daemon's default level with its reason.
#[test]
fn readiness_metrics_and_health_follow_builds_and_acquires() {
    let mut d = Daemon::new();
    configure(&d, "metrics_listen = \"127.0.0.1:0\"", "");
    write(&models::custom_domain(), &d.models().join("enc.onnx")).unwrap();

    // Nothing listens yet: not answering (3), with or without --ready.
    for extra in [&[][..], &["--ready"][..]] {
        let out = health(&d, extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(
            err.contains("not answering") && err.contains("trtcache.sock"),
            "{err}"
        );
    }

    start(&mut d, &[], &[]);
    let addr = metrics_addr(&d);
    let (status, _, body) = get(&addr, "/healthz", None);
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    d.wait_settled(&["enc"]);

    let out = health(&d, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = health(&d, &["--ready", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = support::json(&out);
    assert_eq!(
        (v["answering"].as_bool(), v["ready"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(v["not_ready"][0]["model"], "enc", "{v}");
    assert_eq!(v["not_ready"][0]["state"], "failed", "{v}");
    let (status, _, body) = get(&addr, "/readyz", None);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("enc ort-cpu default: failed"), "{body}");

    let before = scrape(&addr);
    assert_eq!(before["trtcache_builds_total{outcome=\"failed\"}"], 1.0);
    assert_eq!(before["trtcache_builds_total{outcome=\"ok\"}"], 0.0);
    assert_eq!(
        before["trtcache_model_variants{model=\"enc\",state=\"failed\"}"],
        1.0
    );
    let log = d.log();
    let failed = log
        .lines()
        .find(|l| l.contains("build failed"))
        .unwrap_or_else(|| panic!("no build failure at the default level:\n{log}"));
    assert!(
        failed.contains("model=enc") && failed.contains("seconds="),
        "{failed}"
    );
    assert!(failed.contains("com.example:Scale"), "the reason: {failed}");

    // --wait gives up with the last verdict.
    let out = health(&d, &["--ready", "--wait", "1"]);
    assert_eq!(out.status.code(), Some(1));

    replace_with(&d, "enc.onnx", &models::tiny_encoder(false));
    // --wait is the deploy gate: it returns once the new content is built.
    let out = health(&d, &["--ready", "--wait", "120"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("all ready"));
    let (status, _, body) = get(&addr, "/readyz", None);
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    // Over the socket: an acquire from the ready index is counted asynchronously and has no
    // latency (tests/it/ready_index.rs checks its count).
    d.client()
        .acquire(&trtcache_client::AcquireRequest {
            model: "enc".into(),
            ..Default::default()
        })
        .unwrap();
    let after = scrape(&addr);
    assert_eq!(after["trtcache_ready_index_hits_total"], 0.0);
    assert_eq!(after["trtcache_builds_total{outcome=\"ok\"}"], 1.0);
    assert_eq!(after["trtcache_acquires_total{outcome=\"hit\"}"], 1.0);
    assert_eq!(
        after["trtcache_build_duration_seconds_count{outcome=\"ok\"}"],
        1.0
    );
    assert_eq!(
        after["trtcache_acquire_duration_seconds_count{outcome=\"hit\"}"],
        1.0
    );
    assert_eq!(
        after["trtcache_model_variants{model=\"enc\",state=\"ready\"}"],
        1.0
    );
    assert!(after["trtcache_build_duration_seconds_sum{outcome=\"ok\"}"] > 0.0);
    assert!(d
        .log()
        .lines()
        .any(|l| l.contains("build ready") && l.contains("seconds=")));

    // The socket's `stats` request in Prometheus form is the same registry.
    let prom = d.client().stats_prometheus().unwrap();
    let via_socket = parse_exposition(&prom);
    assert_eq!(via_socket["trtcache_acquires_total{outcome=\"hit\"}"], 1.0);
    // OpenMetrics when the scraper asks for it.
    let (status, head, body) = get(
        &addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0"),
    );
    assert_eq!(status, 200);
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert_eq!(get(&addr, "/nope", None).0, 404);

    // An evict request is counted and logged at the default level.
    assert_eq!(d.client().evict(Some("enc"), None).unwrap(), 1);
    let m = scrape(&addr);
    assert_eq!(m["trtcache_evictions_total{reason=\"request\"}"], 1.0);
    assert!(d.log().contains("evicted by request"), "{}", d.log());
    assert!(d.stop());
}

/// Idle HTTP connections up to and past the listener's limit neither stop the socket service
/// nor lock scrapes out: at the limit a new connection closes the oldest one.
#[test]
fn a_flood_of_idle_http_connections_does_not_hurt_the_socket_service() {
    let mut d = Daemon::new();
    configure(
        &d,
        "metrics_listen = \"127.0.0.1:0\"",
        "metrics_max_connections = 2\nframe_timeout_secs = 1",
    );
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    start(&mut d, &[], &[]);
    let addr = metrics_addr(&d);
    d.wait_settled(&["enc"]);
    // Connections that never send a request hold both slots; one past the limit is served,
    // and the oldest idle one is closed to make room for it.
    let mut idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let request = |s: &mut TcpStream| -> String {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut raw = String::new();
        let _ = s.read_to_string(&mut raw);
        raw
    };
    let served = request(&mut TcpStream::connect(&addr).unwrap());
    assert!(
        served.starts_with("HTTP/1.1 200"),
        "a connection past metrics_max_connections was not served: {served:?}"
    );
    idle[0]
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 16];
    match idle[0].read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the oldest idle connection was not closed: {other:?}"),
    }
    // The socket service goes on meanwhile (acquires over the socket, not the ready index).
    let mut c = d.client();
    for _ in 0..20 {
        c.acquire(&trtcache_client::AcquireRequest {
            model: "enc".into(),
            ..Default::default()
        })
        .unwrap();
    }
    // Scrapes are answered meanwhile, whatever the idle ones do.
    let m = eventually(&d, "a scrape after the idle connections", || {
        let raw = request(&mut TcpStream::connect(&addr).ok()?);
        raw.starts_with("HTTP/1.1 200").then_some(raw)
    });
    assert!(
        m.contains("trtcache_acquires_total{outcome=\"hit\"} 20"),
        "{m}"
    );
    drop(idle);
    // A request head over limits.metrics_max_request_bytes (16 KiB) is refused, not read.
    let (status, _, _) = get(&addr, &format!("/metrics?{}", "a".repeat(20_000)), None);
    assert_eq!(status, 431);
    assert!(d.stop());
}

/// `--log-format json`: every stderr line is one JSON object, builds and failures among them.
/// Under journald (`JOURNAL_STREAM` naming stderr) text lines carry a syslog priority and no
/// timestamp.
#[test]
fn json_and_journald_logs() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    write(&models::custom_domain(), &d.models().join("bad.onnx")).unwrap();
    start(&mut d, &["--log-format", "json"], &[]);
    d.wait_settled(&["enc", "bad"]);
    assert!(d.stop());
    let log = d.log();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let find = |msg: &str| {
        events
            .iter()
            .find(|e| e["fields"]["message"] == msg)
            .unwrap_or_else(|| panic!("no `{msg}` event in\n{log}"))
    };
    assert_eq!(find("build ready")["fields"]["model"], "enc");
    assert!(find("build ready")["fields"]["seconds"].as_f64().is_some());
    let failed = find("build failed");
    assert_eq!(failed["level"], "WARN");
    assert!(failed["fields"]["reason"]
        .as_str()
        .unwrap()
        .contains("com.example:Scale"));

    // journald: JOURNAL_STREAM names the device and inode of the daemon's stderr.
    use std::os::unix::fs::MetadataExt;
    let log = std::fs::File::create(d.root.join("daemon.log")).unwrap();
    let meta = log.metadata().unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    drop(log);
    // `start` recreates the file: truncating keeps the inode.
    start(&mut d, &[], &[("JOURNAL_STREAM", stream)]);
    assert!(d.stop());
    let log = d.log();
    assert!(
        log.lines()
            .any(|l| l.starts_with("<6>") && l.contains("ready socket=")),
        "{log}"
    );
    for l in log.lines() {
        assert!(l.starts_with('<'), "no priority: {l}");
        assert!(!l.contains("Z  "), "a timestamp under journald: {l}");
    }
}

#[test]
fn completions_and_man_page() {
    let out = support::trtcache(["completions", "bash"]);
    assert!(out.status.success());
    let bash = String::from_utf8_lossy(&out.stdout);
    for sub in ["serve", "warm", "health", "status", "completions"] {
        assert!(bash.contains(sub), "bash completions lack `{sub}`");
    }
    let out = support::trtcache(["man"]);
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.starts_with(".ie") || page.starts_with(".TH"), "{page}");
    assert!(page.contains(".TH trtcache 1"), "{page}");
    // groff reads it without a warning, where groff is installed.
    if let Ok(mut groff) = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        groff.stdin.take().unwrap().write_all(&out.stdout).unwrap();
        let g = groff.wait_with_output().unwrap();
        assert!(
            g.status.success() && g.stderr.is_empty(),
            "groff: {}",
            String::from_utf8_lossy(&g.stderr)
        );
    }
    let out = support::trtcache(["man", "health"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(".TH trtcache-health"));
    let out = support::trtcache(["man", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no subcommand `nope`"));
}
