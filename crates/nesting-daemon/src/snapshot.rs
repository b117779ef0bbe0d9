//! Snapshots on disk: `<state>/snapshots/<name>/` holds `meta.json`, the hypervisor's state
//! (and memory) files and `disk.qcow2`, the VM's disk layer frozen at the snapshot. Restores
//! layer a new qcow2 over that disk and map the memory file in place (copy-on-write), so
//! branches share both. A QEMU snapshot of a VM with anonymous memory (or of a branch, whose
//! RAM is a private mapping) has no memory file: its `state` stream carries the RAM. Every
//! snapshot records what a restore must match; retention removes the oldest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slipway_nesting::config::Retention;
use slipway_nesting::proto;
use slipway_nesting::spec::{Accel, Level};

use crate::error::DaemonError;
use crate::hypervisor::{Identity, SnapshotFiles};

/// What a snapshot records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// Its name.
    pub name: String,
    /// The VM it was taken from.
    pub source_vm: String,
    /// That VM's image.
    pub image: String,
    /// microvm or vm.
    pub level: Level,
    /// Hypervisor, version, machine type and CPU model.
    pub identity: Identity,
    /// Accelerator.
    pub accel: Accel,
    /// vCPUs and memory: a restore starts the same machine.
    pub vcpus: u32,
    /// Memory in MiB.
    pub memory_mib: u32,
    /// Unix seconds.
    pub created: i64,
    /// The hypervisor's files, relative to the snapshot directory.
    pub files: SnapshotFiles,
    /// The image's base disk the frozen layer sits on, with its size and mtime: a rebuilt image
    /// would corrupt the layer, so a restore checks them.
    pub base_disk: PathBuf,
    /// Size of the base disk when the snapshot was taken.
    pub base_disk_len: u64,
    /// Modification time of the base disk (unix seconds).
    pub base_disk_mtime: i64,
    /// Size and mtime of the memory file when it was saved (none: no memory file, or a snapshot
    /// from before memory files); a restore maps that file, so a changed one is refused.
    #[serde(default)]
    pub memory_file_stamp: Option<(u64, i64)>,
    /// Free-form labels (job id, pipeline, project).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Bytes of the memory/state image.
    pub memory_bytes: u64,
    /// Bytes of the frozen disk layer.
    pub disk_bytes: u64,
}

impl SnapshotMeta {
    /// The wire form.
    pub fn to_proto(&self) -> proto::Snapshot {
        proto::Snapshot {
            name: self.name.clone(),
            source_vm: self.source_vm.clone(),
            image: self.image.clone(),
            level: self.level.as_str().into(),
            hypervisor: self.identity.hypervisor.clone(),
            hypervisor_version: self.identity.version.clone(),
            machine: self.identity.machine.clone(),
            cpu_model: self.identity.cpu_model.clone(),
            accel: self.accel.as_str().into(),
            created: self.created,
            memory_bytes: self.memory_bytes,
            disk_bytes: self.disk_bytes,
            labels: self.labels.clone().into_iter().collect(),
        }
    }

    /// Refuse a restore where `here` (what this daemon would start) differs in anything the
    /// saved state depends on.
    pub fn check_compatible(&self, here: &Identity, accel: Accel) -> Result<(), DaemonError> {
        let mut diffs = Vec::new();
        let mine = &self.identity;
        if mine.hypervisor != here.hypervisor {
            diffs.push(format!(
                "hypervisor {} (here {})",
                mine.hypervisor, here.hypervisor
            ));
        }
        if mine.version != here.version {
            diffs.push(format!(
                "{} version {} (here {})",
                mine.hypervisor, mine.version, here.version
            ));
        }
        if mine.machine != here.machine {
            diffs.push(format!(
                "machine type {} (here {})",
                mine.machine, here.machine
            ));
        }
        if mine.cpu_model != here.cpu_model {
            diffs.push(format!(
                "CPU model {} (here {})",
                mine.cpu_model, here.cpu_model
            ));
        }
        if self.accel != accel {
            diffs.push(format!(
                "accelerator {} (here {})",
                self.accel.as_str(),
                accel.as_str()
            ));
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(DaemonError::Incompatible(format!(
                "snapshot {:?} cannot be restored on this host: it was taken with {}; \
                 a VM's saved state only resumes on the same hypervisor build, machine and CPU",
                self.name,
                diffs.join(", ")
            )))
        }
    }

