//! Models users bring (issue 14): the failure classes as small models with the structure of
//! the real ones (`scripts/corpus/classes.py`), and a fast slice of the ONNX backend
//! conformance suite (`scripts/corpus/node_tests.py`), each run through the real binary by
//! `scripts/corpus/run.py`: ONNX Runtime runs the model, `build --backend ort-cpu` validates,
//! the artifact reproduces ORT's outputs on the golden feed. The full corpora are made by
//! the same scripts outside the repository (RELIABILITY.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{bin, json, ort_dylib, python, trtcache};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script(name: &str) -> PathBuf {
    repo().join("scripts/corpus").join(name)
}

/// Runs the corpus runner `name` (`run.py`, `daemon.py`) on `corpus` with this build's
/// binary; returns (success, stdout and stderr).
fn run_runner(name: &str, corpus: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(python())
        .arg(script(name))
        .arg(corpus)
        .arg("--trtcache")
        .arg(bin())
        .args(extra)
        .env("ORT_DYLIB_PATH", ort_dylib())
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs `scripts/corpus/run.py` on `corpus`; returns (success, stdout and stderr).
fn run_corpus(corpus: &Path, extra: &[&str]) -> (bool, String) {
    run_runner("run.py", corpus, extra)
}

fn write_classes(dir: &Path) {
    let out = Command::new(python())
        .arg(script("classes.py"))
        .arg(dir)
        .output()
        .expect("running classes.py");
    assert!(
        out.status.success(),
        "classes.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every class model builds with the default validation inputs (no sidecar, no golden
/// file), and its artifact reproduces ONNX Runtime's outputs on a realistic feed: strided
/// vision, reflect padding, a KV cache mask, unnamed shared batch axes, float16 I/O, int16
/// and uint64, strings, ZipMap's seq(map), sequences, IR 3 initializers listed as inputs
/// (whose artifact must take only `x`, as the original does), a dynamically quantized
/// layer, madmom's free axes: features only an LSTM's weights size (37), and a time axis
/// at position 0 that a Conv kernel needs 5 of, one-hot encoders that refuse any category
/// they do not list (the inputs get the graph's own categories), a DictVectorizer's map
/// input (keys from its vocabulary), and a sequence length torch's legacy exporter kept in a
/// Reshape (found among the sizes the graph's shapes record).
#[test]
fn failure_classes_build_with_the_defaults_and_reproduce_ort() {
    let tmp = tempfile::tempdir().unwrap();
    write_classes(tmp.path());
    let (ok, text) = run_corpus(tmp.path(), &["--defaults", "--no-export"]);
    assert!(ok, "{text}");
    assert!(text.contains("pass rate: 17/17"), "{text}");
}

/// Their exported partitions (`inspect --export-subgraphs`) run in order and reproduce the
/// outputs too: ZipMap's seq(map) and the sequence output are typed, the IR 3 model's
/// partitions carry its weights and take only `x`, and the outputs of ops no rule knows
/// (DynamicQuantizeLinear, MatMulInteger, ConvInteger, a com.microsoft contrib op) get the
/// element types their schemas fix.
#[test]
fn failure_classes_export_partitions_that_reproduce_ort() {
    let tmp = tempfile::tempdir().unwrap();
    write_classes(tmp.path());
    let (ok, text) = run_corpus(tmp.path(), &["--export-only"]);
    assert!(ok, "{text}");
    assert!(text.contains("pass rate: 17/17"), "{text}");
}

/// The same models validate on their golden feeds, written with `np.savez_compressed`
/// (float16, int16, uint64, unicode and object arrays of strings read from a deflated
/// archive).
#[test]
fn golden_feeds_of_every_dtype_from_compressed_npz() {
    let tmp = tempfile::tempdir().unwrap();
    write_classes(tmp.path());
    let (ok, text) = run_corpus(tmp.path(), &["--no-export"]);
    assert!(ok, "{text}");
    assert!(text.contains("pass rate: 17/17"), "{text}");
}

/// `trtcache build --backend ort-cpu` of `model` into `cache`, which must fail: its stderr.
fn build_fails(model: &Path, cache: &Path) -> String {
    let out = trtcache([
        "build".as_ref(),
        "--backend".as_ref(),
        "ort-cpu".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
        model.as_os_str(),
    ]);
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A model ONNX Runtime cannot create on this machine (a StringNormalizer whose locale is not
/// installed) fails with what to install and how to build it again, ORT's message after it,
/// tidied of the C++ location and signature.
#[test]
fn a_missing_locale_is_an_actionable_error() {
    let tmp = tempfile::tempdir().unwrap();
    write_classes(tmp.path());
    let model = tmp.path().join("_impossible/missing_locale.onnx");
    let cache = tmp.path().join("cache");
    let err = build_fails(&model, &cache);
    for want in [
        "StringNormalizer needs the locale `xx_XX.UTF-8`",
        "locale-gen xx_XX.UTF-8",
        "trtcache rm",
        "(ONNX Runtime: ",
    ] {
        assert!(err.contains(want), "missing `{want}` in: {err}");
    }
    assert!(!err.contains("onnxruntime_src"), "{err}");
}

/// A model none of the default shapes fits: the error names the input and axis, keeps ONNX
/// Runtime's message and says what to add; with the profile it asks for, it builds.
#[test]
fn no_default_inputs_is_an_actionable_error() {
    let tmp = tempfile::tempdir().unwrap();
    write_classes(tmp.path());
    let model = tmp.path().join("_impossible/impossible.onnx");
    let cache = tmp.path().join("cache");
    let err = build_fails(&model, &cache);
    for want in [
        "no default validation inputs",
        "`x` axis 0 `n`",
        "Reshape",
        "--opt-shapes x:N",
        "impossible.trtcache.toml",
        "--golden",
    ] {
        assert!(err.contains(want), "missing `{want}` in: {err}");
    }
    let out = trtcache([
        "build".as_ref(),
        "--backend".as_ref(),
        "ort-cpu".as_ref(),
        "--json".as_ref(),
        "--opt-shapes".as_ref(),
        "x:7".as_ref(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
        model.as_os_str(),
    ]);
    let j = json(&out);
    assert_eq!(j["servable"], true, "{j}");
    assert_eq!(
        j["record"]["validation"]["shapes"]["x"],
        serde_json::json!([7])
    );
}

/// The onnx 1.22 wheel (the last with `onnx/backend/test/data`): `TRTCACHE_ONNX_WHEEL`, else
/// one `.ci/run` downloaded into `target/corpus/`.
fn onnx_wheel() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TRTCACHE_ONNX_WHEEL") {
        return Some(PathBuf::from(p));
    }
    let dir = repo().join("target/corpus");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("onnx-1.22") && n.ends_with(".whl"))
        })
}

/// A fast slice of the conformance suite: float16, bfloat16, int16/uint64, strings,
/// sequences, optionals, ordinary ops, IR 3 `pytorch-converted` and `light` models (weights
/// made by ConstantOfShape from initializers listed as inputs). Build, artifact and exported
/// partitions must reproduce the suite's expected outputs for all, and no partition output
/// may declare a shape ORT contradicts. The export cases issue 14 fixed: IR 3 partitions
/// carry their weights (Conv2d, light_squeezenet), Dropout's mask has the data's type before
/// opset 10 (light_squeezenet), sequences and optionals are typed (sequence_insert_at_back,
/// optional_has_element_tensor_input, identity_opt), and so are If and Loop outputs from
/// their bodies (if_seq, loop13_seq) and function-expanded ops (layer_normalization
/// `_expanded_ver18`). And one build case: loop16_seq_none, a Loop whose If branches both
/// define `constant_in`, which ONNX Runtime refuses to reload once saved with external
/// initializers (the build saves it inline instead).
#[test]
fn node_suite_slice_builds_and_reproduces_expected_outputs() {
    let Some(wheel) = onnx_wheel() else {
        eprintln!(
            "SKIPPED: no onnx 1.22 wheel (the backend test data left the wheel in 1.23): \
             `python -m pip download --no-deps 'onnx==1.22.*' -d target/corpus` or set TRTCACHE_ONNX_WHEEL"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let only =
        "node__test_(abs|castlike_FLOAT16_to_FLOAT|cast_BFLOAT16_to_FLOAT|add_int16|add_uint64|\
                regex_full_match_basic|ai_onnx_ml_label_encoder_string_int|sequence_insert_at_back|\
                optional_has_element_tensor_input|conv_with_strides_padding|string_concat|\
                identity_opt|if_seq|loop13_seq|loop16_seq_none|layer_normalization_2d_axis0_expanded_ver18)$|\
                pytorch-converted__test_(Conv2d|PixelShuffle)$|light__light_squeezenet$";
    let out = Command::new(python())
        .arg(script("node_tests.py"))
        .arg(tmp.path())
        .arg("--wheel")
        .arg(&wheel)
        .arg("--only")
        .arg(only)
        .output()
        .expect("running node_tests.py");
    assert!(
        out.status.success(),
        "node_tests.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wrote = std::fs::read_dir(tmp.path()).unwrap().count();
    assert!(
        wrote >= 17,
        "only {wrote} tests extracted from {}",
        wheel.display()
    );
    let (ok, text) = run_corpus(tmp.path(), &[]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("pass rate: {wrote}/{wrote}")),
        "{text}"
    );
    assert!(text.contains("wrongly inferred output shapes: 0"), "{text}");
}

/// The real-world slice's archives: `TRTCACHE_REALWORLD_WHEELS`, else the folder `.ci/run`
/// downloads them into (`target/corpus/wheels/`), when it holds them.
fn realworld_wheels() -> Option<PathBuf> {
    let dir = std::env::var_os("TRTCACHE_REALWORLD_WHEELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/corpus/wheels"));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let has = |prefix: &str| names.iter().any(|n| n.starts_with(prefix));
    (has("text2tashkeel-0.1.0") && has("caustic_nmr-0.4.1")).then_some(dir)
}

/// A slice of the real-world corpus (`scripts/corpus/realworld.py`), models shipped in PyPI
/// wheels that nobody here wrote, served through the daemon with the defaults (no sidecar,
/// no golden file) and compared with ONNX Runtime's outputs on the packages' kind of feed:
/// text2tashkeel's int8 BiLSTM and its gated ensemble (com.microsoft DynamicQuantizeLSTM
/// and MatMulInteger, an opset imported twice, an int64 output) and caustic-nmr's PaiNN
/// graph network (19 inputs over three free dimensions: index inputs, a bool mask).
#[test]
fn realworld_slice_is_served_with_the_defaults_and_matches_ort() {
    let Some(wheels) = realworld_wheels() else {
        eprintln!(
            "SKIPPED: no real-world slice archives: `python -m pip download --no-deps \
             text2tashkeel==0.1.0 caustic-nmr==0.4.1 -d target/corpus/wheels` (.ci/run does) \
             or set TRTCACHE_REALWORLD_WHEELS"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus");
    let out = Command::new(python())
        .arg(script("realworld.py"))
        .arg(&corpus)
        .args(["--skip-exporters", "--wheels"])
        .arg(&wheels)
        .args([
            "--only",
            "^(t2t_bilstm_int8|t2t_rawi_ensemble_int8|caustic_painn)$",
        ])
        .output()
        .expect("running realworld.py");
    let made = std::fs::read_dir(&corpus)
        .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0);
    assert!(
        out.status.success() && made == 3,
        "realworld.py made {made} of 3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, text) = run_runner("daemon.py", &corpus, &[]);
    assert!(ok, "{text}");
    assert!(text.contains("matching ONNX Runtime"), "{text}");
    assert!(text.contains(": 3/3 (100.0%)"), "{text}");
}
