//! `config.toml`, read as GitLab Runner writes it: the keys Slipway honours so far.
//!
//! A wrong type or value is an error naming file, line and key; an unknown key is a warning.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// The configuration Slipway uses when none is given (`slipway exec` without `-c`).
pub const EMBEDDED: &str = include_str!("embedded.toml");

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Jobs running at once across all runners.
    pub concurrent: u32,
    /// Log level (`debug`, `info`, `warn`, `error`).
    pub log_level: Option<String>,
    /// `host:port` serving `/metrics` and `/healthz` (`slipway run`).
    pub listen_address: Option<String>,
    /// Seconds to wait for jobs at shutdown.
    pub shutdown_timeout: u64,
    /// Seconds between job requests that found no job (GitLab Runner's default: 3; 0 = 3).
    pub check_interval: u64,
    /// The `[[runners]]` entries.
    pub runners: Vec<RunnerConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            concurrent: 1,
            log_level: None,
            listen_address: None,
            shutdown_timeout: 30,
            check_interval: 3,
            runners: Vec::new(),
        }
    }
}

/// One `[[runners]]` entry.
#[derive(Clone, Deserialize, Default)]
#[serde(default)]
pub struct RunnerConfig {
    /// Runner name.
    pub name: String,
    /// GitLab URL: with a `token`, an `http(s)://` URL makes GitLab this runner's job source.
    pub url: String,
    /// Runner token. Never printed.
    pub token: String,
    /// Executor name.
    pub executor: String,
    /// Jobs this runner runs at once; 0 = no limit beyond `concurrent`.
    pub limit: u32,
    /// `jobs/request` calls in flight at once (GitLab Runner's default: 1; 0 = 1).
    pub request_concurrency: u32,
    /// Largest trace kept, in KiB (GitLab Runner's default: 4096; 0 = 4096).
    pub output_limit: u64,
    /// Builds root on the instance.
    pub builds_dir: Option<String>,
    /// Isolation levels jobs may ask for (`SLIPWAY_ISOLATION`); default: what the executor
    /// supports.
    pub allowed_isolation: Option<Vec<String>>,
    /// Level of a job that asks for none (default `none`, or `cgroup` with `use_slot_cgroups`).
    pub isolation: Option<String>,
    /// GitLab's switch: every job in its slot's cgroup (the `cgroup` level by default).
    pub use_slot_cgroups: bool,
    /// Slot cgroup path; `${slot}` (GitLab) or `{slot}` is the slot number.
    pub slot_cgroup_template: Option<String>,
    /// `[runners.autoscaler]`.
    pub autoscaler: Option<AutoscalerConfig>,
    /// `[runners.docker]` (docker and docker-autoscaler executors, and the `docker` level).
    pub docker: Option<slipway_executor::docker::DockerConfig>,
    /// `[runners.custom]` (custom executor).
    pub custom: Option<slipway_executor::CustomConfig>,
}

/// The executors this version runs, and where their jobs run.
pub const EXECUTORS: &[&str] = &["instance", "docker-autoscaler", "shell", "docker", "custom"];

/// Whether `executor` runs jobs on autoscaled instances (else on this machine).
pub fn autoscaled(executor: &str) -> bool {
    matches!(executor, "instance" | "docker-autoscaler")
}

/// Levels the executors of this version can give a job.
pub fn supported_isolation(executor: &str) -> &'static [slipway_executor::Isolation] {
    use slipway_executor::Isolation;
    match executor {
        "instance" => &[Isolation::None, Isolation::Cgroup, Isolation::Docker],
        "docker-autoscaler" | "docker" => &[Isolation::Docker],
        "shell" => &[Isolation::None, Isolation::Cgroup],
        "custom" => &[Isolation::None],
        _ => &[],
    }
}

