//! Firecracker backend: one `firecracker --api-sock <run_dir>/fc.sock --id <id>` process per VM,
//! configured through its REST API (machine, boot source, drives, vsock, then `InstanceStart`).
//!
//! The request bodies carry exactly the fields of Firecracker's published API description: its
//! server rejects unknown fields. Request rendering is pure ([`boot_requests`],
//! [`snapshot_request`], [`load_request`], …) so it is tested without a process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use http::Method;
use serde_json::{Value, json};
use slipway_nesting::spec::{Accel, AgentChannel, Capabilities, DiskFormat, Level, VmSpec};

pub use super::http::ApiCall;
pub use slipway_nesting::vsock::connect_vsock;

use super::http::path_str;
use super::rest::{API_TIMEOUT, RestVmm, SNAPSHOT_TIMEOUT};
use super::{Hypervisor, HypervisorError, Identity, SnapshotFiles, VmProcess};
use crate::hypervisor::process::{self, stop_with};

const KIND: &str = "firecracker";

/// Name of the API socket in the VM's run directory.
pub const API_SOCKET: &str = "fc.sock";
/// Name of the process's log (stdout and stderr) in the VM's run directory.
pub const LOG_FILE: &str = "firecracker.log";
/// Name of the device-state file in a snapshot directory.
pub const STATE_FILE: &str = "vmstate";
/// Name of the guest-memory file in a snapshot directory.
pub const MEMORY_FILE: &str = "memory";

/// Firecracker's limit on vCPUs (`MachineConfiguration.vcpu_count`).
const MAX_VCPUS: u32 = 32;
/// Firecracker's limit on `--id` (the jailer's too).
const MAX_ID_LEN: usize = 64;

/// Firecracker's process: marked by its `--id`, ready once `GET /` answers.
const VMM: RestVmm = RestVmm {
    kind: KIND,
    api_socket: API_SOCKET,
    log_file: LOG_FILE,
    argv,
    marker: |spec| Ok(spec.id.clone()),
    probe: || ApiCall::bare(Method::GET, "/"),
    version: (
        || ApiCall::bare(Method::GET, "/version"),
        "firecracker_version",
    ),
};

/// The Firecracker backend.
#[derive(Debug, Clone)]
pub struct Firecracker {
    /// The `firecracker` binary (looked up on `PATH` when not a path).
    pub binary: PathBuf,
}

impl Default for Firecracker {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("firecracker"),
        }
    }
}

#[async_trait]
impl Hypervisor for Firecracker {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            snapshot: true,
            vsock: true,
            pause: true,
            without_kvm: false,
            lazy_restore: true,
        }
    }

    async fn identity(&self, spec: &VmSpec) -> Result<Identity, HypervisorError> {
        VMM.identity(&self.binary, spec).await
    }

    async fn boot(&self, spec: &VmSpec) -> Result<VmProcess, HypervisorError> {
        // Rendered first: a spec Firecracker cannot run fails before any process starts.
        let calls = boot_requests(spec)?;
        VMM.launch(&self.binary, spec, &calls, API_TIMEOUT).await
    }

    async fn pause(&self, vm: &VmProcess) -> Result<(), HypervisorError> {
        VMM.send(vm, &vm_state_request(true)).await
    }

    async fn resume(&self, vm: &VmProcess) -> Result<(), HypervisorError> {
        VMM.send(vm, &vm_state_request(false)).await
    }

    async fn snapshot(&self, vm: &VmProcess, dir: &Path) -> Result<SnapshotFiles, HypervisorError> {
        VMM.snapshot(vm, dir, &vm_state_request(true), snapshot_request)
            .await
    }

    async fn restore(
        &self,
        spec: &VmSpec,
        snapshot: &SnapshotFiles,
    ) -> Result<VmProcess, HypervisorError> {
        // The devices come from the snapshot; the spec is still checked so that a spec this
        // backend could not have booted is refused the same way.
        boot_requests(spec)?;
        let load = load_request(snapshot)?;
        // `/snapshot/load` must be the first configuring call of the new process.
        VMM.launch(&self.binary, spec, &[load], SNAPSHOT_TIMEOUT)
            .await
    }

    async fn stop(&self, vm: &VmProcess, grace: Duration) -> Result<(), HypervisorError> {
        // No polite API shutdown: `SendCtrlAltDel` depends on the guest (x86 only, needs an
        // i8042 driver) and the VM's state is worthless once stopped, so SIGTERM, then SIGKILL.
        stop_with(vm, grace, async {
            process::signal(vm, nix::sys::signal::Signal::SIGTERM)
        })
        .await
    }
}

