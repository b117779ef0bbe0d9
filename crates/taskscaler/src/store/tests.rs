use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use super::*;

fn ident() -> StoreIdentity {
    StoreIdentity {
        runner: "https://gitlab.example.com|42".into(),
        plugin: "fleeting-plugin-local".into(),
        group_id: "local/default".into(),
    }
}

fn connect(id: &str) -> ConnectInfo {
    ConnectInfo {
        id: id.into(),
        connector: ConnectorConfig {
            os: "linux".into(),
            arch: "amd64".into(),
            protocol: "ssh".into(),
            protocol_port: 2222,
            username: "runner".into(),
            password: "hunter2".into(),
            key: b"-----BEGIN OPENSSH PRIVATE KEY-----\nxyz\n".to_vec(),
            use_static_credentials: false,
            keepalive: Duration::from_secs(30),
            timeout: Duration::from_millis(1500),
        },
        internal_addr: "10.0.0.1:22".into(),
        external_addr: String::new(),
        expires: Some(UNIX_EPOCH + Duration::from_millis(1_900_000_000_123)),
    }
}

fn inst(id: &str) -> InstanceRecord {
    InstanceRecord {
        id: id.into(),
        state: State::Running,
        use_count: 0,
        created_at_ms: 1_700_000_000_000,
        connect_info: Some(connect(id)),
        removing: false,
    }
}

fn store_path(dir: &tempfile::TempDir) -> PathBuf {
    StateStore::default_path(dir.path(), &ident().runner)
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    {
        let mut s = StateStore::open(&path, &ident()).unwrap();
        s.record_instance(&inst("a")).unwrap();
        let mut b = inst("b");
        b.connect_info = None;
        b.state = State::Creating;
        b.created_at_ms += 1;
        s.record_instance(&b).unwrap();
        assert_eq!(s.increment_use("a", "k1", 0, "job-1").unwrap(), 1);
        assert_eq!(s.increment_use("a", "k2", 1, "job-2").unwrap(), 2);
        assert!(s.release("k1").unwrap());
        assert!(!s.release("k1").unwrap());
        assert_eq!(s.increment_use("a", "k3", 0, "job-3").unwrap(), 3);
        s.put_report("job-1", r#"{"state":"success"}"#).unwrap();
        s.put_report("job-9", r#"{"state":"failed"}"#).unwrap();
        assert!(s.ack_report("job-9").unwrap());
    }
    let s = StateStore::open(&path, &ident()).unwrap();
    let snap = s.load().unwrap();
    let mut a = inst("a");
    a.use_count = 3;
    assert_eq!(snap.instances.len(), 2);
    assert_eq!(snap.instances[0], a);
    assert_eq!(snap.instances[1].id, "b");
    assert_eq!(snap.instances[1].state, State::Creating);
    assert_eq!(snap.instances[1].connect_info, None);
    let keys: Vec<(&str, u32, &str)> = snap
        .acquisitions
        .iter()
        .map(|a| (a.key.as_str(), a.slot, a.job_ref.as_str()))
        .collect();
    assert_eq!(keys, vec![("k2", 1, "job-2"), ("k3", 0, "job-3")]);
    assert!(snap.acquisitions.iter().all(|a| a.instance_id == "a"));
    let reports = s.take_reports().unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].job_id, "job-1");
    assert_eq!(reports[0].state_json, r#"{"state":"success"}"#);
    // take_reports does not consume.
    assert_eq!(s.take_reports().unwrap().len(), 1);
}

#[test]
fn record_instance_never_lowers_use_count_or_clears_removing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = StateStore::open(store_path(&dir), &ident()).unwrap();
    s.record_instance(&inst("a")).unwrap();
    s.increment_use("a", "k", 0, "j").unwrap();
    assert!(s.mark_removing("a").unwrap());
    assert!(!s.mark_removing("nope").unwrap());
    let mut stale = inst("a");
    stale.connect_info = None;
    stale.state = State::Deleting;
    s.record_instance(&stale).unwrap();
    let got = &s.load().unwrap().instances[0];
    assert_eq!(got.use_count, 1);
    assert!(got.removing);
    assert_eq!(got.state, State::Deleting);
    assert_eq!(got.connect_info, Some(connect("a")));
}

