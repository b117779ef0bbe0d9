//! The Slipway manager: every runner of a `config.toml` brought to life and fed with jobs.
//!
//! - [`manager`]: [`Manager::run`], what `slipway run` runs: runners, sources, status server,
//!   policy reloads, drain and stop.
//! - [`runner`]: one `[[runners]]` entry started — plugin process, taskscaler, SSH connections
//!   ([`runner::pool`]; [`runner::localhost`] for runners whose jobs run on this machine), slot
//!   subtrees ([`runner::subtrees`]), spot notices ([`runner::preemption`]) and the job defaults
//!   it adds ([`runner::JobDefaults`]).
//! - [`lifecycle`]: one job's life on a runner — admit, reserve, acquire, execute, release — the
//!   same for every source ([`lifecycle::request`]: a job's CPU, memory and GPU request).
//! - [`source`]: where jobs come from: the embedded queue, GitLab, a local pipeline.
//! - [`limits`]: a runner's `limit` within `concurrent`, for every source.
//! - [`costs`]: what a runner's instances cost and what its jobs used of them.
//! - [`shutdown`]: the graceful drain (SIGQUIT) and the stop (SIGTERM, SIGINT).
//! - `archive`: which collected paths an archive keeps, zip to tar on the scratch disk, the
//!   compression and `*_ATTEMPTS` a job asks for (the cache stages and GitLab's artifacts).
//! - `chain`: an error and its causes on one line, as logs and traces show them.
//! - [`status`], [`server`]: the live status and the HTTP endpoint (`/metrics`, `/`,
//!   `/api/v1/status`).
//!
//! Nothing here prints to the terminal: the `slipway` binary does.

mod archive;
mod chain;
pub mod costs;
pub mod lifecycle;
pub mod limits;
pub mod manager;
pub mod runner;
pub mod server;
pub mod shutdown;
pub mod source;
pub mod status;

pub use manager::Manager;
