//! What a user can do when ONNX Runtime refuses a model: its load errors for a model it
//! cannot run at all (an operator it has never heard of, a custom domain, a type no schema
//! allows, an IR version or opset newer than it reads, no kernel for the types), turned into
//! a sentence that says what is wrong and what to change, with ORT's own message kept after
//! it (tidied of the C++ source location and function signature it starts with).

/// ORT's message with the user's way out in front, when the message is one of the known
/// "ONNX Runtime cannot run this model" kinds; otherwise ORT's message, tidied.
pub(crate) fn ort_message(raw: &str) -> String {
    let tidy = tidy(raw);
    match hint(&tidy) {
        Some(h) => format!("{h} (ONNX Runtime: {tidy})"),
        None => tidy,
    }
}

/// Drops the `/onnxruntime_src/…/file.cc:123 [ret] ns::Class::method(args…) ` prefix ORT
/// puts in front of the sentence, and trailing blank lines. The signature is the token after
/// the location (after a one-word return type, `void`), spaces inside its brackets included
/// (`Locale::Locale(const std::string&)::<lambda()>`), when it has a `::`; otherwise only
/// the location goes.
fn tidy(raw: &str) -> String {
    let mut s = raw.trim_end().to_string();
    while let Some(at) = s.find("/onnxruntime_src/") {
        let rest = &s[at..];
        let Some(space) = rest.find(' ') else { break };
        let after_path = &rest[space + 1..];
        let mut words = after_path.splitn(3, ' ');
        let (first, second) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let sig = if first.contains("::") {
            Some(0)
        } else if second.contains("::")
            && !first.is_empty()
            && first.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            Some(first.len() + 1)
        } else {
            None
        };
        let mut cut = space + 1;
        if let Some(from) = sig {
            let mut depth = 0i32;
            for (i, c) in after_path[from..].char_indices() {
                match c {
                    '(' | '<' | '[' => depth += 1,
                    ')' | '>' | ']' => depth -= 1,
                    ' ' if depth <= 0 => {
                        cut = space + 1 + from + i + 1;
                        break;
                    }
                    _ => {}
                }
            }
        }
        s.replace_range(at..at + cut, "");
    }
    s
}

/// The text between `start` and the next `end` after it.
fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = s.find(start)? + start.len();
    let to = s[from..].find(end)? + from;
    Some(&s[from..to])
}

