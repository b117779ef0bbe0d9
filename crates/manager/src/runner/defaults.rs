//! What a runner's config adds to every job: `environment`, `pre_get_sources_script`,
//! `post_get_sources_script`, `pre_build_script` and `post_build_script`.

use slipway_job::{JobResponse, Step, StepName, Variable};

use slipway_config::RunnerConfig;
use slipway_executor::job::{POST_GET_SOURCES, PRE_GET_SOURCES};

/// What the runner's config adds to every job: `environment`, `pre_build_script` and
/// `post_build_script`.
#[derive(Debug, Clone, Default)]
pub struct JobDefaults {
    /// `KEY=VALUE` variables, overriding the job's own.
    pub environment: Vec<(String, String)>,
    /// Runs in the script step's shell before the job's script.
    pub pre_build_script: Option<String>,
    /// Runs in the script step's shell after the job's script (not after a failure).
    pub post_build_script: Option<String>,
    /// Runs where the job runs before its sources are fetched (before the job's own
    /// `hooks:pre_get_sources_script`).
    pub pre_get_sources_script: Option<String>,
    /// Runs where the job runs after its sources are fetched (after the job's own
    /// `hooks:post_get_sources_script`).
    pub post_get_sources_script: Option<String>,
}

impl JobDefaults {
    /// The runner config's defaults.
    pub fn of(cfg: &RunnerConfig) -> Self {
        Self {
            environment: cfg
                .environment
                .iter()
                .filter_map(|e| e.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            pre_build_script: cfg
                .pre_build_script
                .clone()
                .filter(|s| !s.trim().is_empty()),
            post_build_script: cfg
                .post_build_script
                .clone()
                .filter(|s| !s.trim().is_empty()),
            pre_get_sources_script: cfg
                .pre_get_sources_script
                .clone()
                .filter(|s| !s.trim().is_empty()),
            post_get_sources_script: cfg
                .post_get_sources_script
                .clone()
                .filter(|s| !s.trim().is_empty()),
        }
    }

    /// `job` with the defaults applied (and nothing else: see [`JobDefaults::prepare`]).
    pub fn apply(&self, job: &JobResponse) -> JobResponse {
        let mut job = job.clone();
        for (key, value) in &self.environment {
            job.variables.push(Variable {
                key: key.clone(),
                value: value.clone(),
                public: true,
                ..Variable::default()
            });
        }
        if self.pre_build_script.is_some() || self.post_build_script.is_some() {
            let script = match job.steps.iter_mut().find(|s| s.name == StepName::Script) {
                Some(s) => s,
                None => {
                    job.steps.push(Step {
                        name: StepName::Script,
                        ..Step::default()
                    });
                    let last = job.steps.len() - 1;
                    &mut job.steps[last]
                }
            };
            if let Some(pre) = &self.pre_build_script {
                script.script.insert(0, pre.trim_end().to_string());
            }
            if let Some(post) = &self.post_build_script {
                script.script.push(post.trim_end().to_string());
            }
        }
        if let Some(pre) = &self.pre_get_sources_script {
            let mut lines = vec![pre.trim_end().to_string()];
            lines.extend(job.hook_lines(PRE_GET_SOURCES));
            job.set_hook_lines(PRE_GET_SOURCES, lines);
        }
        if let Some(post) = &self.post_get_sources_script {
            let mut lines = job.hook_lines(POST_GET_SOURCES);
            lines.push(post.trim_end().to_string());
            job.set_hook_lines(POST_GET_SOURCES, lines);
        }
        job
    }

    /// `job` as its steps see it: the defaults applied, then the `$VARIABLE`s of its artifact
    /// and cache paths expanded with the variables that now hold.
    pub fn prepare(&self, job: &JobResponse) -> JobResponse {
        let mut job = self.apply(job);
        expand_paths(&mut job);
        job
    }
}

/// `$VARIABLE`s in artifact and cache paths, exclusions and names replaced by the job's
/// variables, as GitLab Runner expands them; `$CI_PROJECT_DIR` and `$CI_BUILDS_DIR` in paths
/// are resolved where the job runs (see [`slipway_executor::artifact_paths`]).
fn expand_paths(job: &mut JobResponse) {
    let snapshot = job.clone();
    let path = |v: &mut String| *v = slipway_executor::artifact_paths::expand(v, &snapshot);
    for a in &mut job.artifacts {
        a.paths.iter_mut().for_each(path);
        a.exclude.iter_mut().for_each(path);
        a.name = snapshot.expand(&a.name);
    }
    for c in &mut job.cache {
        c.paths.iter_mut().for_each(path);
    }
}
