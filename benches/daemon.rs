//! Measurement driver for `benches/daemon.sh` (see BENCHMARKS.md). Modes:
//!
//! - `models DIR N` — write N distinct tiny models (flat `mNNNN.onnx`).
//! - `startup TRTCACHE CONFIG` — spawn `trtcache serve`, time spawn → socket answering
//!   `hello` (READY is sent at the same point), wait until every model is ready, print idle
//!   RSS, stop it with SIGTERM. Prints one JSON line.
//! - `latency SOCKET MODEL CLIENTS PER_CLIENT [HOW]` — CLIENTS connections acquiring a ready
//!   model PER_CLIENT times each; p50/p99 per acquire and acquires/s. HOW is how the load is
//!   driven: `threads` (default; one thread per connection, each sending its next acquire as
//!   soon as the last is answered: saturates the CPUs, so on 2 cores the tail is the
//!   scheduler's time slices among 32+ runnable threads), `poll` (one thread multiplexing
//!   every connection with poll(2), one acquire in flight per connection, as wrk drives HTTP:
//!   the daemon's latency without the client threads' scheduling), or `paced:RATE` (one
//!   thread per connection, acquires sent on a fixed schedule totalling RATE per second;
//!   latency counted from the scheduled send time, so a late send counts against it), or
//!   `index` (one consumer taking the model from the ready index, no socket; CLIENTS is 1).
//! - `stable-to-queued SOCKET MODELS_DIR N` — N times: rename a complete model into the
//!   repository and time until the daemon lists it (queued for planning/building).
//! - `first-inference SOCKET MODEL RAW_MODEL WARM WAY` — one consumer process's time to its
//!   first inference (run this once per process): WAY `via` = connect + acquire + an ort
//!   session from the artifact with optimizations off (the Rust client's `Artifact::session`:
//!   the graph opened in place through the directory descriptor) + one run; `files` = the
//!   same through the per-file descriptors (symlinks to `/proc/self/fd/N`); `own` = an ort
//!   session from the raw model file at full optimization (`GraphOptimizationLevel::All`) +
//!   one run. The ORT environment is created before the clock starts (both ways pay it
//!   alike). WARM is what the process did before, untimed: `none` (its first session), or a
//!   path: a session + run on that model (an unrelated one pays ONNX Runtime's per-process
//!   set-up; the raw model itself also leaves glibc's heap faulted for that model's own
//!   allocations, a head start no first session has: BENCHMARKS.md). Inputs: int64
//!   ids of ones / float 0.5, dynamic dims 1 (batch) and 16. Prints one JSON line.
//! - `bert DIR [small|base]` — write a BERT encoder to `DIR/bert.onnx`: `small` (the default,
//!   `BertConfig::small()`: 4 layers, hidden 256, ~11 M parameters) or `base`
//!   (`BertConfig::base()`: BERT-base's shape, 12 layers, hidden 768, ~110 M parameters).
//!
//! Also driven by `benches/prepack.sh` (`bert`), `benches/ab_acquire.sh` and
//! `benches/ready_many_files.py` (`latency`). A bench target without the test harness: the
//! scripts build it with `cargo build --release --bench daemon` and run
//! `target/release/deps/daemon-<hash>` with a mode.

use std::path::Path;
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, random_f32, tensor_f32, write};
use trtcache_client::{AcquireRequest, Client};

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn acquire_req(model: &str) -> AcquireRequest {
    AcquireRequest {
        model: model.into(),
        wait: false,
        ..Default::default()
    }
}

