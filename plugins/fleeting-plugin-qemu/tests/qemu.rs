//! The QEMU plugin against real VMs (TCG here): boot, SSH logins through the connector, a VM
//! killed from outside, deletion, a restarted plugin; and config errors naming their key.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::sshd_image;
use fleeting_plugin_qemu::QemuGroup;
use slipway_connector::{Client, DialOptions, HostKeyStore};
use slipway_fleeting::{ConnectorConfig, GroupError, InstanceGroup, State};

/// A temp state dir whose VMs are killed on drop, even when a test fails.
struct Fixture {
    dir: tempfile::TempDir,
    image: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            image: sshd_image(),
            dir: tempfile::Builder::new()
                .prefix("slw-qemu-test")
                .tempdir()
                .unwrap(),
        }
    }

    fn config(&self) -> Vec<u8> {
        format!(
            r#"{{"dir":"{}","name":"t","image":"{}","accel":"auto","max_size":2,"memory":"384M","boot_timeout":"20m"}}"#,
            self.dir.path().display(),
            self.image.display()
        )
        .into_bytes()
    }

    async fn group(&self) -> QemuGroup {
        let g = QemuGroup::default();
        g.init(&self.config(), &ConnectorConfig::default())
            .await
            .unwrap();
        g
    }

    fn instances(&self) -> PathBuf {
        self.dir.path().join("instances")
    }

    /// The pid of the QEMU running instance `id`, from its pid file (checked against /proc).
    fn qemu_pid(&self, id: &str) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.instances().join(id).join("qemu.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(&format!("slipway-qemu-{id}"))
            .then_some(pid)
    }

    /// QEMU processes started for this fixture's state dir (by their command line).
    fn qemu_processes(&self) -> Vec<i32> {
        let dir = self.dir.path().display().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&dir))
            })
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for pid in self.qemu_processes() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

async fn states(g: &QemuGroup) -> HashMap<String, State> {
    g.update().await.unwrap().into_iter().collect()
}

