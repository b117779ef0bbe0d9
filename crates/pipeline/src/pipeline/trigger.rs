//! `trigger:`: a job that starts a downstream pipeline.
//!
//! A child pipeline (`trigger: include:`) is read here as GitLab reads one: a configuration
//! made of the listed files (a string is a local file), with its own stages, `workflow:rules`
//! and `include:`s, `CI_PIPELINE_SOURCE=parent_pipeline`, and the trigger job's YAML variables
//! (global ones it inherits and its own) passed down over the child's own, as GitLab's
//! `forward:yaml_variables` (default true) does. Its jobs join [`Pipeline::jobs`] right after
//! the trigger job, named `trigger > job` (see [`CHILD_SEPARATOR`]). A child may trigger its
//! own child, down to GitLab's limit of [`MAX_CHILD_DEPTH`] levels.
//!
//! A multi-project pipeline (`trigger: project`) and a child made from a job's artifact have no
//! place in a local run: the job is left out with a warning.

use super::{Diagnostic, PipelineJob, Reader, ctx_for, layer};
use crate::pipeline::{Pipeline, read_inner};
use crate::yaml::{Kind, Node};
use slipway_job::model::Variable;

/// What joins a trigger job's name and its child pipeline's job names (`deploy > test`).
pub const CHILD_SEPARATOR: &str = " > ";

/// Levels of child pipelines below the top one that GitLab allows.
pub const MAX_CHILD_DEPTH: usize = 2;

/// Name of the configuration made of `trigger:include:`; its problems are reported at the
/// trigger job's `include:` line instead.
const SYNTHETIC: &str = "\u{0}trigger-include";

/// A trigger job's downstream pipeline, as the run needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    /// `strategy: depend`: the trigger job's status follows its child pipeline's; without it,
    /// the trigger job succeeds once the child pipeline is created.
    pub depend: bool,
    /// Why the child pipeline is not created (its `workflow:rules`, or every job left out): the
    /// trigger job then fails, as in GitLab.
    pub excluded: Option<String>,
}

/// `trigger:` as written.
#[derive(Debug, Clone)]
pub(super) enum TriggerSpec {
    /// A child pipeline from these `include:` entries (each a mapping).
    Child {
        include: Vec<Node>,
        depend: bool,
        forward_yaml: bool,
        line: usize,
    },
    /// Not run locally; the warning says why.
    Skip(String),
}

