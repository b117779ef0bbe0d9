use super::parallel::{expand_vars, snapshot_name};
use super::*;
use slipway_job::model::{JobResponse, StepName};

const FILE: &str = ".gitlab-ci.yml";

fn parse(text: &str) -> Result<Pipeline, PipelineError> {
    Pipeline::parse(text, FILE, PipelineOptions::default())
}

/// The error's lines as a user reads them.
fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(p) => panic!("expected an error, got {p:#?}"),
        Err(e) => e.to_string().lines().map(str::to_string).collect(),
    }
}

const REALISTIC: &str = r#"stages:
  - build
  - test
  - deploy

variables:
  GLOBAL: "g"
  OVERRIDE: global
  VERSION: 1.10
  DESCRIBED:
    value: "d"
    description: "shown in the UI"

default:
  before_script:
    - echo default before
  timeout: 30m
  image: alpine:3.20

.rust: &rust
  image: rust:1.95
  variables:
    CARGO_HOME: .cargo
    OVERRIDE: template
  before_script:
    - rustc --version

.retry_script: &steps
  - cargo build
  - - cargo doc
    - cargo test --no-run

build:
  extends: .rust
  stage: build
  script: *steps
  artifacts:
    paths: [target/debug/app]
    when: always
  timeout: 1h 30m

lint:
  <<: *rust
  stage: build
  script: cargo clippy
  allow_failure: true
  timeout: 10 minutes

unit:
  extends: [.rust]
  stage: test
  needs: [build]
  variables:
    OVERRIDE: job
  script:
    - cargo test
  after_script: echo done

notify:
  stage: test
  needs:
    - job: build
      artifacts: false
  when: on_failure
  script: ./notify.sh
  isolation: microvm
  tags: [small]

deploy:
  stage: deploy
  script: ./deploy.sh "$VERSION"
  timeout: 3600
"#;

#[test]
fn parses_a_realistic_pipeline() {
    let p = parse(REALISTIC).unwrap();
    assert_eq!(p.stages, [".pre", "build", "test", "deploy", ".post"]);
    let names: Vec<&str> = p.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["build", "lint", "unit", "notify", "deploy"]);
    assert!(p.warnings.is_empty());

    let build = p.job("build").unwrap();
    assert_eq!(build.line, 33);
    assert_eq!((build.stage.as_str(), build.stage_index), ("build", 1));
    assert_eq!(
        build.image.as_ref().map(|i| i.name.as_str()),
        Some("rust:1.95"),
        "extends beats default"
    );
    assert_eq!(build.before_script, ["rustc --version"]);
    assert_eq!(
        build.script,
        ["cargo build", "cargo doc", "cargo test --no-run"]
    );
    assert_eq!(build.artifact_paths, ["target/debug/app"]);
    assert_eq!(build.artifacts_when, When::Always);
    assert_eq!(build.timeout, Some(Duration::from_secs(5400)));
    assert_eq!(build.needs, None);
    let vars: Vec<(&str, &str)> = build
        .variables
        .iter()
        .map(|v| (v.key.as_str(), v.value.as_str()))
        .collect();
    assert_eq!(
        vars,
        [
            ("GLOBAL", "g"),
            ("VERSION", "1.10"),
            ("DESCRIBED", "d"),
            ("CARGO_HOME", ".cargo"),
            ("OVERRIDE", "template"),
        ]
    );

    let lint = p.job("lint").unwrap();
    assert_eq!(
        lint.image.as_ref().map(|i| i.name.as_str()),
        Some("rust:1.95"),
        "from the << merge"
    );
    assert!(lint.allow_failure);
    assert_eq!(lint.timeout, Some(Duration::from_secs(600)));

    let unit = p.job("unit").unwrap();
    assert_eq!(unit.variable_value("OVERRIDE"), Some("job"));
    assert_eq!(
        unit.variable_value("CARGO_HOME"),
        Some(".cargo"),
        "deep merge keeps parent keys"
    );
    assert_eq!(
        unit.needs,
        Some(vec![Need {
            job: "build".into(),
            artifacts: true
        }])
    );
    assert_eq!(unit.after_script, ["echo done"]);
    assert_eq!(
        unit.timeout,
        Some(Duration::from_secs(1800)),
        "default timeout"
    );

    let notify = p.job("notify").unwrap();
    assert_eq!(notify.when, When::OnFailure);
    assert!(!notify.needs.as_ref().unwrap()[0].artifacts);
    assert_eq!(notify.isolation.as_deref(), Some("microvm"));
    assert_eq!(notify.tags, ["small"]);
    assert_eq!(
        notify.image.as_ref().map(|i| i.name.as_str()),
        Some("alpine:3.20"),
        "default image"
    );
    assert_eq!(notify.before_script, ["echo default before"]);

    let deploy = p.job("deploy").unwrap();
    assert_eq!(deploy.stage_index, 3);
    assert_eq!(deploy.timeout, Some(Duration::from_secs(3600)));
}

impl PipelineJob {
    fn variable_value(&self, key: &str) -> Option<&str> {
        self.variables
            .iter()
            .rev()
            .find(|v| v.key == key)
            .map(|v| v.value.as_str())
    }
}

