//! Stage 2 of the data flow: capability analysis. For a loaded model, says which nodes
//! TensorRT takes and in which subgraphs, what falls back to CUDA or CPU and why, where
//! data-dependent shapes start, and which tensors cross between host and device.
//!
//! Enters: a [`Model`] and [`Options`]. Leaves: a [`Capability`] (serde-serialisable, so the
//! build stage can record the plan per artifact). No GPU needed: everything comes from the
//! graph and the bundled operator tables ([`tables`]). The steps, one module each:
//! [`shapes`]/[`infer`] (symbolic shapes, types, value classes), [`dds`] (data-dependent
//! shapes), [`restrict`] (what TensorRT's parser takes), [`partition`] (provider assignment
//! and acyclic subgraphs), [`report`] (the result), [`export`] (partitions as ONNX files).

pub(crate) mod dds;
pub(crate) mod export;
pub(crate) mod facts;
pub(crate) mod infer;
pub mod partition;
pub(crate) mod report;
pub(crate) mod restrict;
pub(crate) mod shapes;
pub mod tables;
pub(crate) mod types;

pub use report::{Boundary, Capability, NodeReport, Partition};
pub use tables::{default_trt_version, trt_versions};

use crate::onnx::graph::Graph;
use crate::onnx::Model;
use facts::{FastMap, FastSet, GraphFacts};
use partition::{order_from_preds, preds, split, Prov, SplitInput};
use restrict::TrtCheck;
use shapes::propagate_with;
use tables::{CudaTable, TrtTable};

pub use crate::spec::Provider;

/// Why the analysis could not run (bad options; a model that loads never errors).
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error(transparent)]
    TrtVersion(#[from] tables::UnknownTrtVersion),
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    #[error("provider `{0}` listed twice")]
    DuplicateProvider(String),
}

/// Analysis options (the `inspect` flags).
#[derive(Clone, Debug)]
pub struct Options {
    /// Priority order; CPU is appended when missing, as ONNX Runtime does.
    pub providers: Vec<Provider>,
    pub trt_version: String,
    /// Op types TensorRT must not take (`--trt-exclude`).
    pub trt_exclude: Vec<String>,
    /// Shorthand for excluding NonMaxSuppression, NonZero, RoiAlign.
    pub trt_exclude_dds: bool,
    /// TensorRT subgraphs with fewer nodes go to the next provider.
    pub min_subgraph_size: usize,
    /// Deepest If/Loop/Scan nesting analysed.
    pub max_body_depth: usize,
    /// Bound on drop-and-regroup rounds of the partitioner.
    pub max_partition_iterations: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            providers: vec![Provider::TensorRt, Provider::Cuda, Provider::Cpu],
            trt_version: default_trt_version().to_string(),
            trt_exclude: Vec::new(),
            trt_exclude_dds: false,
            min_subgraph_size: 1,
            max_body_depth: 16,
            max_partition_iterations: 1000,
        }
    }
}

impl Options {
    /// The provider list with CPU appended when missing; errors on duplicates.
    pub fn provider_list(&self) -> Result<Vec<Provider>, AnalysisError> {
        let mut out: Vec<Provider> = Vec::new();
        for &p in &self.providers {
            if out.contains(&p) {
                return Err(AnalysisError::DuplicateProvider(p.name().into()));
            }
            out.push(p);
        }
        if !out.contains(&Provider::Cpu) {
            out.push(Provider::Cpu);
        }
        Ok(out)
    }
}

/// Whatever the analysis learned besides the report, for [`export`].
pub struct Analysis<'m> {
    pub capability: Capability,
    pub graph: Graph<'m>,
    pub facts: GraphFacts<'m>,
    /// Topological node order of `graph`.
    pub order: Vec<usize>,
    /// The model's ai.onnx opset.
    pub opset: i64,
    /// [`Options::max_body_depth`], for the export's typing of bodies.
    pub max_body_depth: usize,
}

/// Runs the capability analysis of `model`.
pub fn analyse(model: &Model, opts: &Options) -> Result<Capability, AnalysisError> {
    analyse_full(model, opts).map(|a| a.capability)
}

