//! The Python example plugin of `docs/writing-a-plugin.md`
//! (`examples/plugins/python/fleeting-plugin-example`), installed the way the guide says (the
//! script plus its generated stubs in a plugin directory) and driven through the real
//! [`PluginHost`]: handshake with AutoMTLS, every RPC, a SIGKILL and restart, deletion out of band.
//! A second test keeps the guide and the file identical and the script under 100 lines.
//!
//! Not skipped when Python packages are missing: setup installs them, or the test fails saying why.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slipway_fleeting::host::{PluginOptions, find_plugin};
use slipway_fleeting::{
    ConnectorConfig, GroupError, InstanceGroup, MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE, PluginHost,
    State,
};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn example_script() -> PathBuf {
    repo_root().join("examples/plugins/python/fleeting-plugin-example")
}

/// Generate the grpclib stubs for fleeting/v1 into `out`, as the guide tells an author to.
fn generate_stubs(python: &Path, out: &Path) {
    slipway_testkit::python::generate_stubs(python, "fleeting/v1/fleeting.proto", out).unwrap();
    assert!(out.join("fleeting/v1/fleeting_grpc.py").exists());
}

/// The first fenced block of the guide that holds the script (it starts with its shebang).
fn script_in_guide(guide: &str) -> &str {
    let open = "```python\n#!/usr/bin/env python3\n";
    let start = guide.find(open).expect("the guide shows the script") + "```python\n".len();
    let len = guide[start..]
        .find("\n```\n")
        .expect("the script's code block is closed");
    &guide[start..=start + len]
}

#[test]
fn guide_shows_the_example_verbatim_and_it_is_under_100_lines() {
    let script = std::fs::read_to_string(example_script()).unwrap();
    let guide = std::fs::read_to_string(repo_root().join("docs/writing-a-plugin.md")).unwrap();
    assert_eq!(
        script_in_guide(&guide),
        script,
        "docs/writing-a-plugin.md must show examples/plugins/python/fleeting-plugin-example verbatim"
    );
    let lines = script.lines().count();
    assert!(
        lines < 100,
        "the example has {lines} lines; the guide promises under 100"
    );
    assert!(script.starts_with("#!/usr/bin/env python3\n"));
    let mode = std::fs::metadata(example_script())
        .unwrap()
        .permissions()
        .mode();
    assert!(
        mode & 0o111 != 0,
        "the example is executable (mode {mode:o})"
    );
    // The cookie is hard-coded in the script: it must be the one this host sets.
    assert!(script.contains(&format!(
        "(\"{MAGIC_COOKIE_KEY}\", \"{MAGIC_COOKIE_VALUE}\")"
    )));
}

