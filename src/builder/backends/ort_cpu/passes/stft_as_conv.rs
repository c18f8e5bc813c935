//! **`stft-as-conv`**: An `STFT` (opset 17) of a real float32 signal (`[batch, length]` or
//! `[batch, length, 1]`) whose step is a constant and whose window (or frame length) is a
//! constant of at most [`MAX_STFT_FRAME`] samples, and at most [`MAX_FFT_FRAME`] when that
//! is a power of two, becomes `Reshape → Conv → Transpose →
//! Reshape`: a 1-D convolution with stride = step whose `2·bins` filters are the window
//! times the DFT's cosines and negated sines, interleaved (bin k's real part, then its
//! imaginary part), so that swapping the Conv's channel and frame axes lays each frame out
//! as STFT's `[bins, 2]` (a plain 3-D transpose: the 4-D one a planar order needs took as
//! long as the Conv). Why: ONNX Runtime 1.31 takes a direct DFT in float32 for a frame that
//! is not a power of two (Whisper's 400-sample frame), which the Conv beats by an order of
//! magnitude, and a radix-2 FFT for one that is, which the Conv beats up to
//! [`MAX_FFT_FRAME`] samples and not beyond (the timings: BENCHMARKS.md, "Time to first inference, real-world models"). Signals of unknown rank or
//! type, complex signals, windows or steps computed at run time or stored outside the graph,
//! and STFTs inside control-flow bodies are left alone.

use std::collections::HashSet;

use bytes::Bytes;

use super::graph::{floats, int, ints, node, scalar_int, std_opset, tensor_i64, Names};
use crate::analysis::facts::SymDim;
use crate::onnx::proto::{ModelProto, NodeProto, TensorProto};
use crate::onnx::ElemType;

/// Largest frame (window) length rewritten: the Conv's weights are `2·(n/2+1)·n` floats
/// (16 MiB at 2,048); longer frames are rare and their direct DFT is left to ONNX Runtime.
pub const MAX_STFT_FRAME: usize = 2048;

/// Largest power-of-two frame rewritten: ONNX Runtime's FFT is faster beyond it.
pub const MAX_FFT_FRAME: usize = 1024;

/// What a validation report says it compared against when it used [`exact_reference`].
pub const EXACT_REFERENCE: &str =
    "the model with its rewritten STFTs computed in float64 (ONNX Runtime's float32 STFT is less exact than the rewrite)";

/// One STFT the rewrite takes, with its constants read.
struct Stft {
    /// Index of the node in the top-level graph.
    node: usize,
    signal: String,
    /// The window's values (ones for a frame length without a window).
    window: Vec<f32>,
    step: i64,
    onesided: bool,
    output: String,
}

/// `proto` with every STFT it can take rewritten as a Conv (one line each in `applied`);
/// `None` when there is none.
pub(super) fn stft_as_conv(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    let found = stfts(proto);
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = Names::of(graph);
    let first = applied.len();
    // Back to front, so the indices of the ones still to do stay valid.
    for s in found.iter().rev() {
        let n = s.window.len();
        let bins = if s.onesided { n / 2 + 1 } else { n };
        let p = names.prefix(&s.output);
        let (shape_in, weights, shape_out) = (
            format!("{p}_shape_in"),
            format!("{p}_basis"),
            format!("{p}_shape_out"),
        );
        let (framed, conv, split) = (
            format!("{p}_signal"),
            format!("{p}_conv"),
            format!("{p}_frames"),
        );
        graph.initializer.push(tensor_i64(&shape_in, &[0, 1, -1]));
        graph
            .initializer
            .push(tensor_i64(&shape_out, &[0, 0, bins as i64, 2]));
        graph.initializer.push(dft_basis(&weights, &s.window, bins));
        let nodes = vec![
            // [batch, length] or [batch, length, 1] → [batch, 1, length]
            node("Reshape", &[&s.signal, &shape_in], &framed, vec![]),
            // → [batch, 2·bins, frames]
            node(
                "Conv",
                &[&framed, &weights],
                &conv,
                vec![
                    ints("kernel_shape", &[n as i64]),
                    ints("strides", &[s.step]),
                ],
            ),
            // → [batch, frames, 2·bins] → [batch, frames, bins, 2]
            node(
                "Transpose",
                &[&conv],
                &split,
                vec![ints("perm", &[0, 2, 1])],
            ),
            node("Reshape", &[&split, &shape_out], &s.output, vec![]),
        ];
        graph.node.splice(s.node..=s.node, nodes);
        applied.push(format!(
            "stft-as-conv: STFT `{}` (frame {n}, step {}, {bins} bins) as a Conv",
            s.output, s.step
        ));
    }
    applied[first..].reverse();
    Some(model)
}

