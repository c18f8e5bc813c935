//! Assigning nodes to providers and cutting the graph into partitions, as ONNX Runtime does:
//! each node goes to the first provider in the list that claims it; TensorRT's nodes are
//! grouped into maximal subgraphs that never create a cycle when contracted.
//!
//! Enters: the top-level [`Graph`], each node's static claim per provider (from
//! [`super::restrict`] and the CUDA table). Leaves: [`Split`] — provider per node, TensorRT
//! group per node, and the ordered partitions with their node ids.
//!
//! Grouping is linear: walking nodes in topological order, a TensorRT node's level is the
//! largest number of "TensorRT → other provider → TensorRT" transitions on any path reaching
//! it. Nodes of equal level form one subgraph. A path that leaves a subgraph through another
//! provider always arrives at a higher level, so contracting every level stays acyclic, and
//! since any path with k such transitions needs k+1 subgraphs, no acyclic grouping has fewer
//! subgraphs: every merge that keeps the graph acyclic is already made. Subgraphs smaller
//! than the minimum size drop to the next provider and the levels are recomputed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::facts::FastMap as HashMap;

use crate::onnx::graph::Graph;

/// Index of a provider in the provider list.
pub type Prov = usize;

/// What node `id` reads (explicit inputs, then captures of its bodies), without duplicates:
/// [`Graph::node_reads`] without its per-node scan of every body.
pub fn reads<'a>(g: &Graph<'a>, id: usize) -> Vec<&'a str> {
    let Some(n) = g.nodes.get(id) else {
        return Vec::new();
    };
    if crate::onnx::attr::has_body(n) {
        return g.node_reads(id);
    }
    let mut out: Vec<&'a str> = Vec::with_capacity(n.input.len());
    if n.input.len() > 16 {
        // Concat/Sum with thousands of inputs: no quadratic duplicate check.
        let mut seen = super::facts::FastSet::default();
        out.extend(
            n.input
                .iter()
                .map(|i| i.as_str())
                .filter(|i| !i.is_empty() && seen.insert(*i)),
        );
        return out;
    }
    for i in &n.input {
        if !i.is_empty() && !out.contains(&i.as_str()) {
            out.push(i.as_str());
        }
    }
    out
}

/// The bodies (If branches, Loop/Scan bodies) of node `id`, found by binary search: the
/// graph view lists bodies in node order, so this stays logarithmic on graphs with thousands
/// of control-flow nodes.
pub fn bodies_of<'g, 'a>(g: &'g Graph<'a>, id: usize) -> &'g [crate::onnx::graph::Body<'a>] {
    let lo = g.bodies.partition_point(|b| b.node < id);
    let hi = g.bodies.partition_point(|b| b.node <= id);
    g.bodies.get(lo..hi).unwrap_or(&[])
}

/// Predecessor node ids of every node (producers of what it reads, captures included).
pub fn preds(g: &Graph<'_>) -> Vec<Vec<usize>> {
    (0..g.nodes.len())
        .map(|id| {
            let mut p: Vec<usize> = reads(g, id)
                .iter()
                .filter_map(|r| g.producer.get(r).map(|o| o.node))
                .filter(|&p| p != id)
                .collect();
            p.sort_unstable();
            p.dedup();
            p
        })
        .collect()
}

/// A topological order from predecessor lists: file order when it already is one, else
/// Kahn's algorithm preferring lower indices. Nodes on a cycle (an invalid graph) are
/// appended in file order and the flag is set.
pub fn order_from_preds(preds: &[Vec<usize>]) -> (Vec<usize>, bool) {
    let n = preds.len();
    if preds
        .iter()
        .enumerate()
        .all(|(i, p)| p.iter().all(|&q| q < i))
    {
        return ((0..n).collect(), false);
    }
    let mut indeg = vec![0usize; n];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, p) in preds.iter().enumerate() {
        for &q in p {
            if q < n {
                indeg[i] += 1;
                succ[q].push(i);
            }
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| indeg[i] == 0).map(Reverse).collect();
    let mut out = Vec::with_capacity(n);
    let mut done = vec![false; n];
    while let Some(Reverse(i)) = ready.pop() {
        out.push(i);
        done[i] = true;
        for &s in &succ[i] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(Reverse(s));
            }
        }
    }
    let cyclic = out.len() < n;
    out.extend((0..n).filter(|&i| !done[i]));
    (out, cyclic)
}

/// Topological order of a graph's nodes (see [`order_from_preds`]).
pub fn topo_order(g: &Graph<'_>) -> (Vec<usize>, bool) {
    order_from_preds(&preds(g))
}

/// Result of the assignment.
#[derive(Debug, Default)]
pub struct Split {
    /// Provider index per node.
    pub provider: Vec<Prov>,
    /// Extra reasons per node from partitioning (subgraph too small).
    pub reasons: Vec<Vec<String>>,
    /// Ordered partitions: provider and node ids in topological order.
    pub partitions: Vec<(Prov, Vec<usize>)>,
}

