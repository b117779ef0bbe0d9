//! End-to-end: `slipway exec` with real plugin processes and real sshd instances.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;

use common::World;

const PIPELINE: &str = r#"
stages: [build, test, deploy]
variables:
  GREETING: "hello"
compile:
  stage: build
  script:
    - mkdir -p out
    - echo "$GREETING from compile" > out/msg.txt
  artifacts:
    paths: [out/]
unit:
  stage: test
  script:
    - cat out/msg.txt
lint:
  stage: test
  allow_failure: true
  script:
    - echo "lint runs"
    - exit 7
    - echo "never printed"
  after_script:
    - echo "after_script after failure"
slow:
  stage: test
  script:
    - for i in 1 2 3; do echo "tick $i"; done
deploy:
  stage: deploy
  script:
    - echo "deploying $(cat out/msg.txt)"
"#;

#[test]
fn three_stage_pipeline_runs_end_to_end() {
    let w = World::new();
    let file = w.write("pipeline.yml", PIPELINE);
    let run = w.run(&["exec", file.to_str().expect("path")]);
    assert_eq!(run.code, Some(0), "{}", run.explain());

    // Artifacts reach a later job, in the same stage's neighbour and the next stage.
    assert!(
        run.job_lines("unit")
            .contains(&"hello from compile".to_string()),
        "{}",
        run.explain()
    );
    assert!(
        run.job_lines("deploy")
            .contains(&"deploying hello from compile".to_string()),
        "{}",
        run.explain()
    );
    // The failing job stops at the failing line, and after_script still runs.
    let lint = run.job_lines("lint");
    assert!(lint.contains(&"lint runs".to_string()), "{}", run.explain());
    assert!(
        !lint.contains(&"never printed".to_string()),
        "{}",
        run.explain()
    );
    let failed_at = lint
        .iter()
        .position(|l| l.contains("exit code 7"))
        .expect("exit code shown");
    let after_at = lint
        .iter()
        .position(|l| l == "after_script after failure")
        .expect("after_script ran");
    assert!(
        after_at > failed_at,
        "after_script must run after the failure: {lint:?}"
    );
    // Output is streamed in order.
    let ticks: Vec<String> = run
        .job_lines("slow")
        .into_iter()
        .filter(|l| l.starts_with("tick"))
        .collect();
    assert_eq!(ticks, ["tick 1", "tick 2", "tick 3"]);

    let rows = run.summary();
    let status: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (r.job.clone(), r.stage.clone(), r.status.clone()))
        .collect();
    assert_eq!(
        status,
        [
            ("compile", "build", "success"),
            ("unit", "test", "success"),
            ("lint", "test", "failed (allowed)"),
            ("slow", "test", "success"),
            ("deploy", "deploy", "success"),
        ]
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())),
        "{}",
        run.explain()
    );
    assert!(
        rows.iter()
            .all(|r| !r.instance.is_empty() && r.instance != "-"),
        "{rows:?}"
    );
    assert!(
        run.stdout.contains("Pipeline succeeded"),
        "{}",
        run.explain()
    );
    assert!(
        w.leftovers().is_empty(),
        "left in TMPDIR: {:?}",
        w.leftovers()
    );
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
}

#[test]
fn failing_job_fails_the_pipeline_and_skips_later_stages() {
    let w = World::new();
    let file = w.write(
        "p.yml",
        "stages: [a, b]\nbreak:\n  stage: a\n  script: [\"false\"]\ncleanup:\n  stage: b\n  when: on_failure\n  script: [echo cleaning]\nnext:\n  stage: b\n  script: [echo never]\n",
    );
    let run = w.run(&["exec", file.to_str().expect("path")]);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    let rows = run.summary();
    let st = |j: &str| rows.iter().find(|r| r.job == j).map(|r| r.status.clone());
    assert_eq!(st("break").as_deref(), Some("failed"));
    assert_eq!(st("cleanup").as_deref(), Some("success"));
    assert_eq!(st("next").as_deref(), Some("skipped"));
    assert!(run.job_lines("cleanup").contains(&"cleaning".to_string()));
    assert!(run.stdout.contains("Pipeline failed"));
}

fn config(cap: u32, max_instances: u32, max_use: u32) -> String {
    format!(
        r#"
concurrent = 4
[[runners]]
  name = "t"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = {cap}
    max_instances = {max_instances}
    max_use_count = {max_use}
    update_interval = "2s"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [[runners.autoscaler.policy]]
      idle_count = 0
      idle_time = "10m"
"#
    )
}

#[test]
fn capacity_per_instance_two_puts_two_jobs_on_one_instance() {
    let w = World::new();
    let cfg = w.write("config.toml", &config(2, 2, 0));
    // Each job waits until the other has started on the same host: only two concurrent jobs
    // sharing one instance (one $HOME) can both finish.
    let job = |me: &str, other: &str| {
        format!(
            "{me}:\n  script:\n    - touch \"$HOME/started-{me}\"\n    - for i in $(seq 1 100); do [ -e \"$HOME/started-{other}\" ] && break; sleep 0.1; done\n    - test -e \"$HOME/started-{other}\"\n"
        )
    };
    let file = w.write(
        "p.yml",
        &format!("{}{}", job("left", "right"), job("right", "left")),
    );
    let run = w.run(&[
        "exec",
        "-c",
        cfg.to_str().expect("cfg"),
        file.to_str().expect("p"),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let rows = run.summary();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].instance, rows[1].instance, "{rows:?}");
    let slots: HashSet<&str> = rows.iter().map(|r| r.slot.as_str()).collect();
    assert_eq!(slots, HashSet::from(["0", "1"]), "{rows:?}");
}

