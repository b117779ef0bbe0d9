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
use crate::model::Variable;

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
    pub needs: Option<super::NeedsSpec>,
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

    fn exists(&mut self, patterns: &[String], lookup: &dyn Fn(&str) -> Option<String>) -> bool {
        let listing = self
            .listing
            .get_or_insert_with(|| glob::files(self.project_dir));
        patterns.iter().any(|p| {
            let p = super::variables::expand(p, lookup);
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
            let p = super::variables::expand(p, lookup);
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
            Expr::parse(&format!("$R =~ {entry}")).is_ok_and(|e| {
                e.eval(&|n: &str| (n == "R").then(|| ref_name.clone()))
            })
        }
        name => name == ref_name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |n: &str| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
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
            assert_eq!(ref_matches(entry, &branch), on_branch, "{entry} on a branch");
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
        assert!(only_except(Some(&f(&["main"], &["$DEPLOY"])), None, &vars, &mut facts));
        assert!(!only_except(Some(&f(&["main"], &["$NOPE"])), None, &vars, &mut facts));
        // except: any key matching drops it.
        assert!(!only_except(None, Some(&f(&["dev"], &["$DEPLOY"])), &vars, &mut facts));
        assert!(only_except(None, Some(&f(&["dev"], &[])), &vars, &mut facts));
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
