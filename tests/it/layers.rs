//! The house's layers, checked from the source: every `crate::`, `super::`, `self::`
//! and child-module path in the library's files (tests left out) must point to a
//! lower layer or inside its own, no circle may run among the files, and no file
//! may grow past 800 lines.
//!
//! ARCHITECTURE.md draws the same order; a change to one is a change to both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The library's top-level modules, lowest first: each may name only those before it.
/// `client` (the CLI's own NATS client) stands apart and names none of them.
const LAYERS: &[&str] = &[
    "client", "clock", "sealing", "store", "follow", "config", "metrics", "cluster", "tenancy",
    "schemas", "plugins", "streams", "groups", "tables", "broker", "publish", "api", "session",
    "server",
];

/// One library file: its module path (`["broker", "groups"]` for
/// `src/broker/groups/mod.rs`) and its code with comments, strings and test modules
/// taken out.
struct SourceFile {
    module: Vec<String>,
    code: String,
}

#[test]
fn imports_point_downward_only() {
    let files = library_files();
    let mut wrong = Vec::new();
    for (path, file) in &files {
        let own = &file.module[0];
        let Some(rank) = LAYERS.iter().position(|layer| layer == own) else {
            wrong.push(format!("{path}: `{own}` is not in the test's LAYERS"));
            continue;
        };
        for target in references(file, &files) {
            let top = &files[&target].module[0];
            if top == own {
                continue;
            }
            let below = LAYERS[..rank].contains(&top.as_str());
            if !below {
                wrong.push(format!(
                    "{path} ({own}) names {target} ({top}), not below it"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that do not point down:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_circle_runs_among_the_files() {
    let files = library_files();
    let edges: BTreeMap<&str, BTreeSet<String>> = files
        .iter()
        .map(|(path, file)| (path.as_str(), references(file, &files)))
        .collect();
    let circles = strongly_connected(&edges);
    assert!(
        circles.is_empty(),
        "files that name each other in a circle (a module's own mod.rs may name what is \
         inside it; nothing else may lead back):\n{}",
        circles
            .iter()
            .map(|circle| circle.join(" -> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Most lines a library file may hold (tests apart): a file past it holds more than
/// one room's work.
const MAX_FILE_LINES: usize = 800;

#[test]
fn no_library_file_is_over_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    crate::common::rust_files(&root, &mut paths);
    let mut long = Vec::new();
    for path in paths {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name == "tests.rs" || path.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let lines = std::fs::read_to_string(&path)
            .expect("readable")
            .lines()
            .count();
        if lines > MAX_FILE_LINES {
            long.push(format!("{} ({lines} lines)", path.display()));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The checker itself finds a back edge and a circle, so the two tests above can fail.
#[test]
fn the_checker_sees_a_back_edge_and_a_circle() {
    let file = |module: &[&str], code: &str| SourceFile {
        module: module.iter().map(|m| m.to_string()).collect(),
        code: strip(code),
    };
    let files: BTreeMap<String, SourceFile> = [
        (
            "src/store/mod.rs",
            file(&["store"], "use crate::broker::Broker; // crate::api"),
        ),
        (
            "src/broker/mod.rs",
            file(&["broker"], "pub fn f() { super::store::Store::x() }"),
        ),
        (
            "src/broker/a.rs",
            file(
                &["broker", "a"],
                "use super::b::B; fn t() { \"crate::api\" }",
            ),
        ),
        (
            "src/broker/b.rs",
            file(&["broker", "b"], "use crate::broker::{a::{A}, X};"),
        ),
    ]
    .into_iter()
    .map(|(path, file)| (path.to_string(), file))
    .collect();
    let store = references(&files["src/store/mod.rs"], &files);
    assert_eq!(store, BTreeSet::from(["src/broker/mod.rs".to_string()]));
    let a = references(&files["src/broker/a.rs"], &files);
    assert_eq!(a, BTreeSet::from(["src/broker/b.rs".to_string()]));
    let b = references(&files["src/broker/b.rs"], &files);
    let expected = ["src/broker/a.rs", "src/broker/mod.rs"].map(String::from);
    assert_eq!(b, BTreeSet::from(expected));
    let edges: BTreeMap<&str, BTreeSet<String>> = files
        .iter()
        .map(|(path, file)| (path.as_str(), references(file, &files)))
        .collect();
    let circles = strongly_connected(&edges);
    assert_eq!(circles.len(), 2, "{circles:?}");
}

/// Every file of the library crate under `src/`, without the binary (`main.rs`,
/// `cli/`) and without test files.
fn library_files() -> BTreeMap<String, SourceFile> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    crate::common::rust_files(&root, &mut paths);
    let mut files = BTreeMap::new();
    for path in paths {
        let relative = path.strip_prefix(&root).expect("under src");
        let parts: Vec<String> = relative
            .iter()
            .map(|part| part.to_string_lossy().into_owned())
            .collect();
        let first = parts[0].as_str();
        let name = parts.last().expect("a file name").as_str();
        if matches!(first, "main.rs" | "lib.rs" | "cli")
            || name == "tests.rs"
            || parts.iter().any(|part| part == "tests")
        {
            continue;
        }
        let mut module: Vec<String> = parts.clone();
        let last = module.pop().expect("a file name");
        if last != "mod.rs" {
            module.push(last.trim_end_matches(".rs").to_string());
        }
        let source = std::fs::read_to_string(&path).expect("readable source");
        let display = format!("src/{}", parts.join("/"));
        files.insert(
            display,
            SourceFile {
                module,
                code: strip(&source),
            },
        );
    }
    assert!(files.len() > 50, "found only {} library files", files.len());
    files
}

/// The code without comments, string and char literals, and `#[cfg(test)]` items.
fn strip(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |end| end + 2);
        } else if rest.starts_with("#[cfg(test)]") {
            i += skip_item(rest);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|&c| c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let open = 2 + hashes;
            i += rest[open..]
                .find(&close)
                .map_or(rest.len(), |end| open + end + close.len());
            out.push_str("\"\"");
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if bytes[i] == b'\'' && char_literal_len(rest) > 0 {
            i += char_literal_len(rest);
            out.push_str("' '");
        } else {
            let c = rest.chars().next().expect("a char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of a char literal at the start of `rest` (0 for a lifetime).
fn char_literal_len(rest: &str) -> usize {
    let bytes = rest.as_bytes();
    if bytes.get(1) == Some(&b'\\') {
        return rest[2..].find('\'').map_or(0, |end| end + 3);
    }
    let Some(c) = rest[1..].chars().next() else {
        return 0;
    };
    let after = 1 + c.len_utf8();
    if bytes.get(after) == Some(&b'\'') {
        after + 1
    } else {
        0
    }
}

/// The length of the item an attribute at the start of `rest` covers: up to the end
/// of its braces or its `;`, whichever comes first.
fn skip_item(rest: &str) -> usize {
    let mut depth = 0usize;
    for (at, c) in rest.char_indices().skip("#[cfg(test)]".len()) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return at + 1;
                }
            }
            ';' if depth == 0 => return at + 1,
            _ => {}
        }
    }
    rest.len()
}

/// The other library files `file` names. A module's root file naming what lies inside
/// its own module does not count: a door may lead into its rooms.
fn references(file: &SourceFile, files: &BTreeMap<String, SourceFile>) -> BTreeSet<String> {
    let by_module: BTreeMap<&[String], &str> = files
        .iter()
        .map(|(path, file)| (file.module.as_slice(), path.as_str()))
        .collect();
    let own_path = by_module.get(file.module.as_slice()).copied().unwrap_or("");
    let is_root = own_path.ends_with("mod.rs");
    let mut found = BTreeSet::new();
    for path in paths(&file.code) {
        let segments: Vec<&str> = path.split("::").collect();
        let mut base: Vec<String> = Vec::new();
        let mut rest = segments.as_slice();
        match segments[0] {
            "crate" => rest = &segments[1..],
            "self" | "super" => {
                base = file.module.clone();
                while let Some((&first, tail)) = rest.split_first() {
                    match first {
                        "super" => {
                            base.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = tail;
                }
            }
            child => {
                base = file.module.clone();
                let mut candidate = base.clone();
                candidate.push(child.to_string());
                if !by_module.contains_key(candidate.as_slice()) {
                    continue;
                }
            }
        }
        let mut target: Vec<String> = base;
        target.extend(rest.iter().map(|s| s.to_string()));
        while !target.is_empty() && !by_module.contains_key(target.as_slice()) {
            target.pop();
        }
        let Some(&hit) = by_module.get(target.as_slice()) else {
            continue;
        };
        let inside = target.len() > file.module.len() && target.starts_with(&file.module);
        if hit != own_path && !(is_root && inside) {
            found.insert(hit.to_string());
        }
    }
    found
}

/// Every path in the code, with `use` trees spread out: `use a::{b, c::d}` gives
/// `a::b` and `a::c::d`.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let tail = &rest[at + 3..];
        let end = tail.find(';').unwrap_or(tail.len());
        spread("", tail[..end].trim(), &mut out);
        rest = &tail[end..];
    }
    // Paths written inline, outside `use`.
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts = (chars[i].is_ascii_lowercase() || chars[i] == '_')
            && (i == 0
                || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut path = String::new();
        loop {
            let word_start = j;
            while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            path.extend(&chars[word_start..j]);
            if j + 2 < chars.len()
                && chars[j] == ':'
                && chars[j + 1] == ':'
                && (chars[j + 2].is_alphanumeric() || chars[j + 2] == '_')
            {
                path.push_str("::");
                j += 2;
            } else {
                break;
            }
        }
        if path.contains("::") {
            out.push(path);
        }
        i = j.max(i + 1);
    }
    out
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find(word) {
        let at = from + at;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if boundary(before) && after.is_some_and(char::is_whitespace) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Spreads one `use` tree into paths.
fn spread(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = tree[open + 1..].trim_end().trim_end_matches('}');
        let joined = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (at, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    spread(&joined, &inner[start..at], out);
                    start = at + 1;
                }
                _ => {}
            }
        }
        spread(&joined, &inner[start..], out);
    } else if !tree.is_empty() {
        let name = tree.split(" as ").next().unwrap_or(tree).trim();
        if name != "self" {
            out.push(join(prefix, name));
        } else {
            out.push(prefix.to_string());
        }
    }
}

fn join(prefix: &str, tail: &str) -> String {
    match (prefix.is_empty(), tail.is_empty()) {
        (true, _) => tail.to_string(),
        (_, true) => prefix.to_string(),
        _ => format!("{prefix}::{tail}"),
    }
}

/// The circles of the graph: its strongly connected parts of more than one file.
fn strongly_connected(edges: &BTreeMap<&str, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<&'a str, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        circles: Vec<Vec<String>>,
    }
    fn visit(walk: &mut Walk<'_>, node: &str) {
        let n = walk.index.len();
        walk.index.insert(node.to_string(), n);
        walk.low.insert(node.to_string(), n);
        walk.stack.push(node.to_string());
        walk.on_stack.insert(node.to_string());
        let next: Vec<String> = walk
            .edges
            .get(node)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        for target in next {
            if !walk.index.contains_key(&target) {
                visit(walk, &target);
                let low = walk.low[&target].min(walk.low[node]);
                walk.low.insert(node.to_string(), low);
            } else if walk.on_stack.contains(&target) {
                let low = walk.index[&target].min(walk.low[node]);
                walk.low.insert(node.to_string(), low);
            }
        }
        if walk.low[node] == walk.index[node] {
            let mut circle = Vec::new();
            while let Some(top) = walk.stack.pop() {
                walk.on_stack.remove(&top);
                let done = top == node;
                circle.push(top);
                if done {
                    break;
                }
            }
            if circle.len() > 1 {
                circle.sort();
                walk.circles.push(circle);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        circles: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(*node) {
            visit(&mut walk, node);
        }
    }
    walk.circles
}
