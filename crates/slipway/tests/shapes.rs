//! Resource-aware placement end to end: a runner with two instance shapes, each its own
//! `fleeting-plugin-local` process with real sshd instances; jobs sized by `SLIPWAY_CPU`.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::World;

const CONFIG: &str = r#"
concurrent = 4
[[runners]]
  name = "shaped"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 2
    instance_acquire_timeout = "2m"
    update_interval = "5s"
    update_interval_when_expecting = "200ms"
    shutdown_deletion_interval = "1s"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "5m"
    [[runners.autoscaler.shape]]
      name = "small"
      cpu = 1
      memory = "2GiB"
      cost = 1
    [[runners.autoscaler.shape]]
      name = "large"
      cpu = 4
      memory = "16GiB"
      cost = 3
"#;

const PIPELINE: &str = r#"
stages: [test]
tiny:
  stage: test
  script:
    - echo tiny ran
big:
  stage: test
  variables:
    SLIPWAY_CPU: "3"
    SLIPWAY_MEMORY: "4GiB"
  script:
    - echo big ran
huge:
  stage: test
  allow_failure: true
  variables:
    SLIPWAY_CPU: "16"
  script:
    - echo never runs
typo:
  stage: test
  allow_failure: true
  variables:
    SLIPWAY_MEMORY: "lots"
  script:
    - echo never runs
"#;

#[test]
fn jobs_go_to_the_shape_that_fits_and_impossible_requests_fail_at_once() {
    let w = World::new();
    let cfg = w.write("config.toml", CONFIG);
    let file = w.write("pipeline.yml", PIPELINE);
    let run = w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()]);
    let rows = run.summary();
    let row = |job: &str| {
        rows.iter()
            .find(|r| r.job == job)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {job}: {}", run.explain()))
    };
    // Half a small instance (cost 0.5) is cheaper than half a large one (1.5): tiny goes small.
    assert_eq!(row("tiny").status, "success", "{}", run.explain());
    assert!(
        row("tiny").instance.contains("-small-"),
        "{:?}",
        row("tiny")
    );
    // 3 CPUs only fit the large shape (two of its 2-CPU slots).
    assert_eq!(row("big").status, "success", "{}", run.explain());
    assert!(row("big").instance.contains("-large-"), "{:?}", row("big"));
    assert!(run.job_lines("big").contains(&"big ran".to_string()));
    // No shape has 16 CPUs: failed before anything started, saying why.
    assert_eq!(row("huge").status, "failed (allowed)", "{}", run.explain());
    assert_eq!(row("huge").instance, "-", "{:?}", row("huge"));
    let huge = run.job_lines("huge").join("\n");
    assert!(
        huge.contains(
            "the job asks for cpu=16 memory=0B, which no instance shape of this runner can hold: \
             small (cpu=1 memory=2GiB), large (cpu=4 memory=16GiB)"
        ),
        "{}",
        run.explain()
    );
    assert!(!huge.contains("never runs"));
    // A request that cannot be read names the variable.
    let typo = run.job_lines("typo").join("\n");
    assert!(
        typo.contains("SLIPWAY_MEMORY: memory \"lots\": expected"),
        "{}",
        run.explain()
    );
    // Both shapes' instances are gone after the run.
    assert!(
        !w.processes().iter().any(|p| p.contains("sshd")),
        "{:?}",
        w.processes()
    );
}
