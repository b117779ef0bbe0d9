//! The GitLab language around jobs: rules, workflow, only/except, inherit, variables'
//! precedence, and the keys that shape a job's outcome.

use super::*;

fn opts(user: &[(&str, &str)], predefined: &[(&str, &str)]) -> PipelineOptions {
    let vars = |list: &[(&str, &str)]| list.iter().map(|(k, v)| Variable::new(*k, *v)).collect();
    PipelineOptions {
        variables: vars(user),
        predefined: vars(predefined),
        ..PipelineOptions::default()
    }
}

fn read(text: &str, o: PipelineOptions) -> Pipeline {
    Pipeline::parse(text, ".gitlab-ci.yml", o).unwrap_or_else(|e| panic!("{e}"))
}

fn names(p: &Pipeline) -> Vec<&str> {
    p.jobs.iter().map(|j| j.name.as_str()).collect()
}

fn var<'a>(j: &'a PipelineJob, k: &str) -> Option<&'a str> {
    j.variables
        .iter()
        .rev()
        .find(|v| v.key == k)
        .map(|v| v.value.as_str())
}

const BRANCH: &[(&str, &str)] = &[
    ("CI_COMMIT_BRANCH", "feature"),
    ("CI_COMMIT_REF_NAME", "feature"),
    ("CI_DEFAULT_BRANCH", "main"),
    ("CI_PIPELINE_SOURCE", "push"),
];

#[test]
fn rules_decide_inclusion_when_and_variables() {
    let text = r#"
variables:
  DEPLOY_TO: staging
build:
  script: make
  rules:
    - if: $CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH
      variables: {MODE: release}
    - if: $CI_COMMIT_BRANCH =~ /^feat/
      when: manual
      variables: {MODE: preview}
deploy:
  script: deploy
  variables: {ENABLED: "yes"}
  rules:
    - if: $ENABLED == "yes" && $DEPLOY_TO
      when: delayed
      start_in: 5 minutes
      allow_failure: true
never:
  script: x
  rules:
    - if: $CI_COMMIT_BRANCH
      when: never
    - when: always
nomatch:
  script: x
  rules:
    - if: $NOPE
"#;
    let p = read(text, opts(&[], BRANCH));
    assert_eq!(names(&p), ["build", "deploy"]);
    let build = p.job("build").unwrap();
    assert!(build.manual);
    // when: manual inside rules blocks unless it says otherwise.
    assert!(!build.allow_failure);
    assert_eq!(var(build, "MODE"), Some("preview"));
    let deploy = p.job("deploy").unwrap();
    assert_eq!(deploy.start_in, Some(Duration::from_secs(300)));
    assert!(deploy.allow_failure);

    let main = [("CI_COMMIT_BRANCH", "main"), ("CI_DEFAULT_BRANCH", "main")];
    let p = read(text, opts(&[], &main));
    let build = p.job("build").unwrap();
    assert!(!build.manual);
    assert_eq!(var(build, "MODE"), Some("release"));
    // The user's variables decide rules and win over the file's.
    let p = read(text, opts(&[("ENABLED", "no")], &main));
    assert_eq!(names(&p), ["build"]);
}

