//! The layout of both crates, read from their sources: no module imports a module that imports
//! it back, however far round, and none imports from a layer above its own. A reference is any
//! `crate::` path (`host::` in `main.rs`), a `super::` path, or a `use` of a child module, in
//! code or in a doc link; test modules are left out. No host module keeps a request's facts
//! beside the path: no `thread_local!`, and no static but the process-wide ones listed here.
//!
//! Run alone: `cargo test -p host --test architecture`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The host's layers, top down: a module may import from its own layer and those below it.
const HOST_LAYERS: &[&[&str]] = &[
    &["main"],
    &["config"],
    &["edge"],
    &["runtime"],
    &["interfaces"],
    &["user_store"],
    &["observability"],
    &["error", "machine"],
];

/// The guest's layers, top down: the wasm glue at the edge, its pure logic beneath.
const GUEST_LAYERS: &[&[&str]] = &[
    &["wasm"],
    &["api"],
    &["routes", "validation", "response", "ports"],
    &["error", "fibonacci"],
    &["limits"],
];

/// The host's statics, by module and name, each with why it is the process's and no request's.
const HOST_STATICS: &[(&str, &str, &str)] = &[
    ("main", "ALLOCATOR", "the global allocator"),
    (
        "observability::request_report",
        "TRACER",
        "the tracer, set once at start-up",
    ),
    (
        "observability::pipeline",
        "GUEST_SPANS",
        "the span exporter's processor, set once at start-up",
    ),
    (
        "runtime::page_scan",
        "PAGEMAP",
        "the process's pagemap file, opened once",
    ),
];

/// A crate's modules, each with the modules it references.
type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn the_hosts_modules_import_each_other_in_no_circle() {
    assert_no_circle(&graph("host"));
}

#[test]
fn the_guests_modules_import_each_other_in_no_circle() {
    assert_no_circle(&graph("guest"));
}

#[test]
fn no_host_module_imports_from_a_layer_above_its_own() {
    assert_layered(&graph("host"), HOST_LAYERS);
}

#[test]
fn no_guest_module_imports_from_a_layer_above_its_own() {
    assert_layered(&graph("guest"), GUEST_LAYERS);
}

#[test]
fn no_host_module_keeps_a_thread_local() {
    let keeping: Vec<String> = sources(&crate_root("host"))
        .into_iter()
        .filter(|(_, path)| outside_tests(path).contains("thread_local!"))
        .map(|(module, _)| module)
        .collect();
    assert!(keeping.is_empty(), "thread-locals in {keeping:?}");
}

#[test]
fn the_hosts_only_statics_are_the_listed_process_wide_ones() {
    let mut found = Vec::new();
    for (module, path) in sources(&crate_root("host")) {
        for name in statics(&outside_tests(&path)) {
            found.push((module.clone(), name));
        }
    }
    let unlisted: Vec<_> = found
        .iter()
        .filter(|(module, name)| {
            !HOST_STATICS
                .iter()
                .any(|(listed, static_name, _)| listed == module && static_name == name)
        })
        .collect();
    assert!(unlisted.is_empty(), "statics not listed: {unlisted:?}");
    assert_eq!(found.len(), HOST_STATICS.len(), "a listed static is gone");
}

#[test]
fn the_reader_sees_a_static_and_leaves_a_static_lifetime() {
    let text =
        "static A: u8 = 0;\n    pub(crate) static mut B: u8 = 0;\nfn f(x: &'static str) {}\n";
    assert_eq!(statics(text), ["A", "B"]);
}

#[test]
fn the_reader_sees_a_circle_and_an_import_from_above() {
    let circle = Graph::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert!(circles(&circle).iter().any(|circle| circle.len() == 2));
    let upward = Graph::from([("low".to_string(), BTreeSet::from(["high".to_string()]))]);
    let layers: &[&[&str]] = &[&["high"], &["low"]];
    assert_eq!(imports_from_above(&upward, layers).len(), 1);
    let references = references(
        "use crate::a::{b::C, d::{self, E}};\nuse super::e;\n/// [`crate::f::G`]\n\
         use crate::{g::H, i};\n",
        "x::y",
        &BTreeSet::from(["a", "a::b", "a::d", "x", "x::e", "f", "g", "i"].map(String::from)),
        &[],
    );
    assert_eq!(
        references,
        BTreeSet::from(["a::b", "a::d", "x::e", "f", "g", "i"].map(String::from))
    );
}

