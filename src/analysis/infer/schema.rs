//! The schema fall-back: output element types that an operator's schema alone fixes, for
//! ops no family rule answers (quantization ops such as DynamicQuantizeLinear, ConvInteger
//! and MatMulInteger, ONNX Runtime's contrib ops, anything new) and for outputs a rule left
//! untyped.
//!
//! Enters: a node's domain, op type and version, and the element types of its inputs.
//! Leaves: one element type (or `None`) per output slot. The rules are a table generated from
//! ONNX Runtime's registered schemas by `scripts/gen-op-types.py`
//! (`data/ort-op-types.tsv`): a fixed type (`DynamicQuantizeLinear`'s scale is float), or the
//! type of the input that shares the output's type constraint (`Add`'s output is its input's).
//! Nothing else: shapes stay unknown, and an output whose type an attribute chooses stays
//! untyped rather than guessed.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::onnx::ElemType;

const TABLE: &str = include_str!("../data/ort-op-types.tsv");

/// What the schema says of one output.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    /// A tensor of this `TensorProto.DataType` code.
    Fixed(i32),
    /// The element type of the first of these formal inputs that is known.
    Input(Vec<usize>),
    /// Not fixed by the schema.
    Open,
}

#[derive(Debug)]
struct Schema {
    since: i64,
    outputs: Vec<Rule>,
    /// The last output is variadic: further outputs follow its rule.
    variadic: bool,
}

/// Schemas by (domain, op), oldest version first.
type Schemas = HashMap<(&'static str, &'static str), Vec<Schema>>;

fn schemas() -> &'static Schemas {
    static S: OnceLock<Schemas> = OnceLock::new();
    S.get_or_init(|| parse(TABLE))
}

fn parse(text: &'static str) -> Schemas {
    let mut out: Schemas = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut cols = line.split('\t');
        let (Some(domain), Some(op), Some(since)) = (cols.next(), cols.next(), cols.next()) else {
            continue;
        };
        let Ok(since) = since.parse::<i64>() else {
            continue;
        };
        let rules = cols.next().unwrap_or("");
        let variadic = rules.ends_with('*');
        let outputs = rules
            .trim_end_matches('*')
            .split_whitespace()
            .map(|r| {
                if let Some(c) = r.strip_prefix('=') {
                    c.parse().map_or(Rule::Open, Rule::Fixed)
                } else if let Some(list) = r.strip_prefix('@') {
                    let idx: Option<Vec<usize>> = list.split(',').map(|i| i.parse().ok()).collect();
                    idx.map_or(Rule::Open, Rule::Input)
                } else {
                    Rule::Open
                }
            })
            .collect();
        let domain = if domain == "ai.onnx" { "" } else { domain };
        out.entry((domain, op)).or_default().push(Schema {
            since,
            outputs,
            variadic,
        });
    }
    for v in out.values_mut() {
        v.sort_by_key(|s| s.since);
    }
    out
}

/// Element types of a node's `outputs` outputs by its schema: the newest version at or below
/// `version` (the model's opset for the domain), or the newest of all when the version is not
/// known. `input` gives the element type of input slot `i` when known.
pub(super) fn output_types(
    domain: &str,
    op: &str,
    version: Option<i64>,
    outputs: usize,
    input: impl Fn(usize) -> Option<ElemType>,
) -> Vec<Option<ElemType>> {
    let domain = if domain == "ai.onnx" { "" } else { domain };
    let Some(versions) = schemas().get(&(domain, op)) else {
        return vec![None; outputs];
    };
    let schema = match version {
        Some(v) => versions.iter().rev().find(|s| s.since <= v),
        None => versions.last(),
    };
    let Some(s) = schema else {
        return vec![None; outputs];
    };
    (0..outputs)
        .map(|slot| {
            let rule =
                s.outputs
                    .get(slot)
                    .or_else(|| if s.variadic { s.outputs.last() } else { None })?;
            match rule {
                Rule::Fixed(c) => Some(ElemType::from_code(*c)),
                Rule::Input(ins) => ins.iter().find_map(|&i| input(i)),
                Rule::Open => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::ElemType::*;

    #[test]
    fn fixed_bound_and_open_outputs() {
        // DynamicQuantizeLinear-11: uint8 data, float scale, uint8 zero point.
        assert_eq!(
            output_types("", "DynamicQuantizeLinear", Some(13), 3, |_| Some(Float32)),
            vec![Some(Uint8), Some(Float32), Some(Uint8)]
        );
        assert_eq!(
            output_types("ai.onnx", "ConvInteger", Some(11), 1, |_| Some(Uint8)),
            vec![Some(Int32)]
        );
        // Bound to the input's constraint.
        assert_eq!(
            output_types("", "Add", Some(17), 1, |i| (i == 0).then_some(Float16)),
            vec![Some(Float16)]
        );
        // Cast's output type is an attribute's choice: the schema leaves it open.
        assert_eq!(
            output_types("", "Cast", Some(17), 1, |_| Some(Float32)),
            vec![None]
        );
        // Unknown op, and an input type that is not known.
        assert_eq!(
            output_types("x.y", "Nope", None, 2, |_| None),
            vec![None, None]
        );
        assert_eq!(output_types("", "Relu", Some(14), 1, |_| None), vec![None]);
    }

    #[test]
    fn versions_and_variadic_outputs() {
        // Dropout's mask: the data's type before opset 10, bool from 10.
        assert_eq!(
            output_types("", "Dropout", Some(7), 2, |_| Some(Float32)),
            vec![Some(Float32), Some(Float32)]
        );
        assert_eq!(
            output_types("", "Dropout", Some(12), 2, |_| Some(Float32)),
            vec![Some(Float32), Some(Bool)]
        );
        // Split: every output has the input's type.
        assert_eq!(
            output_types("", "Split", Some(18), 4, |_| Some(Int64)),
            vec![Some(Int64); 4]
        );
        // A contrib op, by its newest schema.
        assert_eq!(
            output_types("com.microsoft", "DynamicQuantizeLSTM", None, 3, |_| None),
            vec![Some(Float32); 3]
        );
        // Before the op existed there is no schema.
        assert_eq!(
            output_types("", "DynamicQuantizeLinear", Some(10), 1, |_| Some(Float32)),
            vec![None]
        );
    }

    #[test]
    fn the_table_parses_and_covers_the_standard_domain() {
        let s = schemas();
        assert!(s.len() > 350, "{} ops", s.len());
        for op in ["Add", "Conv", "LSTM", "If", "TreeEnsembleClassifier"] {
            assert!(
                s.keys().any(|(_, o)| *o == op),
                "{op} is missing from the table"
            );
        }
    }
}
