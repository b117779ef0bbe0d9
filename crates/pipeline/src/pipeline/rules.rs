//! `rules:`, `workflow:rules:` and the older `only:`/`except:`: which jobs a pipeline gets.
//!
//! A rule holds when all of its clauses hold (`if`, `exists`, `changes`); the first rule that
//! holds decides, and no rule holding leaves the job out. `only`/`except` hold per GitLab's
//! conjoined form: `only` keeps a job when every key it names (`refs`, `variables`, `changes`)
//! has a condition that matches; `except` drops it when any key does.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::expr::Expr;
use super::glob;
use crate::yaml::{Kind, Node};
use slipway_job::model::Variable;

/// What a rule (or a job without rules) says about starting a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuleWhen {
    OnSuccess,
    OnFailure,
    Always,
    Manual,
    Delayed,
    Never,
}

impl RuleWhen {
    /// GitLab's spelling to the value; `None` for an unknown word.
    pub(crate) fn parse(word: &str) -> Option<RuleWhen> {
        Some(match word {
            "on_success" => RuleWhen::OnSuccess,
            "on_failure" => RuleWhen::OnFailure,
            "always" => RuleWhen::Always,
            "manual" => RuleWhen::Manual,
            "delayed" => RuleWhen::Delayed,
            "never" => RuleWhen::Never,
            _ => return None,
        })
    }
}

/// `rules:changes`: paths, and the ref to compare with.
#[derive(Debug, Clone, Default)]
pub(crate) struct Changes {
    pub paths: Vec<String>,
    pub compare_to: Option<String>,
}

/// One rule, as read (the reader checks shapes and reports problems).
#[derive(Debug, Clone, Default)]
pub(crate) struct Rule {
    pub cond: Option<Expr>,
    pub exists: Option<Vec<String>>,
    pub changes: Option<Changes>,
    pub when: Option<RuleWhen>,
    /// `allow_failure`: true/false (exit codes are not allowed on a rule by GitLab).
    pub allow_failure: Option<bool>,
    pub variables: Vec<Variable>,
    /// `needs` replacing the job's (as written; the reader checks them).
    pub needs: Option<Vec<super::RawNeed>>,
    pub start_in: Option<Duration>,
    pub interruptible: Option<bool>,
}

/// `only:` or `except:` as read.
#[derive(Debug, Clone, Default)]
pub(crate) struct RefFilter {
    pub refs: Option<Vec<String>>,
    pub variables: Option<Vec<Expr>>,
    pub changes: Option<Vec<String>>,
}

/// The facts rules are decided on, besides variables: the project's files and what changed.
pub(crate) struct Facts<'a> {
    project_dir: &'a Path,
    listing: Option<Vec<String>>,
    /// Changed files per base ref; `None` when git could not say (then `changes` holds).
    changed: HashMap<String, Option<Vec<String>>>,
    /// The base `changes` compares with when a rule names none.
    default_base: Option<String>,
}

impl<'a> Facts<'a> {
    /// Facts about `project_dir`; `default_base` is the ref `changes` compares with.
    pub(crate) fn new(project_dir: &'a Path, default_base: Option<String>) -> Self {
        Facts {
            project_dir,
            listing: None,
            changed: HashMap::new(),
            default_base,
        }
    }

    /// The project's directory.
    pub(crate) fn project_dir(&self) -> &'a Path {
        self.project_dir
    }

    /// The project's files, listed once (see [`glob::files`]).
    pub(crate) fn listing(&mut self) -> &[String] {
        self.listing
            .get_or_insert_with(|| glob::files(self.project_dir))
    }

    pub(crate) fn exists(
        &mut self,
        patterns: &[String],
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> bool {
        let listing = self.listing();
        patterns.iter().any(|p| {
            let p = slipway_job::variables::expand(p, lookup);
            listing.iter().any(|f| glob::matches(&p, f))
        })
    }

    fn changed(
        &mut self,
        paths: &[String],
        compare_to: Option<&str>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> bool {
        let base = compare_to
            .map(String::from)
            .or_else(|| self.default_base.clone());
        let Some(base) = base else {
            // No git history to compare with: GitLab treats `changes` as true then.
            return true;
        };
        let dir = self.project_dir;
        let files = self
            .changed
            .entry(base.clone())
            .or_insert_with(|| super::checkout::changed_files(dir, &base).ok());
        let Some(files) = files else { return true };
        paths.iter().any(|p| {
            let p = slipway_job::variables::expand(p, lookup);
            files.iter().any(|f| glob::matches(&p, f))
        })
    }
}

/// The first rule of `rules` that holds, or `None` when none does.
pub(crate) fn first_match<'r>(
    rules: &'r [Rule],
    lookup: &dyn Fn(&str) -> Option<String>,
    facts: &mut Facts<'_>,
) -> Option<&'r Rule> {
    rules.iter().find(|r| {
        r.cond.as_ref().is_none_or(|c| c.eval(lookup))
            && r.exists.as_ref().is_none_or(|e| facts.exists(e, lookup))
            && r.changes
                .as_ref()
                .is_none_or(|c| facts.changed(&c.paths, c.compare_to.as_deref(), lookup))
    })
}