/// Inputs to [`split`].
pub struct SplitInput<'a> {
    pub preds: &'a [Vec<usize>],
    pub order: &'a [usize],
    /// For each node, the providers (indices, in priority order) that claim it statically.
    pub claims: &'a [Vec<Prov>],
    /// Index of TensorRT in the provider list, if listed.
    pub trt: Option<Prov>,
    pub min_subgraph_size: usize,
    /// Bound on drop-and-regroup rounds (hostile graphs).
    pub max_iterations: usize,
}

fn levels(input: &SplitInput<'_>, provider: &[Prov]) -> Vec<Option<u32>> {
    let n = provider.len();
    let is_trt = |v: usize| Some(provider[v]) == input.trt;
    let mut lv: Vec<Option<u32>> = vec![None; n];
    for &v in input.order {
        let trt = is_trt(v);
        let mut m: Option<u32> = None;
        for &p in &input.preds[v] {
            let c = match lv.get(p).copied().flatten() {
                Some(l) if trt && !is_trt(p) => Some(l.saturating_add(1)),
                other => other,
            };
            m = m.max(c);
        }
        lv[v] = if trt { Some(m.unwrap_or(0)) } else { m };
    }
    lv
}

/// Assigns providers and forms partitions.
pub fn split(input: &SplitInput<'_>) -> Split {
    let n = input.claims.len();
    let mut reasons: Vec<Vec<String>> = vec![Vec::new(); n];
    // Position in the claim list each node currently uses.
    let mut pick: Vec<usize> = vec![0; n];
    let provider_of = |pick: &[usize], v: usize| input.claims[v].get(pick[v]).copied().unwrap_or(0);
    let mut provider: Vec<Prov> = (0..n).map(|v| provider_of(&pick, v)).collect();
    let mut group: Vec<Option<u32>> = Vec::new();
    for _ in 0..input.max_iterations.max(1) {
        let lv = levels(input, &provider);
        let mut sizes: HashMap<u32, usize> = HashMap::default();
        for v in 0..n {
            if Some(provider[v]) == input.trt {
                if let Some(l) = lv[v] {
                    *sizes.entry(l).or_default() += 1;
                }
            }
        }
        let mut dropped = false;
        for v in 0..n {
            if Some(provider[v]) != input.trt {
                continue;
            }
            let size = lv[v].and_then(|l| sizes.get(&l)).copied().unwrap_or(0);
            if size < input.min_subgraph_size {
                pick[v] += 1;
                provider[v] = provider_of(&pick, v);
                reasons[v].push(format!(
                    "its TensorRT subgraph has {size} node(s), fewer than --min-subgraph-size {}",
                    input.min_subgraph_size
                ));
                dropped = true;
            }
        }
        group = lv;
        if !dropped {
            break;
        }
    }
    let partitions = order_partitions(input, &provider, &group);
    Split {
        provider,
        reasons,
        partitions,
    }
}

