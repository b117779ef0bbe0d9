//! One fetch into a working copy: init or reuse, fetch, check out, clean, submodules, LFS,
//! then the tar stream the job unpacks.

use std::collections::BTreeSet;
use std::path::Path;

use slipway_executor::Tarball;
use slipway_job::JobResponse;
use slipway_job::Trace;
use tokio::process::Command;

use super::Sources;
use super::access::Remote;
use super::options::{
    SubmoduleStrategy, Submodules, clean_flags, fetch_flags, lfs_skipped, refspecs,
};

/// Protocols the job's own repository may use (the URL comes from GitLab).
pub(super) const ALLOW_PROTOCOL: &str = "http:https:git:ssh:file";
/// Protocols a submodule may use: what `.gitmodules` names is the project's to choose, so
/// nothing that reads the manager's files (`file`) or uses its SSH identity (`ssh`).
pub(super) const SUBMODULE_PROTOCOL: &str = "http:https:git";

/// What one checkout works with.
pub(super) struct Checkout<'a> {
    /// The job.
    pub job: &'a JobResponse,
    /// The working copy.
    pub dir: &'a Path,
    /// Fetch depth (0: all history).
    pub depth: u32,
    /// Whether the working copy is kept between jobs (`GIT_STRATEGY: fetch`).
    pub reuse: bool,
    /// Where from, with what credentials.
    pub remote: &'a Remote,
    /// Submodule settings.
    pub submodules: &'a Submodules,
    /// Where the tar file goes.
    pub scratch: Option<&'a Path>,
}

