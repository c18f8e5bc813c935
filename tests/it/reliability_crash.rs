//! Crash safety: the real daemon SIGKILLed at random moments while it plans, builds,
//! validates and stores artifacts, restarted each time; after every kill the cache must hold
//! no corrupt, half-written or orphaned entry and what it serves must still match the original
//! models. And consumers SIGKILLed mid-acquire must cost the daemon nothing (no leaked
//! descriptor or connection slot).
//!
//! Random kills spread over a start and its builds; aimed kills land in the store's short
//! windows (blob staged, blob renamed but not yet indexed) and in builds. The delays come
//! from a seeded generator; the seed is printed and `TRTCACHE_CRASH_SEED` replays the delays
//! (where they land still depends on the machine's timing).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, random_f32, tensor_f32, write, write_external};
use trtcache_client::protocol::VariantState;

use crate::daemon::{artifact_session, assert_close, reference, run_encoder, Daemon};
use crate::support;
use trtcache::rng::SplitMix64;

fn seed() -> u64 {
    std::env::var("TRTCACHE_CRASH_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// Writes `path` elsewhere and renames it in, so the daemon never sees a half-written model
/// (partial model files are the model-folder race test's subject, not this one's).
fn place(d: &Daemon, rel: &str, write_to: impl FnOnce(&Path)) {
    let stage = d
        .root
        .join("outside")
        .join(format!("stage-{}", rel.replace('/', "_")));
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).unwrap();
    let name = Path::new(rel).file_name().unwrap();
    write_to(&stage.join(name));
    let dst = d.models().join(rel);
    if rel.contains('/') {
        // A model folder (graph + external data): replace the whole folder.
        let dir = dst.parent().unwrap();
        let old = d.root.join("outside").join("old");
        let _ = std::fs::remove_dir_all(&old);
        if dir.exists() {
            std::fs::rename(dir, &old).unwrap();
        }
        std::fs::rename(&stage, dir).unwrap();
        let _ = std::fs::remove_dir_all(&old);
    } else {
        std::fs::rename(stage.join(name), &dst).unwrap();
        std::fs::remove_dir_all(&stage).unwrap();
    }
}

/// The encoders compared against their originals, and where each one's file is.
const ENCODERS: [(&str, &str); 2] = [("enc", "enc.onnx"), ("ext", "ext/model.onnx")];
const NAMES: [&str; 3] = ["enc", "ext", "wide"];

/// New weights for every model, so each round has builds and cache writes to do: a tiny
/// encoder, one with external data (a two-file artifact) and a wider one whose artifact takes
/// longer to hash, copy and fsync.
fn write_models(d: &Daemon, gen: u64) {
    let mut enc = models::tiny_encoder(false);
    enc.graph.as_mut().unwrap().initializer[3] =
        tensor_f32("fc.bias", &[64], &random_f32(1000 + gen, 64, 0.5));
    place(d, "enc.onnx", |p| write(&enc, p).unwrap());
    let mut ext = models::tiny_encoder(false);
    ext.graph.as_mut().unwrap().initializer[2] = tensor_f32(
        "fc.weight",
        &[64, 64],
        &random_f32(2000 + gen, 64 * 64, 0.125),
    );
    place(d, "ext/model.onnx", |p| {
        write_external(&ext, p, "model.onnx.data", 128).unwrap()
    });
    let mut wide = models::big_weights(3, 512);
    wide.graph.as_mut().unwrap().initializer[0] =
        tensor_f32("w0", &[512, 512], &random_f32(3000 + gen, 512 * 512, 0.02));
    place(d, "wide.onnx", |p| write(&wide, p).unwrap());
}

fn spawn_daemon(d: &Daemon) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.root.join("daemon.log"))
        .unwrap();
    Command::new(support::bin())
        .args(["-v", "serve", "--config"])
        .arg(d.config())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawning trtcache serve")
}

/// Waits until the daemon answers on its socket (a stale socket file from a killed one
/// refuses connections until the new daemon replaces it).
fn wait_up(d: &Daemon, child: &mut Child) {
    let t = Instant::now();
    while trtcache_client::Client::connect(d.socket()).is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "daemon exited: {}",
            d.log()
        );
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "daemon not up: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigkill(child: &mut Child) {
    // SAFETY: signalling our own child, which has not been reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
}

