//! Local pipeline files: `.gitlab-ci.yml` as GitLab reads it, strictly.
//!
//! Reading goes in GitLab's order: the files are composed (`include.rs`: `include:` local,
//! project, inputs, rules; deep merge), `!reference`s resolved (`reference.rs`), then top-level
//! keywords (`stages`, `default`, `variables`, `workflow`), then each job with `extends`,
//! `default:`/`inherit:`, `parallel:` and, per job it expands to, its `rules` or
//! `only`/`except` (`rules.rs`, with the expression language in `expr.rs`) deciding whether it is
//! in the pipeline and how it starts. Predefined variables come from the caller (see
//! [`Checkout`]), the user's variables win over the file's. YAML anchors, aliases and `<<` merge
//! keys work.
//!
//! `parallel:` expands a job as GitLab does, into at most 200 jobs, each with `CI_NODE_INDEX`
//! (1-based) and `CI_NODE_TOTAL`:
//!
//! - `parallel: N` (2 to 200): jobs `name 1/N` ... `name N/N`.
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

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::{
    ArtifactSpec, CacheSpec, Image, JobInfo, JobResponse, RunnerInfo, Step, StepName, Variable,
    When,
};
use crate::yaml::{Kind, Node};

mod checkout;
mod expr;
mod glob;
mod include;
mod keywords;
mod reference;
mod rules;
mod varfile;
mod variables;

pub use checkout::{Checkout, slug};
pub use glob::files as project_files;
use include::{Composer, IncludeContext, Sources};
pub use keywords::Retry;
use rules::{Facts, RefFilter, Rule, RuleWhen};
pub use varfile::{parse_dotenv, read_variables_file};
pub use variables::expand_variables;

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

/// Longest snapshot name accepted.
const MAX_SNAPSHOT_NAME: usize = 64;
/// Deepest `extends` chain accepted (GitLab's limit).
const MAX_EXTENDS_DEPTH: usize = 11;
/// Deepest nesting of script lists accepted (GitLab's limit).
const MAX_SCRIPT_DEPTH: usize = 10;

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
/// Top-level GitLab keywords this reader does not implement (yet); never job names.
const TOP_KEYS_UNSUPPORTED: &[&str] = &[];

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
    /// file I/O (included files too).
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
    /// [`PipelineOptions::project_dir`] (blocking file I/O).
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
            },
            Facts::new(&project_dir, opts.changes_base.clone()),
        );
        let mut root = composer.root(text, file_name, path);
        let mut composed = std::mem::take(&mut composer.errors);
        if let Some(root) = root.as_mut() {
            reference::resolve(root, &mut composed);
        }
        let mut r = Reader {
            sources: composer.sources,
            errors: Vec::new(),
            unsupported: Vec::new(),
            ignored: Vec::new(),
            predefined: &opts.predefined,
            user: &opts.variables,
            facts: composer.facts,
        };
        for (line, message) in composed {
            r.error(line, message);
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
                errors.sort_by_key(|d| d.order);
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

impl PipelineJob {
    /// Timeout in effect: the job's, else [`DEFAULT_TIMEOUT_SECS`].
    pub fn timeout_or_default(&self) -> Duration {
        self.timeout
            .unwrap_or(Duration::from_secs(DEFAULT_TIMEOUT_SECS))
    }

    /// Builds the GitLab-shaped job payload an executor runs.
    ///
    /// Steps are built as GitLab builds them: a `script` step (`before_script` + `script`,
    /// `on_success`) and, if there is one, an `after_script` step (`always`, failure allowed).
    /// Variables: predefined (`CI`, `SLIPWAY`, `CI_JOB_ID`, `CI_JOB_NAME`, `CI_JOB_STAGE`,
    /// `CI_JOB_TIMEOUT`, `CI_PIPELINE_ID`), then the job's, then `extra_variables` (later wins).
    /// `token` is empty and `dependencies` is left for the caller, which knows where earlier
    /// jobs' artifacts are (see [`crate::PipelineRun::artifact_sources`]).
    pub fn to_job_response(
        &self,
        id: u64,
        pipeline_id: u64,
        extra_variables: &[Variable],
    ) -> JobResponse {
        let timeout = self.timeout_or_default().as_secs().max(1);
        let mut variables = vec![
            Variable::new("CI", "true"),
            Variable::new("SLIPWAY", "true"),
            Variable::new("CI_JOB_ID", id.to_string()),
            Variable::new("CI_JOB_NAME", self.name.clone()),
            Variable::new("CI_JOB_STAGE", self.stage.clone()),
            Variable::new("CI_JOB_TIMEOUT", timeout.to_string()),
            Variable::new("CI_PIPELINE_ID", pipeline_id.to_string()),
        ];
        variables.extend(self.variables.iter().cloned());
        variables.extend(extra_variables.iter().cloned());
        // Slipway's keys travel as the variables a GitLab job would set; a variable of the
        // job's own wins.
        let mut extensions = Vec::new();
        if let Some(level) = &self.isolation {
            extensions.push((ISOLATION_VARIABLE, level.as_str()));
        }
        match &self.snapshot {
            Some(Snapshot::OnFailure) => extensions.push((SNAPSHOT_VARIABLE, "on_failure")),
            Some(Snapshot::Save(name)) => extensions.push((SNAPSHOT_SAVE_VARIABLE, name.as_str())),
            None => {}
        }
        if let Some(name) = &self.restore {
            extensions.push((RESTORE_VARIABLE, name.as_str()));
        }
        for (key, value) in extensions {
            if !variables.iter().any(|v| v.key == key) {
                variables.push(Variable::new(key, value));
            }
        }

        let mut steps = vec![Step {
            name: StepName::Script,
            script: self
                .before_script
                .iter()
                .chain(&self.script)
                .cloned()
                .collect(),
            timeout,
            when: When::OnSuccess,
            allow_failure: false,
        }];
        if !self.after_script.is_empty() {
            steps.push(Step {
                name: StepName::AfterScript,
                script: self.after_script.clone(),
                timeout,
                when: When::Always,
                // An after_script failure never fails the job, as in GitLab.
                allow_failure: true,
            });
        }
        let mut artifacts = Vec::new();
        if !self.artifact_paths.is_empty() {
            artifacts.push(ArtifactSpec {
                name: "artifacts".into(),
                paths: self.artifact_paths.clone(),
                exclude: self.artifacts_exclude.clone(),
                when: self.artifacts_when,
                artifact_type: "archive".into(),
                artifact_format: "zip".into(),
                ..ArtifactSpec::default()
            });
        }
        if !self.dotenv.is_empty() {
            artifacts.push(ArtifactSpec {
                name: "dotenv".into(),
                paths: self.dotenv.clone(),
                when: self.artifacts_when,
                artifact_type: "dotenv".into(),
                artifact_format: "gzip".into(),
                ..ArtifactSpec::default()
            });
        }
        JobResponse {
            id,
            job_info: JobInfo {
                name: self.name.clone(),
                stage: self.stage.clone(),
                pipeline_id,
                ..JobInfo::default()
            },
            runner_info: RunnerInfo {
                uuid: None,
                timeout,
            },
            variables,
            steps,
            image: self.image.clone(),
            services: self.services.clone(),
            artifacts,
            cache: self.cache.clone(),
            ..JobResponse::default()
        }
    }
}

/// Parses a GitLab human duration: `3600` (seconds), `30s`, `10 minutes`, `1h 30m`, `1h30m`,
/// `1.5 hours`, `2 days`, `1 hour and 30 minutes`, `01:30:00`. Months count 30 days, years 365.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let s = text.trim().to_ascii_lowercase();
    if s.is_empty() {
        return None;
    }
    let secs = if s.contains(':') {
        // hh:mm:ss or mm:ss
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() > 3 {
            return None;
        }
        let mut total = 0f64;
        for p in parts {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            total = total * 60.0 + p.parse::<f64>().ok()?;
        }
        total
    } else {
        parse_units(&s)?
    };
    // Bound before converting: Duration::from_secs_f64 panics on overflow.
    if !(secs > 0.0 && secs <= 100.0 * 365.0 * 86400.0) {
        return None;
    }
    Some(Duration::from_secs_f64(secs))
}

