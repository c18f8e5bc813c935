//! The `trt` backend through the real `trtcache` binary and daemon: the precise failure on
//! this machine (no TensorRT, no shim: exit 2 naming what is missing), and, with two TEST
//! DOUBLES standing in for what this machine lacks, everything around TensorRT end to end:
//! the C double of `include/trtcache_trt.h` (`shim/double/trtcache_trt_double.c`, through
//! `TRTCACHE_TRT_SHIM`) and a CUDA driver double reporting one GPU
//! (`shim/double/cuda_driver_double.c`, first on `LD_LIBRARY_PATH`). Real ONNX Runtime CPU is
//! the validation reference, real sled/blobs the store, real sockets the daemon. This
//! proves the plumbing (keys, artifact layout, timing-cache sharing, validation refusal,
//! export, client accessors), never TensorRT (docs/trt.md).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support;
use crate::trt::{cc, double, host_has_tensorrt};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const PROFILE: [&str; 6] = [
    "--min-shapes",
    "x:1x4",
    "--opt-shapes",
    "x:2x4",
    "--max-shapes",
    "x:8x4",
];

/// A fake GPU host: the TensorRT shim double and a CUDA driver double in a temp dir.
struct Host {
    _dir: tempfile::TempDir,
    shim: PathBuf,
    cuda: PathBuf,
}

impl Host {
    /// `shim_defines` go to the shim double (`-DDOUBLE_VERSION=…`), `gpu` names the GPU.
    fn new(shim_defines: &[&str], gpu: &str) -> Host {
        Host::with(shim_defines, gpu, &[])
    }

    /// As [`Host::new`], with defines for the CUDA driver double too (`-DDOUBLE_GPU_COUNT=2`).
    fn with(shim_defines: &[&str], gpu: &str, cuda_defines: &[&str]) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let shim_dir = dir.path().join("shim");
        let cuda = dir.path().join("cuda");
        std::fs::create_dir_all(&shim_dir).unwrap();
        std::fs::create_dir_all(&cuda).unwrap();
        let shim = double(&shim_dir, shim_defines);
        let mut defines = vec![format!("-DDOUBLE_GPU_NAME=\"{gpu}\"")];
        defines.extend(cuda_defines.iter().map(|d| d.to_string()));
        let defines: Vec<&str> = defines.iter().map(String::as_str).collect();
        cc(
            &[&repo().join("shim/double/cuda_driver_double.c")],
            &cuda.join("libcuda.so"),
            &defines,
        );
        Host {
            _dir: dir,
            shim,
            cuda,
        }
    }

    fn env(&self) -> Vec<(String, OsString)> {
        let mut ld = OsString::from(&self.cuda);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            ld.push(":");
            ld.push(old);
        }
        vec![
            ("TRTCACHE_TRT_SHIM".into(), self.shim.clone().into()),
            ("LD_LIBRARY_PATH".into(), ld),
        ]
    }

    fn run(&self, args: &[&str]) -> Output {
        support::cmd()
            .args(args)
            .envs(self.env())
            .env_remove("TENSORRT_ROOT")
            .output()
            .expect("running trtcache")
    }
}

