//! `scripts/gpu-check.sh` on images that lack pieces (issue 40, item 12), run here with
//! stand-ins: a PATH with only the tools the script needs (no python3), a fake `nvidia-smi`
//! that lists GPUs, a stand-in `trtcache` that reports one (the plumbing of the GPU branches;
//! the real binary runs the no-GPU branch), a Python without onnxruntime or numpy whose
//! `tensorrt` cannot deserialize, and ONNX Runtime provider libraries whose CUDA/TensorRT
//! dependencies are missing, or present only in the pip `tensorrt_libs` / `nvidia/*/lib`
//! layout. Every step must print exactly one verdict line: `ok`, `FAILED: …` or
//! `not available: …`, and never `ok` for a step that did not run.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support;

const STEPS: [&str; 11] = ["0", "1", "2", "3", "3c", "4", "4c", "5", "6", "6d", "end"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn write_exe(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A folder of links to the tools the script uses, and nothing else (no python3).
fn tools(dir: &Path) -> PathBuf {
    let bin = dir.join("tools");
    std::fs::create_dir_all(&bin).unwrap();
    for t in [
        "bash", "env", "dirname", "basename", "sed", "mkdir", "mktemp", "rm", "tee", "timeout",
        "grep", "head", "tail", "awk", "sort", "uniq", "tr", "date", "uname", "ls", "ldd",
        "ldconfig", "cat", "sleep", "wc",
    ] {
        let found = ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .map(|d| Path::new(d).join(t))
            .find(|p| p.exists());
        if let Some(p) = found {
            std::os::unix::fs::symlink(p, bin.join(t)).unwrap();
        }
    }
    assert!(bin.join("bash").exists() && bin.join("ldd").exists());
    bin
}

/// A fake `nvidia-smi` listing two GPUs.
fn fake_smi(dir: &Path) -> PathBuf {
    let d = dir.join("smi");
    std::fs::create_dir_all(&d).unwrap();
    write_exe(
        &d.join("nvidia-smi"),
        "#!/bin/sh\n[ \"$1\" = -L ] && { echo 'GPU 0: NVIDIA H200 (UUID: GPU-a)'; echo 'GPU 1: NVIDIA H200 (UUID: GPU-b)'; exit 0; }\necho 'fake nvidia-smi'\n",
    );
    d
}

/// A stand-in `trtcache` that sees one GPU (GPU=1) or none, and whose commands succeed,
/// writing JSON shaped like the real one's (pretty-printed).
fn fake_trtcache(dir: &Path, gpu: bool) -> PathBuf {
    let p = dir.join(if gpu {
        "trtcache-gpu"
    } else {
        "trtcache-nogpu"
    });
    let sku = if gpu {
        r#"{
  "gpus": [
    {
      "ordinal": 0,
      "name": "NVIDIA H200",
      "compute_capability": "9.0",
      "uuid": "GPU-a"
    }
  ],
  "gpu_unavailable": null,
  "sku": {
    "kind": "gpu",
    "name": "NVIDIA H200",
    "compute_capability": "9.0"
  }
}"#
    } else {
        r#"{
  "gpus": [],
  "gpu_unavailable": "no NVIDIA driver: \"libcuda.so\" not found",
  "sku": {
    "kind": "cpu",
    "name": "some cpu",
    "compute_capability": null
  }
}"#
    };
    write_exe(
        &p,
        &format!(
            r#"#!/bin/bash
cmd="$1"; shift
case "$cmd" in
  --version) echo "trtcache (stand-in)" ;;
  sku) cat <<'J'
{sku}
J
  ;;
  key|warm) echo '{{}}' ;;
  build)
    cache=""; while [ $# -gt 0 ]; do [ "$1" = --cache-dir ] && cache="$2"; shift; done
    mkdir -p "$cache"; hit=false; [ -f "$cache/engine.plan" ] && hit=true
    echo plan >"$cache/engine.plan"
    printf '{{\n  "cache_hit": %s,\n  "artifact": {{\n    "entry": "%s"\n  }},\n  "record": {{\n    "validation": {{\n      "outputs": [\n        {{\n          "max_abs": 0.00012\n        }},\n        {{\n          "max_abs": 3e-05\n        }}\n      ]\n    }}\n  }}\n}}\n' "$hit" "$cache/engine.plan" ;;
  inspect) printf '{{\n  "parser": {{\n    "disagreements": 0\n  }}\n}}\n' ;;
  export) ;;
  serve) exec sleep 60 ;;
  *) echo "stand-in: $cmd?" >&2; exit 3 ;;
esac
"#
        ),
    );
    p
}

