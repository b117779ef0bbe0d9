//! Child pipelines (`trigger: include:`): how they are read, and how they run.

use std::path::Path;

use crate::pipeline::{Pipeline, PipelineOptions};
use crate::run::{JobStatus, PipelineRun, PipelineStatus};
use slipway_job::model::Variable;

fn write(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

fn read(files: &[(&str, &str)]) -> Result<Pipeline, String> {
    read_with(files, PipelineOptions::default())
}

fn read_with(files: &[(&str, &str)], opts: PipelineOptions) -> Result<Pipeline, String> {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), files);
    Pipeline::from_file(dir.path().join(".gitlab-ci.yml"), opts).map_err(|e| {
        e.to_string()
            .replace(&format!("{}/", dir.path().display()), "")
    })
}

fn names(p: &Pipeline) -> Vec<&str> {
    p.jobs.iter().map(|j| j.name.as_str()).collect()
}

fn var<'a>(p: &'a Pipeline, job: &str, key: &str) -> Option<&'a str> {
    let j = p.job(job)?;
    j.variables
        .iter()
        .rev()
        .find(|v| v.key == key)
        .map(|v| v.value.as_str())
}

/// Runs to the end, each job ending with `outcome(name)`; returns (name, status) of every job.
fn run(
    p: &Pipeline,
    outcome: impl Fn(&str) -> JobStatus,
) -> (Vec<(String, JobStatus)>, PipelineStatus) {
    let mut run = PipelineRun::new(p, None).unwrap();
    finish_all(p, &mut run, outcome);
    let statuses = (0..run.len())
        .map(|i| (p.jobs[i].name.clone(), run.job_status(i).unwrap()))
        .collect();
    (statuses, run.status())
}

/// Runs `run` to the end, each job ending with `outcome(name)`.
fn finish_all(p: &Pipeline, run: &mut PipelineRun, outcome: impl Fn(&str) -> JobStatus) {
    while !run.is_done() {
        let ready = run.ready();
        assert!(!ready.is_empty(), "stuck: {run:?}");
        for &i in &ready {
            run.start(i).unwrap();
        }
        for &i in &ready {
            run.finish(i, outcome(&p.jobs[i].name)).unwrap();
        }
    }
}

fn status_of(statuses: &[(String, JobStatus)], name: &str) -> JobStatus {
    statuses.iter().find(|(n, _)| n == name).unwrap().1
}

const PARENT: &str = "variables:\n  G: global\nbuild:\n  stage: build\n  script: echo\n\
child:\n  stage: test\n  variables:\n    PASSED: down\n  trigger:\n    include: ci/child.yml\n    strategy: depend\n\
after:\n  stage: deploy\n  script: echo\n";

const CHILD: &str = "stages: [one, two]\nvariables:\n  PASSED: child-own\n  OWN: mine\n\
c1:\n  stage: one\n  script: echo\nc2:\n  stage: two\n  script: echo\n";

#[test]
fn a_child_pipeline_is_read_with_its_own_stages_and_the_variables_passed_down() {
    let p = read(&[(".gitlab-ci.yml", PARENT), ("ci/child.yml", CHILD)]).unwrap();
    assert_eq!(
        names(&p),
        ["build", "child", "child > c1", "child > c2", "after"]
    );
    let c1 = p.job("child > c1").unwrap();
    assert_eq!(c1.upstream.as_deref(), Some("child"));
    assert_eq!(c1.stage, "one");
    assert_eq!(p.job("child > c2").unwrap().stage, "two");
    assert!(p.job("child").unwrap().trigger.as_ref().unwrap().depend);
    // The trigger job's YAML variables win over the child's own, as pipeline variables do.
    assert_eq!(var(&p, "child > c1", "PASSED"), Some("down"));
    assert_eq!(var(&p, "child > c1", "G"), Some("global"));
    assert_eq!(var(&p, "child > c1", "OWN"), Some("mine"));
    assert_eq!(
        var(&p, "child > c1", "CI_PIPELINE_SOURCE"),
        Some("parent_pipeline")
    );
}

