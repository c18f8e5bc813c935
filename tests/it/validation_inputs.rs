//! The default validation inputs through the binary (issue 41): realistic sizes before
//! degenerate ones, shown in `build --json`; a candidate over the byte budget skipped, not
//! the end of the search; sizes the weights fix found past Casts at the end of the node
//! list (onnxruntime.transformers' float16 with `keep_io_types`).

use std::path::Path;

use serde_json::Value;
use trtcache::fixtures::{attr, model, tensor_f32, tensor_i64, write, GraphBuilder, D};
use trtcache::onnx::ElemType::Float32;

use crate::support::{json, trtcache};

fn build_json(m: &Path, cache: &Path) -> (Value, std::process::Output) {
    let out = trtcache([
        "build".as_ref(),
        m.as_os_str(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
        "--json".as_ref(),
    ]);
    (json(&out), out)
}

fn shapes(v: &Value) -> &Value {
    &v["record"]["validation"]["shapes"]
}

/// A sequence model that takes any size is validated at a batch of 2 and 16 steps, not on
/// one token, and the record says so.
#[test]
fn realistic_sizes_first_and_shown() {
    let mut g = GraphBuilder::new("seq");
    g.input(
        "x",
        Float32,
        &[D::Named("batch"), D::Named("seq"), D::Fixed(8)],
    )
    .output("y", Float32, None);
    g.node("Relu", &["x"], &["y"]);
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("seq.onnx");
    write(&model(g.build(), &[("", 17)]), &m).unwrap();
    let (v, out) = build_json(&m, &d.path().join("c"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(shapes(&v)["x"], serde_json::json!([2, 16, 8]), "{v}");
    // The second run, the batch doubled, in the record and on the terminal.
    assert_eq!(
        v["record"]["validation"]["also_at"]["x"],
        serde_json::json!([4, 16, 8]),
        "{v}"
    );
    let human = trtcache([
        "build".as_ref(),
        m.as_os_str(),
        "--cache-dir".as_ref(),
        d.path().join("c").as_os_str(),
    ]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("shapes x:2x16x8, then x:4x16x8"), "{text}");
}

/// `a: [n, n, n, n]` must be one element and `b: [k]` 640 long: "the rest 224" needs 10 GB
/// and is skipped, and the search goes on to `k 640, the rest 1`.
#[test]
fn a_candidate_over_the_byte_budget_is_skipped() {
    let mut g = GraphBuilder::new("budget");
    g.input(
        "a",
        Float32,
        &[D::Named("n"), D::Named("n"), D::Named("n"), D::Named("n")],
    )
    .input("b", Float32, &[D::Named("k")])
    .init(tensor_i64("one", &[1], &[1]))
    .init(tensor_i64("long", &[1], &[640]))
    .output("y", Float32, None);
    g.node("Reshape", &["a", "one"], &["ra"]);
    g.node("Reshape", &["b", "long"], &["rb"]);
    g.node("Add", &["ra", "rb"], &["y"]);
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("budget.onnx");
    write(&model(g.build(), &[("", 17)]), &m).unwrap();
    let (v, out) = build_json(&m, &d.path().join("c"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(shapes(&v)["a"], serde_json::json!([1, 1, 1, 1]), "{v}");
    assert_eq!(shapes(&v)["b"], serde_json::json!([640]), "{v}");
}

/// onnxruntime.transformers' float16 with `keep_io_types=True` appends the input's Cast at
/// the end of the node list: the channels the Conv's weights fix (3) are still found.
#[test]
fn weights_fix_sizes_past_a_cast_at_the_end() {
    let free = [D::Unknown, D::Unknown, D::Unknown, D::Unknown];
    let mut g = GraphBuilder::new("keepio");
    g.input("pixel_values", Float32, &free)
        .init(tensor_f32("K", &[4, 3, 3, 3], &[0.25; 108]))
        .output("y", Float32, None);
    g.node("Conv", &["xc", "K"], &["y"]);
    g.node("Cast", &["pixel_values"], &["xc"])
        .attribute
        .push(attr::int("to", 1));
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("keepio.onnx");
    write(&model(g.build(), &[("", 17)]), &m).unwrap();
    let (v, out) = build_json(&m, &d.path().join("c"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(shapes(&v)["pixel_values"][1], 3, "{v}");
}

/// ONNX Runtime itself dying on the original model at the realistic sizes (an int64
/// `i64::MIN / -1` at 16 steps, which the CPU traps: SIGFPE, as 1.31 dies in asr_wespeaker's
/// front end at small sizes) rejects
/// that candidate, not the model: the search goes on to sizes the runtime survives, the
/// record names the crash, and the artifact is validated and served.
#[test]
fn a_runtime_crash_at_one_candidate_moves_the_search_on() {
    let mut g = GraphBuilder::new("divides_min_by_seq_minus_17");
    g.input("x", Float32, &[D::Named("batch"), D::Named("seq")])
        .output("y", Float32, None)
        .init(tensor_i64("one", &[1], &[1]))
        .init(tensor_i64("seventeen", &[1], &[17]))
        .init(tensor_i64("min", &[1], &[i64::MIN]));
    g.node("Shape", &["x"], &["shape"]);
    g.node("Gather", &["shape", "one"], &["seq"]);
    g.node("Sub", &["seq", "seventeen"], &["d"]);
    // i64::MIN / -1 when seq = 16: ONNX Runtime checks for zero, not for this; idiv traps.
    g.node("Div", &["min", "d"], &["q"]);
    g.node("Cast", &["q"], &["qf"])
        .attribute
        .push(attr::int("to", Float32.code() as i64));
    g.node("Mul", &["x", "qf"], &["y"]);
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&model(g.build(), &[("", 17)]), &m).unwrap();
    let (v, out) = build_json(&m, &d.path().join("cache"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(v["state"], "ready", "{v}");
    assert_ne!(shapes(&v)["x"][1], 16, "{v}");
    let rejected = v["record"]["validation"]["rejected"].to_string();
    assert!(
        rejected.contains("realistic") && rejected.contains("SIGFPE"),
        "{rejected}"
    );
    assert!(
        err.contains("ONNX Runtime crashed running the original model at realistic"),
        "{err}"
    );
    // With no candidate to give up (`--validation-crash-retries 0`, the daemon's
    // `limits.validation_crash_retries`), the crash is the build's failure, named.
    let out = trtcache([
        "build".as_ref(),
        m.as_os_str(),
        "--cache-dir".as_ref(),
        d.path().join("strict").as_os_str(),
        "--validation-crash-retries".as_ref(),
        "0".as_ref(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("SIGFPE") && err.contains("ONNX Runtime ran the original model at realistic"),
        "{err}"
    );
}

/// An artifact right at the batch validation found and wrong at twice that batch (what ONNX
/// Runtime 1.31 does with saved prepacked weights it segfaults on at batch 2, here as wrong
/// values): the second validation run, every free batch axis doubled, refuses it, and the
/// record names the shapes of both runs.
#[test]
fn a_second_run_at_a_doubled_batch_catches_an_artifact_right_at_one_batch_only() {
    use trtcache::cache::Status;
    use trtcache::onnx::ElemType::Int64;
    let original = |wrong_above: Option<i64>| {
        let mut g = GraphBuilder::new("relu");
        g.input("x", Float32, &[D::Named("batch"), D::Fixed(8)])
            .output("y", Float32, None);
        match wrong_above {
            None => {
                g.node("Relu", &["x"], &["y"]);
            }
            Some(n) => {
                // y = relu(x) · (1 + (batch > n)): exact up to batch n, twice too large above.
                g.init(tensor_i64("zero", &[1], &[0]))
                    .init(tensor_i64("n", &[1], &[n]));
                g.node("Relu", &["x"], &["r"]);
                g.node("Shape", &["x"], &["shape"]);
                g.node("Gather", &["shape", "zero"], &["b"]);
                g.node("Greater", &["b", "n"], &["above"]);
                g.node("Cast", &["above"], &["a64"])
                    .attribute
                    .push(attr::int("to", Int64.code() as i64));
                g.node("Add", &["a64", "one"], &["f64"]);
                g.init(tensor_i64("one", &[1], &[1]));
                g.node("Cast", &["f64"], &["f"])
                    .attribute
                    .push(attr::int("to", Float32.code() as i64));
                g.node("Mul", &["r", "f"], &["y"]);
            }
        }
        model(g.build(), &[("", 17)])
    };
    let build = |artifact| crate::support::build_with_artifact(&original(None), artifact);
    // Wrong above batch 4: right at both runs (2, then 4), served.
    let r = build(original(Some(4)));
    assert_eq!(r.status, Status::Ready, "{:?}", r.validation);
    let v = r.validation.unwrap();
    assert_eq!(v.shapes["x"], [2, 8]);
    assert_eq!(v.also_at.as_ref().unwrap()["x"], [4, 8]);
    // Wrong above batch 2: right at the first run, refused by the second.
    let r = build(original(Some(2)));
    assert!(
        matches!(r.status, Status::Failed { .. }),
        "served an artifact wrong at a doubled batch: {:?}",
        r.validation
    );
    let v = r.validation.unwrap();
    assert_eq!(v.shapes["x"], [2, 8]);
    assert_eq!(v.also_at.as_ref().unwrap()["x"], [4, 8]);
}