#[test]
fn increment_use_refusals_leave_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = StateStore::open(store_path(&dir), &ident()).unwrap();
    assert!(matches!(
        s.increment_use("nope", "k", 0, "j"),
        Err(StoreError::UnknownInstance(_))
    ));
    s.record_instance(&inst("a")).unwrap();
    s.increment_use("a", "k", 0, "j").unwrap();
    assert!(matches!(
        s.increment_use("a", "k", 1, "j"),
        Err(StoreError::DuplicateAcquisition(_))
    ));
    assert!(matches!(
        s.increment_use("a", "k2", 0, "j"),
        Err(StoreError::SlotTaken { ref holder, .. }) if holder == "k"
    ));
    s.mark_removing("a").unwrap();
    assert!(matches!(
        s.increment_use("a", "k3", 1, "j"),
        Err(StoreError::InstanceRemoving(_))
    ));
    let snap = s.load().unwrap();
    assert_eq!(snap.instances[0].use_count, 1);
    assert_eq!(snap.acquisitions.len(), 1);
}

#[test]
fn forget_instance_drops_its_acquisitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = StateStore::open(store_path(&dir), &ident()).unwrap();
    s.record_instance(&inst("a")).unwrap();
    s.record_instance(&inst("b")).unwrap();
    s.increment_use("a", "k1", 0, "j1").unwrap();
    s.increment_use("b", "k2", 0, "j2").unwrap();
    assert!(s.forget_instance("a").unwrap());
    assert!(!s.forget_instance("a").unwrap());
    let snap = s.load().unwrap();
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.acquisitions.len(), 1);
    assert_eq!(snap.acquisitions[0].key, "k2");
}

/// Copy the store's files as they are on disk right now — what a SIGKILL would leave.
fn crash_copy(from: &Path, to: &Path) {
    for suffix in ["", "-wal"] {
        let src = sibling(from, suffix);
        if src.exists() {
            fs::copy(&src, sibling(to, suffix)).unwrap();
        }
    }
}

#[test]
fn writes_are_durable_without_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut s = StateStore::open(&path, &ident()).unwrap();
    s.record_instance(&inst("a")).unwrap();
    s.increment_use("a", "k1", 0, "job-1").unwrap();
    s.put_report("job-0", "{}").unwrap();
    // The connection stays open (no checkpoint, no close): the data lives in the WAL.
    assert!(sibling(&path, "-wal").exists());
    let copy = dir.path().join("crashed.sqlite");
    crash_copy(&path, &copy);
    std::mem::forget(s);

    let s2 = StateStore::open(&copy, &ident()).unwrap();
    let snap = s2.load().unwrap();
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.instances[0].use_count, 1);
    assert_eq!(snap.acquisitions.len(), 1);
    assert_eq!(s2.take_reports().unwrap().len(), 1);
}

#[test]
fn a_release_leaves_the_next_acquisition_fully_synced() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut s = StateStore::open(&path, &ident()).unwrap();
    s.record_instance(&inst("a")).unwrap();
    s.increment_use("a", "k1", 0, "job-1").unwrap();
    assert!(s.release("k1").unwrap());
    // The release skipped its own fsync; acquisitions must not: FULL (2) is back.
    let sync: i64 = s
        .conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 2, "synchronous left relaxed after a release");
    s.increment_use("a", "k2", 0, "job-2").unwrap();
    let copy = dir.path().join("crashed.sqlite");
    crash_copy(&path, &copy);
    std::mem::forget(s);
    let snap = StateStore::open(&copy, &ident()).unwrap().load().unwrap();
    let keys: Vec<_> = snap.acquisitions.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(
        keys,
        ["k2"],
        "the release and the next acquisition, in order"
    );
}

