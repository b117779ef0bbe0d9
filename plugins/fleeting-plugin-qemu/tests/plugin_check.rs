//! `slipway plugin check` passes on the QEMU plugin: a real VM booted (TCG here), a real SSH
//! login into it (`--connect`), the plugin killed mid-way finding its VM again, and no QEMU
//! left after the check.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

#[tokio::test(flavor = "multi_thread")]
async fn plugin_check_passes_with_a_real_vm_and_login() {
    let image = common::sshd_image();
    let dir = tempfile::Builder::new()
        .prefix("slw-qemu-check")
        .tempdir()
        .unwrap();
    let config = dir.path().join("plugin_config.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "dir": dir.path().join("state"),
            "name": "check",
            "image": image,
            "max_size": 1,
            "memory": "384M",
        })
        .to_string(),
    )
    .unwrap();
    let plugin = PathBuf::from(env!("CARGO_BIN_EXE_fleeting-plugin-qemu"));
    let run = tokio::task::spawn_blocking(move || {
        slipway_testkit::plugin_check::plugin_check(
            &plugin,
            &config,
            &["--connect", "--timeout", "20m"],
            &[],
        )
    })
    .await
    .unwrap()
    .unwrap();
    let state = dir.path().display().to_string();
    let left: Vec<(i32, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let c = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&c).replace('\0', " ")))
        })
        .filter(|(_, c)| c.contains(&state))
        .collect();
    for (pid, _) in &left {
        // Not left behind by the test either.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(left.is_empty(), "left running: {left:?}");
    assert_eq!(run.code, Some(0), "{:?}\n{}", run.failures(), run.explain());
    for check in [
        "increase",
        "connect-info",
        "ssh",
        "heartbeat",
        "restart",
        "decrease",
    ] {
        assert_eq!(run.result(check), "pass", "{check}: {}", run.explain());
    }
    let vms: Vec<_> = std::fs::read_dir(dir.path().join("state/instances"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(vms.is_empty(), "instance dirs left: {vms:?}");
}
