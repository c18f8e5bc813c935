//! Values the graph itself names for its string and integer inputs, for the default
//! validation inputs ([`super::validate`]): a column that reaches ONNX-ML's `OneHotEncoder`
//! can only hold one of its categories (with `zeros = 0`, scikit-learn's
//! `handle_unknown="error"`, ONNX Runtime refuses any other: "Unknown Category"), and one
//! that reaches `LabelEncoder` or `CategoryMapper` means something only as one of their keys.
//! Random strings (the decimals of `int_range`) fit neither. A map input (scikit-learn's
//! DictVectorizer: feature name → value) gets the keys of the `DictVectorizer` it reaches.
//! Integer ids that index an embedding table (a `Gather` of a weight, ONNX Runtime's
//! `GatherBlockQuantized`) get ids spread over the table's rows: `int_range`'s 0 and 1 read
//! two rows of a 30,000-word vocabulary and leave the rest of the table unexercised.
//!
//! Enters: the model's graph. Leaves: input name → the values to draw from. An input is
//! followed through the ops that pass its values on unchanged (Identity, the reshaping ops,
//! Transpose, Slice, Gather's data, Split, Concat, Tile, Expand, ONNX-ML's
//! ArrayFeatureExtractor) to those three; one reached by two with different keys gets the
//! keys they share, or nothing.

use std::collections::{BTreeMap, HashMap};

use crate::onnx::proto::{GraphProto, NodeProto};
use crate::onnx::{attr, Model};

/// Most values kept per input (a vocabulary of 50,000 words needs no more than this many to
/// make valid inputs).
const MAX_VALUES: usize = 256;

/// The values an input takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    Str(Vec<String>),
    Int(Vec<i64>),
}

/// [`known`] of the model at `path`; empty when it does not load (the reference session's
/// own error then says why).
pub(crate) fn known_values(path: &std::path::Path) -> BTreeMap<String, Known> {
    match Model::load(path) {
        Ok(m) => known(m.graph()),
        Err(e) => {
            tracing::debug!(error = %e, "no known input values: the model does not load");
            BTreeMap::new()
        }
    }
}

/// The values the graph's keyed ONNX-ML operators give its inputs (see the module docs).
pub(super) fn known(g: &GraphProto) -> BTreeMap<String, Known> {
    let weights: std::collections::HashSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    // Value name → the graph input whose values it carries.
    let mut from: HashMap<&str, &str> = g
        .input
        .iter()
        .filter(|vi| !weights.contains(vi.name.as_str()))
        .map(|vi| (vi.name.as_str(), vi.name.as_str()))
        .collect();
    let tables: HashMap<&str, i64> = g
        .initializer
        .iter()
        .filter_map(|t| Some((t.name.as_str(), *t.dims.first()?)))
        .collect();
    let mut found: BTreeMap<String, Option<Known>> = BTreeMap::new();
    // Input → the fewest rows of an embedding table it indexes.
    let mut rows: BTreeMap<&str, i64> = BTreeMap::new();
    for n in &g.node {
        if let Some((src, v)) = embedding(n, &from, &tables) {
            rows.entry(src)
                .and_modify(|r| *r = (*r).min(v))
                .or_insert(v);
        }
        let Some(&src) = n.input.first().and_then(|i| from.get(i.as_str())) else {
            // Concat may take the input at any position.
            if n.op_type == "Concat" && n.domain.is_empty() {
                let srcs: Vec<&str> = n
                    .input
                    .iter()
                    .filter_map(|i| from.get(i.as_str()).copied())
                    .collect();
                if let ([one, ..], Some(out)) = (srcs.as_slice(), n.output.first()) {
                    if srcs.iter().all(|s| s == one) {
                        from.insert(out.as_str(), one);
                    }
                }
            }
            continue;
        };
        if passes_on(n) {
            for out in &n.output {
                from.insert(out.as_str(), src);
            }
        } else if let Some(k) = keys(n) {
            let entry = found
                .entry(src.to_string())
                .or_insert_with(|| Some(k.clone()));
            *entry = match entry.take() {
                Some(had) => shared(had, k),
                None => None,
            };
        }
    }
    for (src, v) in rows {
        found
            .entry(src.to_string())
            .or_insert_with(|| Some(Known::Int(spread(v))));
    }
    found
        .into_iter()
        .filter_map(|(name, k)| Some((name, k?)))
        .collect()
}