#[test]
fn builds_gitlab_shaped_job_payloads() {
    let p = parse(REALISTIC).unwrap();
    let extra = [Variable::new("FROM_CLI", "1")];
    let job = p.job("unit").unwrap().to_job_response(7, 3, &extra);
    assert_eq!(job.id, 7);
    assert_eq!(job.job_info.name, "unit");
    assert_eq!(job.job_info.stage, "test");
    assert_eq!(job.job_info.pipeline_id, 3);
    assert_eq!(job.runner_info.timeout, 1800);
    assert_eq!(job.steps.len(), 2);
    assert_eq!(job.steps[0].name, StepName::Script);
    assert_eq!(job.steps[0].script, ["rustc --version", "cargo test"]);
    assert_eq!(job.steps[0].when, When::OnSuccess);
    assert_eq!(job.steps[1].name, StepName::AfterScript);
    assert_eq!(job.steps[1].when, When::Always);
    for (k, v) in [
        ("CI", "true"),
        ("SLIPWAY", "true"),
        ("CI_JOB_ID", "7"),
        ("CI_JOB_NAME", "unit"),
        ("CI_JOB_STAGE", "test"),
        ("CI_PIPELINE_ID", "3"),
        ("OVERRIDE", "job"),
        ("FROM_CLI", "1"),
    ] {
        assert_eq!(job.variable(k), Some(v), "{k}");
    }
    assert_eq!(job.image.as_ref().unwrap().name, "rust:1.95");

    let build = p.job("build").unwrap().to_job_response(1, 3, &[]);
    assert_eq!(
        build.steps.len(),
        1,
        "no after_script step without after_script"
    );
    assert_eq!(build.artifacts[0].paths, ["target/debug/app"]);
    assert_eq!(build.artifacts[0].when, When::Always);
    assert_eq!(build.runner_info.timeout, 5400);

    let mut no_timeout = p.job("deploy").unwrap().clone();
    no_timeout.timeout = None;
    assert_eq!(
        no_timeout.to_job_response(1, 1, &[]).runner_info.timeout,
        DEFAULT_TIMEOUT_SECS
    );
    // The payload is what GitLab would send: it survives JSON.
    let json = serde_json::to_string(&job).unwrap();
    assert_eq!(JobResponse::from_json(&json).unwrap(), job);
}

