//! Build and cache tests: real `ort-cpu` builds through the binary and the library, the
//! served artifact checked against the original model with Python's ONNX Runtime, cache hits,
//! verify/quarantine, cleanup of killed builds, single flight, failed validation, GPU
//! backends failing precisely here, and the one-owner lock.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use trtcache::builder::backends::ort_cpu::passes;
use trtcache::builder::{runtime, BuildJob, Builder, Source};
use trtcache::cache::{Lookup, SledStore, Status, Store, StoreOptions};
use trtcache::fixtures::{bert, models, write};
use trtcache::spec::Backend;

use crate::support::{json, run_python, trtcache, write_fixtures};

fn build_json(model: &Path, cache: &Path, extra: &[&str]) -> (Value, std::process::Output) {
    let mut args: Vec<String> = vec![
        "build".into(),
        model.display().to_string(),
        "--cache-dir".into(),
        cache.display().to_string(),
        "--json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = trtcache(&args);
    (json(&out), out)
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs the original and the artifact with Python's ONNX Runtime on the same random input
/// and prints the max abs difference.
const COMPARE: &str = r#"
import sys, numpy as np, onnxruntime as ort
orig, art, shape = sys.argv[1], sys.argv[2], [int(d) for d in sys.argv[3].split('x')]
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
o = ort.InferenceSession(orig, providers=['CPUExecutionProvider'])
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
a = ort.InferenceSession(art, so, providers=['CPUExecutionProvider'])
ya = o.run(None, {'x': x})[0]; yb = a.run(None, {'x': x})[0]
assert ya.shape == yb.shape, (ya.shape, yb.shape)
print(float(np.abs(ya - yb).max()))
"#;

#[test]
fn cpu_artifacts_match_the_original_model_external_data_included() {
    let d = tempfile::tempdir().unwrap();
    let models = write_fixtures(d.path());
    let cache = d.path().join("cache");
    for m in models.iter().filter(|p| {
        let s = p.display().to_string();
        (s.contains("tiny_encoder") || s.contains("external")) && !s.contains("static")
    }) {
        let (v, out) = build_json(m, &cache, &["--opt-shapes", "x:2x8x64"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(v["servable"], true, "{v}");
        let entry = PathBuf::from(v["artifact"]["entry"].as_str().unwrap());
        let files = v["artifact"]["files"].as_array().unwrap();
        for f in files {
            assert!(Path::new(f.as_str().unwrap()).starts_with(entry.parent().unwrap()));
        }
        // The artifact is served from the cache dir, never from next to the model.
        assert!(entry.starts_with(&cache), "{}", entry.display());
        let diff: f64 = run_python(COMPARE, &[m, &entry, Path::new("2x8x64")])
            .trim()
            .parse()
            .unwrap();
        assert!(diff <= 1e-4, "{}: max abs diff {diff}", m.display());
        let val = &v["record"]["validation"];
        assert_eq!(val["passed"], true);
        assert_eq!(val["shapes"]["x"], serde_json::json!([2, 8, 64]));
    }
}

#[test]
fn external_data_artifact_is_one_unit_with_its_data_file() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("bert").join("model.onnx");
    std::fs::create_dir_all(m.parent().unwrap()).unwrap();
    trtcache::fixtures::write_external(
        &bert::bert(bert::BertConfig::tiny()),
        &m,
        "model.onnx.data",
        256,
    )
    .unwrap();
    let (v, out) = build_json(&m, &d.path().join("cache"), &["--external-min-size", "1K"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let files: Vec<String> = v["record"]["artifact"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(files, vec!["model.onnx", "model.onnx.data"]);
    // Moving the original away proves the artifact does not point back at it.
    std::fs::rename(m.parent().unwrap(), d.path().join("moved")).unwrap();
    let entry = v["artifact"]["entry"].as_str().unwrap();
    let script = r#"
import sys, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
s = ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])
ids = np.ones((1, 8), dtype=np.int64)
print(s.run(None, {'input_ids': ids, 'attention_mask': ids})[0].shape)
"#;
    let shape = run_python(script, &[Path::new(entry)]);
    assert_eq!(shape.trim(), "(1, 8, 64)");
}

/// `trtcache build --json` that must succeed with a validated artifact: the report and the
/// artifact's entry (graph file).
fn validated_build(m: &Path, cache: &Path, args: &[&str]) -> (serde_json::Value, PathBuf) {
    let (v, out) = build_json(m, cache, args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    assert_eq!(v["record"]["validation"]["passed"], true, "{args:?}: {v}");
    let entry = PathBuf::from(v["artifact"]["entry"].as_str().unwrap());
    (v, entry)
}

/// Prints `inline external` counts of an artifact's initializers, failing when one is on the
/// wrong side of the threshold (bytes as stored: raw data or external length).
const SPLIT: &str = r#"
import sys, onnx
m = onnx.load(sys.argv[1], load_external_data=False)
limit = int(sys.argv[2]); inline = external = 0
for t in m.graph.initializer:
    ext = {e.key: e.value for e in t.external_data}
    if ext:
        assert int(ext["length"]) >= limit, (t.name, ext)
        external += 1
    else:
        n = len(t.raw_data) or 4 * (len(t.float_data) + len(t.int32_data)) or 8 * len(t.int64_data)
        assert n < limit, (t.name, n)
        inline += 1
print(inline, external)
"#;

#[test]
fn external_min_size_splits_initializers_between_graph_and_data_file() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("bert.onnx");
    write(&bert::bert(bert::BertConfig::tiny()), &m).unwrap();
    let cache = d.path().join("cache");
    let mut keys = Vec::new();
    for (size, limit, data_file) in [("20K", 20480, true), ("64K", 65536, false)] {
        let (v, entry) = validated_build(&m, &cache, &["--external-min-size", size]);
        let files = v["artifact"]["files"].as_array().unwrap();
        assert_eq!(files.len(), if data_file { 2 } else { 1 }, "{size}: {v}");
        let counts = run_python(SPLIT, &[&entry, Path::new(&limit.to_string())]);
        let counts: Vec<usize> = counts
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        assert!(
            counts[0] > 0,
            "{size}: small initializers stay in the graph"
        );
        assert_eq!(counts[1] > 0, data_file, "{size}: {counts:?}");
        keys.push(v["key"].clone());
    }
    // The default is 64K: a build without the flag is the second one, from the cache.
    let (v, _) = build_json(&m, &cache, &[]);
    assert_eq!(v["key"], keys[1]);
    assert_eq!(v["source"], "cached");
    assert_ne!(keys[0], keys[1]);
}

/// Prints an artifact's count of `Shape` nodes and each input's dims (`name:d0xd1…`, names for
/// free ones).
const DIMS: &str = r#"
import sys, onnx
m = onnx.load(sys.argv[1], load_external_data=False)
init = {t.name for t in m.graph.initializer}
ins = [i.name + ":" + "x".join(str(d.dim_value or d.dim_param) for d in i.type.tensor_type.shape.dim)
       for i in m.graph.input if i.name not in init]
print(sum(n.op_type == "Shape" for n in m.graph.node), " ".join(ins))
"#;

#[test]
fn a_fixed_profile_is_baked_into_the_cpu_artifact() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("bert.onnx");
    // Export-style: the reshapes take their sizes from Shape → Gather → Concat at run time.
    write(&bert::bert_exported(bert::BertConfig::tiny()), &m).unwrap();
    let cache = d.path().join("cache");
    let fixed = ["--opt-shapes", "input_ids:1x16,attention_mask:1x16"];
    let range = [
        "--min-shapes",
        "input_ids:1x1,attention_mask:1x1",
        "--opt-shapes",
        "input_ids:1x16,attention_mask:1x16",
        "--max-shapes",
        "input_ids:4x64,attention_mask:4x64",
    ];
    let mut seen = Vec::new();
    // seen[0]: fixed; seen[1]: fixed, --no-specialize; seen[2]: range.
    for args in [
        fixed.to_vec(),
        [&fixed[..], &["--no-specialize"]].concat(),
        range.to_vec(),
    ] {
        let (v, entry) = validated_build(&m, &cache, &args);
        let got = run_python(DIMS, &[&entry]);
        let (shapes, dims) = got.trim().split_once(' ').unwrap();
        seen.push((
            v["key"].as_str().unwrap().to_string(),
            shapes.parse::<usize>().unwrap(),
            dims.to_string(),
        ));
    }
    assert_eq!(seen[0].2, "input_ids:1x16 attention_mask:1x16", "{seen:?}");
    assert_eq!(
        seen[1].2, "input_ids:batchxseq attention_mask:batchxseq",
        "{seen:?}"
    );
    assert_eq!(seen[2].2, seen[1].2, "a range stays free: {seen:?}");
    // The shape arithmetic folded away; left free, the graph still reads shapes at run time.
    assert_eq!(seen[0].1, 0, "{seen:?}");
    assert!(seen[1].1 > 0, "{seen:?}");
    assert!(seen[0].0 != seen[1].0 && seen[1].0 != seen[2].0, "{seen:?}");

    // The sidecar can say the same for one model (the daemon builds from the sidecar): its
    // fixed profile left free is the `--no-specialize` build, from the cache.
    std::fs::write(
        d.path().join("bert.trtcache.toml"),
        "specialize = false\n[profiles.serve]\nopt = \"input_ids:1x16,attention_mask:1x16\"\n",
    )
    .unwrap();
    let (v, out) = build_json(&m, &cache, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["key"].as_str(), Some(seen[1].0.as_str()), "{v}");
    assert_eq!(v["source"], "cached");
}

#[test]
fn bert_fixture_is_valid_onnx() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bert.onnx");
    write(&bert::bert(bert::BertConfig::tiny()), &p).unwrap();
    let out = run_python(
        "import sys, onnx; m = onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True); print(len(m.graph.node))",
        &[&p],
    );
    assert!(out.trim().parse::<usize>().unwrap() > 50);
}

#[test]
fn second_build_is_a_cache_hit() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let cache = d.path().join("cache");
    let (first, out) = build_json(&m, &cache, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(first["source"], "built");
    assert_eq!(first["cache_hit"], false);
    let (second, out) = build_json(&m, &cache, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(second["source"], "cached");
    assert_eq!(second["cache_hit"], true);
    assert_eq!(second["key"], first["key"]);
    assert_eq!(second["record"]["hits"], 1);
    assert_eq!(second["artifact"], first["artifact"]);
    // The human report says so too.
    let human = trtcache([
        "build",
        m.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("cache hit"));
    // A different build option is a different key.
    let (other, _) = build_json(&m, &cache, &["--opt-level", "basic"]);
    assert_ne!(other["key"], first["key"]);
    assert_eq!(other["source"], "built");
}

#[test]
fn corrupted_blob_is_quarantined_by_verify_and_never_served() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let cache = d.path().join("cache");
    // Every initializer external, so the artifact has a data file to damage.
    let (v, _) = build_json(&m, &cache, &["--external-min-size", "0"]);
    let data = PathBuf::from(v["artifact"]["files"][1].as_str().unwrap());
    // Same size, one byte flipped: the cheap checks cannot see it, verify must.
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();
    let out = trtcache(["verify", "--cache-dir", cache.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rep = json(&out);
    assert_eq!(rep["quarantined"].as_array().unwrap().len(), 1, "{rep}");
    assert_eq!(rep["quarantined"][0][0], v["key"]);
    assert!(!data.exists(), "corrupt blob must be moved out of blobs/");
    let ls = json(&trtcache([
        "ls",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(ls[0]["status"]["state"], "quarantined");
    // Not served: the next build rebuilds, and the new artifact is intact.
    let (again, out) = build_json(&m, &cache, &["--external-min-size", "0"]);
    assert_eq!(again["key"], v["key"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(again["source"], "built");
    let out = trtcache(["verify", "--cache-dir", cache.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["ok"], 1);
}

#[test]
fn truncated_blob_is_never_served() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let cache = d.path().join("cache");
    let (v, _) = build_json(&m, &cache, &[]);
    let entry = PathBuf::from(v["artifact"]["entry"].as_str().unwrap());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&entry)
        .unwrap();
    f.set_len(10).unwrap();
    drop(f);
    let (again, out) = build_json(&m, &cache, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        again["source"], "built",
        "a truncated artifact must not be a hit"
    );
}

#[test]
fn leftovers_of_a_killed_build_are_cleaned_at_next_open() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let keep = d.path().join("keep.onnx");
    write(&models::tiny_encoder(false), &keep).unwrap();
    let lose = d.path().join("lose.onnx");
    write(&models::tiny_encoder(true), &lose).unwrap();
    let (kept, _) = build_json(&keep, &cache, &[]);
    let (lost, _) = build_json(&lose, &cache, &[]);
    // What a build killed at each step leaves behind: a staging dir with a half-written
    // file, a commit dir not yet renamed, a blob renamed but never indexed, and an index
    // entry whose blob directory vanished.
    std::fs::create_dir_all(cache.join("tmp/build-killed")).unwrap();
    std::fs::write(cache.join("tmp/build-killed/model.onnx"), b"half").unwrap();
    std::fs::create_dir_all(cache.join("tmp/commit-killed")).unwrap();
    std::fs::write(cache.join("tmp/stray.tmp"), b"x").unwrap();
    let orphan = cache.join("blobs").join("ab".repeat(32));
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join("model.onnx"), b"never indexed").unwrap();
    let lost_entry = PathBuf::from(lost["artifact"]["entry"].as_str().unwrap());
    std::fs::remove_dir_all(lost_entry.parent().unwrap()).unwrap();

    // `ls` only reads: nothing is cleaned by a listing.
    let out = trtcache(["ls", "--cache-dir", cache.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(cache.join("tmp/build-killed").exists() && orphan.exists());
    // The next writing open (here `gc`) cleans what carries the store's names; a file it did
    // not name (`stray.tmp`) is left alone.
    let out = trtcache([
        "gc",
        "--max-size",
        "100G",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("2 temp leftovers, 1 records without files, 1 orphan blobs"),
        "{}",
        stderr(&out)
    );
    assert!(cache.join("tmp/stray.tmp").exists());
    std::fs::remove_file(cache.join("tmp/stray.tmp")).unwrap();
    let out = trtcache(["ls", "--cache-dir", cache.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ls = json(&out);
    let keys: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, vec![kept["key"].as_str().unwrap()]);
    assert_eq!(std::fs::read_dir(cache.join("tmp")).unwrap().count(), 0);
    assert!(!orphan.exists());
    // The surviving entry is still a hit.
    let (again, _) = build_json(&keep, &cache, &[]);
    assert_eq!(again["source"], "cached");
}

#[test]
fn gpu_backends_fail_with_the_precise_reason() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(true), &m).unwrap();
    // Dynamic inputs without a profile: the TensorRT backends refuse from the plan, before
    // any library is loaded, so the answer is the same here as on a GPU host.
    let dynamic = d.path().join("dynamic.onnx");
    write(&models::tiny_encoder(false), &dynamic).unwrap();
    for backend in ["ort-tensorrt", "trt"] {
        let out = trtcache([
            "build",
            dynamic.to_str().unwrap(),
            "--backend",
            backend,
            "--cache-dir",
            d.path().join("cache").to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{backend}");
        let e = stderr(&out);
        assert!(
            e.contains(&format!("the {backend} backend needs a shape profile for every dynamic input, and x:NxNx64 has none"))
                && e.contains("--opt-shapes x:NxNx64"),
            "{e}"
        );
    }
    // A model TensorRT does not take whole (Unique: no TensorRT importer, no CUDA kernel):
    // ORT's TensorRT provider would write one EP-context model per subgraph and load only a
    // single EPContext node, so ort-tensorrt refuses it from the plan, naming what goes
    // elsewhere and the backend that serves it; ort-cuda gets past the plan.
    let partitioned = d.path().join("partitioned.onnx");
    write(&trtcache::fixtures::capability::unique(), &partitioned).unwrap();
    let out = trtcache([
        "build",
        partitioned.to_str().unwrap(),
        "--backend",
        "ort-tensorrt",
        "--opt-shapes",
        "x:8",
        "--cache-dir",
        d.path().join("cache").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(
        e.contains("the ort-tensorrt backend needs TensorRT to take the whole model")
            && e.contains("Unique ×1")
            && e.contains("the ort-cuda backend serves it"),
        "{e}"
    );
    let out = trtcache([
        "build",
        partitioned.to_str().unwrap(),
        "--backend",
        "ort-cuda",
        "--cache-dir",
        d.path().join("cache").to_str().unwrap(),
    ]);
    assert!(!stderr(&out).contains("whole model"), "{}", stderr(&out));
    for (backend, provider) in [("ort-tensorrt", "TensorRT"), ("ort-cuda", "CUDA")] {
        let out = trtcache([
            "build",
            m.to_str().unwrap(),
            "--backend",
            backend,
            "--cache-dir",
            d.path().join("cache").to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{backend}");
        let e = stderr(&out);
        assert!(
            e.contains(&format!(
                "{provider} execution provider is not enabled in this build"
            )),
            "{e}"
        );
        assert!(e.contains("install onnxruntime-gpu"), "{e}");
        if provider == "TensorRT" {
            assert!(e.contains("TensorRT 10"), "{e}");
        }
    }
    let out = trtcache(["build", m.to_str().unwrap(), "--backend", "ort-magic"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown backend `ort-magic`"));
}

#[test]
fn missing_onnx_runtime_is_one_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let out = trtcache([
        "build",
        m.to_str().unwrap(),
        "--cache-dir",
        d.path().join("cache").to_str().unwrap(),
        "--ort-library",
        "/nonexistent/libonnxruntime.so.1.31.1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(e.contains("ONNX Runtime not found"), "{e}");
    assert!(e.contains("/nonexistent/libonnxruntime.so.1.31.1"), "{e}");
    assert!(e.contains("pip install onnxruntime"), "{e}");
    let fake = d.path().join("libonnxruntime.so.1.31.1");
    std::fs::write(&fake, b"not a library").unwrap();
    let out = trtcache([
        "build",
        m.to_str().unwrap(),
        "--cache-dir",
        d.path().join("cache").to_str().unwrap(),
        "--ort-library",
        fake.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot load ONNX Runtime"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn second_owner_of_a_cache_dir_gets_in_use_by_pid() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let _held = SledStore::open(&cache, StoreOptions::default()).unwrap();
    let out = trtcache(["ls", "--cache-dir", cache.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(
        e.contains(&format!("is in use by pid {}", std::process::id())),
        "{e}"
    );
    // `trtcache key` needs no lock: it keys (and remembers the digest) while the cache is
    // owned by another process.
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let v = key_json(&m, &cache, &[]);
    assert_eq!(v["key"].as_str().map(str::len), Some(64), "{v}");
    assert_eq!(v["digest"]["memo_error"], Value::Null, "{v}");
}

#[test]
fn rm_and_gc_evict_least_recently_used() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let c = cache.to_str().unwrap();
    let a = d.path().join("a.onnx");
    write(&models::tiny_encoder(false), &a).unwrap();
    let b = d.path().join("b.onnx");
    write(&models::if_loop(), &b).unwrap();
    let (va, _) = build_json(&a, &cache, &[]);
    let (vb, _) = build_json(&b, &cache, &[]);
    let dry = json(&trtcache([
        "gc",
        "--cache-dir",
        c,
        "--max-size",
        "0",
        "--dry-run",
        "--json",
    ]));
    assert_eq!(dry["evicted"].as_array().unwrap().len(), 2);
    assert_eq!(
        json(&trtcache(["ls", "--cache-dir", c, "--json"]))
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Use `a` again so `b` is the least recently used... then cap below a + b.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    build_json(&a, &cache, &[]);
    let a_bytes = va["artifact"]["bytes"].as_u64().unwrap();
    let gc = json(&trtcache([
        "gc",
        "--cache-dir",
        c,
        "--max-size",
        &a_bytes.to_string(),
        "--json",
    ]));
    assert_eq!(gc["evicted"], serde_json::json!([vb["key"]]), "{gc}");
    let ls = json(&trtcache(["ls", "--cache-dir", c, "--json"]));
    assert_eq!(ls.as_array().unwrap().len(), 1);
    // Without --max-size, gc keeps to the daemon's limit: the config's cache_size_bytes.
    let cfg = d.path().join("gc.toml");
    std::fs::write(&cfg, "[limits]\ncache_size_bytes = 1\n").unwrap();
    let gc = json(&trtcache([
        "gc",
        "--config",
        cfg.to_str().unwrap(),
        "--cache-dir",
        c,
        "--dry-run",
        "--json",
    ]));
    assert_eq!(gc["max_bytes"], 1, "{gc}");
    assert_eq!(gc["evicted"].as_array().unwrap().len(), 1, "{gc}");
    let key = va["key"].as_str().unwrap();
    let out = trtcache(["rm", &key[..12], "--cache-dir", c, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["removed"], key);
    assert!(json(&trtcache(["ls", "--cache-dir", c, "--json"]))
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(std::fs::read_dir(cache.join("blobs")).unwrap().count(), 0);
    let out = trtcache(["rm", key, "--cache-dir", c]);
    assert_eq!(out.status.code(), Some(2));
}

fn library_builder(cache: &Path) -> (Arc<SledStore>, Builder) {
    runtime::load(Some(&crate::support::ort_dylib())).unwrap();
    let store = Arc::new(SledStore::open(cache, StoreOptions::default()).unwrap());
    let builder = Builder::new(store.clone(), Some(crate::support::ort_dylib()));
    (store, builder)
}

#[test]
fn an_artifact_that_fails_validation_is_recorded_failed_and_never_served() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let (store, builder) = library_builder(&d.path().join("cache"));
    // The hook swaps the artifact's graph for the same model with other weights, as a
    // broken optimizer or a bad engine would.
    let builder = builder.with_artifact_hook(Arc::new(|art: &trtcache::cache::StagedArtifact| {
        let mut wrong = models::tiny_encoder(false);
        let g = wrong.graph.as_mut().unwrap();
        let bias = g
            .initializer
            .iter_mut()
            .find(|t| t.name == "fc.bias")
            .unwrap();
        *bias = trtcache::fixtures::tensor_f32("fc.bias", &[64], &[0.5; 64]);
        write(&wrong, &art.dir.join(&art.entry)).unwrap();
    }));
    let req = BuildJob::new(&m, Backend::OrtCpu);
    let out = builder.build(&req, &|_| {}).unwrap();
    assert_eq!(out.source, Source::Built);
    assert!(out.served.is_none());
    assert!(
        matches!(out.record.status, Status::Failed { .. }),
        "{:?}",
        out.record.status
    );
    let v = out.record.validation.as_ref().unwrap();
    assert!(!v.passed && v.outputs[0].max_abs > 0.1, "{v:?}");
    // Each level down to disabled was built and refused (the hook breaks every one).
    assert_eq!(v.opt_level.as_deref(), Some("disabled"), "{v:?}");
    assert_eq!(v.rejected.len(), 3, "{v:?}");
    match &out.record.status {
        Status::Failed { reason } => assert!(
            reason.contains("at every optimization level down to disabled: all: y max abs")
                && reason.contains("widen the tolerance"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        out.record.artifact.is_none(),
        "a failed artifact is not stored"
    );
    match store.lookup(&out.key).unwrap() {
        Lookup::Unservable { why, .. } => assert!(why.contains("validation"), "{why}"),
        other => panic!("served a failed entry: {other:?}"),
    }
    // Asking again answers from the record instead of rebuilding blindly.
    let again = builder.build(&req, &|_| {}).unwrap();
    assert_eq!(again.source, Source::Cached);
    assert!(again.served.is_none());
}

#[test]
fn zero_tolerance_catches_optimizer_rounding_on_the_cli() {
    // ORT's fusions (LayerNorm, Gelu, MatMul+Add) change float rounding: with zero tolerance
    // every optimized graph is refused, and the model's own graph (level disabled), which
    // computes exactly what the reference computes, is what is stored.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("bert.onnx");
    write(&bert::bert(bert::BertConfig::tiny()), &m).unwrap();
    let cache = d.path().join("cache");
    let (v, out) = build_json(
        &m,
        &cache,
        &[
            "--atol",
            "0",
            "--rtol",
            "0",
            "--opt-shapes",
            "input_ids:2x16,attention_mask:2x16",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["state"], "ready");
    let val = &v["record"]["validation"];
    assert_eq!(val["opt_level"], "disabled", "{val}");
    assert_eq!(val["outputs"][0]["max_abs"], 0.0, "{val}");
    // The graph passes first, then each level down to basic.
    let rejected: Vec<&str> = val["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str()?.split(':').next())
        .collect();
    // Each level with the rewrites and then without them (the one without missed too, so
    // they were not the cause, and the level below tries them again).
    assert_eq!(
        rejected,
        [
            "rewrites at all",
            "all",
            "rewrites at extended",
            "extended",
            "rewrites at basic",
            "basic",
            "rewrites at disabled"
        ],
        "{val}"
    );
    // Default tolerances pass the same build at the level asked for.
    let (ok, out) = build_json(
        &m,
        &d.path().join("cache2"),
        &["--opt-shapes", "input_ids:2x16,attention_mask:2x16"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(ok["state"], "ready");
    assert!(
        ok["record"]["validation"].get("opt_level").is_none(),
        "{ok}"
    );
}

/// `x * 0.5 * (1 + erf(x / sqrt 2))`: the erf form of GELU, which ONNX Runtime's extended
/// level fuses into its own `Gelu` kernel (a different rounding, about 6e-8 here) and its
/// basic level leaves alone.
fn erf_gelu() -> trtcache::onnx::proto::ModelProto {
    use trtcache::fixtures::{model, tensor_f32, GraphBuilder};
    use trtcache::onnx::ElemType::Float32;
    let dims: Vec<trtcache::fixtures::D> = vec![4.into(), 64.into()];
    let mut g = GraphBuilder::new("erf_gelu");
    g.input("x", Float32, &dims)
        .output("y", Float32, Some(&dims))
        .init(tensor_f32("sqrt2", &[], &[std::f32::consts::SQRT_2]))
        .init(tensor_f32("one", &[], &[1.0]))
        .init(tensor_f32("half", &[], &[0.5]));
    g.node("Div", &["x", "sqrt2"], &["d"]);
    g.node("Erf", &["d"], &["e"]);
    g.node("Add", &["e", "one"], &["a"]);
    g.node("Mul", &["x", "a"], &["m"]);
    g.node("Mul", &["m", "half"], &["y"]);
    model(g.build(), &[("", 13)])
}

#[test]
fn an_artifact_over_tolerance_is_built_again_one_level_lower() {
    // At zero tolerance the fused Gelu of levels all and extended is refused; basic leaves
    // the graph's own ops and matches exactly: that artifact is stored and served, and the
    // report says which level it is and why the higher ones were refused. The key is the
    // one asked for (level all).
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("gelu.onnx");
    write(&erf_gelu(), &m).unwrap();
    let cache = d.path().join("cache");
    let (v, out) = build_json(&m, &cache, &["--atol", "0", "--rtol", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["state"], "ready", "{v}");
    let val = &v["record"]["validation"];
    assert_eq!(val["passed"], true, "{val}");
    assert_eq!(val["opt_level"], "basic", "{val}");
    let rejected: Vec<&str> = val["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    // At each level the `gelu` rewrite's artifact first (the same fused Gelu the higher
    // levels make), then the model as given; at basic the rewrite is the only fusion.
    let want = [
        "rewrites at all: y max abs",
        "all: y max abs",
        "rewrites at extended: y max abs",
        "extended: y max abs",
        "rewrites at basic: y max abs",
    ];
    assert_eq!(rejected.len(), want.len(), "{rejected:?}");
    for (got, want) in rejected.iter().zip(want) {
        assert!(got.starts_with(want), "{rejected:?}");
    }
    assert_eq!(v["record"]["parts"]["options"]["opt_level"], "all", "{v}");
    // The stored graph is the unfused one.
    let entry = v["artifact"]["entry"].as_str().unwrap();
    let art = trtcache::onnx::Model::load(Path::new(entry)).unwrap();
    let ops: Vec<&str> = art
        .graph()
        .node
        .iter()
        .map(|n| n.op_type.as_str())
        .collect();
    assert!(ops.contains(&"Erf") && !ops.contains(&"Gelu"), "{ops:?}");
    // The human output says so too.
    let text = trtcache(&[
        "build".into(),
        m.display().to_string(),
        "--cache-dir".into(),
        cache.display().to_string(),
        "--atol".into(),
        "0".into(),
        "--rtol".into(),
        "0".into(),
    ]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains(
            "built at optimization level basic: over tolerance higher up (rewrites at all: y max abs"
        ) && stdout.contains("; all: y max abs"),
        "{stdout}"
    );
    // With the default tolerance the fused graph passes at the level asked for.
    let (ok, out) = build_json(&m, &d.path().join("cache2"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        ok["record"]["validation"].get("opt_level").is_none(),
        "{ok}"
    );
}

#[test]
fn rewrites_that_did_not_move_an_artifact_are_kept_one_level_lower() {
    // The first two artifacts (level all with the `gelu` rewrite, then without it) are
    // broken alike by the hook, as ONNX Runtime's int8 path moves a static-QDQ model at
    // `all` with or without the rewrites: those were not the cause, so the next level
    // down is built with them again, and that artifact (validated) is the one stored.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("gelu.onnx");
    write(&erf_gelu(), &m).unwrap();
    let (out, attempts) = build_breaking_first(&m, &d.path().join("cache"), 2);
    assert_eq!(attempts, 3);
    assert!(out.served.is_some(), "{:?}", out.record.status);
    let v = out.record.validation.as_ref().unwrap();
    assert!(v.passed, "{v:?}");
    assert_eq!(v.opt_level.as_deref(), Some("extended"), "{v:?}");
    assert_eq!(v.rewrites.len(), 1, "{v:?}");
    assert!(v.rewrites[0].starts_with("gelu:"), "{v:?}");
    assert_eq!(v.rejected.len(), 2, "{v:?}");
    assert!(
        v.rejected[0].starts_with("rewrites at all: y max abs"),
        "{v:?}"
    );
    assert!(v.rejected[1].starts_with("all: y max abs"), "{v:?}");
    // Without the hook's second break, the rewrites were the cause: not tried again.
    let (out, attempts) = build_breaking_first(&m, &d.path().join("cache2"), 1);
    let v = out.record.validation.as_ref().unwrap();
    assert!(
        v.passed && v.opt_level.is_none() && v.rewrites.is_empty(),
        "{v:?}"
    );
    assert_eq!(attempts, 2);
}

/// Builds `model` (an [`erf_gelu`]) into `cache` with `ort-cpu`, its first `breaks` staged
/// artifacts given a wrong constant (`half` = 0.6) by the artifact hook; the outcome and
/// how many artifacts were staged.
fn build_breaking_first(
    model: &Path,
    cache: &Path,
    breaks: usize,
) -> (trtcache::builder::BuildOutcome, usize) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (_store, builder) = library_builder(cache);
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    let builder =
        builder.with_artifact_hook(Arc::new(move |art: &trtcache::cache::StagedArtifact| {
            if count.fetch_add(1, Ordering::SeqCst) < breaks {
                let mut wrong = erf_gelu();
                let g = wrong.graph.as_mut().unwrap();
                let half = g.initializer.iter_mut().find(|t| t.name == "half").unwrap();
                *half = trtcache::fixtures::tensor_f32("half", &[], &[0.6]);
                write(&wrong, &art.dir.join(&art.entry)).unwrap();
            }
        }));
    let out = builder
        .build(&BuildJob::new(model, Backend::OrtCpu), &|_| {})
        .unwrap();
    (out, seen.load(Ordering::SeqCst))
}

#[test]
fn golden_npz_inputs_drive_validation() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let g = d.path().join("golden.npz");
    let gz = d.path().join("golden_z.npz");
    let gi = d.path().join("golden_int.npz");
    run_python(
        "import sys, numpy as np\nx = np.random.default_rng(1).standard_normal((3, 5, 64)).astype(np.float32)\nnp.savez(sys.argv[1], x=x)\nnp.savez_compressed(sys.argv[2], x=x)\nnp.savez(sys.argv[3], x=np.ones((1, 2, 64), dtype=np.int64))",
        &[&g, &gz, &gi],
    );
    let (v, out) = build_json(
        &m,
        &d.path().join("cache"),
        &["--golden", g.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let val = &v["record"]["validation"];
    assert_eq!(val["shapes"]["x"], serde_json::json!([3, 5, 64]));
    assert_eq!(val["golden"], g.to_str().unwrap());
    assert_eq!(val["outputs"][0]["elements"], 3 * 5 * 64);
    let run = |cache: &str, golden: &Path| {
        trtcache([
            "build",
            m.to_str().unwrap(),
            "--cache-dir",
            d.path().join(cache).to_str().unwrap(),
            "--golden",
            golden.to_str().unwrap(),
        ])
    };
    // np.savez_compressed reads the same (issue 14).
    let out = run("cache2", &gz);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run("cache3", &gi);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("array is int64, the model input is float32"),
        "{}",
        stderr(&out)
    );
}

/// The record's thread probe (`validation.threads`), checked for what any timing gives:
/// positive fastest runs of the stated runs, and `single` as the rule says for them.
fn thread_probe(v: &Value) -> Option<(f64, f64, bool)> {
    let t = &v["record"]["validation"]["threads"];
    if t.is_null() {
        return None;
    }
    let (d, s) = (
        t["default_us"].as_f64().unwrap(),
        t["single_us"].as_f64().unwrap(),
    );
    assert!(d > 0.0 && s > 0.0, "{t}");
    // At least the 9 pairs, at most 50 (more while the probe's 100 ms budget lasts).
    let runs = t["runs"].as_u64().unwrap();
    assert!((9..=50).contains(&runs), "{t}");
    let single = t["single"].as_bool().unwrap();
    let scaled = &t["scaled"];
    let scaled_suits = scaled.is_null()
        || serde_json::from_value::<trtcache::cache::ScaledProbe>(scaled.clone())
            .unwrap()
            .single_suits();
    assert_eq!(
        single,
        trtcache::cache::ThreadProbe::single_suits(d, s) && scaled_suits,
        "{t}"
    );
    Some((d, s, single))
}

#[test]
fn the_thread_probe_times_fed_inputs_and_scales_searched_ones() {
    // A static-shape model: the validation inputs are the only ones it takes, so its runs
    // are timed on the default pool and on one thread.
    let d = tempfile::tempdir().unwrap();
    let fixed = d.path().join("gelu.onnx");
    write(&erf_gelu(), &fixed).unwrap();
    // The cap on the first validation run is a budget, not what this test is about: lifted
    // where a probe is expected, so a loaded machine cannot skip it.
    let lifted = ["--thread-probe-max-run-ms", "60000"];
    let (v, out) = build_json(&fixed, &d.path().join("c1"), &lifted);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(thread_probe(&v).is_some(), "{v}");
    assert!(
        v["record"]["validation"]["threads"]["scaled"].is_null(),
        "{v}"
    );
    // A map input (scikit-learn's DictVectorizer): one sample whatever its keys, no batch to
    // grow, so its validation inputs are what a consumer feeds too.
    let dict = d.path().join("dict.onnx");
    run_python(
        "import sys, onnx\nfrom onnx import helper as h, TensorProto as T\n\
         m = h.make_map_type_proto(T.STRING, h.make_tensor_type_proto(T.FLOAT, []))\n\
         g = h.make_graph([h.make_node('DictVectorizer', ['f'], ['y'], domain='ai.onnx.ml', \
         string_vocabulary=['age', 'height'])], 'dict', [h.make_value_info('f', m)], \
         [h.make_tensor_value_info('y', T.FLOAT, [1, 2])])\n\
         onnx.save(h.make_model(g, ir_version=8, opset_imports=[h.make_opsetid('', 13), \
         h.make_opsetid('ai.onnx.ml', 3)]), sys.argv[1])",
        &[&dict],
    );
    let (v, out) = build_json(&dict, &d.path().join("c7"), &lifted);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(thread_probe(&v).is_some(), "{v}");
    assert!(
        v["record"]["validation"]["threads"]["scaled"].is_null(),
        "{v}"
    );
    // A free batch searched by the defaults (a batch of 1 says little of the batch a
    // consumer feeds): timed there and again with the batch scaled up (256 times, halved
    // until the inputs fit 16 MiB), one thread only when it suits both.
    let batch = d.path().join("batch.onnx");
    write(&models::erf_gelu_grouped(), &batch).unwrap();
    let (v, out) = build_json(&batch, &d.path().join("c2"), &lifted);
    assert!(out.status.success(), "{}", stderr(&out));
    let (d0, s0, _) = thread_probe(&v).expect("timed");
    let val = &v["record"]["validation"];
    let scaled = &val["threads"]["scaled"];
    let factor = scaled["factor"].as_i64().unwrap();
    let [b, h] = [0, 1].map(|i| val["shapes"]["x"][i].as_i64().unwrap());
    assert!((2..=256).contains(&factor), "{scaled}");
    assert_eq!(
        scaled["shapes"]["x"],
        serde_json::json!([b * factor, h]),
        "{scaled}"
    );
    assert!(b * factor * h * 4 <= 16 << 20, "{scaled}");
    if trtcache::cache::ThreadProbe::single_suits(d0, s0) {
        assert!(scaled["default_us"].as_f64().unwrap() > 0.0, "{scaled}");
    } else {
        assert!(
            scaled["note"].as_str().unwrap().contains("not timed"),
            "{scaled}"
        );
    }
    // A free dimension that is not a batch (the encoder's sequence): the search's size says
    // nothing of what consumers feed, so the pool is kept whatever the timings, and the
    // record says which dimension.
    let free = d.path().join("enc.onnx");
    write(&models::tiny_encoder(false), &free).unwrap();
    let (v, out) = build_json(&free, &d.path().join("c8"), &lifted);
    assert!(out.status.success(), "{}", stderr(&out));
    let (_, _, single) = thread_probe(&v).expect("timed");
    assert!(!single, "{v}");
    let scaled = &v["record"]["validation"]["threads"]["scaled"];
    assert!(scaled["default_us"].is_null(), "{scaled}");
    assert!(
        scaled["note"]
            .as_str()
            .unwrap()
            .contains("input `x` axis 1 (`seq`) is free and not a batch"),
        "{scaled}"
    );
    // The same model on golden inputs, or at a profile's opt shapes: timed on those.
    let g = d.path().join("golden.npz");
    run_python(
        "import sys, numpy as np\nnp.savez(sys.argv[1], x=np.ones((2, 5, 64), np.float32))",
        &[&g],
    );
    let (v, out) = build_json(
        &free,
        &d.path().join("c3"),
        &["--golden", g.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(thread_probe(&v).is_some(), "{v}");
    let (v, out) = build_json(
        &free,
        &d.path().join("c4"),
        &["--opt-shapes", "x:1x6x64", lifted[0], lifted[1]],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(thread_probe(&v).is_some(), "{v}");
    // Off, or with a build thread count of its own: not timed.
    let (v, out) = build_json(
        &fixed,
        &d.path().join("c5"),
        &["--thread-probe-max-run-ms", "0"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(thread_probe(&v), None, "{v}");
    let (v, out) = build_json(
        &fixed,
        &d.path().join("c6"),
        &["--threads", "1", lifted[0], lifted[1]],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(thread_probe(&v), None, "{v}");
}

#[test]
fn the_thread_probe_never_advises_one_thread_for_inputs_the_model_refuses_scaled() {
    // `[n, 4]` reshaped to a fixed `[1, 4]`: the default search finds n = 1; at n = 256 the
    // artifact refuses the inputs, and one thread is not advised whatever the timings.
    use trtcache::fixtures::{model, tensor_i64, GraphBuilder, D};
    use trtcache::onnx::ElemType::Float32;
    let mut g = GraphBuilder::new("one_row");
    g.input("x", Float32, &[D::Named("n"), D::Fixed(4)])
        .output("y", Float32, Some(&[D::Fixed(1), D::Fixed(4)]))
        .init(tensor_i64("shape", &[2], &[1, 4]));
    g.node("Reshape", &["x", "shape"], &["y"]);
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("one_row.onnx");
    write(&model(g.build(), &[("", 17)]), &m).unwrap();
    let (v, out) = build_json(
        &m,
        &d.path().join("c"),
        &["--thread-probe-max-run-ms", "60000"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (d0, s0, single) = thread_probe(&v).expect("timed");
    assert!(!single, "{v}");
    let scaled = &v["record"]["validation"]["threads"]["scaled"];
    assert_eq!(
        scaled["shapes"]["x"],
        serde_json::json!([256, 4]),
        "{scaled}"
    );
    assert!(scaled["default_us"].is_null(), "{scaled}");
    let note = scaled["note"].as_str().unwrap();
    if trtcache::cache::ThreadProbe::single_suits(d0, s0) {
        assert!(note.contains("refused"), "{scaled}");
    } else {
        assert!(note.contains("not timed"), "{scaled}");
    }
}

/// The record's prepack probe (`validation.prepack`), checked for what any timing gives:
/// positive fastest sessions and runs, and `disable` as the rule says for them.
fn prepack_probe(v: &Value) -> Option<bool> {
    let p = &v["record"]["validation"]["prepack"];
    if p.is_null() {
        return None;
    }
    let t = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k}: {p}"));
    let (s, us, r, ur) = (
        t("session_us"),
        t("unpacked_session_us"),
        t("run_us"),
        t("unpacked_run_us"),
    );
    assert!(s > 0.0 && us > 0.0 && r > 0.0 && ur > 0.0, "{p}");
    assert!((9..=50).contains(&p["runs"].as_u64().unwrap()), "{p}");
    let disable = p["disable"].as_bool().unwrap();
    let first = trtcache::cache::PrepackProbe::unpacked_suits(s, us, r, ur);
    // A second pair of sessions timed exactly when the first favours skipping prepacking,
    // which then needs both.
    let confirm = &p["confirm_run_us"];
    assert_eq!(confirm.is_array(), first, "{p}");
    let suits = first && {
        let [r2, ur2] = [0, 1].map(|i| confirm[i].as_f64().unwrap());
        assert!(r2 > 0.0 && ur2 > 0.0, "{p}");
        trtcache::cache::PrepackProbe::unpacked_suits(s, us, r2, ur2)
    };
    // Validated exactly when the timings favour skipping prepacking.
    assert_eq!(p["validated"].is_boolean(), suits, "{p}");
    assert_eq!(disable, suits && p["validated"] == true, "{p}");
    Some(disable)
}

#[test]
fn the_prepack_probe_times_sessions_and_runs_both_ways_when_asked() {
    // An encoder's MatMuls pack their weights: its sessions and runs are timed with and
    // without (whatever the outcome, which is this machine's), with the thread count the
    // thread probe chose.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("enc.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    let lifted = [
        "--thread-probe-max-run-ms",
        "60000",
        "--prepack-probe-max-run-ms",
        "60000",
    ];
    let (v, out) = build_json(&m, &d.path().join("c1"), &lifted);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(prepack_probe(&v).is_some(), "{v}");
    // Off, or with a build thread count of its own: not timed.
    let (v, out) = build_json(
        &m,
        &d.path().join("c2"),
        &["--prepack-probe-max-run-ms", "0"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(prepack_probe(&v), None, "{v}");
    let (v, out) = build_json(
        &m,
        &d.path().join("c3"),
        &["--threads", "1", lifted[2], lifted[3]],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(prepack_probe(&v), None, "{v}");
}

#[test]
fn prepacking_is_skipped_only_when_it_costs_the_session_and_buys_the_runs_nothing() {
    use trtcache::cache::PrepackProbe;
    // A session 1 ms faster without, runs the same: skip it.
    assert!(PrepackProbe::unpacked_suits(3000.0, 2000.0, 50.0, 50.0));
    // Runs within 1 % and 0.2 µs: timer noise.
    assert!(PrepackProbe::unpacked_suits(3000.0, 2000.0, 10.0, 10.25));
    assert!(PrepackProbe::unpacked_suits(3000.0, 2000.0, 1000.0, 1010.0));
    // Runs slower: keep it, however much the session saves (ddddocr's CTC head: +17 %).
    assert!(!PrepackProbe::unpacked_suits(
        40000.0, 5000.0, 1000.0, 1020.0
    ));
    assert!(!PrepackProbe::unpacked_suits(3000.0, 2000.0, 10.0, 10.5));
    // A session no faster (nothing to pack), or by under 5 % or 50 µs: keep the default.
    assert!(!PrepackProbe::unpacked_suits(3000.0, 3000.0, 50.0, 40.0));
    assert!(!PrepackProbe::unpacked_suits(3000.0, 2900.0, 50.0, 40.0));
    assert!(!PrepackProbe::unpacked_suits(500.0, 460.0, 50.0, 40.0));
    assert!(!PrepackProbe::unpacked_suits(f64::NAN, 1.0, 1.0, 1.0));
    assert!(!PrepackProbe::unpacked_suits(
        3000.0,
        2000.0,
        1.0,
        f64::INFINITY
    ));
}

#[test]
fn one_thread_suits_an_artifact_no_slower_on_it() {
    use trtcache::cache::ThreadProbe;
    assert!(ThreadProbe::single_suits(10.0, 10.0));
    assert!(ThreadProbe::single_suits(10.0, 12.4), "within 5 % and 2 µs");
    assert!(!ThreadProbe::single_suits(10.0, 12.6));
    assert!(ThreadProbe::single_suits(95.0, 99.0));
    assert!(!ThreadProbe::single_suits(95.0, 102.0));
    // Only microsecond runs: a millisecond one keeps the pool even when one thread ties.
    assert!(!ThreadProbe::single_suits(1000.0, 1000.0));
    assert!(!ThreadProbe::single_suits(f64::NAN, 1.0));
    assert!(!ThreadProbe::single_suits(1.0, f64::INFINITY));
}

#[test]
fn a_build_killed_midway_leaves_nothing_servable_and_is_cleaned_up() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("bert.onnx");
    write(&bert::bert(bert::BertConfig::small()), &m).unwrap();
    let cache = d.path().join("cache");
    let mut child = std::process::Command::new(crate::support::bin())
        .args([
            "build",
            m.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it as soon as it has started writing its staging directory.
    let tmp = cache.join("tmp");
    let started = std::time::Instant::now();
    let mut seen = false;
    while started.elapsed() < std::time::Duration::from_secs(60) {
        if std::fs::read_dir(&tmp)
            .map(|r| r.count() > 0)
            .unwrap_or(false)
        {
            seen = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().ok();
    child.wait().unwrap();
    assert!(seen, "the build never staged anything");
    // `ls` only reads; the next writing open (here `gc`) cleans.
    let out = trtcache([
        "gc",
        "--max-size",
        "100G",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = trtcache(["ls", "--cache-dir", cache.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "temp leftovers remain"
    );
    // Whatever survived is consistent: every blob is named by a ready record.
    let ls = json(&out);
    let named: Vec<String> = ls
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["artifact"]["digest"].as_str().map(String::from))
        .collect();
    for e in std::fs::read_dir(cache.join("blobs")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            named.contains(&name),
            "orphan blob {name} survived the open"
        );
    }
    // And the build completes now.
    let (v, out) = build_json(&m, &cache, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["servable"], true);
}

/// `trtcache key` with the same flags.
fn key_json(model: &Path, cache: &Path, extra: &[&str]) -> Value {
    let mut args: Vec<String> = vec![
        "key".into(),
        model.display().to_string(),
        "--cache-dir".into(),
        cache.display().to_string(),
        "--json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = trtcache(&args);
    assert!(out.status.success(), "key {extra:?}: {}", stderr(&out));
    json(&out)
}

#[test]
fn key_and_build_report_the_same_key() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let m = d.path().join("enc.onnx");
    write(&models::tiny_encoder(false), &m).unwrap();
    // The digest memo only trusts files whose ctime is older than its racy margin (100 ms).
    std::thread::sleep(std::time::Duration::from_millis(250));
    let variants: &[&[&str]] = &[
        &[],
        &["--opt-shapes", "x:2x8x64"],
        &[
            "--min-shapes",
            "x:1x1x64",
            "--opt-shapes",
            "x:2x8x64",
            "--max-shapes",
            "x:4x32x64",
        ],
        &["--opt-shapes", "x:2x8x64", "--precision", "fp16"],
        &["--opt-shapes", "x:2x8x64", "--opt-level", "extended"],
        &["--opt-shapes", "x:2x8x64", "--no-prepack"],
        &["--opt-shapes", "x:2x8x64", "--external-min-size", "1K"],
        &["--opt-shapes", "x:2x8x64", "-o", "label=blue"],
    ];
    let mut keys = Vec::new();
    for extra in variants {
        // Key before the build (hashes) and after it (the memo the build wrote): the same.
        let before = key_json(&m, &cache, extra);
        let (b, out) = build_json(&m, &cache, extra);
        assert!(out.status.success(), "build {extra:?}: {}", stderr(&out));
        let after = key_json(&m, &cache, extra);
        assert_eq!(before["key"], b["key"], "{extra:?}");
        assert_eq!(after["key"], b["key"], "{extra:?}");
        assert_eq!(after["digest"]["memo_hits"], 1, "{extra:?}: {after}");
        assert_eq!(before["parts"], b["record"]["parts"], "{extra:?}");
        keys.push(b["key"].as_str().unwrap().to_string());
    }
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        keys.len(),
        "every variant has its own key: {keys:?}"
    );

    // A sidecar: key and build both take its profile and precision, and the build validates
    // at the sidecar's opt shape.
    let sc = d.path().join("sc.onnx");
    write(&models::tiny_encoder(false), &sc).unwrap();
    std::fs::write(
        d.path().join("sc.trtcache.toml"),
        "precision = \"fp16\"\n[profiles.p]\nmin = \"x:1x1x64\"\nopt = \"x:3x5x64\"\nmax = \"x:4x16x64\"\n\
         [tolerances.fp16]\natol = 0.05\nrtol = 0.02\n[golden]\nseed = 7\n",
    )
    .unwrap();
    let k = key_json(&sc, &cache, &[]);
    let (b, out) = build_json(&sc, &cache, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(k["key"], b["key"]);
    let parts = &b["record"]["parts"];
    assert_eq!(parts["precision"], "fp16");
    assert_eq!(parts["profile"]["opt"]["x"], serde_json::json!([3, 5, 64]));
    assert_eq!(parts["profile"]["max"]["x"], serde_json::json!([4, 16, 64]));
    let v = &b["record"]["validation"];
    assert_eq!(v["shapes"]["x"], serde_json::json!([3, 5, 64]));
    // The sidecar's tolerance for its precision and its golden seed drive validation.
    assert_eq!(v["tolerance"]["atol"], 0.05);
    assert_eq!(v["tolerance"]["rtol"], 0.02);
    assert_eq!(v["seed"], 7);
    // The same shapes from flags (another profile name, same shapes): the same key.
    let flags = [
        "--no-sidecar",
        "--precision",
        "fp16",
        "--min-shapes",
        "x:1x1x64",
        "--opt-shapes",
        "x:3x5x64",
        "--max-shapes",
        "x:4x16x64",
    ];
    assert_eq!(key_json(&sc, &cache, &flags)["key"], b["key"]);
    let (again, _) = build_json(&sc, &cache, &flags);
    assert_eq!(again["key"], b["key"]);
    assert_eq!(again["source"], "cached");

    // A profile contradicting a fixed dim fails with plan's error before any build.
    let fresh = d.path().join("fresh-cache");
    let out = trtcache([
        "build",
        m.to_str().unwrap(),
        "--cache-dir",
        fresh.to_str().unwrap(),
        "--opt-shapes",
        "x:2x8x32",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(
        e.contains("input `x` axis 2 is fixed to 64") && e.contains("gives 32"),
        "{e}"
    );
    assert!(!e.contains("building with"), "{e}");
    assert!(!fresh.exists(), "nothing was built or stored");
}

/// Op types of a stored artifact's graph.
fn artifact_ops(v: &Value) -> Vec<String> {
    let entry = v["artifact"]["entry"].as_str().unwrap();
    let art = trtcache::onnx::Model::load(Path::new(entry)).unwrap();
    art.graph().node.iter().map(|n| n.op_type.clone()).collect()
}

/// The largest absolute difference between `model` and the artifact a build reported in `v`,
/// on one random input of `shape` (`COMPARE`, e.g. `1x8x6x6`).
fn artifact_diff(model: &Path, v: &Value, shape: &str) -> f64 {
    let entry = v["artifact"]["entry"].as_str().unwrap();
    run_python(COMPARE, &[model, Path::new(entry), Path::new(shape)])
        .trim()
        .parse()
        .unwrap()
}

/// Builds `model` into `cache` with the defaults and checks the build validated and that its
/// first rewrite is `rewrite` (the record's `validation.rewrites`); returns the JSON.
fn build_rewritten(model: &Path, cache: &Path, rewrite: &str) -> Value {
    let (v, out) = build_json(model, cache, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let val = &v["record"]["validation"];
    assert_eq!(val["passed"], true, "{val}");
    assert_eq!(val["rewrites"][0], rewrite, "{val}");
    v
}

/// Op types of `model`'s artifact built with `--no-rewrite` into `cache`.
fn ops_without_rewrites(model: &Path, cache: &Path) -> Vec<String> {
    let (v, out) = build_json(model, cache, &["--no-rewrite"]);
    assert!(out.status.success(), "{}", stderr(&out));
    artifact_ops(&v)
}

/// Runs the original and the artifact on one Gaussian signal and prints the largest relative
/// difference of each from numpy's float64 power spectrum, over bins above 1 % of the peak.
const STFT_ERRORS: &str = r#"
import sys, numpy as np, onnxruntime as ort
orig, art, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = np.random.default_rng(1).standard_normal((1, length)).astype(np.float32)
n, step = 400, 160
w = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)
frames = np.stack([x[0, i * step:i * step + n].astype(np.float64) * w for i in range((length - n) // step + 1)])
exact = np.abs(np.fft.rfft(frames, axis=1)) ** 2
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
big = exact > 0.01 * exact.max()
for p in (orig, art):
    y = ort.InferenceSession(p, so, providers=['CPUExecutionProvider']).run(None, {'x': x})[0][0]
    assert y.shape == exact.shape, (y.shape, exact.shape)
    print(float((np.abs(y - exact) / exact)[big].max()))
"#;

#[test]
fn an_stft_is_built_as_a_conv_and_validated_against_an_exact_reference() {
    // A 400-sample frame: ONNX Runtime's float32 direct DFT. The artifact has a Conv instead;
    // against ORT's run of the model it misses the default tolerance (ORT's STFT is the less
    // exact of the two), so it is compared with the model's STFT in float64, and the report
    // says so and what the first comparison found.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("stft.onnx");
    write(&models::stft(400, 16000), &m).unwrap();
    let cache = d.path().join("cache");
    let (v, out) = build_json(&m, &cache, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["state"], "ready", "{v}");
    let val = &v["record"]["validation"];
    assert_eq!(val["passed"], true, "{val}");
    let rewrites = val["rewrites"].as_array().expect("rewrites listed");
    assert!(
        rewrites[0]
            .as_str()
            .unwrap()
            .starts_with("stft-as-conv: STFT `spectrum` (frame 400, step 160, 201 bins)"),
        "{val}"
    );
    let reference = val["reference"]
        .as_str()
        .expect("the exact reference named");
    assert!(
        reference.contains("float64")
            && reference.contains("against ONNX Runtime's run of the model as given: y max abs"),
        "{reference}"
    );
    assert_eq!(
        v["record"]["parts"]["options"]["rewrites"],
        passes::key_list(),
        "{v}"
    );
    let ops = artifact_ops(&v);
    assert!(
        ops.contains(&"Conv".into()) && !ops.contains(&"STFT".into()),
        "{ops:?}"
    );
    // Closer to numpy's float64 spectrum than ONNX Runtime's own STFT is.
    let entry = v["artifact"]["entry"].as_str().unwrap();
    let errs = run_python(STFT_ERRORS, &[&m, Path::new(entry), Path::new("16000")]);
    let errs: Vec<f64> = errs
        .split_whitespace()
        .map(|e| e.parse().unwrap())
        .collect();
    assert!(
        errs[1] < 1e-4 && errs[1] < errs[0],
        "original, artifact: {errs:?}"
    );
    // The human report says what was rewritten and compared.
    let text = trtcache(&[
        "build".into(),
        m.display().to_string(),
        "--cache-dir".into(),
        cache.display().to_string(),
    ]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains("rewritten: stft-as-conv: STFT `spectrum`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("compared with the model with its rewritten STFTs computed in float64"),
        "{stdout}"
    );
}

#[test]
fn a_rewritten_artifact_over_both_references_is_built_without_rewrites() {
    // At zero tolerance the Conv differs from both references; the same model without the
    // rewrite matches ORT's run exactly: that artifact is stored, and the report says why.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("stft.onnx");
    write(&models::stft(400, 4000), &m).unwrap();
    let (v, out) = build_json(&m, &d.path().join("cache"), &["--atol", "0", "--rtol", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["state"], "ready", "{v}");
    let val = &v["record"]["validation"];
    assert_eq!(val["passed"], true, "{val}");
    assert!(
        val.get("rewrites").is_none() && val.get("reference").is_none(),
        "{val}"
    );
    assert!(val.get("opt_level").is_none(), "{val}");
    let rejected = val["rejected"].as_array().unwrap();
    assert!(
        rejected[0]
            .as_str()
            .unwrap()
            .starts_with("rewrites at all: y max abs"),
        "{val}"
    );
    assert!(artifact_ops(&v).contains(&"STFT".into()));
    // Asked for: no rewrite, another key, the STFT kept.
    let (n, out) = build_json(&m, &d.path().join("cache2"), &["--no-rewrite"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(n["record"]["parts"]["options"]["rewrites"], "none", "{n}");
    assert_ne!(n["key"], v["key"]);
    assert!(n["record"]["validation"].get("rewrites").is_none(), "{n}");
    assert!(artifact_ops(&n).contains(&"STFT".into()));
    // The sidecar's `rewrite = false` (how a daemon-served model opts out) is the same build.
    std::fs::write(d.path().join("stft.trtcache.toml"), "rewrite = false\n").unwrap();
    let (s, out) = build_json(&m, &d.path().join("cache3"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(s["key"], n["key"], "{s}");
}

#[test]
fn a_scalar_affine_after_a_conv_is_built_into_the_conv() {
    // Conv → Mul(0.75) → Add(-0.25) with every constant a Constant node (as paddle2onnx
    // writes PP-LCNetV3's learnable affine blocks) becomes the Conv alone, validated against
    // the model as given; --no-rewrite keeps the Mul and Add.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("affine.onnx");
    write(&models::conv_affine(true, true, true), &m).unwrap();
    let v = build_rewritten(
        &m,
        &d.path().join("cache"),
        "conv-affine: 1 scalar Mul/Add after a Conv folded into its weights and bias",
    );
    let ops = artifact_ops(&v);
    assert!(
        !ops.contains(&"Mul".into()) && !ops.contains(&"Add".into()),
        "{ops:?}"
    );
    let diff = artifact_diff(&m, &v, "1x4x6x6");
    assert!(diff < 1e-5, "max abs {diff}");
    let ops = ops_without_rewrites(&m, &d.path().join("cache2"));
    assert!(ops.contains(&"Mul".into()), "{ops:?}");
}

#[test]
fn an_if_whose_condition_the_shapes_fix_is_built_as_its_branch() {
    // bool(x.shape[0]) and x.shape[2] == 4 on x: [2, batch, 4] become their then branches;
    // x.shape[1] == 1 (the batch) stays an If. Validated against the model as given, and
    // the artifact agrees with it on both sides of the batch check.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("static_if.onnx");
    write(&models::static_if(false), &m).unwrap();
    let (v, out) = build_json(&m, &d.path().join("cache"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let val = &v["record"]["validation"];
    assert_eq!(val["passed"], true, "{val}");
    let lines: Vec<&str> = val["rewrites"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert_eq!(lines.len(), 2, "{val}");
    assert!(
        lines.iter().all(|l| l.starts_with("static-if: ")),
        "{lines:?}"
    );
    let ops = artifact_ops(&v);
    assert_eq!(ops.iter().filter(|o| *o == "If").count(), 1, "{ops:?}");
    assert!(ops.contains(&"Neg".into()), "{ops:?}");
    for shape in ["2x3x4", "2x1x4"] {
        let diff = artifact_diff(&m, &v, shape);
        assert!(diff == 0.0, "{shape}: max abs {diff}");
    }
    let ops = ops_without_rewrites(&m, &d.path().join("cache2"));
    assert_eq!(ops.iter().filter(|o| *o == "If").count(), 2, "{ops:?}");
}

#[test]
fn a_rewritten_graph_onnx_runtime_refuses_is_built_as_given() {
    // static-if inlines a branch whose one-element vector feeds Range; ONNX Runtime refuses
    // that graph (ONNX's Range wants a scalar) but runs the model: the build falls back to
    // the model without rewrites and validates.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("range.onnx");
    write(&models::static_if_into_range(), &m).unwrap();
    let (v, out) = build_json(&m, &d.path().join("cache"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let val = &v["record"]["validation"];
    assert_eq!(val["passed"], true, "{val}");
    assert!(
        val.get("rewrites")
            .is_none_or(|r| r.as_array().unwrap().is_empty()),
        "{val}"
    );
    assert!(artifact_ops(&v).contains(&"If".into()));
}

#[test]
fn an_erf_gelu_onnx_runtime_does_not_fuse_is_built_as_one_gelu() {
    // x·(½·(1 + erf(x/√2))): ORT fuses other groupings, not this one; the rewrite makes it
    // com.microsoft.Gelu, validated against the model as given; --no-rewrite keeps Erf.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("gelu.onnx");
    write(&models::erf_gelu_grouped(), &m).unwrap();
    let v = build_rewritten(
        &m,
        &d.path().join("cache"),
        "gelu: 1 x·½·(1 + erf(x/√2)) as com.microsoft.Gelu",
    );
    let ops = artifact_ops(&v);
    assert!(!ops.contains(&"Erf".into()), "{ops:?}");
    let diff = artifact_diff(&m, &v, "3x16");
    assert!(diff < 1e-5, "max abs {diff}");
    assert!(ops_without_rewrites(&m, &d.path().join("cache2")).contains(&"Erf".into()));
}

#[test]
fn a_spelled_out_hard_swish_is_built_as_a_hard_sigmoid_gate() {
    // Add → Clip → Mul → Div at opset 13 becomes HardSigmoid + Mul, validated against the
    // model as given; --no-rewrite keeps the four ops.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("hs.onnx");
    write(&models::hard_swish(false), &m).unwrap();
    let v = build_rewritten(
        &m,
        &d.path().join("cache"),
        "hardswish: 1 x·clip(x+3, 0, 6)/6 as Mul(x, HardSigmoid(x))",
    );
    assert!(v["record"]["validation"].get("reference").is_none(), "{v}");
    assert_eq!(
        v["record"]["parts"]["options"]["rewrites"],
        passes::key_list()
    );
    let ops = artifact_ops(&v);
    assert!(
        ops.contains(&"HardSigmoid".into()) && !ops.contains(&"Clip".into()),
        "{ops:?}"
    );
    let diff = artifact_diff(&m, &v, "1x8x6x6");
    assert!(diff < 1e-5, "max abs {diff}");
    assert!(ops_without_rewrites(&m, &d.path().join("cache2")).contains(&"Clip".into()));
}

#[test]
fn a_qdq_models_constant_dequantizes_are_folded_after_onnx_runtime_optimizes_it() {
    // Weight DequantizeLinears ONNX Runtime does not fuse (float activations) run on every
    // inference; the artifact holds the floats they compute instead, so its outputs are
    // exactly the model's; --no-rewrite keeps them.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("qdq.onnx");
    write(&models::qdq_conv(), &m).unwrap();
    let (v, out) = build_json(&m, &d.path().join("cache"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let val = &v["record"]["validation"];
    assert_eq!(val["passed"], true, "{val}");
    let rewrites: Vec<&str> = val["rewrites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        rewrites
            .iter()
            .any(|r| r.starts_with("dequantize-constants: 3 DequantizeLinear")),
        "{val}"
    );
    let ops = artifact_ops(&v);
    assert!(!ops.contains(&"DequantizeLinear".into()), "{ops:?}");
    assert_eq!(
        artifact_diff(&m, &v, "1x2x6x6"),
        0.0,
        "the same floats, the same outputs"
    );
    let ops = ops_without_rewrites(&m, &d.path().join("cache2"));
    assert!(ops.contains(&"DequantizeLinear".into()), "{ops:?}");
}

#[test]
fn a_dynamically_quantized_grouped_conv_is_built_as_an_exact_float_conv() {
    // A depthwise ConvInteger (MobileNet's and EfficientNet's after quantize_dynamic):
    // the artifact computes the same integers with a float Conv and casts them back, so its
    // outputs are exactly the model's; --no-rewrite keeps the ConvInteger.
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("qconv_grouped.onnx");
    write(&models::conv_integer_grouped(1), &m).unwrap();
    let v = build_rewritten(
        &m,
        &d.path().join("cache"),
        "conv-integer-depthwise-float: 1 depthwise ConvInteger computed by a float Conv of the same integers (exact: every window's sum under 2^24)",
    );
    assert_eq!(
        v["record"]["validation"]["rewrites"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "{v}"
    );
    let ops = artifact_ops(&v);
    assert!(!ops.contains(&"ConvInteger".into()), "{ops:?}");
    assert_eq!(
        artifact_diff(&m, &v, "1x8x6x6"),
        0.0,
        "the same integers, the same outputs"
    );
    assert!(ops_without_rewrites(&m, &d.path().join("cache2")).contains(&"ConvInteger".into()));
}

#[test]
fn a_dynamically_quantized_convs_int8_weights_are_built_as_uint8() {
    // DynamicQuantizeLinear → ConvInteger (int8 weights) → Cast → Mul, as ONNX Runtime's
    // quantize_dynamic writes a Conv (and with the int32 bias Add older versions wrote): the
    // artifact's ConvInteger takes the same integers as uint8 (w + 128, zero point + 128), so
    // its outputs are exactly the model's; --no-rewrite keeps the int8 weights.
    const WEIGHT_TYPES: &str = r#"
import sys, onnx
m = onnx.load(sys.argv[1])
g = m.graph
inits = {t.name: t.data_type for t in g.initializer}
print(",".join(str(inits.get(n.input[1])) for n in g.node if n.op_type == "ConvInteger"))
"#;
    for bias_add in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("qconv.onnx");
        write(&models::conv_integer(bias_add, false), &m).unwrap();
        let v = build_rewritten(
            &m,
            &d.path().join("cache"),
            "conv-integer-uint8: 1 ConvInteger with int8 weights given them as uint8 (+128, the same integers)",
        );
        let entry = Path::new(v["artifact"]["entry"].as_str().unwrap()).to_path_buf();
        // uint8 (2) in the artifact, int8 (3) without the rewrite.
        assert_eq!(run_python(WEIGHT_TYPES, &[&entry]).trim(), "2", "{v}");
        let diff = artifact_diff(&m, &v, "1x2x6x6");
        assert_eq!(
            diff, 0.0,
            "bias_add {bias_add}: the same integers, the same outputs"
        );
        let (v, out) = build_json(&m, &d.path().join("cache2"), &["--no-rewrite"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let entry = Path::new(v["artifact"]["entry"].as_str().unwrap()).to_path_buf();
        assert_eq!(run_python(WEIGHT_TYPES, &[&entry]).trim(), "3", "{v}");
    }
}

/// `build --max-size` below the artifact's size: one final answer naming the size and the
/// limit, nothing stored (before: stored, then evicted by its own store).
#[test]
fn an_artifact_bigger_than_max_size_is_refused_naming_the_limit() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write(&models::tiny_encoder(true), &m).unwrap();
    let cache = d.path().join("cache");
    let out = trtcache([
        "build",
        m.to_str().unwrap(),
        "--max-size",
        "1K",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("more than the whole cache may hold (limits.cache_size_bytes = 1024"),
        "{e}"
    );
    let ls = trtcache(["ls", "--json", "--cache-dir", cache.to_str().unwrap()]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    assert!(
        json(&ls)
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] != "ready" && r["state"] != "ready"),
        "{}",
        String::from_utf8_lossy(&ls.stdout)
    );
}
