//! The check driver: reads a config file, records every key of the wrong type, then runs each
//! section's validation in file order ([`check`], [`parse`], [`load`]).

use std::path::{Path, PathBuf};

use crate::global::Config;
use crate::problem::{Problem, Report, Seg, display_path, key_line, line_of};
use crate::secrets;

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
