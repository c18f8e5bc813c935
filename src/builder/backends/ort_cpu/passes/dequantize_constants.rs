//! **`dequantize-constants`**: the saved `ort-cpu` graph's `DequantizeLinear`s whose every
//! input is a constant become the float32 constants they compute. A QDQ model (what
//! `quantize_static` writes by default, and what TensorRT takes) wraps each weight in a
//! `DequantizeLinear`; ONNX Runtime fuses the pattern into an integer kernel where it has one
//! (`QLinearConv`, `QGemm`) and otherwise leaves `DequantizeLinear → Conv` in float, and then
//! dequantizes the weights again on every run (ResNet-18 through `quantize_static`: most of
//! its weight `DequantizeLinear`s left, about half of a run spent in them, and the float
//! weights written afresh on each of the first two runs of a saved graph, ORT's memory pattern
//! allocating them anew on the second; the numbers: BENCHMARKS.md, "Time to first inference, real-world models"). This runs after ONNX Runtime's
//! optimization, on what it left, so every fusion it made stays; each folded value is
//! computed as ORT's kernel computes it, `float(x − x_zp) · scale` (per tensor or per axis),
//! so the artifact's outputs are the model's, bit for bit.
//!
//! The float weights take four times the bytes of the int8 ones they replace. Large ones are
//! appended to the artifact's data file (aligned to 4 KiB, so ONNX Runtime maps them), where
//! they are file pages shared between consumer processes instead of each session's private
//! dequantized copy; the int8 originals stay in the file, unreferenced (ORT's prepacked
//! weights share it, so it is not rewritten). `--no-rewrite` leaves the graph as ORT saved it.
//!
//! Left alone: blocked quantization (`block_size`), a non-float32 scale or output, an input
//! stored with keys this module does not know (ORT's prepacked entries), a value that is a
//! graph output, `DequantizeLinear`s in control-flow bodies, and any other domain's.
//!
//! Enters: the saved graph and its data file, in the staging directory. Leaves: both with
//! the constants folded, and one line for the validation report; `None` when there was
//! nothing to fold. The caller restores both when ONNX Runtime refuses the result.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;

use super::graph::{decode_ints, inline_floats, inline_ints, int_width};
use crate::onnx::load::{external_ref, numel};
use crate::onnx::proto::{
    DataLocation, GraphProto, ModelProto, NodeProto, StringStringEntryProto, TensorProto,
};
use crate::onnx::ElemType;

/// What this rewrite is called in the key and the report.
pub const NAME: &str = "dequantize-constants";

/// Alignment of the float constants appended to the data file (a page: ORT maps aligned ones).
const ALIGN: u64 = 4096;

/// One `DequantizeLinear` to fold: its node index and the float32 values of its output.
struct Fold {
    node: usize,
    output: String,
    dims: Vec<i64>,
    values: Vec<f32>,
}

/// Folds the constant `DequantizeLinear`s of `proto` (the graph saved at `dir/<entry>`, its
/// data file `dir/<data>`). Large results (at least `min_external` bytes) are appended to the
/// data file, created if need be; the others stay inline. Returns the report's line, or
/// `None` when nothing folds (nothing written then). An error is the data file's.
pub fn fold(
    proto: &mut ModelProto,
    dir: &Path,
    data: &str,
    min_external: usize,
) -> std::io::Result<Option<String>> {
    let Some(g) = proto.graph.as_ref() else {
        return Ok(None);
    };
    let folds = find(g, dir);
    if folds.is_empty() {
        return Ok(None);
    }
    let path = dir.join(data);
    let count = folds.len();
    let mut bytes_out = 0u64;
    let mut file = None;
    let graph = proto.graph.as_mut().expect("checked above");
    let mut drop_nodes = HashSet::new();
    let mut quantized: HashSet<String> = HashSet::new();
    for f in folds {
        quantized.extend(graph.node[f.node].input.iter().cloned());
        let raw: Vec<u8> = f.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut t = TensorProto {
            name: f.output,
            dims: f.dims,
            data_type: ElemType::Float32.code(),
            ..Default::default()
        };
        if raw.len() >= min_external {
            if file.is_none() {
                file = Some(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)?,
                );
            }
            let fh = file.as_mut().expect("opened above");
            let end = fh.metadata()?.len();
            let offset = end.div_ceil(ALIGN) * ALIGN;
            fh.write_all(&vec![0u8; (offset - end) as usize])?;
            fh.write_all(&raw)?;
            t.data_location = DataLocation::External as i32;
            t.external_data = [
                ("location", data.to_string()),
                ("offset", offset.to_string()),
                ("length", raw.len().to_string()),
            ]
            .into_iter()
            .map(|(key, value)| StringStringEntryProto {
                key: key.into(),
                value,
            })
            .collect();
            bytes_out += raw.len() as u64;
        } else {
            bytes_out += raw.len() as u64;
            t.raw_data = Bytes::from(raw);
        }
        graph.initializer.push(t);
        drop_nodes.insert(f.node);
    }
    if let Some(fh) = file {
        fh.sync_all()?;
    }
    let mut k = 0;
    graph.node.retain(|_| {
        k += 1;
        !drop_nodes.contains(&(k - 1))
    });
    // The quantized constants no node reads any more.
    let read = read_names(graph);
    graph
        .initializer
        .retain(|t| !quantized.contains(&t.name) || read.contains(&t.name));
    tracing::info!(count, bytes_out, "folded constant DequantizeLinear");
    Ok(Some(format!(
        "{NAME}: {count} DequantizeLinear of constants ONNX Runtime left unfused given as the float32 weights they compute ({})",
        size(bytes_out)
    )))
}

