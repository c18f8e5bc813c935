//! The crate's module graph, read from its source for `layering.rs`: every file's module
//! path, the paths its code names (`use` trees expanded, inline `a::b::c` paths, `super::`
//! and `self::` resolved), re-exports followed to the file that defines the item, and per
//! folder the graph between its children. Also the size rules' measures: lines per file and
//! per function.
//!
//! A reference counts when the code names a module or an item of one; `mod x;` declarations
//! and a folder's own `pub use` re-exports (its face) do not. The unit-test module at the end
//! of a file and comments are dropped: a test or a doc example may name anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file.
pub struct File {
    pub path: PathBuf,
    /// Its module path under the crate root (`["builder", "pipeline"]`; `[]` for lib.rs).
    pub module: Vec<String>,
    /// Whether it is a folder's file (`mod.rs`, `lib.rs`): its children are `module + [x]`.
    pub is_folder: bool,
    /// The full text.
    pub text: String,
}

/// Every `.rs` file under `root` (a crate's `src/`), main.rs excluded (the binary is its own
/// crate).
pub fn files(root: &Path) -> Vec<File> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") || p == root.join("main.rs") {
                continue;
            }
            let rel = p.strip_prefix(root).unwrap();
            let mut module: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let last = module.last().cloned().unwrap_or_default();
            let is_folder = last == "mod" || (module.len() == 1 && last == "lib");
            if is_folder {
                module.pop();
            }
            // `foo.rs` beside `foo/` is that folder's file too.
            let is_folder = is_folder || p.with_extension("").is_dir();
            let text = std::fs::read_to_string(&p).unwrap();
            out.push(File {
                path: p,
                module,
                is_folder,
                text,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The code of a file that imports count in: no unit-test module, no comments, no string
/// literals' contents, no `mod x;` lines.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or("");
    let mut out = String::new();
    for line in text.lines() {
        let line = strip_strings(line);
        let line = line.split("//").next().unwrap_or("");
        let t = line.trim_start();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        if t.starts_with("mod ") && t.trim_end().ends_with(';') {
            out.push('\n');
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `line` with the contents of its string and char literals blanked.
fn strip_strings(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_str = false;
    let mut esc = false;
    for c in line.chars() {
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
                out.push('"');
            }
            continue;
        }
        if c == '"' {
            in_str = true;
        }
        out.push(c);
    }
    out
}

/// The statements of `code` that begin with `use` or `pub use` (whole, across lines), each
/// with whether it is a re-export, and the code with them removed.
fn split_uses(code: &str) -> (Vec<(bool, String)>, String) {
    let mut uses = Vec::new();
    let mut rest = String::new();
    let mut cur: Option<(bool, String)> = None;
    for line in code.lines() {
        if let Some((_, s)) = cur.as_mut() {
            s.push_str(line);
            if line.contains(';') {
                uses.push(cur.take().unwrap());
            }
            continue;
        }
        let t = line.trim_start();
        let (public, t) = if let Some(r) = t.strip_prefix("pub(crate) use ") {
            (true, r)
        } else if let Some(r) = t.strip_prefix("pub(super) use ") {
            (true, r)
        } else if let Some(r) = t.strip_prefix("pub use ") {
            (true, r)
        } else if let Some(r) = t.strip_prefix("use ") {
            (false, r)
        } else {
            rest.push_str(line);
            rest.push('\n');
            continue;
        };
        if t.contains(';') {
            uses.push((public, t.to_string()));
        } else {
            cur = Some((public, t.to_string()));
        }
    }
    (uses, rest)
}

/// The paths a `use` tree names (`a::{b::C, d}` → `a::b::C`, `a::d`), each as segments.
fn expand(tree: &str) -> Vec<Vec<String>> {
    fn go(prefix: &[String], s: &str, out: &mut Vec<Vec<String>>) {
        let s = s.trim().trim_end_matches(';').trim();
        if let Some(open) = s.find('{') {
            let head: Vec<String> = s[..open]
                .split("::")
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect();
            let close = s.rfind('}').unwrap_or(s.len());
            let inner = &s[open + 1..close];
            let mut base = prefix.to_vec();
            base.extend(head);
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&base, &inner[start..], out);
        } else {
            let s = s.split(" as ").next().unwrap_or("").trim();
            if s.is_empty() {
                return;
            }
            let mut p = prefix.to_vec();
            p.extend(s.split("::").map(|x| x.trim().to_string()));
            out.push(p);
        }
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

/// The `a::b::c` paths written inline in `code` (two segments at least).
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        if ident(b[i]) && (i == 0 || !(ident(b[i - 1]) || b[i - 1] == b':')) {
            let mut segs = Vec::new();
            let mut j = i;
            loop {
                let s = j;
                while j < b.len() && ident(b[j]) {
                    j += 1;
                }
                segs.push(code[s..j].to_string());
                if j + 2 < b.len() && &b[j..j + 2] == b"::" && ident(b[j + 2]) {
                    j += 2;
                } else {
                    break;
                }
            }
            if segs.len() > 1 {
                out.push(segs);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The crate's module graph.
pub struct Graph {
    pub files: Vec<File>,
    /// File index → the files it references.
    pub edges: BTreeMap<usize, BTreeSet<usize>>,
}

impl Graph {
    pub fn of(root: &Path) -> Self {
        let files = files(root);
        let by_module: BTreeMap<Vec<String>, usize> = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        // Re-exports of folder files: (folder module, name) → the path it re-exports.
        let mut reexports: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
        let mut parsed = Vec::new();
        for f in &files {
            let (uses, rest) = split_uses(&code(&f.text));
            for (public, tree) in &uses {
                if *public && f.is_folder {
                    for p in expand(tree) {
                        let name = tree_alias(tree, &p);
                        let abs = absolute(f, &p, &by_module);
                        reexports.insert((f.module.clone(), name), abs);
                    }
                }
            }
            parsed.push((uses, rest));
        }
        let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        for (i, f) in files.iter().enumerate() {
            let (uses, rest) = &parsed[i];
            let mut paths: Vec<Vec<String>> = uses
                .iter()
                .filter(|(public, _)| !(*public && f.is_folder))
                .flat_map(|(_, t)| expand(t))
                .collect();
            paths.extend(inline_paths(rest));
            for p in paths {
                let abs = absolute(f, &p, &by_module);
                if let Some(t) = resolve(&abs, &by_module, &reexports, 0) {
                    if t != i {
                        edges.entry(i).or_default().insert(t);
                    }
                }
            }
        }
        Graph { files, edges }
    }

    /// Per folder (a module with children), the cycles among its children: a file is its
    /// own node, a sub-folder one node for all its files; the folder's own file is no node.
    pub fn folder_cycles(&self) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        let folders: BTreeSet<Vec<String>> = self
            .files
            .iter()
            .filter(|f| f.is_folder)
            .map(|f| f.module.clone())
            .collect();
        for folder in folders {
            let child = |m: &[String]| -> Option<String> {
                (m.len() > folder.len() && m[..folder.len()] == folder[..])
                    .then(|| m[folder.len()].clone())
            };
            let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, targets) in &self.edges {
                let Some(ca) = child(&self.files[*a].module) else {
                    continue;
                };
                for b in targets {
                    if let Some(cb) = child(&self.files[*b].module) {
                        if ca != cb {
                            g.entry(ca.clone()).or_default().insert(cb);
                        }
                    }
                }
            }
            let name = if folder.is_empty() {
                "src".to_string()
            } else {
                folder.join("/")
            };
            for c in cycles(&g) {
                out.push((name.clone(), c));
            }
        }
        out
    }
}

/// The name a `use` tree path brings into scope (its alias when it has one).
fn tree_alias(tree: &str, p: &[String]) -> String {
    let last = p.last().cloned().unwrap_or_default();
    let pat = format!("{last} as ");
    match tree.find(&pat) {
        Some(at) => tree[at + pat.len()..]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or(&last)
            .to_string(),
        None => last,
    }
}

/// `p` as written in `f`, made absolute (from the crate root); paths into other crates come
/// back unchanged and resolve to nothing.
fn absolute(f: &File, p: &[String], by_module: &BTreeMap<Vec<String>, usize>) -> Vec<String> {
    let mut base: Vec<String> = f.module.clone();
    let mut rest = p;
    match p.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &p[1..];
        }
        Some("super") | Some("self") => {
            while let Some(s) = rest.first() {
                match s.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A child module of this file's module (2018 paths), else not ours.
            let mut child = base.clone();
            child.push(first.to_string());
            if !by_module.contains_key(&child) {
                return p.to_vec();
            }
        }
        None => return Vec::new(),
    }
    base.extend(rest.iter().cloned());
    base
}

/// The file an absolute path lands in: the longest module prefix, then through that
/// module's re-exports when the next segment is one.
fn resolve(
    abs: &[String],
    by_module: &BTreeMap<Vec<String>, usize>,
    reexports: &BTreeMap<(Vec<String>, String), Vec<String>>,
    depth: u8,
) -> Option<usize> {
    for k in (0..=abs.len()).rev() {
        let m = &abs[..k];
        let Some(&file) = by_module.get(m) else {
            continue;
        };
        if k == 0 && abs.is_empty() {
            return None;
        }
        if let Some(next) = abs.get(k) {
            if depth < 8 {
                if let Some(target) = reexports.get(&(m.to_vec(), next.clone())) {
                    let mut t = target.clone();
                    t.extend(abs[k + 1..].iter().cloned());
                    if let Some(r) = resolve(&t, by_module, reexports, depth + 1) {
                        return Some(r);
                    }
                }
            }
        }
        return Some(file);
    }
    None
}

/// Every elementary cycle's strongly connected component in `g` (one list of nodes per
/// component of more than one node, or a node with an edge to itself).
pub fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's strongly connected components.
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: Vec<&str> = g
        .iter()
        .flat_map(|(k, v)| std::iter::once(k.as_str()).chain(v.iter().map(String::as_str)))
        .collect();
    for n in nodes {
        if !t.index.contains_key(n) {
            visit(&mut t, n);
        }
    }
    t.out
}

/// Functions longer than `max` lines: (file, function name, lines, whether a comment within
/// the twelve lines above it says why it is one piece).
pub fn long_functions(files: &[File], max: usize) -> Vec<(PathBuf, String, usize, bool)> {
    let mut out = Vec::new();
    for f in files {
        // Unit tests are not held to the rule.
        let text = f
            .text
            .split("#[cfg(test)]\nmod tests {")
            .next()
            .unwrap_or("");
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let Some(name) = fn_name(lines[i]) else {
                i += 1;
                continue;
            };
            let (mut depth, mut started, mut j) = (0i64, false, i);
            while j < lines.len() {
                let l = strip_strings(lines[j]);
                let l = l.split("//").next().unwrap_or("");
                depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                started |= l.contains('{');
                if (started && depth <= 0) || (!started && l.trim_end().ends_with(';')) {
                    break;
                }
                j += 1;
            }
            if started && j - i + 1 > max {
                let above = lines[i.saturating_sub(12)..i].join("\n").to_lowercase();
                out.push((f.path.clone(), name, j - i + 1, above.contains("one piece")));
            }
            i = if started { j + 1 } else { i + 1 };
        }
    }
    out
}

/// The name of the function a line declares, if it declares one.
fn fn_name(line: &str) -> Option<String> {
    let mut t = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
        "extern \"C\" ",
    ] {
        t = t.strip_prefix(prefix).unwrap_or(t);
    }
    let rest = t.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(rest[..end].to_string())
}
