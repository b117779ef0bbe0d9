//! Cache keys and artifact paths: `slipway_executor::cache` (keys expanded from the job's
//! variables, the project's cache directory, the restore and save scripts) and
//! `slipway_executor::artifact_paths` (paths expanded and made relative to the project
//! directory). No accepted key or path may name a place outside the cache directory or the
//! project directory.

use slipway_executor::artifact_paths;
use slipway_executor::cache::{archive_script, project_root, restore_script};
use slipway_executor::script::JobDirs;
use slipway_job::JobResponse;
use slipway_job::{CacheSpec, Variable};

/// The input: a cache entry, a project path and variables.
#[derive(Debug, Clone, bolero::generator::TypeGenerator)]
pub struct Input {
    /// `cache:key` (may use `$VAR`).
    pub key: String,
    /// `cache:fallback_keys`.
    pub fallback_keys: Vec<String>,
    /// `cache:paths` / `artifacts:paths`.
    pub paths: Vec<String>,
    /// The project's full path (`group/project`).
    pub project_full_path: String,
    /// Variables `(key, value)`.
    pub variables: Vec<(String, String)>,
}

/// Keys that pass become one directory under the project's cache root; artifact paths that
/// pass stay inside the project directory; scripts are produced without panicking.
pub fn check(input: &Input) {
    let mut job = JobResponse::default();
    job.job_info.project_full_path = input.project_full_path.clone();
    job.job_info.project_id = 7;
    job.variables = input
        .variables
        .iter()
        .take(8)
        .map(|(k, v)| Variable::new(k.clone(), v.clone()))
        .collect();
    let root = project_root("cache", &job);
    assert!(
        root.starts_with("\"$HOME\"/"),
        "cache root {root:?} not under $HOME"
    );
    assert!(
        !root.contains("/../") && !root.ends_with("/..") && !root.contains("'..'"),
        "cache root {root:?}"
    );
    job.cache = vec![CacheSpec {
        key: input.key.clone(),
        fallback_keys: input.fallback_keys.iter().take(4).cloned().collect(),
        paths: input.paths.iter().take(8).cloned().collect(),
        ..Default::default()
    }];
    let dirs = JobDirs {
        builds_dir: "builds".into(),
        slot: 0,
        job_id: 1,
        clone_path: None,
    };
    // Paths are taken relative to the project directory, with variables expanded, whether the
    // builds directory is under $HOME or absolute.
    let absolute = JobDirs {
        builds_dir: "/builds".into(),
        ..dirs.clone()
    };
    for p in input.paths.iter().take(8) {
        let expanded = artifact_paths::expand(p, &job);
        for d in [&dirs, &absolute] {
            if let Some(rel) = artifact_paths::in_project(&expanded, d) {
                assert!(!rel.starts_with('/'), "{p:?} accepted as {rel:?}");
                assert!(
                    // Without a `..` segment a relative path cannot climb out.
                    !rel.split('/').any(|c| c == ".."),
                    "{p:?} accepted as {rel:?}, which leaves the project directory"
                );
            }
        }
    }
    let keys: Vec<String> = std::iter::once(&input.key)
        .chain(input.fallback_keys.iter().take(4))
        .map(|k| job.expand(k))
        .collect();
    if let Some((script, skipped)) = restore_script("cache", &job, &dirs) {
        for k in &keys {
            let shown = format!("Checking cache for {k}...");
            let used = script.contains(&shown) && !skipped.iter().any(|s| &s.key == k);
            if used {
                assert!(!k.contains('/'), "key {k:?} with a slash used");
                assert!(
                    !k.is_empty() && k.chars().any(|c| c != '.'),
                    "key {k:?} names no directory"
                );
            }
        }
    }
    for success in [true, false] {
        let _ = archive_script("cache", &job, &dirs, success);
    }
}
