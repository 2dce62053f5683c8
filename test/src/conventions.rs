//! The house conventions of docs/testing.md that a reading of the sources can check:
//! unit tests live in one child module named `tests` at the end of the file it tests,
//! and integration tests keep apart through `weft_tests::area`/`alone` only, never a
//! lock of their own.

use std::path::{Path, PathBuf};

/// What is wrong with the unit tests of one file's text, if anything: a test module not
/// named `tests`, more than one, or one with code after it.
pub fn unit_test_placement(text: &str) -> Option<String> {
    let mut modules = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != "#[cfg(test)]" || line.starts_with(' ') {
            continue;
        }
        let Some(next) = lines.get(i + 1) else { continue };
        let Some(rest) = next.strip_prefix("mod ") else {
            continue;
        };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        modules.push((i, name, rest.trim_end().ends_with('{')));
    }
    let (line, name, inline) = match modules.as_slice() {
        [] => return None,
        [one] => one.clone(),
        [_, second, ..] => return Some(format!("a second test module at line {}", second.0 + 1)),
    };
    if name != "tests" {
        return Some(format!("the test module at line {} is `{name}`, not `tests`", line + 1));
    }
    if inline {
        // The block ends at the first line that closes it at column 0.
        let end = lines[line + 1..].iter().position(|l| *l == "}").map(|p| line + 1 + p);
        if let Some(end) = end
            && lines[end + 1..].iter().any(|l| !l.trim().is_empty())
        {
            return Some(format!("code after the test module that ends at line {}", end + 1));
        }
    }
    None
}

/// Whether an integration test file keeps tests apart with a lock of its own (a
/// `static` mutex) instead of `weft_tests::area`/`alone`.
pub fn own_serialization(text: &str) -> Option<String> {
    text.lines()
        .enumerate()
        .find(|(_, l)| l.trim_start().starts_with("static ") && l.contains("Mutex<()>"))
        .map(|(i, l)| format!("line {}: {}", i + 1, l.trim()))
}

/// Every `.rs` file under `dir`.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "target" || n == "fuzz") {
                continue;
            }
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_module_is_one_named_tests_and_last() {
        assert_eq!(unit_test_placement("fn a() {}\n"), None);
        assert_eq!(
            unit_test_placement("fn a() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n"),
            None
        );
        assert_eq!(unit_test_placement("fn a() {}\n#[cfg(test)]\nmod tests;\n"), None);
        assert!(
            unit_test_placement("#[cfg(test)]\nmod more_tests {\n}\n")
                .unwrap()
                .contains("`more_tests`")
        );
        assert!(
            unit_test_placement("#[cfg(test)]\nmod tests {\n}\n\nfn after() {}\n")
                .unwrap()
                .contains("code after")
        );
        assert!(
            unit_test_placement("#[cfg(test)]\nmod tests {\n}\n#[cfg(test)]\nmod tests2 {\n}\n")
                .unwrap()
                .contains("second")
        );
    }

    #[test]
    fn a_static_mutex_in_a_test_file_is_its_own_lock() {
        assert!(own_serialization("static SERIAL: Mutex<()> = Mutex::new(());\n").is_some());
        assert!(own_serialization("let _area = weft_tests::area(\"x\");\n").is_none());
    }

    #[test]
    fn the_workspace_keeps_its_test_conventions() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
        let mut found = Vec::new();
        for group in ["pkg", "cmd"] {
            for f in rust_files(&root.join(group)) {
                let text = std::fs::read_to_string(&f).unwrap();
                if let Some(why) = unit_test_placement(&text) {
                    found.push(format!("{}: {why}", f.display()));
                }
            }
        }
        for f in rust_files(&root.join("test/tests")) {
            let text = std::fs::read_to_string(&f).unwrap();
            if let Some(why) = own_serialization(&text) {
                found.push(format!(
                    "{}: a lock of its own ({why}); take weft_tests::area or alone",
                    f.display()
                ));
            }
        }
        assert!(
            found.is_empty(),
            "docs/testing.md's conventions broken:\n{}",
            found.join("\n")
        );
    }
}
