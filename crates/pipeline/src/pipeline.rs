//! Local pipeline files: `.gitlab-ci.yml` as GitLab reads it, strictly.
//!
//! Reading goes in GitLab's order: the files are composed (`include.rs`: `include:` local,
//! project, inputs, rules; deep merge), `extends` applied to every entry (`link.rs`),
//! `!reference`s resolved (`reference.rs`), then top-level keywords (`stages`, `default`,
//! `variables`, `workflow`), then each job (`job.rs`; its keys in `job_keys.rs`, `keywords.rs`
//! and `scalars.rs`) with `default:`/`inherit:`, `parallel:` (`parallel.rs`) and, per job it
//! expands to, its `rules` or `only`/`except` (`rules.rs`, with the expression language in
//! `expr.rs`) deciding whether it is in the pipeline and how it starts; last, `needs` are
//! checked across jobs (`link.rs`).
//! Predefined variables come from the caller (see [`Checkout`]), the user's variables win over
//! the file's. YAML anchors, aliases and `<<` merge keys work.
//!
//! `parallel:` expands a job as GitLab does, into at most 200 jobs, each with `CI_NODE_INDEX`
//! (1-based) and `CI_NODE_TOTAL`:
//!
//! - `parallel: N` (1 to 200): jobs `name 1/N` ... `name N/N`.
//! - `parallel: matrix: [{VAR: value or [values], ...}, ...]`: one job per combination of values
//!   within each entry (the first variable varying slowest), entries one after the other, named
//!   `name: [v1, v2]` with the values in the order the variables are written, and the variables
//!   set on the job (over its own of the same name).
//!
//! `needs: [name]` naming a parallel job waits for all of its jobs; a single one can be named in
//! full (`needs: ["test 2/3"]`).
//!
//! Slipway extensions, which travel to the executor as job variables (a variable the job sets
//! itself wins):
//!
//! - `isolation: LEVEL` → `SLIPWAY_ISOLATION` ([`ISOLATION_VARIABLE`]).
//! - `snapshot: on_failure` → `SLIPWAY_SNAPSHOT=on_failure` ([`SNAPSHOT_VARIABLE`]): keep the
//!   instance's state when the job fails. Also allowed in `default:`.
//! - `snapshot: {save: NAME}` → `SLIPWAY_SNAPSHOT_SAVE=NAME` ([`SNAPSHOT_SAVE_VARIABLE`]): save
//!   the state under `NAME` when the job ends.
//! - `restore: NAME` → `SLIPWAY_RESTORE=NAME` ([`RESTORE_VARIABLE`]): start from a saved state.
//!
//! A snapshot `NAME` is 1 to 64 of `A-Z a-z 0-9 . _ -` (not `.` or `..`), after `$VAR` and
//! `${VAR}` are replaced with the job's variables (its own, global ones, matrix values and
//! `CI_NODE_INDEX`), so each job of a matrix can save its own; an undefined variable is an error.
//!
//! Nothing is silently dropped: a GitLab keyword this reader does not implement is an error
//! (listing all of them, with file, line and key path) unless
//! [`PipelineOptions::allow_unsupported`] turns those into warnings; a key that is not a GitLab
//! keyword at all is always an error, as it is in GitLab (it is usually a typo).

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::yaml::{Kind, Node};
use slipway_job::model::{CacheSpec, Image, Variable, When};

mod cache_key;
mod checkout;
mod expr;
mod glob;
mod include;
mod job;
mod job_keys;
mod keywords;
mod link;
mod parallel;
mod payload;
mod reference;
mod rules;
mod scalars;
mod trigger;
mod varfile;

pub use checkout::{Checkout, slug};
pub use glob::files as project_files;
use include::{Composer, IncludeContext, Sources};
pub use keywords::Retry;
use parallel::MatrixVars;
use rules::{Facts, Rule, RuleWhen};
pub use scalars::parse_duration;
use trigger::TriggerSpec;
pub use trigger::{CHILD_SEPARATOR, MAX_CHILD_DEPTH, Trigger};
pub use varfile::{parse_dotenv, read_variables_file};

/// Timeout of a job that sets none, in seconds (GitLab's project default: 1 hour).
pub const DEFAULT_TIMEOUT_SECS: u64 = 3600;

/// The stages a pipeline has when it does not list its own (GitLab's defaults).
pub const DEFAULT_STAGES: [&str; 5] = [".pre", "build", "test", "deploy", ".post"];