impl RunnerConfig {
    /// What jobs of this runner may ask for, and get when they ask for nothing; an error
    /// names the key and the problem.
    pub fn isolation_policy(
        &self,
    ) -> Result<slipway_executor::IsolationPolicy, (&'static str, String)> {
        use slipway_executor::Isolation;
        let supported = supported_isolation(&self.executor);
        let allowed: Vec<Isolation> = match &self.allowed_isolation {
            None => supported.to_vec(),
            Some(names) => {
                let mut out = Vec::new();
                for n in names {
                    let level: Isolation = n
                        .parse()
                        .map_err(|e| ("allowed_isolation", format!("{e}")))?;
                    if !supported.contains(&level) {
                        return Err((
                            "allowed_isolation",
                            format!(
                                "the {} executor cannot give a job isolation {level:?}; it supports {}",
                                self.executor,
                                supported
                                    .iter()
                                    .map(|l| l.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        ));
                    }
                    out.push(level);
                }
                out
            }
        };
        let default = match &self.isolation {
            Some(n) => n.parse().map_err(|e| ("isolation", format!("{e}")))?,
            None if matches!(self.executor.as_str(), "docker" | "docker-autoscaler") => {
                Isolation::Docker
            }
            None if self.use_slot_cgroups => Isolation::Cgroup,
            None => Isolation::None,
        };
        if !allowed.contains(&default) {
            return Err((
                "isolation",
                format!(
                    "the default level {:?} is not in allowed_isolation ({})",
                    default.as_str(),
                    allowed
                        .iter()
                        .map(|l| l.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(slipway_executor::IsolationPolicy { allowed, default })
    }

    /// The slot cgroups of the `cgroup` level, from `slot_cgroup_template`.
    pub fn slot_cgroups(&self) -> Result<slipway_executor::cgroup::SlotCgroups, String> {
        let mut c = slipway_executor::cgroup::SlotCgroups::default();
        if let Some(t) = &self.slot_cgroup_template {
            c.template = slipway_cgroups::SlotTemplate::parse(t).map_err(|e| e.to_string())?;
        }
        Ok(c)
    }
}

impl fmt::Debug for RunnerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field(
                "token",
                &if self.token.is_empty() {
                    ""
                } else {
                    "[masked]"
                },
            )
            .field("executor", &self.executor)
            .field("limit", &self.limit)
            .field("request_concurrency", &self.request_concurrency)
            .field("output_limit", &self.output_limit)
            .field("builds_dir", &self.builds_dir)
            .field("allowed_isolation", &self.allowed_isolation)
            .field("isolation", &self.isolation)
            .field("autoscaler", &self.autoscaler)
            .field("docker", &self.docker)
            .field("custom", &self.custom.is_some())
            .finish()
    }
}

/// `[runners.autoscaler]`.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct AutoscalerConfig {
    /// Plugin name or path.
    pub plugin: String,
    /// Slots per instance.
    pub capacity_per_instance: u32,
    /// Jobs per instance before removal; 0 = unlimited.
    pub max_use_count: u32,
    /// Cap on instances; 0 = unlimited.
    pub max_instances: u32,
    /// Delete every instance when the runner stops.
    pub delete_instances_on_shutdown: bool,
    /// How long a job waits for a slot.
    #[serde(with = "duration")]
    pub instance_acquire_timeout: Duration,
    /// Plugin `Update` period.
    #[serde(with = "duration")]
    pub update_interval: Duration,
    /// Plugin `Update` period while changes are expected.
    #[serde(with = "duration")]
    pub update_interval_when_expecting: Duration,
    /// Ask again for a deletion that had no effect after this long.
    #[serde(with = "duration")]
    pub deletion_retry_interval: Duration,
    /// Wait between deletion checks at shutdown.
    #[serde(with = "duration")]
    pub shutdown_deletion_interval: Duration,
    /// Deletion rounds at shutdown before giving up.
    pub shutdown_deletion_retries: u32,
    /// Free-form table passed to the plugin as JSON.
    pub plugin_config: toml::Table,
    /// `[runners.autoscaler.connector_config]`.
    pub connector_config: ConnectorConfigToml,
    /// `[[runners.autoscaler.policy]]`.
    pub policy: Vec<PolicyConfig>,
    /// `[runners.autoscaler.scale_throttle]`.
    pub scale_throttle: ScaleThrottleConfig,
    /// Keep reservations from blocking scale-down (GitLab default: on).
    pub reservation_throttling: bool,
    /// Consecutive failed health checks before an instance is replaced.
    pub failure_threshold: u32,
    /// Run on each new instance through the connector; a failure removes the instance.
    pub instance_ready_command: String,
    /// `[runners.autoscaler.state_storage]`.
    pub state_storage: StateStorageConfig,
    /// `[[runners.autoscaler.shape]]`: instance groups of different sizes (Slipway). Without
    /// any, the section itself is the one group and jobs are placed by slot count.
    pub shape: Vec<ShapeConfig>,
}

/// `[[runners.autoscaler.shape]]`: one instance group, what each instance offers and costs.
/// Keys not set here come from `[runners.autoscaler]`; `plugin_config` is merged over it.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct ShapeConfig {
    /// Name, unique within the runner.
    pub name: String,
    /// CPUs of one instance (`4`, `1.5`, `500m`).
    pub cpu: Option<Amount>,
    /// Memory of one instance (`16GiB`, `512Mi`, bytes).
    pub memory: Option<Amount>,
    /// GPUs of one instance.
    pub gpu: u32,
    /// Relative cost of one instance per hour (default 1).
    pub cost: Option<f64>,
    /// Overrides `capacity_per_instance`.
    pub capacity_per_instance: Option<u32>,
    /// Overrides `max_instances`.
    pub max_instances: Option<u32>,
    /// Overrides `max_use_count`.
    pub max_use_count: Option<u32>,
    /// Merged over the runner's `plugin_config` (e.g. another instance type).
    pub plugin_config: toml::Table,
}

/// A resource amount written as a number or a string with a unit.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Amount {
    /// `4`.
    Int(i64),
    /// `1.5`.
    Float(f64),
    /// `500m`, `16GiB`.
    Text(String),
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Int(v) => write!(f, "{v}"),
            Amount::Float(v) => write!(f, "{v}"),
            Amount::Text(v) => write!(f, "{v}"),
        }
    }
}

