//! The capability report: what [`super::analyse`] returns and `inspect --json` prints under
//! `capability`, plus the aggregations the human report shows (summary line, the table of
//! what TensorRT does not take). Pure data; rendering to text lives in the CLI.

use std::collections::BTreeMap;

use crate::spec::Provider;
use serde::Serialize;

pub use super::facts::DdsOrigin;

/// One partition: a TensorRT subgraph, or a run of nodes on CUDA or CPU.
#[derive(Clone, Debug, Serialize)]
pub struct Partition {
    pub id: usize,
    pub provider: Provider,
    /// Node names in execution order.
    pub nodes: Vec<String>,
    /// Tensors read from outside the partition (initializers excluded).
    pub inputs: Vec<String>,
    /// Tensors used outside the partition or graph outputs.
    pub outputs: Vec<String>,
    /// Node ids in the top-level graph (for export; not serialised).
    #[serde(skip)]
    pub node_ids: Vec<usize>,
}

/// One top-level node and where it runs.
#[derive(Clone, Debug, Serialize)]
pub struct NodeReport {
    /// The node's name, or a stable generated `{op_type}_{index}`.
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub provider: Provider,
    /// Why earlier providers declined it, and caveats of the provider that took it.
    pub reasons: Vec<String>,
}

/// A tensor crossing between host (CPU) and device (TensorRT/CUDA).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Boundary {
    pub tensor: String,
    pub from: String,
    pub to: String,
    /// `null` when the shape or type is not known statically.
    pub bytes: Option<u64>,
}

/// The capability analysis of one model.
#[derive(Clone, Debug, Serialize)]
pub struct Capability {
    pub providers: Vec<Provider>,
    pub trt_version: String,
    pub partitions: Vec<Partition>,
    pub nodes: Vec<NodeReport>,
    pub data_dependent: Vec<DdsOrigin>,
    pub boundaries: Vec<Boundary>,
}

/// One row of "what TensorRT does not take".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declined {
    pub op: String,
    pub count: usize,
    pub reason: String,
    pub nodes: Vec<String>,
}

impl Capability {
    /// Number of nodes on `provider`.
    pub fn count(&self, provider: Provider) -> usize {
        self.nodes.iter().filter(|n| n.provider == provider).count()
    }

    /// Number of partitions on `provider`.
    pub fn subgraphs(&self, provider: Provider) -> usize {
        self.partitions
            .iter()
            .filter(|p| p.provider == provider)
            .count()
    }

    /// "412 nodes: 398 TensorRT in 2 subgraphs, 9 CUDA, 5 CPU, 4 host↔device copies".
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        for &p in &self.providers {
            let c = self.count(p);
            match p {
                Provider::TensorRt => {
                    let k = self.subgraphs(p);
                    parts.push(format!(
                        "{c} TensorRT in {k} subgraph{}",
                        if k == 1 { "" } else { "s" }
                    ))
                }
                Provider::Cuda => parts.push(format!("{c} CUDA")),
                Provider::Cpu => parts.push(format!("{c} CPU")),
            }
        }
        let b = self.boundaries.len();
        parts.push(format!(
            "{b} host↔device cop{}",
            if b == 1 { "y" } else { "ies" }
        ));
        format!("{} nodes: {}", self.nodes.len(), parts.join(", "))
    }

    /// What TensorRT does not take, grouped by operator and first reason, biggest first.
    pub fn declined_by_trt(&self) -> Vec<Declined> {
        let mut rows: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for n in &self.nodes {
            if n.provider == Provider::TensorRt {
                continue;
            }
            let reason = n
                .reasons
                .first()
                .cloned()
                .unwrap_or_else(|| "TensorRT not in --providers".into());
            let op = if n.domain.is_empty() {
                n.op_type.clone()
            } else {
                format!("{}::{}", n.domain, n.op_type)
            };
            rows.entry((op, reason)).or_default().push(n.name.clone());
        }
        let mut out: Vec<Declined> = rows
            .into_iter()
            .map(|((op, reason), nodes)| Declined {
                op,
                count: nodes.len(),
                reason,
                nodes,
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then(a.op.cmp(&b.op)));
        out
    }
}
