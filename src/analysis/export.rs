//! `--export-subgraphs DIR`: every partition as a standalone ONNX model, plus
//! `manifest.json` with the execution order and the tensor wiring between them.
//!
//! Enters: an [`Analysis`] (graph view, tensor facts, partitions) and its [`Model`]. Leaves:
//! files in `DIR` (`part-<id>-<provider>.onnx`, `manifest.json`) and the [`Manifest`].
//! Each exported model carries the nodes, the initializers they read (external data copied
//! inline), typed inputs/outputs, the value_info known for inner tensors, the model's opset
//! imports and its local functions, so ONNX Runtime can run the partitions in order.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;
use serde::Serialize;

use super::facts::{GraphFacts, TensorFacts};
use super::types::{self, Types};
use super::Analysis;
use crate::onnx::load::external_ref;
use crate::onnx::proto::{DataLocation, GraphProto, ModelProto, TensorProto, ValueInfoProto};
use crate::onnx::Model;
use crate::spec::Provider;

/// Why a partition could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("partition {partition}: value `{tensor}` has no known type (neither declared in the model nor inferred by trtcache); declare it in the graph's value_info")]
    UntypedTensor { partition: usize, tensor: String },
    #[error("initializer `{tensor}`: external data {why}")]
    ExternalData { tensor: String, why: String },
}

/// Where a partition input comes from.
#[derive(Clone, Debug, Serialize)]
pub struct Wire {
    pub name: String,
    /// A partition id, or `null` for a model input.
    pub from: Option<usize>,
}

/// One exported partition.
#[derive(Clone, Debug, Serialize)]
pub struct ManifestPart {
    pub id: usize,
    pub provider: Provider,
    pub file: String,
    pub nodes: usize,
    pub inputs: Vec<Wire>,
    pub outputs: Vec<String>,
}

/// `manifest.json`: run `order` in sequence, feeding each partition its wired inputs.
#[derive(Clone, Debug, Serialize)]
pub struct Manifest {
    pub model: String,
    pub order: Vec<usize>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub partitions: Vec<ManifestPart>,
}

/// The typed `ValueInfoProto` of `name`: its declaration when complete, else the facts'
/// tensor type, else the type [`super::types`] found (sequences, maps, optionals, body
/// outputs). Weights (an initializer, a `Constant`'s output) take the facts' type, exact
/// from the data, over a declaration: an exporter's `value_info` can be wrong about them
/// (onnxruntime-genai declares a 4-element shape Constant as a scalar), and a partition
/// input declared that way does not load ("shape input must be 1D").
fn value_info(
    name: &str,
    facts: &GraphFacts,
    declared: Option<&ValueInfoProto>,
    found: &Types<'_>,
) -> Option<ValueInfoProto> {
    let known = |t: &TensorFacts| t.dtype.filter(|d| d.code() != 0);
    let exact = facts.get(name).filter(|t| {
        t.weights
            && known(t).is_some()
            && t.shape
                .as_ref()
                .is_some_and(|s| s.iter().all(|d| d.known().is_some()))
    });
    if let Some(t) = exact {
        if let Some(dt) = known(t) {
            return Some(ValueInfoProto {
                name: name.to_string(),
                r#type: Some(types::tensor(dt, t.shape.as_deref())),
                ..Default::default()
            });
        }
    }
    if let Some(d) = declared.filter(|d| d.r#type.as_ref().is_some_and(types::complete)) {
        return Some(d.clone());
    }
    let r#type = match facts.get(name).and_then(|t| Some((known(t)?, t))) {
        Some((dt, t)) => types::tensor(dt, t.shape.as_deref()),
        None => found.get(name)?.clone(),
    };
    Some(ValueInfoProto {
        name: name.to_string(),
        r#type: Some(r#type),
        ..Default::default()
    })
}