impl ShapeConfig {
    /// What one instance offers, or the key and the problem.
    pub fn resources(&self) -> Result<slipway_taskscaler::Resources, (&'static str, String)> {
        use slipway_taskscaler::Resources;
        let cpu = match &self.cpu {
            Some(a) => Resources::parse_cpu(&a.to_string()).map_err(|e| ("cpu", e.to_string()))?,
            None => 0,
        };
        let memory = match &self.memory {
            Some(Amount::Text(t)) => {
                Resources::parse_memory(t).map_err(|e| ("memory", e.to_string()))?
            }
            // A bare number of memory is ambiguous (bytes? GiB?): ask for a unit.
            Some(a) => {
                return Err((
                    "memory",
                    format!("{a}: expected an amount with a unit, such as \"16GiB\" or \"512Mi\""),
                ));
            }
            None => 0,
        };
        Ok(Resources {
            cpu_millis: cpu,
            memory_bytes: memory,
            gpus: self.gpu,
        })
    }
}

/// `[runners.autoscaler.state_storage]`: on by default in Slipway (GitLab: off).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct StateStorageConfig {
    /// Keep instances, use counts and acquisitions across restarts.
    pub enabled: bool,
    /// Directory of the store (default: `.slipway-state` beside config.toml).
    pub dir: Option<String>,
    /// Keep a restored instance that still had acquisitions.
    pub keep_instance_with_acquisitions: bool,
}

impl Default for StateStorageConfig {
    fn default() -> Self {
        StateStorageConfig {
            enabled: true,
            dir: None,
            keep_instance_with_acquisitions: false,
        }
    }
}

impl fmt::Debug for AutoscalerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // plugin_config often holds cloud credentials: show its keys, never its values.
        let keys: Vec<&String> = self.plugin_config.keys().collect();
        f.debug_struct("AutoscalerConfig")
            .field("plugin", &self.plugin)
            .field("capacity_per_instance", &self.capacity_per_instance)
            .field("max_use_count", &self.max_use_count)
            .field("max_instances", &self.max_instances)
            .field("plugin_config_keys", &keys)
            .field("connector_config", &self.connector_config)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Default for AutoscalerConfig {
    fn default() -> Self {
        let d = slipway_taskscaler::Config::default();
        AutoscalerConfig {
            plugin: String::new(),
            capacity_per_instance: 1,
            max_use_count: 0,
            max_instances: 0,
            delete_instances_on_shutdown: false,
            instance_acquire_timeout: d.instance_acquire_timeout,
            update_interval: d.update_interval,
            update_interval_when_expecting: d.update_interval_when_expecting,
            deletion_retry_interval: d.deletion_retry_interval,
            shutdown_deletion_interval: d.shutdown_deletion_interval,
            shutdown_deletion_retries: d.shutdown_deletion_retries,
            plugin_config: toml::Table::new(),
            connector_config: ConnectorConfigToml::default(),
            policy: Vec::new(),
            scale_throttle: ScaleThrottleConfig::default(),
            reservation_throttling: d.reservation_throttling,
            failure_threshold: d.failure_threshold,
            instance_ready_command: String::new(),
            state_storage: StateStorageConfig::default(),
            shape: Vec::new(),
        }
    }
}

