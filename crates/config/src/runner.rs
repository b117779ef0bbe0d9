//! One `[[runners]]` entry: the keys GitLab Runner writes for it, what its jobs may ask for
//! (isolation, slot cgroups), and the checks that join its sections.

use slipway_gitlab::TlsFiles;
use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use slipway_executor::{Isolation, IsolationPolicy, NestingConfig};

use crate::archives::ArchivesConfig;
use crate::autoscaler::AutoscalerConfig;
use crate::cache::CacheConfig;
use crate::custom::{self, CustomBuildDirConfig};
use crate::executor::Executor;
use crate::instance::InstanceConfig;
use crate::plugin::{self, ExecutorPluginConfig};
use crate::problem::{Report, quoted};

/// Where a runner's jobs get their sources fetched (`[runners] fetch_sources`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FetchSources {
    /// Only where the job's steps run (an instance's shell, a container, a VM, this machine's
    /// shell): a host without git 2.31+, or that cannot reach GitLab, fails the job. The
    /// manager never fetches on a pipeline's behalf from its own network position.
    #[default]
    Instance,
    /// Always on the manager, streamed to the job.
    Manager,
    /// Where the job's steps run, and on the manager when that host has no git 2.31+ or
    /// cannot reach GitLab (the operator allows the manager's network position).
    InstanceOrManager,
}

/// Where a runner's jobs' data (dependencies' artifacts, the distributed cache, the job's own
/// artifacts) is moved (`[runners] job_data`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum JobData {
    /// Where the job's steps run, by the job helper (an instance's shell, the build
    /// container): the manager carries no job data. Jobs at the `microvm` and `vm` levels and
    /// on the custom and plugin executors still move theirs through the manager.
    #[default]
    Instance,
    /// Through the manager: downloaded, unpacked, packed and uploaded there, for hosts that
    /// cannot reach GitLab or the cache's object storage.
    Manager,
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
    #[serde(deserialize_with = "crate::de::datetime_text::deserialize")]
    pub token_obtained_at: Option<String>,
    /// When the token expires (RFC 3339; GitLab writes `0001-01-01T00:00:00Z` for never).
    #[serde(deserialize_with = "crate::de::datetime_text::deserialize")]
    pub token_expires_at: Option<String>,
    /// Executor ([`Executor::Unknown`] when missing or not run by this version: an error).
    pub executor: Executor,
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
    /// Script run where the job runs before its sources are fetched.
    pub pre_get_sources_script: Option<String>,
    /// Script run where the job runs after its sources are fetched.
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
    /// Where a job's sources are fetched: `instance` (default: only where its steps run — an
    /// instance's shell, a container, a VM — which needs git 2.31+ there reaching GitLab, else
    /// the job fails), `manager` (always, streamed to the job), or `instance_or_manager` (where
    /// its steps run, else the manager).
    pub fetch_sources: FetchSources,
    /// Where a job's dependencies' artifacts, distributed cache and artifacts are moved:
    /// `instance` (default: by the job helper where its steps run) or `manager`.
    pub job_data: JobData,
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
    /// `[runners.archives]`: how far an archive from a job may expand on the manager.
    pub archives: ArchivesConfig,
    /// Isolation levels jobs may ask for (`SLIPWAY_ISOLATION`); default: what the executor
    /// supports at the runner's level or stronger (the level is a floor; weaker ones must be
    /// listed).
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
            .field("archives", &self.archives)
            .field("fetch_sources", &self.fetch_sources)
            .field("job_data", &self.job_data)
            .field("autoscaler", &self.autoscaler)
            .field("instance", &self.instance)
            .field("docker", &self.docker)
            .field("custom", &self.custom.is_some())
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
    }
}

impl RunnerConfig {
    /// Whether jobs may set `GIT_CLONE_PATH` (`[runners.custom_build_dir] enabled`, else GitLab
    /// Runner's default for the executor).
    pub fn custom_build_dir(&self) -> bool {
        self.custom_build_dir
            .as_ref()
            .and_then(|c| c.enabled)
            .unwrap_or_else(|| crate::custom::custom_build_dir_default(&self.executor))
    }

