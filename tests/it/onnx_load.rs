//! Loader and `inspect` tests: fixtures against python's onnx checker, the ONNX backend test
//! corpus against python onnx's own reading of it, bad input, external data, warnings.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::Value;
use trtcache::fixtures::{models, write, write_external};
use trtcache::onnx::facts::facts;
use trtcache::onnx::proto::{tensor_shape_proto::dimension, type_proto};
use trtcache::onnx::Model;

use crate::support::{self, cmd, json};

#[test]
fn every_fixture_passes_the_onnx_checker() {
    let dir = tempfile::tempdir().unwrap();
    let paths = support::write_fixtures(dir.path());
    let out = support::run_python(
        "import sys, onnx\nfor p in sys.argv[1:]:\n    onnx.checker.check_model(onnx.load(p), full_check=True)\n    print('ok', p)",
        &paths.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        paths.len()
    );
}

#[test]
fn onnx_backend_corpus_matches_python_onnx() {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/onnx_corpus.py");
    let out = std::process::Command::new(support::python())
        .arg(&script)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: Vec<Value> =
        serde_json::from_slice(&std::fs::read(dir.path().join("expected.json")).unwrap()).unwrap();
    assert!(
        expected.len() > 1000,
        "only {} corpus models",
        expected.len()
    );
    let trt = trtcache::analysis::tables::TrtTable::load("10.15").unwrap();
    let bounds = trtcache::cli::opset_bounds(&trt);
    let mut failures = Vec::new();
    for e in &expected {
        let path = e["path"].as_str().unwrap();
        let model = match Model::load(path) {
            Ok(m) => m,
            Err(err) => {
                failures.push(format!("{path}: does not load: {err}"));
                continue;
            }
        };
        let got = serde_json::to_value(facts(&model, &bounds)).unwrap();
        let checks = [
            ("ir_version", &got["model"]["ir_version"], &e["ir_version"]),
            (
                "opset_imports",
                &got["model"]["opset_imports"],
                &e["opset_imports"],
            ),
            ("node_count", &got["model"]["node_count"], &e["node_count"]),
            ("inputs", &got["inputs"], &e["inputs"]),
            ("outputs", &got["outputs"], &e["outputs"]),
        ];
        for (what, g, want) in checks {
            if g != want {
                failures.push(format!("{path}: {what}: trtcache {g} != onnx {want}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} corpus models differ:\n{}",
        failures.len(),
        expected.len(),
        failures.join("\n")
    );
}

#[test]
fn inspect_json_has_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    let paths = support::write_fixtures(dir.path());
    let out = cmd()
        .args(["inspect", "--json"])
        .arg(&paths[0])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v = json(&out);
    let m = &v["model"];
    for k in [
        "path",
        "ir_version",
        "producer_name",
        "producer_version",
        "opset_imports",
        "node_count",
        "node_count_total",
        "initializer_count",
        "initializer_bytes",
        "external_data_files",
    ] {
        assert!(!m[k].is_null(), "model.{k} missing in {m}");
    }
    assert_eq!(m["opset_imports"][""], 17);
    assert_eq!(m["node_count"], 4);
    assert_eq!(m["initializer_count"], 4);
    assert_eq!(m["initializer_bytes"], (64 + 64 + 64 * 64 + 64) * 4);
    assert_eq!(
        v["inputs"],
        serde_json::json!([{"name": "x", "dtype": "float32", "shape": ["batch", "seq", 64]}])
    );
    assert_eq!(v["op_histogram"]["Add"], 2);
    assert_eq!(v["op_histogram"]["LayerNormalization"], 1);
    assert_eq!(v["warnings"], serde_json::json!([]));

    // Subgraph nodes count in the total only; custom domains print as domain::Op.
    let out = cmd()
        .args(["inspect", "--json"])
        .arg(&paths[2])
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(v["model"]["node_count"], 2);
    assert_eq!(v["model"]["node_count_total"], 2 + 1 + 1 + 2);
    let out = cmd()
        .args(["inspect", "--json"])
        .arg(&paths[3])
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(v["op_histogram"]["com.example::Scale"], 1);
    let codes: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["custom-domain"]);
}

fn warning_codes(model: &trtcache::onnx::proto::ModelProto) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.onnx");
    write(model, &p).unwrap();
    let out = cmd().args(["inspect", "--json"]).arg(&p).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["code"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn warnings_fire_on_exactly_their_cause() {
    assert!(warning_codes(&models::tiny_encoder(false)).is_empty());
    assert_eq!(warning_codes(&models::tiny_encoder(true)), ["static-batch"]);
    // dim_value -1 (what some exporters write for a dynamic axis) is dynamic, as in ORT: an
    // unnamed dynamic axis, not a fixed batch.
    let mut m = models::tiny_encoder(true);
    for i in &mut m.graph.as_mut().unwrap().input {
        let Some(type_proto::Value::TensorType(t)) =
            i.r#type.as_mut().and_then(|t| t.value.as_mut())
        else {
            continue;
        };
        t.shape.as_mut().unwrap().dim[0].value = Some(dimension::Value::DimValue(-1));
    }
    let codes = warning_codes(&m);
    assert!(
        !codes.is_empty() && codes.iter().all(|c| c == "unnamed-dynamic-dim"),
        "{codes:?}"
    );

    let mut m = models::tiny_encoder(false);
    m.ir_version = 14;
    assert_eq!(warning_codes(&m), ["ir-version-too-new"]);

    let mut m = models::tiny_encoder(false);
    m.opset_import[0].version = 25;
    assert_eq!(warning_codes(&m), ["opset-too-new"]);
    m.opset_import[0].version = 26;
    assert_eq!(warning_codes(&m), ["opset-too-new", "opset-too-new"]);
    m.opset_import[0].version = 8;
    assert_eq!(warning_codes(&m), ["opset-too-old"]);

    let mut m = models::tiny_encoder(false);
    let x = &mut m.graph.as_mut().unwrap().input[0];
    *x = trtcache::fixtures::value_info(
        "x",
        trtcache::onnx::ElemType::Float32,
        Some(&[
            trtcache::fixtures::D::Named("batch"),
            trtcache::fixtures::D::Unknown,
            64.into(),
        ]),
    );
    assert_eq!(warning_codes(&m), ["unnamed-dynamic-dim"]);
    let x = &mut m.graph.as_mut().unwrap().input[0];
    *x = trtcache::fixtures::value_info("x", trtcache::onnx::ElemType::Float32, None);
    assert_eq!(warning_codes(&m), ["no-shape"]);
}

/// Runs inspect on a bad input and checks the failure contract: non-zero, not a panic, one
/// line naming the file.
fn assert_clean_failure(path: &Path, expect: &str) {
    let out = cmd().arg("inspect").arg(path).output().unwrap();
    let code = out.status.code().expect("exited, not killed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        code != 0 && code != 101,
        "exit {code} for {}: {err}",
        path.display()
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(
        err.contains(&path.display().to_string()),
        "path missing: {err}"
    );
    assert!(err.contains(expect), "expected `{expect}` in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_gives_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = models::tiny_encoder(false);
    let bytes = prost::Message::encode_to_vec(&good);

    std::fs::write(d.join("empty.onnx"), b"").unwrap();
    assert_clean_failure(&d.join("empty.onnx"), "empty file");

    std::fs::write(d.join("trunc.onnx"), &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_failure(&d.join("trunc.onnx"), "not a valid ONNX model");

    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(d.join("noise.onnx"), noise).unwrap();
    assert_clean_failure(&d.join("noise.onnx"), "ONNX");

    // A valid protobuf that is not a model: a TensorProto.
    let t = trtcache::fixtures::tensor_f32("w", &[2], &[1.0, 2.0]);
    std::fs::write(d.join("tensor.pb"), prost::Message::encode_to_vec(&t)).unwrap();
    assert_clean_failure(&d.join("tensor.pb"), "ONNX model");
    // One whose fields happen to decode as ModelProto fields, but which has no graph.
    let e = trtcache::onnx::proto::StringStringEntryProto {
        key: String::new(),
        value: "abc".into(),
    };
    std::fs::write(d.join("entry.pb"), prost::Message::encode_to_vec(&e)).unwrap();
    assert_clean_failure(&d.join("entry.pb"), "not an ONNX model");

    assert_clean_failure(&d.join("missing.onnx"), "cannot open");
    assert_clean_failure(d, "is a directory");

    // Unreadable: as another user (tests run as root, who can read anything).
    let secret = d.join("secret.onnx");
    std::fs::write(&secret, &bytes).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let is_root = unsafe { libc::geteuid() } == 0;
    let out = if is_root {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(support::bin())
            .arg("inspect")
            .arg(&secret)
            .output()
            .unwrap()
    } else {
        cmd().arg("inspect").arg(&secret).output().unwrap()
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("Permission denied") && err.contains("secret.onnx"),
        "{err}"
    );
}

#[test]
fn external_data_resolves_inside_the_model_folder_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("model");
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("model.onnx");
    write_external(&models::tiny_encoder(false), &p, "weights.bin", 128).unwrap();
    let m = Model::load(&p).unwrap();
    assert_eq!(m.external_files.len(), 1);
    assert_eq!(m.external_files[0].location, "weights.bin");

    // Missing file: names tensor and path.
    std::fs::rename(d.join("weights.bin"), d.join("moved.bin")).unwrap();
    let err = Model::load(&p).unwrap_err().to_string();
    assert!(
        err.contains("tensor `") && err.contains("weights.bin"),
        "{err}"
    );

    // Truncated data file: the range check names the tensor.
    let data = std::fs::read(d.join("moved.bin")).unwrap();
    std::fs::write(d.join("weights.bin"), &data[..100]).unwrap();
    let err = Model::load(&p).unwrap_err().to_string();
    assert!(err.contains("beyond the end"), "{err}");

    // Locations that leave the folder.
    for bad in ["/etc/passwd", "../outside.bin", "sub/../../outside.bin"] {
        let mut m = models::tiny_encoder(false);
        let t = &mut m.graph.as_mut().unwrap().initializer[2];
        t.data_location = 1;
        t.raw_data = Default::default();
        t.external_data = vec![trtcache::onnx::proto::StringStringEntryProto {
            key: "location".into(),
            value: bad.into(),
        }];
        std::fs::write(dir.path().join("outside.bin"), vec![0u8; 64 * 64 * 4]).unwrap();
        let q = d.join("bad.onnx");
        write(&m, &q).unwrap();
        let err = Model::load(&q).unwrap_err().to_string();
        assert!(
            err.contains("absolute") || err.contains("leaves the model's folder"),
            "{bad}: {err}"
        );
    }

    // A symlink inside the folder pointing out of it.
    std::os::unix::fs::symlink(dir.path().join("outside.bin"), d.join("link.bin")).unwrap();
    let mut m = models::tiny_encoder(false);
    let t = &mut m.graph.as_mut().unwrap().initializer[2];
    t.data_location = 1;
    t.raw_data = Default::default();
    t.external_data = vec![trtcache::onnx::proto::StringStringEntryProto {
        key: "location".into(),
        value: "link.bin".into(),
    }];
    let q = d.join("link.onnx");
    write(&m, &q).unwrap();
    let err = Model::load(&q).unwrap_err().to_string();
    assert!(err.contains("outside the model's folder"), "{err}");
}

#[test]
fn weights_are_never_copied() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.onnx");
    write(&models::big_weights(2, 256), &p).unwrap();
    let m = Model::load(&p).unwrap();
    let base = m.bytes.as_ptr() as usize;
    let end = base + m.bytes.len();
    let inits = &m.graph().initializer;
    assert_eq!(inits.len(), 2);
    for t in inits {
        let ptr = t.raw_data.as_ptr() as usize;
        assert_eq!(t.raw_data.len(), 256 * 256 * 4);
        assert!(
            ptr >= base && ptr + t.raw_data.len() <= end,
            "{} was copied",
            t.name
        );
    }
}

/// `trtcache inspect --json | head -1` (a reader that goes away) ends the command quietly:
/// no "Broken pipe" panic (rc 101), only the pipe's signal.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("chain.onnx");
    trtcache::fixtures::write(&trtcache::fixtures::models::long_chain(3000), &m).unwrap();
    let mut child = crate::support::cmd()
        .args(["inspect", "--json", m.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end at once: every write of the (hundreds of KB of) JSON fails.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(out.status.code(), Some(101), "{err}");
    assert!(
        out.status.signal() == Some(libc::SIGPIPE) || out.status.success(),
        "{:?}: {err}",
        out.status
    );
}
