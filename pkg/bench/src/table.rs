//! Markdown tables: the one way every report lays out its figures (columns named once,
//! figures aligned right, words left, every row as wide as the header).

use std::fmt;

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Align {
    /// Words: names, lists, verdicts.
    Left,
    /// Figures.
    Right,
}

/// A markdown table built column by column, then row by row.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    columns: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table without columns yet.
    pub(crate) fn new() -> Table {
        Table::default()
    }

    /// Adds a column of words (left-aligned).
    pub(crate) fn text(mut self, header: impl Into<String>) -> Table {
        self.columns.push((header.into(), Align::Left));
        self
    }

    /// Adds a column of figures (right-aligned).
    pub(crate) fn num(mut self, header: impl Into<String>) -> Table {
        self.columns.push((header.into(), Align::Right));
        self
    }

    /// Adds a row, one cell per column.
    ///
    /// # Panics
    /// When the row has another number of cells than the table has columns: a report
    /// built that way is a bug of the benchmark, not something to print.
    pub(crate) fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let row: Vec<String> = cells.into_iter().map(Into::into).collect();
        assert_eq!(
            row.len(),
            self.columns.len(),
            "a row of {} cells in a table of {} columns: {row:?}",
            row.len(),
            self.columns.len()
        );
        self.rows.push(row);
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |f: &mut fmt::Formatter<'_>, cells: &mut dyn Iterator<Item = &str>| {
            for c in cells {
                write!(f, "| {c} ")?;
            }
            writeln!(f, "|")
        };
        line(f, &mut self.columns.iter().map(|(h, _)| h.as_str()))?;
        line(
            f,
            &mut self.columns.iter().map(|(_, a)| match a {
                Align::Left => "---",
                Align::Right => "---:",
            }),
        )?;
        for r in &self.rows {
            line(f, &mut r.iter().map(String::as_str))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned_by_kind_and_rows_follow() {
        let mut t = Table::new().text("side").num("p50 (ms)");
        t.row(["weft", "1.20"]);
        t.row([String::from("ptp"), format!("{:.2}", 3.0)]);
        assert_eq!(
            t.to_string(),
            "| side | p50 (ms) |\n| --- | ---: |\n| weft | 1.20 |\n| ptp | 3.00 |\n"
        );
    }

    #[test]
    #[should_panic(expected = "a row of 1 cells in a table of 2 columns")]
    fn a_row_of_the_wrong_width_is_a_bug() {
        Table::new().text("a").num("b").row(["x"]);
    }
}
