//! What is wrong with a config file, and where: [`Problem`]s located by line and key, and the
//! check driver that reads the file, records every key of the wrong type, then runs each
//! section's validation in file order.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::global::Config;
use crate::secrets;

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

/// A config that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {file}: {source}")]
    Read {
        /// File name.
        file: String,
        /// Cause.
        source: std::io::Error,
    },
    /// One or more errors; every one is listed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

/// A config with the warnings found while reading it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The settings.
    pub config: Config,
    /// Unknown keys and other things worth a look.
    pub warnings: Vec<Problem>,
}

/// Read and check a config file.
pub async fn load(path: &Path) -> Result<Loaded, ConfigError> {
    let file = path.display().to_string();
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
    parse(&text, &file)
}

/// Parse and check config text; `file` names it in messages. Fails with every error found.
pub fn parse(text: &str, file: &str) -> Result<Loaded, ConfigError> {
    let checked = check(text, file, &CheckOptions::default());
    match checked.config {
        Some(config) if checked.errors.is_empty() => Ok(Loaded {
            config,
            warnings: checked.warnings,
        }),
        _ => Err(ConfigError::Invalid(checked.errors)),
    }
}

/// What [`check`] looks at beyond the file itself.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Look each runner's fleeting plugin up as `slipway run` would, warning when it is missing.
    pub plugins: bool,
    /// Directory searched first for plugins (`--plugin-dir`).
    pub plugin_dir: Option<PathBuf>,
}

/// Everything [`check`] found.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The settings as far as they could be read (`None` when the file is not TOML); keys of
    /// the wrong type are left at their defaults.
    pub config: Option<Config>,
    /// Wrong types and values, in file order.
    pub errors: Vec<Problem>,
    /// Unknown keys and other things worth a look, in file order.
    pub warnings: Vec<Problem>,
}

/// Bound on the re-reads of a file with wrong types: each one drops one offending key.
const MAX_TYPE_ERRORS: usize = 200;

/// Check config text and report every problem: each key of the wrong type is recorded and
/// dropped and the rest read again, so one bad key does not hide the others.
pub fn check(text: &str, file: &str, opts: &CheckOptions) -> Checked {
    let not_toml = |line: Option<usize>, message: String| Checked {
        config: None,
        errors: vec![Problem {
            file: file.into(),
            line,
            key: String::new(),
            message,
        }],
        warnings: Vec::new(),
    };
    let doc = match toml_edit::Document::parse(text.to_string()) {
        Ok(d) => d,
        Err(e) => {
            return not_toml(
                e.span().map(|s| line_of(text, s.start)),
                format!("not valid TOML: {}", e.message()),
            );
        }
    };
    let mut table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            return not_toml(
                e.span().map(|s| line_of(text, s.start)),
                format!("not valid TOML: {}", e.message()),
            );
        }
    };
    let secrets = secrets::secrets_of(&table);
    let problem = |path: &[Seg], message: String| Problem {
        file: file.into(),
        line: key_line(&doc, text, path),
        key: display_path(path),
        message: secrets::mask(&message, &secrets),
    };

    let mut unknown: Vec<Vec<Seg>> = Vec::new();
    let mut wrong: Vec<(Vec<Seg>, String)> = Vec::new();
    let config = loop {
        let mut seen = Vec::new();
        let result = {
            let mut on_unknown = |p: serde_ignored::Path<'_>| seen.push(segments_of_ignored(&p));
            let ignored = serde_ignored::Deserializer::new(
                toml::Value::Table(table.clone()),
                &mut on_unknown,
            );
            serde_path_to_error::deserialize::<_, Config>(ignored)
        };
        for p in seen {
            if !unknown.contains(&p) {
                unknown.push(p);
            }
        }
        match result {
            Ok(c) => break Some(c),
            Err(e) => {
                let path = segments_of_error(e.path());
                let message = e.into_inner().message().to_string();
                // A value that may be a secret is not quoted back, whatever its type.
                let message = if secrets::is_secret_path(&path) {
                    secrets::without_value(&message)
                } else {
                    message
                };
                let removed = remove_key(&mut table, &path);
                wrong.push((path, message));
                if !removed || wrong.len() >= MAX_TYPE_ERRORS {
                    break None;
                }
            }
        }
    };

    let mut errors: Vec<Problem> = wrong.iter().map(|(p, m)| problem(p, m.clone())).collect();
    let mut warnings: Vec<Problem> = unknown
        .iter()
        .map(|p| problem(p, "unknown key, ignored".into()))
        .collect();
    if let Some(cfg) = &config {
        // A dropped key reads as its default: what validation says about it is noise.
        let dropped: Vec<Vec<Seg>> = wrong.iter().map(|(p, _)| trim_index(p)).collect();
        let mut sink = |path: Vec<Seg>, msg: String, fatal: bool| {
            if dropped.iter().any(|d| path.starts_with(d)) {
                return;
            }
            let p = problem(&path, msg);
            if fatal {
                errors.push(p)
            } else {
                warnings.push(p)
            }
        };
        validate(cfg, opts, &mut Report::new(&mut sink));
    }
    // Stable: problems on one line keep the order they were found in.
    let order = |p: &Problem| p.line.unwrap_or(usize::MAX);
    errors.sort_by_key(order);
    warnings.sort_by_key(order);
    Checked {
        config,
        errors,
        warnings,
    }
}

