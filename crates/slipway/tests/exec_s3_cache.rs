//! The distributed cache serves every source, not only GitLab: `slipway exec -c` with a runner
//! whose `[runners.cache]` is S3 (LocalStack's real S3, signatures checked) restores and saves
//! jobs' caches in the bucket, under GitLab Runner's object names, and a later run on a fresh
//! machine directory finds what an earlier one saved.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{Run, World};
use slipway_testkit::s3::{LocalStack, SECRET_KEY};

const BUCKET: &str = "exec-cache";

const PIPELINE: &str = r#"
job:
  cache:
    key: deps
    paths: [vendor/]
  script:
    - if [ -f vendor/stamp ]; then echo "restored=$(cat vendor/stamp)"; else echo restored=none; fi
    - mkdir -p vendor && echo "$RUN" > vendor/stamp
"#;

/// A shell runner on this machine with its builds under `work` and the S3 cache on `s3`.
fn config(w: &World, s3: &LocalStack, work: &str) -> PathBuf {
    let dir = w.path().join(work);
    w.write(
        &format!("{work}.toml"),
        &format!(
            r#"
concurrent = 1
[[runners]]
  name = "s3-exec"
  executor = "shell"
  builds_dir = "{builds}"
  cache_dir = "{cache}"
{s3}"#,
            builds = dir.join("builds").display(),
            cache = dir.join("cache").display(),
            s3 = common::s3_cache_section(&s3.address(), BUCKET, SECRET_KEY),
        ),
    )
}

fn exec(w: &World, config: &Path, project: &Path, run: &str) -> Run {
    let file = project.join(".gitlab-ci.yml");
    let var = format!("RUN={run}");
    let out = w.run(&[
        "exec",
        file.to_str().unwrap(),
        "-c",
        config.to_str().unwrap(),
        "--plain-variable",
        &var,
    ]);
    assert_eq!(out.code, Some(0), "{}", out.explain());
    out
}

fn restored(run: &Run) -> String {
    run.job_lines("job")
        .into_iter()
        .find_map(|l| l.strip_prefix("restored=").map(str::to_string))
        .unwrap_or_else(|| panic!("no restored= line\n{}", run.explain()))
}

#[test]
fn a_local_pipeline_saves_and_restores_its_cache_in_the_bucket() {
    let w = World::new();
    let s3 = LocalStack::start(BUCKET).expect("LocalStack");
    let project = w.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join(".gitlab-ci.yml"), PIPELINE).unwrap();

    let first = exec(&w, &config(&w, &s3, "first"), &project, "one");
    assert_eq!(restored(&first), "none");
    // GitLab Runner's object name, under the runner's name (a runner without a token).
    let objects = s3.objects(BUCKET).unwrap();
    assert!(
        objects
            .iter()
            .any(|o| o.starts_with("ci/runner/s3-exec/project/") && o.contains("/deps")),
        "{objects:?}\n{}",
        first.explain()
    );
    // The local cache was not used: nothing under the runner's cache_dir.
    let local = w.path().join("first/cache");
    assert!(
        !local.exists() || std::fs::read_dir(&local).unwrap().next().is_none(),
        "a local cache was written"
    );

    // Another machine directory, same bucket: the cache comes from S3.
    let second = exec(&w, &config(&w, &s3, "second"), &project, "two");
    assert_eq!(restored(&second), "one", "{}", second.explain());
}
