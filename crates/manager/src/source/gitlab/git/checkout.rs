//! One fetch into a working copy: init or reuse, fetch, check out, clean, submodules, LFS,
//! then the tar stream the job unpacks.
//!
//! Submodules and LFS objects come only from the repository's own server ([`Remote::serves`]):
//! `.gitmodules` and `.lfsconfig` are the project's files, and git on the manager would reach
//! whatever they name from the manager's network position (its loopback services, a cloud's
//! metadata address). Git resolves the URLs itself (`git submodule init`, `git lfs env`); each
//! is judged as resolved, and `git submodule update` is handed only the paths that pass, one
//! level at a time, so a nested `.gitmodules` is judged before anything is fetched for it.

use std::collections::BTreeSet;
use std::path::Path;

use slipway_executor::Tarball;
use slipway_job::JobResponse;
use slipway_job::Trace;
use tokio::process::Command;

use super::Sources;
use super::access::{Remote, split_credentials};
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
        self.git_in(self.dir, args)
    }

    /// A git command in `dir` (the working copy or one of its submodules) with the remote's
    /// settings.
    fn git_in(&self, dir: &Path, args: &[&str]) -> Command {
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
        .arg(dir);
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
        // Submodules are fetched below, each URL judged first; not here, from whatever a
        // kept working copy's submodules were last pointed at.
        fetch.arg("--no-recurse-submodules");
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

    /// `git submodule init`, `sync` and `update --init` as GitLab Runner runs them, one level
    /// at a time and only for submodules on the repository's server, then each submodule
    /// cleaned (a reused working copy) and its LFS objects fetched.
    async fn update_submodules(&self, fresh: bool, trace: &mut Trace) -> Result<(), String> {
        let s = self.submodules;
        // `--recursive` among the update flags would have git recurse past the check of each
        // level: it asks for the recursive strategy instead.
        let (flags, recursive_flag) = without_recursive(&s.update_flags);
        let recursive = s.strategy == SubmoduleStrategy::Recursive || recursive_flag;
        trace.message(if recursive {
            "Updating/initializing submodules recursively..."
        } else {
            "Updating/initializing submodules..."
        });
        let mut fetched = Vec::new();
        let mut levels = vec![self.dir.to_path_buf()];
        while let Some(dir) = levels.pop() {
            // GIT_SUBMODULE_PATHS names the top level's submodules only.
            let paths = if dir == self.dir {
                s.paths.as_slice()
            } else {
                &[]
            };
            for path in self.submodule_level(&dir, paths, &flags, trace).await? {
                let sub = dir.join(path);
                if recursive {
                    levels.push(sub.clone());
                }
                fetched.push(sub);
            }
        }
        if self.reuse && !fresh {
            let flags = clean_flags(self.job)?;
            if !flags.is_empty() {
                let cmd = format!("git clean {} && git reset --hard -q", flags.join(" "));
                let mut each = self.git(&["submodule", "foreach", "--quiet"]);
                if recursive {
                    each.arg("--recursive");
                }
                each.arg(cmd);
                run(each, trace, "cleaning the submodules").await?;
            }
        }
        if !lfs_skipped(self.job) && lfs_installed().await {
            for dir in &fetched {
                self.lfs_pull(dir, "fetching the submodules' LFS objects", trace)
                    .await?;
            }
        }
        Ok(())
    }

    /// The submodules of the repository in `dir` that `paths` names (all when empty):
    /// initialized and synced (relative URLs resolved by git against this level's remote),
    /// then fetched where git would fetch them from the repository's server; the others are
    /// skipped with a warning. The paths fetched, relative to `dir`.
    async fn submodule_level(
        &self,
        dir: &Path,
        paths: &[String],
        flags: &[String],
        trace: &mut Trace,
    ) -> Result<Vec<String>, String> {
        let sub = |args: &[&str]| {
            let mut c = self.git_in(dir, &["submodule"]);
            c.args(args).env("GIT_ALLOW_PROTOCOL", SUBMODULE_PROTOCOL);
            c
        };
        let mut init = sub(&["init"]);
        init.arg("--").args(paths);
        run(init, trace, "git submodule init").await?;
        let mut sync = sub(&["sync"]);
        sync.arg("--").args(paths);
        run(sync, trace, "git submodule sync").await?;

        let gitlinks = self.gitlinks(dir, paths).await?;
        if gitlinks.is_empty() {
            return Ok(Vec::new());
        }
        // Names by path (.gitmodules), and the URLs git resolved for them (the config `init`
        // and `sync` wrote): what `update` would fetch.
        let names = self
            .config_entries(dir, Some(".gitmodules"), r"^submodule\..*\.path$", "path")
            .await?;
        let urls = self
            .config_entries(dir, None, r"^submodule\..*\.url$", "url")
            .await?;
        let shown = |path: &str| match dir.strip_prefix(self.dir) {
            Ok(rel) if !rel.as_os_str().is_empty() => format!("{}/{path}", rel.display()),
            _ => path.to_string(),
        };
        let (mut allowed, mut refused) = (Vec::new(), Vec::new());
        for path in gitlinks {
            let name = names.iter().find(|(_, p)| *p == path).map(|(n, _)| n);
            let url = name.and_then(|n| urls.iter().find(|(k, _)| k == n).map(|(_, u)| u));
            match (name, url) {
                (Some(_), Some(url)) if self.remote.serves(url) => allowed.push(path),
                (Some(_), Some(url)) => {
                    trace.message(&format!(
                        "WARNING: submodule {} is not fetched from {}: on the manager, \
                         submodules come only from the repository's server ({})",
                        shown(&path),
                        split_credentials(url).0,
                        self.remote.server()
                    ));
                    refused.push(path);
                }
                _ => trace.message(&format!(
                    "WARNING: submodule {} is not fetched: .gitmodules gives it no URL",
                    shown(&path)
                )),
            }
        }
        // A working copy kept from an earlier job may hold some checked out: emptied, so the
        // job never finds stale ones (one never cloned has nothing to empty).
        refused.retain(|p| dir.join(p).join(".git").exists());
        if !refused.is_empty() {
            let mut deinit = sub(&["deinit", "-f", "-q", "--"]);
            deinit.args(&refused).env("GIT_LITERAL_PATHSPECS", "1");
            run(deinit, trace, "git submodule deinit").await?;
        }
        if !allowed.is_empty() {
            let mut update = sub(&["update", "--init"]);
            if self.submodules.depth > 0 {
                update.arg(format!("--depth={}", self.submodules.depth));
            }
            // The paths are literal: a `*` in one must not reach a refused submodule.
            update
                .args(flags)
                .arg("--")
                .args(&allowed)
                .env("GIT_LITERAL_PATHSPECS", "1");
            run(update, trace, "fetching the submodules").await?;
        }
        Ok(allowed)
    }

    /// The submodule paths (gitlinks) of the index in `dir` that `paths` names: what git's
    /// submodule commands visit for the same pathspec.
    async fn gitlinks(&self, dir: &Path, paths: &[String]) -> Result<Vec<String>, String> {
        let mut ls = self.git_in(dir, &["ls-files", "-s", "-z", "--"]);
        ls.args(paths).stdin(std::process::Stdio::null());
        let out = ls
            .output()
            .await
            .map_err(|e| format!("git ls-files: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "listing the submodules: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let mut found: Vec<String> = Vec::new();
        for entry in out.stdout.split(|b| *b == 0) {
            let entry = String::from_utf8_lossy(entry);
            // `<mode> <object> <stage>\t<path>`
            if let Some((meta, path)) = entry.split_once('\t')
                && meta.starts_with("160000 ")
                && found.last().is_none_or(|p| p != path)
            {
                found.push(path.to_string());
            }
        }
        Ok(found)
    }

    /// `(name, value)` of the `submodule.<name>.<key>` settings matching `pattern`, from `file`
    /// in `dir` or (`None`) the repository's configuration as git reads it.
    async fn config_entries(
        &self,
        dir: &Path,
        file: Option<&str>,
        pattern: &str,
        key: &str,
    ) -> Result<Vec<(String, String)>, String> {
        let mut c = self.git_in(dir, &["config", "-z"]);
        if let Some(f) = file {
            c.args(["-f", f]);
        }
        c.args(["--get-regexp", pattern])
            .stdin(std::process::Stdio::null());
        let out = c.output().await.map_err(|e| format!("git config: {e}"))?;
        // 1: nothing matches (or no such file).
        if !out.status.success() && out.status.code() != Some(1) {
            return Err(format!(
                "reading the submodules' settings: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let suffix = format!(".{key}");
        Ok(out
            .stdout
            .split(|b| *b == 0)
            .filter_map(|entry| {
                let entry = String::from_utf8_lossy(entry);
                let (k, v) = entry.split_once('\n')?;
                let name = k
                    .strip_prefix("submodule.")?
                    .strip_suffix(suffix.as_str())?;
                Some((name.to_string(), v.to_string()))
            })
            .collect())
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
        self.lfs_pull(self.dir, "fetching LFS objects", trace).await
    }

    /// `git lfs pull` in `dir` when git-lfs would fetch from the repository's server; a store
    /// elsewhere (`.lfsconfig`, the project's file) is skipped with a warning where there is
    /// something to fetch, and the files stay pointers.
    async fn lfs_pull(&self, dir: &Path, what: &str, trace: &mut Trace) -> Result<(), String> {
        let store = self.lfs_store(dir).await;
        let foreign = match &store {
            LfsStore::Http(url) if self.remote.serves(url) => None,
            LfsStore::Http(url) | LfsStore::Ssh(url) => Some(split_credentials(url).0),
            LfsStore::Unknown(why) => Some(why.clone()),
        };
        if let Some(url) = foreign {
            if self.lfs_files(dir).await {
                let place = match dir.strip_prefix(self.dir) {
                    Ok(rel) if !rel.as_os_str().is_empty() => {
                        format!(" of submodule {}", rel.display())
                    }
                    _ => String::new(),
                };
                trace.message(&format!(
                    "WARNING: LFS objects{place} are not fetched from {url}: on the manager, \
                     they come only from the repository's server ({}) over HTTP(S); they stay \
                     pointer files",
                    self.remote.server()
                ));
            }
            return Ok(());
        }
        let mut pull = self.git_in(dir, &["lfs", "pull"]);
        pull.env_remove("GIT_LFS_SKIP_SMUDGE");
        run(pull, trace, what).await
    }

    /// Where git-lfs in `dir` would fetch from, as it resolves it itself (`lfs.url`,
    /// `remote.origin.lfsurl`, `.lfsconfig`, the remote's URL, `insteadOf`): `git lfs env`.
    async fn lfs_store(&self, dir: &Path) -> LfsStore {
        let mut env = self.git_in(dir, &["lfs", "env"]);
        env.stdin(std::process::Stdio::null());
        let out = match env.output().await {
            Ok(out) if out.status.success() => out,
            Ok(out) => {
                return LfsStore::Unknown(format!(
                    "an unknown store (git lfs env: {})",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Err(e) => return LfsStore::Unknown(format!("an unknown store (git lfs env: {e})")),
        };
        lfs_store_of(&String::from_utf8_lossy(&out.stdout))
    }

    /// Whether the checked-out commit in `dir` has LFS files (`git lfs ls-files`).
    async fn lfs_files(&self, dir: &Path) -> bool {
        let mut ls = self.git_in(dir, &["lfs", "ls-files", "-n"]);
        ls.stdin(std::process::Stdio::null());
        // Unknown counts as some: the warning is then said.
        ls.output()
            .await
            .map_or(true, |o| !o.status.success() || !o.stdout.is_empty())
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

/// Where git-lfs fetches from.
#[derive(Debug, PartialEq, Eq)]
enum LfsStore {
    /// Its HTTP(S) endpoint.
    Http(String),
    /// Over SSH (`git-lfs-authenticate`, or the SSH transfer protocol): the manager's own SSH
    /// identity, never used for what a repository names.
    Ssh(String),
    /// Not known; why, for the warning.
    Unknown(String),
}

/// The store of `git lfs env`'s output: its `Endpoint=<url> (auth=...)` line, and the
/// `  SSH=<url>` line under it when the endpoint is reached over SSH.
fn lfs_store_of(env: &str) -> LfsStore {
    let mut lines = env.lines();
    let Some(endpoint) = lines.by_ref().find_map(|l| l.strip_prefix("Endpoint=")) else {
        return LfsStore::Unknown("an unknown store (git lfs env names none)".into());
    };
    let url = endpoint
        .split_once(" (auth=")
        .map_or(endpoint, |(u, _)| u)
        .trim();
    match lines.next().and_then(|l| l.trim().strip_prefix("SSH=")) {
        Some(ssh) => LfsStore::Ssh(ssh.trim().to_string()),
        None => LfsStore::Http(url.to_string()),
    }
}

/// `flags` without the ones that ask `git submodule update` to recurse (`--recursive`, or an
/// abbreviation git's option parser would take), and whether there was one.
fn without_recursive(flags: &[String]) -> (Vec<String>, bool) {
    let asks = |f: &str| f.len() > "--rec".len() && "--recursive".starts_with(f);
    let kept: Vec<String> = flags.iter().filter(|f| !asks(f)).cloned().collect();
    let had = kept.len() != flags.len();
    (kept, had)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lfs_store_is_what_git_lfs_env_says() {
        let env = "git-lfs/3.3.0 (GitHub; linux amd64; go 1.19.8)\ngit version 2.47.3\n\n\
                   Endpoint=http://u:p@127.0.0.1:9999/x/info/lfs (auth=none)\n\
                   LocalWorkingDir=/tmp/w\n";
        assert_eq!(
            lfs_store_of(env),
            LfsStore::Http("http://u:p@127.0.0.1:9999/x/info/lfs".into())
        );
        let ssh = "Endpoint=https://127.0.0.1/g/p.git (auth=none)\n  SSH=git@127.0.0.1:g/p.git\n\
                   LocalWorkingDir=/tmp/w\n";
        assert_eq!(
            lfs_store_of(ssh),
            LfsStore::Ssh("git@127.0.0.1:g/p.git".into())
        );
        assert!(matches!(lfs_store_of("nothing\n"), LfsStore::Unknown(_)));
    }

    #[test]
    fn a_recursive_update_flag_becomes_the_recursive_walk() {
        let flags = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            without_recursive(&flags(&["--remote", "--recursive", "--jobs=4"])),
            (flags(&["--remote", "--jobs=4"]), true)
        );
        assert_eq!(without_recursive(&flags(&["--recu"])), (flags(&[]), true));
        // `--rec` is ambiguous (`--recommend-shallow`), and that one is no recursion.
        assert_eq!(
            without_recursive(&flags(&["--rec", "--recommend-shallow"])),
            (flags(&["--rec", "--recommend-shallow"]), false)
        );
    }
}