/// Whether `only` (default: branches and tags) and `except` keep the job.
pub(crate) fn only_except(
    only: Option<&RefFilter>,
    except: Option<&RefFilter>,
    lookup: &dyn Fn(&str) -> Option<String>,
    facts: &mut Facts<'_>,
) -> bool {
    let default_only = RefFilter {
        refs: Some(vec!["branches".into(), "tags".into()]),
        ..RefFilter::default()
    };
    let only = only.unwrap_or(&default_only);
    let keys = |f: &RefFilter, facts: &mut Facts<'_>| -> Vec<bool> {
        let mut out = Vec::new();
        if let Some(refs) = &f.refs {
            out.push(refs.iter().any(|r| ref_matches(r, lookup)));
        }
        if let Some(vars) = &f.variables {
            out.push(vars.iter().any(|e| e.eval(lookup)));
        }
        if let Some(changes) = &f.changes {
            out.push(facts.changed(changes, None, lookup));
        }
        out
    };
    let kept = keys(only, facts).into_iter().all(|b| b);
    let dropped = except.is_some_and(|e| keys(e, facts).into_iter().any(|b| b));
    kept && !dropped
}

/// One `only:refs` / `except:refs` entry against the pipeline's ref and source.
fn ref_matches(entry: &str, lookup: &dyn Fn(&str) -> Option<String>) -> bool {
    let source = lookup("CI_PIPELINE_SOURCE").unwrap_or_else(|| "push".into());
    let tag = lookup("CI_COMMIT_TAG").filter(|t| !t.is_empty());
    let ref_name = lookup("CI_COMMIT_REF_NAME").unwrap_or_default();
    // `name@group/project` restricts to a project: this is that project.
    let entry = entry.split_once('@').map_or(entry, |(n, _)| n);
    match entry {
        "branches" => tag.is_none() && source != "merge_request_event",
        "tags" => tag.is_some(),
        "pushes" => source == "push",
        "merge_requests" => source == "merge_request_event",
        "api" | "chat" | "external" | "pipelines" | "schedules" | "triggers" | "web" => {
            let want = match entry {
                "pipelines" => "pipeline",
                "schedules" => "schedule",
                "triggers" => "trigger",
                other => other,
            };
            source == want
        }
        "external_pull_requests" => source == "external_pull_request_event",
        _ if entry.starts_with('/') && entry.len() > 1 => {
            super::expr::matches_pattern(entry, &ref_name).unwrap_or(false)
        }
        name => name == ref_name,
    }
}

