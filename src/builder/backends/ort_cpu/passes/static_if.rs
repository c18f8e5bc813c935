//! **`static-if`**: an `If` whose condition the model's own shapes decide becomes the branch
//! it takes.
//!
//! TorchScript exports write Python's shape checks as `If`s: `x.squeeze(1)` becomes
//! `If(Shape(x)[1] == 1, Squeeze, Identity)`, `if state.shape[0]:` becomes
//! `If(bool(Shape(state)[0]), …)`, and the RNN modules check their input's rank the same way.
//! Where the dimension a condition reads is fixed (a declared input dimension, a Conv's output
//! channels) the condition is the same for every input ONNX Runtime accepts, but ONNX
//! Runtime folds an `If` only when its condition is a constant tensor, and computes
//! `Shape` only when every dimension is fixed. So each of these keeps both branches, and a
//! session creates kernels and a session state for every body, nested ones included: silero
//! VAD's 50 bodies (its LSTM twice over in the branch a 2-layer state never takes) are most
//! of its artifact's session.
//!
//! The condition is read from [`shapes::propagate`]'s tracked values (shape arithmetic,
//! comparisons, `Not`, casts to bool), which never guess: a dimension that is a name or
//! unknown leaves the `If` alone, and two inputs sharing a dimension name are not assumed
//! equal (ONNX Runtime does not check that they are). The taken branch's nodes and
//! initializers move into the enclosing graph in the `If`'s place, an `Identity` per output
//! naming its result as the `If`'s; nodes left with no reader (the condition's `Shape`,
//! `Gather`, `Equal`) are dropped. An `If` inside a kept branch is decided with that
//! branch's facts; one inside a `Loop` or `Scan` body is left alone (a body's declared
//! shapes hold per iteration only as far as the exporter got them right). A branch whose
//! names clash with names of the enclosing graph is left in place.
//!
//! Enters: a decoded [`ModelProto`]. Leaves: the model with every decided `If` inlined and
//! one line per `If` in `applied`; `None` when no condition is fixed.

use std::collections::HashSet;

use crate::analysis::facts::{GraphFacts, SymDim, ValueClass};
use crate::analysis::{partition, shapes};
use crate::onnx::graph::Graph;
use crate::onnx::proto::{GraphProto, ModelProto, NodeProto};

/// Rounds of deciding and inlining: each inlines every `If` decided at the outermost level
/// where one is found, and the next sees the `If`s the inlined branches brought up.
const MAX_ROUNDS: usize = 16;

/// One decided `If`: the graph holding it (the (node index, attribute) steps from the
/// top-level graph), its index there, and the branch its condition takes.
struct Decided {
    path: Vec<(usize, String)>,
    node: usize,
    then: bool,
}

/// `proto` with every `If` whose condition the shapes fix replaced by its taken branch (one
/// line each in `applied`); `None` when there is none.
pub(super) fn static_if(proto: &ModelProto, applied: &mut Vec<String>) -> Option<ModelProto> {
    if !has_if(proto.graph.as_ref()?) {
        return None;
    }
    let opset = super::graph::std_opset(proto);
    let mut model: Option<ModelProto> = None;
    for _ in 0..MAX_ROUNDS {
        let current = model.as_ref().unwrap_or(proto);
        let view = Graph::new(current.graph.as_ref()?);
        let mut found = Vec::new();
        decide(&view, None, opset, &mut Vec::new(), &mut found);
        if found.is_empty() {
            break;
        }
        // Deeper graphs first, then later nodes first: every step of a path still to take
        // (and every index in one graph) is unchanged by the inlining done before it.
        found.sort_by(|a, b| (&b.path, b.node).cmp(&(&a.path, a.node)));
        let mut next = current.clone();
        let mut changed = false;
        for (k, d) in found.iter().enumerate() {
            let outer = next
                .graph
                .as_ref()
                .map(|g| outer_names(g, &d.path))
                .unwrap_or_default();
            let Some(g) = next.graph.as_mut().and_then(|g| graph_at(g, &d.path)) else {
                continue;
            };
            if let Some(line) = inline(g, d.node, d.then, &outer) {
                applied.push(line);
                changed = true;
            }
            // The last of this graph's: drop what only the conditions read, while the path
            // is still valid (the enclosing graphs' inlining comes later).
            if found.get(k + 1).is_none_or(|e| e.path != d.path) {
                drop_unread(g);
            }
        }
        if !changed {
            break;
        }
        model = Some(next);
    }
    model
}

/// Whether `g` or any body in it has an `If`.
fn has_if(g: &GraphProto) -> bool {
    g.node.iter().any(|n| {
        (n.op_type == "If" && matches!(n.domain.as_str(), "" | "ai.onnx"))
            || n.attribute
                .iter()
                .any(|a| a.g.as_deref().is_some_and(has_if) || a.graphs.iter().any(has_if))
    })
}

