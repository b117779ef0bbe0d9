//! A GitLab job's sources fetched where the job runs (an instance's shell), as GitLab Runner
//! fetches them: the same steps as [`Checkout`](super::checkout::Checkout) on the manager,
//! rendered as bash for the job's `get_sources` stage. Nothing of the repository passes
//! through the manager then. Where the host has no git 2.31+ or cannot reach the server, the
//! manager fetches after all only when the runner allows it (`instance_or_manager`); else
//! the stage fails, naming `fetch_sources`.
//!
//! The job token and the TLS files reach git as on the manager: in `GIT_CONFIG_*` variables of
//! the stage's shell, and in files of the slot readable by the job's user only, removed when
//! the stage ends. Both travel on the script's stdin, never on a command line; the URL in
//! `.git/config` holds no credentials.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use slipway_executor::script::{JobDirs, quote};
use slipway_executor::sources::{NO_GIT, UNREACHABLE};
use slipway_executor::{HostSources, Tarball};
use slipway_job::JobResponse;
use slipway_job::Trace;
use tokio_util::sync::CancellationToken;

use super::GitSources;
use super::access::Remote;
use super::checkout::{ALLOW_PROTOCOL, HINTS, SUBMODULE_PROTOCOL, tracked_of};
use super::options::{
    SubmoduleStrategy, Submodules, clean_flags, fetch_flags, lfs_skipped, refspecs,
};

/// What git says when this host cannot connect to the server at all (a network that reaches
/// the manager but not GitLab), as opposed to a refused token or a missing commit.
/// A server whose certificate the job's environment does not trust (the manager may trust an
/// internal CA through its system store) counts too: the manager then fetches.
const UNREACHABLE_WORDS: [&str; 9] = [
    "Failed to connect",
    "Could not resolve host",
    "Couldn't connect",
    "Connection refused",
    "No route to host",
    "Network is unreachable",
    "SSL certificate problem",
    "certificate verification failed",
    "server certificate verification failed",
];

/// Why the job fails when its host has no usable git and the manager may not fetch.
pub(super) const HOST_HAS_NO_GIT: &str = "the job's host has no git 2.31+ (git is missing or \
     older; older ones cannot take the job token safely); this runner fetches sources only where \
     the job runs (fetch_sources = \"instance\"); install git 2.31+ in the image or instance, or \
     set fetch_sources = \"manager\" or \"instance_or_manager\" in [[runners]]";

/// Why the job fails when its host cannot reach the server and the manager may not fetch.
pub(super) const HOST_CANNOT_REACH: &str = "the job's host cannot reach the repository's \
     server, or does not trust its certificate; this runner fetches sources only where the job \
     runs (fetch_sources = \"instance\"); let the job's host reach the server, or set \
     fetch_sources = \"manager\" or \"instance_or_manager\" in [[runners]]";

/// Why the manager does not fetch for a job of a runner that does not allow it.
const MANAGER_REFUSES: &str = "this runner fetches sources only where the job runs \
     (fetch_sources = \"instance\"), not on the manager; set fetch_sources = \"manager\" or \
     \"instance_or_manager\" in [[runners]] for the manager to fetch them";

/// What the script does where it cannot fetch: exit with `code` for the manager to fetch
/// instead when `fallback`, else say `why` last (the executor's error line) and fail.
fn give_up(fallback: bool, code: u32, why: &str) -> String {
    if fallback {
        format!("exit {code}")
    } else {
        format!("{{ printf '%s\\n' {} >&2; exit 1; }}", quote(why))
    }
}

/// `__run WHAT CMD...`: run CMD with its stderr in the trace; on failure print
/// `WHAT: <git's last line><hint>` last (the executor's error message) and exit 1, or run
/// `unreachable` when the server could not be connected to.
fn run_function(unreachable: &str) -> String {
    let pattern = |words: &[&str]| {
        words
            .iter()
            .map(|w| format!("*{}*", quote(w)))
            .collect::<Vec<_>>()
            .join("|")
    };
    let mut hints = String::new();
    for (words, hint) in HINTS {
        let _ = write!(hints, "{}) __h={};; ", pattern(words), quote(hint));
    }
    format!(
        "__run() {{\n  \
         local what=$1 err last __h=''; shift\n  \
         if err=$(\"$@\" 2>&1 >/dev/null); then [ -z \"$err\" ] || printf '%s\\n' \"$err\" >&2; return 0; fi\n  \
         [ -z \"$err\" ] || printf '%s\\n' \"$err\" >&2\n  \
         last=$(printf '%s\\n' \"$err\" | sed '/^[[:space:]]*$/d' | tail -n 1)\n  \
         case $err in {hints}esac\n  \
         printf '%s: %s%s\\n' \"$what\" \"${{last:-git failed}}\" \"$__h\" >&2\n  \
         case $err in {}) {unreachable};; esac\n  \
         exit 1\n}}",
        pattern(&UNREACHABLE_WORDS)
    )
}

