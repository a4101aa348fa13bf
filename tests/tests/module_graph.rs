//! Imports between the top-level modules of each crate run one way: following every `crate::`
//! path, `use` lines (grouped trees included) and inline paths in code alike, the modules form
//! no cycle. A module that imports a module which imports it back is a knot a reader cannot
//! follow top-down; vocabulary types belong in a low module both can import.
//!
//! Comments and string literals are not read: a doc link is no dependency. The scheduler's DRA
//! module must also stay below the model: it may not reach the cluster index or the live loop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

/// The crate roots whose file-backed `mod x;` declarations make the top-level modules.
const CRATE_ROOTS: [&str; 5] = [
    "src/lib.rs",
    "topology/src/lib.rs",
    "exporter/src/lib.rs",
    "scheduler/src/lib.rs",
    "tests/lib.rs",
];

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Other,
}

/// Rust tokens that matter for paths, with comments, strings and character literals skipped.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let ident_start = |ch: char| ch.is_alphabetic() || ch == '_';
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if c.get(i) == Some(&'\n') {
                    line += 1;
                }
                i += 1;
            }
            i += 1;
            out.push((Tok::Other, line));
        } else if ch == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
            out.push((Tok::Other, line));
        } else if ident_start(ch) {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // Raw strings (r"..", r#".."#, br"..") and raw identifiers (r#type).
            if (word == "r" || word == "br") && matches!(c.get(i), Some('"' | '#')) {
                let mut hashes = 0;
                while c.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                if c.get(i) == Some(&'"') {
                    i += 1;
                    loop {
                        if i >= c.len() {
                            break;
                        }
                        if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                            i += 1 + hashes;
                            break;
                        }
                        if c[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                    out.push((Tok::Other, line));
                } else {
                    let start = i;
                    while i < c.len() && ident_char(c[i]) {
                        i += 1;
                    }
                    out.push((Tok::Ident(c[start..i].iter().collect()), line));
                }
            } else if word == "b" && matches!(c.get(i), Some('"' | '\'')) {
                // A byte string or byte character: the next round skips the literal.
            } else {
                out.push((Tok::Ident(word), line));
            }
        } else if ch.is_ascii_digit() {
            while i < c.len()
                && (ident_char(c[i]) || c[i] == '.')
                && !(c[i] == '.' && c.get(i + 1) == Some(&'.'))
            {
                i += 1;
            }
            out.push((Tok::Other, line));
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((
                match ch {
                    '{' => Tok::Open,
                    '}' => Tok::Close,
                    ',' => Tok::Comma,
                    ';' => Tok::Semi,
                    _ => Tok::Other,
                },
                line,
            ));
            i += 1;
        }
    }
    out
}

/// The first segment after each `crate::`: `crate::a::X`, and every item of a grouped
/// `crate::{a, b::{c, d}}`; with the line it is on.
fn crate_paths(src: &str) -> Vec<(String, usize)> {
    let t = tokens(src);
    let mut out = Vec::new();
    for i in 0..t.len() {
        if t[i].0 != Tok::Ident("crate".into()) || t.get(i + 1).map(|x| &x.0) != Some(&Tok::PathSep) {
            continue;
        }
        match t.get(i + 2) {
            Some((Tok::Ident(m), line)) => out.push((m.clone(), *line)),
            Some((Tok::Open, _)) => {
                let mut depth = 0;
                let mut item_start = true;
                for (tok, line) in &t[i + 2..] {
                    match tok {
                        Tok::Open => {
                            depth += 1;
                            item_start = depth == 1;
                            continue;
                        }
                        Tok::Close => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        Tok::Comma if depth == 1 => {
                            item_start = true;
                            continue;
                        }
                        Tok::Ident(m) if item_start && depth == 1 && m != "self" => {
                            out.push((m.clone(), *line))
                        }
                        _ => {}
                    }
                    item_start = false;
                }
            }
            _ => {}
        }
    }
    out
}

/// The file-backed modules a crate root declares (`mod x;` and `pub mod x;` at its top level).
fn declared_modules(root_src: &str) -> Vec<String> {
    let t = tokens(root_src);
    let mut depth = 0;
    let mut out = Vec::new();
    for (i, (tok, _)) in t.iter().enumerate() {
        match tok {
            Tok::Open => depth += 1,
            Tok::Close => depth -= 1,
            Tok::Ident(w) if w == "mod" && depth == 0 => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Semi, _))) = (t.get(i + 1), t.get(i + 2)) {
                    out.push(name.clone());
                }
            }
            _ => {}
        }
    }
    out
}

