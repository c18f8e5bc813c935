//! The saved `ort-cpu` graph, trimmed of what a consumer's session pays to read and never
//! uses: every `value_info` (ONNX Runtime infers each intermediate's type and shape again
//! while it loads the graph, and merging the saved ones costs more than it saves), every
//! doc string, and the exporters' long tensor and node names (`/model.22/cv3.0/cv3.0.0/conv/
//! Conv_output_0`), which ORT copies, hashes and compares while it builds the graph, plans
//! memory and creates kernels. Tensor names become short ones (`_1f`), one map for the whole
//! model, bodies included, so every reference and every scope stays as it was; the graph's
//! inputs and outputs keep their names (consumers feed and fetch by them), and so do the
//! names a body reads from its enclosing graphs (renamed with them, through the same map).
//!
//! It shortens a consumer's session creation by a few percent to about a tenth and leaves
//! first runs as they were (the numbers: BENCHMARKS.md, "Time to first inference, real-world
//! models").
//!
//! Enters: the decoded saved graph. Leaves: the same graph, trimmed, and how many names were
//! changed. The caller keeps the file as ORT wrote it when ORT refuses the trimmed one.

use std::collections::{HashMap, HashSet};

use crate::onnx::proto::{GraphProto, ModelProto};

/// Short tensor and node names, one per original name, never one of the kept names.
struct Renamer {
    keep: HashSet<String>,
    map: HashMap<String, String>,
    next: u64,
}

impl Renamer {
    fn fresh(&mut self, prefix: &str) -> String {
        loop {
            let s = format!("{prefix}{:x}", self.next);
            self.next += 1;
            if !self.keep.contains(&s) {
                return s;
            }
        }
    }

    fn tensor(&mut self, name: &mut String) {
        if name.is_empty() || self.keep.contains(name.as_str()) {
            return;
        }
        if let Some(s) = self.map.get(name.as_str()) {
            *name = s.clone();
            return;
        }
        let s = self.fresh("_");
        self.map.insert(std::mem::take(name), s.clone());
        *name = s;
    }
}

/// Trims `proto` in place (see the module docs); the number of tensor names changed.
pub fn compact(proto: &mut ModelProto) -> usize {
    let Some(g) = proto.graph.as_mut() else {
        return 0;
    };
    let keep: HashSet<String> = g
        .input
        .iter()
        .chain(&g.output)
        .map(|v| v.name.clone())
        .collect();
    let mut r = Renamer {
        keep,
        map: HashMap::new(),
        next: 0,
    };
    graph(g, &mut r);
    proto.doc_string.clear();
    r.map.len()
}

fn graph(g: &mut GraphProto, r: &mut Renamer) {
    g.doc_string.clear();
    g.value_info.clear();
    for v in g.input.iter_mut().chain(g.output.iter_mut()) {
        r.tensor(&mut v.name);
        v.doc_string.clear();
    }
    for t in g.initializer.iter_mut() {
        r.tensor(&mut t.name);
        t.doc_string.clear();
    }
    for s in g.sparse_initializer.iter_mut() {
        for t in s.values.iter_mut().chain(s.indices.iter_mut()) {
            r.tensor(&mut t.name);
        }
    }
    for a in g.quantization_annotation.iter_mut() {
        r.tensor(&mut a.tensor_name);
        for p in a.quant_parameter_tensor_names.iter_mut() {
            r.tensor(&mut p.value);
        }
    }
    for n in g.node.iter_mut() {
        n.doc_string.clear();
        n.name = r.fresh("n");
        for t in n.input.iter_mut().chain(n.output.iter_mut()) {
            r.tensor(t);
        }
        for a in n.attribute.iter_mut() {
            a.doc_string.clear();
            if let Some(b) = a.g.as_deref_mut() {
                graph(b, r);
            }
            for b in a.graphs.iter_mut() {
                graph(b, r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::models;

    #[test]
    fn names_shrink_consistently_and_inputs_and_outputs_keep_theirs() {
        let mut m = models::static_if(false);
        m.graph
            .as_mut()
            .unwrap()
            .value_info
            .push(Default::default());
        let renamed = compact(&mut m);
        assert!(renamed > 10, "{renamed}");
        let g = m.graph.as_ref().unwrap();
        assert!(g.value_info.is_empty());
        assert_eq!(g.input[0].name, "x");
        assert_eq!(g.output[0].name, "y");
        // `x` is read inside the first If's then branch under its own name; the branch's
        // output is renamed with the node that produces it.
        let first = &g.node[4];
        assert_eq!(first.op_type, "If");
        let then = first.attribute[0].g.as_deref().unwrap();
        assert_eq!(then.node[0].input, ["x"]);
        assert_eq!(
            then.node[0].output[0],
            then.node[4].attribute[0].g.as_ref().unwrap().node[0].input[0]
        );
        assert_eq!(then.output[0].name, then.node[4].output[0]);
        assert!(g.node.iter().all(|n| n.name.len() <= 4), "{:?}", g.node);
        // Every name a node reads is defined (an input, an initializer or an output).
        let defined: HashSet<&str> = g
            .input
            .iter()
            .map(|i| i.name.as_str())
            .chain(g.initializer.iter().map(|t| t.name.as_str()))
            .chain(
                g.node
                    .iter()
                    .flat_map(|n| n.output.iter().map(String::as_str)),
            )
            .collect();
        assert!(g
            .node
            .iter()
            .all(|n| n.input.iter().all(|i| defined.contains(i.as_str()))));
    }
}
