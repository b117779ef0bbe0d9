//! The Rust host against a foreign-language go-plugin peer: PyPI `python-plugin` (a Python port of
//! go-plugin, AutoMTLS with P-521) serving `fleeting.v1` from `tests/python/fleeting_plugin.py`.
//!
//! Not skipped when Python packages are missing: setup installs them, or the test fails saying why.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use slipway_fleeting::host::PluginOptions;
use slipway_fleeting::{
    ConnectorConfig, GroupError, InstanceGroup, MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE, PluginHost,
    State,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_plugin_over_automtls() {
    // RUST_LOG=slipway_goplugin=debug shows the plugin's forwarded logs.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    let python = slipway_testkit::python::python().unwrap();
    let dir = tempfile::tempdir().unwrap();
    slipway_testkit::python::generate_stubs(&python, "fleeting/v1/fleeting.proto", dir.path())
        .unwrap();
    assert!(dir.path().join("fleeting/v1/fleeting_grpc.py").exists());
    let plugin_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/fleeting_plugin.py");
    let wrapper = slipway_testkit::python::wrapper(
        dir.path(),
        "fleeting-plugin-python",
        &python,
        dir.path(),
        &plugin_py,
        &[MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE],
    )
    .unwrap();

    let connector = ConnectorConfig {
        os: "linux".into(),
        protocol: "ssh".into(),
        protocol_port: 2222,
        username: "runner".into(),
        password: "s3cret".into(),
        timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let opts = PluginOptions::new("python", &wrapper)
        .handshake_timeout(Duration::from_secs(30))
        .env("PYTHONUNBUFFERED", "1");
    let host = PluginHost::start(opts)
        .await
        .expect("python plugin starts (AutoMTLS, P-521)");
    let pid = host.pid().unwrap();

    let info = host.init(br#"{"max_size": 3}"#, &connector).await.unwrap();
    assert_eq!(info.id, "python/test");
    assert_eq!(info.max_size, 3);
    assert_eq!(host.increase(5).await.unwrap(), 3);
    let list = host.update().await.unwrap();
    assert_eq!(list.len(), 3);
    assert!(list.iter().all(|(_, s)| *s == State::Running));
    let ci = host.connect_info("py-1").await.unwrap();
    assert_eq!(ci.connector, connector);
    assert_eq!(ci.internal_addr, "127.0.0.1:22");
    assert!(ci.expires.is_some());
    assert!(
        matches!(host.connect_info("nope").await, Err(GroupError::NotFound(id)) if id == "nope")
    );
    host.heartbeat("py-2").await.unwrap();
    assert_eq!(
        host.decrease(&["py-1".into()]).await.unwrap(),
        vec!["py-1".to_owned()]
    );
    assert!(matches!(
        host.init(b"{}", &connector).await,
        Err(GroupError::FailedPrecondition(_))
    ));
    host.shutdown().await.unwrap();

    host.stop().await;
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "python plugin reaped after stop()"
    );
}
