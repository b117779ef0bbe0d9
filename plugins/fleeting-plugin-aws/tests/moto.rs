//! The plugin in-process against a real moto server: lifecycle, capping, missing or deleted
//! groups, ASG replacements, wrong credentials, throttling and 5xx.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use anyhow::ensure;
use common::{ACCESS_KEY, Moto, Profile, SECRET_KEY};
use fleeting_plugin_aws::AwsGroup;
use slipway_fleeting::{ConnectorConfig, GroupError, InstanceGroup, State};
use slipway_testkit::aws_faults::{FaultKind, FaultProxy};

async fn init(moto_url: &str, name: &str) -> anyhow::Result<(AwsGroup, Profile)> {
    let profile = Profile::new(ACCESS_KEY, SECRET_KEY)?;
    let group = AwsGroup::default();
    group
        .init(
            &profile.plugin_config(name, moto_url),
            &ConnectorConfig::default(),
        )
        .await?;
    Ok((group, profile))
}

async fn states(group: &AwsGroup) -> anyhow::Result<BTreeMap<String, State>> {
    let list = group.update().await?;
    let map: BTreeMap<_, _> = list.iter().cloned().collect();
    ensure!(map.len() == list.len(), "an id listed twice: {list:?}");
    Ok(map)
}

fn with_state(map: &BTreeMap<String, State>, state: State) -> Vec<String> {
    map.iter()
        .filter(|(_, s)| **s == state)
        .map(|(id, _)| id.clone())
        .collect()
}

#[tokio::test]
async fn lifecycle_init_increase_connect_decrease_heartbeat() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    let asg = moto.create_group("ci", 5).await?;
    let profile = Profile::new(ACCESS_KEY, SECRET_KEY)?;
    let group = AwsGroup::default();
    let info = group
        .init(
            &profile.plugin_config("ci", &moto.url),
            &ConnectorConfig::default(),
        )
        .await?;
    assert_eq!(info.id, "aws/eu-west-1/ci");
    assert_eq!(info.max_size, 5);
    assert!(states(&group).await?.is_empty());

    assert_eq!(group.increase(3).await?, 3);
    assert_eq!(asg.describe().await?.0, 3, "desired capacity");
    let running = with_state(&states(&group).await?, State::Running);
    assert_eq!(running.len(), 3, "{running:?}");

    // Dynamic credentials: a fresh key pushed with EC2 Instance Connect, valid 60 s.
    let before = SystemTime::now();
    let ci = group.connect_info(&running[0]).await?;
    assert_eq!(ci.id, running[0]);
    assert_eq!(ci.connector.os, "linux");
    assert_eq!(ci.connector.protocol, "ssh");
    assert_eq!(ci.connector.username, "ec2-user");
    assert_eq!(ci.connector.arch, "amd64");
    assert!(ci.internal_addr.starts_with("10."), "{}", ci.internal_addr);
    assert!(!ci.external_addr.is_empty());
    let key = String::from_utf8(ci.connector.key.clone())?;
    russh::keys::decode_secret_key(&key, None)?;
    let expires = ci.expires.expect("expires set for a pushed key");
    assert!(expires > before && expires <= SystemTime::now() + Duration::from_secs(60));
    assert!(
        !format!("{ci:?}").contains("PRIVATE KEY"),
        "key masked in Debug"
    );
    let again = group.connect_info(&running[0]).await?;
    assert_ne!(again.connector.key, ci.connector.key, "a new key per call");

    let victim = running[0].clone();
    assert_eq!(
        group.decrease(std::slice::from_ref(&victim)).await?,
        vec![victim.clone()]
    );
    let (desired, members) = asg.describe().await?;
    assert_eq!(desired, 2, "desired capacity dropped");
    assert!(!members.contains(&victim));
    assert_eq!(asg.ec2_state(&victim).await?, "terminated");
    let after = states(&group).await?;
    assert_eq!(after.get(&victim), Some(&State::Deleted));
    assert_eq!(with_state(&after, State::Running).len(), 2);
    assert!(
        !states(&group).await?.contains_key(&victim),
        "reported deleted once"
    );

    group.heartbeat(&running[1]).await?;
    assert!(group.heartbeat(&victim).await.is_err());
    assert!(matches!(
        group.connect_info(&victim).await,
        Err(GroupError::NotFound(_))
    ));
    // Not a member: never terminated (could belong to another group).
    assert!(
        group
            .decrease(&["i-0123456789abcdef0".into()])
            .await?
            .is_empty()
    );
    group.shutdown().await?;
    assert_eq!(
        asg.describe().await?.0,
        2,
        "shutdown leaves the group alone"
    );
    Ok(())
}

