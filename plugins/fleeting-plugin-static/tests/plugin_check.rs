//! `slipway plugin check` passes on the static plugin over sshd hosts in network namespaces,
//! with a real SSH login (`--connect`), as CI checks every plugin we ship.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::Hosts;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_check_passes_with_a_real_login_and_cleanup() {
    let hx = Hosts::start(2).await;
    let config = hx.path("plugin_config.json");
    std::fs::write(
        &config,
        hx.config(&[0, 1], r#","cleanup_command":"echo cleaned > cleaned""#),
    )
    .unwrap();
    let plugin = Path::new(env!("CARGO_BIN_EXE_fleeting-plugin-static")).to_path_buf();
    let run = tokio::task::spawn_blocking(move || {
        slipway_testkit::plugin_check::plugin_check(&plugin, &config, &["--connect"], &[])
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(run.code, Some(0), "{:?}\n{}", run.failures(), run.explain());
    assert_eq!(run.report["passed"], true, "{}", run.explain());
    for check in [
        "handshake",
        "init",
        "increase",
        "ssh",
        "restart",
        "decrease",
        "shutdown",
    ] {
        assert_eq!(run.result(check), "pass", "{check}: {}", run.explain());
    }
    // The checker's Decrease gave the host back after running the cleanup command on it.
    let cleaned = hx
        .hosts
        .iter()
        .filter(|h| h.home.join("cleaned").exists())
        .count();
    assert_eq!(cleaned, 1, "one host leased and cleaned: {}", run.explain());
}
