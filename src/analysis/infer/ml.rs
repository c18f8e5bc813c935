//! The `ai.onnx.ml` operators (what skl2onnx and onnxmltools emit): element types from the
//! op schema and the attributes that choose them, shapes only where the schema fixes them.
//!
//! Enters: a [`NodeCx`] of an `ai.onnx.ml` node. Leaves: one [`Out`] per tensor output;
//! `None` for the ops whose outputs are not tensors (ZipMap's sequence of maps, which the
//! export types through [`crate::analysis::types`]) or that this file does not know.
//! Knowing these types is what keeps a string tensor (string class labels) off providers
//! that have no string kernels.

use super::{shape, Answer, NodeCx};
use crate::analysis::facts::SymDim;
use crate::onnx::attr;
use crate::onnx::ElemType;

pub(super) fn rules(cx: &NodeCx<'_>) -> Answer {
    let n = cx.n;
    let x_shape = cx.in_shape(0);
    // Rows of a [N, C] feature input (the classifiers and regressors read 2-D input).
    let rows = || match x_shape.as_deref() {
        Some([n, _]) => Some(n.clone()),
        _ => None,
    };
    let by_rows = |cols: SymDim| rows().map(|r| vec![r, cols]);
    Some(match cx.op {
        "TreeEnsembleClassifier" | "LinearClassifier" | "SVMClassifier" => {
            let label = if attr::has(n, "classlabels_strings") {
                ElemType::String
            } else {
                ElemType::Int64
            };
            vec![
                shape(Some(label), rows().map(|r| vec![r])),
                shape(Some(ElemType::Float32), by_rows(SymDim::Unknown)),
            ]
        }
        "TreeEnsembleRegressor" | "LinearRegressor" | "SVMRegressor" => {
            vec![shape(Some(ElemType::Float32), by_rows(SymDim::Unknown))]
        }
        // ai.onnx.ml 5: the output has the type of X.
        "TreeEnsemble" => vec![shape(cx.in_dt(0), by_rows(SymDim::Unknown))],
        "LabelEncoder" => {
            let dt = if attr::has(n, "values_strings") {
                Some(ElemType::String)
            } else if attr::has(n, "values_int64s") {
                Some(ElemType::Int64)
            } else if attr::has(n, "values_floats") {
                Some(ElemType::Float32)
            } else {
                attr::tensor(n, "values_tensor").map(|t| ElemType::from_code(t.data_type))
            };
            vec![shape(dt, x_shape)]
        }
        "CategoryMapper" => {
            let dt = match cx.in_dt(0) {
                Some(ElemType::String) => Some(ElemType::Int64),
                Some(ElemType::Int64) => Some(ElemType::String),
                _ => None,
            };
            vec![shape(dt, x_shape)]
        }
        "Scaler" | "Normalizer" => vec![shape(Some(ElemType::Float32), x_shape)],
        "Binarizer" | "Imputer" => vec![shape(cx.in_dt(0), x_shape)],
        "OneHotEncoder" => vec![shape(Some(ElemType::Float32), None)],
        "FeatureVectorizer" => vec![shape(Some(ElemType::Float32), None)],
        "ArrayFeatureExtractor" => vec![shape(cx.in_dt(0), None)],
        "CastMap" => {
            let dt = match attr::string(n, "cast_to").as_deref() {
                Some("TO_STRING") => Some(ElemType::String),
                Some("TO_INT64") => Some(ElemType::Int64),
                _ => Some(ElemType::Float32),
            };
            vec![shape(dt, None)]
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use crate::analysis::shapes::propagate;
    use crate::fixtures::{attr, model, GraphBuilder, D};
    use crate::onnx::graph::Graph;
    use crate::onnx::ElemType::{Float32, Int64, String};

    #[test]
    fn classifier_labels_are_string_or_int64_by_attribute() {
        for (labels, want) in [
            (attr::strings("classlabels_strings", &["a", "b"]), String),
            (attr::ints("classlabels_int64s", &[0, 1]), Int64),
        ] {
            let mut g = GraphBuilder::new("t");
            g.input("x", Float32, &["n".into(), D::Fixed(4)])
                .output("label", want, None)
                .output("prob", Float32, None);
            let node = g.node("TreeEnsembleClassifier", &["x"], &["label", "prob"]);
            node.domain = "ai.onnx.ml".into();
            node.attribute.push(labels);
            g.node("Identity", &["label"], &["copy"]);
            let m = model(g.build(), &[("", 17), ("ai.onnx.ml", 3)]);
            let view = Graph::new(m.graph.as_ref().unwrap());
            let f = propagate(&view, &[0, 1], None, 17);
            assert_eq!(f.get("label").unwrap().dtype, Some(want));
            assert_eq!(
                f.get("copy").unwrap().dtype,
                Some(want),
                "Identity passes it on"
            );
            assert_eq!(f.get("prob").unwrap().dtype, Some(Float32));
            let dims: Vec<_> = f.get("label").unwrap().shape.clone().unwrap();
            assert_eq!(dims.len(), 1);
        }
    }
}