/// Variable that carries `isolation:` to the executor.
pub const ISOLATION_VARIABLE: &str = "SLIPWAY_ISOLATION";
/// Variable that carries `snapshot: on_failure` to the executor (value `on_failure`).
pub const SNAPSHOT_VARIABLE: &str = "SLIPWAY_SNAPSHOT";
/// Variable that carries `snapshot: {save: NAME}` to the executor (value `NAME`).
pub const SNAPSHOT_SAVE_VARIABLE: &str = "SLIPWAY_SNAPSHOT_SAVE";
/// Variable that carries `restore: NAME` to the executor (value `NAME`).
pub const RESTORE_VARIABLE: &str = "SLIPWAY_RESTORE";
/// Most jobs one `parallel:` may make, and the largest `parallel: N` (GitLab's limit).
pub const MAX_PARALLEL: u32 = 200;

/// Top-level GitLab keywords this reader does not implement (yet); never job names.
const TOP_KEYS_UNSUPPORTED: &[&str] = &[];

/// Top-level keys that are keywords, not jobs or templates (`types` is `stages`' old name).
const TOP_KEYWORDS: &[&str] = &[
    "stages",
    "types",
    "workflow",
    "spec",
    "include",
    "cache",
    "services",
    "default",
    "variables",
    "image",
    "before_script",
    "after_script",
];

/// How to read a pipeline file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineOptions {
    /// Report GitLab keywords this reader does not implement as warnings (and ignore them)
    /// instead of failing.
    pub allow_unsupported: bool,
    /// The project directory: `include:local` paths are relative to it (default: the pipeline
    /// file's directory, or the current directory for [`Pipeline::parse`]).
    pub project_dir: Option<PathBuf>,
    /// Where `include:project` finds other projects: `<include_root>/<group>/<project>`.
    pub include_root: Option<PathBuf>,
    /// Predefined variables (`CI_COMMIT_SHA`, ...; see [`Checkout`]): every job gets them, and
    /// any variable of the pipeline's overrides them.
    pub predefined: Vec<Variable>,
    /// The user's variables (`--variable`, a variables file): they override every variable of
    /// the pipeline, as GitLab's project and pipeline variables do.
    pub variables: Vec<Variable>,
    /// Read without the network: `include:remote` is an error instead of a fetch.
    pub offline: bool,
    /// The ref `rules:changes` compares the working tree with when a rule names none (`None`:
    /// `changes` always holds, as in GitLab without a push).
    pub changes_base: Option<String>,
}

/// One problem in a pipeline file, at a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// File name as given to the reader.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// What is wrong, starting with where (`job "build": ...`).
    pub message: String,
    /// Place in the order of all files' lines (the root file first, then included files in
    /// the order they were read), for sorting.
    order: usize,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// Why a pipeline file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The file could not be read from disk.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file has problems; all that were found, ordered by line, one per line of the message.
    #[error("{}", Lines(diagnostics))]
    Invalid {
        /// The problems.
        diagnostics: Vec<Diagnostic>,
    },
}

struct Lines<'a>(&'a [Diagnostic]);

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// A job this job waits for (`needs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Name of the needed job.
    pub job: String,
    /// Whether this job receives the needed job's artifacts (default true).
    pub artifacts: bool,
}

