//! Module cycles: the import graph between the modules of each crate, read from the
//! sources, and the circles in it. A module that reaches into another and is reached
//! back (directly or round a ring) is a placement problem the compiler accepts; the
//! unit test below fails on the first new one, naming its files.
//!
//! An edge is any path a module names that starts with `crate::`, `super::` or
//! `self::` (in a `use`, braces expanded, or inline in the code), ending at the deepest
//! module of the crate the path names. Edges between a module and its ancestors are the
//! module tree (a child using its parent's items, a parent re-exporting a child's), not
//! imports, so they are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module by its path from the crate root (`[]` is the root).
pub type ModPath = Vec<String>;

/// The modules of the crate whose sources are under `src`, by module path.
pub fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).expect("under src");
            let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            let file = parts.pop().expect("a file name");
            match file.as_str() {
                "lib.rs" | "main.rs" | "mod.rs" => {}
                f => parts.push(f.trim_end_matches(".rs").to_string()),
            }
            // A binary's other roots (src/bin/*.rs) are crates of their own.
            if parts.first().is_some_and(|p| p == "bin") {
                continue;
            }
            out.insert(parts, p);
        }
    }
    out
}

/// Source text without comments, strings and character literals (their text is not
/// code, and a path in a doc comment is no import).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                out.push(' ');
            }
            b'"' => {
                i = past_quoted(b, i);
                out.push_str("\"\"");
            }
            // A raw string (r"..", r#".."#): skipped to its closing quote and hashes.
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                let closing: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                while j < b.len() && !b[j..].starts_with(&closing) {
                    j += 1;
                }
                i = j + closing.len();
                out.push_str("\"\"");
            }
            // A character literal ('x', '\n', '\''); a lifetime ('a) is kept.
            b'\'' if b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\') => {
                i = past_quoted(b, i);
                out.push_str("' '");
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

/// The index just past the literal whose opening quote is at `i` (escapes skipped).
fn past_quoted(b: &[u8], mut i: usize) -> usize {
    let quote = b[i];
    i += 1;
    while i < b.len() && b[i] != quote {
        if b[i] == b'\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The paths a use tree or an inline path starting at `at` names, each as segments
/// (braces expanded; `self` in braces names the prefix).
fn paths_at(code: &[u8], at: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut i = at;
    let mut path = prefix;
    loop {
        while i < code.len() && code[i].is_ascii_whitespace() {
            i += 1;
        }
        if code.get(i) == Some(&b'{') {
            i += 1;
            loop {
                while i < code.len() && (code[i].is_ascii_whitespace() || code[i] == b',') {
                    i += 1;
                }
                if i >= code.len() || code[i] == b'}' {
                    return i + 1;
                }
                i = paths_at(code, i, path.clone(), out);
                // Skip `as name` and anything else up to the item's end.
                while i < code.len() && code[i] != b',' && code[i] != b'}' {
                    i += 1;
                }
            }
        }
        let start = i;
        while i < code.len() && ident_char(code[i]) {
            i += 1;
        }
        if start == i {
            // `*`: the glob names the prefix.
            out.push(path);
            return i;
        }
        let seg = String::from_utf8_lossy(&code[start..i]).into_owned();
        if seg != "self" || path.is_empty() {
            path.push(seg);
        }
        let mut j = i;
        while j < code.len() && code[j].is_ascii_whitespace() {
            j += 1;
        }
        if code[j..].starts_with(b"::") {
            i = j + 2;
            continue;
        }
        out.push(path);
        return i;
    }
}

/// The modules `module` (its source `text`) names, resolved against the crate's
/// `modules`: each path ends at the deepest module it passes through.
pub fn imports(module: &ModPath, text: &str, modules: &BTreeMap<ModPath, PathBuf>) -> BTreeSet<ModPath> {
    let code = code_only(text);
    let b = code.as_bytes();
    let mut raw = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_path = (i == 0 || !(ident_char(b[i - 1]) || b[i - 1] == b':'))
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|k| b[i..].starts_with(k.as_bytes()));
        if starts_path {
            i = paths_at(b, i, Vec::new(), &mut raw);
        } else {
            i += 1;
        }
    }
    let mut out = BTreeSet::new();
    for p in raw {
        let mut abs: ModPath = match p.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("self") => module.clone(),
            Some("super") => module.clone(),
            _ => continue,
        };
        let mut rest = p.iter().skip(1).peekable();
        if p[0] == "super" {
            abs.pop();
            while rest.peek().is_some_and(|s| *s == "super") {
                abs.pop();
                rest.next();
            }
        }
        let mut deepest = abs.clone();
        for seg in rest {
            abs.push(seg.clone());
            if modules.contains_key(&abs) {
                deepest = abs.clone();
            }
        }
        out.insert(deepest);
    }
    out
}