/// A shared library OUT needing the libraries in NEEDS: stubs with those sonames are made,
/// linked against, then left in the folder given, or deleted (None).
fn so(cc_dir: &Path, out: &Path, needs: &[(&str, Option<&Path>)]) {
    std::fs::create_dir_all(cc_dir).unwrap();
    let src = cc_dir.join("stub.c");
    std::fs::write(&src, "int stub_fn(void) { return 0; }\n").unwrap();
    let mut link = Vec::new();
    for (name, keep) in needs {
        let dst = keep.map_or_else(|| cc_dir.join(name), |k| k.join(name));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        let st = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&dst)
            .arg(&src)
            .arg(format!("-Wl,-soname,{name}"))
            .status()
            .unwrap();
        assert!(st.success(), "cc for {name}");
        link.push(dst);
    }
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(out)
        .arg(&src)
        .arg("-Wl,--no-as-needed")
        .args(&link)
        .status()
        .unwrap();
    assert!(st.success(), "cc for {}", out.display());
    for ((_, keep), l) in needs.iter().zip(&link) {
        if keep.is_none() {
            std::fs::remove_file(l).unwrap();
        }
    }
}

/// Runs the script; returns its exit status and each step's verdict line.
fn gpu_check(
    out: &Path,
    path: &[&Path],
    args: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
) -> (Output, BTreeMap<String, String>) {
    let path = std::env::join_paths(path).unwrap();
    let mut c = Command::new(repo().join("scripts/gpu-check.sh"));
    c.env_clear()
        .env("PATH", path)
        .env("OUT", out)
        .env("HOME", out)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let run = c.output().unwrap();
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap_or_default();
    let mut lines = BTreeMap::new();
    for l in summary.lines() {
        let id = if l.starts_with("gpu-check:") {
            "end".to_string()
        } else {
            l.split_whitespace().nth(1).unwrap_or("").to_string()
        };
        assert!(
            lines.insert(id.clone(), l.to_string()).is_none(),
            "step {id} twice:\n{summary}"
        );
        if id != "end" {
            let verdict = l.split_once(": ").map(|x| x.1).unwrap_or("");
            assert!(
                verdict == "ok"
                    || verdict.starts_with("ok (")
                    || verdict.starts_with("FAILED: ")
                    || verdict.starts_with("not available: "),
                "not one verdict: {l}"
            );
        }
    }
    let keys: Vec<&str> = lines.keys().map(|s| s.as_str()).collect();
    let mut want = STEPS.to_vec();
    want.sort();
    assert_eq!(
        keys,
        want,
        "{summary}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    (run, lines)
}

fn venv_site() -> PathBuf {
    let lib = support::ort_dylib();
    lib.ancestors().nth(3).unwrap().to_path_buf() // …/site-packages/onnxruntime/capi/lib
}

/// No python3 on PATH and nvidia-smi listing GPUs: the real binary's GPU view decides step 1
/// (FAILED when it sees none of the GPUs nvidia-smi lists, never "no GPU"), the ONNX Runtime
/// wheel is still found without Python, and the Python steps say they lack Python.
#[test]
fn without_python_the_gpus_are_still_seen_and_python_steps_say_why() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let (tools, smi) = (tools(d.path()), fake_smi(d.path()));
    let site = venv_site();
    let (run, l) = gpu_check(
        &out,
        &[&tools, &smi],
        &["--bin".as_ref(), support::bin().as_os_str()],
        &[("SITE_PACKAGES", site.as_os_str())],
    );
    assert!(
        l["0"].starts_with(
            "step 0 probe: ok (nvidia-smi: 2 GPU(s) (2 NVIDIA H200); onnxruntime 1.31.1 at "
        ),
        "{l:?}"
    );
    assert!(l["0"].ends_with("python: none)"), "{l:?}");
    let sku = std::fs::read_to_string(out.join("1-sku.json")).unwrap();
    if sku.contains("\"gpus\": []") {
        assert!(
            l["1"].starts_with("step 1 sku: FAILED: nvidia-smi lists 2 GPU(s) but trtcache sees none through the CUDA driver ("),
            "{l:?}"
        );
        assert_eq!(run.status.code(), Some(1), "{l:?}");
        for s in ["2", "3", "4", "5", "6"] {
            assert!(l[s].contains(": not available: no GPU (step 1)"), "{l:?}");
        }
    } else {
        assert!(l["1"].starts_with("step 1 sku: ok ("), "{l:?}");
    }
    assert!(
        l["5"].contains("no python3 (set PYTHON or --python): nothing to drive the shim"),
        "{l:?}"
    );
    assert_eq!(
        l["6d"],
        "step 6d trt-deserialize: not available: step 6 did not pass"
    );
}

