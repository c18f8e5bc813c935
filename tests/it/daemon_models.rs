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

/// The tiny encoder with its bias drawn from `seed` (same graph, other numbers).
fn encoder(seed: u64) -> trtcache::onnx::proto::ModelProto {
    let mut m = trtcache::fixtures::models::tiny_encoder(false);
    let g = m.graph.as_mut().expect("graph");
    g.initializer[3] = trtcache::fixtures::tensor_f32(
        "fc.bias",
        &[64],
        &trtcache::fixtures::random_f32(seed, 64, 0.5),
    );
    m
}

/// The served key of `name`'s first variant once it is ready with a key other than `old`.
fn ready_key_other_than(d: &Daemon, name: &str, old: Option<&str>) -> String {
    let mut c = d.client();
    let t0 = Instant::now();
    loop {
        let list = c.list().unwrap();
        let v = list
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.variants.first());
        if let Some(k) = v
            .filter(|v| v.state == VariantState::Ready)
            .and_then(|v| v.key.clone())
            .filter(|k| Some(k.as_str()) != old)
        {
            return k;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "`{name}` never became ready with a key other than {old:?}: {list:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the ready index says for `name` (its pointer file), once it names `key`.
fn pointer_naming(d: &Daemon, name: &str, key: &str) -> String {
    let p = trtcache_client::ready::ready_dir(&d.socket()).join(name);
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        if text.contains(key) {
            return text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no pointer of `{name}` naming {key}: {text:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A flat `m.onnx` whose weights sit in `weights.bin` (a name that is not `m.…`, as torch
/// and onnx write them): the file is part of the model. Replaced (a rename over it), the
/// daemon serves a new key whose outputs follow the new weights, and the ready index's
/// pointer names the file among its sources; rewritten in place, the same; deleted, the
/// model fails (no artifact of the old weights is served any more). Without periodic
/// rescans: the watcher's events on `weights.bin` alone bring each change.
#[test]
fn a_flat_models_external_data_of_any_name_is_part_of_the_model() {
    use crate::daemon::{artifact_session, assert_close, reference, run_encoder};
    use trtcache::fixtures::write_external;
    let mut d = Daemon::new();
    // No periodic rescan: the watcher's events alone must bring every change.
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        cfg.replace("rescan_secs = 2", "rescan_secs = 0"),
    )
    .unwrap();
    let weights = d.models().join("weights.bin");
    write_external(&encoder(1), &d.models().join("m.onnx"), "weights.bin", 128).unwrap();
    let graph = std::fs::read(d.models().join("m.onnx")).unwrap();
    // The same model with its weights inline, to compare outputs with.
    let (ref1, ref2, ref3) = (
        d.root.join("outside/ref1.onnx"),
        d.root.join("outside/ref2.onnx"),
        d.root.join("outside/ref3.onnx"),
    );
    write(&encoder(1), &ref1).unwrap();
    write(&encoder(2), &ref2).unwrap();
    write(&encoder(3), &ref3).unwrap();
    d.start();
    let k1 = ready_key_other_than(&d, "m", None);
    let run = |d: &Daemon| {
        let art = d.client().acquire_model("m").unwrap();
        (
            art.metadata.key.clone(),
            run_encoder(&mut artifact_session(&art), 4),
        )
    };
    let (k, out1) = run(&d);
    assert_eq!(k, k1);
    assert_close(&out1, &reference(&ref1, 4), "the first weights");
    // The pointer names a bounded set of the model's files for consumers to check (the
    // graph, not its 1 or 3,000 data files); the daemon watches weights.bin itself and
    // replaces the pointer when it changes (below).
    pointer_naming(&d, "m", &k1);

    // Replaced by a rename: the graph file is byte for byte the same (the weights moved
    // out of it), only weights.bin is new.
    let staged = d.root.join("outside/staged");
    std::fs::create_dir_all(&staged).unwrap();
    write_external(&encoder(2), &staged.join("m.onnx"), "weights.bin", 128).unwrap();
    assert_eq!(std::fs::read(staged.join("m.onnx")).unwrap(), graph);
    std::fs::rename(staged.join("weights.bin"), &weights).unwrap();
    let k2 = ready_key_other_than(&d, "m", Some(&k1));
    let (k, out2) = run(&d);
    assert_eq!(k, k2);
    assert_close(&out2, &reference(&ref2, 4), "the replaced weights");
    pointer_naming(&d, "m", &k2);

    // Rewritten in place (same size, same inode).
    write_external(&encoder(3), &staged.join("m.onnx"), "weights.bin", 128).unwrap();
    let bytes = std::fs::read(staged.join("weights.bin")).unwrap();
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&weights)
            .unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(&bytes).unwrap();
    }
    let k3 = ready_key_other_than(&d, "m", Some(&k2));
    let (k, out3) = run(&d);
    assert_eq!(k, k3);
    assert_close(
        &out3,
        &reference(&ref3, 4),
        "the weights rewritten in place",
    );

    // Deleted: the model fails; nothing of the old weights is handed out.
    std::fs::remove_file(&weights).unwrap();
    let reason = settled(&d, "m", VariantState::Failed).unwrap_or_default();
    assert!(reason.contains("weights.bin"), "{reason}");
    assert!(d.client().acquire_model("m").is_err());
    let ptr = trtcache_client::ready::ready_dir(&d.socket()).join("m");
    let t0 = Instant::now();
    while ptr.exists() {
        assert!(t0.elapsed() < Duration::from_secs(30), "the pointer stays");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(d.stop());
}

/// External data in a subfolder (`data/w.bin`) of a flat model, and the subfolder replaced
/// whole (the old folder moved away, a new one renamed into place): the
/// watcher's events on the folder bring the change; the model serves the new weights' key.
#[test]
fn external_data_in_a_subfolder_replaced_whole_is_a_changed_model() {
    use trtcache::fixtures::write_external;
    let mut d = Daemon::new();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        cfg.replace("rescan_secs = 2", "rescan_secs = 0"),
    )
    .unwrap();
    std::fs::create_dir_all(d.models().join("data")).unwrap();
    write_external(&encoder(4), &d.models().join("n.onnx"), "data/w.bin", 128).unwrap();
    d.start();
    let k1 = ready_key_other_than(&d, "n", None);
    // The new weights, staged in a hidden folder of the repository.
    let staged = d.models().join(".staged");
    std::fs::create_dir_all(staged.join("data")).unwrap();
    write_external(&encoder(5), &staged.join("n.onnx"), "data/w.bin", 128).unwrap();
    std::fs::rename(d.models().join("data"), d.root.join("outside/old-data")).unwrap();
    std::fs::rename(staged.join("data"), d.models().join("data")).unwrap();
    let k2 = ready_key_other_than(&d, "n", Some(&k1));
    assert_eq!(d.client().acquire_model("n").unwrap().metadata.key, k2);
    assert!(d.stop());
}

/// A model with float16 outputs (a LayerNorm ONNX Runtime fuses, moving them by a float16
/// step) is served by the daemon under the default rule; held to allclose alone by its
/// sidecar (`ulps = 0`), every optimized graph is refused, and its own graph served.
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
    assert!(
        art.metadata
            .validation
            .method
            .contains("float16/bfloat16 outputs within 8 steps"),
        "{}",
        art.metadata.validation.method
    );
    // Held to fp32's allclose alone, every optimized graph is refused: the model's own graph
    // (level disabled, the ladder's last rung) is served, without the fusion.
    settled(&d, "strict", VariantState::Ready);
    let fused = served_ops(&d, "half");
    let own = served_ops(&d, "strict");
    assert!(
        fused.iter().any(|o| o.contains("LayerNormalization")),
        "{fused:?}"
    );
    assert!(
        !own.iter().any(|o| o.contains("LayerNormalization"))
            && own.contains(&"ReduceMean".to_string()),
        "{own:?}"
    );
    assert!(d.stop());
}

/// A model's sidecar is read when the watcher brings the model in (on the blocking pool) and
/// kept with its state: an acquire reads no sidecar. Rewritten into something that does not
/// parse and not yet settled by the watcher (a debounce far longer than the test, no periodic
/// rescan), the sidecar changes nothing: acquires are served with the plan of the settled
/// one (a daemon that parsed the sidecar on every acquire planned a selection without the
/// profile and failed). Once a `rescan` settles it, the model is what the new sidecar says.
#[test]
fn an_acquire_reads_no_sidecar_until_the_watcher_brings_its_change() {
    use trtcache::fixtures::models;
    use trtcache_client::protocol::AcquireRequest;
    let mut d = Daemon::new();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        cfg.replace("debounce_ms = 150", "debounce_ms = 600000")
            .replace("rescan_secs = 2", "rescan_secs = 0"),
    )
    .unwrap();
    // Every file with a modification time an hour back, so that a rescan takes the model as
    // settled without waiting a debounce.
    let age = |p: &std::path::Path| {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
            .unwrap()
    };
    let graph = d.models().join("fixed.onnx");
    write(&models::tiny_encoder(false), &graph).unwrap();
    age(&graph);
    let sidecar = d.models().join("fixed.trtcache.toml");
    std::fs::write(&sidecar, "[profiles.serve]\nopt = \"x:1x6x64\"\n").unwrap();
    age(&sidecar);
    d.start();
    d.wait_settled(&["fixed"]);
    // Over the socket (the ready index would answer a plain `acquire_model` without it).
    let acquire = |d: &Daemon| {
        d.client().acquire(&AcquireRequest {
            model: "fixed".into(),
            ..Default::default()
        })
    };
    let art = acquire(&d).unwrap();
    assert_eq!(art.metadata.profile, "serve");
    let key = art.metadata.key.clone();

    std::fs::write(&sidecar, "[profiles.serve\nnot toml").unwrap();
    age(&sidecar);
    for _ in 0..3 {
        let art = acquire(&d).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
        assert_eq!(
            (art.metadata.profile.as_str(), art.metadata.key.as_str()),
            ("serve", key.as_str())
        );
    }
    let status = d.client().status("fixed").unwrap();
    assert_eq!(status.variants.len(), 1, "{status:?}");
    assert_eq!(status.variants[0].profile, "serve", "{status:?}");

    // Settled by a rescan: the model is planned from the sidecar it has now, which does not
    // parse, so it serves nothing.
    let report = d.client().rescan().unwrap();
    assert!(
        report.models.iter().any(|m| m.name == "fixed" && m.settled),
        "{report:?}"
    );
    assert!(acquire(&d).is_err(), "{}", d.log());
    assert!(d.stop());
}
