//! The daemon with models users bring (issue 14): a model that failed is built again when a
//! sidecar that only adds golden inputs appears next to it (golden settings are not part of
//! the key, so the failure memo follows them separately), and failure reasons name the
//! repository's file, not the private copy the daemon builds from, and keep their end (what
//! to add) when they are cut to the daemon's bound.

use std::time::{Duration, Instant};

use trtcache::fixtures::{model, tensor_i64, write, GraphBuilder};
use trtcache::onnx::ElemType::Float32;
use trtcache_client::protocol::VariantState;

use crate::daemon::Daemon;
use crate::support;

/// `x` of any length, reshaped to `[7, 1]` (computed, `[3, 0] + [4, 1]`, so not a size the
/// graph records): only length 7 runs, and no default validation input tries it
/// (scripts/corpus/classes.py `impossible`).
fn only_seven() -> trtcache::onnx::proto::ModelProto {
    let mut g = GraphBuilder::new("only_seven");
    g.input("x", Float32, &["n".into()])
        .output("y", Float32, None)
        .init(tensor_i64("a", &[2], &[3, 0]))
        .init(tensor_i64("b", &[2], &[4, 1]));
    g.node("Add", &["a", "b"], &["shape"]);
    g.node("Reshape", &["x", "shape"], &["y"]);
    model(g.build(), &[("", 17)])
}

/// The state and reason of `name`'s first variant once it is not building.
fn settled(d: &Daemon, name: &str, want: VariantState) -> Option<String> {
    let mut c = d.client();
    let t0 = Instant::now();
    loop {
        let list = c.list().unwrap();
        if let Some(v) = list
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.variants.first())
            .filter(|v| v.state == want)
        {
            return v.reason.clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "`{name}` never became {want:?}: {list:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_failed_model_is_retried_when_golden_inputs_appear_and_its_reason_names_the_file() {
    let mut d = Daemon::new();
    let path = d.models().join("seven.onnx");
    write(&only_seven(), &path).unwrap();
    d.start();
    let reason = settled(&d, "seven", VariantState::Failed).unwrap_or_default();
    assert!(
        reason.contains(&path.display().to_string()),
        "the reason names the repository's file: {reason}"
    );
    assert!(
        !reason.contains("tmp/build-") && !reason.contains(&d.cache().display().to_string()),
        "the reason names the daemon's private copy: {reason}"
    );
    let sidecar = d.models().join("seven.trtcache.toml");
    assert!(
        reason.contains("in seven.trtcache.toml") && reason.contains("--golden"),
        "a long reason keeps its end, which says what to add: {reason}"
    );
    // A sidecar that changes nothing in the key, only the validation inputs.
    support::run_python(
        "import sys, numpy as np; np.savez(sys.argv[1], x=np.arange(7, dtype=np.float32))",
        &[&d.models().join("seven.npz")],
    );
    std::fs::write(&sidecar, "[golden]\nnpz = \"seven.npz\"\n").unwrap();
    settled(&d, "seven", VariantState::Ready);
    let art = d.client().acquire_model("seven").unwrap();
    assert!(!art.files.is_empty());
    let stats = d.client().stats().unwrap();
    assert_eq!((stats.failures, stats.builds), (1, 1), "{stats:?}");
    assert!(d.stop());
}

#[test]
fn a_model_onnx_runtime_refuses_is_named_once_in_its_reason() {
    // A node reads a value nothing produces: ONNX Runtime refuses to load the graph in the
    // build worker. The reason names the repository's file once, then the stage, then ONNX
    // Runtime's words (which name the file again), not `M.onnx: M.onnx: …`.
    let mut d = Daemon::new();
    let path = d.models().join("ghost.onnx");
    let mut g = GraphBuilder::new("ghost");
    g.input("x", Float32, &[4.into()])
        .output("y", Float32, Some(&[4.into()]));
    g.node("Add", &["x", "nobody_makes_this"], &["y"]);
    write(&model(g.build(), &[("", 17)]), &path).unwrap();
    d.start();
    let reason = settled(&d, "ghost", VariantState::Failed).unwrap_or_default();
    let p = path.display().to_string();
    assert!(reason.contains(&p), "{reason}");
    assert!(
        !reason.contains(&format!("{p}: {p}")),
        "the path twice: {reason}"
    );
    assert!(
        reason.contains(&format!("{p}: optimize (ort-cpu): ")),
        "the path, then the stage: {reason}"
    );
    assert!(d.stop());
}

/// Op types of the graph of `name`'s default artifact, acquired from the daemon.
fn served_ops(d: &Daemon, name: &str) -> Vec<String> {
    let a = d.client().acquire_model(name).unwrap();
    let bytes = a.graph_bytes().unwrap();
    let m: trtcache::onnx::proto::ModelProto = prost::Message::decode(bytes.as_slice()).unwrap();
    m.graph
        .unwrap()
        .node
        .into_iter()
        .map(|n| n.op_type)
        .collect()
}

/// The daemon builds an STFT front end with the graph rewrite (a Conv is served); a model's
/// sidecar `rewrite = false` opts that model out, the config's `rewrite = false` every model.
#[test]
fn the_daemon_serves_rewritten_stfts_unless_a_sidecar_or_the_config_says_not_to() {
    use trtcache::fixtures::models;
    let mut d = Daemon::new();
    write(&models::stft(400, 4000), &d.models().join("a.onnx")).unwrap();
    write(&models::stft(400, 4000), &d.models().join("b.onnx")).unwrap();
    std::fs::write(d.models().join("b.trtcache.toml"), "rewrite = false\n").unwrap();
    d.start();
    d.wait_settled(&["a", "b"]);
    let (a, b) = (served_ops(&d, "a"), served_ops(&d, "b"));
    assert!(
        a.contains(&"Conv".into()) && !a.contains(&"STFT".into()),
        "{a:?}"
    );
    assert!(b.contains(&"STFT".into()), "{b:?}");
    assert!(d.stop());
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("rewrite = false\n{cfg}")).unwrap();
    d.start();
    d.wait_settled(&["a", "b"]);
    let a = served_ops(&d, "a");
    assert!(a.contains(&"STFT".into()), "{a:?}");
    assert!(d.stop());
}

/// A model with float16 outputs (a LayerNorm ONNX Runtime fuses, moving them by a float16
/// step) is served by the daemon under the default rule; held to allclose alone by its
/// sidecar (`ulps = 0`), it is refused as it was before issue 41.
#[test]
fn the_daemon_serves_float16_outputs_a_fusion_moves_by_a_step() {
    let mut d = Daemon::new();
    let half = trtcache::fixtures::models::half_layer_norm(true, None);
    write(&half, &d.models().join("half.onnx")).unwrap();
    // Another graph name: the same bytes would share the key (validation settings are not
    // part of it), and so one record.
    let mut strict = half.clone();
    strict.graph.as_mut().unwrap().name = "strict".into();
    write(&strict, &d.models().join("strict.onnx")).unwrap();
    std::fs::write(
        d.models().join("strict.trtcache.toml"),
        "[tolerances.fp32]\natol = 1e-4\nrtol = 1e-3\nulps = 0\n",
    )
    .unwrap();
    d.start();
    settled(&d, "half", VariantState::Ready);
    let art = d.client().acquire_model("half").unwrap();
    assert!(!art.files.is_empty());
    let reason = settled(&d, "strict", VariantState::Failed).unwrap_or_default();
    assert!(reason.contains("over tolerance"), "{reason}");
    assert!(d.stop());
}
