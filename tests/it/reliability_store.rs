//! Reliability of the store under damage: an artifact corrupted or truncated while the daemon
//! serves it, a damaged sled index (`trtcache verify --repair`), and a cache whose file system
//! fills up (a small tmpfs mounted over the cache directory).

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use trtcache::fixtures::{bert, models, write};
use trtcache_client::protocol::VariantState;

use crate::daemon::{artifact_session, assert_close, reference, run_encoder, Daemon};
use crate::support::{self, json, trtcache};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A key's record manifest (`CACHE/records/<key>.json`), as the store wrote it.
fn manifest(cache: &Path, key: &str) -> Option<Value> {
    let p = cache.join("records").join(format!("{key}.json"));
    std::fs::read(p)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap())
}

fn blob_dir(cache: &Path, key: &str) -> PathBuf {
    let m = manifest(cache, key).expect("manifest");
    cache
        .join("blobs")
        .join(m["artifact"]["digest"].as_str().unwrap())
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|r| r.count()).unwrap_or(0)
}

/// Every byte the daemon handed out, per file, hashed.
fn served_hashes(art: &trtcache_client::Artifact) -> Vec<String> {
    art.files
        .iter()
        .map(|f| {
            let mut f = f;
            f.rewind().unwrap();
            let mut b = Vec::new();
            f.read_to_end(&mut b).unwrap();
            sha_hex(&b)
        })
        .collect()
}

/// The served files match the record the store holds now, file by file, and differ from
/// `damaged` (the hash of the damaged file's bytes).
fn assert_served_intact(cache: &Path, art: &trtcache_client::Artifact, damaged: &str) {
    let m = manifest(cache, &art.metadata.key).expect("manifest of the served key");
    let served = served_hashes(art);
    for (f, got) in art.metadata.files.iter().zip(&served) {
        let want = m["artifact"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == f.name.as_str())
            .unwrap()["sha256"]
            .as_str()
            .unwrap();
        assert_eq!(
            got, want,
            "{} served with other bytes than recorded",
            f.name
        );
        assert_ne!(
            got, damaged,
            "{}: the damaged bytes were handed out",
            f.name
        );
    }
}

/// Overwrites one byte in the middle of `p` in place (same size); returns the new hash.
fn flip_byte(p: &Path) -> String {
    let mut b = std::fs::read(p).unwrap();
    let i = b.len() / 2;
    let mut f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.seek(std::io::SeekFrom::Start(i as u64)).unwrap();
    b[i] ^= 0x5a;
    f.write_all(&b[i..=i]).unwrap();
    f.sync_all().unwrap();
    sha_hex(&b)
}

fn truncate_half(p: &Path) -> String {
    let b = std::fs::read(p).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.set_len(b.len() as u64 / 2).unwrap();
    sha_hex(&b[..b.len() / 2])
}

/// The artifact's largest file (the weights: a flipped byte there changes outputs).
fn data_file(cache: &Path, key: &str) -> PathBuf {
    let dir = blob_dir(cache, key);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    files.pop().unwrap()
}