fn hint(m: &str) -> Option<String> {
    // `Fatal error: org.example:Quant(-1) is not a registered function/op`
    if let Some(at) = m.find(" is not a registered function/op") {
        let qualified = m[..at].rsplit(' ').next().unwrap_or("");
        let qualified = qualified.split('(').next().unwrap_or(qualified);
        let (domain, op) = qualified.rsplit_once(':').unwrap_or(("", qualified));
        return Some(if is_ort_domain(domain) {
            format!(
                "`{domain}::{op}` is not an operator this ONNX Runtime has in `{domain}` (its \
                 contrib operators change between releases): build with the ONNX Runtime the \
                 model was exported for (`ort_library`), or re-export it with standard ONNX \
                 operators"
            )
        } else {
            format!(
                "`{domain}::{op}` is a custom-domain operator: ONNX Runtime runs it only with a \
                 custom-op library for `{domain}`, which trtcache does not load (TensorRT would \
                 need a plugin): re-export the model with standard ONNX operators"
            )
        });
    }
    // `No Op registered for Frobnicate with domain_version of 17`
    if let Some(op) = between(m, "No Op registered for ", " with domain_version of ") {
        let version = m
            .split(" with domain_version of ")
            .nth(1)
            .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
            .unwrap_or("?");
        return Some(format!(
            "`{op}` is not an operator of the model's opset ({version}) in ONNX Runtime's \
             schemas: a misspelled or newer operator, or one meant for a custom domain the \
             node does not name: re-export the model at an opset that has it"
        ));
    }
    // `Type Error: Type (tensor(float16)) of output arg (X) of node (Y) does not match
    // expected type (tensor(float)).`: the graph's declared types (value_info, outputs)
    // contradict what its nodes make.
    if let (Some(have), Some(arg), Some(node)) = (
        between(m, "Type Error: Type (", ") of output arg"),
        between(m, "of output arg (", ")"),
        between(m, "of node (", ")"),
    ) {
        let want = between(m, "does not match expected type (", "))")
            .map(|t| format!("{t})"))
            .unwrap_or_else(|| "another type".into());
        let node = if node.is_empty() {
            String::new()
        } else {
            format!(" of node `{node}`")
        };
        return Some(format!(
            "the model's declared types contradict its nodes: output `{arg}`{node} is \
             {have}, but the graph declares it {want} (a converter's bug: onnxconverter-common's \
             float16 conversion leaves such value_info behind). Convert the float32 model with \
             onnxruntime.transformers.float16.convert_float_to_float16 instead, or fix or drop \
             the stale value_info (`del model.graph.value_info[:]`, then \
             onnx.shape_inference.infer_shapes)"
        ));
    }
    // `Type Error: Type 'tensor(int32)' of input parameter (x) of operator (Conv) in node () is invalid.`
    if let (Some(ty), Some(op)) = (
        between(m, "Type Error: Type '", "'"),
        between(m, "of operator (", ")"),
    ) {
        let input = between(m, "of input parameter (", ")").unwrap_or("?");
        let node = between(m, "in node (", ")").filter(|n| !n.is_empty());
        let node = node.map(|n| format!(" (node `{n}`)")).unwrap_or_default();
        return Some(format!(
            "`{op}`{node} is given {ty} for input `{input}`, a type its ONNX schema does not \
             allow: the exporter wrote an invalid graph; cast the value to a type `{op}` \
             takes before exporting"
        ));
    }
    // `Unsupported model IR version: 99, max supported IR version: 13`
    if let Some(v) = between(m, "Unsupported model IR version: ", ",") {
        let max = m
            .split("max supported IR version: ")
            .nth(1)
            .map(|s| s.trim())
            .unwrap_or("?");
        return Some(format!(
            "the model's IR version {v} is newer than this ONNX Runtime reads (up to {max}): \
             save it with an older `ir_version` (the onnx package's exporters can), or use a \
             newer ONNX Runtime (`ort_library`)"
        ));
    }
    // `… Opset 40 is under development and support for this is limited. … Current official
    // support for domain ai.onnx is till opset 23.`
    if let Some(v) = between(m, "Opset ", " is under development") {
        let domain = between(m, "support for domain ", " is till opset");
        let till = m
            .split(" is till opset ")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next());
        let current = match (domain, till) {
            (Some(d), Some(t)) => format!(" (it supports `{d}` up to opset {t})"),
            _ => String::new(),
        };
        return Some(format!(
            "the model imports opset {v}, newer than this ONNX Runtime supports{current}: \
             re-export it at a released opset, or use a newer ONNX Runtime (`ort_library`)"
        ));
    }
    // `StringNormalizer::Locale::Locale(…) Failed to construct locale with name:en_US.UTF-8:…`
    if let Some(name) = between(m, "Failed to construct locale with name:", ":") {
        return Some(format!(
            "the model's StringNormalizer needs the locale `{name}`, which this machine does \
             not have: install it (Debian/Ubuntu: the `locales` package, then `locale-gen \
             {name}`), then `trtcache rm` the failed entry (a failure is remembered until the \
             model changes) to build it again; or re-export it with a `locale` the machine has"
        ));
    }
    // `Could not find an implementation for Conv(11) node with name 'c'`
    if let Some(op) = between(m, "Could not find an implementation for ", " node") {
        return Some(format!(
            "ONNX Runtime's CPU provider has no kernel for `{op}` with the element types this \
             model gives it (ONNX allows them; ONNX Runtime does not implement them): cast \
             around the node, or re-export with types it implements (float32 runs everywhere)"
        ));
    }
    None
}

/// Domains ONNX Runtime itself registers operators in (beyond standard ONNX).
fn is_ort_domain(d: &str) -> bool {
    matches!(
        d,
        "" | "ai.onnx"
            | "ai.onnx.ml"
            | "com.microsoft"
            | "com.microsoft.nchwc"
            | "com.microsoft.experimental"
            | "com.ms.internal.nhwc"
            | "ai.onnx.training"
            | "ai.onnx.preview.training"
    )
}