/// [`analyse`], keeping the graph view and tensor facts.
#[tracing::instrument(skip_all, fields(model = %model.path.display()))]
pub fn analyse_full<'m>(model: &'m Model, opts: &Options) -> Result<Analysis<'m>, AnalysisError> {
    let providers = opts.provider_list()?;
    let table = TrtTable::load(&opts.trt_version)?;
    let cuda = CudaTable::bundled();
    let opset = model.opset("").unwrap_or(0);
    let mut g = Graph::new(model.graph());
    // As `build` runs them (builder::backends::ort_cpu::initializers_as_constants): weights, not inputs.
    g.initializer_inputs_are_constants = model.proto.ir_version < 4;
    let preds = preds(&g);
    let (order, cyclic) = order_from_preds(&preds);
    if cyclic {
        tracing::warn!("graph has a cycle; partitions are best effort");
    }
    let exclude: FastSet<String> = opts
        .trt_exclude
        .iter()
        .map(|s| s.trim().to_string())
        .collect();
    let io: FastSet<String> = g
        .proto
        .input
        .iter()
        .chain(&g.proto.output)
        .map(|v| v.name.clone())
        .collect();
    let check = TrtCheck {
        table: &table,
        opset,
        exclude: &exclude,
        exclude_dds: opts.trt_exclude_dds,
        io: &io,
        max_depth: opts.max_body_depth,
    };
    let n = g.nodes.len();
    let mut claims: Vec<Vec<Prov>> = vec![Vec::new(); n];
    // Per node and provider: why it declines, or caveats when it claims.
    let np = providers.len();
    let mut said: Vec<Vec<String>> = vec![Vec::new(); n * np];
    // Each node is checked as soon as its outputs are known, while its tensors are in cache.
    let facts = propagate_with(&g, &order, None, opset, |id, facts| {
        let Some(node) = g.nodes.get(id) else {
            return;
        };
        let c = &mut claims[id];
        let per = &mut said[id * np..(id + 1) * np];
        for (pi, p) in providers.iter().enumerate() {
            match p {
                Provider::TensorRt => {
                    let v = check.node(&g, id, facts, 0);
                    if v.reasons.is_empty() {
                        c.push(pi);
                        per[pi] = v.notes;
                    } else {
                        per[pi] = v.reasons;
                    }
                }
                Provider::Cuda => {
                    // Constant nodes become initializers at load time and need no kernel.
                    if node.op_type == "Constant" && matches!(node.domain.as_str(), "" | "ai.onnx")
                    {
                        c.push(pi);
                    } else if !cuda.covers(&node.domain, &node.op_type, opset) {
                        per[pi].push(cuda_reason(&cuda, &node.domain, &node.op_type, opset));
                    } else if let Some(why) = cuda_types(&cuda, node, facts) {
                        per[pi].push(why);
                    } else {
                        c.push(pi);
                    }
                }
                Provider::Cpu => {
                    c.push(pi);
                    if !matches!(
                        node.domain.as_str(),
                        "" | "ai.onnx" | "ai.onnx.ml" | "com.microsoft"
                    ) {
                        per[pi].push(format!(
                            "ONNX Runtime's CPU provider runs `{}::{}` only when a custom-op library registers it",
                            node.domain, node.op_type
                        ));
                    }
                }
            }
        }
    });
    // Nodes the walk did not reach (none in a valid graph) still go somewhere.
    let cpu = providers
        .iter()
        .position(|&p| p == Provider::Cpu)
        .unwrap_or(0);
    for c in claims.iter_mut().filter(|c| c.is_empty()) {
        c.push(cpu);
    }
    let trt = providers.iter().position(|&p| p == Provider::TensorRt);
    let sp = split(&SplitInput {
        preds: &preds,
        order: &order,
        claims: &claims,
        trt,
        min_subgraph_size: opts.min_subgraph_size,
        max_iterations: opts.max_partition_iterations,
    });
    let pname = |p: Prov| providers.get(p).copied().unwrap_or(Provider::Cpu);
    let nodes: Vec<NodeReport> = (0..n)
        .map(|id| {
            let node = g.nodes[id];
            let fin = sp.provider[id];
            let per = &mut said[id * np..(id + 1) * np];
            let mut r = Vec::new();
            for (pi, what) in per.iter_mut().enumerate().take(fin) {
                // A provider that claimed the node but lost it explains itself in sp.reasons.
                if !claims[id].contains(&pi) {
                    r.append(what);
                }
            }
            r.extend(sp.reasons.get(id).into_iter().flatten().cloned());
            if let Some(notes) = per.get_mut(fin) {
                r.append(notes);
            }
            NodeReport {
                name: g.names[id].clone(),
                op_type: node.op_type.clone(),
                domain: node.domain.clone(),
                provider: pname(fin),
                reasons: r,
            }
        })
        .collect();
    let (partitions, boundaries) = wire(&g, &facts, &sp, &pname);
    let capability = Capability {
        providers: providers.clone(),
        trt_version: table.version.clone(),
        partitions,
        nodes,
        data_dependent: facts.dds.clone(),
        boundaries,
    };
    Ok(Analysis {
        capability,
        graph: g,
        facts,
        order,
        opset,
        max_body_depth: opts.max_body_depth,
    })
}

