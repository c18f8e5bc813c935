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
use crate::builder::validate::{Tolerance, ValidationConfig};
use crate::builder::{
    runtime, BuildJob, BuildOptions, BuildOutcome, Builder, OptLevel, OrtCpuOptions, Progress,
    Source, TrtOptions,
};
use crate::cache::DIGEST_MEMO;
use crate::onnx::Model;
use crate::plan::{resolve, ModelInputs, Plan, ProfileArgs};
use crate::spec::{Backend, Precision};

/// The build options that change an artifact, shared by `trtcache key` and `trtcache build`
/// so both compute the same key; [`BuildOptionArgs::options`] maps them to [`BuildOptions`],
/// whose `key_options` is the single source of a key's options.
#[derive(Clone, Debug, Args)]
pub struct BuildOptionArgs {
    /// Numeric precision: fp32 or fp16 (fp16 applies to TensorRT). Overrides the sidecar's;
    /// default fp32.
    #[arg(long, value_parser = parse_precision)]
    pub precision: Option<Precision>,
    /// ort-cpu graph optimization level: disabled (the model's own graph), basic, extended
    /// (portable across machines with the same ISA), all (adds layout transforms for this
    /// CPU; the key pins the SKU). ort-cuda uses at most extended. An artifact over tolerance
    /// is built again one level lower, down to disabled (the record's validation says which
    /// level was stored).
    #[arg(long, default_value = "all", value_parser = parse_opt_level)]
    pub opt_level: OptLevel,
    /// Do not save prepacked constant initializers with the ort-cpu artifact.
    #[arg(long)]
    pub no_prepack: bool,
    /// ort-cpu: initializers of at least this size go to the artifact's external data file
    /// (memory-mapped, shared between consumers); smaller ones stay in the graph file, which
    /// makes sessions open faster. A size such as 64K, 1M or 0 (everything external; under
    /// about 1K, ONNX Runtime cannot load a graph whose shape inputs, such as Split's sizes,
    /// are then external, and the build fails saying so).
    #[arg(long, default_value = "64K", value_parser = parse_bytes)]
    pub external_min_size: u64,
    /// ort-cpu: do not bake the profile's fixed dimensions (min = max) into the artifact. By
    /// default they are baked in, so ONNX Runtime folds the shape arithmetic and sessions open
    /// much faster, and the artifact accepts only those sizes (like a TensorRT engine). The
    /// sidecar's `specialize = false` does the same for one model.
    #[arg(long)]
    pub no_specialize: bool,
    /// ort-cpu: do not rewrite ops that ONNX Runtime's CPU provider runs slowly before
    /// optimizing (today: an If whose condition the model's shapes fix becomes the branch it
    /// takes; an STFT of a constant window of up to 2,048 samples, 1,024 when a
    /// power of two, becomes a Conv, 1.4-18x faster; a hard-swish spelled out in four
    /// elementwise ops becomes HardSigmoid + Mul; an erf GELU spelled out in five becomes
    /// com.microsoft.Gelu; a scalar Mul/Add after or before a Conv is
    /// folded into its weights; a depthwise ConvInteger becomes an exact float Conv of the
    /// same integers, 1.5-16x faster; another ConvInteger's int8 weights are given as the same
    /// integers in uint8, which ONNX Runtime runs about 4-5x faster; and, on the graph ONNX
    /// Runtime saved, a DequantizeLinear of constants it left unfused becomes the float
    /// weights it computes; docs/cache.md "Graph rewrites"). A
    /// rewritten artifact that misses the tolerance is built again without them anyway.
    #[arg(long)]
    pub no_rewrite: bool,
    /// TensorRT builder optimization level (0-5).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=5))]
    pub trt_opt_level: u8,
    /// trt: TensorRT's hardware-compatibility level: none (the engine runs on this GPU
    /// model only; the key records the exact GPU), ampere-plus (any Ampere or newer GPU) or
    /// same-compute-capability; with a level, the key records that class of GPUs instead.
    #[arg(long, default_value = "none", value_parser = parse_hw_compat)]
    pub trt_hardware_compat: crate::trt::HwCompat,
    /// trt: the TensorRT builder's workspace memory limit, e.g. 4G (default: TensorRT's,
    /// the device's memory).
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub trt_workspace: Option<u64>,
    /// GPU ordinal the GPU backends build on and key for (also TRTCACHE_DEVICE).
    #[arg(long, env = "TRTCACHE_DEVICE", default_value_t = 0)]
    pub device: i32,
    /// A further option to key the artifact by, KEY=VALUE (repeatable), e.g. a label for a
    /// custom build environment; it goes into the key and does not change the build.
    #[arg(long = "option", short = 'o', value_name = "KEY=VALUE")]
    pub options: Vec<String>,
}

