//! Containers: create, start, attach, logs, wait, kill, stop, remove, inspect, list.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::client::{Docker, Req, seg};
use crate::error::{Error, Result};
use crate::stream::{Attached, LogStream};

/// What to create: the parts of the Engine's container config and host config that a CI job
/// needs. `Default` leaves everything to the image and the engine.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// Container name (`--name`); the engine makes one up when `None`.
    pub name: Option<String>,
    /// Image reference.
    pub image: String,
    /// Command (`CMD`); the image's when `None`.
    pub cmd: Option<Vec<String>>,
    /// Entrypoint; the image's when `None`, none when `Some(vec![])`.
    pub entrypoint: Option<Vec<String>>,
    /// Environment, `KEY=value` each.
    pub env: Vec<String>,
    /// Working directory.
    pub working_dir: Option<String>,
    /// User (`uid[:gid]` or name).
    pub user: Option<String>,
    /// Hostname.
    pub hostname: Option<String>,
    /// Labels, e.g. `com.slipway.job=42`.
    pub labels: BTreeMap<String, String>,
    /// Allocate a TTY (output is then not split into stdout/stderr).
    pub tty: bool,
    /// Keep stdin open (needed to attach stdin).
    pub open_stdin: bool,
    /// Close stdin after the first attached client detaches.
    pub stdin_once: bool,
    /// Bind mounts and named volumes, `src:dst[:opts]` each (`HostConfig.Binds`).
    pub binds: Vec<String>,
    /// Anonymous volumes at these container paths (`Volumes`).
    pub volumes: Vec<String>,
    /// Network to join (`HostConfig.NetworkMode`), e.g. a per-job network's name.
    pub network: Option<String>,
    /// DNS aliases on `network` (user-defined networks only).
    pub network_aliases: Vec<String>,
    /// Memory limit in bytes.
    pub memory: Option<i64>,
    /// CPU limit in billionths of a CPU.
    pub nano_cpus: Option<i64>,
    /// Parent cgroup (`--cgroup-parent`).
    pub cgroup_parent: Option<String>,
    /// Privileged mode.
    pub privileged: bool,
    /// Remove the container when it exits.
    pub auto_remove: bool,
    /// Extra `/etc/hosts` entries, `host:ip` each.
    pub extra_hosts: Vec<String>,
}

impl ContainerSpec {
    /// A spec for `image` with everything else default.
    pub fn new(image: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            ..Self::default()
        }
    }

    /// The Engine's JSON body for `POST /containers/create`.
    pub fn to_json(&self) -> Value {
        let mut c = Map::new();
        c.insert("Image".into(), json!(self.image));
        if let Some(cmd) = &self.cmd {
            c.insert("Cmd".into(), json!(cmd));
        }
        if let Some(ep) = &self.entrypoint {
            // An empty list would mean "the image's"; `[""]` resets it.
            let ep = if ep.is_empty() {
                vec![String::new()]
            } else {
                ep.clone()
            };
            c.insert("Entrypoint".into(), json!(ep));
        }
        if !self.env.is_empty() {
            c.insert("Env".into(), json!(self.env));
        }
        if let Some(wd) = &self.working_dir {
            c.insert("WorkingDir".into(), json!(wd));
        }
        if let Some(user) = &self.user {
            c.insert("User".into(), json!(user));
        }
        if let Some(h) = &self.hostname {
            c.insert("Hostname".into(), json!(h));
        }
        if !self.labels.is_empty() {
            c.insert("Labels".into(), json!(self.labels));
        }
        c.insert("Tty".into(), json!(self.tty));
        c.insert("OpenStdin".into(), json!(self.open_stdin));
        c.insert("StdinOnce".into(), json!(self.stdin_once));
        c.insert("AttachStdin".into(), json!(self.open_stdin));
        c.insert("AttachStdout".into(), json!(true));
        c.insert("AttachStderr".into(), json!(true));
        if !self.volumes.is_empty() {
            let vols: Map<String, Value> = self
                .volumes
                .iter()
                .map(|v| (v.clone(), json!({})))
                .collect();
            c.insert("Volumes".into(), Value::Object(vols));
        }

        let mut h = Map::new();
        if !self.binds.is_empty() {
            h.insert("Binds".into(), json!(self.binds));
        }
        if let Some(net) = &self.network {
            h.insert("NetworkMode".into(), json!(net));
        }
        if let Some(m) = self.memory {
            h.insert("Memory".into(), json!(m));
        }
        if let Some(n) = self.nano_cpus {
            h.insert("NanoCpus".into(), json!(n));
        }
        if let Some(p) = &self.cgroup_parent {
            h.insert("CgroupParent".into(), json!(p));
        }
        if self.privileged {
            h.insert("Privileged".into(), json!(true));
        }
        if self.auto_remove {
            h.insert("AutoRemove".into(), json!(true));
        }
        if !self.extra_hosts.is_empty() {
            h.insert("ExtraHosts".into(), json!(self.extra_hosts));
        }
        c.insert("HostConfig".into(), Value::Object(h));

        if let Some(net) = &self.network
            && !self.network_aliases.is_empty()
        {
            c.insert(
                "NetworkingConfig".into(),
                json!({ "EndpointsConfig": { net: { "Aliases": self.network_aliases } } }),
            );
        }
        Value::Object(c)
    }
}

