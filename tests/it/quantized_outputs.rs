//! Validation of dynamically quantized models at their resolution (issue 41): a float output
//! computed from activations quantized to 8 bits at run time (`DynamicQuantizeLinear`, as
//! `quantize_dynamic` writes) is compared in int8 steps of its range, so ONNX Runtime's
//! reordered sums (a step or a few, cascading through the layers) are served, while an
//! artifact off by a dropped bias or a wrong scale is still refused; other models keep their
//! rule and their keys.

use trtcache::cache::Status;
use trtcache::fixtures::{models, write};
use trtcache::onnx::proto::{ModelProto, TensorProto};

use crate::support::{json, trtcache};

/// `conv_integer` (DynamicQuantizeLinear → ConvInteger → Cast → Mul, with its int32 bias
/// when `bias`) with its output multiplied by `factor`: what an optimizer that got a scale
/// wrong would write.
fn conv_integer_times(bias: bool, factor: Option<f32>) -> ModelProto {
    let mut m = models::conv_integer(bias, false);
    if let Some(f) = factor {
        let g = m.graph.as_mut().unwrap();
        let last = g.node.iter_mut().find(|n| n.output[0] == "y").unwrap();
        last.output[0] = "y0".into();
        g.initializer.push(TensorProto {
            name: "factor".into(),
            dims: vec![],
            data_type: trtcache::onnx::ElemType::Float32.code(),
            float_data: vec![f],
            ..Default::default()
        });
        g.node.push(trtcache::onnx::proto::NodeProto {
            op_type: "Mul".into(),
            input: vec!["y0".into(), "factor".into()],
            output: vec!["y".into()],
            ..Default::default()
        });
    }
    m
}

/// Builds `conv_integer` (with its bias) with the library, its artifact swapped for
/// `artifact`, and returns the record.
fn with_artifact(artifact: ModelProto) -> trtcache::cache::Record {
    crate::support::build_with_artifact(&models::conv_integer(true, false), artifact)
}

#[test]
fn a_dynamically_quantized_artifact_a_step_off_passes_and_a_wrong_one_does_not() {
    // Off by half a percent of every value (under a step at the output's largest values):
    // served, in int8 steps.
    let r = with_artifact(conv_integer_times(true, Some(1.005)));
    assert_eq!(r.status, Status::Ready, "{:?}", r.validation);
    let y = &r.validation.as_ref().unwrap().outputs[0];
    assert!(y.max_abs > 1e-4, "the artifact was not off: {y:?}");
    assert!(y.rule.as_deref().unwrap().contains("int8 steps"), "{y:?}");
    let steps = y.max_ulps.unwrap();
    assert!(steps > 0.1 && steps < 8.0, "{y:?}");
    // A dropped bias (a wrong fusion): refused at every level, far beyond the steps.
    let r = with_artifact(conv_integer_times(false, None));
    let Status::Failed { reason } = &r.status else {
        panic!("served an artifact without its bias: {:?}", r.validation)
    };
    assert!(reason.contains("int8 steps"), "{reason}");
    assert!(r.validation.as_ref().unwrap().outputs[0].max_ulps.unwrap() > 8.0);
    // A scale 20 % off: refused.
    let r = with_artifact(conv_integer_times(true, Some(1.2)));
    assert!(
        matches!(r.status, Status::Failed { .. }),
        "served an artifact 20 % off: {:?}",
        r.validation
    );
}

#[test]
fn only_dynamically_quantized_models_key_the_int8_rule_and_the_cli_serves_them() {
    let d = tempfile::tempdir().unwrap();
    let q = d.path().join("q.onnx");
    write(&models::conv_integer(true, false), &q).unwrap();
    let qdq = d.path().join("qdq.onnx");
    write(&models::qdq_conv(), &qdq).unwrap();
    let cache = d.path().join("cache");
    assert_eq!(
        crate::support::key_options(&q, &cache)["validation"],
        "int8-dynamic-steps-v1"
    );
    // Static QDQ (activations float, weights dequantized) keeps fp32's rule and its key.
    assert!(crate::support::key_options(&qdq, &cache)
        .get("validation")
        .is_none());
    let out = trtcache([
        "build",
        q.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["state"], "ready", "{v}");
    let y = &v["record"]["validation"]["outputs"][0];
    assert!(y["rule"].as_str().unwrap().contains("int8 steps"), "{y}");
}
