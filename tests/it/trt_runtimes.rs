//! An incoming TensorRT for the native `trt` backend (issue 43; docs/daemon.md, "Upgrading
//! the runtime"), with TEST DOUBLES for what this machine lacks: the current TensorRT is the
//! shim double at 10.16.1 (`TRTCACHE_TRT_SHIM`), the incoming one a second install root whose
//! `lib/libtrtcache_trt.so` is the double built at 10.17.0, and a CUDA driver double reports
//! one GPU. `warm --runtime ROOT` pre-builds every model's `trt` artifact for 10.17.0 (its
//! key naming that version, its engine built by a worker that loaded that shim); a consumer
//! naming 10.17.0 then gets it with zero builds, one naming 10.16.1 still gets the current
//! one, an unknown version is refused, and after the switch gc evicts the old TensorRT's
//! artifacts first. Real TensorRT was never run here (docs/trt.md).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;

use trtcache_client::protocol::{AcquireRequest, ErrorCode, Runtime, VariantState};

use crate::daemon::Daemon;
use crate::support;
use crate::trt::{cc, double};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The doubles: the current shim (10.16.1), an incoming install root (10.17.0 in its
/// `lib/`) and the CUDA driver.
struct Doubles {
    _dir: tempfile::TempDir,
    shim: PathBuf,
    incoming: PathBuf,
    cuda: PathBuf,
}

impl Doubles {
    fn new() -> Doubles {
        let dir = tempfile::tempdir().unwrap();
        let current = dir.path().join("current");
        let incoming = dir.path().join("TensorRT-10.17.0");
        let cuda = dir.path().join("cuda");
        for d in [&current, &incoming.join("lib"), &cuda] {
            std::fs::create_dir_all(d).unwrap();
        }
        let shim = double(&current, &[]);
        double(&incoming.join("lib"), &["-DDOUBLE_VERSION=101700"]);
        cc(
            &[&repo().join("shim/double/cuda_driver_double.c")],
            &cuda.join("libcuda.so"),
            &["-DDOUBLE_GPU_NAME=\"NVIDIA H200 (trtcache double)\""],
        );
        Doubles {
            _dir: dir,
            shim,
            incoming,
            cuda,
        }
    }

    fn env(&self, shim: &Path) -> Vec<(String, OsString)> {
        let mut ld = OsString::from(&self.cuda);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            ld.push(":");
            ld.push(old);
        }
        vec![
            ("TRTCACHE_TRT_SHIM".into(), shim.into()),
            ("LD_LIBRARY_PATH".into(), ld),
        ]
    }
}

/// Two Identity models (x float[n,4] → y, what the double computes), each with a profile.
fn models(dir: &Path) {
    support::run_python(
        r#"
import sys, os, onnx
from onnx import helper, TensorProto
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
ops = [helper.make_opsetid("", 17)]
for name in ["one", "two"]:
    onnx.save(helper.make_model(g, ir_version=8, opset_imports=ops, doc_string=name),
              os.path.join(sys.argv[1], name + ".onnx"))
"#,
        &[dir],
    );
    for name in ["one", "two"] {
        std::fs::write(
            dir.join(format!("{name}.trtcache.toml")),
            "[profiles.small]\nmin = { x = [1, 4] }\nopt = { x = [2, 4] }\nmax = { x = [8, 4] }\n",
        )
        .unwrap();
    }
}

fn cli(d: &Daemon, args: &[&str]) -> Output {
    support::cmd()
        .args(args)
        .arg("--config")
        .arg(d.config())
        .output()
        .unwrap()
}

fn builds(d: &Daemon) -> u64 {
    d.client().stats().unwrap().builds
}

/// Acquires `model`'s `trt` artifact as a consumer on TensorRT `tensorrt` (`None`: one
/// that does not say): its key, its key's TensorRT and the engine's.
fn acquire(
    d: &Daemon,
    model: &str,
    tensorrt: Option<&str>,
) -> Result<(String, String, String), trtcache_client::ClientError> {
    let a = d.client().acquire(&AcquireRequest {
        model: model.into(),
        backend: Some("trt".into()),
        wait: true,
        runtime: tensorrt.map(|v| Runtime {
            onnxruntime: None,
            tensorrt: Some(v.into()),
        }),
        ..Default::default()
    })?;
    assert!(a.metadata.validation.passed);
    let keyed = a
        .metadata
        .runtime
        .get("tensorrt")
        .cloned()
        .unwrap_or_default();
    assert!(
        a.metadata.runtime.contains_key("trtcache-trt-abi"),
        "{:?}",
        a.metadata.runtime
    );
    let engine = a.engine_meta().unwrap().tensorrt_version;
    Ok((a.metadata.key.clone(), keyed, engine))
}

