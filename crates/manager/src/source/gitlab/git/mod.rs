//! A GitLab job's sources: its repository fetched on the manager and handed to the job as a tar
//! stream unpacked into its project directory before the first step.
//!
//! Fetching on the manager means job images and instances need no git (GitLab Runner needs a
//! helper image for that), and the job token never reaches the job's `.git/config`: it travels
//! only in an `http.extraHeader` given to git through its environment, not on its command line.
//!
//! `GIT_STRATEGY`: `clone` fetches into a fresh repository; `fetch` (the default when the
//! project allows it) updates a working copy kept per runner and project, so only new objects
//! cross the network; `none` skips the sources. `GIT_DEPTH` overrides the payload's `depth`;
//! `GET_SOURCES_ATTEMPTS` retries a failed fetch. Submodules follow `GIT_SUBMODULE_STRATEGY`
//! (relative URLs resolve against the project's and get the job token); LFS objects are
//! fetched with `git lfs pull` through GitLab's LFS batch API.
//!
//! The token and the TLS files (`tls-ca-file`, ...) are scoped to the project's server
//! ([`access`]). On the manager, a submodule or LFS store elsewhere is not fetched at all (a
//! warning says so): what a repository names is its author's choice, and the manager's network
//! position (its loopback services, a cloud's metadata address) is not theirs to probe.
//!
//! Where the job runs is where its sources are fetched by default ([`HostFetch`]); the manager
//! steps in for a host without git 2.31+ or out of the server's reach only when the runner says
//! `fetch_sources = "instance_or_manager"` ([`GitSources::with_manager_fallback`]).

mod access;
mod checkout;
mod on_host;
mod options;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use slipway_executor::Tarball;
use slipway_gitlab::TlsFiles;
use slipway_job::Trace;
use slipway_job::{GitStrategy as Strategy, JobResponse};
use tokio_util::sync::CancellationToken;

use crate::archive::attempts_of;
use access::Remote;
use checkout::Checkout;
pub(super) use on_host::HostFetch;
use options::{depth_of, submodules_of};

/// A job's sources, ready to unpack.
#[derive(Debug)]
pub struct Sources {
    /// Tar stream of the working tree with its `.git`, in a file.
    pub tar: Tarball,
    /// Paths git tracks (to tell untracked artifacts apart).
    pub tracked: BTreeSet<String>,
}

/// How a job's `GIT_*` variables ask for its sources.
struct Fetch {
    /// `GIT_STRATEGY: fetch`: a working copy kept between jobs.
    reuse: bool,
    depth: u32,
    submodules: options::Submodules,
    attempts: u32,
}

/// The job's fetch, its variables checked; `None` when it has no repository or `GIT_STRATEGY`
/// is `none`. `Err` carries a message for the job's failure (already in the trace).
fn fetch_of(job: &JobResponse, trace: &mut Trace) -> Result<Option<Fetch>, String> {
    if job.git_info.repo_url.trim().is_empty() {
        return Ok(None);
    }
    let strategy = match job.git_strategy() {
        Ok(s) => s,
        Err(msg) => return failed(trace, msg),
    };
    if strategy == Strategy::None {
        trace.message("Skipping Git repository setup");
        return Ok(None);
    }
    let depth = match depth_of(job) {
        Ok(d) => d,
        Err(msg) => return failed(trace, msg),
    };
    let submodules = match submodules_of(job, depth) {
        Ok(s) => s,
        Err(msg) => return failed(trace, msg),
    };
    Ok(Some(Fetch {
        reuse: strategy == Strategy::Fetch,
        depth,
        submodules,
        attempts: attempts_of(job, "GET_SOURCES_ATTEMPTS"),
    }))
}

/// `msg` as the job's error line, and as the error.
fn failed<T>(trace: &mut Trace, msg: String) -> Result<T, String> {
    trace.message(&format!("ERROR: {msg}"));
    Err(msg)
}

