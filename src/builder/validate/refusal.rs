//! The refusal when no default validation inputs work ([`no_inputs`]): what was tried and
//! ONNX Runtime's messages, then what helps, golden inputs first (the `np.savez` line with
//! the model's input names and the sidecar lines), a shape profile only when ONNX Runtime
//! refused the sizes. Several lines, each at most [`WIDTH`] columns but the quoted
//! messages, which are cut between words.
//!
//! Enters: the model path, the dynamic axes, the inputs and what the search did. Leaves: the
//! [`ValidateError::Invalid`].

use std::path::Path;

use super::error::ValidateError;
use super::search::{Axis, SEARCH_SIZES};

/// What the default search did: the candidates run and ONNX Runtime's message for each, and
/// those not run (over the byte budget, or at least as large as one memory ran out on).
pub(super) struct Tries<'a> {
    pub(super) run: &'a [(String, String)],
    pub(super) skipped: &'a [(String, String)],
}

/// Widest line of a refusal (a quoted ONNX Runtime message may be longer, as one line).
const WIDTH: usize = 100;
/// Most characters of an ONNX Runtime message a refusal quotes.
const QUOTE: usize = 320;

/// `text` in lines of at most [`WIDTH`] columns, broken at spaces only (a longer word keeps
/// its own line), every line after the first indented by `indent`.
fn wrap(text: &str, indent: &str) -> String {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for w in text.split(' ').filter(|w| !w.is_empty()) {
        let lead = if lines.is_empty() { 0 } else { indent.len() };
        if !cur.is_empty() && lead + cur.chars().count() + 1 + w.chars().count() > WIDTH {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines.join(&format!("\n{indent}"))
}

/// ONNX Runtime's message on one line, cut at a word boundary to [`QUOTE`] characters with
/// "…" (never inside a word; a single word longer than that is kept whole).
fn quote(message: &str) -> String {
    let one: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let one = one.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= QUOTE {
        return one;
    }
    let mut end = one.char_indices().nth(QUOTE).map_or(one.len(), |(i, _)| i);
    match one[..end].rfind(' ') {
        Some(sp) if sp > 0 => end = sp,
        _ => end = one[end..].find(' ').map_or(one.len(), |sp| end + sp),
    }
    format!("{} …", one[..end].trim_end())
}

/// Whether ONNX Runtime refused the values rather than the sizes (an index out of range, a
/// count a Range or Expand reads from the inputs): no shape profile can help then.
fn about_values(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "out of data bounds",
        "out of bounds",
        "out of range",
        "indices element",
        "idx=",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// Whether ONNX Runtime refused the sizes (shapes, ranks, dimensions): a profile may help.
fn about_sizes(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["shape", "rank", "dimension", "dims", "broadcast", "reshape"]
        .iter()
        .any(|w| m.contains(w))
}

/// The error when no default candidate works: what was tried and ONNX Runtime's messages,
/// then what helps, first golden inputs (the `np.savez` line with the model's input names and
/// the sidecar lines), then a shape profile, only when what ONNX Runtime refused was the
/// sizes. Several lines, each at most [`WIDTH`] columns but the quoted messages.
pub(super) fn no_inputs(
    model: &Path,
    axes: &[Axis],
    sigs: &[(String, Vec<i64>)],
    names: &[String],
    tries: &Tries<'_>,
) -> ValidateError {
    let tried = tries.run;
    // Nothing ran: every set is over the byte budget (a fixed 40 GB input).
    if let (true, Some((_, why))) = (tried.is_empty(), tries.skipped.first()) {
        return ValidateError::Invalid(format!(
            "{why}; give golden inputs (--golden or [golden] npz), a smaller profile, or raise the limit"
        ));
    }
    let axes_txt = if axes.is_empty() {
        "none: every input shape is fixed, so the random values themselves are refused".into()
    } else {
        axes.iter()
            .map(|a| {
                let sym = if a.symbol.is_empty() {
                    String::new()
                } else {
                    format!(" `{}`", a.symbol)
                };
                format!("`{}` axis {}{sym}", a.input, a.axis)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let first = tried.first().map(|t| t.1.as_str()).unwrap_or("");
    let last = tried.last().map(|t| t.1.as_str()).unwrap_or("");
    let listed = {
        let mut l: Vec<&str> = tried.iter().take(3).map(|t| t.0.as_str()).collect();
        let more = tried.len().saturating_sub(3);
        let tail = format!(
            "and {more} more: other sizes up to {}, one axis at a time",
            SEARCH_SIZES[SEARCH_SIZES.len() - 1]
        );
        if more > 0 {
            l.push(&tail);
        }
        l.join("; ")
    };
    let stem = model
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let sidecar = crate::plan::sidecar_candidates(model)
        .first()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let npz = format!("{stem}.golden.npz");
    // The first line short: the build's context goes in front of it.
    let mut out: Vec<String> = vec![
        "no default validation inputs that the original model accepts.".into(),
        wrap(
            &format!(
                "ONNX Runtime (CPU, optimizations off) refused the {} shape sets tried ({listed}) over the dynamic axes: {axes_txt}",
                tried.len()
            ),
            "  ",
        ),
    ];
    if !tried.is_empty() {
        out.push(format!("ONNX Runtime: {}", quote(first)));
    }
    if tried.len() > 1 && last != first {
        out.push(format!("last: {}", quote(last)));
    }
    if let Some((label, why)) = tries.skipped.first() {
        out.push(wrap(
            &format!(
                "not run: {} shape sets, the first ({label}) because {why}",
                tries.skipped.len()
            ),
            "  ",
        ));
    }
    let arrays = if names.is_empty() {
        "x=…".to_string()
    } else {
        names
            .iter()
            .map(|n| {
                if n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !n.starts_with(|c: char| c.is_ascii_digit())
                {
                    format!("{n}=…")
                } else {
                    format!("**{{\"{n}\": …}}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push(
        "What helps: golden inputs, the inputs the model really takes, one array per input:".into(),
    );
    out.push(format!(
        "  {}",
        wrap(&format!("np.savez(\"{npz}\", {arrays})"), "      ")
    ));
    out.push(format!(
        "then either these lines in {sidecar} next to the model:"
    ));
    out.push("  [golden]".into());
    out.push(format!("  npz = \"{npz}\""));
    out.push(format!("or `--golden {npz}` on the command line."));
    let values = tried.iter().any(|t| about_values(&t.1));
    let sizes = tried.iter().any(|t| about_sizes(&t.1));
    if values {
        out.push(wrap(
            "A shape profile cannot help: ONNX Runtime refused the input values (an index or a count \
             read from them), not their sizes.",
            "  ",
        ));
    } else if sizes || tried.is_empty() {
        let example = if sigs.is_empty() {
            "`--opt-shapes NAME:1x…`".to_string()
        } else {
            format!(
                "`--opt-shapes {}` with sizes for N",
                sigs.iter()
                    .map(|(n, shape)| {
                        let dims: Vec<String> = shape
                            .iter()
                            .map(|&d| {
                                if d < 0 {
                                    "N".to_string()
                                } else {
                                    d.to_string()
                                }
                            })
                            .collect();
                        format!("{n}:{}", dims.join("x"))
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            )
        };
        out.push(wrap(
            &format!(
                "Or, as ONNX Runtime refused the sizes, a shape profile: {example}, or [profiles] in {sidecar}."
            ),
            "  ",
        ));
    }
    ValidateError::Invalid(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(input: &str, symbol: &str) -> Axis {
        Axis {
            input: input.into(),
            axis: 0,
            rank: 1,
            symbol: symbol.into(),
        }
    }

    fn lines_fit(msg: &str) {
        for l in msg.lines() {
            let quoted = l.starts_with("ONNX Runtime: ") || l.starts_with("last: ");
            assert!(quoted || l.chars().count() <= WIDTH, "too long: {l}");
        }
    }

    #[test]
    fn refusal_leads_with_golden_inputs_and_cuts_only_between_words() {
        let long = format!(
            "Non-zero status code returned while running Gather node. Name:'/Gather' Status Message: indices element out of data bounds, idx=40 must be within the inclusive range [-3,2] {}noteToCharIndexExpandedShape",
            "and more words ".repeat(30)
        );
        let tried = vec![
            ("every dynamic dimension 1".to_string(), long.clone()),
            ("batch 1, the rest 2".to_string(), long),
        ];
        let e = no_inputs(
            Path::new("/m/voice.onnx"),
            &[axis("durations", "n"), axis("phonemes", "n")],
            &[
                ("durations".into(), vec![-1]),
                ("phonemes".into(), vec![-1]),
            ],
            &["durations".into(), "phonemes".into(), "past.0.key".into()],
            &Tries {
                run: &tried,
                skipped: &[],
            },
        )
        .to_string();
        lines_fit(&e);
        for want in [
            "  np.savez(\"voice.golden.npz\", durations=…, phonemes=…, **{\"past.0.key\": …})",
            "voice.trtcache.toml",
            "  [golden]\n  npz = \"voice.golden.npz\"",
            "--golden voice.golden.npz",
            "A shape profile cannot help",
        ] {
            assert!(e.contains(want), "missing `{want}` in:\n{e}");
        }
        assert!(!e.contains("--opt-shapes"), "{e}");
        assert!(!e.contains("noteToChar"), "cut inside a word? {e}");
        let golden = e.find("What helps").unwrap();
        assert!(golden < e.find("cannot help").unwrap());
        // Every cut ends a word.
        for l in e.lines().filter(|l| l.ends_with('…')) {
            assert!(l.ends_with(" …"), "{l}");
        }
    }

    #[test]
    fn a_profile_is_suggested_when_the_sizes_were_refused() {
        let tried = vec![(
            "every dynamic dimension 1".to_string(),
            "Reshape: the input tensor cannot be reshaped to the requested shape".to_string(),
        )];
        let skipped = vec![(
            "batch 1, the rest 640".to_string(),
            "validation inputs need at least 3 bytes".to_string(),
        )];
        let e = no_inputs(
            Path::new("m.onnx"),
            &[axis("x", "n")],
            &[("x".into(), vec![-1])],
            &["x".into()],
            &Tries {
                run: &tried,
                skipped: &skipped,
            },
        )
        .to_string();
        lines_fit(&e);
        assert!(e.contains("--opt-shapes x:N"), "{e}");
        assert!(e.contains("not run: 1 shape sets"), "{e}");
        assert!(e.find("np.savez").unwrap() < e.find("--opt-shapes").unwrap());
    }

    #[test]
    fn quotes_cut_between_words() {
        let q = quote(&"word ".repeat(100));
        assert!(
            q.ends_with("word …") && q.chars().count() <= QUOTE + 2,
            "{q}"
        );
        assert_eq!(quote("short\nmessage"), "short message");
    }
}
