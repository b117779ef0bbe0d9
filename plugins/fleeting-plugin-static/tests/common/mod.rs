//! Real sshd "machines" for the static plugin: `fleeting-plugin-local` starts each in its own
//! network namespace; the fixture tears every one down on drop, also when a test fails.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleeting_plugin_local::LocalGroup;
use slipway_connector::{Client, DialOptions, HostKeyStore};
use slipway_fleeting::{ConnectInfo, ConnectorConfig, InstanceGroup, State};

/// One sshd host as the operator would list it under `instances`.
#[derive(Debug, Clone)]
pub struct TestHost {
    /// Name in the static config (`web0`, `web1`, ...).
    pub name: String,
    /// The local plugin's instance id (its directory under `instances/`).
    pub local_id: String,
    /// `10.213.x.y:22` inside the host's namespace.
    pub addr: String,
    /// Login user.
    pub user: String,
    /// `$HOME` of SSH sessions on this host (a directory of this machine).
    pub home: PathBuf,
}

/// N sshd hosts, each in its own network namespace, plus a scratch dir for the static plugin.
pub struct Hosts {
    dir: tempfile::TempDir,
    /// The hosts, `web0..`.
    pub hosts: Vec<TestHost>,
    /// Client private key file accepted by every host (mode 0600).
    pub key_path: PathBuf,
    /// Key bytes, for connector_config.
    pub key: Vec<u8>,
    // Kept so its sshd hosts are not abandoned mid-provisioning; teardown is in `drop`.
    _local: Option<LocalGroup>,
}

fn ensure_sshd() {
    if Path::new("/usr/sbin/sshd").exists() {
        return;
    }
    let _ = std::process::Command::new("apt-get").arg("update").status();
    let st = std::process::Command::new("apt-get")
        .args(["install", "-y", "-q", "openssh-server"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .unwrap();
    assert!(st.success(), "apt-get install openssh-server failed");
}

impl Hosts {
    /// Start `n` sshd hosts in network namespaces (needs root, as the test machine is).
    pub async fn start(n: usize) -> Hosts {
        ensure_sshd();
        assert!(
            nix::unistd::geteuid().is_root(),
            "these tests create network namespaces: run them as root"
        );
        let dir = tempfile::Builder::new()
            .prefix("slw-static-test")
            .tempdir()
            .unwrap();
        let mut hosts = Hosts {
            dir,
            hosts: Vec::new(),
            key_path: PathBuf::new(),
            key: Vec::new(),
            _local: None,
        };
        let local = LocalGroup::default();
        let cfg = format!(
            r#"{{"dir":"{}","name":"m","network":"netns","max_size":{n}}}"#,
            hosts.local_dir().display()
        );
        local
            .init(cfg.as_bytes(), &ConnectorConfig::default())
            .await
            .unwrap();
        assert_eq!(local.increase(n as u32).await.unwrap(), n as u32);
        let deadline = Instant::now() + Duration::from_secs(60);
        let ids = loop {
            let s = local.update().await.unwrap();
            if s.len() == n && s.iter().all(|(_, st)| *st == State::Running) {
                break s.into_iter().map(|(id, _)| id).collect::<Vec<_>>();
            }
            assert!(Instant::now() < deadline, "sshd hosts not running: {s:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for (i, id) in ids.iter().enumerate() {
            let info = local.connect_info(id).await.unwrap();
            if hosts.key.is_empty() {
                // The operator's key file: what `key_path` points at.
                hosts.key = info.connector.key.clone();
                hosts.key_path = hosts.dir.path().join("client_key");
                std::fs::write(&hosts.key_path, &hosts.key).unwrap();
                std::fs::set_permissions(&hosts.key_path, std::fs::Permissions::from_mode(0o600))
                    .unwrap();
            }
            hosts.hosts.push(TestHost {
                name: format!("web{i}"),
                local_id: id.clone(),
                addr: info.internal_addr.clone(),
                user: info.connector.username.clone(),
                home: hosts.local_dir().join("instances").join(id).join("home"),
            });
        }
        hosts._local = Some(local);
        hosts
    }

    fn local_dir(&self) -> PathBuf {
        self.dir.path().join("local")
    }

    /// The static plugin's state dir.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// A scratch path inside the fixture dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `instances` entry of host `i` with its own username and key_path.
    pub fn entry(&self, i: usize) -> String {
        let h = &self.hosts[i];
        format!(
            r#""{}":{{"internal_addr":"{}","username":"{}","key_path":"{}"}}"#,
            h.name,
            h.addr,
            h.user,
            self.key_path.display()
        )
    }

    /// A plugin_config over hosts `which` (entries from `entry`), named `t`, plus `extra` keys.
    pub fn config(&self, which: &[usize], extra: &str) -> String {
        let entries: Vec<String> = which.iter().map(|i| self.entry(*i)).collect();
        format!(
            r#"{{"name":"t","state_dir":"{}","probe_timeout":"3s","instances":{{{}}}{extra}}}"#,
            self.state_dir().display(),
            entries.join(",")
        )
    }

    /// Kill host `i`'s sshd: the machine stops answering SSH.
    pub fn stop_sshd(&self, i: usize) {
        let pid = self.sshd_pid(&self.hosts[i].local_id).expect("sshd pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        // Wait until the listener is really gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(Instant::now() < deadline, "sshd {pid} did not die");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn sshd_pid(&self, local_id: &str) -> Option<i32> {
        std::fs::read_to_string(
            self.local_dir()
                .join("instances")
                .join(local_id)
                .join("sshd.pid"),
        )
        .ok()?
        .trim()
        .parse()
        .ok()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Tear down by what this fixture made: each instance's sshd (by its pid file), every
        // process left in its namespace (e.g. a cleanup command of a killed plugin), the
        // host-side link and the namespace.
        let Ok(entries) = std::fs::read_dir(self.local_dir().join("instances")) else {
            return;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = self.sshd_pid(&id) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let net = std::fs::read_to_string(e.path().join("net")).unwrap_or_default();
            let f: Vec<&str> = net.split_whitespace().collect();
            if let ["netns", name, index] = f[..] {
                if let Ok(out) = std::process::Command::new("ip")
                    .args(["netns", "pids", name])
                    .output()
                {
                    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                        if let Ok(pid) = pid.parse::<i32>() {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid),
                                nix::sys::signal::Signal::SIGKILL,
                            );
                        }
                    }
                }
                let _ = std::process::Command::new("ip")
                    .args(["link", "delete", &format!("slwh{index}")])
                    .status();
                let _ = std::process::Command::new("ip")
                    .args(["netns", "delete", name])
                    .status();
            }
        }
    }
}

/// Log in with `info` through the connector and run `cmd`; returns stdout.
pub async fn ssh(info: &ConnectInfo, cmd: &str) -> String {
    let client = Client::connect(info, &DialOptions::default(), &HostKeyStore::new())
        .await
        .unwrap();
    let (st, out, err) = client.run_capture(cmd, Vec::new()).await.unwrap();
    client.close().await;
    assert!(
        st.success(),
        "{cmd}: {st}: {}",
        String::from_utf8_lossy(&err)
    );
    String::from_utf8(out).unwrap()
}

/// Poll `update` until `pred` holds (panics after 60 s).
pub async fn wait_for<G: InstanceGroup>(
    g: &G,
    what: &str,
    pred: impl Fn(&[(String, State)]) -> bool,
) -> Vec<(String, State)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = g.update().await.unwrap();
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The state of `id` in an update, if listed.
pub fn state_of(s: &[(String, State)], id: &str) -> Option<State> {
    s.iter().find(|(i, _)| i == id).map(|(_, st)| *st)
}
