//! QEMU: `-M microvm` for the `microvm` level, q35 with a root disk for `vm`, KVM or TCG;
//! driven by its argv and QMP. Snapshots are migration streams to a file (`exec:cat`), restored
//! by a new process with the same devices, `-incoming defer` and `-S`, then `cont`.
//!
//! Guest RAM can live in a file ([`GuestMemory`]): a VM whose RAM is a shared file is saved with
//! the `x-ignore-shared` migration capability, so the stream holds only device state (tens of
//! KiB) and the RAM is the file itself, moved into the snapshot. A restore maps that file
//! privately (copy-on-write) with the same capability set, so it reads no RAM up front and
//! branches of one snapshot share every page none of them wrote. QEMU ≥ 9 also has `mapped-ram`,
//! but that still reads RAM into each process; mapping the file is what lets branches share.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;
use slipway_nesting::spec::{
    Accel, AgentChannel, Capabilities, DiskFormat, GuestMemory, GuestNetwork, Level, VmSpec,
};

use super::http::host_cpu_model;
use super::qmp::Qmp;
use super::{HypervisorError, Identity, SnapshotFiles, VmProcess};
use crate::Hypervisor;
use crate::hypervisor::process;

/// The first QEMU release with the `memory-backend` machine property (what puts the default
/// RAM block in a file under its usual name); `x-ignore-shared` is older (4.0).
pub const FILE_MEMORY_SINCE: (u32, u32) = (5, 0);

/// The QEMU backend.
#[derive(Debug, Clone)]
pub struct Qemu {
    /// `qemu-system-x86_64` or a path to it.
    pub binary: PathBuf,
    /// `--version`, asked once: every restore checks it, and a spawn costs milliseconds.
    version: Arc<tokio::sync::OnceCell<String>>,
}

impl Default for Qemu {
    fn default() -> Self {
        Qemu::new(PathBuf::from("qemu-system-x86_64"))
    }
}

/// The memory file of a VM whose RAM is a shared file (`memory` in its run directory).
pub fn memory_file(run_dir: &Path) -> PathBuf {
    run_dir.join("memory")
}

/// The id of the machine's RAM backend: QEMU's default one, so the RAM block keeps the name
/// that snapshots of anonymous-memory VMs carry and either kind restores into the other.
pub fn ram_id(level: Level) -> &'static str {
    match level {
        Level::Microvm => "microvm.ram",
        Level::Vm => "pc.ram",
    }
}

