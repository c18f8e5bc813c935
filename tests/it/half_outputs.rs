//! Validation of float16 outputs at their own resolution (issue 41, section 1): a model whose
//! outputs are float16 is compared in float16 steps at the output's scale, so ONNX Runtime's
//! fusions (one or two steps) are served, while an artifact off by far more (a dropped bias,
//! a wrong scale) is still refused; float32 outputs and the keys of models without float16
//! outputs are as before.

use std::path::Path;

use serde_json::Value;
use trtcache::cache::Status;
use trtcache::fixtures::{models, write};

use crate::support::{json, trtcache};

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

#[test]
fn float16_outputs_onnx_runtime_moves_by_a_step_are_served_on_the_cli() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("half.onnx");
    write(&models::half_layer_norm(true, None), &m).unwrap();
    // Held to fp32's allclose alone (no steps), every optimizing level is refused: the fused
    // LayerNorm moves float16 outputs by a step (the failure users saw). Only the model's own
    // graph (level disabled, the last rung) passes: served unoptimized.
    let (v, out) = build_json(&m, &d.path().join("strict"), &["--ulps", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let val = &v["record"]["validation"];
    assert_eq!(val["opt_level"], "disabled", "{v}");
    let rejected = val["rejected"].to_string();
    assert!(
        ["all:", "extended:", "basic:"]
            .iter()
            .all(|l| rejected.contains(l))
            && rejected.contains("float16 steps"),
        "{rejected}"
    );
    // The default rule serves it at the level asked for, and says what it measured.
    let (v, out) = build_json(&m, &d.path().join("cache"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(v["state"], "ready", "{v}");
    let val = &v["record"]["validation"];
    assert!(
        val.get("opt_level").is_none(),
        "built lower than asked: {val}"
    );
    let y = &val["outputs"][0];
    assert_eq!(y["dtype"], "float16", "{y}");
    assert!(
        y["rule"].as_str().unwrap().contains("8 float16 steps"),
        "{y}"
    );
    let steps = y["max_ulps"].as_f64().unwrap();
    assert!(
        (1.0..=8.0).contains(&steps),
        "ONNX Runtime's fusion moved the outputs by {steps} float16 steps: {y}"
    );
    // The rule is in the key of a model with float16 outputs, and nowhere else.
    let opts = crate::support::key_options(&m, &d.path().join("cache"));
    assert_eq!(opts["validation"], "half-ulps-v1", "{opts}");
    let fp32 = d.path().join("fp32.onnx");
    write(&models::tiny_encoder(false), &fp32).unwrap();
    let opts = crate::support::key_options(&fp32, &d.path().join("cache"));
    assert!(opts.get("validation").is_none(), "{opts}");
    let (v, out) = build_json(&fp32, &d.path().join("cache"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let y = &v["record"]["validation"]["outputs"][0];
    assert_eq!(y["dtype"], "float32", "{y}");
    assert_eq!(y["rule"], "atol + rtol·|ref|", "{y}");
}

/// Builds `half_layer_norm` with the library, its artifact swapped for `artifact` (as a
/// broken optimizer would leave it), and returns the record's state and validation.
fn with_artifact(artifact: trtcache::onnx::proto::ModelProto) -> trtcache::cache::Record {
    crate::support::build_with_artifact(&models::half_layer_norm(true, None), artifact)
}

#[test]
fn a_float16_artifact_one_step_off_passes_and_one_off_by_more_does_not() {
    // One step: every output rounded once more after a float32 multiply by 1 + 2^-11.
    let r = with_artifact(models::half_layer_norm(true, Some(1.0 + 2f32.powi(-11))));
    assert_eq!(r.status, Status::Ready, "{:?}", r.validation);
    let v = r.validation.as_ref().unwrap();
    let y = &v.outputs[0];
    assert!(
        y.max_ulps.unwrap() >= 1.0,
        "the artifact was not off: {y:?}"
    );
    assert!(y.max_abs > 1e-4, "{y:?}");
    // A dropped bias (a wrong fusion): refused at every level.
    let r = with_artifact(models::half_layer_norm(false, None));
    let Status::Failed { reason } = &r.status else {
        panic!("served an artifact without its bias: {:?}", r.validation)
    };
    assert!(reason.contains("float16 steps"), "{reason}");
    let y = &r.validation.as_ref().unwrap().outputs[0];
    assert!(y.max_ulps.unwrap() > 100.0, "{y:?}");
    // Off by 1/64 of every value (about 16 steps): refused too.
    let r = with_artifact(models::half_layer_norm(true, Some(1.0 + 2f32.powi(-6))));
    assert!(
        matches!(r.status, Status::Failed { .. }),
        "served an artifact 16 steps off: {:?}",
        r.validation
    );
    let y = &r.validation.as_ref().unwrap().outputs[0];
    assert!(y.max_ulps.unwrap() > 8.0, "{y:?}");
}

/// ONNX Runtime's own float16 converter, with `keep_io_types=False` (as Whisper encoders and
/// UNets were converted: float16 outputs) and `True` (float32 outputs cast from float16):
/// either output moves by float16 steps under ONNX Runtime's optimizations at a realistic
/// size, which fp32's allclose refused at every level.
#[test]
fn a_bert_converted_to_float16_by_onnx_runtime_is_served_with_either_io() {
    let d = tempfile::tempdir().unwrap();
    let fp32 = d.path().join("bert.onnx");
    write(
        &trtcache::fixtures::bert::bert(trtcache::fixtures::bert::BertConfig::tiny()),
        &fp32,
    )
    .unwrap();
    for (keep, dtype) in [("False", "float16"), ("True", "float32")] {
        let m = d.path().join(format!("bert16_{keep}.onnx"));
        crate::support::run_python(
            &format!(
                "import sys, onnx\n\
                 from onnxruntime.transformers.float16 import convert_float_to_float16\n\
                 onnx.save(convert_float_to_float16(onnx.load(sys.argv[1]), keep_io_types={keep}), sys.argv[2])"
            ),
            &[&fp32, &m],
        );
        let shapes = ["--opt-shapes", "input_ids:2x64,attention_mask:2x64"];
        let strict = d.path().join(format!("strict_{keep}"));
        let (v, out) = build_json(&m, &strict, &[&shapes[..], &["--ulps", "0"]].concat());
        // Without the steps only the unoptimized graph passes.
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            v["record"]["validation"]["opt_level"], "disabled",
            "keep_io_types={keep}: {v}"
        );
        let cache = d.path().join(format!("cache_{keep}"));
        let (v, out) = build_json(&m, &cache, &shapes);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(v["state"], "ready", "keep_io_types={keep}: {v}");
        let y = &v["record"]["validation"]["outputs"][0];
        assert_eq!(y["dtype"], dtype, "{y}");
        assert!(y["rule"].as_str().unwrap().contains("float16 steps"), "{y}");
        assert!(y["max_ulps"].as_f64().unwrap() >= 1.0, "{y}");
        assert_eq!(
            crate::support::key_options(&m, &cache)["validation"],
            "half-ulps-v1"
        );
    }
}
