//! `trtcache build MODEL …`: key, cache lookup, build, validation, store; progress on
//! stderr, the result on stdout (human or `--json`). A second run of the same build is a
//! cache hit and says so. Exit status 1 when the artifact failed validation.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use super::cache::{open_store, CacheArgs};
use super::output::{human_bytes, table, Style};
use crate::build::validate::{Tolerance, ValidationConfig};
use crate::build::{runtime, BuildOptions, BuildOutcome, BuildRequest, Builder, OptLevel, Source};
use crate::plan::{Precision, ShapeProfile};

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The ONNX model file (external data next to it is part of the model).
    pub model: PathBuf,
    /// Backend: ort-cpu (offline-optimized model for this CPU), ort-cuda, ort-tensorrt.
    #[arg(long, default_value = "ort-cpu")]
    pub backend: String,
    /// Minimum shapes, trtexec syntax: `ids:1x1,mask:1x1`.
    #[arg(long, value_name = "SPEC")]
    pub min_shapes: Option<String>,
    /// Optimal shapes (validation runs at these): `ids:1x128,mask:1x128`.
    #[arg(long, value_name = "SPEC")]
    pub opt_shapes: Option<String>,
    /// Maximum shapes: `ids:8x512,mask:8x512`.
    #[arg(long, value_name = "SPEC")]
    pub max_shapes: Option<String>,
    /// Numeric precision: fp32 or fp16 (fp16 applies to TensorRT).
    #[arg(long, default_value = "fp32", value_parser = parse_precision)]
    pub precision: Precision,
    /// ort-cpu graph optimization level: basic, extended (portable across machines with the
    /// same ISA), all (adds layout transforms for this CPU; the key pins the SKU). ort-cuda
    /// uses at most extended.
    #[arg(long, default_value = "all", value_parser = parse_opt_level)]
    pub opt_level: OptLevel,
    /// Do not save prepacked constant initializers with the ort-cpu artifact.
    #[arg(long)]
    pub no_prepack: bool,
    /// TensorRT builder optimization level (0-5).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=5))]
    pub trt_opt_level: u8,
    /// GPU ordinal for the GPU backends.
    #[arg(long, default_value_t = 0)]
    pub device: i32,
    /// Validation: absolute tolerance (default by precision: fp32 1e-4, fp16 1e-2).
    #[arg(long)]
    pub atol: Option<f64>,
    /// Validation: relative tolerance (default by precision: fp32 1e-3, fp16 1e-2).
    #[arg(long)]
    pub rtol: Option<f64>,
    /// Validation: seed of the random inputs.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Validation: golden inputs from a NumPy `.npz` (np.savez; one array per input name)
    /// instead of seeded random tensors.
    #[arg(long, value_name = "FILE.npz")]
    pub golden: Option<PathBuf>,
    /// Validation: integer inputs are drawn from [LO, HI), e.g. `0:2`.
    #[arg(long, value_name = "LO:HI", default_value = "0:2")]
    pub int_range: String,
    /// ONNX Runtime intra-op threads for building and validating (0 = ORT's default).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Rebuild even when the cache has an entry (also retries a failed one).
    #[arg(long)]
    pub force: bool,
    /// libonnxruntime.so to load (else ORT_DYLIB_PATH, then an onnxruntime Python package).
    #[arg(long, env = "TRTCACHE_ORT_LIBRARY")]
    pub ort_library: Option<PathBuf>,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Evict least-recently-used artifacts after storing to stay under SIZE (e.g. 10G).
    #[arg(long, value_name = "SIZE")]
    pub max_size: Option<String>,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    match s {
        "fp32" => Ok(Precision::Fp32),
        "fp16" => Ok(Precision::Fp16),
        _ => Err(format!("`{s}`: expected fp32 or fp16")),
    }
}

fn parse_opt_level(s: &str) -> Result<OptLevel, String> {
    OptLevel::parse(s).ok_or_else(|| format!("`{s}`: expected basic, extended or all"))
}

/// Parses `name:1x3x224,other:1x16` into name → dims.
pub fn parse_shapes(flag: &str, s: &str) -> anyhow::Result<BTreeMap<String, Vec<i64>>> {
    let mut out = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((name, dims)) = part.rsplit_once(':') else {
            bail!("{flag}: `{part}` is not NAME:DxDxD");
        };
        let dims: Result<Vec<i64>, _> = dims.split('x').map(|d| d.trim().parse::<i64>()).collect();
        match dims {
            Ok(d) if !d.is_empty() && d.iter().all(|&v| v >= 0) => {
                if out.insert(name.trim().to_string(), d).is_some() {
                    bail!("{flag}: input `{name}` given twice");
                }
            }
            _ => bail!("{flag}: `{part}`: dims must be non-negative integers separated by `x`"),
        }
    }
    Ok(out)
}

