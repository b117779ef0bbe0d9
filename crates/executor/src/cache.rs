//! GitLab's local cache: a job's `cache:` entries restored before its script and saved after
//! it, as `tar.gz` files in the runner's cache directory on the machine the job runs on.
//!
//! The layout is GitLab Runner's local cache, `<cache_dir>/<project path>/<key>/`, with a
//! `cache.tar.gz` (not `cache.zip`: only `tar` is needed where the job runs, busybox included).
//! A `cache_dir` on a shared file system (NFS, say) shares the cache between instances.
//! Restoring never fails a job (a missing or broken cache is a warning, as in GitLab); saving
//! writes a temporary file and renames it, so a reader never sees half an archive.

use std::fmt::Write as _;

use slipway_job::model::{CacheSpec, JobResponse};

use crate::script::{JobDirs, glob_word, quote};

/// Variable naming one more key to try when no cache exists for the job's keys.
pub const FALLBACK_KEY_VARIABLE: &str = "CACHE_FALLBACK_KEY";

/// Why a cache entry is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The (expanded) key.
    pub key: String,
    /// Why.
    pub reason: &'static str,
}

/// The cache directory of the job's project, as a bash expression: `cache_dir` (under `$HOME`
/// unless absolute) and the project's path.
pub fn project_root(cache_dir: &str, job: &JobResponse) -> String {
    let base = if cache_dir.starts_with('/') {
        quote(cache_dir.trim_end_matches('/'))
    } else {
        format!("\"$HOME\"/{}", quote(cache_dir.trim_end_matches('/')))
    };
    let project = match job.job_info.project_full_path.trim_matches('/') {
        "" => format!("project-{}", job.job_info.project_id),
        p if p.split('/').all(|c| !c.is_empty() && c != "." && c != "..") => p.to_string(),
        _ => format!("project-{}", job.job_info.project_id),
    };
    format!("{base}/{}", quote(&project))
}

/// A key GitLab accepts: not empty, no `/` (or `%2F`), not only dots.
fn key_problem(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        Some("the key is empty")
    } else if key.contains('/') || key.to_ascii_lowercase().contains("%2f") {
        Some("a cache key cannot contain \"/\"")
    } else if key.chars().all(|c| c == '.') {
        Some("a cache key cannot be only dots")
    } else {
        None
    }
}

/// The key of `spec` (`default` when it names none), expanded.
fn key_of(spec: &CacheSpec, job: &JobResponse) -> String {
    match job.expand(&spec.key) {
        k if k.trim().is_empty() => "default".to_string(),
        k => k,
    }
}

fn pulls(spec: &CacheSpec) -> bool {
    matches!(spec.policy.as_str(), "" | "pull-push" | "pull")
}

fn pushes(spec: &CacheSpec) -> bool {
    matches!(spec.policy.as_str(), "" | "pull-push" | "push")
}

/// The start of a cache script: into the project directory, then `title` for the trace.
fn script_start(dirs: &JobDirs, title: &str) -> String {
    format!(
        "cd {} || exit 1\necho {}\n",
        dirs.project_dir(),
        quote(title)
    )
}

/// The keys to try for `spec`, in GitLab's order: its key, its `fallback_keys`, then
/// `fallback` (`CACHE_FALLBACK_KEY`), expanded, each once; keys GitLab refuses go to `skipped`.
fn restore_keys(
    spec: &CacheSpec,
    job: &JobResponse,
    fallback: Option<&str>,
    skipped: &mut Vec<Skipped>,
) -> Vec<String> {
    let mut keys = vec![key_of(spec, job)];
    keys.extend(spec.fallback_keys.iter().map(|k| job.expand(k)));
    keys.extend(fallback.map(str::to_string));
    let mut candidates = Vec::new();
    for k in keys {
        match key_problem(&k) {
            None if !candidates.contains(&k) => candidates.push(k),
            None => {}
            Some(reason) => skipped.push(Skipped { key: k, reason }),
        }
    }
    candidates
}