/// `[runners.autoscaler.connector_config]`.
#[derive(Clone, Deserialize, Default)]
#[serde(default)]
pub struct ConnectorConfigToml {
    /// `linux`, `windows`, `darwin`.
    pub os: String,
    /// `amd64`, `arm64`.
    pub arch: String,
    /// `ssh`.
    pub protocol: String,
    /// Protocol port.
    pub protocol_port: u16,
    /// Login user.
    pub username: String,
    /// Password. Never printed.
    pub password: String,
    /// Private key file, read by the manager.
    pub key_path: String,
    /// The plugin must not provision credentials.
    pub use_static_credentials: bool,
    /// SSH keepalive.
    #[serde(with = "duration")]
    pub keepalive: Duration,
    /// Dial timeout.
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Dial the external address.
    pub use_external_addr: bool,
}

impl fmt::Debug for ConnectorConfigToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectorConfigToml")
            .field("os", &self.os)
            .field("protocol", &self.protocol)
            .field("username", &self.username)
            .field(
                "password",
                &if self.password.is_empty() {
                    ""
                } else {
                    "[masked]"
                },
            )
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// `[[runners.autoscaler.policy]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct PolicyConfig {
    /// 5-field cron expressions marking when the policy applies.
    pub periods: Vec<String>,
    /// IANA time zone of `periods` (GitLab: the system's; here empty = UTC).
    pub timezone: String,
    /// Target idle slots.
    pub idle_count: u32,
    /// How long an instance may stay idle.
    #[serde(with = "duration")]
    pub idle_time: Duration,
    /// Extra idle capacity as a multiple of in-use capacity.
    pub scale_factor: f64,
    /// Cap on what `scale_factor` yields.
    pub scale_factor_limit: u32,
    /// Request jobs only with confirmed idle capacity (default: `idle_count > 0`).
    pub preemptive_mode: Option<bool>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            periods: vec!["* * * * *".into()],
            timezone: String::new(),
            idle_count: 0,
            idle_time: Duration::ZERO,
            scale_factor: 0.0,
            scale_factor_limit: 0,
            preemptive_mode: None,
        }
    }
}

impl PolicyConfig {
    /// As the taskscaler's policy.
    pub fn to_policy(&self) -> slipway_taskscaler::Policy {
        slipway_taskscaler::Policy {
            periods: self.periods.clone(),
            timezone: self.timezone.clone(),
            idle_count: self.idle_count,
            idle_time: self.idle_time,
            scale_factor: self.scale_factor,
            scale_factor_limit: self.scale_factor_limit,
            preemptive_mode: self.preemptive_mode,
        }
    }
}

/// `[runners.autoscaler.scale_throttle]`.
#[derive(Debug, Clone, Copy, Deserialize, Default)]
#[serde(default)]
pub struct ScaleThrottleConfig {
    /// Creations per second: 0 = 100/s (GitLab's default), -1 = unlimited.
    pub limit: i64,
    /// Bucket size; 0 = `max_instances`, or `limit` when that is unset.
    pub burst: u32,
}

mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    /// Go-style duration strings (`1m`, `20m0s`, `1h30m`) or plain seconds.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a duration such as \"30s\", \"5m\" or \"1h30m\"")
        })? {
            Raw::Secs(s) => Ok(Duration::from_secs(s)),
            Raw::Text(t) => humantime::parse_duration(t.trim()).map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid duration {t:?} ({e}); expected e.g. \"30s\", \"5m\" or \"1h30m\""
                ))
            }),
        }
    }
}

/// A problem in a config file, located by line and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// File name as given.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted key path, e.g. `runners[0].autoscaler.capacity_per_instance`.
    pub key: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: ", self.file, l)?,
            None => write!(f, "{}: ", self.file)?,
        }
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