    /// TLS towards this runner's GitLab: its `tls-*` files, and where unset GitLab Runner's
    /// well-known files in `certs_dir` (`<host>.crt`, `<host>.auth.crt`, `<host>.auth.key`).
    pub fn tls_files(&self, certs_dir: Option<&std::path::Path>) -> TlsFiles {
        let path = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(std::path::PathBuf::from)
        };
        let set = TlsFiles {
            ca_file: path(&self.tls_ca_file),
            cert_file: path(&self.tls_cert_file),
            key_file: path(&self.tls_key_file),
        };
        match certs_dir {
            Some(dir) => set.with_defaults(dir, self.url.trim()),
            None => set,
        }
    }

    /// Whether this runner's jobs run on autoscaled instances: the `instance` and
    /// `docker-autoscaler` executors, and the `plugin` executor with `[runners.autoscaler]`.
    pub fn on_instances(&self) -> bool {
        self.executor.autoscaled()
            || (self.executor == Executor::Plugin && self.autoscaler.is_some())
    }

    /// The executor's settings for the `microvm` and `vm` levels, when `vm_isolation` is
    /// enabled.
    pub fn nesting_config(&self) -> Option<NestingConfig> {
        let a = self.autoscaler.as_ref()?;
        let v = a.vm_isolation.as_ref().filter(|v| v.enabled)?;
        let allowed_images = self
            .instance
            .as_ref()
            .map(|i| i.allowed_images.clone())
            .unwrap_or_default();
        Some(v.to_nesting_config(allowed_images, a.capacity_per_instance))
    }

    /// What jobs of this runner may ask for, and get when they ask for nothing; an error
    /// names the key and the problem.
    pub fn isolation_policy(&self) -> Result<IsolationPolicy, (&'static str, String)> {
        if self.executor == Executor::Plugin {
            // allowed_isolation and isolation name the plugin's levels, checked against what
            // its Init declares when the runner starts; its jobs take ordinary slots.
            return Ok(IsolationPolicy {
                allowed: vec![Isolation::None],
                default: Isolation::None,
            });
        }
        let mut supported = self.executor.supported_isolation().to_vec();
        if self.executor == Executor::Instance && self.nesting_config().is_some() {
            supported.extend([Isolation::Microvm, Isolation::Vm]);
        }
        let default = match &self.isolation {
            Some(n) => n.parse().map_err(|e| ("isolation", format!("{e}")))?,
            None if matches!(self.executor, Executor::Docker | Executor::DockerAutoscaler) => {
                Isolation::Docker
            }
            // GitLab's vm_isolation puts every job in a VM.
            None if self.executor == Executor::Instance && self.nesting_config().is_some() => {
                Isolation::Microvm
            }
            None if self.use_slot_cgroups => Isolation::Cgroup,
            None => Isolation::None,
        };
        let supported = supported.as_slice();
        let allowed: Vec<Isolation> = match &self.allowed_isolation {
            // The runner's level is a floor: a job may ask for a stronger one, never a weaker
            // one (the job's code is the pipeline's author's, not the operator's). A whole
            // instance per job costs a machine per job: only when the runner says so.
            None => supported
                .iter()
                .copied()
                .filter(|l| *l != Isolation::Instance && *l >= default)
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
        Ok(IsolationPolicy { allowed, default })
    }

    /// Levels `allowed_isolation` lists that are weaker than `policy`'s default, on a runner
    /// whose default keeps jobs away from something a weaker job would run beside: the
    /// instance's Docker Engine (`docker`) or nesting daemon (`microvm`, `vm`).
    pub fn weaker_than_default(&self, policy: &IsolationPolicy) -> Vec<Isolation> {
        let shields = matches!(
            policy.default,
            Isolation::Docker | Isolation::Microvm | Isolation::Vm
        ) || self.nesting_config().is_some();
        if !shields || self.allowed_isolation.is_none() {
            return Vec::new();
        }
        policy
            .allowed
            .iter()
            .copied()
            .filter(|l| *l < policy.default)
            .collect()
    }

    /// The slot cgroups of the `cgroup` level, from `slot_cgroup_template`.
    pub fn slot_cgroups(&self) -> Result<slipway_executor::cgroup::SlotCgroups, String> {
        let mut c = slipway_executor::cgroup::SlotCgroups::default();
        if let Some(t) = &self.slot_cgroup_template {
            c.template = slipway_cgroups::SlotTemplate::parse(t).map_err(|e| e.to_string())?;
        }
        Ok(c)
    }

    /// The entry's checks (`report` is at `runners[i]`): GitLab's keys, the executor and the
    /// sections it needs, isolation, then `[runners.autoscaler]`.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        self.validate_gitlab_keys(report);
        self.executor.validate(report);
        if !self.on_instances() && self.autoscaler.is_some() && self.executor.is_known() {
            report.error(
                &["autoscaler"],
                format!(
                    "the {} executor runs jobs on this machine; use executor \"instance\" or \"docker-autoscaler\" with [runners.autoscaler]",
                    self.executor
                ),
            );
        }
        if self.executor == Executor::Custom {
            custom::validate_section(self.custom.as_ref(), report);
        }
        if self.executor == Executor::Plugin {
            plugin::validate(self.plugin.as_ref(), report);
        }
        if let Some(d) = &self.docker
            && let Err(e) = d.validate()
        {
            report.error(&["docker"], e.to_string());
        }
        // An unknown executor is reported above; its isolation cannot be judged.
        if !self.executor.supported_isolation().is_empty() {
            match self.isolation_policy() {
                Err((k, message)) => report.error(&[k], message),
                Ok(policy) => {
                    let weaker = self.weaker_than_default(&policy);
                    if !weaker.is_empty() {
                        report.warning(
                            &["allowed_isolation"],
                            format!(
                                "lets a job choose {} instead of the default {:?}: its code then \
                                 runs beside the instance's {}; list only the default and \
                                 stronger levels unless every pipeline on this runner is trusted",
                                weaker
                                    .iter()
                                    .map(|l| format!("{:?}", l.as_str()))
                                    .collect::<Vec<_>>()
                                    .join(", "),
                                policy.default.as_str(),
                                if self.nesting_config().is_some() {
                                    "nesting daemon and Docker Engine"
                                } else {
                                    "Docker Engine"
                                }
                            ),
                        );
                    }
                }
            }
        }
        if let Err(message) = self.slot_cgroups() {
            report.error(&["slot_cgroup_template"], message);
        }
        match &self.autoscaler {
            Some(a) => a.validate(self, &mut report.section(&["autoscaler"])),
            None if self.executor.autoscaled() => report.error(
                &["autoscaler"],
                format!(
                    "the {} executor needs a [runners.autoscaler] section",
                    self.executor
                ),
            ),
            None => {}
        }
    }

    /// The `[[runners]]` keys GitLab Runner writes beyond the executors' own sections.
    fn validate_gitlab_keys(&self, report: &mut Report<'_>) {
        if let Some(sh) = &self.shell
            && !SHELLS.contains(&sh.as_str())
        {
            report.error(
                &["shell"],
                format!(
                    "shell {sh:?} is not supported; slipway runs job scripts with {}",
                    quoted(SHELLS)
                ),
            );
        }
        for (j, e) in self.environment.iter().enumerate() {
            let valid = e
                .split_once('=')
                .is_some_and(|(k, _)| !k.trim().is_empty() && !k.contains(char::is_whitespace));
            if !valid {
                // The entry is not quoted: environment values often hold credentials.
                report.element("environment", j).error(
                    &[],
                    format!("entry {j} is not KEY=VALUE (a variable name, \"=\", then the value)"),
                );
            }
        }
        if self.executor == Executor::Custom {
            for (k, v) in [
                ("pre_get_sources_script", &self.pre_get_sources_script),
                ("post_get_sources_script", &self.post_get_sources_script),
            ] {
                if v.as_deref().is_some_and(|s| !s.trim().is_empty()) {
                    report.warning(
                        &[k],
                        "not run with the custom executor (its driver gets the sources); the script is ignored",
                    );
                }
            }
        }
        let mut tls_files_exist = true;
        for (k, v) in [
            ("tls-ca-file", &self.tls_ca_file),
            ("tls-cert-file", &self.tls_cert_file),
            ("tls-key-file", &self.tls_key_file),
        ] {
            if let Some(f) = v {
                tls_files_exist &= std::path::Path::new(f).is_file();
                report.missing_file(&[k], f);
            }
        }
        let tls = self.tls_files(None);
        if tls_files_exist
            && !tls.is_empty()
            && let Err(e) = tls.client_config(self.url.trim())
        {
            let key = match &e {
                slipway_gitlab::GitlabError::TlsFile { file, .. }
                    if Some(file) == tls.key_file.as_ref() =>
                {
                    "tls-key-file"
                }
                slipway_gitlab::GitlabError::TlsFile { file, .. }
                    if Some(file) == tls.cert_file.as_ref() =>
                {
                    "tls-cert-file"
                }
                _ => "tls-ca-file",
            };
            report.error(&[key], e.to_string());
        }
        if self.referees.is_some() {
            report.warning(&["referees"], "not used by slipway; ignored");
        }
        if self.unhealthy_requests_limit.is_some() {
            report.warning(
                &["unhealthy_requests_limit"],
                "not used by slipway (it backs off on failed requests instead); ignored",
            );
        }
        if let Some(d) = &self.unhealthy_interval {
            report.duration_text(&["unhealthy_interval"], d);
            report.warning(
                &["unhealthy_interval"],
                "not used by slipway (it backs off on failed requests instead); ignored",
            );
        }

        if let Some(c) = &self.cache {
            c.validate(&mut report.section(&["cache"]));
        }
        self.archives.validate(&mut report.section(&["archives"]));
        if let Some(inst) = &self.instance {
            inst.validate(
                &self.executor,
                self.autoscaler.as_ref(),
                &mut report.section(&["instance"]),
            );
        }
        if let Some(c) = &self.custom {
            custom::validate_files(c, &mut report.section(&["custom"]));
        }
    }
}

