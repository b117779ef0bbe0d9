//! The job variables that shape a fetch, as GitLab documents them: `GIT_DEPTH`,
//! `GET_SOURCES_ATTEMPTS`, `GIT_CLEAN_FLAGS`, `GIT_FETCH_EXTRA_FLAGS`, `GIT_LFS_SKIP_SMUDGE`
//! and the `GIT_SUBMODULE_*` family. Flags run git on the manager, so those that could run a
//! command or read its files (`--upload-pack`, `--reference`) are refused.

use slipway_job::JobResponse;

/// `refs` to fetch: the payload's refspecs, else the job's branch or tag.
pub(super) fn refspecs(job: &JobResponse) -> Vec<String> {
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
pub(super) fn clean_flags(job: &JobResponse) -> Result<Vec<String>, String> {
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

pub(super) fn depth_of(job: &JobResponse) -> Result<u32, String> {
    match job.variable("GIT_DEPTH").map(str::trim) {
        None | Some("") => Ok(job.git_info.depth),
        Some(v) => v
            .parse()
            .map_err(|_| format!("GIT_DEPTH {v:?} is not a number")),
    }
}

/// `GIT_FETCH_EXTRA_FLAGS`: GitLab's default `--prune --quiet` unless set.
pub(super) fn fetch_flags(job: &JobResponse) -> Result<Vec<String>, String> {
    let value = match job.variable("GIT_FETCH_EXTRA_FLAGS").map(str::trim) {
        None | Some("") => "--prune --quiet",
        Some(v) => v,
    };
    let flags: Vec<String> = value.split_whitespace().map(String::from).collect();
    refuse(&flags, "GIT_FETCH_EXTRA_FLAGS", value, &["--upload-pack"])?;
    if let Some(bad) = flags.iter().find(|f| !f.starts_with('-')) {
        return Err(format!(
            "GIT_FETCH_EXTRA_FLAGS {value:?}: {bad:?} is not an option of git fetch"
        ));
    }
    Ok(flags)
}

/// Whether `GIT_LFS_SKIP_SMUDGE` asks to leave LFS files as pointers.
pub(super) fn lfs_skipped(job: &JobResponse) -> bool {
    job.variable("GIT_LFS_SKIP_SMUDGE")
        .is_some_and(|v| matches!(v.trim(), "1" | "true" | "TRUE" | "True"))
}

/// How submodules are fetched (`GIT_SUBMODULE_STRATEGY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SubmoduleStrategy {
    /// Not at all (GitLab's default).
    None,
    /// The top-level submodules.
    Normal,
    /// Submodules and theirs.
    Recursive,
}

/// The submodule settings of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Submodules {
    /// `GIT_SUBMODULE_STRATEGY`.
    pub strategy: SubmoduleStrategy,
    /// `GIT_SUBMODULE_PATHS`: paths (or `:(exclude)path`) after `--`; empty for all.
    pub paths: Vec<String>,
    /// `GIT_SUBMODULE_DEPTH`, else `GIT_DEPTH` (0: full history).
    pub depth: u32,
    /// `GIT_SUBMODULE_UPDATE_FLAGS`, given to `git submodule update`.
    pub update_flags: Vec<String>,
    /// `GIT_SUBMODULE_FORCE_HTTPS`: SSH URLs of the server fetched over HTTPS instead.
    pub force_https: bool,
}

impl Submodules {
    /// `--recursive` when recursive.
    pub fn recursive_flag(&self) -> Option<&'static str> {
        (self.strategy == SubmoduleStrategy::Recursive).then_some("--recursive")
    }
}

