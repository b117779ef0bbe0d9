//! `slipway run`: the manager keeps idle capacity with a real plugin and cleans up on SIGTERM.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{World, stop_manager};

#[test]
fn run_keeps_idle_capacity_and_removes_it_on_sigterm() {
    let w = World::new();
    let state = w.path().join("plugin-state");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let cfg = w.write(
        "config.toml",
        &format!(
            r#"
concurrent = 2
listen_address = "127.0.0.1:{port}"
[[runners]]
  name = "idle"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_instances = 3
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{}"
      name = "idle{}"
    [[runners.autoscaler.policy]]
      idle_count = 2
      idle_time = "10m"
"#,
            state.display(),
            std::process::id(),
            port = port,
        ),
    );
    let child = w
        .slipway(&["run", "-c", cfg.to_str().expect("cfg")])
        .spawn()
        .expect("spawn");

    // idle_count = 2 slots of capacity 1: two sshd instances come up with no job at all.
    let deadline = Instant::now() + Duration::from_secs(60);
    // Instances, not processes: sshd forks a child per connection (health checks).
    let sshd = || common::live_sshd_instances(&w).len();
    while sshd() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        sshd(),
        2,
        "expected exactly two idle instances: {:?}",
        w.processes()
    );

    // /metrics tells the same story.
    let body = http_get(port, "/metrics");
    let line = |name: &str, needle: &str| -> String {
        body.lines()
            .find(|l| l.starts_with(name) && l.contains(needle))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no {name} {needle} in:\n{body}"))
    };
    let running = line("slipway_taskscaler_instances{", "state=\"running\"");
    assert!(running.ends_with(" 2"), "{running}");
    assert!(running.contains("runner=\"idle\""), "{running}");
    let ups = line("slipway_taskscaler_scale_ups_total{", "cause=\"demand\"");
    assert!(ups.ends_with(" 2"), "{ups}");
    let idle = line("slipway_taskscaler_slots{", "kind=\"idle\"");
    assert!(idle.ends_with(" 2"), "{idle}");
    assert!(http_get(port, "/healthz").contains("ok"));

    stop_manager(&w, child);
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut out = String::new();
    conn.read_to_string(&mut out).expect("read");
    out
}

#[test]
fn edited_policies_apply_without_a_restart() {
    let w = World::new();
    let state = w.path().join("plugin-state");
    let text = |idle: u32| {
        format!(
            r#"
[[runners]]
  name = "reload"
  executor = "instance"
  [runners.autoscaler]
    plugin = "local"
    capacity_per_instance = 1
    max_instances = 4
    update_interval = "200ms"
    update_interval_when_expecting = "100ms"
    delete_instances_on_shutdown = true
    [runners.autoscaler.plugin_config]
      dir = "{}"
      name = "reload{}"
    [[runners.autoscaler.policy]]
      idle_count = {idle}
      idle_time = "10m"
"#,
            state.display(),
            std::process::id()
        )
    };
    let cfg = w.write("config.toml", &text(1));
    let child = w
        .slipway(&["run", "-c", cfg.to_str().expect("cfg")])
        .spawn()
        .expect("spawn");
    // Instances, not processes: sshd forks a child per connection (health checks).
    let sshd = || common::live_sshd_instances(&w).len();
    // The count that ended the wait: a second look at /proc can catch an sshd mid-fork (a
    // health check's connection) and miss a listener for a moment.
    let wait_for = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen = sshd();
            if seen == n || Instant::now() >= deadline {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert_eq!(wait_for(1), 1, "{:?}", w.processes());
    // The operator raises idle_count in config.toml: the running manager follows.
    std::fs::write(&cfg, text(3)).expect("edit config");
    assert_eq!(wait_for(3), 3, "{:?}", w.processes());

    stop_manager(&w, child);
}
