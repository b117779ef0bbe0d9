//! Progress on a terminal (a pseudo-terminal from util-linux's `script`) and off one:
//! `slipway exec`'s live line per running job, `slipway image build`'s step lines. Piped
//! output gets no escape sequences at all.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Run, World};

/// A job that prints a line (with a secret in it) and then stays quiet for a while: its live
/// line shows that line, masked.
const PIPELINE: &str = r#"
stages: [check, after]
sleeper:
  stage: check
  script:
    - echo "about to sleep, token $SECRET_TOKEN" && sleep 3
    - echo "slept"
later:
  stage: after
  script:
    - echo "later runs"
"#;

/// The variables file beside the pipeline: its values are masked in job output.
const VARIABLES: &str = "SECRET_TOKEN: hunter2-very-secret\n";

/// `slipway ARGS` with its stdout and stderr on a pseudo-terminal; the run's output is what
/// the terminal received.
fn run_on_a_terminal(w: &World, args: &[&str]) -> Run {
    let command: Vec<String> = std::iter::once(common::slipway().display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let child = Command::new("script")
        .args(["-qfec", &command.join(" "), "/dev/null"])
        .env("TMPDIR", w.tmp())
        .env("SLIPWAY_PLUGIN_DIR", common::plugin_dir())
        .env_remove("RUST_LOG")
        // The pseudo-terminal has no size of its own: a known width keeps lines uncut.
        .env("COLUMNS", "120")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn script (util-linux)");
    Run::from(common::wait_with_timeout(child, Duration::from_secs(240)))
}

/// Terminal output as plain lines: escape sequences and carriage returns removed.
fn plain(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.next() == Some('[') {
                    for p in chars.by_ref() {
                        if ('@'..='~').contains(&p) {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn a_terminal_shows_a_live_line_per_running_job() {
    let w = World::new();
    let file = w.write("pipeline.yml", PIPELINE);
    w.write(".slipway-variables.yml", VARIABLES);
    let run = run_on_a_terminal(&w, &["exec", file.to_str().expect("path")]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let raw = &run.stdout;
    assert!(raw.contains('\u{1b}'), "no live lines drawn:\n{raw:?}");

    assert!(
        !raw.contains("hunter2"),
        "the secret reached the terminal:\n{raw:?}"
    );

    let text = plain(raw);
    // The live line: stage, job, elapsed time, and the last line the job printed.
    let live: Vec<&str> = text.lines().filter(|l| l.starts_with("» ")).collect();
    assert!(
        live.iter().any(|l| l.starts_with("» check › sleeper  ")
            && l.ends_with("s  about to sleep, token [MASKED]")),
        "no live line of sleeper with its last output: {live:#?}\n{}",
        run.explain()
    );
    assert!(
        live.iter().any(|l| l.starts_with("» after › later  ")),
        "{live:#?}"
    );

    // Job output still scrolls above the live lines, unchanged.
    let plain_run = Run {
        code: run.code,
        stdout: text.clone(),
        stderr: String::new(),
    };
    assert_eq!(
        plain_run
            .job_lines("sleeper")
            .iter()
            .filter(|l| l.starts_with("about to sleep") || *l == "slept")
            .collect::<Vec<_>>(),
        ["about to sleep, token [MASKED]", "slept"],
        "{text}"
    );

    // The live lines are cleared before the summary, which prints clean.
    let summary_at = raw.rfind("\nJOB ").expect("summary header");
    let summary = &raw[summary_at..];
    assert!(
        !summary.contains('\u{1b}'),
        "escape sequences in the summary: {summary:?}"
    );
    let last_live = raw.rfind("» ").expect("a live line");
    let last_clear = raw.rfind("\u{1b}[J").expect("a clear");
    assert!(
        last_live < last_clear && last_clear < summary_at,
        "the last live line was not cleared before the summary:\n{raw:?}"
    );
    let rows: Vec<(String, String)> = plain_run
        .summary()
        .into_iter()
        .map(|r| (r.job, r.status))
        .collect();
    assert_eq!(
        rows,
        [("sleeper", "success"), ("later", "success")].map(|(j, s)| (j.to_string(), s.to_string())),
        "{text}"
    );
}

#[test]
fn a_pipe_gets_plain_output() {
    let w = World::new();
    let file = w.write("pipeline.yml", PIPELINE);
    w.write(".slipway-variables.yml", VARIABLES);
    let run = w.run(&["exec", file.to_str().expect("path")]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(
        !run.stdout.contains('\u{1b}') && !run.stderr.contains('\u{1b}'),
        "escape sequences in piped output:\n{}",
        run.explain()
    );
    assert!(
        !run.stdout.lines().any(|l| l.starts_with("» ")),
        "live lines in piped output:\n{}",
        run.explain()
    );
    assert!(!run.stdout.contains("hunter2"), "{}", run.explain());
    assert!(
        run.job_lines("sleeper")
            .contains(&"about to sleep, token [MASKED]".to_string()),
        "{}",
        run.explain()
    );
    assert_eq!(run.summary().len(), 2, "{}", run.explain());
}

/// The `slipway-guest-agent` binary beside `slipway`, built when this test run did not.
fn guest_agent() -> PathBuf {
    let agent = common::slipway().with_file_name("slipway-guest-agent");
    if !agent.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-p", "slipway-guest-agent"])
            .status()
            .expect("cargo build the guest agent");
        assert!(st.success(), "building slipway-guest-agent failed");
    }
    agent
}

/// What a terminal line ends up showing: the text after its last carriage return, escape
/// sequences removed.
fn shown(line: &str) -> String {
    let last = line
        .split('\r')
        .rfind(|s| !plain(s).trim().is_empty())
        .unwrap_or("");
    plain(last).trim_end().to_string()
}

#[test]
fn image_build_shows_each_step() {
    slipway_testkit::guest::ensure_vm_tools().expect("VM image tools");
    let w = World::new();
    let agent = guest_agent();
    let images = w.path().join("images");
    let args = |name: &'static str| {
        vec![
            "image".to_string(),
            "build".into(),
            "--name".into(),
            name.into(),
            "--level".into(),
            "microvm".into(),
            "--images-dir".into(),
            images.display().to_string(),
            "--agent".into(),
            agent.display().to_string(),
        ]
    };

    // A terminal: each step's line turns (spinner, elapsed time) while it runs, and ends as
    // the step's duration.
    let tty_args = args("on-a-tty");
    let tty_args: Vec<&str> = tty_args.iter().map(String::as_str).collect();
    let run = run_on_a_terminal(&w, &tty_args);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let raw = &run.stdout;
    assert!(
        raw.contains("\r[1/6] checking tools, kernel and agent … ⠋ 0s\u{1b}[K"),
        "no running step line:\n{raw:?}"
    );
    let steps: Vec<String> = raw
        .lines()
        .map(shown)
        .filter(|l| l.starts_with('['))
        .collect();
    assert_eq!(steps.len(), 6, "{steps:#?}\n{raw:?}");
    for (i, s) in steps.iter().enumerate() {
        assert!(
            s.starts_with(&format!("[{}/6] ", i + 1)) && s.contains(" … done in "),
            "step {}: {s:?}\n{raw:?}",
            i + 1
        );
    }

    // A pipe: a plain line when each step starts and one when it ends.
    let pipe_args = args("piped");
    let pipe_args: Vec<&str> = pipe_args.iter().map(String::as_str).collect();
    let run = Run::from(
        w.slipway(&pipe_args)
            .output()
            .expect("run slipway image build"),
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(
        !run.stdout.contains('\u{1b}') && !run.stderr.contains('\u{1b}'),
        "{}",
        run.explain()
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 12, "{}", run.explain());
    assert_eq!(lines[0], "[1/6] checking tools, kernel and agent …");
    assert!(
        lines[1].starts_with("[1/6] checking tools, kernel and agent … done in "),
        "{}",
        run.explain()
    );
}