    /// Refuse a restore when the image's base disk changed since the snapshot.
    pub fn check_base(&self) -> Result<(), DaemonError> {
        let (len, mtime) = file_stamp(&self.base_disk).map_err(|e| {
            DaemonError::Incompatible(format!(
                "snapshot {:?} needs the image disk {}: {e}",
                self.name,
                self.base_disk.display()
            ))
        })?;
        if len != self.base_disk_len || mtime != self.base_disk_mtime {
            return Err(DaemonError::Incompatible(format!(
                "snapshot {:?} was taken over image {:?} as it was at {}; that image has been \
                 rebuilt since, so the snapshot's disk layer no longer fits it",
                self.name, self.image, self.base_disk_mtime
            )));
        }
        Ok(())
    }
}

impl SnapshotMeta {
    /// Refuse a restore when the snapshot's memory file (in `dir`, the snapshot's directory) is
    /// missing or changed since it was saved: a restore maps it as the guest's RAM.
    pub fn check_memory(&self, dir: &Path) -> Result<(), DaemonError> {
        let (Some(file), Some((len, mtime))) = (&self.files.memory, self.memory_file_stamp) else {
            return Ok(());
        };
        let path = dir.join(file);
        let here = file_stamp(&path).map_err(|e| {
            DaemonError::Incompatible(format!(
                "snapshot {:?} needs its memory file {}: {e}",
                self.name,
                path.display()
            ))
        })?;
        if here != (len, mtime) {
            return Err(DaemonError::Incompatible(format!(
                "snapshot {:?}: its memory file {} changed since it was saved ({} bytes at {}, \
                 now {} bytes at {}); the guest's RAM would not be what was saved",
                self.name,
                path.display(),
                len,
                mtime,
                here.0,
                here.1
            )));
        }
        Ok(())
    }
}

/// Size and mtime (unix seconds) of a file.
pub fn file_stamp(path: &Path) -> std::io::Result<(u64, i64)> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path)?;
    Ok((m.len(), m.mtime()))
}

/// The directory of the snapshots under a state directory.
pub fn dir(state: &Path) -> PathBuf {
    state.join("snapshots")
}

/// Read every snapshot's metadata (unreadable ones are skipped with a warning).
pub fn list(state: &Path) -> Vec<SnapshotMeta> {
    let Ok(entries) = std::fs::read_dir(dir(state)) else {
        return Vec::new();
    };
    let mut out: Vec<SnapshotMeta> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let path = e.path().join("meta.json");
            match std::fs::read(&path).map(|b| serde_json::from_slice::<SnapshotMeta>(&b)) {
                Ok(Ok(m)) => Some(m),
                Ok(Err(err)) => {
                    tracing::warn!(file = %path.display(), "unreadable snapshot metadata: {err}");
                    None
                }
                Err(_) => None,
            }
        })
        .collect();
    out.sort_by(|a, b| a.created.cmp(&b.created).then(a.name.cmp(&b.name)));
    out
}

