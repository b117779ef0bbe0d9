//! `slipway exec` as a user meets it on a real project: `--list`, the variables file and
//! `--variable`, `--job` with `--needs`, `--manual`, `include:project` from `--include-root`,
//! `--report`, retries and coverage in the summary, and a pipeline workflow rules filter out.
//! Jobs run on a shell runner on this machine.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::World;

const SHELL: &str = "concurrent = 4\n[[runners]]\n  name = \"here\"\n  executor = \"shell\"\n";

/// A git checkout holding `pipeline`, and a shell runner's config.
fn project(w: &World, pipeline: &str) -> (String, String) {
    let dir = w.path().join("project");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(".gitlab-ci.yml"), pipeline).unwrap();
    let st = std::process::Command::new("git")
        .args(["init", "-q", "-b", "main"])
        .current_dir(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    let cfg = w.write("shell.toml", SHELL);
    (
        dir.join(".gitlab-ci.yml").display().to_string(),
        cfg.display().to_string(),
    )
}

/// A local user reads nothing `slipway exec` writes: on the embedded default (the local
/// plugin's instance), the run directory above the job is 0700 and a file variable 0600 in a
/// 0700 directory, whatever the job's umask.
#[test]
fn exec_writes_its_run_directory_and_file_variables_owner_only() {
    let w = World::new();
    let (file, _) = project(
        &w,
        r#"
show:
  script:
    - umask 022
    - echo "file=$(stat -c %a "$CERT") dir=$(stat -c %a "$(dirname "$CERT")")"
    - d="$PWD"; while [ -n "$d" ]; do case "${d##*/}" in slipway-exec-*) echo "run=$(stat -c %a "$d")";; esac; d="${d%/*}"; done
"#,
    );
    std::fs::write(
        w.path().join("project/.slipway-variables.yml"),
        "CERT: {value: \"-----BEGIN KEY-----\", file: true}\n",
    )
    .unwrap();
    let run = w.run(&["exec", &file]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let lines = run.job_lines("show");
    assert!(
        lines.contains(&"file=600 dir=700".to_string()),
        "{}",
        run.explain()
    );
    assert!(lines.contains(&"run=700".to_string()), "{}", run.explain());
}

#[test]
fn list_shows_the_jobs_gitlab_would_create_and_runs_none() {
    let w = World::new();
    let (file, cfg) = project(
        &w,
        r#"
stages: [build, test, deploy]
build:
  stage: build
  script: [echo "OUT ran"]
test:
  stage: test
  needs: [build]
  script: [echo "OUT ran"]
deploy:
  stage: deploy
  when: manual
  script: [echo "OUT ran"]
later:
  stage: deploy
  when: delayed
  start_in: 10 minutes
  script: [echo "OUT ran"]
gone:
  rules:
    - if: $NOPE
  script: [echo "OUT ran"]
"#,
    );
    let run = w.run(&["exec", "-c", &cfg, &file, "--list"]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let rows: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["JOB", "STAGE", "WHEN", "ALLOW_FAILURE", "NEEDS"]);
    assert_eq!(rows[1], ["build", "build", "on_success", "false", "-"]);
    assert_eq!(rows[2], ["test", "test", "on_success", "false", "build"]);
    assert_eq!(rows[3], ["deploy", "deploy", "manual", "true", "-"]);
    assert_eq!(rows[4], ["later", "deploy", "delayed", "10m", "false", "-"]);
    assert_eq!(rows.len(), 5, "{}", run.explain());
    assert!(!run.stdout.contains("OUT ran"), "{}", run.explain());
}

