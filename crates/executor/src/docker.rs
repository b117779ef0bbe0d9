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
//!
//! Other keys (`network_mode`, `helper_image`, `shm_size`, `dns`, …) are accepted and ignored:
//! every job runs on its slot's own bridge network (see above).

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use serde::{Deserialize, Deserializer};
use slipway_connector::{Client, ExitStatus, Output};
use slipway_docker::{
    AttachOptions, Attached, ContainerSpec, Docker, ExecSpec, FnDialer, LogOutput, LogsOptions,
    NetworkSpec, Prefetch, Transport, VolumeSpec, split_reference,
};
use slipway_jobs::model::{Image, JobResponse};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::host::Host;
use crate::job::{DEFAULT_JOB_TIMEOUT, JobContext, JobRunner, RunResult};
use crate::outcome::{FailureReason, JobOutcome};
use crate::script;
use crate::trace::Trace;

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

/// bash when the image has it, else `sh` (busybox, alpine), reading the script on stdin; `exec`
/// keeps the exec's session-leader pid, which is then the step's process group.
const RUN_SHELL: &str =
    "command -v bash >/dev/null && exec bash --noprofile --norc -s || exec sh -s";
/// The same choice for `bash -c "$1"`.
const CAPTURE_SHELL: &str = "if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc -c \"$1\"; else exec sh -c \"$1\"; fi";
/// The build container's main process: the same shell choice, reading the first step (wrapped
/// by [`DockerHost`]) on its attached stdin; it then stays up as a childless `sleep`.
const FIRST_STEP_SHELL: &str = RUN_SHELL;
/// Bounded time for removing a job's containers, networks and volumes.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of the docker executors' setup (a job's own failures are [`JobOutcome`]s).
#[derive(Debug, thiserror::Error)]
pub enum DockerExecutorError {
    /// The engine could not be reached or refused a request.
    #[error(transparent)]
    Docker(#[from] slipway_docker::Error),
    /// A `[runners.docker]` value is invalid.
    #[error("invalid [runners.docker] {key}: {reason}")]
    Config {
        /// The key.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

/// GitLab's image pull policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PullPolicy {
    /// Use the local image only.
    Never,
    /// Pull only when the image is not present locally.
    IfNotPresent,
    /// Pull every time.
    Always,
}

impl PullPolicy {
    /// GitLab's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Never => "never",
            PullPolicy::IfNotPresent => "if-not-present",
            PullPolicy::Always => "always",
        }
    }

    /// Parses GitLab's spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "never" => Some(PullPolicy::Never),
            "if-not-present" => Some(PullPolicy::IfNotPresent),
            "always" => Some(PullPolicy::Always),
            _ => None,
        }
    }
}

impl fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[runners.docker]`: the keys Slipway honours (see the module docs), GitLab's defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct DockerConfig {
    /// Engine address (`unix:///path`); the local default when `None`.
    pub host: Option<String>,
    /// Image for jobs that name none.
    pub image: Option<String>,
    /// Run build and service containers privileged.
    pub privileged: bool,
    /// Extra volumes: `host:ctr[:mode]`, `name:ctr[:mode]` or `/ctr` (a cache volume).
    pub volumes: Vec<String>,
    /// `/ctr` volumes are per-job instead of persistent cache volumes.
    pub disable_cache: bool,
    /// Memory limit in Docker units (`512m`, `2g`).
    pub memory: Option<String>,
    /// CPU limit (`"1.5"`).
    pub cpus: Option<String>,
    /// cgroup parent when the slot gives none.
    pub cgroup_parent: Option<String>,
    /// Pull policies, tried in order until one gives an image.
    #[serde(deserialize_with = "one_or_many")]
    pub pull_policy: Vec<PullPolicy>,
    /// Pull policies a job may ask for; `pull_policy` when empty.
    #[serde(deserialize_with = "one_or_many")]
    pub allowed_pull_policies: Vec<PullPolicy>,
    /// Globs the job image must match; all allowed when empty.
    pub allowed_images: Vec<String>,
    /// Globs service images must match; all allowed when empty.
    pub allowed_services: Vec<String>,
    /// Extra `/etc/hosts` entries, `host:ip` each.
    pub extra_hosts: Vec<String>,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: None,
            image: None,
            privileged: false,
            volumes: Vec::new(),
            disable_cache: false,
            memory: None,
            cpus: None,
            cgroup_parent: None,
            pull_policy: vec![PullPolicy::Always],
            allowed_pull_policies: Vec::new(),
            allowed_images: Vec::new(),
            allowed_services: Vec::new(),
            extra_hosts: Vec::new(),
        }
    }
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PullPolicy>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(PullPolicy),
        Many(Vec<PullPolicy>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(p) => vec![p],
        OneOrMany::Many(v) => v,
    })
}

impl DockerConfig {
    /// The memory limit in bytes.
    pub fn memory_bytes(&self) -> Result<Option<i64>, DockerExecutorError> {
        self.memory
            .as_deref()
            .filter(|m| !m.trim().is_empty())
            .map(|m| {
                parse_memory(m).ok_or_else(|| DockerExecutorError::Config {
                    key: "memory",
                    reason: format!("{m:?} is not a size like 512m or 2g"),
                })
            })
            .transpose()
    }

