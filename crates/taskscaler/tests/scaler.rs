//! The taskscaler loop against an in-memory instance group (a unit layer beside the real
//! plugin-process tests in `crates/slipway/tests`).

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use async_trait::async_trait;
use common::Memory;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use slipway_fleeting::{ConnectInfo, ProviderInfo, State};
use slipway_taskscaler::{Config, Error, InstanceHooks, Options, Policy, Taskscaler};

fn cfg(cap: u32, max_instances: u32, max_use: u32) -> Config {
    Config {
        capacity_per_instance: cap,
        max_instances,
        max_use_count: max_use,
        policies: vec![Policy {
            idle_time: Duration::from_secs(600),
            ..Policy::default()
        }],
        instance_acquire_timeout: Duration::from_secs(10),
        update_interval: Duration::from_millis(50),
        update_interval_when_expecting: Duration::from_millis(10),
        delete_instances_on_shutdown: true,
        shutdown_deletion_interval: Duration::from_millis(50),
        ..Config::default()
    }
}

#[tokio::test]
async fn packs_two_jobs_on_one_instance_and_refuses_beyond_capacity() {
    let group = Arc::new(Memory::default());
    let ts =
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(2, 1, 0)).expect("start");
    ts.reserve("a").expect("a");
    ts.reserve("b").expect("b");
    assert!(matches!(ts.reserve("c"), Err(Error::NoCapacity(2))));
    let a = ts.acquire("a").await.expect("acquire a");
    let b = ts.acquire("b").await.expect("acquire b");
    assert_eq!(a.instance_id, b.instance_id);
    assert_ne!(a.slot, b.slot);
    ts.release("a");
    ts.reserve("c").expect("capacity back after release");
    ts.shutdown().await;
    assert!(
        group.instances.lock().expect("lock").is_empty(),
        "deleted on shutdown"
    );
}

#[tokio::test]
async fn max_use_count_one_gives_every_job_a_fresh_instance() {
    let group = Arc::new(Memory::default());
    let ts =
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(1, 2, 1)).expect("start");
    let mut seen = Vec::new();
    for key in ["j1", "j2", "j3", "j4"] {
        ts.reserve(key).expect("reserve");
        let acq = ts.acquire(key).await.expect("acquire");
        assert!(
            !seen.contains(&acq.instance_id),
            "{} reused",
            acq.instance_id
        );
        seen.push(acq.instance_id.clone());
        ts.release(key);
    }
    // Used-up instances are removed once free.
    tokio::time::timeout(Duration::from_secs(5), async {
        while group.decreased.lock().expect("lock").len() < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("used-up instances removed");
    ts.shutdown().await;
}

#[tokio::test]
async fn reservations_beyond_capacity_and_unknown_keys_are_refused() {
    let group = Arc::new(Memory::default());
    let ts =
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(1, 1, 0)).expect("start");
    ts.reserve("a").expect("a");
    let _a = ts.acquire("a").await.expect("a");
    // max_capacity is 1: a second reservation is refused outright.
    assert!(matches!(ts.reserve("b"), Err(Error::NoCapacity(1))));
    assert!(matches!(
        ts.acquire("zzz").await,
        Err(Error::NotReserved(_))
    ));
    ts.shutdown().await;
}

#[tokio::test]
async fn instance_that_vanishes_cancels_its_acquisition() {
    let group = Arc::new(Memory::default());
    let ts =
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(1, 1, 0)).expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    let lost = a.instance_lost();
    group.instances.lock().expect("lock").clear();
    tokio::time::timeout(Duration::from_secs(5), lost.cancelled())
        .await
        .expect("acquisition told the instance is gone");
    ts.shutdown().await;
}