impl Checkout<'_> {
    /// A git command in the working copy with the remote's settings.
    fn git(&self, args: &[&str]) -> Command {
        let mut c = Command::new("git");
        // No background gc or maintenance outliving a command: the next git command, the
        // stale-lock sweep or the tar would race it.
        c.args([
            "-c",
            "gc.autoDetach=false",
            "-c",
            "maintenance.autoDetach=false",
        ])
        .arg("-C")
        .arg(self.dir);
        if LFS.get().copied().unwrap_or(false) {
            // What `git lfs install` would write to a global config, for these commands only.
            c.args([
                "-c",
                "filter.lfs.process=git-lfs filter-process",
                "-c",
                "filter.lfs.smudge=git-lfs smudge -- %f",
                "-c",
                "filter.lfs.clean=git-lfs clean -- %f",
                "-c",
                "filter.lfs.required=true",
            ]);
        }
        c.args(args);
        // Only real transports: `ext::` and friends would run commands on the manager.
        c.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ALLOW_PROTOCOL", ALLOW_PROTOCOL)
            // LFS objects are fetched by `git lfs pull`, after the checkout.
            .env("GIT_LFS_SKIP_SMUDGE", "1")
            .kill_on_drop(true);
        self.remote.apply(&mut c);
        c
    }

    /// Init or reuse the working copy, fetch, check out the job's commit, clean, fetch its
    /// submodules and LFS objects, and tar it.
    pub async fn run(&self, trace: &mut Trace) -> Result<Sources, String> {
        let job = self.job;
        let g = &job.git_info;
        lfs_installed().await;
        let fresh = !self.dir.join(".git").exists();
        if !fresh {
            // A git killed mid-fetch (a canceled job) leaves lock files that fail the next one.
            remove_stale_locks(&self.dir.join(".git")).await;
        }
        if fresh {
            tokio::fs::create_dir_all(self.dir)
                .await
                .map_err(|e| format!("creating {}: {e}", self.dir.display()))?;
            let object_format = match g.repo_object_format.as_str() {
                "" => "sha1",
                f => f,
            };
            let init = format!("--object-format={object_format}");
            run(self.git(&["init", "-q", &init]), trace, "git init").await?;
            trace.message("Created fresh repository.");
        } else if self.reuse {
            trace.message("Reinitialized existing Git repository");
        }
        // The remote's URL never holds the token (the job may read its .git/config).
        let _ = self.git(&["remote", "remove", "origin"]).output().await;
        run(
            self.git(&["remote", "add", "origin", &self.remote.url]),
            trace,
            "git remote add",
        )
        .await?;

        let mut fetch = self.git(&["fetch"]);
        fetch.args(fetch_flags(job)?);
        if self.depth > 0 {
            fetch.arg(format!("--depth={}", self.depth));
        }
        fetch.arg("origin").args(refspecs(job));
        run(fetch, trace, "fetching the repository").await?;

        let target = if g.sha.is_empty() {
            "FETCH_HEAD".to_string()
        } else {
            g.sha.clone()
        };
        trace.message(&format!(
            "Checking out {} as detached HEAD (ref is {})...",
            target.chars().take(8).collect::<String>(),
            g.git_ref
        ));
        let checkout = !job
            .variable("GIT_CHECKOUT")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"));
        if checkout {
            let args = ["checkout", "-f", "-q", "--detach", &target];
            run(self.git(&args), trace, "checking out the commit").await?;
            if self.reuse && !fresh {
                let flags = clean_flags(job)?;
                if !flags.is_empty() {
                    let mut clean = self.git(&["clean"]);
                    clean.args(&flags);
                    run(clean, trace, "git clean").await?;
                }
            }
            self.lfs(trace).await?;
        } else {
            trace.message("Skipping Git checkout");
        }
        if checkout && self.submodules.strategy != SubmoduleStrategy::None {
            self.update_submodules(fresh, trace).await?;
        } else {
            trace.message("Skipping Git submodules setup");
        }
        self.tar().await
    }

    /// `git submodule sync` and `update --init` as GitLab Runner runs them, then each
    /// submodule cleaned (a reused working copy) and its LFS objects fetched.
    async fn update_submodules(&self, fresh: bool, trace: &mut Trace) -> Result<(), String> {
        let s = self.submodules;
        let recursive = s.recursive_flag();
        trace.message(match recursive {
            Some(_) => "Updating/initializing submodules recursively...",
            None => "Updating/initializing submodules...",
        });
        let sub = |args: &[&str]| {
            let mut c = self.git(&["submodule"]);
            c.args(args).env("GIT_ALLOW_PROTOCOL", SUBMODULE_PROTOCOL);
            c
        };
        let paths = |c: &mut Command| {
            if !s.paths.is_empty() {
                c.arg("--").args(&s.paths);
            }
        };
        let mut init = sub(&["init"]);
        paths(&mut init);
        run(init, trace, "git submodule init").await?;
        let mut sync = sub(&["sync"]);
        sync.args(recursive);
        paths(&mut sync);
        run(sync, trace, "git submodule sync").await?;
        let mut update = sub(&["update", "--init"]);
        update.args(recursive);
        if s.depth > 0 {
            update.arg(format!("--depth={}", s.depth));
        }
        update.args(&s.update_flags);
        paths(&mut update);
        run(update, trace, "fetching the submodules").await?;
        if self.reuse && !fresh {
            let flags = clean_flags(self.job)?;
            if !flags.is_empty() {
                let cmd = format!("git clean {} && git reset --hard -q", flags.join(" "));
                let mut each = sub(&["foreach", "--quiet"]);
                each.args(recursive).arg(cmd);
                run(each, trace, "cleaning the submodules").await?;
            }
        }
        if !lfs_skipped(self.job) && lfs_installed().await {
            let mut each = sub(&["foreach", "--quiet"]);
            each.args(recursive)
                .arg(
                    "git -c 'filter.lfs.process=git-lfs filter-process' \
                     -c filter.lfs.required=true lfs pull",
                )
                .env_remove("GIT_LFS_SKIP_SMUDGE");
            run(each, trace, "fetching the submodules' LFS objects").await?;
        }
        Ok(())
    }

    /// The LFS objects of the checked-out commit (`git lfs pull`), unless
    /// `GIT_LFS_SKIP_SMUDGE` asks for pointers. Without git-lfs on the manager a repository
    /// with LFS files keeps its pointers, and the trace says so.
    async fn lfs(&self, trace: &mut Trace) -> Result<(), String> {
        if lfs_skipped(self.job) {
            return Ok(());
        }
        if !lfs_installed().await {
            let attributes = tokio::fs::read_to_string(self.dir.join(".gitattributes"))
                .await
                .unwrap_or_default();
            if attributes.contains("filter=lfs") {
                trace.message(
                    "WARNING: the repository has LFS files but git-lfs is not installed on the \
                     manager; they stay pointer files",
                );
            }
            return Ok(());
        }
        let mut pull = self.git(&["lfs", "pull"]);
        pull.env_remove("GIT_LFS_SKIP_SMUDGE");
        run(pull, trace, "fetching LFS objects").await
    }

    /// The working tree with its `.git` as a tar stream, and the paths git tracks.
    async fn tar(&self) -> Result<Sources, String> {
        let listed = self
            .git(&["ls-files", "--recurse-submodules", "-z"])
            .output()
            .await
            .map_err(|e| format!("git ls-files: {e}"))?;
        let tracked = tracked_of(&listed.stdout);
        // The working copy's own mode (a private temporary directory) must not become the
        // job's project directory's: a job image's non-root user still enters it.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let _ =
                tokio::fs::set_permissions(self.dir, std::fs::Permissions::from_mode(0o755)).await;
        }
        // Into a file, streamed from there to the job: memory does not grow with the
        // repository (GitLab Runner fetches where the job runs; see `GitSources`).
        let path = slipway_executor::scratch_file(
            self.scratch,
            &format!("sources-{}-", self.job.id),
            ".tar",
        )
        .map_err(|e| format!("creating a file for the sources: {e}"))?;
        // Owned by root in the archive: a job image's root user must not find a stranger's
        // uid (git refuses "dubious ownership"), whoever runs the manager.
        let tar = Command::new("tar")
            .args(["--owner=0", "--group=0", "--numeric-owner"])
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .arg("-C")
            .arg(self.dir)
            .arg(".")
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("tar of the sources: {e}"))?;
        if !tar.status.success() {
            return Err(format!(
                "tar of the sources: {}",
                String::from_utf8_lossy(&tar.stderr).trim()
            ));
        }
        Ok(Sources {
            tar: Tarball::File(path),
            tracked,
        })
    }
}