    /// The CPU limit in billionths of a CPU.
    pub fn nano_cpus(&self) -> Result<Option<i64>, DockerExecutorError> {
        self.cpus
            .as_deref()
            .filter(|c| !c.trim().is_empty())
            .map(|c| {
                c.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    // Whole nanoCPUs: the rounding is intended.
                    .map(|v| (v * 1e9).round() as i64)
                    .ok_or_else(|| DockerExecutorError::Config {
                        key: "cpus",
                        reason: format!("{c:?} is not a positive number of CPUs"),
                    })
            })
            .transpose()
    }

    /// Every value parses.
    pub fn validate(&self) -> Result<(), DockerExecutorError> {
        self.memory_bytes()?;
        self.nano_cpus()?;
        Ok(())
    }

    fn effective_pull_policy(&self) -> Vec<PullPolicy> {
        if self.pull_policy.is_empty() {
            vec![PullPolicy::Always]
        } else {
            self.pull_policy.clone()
        }
    }

    /// The policies to use for `image`: its own when it names some and they are allowed.
    fn pull_policies_for(&self, image: &Image) -> Result<Vec<PullPolicy>, String> {
        let configured = self.effective_pull_policy();
        if image.pull_policy.is_empty() {
            return Ok(configured);
        }
        let allowed = if self.allowed_pull_policies.is_empty() {
            configured
        } else {
            self.allowed_pull_policies.clone()
        };
        let mut asked = Vec::new();
        for p in &image.pull_policy {
            match PullPolicy::parse(p) {
                Some(p) if allowed.contains(&p) => asked.push(p),
                _ => {
                    return Err(format!(
                        "pull_policy ({}) defined in the job is not one of the allowed_pull_policies ({})",
                        image.pull_policy.join(", "),
                        join(&allowed)
                    ));
                }
            }
        }
        Ok(asked)
    }
}

fn join(p: &[PullPolicy]) -> String {
    p.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
}

/// Docker's size syntax: a number with an optional `b`, `k`, `m`, `g` or `t` (powers of 1024),
/// optionally followed by `b`.
fn parse_memory(s: &str) -> Option<i64> {
    let s = s.trim().to_ascii_lowercase();
    let s = s.strip_suffix('b').unwrap_or(&s);
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 'b'),
    };
    let mult: f64 = match unit {
        'b' => 1.0,
        'k' => 1024.0,
        'm' => 1024.0 * 1024.0,
        'g' => 1024.0 * 1024.0 * 1024.0,
        't' => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v: f64 = num.trim().parse().ok()?;
    // Whole bytes: the rounding is intended.
    (v.is_finite() && v > 0.0).then_some((v * mult) as i64)
}

/// Glob match where `*` stays within one path segment and `**` crosses `/`.
fn glob_match(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((b'*', rest)) if rest.first() == Some(&b'*') => {
                let rest = &rest[1..];
                (0..=t.len()).any(|i| go(rest, &t[i..]))
            }
            Some((b'*', rest)) => (0..=t.len())
                .take_while(|&i| i == 0 || t[i - 1] != b'/')
                .any(|i| go(rest, &t[i..])),
            Some((b'?', rest)) => t.first().is_some_and(|&c| c != b'/') && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

fn allowed(patterns: &[String], image: &str) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| glob_match(p, image))
}

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

/// A job's build container as a [`Host`]: every script is an exec, bash when the image has it,
/// else `sh`.
#[derive(Debug, Clone)]
pub struct DockerHost {
    docker: Docker,
    container: String,
    /// The build container's own shell (its pid 1), attached before it started, which runs the
    /// first script instead of an exec; taken by the first [`Host::run_script`].
    first: Arc<Mutex<Option<FirstStep>>>,
}

/// The attached main process of a build container started with [`FIRST_STEP_SHELL`].
#[derive(Debug)]
struct FirstStep {
    attached: Attached,
    /// Unguessable end marker; the status follows it.
    marker: String,
}

impl DockerHost {
    /// Scripts run in `container` (which must be running).
    pub fn new(docker: Docker, container: impl Into<String>) -> Self {
        DockerHost {
            docker,
            container: container.into(),
            first: Arc::new(Mutex::new(None)),
        }
    }

    fn with_first_step(docker: Docker, container: String, first: FirstStep) -> Self {
        DockerHost {
            docker,
            container,
            first: Arc::new(Mutex::new(Some(first))),
        }
    }

    fn take_first(&self) -> Option<FirstStep> {
        self.first.lock().ok().and_then(|mut f| f.take())
    }

