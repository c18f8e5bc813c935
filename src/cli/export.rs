//! `trtcache export --triton-repo DIR`: a Triton model repository from the cache's servable
//! `trt` artifacts ([`crate::trt::triton`]): `DIR/NAME/config.pbtxt` (`platform:
//! "tensorrt_plan"`, `cc_model_filenames` per compute capability) and `DIR/NAME/VERSION/`
//! with the plans. NAME is the model's name in the repository it was built from (the file
//! stem, or the model folder of a Triton `NAME/VERSION/model.onnx` layout).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;

use super::cache::{open_store_read_only, CacheArgs};
use crate::cache::{Lookup, Status, Store};
use crate::spec::Backend;
use crate::trt::triton::{export_triton_repo, TritonEntry};

/// Write a Triton model repository from the cache's `trt` engines.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The model repository to write (created when missing; models already there are
    /// replaced one by one).
    #[arg(long, value_name = "DIR")]
    pub triton_repo: PathBuf,
    /// Only these models (by name; repeatable). Default: every model with a ready `trt`
    /// artifact.
    #[arg(long = "model", value_name = "NAME")]
    pub models: Vec<String>,
    /// The Triton model version folder to write.
    #[arg(long = "model-version", value_name = "N", default_value_t = 1)]
    pub model_version: u32,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Print `{"repository", "engines", "configs": [PATH…]}` on stdout instead of the paths.
    #[arg(long)]
    pub json: bool,
}

/// The name a model had in its repository: `NAME` of `…/NAME.onnx`, and of
/// `…/NAME/VERSION/model.onnx` (Triton's layout).
pub fn model_name(model_path: &str) -> String {
    let p = Path::new(model_path);
    let stem = p
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let version_dir = p.parent();
    let numbered = version_dir
        .and_then(|d| d.file_name())
        .is_some_and(|n| n.to_string_lossy().bytes().all(|b| b.is_ascii_digit()));
    match version_dir
        .and_then(|d| d.parent())
        .and_then(|d| d.file_name())
    {
        Some(name) if stem == "model" && numbered => name.to_string_lossy().into_owned(),
        _ => stem,
    }
}

pub fn export(a: ExportArgs) -> anyhow::Result<ExitCode> {
    let (store, dir) = open_store_read_only(&a.cache)?;
    let records = store.list().context("listing the cache")?;
    let mut entries = Vec::new();
    // (name, compute capability) already exported: the most recently used engine wins.
    let mut seen = BTreeSet::new();
    for r in records {
        if r.backend != Backend::Trt || !matches!(r.status, Status::Ready) {
            continue;
        }
        let name = model_name(&r.model_path);
        if !a.models.is_empty() && !a.models.contains(&name) {
            continue;
        }
        let Lookup::Hit { served, .. } = store.peek(&r.key)? else {
            continue;
        };
        let meta = crate::trt::artifact::read_meta(&served.dir)
            .with_context(|| format!("cache entry {} ({name})", r.key))?;
        let cc = meta.compute_capability.clone().unwrap_or_default();
        if !seen.insert((name.clone(), cc.clone())) {
            eprintln!(
                "trtcache: {name}: skipping {} (another engine for compute capability {cc} was used more recently)",
                &r.key.hex()[..16]
            );
            continue;
        }
        entries.push(TritonEntry {
            name,
            artifact: served.dir,
        });
    }
    for m in &a.models {
        if !entries.iter().any(|e| &e.name == m) {
            bail!(
                "no ready trt artifact for model `{m}` in {} (build it with `trtcache build MODEL --backend trt`)",
                dir.display()
            );
        }
    }
    if entries.is_empty() {
        bail!(
            "no ready trt artifacts in {} to export (build some with `trtcache build MODEL --backend trt`, or `backends = [\"trt\"]` in the daemon's config)",
            dir.display()
        );
    }
    let written = export_triton_repo(&a.triton_repo, &entries, a.model_version)
        .with_context(|| format!("writing the Triton repository {}", a.triton_repo.display()))?;
    if a.json {
        let v = serde_json::json!({
            "repository": a.triton_repo,
            "engines": entries.len(),
            "configs": written,
        });
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    for cfg in &written {
        println!("{}", cfg.display());
    }
    eprintln!(
        "trtcache: exported {} engine(s) of {} model(s) to {}",
        entries.len(),
        written.len(),
        a.triton_repo.display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_flat_and_triton_layouts() {
        assert_eq!(model_name("/m/bert.onnx"), "bert");
        assert_eq!(model_name("/m/bert/3/model.onnx"), "bert");
        assert_eq!(model_name("/m/x/model.onnx"), "model");
        assert_eq!(model_name("model.onnx"), "model");
    }
}