/// TLS settings whose values are files: copied to the host, by the name they get there.
const TLS_FILES: [(&str, &str); 3] = [
    (".sslCAInfo", "ca.pem"),
    (".sslCert", "cert.pem"),
    (".sslKey", "key.pem"),
];

/// One job's fetch, ready to run on its host.
pub(in crate::source::gitlab) struct HostFetch {
    /// The job (for the manager's fallback, where allowed).
    job: JobResponse,
    /// The manager's working copies, for the fallback.
    git: Arc<GitSources>,
    /// Where from, with what settings.
    remote: Remote,
    /// `GIT_STRATEGY: fetch`: a working copy kept in the slot.
    reuse: bool,
    depth: u32,
    submodules: Submodules,
    fetch_flags: Vec<String>,
    clean_flags: Vec<String>,
    attempts: u32,
    /// The TLS files' contents, by their name on the host.
    tls: Vec<(&'static str, Vec<u8>)>,
    tracked: Mutex<Arc<BTreeSet<String>>>,
}

impl std::fmt::Debug for HostFetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The job and the settings hold the token; the TLS files may hold a key.
        f.debug_struct("HostFetch")
            .field("job", &self.job.id)
            .field("remote", &self.remote)
            .field("reuse", &self.reuse)
            .finish_non_exhaustive()
    }
}

impl HostFetch {
    /// The fetch of `job` (one with sources: a repository and a strategy other than `none`),
    /// its variables checked now, so a bad one fails the job before it takes a slot.
    pub(super) async fn new(
        git: Arc<GitSources>,
        job: &JobResponse,
        reuse: bool,
        depth: u32,
        submodules: Submodules,
        attempts: u32,
    ) -> Result<Self, String> {
        let remote = Remote::of(
            job,
            git.clone_url.as_deref(),
            &git.tls,
            submodules.force_https,
        );
        let mut tls = Vec::new();
        for (key, path) in remote.settings() {
            if let Some((_, name)) = TLS_FILES.iter().find(|(k, _)| key.ends_with(k)) {
                let bytes = tokio::fs::read(path)
                    .await
                    .map_err(|e| format!("reading the runner's TLS file {path}: {e}"))?;
                tls.push((*name, bytes));
            }
        }
        Ok(Self {
            job: job.clone(),
            git,
            remote,
            reuse,
            depth,
            fetch_flags: fetch_flags(job)?,
            clean_flags: clean_flags(job)?,
            submodules,
            attempts,
            tls,
            tracked: Mutex::new(Arc::default()),
        })
    }

    /// Where the stage keeps its TLS files, as a bash expression.
    fn tls_dir(dirs: &JobDirs) -> String {
        format!("{}/.job-{}.tls", dirs.slot_dir(), dirs.job_id)
    }

