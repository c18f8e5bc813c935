//! `trtcache key MODEL …`: the cache key of a model for a backend, profile and precision,
//! with every part that went into it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::build::{choose_backend, BuildOptionArgs};
use super::cache::CacheArgs;
use super::output::{human_bytes, table, Style};
use crate::cache::DIGEST_MEMO;
use crate::key::{
    digest::default_threads, key_for, plain_model_digest, CacheKey, DigestOptions, DigestReport,
    KeyInput, KeyParts, ModelDigest,
};
use crate::onnx::Model;
use crate::plan::{resolve, ModelInputs, ProfileArgs};
use crate::spec::Backend;

/// Print the cache key of MODEL and every part hashed into it: the model's content digest
/// (graph file plus external data, never its path or mtime), opsets, the shape profile, the
/// device SKU, the backend with its library versions, the precision and build options. It is
/// the key `trtcache build` with the same flags (and sidecar) uses. Digests are remembered
/// in CACHE_DIR/digests.json by (device, inode, size, mtime, ctime), so an unchanged model is
/// not hashed again; the cache's lock is not needed (a daemon may hold it).
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The ONNX model file.
    pub model: PathBuf,
    #[command(flatten)]
    pub profile: ProfileArgs,
    /// Backend the artifact is built with (default: the sidecar's first, else ort-cpu).
    #[arg(long)]
    pub backend: Option<Backend>,
    #[command(flatten)]
    pub build: BuildOptionArgs,
    /// libonnxruntime.so a build would load (else ORT_DYLIB_PATH, then an onnxruntime Python
    /// package); its version is part of the key.
    #[arg(long, env = "TRTCACHE_ORT_LIBRARY")]
    pub ort_library: Option<PathBuf>,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Hash every time: neither read nor write the digest memo (kept in the cache directory,
    /// and only when that folder is a trtcache cache).
    #[arg(long)]
    pub no_memo: bool,
    /// Hashing threads (default: all cores).
    #[arg(long, env = "TRTCACHE_HASH_THREADS")]
    pub threads: Option<usize>,
    /// Also show the plain SHA-256 of each file (as sha256sum prints it).
    #[arg(long)]
    pub sha256: bool,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    key: CacheKey,
    parts: KeyParts,
    /// The profile's name (not hashed) and where the plan came from.
    profile_name: Option<String>,
    sidecar: Option<PathBuf>,
    digest: DigestReport,
    /// How `parts.model.*.sha256` were computed (see docs/keys.md).
    digest_scheme: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    plain_sha256: Option<ModelDigest>,
}

