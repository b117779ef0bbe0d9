//! The Rust host against a foreign-language go-plugin peer: PyPI `python-plugin` (a Python port of
//! go-plugin, AutoMTLS with P-521) serving `fleeting.v1` from `tests/python/fleeting_plugin.py`.
//!
//! Not skipped when Python packages are missing: setup installs them, or the test fails saying why.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use slipway_fleeting::host::PluginOptions;
use slipway_fleeting::{
    ConnectorConfig, GroupError, InstanceGroup, MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE, PluginHost,
    State,
};

const IMPORT_CHECK: &str = "import pyplugin, grpclib, grpc_tools.protoc";

fn python_ok(python: &str) -> bool {
    Command::new(python)
        .args(["-c", IMPORT_CHECK])
        .status()
        .is_ok_and(|s| s.success())
}

/// The real interpreter (not a pyenv shim) with python-plugin and grpcio-tools importable.
fn python() -> PathBuf {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    if !python_ok(&python) {
        let status = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "python-plugin",
                "grpcio-tools",
            ])
            .status();
        assert!(
            status.is_ok_and(|s| s.success()) && python_ok(&python),
            "{python} cannot import python-plugin (pyplugin), grpclib and grpcio-tools, and \
             `{python} -m pip install python-plugin grpcio-tools` did not fix it; install them (or set \
             PYTHON to an interpreter that has them)"
        );
    }
    let out = Command::new(&python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("running python");
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}

/// Generate grpclib stubs for fleeting/v1 into `out` (never committed).
fn generate_stubs(python: &Path, out: &Path) {
    let proto_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    // Name the grpclib protoc plugin explicitly: it sits next to the interpreter, maybe not on PATH.
    let plugin = python.with_file_name("protoc-gen-grpclib_python");
    let mut cmd = Command::new(python);
    cmd.args(["-m", "grpc_tools.protoc"])
        .arg("-I")
        .arg(&proto_root);
    if plugin.exists() {
        cmd.arg(format!(
            "--plugin=protoc-gen-grpclib_python={}",
            plugin.display()
        ));
    }
    let output = cmd
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpclib_python_out={}", out.display()))
        .arg("fleeting/v1/fleeting.proto")
        .output()
        .expect("running grpc_tools.protoc");
    assert!(
        output.status.success(),
        "protoc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(out.join("fleeting/v1/fleeting_grpc.py").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_plugin_over_automtls() {
    // RUST_LOG=slipway_goplugin=debug shows the plugin's forwarded logs.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    generate_stubs(&python, dir.path());
    let plugin_py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/fleeting_plugin.py");
    let wrapper = dir.path().join("fleeting-plugin-python");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec '{}' '{}' '{MAGIC_COOKIE_KEY}' '{MAGIC_COOKIE_VALUE}'\n",
            python.display(),
            plugin_py.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();

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
        .env("PYTHONPATH", dir.path().to_str().unwrap())
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
