//! The local plugin against real sshd processes, with real SSH logins through the connector.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
        // Another group running in parallel may claim the freed index at once: the link must
        // not be ours any more, whoever holds its name now.
        let link = std::process::Command::new("ip")
            .args(["-d", "link", "show", &format!("slwh{index}")])
            .output()
            .unwrap();
        let link = String::from_utf8_lossy(&link.stdout);
        assert!(
            !link.contains(&format!("link-netns {name}")),
            "host link of {name} still there: {link}"
        );
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

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The network mode that exercises the most: namespaces when root.
fn best_network() -> &'static str {
    if is_root() { "netns" } else { "loopback" }
}

/// Namespace name the plugin uses for instance `id`.
fn ns_name(id: &str) -> String {
    format!("slw-{}", id.rsplit('-').next().unwrap())
}

async fn cmd(program: &str, args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

async fn must(program: &str, args: &[&str]) {
    let (ok, out) = cmd(program, args).await;
    assert!(ok, "{program} {args:?}: {out}");
}

/// Pids of live processes whose command line mentions `dir` (sshd listeners, sessions).
async fn processes_mentioning(dir: &Path) -> Vec<i32> {
    let needle = dir.display().to_string();
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // Zombies have an empty cmdline and are not running anything.
            if cmdline.contains(&needle) {
                out.push(pid);
            }
        }
        out
    })
    .await
    .unwrap()
}

/// Everything left of the group in `fx`: instance (or trash) directories, processes, and
/// namespaces / host links of the instance ids in `ids`. Empty means fully cleaned up.
async fn leftovers(fx: &Fixture, ids: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    let mut rd = tokio::fs::read_dir(fx.path().join("instances"))
        .await
        .unwrap();
    while let Some(e) = rd.next_entry().await.unwrap() {
        left.push(format!("dir {}", e.file_name().to_string_lossy()));
    }
    for pid in processes_mentioning(fx.path()).await {
        left.push(format!("process {pid}"));
    }
    if is_root() {
        let (_, netns) = cmd("ip", &["netns", "list"]).await;
        let (_, links) = cmd("ip", &["-o", "link", "show"]).await;
        let link_words: Vec<&str> = links.split_whitespace().collect();
        for id in ids {
            let name = ns_name(id);
            if netns.split_whitespace().any(|w| w == name) {
                left.push(format!("netns {name}"));
            }
            if link_words
                .windows(2)
                .any(|w| w[0] == "link-netns" && w[1] == name)
            {
                left.push(format!("host link into {name}"));
            }
        }
    }
    left
}

/// Wait (up to 20 s) until nothing of the group is left.
async fn assert_all_gone(fx: &Fixture, ids: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = leftovers(fx, ids).await;
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Bug: `update` listed an instance, a deletion finished while it awaited its checks, and it
/// then "resumed" the vanished instance, recreating its directory, sshd and namespace for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_racing_deletions_never_resurrects_an_instance() {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let fx = Fixture::new();
    let extra = format!(r#","network":"{}","max_size":8"#, best_network());
    let g = Arc::new(fx.group(&extra).await);
    let stop = Arc::new(AtomicBool::new(false));
    // Two tasks calling `update` back to back: every deletion ends during some pass. In a
    // JoinSet so a failing test aborts them (and drops the group) before the fixture cleans up.
    let mut hammers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (g, stop) = (Arc::clone(&g), Arc::clone(&stop));
        hammers.spawn(async move {
            let mut passes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                g.update().await.unwrap();
                passes += 1;
                tokio::task::yield_now().await;
            }
            passes
        });
    }

    let mut seen = BTreeSet::new();
    let mut rounds = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) || rounds < 3 {
        assert_eq!(g.increase(4).await.unwrap(), 4);
        let ids: Vec<String> = states(&g).await.into_iter().map(|(id, _)| id).collect();
        seen.extend(ids.iter().cloned());
        // Delete at varying points: while provisioning, and once running.
        if rounds % 2 == 1 {
            wait_for(&g, "running", |s| {
                s.iter().all(|(_, st)| *st == State::Running)
            })
            .await;
        } else {
            tokio::time::sleep(Duration::from_millis(30 * (rounds % 4))).await;
        }
        assert_eq!(g.decrease(&ids).await.unwrap().len(), ids.len());
        // Several decreases at once (as after a retry): all but the first are no-ops.
        let _ = g.decrease(&ids).await.unwrap();
        wait_for(&g, "deletion", |s| s.is_empty()).await;
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(passes) = hammers.join_next().await {
        assert!(passes.unwrap() > 0);
    }
    // A resurrected instance would now be provisioning (or running) with nobody deleting it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(states(&g).await, Vec::new());
    let ids: Vec<String> = seen.into_iter().collect();
    assert_all_gone(&fx, &ids).await;
    g.shutdown().await.unwrap();
}