#[test]
fn reopen_after_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut s = StateStore::open(&path, &ident()).unwrap();
    s.record_instance(&inst("a")).unwrap();
    drop(s);
    let s = StateStore::open(&path, &ident()).unwrap();
    assert_eq!(s.load().unwrap().instances.len(), 1);
}

#[test]
fn a_store_held_whole_by_an_older_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    drop(StateStore::open(&path, &ident()).unwrap());
    // Schema-1 builds take the lock file exclusively.
    let lock = fs::File::open(sibling(&path, ".lock")).unwrap();
    lock.lock().unwrap();
    let err = StateStore::open(&path, &ident()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
}

#[test]
fn managers_sharing_a_store_keep_off_each_others_instances_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut a = StateStore::open_as(&path, &ident(), "manager-a").unwrap();
    let mut b = StateStore::open_as(&path, &ident(), "manager-b").unwrap();
    a.renew_lease(Duration::from_secs(60)).unwrap();
    b.renew_lease(Duration::from_secs(60)).unwrap();
    a.record_instance(&inst("x")).unwrap();
    b.record_instance(&inst("y")).unwrap();

    let seen_by_b = b.ownership().unwrap();
    assert_eq!(seen_by_b.others, vec!["manager-a".to_string()]);
    assert_eq!(seen_by_b.foreign, vec!["x".to_string()]);
    let ids = |s: &StateStore| -> Vec<String> {
        s.load()
            .unwrap()
            .instances
            .into_iter()
            .map(|i| i.id)
            .collect()
    };
    assert_eq!(ids(&b), vec!["y"], "b reads only its own");
    assert_eq!(ids(&a), vec!["x"]);
    // b can neither take a's instance over nor hand out its slots.
    let err = b.record_instance(&inst("x")).unwrap_err();
    assert!(
        matches!(&err, StoreError::OwnedByOther(id) if id == "x"),
        "{err}"
    );
    let err = b.increment_use("x", "job-1", 0, "1").unwrap_err();
    assert!(
        matches!(&err, StoreError::OwnedByOther(id) if id == "x"),
        "{err}"
    );
    a.increment_use("x", "job-2", 0, "2").unwrap();

    // a drains and gives its instances up: b may adopt x, with its use count.
    a.release("job-2").unwrap();
    assert_eq!(a.release_ownership().unwrap(), 1);
    let seen_by_b = b.ownership().unwrap();
    assert!(
        seen_by_b.others.is_empty() && seen_by_b.foreign.is_empty(),
        "{seen_by_b:?}"
    );
    let snap = b.load().unwrap();
    let x = snap
        .instances
        .iter()
        .find(|i| i.id == "x")
        .expect("x adoptable");
    assert_eq!(x.use_count, 1);
    b.increment_use("x", "job-3", 0, "3").unwrap();
    // Now b's: a restarted under its old name would not get it back while b's lease runs.
    let mut a = StateStore::open_as(&path, &ident(), "manager-a").unwrap();
    assert_eq!(ids(&a), Vec::<String>::new());
    assert!(a.record_instance(&inst("x")).is_err());
}

#[test]
fn an_owner_whose_lease_ran_out_loses_its_instances_to_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut a = StateStore::open_as(&path, &ident(), "manager-a").unwrap();
    let b = StateStore::open_as(&path, &ident(), "manager-b").unwrap();
    a.renew_lease(Duration::from_secs(60)).unwrap();
    a.record_instance(&inst("x")).unwrap();
    assert_eq!(b.ownership().unwrap().foreign, vec!["x".to_string()]);
    // a crashed: its lease is not renewed and runs out.
    a.renew_lease(Duration::ZERO).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert!(b.ownership().unwrap().foreign.is_empty());
    assert_eq!(b.load().unwrap().instances.len(), 1);
}

#[test]
fn a_schema_1_store_is_migrated_and_its_instances_are_adoptable() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    {
        let mut s = StateStore::open(&path, &ident()).unwrap();
        s.record_instance(&inst("old")).unwrap();
    }
    {
        // Back to what a schema-1 build wrote.
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "ALTER TABLE instances DROP COLUMN owner; DROP TABLE owners; PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let mut s = StateStore::open_as(&path, &ident(), "manager-new").unwrap();
    let snap = s.load().unwrap();
    assert_eq!(snap.instances.len(), 1, "{snap:?}");
    s.increment_use("old", "k", 0, "1").unwrap();
    let c = Connection::open(&path).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
}

