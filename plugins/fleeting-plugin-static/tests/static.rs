//! The static plugin over real sshd hosts in network namespaces, with real SSH logins and
//! cleanups through the connector.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Hosts, ssh, state_of, wait_for};
use fleeting_plugin_static::StaticGroup;
use slipway_fleeting::{ConnectorConfig, GroupError, InstanceGroup, State};

/// Waits for a `go` file in its home, so the test sees the host `deleting`, then cleans.
const GATED_CLEANUP: &str = "while [ ! -e go ]; do sleep 0.1; done; rm -f dirty; echo ok > cleaned";

async fn group(config: &str, connector: &ConnectorConfig) -> StaticGroup {
    let g = StaticGroup::default();
    g.init(config.as_bytes(), connector).await.unwrap();
    g
}

fn ids(s: &[(String, State)]) -> Vec<String> {
    s.iter().map(|(id, _)| id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_login_and_cleanup_on_decrease() {
    let hx = Hosts::start(3).await;
    // web0 lists no username and no key: both come from the runner's connector_config.
    let web0 = format!(r#""web0":{{"internal_addr":"{}"}}"#, hx.hosts[0].addr);
    let config = format!(
        r#"{{"name":"t","state_dir":"{}","cleanup_command":"{GATED_CLEANUP}",
            "instances":{{{web0},{},{}}}}}"#,
        hx.state_dir().display(),
        hx.entry(1),
        hx.entry(2)
    );
    let connector = ConnectorConfig {
        username: hx.hosts[0].user.clone(),
        key: hx.key.clone(),
        use_static_credentials: true,
        keepalive: Duration::from_secs(7),
        ..ConnectorConfig::default()
    };
    let g = StaticGroup::default();
    let info = g.init(config.as_bytes(), &connector).await.unwrap();
    assert_eq!((info.id.as_str(), info.max_size), ("static/t", 3));
    assert!(g.update().await.unwrap().is_empty());

    // Increase takes free hosts: never more than exist.
    assert_eq!(g.increase(2).await.unwrap(), 2);
    let s = g.update().await.unwrap();
    assert_eq!(
        s,
        vec![
            ("web0-1".to_owned(), State::Running),
            ("web1-2".to_owned(), State::Running)
        ]
    );
    assert_eq!(g.increase(5).await.unwrap(), 1);
    assert_eq!(g.increase(1).await.unwrap(), 0);
    assert_eq!(
        ids(&g.update().await.unwrap()),
        ["web0-1", "web1-2", "web2-3"]
    );

    // ConnectInfo: the host's address, credentials filled from connector_config for web0 and
    // from the host entry for web1; a real login lands on that machine.
    let ci = g.connect_info("web0-1").await.unwrap();
    assert_eq!(ci.id, "web0-1");
    assert_eq!(ci.internal_addr, hx.hosts[0].addr);
    assert_eq!(ci.external_addr, hx.hosts[0].addr);
    assert_eq!(ci.connector.username, hx.hosts[0].user);
    assert_eq!(ci.connector.key, hx.key);
    assert_eq!(ci.connector.protocol, "ssh");
    assert_eq!(ci.connector.os, "linux");
    assert_eq!(ci.connector.keepalive, Duration::from_secs(7));
    assert!(ci.connector.use_static_credentials);
    assert_eq!(ci.expires, None);
    let ci1 = g.connect_info("web1-2").await.unwrap();
    assert_eq!(ci1.internal_addr, hx.hosts[1].addr);
    assert_eq!(ci1.connector.key, std::fs::read(&hx.key_path).unwrap());
    for (ci, host) in [(&ci, &hx.hosts[0]), (&ci1, &hx.hosts[1])] {
        let home = ssh(ci, "echo job > dirty; echo $HOME").await;
        assert_eq!(home.trim(), host.home.display().to_string());
        assert!(host.home.join("dirty").exists());
    }
    g.heartbeat("web0-1").await.unwrap();
    assert!(matches!(
        g.connect_info("web9-9").await,
        Err(GroupError::NotFound(_))
    ));

    // Decrease cleans the host: `deleting` while the cleanup runs, then gone from Update.
    let accepted = g.decrease(&["web0-1".into(), "nope".into()]).await.unwrap();
    assert_eq!(accepted, ["web0-1"]);
    let s = g.update().await.unwrap();
    assert_eq!(state_of(&s, "web0-1"), Some(State::Deleting), "{s:?}");
    assert_eq!(state_of(&s, "web1-2"), Some(State::Running));
    // Busy hosts stay busy while cleaning.
    assert_eq!(g.increase(1).await.unwrap(), 0);
    std::fs::write(hx.hosts[0].home.join("go"), "").unwrap();
    wait_for(&g, "web0-1 gone", |s| state_of(s, "web0-1").is_none()).await;
    let home = &hx.hosts[0].home;
    assert!(!home.join("dirty").exists(), "cleanup did not remove dirty");
    assert_eq!(
        std::fs::read_to_string(home.join("cleaned")).unwrap(),
        "ok\n"
    );
    assert!(matches!(
        g.heartbeat("web0-1").await,
        Err(GroupError::NotFound(_))
    ));

    // The cleaned host is free again, under a new id: a deleted id never comes back.
    assert_eq!(g.increase(3).await.unwrap(), 1);
    assert_eq!(
        ids(&g.update().await.unwrap()),
        ["web0-4", "web1-2", "web2-3"]
    );
    let state = std::fs::read_to_string(hx.state_dir().join("state.json")).unwrap();
    assert!(state.contains("\"web0-4\""), "{state}");
    assert!(!state.contains("web0-1"), "{state}");
    // The cleanup pinned web0's host key under the host's name.
    let pins = std::fs::read_to_string(hx.state_dir().join("known_hosts")).unwrap();
    assert!(pins.starts_with("web0 ssh-"), "{pins}");
    g.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_host_is_skipped_and_fails_heartbeat() {
    let hx = Hosts::start(2).await;
    let g = group(&hx.config(&[0, 1], ""), &ConnectorConfig::default()).await;
    hx.stop_sshd(0);
    // web0 does not answer: Increase skips it and hands out only web1.
    assert_eq!(g.increase(2).await.unwrap(), 1);
    let s = g.update().await.unwrap();
    assert_eq!(ids(&s), ["web1-1"]);
    g.heartbeat("web1-1").await.unwrap();
    ssh(&g.connect_info("web1-1").await.unwrap(), "true").await;

    hx.stop_sshd(1);
    let err = g.heartbeat("web1-1").await.unwrap_err();
    assert!(matches!(err, GroupError::Provider(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("web1-1") && msg.contains(&hx.hosts[1].addr) && msg.contains("unreachable"),
        "{msg}"
    );
    assert_eq!(g.increase(1).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_leases_and_finishes_a_pending_cleanup() {
    let hx = Hosts::start(2).await;
    let config = hx.config(&[0, 1], &format!(r#","cleanup_command":"{GATED_CLEANUP}""#));
    let first = group(&config, &ConnectorConfig::default()).await;
    assert_eq!(first.increase(2).await.unwrap(), 2);
    assert_eq!(
        first.decrease(&["web0-1".into()]).await.unwrap(),
        ["web0-1"]
    );
    wait_for(&first, "web0-1 deleting", |s| {
        state_of(s, "web0-1") == Some(State::Deleting)
    })
    .await;
    // The plugin dies mid-cleanup (dropping the group aborts its tasks, as a kill would).
    drop(first);

    let second = group(&config, &ConnectorConfig::default()).await;
    let s = second.update().await.unwrap();
    assert_eq!(
        s,
        vec![
            ("web0-1".to_owned(), State::Deleting),
            ("web1-2".to_owned(), State::Running)
        ]
    );
    let ci = second.connect_info("web1-2").await.unwrap();
    assert_eq!(ci.internal_addr, hx.hosts[1].addr);
    ssh(&ci, "true").await;
    // The restarted plugin resumed the cleanup: it finishes once allowed to.
    std::fs::write(hx.hosts[0].home.join("go"), "").unwrap();
    wait_for(&second, "web0-1 cleaned", |s| {
        state_of(s, "web0-1").is_none()
    })
    .await;
    assert!(hx.hosts[0].home.join("cleaned").exists());
    // Lease numbers carry on across the restart.
    assert_eq!(second.increase(1).await.unwrap(), 1);
    assert_eq!(ids(&second.update().await.unwrap()), ["web0-3", "web1-2"]);
    second.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_cleanup_holds_the_host_back_until_a_restart_cleans_it() {
    let hx = Hosts::start(1).await;
    let config = hx.config(
        &[0],
        r#","cleanup_command":"echo checking >&2; test -e ok && rm -f dirty""#,
    );
    let first = group(&config, &ConnectorConfig::default()).await;
    assert_eq!(first.increase(1).await.unwrap(), 1);
    std::fs::write(hx.hosts[0].home.join("dirty"), "").unwrap();
    assert_eq!(
        first.decrease(&["web0-1".into()]).await.unwrap(),
        ["web0-1"]
    );
    wait_for(&first, "web0-1 gone", |s| s.is_empty()).await;
    // The dirty host never gets another job.
    assert_eq!(first.increase(1).await.unwrap(), 0);
    assert!(hx.hosts[0].home.join("dirty").exists());
    let state = std::fs::read_to_string(hx.state_dir().join("state.json")).unwrap();
    assert!(
        state.contains(r#""state": "failed""#)
            && state.contains("exit code 1")
            && state.contains("checking"),
        "{state}"
    );
    first.shutdown().await.unwrap();
    drop(first);

    // The operator fixes the host and restarts the plugin: the cleanup is retried.
    std::fs::write(hx.hosts[0].home.join("ok"), "").unwrap();
    let second = group(&config, &ConnectorConfig::default()).await;
    assert!(second.update().await.unwrap().is_empty());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while second.increase(1).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "host never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!hx.hosts[0].home.join("dirty").exists());
    assert_eq!(ids(&second.update().await.unwrap()), ["web0-2"]);
}

#[tokio::test]
async fn bad_configs_give_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(
        &key,
        "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n",
    )
    .unwrap();
    let not_key = dir.path().join("not_key");
    std::fs::write(&not_key, "hello").unwrap();
    let state = dir.path().join("state");
    let doc = |instances: &str| {
        format!(
            r#"{{"state_dir":"{}","instances":{{{instances}}}}}"#,
            state.display()
        )
    };
    let cases = [
        (doc(""), "instances: is empty"),
        (
            doc(r#""web1":{"internal_addr":"h","username":"ci","key_path":"/nonexistent/k"}"#),
            "instances.web1.key_path: file /nonexistent/k not readable",
        ),
        (
            doc(&format!(
                r#""web1":{{"internal_addr":"h","username":"ci","key_path":"{}"}}"#,
                not_key.display()
            )),
            "instances.web1.key_path: file",
        ),
        (
            doc(&format!(
                r#""web1":{{"internal_addr":"h","password":"pw","key_path":"{}"}}"#,
                key.display()
            )),
            "instances.web1: set password or key_path, not both",
        ),
        (
            doc(r#""web1":{"internal_addr":"h","password":"pw"}"#),
            "instances.web1.username: not set here nor in connector_config",
        ),
        (
            doc(r#""web1":{"internal_addr":"h","username":"ci"}"#),
            "instances.web1: no credentials",
        ),
        (
            doc(r#""web1":{"internal_addr":"h:99999","username":"ci","password":"pw"}"#),
            "instances.web1.internal_addr: bad port",
        ),
        (
            doc(r#""web1":{"host":"h"}"#),
            "instances.web1.host: unknown key",
        ),
        (
            r#"{"instances":{"a":{"internal_addr":"h","username":"u","password":"p"}},"state_dir":"/proc/nope"}"#
                .to_owned(),
            "state_dir: cannot create /proc/nope",
        ),
    ];
    for (config, want) in cases {
        let g = StaticGroup::default();
        let err = g
            .init(config.as_bytes(), &ConnectorConfig::default())
            .await
            .unwrap_err();
        assert!(matches!(err, GroupError::InvalidArgument(_)), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(want), "{config}\n  got: {msg}\n  want: {want}");
        assert!(!msg.contains("\"pw\""), "password leaked: {msg}");
    }

    // Calls before init, and a second init, are refused.
    let g = StaticGroup::default();
    assert!(matches!(
        g.update().await,
        Err(GroupError::FailedPrecondition(_))
    ));
    let ok = doc(r#""web1":{"internal_addr":"h","username":"ci","password":"pw"}"#);
    let info = g
        .init(ok.as_bytes(), &ConnectorConfig::default())
        .await
        .unwrap();
    assert_eq!((info.id.as_str(), info.max_size), ("static/default", 1));
    // The password is handed out, never shown in Debug output.
    assert!(!format!("{g:?}").contains("pw\""), "{g:?}");
    assert!(matches!(
        g.init(ok.as_bytes(), &ConnectorConfig::default()).await,
        Err(GroupError::FailedPrecondition(_))
    ));
    // An older plugin holding the state dir whole keeps this one out, naming the dir.
    drop(g);
    let dir = tempfile::tempdir().unwrap();
    let held = std::fs::File::create(dir.path().join("lock")).unwrap();
    let held = nix::fcntl::Flock::lock(held, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let in_dir = format!(
        r#"{{"state_dir":"{}","instances":{{"web1":{{"internal_addr":"h","username":"ci","password":"pw"}}}}}}"#,
        dir.path().display()
    );
    let err = StaticGroup::default()
        .init(in_dir.as_bytes(), &ConnectorConfig::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("state_dir") && err.contains("in use"), "{err}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_sharing_a_state_dir_never_lease_one_host_twice() {
    let hx = Hosts::start(3).await;
    let config = format!(
        r#"{{"name":"shared","state_dir":"{}","cleanup_command":"echo ok > cleaned",
            "instances":{{{},{},{}}}}}"#,
        hx.state_dir().display(),
        hx.entry(0),
        hx.entry(1),
        hx.entry(2)
    );
    let connector = ConnectorConfig {
        key: hx.key.clone(),
        ..ConnectorConfig::default()
    };
    // Two managers' plugins on one pool (a rolling upgrade), side by side.
    let old = group(&config, &connector).await;
    let new = group(&config, &connector).await;
    assert_eq!(old.increase(2).await.unwrap(), 2);
    // The new one sees the old one's leases and gets only the host left.
    assert_eq!(ids(&new.update().await.unwrap()), ["web0-1", "web1-2"]);
    assert_eq!(new.increase(3).await.unwrap(), 1);
    assert_eq!(old.increase(1).await.unwrap(), 0, "no host is leased twice");
    assert_eq!(
        ids(&old.update().await.unwrap()),
        ["web0-1", "web1-2", "web2-3"]
    );
    // A host one gives back is cleaned once, and free for both afterwards.
    assert_eq!(old.decrease(&["web0-1".into()]).await.unwrap(), ["web0-1"]);
    wait_for(&new, "web0 cleaned and free", |s| {
        s.iter().all(|(id, _)| id != "web0-1")
    })
    .await;
    assert_eq!(new.increase(1).await.unwrap(), 1);
    assert_eq!(
        ids(&old.update().await.unwrap()),
        ["web0-4", "web1-2", "web2-3"]
    );
    old.shutdown().await.unwrap();
    new.shutdown().await.unwrap();
}
