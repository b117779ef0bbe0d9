//! The Slipway manager as a library: the `slipway` binary is a thin CLI over these modules.
//!
//! - [`config`]: GitLab Runner's `config.toml`, with located errors and warnings.
//! - [`runner`]: one `[[runners]]` entry started — plugin process, taskscaler, SSH connections.
//! - [`exec`]: `slipway exec`, a local pipeline through the whole stack.
//! - [`progress`]: progress on a terminal: `exec`'s live line per running job, build step spinners.
//! - [`lifecycle`]: one job's life on a runner (admit, reserve, acquire, execute, release), the same for every source.
//! - [`shutdown`]: the manager's graceful drain (SIGQUIT) and stop (SIGTERM, SIGINT).
//! - [`consume`]: `slipway run`'s job source, the embedded queue, and its restart recovery.
//! - [`git`]: a GitLab job's repository, fetched on the manager and shipped to the job.
//! - [`gitlab`]: `slipway run`'s GitLab job source (runners with a `url` and a `token`).
//! - [`request`]: a job's CPU, memory and GPU request from its variables.
//! - [`vm`]: `slipway nesting`, `slipway image build` and `slipway debug`.
//! - [`register`]: `slipway register`, GitLab's registration flows appending to config.toml.
//! - [`status`]: the live status (`/api/v1/status`, the status page) over the runners.
//! - [`plugin_check`]: `slipway plugin check`, a fleeting plugin's conformance check.

pub use slipway_config as config;
pub mod consume;
pub mod exec;
pub mod git;
pub mod gitlab;
pub mod lifecycle;
pub mod local;
pub mod localhost;
pub mod plugin_check;
pub mod pool;
pub mod progress;
pub mod register;
pub mod request;
pub mod runner;
pub mod server;
pub mod shutdown;
pub mod status;
pub mod vm;
