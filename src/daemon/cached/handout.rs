//! What the daemon hands out for a stored artifact ([`Handout`]): the wire metadata (inputs
//! and outputs read from the artifact's graph or engine, the validation summary, the session
//! hints its probes measured, the runtime it was built with) and the files with their stamps.

use std::path::Path;

use trtcache_client::protocol::{
    ArtifactFile, ArtifactMeta, Origin, SessionHints, TensorInfo, Validation,
};

use super::*;

impl DiskBuildCache {
    /// Wire metadata and paths of a servable record, and where it came from.
    pub(super) fn artifact(
        &self,
        planned: &Planned,
        record: &Record,
        served: &Served,
        origin: Origin,
    ) -> Result<Handout, BuildCacheError> {
        let Some(stored) = &record.artifact else {
            return Err(BuildCacheError::Invalid("record has no artifact".into()));
        };
        let (inputs, outputs) = if record.backend.is_onnx() {
            io_of(&served.entry)?
        } else {
            engine_io_of(&served.dir)?
        };
        let mut files = Vec::new();
        let mut paths = Vec::new();
        let mut stamps = Vec::new();
        // Graph first, then its external data (the order clients expect descriptors in).
        let mut ordered: Vec<_> = stored.files.iter().collect();
        ordered.sort_by_key(|f| (f.name != stored.entry, f.name.clone()));
        for f in ordered {
            files.push(ArtifactFile {
                role: if f.name == stored.entry {
                    "graph".into()
                } else {
                    "external".into()
                },
                name: f.name.clone(),
                bytes: f.bytes,
            });
            let p = served.dir.join(&f.name);
            let m = std::fs::metadata(&p).map_err(BuildCacheError::io(&p))?;
            stamps.push(FileId::from_meta(&m));
            paths.push(p);
        }
        let v = record.validation.as_ref();
        let validation = Validation {
            passed: v.is_some_and(|v| v.passed),
            method: match v {
                Some(v) => format!(
                    "outputs compared with the original model (ONNX Runtime CPU, optimizations off) on {} (abs tol {:e}, rel tol {:e}{})",
                    v.golden.clone().unwrap_or_else(|| format!("seeded random inputs (seed {})", v.seed)),
                    v.tolerance.atol,
                    v.tolerance.rtol,
                    // Outputs held to their own type's resolution say so (issue 41).
                    {
                        let of = |k: &str| v.outputs.iter().any(|o| o.steps_of() == Some(k));
                        let mut s = String::new();
                        if of("float16") || of("bfloat16") {
                            s += &format!(
                                "; float16/bfloat16 outputs within {} steps of their type",
                                v.tolerance.half_ulps()
                            );
                        }
                        if of("int8") {
                            s += &format!(
                                "; outputs of dynamically quantized activations within {} int8 steps of their range",
                                v.tolerance.half_ulps()
                            );
                        }
                        s
                    }
                ),
                None => "not validated".into(),
            },
            max_abs_err: v.map(|v| v.outputs.iter().map(|o| o.max_abs).fold(0.0, f64::max)),
            max_rel_err: v.map(|v| v.outputs.iter().map(|o| o.max_rel).fold(0.0, f64::max)),
            shapes: v.map(|v| v.shapes.clone()).unwrap_or_default(),
            also_at: v.and_then(|v| v.also_at.clone()).unwrap_or_default(),
        };
        Ok(Handout {
            metadata: ArtifactMeta {
                model: planned.model.name.clone(),
                version: planned.model.version,
                key: record.key.hex(),
                backend: record.backend.to_string(),
                profile: planned.profile.clone(),
                precision: record.parts.precision.as_str().into(),
                inputs,
                outputs,
                // Provider per partition, as the capability analysis planned it at build
                // time (empty for records built before it existed).
                providers: record.partitions.clone().unwrap_or_default(),
                validation,
                files,
                built_at: record.created,
                dir_fd_index: None,
                session_hints: session_hints(record),
                runtime: record.parts.backend.versions.clone(),
            },
            paths,
            stamps,
            origin,
        })
    }
}

/// What the record's thread and prepack probes tell consumers (`ort-cpu` artifacts built
/// since they existed; none for the others).
fn session_hints(record: &Record) -> Option<SessionHints> {
    let v = record.validation.as_ref()?;
    let hints = SessionHints {
        intra_op_num_threads: v.threads.as_ref().filter(|p| p.single).map(|_| 1),
        disable_prepacking: v.prepack.as_ref().filter(|p| p.disable).map(|_| true),
    };
    (hints != SessionHints::default()).then_some(hints)
}

fn dim_json(d: &Dim) -> serde_json::Value {
    match d {
        Dim::Fixed(v) => serde_json::json!(v),
        Dim::Named(n) => serde_json::json!(n),
        Dim::Unknown => serde_json::json!(-1),
    }
}

/// Inputs and outputs of a `trt` artifact's engine, from its metadata (`engine.json`, whose
/// digest of the plan is checked): dynamic dimensions are -1.
fn engine_io_of(dir: &Path) -> Result<(Vec<TensorInfo>, Vec<TensorInfo>), BuildCacheError> {
    let meta =
        crate::trt::artifact::read_meta(dir).map_err(|e| BuildCacheError::Invalid(e.into()))?;
    let info = |t: &crate::trt::TensorInfo| TensorInfo {
        name: t.name.clone(),
        dtype: crate::onnx::ElemType::from_code(t.dtype.onnx_code())
            .name()
            .into_owned(),
        shape: t.shape.iter().map(|&d| serde_json::json!(d)).collect(),
    };
    Ok((
        meta.inputs.iter().map(info).collect(),
        meta.outputs.iter().map(info).collect(),
    ))
}

/// Inputs (initializers excluded) and outputs of the artifact's graph.
fn io_of(entry: &Path) -> Result<(Vec<TensorInfo>, Vec<TensorInfo>), BuildCacheError> {
    let m = Model::load(entry).map_err(|e| BuildCacheError::Invalid(e.into()))?;
    let Some(g) = m.proto.graph.as_ref() else {
        return Err(BuildCacheError::Invalid(
            format!("{}: artifact has no graph", entry.display()).into(),
        ));
    };
    let inits: std::collections::HashSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    let info = |v: &crate::onnx::proto::ValueInfoProto| TensorInfo {
        name: v.name.clone(),
        dtype: elem_type_of(v)
            .map(|t| t.name().into_owned())
            .unwrap_or_else(|| "unknown".into()),
        shape: shape_of(v)
            .map(|s| s.iter().map(dim_json).collect())
            .unwrap_or_default(),
    };
    Ok((
        g.input
            .iter()
            .filter(|v| !inits.contains(v.name.as_str()))
            .map(info)
            .collect(),
        g.output.iter().map(info).collect(),
    ))
}