/// Records every `If` of `g` whose condition is fixed, and walks into the branches of the
/// others with `g`'s facts as their outer scope.
fn decide(
    g: &Graph<'_>,
    outer: Option<&GraphFacts<'_>>,
    opset: i64,
    path: &mut Vec<(usize, String)>,
    out: &mut Vec<Decided>,
) {
    let (order, cyclic) = partition::topo_order(g);
    if cyclic {
        return;
    }
    let f = shapes::propagate(g, &order, outer, opset);
    for (id, n) in g.nodes.iter().enumerate() {
        if n.op_type != "If" || !matches!(n.domain.as_str(), "" | "ai.onnx") {
            continue;
        }
        if let Some(then) = n.input.first().and_then(|c| condition(&f, c)) {
            out.push(Decided {
                path: path.clone(),
                node: id,
                then,
            });
            continue;
        }
        for b in partition::bodies_of(g, id) {
            path.push((id, b.attr.to_string()));
            decide(&b.graph, Some(&f), opset, path, out);
            path.pop();
        }
    }
}

/// The value of a condition when the facts fix it: one known element, not read from data.
fn condition(f: &GraphFacts<'_>, name: &str) -> Option<bool> {
    let t = f.get(name)?;
    if t.class == ValueClass::DataDerived {
        return None;
    }
    match t.value.as_deref()? {
        [SymDim::Known(v)] => Some(*v != 0),
        _ => None,
    }
}

/// The graph a path leads to.
fn graph_at<'g>(g: &'g mut GraphProto, path: &[(usize, String)]) -> Option<&'g mut GraphProto> {
    let mut g = g;
    for (id, attr) in path {
        g = g
            .node
            .get_mut(*id)?
            .attribute
            .iter_mut()
            .find(|a| &a.name == attr)?
            .g
            .as_deref_mut()?;
    }
    Some(g)
}

/// Every name the graphs enclosing the one at `path` define (inputs, initializers, node
/// outputs): what a body there may read besides its own graph's names.
fn outer_names(g: &GraphProto, path: &[(usize, String)]) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut g = g;
    for (id, attr) in path {
        out.extend(g.input.iter().map(|i| i.name.clone()));
        out.extend(g.initializer.iter().map(|t| t.name.clone()));
        out.extend(g.node.iter().flat_map(|n| n.output.iter().cloned()));
        let Some(b) = g
            .node
            .get(*id)
            .and_then(|n| n.attribute.iter().find(|a| &a.name == attr))
            .and_then(|a| a.g.as_deref())
        else {
            break;
        };
        g = b;
    }
    out
}

/// Replaces `g.node[id]` (an `If`) by its `then` or `else` branch; the line for `applied`,
/// or `None` (nothing changed) when the branch has inputs, a different number of outputs,
/// sparse initializers, a name `g` already has, or reads or returns a name defined nowhere
/// it can see (`outer`: the enclosing graphs' names): inlined, an invalid body would make
/// the enclosing graph invalid too.
fn inline(g: &mut GraphProto, id: usize, then: bool, outer: &HashSet<String>) -> Option<String> {
    let attr = if then { "then_branch" } else { "else_branch" };
    let n = g.node.get(id)?;
    let branch = n.attribute.iter().find(|a| a.name == attr)?.g.as_deref()?;
    if !branch.input.is_empty()
        || branch.output.len() != n.output.len()
        || !branch.sparse_initializer.is_empty()
    {
        return None;
    }
    // What the branch's nodes may read, in order: the enclosing graphs' names, `g`'s names
    // defined before the If, the branch's initializers and earlier outputs.
    let mut visible: HashSet<&str> = outer.iter().map(String::as_str).collect();
    visible.extend(g.input.iter().map(|i| i.name.as_str()));
    visible.extend(g.initializer.iter().map(|t| t.name.as_str()));
    visible.extend(
        g.node[..id]
            .iter()
            .flat_map(|m| m.output.iter().map(String::as_str)),
    );
    visible.extend(branch.initializer.iter().map(|t| t.name.as_str()));
    for m in &branch.node {
        if m.input
            .iter()
            .any(|i| !i.is_empty() && !visible.contains(i.as_str()))
        {
            return None;
        }
        visible.extend(m.output.iter().map(String::as_str));
    }
    if branch
        .output
        .iter()
        .any(|o| !visible.contains(o.name.as_str()))
    {
        return None;
    }
    // Names `g` defines anywhere, this If's own bodies aside: the branch's must be new.
    let mut taken: HashSet<&str> = HashSet::new();
    taken.extend(g.input.iter().map(|i| i.name.as_str()));
    taken.extend(g.initializer.iter().map(|t| t.name.as_str()));
    for (i, other) in g.node.iter().enumerate() {
        taken.extend(other.output.iter().map(String::as_str));
        if i != id {
            for a in &other.attribute {
                a.g.as_deref()
                    .into_iter()
                    .for_each(|b| defined(b, &mut taken));
                a.graphs.iter().for_each(|b| defined(b, &mut taken));
            }
        }
    }
    let clash = branch
        .node
        .iter()
        .flat_map(|m| m.output.iter())
        .chain(branch.initializer.iter().map(|t| &t.name))
        .any(|name| !name.is_empty() && taken.contains(name.as_str()));
    if clash {
        return None;
    }
    let node_names: HashSet<String> = g.node.iter().map(|m| m.name.clone()).collect();
    let mut n = g.node.get(id)?.clone();
    let branch = *n.attribute.iter_mut().find(|a| a.name == attr)?.g.take()?;
    let mut nodes = branch.node;
    for m in nodes.iter_mut() {
        if !m.name.is_empty() && node_names.contains(&m.name) {
            m.name = format!("{}__{}", m.name, n.name);
        }
    }
    for (o, out) in branch.output.iter().zip(&n.output) {
        if out.is_empty() {
            continue;
        }
        nodes.push(NodeProto {
            input: vec![o.name.clone()],
            output: vec![out.clone()],
            name: format!("{out}__static_if"),
            op_type: "Identity".into(),
            ..Default::default()
        });
    }
    g.initializer.extend(branch.initializer);
    g.value_info.extend(branch.value_info);
    g.node.splice(id..=id, nodes);
    let name = if n.name.is_empty() {
        n.output.first().cloned().unwrap_or_default()
    } else {
        std::mem::take(&mut n.name)
    };
    Some(format!(
        "static-if: `If` `{name}` always takes its {} branch (its condition is fixed by the model's shapes)",
        if then { "then" } else { "else" }
    ))
}

