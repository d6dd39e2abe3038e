//! The shape of the source tree, checked: imports run one way (no module reaches, through
//! `crate::`, `super::` or `self::` paths, a module that reaches back to it), no file of src/
//! is over 800 lines, and every public item says in a doc comment what it is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a file of src/ may have.
const MAX_FILE_LINES: usize = 800;

/// A module of the library's source (its path below `crate`, `ipam::engine::plan`, is its key).
struct Module {
    text: String,
}

fn source_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {dir:?}: {e}"));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("reading {dir:?}: {e}"))
            .path();
        if path.is_dir() {
            source_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The library's modules (the binaries' own files are not part of it).
fn modules() -> BTreeMap<String, Module> {
    let root = src();
    let mut files = Vec::new();
    source_files(&root, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let relative = file
            .strip_prefix(&root)
            .expect("below src")
            .with_extension("");
        let mut parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.first().is_some_and(|p| p == "bin" || p == "main") {
            continue;
        }
        if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
            parts.pop();
        }
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        modules.insert(parts.join("::"), Module { text });
    }
    modules
}

/// `text` without its comments (line comments and doc comments: a doc link is no import).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths `code` names from the crate's root, with `super::` and `self::` made absolute
/// for the module `module`, and `use crate::a::{b, c::d}` read as `a::b` and `a::c`.
fn crate_paths(module: &str, code: &str) -> Vec<String> {
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let absolute = |prefix: &str| match prefix {
        "" => "crate::".to_string(),
        p => format!("crate::{p}::"),
    };
    let code = code
        .replace("super::", &absolute(parent))
        .replace("self::", &absolute(module));
    let mut paths = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let path: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let path = path.trim_end_matches(':').to_string();
        let after = &rest[path.len()..];
        if let Some(group) = after
            .strip_prefix("::{")
            .or_else(|| after.strip_prefix('{'))
        {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let head = item.trim().split("::").next().unwrap_or_default();
                if !head.is_empty() && head != "self" {
                    paths.push(format!("{path}::{head}"));
                }
            }
        }
        paths.push(path);
    }
    paths
}

/// The module a path names: its longest prefix that is a module.
fn module_of<'a>(path: &str, modules: &'a BTreeMap<String, Module>) -> Option<&'a str> {
    let mut path = path;
    loop {
        if let Some((name, _)) = modules.get_key_value(path) {
            return Some(name);
        }
        path = path.rsplit_once("::")?.0;
    }
}

/// Which modules each module imports from.
fn imports(modules: &BTreeMap<String, Module>) -> BTreeMap<&str, BTreeSet<&str>> {
    modules
        .iter()
        .map(|(name, module)| {
            let targets = crate_paths(name, &code_of(&module.text))
                .iter()
                .filter_map(|path| module_of(path, modules))
                .filter(|target| target != name)
                .collect();
            (name.as_str(), targets)
        })
        .collect()
}

/// The groups of modules that import each other, round a circle (Tarjan's components of more
/// than one module).
fn circles<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct Walk<'g, 'a> {
        graph: &'g BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<&'a str>>,
    }
    impl<'a> Walk<'_, 'a> {
        fn visit(&mut self, node: &'a str) {
            let at = self.index.len();
            self.index.insert(node, at);
            self.low.insert(node, at);
            self.stack.push(node);
            for &next in self.graph.get(node).into_iter().flatten() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for &node in graph.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.found
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let modules = modules();
    assert!(modules.len() > 50, "the library's modules are read");
    let graph = imports(&modules);
    // The engine imports the ledger, the ledger does not import the engine.
    assert!(graph["ipam::engine::reserve"].contains("ipam::ledger"));
    let found = circles(&graph);
    assert!(found.is_empty(), "import circles: {found:?}");
}

#[test]
fn a_circle_is_found_where_there_is_one() {
    let graph: BTreeMap<&str, BTreeSet<&str>> = [
        ("a", BTreeSet::from(["b"])),
        ("b", BTreeSet::from(["c"])),
        ("c", BTreeSet::from(["a"])),
        ("d", BTreeSet::from(["a"])),
    ]
    .into_iter()
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
    let paths = crate_paths(
        "x::y",
        "use super::z::{A, w::B};\nuse crate::q::R; // crate::no",
    );
    assert!(paths.contains(&"x::z::w".to_string()), "{paths:?}");
    assert!(paths.contains(&"q::R".to_string()), "{paths:?}");
    assert!(!code_of("let a = 1; // crate::no").contains("crate::"));
}

#[test]
fn no_file_of_src_is_over_800_lines() {
    let mut files = Vec::new();
    source_files(&src(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(file).ok()?.lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines: {long:?}"
    );
}

/// Whether `line` declares a public item (not a field, variant or re-export).
fn declares_public_item(line: &str) -> bool {
    let line = line.trim_start();
    let Some(rest) = line
        .strip_prefix("pub ")
        .or_else(|| line.strip_prefix("pub(crate) "))
    else {
        return false;
    };
    // Qualifiers before the item's keyword (`pub async fn`, `pub const unsafe fn`).
    let mut rest = rest;
    for qualifier in ["const fn ", "async ", "unsafe "] {
        if let Some(stripped) = rest.strip_prefix(qualifier) {
            rest = if qualifier == "const fn " {
                "fn "
            } else {
                stripped
            };
        }
    }
    let item = rest.split_whitespace().next().unwrap_or_default();
    let declared = matches!(
        item,
        "fn" | "struct" | "enum" | "trait" | "const" | "type" | "static" | "mod"
    );
    // `pub mod x;` is documented by the module's own `//!` lines.
    declared && !(item == "mod" && rest.trim_end().ends_with(';'))
}

/// Whether the item declared at `lines[at]` has a doc comment above its attributes.
fn documented(lines: &[&str], at: usize) -> bool {
    let mut above = at;
    while above > 0 {
        above -= 1;
        let line = lines[above].trim();
        let attribute = line.starts_with("#[") || line.starts_with(')') || line.ends_with(")]");
        let plain_comment = line.starts_with("//") && !line.starts_with("///");
        if attribute || plain_comment {
            continue;
        }
        return line.starts_with("///") || line.starts_with("#[doc");
    }
    false
}

#[test]
fn every_public_item_has_a_doc_comment() {
    let mut files = Vec::new();
    source_files(&src(), &mut files);
    let mut undocumented = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let lines: Vec<&str> = text.lines().collect();
        if !text.trim_start().starts_with("//!") {
            undocumented.push(format!("{}: no //! line", file.display()));
        }
        for (at, line) in lines.iter().enumerate() {
            if declares_public_item(line) && !documented(&lines, at) {
                undocumented.push(format!("{}:{}: {}", file.display(), at + 1, line.trim()));
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "{} public items without a doc comment:\n{}",
        undocumented.len(),
        undocumented.join("\n")
    );
}
