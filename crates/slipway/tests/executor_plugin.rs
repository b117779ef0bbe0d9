//! The `plugin` executor through real plugin processes, driven by `slipway exec`: the Python
//! bubblewrap plugin (`plugins/python/executor-plugin-bubblewrap`, go-plugin peer from PyPI,
//! Debian's `bwrap`) runs a pipeline with artifacts and a timeout in sandboxes; a plugin killed
//! mid-job fails that job with a system failure and the next job runs on the restarted plugin;
//! a plugin that never answers Prepare fails the job within `prepare_timeout`. Nothing is left:
//! no plugin process, no sandbox, no job directory.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Run, World, processes_matching, wait_until, wait_with_timeout};
use slipway_executor_plugin::{MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE};
use slipway_testkit::python;

/// `plugins/` of this world holding `executor-plugin-<name>`: a copy of `script` (so its
/// command line names this world) run by the Python that has the go-plugin peer.
fn install_plugin(w: &World, name: &str, script: &Path, args: &[&str]) -> PathBuf {
    let python = python::python().unwrap();
    let dir = w.path().join("plugins");
    let stubs = dir.join("stubs");
    python::generate_stubs(&python, "executor/v1/executor.proto", &stubs).unwrap();
    let copy = dir.join(format!("{name}.py"));
    std::fs::copy(script, &copy).unwrap();
    python::wrapper(
        &dir,
        &format!("executor-plugin-{name}"),
        &python,
        &stubs,
        &copy,
        args,
    )
    .unwrap();
    dir
}

fn bubblewrap(w: &World) -> PathBuf {
    // Debian's bubblewrap, installed when missing (tests never skip for want of it).
    if !Path::new("/usr/bin/bwrap").exists() {
        slipway_testkit::apt_install("bubblewrap").unwrap();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../plugins/python/executor-plugin-bubblewrap");
    install_plugin(w, "bubblewrap", &script, &[])
}

fn config(w: &World, extra: &str) -> PathBuf {
    w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
[[runners]]
  name = "sandboxed"
  executor = "plugin"
  [runners.plugin]
    name = "bubblewrap"
{extra}
    [runners.plugin.config]
      root = "{}"
"#,
            w.path().join("sandboxes").display()
        ),
    )
}

/// `slipway exec` of `pipeline` with this world's executor plugins, running.
fn spawn_exec(w: &World, plugins: &Path, cfg: &Path, pipeline: &Path) -> std::process::Child {
    w.slipway(&[
        "exec",
        "-c",
        cfg.to_str().unwrap(),
        pipeline.to_str().unwrap(),
    ])
    .env("SLIPWAY_PLUGIN_DIR", plugins)
    .spawn()
    .expect("spawn slipway")
}

fn exec(w: &World, plugins: &Path, cfg: &Path, pipeline: &Path) -> Run {
    let child = spawn_exec(w, plugins, cfg, pipeline);
    Run::from(wait_with_timeout(child, Duration::from_secs(240)))
}

/// Wait until a job's script created `started-marker` in its sandbox.
fn wait_for_marker(w: &World) {
    let started = || {
        sandboxes(w).iter().any(|d| {
            walk_has(
                &w.path().join("sandboxes").join(d).join("work/builds"),
                "started-marker",
            )
        })
    };
    assert!(
        wait_until(Duration::from_secs(60), started),
        "the job never started"
    );
}