/// Adds the names `g` and its bodies define.
fn defined<'a>(g: &'a GraphProto, out: &mut HashSet<&'a str>) {
    out.extend(g.input.iter().map(|i| i.name.as_str()));
    out.extend(g.initializer.iter().map(|t| t.name.as_str()));
    for n in &g.node {
        out.extend(n.output.iter().map(String::as_str));
        for a in &n.attribute {
            a.g.as_deref().into_iter().for_each(|b| defined(b, out));
            a.graphs.iter().for_each(|b| defined(b, out));
        }
    }
}

/// Drops the nodes of `g` none of whose outputs is read (by a node, a body's capture or
/// `g`'s outputs), until none is left; ONNX operators have no side effects.
fn drop_unread(g: &mut GraphProto) {
    loop {
        let keep: Vec<bool> = {
            let reads = super::graph::read_counts(g);
            g.node
                .iter()
                .map(|n| {
                    n.output
                        .iter()
                        .any(|o| !o.is_empty() && reads.contains_key(o.as_str()))
                })
                .collect()
        };
        if keep.iter().all(|&k| k) {
            return;
        }
        let mut k = keep.into_iter();
        g.node.retain(|_| k.next().unwrap_or(true));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::models;

    /// Op types of `g` and of every body in it.
    fn all_ops(g: &GraphProto, out: &mut Vec<String>) {
        for n in &g.node {
            out.push(n.op_type.clone());
            for a in &n.attribute {
                if let Some(b) = a.g.as_deref() {
                    all_ops(b, out);
                }
            }
        }
    }

    #[test]
    fn fixed_shape_checks_become_the_branch_they_take() {
        let m = models::static_if(false);
        let mut applied = Vec::new();
        let out = static_if(&m, &mut applied).expect("two conditions are fixed");
        assert_eq!(applied.len(), 2, "{applied:?}");
        assert!(applied[0].contains("`first_if` always takes its then branch"));
        assert!(applied[1].contains("`t2_if` always takes its then branch"));
        let g = out.graph.as_ref().unwrap();
        let top: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
        // The conditions' Shape → Gather → Squeeze → Cast are gone; the batch check stays.
        assert_eq!(
            top,
            ["Relu", "Neg", "Identity", "Identity", "Shape", "Gather", "Equal", "If"],
            "{top:?}"
        );
        let mut ops = Vec::new();
        all_ops(g, &mut ops);
        assert!(!ops.contains(&"Sigmoid".to_string()), "{ops:?}");
        assert_eq!(ops.iter().filter(|o| *o == "If").count(), 1, "{ops:?}");
        // The Identity names the branch's result as the If's output.
        let ident = g.node.iter().find(|n| n.output == ["first"]).unwrap();
        assert_eq!(ident.op_type, "Identity");
        assert_eq!(ident.input, ["t2"]);
    }

    #[test]
    fn a_branch_whose_names_clash_and_a_named_dimension_are_left_alone() {
        let mut applied = Vec::new();
        assert!(static_if(&models::static_if(true), &mut applied).is_none());
        assert!(applied.is_empty(), "{applied:?}");
    }
}