/// A config that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {file}: {source}")]
    Read {
        /// File name.
        file: String,
        /// Cause.
        source: std::io::Error,
    },
    /// One or more errors; every one is listed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

/// A config with the warnings found while reading it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The settings.
    pub config: Config,
    /// Unknown keys and other things worth a look.
    pub warnings: Vec<Problem>,
}

/// Read and check a config file.
pub async fn load(path: &Path) -> Result<Loaded, ConfigError> {
    let file = path.display().to_string();
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
    parse(&text, &file)
}

/// Parse and check config text; `file` names it in messages.
pub fn parse(text: &str, file: &str) -> Result<Loaded, ConfigError> {
    let doc = toml_edit::Document::parse(text.to_string()).map_err(|e| {
        ConfigError::Invalid(vec![Problem {
            file: file.into(),
            line: e.span().map(|s| line_of(text, s.start)),
            key: String::new(),
            message: format!("not valid TOML: {}", e.message()),
        }])
    })?;
    let locate = |path: &[Seg]| key_line(&doc, text, path);
    let problem = |path: &[Seg], message: String| Problem {
        file: file.into(),
        line: locate(path),
        key: display_path(path),
        message,
    };

    let mut unknown = Vec::new();
    let de = toml::Deserializer::parse(text).map_err(|e| {
        ConfigError::Invalid(vec![Problem {
            file: file.into(),
            line: e.span().map(|s| line_of(text, s.start)),
            key: String::new(),
            message: e.message().to_string(),
        }])
    })?;
    let mut on_unknown = |p: serde_ignored::Path<'_>| unknown.push(segments_of_ignored(&p));
    let ignored = serde_ignored::Deserializer::new(de, &mut on_unknown);
    let config: Config = serde_path_to_error::deserialize(ignored).map_err(|e| {
        let path = segments_of_error(e.path());
        let inner = e.into_inner();
        let line = inner
            .span()
            .map(|s| line_of(text, s.start))
            .or_else(|| locate(&path));
        ConfigError::Invalid(vec![Problem {
            file: file.into(),
            line,
            key: display_path(&path),
            message: inner.message().to_string(),
        }])
    })?;

    let mut warnings: Vec<Problem> = unknown
        .iter()
        .map(|p| problem(p, "unknown key, ignored".into()))
        .collect();
    let mut errors = Vec::new();
    validate(&config, &mut |path: Vec<Seg>, msg: String, fatal: bool| {
        let p = problem(&path, msg);
        if fatal {
            errors.push(p)
        } else {
            warnings.push(p)
        }
    });
    if !errors.is_empty() {
        return Err(ConfigError::Invalid(errors));
    }
    Ok(Loaded { config, warnings })
}

