//! Real-process tests of the plugin host against the Rust SDK.
//!
//! This binary has its own `main` (harness = false): started with `SLIPWAY_TEST_PLUGIN=memory` it
//! *is* the in-memory test plugin, served through `sdk::run_plugin`; otherwise it runs the tests,
//! starting itself (`std::env::current_exe()`) as the plugin.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use async_trait::async_trait;
use slipway_fleeting::host::PluginOptions;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, PluginHost, ProviderInfo, State, sdk,
};

const PLUGIN_SELECTOR: &str = "SLIPWAY_TEST_PLUGIN";

// ---------------------------------------------------------------------------------------------
// The in-memory plugin.

#[derive(Default)]
struct Memory {
    state: Mutex<MemoryState>,
}

#[derive(Default)]
struct MemoryState {
    init: Option<(u64, ConnectorConfig)>,
    instances: BTreeMap<String, State>,
    next: u64,
}

impl Memory {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut MemoryState) -> Result<T, GroupError>,
    ) -> Result<T, GroupError> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| GroupError::Provider("poisoned".into()))?;
        if s.init.is_none() {
            return Err(GroupError::FailedPrecondition("not initialized".into()));
        }
        f(&mut s)
    }
}

#[async_trait]
impl InstanceGroup for Memory {
    async fn init(
        &self,
        plugin_config: &[u8],
        connector: &ConnectorConfig,
    ) -> Result<ProviderInfo, GroupError> {
        let cfg: serde_json::Value = serde_json::from_slice(plugin_config)
            .map_err(|e| GroupError::InvalidArgument(e.to_string()))?;
        let max_size = cfg
            .get("max_size")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(10);
        let mut s = self
            .state
            .lock()
            .map_err(|_| GroupError::Provider("poisoned".into()))?;
        if s.init.is_some() {
            return Err(GroupError::FailedPrecondition("already initialized".into()));
        }
        s.init = Some((max_size, connector.clone()));
        sdk::log(
            tracing::Level::INFO,
            "memory plugin initialized",
            &[("max_size", &max_size)],
        );
        Ok(ProviderInfo {
            id: "memory/test".into(),
            max_size,
            version: "0.1.0".into(),
            build_info: format!("pid {}", std::process::id()),
            capabilities: vec![],
        })
    }

    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        self.with(|s| Ok(s.instances.iter().map(|(k, v)| (k.clone(), *v)).collect()))
    }

    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        self.with(|s| {
            let max = s.init.as_ref().map_or(0, |(m, _)| *m);
            let room = max.saturating_sub(s.instances.len() as u64);
            let n = u64::from(delta).min(room);
            for _ in 0..n {
                s.next += 1;
                let id = format!("i-{}", s.next);
                s.instances.insert(id, State::Running);
            }
            Ok(n as u32)
        })
    }

    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        self.with(|s| {
            Ok(ids
                .iter()
                .filter(|id| s.instances.remove(*id).is_some())
                .cloned()
                .collect())
        })
    }

    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        self.with(|s| {
            if !s.instances.contains_key(id) {
                return Err(GroupError::NotFound(id.to_owned()));
            }
            Ok(ConnectInfo {
                id: id.to_owned(),
                connector: s.init.as_ref().map(|(_, c)| c.clone()).unwrap_or_default(),
                internal_addr: "127.0.0.1:22".into(),
                external_addr: String::new(),
                expires: None,
            })
        })
    }

    async fn heartbeat(&self, id: &str) -> Result<(), GroupError> {
        self.with(|s| {
            if s.instances.contains_key(id) {
                Ok(())
            } else {
                Err(GroupError::NotFound(id.to_owned()))
            }
        })
    }

    async fn shutdown(&self) -> Result<(), GroupError> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn options(name: &str) -> anyhow::Result<PluginOptions> {
    let exe = std::env::current_exe()?;
    Ok(PluginOptions::new(name, exe)
        .env(PLUGIN_SELECTOR, "memory")
        .handshake_timeout(Duration::from_secs(20))
        .plugin_config(r#"{"max_size": 5}"#)
        .connector(ConnectorConfig {
            os: "linux".into(),
            protocol: "ssh".into(),
            protocol_port: 22,
            username: "runner".into(),
            password: "hunter2".into(),
            key: b"KEY".to_vec(),
            keepalive: Duration::from_secs(30),
            ..Default::default()
        }))
}

/// Running (not reaped, not a zombie) process?
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

async fn wait_until(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests.

async fn every_rpc_over_automtls() -> anyhow::Result<()> {
    let host = PluginHost::start(options("memory")?).await?;
    let pid = host.pid().context("no pid")?;
    ensure!(alive(pid));
    ensure!(
        matches!(host.update().await, Err(GroupError::FailedPrecondition(_))),
        "update before init"
    );

    let info = host.init_from_options().await?;
    ensure!(info.id == "memory/test" && info.max_size == 5, "{info:?}");
    ensure!(host.update().await?.is_empty());
    ensure!(host.increase(3).await? == 3);
    ensure!(host.increase(10).await? == 2, "capped by max_size");
    let list = host.update().await?;
    ensure!(
        list.len() == 5 && list.iter().all(|(_, s)| *s == State::Running),
        "{list:?}"
    );

    let ci = host.connect_info("i-1").await?;
    ensure!(ci.id == "i-1" && ci.internal_addr == "127.0.0.1:22");
    ensure!(
        ci.connector.password == "hunter2" && ci.connector.key == b"KEY",
        "credentials round trip"
    );
    ensure!(ci.connector.keepalive == Duration::from_secs(30) && ci.connector.protocol_port == 22);
    match host.connect_info("nope").await {
        Err(GroupError::NotFound(id)) => ensure!(id == "nope"),
        other => bail!("expected NotFound, got {other:?}"),
    }
    host.heartbeat("i-2").await?;
    ensure!(matches!(
        host.heartbeat("nope").await,
        Err(GroupError::NotFound(_))
    ));
    let gone = host.decrease(&["i-1".into(), "nope".into()]).await?;
    ensure!(gone == vec!["i-1".to_owned()], "{gone:?}");
    ensure!(matches!(
        host.init(b"not json", &ConnectorConfig::default()).await,
        Err(GroupError::InvalidArgument(_))
    ));
    ensure!(matches!(
        host.init(b"{}", &ConnectorConfig::default()).await,
        Err(GroupError::FailedPrecondition(_))
    ));
    host.shutdown().await?;

    host.stop().await;
    ensure!(
        !exists(pid),
        "plugin process {pid} still exists after stop()"
    );
    ensure!(host.pid().is_none());
    ensure!(matches!(
        host.update().await,
        Err(GroupError::Unavailable { .. })
    ));
    Ok(())
}

async fn plaintext_when_automtls_is_off() -> anyhow::Result<()> {
    let host = PluginHost::start(options("memory-plain")?.auto_mtls(false)).await?;
    host.init_from_options().await?;
    ensure!(host.increase(1).await? == 1);
    let pid = host.pid().context("no pid")?;
    host.stop().await;
    ensure!(!exists(pid));
    Ok(())
}

async fn restarts_and_reinits_after_sigkill() -> anyhow::Result<()> {
    let host = PluginHost::start(options("memory-crash")?).await?;
    host.init_from_options().await?;
    ensure!(host.increase(2).await? == 2);
    let pid = host.pid().context("no pid")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;

    // Either waits for the restart or fails on the dead transport and is retried once.
    let started = Instant::now();
    let list = host.update().await.context("update after SIGKILL")?;
    ensure!(list.is_empty(), "a fresh process starts empty: {list:?}");
    ensure!(started.elapsed() < Duration::from_secs(15));
    ensure!(host.restarts() == 1, "restarts = {}", host.restarts());
    let new_pid = host.pid().context("no pid after restart")?;
    ensure!(new_pid != pid);
    ensure!(!exists(pid), "old process was reaped");
    // Re-init happened: the plugin accepts work and refuses a second init.
    ensure!(host.increase(1).await? == 1);
    ensure!(matches!(
        host.init_from_options().await,
        Err(GroupError::FailedPrecondition(_))
    ));

    // Kill again while a call is about to be made: it waits for the restart.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    host.heartbeat("nope")
        .await
        .err()
        .context("heartbeat of a missing instance must fail")?;
    wait_until("second restart", Duration::from_secs(10), || {
        host.restarts() == 2
    })
    .await?;
    ensure!(host.update().await?.is_empty());

    let last = host.pid().context("no pid")?;
    host.stop().await;
    ensure!(!exists(last));
    Ok(())
}

async fn gives_up_after_max_restarts() -> anyhow::Result<()> {
    let host = PluginHost::start(options("memory-fragile")?.max_restarts(0)).await?;
    host.init_from_options().await?;
    let pid = host.pid().context("no pid")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    wait_until("the host to notice", Duration::from_secs(5), || {
        host.pid().is_none()
    })
    .await?;
    match host.update().await {
        Err(e @ GroupError::Unavailable { .. }) => {
            let msg = e.to_string();
            ensure!(
                msg.contains("memory-fragile") && msg.contains("gave up"),
                "{msg}"
            );
        }
        other => bail!("expected Unavailable, got {other:?}"),
    }
    host.stop().await;
    Ok(())
}

async fn drop_kills_the_process_group() -> anyhow::Result<()> {
    let host = PluginHost::start(options("memory-dropped")?).await?;
    let pid = host.pid().context("no pid")?;
    drop(host);
    wait_until("the dropped plugin to die", Duration::from_secs(5), || {
        !alive(pid)
    })
    .await
}

async fn refuses_to_run_without_cookie() -> anyhow::Result<()> {
    let out = tokio::process::Command::new(std::env::current_exe()?)
        .env(PLUGIN_SELECTOR, "memory")
        .env_remove(slipway_fleeting::MAGIC_COOKIE_KEY)
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(1), "status {:?}", out.status);
    ensure!(
        stderr.contains("Slipway fleeting plugin")
            && stderr.contains("not meant to be run directly"),
        "{stderr}"
    );
    ensure!(out.stdout.is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Minimal runner.

type TestFn = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>>>>;

macro_rules! tests {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), (|| Box::pin($name())) as TestFn)),*]
    };
}

