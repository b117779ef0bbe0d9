//! `config.toml`, read as GitLab Runner writes it: the keys Slipway honours so far.
//!
//! Every problem is reported in one pass: a wrong type or value is an error naming file, line
//! and key; an unknown key, or a key Slipway reads but does not act on, is a warning. Secrets
//! (`token`, `password`, `[runners.cache.s3]` and the like) never appear in a message.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use slipway_executor::NestingConfig;

/// The configuration Slipway uses when none is given (`slipway exec` without `-c`).
pub const EMBEDDED: &str = include_str!("embedded.toml");

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Jobs running at once across all runners.
    pub concurrent: u32,
    /// Log level (`debug`, `info`, `warn`, `error`, `fatal`, `panic`).
    pub log_level: Option<String>,
    /// Log format (`runner`, `text`, `json`).
    pub log_format: Option<String>,
    /// `host:port` serving `/metrics` and `/healthz` (`slipway run`).
    pub listen_address: Option<String>,
    /// Seconds to wait for jobs at shutdown.
    pub shutdown_timeout: u64,
    /// Seconds between job requests that found no job (GitLab Runner's default: 3; 0 = 3).
    pub check_interval: u64,
    /// GitLab Runner's HTTP keep-alive bound (`15m0s`); accepted, Slipway's client has its own.
    pub connection_max_age: Option<String>,
    /// Sentry DSN; accepted with a warning (Slipway does not report to Sentry). Never printed.
    pub sentry_dsn: Option<String>,
    /// `[session_server]` (interactive web terminal); accepted, not served.
    pub session_server: Option<toml::Table>,
    /// `[status_page]`: the status page `slipway run` serves on `listen_address`.
    pub status_page: StatusPageConfig,
    /// The `[[runners]]` entries.
    pub runners: Vec<RunnerConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            concurrent: 1,
            log_level: None,
            log_format: None,
            listen_address: None,
            shutdown_timeout: 30,
            check_interval: 3,
            connection_max_age: None,
            sentry_dsn: None,
            session_server: None,
            status_page: StatusPageConfig::default(),
            runners: Vec::new(),
        }
    }
}

/// `[status_page]`: the page (`/`) and its JSON (`/api/v1/status`) beside `/metrics`.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct StatusPageConfig {
    /// Serve the page at all (default true).
    pub enabled: bool,
    /// When set, the page and its JSON need it (Bearer token, Basic password or `?token=`);
    /// `/metrics` and `/healthz` stay open, as GitLab Runner's. Never printed.
    pub token: Option<String>,
    /// Time between history samples (Go duration, default `15s`).
    pub history_interval: String,
    /// How much history the charts keep (Go duration; default `6h`, or what 10,000 samples
    /// cover when `history_interval` is short).
    pub history: Option<String>,
}

impl Default for StatusPageConfig {
    fn default() -> Self {
        StatusPageConfig {
            enabled: true,
            token: None,
            history_interval: "15s".into(),
            history: None,
        }
    }
}

impl std::fmt::Debug for StatusPageConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusPageConfig")
            .field("enabled", &self.enabled)
            .field("token", &self.token.as_ref().map(|_| "[MASKED]"))
            .field("history_interval", &self.history_interval)
            .field("history", &self.history)
            .finish()
    }
}

/// Most samples the status page's history may keep (every answer carries them all).
pub const MAX_HISTORY_SAMPLES: f64 = 10_000.0;

impl StatusPageConfig {
    /// The sampling interval and the span kept (checked by validation: defaults on error).
    pub fn history_durations(&self) -> (std::time::Duration, std::time::Duration) {
        let parse = |s: &str, d: u64| {
            humantime::parse_duration(s.trim())
                .ok()
                .filter(|d| !d.is_zero())
                .unwrap_or(std::time::Duration::from_secs(d))
        };
        let every = parse(&self.history_interval, 15);
        let span = match &self.history {
            Some(h) => parse(h, 6 * 3600),
            None => {
                std::time::Duration::from_secs(6 * 3600).min(every.mul_f64(MAX_HISTORY_SAMPLES))
            }
        };
        (every, span)
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
    /// The runner's ID in GitLab (written by `register`; 0 when unknown).
    pub id: u64,
    /// Runner token. Never printed.
    pub token: String,
    /// When the token was obtained (RFC 3339, as GitLab Runner writes it).
    #[serde(deserialize_with = "datetime_text::deserialize")]
    pub token_obtained_at: Option<String>,
    /// When the token expires (RFC 3339; GitLab writes `0001-01-01T00:00:00Z` for never).
    #[serde(deserialize_with = "datetime_text::deserialize")]
    pub token_expires_at: Option<String>,
    /// Executor name.
    pub executor: String,
    /// Shell of job scripts: `bash` or `sh` (default: bash).
    pub shell: Option<String>,
    /// Jobs this runner runs at once; 0 = no limit beyond `concurrent`.
    pub limit: u32,
    /// `jobs/request` calls in flight at once (GitLab Runner's default: 1; 0 = 1).
    pub request_concurrency: u32,
    /// Largest trace kept, in KiB (GitLab Runner's default: 4096; 0 = 4096).
    pub output_limit: u64,
    /// Builds root on the instance.
    pub builds_dir: Option<String>,
    /// Local cache directory of jobs.
    pub cache_dir: Option<String>,
    /// Extra job variables, `KEY=VALUE` each.
    pub environment: Vec<String>,
    /// Script run before fetching sources (parsed; not run yet: a warning says so).
    pub pre_get_sources_script: Option<String>,
    /// Script run after fetching sources (parsed; not run yet: a warning says so).
    pub post_get_sources_script: Option<String>,
    /// Script run before each job's build script.
    pub pre_build_script: Option<String>,
    /// Script run after each job's build script.
    pub post_build_script: Option<String>,
    /// CA bundle for GitLab's certificate.
    #[serde(rename = "tls-ca-file")]
    pub tls_ca_file: Option<String>,
    /// Client certificate towards GitLab.
    #[serde(rename = "tls-cert-file")]
    pub tls_cert_file: Option<String>,
    /// Client key towards GitLab.
    #[serde(rename = "tls-key-file")]
    pub tls_key_file: Option<String>,
    /// Ignore `CI_DEBUG_TRACE` in jobs.
    pub debug_trace_disabled: bool,
    /// URL jobs clone from instead of `url`.
    pub clone_url: Option<String>,
    /// `[runners.referees]`; accepted, not used (a warning says so).
    pub referees: Option<toml::Table>,
    /// Failed requests before GitLab Runner pauses a runner; accepted, not used.
    pub unhealthy_requests_limit: Option<i64>,
    /// How long GitLab Runner pauses an unhealthy runner; accepted, not used.
    pub unhealthy_interval: Option<String>,
    /// `[runners.feature_flags]`: GitLab Runner's `FF_*` switches.
    pub feature_flags: BTreeMap<String, bool>,
    /// `[runners.custom_build_dir]`.
    pub custom_build_dir: Option<CustomBuildDirConfig>,
    /// `[runners.cache]`.
    pub cache: Option<CacheConfig>,
    /// Isolation levels jobs may ask for (`SLIPWAY_ISOLATION`); default: what the executor
    /// supports.
    pub allowed_isolation: Option<Vec<String>>,
    /// Level of a job that asks for none (default `none`, or `cgroup` with `use_slot_cgroups`).
    pub isolation: Option<String>,
    /// GitLab's switch: every job in its slot's cgroup (the `cgroup` level by default).
    pub use_slot_cgroups: bool,
    /// Slot cgroup path; `${slot}` (GitLab) or `{slot}` is the slot number, `{instance}` the
    /// instance's id (for instances sharing one kernel, as the local plugin's do).
    pub slot_cgroup_template: Option<String>,
    /// `[runners.autoscaler]`.
    pub autoscaler: Option<AutoscalerConfig>,
    /// `[runners.instance]` (instance executor).
    pub instance: Option<InstanceConfig>,
    /// `[runners.docker]` (docker and docker-autoscaler executors, and the `docker` level).
    pub docker: Option<slipway_executor::docker::DockerConfig>,
    /// `[runners.custom]` (custom executor).
    pub custom: Option<slipway_executor::CustomConfig>,
    /// `[runners.plugin]` (plugin executor).
    pub plugin: Option<ExecutorPluginConfig>,
}

/// `[runners.plugin]`: the executor plugin a `plugin` runner drives.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct ExecutorPluginConfig {
    /// `executor-plugin-<name>` (in `--plugin-dir`, next to slipway, on `PATH`) or a path.
    pub name: String,
    /// `[runners.plugin.config]`, handed to the plugin's `Init` as JSON. Never printed.
    pub config: toml::Table,
    /// How long the plugin may take to prepare a job's environment.
    #[serde(with = "duration")]
    pub prepare_timeout: Duration,
    /// How long the plugin may take to remove it.
    #[serde(with = "duration")]
    pub cleanup_timeout: Duration,
}