/// The keys to try when restoring `spec` of `job` ([`restore_keys`] with the job's
/// `CACHE_FALLBACK_KEY`), and the keys skipped; empty when `spec` does not pull.
pub fn keys_to_restore(spec: &CacheSpec, job: &JobResponse) -> (Vec<String>, Vec<Skipped>) {
    let mut skipped = Vec::new();
    if !pulls(spec) {
        return (Vec::new(), skipped);
    }
    let fallback = job
        .variable(FALLBACK_KEY_VARIABLE)
        .map(|k| job.expand(k))
        .filter(|k| !k.is_empty());
    let keys = restore_keys(spec, job, fallback.as_deref(), &mut skipped);
    (keys, skipped)
}

/// The key `spec` of `job` is saved under when it pushes, or why it is not saved.
pub fn key_to_save(spec: &CacheSpec, job: &JobResponse) -> Option<Result<String, Skipped>> {
    if !pushes(spec) {
        return None;
    }
    let key = key_of(spec, job);
    Some(match key_problem(&key) {
        None => Ok(key),
        Some(reason) => Err(Skipped { key, reason }),
    })
}

/// A script restoring every `pull`/`pull-push` cache of `job` into its project directory:
/// the first key of each entry (its key, its `fallback_keys`, then `CACHE_FALLBACK_KEY`) that
/// has an archive. `None` when the job restores nothing.
pub fn restore_script(
    cache_dir: &str,
    job: &JobResponse,
    dirs: &JobDirs,
) -> Option<(String, Vec<Skipped>)> {
    let specs: Vec<&CacheSpec> = job.cache.iter().filter(|c| pulls(c)).collect();
    if specs.is_empty() {
        return None;
    }
    let root = project_root(cache_dir, job);
    let mut skipped = Vec::new();
    let mut s = script_start(dirs, "Restoring cache");
    let fallback = job
        .variable(FALLBACK_KEY_VARIABLE)
        .map(|k| job.expand(k))
        .filter(|k| !k.is_empty());
    for spec in specs {
        let candidates = restore_keys(spec, job, fallback.as_deref(), &mut skipped);
        if candidates.is_empty() {
            continue;
        }
        let _ = writeln!(s, "__found=");
        for k in &candidates {
            let file = format!("{root}/{}/cache.tar.gz", quote(k));
            let _ = writeln!(
                s,
                "if [ -z \"$__found\" ]; then echo {}; if [ -f {file} ]; then __found=1; \
                 if tar -xzf {file}; then echo 'Successfully extracted cache'; \
                 else echo 'WARNING: Failed to extract cache'; fi; fi; fi",
                quote(&format!("Checking cache for {k}..."))
            );
        }
        let _ = writeln!(
            s,
            "[ -n \"$__found\" ] || echo {}",
            quote(&format!(
                "WARNING: no cache found for {}",
                candidates.join(", ")
            ))
        );
    }
    let _ = writeln!(s, "exit 0");
    Some((s, skipped))
}