#[test]
fn durations() {
    let ok = [
        ("3600", 3600),
        ("30s", 30),
        ("10 minutes", 600),
        ("1h 30m", 5400),
        ("1h30m", 5400),
        ("1 hour and 30 minutes", 5400),
        ("2 days", 172_800),
        ("1.5h", 5400),
        ("01:30:00", 5400),
        ("1 week", 604_800),
    ];
    for (text, secs) in ok {
        assert_eq!(
            parse_duration(text),
            Some(Duration::from_secs(secs)),
            "{text}"
        );
    }
    for bad in [
        "",
        "banana",
        "1h 30",
        "0",
        "-5m",
        "10 parsecs",
        "1e999h",
        "99999999999 years",
        ":",
    ] {
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
}

#[test]
fn unsupported_keys_are_all_listed_with_file_line_and_path() {
    let text = "\
build:
  script: make
  run:
    - name: step
  environment: production
  image:
    name: alpine
    kubernetes: {user: '1000'}
  artifacts:
    paths: [out]
    expire_in: 1 week
";
    assert_eq!(
        errors(text),
        [
            ".gitlab-ci.yml:3: job \"build\": unsupported key \"run\"",
            ".gitlab-ci.yml:8: job \"build\": unsupported key \"image:kubernetes\"",
        ]
    );
    let p = Pipeline::parse(
        text,
        FILE,
        PipelineOptions {
            allow_unsupported: true,
            ..PipelineOptions::default()
        },
    )
    .unwrap();
    assert_eq!(p.jobs[0].artifact_paths, ["out"]);
    assert_eq!(
        p.warnings,
        [
            ".gitlab-ci.yml:3: job \"build\": unsupported key \"run\"",
            ".gitlab-ci.yml:5: job \"build\": \"environment\" decides nothing in a local run; ignored",
            ".gitlab-ci.yml:8: job \"build\": unsupported key \"image:kubernetes\"",
        ]
    );
}

#[test]
fn unknown_keys_are_errors_even_when_unsupported_keys_are_allowed() {
    let text = "build:\n  script: make\n  scirpt: oops\n";
    let err = Pipeline::parse(
        text,
        FILE,
        PipelineOptions {
            allow_unsupported: true,
            ..PipelineOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        ".gitlab-ci.yml:3: job \"build\": unknown key \"scirpt\" (did you mean \"script\"?)"
    );
}

#[test]
fn error_messages() {
    let cases: &[(&str, &str)] = &[
        (
            "build:\n  stage: build\n",
            ".gitlab-ci.yml:1: job \"build\": missing \"script\" (every job needs one)",
        ),
        (
            "build:\n  script:\n    - echo a: b\n",
            ".gitlab-ci.yml:3: job \"build\": script: expected a string or a list of strings, found a mapping (quote script lines that contain \": \")",
        ),
        (
            "build:\n  script: {a: 1}\n",
            ".gitlab-ci.yml:2: job \"build\": script: expected a string or a list of strings, found a mapping",
        ),
        (
            "build:\n  script: x\n  tags: small\n",
            ".gitlab-ci.yml:3: job \"build\": tags: expected a list of strings, found a string",
        ),
        (
            "stages: build\nbuild:\n  script: x\n",
            ".gitlab-ci.yml:1: stages: expected a list of strings, found a string",
        ),
        (
            "build:\n  stage: compile\n  script: x\n",
            ".gitlab-ci.yml:2: job \"build\": unknown stage \"compile\" (stages: .pre, build, test, deploy, .post)",
        ),
        (
            "stages: [build]\nbuild:\n  script: x\n",
            ".gitlab-ci.yml:2: job \"build\": unknown stage \"test\" (stages: .pre, build, .post)",
        ),
        (
            "a:\n  script: x\n  needs: [nope]\n",
            ".gitlab-ci.yml:3: job \"a\": needs: unknown job \"nope\"",
        ),
        (
            "a:\n  stage: build\n  script: x\n  needs:\n    - b\nb:\n  stage: test\n  script: y\n",
            ".gitlab-ci.yml:5: job \"a\": needs: \"b\" is in a later stage (test) than this job (build)",
        ),
        (
            "a:\n  script: x\n  needs: [b]\nb:\n  script: y\n  needs: [a]\n",
            ".gitlab-ci.yml:6: job \"b\": needs: circular dependency: a -> b -> a",
        ),
        (
            "a:\n  script: x\n  needs: build\n",
            ".gitlab-ci.yml:3: job \"a\": needs: expected a list of job names, found a string",
        ),
        (
            "a:\n  script: x\n  when: never\n",
            ".gitlab-ci.yml:3: job \"a\": when: unknown value \"never\" (expected on_success, on_failure, always, manual, delayed)",
        ),
        (
            "a:\n  script: x\n  when: sometimes\n",
            ".gitlab-ci.yml:3: job \"a\": when: unknown value \"sometimes\" (expected on_success, on_failure, always, manual, delayed)",
        ),
        (
            "a:\n  script: x\n  allow_failure: maybe\n",
            ".gitlab-ci.yml:3: job \"a\": allow_failure: expected true, false or {exit_codes: [...]}, found a string",
        ),
        (
            "a:\n  script: x\n  timeout: soon\n",
            ".gitlab-ci.yml:3: job \"a\": timeout: invalid duration \"soon\" (examples: \"1h 30m\", \"10 minutes\", \"3600\")",
        ),
        (
            "a:\n  extends: .nope\n  script: x\n",
            ".gitlab-ci.yml:2: job \"a\": extends: unknown job or template \".nope\"",
        ),
        (
            ".a:\n  extends: .b\n.b:\n  extends: .a\nc:\n  extends: .a\n  script: x\n",
            ".gitlab-ci.yml:4: template \".b\": extends: circular extends: .a -> .b -> .a",
        ),
        (
            ".t: [1, 2]\na:\n  extends: .t\n  script: x\n",
            ".gitlab-ci.yml:3: job \"a\": extends: \".t\" is a list, not a mapping of job keys",
        ),
        (
            ".t:\n  stage: build\na:\n  extends: .t\n",
            ".gitlab-ci.yml:3: job \"a\": missing \"script\" (every job needs one)",
        ),
        (
            "variables:\n  A: [1]\na:\n  script: x\n",
            ".gitlab-ci.yml:2: variables: \"A\": expected a string or a number, found a list",
        ),
        (
            "default:\n  timeout: 5 eons\na:\n  script: x\n",
            ".gitlab-ci.yml:2: default: timeout: invalid duration \"5 eons\" (examples: \"1h 30m\", \"10 minutes\", \"3600\")",
        ),
        (
            "a:\n  script: x\n  image: {entrypoint: [\"\"]}\n",
            ".gitlab-ci.yml:3: job \"a\": image: missing \"name\"",
        ),
        (
            "a:\n  script: x\n  artifacts: [out]\n",
            ".gitlab-ci.yml:3: job \"a\": artifacts: expected a mapping, found a list",
        ),
        (
            "a:\n  script: !reference [.x, script]\n",
            ".gitlab-ci.yml:2: !reference [.x, script]: the configuration has no key \".x\"",
        ),
        (
            "a:\n  script: [x\n",
            ".gitlab-ci.yml:3: invalid YAML: did not find expected ',' or ']' while parsing a flow sequence started on line 2",
        ),
    ];
    for (text, want) in cases {
        let got = errors(text);
        assert!(
            got.iter().any(|g| g == want),
            "for {text:?}\n want: {want}\n  got: {got:#?}"
        );
    }
}

#[test]
fn errors_are_collected_and_sorted_by_line() {
    let text = "\
a:
  script: x
  stage: nowhere
b:
  script: {}
c:
  script: y
  needs: [zzz]
";
    let errs = errors(text);
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(errs[0].starts_with(".gitlab-ci.yml:3: job \"a\": unknown stage"));
    assert!(errs[1].starts_with(".gitlab-ci.yml:5: job \"b\": script:"));
    assert!(errs[2].starts_with(".gitlab-ci.yml:8: job \"c\": needs: unknown job"));
}

#[test]
fn junk_input_gives_clean_errors() {
    let cases: &[(&str, &str)] = &[
        ("", ".gitlab-ci.yml:1: the file is empty"),
        ("# just a comment\n", ".gitlab-ci.yml:1: the file is empty"),
        ("~\n", ".gitlab-ci.yml:1: the file is empty"),
        (
            "hello\n",
            ".gitlab-ci.yml:1: expected a mapping of keywords and jobs at the top level, found a string",
        ),
        (
            "- a\n- b\n",
            ".gitlab-ci.yml:1: expected a mapping of keywords and jobs at the top level, found a list",
        ),
        (
            "build: [make]\n",
            ".gitlab-ci.yml:1: job \"build\": expected a mapping of job keys, found a list",
        ),
        (
            "build: make\n",
            ".gitlab-ci.yml:1: job \"build\": expected a mapping of job keys, found a string",
        ),
        (
            "build:\n",
            ".gitlab-ci.yml:1: job \"build\": expected a mapping of job keys, found nothing (null)",
        ),
        (".hidden:\n  script: x\n", ".gitlab-ci.yml:1: no jobs"),
        ("stages: [a]\n", ".gitlab-ci.yml:1: no jobs"),
        (
            "default: [x]\na: {script: x}\n",
            ".gitlab-ci.yml:1: default: expected a mapping, found a list",
        ),
        (
            "variables: [x]\na: {script: x}\n",
            ".gitlab-ci.yml:1: variables: expected a mapping of names to values, found a list",
        ),
        (
            "[a]: 1\n",
            ".gitlab-ci.yml:1: mapping keys must be strings, found a list",
        ),
        (
            "a: {script: x}\n---\nb: {script: y}\n",
            ".gitlab-ci.yml:1: a file of two YAML documents must start with a header holding only \"spec\"",
        ),
        (
            "a:\n  script: x\n\tstage: y\n",
            ".gitlab-ci.yml:3: invalid YAML: found a tab character that violates indentation",
        ),
        (
            "a: {script: x, needs: [{artifacts: true}]}\n",
            "needs: an entry is missing \"job\"",
        ),
        (
            "a: {script: x, <<: 3}\n",
            "merge key \"<<\" expects a mapping or a list of mappings, found a number",
        ),
        ("\"\": {script: x}\n", "a job name must not be empty"),
        ("\u{feff}\u{0}\u{1}", ".gitlab-ci.yml:"),
        (
            "a: {script: [[[[[[[[[[[[x]]]]]]]]]]]]}\n",
            "lists nested more than 10 levels deep",
        ),
    ];
    for (text, want) in cases {
        let got = errors(text).join("\n");
        assert!(
            got.contains(want),
            "for {text:?}\n want: {want}\n  got: {got}"
        );
    }
    // Arbitrary byte soup never panics.
    let mut seed: u32 = 12345;
    let alphabet: &[u8] = b"ab:- \n[]{}&*<!|>'\"#,.?%@`~0123456789\t";
    for _ in 0..2000 {
        let len = (seed % 60) as usize;
        let mut s = String::new();
        for _ in 0..len {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            s.push(alphabet[(seed >> 16) as usize % alphabet.len()] as char);
        }
        let _ = parse(&s);
        let _ = parse(&format!("job:\n  script: x\n  {s}"));
    }
}

#[test]
fn needs_optional_and_same_stage() {
    let p =
        parse("a: {script: x}\nb: {script: y, needs: [a, {job: gone, optional: true}]}\n").unwrap();
    assert_eq!(p.job("b").unwrap().needs.as_ref().unwrap().len(), 1);
    assert_eq!(
        p.job("b").unwrap().stage_index,
        p.job("a").unwrap().stage_index
    );
}

#[test]
fn global_deprecated_keys_act_as_defaults_and_default_wins() {
    let p =
        parse("image: old\nbefore_script: [g]\ndefault:\n  image: new\na:\n  script: x\n").unwrap();
    let a = &p.jobs[0];
    assert_eq!(a.image.as_ref().map(|i| i.name.as_str()), Some("new"));
    assert_eq!(a.before_script, ["g"]);
}

#[test]
fn extends_order_and_arrays_replaced() {
    let p = parse(
        "\
.one:
  variables: {A: one, B: one}
  script: [one]
  tags: [x, y]
.two:
  variables: {B: two}
  script: [two]
job:
  extends: [.one, .two]
  tags: [z]
",
    )
    .unwrap();
    let j = &p.jobs[0];
    assert_eq!(j.script, ["two"], "later parent wins, arrays replaced");
    assert_eq!(j.tags, ["z"]);
    assert_eq!(j.variable_value("A"), Some("one"));
    assert_eq!(j.variable_value("B"), Some("two"));
}

#[test]
fn variables_expand_false_is_raw() {
    let p = parse("variables:\n  R: {value: \"$X\", expand: false}\na: {script: x}\n").unwrap();
    assert!(p.jobs[0].variables[0].raw);
}

#[test]
fn from_file_names_the_file() {
    let dir = std::env::temp_dir().join(format!("slipway-jobs-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ci.yml");
    std::fs::write(&path, "a:\n  scrip: x\n").unwrap();
    let err = Pipeline::from_file(&path, PipelineOptions::default())
        .unwrap_err()
        .to_string();
    let want = format!(
        "{}:2: job \"a\": unknown key \"scrip\" (did you mean \"script\"?)",
        path.display()
    );
    assert!(err.lines().any(|l| l == want), "{err}");
    let missing =
        Pipeline::from_file(dir.join("nope.yml"), PipelineOptions::default()).unwrap_err();
    assert!(matches!(missing, PipelineError::Read { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn artifact_paths_outside_the_project_are_left_to_the_runner() {
    // GitLab accepts the file; the runner warns and collects nothing outside the project.
    let yaml = "job:\n  script: [x]\n  artifacts:\n    paths:\n      - ../secret\n      - /etc/passwd\n      - $CI_PROJECT_DIR/out/\n";
    let p = Pipeline::parse(yaml, ".gitlab-ci.yml", PipelineOptions::default()).unwrap();
    assert_eq!(
        p.jobs[0].artifact_paths,
        ["../secret", "/etc/passwd", "$CI_PROJECT_DIR/out/"]
    );
}

#[test]
fn services_and_isolation_reach_the_job_payload() {
    let p = parse(
        r#"
default:
  services: [redis:7]
web:
  isolation: docker
  services:
    - name: slipway-busybox
      alias: web
      entrypoint: ["httpd"]
      command: ["-f", "-p", "80"]
      variables:
        MODE: test
      pull_policy: [if-not-present]
  script: [wget -qO- http://web/]
plain:
  script: [echo]
own:
  isolation: docker
  variables:
    SLIPWAY_ISOLATION: cgroup
  script: [echo]
"#,
    )
    .unwrap();
    let web = p.jobs[0].to_job_response(1, 1, &[]);
    assert_eq!(web.services.len(), 1);
    let svc = &web.services[0];
    assert_eq!(
        (svc.name.as_str(), svc.alias.as_str()),
        ("slipway-busybox", "web")
    );
    assert_eq!(svc.entrypoint, ["httpd"]);
    assert_eq!(svc.command, ["-f", "-p", "80"]);
    assert_eq!(svc.variables[0].key, "MODE");
    assert_eq!(svc.pull_policy, ["if-not-present"]);
    assert_eq!(web.variable("SLIPWAY_ISOLATION"), Some("docker"));
    // default: services apply where a job names none.
    let plain = p.jobs[1].to_job_response(2, 1, &[]);
    assert_eq!(plain.services[0].name, "redis:7");
    assert_eq!(plain.variable("SLIPWAY_ISOLATION"), None);
    // The job's own variable wins over `isolation:`.
    let own = p.jobs[2].to_job_response(3, 1, &[]);
    assert_eq!(own.variable("SLIPWAY_ISOLATION"), Some("cgroup"));
}

#[test]
fn a_service_without_a_name_is_an_error_with_its_line() {
    let e = errors(
        r#"
job:
  services:
    - alias: db
  script: [echo]
"#,
    );
    assert!(
        e.iter()
            .any(|l| l.contains(".gitlab-ci.yml:4") && l.contains("a service needs a \"name\"")),
        "{e:?}"
    );
}

fn names(p: &Pipeline) -> Vec<&str> {
    p.jobs.iter().map(|j| j.name.as_str()).collect()
}

fn needs_of<'a>(p: &'a Pipeline, job: &str) -> Vec<(&'a str, bool)> {
    p.job(job)
        .unwrap()
        .needs
        .as_ref()
        .unwrap()
        .iter()
        .map(|n| (n.job.as_str(), n.artifacts))
        .collect()
}

#[test]
fn parallel_count_makes_numbered_jobs() {
    let p = parse(
        "\
variables:
  G: g
build:
  stage: build
  script: make
test:
  parallel: 3
  variables:
    OWN: o
  script: ./shard $CI_NODE_INDEX
",
    )
    .unwrap();
    assert_eq!(names(&p), ["build", "test 1/3", "test 2/3", "test 3/3"]);
    for (i, name) in (1u32..).zip(["test 1/3", "test 2/3", "test 3/3"]) {
        let j = p.job(name).unwrap();
        assert_eq!(
            j.parallel,
            Some(ParallelInstance {
                job: "test".into(),
                index: i,
                total: 3
            })
        );
        assert_eq!(j.line, 6, "every job points at the job as written");
        assert_eq!(j.script, ["./shard $CI_NODE_INDEX"]);
        let vars: Vec<(&str, &str)> = j
            .variables
            .iter()
            .map(|v| (v.key.as_str(), v.value.as_str()))
            .collect();
        let index = i.to_string();
        assert_eq!(
            vars,
            [
                ("CI_NODE_INDEX", index.as_str()),
                ("CI_NODE_TOTAL", "3"),
                ("G", "g"),
                ("OWN", "o"),
            ]
        );
        let payload = j.to_job_response(u64::from(i), 1, &[]);
        assert_eq!(payload.job_info.name, name);
        assert_eq!(payload.variable("CI_JOB_NAME"), Some(name));
        assert_eq!(payload.variable("CI_NODE_INDEX"), Some(index.as_str()));
        assert_eq!(payload.variable("CI_NODE_TOTAL"), Some("3"));
    }
    assert_eq!(p.job("build").unwrap().parallel, None);
    assert_eq!(
        p.job("build").unwrap().variable_value("CI_NODE_INDEX"),
        None
    );

    // The limits: 2 and 200.
    let p = parse("t: {parallel: 2, script: x}\n").unwrap();
    assert_eq!(names(&p), ["t 1/2", "t 2/2"]);
    let p = parse("t: {parallel: 200, script: x}\n").unwrap();
    assert_eq!(p.jobs.len(), 200);
    assert_eq!(p.jobs[199].name, "t 200/200");
}

#[test]
fn parallel_matrix_names_and_variables_as_gitlab_does() {
    let p = parse(
        r#"
deploy:
  variables:
    PROVIDER: own
    KEEP: k
  script: ./deploy
  parallel:
    matrix:
      - PROVIDER: aws
        STACK: [monitoring, app1]
        PY: ["3.12", 3.13]
      - PROVIDER: ovh
      - PROVIDER: [gcp, vultr]
        STACK: data
"#,
    )
    .unwrap();
    // Entries in turn; within one, the first variable varies slowest (Ruby's Array#product).
    assert_eq!(
        names(&p),
        [
            "deploy: [aws, monitoring, 3.12]",
            "deploy: [aws, monitoring, 3.13]",
            "deploy: [aws, app1, 3.12]",
            "deploy: [aws, app1, 3.13]",
            "deploy: [ovh]",
            "deploy: [gcp, data]",
            "deploy: [vultr, data]",
        ]
    );
    let j = p.job("deploy: [aws, app1, 3.13]").unwrap();
    assert_eq!(
        j.parallel,
        Some(ParallelInstance {
            job: "deploy".into(),
            index: 4,
            total: 7
        })
    );
    let vars: Vec<(&str, &str)> = j
        .variables
        .iter()
        .map(|v| (v.key.as_str(), v.value.as_str()))
        .collect();
    // The matrix value replaces the job's own PROVIDER; no duplicates.
    assert_eq!(
        vars,
        [
            ("CI_NODE_INDEX", "4"),
            ("CI_NODE_TOTAL", "7"),
            ("KEEP", "k"),
            ("PROVIDER", "aws"),
            ("STACK", "app1"),
            ("PY", "3.13"),
        ]
    );
    let ovh = p.job("deploy: [ovh]").unwrap();
    assert_eq!(ovh.variable_value("PROVIDER"), Some("ovh"));
    assert_eq!(ovh.variable_value("STACK"), None);
    assert_eq!(ovh.variable_value("CI_NODE_INDEX"), Some("5"));
    let last = p.jobs[6].to_job_response(7, 1, &[]);
    assert_eq!(last.variable("PROVIDER"), Some("vultr"));
    assert_eq!(last.variable("STACK"), Some("data"));
    assert_eq!(last.variable("CI_NODE_TOTAL"), Some("7"));
}

#[test]
fn parallel_comes_through_extends_and_node_variables_yield_to_the_jobs_own() {
    let p = parse(
        "\
.sharded:
  parallel: 2
t:
  extends: .sharded
  variables:
    CI_NODE_TOTAL: mine
  script: x
",
    )
    .unwrap();
    assert_eq!(names(&p), ["t 1/2", "t 2/2"]);
    let t = p.job("t 2/2").unwrap();
    assert_eq!(t.variable_value("CI_NODE_INDEX"), Some("2"));
    assert_eq!(t.variable_value("CI_NODE_TOTAL"), Some("mine"));
    assert_eq!(
        t.variables
            .iter()
            .filter(|v| v.key == "CI_NODE_TOTAL")
            .count(),
        1
    );
}

#[test]
fn needs_on_a_parallel_job_means_all_of_its_jobs() {
    let text = "\
stages: [build, test, deploy]
build:
  stage: build
  parallel:
    matrix:
      - ARCH: [amd64, arm64]
  script: make
test:
  stage: test
  parallel: 2
  needs: [build]
  script: make test
one:
  stage: test
  needs: [\"build: [arm64]\"]
  script: x
both:
  stage: deploy
  needs:
    - job: test
      artifacts: false
    - test 2/2
  script: y
later:
  stage: deploy
  script: z
";
    let p = parse(text).unwrap();
    let builds = [("build: [amd64]", true), ("build: [arm64]", true)];
    assert_eq!(needs_of(&p, "test 1/2"), builds);
    assert_eq!(needs_of(&p, "test 2/2"), builds, "each job gets the needs");
    assert_eq!(needs_of(&p, "one"), [("build: [arm64]", true)]);
    // A job named alone as well as through its parallel job is needed once.
    assert_eq!(
        needs_of(&p, "both"),
        [("test 1/2", false), ("test 2/2", false)]
    );
    assert_eq!(p.job("later").unwrap().needs, None);

    // The run waits for every job of the parallel job.
    let mut run = crate::run::PipelineRun::new(&p, None).unwrap();
    let idx = |n: &str| p.job_index(n).unwrap();
    let ready = |run: &crate::run::PipelineRun| -> Vec<String> {
        run.ready()
            .into_iter()
            .map(|i| p.jobs[i].name.clone())
            .collect()
    };
    assert_eq!(ready(&run), ["build: [amd64]", "build: [arm64]"]);
    for n in ["build: [amd64]", "build: [arm64]"] {
        run.start(idx(n)).unwrap();
    }
    run.finish(idx("build: [arm64]"), crate::run::JobStatus::Success)
        .unwrap();
    assert_eq!(ready(&run), ["one"], "test waits for both builds");
    run.finish(idx("build: [amd64]"), crate::run::JobStatus::Success)
        .unwrap();
    assert_eq!(ready(&run), ["test 1/2", "test 2/2", "one"]);
    run.start(idx("test 1/2")).unwrap();
    run.finish(idx("test 1/2"), crate::run::JobStatus::Success)
        .unwrap();
    assert!(!ready(&run).contains(&"both".to_string()));
    run.start(idx("test 2/2")).unwrap();
    run.finish(idx("test 2/2"), crate::run::JobStatus::Success)
        .unwrap();
    assert!(ready(&run).contains(&"both".to_string()));

    // A cycle through a parallel job is still found.
    let e = errors("a:\n  parallel: 2\n  needs: [b]\n  script: x\nb:\n  needs: [a]\n  script: y\n");
    assert!(
        e.iter().any(|l| l.contains("needs: circular dependency")),
        "{e:?}"
    );
}

#[test]
fn snapshot_and_restore_travel_as_variables() {
    let p = parse(
        r#"
variables:
  BASE: base
default:
  snapshot: on_failure
plain:
  script: x
saver:
  snapshot:
    save: warm-$BASE.v1
  restore: ${BASE}_0
  script: x
restorer:
  restore: warm-base.v1
  script: x
own:
  snapshot: {save: mine}
  variables:
    SLIPWAY_SNAPSHOT_SAVE: theirs
  script: x
matrix:
  parallel:
    matrix:
      - DISTRO: [debian, alpine]
  snapshot: {save: "cache-$DISTRO-${CI_NODE_INDEX}"}
  restore: base-$DISTRO
  script: x
"#,
    )
    .unwrap();
    let var = |job: &str, key: &str| {
        p.job(job)
            .unwrap()
            .to_job_response(1, 1, &[])
            .variable(key)
            .map(str::to_string)
    };

    let plain = p.job("plain").unwrap();
    assert_eq!(plain.snapshot, Some(Snapshot::OnFailure), "from default");
    assert_eq!(plain.restore, None);
    assert_eq!(
        var("plain", SNAPSHOT_VARIABLE).as_deref(),
        Some("on_failure")
    );
    assert_eq!(var("plain", SNAPSHOT_SAVE_VARIABLE), None);
    assert_eq!(var("plain", RESTORE_VARIABLE), None);

    let saver = p.job("saver").unwrap();
    assert_eq!(saver.snapshot, Some(Snapshot::Save("warm-base.v1".into())));
    assert_eq!(saver.restore.as_deref(), Some("base_0"));
    assert_eq!(var("saver", SNAPSHOT_VARIABLE), None, "the job's own wins");
    assert_eq!(
        var("saver", SNAPSHOT_SAVE_VARIABLE).as_deref(),
        Some("warm-base.v1")
    );
    assert_eq!(var("saver", RESTORE_VARIABLE).as_deref(), Some("base_0"));

    assert_eq!(
        var("restorer", RESTORE_VARIABLE).as_deref(),
        Some("warm-base.v1")
    );
    assert_eq!(
        var("restorer", SNAPSHOT_VARIABLE).as_deref(),
        Some("on_failure")
    );

    // A variable the job sets itself wins, and is not doubled.
    let own = p.job("own").unwrap().to_job_response(1, 1, &[]);
    assert_eq!(own.variable(SNAPSHOT_SAVE_VARIABLE), Some("theirs"));
    assert_eq!(
        own.variables
            .iter()
            .filter(|v| v.key == SNAPSHOT_SAVE_VARIABLE)
            .count(),
        1
    );

    // Each job of a matrix saves and restores its own.
    let debian = p.job("matrix: [debian]").unwrap();
    assert_eq!(
        debian.snapshot,
        Some(Snapshot::Save("cache-debian-1".into()))
    );
    assert_eq!(debian.restore.as_deref(), Some("base-debian"));
    assert_eq!(
        var("matrix: [alpine]", SNAPSHOT_SAVE_VARIABLE).as_deref(),
        Some("cache-alpine-2")
    );
    assert_eq!(
        var("matrix: [alpine]", RESTORE_VARIABLE).as_deref(),
        Some("base-alpine")
    );

    // The names the executor reads.
    assert_eq!(SNAPSHOT_VARIABLE, "SLIPWAY_SNAPSHOT");
    assert_eq!(SNAPSHOT_SAVE_VARIABLE, "SLIPWAY_SNAPSHOT_SAVE");
    assert_eq!(RESTORE_VARIABLE, "SLIPWAY_RESTORE");
    assert_eq!(ISOLATION_VARIABLE, "SLIPWAY_ISOLATION");
}

#[test]
fn snapshot_names_expand_variables() {
    let vars = [
        Variable::new("A", "one"),
        Variable::new("B_2", "two"),
        Variable::new("A", "last"),
    ];
    let ok = [
        ("plain", "plain"),
        ("$A", "last"),
        ("x-${B_2}-y", "x-two-y"),
        ("$A$B_2", "lasttwo"),
        ("$A.$B_2", "last.two"),
        ("a$", "a$"),
        ("a$-b", "a$-b"),
        ("${}", "${}"),
        ("${A", "${A"),
    ];
    for (text, want) in ok {
        assert_eq!(expand_vars(text, &vars).as_deref(), Ok(want), "{text}");
    }
    assert_eq!(expand_vars("x-$NOPE", &vars), Err("NOPE".to_string()));
    assert_eq!(expand_vars("${NOPE}", &vars), Err("NOPE".to_string()));

    assert_eq!(snapshot_name("a.B_c-9", &[]).as_deref(), Ok("a.B_c-9"));
    assert_eq!(
        snapshot_name(&"x".repeat(64), &[]).as_deref(),
        Ok("x".repeat(64).as_str())
    );
    for bad in ["", ".", "..", "a b", "a/b", "ü", "a$"] {
        assert!(snapshot_name(bad, &[]).is_err(), "{bad:?}");
    }
    assert!(snapshot_name(&"x".repeat(65), &[]).is_err());
    // An empty value makes an empty, invalid name.
    assert!(snapshot_name("$E", &[Variable::new("E", "")]).is_err());
}

#[test]
fn parallel_snapshot_and_restore_error_messages() {
    let cases: &[(&str, &str)] = &[
        (
            "test:\n  script: x\n  parallel: 0\n",
            ".gitlab-ci.yml:3: job \"test\": parallel: 0 is out of range (1 to 200)",
        ),
        (
            "test:\n  script: x\n  parallel: 201\n",
            ".gitlab-ci.yml:3: job \"test\": parallel: 201 is out of range (1 to 200)",
        ),
        (
            "test:\n  script: x\n  parallel: 2.5\n",
            ".gitlab-ci.yml:3: job \"test\": parallel: expected a whole number from 1 to 200 or a mapping with \"matrix\", found \"2.5\"",
        ),
        (
            "test:\n  script: x\n  parallel: [2]\n",
            ".gitlab-ci.yml:3: job \"test\": parallel: expected a whole number from 1 to 200 or a mapping with \"matrix\", found a list",
        ),
        (
            "test:\n  script: x\n  parallel: {count: 2}\n",
            ".gitlab-ci.yml:3: job \"test\": parallel: unknown key \"count\" (expected matrix)",
        ),
        (
            "test:\n  script: x\n  parallel: {count: 2}\n",
            ".gitlab-ci.yml:3: job \"test\": parallel: missing \"matrix\"",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix: {A: b}\n",
            ".gitlab-ci.yml:4: job \"test\": parallel:matrix: expected a list of mappings of variables to values, found a mapping",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix: []\n",
            ".gitlab-ci.yml:4: job \"test\": parallel:matrix: expected at least one entry",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix:\n      - A: [1]\n      - b\n",
            ".gitlab-ci.yml:6: job \"test\": parallel:matrix: entry 2: expected a mapping of variables to values, found a string",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix:\n      - {}\n",
            ".gitlab-ci.yml:5: job \"test\": parallel:matrix: entry 1: expected at least one variable",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix:\n      - VAR: {a: b}\n",
            ".gitlab-ci.yml:5: job \"test\": parallel:matrix: entry 1: VAR must be a string or a list of strings",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix:\n      - A: x\n      - VAR: [a, [b]]\n",
            ".gitlab-ci.yml:6: job \"test\": parallel:matrix: entry 2: VAR must be a string or a list of strings",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix:\n      - VAR:\n",
            ".gitlab-ci.yml:5: job \"test\": parallel:matrix: entry 1: VAR must be a string or a list of strings",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix:\n      - VAR: []\n",
            ".gitlab-ci.yml:5: job \"test\": parallel:matrix: entry 1: VAR must not be an empty list",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix:\n      - A: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]\n        B: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]\n",
            ".gitlab-ci.yml:4: job \"test\": parallel:matrix: makes 210 jobs, more than the limit of 200",
        ),
        (
            "test:\n  script: x\n  parallel:\n    matrix:\n      - A: [a, b]\n      - A: b\n",
            ".gitlab-ci.yml:1: job \"test\": parallel:matrix: makes the job \"test: [b]\" twice",
        ),
        (
            "test:\n  script: x\n  parallel: 2\n\"test 2/2\":\n  script: y\n",
            ".gitlab-ci.yml:4: job \"test 2/2\": the name is already taken by a job of parallel job \"test\"",
        ),
        (
            "\"test 2/2\":\n  script: y\ntest:\n  script: x\n  parallel: 2\n",
            ".gitlab-ci.yml:3: job \"test\": parallel: makes a job named \"test 2/2\", a name already taken",
        ),
        (
            "a:\n  stage: build\n  script: x\n  needs: [b]\nb:\n  parallel: 2\n  script: y\n",
            ".gitlab-ci.yml:4: job \"a\": needs: \"b\" is in a later stage (test) than this job (build)",
        ),
        (
            "a:\n  script: x\n  needs: [b, \"b 1/2\", b]\nb:\n  parallel: 2\n  script: y\n",
            ".gitlab-ci.yml:3: job \"a\": needs: \"b\" is listed twice",
        ),
        (
            "a:\n  script: x\n  needs: [\"b 3/2\"]\nb:\n  parallel: 2\n  script: y\n",
            ".gitlab-ci.yml:3: job \"a\": needs: unknown job \"b 3/2\"",
        ),
        (
            "a:\n  script: x\n  snapshot: always\n",
            ".gitlab-ci.yml:3: job \"a\": snapshot: unknown value \"always\" (expected on_failure or {save: NAME})",
        ),
        (
            "a:\n  script: x\n  snapshot: [on_failure]\n",
            ".gitlab-ci.yml:3: job \"a\": snapshot: expected on_failure or {save: NAME}, found a list",
        ),
        (
            "a:\n  script: x\n  snapshot: {keep: x}\n",
            ".gitlab-ci.yml:3: job \"a\": snapshot: unknown key \"keep\" (expected save)",
        ),
        (
            "a:\n  script: x\n  snapshot: {keep: x}\n",
            ".gitlab-ci.yml:3: job \"a\": snapshot: missing \"save\"",
        ),
        (
            "a:\n  script: x\n  snapshot:\n    save: [x]\n",
            ".gitlab-ci.yml:4: job \"a\": snapshot:save: expected a snapshot name, found a list",
        ),
        (
            "a:\n  script: x\n  snapshot:\n    save: my snap\n",
            ".gitlab-ci.yml:4: job \"a\": snapshot:save: invalid snapshot name \"my snap\": expected 1 to 64 letters, digits, \".\", \"_\" or \"-\" (not \".\" or \"..\")",
        ),
        (
            "a:\n  script: x\n  variables: {V: \"a/b\"}\n  snapshot:\n    save: s-$V\n",
            ".gitlab-ci.yml:5: job \"a\": snapshot:save: invalid snapshot name \"s-a/b\" (from \"s-$V\"): expected 1 to 64 letters, digits, \".\", \"_\" or \"-\" (not \".\" or \"..\")",
        ),
        (
            "a:\n  script: x\n  snapshot: {save: \"s-$NOPE\"}\n",
            ".gitlab-ci.yml:3: job \"a\": snapshot:save: variable \"NOPE\" in \"s-$NOPE\" is not defined for this job",
        ),
        (
            "a:\n  script: x\n  parallel: 2\n  snapshot: {save: \"s-$NOPE\"}\n",
            ".gitlab-ci.yml:4: job \"a 1/2\": snapshot:save: variable \"NOPE\" in \"s-$NOPE\" is not defined for this job",
        ),
        (
            "a:\n  script: x\n  restore: {save: x}\n",
            ".gitlab-ci.yml:3: job \"a\": restore: expected a snapshot name, found a mapping",
        ),
        (
            "a:\n  script: x\n  restore: ..\n",
            ".gitlab-ci.yml:3: job \"a\": restore: invalid snapshot name \"..\": expected 1 to 64 letters, digits, \".\", \"_\" or \"-\" (not \".\" or \"..\")",
        ),
        (
            "a:\n  script: x\n  restore: r-$X\n",
            ".gitlab-ci.yml:3: job \"a\": restore: variable \"X\" in \"r-$X\" is not defined for this job",
        ),
        (
            "default:\n  snapshot: {save: x}\na:\n  script: x\n",
            ".gitlab-ci.yml:2: default: snapshot: only on_failure is allowed here (a saved snapshot is named on each job)",
        ),
        (
            "default:\n  snapshot: sometimes\na:\n  script: x\n",
            ".gitlab-ci.yml:2: default: snapshot: unknown value \"sometimes\" (expected on_failure or {save: NAME})",
        ),
        (
            "default:\n  restore: x\na:\n  script: x\n",
            ".gitlab-ci.yml:2: default: restore: not allowed here (name the snapshot to restore on each job)",
        ),
    ];
    for (text, want) in cases {
        let got = errors(text);
        assert!(
            got.iter().any(|g| g == want),
            "for {text:?}\n want: {want}\n  got: {got:#?}"
        );
    }
    // One report per job as written, not one per job a bad name would have made.
    let e = errors(
        "a:\n  script: x\n  parallel: 5\n  snapshot: {save: \"$NOPE\"}\n  restore: \"$NOPE\"\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    // A huge product is refused without being built.
    let axis = format!(
        "[{}]",
        (0..1000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let e = errors(&format!(
        "a:\n  script: x\n  parallel:\n    matrix:\n      - {{A: {axis}, B: {axis}, C: {axis}, D: {axis}, E: {axis}, F: {axis}, G: {axis}}}\n"
    ));
    assert!(
        e.iter()
            .any(|l| l.contains("parallel:matrix: makes too many jobs")),
        "{e:?}"
    );
}

#[test]
fn parallel_is_no_longer_an_unsupported_key() {
    let p = parse("a:\n  script: x\n  parallel: 2\n").unwrap();
    assert!(p.warnings.is_empty());
    // A typo still gets a hint.
    let e = errors("a:\n  script: x\n  paralel: 2\n");
    assert_eq!(
        e,
        [".gitlab-ci.yml:3: job \"a\": unknown key \"paralel\" (did you mean \"parallel\"?)"]
    );
    let e = errors("a:\n  script: x\n  snapshots: on_failure\n");
    assert_eq!(
        e,
        [".gitlab-ci.yml:3: job \"a\": unknown key \"snapshots\" (did you mean \"snapshot\"?)"]
    );
}

#[test]
fn keys_written_twice_keep_the_last_value_with_a_warning() {
    // Psych (GitLab's YAML) keeps the last value of a key written twice: a job, a template,
    // a job's variables.
    let text = "\
.base:\n  script: [echo first]\n.base:\n  script: [echo second]\n\
a:\n  extends: .base\n  variables:\n    X: one\n    X: two\n\
b:\n  script: [old]\nb:\n  script: [new]\n";
    let p = parse(text).unwrap();
    let names: Vec<_> = p.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, vec!["a", "b"]);
    let a = p.job("a").unwrap();
    assert_eq!(a.script, vec!["echo second"]);
    assert_eq!(lookup_in(&a.variables, "X").as_deref(), Some("two"));
    assert_eq!(p.job("b").unwrap().script, vec!["new"]);
    let dup: Vec<_> = p
        .warnings
        .iter()
        .filter(|w| w.contains("duplicate key"))
        .collect();
    assert_eq!(
        dup,
        vec![
            ".gitlab-ci.yml:3: duplicate key \".base\" (lines 1 and 3): the last value is used, as GitLab does",
            ".gitlab-ci.yml:9: duplicate key \"X\" (lines 8 and 9): the last value is used, as GitLab does",
            ".gitlab-ci.yml:12: duplicate key \"b\" (lines 10 and 12): the last value is used, as GitLab does",
        ]
    );
}

#[test]
fn extends_is_applied_before_references_are_resolved() {
    // GitLab merges `extends` first: `.a` has a before_script only through `.base`.
    let text = "\
.base:\n  before_script: [echo base]\n  variables: {V: base}\n\
.a:\n  extends: .base\n\
job:\n  before_script:\n    - !reference [.a, before_script]\n    - echo own\n  script: [!reference [.a, variables, V]]\n";
    let p = parse(text).unwrap();
    let job = p.job("job").unwrap();
    assert_eq!(job.before_script, vec!["echo base", "echo own"]);
    assert_eq!(job.script, vec!["base"]);
}

#[test]
fn parallel_one_nested_needs_and_null_only() {
    let text = "\
.deps: &deps [a]\n\
.base:\n  only: [tags]\n\
a:\n  script: x\n  parallel: 1\n\
b:\n  stage: build\n  script: x\n\
c:\n  extends: .base\n  only: null\n  script: x\n  needs: [*deps, {job: b, artifacts: false}]\n";
    let p = parse(text).unwrap();
    let a = p
        .job("a 1/1")
        .expect("parallel: 1 makes one job named a 1/1");
    assert_eq!(
        lookup_in(&a.variables, "CI_NODE_TOTAL").as_deref(),
        Some("1")
    );
    // `only: null` cancels the inherited `only: [tags]`: c runs on a branch pipeline.
    let c = p.job("c").expect("c is in the pipeline");
    let needs: Vec<_> = c.needs.iter().flatten().map(|n| n.job.as_str()).collect();
    assert_eq!(needs, vec!["a 1/1", "b"]);
}