fn main() -> ExitCode {
    if std::env::var(PLUGIN_SELECTOR).as_deref() == Ok("memory") {
        return sdk::run_plugin(Memory::default());
    }
    let tests: &[(&str, TestFn)] = tests![
        every_rpc_over_automtls,
        plaintext_when_automtls_is_off,
        restarts_and_reinits_after_sigkill,
        gives_up_after_max_restarts,
        drop_kills_the_process_group,
        refuses_to_run_without_cookie,
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    // None of these tests is ignored: `--ignored` (as nextest asks) selects nothing.
    let only_ignored = args.iter().any(|a| a == "--ignored");
    if args.iter().any(|a| a == "--list") {
        for (name, _) in tests.iter().filter(|_| !only_ignored) {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let _ = tracing_subscriber_init();
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, test) in tests.iter().filter(|_| !only_ignored) {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let started = Instant::now();
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("cannot build runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        let result =
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), test()).await });
        rt.shutdown_timeout(Duration::from_secs(2));
        match result {
            Ok(Ok(())) => println!("test {name} ... ok ({:.1?})", started.elapsed()),
            Ok(Err(e)) => {
                println!("test {name} ... FAILED: {e:#}");
                failed.push(*name);
            }
            Err(_) => {
                println!("test {name} ... FAILED: timed out");
                failed.push(*name);
            }
        }
    }
    println!("\n{ran} tests, {} failed {failed:?}", failed.len());
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Print host-side events (plugin logs included) when RUST_LOG is set.
fn tracing_subscriber_init() -> Option<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().ok()?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init()
        .ok()
}
