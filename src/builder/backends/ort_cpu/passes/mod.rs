//! The graph passes of the `ort-cpu` build: an op that ONNX Runtime's CPU provider runs
//! slowly, replaced by the same computation in ops it runs well. Each pass is one file; the
//! one table [`PASSES`] gives their names, their order and their phase, and its names are the
//! key's `rewrites` option ([`key_list`]), so adding a pass rebuilds. The artifact is
//! validated like every other (against the model as given, see
//! [`stft_as_conv::exact_reference`] for the one refinement); one that does not pass is built
//! again without passes before a lower optimization level is tried (the backend's fallback
//! ladder), and `--no-rewrite` turns them off.
//!
//! Enters: a decoded [`ModelProto`] ([`Phase::Graph`] passes, before ONNX Runtime optimizes)
//! or the graph ONNX Runtime saved with its data file ([`Phase::Saved`]). Leaves: the
//! rewritten proto and one line per rewrite applied (the validation report lists them), or
//! `None` when nothing applies.

pub(crate) mod affine_conv;
pub(crate) mod conv_affine;
pub(crate) mod conv_integer_depthwise_float;
pub(crate) mod conv_integer_uint8;
pub(crate) mod dequantize_constants;
pub(crate) mod gelu;
pub(crate) mod graph;
pub(crate) mod hardswish;
pub(crate) mod static_if;
pub(crate) mod stft_as_conv;

use std::path::Path;

use crate::onnx::proto::ModelProto;

pub use stft_as_conv::{exact_reference, EXACT_REFERENCE, MAX_FFT_FRAME, MAX_STFT_FRAME};

/// When a pass runs, and on what.
#[derive(Clone, Copy)]
pub enum Phase {
    /// On the decoded model, before ONNX Runtime optimizes it: `None` when nothing applies,
    /// else the rewritten model (one line per rewrite pushed onto the list).
    Graph(fn(&ModelProto, &mut Vec<String>) -> Option<ModelProto>),
    /// On the graph ONNX Runtime saved (`dir/<entry>`, its data file `dir/<data>`, tensors of
    /// at least `min_external` bytes appended to it): the report's line, `None` when nothing
    /// applies. An error is the data file's.
    Saved(SavedPass),
}

/// One graph pass: its name (in the key and the report) and when it runs.
pub struct Pass {
    pub name: &'static str,
    pub phase: Phase,
}

/// Every pass, in the order they run (`static-if` first, so the others see the branches it
/// inlines). The names, in this order, are the key's `rewrites` option: a new row rebuilds.
pub const PASSES: &[Pass] = &[
    Pass {
        name: "static-if",
        phase: Phase::Graph(static_if::static_if),
    },
    Pass {
        name: "stft-as-conv",
        phase: Phase::Graph(stft_as_conv::stft_as_conv),
    },
    Pass {
        name: "hardswish",
        phase: Phase::Graph(hardswish::hardswish),
    },
    Pass {
        name: "gelu",
        phase: Phase::Graph(gelu::gelu),
    },
    Pass {
        name: "conv-affine",
        phase: Phase::Graph(conv_affine::conv_affine),
    },
    Pass {
        name: "affine-conv",
        phase: Phase::Graph(affine_conv::affine_conv),
    },
    Pass {
        name: "conv-integer-depthwise-float",
        phase: Phase::Graph(conv_integer_depthwise_float::depthwise_float),
    },
    Pass {
        name: "conv-integer-uint8",
        phase: Phase::Graph(conv_integer_uint8::conv_integer),
    },
    Pass {
        name: "dequantize-constants",
        phase: Phase::Saved(dequantize_constants::fold),
    },
];

/// The key's `rewrites` option when the passes are on: every pass's name, in order.
pub fn key_list() -> String {
    PASSES.iter().map(|p| p.name).collect::<Vec<_>>().join(",")
}

