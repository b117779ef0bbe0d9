//! The job model: GitLab's job payload (`POST /api/v4/jobs/request`, 201 body) as Rust types.
//!
//! Field names follow GitLab's JSON exactly so a GitLab response deserializes straight into
//! [`JobResponse`]. Every field has a default (and `null` reads as the default) so partial or older
//! payloads parse; fields Slipway does not interpret yet are kept as [`serde_json::Value`] so they
//! survive a round trip.
//!
//! `Debug` is written by hand wherever a secret lives (job tokens, masked variable values,
//! credentials' passwords) so that logging a job never leaks one.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

// `Debug` prints the one mask text in place of a secret.
use crate::trace::MASK as REDACTED;

/// Reads `null` as the type's default: GitLab sends `null` for absent lists and strings.
fn nullable<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(de)?.unwrap_or_default())
}

/// Job timeout when the job names none (GitLab's project default).
pub const DEFAULT_JOB_TIMEOUT: Duration = Duration::from_secs(3600);

/// The longest job timeout honoured, a year (GitLab's own ceiling is a month): a deadline
/// further out would overflow the clock it is added to.
pub const MAX_JOB_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// One job as handed to a runner: GitLab's job payload.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobResponse {
    /// Job ID.
    pub id: u64,
    /// Job token (secret: authenticates trace, artifact and status calls).
    #[serde(deserialize_with = "nullable")]
    pub token: String,
    /// Whether the runner may `git fetch` into an existing checkout.
    #[serde(deserialize_with = "nullable")]
    pub allow_git_fetch: bool,
    /// Job, project and queue facts.
    #[serde(deserialize_with = "nullable")]
    pub job_info: JobInfo,
    /// What to check out.
    #[serde(deserialize_with = "nullable")]
    pub git_info: GitInfo,
    /// Runner-side settings for this job (timeout).
    #[serde(deserialize_with = "nullable")]
    pub runner_info: RunnerInfo,
    /// Job inputs (not interpreted yet).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub inputs: serde_json::Value,
    /// Variables, in the order GitLab sends them (later ones win).
    #[serde(deserialize_with = "nullable")]
    pub variables: Vec<Variable>,
    /// What to run: `script`, `after_script`, ...
    #[serde(deserialize_with = "nullable")]
    pub steps: Vec<Step>,
    /// The job's image, if any.
    pub image: Option<Image>,
    /// Service containers.
    #[serde(deserialize_with = "nullable")]
    pub services: Vec<Image>,
    /// Artifacts to upload after the job.
    #[serde(deserialize_with = "nullable")]
    pub artifacts: Vec<ArtifactSpec>,
    /// Caches to restore and save.
    #[serde(deserialize_with = "nullable")]
    pub cache: Vec<CacheSpec>,
    /// Registry and other credentials.
    #[serde(deserialize_with = "nullable")]
    pub credentials: Vec<Credential>,
    /// Earlier jobs whose artifacts this job downloads.
    #[serde(deserialize_with = "nullable")]
    pub dependencies: Vec<Dependency>,
    /// What the server supports for this job.
    #[serde(deserialize_with = "nullable")]
    pub features: Features,
    /// External secrets (not interpreted yet).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub secrets: serde_json::Value,
    /// The job's `hooks:` as GitLab sends them: `[{"name": "pre_get_sources_script",
    /// "script": [...]}]` (see [`JobResponse::hook_lines`]).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub hooks: serde_json::Value,
    /// Step-runner `run` definition (not interpreted yet).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub run: serde_json::Value,
    /// Pipeline execution policy options (not interpreted yet).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub policy_options: serde_json::Value,
    /// Whether to suspend the environment after the job (not interpreted yet).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub suspend_options: serde_json::Value,
}

