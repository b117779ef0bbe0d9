//! Two managers on one instance group and one state store (a rolling upgrade): neither uses,
//! counts or removes the other's instances; the second adopts the first's once it gives them up.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::Memory;
use slipway_fleeting::{
    ConnectInfo, ConnectorConfig, GroupError, InstanceGroup, ProviderInfo, State,
};
use slipway_taskscaler::{AsyncStateStore, Config, Options, Policy, StoreIdentity, Taskscaler};

/// One manager's plugin on the shared group: remembers which instances it asked to delete.
struct Handle {
    group: Arc<Memory>,
    decreased: Mutex<Vec<String>>,
}

impl Handle {
    fn new(group: &Arc<Memory>) -> Arc<Handle> {
        Arc::new(Handle {
            group: group.clone(),
            decreased: Mutex::new(Vec::new()),
        })
    }

    fn decreased(&self) -> Vec<String> {
        self.decreased.lock().unwrap().clone()
    }
}

#[async_trait]
impl InstanceGroup for Handle {
    async fn init(&self, c: &[u8], k: &ConnectorConfig) -> Result<ProviderInfo, GroupError> {
        self.group.init(c, k).await
    }
    async fn update(&self) -> Result<Vec<(String, State)>, GroupError> {
        self.group.update().await
    }
    async fn increase(&self, delta: u32) -> Result<u32, GroupError> {
        self.group.increase(delta).await
    }
    async fn decrease(&self, ids: &[String]) -> Result<Vec<String>, GroupError> {
        self.decreased.lock().unwrap().extend(ids.iter().cloned());
        self.group.decrease(ids).await
    }
    async fn connect_info(&self, id: &str) -> Result<ConnectInfo, GroupError> {
        self.group.connect_info(id).await
    }
    async fn heartbeat(&self, id: &str) -> Result<(), GroupError> {
        self.group.heartbeat(id).await
    }
    async fn shutdown(&self) -> Result<(), GroupError> {
        Ok(())
    }
}

fn cfg(delete_on_shutdown: bool) -> Config {
    Config {
        capacity_per_instance: 1,
        max_instances: 6,
        policies: vec![Policy {
            idle_time: Duration::from_secs(600),
            ..Policy::default()
        }],
        instance_acquire_timeout: Duration::from_secs(10),
        update_interval: Duration::from_millis(50),
        update_interval_when_expecting: Duration::from_millis(10),
        delete_instances_on_shutdown: delete_on_shutdown,
        shutdown_deletion_interval: Duration::from_millis(50),
        ..Config::default()
    }
}

fn identity() -> StoreIdentity {
    StoreIdentity {
        runner: "test-runner".into(),
        plugin: "memory".into(),
        group_id: "memory/test".into(),
    }
}

async fn manager(
    handle: &Arc<Handle>,
    path: &std::path::Path,
    delete_on_shutdown: bool,
) -> (Taskscaler, AsyncStateStore) {
    let store = AsyncStateStore::open(path, &identity())
        .await
        .expect("open");
    let ts = Taskscaler::start_with(
        handle.clone(),
        ProviderInfo::default(),
        cfg(delete_on_shutdown),
        Options {
            store: Some(store.clone()),
            ..Options::default()
        },
    )
    .expect("start");
    (ts, store)
}

/// Let `n` scaling passes of both managers go by.
async fn passes(n: u32) {
    tokio::time::sleep(Duration::from_millis(60) * n).await;
}

#[tokio::test]
async fn a_second_manager_leaves_the_first_ones_instances_alone_and_adopts_them_once_released() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.sqlite");
    let group = Arc::new(Memory::default());
    let (old_handle, new_handle) = (Handle::new(&group), Handle::new(&group));

    // The old manager runs two jobs on two instances.
    let (old, old_store) = manager(&old_handle, &path, false).await;
    old.reserve("a").unwrap();
    let a = old.acquire("a").await.unwrap();
    old.reserve("b").unwrap();
    let b = old.acquire("b").await.unwrap();

    // The new one starts beside it with the same state: it neither removes nor uses them.
    let (new, new_store) = manager(&new_handle, &path, true).await;
    new.restored().await.unwrap();
    passes(5).await;
    assert_eq!(new.stats().instances, 0, "{:?}", new.instances());
    assert!(new_handle.decreased().is_empty(), "removed by a non-owner");
    assert!(!a.instance_lost().is_cancelled() && !b.instance_lost().is_cancelled());

    // Its own job gets an instance of its own, which the old manager in turn leaves alone.
    new.reserve("c").unwrap();
    let c = new.acquire("c").await.unwrap();
    assert!(c.instance_id != a.instance_id && c.instance_id != b.instance_id);
    passes(5).await;
    assert_eq!(old.stats().instances, 2, "{:?}", old.instances());
    assert!(old_handle.decreased().is_empty(), "removed by a non-owner");

    // The old one drains: its jobs end, it stops without deleting and gives its instances up.
    old.release("a");
    old.release("b");
    old.shutdown().await;
    old_store.close().await;
    assert_eq!(group.instances.lock().unwrap().len(), 3, "nothing deleted");

    // The new one adopts them, with their use counts, and places jobs there.
    let mut adopted = 0;
    for _ in 0..100 {
        adopted = new.stats().instances;
        if adopted == 3 {
            break;
        }
        passes(1).await;
    }
    assert_eq!(adopted, 3, "{:?}", new.instances());
    let uses: Vec<u32> = new
        .instances()
        .iter()
        .filter(|i| i.id == a.instance_id || i.id == b.instance_id)
        .map(|i| i.uses)
        .collect();
    assert_eq!(uses, vec![1, 1], "use counts kept");
    new.reserve("d").unwrap();
    let d = new.acquire("d").await.unwrap();
    assert!(
        d.instance_id == a.instance_id || d.instance_id == b.instance_id,
        "{d:?}"
    );
    assert_eq!(
        group.instances.lock().unwrap().len(),
        3,
        "no new instance for d"
    );

    new.release("c");
    new.release("d");
    new.shutdown().await;
    new_store.close().await;
    assert!(group.instances.lock().unwrap().is_empty());
    assert!(old_handle.decreased().is_empty());
}

#[tokio::test]
async fn an_instance_nobody_records_is_removed_only_after_a_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.sqlite");
    let group = Arc::new(Memory::default());
    let (first_handle, second_handle) = (Handle::new(&group), Handle::new(&group));
    let (first, first_store) = manager(&first_handle, &path, true).await;
    let (second, second_store) = manager(&second_handle, &path, true).await;
    first.restored().await.unwrap();
    second.restored().await.unwrap();
    passes(3).await;
    // An instance appears that neither asked for (a third manager's, about to be recorded).
    group.increase(1).await.unwrap();
    passes(10).await;
    assert!(first_handle.decreased().is_empty() && second_handle.decreased().is_empty());
    assert_eq!(group.instances.lock().unwrap().len(), 1);
    first.shutdown().await;
    second.shutdown().await;
    first_store.close().await;
    second_store.close().await;
}