/// The API socket of `spec`'s process.
pub fn api_socket(spec: &VmSpec) -> PathBuf {
    VMM.api_socket(spec)
}

/// The process's arguments: `--api-sock <run_dir>/fc.sock --id <id>` (the id is the process's
/// marker; Firecracker accepts 1–64 alphanumerics and `-`).
pub fn argv(spec: &VmSpec) -> Result<Vec<String>, HypervisorError> {
    let id_ok = !spec.id.is_empty()
        && spec.id.len() <= MAX_ID_LEN
        && spec
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !id_ok {
        return Err(spec_error(format!(
            "VM id {:?} must be 1-{MAX_ID_LEN} ASCII letters, digits or '-' (Firecracker's --id)",
            spec.id
        )));
    }
    Ok(vec![
        "--api-sock".to_string(),
        path_str(KIND, &api_socket(spec), "API socket")?.to_string(),
        "--id".to_string(),
        spec.id.clone(),
    ])
}

/// The calls that configure and start a fresh process for `spec`, in order: machine config,
/// boot source, each drive, vsock, `InstanceStart`.
pub fn boot_requests(spec: &VmSpec) -> Result<Vec<ApiCall>, HypervisorError> {
    if spec.accel != Accel::Kvm {
        return Err(spec_error(format!(
            "accelerator {} is not available: Firecracker runs on KVM only",
            spec.accel.as_str()
        )));
    }
    if spec.level != Level::Microvm {
        return Err(spec_error(format!(
            "level {} needs a general machine (QEMU); Firecracker runs microVMs only",
            spec.level.as_str()
        )));
    }
    if !(1..=MAX_VCPUS).contains(&spec.vcpus) {
        return Err(spec_error(format!(
            "{} vCPUs: Firecracker takes 1 to {MAX_VCPUS}",
            spec.vcpus
        )));
    }
    if spec.memory_mib == 0 {
        return Err(spec_error("memory must be at least 1 MiB".to_string()));
    }

    let mut calls = vec![ApiCall::new(
        Method::PUT,
        "/machine-config",
        json!({ "vcpu_count": spec.vcpus, "mem_size_mib": spec.memory_mib }),
    )];

    let mut boot = serde_json::Map::new();
    boot.insert(
        "kernel_image_path".into(),
        path_str(KIND, &spec.kernel, "kernel")?.into(),
    );
    // Empty command line: leave Firecracker's default rather than boot with none.
    if !spec.cmdline.is_empty() {
        boot.insert("boot_args".into(), spec.cmdline.clone().into());
    }
    if let Some(initrd) = &spec.initrd {
        boot.insert(
            "initrd_path".into(),
            path_str(KIND, initrd, "initrd")?.into(),
        );
    }
    calls.push(ApiCall::new(
        Method::PUT,
        "/boot-source",
        Value::Object(boot),
    ));

    let mut seen = Vec::new();
    for (index, disk) in spec.disks.iter().enumerate() {
        if disk.format != DiskFormat::Raw {
            return Err(spec_error(format!(
                "disk {:?} is qcow2: Firecracker reads raw images only (convert with \
                 `qemu-img convert -O raw`)",
                disk.id
            )));
        }
        // Firecracker's rule for resource ids in API paths.
        if disk.id.is_empty()
            || !disk
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(spec_error(format!(
                "disk id {:?} must be ASCII letters, digits or '_' (Firecracker drive ids)",
                disk.id
            )));
        }
        if seen.contains(&disk.id.as_str()) {
            return Err(spec_error(format!("disk id {:?} is used twice", disk.id)));
        }
        seen.push(disk.id.as_str());
        // Firecracker always attaches the root drive as /dev/vda, whatever its position.
        if disk.root && index != 0 {
            return Err(spec_error(format!(
                "root disk {:?} must come first: Firecracker attaches it as /dev/vda",
                disk.id
            )));
        }
        calls.push(ApiCall::new(
            Method::PUT,
            format!("/drives/{}", disk.id),
            json!({
                "drive_id": disk.id,
                "path_on_host": path_str(KIND, &disk.path, "disk")?,
                "is_root_device": disk.root,
                "is_read_only": disk.read_only,
            }),
        ));
    }

    match &spec.agent {
        AgentChannel::Vsock { cid, socket, .. } => {
            if *cid < 3 {
                return Err(spec_error(format!(
                    "vsock guest CID {cid} is reserved (use 3 or more)"
                )));
            }
            calls.push(ApiCall::new(
                Method::PUT,
                "/vsock",
                json!({ "guest_cid": cid, "uds_path": path_str(KIND, socket, "vsock socket")? }),
            ));
        }
        AgentChannel::VirtioSerial { .. } => {
            return Err(spec_error(
                "the agent channel is virtio-serial, which Firecracker does not have: use a \
                 vsock channel (guest agent `--vsock PORT`)"
                    .to_string(),
            ));
        }
    }

    calls.push(ApiCall::new(
        Method::PUT,
        "/actions",
        json!({ "action_type": "InstanceStart" }),
    ));
    Ok(calls)
}