impl Reader<'_> {
    /// Reads `trigger:`; `None` after reporting an error.
    pub(super) fn trigger(&mut self, ctx: &str, node: &Node) -> Option<TriggerSpec> {
        let multi = || {
            TriggerSpec::Skip(format!(
                "{ctx}: trigger: project starts a multi-project pipeline, which a local run \
                 does not have; not run"
            ))
        };
        if node.as_scalar().is_some() {
            return Some(multi());
        }
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{ctx}: trigger: expected a project path or a mapping (include, project, \
                     strategy, forward), found {}",
                    node.describe()
                ),
            );
            return None;
        };
        let (mut include, mut depend, mut forward_yaml) = (None, false, true);
        let mut project = false;
        let mut ok = true;
        for e in entries {
            let v = &e.value;
            match e.key.as_str() {
                "include" => include = Some((e.key_line, v)),
                "project" | "branch" => project = true,
                "strategy" => match v.as_scalar() {
                    Some("depend") => depend = true,
                    _ => {
                        self.error(
                            v.line,
                            format!(
                                "{ctx}: trigger: strategy: expected depend, found {}",
                                shown(v)
                            ),
                        );
                        ok = false;
                    }
                },
                "forward" => forward_yaml = self.forward(ctx, v).unwrap_or(true),
                k => {
                    self.error(
                        e.key_line,
                        format!(
                            "{ctx}: trigger: unknown key \"{k}\" (expected include, project, \
                             branch, strategy or forward)"
                        ),
                    );
                    ok = false;
                }
            }
        }
        if project {
            return Some(multi());
        }
        let Some((line, include)) = include else {
            self.error(
                node.line,
                format!("{ctx}: trigger: needs include (a child pipeline) or project"),
            );
            return None;
        };
        let items: Vec<&Node> = match &include.kind {
            Kind::Seq(items) => items.iter().collect(),
            _ => vec![include],
        };
        let mut out = Vec::new();
        for item in items {
            if let Some(path) = item.as_scalar() {
                // A string is a file of the project (GitLab's `trigger:include: path`).
                out.push(Node {
                    line: item.line,
                    kind: Kind::Map(vec![crate::yaml::Entry {
                        key: "local".into(),
                        key_line: item.line,
                        value: Node {
                            line: item.line,
                            kind: Kind::Scalar {
                                text: path.to_string(),
                                plain: false,
                            },
                        },
                    }]),
                });
            } else if item.get("artifact").is_some() {
                return Some(TriggerSpec::Skip(format!(
                    "{ctx}: trigger: include: artifact is a configuration another job makes, \
                     which is not read before the run; not run"
                )));
            } else if item.as_map().is_some() {
                out.push(item.clone());
            } else {
                self.error(
                    item.line,
                    format!(
                        "{ctx}: trigger: include: expected a file path or a mapping (local, \
                         project and file), found {}",
                        item.describe()
                    ),
                );
                ok = false;
            }
        }
        ok.then_some(TriggerSpec::Child {
            include: out,
            depend,
            forward_yaml,
            line,
        })
    }

    /// `trigger:forward:`: whether YAML variables go down (`pipeline_variables` decides
    /// nothing here: the user's variables reach every pipeline, as project variables do).
    fn forward(&mut self, ctx: &str, node: &Node) -> Option<bool> {
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{ctx}: trigger: forward: expected a mapping, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        let mut yaml = None;
        for e in entries {
            let Some(b) = e.value.as_bool() else {
                self.error(
                    e.value.line,
                    format!(
                        "{ctx}: trigger: forward: {}: expected true or false, found {}",
                        e.key,
                        e.value.describe()
                    ),
                );
                continue;
            };
            match e.key.as_str() {
                "yaml_variables" => yaml = Some(b),
                "pipeline_variables" => {}
                k => self.error(
                    e.key_line,
                    format!(
                        "{ctx}: trigger: forward: unknown key \"{k}\" (expected yaml_variables \
                         or pipeline_variables)"
                    ),
                ),
            }
        }
        yaml
    }

    /// Reads the child pipeline of trigger job `bridge` (variables `forward` passed down) and
    /// returns its jobs, renamed under the trigger job, and what the run needs of it. Problems
    /// in it are reported here, at its own files and lines.
    pub(super) fn child(
        &mut self,
        bridge: &PipelineJob,
        spec: &TriggerSpec,
        forward: &[Variable],
    ) -> Option<(Trigger, Vec<PipelineJob>)> {
        let TriggerSpec::Child {
            include,
            depend,
            forward_yaml,
            line,
        } = spec
        else {
            return None;
        };
        let ctx = ctx_for(&bridge.name);
        if self.depth >= MAX_CHILD_DEPTH {
            // GitLab reads the file and fails this trigger job when it runs.
            let why = format!(
                "a child pipeline can have no child of its own beyond {MAX_CHILD_DEPTH} levels \
                 of child pipelines (GitLab's limit)"
            );
            self.warn(
                *line,
                format!("{ctx}: trigger: {why}; the trigger job fails when it runs"),
            );
            return Some((
                Trigger {
                    depend: *depend,
                    excluded: Some(why),
                },
                Vec::new(),
            ));
        }
        let items: Vec<String> = include.iter().map(flow).collect();
        let text = format!("include: [{}]\n", items.join(", "));
        let mut opts = self.opts.clone();
        layer(
            &mut opts.predefined,
            [Variable::new("CI_PIPELINE_SOURCE", "parent_pipeline")],
        );
        // Passed down as pipeline variables: over the child's own; the user's still win.
        let mut vars = if *forward_yaml {
            forward.to_vec()
        } else {
            Vec::new()
        };
        layer(&mut vars, self.opts.variables.iter().cloned());
        opts.variables = vars;
        let (file, own_line) = {
            let (f, l) = self.sources.locate(*line);
            (f.to_string(), l)
        };
        let order = *line;
        let (pipeline, errors, warnings) =
            read_inner(&text, SYNTHETIC, None, &opts, self.depth + 1);
        let place = |mut d: Diagnostic| {
            if d.file == SYNTHETIC {
                d.file = file.clone();
                d.line = own_line;
                d.message = format!("{ctx}: trigger: {}", d.message);
            } else {
                d.message = format!("child pipeline of {ctx}: {}", d.message);
            }
            d.order = order;
            d
        };
        let failed = !errors.is_empty();
        self.errors.extend(errors.into_iter().map(place));
        self.ignored.extend(warnings.into_iter().map(place));
        if failed {
            return None;
        }
        let child: Pipeline = pipeline?;
        let prefix = format!("{}{CHILD_SEPARATOR}", bridge.name);
        let jobs = child
            .jobs
            .into_iter()
            .map(|mut j| {
                // A grandchild's parent is this child: its names get this prefix too.
                if j.upstream.is_some() {
                    for p in &mut j.parent_artifacts {
                        *p = format!("{prefix}{p}");
                    }
                }
                j.name = format!("{prefix}{}", j.name);
                j.upstream = Some(match j.upstream.take() {
                    Some(up) => format!("{prefix}{up}"),
                    None => bridge.name.clone(),
                });
                for n in j.needs.iter_mut().flatten() {
                    n.job = format!("{prefix}{}", n.job);
                }
                for d in j.dependencies.iter_mut().flatten() {
                    *d = format!("{prefix}{d}");
                }
                if let Some(p) = &mut j.parallel {
                    p.job = format!("{prefix}{}", p.job);
                }
                j
            })
            .collect();
        Some((
            Trigger {
                depend: *depend,
                excluded: child.excluded,
            },
            jobs,
        ))
    }
}