#[tokio::test]
async fn an_instance_failing_under_a_job_tells_the_job_before_it_is_deleted() {
    let group = Arc::new(Memory::default());
    // The deletion takes a while (the plugin kills the instance's processes first): the
    // instance stays listed after the Decrease.
    *group.ignore_decreases.lock().expect("lock") = 1;
    let mut c = cfg(1, 2, 0);
    c.deletion_retry_interval = Duration::from_secs(600);
    let ts = Taskscaler::start(group.clone(), ProviderInfo::default(), c).expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    let lost = a.instance_lost();
    for (id, state) in group.instances.lock().expect("lock").iter_mut() {
        if *id == a.instance_id {
            *state = State::Timeout;
        }
    }
    tokio::time::timeout(Duration::from_secs(5), lost.cancelled())
        .await
        .expect("the job is told its failed instance is being removed");
    // Its slot is never handed out again, even once the job lets it go.
    ts.release("a");
    for (id, state) in group.instances.lock().expect("lock").iter_mut() {
        if *id == a.instance_id {
            *state = State::Running;
        }
    }
    ts.reserve("b").expect("b");
    let b = ts.acquire("b").await.expect("b");
    assert_ne!(b.instance_id, a.instance_id);
    assert!(!b.instance_lost().is_cancelled());
    ts.shutdown().await;
}

#[tokio::test]
async fn preexisting_instances_are_removed_not_used() {
    let group = Arc::new(Memory::default());
    group
        .instances
        .lock()
        .expect("lock")
        .push(("old".into(), State::Running));
    let ts =
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(1, 2, 0)).expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    assert_ne!(a.instance_id, "old");
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&"old".to_string())
    );
    ts.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn idle_instances_go_after_idle_time_but_idle_count_stays() {
    let group = Arc::new(Memory::default());
    let mut c = cfg(1, 0, 0);
    c.policies = vec![Policy {
        idle_count: 1,
        idle_time: Duration::from_secs(600),
        // Jobs here arrive with no idle slot to wait for: request them anyway.
        preemptive_mode: Some(false),
        ..Policy::default()
    }];
    c.update_interval = Duration::from_secs(1);
    let ts = Taskscaler::start(group.clone(), ProviderInfo::default(), c).expect("start");
    for key in ["a", "b"] {
        ts.reserve(key).expect("reserve");
    }
    let a = ts.acquire("a").await.expect("a");
    let b = ts.acquire("b").await.expect("b");
    assert_ne!(a.instance_id, b.instance_id);
    ts.release("a");
    ts.release("b");
    let count = || group.instances.lock().expect("lock").len();
    // On tokio's paused clock: nine minutes idle keeps both (plus the idle target).
    tokio::time::sleep(Duration::from_secs(540)).await;
    assert!(count() >= 2, "removed before idle_time: {}", count());
    // Past idle_time, only what idle_count needs (one slot) remains.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(count(), 1, "idle_count = 1 keeps exactly one instance");
    ts.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_deletion_that_had_no_effect_is_retried() {
    let group = Arc::new(Memory::default());
    *group.ignore_decreases.lock().expect("lock") = 1;
    let mut c = cfg(1, 0, 1);
    c.update_interval = Duration::from_secs(1);
    c.deletion_retry_interval = Duration::from_secs(30);
    let ts = Taskscaler::start(group.clone(), ProviderInfo::default(), c).expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    ts.release("a");
    // The first Decrease is swallowed: the used-up instance is still there a bit later...
    tokio::time::sleep(Duration::from_secs(5)).await;
    let listed = |id: &str| {
        group
            .instances
            .lock()
            .expect("lock")
            .iter()
            .any(|(i, _)| i == id)
    };
    assert!(listed(&a.instance_id));
    // ...and asked for again after deletion_retry_interval.
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert!(!listed(&a.instance_id), "deletion was not retried");
    ts.shutdown().await;
}

#[tokio::test]
async fn a_failed_first_update_does_not_turn_new_instances_into_orphans() {
    let group = Arc::new(Memory::default());
    *group.failing_updates.lock().expect("lock") = 2;
    let ts =
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(1, 2, 0)).expect("start");
    ts.reserve("a").expect("a");
    let a = ts
        .acquire("a")
        .await
        .expect("acquire after the plugin recovers");
    assert!(
        group.decreased.lock().expect("lock").is_empty(),
        "own instance removed as pre-existing"
    );
    assert_eq!(
        group.instances.lock().expect("lock").len(),
        1,
        "scaled up exactly once"
    );
    drop(a);
    ts.shutdown().await;
}