/// [`CudaTable::type_reason`] for a node, from the element types the facts know. Only the
/// inputs are looked at (one lookup each: this runs for every node): a kernel that writes a
/// string tensor reads one too, except Cast to string, whose `to` says so.
fn cuda_types(
    cuda: &CudaTable,
    node: &crate::onnx::proto::NodeProto,
    facts: &GraphFacts,
) -> Option<String> {
    if node.op_type == "Cast" {
        let to = crate::onnx::attr::int(node, "to");
        if to == Some(i64::from(crate::onnx::ElemType::String.code())) {
            return Some(
                "ONNX Runtime's CUDA provider has no string kernels (Cast to string)".into(),
            );
        }
    }
    let mut typed = node
        .input
        .iter()
        .filter_map(|s| Some((s.as_str(), facts.get(s)?.dtype?)))
        .peekable();
    let first = match (node.input.first(), typed.peek()) {
        (Some(i), Some((name, t))) if i == name => Some(*t),
        _ => None,
    };
    cuda.type_reason(&node.op_type, first, typed)
}

fn cuda_reason(cuda: &CudaTable, domain: &str, op: &str, opset: i64) -> String {
    match domain {
        "" | "ai.onnx" if cuda.has_any(domain, op) => {
            format!("ONNX Runtime's CUDA provider has no `{op}` kernel for opset {opset}")
        }
        "" | "ai.onnx" => format!("ONNX Runtime's CUDA provider has no `{op}` kernel"),
        d => format!("ONNX Runtime's CUDA provider has no kernel for `{d}::{op}`"),
    }
}