/// One job of a pipeline, with `extends`, `default` and global variables applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineJob {
    /// Job name (the top-level key).
    pub name: String,
    /// Stage name.
    pub stage: String,
    /// Index of the stage in [`Pipeline::stages`].
    pub stage_index: usize,
    /// Global variables then the job's own; a job variable replaces a global one of the same key.
    pub variables: Vec<Variable>,
    /// `before_script` lines (the job's, else `default`'s).
    pub before_script: Vec<String>,
    /// `script` lines.
    pub script: Vec<String>,
    /// `after_script` lines (the job's, else `default`'s).
    pub after_script: Vec<String>,
    /// `needs`: `None` = wait for all earlier stages; `Some(vec![])` = start at once.
    pub needs: Option<Vec<Need>>,
    /// When the job runs, given how earlier jobs went.
    pub when: When,
    /// Whether a failure of this job leaves the pipeline successful (with warnings).
    pub allow_failure: bool,
    /// Job timeout; `None` = [`DEFAULT_TIMEOUT_SECS`].
    pub timeout: Option<Duration>,
    /// `artifacts:paths`, handed to later jobs.
    pub artifact_paths: Vec<String>,
    /// `artifacts:when`.
    pub artifacts_when: When,
    /// Image, with its `pull_policy` and `entrypoint`.
    pub image: Option<Image>,
    /// Requested isolation level (Slipway extension), validated later by the runner.
    pub isolation: Option<String>,
    /// Service containers (`services:`), for the docker executors.
    pub services: Vec<Image>,
    /// Runner tags.
    pub tags: Vec<String>,
    /// Which job of a `parallel:` expansion this is; `None` for a job without `parallel:`.
    pub parallel: Option<ParallelInstance>,
    /// `snapshot:` (Slipway extension), with `$VAR`s in a save name already replaced.
    pub snapshot: Option<Snapshot>,
    /// `restore:` (Slipway extension): the snapshot to start from, `$VAR`s replaced.
    pub restore: Option<String>,
    /// `when: manual`: the job waits until someone starts it (`slipway exec --job NAME`).
    pub manual: bool,
    /// `when: delayed`: how long it waits once it may start.
    pub start_in: Option<Duration>,
    /// `allow_failure: exit_codes`: failures with these exit codes are allowed.
    pub allow_failure_exit_codes: Vec<i32>,
    /// `retry`.
    pub retry: Retry,
    /// `resource_group`: jobs of one group never run at the same time.
    pub resource_group: Option<String>,
    /// `coverage`: a regex whose last match in the trace gives the job's coverage.
    pub coverage: Option<String>,
    /// `interruptible`.
    pub interruptible: bool,
    /// `artifacts:reports:dotenv` files: their variables go to the jobs that get this job's
    /// artifacts.
    pub dotenv: Vec<String>,
    /// `dependencies`: the jobs whose artifacts this job gets (`None`: by `needs`, else all of
    /// earlier stages).
    pub dependencies: Option<Vec<String>>,
    /// `cache:` entries.
    pub cache: Vec<CacheSpec>,
    /// `artifacts:exclude`.
    pub artifacts_exclude: Vec<String>,
    /// `artifacts:untracked`.
    pub artifacts_untracked: bool,
    /// Line of the job's key in the file.
    pub line: usize,
    /// A trigger job (`trigger: include:`): it runs no script; its child pipeline's jobs follow
    /// it in [`Pipeline::jobs`].
    pub trigger: Option<Trigger>,
    /// In a child pipeline: the trigger job that starts it (`None` in the top pipeline).
    pub upstream: Option<String>,
    /// In a child pipeline: jobs of the parent pipeline whose artifacts this job gets
    /// (`needs: [{pipeline: $PARENT_PIPELINE_ID, job: NAME}]`), named as in [`Pipeline::jobs`].
    pub parent_artifacts: Vec<String>,
}

/// One job of a `parallel:` expansion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelInstance {
    /// The job's name as written in the file (without ` 1/3` or `: [a, b]`).
    pub job: String,
    /// 1-based position among the expansion's jobs (`CI_NODE_INDEX`).
    pub index: u32,
    /// Number of jobs in the expansion (`CI_NODE_TOTAL`).
    pub total: u32,
}

/// What `snapshot:` asks the executor to keep of the instance's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snapshot {
    /// `on_failure`: keep it when the job fails ([`SNAPSHOT_VARIABLE`]).
    OnFailure,
    /// `{save: NAME}`: save it under this name when the job ends ([`SNAPSHOT_SAVE_VARIABLE`]).
    Save(String),
}

/// A parsed pipeline file.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// Stages in order; always starts with `.pre` and ends with `.post`.
    pub stages: Vec<String>,
    /// Jobs in file order (hidden templates are not jobs).
    pub jobs: Vec<PipelineJob>,
    /// Keys that were accepted but decide nothing here, and unsupported keys that were ignored
    /// (only with `allow_unsupported`), as `file:line: text`.
    pub warnings: Vec<String>,
    /// Why the pipeline has no jobs although the file has some (workflow rules, or every job's
    /// rules left it out).
    pub excluded: Option<String>,
}