/// The daemon's config with `backends = [LIST]`.
fn set_backends(d: &Daemon, list: &str) {
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    let line = format!("backends = [{list}]\n[limits]");
    std::fs::write(d.config(), cfg.replace("[limits]", &line)).unwrap();
}

#[test]
fn an_incoming_tensorrt_is_prebuilt_served_without_builds_and_kept_by_gc() {
    let h = Doubles::new();
    let mut d = Daemon::new();
    models(&d.models());
    set_backends(&d, r#""trt", "ort-cpu""#);
    d.env = h.env(&h.shim);
    d.start();
    d.wait_settled(&["one", "two"]);
    let names = ["one", "two"];
    let current: Vec<_> = names
        .iter()
        .map(|m| acquire(&d, m, Some("10.16.1")).unwrap_or_else(|e| panic!("{e}\n{}", d.log())))
        .collect();
    for (_, keyed, engine) in &current {
        assert_eq!((keyed.as_str(), engine.as_str()), ("10.16.1", "10.16.1"));
    }

    // The deploy step: every model's trt variant pre-built for the incoming TensorRT.
    let root = h.incoming.to_str().unwrap();
    let out = cli(&d, &["warm", "--json", "--runtime", root]);
    assert!(
        out.status.success(),
        "warm --runtime: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let results = support::json(&out);
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 2, "only the trt variants: {results:?}");
    for r in results {
        assert_eq!(r["state"], "ready", "{r}");
        assert_eq!(r["backend"], "trt", "{r}");
        assert_eq!(r["runtime"], "tensorrt 10.17.0", "{r}");
    }
    // status lists both TensorRTs' trt variants, ready; ort-cpu has no incoming variant.
    for m in d.client().list().unwrap() {
        let incoming: Vec<_> = m.variants.iter().filter(|v| v.runtime.is_some()).collect();
        assert_eq!(incoming.len(), 1, "{m:?}");
        assert_eq!(incoming[0].backend, "trt");
        assert_eq!(incoming[0].runtime.as_deref(), Some("tensorrt 10.17.0"));
        assert!(
            m.variants.iter().all(|v| v.state == VariantState::Ready),
            "{m:?}"
        );
    }

    // A consumer on the incoming TensorRT: its own engines, no build on the acquire path.
    let built = builds(&d);
    let incoming: Vec<_> = names
        .iter()
        .map(|m| acquire(&d, m, Some("10.17.0")).unwrap_or_else(|e| panic!("{e}\n{}", d.log())))
        .collect();
    assert_eq!(
        builds(&d),
        built,
        "an acquire on the incoming TensorRT built something"
    );
    for ((k_old, _, _), (k_new, keyed, engine)) in current.iter().zip(&incoming) {
        assert_eq!((keyed.as_str(), engine.as_str()), ("10.17.0", "10.17.0"));
        assert_ne!(k_old, k_new, "one key for two TensorRTs");
    }
    // Consumers on the current TensorRT, or that do not say, still get the current engines.
    for (m, c) in names.iter().zip(&current) {
        assert_eq!(&acquire(&d, m, Some("10.16.1")).unwrap(), c);
        assert_eq!(&acquire(&d, m, None).unwrap(), c);
    }
    // The Python client sends its `tensorrt` package's version (MAJOR.MINOR.PATCH; a
    // stand-in package here, the PyPI wheels' layout) and gets that TensorRT's engine; a
    // consumer without TensorRT is served the current engine from the ready index (its
    // onnxruntime does not matter to a `trt` artifact).
    let fake = d.root.join("site");
    std::fs::create_dir_all(fake.join("tensorrt_bindings")).unwrap();
    std::fs::write(
        fake.join("tensorrt_bindings/__init__.py"),
        "import ctypes\n__version__ = \"10.17.0.5\"\n",
    )
    .unwrap();
    let py = |site: &Path| {
        support::run_python(
            r#"
import sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[3])
import trtcache_client as t
c = t.Client(sys.argv[2])
print(c.runtime.get("tensorrt"))
for a in (c.acquire("one", backend="trt"), c.acquire("one")):
    print(a.engine_meta()["tensorrt_version"], a.from_index)
"#,
            &[&repo().join("clients/python"), &d.socket(), site],
        )
    };
    assert_eq!(py(&fake), "10.17.0\n10.17.0 False\n10.17.0 False\n");
    assert_eq!(
        py(&d.root.join("none")),
        "None\n10.16.1 False\n10.16.1 True\n"
    );
    // A TensorRT the daemon has no install of is refused, saying what to do.
    let e = acquire(&d, "one", Some("10.18.0")).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::RuntimeUnavailable), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("tensorrt 10.16.1 (and incoming 10.17.0)")
            && text.contains("[runtimes] tensorrt"),
        "{text}"
    );
    // ort-cpu does not build with TensorRT: a consumer's TensorRT does not matter to it.
    let cpu = d
        .client()
        .acquire(&AcquireRequest {
            model: "one".into(),
            backend: Some("ort-cpu".into()),
            wait: true,
            runtime: Some(Runtime {
                onnxruntime: None,
                tensorrt: Some("10.18.0".into()),
            }),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert!(!cpu.metadata.runtime.contains_key("tensorrt"));

    // The switch: the incoming TensorRT becomes the current one (its shim, a restart).
    // Nothing is rebuilt, and once nobody used the old one recently, gc evicts it first,
    // although its engines were used last.
    assert!(d.stop());
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("{cfg}[runtimes]\nkeep_used_secs = 0\n")).unwrap();
    d.env = h.env(&h.incoming.join("lib/libtrtcache_trt.so"));
    d.start();
    d.wait_settled(&["one", "two"]);
    assert_eq!(builds(&d), 0, "the switch rebuilt something:\n{}", d.log());
    for (m, c) in names.iter().zip(&incoming) {
        assert_eq!(&acquire(&d, m, None).unwrap(), c);
    }
    let out = cli(&d, &["gc", "--json", "--dry-run", "--max-size", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gc = support::json(&out);
    let evicted: Vec<&str> = gc["evicted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let old: Vec<&str> = current.iter().map(|(k, _, _)| k.as_str()).collect();
    assert!(evicted.len() >= 4, "{gc}");
    assert!(
        evicted[..2].iter().all(|k| old.contains(k)),
        "the old TensorRT's engines are evicted first: {evicted:?} (old {old:?})"
    );
    assert!(d.stop());
}

#[test]
fn a_tensorrt_root_warms_without_a_daemon_and_one_that_is_not_a_root_is_refused() {
    let h = Doubles::new();
    let mut d = Daemon::new();
    models(&d.models());
    set_backends(&d, r#""trt""#);
    // Without a daemon, `warm --runtime ROOT` builds in this process's own workers.
    let out = support::cmd()
        .args([
            "warm",
            "--json",
            "--runtime",
            h.incoming.to_str().unwrap(),
            "--config",
        ])
        .arg(d.config())
        .envs(h.env(&h.shim))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results = support::json(&out);
    let runtimes: Vec<&str> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runtime"].as_str().unwrap_or("current"))
        .collect();
    assert_eq!(runtimes, ["tensorrt 10.17.0"; 2], "{results}");
    d.env = h.env(&h.shim);
    d.start();
    d.wait_settled(&["one", "two"]);
    // A root of the current TensorRT's version adds nothing: its variants are the current
    // ones (a deploy that runs the step again after the switch).
    let same = d.root.join("TensorRT-10.16.1");
    std::fs::create_dir_all(same.join("lib")).unwrap();
    double(&same.join("lib"), &[]);
    let out = cli(&d, &["warm", "--json", "--runtime", same.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let results = support::json(&out);
    for r in results.as_array().unwrap() {
        assert_eq!(
            (&r["state"], &r["runtime"]),
            (&"ready".into(), &serde_json::Value::Null),
            "{r}"
        );
    }
    // A folder without lib/.
    let bare = d.root.join("outside");
    let out = cli(&d, &["warm", "--runtime", bare.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no lib/ folder: not a TensorRT install root"),
        "{err}"
    );
    // A root whose shim speaks another C API: the probe's loader refuses it, by name.
    let other = d.root.join("TensorRT-abi");
    std::fs::create_dir_all(other.join("lib")).unwrap();
    double(
        &other.join("lib"),
        &["-DDOUBLE_VERSION=101700", "-DDOUBLE_ABI=999"],
    );
    let out = cli(&d, &["warm", "--runtime", other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the version probe failed (exit status 2)") && err.contains("999"),
        "{err}"
    );
    // The configured form refuses to start, naming the entry.
    assert!(d.stop());
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        format!("{cfg}[runtimes]\ntensorrt = [{{ root = {bare:?} }}]\n"),
    )
    .unwrap();
    let out = support::cmd()
        .args(["serve", "--config"])
        .arg(d.config())
        .envs(h.env(&h.shim))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[runtimes] tensorrt: TensorRT at") && err.contains("no lib/ folder"),
        "{err}"
    );
}
