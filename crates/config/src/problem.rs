//! What is wrong with a config file, and where: [`Problem`]s located by line and key, the
//! [`Report`] each section's checks write to, and the key paths ([`Seg`]) both use.

use std::fmt;
use std::path::Path;

/// A problem in a config file, located by line and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// File name as given.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted key path, e.g. `runners[0].autoscaler.capacity_per_instance`.
    pub key: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: ", self.file, l)?,
            None => write!(f, "{}: ", self.file)?,
        }
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

/// Where a section's checks report: the driver's sink, and the section's key path.
pub(crate) struct Report<'a> {
    sink: &'a mut dyn FnMut(Vec<Seg>, String, bool),
    at: Vec<Seg>,
}

impl<'a> Report<'a> {
    /// A report at the top of the file.
    pub(crate) fn new(sink: &'a mut dyn FnMut(Vec<Seg>, String, bool)) -> Self {
        Report {
            sink,
            at: Vec::new(),
        }
    }

    /// The report of the table at `keys` below this one.
    pub(crate) fn section(&mut self, keys: &[&str]) -> Report<'_> {
        Report {
            at: self.path(keys),
            sink: &mut *self.sink,
        }
    }

    /// The report of element `index` of the array `key` below this table.
    pub(crate) fn element(&mut self, key: &str, index: usize) -> Report<'_> {
        let mut at = self.path(&[key]);
        at.push(Seg::Index(index));
        Report {
            at,
            sink: &mut *self.sink,
        }
    }

    fn path(&self, keys: &[&str]) -> Vec<Seg> {
        let mut p = self.at.clone();
        p.extend(keys.iter().map(|k| Seg::Key((*k).to_string())));
        p
    }

    /// An error at `keys` below this table (none: the table itself).
    pub(crate) fn error(&mut self, keys: &[&str], message: impl Into<String>) {
        let path = self.path(keys);
        (self.sink)(path, message.into(), true);
    }

    /// A warning at `keys` below this table.
    pub(crate) fn warning(&mut self, keys: &[&str], message: impl Into<String>) {
        let path = self.path(keys);
        (self.sink)(path, message.into(), false);
    }

    /// A Go-style duration in a string key: an error names the key. Past Go's longest
    /// duration (what GitLab Runner can read) is an error too: a deadline that far away
    /// would overflow a clock.
    pub(crate) fn duration_text(&mut self, keys: &[&str], text: &str) {
        match humantime::parse_duration(text.trim()) {
            Err(e) => self.error(
                keys,
                format!(
                    "invalid duration {text:?} ({e}); expected e.g. \"30s\", \"15m\" or \"1h30m\""
                ),
            ),
            Ok(d) if d > GO_LONGEST => self.error(
                keys,
                format!("{text:?}: expected at most \"2562047h\" (Go's longest duration)"),
            ),
            Ok(_) => {}
        }
    }

    /// A warning when `file` is set but does not exist here (it is read where the runner runs).
    pub(crate) fn missing_file(&mut self, keys: &[&str], file: &str) {
        if !file.trim().is_empty() && !Path::new(file).exists() {
            self.warning(
                keys,
                format!("file {file:?} does not exist on this machine"),
            );
        }
    }
}

/// Go's longest `time.Duration` (i64 nanoseconds, about 292 years).
pub(crate) const GO_LONGEST: std::time::Duration = std::time::Duration::from_nanos(i64::MAX as u64);

/// `"a", "b", "c"`: the names a message offers.
pub(crate) fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// `runners[0].autoscaler.plugin`: a key path as messages name it.
pub(crate) fn display_path(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// The 1-based line of byte `offset` in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).map_or(0, |t| t.matches('\n').count()) + 1
}

/// The line where the key at `path` is written (or its nearest written parent); an index into
/// an inline array gives the element's line.
pub(crate) fn key_line(
    doc: &toml_edit::Document<String>,
    text: &str,
    path: &[Seg],
) -> Option<usize> {
    /// Where the walk stands.
    enum At<'a> {
        Table(&'a dyn toml_edit::TableLike),
        Tables(&'a toml_edit::ArrayOfTables),
        Array(&'a toml_edit::Array),
        Leaf,
    }
    fn of_value(v: &toml_edit::Value) -> At<'_> {
        match v {
            toml_edit::Value::Array(a) => At::Array(a),
            toml_edit::Value::InlineTable(t) => At::Table(t),
            _ => At::Leaf,
        }
    }
    let line = |span: Option<std::ops::Range<usize>>| span.map(|s| line_of(text, s.start));
    let mut at = At::Table(doc.as_table());
    let mut best = None;
    for seg in path {
        at = match (at, seg) {
            (At::Table(t), Seg::Key(k)) => {
                let Some((key, item)) = t.get_key_value(k) else {
                    return best;
                };
                best = line(key.span().or_else(|| item.span())).or(best);
                match item {
                    toml_edit::Item::ArrayOfTables(a) => At::Tables(a),
                    toml_edit::Item::Value(v) => of_value(v),
                    other => other.as_table_like().map_or(At::Leaf, At::Table),
                }
            }
            (At::Tables(a), Seg::Index(n)) => {
                let Some(t) = a.get(*n) else { return best };
                best = line(t.span()).or(best);
                At::Table(t)
            }
            (At::Array(a), Seg::Index(n)) => {
                let Some(v) = a.get(*n) else { return best };
                best = line(v.span()).or(best);
                of_value(v)
            }
            _ => return best,
        };
    }
    best
}