/// Answer of `POST /containers/create`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CreatedContainer {
    /// The new container's ID.
    pub id: String,
    /// Warnings from the engine.
    #[serde(default)]
    pub warnings: Option<Vec<String>>,
}

/// When [`Docker::wait_container`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WaitCondition {
    /// As soon as the container is not running (immediately for a created one).
    #[default]
    NotRunning,
    /// At the next exit; use this when waiting is set up before `start`.
    NextExit,
    /// When the container has been removed.
    Removed,
}

impl WaitCondition {
    fn as_str(self) -> &'static str {
        match self {
            WaitCondition::NotRunning => "not-running",
            WaitCondition::NextExit => "next-exit",
            WaitCondition::Removed => "removed",
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WaitResponse {
    status_code: i64,
    #[serde(default)]
    error: Option<WaitError>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WaitError {
    #[serde(default)]
    message: String,
}

/// `GET /containers/{id}/json` (the parts we use).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerInspect {
    /// Container ID.
    pub id: String,
    /// Name, with a leading `/`.
    #[serde(default)]
    pub name: String,
    /// Image ID.
    #[serde(default)]
    pub image: String,
    /// Run state.
    #[serde(default)]
    pub state: ContainerState,
    /// Configuration (labels, env, tty…).
    #[serde(default)]
    pub config: Option<ContainerConfigView>,
    /// Network attachment.
    #[serde(default)]
    pub network_settings: Option<NetworkSettings>,
    /// Host configuration (limits, mounts, cgroup parent).
    #[serde(default)]
    pub host_config: Option<HostConfigView>,
}

/// The host-configuration part of an inspect answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HostConfigView {
    /// Bind mounts.
    #[serde(default)]
    pub binds: Option<Vec<String>>,
    /// Network mode.
    #[serde(default)]
    pub network_mode: String,
    /// Memory limit in bytes (0 = none).
    #[serde(default)]
    pub memory: i64,
    /// CPU limit in billionths of a CPU (0 = none).
    #[serde(default)]
    pub nano_cpus: i64,
    /// Parent cgroup.
    #[serde(default)]
    pub cgroup_parent: String,
    /// Privileged mode.
    #[serde(default)]
    pub privileged: bool,
}

/// A container's run state.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerState {
    /// `created`, `running`, `exited`…
    #[serde(default)]
    pub status: String,
    /// Whether it runs.
    #[serde(default)]
    pub running: bool,
    /// Exit code of the last run.
    #[serde(default)]
    pub exit_code: i64,
    /// Killed by the OOM killer.
    #[serde(default, rename = "OOMKilled")]
    pub oom_killed: bool,
    /// Main process ID on the host.
    #[serde(default)]
    pub pid: i64,
    /// Engine error starting it, if any.
    #[serde(default)]
    pub error: String,
}

