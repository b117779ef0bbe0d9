//! Executors: turn a prepared environment into a running job.
//!
//! - [`artifact_paths`]: artifact and cache paths expanded and made relative to the project
//!   directory, as GitLab Runner reads them.
//! - [`cache`]: GitLab's local cache, restored before a job's script and saved after it.
//! - [`cgroup`]: the `cgroup` isolation level — the slot's cgroup around every job.
//! - [`data`]: a job's dependencies, cache and artifacts moved by the job helper where the
//!   job runs.
//! - [`executor`]: the [`Executor`] trait every executor implements: one job on its slot.
//! - [`host`]: where scripts run — an instance over SSH (GitLab's `instance` executor: bash
//!   steps on an autoscaled instance), this machine, a container.
//! - [`job`]: a job's steps, artifacts, timeout and cancel on any host.
//! - [`docker`]: the `docker` and `docker-autoscaler` executors — a container per job, services
//!   by alias on a per-job network, everything removed after the job.
//! - [`custom`]: GitLab's `custom` executor — user-supplied driver executables per stage.
//! - [`nesting`]: the `microvm` and `vm` levels — a VM per job from the instance's nesting
//!   daemon, kept as a snapshot when the job asks.
//! - [`plugin`]: the `plugin` executor — stages run where an executor plugin puts them.
//! - [`isolation`]: the isolation level a job gets, within what its runner allows.
//! - [`sources`]: a job's sources fetched on the host its steps run on.
//! - [`tarball`]: tar streams into and out of a job's directory, in memory or in a file.

pub mod artifact_paths;
pub mod cache;
pub mod cgroup;
pub mod custom;
pub mod data;
pub mod docker;
pub mod executor;
pub mod host;
pub mod isolation;
pub mod job;
pub mod nesting;
pub mod plugin;
pub mod script;
pub mod sources;
pub mod tarball;

pub use custom::{ConfigExecOutput, CustomConfig, CustomError, CustomExecutor};
pub use data::{Collect, Helper, HostData};
pub use docker::{
    DockerConfig, DockerExecutor, DockerExecutorError, DockerHost, PullPolicy, dial_stdio_transport,
};
pub use executor::{Executor, Steps};
pub use host::{Host, HostError, LocalHost, SshHost};
pub use isolation::{Isolation, IsolationPolicy};
pub use job::{CollectedArtifacts, JobRunner, JobSlot, RunResult};
pub use nesting::{GuestHost, NestingConfig, NestingExecutor, VmStartSink};
pub use plugin::PluginExecutor;
pub use sources::HostSources;
pub use tarball::{Tarball, scratch_file};