/// Job directories left under the sandboxes' root.
fn sandboxes(w: &World) -> Vec<String> {
    std::fs::read_dir(w.path().join("sandboxes"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn assert_nothing_left(w: &World, run: &Run) {
    assert!(
        sandboxes(w).is_empty(),
        "{:?}\n{}",
        sandboxes(w),
        run.explain()
    );
    let root = w.path().join("sandboxes").display().to_string();
    assert!(
        processes_matching(&root).is_empty(),
        "{:?}",
        processes_matching(&root)
    );
    assert!(w.processes().is_empty(), "{:?}", w.processes());
}

fn status_of(run: &Run, job: &str) -> String {
    run.summary()
        .into_iter()
        .find(|r| r.job == job)
        .map(|r| r.status)
        .unwrap_or_else(|| panic!("no row for {job}\n{}", run.explain()))
}

#[test]
fn bubblewrap_plugin_runs_a_pipeline_with_artifacts_and_a_timeout_in_sandboxes() {
    let w = World::new();
    let plugins = bubblewrap(&w);
    let cfg = config(&w, "");
    let pipeline = w.write(
        "pipeline.yml",
        r#"
stages: [build, test]
build:
  stage: build
  script:
    - mkdir -p out && echo "made in a sandbox" > out/result.txt
    - echo "pid of my shell $$"
    - echo "network $(grep -c ':' /proc/net/dev) interface(s)"
    - if touch /etc/slipway-escape 2>/dev/null; then echo "wrote /etc"; else echo "/etc is read-only"; fi
  artifacts:
    paths: [out/]
check:
  stage: test
  script:
    - cat out/result.txt
slow:
  stage: test
  timeout: 3s
  allow_failure: true
  script:
    - echo "sleeping"
    - sleep 120
"#,
    );
    let run = exec(&w, &plugins, &cfg, &pipeline);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let build = run.job_lines("build");
    let has = |lines: &[String], s: &str| lines.iter().any(|l| l.contains(s));
    assert!(
        has(&build, "Using executor plugin bubblewrap 0.1.0"),
        "{}",
        run.explain()
    );
    assert!(has(&build, "Using bubblewrap sandbox"), "{}", run.explain());
    // Its own pid namespace (bwrap is pid 1), no network but loopback, a read-only root.
    let shell_pid: u32 = build
        .iter()
        .find_map(|l| l.strip_prefix("pid of my shell "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid line\n{}", run.explain()));
    assert!(shell_pid <= 3, "pid {shell_pid} is not a new namespace's");
    assert!(has(&build, "network 1 interface(s)"), "{}", run.explain());
    assert!(has(&build, "/etc is read-only"), "{}", run.explain());
    assert!(!Path::new("/etc/slipway-escape").exists());
    // The artifact went out of one sandbox and into the next job's.
    assert!(
        run.job_lines("check")
            .contains(&"made in a sandbox".to_string()),
        "{}",
        run.explain()
    );
    assert_eq!(status_of(&run, "build"), "success");
    assert_eq!(status_of(&run, "check"), "success");
    assert_eq!(status_of(&run, "slow"), "failed (allowed)");
    assert!(
        has(&run.job_lines("slow"), "job execution timeout"),
        "{}",
        run.explain()
    );
    assert_nothing_left(&w, &run);
}

#[test]
fn a_plugin_killed_mid_job_fails_that_job_and_the_next_runs_on_the_restarted_plugin() {
    let w = World::new();
    let plugins = bubblewrap(&w);
    let cfg = config(&w, "");
    let pipeline = w.write(
        "pipeline.yml",
        r#"
stages: [one, two]
victim:
  stage: one
  allow_failure: true
  script:
    - touch started-marker
    - sleep 60
after:
  stage: two
  script:
    - echo "ran after the crash"
"#,
    );
    let child = spawn_exec(&w, &plugins, &cfg, &pipeline);
    wait_for_marker(&w);
    let script = plugins.join("bubblewrap.py").display().to_string();
    let plugin: Vec<String> = processes_matching(&script)
        .into_iter()
        .filter(|p| !p.contains("/bin/sh"))
        .collect();
    assert_eq!(plugin.len(), 1, "{plugin:?}");
    let pid = plugin[0].split_whitespace().next().unwrap().to_owned();
    common::signal(pid.parse().unwrap(), "KILL");
    let run = Run::from(wait_with_timeout(child, Duration::from_secs(120)));
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert_eq!(status_of(&run, "victim"), "failed (allowed)");
    assert!(
        run.job_lines("victim")
            .iter()
            .any(|l| l.contains("system failure") && l.contains("went away")),
        "{}",
        run.explain()
    );
    assert_eq!(status_of(&run, "after"), "success");
    assert!(
        run.job_lines("after")
            .contains(&"ran after the crash".to_string()),
        "{}",
        run.explain()
    );
    // The restarted plugin cleaned up the victim's sandbox too (its state names the dir).
    assert_nothing_left(&w, &run);
}

fn walk_has(dir: &Path, name: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            let p = e.path();
            e.file_name() == name || (p.is_dir() && walk_has(&p, name))
        })
    })
}

#[test]
fn a_plugin_that_never_answers_prepare_fails_the_job_within_prepare_timeout() {
    let w = World::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/hanging_executor.py");
    let plugins = install_plugin(
        &w,
        "hanging",
        &script,
        &[MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE],
    );
    let cfg = w.write(
        "config.toml",
        r#"
concurrent = 1
[[runners]]
  name = "stuck"
  executor = "plugin"
  [runners.plugin]
    name = "hanging"
    prepare_timeout = "2s"
"#,
    );
    let pipeline = w.write(
        "pipeline.yml",
        "stages: [test]\nnever:\n  stage: test\n  script:\n    - echo never printed\n",
    );
    let run = exec(&w, &plugins, &cfg, &pipeline);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    assert_eq!(status_of(&run, "never"), "failed");
    assert!(
        run.job_lines("never")
            .iter()
            .any(|l| l.contains("did not answer Prepare within 2s")),
        "{}",
        run.explain()
    );
    assert!(!run.stdout.contains("never printed"), "{}", run.explain());
    assert!(w.processes().is_empty(), "{:?}", w.processes());
}

#[test]
fn verify_config_runs_init_dry_run_and_names_the_bad_key() {
    let w = World::new();
    let plugins = bubblewrap(&w);
    let good = config(&w, "");
    let verify = |cfg: &Path| {
        let child = w
            .slipway(&["verify-config", "-c", cfg.to_str().unwrap()])
            .env("SLIPWAY_PLUGIN_DIR", &plugins)
            .spawn()
            .unwrap();
        Run::from(wait_with_timeout(child, Duration::from_secs(60)))
    };
    let run = verify(&good);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    // A dry run allocates nothing.
    assert!(!w.path().join("sandboxes").exists(), "{}", run.explain());
    let bad = w.write(
        "bad.toml",
        &std::fs::read_to_string(&good)
            .unwrap()
            .replace("root = ", "rooot = "),
    );
    let run = verify(&bad);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    assert!(
        run.stderr.contains("runners[0].plugin")
            && run.stderr.contains("config.rooot: unknown key"),
        "{}",
        run.explain()
    );
    // Said once, not once per layer of the error.
    assert_eq!(
        run.stderr.matches("config.rooot: unknown key").count(),
        1,
        "{}",
        run.explain()
    );
    let missing = w.write(
        "missing.toml",
        &std::fs::read_to_string(&good)
            .unwrap()
            .replace("name = \"bubblewrap\"", "name = \"nosuch\""),
    );
    let run = verify(&missing);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    assert!(
        run.stderr.contains("executor-plugin-nosuch"),
        "{}",
        run.explain()
    );
    assert!(w.processes().is_empty(), "{:?}", w.processes());
}

#[test]
fn canceling_a_pipeline_stops_the_sandboxed_job_and_cleans_it_up() {
    let w = World::new();
    let plugins = bubblewrap(&w);
    let cfg = config(&w, "");
    let pipeline = w.write(
        "pipeline.yml",
        r#"
stages: [test]
long:
  stage: test
  script:
    - touch started-marker
    - sleep 120 &
    - wait
"#,
    );
    let child = spawn_exec(&w, &plugins, &cfg, &pipeline);
    wait_for_marker(&w);
    common::signal(child.id(), "INT");
    let run = Run::from(wait_with_timeout(child, Duration::from_secs(60)));
    assert_ne!(run.code, Some(0), "{}", run.explain());
    assert_eq!(status_of(&run, "long"), "canceled", "{}", run.explain());
    // The sandbox (and the background sleep in it) went with the canceled Run call.
    let root = w.path().join("sandboxes");
    let in_sandbox: Vec<String> = processes_matching("sleep 120")
        .into_iter()
        .filter(|p| {
            let pid = p.split_whitespace().next().unwrap_or_default();
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(&root))
        })
        .collect();
    assert!(in_sandbox.is_empty(), "{in_sandbox:?}");
    assert_nothing_left(&w, &run);
}

