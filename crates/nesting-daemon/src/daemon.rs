//! The nesting daemon: the `nesting.v1` service over a unix socket on an instance. One VM per
//! slot (a new VM stomps the one left in its slot), snapshots kept under the state directory,
//! VMs that outlive a daemon restart found again from their records.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use slipway_nesting::agent;
use slipway_nesting::check_name;
use slipway_nesting::config::{Config, HypervisorKind, MemoryChoice};
use slipway_nesting::spec::{
    Accel, AgentChannel, Disk, DiskFormat, GuestMemory, GuestNetwork, Level, VmSpec,
};
use tokio::sync::Mutex;

use crate::accel;
use crate::disk;
use crate::error::DaemonError;
use crate::hypervisor::cloud_hypervisor::CloudHypervisor;
use crate::hypervisor::firecracker::{self, Firecracker};
use crate::hypervisor::process;
use crate::hypervisor::qemu::Qemu;
use crate::hypervisor::{Hypervisor, HypervisorError, VmProcess, is_running};
use crate::image::{self, ImageManifest};
use crate::snapshot::{self, SnapshotMeta};
use crate::store::{self, VmRecord};
use warm::WarmPool;

mod snapshots;
pub mod warm;

/// How long a stopped VM gets to quit before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The guest CID Firecracker / Cloud Hypervisor VMs get (one VM per process, so one CID).
const GUEST_CID: u32 = 3;

/// Where the daemon keeps its state and finds images.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// VM records, disk layers, sockets and snapshots.
    pub state_dir: PathBuf,
    /// Images when the `Init` config names no `images_dir`.
    pub images_dir: PathBuf,
}

#[derive(Debug)]
struct Active {
    config: Config,
    hv: Arc<dyn Hypervisor>,
    accel: Accel,
    images_dir: PathBuf,
    boot_timeout: Duration,
    /// QEMU guests keep their RAM in a file (decided at `Init`, see [`MemoryChoice`]).
    file_memory: bool,
}

/// The daemon.
#[derive(Debug)]
pub struct Daemon {
    opts: DaemonOptions,
    active: Mutex<Option<Arc<Active>>>,
    /// Serialises changes to the records and snapshots (never held across a boot).
    records: Mutex<()>,
    /// Work in progress (a std mutex, never held across an await, so guards release it on drop).
    busy: std::sync::Mutex<Busy>,
    /// Warm slots.
    warm: WarmPool,
}

/// What is being worked on right now, so that reconciling, deleting, stomping and retention
/// keep their hands off it.
#[derive(Debug, Default)]
struct Busy {
    /// Slots with a VM being started.
    slots: HashSet<i32>,
    /// VMs being started or snapshotted.
    vms: HashSet<String>,
    /// Snapshots being restored from, by how many restores.
    claims: HashMap<String, usize>,
}

/// Releases one piece of [`Busy`] when dropped (also when the work panics).
pub(crate) struct Held<'a> {
    daemon: &'a Daemon,
    release: Box<dyn Fn(&mut Busy) + Send + Sync + 'a>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        (self.release)(&mut self.daemon.busy());
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn new_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// The backend for `kind`, with `binary` or the default name.
pub fn backend(kind: HypervisorKind, binary: Option<PathBuf>) -> Arc<dyn Hypervisor> {
    match kind {
        HypervisorKind::Qemu => Arc::new(Qemu::new(
            binary.unwrap_or_else(|| PathBuf::from("qemu-system-x86_64")),
        )),
        HypervisorKind::Firecracker => Arc::new(Firecracker {
            binary: binary.unwrap_or_else(|| PathBuf::from("firecracker")),
        }),
        HypervisorKind::CloudHypervisor => Arc::new(CloudHypervisor {
            binary: binary.unwrap_or_else(|| PathBuf::from("cloud-hypervisor")),
        }),
    }
}