/// `major.minor` of a QEMU version string (`7.2.22 (Debian …)` → `(7, 2)`).
pub fn parse_version(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
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
        // microvm has 8 virtio-mmio slots; the agent's serial bus and the NIC need one each.
        return Err(HypervisorError::Spec {
            hypervisor: "qemu",
            message: format!("microvm takes at most 6 disks, got {}", spec.disks.len()),
        });
    }
    let mut machine = match spec.level {
        // ACPI stays on: it is how the guest finds the virtio-mmio devices when its kernel
        // lacks VIRTIO_MMIO_CMDLINE_DEVICES (Debian's cloud kernel does).
        Level::Microvm => "microvm,x-option-roms=off,rtc=on".to_string(),
        Level::Vm => "q35".to_string(),
    };
    let memory_backend = match &spec.memory {
        GuestMemory::Anonymous => None,
        GuestMemory::SharedFile { path } => Some((path, "on")),
        GuestMemory::PrivateFile { path } => Some((path, "off")),
    };
    let memory_object = match memory_backend {
        None => None,
        Some((path, share)) => {
            let path = path.display().to_string();
            if path.contains(',') {
                return Err(HypervisorError::Spec {
                    hypervisor: "qemu",
                    message: format!("memory file path {path} contains a comma"),
                });
            }
            let id = ram_id(spec.level);
            machine.push_str(&format!(",memory-backend={id}"));
            // `-m` stays: it must agree with the backend's size, and keeps the argv readable.
            Some(format!(
                "memory-backend-file,id={id},size={}M,mem-path={path},share={share}",
                spec.memory_mib
            ))
        }
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
    ];
    if let Some(object) = memory_object {
        a.extend(["-object".into(), object]);
    }
    a.extend([
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-serial".into(),
        format!("file:{}", console_log(spec).display()),
    ]);
    // A restored guest has its kernel in its memory already, and with `-no-reboot` never
    // loads it again: QEMU would keep the kernel and initrd files in its own memory for
    // nothing (about 20 MiB per VM, most of an idle warm VM's cost). microvm has no option ROM
    // for them, so its RAM blocks are the same without; q35 keeps `-kernel` (its linuxboot
    // option ROM is migrated) and drops the initrd.
    let boot_files = !incoming;
    if boot_files || spec.level == Level::Vm {
        a.extend(["-kernel".into(), spec.kernel.display().to_string()]);
        a.extend(["-append".into(), spec.cmdline.clone()]);
    }
    if let Some(initrd) = spec.initrd.as_ref().filter(|_| boot_files) {
        a.extend(["-initrd".into(), initrd.display().to_string()]);
    }
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
    if spec.network == GuestNetwork::User {
        let nic = match spec.level {
            Level::Microvm => "virtio-net-device",
            Level::Vm => "virtio-net-pci",
        };
        a.extend([
            "-netdev".into(),
            "user,id=net0".into(),
            "-device".into(),
            format!("{nic},netdev=net0"),
        ]);
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
    /// The backend running `binary`.
    pub fn new(binary: PathBuf) -> Qemu {
        Qemu {
            binary,
            version: Arc::default(),
        }
    }

    /// QEMU's version (`7.2.22 (Debian …)`), asked once per backend.
    pub async fn version(&self) -> Result<String, HypervisorError> {
        self.version
            .get_or_try_init(|| async {
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
                Ok(text
                    .lines()
                    .next()
                    .and_then(|l| l.split("version ").nth(1))
                    .unwrap_or("unknown")
                    .trim()
                    .to_string())
            })
            .await
            .cloned()
    }

    /// Whether this QEMU can keep guest RAM in a file and snapshot it with `x-ignore-shared`;
    /// `Err` says why not.
    pub async fn file_memory(&self) -> Result<String, String> {
        let version = self
            .version()
            .await
            .map_err(|e| format!("cannot tell QEMU's version: {e}"))?;
        match parse_version(&version) {
            Some(v) if v >= FILE_MEMORY_SINCE => Ok(format!(
                "QEMU {version}: guest RAM in a file, snapshots keep it with x-ignore-shared, \
                 restores map it copy-on-write"
            )),
            Some(_) => Err(format!(
                "QEMU {version} predates {}.{} (no memory-backend machine property): \
                 snapshots stream guest RAM and restores read it all",
                FILE_MEMORY_SINCE.0, FILE_MEMORY_SINCE.1
            )),
            None => Err(format!(
                "unparsable QEMU version {version:?}: snapshots stream guest RAM"
            )),
        }
    }

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
            // The socket appears some 20 ms after exec; a restore waits on exactly this.
            tokio::time::sleep(Duration::from_millis(2)).await;
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
            // Snapshots with a memory file restore by mapping it; known once the version was
            // asked (the daemon asks at `Init`).
            lazy_restore: self
                .version
                .get()
                .and_then(|v| parse_version(v))
                .is_some_and(|v| v >= FILE_MEMORY_SINCE),
        }
    }

    async fn identity(&self, spec: &VmSpec) -> Result<Identity, HypervisorError> {
        let version = self.version().await?;
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
        // Asked of the process, not a spec: a VM started before a daemon restart is saved too.
        let shared = shared_memory_file(&mut qmp).await?;
        // Set either way: a VM restored from a mapped snapshot has it on from its restore.
        set_ignore_shared(&mut qmp, shared.is_some()).await?;
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
        let memory = match shared {
            None => None,
            Some(file) => {
                // The vCPUs are stopped and the stream is written: the file is the RAM as saved.
                // QEMU keeps its mapping of the moved file until it quits, and writes nothing more.
                let target = dir.join("memory");
                move_file(&file, &target)?;
                Some(target)
            }
        };
        Ok(SnapshotFiles {
            dir: dir.to_path_buf(),
            state,
            memory,
        })
    }

    async fn restore(
        &self,
        spec: &VmSpec,
        snapshot: &SnapshotFiles,
    ) -> Result<VmProcess, HypervisorError> {
        let mapped = snapshot.memory.is_some();
        if let Some(file) = &snapshot.memory
            && spec.memory != (GuestMemory::PrivateFile { path: file.clone() })
        {
            // Any other backing would either not see the saved RAM or write into the snapshot.
            return Err(HypervisorError::Spec {
                hypervisor: "qemu",
                message: format!(
                    "a snapshot with memory file {} restores only with that file mapped \
                     privately (the spec has {})",
                    file.display(),
                    spec.memory.as_str()
                ),
            });
        }
        let t0 = Instant::now();
        let vm = self.start(spec, true).await?;
        let started = t0.elapsed();
        let result = async {
            let mut qmp = self.qmp(&vm).await?;
            // Must match the saving side: QEMU checks this capability against the stream's.
            set_ignore_shared(&mut qmp, mapped).await?;
            let quoted = snapshot.state.display().to_string().replace('\'', r"'\''");
            qmp.execute(
                "migrate-incoming",
                Some(json!({ "uri": format!("exec:cat '{quoted}'") })),
            )
            .await?;
            qmp.wait_status("paused", Duration::from_secs(600)).await?;
            let loaded = t0.elapsed();
            qmp.execute("cont", None).await?;
            Ok::<_, HypervisorError>(loaded)
        }
        .await;
        match result {
            Ok(loaded) => {
                tracing::debug!(
                    vm = %vm.marker,
                    memory = spec.memory.as_str(),
                    qemu_start_ms = started.as_secs_f64() * 1000.0,
                    state_loaded_ms = loaded.as_secs_f64() * 1000.0,
                    running_ms = t0.elapsed().as_secs_f64() * 1000.0,
                    "restored"
                );
                Ok(vm)
            }
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

/// The memory file of the VM behind `qmp` when its RAM is a shared file backend.
async fn shared_memory_file(qmp: &mut Qmp) -> Result<Option<PathBuf>, HypervisorError> {
    let objects = qmp
        .execute("qom-list", Some(json!({ "path": "/objects" })))
        .await?;
    let Some(objects) = objects.as_array() else {
        return Ok(None);
    };
    for o in objects {
        let (Some(name), Some(kind)) = (
            o.get("name").and_then(|v| v.as_str()),
            o.get("type").and_then(|v| v.as_str()),
        ) else {
            continue;
        };
        if kind != "child<memory-backend-file>" {
            continue;
        }
        let path = format!("/objects/{name}");
        let share = qmp
            .execute(
                "qom-get",
                Some(json!({ "path": path, "property": "share" })),
            )
            .await?;
        if share.as_bool() != Some(true) {
            continue;
        }
        let file = qmp
            .execute(
                "qom-get",
                Some(json!({ "path": path, "property": "mem-path" })),
            )
            .await?;
        if let Some(file) = file.as_str() {
            return Ok(Some(PathBuf::from(file)));
        }
    }
    Ok(None)
}

/// Turn the `x-ignore-shared` migration capability on or off: on, shared RAM stays out of the
/// stream (the file holds it).
async fn set_ignore_shared(qmp: &mut Qmp, on: bool) -> Result<(), HypervisorError> {
    qmp.execute(
        "migrate-set-capabilities",
        Some(json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": on }] })),
    )
    .await
    .map(|_| ())
}

/// Move `from` to `to`: a rename on one file system, a copy (then removal) across two.
fn move_file(from: &Path, to: &Path) -> Result<(), HypervisorError> {
    let io = |context: String| move |source| HypervisorError::Io { context, source };
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EXDEV as i32) => {
            std::fs::copy(from, to).map_err(io(format!(
                "copying guest memory {} to {}",
                from.display(),
                to.display()
            )))?;
            std::fs::remove_file(from)
                .map_err(io(format!("removing guest memory {}", from.display())))
        }
        Err(e) => Err(io(format!(
            "moving guest memory {} to {}",
            from.display(),
            to.display()
        ))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipway_nesting::spec::Disk;

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
            memory: GuestMemory::Anonymous,
            network: GuestNetwork::None,
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
    fn a_networked_guest_gets_one_user_mode_nic_of_its_level() {
        assert!(
            !argv(&spec(Level::Microvm), false)
                .unwrap()
                .join(" ")
                .contains("-netdev")
        );
        for (level, nic) in [
            (Level::Microvm, "virtio-net-device"),
            (Level::Vm, "virtio-net-pci"),
        ] {
            let mut s = spec(level);
            s.network = GuestNetwork::User;
            let a = argv(&s, false).unwrap().join(" ");
            assert!(
                a.contains(&format!("-netdev user,id=net0 -device {nic},netdev=net0")),
                "{a}"
            );
        }
    }

    #[test]
    fn a_restore_waits_stopped_for_the_stream() {
        let a = argv(&spec(Level::Microvm), true).unwrap().join(" ");
        assert!(a.ends_with("-S -incoming defer"), "{a}");
    }

    #[test]
    fn a_restored_guest_is_not_given_its_boot_files_again() {
        let booted = argv(&spec(Level::Microvm), false).unwrap().join(" ");
        assert!(
            booted.contains(
                "-kernel /img/vmlinuz -append console=ttyS0 quiet -initrd /img/initrd.img"
            ),
            "{booted}"
        );
        let restored = argv(&spec(Level::Microvm), true).unwrap().join(" ");
        assert!(
            !restored.contains("-kernel") && !restored.contains("-initrd"),
            "{restored}"
        );
        // q35's linuxboot option ROM is part of the migrated state: the kernel stays.
        let restored = argv(&spec(Level::Vm), true).unwrap().join(" ");
        assert!(restored.contains("-kernel /img/vmlinuz"), "{restored}");
        assert!(!restored.contains("-initrd"), "{restored}");
    }

    #[test]
    fn anonymous_memory_is_plain_m() {
        let a = argv(&spec(Level::Microvm), false).unwrap().join(" ");
        assert!(a.contains("-smp 1 -m 256 -nodefaults"), "{a}");
        assert!(!a.contains("memory-backend"), "{a}");
    }

    #[test]
    fn shared_file_memory_is_the_default_ram_block_in_a_shared_file() {
        let mut s = spec(Level::Microvm);
        s.memory = GuestMemory::SharedFile {
            path: "/vms/7/memory".into(),
        };
        let a = argv(&s, false).unwrap().join(" ");
        assert!(
            a.contains("-M microvm,x-option-roms=off,rtc=on,memory-backend=microvm.ram "),
            "{a}"
        );
        assert!(
            a.contains("-m 256 -object memory-backend-file,id=microvm.ram,size=256M,mem-path=/vms/7/memory,share=on "),
            "{a}"
        );
        let mut s = spec(Level::Vm);
        s.memory = GuestMemory::SharedFile {
            path: "/vms/7/memory".into(),
        };
        let a = argv(&s, false).unwrap().join(" ");
        assert!(a.contains("-M q35,memory-backend=pc.ram "), "{a}");
        assert!(a.contains("memory-backend-file,id=pc.ram,"), "{a}");
    }

    #[test]
    fn private_file_memory_maps_the_snapshot_copy_on_write() {
        let mut s = spec(Level::Microvm);
        s.memory = GuestMemory::PrivateFile {
            path: "/snaps/deps/memory".into(),
        };
        let a = argv(&s, true).unwrap().join(" ");
        assert!(
            a.contains("memory-backend-file,id=microvm.ram,size=256M,mem-path=/snaps/deps/memory,share=off "),
            "{a}"
        );
        assert!(a.ends_with("-S -incoming defer"), "{a}");
        s.memory = GuestMemory::PrivateFile {
            path: "/snaps/a,b/memory".into(),
        };
        let e = argv(&s, true).unwrap_err().to_string();
        assert!(e.contains("contains a comma"), "{e}");
    }

    #[test]
    fn versions_parse_to_major_minor() {
        assert_eq!(
            parse_version("7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"),
            Some((7, 2))
        );
        assert_eq!(parse_version("9.0.0"), Some((9, 0)));
        assert_eq!(parse_version("unknown"), None);
        assert!(parse_version("7.2.22").unwrap() >= FILE_MEMORY_SINCE);
        assert!(parse_version("4.2.1").unwrap() < FILE_MEMORY_SINCE);
    }

    #[tokio::test]
    async fn the_installed_qemu_keeps_guest_ram_in_a_file() {
        let qemu = Qemu::default();
        assert!(!qemu.capabilities().lazy_restore, "not known before asking");
        let why = qemu.file_memory().await.unwrap();
        assert!(why.contains("x-ignore-shared"), "{why}");
        assert!(qemu.capabilities().lazy_restore);
        // Asked once: a clone shares the answer.
        assert_eq!(
            qemu.clone().version().await.unwrap(),
            qemu.version().await.unwrap()
        );
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