#[test]
fn forward_yaml_variables_false_passes_nothing_down_but_the_users_variables_still_reach() {
    let parent = PARENT.replace(
        "    strategy: depend\n",
        "    forward:\n      yaml_variables: false\n",
    );
    let opts = PipelineOptions {
        variables: vec![Variable::new("USER", "u")],
        ..PipelineOptions::default()
    };
    let p = read_with(
        &[(".gitlab-ci.yml", &parent), ("ci/child.yml", CHILD)],
        opts,
    )
    .unwrap();
    assert_eq!(var(&p, "child > c1", "PASSED"), Some("child-own"));
    assert_eq!(var(&p, "child > c1", "G"), None);
    assert_eq!(var(&p, "child > c1", "USER"), Some("u"));
    assert!(!p.job("child").unwrap().trigger.as_ref().unwrap().depend);
}

#[test]
fn include_forms_local_list_and_project() {
    let root = tempfile::tempdir().unwrap();
    write(
        root.path(),
        &[("group/lib/ci/c.yml", "lib:\n  script: echo\n")],
    );
    let parent = "t:\n  trigger:\n    include:\n      - local: a.yml\n      - b.yml\n      \
                  - project: group/lib\n        file: /ci/c.yml\n";
    let opts = PipelineOptions {
        include_root: Some(root.path().to_path_buf()),
        ..PipelineOptions::default()
    };
    let p = read_with(
        &[
            (".gitlab-ci.yml", parent),
            ("a.yml", "include: inner.yml\na:\n  script: echo\n"),
            ("inner.yml", "inner:\n  script: echo\n"),
            ("b.yml", "b:\n  script: echo\n"),
        ],
        opts,
    )
    .unwrap();
    assert_eq!(names(&p), ["t", "t > inner", "t > a", "t > b", "t > lib"]);
}

