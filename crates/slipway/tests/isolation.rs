//! Isolation levels end to end: `slipway exec` on `fleeting-plugin-local` instances, jobs
//! choosing `none` or `cgroup`, and a level the runner does not allow refused before it starts.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::World;

fn config(template: &str) -> String {
    format!(
        r#"
concurrent = 4
[[runners]]
  name = "isolating"
  executor = "instance"
  allowed_isolation = ["none", "cgroup"]
  slot_cgroup_template = "{template}"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 4
    max_instances = 1
    instance_acquire_timeout = "2m"
    update_interval = "5s"
    update_interval_when_expecting = "200ms"
    shutdown_deletion_interval = "1s"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "5m"
"#
    )
}

#[test]
fn jobs_get_the_level_they_ask_for_within_what_the_runner_allows() {
    let w = World::new();
    let pid = std::process::id();
    let parent = format!("slipway-e2e-{pid}");
    let cfg = w.write("config.toml", &config(&format!("{parent}/slot-${{slot}}")));
    let marker = format!("slipway-e2e-daemon-{pid}");
    let pipeline = format!(
        r#"
stages: [test]
hog:
  stage: test
  isolation: cgroup
  allow_failure: true
  variables:
    SLIPWAY_MEMORY: 64Mi
  script:
    - tail /dev/zero
daemon:
  stage: test
  isolation: cgroup
  script:
    - echo "in $SLIPWAY_CGROUP"
    - setsid bash -c 'exec -a {marker} sleep 600' < /dev/null > /dev/null 2>&1 &
    - sleep 0.5
    - pgrep -f {marker} > /dev/null && echo daemon started
plain:
  stage: test
  script:
    - grep -q '{parent}' /proc/self/cgroup && echo inside || echo "no slot cgroup"
docker:
  stage: test
  isolation: docker
  allow_failure: true
  script:
    - echo never runs
"#
    );
    let file = w.write("pipeline.yml", &pipeline);
    let run = w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()]);
    let row = |job: &str| {
        run.summary()
            .into_iter()
            .find(|r| r.job == job)
            .unwrap_or_else(|| panic!("no row for {job}: {}", run.explain()))
    };
    // The hog is OOM-killed in its 64 MiB slot and the trace says so.
    assert_eq!(row("hog").status, "failed (allowed)", "{}", run.explain());
    let hog = run.job_lines("hog").join("\n");
    assert!(hog.contains("Using isolation cgroup in"), "{hog}");
    assert!(
        hog.contains("the job was OOM-killed: it used more than its memory limit of 64 MiB"),
        "{}",
        run.explain()
    );
    // The daemon job ran in its slot cgroup; its setsid daemon did not outlive it.
    assert_eq!(row("daemon").status, "success", "{}", run.explain());
    let daemon = run.job_lines("daemon");
    assert!(
        daemon
            .iter()
            .any(|l| l.starts_with(&format!("in {parent}/slot-"))),
        "{daemon:?}"
    );
    assert!(daemon.contains(&"daemon started".to_string()), "{daemon:?}");
    assert!(
        !w.processes().iter().any(|p| p.contains(&marker))
            && !common::processes_matching(&marker)
                .iter()
                .any(|p| !p.contains("pgrep")),
        "the daemon outlived its job"
    );
    // No level asked for: the runner's default, none.
    assert_eq!(row("plain").status, "success", "{}", run.explain());
    assert!(
        run.job_lines("plain")
            .contains(&"no slot cgroup".to_string())
    );
    // A level the runner does not allow: refused before it starts, naming both.
    assert_eq!(
        row("docker").status,
        "failed (allowed)",
        "{}",
        run.explain()
    );
    assert_eq!(row("docker").instance, "-");
    let docker = run.job_lines("docker").join("\n");
    assert!(
        docker.contains(
            "the job asks for isolation \"docker\" but runner \"isolating\" allows only \"none\", \"cgroup\""
        ),
        "{}",
        run.explain()
    );
    assert!(!docker.contains("never runs"));
    // The slot cgroups are gone.
    for m in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let p = m.path().join(&parent);
        let slots: Vec<_> = std::fs::read_dir(&p)
            .map(|d| d.flatten().filter(|e| e.path().is_dir()).collect())
            .unwrap_or_default();
        assert!(
            slots.is_empty(),
            "left behind under {}: {slots:?}",
            p.display()
        );
        let _ = std::fs::remove_dir(&p);
    }
}