/// Runs cleanup commands on drop, so pieces a test makes by hand never outlive it.
#[derive(Default)]
struct Undo(Vec<Vec<String>>);

impl Undo {
    fn push(&mut self, command: &[&str]) {
        self.0.push(command.iter().map(|s| s.to_string()).collect());
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        for c in &self.0 {
            let _ = std::process::Command::new(&c[0]).args(&c[1..]).output();
        }
    }
}

/// Make an instance directory as `increase` does, plus state files: a `net` record of
/// namespace index `net` and a `deleting` marker.
async fn fake_instance(fx: &Fixture, net: Option<u32>, deleting: bool) -> String {
    let id = format!("t-{:08x}", rand::random::<u32>());
    let dir = fx.path().join("instances").join(&id);
    tokio::fs::create_dir_all(dir.join("home")).await.unwrap();
    if let Some(index) = net {
        let record = format!("netns {} {index}\n", ns_name(&id));
        tokio::fs::write(dir.join("net"), record).await.unwrap();
    }
    if deleting {
        tokio::fs::write(dir.join("deleting"), b"").await.unwrap();
    }
    id
}

fn link_exists(name: &str) -> bool {
    Path::new(&format!("/sys/class/net/{name}")).exists()
}

/// Bug: a plugin killed between `ip netns add` and recording the namespace left a namespace
/// that a restarted plugin could neither create again ("File exists") nor delete. Each instance
/// here is left as a crash at a different point would leave it; a new group over the same dir
/// must finish or delete each one cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_made_namespaces_are_resumed_or_deleted_after_a_crash() {
    if !is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let fx = Fixture::new();
    let mut undo = Undo::default();
    // Subnet indexes unlikely to be in use by the tests running alongside (they take the
    // lowest free ones).
    let base = 12_000 + rand::random::<u32>() % 4_000;
    let (ia, ib, ie, i_f) = (base, base + 1, base + 2, base + 3);
    // A: recorded, namespace and an unconfigured veth made, then the crash: resumed.
    let a = fake_instance(&fx, Some(ia), false).await;
    // B: the same, but its deletion had started: deleted.
    let b = fake_instance(&fx, Some(ib), true).await;
    // C: namespace made, nothing recorded (as the old plugin crashed), deletion started:
    // deleted all the same (the name is derived from the id).
    let c = fake_instance(&fx, None, true).await;
    // D: namespace made, nothing recorded, not deleting: provisioning reuses the namespace
    // instead of failing with "File exists".
    let d = fake_instance(&fx, None, false).await;
    // E: recorded index now held by a link that is not E's (another instance took it, e.g.
    // after a reboot): E moves to another index and never touches that link.
    let e = fake_instance(&fx, Some(ie), false).await;
    // F: recorded, killed inside `ip netns add` (the namespace file exists but is no
    // namespace): the file is replaced and F resumed.
    let f = fake_instance(&fx, Some(i_f), false).await;

    for id in [&a, &b, &c, &d, &e] {
        undo.push(&["ip", "netns", "delete", &ns_name(id)]);
        must("ip", &["netns", "add", &ns_name(id)]).await;
    }
    for (id, index) in [(&a, ia), (&b, ib)] {
        let host_if = format!("slwh{index}");
        undo.push(&["ip", "link", "delete", &host_if]);
        let peer = [
            "link", "add", &host_if, "type", "veth", "peer", "name", "eth0",
        ];
        must("ip", &[&peer[..], &["netns", &ns_name(id)]].concat()).await;
    }
    let foreign = format!("slwh{ie}");
    undo.push(&["ip", "link", "delete", &foreign]);
    let foreign_peer = format!("slwx{ie}");
    let args = [
        "link",
        "add",
        &foreign,
        "type",
        "veth",
        "peer",
        "name",
        &foreign_peer,
    ];
    must("ip", &args).await;
    let f_file = format!("/run/netns/{}", ns_name(&f));
    undo.push(&["rm", "-f", &f_file]);
    tokio::fs::write(&f_file, b"").await.unwrap();

    let g = fx.group(r#","network":"netns""#).await;
    let resumed = [a.clone(), d.clone(), e.clone(), f.clone()];
    let s = wait_for(&g, "A, D, E, F running; B, C deleted", |s| {
        s.len() == resumed.len()
            && s.iter()
                .all(|(id, st)| resumed.contains(id) && *st == State::Running)
    })
    .await;
    assert_eq!(s.len(), resumed.len());
    let pins = HostKeyStore::new();
    for id in &resumed {
        g.heartbeat(id).await.unwrap();
        login_and_check_home(&g, fx.path(), id, &pins).await;
    }
    // A kept its recorded subnet; E moved off the foreign link's, which is untouched.
    let net_a = tokio::fs::read_to_string(fx.path().join("instances").join(&a).join("net"))
        .await
        .unwrap();
    assert_eq!(net_a, format!("netns {} {ia}\n", ns_name(&a)));
    let net_e = tokio::fs::read_to_string(fx.path().join("instances").join(&e).join("net"))
        .await
        .unwrap();
    assert_ne!(net_e, format!("netns {} {ie}\n", ns_name(&e)), "{net_e}");
    assert!(link_exists(&foreign), "foreign link {foreign} was removed");

    let all = [a, b, c, d, e, f];
    assert_eq!(g.decrease(&resumed).await.unwrap().len(), resumed.len());
    wait_for(&g, "all deleted", |s| s.is_empty()).await;
    assert_all_gone(&fx, &all).await;
    assert!(!link_exists(&format!("slwh{ia}")));
    assert!(!link_exists(&format!("slwh{ib}")));
    assert!(link_exists(&foreign), "foreign link {foreign} was removed");
    g.shutdown().await.unwrap();
}

/// `decrease` followed at once by the plugin exiting (the group dropped without `shutdown`,
/// which aborts the deletions mid-way): the next plugin start finishes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_interrupted_by_plugin_exit_is_finished_on_restart() {
    let fx = Fixture::new();
    let extra = format!(r#","network":"{}""#, best_network());
    let mut seen = Vec::new();
    // Exit right away, then a little later (while processes are being stopped).
    for pause in [0, 150] {
        let g = fx.group(&extra).await;
        assert_eq!(g.increase(2).await.unwrap(), 2);
        let s = wait_for(&g, "running", |s| {
            s.len() == 2 && s.iter().all(|(_, st)| *st == State::Running)
        })
        .await;
        let ids: Vec<String> = s.into_iter().map(|(id, _)| id).collect();
        seen.extend(ids.iter().cloned());
        assert_eq!(g.decrease(&ids).await.unwrap(), ids);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        drop(g);

        let g2 = fx.group(&extra).await;
        wait_for(&g2, "deletion resumed", |s| s.is_empty()).await;
        assert_all_gone(&fx, &seen).await;
        g2.shutdown().await.unwrap();
    }
}
