//! No import circles inside a library crate: among the child modules of
//! every module, the `use` graph is acyclic, so each crate reads from the
//! bottom up.
//!
//! The check reads the sources the way a reviewer does. Each path a file
//! names (`crate::a::b`, `super::x`, `self::x`, or a child's bare name) is an
//! edge from the file's module to the module the path reaches. An edge is
//! lifted to the two siblings under the nearest common ancestor of its ends;
//! edges between a module and its own ancestor (a parent re-exporting a
//! child, a child using its parent's items) are ownership, not use, and do
//! not count. Code under `#[cfg(test)]` is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside one crate: `[]` is the crate root.
type ModPath = Vec<String>;

/// One use of another module, kept with where it was written.
struct Edge {
    from: ModPath,
    to: ModPath,
    at: String,
}

fn workspace_crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every library crate of the workspace: a folder under `crates/` with `src/lib.rs`.
fn library_crates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(workspace_crates())
        .expect("crates folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("src/lib.rs").is_file())
        .collect();
    out.sort();
    out
}

/// The module a source file defines, from its place under `src/`.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("file under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments, string contents and `#[cfg(test)]` items;
/// the newlines of what is left out stay, so line numbers still hold.
fn code_of(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let skip_to = if rest.starts_with("//") {
            rest.find('\n').map_or(text.len(), |n| i + n)
        } else if rest.starts_with("/*") {
            rest.find("*/").map_or(text.len(), |n| i + n + 2)
        } else if rest.starts_with("#[cfg(test)]") {
            skip_item(text, i + "#[cfg(test)]".len())
        } else if let Some(raw) = rest.strip_prefix("r#\"") {
            out.push_str("\"\"");
            raw.find("\"#").map_or(text.len(), |n| i + 3 + n + 2)
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            (j + 1).min(bytes.len())
        } else if rest.starts_with("'\\''") || rest.starts_with("'\"'") {
            i + if rest.starts_with("'\\''") { 4 } else { 3 }
        } else {
            let c = rest.chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
            continue;
        };
        out.extend(std::iter::repeat_n(
            '\n',
            text[i..skip_to].matches('\n').count(),
        ));
        i = skip_to;
    }
    out
}

/// The index just past the item that starts at `from`: through its matching
/// closing brace, or its `;` when it has no body.
fn skip_item(text: &str, from: usize) -> usize {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    bytes.len()
}

