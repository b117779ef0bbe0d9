//! QEMU: `-M microvm` for the `microvm` level, q35 with a root disk for `vm`, KVM or TCG;
//! driven by its argv and QMP. Snapshots are migration streams to a file (`exec:cat`), restored
//! by a new process with the same devices, `-incoming defer` and `-S`, then `cont`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use super::http::host_cpu_model;
use super::qmp::Qmp;
use super::{HypervisorError, Identity, SnapshotFiles, VmProcess};
use crate::Hypervisor;
use crate::process;
use crate::spec::{Accel, AgentChannel, Capabilities, DiskFormat, Level, VmSpec};

/// The QEMU backend.
#[derive(Debug, Clone)]
pub struct Qemu {
    /// `qemu-system-x86_64` or a path to it.
    pub binary: PathBuf,
}

impl Default for Qemu {
    fn default() -> Self {
        Qemu {
            binary: PathBuf::from("qemu-system-x86_64"),
        }
    }
}

/// The QMP socket of a VM.
pub fn qmp_socket(spec: &VmSpec) -> PathBuf {
    spec.run_dir.join("qmp.sock")
}

/// The console log of a VM.
pub fn console_log(spec: &VmSpec) -> PathBuf {
    spec.run_dir.join("console.log")
}

/// The name QEMU runs under, also the marker that finds the process again.
pub fn marker(spec: &VmSpec) -> String {
    format!("slipway-vm-{}", spec.id)
}

/// The machine type for a level.
pub fn machine(level: Level) -> &'static str {
    match level {
        Level::Microvm => "microvm",
        Level::Vm => "q35",
    }
}

/// The CPU model the guest sees: `max` under TCG (every emulated feature), `host` with KVM.
pub fn cpu_model(accel: Accel) -> &'static str {
    match accel {
        Accel::Kvm => "host",
        Accel::Tcg => "max",
    }
}