impl Default for ExecutorPluginConfig {
    fn default() -> Self {
        ExecutorPluginConfig {
            name: String::new(),
            config: toml::Table::new(),
            prepare_timeout: slipway_executor::plugin::DEFAULT_PREPARE_TIMEOUT,
            cleanup_timeout: slipway_executor::plugin::DEFAULT_CLEANUP_TIMEOUT,
        }
    }
}

impl fmt::Debug for ExecutorPluginConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The plugin's config may hold credentials: keys only.
        f.debug_struct("ExecutorPluginConfig")
            .field("name", &self.name)
            .field("config_keys", &self.config.keys().collect::<Vec<_>>())
            .field("prepare_timeout", &self.prepare_timeout)
            .field("cleanup_timeout", &self.cleanup_timeout)
            .finish()
    }
}

/// `[runners.custom_build_dir]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct CustomBuildDirConfig {
    /// Let jobs choose their build directory (`GIT_CLONE_PATH`); not supported yet.
    pub enabled: bool,
}

/// `[runners.cache]`, with GitLab's capitalised keys.
#[derive(Clone, Deserialize, Default)]
#[serde(default)]
pub struct CacheConfig {
    /// `Type`: empty (local), `s3`, `gcs` or `azure`.
    #[serde(rename = "Type")]
    pub cache_type: String,
    /// `Path`: prefix of cache keys in the bucket.
    #[serde(rename = "Path")]
    pub path: String,
    /// `Shared`: one cache for all runners.
    #[serde(rename = "Shared")]
    pub shared: bool,
    /// `MaxUploadedArchiveSize` in bytes; 0 = unlimited.
    #[serde(rename = "MaxUploadedArchiveSize")]
    pub max_uploaded_archive_size: i64,
    /// `[runners.cache.s3]`, free-form (holds credentials: never printed).
    pub s3: Option<toml::Table>,
    /// `[runners.cache.gcs]`, free-form (holds credentials: never printed).
    pub gcs: Option<toml::Table>,
    /// `[runners.cache.azure]`, free-form (holds credentials: never printed).
    pub azure: Option<toml::Table>,
}

impl fmt::Debug for CacheConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The provider tables hold access keys: name their keys, never their values.
        let keys =
            |t: &Option<toml::Table>| t.as_ref().map(|t| t.keys().cloned().collect::<Vec<_>>());
        f.debug_struct("CacheConfig")
            .field("cache_type", &self.cache_type)
            .field("path", &self.path)
            .field("shared", &self.shared)
            .field("max_uploaded_archive_size", &self.max_uploaded_archive_size)
            .field("s3_keys", &keys(&self.s3))
            .field("gcs_keys", &keys(&self.gcs))
            .field("azure_keys", &keys(&self.azure))
            .finish()
    }
}

/// `[runners.instance]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct InstanceConfig {
    /// VM images jobs may name with VM isolation (`["*"]`: all).
    pub allowed_images: Vec<String>,
    /// One build directory for all jobs (honoured with VM isolation or `max_use_count = 1`).
    pub use_common_build_dir: bool,
}

/// `[runners.autoscaler.vm_isolation]`: a nesting VM per job (the `microvm` and `vm` levels of
/// the `instance` executor).
#[derive(Clone, Deserialize, Default)]
#[serde(default)]
pub struct VmIsolationConfig {
    /// Create a nesting VM per job.
    pub enabled: bool,
    /// Nesting daemon address as seen from the instance.
    pub nesting_host: String,
    /// Table sent as JSON to the nesting daemon's `Init`.
    pub nesting_config: toml::Table,
    /// VM image of jobs that name none.
    pub image: String,
    /// Slipway: VM image of `microvm` jobs that name none (default: `image`).
    pub microvm_image: String,
    /// Slipway: VM image of `vm` jobs that name none (default: `image`).
    pub vm_image: String,
    /// Slipway: builds directory inside VMs.
    pub builds_dir: String,
    /// `[runners.autoscaler.vm_isolation.connector_config]`: how to reach the nested VM.
    pub connector_config: ConnectorConfigToml,
}

