//! The daemon over the real build/cache stage: the key it serves is the key `trtcache key`
//! prints for the same model and sidecar; `trtcache warm` without a daemon fills the cache
//! that `trtcache serve` then serves without building; cache maintenance commands name the
//! daemon when it holds the cache; an acquire that asks for it carries the artifact's
//! directory descriptor, and both clients open sessions through it (and without it).

use std::process::Command;

use trtcache::fixtures::{models, write};
use trtcache_client::protocol::ErrorCode;

use crate::daemon::{artifact_session, assert_close, ort_env, reference, run_encoder, Daemon};
use crate::support;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn warm_then_serve_serves_the_key_trtcache_key_prints_without_building() {
    let mut d = Daemon::new();
    let model = d.models().join("enc.onnx");
    write(&models::tiny_encoder(false), &model).unwrap();
    // A sidecar: one named profile and its own tolerance, as deploys write them.
    std::fs::write(
        d.models().join("enc.trtcache.toml"),
        "[profiles.short]\nmin = \"x:1x1x64\"\nopt = \"x:2x8x64\"\nmax = \"x:4x32x64\"\n\
         [tolerances.fp32]\natol = 0.001\nrtol = 0.01\n[golden]\nseed = 3\n",
    )
    .unwrap();
    // No daemon: warm builds in-process into the cache.
    let out = Command::new(support::bin())
        .args(["warm", "--json", "--config"])
        .arg(d.config())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stderr(&out),
        String::from_utf8_lossy(&out.stdout)
    );
    let warm = support::json(&out);
    assert_eq!(warm[0]["state"], "ready", "{warm}");
    assert_eq!(warm[0]["cached"], false, "{warm}");
    assert_eq!(warm[0]["profile"], "short", "{warm}");
    let warm_key = warm[0]["key"].as_str().unwrap().to_string();

    let key = support::json(&support::trtcache([
        "key".to_string(),
        model.display().to_string(),
        "--cache-dir".into(),
        d.cache().display().to_string(),
        "--ort-library".into(),
        support::ort_dylib().display().to_string(),
        "--json".into(),
    ]));
    assert_eq!(key["key"], warm_key.as_str(), "{key}");
    assert_eq!(
        key["parts"]["profile"]["opt"]["x"],
        serde_json::json!([2, 8, 64])
    );

    d.start();
    let mut c = d.client();
    let art = c.acquire_model("enc").unwrap();
    assert_eq!(art.metadata.key, warm_key);
    assert_eq!(art.metadata.backend, "ort-cpu");
    assert_eq!(art.metadata.profile, "short");
    assert!(art.metadata.validation.passed);
    assert_eq!(art.metadata.files[0].role, "graph");
    // The capability analysis's plan for ort-cpu: every partition on the CPU provider.
    assert!(!art.metadata.providers.is_empty(), "{:?}", art.metadata);
    assert!(art
        .metadata
        .providers
        .iter()
        .all(|p| p == "CPUExecutionProvider"));
    // The artifact is the optimized model, not a copy of the file.
    assert_ne!(
        art.graph_bytes().unwrap(),
        std::fs::read(&model).unwrap(),
        "served the model itself"
    );
    let s = d.wait_hits(&mut c, 1);
    assert_eq!(
        (s.builds, s.hits),
        (0, 1),
        "served from the warm cache: {s:?}"
    );
    let mut sess = artifact_session(&art);
    assert_close(&run_encoder(&mut sess, 8), &reference(&model, 8), "enc");

    // `status` through the daemon lists the same key as ready.
    let st = support::json(&support::trtcache([
        "status".to_string(),
        "--json".into(),
        "--socket".into(),
        d.socket().display().to_string(),
    ]));
    let v = &st[0]["variants"][0];
    assert_eq!(
        (v["state"].as_str(), v["key"].as_str()),
        (Some("ready"), Some(warm_key.as_str())),
        "{st}"
    );

    // Maintenance commands go through the daemon that holds the cache.
    let ls = support::trtcache([
        "ls".to_string(),
        "--cache-dir".into(),
        d.cache().display().to_string(),
    ]);
    assert_eq!(ls.status.code(), Some(0), "{}", stderr(&ls));
    assert!(
        stderr(&ls).contains("holds the cache; asking it"),
        "{}",
        stderr(&ls)
    );
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains(&warm_key[..16]),
        "{}",
        String::from_utf8_lossy(&ls.stdout)
    );
    drop(c);
    assert!(d.stop());
    // With the daemon stopped, ls reads the cache directly.
    let ls = support::trtcache([
        "ls".to_string(),
        "--json".into(),
        "--cache-dir".into(),
        d.cache().display().to_string(),
    ]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    let recs = support::json(&ls);
    assert!(recs
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["key"] == warm_key.as_str() && r["status"]["state"] == "ready"));
}

