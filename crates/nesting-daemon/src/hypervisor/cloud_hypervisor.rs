//! Cloud Hypervisor backend: one `cloud-hypervisor --api-socket path=<run_dir>/ch.sock` process
//! per VM, given its whole configuration in one `vm.create` body, then `vm.boot`.
//!
//! Request rendering is pure ([`vm_config`], [`boot_requests`], [`restore_requests`], …) so it is
//! tested without a process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use http::Method;
use serde_json::{Value, json};
use slipway_nesting::spec::{Accel, AgentChannel, Capabilities, DiskFormat, VmSpec};

pub use super::http::ApiCall;
pub use slipway_nesting::vsock::connect_vsock;

use super::http::path_str;
use super::rest::{API_TIMEOUT, RestVmm, SNAPSHOT_TIMEOUT};
use super::{Hypervisor, HypervisorError, Identity, SnapshotFiles, VmProcess};
use crate::hypervisor::process::stop_with;

const KIND: &str = "cloud-hypervisor";

/// Name of the API socket in the VM's run directory.
pub const API_SOCKET: &str = "ch.sock";
/// Name of the process's log (stdout and stderr) in the VM's run directory.
pub const LOG_FILE: &str = "cloud-hypervisor.log";
/// Prefix of every API path.
pub const API_PREFIX: &str = "/api/v1";
/// Device-state file Cloud Hypervisor writes into a snapshot directory.
pub const STATE_FILE: &str = "state.json";
/// Guest-memory file Cloud Hypervisor writes into a snapshot directory.
pub const MEMORY_FILE: &str = "memory-ranges";

/// Cloud Hypervisor's VMM process (no VM until `vm.create`): marked by its API socket path,
/// ready once `vmm.ping` answers, which also carries the version.
const VMM: RestVmm = RestVmm {
    kind: KIND,
    api_socket: API_SOCKET,
    log_file: LOG_FILE,
    argv,
    // The socket path is unique per VM (its run dir) and sits in the command line.
    marker: |spec| Ok(path_str(KIND, &api_socket(spec), "API socket")?.to_string()),
    probe: ping,
    version: (ping, "version"),
};

/// The Cloud Hypervisor backend.
#[derive(Debug, Clone)]
pub struct CloudHypervisor {
    /// The `cloud-hypervisor` binary (looked up on `PATH` when not a path).
    pub binary: PathBuf,
}

impl Default for CloudHypervisor {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("cloud-hypervisor"),
        }
    }
}

#[async_trait]
impl Hypervisor for CloudHypervisor {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            snapshot: true,
            vsock: true,
            pause: true,
            without_kvm: false,
            // Restores use the default `Copy` mode (the `OnDemand` mode needs userfaultfd).
            lazy_restore: false,
        }
    }

    async fn identity(&self, spec: &VmSpec) -> Result<Identity, HypervisorError> {
        VMM.identity(&self.binary, spec).await
    }

    async fn boot(&self, spec: &VmSpec) -> Result<VmProcess, HypervisorError> {
        // Rendered first: a spec Cloud Hypervisor cannot run fails before any process starts.
        let calls = boot_requests(spec)?;
        VMM.launch(&self.binary, spec, &calls, API_TIMEOUT).await
    }

    async fn pause(&self, vm: &VmProcess) -> Result<(), HypervisorError> {
        VMM.send(vm, &pause_request()).await
    }

    async fn resume(&self, vm: &VmProcess) -> Result<(), HypervisorError> {
        VMM.send(vm, &api_call(Method::PUT, "vm.resume", None))
            .await
    }

    async fn snapshot(&self, vm: &VmProcess, dir: &Path) -> Result<SnapshotFiles, HypervisorError> {
        VMM.snapshot(vm, dir, &pause_request(), snapshot_request)
            .await
    }

    async fn restore(
        &self,
        spec: &VmSpec,
        snapshot: &SnapshotFiles,
    ) -> Result<VmProcess, HypervisorError> {
        // The devices come from the snapshot's config.json; the spec is still checked so that a
        // spec this backend could not have booted is refused the same way.
        boot_requests(spec)?;
        let calls = restore_requests(snapshot)?;
        VMM.launch(&self.binary, spec, &calls, SNAPSHOT_TIMEOUT)
            .await
    }

    async fn stop(&self, vm: &VmProcess, grace: Duration) -> Result<(), HypervisorError> {
        let polite = async {
            // A VM that never booted refuses vm.shutdown; the VMM still has to go.
            let _ = VMM
                .send(vm, &api_call(Method::PUT, "vm.shutdown", None))
                .await;
            VMM.send(vm, &api_call(Method::PUT, "vmm.shutdown", None))
                .await
        };
        stop_with(vm, grace, polite).await
    }
}