/// What a kill left behind, looked at before anything reopens the cache.
struct Scene {
    /// Staging dirs in `tmp/` (`build-*` while a build runs, `commit-*` while a blob is
    /// written) and whether each had files in it.
    staged: Vec<(String, bool)>,
    /// The daemon's log since this start.
    log: String,
}

fn scene(d: &Daemon, log_from: usize) -> Scene {
    let staged = d
        .tmp_files()
        .iter()
        .map(|p| {
            let full = std::fs::read_dir(p)
                .map(|mut r| r.next().is_some())
                .unwrap_or(false);
            (p.file_name().unwrap().to_string_lossy().into_owned(), full)
        })
        .collect();
    let log = d.log();
    Scene {
        staged,
        log: log[log_from.min(log.len())..].to_string(),
    }
}

/// Which phase the kill interrupted, from what it left behind (`orphans`: blobs the next open
/// found unindexed) and the daemon's last lifecycle line.
fn phase(s: &Scene, orphans: usize) -> String {
    phase_name(s, orphans).to_string()
}

fn phase_name(s: &Scene, orphans: usize) -> &'static str {
    if orphans > 0 {
        return "blob renamed, not yet indexed";
    }
    if s.staged.iter().any(|(n, _)| n.starts_with("commit-")) {
        return "blob write";
    }
    if let Some((_, full)) = s.staged.iter().find(|(n, _)| n.starts_with("build-")) {
        return if *full {
            "validation/store"
        } else {
            "build (optimizing)"
        };
    }
    let at = |pat: &str| s.log.rfind(pat);
    match (at(" ready socket="), at("build started"), at("build ready")) {
        (None, _, _) => "startup (open, ORT load, scan)",
        (Some(_), Some(b), r) if r.is_none_or(|r| r < b) => "planning (key, staging)",
        (Some(_), _, Some(_)) => "between builds or idle",
        (Some(_), _, None) => "planning (key, staging)",
    }
}

fn record_phase(phases: &mut BTreeMap<String, usize>, round: usize, when: &str, ph: String) {
    eprintln!("round {round}: killed {when}, in {ph}");
    *phases.entry(ph).or_default() += 1;
}