/// Hooks that fail for chosen instances.
#[derive(Default)]
struct Checks {
    not_ready: Mutex<Vec<String>>,
    dead: Mutex<Vec<String>>,
    heartbeats: Mutex<Vec<String>>,
}

#[async_trait]
impl InstanceHooks for Checks {
    async fn ready(&self, info: &ConnectInfo) -> Result<(), String> {
        if self
            .not_ready
            .lock()
            .map_err(|e| e.to_string())?
            .contains(&info.id)
        {
            return Err("ready command exited 1".into());
        }
        Ok(())
    }
    async fn heartbeat(&self, info: &ConnectInfo) -> Result<(), String> {
        self.heartbeats
            .lock()
            .map_err(|e| e.to_string())?
            .push(info.id.clone());
        if self
            .dead
            .lock()
            .map_err(|e| e.to_string())?
            .contains(&info.id)
        {
            return Err("ssh: connection refused".into());
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn failing_heartbeats_replace_the_instance_and_the_job_moves_on() {
    let group = Arc::new(Memory::default());
    let checks = Arc::new(Checks::default());
    checks.dead.lock().expect("lock").push("i1".into());
    let mut c = cfg(1, 0, 0);
    c.failure_threshold = 2;
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        c,
        Options {
            hooks: Some(checks.clone()),
            ..Options::default()
        },
    )
    .expect("start");
    ts.reserve("a").expect("a");
    let a = ts
        .acquire("a")
        .await
        .expect("acquired on a healthy instance");
    assert_ne!(
        a.instance_id, "i1",
        "the dead instance must not be handed out"
    );
    // i1 failed its heartbeat (once per try until condemned at the threshold)...
    let beats = checks.heartbeats.lock().expect("lock").clone();
    assert!(
        beats.iter().filter(|b| *b == "i1").count() >= 1,
        "{beats:?}"
    );
    // ...and is removed once its failures reach failure_threshold.
    tokio::time::sleep(Duration::from_secs(5)).await;
    ts.reserve("b").expect("b");
    let _b = ts.acquire("b").await.expect("b");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&"i1".to_string()),
        "unhealthy instance not removed; heartbeats {:?}",
        checks.heartbeats.lock().expect("lock")
    );
    ts.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_failing_its_ready_command_is_removed_and_never_used() {
    let group = Arc::new(Memory::default());
    let checks = Arc::new(Checks::default());
    checks.not_ready.lock().expect("lock").push("i1".into());
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        cfg(1, 0, 0),
        Options {
            hooks: Some(checks.clone()),
            ..Options::default()
        },
    )
    .expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("acquire");
    assert_ne!(a.instance_id, "i1");
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&"i1".to_string())
    );
    ts.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn preemptive_mode_reserves_only_with_a_ready_idle_slot() {
    let group = Arc::new(Memory::default());
    let mut c = cfg(1, 0, 0);
    c.policies = vec![Policy {
        idle_count: 1,
        idle_time: Duration::from_secs(600),
        ..Policy::default()
    }];
    let ts = Taskscaler::start(group.clone(), ProviderInfo::default(), c).expect("start");
    // Nothing is running yet: a preemptive runner does not ask for a job.
    assert!(matches!(ts.reserve("a"), Err(Error::NoIdleCapacity(_))));
    // idle_count = 1 brings one instance up; then exactly one reservation fits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ts.reserve("a").expect("idle slot ready");
    assert!(matches!(ts.reserve("b"), Err(Error::NoIdleCapacity(_))));
    let _a = ts.acquire("a").await.expect("a");
    // The taken slot is replaced to keep idle_count, and then b fits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ts.reserve("b").expect("replacement idle slot");
    ts.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn scale_throttle_limits_creations_per_second() {
    let group = Arc::new(Memory::default());
    let mut c = cfg(1, 0, 0);
    c.scale_throttle = slipway_taskscaler::ScaleThrottle {
        limit: Some(1.0),
        burst: 2,
    };
    c.reservation_throttling = false;
    let ts = Taskscaler::start(group.clone(), ProviderInfo::default(), c).expect("start");
    for i in 0..10 {
        ts.reserve(&format!("j{i}")).expect("reserve");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let early = group.instances.lock().expect("lock").len();
    assert_eq!(early, 2, "burst of 2 at once");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later = group.instances.lock().expect("lock").len();
    assert!(
        (5..=7).contains(&later),
        "about one more per second: {later}"
    );
    ts.shutdown().await;
}

fn identity() -> slipway_taskscaler::StoreIdentity {
    slipway_taskscaler::StoreIdentity {
        runner: "test-runner".into(),
        plugin: "memory".into(),
        group_id: "memory/test".into(),
    }
}

#[tokio::test]
async fn restart_adopts_known_instances_fails_interrupted_jobs_and_respects_max_use_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.sqlite");
    let group = Arc::new(Memory::default());
    let c = cfg(1, 2, 2);

    // First manager: job a runs and ends on one instance; job b is running on another when the
    // manager dies.
    let store = slipway_taskscaler::AsyncStateStore::open(&path, &identity())
        .await
        .expect("open");
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        c.clone(),
        Options {
            store: Some(store.clone()),
            ..Options::default()
        },
    )
    .expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    ts.reserve("b").expect("b");
    let b = ts.acquire("b").await.expect("b");
    assert_ne!(a.instance_id, b.instance_id);
    ts.release("a");
    // Killed: no shutdown, no deletion. The store file is what survives.
    drop(ts);
    store.close().await;

    let store = slipway_taskscaler::AsyncStateStore::open(&path, &identity())
        .await
        .expect("reopen");
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        c,
        Options {
            store: Some(store.clone()),
            ..Options::default()
        },
    )
    .expect("restart");
    // The interrupted job is reported, and b's instance (it held an acquisition) is removed.
    ts.reserve("c").expect("c");
    let cjob = ts.acquire("c").await.expect("c");
    let failed = ts.take_restored_failures();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].key, "b");
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&b.instance_id)
    );
    // a's instance was adopted with its use count (1 of 2): c lands on it, and after c it is
    // used up and removed rather than used a third time.
    assert_eq!(cjob.instance_id, a.instance_id, "known instance adopted");
    ts.release("c");
    ts.reserve("d").expect("d");
    let d = ts.acquire("d").await.expect("d");
    assert_ne!(
        d.instance_id, a.instance_id,
        "max_use_count = 2 exceeded after restart"
    );
    ts.shutdown().await;
    store.close().await;
}