impl BuildOptionArgs {
    /// The build options for a resolved plan (its profile and precision; `--precision` was
    /// already applied by [`crate::plan::resolve`]).
    pub fn options(&self, plan: &Plan, threads: usize) -> anyhow::Result<BuildOptions> {
        let flags = BuildOptions {
            opt_level: self.opt_level,
            ort_cpu: OrtCpuOptions {
                prepack: !self.no_prepack,
                external_min_bytes: self.external_min_size,
                specialize: !self.no_specialize,
                rewrite: !self.no_rewrite,
            },
            trt: TrtOptions {
                builder_level: self.trt_opt_level,
                hardware_compat: self.trt_hardware_compat,
                workspace_bytes: self.trt_workspace,
            },
            device_id: self.device,
            extra: parse_extra(&self.options)?,
            threads,
            ..BuildOptions::default()
        };
        Ok(flags.for_plan(plan))
    }
}

fn parse_extra(opts: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for o in opts {
        let Some((k, v)) = o.split_once('=') else {
            bail!("--option `{o}` is not KEY=VALUE");
        };
        let k = k.trim();
        if k.is_empty() {
            bail!("--option `{o}` has an empty key");
        }
        if BuildOptions::BUILT_IN.contains(&k) {
            bail!("--option `{k}` is set by its own flag (see --help)");
        }
        if out.insert(k.to_string(), v.trim().to_string()).is_some() {
            bail!("--option `{k}` is given twice");
        }
    }
    Ok(out)
}

/// The backend a command uses: `--backend`, else the sidecar's first, else the default.
pub fn choose_backend(flag: Option<Backend>, plan: &Plan) -> Backend {
    flag.or_else(|| plan.backends.first().copied())
        .unwrap_or_default()
}

