//! The fleet tier under a hostile or broken bucket (issue 39): oversized answers, a hung
//! endpoint, a lease that claims to last for ever, a damaged blob of the right size, a
//! revoked signer, and where a fetched artifact is checked. Real daemons, the real binary,
//! moto's S3 server (tests/it/remote.rs) or a TCP listener of the test's own.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use trtcache_client::protocol::{Origin, VariantState};

use crate::daemon::Daemon;
use crate::remote::{
    blob_keys, fleet, local_entries, manifest_key, pull, reader_cfg, wait_output, writer_cfg, Host,
    Moto, BUCKET,
};
use crate::support::{cmd, json, ort_dylib};

/// A listener that accepts connections and never answers (held until the test binary ends).
fn silent_endpoint() -> String {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let conns: Vec<_> = silent.incoming().filter_map(Result::ok).collect();
        drop(conns);
    });
    format!("http://127.0.0.1:{port}")
}

/// A server that answers every request with `head` and then streams zeros until the client
/// hangs up.
fn endless_endpoint(head: &'static str, chunked: bool) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().filter_map(Result::ok) {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                if s.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let zeros = vec![0u8; 64 << 10];
                loop {
                    let r = if chunked {
                        s.write_all(format!("{:x}\r\n", zeros.len()).as_bytes())
                            .and_then(|()| s.write_all(&zeros))
                            .and_then(|()| s.write_all(b"\r\n"))
                    } else {
                        s.write_all(&zeros)
                    };
                    if r.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://127.0.0.1:{port}")
}

fn pull_cmd(h: &Host, model: &Path) -> std::process::Command {
    let mut c = cmd();
    c.args(["pull", model.to_str().unwrap(), "--json"])
        .env("ORT_DYLIB_PATH", ort_dylib())
        .env("TRTCACHE_CACHE_DIR", h.cache())
        .env("TRTCACHE_CONFIG", h.config())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test");
    c
}

fn text(out: &Output) -> String {
    format!(
        "status {:?} stdout={} stderr={}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn oversized_and_endless_answers_are_refused_unread_naming_the_object_and_limit() {
    let f = fleet();
    let reader = Host::new();
    let cfg = format!("{}\nmax_response_bytes = 65536", reader_cfg(&[&f.signer]));
    reader.write_config(&f.moto.endpoint(), &cfg);
    // A 1 MiB manifest: refused before a byte of it is parsed.
    let big = format!(
        "{{\"format\":1,\"manifest\":\"{}\",\"signatures\":[]}}",
        "x".repeat(1 << 20)
    );
    f.moto.put(&manifest_key(&f.key), big.as_bytes());
    let p = pull(&reader, &f, 1);
    let why = p["refused"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("manifests/{}", f.key)) && why.contains("max_response_bytes"),
        "{p}"
    );
    assert_eq!(p["stats"]["remote_errors"], 1, "{p}");
    assert_eq!(local_entries(&reader), 0);

    // A server announcing a 2 GiB body, then streaming it: refused on the announcement.
    reader.write_config(
        &endless_endpoint(
            "HTTP/1.1 200 OK\r\nContent-Length: 2147483648\r\nETag: \"x\"\r\nLast-Modified: Mon, 07 Dec 2026 00:00:00 GMT\r\n\r\n",
            false,
        ),
        &reader_cfg(&[&f.signer]),
    );
    let out = wait_output(pull_cmd(&reader, &f.model), Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let why = json(&out)["refused"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        why.contains("max_response_bytes") && why.contains("manifests/"),
        "{}",
        text(&out)
    );
    // An error answer with an endless body and no length (object_store reads error bodies
    // whole): the read stops at the limit and the pull fails.
    reader.write_config(
        &endless_endpoint(
            "HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n",
            true,
        ),
        &format!("{}\nmax_response_bytes = 65536", reader_cfg(&[&f.signer])),
    );
    let out = wait_output(pull_cmd(&reader, &f.model), Duration::from_secs(120));
    assert!(matches!(out.status.code(), Some(1 | 2)), "{}", text(&out));
    assert!(!text(&out).contains("panicked"), "{}", text(&out));
    assert_eq!(local_entries(&reader), 0);
}

/// A daemon of `d` with `[remote]` (`extra` appended to it) and AWS credentials.
fn with_remote(d: &mut Daemon, endpoint: &str, extra: &str) {
    let mut cfg = std::fs::read_to_string(d.config()).unwrap();
    cfg.push_str(&format!(
        "[remote]\nurl = \"s3://{BUCKET}/fleet-test\"\nendpoint = \"{endpoint}\"\n{extra}\n"
    ));
    std::fs::write(d.config(), cfg).unwrap();
    d.env.push(("AWS_ACCESS_KEY_ID".into(), "test".into()));
    d.env.push(("AWS_SECRET_ACCESS_KEY".into(), "test".into()));
}

fn write_model(d: &Daemon, name: &str) {
    let (_, m) = trtcache::fixtures::models::all()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap();
    trtcache::fixtures::write(&m, &d.models().join(format!("{name}.onnx"))).unwrap();
}

fn origins(st: &[trtcache_client::ModelStatus]) -> Vec<(String, Option<Origin>)> {
    st.iter()
        .flat_map(|m| m.variants.iter().map(|v| (m.name.clone(), v.origin)))
        .collect()
}

/// An endpoint that accepts and never answers, with the tier's default limits: every model
/// is built locally and promptly (the first lookup's deadline opens the breaker; later ones
/// skip the endpoint), and `stats`, `health` and `status` say the tier is unreachable.
#[test]
fn a_hung_endpoint_costs_local_builds_seconds_and_is_reported_unreachable() {
    let mut d = Daemon::new();
    with_remote(&mut d, &silent_endpoint(), "");
    let names = ["tiny_encoder", "tiny_encoder_static", "if_loop"];
    for n in names {
        write_model(&d, n);
    }
    let t0 = Instant::now();
    d.start();
    let st = d.wait_settled(&names);
    let settled = t0.elapsed();
    let o = origins(&st);
    assert!(
        o.iter().all(|(_, o)| *o == Some(Origin::Built)),
        "{o:?} {}",
        d.log()
    );
    assert!(st
        .iter()
        .all(|m| m.variants.iter().all(|v| v.state == VariantState::Ready)));
    eprintln!("hung endpoint: 3 models ready (built here) {settled:?} after the daemon's start");
    if let Some(kb) = d.child.as_ref().and_then(|c| peak_rss_kb(c.id())) {
        eprintln!("daemon peak RSS after 3 local builds: {kb} kB");
    }
    let s = d.client().stats().unwrap();
    let down = s.remote_down.clone().unwrap_or_default();
    assert!(down.contains("no answer within"), "{s:?}");
    // `health` stays healthy (a liveness probe must not restart it) and says so.
    let out = cmd()
        .args(["health", "--json", "--config"])
        .arg(d.config())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = json(&out);
    assert!(
        v["remote_unreachable"]
            .as_str()
            .is_some_and(|s| s.contains("no answer")),
        "{v}"
    );
    let out = cmd()
        .args(["status", "--config"])
        .arg(d.config())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("remote tier is unreachable"),
        "{}",
        text(&out)
    );
}

/// The key `trtcache key` gives a model (the daemon's key for it: one code path).
fn key_of(model: &Path) -> String {
    let d = tempfile::tempdir().unwrap();
    let out = cmd()
        .args(["key", model.to_str().unwrap(), "--json"])
        .env("ORT_DYLIB_PATH", ort_dylib())
        .env("TRTCACHE_CACHE_DIR", d.path().join("c"))
        .output()
        .unwrap();
    json(&out)["key"].as_str().unwrap().to_string()
}

/// A lease naming another holder with an expiry far in the future: the wait holds no build
/// slot (an unrelated model is built meanwhile, with one slot), ends after this host's
/// `lease_secs`, and ends with a local build.
#[test]
fn a_lease_claiming_to_last_for_ever_is_waited_on_without_a_slot_then_built_here() {
    let moto = Moto::start();
    let mut d = Daemon::new();
    with_remote(
        &mut d,
        &moto.endpoint(),
        "lease_secs = 20\nlease_poll_ms = 200\nretries = 1",
    );
    write_model(&d, "tiny_encoder");
    write_model(&d, "if_loop");
    let key = key_of(&d.models().join("tiny_encoder.onnx"));
    let lease = serde_json::json!({
        "key": key,
        "holder": "elsewhere:1:x",
        "expires": trtcache::cache::now_secs() + 1_000_000_000,
    });
    moto.put(
        &format!("fleet-test/leases/{key}"),
        &serde_json::to_vec(&lease).unwrap(),
    );
    d.start();
    // The unrelated model is ready while the leased one still waits.
    let st = d.wait_settled(&["if_loop"]);
    let waiting = st
        .iter()
        .find(|m| m.name == "tiny_encoder")
        .map(|m| m.variants.iter().all(|v| v.state != VariantState::Ready));
    assert_eq!(waiting, Some(true), "{st:?}\n{}", d.log());
    // Then the wait ends (capped at lease_secs, not the lease's claim) with a local build.
    let st = d.wait_settled(&["tiny_encoder"]);
    let o = origins(&st);
    assert!(
        o.iter().all(|(_, o)| *o == Some(Origin::Built)),
        "{o:?}\n{}",
        d.log()
    );
    assert!(
        d.log()
            .contains("gave up waiting on another host's build lease"),
        "{}",
        d.log()
    );
}

/// A blob overwritten with garbage of the same size: `push` compares content, not sizes,
/// sends it again, and hosts fetch the artifact again.
#[test]
fn a_damaged_blob_of_the_same_size_is_repaired_by_push() {
    let f = fleet();
    let blobs = blob_keys(&f.moto, &f.key);
    let (_, blob) = blobs
        .iter()
        .find(|(n, _)| n.ends_with(".onnx"))
        .cloned()
        .unwrap_or_else(|| blobs[0].clone());
    let good = f.moto.get(&blob);
    let garbage: Vec<u8> = good.iter().map(|b| b ^ 0xa5).collect();
    f.moto.put(&blob, &garbage);
    let reader = Host::new();
    reader.write_config(&f.moto.endpoint(), &reader_cfg(&[&f.signer]));
    let p = pull(&reader, &f, 1);
    assert!(p["refused"].as_str().unwrap().contains("SHA-256"), "{p}");
    let pushed = f.writer.run_json(&["push", &f.key, "--json"], 0);
    assert_eq!(pushed["uploaded"][0]["blobs_uploaded"], 1, "{pushed}");
    assert_eq!(f.moto.get(&blob), good);
    assert_eq!(pull(&reader, &f, 0)["origin"], "remote");
    // Pushed again: every blob reads back intact, none is sent.
    let again = f.writer.run_json(&["push", &f.key, "--json"], 0);
    assert_eq!(again["uploaded"][0]["blobs_uploaded"], 0, "{again}");
    assert_eq!(
        again["uploaded"][0]["blobs_verified"],
        blobs.len(),
        "{again}"
    );
}

fn write_config_at(h: &Host, endpoint: &str, prefix: &str, extra: &str) {
    std::fs::write(
        h.config(),
        format!(
            "[remote]\nurl = \"s3://{BUCKET}/{prefix}\"\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\n{extra}\n"
        ),
    )
    .unwrap();
}

/// A host that fetched an artifact signed by A never pushes it (signed with its own key B
/// it would reach hosts trusting only B); once A leaves its trusted keys, `pull` drops the
/// entry and refuses A's manifest, and a daemon no longer serves it: it builds its own.
#[test]
fn a_fetched_entry_is_never_re_signed_and_is_refused_once_its_signer_is_revoked() {
    let f = fleet();
    let h = Host::new();
    let b = h.keygen("host-b");
    h.write_config(&f.moto.endpoint(), &writer_cfg(&b, &[&f.signer, &b]));
    assert_eq!(pull(&h, &f, 0)["origin"], "remote");
    let ls = h.run_json(&["ls", "--json"], 0);
    assert_eq!(ls[0]["provenance"]["kind"], "fetched", "{ls}");
    assert_eq!(ls[0]["provenance"]["signer"], "ci-builder", "{ls}");
    // `push --all` into a fresh prefix: nothing is uploaded, the entry is listed as skipped.
    write_config_at(
        &h,
        &f.moto.endpoint(),
        "resigned",
        &writer_cfg(&b, &[&f.signer, &b]),
    );
    let p = h.run_json(&["push", "--all", "--json"], 0);
    assert_eq!(p["uploaded"].as_array().unwrap().len(), 0, "{p}");
    assert!(
        p["skipped"][0][1].as_str().unwrap().contains("fetched"),
        "{p}"
    );
    assert!(
        !f.moto.listing().iter().any(|o| o.starts_with("resigned/")),
        "{:?}",
        f.moto.listing()
    );
    // Naming the key: refused with the reason.
    let out = h.run(&["push", &f.key, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // A leaves the trusted keys: the local entry goes and A's manifest is refused.
    h.write_config(&f.moto.endpoint(), &writer_cfg(&b, &[&b]));
    let p = pull(&h, &f, 1);
    assert!(
        p["refused"].as_str().unwrap().contains("does not trust"),
        "{p}"
    );
    assert_eq!(local_entries(&h), 0);

    // A daemon whose cache holds A's artifact, started trusting only B: it refuses the
    // entry and builds its own.
    let mut d = Daemon::new();
    trtcache::fixtures::write(
        &trtcache::fixtures::models::tiny_encoder(false),
        &d.models().join("tiny_encoder.onnx"),
    )
    .unwrap();
    let trust = |keys: &[&PathBuf]| {
        let k: Vec<String> = keys
            .iter()
            .map(|p| format!("\"{}.pub\"", p.display()))
            .collect();
        format!("trusted_keys = [{}]\nretries = 0", k.join(", "))
    };
    let base = std::fs::read_to_string(d.config()).unwrap();
    with_remote(&mut d, &f.moto.endpoint(), &trust(&[&f.signer]));
    let out = cmd()
        .args([
            "pull",
            d.models().join("tiny_encoder.onnx").to_str().unwrap(),
        ])
        .args(["--json", "--config"])
        .arg(d.config())
        .env("ORT_DYLIB_PATH", ort_dylib())
        .env("TRTCACHE_CACHE_DIR", d.cache())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .output()
        .unwrap();
    assert_eq!(json(&out)["origin"], "remote", "{}", text(&out));
    std::fs::write(
        d.config(),
        format!(
            "{base}[remote]\nurl = \"s3://{BUCKET}/fleet-test\"\nendpoint = \"{}\"\n{}\n",
            f.moto.endpoint(),
            trust(&[&b])
        ),
    )
    .unwrap();
    d.start();
    let st = d.wait_settled(&["tiny_encoder"]);
    assert_eq!(
        origins(&st),
        [("tiny_encoder".to_string(), Some(Origin::Built))],
        "{}",
        d.log()
    );
    assert!(d.log().contains("no longer trusts"), "{}", d.log());
}

/// The peak resident memory of a process (`VmHWM`, kB).
fn peak_rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// A fetched artifact is checked in the bounded worker process, never in the daemon: the
/// worker executable is a wrapper that keeps each job it is handed.
#[test]
fn a_fetched_artifact_is_checked_in_the_worker_not_the_daemon() {
    let f = fleet();
    let mut d = Daemon::new();
    trtcache::fixtures::write(
        &trtcache::fixtures::models::tiny_encoder(false),
        &d.models().join("tiny_encoder.onnx"),
    )
    .unwrap();
    with_remote(
        &mut d,
        &f.moto.endpoint(),
        &reader_cfg(&[&f.signer]).replace("timeout_ms = 10000", ""),
    );
    let jobs = d.root.join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    let wrapper = d.root.join("worker.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nj=$(mktemp -p {jobs:?})\ncat > \"$j\"\nexec {:?} \"$@\" < \"$j\"\n",
            crate::support::bin()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    d.env.push(("TRTCACHE_WORKER_EXE".into(), wrapper.into()));
    d.start();
    let st = d.wait_settled(&["tiny_encoder"]);
    assert_eq!(
        origins(&st),
        [("tiny_encoder".to_string(), Some(Origin::Remote))],
        "{}",
        d.log()
    );
    let handed: Vec<String> = std::fs::read_dir(&jobs)
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        handed.iter().any(|j| j.contains("\"check\"")),
        "the worker was never handed the check: {handed:?}\n{}",
        d.log()
    );
    if let Some(kb) = d.child.as_ref().and_then(|c| peak_rss_kb(c.id())) {
        eprintln!("daemon peak RSS after a fetch: {kb} kB");
    }
}
