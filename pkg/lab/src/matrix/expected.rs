//! What a matrix should show, as the upstream tests write it: tables parsed from text,
//! compared cell by cell.

use std::collections::BTreeMap;

use super::{Family, Port};

/// A table read from an expectation file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTable {
    /// `80/tcp IPv4`, written as [`Table::title`] writes it.
    pub title: String,
    /// The sources, in the file's order.
    pub rows: Vec<String>,
    /// The destinations, in the file's order.
    pub columns: Vec<String>,
    /// `.`, `X` or `?` by (source, destination).
    pub cells: BTreeMap<(String, String), char>,
}

/// Reads tables in the format [`Matrix::to_text`] prints: a title line (`80/tcp IPv4`,
/// or `80/tcp` for IPv4), a header line starting with `-`, then a row per source;
/// blank lines and lines starting with `#` are skipped.
pub fn parse_tables(text: &str) -> Result<Vec<ExpectedTable>, String> {
    let mut out: Vec<ExpectedTable> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = |what: String| format!("line {}: {what}", n + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => continue,
            [w, ..] if w.starts_with('#') => continue,
            ["-", columns @ ..] => {
                let t = out
                    .last_mut()
                    .filter(|t| t.columns.is_empty())
                    .ok_or_else(|| at("a header line without a title line (`80/tcp IPv4`) before it".into()))?;
                t.columns = columns.iter().map(|c| c.to_string()).collect();
            }
            // A title; a row's first word is a pod (`x/a`), which is no port unless its
            // namespace is all digits, and then its cells are no family.
            [port, rest @ ..]
                if port.parse::<Port>().is_ok()
                    && rest.len() <= 1
                    && rest.iter().all(|f| f.parse::<Family>().is_ok()) =>
            {
                let p: Port = port.parse().map_err(at)?;
                let f: Family = rest.first().map_or(Ok(Family::V4), |f| f.parse()).map_err(at)?;
                let title = format!("{p} {f}");
                if out.iter().any(|t| t.title == title) {
                    return Err(at(format!("table {title} given twice")));
                }
                out.push(ExpectedTable {
                    title,
                    rows: Vec::new(),
                    columns: Vec::new(),
                    cells: BTreeMap::new(),
                });
            }
            [from, cells @ ..] => {
                let t = out
                    .last_mut()
                    .filter(|t| !t.columns.is_empty())
                    .ok_or_else(|| at("a row before its table's title and header lines".into()))?;
                if cells.len() != t.columns.len() {
                    return Err(at(format!("{} cells for {} columns", cells.len(), t.columns.len())));
                }
                for (c, to) in cells.iter().zip(&t.columns) {
                    let symbol = match *c {
                        "." => '.',
                        "X" | "x" => 'X',
                        "?" => '?',
                        other => return Err(at(format!("cell {other:?}: `.` (reachable), `X` (blocked) or `?`"))),
                    };
                    t.cells.insert((from.to_string(), to.clone()), symbol);
                }
                t.rows.push(from.to_string());
            }
        }
    }
    Ok(out)
}