/// The job's submodule settings; `depth` is its `GIT_DEPTH`.
pub(super) fn submodules_of(job: &JobResponse, depth: u32) -> Result<Submodules, String> {
    let var = |k: &str| job.variable(k).map(str::trim).filter(|v| !v.is_empty());
    let strategy = match var("GIT_SUBMODULE_STRATEGY") {
        None | Some("none") => SubmoduleStrategy::None,
        Some("normal") => SubmoduleStrategy::Normal,
        Some("recursive") => SubmoduleStrategy::Recursive,
        Some(other) => {
            return Err(format!(
                "GIT_SUBMODULE_STRATEGY {other:?}: expected none, normal or recursive"
            ));
        }
    };
    let depth = match var("GIT_SUBMODULE_DEPTH") {
        None => depth,
        Some(v) => v
            .parse()
            .map_err(|_| format!("GIT_SUBMODULE_DEPTH {v:?} is not a number"))?,
    };
    let update_flags: Vec<String> = var("GIT_SUBMODULE_UPDATE_FLAGS")
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    if let Some(v) = var("GIT_SUBMODULE_UPDATE_FLAGS") {
        refuse(
            &update_flags,
            "GIT_SUBMODULE_UPDATE_FLAGS",
            v,
            &["--reference"],
        )?;
    }
    let paths: Vec<String> = var("GIT_SUBMODULE_PATHS")
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    if let Some(bad) = paths.iter().find(|p| p.starts_with('-')) {
        return Err(format!(
            "GIT_SUBMODULE_PATHS: {bad:?} is not a path (flags go in GIT_SUBMODULE_UPDATE_FLAGS)"
        ));
    }
    let force_https = var("GIT_SUBMODULE_FORCE_HTTPS")
        .is_some_and(|v| matches!(v, "1" | "true" | "TRUE" | "True"));
    Ok(Submodules {
        strategy,
        paths,
        depth,
        update_flags,
        force_https,
    })
}

/// An error when a flag of `flags` starts with one of `refused`.
fn refuse(flags: &[String], name: &str, value: &str, refused: &[&str]) -> Result<(), String> {
    match flags
        .iter()
        .find(|f| refused.iter().any(|r| f.starts_with(r)))
    {
        Some(bad) => Err(format!(
            "{name} {value:?}: {bad:?} is refused (it would run a command or read files on the manager)"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> JobResponse {
        let mut job = JobResponse::default();
        for (k, v) in vars {
            job.variables.push(slipway_job::Variable {
                key: (*k).into(),
                value: (*v).into(),
                ..Default::default()
            });
        }
        job
    }

    #[test]
    fn clean_flags_default_to_gitlabs_and_take_only_options() {
        let mut job = JobResponse::default();
        assert_eq!(clean_flags(&job).unwrap(), vec!["-ffdx", "-q"]);
        job.variables.push(slipway_job::Variable {
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

    #[test]
    fn fetch_flags_default_to_gitlabs_and_refuse_upload_pack() {
        assert_eq!(fetch_flags(&with(&[])).unwrap(), vec!["--prune", "--quiet"]);
        assert_eq!(
            fetch_flags(&with(&[("GIT_FETCH_EXTRA_FLAGS", "--no-tags")])).unwrap(),
            vec!["--no-tags"]
        );
        let e = fetch_flags(&with(&[(
            "GIT_FETCH_EXTRA_FLAGS",
            "--upload-pack=touch /x",
        )]))
        .unwrap_err();
        assert!(
            e.contains("GIT_FETCH_EXTRA_FLAGS") && e.contains("refused"),
            "{e}"
        );
    }

    #[test]
    fn submodule_settings_follow_gitlabs_variables() {
        let s = submodules_of(&with(&[]), 20).unwrap();
        assert_eq!(s.strategy, SubmoduleStrategy::None);
        assert_eq!(s.depth, 20);
        let s = submodules_of(
            &with(&[
                ("GIT_SUBMODULE_STRATEGY", "recursive"),
                ("GIT_SUBMODULE_DEPTH", "1"),
                ("GIT_SUBMODULE_PATHS", "libs/a :(exclude)libs/b"),
                ("GIT_SUBMODULE_UPDATE_FLAGS", "--jobs 4 --remote"),
                ("GIT_SUBMODULE_FORCE_HTTPS", "true"),
            ]),
            20,
        )
        .unwrap();
        assert_eq!(s.recursive_flag(), Some("--recursive"));
        assert_eq!(s.depth, 1);
        assert_eq!(s.paths, vec!["libs/a", ":(exclude)libs/b"]);
        assert_eq!(s.update_flags, vec!["--jobs", "4", "--remote"]);
        assert!(s.force_https);
        let e = submodules_of(&with(&[("GIT_SUBMODULE_STRATEGY", "deep")]), 0).unwrap_err();
        assert!(e.contains("expected none, normal or recursive"), "{e}");
        let e = submodules_of(
            &with(&[("GIT_SUBMODULE_UPDATE_FLAGS", "--reference /srv/other")]),
            0,
        )
        .unwrap_err();
        assert!(e.contains("refused"), "{e}");
    }
}
