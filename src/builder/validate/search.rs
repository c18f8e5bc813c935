//! The default validation inputs' shape search: which shape sets to try, in which order,
//! for a model's dynamic axes (validation runs the original model on each until one works;
//! [`super::validate`]).
//!
//! Enters: the dynamic axes of the inputs (name, axis, rank, `dim_param`) and the sizes a
//! profile binds. Leaves: the [`Candidate`]s (one value per leaf dimension: a symbol name,
//! a part of an expression such as `past_sequence + sequence`, or an unnamed axis) and the
//! concrete shape of an input under one ([`shape_under`]).

use std::collections::BTreeMap;

use ort::value::{TensorElementType, ValueType};

/// One dynamic axis of a model input, as ONNX Runtime reports it.
#[derive(Clone, Debug)]
pub(super) struct Axis {
    pub(super) input: String,
    pub(super) axis: usize,
    /// The input's rank.
    pub(super) rank: usize,
    /// The `dim_param`, `""` when unnamed.
    pub(super) symbol: String,
}

/// A tensor input's element type, shape (`-1` dynamic) and symbols; sequences and optionals
/// by their contained tensor.
pub(super) fn tensor_of(vt: &ValueType) -> Option<(TensorElementType, Vec<i64>, Vec<String>)> {
    match vt {
        ValueType::Tensor {
            ty,
            shape,
            dimension_symbols,
        } => Some((
            *ty,
            shape.to_vec(),
            dimension_symbols.iter().map(|s| s.to_string()).collect(),
        )),
        ValueType::Optional(inner) | ValueType::Sequence(inner) => tensor_of(inner),
        ValueType::Map { .. } => None,
    }
}

/// The leaf an axis's size is: its symbol, or for an unnamed axis its own name
/// ([`unnamed`]).
pub(super) fn leaf_of(a: &Axis) -> String {
    if a.symbol.is_empty() {
        unnamed(a)
    } else {
        a.symbol.clone()
    }
}

/// The leaf names a symbol depends on: itself, or the identifiers of an arithmetic
/// expression such as `past_sequence + sequence` (as exporters name a KV cache's total
/// length).
pub(super) fn leaves(symbol: &str) -> Vec<String> {
    if !symbol.contains(['+', '-', '*', '/']) {
        return vec![symbol.to_string()];
    }
    symbol
        .split(['+', '-', '*', '/', '(', ')', ' '])
        .filter(|t| !t.is_empty() && t.parse::<i64>().is_err())
        .map(str::to_string)
        .collect()
}

