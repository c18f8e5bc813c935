//! The daemon's own CPU time per build against the size of its repository and cache (issue
//! 39: it grew with every model and entry). For each size N: a model folder of N models and
//! a cache of N entries besides them, a daemon on it (`BIN serve`), then ROUNDS rounds of 4 builds of
//! new small models (each written under a hidden name and renamed in, as a deploy does;
//! acquired with `wait` once the daemon lists it). A round's cost is the daemon's utime +
//! stime (`/proc/PID/stat`, 10 ms ticks: hence 4 builds a round) from before the models are
//! written until the daemon is idle again after their builds (the ready index written, the watcher's second look done), so it holds
//! everything the build made the daemon do: the watcher's scans, planning, the lookup, the
//! queue, storing, the ready index. The build's worker process is not the daemon (its CPU is
//! printed apart, `worker_ms`, from the daemon's reaped children).
//!
//! How the N are made, fast: the N models are one small graph (`Add` of a constant) under N
//! names (N files, each planned and hashed at the daemon's start; one key, so one build),
//! and the N entries are records synthesised through the store's API (`SledStore::put` of a
//! 64-byte staged artifact each, as `store_scale` does; no model names them). Building N
//! distinct models through ONNX Runtime would take hours at 100,000. Periodic full passes are
//! off (`rescan_secs = 0`, `ready_recheck_secs = 0`): they cost per minute, not per build.
//!
//! `build_scale BIN DIR SIZES ROUNDS` (SIZES comma-separated); one JSON line per size.
//! benches/build_scale.sh wraps it (ONNX Runtime's environment, a tmpfs folder).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use trtcache::cache::{Record, SledStore, StagedArtifact, Store, StoreOptions};
use trtcache::fixtures::{model, tensor_f32, write, GraphBuilder};
use trtcache::onnx::ElemType::Float32;
use trtcache_client::{AcquireRequest, Client};

type Error = Box<dyn std::error::Error>;

/// Models written at once per round: the CPU clock counts 10 ms ticks, so a round's time is
/// divided over several builds.
const BATCH: usize = 4;

/// `y = x + c` with `c` all `k`: a model ONNX Runtime builds in milliseconds.
fn small(k: f32) -> trtcache::onnx::proto::ModelProto {
    let mut g = GraphBuilder::new("add");
    g.input("x", Float32, &[4.into()])
        .output("y", Float32, Some(&[4.into()]))
        .init(tensor_f32("c", &[4], &[k; 4]));
    g.node("Add", &["x", "c"], &["y"]);
    model(g.build(), &[("", 17)])
}

/// A cache record no model names, with a 64-byte artifact of its own.
fn record(n: u64) -> Record {
    trtcache::fixtures::synthetic_record(n, 0xb5)
}

fn fill_cache(cache: &Path, stage: &Path, n: u64) -> Result<(), Error> {
    let s = SledStore::open(
        cache,
        StoreOptions {
            max_bytes: Some(u64::MAX / 2),
        },
    )?;
    for i in 0..n {
        let dir = stage.join(i.to_string());
        std::fs::create_dir_all(&dir)?;
        let mut bytes = [0u8; 64];
        bytes[..8].copy_from_slice(&i.to_le_bytes());
        std::fs::write(dir.join("model.onnx"), bytes)?;
        let a = StagedArtifact {
            dir: dir.clone(),
            entry: "model.onnx".into(),
            files: vec!["model.onnx".into()],
            rewrites: Vec::new(),
        };
        s.put(record(i), Some(&a))?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    s.flush()?;
    Ok(())
}

/// The process's user + system CPU (clock ticks), its reaped children's apart.
fn cpu_ticks(pid: u32) -> Result<(u64, u64), Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces), which ends at the last ')'.
    let rest = &stat[stat.rfind(')').ok_or("bad stat")? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| -> Result<u64, Error> { Ok(f.get(i).ok_or("short stat")?.parse()?) };
    // utime, stime, cutime, cstime are fields 14–17 (1-based), 11–14 here.
    Ok((n(11)? + n(12)?, n(13)? + n(14)?))
}

