//! The build container: its volumes, limits and main shell, attached before it starts.

use std::collections::BTreeMap;

use slipway_docker::{AttachOptions, ContainerSpec, VolumeSpec};
use slipway_job::model::JobResponse;

use super::host::{FIRST_STEP_SHELL, FirstStep};
use super::names::{RunNames, fnv1a, sanitize};
use super::plan::{Limits, Plan, system_failure};
use super::{BUILDS_DIR, DockerExecutor, LABEL_CACHE, LABEL_RUNNER};
use slipway_job::outcome::JobOutcome;
use slipway_job::trace::Trace;

impl DockerExecutor {
    /// Create the per-job builds volume, mounted at [`BUILDS_DIR`] in the build container.
    pub(super) async fn create_builds_volume(&self, plan: &Plan<'_>) -> slipway_docker::Result<()> {
        let mut vol = VolumeSpec::new(plan.run.builds_volume());
        vol.labels = plan.labels.clone();
        self.docker.create_volume(&vol).await.map(drop)
    }

    /// Create the build container with its configured volumes (and the engine's job helper
    /// volume, read-only), then start it attached to its main shell; its id and that shell,
    /// which will run the first script.
    pub(super) async fn start_build_container(
        &self,
        plan: &Plan<'_>,
        helper_volume: Option<&str>,
        trace: &mut Trace,
    ) -> Result<(String, FirstStep), JobOutcome> {
        let mut spec = build_spec(plan);
        if let Some(name) = helper_volume {
            spec.binds.push(super::helper::helper_bind(name));
        }
        self.config_volumes(&mut spec, plan.job, plan.run, &plan.labels)
            .await
            .map_err(|e| system_failure(trace, "creating the configured volumes", e))?;
        self.limits(&mut spec, &plan.limits);
        let id = self
            .docker
            .create_container(&spec)
            .await
            .map_err(|e| system_failure(trace, "creating the build container", e))?
            .id;
        // Attached while it starts: its shell waits for the first script on stdin.
        let opts = AttachOptions {
            stdin: true,
            ..AttachOptions::default()
        };
        let attach = self.docker.attach(&id, &opts);
        let (attached, started) = tokio::join!(attach, self.docker.start_container(&id));
        started.map_err(|e| system_failure(trace, "starting the build container", e))?;
        let attached =
            attached.map_err(|e| system_failure(trace, "attaching to the build container", e))?;
        let first = FirstStep {
            attached,
            marker: format!(
                "__slipway_end_{}_",
                fnv1a(&format!(
                    "{}{:?}",
                    plan.run.prefix,
                    std::time::SystemTime::now()
                ))
            ),
        };
        Ok((id, first))
    }

    /// The limits, privileges and extra hosts every container of the job gets.
    pub(super) fn limits(&self, spec: &mut ContainerSpec, limits: &Limits) {
        spec.memory = limits.memory;
        spec.nano_cpus = limits.nano_cpus;
        spec.cgroup_parent.clone_from(&limits.cgroup_parent);
        spec.privileged = self.config.privileged;
        spec.extra_hosts.clone_from(&self.config.extra_hosts);
    }

    /// `[runners.docker] volumes` on the build container.
    async fn config_volumes(
        &self,
        spec: &mut ContainerSpec,
        job: &JobResponse,
        run: &RunNames,
        labels: &BTreeMap<String, String>,
    ) -> slipway_docker::Result<()> {
        for (i, v) in self.config.volumes.iter().enumerate() {
            let v = v.trim();
            if v.is_empty() {
                continue;
            }
            if v.contains(':') {
                // host:ctr[:mode] or name:ctr[:mode]: as the operator wrote it.
                spec.binds.push(v.to_string());
                continue;
            }
            let name = if self.config.disable_cache {
                let mut vs = VolumeSpec::new(format!("{}-vol{i}", run.prefix));
                vs.labels = labels.clone();
                self.docker.create_volume(&vs).await?;
                vs.name
            } else {
                // A cache volume, kept across jobs of the project (GitLab's local cache).
                let name = format!(
                    "slipway-cache-{}-p{}-{:016x}",
                    sanitize(&self.runner_name),
                    job.job_info.project_id,
                    fnv1a(v)
                );
                let mut vs = VolumeSpec::new(&name);
                vs.labels = [
                    (LABEL_RUNNER.to_string(), self.runner_name.clone()),
                    (LABEL_CACHE.to_string(), "true".to_string()),
                ]
                .into();
                self.docker.create_volume(&vs).await?;
                name
            };
            spec.binds.push(format!("{name}:{v}"));
        }
        Ok(())
    }
}

/// The build container before its configured volumes and limits: the job's image, its main
/// shell reading the first script on stdin, the builds volume, the alias `build`.
fn build_spec(plan: &Plan<'_>) -> ContainerSpec {
    let mut spec = ContainerSpec::new(&plan.image.name);
    spec.name = Some(plan.run.build());
    spec.labels = plan.labels.clone();
    spec.labels
        .insert("com.slipway.role".into(), "build".into());
    if !plan.image.entrypoint.is_empty() {
        spec.entrypoint = Some(plan.image.entrypoint.clone());
    }
    spec.cmd = Some(vec!["sh".into(), "-c".into(), FIRST_STEP_SHELL.into()]);
    spec.open_stdin = true;
    spec.working_dir = Some(BUILDS_DIR.into());
    spec.network = Some(plan.network.clone());
    spec.network_aliases = vec!["build".into()];
    spec.binds = vec![format!("{}:{BUILDS_DIR}", plan.run.builds_volume())];
    spec
}
