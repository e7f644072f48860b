//! The house's rooms, checked from the source: no function of the library may run
//! past 120 lines, from its `fn` line to its closing brace, since one that does holds
//! more than one step's work (issue 27). Test code is left out: files named
//! `tests.rs`, `tests/` folders and `#[cfg(test)]` modules.
//!
//! The scanner reads lines, as rustfmt lays them out: a function's body closes on a
//! line holding only `}` at the indentation of its `fn` line.

use std::collections::BTreeSet;
use std::path::Path;

/// Most lines a library function may hold.
const MAX_FN_LINES: usize = 120;

/// Functions allowed over the limit for a while, by file and name (none now). The
/// test fails for an entry that is no longer over the limit or no longer there, so
/// the list only shrinks.
const NOT_YET_SPLIT: &[(&str, &str)] = &[];

/// A function found over the limit: its file, name and lines.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LongFn {
    file: String,
    name: String,
    lines: usize,
}

#[test]
fn no_library_function_is_over_120_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    crate::common::rust_files(&root.join("src"), &mut paths);
    let mut found = Vec::new();
    let mut scanned = 0;
    for path in paths {
        let relative = path.strip_prefix(root).expect("under the crate");
        let is_test = relative.file_name().is_some_and(|name| name == "tests.rs")
            || relative.iter().any(|part| part == "tests");
        if is_test {
            continue;
        }
        let file = relative
            .iter()
            .map(|part| part.to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        let source = std::fs::read_to_string(&path).expect("readable source");
        scanned += 1;
        for (name, lines) in long_functions(&source, MAX_FN_LINES) {
            found.push(LongFn {
                file: file.clone(),
                name,
                lines,
            });
        }
    }
    assert!(scanned > 50, "found only {scanned} library files");
    let wrong = verdict(&found, NOT_YET_SPLIT);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The checker finds a long function and only that one, so the test above can fail;
/// and an allow-listed function that got short, or went, is reported too.
#[test]
fn the_checker_sees_a_function_over_the_limit() {
    let mut source = String::from(
        "//! A module.\n\
         \n\
         pub trait Read {\n\
         \x20   fn read(&mut self) -> usize;\n\
         \x20   fn ready(&mut self)\n\
         \x20       -> bool;\n\
         }\n\
         \n\
         fn short() -> u32 { 1 }\n\
         \n\
         impl Thing {\n\
         \x20   pub(super) async fn long_one<R>(\n\
         \x20       reader: R,\n\
         \x20   ) -> u32\n\
         \x20   where\n\
         \x20       R: Read,\n\
         \x20   {\n",
    );
    // Six lines above, and the closing brace below: 130 lines in all.
    for n in 0..123 {
        source.push_str(&format!("        let x{n} = {n};\n"));
    }
    source.push_str(
        "    }\n\
         }\n\
         \n\
         #[cfg(test)]\n\
         mod tests {\n\
         \x20   #[test]\n\
         \x20   fn long_but_a_test() {\n",
    );
    for n in 0..130 {
        source.push_str(&format!("        let y{n} = {n};\n"));
    }
    source.push_str("    }\n}\n");

    let long = long_functions(&source, MAX_FN_LINES);
    assert_eq!(long, vec![("long_one".to_string(), 130)]);
    assert!(long_functions(&source, 130).is_empty());

    let found = [LongFn {
        file: "src/a.rs".into(),
        name: "long_one".into(),
        lines: 130,
    }];
    let wrong = verdict(&found, &[]);
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert!(wrong[0].contains("src/a.rs") && wrong[0].contains("long_one"));
    assert!(verdict(&found, &[("src/a.rs", "long_one")]).is_empty());
    let wrong = verdict(&found, &[("src/a.rs", "long_one"), ("src/b.rs", "gone")]);
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert!(wrong[0].contains("src/b.rs") && wrong[0].contains("gone"));
}

/// What is wrong with the long functions `found`: each not on `allowed`, and each of
/// `allowed` not found over the limit.
fn verdict(found: &[LongFn], allowed: &[(&str, &str)]) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut still_long = BTreeSet::new();
    for long in found {
        let pair = (long.file.as_str(), long.name.as_str());
        if allowed.contains(&pair) {
            still_long.insert(pair);
        } else {
            wrong.push(format!(
                "{}: fn {} has {} lines, over {MAX_FN_LINES}: split it by meaning",
                long.file, long.name, long.lines
            ));
        }
    }
    for &(file, name) in allowed {
        if !still_long.contains(&(file, name)) {
            wrong.push(format!(
                "{file}: fn {name} is on NOT_YET_SPLIT but no longer over {MAX_FN_LINES} \
                 lines (or gone): take it off the list"
            ));
        }
    }
    wrong
}

/// The functions with a body in `source` longer than `limit` lines, by name and
/// lines, leaving out `#[cfg(test)]` modules.
fn long_functions(source: &str, limit: usize) -> Vec<(String, usize)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut long = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim() == "#[cfg(test)]"
            && let Some(end) = test_module_end(&lines, i)
        {
            i = end + 1;
            continue;
        }
        if let Some(name) = fn_name(line)
            && let Some(end) = body_end(&lines, i)
        {
            let count = end - i + 1;
            if count > limit {
                long.push((name.to_string(), count));
            }
        }
        i += 1;
    }
    long
}

/// The name of the function whose `fn` line this is, if it is one.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = match after.strip_prefix('(') {
            Some(scope) => scope.split_once(')')?.1,
            None => after,
        };
        rest = rest.strip_prefix(' ')?;
    }
    for qualifier in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    if let Some(after) = rest.strip_prefix("extern ") {
        rest = after.split_once(' ')?.1;
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The line where the body of the function starting at line `at` closes: the first
/// line holding only `}` at the `fn` line's indentation, or the `fn` line itself for
/// a body on one line. `None` for a function without a body (ended by `;`).
fn body_end(lines: &[&str], at: usize) -> Option<usize> {
    let indent = indentation(lines[at]);
    let close = format!("{}}}", " ".repeat(indent));
    // The signature runs until a line ends with the body's `{`, or with `;`.
    for (offset, line) in lines[at..].iter().enumerate() {
        let code = line.trim_end();
        if code.ends_with(';') {
            return None;
        }
        if code.ends_with('}') && code.contains('{') {
            return Some(at + offset);
        }
        if code.ends_with('{') {
            let from = at + offset + 1;
            return lines[from..]
                .iter()
                .position(|line| line.trim_end() == close)
                .map(|end| from + end);
        }
        if offset > 0 && !code.is_empty() && indentation(line) < indent {
            break;
        }
    }
    None
}

/// The line closing the `#[cfg(test)]` module whose attribute is on line `at`, if
/// the attribute is on an inline module.
fn test_module_end(lines: &[&str], at: usize) -> Option<usize> {
    let (offset, item) = lines[at + 1..]
        .iter()
        .enumerate()
        .find(|(_, line)| !line.trim_start().starts_with("#["))?;
    let code = item.trim();
    let is_module = code.starts_with("mod ") || code.starts_with("pub mod ");
    if !is_module || !code.ends_with('{') {
        return None;
    }
    let start = at + 1 + offset;
    let close = format!("{}}}", " ".repeat(indentation(item)));
    lines[start + 1..]
        .iter()
        .position(|line| line.trim_end() == close)
        .map(|end| start + 1 + end)
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}