/// Copies an external-data initializer's bytes inline.
fn inline(t: &TensorProto, dir: &Path) -> Result<TensorProto, ExportError> {
    let err = |why: String| ExportError::ExternalData {
        tensor: t.name.clone(),
        why,
    };
    let Some(r) = external_ref(t).map_err(err)? else {
        return Ok(t.clone());
    };
    let path = dir.join(&r.location);
    let io = |source| ExportError::Io {
        path: path.clone(),
        source,
    };
    let mut f = std::fs::File::open(&path).map_err(io)?;
    let len = match r.length {
        Some(l) => l,
        None => f.metadata().map_err(io)?.len().saturating_sub(r.offset),
    };
    f.seek(SeekFrom::Start(r.offset)).map_err(io)?;
    let mut buf = Vec::new();
    f.take(len).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 != len {
        return Err(err(format!("is {} bytes short", len - buf.len() as u64)));
    }
    let mut out = t.clone();
    out.raw_data = Bytes::from(buf);
    out.external_data.clear();
    out.data_location = DataLocation::Default as i32;
    Ok(out)
}

/// Writes every partition of `a` into `dir` and returns the manifest (also written).
pub fn export_subgraphs(
    a: &Analysis<'_>,
    model: &Model,
    dir: &Path,
) -> Result<Manifest, ExportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ExportError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let g = &a.graph;
    let cap = &a.capability;
    let found = types::infer_types(g, &a.facts, &a.order, a.opset, a.max_body_depth);
    let mut producer_part = std::collections::HashMap::new();
    for p in &cap.partitions {
        for o in &p.outputs {
            producer_part.insert(o.as_str(), p.id);
        }
    }
    let mut parts = Vec::new();
    for p in &cap.partitions {
        let mut graph = GraphProto {
            name: format!("{}_part{}_{}", g.proto.name, p.id, p.provider),
            ..Default::default()
        };
        let mut inits_seen = HashSet::new();
        let mut inner = HashSet::new();
        for &v in &p.node_ids {
            let node = g.nodes[v];
            graph.node.push(node.clone());
            for r in super::partition::reads(g, v) {
                // Initializers a caller may override (also graph inputs, IR >= 4) travel
                // too: the partition input they stay keeps them optional, as in the model.
                if let Some(t) = g.initializers.get(r) {
                    if inits_seen.insert(r) {
                        graph.initializer.push(inline(t, &model.dir)?);
                    }
                }
            }
            inner.extend(
                node.output
                    .iter()
                    .filter(|o| !o.is_empty())
                    .map(|o| o.as_str()),
            );
        }
        let typed = |name: &str| {
            value_info(name, &a.facts, g.value_info.get(name).copied(), &found).ok_or_else(|| {
                ExportError::UntypedTensor {
                    partition: p.id,
                    tensor: name.to_string(),
                }
            })
        };
        for i in &p.inputs {
            graph.input.push(typed(i)?);
        }
        for o in &p.outputs {
            graph.output.push(typed(o)?);
        }
        let io_names: HashSet<&str> = p
            .inputs
            .iter()
            .chain(&p.outputs)
            .map(|s| s.as_str())
            .collect();
        let mut inner: Vec<&str> = inner
            .into_iter()
            .filter(|t| !io_names.contains(t))
            .collect();
        inner.sort_unstable();
        for t in inner {
            if let Some(vi) = value_info(t, &a.facts, g.value_info.get(t).copied(), &found) {
                graph.value_info.push(vi);
            }
        }
        let m = ModelProto {
            // IR 4 is the first where an initializer need not be a graph input.
            ir_version: model.proto.ir_version.max(4),
            opset_import: model.proto.opset_import.clone(),
            producer_name: "trtcache".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            graph: Some(graph),
            functions: model.proto.functions.clone(),
            ..Default::default()
        };
        let file = format!("part-{}-{}.onnx", p.id, p.provider);
        let path = dir.join(&file);
        std::fs::write(&path, m.encode_to_vec()).map_err(io(&path))?;
        parts.push(ManifestPart {
            id: p.id,
            provider: p.provider,
            file,
            nodes: p.node_ids.len(),
            inputs: p
                .inputs
                .iter()
                .map(|i| Wire {
                    name: i.clone(),
                    from: producer_part.get(i.as_str()).copied(),
                })
                .collect(),
            outputs: p.outputs.clone(),
        });
    }
    let manifest = Manifest {
        model: model.path.display().to_string(),
        order: parts.iter().map(|p| p.id).collect(),
        inputs: g.inputs.iter().map(|i| i.name.clone()).collect(),
        outputs: g.proto.output.iter().map(|o| o.name.clone()).collect(),
        partitions: parts,
    };
    let path = dir.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| ExportError::Io {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&path, text).map_err(io(&path))?;
    Ok(manifest)
}
