//! The embedded default's local instances share this host's kernel, cgroupfs and Docker Engine:
//! `slipway exec` with cgroup and docker jobs on both at once must never fail by itself
//! (issue 26: slot 0 of one instance was slot 0 of the other, and one job's cleanup killed
//! the other's container).

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::World;

/// The image `scripts/docker-engine.sh` builds.
const IMAGE: &str = "slipway-busybox:latest";

/// Consecutive runs of the pipeline.
const RUNS: usize = 30;

/// Two cgroup jobs and a docker job in one stage: three jobs on two instances of two slots,
/// so the docker job always runs beside a cgroup job on the other instance. The sleeps keep
/// them running at once; each job prints where it runs.
fn pipeline() -> String {
    format!(
        r#"
stages: [test]
cg-a:
  stage: test
  isolation: cgroup
  script:
    - echo "cgroup=$SLIPWAY_CGROUP"
    - sleep 1
cg-b:
  stage: test
  isolation: cgroup
  script:
    - echo "cgroup=$SLIPWAY_CGROUP"
    - sleep 1
dock:
  stage: test
  isolation: docker
  image: {IMAGE}
  script:
    - sleep 1
    - echo docker-done
"#
    )
}

/// The slot cgroups of an instance in every hierarchy on this host.
fn cgroups_of(instance: &str) -> Vec<String> {
    // Each v1 hierarchy (and a cgroup2 mount beside them), or the root itself on a v2 host.
    let root = std::path::PathBuf::from("/sys/fs/cgroup");
    std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|m| m.path())
        .chain(std::iter::once(root.clone()))
        .map(|m| m.join("slipway").join(instance))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect()
}

#[test]
fn embedded_default_runs_cgroup_and_docker_jobs_on_both_local_instances_without_failing() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
    let w = World::new();
    let file = w.write("pipeline.yml", &pipeline());
    let mut failed = Vec::new();
    for n in 1..=RUNS {
        // No -c: the embedded default (two local instances, two slots each).
        let run = w.run(&["exec", file.to_str().unwrap()]);
        let rows = run.summary();
        let ok = run.code == Some(0)
            && rows.len() == 3
            && rows.iter().all(|r| r.status == "success")
            && run.job_lines("dock").contains(&"docker-done".to_string());
        if !ok {
            failed.push(format!("run {n}: {}", run.explain()));
            continue;
        }
        let instances: std::collections::BTreeSet<&str> =
            rows.iter().map(|r| r.instance.as_str()).collect();
        assert_eq!(
            instances.len(),
            2,
            "both instances ran jobs\n{}",
            run.explain()
        );
        for row in rows.iter().filter(|r| r.job.starts_with("cg-")) {
            // Each cgroup job in its own instance's subtree, so slot 0 of one instance is not
            // slot 0 of the other.
            let want = format!("cgroup=slipway/{}/slot-{}", row.instance, row.slot);
            assert!(
                run.job_lines(&row.job).contains(&want),
                "{want}\n{}",
                run.explain()
            );
        }
        for instance in instances {
            let left = cgroups_of(instance);
            assert!(left.is_empty(), "run {n} left {left:?}");
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {RUNS} runs failed:\n{}",
        failed.len(),
        failed.join("\n\n")
    );
}
