//! What the local git checkout says about the pipeline: GitLab's predefined `CI_*` variables of
//! a push pipeline for the checked-out commit, and the files changed against a ref.
//!
//! Blocking: it runs `git`. Outside a git checkout the commit is all zeros, the branch `main`,
//! and `changes` has nothing to compare with (it holds, as in GitLab without a push).

use std::path::Path;
use std::process::{Command, Stdio};

use slipway_job::model::Variable;

/// The checkout's facts, and the predefined variables built from them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkout {
    /// `CI_*` variables of a push pipeline for the checked-out commit.
    pub variables: Vec<Variable>,
    /// The ref `rules:changes` compares with by default (`origin/<default branch>`, else the
    /// default branch), as a local tool compares a change with what it will be merged into.
    pub changes_base: Option<String>,
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

/// GitLab's `CI_COMMIT_REF_SLUG`: lower case, anything but `a-z0-9` as `-`, at most 63
/// characters, no `-` at either end.
pub fn slug(text: &str) -> String {
    let mapped: String = text
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63)
        .collect();
    mapped.trim_matches('-').to_string()
}

/// `namespace/name` of the project from a remote URL (`git@host:a/b.git`, `https://host/a/b`).
fn project_path(remote: &str) -> Option<(String, String)> {
    let rest = remote.trim_end_matches('/').trim_end_matches(".git");
    let (host, path) = if let Some(after) = rest.split_once("://").map(|(_, a)| a) {
        let after = after.rsplit_once('@').map_or(after, |(_, h)| h);
        after.split_once('/')?
    } else {
        let after = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        after.split_once(':')?
    };
    let host = host.split_once(':').map_or(host, |(h, _)| h);
    (path.contains('/') && !host.is_empty()).then(|| (host.to_string(), path.to_string()))
}

impl Checkout {
    /// Reads the checkout at `dir` (blocking; runs git).
    pub fn read(dir: &Path) -> Checkout {
        let mut vars: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: String| vars.push((k.to_string(), v));
        let inside = git(dir, &["rev-parse", "--is-inside-work-tree"]).as_deref() == Some("true");
        let sha = inside
            .then(|| git(dir, &["rev-parse", "HEAD"]))
            .flatten()
            .unwrap_or_else(|| "0".repeat(40));
        let branch = inside
            .then(|| git(dir, &["symbolic-ref", "--short", "-q", "HEAD"]))
            .flatten();
        let tag = match &branch {
            None if inside => git(dir, &["describe", "--tags", "--exact-match", "HEAD"]),
            _ => None,
        };
        let default_branch = inside
            .then(|| {
                git(
                    dir,
                    &["symbolic-ref", "--short", "-q", "refs/remotes/origin/HEAD"],
                )
                .map(|r| r.trim_start_matches("origin/").to_string())
                .or_else(|| {
                    ["main", "master"].into_iter().find_map(|b| {
                        git(
                            dir,
                            &["rev-parse", "--verify", "-q", &format!("refs/heads/{b}")],
                        )
                        .map(|_| b.to_string())
                    })
                })
                .or_else(|| git(dir, &["config", "init.defaultBranch"]))
            })
            .flatten()
            .or_else(|| branch.clone())
            .unwrap_or_else(|| "main".into());
        let ref_name = tag.clone().or_else(|| branch.clone()).unwrap_or_else(|| {
            if inside {
                sha[..8].to_string()
            } else {
                "main".into()
            }
        });
        set("CI", "true".into());
        set("GITLAB_CI", "true".into());
        set("CI_PIPELINE_SOURCE", "push".into());
        set("CI_COMMIT_SHA", sha.clone());
        set("CI_COMMIT_SHORT_SHA", sha.chars().take(8).collect());
        set("CI_COMMIT_BEFORE_SHA", "0".repeat(40));
        set("CI_COMMIT_REF_NAME", ref_name.clone());
        set("CI_COMMIT_REF_SLUG", slug(&ref_name));
        set("CI_COMMIT_REF_PROTECTED", "false".into());
        match (&tag, &branch) {
            (Some(t), _) => set("CI_COMMIT_TAG", t.clone()),
            (None, Some(b)) => set("CI_COMMIT_BRANCH", b.clone()),
            (None, None) if !inside => set("CI_COMMIT_BRANCH", "main".into()),
            _ => {}
        }
        set("CI_DEFAULT_BRANCH", default_branch.clone());
        if inside {
            let show = |fmt: &str| git(dir, &["show", "-s", &format!("--format={fmt}"), "HEAD"]);
            let message = show("%B").unwrap_or_default();
            let title = message.lines().next().unwrap_or_default().to_string();
            let description = message
                .split_once('\n')
                .map(|(_, rest)| rest.trim_start_matches('\n').to_string())
                .unwrap_or_default();
            set("CI_COMMIT_MESSAGE", message);
            set("CI_COMMIT_TITLE", title);
            set("CI_COMMIT_DESCRIPTION", description);
            set("CI_COMMIT_AUTHOR", show("%an <%ae>").unwrap_or_default());
            set("CI_COMMIT_TIMESTAMP", show("%cI").unwrap_or_default());
        }
        let top = inside
            .then(|| git(dir, &["rev-parse", "--show-toplevel"]))
            .flatten()
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()));
        let dir_name = top
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "project".into());
        let remote = inside
            .then(|| git(dir, &["remote", "get-url", "origin"]))
            .flatten();
        let (host, path) = remote
            .as_deref()
            .and_then(project_path)
            .unwrap_or_else(|| ("gitlab.com".into(), format!("local/{dir_name}")));
        let (namespace, name) = path
            .rsplit_once('/')
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .unwrap_or_default();
        set("CI_PROJECT_NAME", name.clone());
        set("CI_PROJECT_TITLE", name);
        set("CI_PROJECT_PATH", path.clone());
        set("CI_PROJECT_PATH_SLUG", slug(&path));
        set("CI_PROJECT_NAMESPACE", namespace.clone());
        set(
            "CI_PROJECT_ROOT_NAMESPACE",
            namespace.split('/').next().unwrap_or_default().to_string(),
        );
        set("CI_PROJECT_URL", format!("https://{host}/{path}"));
        set("CI_SERVER_HOST", host.clone());
        set("CI_SERVER_URL", format!("https://{host}"));
        set("CI_SERVER_NAME", "GitLab".into());
        let changes_base = if inside {
            let origin = format!("origin/{default_branch}");
            if git(dir, &["rev-parse", "--verify", "-q", &origin]).is_some() {
                Some(origin)
            } else if git(dir, &["rev-parse", "--verify", "-q", &default_branch]).is_some() {
                Some(default_branch)
            } else {
                None
            }
        } else {
            None
        };
        Checkout {
            variables: vars.into_iter().map(|(k, v)| Variable::new(k, v)).collect(),
            changes_base,
        }
    }
}