/// Whether `a` is `b`, or one of them is the other's ancestor.
fn in_line(a: &ModPath, b: &ModPath) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The import circles among the modules of the crate under `src`: each a list of the
/// files involved (strongly connected sets of more than one module).
pub fn cycles(src: &Path) -> Vec<Vec<PathBuf>> {
    let modules = modules(src);
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (m, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let to: BTreeSet<ModPath> = imports(m, &text, &modules)
            .into_iter()
            .filter(|t| !in_line(m, t) && modules.contains_key(t))
            .collect();
        edges.insert(m.clone(), to);
    }
    // Kosaraju: the strongly connected components of the graph.
    let reach = |from: &ModPath, graph: &BTreeMap<ModPath, BTreeSet<ModPath>>| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            if seen.insert(n.clone()) {
                stack.extend(graph.get(&n).into_iter().flatten().cloned());
            }
        }
        seen
    };
    let mut reverse: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (a, tos) in &edges {
        for b in tos {
            reverse.entry(b.clone()).or_default().insert(a.clone());
        }
    }
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in modules.keys() {
        if done.contains(m) {
            continue;
        }
        let fwd = reach(m, &edges);
        let back = reach(m, &reverse);
        let scc: BTreeSet<ModPath> = fwd.intersection(&back).cloned().collect();
        done.extend(scc.iter().cloned());
        if scc.len() > 1 {
            out.push(scc.iter().map(|m| modules[m].clone()).collect());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(paths: &[&str]) -> BTreeMap<ModPath, PathBuf> {
        paths
            .iter()
            .map(|p| {
                let m: ModPath = p.split("::").filter(|s| !s.is_empty()).map(String::from).collect();
                (m, PathBuf::from(p))
            })
            .collect()
    }

    fn m(p: &str) -> ModPath {
        p.split("::").filter(|s| !s.is_empty()).map(String::from).collect()
    }

    #[test]
    fn paths_resolve_to_the_deepest_module_they_name() {
        let mods = names(&["", "a", "a::b", "a::c", "d"]);
        let text = r#"
            use crate::a::{b::Thing, c::{self, Other as O}};
            use super::*;
            // use crate::d::Commented;
            fn f() { let s = "crate::d::InAString"; crate::d::call(); }
        "#;
        let got = imports(&m("a::b"), text, &mods);
        assert_eq!(got, BTreeSet::from([m("a::b"), m("a::c"), m("a"), m("d")]));
    }

    #[test]
    fn a_ring_of_sibling_imports_is_a_cycle_and_the_module_tree_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        let write = |p: &str, t: &str| {
            let path = src.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, t).unwrap();
        };
        write("lib.rs", "mod a; mod b; mod c; pub use a::A;");
        write("a/mod.rs", "mod inner; use super::b::B; pub struct A;");
        write("a/inner.rs", "use super::A; use crate::c::C;");
        write("b.rs", "use crate::c::C; pub struct B;");
        write("c.rs", "use crate::a::A; pub struct C;");
        let found = cycles(src);
        assert_eq!(found.len(), 1, "{found:?}");
        let files: BTreeSet<String> = found[0]
            .iter()
            .map(|p| p.strip_prefix(src).unwrap().display().to_string())
            .collect();
        // a/inner.rs reaches c, but only its parent reaches it: the tree, not the ring.
        assert_eq!(files, BTreeSet::from(["a/mod.rs".into(), "b.rs".into(), "c.rs".into()]));
        write("c.rs", "pub struct C;");
        assert!(cycles(src).is_empty(), "the ring broken at c");
    }

    /// The workspace's crates have no module cycle.
    #[test]
    fn no_crate_of_the_workspace_has_a_module_cycle() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
        let mut found = Vec::new();
        for group in ["pkg", "cmd", "test"] {
            let dirs: Vec<PathBuf> = if group == "test" {
                vec![root.join("test")]
            } else {
                std::fs::read_dir(root.join(group))
                    .unwrap()
                    .flatten()
                    .map(|e| e.path())
                    .collect()
            };
            for krate in dirs {
                let src = krate.join("src");
                if !src.is_dir() {
                    continue;
                }
                for c in cycles(&src) {
                    let files: Vec<String> = c
                        .iter()
                        .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
                        .collect();
                    found.push(files.join(" <-> "));
                }
            }
        }
        assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
    }
}