#[tokio::test]
async fn static_credentials_are_passed_through() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    moto.create_group("static", 2).await?;
    let profile = Profile::new(ACCESS_KEY, SECRET_KEY)?;
    let group = AwsGroup::default();
    let connector = ConnectorConfig {
        username: "admin".into(),
        key: b"static key".to_vec(),
        use_static_credentials: true,
        ..ConnectorConfig::default()
    };
    group
        .init(&profile.plugin_config("static", &moto.url), &connector)
        .await?;
    group.increase(1).await?;
    let id = states(&group).await?.into_keys().next().unwrap();
    let ci = group.connect_info(&id).await?;
    assert_eq!(ci.connector.username, "admin");
    assert_eq!(ci.connector.os, "linux");
    assert_eq!(ci.connector.key, b"static key");
    assert_eq!(ci.expires, None);
    Ok(())
}

#[tokio::test]
async fn windows_instances_need_static_credentials() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    moto.create_group_with("win", 2, common::WINDOWS_AMI)
        .await?;
    let (dynamic, _p1) = init(&moto.url, "win").await?;
    dynamic.increase(1).await?;
    let id = states(&dynamic).await?.into_keys().next().unwrap();
    let err = dynamic.connect_info(&id).await.unwrap_err();
    assert!(matches!(err, GroupError::FailedPrecondition(_)), "{err}");
    assert!(err.to_string().contains("use_static_credentials"), "{err}");

    let profile = Profile::new(ACCESS_KEY, SECRET_KEY)?;
    let static_creds = AwsGroup::default();
    let connector = ConnectorConfig {
        username: "Administrator".into(),
        password: "secret".into(),
        use_static_credentials: true,
        ..ConnectorConfig::default()
    };
    static_creds
        .init(&profile.plugin_config("win", &moto.url), &connector)
        .await?;
    let ci = static_creds.connect_info(&id).await?;
    assert_eq!(ci.connector.os, "windows");
    assert_eq!(ci.connector.password, "secret");
    Ok(())
}

#[tokio::test]
async fn increase_is_capped_at_max_size() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    let asg = moto.create_group("capped", 4).await?;
    let (group, _profile) = init(&moto.url, "capped").await?;
    assert_eq!(group.increase(3).await?, 3);
    assert_eq!(group.increase(3).await?, 1, "only one more fits");
    assert_eq!(group.increase(1).await?, 0);
    assert_eq!(asg.describe().await?.0, 4);
    assert_eq!(states(&group).await?.len(), 4);
    Ok(())
}

#[tokio::test]
async fn missing_group_fails_init() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    let profile = Profile::new(ACCESS_KEY, SECRET_KEY)?;
    let err = AwsGroup::default()
        .init(
            &profile.plugin_config("nope", &moto.url),
            &ConnectorConfig::default(),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(r#"autoscaling group "nope" not found in region eu-west-1"#),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn bad_config_names_the_key() -> anyhow::Result<()> {
    let err = AwsGroup::default()
        .init(
            br#"{"name":"ci","regoin":"eu-west-1"}"#,
            &ConnectorConfig::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, GroupError::InvalidArgument(_)));
    assert!(err.to_string().contains("unknown key `regoin`"), "{err}");
    let err = AwsGroup::default()
        .init(b"{}", &ConnectorConfig::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`name`"), "{err}");
    Ok(())
}

#[tokio::test]
async fn group_deleted_midway_reports_instances_deleted() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    let asg = moto.create_group("doomed", 3).await?;
    let (group, _profile) = init(&moto.url, "doomed").await?;
    group.increase(2).await?;
    let ids: Vec<String> = states(&group).await?.into_keys().collect();
    assert_eq!(ids.len(), 2);
    asg.autoscaling
        .delete_auto_scaling_group()
        .auto_scaling_group_name("doomed")
        .force_delete(true)
        .send()
        .await?;
    let after = states(&group).await?;
    assert_eq!(with_state(&after, State::Deleted), ids, "{after:?}");
    assert!(states(&group).await?.is_empty(), "then gone, no error");
    assert!(
        group.increase(1).await.is_err(),
        "cannot scale a missing group"
    );
    Ok(())
}

