//! Model-folder races against the real daemon: contents swapped while they build, a slow
//! copy with pauses, a model deleted mid-build, and a model truncated in place while the
//! daemon hashes and builds it. Every served artifact is checked against the content its key
//! names: `trtcache key` on that content gives the same key, and the artifact's outputs match
//! that content's outputs in ONNX Runtime.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, random_f32, tensor_f32, write};
use trtcache::onnx::proto::ModelProto;
use trtcache_client::protocol::{ErrorCode, VariantState};
use trtcache_client::Client;

use crate::daemon::{artifact_session, ort_env, Daemon};
use crate::support;

const WIDTH: i64 = 1024;

/// `big_weights` with its first weight drawn from `seed`: same shapes, other outputs, other key.
fn variant(layers: usize, width: i64, seed: u64) -> ModelProto {
    let mut m = models::big_weights(layers, width);
    let w = width as usize;
    if let Some(g) = m.graph.as_mut() {
        g.initializer[0] = tensor_f32("w0", &[width, width], &random_f32(seed, w * w, 0.05));
    }
    m
}

fn run_big(s: &mut ort::session::Session, width: i64) -> Vec<f32> {
    let x: Vec<f32> = (0..width as usize)
        .map(|i| ((i * 31 % 97) as f32 - 48.0) / 24.0)
        .collect();
    let t = ort::value::Tensor::from_array(([1usize, width as usize], x)).unwrap();
    let out = s.run(ort::inputs!["x" => t]).unwrap();
    out["y"].try_extract_tensor::<f32>().unwrap().1.to_vec()
}

fn reference_big(path: &Path, width: i64) -> Vec<f32> {
    let mut s = ort::session::Session::builder(ort_env())
        .unwrap()
        .commit_from_file(path)
        .unwrap();
    run_big(&mut s, width)
}

/// Within the fp32 validation tolerance, element by element.
fn close(got: &[f32], want: &[f32]) -> bool {
    let tol = trtcache::plan::Tolerance::default_for(trtcache::plan::Precision::Fp32);
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| tol.allows(f64::from(*g), f64::from(*w)))
}

/// `trtcache key` of a file (own cache dir: the daemon holds its cache's lock).
fn cli_key(d: &Daemon, model: &Path) -> String {
    let out = support::trtcache([
        "key".as_ref(),
        "--json".as_ref(),
        "--no-sidecar".as_ref(),
        "--cache-dir".as_ref(),
        d.root.join("keycache").as_os_str(),
        "--ort-library".as_ref(),
        support::ort_dylib().as_os_str(),
        model.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    support::json(&out)["key"].as_str().unwrap().to_string()
}

/// Writes `d.config()` again with another debounce.
fn set_debounce(d: &Daemon, ms: u64) {
    let c = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        c.replace("debounce_ms = 150", &format!("debounce_ms = {ms}")),
    )
    .unwrap();
}

fn alive(d: &mut Daemon) {
    if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
        panic!("the daemon died ({st}):\n{}", d.log());
    }
}