/// Evaluates a symbol (a name or an expression of `+ - * /`, integers and names) with the
/// leaves' values; `None` when it does not parse.
pub(super) fn eval(symbol: &str, leaf: &BTreeMap<String, i64>) -> Option<i64> {
    if let Some(v) = leaf.get(symbol) {
        return Some(*v);
    }
    // Tokens, then + - over * / (left to right).
    let mut toks: Vec<String> = Vec::new();
    let mut cur = String::new();
    for c in symbol.chars() {
        if "+-*/()".contains(c) || c.is_whitespace() {
            if !cur.is_empty() {
                toks.push(std::mem::take(&mut cur));
            }
            if !c.is_whitespace() {
                toks.push(c.to_string());
            }
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        toks.push(cur);
    }
    fn expr(t: &[String], i: &mut usize, l: &BTreeMap<String, i64>) -> Option<i64> {
        let mut v = term(t, i, l)?;
        while let Some(op) = t.get(*i).map(String::as_str) {
            match op {
                "+" => {
                    *i += 1;
                    v = v.checked_add(term(t, i, l)?)?
                }
                "-" => {
                    *i += 1;
                    v = v.checked_sub(term(t, i, l)?)?
                }
                _ => break,
            }
        }
        Some(v)
    }
    fn term(t: &[String], i: &mut usize, l: &BTreeMap<String, i64>) -> Option<i64> {
        let mut v = atom(t, i, l)?;
        while let Some(op) = t.get(*i).map(String::as_str) {
            match op {
                "*" => {
                    *i += 1;
                    v = v.checked_mul(atom(t, i, l)?)?
                }
                "/" => {
                    *i += 1;
                    v = v.checked_div(atom(t, i, l)?)?
                }
                _ => break,
            }
        }
        Some(v)
    }
    fn atom(t: &[String], i: &mut usize, l: &BTreeMap<String, i64>) -> Option<i64> {
        let tok = t.get(*i)?;
        *i += 1;
        if tok == "(" {
            let v = expr(t, i, l)?;
            (t.get(*i)? == ")").then_some(())?;
            *i += 1;
            return Some(v);
        }
        tok.parse::<i64>().ok().or_else(|| l.get(tok).copied())
    }
    let mut i = 0;
    let v = expr(&toks, &mut i, leaf)?;
    (i == toks.len()).then_some(v)
}

/// The leaves that name batch axes (kept at 1 while the other sizes grow): by name
/// (`batch…`), or because every axis they name is the first of an input of rank 2
/// or more (exporters that number their symbols, `s18`, name a batch only by position).
pub(super) fn batch_leaves(axes: &[Axis]) -> std::collections::BTreeSet<String> {
    // A rank-1 input whose only axis shares its symbol with axis 0 of a larger input is the
    // batch too (diffusers' `timestep: [batch]` beside `sample: [batch, 4, h, w]`).
    let leading: std::collections::BTreeSet<&str> = axes
        .iter()
        .filter(|a| a.axis == 0 && a.rank >= 2 && !a.symbol.is_empty())
        .map(|a| a.symbol.as_str())
        .collect();
    let mut first: BTreeMap<String, bool> = BTreeMap::new();
    for a in axes {
        let at0 = a.axis == 0 && (a.rank >= 2 || leading.contains(a.symbol.as_str()));
        if a.symbol.is_empty() {
            first.insert(unnamed(a), at0);
        } else if leaves(&a.symbol) == [a.symbol.clone()] {
            *first.entry(a.symbol.clone()).or_insert(true) &= at0;
        } else {
            for l in leaves(&a.symbol) {
                first.insert(l, false);
            }
        }
    }
    first
        .into_iter()
        .filter(|(l, at0)| *at0 || l.to_ascii_lowercase().contains("batch"))
        .map(|(l, _)| l)
        .collect()
}

/// Whether a leaf names a cache length that may be empty (`past_sequence_length`,
/// `past_len`, `cache_length`, …). A cache's other sizes are not lengths: genai's
/// `kv_cache_dim` is a head size, which an empty cache does not make 0.
pub(super) fn past_like(leaf: &str) -> bool {
    let l = leaf.to_ascii_lowercase();
    (l.contains("past") || l.contains("cache"))
        && !["dim", "head", "hidden", "width", "channel"]
            .iter()
            .any(|w| l.contains(w))
}

/// A total length that must be the cache's plus the new tokens' (onnxruntime-genai's
/// `total_sequence_length`, the attention mask's width, which GroupQueryAttention reads as
/// past + sequence): `(total, past, sequence)` leaves when all three are there.
fn total_parts<'a>(leaves: impl Iterator<Item = &'a String> + Clone) -> Option<[String; 3]> {
    let lower = |l: &String| l.to_ascii_lowercase();
    let total = leaves.clone().find(|l| {
        let l = lower(l);
        l.contains("total") && (l.contains("seq") || l.contains("len"))
    })?;
    let past = leaves
        .clone()
        .find(|l| past_like(l) && (lower(l).contains("seq") || lower(l).contains("len")))?;
    let seq = leaves.clone().find(|l| {
        let l2 = lower(l);
        *l != total
            && !past_like(l)
            && !l2.contains("encoder")
            && (l2.contains("seq") || l2 == "len" || l2.ends_with("_len"))
    })?;
    Some([total.clone(), past.clone(), seq.clone()])
}

/// The leaf of an unnamed dynamic axis: its own, one per input and axis.
pub(super) fn unnamed(a: &Axis) -> String {
    format!("{}[{}]", a.input, a.axis)
}