impl Pipeline {
    /// Reads and parses a pipeline file; messages name the file as `path` is written. Blocking
    /// file I/O (included files too) and network I/O (`include:remote`).
    pub fn from_file(path: impl AsRef<Path>, opts: PipelineOptions) -> Result<Self, PipelineError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| PipelineError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut opts = opts;
        if opts.project_dir.is_none() {
            opts.project_dir = Some(match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            });
        }
        Self::read(&text, &path.display().to_string(), Some(path), &opts)
    }

    /// Parses pipeline text; `file_name` is used in messages. Included files are read from
    /// [`PipelineOptions::project_dir`] (blocking file I/O; `include:remote` blocks on the
    /// network).
    pub fn parse(
        text: &str,
        file_name: &str,
        opts: PipelineOptions,
    ) -> Result<Self, PipelineError> {
        Self::read(text, file_name, None, &opts)
    }

    fn read(
        text: &str,
        file_name: &str,
        path: Option<&Path>,
        opts: &PipelineOptions,
    ) -> Result<Self, PipelineError> {
        let (pipeline, mut errors, warned) = read_inner(text, file_name, path, opts, 0);
        let warnings: Vec<String> = warned.iter().map(ToString::to_string).collect();
        match pipeline {
            Some(mut p) if errors.is_empty() => {
                p.warnings = warnings;
                Ok(p)
            }
            _ => {
                if errors.is_empty() {
                    // Defensive: every path that gives up records why.
                    errors.push(Diagnostic {
                        file: file_name.to_string(),
                        line: 1,
                        message: "invalid pipeline".into(),
                        order: 0,
                    });
                }
                Err(PipelineError::Invalid {
                    diagnostics: errors,
                })
            }
        }
    }

    /// The job called `name`.
    pub fn job(&self, name: &str) -> Option<&PipelineJob> {
        self.jobs.iter().find(|j| j.name == name)
    }

    /// Index in [`Pipeline::jobs`] of the job called `name`.
    pub fn job_index(&self, name: &str) -> Option<usize> {
        self.jobs.iter().position(|j| j.name == name)
    }
}

/// Reads a pipeline at `depth` (0: the top one, 1 and more: child pipelines): the pipeline
/// unless there are errors, the errors, and the warnings, each list in line order.
fn read_inner(
    text: &str,
    file_name: &str,
    path: Option<&Path>,
    opts: &PipelineOptions,
    depth: usize,
) -> (Option<Pipeline>, Vec<Diagnostic>, Vec<Diagnostic>) {
    let lookup = |name: &str| {
        opts.variables
            .iter()
            .rev()
            .chain(opts.predefined.iter().rev())
            .find(|v| v.key == name)
            .map(|v| v.value.clone())
    };
    let project_dir = opts
        .project_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("."));
    let mut composer = Composer::new(
        IncludeContext {
            project_dir: &project_dir,
            include_root: opts.include_root.as_deref(),
            variables: &lookup,
            offline: opts.offline,
        },
        Facts::new(&project_dir, opts.changes_base.clone()),
    );
    let root = composer.root(text, file_name, path);
    let composed = std::mem::take(&mut composer.errors);
    let yaml_warnings = std::mem::take(&mut composer.warnings);
    let mut r = Reader {
        sources: composer.sources,
        errors: Vec::new(),
        unsupported: Vec::new(),
        ignored: Vec::new(),
        predefined: &opts.predefined,
        user: &opts.variables,
        opts,
        depth,
        facts: composer.facts,
    };
    for (line, message) in composed {
        r.error(line, message);
    }
    // GitLab's order: `extends` first, then `!reference`s against the extended entries.
    let root = root.map(|root| {
        let mut root = r.extend_all(&root);
        let mut unresolved = Vec::new();
        reference::resolve(&mut root, &mut unresolved);
        for (line, message) in unresolved {
            r.error(line, message);
        }
        root
    });
    for (line, message) in yaml_warnings {
        let d = r.diagnostic(line, message);
        r.ignored.push(d);
    }
    let pipeline = match root {
        Some(root) if r.errors.is_empty() => r.pipeline(root),
        _ => None,
    };
    let mut errors = r.errors;
    let mut warned = r.ignored;
    if opts.allow_unsupported {
        warned.extend(r.unsupported);
    } else {
        errors.extend(r.unsupported);
    }
    warned.sort_by_key(|d| d.order);
    errors.sort_by_key(|d| d.order);
    (pipeline, errors, warned)
}

impl PipelineJob {
    /// Timeout in effect: the job's, else [`DEFAULT_TIMEOUT_SECS`].
    pub fn timeout_or_default(&self) -> Duration {
        self.timeout
            .unwrap_or(Duration::from_secs(DEFAULT_TIMEOUT_SECS))
    }
}