#[test]
fn a_default_level_outside_allowed_isolation_is_a_config_error() {
    let w = World::new();
    let cfg = w.write(
        "config.toml",
        &config("t/slot-${slot}").replace(
            "allowed_isolation = [\"none\", \"cgroup\"]",
            "allowed_isolation = [\"none\"]\n  use_slot_cgroups = true",
        ),
    );
    let run = w.run(&["verify-config", "-c", cfg.to_str().unwrap()]);
    assert_ne!(run.code, Some(0), "{}", run.explain());
    let all = format!("{}{}", run.stdout, run.stderr);
    assert!(
        all.contains(
            "runners[0].isolation: the default level \"cgroup\" is not in allowed_isolation (none)"
        ),
        "{all}"
    );
}

/// Two concurrent `instance` jobs on `fleeting-plugin-local`: each gets a fresh instance of its
/// own (every slot), and each instance is removed after its job while the run goes on, although
/// `max_use_count` is unlimited and `idle_time` long.
#[test]
fn instance_jobs_get_a_fresh_instance_each_which_is_removed_after_the_job() {
    let w = World::new();
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 4
[[runners]]
  name = "whole"
  executor = "instance"
  allowed_isolation = ["none", "instance"]
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 2
    max_instances = 3
    max_use_count = 0
    instance_acquire_timeout = "2m"
    update_interval = "2s"
    update_interval_when_expecting = "200ms"
    shutdown_deletion_interval = "1s"
    [runners.autoscaler.plugin_config]
      dir = "{}"
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "20m"
"#,
            w.path().join("plugin-state").display()
        ),
    );
    // Each whole-instance job notes where its instance lives; the check job (a later stage,
    // on a shared instance) waits for both places to vanish.
    let pipeline = r#"
stages: [whole, check]
a:
  stage: whole
  isolation: instance
  script:
    - echo "$SLIPWAY_LOCAL_INSTANCE" > where-a.txt
    - sleep 2
  artifacts:
    paths: [where-a.txt]
b:
  stage: whole
  isolation: instance
  script:
    - echo "$SLIPWAY_LOCAL_INSTANCE" > where-b.txt
    - sleep 2
  artifacts:
    paths: [where-b.txt]
check:
  stage: check
  script:
    - |
      for f in where-a.txt where-b.txt; do
        d=$(cat $f)
        for i in $(seq 240); do [ -e "$d" ] || break; sleep 0.25; done
        if [ -e "$d" ]; then echo "still there: $f"; else echo "gone: $f"; fi
      done
"#;
    let file = w.write("pipeline.yml", pipeline);
    let run = w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()]);
    let row = |job: &str| {
        run.summary()
            .into_iter()
            .find(|r| r.job == job)
            .unwrap_or_else(|| panic!("no row for {job}: {}", run.explain()))
    };
    for job in ["a", "b", "check"] {
        assert_eq!(row(job).status, "success", "{job}: {}", run.explain());
    }
    let (a, b, check) = (row("a").instance, row("b").instance, row("check").instance);
    assert_ne!(a, b, "two instance jobs shared an instance");
    assert!(
        check != a && check != b,
        "a later job landed on a whole-instance job's instance"
    );
    for job in ["a", "b"] {
        let lines = run.job_lines(job).join("\n");
        assert!(
            lines.contains("is this job's alone and is removed after it"),
            "{lines}"
        );
    }
    let check_lines = run.job_lines("check");
    for f in ["where-a.txt", "where-b.txt"] {
        assert!(
            check_lines.contains(&format!("gone: {f}")),
            "{check_lines:?}\n{}",
            run.explain()
        );
    }
    assert!(w.processes().is_empty(), "left: {:?}", w.processes());
}

#[test]
fn the_instance_level_is_refused_unless_the_runner_allows_it() {
    let w = World::new();
    let cfg = w.write("config.toml", &config("slipway-e2e-unused/slot-${slot}"));
    let file = w.write(
        "pipeline.yml",
        "whole:\n  isolation: instance\n  allow_failure: true\n  script: [echo never runs]\n",
    );
    let run = w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()]);
    let lines = run.job_lines("whole").join("\n");
    assert!(
        lines.contains(
            "the job asks for isolation \"instance\" but runner \"isolating\" allows only \"none\", \"cgroup\""
        ),
        "{}",
        run.explain()
    );
    assert!(!lines.contains("never runs"));
}