/// `n` bytes, rounded up to KiB or MiB.
fn size(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n.div_ceil(1 << 20))
    } else {
        format!("{} KiB", n.div_ceil(1 << 10))
    }
}

/// The top-level `DequantizeLinear`s whose inputs are all constants this module can read.
fn find(g: &GraphProto, dir: &Path) -> Vec<Fold> {
    let inputs: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    let outputs: HashSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    let init: HashMap<&str, &TensorProto> = g
        .initializer
        .iter()
        .filter(|t| !inputs.contains(t.name.as_str()))
        .map(|t| (t.name.as_str(), t))
        .collect();
    let mut found = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        if !matches!(n.domain.as_str(), "" | "ai.onnx")
            || n.op_type != "DequantizeLinear"
            || n.output.len() != 1
            || outputs.contains(n.output[0].as_str())
        {
            continue;
        }
        if let Some((dims, values)) = dequantize(n, &init, dir) {
            found.push(Fold {
                node: i,
                output: n.output[0].clone(),
                dims,
                values,
            });
        }
    }
    found
}

/// What `n` computes from its constant inputs, as ONNX Runtime's kernel computes it.
fn dequantize(
    n: &NodeProto,
    init: &HashMap<&str, &TensorProto>,
    dir: &Path,
) -> Option<(Vec<i64>, Vec<f32>)> {
    use crate::onnx::attr;
    if attr::int(n, "block_size").unwrap_or(0) != 0
        || attr::int(n, "output_dtype").is_some_and(|t| t != ElemType::Float32.code() as i64)
    {
        return None;
    }
    let input = |k: usize| n.input.get(k).filter(|s| !s.is_empty());
    let x = *init.get(input(0)?.as_str())?;
    let scale = *init.get(input(1)?.as_str())?;
    if ElemType::from_code(scale.data_type) != ElemType::Float32 {
        return None;
    }
    let xs = ints(x, dir)?;
    let scales = floats(scale, dir)?;
    let zeros = match input(2) {
        None => vec![0; scales.len()],
        Some(z) => {
            let z = *init.get(z.as_str())?;
            // ONNX asks for the scale's shape; ORT also takes a scalar against a `[1]`.
            if z.data_type != x.data_type || (z.dims != scale.dims && scales.len() != 1) {
                return None;
            }
            ints(z, dir)?
        }
    };
    if zeros.len() != scales.len() || scales.is_empty() {
        return None;
    }
    let values: Vec<f32> = if scales.len() == 1 && scale.dims.len() <= 1 {
        let (s, z) = (scales[0], zeros[0]);
        xs.iter().map(|&v| (v - z) as f32 * s).collect()
    } else {
        // Per axis: a 1-D scale as long as x's `axis` dimension.
        let rank = x.dims.len() as i64;
        let axis = attr::int(n, "axis").unwrap_or(1);
        let axis = usize::try_from(if axis < 0 { axis + rank } else { axis }).ok()?;
        if scale.dims.len() != 1 || x.dims.get(axis) != Some(&(scales.len() as i64)) {
            return None;
        }
        let inner = usize::try_from(numel(&x.dims[axis + 1..])?).ok()?;
        let channels = scales.len();
        xs.iter()
            .enumerate()
            .map(|(k, &v)| {
                let c = (k / inner.max(1)) % channels;
                (v - zeros[c]) as f32 * scales[c]
            })
            .collect()
    };
    Some((x.dims.clone(), values))
}

/// The `size` bytes of an external constant, read from its file in `dir` (only the plain
/// `location` / `offset` / `length` keys; ORT's prepacked entries are not this module's).
fn bytes_of(t: &TensorProto, dir: &Path, size: usize) -> Option<Vec<u8>> {
    let r = external_ref(t).ok()??;
    let known = ["location", "offset", "length", "checksum"];
    if t.external_data
        .iter()
        .any(|e| !known.contains(&e.key.as_str()))
        || r.location.contains("..")
        || r.location.starts_with('/')
        || r.length.is_some_and(|l| l != size as u64)
    {
        return None;
    }
    let f = std::fs::File::open(dir.join(&r.location)).ok()?;
    let mut buf = vec![0u8; size];
    f.read_exact_at(&mut buf, r.offset).ok()?;
    Some(buf)
}

