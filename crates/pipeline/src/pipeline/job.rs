//! One job as written: its keys, what it takes of `default:` (as `inherit:` allows), and whether
//! (and how) each job it expands to is in the pipeline.

use std::time::Duration;

use super::rules::{self, RefFilter, Rule, RuleWhen};
use super::trigger::TriggerSpec;
use super::{
    Defaults, PipelineJob, RawJob, Reader, Retry, SnapshotSpec, ctx_for, keywords, layer, lookup_in,
};
use crate::yaml::Node;
use slipway_job::model::{Variable, When};

/// Job keys this reader implements.
const JOB_KEYS: &[&str] = &[
    "stage",
    "variables",
    "before_script",
    "script",
    "after_script",
    "needs",
    "when",
    "start_in",
    "allow_failure",
    "extends",
    "artifacts",
    "timeout",
    "image",
    "isolation",
    "services",
    "tags",
    "parallel",
    "snapshot",
    "restore",
    "rules",
    "only",
    "except",
    "inherit",
    "retry",
    "resource_group",
    "coverage",
    "interruptible",
    "dependencies",
    "cache",
    "trigger",
];

/// GitLab job keywords this reader does not implement (yet).
const JOB_KEYS_UNSUPPORTED: &[&str] = &["run", "inputs"];

/// `default:` keys this reader implements.
const DEFAULT_KEYS: &[&str] = &[
    "before_script",
    "after_script",
    "timeout",
    "image",
    "tags",
    "isolation",
    "services",
    "snapshot",
    "cache",
    "retry",
    "interruptible",
    "artifacts",
];

/// GitLab `default:` keywords that decide nothing locally (accepted with a warning).
const DEFAULT_KEYS_IGNORED: &[&str] = &["hooks", "id_tokens"];

/// `inherit:default` / `inherit:variables`: what a job takes from the top level.
#[derive(Clone)]
enum Inherit {
    All,
    Nothing,
    Only(Vec<String>),
}

impl Inherit {
    fn keeps(&self, key: &str) -> bool {
        match self {
            Inherit::All => true,
            Inherit::Nothing => false,
            Inherit::Only(keys) => keys.iter().any(|k| k == key),
        }
    }
}

/// What decides whether a job (each of its `parallel:` jobs) is in the pipeline, and how it
/// starts.
#[derive(Clone)]
struct Decide {
    rules: Option<Vec<Rule>>,
    only: Option<RefFilter>,
    except: Option<RefFilter>,
    when: RuleWhen,
    start_in: Option<Duration>,
    allow_failure: Option<bool>,
}

