//! The job helper: the stages of a job that are not its script, run where the job runs (an
//! instance's shell, the build container, a VM's guest), so that no job data crosses the
//! manager. It reads one stage's [`DataPlan`](slipway_job::data::DataPlan) on its stdin — the
//! job token and pre-signed URLs never reach a command line — and reports in the job's trace.
//!
//! - [`stages`]: a plan's steps: dependencies' artifacts downloaded and unpacked within the
//!   runner's limits, the cache restored and saved through pre-signed URLs, artifacts archived
//!   and uploaded to GitLab.
//! - [`http`]: blocking HTTP with rustls; the job token never follows a redirect elsewhere.
//! - [`error`]: the helper's error, [`HelperError`].

pub mod error;
pub mod http;
pub mod stages;

pub use error::HelperError;
pub use stages::{Ending, Stage};
