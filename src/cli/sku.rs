//! `trtcache sku [--json]`: the devices found and the SKU keys are made for.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use super::output::{human_bytes, table, Style};
use crate::device::{detect, DeviceReport};

/// Show the GPUs (through the CUDA driver, when present), the CPU, and the SKU that cache
/// keys use: the selected GPU (TRTCACHE_DEVICE, default 0) or, without one, the CPU.
#[derive(Debug, Args)]
pub struct SkuArgs {
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: SkuArgs) -> anyhow::Result<ExitCode> {
    let r = detect();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).context("serialising the device report")?
        );
    } else {
        print!("{}", render(&r, Style::stdout()));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(r: &DeviceReport, st: Style) -> String {
    let mut out = String::new();
    out += &format!("{}\n", st.heading("gpus"));
    if r.gpus.is_empty() {
        out += &format!(
            "  none: {}\n",
            r.gpu_unavailable.as_deref().unwrap_or("unknown reason")
        );
    } else {
        let rows: Vec<Vec<String>> = r
            .gpus
            .iter()
            .map(|g| {
                vec![
                    format!(
                        "{}{}",
                        g.ordinal,
                        if r.selected_gpu == Some(g.ordinal) {
                            "*"
                        } else {
                            ""
                        }
                    ),
                    g.name.clone(),
                    format!("sm_{}", g.compute_capability.replace('.', "")),
                    format!("{} SMs", g.sm_count),
                    human_bytes(g.memory_bytes),
                    format!("driver CUDA {}", g.driver_version),
                    g.uuid.clone(),
                ]
            })
            .collect();
        out += &table("  ", &rows);
        if let Some(why) = &r.gpu_unavailable {
            out += &format!("  {}\n", st.warn(why));
        }
    }
    let c = &r.cpu;
    out += &format!("\n{}\n", st.heading("cpu"));
    out += &table(
        "  ",
        &[
            vec!["model".into(), c.model_name.clone()],
            vec!["vendor".into(), c.vendor.clone()],
            vec![
                "arch".into(),
                format!("{} ({} logical CPUs)", c.arch, c.logical_cpus),
            ],
            vec!["isa".into(), c.isa.join(" ")],
        ],
    );
    if let Some(n) = &c.note {
        out += &format!("  {}\n", st.warn(n));
    }
    let s = &r.sku;
    out += &format!("\n{}\n", st.heading("sku (used for keys)"));
    let mut detail = vec![s.kind.clone(), s.name.clone()];
    if let Some(cc) = &s.compute_capability {
        detail.push(format!("cc {cc}"));
    }
    if let Some(n) = s.sm_count {
        detail.push(format!("{n} SMs"));
    }
    if !s.isa.is_empty() {
        detail.push(s.isa.join(" "));
    }
    out += &format!("  {}\n", detail.join("  "));
    out
}