/// Shells Slipway runs job scripts with.
const SHELLS: &[&str] = &["bash", "sh"];

#[cfg(test)]
mod tests {
    use crate::check::parse;
    use crate::global::Config;
    use crate::testing::{GITLAB_WRITTEN, errors};

    /// The GOOD runner with `extra` keys under `[[runners]]`: its isolation policy and the
    /// warnings about it.
    fn policy_of(extra: &str) -> (slipway_executor::IsolationPolicy, Vec<String>) {
        let text = crate::testing::GOOD.replace(
            "  executor = \"instance\"\n",
            &format!("  executor = \"instance\"\n{extra}"),
        );
        let loaded = parse(&text, "config.toml").unwrap();
        let warnings = loaded.warnings.iter().map(ToString::to_string).collect();
        (
            loaded.config.runners[0].isolation_policy().unwrap(),
            warnings,
        )
    }

    #[test]
    fn a_job_may_choose_only_the_runner_s_level_or_a_stronger_one() {
        use slipway_executor::Isolation::{Cgroup, Docker, None as Plain};
        let (p, _) = policy_of("");
        assert_eq!(p.default, Plain);
        assert_eq!(p.allowed, [Plain, Cgroup, Docker]);
        // A cgroup runner's jobs cannot step out of their slot with `none`.
        let (p, warnings) = policy_of("  use_slot_cgroups = true\n");
        assert_eq!(p.default, Cgroup);
        assert_eq!(p.allowed, [Cgroup, Docker]);
        assert!(p.resolve(Some("none"), "r").is_err());
        assert!(warnings.is_empty(), "{warnings:?}");
        // A docker runner's jobs cannot leave their container for the host beside its engine.
        let (p, _) = policy_of("  isolation = \"docker\"\n");
        assert_eq!(p.allowed, [Docker]);
        let refused = p.resolve(Some("none"), "r").unwrap_err().to_string();
        assert!(refused.contains("allows only \"docker\""), "{refused}");
    }