/// Partition inputs/outputs and host↔device boundaries.
fn wire(
    g: &Graph<'_>,
    facts: &GraphFacts,
    sp: &partition::Split,
    pname: &dyn Fn(Prov) -> Provider,
) -> (Vec<Partition>, Vec<Boundary>) {
    let mut part_of = vec![usize::MAX; g.nodes.len()];
    for (pi, (_, nodes)) in sp.partitions.iter().enumerate() {
        for &v in nodes {
            part_of[v] = pi;
        }
    }
    let mut produced_in: FastMap<&str, usize> = FastMap::default();
    produced_in.reserve(g.producer.len());
    for (v, node) in g.nodes.iter().enumerate() {
        for o in node.output.iter().filter(|o| !o.is_empty()) {
            produced_in.insert(o.as_str(), part_of[v]);
        }
    }
    let graph_outputs: FastSet<&str> = g.proto.output.iter().map(|o| o.name.as_str()).collect();
    let mut parts = Vec::with_capacity(sp.partitions.len());
    let mut boundaries = Vec::new();
    let mut seen_boundary: FastSet<(&str, Provider)> = FastSet::default();
    // Tensors some other partition reads: they are outputs of their producer's partition.
    let mut crossing: FastSet<&str> = FastSet::default();
    for (pi, (prov, nodes)) in sp.partitions.iter().enumerate() {
        let prov = pname(*prov);
        let mut inputs: Vec<String> = Vec::new();
        let mut in_seen: FastSet<&str> = FastSet::default();
        for &v in nodes {
            for r in partition::reads(g, v) {
                let producer = produced_in.get(r).copied();
                // Initializers (weights no node produces) are never a partition's input.
                let initializer = producer.is_none() && facts.get(r).is_some_and(|t| t.weights);
                if producer == Some(pi) || initializer {
                    continue;
                }
                if !in_seen.insert(r) {
                    continue;
                }
                inputs.push(r.to_string());
                crossing.insert(r);
                let Some(q) = producer else { continue };
                let from = sp.partitions.get(q).map_or(Provider::Cpu, |p| pname(p.0));
                if from.on_device() != prov.on_device() && seen_boundary.insert((r, prov)) {
                    boundaries.push(Boundary {
                        tensor: r.to_string(),
                        from: from.name().into(),
                        to: prov.name().into(),
                        bytes: facts.get(r).and_then(|t| t.bytes()),
                    });
                }
            }
        }
        parts.push(Partition {
            id: pi,
            provider: prov,
            nodes: nodes.iter().map(|&v| g.names[v].clone()).collect(),
            inputs,
            outputs: Vec::new(),
            node_ids: nodes.clone(),
        });
    }
    for part in &mut parts {
        for &v in &part.node_ids {
            for o in g.nodes[v].output.iter().filter(|o| !o.is_empty()) {
                if crossing.contains(o.as_str()) || graph_outputs.contains(o.as_str()) {
                    part.outputs.push(o.clone());
                }
            }
        }
    }
    (parts, boundaries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attr, model, tensor_i64, GraphBuilder, D};
    use crate::onnx::proto::ModelProto;
    use crate::onnx::ElemType::{Float32, Int64};
    use prost::Message;

    fn load(m: &ModelProto) -> Model {
        Model::from_bytes("hostile.onnx", m.encode_to_vec().into()).expect("loads")
    }

    fn run(m: &ModelProto) -> Capability {
        let model = load(m);
        let c = analyse(&model, &Options::default()).expect("analysis never errors on a model");
        let placed: usize = c.partitions.iter().map(|p| p.nodes.len()).sum();
        assert_eq!(
            placed,
            c.nodes.len(),
            "every node is in exactly one partition"
        );
        c
    }

    #[test]
    fn hostile_graphs_do_not_panic() {
        // A cycle, a dangling input, a duplicate output name, an empty op type.
        let mut g = GraphBuilder::new("hostile");
        g.input(
            "x",
            Float32,
            &[D::Fixed(i64::MAX), D::Fixed(-5), D::Unknown],
        )
        .output("b", Float32, None)
        .output("b", Float32, None);
        g.node("Add", &["x", "b"], &["a"]);
        g.node("Relu", &["a"], &["b"]);
        g.node("Mul", &["nowhere", "a"], &["b"]);
        g.node("", &[], &[]);
        g.node("Reshape", &["x", "x"], &["r"]);
        let c = run(&model(g.build(), &[("", 17)]));
        assert_eq!(c.nodes.len(), 5);

        // Huge and negative attribute values in shape rules.
        let mut g = GraphBuilder::new("huge");
        g.input(
            "x",
            Float32,
            &[D::Fixed(i64::MAX), D::Fixed(3), D::Fixed(4), D::Fixed(4)],
        )
        .output("y", Float32, None)
        .init(tensor_i64("st", &[1], &[i64::MIN]))
        .init(tensor_i64("en", &[1], &[i64::MAX]))
        .init(tensor_i64("ax", &[1], &[0]))
        .init(tensor_i64("sp", &[1], &[i64::MIN]))
        .init(tensor_i64("pads", &[8], &[i64::MAX; 8]))
        .init(tensor_i64("shape", &[2], &[-1, i64::MAX]))
        .init(tensor_i64("lim", &[], &[i64::MAX]))
        .init(tensor_i64("lo", &[], &[i64::MIN]))
        .init(tensor_i64("one", &[], &[1]));
        g.node("Slice", &["x", "st", "en", "ax", "sp"], &["s"]);
        g.node("Pad", &["x", "pads"], &["p"]);
        g.node("Reshape", &["x", "shape"], &["r"]);
        g.node("Range", &["lo", "lim", "one"], &["rg"]);
        g.node("Conv", &["x", "x"], &["c"]).attribute.extend([
            attr::ints("pads", &[i64::MAX, i64::MAX, i64::MAX, i64::MAX]),
            attr::ints("strides", &[i64::MIN, 1]),
            attr::ints("dilations", &[i64::MAX, i64::MAX]),
            attr::ints("kernel_shape", &[i64::MAX, i64::MIN]),
        ]);
        g.node("DepthToSpace", &["x"], &["d"])
            .attribute
            .push(attr::int("blocksize", i64::MAX));
        g.node("Split", &["x"], &["s1", "s2", "s3"]);
        g.node("Concat", &["x", "x"], &["cc"])
            .attribute
            .push(attr::int("axis", 0));
        g.node("Size", &["x"], &["n"]);
        g.node("Div", &["lo", "one"], &["dv"]);
        g.node("Gather", &["x", "lo"], &["y"]);
        run(&model(g.build(), &[("", 18)]));
    }

    #[test]
    fn very_wide_nodes_stay_linear() {
        let mut g = GraphBuilder::new("wide");
        g.input("x", Float32, &[D::Fixed(1)])
            .output("y", Float32, None);
        let names: Vec<String> = (0..50_000).map(|i| format!("t{i}")).collect();
        for t in &names {
            g.node("Relu", &["x"], &[t.as_str()]);
        }
        let mut inputs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        inputs.extend(names.iter().map(|s| s.as_str()));
        g.node("Sum", &inputs, &["y"]);
        let c = run(&model(g.build(), &[("", 17)]));
        assert_eq!(c.partitions.len(), 1);
        assert_eq!(c.nodes.len(), 50_001);
    }

    #[test]
    fn many_control_flow_nodes_stay_linear() {
        let mut g = GraphBuilder::new("many_ifs");
        g.input("x", Float32, &[D::Fixed(4)])
            .input("c", crate::onnx::ElemType::Bool, &[])
            .output("o9999", Float32, None);
        let mut prev = "x".to_string();
        for i in 0..10_000 {
            let branch = |name: &str, op: &str| {
                let mut b = GraphBuilder::new(name);
                b.output(&format!("{name}_out"), Float32, Some(&[D::Fixed(4)]));
                b.node(op, &[&prev], &[&format!("{name}_out")]);
                b.build()
            };
            let out = format!("o{i}");
            g.node("If", &["c"], &[&out]).attribute.extend([
                attr::graph("then_branch", branch(&format!("t{i}"), "Relu")),
                attr::graph("else_branch", branch(&format!("e{i}"), "Sigmoid")),
            ]);
            prev = out;
        }
        let c = run(&model(g.build(), &[("", 17)]));
        assert_eq!(c.partitions.len(), 1, "every If is taken: one subgraph");
        assert_eq!(c.partitions[0].provider, Provider::TensorRt);
    }

    /// What skl2onnx and onnxmltools write for a classifier with string labels: the labels
    /// (a string tensor) copied by Identity nodes, the probabilities through ZipMap. Neither
    /// TensorRT nor CUDA has string tensors: the Identity stays on the CPU, with both
    /// providers' reasons; the float Identity is free to go to TensorRT.
    #[test]
    fn string_tensors_stay_off_tensorrt_and_cuda() {
        use crate::onnx::ElemType::String;
        let mut g = GraphBuilder::new("skl2onnx");
        g.input("input", Float32, &["N".into(), D::Fixed(4)])
            .output("label", String, None)
            .output("probabilities", Float32, None);
        let t = g.node(
            "TreeEnsembleClassifier",
            &["input"],
            &["label_tensor", "probability_tensor"],
        );
        t.domain = "ai.onnx.ml".into();
        t.attribute.extend([
            attr::strings("classlabels_strings", &["cat", "dog"]),
            attr::ints("nodes_nodeids", &[0]),
        ]);
        g.node("Identity", &["label_tensor"], &["label"]);
        g.node("Identity", &["probability_tensor"], &["probabilities"]);
        let c = run(&model(g.build(), &[("", 15), ("ai.onnx.ml", 1)]));
        let label = &c.nodes[1];
        assert_eq!(label.provider, Provider::Cpu, "{label:?}");
        let why = label.reasons.join("\n");
        assert!(why.contains("TensorRT has no string tensors"), "{why}");
        assert!(why.contains("CUDA provider has no string kernels"), "{why}");
        assert_eq!(c.nodes[2].provider, Provider::TensorRt, "{:?}", c.nodes[2]);
        // The CUDA-only list: the float copy goes to CUDA, the string copy still does not.
        let o = Options {
            providers: vec![Provider::Cuda],
            ..Options::default()
        };
        let mut g = GraphBuilder::new("labels");
        g.input("x", String, &["N".into()])
            .input("f", Float32, &["N".into()])
            .output("y", String, None)
            .output("z", Float32, None);
        g.node("Identity", &["x"], &["y"]);
        g.node("Identity", &["f"], &["z"]);
        g.node("Cast", &["f"], &["s"])
            .attribute
            .push(attr::int("to", String.code().into()));
        let c = analyse(&load(&model(g.build(), &[("", 15)])), &o).unwrap();
        let placed: Vec<&str> = c.nodes.iter().map(|n| n.provider.name()).collect();
        assert_eq!(placed, ["cpu", "cuda", "cpu"], "{:?}", c.nodes);
    }

    #[test]
    fn deeply_nested_bodies_are_bounded() {
        let mut inner = GraphBuilder::new("leaf");
        inner.output("o", Float32, Some(&[D::Fixed(1)]));
        inner.node("Identity", &["x"], &["o"]);
        let leaf = inner.build();
        let mut body = leaf.clone();
        for i in 0..20 {
            let mut g = GraphBuilder::new(&format!("lvl{i}"));
            g.output("o", Float32, Some(&[D::Fixed(1)]));
            g.node("If", &["c"], &["o"]).attribute.extend([
                attr::graph("then_branch", body),
                attr::graph("else_branch", leaf.clone()),
            ]);
            body = g.build();
        }
        let mut top = GraphBuilder::new("top");
        top.input("x", Float32, &[D::Fixed(1)])
            .input("c", crate::onnx::ElemType::Bool, &[])
            .output("o", Float32, None);
        top.graph.node.extend(body.node);
        let c = run(&model(top.build(), &[("", 17)]));
        assert_ne!(c.nodes[0].provider, Provider::TensorRt);
        assert!(c.nodes[0]
            .reasons
            .iter()
            .any(|r| r.contains("nested deeper")));
    }

    #[test]
    fn options_are_validated() {
        assert!(Provider::parse("gpu").is_err());
        let o = Options {
            providers: vec![Provider::Cuda, Provider::Cuda],
            ..Options::default()
        };
        assert!(o.provider_list().is_err());
        let o = Options {
            providers: vec![Provider::Cuda],
            ..Options::default()
        };
        assert_eq!(o.provider_list().unwrap(), [Provider::Cuda, Provider::Cpu]);
        let mut g = GraphBuilder::new("t");
        g.input("x", Int64, &[D::Fixed(2)]).output("y", Int64, None);
        g.node("Relu", &["x"], &["y"]);
        let model = load(&model(g.build(), &[("", 17)]));
        let bad = Options {
            trt_version: "1.0".into(),
            ..Options::default()
        };
        assert!(analyse(&model, &bad).is_err());
    }
}
