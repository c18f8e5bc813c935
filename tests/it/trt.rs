//! The native TensorRT backend's Rust side, tested against a C TEST DOUBLE of
//! `include/trtcache_trt.h` (`shim/double/trtcache_trt_double.c`, compiled here with the system
//! C compiler) and against real `dlopen` failures. This proves the plumbing (loading, the ABI
//! check, error mapping, option marshalling, artifact layout, key parts, the shared timing
//! cache, validation and the Triton export), never TensorRT itself: no GPU and no TensorRT
//! exist where these tests run (docs/trt.md). Also: `scripts/gpu-check.sh`'s no-GPU branch.

use std::path::{Path, PathBuf};
use std::process::Command;

use trtcache::device::Sku;
use trtcache::plan::ShapeProfile;
use trtcache::trt::artifact::{self, EngineMeta};
use trtcache::trt::timing::TimingCacheStore;
use trtcache::trt::triton::{export_triton_repo, TritonEntry};
use trtcache::trt::{
    keys, loader, BuildOptions, HostTensor, HwCompat, LoaderConfig, Precision, Status, Trt,
    TrtError,
};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles C sources into a shared library with the system compiler.
pub(crate) fn cc(srcs: &[&Path], out: &Path, extra: &[&str]) {
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
        ])
        .arg(format!("-I{}", repo().join("include").display()))
        .args(srcs)
        .args(extra)
        .arg("-o")
        .arg(out)
        .status()
        .expect("running the C compiler (cc)");
    assert!(st.success(), "compiling {srcs:?} failed");
}

pub(crate) fn double_src() -> PathBuf {
    repo().join("shim/double/trtcache_trt_double.c")
}

/// The test double, compiled into `dir` with extra defines.
pub(crate) fn double(dir: &Path, defines: &[&str]) -> PathBuf {
    let out = dir.join("libtrtcache_trt.so");
    cc(&[&double_src()], &out, defines);
    out
}

fn load_double(dir: &Path) -> Trt {
    Trt::load(&LoaderConfig {
        shim: Some(double(dir, &[])),
        ..LoaderConfig::default()
    })
    .expect("loading the test double")
}

/// Whether this host has TensorRT's library on the loader's path.
pub(crate) fn host_has_tensorrt() -> bool {
    // SAFETY: probing a system library by name; it stays loaded only while the handle lives.
    unsafe { libloading::Library::new("libnvinfer.so.10") }.is_ok()
}

#[test]
fn without_tensorrt_the_loader_says_exactly_what_is_missing() {
    let defaults = LoaderConfig::default();
    let shim_built = defaults.shim_candidates().iter().any(|p| p.is_file());
    if shim_built && host_has_tensorrt() {
        // A TensorRT host with the shim built: the precise failure cannot happen here.
        Trt::load(&defaults).unwrap();
        return;
    }
    let e = Trt::load(&defaults).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, TrtError::Unavailable(_)), "{e:?}");
    assert!(msg.starts_with("TensorRT is not available: "), "{msg}");
    if shim_built {
        assert!(msg.contains("could not be opened"), "{msg}");
    } else {
        assert!(
            msg.contains("libtrtcache_trt.so not found (looked at "),
            "{msg}"
        );
        assert!(
            msg.contains("TENSORRT_ROOT=DIR cargo build --release"),
            "{msg}"
        );
        assert!(msg.contains(loader::SHIM_ENV), "{msg}");
    }
    if !host_has_tensorrt() {
        assert!(
            msg.contains("TensorRT's libnvinfer.so.10 and libnvonnxparser.so.10 not found"),
            "{msg}"
        );
        assert!(msg.contains("cannot open shared object file"), "{msg}");
        assert!(
            msg.contains("apt install libnvinfer10 libnvonnxparsers10"),
            "{msg}"
        );
        assert!(msg.contains("pip install 'tensorrt-cu13==10.*'"), "{msg}");
    }
    // An explicit shim path is the only place looked at.
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("nope.so");
    let msg = Trt::load(&LoaderConfig {
        shim: Some(p.clone()),
        ..LoaderConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains(&format!("(looked at {})", p.display())),
        "{msg}"
    );
    // The `ort-tensorrt` key's version probe fails the same precise way.
    if !host_has_tensorrt() {
        let msg = loader::tensorrt_library_version(&LoaderConfig::default())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("libnvinfer.so.10"), "{msg}");
        assert!(!msg.contains("shim"), "{msg}");
    }
}

