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
        // Backend names, and ONNX Runtime's provider names (`Provider::ort_name`).
        for name in [
            "\"ort-cpu\"",
            "\"ort-cuda\"",
            "\"ort-tensorrt\"",
            "\"trt\"",
            "ExecutionProvider\"",
        ] {
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

/// What the structure rules measure, for the crate at `root`: cycles per folder, files over
/// 800 lines, functions over 150 lines without their reason.
/// Cycles (folder, the files on it), big files, long functions.
type Structure = (Vec<(String, Vec<String>)>, Vec<String>, Vec<String>);

fn structure(root: &Path) -> Structure {
    let g = crate::modgraph::Graph::of(root);
    let big = g
        .files
        .iter()
        .filter(|f| f.text.lines().count() > 800)
        .map(|f| format!("{} ({} lines)", f.path.display(), f.text.lines().count()))
        .collect();
    let long = crate::modgraph::long_functions(&g.files, 150)
        .into_iter()
        .filter(|(_, _, _, reason)| !reason)
        .map(|(p, name, n, _)| format!("{}::{name} ({n} lines)", p.display()))
        .collect();
    (g.folder_cycles(), big, long)
}

#[test]
fn no_folder_has_an_import_cycle() {
    let (cycles, _, _) = structure(&src());
    assert!(
        cycles.is_empty(),
        "import cycles (folder: files): {cycles:#?}"
    );
}

#[test]
fn no_file_over_800_lines_and_no_function_over_150_without_its_reason() {
    let (_, big, long) = structure(&src());
    assert!(big.is_empty(), "files over 800 lines: {big:#?}");
    assert!(
        long.is_empty(),
        "functions over 150 lines with no comment above saying why they are one piece: {long:#?}"
    );
}

/// `LAYERING_SRC=/path/to/src cargo test --test it layering::print_structure -- --ignored
/// --nocapture` prints the measures for any checkout (before/after counts).
#[test]
#[ignore]
fn print_structure() {
    let root = std::env::var_os("LAYERING_SRC").map_or_else(src, PathBuf::from);
    let (cycles, big, long) = structure(&root);
    println!("import cycles inside folders: {}", cycles.len());
    for (folder, c) in &cycles {
        println!("  {folder}: {}", c.join(" "));
    }
    println!("files over 800 lines: {}", big.len());
    for b in &big {
        println!("  {b}");
    }
    println!("functions over 150 lines without a reason: {}", long.len());
    for l in &long {
        println!("  {l}");
    }
}

#[test]
fn the_module_graph_sees_reexports_use_trees_and_inline_paths() {
    let dir = tempfile::tempdir().unwrap();
    let w = |p: &str, t: &str| {
        let p = dir.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, t).unwrap();
    };
    w("lib.rs", "mod a;\nmod b;\nmod c;\n");
    w("a/mod.rs", "mod x;\nmod y;\npub use x::X;\n");
    w("a/x.rs", "use super::y::{Y, other::Z};\npub struct X;\n");
    w("a/y.rs", "pub struct Y;\nfn f() { let _ = crate::a::X; }\n");
    w("b.rs", "use crate::a::X;\n");
    w("c.rs", "fn g() { crate::b::h(); }\n");
    let g = crate::modgraph::Graph::of(dir.path());
    let cycles = g.folder_cycles();
    // y names X, which a re-exports from x: x ⇄ y is a cycle inside a/.
    assert_eq!(
        cycles,
        vec![("a".to_string(), vec!["x".to_string(), "y".to_string()])]
    );
    w("a/y.rs", "pub struct Y;\n");
    w("b.rs", "use crate::a::X;\nfn h() { crate::c::g(); }\n");
    let cycles = crate::modgraph::Graph::of(dir.path()).folder_cycles();
    assert_eq!(
        cycles,
        vec![("src".to_string(), vec!["b".to_string(), "c".to_string()])]
    );
}

#[test]
fn one_module_file_convention_folder_mod_rs() {
    let mut both = Vec::new();
    let mut stack = vec![src()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.with_extension("rs").is_file() {
                    both.push(p.display().to_string());
                }
                stack.push(p);
            }
        }
    }
    assert!(
        both.is_empty(),
        "a folder module's file is FOLDER/mod.rs, not FOLDER.rs beside it: {both:?}"
    );
}

/// The stage order of docs/architecture.md (its `stages:` line): a top-level module imports
/// only the stages to its left and the leaves; the leaves import only the leaves the line
/// `leaves:` lets them.
#[test]
fn stages_import_only_earlier_stages_and_leaves() {
    let doc = std::fs::read_to_string(src().join("../docs/architecture.md")).unwrap();
    let line = |tag: &str| -> String {
        doc.lines()
            .find_map(|l| l.trim().strip_prefix(tag).map(str::to_string))
            .unwrap_or_else(|| panic!("docs/architecture.md has no `{tag}` line"))
    };
    let stages: Vec<String> = line("stages:")
        .split('→')
        .map(|s| s.trim().to_string())
        .collect();
    let leaves = line("leaves:");
    // `leaves:     spec (nothing)   config → spec   libs → config   rng (nothing)`
    let mut leaf_allows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let words: Vec<&str> = leaves.split_whitespace().collect();
    let mut i = 0;
    while i < words.len() {
        let name = words[i].to_string();
        let mut allowed = Vec::new();
        if words.get(i + 1) == Some(&"→") {
            allowed.push(words[i + 2].to_string());
            i += 3;
        } else {
            i += 2; // "(nothing)"
        }
        leaf_allows.insert(name, allowed);
    }
    let test_kit = ["fixtures", "fuzzing"];
    let root = src();
    let mut bad = Vec::new();
    for (p, code) in sources(&root) {
        let me = module_of(&root, &p);
        if me == "lib" || test_kit.contains(&me.as_str()) {
            continue;
        }
        for u in uses(&code, "crate::") {
            if u == me {
                continue;
            }
            let ok = if let Some(allowed) = leaf_allows.get(&me) {
                allowed.iter().any(|a| a == u)
            } else if let Some(at) = stages.iter().position(|s| *s == me) {
                leaf_allows.contains_key(u) || stages[..at].iter().any(|s| s == u)
            } else {
                bad.push(format!(
                    "{me} is neither a stage nor a leaf in docs/architecture.md"
                ));
                continue;
            };
            if !ok {
                bad.push(format!("{} imports {u}", p.display()));
            }
        }
    }
    bad.sort();
    bad.dedup();
    assert!(bad.is_empty(), "against the documented order: {bad:#?}");
}