impl fmt::Debug for VmIsolationConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmIsolationConfig")
            .field("enabled", &self.enabled)
            .field("nesting_host", &self.nesting_host)
            .field("image", &self.image)
            .field("connector_config", &self.connector_config)
            .finish_non_exhaustive()
    }
}

/// The executors this version runs, and where their jobs run.
pub const EXECUTORS: &[&str] = &[
    "instance",
    "docker-autoscaler",
    "shell",
    "docker",
    "custom",
    "plugin",
];

/// Whether `executor` runs jobs on autoscaled instances (else on this machine).
pub fn autoscaled(executor: &str) -> bool {
    matches!(executor, "instance" | "docker-autoscaler")
}

impl RunnerConfig {
    /// Whether this runner's jobs run on autoscaled instances: the `instance` and
    /// `docker-autoscaler` executors, and the `plugin` executor with `[runners.autoscaler]`.
    pub fn on_instances(&self) -> bool {
        autoscaled(&self.executor) || (self.executor == "plugin" && self.autoscaler.is_some())
    }
}

/// Levels the executors of this version can give a job.
pub fn supported_isolation(executor: &str) -> &'static [slipway_executor::Isolation] {
    use slipway_executor::Isolation;
    match executor {
        "instance" => &[
            Isolation::None,
            Isolation::Cgroup,
            Isolation::Docker,
            Isolation::Instance,
        ],
        "docker-autoscaler" | "docker" => &[Isolation::Docker],
        "shell" => &[Isolation::None, Isolation::Cgroup],
        "custom" => &[Isolation::None],
        // The plugin's own levels are checked against what its Init declares.
        "plugin" => &[Isolation::None],
        _ => &[],
    }
}

impl RunnerConfig {
    /// The executor's settings for the `microvm` and `vm` levels, when `vm_isolation` is
    /// enabled.
    pub fn nesting_config(&self) -> Option<NestingConfig> {
        let v = self
            .autoscaler
            .as_ref()
            .and_then(|a| a.vm_isolation.as_ref())
            .filter(|v| v.enabled)?;
        let pick = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        Some(NestingConfig {
            socket: v
                .nesting_host
                .strip_prefix("unix://")
                .unwrap_or(&v.nesting_host)
                .to_string(),
            init_config: serde_json::to_vec(&v.nesting_config).unwrap_or_else(|_| b"{}".to_vec()),
            image: pick(&v.image),
            microvm_image: pick(&v.microvm_image),
            vm_image: pick(&v.vm_image),
            allowed_images: self
                .instance
                .as_ref()
                .map(|i| i.allowed_images.clone())
                .unwrap_or_default(),
            builds_dir: pick(&v.builds_dir).unwrap_or_else(|| "/work/builds".into()),
            cache_dir: "/work/cache".into(),
        })
    }

    /// What jobs of this runner may ask for, and get when they ask for nothing; an error
    /// names the key and the problem.
    pub fn isolation_policy(
        &self,
    ) -> Result<slipway_executor::IsolationPolicy, (&'static str, String)> {
        use slipway_executor::Isolation;
        if self.executor == "plugin" {
            // allowed_isolation and isolation name the plugin's levels, checked against what
            // its Init declares when the runner starts; its jobs take ordinary slots.
            return Ok(slipway_executor::IsolationPolicy {
                allowed: vec![Isolation::None],
                default: Isolation::None,
            });
        }
        let mut supported = supported_isolation(&self.executor).to_vec();
        if self.executor == "instance" && self.nesting_config().is_some() {
            supported.extend([Isolation::Microvm, Isolation::Vm]);
        }
        let supported = supported.as_slice();
        let allowed: Vec<Isolation> = match &self.allowed_isolation {
            // A whole instance per job costs a machine per job: only when the runner says so.
            None => supported
                .iter()
                .copied()
                .filter(|l| *l != Isolation::Instance)
                .collect(),
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
            // GitLab's vm_isolation puts every job in a VM.
            None if self.executor == "instance" && self.nesting_config().is_some() => {
                Isolation::Microvm
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
            .field("id", &self.id)
            .field("executor", &self.executor)
            .field("shell", &self.shell)
            .field("limit", &self.limit)
            .field("request_concurrency", &self.request_concurrency)
            .field("output_limit", &self.output_limit)
            .field("builds_dir", &self.builds_dir)
            .field("cache_dir", &self.cache_dir)
            // Values often hold credentials: show the variable names only.
            .field(
                "environment_keys",
                &self
                    .environment
                    .iter()
                    .map(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k))
                    .collect::<Vec<_>>(),
            )
            .field("allowed_isolation", &self.allowed_isolation)
            .field("isolation", &self.isolation)
            .field("cache", &self.cache)
            .field("autoscaler", &self.autoscaler)
            .field("instance", &self.instance)
            .field("docker", &self.docker)
            .field("custom", &self.custom.is_some())
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
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
    /// `[runners.autoscaler.vm_isolation]`.
    pub vm_isolation: Option<VmIsolationConfig>,
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
            vm_isolation: None,
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

/// GitLab Runner writes token dates as TOML datetimes (`0001-01-01T00:00:00Z`); strings in
/// RFC 3339 are taken too. Either is kept as its RFC 3339 text.
mod datetime_text {
    use std::fmt;

    use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = String;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a date-time such as 2024-01-01T00:00:00Z")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
                s.trim()
                    .parse::<toml::value::Datetime>()
                    .map(|d| d.to_string())
                    .map_err(|_| {
                        E::custom(format!(
                            "invalid date-time {s:?}; expected e.g. 2024-01-01T00:00:00Z"
                        ))
                    })
            }
            // The TOML text deserializer hands a datetime over as a one-key map.
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<String, A::Error> {
                toml::value::Datetime::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|d| d.to_string())
            }
        }
        d.deserialize_any(V).map(Some)
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

/// The manager's state directory: `.slipway-state` beside `config` (the taskscaler stores,
/// the `system_id`, the GitLab sources' outboxes).
pub fn state_dir(config: &Path) -> PathBuf {
    config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join(".slipway-state")
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

/// Parse and check config text; `file` names it in messages. Fails with every error found.
pub fn parse(text: &str, file: &str) -> Result<Loaded, ConfigError> {
    let checked = check(text, file, &CheckOptions::default());
    match checked.config {
        Some(config) if checked.errors.is_empty() => Ok(Loaded {
            config,
            warnings: checked.warnings,
        }),
        _ => Err(ConfigError::Invalid(checked.errors)),
    }
}

/// What [`check`] looks at beyond the file itself.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Look each runner's fleeting plugin up as `slipway run` would, warning when it is missing.
    pub plugins: bool,
    /// Directory searched first for plugins (`--plugin-dir`).
    pub plugin_dir: Option<PathBuf>,
}

/// Everything [`check`] found.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The settings as far as they could be read (`None` when the file is not TOML); keys of
    /// the wrong type are left at their defaults.
    pub config: Option<Config>,
    /// Wrong types and values, in file order.
    pub errors: Vec<Problem>,
    /// Unknown keys and other things worth a look, in file order.
    pub warnings: Vec<Problem>,
}