#[test]
fn acquire_hands_over_the_artifact_directory_and_both_clients_open_sessions_through_it() {
    use std::os::unix::fs::MetadataExt;
    let mut d = Daemon::new();
    let model = d.models().join("enc.onnx");
    write(&models::tiny_encoder(false), &model).unwrap();
    // The encoder's weights are small: every initializer external, so the artifact is a
    // graph plus its data file (the config key the daemon passes to its builds).
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(d.config(), format!("external_min_bytes = 1024\n{cfg}")).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    let mut c = d.client();

    // Asked for: the directory comes last, after one descriptor per file.
    let art = c.acquire_model("enc").unwrap();
    let n = art.metadata.files.len();
    assert!(
        n >= 2,
        "an ort-cpu artifact has external data: {:?}",
        art.metadata
    );
    assert_eq!(
        art.metadata.dir_fd_index,
        Some(n as u32),
        "{:?}",
        art.metadata
    );
    assert_eq!(art.files.len(), n);
    let dir = art.dir.as_ref().expect("directory descriptor");
    assert!(dir.metadata().unwrap().is_dir());
    // Every file is in it under its name, as the very inode whose descriptor came.
    let dpath = art.dir_proc_path().unwrap();
    for (f, sent) in art.metadata.files.iter().zip(&art.files) {
        let here = std::fs::metadata(dpath.join(&f.name)).unwrap();
        let sent = sent.metadata().unwrap();
        assert_eq!(
            (here.dev(), here.ino()),
            (sent.dev(), sent.ino()),
            "{}",
            f.name
        );
        assert_eq!(here.len(), f.bytes, "{}", f.name);
    }
    let graph = art
        .dir_graph_path()
        .expect("graph reachable through the directory");
    assert_eq!(graph, dpath.join(&art.metadata.files[0].name));

    // A session opened in place matches the original model, and keeps working once every
    // descriptor is closed (ONNX Runtime does not read the files lazily).
    let mut in_place = ort::session::Session::builder(ort_env())
        .unwrap()
        .with_optimization_level(ort::session::builder::GraphOptimizationLevel::Disable)
        .unwrap()
        .commit_from_file(&graph)
        .unwrap();
    let want = reference(&model, 6);
    assert_close(&run_encoder(&mut in_place, 6), &want, "in place");
    let mut via_session = artifact_session(&art);
    drop(art);
    assert_close(
        &run_encoder(&mut in_place, 6),
        &want,
        "in place, fds closed",
    );
    assert_close(
        &run_encoder(&mut via_session, 6),
        &want,
        "Artifact::session",
    );

    // Not asked for (an older client): no directory, one descriptor per file, as before.
    let old = c
        .acquire(&trtcache_client::AcquireRequest {
            model: "enc".into(),
            wait: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(old.metadata.dir_fd_index, None);
    assert!(old.dir.is_none());
    assert_eq!(old.files.len(), old.metadata.files.len());
    assert!(old.dir_graph_path().is_none());
    assert_close(
        &run_encoder(&mut artifact_session(&old), 6),
        &want,
        "no dir",
    );

    // A directory that does not hold the sent files (as when it is not searchable, or the
    // blob is gone) is not used: the session comes from the per-file descriptors.
    let mut wrong = c.acquire_model("enc").unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    for f in &wrong.metadata.files {
        std::fs::write(elsewhere.path().join(&f.name), b"not it").unwrap();
    }
    wrong.dir = Some(std::fs::File::open(elsewhere.path()).unwrap());
    assert!(wrong.dir_graph_path().is_none());
    assert_close(
        &run_encoder(&mut artifact_session(&wrong), 6),
        &want,
        "fallback",
    );

    // Python: the client asks for the directory, opens the graph in place, falls back
    // without it; outputs match the original model, also after the descriptors are closed.
    let script = r#"
import os, sys, tempfile, numpy as np, onnxruntime as ort
sys.path.insert(0, sys.argv[1])
from trtcache_client import Client
c = Client(sys.argv[2])
art = c.acquire("enc", timeout=60)
n = len(art.metadata["files"])
assert art.metadata["dir_fd_index"] == n, art.metadata
assert art.dir_fd is not None and len(art.fds) == n
graph = art.dir_graph_path()
assert graph == "/proc/self/fd/%d/%s" % (art.dir_fd, art.metadata["files"][0]["name"]), graph
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
in_place = ort.InferenceSession(graph, sess_options=so, providers=["CPUExecutionProvider"])
default = art.session(providers=["CPUExecutionProvider"])
ref = ort.InferenceSession(sys.argv[3], providers=["CPUExecutionProvider"])
x = np.random.default_rng(1).standard_normal((2, 5, 64)).astype(np.float32)
want = ref.run(None, {"x": x})[0]
art.close()
for what, s in [("in place", in_place), ("session()", default)]:
    got = s.run(None, {"x": x})[0]
    assert np.allclose(got, want, atol=1e-4, rtol=1e-3), (what, np.abs(got - want).max())
other = c.acquire("enc", timeout=60)
d = tempfile.mkdtemp()
os.close(other.dir_fd)
other.dir_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
assert other.dir_graph_path() is None
got = other.session(providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
assert np.allclose(got, want, atol=1e-4, rtol=1e-3), ("fallback", np.abs(got - want).max())
print("dir ok", n)
"#;
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = support::run_python(script, &[&repo.join("clients/python"), &d.socket(), &model]);
    assert!(out.contains("dir ok"), "{out}");
    drop(c);
    assert!(d.stop());
}

#[test]
fn an_admin_builds_a_file_outside_the_repository_into_the_cache_by_path() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    let staged = d.root.join("outside/release-2.onnx");
    write(&models::tiny_encoder(true), &staged).unwrap();
    d.start();
    d.wait_settled(&["enc"]);

    // The test runs as the daemon's user, so this admin request is allowed (the other-uid
    // refusal is in daemon_system's admin test). `warm --path` sends it.
    let warm = |extra: &[&str]| {
        let mut cmd = Command::new(support::bin());
        cmd.args(["warm", "--json", "--config"])
            .arg(d.config())
            .arg("--path")
            .arg(&staged)
            .args(extra)
            .env("NO_COLOR", "1");
        cmd.output().unwrap()
    };
    let out = warm(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("using the daemon"),
        "{}",
        stderr(&out)
    );
    let first = support::json(&out);
    assert_eq!(first.as_array().unwrap().len(), 1, "only the path: {first}");
    assert_eq!(first[0]["model"], staged.display().to_string().as_str());
    assert_eq!(first[0]["state"], "ready", "{first}");
    assert_eq!(first[0]["cached"], false, "{first}");

    // The key is the one `trtcache key` prints for the file: a later deploy that copies it
    // into the repository is served from the cache without a build.
    let key = support::json(&support::trtcache([
        "key".to_string(),
        staged.display().to_string(),
        "--cache-dir".into(),
        d.cache().display().to_string(),
        "--ort-library".into(),
        support::ort_dylib().display().to_string(),
        "--json".into(),
    ]));
    assert_eq!(key["key"], first[0]["key"], "{key}");
    let again = support::json(&warm(&[]));
    assert_eq!(again[0]["cached"], true, "{again}");

    // The file is not served by name, and relative paths or missing files are refused.
    let mut c = d.client();
    assert!(c.list().unwrap().iter().all(|m| m.name == "enc"));
    for bad in ["relative/model.onnx", "/nonexistent/model.onnx"] {
        let e = c
            .build(
                &trtcache_client::protocol::BuildRequest {
                    paths: vec![bad.into()],
                    ..Default::default()
                },
                |_| {},
            )
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{bad}: {e}");
    }
    std::fs::copy(&staged, d.models().join("release.onnx")).unwrap();
    let list = d.wait_settled(&["release"]);
    let rel = list.iter().find(|m| m.name == "release").unwrap();
    assert_eq!(
        rel.variants[0].key.as_deref(),
        first[0]["key"].as_str(),
        "{rel:?}"
    );
    let builds = c.stats().unwrap().builds;
    assert_eq!(builds, 2, "enc and the staged file, not the deployed copy");
}

#[test]
fn a_model_served_with_a_fixed_profile_gets_an_artifact_specialized_to_it() {
    let mut d = Daemon::new();
    let model = d.models().join("fixed.onnx");
    write(&models::tiny_encoder(false), &model).unwrap();
    std::fs::write(
        d.models().join("fixed.trtcache.toml"),
        "[profiles.serve]\nopt = \"x:1x6x64\"\n",
    )
    .unwrap();
    // The thread and prepack probes' caps on the first validation run are budgets, not
    // properties of this test: lifted so a loaded machine cannot skip the probes. The
    // config ends in its [limits] table.
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    std::fs::write(
        d.config(),
        format!("{cfg}thread_probe_max_run_ms = 60000\nprepack_probe_max_run_ms = 60000\n"),
    )
    .unwrap();
    d.start();
    d.wait_settled(&["fixed"]);
    let planned = |d: &Daemon| {
        d.log()
            .lines()
            .filter(|l| l.contains("planned") && l.contains("fixed"))
            .count()
    };
    let before = planned(&d);
    assert!(before >= 1, "{}", d.log());
    let mut c = d.client();
    let art = c.acquire_model("fixed").unwrap();
    assert_eq!(art.metadata.profile, "serve");
    // Naming no profile is naming the default one: the background variant's plan serves it
    // (planning again reads the whole model, 49 ms for a 44 MB BERT).
    assert_eq!(planned(&d), before, "{}", d.log());
    // The artifact's own inputs say what it accepts: the profile's sizes, no free names.
    assert_eq!(
        serde_json::to_value(&art.metadata.inputs[0].shape).unwrap(),
        serde_json::json!([1, 6, 64]),
        "{:?}",
        art.metadata
    );
    let mut s = artifact_session(&art);
    assert_close(
        &run_encoder(&mut s, 6),
        &reference(&model, 6),
        "specialized",
    );
    // Another size is refused by ONNX Runtime, as a TensorRT engine built for the profile
    // would refuse it.
    let other = ort::value::Tensor::from_array(([1usize, 7, 64], vec![0.5f32; 7 * 64])).unwrap();
    assert!(s.run(ort::inputs!["x" => other]).is_err());
    // The Python client sees no free dimension and keeps ONNX Runtime's memory-reuse plan.
    let script = r#"
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from trtcache_client import Client
art = Client(sys.argv[2]).acquire("fixed")
assert not art.free_dims(), art.metadata["inputs"]
# A negative size is free, as ONNX Runtime reads `dim_value: -1` (skl2onnx's batch).
from trtcache_client import Artifact
assert Artifact({"inputs": [{"name": "x", "shape": [-1, 5]}]}, []).free_dims()
assert not Artifact({"inputs": [{"name": "x", "shape": [3, 5]}]}, []).free_dims()
assert art._ort_defaults({})["sess_options"].enable_mem_reuse is True
# The build's thread probe, as the metadata tells it: one thread, or ONNX Runtime's default (0).
hint = (art.metadata.get("session_hints") or {}).get("intra_op_num_threads")
assert art._ort_defaults({})["sess_options"].intra_op_num_threads == (hint or 0), art.metadata
assert Artifact({"session_hints": {"intra_op_num_threads": 1}}, [])._ort_defaults({"providers": []})["sess_options"].intra_op_num_threads == 1
assert Artifact({}, [])._ort_defaults({"providers": []})["sess_options"].intra_op_num_threads == 0
# The defaults as a public copy, to change one setting and pass back.
so = art.session_options()
assert so.intra_op_num_threads == (hint or 0) and so is not art.session_options()
so.add_session_config_entry("session.disable_prepacking", "1")
assert art.session(sess_options=so).run(None, {"x": np.ones((1, 6, 64), np.float32)})[0].shape == (1, 6, 64)
import onnxruntime
own = onnxruntime.SessionOptions()
assert Artifact({"session_hints": {"intra_op_num_threads": 1}}, [])._ort_defaults({"providers": [], "sess_options": own})["sess_options"] is own
# The build's prepack probe, as the metadata tells it: no prepacking, or ONNX Runtime's default.
prepack = (art.metadata.get("session_hints") or {}).get("disable_prepacking") is True
def unpacked(so):
    try:
        return so.get_session_config_entry("session.disable_prepacking") == "1"
    except RuntimeError:  # not set
        return False
assert unpacked(art._ort_defaults({})["sess_options"]) == prepack, art.metadata
assert unpacked(art.session_options()) == prepack
assert unpacked(Artifact({"session_hints": {"disable_prepacking": True}}, [])._ort_defaults({"providers": []})["sess_options"])
assert not unpacked(Artifact({"session_hints": {"intra_op_num_threads": 1}}, [])._ort_defaults({"providers": []})["sess_options"])
# From a ready pointer, whose `prepack 0` line says it without parsing the metadata.
from trtcache_client import _Ready
pointed = lambda fields: Artifact(None, [], None, _Ready(dict(fields, backend="ort-cpu"), ["model.onnx"], "{}", (0, 0)))
assert unpacked(pointed({"prepack": "0"})._ort_defaults({"providers": []})["sess_options"])
assert not unpacked(pointed({})._ort_defaults({"providers": []})["sess_options"])
y = art.session(providers=["CPUExecutionProvider"]).run(None, {"x": np.ones((1, 6, 64), np.float32)})[0]
print(y.shape, hint, prepack)
"#;
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = support::run_python(script, &[&repo.join("clients/python"), &d.socket()]);
    // The profile's opt shape is what consumers feed: the build timed the artifact's runs
    // there, and the metadata tells consumers one thread exactly when the probe found it
    // no slower (the timing itself is this machine's).
    let ls = support::json(&support::trtcache([
        "ls",
        "--cache-dir",
        d.cache().to_str().unwrap(),
        "--json",
    ]));
    let rec = ls
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == art.metadata.key.as_str())
        .unwrap_or_else(|| panic!("{ls}"));
    let single = rec["validation"]["threads"]["single"]
        .as_bool()
        .unwrap_or_else(|| panic!("no thread probe: {rec}"));
    let hint = art
        .metadata
        .session_hints
        .as_ref()
        .and_then(|h| h.intra_op_num_threads);
    assert_eq!(hint, single.then_some(1), "{rec}");
    // The same for prepacking: the record's probe (its timings checked for sense, not
    // size) decides the hint, and only it.
    let probe = &rec["validation"]["prepack"];
    let disable = probe["disable"]
        .as_bool()
        .unwrap_or_else(|| panic!("no prepack probe: {rec}"));
    let t = |k: &str| probe[k].as_f64().unwrap_or_else(|| panic!("{k}: {rec}"));
    assert!(
        [
            "session_us",
            "unpacked_session_us",
            "run_us",
            "unpacked_run_us"
        ]
        .iter()
        .all(|k| t(k) > 0.0),
        "{rec}"
    );
    assert_eq!(
        disable,
        probe["validated"] == true
            && trtcache::cache::PrepackProbe::unpacked_suits(
                t("session_us"),
                t("unpacked_session_us"),
                t("run_us"),
                t("unpacked_run_us")
            ),
        "{rec}"
    );
    let hinted = art
        .metadata
        .session_hints
        .as_ref()
        .and_then(|h| h.disable_prepacking);
    assert_eq!(hinted, disable.then_some(true), "{rec}");
    assert_eq!(
        out.trim(),
        format!(
            "(1, 6, 64) {} {}",
            if single { "1" } else { "None" },
            if disable { "True" } else { "False" }
        )
    );
    drop(c);
    assert!(d.stop());
}
