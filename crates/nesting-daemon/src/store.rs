//! The daemon's VM records: `<state>/vms/<id>/vm.json` beside the VM's sockets, disk layer and
//! logs. Records, not memory, are the truth: a restarted daemon finds its VMs there, and a VM
//! whose process is gone (or whose record is missing) is cleaned up.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slipway_nesting::config::HypervisorKind;
use slipway_nesting::proto;
use slipway_nesting::spec::VmSpec;

use crate::error::DaemonError;
use crate::hypervisor::VmProcess;

/// One VM as the daemon keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRecord {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The slot it holds.
    pub slot: Option<i32>,
    /// Image it was started from.
    pub image: String,
    /// Snapshot it was restored from (empty: cold boot).
    pub snapshot: String,
    /// Which backend runs it.
    pub hypervisor: HypervisorKind,
    /// What it was started with.
    pub spec: VmSpec,
    /// Its process; `None` while it is being started.
    pub process: Option<VmProcess>,
    /// The image's base disk at the bottom of its disk chain.
    pub base_disk: PathBuf,
    /// Unix seconds.
    pub created: i64,
    /// Started ahead of a job (a warm slot's VM) and not yet handed to one.
    #[serde(default)]
    pub warm: bool,
}

impl VmRecord {
    /// The address a client reaches the guest agent at (on the instance).
    pub fn addr(&self) -> String {
        match &self.spec.agent {
            slipway_nesting::spec::AgentChannel::VirtioSerial { socket, .. } => {
                format!("unix://{}", socket.display())
            }
            slipway_nesting::spec::AgentChannel::Vsock { port, socket, .. } => {
                format!("vsock://{port}@{}", socket.display())
            }
        }
    }

    /// The wire form.
    pub fn to_proto(&self) -> proto::VirtualMachine {
        proto::VirtualMachine {
            id: self.id.clone(),
            name: self.name.clone(),
            addr: self.addr(),
            slot: self.slot,
            image: self.image.clone(),
            snapshot: self.snapshot.clone(),
            level: self.spec.level.as_str().into(),
            memory: self.spec.memory.as_str().into(),
            warm: self.warm,
        }
    }
}

/// The directory of the VMs under a state directory.
pub fn vms_dir(state: &Path) -> PathBuf {
    state.join("vms")
}

/// A VM's directory.
pub fn vm_dir(state: &Path, id: &str) -> PathBuf {
    vms_dir(state).join(id)
}

/// Write a record (write, sync, rename: a crash leaves the old or the new one).
pub fn save(state: &Path, rec: &VmRecord) -> Result<(), DaemonError> {
    let dir = vm_dir(state, &rec.id);
    std::fs::create_dir_all(&dir)
        .map_err(DaemonError::io(format!("creating {}", dir.display())))?;
    let tmp = dir.join(".vm.json.tmp");
    let bytes = serde_json::to_vec_pretty(rec).map_err(|e| DaemonError::Io {
        context: "encoding a VM record".into(),
        source: std::io::Error::other(e),
    })?;
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join("vm.json"))
    };
    write().map_err(DaemonError::io(format!(
        "writing {}",
        dir.join("vm.json").display()
    )))
}

/// Every record; directories without a readable record are returned as orphans.
pub fn load_all(state: &Path) -> (Vec<VmRecord>, Vec<PathBuf>) {
    let mut recs = Vec::new();
    let mut orphans = Vec::new();
    let Ok(entries) = std::fs::read_dir(vms_dir(state)) else {
        return (recs, orphans);
    };
    for e in entries.flatten() {
        let path = e.path();
        if !path.is_dir() {
            continue;
        }
        match std::fs::read(path.join("vm.json")).map(|b| serde_json::from_slice::<VmRecord>(&b)) {
            Ok(Ok(r)) => recs.push(r),
            _ => orphans.push(path),
        }
    }
    recs.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
    (recs, orphans)
}

/// Hypervisor processes (QEMU, Firecracker, Cloud Hypervisor) whose command line names a VM
/// directory under `state` (started by this daemon), with the VM id.
pub fn processes_under(state: &Path) -> Vec<(u32, String)> {
    let needle = format!("{}/", vms_dir(state).display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        // Only hypervisors: a `tail -f` of a VM's console names the directory too.
        let program = text.split(' ').next().unwrap_or_default();
        let program = program.rsplit('/').next().unwrap_or_default();
        let hypervisor = program.starts_with("qemu-system")
            || program == "firecracker"
            || program == "cloud-hypervisor";
        if !hypervisor {
            continue;
        }
        if let Some(at) = text.find(&needle) {
            let id: String = text[at + needle.len()..]
                .chars()
                .take_while(|c| *c != '/' && *c != ' ')
                .collect();
            if !id.is_empty() {
                out.push((pid, id));
            }
        }
    }
    out
}