fn print_latency(clients: usize, how: &str, mut all: Vec<f64>, wall: f64) {
    all.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{{\"clients\":{clients},\"how\":\"{how}\",\"acquires\":{},\"p50_us\":{:.1},\"p99_us\":{:.1},\"max_us\":{:.1},\"acquires_per_s\":{:.0}}}",
        all.len(),
        pct(&all, 0.5),
        pct(&all, 0.99),
        all.last().copied().unwrap_or(f64::NAN),
        all.len() as f64 / wall
    );
}

/// `latency … poll`: every connection driven from one thread with poll(2).
fn latency_poll(
    socket: &str,
    model: &str,
    clients: usize,
    per: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use std::os::fd::AsRawFd;
    use trtcache_client::protocol::{Request, Response};
    let req = Request::Acquire(acquire_req(model));
    let mut conns = (0..clients)
        .map(|_| Client::connect(socket))
        .collect::<Result<Vec<_>, _>>()?;
    let mut sent = vec![Instant::now(); clients];
    let mut left = vec![per; clients];
    let mut all = Vec::with_capacity(clients * per);
    let t0 = Instant::now();
    for (i, c) in conns.iter_mut().enumerate() {
        sent[i] = Instant::now();
        c.send(&req)?;
    }
    let mut fds: Vec<libc::pollfd> = conns
        .iter()
        .map(|c| libc::pollfd {
            fd: c.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while left.iter().any(|&n| n > 0) {
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10_000) };
        if n < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        if n == 0 {
            return Err("no answer from the daemon within 10 s".into());
        }
        for i in 0..clients {
            if fds[i].revents == 0 {
                continue;
            }
            fds[i].revents = 0;
            let (resp, descriptors) = conns[i].recv()?;
            all.push(sent[i].elapsed().as_secs_f64() * 1e6);
            drop(descriptors);
            if !matches!(resp, Response::Artifact { .. }) {
                return Err(format!("unexpected answer {resp:?}").into());
            }
            left[i] -= 1;
            if left[i] > 0 {
                sent[i] = Instant::now();
                conns[i].send(&req)?;
            } else {
                fds[i].events = 0;
            }
        }
    }
    print_latency(clients, "poll", all, t0.elapsed().as_secs_f64());
    Ok(())
}

/// `latency … threads` (`rate` None: each connection sends its next acquire as soon as the
/// last is answered, latency from the send) and `latency … paced:RATE` (each connection sends
/// on a fixed schedule, latency from the scheduled time).
fn latency_threads(
    socket: &str,
    model: &str,
    clients: usize,
    per: usize,
    rate: Option<f64>,
) -> Result<(), Box<dyn std::error::Error>> {
    let interval = rate.map(|r| Duration::from_secs_f64(clients as f64 / r));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(clients));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|k| {
            let (s, m, b) = (socket.to_string(), model.to_string(), barrier.clone());
            std::thread::spawn(move || -> Result<Vec<f64>, String> {
                let mut c = Client::connect(&s).map_err(|e| e.to_string())?;
                let req = acquire_req(&m);
                b.wait();
                // Paced connections are staggered across one interval.
                let start = Instant::now()
                    + interval.map_or(Duration::ZERO, |i| i.mul_f64(k as f64 / clients as f64));
                let mut lat = Vec::with_capacity(per);
                for i in 0..per {
                    let due = match interval {
                        Some(iv) => start + iv.mul_f64(i as f64),
                        None => Instant::now(),
                    };
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let art = c.acquire(&req).map_err(|e| e.to_string())?;
                    lat.push(due.elapsed().as_secs_f64() * 1e6);
                    drop(art);
                }
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().map_err(|_| "client thread panicked")??);
    }
    let how = rate.map_or("threads".to_string(), |r| format!("paced:{r}"));
    print_latency(clients, &how, all, t0.elapsed().as_secs_f64());
    Ok(())
}

/// One consumer taking `model` from the daemon's ready index `per` times (no socket), as
/// `latency ... index` (benches/ready_many_files.py compares it with the socket's).
fn latency_index(socket: &str, model: &str, per: usize) -> Result<(), Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let mut lat = Vec::with_capacity(per);
    for _ in 0..per {
        let s = Instant::now();
        let art = trtcache_client::ready::acquire(Path::new(socket), model)
            .ok_or("the ready index did not answer (no pointer, or a check failed)")?;
        lat.push(s.elapsed().as_secs_f64() * 1e6);
        drop(art);
    }
    print_latency(1, "index", lat, t0.elapsed().as_secs_f64());
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_none_or(|m| m.starts_with('-')) {
        // `cargo bench` and `cargo test --all-targets` run every bench target, with `--bench`
        // or the test harness's flags and no mode: nothing to measure (benches/daemon.sh
        // drives this one).
        eprintln!("usage: daemon MODE ARGS... (modes: the header of benches/daemon.rs)");
        return Ok(());
    }
    let a = |i: usize| {
        args.get(i)
            .cloned()
            .ok_or("missing argument (see the file's docs)")
    };
    match a(0)?.as_str() {
        "models" => {
            let dir = a(1)?;
            let n: usize = a(2)?.parse()?;
            std::fs::create_dir_all(&dir)?;
            for i in 0..n {
                let mut m = models::tiny_encoder(false);
                if let Some(g) = m.graph.as_mut() {
                    g.initializer[3] =
                        tensor_f32("fc.bias", &[64], &random_f32(1000 + i as u64, 64, 0.1));
                }
                write(&m, &Path::new(&dir).join(format!("m{i:04}.onnx")))?;
            }
        }
        "startup" => {
            let (bin, cfg) = (a(1)?, a(2)?);
            let socket = a(3)?;
            let t0 = Instant::now();
            let mut child = std::process::Command::new(&bin)
                .args(["serve", "--config", &cfg])
                .stderr(std::process::Stdio::null())
                .spawn()?;
            let mut c = loop {
                if let Ok(c) = Client::connect(&socket) {
                    break c;
                }
                if t0.elapsed() > Duration::from_secs(60) {
                    return Err("daemon did not come up".into());
                }
                std::thread::sleep(Duration::from_micros(500));
            };
            let ready_ms = t0.elapsed().as_secs_f64() * 1000.0;
            let settle = Instant::now();
            let n = loop {
                let l = c.list()?;
                let pending = l
                    .iter()
                    .filter(|m| {
                        m.variants
                            .iter()
                            .any(|v| v.state != trtcache_client::VariantState::Ready)
                    })
                    .count();
                if pending == 0 {
                    break l.len();
                }
                if settle.elapsed() > Duration::from_secs(600) {
                    return Err("models did not settle".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let settled_ms = t0.elapsed().as_secs_f64() * 1000.0;
            let stats = c.stats()?;
            drop(c);
            std::thread::sleep(Duration::from_millis(500));
            let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()))?;
            let rss_kb: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            child.wait()?;
            println!(
                "{{\"ready_ms\":{ready_ms:.1},\"settled_ms\":{settled_ms:.1},\"models\":{n},\"builds\":{},\"idle_rss_mb\":{:.1}}}",
                stats.builds,
                rss_kb as f64 / 1024.0
            );
        }
        "latency" => {
            let (socket, model) = (a(1)?, a(2)?);
            let clients: usize = a(3)?.parse()?;
            let per: usize = a(4)?.parse()?;
            let how = args.get(5).cloned().unwrap_or_else(|| "threads".into());
            if how == "poll" {
                return latency_poll(&socket, &model, clients, per);
            }
            if how == "index" {
                return latency_index(&socket, &model, per);
            }
            if let Some(rate) = how.strip_prefix("paced:") {
                return latency_threads(&socket, &model, clients, per, Some(rate.parse()?));
            }
            latency_threads(&socket, &model, clients, per, None)?;
        }
        "bert" => {
            use trtcache::fixtures::bert::{bert, BertConfig};
            let dir = Path::new(&a(1)?).to_path_buf();
            std::fs::create_dir_all(&dir)?;
            let cfg = match args.get(2).map(String::as_str) {
                None | Some("small") => BertConfig::small(),
                Some("base") => BertConfig::base(),
                Some(other) => return Err(format!("bert size {other:?}: small or base").into()),
            };
            write(&bert(cfg), &dir.join("bert.onnx"))?;
        }
        "first-inference" => {
            // One measurement per process: a consumer process's first inference.
            let (socket, model, raw, warm, way) = (a(1)?, a(2)?, a(3)?, a(4)?, a(5)?);
            let dylib = std::env::var("ORT_DYLIB_PATH")?;
            let env = ort::init_from(&dylib)?.build()?;
            // ort logs at VERBOSE by default (ONNX Runtime formats every verbose message for
            // tracing to drop); a deployed consumer, like ONNX Runtime's own default and the
            // Python package, logs warnings.
            env.set_log_level(ort::logging::LogLevel::Warning);
            let run = |s: &mut ort::session::Session| -> Result<(), Box<dyn std::error::Error>> {
                let mut inputs: Vec<(String, ort::value::DynValue)> = Vec::new();
                for inp in s.inputs() {
                    let ort::value::ValueType::Tensor { ty, shape, .. } = inp.dtype() else {
                        return Err("non-tensor input".into());
                    };
                    let dims: Vec<usize> = shape
                        .iter()
                        .enumerate()
                        .map(|(i, &d)| match (d, i) {
                            (d, _) if d > 0 => d as usize,
                            (_, 0) => 1,
                            _ => 16,
                        })
                        .collect();
                    let n: usize = dims.iter().product();
                    let v: ort::value::DynValue = match ty {
                        ort::value::TensorElementType::Int64 => {
                            ort::value::Tensor::from_array((dims, vec![1i64; n]))?.into_dyn()
                        }
                        _ => ort::value::Tensor::from_array((dims, vec![0.5f32; n]))?.into_dyn(),
                    };
                    inputs.push((inp.name().to_string(), v));
                }
                s.run(inputs)?;
                Ok(())
            };
            // What the process did before its first inference, untimed (see the module
            // docs): `none`, or a session on the model at this path (an unrelated model, or
            // the raw model itself).
            if warm != "none" {
                let mut s = ort::session::Session::builder(&env)?.commit_from_file(&warm)?;
                run(&mut s)?;
            }
            let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
            let t = Instant::now();
            let (acquired, mut s) = match way.as_str() {
                // The client's default: the graph opened in place through the artifact
                // directory's descriptor; `files`: through the per-file descriptors.
                "via" | "files" => {
                    let mut c = Client::connect(&socket)?;
                    let art = c.acquire_model(&model)?;
                    let acquired = ms(t);
                    let mut b = ort::session::Session::builder(&env)?.with_optimization_level(
                        ort::session::builder::GraphOptimizationLevel::Disable,
                    )?;
                    let s = if way == "via" {
                        if art.dir_graph_path().is_none() {
                            return Err("the artifact's directory is not usable in place".into());
                        }
                        art.session(&mut b)?
                    } else {
                        art.session_from_files(&mut b)?
                    };
                    (acquired, s)
                }
                "own" => (
                    0.0,
                    ort::session::Session::builder(&env)?
                        .with_optimization_level(
                            ort::session::builder::GraphOptimizationLevel::All,
                        )?
                        .commit_from_file(&raw)?,
                ),
                other => return Err(format!("way {other:?}: via, files or own").into()),
            };
            let opened = ms(t);
            let t2 = Instant::now();
            run(&mut s)?;
            let total = ms(t);
            // The core the process ended on (the 2-core VM's cores differ; BENCHMARKS.md).
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() };
            println!(
                "{{\"way\":\"{way}\",\"model\":\"{model}\",\"total_ms\":{total:.2},\"acquire_ms\":{acquired:.2},\"session_ms\":{:.2},\"run_ms\":{:.2},\"cpu\":{cpu}}}",
                opened - acquired,
                ms(t2),
            );
        }
        "stable-to-queued" => {
            // Write a model under a hidden name, rename it in (the file is complete and
            // stable from that instant), and time until the daemon lists it.
            let (socket, dir) = (a(1)?, a(2)?);
            let n: usize = a(3)?.parse()?;
            let mut c = Client::connect(&socket)?;
            for i in 0..n {
                let name = format!("sq{}x{i}", std::process::id());
                let mut m = models::tiny_encoder(false);
                if let Some(g) = m.graph.as_mut() {
                    g.initializer[3] =
                        tensor_f32("fc.bias", &[64], &random_f32(7000 + i as u64, 64, 0.1));
                }
                let tmp = Path::new(&dir).join(format!(".{name}.tmp"));
                write(&m, &tmp)?;
                std::fs::rename(&tmp, Path::new(&dir).join(format!("{name}.onnx")))?;
                let t = Instant::now();
                loop {
                    if c.list()?.iter().any(|m| m.name == name) {
                        break;
                    }
                    if t.elapsed() > Duration::from_secs(30) {
                        return Err("model never listed".into());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                println!(
                    "{{\"stable_to_queued_ms\":{:.1}}}",
                    t.elapsed().as_secs_f64() * 1000.0
                );
            }
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    Ok(())
}