    /// The first script through the container's main shell: in a subshell, then the end
    /// marker with its status on stdout and on stderr, then the shell becomes a childless
    /// `sleep` that keeps the container up for the next scripts (execs).
    async fn run_first(
        &self,
        first: FirstStep,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, String> {
        let FirstStep {
            attached:
                Attached {
                    output: mut stream,
                    mut input,
                },
            marker,
        } = first;
        let wrapped = format!(
            "(\n{script}\n) ; __slipway_rc=$?\n\
             printf '%s%d\\n' '{marker}' \"$__slipway_rc\"; printf '%s%d\\n' '{marker}' \"$__slipway_rc\" >&2\n\
             exec </dev/null >/dev/null 2>&1\nexec sleep 2147483647\n"
        );
        input
            .write_all(wrapped.as_bytes())
            .await
            .map_err(|e| format!("feeding the build container: {e}"))?;
        let _ = input.flush().await;
        let mut out = MarkerFilter::new(&marker);
        let mut err = MarkerFilter::new(&marker);
        while out.status.is_none() || err.status.is_none() {
            let Some(chunk) = stream.next().await else {
                break;
            };
            match chunk {
                Ok(LogOutput::StdOut(b) | LogOutput::Console(b)) => {
                    let pass = out.feed(&b);
                    if !pass.is_empty() {
                        let _ = output.send(Output::Stdout(pass)).await;
                    }
                }
                Ok(LogOutput::StdErr(b)) => {
                    let pass = err.feed(&b);
                    if !pass.is_empty() {
                        let _ = output.send(Output::Stderr(pass)).await;
                    }
                }
                Ok(LogOutput::StdIn(_)) => {}
                Err(e) => return Err(format!("build container output: {e}")),
            }
        }
        match out.status.or(err.status) {
            Some(code) => Ok(exit_status(code)),
            None => Err("the build container stopped during the script".into()),
        }
    }
}

/// Passes a stream's bytes through until an end marker, then parses the status after it.
#[derive(Debug)]
struct MarkerFilter {
    marker: Vec<u8>,
    pending: Vec<u8>,
    status: Option<i64>,
}

impl MarkerFilter {
    fn new(marker: &str) -> Self {
        MarkerFilter {
            marker: marker.as_bytes().to_vec(),
            pending: Vec::new(),
            status: None,
        }
    }

    /// What may go to the trace now; holds back a tail that could start the marker.
    fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.status.is_some() {
            return Vec::new();
        }
        self.pending.extend_from_slice(chunk);
        let m = &self.marker;
        if let Some(i) = self
            .pending
            .windows(m.len())
            .position(|w| w == m.as_slice())
        {
            let rest = &self.pending[i + m.len()..];
            if let Some(nl) = rest.iter().position(|&c| c == b'\n') {
                let code = std::str::from_utf8(&rest[..nl])
                    .ok()
                    .and_then(|c| c.trim().parse().ok())
                    .unwrap_or(-1);
                self.status = Some(code);
                let pass = self.pending[..i].to_vec();
                self.pending.clear();
                return pass;
            }
            // The status is not all here yet.
            let pass = self.pending[..i].to_vec();
            self.pending.drain(..i);
            return pass;
        }
        let keep = (1..m.len().min(self.pending.len() + 1))
            .rev()
            .find(|&k| self.pending.ends_with(&m[..k]))
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let pass = self.pending[..cut].to_vec();
        self.pending.drain(..cut);
        pass
    }
}

fn exit_status(code: i64) -> ExitStatus {
    ExitStatus {
        code: u32::try_from(code).ok(),
        signal: None,
    }
}

#[async_trait]
impl Host for DockerHost {
    async fn run_script(
        &self,
        script: String,
        output: mpsc::Sender<Output>,
    ) -> Result<ExitStatus, String> {
        if let Some(first) = self.take_first() {
            return self.run_first(first, script, output).await;
        }
        let mut spec = ExecSpec::new(["sh", "-c", RUN_SHELL]);
        spec.stdin = true;
        let err = |e: slipway_docker::Error| format!("exec in the build container: {e}");
        let id = self
            .docker
            .create_exec(&self.container, &spec)
            .await
            .map_err(err)?;
        let Attached {
            output: mut stream,
            mut input,
        } = self.docker.start_exec(&id, false).await.map_err(err)?;
        let feed = async move {
            // A script that exits early stops reading: a broken pipe is not an error here.
            let _ = input.write_all(script.as_bytes()).await;
            let _ = input.shutdown().await;
        };
        let pump = async move {
            while let Some(chunk) = stream.next().await {
                let chunk = match chunk {
                    Ok(LogOutput::StdOut(b) | LogOutput::Console(b)) => Output::Stdout(b.to_vec()),
                    Ok(LogOutput::StdErr(b)) => Output::Stderr(b.to_vec()),
                    Ok(LogOutput::StdIn(_)) => continue,
                    Err(e) => return Err(format!("build container output: {e}")),
                };
                // Nobody reading any more: keep draining so the exec can finish.
                let _ = output.send(chunk).await;
            }
            Ok(())
        };
        let ((), pumped) = tokio::join!(feed, pump);
        pumped?;
        let code = self.docker.exec_exit_code(&id).await.map_err(err)?;
        Ok(exit_status(code))
    }

    async fn capture(
        &self,
        body: &str,
        stdin: Vec<u8>,
    ) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), String> {
        let spec = ExecSpec::new(["sh", "-c", CAPTURE_SHELL, "sh", body]);
        let out = self
            .docker
            .exec_run(&self.container, &spec, Some(Bytes::from(stdin)))
            .await
            .map_err(|e| format!("exec in the build container: {e}"))?;
        Ok((
            exit_status(out.exit_code),
            out.output.stdout,
            out.output.stderr,
        ))
    }
}

/// Connections to an instance's engine kept dialed ahead (see [`dial_stdio_transport`]).
pub const DIAL_STDIO_SPARES: usize = 2;