/// Every path the code names, with the offset it starts at: `use` trees are
/// expanded (`a::{b, c::d}` gives `a::b` and `a::c::d`).
fn paths_in(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &code[i..];
        let word_start = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':';
        if word_start && rest.starts_with("use ") {
            let end = rest.find(';').map_or(code.len(), |n| i + n);
            let tree = &code[i + 4..end];
            let mut paths = Vec::new();
            expand_tree(tree.trim(), Vec::new(), &mut paths);
            out.extend(paths.into_iter().map(|p| (i, p)));
            i = end;
        } else if word_start && is_ident(bytes[i]) {
            let mut j = i;
            let mut segs = Vec::new();
            loop {
                let s = j;
                while j < bytes.len() && is_ident(bytes[j]) {
                    j += 1;
                }
                segs.push(code[s..j].to_string());
                if code[j..].starts_with("::")
                    && code[j + 2..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if segs.len() > 1 {
                out.push((i, segs));
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Expand one `use` tree under `prefix`.
fn expand_tree(tree: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim().trim_start_matches("::");
    if tree.is_empty() {
        return;
    }
    if let Some(inner) = tree.strip_prefix('{') {
        let inner = inner.strip_suffix('}').unwrap_or(inner);
        for part in split_top(inner) {
            expand_tree(part, prefix.clone(), out);
        }
        return;
    }
    match tree.find("::") {
        Some(n) if !tree[..n].contains(['{', ' ']) => {
            let mut p = prefix;
            p.push(tree[..n].trim().to_string());
            expand_tree(&tree[n + 2..], p, out);
        }
        _ => {
            let name = tree.split_whitespace().next().unwrap_or("");
            let mut p = prefix;
            if name != "self" && name != "*" {
                p.push(name.to_string());
            }
            out.push(p);
        }
    }
}

/// Split a brace group's contents at its top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The module a path reaches from `here`, or `None` when it leaves the crate.
fn resolve(here: &ModPath, path: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut base: ModPath;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            base = here.clone();
            rest = &path[1..];
        }
        Some("super") => {
            base = here.clone();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) => {
            let mut child = here.clone();
            child.push(first.to_string());
            if !modules.contains(&child) {
                return None;
            }
            base = here.clone();
        }
        None => return None,
    }
    for seg in rest {
        let mut next = base.clone();
        next.push(seg.clone());
        if modules.contains(&next) {
            base = next;
        } else {
            break;
        }
    }
    Some(base)
}

/// The uses between modules of one crate.
fn crate_edges(root: &Path) -> Vec<Edge> {
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<ModPath> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges = Vec::new();
    for file in &files {
        let here = module_of(&src, file);
        if here.iter().any(|m| m == "tests" || m.starts_with("test_")) {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read source");
        let code = code_of(&text);
        for (offset, path) in paths_in(&code) {
            let Some(to) = resolve(&here, &path, &modules) else {
                continue;
            };
            if to != here {
                let line = code[..offset].matches('\n').count() + 1;
                let shown = file
                    .strip_prefix(workspace_crates())
                    .unwrap_or(file)
                    .display();
                edges.push(Edge {
                    from: here.clone(),
                    to,
                    at: format!("{shown}:{line}: {}", path.join("::")),
                });
            }
        }
    }
    edges
}

/// The cycles among siblings, each printed with one use per step.
fn sibling_cycles(edges: &[Edge]) -> Vec<String> {
    // parent -> (from sibling -> to sibling -> an example)
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, String>>> = BTreeMap::new();
    for e in edges {
        let common = e.from.iter().zip(&e.to).take_while(|(a, b)| a == b).count();
        if common == e.from.len() || common == e.to.len() {
            continue;
        }
        graphs
            .entry(e.from[..common].to_vec())
            .or_default()
            .entry(e.from[common].clone())
            .or_default()
            .entry(e.to[common].clone())
            .or_insert_with(|| e.at.clone());
    }
    let mut found = Vec::new();
    for (parent, graph) in &graphs {
        for component in strongly_connected(graph) {
            let mut text = format!("in `{}`: {}", display(parent), component.join(", "));
            for a in &component {
                for (b, at) in &graph[a] {
                    if component.contains(b) {
                        text.push_str(&format!("\n    {a} -> {b}: {at}"));
                    }
                }
            }
            found.push(text);
        }
    }
    found
}

fn display(path: &ModPath) -> String {
    if path.is_empty() {
        "crate".to_string()
    } else {
        path.join("::")
    }
}

/// Tarjan's algorithm; only components with more than one module are returned.
fn strongly_connected(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.graph.get(v) {
            for w in next.keys() {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_library_crate_has_an_import_cycle_among_its_modules() {
    let mut report = Vec::new();
    for root in library_crates() {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        for cycle in sibling_cycles(&crate_edges(&root)) {
            report.push(format!("{name}: {cycle}"));
        }
    }
    assert!(
        report.is_empty(),
        "module import cycles:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_cycle_check_finds_a_planted_cycle() {
    let edge = |from: &[&str], to: &[&str]| Edge {
        from: from.iter().map(|s| s.to_string()).collect(),
        to: to.iter().map(|s| s.to_string()).collect(),
        at: String::new(),
    };
    let planted = [
        edge(&["a", "x"], &["b"]),
        edge(&["b"], &["a"]),
        edge(&["a"], &["a", "x"]),
    ];
    let cycles = sibling_cycles(&planted);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].starts_with("in `crate`: a, b"), "{}", cycles[0]);
    let ownership = [edge(&["a"], &["a", "x"]), edge(&["a", "x"], &["a"])];
    assert!(sibling_cycles(&ownership).is_empty());
}

#[test]
fn use_trees_expand_and_resolve_against_the_module_tree() {
    let code = code_of("use crate::{a::{b, c::D}, e};\n// crate::zz::y\nfn f() { super::g::h(); \"crate::q::r\"; }\n#[cfg(test)]\nmod tests { use crate::t::u; }\n");
    let paths: Vec<String> = paths_in(&code)
        .into_iter()
        .map(|(_, p)| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        ["crate::a::b", "crate::a::c::D", "crate::e", "super::g::h"]
    );
    let modules: BTreeSet<ModPath> = [
        vec![],
        vec!["a".to_string()],
        vec!["a".to_string(), "c".to_string()],
        vec!["g".to_string()],
    ]
    .into_iter()
    .collect();
    let here = vec!["k".to_string()];
    let to = |p: &str| {
        resolve(
            &here,
            &p.split("::").map(String::from).collect::<Vec<_>>(),
            &modules,
        )
    };
    assert_eq!(
        to("crate::a::c::D"),
        Some(vec!["a".to_string(), "c".to_string()])
    );
    assert_eq!(to("super::g::h"), Some(vec!["g".to_string()]));
    assert_eq!(to("std::fmt"), None);
}
