//! `slipway plugin check` run as a user runs it: the real binary against real plugins —
//! `fleeting-plugin-local` (sshd hosts, with a real SSH login), the Python test plugin (a
//! go-plugin port from PyPI), and that Python plugin without its state file, which loses its
//! instances on a restart and must fail the `restart` row.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Run, World, wait_with_timeout};
use slipway_fleeting::{MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE};
use slipway_testkit::python;

const CHECKS: [&str; 12] = [
    "handshake",
    "cookie",
    "init-bad-config",
    "init",
    "increase",
    "connect-info",
    "ssh",
    "heartbeat",
    "restart",
    "unknown-ids",
    "decrease",
    "shutdown",
];

/// `local`'s plugin_config, state under the world's directory, a group name of its own.
fn local_config(w: &World, name: &str, extra: &str) -> PathBuf {
    let dir = w.path().join("plugin");
    w.write(
        "plugin_config.json",
        &format!(
            r#"{{"dir":"{}","name":"{name}{}"{extra}}}"#,
            dir.display(),
            std::process::id()
        ),
    )
}

/// The table row of `check`: (result, detail).
fn row<'a>(run: &'a Run, check: &str) -> (&'a str, &'a str) {
    let line = run
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(check))
        .unwrap_or_else(|| panic!("no {check} row\n{}", run.explain()));
    let rest = line[check.len()..].trim_start();
    let (result, detail) = rest.split_once(' ').unwrap_or((rest, ""));
    (result, detail.trim())
}

