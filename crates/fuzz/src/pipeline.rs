//! Pipeline YAML (`.gitlab-ci.yml`), includes too: the corpus cases of
//! `crates/pipeline/tests/pipelines` mutated, each parsed in its own case directory so
//! `include:local` finds the case's real included files.

use std::path::PathBuf;
use std::sync::OnceLock;

use slipway_pipeline::{Pipeline, PipelineError, PipelineOptions};

use crate::mutate::{self, Mutated};

/// The input: a corpus case and edits.
pub type Input = Mutated;

struct Seeds {
    /// (case directory, main file text)
    cases: Vec<(PathBuf, Vec<u8>)>,
}

fn seeds() -> &'static Seeds {
    static SEEDS: OnceLock<Seeds> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = mutate::workspace_root().join("crates/pipeline/tests/pipelines");
        let mut cases: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        for (path, text) in mutate::read_seeds(&root, &|n| n.ends_with(".yml")) {
            let dir = path.parent().map(PathBuf::from).unwrap_or_default();
            // Included files are seeds too (parsed from their case's directory).
            let case = dir
                .ancestors()
                .find(|d| d.parent() == Some(root.as_path()))
                .map(PathBuf::from)
                .unwrap_or(dir);
            cases.push((case, text));
        }
        Seeds { cases }
    })
}

/// Number of seed files (main files and included files).
pub fn seed_count() -> usize {
    seeds().cases.len()
}

/// GitLab CI words and YAML syntax the edits insert.
pub const DICT: &[&str] = &[
    "include:",
    "include: ci/*.yml",
    "- local: ci/build.yml",
    "local: /etc/passwd",
    "local: ../../../../etc/passwd",
    "project: group/other",
    "remote: https://x/y.yml",
    "extends: .base",
    "extends: [.a, .b]",
    "!reference [.base, script]",
    "!reference [",
    "&anchor",
    "*anchor",
    "<<: *anchor",
    "<<: *",
    "needs:",
    "needs: [build]",
    "- job: build\n    parallel:\n      matrix:\n        - A: [1, 2]",
    "parallel: 200",
    "parallel: 0",
    "parallel:\n  matrix:\n    - X: [a, b]\n      Y: [c]",
    "rules:",
    "- if: $CI_COMMIT_BRANCH == \"main\"",
    "- if: $X =~ /a(b/",
    "- if: '$A && ($B || $C'",
    "- exists: ['**/*']",
    "- changes: ['src/**/*']",
    "when: never",
    "when: manual",
    "when: delayed\n  start_in: 5 minutes",
    "start_in: 9999999 years",
    "allow_failure:",
    "allow_failure:\n    exit_codes: [1, 300]",
    "retry: 3",
    "retry:\n    max: 99",
    "timeout: 1h 30m",
    "timeout: 99999999999999 weeks",
    "timeout: -1s",
    "stage: .pre",
    "stages: [a, a, b]",
    "variables:",
    "variables:\n  A: $B\n  B: $A",
    "${A}",
    "$$",
    "${",
    "$",
    "\"${CI_JOB_NAME}\"",
    "expand: false",
    "description:",
    "options: [a]",
    "value:",
    "script:",
    "- echo hi",
    "before_script:",
    "after_script:",
    "artifacts:",
    "paths: [../out, /abs]",
    "reports:\n    dotenv: ../x.env",
    "cache:",
    "key:\n      files: [Gemfile.lock]",
    "key: ../../x",
    "image: alpine",
    "services: [postgres]",
    "workflow:",
    "default:",
    "inherit:\n    default: false",
    "spec:\n  inputs:\n    x:\n      default: 1\n---\n",
    "$[[ inputs.x ]]",
    "$[[ inputs.",
    "resource_group: r",
    "coverage: '/(\\d+)%/'",
    "environment: prod",
    "trigger: x",
    "only: [main]",
    "except:\n    variables: [$X]",
    "only:\n    changes: [a]",
    "dependencies: []",
    ": ",
    "- ",
    "  ",
    "\t",
    "\n",
    "{",
    "}",
    "[",
    "]",
    "'",
    "\"",
    "#",
    "|",
    ">-",
    "? ",
    "---\n",
    "...\n",
    "~",
    "null",
    "true",
    "0x1F",
    "1e400",
    "-0",
    "18446744073709551616",
    ".inf",
    "!!binary aGk=",
    "!!str",
    "%YAML 1.2\n",
    "\u{feff}",
    "\u{0}",
    "é",
    "💥",
];

/// Parses the mutated file: a pipeline, or an error whose every line names a file and line.
pub fn check(input: &Input) {
    let seeds = seeds();
    let texts: Vec<&[u8]> = seeds.cases.iter().map(|(_, t)| t.as_slice()).collect();
    let bytes = mutate::apply(&texts, DICT, input);
    let text = String::from_utf8_lossy(&bytes);
    let Some(i) = usize::from(input.seed).checked_rem(seeds.cases.len()) else {
        return;
    };
    let (dir, _) = &seeds.cases[i];
    check_text(&text, dir.clone(), input.flag);
}

/// Parses `text` as `.gitlab-ci.yml` in `dir` and checks the outcome.
pub fn check_text(text: &str, dir: PathBuf, allow_unsupported: bool) {
    let opts = PipelineOptions {
        allow_unsupported,
        project_dir: Some(dir),
        include_root: Some(mutate::workspace_root().join("crates/pipeline/tests/pipelines")),
        // Mutated URLs must not reach the network.
        offline: true,
        ..Default::default()
    };
    match Pipeline::parse(text, ".gitlab-ci.yml", opts) {
        Ok(p) => {
            // A child pipeline's jobs have the child's stages; a top pipeline's its own.
            for job in p.jobs.iter().filter(|j| j.upstream.is_none()) {
                assert!(
                    p.stages.contains(&job.stage),
                    "job {:?} in stage {:?} not among stages {:?}",
                    job.name,
                    job.stage,
                    p.stages
                );
            }
            // Every child job follows a trigger job of this pipeline (directly or through its
            // own child pipeline's).
            for job in p.jobs.iter().filter(|j| j.upstream.is_some()) {
                let up = job.upstream.as_deref().unwrap_or_default();
                assert!(
                    p.job(up).is_some_and(|t| t.trigger.is_some()),
                    "child job {:?} has no trigger job {up:?}",
                    job.name
                );
            }
        }
        Err(PipelineError::Invalid { diagnostics }) => {
            assert!(
                !diagnostics.is_empty(),
                "an invalid pipeline with no diagnostic"
            );
            for d in &diagnostics {
                assert!(!d.file.is_empty(), "a diagnostic without its file: {d}");
                assert!(d.line >= 1, "a diagnostic without its line: {d}");
                assert!(!d.message.trim().is_empty(), "an empty diagnostic: {d}");
            }
        }
        Err(e @ PipelineError::Read { .. }) => {
            panic!("parse() of text must not fail reading: {e}")
        }
    }
}
