//! Isolation levels: how strongly a job is kept apart, chosen per job within what the runner
//! allows.
//!
//! A job asks with the variable `SLIPWAY_ISOLATION` (or `isolation:` in a local pipeline); a
//! runner lists `allowed_isolation` and a default. A job asking for a level the runner does not
//! allow fails before it starts, with `runner_configuration_error`.

use std::fmt;
use std::str::FromStr;

/// The job variable naming the level a job asks for.
pub const VARIABLE: &str = "SLIPWAY_ISOLATION";

/// How strongly a job is kept apart, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isolation {
    /// A directory per job.
    None,
    /// The job's slot cgroup: CPU, memory and pids limits, everything killed at the end.
    Cgroup,
    /// A container per job (and its services), in the slot's cgroup.
    Docker,
    /// A microVM per job.
    Microvm,
    /// A full VM per job.
    Vm,
    /// The whole instance, used once.
    Instance,
}

/// Every level, weakest first.
pub const LEVELS: [Isolation; 6] = [
    Isolation::None,
    Isolation::Cgroup,
    Isolation::Docker,
    Isolation::Microvm,
    Isolation::Vm,
    Isolation::Instance,
];

impl Isolation {
    /// The level's name as written in configs and variables.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::None => "none",
            Isolation::Cgroup => "cgroup",
            Isolation::Docker => "docker",
            Isolation::Microvm => "microvm",
            Isolation::Vm => "vm",
            Isolation::Instance => "instance",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A level name that is not one of [`LEVELS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown isolation level {0:?}; expected one of none, cgroup, docker, microvm, vm, instance"
)]
pub struct UnknownLevel(pub String);

impl FromStr for Isolation {
    type Err = UnknownLevel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LEVELS
            .iter()
            .copied()
            .find(|l| l.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownLevel(s.to_string()))
    }
}

/// What a runner allows and what a job gets when it asks for nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationPolicy {
    /// Levels jobs may ask for.
    pub allowed: Vec<Isolation>,
    /// The level of a job that asks for none (must be allowed).
    pub default: Isolation,
}

/// Why a job cannot have the level it asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsolationError {
    /// The request is not a level at all.
    #[error("{VARIABLE}: {0}")]
    Unknown(#[from] UnknownLevel),
    /// The runner does not allow it.
    #[error(
        "the job asks for isolation \"{asked}\" but runner {runner:?} allows only {}",
        allowed.iter().map(|l| format!("{:?}", l.as_str())).collect::<Vec<_>>().join(", ")
    )]
    NotAllowed {
        /// Level asked for.
        asked: Isolation,
        /// Runner name.
        runner: String,
        /// What the runner allows.
        allowed: Vec<Isolation>,
    },
}

impl IsolationPolicy {
    /// The level a job gets: what it asks for (`None` or empty: the default), if allowed.
    pub fn resolve(&self, asked: Option<&str>, runner: &str) -> Result<Isolation, IsolationError> {
        let level = match asked.map(str::trim).filter(|s| !s.is_empty()) {
            None => self.default,
            Some(s) => s.parse()?,
        };
        if self.allowed.contains(&level) {
            Ok(level)
        } else {
            Err(IsolationError::NotAllowed {
                asked: level,
                runner: runner.to_string(),
                allowed: self.allowed.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> IsolationPolicy {
        IsolationPolicy {
            allowed: vec![Isolation::None, Isolation::Cgroup],
            default: Isolation::Cgroup,
        }
    }

    #[test]
    fn a_job_gets_what_it_asks_for_within_what_is_allowed() {
        assert_eq!(policy().resolve(None, "r"), Ok(Isolation::Cgroup));
        assert_eq!(policy().resolve(Some(""), "r"), Ok(Isolation::Cgroup));
        assert_eq!(policy().resolve(Some("none"), "r"), Ok(Isolation::None));
        assert_eq!(
            policy().resolve(Some(" CGROUP "), "r"),
            Ok(Isolation::Cgroup)
        );
    }

    #[test]
    fn a_level_the_runner_does_not_allow_names_both() {
        let e = policy().resolve(Some("docker"), "shared").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the job asks for isolation \"docker\" but runner \"shared\" allows only \"none\", \"cgroup\""
        );
        let e = policy().resolve(Some("chroot"), "shared").unwrap_err();
        assert_eq!(
            e.to_string(),
            "SLIPWAY_ISOLATION: unknown isolation level \"chroot\"; expected one of none, cgroup, docker, microvm, vm, instance"
        );
    }
}
