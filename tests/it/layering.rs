//! The layering rule of docs/architecture.md, checked on the source: no import cycle between
//! the top-level modules of `src/`, none among `src/analysis/`'s files, and backend names
//! spelled as strings only in `src/spec.rs`, which parses and prints them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, with its code only: the unit-test module at the bottom and
/// `//` comments are dropped (a doc example or a test may name anything).
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
                let code: String = code
                    .lines()
                    .map(|l| l.split("//").next().unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join("\n");
                out.push((p, code));
            }
        }
    }
    out.sort();
    out
}

/// `name` in `crate::name…` / `super::name…` occurrences.
fn uses<'a>(code: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    code.match_indices(prefix).filter_map(move |(i, _)| {
        let rest = &code[i + prefix.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        (end > 0).then(|| &rest[..end])
    })
}

/// A cycle in `graph`, if any (as the list of nodes on it).
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let at = path.iter().position(|p| p == n).unwrap_or(0);
                let mut c = path[at..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

/// The module a file under `root` belongs to: its first path component, without `.rs`.
fn module_of(root: &Path, p: &Path) -> String {
    let rel = p.strip_prefix(root).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let root = src();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (p, code) in sources(&root) {
        let module = module_of(&root, &p);
        for u in uses(&code, "crate::") {
            if u != module {
                g.entry(module.clone()).or_default().insert(u.to_string());
            }
        }
    }
    assert!(g.contains_key("daemon"), "the scan found no imports: {g:?}");
    assert_eq!(cycle(&g), None, "import graph: {g:#?}");
    // The leaves import nothing of the crate but what the rule allows.
    for (leaf, allowed) in [("spec", &[][..]), ("libs", &["config"][..])] {
        let got: Vec<_> = g.get(leaf).into_iter().flatten().collect();
        assert!(
            got.iter().all(|m| allowed.contains(&m.as_str())),
            "{leaf} imports {got:?}"
        );
    }
}

#[test]
fn analysis_files_import_each_other_without_cycles() {
    let dir = src().join("analysis");
    let files: BTreeSet<String> = sources(&dir)
        .iter()
        .map(|(p, _)| module_of(&dir, p))
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (p, code) in sources(&dir) {
        let rel = p.strip_prefix(&dir).unwrap();
        let me = module_of(&dir, &p);
        if me == "mod" {
            continue;
        }
        // Files inside a folder module (`infer/…`) reach their siblings with `super::`.
        let nested = rel.components().count() > 1;
        for prefix in ["crate::analysis::", "super::"] {
            if nested && prefix == "super::" {
                continue;
            }
            for u in uses(&code, prefix) {
                if u != me && files.contains(u) && u != "mod" {
                    g.entry(me.clone()).or_default().insert(u.to_string());
                }
            }
        }
    }
    assert!(g.contains_key("shapes"), "the scan found no imports: {g:?}");
    assert_eq!(cycle(&g), None, "analysis import graph: {g:#?}");
    assert!(
        !g.contains_key("facts"),
        "facts is the analysis leaf: {:?}",
        g.get("facts")
    );
}

#[test]
fn backend_names_are_spelled_only_in_spec() {
    let root = src();
    let mut found = Vec::new();
    for (p, code) in sources(&root) {
        if p.ends_with("spec.rs") {
            continue;
        }
        for name in ["\"ort-cpu\"", "\"ort-cuda\"", "\"ort-tensorrt\"", "\"trt\""] {
            if code.contains(name) {
                found.push(format!("{} {name}", p.display()));
            }
        }
    }
    assert!(found.is_empty(), "backend names outside spec.rs: {found:?}");
    let spec = std::fs::read_to_string(root.join("spec.rs")).unwrap();
    assert!(spec.contains("\"ort-cpu\""), "spec.rs lost the names");
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["c".to_string()].into()),
        ("c".to_string(), ["a".to_string()].into()),
    ]
    .into();
    assert_eq!(cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    let dag: BTreeMap<String, BTreeSet<String>> =
        [("a".to_string(), ["b".to_string()].into())].into();
    assert_eq!(cycle(&dag), None);
}
