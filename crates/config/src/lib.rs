//! GitLab Runner's `config.toml` as Slipway reads it: one module per section, each with its
//! keys and defaults, its checks and its conversion into what the rest of Slipway runs
//! (taskscaler, fleeting connector, nesting, isolation policy).
//!
//! Every problem is reported in one pass ([`check`]): a wrong type or value is an error naming
//! file, line and key; an unknown key, or a key Slipway reads but does not act on, is a
//! warning. Secrets (`token`, `password`, `[runners.cache.s3]` and the like) never appear in a
//! message.
//!
//! Modules, a section each, leaves first:
//! - `problem`: [`Problem`]s located by line and key, the report each section writes to.
//! - `check`: the driver: [`check`], [`parse`], [`load`]; it imports the sections, none of
//!   them imports it.
//! - `global` ([`Config`]): the top level; `runner` ([`RunnerConfig`]): one `[[runners]]`;
//!   `executor` ([`Executor`]); `instance`, `custom`, `plugin`, `cache`, `archives`: their
//!   sections.
//! - `autoscaler`, `connector`, `policy`, `shape`, `price`, `vm_isolation`: the
//!   `[runners.autoscaler]` family.
//! - `status_page`, `embedded` (the config `slipway exec` uses without `-c`), `secrets` (which
//!   keys hold secrets, masked out of messages), `de` (Go durations and TOML datetimes).

mod archives;
mod autoscaler;
mod cache;
mod check;
mod connector;
mod custom;
mod de;
mod embedded;
mod executor;
mod global;
mod instance;
mod plugin;
mod policy;
mod price;
mod problem;
mod runner;
mod secrets;
mod shape;
mod status_page;
#[cfg(test)]
mod testing;
mod vm_isolation;

pub use archives::ArchivesConfig;
pub use autoscaler::{AutoscalerConfig, ScaleThrottleConfig, StateStorageConfig};
pub use cache::CacheConfig;
pub use check::{CheckOptions, Checked, ConfigError, Loaded, check, load, parse};
pub use connector::{ConnectorConfigError, ConnectorConfigToml};
pub use custom::CustomBuildDirConfig;
pub use embedded::EMBEDDED;
pub use executor::{Executor, UnknownExecutor};
pub use global::{Config, certs_dir, queue_dir, state_dir, state_dir_setting, work_dir};
pub use instance::InstanceConfig;
pub use plugin::ExecutorPluginConfig;
pub use policy::PolicyConfig;
pub use price::PriceValue;
pub use problem::{Problem, Seg};
pub use runner::{FetchSources, JobData, RunnerConfig};
pub use shape::{Amount, ShapeConfig};
pub use status_page::{MAX_HISTORY_SAMPLES, StatusPageConfig};
pub use vm_isolation::VmIsolationConfig;
