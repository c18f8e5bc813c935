//! Soak test of the daemon (RELIABILITY.md, "Long runs and scale"): a real `trtcache serve` (the release
//! binary) on temp folders, client threads acquiring in a loop, a churn thread adding,
//! replacing (by rename and by in-place copy) and removing models so builds keep running,
//! and a sample every `--interval` seconds of throughput, acquire latency, the daemon's RSS
//! and open descriptors, and its build counters. Ends with a verdict: every acquire's
//! artifact passed validation and carries the key of one of the contents written (`trtcache
//! key` on that content), a sample of artifacts gives that content's outputs in ONNX Runtime,
//! descriptors at the end (churn stopped, builds idle) equal those at the start, and the RSS
//! trend. Exit status 1 when any of that fails.
//!
//! ```text
//! benches/soak.sh --minutes 10 [--clients 8] [--models 8] [--interval 10] [--sample 25]
//!     [--cache-mib 128] [--keep DIR]   # builds the release binary and this driver, runs it
//! ```
//!
//! The driver itself takes the same flags and `--trtcache BIN` (default: the `trtcache` in the
//! profile folder above its own). Without any of its flags (as `cargo bench` and `cargo test
//! --all-targets` run every bench target) it prints where its usage is and exits.
//!
//! Needs ONNX Runtime (`eval "$(scripts/ort-env.sh)"` sets `ORT_DYLIB_PATH`). Linux only
//! (reads `/proc/PID/status` and `/proc/PID/fd`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, random_f32, tensor_f32, write};
use trtcache::rng::SplitMix64;
use trtcache_client::{AcquireRequest, Client};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Args {
    minutes: f64,
    clients: usize,
    models: usize,
    interval: u64,
    sample: u64,
    trtcache: PathBuf,
    keep: Option<PathBuf>,
    cache_mib: u64,
}

fn args() -> Res<Args> {
    let mut a = Args {
        minutes: 10.0,
        clients: 8,
        models: 8,
        interval: 10,
        sample: 25,
        trtcache: std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("trtcache"))
            .ok_or("no trtcache in the profile folder above this driver")?,
        keep: None,
        cache_mib: 128,
    };
    const FLAGS: [&str; 8] = [
        "--minutes",
        "--clients",
        "--models",
        "--interval",
        "--sample",
        "--trtcache",
        "--keep",
        "--cache-mib",
    ];
    if !std::env::args().any(|k| FLAGS.contains(&k.as_str())) {
        // `cargo bench` and `cargo test --all-targets` run every bench target, with `--bench`
        // or the test harness's flags: no soak then (benches/soak.sh always passes a flag).
        println!("see the docs at the top of benches/soak.rs (benches/soak.sh runs it)");
        std::process::exit(0);
    }
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--minutes" => a.minutes = v()?.parse()?,
            "--clients" => a.clients = v()?.parse()?,
            "--models" => a.models = v()?.parse()?,
            "--interval" => a.interval = v()?.parse()?,
            "--sample" => a.sample = v()?.parse::<u64>()?.max(1),
            "--trtcache" => a.trtcache = v()?.into(),
            "--keep" => a.keep = Some(v()?.into()),
            "--cache-mib" => a.cache_mib = v()?.parse()?,
            "-h" | "--help" => {
                println!("see the docs at the top of benches/soak.rs");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(a)
}

/// Two kinds of content: a tiny encoder (builds in milliseconds) and a model with 24 MiB of
/// weights (builds for about a second, so churn lands in the middle of its builds).
#[derive(Clone, Copy, Debug)]
enum Kind {
    Tiny,
    Big,
}

const BIG_WIDTH: i64 = 1024;

/// A model of `kind` whose weights come from `seed`: its own content, key and outputs.
fn content(kind: Kind, seed: u64) -> trtcache::onnx::proto::ModelProto {
    match kind {
        Kind::Tiny => {
            let mut m = models::tiny_encoder(false);
            if let Some(g) = m.graph.as_mut() {
                g.initializer[3] = tensor_f32("fc.bias", &[64], &random_f32(seed, 64, 0.5));
            }
            m
        }
        Kind::Big => {
            let mut m = models::big_weights(6, BIG_WIDTH);
            let w = BIG_WIDTH as usize;
            if let Some(g) = m.graph.as_mut() {
                g.initializer[0] = tensor_f32(
                    "w0",
                    &[BIG_WIDTH, BIG_WIDTH],
                    &random_f32(seed, w * w, 0.05),
                );
            }
            m
        }
    }
}