fn validate(cfg: &Config, report: &mut dyn FnMut(Vec<Seg>, String, bool)) {
    let key = |k: &str| Seg::Key(k.to_string());
    if cfg.concurrent == 0 {
        report(vec![key("concurrent")], "must be at least 1".into(), true);
    }
    if cfg.runners.is_empty() {
        report(
            vec![key("runners")],
            "no [[runners]] entry: nothing to run".into(),
            true,
        );
    }
    for (i, r) in cfg.runners.iter().enumerate() {
        let at = |rest: &[&str]| {
            let mut p = vec![key("runners"), Seg::Index(i)];
            p.extend(rest.iter().map(|k| key(k)));
            p
        };
        match r.executor.as_str() {
            "" => report(
                at(&["executor"]),
                format!("missing; expected one of {}", quoted(EXECUTORS)),
                true,
            ),
            e if EXECUTORS.contains(&e) => {}
            other => report(
                at(&["executor"]),
                format!(
                    "executor {other:?} is not supported yet; expected one of {}",
                    quoted(EXECUTORS)
                ),
                true,
            ),
        }
        if !autoscaled(&r.executor)
            && r.autoscaler.is_some()
            && EXECUTORS.contains(&r.executor.as_str())
        {
            report(
                at(&["autoscaler"]),
                format!(
                    "the {} executor runs jobs on this machine; use executor \"instance\" or \"docker-autoscaler\" with [runners.autoscaler]",
                    r.executor
                ),
                true,
            );
        }
        if r.executor == "custom" {
            match &r.custom {
                None => report(
                    at(&["custom"]),
                    "the custom executor needs a [runners.custom] section with run_exec".into(),
                    true,
                ),
                Some(c) => {
                    if let Err(e) = c.validate() {
                        report(at(&["custom", "run_exec"]), e.to_string(), true);
                    }
                }
            }
        }
        if let Some(d) = &r.docker
            && let Err(e) = d.validate()
        {
            report(at(&["docker"]), e.to_string(), true);
        }
        // An unknown executor is reported above; its isolation cannot be judged.
        if !supported_isolation(&r.executor).is_empty()
            && let Err((k, message)) = r.isolation_policy()
        {
            report(at(&[k]), message, true);
        }
        if let Err(message) = r.slot_cgroups() {
            report(at(&["slot_cgroup_template"]), message, true);
        }
        let Some(a) = &r.autoscaler else {
            if autoscaled(&r.executor) {
                report(
                    at(&["autoscaler"]),
                    format!(
                        "the {} executor needs a [runners.autoscaler] section",
                        r.executor
                    ),
                    true,
                );
            }
            continue;
        };
        if a.plugin.trim().is_empty() {
            report(
                at(&["autoscaler", "plugin"]),
                "missing; expected a plugin name or path".into(),
                true,
            );
        }
        if a.capacity_per_instance == 0 {
            report(
                at(&["autoscaler", "capacity_per_instance"]),
                "must be at least 1".into(),
                true,
            );
        }
        if a.update_interval.is_zero() {
            report(
                at(&["autoscaler", "update_interval"]),
                "must be greater than 0".into(),
                true,
            );
        }
        if a.update_interval_when_expecting.is_zero() {
            report(
                at(&["autoscaler", "update_interval_when_expecting"]),
                "must be greater than 0".into(),
                true,
            );
        }
        if !a.connector_config.key_path.is_empty()
            && !Path::new(&a.connector_config.key_path).exists()
        {
            report(
                at(&["autoscaler", "connector_config", "key_path"]),
                format!(
                    "file {:?} does not exist on this machine",
                    a.connector_config.key_path
                ),
                false,
            );
        }
        let policies: Vec<slipway_taskscaler::Policy> =
            a.policy.iter().map(PolicyConfig::to_policy).collect();
        if let Err(e) = slipway_taskscaler::policy::compile(&policies) {
            let index = match &e {
                slipway_taskscaler::policy::PolicyError::Period { index, .. }
                | slipway_taskscaler::policy::PolicyError::Timezone { index, .. } => *index,
            };
            let field = match e {
                slipway_taskscaler::policy::PolicyError::Period { .. } => "periods",
                slipway_taskscaler::policy::PolicyError::Timezone { .. } => "timezone",
            };
            let mut path = at(&["autoscaler", "policy"]);
            path.push(Seg::Index(index));
            path.push(key(field));
            let message = e.to_string();
            let message = message
                .split_once(": ")
                .map_or(message.as_str(), |(_, m)| m)
                .to_string();
            report(path, message, true);
        }
        for (j, p) in a.policy.iter().enumerate() {
            if p.scale_factor < 0.0 || !p.scale_factor.is_finite() {
                let mut path = at(&["autoscaler", "policy"]);
                path.push(Seg::Index(j));
                path.push(key("scale_factor"));
                report(path, "must be a number of 0 or more".into(), true);
            }
        }
        if a.scale_throttle.limit < -1 {
            report(
                at(&["autoscaler", "scale_throttle", "limit"]),
                "must be -1 (unlimited), 0 (default 100/s) or a positive rate".into(),
                true,
            );
        }
        let mut names = std::collections::HashSet::new();
        for (j, shape) in a.shape.iter().enumerate() {
            let at_shape = |k: &str| {
                let mut path = at(&["autoscaler", "shape"]);
                path.push(Seg::Index(j));
                path.push(key(k));
                path
            };
            if shape.name.trim().is_empty() {
                report(
                    at_shape("name"),
                    "missing; every shape needs a name".into(),
                    true,
                );
            } else if !names.insert(shape.name.as_str()) {
                report(
                    at_shape("name"),
                    format!("shape {:?} is named twice", shape.name),
                    true,
                );
            }
            match shape.resources() {
                Err((field, message)) => report(at_shape(field), message, true),
                Ok(r) if r.is_empty() => report(
                    at_shape("cpu"),
                    "a shape must declare what one instance offers: cpu, memory or gpu".into(),
                    true,
                ),
                Ok(_) => {}
            }
            if shape.cost.is_some_and(|c| !c.is_finite() || c <= 0.0) {
                report(at_shape("cost"), "must be a positive number".into(), true);
            }
            if shape.capacity_per_instance == Some(0) {
                report(
                    at_shape("capacity_per_instance"),
                    "must be at least 1".into(),
                    true,
                );
            }
        }
        let limit = u64::from(a.max_instances) * u64::from(a.capacity_per_instance);
        if a.max_instances > 0 && u64::from(cfg.concurrent) > limit {
            report(
                vec![key("concurrent")],
                format!(
                    "larger than max_instances × capacity_per_instance ({limit}) of runner {:?}",
                    r.name
                ),
                false,
            );
        }
    }
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

fn display_path(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn segments_of_ignored(p: &serde_ignored::Path<'_>) -> Vec<Seg> {
    use serde_ignored::Path as P;
    match p {
        P::Root => Vec::new(),
        P::Seq { parent, index } => {
            let mut v = segments_of_ignored(parent);
            v.push(Seg::Index(*index));
            v
        }
        P::Map { parent, key } => {
            let mut v = segments_of_ignored(parent);
            v.push(Seg::Key(key.clone()));
            v
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            segments_of_ignored(parent)
        }
    }
}

fn segments_of_error(p: &serde_path_to_error::Path) -> Vec<Seg> {
    use serde_path_to_error::Segment as S;
    p.iter()
        .filter_map(|s| match s {
            S::Seq { index } => Some(Seg::Index(*index)),
            S::Map { key } => Some(Seg::Key(key.clone())),
            S::Enum { variant } => Some(Seg::Key(variant.clone())),
            S::Unknown => None,
        })
        .collect()
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).map_or(0, |t| t.matches('\n').count()) + 1
}

/// The line where the key at `path` is written (or its nearest written parent).
fn key_line(doc: &toml_edit::Document<String>, text: &str, path: &[Seg]) -> Option<usize> {
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let mut best = None;
    let mut i = 0;
    while i < path.len() {
        let Seg::Key(k) = &path[i] else { return best };
        let (key, item) = table.get_key_value(k)?;
        best = key
            .span()
            .or_else(|| item.span())
            .map(|s| line_of(text, s.start))
            .or(best);
        i += 1;
        match (item, path.get(i)) {
            (toml_edit::Item::ArrayOfTables(arr), Some(Seg::Index(n))) => {
                let t = arr.get(*n)?;
                best = t.span().map(|s| line_of(text, s.start)).or(best);
                table = t;
                i += 1;
            }
            (item, _) => match item.as_table_like() {
                Some(t) => table = t,
                None => return best,
            },
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        match parse(text, "config.toml") {
            Err(ConfigError::Invalid(p)) => p.iter().map(ToString::to_string).collect(),
            Err(e) => vec![e.to_string()],
            Ok(_) => Vec::new(),
        }
    }

    const GOOD: &str = r#"
concurrent = 4

[[runners]]
  name = "local"
  token = "glrt-secret-token"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 2
    max_use_count = 5
    instance_acquire_timeout = "1m"
    [runners.autoscaler.plugin_config]
      provisioning_delay = "1s"
    [[runners.autoscaler.policy]]
      idle_count = 1
      idle_time = "20m0s"
"#;

    #[test]
    fn reads_gitlab_style_config() {
        let loaded = parse(GOOD, "config.toml").expect("valid");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let r = &loaded.config.runners[0];
        let a = r.autoscaler.as_ref().expect("autoscaler");
        assert_eq!(a.capacity_per_instance, 2);
        assert_eq!(a.instance_acquire_timeout, Duration::from_secs(60));
        assert_eq!(a.policy[0].idle_time, Duration::from_secs(1200));
        assert_eq!(a.plugin_config["provisioning_delay"].as_str(), Some("1s"));
        assert!(
            !format!("{r:?}").contains("glrt-secret"),
            "token must not be printed"
        );
    }

    #[test]
    fn wrong_type_names_file_line_and_key() {
        let text = GOOD.replace(
            "capacity_per_instance = 2",
            "capacity_per_instance = \"two\"",
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("config.toml:10: runners[0].autoscaler.capacity_per_instance:"),
            "{e:?}"
        );
    }

    #[test]
    fn bad_duration_is_an_error_with_line() {
        let text = GOOD.replace("idle_time = \"20m0s\"", "idle_time = \"soon\"");
        let e = errors(&text);
        assert!(
            e[0].starts_with("config.toml:18: runners[0].autoscaler.policy[0].idle_time:"),
            "{e:?}"
        );
        assert!(e[0].contains("expected e.g."), "{e:?}");
    }

    #[test]
    fn wrong_values_are_all_reported() {
        let text = GOOD
            .replace("capacity_per_instance = 2", "capacity_per_instance = 0")
            .replace("executor = \"instance\"", "executor = \"docker+machine\"");
        let e = errors(&text);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e.iter()
                .any(|l| l.starts_with("config.toml:7: runners[0].executor:")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|l| l.starts_with(
                "config.toml:10: runners[0].autoscaler.capacity_per_instance: must be at least 1"
            )),
            "{e:?}"
        );
    }

    #[test]
    fn bad_policy_period_names_policy_line_and_value() {
        let text = GOOD.replace(
            "idle_count = 1\n",
            "idle_count = 1\n      periods = [\"* 25 * * *\"]\n",
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("config.toml:18: runners[0].autoscaler.policy[0].periods: "),
            "{e:?}"
        );
        assert!(e[0].contains("\"* 25 * * *\""), "{e:?}");
    }

    #[test]
    fn unknown_key_is_a_warning_with_line() {
        let text = GOOD.replace(
            "max_use_count = 5",
            "max_use_count = 5\n    frobnicate = true",
        );
        let loaded = parse(&text, "config.toml").expect("still valid");
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            w,
            vec!["config.toml:13: runners[0].autoscaler.frobnicate: unknown key, ignored"]
        );
    }

    #[test]
    fn broken_toml_is_an_error_with_line() {
        let e = errors("concurrent = 4\n[[runners]\n");
        assert!(e[0].starts_with("config.toml:2:"), "{e:?}");
    }

    #[test]
    fn embedded_config_is_valid() {
        let loaded = parse(EMBEDDED, "embedded").expect("embedded config");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    }

    #[test]
    fn shapes_declare_resources_and_override_keys() {
        let text = format!(
            "{GOOD}{}",
            r#"
    [[runners.autoscaler.shape]]
      name = "small"
      cpu = 2
      memory = "4GiB"
      cost = 1.0
    [[runners.autoscaler.shape]]
      name = "gpu"
      cpu = "8"
      memory = "32GiB"
      gpu = 1
      cost = 6.5
      capacity_per_instance = 1
      [runners.autoscaler.shape.plugin_config]
        instance_type = "g5.2xlarge"
"#
        );
        let loaded = parse(&text, "config.toml").expect("valid");
        let a = loaded.config.runners[0]
            .autoscaler
            .as_ref()
            .expect("autoscaler");
        assert_eq!(a.shape.len(), 2);
        let gpu = a.shape[1].resources().expect("resources");
        assert_eq!(gpu.cpu_millis, 8000);
        assert_eq!(gpu.memory_bytes, 32 << 30);
        assert_eq!(gpu.gpus, 1);
        assert_eq!(a.shape[1].capacity_per_instance, Some(1));
        assert_eq!(
            a.shape[1].plugin_config["instance_type"].as_str(),
            Some("g5.2xlarge")
        );
    }

    #[test]
    fn bad_shapes_name_the_shape_key_and_line() {
        let text = format!(
            "{GOOD}{}",
            r#"
    [[runners.autoscaler.shape]]
      name = "a"
      cpu = "lots"
    [[runners.autoscaler.shape]]
      name = "a"
      memory = 16
"#
        );
        let e = errors(&text);
        assert!(
            e.iter().any(|l| l.starts_with(
                "config.toml:22: runners[0].autoscaler.shape[0].cpu: cpu \"lots\": expected"
            )),
            "{e:?}"
        );
        assert!(
            e.iter().any(|l| l.starts_with(
                "config.toml:24: runners[0].autoscaler.shape[1].name: shape \"a\" is named twice"
            )),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|l| l.contains("shape[1].memory: 16: expected an amount with a unit")),
            "{e:?}"
        );
    }
}