#[test]
fn errors_in_the_child_name_the_child_file_and_line() {
    let err = read(&[
        (".gitlab-ci.yml", PARENT),
        (
            "ci/child.yml",
            "c1:\n  stage: one\n  script: echo\n  when: sometimes\n",
        ),
    ])
    .unwrap_err();
    assert!(
        err.contains("ci/child.yml:4: child pipeline of job \"child\": job \"c1\": when"),
        "{err}"
    );
    let err = read(&[(".gitlab-ci.yml", PARENT)]).unwrap_err();
    assert!(
        err.contains(".gitlab-ci.yml:11: job \"child\": trigger: "),
        "{err}"
    );
    assert!(err.contains("ci/child.yml"), "{err}");
    for (job, want) in [
        (
            "t:\n  trigger:\n    include: c.yml\n    strategy: sometimes\n",
            ".gitlab-ci.yml:4: job \"t\": trigger: strategy: expected depend, found \"sometimes\"",
        ),
        (
            "t:\n  script: echo\n  trigger:\n    include: c.yml\n",
            ".gitlab-ci.yml:2: job \"t\": a trigger job runs no script",
        ),
        (
            "t:\n  trigger:\n    includes: c.yml\n",
            ".gitlab-ci.yml:3: job \"t\": trigger: unknown key \"includes\"",
        ),
        (
            "t:\n  trigger:\n    include: c.yml\n    forward:\n      yaml_variables: maybe\n",
            ".gitlab-ci.yml:5: job \"t\": trigger: forward: yaml_variables: expected true or false",
        ),
    ] {
        let err = read(&[(".gitlab-ci.yml", job), ("c.yml", "c:\n  script: echo\n")]).unwrap_err();
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn multi_project_and_artifact_triggers_are_left_out_with_a_warning() {
    let p = read(&[(
        ".gitlab-ci.yml",
        "a:\n  script: echo\nb:\n  trigger: group/other\nc:\n  trigger:\n    project: g/p\n    strategy: depend\n\
         d:\n  trigger:\n    include:\n      - artifact: gen.yml\n        job: a\n",
    )])
    .unwrap();
    assert_eq!(names(&p), ["a"]);
    let w = p.warnings.join("\n");
    assert!(
        w.contains(".gitlab-ci.yml:3: job \"b\": trigger: project starts a multi-project pipeline"),
        "{w}"
    );
    assert!(
        w.contains(".gitlab-ci.yml:5: job \"c\": trigger: project"),
        "{w}"
    );
    assert!(
        w.contains(".gitlab-ci.yml:9: job \"d\": trigger: include: artifact"),
        "{w}"
    );
}

#[test]
fn nesting_stops_at_gitlabs_depth_limit() {
    let level = |next: &str| format!("x:\n  script: echo\nt:\n  trigger:\n    include: {next}\n");
    let leaf = "x:\n  script: echo\n".to_string();
    // The top pipeline, a child and a grandchild: GitLab's two levels.
    let files = [
        (".gitlab-ci.yml", level("l1.yml")),
        ("l1.yml", level("l2.yml")),
        ("l2.yml", leaf.clone()),
    ];
    let refs: Vec<(&str, &str)> = files.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let p = read(&refs).unwrap();
    assert_eq!(names(&p), ["x", "t", "t > x", "t > t", "t > t > x"]);
    assert_eq!(
        p.job("t > t > x").unwrap().upstream.as_deref(),
        Some("t > t")
    );
    let files = [
        (".gitlab-ci.yml", level("l1.yml")),
        ("l1.yml", level("l2.yml")),
        ("l2.yml", level("l3.yml")),
        ("l3.yml", leaf),
    ];
    let refs: Vec<(&str, &str)> = files.iter().map(|(a, b)| (*a, b.as_str())).collect();
    // One level more: GitLab reads the file, and that trigger job fails when it runs.
    let p = read(&refs).unwrap();
    assert_eq!(
        names(&p),
        ["x", "t", "t > x", "t > t", "t > t > x", "t > t > t"]
    );
    assert!(
        p.warnings.iter().any(|w| w.contains("beyond 2 levels")),
        "{:?}",
        p.warnings
    );
    let (s, status) = run(&p, |_| JobStatus::Success);
    assert_eq!(status_of(&s, "t > t > t"), JobStatus::Failed);
    assert_eq!(status_of(&s, "t > t > x"), JobStatus::Success);
    // Without strategy: depend, the failed grandchild trigger does not fail the top pipeline.
    assert_eq!(status, PipelineStatus::Success);
}

#[test]
fn a_child_job_name_taken_by_a_parent_job_is_an_error() {
    let err = read(&[
        (
            ".gitlab-ci.yml",
            "t:\n  trigger:\n    include: c.yml\n\"t > c\":\n  script: echo\n",
        ),
        ("c.yml", "c:\n  script: echo\n"),
    ])
    .unwrap_err();
    assert!(err.contains(".gitlab-ci.yml:4: job \"t > c\": the name is also that of a job of the child pipeline of trigger job \"t\""), "{err}");
}

#[test]
fn with_depend_the_trigger_job_follows_its_child_and_later_stages_wait() {
    let p = read(&[(".gitlab-ci.yml", PARENT), ("ci/child.yml", CHILD)]).unwrap();
    let mut run = PipelineRun::new(&p, None).unwrap();
    let ready = |run: &PipelineRun| -> Vec<&str> {
        run.ready()
            .iter()
            .map(|&i| p.jobs[i].name.as_str())
            .collect()
    };
    assert_eq!(ready(&run), ["build"]);
    let i = p.job_index("build").unwrap();
    run.start(i).unwrap();
    run.finish(i, JobStatus::Success).unwrap();
    // The trigger job is never handed out: its child's first stage is.
    assert_eq!(ready(&run), ["child > c1"]);
    assert_eq!(
        run.job_status(p.job_index("child").unwrap()),
        Some(JobStatus::Running)
    );

    let (s, status) = run_all(&p, |n| {
        if n == "child > c2" {
            JobStatus::Failed
        } else {
            JobStatus::Success
        }
    });
    assert_eq!(status_of(&s, "child"), JobStatus::Failed);
    assert_eq!(status_of(&s, "after"), JobStatus::Skipped);
    assert_eq!(status, PipelineStatus::Failed);

    let allowed = PARENT.replace("  trigger:\n", "  allow_failure: true\n  trigger:\n");
    let p = read(&[(".gitlab-ci.yml", &allowed), ("ci/child.yml", CHILD)]).unwrap();
    let (s, status) = run_all(&p, |n| {
        if n == "child > c1" {
            JobStatus::Failed
        } else {
            JobStatus::Success
        }
    });
    assert_eq!(status_of(&s, "child"), JobStatus::FailedAllowed);
    assert_eq!(status_of(&s, "child > c2"), JobStatus::Skipped);
    assert_eq!(status_of(&s, "after"), JobStatus::Success);
    assert_eq!(status, PipelineStatus::SuccessWithWarnings);
}

fn run_all(
    p: &Pipeline,
    outcome: impl Fn(&str) -> JobStatus,
) -> (Vec<(String, JobStatus)>, PipelineStatus) {
    run(p, outcome)
}

#[test]
fn without_depend_the_trigger_job_succeeds_at_once_and_the_child_counts_for_nothing() {
    let parent = PARENT.replace("    strategy: depend\n", "");
    let p = read(&[(".gitlab-ci.yml", &parent), ("ci/child.yml", CHILD)]).unwrap();
    let mut run = PipelineRun::new(&p, None).unwrap();
    let i = p.job_index("build").unwrap();
    run.start(i).unwrap();
    run.finish(i, JobStatus::Success).unwrap();
    let ready: Vec<&str> = run
        .ready()
        .iter()
        .map(|&i| p.jobs[i].name.as_str())
        .collect();
    // Later stages do not wait for the child.
    assert_eq!(ready, ["child > c1", "after"]);
    let (s, status) = run_all(&p, |n| {
        if n == "child > c1" {
            JobStatus::Failed
        } else {
            JobStatus::Success
        }
    });
    assert_eq!(status_of(&s, "child"), JobStatus::Success);
    assert_eq!(status_of(&s, "child > c1"), JobStatus::Failed);
    assert_eq!(status_of(&s, "after"), JobStatus::Success);
    assert_eq!(status, PipelineStatus::Success);
}

#[test]
fn rules_manual_and_needs_work_on_trigger_jobs() {
    let parent = "slow:\n  stage: build\n  script: echo\nfirst:\n  stage: build\n  script: echo\n\
        child:\n  stage: test\n  needs: [first]\n  trigger:\n    include: c.yml\n";
    let p = read(&[
        (".gitlab-ci.yml", parent),
        ("c.yml", "c:\n  script: echo\n"),
    ])
    .unwrap();
    let mut run = PipelineRun::new(&p, None).unwrap();
    let i = p.job_index("first").unwrap();
    run.start(i).unwrap();
    run.finish(i, JobStatus::Success).unwrap();
    // `needs: [first]`: the child starts while `slow` has not even started.
    let ready: Vec<&str> = run
        .ready()
        .iter()
        .map(|&i| p.jobs[i].name.as_str())
        .collect();
    assert_eq!(ready, ["slow", "child > c"]);

    let manual = "a:\n  script: echo\nchild:\n  when: manual\n  trigger:\n    include: c.yml\n";
    let p = read(&[
        (".gitlab-ci.yml", manual),
        ("c.yml", "c:\n  script: echo\n"),
    ])
    .unwrap();
    let (s, status) = run_all(&p, |_| JobStatus::Success);
    assert_eq!(status_of(&s, "child"), JobStatus::Manual);
    assert_eq!(status_of(&s, "child > c"), JobStatus::Skipped);
    assert_eq!(status, PipelineStatus::Success);

    let ruled =
        "a:\n  script: echo\nchild:\n  rules:\n    - if: $GO\n  trigger:\n    include: c.yml\n";
    let p = read(&[(".gitlab-ci.yml", ruled), ("c.yml", "c:\n  script: echo\n")]).unwrap();
    assert_eq!(names(&p), ["a"]);
}

#[test]
fn a_child_filtered_out_by_its_workflow_rules_fails_the_trigger_job() {
    let child =
        "workflow:\n  rules:\n    - if: $CI_PIPELINE_SOURCE == \"push\"\nc:\n  script: echo\n";
    let p = read(&[
        (".gitlab-ci.yml", "t:\n  trigger:\n    include: c.yml\n"),
        ("c.yml", child),
    ])
    .unwrap();
    assert!(
        p.job("t")
            .unwrap()
            .trigger
            .as_ref()
            .unwrap()
            .excluded
            .is_some()
    );
    let (s, status) = run_all(&p, |_| JobStatus::Success);
    assert_eq!(status_of(&s, "t"), JobStatus::Failed);
    assert_eq!(status, PipelineStatus::Failed);
}

#[test]
fn nested_depend_children_carry_a_failure_up() {
    let p = read(&[
        (
            ".gitlab-ci.yml",
            "t:\n  trigger:\n    include: l1.yml\n    strategy: depend\n",
        ),
        (
            "l1.yml",
            "u:\n  trigger:\n    include: l2.yml\n    strategy: depend\n",
        ),
        ("l2.yml", "bad:\n  script: exit 1\n"),
    ])
    .unwrap();
    let (s, status) = run_all(&p, |n| {
        if n == "t > u > bad" {
            JobStatus::Failed
        } else {
            JobStatus::Success
        }
    });
    assert_eq!(status_of(&s, "t > u"), JobStatus::Failed);
    assert_eq!(status_of(&s, "t"), JobStatus::Failed);
    assert_eq!(status, PipelineStatus::Failed);
}

#[test]
fn picking_a_trigger_job_runs_its_child() {
    let p = read(&[(".gitlab-ci.yml", PARENT), ("ci/child.yml", CHILD)]).unwrap();
    let mut run = PipelineRun::new(&p, Some("child")).unwrap();
    let ready: Vec<&str> = run
        .ready()
        .iter()
        .map(|&i| p.jobs[i].name.as_str())
        .collect();
    assert_eq!(ready, ["child > c1"]);
    assert!(!run.is_selected(p.job_index("build").unwrap()));
    let i = p.job_index("child > c1").unwrap();
    run.start(i).unwrap();
    run.finish(i, JobStatus::Success).unwrap();
    let i = p.job_index("child > c2").unwrap();
    run.start(i).unwrap();
    run.finish(i, JobStatus::Success).unwrap();
    assert_eq!(run.status(), PipelineStatus::Success);
    // A child job alone runs without its trigger job.
    let run = PipelineRun::new(&p, Some("child > c2")).unwrap();
    assert_eq!(run.ready(), [p.job_index("child > c2").unwrap()]);
}

#[test]
fn a_child_job_gets_the_parents_artifacts_through_needs_pipeline() {
    let p = read(&[
        (
            ".gitlab-ci.yml",
            "stages: [build, trigger]\n\
             generate: {stage: build, script: [x], artifacts: {paths: [out/]}}\n\
             t:\n  stage: trigger\n  trigger:\n    include: child.yml\n",
        ),
        (
            "child.yml",
            "use:\n  needs:\n    - pipeline: $PARENT_PIPELINE_ID\n      job: generate\n  script: [x]\n\
             skip:\n  needs: [{pipeline: $PARENT_PIPELINE_ID, job: generate, artifacts: false}]\n  script: [x]\n",
        ),
    ])
    .unwrap();
    assert_eq!(names(&p), ["generate", "t", "t > use", "t > skip"]);
    assert_eq!(p.job("t > use").unwrap().parent_artifacts, ["generate"]);
    assert!(p.job("t > skip").unwrap().parent_artifacts.is_empty());
    let mut run = PipelineRun::new(&p, None).unwrap();
    finish_all(&p, &mut run, |_| JobStatus::Success);
    let use_job = p.job_index("t > use").unwrap();
    assert_eq!(
        run.artifact_sources(use_job),
        [p.job_index("generate").unwrap()]
    );
    // In the top pipeline there is no parent: a warning, no artifacts.
    let top = read(&[(
        ".gitlab-ci.yml",
        "use:\n  needs: [{pipeline: $PARENT_PIPELINE_ID, job: g}]\n  script: [x]\n",
    )])
    .unwrap();
    assert!(top.job("use").unwrap().parent_artifacts.is_empty());
    assert!(
        top.warnings.iter().any(|w| w.contains("needs:pipeline")),
        "{:?}",
        top.warnings
    );
}