#[test]
fn foreign_identity_is_refused_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut s = StateStore::open(&path, &ident()).unwrap();
    s.record_instance(&inst("a")).unwrap();
    drop(s);
    let before = fs::read(&path).unwrap();
    for other in [
        StoreIdentity {
            group_id: "aws/eu-west-1".into(),
            ..ident()
        },
        StoreIdentity {
            runner: "other-runner".into(),
            ..ident()
        },
        StoreIdentity {
            plugin: "fleeting-plugin-aws".into(),
            ..ident()
        },
    ] {
        let err = StateStore::open(&path, &other).unwrap_err();
        assert!(matches!(err, StoreError::ForeignIdentity { .. }), "{err}");
        let msg = err.to_string();
        eprintln!("{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(&ident().to_string()), "{msg}");
        assert!(msg.contains(&other.to_string()), "{msg}");
    }
    assert_eq!(fs::read(&path).unwrap(), before);
    // Still ours.
    let s = StateStore::open(&path, &ident()).unwrap();
    assert_eq!(s.load().unwrap().instances.len(), 1);
}

#[test]
fn garbage_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(&path, &garbage).unwrap();
    let err = StateStore::open(&path, &ident()).unwrap_err();
    assert!(matches!(err, StoreError::NotSqlite { .. }), "{err}");
    eprintln!("{err}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("4096 bytes"), "{msg}");
    assert_eq!(fs::read(&path).unwrap(), garbage);
    assert!(!sibling(&path, "-wal").exists());

    fs::write(&path, b"").unwrap();
    let err = StateStore::open(&path, &ident()).unwrap_err();
    assert!(err.to_string().contains("empty file"), "{err}");
    assert_eq!(fs::read(&path).unwrap(), b"");
}

#[test]
fn truncated_or_corrupt_sqlite_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut s = StateStore::open(&path, &ident()).unwrap();
    for i in 0..200 {
        s.record_instance(&inst(&format!("instance-{i:04}")))
            .unwrap();
    }
    drop(s); // checkpoints the WAL into the main file
    assert!(
        !sibling(&path, "-wal").exists()
            || fs::metadata(sibling(&path, "-wal")).unwrap().len() == 0
    );
    let good = fs::read(&path).unwrap();
    assert!(good.len() > 4 * 4096, "{}", good.len());

    // Truncated to half.
    let bad = &good[..good.len() / 2];
    fs::write(&path, bad).unwrap();
    let err = StateStore::open(&path, &ident()).unwrap_err();
    eprintln!("{err}");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()));
    assert_eq!(fs::read(&path).unwrap(), bad);

    // Truncated inside the header.
    fs::write(&path, &good[..50]).unwrap();
    let err = StateStore::open(&path, &ident()).unwrap_err();
    eprintln!("{err}");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");

    // Pages overwritten with noise.
    let mut bad = good.clone();
    for b in &mut bad[2 * 4096..4 * 4096] {
        *b = 0x5a;
    }
    fs::write(&path, &bad).unwrap();
    let err = StateStore::open(&path, &ident()).unwrap_err();
    eprintln!("{err}");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert_eq!(fs::read(&path).unwrap(), bad);
}

#[test]
fn unknown_schema_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    drop(StateStore::open(&path, &ident()).unwrap());
    {
        let c = Connection::open(&path).unwrap();
        c.pragma_update(None, "user_version", 7).unwrap();
    }
    let before = fs::read(&path).unwrap();
    let err = StateStore::open(&path, &ident()).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::UnknownSchema {
                found: 7,
                supported: SCHEMA_VERSION,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("version 7"),
        "{msg}"
    );
    assert_eq!(fs::read(&path).unwrap(), before);
}