/// Sizes the bounded search tries for the non-batch leaves, after all-ones: powers of two
/// (strided vision models need multiples of their stride, 32 for YOLO) and the common image
/// sides.
pub(super) const SEARCH_SIZES: [i64; 11] = [2, 4, 8, 16, 32, 64, 128, 224, 256, 320, 640];

/// One candidate of the default search: a value per leaf, and a label for messages.
pub(super) struct Candidate {
    pub(super) label: String,
    pub(super) leaf: BTreeMap<String, i64>,
    /// One of the realistic sizes tried first ([`REALISTIC_MAX_BYTES`] bounds them).
    pub(super) realistic: bool,
}

/// Most bytes of random inputs a realistic candidate may take (larger ones are skipped, and
/// the search goes on from the small sizes): validation runs on every build.
pub(super) const REALISTIC_MAX_BYTES: u64 = 64 << 20;

/// The realistic sizes tried before the degenerate ones: a batch of 2, sequences of 16,
/// image sides (the free axes after the first of a rank-4 or larger input) of 32, cache
/// lengths of 8. A model validated on a 1×1 image or one token validates little (a
/// quantized model's int8 path matched exactly on a 1×1 image and was 2.7e-3 off on a real
/// one).
#[rustfmt::skip]
const REALISTIC: [(&str, i64, i64, i64, i64); 4] = [
    ("batch 2, sequences 16, image sides 32, cache lengths 8", 2, 16, 32, 8),
    ("batch 2, every other dimension 16, cache lengths 8", 2, 16, 16, 8),
    ("batch 1, every other dimension 16, cache lengths 8", 1, 16, 16, 8),
    ("batch 1, every other dimension 16, cache lengths 0", 1, 16, 16, 0),
];

