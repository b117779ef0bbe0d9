//! A job's sources fetched where the job runs (GitLab Runner's `get_sources` stage), with
//! the manager as the fallback where that host has no git.
//!
//! The source (GitLab) knows how to fetch; the executor knows where the project directory is
//! and how to run a script there. [`HostSources`] joins the two: it renders the fetch as a bash
//! body for the job's [`JobDirs`], with its secrets (the job token, TLS keys) kept apart for the
//! script's stdin, so they never reach a command line on the host.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::script::JobDirs;
use crate::tarball::Tarball;
use slipway_job::trace::Trace;

/// The exit status of a fetch script that found no git on the host: the manager fetches
/// instead, on a runner that allows it (`fetch_sources = "instance_or_manager"`).
pub const NO_GIT: u32 = 97;
/// The exit status of a fetch script whose host cannot connect to the repository's server
/// (a network that reaches the manager but not GitLab): the manager fetches instead, on a
/// runner that allows it.
pub const UNREACHABLE: u32 = 98;

/// How a job's sources are fetched on the host its steps run on.
#[async_trait]
pub trait HostSources: Send + Sync + Debug {
    /// The bash body of the `get_sources` stage for the job's directories: it exits with
    /// [`NO_GIT`] before touching anything when git is missing, with [`UNREACHABLE`] when the
    /// server cannot be connected to, writes git's progress to
    /// stderr, and prints the paths git tracks, NUL-separated, on stdout. It holds no
    /// secret: it may be seen in the host's process list.
    fn script(&self, dirs: &JobDirs) -> String;

    /// What the body reads on its stdin: the settings that carry secrets (places on the host
    /// come from the body's own variables).
    fn stdin(&self) -> Vec<u8>;

    /// How many times a failed fetch is tried (`GET_SOURCES_ATTEMPTS`).
    fn attempts(&self) -> u32;

    /// Where the working copy lives under the slot's directory when it is kept between jobs
    /// (`GIT_STRATEGY: fetch`: `<namespace>/<project>`, as GitLab Runner places it); `None`:
    /// the job's own directory, removed after the job.
    fn kept_path(&self) -> Option<String>;

    /// The sources fetched on the manager, as a tar stream to unpack (the host has no git).
    /// `Err` carries a message already in the trace.
    async fn on_manager(
        &self,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Option<Tarball>, String>;

    /// Keep the paths git tracks, as the script printed them (NUL-separated).
    fn set_tracked(&self, listed: &[u8]);

    /// The paths git tracks in the fetched sources (what `artifacts:untracked` leaves out),
    /// however they were fetched; empty before.
    fn tracked(&self) -> Arc<BTreeSet<String>>;
}