/// The profile from the three flags (opt alone means min = opt = max).
pub fn profile_from_flags(
    min: Option<&str>,
    opt: Option<&str>,
    max: Option<&str>,
) -> anyhow::Result<Option<ShapeProfile>> {
    if min.is_none() && opt.is_none() && max.is_none() {
        return Ok(None);
    }
    let Some(opt) = opt else {
        bail!("--opt-shapes is required when --min-shapes or --max-shapes is given");
    };
    let opt = parse_shapes("--opt-shapes", opt)?;
    let min = min.map_or(Ok(opt.clone()), |s| parse_shapes("--min-shapes", s))?;
    let max = max.map_or(Ok(opt.clone()), |s| parse_shapes("--max-shapes", s))?;
    for (name, o) in &opt {
        let (Some(lo), Some(hi)) = (min.get(name), max.get(name)) else {
            bail!("input `{name}`: --opt-shapes names it but --min-shapes/--max-shapes do not");
        };
        if lo.len() != o.len() || hi.len() != o.len() {
            bail!("input `{name}`: min/opt/max shapes have different ranks");
        }
        for i in 0..o.len() {
            if !(lo[i] <= o[i] && o[i] <= hi[i]) {
                bail!(
                    "input `{name}` dim {i}: need min <= opt <= max, got {} / {} / {}",
                    lo[i],
                    o[i],
                    hi[i]
                );
            }
        }
    }
    if min.len() != opt.len() || max.len() != opt.len() {
        bail!("--min-shapes, --opt-shapes and --max-shapes must name the same inputs");
    }
    Ok(Some(ShapeProfile {
        name: "default".into(),
        min,
        opt,
        max,
    }))
}

#[derive(Serialize)]
struct Report<'a> {
    key: String,
    source: Source,
    cache_hit: bool,
    state: &'a str,
    servable: bool,
    unservable: Option<&'a str>,
    build_ms: u64,
    onnxruntime: Option<String>,
    artifact: Option<ArtifactReport>,
    record: &'a crate::cache::Record,
}

#[derive(Serialize)]
struct ArtifactReport {
    entry: PathBuf,
    files: Vec<PathBuf>,
    bytes: u64,
}

