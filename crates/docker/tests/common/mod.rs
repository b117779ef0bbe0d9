//! Shared setup for the integration tests: a running engine, the local busybox image, unique
//! names and labels, and cleanup that runs even when a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use slipway_docker::{
    AttachOptions, CollectedOutput, ContainerSpec, Docker, Transport, WaitCondition,
};

/// The image `scripts/docker-engine.sh` builds.
pub const IMAGE: &str = "slipway-busybox:latest";
/// The label key every test object carries.
pub const LABEL_KEY: &str = "com.slipway.test";

/// Makes sure the engine runs and the test image exists (once per test process).
pub fn ensure_engine() {
    slipway_testkit::ensure_docker_engine().expect("Docker Engine");
}

/// A connected client on the local socket.
pub async fn docker() -> Docker {
    ensure_engine();
    Docker::connect(Transport::unix("/var/run/docker.sock"))
        .await
        .expect("connect to the local engine")
}

/// A name unique to this process and call: `slipway-test-<what>-<pid>-<n>`.
pub fn unique(what: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "slipway-test-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes everything labelled `LABEL_KEY=<value>` when dropped, even after a panic.
pub struct Cleanup {
    /// The label value.
    pub value: String,
}

impl Cleanup {
    /// A fresh label for one test.
    pub fn new(test: &str) -> Self {
        Self {
            value: unique(test),
        }
    }

    /// `key=value` for filters.
    pub fn label(&self) -> String {
        format!("{LABEL_KEY}={}", self.value)
    }

    /// Labels a spec's objects.
    pub fn labels(&self) -> std::collections::BTreeMap<String, String> {
        [(LABEL_KEY.to_string(), self.value.clone())].into()
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let label = self.label();
        // Our own runtime on our own thread: Drop cannot await, and may run inside a runtime.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let docker = Docker::connect_local().await?;
                docker.cleanup_by_label(&label).await
            })
        })
        .join();
        if let Ok(Err(e)) = done {
            eprintln!("cleanup failed: {e}");
        }
    }
}

/// A spec for the test image running `sh -c script`, labelled.
pub fn sh(cleanup: &Cleanup, script: &str) -> ContainerSpec {
    let mut spec = ContainerSpec::new(IMAGE);
    spec.cmd = Some(vec!["sh".into(), "-c".into(), script.into()]);
    spec.labels = cleanup.labels();
    spec
}

/// Creates, attaches, starts and waits: the exit code and the separated output.
pub async fn run(docker: &Docker, spec: &ContainerSpec) -> (i64, CollectedOutput, String) {
    let id = docker.create_container(spec).await.unwrap().id;
    let attached = docker.attach(&id, &AttachOptions::default()).await.unwrap();
    docker.start_container(&id).await.unwrap();
    let output = attached.output.collect_output().await.unwrap();
    let code = docker
        .wait_container(&id, WaitCondition::NotRunning)
        .await
        .unwrap();
    (code, output, id)
}
