//! Session-creation benchmark: a CPU session from the cached `ort-cpu` artifact (optimized
//! graph + prepacked initializers, opened with optimizations off) against a session from the
//! raw model at full optimization (what a user would otherwise do), on BERT-like encoders and
//! the 20,000-node chain. Medians of N runs in this one process; prints a Markdown table.
//!
//! `cargo bench --bench session -- [--runs N] [--base] [--threads N] [--dir DIR]`
//! (benches/session.sh wraps it with the ONNX Runtime environment).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ort::session::builder::GraphOptimizationLevel;
use trtcache::build::{cpu, runtime, BuildRequest, Builder, OptLevel};
use trtcache::cache::{SledStore, StoreOptions};
use trtcache::fixtures::{bert, models, write, write_external};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn time_ms(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs bench binaries without `--bench`: nothing to do.
        return Ok(());
    }
    let get = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let runs: usize = get("--runs").and_then(|s| s.parse().ok()).unwrap_or(7);
    let threads: usize = get("--threads").and_then(|s| s.parse().ok()).unwrap_or(0);
    let with_base = args.iter().any(|a| a == "--base");
    let levels: Vec<OptLevel> = get("--opt-level")
        .unwrap_or_else(|| "extended,all".into())
        .split(',')
        .map(|s| OptLevel::parse(s).ok_or_else(|| format!("--opt-level: `{s}`")))
        .collect::<Result<_, _>>()?;
    let keep = get("--dir").map(PathBuf::from);
    let tmp = tempfile::tempdir()?;
    let dir = keep.unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;

    let rt = runtime::load(None)?;
    let store = Arc::new(SledStore::open(
        &dir.join("cache"),
        StoreOptions::default(),
    )?);
    let builder = Builder::new(store, None);

    let mut cases: Vec<(String, PathBuf)> = Vec::new();
    let small = dir.join("bert_small.onnx");
    write(&bert::bert(bert::BertConfig::small()), &small)?;
    cases.push(("BERT-like 4 layers, hidden 256".into(), small));
    if with_base {
        let d = dir.join("bert_base");
        std::fs::create_dir_all(&d)?;
        let p = d.join("model.onnx");
        write_external(
            &bert::bert(bert::BertConfig::base()),
            &p,
            "model.onnx.data",
            1024,
        )?;
        cases.push((
            "BERT-base-like 12 layers, hidden 768 (external data)".into(),
            p,
        ));
    }
    let chain = dir.join("long_chain_20000.onnx");
    write(&models::long_chain(20_000), &chain)?;
    cases.push(("long chain, 20,000 nodes".into(), chain));

    println!(
        "ONNX Runtime {} ({}), {runs} runs each, intra-op threads: {}\n",
        rt.version,
        rt.path.display(),
        if threads == 0 {
            "ORT default".to_string()
        } else {
            threads.to_string()
        }
    );
    println!("| model | artifact opt level | raw model, optimization All (ms) | cached artifact, optimizations off (ms) | speed-up | build (ms) | validation |");
    println!("|---|---|---|---|---|---|---|");
    for (name, path) in &cases {
        for level in &levels {
            let mut req = BuildRequest::new(path, "ort-cpu");
            req.options.threads = threads;
            req.options.opt_level = *level;
            let quiet = |_: &str| {};
            let out = builder.build(&req, &quiet)?;
            let served = out
                .served
                .ok_or_else(|| format!("{name}: not servable: {:?}", out.unservable))?;
            let entry: &Path = &served.entry;
            let opts = req.options.clone();
            let backend = trtcache::build::backend("ort-cpu")?;
            // Warm the page cache and ORT's lazy init once for both.
            drop(cpu::open_raw(
                rt,
                path,
                GraphOptimizationLevel::All,
                threads,
            )?);
            drop(backend.open(rt, entry, &opts)?);
            let mut raw = Vec::new();
            let mut cached = Vec::new();
            for _ in 0..runs {
                raw.push(time_ms(&mut || {
                    drop(
                        cpu::open_raw(rt, path, GraphOptimizationLevel::All, threads)
                            .expect("raw session"),
                    )
                }));
                cached.push(time_ms(&mut || {
                    drop(backend.open(rt, entry, &opts).expect("cached session"))
                }));
            }
            let (r, c) = (median(raw), median(cached));
            let v = out.record.validation.as_ref();
            println!(
                "| {name} | {} | {r:.1} | {c:.1} | {:.1}x | {} | {} |",
                level.name(),
                r / c,
                out.record.build_ms,
                v.map(|v| format!(
                    "{} (max abs {:.1e})",
                    if v.passed { "passed" } else { "FAILED" },
                    v.outputs.iter().map(|o| o.max_abs).fold(0.0, f64::max)
                ))
                .unwrap_or_default()
            );
        }
    }
    Ok(())
}
