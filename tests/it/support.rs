//! Shared test fixtures: paths to the binary, the project's Python and ONNX Runtime, and a
//! runner for `trtcache` invocations.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `trtcache` binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_trtcache"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Python with `onnx`, `onnxruntime` and `numpy`: `TRTCACHE_PYTHON` or the project's `.venv`.
/// Panics with the fix when missing: these tests must not pass by skipping.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TRTCACHE_PYTHON") {
        return PathBuf::from(p);
    }
    let p = repo().join(".venv/bin/python");
    assert!(
        p.exists(),
        "no Python environment: run scripts/setup-python.sh (or set TRTCACHE_PYTHON)"
    );
    p
}

/// ONNX Runtime's shared library: `ORT_DYLIB_PATH` or the one in the project's `.venv`.
pub fn ort_dylib() -> PathBuf {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return PathBuf::from(p);
    }
    let out = Command::new(python())
        .args([
            "-c",
            "import onnxruntime,os,glob; d=os.path.join(os.path.dirname(onnxruntime.__file__),'capi'); print(sorted(glob.glob(d+'/libonnxruntime.so.*'))[0])",
        ])
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "onnxruntime missing: run scripts/setup-python.sh"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A `trtcache` command with colour off, to add arguments to.
pub fn cmd() -> Command {
    let mut c = Command::new(bin());
    c.env("NO_COLOR", "1");
    c
}

/// Runs `trtcache ARGS` and returns its output.
pub fn trtcache<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(bin())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("running trtcache")
}

/// Runs a Python snippet with arguments; panics with its stderr when it fails.
pub fn run_python(script: &str, args: &[&Path]) -> String {
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes every named fixture (and the external-data variant) into `dir`.
pub fn write_fixtures(dir: &Path) -> Vec<PathBuf> {
    use trtcache::fixtures::{models, write, write_external};
    let mut out = Vec::new();
    for (name, m) in models::all() {
        let p = dir.join(format!("{name}.onnx"));
        write(&m, &p).unwrap();
        out.push(p);
    }
    let ext = dir.join("external");
    std::fs::create_dir_all(&ext).unwrap();
    let p = ext.join("model.onnx");
    write_external(&models::tiny_encoder(false), &p, "model.onnx.data", 128).unwrap();
    out.push(p);
    out
}

/// Parses stdout as JSON, with the output in the panic message when it is not.
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout={} stderr={}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Builds `model` (`ort-cpu`, default options) with the library in a fresh cache, every
/// attempt's staged artifact swapped for `artifact` (as a broken optimizer would leave it),
/// and returns the record.
pub fn build_with_artifact(
    model: &trtcache::onnx::proto::ModelProto,
    artifact: trtcache::onnx::proto::ModelProto,
) -> trtcache::cache::Record {
    use std::sync::Arc;
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    trtcache::fixtures::write(model, &m).unwrap();
    trtcache::builder::runtime::load(Some(&ort_dylib())).unwrap();
    let store = Arc::new(
        trtcache::cache::SledStore::open(
            &d.path().join("cache"),
            trtcache::cache::StoreOptions::default(),
        )
        .unwrap(),
    );
    let builder = trtcache::builder::Builder::new(store, Some(ort_dylib())).with_artifact_hook(
        Arc::new(move |art: &trtcache::cache::StagedArtifact| {
            trtcache::fixtures::write(&artifact, &art.dir.join(&art.entry)).unwrap();
        }),
    );
    builder
        .build(
            &trtcache::builder::BuildJob::new(&m, trtcache::spec::Backend::OrtCpu),
            &|_| {},
        )
        .unwrap()
        .record
}

/// The key's options of `model` as `trtcache key --json` prints them.
pub fn key_options(model: &Path, cache: &Path) -> serde_json::Value {
    let out = trtcache([
        "key",
        model.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)["parts"]["options"].clone()
}