/// Build MODEL into the cache (or find it there): the key, a cache lookup, the build,
/// validation against the original model and the stored record. The shape profile, precision,
/// backends, tolerances and golden inputs come from the model's sidecar
/// (`MODEL.trtcache.toml`) unless flags override them.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The ONNX model file (external data next to it is part of the model).
    pub model: PathBuf,
    /// Backend: ort-cpu (offline-optimized model for this CPU), ort-cuda, ort-tensorrt, trt
    /// (a plain TensorRT engine through the shim, docs/trt.md) (default: the sidecar's
    /// first, else ort-cpu).
    #[arg(long)]
    pub backend: Option<Backend>,
    #[command(flatten)]
    pub profile: ProfileArgs,
    #[command(flatten)]
    pub build: BuildOptionArgs,
    /// Validation: absolute tolerance (default: the sidecar's, else by precision: fp32 1e-4,
    /// fp16 1e-2).
    #[arg(long)]
    pub atol: Option<f64>,
    /// Validation: relative tolerance (default: the sidecar's, else by precision: fp32 1e-3,
    /// fp16 1e-2).
    #[arg(long)]
    pub rtol: Option<f64>,
    /// Validation: steps of a float16/bfloat16 output's own type an element may also differ
    /// by, at max(|ref|, the output's rms) (default: the sidecar's `ulps`, else 8). float32,
    /// float64 and integer outputs ignore it.
    #[arg(long)]
    pub ulps: Option<f64>,
    /// Validation: seed of the random inputs (default: the sidecar's `golden.seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Validation: golden inputs from a NumPy `.npz` (np.savez or np.savez_compressed; one
    /// array per input name) instead of the default search and seeded random tensors
    /// (default: the sidecar's `golden.npz`).
    #[arg(long, value_name = "FILE.npz")]
    pub golden: Option<PathBuf>,
    /// Validation: integer inputs are drawn from [LO, HI), e.g. `0:2` (default: the
    /// sidecar's `golden.int_range`, else 0:2).
    #[arg(long, value_name = "LO:HI")]
    pub int_range: Option<String>,
    /// ONNX Runtime intra-op threads for building and validating (0 = ORT's default).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// ort-cpu: after validation, time the artifact's runs on ONNX Runtime's default thread
    /// pool and on one thread when its first validation run took at most this many
    /// milliseconds; consumers are told to use one thread when it runs no slower there
    /// and, for inputs the default search sized, also with the batch 256 times larger (the record's `validation.threads`, the acquire's `session_hints`). 0: never.
    /// Only with --threads 0 (the daemon's `limits.thread_probe_max_run_ms`)
    #[arg(long, value_name = "MS", default_value_t = crate::builder::validate::DEFAULT_THREAD_PROBE_MAX_RUN_MS)]
    pub thread_probe_max_run_ms: u64,
    /// ort-cpu: after the thread probe, time the artifact's sessions and runs with its
    /// weights prepacked and without when its first validation run took at most this many
    /// milliseconds; consumers are told to skip prepacking (`session.disable_prepacking`)
    /// when that makes the session faster and the runs no slower, and the session without it
    /// passes validation too (the record's `validation.prepack`, the acquire's
    /// `session_hints`). 0: never. Only with
    /// --threads 0 (the daemon's `limits.prepack_probe_max_run_ms`)
    #[arg(long, value_name = "MS", default_value_t = crate::builder::validate::DEFAULT_PREPACK_PROBE_MAX_RUN_MS)]
    pub prepack_probe_max_run_ms: u64,
    /// How many default validation candidates may be left out because ONNX Runtime crashed
    /// running the original model on them (each a new worker), before the crash is the
    /// build's failure (the daemon's `limits.validation_crash_retries`).
    #[arg(long, value_name = "N", default_value_t = crate::builder::validate::DEFAULT_CRASH_RETRIES)]
    pub validation_crash_retries: u32,
    /// Rebuild even when the cache has an entry (also retries a failed one).
    #[arg(long)]
    pub force: bool,
    /// The build runs in a worker process that is killed after this many seconds (the
    /// daemon's `limits.build_timeout_secs`).
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    pub timeout: u64,
    /// Memory bound of the build worker (`RLIMIT_DATA`), e.g. 8G; default: three quarters
    /// of this machine's memory (the daemon's `limits.worker_memory_bytes`).
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
    /// Build and validate in this process, without the worker's bounds (for debugging and
    /// for measuring the worker's cost; a hostile model can then take this process down).
    #[arg(long)]
    pub in_process: bool,
    /// libonnxruntime.so to load (else ORT_DYLIB_PATH, then the onnxruntime package of the
    /// executable's checkout .venv, $VIRTUAL_ENV or `python3 -I`; never the working directory;
    /// refused when anyone but root or this user could write it or a folder above it).
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

pub fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse().map_err(|e: crate::spec::SpecError| e.to_string())
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    crate::cache::parse_size(s).ok_or_else(|| format!("`{s}` is not a size (e.g. 256K, 1M, 0)"))
}

fn parse_hw_compat(s: &str) -> Result<crate::trt::HwCompat, String> {
    crate::trt::HwCompat::parse(s).map_err(|e| e.to_string())
}