/// The candidates of the default validation-input search, in order: the realistic sizes
/// ([`REALISTIC`]; the search falls back to the rest when the model refuses them); every leaf 1 (the
/// profile's opt shapes bind the leaves of the inputs they name); cache lengths 0; then the
/// bounded sizes for every non-batch leaf, with cache lengths 0 and as they are; then the
/// sizes the graph records (`recorded`) for every non-batch leaf; one leaf at a time; every
/// axis at once.
pub(super) fn candidates(
    axes: &[Axis],
    bound: &BTreeMap<String, i64>,
    recorded: &[i64],
) -> Vec<Candidate> {
    let batch = batch_leaves(axes);
    let batch_like = |l: &str, _: &Axis| batch.contains(l);
    let mut leaf_axes: BTreeMap<String, &Axis> = BTreeMap::new();
    for a in axes {
        if a.symbol.is_empty() {
            leaf_axes.insert(unnamed(a), a);
        } else {
            for l in leaves(&a.symbol) {
                leaf_axes.entry(l).or_insert(a);
            }
        }
    }
    let total = total_parts(leaf_axes.keys()).filter(|[t, ..]| !bound.contains_key(t));
    let mut out: Vec<Candidate> = Vec::new();
    let mut push = |label: String, f: &dyn Fn(&str, &Axis) -> i64| {
        let mut leaf: BTreeMap<String, i64> = leaf_axes
            .iter()
            .map(|(l, a)| (l.clone(), bound.get(l).copied().unwrap_or_else(|| f(l, a))))
            .collect();
        if let Some([t, p, q]) = &total {
            let v = leaf[p].saturating_add(leaf[q]);
            leaf.insert(t.clone(), v);
        }
        let realistic = label.starts_with("realistic: ");
        // A realistic set is skipped for its size where a plain one is not, so the two are
        // kept apart (the search runs a set once: `inputs::reference_inputs`); one no larger
        // than ones is no realistic set.
        if realistic && leaf.values().all(|&v| v <= 1) {
            return;
        }
        if !out
            .iter()
            .any(|c| c.leaf == leaf && c.realistic == realistic)
        {
            out.push(Candidate {
                label,
                leaf,
                realistic,
            });
        }
    };
    // Leaves some axis of which is an image side.
    let sides: std::collections::BTreeSet<String> = axes
        .iter()
        .filter(|a| a.rank >= 4 && a.axis >= 1)
        .flat_map(|a| {
            if a.symbol.is_empty() {
                vec![unnamed(a)]
            } else {
                leaves(&a.symbol)
            }
        })
        .collect();
    for (label, b, seq, side, past) in REALISTIC {
        push(format!("realistic: {label}"), &|l, a| {
            if batch_like(l, a) {
                b
            } else if past_like(l) {
                past
            } else if sides.contains(l) {
                side
            } else {
                seq
            }
        });
    }
    push("every dynamic dimension 1".into(), &|_, _| 1);
    push("cache lengths 0, the rest 1".into(), &|l, _| {
        if past_like(l) {
            0
        } else {
            1
        }
    });
    for s in SEARCH_SIZES {
        push(
            format!("batch 1, cache lengths 0, the rest {s}"),
            &|l, a| {
                if batch_like(l, a) {
                    1
                } else if past_like(l) {
                    0
                } else {
                    s
                }
            },
        );
        push(format!("batch 1, the rest {s}"), &|l, a| {
            if batch_like(l, a) {
                1
            } else {
                s
            }
        });
    }
    // Sizes the graph records in the shapes it builds (`pins::recorded`: an exporter
    // that kept a traced sequence length in a Reshape), for every non-batch dimension.
    for &s in recorded {
        push(
            format!("batch 1, the rest {s} (a size the graph's shapes record)"),
            &|l, a| {
                if batch_like(l, a) {
                    1
                } else if past_like(l) {
                    0
                } else {
                    s
                }
            },
        );
    }
    // One non-batch dimension at a time (axes that must agree, such as a batch named
    // differently or not at all in two inputs, stay at 1 together).
    let names: Vec<String> = leaf_axes
        .keys()
        .filter(|l| !batch.contains(*l))
        .cloned()
        .collect();
    for s in SEARCH_SIZES {
        for one in &names {
            push(format!("{one} {s}, the rest 1"), &|l, _| {
                if l == one {
                    s
                } else {
                    1
                }
            });
        }
    }
    // Every axis the same size, batches included: an axis 0 that is not a batch (madmom's
    // `[time, features]`, where convolutions need more frames than their kernel).
    for s in SEARCH_SIZES {
        push(format!("every axis {s}, batches too"), &|l, _| {
            if past_like(l) {
                0
            } else {
                s
            }
        });
    }
    out.truncate(MAX_CANDIDATES);
    out
}

/// At most this many shape sets are tried (each is one run of the original model).
pub const MAX_CANDIDATES: usize = 100;

