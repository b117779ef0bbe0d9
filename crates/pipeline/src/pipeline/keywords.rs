//! Job keywords that shape how a job's outcome counts: `allow_failure` with exit codes,
//! `retry`, `coverage`, `cache`, and the keywords accepted but deciding nothing locally.

use crate::yaml::{Kind, Node};
use slipway_job::model::{CacheSpec, When};

/// Keywords GitLab knows that decide nothing about a local run: accepted with one warning.
pub(crate) const IGNORED_JOB_KEYS: &[&str] = &[
    "environment",
    "release",
    "pages",
    "secrets",
    "id_tokens",
    "identity",
    "dast_configuration",
    "hooks",
    "manual_confirmation",
];

/// Reasons `retry:when` may name (GitLab's list).
const RETRY_WHEN: &[&str] = &[
    "always",
    "unknown_failure",
    "script_failure",
    "api_failure",
    "stuck_or_timeout_failure",
    "runner_system_failure",
    "runner_unsupported",
    "stale_schedule",
    "job_execution_timeout",
    "archived_failure",
    "unmet_prerequisites",
    "scheduler_failure",
    "data_integrity_failure",
];

/// `retry:` of a job: how many more tries, and for which failures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retry {
    /// Tries after the first (0 to 2).
    pub max: u32,
    /// Failure reasons that are retried (`always` when empty).
    pub when: Vec<String>,
    /// Exit codes that are retried (any when empty).
    pub exit_codes: Vec<i32>,
}

impl Retry {
    /// Whether a failure with `reason` (GitLab's name) and `exit_code` is tried again.
    pub fn applies(&self, reason: &str, exit_code: Option<i32>) -> bool {
        let by_reason = self.when.is_empty()
            || self.when.iter().any(|w| w == "always" || w == reason)
            || (reason == "job_execution_timeout"
                && self.when.iter().any(|w| w == "stuck_or_timeout_failure"));
        let by_code =
            self.exit_codes.is_empty() || exit_code.is_some_and(|c| self.exit_codes.contains(&c));
        by_reason && by_code
    }
}