#[test]
fn other_sqlite_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
    }
    let before = fs::read(&path).unwrap();
    let err = StateStore::open(&path, &ident()).unwrap_err();
    assert!(matches!(err, StoreError::NotAStateStore { .. }), "{err}");
    assert_eq!(fs::read(&path).unwrap(), before);
}

#[test]
fn files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut s = StateStore::open(&path, &ident()).unwrap();
    s.record_instance(&inst("a")).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&sibling(&path, "-wal")), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    drop(s);

    // A file made world-readable behind our back is tightened on open.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let _s = StateStore::open(&path, &ident()).unwrap();
    assert_eq!(mode(&path), 0o600);
    // No temp files left over.
    let names: Vec<String> = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
}

#[test]
fn debug_output_masks_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let s = StateStore::open(store_path(&dir), &ident()).unwrap();
    let dbg = format!("{:?} {:?}", s, inst("a"));
    assert!(
        !dbg.contains("hunter2") && !dbg.contains("PRIVATE KEY"),
        "{dbg}"
    );
}

#[test]
fn default_path_makes_a_directory_name_of_the_runner_key() {
    let p = StateStore::default_path("/var/lib/slipway", "my-runner_1.x");
    assert_eq!(
        p,
        PathBuf::from("/var/lib/slipway/my-runner_1.x/state.sqlite")
    );
    let a = StateStore::default_path("/d", "https://gitlab.com|1");
    let b = StateStore::default_path("/d", "https://gitlab.com|2");
    assert_ne!(a, b);
    let name = a.parent().unwrap().file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with("https___gitlab.com_1-"), "{name}");
    assert!(!name.contains('/'));
    assert_eq!(a, StateStore::default_path("/d", "https://gitlab.com|1"));
    let dots = StateStore::default_path("/d", "..");
    assert_eq!(dots.parent().unwrap().parent().unwrap(), Path::new("/d"));
    assert_ne!(dots.parent().unwrap().file_name().unwrap(), "..");
}

#[test]
fn empty_identity_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = StateStore::open(
        store_path(&dir),
        &StoreIdentity {
            group_id: String::new(),
            ..ident()
        },
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::InvalidIdentity(_)));
}

