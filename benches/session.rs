//! Session-creation benchmark: a CPU session from the cached `ort-cpu` artifact (optimized
//! graph + prepacked initializers, opened with optimizations off) against a session from the
//! raw model at full optimization (what a user would otherwise do), on BERT-like encoders, the
//! 20,000-node chain and a ~20,000-node export-style transformer (`bert::bert_exported`,
//! hidden 64, as many layers as reach 20,000 nodes). Medians of N runs in this one process;
//! prints a Markdown table with the node counts of the raw model and of the artifact.
//!
//! The `-fixed` cases build the dynamic model with a fixed-shape profile (min = opt = max), which
//! the `ort-cpu` backend bakes into the artifact; the raw model keeps its dynamic inputs, as a
//! user would open it. The `-static` case is the comparison with the dims fixed on both sides.
//!
//! `cargo bench --bench session -- [--runs N] [--base] [--threads N] [--dir DIR]
//! [--opt-level extended,all] [--cases bert,bert-fixed,base,chain,bert20k,bert20k-static,bert20k-fixed]
//! [--bert-nodes 20000]` (benches/session.sh wraps it with the ONNX Runtime environment).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ort::session::builder::GraphOptimizationLevel;
use trtcache::builder::ort::open_raw;
use trtcache::builder::{runtime, BuildJob, Builder, OptLevel, Progress};
use trtcache::cache::{SledStore, StoreOptions};
use trtcache::fixtures::{bert, models, write, write_external};
use trtcache::onnx::proto::ModelProto;
use trtcache::plan::ShapeProfile;

fn node_count(m: &ModelProto) -> usize {
    m.graph.as_ref().map_or(0, |g| g.node.len())
}

/// Fixes the named `batch` and `seq` dims of the graph inputs and outputs (an export with
/// static shapes, as for TensorRT).
fn fix_dims(m: &mut ModelProto, batch: i64, seq: i64) {
    use trtcache::onnx::proto::{tensor_shape_proto::dimension::Value as Dim, type_proto};
    let Some(g) = m.graph.as_mut() else { return };
    for vi in g.input.iter_mut().chain(g.output.iter_mut()) {
        let Some(type_proto::Value::TensorType(t)) =
            vi.r#type.as_mut().and_then(|t| t.value.as_mut())
        else {
            continue;
        };
        for d in t.shape.iter_mut().flat_map(|s| s.dim.iter_mut()) {
            match &d.value {
                Some(Dim::DimParam(p)) if p == "batch" => d.value = Some(Dim::DimValue(batch)),
                Some(Dim::DimParam(p)) if p == "seq" => d.value = Some(Dim::DimValue(seq)),
                _ => {}
            }
        }
    }
}

/// The export-style encoder (hidden 64, 2 heads, intermediate 128, vocabulary 1000) with as
/// many layers as bring it closest to `target` nodes.
fn bert_20k(target: usize) -> (ModelProto, usize) {
    let cfg = bert::BertConfig::narrow;
    let one = node_count(&bert::bert_exported(cfg(1)));
    let per = node_count(&bert::bert_exported(cfg(2))) - one;
    let fixed = one - per;
    let layers = ((target.saturating_sub(fixed) as f64) / per as f64).round() as usize;
    (bert::bert_exported(cfg(layers)), layers)
}

/// The profile that fixes `input_ids` and `attention_mask` to `[batch, seq]`.
fn fixed_profile(batch: i64, seq: i64) -> ShapeProfile {
    let shapes: std::collections::BTreeMap<String, Vec<i64>> = ["input_ids", "attention_mask"]
        .iter()
        .map(|n| (n.to_string(), vec![batch, seq]))
        .collect();
    ShapeProfile {
        name: format!("fixed_{batch}x{seq}"),
        min: shapes.clone(),
        opt: shapes.clone(),
        max: shapes,
    }
}

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
    let wanted = get("--cases")
        .unwrap_or_else(|| "bert,bert-fixed,chain,bert20k,bert20k-static,bert20k-fixed".into());
    let want = |c: &str| wanted.split(',').any(|w| w == c);
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

    let mut cases: Vec<(String, PathBuf, Option<ShapeProfile>)> = Vec::new();
    if want("bert") || want("bert-fixed") {
        let small = dir.join("bert_small.onnx");
        write(&bert::bert(bert::BertConfig::small()), &small)?;
        if want("bert") {
            cases.push(("BERT-like 4 layers, hidden 256".into(), small.clone(), None));
        }
        if want("bert-fixed") {
            cases.push((
                "BERT-like 4 layers, hidden 256, profile fixed at [1, 16]".into(),
                small,
                Some(fixed_profile(1, 16)),
            ));
        }
    }
    if with_base || want("base") {
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
            None,
        ));
    }
    if want("chain") {
        let chain = dir.join("long_chain_20000.onnx");
        write(&models::long_chain(20_000), &chain)?;
        cases.push(("long chain, 20,000 nodes".into(), chain, None));
    }
    for case in ["bert20k", "bert20k-static", "bert20k-fixed"] {
        if !want(case) {
            continue;
        }
        let target = get("--bert-nodes")
            .and_then(|s| s.parse().ok())
            .unwrap_or(20_000);
        let (mut m, layers) = bert_20k(target);
        let mut name =
            format!("export-style BERT-like {layers} layers, hidden 64, ~{target} nodes");
        let (p, profile) = match case {
            "bert20k-static" => {
                fix_dims(&mut m, 1, 128);
                name.push_str(", static [1, 128]");
                (dir.join("bert_exported_20k_static.onnx"), None)
            }
            "bert20k-fixed" => {
                name.push_str(", dynamic [batch, seq], profile fixed at [1, 128]");
                (
                    dir.join("bert_exported_20k.onnx"),
                    Some(fixed_profile(1, 128)),
                )
            }
            _ => {
                name.push_str(", dynamic [batch, seq]");
                (dir.join("bert_exported_20k.onnx"), None)
            }
        };
        write(&m, &p)?;
        cases.push((name, p, profile));
    }

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
    println!("| model | artifact opt level | nodes raw → artifact | raw model, optimization All (ms) | cached artifact, optimizations off (ms) | speed-up | build (ms) | validation |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, path, profile) in &cases {
        for level in &levels {
            let mut req = BuildJob::new(path, trtcache::spec::Backend::OrtCpu);
            req.options.threads = threads;
            req.options.profile = profile.clone();
            req.options.opt_level = *level;
            let quiet = |_: &Progress| {};
            let out = builder.build(&req, &quiet)?;
            let served = out
                .served
                .ok_or_else(|| format!("{name}: not servable: {:?}", out.unservable))?;
            let entry: &Path = &served.entry;
            let nodes_raw = node_count(&trtcache::onnx::Model::load(path)?.proto);
            let nodes_art = node_count(&trtcache::onnx::Model::load(entry)?.proto);
            let opts = req.options.clone();
            let backend = trtcache::builder::backend(trtcache::spec::Backend::OrtCpu);
            // Warm the page cache and ORT's lazy init once for both.
            drop(open_raw(rt, path, GraphOptimizationLevel::All, threads)?);
            drop(backend.open(rt, entry, &opts)?);
            let mut raw = Vec::new();
            let mut cached = Vec::new();
            for _ in 0..runs {
                raw.push(time_ms(&mut || {
                    drop(
                        open_raw(rt, path, GraphOptimizationLevel::All, threads)
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
                "| {name} | {} | {nodes_raw} → {nodes_art} | {r:.1} | {c:.1} | {:.1}x | {} | {} |",
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
