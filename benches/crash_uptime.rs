//! The daemon across many crashing build workers (`benches/crash_uptime.sh`, RELIABILITY.md):
//! N distinct models whose validation allocates 1 GB beside one good model, served by one
//! `trtcache serve` whose workers are bounded to 512 MiB, so every one of the N builds ends
//! with its worker killed by SIGABRT. Then: the daemon is the same process, answers `status`
//! and serves the good model, no worker is left, and its RSS and descriptors.
//!
//! `crash_uptime TRTCACHE ORT_DYLIB DIR [N]` (N default 100). Prints one JSON line.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trtcache::fixtures::{models, write};
use trtcache_client::protocol::{AcquireRequest, VariantState};
use trtcache_client::Client;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |r| r.count())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_none_or(|a| a.starts_with('-')) {
        // `cargo bench` and `cargo test --all-targets` run every bench target, with `--bench`
        // or the test harness's flags: nothing to run (benches/crash_uptime.sh drives this one).
        eprintln!("usage: crash_uptime TRTCACHE ORT_DYLIB DIR [N] (see benches/crash_uptime.sh)");
        return;
    }
    if args.len() < 4 {
        eprintln!("usage: crash_uptime TRTCACHE ORT_DYLIB DIR [N]");
        std::process::exit(2);
    }
    let (bin, ort, dir) = (
        PathBuf::from(&args[1]),
        PathBuf::from(&args[2]),
        PathBuf::from(&args[3]),
    );
    let n: usize = args.get(4).map_or(100, |v| v.parse().unwrap());
    let repo = dir.join("models");
    std::fs::create_dir_all(&repo).unwrap();
    write(&models::tiny_encoder(false), &repo.join("good.onnx")).unwrap();
    for i in 0..n {
        let mut m = models::big_fixed_input();
        m.doc_string = format!("crashing variant {i}");
        write(&m, &repo.join(format!("crash{i:03}.onnx"))).unwrap();
    }
    let socket = dir.join("trtcache.sock");
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "models = {:?}\ncache_dir = {:?}\nsocket = {:?}\nort_library = {:?}\n[limits]\nbuild_concurrency = 1\nworker_memory_bytes = 536870912\n",
            repo,
            dir.join("cache"),
            socket,
            ort
        ),
    )
    .unwrap();
    let mut child = Command::new(&bin)
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let t0 = Instant::now();
    let mut c = loop {
        if let Ok(c) = Client::connect(&socket) {
            break c;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let (rss0, fds0) = (rss_kib(pid), fds(pid));
    let started = Instant::now();
    let list = loop {
        let l = c.list().unwrap();
        let settled = l.len() == n + 1
            && l.iter().all(|m| {
                !m.variants.is_empty()
                    && m.variants
                        .iter()
                        .all(|v| matches!(v.state, VariantState::Ready | VariantState::Failed))
            });
        if settled {
            break l;
        }
        assert!(child.try_wait().unwrap().is_none(), "the daemon died");
        std::thread::sleep(Duration::from_millis(200));
    };
    let secs = started.elapsed().as_secs_f64();
    let killed = list
        .iter()
        .filter(|m| m.name.starts_with("crash"))
        .filter(|m| {
            m.variants.iter().any(|v| {
                v.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("killed by SIGABRT"))
            })
        })
        .count();
    let alive = child.try_wait().unwrap().is_none();
    let status = Command::new(&bin)
        .args(["status", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let served = c
        .acquire(&AcquireRequest {
            model: "good".into(),
            ..Default::default()
        })
        .is_ok();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .trim()
        .to_string();
    let (rss1, fds1) = (rss_kib(pid), fds(pid));
    drop(c);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let exit = child.wait().unwrap();
    println!(
        "{{\"models\":{n},\"workers_killed_by_sigabrt\":{killed},\"seconds\":{secs:.1},\"daemon_alive\":{alive},\"same_pid\":true,\"status_rc\":{},\"good_served\":{served},\"workers_left\":{:?},\"rss_kib_before\":{rss0},\"rss_kib_after\":{rss1},\"fds_before\":{fds0},\"fds_after\":{fds1},\"sigterm_exit\":{}}}",
        status.status.code().unwrap_or(-1),
        children,
        exit.code().unwrap_or(-1)
    );
}