#[test]
fn max_use_count_one_never_reuses_an_instance() {
    let w = World::new();
    let cfg = w.write("config.toml", &config(1, 2, 1));
    let mut yaml = String::from("stages: [s1, s2, s3]\n");
    for (job, stage) in [("a", "s1"), ("b", "s1"), ("c", "s2"), ("d", "s3")] {
        yaml.push_str(&format!(
            "{job}:\n  stage: {stage}\n  script:\n    - test ! -e \"$HOME/used\"\n    - touch \"$HOME/used\"\n"
        ));
    }
    let file = w.write("p.yml", &yaml);
    let run = w.run(&[
        "exec",
        "-c",
        cfg.to_str().expect("cfg"),
        file.to_str().expect("p"),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let rows = run.summary();
    let instances: HashSet<&str> = rows.iter().map(|r| r.instance.as_str()).collect();
    assert_eq!(
        instances.len(),
        4,
        "every job on a fresh instance: {rows:?}"
    );
}

#[test]
fn unsupported_pipeline_key_is_reported_with_its_line() {
    let w = World::new();
    let file = w.write(
        "p.yml",
        "job:\n  script: [echo hi]\n  run:\n    - name: step\n",
    );
    let run = w.run(&["exec", file.to_str().expect("path")]);
    assert_eq!(run.code, Some(2), "{}", run.explain());
    assert!(
        run.stderr
            .contains("p.yml:3: job \"job\": unsupported key \"run\""),
        "{}",
        run.explain()
    );
    assert!(w.processes().is_empty(), "{:?}", w.processes());
}

#[test]
fn bad_config_value_names_file_line_and_key() {
    let w = World::new();
    let cfg = w.write(
        "config.toml",
        &config(2, 2, 0).replace("max_instances = 2", "max_instances = \"many\""),
    );
    let file = w.write("p.yml", "job:\n  script: [echo hi]\n");
    let run = w.run(&[
        "exec",
        "-c",
        cfg.to_str().expect("cfg"),
        file.to_str().expect("p"),
    ]);
    assert_eq!(run.code, Some(2), "{}", run.explain());
    assert!(
        run.stderr
            .contains("config.toml:9: runners[0].autoscaler.max_instances:"),
        "{}",
        run.explain()
    );
}

#[test]
fn job_timeout_kills_the_step_and_fails_the_job() {
    let w = World::new();
    let file = w.write(
        "p.yml",
        r#"
slow:
  timeout: 2s
  script:
    - cp "$(command -v sleep)" "$HOME/slw-timeout-sleeper"
    - echo started
    - '"$HOME/slw-timeout-sleeper" 300'
  after_script:
    - if pgrep -f slw-timeout-sleeper >/dev/null; then echo "sleeper alive"; else echo "sleeper gone"; fi
"#,
    );
    let run = w.run(&["exec", file.to_str().expect("path")]);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    let lines = run.job_lines("slow");
    assert!(
        lines.iter().any(|l| l.contains("job execution timeout")),
        "{}",
        run.explain()
    );
    assert!(
        lines.contains(&"sleeper gone".to_string()),
        "{}",
        run.explain()
    );
    assert_eq!(run.summary()[0].status, "failed", "{}", run.explain());
}

#[test]
fn exec_deletes_its_instances_even_when_the_config_keeps_them() {
    let w = World::new();
    // GitLab's default: delete_instances_on_shutdown = false. An exec run owns its instances'
    // state, so it deletes them anyway rather than leaving sshd hosts nobody can find.
    let cfg = w.write(
        "config.toml",
        &config(1, 1, 0).replace("delete_instances_on_shutdown = true", ""),
    );
    let file = w.write("p.yml", "job:\n  script: [echo hi]\n");
    let run = w.run(&[
        "exec",
        "-c",
        cfg.to_str().expect("cfg"),
        file.to_str().expect("p"),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(
        w.processes().is_empty(),
        "left running: {:?}",
        w.processes()
    );
    assert!(
        w.leftovers().is_empty(),
        "left in TMPDIR: {:?}",
        w.leftovers()
    );
}

#[test]
fn more_parallel_jobs_than_slots_wait_for_capacity() {
    let w = World::new();
    // One instance with one slot, three jobs in one stage and `concurrent = 4`: they queue.
    let cfg = w.write("config.toml", &config(1, 1, 0));
    let file = w.write(
        "p.yml",
        "a:\n  script: [echo a]\nb:\n  script: [echo b]\nc:\n  script: [echo c]\n",
    );
    let run = w.run(&[
        "exec",
        "-c",
        cfg.to_str().expect("cfg"),
        file.to_str().expect("p"),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let rows = run.summary();
    assert!(rows.iter().all(|r| r.status == "success"), "{rows:?}");
    let instances: HashSet<&str> = rows.iter().map(|r| r.instance.as_str()).collect();
    assert_eq!(instances.len(), 1, "{rows:?}");
}

#[test]
fn instance_ready_command_runs_before_any_job() {
    let w = World::new();
    let cfg = w.write(
        "config.toml",
        &config(1, 1, 0).replace(
            "capacity_per_instance = 1",
            "capacity_per_instance = 1\n    instance_ready_command = \"echo ready > $HOME/ready-marker\"",
        ),
    );
    let file = w.write("p.yml", "job:\n  script: ['cat \"$HOME/ready-marker\"']\n");
    let run = w.run(&[
        "exec",
        "-c",
        cfg.to_str().expect("cfg"),
        file.to_str().expect("p"),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(
        run.job_lines("job").contains(&"ready".to_string()),
        "{}",
        run.explain()
    );
}