/// The daemon's `cleaned the cache at open` line: (temp, records dropped, orphans).
fn daemon_cleaned(log: &str) -> Option<(usize, usize, usize)> {
    let line = log
        .lines()
        .find(|l| l.contains("cleaned the cache at open"))?;
    let field = |name: &str| -> usize {
        line.split(&format!("{name}="))
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some((
        field("temp_removed"),
        field("records_dropped"),
        field("orphans_removed"),
    ))
}

/// Polls `tmp/` until a staging directory named `prefix*` appears (`build-` while a build
/// and its validation run, `commit-` while a blob is written), and with `gone` until it is
/// gone again (a commit renamed into `blobs/`). Gives up after `limit_ms`; returns whether
/// it saw one. `left`: what an unchecked crash left there before this start (not this
/// daemon's).
fn wait_for_staging(
    d: &Daemon,
    left: &BTreeSet<String>,
    child: &mut Child,
    limit_ms: u64,
    prefix: &str,
    gone: bool,
) -> bool {
    let tmp = d.cache().join("tmp");
    let staged = || {
        std::fs::read_dir(&tmp)
            .map(|r| {
                r.flatten().any(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with(prefix) && !left.contains(&n)
                })
            })
            .unwrap_or(false)
    };
    let t = Instant::now();
    let limit = Duration::from_millis(limit_ms);
    while !staged() {
        if t.elapsed() > limit || child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    if gone {
        while staged() && t.elapsed() < limit {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    true
}

/// Parses `trtcache: cleaned DIR: A temp leftovers, B records without files, C orphan blobs`.
fn cleaned(stderr: &str) -> (usize, usize, usize) {
    let Some(line) = stderr.lines().find(|l| l.contains("trtcache: cleaned")) else {
        return (0, 0, 0);
    };
    let nums: Vec<usize> = line
        .rsplit(": ")
        .next()
        .unwrap()
        .split(", ")
        .map(|part| part.split(' ').next().unwrap().parse().unwrap())
        .collect();
    (nums[0], nums[1], nums[2])
}

/// The cache after a crash, as `verify` (the first open after it) and the folder itself see
/// it. Returns what the open cleaned and the keys of the records it holds.
fn check_cache(d: &Daemon, round: usize) -> ((usize, usize, usize), BTreeSet<String>) {
    let cache = d.cache();
    let out = support::trtcache([
        "verify".as_ref(),
        "--json".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "round {round}: verify failed: {stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v = support::json(&out);
    assert_eq!(v["passed"], true, "round {round}: {v}");
    assert_eq!(
        v["quarantined"].as_array().unwrap().len(),
        0,
        "round {round}: {v}"
    );
    let c = cleaned(&stderr);
    // A blob is renamed into place before its record is indexed, so a kill can leave temp
    // files and an unnamed blob (both cleaned at open); a record whose files are gone would
    // mean it was indexed too early.
    assert_eq!(c.1, 0, "round {round}: records without files: {stderr}");

    // The folder itself, after that open: nothing staged, nothing quarantined, exactly the
    // blobs the records name, each complete.
    assert!(
        d.tmp_files().is_empty(),
        "round {round}: tmp leftovers after open: {:?}",
        d.tmp_files()
    );
    let quarantine: Vec<_> = std::fs::read_dir(cache.join("quarantine"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(quarantine.is_empty(), "round {round}: {quarantine:?}");
    let allowed: BTreeSet<&str> = [
        "CACHEDIR.TAG",
        "lock",
        "db",
        "blobs",
        "tmp",
        "quarantine",
        "records",
        trtcache::cache::DIGEST_MEMO,
        trtcache::cache::DIGEST_MEMO_JOURNAL,
        "trtcache.sock",
        // the ready index next to the socket (emptied and rewritten at every start)
        "trtcache.sock.ready",
    ]
    .into();
    for e in std::fs::read_dir(&cache).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        assert!(
            allowed.contains(n.as_str()),
            "round {round}: stray file in the cache folder: {n}"
        );
    }
    let memo = cache.join(trtcache::cache::DIGEST_MEMO);
    if memo.exists() {
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(&memo).unwrap())
            .unwrap_or_else(|e| panic!("round {round}: digest memo is not JSON: {e}"));
    }
    let ls = support::trtcache([
        "ls".as_ref(),
        "--json".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
    ]);
    assert!(
        ls.status.success(),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    let records = support::json(&ls);
    let mut named: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    let mut keys = BTreeSet::new();
    for r in records.as_array().unwrap() {
        keys.insert(r["key"].as_str().unwrap().to_string());
        let status = &r["status"];
        assert!(
            status["state"] == "ready",
            "round {round}: a crash left a record that is not ready: {r}"
        );
        let a = &r["artifact"];
        let files = a["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["name"].as_str().unwrap().to_string(),
                    f["bytes"].as_u64().unwrap(),
                )
            })
            .collect();
        named.insert(a["digest"].as_str().unwrap().to_string(), files);
    }
    // Every record has its manifest (what `verify --repair` rebuilds a damaged index from),
    // and no manifest (or half-written one) outlives its record.
    let manifests: BTreeSet<String> = std::fs::read_dir(cache.join("records"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        manifests,
        keys.iter()
            .map(|k| format!("{k}.json"))
            .collect::<BTreeSet<_>>(),
        "round {round}: record manifests vs records"
    );
    let on_disk: BTreeSet<String> = std::fs::read_dir(cache.join("blobs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        on_disk,
        named.keys().cloned().collect::<BTreeSet<_>>(),
        "round {round}: blobs on disk vs blobs the records name"
    );
    for (digest, files) in &named {
        let dir = cache.join("blobs").join(digest);
        let mut present: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        present.sort();
        let mut want: Vec<String> = files.iter().map(|f| f.0.clone()).collect();
        want.sort();
        assert_eq!(present, want, "round {round}: blob {digest}");
    }
    (c, keys)
}

/// Keys the daemon logged as built and stored (`build ready ... key=K`): each must survive
/// the kill.
fn acknowledged(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("build ready"))
        .filter_map(|l| l.split("key=").nth(1))
        .map(|k| k.split_whitespace().next().unwrap().to_string())
        .collect()
}

/// Waits until the daemon serves every model ready, then compares the encoders' artifacts
/// with their original files.
fn check_serving(d: &Daemon, round: usize) {
    let list = d.wait_settled(&NAMES);
    for n in NAMES {
        let m = list.iter().find(|m| m.name == n).unwrap();
        assert!(
            m.variants.iter().all(|v| v.state == VariantState::Ready),
            "round {round}: {n} not ready: {m:?}\n{}",
            d.log()
        );
    }
    let mut c = d.client();
    for (name, rel) in ENCODERS {
        let art = c.acquire_model(name).unwrap();
        assert!(art.metadata.validation.passed);
        let mut s = artifact_session(&art);
        assert_close(
            &run_encoder(&mut s, 7),
            &reference(&d.models().join(rel), 7),
            &format!("round {round}: {name}"),
        );
    }
    let wide = c.acquire_model("wide").unwrap();
    assert!(!wide.files.is_empty());
}

#[test]
fn thirty_sigkills_during_builds_and_cache_writes_leave_a_consistent_cache() {
    const ROUNDS: usize = 30;
    let seed = seed();
    eprintln!("crash test seed {seed} (TRTCACHE_CRASH_SEED={seed} replays it)");
    let mut rng = SplitMix64(seed);
    let mut d = Daemon::new();
    // A size limit of about three rounds' artifacts (the wide one is ~6 MB): later rounds
    // evict (gc after each put and at open), so kills also land in evictions, while the last
    // two rounds' builds always fit.
    let mut cfg = std::fs::read_to_string(d.config()).unwrap();
    assert!(
        cfg.trim_end()
            .ends_with("rescan_secs = 2\nmax_frame_bytes = 65536"),
        "{cfg}"
    );
    cfg.push_str("cache_size_bytes = 25165824\n");
    std::fs::write(d.config(), cfg).unwrap();
    let t_all = Instant::now();

    // Calibration: how long a start plus all three builds takes here, to spread the kills
    // over that span. It is also the first check that the models build and serve.
    write_models(&d, 0);
    let t0 = Instant::now();
    let mut child = spawn_daemon(&d);
    d.child = None;
    wait_up(&d, &mut child);
    d.wait_settled(&NAMES);
    let settle = t0.elapsed();
    check_serving(&d, 0);
    sigkill(&mut child);
    let _ = check_cache(&d, 0);
    eprintln!("calibration: start + 3 builds took {settle:?}");
    let span = (settle.as_millis() as u64 * 5 / 4).max(200);

    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    let mut cleaned_total = (0, 0, 0);
    let mut acked_total = 0;
    let mut acked: std::collections::VecDeque<Vec<String>> = Default::default();
    let mut pending: Option<(usize, Scene, String)> = None;
    let (mut waiter_errors, mut waiter_served) = (Vec::new(), 0);
    for round in 1..=ROUNDS {
        // New content most rounds; some rounds restart on the same content, so builds that a
        // kill interrupted are picked up again.
        if round % 3 != 0 {
            write_models(&d, round as u64);
        }
        let log_from = d.log().len();
        let left: BTreeSet<String> = d
            .tmp_files()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let mut child = spawn_daemon(&d);
        // A consumer waiting on the wide model's build when the daemon dies must get an
        // answer (an error, or the artifact if it was quick), not hang.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiter = (round % 2 == 1).then(|| {
            let (socket, stop) = (d.socket(), stop.clone());
            std::thread::spawn(move || loop {
                if let Ok(mut c) = trtcache_client::Client::connect(&socket) {
                    return Some(c.acquire_model("wide").map(|_| ()));
                }
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(5));
            })
        });
        let when = match round % 6 {
            0 => {
                // Restart to completion: the models end up ready and serve the originals'
                // outputs, then the kill lands on an idle daemon.
                wait_up(&d, &mut child);
                check_serving(&d, round);
                "once serving".to_string()
            }
            // Aimed at the short windows random delays rarely hit: while a blob is staged
            // (links, fsyncs, rename), right after its rename (before or while its record
            // is indexed), and (round 5 mod 6) while a build or its validation runs.
            1 | 4 => {
                let extra = rng.below(3);
                let seen = wait_for_staging(&d, &left, &mut child, span * 3, "commit-", false);
                std::thread::sleep(Duration::from_millis(extra));
                format!(
                    "{extra} ms after a commit {}",
                    if seen { "began" } else { "(none seen)" }
                )
            }
            2 => {
                let seen = wait_for_staging(&d, &left, &mut child, span * 3, "commit-", true);
                format!(
                    "as a commit {}",
                    if seen { "renamed" } else { "(none seen)" }
                )
            }
            5 => {
                let extra = rng.below(40);
                let seen = wait_for_staging(&d, &left, &mut child, span * 3, "build-", false);
                std::thread::sleep(Duration::from_millis(extra));
                format!(
                    "{extra} ms after a build {}",
                    if seen { "began" } else { "(none seen)" }
                )
            }
            _ => {
                let delay = rng.below(span);
                std::thread::sleep(Duration::from_millis(delay));
                format!("{delay} ms after start")
            }
        };
        if child.try_wait().unwrap().is_some() {
            panic!("round {round}: daemon exited by itself: {}", d.log());
        }
        sigkill(&mut child);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(w) = waiter {
            let t = Instant::now();
            while !w.is_finished() {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "round {round}: a consumer hangs on a killed daemon"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            match w.join().unwrap() {
                Some(Err(e)) => waiter_errors.push(e.to_string()),
                Some(Ok(())) => waiter_served += 1,
                None => {}
            }
        }
        let sc = scene(&d, log_from);
        // The daemon's own open after an unchecked crash (below) cleans what it left: never
        // by dropping a record whose files were missing.
        let daemon_open = daemon_cleaned(&sc.log);
        if let Some((_, dropped, orphans)) = daemon_open {
            assert_eq!(
                dropped, 0,
                "round {round}: daemon open dropped records:\n{}",
                sc.log
            );
            if let Some((r, scene, when)) = pending.take() {
                record_phase(&mut phases, r, &when, phase(&scene, orphans));
            }
        }
        // Keys reported built by this start and the one before; older ones may have been
        // evicted since (the cache has a size limit).
        acked.push_back(acknowledged(&sc.log));
        if acked.len() > 2 {
            acked.pop_front();
        }
        acked_total += acked.back().unwrap().len();
        if round % 5 == 2 {
            // Some crashes are not looked at: the next daemon opens the cache exactly as the
            // kill left it, as it would under systemd's restart.
            if let Some((r, scene, when)) = pending.replace((round, sc, when)) {
                record_phase(
                    &mut phases,
                    r,
                    &when,
                    phase(&scene, 0) + " (recovered unseen)",
                );
            }
            continue;
        }
        let (c, keys) = check_cache(&d, round);
        // Every build the daemon reported done is still in the cache: a reported build
        // survives the kill.
        for k in acked.iter().flatten() {
            assert!(
                keys.contains(k),
                "round {round}: {k} was reported built before a kill but is not in the cache"
            );
        }
        if let Some((r, scene, when)) = pending.take() {
            // The daemon never opened it (killed during startup): verify did.
            record_phase(&mut phases, r, &when, phase(&scene, c.2));
        }
        record_phase(&mut phases, round, &when, phase(&sc, c.2));
        eprintln!(
            "round {round}: open cleaned {} temp, {} orphan blobs",
            c.0, c.2
        );
        cleaned_total.0 += c.0;
        cleaned_total.2 += c.2;
    }

    if let Some((r, scene, when)) = pending.take() {
        record_phase(
            &mut phases,
            r,
            &when,
            phase(&scene, 0) + " (recovered unseen)",
        );
    }
    // What the daemons complained about across the kills (printed, for the record).
    let log = d.log();
    let mut complaints: BTreeMap<String, usize> = BTreeMap::new();
    for l in log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
    {
        // Drop the timestamp and key-like fields so repeats group.
        let msg: String = l
            .split_whitespace()
            .skip(1)
            .filter(|w| !w.starts_with("key=") && !w.contains("/tmp/"))
            .collect::<Vec<_>>()
            .join(" ");
        *complaints.entry(msg).or_default() += 1;
    }
    eprintln!("daemon warnings and errors across the kills: {complaints:#?}");
    // The last restart: everything ready, outputs match, a clean stop, a clean cache.
    d.start();
    check_serving(&d, ROUNDS + 1);
    assert!(d.stop(), "clean exit: {}", d.log());
    let (c, keys) = check_cache(&d, ROUNDS + 1);
    eprintln!(
        "consumers waiting when the daemon died: {waiter_served} served before, {} got errors {:?}",
        waiter_errors.len(),
        waiter_errors.iter().collect::<BTreeSet<_>>()
    );
    let blob_bytes: u64 = std::fs::read_dir(d.cache().join("blobs"))
        .unwrap()
        .flatten()
        .flat_map(|b| std::fs::read_dir(b.path()).unwrap().flatten())
        .map(|f| f.metadata().unwrap().len())
        .sum();
    eprintln!(
        "{} entries ({blob_bytes} bytes of blobs) left in the cache; {acked_total} builds \
         reported in all (the size limit evicted the rest)",
        keys.len(),
    );
    assert_eq!((c.0, c.2), (0, 0), "a clean stop leaves nothing to clean");
    eprintln!(
        "{ROUNDS} kills in {:?}; phases {phases:?}; {acked_total} builds reported before a kill \
         all kept; opens cleaned {} temp leftovers and {} orphan blobs",
        t_all.elapsed(),
        cleaned_total.0,
        cleaned_total.2
    );
}

/// Descriptors the daemon has open.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn fd_list(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .map(|e| {
            std::fs::read_link(e.path())
                .map(|l| l.display().to_string())
                .unwrap_or_default()
        })
        .collect()
}

