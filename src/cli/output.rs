//! Terminal output helpers: colour only on a TTY (and never with `NO_COLOR`), aligned tables,
//! human sizes, text from files made printable. How a failed command reports its error is
//! `super::failure`'s.

use std::io::IsTerminal;

/// Styling for one output stream.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    colour: bool,
}

impl Style {
    /// Colour when stdout is a terminal and `NO_COLOR` is unset.
    pub fn stdout() -> Self {
        Self {
            colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn paint(&self, code: &str, s: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    pub fn heading(&self, s: &str) -> String {
        self.paint("1", s)
    }
    pub fn warn(&self, s: &str) -> String {
        self.paint("33", s)
    }
    pub fn good(&self, s: &str) -> String {
        self.paint("32", s)
    }
    pub fn bad(&self, s: &str) -> String {
        self.paint("31", s)
    }
    pub fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
}

/// Formats rows as left-aligned columns separated by two spaces, each line indented.
pub fn table(indent: &str, rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        out.push_str(indent);
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                let pad = widths[c].saturating_sub(cell.chars().count()) + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

/// `1536` → `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `s` with control characters escaped (`\u{1b}`), line breaks and tabs kept: for text that
/// came from files or sockets (paths, model names, reasons), so no terminal escape sequence in
/// it reaches the terminal raw.
pub fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '\n' | '\t' => vec![c],
            c if c.is_control() => c.escape_default().collect(),
            c => vec![c],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_tables() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        let t = table(
            "  ",
            &[
                vec!["a".into(), "bb".into()],
                vec!["ccc".into(), "d".into()],
            ],
        );
        assert_eq!(t, "  a    bb\n  ccc  d\n");
    }
}
