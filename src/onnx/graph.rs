//! Index-based view of a graph: nodes in a `Vec`, tensors mapped to their producer and
//! consumers, initializers and value infos by name, and the bodies of If/Loop/Scan (and any
//! other graph attribute) as nested views. Model-local functions are looked up by
//! `(domain, name)` through [`Functions`].

use std::ops::Range;

use super::fxhash::{FastMap, FastSet};

use super::proto::{GraphProto, NodeProto, TensorProto, ValueInfoProto};

/// Index of a node in [`Graph::nodes`].
pub type NodeId = usize;

/// Where a tensor is produced: node and output slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Outlet {
    pub node: NodeId,
    pub slot: usize,
}

/// A graph attribute of a node (If branches, Loop/Scan bodies).
#[derive(Debug)]
pub struct Body<'a> {
    /// The node that owns the body.
    pub node: NodeId,
    /// The attribute name (`then_branch`, `else_branch`, `body`, …).
    pub attr: &'a str,
    pub graph: Graph<'a>,
}

/// Index-based view over one `GraphProto`.
#[derive(Debug)]
pub struct Graph<'a> {
    pub proto: &'a GraphProto,
    /// Nodes in file order (ONNX requires topological order).
    pub nodes: Vec<&'a NodeProto>,
    /// Stable display names: the node's name, or `{op_type}_{index}` when it has none.
    pub names: Vec<String>,
    pub producer: FastMap<&'a str, Outlet>,
    pub consumers: FastMap<&'a str, Vec<NodeId>>,
    pub initializers: FastMap<&'a str, &'a TensorProto>,
    /// Graph inputs that are not initializers.
    pub inputs: Vec<&'a ValueInfoProto>,
    pub outputs: Vec<&'a ValueInfoProto>,
    /// Type information by tensor name: inputs, outputs and `value_info`.
    pub value_info: FastMap<&'a str, &'a ValueInfoProto>,
    /// Nested bodies, in node order.
    pub bodies: Vec<Body<'a>>,
    /// For each node with bodies, its range in `bodies`.
    body_ranges: FastMap<NodeId, Range<usize>>,
    /// Names this graph (with its bodies) reads but does not define: outer-scope captures.
    pub captures: FastSet<&'a str>,
    /// Initializers that are also listed as graph inputs are constants, not defaults a
    /// caller may override: set for IR < 4 models, which the IR required to list every
    /// initializer as an input and which trtcache builds with those inputs removed.
    pub initializer_inputs_are_constants: bool,
}

impl<'a> Graph<'a> {
    /// Builds the view of `g` and, recursively, of every graph attribute.
    pub fn new(g: &'a GraphProto) -> Self {
        let initializers: FastMap<&str, &TensorProto> = g
            .initializer
            .iter()
            .map(|t| (t.name.as_str(), t))
            .chain(
                g.sparse_initializer
                    .iter()
                    .filter_map(|s| s.values.as_ref().map(|v| (v.name.as_str(), v))),
            )
            .collect();
        let inputs: Vec<&ValueInfoProto> = g
            .input
            .iter()
            .filter(|v| !initializers.contains_key(v.name.as_str()))
            .collect();
        let mut value_info: FastMap<&str, &ValueInfoProto> = FastMap::default();
        for v in g.value_info.iter().chain(&g.input).chain(&g.output) {
            value_info.insert(v.name.as_str(), v);
        }
        let nodes: Vec<&NodeProto> = g.node.iter().collect();
        let names = stable_names(&nodes);
        let mut producer = FastMap::default();
        producer.reserve(nodes.len());
        let mut consumers: FastMap<&str, Vec<NodeId>> = FastMap::default();
        consumers.reserve(nodes.len());
        let mut bodies = Vec::new();
        let mut body_ranges = FastMap::default();
        for (id, n) in nodes.iter().enumerate() {
            for (slot, o) in n.output.iter().enumerate() {
                if !o.is_empty() {
                    producer.insert(o.as_str(), Outlet { node: id, slot });
                }
            }
            for i in &n.input {
                if !i.is_empty() {
                    let c = consumers.entry(i.as_str()).or_default();
                    if c.last() != Some(&id) {
                        c.push(id);
                    }
                }
            }
            let first = bodies.len();
            for a in &n.attribute {
                for sub in a.g.iter().map(|b| &**b).chain(&a.graphs) {
                    bodies.push(Body {
                        node: id,
                        attr: a.name.as_str(),
                        graph: Graph::new(sub),
                    });
                }
            }
            if bodies.len() > first {
                body_ranges.insert(id, first..bodies.len());
            }
        }
        // A body's captures are implicit inputs of its node (once per node and name).
        let mut seen: FastSet<(&str, NodeId)> = FastSet::default();
        for b in &bodies {
            for &c in &b.graph.captures {
                let v = consumers.entry(c).or_default();
                if seen.insert((c, b.node)) && !nodes[b.node].input.iter().any(|i| i == c) {
                    v.push(b.node);
                }
            }
        }
        let mut graph = Self {
            proto: g,
            nodes,
            names,
            producer,
            consumers,
            initializers,
            inputs,
            outputs: g.output.iter().collect(),
            value_info,
            bodies,
            body_ranges,
            captures: FastSet::default(),
            initializer_inputs_are_constants: false,
        };
        graph.captures = graph.compute_captures();
        graph
    }

    fn compute_captures(&self) -> FastSet<&'a str> {
        let defined = |n: &str| {
            self.producer.contains_key(n)
                || self.initializers.contains_key(n)
                || self.proto.input.iter().any(|i| i.name == n)
        };
        let mut out = FastSet::default();
        for n in &self.nodes {
            for i in &n.input {
                if !i.is_empty() && !defined(i) {
                    out.insert(i.as_str());
                }
            }
        }
        for b in &self.bodies {
            for &c in &b.graph.captures {
                if !defined(c) {
                    out.insert(c);
                }
            }
        }
        for o in &self.proto.output {
            if !defined(&o.name) {
                out.insert(o.name.as_str());
            }
        }
        out
    }

    /// Inputs a node reads, explicit and captured by its bodies, without duplicates.
    pub fn node_reads(&self, id: NodeId) -> Vec<&'a str> {
        let mut seen: FastSet<&str> = FastSet::default();
        let mut out = Vec::new();
        for i in &self.nodes[id].input {
            if !i.is_empty() && seen.insert(i.as_str()) {
                out.push(i.as_str());
            }
        }
        for b in self.bodies_of(id) {
            let mut caps: Vec<&str> = b.graph.captures.iter().copied().collect();
            caps.sort_unstable();
            for c in caps {
                if seen.insert(c) {
                    out.push(c);
                }
            }
        }
        out
    }

    /// Bodies owned by node `id`.
    pub fn bodies_of(&self, id: NodeId) -> impl Iterator<Item = &Body<'a>> {
        let range = self.body_ranges.get(&id).cloned().unwrap_or(0..0);
        self.bodies[range].iter()
    }

    /// Number of nodes here and in every nested body.
    pub fn node_count_total(&self) -> usize {
        self.nodes.len()
            + self
                .bodies
                .iter()
                .map(|b| b.graph.node_count_total())
                .sum::<usize>()
    }
}

fn stable_names(nodes: &[&NodeProto]) -> Vec<String> {
    let taken: FastSet<&str> = nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if !n.name.is_empty() {
                return n.name.clone();
            }
            let mut name = format!("{}_{i}", n.op_type);
            while taken.contains(name.as_str()) {
                name.push('_');
            }
            name
        })
        .collect()
}