/// Update until `done` holds (VMs boot slowly under TCG: the limit only stops a hung test).
async fn wait_for(
    g: &QemuGroup,
    what: &str,
    done: impl Fn(&HashMap<String, State>) -> bool,
) -> HashMap<String, State> {
    let start = Instant::now();
    loop {
        let s = states(g).await;
        if done(&s) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(1500),
            "gave up waiting for {what}: {s:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Log in through the connector; `uname -a; id` output plus the guest's machine id.
async fn login(g: &QemuGroup, id: &str, pins: &HostKeyStore) -> (String, String) {
    let info = g.connect_info(id).await.unwrap();
    assert_eq!(info.connector.protocol, "ssh");
    assert_eq!(info.connector.username, "root");
    assert!(info.internal_addr.starts_with("127.0.0.1:"));
    let client = Client::connect(&info, &DialOptions::default(), pins)
        .await
        .unwrap();
    let (st, out, err) = client
        .run_capture("uname -a; id", Vec::new())
        .await
        .unwrap();
    assert!(st.success(), "{st:?} {}", String::from_utf8_lossy(&err));
    let out = String::from_utf8(out).unwrap();
    let (st, machine_id, _) = client
        .run_capture("cat /etc/machine-id", Vec::new())
        .await
        .unwrap();
    assert!(st.success());
    client.close().await;
    (out, String::from_utf8(machine_id).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn vm_lifecycle_ssh_kill_decrease_and_restart() {
    let fx = Fixture::new();
    let g = fx.group().await;
    assert_eq!(
        g.increase(5).await.unwrap(),
        2,
        "max_size caps the increase"
    );
    let s = states(&g).await;
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(
        s.values()
            .all(|st| matches!(st, State::Creating | State::Running)),
        "{s:?}"
    );
    for id in s.keys() {
        assert!(fx.instances().join(id).join("disk.qcow2").exists());
        assert!(fx.qemu_pid(id).is_some(), "qemu of {id} runs");
    }
    let s = wait_for(&g, "both VMs running", |s| {
        s.len() == 2 && s.values().all(|st| *st == State::Running)
    })
    .await;
    let mut ids: Vec<String> = s.keys().cloned().collect();
    ids.sort();

    // A real SSH login into each: its own kernel, host name and machine id.
    let pins = HostKeyStore::new();
    let mut machine_ids = Vec::new();
    for id in &ids {
        g.heartbeat(id).await.unwrap();
        let (out, machine_id) = login(&g, id, &pins).await;
        assert!(out.starts_with("Linux "), "{out}");
        assert!(out.contains("cloud-amd64"), "a guest kernel: {out}");
        assert!(out.contains(&format!("Linux {id} ")), "host name: {out}");
        assert!(out.contains("uid=0(root)"), "{out}");
        machine_ids.push(machine_id);
    }
    assert_ne!(machine_ids[0], machine_ids[1]);

    // A restarted plugin (same state dir) finds both VMs running.
    g.shutdown().await.unwrap();
    drop(g);
    let g = fx.group().await;
    let s = states(&g).await;
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(s.values().all(|st| *st == State::Running), "{s:?}");

    // Killed from outside: reported deleted, its files gone.
    let (victim, other) = (&ids[0], &ids[1]);
    let pid = fx.qemu_pid(victim).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let s = wait_for(&g, "the killed VM reported deleted", |s| {
        s.get(victim) == Some(&State::Deleted)
    })
    .await;
    assert_eq!(s.get(other), Some(&State::Running));
    assert!(!fx.instances().join(victim).exists());
    let s = states(&g).await;
    assert!(!s.contains_key(victim), "{s:?}");
    assert!(matches!(
        g.connect_info(victim).await,
        Err(GroupError::NotFound(_))
    ));

    // Decrease the other: QEMU stops, overlay and state go.
    assert_eq!(
        g.decrease(std::slice::from_ref(other)).await.unwrap(),
        vec![other.clone()]
    );
    wait_for(&g, "no instances left", |s| s.is_empty()).await;
    assert!(fx.qemu_processes().is_empty(), "no qemu left");
    assert!(!fx.instances().join(other).exists(), "no overlay left");
    g.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_config_errors_name_the_key() {
    let fx = Fixture::new();
    let dir = fx.dir.path().display().to_string();
    let image = fx.image.display().to_string();
    let cases = [
        (format!(r#"{{"dir":"{dir}"}}"#), "`image`"),
        (
            format!(r#"{{"dir":"{dir}","image":"{image}","cpus":0}}"#),
            "`cpus`",
        ),
        (
            format!(r#"{{"dir":"{dir}","image":"{image}","memory":"a lot"}}"#),
            "`memory`",
        ),
        (
            format!(r#"{{"dir":"{dir}","image":"{image}","accel":"hvf"}}"#),
            "`accel`",
        ),
        (
            format!(r#"{{"dir":"{dir}","image":"{image}","boot_timeout":"later"}}"#),
            "`boot_timeout`",
        ),
        (
            format!(r#"{{"dir":"{dir}","image":"{image}","max_size":0}}"#),
            "`max_size`",
        ),
        (
            format!(r#"{{"dir":"{dir}","image":"{dir}/no-such-image"}}"#),
            "`image`",
        ),
        (
            format!(r#"{{"dir":"{dir}","image":"{image}","qemu":"/no/such/qemu"}}"#),
            "`qemu`",
        ),
        (
            format!(r#"{{"dir":"{dir}","image":"{image}","flavour":"x"}}"#),
            "`flavour`",
        ),
    ];
    for (config, key) in cases {
        let g = QemuGroup::default();
        match g.init(config.as_bytes(), &ConnectorConfig::default()).await {
            Err(GroupError::InvalidArgument(msg)) => {
                assert!(msg.contains(key), "{config}: {msg} should name {key}")
            }
            other => panic!("{config}: expected an invalid argument naming {key}, got {other:?}"),
        }
    }

    // An image without sshd is refused with how to build one.
    let plain = fx.dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    for f in ["vmlinuz", "initrd.img", "disk.qcow2"] {
        std::fs::write(plain.join(f), b"x").unwrap();
    }
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fx.image.join("image.json")).unwrap()).unwrap();
    manifest.as_object_mut().unwrap().remove("sshd");
    std::fs::write(plain.join("image.json"), manifest.to_string()).unwrap();
    let g = QemuGroup::default();
    let config = format!(r#"{{"dir":"{dir}","image":"{}"}}"#, plain.display());
    let e = g
        .init(config.as_bytes(), &ConnectorConfig::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("`image`") && e.contains("--sshd"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn vm_not_answering_within_the_boot_timeout_is_reported_timeout_and_stopped() {
    let fx = Fixture::new();
    let config = String::from_utf8(fx.config())
        .unwrap()
        .replace(r#""boot_timeout":"20m""#, r#""boot_timeout":1"#);
    let g = QemuGroup::default();
    g.init(config.as_bytes(), &ConnectorConfig::default())
        .await
        .unwrap();
    assert_eq!(g.increase(1).await.unwrap(), 1);
    let s = states(&g).await;
    let id = s.keys().next().unwrap().clone();
    // Wait past the timeout before the first probe can succeed: the guest needs seconds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = wait_for(&g, "a timeout", |s| s.get(&id) != Some(&State::Creating)).await;
    assert_eq!(s.get(&id), Some(&State::Timeout), "{s:?}");
    // The VM is stopped at once and its disk freed; the record stays until deleted.
    assert!(fx.qemu_processes().is_empty(), "qemu stopped");
    assert!(!fx.instances().join(&id).join("disk.qcow2").exists());
    assert_eq!(states(&g).await.get(&id), Some(&State::Timeout));
    g.decrease(std::slice::from_ref(&id)).await.unwrap();
    wait_for(&g, "no instances left", |s| s.is_empty()).await;
    assert!(!fx.instances().join(&id).exists());
}

#[tokio::test]
async fn a_qemu_that_fails_to_start_leaves_nothing_behind() {
    let fx = Fixture::new();
    let config = String::from_utf8(fx.config())
        .unwrap()
        .replace(r#""name":"t""#, r#""name":"t","qemu":"/bin/false""#);
    let g = QemuGroup::default();
    g.init(config.as_bytes(), &ConnectorConfig::default())
        .await
        .unwrap();
    let e = g.increase(2).await.unwrap_err().to_string();
    assert!(e.contains("/bin/false"), "{e}");
    assert!(states(&g).await.is_empty());
    let left: Vec<_> = std::fs::read_dir(fx.instances())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
