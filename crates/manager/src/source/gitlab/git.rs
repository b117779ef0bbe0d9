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
//! `GET_SOURCES_ATTEMPTS` retries a failed fetch. Submodules and LFS are not fetched yet.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use slipway_executor::Trace;
use slipway_jobs::{GitStrategy as Strategy, JobResponse};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

/// A job's sources, ready to unpack.
#[derive(Debug, Default)]
pub struct Sources {
    /// Tar stream of the working tree with its `.git`.
    pub tar: Vec<u8>,
    /// Paths git tracks (to tell untracked artifacts apart).
    pub tracked: BTreeSet<String>,
}

/// Working copies kept for `fetch`, one lock each so two jobs never share one at once.
#[derive(Debug)]
pub struct GitSources {
    root: PathBuf,
    /// Set once the root exists with its mode.
    root_ready: tokio::sync::OnceCell<()>,
    /// `clone_url`: fetch from this scheme and host instead of the payload's.
    clone_url: Option<String>,
    locks: std::sync::Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

/// A URL without its `user:password@` part, and that part.
fn split_credentials(url: &str) -> (String, Option<(String, String)>) {
    let Some(scheme_end) = url.find("://") else {
        return (url.to_string(), None);
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_string(), None);
    };
    let userinfo = &rest[..at];
    let clean = format!("{}{}", &url[..scheme_end + 3], &rest[at + 1..]);
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    (clean, Some((user.to_string(), pass.to_string())))
}

/// `url` with its scheme and host (and any path prefix) taken from `base`, as GitLab Runner
/// applies `clone_url`: `https://gitlab.example.com/g/p.git` with `http://10.0.0.5:8080`
/// becomes `http://10.0.0.5:8080/g/p.git`.
fn with_base(url: &str, base: &str) -> String {
    let path = url
        .find("://")
        .and_then(|i| url[i + 3..].find('/').map(|j| &url[i + 3 + j..]))
        .unwrap_or("");
    format!("{}{path}", base.trim_end_matches('/'))
}

/// `refs` to fetch: the payload's refspecs, else the job's branch or tag.
fn refspecs(job: &JobResponse) -> Vec<String> {
    let g = &job.git_info;
    if !g.refspecs.is_empty() {
        return g.refspecs.clone();
    }
    if g.git_ref.is_empty() {
        return Vec::new();
    }
    if g.ref_type == "tag" {
        vec![format!("+refs/tags/{0}:refs/tags/{0}", g.git_ref)]
    } else {
        vec![format!(
            "+refs/heads/{0}:refs/remotes/origin/{0}",
            g.git_ref
        )]
    }
}

/// `GIT_CLEAN_FLAGS` (GitLab's default `-ffdx`; `none`: no clean). Only options: the flags go to
/// git on the manager, so nothing else is taken.
fn clean_flags(job: &JobResponse) -> Result<Vec<String>, String> {
    let value = match job.variable("GIT_CLEAN_FLAGS").map(str::trim) {
        None | Some("") => "-ffdx",
        Some("none") => return Ok(Vec::new()),
        Some(v) => v,
    };
    let mut flags: Vec<String> = value.split_whitespace().map(String::from).collect();
    if let Some(bad) = flags.iter().find(|f| !f.starts_with('-')) {
        return Err(format!(
            "GIT_CLEAN_FLAGS {value:?}: {bad:?} is not an option of git clean"
        ));
    }
    flags.push("-q".into());
    Ok(flags)
}

fn depth_of(job: &JobResponse) -> Result<u32, String> {
    match job.variable("GIT_DEPTH").map(str::trim) {
        None | Some("") => Ok(job.git_info.depth),
        Some(v) => v
            .parse()
            .map_err(|_| format!("GIT_DEPTH {v:?} is not a number")),
    }
}

fn attempts_of(job: &JobResponse) -> u32 {
    job.variable("GET_SOURCES_ATTEMPTS")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1u32)
        .clamp(1, 10)
}

