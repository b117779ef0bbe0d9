//! The manager's live status: what the status page, `/api/v1/status` and `slipway status` show.
//!
//! - [`model`]: the fleet, its jobs and history as `/api/v1/status` answers them.
//! - [`board`]: a runner's jobs as they wait, run and end (and the job metrics they move).
//! - [`history`]: the last hours, a ring of samples.
//! - [`page`]: the HTML page, rendered on the server and refreshed by a little JavaScript.
//! - [`summary`]: the same fleet as text for `slipway status`.
//! - [`metrics`]: job metrics under GitLab Runner's names.
//! - [`format`]: short forms of durations and sizes.

pub mod board;
pub mod format;
pub mod history;
pub mod metrics;
pub mod model;
pub mod page;
pub mod summary;

pub use board::{BoardGuard, Ending, JobBoard, JobInfo};
pub use history::{History, Sample};
pub use metrics::JobMetrics;
pub use model::FleetStatus;