/// `PATCH /vm` to `Paused` (`paused`) or `Resumed`.
pub fn vm_state_request(paused: bool) -> ApiCall {
    let state = if paused { "Paused" } else { "Resumed" };
    ApiCall::new(Method::PATCH, "/vm", json!({ "state": state }))
}

/// The full-snapshot call writing into `dir`, and the files it produces.
pub fn snapshot_request(dir: &Path) -> Result<(ApiCall, SnapshotFiles), HypervisorError> {
    let files = SnapshotFiles {
        dir: dir.to_path_buf(),
        state: dir.join(STATE_FILE),
        memory: Some(dir.join(MEMORY_FILE)),
    };
    let call = ApiCall::new(
        Method::PUT,
        "/snapshot/create",
        json!({
            "snapshot_type": "Full",
            "snapshot_path": path_str(KIND, &files.state, "snapshot state")?,
            "mem_file_path": path_str(KIND, &dir.join(MEMORY_FILE), "snapshot memory")?,
        }),
    );
    Ok((call, files))
}

/// The `/snapshot/load` call of a restore: memory mapped from the file (`File` backend, a
/// private copy-on-write mapping, so branches of one snapshot share its page cache) and the VM
/// resumed. No `vsock_override`: releases before it (1.15 included) refuse the whole load, so
/// the restored vsock listens where the snapshotted one did.
pub fn load_request(snapshot: &SnapshotFiles) -> Result<ApiCall, HypervisorError> {
    let Some(memory) = &snapshot.memory else {
        return Err(spec_error(format!(
            "snapshot in {} has no memory file",
            snapshot.dir.display()
        )));
    };
    let body = json!({
        "snapshot_path": path_str(KIND, &snapshot.state, "snapshot state")?,
        "mem_backend": {
            "backend_type": "File",
            "backend_path": path_str(KIND, memory, "snapshot memory")?,
        },
        "resume_vm": true,
    });
    Ok(ApiCall::new(Method::PUT, "/snapshot/load", body))
}