impl GitSources {
    /// Working copies under `root` (created on first use, private: they hold source code).
    pub fn new(root: impl Into<PathBuf>, clone_url: Option<String>) -> Self {
        Self {
            root: root.into(),
            clone_url: clone_url.filter(|u| !u.trim().is_empty()),
            root_ready: tokio::sync::OnceCell::new(),
            locks: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The job's sources, `None` when it has no repository or `GIT_STRATEGY` is `none`.
    /// `Err` carries a message for the job's failure (already in the trace).
    pub async fn get(
        &self,
        job: &JobResponse,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Option<Sources>, String> {
        if job.git_info.repo_url.trim().is_empty() {
            return Ok(None);
        }
        let fail = |trace: &mut Trace, msg: String| {
            trace.message(&format!("ERROR: {msg}"));
            Err(msg)
        };
        let strategy = match job.git_strategy() {
            Ok(s) => s,
            Err(msg) => return fail(trace, msg),
        };
        if strategy == Strategy::None {
            trace.message("Skipping Git repository setup");
            return Ok(None);
        }
        let depth = match depth_of(job) {
            Ok(d) => d,
            Err(msg) => return fail(trace, msg),
        };
        let attempts = attempts_of(job);
        let mut last = String::new();
        for attempt in 1..=attempts {
            if attempt > 1 {
                trace.message(&format!(
                    "Retrying to get the sources (attempt {attempt} of {attempts})"
                ));
            }
            let result = tokio::select! {
                r = self.get_once(job, strategy == Strategy::Fetch, depth, trace) => r,
                _ = cancel.cancelled() => return fail(trace, "canceled while getting the sources".into()),
            };
            match result {
                Ok(s) => return Ok(Some(s)),
                Err(msg) => last = msg,
            }
        }
        fail(trace, format!("getting the sources failed: {last}"))
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
        trace: &mut Trace,
    ) -> Result<Sources, String> {
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
            let result = checkout(job, &dir, depth, true, self.clone_url.as_deref(), trace).await;
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
        let result = checkout(
            job,
            dir.path(),
            depth,
            false,
            self.clone_url.as_deref(),
            trace,
        )
        .await;
        let path = dir.keep();
        // Removing a whole tree blocks: off the runtime's threads.
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(path)).await;
        result
    }
}

/// Init or reuse `dir`, fetch, check out the job's commit, clean, and tar it.
async fn checkout(
    job: &JobResponse,
    dir: &Path,
    depth: u32,
    reuse: bool,
    clone_url: Option<&str>,
    trace: &mut Trace,
) -> Result<Sources, String> {
    let g = &job.git_info;
    let (url, credentials) = split_credentials(g.repo_url.trim());
    let url = match clone_url {
        // GitLab Runner's rule: clone_url + project path (also right under a sub-path).
        Some(base) => match job.variable("CI_PROJECT_PATH").filter(|p| !p.is_empty()) {
            Some(project) => format!("{}/{project}.git", base.trim_end_matches('/')),
            None => with_base(&url, base),
        },
        None => url,
    };
    let auth = credentials.map(|(user, pass)| {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        format!("Authorization: Basic {basic}")
    });
    let git = |args: &[&str]| {
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
        .arg(dir)
        .args(args);
        // Only real transports: `ext::` and friends would run commands on the manager.
        c.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ALLOW_PROTOCOL", "http:https:git:ssh:file")
            .kill_on_drop(true);
        c
    };
    let fresh = !dir.join(".git").exists();
    if !fresh {
        // A git killed mid-fetch (a canceled job) leaves lock files that fail the next one.
        remove_stale_locks(&dir.join(".git")).await;
    }
    if fresh {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let object_format = match g.repo_object_format.as_str() {
            "" => "sha1",
            f => f,
        };
        run(
            git(&["init", "-q", &format!("--object-format={object_format}")]),
            trace,
        )
        .await?;
        trace.message("Created fresh repository.");
    } else if reuse {
        trace.message("Reinitialized existing Git repository");
    }
    // The remote's URL never holds the token (the job may read its .git/config).
    let _ = git(&["remote", "remove", "origin"]).output().await;
    run(git(&["remote", "add", "origin", &url]), trace).await?;

    let mut fetch = git(&["fetch", "--prune", "--quiet"]);
    if depth > 0 {
        fetch.arg(format!("--depth={depth}"));
    }
    fetch.arg("origin").args(refspecs(job));
    if let Some(header) = &auth {
        // Config through the environment: not in argv (ps) nor in .git/config.
        fetch
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "http.extraHeader")
            .env("GIT_CONFIG_VALUE_0", header);
    }
    run(fetch, trace).await?;

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
    if job
        .variable("GIT_CHECKOUT")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"))
    {
        trace.message("Skipping Git checkout");
    } else {
        // LFS objects are not fetched yet: pointer files stay, and a manager with git-lfs
        // installed must not try (and fail) to fetch them during checkout.
        let mut checkout = git(&["checkout", "-f", "-q", "--detach", &target]);
        checkout.env("GIT_LFS_SKIP_SMUDGE", "1");
        run(checkout, trace).await?;
        if reuse && !fresh {
            let flags = clean_flags(job)?;
            if !flags.is_empty() {
                let mut clean = git(&["clean"]);
                clean.args(&flags);
                run(clean, trace).await?;
            }
        }
    }
    match job.variable("GIT_SUBMODULE_STRATEGY").map(str::trim) {
        None | Some("" | "none") => trace.message("Skipping Git submodules setup"),
        Some(other) => trace.message(&format!(
            "WARNING: GIT_SUBMODULE_STRATEGY {other:?} is not supported yet; submodules are not fetched"
        )),
    }

    let listed = git(&["ls-files", "-z"])
        .output()
        .await
        .map_err(|e| format!("git ls-files: {e}"))?;
    let tracked = listed
        .stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    // The working copy's own mode (a private temporary directory) must not become the job's
    // project directory's: a job image's non-root user still enters it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).await;
    }
    // Owned by root in the archive: a job image's root user must not find a stranger's uid
    // (git refuses "dubious ownership"), whoever runs the manager.
    let tar = Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner"])
        .arg("-c")
        .arg("-f")
        .arg("-")
        .arg("-C")
        .arg(dir)
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
        tar: tar.stdout,
        tracked,
    })
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