/// QEMU's argv for `spec` (without the binary). `incoming`: wait for a migration stream
/// (a restore) with the vCPUs stopped.
pub fn argv(spec: &VmSpec, incoming: bool) -> Result<Vec<String>, HypervisorError> {
    if spec.vcpus == 0 || spec.memory_mib < 64 {
        return Err(HypervisorError::Spec {
            hypervisor: "qemu",
            message: format!(
                "vcpus must be at least 1 and memory at least 64 MiB (got {} vCPUs, {} MiB)",
                spec.vcpus, spec.memory_mib
            ),
        });
    }
    let (blk, serial_bus) = match spec.level {
        Level::Microvm => ("virtio-blk-device", "virtio-serial-device"),
        Level::Vm => ("virtio-blk-pci", "virtio-serial-pci"),
    };
    if spec.level == Level::Microvm && spec.disks.len() > 6 {
        // microvm has 8 virtio-mmio slots; the agent's serial bus needs one.
        return Err(HypervisorError::Spec {
            hypervisor: "qemu",
            message: format!("microvm takes at most 6 disks, got {}", spec.disks.len()),
        });
    }
    let machine = match spec.level {
        // ACPI stays on: it is how the guest finds the virtio-mmio devices when its kernel
        // lacks VIRTIO_MMIO_CMDLINE_DEVICES (Debian's cloud kernel does).
        Level::Microvm => "microvm,x-option-roms=off,rtc=on".to_string(),
        Level::Vm => "q35".to_string(),
    };
    let mut a: Vec<String> = vec![
        "-name".into(),
        marker(spec),
        "-M".into(),
        machine,
        "-accel".into(),
        spec.accel.as_str().into(),
        "-cpu".into(),
        cpu_model(spec.accel).into(),
        "-smp".into(),
        spec.vcpus.to_string(),
        "-m".into(),
        spec.memory_mib.to_string(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-serial".into(),
        format!("file:{}", console_log(spec).display()),
        "-kernel".into(),
        spec.kernel.display().to_string(),
    ];
    if let Some(initrd) = &spec.initrd {
        a.extend(["-initrd".into(), initrd.display().to_string()]);
    }
    a.extend(["-append".into(), spec.cmdline.clone()]);
    for d in &spec.disks {
        let format = match d.format {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        };
        let path = d.path.display().to_string();
        if path.contains(',') {
            return Err(HypervisorError::Spec {
                hypervisor: "qemu",
                message: format!("disk path {path} contains a comma"),
            });
        }
        a.push("-drive".into());
        a.push(format!(
            "id={},file={path},format={format},if=none,readonly={}",
            d.id,
            if d.read_only { "on" } else { "off" }
        ));
        a.push("-device".into());
        a.push(format!("{blk},drive={}", d.id));
    }
    match &spec.agent {
        AgentChannel::VirtioSerial { name, socket } => {
            a.extend([
                "-device".into(),
                serial_bus.into(),
                "-chardev".into(),
                format!(
                    "socket,id=agent,path={},server=on,wait=off",
                    socket.display()
                ),
                "-device".into(),
                format!("virtserialport,chardev=agent,name={name}"),
            ]);
        }
        AgentChannel::Vsock { .. } => {
            // vhost-vsock needs /dev/vhost-vsock on the host; virtio-serial works everywhere.
            return Err(HypervisorError::Spec {
                hypervisor: "qemu",
                message: "the QEMU backend talks to the agent over virtio-serial, not vsock".into(),
            });
        }
    }
    a.extend([
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", qmp_socket(spec).display()),
    ]);
    if incoming {
        a.extend(["-S".into(), "-incoming".into(), "defer".into()]);
    }
    Ok(a)
}

/// How long QMP calls may take: emulated machines answer slower.
fn qmp_timeout(accel: Accel) -> Duration {
    match accel {
        Accel::Kvm => Duration::from_secs(10),
        Accel::Tcg => Duration::from_secs(30),
    }
}

impl Qemu {
    async fn start(&self, spec: &VmSpec, incoming: bool) -> Result<VmProcess, HypervisorError> {
        let args = argv(spec, incoming)?;
        std::fs::create_dir_all(&spec.run_dir).map_err(|source| HypervisorError::Io {
            context: format!("cannot create {}", spec.run_dir.display()),
            source,
        })?;
        let qmp = qmp_socket(spec);
        for stale in [&qmp, &spec.agent.socket().to_path_buf()] {
            let _ = std::fs::remove_file(stale);
        }
        let log = spec.run_dir.join("qemu.log");
        let binary = self.binary.display().to_string();
        let mut child = process::spawn_detached(&binary, &args, &log)?;
        let pid = child.id().ok_or_else(|| HypervisorError::Exited {
            binary: binary.clone(),
            status: "exited at once".into(),
            log: process::log_tail(&log, 5),
        })?;
        let vm = VmProcess {
            pid,
            control: qmp.clone(),
            marker: marker(spec),
        };
        // The socket appears once QEMU has parsed its argv and set up the machine.
        let limit = qmp_timeout(spec.accel);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(HypervisorError::Exited {
                    binary,
                    status: status.to_string(),
                    log: process::log_tail(&log, 5),
                });
            }
            if qmp.exists() && Qmp::connect(&qmp, limit).await.is_ok() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = process::kill_now(&vm).await;
                return Err(HypervisorError::Timeout {
                    what: format!("QEMU's QMP socket {}", qmp.display()),
                    after: limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Dropping the child leaves QEMU running; tokio reaps it when it exits.
        drop(child);
        Ok(vm)
    }

    async fn qmp(&self, vm: &VmProcess) -> Result<Qmp, HypervisorError> {
        Qmp::connect(&vm.control, Duration::from_secs(30)).await
    }
}

#[async_trait]
impl Hypervisor for Qemu {
    fn kind(&self) -> &'static str {
        "qemu"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            snapshot: true,
            vsock: false,
            pause: true,
            without_kvm: true,
            lazy_restore: false,
        }
    }

    async fn identity(&self, spec: &VmSpec) -> Result<Identity, HypervisorError> {
        let out = tokio::process::Command::new(&self.binary)
            .arg("--version")
            .output()
            .await
            .map_err(|source| HypervisorError::Spawn {
                binary: self.binary.display().to_string(),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        // "QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)"
        let version = text
            .lines()
            .next()
            .and_then(|l| l.split("version ").nth(1))
            .unwrap_or("unknown")
            .trim()
            .to_string();
        let cpu = match spec.accel {
            Accel::Tcg => "max".to_string(),
            Accel::Kvm => format!("host:{}", host_cpu_model()),
        };
        Ok(Identity {
            hypervisor: "qemu".into(),
            version,
            machine: machine(spec.level).into(),
            cpu_model: cpu,
        })
    }

    async fn boot(&self, spec: &VmSpec) -> Result<VmProcess, HypervisorError> {
        self.start(spec, false).await
    }

    async fn pause(&self, vm: &VmProcess) -> Result<(), HypervisorError> {
        self.qmp(vm).await?.execute("stop", None).await.map(|_| ())
    }

    async fn resume(&self, vm: &VmProcess) -> Result<(), HypervisorError> {
        self.qmp(vm).await?.execute("cont", None).await.map(|_| ())
    }

    async fn snapshot(&self, vm: &VmProcess, dir: &Path) -> Result<SnapshotFiles, HypervisorError> {
        let state = dir.join("state");
        let quoted = state.display().to_string().replace('\'', r"'\''");
        let mut qmp = self.qmp(vm).await?;
        qmp.execute("stop", None).await?;
        // The default bandwidth cap (128 MiB/s) only slows a stopped VM's save.
        qmp.execute(
            "migrate-set-parameters",
            Some(json!({ "max-bandwidth": 64u64 << 30 })),
        )
        .await?;
        qmp.execute(
            "migrate",
            Some(json!({ "uri": format!("exec:cat > '{quoted}'") })),
        )
        .await?;
        qmp.wait_migration(Duration::from_secs(600)).await?;
        Ok(SnapshotFiles {
            dir: dir.to_path_buf(),
            state,
            memory: None,
        })
    }

    async fn restore(
        &self,
        spec: &VmSpec,
        snapshot: &SnapshotFiles,
    ) -> Result<VmProcess, HypervisorError> {
        let vm = self.start(spec, true).await?;
        let result = async {
            let mut qmp = self.qmp(&vm).await?;
            let quoted = snapshot.state.display().to_string().replace('\'', r"'\''");
            qmp.execute(
                "migrate-incoming",
                Some(json!({ "uri": format!("exec:cat '{quoted}'") })),
            )
            .await?;
            qmp.wait_status("paused", Duration::from_secs(600)).await?;
            qmp.execute("cont", None).await.map(|_| ())
        }
        .await;
        match result {
            Ok(()) => Ok(vm),
            Err(e) => {
                let _ = process::kill_now(&vm).await;
                Err(e)
            }
        }
    }

    async fn stop(&self, vm: &VmProcess, grace: Duration) -> Result<(), HypervisorError> {
        let control = vm.control.clone();
        process::stop_with(vm, grace, async move {
            let mut qmp = Qmp::connect(&control, Duration::from_secs(2)).await?;
            // quit closes the socket before replying at times: an I/O error here is fine.
            let _ = qmp.execute("quit", None).await;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Disk;

    fn spec(level: Level) -> VmSpec {
        VmSpec {
            id: "7".into(),
            level,
            vcpus: 1,
            memory_mib: 256,
            kernel: "/img/vmlinuz".into(),
            initrd: Some("/img/initrd.img".into()),
            cmdline: "console=ttyS0 quiet".into(),
            disks: vec![Disk {
                id: "work".into(),
                path: "/vms/7/disk.qcow2".into(),
                format: DiskFormat::Qcow2,
                root: false,
                read_only: false,
            }],
            agent: AgentChannel::VirtioSerial {
                name: "org.slipway.agent".into(),
                socket: "/vms/7/agent.sock".into(),
            },
            accel: Accel::Tcg,
            run_dir: "/vms/7".into(),
        }
    }

    #[test]
    fn microvm_argv_uses_mmio_devices_and_the_fast_machine() {
        let a = argv(&spec(Level::Microvm), false).unwrap().join(" ");
        assert!(
            a.contains(
                "-name slipway-vm-7 -M microvm,x-option-roms=off,rtc=on -accel tcg -cpu max"
            ),
            "{a}"
        );
        assert!(a.contains("-drive id=work,file=/vms/7/disk.qcow2,format=qcow2,if=none,readonly=off -device virtio-blk-device,drive=work"), "{a}");
        assert!(a.contains("-device virtio-serial-device -chardev socket,id=agent,path=/vms/7/agent.sock,server=on,wait=off -device virtserialport,chardev=agent,name=org.slipway.agent"), "{a}");
        assert!(
            a.contains("-qmp unix:/vms/7/qmp.sock,server=on,wait=off"),
            "{a}"
        );
        assert!(!a.contains("-incoming"), "{a}");
    }

    #[test]
    fn vm_argv_uses_q35_and_pci_devices() {
        let a = argv(&spec(Level::Vm), false).unwrap().join(" ");
        assert!(a.contains("-M q35"), "{a}");
        assert!(a.contains("virtio-blk-pci,drive=work"), "{a}");
        assert!(a.contains("virtio-serial-pci"), "{a}");
    }

    #[test]
    fn a_restore_waits_stopped_for_the_stream() {
        let a = argv(&spec(Level::Microvm), true).unwrap().join(" ");
        assert!(a.ends_with("-S -incoming defer"), "{a}");
    }

    #[test]
    fn kvm_uses_the_host_cpu() {
        let mut s = spec(Level::Microvm);
        s.accel = Accel::Kvm;
        let a = argv(&s, false).unwrap().join(" ");
        assert!(a.contains("-accel kvm -cpu host"), "{a}");
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let mut s = spec(Level::Microvm);
        s.memory_mib = 16;
        let e = argv(&s, false).unwrap_err().to_string();
        assert!(e.contains("at least 64 MiB"), "{e}");
        let mut s = spec(Level::Microvm);
        s.agent = AgentChannel::Vsock {
            cid: 3,
            port: 1024,
            socket: "/x".into(),
        };
        let e = argv(&s, false).unwrap_err().to_string();
        assert!(e.contains("virtio-serial"), "{e}");
    }
}
