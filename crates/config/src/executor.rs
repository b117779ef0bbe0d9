//! A runner's `executor`: which executor runs its jobs, by GitLab Runner's names.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use slipway_executor::Isolation;

use crate::problem::{Report, quoted};

/// An executor, by the name config.toml and GitLab give it.
///
/// GitLab Runner has executors this version does not run (`kubernetes`, `ssh`,
/// `docker+machine`…): config.toml may still name them. They read as [`Executor::Unknown`] so
/// that validation reports them at their line, with every other problem of the file, rather
/// than as a type error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Executor {
    /// `shell`: jobs run on this machine.
    Shell,
    /// `docker`: jobs run in containers of this machine's Docker Engine.
    Docker,
    /// `docker-autoscaler`: jobs run in containers on autoscaled instances.
    DockerAutoscaler,
    /// `instance`: jobs run on autoscaled instances (in a VM each with `vm_isolation`).
    Instance,
    /// `custom`: the operator's driver runs each stage (`[runners.custom]`).
    Custom,
    /// `plugin`: an executor plugin runs them (`[runners.plugin]`).
    Plugin,
    /// Any other name, as written; empty when `executor` is missing. Validation rejects it.
    Unknown(String),
}

impl Default for Executor {
    /// Missing: what a `[[runners]]` entry without `executor` reads as.
    fn default() -> Self {
        Executor::Unknown(String::new())
    }
}

impl Executor {
    /// The executors this version runs, in the order messages list them.
    pub const ALL: [Executor; 6] = [
        Executor::Instance,
        Executor::DockerAutoscaler,
        Executor::Shell,
        Executor::Docker,
        Executor::Custom,
        Executor::Plugin,
    ];

    /// The name in config.toml and in the runner info GitLab is sent.
    pub fn as_str(&self) -> &str {
        match self {
            Executor::Unknown(name) => name,
            known => known.name(),
        }
    }

    /// A known executor's name (never used for [`Executor::Unknown`]).
    fn name(&self) -> &'static str {
        match self {
            Executor::Shell => "shell",
            Executor::Docker => "docker",
            Executor::DockerAutoscaler => "docker-autoscaler",
            Executor::Instance => "instance",
            Executor::Custom => "custom",
            Executor::Plugin => "plugin",
            Executor::Unknown(_) => "",
        }
    }

    /// The names of [`Executor::ALL`], in its order.
    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(Executor::name).collect()
    }

    /// Whether this version runs it (anything but [`Executor::Unknown`]).
    pub fn is_known(&self) -> bool {
        !matches!(self, Executor::Unknown(_))
    }

    /// Whether its jobs run on autoscaled instances, else on this machine (a `plugin` runner
    /// with `[runners.autoscaler]` is on instances too: see `RunnerConfig::on_instances`).
    pub fn autoscaled(&self) -> bool {
        matches!(self, Executor::Instance | Executor::DockerAutoscaler)
    }

    /// Levels it can give a job (none for an unknown executor).
    pub fn supported_isolation(&self) -> &'static [Isolation] {
        match self {
            Executor::Instance => &[
                Isolation::None,
                Isolation::Cgroup,
                Isolation::Docker,
                Isolation::Instance,
            ],
            Executor::DockerAutoscaler | Executor::Docker => &[Isolation::Docker],
            Executor::Shell => &[Isolation::None, Isolation::Cgroup],
            Executor::Custom => &[Isolation::None],
            // The plugin's own levels are checked against what its Init declares.
            Executor::Plugin => &[Isolation::None],
            Executor::Unknown(_) => &[],
        }
    }

    /// The features GitLab is told its jobs may use (the runner info's `features`).
    pub fn gitlab_features(&self) -> Vec<&'static str> {
        let mut features = vec![
            "variables",
            "masking",
            "trace_reset",
            "trace_checksum",
            "trace_size",
            "cancelable",
            "cancel_gracefully",
            "return_exit_code",
            "refspecs",
        ];
        // The custom executor's driver owns its environment: no sources, artifacts or cache stages.
        if *self != Executor::Custom {
            features.extend([
                "artifacts",
                "artifacts_exclude",
                "upload_multiple_artifacts",
                "upload_raw_artifacts",
                "cache",
                "fallback_cache_keys",
            ]);
        }
        if matches!(self, Executor::Docker | Executor::DockerAutoscaler) {
            features.extend(["image", "services", "service_multiple_aliases"]);
        }
        if matches!(self, Executor::Shell | Executor::Instance) {
            features.push("shared");
        }
        features
    }

    /// A missing executor, or one this version does not run.
    pub(crate) fn validate(&self, report: &mut Report<'_>) {
        match self {
            Executor::Unknown(name) if name.is_empty() => report.error(
                &["executor"],
                format!("missing; expected one of {}", quoted(&Self::names())),
            ),
            Executor::Unknown(name) => report.error(
                &["executor"],
                format!(
                    "executor {name:?} is not supported yet; expected one of {}",
                    quoted(&Self::names())
                ),
            ),
            _ => {}
        }
    }
}

