//! The `docker` and `docker-autoscaler` executors: each job in its own container on a
//! network of its slot (one job at a time), with its `services` reachable by alias, through the
//! Docker Engine API.
//!
//! One job: apply the pull policy to the job and service images while (concurrently) the
//! slot's network and a per-job builds volume are made ready, start the services (aliases from
//! `alias` and from the image name, as GitLab does), create the build container (config
//! volumes, memory/cpus limits, the slot's cgroup as cgroup parent, never the host's Docker
//! socket unless the operator mounts it), attach to it and start it: its main shell reads the
//! first script (the `script` step) on that stdin, so the job's first line needs no exec, and
//! then stays up as a childless `sleep`. Later scripts (`after_script`, artifacts, kill,
//! cleanup) run with [`JobRunner`] over a [`DockerHost`], each an exec into the build
//! container. Everything the job created carries the label `com.slipway.run=<unique run id>`
//! and is removed at the end, whatever happened: success, failure, timeout, cancel or a failed
//! start.
//!
//! # Networks
//!
//! Each slot has a warm bridge network (label [`LABEL_SLOT_NETWORK`]), created by the slot's
//! first job and reused by its next ones: creating a network costs ~100 ms per job. A slot
//! runs one job at a time and a job's containers are all removed before the slot's next job,
//! so a job never sees or reaches another job's containers; a job whose cleanup was not clean
//! (or was dropped half-way) makes the slot switch to a fresh network, and a job that finds its
//! slot's network held (a caller running two jobs in one slot) gets a per-job network.
//! [`DockerExecutor::shutdown`] removes the warm networks;
//! [`DockerExecutor::sweep_slot_networks`] removes those a crashed runner left.
//!
//! In the first step the job's shell is a subshell of the container's pid 1, so `$$` (and the
//! step's pid file) is `1`: the kill script's `kill -TERM -1` then stops every process in the
//! container but pid 1, which reports the status and stays up for `after_script`.
//!
//! `docker-autoscaler` is the same executor with the engine reached through
//! `docker system dial-stdio` on an SSH channel of the instance ([`dial_stdio_transport`]).
//!
//! # `[runners.docker]` keys honoured
//!
//! | key | default | meaning here |
//! | --- | --- | --- |
//! | `host` | local socket / `DOCKER_HOST` | engine address; `unix://` locally, passed to `docker -H` for dial-stdio |
//! | `image` | — | image when the job names none |
//! | `privileged` | `false` | privileged build and service containers |
//! | `volumes` | `[]` | `host:ctr[:mode]` binds, `name:ctr[:mode]` named volumes, `/ctr` cache volumes |
//! | `disable_cache` | `false` | `/ctr` volumes become per-job volumes instead of persistent cache volumes |
//! | `memory` | — | memory limit, Docker units (`512m`, `2g`) |
//! | `cpus` | — | CPU limit, e.g. `"1.5"` |
//! | `cgroup_parent` | — | cgroup parent when the slot gives none |
//! | `pull_policy` | `always` | `never` / `if-not-present` / `always`, or a list tried in order |
//! | `allowed_pull_policies` | `pull_policy` | what a job's `image: pull_policy` may ask for |
//! | `allowed_images`, `allowed_services` | all | glob patterns (`*`, `**`) the job's images must match |
//! | `extra_hosts` | `[]` | `/etc/hosts` entries, `host:ip` |
//! | `[[services]]` | `[]` | `name`, `alias`, `entrypoint`, `command`, `environment`: services every job gets, started before its own |
//!
//! Other keys (`network_mode`, `helper_image`, `shm_size`, `dns`, …) are accepted and ignored:
//! every job runs on its slot's own bridge network (see above).

//!
//! # Layout
//!
//! [`DockerExecutor::run`] is the sequence of a job's steps; each lives in the submodule named
//! after what it handles: `prepare` (the request checked, then the steps up to a running build
//! container), `images`, `network`, `services`, `container` (the build container), `host` (the
//! scripts in it), `cleanup`, plus `config`, `names` and `transport`.

mod cleanup;
mod config;
mod container;
mod helper;
mod host;
mod images;
mod names;
mod network;
mod plan;
mod prepare;
mod services;
mod transport;

use std::sync::Arc;
use std::time::Duration;

use slipway_connector::Client;
use slipway_docker::{Docker, Transport};
use slipway_job::model::JobResponse;
use tokio::time::Instant;

use crate::executor::Executor;
use crate::job::JobSlot;
use crate::job::{DEFAULT_JOB_TIMEOUT, JobRunner, RunResult};

pub use config::{DockerConfig, PullPolicy, ServiceConfig};
pub use host::DockerHost;
pub use names::{Sweep, session};
pub use services::service_aliases;
pub use transport::{DIAL_STDIO_SPARES, dial_stdio_transport};

use names::RunNames;
use network::SlotNetworks;
use prepare::Setup;