impl JobResponse {
    /// The job's timeout: `runner_info.timeout` ([`DEFAULT_JOB_TIMEOUT`] when it gives none), at
    /// most [`MAX_JOB_TIMEOUT`], whatever the payload says.
    pub fn timeout(&self) -> Duration {
        match self.runner_info.timeout {
            0 => DEFAULT_JOB_TIMEOUT,
            s => Duration::from_secs(s).min(MAX_JOB_TIMEOUT),
        }
    }

    /// Parses GitLab's JSON job payload.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The script lines of hook `name` (`pre_get_sources_script`, `post_get_sources_script`);
    /// entries that are not `{name, script: [strings]}` are skipped.
    pub fn hook_lines(&self, name: &str) -> Vec<String> {
        self.hooks
            .as_array()
            .into_iter()
            .flatten()
            .filter(|h| h.get("name").and_then(serde_json::Value::as_str) == Some(name))
            .filter_map(|h| h.get("script")?.as_array())
            .flatten()
            .filter_map(|l| l.as_str().map(str::to_string))
            .collect()
    }

    /// Replace the script lines of hook `name` (none: the hook goes).
    pub fn set_hook_lines(&mut self, name: &str, lines: Vec<String>) {
        let mut hooks: Vec<serde_json::Value> = self
            .hooks
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|h| h.get("name").and_then(serde_json::Value::as_str) != Some(name))
            .collect();
        if !lines.is_empty() {
            hooks.push(serde_json::json!({"name": name, "script": lines}));
        }
        self.hooks = if hooks.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::Array(hooks)
        };
    }

    /// The value of variable `key`; the last definition wins, as in GitLab.
    pub fn variable(&self, key: &str) -> Option<&str> {
        self.variables
            .iter()
            .rev()
            .find(|v| v.key == key)
            .map(|v| v.value.as_str())
    }

    /// What `GIT_STRATEGY` asks for: the variable, else `fetch` when the project allows it
    /// (`allow_git_fetch`), else `clone`.
    pub fn git_strategy(&self) -> Result<GitStrategy, String> {
        match self.variable("GIT_STRATEGY").map(str::trim) {
            None | Some("") => Ok(if self.allow_git_fetch {
                GitStrategy::Fetch
            } else {
                GitStrategy::Clone
            }),
            Some("clone") => Ok(GitStrategy::Clone),
            Some("fetch") => Ok(GitStrategy::Fetch),
            Some("none" | "empty") => Ok(GitStrategy::None),
            Some(other) => Err(format!(
                "GIT_STRATEGY {other:?} is not supported; expected clone, fetch or none"
            )),
        }
    }

    /// Whether the job gets sources: it names a repository and `GIT_STRATEGY` is not `none`.
    pub fn ships_sources(&self) -> bool {
        !self.git_info.repo_url.trim().is_empty() && self.git_strategy() != Ok(GitStrategy::None)
    }

    /// Secrets to mask in the job's output: masked variable values and the job token.
    ///
    /// Empty strings are left out (masking "" would match everywhere).
    pub fn masked_values(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let candidates = self
            .variables
            .iter()
            .filter(|v| v.masked)
            .map(|v| v.value.as_str())
            .chain(std::iter::once(self.token.as_str()));
        for value in candidates {
            if !value.is_empty() && !out.contains(&value) {
                out.push(value);
            }
        }
        out
    }
}

impl fmt::Debug for JobResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobResponse")
            .field("id", &self.id)
            .field("token", &REDACTED)
            .field("allow_git_fetch", &self.allow_git_fetch)
            .field("job_info", &self.job_info)
            .field("git_info", &self.git_info)
            .field("runner_info", &self.runner_info)
            .field("variables", &self.variables)
            .field("steps", &self.steps)
            .field("image", &self.image)
            .field("services", &self.services)
            .field("artifacts", &self.artifacts)
            .field("cache", &self.cache)
            .field("credentials", &self.credentials)
            .field("dependencies", &self.dependencies)
            .field("features", &self.features)
            // inputs, secrets, hooks, ... are opaque and may hold secrets: not printed.
            .finish_non_exhaustive()
    }
}