/// `ident.onnx` (Identity, x float[n,4] → y, what the double computes) and `bad.onnx` (the
/// same graph marked for the double to perturb: an engine over tolerance).
fn models(dir: &Path) -> (PathBuf, PathBuf) {
    support::run_python(
        r#"
import sys, os, onnx
from onnx import helper, TensorProto
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
ops = [helper.make_opsetid("", 17)]
onnx.save(helper.make_model(g, ir_version=8, opset_imports=ops), os.path.join(sys.argv[1], "ident.onnx"))
onnx.save(helper.make_model(g, ir_version=8, opset_imports=ops, doc_string="trtcache-double-perturb"),
          os.path.join(sys.argv[1], "bad.onnx"))
"#,
        &[dir],
    );
    (dir.join("ident.onnx"), dir.join("bad.onnx"))
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn without_tensorrt_build_exits_2_naming_tensorrt_and_how_to_install_it() {
    assert!(
        !host_has_tensorrt(),
        "this test is for hosts without TensorRT (scripts/gpu-check.sh covers the others)"
    );
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let model = repo().join("examples/models/tiny_encoder_static.onnx");
    let out = support::cmd()
        .args([
            "build",
            s(&model),
            "--backend",
            "trt",
            "--cache-dir",
            s(&cache),
        ])
        .env_remove("TRTCACHE_TRT_SHIM")
        .env_remove("TENSORRT_ROOT")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for want in [
        "with trt: TensorRT is not available: ",
        "TensorRT's libnvinfer.so.10 and libnvonnxparser.so.10 not found",
        "cannot open shared object file",
        "the TensorRT shim libtrtcache_trt.so not found (looked at ",
        "apt install libnvinfer10 libnvonnxparsers10",
        "pip install 'tensorrt-cu13==10.*'",
        "TENSORRT_ROOT=DIR cargo build --release",
        "TRTCACHE_TRT_SHIM",
        "(docs/trt.md)",
    ] {
        assert!(err.contains(want), "missing {want:?} in\n{err}");
    }
    // Nothing was recorded against the model: it is the host's problem.
    let ls = support::trtcache(["ls", "--json", "--cache-dir", s(&cache)]);
    assert_eq!(json(&ls), serde_json::json!([]), "{}", stderr(&ls));

    // With a GPU but no shim, the key says the same (the version comes from the library).
    let h = Host::new(&[], "NVIDIA H200 (trtcache double)");
    let out = support::cmd()
        .args([
            "key",
            s(&model),
            "--backend",
            "trt",
            "--cache-dir",
            s(&cache),
        ])
        .envs(h.env())
        .env_remove("TRTCACHE_TRT_SHIM")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("backend trt: TensorRT is not available")
            && err.contains("libtrtcache_trt.so"),
        "{err}"
    );
}