/// Bound on the re-reads of a file with wrong types: each one drops one offending key.
const MAX_TYPE_ERRORS: usize = 200;

/// Check config text and report every problem: each key of the wrong type is recorded and
/// dropped and the rest read again, so one bad key does not hide the others.
pub fn check(text: &str, file: &str, opts: &CheckOptions) -> Checked {
    let not_toml = |line: Option<usize>, message: String| Checked {
        config: None,
        errors: vec![Problem {
            file: file.into(),
            line,
            key: String::new(),
            message,
        }],
        warnings: Vec::new(),
    };
    let doc = match toml_edit::Document::parse(text.to_string()) {
        Ok(d) => d,
        Err(e) => {
            return not_toml(
                e.span().map(|s| line_of(text, s.start)),
                format!("not valid TOML: {}", e.message()),
            );
        }
    };
    let mut table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            return not_toml(
                e.span().map(|s| line_of(text, s.start)),
                format!("not valid TOML: {}", e.message()),
            );
        }
    };
    let secrets = secrets_of(&table);
    let problem = |path: &[Seg], message: String| Problem {
        file: file.into(),
        line: key_line(&doc, text, path),
        key: display_path(path),
        message: mask(&message, &secrets),
    };

    let mut unknown: Vec<Vec<Seg>> = Vec::new();
    let mut wrong: Vec<(Vec<Seg>, String)> = Vec::new();
    let config = loop {
        let mut seen = Vec::new();
        let result = {
            let mut on_unknown = |p: serde_ignored::Path<'_>| seen.push(segments_of_ignored(&p));
            let ignored = serde_ignored::Deserializer::new(
                toml::Value::Table(table.clone()),
                &mut on_unknown,
            );
            serde_path_to_error::deserialize::<_, Config>(ignored)
        };
        for p in seen {
            if !unknown.contains(&p) {
                unknown.push(p);
            }
        }
        match result {
            Ok(c) => break Some(c),
            Err(e) => {
                let path = segments_of_error(e.path());
                let message = e.into_inner().message().to_string();
                // A value that may be a secret is not quoted back, whatever its type.
                let message = if is_secret_path(&path) {
                    without_value(&message)
                } else {
                    message
                };
                let removed = remove_key(&mut table, &path);
                wrong.push((path, message));
                if !removed || wrong.len() >= MAX_TYPE_ERRORS {
                    break None;
                }
            }
        }
    };

    let mut errors: Vec<Problem> = wrong.iter().map(|(p, m)| problem(p, m.clone())).collect();
    let mut warnings: Vec<Problem> = unknown
        .iter()
        .map(|p| problem(p, "unknown key, ignored".into()))
        .collect();
    if let Some(cfg) = &config {
        // A dropped key reads as its default: what validation says about it is noise.
        let dropped: Vec<Vec<Seg>> = wrong.iter().map(|(p, _)| trim_index(p)).collect();
        let mut report = |path: Vec<Seg>, msg: String, fatal: bool| {
            if dropped.iter().any(|d| path.starts_with(d)) {
                return;
            }
            let p = problem(&path, msg);
            if fatal {
                errors.push(p)
            } else {
                warnings.push(p)
            }
        };
        validate(cfg, &mut report);
        if opts.plugins {
            check_plugins(cfg, opts.plugin_dir.as_deref(), &mut report);
        }
    }
    // Stable: problems on one line keep the order they were found in.
    let order = |p: &Problem| p.line.unwrap_or(usize::MAX);
    errors.sort_by_key(order);
    warnings.sort_by_key(order);
    Checked {
        config,
        errors,
        warnings,
    }
}

/// `path` without trailing array indices: the key that holds the offending element.
fn trim_index(path: &[Seg]) -> Vec<Seg> {
    let mut p = path.to_vec();
    while matches!(p.last(), Some(Seg::Index(_))) {
        p.pop();
    }
    p
}

/// Drop the key at `path` (a bad array element drops its whole array); false if not found.
fn remove_key(table: &mut toml::Table, path: &[Seg]) -> bool {
    let path = trim_index(path);
    let Some((Seg::Key(last), parents)) = path.split_last() else {
        return false;
    };
    let mut cur = table;
    let mut segs = parents.iter().peekable();
    while let Some(seg) = segs.next() {
        let Seg::Key(k) = seg else { return false };
        let mut value = match cur.get_mut(k) {
            Some(v) => v,
            None => return false,
        };
        while let Some(Seg::Index(i)) = segs.peek() {
            value = match value {
                toml::Value::Array(a) => match a.get_mut(*i) {
                    Some(v) => v,
                    None => return false,
                },
                _ => return false,
            };
            segs.next();
        }
        cur = match value {
            toml::Value::Table(t) => t,
            _ => return false,
        };
    }
    cur.remove(last).is_some()
}

/// Whether a key of this name holds a secret.
fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    // token_obtained_at / token_expires_at are dates, not secrets.
    !k.ends_with("_at")
        && [
            "token",
            "password",
            "secret",
            "sentry_dsn",
            "accesskey",
            "accountkey",
        ]
        .iter()
        .any(|s| k.contains(s))
}

/// Whether the value at `path` may be a secret: a secret-named key, anything in a distributed
/// cache's provider table or a plugin's config, an `environment` entry.
fn is_secret_path(path: &[Seg]) -> bool {
    let keys: Vec<&str> = path
        .iter()
        .filter_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
        .collect();
    keys.iter().any(|k| is_secret_key(k))
        || keys
            .iter()
            .any(|k| matches!(*k, "environment" | "plugin_config" | "nesting_config"))
        || keys
            .windows(2)
            .any(|w| w[0] == "cache" && matches!(w[1], "s3" | "gcs" | "azure"))
}