/// Working copies kept for `fetch`, one lock each so two jobs never share one at once.
#[derive(Debug)]
pub struct GitSources {
    root: PathBuf,
    /// Set once the root exists with its mode.
    root_ready: tokio::sync::OnceCell<()>,
    /// `clone_url`: fetch from this scheme and host instead of the payload's.
    clone_url: Option<String>,
    /// TLS towards the project's server.
    tls: TlsFiles,
    /// Where the sources' tar files go (the system's temporary directory when `None`).
    scratch: Option<PathBuf>,
    /// The manager may fetch for a job whose host cannot (`instance_or_manager`).
    manager_fallback: bool,
    locks: std::sync::Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl GitSources {
    /// Working copies under `root` (created on first use, private: they hold source code).
    pub fn new(root: impl Into<PathBuf>, clone_url: Option<String>, tls: TlsFiles) -> Self {
        Self {
            root: root.into(),
            clone_url: clone_url.filter(|u| !u.trim().is_empty()),
            tls,
            scratch: None,
            manager_fallback: false,
            root_ready: tokio::sync::OnceCell::new(),
            locks: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// These working copies with their tar files in `scratch`.
    pub fn with_scratch(mut self, scratch: Option<PathBuf>) -> Self {
        self.scratch = scratch;
        self
    }

    /// Whether the manager fetches for a job whose host has no git 2.31+ or cannot reach the
    /// server (`fetch_sources = "instance_or_manager"`); without it (the default) such a job
    /// fails, saying why.
    pub fn with_manager_fallback(mut self, allowed: bool) -> Self {
        self.manager_fallback = allowed;
        self
    }

    /// The job's sources, `None` when it has no repository or `GIT_STRATEGY` is `none`.
    /// `Err` carries a message for the job's failure (already in the trace).
    pub async fn get(
        &self,
        job: &JobResponse,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Option<Sources>, String> {
        let Some(f) = fetch_of(job, trace)? else {
            return Ok(None);
        };
        let mut last = String::new();
        for attempt in 1..=f.attempts {
            if attempt > 1 {
                trace.message(&format!(
                    "Retrying to get the sources (attempt {attempt} of {})",
                    f.attempts
                ));
            }
            let result = tokio::select! {
                r = self.get_once(job, f.reuse, f.depth, &f.submodules, trace) => r,
                _ = cancel.cancelled() => return failed(trace, "canceled while getting the sources".into()),
            };
            match result {
                Ok(s) => return Ok(Some(s)),
                Err(msg) => last = msg,
            }
        }
        failed(trace, format!("getting the sources failed: {last}"))
    }

    /// The job's sources as a fetch to run where the job runs (the manager's [`Self::get`] is
    /// its fallback when allowed); `None` when it has no repository or `GIT_STRATEGY` is `none`. Its
    /// variables are checked now: `Err` carries a message for the job's failure (already in
    /// the trace).
    pub(in crate::source::gitlab) async fn on_host(
        self: &Arc<Self>,
        job: &JobResponse,
        trace: &mut Trace,
    ) -> Result<Option<HostFetch>, String> {
        let Some(f) = fetch_of(job, trace)? else {
            return Ok(None);
        };
        match HostFetch::new(
            self.clone(),
            job,
            f.reuse,
            f.depth,
            f.submodules,
            f.attempts,
        )
        .await
        {
            Ok(plan) => Ok(Some(plan)),
            Err(msg) => failed(trace, msg),
        }
    }

    /// Creates the root (and its `tmp`), readable by its owner only; once per runner.
    async fn make_root(&self) -> Result<(), String> {
        self.root_ready
            .get_or_try_init(|| async {
                let tmp = self.root.join("tmp");
                // Private from creation on; an existing root is narrowed too.
                tokio::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&tmp)
                    .await
                    .map_err(|e| format!("creating {}: {e}", tmp.display()))?;
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt as _;
                    let private = std::fs::Permissions::from_mode(0o700);
                    let _ = tokio::fs::set_permissions(&self.root, private).await;
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    async fn get_once(
        &self,
        job: &JobResponse,
        fetch: bool,
        depth: u32,
        submodules: &options::Submodules,
        trace: &mut Trace,
    ) -> Result<Sources, String> {
        let remote = Remote::of(
            job,
            self.clone_url.as_deref(),
            &self.tls,
            submodules.force_https,
        );
        match depth {
            0 => trace.message("Fetching changes..."),
            d => trace.message(&format!("Fetching changes with git depth set to {d}...")),
        }
        if fetch {
            let dir = self.root.join(match job.job_info.project_id {
                0 => format!("job-{}", job.id),
                p => format!("project-{p}"),
            });
            let lock = {
                let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
                locks.entry(dir.clone()).or_default().clone()
            };
            let _held = lock.lock().await;
            self.make_root().await?;
            let result = Checkout {
                job,
                dir: &dir,
                depth,
                reuse: true,
                remote: &remote,
                submodules,
                scratch: self.scratch.as_deref(),
            }
            .run(trace)
            .await;
            if result.is_err() {
                // A broken working copy is not reused: the next job starts afresh.
                let _ = tokio::fs::remove_dir_all(&dir).await;
            }
            return result;
        }
        let tmp = self.root.join("tmp");
        self.make_root().await?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("job-{}-", job.id))
            .tempdir_in(&tmp)
            .map_err(|e| format!("creating a directory in {}: {e}", tmp.display()))?;
        let result = Checkout {
            job,
            dir: dir.path(),
            depth,
            reuse: false,
            remote: &remote,
            submodules,
            scratch: self.scratch.as_deref(),
        }
        .run(trace)
        .await;
        let path = dir.keep();
        // Removing a whole tree blocks: off the runtime's threads.
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(path)).await;
        result
    }
}