impl Reader<'_> {
    /// Puts each trigger job's child jobs right after it; a child job's name that a job of
    /// the pipeline already has is an error at that job.
    pub(super) fn adopt(
        &mut self,
        pipeline: &mut Pipeline,
        children: Vec<(String, Vec<PipelineJob>)>,
    ) {
        for (bridge, jobs) in children {
            for j in &jobs {
                if let Some(taken) = pipeline.job(&j.name) {
                    let line = taken.line;
                    self.error(
                        line,
                        format!(
                            "{}: the name is also that of a job of the child pipeline of \
                             trigger job \"{bridge}\"; rename one of them",
                            ctx_for(&j.name)
                        ),
                    );
                }
            }
            // A trigger job of the pipeline as linked is always found; defensive otherwise.
            let at = pipeline
                .job_index(&bridge)
                .map_or(pipeline.jobs.len(), |i| i + 1);
            pipeline.jobs.splice(at..at, jobs);
        }
    }
}

/// A value as a message shows it.
fn shown(node: &Node) -> String {
    match node.as_scalar() {
        Some(s) => format!("\"{s}\""),
        None => node.describe().to_string(),
    }
}

/// `node` as YAML flow text, every scalar quoted except plain booleans and nulls.
fn flow(node: &Node) -> String {
    match &node.kind {
        _ if node.is_null() => "null".into(),
        Kind::Scalar { text, plain } => {
            if *plain && node.as_bool().is_some() {
                text.clone()
            } else {
                quote(text)
            }
        }
        Kind::Seq(items) => {
            let items: Vec<String> = items.iter().map(flow).collect();
            format!("[{}]", items.join(", "))
        }
        Kind::Map(entries) => {
            let items: Vec<String> = entries
                .iter()
                .map(|e| format!("{}: {}", quote(&e.key), flow(&e.value)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Kind::Reference(path) => {
            let items: Vec<String> = path.iter().map(|p| quote(p)).collect();
            format!("!reference [{}]", items.join(", "))
        }
    }
}

/// A YAML double-quoted scalar (JSON's escapes are YAML's).
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{}\"", s.escape_default()))
}