/// A script saving every `push`/`pull-push` cache of `job` whose `when` matches `success`.
/// `None` when the job saves nothing.
pub fn archive_script(
    cache_dir: &str,
    job: &JobResponse,
    dirs: &JobDirs,
    success: bool,
) -> Option<(String, Vec<Skipped>)> {
    let specs: Vec<&CacheSpec> = job
        .cache
        .iter()
        .filter(|c| pushes(c) && c.when.holds_after(success))
        .collect();
    if specs.is_empty() {
        return None;
    }
    let root = project_root(cache_dir, job);
    let mut skipped = Vec::new();
    let mut s = script_start(dirs, "Saving cache");
    // A save cut short (a canceled job) must not leave its temporary archive in the cache.
    let _ = writeln!(
        s,
        "__tmp=; trap '[ -z \"$__tmp\" ] || rm -f \"$__tmp\"' EXIT; trap 'exit 1' INT TERM HUP"
    );
    let _ = writeln!(s, "shopt -s globstar nullglob dotglob 2>/dev/null || :");
    s.push_str(&crate::script::inside_function("cache", false));
    for spec in specs {
        let key = key_of(spec, job);
        if let Some(reason) = key_problem(&key) {
            skipped.push(Skipped { key, reason });
            continue;
        }
        let _ = writeln!(s, "echo {}", quote(&format!("Creating cache {key}...")));
        let _ = writeln!(s, "set --");
        for p in &spec.paths {
            let Some(p) = crate::artifact_paths::in_project(p, dirs) else {
                skipped.push(Skipped {
                    key: key.clone(),
                    reason: "a cache path must stay inside the project directory",
                });
                continue;
            };
            // An unmatched glob stays literal without nullglob (busybox): keep only what exists.
            let _ = writeln!(
                s,
                "for f in {}; do if {{ [ -e \"$f\" ] || [ -L \"$f\" ]; }} && __slipway_inside \"$f\"; then set -- \"$@\" \"$__p\"; fi; done",
                glob_word(&p)
            );
        }
        if spec.untracked {
            let _ = writeln!(
                s,
                "if command -v git >/dev/null 2>&1 && [ -d .git ]; then \
                 __nl='\n'; __ifs=$IFS; IFS=$__nl; for f in $(git ls-files -o 2>/dev/null); do set -- \"$@\" \"$f\"; done; IFS=$__ifs; \
                 else echo 'WARNING: untracked files are not cached: no git repository or no git here'; fi"
            );
        }
        let dir = format!("{root}/{}", quote(&key));
        let _ = writeln!(
            s,
            "if [ $# -eq 0 ]; then echo {warn}; else \
             __tmp=; mkdir -p {dir} && __tmp=$(mktemp {dir}/.cache.tar.gz.XXXXXX) \
             && tar -czf \"$__tmp\" -- \"$@\" && chmod 0644 \"$__tmp\" && mv -f \"$__tmp\" {dir}/cache.tar.gz \
             && echo {ok} || {{ [ -z \"$__tmp\" ] || rm -f \"$__tmp\"; echo 'WARNING: Failed to create cache'; }}; fi",
            warn = quote(&format!("WARNING: no files to cache for {key}")),
            ok = quote(&format!("Created cache {key}")),
        );
    }
    let _ = writeln!(s, "exit 0");
    Some((s, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipway_job::Variable;

    fn job() -> JobResponse {
        let mut job = JobResponse {
            id: 5,
            ..JobResponse::default()
        };
        job.job_info.project_full_path = "group/app".into();
        job.variables.push(Variable {
            key: "CI_COMMIT_REF_SLUG".into(),
            value: "main".into(),
            ..Variable::default()
        });
        job
    }

    #[test]
    fn keys_expand_job_variables() {
        let j = job();
        assert_eq!(j.expand("deps-$CI_COMMIT_REF_SLUG"), "deps-main");
        assert_eq!(j.expand("deps-${CI_COMMIT_REF_SLUG}-x"), "deps-main-x");
        assert_eq!(j.expand("a-$UNKNOWN-b"), "a--b");
        assert_eq!(j.expand("cost $"), "cost $");
    }

    #[test]
    fn bad_keys_are_refused() {
        assert!(key_problem("a/b").is_some());
        assert!(key_problem("a%2Fb").is_some());
        assert!(key_problem("..").is_some());
        assert_eq!(key_problem("deps-main"), None);
    }

    #[test]
    fn project_root_is_under_the_cache_dir() {
        let j = job();
        assert_eq!(project_root("/cache", &j), "'/cache'/'group/app'");
        assert_eq!(project_root("cache", &j), "\"$HOME\"/'cache'/'group/app'");
        let mut odd = j.clone();
        odd.job_info.project_full_path = "../../etc".into();
        odd.job_info.project_id = 9;
        assert_eq!(project_root("/cache", &odd), "'/cache'/'project-9'");
    }

    #[test]
    fn policies_choose_restore_and_save() {
        let dirs = JobDirs {
            builds_dir: "builds".into(),
            slot: 0,
            job_id: 5,
            clone_path: None,
        };
        let mut j = job();
        j.cache.push(CacheSpec {
            key: "k".into(),
            policy: "pull".into(),
            paths: vec!["deps".into()],
            ..CacheSpec::default()
        });
        assert!(restore_script("cache", &j, &dirs).is_some());
        assert!(archive_script("cache", &j, &dirs, true).is_none());
        j.cache[0].policy = "push".into();
        assert!(restore_script("cache", &j, &dirs).is_none());
        assert!(archive_script("cache", &j, &dirs, true).is_some());
        // on_success (the default) saves nothing after a failure.
        assert!(archive_script("cache", &j, &dirs, false).is_none());
    }
}