/// Prefixes of GitLab's tokens (runner, registration, job, personal access).
const GITLAB_TOKEN_PREFIXES: &[&str] = &["glrt-", "glrtr-", "GR1348941", "glcbt-", "glpat-"];

/// Every secret value in the file, to be masked wherever a message might quote it.
fn secrets_of(table: &toml::Table) -> Vec<String> {
    fn walk(v: &toml::Value, parent: &str, secret: bool, out: &mut Vec<String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let s = secret
                        || is_secret_key(k)
                        || (parent == "cache" && matches!(k.as_str(), "s3" | "gcs" | "azure"));
                    walk(v, k, s, out);
                }
            }
            toml::Value::Array(a) => {
                for v in a {
                    if parent == "environment"
                        && let toml::Value::String(e) = v
                        && let Some((_, value)) = e.split_once('=')
                    {
                        // Short values ("1", "true") are rarely secrets and would garble text.
                        if value.len() >= 8 {
                            out.push(value.to_string());
                        }
                    }
                    walk(v, parent, secret, out);
                }
            }
            toml::Value::String(s) if secret && s.len() >= 4 => out.push(s.clone()),
            // A GitLab token pasted under the wrong key is still a token.
            toml::Value::String(s) if GITLAB_TOKEN_PREFIXES.iter().any(|p| s.starts_with(p)) => {
                out.push(s.clone())
            }
            toml::Value::Integer(_) | toml::Value::Float(_) if secret => {
                let s = v.to_string();
                if s.len() >= 4 {
                    out.push(s);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&toml::Value::Table(table.clone()), "", false, &mut out);
    // Longest first, so a secret containing another is masked whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

fn mask(message: &str, secrets: &[String]) -> String {
    let mut m = message.to_string();
    for s in secrets {
        if m.contains(s.as_str()) {
            m = m.replace(s.as_str(), "[MASKED]");
        }
    }
    m
}

/// A type error's message without the value it quotes.
fn without_value(message: &str) -> String {
    match message.find(", expected ") {
        Some(i) => format!("invalid type (value not shown){}", &message[i..]),
        None => "invalid value (not shown: this key may hold a secret)".into(),
    }
}

/// Warn about runners whose fleeting plugin this machine does not have.
fn check_plugins(
    cfg: &Config,
    plugin_dir: Option<&Path>,
    report: &mut dyn FnMut(Vec<Seg>, String, bool),
) {
    for (i, r) in cfg.runners.iter().enumerate() {
        let Some(a) = &r.autoscaler else { continue };
        let reference = a.plugin.trim();
        if reference.is_empty() {
            continue;
        }
        let path = vec![
            Seg::Key("runners".into()),
            Seg::Index(i),
            Seg::Key("autoscaler".into()),
            Seg::Key("plugin".into()),
        ];
        if slipway_fleeting::host::find_plugin(reference, plugin_dir).is_err() {
            let message = match slipway_fleeting::oci::Reference::parse(reference) {
                Some(r) if !reference.starts_with("./") => format!(
                    "{reference:?} is not installed here (slipway looks where `gitlab-runner \
                     fleeting install` puts plugins, then for {}{} in --plugin-dir, next to \
                     slipway and on PATH)",
                    slipway_fleeting::host::PLUGIN_PREFIX,
                    r.name
                ),
                _ => format!("{reference:?} does not exist or is not executable on this machine"),
            };
            report(path, message, false);
        }
    }
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
    validate_global(cfg, report);
    for (i, r) in cfg.runners.iter().enumerate() {
        let at = |rest: &[&str]| {
            let mut p = vec![key("runners"), Seg::Index(i)];
            p.extend(rest.iter().map(|k| key(k)));
            p
        };
        validate_gitlab_keys(r, &at, report);
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
        if !r.on_instances() && r.autoscaler.is_some() && EXECUTORS.contains(&r.executor.as_str()) {
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
        if r.executor == "plugin" && r.plugin.as_ref().is_none_or(|p| p.name.trim().is_empty()) {
            report(
                at(&["plugin", "name"]),
                "the plugin executor needs [runners.plugin] name = \"<plugin>\" (executor-plugin-<plugin> in --plugin-dir, next to slipway or on PATH, or a path)".into(),
                true,
            );
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
        if let Some(v) = &a.vm_isolation {
            if v.enabled && r.executor != "instance" {
                report(
                    at(&["autoscaler", "vm_isolation", "enabled"]),
                    format!(
                        "VM isolation is supported with the instance executor only; {} jobs run without a VM",
                        r.executor
                    ),
                    false,
                );
            }
            if v.enabled
                && !v.nesting_host.starts_with("unix://")
                && !v.nesting_host.starts_with('/')
            {
                report(
                    at(&["autoscaler", "vm_isolation", "nesting_host"]),
                    format!(
                        "expected unix:///path/to/nesting.sock on the instance, got {:?}",
                        v.nesting_host
                    ),
                    true,
                );
            }
            if let Some(n) = r.nesting_config() {
                if let Err(e) = slipway_nesting::config::Config::parse(&n.init_config) {
                    report(
                        at(&["autoscaler", "vm_isolation", "nesting_config"]),
                        e,
                        true,
                    );
                }
                if !v.connector_config.username.is_empty()
                    || !v.connector_config.key_path.is_empty()
                {
                    report(
                        at(&["autoscaler", "vm_isolation", "connector_config"]),
                        "not used: Slipway reaches a VM through its guest agent over the instance's connection, not SSH into the VM".into(),
                        false,
                    );
                }
            }
            missing_file(
                &v.connector_config.key_path,
                at(&["autoscaler", "vm_isolation", "connector_config", "key_path"]),
                report,
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
        missing_file(
            &a.connector_config.key_path,
            at(&["autoscaler", "connector_config", "key_path"]),
            report,
        );
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

/// Log levels GitLab Runner accepts.
const LOG_LEVELS: &[&str] = &[
    "debug", "info", "warn", "warning", "error", "fatal", "panic",
];

/// The global keys GitLab Runner writes.
fn validate_global(cfg: &Config, report: &mut dyn FnMut(Vec<Seg>, String, bool)) {
    let key = |k: &str| vec![Seg::Key(k.to_string())];
    if let Some(l) = &cfg.log_level
        && !LOG_LEVELS.contains(&l.to_ascii_lowercase().as_str())
    {
        report(
            key("log_level"),
            format!(
                "unknown log level {l:?}; expected one of {}",
                quoted(LOG_LEVELS)
            ),
            true,
        );
    }
    if let Some(f) = &cfg.log_format
        && !matches!(f.as_str(), "runner" | "text" | "json")
    {
        report(
            key("log_format"),
            format!("unknown log format {f:?}; expected \"runner\", \"text\" or \"json\""),
            true,
        );
    }
    if let Some(a) = &cfg.listen_address {
        let port_ok = a
            .rsplit_once(':')
            .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
        if !port_ok {
            report(
                key("listen_address"),
                format!("{a:?}: expected host:port, e.g. \"localhost:9252\" or \":9252\""),
                true,
            );
        }
    }
    if let Some(d) = &cfg.connection_max_age {
        duration_text(d, key("connection_max_age"), report);
    }
    if cfg
        .sentry_dsn
        .as_deref()
        .is_some_and(|d| !d.trim().is_empty())
    {
        report(
            key("sentry_dsn"),
            "not used by slipway: errors are not reported to Sentry".into(),
            false,
        );
    }
    let sp = &cfg.status_page;
    let at = |name: &str| vec![Seg::Key("status_page".into()), Seg::Key(name.into())];
    // A usable duration, or reported.
    let mut checked = |name: &str, text: &str| match humantime::parse_duration(text.trim()) {
        Ok(d) if d.is_zero() => {
            report(
                at(name),
                format!("{text:?}: expected a duration above zero, e.g. \"15s\" or \"6h\""),
                true,
            );
            None
        }
        Ok(d) => Some(d),
        Err(_) => {
            duration_text(text, at(name), report);
            None
        }
    };
    let every = checked("history_interval", &sp.history_interval);
    let span = sp.history.as_deref().and_then(|h| checked("history", h));
    match every {
        Some(e) if e < std::time::Duration::from_secs(1) => report(
            at("history_interval"),
            format!("{:?}: expected at least \"1s\"", sp.history_interval),
            true,
        ),
        Some(e)
            if span.is_some_and(|s| s.as_secs_f64() / e.as_secs_f64() > MAX_HISTORY_SAMPLES) =>
        {
            report(
                at("history"),
                format!(
                    "{:?} of samples every {:?} is more than {MAX_HISTORY_SAMPLES} samples; \
                     keep less or sample less often",
                    sp.history.as_deref().unwrap_or_default(),
                    sp.history_interval
                ),
                true,
            )
        }
        _ => {}
    }
    if sp.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        report(
            at("token"),
            "empty token: leave it out to serve the page without one".into(),
            true,
        );
    }
    if let Some(s) = &cfg.session_server
        && s.contains_key("listen_address")
    {
        report(
            key("session_server"),
            "the interactive web terminal is not supported yet; [session_server] is ignored".into(),
            false,
        );
    }
}

/// A Go-style duration in a string key: an error names the key.
fn duration_text(text: &str, path: Vec<Seg>, report: &mut dyn FnMut(Vec<Seg>, String, bool)) {
    if let Err(e) = humantime::parse_duration(text.trim()) {
        report(
            path,
            format!("invalid duration {text:?} ({e}); expected e.g. \"30s\", \"15m\" or \"1h30m\""),
            true,
        );
    }
}

/// A warning when `file` is set but does not exist here (it is read where the runner runs).
fn missing_file(file: &str, path: Vec<Seg>, report: &mut dyn FnMut(Vec<Seg>, String, bool)) {
    if !file.trim().is_empty() && !Path::new(file).exists() {
        report(
            path,
            format!("file {file:?} does not exist on this machine"),
            false,
        );
    }
}

/// Shells Slipway runs job scripts with.
const SHELLS: &[&str] = &["bash", "sh"];

/// The `[[runners]]` keys GitLab Runner writes beyond the executors' own sections.
fn validate_gitlab_keys(
    r: &RunnerConfig,
    at: &dyn Fn(&[&str]) -> Vec<Seg>,
    report: &mut dyn FnMut(Vec<Seg>, String, bool),
) {
    if let Some(sh) = &r.shell
        && !SHELLS.contains(&sh.as_str())
    {
        report(
            at(&["shell"]),
            format!(
                "shell {sh:?} is not supported; slipway runs job scripts with {}",
                quoted(SHELLS)
            ),
            true,
        );
    }
    for (j, e) in r.environment.iter().enumerate() {
        let valid = e
            .split_once('=')
            .is_some_and(|(k, _)| !k.trim().is_empty() && !k.contains(char::is_whitespace));
        if !valid {
            let mut path = at(&["environment"]);
            path.push(Seg::Index(j));
            // The entry is not quoted: environment values often hold credentials.
            report(
                path,
                format!("entry {j} is not KEY=VALUE (a variable name, \"=\", then the value)"),
                true,
            );
        }
    }
    for (k, v) in [
        ("pre_get_sources_script", &r.pre_get_sources_script),
        ("post_get_sources_script", &r.post_get_sources_script),
    ] {
        if v.as_deref().is_some_and(|s| !s.trim().is_empty()) {
            report(
                at(&[k]),
                "not supported yet; the script is not run".into(),
                false,
            );
        }
    }
    for (k, v) in [
        ("tls-ca-file", &r.tls_ca_file),
        ("tls-cert-file", &r.tls_cert_file),
        ("tls-key-file", &r.tls_key_file),
    ] {
        if let Some(f) = v {
            missing_file(f, at(&[k]), report);
            report(
                at(&[k]),
                "not used yet: slipway checks GitLab's certificate against the system's roots \
                 and presents no client certificate"
                    .into(),
                false,
            );
        }
    }
    if r.referees.is_some() {
        report(
            at(&["referees"]),
            "not used by slipway; ignored".into(),
            false,
        );
    }
    if r.unhealthy_requests_limit.is_some() {
        report(
            at(&["unhealthy_requests_limit"]),
            "not used by slipway (it backs off on failed requests instead); ignored".into(),
            false,
        );
    }
    if let Some(d) = &r.unhealthy_interval {
        duration_text(d, at(&["unhealthy_interval"]), report);
        report(
            at(&["unhealthy_interval"]),
            "not used by slipway (it backs off on failed requests instead); ignored".into(),
            false,
        );
    }
    if r.custom_build_dir.as_ref().is_some_and(|c| c.enabled) {
        report(
            at(&["custom_build_dir", "enabled"]),
            "not supported yet: jobs cannot choose their build directory (GIT_CLONE_PATH)".into(),
            false,
        );
    }
    if let Some(c) = &r.cache {
        match c.cache_type.as_str() {
            "" => {}
            t @ ("s3" | "gcs" | "azure") => report(
                at(&["cache", "Type"]),
                format!(
                    "distributed cache type {t:?} is not supported yet; jobs use the local cache in cache_dir"
                ),
                false,
            ),
            other => report(
                at(&["cache", "Type"]),
                format!("unknown cache type {other:?}; expected \"s3\", \"gcs\" or \"azure\""),
                true,
            ),
        }
        if c.max_uploaded_archive_size < 0 {
            report(
                at(&["cache", "MaxUploadedArchiveSize"]),
                "must be 0 (unlimited) or a size in bytes".into(),
                true,
            );
        }
    }
    if let Some(inst) = &r.instance {
        if EXECUTORS.contains(&r.executor.as_str()) && r.executor != "instance" {
            report(
                at(&["instance"]),
                format!(
                    "only the instance executor reads [runners.instance]; ignored for the {} executor",
                    r.executor
                ),
                false,
            );
        }
        let auto = r.autoscaler.as_ref();
        let isolated = auto
            .and_then(|a| a.vm_isolation.as_ref())
            .is_some_and(|v| v.enabled);
        let single_use = auto.is_some_and(|a| a.max_use_count == 1);
        if inst.use_common_build_dir && !isolated && !single_use {
            report(
                at(&["instance", "use_common_build_dir"]),
                "honoured only with VM isolation or max_use_count = 1 (jobs sharing an instance would share a build directory)".into(),
                false,
            );
        }
    }
    if let Some(c) = &r.custom {
        for (k, v) in [
            ("config_exec", &c.config_exec),
            ("prepare_exec", &c.prepare_exec),
            ("run_exec", &c.run_exec),
            ("cleanup_exec", &c.cleanup_exec),
        ] {
            // A bare name is looked up on PATH when the job runs.
            if Path::new(v).is_absolute() {
                missing_file(v, at(&["custom", k]), report);
            }
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

/// The line where the key at `path` is written (or its nearest written parent); an index into
/// an inline array gives the element's line.
fn key_line(doc: &toml_edit::Document<String>, text: &str, path: &[Seg]) -> Option<usize> {
    /// Where the walk stands.
    enum At<'a> {
        Table(&'a dyn toml_edit::TableLike),
        Tables(&'a toml_edit::ArrayOfTables),
        Array(&'a toml_edit::Array),
        Leaf,
    }
    fn of_value(v: &toml_edit::Value) -> At<'_> {
        match v {
            toml_edit::Value::Array(a) => At::Array(a),
            toml_edit::Value::InlineTable(t) => At::Table(t),
            _ => At::Leaf,
        }
    }
    let line = |span: Option<std::ops::Range<usize>>| span.map(|s| line_of(text, s.start));
    let mut at = At::Table(doc.as_table());
    let mut best = None;
    for seg in path {
        at = match (at, seg) {
            (At::Table(t), Seg::Key(k)) => {
                let Some((key, item)) = t.get_key_value(k) else {
                    return best;
                };
                best = line(key.span().or_else(|| item.span())).or(best);
                match item {
                    toml_edit::Item::ArrayOfTables(a) => At::Tables(a),
                    toml_edit::Item::Value(v) => of_value(v),
                    other => other.as_table_like().map_or(At::Leaf, At::Table),
                }
            }
            (At::Tables(a), Seg::Index(n)) => {
                let Some(t) = a.get(*n) else { return best };
                best = line(t.span()).or(best);
                At::Table(t)
            }
            (At::Array(a), Seg::Index(n)) => {
                let Some(v) = a.get(*n) else { return best };
                best = line(v.span()).or(best);
                of_value(v)
            }
            _ => return best,
        };
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
    fn status_page_keys_are_checked_and_its_token_never_printed() {
        let ok = GOOD.replacen(
            "concurrent = 4\n",
            "concurrent = 4\n[status_page]\n  token = \"st-secret-1\"\n  history = \"2h\"\n",
            1,
        );
        let loaded = parse(&ok, "config.toml").expect("valid");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let sp = &loaded.config.status_page;
        assert!(sp.enabled);
        assert_eq!(
            sp.history_durations(),
            (Duration::from_secs(15), Duration::from_secs(7200))
        );
        // Without `history`, a short interval keeps what 10,000 samples cover.
        let quick = StatusPageConfig {
            history_interval: "1s".into(),
            ..StatusPageConfig::default()
        };
        assert_eq!(
            quick.history_durations(),
            (Duration::from_secs(1), Duration::from_secs(10_000))
        );
        assert_eq!(
            StatusPageConfig::default().history_durations(),
            (Duration::from_secs(15), Duration::from_secs(6 * 3600))
        );
        assert!(!format!("{:?}", loaded.config).contains("st-secret-1"));
        let many = GOOD.replacen(
            "concurrent = 4\n",
            "concurrent = 4\n[status_page]\n  history_interval = \"1s\"\n  history = \"24h\"\n",
            1,
        );
        let e = errors(&many);
        assert!(
            e.len() == 1
                && e[0].starts_with("config.toml:5: status_page.history:")
                && e[0].contains("10000 samples"),
            "{e:?}"
        );
        let fast = GOOD.replacen(
            "concurrent = 4\n",
            "concurrent = 4\n[status_page]\n  history_interval = \"10ms\"\n",
            1,
        );
        let e = errors(&fast);
        assert!(
            e.len() == 1 && e[0].starts_with("config.toml:4: status_page.history_interval:"),
            "{e:?}"
        );
        let bad = GOOD.replacen(
            "concurrent = 4\n",
            "concurrent = 4\n[status_page]\n  history_interval = \"0s\"\n  history = \"soon\"\n  token = \"\"\n",
            1,
        );
        let e = errors(&bad);
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(
            e.iter()
                .any(|l| l.starts_with("config.toml:4: status_page.history_interval:")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|l| l.starts_with("config.toml:5: status_page.history:")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|l| l.starts_with("config.toml:6: status_page.token: empty token")),
            "{e:?}"
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
        // Locally built images run without a registry.
        let docker = loaded.config.runners[0].docker.as_ref().expect("docker");
        assert_eq!(
            docker.pull_policy,
            [slipway_executor::docker::PullPolicy::IfNotPresent]
        );
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

    #[test]
    fn every_wrong_type_is_reported_at_its_line() {
        let text = GOOD
            .replace("concurrent = 4", "concurrent = \"four\"")
            .replace(
                "capacity_per_instance = 2",
                "capacity_per_instance = \"two\"",
            )
            .replace("max_use_count = 5", "max_use_count = -5")
            .replace(
                "idle_count = 1",
                "idle_count = 1\n      periods = \"* * * * *\"",
            );
        let e = errors(&text);
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(
            e[0].starts_with("config.toml:2: concurrent: invalid type"),
            "{e:?}"
        );
        assert!(
            e[1].starts_with("config.toml:10: runners[0].autoscaler.capacity_per_instance:"),
            "{e:?}"
        );
        assert!(
            e[2].starts_with("config.toml:12: runners[0].autoscaler.max_use_count:"),
            "{e:?}"
        );
        assert!(
            e[3].starts_with("config.toml:18: runners[0].autoscaler.policy[0].periods:"),
            "{e:?}"
        );
    }

    const GITLAB_WRITTEN: &str = r#"
concurrent = 1
check_interval = 0
connection_max_age = "15m0s"
shutdown_timeout = 0

[session_server]
  session_timeout = 1800

[[runners]]
  name = "shell"
  url = "https://gitlab.example.com"
  id = 7
  token = "glrt-t1_secret-token-value"
  token_obtained_at = 2024-05-01T12:00:00Z
  token_expires_at = 0001-01-01T00:00:00Z
  executor = "shell"
  shell = "sh"
  cache_dir = "/cache"
  environment = ["A=1", "B=two=2"]
  pre_build_script = "echo pre"
  tls-ca-file = "/"
  [runners.custom_build_dir]
  [runners.cache]
    MaxUploadedArchiveSize = 0
    [runners.cache.s3]
    [runners.cache.gcs]
    [runners.cache.azure]
  [runners.feature_flags]
    FF_USE_FASTZIP = true
"#;

    #[test]
    fn reads_what_gitlab_runner_writes() {
        let loaded = parse(GITLAB_WRITTEN, "config.toml").expect("valid");
        // Only the CA file, which this version does not use, is worth a word.
        assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
        assert_eq!(loaded.warnings[0].key, "runners[0].tls-ca-file");
        let r = &loaded.config.runners[0];
        assert_eq!(r.id, 7);
        assert_eq!(r.token_obtained_at.as_deref(), Some("2024-05-01T12:00:00Z"));
        assert_eq!(r.token_expires_at.as_deref(), Some("0001-01-01T00:00:00Z"));
        assert_eq!(r.environment, vec!["A=1", "B=two=2"]);
        assert_eq!(r.tls_ca_file.as_deref(), Some("/"));
        assert_eq!(r.feature_flags.get("FF_USE_FASTZIP"), Some(&true));
        assert!(r.cache.as_ref().is_some_and(|c| c.s3.is_some()));
        // The same file read by the text deserializer (as a caller might): datetimes still load.
        let direct: Config = toml::from_str(GITLAB_WRITTEN).expect("direct");
        assert_eq!(
            direct.runners[0].token_expires_at.as_deref(),
            Some("0001-01-01T00:00:00Z")
        );
    }

    #[test]
    fn bad_environment_entry_names_its_index_without_its_value() {
        let text = GITLAB_WRITTEN.replace(
            "environment = [\"A=1\", \"B=two=2\"]",
            "environment = [\n    \"A=1\",\n    \"no-equals-sign-secret\",\n  ]",
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("config.toml:22: runners[0].environment[1]: entry 1 is not KEY=VALUE"),
            "{e:?}"
        );
        assert!(!e[0].contains("no-equals"), "{e:?}");
    }

    #[test]
    fn secrets_are_never_quoted() {
        let text = GITLAB_WRITTEN
            .replace(
                "token = \"glrt-t1_secret-token-value\"",
                "token = 918273645\n  limit = \"glrt-t1_secret-token-value\"",
            )
            .replace(
                "[runners.cache.s3]",
                "[runners.cache.s3]\n      SecretKey = \"s3-secret-key-value\"\n      AccessKey = [\"s3-access\"]",
            )
            .replace("shell = \"sh\"", "shell = \"s3-secret-key-value\"");
        let e = errors(&text).join("\n");
        for secret in [
            "918273645",
            "glrt-t1_secret",
            "s3-secret-key-value",
            "s3-access",
        ] {
            assert!(!e.contains(secret), "{secret} in {e}");
        }
        assert!(
            e.contains("runners[0].token: invalid type (value not shown)"),
            "{e}"
        );
        assert!(e.contains("runners[0].shell: shell \"[MASKED]\""), "{e}");
    }

    #[test]
    fn distributed_cache_and_unused_keys_are_warnings() {
        let text = GITLAB_WRITTEN
            .replace("MaxUploadedArchiveSize = 0", "Type = \"gcs\"")
            .replace(
                "shell = \"sh\"",
                "shell = \"sh\"\n  pre_get_sources_script = \"x\"",
            );
        let loaded = parse(&text, "config.toml").expect("valid");
        let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(
            w[0].contains("runners[0].pre_get_sources_script: not supported yet"),
            "{w:?}"
        );
        assert!(
            w[1].contains("runners[0].tls-ca-file: not used yet"),
            "{w:?}"
        );
        assert!(
            w[2].contains("runners[0].cache.Type: distributed cache type \"gcs\" is not supported yet; jobs use the local cache in cache_dir"),
            "{w:?}"
        );
        let bad = GITLAB_WRITTEN.replace("shell = \"sh\"", "shell = \"pwsh\"");
        assert!(errors(&bad)[0].contains("shell \"pwsh\" is not supported"));
    }

    #[test]
    fn vm_isolation_and_instance_sections_parse() {
        let text = GOOD.replace(
            "    [runners.autoscaler.plugin_config]",
            "    [runners.autoscaler.vm_isolation]\n      enabled = false\n      nesting_host = \"unix:///n.sock\"\n      image = \"macos\"\n      [runners.autoscaler.vm_isolation.nesting_config]\n        x = 1\n      [runners.autoscaler.vm_isolation.connector_config]\n        username = \"u\"\n    [runners.autoscaler.plugin_config]",
        ) + "  [runners.instance]\n    allowed_images = [\"*\"]\n";
        let loaded = parse(&text, "config.toml").expect("valid");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let r = &loaded.config.runners[0];
        let v = r
            .autoscaler
            .as_ref()
            .and_then(|a| a.vm_isolation.as_ref())
            .expect("vm");
        assert_eq!(v.image, "macos");
        assert_eq!(
            r.instance.as_ref().map(|i| i.allowed_images.clone()),
            Some(vec!["*".into()])
        );
    }
}