/// Read one snapshot's metadata.
pub fn load(state: &Path, name: &str) -> Result<SnapshotMeta, DaemonError> {
    let path = dir(state).join(name).join("meta.json");
    let bytes = std::fs::read(&path).map_err(|_| DaemonError::NoSnapshot(name.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| DaemonError::Io {
        context: format!("snapshot metadata {}", path.display()),
        source: std::io::Error::other(e),
    })
}

/// Which snapshots retention removes: older than the age limit, then the oldest beyond the
/// count limit; never those in `in_use`.
pub fn expired(
    all: &[SnapshotMeta],
    retention: Retention,
    now: i64,
    in_use: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut keep: Vec<&SnapshotMeta> = Vec::new();
    let mut gone = Vec::new();
    let max_age = i64::try_from(retention.max_age_secs).unwrap_or(i64::MAX);
    for m in all {
        if retention.max_age_secs > 0 && now.saturating_sub(m.created) > max_age && !in_use(&m.name)
        {
            gone.push(m.name.clone());
        } else {
            keep.push(m);
        }
    }
    if retention.max_count > 0 && keep.len() > retention.max_count {
        // `all` is oldest first.
        let mut excess = keep.len() - retention.max_count;
        for m in keep {
            if excess == 0 {
                break;
            }
            if !in_use(&m.name) {
                gone.push(m.name.clone());
                excess -= 1;
            }
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, created: i64) -> SnapshotMeta {
        SnapshotMeta {
            name: name.into(),
            source_vm: "v".into(),
            image: "img".into(),
            level: Level::Microvm,
            identity: Identity {
                hypervisor: "qemu".into(),
                version: "7.2.19".into(),
                machine: "microvm".into(),
                cpu_model: "max".into(),
            },
            accel: Accel::Tcg,
            vcpus: 1,
            memory_mib: 256,
            created,
            files: SnapshotFiles {
                dir: "/s".into(),
                state: "/s/state".into(),
                memory: None,
            },
            base_disk: "/img/disk.qcow2".into(),
            base_disk_len: 1,
            base_disk_mtime: 1,
            memory_file_stamp: None,
            labels: BTreeMap::new(),
            memory_bytes: 0,
            disk_bytes: 0,
        }
    }

    #[test]
    fn metadata_from_before_memory_files_still_reads() {
        let mut v = serde_json::to_value(meta("old", 0)).unwrap();
        v.as_object_mut().unwrap().remove("memory_file_stamp");
        let m: SnapshotMeta = serde_json::from_value(v).unwrap();
        assert_eq!(m.memory_file_stamp, None);
        assert_eq!(m.files.memory, None);
        m.check_memory(Path::new("/nonexistent")).unwrap();
    }

    #[test]
    fn a_changed_or_missing_memory_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("memory"), vec![0u8; 4096]).unwrap();
        let mut m = meta("mapped", 0);
        m.files.memory = Some("memory".into());
        m.memory_file_stamp = Some(file_stamp(&dir.path().join("memory")).unwrap());
        m.check_memory(dir.path()).unwrap();
        std::fs::write(dir.path().join("memory"), vec![0u8; 8192]).unwrap();
        let e = m.check_memory(dir.path()).unwrap_err().to_string();
        assert!(e.contains("changed since it was saved"), "{e}");
        std::fs::remove_file(dir.path().join("memory")).unwrap();
        let e = m.check_memory(dir.path()).unwrap_err().to_string();
        assert!(e.contains("needs its memory file"), "{e}");
    }

    #[test]
    fn a_matching_host_restores() {
        let m = meta("a", 0);
        m.check_compatible(&m.identity.clone(), Accel::Tcg).unwrap();
    }

    #[test]
    fn every_difference_is_named() {
        let m = meta("deps", 0);
        let here = Identity {
            hypervisor: "qemu".into(),
            version: "8.2.0".into(),
            machine: "q35".into(),
            cpu_model: "host:AMD EPYC".into(),
        };
        let e = m
            .check_compatible(&here, Accel::Kvm)
            .unwrap_err()
            .to_string();
        for want in [
            "snapshot \"deps\" cannot be restored",
            "qemu version 7.2.19 (here 8.2.0)",
            "machine type microvm (here q35)",
            "CPU model max (here host:AMD EPYC)",
            "accelerator tcg (here kvm)",
        ] {
            assert!(e.contains(want), "{want} missing in {e}");
        }
    }

    #[test]
    fn retention_removes_old_then_excess_but_never_in_use() {
        let all = vec![
            meta("a", 100),
            meta("b", 200),
            meta("c", 300),
            meta("d", 400),
        ];
        let none = |_: &str| false;
        let r = Retention {
            max_count: 2,
            max_age_secs: 0,
        };
        assert_eq!(expired(&all, r, 500, &none), vec!["a", "b"]);
        let r = Retention {
            max_count: 0,
            max_age_secs: 250,
        };
        assert_eq!(expired(&all, r, 500, &none), vec!["a", "b"]);
        let a_in_use = |n: &str| n == "a";
        let r = Retention {
            max_count: 2,
            max_age_secs: 0,
        };
        assert_eq!(expired(&all, r, 500, &a_in_use), vec!["b", "c"]);
        let r = Retention {
            max_count: 10,
            max_age_secs: 10_000,
        };
        assert!(expired(&all, r, 500, &none).is_empty());
    }
}