/// Job, project and queue facts (`job_info`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobInfo {
    /// Job name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Stage name.
    #[serde(deserialize_with = "nullable")]
    pub stage: String,
    /// Pipeline ID.
    pub pipeline_id: u64,
    /// Project ID.
    pub project_id: u64,
    /// Project name.
    #[serde(deserialize_with = "nullable")]
    pub project_name: String,
    /// Project path with namespace.
    #[serde(deserialize_with = "nullable")]
    pub project_full_path: String,
    /// Namespace ID.
    pub namespace_id: Option<u64>,
    /// Top-level namespace ID.
    pub root_namespace_id: Option<u64>,
    /// Organization ID.
    pub organization_id: Option<u64>,
    /// GitLab instance ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<serde_json::Value>,
    /// GitLab instance UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_uuid: Option<String>,
    /// User who triggered the job.
    pub user_id: Option<u64>,
    /// Scoped user ID (composite identities).
    pub scoped_user_id: Option<u64>,
    /// Seconds the job waited in the queue.
    pub time_in_queue_seconds: Option<f64>,
    /// Jobs of this project running on instance runners.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_jobs_running_on_instance_runners_count: Option<serde_json::Value>,
    /// Queue size when the job was picked.
    pub queue_size: Option<u64>,
    /// Queue depth when the job was picked.
    pub queue_depth: Option<u64>,
}

/// What to check out (`git_info`).
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GitInfo {
    /// Clone URL (may embed the job token; GitLab's URL is `gitlab-ci-token:<token>@...`).
    #[serde(deserialize_with = "nullable")]
    pub repo_url: String,
    /// `sha1` or `sha256`.
    #[serde(deserialize_with = "nullable")]
    pub repo_object_format: String,
    /// Branch or tag name.
    #[serde(rename = "ref", deserialize_with = "nullable")]
    pub git_ref: String,
    /// Commit to check out.
    #[serde(deserialize_with = "nullable")]
    pub sha: String,
    /// Previous commit of the push.
    #[serde(deserialize_with = "nullable")]
    pub before_sha: String,
    /// `branch` or `tag`.
    #[serde(deserialize_with = "nullable")]
    pub ref_type: String,
    /// Refspecs to fetch.
    #[serde(deserialize_with = "nullable")]
    pub refspecs: Vec<String>,
    /// Clone depth; 0 = full.
    #[serde(deserialize_with = "nullable")]
    pub depth: u32,
    /// Whether the ref is protected.
    pub protected: Option<bool>,
}

impl fmt::Debug for GitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // GitLab embeds the job token in the clone URL (`https://gitlab-ci-token:TOKEN@host/...`).
        let url = redact_userinfo(&self.repo_url);
        f.debug_struct("GitInfo")
            .field("repo_url", &url)
            .field("repo_object_format", &self.repo_object_format)
            .field("ref", &self.git_ref)
            .field("sha", &self.sha)
            .field("before_sha", &self.before_sha)
            .field("ref_type", &self.ref_type)
            .field("refspecs", &self.refspecs)
            .field("depth", &self.depth)
            .field("protected", &self.protected)
            .finish()
    }
}

/// `scheme://user:secret@host/path` → `scheme://[MASKED]@host/path`.
fn redact_userinfo(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            return format!("{}{REDACTED}{}", &url[..scheme_end + 3], &rest[at..]);
        }
    }
    url.to_string()
}

/// Runner-side settings for the job (`runner_info`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunnerInfo {
    /// Runner UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Job timeout in seconds.
    #[serde(deserialize_with = "nullable")]
    pub timeout: u64,
}