/// `job "build"` or `template ".base"`: how messages name a top-level entry.
fn ctx_for(name: &str) -> String {
    if name.starts_with('.') {
        format!("template \"{name}\"")
    } else {
        format!("job \"{name}\"")
    }
}

/// Settings from `default:` (and the deprecated global keys).
#[derive(Default)]
struct Defaults {
    before_script: Option<Vec<String>>,
    after_script: Option<Vec<String>>,
    timeout: Option<Duration>,
    image: Option<Image>,
    tags: Option<Vec<String>>,
    isolation: Option<String>,
    services: Option<Vec<Image>>,
    /// Only ever `on_failure`: a saved snapshot is named per job.
    snapshot: Option<SnapshotSpec>,
    cache: Option<Vec<CacheSpec>>,
    retry: Option<Retry>,
    interruptible: Option<bool>,
    artifacts: Option<Node>,
}

/// Adds `over` to `base`, each replacing a variable of its name (which moves to the end).
fn layer(base: &mut Vec<Variable>, over: impl IntoIterator<Item = Variable>) {
    for v in over {
        base.retain(|b| b.key != v.key);
        base.push(v);
    }
}

/// The value of the last variable called `name`.
fn lookup_in(vars: &[Variable], name: &str) -> Option<String> {
    vars.iter()
        .rev()
        .find(|v| v.key == name)
        .map(|v| v.value.clone())
}

/// `snapshot:` as written: a save name may still hold `$VAR`s, replaced per job.
#[derive(Clone)]
enum SnapshotSpec {
    OnFailure,
    Save { name: String, line: usize },
}

/// A need as written, with its line, checked once all jobs are known.
#[derive(Debug, Clone)]
struct RawNeed {
    job: String,
    artifacts: bool,
    optional: bool,
    line: usize,
    /// `parallel: matrix:`: only the jobs of the parallel job with these values.
    matrix: Option<Vec<MatrixVars>>,
    /// A job of the parent pipeline (`needs:pipeline: $PARENT_PIPELINE_ID`): its artifacts only.
    parent: bool,
}

/// A job as read, before cross-job checks.
struct RawJob {
    job: PipelineJob,
    stage_line: usize,
    needs: Option<Vec<RawNeed>>,
    /// `trigger:` of a trigger job.
    trigger: Option<TriggerSpec>,
    /// A trigger job's YAML variables (global and its own, after rules), for its child.
    forward: Vec<Variable>,
}

struct Reader<'a> {
    sources: Sources,
    errors: Vec<Diagnostic>,
    unsupported: Vec<Diagnostic>,
    /// Accepted keys that decide nothing here, one line each.
    ignored: Vec<Diagnostic>,
    /// Predefined variables (lowest precedence).
    predefined: &'a [Variable],
    /// The user's variables (highest precedence).
    user: &'a [Variable],
    /// Files and changes, for `exists` and `changes`.
    facts: Facts<'a>,
    /// How this pipeline is read (a child pipeline is read the same way).
    opts: &'a PipelineOptions,
    /// 0 for the top pipeline, 1 and more for child pipelines.
    depth: usize,
}

