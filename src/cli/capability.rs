//! Human rendering of the capability section of `inspect`: the summary line, what TensorRT
//! does not take, data-dependent shapes, host↔device copies and the partitions.

use super::output::{human_bytes, table, Style};
use crate::analysis::Capability;
use crate::spec::Provider;

fn list(names: &[String], max: usize) -> String {
    let mut s = names
        .iter()
        .take(max)
        .map(|n| n.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > max {
        s += &format!(", … (+{})", names.len() - max);
    }
    s
}

/// The capability section as text.
pub fn render(c: &Capability, st: Style) -> String {
    let mut out = format!(
        "\n{} (TensorRT {}; providers {})\n  {}\n",
        st.heading("capability"),
        c.trt_version,
        c.providers
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(","),
        c.summary()
    );
    let declined = if c.providers.contains(&Provider::TensorRt) {
        c.declined_by_trt()
    } else {
        Vec::new()
    };
    if !declined.is_empty() {
        out += &format!("\n{}\n", st.heading("not taken by TensorRT"));
        let mut rows = vec![vec![
            st.dim("operator"),
            st.dim("count"),
            st.dim("reason"),
            st.dim("nodes"),
        ]];
        rows.extend(declined.iter().map(|d| {
            vec![
                d.op.clone(),
                d.count.to_string(),
                d.reason.clone(),
                list(&d.nodes, 4),
            ]
        }));
        out += &table("  ", &rows);
    }
    if !c.data_dependent.is_empty() {
        out += &format!("\n{}\n", st.heading("data-dependent shapes"));
        let rows: Vec<Vec<String>> = c
            .data_dependent
            .iter()
            .map(|d| {
                vec![
                    st.warn(&d.tensor),
                    format!("{} ({})", d.node, d.op_type),
                    d.why.clone(),
                ]
            })
            .collect();
        out += &table("  ", &rows);
    }
    if !c.boundaries.is_empty() {
        out += &format!("\n{}\n", st.heading("host↔device copies"));
        let rows: Vec<Vec<String>> = c
            .boundaries
            .iter()
            .map(|b| {
                vec![
                    b.tensor.clone(),
                    format!("{} → {}", b.from, b.to),
                    b.bytes.map_or("? bytes".into(), human_bytes),
                ]
            })
            .collect();
        out += &table("  ", &rows);
    }
    if c.partitions.len() > 1 {
        out += &format!("\n{}\n", st.heading("partitions"));
        let rows: Vec<Vec<String>> = c
            .partitions
            .iter()
            .map(|p| {
                vec![
                    format!("#{}", p.id),
                    p.provider.to_string(),
                    format!("{} node(s)", p.nodes.len()),
                    list(&p.nodes, 3),
                ]
            })
            .collect();
        out += &table("  ", &rows);
    }
    out
}