impl super::Reader<'_> {
    /// A whole number list (or a single number), for `exit_codes`.
    fn exit_codes(&mut self, what: &str, node: &Node) -> Option<Vec<i32>> {
        let items: Vec<&Node> = match &node.kind {
            Kind::Seq(items) => items.iter().collect(),
            _ => vec![node],
        };
        let mut out = Vec::new();
        for i in items {
            match i.as_scalar().and_then(|s| s.parse::<i32>().ok()) {
                Some(c) => out.push(c),
                None => {
                    self.error(
                        i.line,
                        format!(
                            "{what}: expected an exit code (a whole number), found {}",
                            i.describe()
                        ),
                    );
                    return None;
                }
            }
        }
        Some(out)
    }

    /// `allow_failure: BOOL` or `allow_failure: {exit_codes: N | [N, ...]}`.
    pub(super) fn allow_failure(&mut self, what: &str, node: &Node) -> Option<(bool, Vec<i32>)> {
        if let Some(b) = node.as_bool() {
            return Some((b, Vec::new()));
        }
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{what}: expected true, false or {{exit_codes: [...]}}, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        let mut codes = None;
        for e in entries {
            match e.key.as_str() {
                "exit_codes" => codes = self.exit_codes(&format!("{what}:exit_codes"), &e.value),
                k => self.error(
                    e.key_line,
                    format!("{what}: unknown key \"{k}\" (expected exit_codes)"),
                ),
            }
        }
        codes.map(|c| (false, c))
    }

    /// `retry: N` or `retry: {max, when, exit_codes}`.
    pub(super) fn retry(&mut self, what: &str, node: &Node) -> Option<Retry> {
        let max_of = |r: &mut Self, n: &Node| -> Option<u32> {
            match n.as_scalar().and_then(|s| s.parse::<u32>().ok()) {
                Some(m) if m <= 2 => Some(m),
                _ => {
                    r.error(
                        n.line,
                        format!(
                            "{what}: max must be 0, 1 or 2, found {}",
                            n.as_scalar().unwrap_or(n.describe())
                        ),
                    );
                    None
                }
            }
        };
        if node.as_map().is_none() {
            return max_of(self, node).map(|max| Retry {
                max,
                ..Retry::default()
            });
        }
        let mut r = Retry::default();
        for e in node.as_map().unwrap_or_default() {
            match e.key.as_str() {
                "max" => r.max = max_of(self, &e.value)?,
                "when" => {
                    let words: Vec<String> = match e.value.as_scalar() {
                        Some(w) => vec![w.to_string()],
                        None => self.string_list(&format!("{what}:when"), &e.value)?,
                    };
                    for w in &words {
                        if !RETRY_WHEN.contains(&w.as_str()) {
                            self.error(
                                e.value.line,
                                format!("{what}:when: unknown failure reason \"{w}\""),
                            );
                            return None;
                        }
                    }
                    r.when = words;
                }
                "exit_codes" => {
                    r.exit_codes = self.exit_codes(&format!("{what}:exit_codes"), &e.value)?
                }
                k => {
                    self.error(
                        e.key_line,
                        format!("{what}: unknown key \"{k}\" (expected max, when or exit_codes)"),
                    );
                    return None;
                }
            }
        }
        Some(r)
    }

    /// `coverage: /regex/`: the regex (checked), without its slashes.
    pub(super) fn coverage(&mut self, what: &str, node: &Node) -> Option<String> {
        let text = self.string(what, node)?;
        let inner = text
            .strip_prefix('/')
            .and_then(|t| t.strip_suffix('/'))
            .filter(|t| !t.is_empty());
        let Some(inner) = inner else {
            self.error(
                node.line,
                format!("{what}: expected a regular expression between slashes, such as /Total: (\\d+\\.\\d+)%/"),
            );
            return None;
        };
        match regex::RegexBuilder::new(inner).size_limit(1 << 20).build() {
            Ok(_) => Some(inner.to_string()),
            Err(e) => {
                self.error(node.line, format!("{what}: invalid regex: {e}"));
                None
            }
        }
    }

    /// `cache:`: one mapping or a list of them.
    pub(super) fn cache(&mut self, what: &str, node: &Node) -> Option<Vec<CacheSpec>> {
        let items: Vec<&Node> = match &node.kind {
            Kind::Seq(items) => items.iter().collect(),
            _ if node.is_null() => Vec::new(),
            _ => vec![node],
        };
        let mut out = Vec::new();
        for (index, item) in items.into_iter().enumerate() {
            let Some(entries) = item.as_map() else {
                self.error(
                    item.line,
                    format!(
                        "{what}: expected a mapping (key, paths, policy, ...), found {}",
                        item.describe()
                    ),
                );
                return None;
            };
            let mut c = CacheSpec {
                key: "default".into(),
                policy: "pull-push".into(),
                ..CacheSpec::default()
            };
            for e in entries {
                let sub = format!("{what}:{}", e.key);
                let v = &e.value;
                match e.key.as_str() {
                    "key" => {
                        if let Some(k) = v.as_scalar() {
                            c.key = k.to_string();
                        } else if v.get("files").is_some() || v.get("prefix").is_some() {
                            // `key: {files: [...], prefix}`: from the files' contents, as GitLab.
                            let files = match v.get("files") {
                                Some(f) => self.string_list(&format!("{sub}:files"), &f.value)?,
                                None => Vec::new(),
                            };
                            // GitLab refuses an empty list rather than key the cache on nothing.
                            if let Some(f) = v.get("files").filter(|_| files.is_empty()) {
                                self.error(
                                    f.value.line,
                                    format!("{sub}:files config requires at least 1 item"),
                                );
                                return None;
                            }
                            let prefix = v.get("prefix").and_then(|p| p.value.as_scalar());
                            let dir = self.facts.project_dir();
                            let listing = if files.iter().any(|f| f.contains('*')) {
                                self.facts.listing().to_vec()
                            } else {
                                Vec::new()
                            };
                            c.key =
                                super::cache_key::files_key(dir, &listing, &files, prefix, index);
                        } else {
                            self.error(v.line, format!("{sub}: expected a key or {{files: [...]}}"));
                            return None;
                        }
                    }
                    "paths" => c.paths = self.string_list(&sub, v)?,
                    "untracked" => c.untracked = v.as_bool().unwrap_or(false),
                    "policy" => match v.as_scalar() {
                        Some(p @ ("pull" | "push" | "pull-push")) => c.policy = p.to_string(),
                        _ => {
                            self.error(v.line, format!("{sub}: expected pull, push or pull-push"));
                            return None;
                        }
                    },
                    "when" => {
                        c.when = match v.as_scalar() {
                            Some("on_success") => When::OnSuccess,
                            Some("on_failure") => When::OnFailure,
                            Some("always") => When::Always,
                            _ => {
                                self.error(
                                    v.line,
                                    format!("{sub}: expected on_success, on_failure or always"),
                                );
                                return None;
                            }
                        }
                    }
                    "fallback_keys" => c.fallback_keys = self.string_list(&sub, v)?,
                    "unprotect" => {}
                    k => self.error(
                        e.key_line,
                        format!("{what}: unknown key \"{k}\" (expected key, paths, untracked, policy, when, fallback_keys or unprotect)"),
                    ),
                }
            }
            out.push(c);
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_applies_by_reason_and_exit_code() {
        let any = Retry {
            max: 2,
            ..Retry::default()
        };
        assert!(any.applies("script_failure", Some(1)));
        let scripts = Retry {
            max: 1,
            when: vec!["script_failure".into()],
            exit_codes: vec![137],
        };
        assert!(scripts.applies("script_failure", Some(137)));
        assert!(!scripts.applies("script_failure", Some(1)));
        assert!(!scripts.applies("runner_system_failure", Some(137)));
        let timeouts = Retry {
            max: 1,
            when: vec!["stuck_or_timeout_failure".into()],
            exit_codes: Vec::new(),
        };
        assert!(timeouts.applies("job_execution_timeout", None));
    }
}
