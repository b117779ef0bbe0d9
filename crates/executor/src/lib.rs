//! Executors: turn a prepared environment into a running job.
//!
//! - [`instance`]: GitLab's `instance` executor — bash over SSH on an autoscaled instance.
//! - [`trace`]: job output with masked variables removed, also across chunk boundaries.
//! - [`outcome`]: how a job ended, in GitLab's failure-reason vocabulary.

pub mod instance;
pub mod outcome;
pub mod script;
pub mod trace;

pub use instance::{InstanceExecutor, RunContext, RunResult};
pub use outcome::{FailureReason, JobOutcome};
pub use trace::{Masker, Trace};