impl crate::builder::BuildError {
    /// ONNX Runtime's error at `stage`, with what to do about it in front when it is one of
    /// the ways ORT says it cannot run the model at all ([`ort_message`]).
    pub(crate) fn ort(
        stage: &'static str,
        path: &std::path::Path,
        e: impl std::fmt::Display,
    ) -> Self {
        crate::builder::BuildError::Ort {
            stage,
            path: path.to_path_buf(),
            message: ort_message(&e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // ONNX Runtime 1.31's messages for each kind, as it printed them for small models.
    #[test]
    fn custom_domain_operator() {
        let m = ort_message(
            "Load model from m.onnx failed:Fatal error: org.example:Quant(-1) is not a registered function/op",
        );
        assert!(
            m.starts_with("`org.example::Quant` is a custom-domain operator"),
            "{m}"
        );
        assert!(m.contains("re-export the model with standard ONNX operators"));
        assert!(m.ends_with("(ONNX Runtime: Load model from m.onnx failed:Fatal error: org.example:Quant(-1) is not a registered function/op)"), "{m}");
    }

    #[test]
    fn unknown_contrib_operator() {
        let m = ort_message(
            "Fatal error: com.microsoft:NoSuchContrib(-1) is not a registered function/op",
        );
        assert!(
            m.starts_with(
                "`com.microsoft::NoSuchContrib` is not an operator this ONNX Runtime has"
            ),
            "{m}"
        );
    }

    #[test]
    fn unknown_standard_operator() {
        let m = ort_message(
            "Load model from m.onnx failed:This is an invalid model. In Node, (\"\", Frobnicate, \"\", -1) : \
             (\"x\": tensor(float),) -> (\"y\": tensor(float),) , Error No Op registered for Frobnicate with domain_version of 17",
        );
        assert!(
            m.starts_with("`Frobnicate` is not an operator of the model's opset (17)"),
            "{m}"
        );
    }

    #[test]
    fn type_no_schema_allows() {
        let m = ort_message(
            "Load model from m.onnx failed:This is an invalid model. Type Error: Type 'tensor(int32)' of input \
             parameter (x) of operator (Conv) in node (c1) is invalid.",
        );
        assert!(
            m.starts_with("`Conv` (node `c1`) is given tensor(int32) for input `x`"),
            "{m}"
        );
        let m = ort_message(
            "Type Error: Type 'tensor(int64)' of input parameter (x) of operator (Sin) in node () is invalid.",
        );
        assert!(m.starts_with("`Sin` is given tensor(int64)"), "{m}");
    }

    #[test]
    fn declared_types_that_contradict_the_nodes() {
        // onnxconverter-common's float16 conversion of an optimum BERT.
        let m = ort_message(
            "Load model from m.onnx failed:Type Error: Type (tensor(float16)) of output arg \
             (/encoder/layer.0/attention/self/Cast_output_0) of node \
             (/encoder/layer.0/attention/self/Cast) does not match expected type (tensor(float)).",
        );
        assert!(
            m.starts_with("the model's declared types contradict its nodes: output `/encoder/layer.0/attention/self/Cast_output_0` of node `/encoder/layer.0/attention/self/Cast` is tensor(float16), but the graph declares it tensor(float)"),
            "{m}"
        );
        assert!(m.contains("onnxruntime.transformers.float16"), "{m}");
        assert!(m.contains("value_info"), "{m}");
        assert!(
            m.contains("(ONNX Runtime: Load model from m.onnx failed:Type Error"),
            "{m}"
        );
    }

    #[test]
    fn newer_ir_version_and_opset() {
        let m = ort_message(
            "Load model from m.onnx failed:/onnxruntime_src/onnxruntime/core/graph/model.cc:256 \
             onnxruntime::Model::Model(onnx::ModelProto&&, const onnxruntime::PathString&, const \
             onnxruntime::ModelOptions&) Unsupported model IR version: 99, max supported IR version: 13\n\n",
        );
        assert!(
            m.starts_with(
                "the model's IR version 99 is newer than this ONNX Runtime reads (up to 13)"
            ),
            "{m}"
        );
        assert!(
            m.ends_with("(ONNX Runtime: Load model from m.onnx failed:Unsupported model IR version: 99, max supported IR version: 13)"),
            "{m}"
        );
        let m = ort_message(
            "failed:/onnxruntime_src/onnxruntime/core/graph/model_load_utils.h:46 void \
             onnxruntime::model_load_utils::ValidateOpsetForDomain(const std::unordered_map<std::string, int>&, \
             bool, int) ONNX Runtime only *guarantees* support for models stamped with official released onnx \
             opset versions. Opset 40 is under development and support for this is limited. Current official \
             support for domain ai.onnx is till opset 23.",
        );
        assert!(
            m.starts_with("the model imports opset 40, newer than this ONNX Runtime supports (it supports `ai.onnx` up to opset 23)"),
            "{m}"
        );
        assert!(m.contains("(ONNX Runtime: failed:ONNX Runtime only"), "{m}");
    }

    #[test]
    fn no_kernel_for_the_types() {
        let m = ort_message("Could not find an implementation for Conv(11) node with name 'c'");
        assert!(
            m.starts_with("ONNX Runtime's CPU provider has no kernel for `Conv(11)`"),
            "{m}"
        );
    }

    #[test]
    fn missing_locale() {
        let raw = "Exception during initialization: /onnxruntime_src/onnxruntime/core/providers/cpu/text/string_normalizer.cc:235 onnxruntime::StringNormalizer::Locale::Locale(const std::string&)::<lambda()> Failed to construct locale with name:en_US.UTF-8:locale::facet::_S_create_c_locale name not valid:Please, install necessary language-pack-XX and configure locales";
        let m = ort_message(raw);
        assert!(
            m.starts_with("the model's StringNormalizer needs the locale `en_US.UTF-8`"),
            "{m}"
        );
        assert!(m.contains("locale-gen en_US.UTF-8"), "{m}");
        // The C++ location and the lambda's signature, spaces and all, are gone.
        assert!(
            m.contains(
                "(ONNX Runtime: Exception during initialization: Failed to construct locale"
            ),
            "{m}"
        );
        assert!(
            !m.contains("onnxruntime_src") && !m.contains("lambda"),
            "{m}"
        );
    }

    #[test]
    fn other_messages_are_kept_as_they_are() {
        assert_eq!(
            ort_message("Shape mismatch in Resize"),
            "Shape mismatch in Resize"
        );
        assert_eq!(ort_message(""), "");
        // A location prefix without a signature is dropped up to the sentence.
        assert_eq!(ort_message("/onnxruntime_src/a.cc:1 oops"), "oops");
    }
}