/// The concrete shape of `input` under a candidate (`None`: a symbol did not evaluate, or
/// came out negative).
pub(super) fn shape_under(
    name: &str,
    shape: &[i64],
    symbols: &[String],
    leaf: &BTreeMap<String, i64>,
) -> Option<Vec<i64>> {
    shape
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if d >= 0 {
                return Some(d);
            }
            let sym = symbols.get(i).map(String::as_str).unwrap_or("");
            let v = if sym.is_empty() {
                leaf.get(&format!("{name}[{i}]")).copied()
            } else {
                eval(sym, leaf)
            }?;
            (v >= 0).then_some(v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_and_expressions_evaluate_from_shared_leaves() {
        let l: BTreeMap<String, i64> = [("past".into(), 3), ("seq".into(), 2)].into();
        assert_eq!(eval("past", &l), Some(3));
        assert_eq!(eval("past + seq", &l), Some(5));
        assert_eq!(eval("past+seq", &l), Some(5));
        assert_eq!(eval("2*seq - 1", &l), Some(3));
        assert_eq!(eval("(past + seq) * 2", &l), Some(10));
        assert_eq!(eval("other", &l), None);
        assert_eq!(eval("past +", &l), None);
        assert_eq!(
            leaves("past_sequence + sequence"),
            ["past_sequence", "sequence"]
        );
        assert_eq!(leaves("batch"), ["batch"]);
    }

    fn axis(input: &str, axis: usize, symbol: &str) -> Axis {
        Axis {
            input: input.into(),
            axis,
            rank: 4,
            symbol: symbol.into(),
        }
    }

    #[test]
    fn numbered_symbols_at_axis_0_are_batches() {
        // torch.onnx.export(dynamo=True) with Dim.AUTO: GPT-2 with past key values.
        let mut axes = [
            axis("input_ids", 0, "s18"),
            axis("input_ids", 1, "s70"),
            axis("attention_mask", 0, "s43"),
            axis("attention_mask", 1, "s53"),
            axis("past", 0, "s18"),
            axis("past", 2, "s58"),
        ];
        for a in &mut axes[..4] {
            a.rank = 2;
        }
        let b = batch_leaves(&axes);
        assert_eq!(b.into_iter().collect::<Vec<_>>(), ["s18", "s43"]);
        let c = candidates(&axes, &BTreeMap::new(), &[]);
        // Batches stay 1 until the last candidates, which grow every axis alike.
        // The realistic sizes first: a batch of 2 where the model takes it.
        assert!(c[0].realistic && c[0].leaf["s18"] == 2 && c[0].leaf["s70"] == 16);
        let (kept, every): (Vec<&Candidate>, Vec<&Candidate>) = c
            .iter()
            .filter(|c| !c.realistic)
            .partition(|c| !c.label.starts_with("every axis "));
        assert!(kept
            .iter()
            .all(|c| c.leaf["s18"] == 1 && c.leaf["s43"] == 1));
        assert!(every
            .iter()
            .any(|c| c.leaf["s18"] == 8 && c.leaf["s70"] == 8));
        let first = c
            .iter()
            .position(|c| c.label.starts_with("every axis "))
            .expect("every-axis candidates");
        assert!(c[first..]
            .iter()
            .all(|c| c.label.starts_with("every axis ")));
        // The mask one longer than ids + past: total = past + sequence.
        assert!(c
            .iter()
            .any(|c| c.leaf["s53"] == 2 && c.leaf["s70"] == 1 && c.leaf["s58"] == 1));
    }

    #[test]
    fn fixed_inputs_get_one_plain_set_and_a_lone_batch_no_realistic_one_of_ones() {
        // No dynamic axis: one set, not a realistic one (those are skipped over 64 MiB).
        let c = candidates(&[], &BTreeMap::new(), &[]);
        assert_eq!(c.len(), 1);
        assert!(!c[0].realistic && c[0].leaf.is_empty());
        // Only a batch: realistic at 2; the ones set stays a plain one.
        let mut b = axis("x", 0, "batch");
        b.rank = 2;
        let c = candidates(&[b], &BTreeMap::new(), &[]);
        assert!(c[0].realistic && c[0].leaf["batch"] == 2);
        let ones = c.iter().find(|c| c.leaf["batch"] == 1).expect("ones");
        assert!(!ones.realistic);
    }

    #[test]
    fn a_rank_1_input_sharing_the_leading_symbol_is_a_batch() {
        // diffusers' UNet through torch.onnx.export(dynamo=True): timestep [s0] beside
        // sample [s0, 4, s1, s1]; an unrelated rank-1 input stays a free axis.
        let mut timestep = axis("timestep", 0, "s0");
        timestep.rank = 1;
        let mut lengths = axis("lengths", 0, "n");
        lengths.rank = 1;
        let axes = [
            axis("sample", 0, "s0"),
            axis("sample", 2, "s1"),
            timestep,
            lengths,
        ];
        let b = batch_leaves(&axes);
        assert_eq!(b.into_iter().collect::<Vec<_>>(), ["s0"]);
        let c = candidates(&axes, &BTreeMap::new(), &[]);
        let at8 = c.iter().find(|c| c.leaf["s1"] == 8).expect("8 is tried");
        assert_eq!((at8.leaf["s0"], at8.leaf["n"]), (1, 8));
    }

    #[test]
    fn cache_sizes_that_are_not_lengths_and_total_lengths() {
        // onnxruntime-genai: past [batch, kv_heads, past_sequence_length, kv_cache_dim],
        // attention_mask [batch, total_sequence_length] read by GroupQueryAttention as past +
        // sequence.
        assert!(past_like("past_sequence_length"));
        assert!(past_like("past_len"));
        assert!(past_like("cache_length"));
        assert!(!past_like("kv_cache_dim"));
        assert!(!past_like("past_head_size"));
        let axes = [
            axis("input_ids", 0, "batch_size"),
            axis("input_ids", 1, "sequence_length"),
            axis("attention_mask", 0, "batch_size"),
            axis("attention_mask", 1, "total_sequence_length"),
            axis("past", 0, "batch_size"),
            axis("past", 2, "past_sequence_length"),
            axis("past", 3, "kv_cache_dim"),
        ];
        let c = candidates(&axes, &BTreeMap::new(), &[]);
        for c in &c {
            assert_eq!(
                c.leaf["total_sequence_length"],
                c.leaf["past_sequence_length"] + c.leaf["sequence_length"],
                "{}",
                c.label
            );
        }
        let zero = c
            .iter()
            .find(|c| c.leaf["sequence_length"] == 16 && c.leaf["past_sequence_length"] == 0)
            .expect("16 with an empty cache");
        assert_eq!(
            (zero.leaf["kv_cache_dim"], zero.leaf["past_sequence_length"]),
            (16, 0)
        );
        // A profile that binds the total keeps it.
        let bound: BTreeMap<String, i64> = [("total_sequence_length".into(), 7)].into();
        assert!(candidates(&axes, &bound, &[])
            .iter()
            .all(|c| c.leaf["total_sequence_length"] == 7));
    }

    #[test]
    fn candidates_start_at_ones_then_search_non_batch_sizes() {
        let mut axes = [
            axis("images", 0, "batch"),
            axis("images", 2, "height"),
            axis("images", 3, "width"),
            axis("mask", 1, "past + seq"),
            axis("x", 1, ""),
        ];
        axes[3].rank = 2;
        let all = candidates(&axes, &BTreeMap::new(), &[]);
        // Realistic sizes first: batch 2, image sides 32, sequences 16, cache lengths 8.
        assert!(all[0].realistic);
        assert_eq!(
            (
                all[0].leaf["batch"],
                all[0].leaf["height"],
                all[0].leaf["seq"],
                all[0].leaf["past"]
            ),
            (2, 32, 16, 8)
        );
        let ones = all.iter().position(|c| !c.realistic).unwrap();
        let c = &all[ones..];
        assert_eq!(c[0].leaf.values().copied().collect::<Vec<_>>(), [1; 6]);
        assert_eq!(c[1].leaf["past"], 0);
        assert_eq!(c[1].leaf["seq"], 1);
        let at32 = c
            .iter()
            .find(|c| c.leaf["height"] == 32)
            .expect("32 is tried");
        assert_eq!(
            (at32.leaf["batch"], at32.leaf["width"], at32.leaf["x[1]"]),
            (1, 32, 32)
        );
        // Bounded, no duplicates.
        assert!(c.len() <= MAX_CANDIDATES);
        assert!(
            c.iter()
                .any(|c| c.leaf["x[1]"] == 256 && c.leaf["height"] == 1),
            "one axis at a time"
        );
        for (i, a) in c.iter().enumerate() {
            assert!(c[..i].iter().all(|b| b.leaf != a.leaf));
        }
        // A profile-bound symbol keeps its size in every candidate.
        let bound: BTreeMap<String, i64> = [("height".into(), 480)].into();
        assert!(candidates(&axes, &bound, &[])
            .iter()
            .all(|c| c.leaf["height"] == 480));
        // Shared names give one size to every input that uses them.
        let s = shape_under(
            "mask",
            &[1, -1],
            &["".into(), "past + seq".into()],
            &c[1].leaf,
        );
        assert_eq!(s, Some(vec![1, 1]));
        let s = shape_under("x", &[-1, -1], &["n".into(), "".into()], &at32.leaf);
        assert_eq!(s, None, "an unknown symbol gives no shape");
    }
}
