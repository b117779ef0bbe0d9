//! The local plugin against real sshd processes, with real SSH logins through the connector.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleeting_plugin_local::LocalGroup;
use slipway_connector::{Client, DialOptions, HostKeyStore};
use slipway_fleeting::{ConnectorConfig, GroupError, InstanceGroup, State};

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

/// A temp state dir torn down on drop, even when a test fails: every process mentioning the dir
/// (sshd listeners) or carrying its instance marker is killed, and namespaces are removed.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        ensure_sshd();
        Fixture {
            dir: tempfile::Builder::new()
                .prefix("slw-local-test")
                .tempdir()
                .unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self, extra: &str) -> Vec<u8> {
        format!(r#"{{"dir":"{}","name":"t"{extra}}}"#, self.path().display()).into_bytes()
    }

    async fn group(&self, extra: &str) -> LocalGroup {
        let g = LocalGroup::default();
        g.init(&self.config(extra), &ConnectorConfig::default())
            .await
            .unwrap();
        g
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let dir = self.path().display().to_string();
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-f", &dir])
            .status();
        if let Ok(entries) = std::fs::read_dir(self.path().join("instances")) {
            for e in entries.flatten() {
                let net = std::fs::read_to_string(e.path().join("net")).unwrap_or_default();
                let f: Vec<&str> = net.split_whitespace().collect();
                if let ["netns", name, index] = f[..] {
                    if let Ok(out) = std::process::Command::new("ip")
                        .args(["netns", "pids", name])
                        .output()
                    {
                        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                            let _ = std::process::Command::new("kill")
                                .args(["-9", pid])
                                .status();
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
}

async fn states(g: &LocalGroup) -> Vec<(String, State)> {
    g.update().await.unwrap()
}

/// Poll `update` until `pred` holds (panics after 20 s).
async fn wait_for(
    g: &LocalGroup,
    what: &str,
    pred: impl Fn(&[(String, State)]) -> bool,
) -> Vec<(String, State)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = states(g).await;
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

fn sshd_pid(dir: &Path, id: &str) -> i32 {
    std::fs::read_to_string(dir.join("instances").join(id).join("sshd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn process_is_sshd(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("sshd"))
        .unwrap_or(false)
}

fn netns_list() -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Log in over SSH and check the session runs in the instance's own home.
async fn login_and_check_home(g: &LocalGroup, dir: &Path, id: &str, pins: &HostKeyStore) {
    let info = g.connect_info(id).await.unwrap();
    assert_eq!(info.id, id);
    assert_eq!(info.connector.os, "linux");
    assert_eq!(info.connector.protocol, "ssh");
    assert!(!info.connector.key.is_empty());
    assert!(["amd64", "arm64"].contains(&info.connector.arch.as_str()));
    let client = Client::connect(&info, &DialOptions::default(), pins)
        .await
        .unwrap();
    let (st, out, err) = client
        .run_capture("echo $HOME; pwd", Vec::new())
        .await
        .unwrap();
    assert!(st.success(), "{st:?} {}", String::from_utf8_lossy(&err));
    let home = dir.join("instances").join(id).join("home");
    let home = home.display();
    assert_eq!(String::from_utf8(out).unwrap(), format!("{home}\n{home}\n"));
    // Exit codes and stdin pass through the ForceCommand wrapper unchanged.
    let (st, out, _) = client
        .run_capture("cat; exit 7", b"in".to_vec())
        .await
        .unwrap();
    assert_eq!((st.code, out), (Some(7), b"in".to_vec()));
    client.close().await;
}

async fn lifecycle(network: &str) {
    let fx = Fixture::new();
    let extra = format!(r#","network":"{network}","provisioning_delay":"400ms""#);
    let g = fx.group(&extra).await;
    assert_eq!(g.increase(2).await.unwrap(), 2);

    // Provisioning delay: both are creating first.
    let s = states(&g).await;
    assert_eq!(s.len(), 2);
    assert!(s.iter().all(|(_, st)| *st == State::Creating), "{s:?}");
    let start = Instant::now();
    let s = wait_for(&g, "running", |s| {
        s.iter().all(|(_, st)| *st == State::Running)
    })
    .await;
    assert!(start.elapsed() >= Duration::from_millis(300));
    let ids: Vec<String> = s.into_iter().map(|(id, _)| id).collect();
    assert!(ids.iter().all(|id| id.starts_with("t-")));

    let pins = HostKeyStore::new();
    for id in &ids {
        g.heartbeat(id).await.unwrap();
        let info = g.connect_info(id).await.unwrap();
        if network == "netns" {
            assert!(
                info.internal_addr.starts_with("10.213."),
                "{}",
                info.internal_addr
            );
            assert!(info.internal_addr.ends_with(":22"));
            let ns =
                std::fs::read_to_string(fx.path().join("instances").join(id).join("net")).unwrap();
            let name = ns.split_whitespace().nth(1).unwrap().to_owned();
            assert!(netns_list().contains(&name));
        } else {
            assert!(
                info.internal_addr.starts_with("127.0.0.1:"),
                "{}",
                info.internal_addr
            );
        }
        login_and_check_home(&g, fx.path(), id, &pins).await;
    }

    // Decrease the first: its sshd, files and namespace go away; unknown ids are not accepted.
    let victim = ids[0].clone();
    let pid = sshd_pid(fx.path(), &victim);
    let net =
        std::fs::read_to_string(fx.path().join("instances").join(&victim).join("net")).unwrap();
    let accepted = g
        .decrease(&[victim.clone(), "t-nothere".into(), "../x".into()])
        .await
        .unwrap();
    assert_eq!(accepted, vec![victim.clone()]);
    wait_for(&g, "deletion", |s| s.iter().all(|(id, _)| *id != victim)).await;
    assert!(!process_is_sshd(pid), "sshd {pid} still running");
    assert!(!fx.path().join("instances").join(&victim).exists());
    if network == "netns" {
        let name = net.split_whitespace().nth(1).unwrap();
        let index = net.split_whitespace().nth(2).unwrap();
        assert!(
            !netns_list().contains(name),
            "{name} still in ip netns list"
        );
        assert!(!Path::new(&format!("/sys/class/net/slwh{index}")).exists());
    }
    assert!(matches!(
        g.connect_info(&victim).await,
        Err(GroupError::NotFound(_))
    ));

    // Simulated plugin restart: a new group over the same dir finds the running instance.
    let survivor = ids[1].clone();
    let survivor_pid = sshd_pid(fx.path(), &survivor);
    g.shutdown().await.unwrap();
    drop(g);
    assert!(
        process_is_sshd(survivor_pid),
        "sshd must outlive the plugin"
    );
    let g2 = fx.group(&extra).await;
    assert_eq!(states(&g2).await, vec![(survivor.clone(), State::Running)]);
    g2.heartbeat(&survivor).await.unwrap();
    // Same host key as before the restart: the pin still matches.
    login_and_check_home(&g2, fx.path(), &survivor, &pins).await;
    assert_eq!(
        g2.decrease(std::slice::from_ref(&survivor)).await.unwrap(),
        vec![survivor.clone()]
    );
    wait_for(&g2, "all deleted", |s| s.is_empty()).await;
    assert!(!process_is_sshd(survivor_pid));
    g2.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netns_lifecycle() {
    lifecycle("netns").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_lifecycle() {
    lifecycle("loopback").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_size_and_dead_sshd_is_timeout_and_resume_after_restart() {
    let fx = Fixture::new();
    let extra = r#","network":"loopback","max_size":2"#;
    let g = fx.group(extra).await;
    assert_eq!(g.increase(3).await.unwrap(), 2);
    assert_eq!(g.increase(1).await.unwrap(), 0);
    let s = wait_for(&g, "running", |s| {
        s.len() == 2 && s.iter().all(|(_, st)| *st == State::Running)
    })
    .await;
    let (a, b) = (s[0].0.clone(), s[1].0.clone());

    // sshd of `a` dies unexpectedly: timeout, with the reason written down.
    let pid = sshd_pid(fx.path(), &a);
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    wait_for(&g, "timeout", |s| {
        s.iter().any(|(id, st)| *id == a && *st == State::Timeout)
    })
    .await;
    assert!(g.heartbeat(&a).await.is_err());
    let reason =
        std::fs::read_to_string(fx.path().join("instances").join(&a).join("failed")).unwrap();
    assert!(reason.contains("exited unexpectedly"), "{reason}");

    // A plugin restart with `b`'s sshd gone (e.g. the machine rebooted) resumes `b`.
    g.shutdown().await.unwrap();
    drop(g);
    let pid_b = sshd_pid(fx.path(), &b);
    std::process::Command::new("kill")
        .args(["-9", &pid_b.to_string()])
        .status()
        .unwrap();
    while process_is_sshd(pid_b) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let g2 = fx.group(extra).await;
    wait_for(&g2, "resumed", |s| {
        s.iter().any(|(id, st)| *id == b && *st == State::Running)
    })
    .await;
    assert_ne!(sshd_pid(fx.path(), &b), pid_b);
    login_and_check_home(&g2, fx.path(), &b, &HostKeyStore::new()).await;

    let mut accepted = g2.decrease(&[a.clone(), b.clone()]).await.unwrap();
    accepted.sort();
    assert_eq!(accepted, vec![a, b]);
    wait_for(&g2, "all deleted", |s| s.is_empty()).await;
    g2.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_plugin_config_names_the_field() {
    let fx = Fixture::new();
    for (extra, field) in [
        (r#","colour":"blue""#, "colour"),
        (r#","provisioning_delay":"soonish""#, "provisioning_delay"),
        (r#","network":"wifi""#, "network"),
        (r#","max_size":"lots""#, "max_size"),
        (r#","sshd_path":"/nonexistent/sshd""#, "sshd_path"),
        (r#","user":"no-such-user-slw""#, "user"),
    ] {
        let g = LocalGroup::default();
        let err = g
            .init(&fx.config(extra), &ConnectorConfig::default())
            .await
            .unwrap_err();
        assert!(matches!(err, GroupError::InvalidArgument(_)), "{err}");
        assert!(
            err.to_string().contains(&format!("`{field}`")),
            "{extra}: {err}"
        );
    }
    let g = LocalGroup::default();
    assert!(matches!(
        g.update().await,
        Err(GroupError::FailedPrecondition(_))
    ));
}

#[tokio::test]
async fn client_key_is_made_once_with_private_mode() {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new();
    let _g = fx.group(r#","network":"loopback""#).await;
    let key: PathBuf = fx.path().join("id_ed25519");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let first = std::fs::read(&key).unwrap();
    let _g2 = fx.group(r#","network":"loopback""#).await;
    assert_eq!(std::fs::read(&key).unwrap(), first);
}
