//! Imports between sibling modules run one way, in every folder of every crate: following every
//! `crate::`, `super::` and `self::` path, in `use` lines (grouped trees across lines included)
//! and inline in code alike, the children of each module form no cycle. A module that imports a
//! sibling which imports it back is a knot a reader cannot follow top-down; vocabulary types
//! belong in a low module both can import. A child may always use its ancestors' items and a
//! module its own children: those arrows are not between siblings.
//!
//! Comments and string literals are not read: a doc link is no dependency. The DRA module must
//! also stay below the rest of the model: it may not reach the cluster index.
//!
//! The same walk of the module tree checks size: a module of the product's crates with over 600
//! lines of code (test modules aside) says in its first comment why it is one file
//! (`Size (~N lines of code): …`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

/// The crate roots whose module trees are read.
const CRATE_ROOTS: [&str; 6] = [
    "src/lib.rs",
    "topology/src/lib.rs",
    "exporter/src/lib.rs",
    "scheduler/model/src/lib.rs",
    "scheduler/src/lib.rs",
    "tests/lib.rs",
];

/// Lines of code a module may have without saying why it is one file.
const MAX_CODE_LINES: usize = 600;

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

/// A module path below its crate root (`[]` is the root).
type ModPath = Vec<String>;

/// A path as written (`super::engine::dra::ClaimError`), from its first segment, with its line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    segments: Vec<String>,
    line: usize,
}

/// Reads one path tree starting at `t[i]` (an identifier or `{`), below `prefix`; pushes every
/// leaf path and returns the index after the tree.
fn path_tree(
    t: &[(Tok, usize)],
    mut i: usize,
    prefix: Vec<String>,
    line: usize,
    out: &mut Vec<Written>,
) -> usize {
    let mut segments = prefix;
    loop {
        match t.get(i) {
            Some((Tok::Ident(w), _)) => {
                segments.push(w.clone());
                i += 1;
                if t.get(i).map(|x| &x.0) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                out.push(Written { segments, line });
                return i;
            }
            Some((Tok::Open, _)) => {
                i += 1;
                loop {
                    match t.get(i).map(|x| &x.0) {
                        None => return i,
                        Some(Tok::Close) => return i + 1,
                        Some(Tok::Comma) => i += 1,
                        _ => {
                            i = path_tree(t, i, segments.clone(), line, out);
                            // `as name`, or anything else up to the next item.
                            while let Some((tok, _)) = t.get(i) {
                                if matches!(tok, Tok::Comma | Tok::Close) {
                                    break;
                                }
                                i += 1;
                            }
                        }
                    }
                }
            }
            // `*`, or the end of the path.
            _ => {
                out.push(Written { segments, line });
                return i;
            }
        }
    }
}

/// Every `crate::`, `super::` and `self::` path of a file, with the module it is written in:
/// the file's own module `base`, or an inline `mod x { .. }` inside it.
fn relative_paths(src: &str, base: &[String]) -> Vec<(ModPath, Written)> {
    let t = tokens(src);
    let mut out = Vec::new();
    let mut depth = 0usize;
    // Inline modules open here: (name, the depth inside their braces).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < t.len() {
        match &t[i].0 {
            Tok::Open => depth += 1,
            Tok::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Open, _))) = (t.get(i + 1), t.get(i + 2)) {
                    inline.push((name.clone(), depth + 1));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(w)
                if matches!(w.as_str(), "crate" | "super" | "self")
                    && t.get(i + 1).map(|x| &x.0) == Some(&Tok::PathSep)
                    && (i == 0 || t[i - 1].0 != Tok::PathSep) =>
            {
                let mut here: ModPath = base.to_vec();
                here.extend(inline.iter().map(|(n, _)| n.clone()));
                let mut found = Vec::new();
                let next = path_tree(&t, i, Vec::new(), t[i].1, &mut found);
                out.extend(found.into_iter().map(|w| (here.clone(), w)));
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// One module of a crate: its path, its file, and whether it is a test module.
#[derive(Debug, Clone)]
struct Module {
    path: ModPath,
    file: String,
    test_only: bool,
}

/// The file-backed modules a file declares at its top level (`mod x;`, `pub mod x;`), each with
/// whether a `#[cfg(test)]` stands before it.
fn declared_modules(src: &str) -> Vec<(String, bool)> {
    let t = tokens(src);
    let mut depth = 0;
    let mut out = Vec::new();
    for (i, (tok, _)) in t.iter().enumerate() {
        match tok {
            Tok::Open => depth += 1,
            Tok::Close => depth -= 1,
            Tok::Ident(w) if w == "mod" && depth == 0 => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Semi, _))) = (t.get(i + 1), t.get(i + 2)) {
                    let before = &t[i.saturating_sub(12)..i];
                    let test_only = before
                        .windows(3)
                        .any(|w| w[0].0 == Tok::Ident("cfg".into()) && w[2].0 == Tok::Ident("test".into()));
                    out.push((name.clone(), test_only));
                }
            }
            _ => {}
        }
    }
    out
}