fn parse_units(s: &str) -> Option<f64> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut total = 0f64;
    let mut parts = 0;
    let mut bare = false;
    while i < bytes.len() {
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b',') {
            i += 1;
        }
        if i >= bytes.len() {
            break;
        }
        if s[i..].starts_with("and ") {
            i += 4;
            continue;
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        if start == i {
            return None;
        }
        let n: f64 = s[start..i].parse().ok()?;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        let ustart = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &s[ustart..i];
        let factor = match unit {
            "" => {
                bare = true;
                1.0
            }
            "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86400.0,
            "w" | "wk" | "wks" | "week" | "weeks" => 7.0 * 86400.0,
            "mo" | "mos" | "month" | "months" => 30.0 * 86400.0,
            "y" | "yr" | "yrs" | "year" | "years" => 365.0 * 86400.0,
            _ => return None,
        };
        total += n * factor;
        parts += 1;
    }
    // A number without a unit means seconds only when it stands alone ("3600"); in "1h 30" it is
    // ambiguous, so it is refused.
    if parts == 0 || (bare && parts > 1) {
        return None;
    }
    Some(total)
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

/// The variables one `parallel: matrix:` job gets, in the order they are written.
type MatrixVars = Vec<(String, String)>;

/// `parallel:` as read.
enum ParallelSpec {
    /// `parallel: N`.
    Count(u32),
    /// `parallel: matrix:`: each job's variables, in job order.
    Matrix(Vec<MatrixVars>),
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
}

/// A job as read, before cross-job checks.
struct RawJob {
    job: PipelineJob,
    stage_line: usize,
    needs: Option<Vec<RawNeed>>,
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
        // Every top-level entry `extends` may name (jobs and templates), and the jobs in order.
        let mut defs: HashMap<&str, &Node> = HashMap::new();
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
                    defs.insert(k, &e.value);
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