#[test]
fn an_instance_placed_plugin_runs_each_job_on_its_autoscaled_instance() {
    let w = World::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/ssh_executor.py");
    let plugins = install_plugin(&w, "ssh", &script, &[MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE]);
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
[[runners]]
  name = "remote"
  executor = "plugin"
  [runners.plugin]
    name = "ssh"
{}"#,
            common::local_autoscaler(&w, "ssh-exec")
        ),
    );
    let pipeline = w.write(
        "pipeline.yml",
        r#"
stages: [build, test]
build:
  stage: build
  script:
    - echo "over ssh from ${SSH_CONNECTION%% *}"
    - mkdir -p out && echo "built on the instance" > out/result.txt
  artifacts:
    paths: [out/]
check:
  stage: test
  script:
    - cat out/result.txt
"#,
    );
    let run = exec(&w, &plugins, &cfg, &pipeline);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let build = run.job_lines("build");
    assert!(
        build
            .iter()
            .any(|l| l.starts_with("Using ssh executor plugin on instance ")),
        "{}",
        run.explain()
    );
    // sshd set SSH_CONNECTION: the script ran in an SSH session on the instance.
    assert!(
        build
            .iter()
            .any(|l| l.starts_with("over ssh from ") && l.len() > "over ssh from ".len()),
        "{}",
        run.explain()
    );
    assert!(
        run.job_lines("check")
            .contains(&"built on the instance".to_string()),
        "{}",
        run.explain()
    );
    let rows = run.summary();
    assert!(
        rows.iter()
            .all(|r| r.instance != "localhost" && !r.instance.is_empty()),
        "{rows:?}"
    );
    // Cleanup removed each job's directory on the instance (local instances share this /tmp).
    let left: Vec<_> = std::fs::read_dir("/tmp/ssh-executor")
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    assert!(w.processes().is_empty(), "{:?}", w.processes());
}

#[test]
fn a_local_plugin_on_an_autoscaled_runner_is_refused_naming_both() {
    let w = World::new();
    let plugins = bubblewrap(&w);
    let cfg = w.write(
        "config.toml",
        &format!(
            "concurrent = 1\n[[runners]]\n  name = \"mixed\"\n  executor = \"plugin\"\n  [runners.plugin]\n    name = \"bubblewrap\"\n{}",
            common::local_autoscaler(&w, "mixed")
        ),
    );
    let pipeline = w.write(
        "pipeline.yml",
        "stages: [test]\nnever:\n  stage: test\n  script:\n    - echo never printed\n",
    );
    let run = exec(&w, &plugins, &cfg, &pipeline);
    assert_ne!(run.code, Some(0), "{}", run.explain());
    assert!(
        run.stderr.contains("runs jobs on the manager's machine (PLACEMENT_LOCAL), but the runner has a [runners.autoscaler] section"),
        "{}",
        run.explain()
    );
    assert!(w.processes().is_empty(), "{:?}", w.processes());
}
