//! `export --triton-repo DIR`: a Triton Inference Server model repository from cached `trt`
//! artifacts. Per model name: `DIR/NAME/config.pbtxt` (`platform: "tensorrt_plan"`, the I/O
//! from the engine's metadata, `max_batch_size: 0` since TensorRT 10 engines are explicit-batch)
//! and `DIR/NAME/VERSION/` with one plan per compute capability (`model.sm90.plan`), listed in
//! `cc_model_filenames` so Triton picks the one for the GPU it runs on. One engine also
//! becomes `model.plan`, the file Triton loads on a GPU whose compute capability is not
//! listed: the first built with the `ampere-plus` hardware-compatibility level (which runs
//! on any Ampere or newer GPU), else the first given.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::artifact::{self, EngineMeta};
use super::error::TrtError;
use super::types::{DType, HwCompat, TensorInfo};

/// One artifact to export under a model name.
#[derive(Clone, Debug)]
pub struct TritonEntry {
    /// The Triton model name (a folder name).
    pub name: String,
    /// The artifact folder (`engine.plan` + `engine.json`).
    pub artifact: PathBuf,
}

/// Triton's `data_type` for an element type.
pub fn triton_type(t: DType) -> Option<&'static str> {
    Some(match t {
        DType::Float32 => "TYPE_FP32",
        DType::Float16 => "TYPE_FP16",
        DType::Bfloat16 => "TYPE_BF16",
        DType::Int8 => "TYPE_INT8",
        DType::Int32 => "TYPE_INT32",
        DType::Int64 => "TYPE_INT64",
        DType::Uint8 => "TYPE_UINT8",
        DType::Bool => "TYPE_BOOL",
        _ => return None,
    })
}

fn pb_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn tensors(kind: &str, ts: &[TensorInfo], cfg: &Path) -> Result<String, TrtError> {
    let mut out = format!("{kind} [\n");
    for (i, t) in ts.iter().enumerate() {
        let ty = triton_type(t.dtype).ok_or_else(|| TrtError::BadArtifact {
            path: cfg.to_path_buf(),
            what: format!(
                "{kind} `{}` has type {:?}, which Triton has no data_type for",
                t.name, t.dtype
            ),
        })?;
        let dims: Vec<String> = t.shape.iter().map(i64::to_string).collect();
        let _ = write!(
            out,
            "  {{\n    name: {}\n    data_type: {ty}\n    dims: [ {} ]\n  }}{}\n",
            pb_string(&t.name),
            dims.join(", "),
            if i + 1 < ts.len() { "," } else { "" }
        );
    }
    out.push_str("]\n");
    Ok(out)
}

/// The `config.pbtxt` for one model: `plans` maps compute capability → file name;
/// `model.plan` is the default for any other GPU.
pub fn config_pbtxt(
    name: &str,
    meta: &EngineMeta,
    plans: &BTreeMap<String, String>,
    cfg_path: &Path,
) -> Result<String, TrtError> {
    let mut s = format!(
        "# Written by `trtcache export --triton-repo` from cached trt artifacts (TensorRT {}).\n\
         name: {}\nplatform: \"tensorrt_plan\"\nmax_batch_size: 0\n",
        meta.tensorrt_version,
        pb_string(name)
    );
    s.push_str(&tensors("input", &meta.inputs, cfg_path)?);
    s.push_str(&tensors("output", &meta.outputs, cfg_path)?);
    s.push_str("default_model_filename: \"model.plan\"\n");
    s.push_str("cc_model_filenames [\n");
    let n = plans.len();
    for (i, (cc, file)) in plans.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {{ key: {} value: {} }}{}",
            pb_string(cc),
            pb_string(file),
            if i + 1 < n { "," } else { "" }
        );
    }
    s.push_str("]\n");
    Ok(s)
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n != "."
        && n != ".."
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn place(src: &Path, dst: &Path) -> Result<(), TrtError> {
    let _ = std::fs::remove_file(dst);
    if std::fs::hard_link(src, dst).is_err() {
        std::fs::copy(src, dst).map_err(TrtError::io(dst))?;
    }
    Ok(())
}

/// Writes the model repository; returns the `config.pbtxt` paths written. Every artifact's
/// plan is re-checked against its metadata first; artifacts under one name must have the
/// same inputs and outputs and distinct compute capabilities.
pub fn export_triton_repo(
    dir: &Path,
    entries: &[TritonEntry],
    version: u32,
) -> Result<Vec<PathBuf>, TrtError> {
    if version == 0 {
        return Err(TrtError::InvalidArgument(
            "Triton model versions start at 1".into(),
        ));
    }
    let mut by_name: BTreeMap<&str, Vec<(EngineMeta, &Path)>> = BTreeMap::new();
    for e in entries {
        if !valid_name(&e.name) {
            return Err(TrtError::InvalidArgument(format!(
                "`{}` is not a Triton model name (letters, digits, `_`, `-`, `.`)",
                e.name
            )));
        }
        let meta = artifact::read_meta(&e.artifact)?;
        by_name
            .entry(&e.name)
            .or_default()
            .push((meta, &e.artifact));
    }
    let mut written = Vec::new();
    for (name, arts) in by_name {
        let model_dir = dir.join(name);
        let vdir = model_dir.join(version.to_string());
        std::fs::create_dir_all(&vdir).map_err(TrtError::io(&vdir))?;
        let cfg_path = model_dir.join("config.pbtxt");
        let first = &arts[0].0;
        let mut plans = BTreeMap::new();
        let mut default_plan = false;
        for (meta, art) in &arts {
            if meta.inputs != first.inputs || meta.outputs != first.outputs {
                return Err(TrtError::BadArtifact {
                    path: art.to_path_buf(),
                    what: format!("its inputs/outputs differ from the other engines of `{name}`"),
                });
            }
            let cc = meta
                .compute_capability
                .clone()
                .ok_or_else(|| TrtError::BadArtifact {
                    path: art.to_path_buf(),
                    what: "the metadata names no compute capability".into(),
                })?;
            let file = format!("model.sm{}.plan", cc.replace('.', ""));
            if plans.insert(cc.clone(), file.clone()).is_some() {
                return Err(TrtError::BadArtifact {
                    path: art.to_path_buf(),
                    what: format!("a second engine for compute capability {cc} under `{name}`"),
                });
            }
            place(&artifact::plan_path(art), &vdir.join(&file))?;
            if meta.hardware_compatibility == HwCompat::AmperePlus && !default_plan {
                place(&artifact::plan_path(art), &vdir.join("model.plan"))?;
                default_plan = true;
            }
        }
        if !default_plan {
            place(&artifact::plan_path(arts[0].1), &vdir.join("model.plan"))?;
        }
        let text = config_pbtxt(name, first, &plans, &cfg_path)?;
        let tmp = model_dir.join(".config.pbtxt.tmp");
        std::fs::write(&tmp, text).map_err(TrtError::io(&tmp))?;
        std::fs::rename(&tmp, &cfg_path).map_err(TrtError::io(&cfg_path))?;
        written.push(cfg_path);
    }
    Ok(written)
}