/// An embedding lookup: a `Gather` (axis 0) or ONNX Runtime's `GatherBlockQuantized` of a
/// weight table by indices that carry an input's values: the input and the table's rows.
fn embedding<'a>(
    n: &NodeProto,
    from: &HashMap<&str, &'a str>,
    tables: &HashMap<&str, i64>,
) -> Option<(&'a str, i64)> {
    let standard = (n.domain.is_empty() || n.domain == "ai.onnx") && n.op_type == "Gather";
    let quantized = n.domain == "com.microsoft" && n.op_type == "GatherBlockQuantized";
    if !(standard || quantized) || attr::int(n, "gather_axis").unwrap_or(0) != 0 {
        return None;
    }
    if standard && attr::int(n, "axis").unwrap_or(0) != 0 {
        return None;
    }
    let rows = *tables.get(n.input.first()?.as_str())?;
    let src = *from.get(n.input.get(1)?.as_str())?;
    (rows >= 2).then_some((src, rows))
}

/// Up to [`MAX_VALUES`] indices spread over `0..rows`, both ends included: ids that reach the
/// whole table, not only its first rows.
fn spread(rows: i64) -> Vec<i64> {
    let n = (MAX_VALUES as i64).min(rows);
    if n < 2 {
        return vec![0];
    }
    let mut v: Vec<i64> = (0..n).map(|i| i * (rows - 1) / (n - 1)).collect();
    v.dedup();
    v
}

/// Ops whose outputs hold (some of) their first input's values, unchanged.
fn passes_on(n: &NodeProto) -> bool {
    match n.domain.as_str() {
        "" | "ai.onnx" => matches!(
            n.op_type.as_str(),
            "Identity"
                | "Reshape"
                | "Flatten"
                | "Squeeze"
                | "Unsqueeze"
                | "Transpose"
                | "Slice"
                | "Gather"
                | "GatherElements"
                | "Split"
                | "Concat"
                | "Tile"
                | "Expand"
        ),
        "ai.onnx.ml" => n.op_type == "ArrayFeatureExtractor",
        _ => false,
    }
}

/// The keys an ONNX-ML operator looks its first input up in.
fn keys(n: &NodeProto) -> Option<Known> {
    if n.domain != "ai.onnx.ml" {
        return None;
    }
    let (strs, ints) = match n.op_type.as_str() {
        "OneHotEncoder" | "CategoryMapper" => ("cats_strings", "cats_int64s"),
        "LabelEncoder" => ("keys_strings", "keys_int64s"),
        // A map input's keys.
        "DictVectorizer" => ("string_vocabulary", "int64_vocabulary"),
        _ => return None,
    };
    let k = match (attr::strings(n, strs), attr::ints(n, ints)) {
        (Some(s), _) if !s.is_empty() => Known::Str(s.into_iter().take(MAX_VALUES).collect()),
        (_, Some(i)) if !i.is_empty() => Known::Int(i.into_iter().take(MAX_VALUES).collect()),
        _ => return None,
    };
    Some(k)
}