/// With a GPU (the stand-in binary), a Python without onnxruntime, provider libraries whose
/// dependencies are missing or only in the pip layout, and a `tensorrt` that cannot
/// deserialize: not available where a piece is missing (naming it), ok only for steps that
/// ran, FAILED for the deserialize failure, exit 1.
#[test]
fn missing_pieces_are_not_available_and_a_failed_deserialize_is_failed() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let (tools, smi) = (tools(d.path()), fake_smi(d.path()));
    // The pip layout: onnxruntime-gpu's providers, TensorRT in tensorrt_libs, CUDA in nvidia/*/lib.
    let site = d.path().join("site");
    let capi = site.join("onnxruntime/capi");
    std::fs::create_dir_all(&capi).unwrap();
    std::fs::write(capi.join("libonnxruntime.so.1.31.1"), b"stand-in").unwrap();
    let cc = d.path().join("cc");
    let (trt_libs, cuda_libs) = (site.join("tensorrt_libs"), site.join("nvidia/cu13/lib"));
    so(
        &cc,
        &capi.join("libonnxruntime_providers_cuda.so"),
        &[
            ("libcublas.so.13", None),
            ("libcudart.so.13", Some(&cuda_libs)),
        ],
    );
    so(
        &cc,
        &capi.join("libonnxruntime_providers_tensorrt.so"),
        &[
            ("libnvinfer.so.10", Some(&trt_libs)),
            ("libcudart.so.13", Some(&cuda_libs)),
        ],
    );
    // A python3 without site-packages (so no onnxruntime, no numpy) whose `tensorrt`
    // deserializes nothing.
    let pyd = d.path().join("py");
    std::fs::create_dir_all(pyd.join("mods")).unwrap();
    write_exe(
        &pyd.join("python3"),
        &format!(
            "#!/bin/sh\nexec {} -S \"$@\"\n",
            support::python().display()
        ),
    );
    std::fs::write(
        pyd.join("mods/tensorrt.py"),
        "__version__ = '10.0-stand-in'\nclass Logger:\n    WARNING = 0\n    def __init__(self, level): pass\nclass Runtime:\n    def __init__(self, logger): pass\n    def deserialize_cuda_engine(self, data): return None\n",
    )
    .unwrap();
    let shim = d.path().join("libtrtcache_trt.so");
    std::fs::write(&shim, b"stand-in").unwrap();
    let bin = fake_trtcache(d.path(), true);
    let (run, l) = gpu_check(
        &out,
        &[&tools, &smi, &pyd],
        &["--bin".as_ref(), bin.as_os_str()],
        &[
            ("SITE_PACKAGES", site.as_os_str()),
            ("PYTHONPATH", pyd.join("mods").as_os_str()),
            (
                "ORT_DYLIB_PATH",
                capi.join("libonnxruntime.so.1.31.1").as_os_str(),
            ),
            ("TRTCACHE_TRT_SHIM", shim.as_os_str()),
        ],
    );
    assert_eq!(run.status.code(), Some(1), "{l:?}");
    assert_eq!(
        l["1"],
        "step 1 sku: ok (1 GPU(s): NVIDIA H200 cc 9.0; nvidia-smi lists 2)"
    );
    assert_eq!(l["2"], "step 2 key-ort-cuda: ok (3 models)");
    // The CUDA provider's library is there but cannot load: libcublas.so.13 is missing
    // (libcudart.so.13 is found in nvidia/cu13/lib).
    assert!(
        l["3"].starts_with("step 3 build-ort-cuda: not available: CUDAExecutionProvider cannot load: libonnxruntime_providers_cuda.so needs libcublas.so.13 (not found"),
        "{l:?}"
    );
    assert_eq!(
        l["3c"],
        "step 3c consume-ort-cuda: not available: step 3 did not run"
    );
    // The TensorRT provider loads with tensorrt_libs and nvidia/cu13/lib on the path.
    assert_eq!(
        l["4"],
        "step 4 build-ort-tensorrt: ok (3 models built and validated, served and warmed)"
    );
    assert!(
        l["4c"].starts_with("step 4c consume-ort-tensorrt: not available: ")
            && l["4c"].ends_with("python3 has no onnxruntime or numpy"),
        "{l:?}"
    );
    assert!(
        l["5"].starts_with("step 5 trt-native: not available: ")
            && l["5"].contains("has no numpy or onnxruntime"),
        "{l:?}"
    );
    assert!(
        l["6"].starts_with("step 6 trt-backend: ok (built and validated (max abs error 0.00012), cache hit, inspect --trt: 0 disagreement(s)"),
        "{l:?}"
    );
    assert_eq!(
        l["6d"],
        "step 6d trt-deserialize: FAILED: deserialize_cuda_engine returned None"
    );
    let probe = std::fs::read_to_string(out.join("0-probe.txt")).unwrap();
    assert!(probe.contains(&trt_libs.display().to_string()), "{probe}");
}