fn tick_ms() -> f64 {
    // SAFETY: sysconf has no preconditions.
    1000.0 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Waits until the daemon used at most 1 tick over `window` (idle: its work is done).
fn wait_idle(pid: u32, window: Duration, limit: Duration) -> Result<(), Error> {
    let t0 = Instant::now();
    let mut last = cpu_ticks(pid)?.0;
    loop {
        std::thread::sleep(window);
        let now = cpu_ticks(pid)?.0;
        if now <= last + 1 {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err("the daemon never went idle".into());
        }
        last = now;
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn one_size(bin: &str, dir: &Path, n: u64, rounds: usize) -> Result<String, Error> {
    let (models, cache) = (dir.join("models"), dir.join("cache"));
    std::fs::create_dir_all(&models)?;
    let t0 = Instant::now();
    let graph = {
        let p = dir.join("bg.onnx");
        write(&small(0.0), &p)?;
        std::fs::read(&p)?
    };
    for i in 0..n {
        std::fs::write(models.join(format!("bg{i:06}.onnx")), &graph)?;
    }
    fill_cache(&cache, &dir.join("stage"), n)?;
    let fill_s = t0.elapsed().as_secs_f64();
    let socket = cache.join("trtcache.sock");
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "models = {models:?}\ncache_dir = {cache:?}\nsocket = {socket:?}\n[limits]\ndebounce_ms = 100\nrescan_secs = 0\nready_recheck_secs = 0\nbuild_concurrency = 1\n"
        ),
    )?;
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let mut child: Child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let pid = child.id();
    let run = || -> Result<String, Error> {
        let t0 = Instant::now();
        let mut c = loop {
            if let Ok(c) = Client::connect(&socket) {
                break c;
            }
            if t0.elapsed() > Duration::from_secs(1800) {
                return Err("the daemon did not come up".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Settled: every model known, nothing queued or building, the daemon idle.
        loop {
            let s = c.stats()?;
            if s.models == n && s.queue_depth == 0 && s.building == 0 && s.builds >= 1 {
                break;
            }
            if t0.elapsed() > Duration::from_secs(7200) {
                return Err(format!("not settled: {s:?}").into());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        wait_idle(pid, Duration::from_millis(1000), Duration::from_secs(3600))?;
        let start_s = t0.elapsed().as_secs_f64();
        let (mut cpu, mut worker, mut wall) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            let (before, kids_before) = cpu_ticks(pid)?;
            let t = Instant::now();
            let names: Vec<String> = (0..BATCH).map(|b| format!("new{r:03}_{b}")).collect();
            for (b, name) in names.iter().enumerate() {
                let tmp = models.join(format!(".{name}.tmp"));
                write(&small(1.0 + (r * BATCH + b) as f32), &tmp)?;
                std::fs::rename(&tmp, models.join(format!("{name}.onnx")))?;
            }
            for name in &names {
                loop {
                    match c.acquire(&AcquireRequest {
                        model: name.clone(),
                        wait: true,
                        timeout_ms: Some(600_000),
                        ..Default::default()
                    }) {
                        Ok(_) => break,
                        Err(e) if t.elapsed() < Duration::from_secs(900) => {
                            let _ = e;
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) => return Err(format!("{name}: {e}").into()),
                    }
                }
            }
            wall.push(t.elapsed().as_secs_f64() * 1000.0);
            wait_idle(pid, Duration::from_millis(300), Duration::from_secs(600))?;
            let (after, kids_after) = cpu_ticks(pid)?;
            let per = |d: u64| d as f64 * tick_ms() / BATCH as f64;
            cpu.push(per(after - before));
            worker.push(per(kids_after - kids_before));
        }
        // Each round ends with an idle window of 300 ms (at most 1 tick used): included.
        let idle_ms = 300.0 / BATCH as f64;
        Ok(format!(
            "{{\"models\":{},\"entries\":{},\"builds\":{},\"cpu_ms_per_build\":{:.1},\"cpu_ms_min\":{:.1},\"cpu_ms_max\":{:.1},\"worker_ms\":{:.1},\"wall_ms\":{:.0},\"idle_window_ms\":{idle_ms},\"fill_s\":{fill_s:.1},\"start_s\":{start_s:.1}}}",
            n,
            n + 1,
            rounds * BATCH,
            median(&mut cpu.clone()),
            cpu.iter().cloned().fold(f64::MAX, f64::min),
            cpu.iter().cloned().fold(0.0, f64::max),
            median(&mut worker),
            median(&mut wall),
        ))
    };
    let out = run();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = child.wait();
    out
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.len() < 4 {
        // `cargo bench` runs every bench without arguments: this one needs a daemon binary
        // and a folder, which benches/build_scale.sh gives it.
        eprintln!("usage: build_scale BIN DIR SIZES ROUNDS (see benches/build_scale.sh)");
        return Ok(());
    }
    let (bin, base) = (&args[0], PathBuf::from(&args[1]));
    let rounds: usize = args[3].parse()?;
    for size in args[2].split(',') {
        let n: u64 = size.parse()?;
        let dir = base.join(format!("n{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let line = one_size(bin, &dir, n, rounds);
        let _ = std::fs::remove_dir_all(&dir);
        println!("{}", line?);
    }
    Ok(())
}