/// The API socket of `spec`'s process.
pub fn api_socket(spec: &VmSpec) -> PathBuf {
    VMM.api_socket(spec)
}

/// `GET /api/v1/vmm.ping`: answers as soon as the VMM runs, with its version.
fn ping() -> ApiCall {
    api_call(Method::GET, "vmm.ping", None)
}

/// `PUT /api/v1/vm.pause`.
fn pause_request() -> ApiCall {
    api_call(Method::PUT, "vm.pause", None)
}

/// The process's arguments: `--api-socket path=<run_dir>/ch.sock`.
pub fn argv(spec: &VmSpec) -> Result<Vec<String>, HypervisorError> {
    Ok(vec![
        "--api-socket".to_string(),
        format!("path={}", path_str(KIND, &api_socket(spec), "API socket")?),
    ])
}

/// `METHOD /api/v1/<endpoint>`.
pub fn api_call(method: Method, endpoint: &str, body: Option<Value>) -> ApiCall {
    ApiCall {
        method,
        path: format!("{API_PREFIX}/{endpoint}"),
        body,
    }
}

/// The `vm.create` body (`VmConfig`) for `spec`.
pub fn vm_config(spec: &VmSpec) -> Result<Value, HypervisorError> {
    if spec.accel != Accel::Kvm {
        return Err(spec_error(format!(
            "accelerator {} is not available: Cloud Hypervisor runs on KVM (or MSHV) only",
            spec.accel.as_str()
        )));
    }
    if spec.vcpus == 0 {
        return Err(spec_error("at least one vCPU is needed".to_string()));
    }
    if spec.memory_mib == 0 {
        return Err(spec_error("memory must be at least 1 MiB".to_string()));
    }

    let mut disks = Vec::new();
    let mut root = None;
    for (index, disk) in spec.disks.iter().enumerate() {
        // Cloud Hypervisor could open qcow2, but snapshots and branching here assume the raw
        // images Firecracker also reads.
        if disk.format != DiskFormat::Raw {
            return Err(spec_error(format!(
                "disk {:?} is qcow2: use a raw image (convert with `qemu-img convert -O raw`)",
                disk.id
            )));
        }
        if disk.root {
            if root.is_some() {
                return Err(spec_error("more than one root disk".to_string()));
            }
            root = Some((index, disk.read_only));
        }
        disks.push(json!({
            "path": path_str(KIND, &disk.path, "disk")?,
            "readonly": disk.read_only,
        }));
    }

    let mut payload = serde_json::Map::new();
    payload.insert(
        "kernel".into(),
        path_str(KIND, &spec.kernel, "kernel")?.into(),
    );
    let cmdline = cmdline_with_root(&spec.cmdline, root)?;
    if !cmdline.is_empty() {
        payload.insert("cmdline".into(), cmdline.into());
    }
    if let Some(initrd) = &spec.initrd {
        payload.insert("initramfs".into(), path_str(KIND, initrd, "initrd")?.into());
    }

    let mut config = json!({
        "cpus": { "boot_vcpus": spec.vcpus, "max_vcpus": spec.vcpus },
        "memory": { "size": u64::from(spec.memory_mib) * 1024 * 1024 },
        "payload": Value::Object(payload),
    });
    let Value::Object(map) = &mut config else {
        return Err(spec_error(
            "internal: VmConfig is not an object".to_string(),
        ));
    };
    if !disks.is_empty() {
        map.insert("disks".into(), Value::Array(disks));
    }
    match &spec.agent {
        AgentChannel::Vsock { cid, socket, .. } => {
            if *cid < 3 {
                return Err(spec_error(format!(
                    "vsock guest CID {cid} is reserved (use 3 or more)"
                )));
            }
            map.insert(
                "vsock".into(),
                json!({ "cid": cid, "socket": path_str(KIND, socket, "vsock socket")? }),
            );
        }
        AgentChannel::VirtioSerial { .. } => {
            return Err(spec_error(
                "the agent channel is virtio-serial, which this backend does not offer: use a \
                 vsock channel (guest agent `--vsock PORT`)"
                    .to_string(),
            ));
        }
    }
    Ok(config)
}

/// Cloud Hypervisor has no notion of a root drive: name it on the kernel command line
/// (`root=/dev/vdX rw|ro`, as Firecracker adds for its root drive) unless the line already does.
fn cmdline_with_root(
    cmdline: &str,
    root: Option<(usize, bool)>,
) -> Result<String, HypervisorError> {
    let Some((index, read_only)) = root else {
        return Ok(cmdline.to_string());
    };
    if cmdline.split_whitespace().any(|w| w.starts_with("root=")) {
        return Ok(cmdline.to_string());
    }
    let letter = u8::try_from(index)
        .ok()
        .filter(|i| *i < 26)
        .map(|i| char::from(b'a' + i))
        .ok_or_else(|| {
            spec_error(format!(
                "root disk at position {index} has no /dev/vdX name"
            ))
        })?;
    let mode = if read_only { "ro" } else { "rw" };
    let root = format!("root=/dev/vd{letter} {mode}");
    Ok(if cmdline.is_empty() {
        root
    } else {
        format!("{cmdline} {root}")
    })
}