/// One crate's module graph: edges between top-level modules, each with where it was seen.
#[derive(Debug, Default)]
struct Graph {
    modules: BTreeSet<String>,
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

/// Builds the graph of the crate whose root is `root` from `files` (path → source; paths use
/// `/`). A module `m` is `m.rs` or `m/mod.rs` next to the root, plus every file under `m/`.
fn graph(files: &BTreeMap<String, String>, root: &str) -> Graph {
    let dir = root.rsplit_once('/').map_or("", |(d, _)| d);
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut g = Graph {
        modules: declared_modules(files.get(root).map_or("", String::as_str))
            .into_iter()
            .collect(),
        ..Graph::default()
    };
    for (path, src) in files {
        let Some(rel) = path.strip_prefix(&prefix) else {
            continue;
        };
        let top = rel.split('/').next().unwrap_or(rel);
        let module = top.strip_suffix(".rs").unwrap_or(top);
        let own = rel == format!("{module}.rs") || rel.starts_with(&format!("{module}/"));
        if !own || !g.modules.contains(module) {
            continue;
        }
        for (target, line) in crate_paths(src) {
            if target != module && g.modules.contains(&target) {
                g.edges
                    .entry(module.to_owned())
                    .or_default()
                    .entry(target.clone())
                    .or_insert_with(|| format!("{path}:{line}: crate::{target}"));
            }
        }
    }
    g
}

impl Graph {
    /// A cycle, as the modules along it (first repeated at the end), or `None`.
    fn cycle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        fn visit(
            g: &Graph,
            m: &str,
            marks: &mut BTreeMap<String, Mark>,
            stack: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            marks.insert(m.to_owned(), Mark::Open);
            stack.push(m.to_owned());
            for next in g.edges.get(m).into_iter().flat_map(BTreeMap::keys) {
                match marks.get(next).copied().unwrap_or(Mark::New) {
                    Mark::Open => {
                        let from = stack.iter().position(|s| s == next).unwrap_or(0);
                        let mut cycle = stack[from..].to_vec();
                        cycle.push(next.clone());
                        return Some(cycle);
                    }
                    Mark::New => {
                        if let Some(c) = visit(g, next, marks, stack) {
                            return Some(c);
                        }
                    }
                    Mark::Done => {}
                }
            }
            stack.pop();
            marks.insert(m.to_owned(), Mark::Done);
            None
        }
        let mut marks = BTreeMap::new();
        for m in &self.modules {
            if marks.get(m).copied().unwrap_or(Mark::New) == Mark::New
                && let Some(c) = visit(self, m, &mut marks, &mut Vec::new())
            {
                return Some(c);
            }
        }
        None
    }

    /// The cycle named with the path that makes each of its arrows.
    fn describe(&self, cycle: &[String]) -> String {
        let mut s = cycle.join(" -> ");
        for pair in cycle.windows(2) {
            let at = self
                .edges
                .get(&pair[0])
                .and_then(|e| e.get(&pair[1]))
                .map_or("?", String::as_str);
            let _ = write!(s, "\n  {} -> {}: {at}", pair[0], pair[1]);
        }
        s
    }

    /// Every module `from` reaches.
    fn reachable(&self, from: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(m) = todo.pop() {
            for next in self.edges.get(&m).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file of the workspace's crates, keyed by path relative to the workspace.
fn workspace_files() -> BTreeMap<String, String> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if p.is_dir() && name != "target" && name != ".git" {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p
                    .strip_prefix(base)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .replace('\\', "/");
                let src = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
                out.insert(rel, src);
            }
        }
    }
    let base = workspace();
    let mut out = BTreeMap::new();
    for dir in ["src", "topology/src", "exporter/src", "scheduler/src", "tests"] {
        walk(&base.join(dir), &base, &mut out);
    }
    out
}

