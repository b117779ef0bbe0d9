//! Readers of single job keys with a structure of their own: `snapshot`, `artifacts`, `needs`,
//! `when`, `timeout`, `image` and `services` (the latter two also in `default:` and at the top
//! level).

use std::time::Duration;

use super::{PipelineJob, RawNeed, Reader, SnapshotSpec, split_ctx};
use crate::yaml::{Kind, Node};
use slipway_job::model::{Image, When};

impl Reader<'_> {
    /// `snapshot: on_failure` or `snapshot: {save: NAME}`; `ctx` names the job or `default`.
    pub(super) fn snapshot(&mut self, ctx: &str, node: &Node) -> Option<SnapshotSpec> {
        let expected = "on_failure or {save: NAME}";
        if let Some(text) = node.as_scalar() {
            if text == "on_failure" {
                return Some(SnapshotSpec::OnFailure);
            }
            self.error(
                node.line,
                format!("{ctx}: snapshot: unknown value {text:?} (expected {expected})"),
            );
            return None;
        }
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{ctx}: snapshot: expected {expected}, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        let mut spec = None;
        for e in entries {
            match e.key.as_str() {
                "save" => match e.value.as_scalar() {
                    Some(name) => {
                        spec = Some(SnapshotSpec::Save {
                            name: name.to_string(),
                            line: e.value.line,
                        })
                    }
                    None => self.error(
                        e.value.line,
                        format!(
                            "{ctx}: snapshot:save: expected a snapshot name, found {}",
                            e.value.describe()
                        ),
                    ),
                },
                k => self.error(
                    e.key_line,
                    format!("{ctx}: snapshot: unknown key \"{k}\" (expected save)"),
                ),
            }
        }
        if node.get("save").is_none() {
            self.error(node.line, format!("{ctx}: snapshot: missing \"save\""));
        }
        spec
    }

    pub(super) fn artifacts(&mut self, ctx: &str, node: &Node, job: &mut PipelineJob) {
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{ctx}: artifacts: expected a mapping, found {}",
                    node.describe()
                ),
            );
            return;
        };
        for e in entries {
            match e.key.as_str() {
                "paths" => {
                    // Absolute paths and `..` are the runner's to judge (GitLab accepts the
                    // file): inside the project directory they are collected, outside a warning.
                    job.artifact_paths = self
                        .string_list(&format!("{ctx}: artifacts:paths"), &e.value)
                        .unwrap_or_default();
                }
                "when" => {
                    if let Some(w) = self.when(&format!("{ctx}: artifacts:when"), &e.value, false) {
                        job.artifacts_when = w;
                    }
                }
                "exclude" => {
                    job.artifacts_exclude = self
                        .string_list(&format!("{ctx}: artifacts:exclude"), &e.value)
                        .unwrap_or_default()
                }
                "untracked" => job.artifacts_untracked = e.value.as_bool().unwrap_or(false),
                // Names and lifetimes of stored artifacts: nothing is stored past the run.
                "name" | "expire_in" | "expose_as" | "public" | "access" => {}
                "reports" => {
                    for r in e.value.as_map().unwrap_or_default() {
                        if r.key == "dotenv" {
                            job.dotenv = match r.value.as_scalar() {
                                Some(p) => vec![p.to_string()],
                                None => self
                                    .string_list(
                                        &format!("{ctx}: artifacts:reports:dotenv"),
                                        &r.value,
                                    )
                                    .unwrap_or_default(),
                            };
                        } else {
                            self.ignore(r.key_line, ctx, &format!("artifacts:reports:{}", r.key));
                        }
                    }
                }
                k => self.unknown(
                    e.key_line,
                    &format!("{ctx}: artifacts"),
                    k,
                    &[&[
                        "paths",
                        "when",
                        "exclude",
                        "untracked",
                        "name",
                        "expire_in",
                        "expose_as",
                        "public",
                        "access",
                        "reports",
                    ]],
                ),
            }
        }
    }

    pub(super) fn needs(&mut self, ctx: &str, node: &Node) -> Option<Vec<RawNeed>> {
        let Kind::Seq(items) = &node.kind else {
            self.error(
                node.line,
                format!(
                    "{ctx}: needs: expected a list of job names, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        // A list inside the list (an anchored list used as one item) is flattened, as GitLab
        // does.
        let mut flat = Vec::new();
        flatten(items, &mut flat);
        let mut out = Vec::new();
        for item in flat {
            if let Some(name) = item.as_scalar() {
                out.push(RawNeed {
                    job: name.to_string(),
                    artifacts: true,
                    optional: false,
                    line: item.line,
                    matrix: None,
                    parent: false,
                });
                continue;
            }
            let Some(entries) = item.as_map() else {
                self.error(
                    item.line,
                    format!(
                        "{ctx}: needs: expected a job name or {{job: NAME, artifacts: BOOL}}, found {}",
                        item.describe()
                    ),
                );
                continue;
            };
            // Artifacts of another project's or the parent pipeline's job: GitLab fetches them
            // from its own store, which a local run does not have. The job runs without them.
            // A child pipeline's need on its parent's job: its artifacts, as GitLab passes them.
            let from_parent = entries.iter().find(|e| {
                e.key == "pipeline"
                    && matches!(
                        e.value.as_scalar().map(str::trim),
                        Some("$PARENT_PIPELINE_ID" | "${PARENT_PIPELINE_ID}")
                    )
            });
            if let Some(e) = from_parent.filter(|_| self.depth > 0) {
                let artifacts = item
                    .get("artifacts")
                    .and_then(|a| a.value.as_bool())
                    .unwrap_or(true);
                match item.get("job").and_then(|j| j.value.as_scalar()) {
                    Some(job) if artifacts => out.push(RawNeed {
                        job: job.to_string(),
                        artifacts: true,
                        optional: false,
                        line: e.key_line,
                        matrix: None,
                        parent: true,
                    }),
                    Some(_) => {}
                    None => self.error(
                        item.line,
                        format!("{ctx}: needs:pipeline: an entry is missing \"job\""),
                    ),
                }
                continue;
            }
            if let Some(e) = entries
                .iter()
                .find(|e| e.key == "project" || e.key == "pipeline")
            {
                let job = item
                    .get("job")
                    .and_then(|j| j.value.as_scalar())
                    .unwrap_or("?");
                self.warn(
                    e.key_line,
                    format!(
                        "{ctx}: needs:{}: the artifacts of job \"{job}\" of {} are not fetched \
                         in a local run; the job runs without them",
                        e.key,
                        if e.key == "project" {
                            "another project"
                        } else {
                            "another pipeline"
                        }
                    ),
                );
                continue;
            }
            let mut need = RawNeed {
                job: String::new(),
                artifacts: true,
                optional: false,
                line: item.line,
                matrix: None,
                parent: false,
            };
            for e in entries {
                match e.key.as_str() {
                    "job" => match e.value.as_scalar() {
                        Some(j) => {
                            need.job = j.to_string();
                            need.line = e.value.line;
                        }
                        None => self.error(
                            e.key_line,
                            format!(
                                "{ctx}: needs:job: expected a job name, found {}",
                                e.value.describe()
                            ),
                        ),
                    },
                    k @ ("artifacts" | "optional") => match e.value.as_bool() {
                        Some(b) if k == "artifacts" => need.artifacts = b,
                        Some(b) => need.optional = b,
                        None => self.error(
                            e.key_line,
                            format!(
                                "{ctx}: needs:{k}: expected true or false, found {}",
                                e.value.describe()
                            ),
                        ),
                    },
                    "parallel" => match e.value.get("matrix") {
                        Some(m) => {
                            need.matrix = self.matrix(ctx, m.key_line, &m.value);
                        }
                        None => self.error(
                            e.key_line,
                            format!("{ctx}: needs:parallel: expected {{matrix: [...]}}"),
                        ),
                    },
                    k => self.unsupported(e.key_line, ctx, &format!("needs:{k}")),
                }
            }
            if need.job.is_empty() {
                if entries.iter().all(|e| e.key != "job") {
                    self.error(
                        item.line,
                        format!("{ctx}: needs: an entry is missing \"job\""),
                    );
                }
                continue;
            }
            out.push(need);
        }
        Some(out)
    }

    fn when(&mut self, what: &str, node: &Node, job_level: bool) -> Option<When> {
        match node.as_scalar() {
            Some("on_success") => Some(When::OnSuccess),
            Some("on_failure") => Some(When::OnFailure),
            Some("always") => Some(When::Always),
            Some(w @ ("manual" | "delayed")) if job_level => {
                self.error(node.line, format!("{what}: \"{w}\" is not supported yet"));
                None
            }
            Some(w) => {
                self.error(
                    node.line,
                    format!(
                        "{what}: unknown value \"{w}\" (expected on_success, on_failure or always)"
                    ),
                );
                None
            }
            None => {
                self.error(
                    node.line,
                    format!(
                        "{what}: expected on_success, on_failure or always, found {}",
                        node.describe()
                    ),
                );
                None
            }
        }
    }

    pub(super) fn timeout(&mut self, ctx: &str, node: &Node) -> Option<Duration> {
        self.duration(&format!("{ctx}: timeout"), node)
    }

    /// `image:`: a name, or `{name, pull_policy, entrypoint, docker}`.
    pub(super) fn image(&mut self, what: &str, node: &Node) -> Option<Image> {
        if let Some(name) = node.as_scalar() {
            return Some(Image::named(name));
        }
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!("{what}: expected an image name, found {}", node.describe()),
            );
            return None;
        };
        let mut image = Image::default();
        for e in entries {
            let sub = format!("{what}:{}", e.key);
            match e.key.as_str() {
                "name" => image.name = self.string(&sub, &e.value)?,
                "entrypoint" => image.entrypoint = self.string_list(&sub, &e.value)?,
                "pull_policy" => image.pull_policy = self.pull_policy(&sub, &e.value)?,
                "docker" => {
                    image.executor_opts = serde_json::json!({ "docker": yaml_to_json(&e.value) })
                }
                k => {
                    let (ctx, key) = split_ctx(what);
                    self.unsupported(e.key_line, ctx, &format!("{key}:{k}"))
                }
            }
        }
        if image.name.is_empty() {
            self.error(node.line, format!("{what}: missing \"name\""));
            return None;
        }
        Some(image)
    }

    /// `pull_policy:` of an image or a service: one policy or a list of them.
    fn pull_policy(&mut self, what: &str, node: &Node) -> Option<Vec<String>> {
        let policies = match node.as_scalar() {
            Some(p) => vec![p.to_string()],
            None => self.string_list(what, node)?,
        };
        for p in &policies {
            if !matches!(p.as_str(), "always" | "if-not-present" | "never") {
                self.error(
                    node.line,
                    format!(
                        "{what}: unknown policy \"{p}\" (expected always, if-not-present or never)"
                    ),
                );
                return None;
            }
        }
        Some(policies)
    }

    /// `services:`: image names, or maps with `name`, `alias`, `entrypoint`, `command`,
    /// `variables`, `pull_policy` and `docker` options.
    pub(super) fn services(&mut self, what: &str, node: &Node) -> Option<Vec<Image>> {
        if node.is_null() {
            return Some(Vec::new());
        }
        let Some(items) = node.as_list() else {
            self.error(
                node.line,
                format!(
                    "{what}: expected a list of services, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        let mut out = Vec::new();
        for item in items {
            if let Some(name) = item.as_scalar() {
                out.push(Image::named(name));
                continue;
            }
            let Some(entries) = item.as_map() else {
                self.error(
                    item.line,
                    format!(
                        "{what}: expected an image name or a mapping, found {}",
                        item.describe()
                    ),
                );
                continue;
            };
            let mut svc = Image::default();
            for e in entries {
                let sub = format!("{what}:{}", e.key);
                match e.key.as_str() {
                    "name" => svc.name = self.string(&sub, &e.value).unwrap_or_default(),
                    "alias" => svc.alias = self.string(&sub, &e.value).unwrap_or_default(),
                    "entrypoint" => {
                        svc.entrypoint = self.string_list(&sub, &e.value).unwrap_or_default()
                    }
                    "command" => svc.command = self.string_list(&sub, &e.value).unwrap_or_default(),
                    "variables" => svc.variables = self.variables(&sub, &e.value),
                    "pull_policy" => {
                        svc.pull_policy = self.pull_policy(&sub, &e.value).unwrap_or_default()
                    }
                    "docker" => {
                        svc.executor_opts = serde_json::json!({ "docker": yaml_to_json(&e.value) })
                    }
                    k => {
                        let (ctx, key) = split_ctx(what);
                        self.unsupported(e.key_line, ctx, &format!("{key}:{k}"))
                    }
                }
            }
            if svc.name.is_empty() {
                self.error(item.line, format!("{what}: a service needs a \"name\""));
                continue;
            }
            out.push(svc);
        }
        Some(out)
    }
}

/// A YAML node as JSON (scalars as strings), for options passed through to executors.
fn yaml_to_json(node: &Node) -> serde_json::Value {
    match &node.kind {
        _ if node.is_null() => serde_json::Value::Null,
        Kind::Scalar { text, .. } => serde_json::Value::String(text.clone()),
        Kind::Seq(items) => items.iter().map(yaml_to_json).collect(),
        Kind::Map(entries) => entries
            .iter()
            .map(|e| (e.key.clone(), yaml_to_json(&e.value)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Kind::Reference(_) => serde_json::Value::Null,
    }
}

/// The items of `items`, lists among them replaced by their own items, recursively.
fn flatten<'a>(items: &'a [Node], out: &mut Vec<&'a Node>) {
    for item in items {
        match &item.kind {
            Kind::Seq(inner) => flatten(inner, out),
            _ => out.push(item),
        }
    }
}
