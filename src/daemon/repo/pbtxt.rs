//! Just enough of protobuf text format to read one top-level string field of a Triton
//! `config.pbtxt` (`default_model_filename`).

/// Reads a quoted string at the start of `s` (after its opening quote `q`), handling `\`
/// escapes of the next character; `None` when it does not end.
fn quoted(s: &str, q: char) -> Option<(String, usize)> {
    let mut value = String::new();
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            value.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == q {
            return Some((value, i + c.len_utf8()));
        } else {
            value.push(c);
        }
    }
    None
}

/// The value of a top-level string field (`name: "value"`) in protobuf text format: comments
/// (`#` to the end of the line), other strings and fields inside nested messages (`{ ... }`,
/// `[ ... ]`) are passed over.
pub fn top_level_string(text: &str, field: &str) -> Option<String> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let c = rest.chars().next()?;
        match c {
            '#' => {
                i += rest.find('\n').unwrap_or(rest.len());
                continue;
            }
            '"' | '\'' => {
                let (_, n) = quoted(&rest[1..], c)?;
                i += 1 + n;
                continue;
            }
            '{' | '[' | '<' => depth += 1,
            '}' | ']' | '>' => depth = depth.saturating_sub(1),
            _ if c.is_ascii_alphabetic() || c == '_' => {
                let len = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                let word = &rest[..len];
                i += len;
                if depth == 0 && word == field {
                    let after = text[i..].trim_start().strip_prefix(':')?.trim_start();
                    let q = after.chars().next().filter(|q| *q == '"' || *q == '\'')?;
                    return quoted(&after[1..], q).map(|(v, _)| v);
                }
                continue;
            }
            _ => {}
        }
        i += c.len_utf8();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pbtxt_fields_outside_comments_strings_and_nested_messages() {
        let f = |t: &str| top_level_string(t, "default_model_filename");
        assert_eq!(
            f("default_model_filename: \"a.onnx\""),
            Some("a.onnx".into())
        );
        assert_eq!(
            f("default_model_filename:'b.onnx' # c"),
            Some("b.onnx".into())
        );
        assert_eq!(f("# default_model_filename: \"a\"\n"), None);
        assert_eq!(f("x { default_model_filename: \"a\" }"), None);
        assert_eq!(f("my_default_model_filename: \"a\""), None);
        assert_eq!(f("name: \"default_model_filename: x\""), None);
        assert_eq!(f("default_model_filename: \"unterminated"), None);
        assert_eq!(f(""), None);
    }
}
