//! Which collected paths an archive keeps: `artifacts:exclude`, and with `untracked` the files
//! git does not track. Shared by the manager and the job helper, which archive the same way.

use std::collections::BTreeSet;

use crate::Globs;

/// Whether the tar entry `path` belongs in an `artifacts:` (or cache) entry's archive: not
/// excluded, and with `untracked`, either under one of its `paths` or not tracked by git.
pub fn keeps(
    path: &str,
    includes: &Globs,
    excludes: &Globs,
    untracked: bool,
    tracked: &BTreeSet<String>,
) -> bool {
    let lineage =
        || std::iter::successors(Some(path), |p| p.rsplit_once('/').map(|(parent, _)| parent));
    // Exclusion is not recursive (GitLab Runner matches each walked path on its own).
    if path.is_empty() || path == "." || excludes.matches_exactly(path) {
        return false;
    }
    if !untracked {
        return true;
    }
    if lineage().any(|p| p == ".git") {
        return false;
    }
    // A directory of tracked files is not untracked, though git lists only files.
    let under = format!("{path}/");
    let holds_tracked = tracked
        .range(under.clone()..)
        .next()
        .is_some_and(|t| t.starts_with(&under));
    lineage().any(|p| includes.is_match(p)) || (!tracked.contains(path) && !holds_tracked)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn untracked_keeps_what_git_does_not_track() {
        let includes = Globs::new(&["out/".to_string()]).unwrap();
        let excludes = Globs::new(&["out/*.tmp".to_string()]).unwrap();
        let tracked: BTreeSet<String> = ["README.md", "src/main.rs"]
            .into_iter()
            .map(String::from)
            .collect();
        let keep = |p: &str, untracked: bool| keeps(p, &includes, &excludes, untracked, &tracked);
        // Without untracked, the executor already chose by paths: only exclude applies.
        assert!(keep("out/a", false));
        assert!(!keep("out/b.tmp", false));
        // With it: paths, plus what git does not track, never .git or a tracked file's directory.
        assert!(keep("out/a", true));
        assert!(keep("build.log", true));
        assert!(keep("src/generated.rs", true));
        assert!(!keep("README.md", true));
        assert!(
            !keep("src", true),
            "a directory of tracked files is not untracked"
        );
        assert!(!keep(".git/config", true));
        assert!(!keep("out/b.tmp", true));
        assert!(!keep("", true));
    }
}
