//! Executors: turn a prepared environment into a running job.
//!
//! - [`host`]: where scripts run — an instance over SSH, this machine, a container.
//! - [`job`]: a job's steps, artifacts, timeout and cancel on any host.
//! - [`instance`]: GitLab's `instance` executor — bash over SSH on an autoscaled instance.
//! - [`trace`]: job output with masked variables removed, also across chunk boundaries.
//! - [`outcome`]: how a job ended, in GitLab's failure-reason vocabulary.

pub mod host;
pub mod instance;
pub mod job;
pub mod outcome;
pub mod script;
pub mod trace;

pub use host::{Host, LocalHost, SshHost};
pub use instance::{InstanceExecutor, RunContext};
pub use job::{JobContext, JobRunner, RunResult};
pub use outcome::{FailureReason, JobOutcome};
pub use trace::{Masker, Trace};