/// The configuration part of an inspect answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerConfigView {
    /// Image reference it was created from.
    #[serde(default)]
    pub image: String,
    /// Labels.
    #[serde(default)]
    pub labels: Option<HashMap<String, String>>,
    /// Environment.
    #[serde(default)]
    pub env: Option<Vec<String>>,
    /// Whether it has a TTY.
    #[serde(default)]
    pub tty: bool,
    /// Working directory.
    #[serde(default)]
    pub working_dir: String,
    /// Command.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
}

/// Network attachment of a container.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NetworkSettings {
    /// Per network name.
    #[serde(default)]
    pub networks: Option<HashMap<String, EndpointView>>,
}

/// One network endpoint of a container.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct EndpointView {
    /// Network ID.
    #[serde(default, rename = "NetworkID")]
    pub network_id: String,
    /// IPv4 address.
    #[serde(default, rename = "IPAddress")]
    pub ip_address: String,
    /// DNS aliases.
    #[serde(default)]
    pub aliases: Option<Vec<String>>,
}

/// One entry of `GET /containers/json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerSummary {
    /// Container ID.
    pub id: String,
    /// Names, each with a leading `/`.
    #[serde(default)]
    pub names: Vec<String>,
    /// Image reference.
    #[serde(default)]
    pub image: String,
    /// `created`, `running`, `exited`…
    #[serde(default)]
    pub state: String,
    /// Human-readable status.
    #[serde(default)]
    pub status: String,
    /// Labels.
    #[serde(default)]
    pub labels: Option<HashMap<String, String>>,
}

/// Options for [`Docker::logs`].
#[derive(Debug, Clone, Default)]
pub struct LogsOptions {
    /// Keep streaming until the container stops.
    pub follow: bool,
    /// Include stdout.
    pub stdout: bool,
    /// Include stderr.
    pub stderr: bool,
    /// Prefix each line with a timestamp.
    pub timestamps: bool,
    /// The container has a TTY (its output is not framed).
    pub tty: bool,
}

impl LogsOptions {
    /// stdout and stderr, following, no TTY.
    pub fn follow() -> Self {
        Self {
            follow: true,
            stdout: true,
            stderr: true,
            ..Self::default()
        }
    }
}

/// Options for [`Docker::attach`].
#[derive(Debug, Clone, Default)]
pub struct AttachOptions {
    /// Attach stdin (the container needs `open_stdin`).
    pub stdin: bool,
    /// Replay output written before attaching.
    pub logs: bool,
    /// The container has a TTY (its output is not framed).
    pub tty: bool,
}

impl Docker {
    /// `POST /containers/create`.
    pub async fn create_container(&self, spec: &ContainerSpec) -> Result<CreatedContainer> {
        let req = Req::post("/containers/create")
            .query_opt("name", spec.name.clone())
            .json(&spec.to_json())?;
        self.json(req).await
    }

    /// `POST /containers/{id}/start`.
    pub async fn start_container(&self, id: &str) -> Result<()> {
        self.empty(Req::post(format!("/containers/{}/start", seg(id))))
            .await
    }

    /// `POST /containers/{id}/wait`: the exit code. An engine-side wait error is an error.
    pub async fn wait_container(&self, id: &str, condition: WaitCondition) -> Result<i64> {
        let req = Req::post(format!("/containers/{}/wait", seg(id)))
            .query("condition", condition.as_str());
        let resp: WaitResponse = self.json(req).await?;
        match resp.error {
            Some(e) if !e.message.is_empty() => Err(Error::Stream(format!(
                "waiting for container {id}: {}",
                e.message
            ))),
            _ => Ok(resp.status_code),
        }
    }