/// Label carrying the job id on everything a job creates.
pub const LABEL_JOB: &str = "com.slipway.job";
/// Label carrying the runner's name on everything a job creates (and on cache volumes).
pub const LABEL_RUNNER: &str = "com.slipway.runner";
/// Label carrying the unique id of one run of a job; cleanup removes everything with it.
pub const LABEL_RUN: &str = "com.slipway.run";
/// Label marking a persistent cache volume (kept across jobs, like GitLab's).
pub const LABEL_CACHE: &str = "com.slipway.cache";
/// Label carrying the manager process's session (one per process start): what a later start
/// finds with another session belongs to jobs that cannot resume, and is removed.
pub const LABEL_SESSION: &str = "com.slipway.session";
/// Label marking a slot's warm network; its value is the owning executor's token.
pub const LABEL_SLOT_NETWORK: &str = "com.slipway.slot-network";
/// Where the per-job builds volume is mounted in the build container.
pub const BUILDS_DIR: &str = "/builds";

/// Bounded time for removing a job's containers, networks and volumes.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How many times [`DockerExecutor::connect_ssh`] dials an instance's engine.
const CONNECT_TRIES: u32 = 3;
/// The pause after a failed dial, times the number of tries so far.
const CONNECT_BACKOFF: Duration = Duration::from_millis(300);
/// How long one dial of an instance's engine may take (`GET /version` included).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// Errors a new connection can heal: the stream, not the engine, failed.
fn is_transient(e: &slipway_docker::Error) -> bool {
    matches!(
        e,
        slipway_docker::Error::Connect(_)
            | slipway_docker::Error::Http(_)
            | slipway_docker::Error::Io(_)
    )
}

/// What `docker version` says on the instance's stderr (empty when it says nothing or cannot
/// run): the reason `dial-stdio` closed its stream is only ever printed there.
async fn engine_stderr(client: &Client, host: Option<&str>) -> String {
    let command = match host.filter(|h| !h.is_empty()) {
        Some(h) => format!("docker -H {} version", crate::script::quote(h)),
        None => "docker version".to_string(),
    };
    let run = client.run_capture(command, Vec::new());
    match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Ok((_, _, stderr))) => String::from_utf8_lossy(&stderr).trim().to_string(),
        Ok(Err(e)) => format!("(running `docker version` failed too: {e})"),
        Err(_) => "(`docker version` did not finish within 10 s)".to_string(),
    }
}

/// The `; the instance's docker said: …` tail of [`DockerExecutorError::Unreachable`].
fn diagnosis(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; the instance's `docker version` said: {stderr}")
    }
}