/// The engine of an instance through `docker system dial-stdio` on SSH channels of `client`
/// (one channel per HTTP connection): no TCP port and no socket file on either side. `host` is
/// `[runners.docker] host`, passed as `docker -H <host>` when set.
pub fn dial_stdio_transport(client: Arc<Client>, host: Option<&str>) -> Transport {
    let command = match host.filter(|h| !h.is_empty()) {
        Some(h) => format!("docker -H {} system dial-stdio", script::quote(h)),
        None => "docker system dial-stdio".to_string(),
    };
    let name = format!("ssh {} {command}", client.instance());
    let dialer = FnDialer::new(name, move || {
        let client = Arc::clone(&client);
        let command = command.clone();
        async move {
            client
                .open_stream(&command)
                .await
                .map_err(std::io::Error::other)
        }
    });
    // Each connection starts a `docker` process on the instance: keep two dialed ahead so a
    // job's first requests (and the attach that takes a connection for good) do not wait.
    Transport::dialer(Prefetch::new(dialer, DIAL_STDIO_SPARES))
}

/// What a docker job needs besides its payload.
#[derive(Debug)]
pub struct DockerRunContext<'a> {
    /// The job's slot (its directory under `/builds`, and a label).
    pub slot: u32,
    /// The slot's cgroup, used as the containers' cgroup parent (overrides `cgroup_parent`).
    pub cgroup_parent: Option<String>,
    /// Output sink (masks secrets).
    pub trace: &'a mut Trace,
    /// Cancelled to stop the job.
    pub cancel: CancellationToken,
    /// Set: a cancel is graceful (GitLab's `canceling`): `after_script` still runs unless this
    /// fires too. Unset: a cancel skips `after_script`.
    pub abort: Option<CancellationToken>,
    /// Tarballs of earlier jobs' artifacts to unpack into the project directory.
    pub artifacts_in: Vec<Vec<u8>>,
}

/// Each slot's warm bridge network, kept across that slot's jobs (one job at a time per slot,
/// so no job ever shares it with another), removed by [`DockerExecutor::shutdown`].
#[derive(Debug)]
struct SlotNetworks {
    /// Unique to this executor (process, time, counter): in the names and the label.
    token: String,
    slots: Mutex<HashMap<u32, SlotNet>>,
}

#[derive(Debug, Default)]
struct SlotNet {
    /// Bumped when the network may hold a job's leftovers: the next job gets a fresh one.
    generation: u32,
    created: bool,
    in_use: bool,
}

/// A slot's network, held by one job.
#[derive(Debug)]
struct SlotLease {
    nets: Arc<SlotNetworks>,
    slot: u32,
    name: String,
    created: bool,
    /// Set when the job's cleanup left nothing: the network stays warm.
    clean: bool,
}

