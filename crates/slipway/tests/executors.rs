//! Every executor end to end through `slipway exec`: shell and custom on this machine, docker on
//! the local Docker Engine, and docker-autoscaler on `fleeting-plugin-local` instances reaching
//! the engine through `docker system dial-stdio` over SSH.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::World;

/// The image `scripts/docker-engine.sh` builds.
const IMAGE: &str = "slipway-busybox:latest";

/// Starts the Docker Engine and builds the test image if needed (once per test process).
fn ensure_engine() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
}

/// A pipeline whose job reaches a busybox `httpd` service by its alias `web`.
fn service_pipeline() -> String {
    format!(
        r#"
stages: [test]
web:
  stage: test
  image: {IMAGE}
  services:
    - name: {IMAGE}
      alias: web
      command: ["sh", "-c", "echo served-by-web > /var/www/index.html && exec httpd -f -p 80 -h /var/www"]
  script:
    - fetch() {{ printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 2 web 80; }}
    - for i in $(seq 1 100); do fetch > /tmp/page 2>/dev/null && grep -q served-by-web /tmp/page && break; sleep 0.1; done
    - grep served-by-web /tmp/page
    - test ! -e /var/run/docker.sock && echo "no docker socket"
"#
    )
}

/// Names of the runner's containers, networks and volumes still on the engine.
fn containers_labelled(runner: &str) -> Vec<String> {
    let mut left = Vec::new();
    for (kind, field) in [
        (&["ps", "-a"][..], "{{.Names}}"),
        (&["network", "ls"][..], "{{.Name}}"),
        (&["volume", "ls"][..], "{{.Name}}"),
    ] {
        let out = std::process::Command::new("docker")
            .args(kind)
            .args([
                "--filter",
                &format!("label=com.slipway.runner={runner}"),
                "--format",
                field,
            ])
            .output()
            .expect("docker");
        assert!(
            out.status.success(),
            "docker {kind:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        left.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string),
        );
    }
    left
}

#[test]
fn shell_runs_jobs_here_at_level_none_or_cgroup() {
    let w = World::new();
    let pid = std::process::id();
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
[[runners]]
  name = "here"
  executor = "shell"
  slot_cgroup_template = "slipway-shell-{pid}/slot-${{slot}}"
"#
        ),
    );
    let file = w.write(
        "pipeline.yml",
        r#"
stages: [test]
plain:
  stage: test
  script:
    - echo "project in $CI_PROJECT_DIR"
contained:
  stage: test
  isolation: cgroup
  script:
    - echo "cgroup $SLIPWAY_CGROUP"
"#,
    );
    let run = w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let rows = run.summary();
    assert!(rows.iter().all(|r| r.instance == "localhost"), "{rows:?}");
    assert!(
        run.job_lines("contained")
            .iter()
            .any(|l| l.starts_with(&format!("cgroup slipway-shell-{pid}/slot-"))),
        "{}",
        run.explain()
    );
    for m in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let _ = std::fs::remove_dir(m.path().join(format!("slipway-shell-{pid}")));
    }
}

#[test]
fn docker_runs_a_job_with_a_service_by_alias_and_removes_everything() {
    ensure_engine();
    let w = World::new();
    let runner = format!("docker-{}", std::process::id());
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 1
[[runners]]
  name = "{runner}"
  executor = "docker"
  [runners.docker]
    image = "{IMAGE}"
    pull_policy = "never"
"#
        ),
    );
    let file = w.write("pipeline.yml", &service_pipeline());
    let run = w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let lines = run.job_lines("web");
    assert!(
        lines.contains(&"served-by-web".to_string()),
        "{}",
        run.explain()
    );
    assert!(
        lines.contains(&"no docker socket".to_string()),
        "{}",
        run.explain()
    );
    assert!(containers_labelled(&runner).is_empty());
}

#[test]
fn docker_autoscaler_reaches_the_instances_engine_through_dial_stdio() {
    ensure_engine();
    let w = World::new();
    let runner = format!("das-{}", std::process::id());
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 1
[[runners]]
  name = "{runner}"
  executor = "docker-autoscaler"
  [runners.docker]
    image = "{IMAGE}"
    pull_policy = "never"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_instances = 1
    instance_acquire_timeout = "2m"
    update_interval = "5s"
    update_interval_when_expecting = "200ms"
    shutdown_deletion_interval = "1s"
"#
        ),
    );
    let file = w.write("pipeline.yml", &service_pipeline());
    let run = w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let lines = run.job_lines("web");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Using isolation docker through the instance's Docker Engine")),
        "{}",
        run.explain()
    );
    assert!(
        lines.contains(&"served-by-web".to_string()),
        "{}",
        run.explain()
    );
    let row = run.summary().into_iter().find(|r| r.job == "web").unwrap();
    assert!(row.instance.starts_with('x'), "ran on an instance: {row:?}");
    assert!(containers_labelled(&runner).is_empty());
    assert!(!w.processes().iter().any(|p| p.contains("sshd")));
}

#[test]
fn custom_executor_drives_a_pipeline_with_shell_script_drivers() {
    let w = World::new();
    let drivers = w.path().join("driver");
    std::fs::create_dir_all(&drivers).unwrap();
    let script = |name: &str, body: &str| {
        let p = drivers.join(name);
        std::fs::write(
            &p,
            format!("#!/usr/bin/env bash\nset -eo pipefail\n{body}\n"),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    };
    let envs = w.path().join("envs");
    let config = script(
        "config.sh",
        r#"echo '{"driver": {"name": "demo", "version": "1.0"}}'"#,
    );
    let prepare = script(
        "prepare.sh",
        &format!(
            "mkdir -p {}/job-$CUSTOM_ENV_CI_JOB_ID\necho prepared",
            envs.display()
        ),
    );
    let run_sh = script(
        "run.sh",
        &format!(
            "cd {}/job-$CUSTOM_ENV_CI_JOB_ID\nbash \"$1\" || exit \"$BUILD_FAILURE_EXIT_CODE\"",
            envs.display()
        ),
    );
    let cleanup = script(
        "cleanup.sh",
        &format!("rm -rf {}/job-$CUSTOM_ENV_CI_JOB_ID", envs.display()),
    );
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 1
[[runners]]
  name = "custom"
  executor = "custom"
  builds_dir = "{}"
  [runners.custom]
    config_exec = "{config}"
    prepare_exec = "{prepare}"
    run_exec = "{run_sh}"
    cleanup_exec = "{cleanup}"
"#,
            w.path().join("builds").display()
        ),
    );
    let file = w.write(
        "pipeline.yml",
        r#"
stages: [build, test]
build:
  stage: build
  script:
    - echo "built by $CI_JOB_NAME"
fails:
  stage: test
  allow_failure: true
  script:
    - exit 4
"#,
    );
    let run = w.run(&["exec", "-c", cfg.to_str().unwrap(), file.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let build = run.job_lines("build");
    assert!(
        build
            .iter()
            .any(|l| l.contains("Using Custom executor with driver demo 1.0")),
        "{}",
        run.explain()
    );
    assert!(
        build.contains(&"built by build".to_string()),
        "{}",
        run.explain()
    );
    let fails = run
        .summary()
        .into_iter()
        .find(|r| r.job == "fails")
        .unwrap();
    assert_eq!(fails.status, "failed (allowed)");
    assert!(
        std::fs::read_dir(&envs).map(|d| d.count()).unwrap_or(0) == 0,
        "cleanup_exec removed every job's dir"
    );
}
