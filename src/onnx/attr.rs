//! Typed attribute access on a [`NodeProto`]: a value is returned only when the attribute is
//! present AND has the asked-for type, so a hostile or broken model whose `axis` is a string
//! (or whose `ints` field is set on an INT attribute) reads as "absent", never as a default
//! `0` taken from an unset field. Attributes written before ONNX recorded `type` (IR < 2,
//! `type` = UNDEFINED) are judged by which value field is set.

use super::proto::{AttributeProto, AttributeType, NodeProto, TensorProto};

/// The attribute called `name`, if any.
pub fn get<'a>(n: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    n.attribute.iter().find(|a| a.name == name)
}

/// Whether the node has an attribute called `name` (of any type).
pub fn has(n: &NodeProto, name: &str) -> bool {
    get(n, name).is_some()
}

/// Whether the node carries a graph attribute: a body (If branches, Loop and Scan bodies).
pub fn has_body(n: &NodeProto) -> bool {
    n.attribute
        .iter()
        .any(|a| a.g.is_some() || !a.graphs.is_empty())
}

/// The attribute's declared type, or (for untyped old attributes) the type its set field
/// implies.
pub fn kind(a: &AttributeProto) -> AttributeType {
    match AttributeType::try_from(a.r#type) {
        Ok(AttributeType::Undefined) | Err(_) => {
            if !a.ints.is_empty() {
                AttributeType::Ints
            } else if !a.floats.is_empty() {
                AttributeType::Floats
            } else if !a.strings.is_empty() {
                AttributeType::Strings
            } else if a.t.is_some() {
                AttributeType::Tensor
            } else if a.g.is_some() {
                AttributeType::Graph
            } else if !a.s.is_empty() {
                AttributeType::String
            } else if a.f != 0.0 {
                AttributeType::Float
            } else {
                // An INT attribute whose value is 0 looks like this too.
                AttributeType::Int
            }
        }
        Ok(t) => t,
    }
}

fn typed<'a>(n: &'a NodeProto, name: &str, want: AttributeType) -> Option<&'a AttributeProto> {
    get(n, name).filter(|a| kind(a) == want)
}

/// An INT attribute.
pub fn int(n: &NodeProto, name: &str) -> Option<i64> {
    typed(n, name, AttributeType::Int).map(|a| a.i)
}

/// An INTS attribute (copied: these are a handful of axes, pads or sizes).
pub fn ints(n: &NodeProto, name: &str) -> Option<Vec<i64>> {
    typed(n, name, AttributeType::Ints).map(|a| a.ints.clone())
}

/// A STRING attribute, lossily decoded as UTF-8.
pub fn string(n: &NodeProto, name: &str) -> Option<String> {
    typed(n, name, AttributeType::String).map(|a| String::from_utf8_lossy(&a.s).into_owned())
}

/// A STRINGS attribute, each lossily decoded as UTF-8.
pub fn strings(n: &NodeProto, name: &str) -> Option<Vec<String>> {
    typed(n, name, AttributeType::Strings).map(|a| {
        a.strings
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    })
}

/// A TENSOR attribute.
pub fn tensor<'a>(n: &'a NodeProto, name: &str) -> Option<&'a TensorProto> {
    typed(n, name, AttributeType::Tensor).and_then(|a| a.t.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(attrs: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            op_type: "X".into(),
            attribute: attrs,
            ..Default::default()
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_reads_as_absent() {
        let n = node(vec![
            AttributeProto {
                name: "axis".into(),
                r#type: AttributeType::String as i32,
                s: b"1".to_vec(),
                ..Default::default()
            },
            AttributeProto {
                name: "perm".into(),
                r#type: AttributeType::Ints as i32,
                ints: vec![0, 2, 1],
                ..Default::default()
            },
        ]);
        assert_eq!(int(&n, "axis"), None);
        assert_eq!(string(&n, "axis").as_deref(), Some("1"));
        assert_eq!(ints(&n, "perm"), Some(vec![0, 2, 1]));
        assert_eq!(int(&n, "perm"), None);
        assert!(has(&n, "axis") && !has(&n, "keepdims"));
    }

    #[test]
    fn untyped_attributes_are_judged_by_their_field() {
        let n = node(vec![
            AttributeProto {
                name: "axis".into(),
                i: -1,
                ..Default::default()
            },
            AttributeProto {
                name: "axes".into(),
                ints: vec![1],
                ..Default::default()
            },
        ]);
        assert_eq!(int(&n, "axis"), Some(-1));
        assert_eq!(ints(&n, "axes"), Some(vec![1]));
        assert_eq!(int(&n, "axes"), None);
    }
}