/// The values two keyed ops share, in the first's order; `None` when they share none or
/// differ in kind.
fn shared(a: Known, b: Known) -> Option<Known> {
    let k = match (a, b) {
        (Known::Str(a), Known::Str(b)) => {
            Known::Str(a.into_iter().filter(|x| b.contains(x)).collect())
        }
        (Known::Int(a), Known::Int(b)) => {
            Known::Int(a.into_iter().filter(|x| b.contains(x)).collect())
        }
        _ => return None,
    };
    match &k {
        Known::Str(v) if v.is_empty() => None,
        Known::Int(v) if v.is_empty() => None,
        _ => Some(k),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attr as a, tensor_i64, GraphBuilder, D};
    use crate::onnx::ElemType;

    #[test]
    fn one_hot_categories_through_feature_extractor_and_reshape() {
        // skl2onnx's ColumnTransformer: colour [N, 1] → ArrayFeatureExtractor → Reshape →
        // OneHotEncoder(cats_strings, zeros = 0).
        let mut b = GraphBuilder::new("onehot");
        b.input("colour", ElemType::String, &[D::Named("N"), D::Fixed(1)]);
        b.init(tensor_i64("col", &[1], &[0]));
        b.init(tensor_i64("shape", &[2], &[-1, 1]));
        b.node_in(
            "ai.onnx.ml",
            "ArrayFeatureExtractor",
            &["colour", "col"],
            &["c"],
        );
        b.node("Reshape", &["c", "shape"], &["r"]);
        let n = b.node_in("ai.onnx.ml", "OneHotEncoder", &["r"], &["h"]);
        n.attribute
            .push(a::strings("cats_strings", &["blue", "green", "red"]));
        n.attribute.push(a::int("zeros", 0));
        b.output("h", ElemType::Float32, None);
        let k = known(&b.build());
        assert_eq!(
            k,
            BTreeMap::from([(
                "colour".to_string(),
                Known::Str(vec!["blue".into(), "green".into(), "red".into()])
            )])
        );
    }

    #[test]
    fn ids_that_index_an_embedding_spread_over_its_rows() {
        // BERT: input_ids [batch, seq] → Gather(word_embeddings [30522, 8]); token_type_ids →
        // Gather(token_type_embeddings [2, 8]); attention_mask indexes nothing.
        let mut b = GraphBuilder::new("bert");
        b.input(
            "input_ids",
            ElemType::Int64,
            &[D::Named("b"), D::Named("s")],
        );
        b.input(
            "token_type_ids",
            ElemType::Int64,
            &[D::Named("b"), D::Named("s")],
        );
        b.input(
            "attention_mask",
            ElemType::Int64,
            &[D::Named("b"), D::Named("s")],
        );
        b.init(crate::fixtures::tensor_f32(
            "words",
            &[30522, 1],
            &[0.5; 30522],
        ));
        b.init(crate::fixtures::tensor_f32("types", &[2, 1], &[0.5; 2]));
        b.node("Gather", &["words", "input_ids"], &["e"]);
        b.node("Gather", &["types", "token_type_ids"], &["t"]);
        b.node("Cast", &["attention_mask"], &["m"]);
        b.output("e", ElemType::Float32, None);
        let k = known(&b.build());
        let Some(Known::Int(ids)) = k.get("input_ids") else {
            panic!("{k:?}")
        };
        assert_eq!(ids.len(), MAX_VALUES);
        assert_eq!((ids[0], ids[ids.len() - 1]), (0, 30521));
        assert_eq!(k.get("token_type_ids"), Some(&Known::Int(vec![0, 1])));
        assert!(!k.contains_key("attention_mask"));
    }

    #[test]
    fn integer_keys_shared_keys_and_unrelated_inputs() {
        let mut b = GraphBuilder::new("keys");
        b.input("code", ElemType::Int64, &[D::Named("N")]);
        b.input("city", ElemType::String, &[D::Named("N")]);
        b.input("x", ElemType::Float32, &[D::Named("N")]);
        // Two lookups of `code`: only the keys both know.
        b.node_in("ai.onnx.ml", "LabelEncoder", &["code"], &["l1"])
            .attribute
            .push(a::ints("keys_int64s", &[3, 5, 7]));
        b.node("Identity", &["code"], &["c2"]);
        b.node_in("ai.onnx.ml", "CategoryMapper", &["c2"], &["l2"])
            .attribute
            .push(a::ints("cats_int64s", &[5, 7, 9]));
        // `city` meets two encoders that share nothing: no values.
        b.node_in("ai.onnx.ml", "OneHotEncoder", &["city"], &["h1"])
            .attribute
            .push(a::strings("cats_strings", &["oslo"]));
        b.node_in("ai.onnx.ml", "OneHotEncoder", &["city"], &["h2"])
            .attribute
            .push(a::strings("cats_strings", &["rome"]));
        b.node("Relu", &["x"], &["y"]);
        b.output("y", ElemType::Float32, None);
        let k = known(&b.build());
        assert_eq!(
            k,
            BTreeMap::from([("code".to_string(), Known::Int(vec![5, 7]))])
        );
    }
}