/// The model with every STFT that [`apply`] rewrites computed in float64 instead (its signal
/// and window cast to double, the result cast back), or `None` when there is none. The
/// validation compares a rewritten artifact with this when it misses the tolerance against
/// the model as given: ONNX Runtime's float32 direct DFT is itself off by up to 3·10⁻⁵ of the
/// spectrum's peak (1.4·10⁻³ on a 400-sample frame of unit noise, against 2·10⁻⁵ for the
/// Conv, both measured against numpy's float64 FFT), which a log-mel front end turns into
/// differences of 10⁻³ that are ONNX Runtime's error, not the artifact's.
pub fn exact_reference(proto: &ModelProto) -> Option<ModelProto> {
    let found = stfts(proto);
    if found.is_empty() {
        return None;
    }
    let mut model = proto.clone();
    let graph = model.graph.as_mut()?;
    let mut names = Names::of(graph);
    for s in found.iter().rev() {
        let p = names.prefix(&s.output);
        let old = graph.node[s.node].clone();
        let to = |name: &str, to: ElemType, out: &str| {
            node("Cast", &[name], out, vec![int("to", to.code() as i64)])
        };
        let mut nodes = vec![to(&s.signal, ElemType::Float64, &format!("{p}_signal64"))];
        let mut stft = old.clone();
        stft.name = format!("{p}_stft64");
        stft.input[0] = format!("{p}_signal64");
        if let Some(w) = old.input.get(2).filter(|w| !w.is_empty()) {
            nodes.push(to(w, ElemType::Float64, &format!("{p}_window64")));
            stft.input[2] = format!("{p}_window64");
        }
        stft.output[0] = format!("{p}_spectrum64");
        nodes.push(stft);
        nodes.push(to(&format!("{p}_spectrum64"), ElemType::Float32, &s.output));
        graph.node.splice(s.node..=s.node, nodes);
    }
    Some(model)
}

/// The top-level STFTs [`apply`] can take, in graph order.
fn stfts(proto: &ModelProto) -> Vec<Stft> {
    let Some(g) = proto.graph.as_ref() else {
        return Vec::new();
    };
    let opset = std_opset(proto);
    let is_stft =
        |n: &NodeProto| n.op_type == "STFT" && matches!(n.domain.as_str(), "" | "ai.onnx");
    if opset < 17 || !g.node.iter().any(is_stft) {
        return Vec::new();
    }
    // Shapes and types of the signals: the analysis's propagation, which never guesses.
    let view = crate::onnx::Graph::new(g);
    let (order, _) = crate::analysis::partition::topo_order(&view);
    let facts = crate::analysis::shapes::propagate(&view, &order, None, opset);
    let inputs: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    // Initializers a caller cannot override (an IR < 4 model lists them as inputs too; the
    // build drops those inputs before it gets here).
    let constant = |name: &str| {
        if inputs.contains(name) {
            return None;
        }
        g.initializer
            .iter()
            .rev()
            .find(|t| t.name == name && t.external_data.is_empty())
    };
    let mut out = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        if !is_stft(n) || n.output.first().is_none_or(|o| o.is_empty()) || n.output.len() != 1 {
            continue;
        }
        let arg = |k: usize| n.input.get(k).map(String::as_str).filter(|s| !s.is_empty());
        let Some(signal) = arg(0) else { continue };
        let real_f32 = facts.get(signal).is_some_and(|t| {
            t.dtype == Some(ElemType::Float32)
                && match t.shape.as_deref() {
                    Some([_, _]) => true,
                    Some([_, _, last]) => *last == SymDim::Known(1),
                    _ => false,
                }
        });
        if !real_f32 {
            continue;
        }
        let Some(step) = arg(1)
            .and_then(constant)
            .and_then(scalar_int)
            .filter(|&s| s > 0)
        else {
            continue;
        };
        let window = arg(2).map(|w| constant(w).and_then(floats));
        let frame = arg(3).map(|f| constant(f).and_then(scalar_int));
        let window = match (window, frame) {
            (Some(Some(w)), None) => w,
            (Some(Some(w)), Some(Some(f))) if f == w.len() as i64 => w,
            (None, Some(Some(f))) if f > 0 && f as usize <= MAX_STFT_FRAME => vec![1.0; f as usize],
            _ => continue,
        };
        let len = window.len();
        if !(2..=MAX_STFT_FRAME).contains(&len) || len.is_power_of_two() && len > MAX_FFT_FRAME {
            continue;
        }
        let onesided = crate::onnx::attr::int(n, "onesided").unwrap_or(1) != 0;
        out.push(Stft {
            node: i,
            signal: signal.to_string(),
            window,
            step,
            onesided,
            output: n.output[0].clone(),
        });
    }
    out
}

/// The Conv's weights `[2·bins, 1, n]`: row `2k` is `window[t]·cos(2πkt/n)`, row `2k + 1`
/// is `−window[t]·sin(2πkt/n)` (the DFT's `e^{−2πikt/n}`), computed in float64 with `k·t`
/// reduced modulo `n` so every angle is exact before it is rounded.
fn dft_basis(name: &str, window: &[f32], bins: usize) -> TensorProto {
    let n = window.len();
    let mut raw = Vec::with_capacity(2 * bins * n * 4);
    for k in 0..bins {
        for part in 0..2 {
            for (t, &w) in window.iter().enumerate() {
                let angle = std::f64::consts::TAU * ((k * t) % n) as f64 / n as f64;
                let v = if part == 0 {
                    f64::from(w) * angle.cos()
                } else {
                    -f64::from(w) * angle.sin()
                };
                raw.extend_from_slice(&(v as f32).to_le_bytes());
            }
        }
    }
    TensorProto {
        name: name.into(),
        dims: vec![2 * bins as i64, 1, n as i64],
        data_type: ElemType::Float32.code(),
        raw_data: Bytes::from(raw),
        ..Default::default()
    }
}