/// An integer constant's values (int8, uint8, int16, uint16, int32), one per element,
/// inline or in its external file in `dir`.
fn ints(t: &TensorProto, dir: &Path) -> Option<Vec<i64>> {
    if t.data_location != DataLocation::External as i32 {
        return inline_ints(t);
    }
    let ty = ElemType::from_code(t.data_type);
    let n = usize::try_from(numel(&t.dims)?).ok()?;
    decode_ints(ty, &bytes_of(t, dir, n.checked_mul(int_width(ty)?)?)?, n)
}

/// A float32 constant's values, inline or in its external file in `dir`.
fn floats(t: &TensorProto, dir: &Path) -> Option<Vec<f32>> {
    if t.data_location != DataLocation::External as i32 {
        return inline_floats(t);
    }
    let n = usize::try_from(numel(&t.dims)?).ok()?;
    let raw = bytes_of(t, dir, n.checked_mul(4)?)?;
    (raw.len() == n * 4).then(|| {
        raw.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    })
}

/// Every name a node of `g` (or of a body inside it) reads, and `g`'s outputs.
fn read_names(g: &GraphProto) -> HashSet<String> {
    fn walk(g: &GraphProto, out: &mut HashSet<String>) {
        for n in &g.node {
            out.extend(n.input.iter().filter(|s| !s.is_empty()).cloned());
            for a in &n.attribute {
                if let Some(b) = &a.g {
                    walk(b, out);
                }
                for b in &a.graphs {
                    walk(b, out);
                }
            }
        }
        out.extend(g.output.iter().map(|o| o.name.clone()));
    }
    let mut out = HashSet::new();
    walk(g, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::models;

    fn init<'a>(m: &'a ModelProto, name: &str) -> &'a TensorProto {
        let g = m.graph.as_ref().unwrap();
        g.initializer.iter().find(|t| t.name == name).unwrap()
    }

    fn f32s(raw: &[u8]) -> Vec<f32> {
        raw.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn constant_dequantizes_become_the_floats_they_compute() {
        let d = tempfile::tempdir().unwrap();
        let mut m = models::qdq_conv();
        // Under 64 bytes stays inline: b (4 floats), w2 (12); w (72 floats) goes to the file.
        let line = fold(&mut m, d.path(), "model.onnx.data", 64).unwrap();
        assert_eq!(
            line.as_deref(),
            Some("dequantize-constants: 3 DequantizeLinear of constants ONNX Runtime left unfused given as the float32 weights they compute (1 KiB)")
        );
        let g = m.graph.as_ref().unwrap();
        assert!(g.node.iter().all(|n| n.op_type != "DequantizeLinear"));
        // The quantized constants are gone; the graph's own are kept.
        let names: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["wf", "bf", "w2f"]);
        // Per tensor: (w − 3) · 0.05, in the file at an aligned offset.
        let wf = init(&m, "wf");
        assert_eq!(wf.dims, [4, 2, 3, 3]);
        let ext = external_ref(wf).unwrap().expect("external");
        assert_eq!(
            (ext.location.as_str(), ext.offset % ALIGN, ext.length),
            ("model.onnx.data", 0, Some(288))
        );
        let file = std::fs::read(d.path().join("model.onnx.data")).unwrap();
        let got = f32s(&file[ext.offset as usize..][..288]);
        let want: Vec<f32> = (0..72)
            .map(|k| (i64::from(((k * 53) % 255 - 127) as i8) - 3) as f32 * 0.05)
            .collect();
        assert_eq!(got, want);
        // int32 with no zero point, and per axis 0 (four weights a channel).
        let bf: Vec<f32> = [1200i32, -340, 0, 77]
            .iter()
            .map(|&v| v as f32 * 0.01)
            .collect();
        assert_eq!(f32s(&init(&m, "bf").raw_data), bf);
        let w2f = f32s(&init(&m, "w2f").raw_data);
        let (scale, zp) = ([0.1f32, 0.02, 0.3], [-2i64, 0, 5]);
        for (k, v) in w2f.iter().enumerate() {
            let q = i64::from(((k as i64 * 71) % 255 - 127) as i8);
            assert_eq!(*v, (q - zp[k / 4]) as f32 * scale[k / 4], "w2 element {k}");
        }
    }

    #[test]
    fn what_is_not_a_constant_or_not_plain_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        // A DequantizeLinear of a graph input, one whose output is a graph output, and one
        // with a block size.
        let mut m = models::qdq_conv();
        let g = m.graph.as_mut().unwrap();
        g.input.push(crate::fixtures::value_info(
            "w",
            crate::onnx::ElemType::Int8,
            None,
        ));
        g.output.push(crate::fixtures::value_info(
            "bf",
            crate::onnx::ElemType::Float32,
            None,
        ));
        g.node[2]
            .attribute
            .push(crate::fixtures::attr::int("block_size", 2));
        assert_eq!(fold(&mut m, d.path(), "model.onnx.data", 0).unwrap(), None);
        assert!(!d.path().join("model.onnx.data").exists());
    }
}