/// A raw consumer: hello, then acquires in a loop in the given manner, printing `go` once
/// connected; the test SIGKILLs it at a random moment.
const CONSUMER: &str = r#"
import socket, struct, sys, json, array
path, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
def send(obj):
    b = json.dumps(obj).encode()
    s.sendall(struct.pack(">I", len(b)) + b)
def recv():
    fds = array.array("i")
    hdr, anc, _, _ = s.recvmsg(4, socket.CMSG_SPACE(64 * fds.itemsize))
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    n = struct.unpack(">I", hdr)[0]
    body = b""
    while len(body) < n:
        chunk, anc, _, _ = s.recvmsg(n - len(body), socket.CMSG_SPACE(64 * fds.itemsize))
        for level, typ, data in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
        body += chunk
    return json.loads(body), list(fds)
send({"op": "hello", "version": 1})
recv()
print("go", flush=True)
acq = {"op": "acquire", "model": model, "dir_fd": True}
if mode == "unread":
    # Asks and never reads: the answer and its descriptors sit in the socket when it dies.
    while True:
        send(acq)
        import time; time.sleep(0.001)
elif mode == "half":
    # Dies with half a request written.
    b = json.dumps(acq).encode()
    s.sendall(struct.pack(">I", len(b)) + b[: len(b) // 2])
    import time; time.sleep(60)
else:
    # Acquires (a build to wait for, or a hit) as fast as it can, holding the descriptors.
    held = []
    while True:
        send(acq)
        reply, fds = recv()
        assert reply.get("kind") != "error", reply
        if not held:
            print("got", len(fds), flush=True)
        held.append(fds)
"#;

#[test]
fn consumers_killed_mid_acquire_leak_nothing_in_the_daemon() {
    let seed = seed();
    eprintln!("consumer-kill seed {seed} (TRTCACHE_CRASH_SEED={seed} replays it)");
    let mut rng = SplitMix64(seed);
    let mut d = Daemon::new();
    write_models(&d, 0);
    d.start();
    check_serving(&d, 0);
    let pid = d.child.as_ref().unwrap().id();
    let mut c = d.client();
    // Only this client: the ones `check_serving` dropped may still be closing, and a
    // baseline that counts them is never reached again.
    let base_conns = d.wait_connections(&mut c, 1);
    // The fewest over a moment: a rescan holds a directory open now and then.
    let base_fds = (0..10)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            fd_count(pid)
        })
        .min()
        .unwrap();
    eprintln!("baseline: {base_fds} daemon fds, {base_conns} connections");

    const KILLS: usize = 24;
    let modes = ["loop", "unread", "half", "building"];
    let mut peak_fds = base_fds;
    let mut killed_waiting = 0;
    let hits0 = c.stats().unwrap().hits;
    let t0 = Instant::now();
    for i in 0..KILLS {
        let mode = modes[i % modes.len()];
        let model = if mode == "building" {
            // New content: the consumer's acquire waits for this build when it dies. Its
            // acquire goes out once the daemon has seen the change.
            let wide = |c: &mut trtcache_client::Client| {
                let l = c.list().unwrap();
                let m = l.into_iter().find(|m| m.name == "wide").unwrap();
                (m.variants[0].state, m.variants[0].key.clone())
            };
            let (_, old_key) = wide(&mut c);
            write_models(&d, 100 + i as u64);
            let t = Instant::now();
            while matches!(wide(&mut c), (VariantState::Ready, k) if k == old_key) {
                assert!(t.elapsed() < Duration::from_secs(30), "change not seen");
                std::thread::sleep(Duration::from_millis(5));
            }
            "wide"
        } else {
            "enc"
        };
        let mut p = Command::new(support::python())
            .arg("-c")
            .arg(CONSUMER)
            .arg(d.socket())
            .arg(model)
            .arg(if mode == "building" { "loop" } else { mode })
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(p.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "go", "consumer {i} did not connect");
        if mode == "loop" {
            // It holds descriptors from at least one answered acquire when it dies.
            line.clear();
            out.read_line(&mut line).unwrap();
            assert!(line.starts_with("got "), "consumer {i}: {line:?}");
        }
        // A build takes ~0.1 s here: a waiting consumer dies within it.
        let most = if mode == "building" { 30 } else { 150 };
        std::thread::sleep(Duration::from_millis(rng.below(most)));
        peak_fds = peak_fds.max(fd_count(pid));
        if mode == "building"
            && c.list().unwrap().iter().any(|m| {
                m.name == "wide" && m.variants.iter().any(|v| v.state != VariantState::Ready)
            })
        {
            killed_waiting += 1;
        }
        sigkill(&mut p);
        // Everyone else is still served, at once.
        let t = Instant::now();
        let art = c.acquire_model("enc").unwrap();
        assert!(!art.files.is_empty());
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "acquire took {:?} after consumer {i} ({mode}) died",
            t.elapsed()
        );
    }
    eprintln!(
        "{KILLS} consumers killed in {:?} ({killed_waiting} while their acquire waited for a build); \
         {} acquires answered meanwhile; peak {peak_fds} daemon fds",
        t0.elapsed(),
        c.stats().unwrap().hits - hits0
    );
    // Once the builds the dead consumers waited for are done, the daemon is back where it
    // started: same connections, same descriptors.
    d.wait_settled(&NAMES);
    let t = Instant::now();
    loop {
        let conns = c.stats().unwrap().connections;
        let fds = fd_count(pid);
        if conns == base_conns && fds <= base_fds {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "daemon holds {fds} fds (baseline {base_fds}) and {conns} connections (baseline {base_conns}): {:?}",
            fd_list(pid)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(c);
    check_serving(&d, 1);
    assert!(d.stop(), "clean exit: {}", d.log());
}

/// The one leftover the kills above found outside `tmp/`: the digest memo is written to a
/// temp file next to the index and renamed, and a writer killed in between (the daemon, or a
/// `trtcache key`, which takes no lock) left `.digests.*.tmp` for good. The next open now
/// removes a dead writer's temp file and keeps a live one's (held under `flock`).
#[test]
fn a_dead_memo_writers_temp_file_is_removed_at_open_and_a_live_ones_kept() {
    use std::os::fd::AsRawFd;
    let d = Daemon::new();
    let cache = d.cache();
    // A cache (tagged) that a writer of its memo was killed in.
    let out = support::trtcache(
        ["gc", "--max-size", "1G", "--cache-dir"]
            .map(std::ffi::OsStr::new)
            .into_iter()
            .chain([cache.as_os_str()]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dead = cache.join(".digests.Ab12Cd.tmp");
    std::fs::write(&dead, b"{\"scheme\":\"tr").unwrap();
    let live = cache.join(".digests.Ef34Gh.tmp");
    let held = std::fs::File::create(&live).unwrap();
    // SAFETY: flock on a valid, owned file descriptor.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    let out = support::trtcache(["verify".as_ref(), "--cache-dir".as_ref(), cache.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(cleaned(&stderr), (1, 0, 0), "{stderr}");
    assert!(!dead.exists(), "a dead writer's temp file is removed");
    assert!(live.exists(), "a live writer's temp file is kept");
    drop(held);
}

/// A consumer killed while its acquire waits for a build must give its connection back at
/// once, not when the build ends: a TensorRT build takes minutes (the wait is bounded only by
/// `build_timeout_secs`, an hour by default), and consumers that crash-loop while waiting
/// would otherwise pile up connections until `max_connections` refuses everyone.
#[test]
fn consumers_killed_while_waiting_for_a_build_free_their_connections_during_it() {
    let mut d = Daemon::new();
    d.start();
    // ~128 MiB of weights: the build takes seconds, long enough to watch during it.
    place(&d, "big.onnx", |p| {
        write(&models::big_weights(8, 2048), p).unwrap()
    });
    let mut c = d.client();
    let t0 = Instant::now();
    while c.stats().unwrap().building == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "never started building"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let base = d.wait_connections(&mut c, 1);
    const WAITERS: usize = 4;
    let mut ps: Vec<Child> = (0..WAITERS)
        .map(|_| {
            Command::new(support::python())
                .arg("-c")
                .arg(CONSUMER)
                .arg(d.socket())
                .arg("big")
                .arg("loop")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for p in &mut ps {
        let mut line = String::new();
        BufReader::new(p.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "go");
    }
    // Each sent its acquire right after `go`; give the daemon a moment to read them (if it
    // has not, the kill closes an idle connection and this test proves less, never fails).
    std::thread::sleep(Duration::from_millis(300));
    let s = c.stats().unwrap();
    assert_eq!(s.connections, base + WAITERS as u64, "{s:?}");
    assert!(
        s.building >= 1,
        "the build ended before the consumers were killed: {s:?}"
    );
    for p in &mut ps {
        sigkill(p);
    }
    let t = Instant::now();
    loop {
        let s = c.stats().unwrap();
        if s.connections == base {
            assert!(
                s.building >= 1,
                "the dead consumers' connections were freed only when the build ended: {s:?}"
            );
            eprintln!(
                "{WAITERS} dead waiters' connections freed {:?} after the kill, the build still running",
                t.elapsed()
            );
            break;
        }
        assert!(
            s.building >= 1,
            "the build ended while {} dead consumers still held connections: {s:?}",
            s.connections - base
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A consumer that only shut down its writing side after asking still reads: it gets
    // the artifact once the build is done.
    let mut raw = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    let call = |s: &mut std::os::unix::net::UnixStream, body: &[u8]| {
        use std::io::Write;
        s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
        s.write_all(body).unwrap();
    };
    let read = |s: &mut std::os::unix::net::UnixStream| -> serde_json::Value {
        use std::io::Read;
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut buf).unwrap();
        serde_json::from_slice(&buf).unwrap()
    };
    call(&mut raw, br#"{"op":"hello","version":1}"#);
    assert_eq!(read(&mut raw)["kind"], "hello");
    call(&mut raw, br#"{"op":"acquire","model":"big"}"#);
    raw.shutdown(std::net::Shutdown::Write).unwrap();
    let v = read(&mut raw);
    assert_eq!(v["kind"], "artifact", "{v}");
    drop(c);
    assert!(d.stop(), "clean exit: {}", d.log());
}