/// Files that differ between `base` and the working tree, as `git diff --name-only BASE` says
/// (blocking).
pub(crate) fn changed_files(dir: &Path, base: &str) -> Result<Vec<String>, String> {
    if base.starts_with('-') {
        return Err(format!("\"{base}\" is not a ref"));
    }
    git(dir, &["diff", "--name-only", base, "--"])
        .map(|out| out.lines().map(String::from).collect())
        .ok_or_else(|| format!("git diff against \"{base}\" failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dir: &Path, args: &[&str]) {
        let st = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "Ada")
            .env("GIT_AUTHOR_EMAIL", "ada@example.com")
            .env("GIT_COMMITTER_NAME", "Ada")
            .env("GIT_COMMITTER_EMAIL", "ada@example.com")
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    }

    fn get<'a>(c: &'a Checkout, k: &str) -> Option<&'a str> {
        c.variables
            .iter()
            .find(|v| v.key == k)
            .map(|v| v.value.as_str())
    }

    #[test]
    fn branch_tag_remote_and_changes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        run(d, &["init", "-q", "-b", "main"]);
        std::fs::write(d.join("a.txt"), "1").unwrap();
        run(d, &["add", "."]);
        run(d, &["commit", "-q", "-m", "First line\n\nBody text"]);
        run(
            d,
            &[
                "remote",
                "add",
                "origin",
                "git@gitlab.example.com:team/sub/app.git",
            ],
        );
        run(d, &["checkout", "-q", "-b", "Feature/Login_2"]);
        std::fs::write(d.join("b.txt"), "2").unwrap();
        run(d, &["add", "."]);
        run(d, &["commit", "-q", "-m", "second"]);

        let c = Checkout::read(d);
        assert_eq!(get(&c, "CI_COMMIT_BRANCH"), Some("Feature/Login_2"));
        assert_eq!(get(&c, "CI_COMMIT_REF_SLUG"), Some("feature-login-2"));
        assert_eq!(get(&c, "CI_DEFAULT_BRANCH"), Some("main"));
        assert_eq!(get(&c, "CI_PROJECT_PATH"), Some("team/sub/app"));
        assert_eq!(get(&c, "CI_PROJECT_NAMESPACE"), Some("team/sub"));
        assert_eq!(get(&c, "CI_PROJECT_NAME"), Some("app"));
        assert_eq!(get(&c, "CI_SERVER_HOST"), Some("gitlab.example.com"));
        assert_eq!(get(&c, "CI_COMMIT_TITLE"), Some("second"));
        assert_eq!(get(&c, "CI_COMMIT_AUTHOR"), Some("Ada <ada@example.com>"));
        assert_eq!(get(&c, "CI_COMMIT_SHORT_SHA").map(str::len), Some(8));
        assert_eq!(c.changes_base.as_deref(), Some("main"));
        assert_eq!(changed_files(d, "main").unwrap(), ["b.txt"]);

        run(d, &["tag", "v1.0"]);
        run(d, &["checkout", "-q", "v1.0"]);
        let c = Checkout::read(d);
        assert_eq!(get(&c, "CI_COMMIT_TAG"), Some("v1.0"));
        assert_eq!(get(&c, "CI_COMMIT_REF_NAME"), Some("v1.0"));
        assert_eq!(get(&c, "CI_COMMIT_BRANCH"), None);
    }

    #[test]
    fn outside_git_is_main_at_zero() {
        let dir = tempfile::tempdir().unwrap();
        let c = Checkout::read(dir.path());
        assert_eq!(get(&c, "CI_COMMIT_BRANCH"), Some("main"));
        assert_eq!(get(&c, "CI_COMMIT_SHA"), Some("0".repeat(40).as_str()));
        assert!(get(&c, "CI_PROJECT_PATH").unwrap().starts_with("local/"));
        assert_eq!(c.changes_base, None);
    }
}