/// Reading `rules:`, `only:`/`except:` and `when:` (problems go to the reader's list).
impl super::Reader<'_> {
    /// A `when:` word; `allowed` lists the words this place takes.
    pub(super) fn rule_when(
        &mut self,
        what: &str,
        node: &Node,
        allowed: &[RuleWhen],
    ) -> Option<RuleWhen> {
        let names = |list: &[RuleWhen]| {
            list.iter()
                .map(|w| w.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        // An unquoted `:on_failure` is a Ruby symbol to GitLab's YAML reader, taken by its
        // name.
        let plain = matches!(node.kind, Kind::Scalar { plain: true, .. });
        let word = node.as_scalar().map(|w| {
            if plain {
                w.strip_prefix(':').unwrap_or(w)
            } else {
                w
            }
        });
        match word.map(|w| (w, RuleWhen::parse(w))) {
            Some((_, Some(w))) if allowed.contains(&w) => Some(w),
            Some((word, _)) => {
                self.error(
                    node.line,
                    format!(
                        "{what}: unknown value \"{word}\" (expected {})",
                        names(allowed)
                    ),
                );
                None
            }
            None => {
                self.error(
                    node.line,
                    format!(
                        "{what}: expected one of {}, found {}",
                        names(allowed),
                        node.describe()
                    ),
                );
                None
            }
        }
    }

    /// An expression for `if:` (or `only:variables`).
    pub(super) fn expression(&mut self, what: &str, node: &Node) -> Option<Expr> {
        let Some(text) = node.as_scalar() else {
            self.error(
                node.line,
                format!("{what}: expected an expression, found {}", node.describe()),
            );
            return None;
        };
        match Expr::parse(text) {
            Ok(e) => Some(e),
            Err(e) => {
                self.error(node.line, format!("{what}: {e} in {text:?}"));
                None
            }
        }
    }

    /// A list of path patterns (a single string counts as a list of one).
    fn patterns(&mut self, what: &str, node: &Node) -> Option<Vec<String>> {
        if let Some(s) = node.as_scalar() {
            return Some(vec![s.to_string()]);
        }
        self.string_list(what, node)
    }

    fn changes(&mut self, what: &str, node: &Node) -> Option<Changes> {
        if node.as_map().is_none() {
            return self.patterns(what, node).map(|paths| Changes {
                paths,
                compare_to: None,
            });
        }
        let mut c = Changes::default();
        for e in node.as_map().unwrap_or_default() {
            match e.key.as_str() {
                "paths" => c.paths = self.patterns(&format!("{what}:paths"), &e.value)?,
                "compare_to" => c.compare_to = self.string(&format!("{what}:compare_to"), &e.value),
                k => self.error(
                    e.key_line,
                    format!("{what}: unknown key \"{k}\" (expected paths or compare_to)"),
                ),
            }
        }
        Some(c)
    }

    /// `rules:` of a job (`job_level`) or of `workflow:`.
    pub(super) fn rules(&mut self, what: &str, node: &Node, job_level: bool) -> Option<Vec<Rule>> {
        let Some(items) = node.as_list() else {
            self.error(
                node.line,
                format!(
                    "{what}: expected a list of rules, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        let allowed: &[RuleWhen] = if job_level {
            &[
                RuleWhen::OnSuccess,
                RuleWhen::OnFailure,
                RuleWhen::Always,
                RuleWhen::Manual,
                RuleWhen::Delayed,
                RuleWhen::Never,
            ]
        } else {
            &[RuleWhen::Always, RuleWhen::Never]
        };
        let mut out = Vec::new();
        let mut ok = true;
        for item in items {
            let Some(entries) = item.as_map() else {
                self.error(
                    item.line,
                    format!(
                        "{what}: expected a rule (a mapping of if, changes, exists, when, ...), found {}",
                        item.describe()
                    ),
                );
                ok = false;
                continue;
            };
            let mut rule = Rule::default();
            for e in entries {
                let sub = format!("{what}:{}", e.key);
                let v = &e.value;
                match e.key.as_str() {
                    "if" => match self.expression(&sub, v) {
                        Some(x) => rule.cond = Some(x),
                        None => ok = false,
                    },
                    "exists" => {
                        // `exists: {paths: [...], project: ...}` names the paths under a key.
                        let paths = v.get("paths").map_or(v, |p| &p.value);
                        rule.exists = self.patterns(&sub, paths);
                        ok &= rule.exists.is_some();
                    }
                    "changes" => {
                        rule.changes = self.changes(&sub, v);
                        ok &= rule.changes.is_some();
                    }
                    "when" => match self.rule_when(&sub, v, allowed) {
                        Some(w) => rule.when = Some(w),
                        None => ok = false,
                    },
                    "variables" => rule.variables = self.variables(&sub, v),
                    "allow_failure" if job_level => match v.as_bool() {
                        Some(b) => rule.allow_failure = Some(b),
                        None => {
                            self.error(
                                v.line,
                                format!("{sub}: expected true or false, found {}", v.describe()),
                            );
                            ok = false;
                        }
                    },
                    "start_in" if job_level => rule.start_in = self.duration(&sub, v),
                    "needs" if job_level => rule.needs = self.needs(what, v),
                    "interruptible" if job_level => rule.interruptible = v.as_bool(),
                    "auto_cancel" if !job_level => {}
                    k => {
                        let known = if job_level {
                            "if, changes, exists, when, allow_failure, variables, needs, start_in or interruptible"
                        } else {
                            "if, changes, exists, when, variables or auto_cancel"
                        };
                        self.error(
                            e.key_line,
                            format!("{what}: unknown key \"{k}\" in a rule (expected {known})"),
                        );
                        ok = false;
                    }
                }
            }
            out.push(rule);
        }
        ok.then_some(out)
    }

    /// `only:` / `except:`: a list of refs, or a mapping of refs, variables and changes.
    pub(super) fn ref_filter(&mut self, what: &str, node: &Node) -> Option<RefFilter> {
        if node.as_map().is_none() {
            return self.patterns(what, node).map(|refs| RefFilter {
                refs: Some(refs),
                ..RefFilter::default()
            });
        }
        let mut f = RefFilter::default();
        for e in node.as_map().unwrap_or_default() {
            let sub = format!("{what}:{}", e.key);
            match e.key.as_str() {
                "refs" => f.refs = Some(self.patterns(&sub, &e.value)?),
                "variables" => {
                    let items: Vec<Node> = match e.value.as_list() {
                        Some(l) => l.to_vec(),
                        None => vec![e.value.clone()],
                    };
                    let mut exprs = Vec::new();
                    for i in &items {
                        exprs.push(self.expression(&sub, i)?);
                    }
                    f.variables = Some(exprs);
                }
                "changes" => f.changes = Some(self.changes(&sub, &e.value)?.paths),
                "kubernetes" => {}
                k => self.error(
                    e.key_line,
                    format!("{what}: unknown key \"{k}\" (expected refs, variables, changes or kubernetes)"),
                ),
            }
        }
        Some(f)
    }
}

impl RuleWhen {
    /// GitLab's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RuleWhen::OnSuccess => "on_success",
            RuleWhen::OnFailure => "on_failure",
            RuleWhen::Always => "always",
            RuleWhen::Manual => "manual",
            RuleWhen::Delayed => "delayed",
            RuleWhen::Never => "never",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |n: &str| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn refs_match_branches_tags_sources_and_patterns() {
        let branch = look(&[
            ("CI_COMMIT_REF_NAME", "feature/x"),
            ("CI_PIPELINE_SOURCE", "push"),
        ]);
        let tag = look(&[
            ("CI_COMMIT_REF_NAME", "v1.0"),
            ("CI_COMMIT_TAG", "v1.0"),
            ("CI_PIPELINE_SOURCE", "push"),
        ]);
        for (entry, on_branch, on_tag) in [
            ("branches", true, false),
            ("tags", false, true),
            ("pushes", true, true),
            ("schedules", false, false),
            ("feature/x", true, false),
            ("/^feature\\//", true, false),
            ("/^v\\d/", false, true),
            ("main@group/project", false, false),
        ] {
            assert_eq!(
                ref_matches(entry, &branch),
                on_branch,
                "{entry} on a branch"
            );
            assert_eq!(ref_matches(entry, &tag), on_tag, "{entry} on a tag");
        }
    }

    #[test]
    fn only_and_except_are_conjoined_as_gitlab_documents() {
        let dir = tempfile::tempdir().unwrap();
        let mut facts = Facts::new(dir.path(), None);
        let vars = look(&[("CI_COMMIT_REF_NAME", "main"), ("DEPLOY", "yes")]);
        let f = |refs: &[&str], vars: &[&str]| RefFilter {
            refs: Some(refs.iter().map(|s| s.to_string()).collect()),
            variables: (!vars.is_empty())
                .then(|| vars.iter().map(|v| Expr::parse(v).unwrap()).collect()),
            changes: None,
        };
        // Default: branches and tags.
        assert!(only_except(None, None, &vars, &mut facts));
        // only: every key must match.
        assert!(only_except(
            Some(&f(&["main"], &["$DEPLOY"])),
            None,
            &vars,
            &mut facts
        ));
        assert!(!only_except(
            Some(&f(&["main"], &["$NOPE"])),
            None,
            &vars,
            &mut facts
        ));
        // except: any key matching drops it.
        assert!(!only_except(
            None,
            Some(&f(&["dev"], &["$DEPLOY"])),
            &vars,
            &mut facts
        ));
        assert!(only_except(
            None,
            Some(&f(&["dev"], &[])),
            &vars,
            &mut facts
        ));
    }

    #[test]
    fn first_matching_rule_decides_with_exists() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "").unwrap();
        let mut facts = Facts::new(dir.path(), None);
        let rules = vec![
            Rule {
                cond: Some(Expr::parse("$X == \"1\"").unwrap()),
                when: Some(RuleWhen::Never),
                ..Rule::default()
            },
            Rule {
                exists: Some(vec!["Docker*".into()]),
                when: Some(RuleWhen::Manual),
                ..Rule::default()
            },
        ];
        let hit = first_match(&rules, &look(&[("X", "1")]), &mut facts).unwrap();
        assert_eq!(hit.when, Some(RuleWhen::Never));
        let hit = first_match(&rules, &look(&[]), &mut facts).unwrap();
        assert_eq!(hit.when, Some(RuleWhen::Manual));
        std::fs::remove_file(dir.path().join("Dockerfile")).unwrap();
        let mut facts = Facts::new(dir.path(), None);
        assert!(first_match(&rules, &look(&[]), &mut facts).is_none());
    }
}