fn assert_no_circle(graph: &Graph) {
    let circles = circles(graph);
    assert!(
        circles.is_empty(),
        "modules that import each other: {circles:?}"
    );
}

fn assert_layered(graph: &Graph, layers: &[&[&str]]) {
    let unplaced: Vec<&String> = graph
        .keys()
        .filter(|module| layer(module, layers).is_none())
        .collect();
    assert!(unplaced.is_empty(), "modules in no layer: {unplaced:?}");
    let upward = imports_from_above(graph, layers);
    assert!(upward.is_empty(), "imports from a layer above: {upward:?}");
}

/// The index of the layer `module`'s top-level module is in.
fn layer(module: &str, layers: &[&[&str]]) -> Option<usize> {
    let top = module.split("::").next().unwrap_or_default();
    layers.iter().position(|layer| layer.contains(&top))
}

/// Every reference from a module to one in a higher layer, as `from -> to`.
fn imports_from_above(graph: &Graph, layers: &[&[&str]]) -> Vec<String> {
    let mut upward = Vec::new();
    for (from, targets) in graph {
        for to in targets {
            if let (Some(own), Some(target)) = (layer(from, layers), layer(to, layers))
                && target < own
            {
                upward.push(format!("{from} -> {to}"));
            }
        }
    }
    upward
}

/// The strongly connected groups of more than one module (Tarjan's algorithm).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, module: &'a str) {
            let index = self.index.len();
            self.index.insert(module, index);
            self.low.insert(module, index);
            self.stack.push(module);
            self.on_stack.insert(module);
            for target in self.graph.get(module).into_iter().flatten() {
                let target = target.as_str();
                if !self.index.contains_key(target) {
                    self.visit(target);
                    let low = self.low[module].min(self.low[target]);
                    self.low.insert(module, low);
                } else if self.on_stack.contains(target) {
                    let low = self.low[module].min(self.index[target]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut group = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    group.push(member.to_string());
                    if member == module {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for module in graph.keys() {
        if !walk.index.contains_key(module.as_str()) {
            walk.visit(module);
        }
    }
    walk.found
}

/// The module graph of the workspace crate `name`, its test modules left out.
fn graph(name: &str) -> Graph {
    let files = sources(&crate_root(name));
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, path) in &files {
        if module.is_empty() {
            // The crate root only declares the modules.
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        let children = children(&modules, module);
        let mut targets = references(code, module, &modules, &children);
        targets.remove(module);
        targets.remove("");
        graph.insert(module.clone(), targets);
    }
    graph
}

/// The crate's source files by module path (`runtime::guest`; the crate root is `""`, a
/// binary's root `main`), leaving out modules declared only for tests.
fn sources(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut files = BTreeMap::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let relative = path.strip_prefix(src).unwrap().with_extension("");
                let mut segments: Vec<String> = relative
                    .iter()
                    .map(|segment| segment.to_string_lossy().into_owned())
                    .collect();
                if matches!(segments.last().map(String::as_str), Some("mod" | "lib")) {
                    segments.pop();
                }
                files.insert(segments.join("::"), path);
            }
        }
    }
    let test_only: Vec<String> = files
        .keys()
        .filter(|module| declared_for_tests_only(&files, module))
        .cloned()
        .collect();
    for module in test_only {
        files.remove(&module);
    }
    files
}

/// Whether `module`'s parent declares it under `#[cfg(test)]`.
fn declared_for_tests_only(files: &BTreeMap<String, PathBuf>, module: &str) -> bool {
    let (parent, name) = module.rsplit_once("::").unwrap_or(("", module));
    let Some(parent) = files.get(parent) else {
        return false;
    };
    let text = std::fs::read_to_string(parent).unwrap();
    text.contains(&format!("#[cfg(test)]\nmod {name};"))
}

