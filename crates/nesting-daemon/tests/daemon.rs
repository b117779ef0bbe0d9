//! The nesting daemon with real QEMU guests (emulated here: no working KVM): VMs per slot,
//! stomping, snapshots restored and branched four ways with copy-on-write disks, snapshots
//! refused on a different hypervisor build, retention.

// Integration tests: a failed fixture step should stop the test at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use slipway_nesting::agent::{self, AgentClient};
use slipway_nesting::client::{AgentAddr, NestingClient};
use slipway_nesting::proto::VirtualMachine;
use slipway_nesting_daemon::daemon::{Daemon, DaemonOptions};
use slipway_testkit::guest::{MICROVM_IMAGE, guest_image};
use tokio_util::sync::CancellationToken;

struct Fixture {
    _dir: tempfile::TempDir,
    state: PathBuf,
    images: PathBuf,
    socket: PathBuf,
    stop: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
}

/// A daemon over `state` serving on `socket`, initialised with `config`.
async fn serve(
    state: &Path,
    images: &Path,
    socket: &Path,
    config: &str,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<()>,
    NestingClient,
) {
    let daemon = Daemon::new(DaemonOptions {
        state_dir: state.to_path_buf(),
        images_dir: images.to_path_buf(),
    })
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let stop = stop.clone();
        let socket = socket.to_path_buf();
        async move {
            daemon.serve(&socket, stop).await.unwrap();
        }
    });
    let mut client = None;
    for _ in 0..100 {
        if socket.exists()
            && let Ok(c) = NestingClient::connect_unix(socket).await
        {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut client = client.expect("daemon socket");
    client.init(config.as_bytes()).await.unwrap();
    (stop, server, client)
}

impl Fixture {
    async fn start(config: &str) -> (Fixture, NestingClient) {
        let images = tokio::task::spawn_blocking(|| guest_image(MICROVM_IMAGE, "microvm"))
            .await
            .unwrap()
            .unwrap();
        // Short paths: unix sockets are limited to 108 bytes.
        let dir = tempfile::Builder::new()
            .prefix("nest")
            .tempdir_in("/tmp")
            .unwrap();
        let state = dir.path().join("s");
        let socket = dir.path().join("n.sock");
        let (stop, server, client) = serve(&state, &images, &socket, config).await;
        (
            Fixture {
                _dir: dir,
                state,
                images,
                socket,
                stop,
                server: Some(server),
            },
            client,
        )
    }

    /// Stop the daemon (its VMs keep running) and start a new one over the same state.
    async fn restart(&mut self, config: &str) -> NestingClient {
        self.stop.cancel();
        if let Some(s) = self.server.take() {
            s.await.unwrap();
        }
        let (stop, server, client) = serve(&self.state, &self.images, &self.socket, config).await;
        self.stop = stop;
        self.server = Some(server);
        client
    }

    /// A snapshot's metadata as the daemon wrote it.
    fn meta(&self, name: &str) -> serde_json::Value {
        let path = self.state.join("snapshots").join(name).join("meta.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// The command line of the one hypervisor process running.
    fn only_cmdline(&self) -> String {
        let pids = self.qemu_processes();
        assert_eq!(pids.len(), 1, "{pids:?}");
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/cmdline", pids[0])).unwrap())
            .replace('\0', " ")
    }

    /// Hypervisor processes started under this fixture's state directory.
    fn qemu_processes(&self) -> Vec<u32> {
        slipway_nesting_daemon::store::processes_under(&self.state)
            .into_iter()
            .map(|(pid, _)| pid)
            .collect()
    }

    async fn shutdown(mut self, client: &mut NestingClient) {
        client.shutdown().await.unwrap();
        self.stop.cancel();
        if let Some(s) = self.server.take() {
            s.await.unwrap();
        }
        assert!(
            self.qemu_processes().is_empty(),
            "hypervisors left: {:?}",
            self.qemu_processes()
        );
        assert!(!self.socket.exists());
    }
}

async fn agent_of(vm: &VirtualMachine) -> AgentClient {
    let Some(AgentAddr::Unix(path)) = AgentAddr::parse(&vm.addr) else {
        panic!("unexpected address {}", vm.addr)
    };
    let (client, _, _) = agent::wait_ready(Path::new(&path), Duration::from_secs(30))
        .await
        .unwrap();
    client
}

async fn sh(agent: &AgentClient, script: &str) -> (i32, String) {
    let (code, out, err) = agent
        .run_capture(vec!["sh".into(), "-c".into(), script.into()], Vec::new())
        .await
        .unwrap();
    (
        code.unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_per_slot_and_a_new_vm_stomps_the_one_left_in_its_slot() {
    let (fx, mut client) = Fixture::start(r#"{"accel":"tcg"}"#).await;
    let (first, stomped) = client.create(MICROVM_IMAGE, Some(0)).await.unwrap();
    assert_eq!(stomped, None);
    assert_eq!(first.slot, Some(0));
    assert_eq!(first.level, "microvm");
    let agent = agent_of(&first).await;
    let (code, out) = sh(
        &agent,
        "echo hello from $(uname -r); mount | grep -c ' /work '",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("hello from") && out.contains("cloud-amd64"),
        "{out}"
    );
    assert!(out.trim_end().ends_with('1'), "work disk mounted: {out}");
    drop(agent);
    let pids_before = fx.qemu_processes();
    assert_eq!(pids_before.len(), 1);

    let (second, stomped) = client.create(MICROVM_IMAGE, Some(0)).await.unwrap();
    assert_eq!(
        stomped.as_deref(),
        Some(first.id.as_str()),
        "the VM left in slot 0 is stomped"
    );
    let listed: Vec<String> = client
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.id)
        .collect();
    assert_eq!(listed, vec![second.id.clone()]);
    let pids_after = fx.qemu_processes();
    assert_eq!(pids_after.len(), 1, "the stomped VM's qemu is gone");
    assert!(!pids_after.contains(&pids_before[0]));

    let err = client.create("no-such-image", Some(1)).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains("slipway image build"), "{err}");

    client.delete(&second.id).await.unwrap();
    assert!(client.list().await.unwrap().is_empty());
    assert!(client.delete(&second.id).await.unwrap_err().is_not_found());
    fx.shutdown(&mut client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_branches_four_ways_on_one_shared_base() {
    let (fx, mut client) =
        Fixture::start(r#"{"accel":"tcg","snapshots":{"max_count":2,"max_age_secs":0}}"#).await;
    let (vm, _) = client.create(MICROVM_IMAGE, Some(0)).await.unwrap();
    let agent = agent_of(&vm).await;
    let (code, out) = sh(
        &agent,
        "mkdir -p /work/deps && head -c 8388608 /dev/urandom > /work/deps/blob && md5sum /work/deps/blob | cut -c1-32 > /work/deps/sum && echo in-ram > /tmp/ram && sync && cat /work/deps/sum",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let sum = out.trim().to_string();
    drop(agent);
    let labels = [("job".to_string(), "1".to_string())].into();
    let (snap, expired) = client.snapshot(&vm.id, "deps", labels).await.unwrap();
    assert!(expired.is_empty());
    assert_eq!(snap.hypervisor, "qemu");
    assert_eq!(snap.machine, "microvm");
    assert_eq!(snap.accel, "tcg");
    assert_eq!(snap.cpu_model, "max");
    assert!(!snap.hypervisor_version.is_empty());
    assert!(
        snap.disk_bytes >= 8 << 20,
        "the disk layer holds the blob: {}",
        snap.disk_bytes
    );
    assert!(
        client.list().await.unwrap().is_empty(),
        "the snapshot consumed the VM"
    );
    assert!(fx.qemu_processes().is_empty());
    // Let the snapshot's clock fall behind: a restored guest must be set to the host's time.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Four branches at once, each in its own slot.
    let mut handles = Vec::new();
    for slot in 0..4 {
        let socket = fx.socket.clone();
        handles.push(tokio::spawn(async move {
            let mut c = NestingClient::connect_unix(&socket).await.unwrap();
            let (vm, _) = c.restore("deps", Some(slot)).await.unwrap();
            let agent = agent_of(&vm).await;
            let (code, out) = sh(
                &agent,
                &format!(
                    "cat /tmp/ram; echo rand=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'); echo machine-id=$(cat /etc/machine-id); echo hostname=$(hostname); md5sum /work/deps/blob | cut -c1-32; echo {slot} > /work/branch-{slot}; head -c 1048576 /dev/urandom > /work/deps/blob-{slot}; sync; sleep 2; ls /work; date +%s"
                ),
            )
            .await;
            (slot, vm, code, out)
        }));
    }
    let mut vms = Vec::new();
    // What a restore clones from the running kernel must differ in every branch.
    let mut identities: std::collections::BTreeMap<&str, std::collections::BTreeSet<String>> =
        Default::default();
    for h in handles {
        let (slot, vm, code, out) = h.await.unwrap();
        assert_eq!(code, 0, "{out}");
        for key in ["rand", "machine-id", "hostname"] {
            let value = out
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key}= line: {out}"));
            assert!(value.len() >= 8, "{key} of branch {slot}: {value:?}");
            identities.entry(key).or_default().insert(value.to_string());
        }
        assert!(out.starts_with("in-ram\n"), "memory restored: {out}");
        let host_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let guest_now: u64 = out.lines().last().unwrap().trim().parse().unwrap();
        assert!(
            host_now.abs_diff(guest_now) <= 3,
            "branch {slot}'s clock was not set to the host's: guest {guest_now}, host {host_now}"
        );
        assert!(
            out.contains(&sum),
            "branch {slot} sees the saved disk: {out}"
        );
        let others: Vec<String> = (0..4)
            .filter(|s| *s != slot)
            .map(|s| format!("branch-{s}"))
            .collect();
        assert!(out.contains(&format!("branch-{slot}")), "{out}");
        for o in &others {
            assert!(!out.contains(o.as_str()), "branch {slot} sees {o}: {out}");
        }
        assert_eq!(vm.snapshot, "deps");
        vms.push(vm);
    }
    for (key, values) in &identities {
        assert_eq!(values.len(), 4, "four branches share a {key}: {values:?}");
    }
    // Branches are thin layers over the shared frozen disk.
    let layers: u64 = vms
        .iter()
        .map(|v| {
            slipway_nesting_daemon::disk::allocated_bytes(
                &fx.state.join("vms").join(&v.id).join("disk.qcow2"),
            )
        })
        .sum();
    assert!(
        layers < 4 * snap.disk_bytes,
        "4 layers {layers} vs one frozen disk {}",
        snap.disk_bytes
    );

    // In use: neither deleted nor replaced.
    let e = client
        .delete_snapshot("deps")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("in use"), "{e}");

    // Retention: at most 2 snapshots; the oldest unused one goes.
    for (i, v) in vms.iter().enumerate().take(3) {
        let (_, expired) = client
            .snapshot(
                &v.id,
                &format!("b{i}"),
                BTreeMap::new().into_iter().collect(),
            )
            .await
            .unwrap();
        // deps stays (VMs and snapshots sit on it); the oldest unused one goes.
        let want: Vec<String> = match i {
            0 => vec![],
            n => vec![format!("b{}", n - 1)],
        };
        assert_eq!(expired, want, "after saving b{i}");
    }
    let names: Vec<String> = client
        .list_snapshots()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert!(
        names.contains(&"deps".to_string()),
        "deps is still in use: {names:?}"
    );
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"b2".to_string()), "{names:?}");
    fx.shutdown(&mut client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_from_another_hypervisor_build_is_refused() {
    let (fx, mut client) = Fixture::start(r#"{"accel":"tcg"}"#).await;
    let (vm, _) = client.create(MICROVM_IMAGE, None).await.unwrap();
    client
        .snapshot(&vm.id, "old", Default::default())
        .await
        .unwrap();
    let meta_path = fx.state.join("snapshots/old/meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    meta["identity"]["version"] = "1.0.0".into();
    meta["identity"]["cpu_model"] = "host:Some Other CPU".into();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&meta_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let e = client
        .restore("old", Some(0))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot be restored on this host"), "{e}");
    assert!(e.contains("qemu version 1.0.0 (here "), "{e}");
    assert!(
        e.contains("CPU model host:Some Other CPU (here max)"),
        "{e}"
    );
    assert!(client.list().await.unwrap().is_empty());
    assert!(fx.qemu_processes().is_empty());
    let bad = client
        .restore("../etc", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(bad.contains("invalid snapshot name"), "{bad}");
    fx.shutdown(&mut client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_map_their_memory_file_and_outlive_a_daemon_restart() {
    // A snapshot as daemons before memory files wrote them: RAM in the stream, no memory file.
    let (mut fx, mut client) = Fixture::start(r#"{"accel":"tcg","memory":"anonymous"}"#).await;
    let (vm, _) = client.create(MICROVM_IMAGE, None).await.unwrap();
    assert!(!fx.only_cmdline().contains("memory-backend"));
    let agent = agent_of(&vm).await;
    let (code, out) = sh(&agent, "echo one > /tmp/one && sync").await;
    assert_eq!(code, 0, "{out}");
    drop(agent);
    client
        .snapshot(&vm.id, "streamed", Default::default())
        .await
        .unwrap();
    let meta = fx.meta("streamed");
    assert!(meta["files"]["memory"].is_null(), "{meta}");
    let state = fx.state.join("snapshots/streamed/state");
    assert!(
        std::fs::metadata(&state).unwrap().len() > 8 << 20,
        "the stream carries the RAM"
    );

    // A new daemon that keeps RAM in files restores it, into a shared memory file.
    let mut client = fx.restart(r#"{"accel":"tcg"}"#).await;
    let (vm, _) = client.restore("streamed", None).await.unwrap();
    assert_eq!(vm.memory, "shared-file");
    let cmdline = fx.only_cmdline();
    assert!(
        cmdline.contains("memory-backend=microvm.ram") && cmdline.contains("share=on"),
        "{cmdline}"
    );
    let agent = agent_of(&vm).await;
    let (code, out) = sh(&agent, "cat /tmp/one; echo two > /tmp/two && sync").await;
    assert_eq!((code, out.as_str()), (0, "one\n"), "{out}");
    drop(agent);

    // Its snapshot keeps the RAM as a file and streams only device state.
    client
        .snapshot(&vm.id, "mapped", Default::default())
        .await
        .unwrap();
    let meta = fx.meta("mapped");
    assert_eq!(meta["files"]["memory"], "memory", "{meta}");
    let dir = fx.state.join("snapshots/mapped");
    let memory = std::fs::metadata(dir.join("memory")).unwrap();
    assert_eq!(memory.len(), 256 << 20, "the guest's 256 MiB");
    let state = std::fs::metadata(dir.join("state")).unwrap().len();
    assert!(state < 1 << 20, "device state only: {state} bytes");

    // After another restart, a restore maps that file privately and sees the saved RAM.
    let mut client = fx.restart(r#"{"accel":"tcg"}"#).await;
    let (vm, _) = client.restore("mapped", None).await.unwrap();
    assert_eq!(vm.memory, "private-file");
    let cmdline = fx.only_cmdline();
    assert!(
        cmdline.contains(&format!(
            "mem-path={},share=off",
            dir.join("memory").display()
        )),
        "{cmdline}"
    );
    let agent = agent_of(&vm).await;
    let (code, out) = sh(&agent, "cat /tmp/one /tmp/two; echo three > /tmp/three").await;
    assert_eq!((code, out.as_str()), (0, "one\ntwo\n"), "{out}");
    drop(agent);
    let stamp_before = std::fs::metadata(dir.join("memory"))
        .unwrap()
        .modified()
        .unwrap();

    // A branch's RAM is a private mapping: its snapshot streams the RAM again.
    client
        .snapshot(&vm.id, "branch", Default::default())
        .await
        .unwrap();
    assert!(fx.meta("branch")["files"]["memory"].is_null());
    assert_eq!(
        std::fs::metadata(dir.join("memory"))
            .unwrap()
            .modified()
            .unwrap(),
        stamp_before,
        "a branch never writes the snapshot's memory file"
    );
    let (vm, _) = client.restore("branch", None).await.unwrap();
    let agent = agent_of(&vm).await;
    let (code, out) = sh(&agent, "cat /tmp/one /tmp/two /tmp/three").await;
    assert_eq!((code, out.as_str()), (0, "one\ntwo\nthree\n"), "{out}");
    drop(agent);
    fx.shutdown(&mut client).await;
}

/// The VMs the daemon lists, by slot, once `want` slots hold one (up to 4 minutes).
async fn wait_for_slots(client: &mut NestingClient, want: &[i32]) -> Vec<VirtualMachine> {
    for _ in 0..2400 {
        let vms = client.list().await.unwrap();
        if want.iter().all(|s| vms.iter().any(|v| v.slot == Some(*s))) {
            return vms;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "slots {want:?} never got their warm VMs: {:?}",
        client.list().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_slots_hand_over_a_ready_vm_and_start_the_next_one_after_the_job() {
    let (fx, mut client) = Fixture::start(&format!(
        r#"{{"accel":"tcg","warm":{{"slots":2,"images":["{MICROVM_IMAGE}"]}}}}"#
    ))
    .await;
    // Ahead of any job: a VM in each slot, restored from the image's base snapshot.
    let warm = wait_for_slots(&mut client, &[0, 1]).await;
    assert_eq!(warm.len(), 2, "{warm:?}");
    let base = format!("warm-{MICROVM_IMAGE}");
    assert!(
        warm.iter().all(|v| v.snapshot == base),
        "not restored from the base snapshot: {warm:?}"
    );
    assert!(fx.state.join("snapshots").join(&base).exists());

    // A job's Create takes the slot's ready VM.
    let (vm0, stomped) = client.create(MICROVM_IMAGE, Some(0)).await.unwrap();
    assert!(vm0.warm, "{vm0:?}");
    assert!(stomped.is_none());
    assert_eq!(vm0.id, warm.iter().find(|v| v.slot == Some(0)).unwrap().id);
    let (vm1, _) = client.create(MICROVM_IMAGE, Some(1)).await.unwrap();
    assert!(vm1.warm);

    // Two warm VMs of one base snapshot are still two machines.
    let mut seen = Vec::new();
    for vm in [&vm0, &vm1] {
        let agent = agent_of(vm).await;
        let (code, out) = sh(
            &agent,
            "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; cat /etc/machine-id; hostname",
        )
        .await;
        assert_eq!(code, 0, "{out}");
        seen.push(out);
    }
    let lines = |o: &str| o.lines().map(str::to_string).collect::<Vec<_>>();
    for (a, b) in lines(&seen[0]).iter().zip(lines(&seen[1]).iter()) {
        assert_ne!(
            a, b,
            "two warm VMs share a value:\n{}\n{}",
            seen[0], seen[1]
        );
    }

    // The job ends: its VM goes and never runs another job; the slot gets a new one.
    client.delete(&vm0.id).await.unwrap();
    let after = wait_for_slots(&mut client, &[0]).await;
    let next = after.iter().find(|v| v.slot == Some(0)).unwrap();
    assert_ne!(next.id, vm0.id);
    let (again, _) = client.create(MICROVM_IMAGE, Some(0)).await.unwrap();
    assert!(again.warm);
    assert_eq!(again.id, next.id);

    fx.shutdown(&mut client).await;
}