/// No ONNX Runtime anywhere (no wheel, ORT_DYLIB_PATH unset, no Python): every step that needs
/// it is "not available" naming it, none FAILED, exit 0.
#[test]
fn without_onnxruntime_the_steps_that_need_it_are_not_available() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let (tools, smi) = (tools(d.path()), fake_smi(d.path()));
    let empty = d.path().join("empty-site");
    std::fs::create_dir_all(&empty).unwrap();
    let shim = d.path().join("libtrtcache_trt.so");
    std::fs::write(&shim, b"stand-in").unwrap();
    let root = d.path().join("TensorRT");
    std::fs::create_dir_all(root.join("lib")).unwrap();
    std::fs::write(root.join("lib/libnvinfer.so.10"), b"stand-in").unwrap();
    let bin = fake_trtcache(d.path(), true);
    let (run, l) = gpu_check(
        &out,
        &[&tools, &smi],
        &["--bin".as_ref(), bin.as_os_str()],
        &[
            ("SITE_PACKAGES", empty.as_os_str()),
            ("TRTCACHE_TRT_SHIM", shim.as_os_str()),
            ("TENSORRT_ROOT", root.as_os_str()),
        ],
    );
    assert_eq!(run.status.code(), Some(0), "{l:?}");
    for s in ["3", "4"] {
        assert!(
            l[s].contains(": not available: no ONNX Runtime library (ORT_DYLIB_PATH unset"),
            "{l:?}"
        );
    }
    assert!(
        l["6"].starts_with("step 6 trt-backend: not available: no ONNX Runtime library"),
        "{l:?}"
    );
    assert!(l["0"].contains("no onnxruntime library"), "{l:?}");
    assert!(!l.values().any(|v| v.contains("FAILED")), "{l:?}");
}

/// A fake GPU binary with no GPU and no nvidia-smi: "not available", exit 0.
#[test]
fn without_any_gpu_step_1_is_not_available() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let tools = tools(d.path());
    let bin = fake_trtcache(d.path(), false);
    let (run, l) = gpu_check(
        &out,
        &[&tools],
        &["--bin".as_ref(), bin.as_os_str()],
        &[("SITE_PACKAGES", d.path().as_os_str())],
    );
    assert_eq!(run.status.code(), Some(0), "{l:?}");
    assert_eq!(
        l["1"],
        "step 1 sku: not available: no GPU through the CUDA driver (no NVIDIA driver: \"libcuda.so\" not found)"
    );
    assert!(l["0"].contains("nvidia-smi: not found"), "{l:?}");
}

/// Provider libraries whose dependencies all resolve, but a Python onnxruntime whose session
/// falls back to the CPU (the CPU wheel, as when the CUDA libraries do not start): the step is
/// "not available" with the session's providers, not built on a provider that is not there.
#[test]
fn a_provider_the_session_does_not_get_is_not_available() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let (tools, smi) = (tools(d.path()), fake_smi(d.path()));
    let capi = d.path().join("ort/capi");
    std::fs::create_dir_all(&capi).unwrap();
    std::fs::write(capi.join("libonnxruntime.so.1.31.1"), b"stand-in").unwrap();
    so(
        &d.path().join("cc"),
        &capi.join("libonnxruntime_providers_cuda.so"),
        &[],
    );
    let py = support::python();
    let bin = fake_trtcache(d.path(), true);
    let (_, l) = gpu_check(
        &out,
        &[&tools, &smi],
        &[
            "--bin".as_ref(),
            bin.as_os_str(),
            "--python".as_ref(),
            py.as_os_str(),
        ],
        &[
            ("SITE_PACKAGES", d.path().as_os_str()),
            (
                "ORT_DYLIB_PATH",
                capi.join("libonnxruntime.so.1.31.1").as_os_str(),
            ),
        ],
    );
    assert!(
        l["3"].starts_with("step 3 build-ort-cuda: not available: CUDAExecutionProvider does not start in an ONNX Runtime session: the session has ['CPUExecutionProvider'], not CUDAExecutionProvider"),
        "{l:?}"
    );
    assert_eq!(
        l["3c"],
        "step 3c consume-ort-cuda: not available: step 3 did not run"
    );
}