pub fn run(a: BuildArgs) -> anyhow::Result<ExitCode> {
    let profile = profile_from_flags(
        a.min_shapes.as_deref(),
        a.opt_shapes.as_deref(),
        a.max_shapes.as_deref(),
    )?;
    let Some((lo, hi)) = a.int_range.split_once(':') else {
        bail!("--int-range: `{}` is not LO:HI", a.int_range);
    };
    let int_range = (
        lo.trim().parse::<i64>().context("--int-range LO")?,
        hi.trim().parse::<i64>().context("--int-range HI")?,
    );
    if int_range.0 >= int_range.1 {
        bail!("--int-range: LO must be below HI");
    }
    let max_bytes = match &a.max_size {
        Some(s) => Some(
            crate::cache::parse_size(s)
                .with_context(|| format!("--max-size: `{s}` is not a size (e.g. 512M, 10G)"))?,
        ),
        None => None,
    };
    let precision = a.precision;
    for (flag, v) in [("--atol", a.atol), ("--rtol", a.rtol)] {
        if let Some(v) = v {
            if !v.is_finite() || v < 0.0 {
                bail!("{flag}: {v} is not a finite, non-negative tolerance");
            }
        }
    }
    let tolerance = match (a.atol, a.rtol) {
        (None, None) => None,
        (abs, rel) => {
            let d = Tolerance::for_precision(precision);
            Some(Tolerance {
                abs: abs.unwrap_or(d.abs),
                rel: rel.unwrap_or(d.rel),
            })
        }
    };
    let defaults = ValidationConfig::default();
    let req = BuildRequest {
        model: a.model.clone(),
        backend: a.backend.clone(),
        options: BuildOptions {
            precision,
            profile,
            opt_level: a.opt_level,
            prepack: !a.no_prepack,
            trt_builder_level: a.trt_opt_level,
            device_id: a.device,
            threads: a.threads,
        },
        validation: ValidationConfig {
            seed: a.seed.unwrap_or(defaults.seed),
            int_range,
            tolerance,
            golden: a.golden.clone(),
        },
        force: a.force,
    };
    crate::build::backend(&a.backend).map_err(anyhow::Error::new)?;
    let (store, dir) = open_store(&a.cache, max_bytes)?;
    let builder = Builder::new(Arc::new(store), a.ort_library.clone());
    let progress = |step: &str| eprintln!("trtcache: {step}");
    let outcome = builder
        .build(&req, &progress)
        .with_context(|| format!("building {} with {}", a.model.display(), a.backend))?;
    let rt_version = runtime::loaded().map(|r| r.version.clone());
    if a.json {
        let r = report(&outcome, rt_version);
        println!(
            "{}",
            serde_json::to_string_pretty(&r).context("serialising the report")?
        );
    } else {
        print!(
            "{}",
            render(&outcome, rt_version.as_deref(), &dir, Style::stdout())
        );
    }
    Ok(if outcome.served.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn report(o: &BuildOutcome, onnxruntime: Option<String>) -> Report<'_> {
    Report {
        key: o.key.hex(),
        source: o.source,
        cache_hit: o.source != Source::Built,
        state: o.record.state(),
        servable: o.served.is_some(),
        unservable: o.unservable.as_deref(),
        build_ms: o.record.build_ms,
        onnxruntime,
        artifact: o.served.as_ref().map(|s| ArtifactReport {
            entry: s.entry.clone(),
            files: s.files.clone(),
            bytes: o.record.bytes(),
        }),
        record: &o.record,
    }
}

fn render(o: &BuildOutcome, ort: Option<&str>, dir: &std::path::Path, st: Style) -> String {
    let r = &o.record;
    let mut rows = vec![
        vec!["model".into(), r.model_path.clone()],
        vec![
            "backend".into(),
            format!("{} (onnxruntime {})", r.backend, ort.unwrap_or("?")),
        ],
        vec!["key".into(), o.key.hex()],
        vec!["cache".into(), dir.display().to_string()],
    ];
    let result = match o.source {
        Source::Built => format!("built in {} ms", r.build_ms),
        Source::Cached => format!(
            "cache hit (built in {} ms earlier; {} hits)",
            r.build_ms, r.hits
        ),
        Source::Joined => "built by a concurrent request (joined)".into(),
    };
    rows.push(vec!["result".into(), result]);
    let mut out = table("", &rows);
    if let Some(v) = &r.validation {
        let verdict = if v.passed {
            st.good("passed")
        } else {
            st.bad("FAILED")
        };
        let inputs = match &v.golden {
            Some(g) => format!("golden {g}"),
            None => format!("seed {}", v.seed),
        };
        out.push_str(&format!(
            "validation {verdict} (abs tol {:e}, rel tol {:e}, {inputs}, shapes {})\n",
            v.tolerance.abs,
            v.tolerance.rel,
            v.shapes
                .iter()
                .map(|(n, d)| format!(
                    "{n}:{}",
                    d.iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join("x")
                ))
                .collect::<Vec<_>>()
                .join(",")
        ));
        let rows: Vec<Vec<String>> = v
            .outputs
            .iter()
            .map(|e| {
                vec![
                    e.name.clone(),
                    format!("max abs {:.3e}", e.max_abs),
                    format!("max rel {:.3e}", e.max_rel),
                    if e.passed {
                        st.good("ok")
                    } else {
                        st.bad(&format!("{} over", e.mismatched))
                    },
                ]
            })
            .collect();
        out.push_str(&table("  ", &rows));
    }
    match (&o.served, &o.unservable) {
        (Some(s), _) => {
            let names: Vec<String> = s
                .files
                .iter()
                .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            out.push_str(&format!(
                "artifact {} ({}, {})\n",
                s.entry.display(),
                names.join(" + "),
                human_bytes(r.bytes())
            ));
        }
        (None, Some(why)) => out.push_str(&format!("{} {why}\n", st.bad("not servable:"))),
        (None, None) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_flags() {
        let p = profile_from_flags(Some("x:1x1x64"), Some("x:2x16x64"), Some("x:8x128x64"))
            .unwrap()
            .unwrap();
        assert_eq!(p.opt["x"], vec![2, 16, 64]);
        let p = profile_from_flags(None, Some("x:2x16x64,m:2x16"), None)
            .unwrap()
            .unwrap();
        assert_eq!(p.min, p.opt);
        assert!(profile_from_flags(Some("x:4x1x64"), Some("x:2x16x64"), None).is_err());
        assert!(profile_from_flags(Some("x:1x1"), None, None).is_err());
        assert!(parse_shapes("--opt-shapes", "x:2xAx3").is_err());
        assert!(parse_shapes("--opt-shapes", "x2x3").is_err());
        assert!(profile_from_flags(None, None, None).unwrap().is_none());
    }
}
