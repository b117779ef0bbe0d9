//! The process side the REST-driven backends (Firecracker, Cloud Hypervisor) share: one VMM
//! process per VM, started detached, waited for on its API socket, configured by a list of
//! [`ApiCall`]s, asked for its version, told to write a snapshot. Each backend describes what
//! differs in a [`RestVmm`] and keeps its own request rendering.

use std::path::{Path, PathBuf};
use std::time::Duration;

use slipway_nesting::spec::VmSpec;

use super::http::{
    self, ApiCall, Reply, absolute, answers, binary_version, host_cpu_model, normalize_version,
    remove_stale_socket, wait_ready,
};
use super::{HypervisorError, Identity, SnapshotFiles, VmProcess};
use crate::hypervisor::process::{kill_now, log_tail, spawn_detached};

/// How long a new process may take to answer on its API socket.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one ordinary API call.
pub(crate) const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on writing or loading a snapshot (all guest memory is copied: a full Firecracker
/// snapshot of 4 GiB takes about 8 s).
pub(crate) const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

/// What sets one REST-driven VMM apart, as far as the shared machinery goes.
#[derive(Debug)]
pub(crate) struct RestVmm {
    /// `firecracker` or `cloud-hypervisor`.
    pub(crate) kind: &'static str,
    /// Name of the API socket in the VM's run directory.
    pub(crate) api_socket: &'static str,
    /// Name of the process's log (stdout and stderr) in the VM's run directory.
    pub(crate) log_file: &'static str,
    /// The process's arguments for a spec.
    pub(crate) argv: fn(&VmSpec) -> Result<Vec<String>, HypervisorError>,
    /// What of the process's command line tells it apart ([`VmProcess::marker`]).
    pub(crate) marker: fn(&VmSpec) -> Result<String, HypervisorError>,
    /// A call that succeeds once the API server is up.
    pub(crate) probe: fn() -> ApiCall,
    /// A call whose JSON reply carries the version, and the version's key in it.
    pub(crate) version: (fn() -> ApiCall, &'static str),
}

impl RestVmm {
    /// The API socket of `spec`'s process.
    pub(crate) fn api_socket(&self, spec: &VmSpec) -> PathBuf {
        spec.run_dir.join(self.api_socket)
    }

    /// Send `call` to the API server on `socket`.
    async fn call(
        &self,
        socket: &Path,
        call: &ApiCall,
        timeout: Duration,
    ) -> Result<Reply, HypervisorError> {
        http::request(self.kind, socket, call, timeout).await
    }

    /// Send `call` to `vm`'s API within [`API_TIMEOUT`], for calls whose reply does not matter.
    pub(crate) async fn send(&self, vm: &VmProcess, call: &ApiCall) -> Result<(), HypervisorError> {
        self.call(&vm.control, call, API_TIMEOUT).await.map(drop)
    }

    /// Start `binary` for `spec`, wait until its API answers, then send `calls` in order, each
    /// within `timeout`. On the first failure the process is killed (a half-configured VMM is
    /// of no use).
    pub(crate) async fn launch(
        &self,
        binary: &Path,
        spec: &VmSpec,
        calls: &[ApiCall],
        timeout: Duration,
    ) -> Result<VmProcess, HypervisorError> {
        let vm = self.start(binary, spec).await?;
        for call in calls {
            if let Err(e) = self.call(&vm.control, call, timeout).await {
                let _ = kill_now(&vm).await;
                return Err(e);
            }
        }
        Ok(vm)
    }

    /// Start a process for `spec` and wait until its API answers.
    async fn start(&self, binary: &Path, spec: &VmSpec) -> Result<VmProcess, HypervisorError> {
        let args = (self.argv)(spec)?;
        let marker = (self.marker)(spec)?;
        tokio::fs::create_dir_all(&spec.run_dir)
            .await
            .map_err(|source| HypervisorError::Io {
                context: format!("cannot create run dir {}", spec.run_dir.display()),
                source,
            })?;
        let socket = self.api_socket(spec);
        // Both VMMs bind their sockets themselves and fail on a leftover file.
        remove_stale_socket(&socket).await?;
        remove_stale_socket(spec.agent.socket()).await?;
        let log = spec.run_dir.join(self.log_file);
        let binary = binary.to_string_lossy().into_owned();
        let mut child = spawn_detached(&binary, &args, &log)?;
        let Some(pid) = child.id() else {
            return Err(HypervisorError::Exited {
                binary,
                status: "exited immediately".to_string(),
                log: log_tail(&log, 20),
            });
        };
        let vm = VmProcess {
            pid,
            control: socket,
            marker,
        };
        let probe = (self.probe)();
        if let Err(e) = wait_ready(
            self.kind,
            &binary,
            &mut child,
            &vm,
            &probe,
            &log,
            START_TIMEOUT,
        )
        .await
        {
            let _ = kill_now(&vm).await;
            return Err(e);
        }
        Ok(vm)
    }

    /// Version, machine and CPU model of the VMs `binary` starts for `spec`.
    pub(crate) async fn identity(
        &self,
        binary: &Path,
        spec: &VmSpec,
    ) -> Result<Identity, HypervisorError> {
        Ok(Identity {
            hypervisor: self.kind.to_string(),
            version: self.version(binary, spec).await?,
            machine: self.kind.to_string(),
            cpu_model: format!("host:{}", host_cpu_model()),
        })
    }

    /// The version of the process running `spec`, else of `binary`.
    async fn version(&self, binary: &Path, spec: &VmSpec) -> Result<String, HypervisorError> {
        let socket = self.api_socket(spec);
        if answers(&socket).await {
            let (call, key) = self.version;
            let reply = self.call(&socket, &call(), API_TIMEOUT).await?;
            if let Some(v) = reply.json()[key].as_str() {
                return Ok(normalize_version(v));
            }
        }
        // No process for this spec yet: the binary reports the same build
        // (`Firecracker v1.10.1`, `cloud-hypervisor v48.0.0`).
        let out = binary_version(&binary.to_string_lossy(), API_TIMEOUT).await?;
        out.split_whitespace()
            .find(|w| w.starts_with('v') || w.starts_with(|c: char| c.is_ascii_digit()))
            .map(normalize_version)
            .ok_or_else(|| HypervisorError::Api {
                hypervisor: self.kind,
                request: "--version".to_string(),
                message: format!("no version in {out:?}"),
            })
    }

    /// Pause `vm` with `pause`, then send the snapshot call `render` makes for `dir` (made
    /// absolute and created first: Cloud Hypervisor writes into it but does not create it).
    /// The VM stays paused.
    pub(crate) async fn snapshot(
        &self,
        vm: &VmProcess,
        dir: &Path,
        pause: &ApiCall,
        render: fn(&Path) -> Result<(ApiCall, SnapshotFiles), HypervisorError>,
    ) -> Result<SnapshotFiles, HypervisorError> {
        let dir = absolute(dir)?;
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|source| HypervisorError::Io {
                context: format!("cannot create snapshot dir {}", dir.display()),
                source,
            })?;
        let (call, files) = render(&dir)?;
        self.send(vm, pause).await?;
        self.call(&vm.control, &call, SNAPSHOT_TIMEOUT).await?;
        Ok(files)
    }
}

/// What the REST backends' unit tests share.
#[cfg(test)]
pub(crate) mod fixtures {
    use crate::hypervisor::HypervisorError;
    use slipway_nesting::spec::{Accel, AgentChannel, Disk, DiskFormat, Level, VmSpec};

    /// A spec both REST backends run: a read-only root and a work disk (raw), an initrd, a vsock
    /// agent, KVM.
    pub(crate) fn spec() -> VmSpec {
        VmSpec {
            id: "job-1".into(),
            level: Level::Microvm,
            vcpus: 2,
            memory_mib: 512,
            kernel: "/img/vmlinux".into(),
            initrd: Some("/img/initrd".into()),
            cmdline: "console=ttyS0 panic=1".into(),
            disks: vec![
                Disk {
                    id: "rootfs".into(),
                    path: "/img/rootfs.ext4".into(),
                    format: DiskFormat::Raw,
                    root: true,
                    read_only: true,
                },
                Disk {
                    id: "work".into(),
                    path: "/run/vm/work.img".into(),
                    format: DiskFormat::Raw,
                    root: false,
                    read_only: false,
                },
            ],
            agent: AgentChannel::Vsock {
                cid: 3,
                port: 1024,
                socket: "/run/vm/v.sock".into(),
            },
            accel: Accel::Kvm,
            run_dir: "/run/vm".into(),
            memory: Default::default(),
            network: Default::default(),
        }
    }

    /// The message of a [`HypervisorError::Spec`] from `kind`; panics on any other error.
    pub(crate) fn spec_message(kind: &str, err: HypervisorError) -> String {
        match err {
            HypervisorError::Spec {
                hypervisor,
                message,
            } => {
                assert_eq!(hypervisor, kind);
                message
            }
            other => panic!("expected a spec error, got {other:?}"),
        }
    }
}