#[test]
fn apply_restore_updates_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = StateStore::open(store_path(&dir), &ident()).unwrap();
    for id in ["adopt", "busy", "gone"] {
        s.record_instance(&inst(id)).unwrap();
    }
    s.increment_use("busy", "k1", 0, "job-1").unwrap();
    s.increment_use("gone", "k2", 0, "job-2").unwrap();
    let live = vec![
        ("adopt".to_owned(), State::Running),
        ("busy".to_owned(), State::Running),
        ("stranger".to_owned(), State::Running),
    ];
    let plan = plan_restore(&s.load().unwrap(), &live, 0, false);
    assert_eq!(plan.failed_jobs.len(), 2);
    let reports: Vec<(String, String)> = plan
        .failed_jobs
        .iter()
        .map(|a| (a.job_ref.clone(), r#"{"state":"failed"}"#.to_owned()))
        .collect();
    s.apply_restore(&plan, &reports).unwrap();
    let snap = s.load().unwrap();
    let ids: Vec<(&str, bool)> = snap
        .instances
        .iter()
        .map(|i| (i.id.as_str(), i.removing))
        .collect();
    assert_eq!(ids, vec![("adopt", false), ("busy", true)]);
    assert!(snap.acquisitions.is_empty());
    let jobs: Vec<String> = s
        .take_reports()
        .unwrap()
        .into_iter()
        .map(|r| r.job_id)
        .collect();
    assert_eq!(jobs, vec!["job-1".to_owned(), "job-2".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_store_keeps_use_counts_exact_under_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let store = AsyncStateStore::open(&path, &ident()).await.unwrap();
    for i in 0..4 {
        store.record_instance(inst(&format!("i{i}"))).await.unwrap();
    }
    let counts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..8u32 {
        let store = store.clone();
        let counts = counts.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..25u32 {
                let instance = format!("i{}", (t + n) % 4);
                let key = format!("t{t}-n{n}");
                let c = store
                    .increment_use(instance.clone(), key.clone(), 100 + t, format!("job-{key}"))
                    .await
                    .unwrap();
                counts.lock().unwrap().push((instance, c));
                assert!(store.release(key).await.unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let snap = store.load().await.unwrap();
    assert!(snap.acquisitions.is_empty());
    let total: u64 = snap.instances.iter().map(|i| i.use_count).sum();
    assert_eq!(total, 200);
    // Every returned count is distinct per instance: no lost or doubled increment.
    let mut counts = counts.lock().unwrap().clone();
    counts.sort();
    let before = counts.len();
    counts.dedup();
    assert_eq!(counts.len(), before);
    for i in &snap.instances {
        let n = counts.iter().filter(|(id, _)| *id == i.id).count() as u64;
        assert_eq!(i.use_count, n);
    }

    // Ordered: a release sent right after an increment sees it.
    let c = store.clone();
    let (a, b) = tokio::join!(c.increment_use("i0", "x", 0, "j"), store.release("x"));
    assert_eq!(a.unwrap(), snap.instances[0].use_count + 1);
    assert!(b.unwrap());

    store.clone().close().await;
    assert!(matches!(store.load().await, Err(StoreError::Closed)));
    // Closed means the file is free again.
    let reopened = AsyncStateStore::open(&path, &ident()).await.unwrap();
    let total: u64 = reopened
        .load()
        .await
        .unwrap()
        .instances
        .iter()
        .map(|i| i.use_count)
        .sum();
    assert_eq!(total, 201);
}

#[tokio::test]
async fn async_open_reports_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.sqlite");
    fs::write(&path, b"not a database at all, just text").unwrap();
    let err = AsyncStateStore::open(&path, &ident()).await.unwrap_err();
    assert!(matches!(err, StoreError::NotSqlite { .. }), "{err}");
}

#[test]
fn a_restarted_manager_gets_its_owner_name_back_and_one_beside_it_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let first = StateStore::open(&path, &ident()).unwrap();
    let second = StateStore::open(&path, &ident()).unwrap();
    assert!(first.owner().ends_with("#0"), "{}", first.owner());
    assert!(second.owner().ends_with("#1"), "{}", second.owner());
    let name = first.owner().to_owned();
    drop(first);
    let again = StateStore::open(&path, &ident()).unwrap();
    assert_eq!(again.owner(), name);
}

#[test]
fn a_restore_leaves_what_another_manager_adopted_first_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_path(&dir);
    let mut a = StateStore::open_as(&path, &ident(), "manager-a").unwrap();
    let mut b = StateStore::open_as(&path, &ident(), "manager-b").unwrap();
    // Released instances (a drained manager's): both read them as adoptable.
    a.record_instance(&inst("x")).unwrap();
    a.record_instance(&inst("gone")).unwrap();
    a.increment_use("x", "k1", 0, "job-1").unwrap();
    a.release_ownership().unwrap();
    let live = vec![("x".to_owned(), State::Running)];
    let plan_a = plan_restore(&a.load().unwrap(), &live, 0, false);
    let plan_b = plan_restore(&b.load().unwrap(), &live, 0, false);
    // b gets there first, and its lease runs.
    b.renew_lease(Duration::from_secs(60)).unwrap();
    assert!(b.apply_restore(&plan_b, &[]).unwrap().is_empty());
    // a's plan now touches only what is still its to touch.
    let mut lost = a.apply_restore(&plan_a, &[]).unwrap();
    lost.sort();
    assert_eq!(lost, vec!["x".to_string()], "x is b's by now");
    assert_eq!(b.ownership().unwrap().foreign, Vec::<String>::new());
    let b_sees: Vec<String> = b
        .load()
        .unwrap()
        .instances
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(b_sees, vec!["x"], "not deleted or taken by a");
    assert!(
        !a.forget_instance("x").unwrap(),
        "a cannot forget b's instance"
    );
    assert!(!a.mark_removing("x").unwrap(), "nor mark it");
}
