//! The fleet tier against a real S3 server (moto's server mode, started here on a free
//! port): push/pull through the real binary, signatures, tampered, truncated and missing
//! objects, a dead and a slow endpoint, read-only hosts, leases and racing writers.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use trtcache::cache::{Lookup, SledStore, Store, StoreOptions};
use trtcache::key::CacheKey;
use trtcache::remote::{LeaseState, Mode, RemoteConfig, RemoteError, RemoteTier, UploadJob};

use crate::support::{cmd, json, ort_dylib, python};

pub(crate) const BUCKET: &str = "fleet";
/// moto does not check signatures, but maps the credential to an account: without one a
/// request is anonymous and may not read the objects the tier wrote.
const AUTH: &str = "Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";

/// A moto S3 server on a free port, killed on drop.
pub(crate) struct Moto {
    pub(crate) child: Child,
    pub(crate) port: u16,
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Moto {
    pub(crate) fn start() -> Self {
        let port = free_port();
        let child = Command::new(python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto missing: run scripts/setup-python.sh (installs moto[server])");
        let m = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = m.http("GET", "/", b"") {
                break;
            }
            assert!(Instant::now() < deadline, "moto did not answer on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let (st, body) = m.http("PUT", &format!("/{BUCKET}"), b"").unwrap();
        assert_eq!(st, 200, "create bucket: {}", String::from_utf8_lossy(&body));
        m
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One plain HTTP request (moto does not check signatures): status and body.
    pub(crate) fn http(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n{AUTH}\r\n\r\n",
            self.port,
            body.len()
        )?;
        s.write_all(body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no header end"))?;
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut body = raw[split + 4..].to_vec();
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body = dechunk(&body);
        }
        Ok((status, body))
    }

    pub(crate) fn get(&self, key: &str) -> Vec<u8> {
        let (st, b) = self.http("GET", &format!("/{BUCKET}/{key}"), b"").unwrap();
        assert_eq!(st, 200, "GET {key}");
        b
    }

    pub(crate) fn put(&self, key: &str, body: &[u8]) {
        let (st, _) = self.http("PUT", &format!("/{BUCKET}/{key}"), body).unwrap();
        assert_eq!(st, 200, "PUT {key}");
    }

    pub(crate) fn delete(&self, key: &str) {
        let (st, _) = self
            .http("DELETE", &format!("/{BUCKET}/{key}"), b"")
            .unwrap();
        assert_eq!(st, 204, "DELETE {key}");
    }

    /// Every object key in the bucket with its ETag (to see that nothing was written).
    pub(crate) fn listing(&self) -> Vec<String> {
        let (st, b) = self
            .http("GET", &format!("/{BUCKET}?list-type=2"), b"")
            .unwrap();
        assert_eq!(st, 200);
        let s = String::from_utf8_lossy(&b).into_owned();
        let mut out: Vec<String> = s
            .split("<Contents>")
            .skip(1)
            .map(|c| {
                let f = |t: &str| {
                    c.split(&format!("<{t}>"))
                        .nth(1)
                        .and_then(|x| x.split(&format!("</{t}>")).next())
                        .unwrap_or("")
                        .to_string()
                };
                format!("{} {} {}", f("Key"), f("ETag"), f("LastModified"))
            })
            .collect();
        out.sort();
        out
    }
}

fn dechunk(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(nl) = b[i..].windows(2).position(|w| w == b"\r\n") {
        let n =
            usize::from_str_radix(String::from_utf8_lossy(&b[i..i + nl]).trim(), 16).unwrap_or(0);
        i += nl + 2;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[i..i + n]);
        i += n + 2;
    }
    out
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A host: a cache dir, a config file, keys.
pub(crate) struct Host {
    pub(crate) dir: tempfile::TempDir,
}

impl Host {
    pub(crate) fn new() -> Self {
        Host {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub(crate) fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }
    pub(crate) fn config(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }
    pub(crate) fn write_config(&self, endpoint: &str, extra: &str) {
        std::fs::write(
            self.config(),
            format!(
                "[remote]\nurl = \"s3://{BUCKET}/fleet-test\"\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\n{extra}\n"
            ),
        )
        .unwrap();
    }
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        let mut c = cmd();
        c.args(args)
            .env("ORT_DYLIB_PATH", ort_dylib())
            .env("TRTCACHE_CACHE_DIR", self.cache())
            .env("TRTCACHE_CONFIG", self.config())
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE");
        c.output().expect("running trtcache")
    }
    /// Runs and requires exit status `code`, returning stdout as JSON.
    pub(crate) fn run_json(&self, args: &[&str], code: i32) -> serde_json::Value {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "trtcache {args:?}: stdout={} stderr={}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        json(&out)
    }
    pub(crate) fn keygen(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        let out = self.run(&["keygen", p.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        p
    }
}

pub(crate) fn model(dir: &Path) -> PathBuf {
    let p = dir.join("tiny_encoder.onnx");
    trtcache::fixtures::write(&trtcache::fixtures::models::tiny_encoder(false), &p).unwrap();
    p
}

pub(crate) fn writer_cfg(key: &Path, trusted: &[&Path]) -> String {
    let t: Vec<String> = trusted
        .iter()
        .map(|p| format!("\"{}.pub\"", p.display()))
        .collect();
    format!(
        "mode = \"read-write\"\nsigning_key = \"{}.key\"\ntrusted_keys = [{}]\nretries = 0\ntimeout_ms = 10000",
        key.display(),
        t.join(", ")
    )
}

pub(crate) fn reader_cfg(trusted: &[&Path]) -> String {
    let t: Vec<String> = trusted
        .iter()
        .map(|p| format!("\"{}.pub\"", p.display()))
        .collect();
    format!(
        "trusted_keys = [{}]\nretries = 0\ntimeout_ms = 10000",
        t.join(", ")
    )
}

/// A built and pushed model: the writer host, its key and the model's key.
pub(crate) struct Fleet {
    pub(crate) moto: Moto,
    pub(crate) writer: Host,
    pub(crate) signer: PathBuf,
    pub(crate) model: PathBuf,
    pub(crate) key: String,
    pub(crate) models: tempfile::TempDir,
}

pub(crate) fn fleet() -> Fleet {
    let moto = Moto::start();
    let writer = Host::new();
    let signer = writer.keygen("ci-builder");
    writer.write_config(&moto.endpoint(), &writer_cfg(&signer, &[&signer]));
    let models = tempfile::tempdir().unwrap();
    let model = model(models.path());
    let built = writer.run_json(&["build", model.to_str().unwrap(), "--json"], 0);
    let key = built["key"].as_str().unwrap().to_string();
    let pushed = writer.run_json(&["push", &key, "--json"], 0);
    assert_eq!(pushed["uploaded"][0]["manifest_written"], true, "{pushed}");
    assert_eq!(pushed["stats"]["remote_uploads"], 1);
    Fleet {
        moto,
        writer,
        signer,
        model,
        key,
        models,
    }
}

pub(crate) fn manifest_key(key: &str) -> String {
    format!("fleet-test/manifests/{key}")
}

pub(crate) fn envelope(m: &Moto, key: &str) -> serde_json::Value {
    serde_json::from_slice(&m.get(&manifest_key(key))).unwrap()
}

pub(crate) fn blob_keys(m: &Moto, key: &str) -> Vec<(String, String)> {
    let env = envelope(m, key);
    let man: serde_json::Value = serde_json::from_str(env["manifest"].as_str().unwrap()).unwrap();
    man["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                format!("fleet-test/blobs/sha256/{}", f["sha256"].as_str().unwrap()),
            )
        })
        .collect()
}

pub(crate) fn local_entries(h: &Host) -> usize {
    let out = h.run(&["ls", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out).as_array().map_or(0, |a| a.len())
}

pub(crate) fn pull(h: &Host, f: &Fleet, code: i32) -> serde_json::Value {
    h.run_json(&["pull", f.model.to_str().unwrap(), "--json"], code)
}

#[test]
fn push_then_pull_gives_the_same_key_and_files_and_a_hit_never_touches_the_network() {
    let f = fleet();
    let reader = Host::new();
    reader.write_config(&f.moto.endpoint(), &reader_cfg(&[&f.signer]));
    let p = pull(&reader, &f, 0);
    assert_eq!(p["key"], f.key.as_str());
    assert_eq!(p["origin"], "remote", "{p}");
    assert_eq!(p["stats"]["remote_hits"], 1);
    // Same files, byte for byte, as the writer's entry.
    let files = |h: &Host| {
        let out = h.run(&["ls", "--json"]);
        let v = json(&out);
        v[0]["artifact"]["files"].clone()
    };
    let theirs = files(&f.writer);
    assert!(theirs.as_array().is_some_and(|a| !a.is_empty()), "{theirs}");
    assert_eq!(files(&reader), theirs);
    let ls = reader.run_json(&["ls", "--json"], 0);
    assert_eq!(ls[0]["key"], f.key.as_str());
    // The local copy is served by `build` as a plain cache hit.
    let b = reader.run_json(&["build", f.model.to_str().unwrap(), "--json"], 0);
    assert_eq!(b["cache_hit"], true);
    // A local hit never opens the tier: with the endpoint dead it is still a hit.
    drop(f.moto);
    reader.write_config("http://127.0.0.1:9", &reader_cfg(&[&f.signer]));
    let again = reader.run_json(&["pull", f.model.to_str().unwrap(), "--json"], 0);
    assert_eq!(again["origin"], "local");
    drop(f.models);
}

#[test]
fn untrusted_unsigned_and_edited_manifests_are_refused_and_counted() {
    let f = fleet();
    // Signed by a key this host does not trust.
    let reader = Host::new();
    let other = reader.keygen("someone-else");
    reader.write_config(&f.moto.endpoint(), &reader_cfg(&[&other]));
    let p = pull(&reader, &f, 1);
    assert!(
        p["refused"].as_str().unwrap().contains("does not trust"),
        "{p}"
    );
    assert_eq!(p["stats"]["remote_rejected"], 1);
    assert_eq!(local_entries(&reader), 0);
    // Rotation: trusting both keys accepts it.
    let rotated = Host::new();
    rotated.write_config(&f.moto.endpoint(), &reader_cfg(&[&other, &f.signer]));
    assert_eq!(pull(&rotated, &f, 0)["origin"], "remote");

    let trusting = Host::new();
    trusting.write_config(&f.moto.endpoint(), &reader_cfg(&[&f.signer]));
    let original = f.moto.get(&manifest_key(&f.key));
    // Unsigned.
    let mut env = envelope(&f.moto, &f.key);
    env["signatures"] = serde_json::json!([]);
    f.moto
        .put(&manifest_key(&f.key), &serde_json::to_vec(&env).unwrap());
    let p = pull(&trusting, &f, 1);
    assert!(p["refused"].as_str().unwrap().contains("unsigned"), "{p}");
    assert_eq!(p["stats"]["remote_rejected"], 1);
    // Edited after signing (the signature is kept).
    let mut env: serde_json::Value = serde_json::from_slice(&original).unwrap();
    let m = env["manifest"]
        .as_str()
        .unwrap()
        .replace("\"build_ms\":", "\"build_ms\":1");
    env["manifest"] = serde_json::Value::String(m);
    f.moto
        .put(&manifest_key(&f.key), &serde_json::to_vec(&env).unwrap());
    let p = pull(&trusting, &f, 1);
    assert!(
        p["refused"].as_str().unwrap().contains("does not verify"),
        "{p}"
    );
    assert_eq!(local_entries(&trusting), 0);
    // Restored: accepted.
    f.moto.put(&manifest_key(&f.key), &original);
    assert_eq!(pull(&trusting, &f, 0)["origin"], "remote");
}

#[test]
fn flipped_truncated_and_missing_blobs_are_refused_never_stored_and_rebuilt_locally() {
    let f = fleet();
    let blobs = blob_keys(&f.moto, &f.key);
    let (name, blob) = blobs
        .iter()
        .find(|(n, _)| n.ends_with(".onnx"))
        .cloned()
        .unwrap_or_else(|| blobs[0].clone());
    let good = f.moto.get(&blob);
    let reader = Host::new();
    reader.write_config(&f.moto.endpoint(), &reader_cfg(&[&f.signer]));

    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x01;
    f.moto.put(&blob, &flipped);
    let p = pull(&reader, &f, 1);
    let why = p["refused"].as_str().unwrap();
    assert!(why.contains(&name) && why.contains("SHA-256"), "{p}");
    assert_eq!(p["stats"]["remote_rejected"], 1);
    assert_eq!(local_entries(&reader), 0);

    f.moto.put(&blob, &good[..good.len() - 1]);
    let p = pull(&reader, &f, 1);
    assert!(p["refused"].as_str().unwrap().contains("truncated"), "{p}");
    assert_eq!(local_entries(&reader), 0);

    f.moto.delete(&blob);
    let p = pull(&reader, &f, 1);
    assert!(p["refused"].as_str().unwrap().contains("missing"), "{p}");
    assert_eq!(local_entries(&reader), 0);

    // The host builds locally instead, and a writer's push with --force repairs the bucket.
    let b = reader.run_json(&["build", f.model.to_str().unwrap(), "--json"], 0);
    assert_eq!(b["source"], "built");
    f.writer.run_json(&["push", &f.key, "--force", "--json"], 0);
    let fresh = Host::new();
    fresh.write_config(&f.moto.endpoint(), &reader_cfg(&[&f.signer]));
    assert_eq!(pull(&fresh, &f, 0)["origin"], "remote");
}

pub(crate) fn wait_output(mut c: Command, limit: Duration) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("trtcache did not give up within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_dead_or_silent_endpoint_fails_the_pull_with_an_error_and_local_builds_go_on() {
    let models = tempfile::tempdir().unwrap();
    let m = model(models.path());
    let h = Host::new();
    // Nothing listens: connection refused.
    h.write_config(
        &format!("http://127.0.0.1:{}", free_port()),
        "retries = 1\ntimeout_ms = 2000\nconnect_timeout_ms = 500",
    );
    let out = h.run(&["pull", m.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("remote get manifest"), "{err}");
    // A server that accepts and never answers: the request timeout ends it.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepts and holds connections, never answering (the thread ends with the test binary).
    std::thread::spawn(move || {
        let conns: Vec<_> = silent.incoming().filter_map(Result::ok).collect();
        drop(conns);
    });
    h.write_config(
        &format!("http://127.0.0.1:{port}"),
        "retries = 0\ntimeout_ms = 500\nconnect_timeout_ms = 500",
    );
    let mut c = cmd();
    c.args(["pull", m.to_str().unwrap()])
        .env("ORT_DYLIB_PATH", ort_dylib())
        .env("TRTCACHE_CACHE_DIR", h.cache())
        .env("TRTCACHE_CONFIG", h.config())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test");
    let out = wait_output(c, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("timed out") || err.contains("timeout"),
        "{err}"
    );
    // Building locally does not need the tier.
    let b = h.run_json(&["build", m.to_str().unwrap(), "--json"], 0);
    assert_eq!(b["source"], "built");
}

fn cfg(
    moto: &Moto,
    mode: Mode,
    dir: &Path,
    signer: Option<&Path>,
    trusted: &[&Path],
) -> RemoteConfig {
    let _ = dir;
    RemoteConfig {
        url: format!("s3://{BUCKET}/fleet-test"),
        endpoint: Some(moto.endpoint()),
        mode,
        signing_key: signer.map(|p| PathBuf::from(format!("{}.key", p.display()))),
        trusted_keys: trusted
            .iter()
            .map(|p| PathBuf::from(format!("{}.pub", p.display())))
            .collect(),
        retries: 0,
        lease_secs: 60,
        lease_poll_ms: 50,
        ..Default::default()
    }
}

fn tier(c: &RemoteConfig) -> RemoteTier {
    RemoteTier::open_with_credentials(c, "test", "test").unwrap()
}

#[test]
fn the_circuit_breaker_opens_after_repeated_failures() {
    let c = RemoteConfig {
        url: format!("s3://{BUCKET}/x"),
        endpoint: Some(format!("http://127.0.0.1:{}", free_port())),
        retries: 0,
        connect_timeout_ms: 300,
        breaker_failures: 2,
        breaker_cooldown_secs: 3600,
        ..Default::default()
    };
    let t = tier(&c);
    let key = CacheKey([7; 32]);
    for _ in 0..2 {
        assert!(matches!(
            t.manifest(&key),
            Err(RemoteError::Unavailable { .. })
        ));
    }
    // Open: fails at once without a request.
    assert!(matches!(
        t.manifest(&key),
        Err(RemoteError::CircuitOpen { .. })
    ));
    let store_dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(store_dir.path(), StoreOptions::default()).unwrap();
    let parts = some_parts();
    let r = t.fetch(&parts, "m", &store, &|_, _| Ok(()));
    assert!(matches!(r, Err(RemoteError::CircuitOpen { .. })), "{r:?}");
    assert_eq!(t.stats().remote_errors, 1);
}

fn some_parts() -> trtcache::key::KeyParts {
    let d = tempfile::tempdir().unwrap();
    let p = model(d.path());
    let out = cmd()
        .args(["key", p.to_str().unwrap(), "--json"])
        .env("ORT_DYLIB_PATH", ort_dylib())
        .env("TRTCACHE_CACHE_DIR", d.path().join("c"))
        .output()
        .unwrap();
    let v = json(&out);
    serde_json::from_value(v["parts"].clone()).unwrap_or_else(|e| panic!("parts in {v}: {e}"))
}

/// A built local entry in `cache` (through the real binary) and its upload job.
fn built_job(cache: &Path, models: &Path) -> (SledStore, UploadJob) {
    let m = model(models);
    let out = cmd()
        .args(["build", m.to_str().unwrap(), "--json"])
        .env("ORT_DYLIB_PATH", ort_dylib())
        .env("TRTCACHE_CACHE_DIR", cache)
        .output()
        .unwrap();
    let key = CacheKey::parse(json(&out)["key"].as_str().unwrap()).unwrap();
    let store = SledStore::open(cache, StoreOptions::default()).unwrap();
    let job = match store.peek(&key).unwrap() {
        Lookup::Hit { record, served } => UploadJob {
            record,
            dir: served.dir,
            release_lease: false,
        },
        other => panic!("not built: {other:?}"),
    };
    (store, job)
}

#[test]
fn read_only_hosts_never_write() {
    let moto = Moto::start();
    let d = tempfile::tempdir().unwrap();
    let (store, job) = built_job(&d.path().join("c"), d.path());
    let before = moto.listing();
    let ro = tier(&cfg(&moto, Mode::ReadOnly, d.path(), None, &[]));
    assert!(matches!(ro.upload(&job, true), Err(RemoteError::ReadOnly)));
    ro.enqueue_upload(job.clone());
    assert!(ro.flush_uploads(Duration::from_secs(5)));
    assert_eq!(ro.lease(&job.record.key).unwrap(), LeaseState::Free);
    assert!(ro.gc(Duration::ZERO, false).is_err());
    let other = SledStore::open(&d.path().join("c2"), StoreOptions::default()).unwrap();
    assert!(ro
        .fetch(&job.record.parts, "m", &other, &|_, _| Ok(()))
        .unwrap()
        .is_none());
    assert_eq!(ro.stats().remote_misses, 1);
    assert_eq!(
        moto.listing(),
        before,
        "a read-only host wrote to the bucket"
    );
    // And the CLI refuses to push.
    let h = Host::new();
    h.write_config(&moto.endpoint(), "");
    let out = h.run(&["push", "--all"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("read-only"));
    assert_eq!(moto.listing(), before);
    drop(store);
}

#[test]
fn a_dead_hosts_lease_expires_and_is_taken_over_and_a_live_one_is_waited_on() {
    let moto = Moto::start();
    let d = tempfile::tempdir().unwrap();
    let k = d.path().join("w");
    crate::support::trtcache(["keygen", k.to_str().unwrap()]);
    let key = CacheKey([9; 32]);
    let lease_obj = format!("fleet-test/leases/{}", key.hex());
    // A dead host's lease, expired a second ago.
    let dead = serde_json::json!({"key": key.hex(), "holder": "dead-host:1:x", "expires": trtcache::cache::now_secs() - 1});
    moto.put(&lease_obj, &serde_json::to_vec(&dead).unwrap());
    let a = tier(&cfg(&moto, Mode::ReadWrite, d.path(), Some(&k), &[&k]));
    assert_eq!(a.lease(&key).unwrap(), LeaseState::Acquired);
    let held: serde_json::Value = serde_json::from_slice(&moto.get(&lease_obj)).unwrap();
    assert_eq!(held["holder"], a.holder());
    // A second writer sees a live lease held by the first.
    let b = tier(&cfg(&moto, Mode::ReadWrite, d.path(), Some(&k), &[&k]));
    match b.lease(&key).unwrap() {
        LeaseState::HeldBy(l) => assert_eq!(l.holder, a.holder()),
        other => panic!("{other:?}"),
    }
    // Read-only hosts see it too (and wait rather than build).
    let ro = tier(&cfg(&moto, Mode::ReadOnly, d.path(), None, &[&k]));
    let LeaseState::HeldBy(l) = ro.lease(&key).unwrap() else {
        panic!("read-only host does not see the lease")
    };
    // Released: the waiter stops waiting (no manifest, so it builds itself).
    a.release(&key).unwrap();
    assert!(!ro.wait_for_manifest(&key, &l));
    assert_eq!(b.lease(&key).unwrap(), LeaseState::Acquired);
}

#[test]
fn two_writers_racing_on_one_key_end_with_one_manifest_both_adopt() {
    let moto = Moto::start();
    let d = tempfile::tempdir().unwrap();
    let (store, job) = built_job(&d.path().join("c"), d.path());
    let (k1, k2) = (d.path().join("host-a"), d.path().join("host-b"));
    for k in [&k1, &k2] {
        crate::support::trtcache(["keygen", k.to_str().unwrap()]);
    }
    // moto answers some concurrent PUTs of one blob with a 500: retried, as any 5xx is.
    let retried = |k: &Path| RemoteConfig {
        retries: 5,
        ..cfg(&moto, Mode::ReadWrite, d.path(), Some(k), &[&k1, &k2])
    };
    let a = tier(&retried(&k1));
    let b = tier(&retried(&k2));
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| a.upload(&job, true));
        let hb = s.spawn(|| b.upload(&job, true));
        (ha.join().unwrap().unwrap(), hb.join().unwrap().unwrap())
    });
    assert_eq!(
        [ra.manifest_written, rb.manifest_written]
            .iter()
            .filter(|w| **w)
            .count(),
        1,
        "{ra:?} {rb:?}"
    );
    let loser = if ra.manifest_written { &rb } else { &ra };
    assert!(loser.adopted.is_some());
    // Both now read the same manifest, and a third host fetches it.
    let there = a.raw_manifest(&job.record.key).unwrap().unwrap();
    assert_eq!(b.raw_manifest(&job.record.key).unwrap().unwrap(), there);
    let other = SledStore::open(&d.path().join("c2"), StoreOptions::default()).unwrap();
    let got = b
        .fetch(&job.record.parts, "m", &other, &|_, _| Ok(()))
        .unwrap()
        .unwrap();
    assert_eq!(got.artifact, job.record.artifact);
    drop(store);
}

#[test]
fn remote_gc_prunes_by_age_only() {
    let f = fleet();
    let before = f.moto.listing();
    let keep = f
        .writer
        .run_json(&["remote", "gc", "--older-than", "1d", "--json"], 0);
    assert_eq!(keep["manifests_kept"], 1);
    assert_eq!(f.moto.listing(), before);
    // moto's LastModified has one-second resolution: wait until the objects are older.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dry = f.writer.run_json(
            &["remote", "gc", "--older-than", "0s", "--dry-run", "--json"],
            0,
        );
        assert_eq!(f.moto.listing(), before, "a dry run deleted");
        if dry["manifests_deleted"].as_array().unwrap().len() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{dry}");
        std::thread::sleep(Duration::from_millis(200));
    }
    loop {
        let g = f
            .writer
            .run_json(&["remote", "gc", "--older-than", "0s", "--json"], 0);
        if !g["blobs_deleted"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{g}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(f.moto.listing().is_empty(), "{:?}", f.moto.listing());
    // Local entries are untouched.
    assert_eq!(local_entries(&f.writer), 1);
}

/// `trtcache pull MODEL` as `reader`, in the background (stderr as given).
fn spawn_pull(reader: &Host, m: &Path, stderr: Stdio) -> Child {
    let mut c = cmd();
    c.args(["pull", m.to_str().unwrap()])
        .env("ORT_DYLIB_PATH", ort_dylib())
        .env("TRTCACHE_CACHE_DIR", reader.cache())
        .env("TRTCACHE_CONFIG", reader.config())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .stdout(Stdio::null())
        .stderr(stderr);
    c.spawn().unwrap()
}

/// Whether a staging directory under `tmp` holds a partly written download.
fn partial_download(tmp: &Path) -> bool {
    std::fs::read_dir(tmp)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with("build-"))
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .any(|f| f.metadata().map(|x| x.len() > 0).unwrap_or(false))
}

#[test]
fn a_sigkill_mid_download_leaves_no_partial_entry() {
    let moto = Moto::start();
    let writer = Host::new();
    let signer = writer.keygen("ci-builder");
    writer.write_config(&moto.endpoint(), &writer_cfg(&signer, &[&signer]));
    let models = tempfile::tempdir().unwrap();
    // ~64 MiB of weights, so the download takes long enough to be caught in the middle.
    let m = models.path().join("big.onnx");
    trtcache::fixtures::write(&trtcache::fixtures::models::big_weights(4, 2048), &m).unwrap();
    let built = writer.run_json(&["build", m.to_str().unwrap(), "--json"], 0);
    let key = built["key"].as_str().unwrap().to_string();
    writer.run_json(&["push", &key, "--json"], 0);
    let reader = Host::new();
    reader.write_config(&moto.endpoint(), &reader_cfg(&[&signer]));
    let mut caught = false;
    for _ in 0..5 {
        let _ = std::fs::remove_dir_all(reader.cache());
        let mut child = spawn_pull(&reader, &m, Stdio::null());
        let tmp = reader.cache().join("tmp");
        let deadline = Instant::now() + Duration::from_secs(120);
        // Poll for a partly written download in a staging directory, then SIGKILL.
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            if partial_download(&tmp) {
                child.kill().unwrap();
                caught = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = child.wait();
        if caught {
            break;
        }
    }
    assert!(caught, "never caught the pull mid-download");
    // Nothing half-stored: no entry, and the next writing open (`gc`; `ls` only reads)
    // removes the staging leftovers.
    let ls = reader.run_json(&["ls", "--json"], 0);
    assert_eq!(ls.as_array().unwrap().len(), 0, "{ls}");
    reader.run_json(&["gc", "--max-size", "10G", "--json"], 0);
    let leftovers = std::fs::read_dir(reader.cache().join("tmp"))
        .unwrap()
        .count();
    assert_eq!(leftovers, 0);
    // And a new pull completes.
    assert_eq!(
        reader.run_json(&["pull", m.to_str().unwrap(), "--json"], 0)["origin"],
        "remote"
    );
}

/// A daemon (tests/it/daemon.rs) with a `[remote]` section, started with AWS credentials.
fn fleet_daemon(moto: &Moto, key: &Path, trusted: &Path) -> crate::daemon::Daemon {
    let mut d = crate::daemon::Daemon::new();
    let mut cfg = std::fs::read_to_string(d.config()).unwrap();
    cfg.push_str(&format!(
        "[remote]\nurl = \"s3://{BUCKET}/fleet-test\"\nendpoint = \"{}\"\nmode = \"read-write\"\nsigning_key = \"{}.key\"\ntrusted_keys = [\"{}.pub\"]\nlease_poll_ms = 100\nretries = 1\n",
        moto.endpoint(),
        key.display(),
        trusted.display()
    ));
    std::fs::write(d.config(), cfg).unwrap();
    let m = d.models().join("tiny_encoder.onnx");
    trtcache::fixtures::write(&trtcache::fixtures::models::tiny_encoder(false), &m).unwrap();
    let log = std::fs::File::create(d.root.join("daemon.log")).unwrap();
    let child = Command::new(crate::support::bin())
        .args(["-v", "serve", "--config"])
        .arg(d.config())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    d.child = Some(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while trtcache_client::Client::connect(d.socket()).is_err() {
        assert!(
            Instant::now() < deadline,
            "daemon did not come up: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    d
}

#[test]
fn several_daemons_on_one_bucket_build_a_model_once_in_total() {
    let moto = Moto::start();
    let keys = tempfile::tempdir().unwrap();
    let k = keys.path().join("fleet-writer");
    crate::support::trtcache(["keygen", k.to_str().unwrap()]);
    let daemons: Vec<_> = (0..3).map(|_| fleet_daemon(&moto, &k, &k)).collect();
    for d in &daemons {
        let st = d.wait_settled(&["tiny_encoder"]);
        assert!(
            st.iter().all(|m| m
                .variants
                .iter()
                .all(|v| v.state == trtcache_client::protocol::VariantState::Ready)),
            "{st:?} {}",
            d.log()
        );
    }
    let logs: Vec<String> = daemons.iter().map(|d| d.log()).collect();
    let fetched = logs
        .iter()
        .filter(|l| l.contains("fetched from the remote tier"))
        .count();
    assert_eq!(fetched, 2, "two of three daemons fetch: {logs:#?}");
    // `status` says where each ready artifact came from, and `stats` counts the tier.
    let mut origins = Vec::new();
    let (mut hits, mut builds, mut fetches) = (0, 0, 0);
    for d in &daemons {
        let mut c = d.client();
        let st = c.list().unwrap();
        origins.push(st[0].variants[0].origin);
        let s = c.stats().unwrap();
        hits += s.remote_hits;
        builds += s.builds;
        fetches += s.fetches;
        // A fetch is counted as one, never as a build (issue 39), in the metrics too.
        let fetched = st[0].variants[0].origin == Some(trtcache_client::protocol::Origin::Remote);
        assert_eq!(
            (s.builds, s.fetches),
            if fetched { (0, 1) } else { (1, 0) },
            "{s:?}"
        );
        let text = c.stats_prometheus().unwrap();
        let want = if fetched {
            [
                "trtcache_fetches_total 1",
                "trtcache_builds_total{outcome=\"ok\"} 0",
            ]
        } else {
            [
                "trtcache_fetches_total 0",
                "trtcache_builds_total{outcome=\"ok\"} 1",
            ]
        };
        for w in want {
            assert!(text.contains(w), "{w} in {text}");
        }
    }
    assert_eq!(
        (builds, fetches),
        (1, 2),
        "one build and two fetches in total"
    );
    use trtcache_client::protocol::Origin;
    origins.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(
        origins,
        [
            Some(Origin::Built),
            Some(Origin::Remote),
            Some(Origin::Remote)
        ],
        "{logs:#?}"
    );
    assert_eq!(hits, 2, "remote_hits over the three daemons");
    let text = daemons[0].client().stats_prometheus().unwrap();
    assert!(text.contains("trtcache_remote_hits_total"), "{text}");
    let manifests = moto
        .listing()
        .iter()
        .filter(|o| o.starts_with("fleet-test/manifests/"))
        .count();
    assert_eq!(manifests, 1);
}

/// The endpoint going down in the middle of a download: the pull fails with an error, stores
/// nothing and leaves no staging files, and a local build of the same model goes on.
#[test]
fn the_endpoint_going_down_mid_download_fails_the_pull_cleanly_and_local_builds_go_on() {
    let models = tempfile::tempdir().unwrap();
    let m = models.path().join("big.onnx");
    trtcache::fixtures::write(&trtcache::fixtures::models::big_weights(4, 2048), &m).unwrap();
    let writer = Host::new();
    let signer = writer.keygen("ci-builder");
    let reader = Host::new();
    let tmp = reader.cache().join("tmp");
    // A download of ~64 MiB takes long enough to be caught in the middle; a few attempts,
    // each on a fresh server, in case one finishes before the poll sees it.
    let mut caught = None;
    let mut key = String::new();
    for _ in 0..3 {
        let mut moto = Moto::start();
        writer.write_config(&moto.endpoint(), &writer_cfg(&signer, &[&signer]));
        let built = writer.run_json(&["build", m.to_str().unwrap(), "--json"], 0);
        key = built["key"].as_str().unwrap().to_string();
        writer.run_json(&["push", &key, "--json"], 0);
        reader.write_config(&moto.endpoint(), &reader_cfg(&[&signer]));
        let _ = std::fs::remove_dir_all(reader.cache());
        let mut child = spawn_pull(&reader, &m, Stdio::piped());
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut killed = false;
        // Poll for a partly written download in a staging directory, then stop the server.
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            if partial_download(&tmp) {
                moto.child.kill().unwrap();
                let _ = moto.child.wait();
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let out = child.wait_with_output().unwrap();
        if killed {
            caught = Some(out);
            break;
        }
    }
    let out = caught.expect("never caught the pull mid-download");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the pull succeeded without its server: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The failed pull cleaned its own staging files (looked at before any other command
    // opens the cache, which would clean them too), and stored nothing.
    let leftovers: Vec<_> = std::fs::read_dir(&tmp)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let ls = reader.run_json(&["ls", "--json"], 0);
    assert_eq!(ls.as_array().unwrap().len(), 0, "{ls}");
    // A local build of the model goes on with the endpoint down.
    let b = reader.run_json(&["build", m.to_str().unwrap(), "--json"], 0);
    assert_eq!(b["key"], key);
}