impl SlotNetworks {
    fn new(runner: &str) -> Self {
        SlotNetworks {
            token: RunNames::new(runner, 0).prefix.replacen("-job0-", "-", 1),
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn name(&self, slot: u32, generation: u32) -> String {
        format!("{}-slot{slot}-g{generation}-net", self.token)
    }

    /// The slot's network for one job; `None` while another job holds it.
    fn acquire(self: &Arc<Self>, slot: u32) -> Option<SlotLease> {
        let mut slots = self.slots.lock().ok()?;
        let s = slots.entry(slot).or_default();
        if s.in_use {
            return None;
        }
        s.in_use = true;
        Some(SlotLease {
            nets: Arc::clone(self),
            slot,
            name: self.name(slot, s.generation),
            created: s.created,
            clean: false,
        })
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        let Ok(mut slots) = self.nets.slots.lock() else {
            return;
        };
        let s = slots.entry(self.slot).or_default();
        s.in_use = false;
        if self.clean {
            s.created = self.created;
        } else {
            // Not known to be empty: never handed to another job ([`DockerExecutor::shutdown`]
            // removes it).
            s.generation += 1;
            s.created = false;
        }
    }
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
        let transport = dial_stdio_transport(client, config.host.as_deref());
        Ok(Self::new(Docker::connect(transport).await?, config))
    }

    /// The engine client.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// The configuration.
    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    /// The warm slot networks' label filter (`com.slipway.slot-network=<token>`).
    pub fn slot_network_label(&self) -> String {
        format!("{LABEL_SLOT_NETWORK}={}", self.nets.token)
    }

    /// Remove the slots' warm networks (call when the runner stops). Jobs still running keep
    /// theirs until they end; removing one with containers attached fails and is reported.
    pub async fn shutdown(&self) -> Result<(), DockerExecutorError> {
        let label = self.slot_network_label();
        let mut failed = None;
        for n in self.docker.list_networks(Some(&label)).await? {
            match self.docker.remove_network(&n.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => failed = Some(e),
            }
        }
        if let Ok(mut slots) = self.nets.slots.lock() {
            for s in slots.values_mut() {
                s.generation += 1;
                s.created = false;
            }
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Remove the job containers and volumes of `runner` on this engine: those of another
    /// session (a killed manager's, whose jobs were reported failed), or with `all`, this
    /// session's too (at shutdown, when no job runs). Cache volumes are kept.
    pub async fn sweep_job_leftovers(
        docker: &Docker,
        runner: &str,
        all: bool,
    ) -> slipway_docker::Result<usize> {
        let label = format!("{LABEL_RUNNER}={runner}");
        let stale = |labels: Option<&std::collections::HashMap<String, String>>| {
            labels.is_some_and(|l| {
                l.contains_key(LABEL_RUN)
                    && !l.contains_key(LABEL_CACHE)
                    && (all || l.get(LABEL_SESSION).map(String::as_str) != Some(session()))
            })
        };
        let mut removed = 0;
        for c in docker.list_containers(Some(&label)).await? {
            if stale(c.labels.as_ref()) {
                match docker.remove_container(&c.id, true, true).await {
                    Ok(()) => removed += 1,
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for v in docker.list_volumes(Some(&label)).await? {
            if stale(v.labels.as_ref()) {
                match docker.remove_volume(&v.name, true).await {
                    Ok(()) => removed += 1,
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(removed)
    }

    /// Remove the slot networks of `runner` another session left (a killed manager's), or with
    /// `all` this session's too (at shutdown, when no job runs). This session's are kept
    /// otherwise: instances may share an engine (the local plugin's do), and a job on one of
    /// them may be about to start in its network.
    pub async fn sweep_slot_networks(
        docker: &Docker,
        runner: &str,
        all: bool,
    ) -> slipway_docker::Result<()> {
        let label = format!("{LABEL_RUNNER}={runner}");
        for n in docker.list_networks(Some(&label)).await? {
            let ours = n.labels.as_ref().is_some_and(|l| {
                l.contains_key(LABEL_SLOT_NETWORK)
                    && (all || l.get(LABEL_SESSION).map(String::as_str) != Some(session()))
            });
            if ours {
                match docker.remove_network(&n.id).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Run a job in containers and remove every container, network and volume it created,
    /// whatever happened.
    pub async fn run(&self, job: &JobResponse, ctx: DockerRunContext<'_>) -> RunResult {
        let started = Instant::now();
        let run = RunNames::new(&self.runner_name, job.id);
        // Another job holding the slot (a caller reusing a slot number): a per-job network.
        let mut lease = self.nets.acquire(ctx.slot);
        let DockerRunContext {
            slot,
            cgroup_parent,
            trace,
            cancel,
            abort,
            artifacts_in,
        } = ctx;
        let result = match self
            .prepare(
                job,
                &run,
                slot,
                cgroup_parent,
                trace,
                &cancel,
                started,
                lease.as_mut(),
            )
            .await
        {
            Ok((container, first)) => {
                let host = DockerHost::with_first_step(self.docker.clone(), container, first);
                let runner = JobRunner {
                    builds_dir: BUILDS_DIR.into(),
                    kill_grace_secs: self.kill_grace_secs,
                    cache_dir: self.cache_dir.clone(),
                    ..JobRunner::default()
                };
                // The job's timeout covers its preparation too.
                let job = remaining_timeout(job, started.elapsed());
                runner
                    .run(
                        &job,
                        JobContext {
                            host: &host,
                            slot,
                            trace: &mut *trace,
                            cancel,
                            abort,
                            artifacts_in,
                        },
                    )
                    .await
            }
            Err(outcome) => RunResult {
                outcome,
                artifacts: Vec::new(),
            },
        };
        let clean = self.remove_all(&run, trace).await;
        if let Some(lease) = lease.as_mut() {
            lease.clean = clean;
        }
        drop(lease);
        result
    }

    /// Everything up to a running build container; its id, or the job's failure.
    #[allow(clippy::too_many_arguments)]
    async fn prepare(
        &self,
        job: &JobResponse,
        run: &RunNames,
        slot: u32,
        cgroup_parent: Option<String>,
        trace: &mut Trace,
        cancel: &CancellationToken,
        started: Instant,
        lease: Option<&mut SlotLease>,
    ) -> Result<(String, FirstStep), JobOutcome> {
        let config_error = |trace: &mut Trace, msg: String| {
            trace.message(&format!("ERROR: {msg}"));
            JobOutcome::failed(FailureReason::RunnerConfigurationError, None, msg)
        };
        let system = |trace: &mut Trace, what: &str, e: slipway_docker::Error| {
            let msg = format!("{what}: {e}");
            trace.message(&format!("ERROR: Job failed (system failure): {msg}"));
            JobOutcome::failed(FailureReason::RunnerSystemFailure, None, msg)
        };
        let timeout = match job.runner_info.timeout {
            0 => DEFAULT_JOB_TIMEOUT,
            s => Duration::from_secs(s),
        };
        let deadline = started + timeout;
        let stopped = |trace: &mut Trace| -> Option<JobOutcome> {
            if cancel.is_cancelled() {
                trace.message("ERROR: job canceled");
                Some(JobOutcome::failed(
                    FailureReason::JobCanceled,
                    None,
                    "job canceled",
                ))
            } else if Instant::now() >= deadline {
                let msg = format!(
                    "job execution timeout: exceeded {}",
                    crate::job::fmt_secs(timeout)
                );
                trace.message(&format!("ERROR: {msg}"));
                Some(JobOutcome::failed(
                    FailureReason::JobExecutionTimeout,
                    None,
                    msg,
                ))
            } else {
                None
            }
        };

        // What the job asks for, checked against the configuration.
        let memory = self
            .config
            .memory_bytes()
            .map_err(|e| config_error(trace, e.to_string()))?;
        let nano_cpus = self
            .config
            .nano_cpus()
            .map_err(|e| config_error(trace, e.to_string()))?;
        let mut image = job.image.clone().unwrap_or_default();
        if image.name.is_empty() {
            image.name = self.config.image.clone().unwrap_or_default();
        }
        if image.name.is_empty() {
            return Err(config_error(
                trace,
                "no image: the job names none and [runners.docker] image is not set".into(),
            ));
        }
        if !allowed(&self.config.allowed_images, &image.name) {
            return Err(config_error(
                trace,
                format!(
                    "the image {:?} is not present on the list of allowed images: {}",
                    image.name,
                    self.config.allowed_images.join(", ")
                ),
            ));
        }
        for s in &job.services {
            if !allowed(&self.config.allowed_services, &s.name) {
                return Err(config_error(
                    trace,
                    format!(
                        "the service {:?} is not present on the list of allowed services: {}",
                        s.name,
                        self.config.allowed_services.join(", ")
                    ),
                ));
            }
        }

        trace.message(&format!(
            "Using Docker executor with image {} ...",
            image.name
        ));
        let mut policies = Vec::new();
        for img in std::iter::once(&image).chain(job.services.iter()) {
            let p = self
                .config
                .pull_policies_for(img)
                .map_err(|m| config_error(trace, m))?;
            policies.push((img.name.clone(), p));
        }

        let labels = run.labels(job.id, slot);
        let cgroup_parent = cgroup_parent
            .filter(|p| !p.is_empty())
            .or_else(|| self.config.cgroup_parent.clone().filter(|p| !p.is_empty()));
        if let Some(o) = stopped(trace) {
            return Err(o);
        }

        // Images, the network and the builds volume at once: independent calls.
        let (network, create_network) = match &lease {
            Some(l) => (l.name.clone(), !l.created),
            None => (run.network(), true),
        };
        let setup = async {
            let net = async {
                if !create_network {
                    return Ok(());
                }
                let mut net = NetworkSpec::new(&network);
                net.labels = match &lease {
                    Some(l) => [
                        (LABEL_RUNNER.to_string(), self.runner_name.clone()),
                        (LABEL_SLOT_NETWORK.to_string(), l.nets.token.clone()),
                        (LABEL_SESSION.to_string(), session().to_string()),
                        ("com.slipway.slot".to_string(), slot.to_string()),
                    ]
                    .into(),
                    None => labels.clone(),
                };
                match self.docker.create_network(&net).await {
                    // Ours from a run stopped before it learnt so: empty, as its cleanup was clean.
                    Err(e) if lease.is_some() && e.is_conflict() => Ok(()),
                    r => r.map(drop),
                }
            };
            let vol = async {
                let mut vol = VolumeSpec::new(run.builds_volume());
                vol.labels = labels.clone();
                self.docker.create_volume(&vol).await.map(drop)
            };
            let (n, v) = tokio::join!(net, vol);
            (n, v)
        };
        let pulls = async {
            for (name, p) in &policies {
                self.ensure_image(name, p, trace).await?;
            }
            Ok::<(), String>(())
        };
        let both = async { tokio::join!(pulls, setup) };
        let done = tokio::select! {
            r = both => Some(r),
            _ = cancel.cancelled() => None,
            _ = tokio::time::sleep_until(deadline) => None,
        };
        let Some((pulled, (net, vol))) = done else {
            return Err(stopped(trace).unwrap_or_else(canceled));
        };
        if let Err(msg) = pulled {
            trace.message(&format!("ERROR: Job failed: {msg}"));
            return Err(JobOutcome::failed(
                FailureReason::ImagePullFailure,
                None,
                msg,
            ));
        }
        net.map_err(|e| system(trace, "creating the job's network", e))?;
        if let Some(l) = lease {
            l.created = true;
        }
        vol.map_err(|e| system(trace, "creating the builds volume", e))?;

        // Services.
        let service_env = service_env(job);
        let mut services = Vec::new();
        for (i, svc) in job.services.iter().enumerate() {
            if let Some(o) = stopped(trace) {
                return Err(o);
            }
            let aliases = service_aliases(svc);
            trace.message(&format!(
                "Starting service {} as {} ...",
                svc.name,
                aliases.join(", ")
            ));
            let mut spec = ContainerSpec::new(&svc.name);
            spec.name = Some(run.service(i));
            spec.labels = labels.clone();
            spec.labels
                .insert("com.slipway.service".into(), svc.name.clone());
            spec.env = service_env.clone();
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
            spec.network = Some(network.clone());
            spec.network_aliases = aliases;
            self.limits(&mut spec, memory, nano_cpus, &cgroup_parent);
            let id = self
                .docker
                .create_container(&spec)
                .await
                .map_err(|e| system(trace, &format!("creating service {}", svc.name), e))?
                .id;
            self.docker
                .start_container(&id)
                .await
                .map_err(|e| system(trace, &format!("starting service {}", svc.name), e))?;
            services.push((svc.name.clone(), id));
        }

        // The build container.
        if let Some(o) = stopped(trace) {
            return Err(o);
        }
        let mut spec = ContainerSpec::new(&image.name);
        spec.name = Some(run.build());
        spec.labels = labels.clone();
        spec.labels
            .insert("com.slipway.role".into(), "build".into());
        if !image.entrypoint.is_empty() {
            spec.entrypoint = Some(image.entrypoint.clone());
        }
        spec.cmd = Some(vec!["sh".into(), "-c".into(), FIRST_STEP_SHELL.into()]);
        spec.open_stdin = true;
        spec.working_dir = Some(BUILDS_DIR.into());
        spec.network = Some(network.clone());
        spec.network_aliases = vec!["build".into()];
        spec.binds = vec![format!("{}:{BUILDS_DIR}", run.builds_volume())];
        self.config_volumes(&mut spec, job, run, &labels)
            .await
            .map_err(|e| system(trace, "creating the configured volumes", e))?;
        self.limits(&mut spec, memory, nano_cpus, &cgroup_parent);
        let id = self
            .docker
            .create_container(&spec)
            .await
            .map_err(|e| system(trace, "creating the build container", e))?
            .id;
        // Attached while it starts: its shell waits for the first script on stdin.
        let opts = AttachOptions {
            stdin: true,
            ..AttachOptions::default()
        };
        let attach = self.docker.attach(&id, &opts);
        let (attached, started) = tokio::join!(attach, self.docker.start_container(&id));
        started.map_err(|e| system(trace, "starting the build container", e))?;
        let attached =
            attached.map_err(|e| system(trace, "attaching to the build container", e))?;
        let first = FirstStep {
            attached,
            marker: format!(
                "__slipway_end_{}_",
                fnv1a(&format!("{}{:?}", run.prefix, std::time::SystemTime::now()))
            ),
        };

        // A service that exited at once will not answer: say so, with its output.
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
        Ok((id, first))
    }

    fn limits(
        &self,
        spec: &mut ContainerSpec,
        memory: Option<i64>,
        nano_cpus: Option<i64>,
        cgroup_parent: &Option<String>,
    ) {
        spec.memory = memory;
        spec.nano_cpus = nano_cpus;
        spec.cgroup_parent.clone_from(cgroup_parent);
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

    /// Pull `image` as `policies` say; the message for the trace when no policy gives it.
    async fn ensure_image(
        &self,
        image: &str,
        policies: &[PullPolicy],
        trace: &mut Trace,
    ) -> Result<(), String> {
        let mut last = String::from("no pull policy");
        for policy in policies {
            let attempt = match policy {
                PullPolicy::Never => match self.docker.inspect_image(image).await {
                    Ok(_) => Ok(true),
                    Err(e) => Err(e.to_string()),
                },
                PullPolicy::IfNotPresent => match self.docker.image_exists(image).await {
                    Ok(true) => Ok(true),
                    Ok(false) => self.pull(image, trace).await.map(|()| false),
                    Err(e) => Err(e.to_string()),
                },
                PullPolicy::Always => self.pull(image, trace).await.map(|()| false),
            };
            match attempt {
                Ok(true) => {
                    trace.message(&format!("Using locally found image {image}"));
                    return Ok(());
                }
                Ok(false) => return Ok(()),
                Err(e) => {
                    trace.message(&format!(
                        "WARNING: Failed to pull image {image} with policy \"{policy}\": {e}"
                    ));
                    last = e;
                }
            }
        }
        Err(format!(
            "failed to pull image \"{image}\" with specified policies [{}]: {last}",
            join(policies)
        ))
    }

    async fn pull(&self, image: &str, trace: &mut Trace) -> Result<(), String> {
        trace.message(&format!("Pulling docker image {image} ..."));
        self.docker.pull_image(image).await.map_err(|e| match e {
            slipway_docker::Error::Pull { message, .. } => message,
            other => other.to_string(),
        })
    }

    /// Remove everything the run created; retried, bounded, reported in the trace. Whether
    /// nothing is left.
    async fn remove_all(&self, run: &RunNames, trace: &mut Trace) -> bool {
        let label = format!("{LABEL_RUN}={}", run.prefix);
        let work = async {
            let mut last = String::new();
            for attempt in 0..3u32 {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
                }
                match self.docker.cleanup_by_label(&label).await {
                    Ok(report) if report.is_clean() => return Ok(()),
                    Ok(report) => {
                        last = report
                            .failed
                            .iter()
                            .map(|(kind, id, e)| format!("{kind} {id}: {e}"))
                            .collect::<Vec<_>>()
                            .join("; ");
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            Err(last)
        };
        match tokio::time::timeout(CLEANUP_TIMEOUT, work).await {
            Ok(Ok(())) => return true,
            Ok(Err(e)) => {
                tracing::warn!(run = %run.prefix, "docker cleanup incomplete: {e}");
                trace.message(&format!(
                    "WARNING: removing the job's containers failed: {e}"
                ));
            }
            Err(_) => {
                tracing::warn!(run = %run.prefix, "docker cleanup timed out");
                trace.message("WARNING: removing the job's containers timed out");
            }
        }
        false
    }
}

fn canceled() -> JobOutcome {
    JobOutcome::failed(FailureReason::JobCanceled, None, "job canceled")
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

/// Job variables for service containers (GitLab passes them), file variables excepted.
fn service_env(job: &JobResponse) -> Vec<String> {
    job.variables
        .iter()
        .filter(|v| !v.file && !v.key.is_empty() && !v.key.contains('='))
        .map(|v| format!("{}={}", v.key, v.value))
        .collect()
}

/// Names of one run's objects, all starting with a prefix unique to the run.
#[derive(Debug, Clone)]
struct RunNames {
    prefix: String,
    runner: String,
}

/// This process's session id (its pid and start time), for [`LABEL_SESSION`].
pub fn session() -> &'static str {
    static SESSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SESSION.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{}-{nanos:x}", std::process::id())
    })
}

impl RunNames {
    fn new(runner: &str, job_id: u64) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let prefix = format!(
            "{}-job{job_id}-{:x}{:x}{}",
            sanitize(runner),
            std::process::id(),
            nanos & 0xfff_fff,
            N.fetch_add(1, Ordering::Relaxed)
        );
        RunNames {
            prefix,
            runner: runner.to_string(),
        }
    }

    fn labels(&self, job_id: u64, slot: u32) -> BTreeMap<String, String> {
        [
            (LABEL_JOB.to_string(), job_id.to_string()),
            (LABEL_RUNNER.to_string(), self.runner.clone()),
            (LABEL_RUN.to_string(), self.prefix.clone()),
            (LABEL_SESSION.to_string(), session().to_string()),
            ("com.slipway.slot".to_string(), slot.to_string()),
        ]
        .into()
    }

    fn network(&self) -> String {
        format!("{}-net", self.prefix)
    }

    fn builds_volume(&self) -> String {
        format!("{}-builds", self.prefix)
    }

    fn service(&self, i: usize) -> String {
        format!("{}-svc{i}", self.prefix)
    }

    fn build(&self) -> String {
        format!("{}-build", self.prefix)
    }
}

/// A name Docker accepts for containers, networks and volumes (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`).
fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    match out.chars().next() {
        Some(c) if c.is_ascii_alphanumeric() => out,
        _ => format!("r{out}"),
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
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
    use super::*;

    #[test]
    fn config_defaults_and_keys() {
        let c: DockerConfig = toml::from_str("").unwrap();
        assert_eq!(c, DockerConfig::default());
        assert_eq!(c.pull_policy, vec![PullPolicy::Always]);
        assert!(!c.privileged);
        let c: DockerConfig = toml::from_str(
            r#"
            image = "alpine:3"
            privileged = false
            volumes = ["/cache", "/srv:/srv:ro"]
            memory = "128m"
            cpus = "1.5"
            pull_policy = "if-not-present"
            allowed_pull_policies = ["always", "never"]
            allowed_images = ["alpine:*", "team/**"]
            network_mode = "ignored"
            helper_image = "ignored"
            "#,
        )
        .unwrap();
        assert_eq!(c.pull_policy, vec![PullPolicy::IfNotPresent]);
        assert_eq!(
            c.allowed_pull_policies,
            vec![PullPolicy::Always, PullPolicy::Never]
        );
        assert_eq!(c.memory_bytes().unwrap(), Some(128 << 20));
        assert_eq!(c.nano_cpus().unwrap(), Some(1_500_000_000));
        let c: DockerConfig =
            toml::from_str(r#"pull_policy = ["always", "if-not-present"]"#).unwrap();
        assert_eq!(
            c.pull_policy,
            vec![PullPolicy::Always, PullPolicy::IfNotPresent]
        );
        assert!(toml::from_str::<DockerConfig>(r#"pull_policy = "sometimes""#).is_err());
        let bad = DockerConfig {
            memory: Some("lots".into()),
            ..DockerConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn memory_units() {
        assert_eq!(parse_memory("512m"), Some(512 << 20));
        assert_eq!(parse_memory("2G"), Some(2 << 30));
        assert_eq!(parse_memory("64mb"), Some(64 << 20));
        assert_eq!(parse_memory("1024"), Some(1024));
        assert_eq!(parse_memory("1.5k"), Some(1536));
        assert_eq!(parse_memory("x"), None);
        assert_eq!(parse_memory("-1m"), None);
    }

    #[test]
    fn job_pull_policy_must_be_allowed() {
        let c = DockerConfig {
            pull_policy: vec![PullPolicy::IfNotPresent],
            ..DockerConfig::default()
        };
        let mut img = Image::named("x");
        assert_eq!(
            c.pull_policies_for(&img).unwrap(),
            vec![PullPolicy::IfNotPresent]
        );
        img.pull_policy = vec!["always".into()];
        assert!(c.pull_policies_for(&img).is_err());
        img.pull_policy = vec!["if-not-present".into()];
        assert_eq!(
            c.pull_policies_for(&img).unwrap(),
            vec![PullPolicy::IfNotPresent]
        );
    }

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

    #[test]
    fn names_are_docker_safe_and_unique() {
        assert_eq!(sanitize("my runner/1"), "my-runner-1");
        assert_eq!(sanitize("-x"), "r-x");
        let a = RunNames::new("r", 1);
        let b = RunNames::new("r", 1);
        assert_ne!(a.prefix, b.prefix);
        assert!(a.network().starts_with("r-job1-"));
    }
}