#[test]
fn workflow_rules_filter_and_override_globals() {
    let text = r#"
variables: {ENV: dev, KEEP: "1"}
workflow:
  name: "pipeline for $CI_COMMIT_REF_NAME"
  rules:
    - if: $CI_COMMIT_TAG
      when: never
    - if: $CI_COMMIT_BRANCH == "main"
      variables: {ENV: prod}
    - if: $CI_COMMIT_BRANCH
job:
  script: echo $ENV
  rules:
    - if: $ENV == "prod"
      variables: {PROD: "1"}
    - when: on_success
"#;
    let p = read(text, opts(&[], &[("CI_COMMIT_BRANCH", "main")]));
    let job = &p.jobs[0];
    assert_eq!(var(job, "ENV"), Some("prod"));
    assert_eq!(var(job, "PROD"), Some("1"));
    assert_eq!(var(job, "KEEP"), Some("1"));
    let p = read(text, opts(&[], &[("CI_COMMIT_BRANCH", "dev")]));
    assert_eq!(var(&p.jobs[0], "ENV"), Some("dev"));
    assert_eq!(var(&p.jobs[0], "PROD"), None);
    let p = read(text, opts(&[], &[("CI_COMMIT_TAG", "v1")]));
    assert!(p.jobs.is_empty());
    assert!(p.excluded.unwrap().contains("when: never"));
    let p = read(text, opts(&[], &[]));
    assert!(p.excluded.unwrap().contains("no rule matched"));
    // A job's config error is reported even when the workflow leaves the pipeline out.
    let broken = format!("{text}\nbad:\n  script: x\n  when: sometimes\n");
    let err = Pipeline::parse(&broken, ".gitlab-ci.yml", opts(&[], &[])).unwrap_err();
    assert!(
        err.to_string().contains("job \"bad\": when: unknown value"),
        "{err}"
    );
    // A need on a job its rules leave out is checked when a pipeline is created: a filtered
    // pipeline never is.
    let needs_ruled_out = format!(
        "{text}\nbuild:\n  rules: [{{if: $CI_COMMIT_TAG}}]\n  script: x\npublish:\n  needs: [build]\n  script: x\n"
    );
    let p = read(&needs_ruled_out, opts(&[], &[]));
    assert!(p.excluded.unwrap().contains("no rule matched"));
}

#[test]
fn only_except_and_manual_defaults() {
    let text = r#"
a:
  script: x
b:
  script: x
  only: [main, /^release-/]
c:
  script: x
  except: {refs: [branches], variables: [$SKIP]}
d:
  script: x
  only:
    refs: [tags]
e:
  script: x
  when: manual
"#;
    let p = read(text, opts(&[], BRANCH));
    assert_eq!(names(&p), ["a", "e"]);
    // A manual job outside rules does not block the pipeline.
    assert!(p.job("e").unwrap().allow_failure);
    let release = [
        ("CI_COMMIT_BRANCH", "release-2"),
        ("CI_COMMIT_REF_NAME", "release-2"),
    ];
    assert_eq!(names(&read(text, opts(&[], &release))), ["a", "b", "e"]);
    let tag = [("CI_COMMIT_TAG", "v1"), ("CI_COMMIT_REF_NAME", "v1")];
    assert_eq!(names(&read(text, opts(&[], &tag))), ["a", "c", "d", "e"]);
}

#[test]
fn matrix_values_and_job_variables_count_in_rules() {
    let text = r#"
test:
  script: x
  variables: {SKIP_ARM: "true"}
  parallel:
    matrix:
      - ARCH: [amd64, arm64]
  rules:
    - if: $ARCH == "arm64" && $SKIP_ARM == "true"
      when: never
    - when: on_success
"#;
    let p = read(text, opts(&[], BRANCH));
    assert_eq!(names(&p), ["test: [amd64]"]);
}

#[test]
fn inherit_and_precedence() {
    let text = r#"
variables: {A: global, B: global, C: "$A-c"}
default:
  before_script: [setup]
  image: alpine
  retry: 2
plain:
  script: x
  variables: {B: job}
none:
  script: x
  inherit: {default: false, variables: false}
some:
  script: x
  inherit: {default: [image], variables: [A]}
"#;
    let p = read(
        text,
        opts(&[("B", "user")], &[("A", "predefined"), ("CI", "true")]),
    );
    let plain = p.job("plain").unwrap();
    assert_eq!(var(plain, "A"), Some("global"));
    assert_eq!(var(plain, "B"), Some("user"));
    assert_eq!(var(plain, "CI"), Some("true"));
    assert_eq!(plain.before_script, ["setup"]);
    assert_eq!(plain.retry.max, 2);
    let none = p.job("none").unwrap();
    assert_eq!(var(none, "A"), Some("predefined"));
    assert!(none.before_script.is_empty());
    assert!(none.image.is_none());
    assert_eq!(none.retry.max, 0);
    let some = p.job("some").unwrap();
    assert_eq!(var(some, "A"), Some("global"));
    assert_eq!(var(some, "C"), None);
    assert!(some.before_script.is_empty());
    assert_eq!(some.image.as_ref().map(|i| i.name.as_str()), Some("alpine"));
}