#[test]
fn corrupted_or_truncated_artifact_under_a_running_daemon_is_quarantined_rebuilt_and_never_served()
{
    let mut d = Daemon::new();
    let model = d.models().join("enc.onnx");
    write(&models::tiny_encoder(false), &model).unwrap();
    let want = reference(&model, 5);
    d.start();
    d.wait_settled(&["enc"]);
    let mut c = d.client();
    let first = c.acquire_model("enc").unwrap();
    let key = first.metadata.key.clone();
    assert_close(
        &run_encoder(&mut artifact_session(&first), 5),
        &want,
        "built",
    );
    drop(first);
    let cache = d.cache();

    // 1. One byte flipped in place: same size, so only the stamp (ctime/mtime) shows it; the
    // daemon re-hashes, quarantines, rebuilds, and serves the rebuilt artifact.
    let t0 = Instant::now();
    let damaged = flip_byte(&data_file(&cache, &key));
    let art = c.acquire_model("enc").unwrap();
    eprintln!("flipped byte: acquire with rebuild {:?}", t0.elapsed());
    assert_eq!(art.metadata.key, key);
    assert_served_intact(&cache, &art, &damaged);
    assert_close(
        &run_encoder(&mut artifact_session(&art), 5),
        &want,
        "after flip",
    );
    assert_eq!(count(&cache.join("quarantine")), 1, "{}", d.log());
    assert_eq!(c.stats().unwrap().builds, 2);
    drop(art);

    // 2. Truncated to half.
    let t0 = Instant::now();
    let damaged = truncate_half(&data_file(&cache, &key));
    let art = c.acquire_model("enc").unwrap();
    eprintln!("truncated: acquire with rebuild {:?}", t0.elapsed());
    assert_served_intact(&cache, &art, &damaged);
    assert_close(
        &run_encoder(&mut artifact_session(&art), 5),
        &want,
        "after truncate",
    );
    assert_eq!(count(&cache.join("quarantine")), 2);
    assert_eq!(c.stats().unwrap().builds, 3);
    drop(art);

    // 3. The blob directory removed.
    std::fs::remove_dir_all(blob_dir(&cache, &key)).unwrap();
    let art = c.acquire_model("enc").unwrap();
    assert_close(
        &run_encoder(&mut artifact_session(&art), 5),
        &want,
        "after rm",
    );
    assert_served_intact(&cache, &art, "");
    assert_eq!(c.stats().unwrap().builds, 4);
    drop(art);
    let log = d.log();
    assert!(log.contains("quarantined"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(d.stop());

    // 4. Flipped while the daemon is down: the restart re-hashes before serving.
    let damaged = flip_byte(&data_file(&cache, &key));
    d.start();
    let mut c = d.client();
    let art = c.acquire_model("enc").unwrap();
    assert_served_intact(&cache, &art, &damaged);
    assert_close(
        &run_encoder(&mut artifact_session(&art), 5),
        &want,
        "after restart",
    );
    assert_eq!(
        c.stats().unwrap().builds,
        1,
        "rebuilt once after the restart"
    );
    drop(art);
    assert!(d.stop());
    // What is left verifies clean.
    let out = trtcache(["verify", "--json", "--cache-dir", cache.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["passed"], true);
}

/// Builds `model` into `cache` with the CLI; returns the key.
fn cli_build(model: &Path, cache: &Path) -> String {
    let out = trtcache([
        "build",
        model.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "build: {}", stderr(&out));
    json(&out)["key"].as_str().unwrap().to_string()
}

fn assert_damaged_message(what: &str, out: &Output, cache: &Path) {
    let e = stderr(out);
    assert!(!out.status.success(), "{what} succeeded on a damaged index");
    assert!(!e.contains("panicked"), "{what}: {e}");
    assert!(e.contains("is damaged"), "{what}: {e}");
    assert!(e.contains("trtcache verify --repair"), "{what}: {e}");
    assert!(
        e.contains(cache.to_str().unwrap()),
        "{what} names the cache: {e}"
    );
}

/// `trtcache serve` on `config`: must exit (non-zero) by itself within 60 s.
fn serve_exits(config: &Path) -> Output {
    let mut child = Command::new(support::bin())
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("serve kept running on a damaged index");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn tree_hashes(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(tree_hashes(&p));
        } else {
            out.push((p.clone(), sha_hex(&std::fs::read(&p).unwrap())));
        }
    }
    out.sort();
    out
}

#[test]
fn damaged_index_stops_every_command_with_the_fix_and_verify_repair_rebuilds_it() {
    let d = Daemon::new(); // only for its folders and config: never started
    let (models_dir, cache) = (d.models(), d.cache());
    let enc = models_dir.join("enc.onnx");
    let lp = models_dir.join("loop.onnx");
    write(&models::tiny_encoder(false), &enc).unwrap();
    write(&models::if_loop(), &lp).unwrap();
    let k_enc = cli_build(&enc, &cache);
    let k_loop = cli_build(&lp, &cache);
    let pristine = d.root.join("pristine");
    assert!(Command::new("cp")
        .args(["-a"])
        .arg(&cache)
        .arg(&pristine)
        .status()
        .unwrap()
        .success());
    let models_before = tree_hashes(&models_dir);
    let dir = cache.to_str().unwrap();

    type Damage = fn(&Path);
    let damages: [(&str, Damage); 3] = [
        ("truncated", |db| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(db.join("db"))
                .unwrap()
                .set_len(100)
                .unwrap()
        }),
        ("overwritten", |db| {
            let p = db.join("db");
            let mut b = std::fs::read(&p).unwrap();
            for x in b.iter_mut().skip(40).take(64) {
                *x ^= 0xff;
            }
            std::fs::write(&p, b).unwrap();
        }),
        ("deleted", |db| std::fs::remove_dir_all(db).unwrap()),
    ];
    for (what, damage) in damages {
        std::fs::remove_dir_all(&cache).unwrap();
        assert!(Command::new("cp")
            .args(["-a"])
            .arg(&pristine)
            .arg(&cache)
            .status()
            .unwrap()
            .success());
        damage(&cache.join("db"));
        let blobs = count(&cache.join("blobs"));
        assert_eq!(blobs, 2);
        let t0 = Instant::now();
        assert_damaged_message(
            &format!("{what}: ls"),
            &trtcache(["ls", "--cache-dir", dir]),
            &cache,
        );
        assert_damaged_message(
            &format!("{what}: build"),
            &trtcache(["build", enc.to_str().unwrap(), "--cache-dir", dir]),
            &cache,
        );
        assert_damaged_message(&format!("{what}: serve"), &serve_exits(&d.config()), &cache);
        eprintln!("{what}: three refusals in {:?}", t0.elapsed());
        assert_eq!(
            count(&cache.join("blobs")),
            blobs,
            "{what}: nothing deleted"
        );

        let t0 = Instant::now();
        let out = trtcache(["verify", "--repair", "--json", "--cache-dir", dir]);
        eprintln!("{what}: repair {:?}", t0.elapsed());
        assert!(out.status.success(), "{what}: repair: {}", stderr(&out));
        let rep = json(&out);
        assert_eq!(rep["repair"]["damaged"], true, "{rep}");
        let mut recovered: Vec<&str> = rep["repair"]["recovered"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect();
        recovered.sort();
        let mut keys = vec![k_enc.as_str(), k_loop.as_str()];
        keys.sort();
        assert_eq!(recovered, keys, "{rep}");
        assert_eq!(rep["passed"], true);
        let moved = PathBuf::from(rep["repair"]["moved_to"].as_str().unwrap_or_default());
        assert!(
            what == "deleted" || moved.starts_with(&cache) && moved.exists(),
            "{what}: the damaged index is kept: {rep}"
        );
        // The cache works again, from the same artifacts: a hit, no rebuild.
        let ls = json(&trtcache(["ls", "--json", "--cache-dir", dir]));
        assert_eq!(ls.as_array().unwrap().len(), 2, "{ls}");
        let out = trtcache(["build", enc.to_str().unwrap(), "--cache-dir", dir, "--json"]);
        assert_eq!(json(&out)["source"], "cached", "{what}: {}", stderr(&out));
        // A second repair has nothing to do.
        let again = json(&trtcache([
            "verify",
            "--repair",
            "--json",
            "--cache-dir",
            dir,
        ]));
        assert_eq!(again["repair"]["damaged"], false, "{again}");
    }

    // Damaged index and one damaged artifact: that entry is dropped (and rebuilt on the next
    // build), the other recovered; the damaged files are kept in quarantine/.
    std::fs::remove_dir_all(&cache).unwrap();
    assert!(Command::new("cp")
        .args(["-a"])
        .arg(&pristine)
        .arg(&cache)
        .status()
        .unwrap()
        .success());
    flip_byte(&data_file(&cache, &k_enc));
    std::fs::remove_dir_all(cache.join("db")).unwrap();
    let out = trtcache(["verify", "--repair", "--json", "--cache-dir", dir]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rep = json(&out);
    assert_eq!(
        rep["repair"]["recovered"],
        serde_json::json!([k_loop]),
        "{rep}"
    );
    assert_eq!(rep["repair"]["dropped"][0][0], k_enc.as_str(), "{rep}");
    assert_eq!(count(&cache.join("quarantine")), 1, "{rep}");
    let out = trtcache(["build", enc.to_str().unwrap(), "--cache-dir", dir, "--json"]);
    assert_eq!(json(&out)["source"], "built", "{}", stderr(&out));
    assert_eq!(tree_hashes(&models_dir), models_before, "models untouched");
}

/// A tmpfs mounted over a directory for the test's life (lazily unmounted on drop).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount: {}", stderr(&out).trim()));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    /// Fills the file system with `filler` until `leave` bytes are free.
    fn fill(&self, leave: u64) -> PathBuf {
        let p = self.0.join("filler");
        let free = trtcache::cache::free_bytes(&self.0).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .unwrap();
        let chunk = vec![0xa5u8; 64 << 10];
        let mut left = free.saturating_sub(leave);
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            match f.write_all(&chunk[..n]) {
                Ok(()) => left -= n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling: {e}"),
            }
        }
        f.sync_all().unwrap();
        eprintln!(
            "filled {}: {} bytes free",
            self.0.display(),
            trtcache::cache::free_bytes(&self.0).unwrap()
        );
        p
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A tmpfs over `dir`, or `None` with the reason printed (mounting needs root or a user
/// namespace; without it these tests cannot make a file system fill up).
fn tmpfs_or_skip(dir: &Path, size: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(dir, size) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("SKIPPED: cannot mount a tmpfs over {} ({e})", dir.display());
            None
        }
    }
}

fn no_partial_entry(cache: &Path, key: &str, blobs: usize) {
    let tmp: Vec<_> = std::fs::read_dir(cache.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(tmp.is_empty(), "staging leftovers: {tmp:?}");
    assert!(
        manifest(cache, key).is_none(),
        "a record for {key} was kept"
    );
    assert_eq!(
        count(&cache.join("blobs")),
        blobs,
        "a partial blob was kept"
    );
}

#[test]
fn a_full_disk_fails_the_build_clearly_keeps_serving_and_builds_once_space_is_back() {
    let mut d = Daemon::new();
    let Some(fs) = tmpfs_or_skip(&d.cache(), "8m") else {
        return;
    };
    let cache = d.cache();
    let a = d.models().join("a.onnx");
    write(&models::tiny_encoder(false), &a).unwrap();
    let want_a = reference(&a, 3);
    d.start();
    d.wait_settled(&["a"]);
    let mut c = d.client();
    let blobs = count(&cache.join("blobs"));
    let filler = fs.fill(4 << 10);

    // A new model while the disk is full: its build fails with the reason and the place.
    let b = d.models().join("b.onnx");
    write(&models::tiny_encoder(true), &b).unwrap();
    let t0 = Instant::now();
    let (key_b, reason) = loop {
        let st = c.status("b").ok();
        if let Some(v) = st.as_ref().and_then(|s| s.variants.first()) {
            if v.state == VariantState::Failed {
                break (v.key.clone().unwrap(), v.reason.clone().unwrap());
            }
            assert_ne!(v.state, VariantState::Ready, "built on a full disk?");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "b never failed: {st:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("disk full reported after {:?}: {reason}", t0.elapsed());
    assert!(reason.contains("no space left"), "{reason}");
    assert!(
        reason.contains(cache.to_str().unwrap()),
        "names where: {reason}"
    );
    no_partial_entry(&cache, &key_b, blobs);

    // The daemon keeps serving what it has.
    let art = c.acquire_model("a").unwrap();
    assert_close(&run_encoder(&mut artifact_session(&art), 3), &want_a, "a");
    drop(art);
    // A client asking for b while the disk is still full gets the same clear error, not a
    // memoised one: the build was tried again.
    let failures_before = c.stats().unwrap().failures;
    let e = c.acquire_model("b").unwrap_err();
    assert!(e.to_string().contains("no space left"), "{e}");
    assert!(c.stats().unwrap().failures > failures_before, "retried");
    no_partial_entry(&cache, &key_b, blobs);

    // Space back: the next request builds it.
    std::fs::remove_file(&filler).unwrap();
    let t0 = Instant::now();
    let art = c.acquire_model("b").unwrap();
    eprintln!("b built after space came back in {:?}", t0.elapsed());
    assert_eq!(art.metadata.key, key_b);
    let mut s = artifact_session(&art);
    let x: Vec<f32> = run_encoder(&mut s, 16);
    assert_close(&x, &reference(&b, 16), "b");
    drop(art);
    let st = c.status("b").unwrap();
    assert_eq!(st.variants[0].state, VariantState::Ready, "{st:?}");
    let log = d.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(d.stop());
    let out = trtcache(["verify", "--json", "--cache-dir", cache.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["checked"], 2);
    drop(fs);
}

#[test]
fn cli_build_into_a_full_cache_fails_clearly_and_stores_nothing() {
    let root = tempfile::tempdir().unwrap();
    let cache = root.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let Some(fs) = tmpfs_or_skip(&cache, "8m") else {
        return;
    };
    let dir = cache.to_str().unwrap();
    let a = root.path().join("a.onnx");
    write(&models::tiny_encoder(false), &a).unwrap();
    cli_build(&a, &cache);
    // ~1.1 MB of weights: more than is left, while the index opens fine.
    let b = root.path().join("b.onnx");
    let cfg = bert::BertConfig {
        vocab: 4096,
        ..bert::BertConfig::tiny()
    };
    write(&bert::bert(cfg), &b).unwrap();
    let key_b = json(&trtcache([
        "key",
        b.to_str().unwrap(),
        "--cache-dir",
        dir,
        "--json",
    ]))["key"]
        .as_str()
        .unwrap()
        .to_string();
    let blobs = count(&cache.join("blobs"));

    // 1. Room to open the index, not for the artifact: the backend's write fails.
    // 2. Almost nothing left: sled may not even open the index (whether it needs a new
    //    segment depends on its log), else the backend's write fails.
    for (what, leave, places) in [
        ("artifact write", 512u64 << 10, &["tmp"][..]),
        ("almost nothing left", 4 << 10, &["db", "tmp"][..]),
    ] {
        let filler = fs.fill(leave);
        let out = trtcache(["build", b.to_str().unwrap(), "--cache-dir", dir]);
        let e = stderr(&out);
        let first = e
            .lines()
            .find(|l| l.starts_with("error"))
            .unwrap_or_default();
        eprintln!("{what}: {first}");
        assert!(!out.status.success(), "{what}: built on a full disk");
        assert!(!e.contains("panicked"), "{what}: {e}");
        let want: Vec<String> = places
            .iter()
            .map(|p| format!("no space left on the file system holding {dir}/{p}"))
            .collect();
        assert!(
            want.iter().any(|w| e.contains(w.as_str())),
            "{what}: wanted one of {want:?}: {e}"
        );
        assert!(e.contains("nothing was stored"), "{what}: {e}");
        std::fs::remove_file(&filler).unwrap();
        no_partial_entry(&cache, &key_b, blobs);
        let ls = json(&trtcache(["ls", "--json", "--cache-dir", dir]));
        assert_eq!(ls.as_array().unwrap().len(), 1, "{what}: {ls}");
    }
    // Space back: it builds.
    assert_eq!(cli_build(&b, &cache), key_b);
    drop(fs);
}