/// Polls until acquiring `name` serves `key` (the current file's), or panics after `limit`.
fn wait_served(
    d: &mut Daemon,
    name: &str,
    key: &str,
    limit: Duration,
) -> trtcache_client::Artifact {
    let t0 = Instant::now();
    loop {
        alive(d);
        let last = match d.client().acquire_model(name) {
            Ok(a) if a.metadata.key == key => return a,
            Ok(a) => format!("served key {}", a.metadata.key),
            Err(e) => e.to_string(),
        };
        assert!(
            t0.elapsed() < limit,
            "`{name}` never served key {key} (last: {last})\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_idle(c: &mut Client, limit: Duration) -> trtcache_client::protocol::Stats {
    let t0 = Instant::now();
    loop {
        let s = c.stats().unwrap();
        if s.building == 0 && s.queue_depth == 0 {
            return s;
        }
        assert!(t0.elapsed() < limit, "builds never settled: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Installs `src` as `dst` either by write-elsewhere-then-rename or by copying over it in
/// place (truncate, then rewrite: what `cp` does).
fn install(src: &Path, dst: &Path, in_place: bool, scratch: &Path) {
    if in_place {
        std::fs::copy(src, dst).unwrap();
    } else {
        std::fs::copy(src, scratch).unwrap();
        std::fs::rename(scratch, dst).unwrap();
    }
}

#[test]
fn contents_swapped_during_builds_are_never_served_under_another_contents_key() {
    let mut d = Daemon::new();
    d.start();
    let outside = d.root.join("outside");
    // Six contents of ~16 MiB each (each built once while swaps overtake it, then revisited).
    let contents: Vec<PathBuf> = (0..6)
        .map(|i| {
            let p = outside.join(format!("c{i}.onnx"));
            write(&variant(4, WIDTH, 500 + i), &p).unwrap();
            p
        })
        .collect();
    let keys: Vec<String> = contents.iter().map(|p| cli_key(&d, p)).collect();
    let refs: Vec<Vec<f32>> = contents.iter().map(|p| reference_big(p, WIDTH)).collect();
    let distinct: std::collections::HashSet<&String> = keys.iter().collect();
    assert_eq!(distinct.len(), keys.len());
    let by_key: HashMap<&str, usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i))
        .collect();
    let target = d.models().join("m.onnx");
    let scratch = outside.join("scratch.onnx");

    // Swaps at varying points of the build (planning, building, validating, storing), by
    // rename and by in-place copy, while a client keeps acquiring and checking what it gets.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = {
        let socket = d.socket();
        let stop = stop.clone();
        let keys = keys.clone();
        let refs = refs.clone();
        std::thread::spawn(move || {
            let mut served = 0usize;
            let mut unknown = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok(mut c) = Client::connect(&socket) else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                if let Ok(a) = c.acquire_model("m") {
                    assert!(a.metadata.validation.passed, "{:?}", a.metadata);
                    match keys.iter().position(|k| *k == a.metadata.key) {
                        Some(i) => {
                            let got = run_big(&mut artifact_session(&a), WIDTH);
                            assert!(
                                close(&got, &refs[i]),
                                "key {} (content {i}) served another content's engine",
                                a.metadata.key
                            );
                            served += 1;
                        }
                        // A content this test never wrote (a half-done copy that stayed
                        // still for a debounce) is allowed but counted.
                        None => unknown.push(a.metadata.key.clone()),
                    }
                }
                std::thread::sleep(Duration::from_millis(30));
            }
            (served, unknown)
        })
    };
    let t0 = Instant::now();
    let swaps = 18;
    let mut mid_phase = 0;
    let mut c = d.client();
    for i in 0..swaps {
        let k = i % contents.len();
        install(&contents[k], &target, i % 2 == 1, &scratch);
        // The next swap comes at once, or once the daemon is planning (hashing), building or
        // validating this content (or once it is ready: a content built before is a hit).
        let phase = [None, Some("building"), Some("validating"), Some("planning")][i % 4];
        let w0 = Instant::now();
        while let Some(phase) = phase {
            alive(&mut d);
            let l = c.list().unwrap();
            let vs: Vec<_> = l.iter().flat_map(|m| &m.variants).collect();
            if vs.iter().any(|v| v.phase.as_deref() == Some(phase)) {
                mid_phase += 1;
                break;
            }
            let ready = vs
                .iter()
                .any(|v| v.state == VariantState::Ready && v.key.as_deref() == Some(&keys[k]));
            if ready || w0.elapsed() > Duration::from_secs(10) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let last = (swaps - 1) % contents.len();
    let art = wait_served(&mut d, "m", &keys[last], Duration::from_secs(240));
    assert!(close(
        &run_big(&mut artifact_session(&art), WIDTH),
        &refs[last]
    ));
    assert_eq!(
        cli_key(&d, &target),
        art.metadata.key,
        "served = `trtcache key` of the file"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (served, unknown) = checker.join().expect("checker saw a wrong artifact");
    let s = wait_idle(&mut c, Duration::from_secs(240));
    eprintln!(
        "swaps {swaps} ({mid_phase} in the middle of a phase): {served} acquires checked, {} of unknown content, {:.1} s; stats {s:?}",
        unknown.len(),
        t0.elapsed().as_secs_f64()
    );
    // Every content, once more, settled: whatever the store kept from the chaotic phase is
    // served now, and must be that content's engine.
    for (k, p) in contents.iter().enumerate() {
        install(p, &target, false, &scratch);
        let a = wait_served(&mut d, "m", &keys[k], Duration::from_secs(240));
        assert_eq!(by_key[a.metadata.key.as_str()], k);
        assert!(
            close(&run_big(&mut artifact_session(&a), WIDTH), &refs[k]),
            "content {k}: the stored artifact is another content's"
        );
    }
    assert_eq!(c.stats().unwrap().failures, 0, "a swap is never a failure");
    drop(c);
    assert!(d.stop(), "{}", d.log());
    assert!(
        d.tmp_files().is_empty(),
        "temp files left: {:?}",
        d.tmp_files()
    );
}

/// Writes `bytes` to `path` in `chunks` pieces, sleeping `pause(i)` after piece `i`.
fn slow_copy(bytes: &[u8], path: &Path, chunks: usize, pause: impl Fn(usize) -> Duration) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let step = bytes.len().div_ceil(chunks);
    for (i, piece) in bytes.chunks(step).enumerate() {
        f.write_all(piece).unwrap();
        f.flush().unwrap();
        if (i + 1) * step < bytes.len() {
            std::thread::sleep(pause(i));
        }
    }
}

#[test]
fn a_slowly_copied_model_is_not_planned_or_built_before_it_is_stable() {
    let mut d = Daemon::new();
    // A long debounce, so that scheduling noise on a loaded machine stays far below it.
    let debounce = 1500u64;
    set_debounce(&d, debounce);
    d.start();
    let outside = d.root.join("outside");
    let full = outside.join("full.onnx");
    write(&variant(2, WIDTH, 77), &full).unwrap();
    let bytes = std::fs::read(&full).unwrap();
    let key = cli_key(&d, &full);
    let want = reference_big(&full, WIDTH);

    // Phase 1: 16 pieces, pauses of a tenth of the debounce and one of half of it. The
    // daemon must not even list the model until the copy is done.
    let target = d.models().join("slow.onnx");
    let watcher = {
        let socket = d.socket();
        std::thread::spawn(move || {
            let mut c = Client::connect(&socket).unwrap();
            let mut seen = Vec::new();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(60) {
                let l = c.list().unwrap();
                let s = c.stats().unwrap();
                if l.iter().any(|m| m.name == "slow") || s.builds + s.failures + s.building > 0 {
                    seen.push((t0.elapsed(), format!("{l:?} {s:?}")));
                    return seen;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        })
    };
    let t0 = Instant::now();
    slow_copy(&bytes, &target, 16, |i| {
        Duration::from_millis(if i == 7 { debounce / 2 } else { debounce / 10 })
    });
    let copied = t0.elapsed();
    let seen = watcher.join().unwrap();
    let first = seen.first().map(|(t, _)| *t).unwrap_or(Duration::MAX);
    eprintln!(
        "slow copy took {:.2} s; the model first appeared {:.2} s after the copy began",
        copied.as_secs_f64(),
        first.as_secs_f64()
    );
    assert!(
        first >= copied,
        "the daemon saw the model {:?} into a {:?} copy: {seen:?}\n{}",
        first,
        copied,
        d.log()
    );
    let art = wait_served(&mut d, "slow", &key, Duration::from_secs(120));
    assert!(close(&run_big(&mut artifact_session(&art), WIDTH), &want));
    let mut c = d.client();
    let s = wait_idle(&mut c, Duration::from_secs(120));
    assert_eq!(
        (s.builds, s.failures),
        (1, 0),
        "built once, when complete: {s:?}"
    );

    // Phase 2: a pause of two debounces halfway. The half file is stable by definition and
    // may be looked at (it does not parse, or parses to other content with another key); it
    // is never served as the full model, and the full one becomes ready afterwards.
    let target2 = d.models().join("slow2.onnx");
    let full2 = outside.join("full2.onnx");
    write(&variant(2, WIDTH, 78), &full2).unwrap();
    let bytes2 = std::fs::read(&full2).unwrap();
    let key2 = cli_key(&d, &full2);
    let want2 = reference_big(&full2, WIDTH);
    slow_copy(&bytes2, &target2, 4, |i| {
        Duration::from_millis(if i == 1 { debounce * 2 } else { debounce / 10 })
    });
    let art = wait_served(&mut d, "slow2", &key2, Duration::from_secs(120));
    assert!(close(&run_big(&mut artifact_session(&art), WIDTH), &want2));
    let s = wait_idle(&mut c, Duration::from_secs(120));
    eprintln!("after the long pause: {s:?}");
    let l = c.status("slow2").unwrap();
    assert_eq!(l.variants[0].state, VariantState::Ready, "{l:?}");
    assert_eq!(l.variants[0].key.as_deref(), Some(key2.as_str()));
    drop(c);
    assert!(d.stop(), "{}", d.log());
}

#[test]
fn a_model_deleted_during_its_build_leaves_no_served_entry() {
    let mut d = Daemon::new();
    d.start();
    let outside = d.root.join("outside");
    let src = outside.join("gone.onnx");
    write(&variant(8, 1024, 9), &src).unwrap();
    let key = cli_key(&d, &src);
    let want = reference_big(&src, 1024);
    std::fs::copy(&src, outside.join("x.onnx")).unwrap();
    std::fs::rename(outside.join("x.onnx"), d.models().join("gone.onnx")).unwrap();
    let mut c = d.client();
    d.wait_building(&mut c);
    let t0 = Instant::now();
    std::fs::remove_file(d.models().join("gone.onnx")).unwrap();
    while c.list().unwrap().iter().any(|m| m.name == "gone") {
        assert!(t0.elapsed() < Duration::from_secs(60), "still listed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = wait_idle(&mut c, Duration::from_secs(240));
    eprintln!("after the delete: {s:?}");
    // Gone for clients, whatever the cancelled build had reached.
    for _ in 0..3 {
        let e = c.acquire_model("gone").unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
        assert!(c.list().unwrap().is_empty());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.failures, 0, "a deleted model is not a failure: {s:?}");
    drop(c);
    assert!(d.stop(), "{}", d.log());
    assert!(
        d.tmp_files().is_empty(),
        "temp files left: {:?}",
        d.tmp_files()
    );
    // The store holds at most a valid cache entry for that content: a restart with the
    // model back serves it, with its own key and outputs.
    std::fs::copy(&src, d.models().join("gone.onnx")).unwrap();
    d.start();
    let art = wait_served(&mut d, "gone", &key, Duration::from_secs(240));
    assert!(art.metadata.validation.passed);
    assert!(close(&run_big(&mut artifact_session(&art), 1024), &want));
    assert!(d.stop(), "{}", d.log());
}

#[test]
fn a_model_truncated_in_place_while_hashed_and_built_does_not_kill_the_daemon() {
    let mut d = Daemon::new();
    d.start();
    let outside = d.root.join("outside");
    // ~48 MiB inline: hashing and copying it take long enough to be cut under. Each round
    // has its own content, so each one is hashed and built afresh.
    let src = outside.join("big.onnx");
    let target = d.models().join("big.onnx");
    let mut c = d.client();
    // Each round copies the file in place, waits until the daemon is in the named phase
    // with it, and truncates it to a third there: while it is hashed (planning), copied and
    // built, or validated.
    let mut hit = Vec::new();
    for (round, phase) in ["planning", "building", "validating", "planning"]
        .into_iter()
        .enumerate()
    {
        write(&variant(12, 1024, 30 + round as u64), &src).unwrap();
        std::fs::copy(&src, &target).unwrap();
        let t0 = Instant::now();
        let reached = loop {
            alive(&mut d);
            let l = c.list().unwrap();
            let now = l
                .iter()
                .flat_map(|m| &m.variants)
                .any(|v| v.phase.as_deref() == Some(phase));
            if now || t0.elapsed() > Duration::from_secs(20) {
                break now;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .unwrap()
            .set_len(std::fs::metadata(&src).unwrap().len() / 3)
            .unwrap();
        hit.push((phase, reached));
        // Let the daemon trip over the truncated file, then check it is alive and answers.
        std::thread::sleep(Duration::from_millis(500));
        alive(&mut d);
        let l = c
            .list()
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", d.log()));
        eprintln!(
            "round {round}: truncated in phase {phase} (reached: {reached}): {:?}",
            l.first()
                .map(|m| (&m.variants[0].state, &m.variants[0].reason))
        );
    }
    assert!(
        hit.iter().filter(|(_, r)| *r).count() >= 3,
        "too few rounds hit their phase: {hit:?}"
    );
    // The full file again: served, with the file's key.
    let key = cli_key(&d, &src);
    std::fs::copy(&src, &target).unwrap();
    let art = wait_served(&mut d, "big", &key, Duration::from_secs(240));
    assert!(art.metadata.validation.passed);
    let s = wait_idle(&mut c, Duration::from_secs(240));
    eprintln!("stats {s:?}");
    drop(c);
    assert!(d.stop(), "{}", d.log());
    assert!(
        d.tmp_files().is_empty(),
        "temp files left: {:?}",
        d.tmp_files()
    );
}

#[test]
fn an_artifact_bigger_than_the_cache_is_a_final_answer_until_the_limit_grows() {
    // A cache limit below one artifact. Such a build used to be stored, evicted by its own
    // store and answered `cancelled` ("ask again") for ever (issue 39); before that, failed
    // for good as a broken model. It is refused before it is stored, with the size and the
    // limit, remembered (no rebuild per acquire), and built once a restart gives it room.
    let mut d = Daemon::new();
    let c = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        c.replace("[limits]\n", "[limits]\ncache_size_bytes = 4096\n"),
    )
    .unwrap();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    d.start();
    let mut c = d.client();
    for round in 0..3 {
        let e = c.acquire_model("enc").unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BuildFailed), "round {round}: {e}");
        assert!(
            e.to_string().contains("limits.cache_size_bytes = 4096"),
            "{e}"
        );
    }
    let s = wait_idle(&mut c, Duration::from_secs(60));
    eprintln!("{s:?}");
    assert_eq!((s.failures, s.cancelled, s.builds), (1, 0, 0), "{s:?}");
    // With room again (a restart with the default limit), it is served.
    drop(c);
    assert!(d.stop());
    std::fs::write(d.config(), c_default(&d)).unwrap();
    d.start();
    let art = d.client().acquire_model("enc").unwrap();
    assert!(art.metadata.validation.passed);
    assert!(d.stop());
}

fn c_default(d: &Daemon) -> String {
    std::fs::read_to_string(d.config())
        .unwrap()
        .replace("cache_size_bytes = 4096\n", "")
}

fn tiny(seed: u64) -> ModelProto {
    let mut m = models::tiny_encoder(false);
    if let Some(g) = m.graph.as_mut() {
        g.initializer[3] = tensor_f32("fc.bias", &[64], &random_f32(seed, 64, 0.5));
    }
    m
}

#[test]
fn the_store_evicts_the_least_recently_acquired_artifact_not_the_oldest_build() {
    // Room for two tiny artifacts (~34 KB each). Acquires are served from the daemon's
    // memory; the soak found the store never heard of them, so its LRU eviction removed the
    // most used artifacts first and they were rebuilt again and again.
    let mut d = Daemon::new();
    let c = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        c.replace("[limits]\n", "[limits]\ncache_size_bytes = 80000\n"),
    )
    .unwrap();
    write(&tiny(1), &d.models().join("hot.onnx")).unwrap();
    d.start();
    d.wait_settled(&["hot"]);
    let mut c = d.client();
    // Last-use stamps are in seconds: each step is more than a second after the last.
    let tick = || std::thread::sleep(Duration::from_millis(1100));
    tick();
    write(&tiny(2), &d.models().join("cold.onnx")).unwrap();
    d.wait_settled(&["cold"]);
    tick();
    for _ in 0..3 {
        c.acquire_model("hot").unwrap();
    }
    tick();
    write(&tiny(3), &d.models().join("new.onnx")).unwrap();
    d.wait_settled(&["new"]);
    let builds = wait_idle(&mut c, Duration::from_secs(60)).builds;
    assert_eq!(builds, 3, "{}", d.log());
    // `hot` was used after `cold` was built: `cold` went, `hot` is still served as is.
    let a = c
        .acquire_model("hot")
        .unwrap_or_else(|e| panic!("the hot artifact was evicted: {e}"));
    assert!(a.metadata.validation.passed);
    let s = c.stats().unwrap();
    eprintln!("{s:?}");
    assert_eq!(s.builds, 3, "hot was not rebuilt: {s:?}");
    drop(c);
    assert!(d.stop());
}

/// A plan that fails because the file moved under it (deleted, or rewritten in place, before
/// the watcher's debounce applied the change) says nothing about the model: it is answered
/// `not_found` / `not_ready` and not remembered, where it used to be `build_failed`. A backend
/// the daemon does not build by default makes the acquire plan afresh from the file.
#[test]
fn a_plan_that_reads_a_moving_file_is_not_a_model_failure() {
    let mut d = Daemon::new();
    set_debounce(&d, 30_000);
    let c = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        c.replace("rescan_secs = 2", "rescan_secs = 600"),
    )
    .unwrap();
    let m = d.models().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    d.start();
    d.wait_settled(&["m"]);
    let mut c = d.client();
    let acquire = |c: &mut Client, backend: &str| {
        c.acquire(&trtcache_client::AcquireRequest {
            model: "m".into(),
            backend: Some(backend.into()),
            wait: false,
            ..Default::default()
        })
        .map(|_| ())
        .unwrap_err()
    };

    // Rewritten in place with bytes that do not parse: the plan fails on a file that is not
    // what the scan saw settle.
    std::fs::write(&m, b"not a model, a half-written one").unwrap();
    let e = acquire(&mut c, "ort-cuda");
    assert_eq!(e.code(), Some(ErrorCode::NotReady), "{e}");
    assert!(e.to_string().contains("changed on disk"), "{e}");

    // Deleted: the plan cannot open the file.
    std::fs::remove_file(&m).unwrap();
    let e = acquire(&mut c, "ort-tensorrt");
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");

    // The model's own variant, planned while the file was settled, still serves its
    // artifact (the cache's copy, not the moving file).
    assert!(c.acquire_model("m").is_ok());
    alive(&mut d);
}

/// Removed models' artifacts leave the daemon's memory (they stay in the cache until GC):
/// with models coming and going, the in-memory map must not keep one entry per key ever
/// served.
#[test]
fn removed_models_artifacts_are_forgotten_from_memory() {
    let mut d = Daemon::new();
    let names: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        write(
            &variant(1, 8, i as u64 + 1),
            &d.models().join(format!("{n}.onnx")),
        )
        .unwrap();
    }
    d.start();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    d.wait_settled(&refs);
    let mut c = d.client();
    for n in &names {
        c.acquire_model(n).unwrap();
    }
    assert_eq!(c.stats().unwrap().artifacts_in_memory, 6);
    for n in &names[2..] {
        std::fs::remove_file(d.models().join(format!("{n}.onnx"))).unwrap();
    }
    let t0 = Instant::now();
    loop {
        let (models, held) = (
            c.list().unwrap().len(),
            c.stats().unwrap().artifacts_in_memory,
        );
        if models == 2 && held == 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{models} models listed, {held} artifacts in memory\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The two that stay are still served, and the cache kept the removed ones' artifacts.
    for n in &names[..2] {
        c.acquire_model(n).unwrap();
    }
    assert_eq!(
        std::fs::read_dir(d.cache().join("blobs")).unwrap().count(),
        6
    );
    alive(&mut d);
}
