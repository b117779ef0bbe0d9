//! Job payloads shaped like GitLab's `POST jobs/request` answers.

use super::*;

/// A job payload shaped like GitLab's `POST jobs/request` 201 body, with id 0 (assigned by
/// [`FakeGitlab::enqueue`]) and one `script` step.
pub fn job_payload(name: &str, script: &[&str]) -> Value {
    job_payload_with_vars(name, script, &[])
}

/// [`job_payload`] with `extra` public variables after the predefined ones.
pub fn job_payload_with_vars(name: &str, script: &[&str], extra: &[(&str, &str)]) -> Value {
    let var = |key: &str, value: &str, public: bool, masked: bool| json!({"key": key, "value": value, "public": public, "file": false, "masked": masked});
    let mut variables = vec![
        var("CI_JOB_ID", "0", true, false),
        var("CI_JOB_NAME", name, true, false),
        var("CI_PROJECT_PATH", "group/project", true, false),
        var("CI_SERVER_URL", "", true, false),
        var("CI_JOB_TOKEN", "", false, true),
    ];
    variables.extend(extra.iter().map(|(k, v)| var(k, v, true, false)));
    json!({
        "id": 0,
        "token": "",
        "allow_git_fetch": true,
        "job_info": {
            "name": name,
            "stage": "test",
            "project_id": 1,
            "project_name": "project",
            "project_full_path": "group/project",
            "pipeline_id": 1,
        },
        "git_info": {
            "repo_url": "https://gitlab.example.com/group/project.git",
            "ref": "main",
            "sha": "69b18e5ed3610cf646119c3e38f462c64ec462b7",
            "before_sha": "0000000000000000000000000000000000000000",
            "ref_type": "branch",
            "refspecs": ["+refs/heads/main:refs/remotes/origin/main"],
            "depth": 0,
        },
        "runner_info": {"timeout": 3600},
        "variables": variables,
        "steps": [{
            "name": "script",
            "script": script,
            "timeout": 3600,
            "when": "on_success",
            "allow_failure": false,
        }],
        "image": null,
        "services": [],
        "artifacts": [],
        "cache": [],
        "credentials": [],
        "dependencies": [],
        "features": {
            "trace_sections": true,
            "token_mask_prefixes": ["glpat-", "glcbt-"],
            "failure_reasons": FAILURE_REASONS,
        },
    })
}