#[tokio::test]
async fn instance_replaced_by_the_asg_is_deleted_and_new_one_listed() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    let asg = moto.create_group("healing", 3).await?;
    let (group, _profile) = init(&moto.url, "healing").await?;
    group.increase(2).await?;
    let before = with_state(&states(&group).await?, State::Running);
    assert_eq!(before.len(), 2);
    // What the ASG does with an unhealthy instance: terminate it, keep the desired capacity,
    // launch a replacement.
    asg.autoscaling
        .terminate_instance_in_auto_scaling_group()
        .instance_id(&before[0])
        .should_decrement_desired_capacity(false)
        .send()
        .await?;
    let after = states(&group).await?;
    assert_eq!(after.get(&before[0]), Some(&State::Deleted), "{after:?}");
    let running = with_state(&after, State::Running);
    assert_eq!(running.len(), 2, "{after:?}");
    assert!(running.contains(&before[1]));
    let after = states(&group).await?;
    assert_eq!(after.len(), 2, "replaced one reported once: {after:?}");
    Ok(())
}

#[tokio::test]
async fn wrong_credentials_fail_init_clearly() -> anyhow::Result<()> {
    // IAM auth on after the three setup actions that create the user and its key.
    let moto = Moto::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "3")]).await?;
    let (key_id, secret) = common::create_iam_key(&moto).await?;
    common::create_group(
        &moto.sdk(&key_id, &secret).await,
        "authed",
        2,
        common::LINUX_AMI,
    )
    .await?;

    let good = Profile::new(&key_id, &secret)?;
    AwsGroup::default()
        .init(
            &good.plugin_config("authed", &moto.url),
            &ConnectorConfig::default(),
        )
        .await?;

    for (id, secret, code) in [
        (key_id.as_str(), "wrong-secret", "SignatureDoesNotMatch"),
        ("AKIAUNKNOWNUNKNOWN00", "whatever", "InvalidClientTokenId"),
    ] {
        let bad = Profile::new(id, secret)?;
        let err = AwsGroup::default()
            .init(
                &bad.plugin_config("authed", &moto.url),
                &ConnectorConfig::default(),
            )
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("DescribeAutoScalingGroups") && text.contains(code),
            "{text}"
        );
        assert!(!text.contains(secret), "the secret is never shown: {text}");
    }
    Ok(())
}

#[tokio::test]
async fn throttling_and_5xx_are_retried() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    moto.create_group("flaky", 3).await?;
    let proxy = FaultProxy::start(&moto.url).await?;
    proxy.fail("DescribeAutoScalingGroups", FaultKind::Throttle, Some(2));
    proxy.fail("SetDesiredCapacity", FaultKind::Unavailable, Some(2));
    proxy.fail("DescribeInstances", FaultKind::Throttle, Some(1));
    let (group, _profile) = init(&proxy.url, "flaky").await?;
    assert_eq!(
        proxy.hits("DescribeAutoScalingGroups"),
        3,
        "two throttled, then through"
    );
    assert_eq!(group.increase(2).await?, 2);
    assert_eq!(
        proxy.hits("SetDesiredCapacity"),
        3,
        "two 503s, then through"
    );
    assert_eq!(with_state(&states(&group).await?, State::Running).len(), 2);
    assert_eq!(proxy.hits("DescribeInstances"), 2);
    Ok(())
}

#[tokio::test]
async fn no_capacity_is_a_capacity_error_the_runner_can_tell_apart() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    moto.create_group("spot", 3).await?;
    let proxy = FaultProxy::start(&moto.url).await?;
    let (group, _profile) = init(&proxy.url, "spot").await?;
    proxy.fail("SetDesiredCapacity", FaultKind::NoCapacity, Some(1));
    let err = group.increase(1).await.unwrap_err();
    assert!(
        matches!(&err, slipway_fleeting::GroupError::Capacity(m) if m.contains("InsufficientInstanceCapacity")),
        "{err:?}"
    );
    assert_eq!(proxy.hits("SetDesiredCapacity"), 1, "not retried");
    // (Over the plugin boundary it is gRPC RESOURCE_EXHAUSTED: `convert::errors_round_trip`.)
    // Capacity comes back: the next Increase goes through.
    assert_eq!(group.increase(1).await?, 1);
    Ok(())
}

#[tokio::test]
async fn persistent_faults_fail_with_a_clear_error() -> anyhow::Result<()> {
    let moto = Moto::start().await?;
    moto.create_group("down", 3).await?;
    let proxy = FaultProxy::start(&moto.url).await?;
    let (group, _profile) = init(&proxy.url, "down").await?;
    let before = proxy.hits("DescribeAutoScalingGroups");
    proxy.fail("DescribeAutoScalingGroups", FaultKind::Unavailable, None);
    let err = group.update().await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("DescribeAutoScalingGroups") && text.contains("ServiceUnavailable"),
        "{text}"
    );
    assert_eq!(
        proxy.hits("DescribeAutoScalingGroups") - before,
        fleeting_plugin_aws::aws::MAX_ATTEMPTS,
        "every attempt used"
    );
    // Recovers once the service does.
    proxy.heal();
    assert!(states(&group).await?.is_empty());
    Ok(())
}

