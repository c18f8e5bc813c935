//! Cache keys through the real binary: what changes a key (weights, attributes, opsets,
//! profiles, the SKU, backend library versions, build options, precision) and what does not
//! (renaming, moving, touching, moving external data along), the digest memo, profile
//! validation errors, and device detection without a GPU.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use trtcache::fixtures::{models, write, write_external};
use trtcache::onnx::proto::ModelProto;

use crate::support::{bin, json, ort_dylib};

/// Runs `trtcache ARGS` with ONNX Runtime found through ORT_DYLIB_PATH; `env` overrides.
/// A default cache folder of its own per run keeps the user's ~/.cache out of the tests.
fn run(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    let mut c = Command::new(bin());
    c.args(args)
        .env("NO_COLOR", "1")
        .env("TRTCACHE_CACHE_DIR", cache.path())
        .env("ORT_DYLIB_PATH", ort_dylib());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running trtcache")
}

fn ok_json(args: &[&str], env: &[(&str, &Path)]) -> Value {
    let out = run(args, env);
    assert!(
        out.status.success(),
        "trtcache {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

/// The key of `model` with extra args, memo disabled.
fn key(model: &Path, extra: &[&str]) -> String {
    let m = model.to_str().unwrap();
    let mut args = vec!["key", m, "--json", "--no-memo"];
    args.extend_from_slice(extra);
    let v = ok_json(&args, &[]);
    v["key"].as_str().unwrap().to_string()
}

fn err(args: &[&str]) -> String {
    let out = run(args, &[]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2 for {args:?}: {out:?}"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write_model(dir: &Path, name: &str, m: &ModelProto) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    write(m, &p).unwrap();
    p
}

fn base() -> ModelProto {
    models::tiny_encoder(false)
}

#[test]
fn content_changes_change_the_key() {
    let d = tempfile::tempdir().unwrap();
    let k0 = key(&write_model(d.path(), "m.onnx", &base()), &[]);

    let mut w = base();
    let g = w.graph.as_mut().unwrap();
    let t = g
        .initializer
        .iter_mut()
        .find(|t| t.name == "fc.weight")
        .unwrap();
    let mut raw = t.raw_data.to_vec();
    raw[17] ^= 1;
    t.raw_data = raw.into();
    let k_weight = key(&write_model(&d.path().join("w"), "m.onnx", &w), &[]);

    let mut a = base();
    let ln = &mut a.graph.as_mut().unwrap().node[0];
    let eps = ln
        .attribute
        .iter_mut()
        .find(|a| a.name == "epsilon")
        .unwrap();
    eps.f = 1e-6;
    let k_attr = key(&write_model(&d.path().join("a"), "m.onnx", &a), &[]);

    let mut o = base();
    o.opset_import[0].version = 18;
    let po = write_model(&d.path().join("o"), "m.onnx", &o);
    let k_opset = key(&po, &[]);
    let v = ok_json(&["key", po.to_str().unwrap(), "--json", "--no-memo"], &[]);
    assert_eq!(v["parts"]["opsets"][""], 18);

    let all = [&k0, &k_weight, &k_attr, &k_opset];
    for (i, x) in all.iter().enumerate() {
        for y in &all[i + 1..] {
            assert_ne!(x, y);
        }
    }
}

#[test]
fn external_data_byte_changes_the_key() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.onnx");
    write_external(&base(), &p, "m.onnx.data", 128).unwrap();
    let k0 = key(&p, &[]);
    let data = d.path().join("m.onnx.data");
    let mut b = std::fs::read(&data).unwrap();
    let last = b.len() - 1;
    b[last] ^= 0x40;
    std::fs::write(&data, &b).unwrap();
    assert_ne!(key(&p, &[]), k0);
}

#[test]
fn plan_sku_backend_and_options_change_the_key() {
    let d = tempfile::tempdir().unwrap();
    let p = write_model(d.path(), "m.onnx", &base());
    let k = |extra: &[&str]| key(&p, extra);
    let k0 = k(&[]);
    let k_prof = k(&["--opt-shapes", "x:2x16x64"]);
    let k_prof2 = k(&["--opt-shapes", "x:4x16x64"]);
    let k_prof3 = k(&[
        "--min-shapes",
        "x:1x1x64",
        "--opt-shapes",
        "x:4x16x64",
        "--max-shapes",
        "x:8x128x64",
    ]);
    let k_fp16 = k(&["--precision", "fp16"]);
    let k_opt1 = k(&["-o", "graph_optimization_level=1"]);
    let k_opt2 = k(&["-o", "graph_optimization_level=2"]);

    // Another ONNX Runtime version: the same library under another versioned name.
    let lib = d.path().join("lib/libonnxruntime.so.1.30.0");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(ort_dylib(), &lib).unwrap();
    let v = ok_json(
        &["key", p.to_str().unwrap(), "--json", "--no-memo"],
        &[("ORT_DYLIB_PATH", &lib)],
    );
    assert_eq!(v["parts"]["backend"]["versions"]["onnxruntime"], "1.30.0");
    let k_ort = v["key"].as_str().unwrap().to_string();

    let all = [
        &k0, &k_prof, &k_prof2, &k_prof3, &k_fp16, &k_opt1, &k_opt2, &k_ort,
    ];
    for (i, x) in all.iter().enumerate() {
        for y in &all[i + 1..] {
            assert_ne!(x, y, "{all:?}");
        }
    }
    // Same flags twice, same key; option order on the command line does not matter.
    assert_eq!(k(&["--opt-shapes", "x:2x16x64"]), k_prof);
    assert_eq!(
        k(&["-o", "a=1", "-o", "b=2"]),
        k(&["-o", "b=2", "-o", "a=1"])
    );
    // The SKU: the same parts with another CPU's ISA flags give another key.
    let parts: trtcache::key::KeyParts = serde_json::from_value(v["parts"].clone()).unwrap();
    let mut other = parts.clone();
    other.sku.isa.retain(|f| f != "avx512f");
    other.sku.isa.push("amx_tile".into());
    assert_ne!(parts.key(), other.key());
    let mut other = parts.clone();
    other.sku.name.push_str(" v2");
    assert_ne!(parts.key(), other.key());
    assert_eq!(parts.key().hex(), k_ort);
}

#[test]
fn rename_move_touch_and_moving_external_data_keep_the_key() {
    let d = tempfile::tempdir().unwrap();
    let p = write_model(&d.path().join("a"), "model.onnx", &base());
    let k0 = key(&p, &[]);
    // Renamed.
    let renamed = d.path().join("a/renamed.onnx");
    std::fs::rename(&p, &renamed).unwrap();
    assert_eq!(key(&renamed, &[]), k0);
    // Moved to another folder.
    let moved = d.path().join("b/deeper/x.onnx");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    std::fs::rename(&renamed, &moved).unwrap();
    assert_eq!(key(&moved, &[]), k0);
    // Touched (mtime far in the past).
    let st = Command::new("touch")
        .args(["-d", "@1000000000"])
        .arg(&moved)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(key(&moved, &[]), k0);

    // External data moved together with the model.
    let e1 = d.path().join("ext1");
    std::fs::create_dir_all(&e1).unwrap();
    write_external(&base(), &e1.join("model.onnx"), "weights.bin", 128).unwrap();
    let ke = key(&e1.join("model.onnx"), &[]);
    let e2 = d.path().join("elsewhere/ext2");
    std::fs::create_dir_all(e2.parent().unwrap()).unwrap();
    std::fs::rename(&e1, &e2).unwrap();
    assert_eq!(key(&e2.join("model.onnx"), &[]), ke);
    // ... and the external model differs from the inline one (different graph bytes).
    assert_ne!(ke, k0);
}

#[test]
fn sidecar_profiles_and_validation_errors() {
    let d = tempfile::tempdir().unwrap();
    let p = write_model(d.path(), "enc.onnx", &base());
    let m = p.to_str().unwrap();
    std::fs::write(
        d.path().join("enc.trtcache.toml"),
        r#"
precision = "fp16"
default_profile = "small"
[profiles.small]
min = { x = [1, 1, 64] }
opt = { x = [2, 16, 64] }
max = { x = [8, 128, 64] }
[profiles.same_as_small]
min = "x:1x1x64"
opt = "x:2x16x64"
max = "x:8x128x64"
[profiles.bad]
min = "x:1x1x32"
opt = "x:2x16x64"
max = "x:8x128x64"
"#,
    )
    .unwrap();
    let v = ok_json(&["key", m, "--json", "--no-memo"], &[]);
    assert_eq!(v["profile_name"], "small");
    assert_eq!(v["parts"]["precision"], "fp16");
    assert_eq!(
        v["parts"]["profile"]["max"]["x"],
        serde_json::json!([8, 128, 64])
    );
    assert!(v["sidecar"]
        .as_str()
        .unwrap()
        .ends_with("enc.trtcache.toml"));
    // A profile's name is a label: same shapes, same key. Flags give the same shapes too.
    let same = key(&p, &["--profile", "same_as_small"]);
    assert_eq!(same, v["key"].as_str().unwrap());
    let flags = key(
        &p,
        &[
            "--min-shapes",
            "x:1x1x64",
            "--opt-shapes",
            "x:2x16x64",
            "--max-shapes",
            "x:8x128x64",
            "--precision",
            "fp16",
        ],
    );
    assert_eq!(flags, same);
    assert_ne!(key(&p, &["--no-sidecar"]), same);
    assert_eq!(v["parts"]["backend"]["name"], "ort-cpu");

    let e = err(&["key", m, "--profile", "bad"]);
    assert!(
        e.contains("profile `bad`: input `x` axis 2 is fixed to 64 in the model, but min gives 32"),
        "{e}"
    );
    let e = err(&["key", m, "--profile", "nope"]);
    assert!(
        e.contains("profile `nope` is not defined") && e.contains("bad, same_as_small, small"),
        "{e}"
    );
    let e = err(&["key", m, "--opt-shapes", "y:1x2x64"]);
    assert!(
        e.contains("input `y` is not an input of the model (inputs: x)"),
        "{e}"
    );
    let e = err(&["key", m, "--opt-shapes", "x:1x2"]);
    assert!(
        e.contains("input `x` opt shape [1, 2] has rank 2, the model's input has rank 3"),
        "{e}"
    );
    let e = err(&[
        "key",
        m,
        "--min-shapes",
        "x:4x1x64",
        "--opt-shapes",
        "x:2x1x64",
        "--max-shapes",
        "x:8x1x64",
    ]);
    assert!(e.contains("input `x` axis 0: min 4 > opt 2"), "{e}");
    let e = err(&[
        "key",
        m,
        "--min-shapes",
        "x:1x1x64",
        "--opt-shapes",
        "x:2x1x64",
    ]);
    assert!(
        e.contains("--min-shapes is given without --max-shapes"),
        "{e}"
    );
    let e = err(&["key", m, "--max-shapes", "x:2x1x64"]);
    assert!(
        e.contains("--max-shapes is given without --opt-shapes"),
        "{e}"
    );
    let e = err(&["key", m, "--opt-shapes", "x:2xbx64"]);
    assert!(e.contains("`b` in `x:2xbx64` is not an integer"), "{e}");
    std::fs::write(d.path().join("enc.trtcache.toml"), "precision = \"int3\"\n").unwrap();
    let e = err(&["key", m]);
    assert!(e.contains("enc.trtcache.toml") && e.contains("int3"), "{e}");
}

fn memo_run(model: &Path, cache: &Path) -> Value {
    ok_json(
        &[
            "key",
            model.to_str().unwrap(),
            "--json",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &[("TRTCACHE_DIGEST_RACY_MS", Path::new("0"))],
    )
}

#[test]
fn digest_memo_hits_and_misses() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let p = d.path().join("m.onnx");
    write_external(&base(), &p, "m.onnx.data", 128).unwrap();
    let first = memo_run(&p, &cache);
    assert_eq!(first["digest"]["memo_hits"], 0);
    assert_eq!(first["digest"]["files"], 2);
    assert!(cache.join("digests.json").is_file());
    let second = memo_run(&p, &cache);
    assert_eq!(second["digest"]["memo_hits"], 2);
    assert_eq!(second["digest"]["hashed_bytes"], 0);
    assert_eq!(second["key"], first["key"]);

    // Same size, new content, mtime put back: ctime still changed, so it is re-hashed.
    let data = d.path().join("m.onnx.data");
    let old_mtime = std::fs::metadata(&data).unwrap().modified().unwrap();
    let mut b = std::fs::read(&data).unwrap();
    b[100] ^= 1;
    std::fs::write(&data, &b).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&data)
        .unwrap()
        .set_modified(old_mtime)
        .unwrap();
    let third = memo_run(&p, &cache);
    assert_eq!(third["digest"]["memo_hits"], 1, "{third}");
    assert_ne!(third["key"], first["key"]);
    assert_eq!(
        third["digest"]["hashed_bytes"].as_u64().unwrap(),
        b.len() as u64
    );
    // The memo's answer equals a fresh hash.
    let fresh = key(&p, &[]);
    assert_eq!(memo_run(&p, &cache)["key"].as_str().unwrap(), fresh);

    // An unwritable memo is reported, and the key is still right.
    let blocker = d.path().join("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let v = memo_run(&p, &blocker.join("sub"));
    assert_eq!(v["key"].as_str().unwrap(), fresh);
    assert!(
        v["digest"]["memo_error"]
            .as_str()
            .unwrap()
            .contains("a-file"),
        "{v}"
    );

    // --no-memo neither reads nor writes it.
    let other = d.path().join("nocache");
    let v = ok_json(
        &[
            "key",
            p.to_str().unwrap(),
            "--json",
            "--no-memo",
            "--cache-dir",
            other.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(v["digest"]["memo_hits"], 0);
    assert!(!other.exists());
}

#[test]
fn plain_sha256_matches_sha256sum() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.onnx");
    write_external(&base(), &p, "m.onnx.data", 128).unwrap();
    let v = ok_json(
        &[
            "key",
            p.to_str().unwrap(),
            "--json",
            "--no-memo",
            "--sha256",
        ],
        &[],
    );
    let sum = |f: &Path| {
        let out = Command::new("sha256sum").arg(f).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(v["plain_sha256"]["sha256"], sum(&p));
    assert_eq!(
        v["plain_sha256"]["external"][0]["sha256"],
        sum(&d.path().join("m.onnx.data"))
    );
    // The key's digest is the tree digest, which differs from sha256sum by definition.
    assert_ne!(v["parts"]["model"]["sha256"], sum(&p));
}

#[test]
fn sku_without_gpu_is_the_cpu_and_says_why() {
    let v = ok_json(&["sku", "--json"], &[]);
    let gpus = v["gpus"].as_array().unwrap();
    if gpus.is_empty() {
        assert_eq!(v["sku"]["kind"], "cpu");
        let why = v["gpu_unavailable"].as_str().unwrap();
        let has_lib = [
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib64/libcuda.so.1",
        ]
        .iter()
        .any(|p| Path::new(p).exists());
        if !has_lib {
            assert!(why.contains("libcuda"), "{why}");
        }
        // The ISA flags are the kernel-relevant ones of /proc/cpuinfo.
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags: Vec<&str> = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags") || l.starts_with("Features"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, f)| f.split_whitespace().collect())
            .unwrap_or_default();
        let isa: Vec<String> = serde_json::from_value(v["sku"]["isa"].clone()).unwrap();
        for f in &isa {
            assert!(flags.contains(&f.as_str()), "{f} not in cpuinfo");
        }
        if flags.contains(&"avx2") {
            assert!(isa.contains(&"avx2".to_string()));
        }
        assert!(!isa.iter().any(|f| f == "aes" || f == "fpu"));
        // A GPU backend cannot be keyed here, and says why.
        let model = tempfile::tempdir().unwrap();
        let p = write_model(model.path(), "m.onnx", &base());
        let e = err(&["key", p.to_str().unwrap(), "--backend", "ort-tensorrt"]);
        assert!(
            e.contains("ort-tensorrt builds for an NVIDIA GPU") && e.contains(why),
            "{e}"
        );
        // The sidecar's first backend is the default; --backend overrides it.
        std::fs::write(
            model.path().join("m.trtcache.toml"),
            "backends = [\"ort-tensorrt\", \"ort-cpu\"]\n",
        )
        .unwrap();
        let e = err(&["key", p.to_str().unwrap()]);
        assert!(e.contains("ort-tensorrt builds for an NVIDIA GPU"), "{e}");
        let v = ok_json(
            &[
                "key",
                p.to_str().unwrap(),
                "--backend",
                "ort-cpu",
                "--json",
                "--no-memo",
            ],
            &[],
        );
        assert_eq!(v["parts"]["backend"]["name"], "ort-cpu");
    } else {
        assert_eq!(v["sku"]["kind"], "gpu");
        assert!(v["sku"]["compute_capability"].is_string());
    }
    let human = run(&["sku"], &[]);
    assert!(human.status.success());
    assert!(String::from_utf8_lossy(&human.stdout).contains("sku (used for keys)"));
}

#[test]
fn human_output_lists_the_parts() {
    let d = tempfile::tempdir().unwrap();
    let p = write_model(d.path(), "m.onnx", &base());
    let out = run(&["key", p.to_str().unwrap(), "--no-memo", "-o", "k=v"], &[]);
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for want in [
        "key ",
        "digest",
        "opsets",
        "ai.onnx=17",
        "sku",
        "backend",
        "ort-cpu (onnxruntime",
        "precision",
        "fp32",
        "k=v",
    ] {
        assert!(s.contains(want), "missing `{want}` in:\n{s}");
    }
}

/// The options each backend puts into a key, pinned as literal strings: a restructuring of the
/// build stage that changed one of them would rebuild every user's cache (GPU backends
/// included, whose keys cannot be computed through the binary on a host without a GPU).
#[test]
fn key_options_are_pinned_for_every_backend() {
    use trtcache::builder::{BuildOptions, OptLevel};
    use trtcache::spec::{Backend, Precision};
    let base = BuildOptions {
        device_id: 0,
        ..BuildOptions::default()
    };
    let variants: Vec<(&str, BuildOptions)> = vec![
        ("default", base.clone()),
        (
            "variant",
            BuildOptions {
                precision: Precision::Fp16,
                opt_level: OptLevel::Basic,
                ort_cpu: trtcache::builder::OrtCpuOptions {
                    prepack: false,
                    specialize: false,
                    rewrite: false,
                    external_min_bytes: 1024,
                },
                trt: trtcache::builder::TrtOptions {
                    builder_level: 5,
                    hardware_compat: trtcache::trt::HwCompat::SameComputeCapability,
                    workspace_bytes: Some(1 << 30),
                },
                device_id: 1,
                extra: [("label".to_string(), "x".to_string())].into(),
                ..base.clone()
            },
        ),
    ];
    let mut got = String::new();
    for (name, o) in &variants {
        for b in [
            Backend::OrtCpu,
            Backend::OrtCuda,
            Backend::OrtTensorRt,
            Backend::Trt,
        ] {
            got += &format!("{name} {b}: {:?}\n", o.key_options(b));
        }
    }
    let want = PINNED_KEY_OPTIONS;
    assert_eq!(got, want, "key options changed:\n{got}");
}

/// What d3cc3ba put into keys (see `key_options_are_pinned_for_every_backend`).
const PINNED_KEY_OPTIONS: &str = r#"default ort-cpu: {"external_min_bytes": "65536", "opt_level": "all", "prepack": "true", "rewrites": "static-if,stft-as-conv,hardswish,gelu,conv-affine,affine-conv,conv-integer-depthwise-float,conv-integer-uint8,dequantize-constants", "specialize": "true"}
default ort-cuda: {"device_id": "0", "opt_level": "extended", "use_tf32": "false"}
default ort-tensorrt: {"device_id": "0", "trt_builder_optimization_level": "3", "trt_ep_context_embed_mode": "1"}
default trt: {"device_id": "0", "trt.builder_optimization_level": "3", "trt.hardware_compatibility": "none", "trt.precision": "fp32,no-tf32", "trt.workspace_bytes": "default"}
variant ort-cpu: {"external_min_bytes": "1024", "label": "x", "opt_level": "basic", "prepack": "false", "rewrites": "none", "specialize": "false"}
variant ort-cuda: {"device_id": "1", "label": "x", "opt_level": "basic", "use_tf32": "true"}
variant ort-tensorrt: {"device_id": "1", "label": "x", "trt_builder_optimization_level": "5", "trt_ep_context_embed_mode": "1"}
variant trt: {"device_id": "1", "label": "x", "trt.builder_optimization_level": "5", "trt.hardware_compatibility": "same-compute-capability", "trt.precision": "fp16", "trt.workspace_bytes": "1073741824"}
"#;
