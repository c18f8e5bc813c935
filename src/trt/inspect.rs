//! `inspect --trt`: the ONNX parser's own verdict (`supportsModelV2` through the shim, a
//! [`SupportReport`]) beside the static table's ([`crate::analysis::Capability`]), node by
//! node, with every disagreement flagged. The parser's node indices are positions in the
//! graph's node list, the order `Capability::nodes` is in.

use serde::Serialize;

use super::types::SupportReport;
use crate::analysis::Capability;

/// One node's two verdicts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeVerdict {
    pub index: usize,
    pub name: String,
    pub op_type: String,
    /// The static analysis placed it on TensorRT.
    pub table: bool,
    /// The parser put it in a supported subgraph (`None`: in no subgraph it reported).
    pub parser: Option<bool>,
    /// `table` and `parser` differ (a node in no subgraph counts as unsupported).
    pub disagree: bool,
}

/// Both verdicts for every node of the analysis.
pub fn compare(cap: &Capability, report: &SupportReport) -> Vec<NodeVerdict> {
    let parser = report.node_verdicts();
    cap.nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let table = n.provider == crate::analysis::Provider::TensorRt;
            let p = parser.get(&i).copied();
            NodeVerdict {
                index: i,
                name: n.name.clone(),
                op_type: n.op_type.clone(),
                table,
                parser: p,
                disagree: table != p.unwrap_or(false),
            }
        })
        .collect()
}