/// The modules directly inside `module`.
fn children(modules: &BTreeSet<String>, module: &str) -> Vec<String> {
    modules
        .iter()
        .filter(|candidate| {
            let parent = candidate.rsplit_once("::").map_or("", |(parent, _)| parent);
            parent == module && *candidate != module && !candidate.is_empty()
        })
        .map(|child| child.rsplit("::").next().unwrap_or_default().to_string())
        .collect()
}

/// The modules `code`, the text of `module`, references.
fn references(
    code: &str,
    module: &str,
    modules: &BTreeSet<String>,
    children: &[String],
) -> BTreeSet<String> {
    let parent = module.rsplit_once("::").map_or("", |(parent, _)| parent);
    let mut found = BTreeSet::new();
    let roots: Vec<(String, &str)> = vec![
        ("crate::".to_string(), ""),
        ("super::".to_string(), parent),
        // A binary names its library by the crate's name.
        (
            "host::".to_string(),
            if module == "main" { "" } else { "\u{0}" },
        ),
    ];
    for (prefix, base) in &roots {
        if base.starts_with('\u{0}') {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find(prefix.as_str()) {
            let preceded_by_word = rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            rest = &rest[at + prefix.len()..];
            if preceded_by_word {
                continue;
            }
            for path in paths(rest) {
                let full = if base.is_empty() {
                    path
                } else {
                    format!("{base}::{path}")
                };
                if let Some(target) = longest_module(&full, modules) {
                    found.insert(target);
                }
            }
        }
    }
    for line in code.lines() {
        let line = line.trim_start();
        let Some(used) = line
            .strip_prefix("pub use ")
            .or_else(|| line.strip_prefix("use "))
        else {
            continue;
        };
        let first = used.split("::").next().unwrap_or_default();
        if children.iter().any(|child| child == first) {
            let own = if module.is_empty() {
                String::new()
            } else {
                format!("{module}::")
            };
            for path in paths(used) {
                if let Some(target) = longest_module(&format!("{own}{path}"), modules) {
                    found.insert(target);
                }
            }
        }
    }
    found
}

/// The paths written at the start of `text`: `a::b::C` is one, `a::{b::C, d::{e, f}}` three,
/// `{a, b}` two; `self` in a group is the group's own path.
fn paths(text: &str) -> Vec<String> {
    let is_path = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let head: String = text.chars().take_while(|c| is_path(*c)).collect();
    let rest = &text[head.len()..];
    let head = head.trim_end_matches(':').to_string();
    if !rest.starts_with('{') || !(head.is_empty() || text[head.len()..].starts_with("::{")) {
        return vec![head];
    }
    // The group up to its matching brace, split at its own commas.
    let mut depth = 0;
    let mut items = vec![String::new()];
    for c in rest.chars() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        items.last_mut().expect("one item at least").push(c);
    }
    items
        .iter()
        .map(|item| item.trim())
        .filter(|item| !item.is_empty())
        .flat_map(paths)
        .map(|path| match (head.is_empty(), path.as_str()) {
            (_, "self") | (false, "") => head.clone(),
            (true, _) => path,
            (false, _) => format!("{head}::{path}"),
        })
        .collect()
}

/// The longest prefix of `path` that is one of `modules`.
fn longest_module(path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let segments: Vec<&str> = path.split("::").collect();
    (1..=segments.len())
        .rev()
        .map(|length| segments[..length].join("::"))
        .find(|prefix| modules.contains(prefix))
}

/// The `src` folder of a workspace crate.
fn crate_root(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

/// A source file's text before its test module.
fn outside_tests(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    match text.find("#[cfg(test)]\nmod ") {
        Some(tests) => text[..tests].to_string(),
        None => text,
    }
}

/// The names of the statics `text` declares, at any depth.
fn statics(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = match line.strip_prefix("pub") {
                Some(rest) if rest.starts_with('(') => rest.split_once(')')?.1.trim_start(),
                Some(rest) => rest.trim_start(),
                None => line,
            };
            let rest = line.strip_prefix("static ")?;
            let rest = rest.strip_prefix("mut ").unwrap_or(rest);
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}
