//! The daemon's snapshots: `Snapshot`, `Restore`, `ListSnapshots`, `DeleteSnapshot`, and the
//! rules that keep a snapshot a VM or another snapshot stands on.

use super::*;

impl Daemon {
    /// Whether a VM runs on snapshot `name`'s files, a snapshot's disk sits on it, or a restore
    /// of it is under way. Decisions on it are taken holding `records`.
    fn in_use(&self, name: &str) -> bool {
        self.used_snapshots(&snapshot::list(&self.opts.state_dir))
            .contains(name)
    }

    /// Every snapshot in use (see [`Daemon::in_use`]), from one read of the records; `snaps`
    /// are the snapshots whose parents count.
    fn used_snapshots(&self, snaps: &[SnapshotMeta]) -> HashSet<String> {
        let mut used: HashSet<String> = self.busy().claims.keys().cloned().collect();
        let (recs, _) = store::load_all(&self.opts.state_dir);
        used.extend(
            recs.into_iter()
                .map(|r| r.snapshot)
                .filter(|s| !s.is_empty()),
        );
        used.extend(
            snaps
                .iter()
                .filter_map(|m| m.labels.get(PARENT_LABEL).cloned()),
        );
        used
    }

    /// `Snapshot`: save the VM as `name` (replacing an unused snapshot of that name); the VM
    /// stops. Returns the snapshot and the names retention removed.
    pub async fn snapshot(
        &self,
        vm: &str,
        name: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<(SnapshotMeta, Vec<String>), DaemonError> {
        let active = self.active().await?;
        check_name("snapshot name", name)?;
        let (recs, _) = store::load_all(&self.opts.state_dir);
        let rec = recs
            .into_iter()
            .find(|r| r.id == vm)
            .ok_or_else(|| DaemonError::NoVm(vm.to_string()))?;
        let Some(process) = rec.process.clone().filter(is_running) else {
            return Err(DaemonError::Conflict(format!("VM {vm} is not running")));
        };
        // Held until the VM's record is gone: no reconcile, delete or stomp meanwhile.
        let Some(_vm) = self.hold_vm(vm) else {
            return Err(DaemonError::Conflict(format!(
                "VM {vm} is being started or snapshotted"
            )));
        };
        if !active.hv.capabilities().snapshot {
            return Err(HypervisorError::Unsupported {
                hypervisor: active.hv.kind(),
                what: "snapshots",
            }
            .into());
        }
        let root = snapshot::dir(&self.opts.state_dir);
        let target = root.join(name);
        if target.exists() && self.in_use(name) {
            return Err(DaemonError::Conflict(format!(
                "snapshot {name:?} exists and a VM or snapshot still uses it; delete those first"
            )));
        }
        let tmp = root.join(format!(".new-{name}-{}", new_id()));
        std::fs::create_dir_all(&tmp)
            .map_err(DaemonError::io(format!("creating {}", tmp.display())))?;
        let made = async {
            let identity = active.hv.identity(&rec.spec).await?;
            let files = active.hv.snapshot(&process, &tmp).await?;
            active.hv.stop(&process, STOP_GRACE).await?;
            let layer = &rec.spec.disks[0].path;
            let disk_name = layer
                .file_name()
                .map(|n| n.to_os_string())
                .unwrap_or_default();
            std::fs::rename(layer, tmp.join(&disk_name)).map_err(DaemonError::io(format!(
                "moving {} into the snapshot",
                layer.display()
            )))?;
            // The memory image and the frozen disk are shared by every restore: read-only.
            for f in std::fs::read_dir(&tmp)
                .map_err(DaemonError::io("reading the snapshot"))?
                .flatten()
            {
                use std::os::unix::fs::PermissionsExt as _;
                let _ = std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o444));
            }
            let (base_len, base_mtime) = snapshot::file_stamp(&rec.base_disk).map_err(
                DaemonError::io(format!("reading {}", rec.base_disk.display())),
            )?;
            let rel = |p: &Path| {
                p.strip_prefix(&tmp)
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|_| p.to_path_buf())
            };
            let mut labels = labels;
            if !rec.snapshot.is_empty() {
                labels.insert(PARENT_LABEL.into(), rec.snapshot.clone());
            }
            let memory_bytes = disk::allocated_bytes(&files.state)
                + files
                    .memory
                    .as_deref()
                    .map(disk::allocated_bytes)
                    .unwrap_or(0);
            let meta = SnapshotMeta {
                name: name.to_string(),
                source_vm: rec.id.clone(),
                image: rec.image.clone(),
                level: rec.spec.level,
                identity,
                accel: rec.spec.accel,
                vcpus: rec.spec.vcpus,
                memory_mib: rec.spec.memory_mib,
                created: now(),
                files: crate::hypervisor::SnapshotFiles {
                    dir: PathBuf::from("."),
                    state: rel(&files.state),
                    memory: files.memory.as_deref().map(rel),
                },
                base_disk: rec.base_disk.clone(),
                base_disk_len: base_len,
                base_disk_mtime: base_mtime,
                memory_file_stamp: files
                    .memory
                    .as_deref()
                    .map(snapshot::file_stamp)
                    .transpose()
                    .map_err(DaemonError::io("reading the snapshot's memory file"))?,
                labels,
                memory_bytes,
                disk_bytes: disk::allocated_bytes(&tmp.join(&disk_name)),
            };
            let bytes = serde_json::to_vec_pretty(&meta).map_err(|e| DaemonError::Io {
                context: "encoding snapshot metadata".into(),
                source: std::io::Error::other(e),
            })?;
            std::fs::write(tmp.join("meta.json"), bytes)
                .map_err(DaemonError::io("writing snapshot metadata"))?;
            Ok::<_, DaemonError>(meta)
        }
        .await;
        let meta = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                // A VM whose snapshot failed half-way is no use to anyone.
                let _ = self.remove(&rec).await;
                return Err(e);
            }
        };
        let published = {
            let _g = self.records.lock().await;
            // Checked again under the lock: a restore may have started on the old one.
            if target.exists() && self.in_use(name) {
                Err(DaemonError::Conflict(format!(
                    "snapshot {name:?} came into use while the VM was saved; the new state was not kept"
                )))
            } else {
                let replace = || -> std::io::Result<()> {
                    if target.exists() {
                        let old = root.join(format!(".old-{name}-{}", new_id()));
                        std::fs::rename(&target, &old)?;
                        let _ = remove_tree(&old);
                    }
                    std::fs::rename(&tmp, &target)
                };
                replace().map_err(DaemonError::io(format!("publishing {}", target.display())))
            }
        };
        let _ = std::fs::remove_dir_all(store::vm_dir(&self.opts.state_dir, &rec.id));
        if let Err(e) = published {
            let _ = remove_tree(&tmp);
            return Err(e);
        }
        if rec.spec.disks[0].format == DiskFormat::Qcow2 {
            // Made over the published path (the layer names its backing file absolutely);
            // without it restores fall back to `qemu-img create`.
            let frozen = target.join(rec.spec.disks[0].path.file_name().unwrap_or_default());
            if let Err(e) = disk::create_template(&frozen, &target.join(disk::LAYER_TEMPLATE)).await
            {
                tracing::warn!(snapshot = %name, "no layer template: {e}");
            }
        }
        let expired = self.enforce_retention(&active, Some(name)).await;
        Ok((meta, expired))
    }

    async fn enforce_retention(&self, active: &Active, keep: Option<&str>) -> Vec<String> {
        let _g = self.records.lock().await;
        // Warm slots' base snapshots are the daemon's, not the jobs': not counted, never expired.
        let all: Vec<_> = snapshot::list(&self.opts.state_dir)
            .into_iter()
            .filter(|s| !crate::daemon::warm::is_base(&s.name))
            .collect();
        let used = self.used_snapshots(&all);
        let gone = snapshot::expired(&all, active.config.snapshots, now(), &|n| {
            Some(n) == keep || used.contains(n)
        });
        for name in &gone {
            tracing::info!(snapshot = %name, "retention limit exceeded: removing snapshot");
            let _ = remove_tree(&snapshot::dir(&self.opts.state_dir).join(name));
        }
        gone
    }

    /// `Restore`.
    pub async fn restore(
        &self,
        name: &str,
        slot: Option<i32>,
    ) -> Result<(VmRecord, Option<String>), DaemonError> {
        let active = self.active().await?;
        check_name("snapshot name", name)?;
        // Claimed before anything is read: the snapshot cannot be deleted or replaced under us.
        let _claim = {
            let _g = self.records.lock().await;
            self.claim(name)
        };
        let meta = snapshot::load(&self.opts.state_dir, name)?;
        let (image_dir, manifest) = self.image(&active, &meta.image)?;
        let id = new_id();
        let snap_dir = snapshot::dir(&self.opts.state_dir).join(name);
        let memory = meta.files.memory.as_ref().map(|m| snap_dir.join(m));
        let spec = self.spec(
            &active,
            &id,
            &image_dir,
            &manifest,
            Some((meta.vcpus, meta.memory_mib)),
            memory,
        );
        let here = active.hv.identity(&spec).await?;
        meta.check_compatible(&here, active.accel)?;
        meta.check_base()?;
        meta.check_memory(&snap_dir)?;
        let (_slot, stomped) = self.take_slot(slot).await?;
        let frozen = snap_dir.join(spec.disks[0].path.file_name().unwrap_or_default());
        let rec = VmRecord {
            id: id.clone(),
            name: format!("slipway-{id}"),
            slot,
            image: meta.image.clone(),
            snapshot: name.to_string(),
            hypervisor: active.config.hypervisor,
            spec,
            process: None,
            base_disk: meta.base_disk.clone(),
            created: now(),
            warm: false,
        };
        let rec = self.start(&active, rec, &frozen, Some(&meta)).await?;
        Ok((rec, stomped))
    }

    /// `ListSnapshots`.
    pub fn snapshots(&self) -> Vec<SnapshotMeta> {
        snapshot::list(&self.opts.state_dir)
    }

    /// `DeleteSnapshot`.
    pub async fn delete_snapshot(&self, name: &str) -> Result<(), DaemonError> {
        check_name("snapshot name", name)?;
        let _g = self.records.lock().await;
        snapshot::load(&self.opts.state_dir, name)?;
        if self.in_use(name) {
            return Err(DaemonError::Conflict(format!(
                "snapshot {name:?} is in use by a VM restored from it or a snapshot taken of one"
            )));
        }
        remove_tree(&snapshot::dir(&self.opts.state_dir).join(name))
            .map_err(DaemonError::io(format!("removing snapshot {name}")))
    }
}
