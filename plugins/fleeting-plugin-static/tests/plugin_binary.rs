//! The real `fleeting-plugin-static` binary driven through the manager's plugin host
//! (handshake, AutoMTLS, gRPC, restart after a kill) against real sshd hosts.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Hosts, ssh, state_of, wait_for};
use slipway_fleeting::host::PluginOptions;
use slipway_fleeting::{ConnectorConfig, InstanceGroup, PluginHost, State};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_binary_leases_survives_a_kill_and_cleans() {
    let hx = Hosts::start(2).await;
    let config = hx.config(
        &[0, 1],
        r#","cleanup_command":"rm -f dirty; echo ok > cleaned""#,
    );
    let opts = PluginOptions::new("static", env!("CARGO_BIN_EXE_fleeting-plugin-static"))
        .handshake_timeout(Duration::from_secs(20))
        .plugin_config(config)
        .connector(ConnectorConfig::default());
    let host = PluginHost::start(opts).await.unwrap();
    let info = host.init_from_options().await.unwrap();
    assert_eq!((info.id.as_str(), info.max_size), ("static/t", 2));
    assert_eq!(host.increase(1).await.unwrap(), 1);
    assert_eq!(
        host.update().await.unwrap(),
        vec![("web0-1".to_owned(), State::Running)]
    );
    let ci = host.connect_info("web0-1").await.unwrap();
    assert_eq!(ci.internal_addr, hx.hosts[0].addr);
    let out = ssh(&ci, "echo job > dirty; echo $HOME").await;
    assert_eq!(out.trim(), hx.hosts[0].home.display().to_string());
    host.heartbeat("web0-1").await.unwrap();

    // Kill the plugin: the host restarts and re-inits it, and the lease is still there.
    let pid = host.pid().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        match host.update().await {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "plugin did not come back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(s, vec![("web0-1".to_owned(), State::Running)]);
    assert!(host.restarts() >= 1);
    assert_ne!(host.pid(), Some(pid));

    // Decrease cleans the host over SSH, then it is free again under a new id.
    assert_eq!(host.decrease(&["web0-1".into()]).await.unwrap(), ["web0-1"]);
    wait_for(&host, "web0-1 cleaned", |s| state_of(s, "web0-1").is_none()).await;
    assert!(!hx.hosts[0].home.join("dirty").exists());
    assert!(hx.hosts[0].home.join("cleaned").exists());
    assert_eq!(host.increase(2).await.unwrap(), 2);
    let ids: Vec<String> = host
        .update()
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["web0-2", "web1-3"]);

    let last = host.pid().unwrap();
    host.shutdown().await.unwrap();
    host.stop().await;
    assert!(
        !Path::new(&format!("/proc/{last}")).exists(),
        "plugin {last} left running"
    );
}