/// Contracts every TensorRT level into one unit, orders units topologically (staying with
/// the current provider when possible) and merges consecutive non-TensorRT units of the same
/// provider. Merging an interval of a topological order never creates a cycle.
fn order_partitions(
    input: &SplitInput<'_>,
    provider: &[Prov],
    lv: &[Option<u32>],
) -> Vec<(Prov, Vec<usize>)> {
    let n = provider.len();
    let is_trt = |v: usize| Some(provider[v]) == input.trt;
    let mut pos = vec![usize::MAX; n];
    for (i, &v) in input.order.iter().enumerate() {
        if v < n {
            pos[v] = i;
        }
    }
    // Unit ids: TensorRT levels first (dense), then one per other node.
    let mut level_unit: HashMap<u32, usize> = HashMap::default();
    let mut unit = vec![0usize; n];
    for &v in input.order {
        if is_trt(v) {
            let l = lv[v].unwrap_or(0);
            let next = level_unit.len();
            unit[v] = *level_unit.entry(l).or_insert(next);
        }
    }
    let g = level_unit.len();
    for (v, u) in unit.iter_mut().enumerate() {
        if !is_trt(v) {
            *u = g + v;
        }
    }
    let units = g + n;
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); units];
    for &v in input.order {
        members[unit[v]].push(v);
    }
    let mut indeg = vec![0usize; units];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); units];
    for v in 0..n {
        for &p in &input.preds[v] {
            if p < n && unit[p] != unit[v] {
                succ[unit[p]].push(unit[v]);
                indeg[unit[v]] += 1;
            }
        }
    }
    let prov_of_unit = |u: usize| provider[members[u][0]];
    let nprov = provider.iter().copied().max().map_or(1, |m| m + 1);
    let mut ready: Vec<BinaryHeap<Reverse<(usize, usize)>>> = vec![BinaryHeap::new(); nprov];
    let key = |u: usize| members[u].first().map_or(usize::MAX, |&v| pos[v]);
    for u in 0..units {
        if !members[u].is_empty() && indeg[u] == 0 {
            ready[prov_of_unit(u)].push(Reverse((key(u), u)));
        }
    }
    let mut emitted: Vec<usize> = Vec::with_capacity(units);
    let mut done = vec![false; units];
    let mut last: Option<Prov> = None;
    loop {
        let from = match last.filter(|&p| !ready[p].is_empty()) {
            Some(p) => p,
            None => match (0..nprov)
                .filter(|&p| !ready[p].is_empty())
                .min_by_key(|&p| ready[p].peek().map(|r| r.0))
            {
                Some(p) => p,
                None => break,
            },
        };
        let Some(Reverse((_, u))) = ready[from].pop() else {
            break;
        };
        emitted.push(u);
        done[u] = true;
        last = Some(from);
        for &s in &succ[u] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready[prov_of_unit(s)].push(Reverse((key(s), s)));
            }
        }
    }
    // A cyclic (invalid) graph: whatever is left, in order.
    let mut rest: Vec<usize> = (0..units)
        .filter(|&u| !done[u] && !members[u].is_empty())
        .collect();
    rest.sort_by_key(|&u| key(u));
    emitted.extend(rest);
    let mut out: Vec<(Prov, Vec<usize>)> = Vec::new();
    let mut prev_trt = false;
    for u in emitted {
        let p = prov_of_unit(u);
        let trt = u < g;
        match out.last_mut() {
            Some((lp, nodes)) if !trt && !prev_trt && *lp == p => nodes.extend(&members[u]),
            _ => out.push((p, members[u].clone())),
        }
        prev_trt = trt;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(preds: Vec<Vec<usize>>, trt: &[bool], min: usize) -> Split {
        let (order, _) = order_from_preds(&preds);
        let claims: Vec<Vec<Prov>> = trt
            .iter()
            .map(|&t| if t { vec![0, 2] } else { vec![2] })
            .collect();
        split(&SplitInput {
            preds: &preds,
            order: &order,
            claims: &claims,
            trt: Some(0),
            min_subgraph_size: min,
            max_iterations: 100,
        })
    }

    #[test]
    fn chain_with_hole_makes_two_subgraphs() {
        // 0 -> 1 -> 2(cpu) -> 3 -> 4
        let s = run(
            vec![vec![], vec![0], vec![1], vec![2], vec![3]],
            &[true, true, false, true, true],
            1,
        );
        let parts: Vec<(usize, Vec<usize>)> = s.partitions;
        assert_eq!(parts, vec![(0, vec![0, 1]), (2, vec![2]), (0, vec![3, 4])]);
    }

    #[test]
    fn merge_that_would_cycle_is_refused_parallel_merge_is_made() {
        // 0 -> 1(cpu) -> 2, and 0 -> 2 directly: {0,2} together would be a cycle.
        let s = run(vec![vec![], vec![0], vec![0, 1]], &[true, false, true], 1);
        assert_eq!(s.partitions.len(), 3);
        // 0 and 1(cpu) -> 2 in parallel branches: 0 and 2 merge.
        let s = run(vec![vec![], vec![], vec![1]], &[true, false, true], 1);
        assert_eq!(s.partitions, vec![(2, vec![1]), (0, vec![0, 2])]);
    }

    #[test]
    fn small_subgraphs_drop_to_next_provider() {
        let s = run(
            vec![vec![], vec![0], vec![1], vec![2], vec![3]],
            &[true, false, true, true, true],
            2,
        );
        assert_eq!(s.provider, vec![2, 2, 0, 0, 0]);
        assert!(s.reasons[0][0].contains("fewer than"));
    }

    #[test]
    fn reads_match_the_graph_view() {
        for m in [
            crate::fixtures::models::if_loop(),
            crate::fixtures::capability::control_flow_unsupported(),
            crate::fixtures::capability::varied(30, 2),
        ] {
            let g = Graph::new(m.graph.as_ref().unwrap());
            for id in 0..g.nodes.len() {
                assert_eq!(reads(&g, id), g.node_reads(id), "node {id}");
                assert_eq!(
                    bodies_of(&g, id).len(),
                    g.bodies.iter().filter(|b| b.node == id).count()
                );
            }
        }
    }

    #[test]
    fn cycles_do_not_panic() {
        let (order, cyclic) = order_from_preds(&[vec![1], vec![0], vec![]]);
        assert!(cyclic);
        assert_eq!(order.len(), 3);
        let s = run(vec![vec![1], vec![0], vec![0]], &[true, false, true], 1);
        assert_eq!(s.provider.len(), 3);
    }
}
