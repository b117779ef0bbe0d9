//! `slipway exec` keeps jobs' `cache:` between runs of a project (issue 26), on the embedded
//! default (two local instances): a second run restores what the first saved, `--no-cache`
//! neither restores nor saves, a `cache:key:files` key follows the file's contents (not its
//! modification time), and docker-level jobs read and write the same cache.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{Run, World};

/// The image `scripts/docker-engine.sh` builds.
const IMAGE: &str = "slipway-busybox:latest";

/// A project directory holding `pipeline` and `lock.txt`.
fn project(w: &World, pipeline: &str) -> PathBuf {
    let dir = w.path().join("project");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(".gitlab-ci.yml"), pipeline).unwrap();
    std::fs::write(dir.join("lock.txt"), "dep 1.0\n").unwrap();
    dir
}

/// `slipway exec` of the project on the embedded default (no -c), with `RUN=run`.
fn exec(w: &World, dir: &Path, run: &str, extra: &[&str]) -> Run {
    let file = dir.join(".gitlab-ci.yml");
    let var = format!("RUN={run}");
    let mut args = vec!["exec", file.to_str().unwrap(), "--plain-variable", &var];
    args.extend_from_slice(extra);
    let out = w.run(&args);
    assert_eq!(out.code, Some(0), "{}", out.explain());
    out
}

/// What `job` found in its cache (its `restored=` line).
fn restored(run: &Run, job: &str) -> String {
    run.job_lines(job)
        .into_iter()
        .find_map(|l| l.strip_prefix("restored=").map(str::to_string))
        .unwrap_or_else(|| panic!("no restored= line from {job}\n{}", run.explain()))
}

const KEY_FILES: &str = r#"
job:
  cache:
    key:
      files: [lock.txt]
      prefix: deps
    paths: [vendor/]
  script:
    - if [ -f vendor/stamp ]; then echo "restored=$(cat vendor/stamp)"; else echo restored=none; fi
    - mkdir -p vendor && echo "$RUN" > vendor/stamp
"#;

#[test]
fn a_second_run_restores_the_first_runs_cache_and_no_cache_ignores_it() {
    let w = World::new();
    let dir = project(&w, KEY_FILES);

    assert_eq!(restored(&exec(&w, &dir, "first", &[]), "job"), "none");
    let second = exec(&w, &dir, "second", &[]);
    assert_eq!(restored(&second, "job"), "first");
    // The cache lives in the user's cache directory, not in the project.
    assert!(
        second.stderr.contains("xdg-cache/slipway/exec/project-"),
        "{}",
        second.explain()
    );
    assert!(!dir.join(".slipway").exists());

    // --no-cache: nothing restored, and nothing saved over the kept cache.
    assert_eq!(
        restored(&exec(&w, &dir, "third", &["--no-cache"]), "job"),
        "none"
    );
    assert_eq!(restored(&exec(&w, &dir, "fourth", &[]), "job"), "second");

    // Touching the key file without changing it keeps the key ...
    let lock = dir.join("lock.txt");
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(later)
        .unwrap();
    assert_eq!(restored(&exec(&w, &dir, "fifth", &[]), "job"), "fourth");
    // ... and changing its content is a new key: a cache miss.
    std::fs::write(&lock, "dep 2.0\n").unwrap();
    assert_eq!(restored(&exec(&w, &dir, "sixth", &[]), "job"), "none");
    assert_eq!(restored(&exec(&w, &dir, "seventh", &[]), "job"), "sixth");
    assert!(w.leftovers().is_empty(), "{:?}", w.leftovers());
    // Every save renamed its temporary archive: none is left in the cache.
    let temps = walk(&w.path().join("xdg-cache"))
        .into_iter()
        .filter(|p| p.contains(".cache.tar.gz."))
        .collect::<Vec<_>>();
    assert!(temps.is_empty(), "{temps:?}");
}

/// Every path under `dir`.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if p.is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

#[test]
fn docker_level_jobs_share_the_cache_of_the_other_jobs() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
    let w = World::new();
    let dir = project(
        &w,
        &format!(
            r#"
stages: [one, two]
shell-job:
  stage: one
  cache: {{key: shared, paths: [c/]}}
  script:
    - if [ -f c/stamp ]; then echo "restored=$(cat c/stamp)"; else echo restored=none; fi
    - mkdir -p c && echo "shell-$RUN" > c/stamp
docker-job:
  stage: two
  isolation: docker
  image: {IMAGE}
  cache: {{key: shared, paths: [c/]}}
  script:
    - if [ -f c/stamp ]; then echo "restored=$(cat c/stamp)"; else echo restored=none; fi
    - mkdir -p c && echo "docker-$RUN" > c/stamp
"#
        ),
    );
    let first = exec(&w, &dir, "1", &[]);
    assert_eq!(restored(&first, "shell-job"), "none");
    assert_eq!(restored(&first, "docker-job"), "shell-1");
    // The next run's first job sees what the docker job saved.
    let second = exec(&w, &dir, "2", &[]);
    assert_eq!(restored(&second, "shell-job"), "docker-1");
    assert_eq!(restored(&second, "docker-job"), "shell-2");
}