#[test]
fn a_shim_whose_tensorrt_is_gone_names_the_library() {
    let d = tempfile::tempdir().unwrap();
    // A stand-in `libnvinfer.so.10` to link against, removed before loading: the dynamic
    // loader then fails on it exactly as on a host where TensorRT was uninstalled.
    let stub_c = d.path().join("stub.c");
    std::fs::write(&stub_c, "int trtcache_stub_symbol(void) { return 0; }\n").unwrap();
    let stub = d.path().join("libnvinfer.so.10");
    cc(&[&stub_c], &stub, &["-Wl,-soname,libnvinfer.so.10"]);
    let shim = d.path().join("libtrtcache_trt.so");
    cc(
        &[&double_src()],
        &shim,
        &[
            "-Wl,--no-as-needed",
            &format!("-L{}", d.path().display()),
            "-l:libnvinfer.so.10",
        ],
    );
    std::fs::remove_file(&stub).unwrap();
    let e = Trt::load(&LoaderConfig {
        shim: Some(shim.clone()),
        ..LoaderConfig::default()
    })
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "the TensorRT shim {} could not be opened",
            shim.display()
        )),
        "{msg}"
    );
    assert!(
        msg.contains("libnvinfer.so.10: cannot open shared object file"),
        "{msg}"
    );
}