    /// `POST /containers/{id}/kill` with `signal` (e.g. `SIGKILL`, `SIGTERM`).
    pub async fn kill_container(&self, id: &str, signal: &str) -> Result<()> {
        self.empty(Req::post(format!("/containers/{}/kill", seg(id))).query("signal", signal))
            .await
    }

    /// `POST /containers/{id}/stop`, killing after `timeout_secs`.
    pub async fn stop_container(&self, id: &str, timeout_secs: u32) -> Result<()> {
        let req =
            Req::post(format!("/containers/{}/stop", seg(id))).query("t", timeout_secs.to_string());
        self.empty(req).await
    }

    /// `DELETE /containers/{id}`; `force` kills a running one, `volumes` drops its anonymous
    /// volumes.
    pub async fn remove_container(&self, id: &str, force: bool, volumes: bool) -> Result<()> {
        let req = Req::delete(format!("/containers/{}", seg(id)))
            .query_bool("force", force)
            .query_bool("v", volumes);
        self.empty(req).await
    }

    /// `GET /containers/{id}/json`.
    pub async fn inspect_container(&self, id: &str) -> Result<ContainerInspect> {
        self.json(Req::get(format!("/containers/{}/json", seg(id))))
            .await
    }

    /// `GET /containers/json?all=1`, optionally only those carrying `label` (`key` or
    /// `key=value`).
    pub async fn list_containers(&self, label: Option<&str>) -> Result<Vec<ContainerSummary>> {
        self.json(
            Req::get("/containers/json")
                .query("all", "1")
                .label_filter(label),
        )
        .await
    }

    /// `GET /containers/{id}/logs` as a demultiplexed stream.
    pub async fn logs(&self, id: &str, opts: &LogsOptions) -> Result<LogStream> {
        let req = Req::get(format!("/containers/{}/logs", seg(id)))
            .query_bool("follow", opts.follow)
            .query_bool("stdout", opts.stdout)
            .query_bool("stderr", opts.stderr)
            .query_bool("timestamps", opts.timestamps);
        let body = self.send(req).await?;
        Ok(LogStream::new(body, opts.tty))
    }

    /// `POST /containers/{id}/attach` on a hijacked connection: output, and stdin when asked.
    /// Attach before `start` to see all output.
    pub async fn attach(&self, id: &str, opts: &AttachOptions) -> Result<Attached> {
        let req = Req::post(format!("/containers/{}/attach", seg(id)))
            .query("stream", "1")
            .query_bool("stdin", opts.stdin)
            .query("stdout", "1")
            .query("stderr", "1")
            .query_bool("logs", opts.logs);
        let io = self.upgrade(req).await?;
        Ok(Attached::new(io, opts.tty))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_json_has_engine_shape() {
        let mut spec = ContainerSpec::new("img");
        spec.cmd = Some(vec!["sh".into(), "-c".into(), "true".into()]);
        spec.entrypoint = Some(vec![]);
        spec.network = Some("net1".into());
        spec.network_aliases = vec!["db".into()];
        spec.memory = Some(64 << 20);
        spec.nano_cpus = Some(500_000_000);
        spec.cgroup_parent = Some("/slipway/slot-1".into());
        spec.labels.insert("com.slipway.job".into(), "7".into());
        spec.volumes = vec!["/cache".into()];
        let v = spec.to_json();
        assert_eq!(v["Entrypoint"], json!([""]));
        assert_eq!(v["HostConfig"]["NetworkMode"], "net1");
        assert_eq!(v["HostConfig"]["Memory"], 64 << 20);
        assert_eq!(v["HostConfig"]["NanoCpus"], 500_000_000);
        assert_eq!(v["HostConfig"]["CgroupParent"], "/slipway/slot-1");
        assert_eq!(
            v["NetworkingConfig"]["EndpointsConfig"]["net1"]["Aliases"],
            json!(["db"])
        );
        assert_eq!(v["Labels"]["com.slipway.job"], "7");
        assert_eq!(v["Volumes"]["/cache"], json!({}));
    }
}