#[test]
fn outcome_keys_and_references_in_rules() {
    let text = r#"
.rules:
  common:
    - if: $CI_COMMIT_BRANCH
job:
  script: run
  image: {name: busybox, pull_policy: if-not-present}
  rules:
    - !reference [.rules, common]
  allow_failure: {exit_codes: [3, 4]}
  retry: {max: 1, when: [script_failure], exit_codes: 137}
  resource_group: prod
  coverage: '/Total: (\d+)%/'
  interruptible: true
  environment: production
  artifacts:
    paths: [out]
    expire_in: 1 day
    reports:
      dotenv: build.env
      junit: report.xml
  cache: {key: deps, paths: [vendor], policy: pull}
bridge:
  trigger: other/project
"#;
    let p = read(text, opts(&[], BRANCH));
    assert_eq!(names(&p), ["job"]);
    let j = &p.jobs[0];
    let image = j.image.as_ref().unwrap();
    assert_eq!(image.pull_policy, ["if-not-present"]);
    assert_eq!(j.allow_failure_exit_codes, [3, 4]);
    assert!(!j.allow_failure);
    assert_eq!(j.retry.max, 1);
    assert_eq!(j.retry.exit_codes, [137]);
    assert_eq!(j.resource_group.as_deref(), Some("prod"));
    assert_eq!(j.coverage.as_deref(), Some("Total: (\\d+)%"));
    assert!(j.interruptible);
    assert_eq!(j.dotenv, ["build.env"]);
    assert_eq!(j.cache[0].key, "deps");
    assert_eq!(j.cache[0].policy, "pull");
    assert_eq!(
        p.warnings,
        [
            ".gitlab-ci.yml:15: job \"job\": \"environment\" decides nothing in a local run; ignored",
            ".gitlab-ci.yml:21: job \"job\": \"artifacts:reports:junit\" decides nothing in a local run; ignored",
            ".gitlab-ci.yml:23: job \"bridge\": trigger: project starts a multi-project pipeline, which a local run does not have; not run",
        ]
    );
}

#[test]
fn bad_rules_name_the_line() {
    for (text, want) in [
        (
            "a:\n  script: x\n  rules:\n    - if: $A = \"x\"\n",
            ".gitlab-ci.yml:4: job \"a\": rules:if: unexpected \"=\" at column 4 (variables start with $, strings are quoted) in \"$A = \\\"x\\\"\"",
        ),
        (
            "a:\n  script: x\n  rules:\n    - when: later\n",
            ".gitlab-ci.yml:4: job \"a\": rules:when: unknown value \"later\"",
        ),
        (
            "a:\n  script: x\n  rules:\n    - iff: $A\n",
            ".gitlab-ci.yml:4: job \"a\": rules: unknown key \"iff\" in a rule",
        ),
        (
            "a:\n  script: x\n  when: delayed\n",
            ".gitlab-ci.yml:1: job \"a\": when: delayed needs start_in",
        ),
        (
            "a:\n  script: x\n  rules: [{when: always}]\n  only: [main]\n",
            ".gitlab-ci.yml:1: job \"a\": rules cannot be used together with only or except",
        ),
        (
            "workflow:\n  rules:\n    - when: manual\na:\n  script: x\n",
            ".gitlab-ci.yml:3: workflow: rules:when: unknown value \"manual\" (expected always, never)",
        ),
        (
            "a:\n  script: x\n  retry: 5\n",
            ".gitlab-ci.yml:3: job \"a\": retry: max must be 0, 1 or 2, found 5",
        ),
        (
            "a:\n  script: x\n  image: {name: x, pull_policy: sometimes}\n",
            "job \"a\": image:pull_policy: unknown policy \"sometimes\"",
        ),
    ] {
        let err = Pipeline::parse(text, ".gitlab-ci.yml", PipelineOptions::default())
            .map(|p| format!("{p:?}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{text}\nwant: {want}\n got: {err}");
    }
}