fn parse_opt_level(s: &str) -> Result<OptLevel, String> {
    OptLevel::parse(s).ok_or_else(|| format!("`{s}`: expected disabled, basic, extended or all"))
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

/// The request `build` (and `pull`, which must compute the same key) makes of its flags:
/// the plan from the model and its sidecar, then flags over it; and `--max-size` in bytes.
pub(super) fn request(a: &BuildArgs) -> anyhow::Result<(BuildJob, Option<u64>)> {
    // The plan first: a profile that contradicts the model fails here, before any build.
    let model = Model::load(&a.model).map_err(anyhow::Error::new)?;
    let inputs = ModelInputs::of(&model);
    let plan = resolve(&a.model, &inputs, &a.profile, a.build.precision)
        .with_context(|| format!("{}: shape profile", a.model.display()))?;
    let backend = choose_backend(a.backend, &plan);
    // Before any library is loaded: the same refusal on a host without TensorRT.
    crate::plan::check_backend(&plan, &inputs, backend)
        .and_then(|()| crate::plan::check_whole_graph(&model, backend))
        .with_context(|| format!("{}: backend {backend}", a.model.display()))?;
    drop(model);
    let int_range = match &a.int_range {
        None => (plan.golden.int_range[0], plan.golden.int_range[1]),
        Some(r) => {
            let Some((lo, hi)) = r.split_once(':') else {
                bail!("--int-range: `{r}` is not LO:HI");
            };
            (
                lo.trim().parse::<i64>().context("--int-range LO")?,
                hi.trim().parse::<i64>().context("--int-range HI")?,
            )
        }
    };
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
    for (flag, v) in [("--atol", a.atol), ("--rtol", a.rtol), ("--ulps", a.ulps)] {
        if let Some(v) = v {
            if !v.is_finite() || v < 0.0 {
                bail!("{flag}: {v} is not a finite, non-negative tolerance");
            }
        }
    }
    let mut req = BuildJob::from_plan(&a.model, backend, &plan, a.build.options(&plan, a.threads)?);
    // Flags override the plan's validation settings (the sidecar's, or the defaults).
    req.force = a.force;
    req.validation = ValidationConfig {
        max_input_bytes: req.validation.max_input_bytes,
        thread_probe_max_run_ms: a.thread_probe_max_run_ms,
        prepack_probe_max_run_ms: a.prepack_probe_max_run_ms,
        seed: a.seed.unwrap_or(req.validation.seed),
        int_range,
        tolerance: Some(Tolerance {
            atol: a.atol.unwrap_or(plan.tolerance.atol),
            rtol: a.rtol.unwrap_or(plan.tolerance.rtol),
            ulps: a.ulps.or(plan.tolerance.ulps),
        }),
        golden: a.golden.clone().or(req.validation.golden),
        avoid_inputs: Vec::new(),
        crash_retries: a.validation_crash_retries,
    };
    Ok((req, max_bytes))
}

pub fn run(a: BuildArgs) -> anyhow::Result<ExitCode> {
    let (req, max_bytes) = request(&a)?;
    let backend = req.backend;
    let (store, dir) = open_store(&a.cache, max_bytes)?;
    // The same bounded worker the daemon builds in (config::Limits::worker).
    let limits = crate::config::Limits {
        build_timeout_secs: a.timeout.max(1),
        worker_memory_bytes: a.memory_limit.unwrap_or(0),
        ..Default::default()
    };
    let mut builder = Builder::new(Arc::new(store), a.ort_library.clone())
        .with_digest_memo(dir.join(DIGEST_MEMO))
        .with_timing_caches(dir.join(crate::trt::timing::TIMING_DIR));
    if !a.in_process {
        builder = builder.with_worker(limits.worker());
    }
    // `--max-size` smaller than the artifact: a final answer naming the limit, not a store
    // that evicts everything and then the artifact itself.
    if let Some(max) = max_bytes {
        builder = builder.with_size_limit(max);
    }
    let progress = |step: &Progress| match step {
        // One per candidate of the input search: for the worker's parent, not the terminal.
        Progress::TryingInputs(_) | Progress::InputsFound => {}
        _ => eprintln!("trtcache: {step}"),
    };
    // The model's path once: most build errors already start with it.
    let outcome = builder.build(&req, &progress).map_err(|e| {
        let path = a.model.display().to_string();
        let what = if e.to_string().starts_with(&path) {
            format!("building with {backend}")
        } else {
            format!("building {path} with {backend}")
        };
        anyhow::Error::new(e).context(what)
    })?;
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
        vec!["model".into(), super::output::printable(&r.model_path)],
        vec![
            "backend".into(),
            match r.parts.backend.versions.get("tensorrt") {
                Some(v) if !r.backend.is_onnx() => format!("{} (TensorRT {v})", r.backend),
                _ => format!("{} (onnxruntime {})", r.backend, ort.unwrap_or("?")),
            },
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
        let shapes = |s: &std::collections::BTreeMap<String, Vec<i64>>| {
            s.iter()
                .map(|(n, d)| {
                    format!(
                        "{n}:{}",
                        d.iter()
                            .map(|x| x.to_string())
                            .collect::<Vec<_>>()
                            .join("x")
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        let also = v
            .also_at
            .as_ref()
            .map(|a| format!(", then {}", shapes(a)))
            .unwrap_or_default();
        out.push_str(&format!(
            "validation {verdict} (abs tol {:e}, rel tol {:e}, {inputs}, shapes {}{also})\n",
            v.tolerance.atol,
            v.tolerance.rtol,
            shapes(&v.shapes)
        ));
        let rows: Vec<Vec<String>> = v
            .outputs
            .iter()
            .map(|e| {
                vec![
                    e.name.clone(),
                    format!("max abs {:.3e}", e.max_abs),
                    format!("max rel {:.3e}", e.max_rel),
                    match (e.steps_of(), e.max_ulps, e.dtype.as_deref()) {
                        (Some(t), Some(u), _) if u < f64::MAX => {
                            format!("{u:.1} {t} steps (of {})", v.tolerance.half_ulps())
                        }
                        (_, _, Some(t)) => t.to_string(),
                        _ => String::new(),
                    },
                    if e.passed {
                        st.good("ok")
                    } else {
                        st.bad(&format!("{} over", e.mismatched))
                    },
                ]
            })
            .collect();
        out.push_str(&table("  ", &rows));
        for r in &v.rewrites {
            out.push_str(&format!("rewritten: {r}\n"));
        }
        if let Some(reference) = &v.reference {
            out.push_str(&format!("compared with {reference}\n"));
        }
        if let Some(level) = &v.opt_level {
            out.push_str(&format!(
                "{} built at optimization level {level}: over tolerance higher up ({})\n",
                st.warn("note:"),
                v.rejected.join("; ")
            ));
        } else if !v.rejected.is_empty() {
            out.push_str(&format!(
                "{} built without graph rewrites: over tolerance with them ({})\n",
                st.warn("note:"),
                v.rejected.join("; ")
            ));
        }
        for e in v.outputs.iter().filter(|e| e.non_finite > 0) {
            out.push_str(&format!(
                "{} {}\n",
                st.warn("warning:"),
                crate::builder::validate::non_finite_warning(e)
            ));
        }
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
    fn extra_options() {
        let m = parse_extra(&["b=2".into(), "a = 1".into()]).unwrap();
        assert_eq!(m.get("a").map(String::as_str), Some("1"));
        assert!(parse_extra(&["x".into()]).is_err());
        assert!(parse_extra(&["=1".into()]).is_err());
        assert!(parse_extra(&["a=1".into(), "a=2".into()]).is_err());
        assert!(parse_extra(&["opt_level=basic".into()]).is_err());
    }
}
