//! `trtcache inspect MODEL [--json]`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::output::{human_bytes, table, Style};
use crate::analysis::export::export_subgraphs;
use crate::analysis::tables::TrtTable;
use crate::analysis::{analyse_full, Capability, Options, Provider};
use crate::onnx::facts::{facts, Facts, OpsetBounds};
use crate::onnx::Model;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The ONNX model file.
    pub model: PathBuf,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
    /// Execution providers in priority order; each node goes to the first that takes it
    /// (CPU is appended when missing, as ONNX Runtime does).
    #[arg(long, value_delimiter = ',', default_value = "tensorrt,cuda,cpu")]
    pub providers: Vec<String>,
    /// TensorRT version whose ONNX operator table to use (bundled: 10.15, 10.1). Default: the
    /// installed TensorRT's when a table exists for it, else the newest bundled.
    #[arg(long)]
    pub trt_version: Option<String>,
    /// Operator types TensorRT must not take, comma-separated (like ONNX Runtime's
    /// trt_op_types_to_exclude).
    #[arg(long, value_delimiter = ',', value_name = "OPS")]
    pub trt_exclude: Vec<String>,
    /// Keep the data-dependent-shape ops NonMaxSuppression, NonZero and RoiAlign off TensorRT.
    #[arg(long)]
    pub trt_exclude_dds: bool,
    /// TensorRT subgraphs with fewer nodes fall back to the next provider.
    #[arg(long, default_value_t = 1)]
    pub min_subgraph_size: usize,
    /// Write each partition as a standalone ONNX model plus manifest.json into DIR.
    #[arg(long, value_name = "DIR")]
    pub export_subgraphs: Option<PathBuf>,
    /// Also ask TensorRT's own ONNX parser (`supportsModelV2`, through the TensorRT shim;
    /// needs TensorRT, docs/trt.md) and show its verdict per node next to the static
    /// table's, flagging every disagreement. Runs on the GPU TRTCACHE_DEVICE names (default 0).
    #[arg(long)]
    pub trt: bool,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    facts: Facts,
    capability: Capability,
    /// `--trt`: the parser's verdict beside the table's.
    #[serde(skip_serializing_if = "Option::is_none")]
    parser: Option<ParserReport>,
}

/// TensorRT's parser on the model, node by node against the static analysis.
#[derive(Serialize)]
struct ParserReport {
    tensorrt_version: String,
    /// The parser takes the whole model.
    supported: bool,
    nodes: Vec<crate::trt::inspect::NodeVerdict>,
    disagreements: usize,
    /// The parser's own error records.
    errors: Vec<serde_json::Value>,
}

/// Opset bounds: the selected TensorRT table's parser range and ONNX Runtime 1.31.
pub fn opset_bounds(trt: &TrtTable) -> Vec<OpsetBounds> {
    vec![
        OpsetBounds {
            who: trt.who().to_string(),
            min: trt.min_opset,
            max: trt.max_opset,
        },
        OpsetBounds {
            who: "ONNX Runtime 1.31".into(),
            min: 7,
            max: 25,
        },
    ]
}

pub fn run(a: InspectArgs) -> anyhow::Result<ExitCode> {
    let providers = a
        .providers
        .iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| Provider::parse(p))
        .collect::<Result<Vec<_>, _>>()
        .context("--providers")?;
    let trt_version = a
        .trt_version
        .clone()
        .unwrap_or_else(crate::analysis::tables::host_trt_version);
    let opts = Options {
        providers,
        trt_version: trt_version.clone(),
        trt_exclude: a.trt_exclude.clone(),
        trt_exclude_dds: a.trt_exclude_dds,
        min_subgraph_size: a.min_subgraph_size,
        ..Options::default()
    };
    let trt = TrtTable::load(&trt_version).context("--trt-version")?;
    // The shim first: without TensorRT, --trt fails before any analysis.
    let shim = if a.trt {
        let device = crate::config::gpu_ordinal()
            .ok()
            .and_then(|d| i32::try_from(d).ok())
            .with_context(|| {
                format!(
                    "inspect --trt: {} is not a GPU ordinal",
                    crate::config::DEVICE_ENV
                )
            })?;
        Some((
            crate::builder::backends::trt::shim().context("inspect --trt")?,
            device,
        ))
    } else {
        None
    };
    let model = Model::load(&a.model).map_err(anyhow::Error::new)?;
    // Facts and capability are independent reads of the model: run them side by side.
    let bounds = opset_bounds(&trt);
    let (facts, analysis) = std::thread::scope(|s| {
        let f = s.spawn(|| facts(&model, &bounds));
        let analysis = analyse_full(&model, &opts);
        (f.join(), analysis)
    });
    let facts = facts.map_err(|_| anyhow::anyhow!("collecting model facts panicked"))?;
    let analysis = analysis.with_context(|| format!("analysing {}", a.model.display()))?;
    if let Some(dir) = &a.export_subgraphs {
        let m = export_subgraphs(&analysis, &model, dir)
            .with_context(|| format!("exporting partitions to {}", dir.display()))?;
        eprintln!(
            "exported {} partition(s) and manifest.json to {}",
            m.partitions.len(),
            dir.display()
        );
    }
    let crate::analysis::Analysis {
        capability,
        graph,
        facts: tensor_facts,
        ..
    } = analysis;
    let parser = match &shim {
        Some((shim, device)) => {
            let verdict = shim
                .supports(&model.bytes, a.model.parent(), *device)
                .with_context(|| format!("TensorRT's parser on {}", a.model.display()))?;
            let nodes = crate::trt::inspect::compare(&capability, &verdict);
            Some(ParserReport {
                tensorrt_version: shim.version().to_string(),
                supported: verdict.supported,
                disagreements: nodes.iter().filter(|n| n.disagree).count(),
                nodes,
                errors: verdict.errors,
            })
        }
        None => None,
    };
    let report = Report {
        facts,
        capability,
        parser,
    };
    if a.json {
        use std::io::Write;
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
        serde_json::to_writer_pretty(&mut w, &report).context("serialising the report")?;
        writeln!(w)
            .and_then(|()| w.flush())
            .context("writing the report")?;
    } else {
        print!("{}", render(&report, Style::stdout()));
        if let Some(p) = &report.parser {
            print!("{}", render_parser(p, Style::stdout()));
        }
    }
    // The process exits right after: skip freeing the model, graph and report piece by piece.
    std::mem::forget((report, graph, tensor_facts));
    std::mem::forget(model);
    Ok(ExitCode::SUCCESS)
}