/// The passes that run on the graph ONNX Runtime saved, in order.
pub fn saved() -> impl Iterator<Item = (&'static str, SavedPass)> {
    PASSES.iter().filter_map(|p| match p.phase {
        Phase::Saved(f) => Some((p.name, f)),
        Phase::Graph(_) => None,
    })
}

/// A [`Phase::Saved`] pass.
pub type SavedPass = fn(&mut ModelProto, &Path, &str, usize) -> std::io::Result<Option<String>>;

/// A rewritten model and what was rewritten, one line each.
pub struct Rewritten {
    pub model: ModelProto,
    pub applied: Vec<String>,
}

/// The model with every [`Phase::Graph`] pass applied where it can be, in [`PASSES`]'s order
/// (each sees what the ones before it made); `None` when none applies.
pub fn apply(proto: &ModelProto) -> Option<Rewritten> {
    let mut applied = Vec::new();
    let mut model: Option<ModelProto> = None;
    for pass in PASSES {
        if let Phase::Graph(run) = pass.phase {
            if let Some(m) = run(model.as_ref().unwrap_or(proto), &mut applied) {
                model = Some(m);
            }
        }
    }
    let model = model?;
    tracing::info!(?applied, "rewrote the graph before optimizing it");
    Some(Rewritten { model, applied })
}
#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::graph::{float, inline_floats, node};
    use super::*;
    use crate::fixtures::{models, tensor_f32};
    use crate::onnx::proto::{AttributeProto, AttributeType, NodeProto};
    use crate::onnx::ElemType;

    fn ops(m: &ModelProto) -> Vec<&str> {
        m.graph
            .as_ref()
            .unwrap()
            .node
            .iter()
            .map(|n| n.op_type.as_str())
            .collect()
    }

    fn floats_of(m: &ModelProto, name: &str) -> (Vec<i64>, Vec<f32>) {
        let t = m
            .graph
            .as_ref()
            .unwrap()
            .initializer
            .iter()
            .find(|t| t.name == name)
            .unwrap();
        let v = t
            .raw_data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        (t.dims.clone(), v)
    }

    /// The key's list, written out: a change here rebuilds every user's `ort-cpu` cache, so
    /// it must be on purpose (a new pass, a new row).
    #[test]
    fn the_key_lists_every_pass_in_order() {
        assert_eq!(
            key_list(),
            "static-if,stft-as-conv,hardswish,gelu,conv-affine,affine-conv,conv-integer-depthwise-float,conv-integer-uint8,dequantize-constants"
        );
    }

    #[test]
    fn a_400_sample_stft_becomes_a_conv_with_the_windowed_dft_basis() {
        let m = models::stft(400, 4000);
        let r = apply(&m).expect("rewritten");
        assert_eq!(
            ops(&r.model),
            [
                "Reshape",
                "Conv",
                "Transpose",
                "Reshape",
                "Mul",
                "ReduceSum"
            ]
        );
        assert_eq!(r.applied.len(), 1);
        assert!(
            r.applied[0].contains("frame 400, step 160, 201 bins"),
            "{:?}",
            r.applied
        );
        let g = r.model.graph.as_ref().unwrap();
        // The last Reshape writes the STFT's own output, which the rest still reads.
        assert_eq!(g.node[3].output, ["spectrum"]);
        assert_eq!(
            crate::onnx::attr::ints(&g.node[2], "perm").unwrap(),
            [0, 2, 1]
        );
        let t = g
            .initializer
            .iter()
            .find(|t| t.name == g.node[3].input[1])
            .unwrap();
        assert_eq!(
            crate::analysis::facts::tensor_ints(t).unwrap(),
            [0, 0, 201, 2]
        );
        assert_eq!(
            crate::onnx::attr::ints(&g.node[1], "strides").unwrap(),
            [160]
        );
        assert_eq!(
            crate::onnx::attr::ints(&g.node[1], "kernel_shape").unwrap(),
            [400]
        );
        let (dims, w) = floats_of(&r.model, &g.node[1].input[1]);
        assert_eq!(dims, [402, 1, 400]);
        let (_, window) = floats_of(&m, "window");
        let at = |row: usize, t: usize| w[row * 400 + t];
        for t in [0, 1, 77, 200, 399] {
            // Bin 0: the window itself (cos 0) and no imaginary part.
            assert_eq!(at(0, t), window[t]);
            assert_eq!(at(1, t), 0.0);
            // Bin 3: its real part in row 6, its imaginary part in row 7.
            let angle = std::f64::consts::TAU * ((3 * t) % 400) as f64 / 400.0;
            assert!((f64::from(at(6, t)) - f64::from(window[t]) * angle.cos()).abs() < 1e-6);
            assert!((f64::from(at(7, t)) + f64::from(window[t]) * angle.sin()).abs() < 1e-6);
        }
    }

    #[test]
    fn stfts_it_cannot_take_or_need_not_are_left_alone() {
        // A power-of-two frame over 1,024: ONNX Runtime's FFT is faster.
        assert!(apply(&models::stft(2048, 4000)).is_none());
        // Up to 1,024 the Conv is.
        assert!(apply(&models::stft(1024, 4000)).is_some());
        // A window a caller can override (listed as an input too).
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.input.push(crate::fixtures::value_info(
            "window",
            ElemType::Float32,
            None,
        ));
        assert!(apply(&m).is_none());
        // A window computed at run time.
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.initializer.retain(|t| t.name != "window");
        g.node.insert(
            0,
            NodeProto {
                op_type: "HannWindow".into(),
                input: vec!["n".into()],
                output: vec!["window".into()],
                ..Default::default()
            },
        );
        g.initializer
            .push(crate::fixtures::tensor_i64("n", &[], &[400]));
        assert!(apply(&m).is_none());
        // A complex signal ([batch, length, 2]).
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.input[0] = crate::fixtures::value_info(
            "x",
            ElemType::Float32,
            Some(&[1.into(), 4000.into(), 2.into()]),
        );
        assert!(apply(&m).is_none());
        // A signal of unknown rank.
        let mut m = models::stft(400, 4000);
        m.graph.as_mut().unwrap().input[0] =
            crate::fixtures::value_info("x", ElemType::Float32, None);
        assert!(apply(&m).is_none());
        // A frame length that disagrees with the window.
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.initializer
            .push(crate::fixtures::tensor_i64("len", &[], &[320]));
        g.node[0].input.push("len".into());
        assert!(apply(&m).is_none());
        // A step that is not a positive constant.
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.initializer[0] = crate::fixtures::tensor_i64("step", &[], &[0]);
        assert!(apply(&m).is_none());
    }

    #[test]
    fn a_rank_3_real_signal_and_a_frame_length_without_window_are_taken() {
        // [batch, length, 1], frame length 300 and no window: a rectangular one.
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.input[0] = crate::fixtures::value_info(
            "x",
            ElemType::Float32,
            Some(&[1.into(), 4000.into(), 1.into()]),
        );
        g.initializer
            .push(crate::fixtures::tensor_i64("len", &[], &[300]));
        g.node[0].input = vec!["x".into(), "step".into(), String::new(), "len".into()];
        let r = apply(&m).expect("rewritten");
        let g = r.model.graph.as_ref().unwrap();
        let (dims, w) = floats_of(&r.model, &g.node[1].input[1]);
        assert_eq!(dims, [302, 1, 300]);
        // Bin 0's real part: the rectangular window.
        assert!(w[..300].iter().all(|&v| v == 1.0));
    }

    #[test]
    fn new_names_never_reuse_the_graphs() {
        let mut m = models::stft(400, 4000);
        let g = m.graph.as_mut().unwrap();
        g.initializer
            .push(tensor_f32("spectrum__trtcache0_basis", &[1], &[0.0]));
        let r = apply(&m).expect("rewritten");
        let g = r.model.graph.as_ref().unwrap();
        assert_eq!(g.node[1].input[1], "spectrum__trtcache1_basis");
    }

    #[test]
    fn a_spelled_out_hard_swish_becomes_a_hard_sigmoid_gate() {
        for gate_first in [false, true] {
            let m = models::hard_swish(gate_first);
            let r = apply(&m).expect("rewritten");
            assert_eq!(
                ops(&r.model),
                ["HardSigmoid", "Mul", "Relu"],
                "{gate_first}"
            );
            let g = r.model.graph.as_ref().unwrap();
            assert_eq!(g.node[0].input, ["x"]);
            assert_eq!(g.node[1].input[0], "x");
            assert_eq!(g.node[1].input[1], g.node[0].output[0]);
            // The Mul writes what the Relu reads.
            assert_eq!(g.node[1].output, ["swished"]);
            let attr = |n: &str| crate::onnx::attr::get(&g.node[0], n).unwrap().f;
            assert_eq!((attr("alpha"), attr("beta")), (1.0 / 6.0, 0.5));
            assert_eq!(
                r.applied,
                ["hardswish: 1 x·clip(x+3, 0, 6)/6 as Mul(x, HardSigmoid(x))"]
            );
        }
    }

    /// A constant's values, from an initializer or a Constant node.
    fn values_of(m: &ModelProto, name: &str) -> Vec<f32> {
        let g = m.graph.as_ref().unwrap();
        let t = g
            .initializer
            .iter()
            .find(|t| t.name == name)
            .or_else(|| {
                g.node
                    .iter()
                    .find(|n| n.op_type == "Constant" && n.output[0] == name)
                    .and_then(|n| crate::onnx::attr::tensor(n, "value"))
            })
            .unwrap();
        inline_floats(t).unwrap()
    }

    #[test]
    fn a_scalar_affine_after_a_conv_is_folded_into_its_weights_and_bias() {
        for bias in [false, true] {
            for shift in [false, true] {
                for constant_nodes in [false, true] {
                    let case = format!("bias {bias}, shift {shift}, constants {constant_nodes}");
                    let m = models::conv_affine(bias, shift, constant_nodes);
                    let r = apply(&m).expect("rewritten");
                    let g = r.model.graph.as_ref().unwrap();
                    let live: Vec<&str> = ops(&r.model)
                        .into_iter()
                        .filter(|o| *o != "Constant")
                        .collect();
                    assert_eq!(live, ["Conv", "Relu"], "{case}");
                    let conv = g.node.iter().find(|n| n.op_type == "Conv").unwrap();
                    // The Conv writes what the Relu reads.
                    let last = if shift { "shifted" } else { "scaled" };
                    assert_eq!(conv.output, [last], "{case}");
                    let w0 = values_of(&m, "w");
                    let w1 = values_of(&r.model, &conv.input[1]);
                    assert!(w0.iter().zip(&w1).all(|(a, b)| a * 0.75 == *b), "{case}");
                    let s = if shift { -0.25 } else { 0.0 };
                    match (bias, shift) {
                        (true, _) => {
                            let b0 = values_of(&m, "b");
                            let b1 = values_of(&r.model, &conv.input[2]);
                            assert!(
                                b0.iter().zip(&b1).all(|(a, b)| a * 0.75 + s == *b),
                                "{case}"
                            );
                        }
                        (false, true) => {
                            assert_eq!(values_of(&r.model, &conv.input[2]), [-0.25; 8], "{case}")
                        }
                        (false, false) => assert_eq!(conv.input.len(), 2, "{case}"),
                    }
                    assert_eq!(
                        r.applied,
                        ["conv-affine: 1 scalar Mul/Add after a Conv folded into its weights and bias"],
                        "{case}"
                    );
                }
            }
        }
    }

    /// `models::conv_affine(false, true, false)` as paddle2onnx writes PP-LCNetV3's blocks:
    /// the Conv's bias as a separate `Add` of `bias` (dims `bias_dims`), and an Identity
    /// after the bias Add and after the Mul.
    fn paddle_affine(bias_dims: &[i64]) -> ModelProto {
        use crate::fixtures::tensor_f32;
        let mut m = models::conv_affine(false, true, false);
        let g = m.graph.as_mut().unwrap();
        let n: usize = bias_dims.iter().product::<i64>() as usize;
        let vals: Vec<f32> = (0..n).map(|k| k as f32 * 0.5 - 1.0).collect();
        g.initializer.push(tensor_f32("cb", bias_dims, &vals));
        let at = g.node.iter().position(|n| n.op_type == "Mul").unwrap();
        g.node[at].input = vec!["a".into(), "id1".into()];
        let add = g.node.iter().position(|n| n.op_type == "Add").unwrap();
        g.node[add].input[0] = "id2".into();
        let mk = |op: &str, i: &[&str], o: &str| node(op, i, o, vec![]);
        g.node.insert(at + 1, mk("Identity", &["scaled"], "id2"));
        g.node.insert(at, mk("Identity", &["biased"], "id1"));
        g.node.insert(at, mk("Add", &["c", "cb"], "biased"));
        m
    }

    #[test]
    fn a_bias_add_and_identities_between_a_conv_and_its_affine_are_folded_too() {
        for dims in [[1, 8, 1, 1].as_slice(), &[8, 1, 1]] {
            let m = paddle_affine(dims);
            let r = apply(&m).expect("rewritten");
            let live: Vec<&str> = ops(&r.model);
            assert_eq!(live, ["Conv", "Relu"], "{dims:?}");
            let g = r.model.graph.as_ref().unwrap();
            let conv = &g.node[0];
            assert_eq!(conv.output, ["shifted"]);
            let b = values_of(&r.model, &conv.input[2]);
            let want: Vec<f32> = (0..8)
                .map(|k| (k as f32 * 0.5 - 1.0) * 0.75 - 0.25)
                .collect();
            assert_eq!(b, want, "{dims:?}");
        }
        // A bias that is not one value per channel stays, and so does the affine after it.
        let r = apply(&paddle_affine(&[1, 8, 6, 1]));
        assert!(r.is_none(), "{:?}", r.map(|r| r.applied));
    }

    #[test]
    fn affine_lookalikes_are_left_alone() {
        let edit = |f: &dyn Fn(&mut crate::onnx::proto::GraphProto)| {
            let mut m = models::conv_affine(true, true, false);
            f(m.graph.as_mut().unwrap());
            m
        };
        let rename = |g: &mut crate::onnx::proto::GraphProto, old: &str, new: &str| {
            for t in g.initializer.iter_mut().filter(|t| t.name == old) {
                t.name = new.into();
            }
        };
        let cases = [
            // A per-channel scale (foldable, but not this rewrite's pattern).
            edit(&|g| {
                rename(g, "a", "a_old");
                g.initializer
                    .push(crate::fixtures::tensor_f32("a", &[8, 1, 1], &[0.5; 8]));
            }),
            // The Conv's output read by something else too.
            edit(&|g| {
                g.node.push(node("Relu", &["c"], "c2", vec![]));
                g.output
                    .push(crate::fixtures::value_info("c2", ElemType::Float32, None));
            }),
            // The weights overridable as a graph input.
            edit(&|g| {
                g.input
                    .push(crate::fixtures::value_info("w", ElemType::Float32, None))
            }),
            // The weights read by another node.
            edit(&|g| {
                g.node.push(node("Identity", &["w"], "w2", vec![]));
                g.output
                    .push(crate::fixtures::value_info("w2", ElemType::Float32, None));
            }),
            // A non-finite scale.
            edit(&|g| {
                rename(g, "a", "a_old");
                g.initializer
                    .push(crate::fixtures::tensor_f32("a", &[1], &[f32::INFINITY]));
            }),
            // A float64 scale.
            edit(&|g| {
                for t in g.initializer.iter_mut().filter(|t| t.name == "a") {
                    t.data_type = ElemType::Float64.code();
                    t.raw_data = Bytes::from(0.75f64.to_le_bytes().to_vec());
                }
            }),
        ];
        for (k, m) in cases.iter().enumerate() {
            let touched =
                apply(m).is_some_and(|r| r.applied.iter().any(|a| a.starts_with("conv-affine")));
            assert!(!touched, "case {k} was rewritten");
        }
        // Weights stored outside the file.
        let mut m = models::conv_affine(true, true, false);
        for t in m.graph.as_mut().unwrap().initializer.iter_mut() {
            if t.name == "w" {
                t.external_data
                    .push(crate::onnx::proto::StringStringEntryProto {
                        key: "location".into(),
                        value: "w.bin".into(),
                    });
            }
        }
        assert!(apply(&m).is_none());
    }

    #[test]
    fn hard_swish_lookalikes_are_left_alone() {
        // An intermediate value something else reads too.
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.output.push(crate::fixtures::value_info(
            "clipped",
            ElemType::Float32,
            None,
        ));
        assert!(apply(&m).is_none());
        // Another constant (relu6(x + 3) / 6.5 is not a hard-swish).
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.initializer
            .push(tensor_f32("six_and_a_half", &[], &[6.5]));
        g.node[3].input[1] = "six_and_a_half".into();
        assert!(apply(&m).is_none());
        // The Mul's other operand is not the Add's x.
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.input.push(crate::fixtures::value_info(
            "z",
            ElemType::Float32,
            Some(&[1.into(), 8.into(), 6.into(), 6.into()]),
        ));
        g.node[2].input[0] = "z".into();
        assert!(apply(&m).is_none());
        // A constant a caller can override (listed as an input too).
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.input.push(crate::fixtures::value_info(
            "three",
            ElemType::Float32,
            Some(&[]),
        ));
        assert!(apply(&m).is_none());
        // Not float32.
        let mut m = models::hard_swish(false);
        let g = m.graph.as_mut().unwrap();
        g.input[0] = crate::fixtures::value_info(
            "x",
            ElemType::Float64,
            Some(&[1.into(), 8.into(), 6.into(), 6.into()]),
        );
        assert!(apply(&m).is_none());
    }

    #[test]
    fn constant_nodes_and_opset_10_clip_attributes_are_read() {
        let mut m = models::hard_swish(false);
        m.opset_import[0].version = 10;
        let g = m.graph.as_mut().unwrap();
        g.initializer.retain(|t| t.name == "six");
        g.node[1].input.truncate(1);
        g.node[1].attribute = vec![float("min", 0.0), float("max", 6.0)];
        g.node.insert(
            0,
            NodeProto {
                op_type: "Constant".into(),
                output: vec!["three".into()],
                attribute: vec![AttributeProto {
                    name: "value".into(),
                    r#type: AttributeType::Tensor as i32,
                    t: Some(tensor_f32("", &[], &[3.0])),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let r = apply(&m).expect("rewritten");
        assert_eq!(ops(&r.model), ["Constant", "HardSigmoid", "Mul", "Relu"]);
    }

    #[test]
    fn the_exact_reference_computes_the_same_stft_in_float64() {
        let m = models::stft(400, 4000);
        let e = exact_reference(&m).expect("an STFT it rewrites");
        assert_eq!(
            ops(&e),
            ["Cast", "Cast", "STFT", "Cast", "Mul", "ReduceSum"]
        );
        let g = e.graph.as_ref().unwrap();
        assert_eq!(
            crate::onnx::attr::int(&g.node[0], "to"),
            Some(ElemType::Float64.code() as i64)
        );
        assert_eq!(g.node[3].output, ["spectrum"]);
        assert_eq!(
            crate::onnx::attr::int(&g.node[3], "to"),
            Some(ElemType::Float32.code() as i64)
        );
        assert!(exact_reference(&models::stft(2048, 4000)).is_none());
    }
}