impl Reader<'_> {
    pub(super) fn defaults(&mut self, node: &Node) -> Option<Defaults> {
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!("default: expected a mapping, found {}", node.describe()),
            );
            return None;
        };
        let mut d = Defaults::default();
        for e in entries {
            let v = &e.value;
            match e.key.as_str() {
                "before_script" => d.before_script = self.script("default: before_script", v),
                "after_script" => d.after_script = self.script("default: after_script", v),
                "timeout" => d.timeout = self.timeout("default", v),
                "image" => d.image = self.image("default: image", v),
                "tags" => d.tags = self.string_list("default: tags", v),
                "isolation" => d.isolation = self.string("default: isolation", v),
                "services" => d.services = self.services("default: services", v),
                "snapshot" => match self.snapshot("default", v) {
                    Some(SnapshotSpec::Save { line, .. }) => self.error(
                        line,
                        "default: snapshot: only on_failure is allowed here \
                         (a saved snapshot is named on each job)",
                    ),
                    spec => d.snapshot = spec,
                },
                // Not a GitLab keyword, so "unknown key" would mislead: say why it is refused.
                "restore" => self.error(
                    e.key_line,
                    "default: restore: not allowed here (name the snapshot to restore on each job)",
                ),
                "cache" => d.cache = self.cache("default: cache", v),
                "retry" => d.retry = self.retry("default: retry", v),
                "interruptible" => d.interruptible = v.as_bool(),
                "artifacts" => d.artifacts = Some(v.clone()),
                k if DEFAULT_KEYS_IGNORED.contains(&k) => self.ignore(e.key_line, "default", k),
                k => self.unknown(
                    e.key_line,
                    "default",
                    k,
                    &[DEFAULT_KEYS, DEFAULT_KEYS_IGNORED],
                ),
            }
        }
        Some(d)
    }

    pub(super) fn job(
        &mut self,
        name: &str,
        line: usize,
        node: &Node,
        defaults: &Defaults,
        global_vars: &[Variable],
    ) -> Option<Vec<RawJob>> {
        let ctx = ctx_for(name);
        let entries = node.as_map()?;
        let mut job = PipelineJob {
            name: name.to_string(),
            stage: "test".into(),
            stage_index: 0,
            variables: Vec::new(),
            before_script: Vec::new(),
            script: Vec::new(),
            after_script: Vec::new(),
            needs: None,
            when: When::OnSuccess,
            allow_failure: false,
            timeout: None,
            artifact_paths: Vec::new(),
            artifacts_when: When::OnSuccess,
            image: None,
            isolation: None,
            services: Vec::new(),
            tags: Vec::new(),
            parallel: None,
            snapshot: None,
            restore: None,
            manual: false,
            start_in: None,
            allow_failure_exit_codes: Vec::new(),
            retry: Retry::default(),
            resource_group: None,
            coverage: None,
            interruptible: false,
            dotenv: Vec::new(),
            dependencies: None,
            cache: Vec::new(),
            artifacts_exclude: Vec::new(),
            artifacts_untracked: false,
            line,
            trigger: None,
            upstream: None,
            parent_artifacts: Vec::new(),
        };
        let mut stage_line = line;
        let mut needs = None;
        let (mut before, mut after, mut script) = (None, None, None);
        let (mut timeout, mut image, mut tags, mut isolation) = (None, None, None, None);
        let mut services = None;
        let (mut parallel, mut snapshot, mut restore) = (None, None, None);
        let (mut retry, mut interruptible, mut cache) = (None, None, None);
        let mut own_vars = Vec::new();
        let mut failed = false;
        let mut trigger = None;
        let mut has_artifacts = false;
        let (mut inherit_default, mut inherit_vars) = (Inherit::All, Inherit::All);
        let mut decide = Decide {
            rules: None,
            only: None,
            except: None,
            when: RuleWhen::OnSuccess,
            start_in: None,
            allow_failure: None,
        };
        for e in entries {
            let v = &e.value;
            let key = e.key.as_str();
            let what = format!("{ctx}: {key}");
            match key {
                "stage" => {
                    stage_line = e.key_line;
                    match self.string(&what, v) {
                        Some(s) => job.stage = s,
                        None => failed = true,
                    }
                }
                "variables" => own_vars = self.variables(&what, v),
                "before_script" => before = self.script(&what, v),
                "script" => {
                    script = self.script(&what, v);
                    failed |= script.is_none();
                }
                "after_script" => after = self.script(&what, v),
                "needs" => needs = self.needs(&ctx, v),
                "when" => {
                    let allowed = [
                        RuleWhen::OnSuccess,
                        RuleWhen::OnFailure,
                        RuleWhen::Always,
                        RuleWhen::Manual,
                        RuleWhen::Delayed,
                    ];
                    match self.rule_when(&what, v, &allowed) {
                        Some(w) => decide.when = w,
                        None => failed = true,
                    }
                }
                "start_in" => decide.start_in = self.duration(&what, v),
                "allow_failure" => match self.allow_failure(&what, v) {
                    Some((b, codes)) => {
                        decide.allow_failure = Some(b);
                        job.allow_failure_exit_codes = codes;
                    }
                    None => failed = true,
                },
                "rules" => match self.rules(&format!("{ctx}: rules"), v, true) {
                    Some(r) => decide.rules = Some(r),
                    None => failed = true,
                },
                // A null `only`/`except` is not set (it cancels an inherited one), as in GitLab.
                "only" | "except" if v.is_null() => {}
                "only" => decide.only = self.ref_filter(&what, v),
                "except" => decide.except = self.ref_filter(&what, v),
                "inherit" => (inherit_default, inherit_vars) = self.inherit(&what, v),
                "retry" => retry = self.retry(&what, v),
                "resource_group" => job.resource_group = self.string(&what, v),
                "coverage" => job.coverage = self.coverage(&what, v),
                "interruptible" => match v.as_bool() {
                    Some(b) => interruptible = Some(b),
                    None => self.error(
                        v.line,
                        format!("{what}: expected true or false, found {}", v.describe()),
                    ),
                },
                // `dependencies:` with no value is unset to GitLab: artifacts as by default.
                "dependencies" if v.is_null() => {}
                "dependencies" => job.dependencies = self.string_list(&what, v),
                "cache" => cache = self.cache(&what, v),
                "trigger" => match self.trigger(&ctx, v) {
                    Some(t) => trigger = Some(t),
                    None => failed = true,
                },
                "artifacts" => {
                    has_artifacts = true;
                    self.artifacts(&ctx, v, &mut job);
                }
                "timeout" => timeout = self.timeout(&ctx, v),
                "image" => image = self.image(&what, v),
                "isolation" => isolation = self.string(&what, v),
                "services" => services = self.services(&what, v),
                "tags" => tags = self.string_list(&what, v),
                // A bad `parallel:` is reported and the job kept whole, so that jobs needing it
                // do not add "unknown job" errors.
                "parallel" => parallel = self.parallel(&ctx, v),
                "snapshot" => snapshot = self.snapshot(&ctx, v),
                "restore" => match v.as_scalar() {
                    Some(name) => restore = Some((name.to_string(), v.line)),
                    None => self.error(
                        v.line,
                        format!("{what}: expected a snapshot name, found {}", v.describe()),
                    ),
                },
                k if keywords::IGNORED_JOB_KEYS.contains(&k) => self.ignore(e.key_line, &ctx, k),
                k if JOB_KEYS_UNSUPPORTED.contains(&k) => self.unsupported(e.key_line, &ctx, k),
                k => self.unknown(
                    e.key_line,
                    &ctx,
                    k,
                    &[JOB_KEYS, JOB_KEYS_UNSUPPORTED, keywords::IGNORED_JOB_KEYS],
                ),
            }
        }
        if let Some(TriggerSpec::Skip(why)) = &trigger {
            self.warn(line, why.clone());
            return Some(Vec::new());
        }
        if decide.rules.is_some() && (decide.only.is_some() || decide.except.is_some()) {
            self.error(
                line,
                format!("{ctx}: rules cannot be used together with only or except"),
            );
            failed = true;
        }
        let delayed_without_start = |r: &Rule| {
            r.when == Some(RuleWhen::Delayed) && r.start_in.is_none() && decide.start_in.is_none()
        };
        if (decide.when == RuleWhen::Delayed
            && decide.start_in.is_none()
            && decide
                .rules
                .as_ref()
                .is_none_or(|r| r.iter().all(|r| r.start_in.is_none())))
            || decide
                .rules
                .as_ref()
                .is_some_and(|r| r.iter().any(delayed_without_start))
        {
            self.error(
                line,
                format!(
                    "{ctx}: when: delayed needs start_in (how long to wait, e.g. \"30 seconds\")"
                ),
            );
            failed = true;
        }
        if trigger.is_some() {
            if let Some(e) = node.get("script") {
                self.error(
                    e.key_line,
                    format!("{ctx}: a trigger job runs no script; remove \"script\""),
                );
                failed = true;
            }
        } else if node.get("script").is_none() {
            self.error(
                line,
                format!("{ctx}: missing \"script\" (every job needs one)"),
            );
            failed = true;
        }
        if failed {
            return None;
        }
        let d = |key: &str| inherit_default.keeps(key);
        job.script = script.unwrap_or_default();
        job.before_script = before
            .or_else(|| d("before_script").then(|| defaults.before_script.clone())?)
            .unwrap_or_default();
        job.after_script = after
            .or_else(|| d("after_script").then(|| defaults.after_script.clone())?)
            .unwrap_or_default();
        job.timeout = timeout.or(defaults.timeout.filter(|_| d("timeout")));
        job.image = image.or_else(|| d("image").then(|| defaults.image.clone())?);
        job.tags = tags
            .or_else(|| d("tags").then(|| defaults.tags.clone())?)
            .unwrap_or_default();
        job.isolation = isolation.or_else(|| defaults.isolation.clone());
        job.services = services
            .or_else(|| d("services").then(|| defaults.services.clone())?)
            .unwrap_or_default();
        job.cache = cache
            .or_else(|| d("cache").then(|| defaults.cache.clone())?)
            .unwrap_or_default();
        job.retry = retry
            .or_else(|| d("retry").then(|| defaults.retry.clone())?)
            .unwrap_or_default();
        job.interruptible = interruptible
            .or(defaults.interruptible.filter(|_| d("interruptible")))
            .unwrap_or(false);
        if !has_artifacts
            && d("artifacts")
            && let Some(a) = &defaults.artifacts
        {
            self.artifacts(&ctx, a, &mut job);
        }
        job.variables = global_vars
            .iter()
            .filter(|g| inherit_vars.keeps(&g.key))
            .cloned()
            .collect();
        layer(&mut job.variables, own_vars);
        let snapshot = snapshot.or_else(|| defaults.snapshot.clone());
        let base = RawJob {
            job,
            stage_line,
            needs,
            trigger,
            forward: Vec::new(),
        };
        let instances = self.instances(base, parallel, snapshot, restore);
        Some(
            instances
                .into_iter()
                .filter_map(|raw| self.decide(raw, &decide))
                .collect(),
        )
    }

    /// Whether one job is in the pipeline, and how it starts, by its rules (or only/except):
    /// `None` leaves it out. Its variables become the full set it runs with.
    fn decide(&mut self, mut raw: RawJob, d: &Decide) -> Option<RawJob> {
        let scope = self.scope(&raw.job.variables);
        let lookup = |n: &str| lookup_in(&scope, n);
        let (when, rule) = match &d.rules {
            Some(rules) => {
                let rule = rules::first_match(rules, &lookup, &mut self.facts)?;
                (rule.when.unwrap_or(d.when), Some(rule))
            }
            None => {
                let kept = rules::only_except(
                    d.only.as_ref(),
                    d.except.as_ref(),
                    &lookup,
                    &mut self.facts,
                );
                if !kept {
                    return None;
                }
                (d.when, None)
            }
        };
        let job = &mut raw.job;
        job.when = match when {
            RuleWhen::Never => return None,
            RuleWhen::OnFailure => When::OnFailure,
            RuleWhen::Always => When::Always,
            RuleWhen::OnSuccess | RuleWhen::Manual | RuleWhen::Delayed => When::OnSuccess,
        };
        job.manual = when == RuleWhen::Manual;
        if when == RuleWhen::Delayed {
            job.start_in = rule.and_then(|r| r.start_in).or(d.start_in);
        }
        // A manual job outside rules may fail by default (it does not block the pipeline);
        // inside rules it blocks unless it says otherwise (GitLab's defaults).
        let explicit = rule.and_then(|r| r.allow_failure).or(d.allow_failure);
        job.allow_failure = explicit.unwrap_or(job.manual && rule.is_none());
        if rule.is_some_and(|r| r.allow_failure.is_some()) {
            // The rule's allow_failure replaces the job's whole setting, exit codes included.
            job.allow_failure_exit_codes.clear();
        }
        if let Some(r) = rule {
            layer(&mut job.variables, r.variables.iter().cloned());
            if let Some(n) = &r.needs {
                raw.needs = Some(n.clone());
            }
            if let Some(i) = r.interruptible {
                job.interruptible = i;
            }
        }
        if raw.trigger.is_some() {
            raw.forward = job.variables.clone();
        }
        let mut all = self.predefined.to_vec();
        layer(&mut all, std::mem::take(&mut job.variables));
        layer(&mut all, self.user.iter().cloned());
        job.variables = all;
        Some(raw)
    }

    /// `inherit:`: what the job takes of `default:` and of the global `variables:`.
    fn inherit(&mut self, what: &str, node: &Node) -> (Inherit, Inherit) {
        let mut out = (Inherit::All, Inherit::All);
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{what}: expected a mapping (default, variables), found {}",
                    node.describe()
                ),
            );
            return out;
        };
        for e in entries {
            let value = match e.value.as_bool() {
                Some(true) => Inherit::All,
                Some(false) => Inherit::Nothing,
                None => match self.string_list(&format!("{what}:{}", e.key), &e.value) {
                    Some(keys) => Inherit::Only(keys),
                    None => continue,
                },
            };
            match e.key.as_str() {
                "default" => out.0 = value,
                "variables" => out.1 = value,
                k => self.error(
                    e.key_line,
                    format!("{what}: unknown key \"{k}\" (expected default or variables)"),
                ),
            }
        }
        out
    }
}