    #[test]
    fn weaker_levels_must_be_listed_and_verify_config_warns_about_them() {
        use slipway_executor::Isolation::{Docker, None as Plain};
        let (p, warnings) =
            policy_of("  isolation = \"docker\"\n  allowed_isolation = [\"none\", \"docker\"]\n");
        assert_eq!(p.allowed, [Plain, Docker]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("runners[0].allowed_isolation")
                && warnings[0].contains("\"none\" instead of the default \"docker\""),
            "{warnings:?}"
        );
        // Listing only the default and stronger levels says nothing.
        let (_, warnings) = policy_of("  allowed_isolation = [\"none\", \"cgroup\"]\n");
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn tls_files_that_cannot_be_used_are_errors_naming_key_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("ca.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let text = GITLAB_WRITTEN.replace(
            "tls-ca-file = \"/\"",
            &format!("tls-ca-file = \"{}\"", junk.display()),
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("runners[0].tls-ca-file"), "{e:?}");
        assert!(e[0].contains("ca.pem: holds no PEM certificate"), "{e:?}");
        // Half a client identity is an error too.
        let text = GITLAB_WRITTEN.replace(
            "tls-ca-file = \"/\"",
            &format!("tls-cert-file = \"{}\"", junk.display()),
        );
        let e = errors(&text);
        assert!(
            e.iter()
                .any(|m| m.contains("needs both tls-cert-file and tls-key-file")),
            "{e:?}"
        );
    }