pub fn run(a: KeyArgs) -> anyhow::Result<ExitCode> {
    let model = Model::load(&a.model).map_err(anyhow::Error::new)?;
    let inputs = ModelInputs::of(&model);
    let plan = resolve(&a.model, &inputs, &a.profile, a.build.precision)
        .with_context(|| format!("{}: shape profile", a.model.display()))?;
    // The memo lives in a cache: never written into a folder that is not one.
    let mut memo_refused = None;
    let memo = if a.no_memo {
        None
    } else {
        let dir = a.cache.dir();
        match super::cache::creatable_cache(&dir)
            .map_err(anyhow::Error::new)
            .and_then(|()| crate::cache::claim_dir(&dir).map_err(anyhow::Error::new))
        {
            Ok(()) => Some(dir.join(DIGEST_MEMO)),
            Err(e) => {
                memo_refused = Some(format!("{e:#}"));
                None
            }
        }
    };
    let threads = a.threads.unwrap_or_else(default_threads).max(1);
    let profile_name = plan.profile.as_ref().map(|p| p.name.clone());
    let backend = choose_backend(a.backend, &plan);
    let build = a.build.options(&plan, 0)?;
    // The version of the library a build would load, found without loading it.
    let (_, onnxruntime) = crate::libs::onnxruntime::locate(a.ort_library.as_deref())
        .with_context(|| format!("backend {backend}"))?;
    let (parts, mut report) = key_for(
        &model,
        KeyInput {
            profile: plan.profile.as_ref(),
            precision: plan.precision,
            backend,
            device: build.device_id,
            options: build.key_options(backend),
            tensorrt: None,
        },
        &onnxruntime,
        &DigestOptions { threads, memo },
    )
    .with_context(|| format!("{}: key", a.model.display()))?;
    if report.memo_error.is_none() {
        report.memo_error = memo_refused;
    }
    let plain_sha256 = if a.sha256 {
        Some(
            plain_model_digest(&model, threads)
                .with_context(|| format!("{}: sha256", a.model.display()))?,
        )
    } else {
        None
    };
    let r = Report {
        key: parts.key(),
        parts,
        profile_name,
        sidecar: plan.sidecar,
        digest: report,
        digest_scheme: crate::key::digest::TREE_SCHEME,
        plain_sha256,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).context("serialising the key report")?
        );
    } else {
        print!("{}", render(&a, &r, Style::stdout()));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(a: &KeyArgs, r: &Report, st: Style) -> String {
    let p = &r.parts;
    let d = &r.digest;
    let how = if d.memo_hits == d.files {
        "remembered".to_string()
    } else {
        format!(
            "hashed {} in {:.3} s on {} thread(s){}",
            human_bytes(d.hashed_bytes),
            d.seconds,
            d.threads,
            if d.memo_hits > 0 {
                format!(", {} file(s) remembered", d.memo_hits)
            } else {
                String::new()
            }
        )
    };
    let mut rows = vec![
        vec![st.heading("key"), r.key.hex()],
        vec![
            st.heading("model"),
            format!("{} ({})", a.model.display(), human_bytes(p.model.bytes)),
        ],
        vec![
            "  digest".into(),
            format!("{}  {}", p.model.sha256, st.dim(&how)),
        ],
    ];
    for e in &p.model.external {
        rows.push(vec![
            "  external".into(),
            format!("{} ({})  {}", e.location, human_bytes(e.bytes), e.sha256),
        ]);
    }
    if let Some(plain) = &r.plain_sha256 {
        rows.push(vec!["  sha256".into(), plain.sha256.clone()]);
        for e in &plain.external {
            rows.push(vec![format!("  sha256 {}", e.location), e.sha256.clone()]);
        }
    }
    let opsets = p
        .opsets
        .iter()
        .map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect::<Vec<_>>()
        .join(" ");
    rows.push(vec![st.heading("opsets"), opsets]);
    match &p.profile {
        None => rows.push(vec![
            st.heading("profile"),
            "none (no dynamic input given shapes)".into(),
        ]),
        Some(pr) => {
            rows.push(vec![
                st.heading("profile"),
                r.profile_name.clone().unwrap_or_default(),
            ]);
            for (name, opt) in &pr.opt {
                let f = |v: Option<&Vec<i64>>| {
                    v.map(|s| {
                        s.iter()
                            .map(|d| d.to_string())
                            .collect::<Vec<_>>()
                            .join("x")
                    })
                    .unwrap_or_default()
                };
                rows.push(vec![
                    format!("  {name}"),
                    format!(
                        "min {}  opt {}  max {}",
                        f(pr.min.get(name)),
                        f(Some(opt)),
                        f(pr.max.get(name))
                    ),
                ]);
            }
        }
    }
    let s = &p.sku;
    let mut sku = format!("{} {}", s.kind, s.name);
    if let Some(cc) = &s.compute_capability {
        sku += &format!(" cc {cc}");
    }
    if let Some(n) = s.sm_count {
        sku += &format!(" {n} SMs");
    }
    if !s.isa.is_empty() {
        sku += &format!("  [{}]", s.isa.join(" "));
    }
    rows.push(vec![st.heading("sku"), sku]);
    let libs = p
        .backend
        .versions
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    rows.push(vec![
        st.heading("backend"),
        format!("{} ({libs})", p.backend.name),
    ]);
    rows.push(vec![st.heading("precision"), p.precision.to_string()]);
    if !p.options.is_empty() {
        let o = p
            .options
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        rows.push(vec![st.heading("options"), o]);
    }
    if let Some(sc) = &r.sidecar {
        rows.push(vec![st.heading("sidecar"), sc.display().to_string()]);
    }
    if let Some(e) = &d.memo_error {
        rows.push(vec![st.warn("memo"), e.clone()]);
    }
    table("", &rows)
}