/// Log lines written through a `tracing` subscriber, for checking warnings.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

#[tokio::test]
async fn init_warns_when_scale_in_protection_is_off() -> anyhow::Result<()> {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    // The test runtime is single-threaded: every event of the test lands here.
    let _guard = tracing::subscriber::set_default(subscriber);

    let moto = Moto::start().await?;
    let asg = moto.create_group("guarded", 2).await?;
    asg.autoscaling
        .suspend_processes()
        .auto_scaling_group_name("guarded")
        .scaling_processes("AZRebalance")
        .send()
        .await?;
    init(&moto.url, "guarded").await?;
    let text = logs.take();
    assert!(
        !text.contains("WARN"),
        "recommended settings: no warning: {text}"
    );
    assert!(!text.contains(SECRET_KEY), "credentials never logged");

    asg.autoscaling
        .update_auto_scaling_group()
        .auto_scaling_group_name("guarded")
        .new_instances_protected_from_scale_in(false)
        .send()
        .await?;
    init(&moto.url, "guarded").await?;
    let text = logs.take();
    assert!(
        text.contains("WARN") && text.contains("scale-in protection is off"),
        "{text}"
    );
    Ok(())
}

/// A spot group whose every scale-up is refused (`InsufficientInstanceCapacity`, through the
/// fault proxy) and an on-demand group, each behind its own taskscaler: a job waiting on spot
/// moves to on-demand once the refusals have lasted `fallback_after`, and new capacity comes
/// back to spot after a quiet period.
#[tokio::test]
async fn spot_without_capacity_falls_back_to_on_demand_and_returns() -> anyhow::Result<()> {
    use slipway_taskscaler::{Config, Fallback, Placement, Policy, Shape, Taskscaler};
    use std::sync::Arc;

    let moto = Moto::start().await?;
    let spot_asg = moto.create_group("spot", 4).await?;
    let on_demand_asg = moto.create_group("on-demand", 4).await?;
    let proxy = FaultProxy::start(&moto.url).await?;
    let profile = Profile::new(ACCESS_KEY, SECRET_KEY)?;
    let spot = Arc::new(AwsGroup::default());
    let spot_info = spot
        .init(
            &profile.plugin_config("spot", &proxy.url),
            &ConnectorConfig::default(),
        )
        .await?;
    let on_demand = Arc::new(AwsGroup::default());
    let on_demand_info = on_demand
        .init(
            &profile.plugin_config("on-demand", &moto.url),
            &ConnectorConfig::default(),
        )
        .await?;
    proxy.fail("SetDesiredCapacity", FaultKind::NoCapacity, None);

    let cfg = Config {
        capacity_per_instance: 1,
        max_instances: 4,
        policies: vec![Policy {
            idle_time: Duration::from_secs(600),
            ..Policy::default()
        }],
        instance_acquire_timeout: Duration::from_secs(60),
        update_interval: Duration::from_secs(1),
        update_interval_when_expecting: Duration::from_millis(200),
        delete_instances_on_shutdown: true,
        shutdown_deletion_interval: Duration::from_millis(200),
        instance_cost: 1.0,
        ..Config::default()
    };
    let after = Duration::from_secs(2);
    let quiet = Duration::from_secs(3);
    let placement = Placement::new(vec![
        Shape {
            name: "spot".into(),
            scaler: Taskscaler::start(
                spot.clone(),
                spot_info,
                Config {
                    instance_cost: 0.3,
                    ..cfg.clone()
                },
            )?,
        },
        Shape {
            name: "on-demand".into(),
            scaler: Taskscaler::start(on_demand.clone(), on_demand_info, cfg)?,
        },
    ])
    .with_spot(0)
    .with_fallback(
        0,
        Fallback {
            to: 1,
            after,
            return_after: quiet,
        },
    );
    let job = slipway_taskscaler::Resources::default();

    let asked = std::time::Instant::now();
    placement.reserve("a", &job)?;
    assert_eq!(placement.shape_of("a").unwrap().name, "spot");
    let a = placement.acquire("a").await?;
    let waited = asked.elapsed();
    assert_eq!(placement.shape_of("a").unwrap().name, "on-demand");
    assert!(waited >= after, "moved after {waited:?}");
    assert!(
        proxy.hits("SetDesiredCapacity") >= 2,
        "spot was asked again"
    );
    let refusals = placement.shapes()[0].scaler.capacity_refusals();
    assert!(refusals.count >= 2, "{refusals:?}");
    assert_eq!(
        on_demand_asg.describe().await?.1,
        vec![a.instance_id.clone()]
    );
    assert_eq!(spot_asg.describe().await?.0, 0, "no spot instance was made");

    // Capacity is back on spot; once the quiet period has passed, new capacity goes there.
    proxy.heal();
    tokio::time::sleep(quiet + Duration::from_millis(500)).await;
    placement.reserve("b", &job)?;
    assert_eq!(placement.shape_of("b").unwrap().name, "spot");
    let b = placement.acquire("b").await?;
    assert_eq!(spot_asg.describe().await?.1, vec![b.instance_id.clone()]);

    placement.release("a");
    placement.release("b");
    placement.shutdown().await;
    assert_eq!(spot_asg.describe().await?.0, 0, "spot instance deleted");
    assert_eq!(
        on_demand_asg.describe().await?.0,
        0,
        "on-demand instance deleted"
    );
    Ok(())
}