/// Every section's checks, in the order they have always run: the global keys, then each
/// runner with what `concurrent` says about it, then (when asked) the plugins installed here.
fn validate(cfg: &Config, opts: &CheckOptions, report: &mut Report<'_>) {
    cfg.validate(report);
    for (i, r) in cfg.runners.iter().enumerate() {
        r.validate(&mut report.element("runners", i));
        cfg.validate_capacity_of(r, report);
    }
    if opts.plugins {
        for (i, r) in cfg.runners.iter().enumerate() {
            if let Some(a) = &r.autoscaler {
                let mut at = report.element("runners", i);
                a.check_plugin(opts.plugin_dir.as_deref(), &mut at.section(&["autoscaler"]));
            }
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

    /// A Go-style duration in a string key: an error names the key.
    pub(crate) fn duration_text(&mut self, keys: &[&str], text: &str) {
        if let Err(e) = humantime::parse_duration(text.trim()) {
            self.error(
                keys,
                format!(
                    "invalid duration {text:?} ({e}); expected e.g. \"30s\", \"15m\" or \"1h30m\""
                ),
            );
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

/// `"a", "b", "c"`: the names a message offers.
pub(crate) fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `path` without trailing array indices: the key that holds the offending element.
fn trim_index(path: &[Seg]) -> Vec<Seg> {
    let mut p = path.to_vec();
    while matches!(p.last(), Some(Seg::Index(_))) {
        p.pop();
    }
    p
}

/// Drop the key at `path` (a bad array element drops its whole array); false if not found.
fn remove_key(table: &mut toml::Table, path: &[Seg]) -> bool {
    let path = trim_index(path);
    let Some((Seg::Key(last), parents)) = path.split_last() else {
        return false;
    };
    let mut cur = table;
    let mut segs = parents.iter().peekable();
    while let Some(seg) = segs.next() {
        let Seg::Key(k) = seg else { return false };
        let mut value = match cur.get_mut(k) {
            Some(v) => v,
            None => return false,
        };
        while let Some(Seg::Index(i)) = segs.peek() {
            value = match value {
                toml::Value::Array(a) => match a.get_mut(*i) {
                    Some(v) => v,
                    None => return false,
                },
                _ => return false,
            };
            segs.next();
        }
        cur = match value {
            toml::Value::Table(t) => t,
            _ => return false,
        };
    }
    cur.remove(last).is_some()
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

fn segments_of_ignored(p: &serde_ignored::Path<'_>) -> Vec<Seg> {
    use serde_ignored::Path as P;
    match p {
        P::Root => Vec::new(),
        P::Seq { parent, index } => {
            let mut v = segments_of_ignored(parent);
            v.push(Seg::Index(*index));
            v
        }
        P::Map { parent, key } => {
            let mut v = segments_of_ignored(parent);
            v.push(Seg::Key(key.clone()));
            v
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            segments_of_ignored(parent)
        }
    }
}

fn segments_of_error(p: &serde_path_to_error::Path) -> Vec<Seg> {
    use serde_path_to_error::Segment as S;
    p.iter()
        .filter_map(|s| match s {
            S::Seq { index } => Some(Seg::Index(*index)),
            S::Map { key } => Some(Seg::Key(key.clone())),
            S::Enum { variant } => Some(Seg::Key(variant.clone())),
            S::Unknown => None,
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{GOOD, errors};

    #[test]
    fn wrong_type_names_file_line_and_key() {
        let text = GOOD.replace(
            "capacity_per_instance = 2",
            "capacity_per_instance = \"two\"",
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("config.toml:10: runners[0].autoscaler.capacity_per_instance:"),
            "{e:?}"
        );
    }

    #[test]
    fn unknown_key_is_a_warning_with_line() {
        let text = GOOD.replace(
            "max_use_count = 5",
            "max_use_count = 5\n    frobnicate = true",
        );
        let loaded = parse(&text, "config.toml").expect("still valid");
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            w,
            vec!["config.toml:13: runners[0].autoscaler.frobnicate: unknown key, ignored"]
        );
    }

    #[test]
    fn broken_toml_is_an_error_with_line() {
        let e = errors("concurrent = 4\n[[runners]\n");
        assert!(e[0].starts_with("config.toml:2:"), "{e:?}");
    }

    #[test]
    fn every_wrong_type_is_reported_at_its_line() {
        let text = GOOD
            .replace("concurrent = 4", "concurrent = \"four\"")
            .replace(
                "capacity_per_instance = 2",
                "capacity_per_instance = \"two\"",
            )
            .replace("max_use_count = 5", "max_use_count = -5")
            .replace(
                "idle_count = 1",
                "idle_count = 1\n      periods = \"* * * * *\"",
            );
        let e = errors(&text);
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(
            e[0].starts_with("config.toml:2: concurrent: invalid type"),
            "{e:?}"
        );
        assert!(
            e[1].starts_with("config.toml:10: runners[0].autoscaler.capacity_per_instance:"),
            "{e:?}"
        );
        assert!(
            e[2].starts_with("config.toml:12: runners[0].autoscaler.max_use_count:"),
            "{e:?}"
        );
        assert!(
            e[3].starts_with("config.toml:18: runners[0].autoscaler.policy[0].periods:"),
            "{e:?}"
        );
    }
}
