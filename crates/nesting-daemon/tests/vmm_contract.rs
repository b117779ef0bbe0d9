//! Contract tests of the Firecracker and Cloud Hypervisor backends without KVM: the real spawn
//! path runs a fake VMM (a shell loop carrying the real argv), and the API socket is served by
//! [`contract::ContractServer`], which checks every request against the published API
//! description in `../shared/specs`. Also the checker itself (the hybrid-vsock dialer's tests
//! are `slipway-nesting`'s `tests/vsock.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod contract;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use contract::{ApiSpec, ContractServer, Exchange};
use serde_json::{Value, json};
use slipway_nesting::{Accel, AgentChannel, Disk, DiskFormat, Level, VmSpec};
use slipway_nesting_daemon::hypervisor::cloud_hypervisor::CloudHypervisor;
use slipway_nesting_daemon::hypervisor::firecracker::Firecracker;
use slipway_nesting_daemon::hypervisor::is_running;
use slipway_nesting_daemon::{Hypervisor, HypervisorError, SnapshotFiles, VmProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GRACE: Duration = Duration::from_millis(300);

/// A temp dir with a fake VMM binary and a spec whose run dir is inside it.
struct Setup {
    dir: tempfile::TempDir,
    fake: PathBuf,
    spec: VmSpec,
}

impl Setup {
    /// `version` is what the fake prints for `--version`.
    fn new(version: &str) -> Setup {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake-vmm");
        // The shell itself stays the process (no exec), so its command line keeps the argv the
        // backend gave it: the marker check of `is_running` sees the real thing.
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\nif [ \"$1\" = --version ]; then echo '{version}'; exit 0; fi\n\
                 while :; do sleep 0.2; done\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // Another test thread forking while the script was open for writing would make exec
        // fail with ETXTBSY until that child execs: give it a moment.
        std::thread::sleep(Duration::from_millis(50));
        let id = format!(
            "t{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let spec = vm_spec(&id, &dir.path().join("run"));
        Setup { dir, fake, spec }
    }

    /// The same VM in another run dir (a branch restored beside the original).
    fn branch(&self, name: &str) -> VmSpec {
        let mut spec = vm_spec(
            &format!("{}-{name}", self.spec.id),
            &self.dir.path().join(name),
        );
        spec.agent = self.spec.agent.clone();
        spec
    }
}

fn vm_spec(id: &str, run_dir: &Path) -> VmSpec {
    VmSpec {
        id: id.to_string(),
        level: Level::Microvm,
        vcpus: 2,
        memory_mib: 256,
        kernel: "/images/vmlinux".into(),
        initrd: None,
        cmdline: "console=ttyS0 reboot=k panic=1".into(),
        disks: vec![
            Disk {
                id: "rootfs".into(),
                path: "/images/rootfs.ext4".into(),
                format: DiskFormat::Raw,
                root: true,
                read_only: true,
            },
            Disk {
                id: "work".into(),
                path: run_dir.join("work.img"),
                format: DiskFormat::Raw,
                root: false,
                read_only: false,
            },
        ],
        agent: AgentChannel::Vsock {
            cid: 3,
            port: 1024,
            socket: run_dir.join("v.sock"),
        },
        accel: Accel::Kvm,
        run_dir: run_dir.to_path_buf(),
        memory: Default::default(),
        network: Default::default(),
    }
}

/// A process's argv.
fn argv_of(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Wait (up to 2 s) until no live process carries `marker`. The fake shell forks for each
/// `sleep`, and a child killed-around between fork and exec still shows the shell's command line
/// for a moment; real VMMs do not fork, so only the settled state is asserted.
async fn assert_none_left(marker: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "processes left running: {:?}",
            left.iter().map(|p| argv_of(*p)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Pids of live processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            is_running(&VmProcess {
                pid: *pid,
                control: PathBuf::new(),
                marker: marker.to_string(),
            })
        })
        .collect()
}

/// The exchanges after the readiness probes (`GET` of the probe path at the start).
fn after_probes(exchanges: Vec<Exchange>, probe: &str) -> Vec<Exchange> {
    let first = exchanges
        .iter()
        .position(|e| e.call() != probe)
        .unwrap_or(exchanges.len());
    assert!(first >= 1, "no readiness probe {probe} before configuring");
    exchanges.into_iter().skip(first).collect()
}

fn calls(exchanges: &[Exchange]) -> Vec<String> {
    exchanges.iter().map(Exchange::call).collect()
}

fn body(exchange: &Exchange) -> Value {
    exchange.body.clone().unwrap_or(Value::Null)
}

/// The hypervisor, request and message of an API refusal; panics on anything else.
fn api_refusal<T: std::fmt::Debug>(
    result: Result<T, HypervisorError>,
) -> (&'static str, String, String) {
    match result {
        Err(HypervisorError::Api {
            hypervisor,
            request,
            message,
        }) => (hypervisor, request, message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A backend driving the fake VMM of a [`Setup`], and the API description its contract
/// servers check.
struct Rig {
    t: Setup,
    api: Arc<ApiSpec>,
    /// Name of the API socket in a run dir.
    socket: &'static str,
    vmm: Box<dyn Hypervisor>,
}

impl Rig {
    /// Firecracker over a fake printing `version`; `None` (the test is skipped) without its
    /// published API description.
    fn firecracker(version: &str) -> Option<Rig> {
        let api = ApiSpec::firecracker()?;
        let t = Setup::new(version);
        let vmm = Box::new(Firecracker {
            binary: t.fake.clone(),
        });
        Some(Rig {
            t,
            api,
            socket: "fc.sock",
            vmm,
        })
    }

    /// Cloud Hypervisor over a fake printing `version`, as [`Rig::firecracker`].
    fn cloud_hypervisor(version: &str) -> Option<Rig> {
        let api = ApiSpec::cloud_hypervisor()?;
        let t = Setup::new(version);
        let vmm = Box::new(CloudHypervisor {
            binary: t.fake.clone(),
        });
        Some(Rig {
            t,
            api,
            socket: "ch.sock",
            vmm,
        })
    }

    /// A contract server on the API socket of `spec`'s process.
    fn serve(&self, spec: &VmSpec) -> ContractServer {
        ContractServer::start(self.api.clone(), &spec.run_dir.join(self.socket))
    }

    /// The setup's VM booted against a contract server whose boot exchanges are taken.
    async fn booted(&self) -> (ContractServer, VmProcess) {
        let server = self.serve(&self.t.spec);
        let vm = self.vmm.boot(&self.t.spec).await.unwrap();
        server.take();
        (server, vm)
    }

    /// The setup's VM booted and snapshotted into `snap` (its server's exchanges taken), and the
    /// spec of a branch to restore it beside the original.
    async fn snapshot_and_branch(&self) -> (ContractServer, VmProcess, SnapshotFiles, VmSpec) {
        let (server, vm) = self.booted().await;
        let files = self
            .vmm
            .snapshot(&vm, &self.t.dir.path().join("snap"))
            .await
            .unwrap();
        server.take();
        (server, vm, files, self.t.branch("branch"))
    }

    /// Stop `vm` and check that its process is gone; stopping twice is not an error.
    async fn stop_and_check_gone(&self, vm: &VmProcess) {
        self.vmm.stop(vm, GRACE).await.unwrap();
        assert!(!is_running(vm), "process {} survived stop", vm.pid);
        assert_none_left(&vm.marker).await;
        self.vmm.stop(vm, GRACE).await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Firecracker

const FC_VERSION: &str = "Firecracker v1.17.0-dev";

#[tokio::test]
async fn firecracker_boot_sends_the_documented_requests_in_order() {
    let Some(rig) = Rig::firecracker(FC_VERSION) else {
        return;
    };
    let (t, fc) = (&rig.t, &rig.vmm);
    let server = rig.serve(&t.spec);

    let vm = fc.boot(&t.spec).await.unwrap();
    assert!(is_running(&vm));
    assert_eq!(vm.marker, t.spec.id);
    assert_eq!(vm.control, t.spec.run_dir.join("fc.sock"));
    let argv = argv_of(vm.pid);
    let sock = t.spec.run_dir.join("fc.sock").display().to_string();
    assert_eq!(
        argv[argv.len() - 4..],
        ["--api-sock", sock.as_str(), "--id", t.spec.id.as_str()]
    );

    server.assert_conforms();
    let exchanges = after_probes(server.exchanges(), "GET /");
    assert_eq!(
        calls(&exchanges),
        [
            "PUT /machine-config",
            "PUT /boot-source",
            "PUT /drives/rootfs",
            "PUT /drives/work",
            "PUT /vsock",
            "PUT /actions",
        ]
    );
    let work = t.spec.run_dir.join("work.img").display().to_string();
    let vsock = t.spec.run_dir.join("v.sock").display().to_string();
    let expected = [
        json!({"vcpu_count": 2, "mem_size_mib": 256}),
        json!({"kernel_image_path": "/images/vmlinux", "boot_args": "console=ttyS0 reboot=k panic=1"}),
        json!({"drive_id": "rootfs", "path_on_host": "/images/rootfs.ext4", "is_root_device": true, "is_read_only": true}),
        json!({"drive_id": "work", "path_on_host": work, "is_root_device": false, "is_read_only": false}),
        json!({"guest_cid": 3, "uds_path": vsock}),
        json!({"action_type": "InstanceStart"}),
    ];
    for (exchange, expected) in exchanges.iter().zip(expected) {
        assert_eq!(body(exchange), expected, "{}", exchange.call());
        assert_eq!(exchange.header("content-type"), Some("application/json"));
        assert_eq!(exchange.header("host"), Some("localhost"));
        assert_eq!(exchange.status, 204);
    }

    rig.stop_and_check_gone(&vm).await;
}

#[tokio::test]
async fn firecracker_pause_and_resume_patch_the_vm_state() {
    let Some(rig) = Rig::firecracker(FC_VERSION) else {
        return;
    };
    let (server, vm) = rig.booted().await;

    rig.vmm.pause(&vm).await.unwrap();
    rig.vmm.resume(&vm).await.unwrap();

    server.assert_conforms();
    let exchanges = server.exchanges();
    assert_eq!(calls(&exchanges), ["PATCH /vm", "PATCH /vm"]);
    assert_eq!(body(&exchanges[0]), json!({"state": "Paused"}));
    assert_eq!(body(&exchanges[1]), json!({"state": "Resumed"}));
    rig.stop_and_check_gone(&vm).await;
}

#[tokio::test]
async fn firecracker_snapshot_pauses_then_creates_a_full_snapshot() {
    let Some(rig) = Rig::firecracker(FC_VERSION) else {
        return;
    };
    let (server, vm) = rig.booted().await;

    let dir = rig.t.dir.path().join("snap");
    let files = rig.vmm.snapshot(&vm, &dir).await.unwrap();
    assert!(dir.is_dir(), "snapshot dir is created");
    assert_eq!(files.dir, dir);
    assert_eq!(files.state, dir.join("vmstate"));
    assert_eq!(files.memory, Some(dir.join("memory")));

    server.assert_conforms();
    let exchanges = server.exchanges();
    assert_eq!(calls(&exchanges), ["PATCH /vm", "PUT /snapshot/create"]);
    assert_eq!(body(&exchanges[0]), json!({"state": "Paused"}));
    assert_eq!(
        body(&exchanges[1]),
        json!({
            "snapshot_type": "Full",
            "snapshot_path": dir.join("vmstate").display().to_string(),
            "mem_file_path": dir.join("memory").display().to_string(),
        })
    );
    rig.stop_and_check_gone(&vm).await;
}

#[tokio::test]
async fn firecracker_restore_loads_the_snapshot_first_in_a_new_process() {
    let Some(rig) = Rig::firecracker(FC_VERSION) else {
        return;
    };
    let (original, vm, files, branch) = rig.snapshot_and_branch().await;

    // Restored beside the original (a branch): its own run dir, API socket and process.
    let server = rig.serve(&branch);
    let restored = rig.vmm.restore(&branch, &files).await.unwrap();
    assert_ne!(restored.pid, vm.pid);
    assert!(is_running(&restored) && is_running(&vm));
    assert_eq!(restored.control, branch.run_dir.join("fc.sock"));
    assert!(argv_of(restored.pid).contains(&branch.id));

    server.assert_conforms();
    assert!(
        original.exchanges().is_empty(),
        "nothing went to the original"
    );
    let exchanges = after_probes(server.exchanges(), "GET /");
    assert_eq!(
        calls(&exchanges),
        ["PUT /snapshot/load"],
        "load is the first configuring call"
    );
    assert_eq!(
        body(&exchanges[0]),
        json!({
            "snapshot_path": files.state.display().to_string(),
            "mem_backend": {
                "backend_type": "File",
                "backend_path": files.memory.as_ref().unwrap().display().to_string(),
            },
            "resume_vm": true,
        })
    );

    rig.stop_and_check_gone(&restored).await;
    assert!(is_running(&vm), "stopping the branch leaves the original");
    rig.stop_and_check_gone(&vm).await;
}

#[tokio::test]
async fn firecracker_identity_reads_the_version() {
    let Some(rig) = Rig::firecracker("Firecracker v1.16.1") else {
        return;
    };
    let fc = &rig.vmm;
    // No process yet: the binary's `--version`.
    let id = fc.identity(&rig.t.spec).await.unwrap();
    assert_eq!(id.hypervisor, "firecracker");
    assert_eq!(id.version, "1.16.1");
    assert_eq!(id.machine, "firecracker");
    assert!(id.cpu_model.starts_with("host:"), "{}", id.cpu_model);

    // A running VM for the spec: `GET /version`.
    let server = rig.serve(&rig.t.spec);
    let id = fc.identity(&rig.t.spec).await.unwrap();
    assert_eq!(id.version, "1.17.0-dev");
    assert_eq!(server.calls(), ["GET /version"]);
    server.assert_conforms();
    assert_eq!(
        fc.capabilities(),
        slipway_nesting::Capabilities {
            snapshot: true,
            vsock: true,
            pause: true,
            without_kvm: false,
            lazy_restore: true,
        }
    );
}

#[tokio::test]
async fn firecracker_refusal_carries_the_fault_message_and_leaves_no_process() {
    let Some(rig) = Rig::firecracker(FC_VERSION) else {
        return;
    };
    let server = rig.serve(&rig.t.spec);
    server.force(
        "PUT",
        "/drives/work",
        400,
        r#"{"fault_message":"Unable to create the block device: No such file"}"#,
    );
    let (hypervisor, request, message) = api_refusal(rig.vmm.boot(&rig.t.spec).await);
    assert_eq!(hypervisor, "firecracker");
    assert_eq!(request, "PUT /drives/work");
    assert!(
        message.contains("Unable to create the block device"),
        "{message}"
    );
    assert!(message.contains("400"), "{message}");
    // A half-configured VM is not left running.
    assert_none_left(&rig.t.spec.id).await;
    assert!(!server.calls().contains(&"PUT /actions".to_string()));
    server.assert_conforms();
}

#[tokio::test]
async fn firecracker_refuses_unrunnable_specs_before_spawning() {
    // No API server involved: runs without the published description too.
    let t = Setup::new(FC_VERSION);
    let fc = Firecracker {
        binary: t.fake.clone(),
    };
    let mut qcow = t.spec.clone();
    qcow.disks[0].format = DiskFormat::Qcow2;
    let mut serial = t.spec.clone();
    serial.agent = AgentChannel::VirtioSerial {
        name: "slipway.agent".into(),
        socket: t.spec.run_dir.join("agent.sock"),
    };
    for (spec, needle) in [(qcow, "qcow2"), (serial, "virtio-serial")] {
        match fc.boot(&spec).await {
            Err(HypervisorError::Spec { message, .. }) => {
                assert!(message.contains(needle), "{message}")
            }
            other => panic!("expected a spec error, got {other:?}"),
        }
    }
    assert_none_left(&t.spec.id).await;
}

// ---------------------------------------------------------------------------------------------
// Cloud Hypervisor

const CH_VERSION: &str = "cloud-hypervisor v48.0.0";
const PING: &str = "GET /api/v1/vmm.ping";

#[tokio::test]
async fn cloud_hypervisor_boot_creates_then_boots() {
    let Some(rig) = Rig::cloud_hypervisor(CH_VERSION) else {
        return;
    };
    let t = &rig.t;
    let server = rig.serve(&t.spec);

    let vm = rig.vmm.boot(&t.spec).await.unwrap();
    assert!(is_running(&vm));
    let sock = t.spec.run_dir.join("ch.sock");
    assert_eq!(vm.control, sock);
    assert_eq!(vm.marker, sock.display().to_string());
    let argv = argv_of(vm.pid);
    assert_eq!(
        argv[argv.len() - 2..],
        [
            "--api-socket".to_string(),
            format!("path={}", sock.display())
        ]
    );

    server.assert_conforms();
    let exchanges = after_probes(server.exchanges(), PING);
    assert_eq!(
        calls(&exchanges),
        ["PUT /api/v1/vm.create", "PUT /api/v1/vm.boot"]
    );
    assert_eq!(
        body(&exchanges[0]),
        json!({
            "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
            "memory": {"size": 256u64 * 1024 * 1024},
            "payload": {
                "kernel": "/images/vmlinux",
                "cmdline": "console=ttyS0 reboot=k panic=1 root=/dev/vda ro",
            },
            "disks": [
                {"path": "/images/rootfs.ext4", "readonly": true},
                {"path": t.spec.run_dir.join("work.img").display().to_string(), "readonly": false},
            ],
            "vsock": {"cid": 3, "socket": t.spec.run_dir.join("v.sock").display().to_string()},
        })
    );
    assert_eq!(exchanges[1].body, None, "vm.boot takes no body");
    rig.stop_and_check_gone(&vm).await;
}

#[tokio::test]
async fn cloud_hypervisor_pause_resume_and_snapshot() {
    let Some(rig) = Rig::cloud_hypervisor(CH_VERSION) else {
        return;
    };
    let (server, vm) = rig.booted().await;

    rig.vmm.pause(&vm).await.unwrap();
    rig.vmm.resume(&vm).await.unwrap();
    assert_eq!(
        server.calls(),
        ["PUT /api/v1/vm.pause", "PUT /api/v1/vm.resume"]
    );
    server.take();

    let dir = rig.t.dir.path().join("snap");
    let files = rig.vmm.snapshot(&vm, &dir).await.unwrap();
    assert!(dir.is_dir(), "snapshot dir is created");
    assert_eq!(files.state, dir.join("state.json"));
    assert_eq!(files.memory, Some(dir.join("memory-ranges")));
    let exchanges = server.exchanges();
    assert_eq!(
        calls(&exchanges),
        ["PUT /api/v1/vm.pause", "PUT /api/v1/vm.snapshot"]
    );
    assert_eq!(
        body(&exchanges[1]),
        json!({"destination_url": format!("file://{}", dir.display())})
    );
    server.assert_conforms();
    rig.stop_and_check_gone(&vm).await;
}

#[tokio::test]
async fn cloud_hypervisor_restore_then_resume_in_a_new_process() {
    let Some(rig) = Rig::cloud_hypervisor(CH_VERSION) else {
        return;
    };
    let (original, vm, files, branch) = rig.snapshot_and_branch().await;

    let server = rig.serve(&branch);
    let restored = rig.vmm.restore(&branch, &files).await.unwrap();
    assert_ne!(restored.pid, vm.pid);
    assert!(is_running(&restored));

    server.assert_conforms();
    assert!(original.exchanges().is_empty());
    let exchanges = after_probes(server.exchanges(), PING);
    assert_eq!(
        calls(&exchanges),
        ["PUT /api/v1/vm.restore", "PUT /api/v1/vm.resume"]
    );
    assert_eq!(
        body(&exchanges[0]),
        json!({"source_url": format!("file://{}", files.dir.display())})
    );
    rig.stop_and_check_gone(&restored).await;
    rig.stop_and_check_gone(&vm).await;
}

#[tokio::test]
async fn cloud_hypervisor_stop_asks_vm_then_vmm_to_shut_down() {
    let Some(rig) = Rig::cloud_hypervisor(CH_VERSION) else {
        return;
    };
    let (server, vm) = rig.booted().await;

    // The fake does not exit on vmm.shutdown: stop must fall back to SIGKILL after the grace.
    rig.vmm.stop(&vm, GRACE).await.unwrap();
    assert!(!is_running(&vm));
    assert_eq!(
        server.calls(),
        ["PUT /api/v1/vm.shutdown", "PUT /api/v1/vmm.shutdown"]
    );
    server.assert_conforms();
}

#[tokio::test]
async fn cloud_hypervisor_identity_and_plain_text_errors() {
    let Some(rig) = Rig::cloud_hypervisor("cloud-hypervisor v47.0.1") else {
        return;
    };
    let (t, ch) = (&rig.t, &rig.vmm);
    let id = ch.identity(&t.spec).await.unwrap();
    assert_eq!(id.hypervisor, "cloud-hypervisor");
    assert_eq!(id.version, "47.0.1");
    assert_eq!(id.machine, "cloud-hypervisor");
    assert!(!ch.capabilities().lazy_restore && ch.capabilities().snapshot);

    let server = rig.serve(&t.spec);
    assert_eq!(ch.identity(&t.spec).await.unwrap().version, "48.0.0");
    assert_eq!(server.calls(), [PING]);

    server.force(
        "PUT",
        "/api/v1/vm.boot",
        500,
        "Error booting VM: kernel not found",
    );
    let (_, request, message) = api_refusal(ch.boot(&t.spec).await);
    assert_eq!(request, "PUT /api/v1/vm.boot");
    assert!(message.contains("kernel not found"), "{message}");
    assert_none_left(&t.spec.run_dir.join("ch.sock").display().to_string()).await;
    server.assert_conforms();
}

// ---------------------------------------------------------------------------------------------
// The checker catches bad requests

/// Assert that one of `violations` mentions `needle`.
#[track_caller]
fn assert_mentions(violations: &[String], needle: &str) {
    assert!(
        violations.iter().any(|v| v.contains(needle)),
        "no violation mentions {needle:?}: {violations:?}"
    );
}

#[test]
fn checker_reports_firecracker_contract_violations() {
    let Some(api) = ApiSpec::firecracker() else {
        return;
    };
    let json_ct = Some("application/json");
    let check =
        |method: &str, path: &str, body: Value| api.check(method, path, json_ct, Some(&body));

    assert!(
        check(
            "PUT",
            "/machine-config",
            json!({"vcpu_count": 2, "mem_size_mib": 128})
        )
        .is_empty()
    );
    assert_mentions(
        &check(
            "PUT",
            "/machine-config",
            json!({"vcpu_count": 2, "mem_size_mib": 128, "memory_mib": 128}),
        ),
        "unknown field `memory_mib`",
    );
    assert_mentions(
        &check("PUT", "/boot-source", json!({"boot_args": "console=ttyS0"})),
        "`kernel_image_path` is missing",
    );
    assert_mentions(
        &check(
            "PUT",
            "/machine-config",
            json!({"vcpu_count": "2", "mem_size_mib": 128}),
        ),
        "expected an integer",
    );
    assert_mentions(
        &check(
            "PUT",
            "/machine-config",
            json!({"vcpu_count": 64, "mem_size_mib": 128}),
        ),
        "maximum",
    );
    assert_mentions(
        &check("PUT", "/actions", json!({"action_type": "Start"})),
        "is not one of",
    );
    // Through a $ref with a sibling description (SnapshotLoadParams.mem_backend).
    assert_mentions(
        &check(
            "PUT",
            "/snapshot/load",
            json!({"snapshot_path": "/s", "mem_backend": {"backend_type": "Mmap", "backend_path": "/m"}}),
        ),
        "body.mem_backend.backend_type",
    );
    assert_mentions(
        &check(
            "PUT",
            "/drives/rootfs",
            json!({"drive_id": "other", "is_root_device": true, "path_on_host": "/r", "is_read_only": false}),
        ),
        "drive_id",
    );
    assert!(
        !api.check("PUT", "/drive/rootfs", json_ct, None).is_empty(),
        "unknown path"
    );
    assert!(
        !api.check("DELETE", "/vm", json_ct, None).is_empty(),
        "unknown method"
    );
    assert!(
        !api.check("PUT", "/actions", json_ct, None).is_empty(),
        "missing required body"
    );
    assert_mentions(
        &api.check(
            "PATCH",
            "/vm",
            Some("text/plain"),
            Some(&json!({"state": "Paused"})),
        ),
        "Content-Type",
    );
}

#[test]
fn checker_reports_cloud_hypervisor_contract_violations() {
    let Some(api) = ApiSpec::cloud_hypervisor() else {
        return;
    };
    let json_ct = Some("application/json");
    let create = |body: Value| api.check("PUT", "/api/v1/vm.create", json_ct, Some(&body));
    assert!(
        create(json!({"payload": {"kernel": "/k"}, "cpus": {"boot_vcpus": 1, "max_vcpus": 1}}))
            .is_empty()
    );
    let missing = create(json!({"cpus": {"boot_vcpus": 1}}));
    assert_mentions(&missing, "`payload` is missing");
    assert_mentions(&missing, "`max_vcpus` is missing");
    let typed =
        create(json!({"payload": {"kernel": 7}, "disks": [{"path": "/d", "readonly": "yes"}]}));
    assert_mentions(&typed, "body.payload.kernel");
    assert_mentions(&typed, "body.disks[0].readonly");
    assert_mentions(
        &create(json!({"payload": {}, "vsock": {"cid": 2, "socket": "/v"}})),
        "minimum",
    );
    assert!(
        !api.check("PUT", "/api/v1/vm.boot", json_ct, Some(&json!({})))
            .is_empty(),
        "vm.boot has no body"
    );
    assert!(
        !api.check("PUT", "/vm.boot", json_ct, None).is_empty(),
        "outside /api/v1"
    );
    assert!(
        !api.check("PUT", "/api/v1/vm.restore", json_ct, Some(&json!({})))
            .is_empty()
    );
}

#[tokio::test]
async fn contract_server_answers_a_violation_with_400_and_records_it() {
    let Some(api) = ApiSpec::firecracker() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fc.sock");
    let server = ContractServer::start(api, &socket);

    let body = r#"{"vcpu_count":2,"mem_size_mib":128,"smt_enabled":true}"#;
    let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    stream
        .write_all(
            format!(
                "PUT /machine-config HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(
        reply.contains("fault_message") && reply.contains("smt_enabled"),
        "{reply}"
    );

    let violations = server.violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("unknown field `smt_enabled`"));
    let panicked =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.assert_conforms()));
    assert!(
        panicked.is_err(),
        "assert_conforms must fail on a violation"
    );
}