/// Two managers on one Auto Scaling group sharing one state store (a rolling upgrade): the new
/// one neither removes nor uses the old one's instances while it runs, and adopts them once the
/// old one stops and gives them up.
#[tokio::test]
async fn two_managers_on_one_group_keep_to_their_own_instances() -> anyhow::Result<()> {
    use slipway_taskscaler::{AsyncStateStore, Config, Options, Policy, StoreIdentity, Taskscaler};
    use std::sync::Arc;

    let moto = Moto::start().await?;
    let asg = moto.create_group("shared", 6).await?;
    let profile = Profile::new(ACCESS_KEY, SECRET_KEY)?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.sqlite");
    let cfg = |delete: bool| Config {
        capacity_per_instance: 1,
        max_instances: 6,
        policies: vec![Policy {
            idle_time: Duration::from_secs(600),
            ..Policy::default()
        }],
        instance_acquire_timeout: Duration::from_secs(60),
        update_interval: Duration::from_millis(500),
        update_interval_when_expecting: Duration::from_millis(200),
        delete_instances_on_shutdown: delete,
        shutdown_deletion_interval: Duration::from_millis(200),
        ..Config::default()
    };
    let manager = |delete: bool| {
        let (path, profile, url) = (path.clone(), &profile, moto.url.clone());
        let cfg = cfg(delete);
        async move {
            let group = Arc::new(AwsGroup::default());
            let info = group
                .init(
                    &profile.plugin_config("shared", &url),
                    &ConnectorConfig::default(),
                )
                .await?;
            let identity = StoreIdentity {
                runner: "runner".into(),
                plugin: "aws".into(),
                group_id: info.id.clone(),
            };
            let store = AsyncStateStore::open(&path, &identity).await?;
            let ts = Taskscaler::start_with(
                group,
                info,
                cfg,
                Options {
                    store: Some(store.clone()),
                    ..Options::default()
                },
            )?;
            anyhow::Ok((ts, store))
        }
    };

    let (old, old_store) = manager(false).await?;
    old.reserve("a")?;
    let a = old.acquire("a").await?;
    old.reserve("b")?;
    let b = old.acquire("b").await?;
    assert_eq!(asg.describe().await?.0, 2);

    let (new, new_store) = manager(true).await?;
    new.restored().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        new.stats().instances,
        0,
        "the old manager's instances are not the new one's"
    );
    new.reserve("c")?;
    let c = new.acquire("c").await?;
    assert!(c.instance_id != a.instance_id && c.instance_id != b.instance_id);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (desired, ids) = asg.describe().await?;
    assert_eq!(desired, 3, "{ids:?}");
    assert!(!a.instance_lost().is_cancelled() && !b.instance_lost().is_cancelled());
    assert_eq!(
        old.stats().instances,
        2,
        "the new manager's instance is not the old one's"
    );

    // The old manager drains and stops without deleting: the new one adopts its instances.
    old.release("a");
    old.release("b");
    old.shutdown().await;
    old_store.close().await;
    let mut seen = 0;
    for _ in 0..50 {
        seen = new.stats().instances;
        if seen == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen, 3, "adopted: {:?}", new.instances());
    new.reserve("d")?;
    let d = new.acquire("d").await?;
    assert!(
        d.instance_id == a.instance_id || d.instance_id == b.instance_id,
        "{d:?}"
    );
    new.release("c");
    new.release("d");
    new.shutdown().await;
    new_store.close().await;
    assert_eq!(
        asg.describe().await?.0,
        0,
        "every instance deleted by its owner in the end"
    );
    Ok(())
}