impl fmt::Display for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of [`Executor::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown executor {name:?}; expected one of {}", Executor::names().join(", "))]
pub struct UnknownExecutor {
    /// The name given.
    pub name: String,
}

impl FromStr for Executor {
    type Err = UnknownExecutor;

    /// One of [`Executor::ALL`] by its name; anything else is an error.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| UnknownExecutor { name: s.into() })
    }
}

impl From<String> for Executor {
    /// Any name: one this version does not run is kept as [`Executor::Unknown`].
    fn from(name: String) -> Self {
        name.parse().unwrap_or(Executor::Unknown(name))
    }
}

impl From<&str> for Executor {
    /// Any name: one this version does not run is kept as [`Executor::Unknown`].
    fn from(name: &str) -> Self {
        name.parse()
            .unwrap_or_else(|_| Executor::Unknown(name.to_string()))
    }
}

impl<'de> Deserialize<'de> for Executor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Any string reads: an unknown name is validation's to report, at its line and among
        // the file's other problems. A wrong type stays serde's error about a string.
        String::deserialize(d).map(Executor::from)
    }
}

impl Serialize for Executor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::parse;
    use crate::testing::{GOOD, errors};

    #[test]
    fn names_round_trip_and_unknown_names_are_kept() {
        for e in Executor::ALL {
            assert_eq!(e.as_str().parse::<Executor>(), Ok(e.clone()));
            assert_eq!(Executor::from(e.to_string()), e);
        }
        assert_eq!(
            Executor::names(),
            [
                "instance",
                "docker-autoscaler",
                "shell",
                "docker",
                "custom",
                "plugin"
            ]
        );
        let e = "kubernetes".parse::<Executor>().expect_err("not run here");
        assert_eq!(
            e.to_string(),
            "unknown executor \"kubernetes\"; expected one of instance, docker-autoscaler, \
             shell, docker, custom, plugin"
        );
        assert_eq!(
            Executor::from("docker+machine"),
            Executor::Unknown("docker+machine".into())
        );
        assert_eq!(Executor::default().as_str(), "");
    }

    #[test]
    fn gitlab_features_follow_the_executor() {
        let has = |e: Executor, f: &str| e.gitlab_features().contains(&f);
        assert!(!has(Executor::Custom, "artifacts"));
        assert!(has(Executor::Shell, "artifacts") && has(Executor::Shell, "shared"));
        assert!(has(Executor::Docker, "image") && !has(Executor::Docker, "shared"));
        assert!(has(Executor::DockerAutoscaler, "services"));
        assert!(has(Executor::Instance, "shared") && !has(Executor::Instance, "image"));
    }

    #[test]
    fn unknown_and_missing_executors_are_errors_at_their_line() {
        let e = errors(&GOOD.replace("executor = \"instance\"", "executor = \"kubernetes\""));
        assert_eq!(
            e,
            [
                "config.toml:7: runners[0].executor: executor \"kubernetes\" is not supported yet; \
                 expected one of \"instance\", \"docker-autoscaler\", \"shell\", \"docker\", \
                 \"custom\", \"plugin\""
            ]
        );
        let e = errors(&GOOD.replace("  executor = \"instance\"\n", ""));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("config.toml:4: runners[0].executor: missing; expected one of"),
            "{e:?}"
        );
        let e = errors(&GOOD.replace("executor = \"instance\"", "executor = 5"));
        assert_eq!(
            e,
            ["config.toml:7: runners[0].executor: invalid type: integer `5`, expected a string"]
        );
        let loaded = parse(GOOD, "config.toml").expect("valid");
        assert_eq!(loaded.config.runners[0].executor, Executor::Instance);
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
}