#[test]
fn no_crate_has_an_import_cycle_between_its_top_level_modules() {
    let files = workspace_files();
    let mut failures = Vec::new();
    for root in CRATE_ROOTS {
        assert!(files.contains_key(root), "crate root {root} not found");
        let g = graph(&files, root);
        assert!(!g.modules.is_empty(), "{root}: no modules read");
        if let Some(c) = g.cycle() {
            failures.push(format!("{root}: import cycle {}", g.describe(&c)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_scheduler_graph_is_read_from_use_lines_groups_and_inline_paths() {
    let g = graph(&workspace_files(), "scheduler/src/lib.rs");
    let has = |a: &str, b: &str| g.edges.get(a).is_some_and(|e| e.contains_key(b));
    // Known arrows of the model, each written a different way: a grouped `use crate::{..}`,
    // a single `use crate::x::Y` line and an inline path.
    assert!(has("cluster", "admission"), "{:?}", g.edges.get("cluster"));
    assert!(has("constraints", "pod_facts"));
    assert!(
        has("pod", "pod_facts"),
        "pod.rs names crate::pod_facts::PodFacts inline"
    );
    assert!(g.modules.contains("dra"));
}

#[test]
fn dra_stays_below_the_model() {
    let g = graph(&workspace_files(), "scheduler/src/lib.rs");
    let reached = g.reachable("dra");
    for above in ["cluster", "live", "extender", "simulate", "kubectl"] {
        assert!(!reached.contains(above), "dra reaches {above}: {reached:?}");
    }
}

fn synthetic(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, s)| ((*p).to_owned(), (*s).to_owned()))
        .collect()
}

#[test]
fn a_cycle_through_an_inline_path_is_found_and_named() {
    let files = synthetic(&[
        (
            "c/src/lib.rs",
            "pub mod a;\npub mod b;\npub mod c;\nmod inline { }\n",
        ),
        ("c/src/a.rs", "use crate::b::Thing;\n"),
        ("c/src/b/mod.rs", "mod deep;\n"),
        ("c/src/b/deep.rs", "fn f() -> crate::a::Other { todo!() }\n"),
        ("c/src/c.rs", "use crate::a::X;\n"),
    ]);
    let g = graph(&files, "c/src/lib.rs");
    let c = g.cycle().expect("a -> b -> a");
    assert_eq!(c, ["a", "b", "a"]);
    let text = g.describe(&c);
    assert!(text.contains("b -> a: c/src/b/deep.rs:1: crate::a"), "{text}");
    assert!(text.contains("a -> b: c/src/a.rs:1: crate::b"), "{text}");
}

#[test]
fn grouped_use_trees_give_one_arrow_per_top_level_item() {
    let files = synthetic(&[
        ("c/src/lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;"),
        (
            "c/src/a.rs",
            "use crate::{\n    b::{self, X},\n    c::Y as Z,\n    self as me,\n};\nfn f() { let _ = crate::d::go(); }",
        ),
        ("c/src/c.rs", "pub(crate) use crate::{a::*};"),
    ]);
    let g = graph(&files, "c/src/lib.rs");
    let of = |m: &str| {
        g.edges
            .get(m)
            .map(|e| e.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(of("a"), ["b", "c", "d"]);
    assert_eq!(of("c"), ["a"]);
    assert_eq!(g.cycle(), Some(vec!["a".into(), "c".into(), "a".into()]));
}

#[test]
fn comments_and_strings_are_not_imports() {
    let files = synthetic(&[
        ("c/src/lib.rs", "pub mod a;\npub mod b;\n"),
        ("c/src/a.rs", "use crate::b::X;\n"),
        (
            "c/src/b.rs",
            "/// See [`crate::a::X`].\n// crate::a\n/* crate::a /* nested */ crate::a */\n\
             const S: &str = \"crate::a::X\";\nconst R: &str = r#\"crate::a\"#;\nconst C: char = '\"';\n\
             fn f<'a>(x: &'a str) -> &'a str { x }\n",
        ),
    ]);
    let g = graph(&files, "c/src/lib.rs");
    assert_eq!(g.cycle(), None, "{:?}", g.edges);
    assert!(g.edges.contains_key("a"));
}

/// The check on the real scheduler: putting back the arrow that used to close the loop (the
/// volume rules naming the cluster's decision type) makes it fail, naming both modules.
#[test]
fn putting_a_cycle_back_into_the_scheduler_fails() {
    let mut files = workspace_files();
    let vb = files
        .get_mut("scheduler/src/volume_binding.rs")
        .expect("volume_binding.rs");
    vb.push_str("\nfn knot() -> Option<crate::cluster::Cluster> { None }\n");
    let g = graph(&files, "scheduler/src/lib.rs");
    let c = g.cycle().expect("a cycle");
    assert!(
        c.contains(&"cluster".to_owned()) && c.contains(&"volume_binding".to_owned()),
        "{c:?}"
    );
    assert!(
        g.describe(&c).contains("scheduler/src/volume_binding.rs"),
        "{}",
        g.describe(&c)
    );
}