fn spec_error(message: String) -> HypervisorError {
    HypervisorError::Spec {
        hypervisor: KIND,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hypervisor::rest::fixtures::spec;

    fn spec_message(err: HypervisorError) -> String {
        crate::hypervisor::rest::fixtures::spec_message(KIND, err)
    }

    #[test]
    fn argv_names_socket_and_id() {
        assert_eq!(
            argv(&spec()).unwrap(),
            ["--api-sock", "/run/vm/fc.sock", "--id", "job-1"]
        );
        let mut bad = spec();
        bad.id = "job_1".into();
        assert!(spec_message(argv(&bad).unwrap_err()).contains("--id"));
    }

    #[test]
    fn boot_requests_render_documented_bodies_in_order() {
        let calls = boot_requests(&spec()).unwrap();
        let paths: Vec<_> = calls.iter().map(ApiCall::describe).collect();
        assert_eq!(
            paths,
            [
                "PUT /machine-config",
                "PUT /boot-source",
                "PUT /drives/rootfs",
                "PUT /drives/work",
                "PUT /vsock",
                "PUT /actions"
            ]
        );
        assert_eq!(
            calls[0].body,
            Some(json!({"vcpu_count": 2, "mem_size_mib": 512}))
        );
        assert_eq!(
            calls[1].body,
            Some(json!({
                "kernel_image_path": "/img/vmlinux",
                "boot_args": "console=ttyS0 panic=1",
                "initrd_path": "/img/initrd"
            }))
        );
        assert_eq!(
            calls[2].body,
            Some(json!({
                "drive_id": "rootfs", "path_on_host": "/img/rootfs.ext4",
                "is_root_device": true, "is_read_only": true
            }))
        );
        assert_eq!(
            calls[4].body,
            Some(json!({"guest_cid": 3, "uds_path": "/run/vm/v.sock"}))
        );
        assert_eq!(calls[5].body, Some(json!({"action_type": "InstanceStart"})));
    }

    #[test]
    fn optional_boot_fields_are_left_out() {
        let mut s = spec();
        s.initrd = None;
        s.cmdline.clear();
        let calls = boot_requests(&s).unwrap();
        assert_eq!(
            calls[1].body,
            Some(json!({"kernel_image_path": "/img/vmlinux"}))
        );
    }

    #[test]
    fn qcow2_disk_is_a_spec_error() {
        let mut s = spec();
        s.disks[1].format = DiskFormat::Qcow2;
        let message = spec_message(boot_requests(&s).unwrap_err());
        assert!(
            message.contains("qcow2") && message.contains("raw"),
            "{message}"
        );
    }

    #[test]
    fn virtio_serial_agent_is_a_spec_error() {
        let mut s = spec();
        s.agent = AgentChannel::VirtioSerial {
            name: "slipway.agent".into(),
            socket: "/run/vm/agent.sock".into(),
        };
        let message = spec_message(boot_requests(&s).unwrap_err());
        assert!(message.contains("virtio-serial"), "{message}");
        assert!(message.contains("vsock"), "{message}");
    }

    #[test]
    fn other_unrunnable_specs_are_refused() {
        let mut s = spec();
        s.accel = Accel::Tcg;
        assert!(spec_message(boot_requests(&s).unwrap_err()).contains("KVM"));
        let mut s = spec();
        s.vcpus = 33;
        assert!(spec_message(boot_requests(&s).unwrap_err()).contains("33"));
        let mut s = spec();
        s.disks.swap(0, 1);
        assert!(spec_message(boot_requests(&s).unwrap_err()).contains("first"));
        let mut s = spec();
        s.disks[1].id = "work-2".into();
        assert!(spec_message(boot_requests(&s).unwrap_err()).contains("work-2"));
        let mut s = spec();
        s.level = Level::Vm;
        assert!(spec_message(boot_requests(&s).unwrap_err()).contains("microVM"));
    }

    #[test]
    fn snapshot_and_load_requests() {
        let (call, files) = snapshot_request(Path::new("/snap/a")).unwrap();
        assert_eq!(call.describe(), "PUT /snapshot/create");
        assert_eq!(
            call.body,
            Some(json!({
                "snapshot_type": "Full",
                "snapshot_path": "/snap/a/vmstate",
                "mem_file_path": "/snap/a/memory"
            }))
        );
        let load = load_request(&files).unwrap();
        assert_eq!(
            load.body,
            Some(json!({
                "snapshot_path": "/snap/a/vmstate",
                "mem_backend": {"backend_type": "File", "backend_path": "/snap/a/memory"},
                "resume_vm": true
            }))
        );
    }
}
