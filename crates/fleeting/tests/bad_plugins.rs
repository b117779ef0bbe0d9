//! The host against misbehaving plugins (shell scripts) and plugin lookup.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use slipway_fleeting::PluginHost;
use slipway_fleeting::host::{HostError, PluginOptions, find_plugin};

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn read_pid(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

async fn start_err(opts: PluginOptions) -> HostError {
    match PluginHost::start(opts).await {
        Ok(h) => {
            h.stop().await;
            panic!("plugin unexpectedly started");
        }
        Err(e) => e,
    }
}

#[tokio::test]
async fn garbage_handshake_names_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let path = script(
        dir.path(),
        "garbage",
        "echo $$ > \"$PIDFILE\"; echo garbage; exec sleep 30",
    );
    let started = Instant::now();
    let opts = PluginOptions::new("local", &path)
        .handshake_timeout(Duration::from_secs(5))
        .env("PIDFILE", pidfile.to_str().unwrap());
    let err = start_err(opts).await.to_string();
    assert_eq!(
        err,
        format!(
            "plugin \"local\" ({}): handshake line \"garbage\" is not CORE|APP|NETWORK|ADDR|PROTOCOL",
            path.display()
        )
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!exists(read_pid(&pidfile)), "process killed and reaped");
}

#[tokio::test]
async fn silent_plugin_times_out_and_its_group_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // The sleep is a grandchild in the plugin's process group: it must die too.
    let path = script(
        dir.path(),
        "silent",
        "sleep 30 & echo $! > \"$PIDFILE\"; echo $$ >> \"$PIDFILE\"; wait",
    );
    let started = Instant::now();
    let opts = PluginOptions::new("x", &path)
        .handshake_timeout(Duration::from_secs(2))
        .env("PIDFILE", pidfile.to_str().unwrap());
    let err = start_err(opts).await.to_string();
    assert_eq!(err, "plugin \"x\": no handshake within 2s");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    let pids: Vec<u32> = std::fs::read_to_string(&pidfile)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    let deadline = Instant::now() + Duration::from_secs(2);
    // The grandchild is reaped by init once killed; give it a moment.
    while pids.iter().any(|p| exists(*p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for pid in pids {
        assert!(!exists(pid), "process {pid} survived");
    }
}

#[tokio::test]
async fn early_exit_reports_status_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        "dies",
        "echo 'bad config: region missing' >&2; exit 3",
    );
    let err = start_err(PluginOptions::new("x", &path)).await.to_string();
    assert_eq!(
        err,
        "plugin \"x\" exited with status 3 before its handshake; stderr: bad config: region missing"
    );
}

#[tokio::test]
async fn netrpc_and_wrong_versions_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    for (line, want) in [
        ("1|1|unix|/tmp/nope", "\"netrpc\" is not supported"),
        ("1|9|unix|/tmp/nope|grpc", "app protocol version \"9\""),
        ("2|1|unix|/tmp/nope|grpc", "core protocol version \"2\""),
        ("1|1|pipe|/tmp/nope|grpc", "network \"pipe\""),
    ] {
        let path = script(dir.path(), "p", &format!("echo '{line}'; exec sleep 30"));
        let err = start_err(PluginOptions::new("x", &path)).await.to_string();
        assert!(
            err.starts_with("plugin \"x\" (") && err.contains(want),
            "{line}: {err}"
        );
    }
}

#[tokio::test]
async fn unreachable_address_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        "p",
        "echo '1|1|unix|/nonexistent/sock|grpc|'; exec sleep 30",
    );
    let err = start_err(PluginOptions::new("x", &path)).await.to_string();
    assert!(
        err.starts_with("plugin \"x\": connecting to unix /nonexistent/sock"),
        "{err}"
    );
}

#[test]
fn find_plugin_search_order_and_error() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = script(dir.path(), "fleeting-plugin-foo", "exit 0");
    assert_eq!(find_plugin("foo", Some(dir.path())).unwrap(), plugin);
    assert_eq!(
        find_plugin("fleeting-plugin-foo", Some(dir.path())).unwrap(),
        plugin
    );
    assert_eq!(find_plugin(plugin.to_str().unwrap(), None).unwrap(), plugin);

    // Not executable: skipped.
    std::fs::write(dir.path().join("fleeting-plugin-noexec"), "").unwrap();
    let err = find_plugin("noexec", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("plugin \"noexec\" not found; looked in: "),
        "{err}"
    );
    assert!(
        err.contains(
            &dir.path()
                .join("fleeting-plugin-noexec")
                .display()
                .to_string()
        ),
        "{err}"
    );
    let exe_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(
        err.contains(&exe_dir.join("fleeting-plugin-noexec").display().to_string()),
        "{err}"
    );

    let err = find_plugin("./missing/plugin", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("./missing/plugin"), "{err}");
}