fn ort_env() -> &'static ort::environment::Environment {
    let lib = std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from);
    &trtcache::builder::runtime::load(lib.as_deref())
        .expect("loading ONNX Runtime (set ORT_DYLIB_PATH)")
        .env
}

fn run(kind: Kind, s: &mut ort::session::Session) -> Res<Vec<f32>> {
    let shape = match kind {
        Kind::Tiny => vec![1usize, 6, 64],
        Kind::Big => vec![1usize, BIG_WIDTH as usize],
    };
    let x: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let t = ort::value::Tensor::from_array((shape, x))?;
    let out = s.run(ort::inputs!["x" => t])?;
    Ok(out["y"].try_extract_tensor::<f32>()?.1.to_vec())
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

fn cli_key(bin: &Path, model: &Path, cache: &Path) -> Res<String> {
    let out = Command::new(bin)
        .args(["key", "--json", "--no-sidecar", "--cache-dir"])
        .arg(cache)
        .arg(model)
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["key"].as_str().ok_or("no key")?.to_string())
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |r| r.count() as u64)
}

/// What each open descriptor points at (`socket:[N]` numbers vary; kept as they are).
fn fd_targets(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|r| {
            r.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The fewest descriptors over a second (an acquire in flight holds an artifact's files for
/// a moment), with what they point at.
fn settled_fds(pid: u32) -> (u64, Vec<String>) {
    let mut best = (u64::MAX, Vec::new());
    for _ in 0..10 {
        let t = fd_targets(pid);
        if (t.len() as u64) < best.0 {
            best = (t.len() as u64, t);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    best
}

/// Entries of `b` not in `a` (as multisets).
fn added(a: &[String], b: &[String]) -> Vec<String> {
    let mut left: Vec<&String> = a.iter().collect();
    b.iter()
        .filter(|x| match left.iter().position(|y| y == x) {
            Some(i) => {
                left.remove(i);
                false
            }
            None => true,
        })
        .cloned()
        .collect()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

/// What the client threads record, drained by the sampler every interval.
#[derive(Default)]
struct Window {
    steady_ms: Vec<f64>,
    churn_ms: Vec<f64>,
    errors: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Shared {
    window: Mutex<Window>,
    acquires: AtomicU64,
    violations: Mutex<Vec<String>>,
    compared: AtomicU64,
    churn_ops: AtomicU64,
    errors_total: Mutex<BTreeMap<String, u64>>,
    /// The first message seen for each error code.
    error_example: Mutex<BTreeMap<String, String>>,
    all_steady_ms: Mutex<Vec<f64>>,
}

/// Every content written, by `trtcache key`: its kind and its outputs from ONNX Runtime on
/// the original file. A content is registered before it enters the repository.
#[derive(Default)]
struct Contents {
    by_key: Mutex<HashMap<String, (Kind, Vec<f32>)>>,
}

impl Contents {
    /// Writes content `kind`/`seed` to `path` and registers it.
    fn make(&self, bin: &Path, kind: Kind, seed: u64, path: &Path, keycache: &Path) -> Res<()> {
        write(&content(kind, seed), path)?;
        let key = cli_key(bin, path, keycache)?;
        let mut s = ort::session::Session::builder(ort_env())?.commit_from_file(path)?;
        let out = run(kind, &mut s)?;
        self.by_key.lock().unwrap().insert(key, (kind, out));
        Ok(())
    }
    fn get(&self, key: &str) -> Option<(Kind, Vec<f32>)> {
        self.by_key.lock().unwrap().get(key).cloned()
    }
}

/// One client thread's setup.
struct Worker {
    socket: PathBuf,
    /// Steady names first, then churned ones.
    names: Vec<String>,
    steady: usize,
    contents: Arc<Contents>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    seed: u64,
    /// Run one acquire in this many in ONNX Runtime.
    sample: u64,
}

fn client_loop(w: Worker) {
    let Worker {
        socket,
        names,
        steady,
        contents,
        shared,
        stop,
        seed,
        sample,
    } = w;
    let mut rng = SplitMix64(seed);
    let mut client: Option<Client> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let c = match client.as_mut() {
            Some(c) => c,
            None => match Client::connect(&socket) {
                Ok(c) => client.insert(c),
                Err(e) => {
                    *shared
                        .window
                        .lock()
                        .unwrap()
                        .errors
                        .entry(format!("connect: {e}"))
                        .or_default() += 1;
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            },
        };
        let i = rng.below(names.len() as u64) as usize;
        let t0 = Instant::now();
        let r = c.acquire(&AcquireRequest {
            model: names[i].clone(),
            wait: true,
            timeout_ms: Some(60_000),
            dir_fd: true,
            ..Default::default()
        });
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match r {
            Ok(a) => {
                shared.acquires.fetch_add(1, Ordering::Relaxed);
                {
                    let mut w = shared.window.lock().unwrap();
                    if i < steady {
                        w.steady_ms.push(ms);
                    } else {
                        w.churn_ms.push(ms);
                    }
                }
                let m = &a.metadata;
                let Some((kind, want)) = contents.get(&m.key) else {
                    shared.violations.lock().unwrap().push(format!(
                        "{}: key {} is no content this soak wrote",
                        names[i], m.key
                    ));
                    continue;
                };
                if !m.validation.passed {
                    shared
                        .violations
                        .lock()
                        .unwrap()
                        .push(format!("{}: artifact {} not validated", names[i], m.key));
                }
                n += 1;
                if n.is_multiple_of(sample) {
                    let outputs = (|| -> Res<Vec<f32>> {
                        // ort-cpu artifacts are optimized already: optimizations off.
                        let mut b = ort::session::Session::builder(ort_env())?
                            .with_optimization_level(
                                ort::session::builder::GraphOptimizationLevel::Disable,
                            )
                            .map_err(|e| e.to_string())?;
                        run(kind, &mut a.session(&mut b)?)
                    })();
                    match outputs {
                        Ok(o) if close(&o, &want) => {
                            shared.compared.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => shared.violations.lock().unwrap().push(format!(
                            "{}: key {} gives another content's outputs",
                            names[i], m.key
                        )),
                        Err(e) => shared
                            .violations
                            .lock()
                            .unwrap()
                            .push(format!("{}: key {}: cannot run: {e}", names[i], m.key)),
                    }
                }
            }
            Err(e) => {
                // Expected under churn: not_found (removed), cancelled (replaced mid-build).
                let code = e
                    .code()
                    .map_or_else(|| format!("io: {e}"), |c| format!("{c:?}"));
                shared
                    .error_example
                    .lock()
                    .unwrap()
                    .entry(code.clone())
                    .or_insert_with(|| e.to_string());
                *shared
                    .window
                    .lock()
                    .unwrap()
                    .errors
                    .entry(code)
                    .or_default() += 1;
                if e.code().is_none() {
                    client = None;
                }
            }
        }
    }
}

struct Churn {
    bin: PathBuf,
    models: PathBuf,
    outside: PathBuf,
    keycache: PathBuf,
    names: Vec<String>,
    /// Contents made at the start, drawn again and again (cache hits, A-B-A swaps, and
    /// rebuilds once the size limit evicted them).
    pool: Vec<PathBuf>,
}

fn churn_loop(ch: Churn, contents: Arc<Contents>, shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut rng = SplitMix64(0x9E37_79B9_7F4A_7C15);
    let scratch = ch.outside.join(".scratch.onnx");
    let mut fresh = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let name = &ch.names[rng.below(ch.names.len() as u64) as usize];
        let path = ch.models.join(format!("{name}.onnx"));
        let pick = rng.below(6);
        let src = if pick == 5 {
            // A content never seen: a new key, so a build (one in three a big one, which
            // builds for about a second and is often replaced while it does).
            fresh += 1;
            let kind = if fresh.is_multiple_of(3) {
                Kind::Big
            } else {
                Kind::Tiny
            };
            let p = ch.outside.join(format!("fresh{}.onnx", fresh % 4));
            if let Err(e) = contents.make(&ch.bin, kind, 900_000 + fresh, &p, &ch.keycache) {
                eprintln!("churn: making a content: {e}");
                continue;
            }
            p
        } else {
            ch.pool[rng.below(ch.pool.len() as u64) as usize].clone()
        };
        let r = match pick {
            0 => std::fs::remove_file(&path).or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }),
            // Copy over it in place (truncate, rewrite: what `cp` does).
            1 => std::fs::copy(&src, &path).map(|_| ()),
            // Write elsewhere, rename in.
            _ => std::fs::copy(&src, &scratch).and_then(|_| std::fs::rename(&scratch, &path)),
        };
        if let Err(e) = r {
            eprintln!("churn: {e}");
        }
        shared.churn_ops.fetch_add(1, Ordering::Relaxed);
        // 0.3 to 1.5 s apart: often within a build, sometimes after it.
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
    }
}

fn stop_daemon(mut child: Child) -> Res<bool> {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st.success());
        }
        if t0.elapsed() > Duration::from_secs(60) {
            child.kill()?;
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() -> Res<()> {
    let a = args()?;
    let tmp = tempfile::tempdir()?;
    let root = match &a.keep {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    let (models_dir, cache, outside) = (
        root.join("models"),
        root.join("cache"),
        root.join("outside"),
    );
    for d in [&models_dir, &cache, &outside] {
        std::fs::create_dir_all(d)?;
    }
    // Contents: one per steady model, and a pool of four tiny and two big ones that the churn
    // thread draws from (it also makes fresh ones as it goes).
    let keycache = root.join("keycache");
    let contents = Arc::new(Contents::default());
    let steady: Vec<String> = (0..a.models).map(|i| format!("steady{i}")).collect();
    for (i, n) in steady.iter().enumerate() {
        let p = outside.join(format!("{n}.onnx"));
        contents.make(&a.trtcache, Kind::Tiny, 7000 + i as u64, &p, &keycache)?;
        std::fs::copy(&p, models_dir.join(format!("{n}.onnx")))?;
    }
    let mut pool = Vec::new();
    for (i, kind) in [
        Kind::Tiny,
        Kind::Tiny,
        Kind::Tiny,
        Kind::Tiny,
        Kind::Big,
        Kind::Big,
    ]
    .into_iter()
    .enumerate()
    {
        let p = outside.join(format!("pool{i}.onnx"));
        contents.make(&a.trtcache, kind, 8000 + i as u64, &p, &keycache)?;
        pool.push(p);
    }
    let n_contents = contents.by_key.lock().unwrap().len();
    let churn_names: Vec<String> = (0..4).map(|i| format!("churn{i}")).collect();
    let socket = cache.join("trtcache.sock");
    let config = root.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "models = {models_dir:?}\ncache_dir = {cache:?}\nsocket = {socket:?}\n{}[limits]\ndebounce_ms = 200\nrescan_secs = 5\nbuild_concurrency = 2\nmax_connections = {}\ncache_size_bytes = {}\n",
            std::env::var("ORT_DYLIB_PATH")
                .map(|p| format!("ort_library = {p:?}\n"))
                .unwrap_or_default(),
            a.clients + 16,
            a.cache_mib << 20
        ),
    )?;
    let log = std::fs::File::create(root.join("daemon.log"))?;
    let child = Command::new(&a.trtcache)
        .args(["-v", "serve", "--config"])
        .arg(&config)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let pid = child.id();
    let t0 = Instant::now();
    let mut admin = loop {
        if let Ok(c) = Client::connect(&socket) {
            break c;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("the daemon did not come up (see daemon.log)".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Steady models ready before the clock starts.
    loop {
        let l = admin.list()?;
        if l.iter().filter(|m| m.name.starts_with("steady")).count() == a.models
            && l.iter().all(|m| {
                m.variants
                    .iter()
                    .all(|v| v.state == trtcache_client::protocol::VariantState::Ready)
            })
        {
            break;
        }
        if t0.elapsed() > Duration::from_secs(300) {
            return Err(format!("steady models never ready: {l:?}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "soak: daemon pid {pid}, {} clients, {} steady + {} churned names, {} contents, {:.1} min, workdir {}",
        a.clients,
        a.models,
        churn_names.len(),
        n_contents,
        a.minutes,
        root.display()
    );

    // Descriptors with only the admin connection, before any client or churn.
    let (fd_base, fd_base_set) = settled_fds(pid);
    let shared = Arc::new(Shared::default());
    let stop_clients = Arc::new(AtomicBool::new(false));
    let stop_churn = Arc::new(AtomicBool::new(false));
    let names: Vec<String> = steady.iter().chain(&churn_names).cloned().collect();
    let clients: Vec<_> = (0..a.clients)
        .map(|i| {
            let w = Worker {
                socket: socket.clone(),
                names: names.clone(),
                steady: a.models,
                contents: contents.clone(),
                shared: shared.clone(),
                stop: stop_clients.clone(),
                seed: 1 + i as u64 * 7919,
                sample: a.sample,
            };
            std::thread::spawn(move || client_loop(w))
        })
        .collect();
    // Baseline with every client connected and no churn yet.
    std::thread::sleep(Duration::from_secs(2));
    let (fd_start, rss_start) = (fds(pid), rss_kib(pid));
    let churn = {
        let ch = Churn {
            bin: a.trtcache.clone(),
            models: models_dir.clone(),
            outside: outside.clone(),
            keycache: keycache.clone(),
            names: churn_names.clone(),
            pool,
        };
        let (c, sh, st) = (contents.clone(), shared.clone(), stop_churn.clone());
        std::thread::spawn(move || churn_loop(ch, c, sh, st))
    };

    println!(
        "{:>6} {:>8} {:>9} {:>9} {:>10} {:>7} {:>8} {:>5} {:>6} {:>6} {:>5} {:>5}  errors",
        "t_s",
        "acq/s",
        "p50_ms",
        "p99_ms",
        "churn_p99",
        "churn",
        "rss_MiB",
        "fds",
        "builds",
        "cancel",
        "fail",
        "queue"
    );
    let started = Instant::now();
    let total = Duration::from_secs_f64(a.minutes * 60.0);
    let mut rss_series = Vec::new();
    let mut fd_series = Vec::new();
    let mut last_acq = 0;
    let mut last_t = Instant::now();
    while started.elapsed() < total {
        std::thread::sleep(
            Duration::from_secs(a.interval)
                .min(total.saturating_sub(started.elapsed()))
                .max(Duration::from_millis(100)),
        );
        let w = std::mem::take(&mut *shared.window.lock().unwrap());
        let now_acq = shared.acquires.load(Ordering::Relaxed);
        let dt = last_t.elapsed().as_secs_f64();
        last_t = Instant::now();
        let rate = (now_acq - last_acq) as f64 / dt;
        last_acq = now_acq;
        let mut sm = w.steady_ms.clone();
        sm.sort_by(f64::total_cmp);
        let mut cm = w.churn_ms.clone();
        cm.sort_by(f64::total_cmp);
        shared.all_steady_ms.lock().unwrap().extend(&sm);
        {
            let mut t = shared.errors_total.lock().unwrap();
            for (k, v) in &w.errors {
                *t.entry(k.clone()).or_default() += v;
            }
        }
        let (rss, fd) = (rss_kib(pid), fds(pid));
        rss_series.push(rss);
        fd_series.push(fd);
        let s = admin.stats()?;
        println!(
            "{:>6.0} {:>8.0} {:>9.2} {:>9.2} {:>10.1} {:>7} {:>8.1} {:>5} {:>6} {:>6} {:>5} {:>5}  {:?}",
            started.elapsed().as_secs_f64(),
            rate,
            pct(&sm, 0.5),
            pct(&sm, 0.99),
            pct(&cm, 0.99),
            cm.len(),
            rss as f64 / 1024.0,
            fd,
            s.builds,
            s.cancelled,
            s.failures,
            s.queue_depth + s.building,
            w.errors
        );
    }
    // Churn stops; clients go on while the last builds finish; then descriptors again.
    stop_churn.store(true, Ordering::SeqCst);
    churn.join().map_err(|_| "churn thread panicked")?;
    let t_idle = Instant::now();
    loop {
        let s = admin.stats()?;
        if s.building == 0 && s.queue_depth == 0 {
            break;
        }
        if t_idle.elapsed() > Duration::from_secs(120) {
            eprintln!("soak: builds still running after 120 s: {s:?}");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Past the debounce and any acquire that was waiting on a build.
    std::thread::sleep(Duration::from_secs(3));
    let (fd_end, rss_end) = (fds(pid), rss_kib(pid));
    stop_clients.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().map_err(|_| "client thread panicked")?;
    }
    let final_stats = admin.stats()?;
    drop(admin);
    std::thread::sleep(Duration::from_millis(500));
    // The clients' connections close; then descriptors again, as at the start.
    let (fd_after, fd_after_set) = settled_fds(pid);
    let exit_ok = stop_daemon(child)?;
    let tmp_left = std::fs::read_dir(cache.join("tmp")).map_or(0, |r| r.count());
    let log = std::fs::read_to_string(root.join("daemon.log")).unwrap_or_default();
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("build failed")).collect();

    let secs = started.elapsed().as_secs_f64();
    let acq = shared.acquires.load(Ordering::Relaxed);
    let mut all = std::mem::take(&mut *shared.all_steady_ms.lock().unwrap());
    all.sort_by(f64::total_cmp);
    let violations = shared.violations.lock().unwrap().clone();
    // RSS trend: the mean of the last third of the samples against the first third.
    let third = (rss_series.len() / 3).max(1);
    let mean = |s: &[u64]| s.iter().sum::<u64>() as f64 / s.len().max(1) as f64 / 1024.0;
    let (rss_first, rss_last) = (
        mean(&rss_series[..third.min(rss_series.len())]),
        mean(&rss_series[rss_series.len().saturating_sub(third)..]),
    );
    let fd_leak = fd_after > fd_base;
    let rss_growing = rss_last > rss_first * 1.5 + 16.0;
    println!();
    println!(
        "duration           {secs:.0} s, {} clients, {} churn operations",
        a.clients,
        shared.churn_ops.load(Ordering::Relaxed)
    );
    println!("acquires           {acq} ({:.0}/s)", acq as f64 / secs);
    println!(
        "steady acquire     p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms ({} acquires)",
        pct(&all, 0.5),
        pct(&all, 0.99),
        all.last().copied().unwrap_or(f64::NAN),
        all.len()
    );
    println!(
        "errors (expected under churn) {:?}",
        shared.errors_total.lock().unwrap()
    );
    for (code, msg) in shared.error_example.lock().unwrap().iter() {
        println!("  e.g. {code}: {msg}");
    }
    println!("daemon             {final_stats:?}");
    println!(
        "outputs compared   {} sampled artifacts matched their content's outputs",
        shared.compared.load(Ordering::Relaxed)
    );
    println!(
        "failed builds      {} in the daemon log{}",
        failed.len(),
        failed
            .iter()
            .take(5)
            .map(|l| format!("\n  {l}"))
            .collect::<String>()
    );
    println!(
        "violations         {} {:?}",
        violations.len(),
        violations.iter().take(10).collect::<Vec<_>>()
    );
    println!("descriptors        {fd_base} before the clients and churn, {fd_after} after (churn stopped, builds idle, clients gone); with clients: start {fd_start}, end {fd_end}; series {fd_series:?}");
    println!(
        "descriptors added  {:?}",
        added(&fd_base_set, &fd_after_set)
    );
    println!("rss MiB            start {:.1}, end {:.1}; first third {rss_first:.1}, last third {rss_last:.1}", rss_start as f64 / 1024.0, rss_end as f64 / 1024.0);
    println!(
        "shutdown           exit {}, {} temp entries left in the cache",
        if exit_ok { "0" } else { "FAILED" },
        tmp_left
    );
    let ok = violations.is_empty() && !fd_leak && exit_ok && tmp_left == 0 && acq > 0;
    println!(
        "verdict            {}{}{}",
        if ok { "PASS" } else { "FAIL" },
        if fd_leak { " (descriptor leak)" } else { "" },
        if rss_growing {
            " (RSS grew by more than half: look at the series)"
        } else {
            ""
        }
    );
    if a.keep.is_none() {
        drop(tmp);
    }
    std::process::exit(if ok { 0 } else { 1 });
}