/// One job variable.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Variable {
    /// Name.
    #[serde(deserialize_with = "nullable")]
    pub key: String,
    /// Value (secret when `masked`).
    #[serde(deserialize_with = "nullable")]
    pub value: String,
    /// Visible in the job log and API.
    #[serde(deserialize_with = "nullable")]
    pub public: bool,
    /// Written to a file whose path is the variable's value.
    #[serde(deserialize_with = "nullable")]
    pub file: bool,
    /// Masked in the job output.
    #[serde(deserialize_with = "nullable")]
    pub masked: bool,
    /// Not expanded (`$OTHER` stays literal).
    #[serde(deserialize_with = "nullable")]
    pub raw: bool,
}

impl Variable {
    /// A plain public variable.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Variable {
            key: key.into(),
            value: value.into(),
            public: true,
            ..Variable::default()
        }
    }
}

impl fmt::Debug for Variable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value: &dyn fmt::Debug = if self.masked { &REDACTED } else { &self.value };
        f.debug_struct("Variable")
            .field("key", &self.key)
            .field("value", value)
            .field("public", &self.public)
            .field("file", &self.file)
            .field("masked", &self.masked)
            .field("raw", &self.raw)
            .finish()
    }
}

/// Name of a step. GitLab sends `script`, `after_script`, `release` or `run`; others are kept as
/// text so a newer server does not break parsing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum StepName {
    /// `before_script` + `script`.
    #[default]
    Script,
    /// `after_script`: runs after the script step whatever its outcome.
    AfterScript,
    /// The `release` keyword's step.
    Release,
    /// Step-runner `run` steps.
    Run,
    /// A name this version does not know.
    Other(String),
}

impl StepName {
    /// GitLab's name for the step.
    pub fn as_str(&self) -> &str {
        match self {
            StepName::Script => "script",
            StepName::AfterScript => "after_script",
            StepName::Release => "release",
            StepName::Run => "run",
            StepName::Other(s) => s,
        }
    }
}

impl fmt::Display for StepName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for StepName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StepName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "script" => StepName::Script,
            "after_script" => StepName::AfterScript,
            "release" => StepName::Release,
            "run" => StepName::Run,
            _ => StepName::Other(s),
        })
    }
}

/// How a job gets its sources (`GIT_STRATEGY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GitStrategy {
    /// A fresh repository for every job.
    Clone,
    /// Update a kept working copy.
    Fetch,
    /// No sources.
    None,
}

/// When a step (or artifact upload, or pipeline job) runs, given the outcome so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// Only if everything before succeeded.
    #[default]
    OnSuccess,
    /// Only if something before failed.
    OnFailure,
    /// Whatever happened before.
    Always,
}

impl When {
    /// GitLab's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            When::OnSuccess => "on_success",
            When::OnFailure => "on_failure",
            When::Always => "always",
        }
    }

    /// Whether something with this `when` runs after a job that `succeeded` (or not).
    pub fn holds_after(self, succeeded: bool) -> bool {
        match self {
            When::OnSuccess => succeeded,
            When::OnFailure => !succeeded,
            When::Always => true,
        }
    }
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One step: script lines run in one shell session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Step {
    /// Which step.
    #[serde(deserialize_with = "nullable")]
    pub name: StepName,
    /// Script lines.
    #[serde(deserialize_with = "nullable")]
    pub script: Vec<String>,
    /// Timeout in seconds.
    #[serde(deserialize_with = "nullable")]
    pub timeout: u64,
    /// When the step runs.
    #[serde(deserialize_with = "nullable")]
    pub when: When,
    /// Whether a failure of this step leaves the job successful.
    #[serde(deserialize_with = "nullable")]
    pub allow_failure: bool,
}

/// A container image (the job's image or a service).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Image {
    /// Image reference.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Network alias (services).
    #[serde(
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub alias: String,
    /// Command override.
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Entrypoint override.
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    /// Exposed ports.
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    /// Service variables.
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<Variable>,
    /// Pull policies (`always`, `if-not-present`, `never`).
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub pull_policy: Vec<String>,
    /// Executor-specific options (`docker{platform, user}`, `kubernetes{user}`).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub executor_opts: serde_json::Value,
}