#[test]
fn the_abi_version_and_every_symbol_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let shim = double(d.path(), &["-DDOUBLE_ABI=99"]);
    let msg = Trt::load(&LoaderConfig {
        shim: Some(shim),
        ..LoaderConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("implements C API version 99, this trtcache needs 2"),
        "{msg}"
    );

    // A library with only some of the header's functions.
    let partial_c = d.path().join("partial.c");
    std::fs::write(
        &partial_c,
        "#include \"trtcache_trt.h\"\nuint32_t trtcache_trt_abi_version(void) { return TRTCACHE_TRT_ABI_VERSION; }\n",
    )
    .unwrap();
    let partial = d.path().join("libpartial.so");
    cc(&[&partial_c], &partial, &[]);
    let msg = Trt::load(&LoaderConfig {
        shim: Some(partial),
        ..LoaderConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(msg.contains("could not be opened"), "{msg}");
    assert!(msg.contains("trtcache_trt_"), "{msg}");
}

#[test]
fn versions_come_from_the_loaded_library() {
    let d = tempfile::tempdir().unwrap();
    let trt = load_double(d.path());
    assert_eq!(trt.version().to_string(), "10.16.1");
    assert_eq!(trt.compiled_major(), 10);
    let v = keys::backend_versions(&trt);
    assert_eq!(v["tensorrt"], "10.16.1");
    assert_eq!(v["trtcache-trt-abi"], "2");
    let other = tempfile::tempdir().unwrap();
    let trt11 = Trt::load(&LoaderConfig {
        shim: Some(double(other.path(), &["-DDOUBLE_VERSION=110100"])),
        ..LoaderConfig::default()
    })
    .unwrap();
    assert_eq!(keys::backend_versions(&trt11)["tensorrt"], "11.1.0");

    // Without the shim, from libnvinfer's own getInferLibVersion (a stand-in library in a
    // TENSORRT_ROOT-style folder; a misleading file name next to it does not matter).
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("lib")).unwrap();
    let src = root.path().join("v.c");
    std::fs::write(&src, "int getInferLibVersion(void) { return 100903; }\n").unwrap();
    cc(&[&src], &root.path().join("lib/libnvinfer.so.10"), &[]);
    std::fs::write(root.path().join("lib/libnvinfer.so.10.99.0"), b"").unwrap();
    let v = loader::tensorrt_library_version(&LoaderConfig {
        tensorrt_root: Some(root.path().to_path_buf()),
        ..LoaderConfig::default()
    })
    .unwrap();
    assert_eq!(v.to_string(), "10.9.3");
}

fn profile() -> ShapeProfile {
    let mut p = ShapeProfile {
        name: "default".into(),
        ..Default::default()
    };
    p.min.insert("x".into(), vec![1, 4]);
    p.opt.insert("x".into(), vec![2, 4]);
    p.max.insert("x".into(), vec![8, 4]);
    p
}

#[test]
fn builds_marshal_every_option_and_errors_keep_the_shims_message() {
    let d = tempfile::tempdir().unwrap();
    let trt = load_double(d.path());
    let mut net = trt.parse(b"model bytes", Some(d.path()), 0).unwrap();
    let io = net.io().unwrap();
    assert_eq!(io.inputs[0].name, "x");
    assert_eq!(io.inputs[0].shape, vec![-1, 4]);
    let opts = BuildOptions {
        precision: Precision::parse("fp16,no-tf32").unwrap(),
        workspace_bytes: Some(1 << 30),
        builder_optimization_level: Some(4),
        hardware_compatibility: HwCompat::AmperePlus,
        profiles: vec![profile()],
        timing_cache: Vec::new(),
    };
    let built = net.build(&opts).unwrap();
    let plan = String::from_utf8(built.plan.clone()).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(plan.strip_prefix("TRTDOUBLEPLAN\n").unwrap()).unwrap();
    assert_eq!(json["precision_flags"], 1 | 16);
    assert_eq!(json["workspace_bytes"], 1u64 << 30);
    assert_eq!(json["opt_level"], 4);
    assert_eq!(json["hwcompat"], 1);
    assert_eq!(
        json["profiles"],
        serde_json::json!([[{"input": "x", "min0": 1, "max0": 8, "rank": 2}]])
    );
    assert!(String::from_utf8_lossy(&built.timing_cache).contains("entry-model-11"));
    // Defaults cross as "TensorRT's default".
    let plan = net.build(&BuildOptions::default()).unwrap().plan;
    let json: serde_json::Value = serde_json::from_slice(&plan[14..]).unwrap();
    assert_eq!(json["opt_level"], -1);
    assert_eq!(json["workspace_bytes"], 0);

    // Statuses and messages from the shim.
    match trt.parse(b"REJECT this", None, 0) {
        Err(TrtError::Call {
            call: "parse",
            status: Status::ParseFailed,
            message,
        }) => assert!(message.contains("no importer for op Foo"), "{message}"),
        other => panic!("{:?}", other.err()),
    }
    let e = net
        .build(&BuildOptions {
            timing_cache: b"garbage".to_vec(),
            ..BuildOptions::default()
        })
        .err()
        .unwrap();
    assert!(
        matches!(
            &e,
            TrtError::Call {
                status: Status::DeserializeFailed,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "TensorRT build: deserialization failed: double: the timing cache could not be read"
    );
    // Checked before the boundary.
    let e = net
        .build(&BuildOptions {
            builder_optimization_level: Some(9),
            ..BuildOptions::default()
        })
        .err()
        .unwrap();
    assert!(e.to_string().contains("outside 0..=5"), "{e}");
    assert!(trt.load_engine(b"not a plan", 0).is_err());
    assert!(trt.parse(b"nul\0dir", Some(Path::new("a\0b")), 0).is_err());
}

#[test]
fn the_parsers_verdict_per_node() {
    let d = tempfile::tempdir().unwrap();
    let trt = load_double(d.path());
    let r = trt.supports(b"PARTIAL model", None, 0).unwrap();
    assert!(!r.supported);
    let v = r.node_verdicts();
    assert_eq!(v.get(&0), Some(&true));
    assert_eq!(v.get(&1), Some(&false));
    assert!(trt.supports(b"model", None, 0).unwrap().supported);
}

/// A one-node Identity model and ONNX Runtime CPU's output on `x`: the reference.
fn reference(dir: &Path, x: &[f32]) -> Vec<f64> {
    let model = dir.join("identity.onnx");
    let script = r#"
import sys, json, numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
onnx.save(helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.array(json.loads(sys.argv[2]), np.float32).reshape(-1, 4)
print(json.dumps(s.run(None, {"x": x})[0].astype(np.float64).ravel().tolist()))
"#;
    let py = std::env::var_os("TRTCACHE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    let out = Command::new(py)
        .arg("-c")
        .arg(script)
        .arg(&model)
        .arg(serde_json::to_string(x).unwrap())
        .output()
        .expect("running the project's python (scripts/setup-python.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn engines_run_through_the_shim() {
    let d = tempfile::tempdir().unwrap();
    let trt = load_double(d.path());
    let x: Vec<f32> = (0..8).map(|i| i as f32 * 0.25 - 1.0).collect();
    let input = [HostTensor::f32("x", &[2, 4], &x)];
    let mut net = trt.parse(b"identity", None, 0).unwrap();
    let good = net.build(&BuildOptions::default()).unwrap();
    let mut engine = trt.load_engine(&good.plan, 0).unwrap();
    assert_eq!(engine.io().unwrap().profiles, Some(1));
    assert_eq!(
        engine.inspect().unwrap()["Layers"][0]["LayerType"],
        "Identity"
    );
    let got = engine.run(0, &input).unwrap();
    assert_eq!(got[0].name, "y");
    assert_eq!(got[0].shape, vec![2, 4]);
    assert_eq!(got[0].to_f64().unwrap()[7], 0.75);
    // The double perturbs INT8 engines by 0.5 (what validation must catch, tests/it/trt_backend.rs).
    let bad = net
        .build(&BuildOptions {
            precision: Precision::parse("int8").unwrap(),
            ..BuildOptions::default()
        })
        .unwrap();
    let got = trt
        .load_engine(&bad.plan, 0)
        .unwrap()
        .run(0, &input)
        .unwrap();
    assert_eq!(got[0].to_f64().unwrap()[7], 1.25);
    // Run errors keep the shim's words.
    let e = engine.run(1, &input).unwrap_err().to_string();
    assert!(e.contains("profile does not exist"), "{e}");
}

fn gpu(name: &str, cc: &str) -> Sku {
    Sku {
        kind: "gpu".into(),
        name: name.into(),
        compute_capability: Some(cc.into()),
        sm_count: Some(132),
        isa: vec![],
    }
}

#[test]
fn the_timing_cache_is_shared_across_builds() {
    let d = tempfile::tempdir().unwrap();
    let trt = load_double(d.path());
    let store = TimingCacheStore::new(&d.path().join("cache"));
    let sku = gpu("NVIDIA H200", "9.0");
    let v = trt.version().to_string();
    let build = |model: &[u8]| {
        let cache = store.load(&sku, &v).unwrap();
        let built = trt
            .parse(model, None, 0)
            .unwrap()
            .build(&BuildOptions {
                timing_cache: cache,
                ..BuildOptions::default()
            })
            .unwrap();
        store
            .merge_with(&trt, 0, &sku, &built.timing_cache)
            .unwrap();
        built
    };
    assert!(store.load(&sku, &v).unwrap().is_empty());
    build(b"first");
    let second = build(b"second model");
    // The second build started from the first one's entries.
    let out = String::from_utf8(second.timing_cache).unwrap();
    assert!(
        out.contains("entry-model-5") && out.contains("entry-model-12"),
        "{out}"
    );
    // A build that loaded before another wrote still loses nothing: merge, not overwrite.
    let stale = b"double-timing-cache\nentry-model-99\n";
    store.merge_with(&trt, 0, &sku, stale).unwrap();
    let stored = String::from_utf8(store.load(&sku, &v).unwrap()).unwrap();
    for e in ["entry-model-5", "entry-model-12", "entry-model-99"] {
        assert!(stored.contains(e), "{stored}");
    }
    assert_eq!(stored.matches("double-timing-cache").count(), 1, "{stored}");
    // Another SKU starts empty.
    assert!(store
        .load(&gpu("NVIDIA A100", "8.0"), &v)
        .unwrap()
        .is_empty());
    // A cache the merge cannot read is refused and the stored one is kept.
    assert!(store.merge_with(&trt, 0, &sku, b"junk").is_err());
    assert_eq!(
        String::from_utf8(store.load(&sku, &v).unwrap()).unwrap(),
        stored
    );
}

#[test]
fn artifacts_export_to_a_triton_repository() {
    let d = tempfile::tempdir().unwrap();
    let trt = load_double(d.path());
    let mut arts = Vec::new();
    for (gpu_name, cc, hw) in [
        ("NVIDIA H200", "9.0", HwCompat::None),
        ("NVIDIA A100", "8.0", HwCompat::AmperePlus),
    ] {
        let opts = BuildOptions {
            hardware_compatibility: hw,
            profiles: vec![profile()],
            ..BuildOptions::default()
        };
        let built = trt.parse(b"m", None, 0).unwrap().build(&opts).unwrap();
        let io = trt.load_engine(&built.plan, 0).unwrap().io().unwrap();
        let dir = d.path().join(format!("art-{cc}"));
        let meta = EngineMeta {
            format: 0,
            tensorrt_version: trt.version().to_string(),
            gpu: gpu_name.into(),
            compute_capability: Some(cc.into()),
            hardware_compatibility: hw,
            precision: opts.precision,
            workspace_bytes: None,
            builder_optimization_level: None,
            profiles: opts.profiles.clone(),
            inputs: io.inputs,
            outputs: io.outputs,
            plan_bytes: 0,
            plan_sha256: String::new(),
            cuda_driver: None,
        };
        artifact::write_artifact(&dir, &built.plan, &meta).unwrap();
        assert_eq!(std::fs::read(dir.join("engine.plan")).unwrap(), built.plan);
        assert_eq!(
            artifact::read_meta(&dir).unwrap().plan_bytes,
            built.plan.len() as u64
        );
        arts.push((dir, built.plan));
    }
    let repo_dir = d.path().join("triton");
    let entries: Vec<TritonEntry> = arts
        .iter()
        .map(|(dir, _)| TritonEntry {
            name: "encoder".into(),
            artifact: dir.clone(),
        })
        .collect();
    let written = export_triton_repo(&repo_dir, &entries, 1).unwrap();
    assert_eq!(written, vec![repo_dir.join("encoder/config.pbtxt")]);
    let cfg = std::fs::read_to_string(&written[0]).unwrap();
    for want in [
        "name: \"encoder\"",
        "platform: \"tensorrt_plan\"",
        "max_batch_size: 0",
        "name: \"x\"\n    data_type: TYPE_FP32\n    dims: [ -1, 4 ]",
        "name: \"y\"",
        "{ key: \"8.0\" value: \"model.sm80.plan\" },\n  { key: \"9.0\" value: \"model.sm90.plan\" }",
        "default_model_filename: \"model.plan\"",
    ] {
        assert!(cfg.contains(want), "missing {want:?} in\n{cfg}");
    }
    let v1 = repo_dir.join("encoder/1");
    assert_eq!(
        std::fs::read(v1.join("model.sm90.plan")).unwrap(),
        arts[0].1
    );
    assert_eq!(
        std::fs::read(v1.join("model.sm80.plan")).unwrap(),
        arts[1].1
    );
    assert_eq!(std::fs::read(v1.join("model.plan")).unwrap(), arts[1].1);

    // Refused: a bad name, version 0, a damaged plan, two engines for one capability.
    let one = |name: &str| TritonEntry {
        name: name.into(),
        artifact: arts[0].0.clone(),
    };
    assert!(export_triton_repo(&repo_dir, &[one("../x")], 1).is_err());
    assert!(export_triton_repo(&repo_dir, &[one("ok")], 0).is_err());
    let e = export_triton_repo(&repo_dir, &[one("dup"), one("dup")], 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a second engine for compute capability 9.0"),
        "{e}"
    );
    std::fs::write(arts[0].0.join("engine.plan"), b"tampered").unwrap();
    let e = export_triton_repo(&repo_dir, &[one("ok")], 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the metadata says"), "{e}");
}

/// `scripts/gpu-check.sh` on this machine: every step it cannot do says so precisely and the
/// run exits 0; bad usage exits 2.
#[test]
fn gpu_check_reports_every_step_it_cannot_do() {
    let out = tempfile::tempdir().unwrap();
    let script = repo().join("scripts/gpu-check.sh");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_trtcache"));
    let py = std::env::var_os("TRTCACHE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    let run = Command::new(&script)
        .arg("--bin")
        .arg(&bin)
        .arg("--python")
        .arg(&py)
        .env("OUT", out.path())
        .env_remove("TRTCACHE_TRT_SHIM")
        .output()
        .unwrap();
    let summary = std::fs::read_to_string(out.path().join("summary.txt")).unwrap();
    let line = |step: &str| {
        summary
            .lines()
            .find(|l| l.starts_with(&format!("step {step} ")))
            .unwrap_or_else(|| panic!("no step {step} in\n{summary}"))
            .to_string()
    };
    assert!(line("0").contains("onnxruntime 1.31.1"), "{summary}");
    let sku: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("1-sku.json")).unwrap()).unwrap();
    if sku["gpus"].as_array().is_some_and(|g| g.is_empty()) {
        assert_eq!(run.status.code(), Some(0), "{summary}");
        let reason = sku["gpu_unavailable"].as_str().unwrap();
        assert_eq!(
            line("1"),
            format!("step 1 sku: not available: no GPU through the CUDA driver ({reason})")
        );
        for (step, name) in [
            ("2", "key-ort-cuda"),
            ("3", "build-ort-cuda"),
            ("4", "build-ort-tensorrt"),
            ("5", "trt-native"),
            ("6", "trt-backend"),
        ] {
            assert!(
                line(step).starts_with(&format!(
                    "step {step} {name}: not available: no GPU (step 1)"
                )),
                "{summary}"
            );
        }
        // Each step lists everything it lacks, not only the GPU.
        assert!(
            line("3").contains("has no CUDAExecutionProvider"),
            "{summary}"
        );
        if !host_has_tensorrt() {
            assert!(
                line("4").contains("no TensorRT: libnvinfer.so.10"),
                "{summary}"
            );
            assert!(
                line("5").contains("no TensorRT: libnvinfer.so.10"),
                "{summary}"
            );
            assert!(
                line("6").contains("no TensorRT: libnvinfer.so.10"),
                "{summary}"
            );
        }
        let shim = bin.parent().unwrap().join("libtrtcache_trt.so");
        if !shim.exists() {
            assert!(
                line("5").contains(&format!("no shim at {}", shim.display())),
                "{summary}"
            );
        }
        assert!(summary.contains("\ngpu-check: no step failed"), "{summary}");
    } else {
        // A GPU host: every step reported, none silently skipped.
        for step in ["1", "2", "3", "4", "5", "6"] {
            let l = line(step);
            assert!(
                l.contains(": ok") || l.contains(": not available: ") || l.contains(": FAILED: "),
                "{l}"
            );
        }
    }
    // Usage errors.
    let no_out = Command::new(&script).env_remove("OUT").output().unwrap();
    assert_eq!(no_out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_out.stderr).contains("set OUT"));
    let bad_bin = Command::new(&script)
        .args(["--bin", "/nonexistent/trtcache"])
        .env("OUT", out.path())
        .output()
        .unwrap();
    assert_eq!(bad_bin.status.code(), Some(2));
}

#[test]
fn inspect_flags_where_the_parser_and_the_table_disagree() {
    let d = tempfile::tempdir().unwrap();
    let trt = load_double(d.path());
    let model =
        trtcache::onnx::Model::load(repo().join("examples/models/tiny_encoder_static.onnx"))
            .unwrap();
    let cap = trtcache::analysis::analyse(&model, &trtcache::analysis::Options::default()).unwrap();
    assert!(cap.nodes.len() > 2);
    // The double's verdict: node 0 supported, node 1 not, the rest in no subgraph.
    let report = trt.supports(b"PARTIAL", None, 0).unwrap();
    let v = trtcache::trt::inspect::compare(&cap, &report);
    assert_eq!(v.len(), cap.nodes.len());
    for n in &v {
        assert_eq!(
            n.table,
            cap.nodes[n.index].provider == trtcache::spec::Provider::TensorRt
        );
        let parser = match n.index {
            0 => Some(true),
            1 => Some(false),
            _ => None,
        };
        assert_eq!(n.parser, parser, "{n:?}");
        assert_eq!(n.disagree, n.table != parser.unwrap_or(false), "{n:?}");
    }
    assert!(v.iter().any(|n| n.disagree), "{v:?}");
}

/// The Python `ctypes` driver `scripts/gpu-check.sh` runs against the real shim in step 5,
/// run here against the test double and a real Identity model (ONNX Runtime CPU as the
/// reference): the driver's marshalling of the C API is exercised before a GPU host sees it.
#[test]
fn gpu_check_drives_the_c_api_through_ctypes() {
    let script = std::fs::read_to_string(repo().join("scripts/gpu-check.sh")).unwrap();
    let start = script
        .find("\"$PY\" - \"$shim\"")
        .expect("the step 5 driver in gpu-check.sh");
    let body = &script[start..];
    let body = &body[body.find('\n').unwrap() + 1..];
    let driver = &body[..body.find("\nEOF\n").unwrap()];
    let d = tempfile::tempdir().unwrap();
    let shim = double(d.path(), &[]);
    reference(d.path(), &[0.0; 4]); // writes identity.onnx
    let py = std::env::var_os("TRTCACHE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    let out = Command::new(py)
        .arg("-c")
        .arg(driver)
        .arg(&shim)
        .arg(d.path().join("identity.onnx"))
        .arg(d.path().join("inspect.json"))
        .env_remove("TRTCACHE_DEVICE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("abi 2 TensorRT 101601 compiled against 101601 device 0"),
        "{stdout}"
    );
    // The second build started from the first one's timing cache.
    assert!(stdout.contains("timing cache in 0 bytes"), "{stdout}");
    assert!(stdout.contains("build 2:"), "{stdout}");
    assert!(
        stdout.contains("output y (1, 4): max abs error 0 against ONNX Runtime CPU, within fp32 tolerance: True"),
        "{stdout}"
    );
    let inspect: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("inspect.json")).unwrap()).unwrap();
    assert_eq!(inspect["Layers"][0]["LayerType"], "Identity");
}

/// Calls that touch CUDA name their device, and a network or engine keeps the one it was made
/// on: the double writes the parse device into the plan, refuses to load a plan on another
/// device, and refuses a device it does not have, as the shim does.
#[test]
fn every_call_runs_on_the_device_it_names() {
    let d = tempfile::tempdir().unwrap();
    let trt = Trt::load(&LoaderConfig {
        shim: Some(double(d.path(), &["-DDOUBLE_DEVICE_COUNT=2"])),
        ..LoaderConfig::default()
    })
    .unwrap();
    let plan = trt
        .parse(b"m", None, 1)
        .unwrap()
        .build(&BuildOptions::default())
        .unwrap()
        .plan;
    let json: serde_json::Value = serde_json::from_slice(&plan[14..]).unwrap();
    assert_eq!(json["device"], 1);
    let e = trt.load_engine(&plan, 0).err().unwrap().to_string();
    assert!(
        e.contains("the plan was built on CUDA device 1, loaded on 0"),
        "{e}"
    );
    let input = [HostTensor::f32("x", &[1, 4], &[1.0; 4])];
    assert_eq!(
        trt.load_engine(&plan, 1).unwrap().run(0, &input).unwrap()[0].shape,
        vec![1, 4]
    );
    for e in [
        trt.parse(b"m", None, 2).err().unwrap(),
        trt.supports(b"m", None, 2).err().unwrap(),
        trt.combine_timing_caches(2, b"", b"").err().unwrap(),
    ] {
        assert!(
            matches!(&e, TrtError::Call { status: Status::CudaFailed, message, .. }
                if message.contains("CUDA device 2 does not exist")),
            "{e:?}"
        );
    }
}