/// Instance directories `local` still has.
fn instances_left(w: &World) -> Vec<String> {
    std::fs::read_dir(w.path().join("plugin/instances"))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn local_plugin_passes_every_check_with_a_real_ssh_login() {
    let w = World::new();
    let cfg = local_config(&w, "pc", "");
    let cfg = cfg.to_str().unwrap();
    let run = w.run(&["plugin", "check", "local", "-c", cfg, "--connect"]);
    println!("{}", run.stdout);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    for check in CHECKS {
        assert_eq!(row(&run, check).0, "pass", "{check}\n{}", run.explain());
    }
    assert!(
        row(&run, "ssh").1.contains("printed it back"),
        "{}",
        run.stdout
    );
    assert!(
        row(&run, "increase").1.contains("timeout 5m0s"),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stdout.lines().last(),
        Some("plugin check: 12 passed, 0 failed, 0 skipped")
    );
    // Progress went to stderr while it ran.
    assert!(run.stderr.contains("waiting up to 5m0s"), "{}", run.stderr);
    // Nothing left: no instance, no sshd, no plugin.
    assert_eq!(instances_left(&w), Vec::<String>::new());
    assert_eq!(w.processes(), Vec::<String>::new());
}

#[test]
fn ctrl_c_while_an_instance_boots_cleans_it_up() {
    let w = World::new();
    // A slow "boot": the instance stays `creating` long enough to interrupt the wait.
    let cfg = local_config(
        &w,
        "pi",
        r#","network":"loopback","provisioning_delay":"20s""#,
    );
    let mut child = w
        .slipway(&["plugin", "check", "local", "-c", cfg.to_str().unwrap()])
        .spawn()
        .unwrap();
    // Keep reading stderr to the end in a thread; tell the test when the wait began.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut seen = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("waiting up to") {
                let _ = tx.send(());
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        seen
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the check reached the wait for the instance");
    assert_eq!(instances_left(&w).len(), 1, "an instance is being created");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let mut run = Run::from(wait_with_timeout(child, Duration::from_secs(120)));
    run.stderr = reader.join().unwrap();
    assert_eq!(run.code, Some(1), "{}", run.explain());
    let (result, detail) = row(&run, "increase");
    assert_eq!(result, "fail", "{}", run.stdout);
    assert!(detail.contains("interrupted"), "{}", run.stdout);
    assert_eq!(
        instances_left(&w),
        Vec::<String>::new(),
        "{}",
        run.explain()
    );
    assert_eq!(w.processes(), Vec::<String>::new());
}

#[test]
fn unreadable_config_file_is_a_usage_error_naming_it() {
    let w = World::new();
    let missing = w.path().join("nope.json");
    let run = w.run(&["plugin", "check", "local", "-c", missing.to_str().unwrap()]);
    assert_eq!(run.code, Some(2), "{}", run.explain());
    assert!(
        run.stderr.contains(&*missing.to_string_lossy()),
        "{}",
        run.stderr
    );
    let bad = w.write("connector.json", r#"{"username":"u","pasword":"x"}"#);
    let run = w.run(&[
        "plugin",
        "check",
        "local",
        "--connector",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(2), "{}", run.explain());
    assert!(run.stderr.contains("pasword"), "{}", run.stderr);
}

// ---- the Python plugin ------------------------------------------------------------------------

/// A `fleeting-plugin-python` wrapper script in `dir` (with grpclib stubs generated beside it).
fn python_plugin(dir: &Path) -> PathBuf {
    let python = python::python().unwrap();
    let stubs = dir.join("stubs");
    python::generate_stubs(&python, "fleeting/v1/fleeting.proto", &stubs).unwrap();
    let plugin_py =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fleeting/tests/python/fleeting_plugin.py");
    python::wrapper(
        dir,
        "fleeting-plugin-python",
        &python,
        &stubs,
        &plugin_py,
        &[MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE],
    )
    .unwrap()
}

/// The Python plugin hands out the connector it was given: give it credentials.
fn python_connector(w: &World) -> PathBuf {
    w.write(
        "connector.json",
        r#"{"os":"linux","protocol":"ssh","protocol_port":22,"username":"runner","password":"s3cret","timeout":"10s"}"#,
    )
}

fn json_checks(run: &Run) -> (serde_json::Value, Vec<(String, String, String)>) {
    let v: serde_json::Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("--json output is one JSON object ({e})\n{}", run.explain()));
    let checks = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["result"].as_str().unwrap().to_owned(),
                c["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (v, checks)
}

#[test]
fn python_plugin_with_a_state_file_passes() {
    let w = World::new();
    let wrapper = python_plugin(w.path());
    let state = w.path().join("python-state.json");
    let cfg = w.write(
        "plugin_config.json",
        &format!(r#"{{"max_size":3,"state_file":"{}"}}"#, state.display()),
    );
    let connector = python_connector(&w);
    let run = w.run(&[
        "plugin",
        "check",
        wrapper.to_str().unwrap(),
        "-c",
        cfg.to_str().unwrap(),
        "--connector",
        connector.to_str().unwrap(),
        "--timeout",
        "90s",
        "--json",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let (v, checks) = json_checks(&run);
    assert_eq!(v["plugin"], wrapper.to_str().unwrap());
    assert_eq!(v["passed"], true);
    assert_eq!(v["timeout_secs"], 90);
    let names: Vec<&str> = checks.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, CHECKS);
    for (name, result, detail) in &checks {
        // No --connect: the SSH login is skipped, and says how to ask for it.
        let want = if name == "ssh" { "skip" } else { "pass" };
        assert_eq!(result, want, "{name}: {detail}\n{}", run.explain());
    }
    // The password never reaches the output.
    assert!(!run.stdout.contains("s3cret") && !run.stderr.contains("s3cret"));
    assert_eq!(w.processes(), Vec::<String>::new());
}

#[test]
fn python_plugin_that_forgets_its_instances_fails_the_restart_row() {
    let w = World::new();
    let wrapper = python_plugin(w.path());
    // No state_file: instances live in memory only and die with the process.
    let cfg = w.write("plugin_config.json", r#"{"max_size":3}"#);
    let connector = python_connector(&w);
    let run = w.run(&[
        "plugin",
        "check",
        wrapper.to_str().unwrap(),
        "-c",
        cfg.to_str().unwrap(),
        "--connector",
        connector.to_str().unwrap(),
        "--timeout",
        "60s",
    ]);
    println!("{}", run.stdout);
    assert_eq!(run.code, Some(1), "{}", run.explain());
    let (result, detail) = row(&run, "restart");
    assert_eq!(result, "fail", "{}", run.stdout);
    assert!(detail.contains("lost its instances"), "{}", run.stdout);
    for check in ["handshake", "cookie", "init-bad-config", "init", "increase"] {
        assert_eq!(row(&run, check).0, "pass", "{check}\n{}", run.stdout);
    }
    assert!(
        run.stdout
            .lines()
            .last()
            .is_some_and(|l| l.contains(" 1 failed")),
        "{}",
        run.stdout
    );
    assert_eq!(w.processes(), Vec::<String>::new());
}