    /// The submodule commands, as [`Checkout`](super::checkout::Checkout) runs them.
    fn submodule_lines(&self, s: &mut String) {
        let sm = &self.submodules;
        let recursive = sm.recursive_flag().unwrap_or("");
        let paths = if sm.paths.is_empty() {
            String::new()
        } else {
            format!(" -- {}", words(&sm.paths))
        };
        let _ = writeln!(
            s,
            "echo {} >&2",
            quote(if recursive.is_empty() {
                "Updating/initializing submodules..."
            } else {
                "Updating/initializing submodules recursively..."
            })
        );
        // What `.gitmodules` names is the project's choice: no `file` or `ssh` there.
        let _ = writeln!(s, "export GIT_ALLOW_PROTOCOL={SUBMODULE_PROTOCOL}");
        let _ = writeln!(s, "__run 'git submodule init' __git submodule init{paths}");
        let _ = writeln!(
            s,
            "__run 'git submodule sync' __git submodule sync {recursive}{paths}"
        );
        let mut update = format!("__git submodule update --init {recursive}");
        if sm.depth > 0 {
            let _ = write!(update, " --depth={}", sm.depth);
        }
        if !sm.update_flags.is_empty() {
            let _ = write!(update, " {}", words(&sm.update_flags));
        }
        let _ = writeln!(s, "__run 'fetching the submodules' {update}{paths}");
        if self.reuse && !self.clean_flags.is_empty() {
            let each = format!(
                "git clean {} && git reset --hard -q",
                self.clean_flags.join(" ")
            );
            let _ = writeln!(
                s,
                "if [ $__fresh = 0 ]; then __run 'cleaning the submodules' __git submodule foreach --quiet {recursive} {}; fi",
                quote(&each)
            );
        }
        if !lfs_skipped(&self.job) {
            let pull = "git -c 'filter.lfs.process=git-lfs filter-process' -c \
                        filter.lfs.required=true lfs pull";
            let _ = writeln!(
                s,
                "if [ $__lfs = 1 ]; then (GIT_LFS_SKIP_SMUDGE=0; __run \"fetching the submodules' LFS objects\" __git submodule foreach --quiet {recursive} {}); fi",
                quote(pull)
            );
        }
    }
}