impl Reader<'_> {
    /// A problem at `line` of the shared line space (see [`include::Sources`]).
    fn diagnostic(&self, line: usize, message: String) -> Diagnostic {
        let (file, own) = self.sources.locate(line);
        Diagnostic {
            file: file.to_string(),
            line: own,
            message,
            order: line,
        }
    }

    fn error(&mut self, line: usize, message: impl Into<String>) {
        let d = self.diagnostic(line, message.into());
        self.errors.push(d);
    }

    fn unsupported(&mut self, line: usize, ctx: &str, key: &str) {
        let d = self.diagnostic(line, format!("{ctx}: unsupported key \"{key}\""));
        self.unsupported.push(d);
    }

    /// Reports a key that is neither implemented nor a GitLab keyword, with a likely intended
    /// keyword from `known` when one is close (typos are the usual cause).
    fn unknown(&mut self, line: usize, ctx: &str, key: &str, known: &[&[&str]]) {
        let hint = known
            .iter()
            .flat_map(|list| list.iter())
            .map(|k| (edit_distance(key, k), *k))
            .filter(|&(d, _)| d <= 2)
            .min()
            .map(|(_, k)| format!(" (did you mean \"{k}\"?)"))
            .unwrap_or_default();
        self.error(line, format!("{ctx}: unknown key \"{key}\"{hint}"));
    }

    fn pipeline(&mut self, root: Node) -> Option<Pipeline> {
        if root.is_null() || root.as_map().is_some_and(|m| m.is_empty()) {
            self.error(
                root.line,
                "the file is empty: a pipeline needs at least one job",
            );
            return None;
        }
        let Some(entries) = root.as_map() else {
            self.error(
                root.line,
                format!(
                    "expected a mapping of keywords and jobs at the top level, found {}",
                    root.describe()
                ),
            );
            return None;
        };

        let mut stages: Option<Vec<String>> = None;
        let mut stages_line = 1;
        let mut defaults = Defaults::default();
        let mut global_defaults = Defaults::default();
        let mut global_vars = Vec::new();
        let mut workflow_rules: Option<Vec<Rule>> = None;
        // The jobs, in order (templates are only what jobs extend and reference).
        let mut job_keys = Vec::new();

        for e in entries {
            match e.key.as_str() {
                // `types` is the deprecated name of `stages`.
                "stages" | "types" => {
                    stages_line = e.key_line;
                    stages = self.string_list(&e.key, &e.value);
                }
                "workflow" => workflow_rules = self.workflow(&e.value),
                // A header's `spec` (pipeline inputs) has no inputs to take here.
                "spec" => {}
                "cache" => global_defaults.cache = self.cache("cache", &e.value),
                "services" => global_defaults.services = self.services("services", &e.value),
                "default" => {
                    if let Some(d) = self.defaults(&e.value) {
                        defaults = d;
                    }
                }
                "variables" => global_vars = self.variables("variables", &e.value),
                // Deprecated global forms of `default:` keys; `default:` wins over them.
                "image" => global_defaults.image = self.image("image", &e.value),
                "before_script" => {
                    global_defaults.before_script = self.script("before_script", &e.value)
                }
                "after_script" => {
                    global_defaults.after_script = self.script("after_script", &e.value)
                }
                k if TOP_KEYS_UNSUPPORTED.contains(&k) => {
                    self.unsupported(e.key_line, "top level", k)
                }
                "" => self.error(e.key_line, "a job name must not be empty"),
                k => {
                    if !k.starts_with('.') {
                        job_keys.push(e);
                    }
                }
            }
        }
        let defaults = Defaults {
            before_script: defaults.before_script.or(global_defaults.before_script),
            after_script: defaults.after_script.or(global_defaults.after_script),
            image: defaults.image.or(global_defaults.image),
            cache: defaults.cache.or(global_defaults.cache),
            services: defaults.services.or(global_defaults.services),
            ..defaults
        };

        let mut stages =
            stages.unwrap_or_else(|| DEFAULT_STAGES.iter().map(|s| s.to_string()).collect());
        let mut seen = HashSet::new();
        for s in &stages {
            if !seen.insert(s.as_str()) {
                self.error(stages_line, format!("stages: duplicate stage \"{s}\""));
            }
        }
        // GitLab always has `.pre` first and `.post` last, listed or not.
        if stages.first().map(String::as_str) != Some(".pre") {
            stages.retain(|s| s != ".pre");
            stages.insert(0, ".pre".into());
        }
        if stages.last().map(String::as_str) != Some(".post") {
            stages.retain(|s| s != ".post");
            stages.push(".post".into());
        }

        if job_keys.is_empty() {
            self.error(
                root.line,
                "no jobs: a job is a top-level key that does not start with \".\"",
            );
            return None;
        }

        // A filtered pipeline's jobs are still read: GitLab reports a job's config error even
        // when workflow:rules leave the pipeline out.
        let mut filtered = None;
        if let Some(rules) = &workflow_rules {
            let scope = self.scope(&global_vars);
            let lookup = |n: &str| lookup_in(&scope, n);
            match rules::first_match(rules, &lookup, &mut self.facts) {
                Some(r) if r.when != Some(RuleWhen::Never) => {
                    // workflow:rules:variables override the global ones.
                    layer(&mut global_vars, r.variables.iter().cloned());
                }
                hit => {
                    filtered = Some(if hit.is_some() {
                        "Pipeline filtered out by workflow rules (a rule with when: never matched)"
                    } else {
                        "Pipeline filtered out by workflow rules (no rule matched)"
                    });
                }
            }
        }

        let mut raw_jobs: Vec<RawJob> = Vec::new();
        for e in job_keys {
            let ctx = ctx_for(&e.key);
            if e.value.as_map().is_none() {
                self.error(
                    e.key_line,
                    format!(
                        "{ctx}: expected a mapping of job keys, found {}",
                        e.value.describe()
                    ),
                );
                continue;
            }
            if let Some(jobs) = self.job(&e.key, e.key_line, &e.value, &defaults, &global_vars) {
                raw_jobs.extend(jobs);
            }
        }

        // Child pipelines are read only for a pipeline that runs, as GitLab creates them.
        let mut children = Vec::new();
        for raw in raw_jobs.iter_mut().filter(|_| filtered.is_none()) {
            if let Some(spec) = raw.trigger.take()
                && let Some((trigger, jobs)) = self.child(&raw.job, &spec, &raw.forward)
            {
                raw.job.trigger = Some(trigger);
                children.push((raw.job.name.clone(), jobs));
            }
        }
        if let Some(why) = filtered {
            // Each job was read (its config errors are reported); `needs` between jobs are
            // checked when GitLab creates a pipeline, which a filtered one never is.
            return Some(Pipeline {
                stages,
                jobs: Vec::new(),
                warnings: Vec::new(),
                excluded: Some(why.into()),
            });
        }
        let mut pipeline = self.link(stages, raw_jobs);
        self.adopt(&mut pipeline, children);
        if pipeline.jobs.is_empty() && self.errors.is_empty() {
            pipeline.excluded =
                Some("No jobs for this pipeline: the rules of every job left it out".into());
        }
        Some(pipeline)
    }

    /// The variables rules see for a job whose own (global ones included) are `vars`:
    /// predefined, then `vars`, then the user's, each value expanded.
    fn scope(&self, vars: &[Variable]) -> Vec<Variable> {
        let mut scope = self.predefined.to_vec();
        layer(&mut scope, vars.iter().cloned());
        layer(&mut scope, self.user.iter().cloned());
        slipway_job::variables::expand_all(&mut scope);
        scope
    }

    /// `workflow:`: its rules (`name` and `auto_cancel` decide nothing here).
    fn workflow(&mut self, node: &Node) -> Option<Vec<Rule>> {
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!("workflow: expected a mapping, found {}", node.describe()),
            );
            return None;
        };
        let mut rules = None;
        for e in entries {
            match e.key.as_str() {
                "rules" => rules = self.rules("workflow: rules", &e.value, false),
                "name" | "auto_cancel" => {}
                k => self.error(
                    e.key_line,
                    format!("workflow: unknown key \"{k}\" (expected rules, name or auto_cancel)"),
                ),
            }
        }
        rules
    }

    /// A warning at `line`: accepted, as GitLab accepts it, but worth a line.
    fn warn(&mut self, line: usize, message: impl Into<String>) {
        let d = self.diagnostic(line, message.into());
        self.ignored.push(d);
    }

    /// Notes a key that is accepted but decides nothing in a local run.
    fn ignore(&mut self, line: usize, ctx: &str, key: &str) {
        let d = self.diagnostic(
            line,
            format!("{ctx}: \"{key}\" decides nothing in a local run; ignored"),
        );
        self.ignored.push(d);
    }
}

/// Splits `job "x": image` into (`job "x"`, `image`); a bare key has context `top level`.
fn split_ctx(what: &str) -> (&str, &str) {
    match what.rsplit_once(": ") {
        Some((ctx, key)) => (ctx, key),
        None => ("top level", what),
    }
}

/// Levenshtein distance, for "did you mean" hints on short keys.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Deep merge for `extends`: mappings merge key by key, anything else is replaced by `over`.
pub(crate) fn deep_merge(base: &Node, over: &Node) -> Node {
    match (&base.kind, &over.kind) {
        (Kind::Map(b), Kind::Map(o)) => {
            let mut out = b.clone();
            for e in o {
                match out.iter_mut().find(|x| x.key == e.key) {
                    Some(x) => {
                        x.value = deep_merge(&x.value, &e.value);
                        x.key_line = e.key_line;
                    }
                    None => out.push(e.clone()),
                }
            }
            Node {
                line: over.line,
                kind: Kind::Map(out),
            }
        }
        _ => over.clone(),
    }
}

#[cfg(test)]
mod language_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod trigger_tests;
