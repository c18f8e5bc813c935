//! Capability analysis through the real binary: partitions, reasons, data-dependent shapes
//! and boundaries on the capability fixtures; exported partitions re-run under ONNX Runtime
//! against the full model; and the whole ONNX backend test corpus analysed without a panic.

use std::path::{Path, PathBuf};

use serde_json::Value;
use trtcache::fixtures::{capability, models, write};

use crate::support::{json, run_python, trtcache};

fn fixture(dir: &Path, name: &str, m: &trtcache::onnx::proto::ModelProto) -> PathBuf {
    let p = dir.join(format!("{name}.onnx"));
    write(m, &p).unwrap();
    p
}

/// `inspect --json` with extra flags; returns the `capability` object.
fn cap(model: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["inspect", "--json", model.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = trtcache(&args);
    assert!(
        out.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)["capability"].clone()
}

fn node<'a>(c: &'a Value, op: &str) -> &'a Value {
    c["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["op_type"] == op)
        .unwrap_or_else(|| panic!("no {op} node in {c}"))
}

fn providers_of_partitions(c: &Value) -> Vec<String> {
    c["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["provider"].as_str().unwrap().to_string())
        .collect()
}

fn reasons(n: &Value) -> String {
    n["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[test]
fn capability_fixtures_pass_onnx_checker() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = capability::all()
        .iter()
        .map(|(n, m, _)| fixture(dir.path(), n, m))
        .collect();
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    let out = run_python(
        "import sys, onnx\nfor p in sys.argv[1:]:\n    onnx.checker.check_model(onnx.load(p), full_check=True)\nprint(len(sys.argv) - 1)",
        &refs,
    );
    assert_eq!(out.trim(), paths.len().to_string());
}

#[test]
fn whole_model_is_one_tensorrt_subgraph() {
    let dir = tempfile::tempdir().unwrap();
    let c = cap(
        &fixture(dir.path(), "enc", &models::tiny_encoder(false)),
        &[],
    );
    assert_eq!(providers_of_partitions(&c), ["tensorrt"]);
    assert_eq!(c["partitions"][0]["nodes"].as_array().unwrap().len(), 4);
    assert_eq!(c["partitions"][0]["inputs"], serde_json::json!(["x"]));
    assert_eq!(c["partitions"][0]["outputs"], serde_json::json!(["y"]));
    assert!(c["boundaries"].as_array().unwrap().is_empty());
    assert_eq!(c["trt_version"], "10.15");
    assert_eq!(
        c["providers"],
        serde_json::json!(["tensorrt", "cuda", "cpu"])
    );
}

#[test]
fn unsupported_op_in_the_middle_splits_in_two() {
    let dir = tempfile::tempdir().unwrap();
    let p = fixture(dir.path(), "hole", &capability::hole_in_middle());
    let c = cap(&p, &[]);
    assert_eq!(providers_of_partitions(&c), ["tensorrt", "cpu", "tensorrt"]);
    let b = c["boundaries"].as_array().unwrap();
    assert_eq!(b.len(), 2, "{b:?}");
    assert_eq!(
        (
            b[0]["tensor"].as_str(),
            b[0]["from"].as_str(),
            b[0]["to"].as_str()
        ),
        (Some("r1"), Some("tensorrt"), Some("cpu"))
    );
    assert_eq!(
        (
            b[1]["tensor"].as_str(),
            b[1]["from"].as_str(),
            b[1]["to"].as_str()
        ),
        (Some("c1"), Some("cpu"), Some("tensorrt"))
    );
    assert!(b[0]["bytes"].is_null(), "batch is dynamic");
    let crop = node(&c, "CenterCropPad");
    assert_eq!(crop["provider"], "cpu");
    assert!(reasons(crop).contains("does not support `CenterCropPad`"));
    assert!(reasons(crop).contains("CUDA provider has no `CenterCropPad` kernel"));
    let human = trtcache(["inspect", p.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("5 nodes: 4 TensorRT in 2 subgraphs, 0 CUDA, 1 CPU, 2 host↔device copies"),
        "{text}"
    );
    assert!(text.contains("not taken by TensorRT"));
    // Subgraphs below the minimum size go to the next provider (CUDA has these kernels).
    let c = cap(&p, &["--min-subgraph-size", "3"]);
    assert_eq!(node(&c, "MatMul")["provider"], "cuda");
    assert!(reasons(node(&c, "Relu")).contains("fewer than --min-subgraph-size 3"));
}

#[test]
fn boundaries_have_bytes_when_shapes_are_static() {
    let dir = tempfile::tempdir().unwrap();
    let p = fixture(dir.path(), "static", &models::tiny_encoder(true));
    let c = cap(
        &p,
        &["--providers", "tensorrt,cpu", "--trt-exclude", "MatMul"],
    );
    assert_eq!(providers_of_partitions(&c), ["tensorrt", "cpu", "tensorrt"]);
    let b = c["boundaries"].as_array().unwrap();
    assert_eq!(b.len(), 2);
    assert_eq!(b[0]["bytes"], 16 * 64 * 4);
    assert!(reasons(node(&c, "MatMul")).contains("--trt-exclude"));
}

#[test]
fn merge_that_would_create_a_cycle_is_not_made() {
    let dir = tempfile::tempdir().unwrap();
    let c = cap(&fixture(dir.path(), "mc", &capability::merge_cycle()), &[]);
    let parts = c["partitions"].as_array().unwrap();
    let trt: Vec<Vec<&str>> = parts
        .iter()
        .filter(|p| p["provider"] == "tensorrt")
        .map(|p| {
            p["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(trt.len(), 2, "{parts:?}");
    let has = |i: usize, prefix: &str| trt[i].iter().any(|n| n.starts_with(prefix));
    assert!(has(0, "relu") && has(0, "sigmoid"), "{trt:?}");
    assert!(has(1, "add") && has(1, "mul"), "{trt:?}");
}

#[test]
fn nonzero_is_flagged_and_dds_exclusion_moves_it_to_cuda() {
    let dir = tempfile::tempdir().unwrap();
    let p = fixture(dir.path(), "nz", &capability::nonzero_gather_reshape());
    let c = cap(&p, &[]);
    let dds = c["data_dependent"].as_array().unwrap();
    assert_eq!(dds.len(), 1, "{dds:?}");
    assert_eq!(dds[0]["tensor"], "nz");
    assert_eq!(dds[0]["op_type"], "NonZero");
    assert!(dds[0]["why"].as_str().unwrap().contains("non-zero"));
    assert_eq!(node(&c, "NonZero")["provider"], "tensorrt");
    let c = cap(&p, &["--trt-exclude-dds"]);
    let nz = node(&c, "NonZero");
    assert_eq!(nz["provider"], "cuda");
    assert!(reasons(nz).contains("excluded"));
    assert_eq!(node(&c, "Gather")["provider"], "tensorrt");
}

#[test]
fn nms_is_flagged_and_excludable() {
    let dir = tempfile::tempdir().unwrap();
    let p = fixture(dir.path(), "nms", &capability::nms());
    let c = cap(&p, &[]);
    assert_eq!(c["data_dependent"][0]["tensor"], "selected");
    assert_eq!(node(&c, "NonMaxSuppression")["provider"], "tensorrt");
    let c = cap(&p, &["--trt-exclude-dds"]);
    assert_eq!(node(&c, "NonMaxSuppression")["provider"], "cuda");
    // TensorRT 10.1's parser filters the DDS ops by itself.
    let c = cap(&p, &["--trt-version", "10.1"]);
    assert_eq!(c["trt_version"], "10.1");
    assert_eq!(node(&c, "NonMaxSuppression")["provider"], "cuda");
}

#[test]
fn unique_goes_to_cpu_because_cuda_has_no_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let c = cap(&fixture(dir.path(), "u", &capability::unique()), &[]);
    let u = node(&c, "Unique");
    assert_eq!(u["provider"], "cpu");
    assert!(reasons(u).contains("does not support `Unique`"), "{u}");
    assert!(reasons(u).contains("no `Unique` kernel"), "{u}");
    assert_eq!(c["data_dependent"][0]["op_type"], "Unique");
}

#[test]
fn custom_domain_op_is_cpu_with_reason() {
    let dir = tempfile::tempdir().unwrap();
    let c = cap(&fixture(dir.path(), "cd", &models::custom_domain()), &[]);
    let s = node(&c, "Scale");
    assert_eq!(s["provider"], "cpu");
    assert_eq!(s["domain"], "com.example");
    assert!(reasons(s).contains("plugin"), "{s}");
    assert!(reasons(s).contains("custom-op library"), "{s}");
    assert_eq!(c["boundaries"].as_array().unwrap().len(), 2);
}

#[test]
fn control_flow_is_taken_only_with_supported_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let c = cap(&fixture(dir.path(), "ok", &models::if_loop()), &[]);
    assert_eq!(providers_of_partitions(&c), ["tensorrt"]);
    let c = cap(
        &fixture(dir.path(), "bad", &capability::control_flow_unsupported()),
        &[],
    );
    let i = node(&c, "If");
    assert_eq!(i["provider"], "cuda");
    assert!(reasons(i).contains("body `then_branch`"), "{i}");
    assert!(reasons(i).contains("CenterCropPad"), "{i}");
    let l = node(&c, "Loop");
    assert_eq!(l["provider"], "cuda");
    assert!(reasons(l).contains("dynamic length"), "{l}");
    let dds = c["data_dependent"].as_array().unwrap();
    assert!(
        dds.iter()
            .any(|d| d["tensor"] == "scans" && d["op_type"] == "Loop"),
        "{dds:?}"
    );
}

#[test]
fn reshape_with_shape_from_data_is_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let c = cap(
        &fixture(dir.path(), "r", &capability::reshape_from_data()),
        &[],
    );
    let dds = c["data_dependent"].as_array().unwrap();
    assert_eq!(dds.len(), 1);
    assert_eq!(dds[0]["tensor"], "r");
    assert_eq!(dds[0]["op_type"], "Reshape");
    assert!(dds[0]["why"].as_str().unwrap().contains("shape input `s`"));
}

#[test]
fn double_input_is_cast_down() {
    let dir = tempfile::tempdir().unwrap();
    let c = cap(&fixture(dir.path(), "d", &capability::double_input()), &[]);
    let r = node(&c, "Relu");
    assert_eq!(r["provider"], "tensorrt");
    assert!(reasons(r).contains("cast down to float32"), "{r}");
}

#[test]
fn opset_beyond_the_trt_table() {
    let dir = tempfile::tempdir().unwrap();
    let p = fixture(dir.path(), "o", &capability::opset_beyond_trt());
    let out = trtcache(["inspect", "--json", p.to_str().unwrap()]);
    let j = json(&out);
    let r = node(&j["capability"], "Relu");
    assert_eq!(r["provider"], "cuda");
    assert!(
        reasons(r).contains("outside TensorRT 10.15's supported range 9..24"),
        "{r}"
    );
    let w = j["warnings"].to_string();
    assert!(
        w.contains("opset-too-new") && w.contains("TensorRT 10.15"),
        "{w}"
    );
    // TensorRT 10.1's range is 9..20: an opset-17 model is inside it.
    let enc = fixture(dir.path(), "enc", &models::tiny_encoder(false));
    let out = trtcache([
        "inspect",
        "--json",
        "--trt-version",
        "10.1",
        enc.to_str().unwrap(),
    ]);
    assert!(!json(&out)["warnings"].to_string().contains("opset-too-new"));
    let out = trtcache(["inspect", "--trt-version", "9.9", enc.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("known versions: 10.15, 10.1"));
    let out = trtcache([
        "inspect",
        "--providers",
        "tensorrt,gpu",
        enc.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
}

const REPLAY: &str = r#"
import sys, json, os
import numpy as np, onnx, onnxruntime as ort
model, d, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
man = json.load(open(os.path.join(d, "manifest.json")))
so = ort.SessionOptions(); so.log_severity_level = 3
cpu = ["CPUExecutionProvider"]
full = ort.InferenceSession(model, so, providers=cpu)
rng = np.random.default_rng(0)
feeds = {}
for i in full.get_inputs():
    if i.name in overrides:
        v, t = overrides[i.name]
        feeds[i.name] = np.array(v, dtype=t)
        continue
    shape = [s if isinstance(s, int) else 3 for s in i.shape]
    if i.type == "tensor(float)":
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    elif i.type == "tensor(double)":
        feeds[i.name] = rng.standard_normal(shape)
    elif i.type == "tensor(bool)":
        feeds[i.name] = np.ones(shape, dtype=bool)
    else:
        raise SystemExit("no feed for " + i.name + " " + i.type)
expected = dict(zip([o.name for o in full.get_outputs()], full.run(None, feeds)))
env = dict(feeds)
for pid in man["order"]:
    p = man["partitions"][pid]
    path = os.path.join(d, p["file"])
    onnx.checker.check_model(onnx.load(path))
    s = ort.InferenceSession(path, so, providers=cpu)
    outs = s.run(p["outputs"], {w["name"]: env[w["name"]] for w in p["inputs"]})
    env.update(zip(p["outputs"], outs))
for k, v in expected.items():
    got = env[k]
    assert got.shape == v.shape, (k, got.shape, v.shape)
    assert np.allclose(got, v, rtol=1e-5, atol=1e-6), (k, got, v)
print(len(man["order"]), len(expected))
"#;

/// A shape Constant that the model's own `value_info` declares as a scalar (as
/// onnxruntime-genai's builder does), feeding a Reshape that lands in another partition: the
/// partition's input must carry the Constant's real shape, or it does not load.
fn misdeclared_constant() -> trtcache::onnx::proto::ModelProto {
    use trtcache::fixtures::{attr, model, tensor_i64, value_info, GraphBuilder};
    use trtcache::onnx::ElemType::{Float32, Int64};
    let mut g = GraphBuilder::new("misdeclared_constant");
    g.input("x", Float32, &[2.into(), 6.into()])
        .output("y", Float32, Some(&[3.into(), 4.into()]));
    g.node("Relu", &["x"], &["r"]);
    g.node("Constant", &[], &["shape"])
        .attribute
        .push(attr::tensor("value", tensor_i64("", &[2], &[3, -1])));
    g.node("Reshape", &["r", "shape"], &["y"]);
    let mut m = model(g.build(), &[("", 17)]);
    if let Some(graph) = m.graph.as_mut() {
        graph.value_info.push(value_info("shape", Int64, Some(&[])));
    }
    m
}

/// Exporter output, not a graph built here (tests/data/exporters/README.md): optimum writes a
/// T5's RMS norms at opset 18 as `ReduceMean` with `axes` from `Constant` nodes. TensorRT's
/// parser imports a Constant's output as weights, so every one of them is TensorRT's, with no
/// "axes must be an initializer" refusal (which sent them all to CUDA before).
#[test]
fn exporter_reduction_axes_from_constants_go_to_tensorrt() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/exporters/optimum_t5_encoder_opset18.onnx");
    let m = trtcache::onnx::Model::load(&model).unwrap();
    let g = m.graph();
    let constants: std::collections::HashSet<&str> = g
        .node
        .iter()
        .filter(|n| n.op_type == "Constant")
        .flat_map(|n| n.output.iter().map(String::as_str))
        .collect();
    let fed: Vec<String> = g
        .node
        .iter()
        .filter(|n| n.op_type.starts_with("Reduce") && n.input.len() > 1)
        .filter(|n| constants.contains(n.input[1].as_str()))
        .map(|n| n.name.clone())
        .collect();
    assert!(fed.len() >= 5, "the export changed: {fed:?}");
    let out = trtcache(["inspect", "--json", model.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    for name in &fed {
        let node = v["capability"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} not in the report"));
        assert_eq!(node["provider"], "tensorrt", "{node}");
    }
}

#[test]
fn exported_partitions_reproduce_the_full_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(String, trtcache::onnx::proto::ModelProto, Vec<&str>)> = Vec::new();
    for (name, m, runs) in capability::all() {
        if runs {
            cases.push((name.to_string(), m, vec![]));
        }
    }
    cases.push((
        "nz_excl".into(),
        capability::nonzero_gather_reshape(),
        vec!["--trt-exclude-dds"],
    ));
    cases.push(("enc".into(), models::tiny_encoder(false), vec![]));
    cases.push(("if_loop".into(), models::if_loop(), vec![]));
    cases.push((
        "misdeclared_constant".into(),
        misdeclared_constant(),
        vec!["--trt-exclude", "Reshape", "--providers", "tensorrt,cpu"],
    ));
    cases.push((
        "enc_split".into(),
        models::tiny_encoder(false),
        vec!["--trt-exclude", "MatMul,Add", "--providers", "tensorrt,cpu"],
    ));
    let mut multi = 0;
    for (name, m, flags) in &cases {
        let p = fixture(dir.path(), name, m);
        let out_dir = dir.path().join(format!("{name}.parts"));
        let mut args = vec![
            "inspect",
            "--json",
            p.to_str().unwrap(),
            "--export-subgraphs",
            out_dir.to_str().unwrap(),
        ];
        args.extend(flags.iter().copied());
        let out = trtcache(&args);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let overrides = match name.as_str() {
            "reshape_from_data" => r#"{"s": [[6, 4], "int64"]}"#,
            "control_flow_unsupported" => r#"{"trips": [3, "int64"], "cond": [true, "bool"]}"#,
            _ => "{}",
        };
        let res = std::process::Command::new(crate::support::python())
            .args(["-c", REPLAY])
            .arg(&p)
            .arg(&out_dir)
            .arg(overrides)
            .output()
            .unwrap();
        assert!(
            res.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&res.stderr)
        );
        let parts: usize = String::from_utf8_lossy(&res.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        if parts > 1 {
            multi += 1;
        }
    }
    assert!(multi >= 5, "only {multi} cases had more than one partition");

    // External data: the exported partitions carry the weights inline.
    let ext = dir.path().join("external");
    std::fs::create_dir_all(&ext).unwrap();
    let p = ext.join("model.onnx");
    trtcache::fixtures::write_external(&models::tiny_encoder(false), &p, "model.onnx.data", 128)
        .unwrap();
    let out_dir = dir.path().join("external.parts");
    let out = trtcache([
        "inspect",
        "--json",
        p.to_str().unwrap(),
        "--export-subgraphs",
        out_dir.to_str().unwrap(),
        "--trt-exclude",
        "MatMul",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let res = std::process::Command::new(crate::support::python())
        .args(["-c", REPLAY])
        .arg(&p)
        .arg(&out_dir)
        .arg("{}")
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    assert!(String::from_utf8_lossy(&res.stdout).starts_with("3 "));
}

#[test]
fn whole_onnx_backend_corpus_analyses_without_error() {
    let root = run_python(
        "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data'))",
        &[],
    );
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::from(root.trim())];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "onnx") {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(files.len() > 100, "only {} models found", files.len());
    let mut analysed = 0;
    let mut failures = Vec::new();
    for f in &files {
        let Ok(model) = trtcache::onnx::Model::load(f) else {
            continue;
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            trtcache::analysis::analyse(&model, &trtcache::analysis::Options::default())
        }));
        match r {
            Ok(Ok(c)) => {
                assert_eq!(c.nodes.len(), model.graph().node.len(), "{}", f.display());
                let in_parts: usize = c.partitions.iter().map(|p| p.nodes.len()).sum();
                assert_eq!(in_parts, c.nodes.len(), "{}", f.display());
                analysed += 1;
            }
            Ok(Err(e)) => failures.push(format!("{}: {e}", f.display())),
            Err(_) => failures.push(format!("{}: panicked", f.display())),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(analysed > 100, "analysed only {analysed}");
}

#[test]
fn installed_tensorrt_selects_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libnvinfer.so.10.1.0"), b"").unwrap();
    let p = fixture(dir.path(), "enc", &models::tiny_encoder(false));
    let run = |ld: &Path| {
        let out = std::process::Command::new(crate::support::bin())
            .args(["inspect", "--json", p.to_str().unwrap()])
            .env("LD_LIBRARY_PATH", ld)
            .output()
            .unwrap();
        json(&out)["capability"]["trt_version"].clone()
    };
    assert_eq!(run(&lib), "10.1");
    std::fs::remove_file(lib.join("libnvinfer.so.10.1.0")).unwrap();
    std::fs::write(lib.join("libnvinfer.so.99.0.0"), b"").unwrap();
    assert_eq!(run(&lib), "10.15", "no table for 99.0: newest bundled");
}

#[test]
fn json_has_exactly_the_documented_fields_and_stable_generated_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = capability::nonzero_gather_reshape();
    for n in &mut m.graph.as_mut().unwrap().node {
        n.name.clear();
    }
    let p = fixture(dir.path(), "unnamed", &m);
    let c = cap(&p, &[]);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(&c),
        [
            "boundaries",
            "data_dependent",
            "nodes",
            "partitions",
            "providers",
            "trt_version"
        ]
    );
    assert_eq!(
        keys(&c["partitions"][0]),
        ["id", "inputs", "nodes", "outputs", "provider"]
    );
    assert_eq!(
        keys(&c["nodes"][0]),
        ["domain", "name", "op_type", "provider", "reasons"]
    );
    assert_eq!(
        keys(&c["data_dependent"][0]),
        ["node", "op_type", "tensor", "why"]
    );
    let names: Vec<&str> = c["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["NonZero_0", "Reshape_1", "Gather_2", "Relu_3"]);
    assert_eq!(c["data_dependent"][0]["node"], "NonZero_0");
    assert_eq!(cap(&p, &[]), c, "same model, same report");
    let hole = fixture(dir.path(), "hole", &capability::hole_in_middle());
    let b = &cap(&hole, &["--providers", "cpu"]);
    assert_eq!(providers_of_partitions(b), ["cpu"]);
    assert!(b["boundaries"].as_array().unwrap().is_empty());
}