#[test]
fn trt_builds_validate_key_and_share_a_timing_cache() {
    let h = Host::new(&[], "NVIDIA H200 (trtcache double)");
    let d = tempfile::tempdir().unwrap();
    let (ident, bad) = models(d.path());
    let cache = d.path().join("cache");
    let build = |h: &Host, model: &Path, extra: &[&str]| {
        let mut args = vec!["build", s(model), "--backend", "trt", "--json"];
        args.extend(["--cache-dir", s(&cache)]);
        args.extend(PROFILE);
        args.extend(extra);
        h.run(&args)
    };

    let out = build(&h, &ident, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json(&out);
    assert_eq!(r["cache_hit"], false);
    let entry = PathBuf::from(r["artifact"]["entry"].as_str().unwrap());
    assert_eq!(entry.file_name().unwrap(), "engine.plan");
    let files: Vec<&str> = r["record"]["artifact"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files.contains(&"engine.plan") && files.contains(&"engine.json"));
    let parts = &r["record"]["parts"];
    assert_eq!(
        parts["backend"]["versions"],
        serde_json::json!({"tensorrt": "10.16.1", "trtcache-trt-abi": "2"})
    );
    assert_eq!(parts["sku"]["name"], "NVIDIA H200 (trtcache double)");
    assert_eq!(parts["sku"]["sm_count"], 132);
    // fp32 means fp32: TensorRT's default TF32 is cleared (it misses the fp32 tolerance).
    assert_eq!(parts["options"]["trt.precision"], "fp32,no-tf32");
    assert_eq!(parts["options"]["trt.hardware_compatibility"], "none");
    assert_eq!(parts["options"]["trt.builder_optimization_level"], "3");
    let v = &r["record"]["validation"];
    assert_eq!(v["passed"], true);
    assert_eq!(v["shapes"]["x"], serde_json::json!([2, 4]));
    // The artifact: the plan exactly as the builder returned it, and its metadata.
    let dir = entry.parent().unwrap();
    let meta = trtcache::trt::artifact::read_meta(dir).unwrap();
    assert_eq!(meta.tensorrt_version, "10.16.1");
    assert_eq!(meta.compute_capability.as_deref(), Some("9.0"));
    assert_eq!(meta.profiles[0].opt["x"], vec![2, 4]);
    assert_eq!(meta.inputs[0].name, "x");
    assert_eq!(meta.outputs[0].shape, vec![-1, 4]);
    let plan = std::fs::read(&entry).unwrap();
    assert!(plan.starts_with(b"TRTDOUBLEPLAN\n"));
    // The profile crossed the boundary.
    assert!(
        String::from_utf8_lossy(&plan).contains("\"min0\":1,\"max0\":8"),
        "{}",
        String::from_utf8_lossy(&plan)
    );

    // The same build again is a hit; `trtcache key` computes the same key.
    let again = json(&build(&h, &ident, &[]));
    assert_eq!(again["cache_hit"], true);
    let key = |h: &Host, extra: &[&str]| {
        let mut args = vec!["key", s(&ident), "--backend", "trt", "--json"];
        args.extend(["--cache-dir", s(&cache)]);
        args.extend(PROFILE);
        args.extend(extra);
        let out = h.run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        json(&out)
    };
    let k = key(&h, &[]);
    assert_eq!(k["key"], r["key"]);

    // An engine over tolerance: stored as failed, never served, exit 1.
    let out = build(&h, &bad, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rb = json(&out);
    assert_eq!(rb["servable"], false);
    assert_eq!(rb["state"], "failed");
    assert!(rb["artifact"].is_null());
    assert!(rb["record"]["artifact"].is_null());
    let max_abs = rb["record"]["validation"]["outputs"][0]["max_abs"]
        .as_f64()
        .unwrap();
    assert!((max_abs - 0.5).abs() < 1e-6, "{max_abs}");

    // One shared timing cache for (this GPU, TensorRT 10.16.1), holding both builds' entries
    // (a failed validation keeps its timings).
    let timing: Vec<PathBuf> = std::fs::read_dir(cache.join("timing"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "timing"))
        .collect();
    assert_eq!(timing.len(), 1, "{timing:?}");
    let t = std::fs::read_to_string(&timing[0]).unwrap();
    for len in [
        ident.metadata().unwrap().len(),
        bad.metadata().unwrap().len(),
    ] {
        assert!(t.contains(&format!("entry-model-{len}")), "{t}");
    }
    assert!(timing[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .contains("trt10.16.1"));

    // The key follows the GPU exactly, unless a hardware-compatibility level widens it.
    let h100 = Host::new(&[], "NVIDIA H100 (trtcache double)");
    assert_ne!(key(&h100, &[])["key"], k["key"]);
    let same = ["--trt-hardware-compat", "same-compute-capability"];
    let a = key(&h, &same);
    assert_eq!(a["parts"]["sku"]["name"], "compute-capability:9.0");
    assert_eq!(key(&h100, &same)["key"], a["key"]);
    assert_ne!(a["key"], k["key"]);
    let amp = key(&h, &["--trt-hardware-compat", "ampere-plus"]);
    assert_eq!(amp["parts"]["sku"]["name"], "compute-class:ampere-plus");
    assert_eq!(
        amp["parts"]["options"]["trt.hardware_compatibility"],
        "ampere-plus"
    );
    assert_ne!(amp["key"], a["key"]);
    // Workspace and builder level are key options too.
    let ws = key(&h, &["--trt-workspace", "1G"]);
    assert_eq!(ws["parts"]["options"]["trt.workspace_bytes"], "1073741824");
    assert_ne!(ws["key"], k["key"]);

    // The version comes from the loaded library: another TensorRT, another key and timing file.
    let newer = Host::new(
        &["-DDOUBLE_VERSION=101700"],
        "NVIDIA H200 (trtcache double)",
    );
    let kn = key(&newer, &[]);
    assert_eq!(kn["parts"]["backend"]["versions"]["tensorrt"], "10.17.0");
    assert_ne!(kn["key"], k["key"]);
    let out = build(&newer, &ident, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(cache.join("timing")).unwrap().count(), 4);

    // Export: a Triton repository from the ready trt engines (the two `ident` engines share a
    // compute capability, so the most recently used one is exported).
    let repo_dir = d.path().join("triton");
    let out = h.run(&[
        "export",
        "--triton-repo",
        s(&repo_dir),
        "--cache-dir",
        s(&cache),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("skipping"), "{}", stderr(&out));
    let cfg = std::fs::read_to_string(repo_dir.join("ident/config.pbtxt")).unwrap();
    for want in [
        "name: \"ident\"",
        "platform: \"tensorrt_plan\"",
        "max_batch_size: 0",
        "name: \"x\"\n    data_type: TYPE_FP32\n    dims: [ -1, 4 ]",
        "default_model_filename: \"model.plan\"",
        "{ key: \"9.0\" value: \"model.sm90.plan\" }",
    ] {
        assert!(cfg.contains(want), "missing {want:?} in\n{cfg}");
    }
    let exported = std::fs::read(repo_dir.join("ident/1/model.plan")).unwrap();
    assert!(exported.starts_with(b"TRTDOUBLEPLAN\n"));
    assert_eq!(
        exported,
        std::fs::read(repo_dir.join("ident/1/model.sm90.plan")).unwrap()
    );
    // --json: the same export as one object on stdout.
    let out = h.run(&[
        "export",
        "--triton-repo",
        s(&repo_dir),
        "--cache-dir",
        s(&cache),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["engines"], 1, "{v}");
    assert!(
        v["configs"][0]
            .as_str()
            .unwrap()
            .ends_with("ident/config.pbtxt"),
        "{v}"
    );
    // The failed `bad` engine is not exported; asking for it is an error (JSON with --json).
    assert!(!repo_dir.join("bad").exists());
    let out = h.run(&[
        "export",
        "--triton-repo",
        s(&repo_dir),
        "--model",
        "bad",
        "--cache-dir",
        s(&cache),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`bad`"),
        "{v}"
    );
    assert!(
        stderr(&out).contains("no ready trt artifact for model `bad`"),
        "{}",
        stderr(&out)
    );
}

/// A shared timing cache TensorRT refuses to attach (written on another device property
/// set, or damaged) is set aside and the build goes on without it; before, every `trt` build
/// for that SKU failed until someone deleted the file.
#[test]
fn a_timing_cache_tensorrt_refuses_is_set_aside_and_the_build_goes_on() {
    let h = Host::new(&[], "NVIDIA H200 (trtcache double)");
    let d = tempfile::tempdir().unwrap();
    let (ident, _) = models(d.path());
    let cache = d.path().join("cache");
    let build = |extra: &[&str]| {
        let mut args = vec!["build", s(&ident), "--backend", "trt", "--json"];
        args.extend(["--cache-dir", s(&cache)]);
        args.extend(PROFILE);
        args.extend(extra);
        h.run(&args)
    };
    let out = build(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let files = |suffix: &str| -> Vec<PathBuf> {
        std::fs::read_dir(cache.join("timing"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains(suffix))
            .filter(|p| p.extension().is_none_or(|x| x != "lock"))
            .collect()
    };
    let timing = files(".timing");
    assert_eq!(timing.len(), 1, "{timing:?}");
    std::fs::write(&timing[0], b"not a timing cache at all").unwrap();
    let out = build(&["--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let refused = files(".refused-");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(
        std::fs::read(&refused[0]).unwrap(),
        b"not a timing cache at all"
    );
    // The new build's cache took its place.
    let fresh = std::fs::read_to_string(&timing[0]).unwrap();
    assert!(fresh.starts_with("double-timing-cache"), "{fresh}");
    let out = build(&["--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(files(".refused-").len(), 1);
}

#[test]
fn a_dynamic_input_without_a_profile_is_refused_by_name() {
    let h = Host::new(&[], "NVIDIA H200 (trtcache double)");
    let d = tempfile::tempdir().unwrap();
    let (ident, _) = models(d.path());
    let cache = d.path().join("cache");
    let out = h.run(&[
        "build",
        s(&ident),
        "--backend",
        "trt",
        "--cache-dir",
        s(&cache),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("needs a shape profile for every dynamic input, and x:Nx4 has none"),
        "{err}"
    );
}

#[test]
fn the_daemon_builds_trt_and_clients_get_the_engine() {
    let h = Host::new(&[], "NVIDIA H200 (trtcache double)");
    let mut d = crate::daemon::Daemon::new();
    // Both models straight into the repository, each with a profile in its sidecar.
    models(&d.models());
    std::fs::write(
        d.models().join("ident.trtcache.toml"),
        "[profiles.small]\nmin = { x = [1, 4] }\nopt = { x = [2, 4] }\nmax = { x = [8, 4] }\n",
    )
    .unwrap();
    std::fs::write(
        d.models().join("bad.trtcache.toml"),
        "[profiles.small]\nopt = { x = [2, 4] }\n",
    )
    .unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    // The daemon's builder settings for trt come from `[trt]`.
    std::fs::write(
        d.config(),
        cfg.replace("[limits]", "backends = [\"trt\", \"ort-cpu\"]\n[limits]")
            + "[trt]\nhardware_compatibility = \"ampere-plus\"\nworkspace_bytes = 1073741824\n",
    )
    .unwrap();
    let bad_cfg = d.root.join("bad.toml");
    std::fs::write(&bad_cfg, "[trt]\nhardware_compatibility = \"all\"\n").unwrap();
    let out = support::trtcache(["config", "--config", s(&bad_cfg)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("trt.hardware_compatibility"),
        "{}",
        stderr(&out)
    );
    d.env = h.env();
    d.start();
    d.wait_settled(&["ident", "bad"]);
    let mut c = d.client();
    let a = c
        .acquire(&trtcache_client::AcquireRequest {
            model: "ident".into(),
            backend: Some("trt".into()),
            wait: true,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert_eq!(a.metadata.backend, "trt");
    assert_eq!(a.metadata.files[0].name, "engine.plan");
    assert_eq!(a.metadata.files[0].role, "graph");
    assert_eq!(a.metadata.inputs[0].name, "x");
    assert_eq!(a.metadata.inputs[0].dtype, "float32");
    assert_eq!(
        a.metadata.inputs[0].shape,
        vec![serde_json::json!(-1), serde_json::json!(4)]
    );
    assert!(a.metadata.validation.passed);
    let plan = a.engine_bytes().unwrap();
    assert!(plan.starts_with(b"TRTDOUBLEPLAN\n"));
    assert_eq!(std::fs::read(a.engine_proc_path().unwrap()).unwrap(), plan);
    let meta = a.engine_meta().unwrap();
    assert_eq!(meta.tensorrt_version, "10.16.1");
    assert_eq!(meta.plan_bytes, plan.len() as u64);
    assert_eq!(meta.profiles[0].opt["x"], vec![2, 4]);
    assert_eq!(meta.outputs[0].shape, vec![-1, 4]);
    assert_eq!(meta.hardware_compatibility, "ampere-plus");
    assert!(String::from_utf8_lossy(&plan).contains("\"workspace_bytes\":1073741824,"));
    // An ort-cpu artifact is not an engine.
    let cpu = c
        .acquire(&trtcache_client::AcquireRequest {
            model: "ident".into(),
            backend: Some("ort-cpu".into()),
            wait: true,
            ..Default::default()
        })
        .unwrap();
    assert!(matches!(
        cpu.engine_file(),
        Err(trtcache_client::engine::EngineError::NotAnEngine { .. })
    ));
    // The engine over tolerance is never served.
    let e = c
        .acquire(&trtcache_client::AcquireRequest {
            model: "bad".into(),
            backend: Some("trt".into()),
            wait: true,
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(
        e.code(),
        Some(trtcache_client::ErrorCode::BuildFailed),
        "{e}"
    );
    drop(c);

    // The Python client, for tensorrt.Runtime().deserialize_cuda_engine.
    let out = support::run_python(
        r#"
import sys
sys.path.insert(0, sys.argv[1])
import trtcache_client as t
with t.Client(sys.argv[2]) as c:
    with c.acquire("ident", backend="trt") as a:
        plan = a.engine_bytes()
        assert plan.startswith(b"TRTDOUBLEPLAN\n"), plan[:20]
        with open(a.engine_path(), "rb") as f:
            assert f.read() == plan
        m = a.engine_meta()
        assert m["plan_bytes"] == len(plan) and m["inputs"][0]["shape"] == [-1, 4], m
        print("engine", len(plan), m["tensorrt_version"], m["compute_capability"])
    with c.acquire("ident", backend="ort-cpu") as a:
        try:
            a.engine_bytes()
            raise SystemExit("engine_bytes on ort-cpu")
        except t.NotAnEngine as e:
            print("not an engine:", e.code)
"#,
        &[&repo().join("clients/python"), &d.socket()],
    );
    assert!(out.contains(" 10.16.1 9.0\n"), "{out}");
    assert!(out.contains("not an engine: not_an_engine"), "{out}");
    assert!(d.stop());
}

#[test]
fn inspect_trt_sets_the_parsers_verdict_beside_the_tables() {
    let model = repo().join("examples/models/tiny_encoder_static.onnx");
    // Without TensorRT: exit 2 naming it, before any analysis output.
    let out = support::cmd()
        .args(["inspect", s(&model), "--trt"])
        .env_remove("TRTCACHE_TRT_SHIM")
        .env_remove("TENSORRT_ROOT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        stderr(&out).contains("inspect --trt: TensorRT is not available"),
        "{}",
        stderr(&out)
    );
    // Through the double (its canned verdict: nodes 0 and 1 in a supported subgraph, the
    // rest in none), against the real analysis, which puts all four nodes on TensorRT.
    let h = Host::new(&[], "NVIDIA H200 (trtcache double)");
    let out = h.run(&["inspect", s(&model), "--trt", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json(&out);
    let p = &r["parser"];
    assert_eq!(p["tensorrt_version"], "10.16.1");
    let nodes = p["nodes"].as_array().unwrap();
    assert_eq!(
        nodes.len(),
        r["capability"]["nodes"].as_array().unwrap().len()
    );
    assert_eq!(nodes[0]["parser"], true);
    assert_eq!(nodes[0]["disagree"], false);
    assert!(nodes[2]["parser"].is_null());
    assert_eq!(nodes[2]["table"], true);
    assert_eq!(nodes[2]["disagree"], true);
    assert_eq!(p["disagreements"], 2);
    let text = String::from_utf8(h.run(&["inspect", s(&model), "--trt"]).stdout).unwrap();
    assert_eq!(text.matches("DISAGREE").count(), 2, "{text}");
    assert!(
        text.contains("2 of 4 nodes disagree with the table"),
        "{text}"
    );
}

#[test]
fn a_daemon_without_the_shim_says_what_is_missing() {
    let h = Host::new(&[], "NVIDIA H200 (trtcache double)");
    let mut d = crate::daemon::Daemon::new();
    models(&d.models());
    std::fs::remove_file(d.models().join("bad.onnx")).unwrap();
    std::fs::write(
        d.models().join("ident.trtcache.toml"),
        "[profiles.small]\nopt = { x = [2, 4] }\n",
    )
    .unwrap();
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        cfg.replace("[limits]", "backends = [\"trt\"]\n[limits]"),
    )
    .unwrap();
    let missing = d.root.join("no-such-shim.so");
    d.env = h.env();
    d.env.retain(|(k, _)| k != "TRTCACHE_TRT_SHIM");
    d.env
        .push(("TRTCACHE_TRT_SHIM".into(), missing.clone().into()));
    d.start();
    d.wait_settled(&["ident"]);
    let e = d
        .client()
        .acquire(&trtcache_client::AcquireRequest {
            model: "ident".into(),
            backend: Some("trt".into()),
            wait: true,
            ..Default::default()
        })
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("TensorRT is not available")
            && msg.contains(&format!("(looked at {})", missing.display())),
        "{msg}"
    );
    assert!(d.stop());
}

/// `--device` and `TRTCACHE_DEVICE` reach the shim: on a host with two GPUs (both doubles
/// report two), a build for GPU 1 is parsed, built, timed and validated on CUDA device 1 (the
/// shim double writes the device into the plan and refuses to load a plan on another device)
/// and keyed with GPU 1's SKU, not GPU 0's.
#[test]
fn trt_builds_run_on_the_configured_device() {
    let h = Host::with(
        &["-DDOUBLE_DEVICE_COUNT=2"],
        "NVIDIA H200 (trtcache double)",
        &["-DDOUBLE_GPU_COUNT=2"],
    );
    let d = tempfile::tempdir().unwrap();
    let (ident, _) = models(d.path());
    for (i, by_env) in [false, true].into_iter().enumerate() {
        let cache = d.path().join(format!("cache-{i}"));
        let mut args = vec!["build", s(&ident), "--backend", "trt", "--json"];
        args.extend(["--cache-dir", s(&cache)]);
        args.extend(PROFILE);
        let mut c = support::cmd();
        c.envs(h.env()).env_remove("TENSORRT_ROOT");
        if by_env {
            c.env("TRTCACHE_DEVICE", "1");
        } else {
            args.extend(["--device", "1"]);
            c.env_remove("TRTCACHE_DEVICE");
        }
        let out = c.args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let r = json(&out);
        let parts = &r["record"]["parts"];
        assert_eq!(
            parts["sku"]["name"], "NVIDIA A100-SXM4-80GB (trtcache double)",
            "{parts}"
        );
        // Validation loaded the engine on device 1: the double refuses any other.
        assert_eq!(r["record"]["validation"]["passed"], true, "{r}");
        let entry = PathBuf::from(r["artifact"]["entry"].as_str().unwrap());
        let plan = String::from_utf8(std::fs::read(&entry).unwrap()).unwrap();
        assert!(plan.contains("\"device\":1,"), "{plan}");
        let meta = trtcache::trt::artifact::read_meta(entry.parent().unwrap()).unwrap();
        assert_eq!(meta.gpu, "NVIDIA A100-SXM4-80GB (trtcache double)");
        assert_eq!(meta.compute_capability.as_deref(), Some("8.0"));
    }
    // A GPU the shim cannot see is refused by the shim, naming the device.
    let lone = Host::with(
        &[],
        "NVIDIA H200 (trtcache double)",
        &["-DDOUBLE_GPU_COUNT=2"],
    );
    let cache = d.path().join("cache-lone");
    let mut args = vec!["build", s(&ident), "--backend", "trt", "--device", "1"];
    args.extend(["--cache-dir", s(&cache)]);
    args.extend(PROFILE);
    let out = lone.run(&args);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("CUDA device 1 does not exist"), "{err}");
}
