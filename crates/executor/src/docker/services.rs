//! Services: the job's `services`, each a container reachable by its aliases on the job's
//! network.

use slipway_docker::{ContainerSpec, LogsOptions, split_reference};
use slipway_job::model::{Image, JobResponse};

use super::DockerExecutor;
use super::plan::{Plan, system_failure};
use super::prepare::Stop;
use slipway_job::outcome::JobOutcome;
use slipway_job::trace::Trace;

/// The DNS aliases of a service: its `alias` (several may be given, separated by spaces or
/// commas) and the two GitLab derives from the image name (`group/app:1` gives `group-app` and
/// `group__app`).
pub fn service_aliases(service: &Image) -> Vec<String> {
    let mut out: Vec<String> = service
        .alias
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    let (name, _) = split_reference(&service.name);
    for derived in [name.replace('/', "-"), name.replace('/', "__")] {
        if !derived.is_empty() && !out.contains(&derived) {
            out.push(derived);
        }
    }
    out
}

/// Job variables for service containers (GitLab passes them), file variables excepted.
fn service_env(job: &JobResponse) -> Vec<String> {
    job.variables
        .iter()
        .filter(|v| !v.file && !v.key.is_empty() && !v.key.contains('='))
        .map(|v| format!("{}={}", v.key, v.value))
        .collect()
}

impl DockerExecutor {
    /// Create and start the job's services in order, each once the job is still neither
    /// canceled nor out of time; their names and container ids.
    pub(super) async fn start_services(
        &self,
        plan: &Plan<'_>,
        stop: &Stop<'_>,
        trace: &mut Trace,
    ) -> Result<Vec<(String, String)>, JobOutcome> {
        let service_env = service_env(plan.job);
        let mut services = Vec::new();
        for (i, svc) in plan.services.iter().enumerate() {
            stop.check(trace)?;
            let aliases = service_aliases(svc);
            trace.message(&format!(
                "Starting service {} as {} ...",
                svc.name,
                aliases.join(", ")
            ));
            let spec = self.service_spec(plan, i, svc, &service_env, aliases);
            let id = self
                .docker
                .create_container(&spec)
                .await
                .map_err(|e| system_failure(trace, &format!("creating service {}", svc.name), e))?
                .id;
            self.docker
                .start_container(&id)
                .await
                .map_err(|e| system_failure(trace, &format!("starting service {}", svc.name), e))?;
            services.push((svc.name.clone(), id));
        }
        Ok(services)
    }

    /// The `i`th service's container: the job's variables and its own, its entrypoint and
    /// command, its aliases on the job's network, the job's limits.
    fn service_spec(
        &self,
        plan: &Plan<'_>,
        i: usize,
        svc: &Image,
        env: &[String],
        aliases: Vec<String>,
    ) -> ContainerSpec {
        let mut spec = ContainerSpec::new(&svc.name);
        spec.name = Some(plan.run.service(i));
        spec.labels = plan.labels.clone();
        spec.labels
            .insert("com.slipway.service".into(), svc.name.clone());
        spec.env = env.to_vec();
        spec.env.extend(
            svc.variables
                .iter()
                .filter(|v| !v.file)
                .map(|v| format!("{}={}", v.key, v.value)),
        );
        if !svc.entrypoint.is_empty() {
            spec.entrypoint = Some(svc.entrypoint.clone());
        }
        if !svc.command.is_empty() {
            spec.cmd = Some(svc.command.clone());
        }
        spec.network = Some(plan.network.clone());
        spec.network_aliases = aliases;
        self.limits(&mut spec, &plan.limits);
        spec
    }

    /// Warn about each service that exited at once (it will not answer), with its output.
    pub(super) async fn report_exited_services(
        &self,
        services: Vec<(String, String)>,
        trace: &mut Trace,
    ) {
        for (name, sid) in services {
            match self.docker.inspect_container(&sid).await {
                Ok(info) if !info.state.running => {
                    trace.message(&format!(
                        "WARNING: Service {name} probably didn't start properly (exit code {}).",
                        info.state.exit_code
                    ));
                    if let Ok(logs) = self.docker.logs(&sid, &logs_so_far()).await
                        && let Ok(out) = logs.collect_output().await
                    {
                        trace.write(&out.stdout);
                        trace.write(&out.stderr);
                    }
                }
                _ => {}
            }
        }
    }
}

/// stdout and stderr so far, not following.
fn logs_so_far() -> LogsOptions {
    LogsOptions {
        stdout: true,
        stderr: true,
        ..LogsOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::{allowed, glob_match};
    use super::*;

    #[test]
    fn globs_and_aliases() {
        assert!(glob_match("alpine:*", "alpine:3.19"));
        assert!(!glob_match("alpine:*", "alpine/x:1"));
        assert!(glob_match("team/**", "team/a/b:1"));
        assert!(glob_match("*", "busybox"));
        assert!(!glob_match("*", "a/b"));
        assert!(allowed(&[], "anything"));
        let mut svc = Image::named("registry.example.com:5000/group/postgres:13");
        svc.alias = "db, pg".into();
        assert_eq!(
            service_aliases(&svc),
            vec![
                "db",
                "pg",
                "registry.example.com:5000-group-postgres",
                "registry.example.com:5000__group__postgres"
            ]
        );
        assert_eq!(
            service_aliases(&Image::named("redis")),
            vec!["redis".to_string()]
        );
    }
}