/// The paths of `git ls-files -z` output.
pub(super) fn tracked_of(listed: &[u8]) -> BTreeSet<String> {
    listed
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// Whether `git lfs` runs here, asked once.
static LFS: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();

/// Whether `git lfs` runs here.
async fn lfs_installed() -> bool {
    *LFS.get_or_init(lfs_version).await
}

async fn lfs_version() -> bool {
    Command::new("git")
        .args(["lfs", "version"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// Remove `*.lock` files git leaves when killed, at the top of `.git` and under `refs/`.
async fn remove_stale_locks(git_dir: &Path) {
    let mut dirs = vec![git_dir.to_path_buf()];
    let mut first = true;
    while let Some(dir) = dirs.pop() {
        let Ok(mut entries) = tokio::fs::read_dir(&dir).await else {
            continue;
        };
        while let Ok(Some(e)) = entries.next_entry().await {
            let path = e.path();
            let is_dir = e.file_type().await.is_ok_and(|t| t.is_dir());
            if is_dir {
                // Only refs/ is walked below the top: objects/ can be huge.
                if !first || path.file_name().is_some_and(|n| n == "refs") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|x| x == "lock") {
                let _ = tokio::fs::remove_file(&path).await;
            }
        }
        first = false;
    }
}

/// Run a git command; its stderr goes to the trace (masked there); on failure, `Err` says
/// `what` failed and git's last words.
async fn run(mut cmd: Command, trace: &mut Trace, what: &str) -> Result<(), String> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("running git: {e} (is git installed on the manager?)"))?;
    if !out.stderr.is_empty() {
        trace.write(&out.stderr);
    }
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().map(str::trim).find(|l| !l.is_empty());
        Err(match last {
            Some(last) => format!("{what}: {last}{}", hint(&stderr)),
            None => format!("{what}: git exited with {}", out.status),
        })
    }
}

/// Words of git about access, and what they mean for an operator (shared with the fetch
/// on the job's host, which renders them as bash).
pub(super) const HINTS: [(&[&str], &str); 2] = [
    (
        &[
            "could not read Username",
            "Authentication failed",
            "HTTP Basic: Access denied",
        ],
        " (the server refused the job token, or the repository needs credentials the job \
         does not have)",
    ),
    (
        &["certificate verification failed", "SSL certificate problem"],
        " (the server's certificate is not trusted: set the runner's tls-ca-file)",
    ),
];

/// What git's words mean for an operator, when they are about access.
fn hint(stderr: &str) -> &'static str {
    HINTS
        .iter()
        .find(|(words, _)| words.iter().any(|w| stderr.contains(w)))
        .map_or("", |(_, hint)| hint)
}