impl Image {
    /// An image with only a name.
    pub fn named(name: impl Into<String>) -> Self {
        Image {
            name: name.into(),
            ..Image::default()
        }
    }
}

/// An exposed port of an image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Port {
    /// Port number.
    pub number: u16,
    /// `http` or `https`.
    #[serde(deserialize_with = "nullable")]
    pub protocol: String,
    /// Port name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
}

/// Artifacts to upload after the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ArtifactSpec {
    /// Archive name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Also include untracked files.
    #[serde(deserialize_with = "nullable")]
    pub untracked: bool,
    /// Paths (globs) to include.
    #[serde(deserialize_with = "nullable")]
    pub paths: Vec<String>,
    /// Paths (globs) to leave out.
    #[serde(deserialize_with = "nullable")]
    pub exclude: Vec<String>,
    /// When to upload, given the job's outcome.
    #[serde(deserialize_with = "nullable")]
    pub when: When,
    /// `archive`, `junit`, ...
    #[serde(deserialize_with = "nullable")]
    pub artifact_type: String,
    /// `zip`, `gzip`, `raw`, `zipzstd`, `tarzstd`.
    #[serde(deserialize_with = "nullable")]
    pub artifact_format: String,
    /// Expiry as a GitLab duration (`1 week`).
    #[serde(deserialize_with = "nullable")]
    pub expire_in: String,
}

impl ArtifactSpec {
    /// The `artifact_type` of an entry Slipway adds itself to collect a cache's paths for the
    /// distributed cache (never one GitLab sends, never uploaded as an artifact).
    pub const CACHE_TYPE: &'static str = "slipway-cache";

    /// Whether this entry collects a cache ([`Self::CACHE_TYPE`]).
    pub fn is_cache(&self) -> bool {
        self.artifact_type == Self::CACHE_TYPE
    }
}

/// A cache to restore before and save after the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheSpec {
    /// Cache key.
    #[serde(deserialize_with = "nullable")]
    pub key: String,
    /// Also cache untracked files.
    #[serde(deserialize_with = "nullable")]
    pub untracked: bool,
    /// `pull-push`, `pull` or `push`.
    #[serde(deserialize_with = "nullable")]
    pub policy: String,
    /// Paths (globs) to cache.
    #[serde(deserialize_with = "nullable")]
    pub paths: Vec<String>,
    /// When to save, given the job's outcome.
    #[serde(deserialize_with = "nullable")]
    pub when: When,
    /// Keys to try when `key` has no cache.
    #[serde(deserialize_with = "nullable")]
    pub fallback_keys: Vec<String>,
}

/// A credential for a registry or other service.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Credential {
    /// Kind, e.g. `registry`.
    #[serde(rename = "type", deserialize_with = "nullable")]
    pub kind: String,
    /// Where it applies.
    #[serde(deserialize_with = "nullable")]
    pub url: String,
    /// User name.
    #[serde(deserialize_with = "nullable")]
    pub username: String,
    /// Password (secret).
    #[serde(deserialize_with = "nullable")]
    pub password: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("type", &self.kind)
            .field("url", &self.url)
            .field("username", &self.username)
            .field("password", &REDACTED)
            .finish()
    }
}

/// An earlier job whose artifacts this job downloads.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Dependency {
    /// The earlier job's ID.
    pub id: u64,
    /// Token to download its artifacts (secret).
    #[serde(deserialize_with = "nullable")]
    pub token: String,
    /// The earlier job's name.
    #[serde(deserialize_with = "nullable")]
    pub name: String,
    /// Its artifacts archive, if it has one.
    pub artifacts_file: Option<ArtifactsFile>,
}