        if let Some(rules) = &workflow_rules {
            let scope = self.scope(&global_vars);
            let lookup = |n: &str| lookup_in(&scope, n);
            match rules::first_match(rules, &lookup, &mut self.facts) {
                Some(r) if r.when != Some(RuleWhen::Never) => {
                    // workflow:rules:variables override the global ones.
                    layer(&mut global_vars, r.variables.iter().cloned());
                }
                hit => {
                    let why = if hit.is_some() {
                        "Pipeline filtered out by workflow rules (a rule with when: never matched)"
                    } else {
                        "Pipeline filtered out by workflow rules (no rule matched)"
                    };
                    return Some(Pipeline {
                        stages,
                        jobs: Vec::new(),
                        warnings: Vec::new(),
                        excluded: Some(why.into()),
                    });
                }
            }
        }

        let mut memo: HashMap<String, Option<Node>> = HashMap::new();
        let mut raw_jobs = Vec::new();
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
            let mut stack = Vec::new();
            let Some(node) = self.resolve(&e.key, &defs, &mut memo, &mut stack) else {
                continue;
            };
            if let Some(jobs) = self.job(&e.key, e.key_line, &node, &defaults, &global_vars) {
                raw_jobs.extend(jobs);
            }
        }

        let mut pipeline = self.link(stages, raw_jobs);
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
        variables::expand_all(&mut scope);
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

    /// Notes a key that is accepted but decides nothing in a local run.
    fn ignore(&mut self, line: usize, ctx: &str, key: &str) {
        let d = self.diagnostic(
            line,
            format!("{ctx}: \"{key}\" decides nothing in a local run; ignored"),
        );
        self.ignored.push(d);
    }

    /// A duration such as `30 minutes`.
    fn duration(&mut self, what: &str, node: &Node) -> Option<Duration> {
        let Some(text) = node.as_scalar() else {
            self.error(
                node.line,
                format!("{what}: expected a duration, found {}", node.describe()),
            );
            return None;
        };
        let d = parse_duration(text);
        if d.is_none() {
            self.error(
                node.line,
                format!(
                    "{what}: invalid duration \"{text}\" (examples: \"1h 30m\", \"10 minutes\", \"3600\")"
                ),
            );
        }
        d
    }

    /// Stage indices and `needs` checks: these need every job.
    fn link(&mut self, stages: Vec<String>, raw_jobs: Vec<RawJob>) -> Pipeline {
        let stage_list = stages.join(", ");
        let mut jobs: Vec<PipelineJob> = Vec::new();
        let mut needs_raw: Vec<Option<Vec<RawNeed>>> = Vec::new();
        let mut taken: HashMap<String, Option<String>> = HashMap::new();
        for mut raw in raw_jobs {
            // YAML already refuses duplicate keys, but a `parallel:` expansion can make a name
            // that is taken (by a job, by another expansion, or twice by a matrix).
            let origin = raw.job.parallel.as_ref().map(|p| p.job.clone());
            if let Some(first) = taken.get(&raw.job.name) {
                let name = &raw.job.name;
                let msg = match (&origin, first) {
                    (Some(me), Some(other)) if me == other => format!(
                        "{}: parallel:matrix: makes the job \"{name}\" twice",
                        ctx_for(me)
                    ),
                    (Some(me), _) => format!(
                        "{}: parallel: makes a job named \"{name}\", a name already taken",
                        ctx_for(me)
                    ),
                    (None, Some(other)) => format!(
                        "{}: the name is already taken by a job of parallel job \"{other}\"",
                        ctx_for(name)
                    ),
                    // Unreachable (duplicate keys are YAML errors); said plainly all the same.
                    (None, None) => format!("{}: duplicate job name", ctx_for(name)),
                };
                self.error(raw.job.line, msg);
                continue;
            }
            taken.insert(raw.job.name.clone(), origin);
            match stages.iter().position(|s| *s == raw.job.stage) {
                Some(i) => raw.job.stage_index = i,
                None => self.error(
                    raw.stage_line,
                    format!(
                        "{}: unknown stage \"{}\" (stages: {stage_list})",
                        ctx_for(&raw.job.name),
                        raw.job.stage
                    ),
                ),
            }
            jobs.push(raw.job);
            needs_raw.push(raw.needs);
        }
        // A need names a job, or else a parallel job as written: then all the jobs it made.
        let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut by_parallel: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, j) in jobs.iter().enumerate() {
            by_name.insert(j.name.as_str(), vec![i]);
            if let Some(p) = &j.parallel {
                by_parallel.entry(p.job.as_str()).or_default().push(i);
            }
        }
        let mut edges: Vec<Vec<(usize, usize)>> = vec![Vec::new(); jobs.len()];
        let mut resolved: Vec<Option<Vec<Need>>> = vec![None; jobs.len()];
        for (i, raw) in needs_raw.into_iter().enumerate() {
            let Some(raw) = raw else { continue };
            let ctx = ctx_for(&jobs[i].name);
            let mut needs: Vec<Need> = Vec::new();
            let mut written: HashSet<String> = HashSet::new();
            for n in raw {
                let targets = by_name
                    .get(n.job.as_str())
                    .or_else(|| by_parallel.get(n.job.as_str()))
                    .map_or(&[][..], Vec::as_slice);
                // `needs: parallel: matrix:` picks the jobs whose values match an entry.
                let picked: Vec<usize>;
                let targets = match &n.matrix {
                    None => targets,
                    Some(combos) => {
                        picked = targets
                            .iter()
                            .copied()
                            .filter(|&t| {
                                combos.iter().any(|combo| {
                                    combo.iter().all(|(k, v)| {
                                        jobs[t]
                                            .variables
                                            .iter()
                                            .any(|x| &x.key == k && &x.value == v)
                                    })
                                })
                            })
                            .collect();
                        if picked.is_empty() && !targets.is_empty() {
                            self.error(
                                n.line,
                                format!(
                                    "{ctx}: needs: no job of \"{}\" has the matrix values asked for",
                                    n.job
                                ),
                            );
                            continue;
                        }
                        &picked
                    }
                };
                match targets.first() {
                    None if n.optional => {}
                    None => self.error(n.line, format!("{ctx}: needs: unknown job \"{}\"", n.job)),
                    Some(&t) if jobs[t].stage_index > jobs[i].stage_index => self.error(
                        n.line,
                        format!(
                            "{ctx}: needs: \"{}\" is in a later stage ({}) than this job ({})",
                            n.job, jobs[t].stage, jobs[i].stage
                        ),
                    ),
                    Some(_) => {
                        if !written.insert(n.job.clone()) {
                            self.error(
                                n.line,
                                format!("{ctx}: needs: \"{}\" is listed twice", n.job),
                            );
                            continue;
                        }
                        for &t in targets {
                            // A job named both alone and through its parallel job counts once.
                            if needs.iter().any(|x| x.job == jobs[t].name) {
                                continue;
                            }
                            edges[i].push((t, n.line));
                            needs.push(Need {
                                job: jobs[t].name.clone(),
                                artifacts: n.artifacts,
                            });
                        }
                    }
                }
            }
            resolved[i] = Some(needs);
        }
        for (job, needs) in jobs.iter_mut().zip(resolved) {
            if needs.is_some() {
                job.needs = needs;
            }
        }
        self.check_need_cycles(&jobs, &edges);
        Pipeline {
            stages,
            jobs,
            warnings: Vec::new(),
            excluded: None,
        }
    }

    /// `needs` may name jobs of the same stage, so cycles are possible; each is reported once.
    fn check_need_cycles(&mut self, jobs: &[PipelineJob], edges: &[Vec<(usize, usize)>]) {
        // 0 = unvisited, 1 = on the stack, 2 = done. Iterative DFS: no recursion on user input.
        let mut state = vec![0u8; jobs.len()];
        for start in 0..jobs.len() {
            if state[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            state[start] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                if let Some(&(t, line)) = edges[node].get(*next) {
                    *next += 1;
                    match state[t] {
                        0 => {
                            state[t] = 1;
                            stack.push((t, 0));
                        }
                        1 => {
                            let from = stack.iter().position(|&(n, _)| n == t).unwrap_or(0);
                            let mut path: Vec<&str> = stack[from..]
                                .iter()
                                .map(|&(n, _)| jobs[n].name.as_str())
                                .collect();
                            path.push(&jobs[t].name);
                            self.error(
                                line,
                                format!(
                                    "{}: needs: circular dependency: {}",
                                    ctx_for(&jobs[node].name),
                                    path.join(" -> ")
                                ),
                            );
                        }
                        _ => {}
                    }
                } else {
                    state[node] = 2;
                    stack.pop();
                }
            }
        }
    }

    /// The entry `name` with its `extends` applied (deep merge of mappings, GitLab's order:
    /// each parent in list order, then the entry itself; lists and scalars are replaced).
    fn resolve(
        &mut self,
        name: &str,
        defs: &HashMap<&str, &Node>,
        memo: &mut HashMap<String, Option<Node>>,
        stack: &mut Vec<String>,
    ) -> Option<Node> {
        if let Some(done) = memo.get(name) {
            return done.clone();
        }
        let node = *defs.get(name)?;
        let ctx = ctx_for(name);
        let Some(entries) = node.as_map() else {
            // Only reachable for a parent; the caller names it.
            return None;
        };
        let Some(ext) = entries.iter().find(|e| e.key == "extends") else {
            memo.insert(name.to_string(), Some(node.clone()));
            return Some(node.clone());
        };
        let parents: Vec<(String, usize)> = match &ext.value.kind {
            Kind::Scalar { text, .. } if !ext.value.is_null() => {
                vec![(text.clone(), ext.value.line)]
            }
            Kind::Seq(items) if items.iter().all(|i| i.as_scalar().is_some()) => items
                .iter()
                .map(|i| (i.as_scalar().unwrap_or_default().to_string(), i.line))
                .collect(),
            _ => {
                self.error(
                    ext.key_line,
                    format!(
                        "{ctx}: extends: expected a job name or a list of job names, found {}",
                        ext.value.describe()
                    ),
                );
                memo.insert(name.to_string(), None);
                return None;
            }
        };
        stack.push(name.to_string());
        let mut acc: Option<Node> = None;
        let mut ok = true;
        for (parent, line) in parents {
            if stack.contains(&parent) {
                let mut path = stack.clone();
                path.push(parent.clone());
                self.error(
                    line,
                    format!("{ctx}: extends: circular extends: {}", path.join(" -> ")),
                );
                ok = false;
                continue;
            }
            if stack.len() >= MAX_EXTENDS_DEPTH {
                self.error(
                    line,
                    format!("{ctx}: extends: nested more than {MAX_EXTENDS_DEPTH} levels deep"),
                );
                ok = false;
                continue;
            }
            match defs.get(parent.as_str()) {
                None => {
                    self.error(
                        line,
                        format!("{ctx}: extends: unknown job or template \"{parent}\""),
                    );
                    ok = false;
                }
                Some(p) if p.as_map().is_none() => {
                    self.error(
                        line,
                        format!(
                            "{ctx}: extends: \"{parent}\" is {}, not a mapping of job keys",
                            p.describe()
                        ),
                    );
                    ok = false;
                }
                Some(_) => match self.resolve(&parent, defs, memo, stack) {
                    Some(p) => {
                        acc = Some(match acc {
                            None => p,
                            Some(a) => deep_merge(&a, &p),
                        })
                    }
                    None => ok = false,
                },
            }
        }
        stack.pop();
        let own = node.without("extends");
        let result = if ok {
            Some(match acc {
                None => own,
                Some(a) => deep_merge(&a, &own),
            })
        } else {
            None
        };
        memo.insert(name.to_string(), result.clone());
        result
    }

    fn defaults(&mut self, node: &Node) -> Option<Defaults> {
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

    fn job(
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
        let mut trigger = false;
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
                "dependencies" => job.dependencies = self.string_list(&what, v),
                "cache" => cache = self.cache(&what, v),
                "trigger" => trigger = true,
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
        if trigger {
            // A trigger job starts a downstream pipeline in GitLab; there is none here.
            let d = self.diagnostic(
                line,
                format!("{ctx}: a trigger job starts a downstream pipeline, which a local run does not have; not run"),
            );
            self.ignored.push(d);
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
        if node.get("script").is_none() {
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
        if let Some(r) = rule {
            layer(&mut job.variables, r.variables.iter().cloned());
            if let Some(n) = &r.needs {
                raw.needs = Some(n.clone());
            }
            if let Some(i) = r.interruptible {
                job.interruptible = i;
            }
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

    /// The jobs `base` stands for: one per `parallel:` combination (or just itself), each with
    /// its variables and its snapshot names resolved.
    fn instances(
        &mut self,
        base: RawJob,
        parallel: Option<ParallelSpec>,
        snapshot: Option<SnapshotSpec>,
        restore: Option<(String, usize)>,
    ) -> Vec<RawJob> {
        let name = base.job.name.clone();
        // (job name, CI_NODE_INDEX, matrix variables)
        let plan: Vec<(String, u32, MatrixVars)> = match parallel {
            None => vec![(name.clone(), 0, Vec::new())],
            Some(ParallelSpec::Count(n)) => (1..=n)
                .map(|i| (format!("{name} {i}/{n}"), i, Vec::new()))
                .collect(),
            Some(ParallelSpec::Matrix(sets)) => (1u32..)
                .zip(sets)
                .map(|(i, vars)| {
                    let values: Vec<&str> = vars.iter().map(|(_, v)| v.as_str()).collect();
                    (format!("{name}: [{}]", values.join(", ")), i, vars)
                })
                .collect(),
        };
        let total = u32::try_from(plan.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(plan.len());
        // One report per key of the job as written, not one per job it expands to.
        let (mut bad_snapshot, mut bad_restore) = (false, false);
        for (instance_name, index, matrix_vars) in plan {
            let mut raw = RawJob {
                job: base.job.clone(),
                stage_line: base.stage_line,
                needs: base.needs.as_ref().map(|n| n.to_vec()),
            };
            let job = &mut raw.job;
            if index > 0 {
                job.name = instance_name;
                job.parallel = Some(ParallelInstance {
                    job: name.clone(),
                    index,
                    total,
                });
                // Matrix values replace the job's variables of the same name, as in GitLab.
                for (key, value) in matrix_vars {
                    job.variables.retain(|v| v.key != key);
                    job.variables.push(Variable::new(key, value));
                }
                // Predefined, so a variable of the job's own of the same name wins.
                let mut node_vars = Vec::new();
                for (key, value) in [("CI_NODE_INDEX", index), ("CI_NODE_TOTAL", total)] {
                    if !job.variables.iter().any(|v| v.key == key) {
                        node_vars.push(Variable::new(key, value.to_string()));
                    }
                }
                job.variables.splice(0..0, node_vars);
            }
            let ctx = ctx_for(&job.name);
            job.snapshot = match &snapshot {
                None => None,
                Some(SnapshotSpec::OnFailure) => Some(Snapshot::OnFailure),
                Some(SnapshotSpec::Save { name, line }) => {
                    match snapshot_name(name, &job.variables) {
                        Ok(n) => Some(Snapshot::Save(n)),
                        Err(why) => {
                            if !bad_snapshot {
                                self.error(*line, format!("{ctx}: snapshot:save: {why}"));
                            }
                            bad_snapshot = true;
                            None
                        }
                    }
                }
            };
            job.restore = match &restore {
                None => None,
                Some((name, line)) => match snapshot_name(name, &job.variables) {
                    Ok(n) => Some(n),
                    Err(why) => {
                        if !bad_restore {
                            self.error(*line, format!("{ctx}: restore: {why}"));
                        }
                        bad_restore = true;
                        None
                    }
                },
            };
            out.push(raw);
        }
        out
    }

    /// `parallel: N` or `parallel: matrix: [...]`.
    fn parallel(&mut self, ctx: &str, node: &Node) -> Option<ParallelSpec> {
        let expected =
            format!("a whole number from 2 to {MAX_PARALLEL} or a mapping with \"matrix\"");
        if let Some(text) = node.as_scalar() {
            if node.as_bool().is_none()
                && let Ok(n) = text.parse::<u64>()
            {
                if (2..=u64::from(MAX_PARALLEL)).contains(&n) {
                    return u32::try_from(n).ok().map(ParallelSpec::Count);
                }
                self.error(
                    node.line,
                    format!("{ctx}: parallel: {n} is out of range (2 to {MAX_PARALLEL})"),
                );
                return None;
            }
            self.error(
                node.line,
                format!("{ctx}: parallel: expected {expected}, found {text:?}"),
            );
            return None;
        }
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{ctx}: parallel: expected {expected}, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        let mut matrix = None;
        for e in entries {
            match e.key.as_str() {
                "matrix" => matrix = self.matrix(ctx, e.key_line, &e.value),
                k => self.error(
                    e.key_line,
                    format!("{ctx}: parallel: unknown key \"{k}\" (expected matrix)"),
                ),
            }
        }
        if node.get("matrix").is_none() {
            self.error(node.line, format!("{ctx}: parallel: missing \"matrix\""));
        }
        matrix.map(ParallelSpec::Matrix)
    }

    /// `parallel: matrix:`: the variables of each job it makes, GitLab's order (entries in turn;
    /// within one, the cartesian product with the first variable varying slowest). `key_line`:
    /// where `matrix:` is, for problems of the whole list.
    fn matrix(&mut self, ctx: &str, key_line: usize, node: &Node) -> Option<Vec<MatrixVars>> {
        let what = format!("{ctx}: parallel:matrix");
        let Some(items) = node.as_list() else {
            self.error(
                node.line,
                format!(
                    "{what}: expected a list of mappings of variables to values, found {}",
                    node.describe()
                ),
            );
            return None;
        };
        if items.is_empty() {
            self.error(node.line, format!("{what}: expected at least one entry"));
            return None;
        }
        let mut ok = true;
        let mut axes_per_entry = Vec::new();
        for (i, item) in (1usize..).zip(items) {
            let Some(vars) = item.as_map() else {
                self.error(
                    item.line,
                    format!(
                        "{what}: entry {i}: expected a mapping of variables to values, found {}",
                        item.describe()
                    ),
                );
                ok = false;
                continue;
            };
            if vars.is_empty() {
                self.error(
                    item.line,
                    format!("{what}: entry {i}: expected at least one variable"),
                );
                ok = false;
                continue;
            }
            let mut axes: Vec<(String, Vec<String>)> = Vec::new();
            for v in vars {
                let values: Option<Vec<String>> = match &v.value.kind {
                    Kind::Seq(list) => list
                        .iter()
                        .map(|x| x.as_scalar().map(str::to_string))
                        .collect(),
                    _ => v.value.as_scalar().map(|x| vec![x.to_string()]),
                };
                match values {
                    Some(values) if values.is_empty() => {
                        self.error(
                            v.key_line,
                            format!("{what}: entry {i}: {} must not be an empty list", v.key),
                        );
                        ok = false;
                    }
                    Some(values) => axes.push((v.key.clone(), values)),
                    None => {
                        self.error(
                            v.key_line,
                            format!(
                                "{what}: entry {i}: {} must be a string or a list of strings",
                                v.key
                            ),
                        );
                        ok = false;
                    }
                }
            }
            axes_per_entry.push(axes);
        }
        if !ok {
            return None;
        }
        // Count before building: a few long lists multiply into a huge number of jobs.
        let count = axes_per_entry.iter().fold(0usize, |sum, axes| {
            let product = axes
                .iter()
                .fold(1usize, |p, (_, values)| p.saturating_mul(values.len()));
            sum.saturating_add(product)
        });
        if count > MAX_PARALLEL as usize {
            let shown = if count == usize::MAX {
                "too many".to_string()
            } else {
                count.to_string()
            };
            self.error(
                key_line,
                format!("{what}: makes {shown} jobs, more than the limit of {MAX_PARALLEL}"),
            );
            return None;
        }
        let mut jobs = Vec::with_capacity(count);
        for axes in axes_per_entry {
            let mut combos: Vec<MatrixVars> = vec![Vec::new()];
            for (key, values) in axes {
                let mut next = Vec::with_capacity(combos.len() * values.len());
                for combo in &combos {
                    for v in &values {
                        let mut c = combo.clone();
                        c.push((key.clone(), v.clone()));
                        next.push(c);
                    }
                }
                combos = next;
            }
            jobs.extend(combos);
        }
        Some(jobs)
    }

    /// `snapshot: on_failure` or `snapshot: {save: NAME}`; `ctx` names the job or `default`.
    fn snapshot(&mut self, ctx: &str, node: &Node) -> Option<SnapshotSpec> {
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

    fn artifacts(&mut self, ctx: &str, node: &Node, job: &mut PipelineJob) {
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
                    let paths = self
                        .string_list(&format!("{ctx}: artifacts:paths"), &e.value)
                        .unwrap_or_default();
                    // As in GitLab, artifacts come from inside the project directory only.
                    for p in &paths {
                        let why = if p.starts_with('/') {
                            Some("is absolute")
                        } else if p.split('/').any(|c| c == "..") {
                            Some("leaves the project directory")
                        } else {
                            None
                        };
                        if let Some(why) = why {
                            self.error(
                                e.value.line,
                                format!("{ctx}: artifacts:paths: {p:?} {why}; paths must be inside the project directory"),
                            );
                        }
                    }
                    job.artifact_paths = paths;
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

    fn needs(&mut self, ctx: &str, node: &Node) -> Option<Vec<RawNeed>> {
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
        let mut out = Vec::new();
        for item in items {
            if let Some(name) = item.as_scalar() {
                out.push(RawNeed {
                    job: name.to_string(),
                    artifacts: true,
                    optional: false,
                    line: item.line,
                    matrix: None,
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
            let mut need = RawNeed {
                job: String::new(),
                artifacts: true,
                optional: false,
                line: item.line,
                matrix: None,
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

    fn timeout(&mut self, ctx: &str, node: &Node) -> Option<Duration> {
        self.duration(&format!("{ctx}: timeout"), node)
    }

    /// `image:`: a name, or `{name, pull_policy, entrypoint, docker}`.
    fn image(&mut self, what: &str, node: &Node) -> Option<Image> {
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
                "pull_policy" => {
                    let policies = match e.value.as_scalar() {
                        Some(p) => vec![p.to_string()],
                        None => self.string_list(&sub, &e.value)?,
                    };
                    for p in &policies {
                        if !matches!(p.as_str(), "always" | "if-not-present" | "never") {
                            self.error(
                                e.value.line,
                                format!("{sub}: unknown policy \"{p}\" (expected always, if-not-present or never)"),
                            );
                            return None;
                        }
                    }
                    image.pull_policy = policies;
                }
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

    /// `services:`: image names, or maps with `name`, `alias`, `entrypoint`, `command` and
    /// `variables`.
    fn services(&mut self, what: &str, node: &Node) -> Option<Vec<Image>> {
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

    fn string(&mut self, what: &str, node: &Node) -> Option<String> {
        match &node.kind {
            Kind::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
            _ => {
                self.error(
                    node.line,
                    format!("{what}: expected a string, found {}", node.describe()),
                );
                None
            }
        }
    }

    fn string_list(&mut self, what: &str, node: &Node) -> Option<Vec<String>> {
        let bad = |n: &Node| format!("{what}: expected a list of strings, found {}", n.describe());
        let Kind::Seq(items) = &node.kind else {
            self.error(node.line, bad(node));
            return None;
        };
        let mut out = Vec::new();
        for item in items {
            match item.as_scalar() {
                Some(s) => out.push(s.to_string()),
                None => {
                    let msg = format!(
                        "{what}: expected a list of strings, found {} in the list",
                        item.describe()
                    );
                    self.error(item.line, msg);
                    return None;
                }
            }
        }
        Some(out)
    }

    /// A script: a string, or a list of strings and (nested) lists of strings, flattened.
    fn script(&mut self, what: &str, node: &Node) -> Option<Vec<String>> {
        let mut out = Vec::new();
        match &node.kind {
            Kind::Scalar { text, .. } if !node.is_null() => out.push(text.clone()),
            Kind::Seq(items) => {
                if !self.flatten(what, items, 1, &mut out) {
                    return None;
                }
            }
            _ => {
                self.error(
                    node.line,
                    format!(
                        "{what}: expected a string or a list of strings, found {}",
                        node.describe()
                    ),
                );
                return None;
            }
        }
        Some(out)
    }

    fn flatten(&mut self, what: &str, items: &[Node], depth: usize, out: &mut Vec<String>) -> bool {
        if depth > MAX_SCRIPT_DEPTH {
            let line = items.first().map_or(1, |n| n.line);
            self.error(
                line,
                format!("{what}: lists nested more than {MAX_SCRIPT_DEPTH} levels deep"),
            );
            return false;
        }
        let mut ok = true;
        for item in items {
            match &item.kind {
                Kind::Scalar { text, .. } if !item.is_null() => out.push(text.clone()),
                Kind::Seq(inner) => ok &= self.flatten(what, inner, depth + 1, out),
                Kind::Map(_) => {
                    // The usual cause: an unquoted `: ` inside a line turns it into a mapping.
                    self.error(
                        item.line,
                        format!(
                            "{what}: expected a string or a list of strings, found a mapping \
                             (quote script lines that contain \": \")"
                        ),
                    );
                    ok = false;
                }
                _ => {
                    self.error(
                        item.line,
                        format!(
                            "{what}: expected a string or a list of strings, found {}",
                            item.describe()
                        ),
                    );
                    ok = false;
                }
            }
        }
        ok
    }

    /// `variables:`: `KEY: value` or `KEY: {value:, description:, expand:}`.
    fn variables(&mut self, what: &str, node: &Node) -> Vec<Variable> {
        if node.is_null() {
            return Vec::new();
        }
        let Some(entries) = node.as_map() else {
            self.error(
                node.line,
                format!(
                    "{what}: expected a mapping of names to values, found {}",
                    node.describe()
                ),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries {
            let v = &e.value;
            let mut var = Variable::new(e.key.clone(), "");
            let mut options: Option<(Vec<String>, usize)> = None;
            match &v.kind {
                Kind::Scalar { text, .. } => {
                    if !v.is_null() {
                        var.value = text.clone();
                    }
                }
                Kind::Map(fields) => {
                    for f in fields {
                        match f.key.as_str() {
                            "value" => match f.value.as_scalar() {
                                Some(s) => var.value = s.to_string(),
                                None if f.value.is_null() => {}
                                None => self.error(
                                    f.key_line,
                                    format!(
                                        "{what}: \"{}\": value: expected a string or a number, found {}",
                                        e.key,
                                        f.value.describe()
                                    ),
                                ),
                            },
                            "description" => {}
                            "options" => {
                                let what = format!("{what}: \"{}\": options", e.key);
                                options = self.string_list(&what, &f.value).map(|o| (o, f.key_line));
                            }
                            "expand" => match f.value.as_bool() {
                                Some(b) => var.raw = !b,
                                None => self.error(
                                    f.key_line,
                                    format!(
                                        "{what}: \"{}\": expand: expected true or false, found {}",
                                        e.key,
                                        f.value.describe()
                                    ),
                                ),
                            },
                            k => {
                                let (ctx, key) = split_ctx(what);
                                self.unsupported(f.key_line, ctx, &format!("{key}:{}:{k}", e.key))
                            }
                        }
                    }
                }
                Kind::Seq(_) | Kind::Reference(_) => {
                    self.error(
                        e.key_line,
                        format!(
                            "{what}: \"{}\": expected a string or a number, found {}",
                            e.key,
                            v.describe()
                        ),
                    );
                    continue;
                }
            }
            if let Some((options, line)) = options
                && !options.contains(&var.value)
            {
                self.error(
                    line,
                    format!(
                        "{what}: \"{}\": the value {:?} is not one of its options: {}",
                        e.key,
                        var.value,
                        options.join(", ")
                    ),
                );
            }
            out.push(var);
        }
        out
    }
}

/// A snapshot name from `template`, with `$VAR` and `${VAR}` replaced by `vars` (the last of a
/// name wins), checked: 1 to 64 of `A-Z a-z 0-9 . _ -`, and not `.` or `..` (it may become a
/// file name). The error says what is wrong, naming the template.
fn snapshot_name(template: &str, vars: &[Variable]) -> Result<String, String> {
    let name = expand_vars(template, vars)
        .map_err(|var| format!("variable \"{var}\" in {template:?} is not defined for this job"))?;
    let valid = (1..=MAX_SNAPSHOT_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != "."
        && name != "..";
    if valid {
        return Ok(name);
    }
    let from = if name == template {
        String::new()
    } else {
        format!(" (from {template:?})")
    };
    Err(format!(
        "invalid snapshot name {name:?}{from}: expected 1 to {MAX_SNAPSHOT_NAME} letters, \
         digits, \".\", \"_\" or \"-\" (not \".\" or \"..\")"
    ))
}

/// Replaces `$VAR` and `${VAR}` in `text` with the value of the last variable of that name in
/// `vars` (one level: values are not expanded again). `Err` carries the first name that is not
/// defined.
fn expand_vars(text: &str, vars: &[Variable]) -> Result<String, String> {
    let missing = std::cell::RefCell::new(None::<String>);
    let out = variables::expand(text, &|name| {
        let found = lookup_in(vars, name);
        if found.is_none() {
            missing.borrow_mut().get_or_insert_with(|| name.to_string());
        }
        found
    });
    match missing.into_inner() {
        Some(name) => Err(name),
        None => Ok(out),
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
