//! A pipeline job as an executor receives it: GitLab's job payload.

use super::{
    ISOLATION_VARIABLE, PipelineJob, RESTORE_VARIABLE, SNAPSHOT_SAVE_VARIABLE, SNAPSHOT_VARIABLE,
    Snapshot,
};
use slipway_job::model::{
    ArtifactSpec, JobInfo, JobResponse, RunnerInfo, Step, StepName, Variable, When,
};

impl PipelineJob {
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