impl fmt::Debug for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dependency")
            .field("id", &self.id)
            .field("token", &REDACTED)
            .field("name", &self.name)
            .field("artifacts_file", &self.artifacts_file)
            .finish()
    }
}

/// An artifacts archive of an earlier job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ArtifactsFile {
    /// File name of the archive.
    #[serde(deserialize_with = "nullable")]
    pub filename: String,
    /// Size in bytes.
    #[serde(deserialize_with = "nullable")]
    pub size: u64,
}

/// What the server supports for this job (`features`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Features {
    /// Collapsible trace sections.
    #[serde(deserialize_with = "nullable")]
    pub trace_sections: bool,
    /// Token prefixes to mask (e.g. `glpat-`).
    #[serde(deserialize_with = "nullable")]
    pub token_mask_prefixes: Vec<String>,
    /// Failure reasons the server accepts in `PUT jobs/:id`.
    #[serde(deserialize_with = "nullable")]
    pub failure_reasons: Vec<String>,
    /// Any other feature flags, kept as sent.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_timeout_is_clamped_not_a_clock_overflow() {
        let mut job = JobResponse::default();
        assert_eq!(job.timeout(), DEFAULT_JOB_TIMEOUT);
        job.runner_info.timeout = u64::MAX;
        assert_eq!(job.timeout(), MAX_JOB_TIMEOUT);
        // What every executor does with it: a deadline from now.
        assert!(
            std::time::Instant::now()
                .checked_add(job.timeout())
                .is_some()
        );
    }

    #[test]
    fn hooks_are_read_as_gitlab_sends_them_and_replaced_by_name() {
        let mut job = JobResponse::from_json(
            r#"{"id": 1, "token": "t", "hooks": [
                {"name": "pre_get_sources_script", "script": ["echo a", "echo b"]},
                {"name": "other", "script": ["x"]},
                {"name": "pre_get_sources_script", "script": "not a list"}
            ]}"#,
        )
        .unwrap();
        assert_eq!(
            job.hook_lines("pre_get_sources_script"),
            ["echo a", "echo b"]
        );
        assert!(job.hook_lines("post_get_sources_script").is_empty());
        job.set_hook_lines("pre_get_sources_script", vec!["echo c".into()]);
        assert_eq!(job.hook_lines("pre_get_sources_script"), ["echo c"]);
        assert_eq!(job.hook_lines("other"), ["x"]);
        job.set_hook_lines("other", Vec::new());
        job.set_hook_lines("pre_get_sources_script", Vec::new());
        assert!(job.hooks.is_null());
    }

    #[test]
    fn git_strategy_follows_the_variable_and_the_project() {
        let mut job = JobResponse::default();
        assert_eq!(job.git_strategy(), Ok(GitStrategy::Clone));
        job.allow_git_fetch = true;
        assert_eq!(job.git_strategy(), Ok(GitStrategy::Fetch));
        assert!(!job.ships_sources(), "no repository");
        job.git_info.repo_url = "https://gitlab.example.com/g/p.git".into();
        assert!(job.ships_sources());
        job.variables.push(Variable {
            key: "GIT_STRATEGY".into(),
            value: "none".into(),
            ..Default::default()
        });
        assert_eq!(job.git_strategy(), Ok(GitStrategy::None));
        assert!(!job.ships_sources());
        job.variables[0].value = "svn".into();
        assert!(job.git_strategy().is_err());
    }

    const PAYLOAD: &str = r#"{
        "id": 42,
        "token": "glcbt-secret-token",
        "allow_git_fetch": true,
        "job_info": {"name": "build", "stage": "build", "pipeline_id": 7, "project_id": 3,
                     "project_name": "demo", "time_in_queue_seconds": 1.5},
        "git_info": {"repo_url": "https://gitlab-ci-token:url-token@example.com/demo.git", "ref": "main", "sha": "abc",
                     "before_sha": "000", "ref_type": "branch", "refspecs": [], "depth": 20},
        "runner_info": {"timeout": 3600},
        "variables": [
            {"key": "CI", "value": "true", "public": true, "masked": false},
            {"key": "PASSWORD", "value": "hunter22", "public": false, "masked": true},
            {"key": "CI", "value": "yes", "public": true}
        ],
        "steps": [
            {"name": "script", "script": ["make"], "timeout": 3600, "when": "on_success",
             "allow_failure": false},
            {"name": "after_script", "script": ["echo done"], "timeout": 3600, "when": "always",
             "allow_failure": true},
            {"name": "future_step", "script": [], "timeout": 1, "when": "always"}
        ],
        "image": {"name": "alpine:3", "entrypoint": [""], "pull_policy": ["if-not-present"]},
        "services": null,
        "artifacts": [{"name": "out", "untracked": false, "paths": ["out/"], "when": "on_success",
                       "artifact_type": "archive", "artifact_format": "zip", "expire_in": "1 week"}],
        "cache": [],
        "credentials": [{"type": "registry", "url": "r.example.com", "username": "u",
                         "password": "registry-pass"}],
        "dependencies": [{"id": 41, "token": "dep-token", "name": "prep",
                          "artifacts_file": {"filename": "artifacts.zip", "size": 100}}],
        "features": {"trace_sections": true, "failure_reasons": ["script_failure"],
                     "something_new": 1}
    }"#;

    #[test]
    fn parses_gitlab_payload() {
        let job = JobResponse::from_json(PAYLOAD).unwrap();
        assert_eq!(job.id, 42);
        assert_eq!(job.job_info.name, "build");
        assert_eq!(job.job_info.pipeline_id, 7);
        assert_eq!(job.git_info.git_ref, "main");
        assert_eq!(job.runner_info.timeout, 3600);
        assert_eq!(job.steps[0].name, StepName::Script);
        assert_eq!(job.steps[1].name, StepName::AfterScript);
        assert_eq!(job.steps[1].when, When::Always);
        assert_eq!(job.steps[2].name, StepName::Other("future_step".into()));
        assert_eq!(job.image.as_ref().unwrap().name, "alpine:3");
        assert!(job.services.is_empty());
        assert_eq!(
            job.dependencies[0].artifacts_file.as_ref().unwrap().size,
            100
        );
        assert_eq!(job.features.other["something_new"], 1);
        // The last definition wins, as in GitLab.
        assert_eq!(job.variable("CI"), Some("yes"));
        assert_eq!(job.variable("NOPE"), None);
        assert_eq!(job.masked_values(), vec!["hunter22", "glcbt-secret-token"]);
    }

    #[test]
    fn round_trips_through_json() {
        let job = JobResponse::from_json(PAYLOAD).unwrap();
        let again = JobResponse::from_json(&serde_json::to_string(&job).unwrap()).unwrap();
        assert_eq!(job, again);
    }

    #[test]
    fn partial_payloads_parse() {
        let job = JobResponse::from_json(r#"{"id": 1}"#).unwrap();
        assert_eq!(job.id, 1);
        assert!(job.steps.is_empty());
        assert!(job.image.is_none());
        let job = JobResponse::from_json(r#"{"id": 1, "token": null, "git_info": null}"#).unwrap();
        assert_eq!(job.token, "");
    }

    #[test]
    fn debug_hides_secrets() {
        let job = JobResponse::from_json(PAYLOAD).unwrap();
        let text = format!("{job:?}");
        assert!(
            text.contains("https://[MASKED]@example.com/demo.git"),
            "{text}"
        );
        for secret in [
            "url-token",
            "glcbt-secret-token",
            "hunter22",
            "registry-pass",
            "dep-token",
        ] {
            assert!(!text.contains(secret), "{secret} leaked in {text}");
        }
        assert!(text.contains("PASSWORD"));
        assert!(text.contains("\"yes\""), "unmasked values are shown");
    }
}