/// Run a git command; its stderr goes to the trace (masked there); `Err` on failure.
async fn run(mut cmd: Command, trace: &mut Trace) -> Result<(), String> {
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
        Err(format!("git exited with {}", out.status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_leave_the_url() {
        let (url, creds) =
            split_credentials("https://gitlab-ci-token:glcbt-abc@gitlab.example.com/g/p.git");
        assert_eq!(url, "https://gitlab.example.com/g/p.git");
        assert_eq!(
            creds,
            Some(("gitlab-ci-token".to_string(), "glcbt-abc".to_string()))
        );
        let (url, creds) = split_credentials("file:///srv/repo.git");
        assert_eq!(url, "file:///srv/repo.git");
        assert_eq!(creds, None);
        // An @ in the path is not a user.
        let (url, creds) = split_credentials("https://host/a@b.git");
        assert_eq!(url, "https://host/a@b.git");
        assert_eq!(creds, None);
    }

    #[test]
    fn clean_flags_default_to_gitlabs_and_take_only_options() {
        let mut job = JobResponse::default();
        assert_eq!(clean_flags(&job).unwrap(), vec!["-ffdx", "-q"]);
        job.variables.push(slipway_jobs::Variable {
            key: "GIT_CLEAN_FLAGS".into(),
            value: "-ffdx -e cache/".into(),
            ..Default::default()
        });
        assert!(clean_flags(&job).unwrap_err().contains("\"cache/\""));
        job.variables[0].value = "-ffdx --exclude=cache/".into();
        assert_eq!(
            clean_flags(&job).unwrap(),
            vec!["-ffdx", "--exclude=cache/", "-q"]
        );
        job.variables[0].value = "none".into();
        assert!(clean_flags(&job).unwrap().is_empty());
    }

    #[test]
    fn clone_url_replaces_scheme_and_host() {
        assert_eq!(
            with_base(
                "https://gitlab.example.com/g/p.git",
                "http://10.0.0.5:8080/"
            ),
            "http://10.0.0.5:8080/g/p.git"
        );
    }

    #[test]
    fn default_refspecs_follow_the_ref_type() {
        let mut job = JobResponse::default();
        job.git_info.git_ref = "main".into();
        assert_eq!(
            refspecs(&job),
            vec!["+refs/heads/main:refs/remotes/origin/main"]
        );
        job.git_info.ref_type = "tag".into();
        assert_eq!(refspecs(&job), vec!["+refs/tags/main:refs/tags/main"]);
    }
}