/// The module tree of the crate whose root file is `root`, read from `files` (path → source;
/// paths use `/`): `x.rs` or `x/mod.rs` beside a root or `mod.rs`, under `m/` for `m.rs`.
fn module_tree(files: &BTreeMap<String, String>, root: &str) -> Vec<Module> {
    let mut out = Vec::new();
    let mut todo = vec![Module {
        path: Vec::new(),
        file: root.to_owned(),
        test_only: false,
    }];
    while let Some(m) = todo.pop() {
        let Some(src) = files.get(&m.file) else {
            // Declared, but no file was given (synthetic trees): a module without children.
            out.push(m);
            continue;
        };
        let (dir, name) = m.file.rsplit_once('/').unwrap_or(("", m.file.as_str()));
        let children_dir = if m.path.is_empty() || name == "mod.rs" {
            dir.to_owned()
        } else {
            m.file.trim_end_matches(".rs").to_owned()
        };
        for (child, test_only) in declared_modules(src) {
            let flat = format!("{children_dir}/{child}.rs");
            let nested = format!("{children_dir}/{child}/mod.rs");
            let file = if files.contains_key(&flat) { flat } else { nested };
            let mut path = m.path.clone();
            path.push(child);
            todo.push(Module {
                path,
                file,
                test_only: test_only || m.test_only,
            });
        }
        out.push(m);
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Resolves a written path from module `here` to the deepest module it names, with the index
/// of the segment at which it reached each depth on the way.
fn resolve(w: &Written, here: &[String], known: &BTreeSet<ModPath>) -> (ModPath, Vec<(usize, ModPath)>) {
    let mut cur: ModPath = Vec::new();
    let mut trail = Vec::new();
    for (i, seg) in w.segments.iter().enumerate() {
        match seg.as_str() {
            "crate" if i == 0 => cur.clear(),
            "self" if i == 0 => cur = here.to_vec(),
            "super" => {
                if i == 0 {
                    cur = here.to_vec();
                }
                cur.pop();
            }
            // `self` inside a group names the group's prefix.
            "self" => {}
            _ => {
                let mut next = cur.clone();
                next.push(seg.clone());
                if !known.contains(&next) {
                    break;
                }
                cur = next;
            }
        }
        trail.push((i, cur.clone()));
    }
    (cur, trail)
}

/// The children of one module and the arrows between them, each with where it was seen.
#[derive(Debug, Default)]
struct Graph {
    modules: BTreeSet<String>,
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

/// Every module's graph of its children, keyed by the module's path.
fn graphs(files: &BTreeMap<String, String>, root: &str) -> BTreeMap<ModPath, Graph> {
    let tree = module_tree(files, root);
    let known: BTreeSet<ModPath> = tree.iter().map(|m| m.path.clone()).collect();
    let mut out: BTreeMap<ModPath, Graph> = BTreeMap::new();
    for m in &tree {
        if let Some((last, parent)) = m.path.split_last() {
            out.entry(parent.to_vec())
                .or_default()
                .modules
                .insert(last.clone());
        }
    }
    for m in &tree {
        let Some(src) = files.get(&m.file) else {
            continue;
        };
        for (here, w) in relative_paths(src, &m.path) {
            let (target, trail) = resolve(&w, &here, &known);
            let k = m.path.iter().zip(&target).take_while(|(a, b)| a == b).count();
            // The target is this module, an ancestor or a descendant: no arrow between siblings.
            if k == m.path.len() || k == target.len() {
                continue;
            }
            let level = m.path[..k].to_vec();
            let (from, to) = (m.path[k].clone(), target[k].clone());
            let upto = trail
                .iter()
                .find(|(_, p)| p.len() > k && p[..=k] == target[..=k])
                .map_or(w.segments.len() - 1, |(i, _)| *i);
            let shown = w.segments[..=upto].join("::");
            out.entry(level)
                .or_default()
                .edges
                .entry(from)
                .or_default()
                .entry(to)
                .or_insert_with(|| format!("{}:{}: {shown}", m.file, w.line));
        }
    }
    out
}

/// The graph of the crate root's top-level modules.
fn graph(files: &BTreeMap<String, String>, root: &str) -> Graph {
    graphs(files, root).remove(&Vec::new()).unwrap_or_default()
}

/// Every cycle found, one per folder that has one, named with the folder and its arrows.
fn cycles(files: &BTreeMap<String, String>, root: &str) -> Vec<String> {
    graphs(files, root)
        .iter()
        .filter_map(|(level, g)| {
            g.cycle().map(|c| {
                let at = if level.is_empty() {
                    "crate root".to_owned()
                } else {
                    level.join("::")
                };
                format!("{root}: in {at}: import cycle {}", g.describe(&c))
            })
        })
        .collect()
}

/// Lines of code: neither blank nor a `//` comment, and outside `#[cfg(test)] mod x { .. }`.
fn code_lines(src: &str) -> usize {
    let lines: Vec<&str> = src.lines().collect();
    let mut n = 0;
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        let next = lines.get(i + 1).map_or("", |s| s.trim());
        let inline_test =
            l == "#[cfg(test)]" && next.ends_with('{') && next.split_whitespace().any(|w| w == "mod");
        if inline_test {
            // Skip to the line that closes the module (braces counted outside comments is
            // enough for test modules, which hold no brace in a string at line level).
            let mut depth = 0i64;
            i += 1;
            while i < lines.len() {
                depth += lines[i].matches('{').count() as i64 - lines[i].matches('}').count() as i64;
                i += 1;
                if depth <= 0 {
                    break;
                }
            }
            continue;
        }
        if !l.is_empty() && !l.starts_with("//") {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The first comment block says why the module is one file.
fn says_why_it_is_whole(src: &str) -> bool {
    src.lines()
        .take_while(|l| l.trim_start().starts_with("//!") || l.trim().is_empty())
        .any(|l| l.contains("Size (~") && l.contains("lines of code"))
}

/// Modules of over [`MAX_CODE_LINES`] that do not say why, with their size.
fn oversized(files: &BTreeMap<String, String>, root: &str) -> Vec<String> {
    module_tree(files, root)
        .into_iter()
        .filter(|m| !m.test_only)
        .filter_map(|m| {
            let src = files.get(&m.file)?;
            let n = code_lines(src);
            (n > MAX_CODE_LINES && !says_why_it_is_whole(src)).then(|| {
                format!(
                    "{}: {n} lines of code and no `Size (~{n} lines of code): why` in its first comment",
                    m.file
                )
            })
        })
        .collect()
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
    for dir in [
        "src",
        "topology/src",
        "exporter/src",
        "scheduler/model/src",
        "scheduler/src",
        "tests",
    ] {
        walk(&base.join(dir), &base, &mut out);
    }
    out
}

fn synthetic(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, s)| ((*p).to_owned(), (*s).to_owned()))
        .collect()
}

#[test]
fn no_folder_of_any_crate_has_an_import_cycle_at_any_depth() {
    let files = workspace_files();
    let mut failures = Vec::new();
    for root in CRATE_ROOTS {
        assert!(files.contains_key(root), "crate root {root} not found");
        let all = graphs(&files, root);
        assert!(
            all.get(&Vec::new()).is_some_and(|g| !g.modules.is_empty()),
            "{root}: no modules read"
        );
        failures.extend(cycles(&files, root));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn nested_folders_of_the_model_and_the_front_ends_are_read() {
    let files = workspace_files();
    let model = graphs(&files, "scheduler/model/src/lib.rs");
    let dra = model.get(&vec!["dra".to_owned()]).expect("the dra folder");
    assert!(
        dra.modules.contains("numa") && dra.modules.contains("state"),
        "{:?}",
        dra.modules
    );
    let has = |g: &Graph, a: &str, b: &str| g.edges.get(a).is_some_and(|e| e.contains_key(b));
    // `use super::{.., state::{..}, verdict::..}` in dra/numa.rs, over several lines.
    assert!(has(dra, "numa", "state"), "{:?}", dra.edges);
    assert!(has(dra, "state", "verdict"), "{:?}", dra.edges);
    let cel = model
        .get(&vec!["dra".to_owned(), "cel".to_owned()])
        .expect("the dra/cel folder");
    assert!(cel.modules.contains("check") && cel.modules.contains("values"));
    let front = graphs(&files, "scheduler/src/lib.rs");
    let live = front.get(&vec!["live".to_owned()]).expect("the live folder");
    // `crate::live::api::{..}` from live/engine/dra/prebind.rs, three folders down.
    assert!(has(live, "engine", "api"), "{:?}", live.edges);
    assert!(has(live, "api", "claim_error"), "{:?}", live.edges);
}

#[test]
fn the_model_graph_is_read_from_use_lines_groups_and_inline_paths() {
    let g = graph(&workspace_files(), "scheduler/model/src/lib.rs");
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
    let g = graph(&workspace_files(), "scheduler/model/src/lib.rs");
    let reached = g.reachable("dra");
    for above in ["cluster", "preempt", "gates", "queue"] {
        assert!(!reached.contains(above), "dra reaches {above}: {reached:?}");
    }
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

/// Two folders down, siblings that name each other through `super::` (in a group over several
/// lines) and `self::super::`-free `crate::` paths make a cycle the check finds and names.
#[test]
fn a_cycle_two_folders_down_is_found_and_named() {
    let files = synthetic(&[
        ("c/src/lib.rs", "pub mod a;\n"),
        ("c/src/a/mod.rs", "pub mod b;\n"),
        ("c/src/a/b/mod.rs", "mod x;\nmod y;\nmod z;\nuse self::x::T;\n"),
        (
            "c/src/a/b/x.rs",
            "use super::{\n    y::{\n        U,\n    },\n};\npub struct T;\n",
        ),
        ("c/src/a/b/y.rs", "pub struct U(crate::a::b::z::V);\n"),
        ("c/src/a/b/z.rs", "pub struct V(Box<super::x::T>);\n"),
    ]);
    let found = cycles(&files, "c/src/lib.rs");
    assert_eq!(found.len(), 1, "{found:?}");
    let text = &found[0];
    assert!(text.contains("in a::b: import cycle x -> y -> z -> x"), "{text}");
    assert!(text.contains("x -> y: c/src/a/b/x.rs:1: super::y"), "{text}");
    assert!(
        text.contains("y -> z: c/src/a/b/y.rs:1: crate::a::b::z"),
        "{text}"
    );
    assert!(text.contains("z -> x: c/src/a/b/z.rs:1: super::x"), "{text}");
    // The folder's own `use self::x::T` and the children's `super::` items are no arrows
    // between siblings, and the crate root has no cycle of its own.
    assert!(
        !graphs(&files, "c/src/lib.rs")[&vec!["a".to_owned()]]
            .edges
            .contains_key("b")
    );
}

/// `super::super::` crosses a folder: the arrow is between the two folders' children at the
/// level where the paths part, and an inline `mod tests` shifts what `super` means.
#[test]
fn super_super_and_inline_modules_resolve_where_they_are_written() {
    let files = synthetic(&[
        ("c/src/lib.rs", "pub mod a;\n"),
        ("c/src/a/mod.rs", "pub mod b;\npub mod c;\n"),
        ("c/src/a/b/mod.rs", "pub mod x;\n"),
        (
            "c/src/a/b/x.rs",
            "fn f() -> super::super::c::Z { todo!() }\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::super::c::W;\n}\n",
        ),
        (
            "c/src/a/c.rs",
            "pub struct Z;\npub struct W;\nfn g() -> Option<super::b::x::Q> { None }\n",
        ),
    ]);
    let all = graphs(&files, "c/src/lib.rs");
    let a = &all[&vec!["a".to_owned()]];
    assert_eq!(
        a.edges.get("b").map(|e| e.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["c".to_owned()])
    );
    assert!(
        a.edges["b"]["c"].starts_with("c/src/a/b/x.rs:1: super::super::c"),
        "{:?}",
        a.edges
    );
    let found = cycles(&files, "c/src/lib.rs");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("in a: import cycle b -> c -> b"),
        "{}",
        found[0]
    );
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
             fn f<'a>(x: &'a str) -> &'a str { x }\npub(super) fn g() {}\npub(in crate::b) fn h() {}\n",
        ),
    ]);
    let g = graph(&files, "c/src/lib.rs");
    assert_eq!(g.cycle(), None, "{:?}", g.edges);
    assert!(g.edges.contains_key("a"));
}

/// The check on the real model: putting back the arrow that used to close the loop (the volume
/// rules naming the cluster's decision type) makes it fail, naming both modules.
#[test]
fn putting_a_cycle_back_into_the_model_fails() {
    let mut files = workspace_files();
    let vb = files
        .get_mut("scheduler/model/src/volume_binding.rs")
        .expect("volume_binding.rs");
    vb.push_str("\nfn knot() -> Option<crate::cluster::Cluster> { None }\n");
    let g = graph(&files, "scheduler/model/src/lib.rs");
    let c = g.cycle().expect("a cycle");
    assert!(
        c.contains(&"cluster".to_owned()) && c.contains(&"volume_binding".to_owned()),
        "{c:?}"
    );
    assert!(
        g.describe(&c).contains("scheduler/model/src/volume_binding.rs"),
        "{}",
        g.describe(&c)
    );
}

/// The knots that sat inside folders: the alignment verdict naming the allocation state back,
/// and the Binding's writer naming the engine's claim errors back, are found when put back.
#[test]
fn putting_back_the_knots_inside_folders_fails() {
    let mut files = workspace_files();
    files
        .get_mut("scheduler/model/src/dra/verdict.rs")
        .expect("dra/verdict.rs")
        .push_str("\nfn knot(_: &super::state::DraState) {}\n");
    let found = cycles(&files, "scheduler/model/src/lib.rs");
    assert!(
        found
            .iter()
            .any(|c| c.contains("in dra: import cycle") && c.contains("dra/verdict.rs")),
        "{found:?}"
    );
    let mut files = workspace_files();
    files
        .get_mut("scheduler/src/live/api.rs")
        .expect("live/api.rs")
        .push_str("\nfn knot(_: super::engine::dra::ClaimWrite) {}\n");
    let found = cycles(&files, "scheduler/src/lib.rs");
    assert!(
        found
            .iter()
            .any(|c| c.contains("in live: import cycle") && c.contains("super::engine")),
        "{found:?}"
    );
}

#[test]
fn no_module_over_600_lines_of_code_lacks_a_reason() {
    let files = workspace_files();
    // The product's crates; the end-to-end harness (tests/) is test support, not product code.
    let failures: Vec<String> = CRATE_ROOTS
        .iter()
        .filter(|r| !r.starts_with("tests/"))
        .flat_map(|r| oversized(&files, r))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_size_rule_counts_code_and_reads_the_first_comment() {
    let body: String = (0..601).map(|i| format!("const C{i}: u8 = 0;\n")).collect();
    let tests = "#[cfg(test)]\nmod tests {\n    fn f() {\n        let _ = 1;\n    }\n}\n";
    let short: String = (0..590)
        .map(|i| format!("const C{i}: u8 = 0;\n// note\n\n"))
        .collect();
    let files = synthetic(&[
        (
            "c/src/lib.rs",
            "mod big;\nmod why;\nmod short;\n#[cfg(test)]\nmod tests;\n",
        ),
        ("c/src/big.rs", &format!("//! Big.\n{body}")),
        (
            "c/src/why.rs",
            &format!("//! Big.\n//!\n//! Size (~601 lines of code): one table.\n{body}"),
        ),
        ("c/src/short.rs", &format!("{short}{tests}")),
        ("c/src/tests.rs", &body),
    ]);
    assert_eq!(code_lines(&files["c/src/short.rs"]), 590);
    let found = oversized(&files, "c/src/lib.rs");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("c/src/big.rs: 601 lines of code"),
        "{found:?}"
    );
}
