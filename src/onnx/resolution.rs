//! The resolution of a model's outputs: which graph outputs carry float16 or bfloat16
//! precision, by their type or because they are a Cast of such a tensor (a float16 model
//! converted with `keep_io_types=True` casts its outputs back to float32), and which float
//! outputs are computed from activations quantized to 8 bits at run time
//! (`DynamicQuantizeLinear`, as `onnxruntime.quantization.quantize_dynamic` writes). Validation
//! compares those in steps of their resolution (`spec::Tolerance::half_bound`), and the key
//! of a model that has any records that rule.
//!
//! Enters: a graph. Leaves: output name → `float16`, `bfloat16` or
//! [`DYNAMIC_INT8`](crate::spec::DYNAMIC_INT8).

use std::collections::{BTreeMap, BTreeSet};

use super::proto::GraphProto;
use super::ElemType;

fn half_name(code: i32) -> Option<&'static str> {
    match ElemType::from_code(code) {
        ElemType::Float16 => Some("float16"),
        ElemType::Bfloat16 => Some("bfloat16"),
        _ => None,
    }
}

/// Output name → the half type its values have the resolution of: a float16/bfloat16
/// tensor output (or a sequence, map or optional holding one), or a float32/float64 output
/// a Cast makes from a float16/bfloat16 tensor (known from the graph's value infos, inputs,
/// initializers or the Cast that made it). Other outputs are absent: they keep their own
/// type's rule.
pub fn half_outputs(g: &GraphProto) -> BTreeMap<String, String> {
    let mut types: BTreeMap<&str, i32> = BTreeMap::new();
    for v in g.value_info.iter().chain(&g.input) {
        if let Some(t) = super::facts::elem_type_of(v) {
            types.insert(&v.name, t.code());
        }
    }
    for t in &g.initializer {
        types.insert(&t.name, t.data_type);
    }
    let producer = |name: &str| g.node.iter().find(|n| n.output.iter().any(|o| o == name));
    let mut out = BTreeMap::new();
    for o in &g.output {
        let ty = super::facts::type_name(o.r#type.as_ref());
        if ty.contains("bfloat16") {
            out.insert(o.name.clone(), "bfloat16".to_string());
            continue;
        }
        if ty.contains("float16") {
            out.insert(o.name.clone(), "float16".to_string());
            continue;
        }
        if !matches!(ty.as_str(), "float32" | "float64") {
            continue;
        }
        let Some(cast) = producer(&o.name).filter(|n| n.op_type == "Cast" && n.domain.is_empty())
        else {
            continue;
        };
        let Some(src) = cast.input.first() else {
            continue;
        };
        let code = types.get(src.as_str()).copied().or_else(|| {
            // The source's type from the Cast that made it.
            let p = producer(src).filter(|n| n.op_type == "Cast" && n.domain.is_empty())?;
            p.attribute
                .iter()
                .find(|a| a.name == "to")
                .map(|a| a.i as i32)
        });
        if let Some(half) = code.and_then(half_name) {
            out.insert(o.name.clone(), half.to_string());
        }
    }
    out
}

/// Operators that quantize an activation to 8 bits with a scale computed from its values at
/// run time: any reordering of the float sums before one (an optimizer's fusion, another
/// kernel) can move a value across a rounding boundary, which moves the outputs it reaches
/// by a quantization step of every layer after it.
fn quantizes_dynamically(domain: &str, op: &str) -> bool {
    match domain {
        "" | "ai.onnx" => op == "DynamicQuantizeLinear",
        "com.microsoft" => matches!(op, "DynamicQuantizeMatMul" | "DynamicQuantizeLSTM"),
        _ => false,
    }
}

/// Float32/float64 graph outputs a dynamic activation quantizer reaches
/// ([`quantizes_dynamically`]), through any nodes of the main graph.
pub fn dynamic_int8_outputs(g: &GraphProto) -> BTreeSet<String> {
    let mut reached: BTreeSet<&str> = BTreeSet::new();
    // Nodes need not be sorted: spread until nothing changes (each pass adds a value or ends).
    loop {
        let before = reached.len();
        for n in &g.node {
            if quantizes_dynamically(&n.domain, &n.op_type)
                || n.input.iter().any(|i| reached.contains(i.as_str()))
            {
                reached.extend(
                    n.output
                        .iter()
                        .map(String::as_str)
                        .filter(|o| !o.is_empty()),
                );
            }
        }
        if reached.len() == before {
            break;
        }
    }
    g.output
        .iter()
        .filter(|o| reached.contains(o.name.as_str()))
        .filter(|o| {
            matches!(
                super::facts::type_name(o.r#type.as_ref()).as_str(),
                "float32" | "float64"
            )
        })
        .map(|o| o.name.clone())
        .collect()
}

/// Output name → the resolution validation compares it at: its half type
/// ([`half_outputs`]), else [`DYNAMIC_INT8`](crate::spec::DYNAMIC_INT8) for a float output
/// of dynamically quantized activations ([`dynamic_int8_outputs`]). Other outputs are
/// absent: they keep their own type's rule.
pub fn output_resolutions(g: &GraphProto) -> BTreeMap<String, String> {
    let mut out = half_outputs(g);
    for o in dynamic_int8_outputs(g) {
        out.entry(o)
            .or_insert_with(|| crate::spec::DYNAMIC_INT8.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attr, model, models, value_info, GraphBuilder};
    use crate::onnx::ElemType::{Float16, Float32};

    #[test]
    fn outputs_of_dynamically_quantized_activations_have_int8_resolution() {
        // DynamicQuantizeLinear → ConvInteger → Cast → Mul: y is computed from x in 8 bits;
        // the leaked int32 `c` is compared exactly, as every integer output.
        let g = models::conv_integer(true, true).graph.unwrap();
        let r = output_resolutions(&g);
        assert_eq!(
            r.get("y").map(String::as_str),
            Some(crate::spec::DYNAMIC_INT8)
        );
        assert!(!r.contains_key("c"), "{r:?}");
        // Static QDQ (weights dequantized, activations float) and plain float graphs: none.
        assert!(output_resolutions(&models::qdq_conv().graph.unwrap()).is_empty());
        assert!(output_resolutions(&models::tiny_encoder(false).graph.unwrap()).is_empty());
        // Reached through nodes listed out of order.
        let mut g = g;
        g.node.reverse();
        assert!(dynamic_int8_outputs(&g).contains("y"));
        // A half output keeps its half rule.
        let h = output_resolutions(&models::half_layer_norm(true, None).graph.unwrap());
        assert_eq!(h["y"], "float16");
    }

    #[test]
    fn half_typed_outputs_and_casts_of_half_tensors_have_half_resolution() {
        let g = models::half_layer_norm(true, None).graph.unwrap();
        assert_eq!(half_outputs(&g)["y"], "float16");
        assert!(half_outputs(&models::tiny_encoder(false).graph.unwrap()).is_empty());
        // keep_io_types=True: float32 in, float16 inside, float32 out through a Cast.
        let mut b = GraphBuilder::new("keep_io");
        b.input("x", Float32, &[4.into()])
            .output("y", Float32, Some(&[4.into()]))
            .output("z", Float32, Some(&[4.into()]));
        b.node("Cast", &["x"], &["x16"])
            .attribute
            .push(attr::int("to", Float16.code() as i64));
        b.node("Relu", &["x16"], &["r16"]);
        b.node("Cast", &["r16"], &["y"])
            .attribute
            .push(attr::int("to", Float32.code() as i64));
        b.node("Relu", &["x"], &["z"]);
        let mut g = model(b.build(), &[("", 17)]).graph.unwrap();
        // Without a value info for `r16` its type is unknown: float32's rule.
        assert!(half_outputs(&g).is_empty());
        g.value_info.push(value_info("r16", Float16, None));
        let h = half_outputs(&g);
        assert_eq!(h.get("y").map(String::as_str), Some("float16"));
        assert!(!h.contains_key("z"));
        // A Cast straight from the Cast that made the half tensor.
        g.value_info.clear();
        g.node.retain(|n| n.op_type != "Relu" || n.output[0] == "z");
        g.node
            .iter_mut()
            .find(|n| n.output[0] == "y")
            .unwrap()
            .input[0] = "x16".into();
        assert_eq!(half_outputs(&g)["y"], "float16");
    }
}