/// Errors of the docker executors' setup (a job's own failures are
/// [`JobOutcome`](slipway_job::outcome::JobOutcome)s).
#[derive(Debug, thiserror::Error)]
pub enum DockerExecutorError {
    /// The engine could not be reached or refused a request.
    #[error(transparent)]
    Docker(#[from] slipway_docker::Error),
    /// The instance's engine did not answer through `docker system dial-stdio`, after retries.
    #[error("no answer through `{command}` after {tries} tries: {source}{}", diagnosis(.stderr))]
    Unreachable {
        /// The command run on the instance.
        command: String,
        /// How many times it was tried.
        tries: u32,
        /// What `docker version` printed on the instance's stderr, if anything.
        stderr: String,
        /// The last error.
        #[source]
        source: slipway_docker::Error,
    },
    /// A `[runners.docker]` value is invalid.
    #[error("invalid [runners.docker] {key}: {reason}")]
    Config {
        /// The key.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

/// The `docker` executor (and, over [`dial_stdio_transport`], `docker-autoscaler`).
#[derive(Debug, Clone)]
pub struct DockerExecutor {
    docker: Docker,
    config: DockerConfig,
    nets: Arc<SlotNetworks>,
    /// Runner name, in labels, container names and cache volume names.
    pub runner_name: String,
    /// Seconds between SIGTERM and SIGKILL when a step is stopped.
    pub kill_grace_secs: u32,
    /// Where jobs keep their `cache:` inside the build container (`/cache`, GitLab's default;
    /// it outlives the job when `[runners.docker] volumes` mounts a volume there).
    pub cache_dir: Option<String>,
}

impl DockerExecutor {
    /// An executor using `docker` with `config`.
    pub fn new(docker: Docker, config: DockerConfig) -> Self {
        DockerExecutor {
            docker,
            config,
            nets: Arc::new(SlotNetworks::new("slipway")),
            runner_name: "slipway".into(),
            kill_grace_secs: JobRunner::default().kill_grace_secs,
            cache_dir: Some("/cache".into()),
        }
    }

    /// The `docker` executor on this machine's engine (`host`, else `DOCKER_HOST`, else the
    /// default socket).
    pub async fn connect_local(config: DockerConfig) -> Result<Self, DockerExecutorError> {
        config.validate()?;
        let transport = match config.host.as_deref().filter(|h| !h.is_empty()) {
            Some(h) => match h.strip_prefix("unix://") {
                Some(path) => Transport::unix(path),
                None => {
                    return Err(DockerExecutorError::Config {
                        key: "host",
                        reason: format!("{h:?}: only unix:// addresses are supported"),
                    });
                }
            },
            None => Transport::from_env()
                .map_err(|e| DockerExecutorError::Docker(slipway_docker::Error::Connect(e)))?,
        };
        Ok(Self::new(Docker::connect(transport).await?, config))
    }

    /// The `docker-autoscaler` executor: the instance's engine through `docker system
    /// dial-stdio` over `client` (see [`dial_stdio_transport`]).
    pub async fn connect_ssh(
        client: Arc<Client>,
        config: DockerConfig,
    ) -> Result<Self, DockerExecutorError> {
        config.validate()?;
        let mut tries = 0;
        loop {
            tries += 1;
            let transport = dial_stdio_transport(client.clone(), config.host.as_deref());
            let command = format!(
                "docker system dial-stdio` on instance `{}",
                client.instance()
            );
            // Bounded: a dial whose channel never answers (an instance's network gone quiet)
            // must not hold the caller, nor the runner's executor cache, for ever.
            let connected = tokio::time::timeout(CONNECT_TIMEOUT, Docker::connect(transport))
                .await
                .unwrap_or_else(|_| {
                    Err(slipway_docker::Error::Connect(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {CONNECT_TIMEOUT:?}"),
                    )))
                });
            match connected {
                Ok(docker) => return Ok(Self::new(docker, config)),
                // A stream that closed at once (the `docker` process on the instance exited, or
                // sshd dropped the channel under load) is worth another try; an engine that
                // answered with an error is not.
                Err(e) if is_transient(&e) && tries < CONNECT_TRIES => {
                    tracing::warn!(
                        instance = client.instance(),
                        tries,
                        "reaching the instance's Docker Engine: {e}; trying again"
                    );
                    tokio::time::sleep(CONNECT_BACKOFF * tries).await;
                }
                Err(e) if is_transient(&e) => {
                    let stderr = engine_stderr(&client, config.host.as_deref()).await;
                    return Err(DockerExecutorError::Unreachable {
                        command,
                        tries,
                        stderr,
                        source: e,
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The engine client.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// The configuration.
    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    /// Run a job in containers and remove every container, network and volume it created,
    /// whatever happened.
    /// The slot's cgroup (`slot.cgroup`) is the containers' cgroup parent (over
    /// `cgroup_parent`).
    pub async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        let started = Instant::now();
        let run = RunNames::new(&self.runner_name, job.id);
        // Another job holding the slot (a caller reusing a slot number): a per-job network.
        let mut lease = self.nets.acquire(slot.slot);
        let JobSlot {
            slot,
            cgroup: cgroup_parent,
            trace,
            cancel,
            abort,
            artifacts_in,
            scratch_dir,
            max_collected,
            sources,
            data,
        } = slot;
        let setup = Setup {
            run: &run,
            slot,
            cgroup_parent,
            cancel: &cancel,
            started,
            helper: data.as_ref().map(|d| &d.helper),
        };
        let result = match self.prepare(job, setup, trace, lease.as_mut()).await {
            Ok((container, first, shared_helper)) => {
                let host = DockerHost::with_first_step(self.docker.clone(), container, first)
                    .with_shared_helper(shared_helper);
                let ctx = JobSlot {
                    slot,
                    cgroup: None,
                    trace: &mut *trace,
                    cancel,
                    abort,
                    artifacts_in,
                    scratch_dir,
                    max_collected,
                    sources,
                    data,
                };
                self.run_steps(job, started, &host, ctx).await
            }
            Err(outcome) => RunResult {
                outcome,
                artifacts: Vec::new(),
            },
        };
        self.remove_all_and_release(&run, lease, trace).await;
        result
    }

    /// The job's steps ([`JobRunner`]) in its build container, within what preparation left of
    /// its timeout.
    async fn run_steps(
        &self,
        job: &JobResponse,
        started: Instant,
        host: &DockerHost,
        slot: JobSlot<'_>,
    ) -> RunResult {
        let runner = JobRunner {
            builds_dir: BUILDS_DIR.into(),
            kill_grace_secs: self.kill_grace_secs,
            cache_dir: self.cache_dir.clone(),
            ..JobRunner::default()
        };
        // The job's timeout covers its preparation too.
        let job = remaining_timeout(job, started.elapsed());
        runner.run(&job, host, slot).await
    }
}

/// The job with its timeout reduced by what preparation took.
fn remaining_timeout(job: &JobResponse, spent: Duration) -> JobResponse {
    let mut job = job.clone();
    let total = match job.runner_info.timeout {
        0 => DEFAULT_JOB_TIMEOUT.as_secs(),
        s => s,
    };
    job.runner_info.timeout = total.saturating_sub(spent.as_secs()).max(1);
    job
}

#[async_trait::async_trait]
impl Executor for DockerExecutor {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn run(&self, job: &JobResponse, slot: JobSlot<'_>) -> RunResult {
        DockerExecutor::run(self, job, slot).await
    }
}