/// The calls that create and boot the VM in a fresh VMM: `vm.create` then `vm.boot`.
pub fn boot_requests(spec: &VmSpec) -> Result<Vec<ApiCall>, HypervisorError> {
    Ok(vec![
        api_call(Method::PUT, "vm.create", Some(vm_config(spec)?)),
        api_call(Method::PUT, "vm.boot", None),
    ])
}

/// The `vm.snapshot` call writing into `dir`, and the files it produces.
pub fn snapshot_request(dir: &Path) -> Result<(ApiCall, SnapshotFiles), HypervisorError> {
    let call = api_call(
        Method::PUT,
        "vm.snapshot",
        Some(json!({ "destination_url": format!("file://{}", path_str(KIND, dir, "snapshot")?) })),
    );
    let files = SnapshotFiles {
        dir: dir.to_path_buf(),
        state: dir.join(STATE_FILE),
        memory: Some(dir.join(MEMORY_FILE)),
    };
    Ok((call, files))
}

/// The calls that restore `snapshot` in a fresh VMM and run it: `vm.restore` (the VM comes back
/// paused) then `vm.resume`.
pub fn restore_requests(snapshot: &SnapshotFiles) -> Result<Vec<ApiCall>, HypervisorError> {
    let url = format!("file://{}", path_str(KIND, &snapshot.dir, "snapshot")?);
    Ok(vec![
        api_call(
            Method::PUT,
            "vm.restore",
            Some(json!({ "source_url": url })),
        ),
        api_call(Method::PUT, "vm.resume", None),
    ])
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
    fn argv_names_the_api_socket() {
        assert_eq!(
            argv(&spec()).unwrap(),
            ["--api-socket", "path=/run/vm/ch.sock"]
        );
    }

    #[test]
    fn vm_config_renders_cpus_memory_payload_disks_vsock() {
        assert_eq!(
            vm_config(&spec()).unwrap(),
            json!({
                "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
                "memory": {"size": 536_870_912u64},
                "payload": {
                    "kernel": "/img/vmlinux",
                    "cmdline": "console=ttyS0 panic=1 root=/dev/vda ro",
                    "initramfs": "/img/initrd"
                },
                "disks": [
                    {"path": "/img/rootfs.ext4", "readonly": true},
                    {"path": "/run/vm/work.img", "readonly": false}
                ],
                "vsock": {"cid": 3, "socket": "/run/vm/v.sock"}
            })
        );
        let mut s = spec();
        s.initrd = None;
        s.disks[0].read_only = false;
        assert_eq!(
            vm_config(&s).unwrap()["payload"],
            json!({"kernel": "/img/vmlinux", "cmdline": "console=ttyS0 panic=1 root=/dev/vda rw"})
        );
        s.cmdline = "root=/dev/vdb".into();
        assert_eq!(
            vm_config(&s).unwrap()["payload"]["cmdline"],
            "root=/dev/vdb"
        );
    }

    #[test]
    fn qcow2_disk_and_virtio_serial_are_spec_errors() {
        let mut s = spec();
        s.disks[0].format = DiskFormat::Qcow2;
        assert!(spec_message(vm_config(&s).unwrap_err()).contains("qcow2"));
        let mut s = spec();
        s.agent = AgentChannel::VirtioSerial {
            name: "slipway.agent".into(),
            socket: "/run/vm/agent.sock".into(),
        };
        let message = spec_message(vm_config(&s).unwrap_err());
        assert!(message.contains("virtio-serial"), "{message}");
        let mut s = spec();
        s.accel = Accel::Tcg;
        assert!(spec_message(vm_config(&s).unwrap_err()).contains("KVM"));
    }

    #[test]
    fn snapshot_and_restore_requests() {
        let (call, files) = snapshot_request(Path::new("/snap/a")).unwrap();
        assert_eq!(call.describe(), "PUT /api/v1/vm.snapshot");
        assert_eq!(
            call.body,
            Some(json!({"destination_url": "file:///snap/a"}))
        );
        assert_eq!(files.state, Path::new("/snap/a/state.json"));
        assert_eq!(
            files.memory.as_deref(),
            Some(Path::new("/snap/a/memory-ranges"))
        );
        let calls = restore_requests(&files).unwrap();
        assert_eq!(calls[0].describe(), "PUT /api/v1/vm.restore");
        assert_eq!(calls[0].body, Some(json!({"source_url": "file:///snap/a"})));
        assert_eq!(calls[1], api_call(Method::PUT, "vm.resume", None));
    }
}