#[tokio::test]
async fn without_state_every_instance_found_at_start_is_removed() {
    let group = Arc::new(Memory::default());
    group
        .instances
        .lock()
        .expect("lock")
        .push(("stray".into(), State::Running));
    let dir = tempfile::tempdir().expect("tempdir");
    let store = slipway_taskscaler::AsyncStateStore::open(dir.path().join("s.sqlite"), &identity())
        .await
        .expect("open");
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        cfg(1, 2, 0),
        Options {
            store: Some(store.clone()),
            ..Options::default()
        },
    )
    .expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    assert_ne!(a.instance_id, "stray");
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&"stray".to_string())
    );
    ts.shutdown().await;
    store.close().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_whose_deletion_is_retried_takes_no_new_job() {
    let group = Arc::new(Memory::default());
    *group.ignore_decreases.lock().expect("lock") = 1;
    // max_instances = 1: while the old instance is listed, no new one can come.
    let mut c = cfg(1, 1, 0);
    c.policies = vec![Policy {
        idle_time: Duration::from_secs(1),
        ..Policy::default()
    }];
    c.update_interval = Duration::from_secs(1);
    c.deletion_retry_interval = Duration::from_secs(30);
    c.instance_acquire_timeout = Duration::from_secs(120);
    let ts = Taskscaler::start(group.clone(), ProviderInfo::default(), c).expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    ts.release("a");
    // Idle past idle_time: removed, but the cloud swallows the first Decrease.
    tokio::time::sleep(Duration::from_secs(10)).await;
    // A job arrives and waits; when the deletion is retried it must not be handed the instance
    // that is on its way out, but the fresh one that replaces it.
    ts.reserve("b").expect("b");
    let b = ts.acquire("b").await.expect("b");
    assert_ne!(
        b.instance_id, a.instance_id,
        "job placed on an instance being deleted"
    );
    ts.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_that_vanishes_and_returns_is_not_used_again() {
    let group = Arc::new(Memory::default());
    let mut c = cfg(1, 0, 1);
    c.policies = vec![Policy {
        idle_time: Duration::from_secs(600),
        ..Policy::default()
    }];
    c.update_interval = Duration::from_secs(1);
    let ts = Taskscaler::start(group.clone(), ProviderInfo::default(), c).expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    // The listing flaps: the instance is missing from one Update, then back.
    let saved = std::mem::take(&mut *group.instances.lock().expect("lock"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    group.instances.lock().expect("lock").extend(saved);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Its use count (1 of max_use_count 1) was lost with it: it is removed, not reused.
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&a.instance_id),
        "returned instance not removed"
    );
    ts.release("a");
    ts.reserve("b").expect("b");
    let b = ts.acquire("b").await.expect("b");
    assert_ne!(b.instance_id, a.instance_id);
    ts.shutdown().await;
}

#[tokio::test]
async fn reserve_wait_gets_the_slot_a_release_frees() {
    let group = Arc::new(Memory::default());
    let ts = Arc::new(
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(1, 1, 0)).expect("start"),
    );
    ts.reserve("a").expect("a");
    let waiting = {
        let ts = ts.clone();
        tokio::spawn(async move { ts.reserve_wait("b").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "b must wait while a holds the only slot"
    );
    ts.unreserve("a");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("b reserved after the release")
        .expect("task")
        .expect("reserve");
    ts.shutdown().await;
}

#[tokio::test]
async fn expiring_credentials_are_fetched_again_before_use() {
    for (expires_in, fetched_again) in [(3600, false), (30, true)] {
        let group = Arc::new(Memory::default());
        *group.expires_in.lock().unwrap() = Some(Duration::from_secs(expires_in));
        let ts =
            Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(1, 1, 0)).expect("start");
        ts.reserve("a").expect("a");
        ts.acquire("a").await.expect("a");
        ts.release("a");
        let before = *group.connect_calls.lock().unwrap();
        ts.reserve("b").expect("b");
        let b = ts.acquire("b").await.expect("b");
        assert!(b.connect_info.expires.is_some());
        let after = *group.connect_calls.lock().unwrap();
        assert_eq!(
            after > before,
            fetched_again,
            "credentials valid for {expires_in}s: calls {before} -> {after}"
        );
        ts.shutdown().await;
    }
}

/// Ready hook that never finishes for one instance.
struct StuckReady {
    stuck: String,
}

#[async_trait]
impl InstanceHooks for StuckReady {
    async fn ready(&self, info: &ConnectInfo) -> Result<(), String> {
        if info.id == self.stuck {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
    async fn heartbeat(&self, _: &ConnectInfo) -> Result<(), String> {
        Ok(())
    }
}

#[tokio::test]
async fn a_hanging_ready_command_holds_up_only_its_own_instance() {
    let group = Arc::new(Memory::default());
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        cfg(1, 2, 0),
        Options {
            hooks: Some(Arc::new(StuckReady { stuck: "i1".into() })),
            ..Options::default()
        },
    )
    .expect("start");
    ts.reserve("a").expect("a");
    ts.reserve("b").expect("b");
    // i1's ready command never returns; i2 is created and used all the same.
    let b = ts
        .acquire("b")
        .await
        .expect("b gets the instance that became ready");
    assert_eq!(b.instance_id, "i2");
    assert_eq!(group.instances.lock().unwrap().len(), 2);
    // Shutdown is not held up by the hanging check either.
    tokio::time::timeout(Duration::from_secs(10), ts.shutdown())
        .await
        .expect("shutdown with a check in flight");
}

#[tokio::test]
async fn a_whole_instance_job_takes_every_slot_of_a_fresh_instance_which_goes_after_it() {
    let group = Arc::new(Memory::default());
    let ts =
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(3, 3, 0)).expect("start");
    // A used instance, idle again with every slot free, is not fresh: the whole-instance job
    // gets another.
    ts.reserve("small").expect("small");
    let small = ts.acquire("small").await.expect("acquire small");
    ts.release("small");
    let none = slipway_taskscaler::Resources::default();
    ts.reserve_instance("whole", &none).expect("whole");
    let whole = ts.acquire("whole").await.expect("acquire whole");
    assert_ne!(whole.instance_id, small.instance_id);
    assert_eq!((whole.slot, whole.slots), (0, 3), "every slot is the job's");
    // Nothing else lands on it while it runs, even with room elsewhere used up.
    ts.reserve("next").expect("next");
    let next = ts.acquire("next").await.expect("acquire next");
    assert_ne!(next.instance_id, whole.instance_id);
    ts.release("whole");
    // Removed after its job although max_use_count is 0 (unlimited) and idle_time is long.
    tokio::time::timeout(Duration::from_secs(5), async {
        while !group
            .decreased
            .lock()
            .expect("lock")
            .contains(&whole.instance_id)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the whole-instance job's instance is removed");
    assert!(
        !group
            .decreased
            .lock()
            .expect("lock")
            .contains(&small.instance_id),
        "the shared instance stays"
    );
    assert_eq!(
        next.instance_id, small.instance_id,
        "shared jobs pack on the used one"
    );
    ts.release("next");
    ts.shutdown().await;
}

#[tokio::test]
async fn concurrent_whole_instance_jobs_never_share_an_instance() {
    let group = Arc::new(Memory::default());
    let ts = Arc::new(
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(2, 4, 0)).expect("start"),
    );
    let none = slipway_taskscaler::Resources::default();
    let mut tasks = Vec::new();
    for key in ["w1", "w2", "w3"] {
        let ts = ts.clone();
        ts.reserve_instance(key, &none).expect("reserve");
        tasks.push(tokio::spawn(async move {
            ts.acquire(key).await.expect("acquire").instance_id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("task"));
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "three jobs, three instances: {ids:?}");
    for key in ["w1", "w2", "w3"] {
        ts.release(key);
    }
    tokio::time::timeout(Duration::from_secs(5), async {
        while group.decreased.lock().expect("lock").len() < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("all three removed after their jobs");
    ts.shutdown().await;
}

#[tokio::test]
async fn a_whole_instance_interrupted_by_a_restart_is_deleted_even_when_instances_are_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.sqlite");
    let group = Arc::new(Memory::default());
    let c = cfg(2, 3, 0);
    let options = |store: &slipway_taskscaler::AsyncStateStore| Options {
        store: Some(store.clone()),
        keep_instance_with_acquisitions: true,
        ..Options::default()
    };
    let store = slipway_taskscaler::AsyncStateStore::open(&path, &identity())
        .await
        .expect("open");
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        c.clone(),
        options(&store),
    )
    .expect("start");
    let none = slipway_taskscaler::Resources::default();
    ts.reserve("shared").expect("shared");
    let shared = ts.acquire("shared").await.expect("shared");
    ts.reserve_instance("whole", &none).expect("whole");
    let whole = ts.acquire("whole").await.expect("whole");
    assert_ne!(shared.instance_id, whole.instance_id);
    // Killed mid-job: the store file is what survives.
    drop(ts);
    store.close().await;

    let store = slipway_taskscaler::AsyncStateStore::open(&path, &identity())
        .await
        .expect("reopen");
    let ts = Taskscaler::start_with(group.clone(), ProviderInfo::default(), c, options(&store))
        .expect("restart");
    ts.reserve("next").expect("next");
    let next = ts.acquire("next").await.expect("next");
    assert_eq!(
        next.instance_id, shared.instance_id,
        "the shared instance is kept (keep_instance_with_acquisitions)"
    );
    let failed: Vec<String> = ts
        .take_restored_failures()
        .into_iter()
        .map(|f| f.key)
        .collect();
    assert!(failed.contains(&"whole".to_string()), "{failed:?}");
    tokio::time::timeout(Duration::from_secs(5), async {
        while !group
            .decreased
            .lock()
            .expect("lock")
            .contains(&whole.instance_id)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the whole instance is deleted after the restart, never reused");
    ts.release("next");
    ts.shutdown().await;
}

#[tokio::test]
async fn at_the_instance_limit_an_idle_used_instance_makes_room_for_a_whole_instance_job() {
    let group = Arc::new(Memory::default());
    // One instance at most, idle_time long: without making room the job would wait forever.
    let ts =
        Taskscaler::start(group.clone(), ProviderInfo::default(), cfg(2, 1, 0)).expect("start");
    ts.reserve("used").expect("used");
    let used = ts.acquire("used").await.expect("acquire used");
    ts.release("used");
    let none = slipway_taskscaler::Resources::default();
    ts.reserve_instance("whole", &none).expect("whole");
    let whole = ts
        .acquire("whole")
        .await
        .expect("a fresh instance in place of the used one");
    assert_ne!(whole.instance_id, used.instance_id);
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&used.instance_id)
    );
    ts.release("whole");
    ts.shutdown().await;
}

/// Hooks whose preemption check answers a notice for the instances listed.
#[derive(Default)]
struct Notices {
    preempted: Mutex<Vec<String>>,
}

#[async_trait]
impl InstanceHooks for Notices {
    async fn ready(&self, _: &ConnectInfo) -> Result<(), String> {
        Ok(())
    }
    async fn heartbeat(&self, _: &ConnectInfo) -> Result<(), String> {
        Ok(())
    }
    async fn preemption(&self, info: &ConnectInfo) -> Result<Option<Duration>, String> {
        let listed = self.preempted.lock().expect("lock").contains(&info.id);
        Ok(listed.then_some(Duration::from_secs(30)))
    }
}

#[tokio::test(start_paused = true)]
async fn a_preempted_instance_takes_no_new_job_and_goes_with_its_job_when_the_notice_runs_out() {
    let group = Arc::new(Memory::default());
    let notices = Arc::new(Notices::default());
    let mut c = cfg(2, 0, 0);
    c.preemption_check_interval = Some(Duration::from_secs(1));
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        c,
        Options {
            hooks: Some(notices.clone()),
            ..Options::default()
        },
    )
    .expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    notices
        .preempted
        .lock()
        .expect("lock")
        .push(a.instance_id.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(ts.is_preempted(&a.instance_id));
    // Its free slot is not offered: the next job gets another instance.
    ts.reserve("b").expect("b");
    let b = ts.acquire("b").await.expect("b");
    assert_ne!(b.instance_id, a.instance_id);
    let lost = a.instance_lost();
    assert!(!lost.is_cancelled(), "the notice's time is the job's");
    // The notice runs out: the instance goes, its job is told first.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(lost.is_cancelled());
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&a.instance_id)
    );
    ts.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_empty_preempted_instance_goes_at_once() {
    let group = Arc::new(Memory::default());
    let mut c = cfg(1, 0, 0);
    c.preemption_check_interval = Some(Duration::from_secs(60));
    let ts = Taskscaler::start_with(
        group.clone(),
        ProviderInfo::default(),
        c,
        Options::default(),
    )
    .expect("start");
    ts.reserve("a").expect("a");
    let a = ts.acquire("a").await.expect("a");
    ts.release("a");
    // A notice a plugin learned of, told directly.
    ts.preempt(&a.instance_id, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        group
            .decreased
            .lock()
            .expect("lock")
            .contains(&a.instance_id)
    );
    ts.shutdown().await;
}