/// The `--trt` section: one row per node, disagreements marked.
fn render_parser(p: &ParserReport, st: Style) -> String {
    let verdict = |v: Option<bool>| match v {
        Some(true) => Provider::TensorRt.name().to_string(),
        Some(false) => "unsupported".to_string(),
        None => "not in a subgraph".to_string(),
    };
    let mut out = format!(
        "\n{} TensorRT {} parser: {}; {} of {} nodes disagree with the table\n",
        st.heading("parser"),
        p.tensorrt_version,
        if p.supported {
            st.good("supports the whole model")
        } else {
            st.bad("does not support the whole model")
        },
        p.disagreements,
        p.nodes.len()
    );
    let mut rows = vec![["#", "NODE", "OP", "TABLE", "PARSER", ""]
        .map(|s| st.heading(s))
        .to_vec()];
    for n in &p.nodes {
        rows.push(vec![
            n.index.to_string(),
            n.name.clone(),
            n.op_type.clone(),
            if n.table {
                Provider::TensorRt.name()
            } else {
                "other"
            }
            .to_string(),
            verdict(n.parser),
            if n.disagree {
                st.bad("DISAGREE")
            } else {
                String::new()
            },
        ]);
    }
    out.push_str(&table("  ", &rows));
    for e in &p.errors {
        out.push_str(&format!("  parser error: {e}\n"));
    }
    out
}

fn shape_str(s: &Option<Vec<crate::onnx::facts::Dim>>) -> String {
    match s {
        None => "(no shape)".into(),
        Some(d) => format!(
            "[{}]",
            d.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn render(r: &Report, st: Style) -> String {
    let f = &r.facts;
    let m = &f.model;
    let mut out = String::new();
    let opsets = m
        .opset_imports
        .iter()
        .map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect::<Vec<_>>()
        .join(" ");
    let producer = format!("{} {}", m.producer_name, m.producer_version);
    let ext = if m.external_data_files.is_empty() {
        String::new()
    } else {
        format!(", external data: {}", m.external_data_files.join(", "))
    };
    out += &table(
        "",
        &[
            vec![
                st.heading("model"),
                format!("{} ({})", m.path, human_bytes(m.file_bytes)),
            ],
            vec![
                st.heading("ir"),
                format!("{}   opsets {opsets}", m.ir_version),
            ],
            vec![st.heading("producer"), producer.trim().to_string()],
            vec![
                st.heading("nodes"),
                format!(
                    "{} ({} with subgraphs and functions)",
                    m.node_count, m.node_count_total
                ),
            ],
            vec![
                st.heading("weights"),
                format!(
                    "{} initializers, {}{ext}",
                    m.initializer_count,
                    human_bytes(m.initializer_bytes)
                ),
            ],
        ],
    );
    for (title, vals) in [("inputs", &f.inputs), ("outputs", &f.outputs)] {
        out += &format!("\n{}\n", st.heading(title));
        let rows: Vec<Vec<String>> = vals
            .iter()
            .map(|v| vec![v.name.clone(), v.dtype.clone(), shape_str(&v.shape)])
            .collect();
        out += &table("  ", &rows);
    }
    out += &format!("\n{}\n", st.heading("operators"));
    let mut ops: Vec<(&String, &usize)> = f.op_histogram.iter().collect();
    ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let rows: Vec<Vec<String>> = ops
        .iter()
        .map(|(k, v)| vec![k.to_string(), v.to_string()])
        .collect();
    out += &table("  ", &rows);
    if !f.warnings.is_empty() {
        out += &format!("\n{}\n", st.heading("warnings"));
        let rows: Vec<Vec<String>> = f
            .warnings
            .iter()
            .map(|w| vec![st.warn(w.code), w.message.clone()])
            .collect();
        out += &table("  ", &rows);
    }
    out += &super::capability::render(&r.capability, st);
    out
}
