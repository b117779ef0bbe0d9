//! The environment of a driver call: the protocol's variables, the job's and predefined CI
//! variables prefixed with `CUSTOM_ENV_`, and `config_exec`'s `job_env`.

use slipway_job::model::JobResponse;

use super::session::Session;
use super::{BUILD_FAILURE_EXIT_CODE, SYSTEM_FAILURE_EXIT_CODE};

impl Session<'_> {
    /// The environment of a driver call (on top of the runner's own).
    pub(super) fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("TMPDIR".into(), self.files.path().display().to_string()),
            (
                "BUILD_FAILURE_EXIT_CODE".into(),
                BUILD_FAILURE_EXIT_CODE.to_string(),
            ),
            (
                "SYSTEM_FAILURE_EXIT_CODE".into(),
                SYSTEM_FAILURE_EXIT_CODE.to_string(),
            ),
            (
                "JOB_RESPONSE_FILE".into(),
                self.files.response.display().to_string(),
            ),
        ];
        env.extend(
            custom_env(self.job, &self.builds_dir, self.slot, self.shared)
                .into_iter()
                .map(|(k, v)| (format!("CUSTOM_ENV_{k}"), v)),
        );
        env.extend(
            self.job_env
                .iter()
                .filter(|(k, _)| env_name_ok(k))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        env
    }
}

/// The variables a driver sees with the `CUSTOM_ENV_` prefix: the job's, then the predefined
/// ones the runner computes.
pub fn custom_env(
    job: &JobResponse,
    builds_dir: &str,
    slot: u32,
    shared: bool,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    if job.variable("CI_JOB_ID").is_none() {
        env.push(("CI_JOB_ID".into(), job.id.to_string()));
    }
    env.extend(
        job.variables
            .iter()
            .filter(|v| env_name_ok(&v.key) && !v.value.contains('\0'))
            .map(|v| (v.key.clone(), v.value.clone())),
    );
    let slot_dir = format!("{}/slot-{slot}", builds_dir.trim_end_matches('/'));
    let project_dir = format!("{slot_dir}/job-{}", job.id);
    env.push(("CI_BUILDS_DIR".into(), slot_dir));
    env.push(("CI_PROJECT_DIR".into(), project_dir));
    env.push(("CI_CONCURRENT_ID".into(), slot.to_string()));
    env.push(("CI_CONCURRENT_PROJECT_ID".into(), slot.to_string()));
    env.push(("CI_SERVER".into(), "yes".into()));
    let kind = if shared {
        "CI_SHARED_ENVIRONMENT"
    } else {
        "CI_DISPOSABLE_ENVIRONMENT"
    };
    env.push((kind.into(), "true".into()));
    let image = job
        .image
        .as_ref()
        .map(|i| i.name.clone())
        .unwrap_or_default();
    env.push(("CI_JOB_IMAGE".into(), image));
    if !job.services.is_empty() {
        let services: Vec<serde_json::Value> = job
            .services
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "alias": s.alias,
                    "entrypoint": if s.entrypoint.is_empty() { None } else { Some(&s.entrypoint) },
                    "command": if s.command.is_empty() { None } else { Some(&s.command) },
                })
            })
            .collect();
        env.push((
            "CI_JOB_SERVICES".into(),
            serde_json::Value::Array(services).to_string(),
        ));
    }
    env
}

/// A name the environment can carry.
fn env_name_ok(key: &str) -> bool {
    !key.is_empty() && !key.contains('=') && !key.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_env_has_job_and_predefined_variables() {
        let job = JobResponse::from_json(
            r#"{"id": 42, "variables": [{"key": "GREETING", "value": "hi"},
                {"key": "BAD=NAME", "value": "x"}],
                "services": [{"name": "redis:latest"}]}"#,
        )
        .unwrap();
        let env = custom_env(&job, "/builds/", 3, false);
        let get = |k: &str| {
            env.iter()
                .rev()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("CI_JOB_ID"), Some("42"));
        assert_eq!(get("GREETING"), Some("hi"));
        assert_eq!(get("BAD=NAME"), None);
        assert_eq!(get("CI_BUILDS_DIR"), Some("/builds/slot-3"));
        assert_eq!(get("CI_PROJECT_DIR"), Some("/builds/slot-3/job-42"));
        assert_eq!(get("CI_CONCURRENT_ID"), Some("3"));
        assert_eq!(get("CI_DISPOSABLE_ENVIRONMENT"), Some("true"));
        assert_eq!(
            get("CI_JOB_SERVICES"),
            Some(r#"[{"alias":"","command":null,"entrypoint":null,"name":"redis:latest"}]"#)
        );
    }
}