/// Bash words, each quoted.
fn words(items: &[String]) -> String {
    items.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

#[async_trait]
impl HostSources for HostFetch {
    fn script(&self, dirs: &JobDirs) -> String {
        let g = &self.job.git_info;
        let dir = dirs.project_dir();
        let fallback = self.git.manager_fallback;
        let no_git = give_up(fallback, NO_GIT, HOST_HAS_NO_GIT);
        let mut s = String::new();
        // POSIX sh (a job image may have no bash). Nothing touched before these lines: without
        // git 2.31 (GIT_CONFIG_COUNT carries the token) the job fails, or the manager fetches
        // instead where the runner allows it.
        let _ = writeln!(s, "command -v git >/dev/null 2>&1 || {no_git}");
        let _ = writeln!(
            s,
            "set -- $(git version 2>/dev/null | sed -n 's/^git version \\([0-9]*\\)\\.\\([0-9]*\\).*/\\1 \\2/p')\n\
             if [ -z \"$1\" ] || [ \"$1\" -lt 2 ] || {{ [ \"$1\" -eq 2 ] && [ \"$2\" -lt 31 ]; }}; then {no_git}; fi"
        );
        let _ = writeln!(s, "set -e");
        let _ = writeln!(s, "__tls={}", Self::tls_dir(dirs));
        let _ = writeln!(s, "trap 'rm -rf \"$__tls\"' EXIT");
        let _ = writeln!(s, "trap 'exit 130' INT TERM HUP");
        // The settings that carry secrets come on stdin.
        let _ = writeln!(
            s,
            "__settings=$(cat); eval \"$__settings\"; unset __settings"
        );
        // Only real transports: `ext::` and friends would run commands.
        // A kept working copy is the last job's: its hooks, fsmonitor and replace refs must
        // not run or apply with this job's token in the environment.
        let _ = writeln!(
            s,
            "export GIT_TERMINAL_PROMPT=0 GIT_ALLOW_PROTOCOL={ALLOW_PROTOCOL} GIT_LFS_SKIP_SMUDGE=1 GIT_NO_REPLACE_OBJECTS=1"
        );
        let _ = writeln!(
            s,
            "{}",
            run_function(&give_up(fallback, UNREACHABLE, HOST_CANNOT_REACH))
        );
        // What `git lfs install` would write to a global config, for these commands only;
        // no background gc outliving a command.
        let _ = writeln!(
            s,
            "__lfs=0; if git lfs version >/dev/null 2>&1; then __lfs=1; fi"
        );
        let _ = writeln!(
            s,
            "__git() {{ if [ $__lfs = 1 ]; then git -c gc.autoDetach=false -c maintenance.autoDetach=false \
             -c core.hooksPath=/dev/null -c core.fsmonitor=false \
             -c 'filter.lfs.process=git-lfs filter-process' -c 'filter.lfs.smudge=git-lfs smudge -- %f' \
             -c 'filter.lfs.clean=git-lfs clean -- %f' -c filter.lfs.required=true \"$@\"; \
             else git -c gc.autoDetach=false -c maintenance.autoDetach=false \
             -c core.hooksPath=/dev/null -c core.fsmonitor=false \"$@\"; fi; }}"
        );
        if !self.reuse {
            let _ = writeln!(s, "rm -rf {dir}");
        }
        let _ = writeln!(s, "mkdir -p {dir}");
        let _ = writeln!(s, "cd {dir}");
        let object_format = match g.repo_object_format.as_str() {
            "" => "sha1",
            f => f,
        };
        // A git killed mid-fetch (a canceled job) leaves lock files that fail the next one.
        let _ = writeln!(
            s,
            "if [ -d .git ]; then\n  \
             find .git -maxdepth 1 -name '*.lock' -type f -delete 2>/dev/null || :\n  \
             if [ -d .git/refs ]; then find .git/refs -name '*.lock' -type f -delete 2>/dev/null || :; fi\n  \
             __fresh=0; echo 'Reinitialized existing Git repository' >&2\n\
             else\n  \
             __run 'git init' __git init -q {}; __fresh=1; echo 'Created fresh repository.' >&2\n\
             fi",
            // sha1 is every git's default; the flag alone needs git 2.29.
            if object_format == "sha1" {
                String::new()
            } else {
                quote(&format!("--object-format={object_format}"))
            }
        );
        // The remote's URL never holds the token (the job may read its .git/config).
        // Set, not removed and added: the kept copy keeps its remote-tracking refs.
        let _ = writeln!(
            s,
            "if __git remote get-url origin >/dev/null 2>&1; then __run 'git remote set-url' __git remote set-url origin {url}\n\
             else __run 'git remote add' __git remote add origin {url}; fi",
            url = quote(&self.remote.url)
        );
        let _ = writeln!(
            s,
            "echo {} >&2",
            quote(&match self.depth {
                0 => "Fetching changes...".to_string(),
                d => format!("Fetching changes with git depth set to {d}..."),
            })
        );
        let mut fetch = format!(
            "__run 'fetching the repository' __git fetch {}",
            words(&self.fetch_flags)
        );
        if self.depth > 0 {
            let _ = write!(fetch, " --depth={}", self.depth);
        }
        let _ = writeln!(s, "{fetch} origin {}", words(&refspecs(&self.job)));
        let target = if g.sha.is_empty() {
            "FETCH_HEAD".to_string()
        } else {
            g.sha.clone()
        };
        let _ = writeln!(
            s,
            "echo {} >&2",
            quote(&format!(
                "Checking out {} as detached HEAD (ref is {})...",
                target.chars().take(8).collect::<String>(),
                g.git_ref
            ))
        );
        let checkout = !self
            .job
            .variable("GIT_CHECKOUT")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"));
        if checkout {
            let _ = writeln!(
                s,
                "__run 'checking out the commit' __git checkout -f -q --detach {}",
                quote(&target)
            );
            if self.reuse && !self.clean_flags.is_empty() {
                let _ = writeln!(
                    s,
                    "if [ $__fresh = 0 ]; then __run 'git clean' __git clean {}; fi",
                    words(&self.clean_flags)
                );
            }
            if !lfs_skipped(&self.job) {
                let _ = writeln!(
                    s,
                    "if [ $__lfs = 1 ]; then (GIT_LFS_SKIP_SMUDGE=0; __run 'fetching LFS objects' __git lfs pull)\n\
                     elif grep -qs 'filter=lfs' .gitattributes; then echo {} >&2; fi",
                    quote(
                        "WARNING: the repository has LFS files but git-lfs is not installed \
                         where the job runs; they stay pointer files"
                    )
                );
            }
        } else {
            let _ = writeln!(s, "echo 'Skipping Git checkout' >&2");
        }
        if checkout && self.submodules.strategy != SubmoduleStrategy::None {
            self.submodule_lines(&mut s);
        } else {
            let _ = writeln!(s, "echo 'Skipping Git submodules setup' >&2");
        }
        let _ = writeln!(s, "__git ls-files --recurse-submodules -z");
        s
    }

    fn stdin(&self) -> Vec<u8> {
        let mut s = String::new();
        if !self.tls.is_empty() {
            let _ = writeln!(s, "(umask 077 && mkdir -p \"$__tls\")");
            for (name, bytes) in &self.tls {
                let text = String::from_utf8_lossy(bytes);
                let _ = writeln!(
                    s,
                    "(umask 077 && printf '%s' {} > \"$__tls\"/{name})",
                    quote(&text)
                );
            }
            // git lets these override any setting: the runner's files must win.
            let _ = writeln!(s, "unset GIT_SSL_CAINFO GIT_SSL_CERT GIT_SSL_KEY");
        }
        let settings = self.remote.settings();
        let _ = writeln!(s, "export GIT_CONFIG_COUNT={}", settings.len());
        for (i, (key, value)) in settings.iter().enumerate() {
            let _ = writeln!(s, "export GIT_CONFIG_KEY_{i}={}", quote(key));
            match TLS_FILES.iter().find(|(k, _)| key.ends_with(k)) {
                Some((_, name)) => {
                    let _ = writeln!(s, "export GIT_CONFIG_VALUE_{i}=\"$__tls\"/{name}");
                }
                None => {
                    let _ = writeln!(s, "export GIT_CONFIG_VALUE_{i}={}", quote(value));
                }
            }
        }
        s.into_bytes()
    }

    fn attempts(&self) -> u32 {
        self.attempts
    }

    fn kept_path(&self) -> Option<String> {
        if !self.reuse {
            return None;
        }
        // GitLab Runner's `<namespace>/<project>`; a path that could leave the slot is not one.
        let project = self
            .job
            .variable("CI_PROJECT_PATH")
            .map(str::trim)
            .filter(|p| {
                !p.is_empty()
                    && p.split('/')
                        .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
            });
        Some(match project {
            Some(p) => p.to_string(),
            None => format!("project-{}", self.job.job_info.project_id),
        })
    }

    async fn on_manager(
        &self,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Option<Tarball>, String> {
        if !self.git.manager_fallback {
            // The script never asks for this then; refused all the same, so the manager's
            // network position serves a pipeline only where the operator said so.
            trace.message(&format!("ERROR: {MANAGER_REFUSES}"));
            return Err(MANAGER_REFUSES.to_string());
        }
        let sources = self.git.get(&self.job, trace, cancel).await?;
        Ok(sources.map(|s| {
            *self.tracked.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(s.tracked);
            s.tar
        }))
    }

    fn set_tracked(&self, listed: &[u8]) {
        *self.tracked.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(tracked_of(listed));
    }

    fn tracked(&self) -> Arc<BTreeSet<String>> {
        self.tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipway_gitlab::TlsFiles;
    use std::path::Path;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@e",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(dir)
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A repository with one commit of `files`; its sha.
    fn repo(dir: &Path, files: &[(&str, &str)]) -> String {
        std::fs::create_dir_all(dir).unwrap();
        git(dir, &["init", "-q"]);
        for (name, body) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, body).unwrap();
        }
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-q", "-m", "c"]);
        git(dir, &["rev-parse", "HEAD"])
    }

    fn job(url: &str, sha: &str, vars: &[(&str, &str)]) -> JobResponse {
        let mut job = JobResponse {
            id: 7,
            ..Default::default()
        };
        job.git_info.repo_url = url.into();
        job.git_info.sha = sha.into();
        job.git_info.git_ref = "main".into();
        for (k, v) in vars {
            job.variables.push(slipway_job::Variable {
                key: (*k).into(),
                value: (*v).into(),
                ..Default::default()
            });
        }
        job
    }

    /// Run the plan's script as the executors do (`shell -c`, its stdin): status, stdout,
    /// stderr. Images without bash run it with `sh` (dash here, as strict as POSIX gets).
    fn run_with(shell: &str, plan: &HostFetch, dirs: &JobDirs) -> (i32, Vec<u8>, String) {
        use std::io::Write as _;
        let mut child = Command::new(shell)
            .arg("-c")
            .arg(plan.script(dirs))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&plan.stdin())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn run(plan: &HostFetch, dirs: &JobDirs) -> (i32, Vec<u8>, String) {
        run_with("bash", plan, dirs)
    }

    async fn plan(tmp: &Path, job: &JobResponse) -> HostFetch {
        plan_with(tmp, job, false).await
    }

    /// [`plan`], the manager's fallback allowed or not.
    async fn plan_with(tmp: &Path, job: &JobResponse, fallback: bool) -> HostFetch {
        let git = Arc::new(
            GitSources::new(tmp.join("mgr"), None, TlsFiles::default())
                .with_manager_fallback(fallback),
        );
        let mut trace = Trace::new(
            Vec::<String>::new(),
            tokio::sync::mpsc::unbounded_channel().0,
        );
        git.on_host(job, &mut trace)
            .await
            .unwrap()
            .expect("a fetch")
    }

    #[tokio::test]
    async fn the_script_fetches_checks_out_and_lists_tracked_files_then_reuses_the_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        let sha = repo(&src, &[("README.md", "hello\n"), ("sub/a.txt", "a\n")]);
        let url = format!("file://{}", src.display());
        let job = job(
            &url,
            &sha,
            &[("GIT_STRATEGY", "fetch"), ("CI_PROJECT_PATH", "g/p")],
        );
        let plan = plan(tmp.path(), &job).await;
        let dirs = JobDirs {
            builds_dir: tmp.path().join("builds").display().to_string(),
            slot: 0,
            job_id: 7,
            clone_path: plan.kept_path(),
        };
        assert_eq!(plan.kept_path().as_deref(), Some("g/p"));
        let (code, out, err) = run(&plan, &dirs);
        assert_eq!(code, 0, "{err}");
        let project = tmp.path().join("builds/slot-0/g/p");
        assert_eq!(
            std::fs::read_to_string(project.join("README.md")).unwrap(),
            "hello\n"
        );
        plan.set_tracked(&out);
        let tracked: Vec<_> = plan.tracked().iter().cloned().collect();
        assert_eq!(tracked, vec!["README.md", "sub/a.txt"]);
        assert!(err.contains("Created fresh repository."), "{err}");
        // The remote holds no credentials, and the TLS directory is gone.
        assert!(!tmp.path().join("builds/slot-0/.job-7.tls").exists());

        // The next job of the slot reuses the working copy and cleans what the last one left.
        std::fs::write(project.join("left-over"), "x").unwrap();
        let sha2 = {
            std::fs::write(src.join("README.md"), "hello again\n").unwrap();
            git(&src, &["commit", "-q", "-am", "c2"]);
            git(&src, &["rev-parse", "HEAD"])
        };
        let job2 = self::job(
            &url,
            &sha2,
            &[("GIT_STRATEGY", "fetch"), ("CI_PROJECT_PATH", "g/p")],
        );
        let plan2 = self::plan(tmp.path(), &job2).await;
        let (code, _, err) = run_with("dash", &plan2, &dirs);
        assert_eq!(code, 0, "{err}");
        assert!(
            err.contains("Reinitialized existing Git repository"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(project.join("README.md")).unwrap(),
            "hello again\n"
        );
        assert!(!project.join("left-over").exists(), "git clean ran");
    }

    /// The last non-empty line of `stderr`.
    fn last_line(stderr: &str) -> &str {
        stderr
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("")
    }

    #[tokio::test]
    async fn an_unreachable_server_and_a_missing_git_exit_with_their_codes_or_fail_saying_why() {
        let tmp = tempfile::tempdir().unwrap();
        // A git older than 2.31 (no GIT_CONFIG_COUNT: the token would be ignored) is no git.
        let bin = tmp.path().join("oldgit");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("git"), "#!/bin/sh\necho 'git version 2.25.1'\n").unwrap();
        std::fs::set_permissions(
            bin.join("git"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        // Nothing listens on port 9 of loopback.
        let job = job("http://127.0.0.1:9/g/p.git", "", &[]);
        // With the manager's fallback (instance_or_manager), the codes that ask for it; without
        // (instance), a failure whose last line says why and names fetch_sources.
        for fallback in [true, false] {
            let plan = plan_with(tmp.path(), &job, fallback).await;
            let dirs = JobDirs {
                builds_dir: tmp.path().join("builds").display().to_string(),
                slot: 1,
                job_id: 7,
                clone_path: None,
            };
            let (code, _, err) = run(&plan, &dirs);
            if fallback {
                assert_eq!(code, UNREACHABLE as i32, "{err}");
            } else {
                assert_eq!(code, 1, "{err}");
                assert_eq!(last_line(&err), HOST_CANNOT_REACH, "{err}");
                assert!(err.contains("fetching the repository: "), "{err}");
            }

            // No git on PATH: nothing is touched.
            let dirs = JobDirs { slot: 2, ..dirs };
            // Without a usable git (none on PATH under bash; too old under dash).
            let no_git = |shell: &str, path: String| {
                let script = format!("PATH={path}\n{}", plan.script(&dirs));
                let out = Command::new(shell).arg("-c").arg(script).output().unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                if fallback {
                    assert_eq!(out.status.code(), Some(NO_GIT as i32), "{out:?}");
                } else {
                    assert_eq!(out.status.code(), Some(1), "{out:?}");
                    assert_eq!(last_line(&err), HOST_HAS_NO_GIT, "{err}");
                }
                assert!(!tmp.path().join("builds/slot-2").exists());
            };
            no_git("/bin/bash", "/nonexistent".into());
            no_git("/usr/bin/dash", format!("{}:/usr/bin:/bin", bin.display()));
        }
        for key in ["fetch_sources = \"instance\"", "\"instance_or_manager\""] {
            assert!(HOST_HAS_NO_GIT.contains(key) && HOST_CANNOT_REACH.contains(key));
        }
    }

    #[tokio::test]
    async fn the_manager_does_not_fetch_for_a_runner_that_does_not_allow_it() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        let sha = repo(&src, &[("README.md", "hello\n")]);
        let job = job(&format!("file://{}", src.display()), &sha, &[]);
        let cancel = CancellationToken::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut trace = Trace::new(Vec::<String>::new(), tx);
        let refused = plan_with(tmp.path(), &job, false)
            .await
            .on_manager(&mut trace, &cancel)
            .await
            .unwrap_err();
        assert_eq!(refused, MANAGER_REFUSES);
        trace.finish();
        drop(trace);
        let mut said = Vec::new();
        while let Some(chunk) = rx.recv().await {
            said.extend(chunk);
        }
        let said = String::from_utf8_lossy(&said);
        assert!(
            said.contains(&format!("ERROR: {MANAGER_REFUSES}")),
            "{said}"
        );
        // Nothing was fetched: the manager's working copies were never made.
        assert!(!tmp.path().join("mgr").exists());

        // Allowed (instance_or_manager): the manager fetches.
        let mut trace = Trace::new(
            Vec::<String>::new(),
            tokio::sync::mpsc::unbounded_channel().0,
        );
        let tar = plan_with(tmp.path(), &job, true)
            .await
            .on_manager(&mut trace, &cancel)
            .await
            .unwrap();
        assert!(tar.is_some());
    }

    #[tokio::test]
    async fn the_token_and_tls_files_travel_on_stdin_only() {
        let tmp = tempfile::tempdir().unwrap();
        let ca = tmp.path().join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nxyz\n").unwrap();
        let mut job = job(
            "https://gitlab-ci-token:glcbt-secret@gitlab.example.com/g/p.git",
            "",
            &[],
        );
        job.id = 8;
        let tls = TlsFiles {
            ca_file: Some(ca),
            ..TlsFiles::default()
        };
        let git = Arc::new(GitSources::new(tmp.path().join("mgr"), None, tls));
        let mut trace = Trace::new(
            Vec::<String>::new(),
            tokio::sync::mpsc::unbounded_channel().0,
        );
        let plan = git.on_host(&job, &mut trace).await.unwrap().unwrap();
        let dirs = JobDirs {
            builds_dir: "builds".into(),
            slot: 0,
            job_id: 8,
            clone_path: None,
        };
        let script = plan.script(&dirs);
        assert!(!script.contains("glcbt-secret"), "{script}");
        assert!(!script.contains("BEGIN CERTIFICATE"));
        let stdin = String::from_utf8(plan.stdin()).unwrap();
        assert!(stdin.contains("Authorization: Basic"), "{stdin}");
        assert!(stdin.contains("BEGIN CERTIFICATE"));
        assert!(
            stdin.contains("GIT_CONFIG_VALUE_1=\"$__tls\"/ca.pem"),
            "{stdin}"
        );
        assert!(!format!("{plan:?}").contains("glcbt"));
    }
}