    #[test]
    fn reads_what_gitlab_runner_writes() {
        let loaded = parse(GITLAB_WRITTEN, "config.toml").expect("valid");
        // Nothing GitLab Runner writes is worth a word.
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
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
    fn job_data_is_moved_where_the_job_runs_unless_the_runner_says_manager() {
        use crate::runner::JobData;
        let with = |value: &str| {
            GITLAB_WRITTEN.replace(
                "  executor = \"shell\"\n",
                &format!("  executor = \"shell\"\n  job_data = {value}\n"),
            )
        };
        let default = parse(GITLAB_WRITTEN, "config.toml").expect("valid");
        assert_eq!(default.config.runners[0].job_data, JobData::Instance);
        let loaded = parse(&with("\"manager\""), "config.toml").expect("manager");
        assert_eq!(loaded.config.runners[0].job_data, JobData::Manager);
        let e = errors(&with("\"helper\""));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("runners[0].job_data"), "{e:?}");
        assert!(
            e[0].contains("`instance`") && e[0].contains("`manager`"),
            "{e:?}"
        );
    }

    #[test]
    fn fetch_sources_takes_three_values_and_an_unknown_one_names_the_key_and_them() {
        use crate::runner::FetchSources;
        let with = |value: &str| {
            GITLAB_WRITTEN.replace(
                "  executor = \"shell\"\n",
                &format!("  executor = \"shell\"\n  fetch_sources = {value}\n"),
            )
        };
        let default = parse(GITLAB_WRITTEN, "config.toml").expect("valid");
        assert_eq!(
            default.config.runners[0].fetch_sources,
            FetchSources::Instance
        );
        for (value, want) in [
            ("\"instance\"", FetchSources::Instance),
            ("\"manager\"", FetchSources::Manager),
            ("\"instance_or_manager\"", FetchSources::InstanceOrManager),
        ] {
            let loaded = parse(&with(value), "config.toml").expect(value);
            assert_eq!(loaded.config.runners[0].fetch_sources, want, "{value}");
        }
        let e = errors(&with("\"anywhere\""));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("runners[0].fetch_sources"), "{e:?}");
        for value in ["instance", "manager", "instance_or_manager"] {
            assert!(
                e[0].contains(&format!("`{value}`")),
                "{value} missing: {e:?}"
            );
        }
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
}