#[test]
fn variables_file_values_are_masked_and_never_reach_the_job_directory() {
    let w = World::new();
    let (file, cfg) = project(
        &w,
        r#"
variables:
  GREETING: from-the-file
show:
  script:
    - echo "token=$DEPLOY_TOKEN greeting=$GREETING plain=$PLAIN"
    - ls -a
"#,
    );
    std::fs::write(
        w.path().join("project/.slipway-variables.yml"),
        "DEPLOY_TOKEN: s3cr3t-value-123\nPLAIN: {value: visible, masked: false}\n",
    )
    .unwrap();
    std::fs::write(w.path().join("project/README.md"), "readme\n").unwrap();
    let run = w.run(&[
        "exec",
        "-c",
        &cfg,
        &file,
        "--plain-variable",
        "GREETING=from-the-command-line",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let lines = run.job_lines("show");
    assert!(
        lines.contains(&"token=[MASKED] greeting=from-the-command-line plain=visible".to_string()),
        "{}",
        run.explain()
    );
    // `--variable` is masked, and a plain override of a masked variable does not unmask it.
    let run = w.run(&[
        "exec",
        "-c",
        &cfg,
        &file,
        "--variable",
        "GREETING=cli-secret-value",
        "--plain-variable",
        "DEPLOY_TOKEN=override-secret",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let lines = run.job_lines("show");
    assert!(
        lines.contains(&"token=[MASKED] greeting=[MASKED] plain=visible".to_string()),
        "{}",
        run.explain()
    );
    for secret in ["cli-secret-value", "override-secret"] {
        assert!(!run.stdout.contains(secret), "{}", run.explain());
        assert!(!run.stderr.contains(secret), "{}", run.explain());
    }
    assert!(!run.stdout.contains("s3cr3t"), "{}", run.explain());
    assert!(!run.stderr.contains("s3cr3t"), "{}", run.explain());
    // The project's files are there; the secrets file is not.
    assert!(lines.contains(&"README.md".to_string()), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.contains("slipway-variables")),
        "{lines:?}"
    );

    let bad = w.run(&["exec", "-c", &cfg, &file, "--variable", "NO-EQUALS"]);
    assert_eq!(bad.code, Some(2), "{}", bad.explain());
    assert!(
        bad.stderr
            .contains("--variable \"NO-EQUALS\": expected KEY=VALUE"),
        "{}",
        bad.explain()
    );
}

#[test]
fn a_job_with_its_needs_a_played_manual_job_and_a_report() {
    let w = World::new();
    let (file, cfg) = project(
        &w,
        r#"
stages: [build, test, deploy]
build:
  stage: build
  script: [echo "OUT build"]
other:
  stage: build
  script: [echo "OUT other"]
test:
  stage: test
  needs: [build]
  coverage: '/Total: \d+\.\d+%/'
  script: [echo "OUT test", 'echo "Total: 91.25%"']
deploy:
  stage: deploy
  when: manual
  script: [echo "OUT deploy"]
flaky:
  stage: deploy
  retry: {max: 1, exit_codes: [7]}
  allow_failure: true
  script: [exit 7]
"#,
    );
    let run = w.run(&["exec", "-c", &cfg, &file, "--job", "test", "--needs"]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let ran: Vec<String> = run.summary().into_iter().map(|r| r.job).collect();
    assert_eq!(ran, ["build", "test"], "{}", run.explain());
    assert!(run.stdout.contains("COVERAGE"), "{}", run.explain());
    assert!(run.stdout.contains("91.25%"), "{}", run.explain());

    let report = w.path().join("report.json");
    let run = w.run(&[
        "exec",
        "-c",
        &cfg,
        &file,
        "--manual",
        "deploy",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert_eq!(run.job_lines("deploy").last().unwrap(), "Job succeeded");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["status"], "success with warnings");
    let job = |name: &str| {
        report["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(job("test")["coverage"], "91.25");
    assert_eq!(job("flaky")["attempts"], 2);
    assert_eq!(job("flaky")["exit_code"], 7);
    assert_eq!(job("flaky")["status"], "failed (allowed)");
    assert_eq!(job("deploy")["status"], "success");
}

#[test]
fn include_project_reads_a_local_checkout_and_workflow_can_filter_everything() {
    let w = World::new();
    let (file, cfg) = project(
        &w,
        r#"
include:
  - project: platform/ci-templates
    ref: main
    file: /templates/lint.yml
own:
  script: [echo "OUT own"]
"#,
    );
    let root = w.path().join("checkouts");
    std::fs::create_dir_all(root.join("platform/ci-templates/templates")).unwrap();
    std::fs::write(
        root.join("platform/ci-templates/templates/lint.yml"),
        "lint:\n  script: [echo \"OUT lint from the template project\"]\n",
    )
    .unwrap();
    let missing = w.run(&["exec", "-c", &cfg, &file]);
    assert_eq!(missing.code, Some(2), "{}", missing.explain());
    assert!(
        missing
            .stderr
            .contains(".gitlab-ci.yml:3: include:project \"platform/ci-templates\": slipway reads other projects from local checkouts: pass --include-root DIR"),
        "{}",
        missing.explain()
    );
    let run = w.run(&[
        "exec",
        "-c",
        &cfg,
        &file,
        "--include-root",
        root.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(
        run.job_lines("lint")
            .contains(&"OUT lint from the template project".to_string()),
        "{}",
        run.explain()
    );

    std::fs::write(
        &file,
        "workflow:\n  rules:\n    - if: $CI_COMMIT_TAG\nbuild:\n  script: [echo hi]\n",
    )
    .unwrap();
    let run = w.run(&["exec", "-c", &cfg, &file]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(
        run.stdout
            .contains("Pipeline filtered out by workflow rules (no rule matched)"),
        "{}",
        run.explain()
    );
}