/// Everything the test's tracing subscriber wrote.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Update until `done` holds for the listing (each Update moves the example's instances on).
async fn update_until(
    host: &PluginHost,
    done: impl Fn(&[(String, State)]) -> bool,
) -> Vec<(String, State)> {
    let mut last = Vec::new();
    for _ in 0..20 {
        last = host.update().await.unwrap();
        if done(&last) {
            return last;
        }
    }
    panic!("Update never reached the expected listing; last: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_plugin_serves_the_contract_and_survives_a_crash() {
    // The plugin's stderr comes back as tracing events; keep them to check what it logged.
    let logs = Logs::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("slipway_fleeting=debug,slipway_goplugin=debug")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let python = slipway_testkit::python::python().unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // Installed as the guide says: the script and its stubs side by side in a plugin directory.
    let plugin_dir = tmp.path().join("plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::copy(example_script(), plugin_dir.join("fleeting-plugin-example")).unwrap();
    generate_stubs(&python, &plugin_dir);
    let path = find_plugin("example", Some(&plugin_dir)).unwrap();
    assert_eq!(path, plugin_dir.join("fleeting-plugin-example"));

    // `#!/usr/bin/env python3` must find the interpreter that has the packages.
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let shim = bin.join("python3");
    std::fs::write(
        &shim,
        format!("#!/bin/sh\nexec '{}' \"$@\"\n", python.display()),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path_var = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let opts = PluginOptions::new("example", &path)
        .handshake_timeout(Duration::from_secs(30))
        .env("PATH", path_var)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let host = PluginHost::start(opts)
        .await
        .expect("the example plugin starts (go-plugin handshake, AutoMTLS)");
    let first_pid = host.pid().unwrap();

    let connector = ConnectorConfig {
        os: "linux".into(),
        protocol: "ssh".into(),
        username: "runner".into(),
        password: "s3cret".into(),
        use_static_credentials: true,
        timeout: Duration::from_secs(10),
        ..Default::default()
    };

    // Calls before Init are refused.
    assert!(matches!(
        host.update().await,
        Err(GroupError::FailedPrecondition(_))
    ));

    // Bad config: InvalidArgument naming the key, and Init may be retried afterwards.
    let state_dir = tmp.path().join("state");
    let dir = state_dir.to_str().unwrap();
    for (config, named) in [
        (r#"{"max_size": 2}"#.to_owned(), "`dir`"),
        (
            format!(r#"{{"dir": "{dir}", "max_size": 0}}"#),
            "`max_size`",
        ),
        (
            format!(r#"{{"dir": "{dir}", "max_size": "2"}}"#),
            "`max_size`",
        ),
        (
            format!(r#"{{"dir": "{dir}", "colour": "red"}}"#),
            "`colour`",
        ),
        ("[1, 2]".to_owned(), "plugin_config"),
        ("not json".to_owned(), "plugin_config"),
    ] {
        match host.init(config.as_bytes(), &connector).await {
            Err(GroupError::InvalidArgument(m)) => assert!(m.contains(named), "{config}: {m}"),
            other => panic!("{config}: expected InvalidArgument naming {named}, got {other:?}"),
        }
    }

    let config = format!(r#"{{"dir": "{dir}", "max_size": 2, "address": "127.0.0.1:2222"}}"#);
    let info = host.init(config.as_bytes(), &connector).await.unwrap();
    assert_eq!(info.id, format!("example/{dir}"));
    assert_eq!(info.max_size, 2);
    assert!(matches!(
        host.init(config.as_bytes(), &connector).await,
        Err(GroupError::FailedPrecondition(_))
    ));

    // Increase is capped at max_size.
    assert_eq!(host.increase(5).await.unwrap(), 2);
    assert_eq!(host.increase(1).await.unwrap(), 0);
    let first = host.update().await.unwrap();
    assert_eq!(first.len(), 2);
    assert!(
        first.iter().all(|(_, s)| *s == State::Creating),
        "{first:?}"
    );
    let list = update_until(&host, |l| l.iter().all(|(_, s)| *s == State::Running)).await;
    let mut ids: Vec<String> = list.into_iter().map(|(id, _)| id).collect();
    ids.sort();
    assert_eq!(ids.len(), 2);
    for id in &ids {
        assert!(state_dir.join("instances").join(id).is_dir(), "{id}");
    }

    let ci = host.connect_info(&ids[0]).await.unwrap();
    assert_eq!(ci.id, ids[0]);
    assert_eq!(ci.internal_addr, "127.0.0.1:2222");
    assert_eq!(ci.connector, connector);
    assert_eq!(ci.expires, None);
    host.heartbeat(&ids[0]).await.unwrap();

    // Ids the plugin does not know.
    assert!(
        matches!(host.connect_info("nope").await, Err(GroupError::NotFound(id)) if id == "nope")
    );
    assert!(matches!(host.heartbeat("nope").await, Err(GroupError::NotFound(id)) if id == "nope"));
    assert_eq!(
        host.decrease(&["nope".into()]).await.unwrap(),
        Vec::<String>::new()
    );

    // SIGKILL: the host restarts the plugin and Inits it again; the instances are still listed.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(first_pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while host.restarts() == 0 {
        assert!(
            Instant::now() < deadline,
            "the host did not restart the plugin"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(host.pid(), Some(first_pid));
    let mut after: Vec<(String, State)> = host.update().await.unwrap();
    after.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        after,
        vec![
            (ids[0].clone(), State::Running),
            (ids[1].clone(), State::Running)
        ]
    );

    // Deleted out of band: unhealthy, reported deleted once, then no longer listed.
    std::fs::remove_dir_all(state_dir.join("instances").join(&ids[1])).unwrap();
    assert!(matches!(
        host.heartbeat(&ids[1]).await,
        Err(GroupError::Provider(_))
    ));
    let list = host.update().await.unwrap();
    assert!(list.contains(&(ids[1].clone(), State::Deleted)), "{list:?}");
    let list = host.update().await.unwrap();
    assert_eq!(list, vec![(ids[0].clone(), State::Running)]);

    // Decrease accepts only the named, known ids; the instance goes deleting -> deleted -> gone.
    assert_eq!(
        host.decrease(&[ids[0].clone(), "nope".into()])
            .await
            .unwrap(),
        vec![ids[0].clone()]
    );
    let list = update_until(&host, |l| l.is_empty()).await;
    assert!(list.is_empty());
    assert!(!state_dir.join("instances").join(&ids[0]).exists());

    host.shutdown().await.unwrap();
    let pid = host.pid().unwrap();
    host.stop().await;
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "example plugin reaped after stop()"
    );

    // Its hclog line was logged under the plugin's name, once per Init that succeeded (the
    // restart included), and the connector's password never was.
    let logs = logs.text();
    assert_eq!(logs.matches("instances known").count(), 2, "{logs}");
    assert!(logs.contains("2 instances known"), "{logs}");
    assert!(!logs.contains("s3cret"), "{logs}");
}