impl Daemon {
    /// A daemon over `opts`; finds the VMs a previous run left (see [`Daemon::reconcile`]).
    pub async fn new(mut opts: DaemonOptions) -> Result<Arc<Daemon>, DaemonError> {
        opts.state_dir = check_state_dir(&opts.state_dir)?;
        opts.images_dir = absolute(&opts.images_dir)?;
        for d in [
            store::vms_dir(&opts.state_dir),
            snapshot::dir(&opts.state_dir),
        ] {
            use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&d)
                .map_err(DaemonError::io(format!("creating {}", d.display())))?;
            // Snapshots hold what jobs held in memory, their variables included: owner only.
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
                .map_err(DaemonError::io(format!("restricting {}", d.display())))?;
        }
        // A snapshot being written or replaced when the daemon died is half a snapshot: gone.
        if let Ok(rd) = std::fs::read_dir(snapshot::dir(&opts.state_dir)) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with(".new-") || name.starts_with(".old-") {
                    tracing::info!(dir = %e.path().display(), "removing an unfinished snapshot");
                    let _ = remove_tree(&e.path());
                }
            }
        }
        let daemon = Arc::new(Daemon {
            opts,
            active: Mutex::new(None),
            records: Mutex::new(()),
            busy: std::sync::Mutex::new(Busy::default()),
            warm: WarmPool::default(),
        });
        daemon.reconcile().await;
        Ok(daemon)
    }

    fn busy(&self) -> std::sync::MutexGuard<'_, Busy> {
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The warm slots.
    pub(crate) fn warm(&self) -> &WarmPool {
        &self.warm
    }

    /// The state directory.
    pub(crate) fn state_dir(&self) -> PathBuf {
        self.opts.state_dir.clone()
    }

    /// MiB of guest memory a VM of `image` gets.
    pub(crate) async fn image_memory_mib(&self, image: &str) -> Result<u32, DaemonError> {
        let active = self.active().await?;
        let (_, manifest) = self.image(&active, image)?;
        Ok(active.config.memory_mib.unwrap_or(manifest.memory_mib))
    }

    /// Give `rec` (a VM started without a slot) slot `slot` as its warm VM, unless the slot
    /// holds a VM or one is being started in it (then the VM goes); whether it did.
    pub(crate) async fn adopt_warm(
        &self,
        mut rec: VmRecord,
        slot: i32,
    ) -> Result<bool, DaemonError> {
        {
            let _g = self.records.lock().await;
            let taken = self.busy().slots.contains(&slot)
                || store::load_all(&self.opts.state_dir)
                    .0
                    .iter()
                    .any(|r| r.slot == Some(slot));
            if !taken {
                rec.slot = Some(slot);
                rec.warm = true;
                store::save(&self.opts.state_dir, &rec)?;
                return Ok(true);
            }
        }
        self.remove(&rec).await?;
        Ok(false)
    }

    /// Mark VM `id` as being worked on; `None` if it already is.
    pub(crate) fn hold_vm(&self, id: &str) -> Option<Held<'_>> {
        if !self.busy().vms.insert(id.to_string()) {
            return None;
        }
        let id = id.to_string();
        Some(Held {
            daemon: self,
            release: Box::new(move |b| {
                b.vms.remove(&id);
            }),
        })
    }

    /// Claim snapshot `name` for a restore: neither deleted nor replaced while held.
    fn claim(&self, name: &str) -> Held<'_> {
        *self.busy().claims.entry(name.to_string()).or_default() += 1;
        let name = name.to_string();
        Held {
            daemon: self,
            release: Box::new(move |b| {
                if let Some(n) = b.claims.get_mut(&name) {
                    *n -= 1;
                    if *n == 0 {
                        b.claims.remove(&name);
                    }
                }
            }),
        }
    }

    async fn active(&self) -> Result<Arc<Active>, DaemonError> {
        self.active
            .lock()
            .await
            .clone()
            .ok_or(DaemonError::NotInitialized)
    }

    /// Remove what no running VM backs: records whose process is gone, directories without a
    /// record, hypervisor processes under the state directory that no record claims. VMs being
    /// started right now are left alone.
    pub async fn reconcile(&self) -> Vec<VmRecord> {
        let _g = self.records.lock().await;
        let (recs, orphans) = store::load_all(&self.opts.state_dir);
        let mut alive = Vec::new();
        let mut known = HashSet::new();
        let busy = self.busy().vms.clone();
        for rec in recs {
            known.insert(rec.id.clone());
            if busy.contains(&rec.id) {
                // Being started or snapshotted: its process may be missing or stopped on purpose.
                if rec.process.as_ref().is_some_and(is_running) {
                    alive.push(rec);
                }
                continue;
            }
            match &rec.process {
                Some(p) if is_running(p) => alive.push(rec),
                Some(_) => {
                    tracing::info!(vm = %rec.id, "VM process is gone; removing its files");
                    let _ = std::fs::remove_dir_all(store::vm_dir(&self.opts.state_dir, &rec.id));
                }
                // Left half-started by a crash (VMs being started are skipped above).
                None => {
                    self.kill_strays(&rec.id).await;
                    let _ = std::fs::remove_dir_all(store::vm_dir(&self.opts.state_dir, &rec.id));
                }
            }
        }
        for dir in orphans {
            let id = dir
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            if !busy.contains(&id) {
                self.kill_strays(&id).await;
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        for (pid, id) in store::processes_under(&self.opts.state_dir) {
            if !known.contains(&id) && !store::vm_dir(&self.opts.state_dir, &id).exists() {
                tracing::warn!(pid, vm = %id, "killing a hypervisor process no record claims");
                let _ = process::kill_now(&VmProcess {
                    pid,
                    control: PathBuf::new(),
                    marker: format!("{}/{id}/", store::vms_dir(&self.opts.state_dir).display()),
                })
                .await;
            }
        }
        alive
    }

    async fn kill_strays(&self, id: &str) {
        for (pid, pid_id) in store::processes_under(&self.opts.state_dir) {
            if pid_id == id {
                let _ = process::kill_now(&VmProcess {
                    pid,
                    control: PathBuf::new(),
                    marker: format!("{}/{id}/", store::vms_dir(&self.opts.state_dir).display()),
                })
                .await;
            }
        }
    }

    /// `Init`; with warm slots configured, their fills start.
    pub async fn init(self: &Arc<Self>, bytes: &[u8]) -> Result<(), DaemonError> {
        let mut active = self.active.lock().await;
        if active.is_some() {
            return Err(DaemonError::AlreadyInitialized);
        }
        let config = Config::parse(bytes).map_err(DaemonError::Config)?;
        let mut hv = backend(config.hypervisor, config.binary.clone());
        let binary = config
            .binary
            .clone()
            .map(|b| b.display().to_string())
            .unwrap_or_else(|| "qemu-system-x86_64".into());
        let images_dir = match &config.images_dir {
            Some(d) => absolute(d).map_err(|e| DaemonError::Config(format!("images_dir: {e}")))?,
            None => self.opts.images_dir.clone(),
        };
        let probe = if config.hypervisor == HypervisorKind::Qemu {
            let kernel = probe_kernel(&images_dir);
            accel::resolve(config.accel, &binary, kernel.as_deref()).await
        } else {
            // Firecracker and Cloud Hypervisor run on KVM only.
            accel::Probe {
                accel: Accel::Kvm,
                reason: format!("{} needs KVM", config.hypervisor.as_str()),
            }
        };
        let (file_memory, memory_reason) = if config.hypervisor == HypervisorKind::Qemu {
            // The backend that runs the VMs, so its cached version serves every restore.
            let qemu = Qemu::new(PathBuf::from(&binary));
            let support = qemu.file_memory().await;
            hv = Arc::new(qemu);
            match (config.memory, support) {
                (MemoryChoice::Anonymous, _) => (
                    false,
                    "memory: anonymous (configured): snapshots stream guest RAM".to_string(),
                ),
                (_, Ok(why)) => (true, why),
                (MemoryChoice::File, Err(why)) => {
                    return Err(DaemonError::Config(format!(
                        "memory: file is not possible here: {why}"
                    )));
                }
                (MemoryChoice::Auto, Err(why)) => (false, why),
            }
        } else {
            (
                false,
                format!("{} maps its memory file", config.hypervisor.as_str()),
            )
        };
        let warm = match &config.warm {
            Some(w) if w.only_with_kvm && probe.accel != Accel::Kvm => {
                tracing::info!(
                    "warm slots off: guests run under emulation here (set warm = true to keep them anyway)"
                );
                None
            }
            other => other.clone(),
        };
        self.warm.configure(warm, available_mib());
        tracing::info!(
            hypervisor = config.hypervisor.as_str(),
            accel = probe.accel.as_str(),
            reason = %probe.reason,
            memory = if file_memory { "file" } else { "anonymous" },
            memory_reason = %memory_reason,
            "nesting initialised"
        );
        let boot_timeout =
            Duration::from_secs(config.boot_timeout_secs.unwrap_or(match probe.accel {
                Accel::Kvm => 30,
                Accel::Tcg => 120,
            }));
        *active = Some(Arc::new(Active {
            config,
            hv,
            accel: probe.accel,
            images_dir,
            boot_timeout,
            file_memory,
        }));
        drop(active);
        self.fill_all();
        Ok(())
    }

    fn image(&self, active: &Active, name: &str) -> Result<(PathBuf, ImageManifest), DaemonError> {
        check_name("image name", name)?;
        let dir = active.images_dir.join(name);
        let manifest = image::load(&dir).map_err(|e| DaemonError::NoImage {
            name: name.to_string(),
            dir: active.images_dir.display().to_string(),
            why: e.to_string(),
        })?;
        Ok((dir, manifest))
    }

    fn spec(
        &self,
        active: &Active,
        id: &str,
        image_dir: &Path,
        m: &ImageManifest,
        size: Option<(u32, u32)>,
        snapshot_memory: Option<PathBuf>,
    ) -> VmSpec {
        let run_dir = store::vm_dir(&self.opts.state_dir, id);
        let (vcpus, memory_mib) = size.unwrap_or((
            active.config.vcpus.unwrap_or(m.vcpus),
            active.config.memory_mib.unwrap_or(m.memory_mib),
        ));
        let qemu = active.hv.kind() == "qemu";
        VmSpec {
            id: id.to_string(),
            level: m.level,
            vcpus,
            memory_mib,
            kernel: m.kernel_path(image_dir),
            initrd: Some(m.initrd_path(image_dir)),
            cmdline: host_cmdline(&m.cmdline, active.accel),
            disks: vec![Disk {
                id: "disk".into(),
                path: run_dir.join(if qemu { "disk.qcow2" } else { "disk.raw" }),
                format: if qemu {
                    DiskFormat::Qcow2
                } else {
                    DiskFormat::Raw
                },
                root: m.level == Level::Vm,
                read_only: false,
            }],
            agent: if qemu {
                AgentChannel::VirtioSerial {
                    name: m.agent_port.clone(),
                    socket: run_dir.join("agent.sock"),
                }
            } else {
                AgentChannel::Vsock {
                    cid: GUEST_CID,
                    port: m.vsock_port,
                    socket: run_dir.join("vsock.sock"),
                }
            },
            accel: active.accel,
            memory: match snapshot_memory {
                // Whatever this daemon's choice: that file is where the saved RAM is. (Firecracker
                // and Cloud Hypervisor find their memory files in the snapshot themselves.)
                Some(path) if qemu => GuestMemory::PrivateFile { path },
                None if qemu && active.file_memory => GuestMemory::SharedFile {
                    path: crate::hypervisor::qemu::memory_file(&run_dir),
                },
                _ => GuestMemory::Anonymous,
            },
            // Firecracker and Cloud Hypervisor have no user-mode network (they need a tap
            // device the host sets up): their guests run without a NIC.
            network: if m.network && qemu {
                GuestNetwork::User
            } else {
                GuestNetwork::None
            },
            run_dir,
        }
    }

    /// Mark `slot` as being started (released when the guard drops) and stomp the VM in it;
    /// the stomped VM's id.
    async fn take_slot(
        &self,
        slot: Option<i32>,
    ) -> Result<(Option<Held<'_>>, Option<String>), DaemonError> {
        let Some(slot) = slot else {
            return Ok((None, None));
        };
        if !self.busy().slots.insert(slot) {
            return Err(DaemonError::Conflict(format!(
                "a VM is already being started in slot {slot}"
            )));
        }
        let held = Held {
            daemon: self,
            release: Box::new(move |b| {
                b.slots.remove(&slot);
            }),
        };
        let (recs, _) = store::load_all(&self.opts.state_dir);
        let mut stomped = None;
        for rec in recs.into_iter().filter(|r| r.slot == Some(slot)) {
            let Some(_vm) = self.hold_vm(&rec.id) else {
                return Err(DaemonError::Conflict(format!(
                    "VM {} in slot {slot} is being snapshotted",
                    rec.id
                )));
            };
            tracing::info!(vm = %rec.id, slot, "stomping the VM left in the slot");
            self.remove(&rec).await?;
            stomped = Some(rec.id);
        }
        Ok((Some(held), stomped))
    }

    async fn remove(&self, rec: &VmRecord) -> Result<(), DaemonError> {
        if let Some(p) = &rec.process {
            let hv = backend(rec.hypervisor, None);
            hv.stop(p, STOP_GRACE).await?;
        } else {
            self.kill_strays(&rec.id).await;
        }
        let dir = store::vm_dir(&self.opts.state_dir, &rec.id);
        let _g = self.records.lock().await;
        std::fs::remove_dir_all(&dir)
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(DaemonError::io(format!("removing {}", dir.display())))
    }

    /// Start `spec` (from `snapshot` if given), wait for its agent, record it.
    async fn start(
        &self,
        active: &Active,
        mut rec: VmRecord,
        base: &Path,
        snapshot: Option<&SnapshotMeta>,
    ) -> Result<VmRecord, DaemonError> {
        let spec = rec.spec.clone();
        let layer = &spec.disks[0].path;
        // Held until the agent answers: reconcile leaves a VM being started alone.
        let _starting = self
            .hold_vm(&rec.id)
            .ok_or_else(|| DaemonError::Conflict(format!("VM {} already exists", rec.id)))?;
        let started = async {
            let t0 = std::time::Instant::now();
            std::fs::create_dir_all(&spec.run_dir).map_err(DaemonError::io(format!(
                "creating {}",
                spec.run_dir.display()
            )))?;
            store::save(&self.opts.state_dir, &rec)?;
            match (spec.disks[0].format, snapshot) {
                (DiskFormat::Qcow2, Some(meta)) => {
                    let template = snapshot::dir(&self.opts.state_dir)
                        .join(&meta.name)
                        .join(disk::LAYER_TEMPLATE);
                    disk::layer_from_template(&template, base, layer).await?
                }
                (DiskFormat::Qcow2, None) => disk::create_layer(base, layer).await?,
                (DiskFormat::Raw, _) => disk::raw_copy(base, layer).await?,
            }
            let layered = t0.elapsed();
            let process = match snapshot {
                None => active.hv.boot(&spec).await?,
                Some(meta) => {
                    let files =
                        crate::hypervisor::SnapshotFiles {
                            dir: snapshot::dir(&self.opts.state_dir).join(&meta.name),
                            state: snapshot::dir(&self.opts.state_dir)
                                .join(&meta.name)
                                .join(&meta.files.state),
                            memory: meta.files.memory.as_ref().map(|m| {
                                snapshot::dir(&self.opts.state_dir).join(&meta.name).join(m)
                            }),
                        };
                    active.hv.restore(&spec, &files).await?
                }
            };
            rec.process = Some(process.clone());
            store::save(&self.opts.state_dir, &rec)?;
            let running = t0.elapsed();
            wait_agent(&spec.agent, active.boot_timeout)
                .await
                .map_err(|e| {
                    let console = process::log_tail(&spec.run_dir.join("console.log"), 8);
                    DaemonError::Agent(format!("{e}; the guest console ends with: {console}"))
                })?;
            // Every VM is made unique before a job sees it: a restore clones a running kernel
            // (RNG state, machine-id, host keys), and VMs cold-booted from one image share the
            // image's machine-id.
            match renew_agent(&spec.agent, &rec.name, active.boot_timeout).await {
                Ok(renewal) if renewal.notes.is_empty() => {}
                Ok(renewal) => {
                    tracing::warn!(vm = %rec.id, reseeded = renewal.reseeded, notes = ?renewal.notes,
                        "the VM was not renewed in full")
                }
                // An image made with an agent older than `renew` still runs jobs; rebuilding
                // it (`slipway image build`) makes its VMs unique.
                Err(e) if e.contains("unknown op") => tracing::warn!(vm = %rec.id,
                    "the image's guest agent cannot renew the VM's identity (rebuild the image): {e}"),
                Err(e) => {
                    return Err(DaemonError::Agent(format!("making the VM unique: {e}")));
                }
            }
            // Where a start's time goes (disk layer, hypervisor, guest agent), for tuning.
            tracing::debug!(
                vm = %rec.id,
                restore = snapshot.is_some(),
                memory = spec.memory.as_str(),
                layer_ms = layered.as_secs_f64() * 1000.0,
                hypervisor_ms = (running - layered).as_secs_f64() * 1000.0,
                agent_ms = (t0.elapsed() - running).as_secs_f64() * 1000.0,
                "VM started"
            );
            Ok::<_, DaemonError>(())
        }
        .await;
        match started {
            Ok(()) => Ok(rec),
            Err(e) => {
                let _ = self.remove(&rec).await;
                Err(e)
            }
        }
    }

    /// `Create`: in a warm slot, the slot's ready VM of `image_name` when it has one (the
    /// third value says so), else a VM restored from the image's base snapshot; elsewhere, or
    /// when that fails, a cold boot.
    pub async fn create(
        self: &Arc<Self>,
        image_name: &str,
        slot: Option<i32>,
    ) -> Result<(VmRecord, Option<String>, bool), DaemonError> {
        if let Some(s) = slot.filter(|_| self.warm.covers(slot)) {
            let limit = self.active().await?.boot_timeout;
            if let Some(rec) = self.take_warm(image_name, s, limit).await? {
                return Ok((rec, None, true));
            }
            match self.start_from_base(image_name, slot).await {
                Ok(Some((rec, stomped))) => return Ok((rec, stomped, false)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(
                        slot = s,
                        image = image_name,
                        "restoring the base snapshot failed, booting instead: {e}"
                    )
                }
            }
        }
        let (rec, stomped) = self.create_cold(image_name, slot).await?;
        Ok((rec, stomped, false))
    }

    /// A cold boot of `image_name` (in `slot`, stomping what it holds).
    pub async fn create_cold(
        &self,
        image_name: &str,
        slot: Option<i32>,
    ) -> Result<(VmRecord, Option<String>), DaemonError> {
        let active = self.active().await?;
        let (image_dir, manifest) = self.image(&active, image_name)?;
        let (_slot, stomped) = self.take_slot(slot).await?;
        let id = new_id();
        let spec = self.spec(&active, &id, &image_dir, &manifest, None, None);
        let base = manifest.disk_path(&image_dir);
        let rec = VmRecord {
            id: id.clone(),
            name: format!("slipway-{id}"),
            slot,
            image: image_name.to_string(),
            snapshot: String::new(),
            hypervisor: active.config.hypervisor,
            spec,
            process: None,
            base_disk: base.clone(),
            created: now(),
            warm: false,
        };
        let rec = self.start(&active, rec, &base, None).await?;
        Ok((rec, stomped))
    }

    /// `Delete`; the record of the VM that went.
    pub async fn delete(&self, id: &str) -> Result<VmRecord, DaemonError> {
        let (recs, _) = store::load_all(&self.opts.state_dir);
        let rec = recs
            .into_iter()
            .find(|r| r.id == id)
            .ok_or_else(|| DaemonError::NoVm(id.to_string()))?;
        let Some(_vm) = self.hold_vm(id) else {
            return Err(DaemonError::Conflict(format!(
                "VM {id} is being started or snapshotted"
            )));
        };
        self.remove(&rec).await?;
        Ok(rec)
    }

    /// `List`: the VMs whose processes run (the others are cleaned up on the way).
    pub async fn list(&self) -> Vec<VmRecord> {
        self.reconcile().await
    }

    /// `Shutdown`: every VM deleted, the configuration forgotten.
    pub async fn shutdown(&self) -> Result<(), DaemonError> {
        self.warm.stop();
        let (recs, _) = store::load_all(&self.opts.state_dir);
        for rec in &recs {
            // Shutdown wins over work in progress: the VM goes whatever was being done to it.
            self.remove(rec).await?;
        }
        *self.active.lock().await = None;
        Ok(())
    }
}

/// The image's command line for this host: under TCG the kernel's TSC calibration against the
/// PIT fails in about one boot of six, so `tsc_early_khz` is set from this host's TSC (an image
/// built elsewhere carries the builder's).
fn host_cmdline(image: &str, accel: Accel) -> String {
    let kept = image
        .split_whitespace()
        .filter(|w| !w.starts_with("tsc_early_khz="));
    let mut words: Vec<String> = kept.map(str::to_string).collect();
    if accel == Accel::Tcg
        && let Some(khz) = image::host_tsc_khz()
    {
        words.push(format!("tsc_early_khz={khz}"));
    }
    words.join(" ")
}

/// A kernel to probe KVM with: an image's, else the newest Debian cloud kernel in /boot (the
/// one `slipway image build` would take).
fn probe_kernel(images_dir: &Path) -> Option<PathBuf> {
    let from_image = std::fs::read_dir(images_dir).ok().and_then(|rd| {
        rd.flatten().find_map(|e| {
            let m = image::load(&e.path()).ok()?;
            Some(m.kernel_path(&e.path()))
        })
    });
    from_image.or_else(|| image::newest_cloud_kernel(Path::new("/boot")))
}

/// `dir` made absolute (qcow2 backing paths and sockets must not depend on the working
/// directory).
fn absolute(dir: &Path) -> Result<PathBuf, DaemonError> {
    std::path::absolute(dir).map_err(DaemonError::io(format!("resolving {}", dir.display())))
}

/// The longest path of a unix socket the daemon makes under the state directory:
/// `vms/<8 hex>/vsock.sock_<port>`.
const LONGEST_SOCKET_SUFFIX: usize = "/vms/01234567/vsock.sock_4294967295".len();

/// A usable state directory: absolute, no comma (QEMU's option separator), short enough for
/// the VMs' unix sockets (108 bytes on Linux).
fn check_state_dir(dir: &Path) -> Result<PathBuf, DaemonError> {
    let dir = absolute(dir)?;
    let text = dir.display().to_string();
    if text.contains(',') {
        return Err(DaemonError::Config(format!(
            "state directory {text}: a comma cannot be passed to QEMU's options; choose another path"
        )));
    }
    if text.len() + LONGEST_SOCKET_SUFFIX > 107 {
        return Err(DaemonError::Config(format!(
            "state directory {text} is too long: VM sockets under it would pass the 108-byte limit of \
             unix socket paths; use one of at most {} bytes",
            107 - LONGEST_SOCKET_SUFFIX
        )));
    }
    Ok(dir)
}

/// The label that names the snapshot a snapshot's disk layer sits on.
pub const PARENT_LABEL: &str = "slipway.parent";

fn remove_tree(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    // Read-only files in a writable directory are removable; the directory itself may not be.
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    std::fs::remove_dir_all(dir)
}

/// Have the guest agent behind `channel` renew its guest's identity ([`agent::AgentClient::renew`]),
/// named `hostname`.
pub async fn renew_agent(
    channel: &AgentChannel,
    hostname: &str,
    limit: Duration,
) -> Result<agent::Renewal, String> {
    let client = match channel {
        AgentChannel::VirtioSerial { socket, .. } => agent::connect_unix(socket)
            .await
            .map_err(|e| e.to_string())?,
        AgentChannel::Vsock { port, socket, .. } => {
            let stream = firecracker::connect_vsock(socket, *port, limit)
                .await
                .map_err(|e| format!("connecting to the guest agent on vsock port {port}: {e}"))?;
            agent::AgentClient::new(stream)
        }
    };
    client
        .renew(hostname, limit)
        .await
        .map_err(|e| e.to_string())
}

/// MiB of memory the instance has available (`MemAvailable`), 0 when unknown.
fn available_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

/// Wait until the guest agent behind `channel` answers.
pub async fn wait_agent(channel: &AgentChannel, limit: Duration) -> Result<Duration, String> {
    let started = tokio::time::Instant::now();
    match channel {
        AgentChannel::VirtioSerial { socket, .. } => agent::wait_ready(socket, limit)
            .await
            .map(|(_, _, took)| took)
            .map_err(|e| format!("the guest agent did not answer within {limit:?}: {e}")),
        AgentChannel::Vsock { port, socket, .. } => loop {
            let left = limit.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(format!(
                    "the guest agent did not answer on vsock port {port} within {limit:?}"
                ));
            }
            if let Ok(stream) =
                firecracker::connect_vsock(socket, *port, Duration::from_secs(1)).await
            {
                let client = agent::AgentClient::new(stream);
                if client.hello(Duration::from_secs(1).min(left)).await.is_ok() {
                    return Ok(started.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_directories_that_would_break_vms_are_refused() {
        let long = PathBuf::from(format!("/tmp/{}", "d".repeat(80)));
        let e = check_state_dir(&long).unwrap_err().to_string();
        assert!(e.contains("108-byte limit"), "{e}");
        let e = check_state_dir(Path::new("/tmp/a,b"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("comma"), "{e}");
        let rel = check_state_dir(Path::new("state")).unwrap();
        assert!(
            rel.is_absolute() && rel.ends_with("state"),
            "{}",
            rel.display()
        );
    }

    #[tokio::test]
    async fn a_restarted_daemon_removes_half_written_snapshots_and_dead_vms() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("s");
        let snaps = snapshot::dir(&state);
        std::fs::create_dir_all(snaps.join(".new-deps-1234")).unwrap();
        std::fs::create_dir_all(snaps.join("kept")).unwrap();
        // A VM whose hypervisor is long gone (pid 0 is never a VM's).
        let rec = VmRecord {
            id: "dead0001".into(),
            name: "slipway-dead0001".into(),
            slot: Some(3),
            image: "img".into(),
            snapshot: String::new(),
            hypervisor: HypervisorKind::Qemu,
            spec: VmSpec {
                id: "dead0001".into(),
                level: Level::Microvm,
                vcpus: 1,
                memory_mib: 128,
                kernel: "/k".into(),
                initrd: None,
                cmdline: String::new(),
                disks: Vec::new(),
                agent: AgentChannel::VirtioSerial {
                    name: "a".into(),
                    socket: "/a.sock".into(),
                },
                accel: Accel::Tcg,
                run_dir: store::vm_dir(&state, "dead0001"),
                memory: GuestMemory::Anonymous,
                network: GuestNetwork::None,
            },
            process: Some(VmProcess {
                pid: 0,
                control: "/q".into(),
                marker: "slipway-vm-dead0001".into(),
            }),
            base_disk: "/b".into(),
            created: 0,
            warm: false,
        };
        store::save(&state, &rec).unwrap();
        let daemon = Daemon::new(DaemonOptions {
            state_dir: state.clone(),
            images_dir: dir.path().join("images"),
        })
        .await
        .unwrap();
        assert!(!snaps.join(".new-deps-1234").exists());
        assert!(snaps.join("kept").exists());
        assert!(daemon.list().await.is_empty());
        assert!(!store::vm_dir(&state, "dead0001").exists());
        // Not initialised: creating says so in GitLab's words, listing does not need it.
        let e = daemon.create("img", Some(0)).await.unwrap_err();
        assert_eq!(e.to_string(), "not initialized");
        daemon.init(br#"{"accel":"tcg"}"#).await.unwrap();
        let e = daemon.init(b"{}").await.unwrap_err();
        assert_eq!(e.to_string(), "already initialized");
    }

    #[tokio::test]
    async fn warm_slots_left_to_kvm_stay_off_under_emulation() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon::new(DaemonOptions {
            state_dir: dir.path().join("state"),
            images_dir: dir.path().join("images"),
        })
        .await
        .unwrap();
        let warm = r#""warm":{"slots":2,"images":["img"]"#;
        daemon
            .init(format!(r#"{{"accel":"tcg",{warm},"only_with_kvm":true}}}}"#).as_bytes())
            .await
            .unwrap();
        assert!(daemon.warm.slots().is_empty());
        daemon.shutdown().await.unwrap();
        // Asked for whatever the accelerator: kept.
        daemon
            .init(format!(r#"{{"accel":"tcg",{warm}}}}}"#).as_bytes())
            .await
            .unwrap();
        assert_eq!(daemon.warm.slots(), vec![0, 1]);
        daemon.shutdown().await.unwrap();
    }
}
