//! In-process scaling of the capability analysis (no process start, no JSON):
//!
//! * `split` alone on synthetic DAGs of 10k–80k nodes, including the worst case for cycle
//!   checks (TensorRT and CPU nodes alternating, so every other node starts a new subgraph) —
//!   shows the grouping is linear where pairwise merge-and-check would be quadratic;
//! * `analyse` on the generated `chain` and `varied` models of 10k/20k/40k nodes.
//!
//! ```text
//! cargo bench --bench capability            # RUNS=7 by default
//! ```

use std::time::{Duration, Instant};

use trtcache::analysis::partition::{order_from_preds, split, SplitInput};
use trtcache::analysis::{analyse, Options};
use trtcache::fixtures::{capability, models, write};
use trtcache::onnx::Model;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<F: FnMut()>(runs: usize, mut f: F) -> Duration {
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

/// Predecessors and TensorRT claims of a synthetic graph.
fn synthetic(kind: &str, n: usize) -> (Vec<Vec<usize>>, Vec<bool>) {
    let mut s: u64 = 7;
    let mut rnd = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    let preds: Vec<Vec<usize>> = (0..n)
        .map(|i| match kind {
            "random" if i > 0 => (0..2).map(|_| i - 1 - rnd() % i.min(16)).collect(),
            _ if i > 0 => vec![i - 1],
            _ => vec![],
        })
        .collect();
    let trt = (0..n)
        .map(|i| match kind {
            "alternating" => i % 2 == 0,
            "random" => rnd() % 10 != 0,
            _ => true,
        })
        .collect();
    (preds, trt)
}

fn main() {
    // `cargo test --all-targets` runs this binary without `--bench`: a quick smoke run only.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let scale = if smoke { 100 } else { 1 };
    let runs: usize = if smoke {
        1
    } else {
        std::env::var("RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(7)
    };
    println!("runs per point: {runs} (median)");
    println!("\nsplit() alone");
    println!(
        "{:<12} {:>7} {:>10} {:>12}",
        "graph", "nodes", "ms", "vs half n"
    );
    for kind in ["chain", "alternating", "random"] {
        let mut prev = None;
        for n in [10_000, 20_000, 40_000, 80_000] {
            let n = n / scale;
            let (preds, trt) = synthetic(kind, n);
            let (order, _) = order_from_preds(&preds);
            let claims: Vec<Vec<usize>> = trt
                .iter()
                .map(|&t| if t { vec![0, 2] } else { vec![2] })
                .collect();
            let input = SplitInput {
                preds: &preds,
                order: &order,
                claims: &claims,
                trt: Some(0),
                min_subgraph_size: 1,
                max_iterations: 1000,
            };
            let d = time(runs, || {
                std::hint::black_box(split(&input));
            });
            let ratio = prev.map_or(String::new(), |p: Duration| {
                format!("{:.2}", d.as_secs_f64() / p.as_secs_f64())
            });
            println!(
                "{kind:<12} {n:>7} {:>10.2} {ratio:>12}",
                d.as_secs_f64() * 1e3
            );
            prev = Some(d);
        }
    }
    println!("\nanalyse() on generated models (load excluded)");
    println!(
        "{:<12} {:>7} {:>10} {:>12}",
        "model", "nodes", "ms", "vs half n"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    for kind in ["chain", "varied"] {
        let mut prev = None;
        for n in [10_000, 20_000, 40_000] {
            let n = n / scale;
            let m = match kind {
                "chain" => models::long_chain(n),
                _ => capability::varied(n, 50),
            };
            let p = dir.path().join(format!("{kind}_{n}.onnx"));
            write(&m, &p).expect("write model");
            let model = Model::load(&p).expect("load model");
            let opts = Options::default();
            let d = time(runs, || {
                std::hint::black_box(analyse(&model, &opts).expect("analysis"));
            });
            let ratio = prev.map_or(String::new(), |p: Duration| {
                format!("{:.2}", d.as_secs_f64() / p.as_secs_f64())
            });
            let nodes = model.graph().node.len();
            println!(
                "{kind:<12} {nodes:>7} {:>10.2} {ratio:>12}",
                d.as_secs_f64() * 1e3
            );
            prev = Some(d);
        }
    }
}
